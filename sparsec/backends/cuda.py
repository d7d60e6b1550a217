"""CUDA target: the same loop IR as C, printed as one ``extern "C" __global__`` kernel
through the ``kernel.cu.j2`` skeleton.

GPU loops are grid/block/warp-strided (see `printer.GPU_STRIDES`), so any launch size is
correct and the grid only matters for speed. The mapping itself is chosen before:
`sparsec.policy.schedules` proposes it and `sparsec.pipeline` lowers it."""

from __future__ import annotations

from dataclasses import replace

from ..abi import ASSEMBLE_NAME, KERNEL_NAME, LAUNCH_ASSEMBLE_NAME, LAUNCH_NAME
from ..middle.spec import Spec
from .generated import Generated, Launch
from .printer import (
    CUDA,
    DIALECTS,
    Printer,
    adds_into_output,
    header,
    param,
    render,
    storage_arrays,
)


def print_cuda(spec: Spec, gen: Generated) -> Generated:
    """``gen`` with its source: the CUDA translation unit of its launch's body, whose
    header tells the launch (``gen.launch``: the grid, the block, the output's zeroing),
    and the emulation's launchers of it."""
    launch: Launch = gen.launch
    bodies = (launch.body, *((launch.assemble,) if launch.assemble is not None else ()))
    wide = adds_into_output(gen.dtype, gen.signature, *bodies)
    gen = replace(gen, wide_output=wide)
    storage = storage_arrays(gen.dtype, gen.signature, *bodies, wide=wide)
    dialect = DIALECTS[gen.target.language]  # CUDA's (another GPU API's: its own)
    printer = Printer(dialect, threads=gen.signature.threads, storage=storage, dtype=gen.dtype)
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
    return replace(gen, source=source, launchers=launchers(gen))


def launchers(gen: Generated) -> str:
    """The CUDA emulation's ``sparsec_launch(grid, block, <parameters>)`` (and
    ``sparsec_launch_assemble`` for a sparse output's count), printed after the source."""
    params = ",\n    ".join(param(CUDA, p, gen) for p in gen.signature.params)
    names = ", ".join(p.name for p in gen.signature.params)
    launch: Launch = gen.launch
    text = "\n/* the emulation's launcher: every block of the grid, every thread of a block */\n"
    text += shim_launcher(LAUNCH_NAME, params, f"{KERNEL_NAME}({names})", launch.shuffles)
    if launch.assemble is not None:
        call = f"{ASSEMBLE_NAME}({names})"
        text += shim_launcher(LAUNCH_ASSEMBLE_NAME, params, call, launch.shuffles)
    return text


def shim_launcher(export: str, params: str, call: str, fibers: bool) -> str:
    """``extern "C" int export(grid, block, params)``: ``call`` for every thread of every
    block of the grid (as fibers that meet at shuffles when ``fibers``), through the
    emulation's shim (``templates/cuda_shim.h``)."""
    return (
        f'extern "C" int {export}(long long sc_grid, int sc_block,\n'
        f"    {params}) {{\n"
        f"  auto sc_body = [&]() {{ {call}; }};\n"
        f"  sc_emu::launch(sc_grid, sc_block, {'true' if fibers else 'false'}, sc_body);\n"
        "  return 0;\n"
        "}\n"
    )
