"""Printer of the loop IR, parameterised by a target table (`C`, `CUDA`).

One ``visit`` per node kind, a precedence table for parentheses, and a `Target` that
holds everything that differs between targets: type spellings, the restrict keyword,
operator and intrinsic spellings, how parallel loops and atomics are written, and the
translation unit's template with its value, accumulator and index types. `render` fills
a target's template (a dumb skeleton: includes, typedefs, signature, bodies).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import assert_never

import jinja2

from ..abi import INT, Param
from ..frontend.functions import FUNCTIONS
from ..ir import nodes as ir
from ..middle.spec import Spec
from ..resources import data_dir
from .generated import Generated

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


#: the accumulating updates of a semiring's add (`lower.semiring`), ``op`` -> statement
SEMIRING_UPDATES = {
    "min=": "{target} = sc_vmin({target}, {value});",
    "max=": "{target} = sc_vmax({target}, {value});",
    "or=": "{target} = {target} || ({value});",
}

#: intrinsic spellings: the templates define each ``sc_*`` helper (C and CUDA alike)
CALLS = {
    name: f"sc_{name}"
    for name in (
        "min",
        "max",
        "vmin",
        "vmax",
        "sort_reached",
        "mark",
        "mark_bits",
        "count_reached",
        "bit_test",
        "bit_set",
        "bit_clear",
        "thread_id",
        "search",
        "gallop",
        "gallop_row",
        "warp_sum",
        "warp_min",
        "warp_max",
        "warp_or",
        "lane",
        "block_threads",
        "thread_in_block",
        "vload",
        "vstore",
        "vstore_out",
        "rows_aligned",
        "store_fence",
        "vzero",
        "prefetch",
        "prefetch_stream",
    )
}

#: the language's functions (``fn_sqrt``, as the lowerer emits them) per target: GCC/Clang
#: builtins in C (no ``<math.h>`` needed), the CUDA math API's overloads on CUDA
C_FUNCTIONS = {f"fn_{f.name}": f.c for f in FUNCTIONS.values() if f.c}
CUDA_FUNCTIONS = {f"fn_{f.name}": f.cuda for f in FUNCTIONS.values() if f.cuda}

#: the loop IR's types that both targets spell alike (the template typedefs the value,
#: accumulator and index types per kernel)
_SHARED_TYPES = {
    ir.VAL: "sc_val_t",
    ir.ACC: "sc_acc_t",
    ir.IDX: "sc_idx_t",
    ir.BOOL: "int",
    INT: "int",
}

#: dtype -> the value type (``ir.VAL``), on every target
VALUE_TYPES = {"float32": "float", "float64": "double"}

#: (first index, stride) of each GPU unit's grid/block/warp-strided loop; "lane" is a
#: GPUThread loop inside a warp
GPU_STRIDES = {
    "GPUBlock": ("(long long)blockIdx.x", "(long long)gridDim.x"),
    "GPUWarp": ("(long long)(threadIdx.x >> 5)", "(long long)(blockDim.x >> 5)"),
    "GPUThread": ("(long long)threadIdx.x", "(long long)blockDim.x"),
    "lane": ("(long long)(threadIdx.x & 31)", "32"),
}


@dataclass(frozen=True)
class Target:
    """Everything the printer does differently per target, as data: type spellings, the
    restrict keyword, how a loop is unrolled, how a parallel loop runs (OpenMP pragmas on
    CPU units, grid-strided loops on GPU units) and how an atomic update is written."""

    name: str
    types: Mapping[str, str]
    restrict: str
    #: the pragma asking the compiler to unroll a loop ``{}`` times
    unroll: str
    #: the lines of an atomic ``{target} {op} {value}``
    atomic_lines: tuple[str, ...]
    #: the update operators an atomic may use (empty: any)
    atomic_ops: tuple[str, ...] = ()
    #: the lines of an atomic semiring update (``min=``, ``max=``, ``or=``), which no
    #: instruction does for floating point: ``{target}``, ``{value}`` as in `atomic_lines`
    semiring_atomics: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: whether an atomic update may target a local variable (OpenMP: a shared local; CUDA
    #: atomics need global or shared memory)
    atomic_locals: bool = True
    #: parallel loops on CPU units become OpenMP pragmas
    openmp: bool = False
    #: GPU units whose loops are strided over the launch (see `GPU_STRIDES`)
    strides: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    calls: Mapping[str, str] = field(default_factory=lambda: CALLS)
    indent: str = "  "
    #: the translation unit's skeleton (in ``templates/``)
    template: str = ""
    #: dtype -> the type reductions accumulate in (``ir.ACC``)
    acc_types: Mapping[str, str] = field(default_factory=dict)
    #: index dtype -> the index type (``ir.IDX``)
    index_types: Mapping[str, str] = field(default_factory=dict)

    def param(self, p: Param) -> str:
        ty = self.types[p.type]
        if p.kind == "value":
            return f"{ty} {p.name}"
        const = "" if p.writable else "const "
        return f"{const}{ty}* {self.restrict} {p.name}"

    def openmp_pragma(self, par: ir.Parallel, threads: str) -> str:
        reduce = f" reduction(+:{', '.join(par.reduction)})" if par.reduction else ""
        if par.flags:
            reduce += f" reduction(max:{', '.join(par.flags)})"
        match par.unit:
            case "CPUThread":
                sched = par.schedule + (f", {par.chunk}" if par.chunk else "")
                collapse = f" collapse({par.collapse})" if par.collapse > 1 else ""
                cond = f"{threads} > 1" + (f" && {par.only_if}" if par.only_if else "")
                return (
                    f"#pragma omp parallel for schedule({sched}){collapse} num_threads({threads}) "
                    f"if({cond}){reduce}"
                )
            case "CPUVector":
                return f"#pragma omp simd{reduce}"
            case _:
                raise ValueError(f"target {self.name} cannot run {par.unit} loops")

    def atomic(self, target: str, op: str, value: str) -> list[str]:
        if self.atomic_ops and op not in self.atomic_ops:
            raise ValueError(f"no atomic {op!r} on {self.name}")
        return [line.format(target=target, op=op, value=value) for line in self.atomic_lines]

    def loop_head(
        self, var: str, start: str, end: str, par: ir.Parallel | None, unroll: int, threads: str
    ) -> list[str]:
        """The lines that open ``for var in [start, end)``: a CPU unit's pragma before the
        loop, a GPU unit's loop strided from this thread's first index."""
        head = [self.openmp_pragma(par, threads)] if par is not None and self.openmp else []
        if unroll:
            head.append(self.unroll.format(unroll))
        i64 = self.types[ir.I64]
        if par is None or self.openmp:
            head.append(f"for ({i64} {var} = {start}; {var} < {end}; {var}++) {{")
            return head
        key = "lane" if par.schedule == "lane" else par.unit
        if key not in self.strides:
            raise ValueError(f"target {self.name} cannot run {par.unit} loops")
        first, stride = self.strides[key]
        init = first if start == "0" else f"{start} + {first}"
        head.append(f"for ({i64} {var} = {init}; {var} < {end}; {var} += {stride}) {{")
        return head


C = Target(
    name="c",
    types={**_SHARED_TYPES, ir.I64: "int64_t", ir.U64: "uint64_t", ir.VEC: "sc_vec_t"},
    restrict="restrict",
    unroll="#pragma GCC unroll {}",
    atomic_lines=("#pragma omp atomic", "{target} {op} {value};"),
    # one thread at a time (OpenMP's atomics update only with arithmetic operators)
    semiring_atomics={
        op: ("#pragma omp critical(sc_semiring)", line) for op, line in SEMIRING_UPDATES.items()
    },
    openmp=True,
    calls={**CALLS, **C_FUNCTIONS},
    template="kernel.c.j2",
    # float32 sums in double: as fast as summing in float (the conversion is off the add
    # chain) and exact far longer (docs/decisions.md, "float32 sums accumulate in double")
    acc_types={"float32": "double", "float64": "double"},
    index_types={"int32": "int32_t", "int64": "int64_t"},
)

#: CUDA: GPU loops are strided over the grid, the warps of a block, its threads or a
#: warp's lanes (correct for any launch size); stores shared by threads use atomicAdd
CUDA = Target(
    name="cuda",
    types={**_SHARED_TYPES, ir.I64: "long long", ir.U64: "unsigned long long"},
    restrict="__restrict__",
    unroll="#pragma unroll {}",
    atomic_lines=("atomicAdd(&{target}, {value});",),
    atomic_ops=("+=",),
    # compare-and-swap loops of the template (``kernel.cu.j2``; the emulation's shim too)
    semiring_atomics={
        "min=": ("sc_atomic_min(&{target}, {value});",),
        "max=": ("sc_atomic_max(&{target}, {value});",),
        "or=": ("sc_atomic_or(&{target}, {value});",),
    },
    atomic_locals=False,
    strides=GPU_STRIDES,
    calls={**CALLS, **CUDA_FUNCTIONS},
    template="kernel.cu.j2",
    # the value type: unlike the C target's, since most GPUs run double arithmetic at 1/32
    # to 1/64 of the float rate, which would make float32 SpMM several times slower; sums
    # across a GPU mapping's threads are also split into shorter per-thread parts
    acc_types={"float32": "float", "float64": "double"},
    index_types={"int32": "int", "int64": "long long"},
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
                if op in SEMIRING_UPDATES:
                    # a semiring's add (`lower.semiring`), atomic as the target's table says
                    update = self.t.semiring_atomics[op] if atomic else (SEMIRING_UPDATES[op],)
                    return [pad + x.format(target=lhs, value=rhs) for x in update]
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
            case ir.FloatLit(value=v) if math.isinf(v):
                # a semiring's identity: C and CUDA have no infinity literal
                return f"(({self.t.types[ir.VAL]})({'-' if v < 0 else ''}1.0 / 0.0))"
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


@cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def _comment_safe(text: str) -> str:
    return text.replace("*/", "* /").replace("/*", "/ *")


def header(spec: Spec, gen: Generated, target: Target) -> list[str]:
    """The lines of the kernel's header comment: the statement, its formats, the loop
    order, the schedule that ran, the types and the ABI's arguments."""
    formats = ", ".join(
        f"{t.name}: {t.format}"
        + (f" ({t.format.spelling})" if str(t.format) != t.format.spelling else "")
        for t in spec.tensors
    )
    types = f"values {VALUE_TYPES[gen.dtype]}, indices {target.index_types[gen.index_dtype]}"
    return [
        _comment_safe(f"sparsec kernel: {spec.assignment}"),
        _comment_safe(f"concrete index notation: {spec.statement}"),
        f"formats: {formats}",
        f"loop order: {', '.join(gen.loop_order) or '(none)'}",
        f"schedule: {gen.schedule}",
        f"types: {types}",
        f"arguments: {', '.join(p.name for p in gen.signature.params)}",
        *_semiring_line(spec),
    ]


def _semiring_line(spec: Spec) -> list[str]:
    """A semiring other than plus_times, said in the header (none for plus_times)."""
    name = spec.semantics.semiring
    if name == "plus_times":
        return []
    return [f"semiring: {name} (absent entries are its add's identity)"]


def render(target: Target, lines: list[str], gen: Generated, **fields: object) -> str:
    """``target``'s translation unit for ``gen`` (its types and parameters): the template
    filled with the header comment ``lines`` and ``fields`` (printed bodies and the
    template's switches)."""
    return (
        environment()
        .get_template(target.template)
        .render(
            header=lines,
            val_type=VALUE_TYPES[gen.dtype],
            acc_type=target.acc_types[gen.dtype],
            idx_type=target.index_types[gen.index_dtype],
            params=[target.param(p) for p in gen.signature.params],
            **fields,
        )
    )
