"""One kernel's lowering, start to end: the loop order, the user's schedule as a plan
(and what the targets cannot map), the loop nest (`lowerer.loops`), and the one
epilogue every output shares (`output.epilogue`). `lower` runs it once or twice."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..abi import BOUND_VIOLATED, Namer, Signature, signature
from ..errors import LoweringError, ScheduleError
from ..frontend.concrete import CExpr, Sum, accesses, children
from ..frontend.notation import Access, factors
from ..ir import nodes as ir
from ..middle.commands import GPU_UNITS, Command
from ..middle.order import (
    Edge,
    OrderConflict,
    check_order,
    edges,
    level_indices,
    loop_order,
    output_edges,
)
from ..middle.plan import Plan, Space, make_plan
from ..middle.spec import Spec
from ..target import C, Target
from .chunks import ChunkFrame
from .ctx import Ctx, OutputSink
from .env import LowerEnv
from .levels import locate
from .lowerer import loops, scatter_gather
from .output import DenseFrame, OutputFrame, block_size, epilogue
from .positions import pos_access
from .semiring import apply as apply_semiring
from .sequence import sequence_order
from .where import plan_where


class RowsOutOfOrder(LoweringError):
    """A rowwise sparse output's single-pass kernel cannot append its rows in storage
    order: the inputs force its dense levels into another order. Its two phases count
    and fill the rows in any order, so the runtime uses those."""


@dataclass(frozen=True, slots=True)
class LoweredKernel:
    body: ir.Block
    loop_order: tuple[str, ...]
    #: loops that run on CPU threads, by index variable
    parallel_loops: tuple[str, ...] = ()
    #: every output element is written exactly once (no zeroing; ``=`` stores)
    exclusive: bool = False
    #: no output element is written twice (zeroed first, then ``=`` stores)
    once: bool = False
    #: how each parallel loop runs, in words (header comment and `Kernel.schedule`)
    notes: tuple[str, ...] = ()
    #: what each `bound` promises (the kernel returns BOUND_VIOLATED when one fails)
    bounds: tuple[str, ...] = ()
    #: CUDA: the output must be zeroed before the launch (the kernel only adds into it)
    zero_before: bool = False
    #: CUDA: the grid (trip count of the GPUBlock loop) and the threads per block
    grid: ir.Expr | None = None
    block: int = 1
    #: CUDA: the kernel reduces across a warp's lanes with shuffles
    shuffles: bool = False
    #: CUDA: lanes reduce in groups smaller than a warp (the template's group shuffles)
    groups: bool = False
    #: CUDA: a warp's lanes combine their runs of atomic stores (`output.flush_runs`)
    segments: bool = False
    #: the statement lowered as a sequence of loop nests, in words ("": one fused nest)
    sequence: str = ""
    #: a single pass lowered to run in chunks of rows: what `chunks.wrap` needs
    chunks: ChunkFrame | None = None
    #: CUDA: the workspace's elements per thread, by role (`abi.GPU_WORKSPACE`)
    scratch: tuple[tuple[str, ir.Expr], ...] = ()


def lower_kernel(env: LowerEnv) -> LoweredKernel:
    """The kernel of ``env``'s statement."""
    stmt = env.spec.statement
    lhs = env.lhs
    asm = env.assembler
    order = _scheduled_order(env)
    if env.gpu:
        _gpu_support(env)
    frame: OutputFrame = asm if asm is not None else DenseFrame(env)
    if asm is not None:
        asm.workspace_alloc(env.workspace, env.gpu)
    env.zero_in_loop = (
        asm is None
        and not env.gpu
        and not stmt.accumulate
        and not env.exclusive
        and lhs.order > 0
        and bool(order)
        and order[0] == level_indices(lhs, env.spec.output.format)[0]
    )
    located, ctx = locate(env, Ctx(), [lhs])
    if asm is not None and env.workspace and asm.layout.last == 0:
        body = scatter_gather(env, order, stmt.rhs, ctx)
    else:
        body = loops(env, order, stmt.rhs, ctx, OutputSink(), outermost=True)
    # a semiring other than plus_times: every accumulation and its start follow its add
    kernel = apply_semiring(env.ring, epilogue(env, frame, ir.block(located, body)))
    sites = env.write_sites
    return LoweredKernel(
        kernel,
        order,
        tuple(env.parallel_loops),
        bool(sites) and all(sites) and not stmt.accumulate,
        bool(sites) and not (env.repeats or stmt.accumulate or env.sequence or env.gpu),
        tuple(env.notes),
        tuple(env.bound_messages),
        zero_before=env.gpu and isinstance(frame, DenseFrame) and not frame.zeroed,
        grid=env.grid,
        block=block_size(env),
        shuffles=bool(env.warp_reduced) or env.segmented,
        groups=bool(env.group_reduced),
        segments=env.segmented,
        sequence=env.sequence,
        scratch=_scratch(env),
        chunks=asm.chunk_frame() if asm is not None else None,
    )


def _scratch(env: LowerEnv) -> tuple[tuple[str, ir.Expr], ...]:
    """A GPU kernel's workspace slices: elements per thread, by role."""
    ws = env.assembler.ws if env.gpu and env.assembler is not None else None
    if ws is None:
        return ()
    roles = {ws.w: "vals", ws.seen: "seen", ws.reached: "list"}
    return tuple((roles[name], count) for name, count in ws.strides)


def loop_nest(
    spec: Spec,
    make_names: Callable[[], tuple[Signature, Namer]],
    commands: tuple[Command, ...] = (),
) -> tuple[str, ...]:
    """The loops `lower` runs for ``spec`` under ``commands``, outermost first, found
    without lowering the nest: the default policy names its loops from it."""
    sig, namer = make_names()
    return _scheduled_order(LowerEnv(spec, sig, namer, commands=commands))


def names_for(spec: Spec) -> Callable[[], tuple[Signature, Namer]]:
    """A fresh ABI signature and name supply for each lowering of ``spec``."""

    def make_names() -> tuple[Signature, Namer]:
        namer = Namer()
        return signature(spec, namer), namer

    return make_names


def every_loop(spec: Spec) -> tuple[str, ...]:
    """The loops of `loop_nest` for ``spec`` with no schedule, then each nested sum's loops
    as the lowerer orders them (`loop_order` inside the loops around it): a sum kept under a
    function, a division or a ``+`` (``a = cos(Σ B(i,j) * C(i,j))``) runs its own nest, whose
    reads' level orders must fit too. It is `middle.derive`'s probe: a re-layout takes its
    order from these loops. Where a nested sum fits no order inside the outer loops, a
    serial lowering says whether the statement lowers all the same (a sum lowered as a
    sequence of whole nests does): its `OrderConflict` is the answer."""

    make_names = names_for(spec)
    found = list(loop_nest(spec, make_names))
    formats = spec.formats

    def walk(expr: CExpr, outer: tuple[str, ...]) -> None:
        if isinstance(expr, Sum):
            order = loop_order(expr.indices, list(accesses(expr.body)), formats, outer)
            found.extend(order)
            outer = outer + order
        for child in children(expr):
            walk(child, outer)

    try:
        walk(spec.statement.rhs, tuple(found))
    except OrderConflict:
        lower(spec, make_names, parallel=False)
    return tuple(found)


def _scheduled_order(env: LowerEnv) -> tuple[str, ...]:
    """The loop order the formats need, under the schedule's plan when there is one
    (sets `LowerEnv.plan`, and `workspace` for a scattered output level)."""
    stmt = env.spec.statement
    lhs = env.lhs
    everything = [lhs, *accesses(stmt.rhs)]
    asm = env.assembler
    fmt = env.spec.output.format
    # rows counted and filled independently may be visited in any order of their levels
    in_order = asm is None or not asm.rowwise
    extra = output_edges(lhs, fmt, stmt.top_sums, rows_in_order=in_order)
    try:
        order, extra = _loop_order(env, everything, extra)
    except LoweringError:
        # no fused order: sums under +/- may still run as a sequence of nests
        shared = sequence_order(env)
        if shared is not None:
            return shared
        if asm is None or not asm.layout.rowwise or asm.rowwise:
            raise
        # the single pass appends rows in storage order, which the inputs rule out
        _loop_order(env, everything, output_edges(lhs, fmt, stmt.top_sums, False))
        raise RowsOutOfOrder(
            f"the inputs visit the rows of {lhs.name} ({fmt}) out of storage order"
        ) from None
    if env.commands:
        order = _apply_schedule(env, order, everything, extra)
    return order


def _loop_order(
    env: LowerEnv, everything: list[Access], extra: tuple[Edge, ...]
) -> tuple[tuple[str, ...], tuple[Edge, ...]]:
    """The loop order and the output's edges it keeps; sets `workspace` when the
    output's last level is scattered into one."""
    stmt = env.spec.statement
    asm = env.assembler
    if not _forced_workspace(env):
        try:
            return loop_order(stmt.loop_indices, everything, env.formats, extra=extra), extra
        except LoweringError:
            if asm is None or not asm.can_scatter():
                raise
    # the last output level cannot come before the reductions (or the schedule asks
    # for a workspace): scatter it into a dense workspace and append the row
    # afterwards (Gustavson's SpGEMM)
    assert asm is not None
    ws = asm.vars[asm.layout.last]
    extra = tuple(e for e in extra if ws not in (e.before, e.after))
    order = loop_order(stmt.loop_indices, everything, env.formats, extra=extra)
    env.workspace = ws
    return order, extra


def _gpu_support(env: LowerEnv) -> None:
    """What the CUDA target cannot map (yet), refused before any code exists."""
    _gpu_sparse_output(env)
    plan = env.plan
    if plan is None or not any(p.unit in GPU_UNITS for p in plan.parallel.values()):
        raise ScheduleError(
            "the CUDA target needs a GPU mapping: parallelize a loop with GPUBlock "
            "(and GPUThread inside it)"
        )
    for space in plan.spaces.values():
        if space.bound is not None:
            raise ScheduleError(f"{space.origin}: bound is supported on the C target only")
    for pre in plan.precompute:
        raise ScheduleError(
            f"{pre.origin}: workspaces (precompute) are supported on the C target only"
        )


def _gpu_sparse_output(env: LowerEnv) -> None:
    """A sparse output on the GPU: rows counted and filled independently (csr-like, no
    workspace), else refused."""
    asm = env.assembler
    if asm is not None and not asm.rowwise:
        raise ScheduleError(
            f"the output {env.lhs.name} is sparse ({env.spec.output.format}), assembled "
            "in one sequence; such sparse outputs have no GPU mapping yet (rows counted and "
            "filled independently, e.g. csr, do): use target='c', or a dense output"
        )


def _forced_workspace(env: LowerEnv) -> bool:
    """A sparse output whose schedule asks for a workspace (precompute, Insert)."""
    if env.assembler is None:
        return False
    for c in env.commands:
        if c.name == "precompute" or (c.name == "assemble" and c.args[1] == "Insert"):
            if not env.assembler.can_scatter():
                raise ScheduleError(
                    f"{c}: the output {env.lhs.name} ({env.spec.output.format}) cannot be "
                    "filled through a workspace: that needs a unique compressed last level "
                    "with no level below it (e.g. csr)"
                )
            return True
    return False


def _apply_schedule(
    env: LowerEnv, order: tuple[str, ...], everything: list[Access], extra: tuple[Edge, ...]
) -> tuple[str, ...]:
    """The user's commands as a plan over the default ``order``, checked against the
    order the formats need; returns the scheduled loop order."""
    stmt = env.spec.statement
    lhs = env.lhs
    nested = tuple(i for i in env.spec.indices if i not in stmt.loop_indices)
    levels: dict[str, list[tuple[str, ...]]] = {}
    for a in dict.fromkeys(accesses(stmt.rhs)):
        levels.setdefault(a.name, []).append(level_indices(a, env.formats[a.name]))
    plan = make_plan(
        env.commands,
        order,
        indices=env.spec.indices,
        nested=nested,
        tensors={t.name: t.order for t in env.spec.tensors},
        output=lhs.name,
        tensor_levels=levels,
    )
    hard, _ = edges(everything, env.formats, set(stmt.loop_indices), set())
    hard += [e for e in extra if e.before in stmt.loop_indices and e.after in stmt.loop_indices]
    check_order(plan, hard, {t.name: str(t.format) for t in env.spec.tensors})
    env.plan = plan
    for v in plan.order:
        if v not in env.var_names:
            env.var_names[v] = env.namer.fresh(v)
    for space in plan.spaces.values():
        if space.bound is not None:
            _bound_check(env, space)
    if env.assembler is not None:
        _check_sparse_schedule(env, plan)
    elif plan.precompute:
        env.where = plan_where(env, plan.precompute[0], tuple(plan.order))
    for command in env.commands:
        if command.name != "assemble":
            continue
        if env.assembler is None:
            raise ScheduleError(
                f"{command}: the output {lhs.name} is dense; assemble applies to sparse outputs"
            )
        if command.args[1] == "Append" and env.workspace is not None:
            raise ScheduleError(
                f"{command}: {lhs.name}'s last level ({env.workspace}) is reduced "
                f"over after its loop, so its entries cannot be appended in order; "
                f"use assemble({lhs.name},Insert) (a workspace)"
            )
    return tuple(plan.order)


def _distinct_rows(env: LowerEnv, space: Space, rows: set[str]) -> bool:
    """A position space over one row variable of a rowwise sparse output at a level whose
    coordinates are unique (with unique levels above it): each position is its own row
    (DCSR's rows), so threads count and fill them independently."""
    if space.kind != "pos" or len(space.vars) != 1 or not set(space.vars) <= rows:
        return False
    access = pos_access(env, space)
    fmt = env.formats[access.name]
    k = level_indices(access, fmt).index(space.vars[0])
    return all(level.unique for level in fmt.levels[: k + 1])


def _check_sparse_schedule(env: LowerEnv, plan: Plan) -> None:
    """Sparse outputs are appended in order: only order-keeping commands apply."""
    lhs = env.lhs
    asm = env.assembler
    assert asm is not None
    if env.gpu:
        _gpu_sparse_output(env)
    rows = set(asm.vars[: asm.layout.dense_prefix]) if asm.rowwise else set()
    for space in plan.spaces.values():
        if env.gpu and space.kind == "dense" and set(space.vars) <= rows:
            continue  # rows are counted and filled independently: GPU threads split them
        if env.gpu and _distinct_rows(env, space, rows):
            continue  # a position per row: threads split the rows as above
        if env.gpu and space.kind == "pos" and set(space.vars) <= rows:
            name = pos_access(env, space).name
            raise ScheduleError(
                f"{space.origin}: {name}'s positions over {space.vars[0]} are not one per "
                f"row (its level is not unique, as COO's rows are not): each row of the "
                f"sparse output {lhs.name} is filled by one GPU thread, so store {name} "
                "with unique row levels (csr, dcsr: Tensor.to_format), or use target='c'"
            )
        if set(space.vars) & set(lhs.indices):
            raise ScheduleError(
                f"{space.origin}: the output {lhs.name} is sparse "
                f"({env.spec.output.format}) and is appended in loop order; split, "
                "divide, pos, fuse and bound apply to its reduction loops only (for "
                "example k in A(i,j) = B(i,j) * C(i,k) * D(k,j))"
            )
    rhs = env.spec.statement.rhs
    for pre in plan.precompute:
        want = sorted(map(str, factors(rhs)))
        got = sorted(map(str, factors(pre.expr)))
        whole = got == want if want else pre.expr == rhs  # a sum: the whole of it
        if not whole or pre.var != env.workspace:
            raise ScheduleError(
                f"{pre.origin}: for the sparse output {lhs.name}, precompute takes the "
                f"whole right-hand side over its last level: precompute("
                f"{rhs},{env.workspace},{pre.workspace})"
            )


def _bound_check(env: LowerEnv, space: Space) -> None:
    """`bound` promises an extent: the kernel returns a status when it does not hold."""
    assert space.bound is not None
    size, kind = space.bound
    (var,) = space.vars
    dim = ir.Var(env.sig.dim(var))
    bad = ir.Bin("!=" if kind == "MaxExact" else ">", dim, ir.IntLit(size))
    env.entry_checks.append(ir.Return(BOUND_VIOLATED, bad))
    env.bound_messages.append(
        f"{space.origin}: the extent of {var} must be "
        f"{'exactly' if kind == 'MaxExact' else 'at most'} {size}"
    )


def lower(
    spec: Spec,
    make_names: Callable[[], tuple[Signature, Namer]],
    *,
    parallel: bool = True,
    counting: bool = False,
    append: bool = False,
    chunked: bool = False,
    commands: tuple[Command, ...] = (),
    target: Target = C,
) -> tuple[LoweredKernel, Signature]:
    """Lower ``spec``; a second pass stores with ``=`` when no element is written twice
    (the loops around each write bind exactly the output's indices), and drops the output
    zeroing when every element is written exactly once (plain dense loops over them all).

    ``make_names()`` returns a fresh ``(Signature, Namer)``, so both passes name alike.
    ``counting`` lowers the assemble kernel of a sparse output (sizes only); ``append``
    its single-pass kernel (serial, appending into arrays of a proven capacity, even where
    the two-phase kernel fills rows in parallel; ``chunked``: in chunks of rows, see
    `chunks`); ``commands`` is the whole schedule, the
    user's commands and the default policy's (`policy.schedules.cpu_default`): with none,
    every loop is serial.
    """
    sig, namer = make_names()
    options: dict[str, Any] = {"parallel": parallel, "commands": commands, "target": target}
    if not spec.output.format.is_dense:
        env = LowerEnv(
            spec, sig, namer, counting=counting, append=append, chunked=chunked, **options
        )
        return lower_kernel(env), sig
    first = lower_kernel(LowerEnv(spec, sig, namer, **options))
    if not (first.exclusive or first.once):
        return first, sig
    sig, namer = make_names()
    # every element written once: no zeroing, ``=``; at most once: zeroing, ``=``
    again = LowerEnv(spec, sig, namer, exclusive=first.exclusive, once=True, **options)
    return lower_kernel(again), sig
