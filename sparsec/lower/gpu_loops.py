"""Loops mapped to the GPU: how GPUBlock, GPUWarp and GPUThread loops nest, and the
race strategies a GPU loop takes (atomicAdd into the output, per-thread partial sums
added atomically, a warp's or a lane group's shuffle reduction with its first lane
storing).

Inside a GPUWarp loop a GPUThread loop runs over the warp's 32 lanes. Two nested ones
split the warp into groups (CSR-vector): the outer is the inner piece of a split with
factor R (2, 4, 8 or 16) and gives each of the warp's R groups of 32 / R lanes one
iteration; the inner one runs over a group's lanes."""

from __future__ import annotations

from ..base.errors import ScheduleError
from ..ir import nodes as ir
from ..middle.commands import Races, Unit
from ..middle.plan import Parallelize
from .ctx import AccSink
from .env import LowerEnv
from .races import Loop, LoopSetup, race


def gpu_setup(env: LowerEnv, asked: Loop, req: Parallelize, setup: LoopSetup) -> LoopSetup:
    """A loop mapped to the GPU: nesting rules, then the same race analysis as on the
    CPU (a thread's locals are private, so a shared accumulator is a warp reduction)."""
    loop, distinct, sink, kind, trip = asked.var, asked.distinct, asked.sink, asked.kind, asked.trip
    cmd = req.origin
    unit = req.unit
    if not unit.gpu:
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
    if unit == Unit.GPUBlock:
        if env.found.grid is not None:
            raise ScheduleError(
                f"{cmd}: the GPUBlock loop is reached on more than one path of the loop "
                "nest; map a loop that runs once per kernel"
            )
        env.found.grid = trip
    units = env.flags.gpu_units
    lane = unit == Unit.GPUThread and Unit.GPUWarp in units
    warp = env.inputs.target.lanes
    lanes = env.flags.group_lanes or warp
    group = lane and "group" not in units and _encloses_lanes(env, loop)
    if group:
        lanes = _group_lanes(env, cmd, loop)
        setup.flags["group_lanes"] = lanes
    setup.flags["gpu_units"] = (*units, "group" if group else unit)
    out = env.inputs.lhs.name
    target_acc = isinstance(sink, AccSink)
    why = race(env, loop, distinct, sink)
    schedule = "group" if group else "lane" if lane else ""
    par = ir.Parallel(unit, schedule, lanes=lanes) if lanes != warp else ir.Parallel(unit, schedule)
    if isinstance(sink, AccSink):
        env.found.acc_units.setdefault(sink.name, set()).add("lane" if lane and not group else unit)
    if why is None:
        setup.parallel = par
        env.found.notes.append(f"{loop}: {unit}, race-free")
        return setup
    match req.races:
        case Races.NoRaces | Races.IgnoreRaces:
            raise ScheduleError(
                f"{cmd}: iterations of {loop} write the same element of {out} ({why}); "
                f"with {req.races} that would give a wrong sum. Use Atomics"
                + (" or ParallelReduction" if lane and target_acc else "")
            )
        case Races.Atomics if not target_acc:
            setup.flags["atomic_writes"] = True
            setup.parallel = par
            env.found.notes.append(f"{loop}: {unit}, atomicAdd into {out}")
        case Races.Atomics:
            # each thread sums its iterations privately, then adds its part atomically
            assert isinstance(sink, AccSink)
            env.found.partial_accs.add(sink.name)
            setup.parallel = par
            env.found.notes.append(f"{loop}: {unit}, per-thread partial sums, atomicAdd into {out}")
        case Races.ParallelReduction if target_acc and lane and not group:
            assert isinstance(sink, AccSink)
            env.found.warp_reduced.add(sink.name)
            setup.parallel = par
            if lanes == warp:
                env.found.notes.append(
                    f"{loop}: {unit} lanes, warp shuffle reduction, lane 0 stores"
                )
                return setup
            env.found.group_reduced[sink.name] = lanes
            env.found.notes.append(
                f"{loop}: {unit} lanes of a group of {lanes}, group shuffle reduction, "
                "the group's first lane stores"
            )
        case _:
            raise ScheduleError(
                f"{cmd}: {req.races} does not apply here ({why}); on the GPU use Atomics "
                "for an output element that threads share, or ParallelReduction on a "
                "GPUThread loop inside a GPUWarp loop that reduces into one element"
            )
    return setup


def _gpu_nesting(env: LowerEnv, cmd: str, unit: Unit) -> None:
    """GPU loops nest as the launch does: block, then warp, then thread."""
    units = env.flags.gpu_units
    if unit == Unit.GPUBlock and units:
        raise ScheduleError(
            f"{cmd}: a GPUBlock loop inside a {units[-1]} loop; the grid has one level, "
            "so GPUBlock goes on the outermost GPU loop"
        )
    if unit == Unit.GPUWarp and units != (Unit.GPUBlock,):
        raise ScheduleError(
            f"{cmd}: GPUWarp needs an enclosing GPUBlock loop, with no other GPU loop between them"
        )
    if unit == Unit.GPUThread and Unit.GPUBlock not in units:
        raise ScheduleError(
            f"{cmd}: GPUThread without an enclosing GPUBlock loop; parallelize an outer "
            "loop with GPUBlock (e.g. split(i,i0,i1,256), parallelize(i0,GPUBlock,"
            "NoRaces), parallelize(i1,GPUThread,NoRaces))"
        )
    if unit == Unit.GPUThread and Unit.GPUThread in units:
        raise ScheduleError(f"{cmd}: a GPUThread loop inside another GPUThread loop")
    if unit == Unit.GPUThread and "lane" in units:
        raise ScheduleError(
            f"{cmd}: a GPUThread loop inside a warp's lane loop; lanes split into groups "
            "once (a GPUThread loop over groups, then one over a group's lanes)"
        )


def _encloses_lanes(env: LowerEnv, loop: str) -> bool:
    """Whether another GPUThread loop of the schedule lies inside ``loop``: then
    ``loop``, a GPUThread loop inside a GPUWarp loop, runs over groups of lanes."""
    plan = env.decided.plan
    if plan is None:
        return False
    order = plan.order
    if loop not in order:
        return False
    inner = order[order.index(loop) + 1 :]
    return any(plan.parallel[v].unit == Unit.GPUThread for v in inner if v in plan.parallel)


def _group_lanes(env: LowerEnv, cmd: str, loop: str) -> int:
    """The lanes of each group of a GPUThread loop over groups: a warp's lanes / its split
    factor."""
    piece = env.decided.plan.pieces.get(loop) if env.decided.plan is not None else None
    factor = piece.factor if piece is not None and not piece.outer and not piece.divide else 0
    if factor not in (2, 4, 8, 16):
        raise ScheduleError(
            f"{cmd}: a GPUThread loop over groups of a warp's lanes (another GPUThread loop "
            f"lies inside it) must be the inner piece of a split by 2, 4, 8 or 16 (the "
            f"groups per warp: 16, 8, 4 or 2 lanes each); {loop} is not (e.g. split(i,iw,"
            f"{loop},4) for groups of 8 lanes)"
        )
    return env.inputs.target.lanes // factor


def _gpu_rows(env: LowerEnv, cmd: str, loop: str) -> None:
    """A sparse output on the GPU is counted and filled a whole row per thread (each row
    appends from its own offset): only loops over its rows (dense levels above the first
    sparse one), or pieces of them, may map to GPU units."""
    asm = env.decided.assembler
    if asm is None:
        return
    plan = env.decided.plan
    space = plan.space_of(loop) if plan is not None else None
    binds = plan.spaces[space].vars if plan is not None and space is not None else (loop,)
    rows = asm.vars[: asm.layout.dense_prefix]
    if not set(binds) <= set(rows):
        out = env.inputs.spec.output
        raise ScheduleError(
            f"{cmd}: the sparse output {out.name} ({out.format}) is filled "
            f"a whole row per GPU thread, each row appending from its own offset; map only "
            f"its row loop{'s' if len(rows) > 1 else ''} ({', '.join(rows)}) or pieces of "
            f"{'them' if len(rows) > 1 else 'it'} to GPU units, not {', '.join(binds)}"
        )
