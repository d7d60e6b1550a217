"""Loops mapped to the GPU: how GPUBlock, GPUWarp and GPUThread loops nest, and the
race strategies a GPU loop takes (atomicAdd into the output, per-thread partial sums
added atomically, a warp's shuffle reduction with lane 0 storing)."""

from __future__ import annotations

from ..errors import ScheduleError
from ..ir import nodes as ir
from ..middle.commands import GPU_UNITS
from ..middle.plan import Parallelize
from .ctx import AccSink, Sink
from .env import LowerEnv
from .races import LoopSetup, race


def gpu_setup(
    env: LowerEnv,
    loop: str,
    req: Parallelize,
    distinct: frozenset[str],
    sink: Sink,
    kind: str,
    trip: ir.Expr,
    setup: LoopSetup,
) -> LoopSetup:
    """A loop mapped to the GPU: nesting rules, then the same race analysis as on the
    CPU (a thread's locals are private, so a shared accumulator is a warp reduction)."""
    cmd = req.origin
    unit = req.unit
    if unit not in GPU_UNITS:
        raise ScheduleError(
            f"{cmd}: {unit} is a CPU unit; the CUDA target maps loops to GPUBlock, "
            "GPUWarp and GPUThread"
        )
    if kind != "for":
        raise ScheduleError(
            f"{cmd}: the loop over {loop} is a while loop ({kind}); its iterations depend "
            "on each other. Map an enclosing loop, or iterate one operand's positions "
            f"with pos({loop},...)"
        )
    _gpu_nesting(env, cmd, unit)
    _gpu_rows(env, cmd, loop)
    if unit == "GPUBlock":
        if env.grid is not None:
            raise ScheduleError(
                f"{cmd}: the GPUBlock loop is reached on more than one path of the loop "
                "nest; map a loop that runs once per kernel"
            )
        env.grid = trip
    units = env.flags.gpu_units
    lane = unit == "GPUThread" and "GPUWarp" in units
    setup.flags["gpu_units"] = (*units, unit)
    out = env.lhs.name
    target_acc = isinstance(sink, AccSink)
    why = race(env, loop, distinct, sink)
    par = ir.Parallel(unit, "lane" if lane else "")
    if isinstance(sink, AccSink):
        env.acc_units.setdefault(sink.name, set()).add("lane" if lane else unit)
    if why is None:
        setup.parallel = par
        env.notes.append(f"{loop}: {unit}, race-free")
        return setup
    match req.races:
        case "NoRaces" | "IgnoreRaces":
            raise ScheduleError(
                f"{cmd}: iterations of {loop} write the same element of {out} ({why}); "
                f"with {req.races} that would give a wrong sum. Use Atomics"
                + (" or ParallelReduction" if lane and target_acc else "")
            )
        case "Atomics" if not target_acc:
            setup.flags["atomic_writes"] = True
            setup.parallel = par
            env.notes.append(f"{loop}: {unit}, atomicAdd into {out}")
        case "Atomics":
            # each thread sums its iterations privately, then adds its part atomically
            assert isinstance(sink, AccSink)
            env.partial_accs.add(sink.name)
            setup.parallel = par
            env.notes.append(f"{loop}: {unit}, per-thread partial sums, atomicAdd into {out}")
        case "ParallelReduction" if target_acc and lane:
            assert isinstance(sink, AccSink)
            env.warp_reduced.add(sink.name)
            setup.parallel = par
            env.notes.append(f"{loop}: {unit} lanes, warp shuffle reduction, lane 0 stores")
        case _:
            raise ScheduleError(
                f"{cmd}: {req.races} does not apply here ({why}); on the GPU use Atomics "
                "for an output element that threads share, or ParallelReduction on a "
                "GPUThread loop inside a GPUWarp loop that reduces into one element"
            )
    return setup


def _gpu_nesting(env: LowerEnv, cmd: str, unit: str) -> None:
    """GPU loops nest as the launch does: block, then warp, then thread."""
    units = env.flags.gpu_units
    if unit == "GPUBlock" and units:
        raise ScheduleError(
            f"{cmd}: a GPUBlock loop inside a {units[-1]} loop; the grid has one level, "
            "so GPUBlock goes on the outermost GPU loop"
        )
    if unit == "GPUWarp" and units != ("GPUBlock",):
        raise ScheduleError(
            f"{cmd}: GPUWarp needs an enclosing GPUBlock loop, with no other GPU loop between them"
        )
    if unit == "GPUThread" and "GPUBlock" not in units:
        raise ScheduleError(
            f"{cmd}: GPUThread without an enclosing GPUBlock loop; parallelize an outer "
            "loop with GPUBlock (e.g. split(i,i0,i1,256), parallelize(i0,GPUBlock,"
            "NoRaces), parallelize(i1,GPUThread,NoRaces))"
        )
    if unit == "GPUThread" and "GPUThread" in units:
        raise ScheduleError(f"{cmd}: a GPUThread loop inside another GPUThread loop")


def _gpu_rows(env: LowerEnv, cmd: str, loop: str) -> None:
    """A sparse output on the GPU is counted and filled a whole row per thread (each row
    appends from its own offset): only loops over its rows (dense levels above the first
    sparse one), or pieces of them, may map to GPU units."""
    asm = env.assembler
    if asm is None:
        return
    plan = env.plan
    space = plan.space_of(loop) if plan is not None else None
    binds = plan.spaces[space].vars if plan is not None and space is not None else (loop,)
    rows = asm.vars[: asm.layout.dense_prefix]
    if not set(binds) <= set(rows):
        raise ScheduleError(
            f"{cmd}: the sparse output {env.lhs.name} ({env.spec.output.format}) is filled "
            f"a whole row per GPU thread, each row appending from its own offset; map only "
            f"its row loop{'s' if len(rows) > 1 else ''} ({', '.join(rows)}) or pieces of "
            f"{'them' if len(rows) > 1 else 'it'} to GPU units, not {', '.join(binds)}"
        )
