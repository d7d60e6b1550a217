"""The output: stores into it (in place for a dense output, appended by the `Assembler`
for a sparse one), zeroing, runs of atomic stores, who stores on the GPU, and the one
epilogue that frames every kernel's loop nest."""

from __future__ import annotations

from typing import Protocol

from ..base.errors import ScheduleError
from ..ir import nodes as ir
from ..middle.commands import Unit
from ..middle.order import level_indices
from ..middle.plan import Plan
from ..tensors.formats import Dense, LevelNames, dense_extent
from .ctx import Ctx, OutputSink, SegmentSink, Sink
from .env import LowerEnv


def output_slot(env: LowerEnv, ctx: Ctx) -> ir.Load:
    """The output's value at the context's position (a private copy's, under Temporary)."""
    vals = env.flags.out_redirect or env.inputs.sig.array(env.inputs.lhs.name, "vals")
    if env.inputs.lhs.order == 0:
        return ir.Load(vals, ir.IntLit(0))
    return ir.Load(vals, ctx.levels[(env.inputs.lhs, env.inputs.lhs.order - 1)].pos)


def write(env: LowerEnv, ctx: Ctx, value: ir.Expr | None) -> ir.Block:
    """Store into the output; records whether this site writes each element once."""
    flags = env.flags
    if env.decided.assembler is not None:
        return ir.block(*env.decided.assembler.store(output_slot(env, ctx), value, flags.checked))
    assert value is not None
    lhs = set(env.inputs.lhs.indices)
    if flags.partial:
        # every thread adds its own partial sum: several writes, each atomic
        env.found.write_sites.append(False)
        env.found.repeats = True
        return ir.block(ir.Assign(output_slot(env, ctx), value, "+=", atomic=True))
    if not flags.lane0:
        one_store_per_part(env)
    # a schedule space entered around the write repeats it unless it is a plain range
    # over output indices (a split of i: every i once)
    spaces = env.decided.plan.spaces if env.decided.plan is not None else {}
    in_spaces = all(set(spaces[n].vars) <= lhs & ctx.covered for n in ctx.spaces)
    # the loops around the write bind the output's indices and nothing else: every loop
    # visits a coordinate at most once (canonical levels; merges and runs of a non-unique
    # level bind each once), so no element is written twice
    distinct = set(ctx.coords) == lhs and in_spaces
    env.found.write_sites.append(distinct and lhs <= ctx.covered)
    env.found.repeats |= not distinct
    slot = output_slot(env, ctx)
    return ir.block(ir.Assign(slot, value, env.inputs.out_op, atomic=flags.atomic_writes))


def nothing_written(env: LowerEnv, sink: Sink) -> None:
    """A branch that stores nothing: the output must then be zeroed up front."""
    if isinstance(sink, OutputSink):
        env.found.write_sites.append(False)


def store_shared(env: LowerEnv, acc: str, ctx: Ctx) -> list[ir.Stmt]:
    """Store an accumulator that GPU loops in its scope share; each loop's strategy
    decides one step, from the innermost out. Lanes with ParallelReduction add their
    parts up by shuffles (lane 0 keeps the warp's sum). Then, where any loop in the
    scope has Atomics (its threads, warps or blocks each hold a part), every holder
    adds its part atomically into the output, which is zeroed before the launch;
    otherwise lane 0 stores the whole sum."""
    reduced = acc in env.found.warp_reduced
    one_store_per_part(env, env.found.acc_units.get(acc), reduced)
    if acc in env.found.partial_accs:
        with env.scope(partial=True):
            store = write(env, ctx, ir.Var(acc))
    else:
        with env.scope(lane0=True):
            store = write(env, ctx, ir.Var(acc))
    if not reduced:
        return [store]
    lanes = env.found.group_reduced.get(acc)
    if lanes is not None:
        # a group of lanes (CSR-vector): shuffles within the group, its first lane stores
        width = ir.IntLit(lanes)
        return [
            ir.Assign(ir.Var(acc), ir.Call("group_sum", (ir.Var(acc), width))),
            ir.If(((ir.Bin("==", ir.Call("group_lane", (width,)), ir.IntLit(0)), store),)),
        ]
    return [
        ir.Assign(ir.Var(acc), ir.Call("warp_sum", (ir.Var(acc),))),
        ir.If(((ir.Bin("==", ir.Call("lane", ()), ir.IntLit(0)), store),)),
    ]


def one_store_per_part(
    env: LowerEnv, shared: set[str] | None = None, reduced: bool = False
) -> None:
    """On the GPU each part of the result is stored by one thread: threads that no GPU
    loop tells apart (the loops around the store, and ``shared``: those in the scope of
    the accumulator it stores; "lane": a GPUThread loop in a warp) hold the same value,
    and each would store it. ``reduced``: lane 0 alone stores a warp's sum."""
    if not env.inputs.gpu or block_size(env) <= 1:
        return
    units = set(env.flags.gpu_units) | (shared or set())
    lanes_apart = reduced or bool({Unit.GPUThread, "lane"} & units)
    warps_apart = bool({Unit.GPUThread, Unit.GPUWarp, "lane"} & units)
    if lanes_apart and warps_apart:
        return
    who = "every lane of a warp" if warps_apart else "every thread of a block"
    raise ScheduleError(
        f"the store into {env.inputs.lhs.name} runs outside the GPUThread loops, so {who} "
        "would do it; map the loops that bind "
        f"{', '.join(env.inputs.lhs.indices) or 'the output'} to GPUThread, or a loop of the "
        "sum inside the GPUWarp/GPUBlock loop to GPUThread with Atomics, or reduce with "
        "ParallelReduction on a GPUThread loop inside a GPUWarp loop"
    )


def block_size(env: LowerEnv) -> int:
    """Threads per block: the GPUThread loop's split factor (a warp loop's times the lanes
    of a warp), at most the target's largest block."""
    if not env.inputs.gpu or env.decided.plan is None:
        return 1
    plan = env.decided.plan
    warps = [v for v, p in plan.parallel.items() if p.unit == Unit.GPUWarp]
    threads = [v for v, p in plan.parallel.items() if p.unit == Unit.GPUThread]
    most, lanes = env.inputs.target.max_block, env.inputs.target.lanes
    if warps:
        return min(most, lanes * _factor_of(plan, warps[0], 8))
    if threads:
        return min(most, max(lanes, _factor_of(plan, threads[0], 256)))
    return 1


def _factor_of(plan: Plan, loop: str, default: int) -> int:
    """The split factor of an inner split piece (the extent of its loop), else ``default``."""
    piece = plan.pieces.get(loop)
    if piece is not None and not piece.outer and not piece.divide:
        return piece.factor
    return default


def flush_run(env: LowerEnv, run: SegmentSink) -> ir.Stmt:
    """Store a run's sum into its element, atomically (if a run has started)."""
    vals = env.flags.out_redirect or env.inputs.sig.array(env.inputs.lhs.name, "vals")
    store = ir.Assign(ir.Load(vals, ir.Var(run.at)), ir.Var(run.acc), "+=", atomic=True)
    return ir.If(((ir.Bin(">=", ir.Var(run.at), ir.IntLit(0)), ir.block(store)),))


def flush_runs(env: LowerEnv, run: SegmentSink, loop: str) -> list[ir.Stmt]:
    """Store a thread's last run after its serial loop over ``loop``. Where that loop is
    the piece of a split directly inside its sibling, a plain GPUThread loop (so a warp's
    lanes take consecutive iterations and every lane that runs one reaches the store;
    under plus_times), the lanes first combine their last runs: lanes next to each other
    whose runs hit one element (a row across their chunks) add them up by shuffles
    (`sc_segment_sum`, segmented by the element), and only each segment's first lane adds
    the sum atomically."""
    flush = flush_run(env, run)
    where = env.flags.thread_loop
    plan = env.decided.plan
    piece = plan.pieces.get(loop) if plan is not None else None
    if (
        where is None
        or plan is None
        or piece is None
        or piece.sibling != where[0]
        or plan.order.index(loop) != plan.order.index(where[0]) + 1
        or Unit.GPUWarp in env.flags.gpu_units
        or env.inputs.spec.semantics.semiring != "plus_times"
    ):
        return [flush]
    env.found.segmented = True
    _, var, trip = where
    lanes = (ir.Var(var), trip)
    head = env.inputs.namer.fresh(f"{run.acc}_head")
    total = ir.Call("segment_sum", (ir.Var(run.acc), ir.Var(run.at), *lanes))
    return [
        ir.Decl(ir.BOOL, head, ir.Call("segment_head", (ir.Var(run.at), *lanes))),
        ir.Assign(ir.Var(run.acc), total),
        ir.If(((ir.Var(head), ir.block(flush)),)),
    ]


def output_size(env: LowerEnv, skip: int = 0) -> ir.Expr:
    """The elements of a dense output below its first ``skip`` levels."""
    levels = level_indices(env.inputs.lhs, env.inputs.spec.output.format)[skip:]
    return dense_extent(env.inputs.sig.extent(var) for var in levels)


def zero_slice(env: LowerEnv, coord: ir.Expr) -> ir.Stmt:
    """Zero the output elements whose first-level coordinate is ``coord``."""
    env.found.zeroed_slices = True
    row = LevelNames(output_size(env, skip=1))
    vals = env.inputs.sig.array(env.inputs.spec.output.name, "vals")
    p = env.inputs.namer.fresh("p")
    at = Dense().locate_position(coord, ir.Var(p), row)
    store = ir.Assign(ir.Load(vals, at), ir.FloatLit(0.0))
    return ir.For(p, ir.IntLit(0), row.dim, ir.block(store))


# ---------------------------------------------------------------- epilogue
class OutputFrame(Protocol):
    """What opens the output before the loop nest and closes it after (a sparse output's
    `Assembler`, or `DenseFrame`)."""

    def opening(self) -> list[ir.Stmt]: ...

    def closing(self) -> list[ir.Stmt]: ...


class DenseFrame:
    """A dense output is zeroed up front unless every element is written exactly once,
    ``+=`` adds to the caller's values, the outermost loop zeroed its slices, or the GPU
    runtime zeroes it before the launch; nothing closes it."""

    def __init__(self, env: LowerEnv) -> None:
        self.env = env

    @property
    def zeroed(self) -> bool:
        env = self.env
        return (
            env.inputs.spec.statement.accumulate or env.inputs.exclusive or env.found.zeroed_slices
        )

    def opening(self) -> list[ir.Stmt]:
        env = self.env
        if self.zeroed or env.inputs.gpu:
            return []
        vals = env.inputs.sig.array(env.inputs.spec.output.name, "vals")
        p = env.inputs.namer.fresh("p")
        store = ir.Assign(ir.Load(vals, ir.Var(p)), ir.FloatLit(0.0))
        par = (
            ir.Parallel(Unit.CPUThread, "static")
            if env.inputs.threads_ok and env.inputs.lhs.order
            else None
        )
        return [
            ir.block(
                ir.Comment(f"zero the output {env.inputs.spec.output.name}"),
                ir.For(p, ir.IntLit(0), output_size(env), ir.block(store), par),
            )
        ]

    def closing(self) -> list[ir.Stmt]:
        return []


def epilogue(env: LowerEnv, frame: OutputFrame, nest: ir.Block) -> ir.Block:
    """The kernel, for every output alike: the schedule's entry checks, the output opened,
    the allocations of the schedule's workspaces, the loop nest, their release, and the
    output closed (a sparse output's counts or positions completed)."""
    opening = frame.opening()
    closing = frame.closing()
    return ir.block(
        *env.found.entry_checks, *opening, *env.found.top, nest, *env.found.bottom, *closing
    )
