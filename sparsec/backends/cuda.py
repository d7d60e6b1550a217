"""CUDA target: the same loop IR as C, printed as one ``extern "C" __global__`` kernel
through the ``kernel.cu.j2`` skeleton.

GPU loops are grid/block/warp-strided (see `printer.GPU_STRIDES`), so any launch size is
correct and the grid only matters for speed. The mapping itself is chosen before:
`sparsec.policy.schedules` proposes it and `sparsec.pipeline` lowers it."""

from __future__ import annotations

from dataclasses import replace

from ..abi import ASSEMBLE_NAME, KERNEL_NAME
from ..middle.spec import Spec
from .generated import Generated, Launch
from .printer import DIALECTS, Printer, adds_into_output, header, render, storage_arrays


def print_cuda(spec: Spec, gen: Generated) -> Generated:
    """``gen`` with its source: the CUDA translation unit of its launch's body, whose
    header tells the launch (``gen.launch``: the grid, the block, the output's zeroing)."""
    launch: Launch = gen.launch
    bodies = (launch.body, *((launch.assemble,) if launch.assemble is not None else ()))
    wide = adds_into_output(gen.dtype, gen.signature, *bodies)
    gen = replace(gen, wide_output=wide)
    storage = storage_arrays(gen.dtype, gen.signature, *bodies, wide=wide)
    dialect = DIALECTS[gen.target.language]  # CUDA's (another GPU API's: its own)
    printer = Printer(dialect, threads=gen.signature.threads, storage=storage)
    grid = printer.expr(launch.grid) if launch.grid is not None else "(set by the runtime)"
    lines = header(spec, gen, dialect)
    lines.insert(
        -1,
        f"launch: grid = {grid} blocks (grid-stride loops), block = {launch.block} threads, "
        "0 bytes of shared memory"
        + ("; the output is zeroed before the launch" if launch.zero_before else ""),
    )
    body = "\n".join(printer.stmts(launch.body))
    semiring = spec.semantics.semiring != "plus_times"
    fields: dict[str, object] = {"assemble": None, "assemble_name": ASSEMBLE_NAME}
    fields["workspace"] = bool(launch.scratch)
    fields["groups"] = launch.groups
    fields["segments"] = launch.segments
    if launch.assemble is not None:
        fields["assemble"] = "\n".join(printer.stmts(launch.assemble))
    source = render(dialect, lines, gen, name=KERNEL_NAME, body=body, semiring=semiring, **fields)
    return replace(gen, source=source)
