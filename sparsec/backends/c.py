"""C target: a kernel's functions, as loop IR, printed into the ``kernel.c.j2`` skeleton.

Every decision (which functions exist, what passes ran, the schedule's words) is made
before: `sparsec.pipeline` hands this module finished bodies to print."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..abi import ASSEMBLE_NAME, KERNEL_NAME, PACKED_NAME
from ..ir import nodes as ir
from ..ir.visit import exprs, statements, subexpressions
from ..middle.spec import Spec
from ..passes.stages import guarded_extents
from .generated import Generated
from .printer import C, Printer, adds_into_output, header, param, render, storage_arrays


@dataclass(frozen=True, slots=True)
class Function:
    """One C function of the translation unit: all take the kernel's parameters."""

    name: str
    #: the comment above it ("": none)
    comment: str
    body: ir.Block
    #: a static function with one more parameter, this C declaration (a chunk's rows,
    #: `sparsec.lower.chunks`); "": an entry point with the kernel's parameters only
    extra: str = ""
    #: built at -O1 under GCC (`sparsec.passes.flags.light_count`)
    light: bool = False


@dataclass(frozen=True, slots=True)
class _Printed:
    name: str
    comment: str
    body: str
    extra: str = ""
    #: one of a sparse output's two phases where it also has a single-pass function: left
    #: out of the build that defines SC_APPEND_ONLY (`sparsec.runtime.loaded`)
    phase: bool = False
    light: bool = False


def _packed(gen: Generated) -> list[str]:
    """The arguments ``sparsec_kernel_packed`` passes on, read from its int64 array ``a``
    (arrays as addresses, in ABI order), or none where a parameter is a value of the
    kernel's value type (a scalar input), which no int64 holds."""
    out = []
    for n, p in enumerate(gen.signature.params):
        ty = C.types[p.type]
        if p.kind == "array":
            # the pointer type as declared ("T* restrict name", less the name)
            declared = param(C, p, gen).removesuffix(f"{C.restrict} {p.name}").strip()
            out.append(f"({declared})(uintptr_t)a[{n}]")
        elif p.type == ir.VAL:
            return []
        else:
            out.append(f"({ty})a[{n}]")
    return out


def print_c(
    spec: Spec,
    gen: Generated,
    functions: Sequence[Function],
    *,
    vectors: int,
    narrowest: int,
    llc: int,
    l1_way: int,
    l1_data: int,
    stream_locality: int = 3,
    stream_lines: int = 2,
    reassociate: bool = False,
) -> Generated:
    """``gen`` with its source: the C translation unit of ``functions`` (each takes the
    parameters ``gen.signature``), and ``sparsec_kernel_packed`` where it can be defined.
    ``vectors``: the register tile's vectors where a body was tiled (0: the template leaves
    the vector helpers out); ``narrowest``: the narrowest tile's vectors (the template
    sizes the narrower tiles' stages from it); ``llc``: the last-level cache's bytes, the
    output size from which tiles are stored non-temporally; ``l1_way``: one way of the L1 data cache's bytes
    (rows gathered a multiple of it apart are not prefetched into it); ``l1_data``: the L1
    data cache's bytes (rows gathered from a span that fits it are not prefetched); ``stream_locality``:
    the locality hint (0 to 3) of a stream loop's prefetches (`passes.streams`), and
    ``stream_lines`` the cache lines each prefetches; ``reassociate``: the compiler may
    reorder the kernel's sums (`PassOptions`; the build's flags, `Generated.reassociate`)."""
    bodies = tuple(f.body for f in functions)
    wide = adds_into_output(gen.dtype, gen.signature, *bodies)
    gen = replace(gen, wide_output=wide)
    storage = storage_arrays(gen.dtype, gen.signature, *bodies, wide=wide)
    printer = Printer(C, threads=gen.signature.threads, storage=storage, dtype=gen.dtype)
    packed = _packed(gen)
    calls = (
        e.fn
        for body in bodies
        for stmt in statements(body)
        for top in exprs(stmt)
        for e in subexpressions(top)
        if isinstance(e, ir.Call)
    )
    sorts = "sort_reached" in set(calls)
    extents = guarded_extents(*bodies) if vectors else ()
    # the two phases, where a single pass exists beside them (it is not the kernel itself)
    phases = (ASSEMBLE_NAME, KERNEL_NAME) if gen.append not in ("", KERNEL_NAME) else ()
    source = render(
        C,
        header(spec, gen, C),
        gen,
        functions=[
            _Printed(
                f.name,
                f.comment,
                "\n".join(printer.stmts(f.body)),
                f.extra,
                f.name in phases,
                f.light,
            )
            for f in functions
        ],
        vectors=vectors,
        narrowest=narrowest,
        stage_extents=extents,
        stream_sfx="ps" if gen.dtype == "float32" else "pd",
        stream_out_bytes=llc,
        l1_way_bytes=l1_way,
        l1_data_bytes=l1_data,
        stream_locality=stream_locality,
        stream_lines=stream_lines,
        reassociate=reassociate,
        packed=packed,
        packed_phase=bool(phases),
        sorts=sorts,
        light=any(f.light for f in functions),
        semiring=spec.semantics.semiring != "plus_times",
        kernel_name=KERNEL_NAME,
        packed_name=PACKED_NAME,
    )
    return replace(
        gen, source=source, packed=bool(packed), tile_extents=extents, reassociate=reassociate
    )
