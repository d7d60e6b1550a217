"""Printer of the loop IR, parameterised by a language table (`C`, `CUDA`).

One ``visit`` per node kind, a precedence table for parentheses, and a `Dialect` that
holds everything that differs between languages: type spellings, the restrict keyword,
operator and intrinsic spellings, how parallel loops and atomics are written, and the
translation unit's template with its value, accumulator and index types. `render` fills
a target's template (a dumb skeleton: includes, typedefs, signature, bodies).
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import assert_never

import jinja2
import jinja2.bccache

from ..base.resources import cache_dir, data_dir, read_entry, write_entry
from ..base.values import is_integral, value_type
from ..ir import nodes as ir
from ..middle.spec import Spec
from .generated import Generated
from .targets import (  # noqa: F401 - the targets, re-exported for the backends and tests
    CALLS,
    CUDA,
    DIALECTS,
    GPU_STRIDES,
    HALF_DTYPES,
    INTEGRAL_FUNCTIONS,
    SEMIRING_UPDATES,
    SEMIRING_VALUES,
    C,
    Dialect,
    adds_into_output,
    param,
    storage_arrays,
)

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


class Printer:
    """Prints statements and expressions for ``target``. ``storage``: the arrays of 16-bit
    values (a half dtype's tensors' ``vals``, `storage_arrays`), whose loads and stores
    convert; with any, every other value (locals, literals, workspaces) is a float."""

    def __init__(
        self,
        target: Dialect,
        threads: str = "sc_threads",
        storage: frozenset[str] = frozenset(),
        dtype: str = "float64",
    ) -> None:
        self.t = target
        self.threads = threads
        self.storage = storage
        #: the type of value locals and literals
        self.value_type = "sc_acc_t" if storage else target.types[ir.VAL]
        #: an integral kernel: integer literals, its limits for infinities, its functions
        self.integral = is_integral(dtype)
        self.calls = {**target.calls, **INTEGRAL_FUNCTIONS} if self.integral else target.calls

    def _type(self, ty: str, name: str = "") -> str:
        """``ty``'s spelling for a declaration of ``name``: a value in the accumulator type
        under a half dtype, unless ``name`` holds 16-bit values."""
        if self.storage and ty == ir.VAL and name not in self.storage:
            return "sc_acc_t"
        return self.t.types[ty]

    def _half_store(self, target: ir.Load, op: str, value: ir.Expr, atomic: bool) -> list[str]:
        """The line storing float ``value`` into 16-bit element ``target``: only plain
        stores reach 16-bit values (an output added into is float, `adds_into_output`)."""
        if op != "=" or atomic:
            raise AssertionError(f"internal: a 16-bit element updated by {op!r}")
        return [f"{target.array}[{self.expr(target.index)}] = sc_st({self.expr(value)});"]

    # ------------------------------------------------------------ statements
    def stmts(self, node: ir.Stmt, depth: int = 1) -> list[str]:
        pad = self.t.indent * depth
        match node:
            case ir.Block(body=body):
                return [line for s in body for line in self.stmts(s, depth)]
            case ir.Decl(type=ty, name=name, init=init):
                rhs = f" = {self.expr(init)}" if init is not None else ""
                return [f"{pad}{self._type(ty)} {name}{rhs};"]
            case ir.Assign(target=ir.Load(array=a) as lo, value=value, op=op, atomic=atomic) if (
                a in self.storage
            ):
                return [pad + line for line in self._half_store(lo, op, value, atomic)]
            case ir.Assign(target=target, value=value, op=op, atomic=atomic):
                lhs, rhs = self.expr(target), self.expr(value)
                if op in SEMIRING_UPDATES:
                    # a semiring's add (`lower.semiring`), atomic as the target's table says
                    update = self.t.semiring_atomics[op] if atomic else (SEMIRING_UPDATES[op],)
                    return [pad + x.format(target=lhs, value=rhs) for x in update]
                if atomic:
                    if isinstance(target, ir.Var) and not self.t.atomic_locals:
                        raise AssertionError(f"internal: an atomic update of the local {lhs}")
                    return [pad + line for line in self.t.atomic(lhs, op, rhs, self.integral)]
                return [f"{pad}{lhs} {op} {rhs};"]
            case ir.For(var=var, start=start, end=end, body=body, parallel=par, unroll=unroll):
                bound = self._wrap(end, PRECEDENCE["<"], strict=True)  # `var < bound`
                opening = self.t.loop_head(var, self.expr(start), bound, par, unroll, self.threads)
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
                t = self._type(ty, name)
                call = f"({t}*)calloc({self.expr(count)}, sizeof({t}))"
                if when is not None:
                    call = f"{self._wrap(when, PRECEDENCE['?:'], True)} ? {call} : NULL"
                return [f"{pad}{t}* {name} = {call};"]
            case ir.Pointer(type=ty, name=name, base=base, offset=offset, fallback=fallback):
                t = self._type(ty, name)
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
            case ir.FloatLit(value=v) if self.integral:
                # an integral type's infinities are its limits (`values.ValueType`)
                if math.isinf(v):
                    return "SC_VAL_LOW" if v < 0 else "SC_VAL_HIGH"
                return f"(({self.value_type}){_int_literal(int(v))})"
            case ir.FloatLit(value=v) if math.isinf(v):
                # a semiring's identity: C and CUDA have no infinity literal
                return f"(({self.value_type})({'-' if v < 0 else ''}1.0 / 0.0))"
            case ir.FloatLit(value=v):
                return f"(({self.value_type}){float(v)!r})"
            case ir.Load(array=array, index=index) if array in self.storage:
                return f"sc_ld({array}[{self.expr(index)}])"
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
                return f"{self.calls.get(fn, fn)}({', '.join(self.expr(a) for a in args)})"
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
    """The templates' environment, once per process. Their compiled code is kept in the
    cache directory (jinja's bytecode cache, keyed by the template's source and Python's
    version; `_EntryCache`): compiling kernel.c.j2 was a visible part of the first kernel
    of every process, loading it is not (docs/decisions.md, "A cold compile's time")."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
        bytecode_cache=_bytecode_cache(),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    try:
        directory = cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return _EntryCache(directory)


class _EntryCache(jinja2.BytecodeCache):
    """jinja's bytecode cache kept as `resources` cache entries (``template-<key>.jinja``):
    written whole and checked by a digest when read. jinja's own file cache unpickles a
    damaged file's header (and raises) and runs whatever marshal makes of damaged code."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, bucket: jinja2.bccache.Bucket) -> Path:
        return self.directory / f"template-{bucket.key}.jinja"

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        payload = read_entry(self._path(bucket))
        if payload is not None:
            try:
                bucket.bytecode_from_string(payload)
            except Exception:  # noqa: BLE001 - not this Python's code: compiled anew
                bucket.reset()

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        write_entry(self._path(bucket), bucket.bytecode_to_string())


def _comment_safe(text: str) -> str:
    return text.replace("*/", "* /").replace("/*", "/ *")


def header(spec: Spec, gen: Generated, target: Dialect) -> list[str]:
    """The lines of the kernel's header comment: the statement, its formats, the loop
    order, the schedule that ran, the types and the ABI's arguments."""
    formats = ", ".join(
        f"{t.name}: {t.format}"
        + (f" ({t.format.spelling})" if str(t.format) != t.format.spelling else "")
        for t in spec.tensors
    )
    values = target.value_types.get(gen.dtype) or (
        f"{gen.dtype} stored as {target.half_types[gen.dtype]}, computed in float"
    )
    if is_integral(gen.dtype):
        values += f" ({gen.dtype}, wrapping)"
    types = f"values {values}, indices {target.index_types[gen.index_dtype]}"
    return [
        _comment_safe(f"sparsec kernel: {spec.assignment}"),
        _comment_safe(f"concrete index notation: {spec.statement}"),
        f"formats: {formats}",
        *(_comment_safe(f"levels: {line}") for line in spec.maps),
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


def _limits(dtype: str) -> tuple[str, str] | None:
    """An integral dtype's smallest and largest values as C constants (None for others):
    a semiring's infinite identity in it (the templates' ``SC_VAL_LOW``/``SC_VAL_HIGH``)."""
    if not is_integral(dtype):
        return None
    vt = value_type(dtype)
    return _int_literal(vt.low), _int_literal(vt.high)


def _int_literal(value: int) -> str:
    """``value`` as a C integer constant of a type that holds it (-2^63 has no literal)."""
    if value == -(1 << 63):
        return "(-9223372036854775807LL - 1)"
    return f"{value}ULL" if value >= 1 << 63 else f"{value}LL"


def render(target: Dialect, lines: list[str], gen: Generated, **fields: object) -> str:
    """``target``'s translation unit for ``gen`` (its types and parameters): the template
    filled with the header comment ``lines`` and ``fields`` (printed bodies and the
    template's switches)."""
    half = gen.dtype in HALF_DTYPES
    return (
        environment()
        .get_template(target.template)
        .render(
            header=lines,
            val_type=target.half_types[gen.dtype] if half else target.value_types[gen.dtype],
            acc_type=target.acc_types[gen.dtype],
            idx_type=target.index_types[gen.index_dtype],
            params=[param(target, p, gen) for p in gen.signature.params],
            half=gen.dtype if half else "",
            integral=_limits(gen.dtype),
            **fields,
        )
    )
