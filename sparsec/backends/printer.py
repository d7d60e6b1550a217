"""Printer of the loop IR, parameterised by a target table (C here, CUDA later).

One ``visit`` per node kind, a precedence table for parentheses, and a `Target` that
holds everything that differs between targets: type spellings, the restrict keyword,
operator and intrinsic spellings, and how parallel loops and atomics are written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import assert_never

from ..abi import INT, Param
from ..ir import nodes as ir

# C operator precedence (higher binds tighter).
PRECEDENCE = {
    "?:": 2,
    "||": 3,
    "&&": 4,
    "==": 8,
    "!=": 8,
    "<": 9,
    "<=": 9,
    ">": 9,
    ">=": 9,
    "+": 11,
    "-": 11,
    "*": 12,
    "/": 12,
    "%": 12,
    "unary": 14,
    "atom": 16,
}


@dataclass(frozen=True)
class Target:
    name: str
    types: dict[str, str]
    restrict: str
    calls: dict[str, str] = field(
        default_factory=lambda: {
            "min": "sc_min",
            "max": "sc_max",
            "sort_reached": "sc_sort_reached",
            "mark": "sc_mark",
            "mark_bits": "sc_mark_bits",
            "count_reached": "sc_count_reached",
            "bit_test": "sc_bit_test",
            "bit_set": "sc_bit_set",
            "bit_clear": "sc_bit_clear",
            "thread_id": "sc_thread_id",
            "search": "sc_search",
            "gallop": "sc_gallop",
            "gallop_row": "sc_gallop_row",
            "warp_sum": "sc_warp_sum",
            "lane": "sc_lane",
            "block_threads": "sc_block_threads",
            "thread_in_block": "sc_thread_in_block",
            "vload": "sc_vload",
            "vstore": "sc_vstore",
            "vstore_out": "sc_vstore_out",
            "rows_aligned": "sc_rows_aligned",
            "store_fence": "sc_store_fence",
            "vzero": "sc_vzero",
            "prefetch": "sc_prefetch",
            "prefetch_stream": "sc_prefetch_stream",
        }
    )
    indent: str = "  "
    #: whether an atomic update may target a local variable (OpenMP: a shared local; CUDA
    #: atomics need global or shared memory)
    atomic_locals: bool = True

    def param(self, p: Param) -> str:
        ty = self.types[p.type]
        if p.kind == "value":
            return f"{ty} {p.name}"
        const = "" if p.writable else "const "
        return f"{const}{ty}* {self.restrict} {p.name}"

    def parallel_pragma(self, par: ir.Parallel, threads: str) -> list[str]:
        reduce = f" reduction(+:{', '.join(par.reduction)})" if par.reduction else ""
        if par.flags:
            reduce += f" reduction(max:{', '.join(par.flags)})"
        match par.unit:
            case "CPUThread":
                sched = par.schedule + (f", {par.chunk}" if par.chunk else "")
                collapse = f" collapse({par.collapse})" if par.collapse > 1 else ""
                cond = f"{threads} > 1" + (f" && {par.only_if}" if par.only_if else "")
                return [
                    f"#pragma omp parallel for schedule({sched}){collapse} num_threads({threads}) "
                    f"if({cond}){reduce}"
                ]
            case "CPUVector":
                return [f"#pragma omp simd{reduce}"]
            case _:
                raise ValueError(f"target {self.name} cannot run {par.unit} loops")

    def atomic(self, target: str, op: str, value: str) -> list[str]:
        return ["#pragma omp atomic", f"{target} {op} {value};"]

    def loop_head(
        self, var: str, start: str, end: str, par: ir.Parallel | None, unroll: int, threads: str
    ) -> list[str]:
        """The lines that open ``for var in [start, end)``."""
        head = self.parallel_pragma(par, threads) if par else []
        if unroll:
            head.append(f"#pragma GCC unroll {unroll}")
        i64 = self.types[ir.I64]
        head.append(f"for ({i64} {var} = {start}; {var} < {end}; {var}++) {{")
        return head


@dataclass(frozen=True)
class CudaTarget(Target):
    """CUDA: GPU loops are strided over the grid, the warps of a block, its threads or a
    warp's lanes (correct for any launch size); stores shared by threads use atomicAdd."""

    #: (first index, stride) of each GPU unit; "lane" is a GPUThread loop inside a warp
    STRIDES = {
        "GPUBlock": ("(long long)blockIdx.x", "(long long)gridDim.x"),
        "GPUWarp": ("(long long)(threadIdx.x >> 5)", "(long long)(blockDim.x >> 5)"),
        "GPUThread": ("(long long)threadIdx.x", "(long long)blockDim.x"),
        "lane": ("(long long)(threadIdx.x & 31)", "32"),
    }

    def parallel_pragma(self, par: ir.Parallel, threads: str) -> list[str]:
        raise ValueError(f"target {self.name} maps loops to GPU units, not {par.unit}")

    def atomic(self, target: str, op: str, value: str) -> list[str]:
        if op != "+=":
            raise ValueError(f"no atomic {op!r} on {self.name}")
        return [f"atomicAdd(&{target}, {value});"]

    def loop_head(
        self, var: str, start: str, end: str, par: ir.Parallel | None, unroll: int, threads: str
    ) -> list[str]:
        i64 = self.types[ir.I64]
        head = [f"#pragma unroll {unroll}"] if unroll else []
        if par is None:
            head.append(f"for ({i64} {var} = {start}; {var} < {end}; {var}++) {{")
            return head
        key = "lane" if par.schedule == "lane" else par.unit
        if key not in self.STRIDES:
            raise ValueError(f"target {self.name} cannot run {par.unit} loops")
        first, stride = self.STRIDES[key]
        init = first if start == "0" else f"{start} + {first}"
        head.append(f"for ({i64} {var} = {init}; {var} < {end}; {var} += {stride}) {{")
        return head


C = Target(
    name="c",
    types={
        ir.VAL: "sc_val_t",
        ir.ACC: "sc_acc_t",
        ir.IDX: "sc_idx_t",
        ir.I64: "int64_t",
        ir.U64: "uint64_t",
        ir.BOOL: "int",
        ir.VEC: "sc_vec_t",
        INT: "int",
    },
    restrict="restrict",
)

CUDA = CudaTarget(
    name="cuda",
    types={
        ir.VAL: "sc_val_t",
        ir.ACC: "sc_acc_t",
        ir.IDX: "sc_idx_t",
        ir.I64: "long long",
        ir.U64: "unsigned long long",
        ir.BOOL: "int",
        INT: "int",
    },
    restrict="__restrict__",
    atomic_locals=False,
)


class Printer:
    def __init__(self, target: Target, threads: str = "sc_threads") -> None:
        self.t = target
        self.threads = threads

    # ------------------------------------------------------------ statements
    def stmts(self, node: ir.Stmt, depth: int = 1) -> list[str]:
        pad = self.t.indent * depth
        match node:
            case ir.Block(body=body):
                return [line for s in body for line in self.stmts(s, depth)]
            case ir.Decl(type=ty, name=name, init=init):
                rhs = f" = {self.expr(init)}" if init is not None else ""
                return [f"{pad}{self.t.types[ty]} {name}{rhs};"]
            case ir.Assign(target=target, value=value, op=op, atomic=atomic):
                lhs, rhs = self.expr(target), self.expr(value)
                if atomic:
                    if isinstance(target, ir.Var) and not self.t.atomic_locals:
                        raise AssertionError(f"internal: an atomic update of the local {lhs}")
                    return [pad + line for line in self.t.atomic(lhs, op, rhs)]
                return [f"{pad}{lhs} {op} {rhs};"]
            case ir.For(var=var, start=start, end=end, body=body, parallel=par, unroll=unroll):
                opening = self.t.loop_head(
                    var, self.expr(start), self.expr(end), par, unroll, self.threads
                )
                head = [pad + line for line in opening]
                return head + self.stmts(body, depth + 1) + [f"{pad}}}"]
            case ir.While(cond=cond, body=body):
                return [
                    f"{pad}while ({self.expr(cond)}) {{",
                    *self.stmts(body, depth + 1),
                    f"{pad}}}",
                ]
            case ir.If(branches=branches, orelse=orelse):
                lines: list[str] = []
                for n, (cond, body) in enumerate(branches):
                    lead = f"{pad}if" if n == 0 else f"{pad}}} else if"
                    lines.append(f"{lead} ({self.expr(cond)}) {{")
                    lines.extend(self.stmts(body, depth + 1))
                if orelse is not None and orelse.body:
                    lines.append(f"{pad}}} else {{")
                    lines.extend(self.stmts(orelse, depth + 1))
                lines.append(f"{pad}}}")
                return lines
            case ir.Comment(text=text):
                return [f"{pad}// {text}"]
            case ir.Alloc(type=ty, name=name, count=count, when=when):
                t = self.t.types[ty]
                call = f"({t}*)calloc({self.expr(count)}, sizeof({t}))"
                if when is not None:
                    call = f"{self._wrap(when, PRECEDENCE['?:'], True)} ? {call} : NULL"
                return [f"{pad}{t}* {name} = {call};"]
            case ir.Pointer(type=ty, name=name, base=base, offset=offset, fallback=fallback):
                t = self.t.types[ty]
                at = f"{base} + {self.expr(offset)}"
                if fallback:
                    at = f"{base} ? {at} : {fallback}"
                return [f"{pad}{t}* {name} = {at};"]
            case ir.Free(name=name):
                return [f"{pad}free({name});"]
            case ir.Effect(call=call):
                return [f"{pad}{self.expr(call)};"]
            case ir.Return(status=status, cond=cond):
                if cond == ir.IntLit(1):
                    return [f"{pad}return {status};"]
                return [f"{pad}if ({self.expr(cond)}) return {status};"]
            case _:
                assert_never(node)

    # ----------------------------------------------------------- expressions
    def expr(self, node: ir.Expr) -> str:
        match node:
            case ir.Var(name=name):
                return name
            case ir.IntLit(value=v):
                return str(v)
            case ir.FloatLit(value=v):
                return f"(({self.t.types[ir.VAL]}){float(v)!r})"
            case ir.Load(array=array, index=index):
                return f"{array}[{self.expr(index)}]"
            case ir.Bin(op=op, left=left, right=right):
                prec = PRECEDENCE[op]
                a = self._wrap(left, prec, strict=False)
                b = self._wrap(right, prec, strict=True)
                return f"{a} {op} {b}"
            case ir.Unary(op=op, operand=x):
                return f"{op}{self._wrap(x, PRECEDENCE['unary'], strict=True)}"
            case ir.Call(fn=fn, args=args):
                return f"{self.t.calls.get(fn, fn)}({', '.join(self.expr(a) for a in args)})"
            case ir.Select(cond=c, then=a, other=b):
                p = PRECEDENCE["?:"]
                return f"{self._wrap(c, p, True)} ? {self._wrap(a, p, True)} : {self._wrap(b, p, True)}"
            case _:
                assert_never(node)

    def _wrap(self, node: ir.Expr, outer: int, strict: bool) -> str:
        inner = self._prec(node)
        text = self.expr(node)
        if inner < outer or (strict and inner == outer):
            return f"({text})"
        return text

    def _prec(self, node: ir.Expr) -> int:
        match node:
            case ir.Bin(op=op):
                return PRECEDENCE[op]
            case ir.Unary():
                return PRECEDENCE["unary"]
            case ir.Select():
                return PRECEDENCE["?:"]
            case ir.FloatLit():
                return PRECEDENCE["atom"]
            case _:
                return PRECEDENCE["atom"]
