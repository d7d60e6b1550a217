"""CUDA target: the same loop IR as C, printed as one ``extern "C" __global__`` kernel.

GPU loops come from the schedule's units (`GPUBlock`, `GPUWarp`, `GPUThread`); with no
schedule, `default_schedule` picks thread-per-row over the outermost loop (a plain range,
or a sparse tensor's positions through ``pos``), with atomics when that loop's iterations
share output elements. The runtime zeroes the output before the launch when the kernel
adds into it, and launches ``grid`` blocks of ``block`` threads; every GPU loop is
grid/block/warp-strided, so any launch size is correct and the grid only matters for speed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..abi import Namer, Signature, signature
from ..errors import ScheduleError
from ..frontend.concrete import accesses
from ..lower import LoweredKernel, lower
from ..middle.order import level_indices
from ..middle.schedule import Command, name_supply, parse_commands
from ..middle.spec import Spec
from ..passes.coarsen import BLOCK as COARSE_BLOCK
from ..passes.coarsen import coarsen
from .c import C_VALUE_TYPES, KERNEL_NAME, Generated, environment, header
from .printer import CUDA, Printer

CUDA_INDEX_TYPES = {"int32": "int", "int64": "long long"}
#: the type reductions accumulate in (``ir.ACC``): the value type. Unlike the C target's
#: (float32 sums in double there), most GPUs run double arithmetic at 1/32 to 1/64 of the
#: float rate, which would make float32 SpMM several times slower; sums across a GPU
#: mapping's threads are also split into shorter per-thread parts
CUDA_ACC_TYPES = {"float32": "float", "float64": "double"}
THREADS_PER_BLOCK = 256


@dataclass(frozen=True, slots=True)
class Launch:
    """How the runtime launches the kernel."""

    #: the trip count of the GPUBlock loop, as loop IR over the kernel's arguments and the
    #: declarations before that loop (``lowered.body``); None: not known before the launch
    grid: object
    block: int
    #: the output must be zeroed before the launch
    zero_before: bool
    #: the lowered body (for evaluating ``grid`` on the host)
    body: object
    #: lanes of a warp exchange values (``__shfl_down_sync``): the emulation needs fibers
    shuffles: bool = False


def default_schedule(spec: Spec, order: tuple[str, ...]) -> list[list[str]]:
    """Candidate GPU schedules, best first.

    A sparse operand of order three or more whose levels are the outermost loops is
    iterated over its nonzeros (TACO's GPU MTTKRP: fuse its levels, ``pos``, 8 nonzeros per
    thread and 256 threads per block, atomics where the output is shared), since its slices
    are too uneven for a thread each. Next, when the outermost and innermost loops both
    index the output and the innermost is dense in every operand (SpMM's ``i`` and ``j``):
    an output row per block and its columns across the block's threads, the innermost loop
    moved second, so a warp's loads and stores are contiguous. Otherwise, thread-per-row
    over the outermost loop: a plain range, or a sparse operand's positions; with atomics
    when that loop's iterations share output elements.
    """
    if not order:
        return []
    v = order[0]
    fresh = name_supply(set(spec.indices) | {t.name for t in spec.tensors})

    candidates: list[list[str]] = []
    for access in dict.fromkeys(accesses(spec.statement.rhs)):
        fmt = spec.tensor(access.name).format
        levels = level_indices(access, fmt)
        if fmt.is_dense or len(levels) < 3 or tuple(order[: len(levels)]) != levels:
            continue
        commands, fused = [], levels[0]
        for var in levels[1:]:
            joint = fresh("f")
            commands.append(f"fuse({fused},{var},{joint})")
            fused = joint
        fp, b, rest, t, n = (
            fresh("fpos"),
            fresh("block"),
            fresh("fpos1"),
            fresh("thread"),
            fresh("nz"),
        )
        per_thread = 8
        commands += [
            f"pos({fused},{fp},{access.name})",
            f"split({fp},{b},{rest},{per_thread * THREADS_PER_BLOCK})",
            f"split({rest},{t},{n},{per_thread})",
            f"parallelize({b},GPUBlock,Atomics)",
            f"parallelize({t},GPUThread,Atomics)",
        ]
        candidates.append(commands)
        break
    last = order[-1]
    sparse_inputs = [tv.name for tv in spec.inputs if not tv.format.is_dense]
    out_indices = set(spec.statement.lhs.indices)
    if (
        len(order) >= 2
        and {v, last} <= out_indices
        and not any(last in _indices_of(spec, name) for name in sparse_inputs)
    ):
        # an output row per block, its dense columns across the block's threads: the
        # threads of a warp read and write consecutive elements (coalesced)
        commands = [f"reorder({','.join((v, last, *order[1:-1]))})"] if len(order) > 2 else []
        commands += [f"parallelize({v},GPUBlock,NoRaces)", f"parallelize({last},GPUThread,NoRaces)"]
        candidates.append(commands)
    b, t, p = fresh(f"{v}_block"), fresh(f"{v}_thread"), fresh(f"{v}_pos")
    sparse = [
        tv.name for tv in spec.inputs if not tv.format.is_dense and v in _indices_of(spec, tv.name)
    ]
    for races in ("NoRaces", "Atomics"):
        tail = [
            f"split({{}},{b},{t},{THREADS_PER_BLOCK})",
            f"parallelize({b},GPUBlock,{races})",
            f"parallelize({t},GPUThread,{races})",
        ]
        candidates.append([tail[0].format(v), *tail[1:]])
        for name in sparse:
            candidates.append([f"pos({v},{p},{name})", tail[0].format(p), *tail[1:]])
    return candidates


def _indices_of(spec: Spec, tensor: str) -> set[str]:
    return {i for a in accesses(spec.statement.rhs) if a.name == tensor for i in a.indices}


def generate_cuda(
    spec: Spec,
    *,
    dtype: str = "float64",
    index_dtype: str = "int32",
    commands: tuple[Command, ...] = (),
) -> Generated:
    """The CUDA source of ``spec``'s kernel under ``commands`` (or the default GPU schedule)."""

    def make_names() -> tuple[Signature, Namer]:
        namer = Namer()
        return signature(spec, namer), namer

    if not spec.output.format.is_dense:
        raise ScheduleError(
            f"the output {spec.output.name} is sparse ({spec.output.format}); sparse outputs "
            "have no GPU mapping yet: use target='c', or a dense output"
        )
    chosen = commands
    if commands:
        lowered, sig = lower(spec, make_names, commands=commands, target="cuda")
        description = "user: " + ", ".join(str(c) for c in commands)
    else:
        base, _ = lower(spec, make_names)
        found: tuple[LoweredKernel, Signature] | None = None
        reasons: list[str] = []
        for candidate in default_schedule(spec, base.loop_order):
            try:
                chosen = parse_commands(candidate)
                found = lower(spec, make_names, commands=chosen, target="cuda")
                break
            except ScheduleError as err:
                reasons.append(str(err))
        if found is None:
            why = (
                f" (tried thread-per-row over {base.loop_order[0]}: {reasons[-1]})"
                if reasons
                else ""
            )
            raise ScheduleError(
                f"no GPU mapping for {spec.assignment} with these formats{why}; give a "
                "schedule with GPUBlock/GPUThread loops, or use target='c'"
            )
        lowered, sig = found
        description = "default: " + ", ".join(str(c) for c in chosen)
    body, block = lowered.body, lowered.block
    if not commands:
        body, coarse = coarsen(body)
        if coarse:
            block = COARSE_BLOCK
            lowered = replace(lowered, body=body, block=block, notes=(*lowered.notes, *coarse))
    notes = "; ".join(lowered.notes)
    schedule = f"{description}; {notes}" if notes else description
    printer = Printer(CUDA, threads=sig.threads)
    val_t, idx_t = C_VALUE_TYPES[dtype], CUDA_INDEX_TYPES[index_dtype]
    grid = printer.expr(lowered.grid) if lowered.grid is not None else "(set by the runtime)"
    lines = header(spec, sig, lowered.loop_order, schedule, f"values {val_t}, indices {idx_t}")
    lines.insert(
        -1,
        f"launch: grid = {grid} blocks (grid-stride loops), block = {lowered.block} threads, "
        "0 bytes of shared memory"
        + ("; the output is zeroed before the launch" if lowered.zero_before else ""),
    )
    source = (
        environment()
        .get_template("kernel.cu.j2")
        .render(
            header=lines,
            val_type=val_t,
            acc_type=CUDA_ACC_TYPES[dtype],
            idx_type=idx_t,
            name=KERNEL_NAME,
            params=[CUDA.param(p) for p in sig.params],
            body="\n".join(printer.stmts(lowered.body)),
        )
    )
    launch = Launch(
        lowered.grid, lowered.block, lowered.zero_before, lowered.body, lowered.shuffles
    )
    return Generated(
        source,
        sig,
        lowered.loop_order,
        schedule,
        dtype,
        index_dtype,
        lowered.bounds,
        target="cuda",
        launch=launch,
        commands=chosen,
    )
