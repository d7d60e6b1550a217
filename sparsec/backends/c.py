"""C target: spec → loop IR → C source through the ``kernel.c.j2`` skeleton."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import jinja2

from ..abi import INT, Namer, Param, Signature, signature
from ..ir import nodes as ir
from ..lower import RowsOutOfOrder, lower
from ..middle.schedule import Command
from ..middle.spec import Spec
from ..passes.bands import BAND, DEPTH, Walks, band
from ..passes.streams import prefetch_streams
from ..passes.tile import VECTORS as tile_vectors
from ..passes.tile import tile
from ..policy.machine import machine
from ..resources import data_dir
from ..tensors.layout import OutputLayout
from .printer import C, Printer

KERNEL_NAME = "sparsec_kernel"
ASSEMBLE_NAME = "sparsec_assemble"
APPEND_NAME = "sparsec_append"

C_VALUE_TYPES = {"float32": "float", "float64": "double"}
#: the type reductions accumulate in (``ir.ACC``): float32 sums in double. Measured on a
#: 1e7-element float32 dot product (gcc -O3 -march=native, one thread): relative error
#: 1.2e-2 summing in float, 5e-6 in blocks of 256, 1.9e-8 in double; 12.6 ms in float and
#: in double alike (the scalar sum waits on each add's latency either way; the conversion
#: is off that chain), 14-16 ms in blocks (a branch per term)
C_ACC_TYPES = {"float32": "double", "float64": "double"}
C_INDEX_TYPES = {"int32": "int32_t", "int64": "int64_t"}
#: the kernel's flag for storing output tiles non-temporally, and the template's macro for
#: the output size (in values) from which it is set
STREAM_OUT = "sc_stream_out"
STREAM_OUT_VALUES = ir.Var("SC_STREAM_OUT_VALUES")


@dataclass(frozen=True, slots=True)
class Generated:
    source: str
    signature: Signature
    loop_order: tuple[str, ...]
    schedule: str
    dtype: str
    index_dtype: str
    #: what each `bound` of the schedule promises (kernel status BOUND_VIOLATED)
    bounds: tuple[str, ...] = ()
    #: "c" or "cuda"
    target: str = "c"
    #: CUDA: grid, block and zeroing (a `cuda.Launch`)
    launch: Any = None
    #: the schedule's commands that were applied (CUDA: the default's, when chosen)
    commands: tuple[Command, ...] = ()
    #: sparse output: the function that fills the output in one serial pass, given arrays
    #: of a proven capacity ("": none; the two phases run)
    append: str = ""
    #: whether the C source also defines ``sparsec_kernel_packed`` (its arguments in one
    #: int64 array; none where a parameter is a scalar value)
    packed: bool = False


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


def header(
    spec: Spec, sig: Signature, order: tuple[str, ...], schedule: str, types: str
) -> list[str]:
    formats = ", ".join(
        f"{t.name}: {t.format}"
        + (f" ({t.format.spelling})" if str(t.format) != t.format.spelling else "")
        for t in spec.tensors
    )
    return [
        _comment_safe(f"sparsec kernel: {spec.assignment}"),
        _comment_safe(f"concrete index notation: {spec.statement}"),
        f"formats: {formats}",
        f"loop order: {', '.join(order) or '(none)'}",
        f"schedule: {schedule}",
        f"types: {types}",
        f"arguments: {', '.join(p.name for p in sig.params)}",
    ]


def describe_schedule(
    spec: Spec,
    parallel: bool,
    loops: tuple[str, ...],
    order: tuple[str, ...],
    commands: tuple[Command, ...] = (),
    notes: tuple[str, ...] = (),
) -> str:
    """The schedule that ran, in words (header comment and `Kernel.schedule`)."""
    if commands:
        user = ", ".join(str(c) for c in commands)
        if not parallel:
            return f"user: {user}; serial (requested)"
        if notes:
            return f"user: {user}; parallel: {'; '.join(notes)}"
        if loops:
            return (
                f"user: {user}; default parallel loop {', '.join(loops)} (OpenMP dynamic, "
                "~8 chunks per thread)"
            )
        return f"user: {user}; serial (no loop parallelized)"
    if not parallel:
        return "serial (requested)"
    if not spec.output.format.is_dense and not loops:
        return "default: serial (a sparse output is appended in one sequence)"
    if loops:
        how = f" ({'; '.join(notes)})" if notes else ""
        return (
            f"default: loop {', '.join(loops)} runs on CPU threads "
            f"(OpenMP dynamic, ~8 chunks per thread){how}; inner loops serial"
        )
    first = order[0] if order else None
    why = (
        f"the outermost loop ({first}) is not a plain loop over an output index"
        if first
        else "there are no loops"
    )
    return f"default: serial, since {why}"


@dataclass(frozen=True, slots=True)
class _Function:
    name: str
    comment: str
    body: str


def _optimize(body: ir.Block) -> tuple[ir.Block, tuple[str, ...], tuple[str, ...]]:
    """The C-only passes over a lowered function body: ``(body, tile notes, stream notes)``.

    Streams first: a loop that the tile pass will tile nests the tiled loop, so it is no
    stream loop, and a stream loop's prefetches never sit inside a region to be tiled."""
    body, streamed = prefetch_streams(body)
    body, tiled = tile(body)
    return body, tiled, streamed


def _stores_out(s: ir.Stmt, out: str) -> ir.Stmt:
    """``s`` with each register tile's store into array ``out`` (the tile pass's
    ``vstore``) made an output store that may bypass the cache (``vstore_out``); tiles
    stored into a workspace, which is read again, keep the plain store."""
    if isinstance(s, ir.Effect) and s.call.fn == "vstore":
        at = s.call.args[0]
        if isinstance(at, ir.Bin) and at.op == "+" and at.left == ir.Var(out):
            return ir.Effect(ir.Call("vstore_out", (*s.call.args, ir.Var(STREAM_OUT))))
        return s
    return ir.map_blocks(s, lambda b: ir.Block(tuple(_stores_out(x, out) for x in b.body)))


def _stream_output(
    body: ir.Block, spec: Spec, sig: Signature, deep: bool = False
) -> ir.Block | None:
    """A dense output's tiles stored non-temporally when the output is at least the
    last-level cache (it would be evicted before anything reads it again): the flag is
    decided once from the extents, and the kernel ends with a store fence. None when no
    tile stores into the output. A call in depth blocks (``deep``: the kernel takes
    `DEPTH`) reads its output tiles back, so it never streams them."""
    size: ir.Expr = ir.IntLit(1)
    for index in spec.statement.lhs.indices:
        size = ir.mul(size, ir.Var(sig.dim(index)))
    big: ir.Expr = ir.Bin(">=", size, STREAM_OUT_VALUES)
    if deep:
        big = ir.conj(big, ir.Bin("==", ir.Var(DEPTH), ir.IntLit(0)))
    out = sig.array(spec.output.name, "vals")
    stored = ir.Block(tuple(_stores_out(s, out) for s in body.body))
    if stored == body:
        return None  # the tiles store elsewhere (a workspace), e.g. for a scalar output
    # a tile runs along the output's last level with stride 1 from a multiple of that
    # level's extent: when the array and that extent are whole vectors, every tile vector
    # is aligned, as a non-temporal store needs
    last = spec.statement.lhs.indices[spec.output.format.ordering[-1]]
    aligned = ir.Call("rows_aligned", (ir.Var(out), ir.Var(sig.dim(last))))
    flag = ir.Decl(ir.I64, STREAM_OUT, ir.conj(big, aligned))
    return ir.block(flag, stored, ir.Effect(ir.Call("store_fence", ())))


def _walks(spec: Spec, sig: Signature) -> Walks:
    """Each compressed input level's ``crd`` array -> (its ``pos`` array, the level's
    extent), for depth blocks; a level whose tensor is read at more than one index there
    is left out (its extent is not one index's)."""
    found: dict[str, tuple[str, ir.Expr]] = {}
    for p in sig.params:
        if p.field != "crd" or p.tensor is None or p.tensor == spec.output.name:
            continue
        t = spec.tensor(p.tensor)
        mode = t.format.ordering[p.level]
        indices = {a.indices[mode] for a in spec.assignment.accesses() if a.name == t.name}
        try:
            pos = sig.array(t.name, "pos", p.level)
        except KeyError:
            continue  # a singleton level: no segments
        if len(indices) == 1:
            found[p.name] = (pos, ir.Var(sig.dim(indices.pop())))
    return found


def _packed(sig: Signature) -> list[str]:
    """The arguments ``sparsec_kernel_packed`` passes on, read from its int64 array ``a``
    (arrays as addresses, in ABI order), or none where a parameter is a value of the
    kernel's value type (a scalar input), which no int64 holds."""
    out = []
    for n, p in enumerate(sig.params):
        ty = C.types[p.type]
        if p.kind == "array":
            const = "" if p.writable else "const "
            out.append(f"({const}{ty}*)(uintptr_t)a[{n}]")
        elif p.type == ir.VAL:
            return []
        else:
            out.append(f"({ty})a[{n}]")
    return out


def generate(
    spec: Spec,
    *,
    dtype: str = "float64",
    index_dtype: str = "int32",
    parallel: bool = True,
    commands: tuple[Command, ...] = (),
) -> Generated:
    """C source for ``spec``: ``sparsec_kernel`` and, for a sparse output, also
    ``sparsec_assemble``, which only counts the output's positions into ``sc_sizes``."""

    def make_names() -> tuple[Signature, Namer]:
        namer = Namer()
        return signature(spec, namer), namer

    lowered, sig = lower(spec, make_names, parallel=parallel, commands=commands)
    printer = Printer(C, threads=sig.threads)
    functions = []
    # whether the append function was tiled: the template's vector helpers serve it too
    append_tiled: tuple[str, ...] = ()
    if not spec.output.format.is_dense:
        counted, _ = lower(spec, make_names, parallel=parallel, counting=True, commands=commands)
        functions.append(
            _Function(
                ASSEMBLE_NAME,
                "symbolic phase: count the positions of every output level into sc_sizes",
                "\n".join(printer.stmts(counted.body)),
            )
        )
        comment = "numeric phase: append coordinates and values into the allocated arrays"
        single = None
        if not commands:
            try:
                single, _ = lower(spec, make_names, parallel=False, append=True)
            except RowsOutOfOrder:
                pass  # rows visited out of storage order: counted and filled, two phases
        if single is not None:
            single_body, append_tiled, _ = _optimize(single.body)
            functions.append(
                _Function(
                    APPEND_NAME,
                    "single pass for one thread: append in order into arrays of a capacity "
                    "the runtime proved (plus a row of slack); the final sizes are in pos",
                    "\n".join(printer.stmts(single_body)),
                )
            )
            append = APPEND_NAME
        elif OutputLayout.of(spec.output.format, spec.output.name).rowwise:
            # a user schedule's rows fill in parallel, or rows come out of storage order:
            # the two phases only
            append = ""
        else:
            append = KERNEL_NAME  # a serial kernel appends into any arrays large enough
    else:
        comment = ""
        append = ""
    body, tiled, streamed = _optimize(lowered.body)
    # column bands reorder the kernel's parallel loop; the append function is serial
    body, banded, extra = band(body, _walks(spec, sig))
    fields = {BAND: "band", DEPTH: "depth"}
    sig = Signature((*sig.params, *(Param(n, "value", INT, fields[n]) for n in extra)))
    llc = machine().last_level_cache  # the template's threshold and the schedule's note
    stored: tuple[str, ...] = ()
    if tiled and spec.output.is_dense:
        streaming = _stream_output(body, spec, sig, DEPTH in extra)
        if streaming is not None:
            body = streaming
            stored = (f"output tiles stored non-temporally from {llc} bytes",)
    functions.append(_Function(KERNEL_NAME, comment, "\n".join(printer.stmts(body))))
    schedule = describe_schedule(
        spec, parallel, lowered.parallel_loops, lowered.loop_order, commands, lowered.notes
    )
    if tiled or streamed:
        schedule += f"; {'; '.join((*tiled, *banded, *stored, *streamed))}"
    val_t, idx_t = C_VALUE_TYPES[dtype], C_INDEX_TYPES[index_dtype]
    packed = _packed(sig)
    source = (
        environment()
        .get_template("kernel.c.j2")
        .render(
            header=header(
                spec, sig, lowered.loop_order, schedule, f"values {val_t}, indices {idx_t}"
            ),
            val_type=val_t,
            acc_type=C_ACC_TYPES[dtype],
            idx_type=idx_t,
            functions=functions,
            vectors=tile_vectors if tiled or append_tiled else 0,
            stream_sfx="ps" if dtype == "float32" else "pd",
            stream_out_bytes=llc,
            params=[C.param(p) for p in sig.params],
            packed=packed,
        )
    )
    return Generated(
        source,
        sig,
        lowered.loop_order,
        schedule,
        dtype,
        index_dtype,
        lowered.bounds,
        append=append,
        packed=bool(packed),
    )
