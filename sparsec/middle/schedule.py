"""The schedule of one kernel, decided once by the middle end: the loop order the formats
need, the user's commands (and the default policy's) as a `Plan` over it, the output level
scattered into a workspace, the statement lowered as a sequence of nests, and a dense
precompute's placement. Every user command it refuses is refused here, before lowering.

`make_schedule` computes the frozen `Schedule`; `lower.lower` takes it as an input and
decides none of it again (it only names the plan's new loop variables and allocates).
The pipeline computes one per candidate schedule and shares it among the lowerings of
one kernel (counted, filled; a dense output's second pass). `natural_loops`,
`loop_nest` and `every_loop` answer the loop order without lowering anything."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..base.errors import LoweringError, ScheduleError
from ..base.target import C, Target
from ..frontend.concrete import CExpr, Sum, accesses, children
from ..frontend.notation import Access, factors
from ..tensors.layout import OutputLayout
from .commands import Command
from .order import Edge, OrderConflict, check_order, edges, level_indices, loop_order, output_edges
from .placement import Placement, place
from .plan import Plan, Space, make_plan
from .spec import Spec
from .steps import SHARED_COMMANDS, split_terms, step_order


class RowsOutOfOrder(LoweringError):
    """A rowwise sparse output's single-pass kernel cannot append its rows in storage
    order: the inputs force its dense levels into another order. Its two phases count
    and fill the rows in any order, so the runtime uses those."""


@dataclass(frozen=True, slots=True)
class Schedule:
    """One kernel's schedule: what `lower` runs, decided from the statement, the commands
    and the facts of the output's layout (`OutputLayout`), never from a lowering."""

    #: the top-level loops, outermost first (the plan's loops when there is a plan)
    order: tuple[str, ...]
    #: the whole schedule: the user's commands and the default policy's
    commands: tuple[Command, ...] = ()
    #: what it is scheduled for (`sparsec.base.target`: OpenMP loops, or GPU loops)
    target: Target = C
    #: the commands as a plan over the loop order (None: no commands)
    plan: Plan | None = None
    #: the output's last-level variable, scattered into a dense workspace (Gustavson)
    workspace: str | None = None
    #: the statement lowered as a sequence of nests inside ``order`` (its shared loops),
    #: in words; "": one fused nest
    sequence: str = ""
    #: a dense output's precompute, placed in the loops
    placement: Placement | None = None
    #: a sparse output's rows are visited in storage order (False: rows counted and
    #: filled independently, `OutputLayout.rowwise`, outside the single pass)
    rows_in_order: bool = True


def make_schedule(
    spec: Spec, commands: tuple[Command, ...] = (), *, append: bool = False, target: Target = C
) -> Schedule:
    """The schedule of ``spec`` under ``commands`` on ``target``; ``append``: for a sparse
    output's single-pass kernel, which appends its rows in storage order (raises
    `RowsOutOfOrder` where the inputs rule that out). Refuses what the commands cannot
    do with `ScheduleError`, and a statement with no loop order with `LoweringError`."""
    fmt = spec.output.format
    layout = None if fmt.is_dense else OutputLayout.of(fmt, spec.output.name)
    # rows counted and filled independently may be visited in any order of their levels
    in_order = layout is None or not layout.rowwise or append
    facts = _Facts(spec, commands, target, layout, in_order)
    found = _scheduled(facts)
    if target.gpu:
        _gpu_support(facts, found.plan)
    return found


@dataclass(frozen=True, slots=True)
class _Facts:
    """What the schedule is computed from."""

    spec: Spec
    commands: tuple[Command, ...]
    target: Target
    #: a sparse output's layout (None: a dense output)
    layout: OutputLayout | None
    rows_in_order: bool

    @property
    def gpu(self) -> bool:
        return self.target.gpu

    def schedule(
        self,
        order: tuple[str, ...],
        plan: Plan | None = None,
        workspace: str | None = None,
        sequence: str = "",
        placement: Placement | None = None,
    ) -> Schedule:
        return Schedule(
            order,
            self.commands,
            self.target,
            plan,
            workspace,
            sequence,
            placement,
            self.rows_in_order,
        )


def _scheduled(f: _Facts) -> Schedule:
    """The loop order the formats need, under the commands' plan when there are any."""
    spec = f.spec
    stmt = spec.statement
    lhs = stmt.lhs
    everything = [lhs, *accesses(stmt.rhs)]
    fmt = spec.output.format
    extra = output_edges(lhs, fmt, stmt.top_sums, rows_in_order=f.rows_in_order)
    try:
        order, extra, workspace = _loop_order(f, everything, extra)
    except LoweringError:
        # no fused order: sums under +/- may still run as a sequence of nests
        shared = _sequence(f)
        if shared is not None:
            return shared
        if f.layout is None or not f.layout.rowwise or not f.rows_in_order:
            raise
        # the single pass appends rows in storage order, which the inputs rule out
        _loop_order(f, everything, output_edges(lhs, fmt, stmt.top_sums, False))
        raise RowsOutOfOrder(
            f"the inputs visit the rows of {lhs.name} ({fmt}) out of storage order"
        ) from None
    if not f.commands:
        return f.schedule(order, workspace=workspace)
    return _apply_schedule(f, order, everything, extra, workspace)


def _loop_order(
    f: _Facts, everything: list[Access], extra: tuple[Edge, ...]
) -> tuple[tuple[str, ...], tuple[Edge, ...], str | None]:
    """The loop order, the output's edges it keeps, and the output's last-level variable
    when that level is scattered into a workspace."""
    spec = f.spec
    loop_indices = spec.statement.loop_indices
    if not _forced_workspace(f):
        try:
            return loop_order(loop_indices, everything, spec.formats, extra=extra), extra, None
        except LoweringError:
            if f.layout is None or not f.layout.can_scatter:
                raise
    # the last output level cannot come before the reductions (or the schedule asks
    # for a workspace): scatter it into a dense workspace and append the row
    # afterwards (Gustavson's SpGEMM)
    assert f.layout is not None
    ws = level_indices(spec.statement.lhs, spec.output.format)[f.layout.last]
    extra = tuple(e for e in extra if ws not in (e.before, e.after))
    return loop_order(loop_indices, everything, spec.formats, extra=extra), extra, ws


def _forced_workspace(f: _Facts) -> bool:
    """A sparse output whose schedule asks for a workspace (precompute, Insert)."""
    if f.layout is None:
        return False
    for c in f.commands:
        if c.name == "precompute" or (c.name == "assemble" and c.args[1] == "Insert"):
            if not f.layout.can_scatter:
                raise ScheduleError(
                    f"{c}: the output {f.spec.statement.lhs.name} ({f.spec.output.format}) "
                    "cannot be filled through a workspace: that needs a unique compressed "
                    "last level with no level below it (e.g. csr)"
                )
            return True
    return False


def _apply_schedule(
    f: _Facts,
    order: tuple[str, ...],
    everything: list[Access],
    extra: tuple[Edge, ...],
    workspace: str | None,
) -> Schedule:
    """The commands as a plan over the default ``order``, checked against the order the
    formats need."""
    spec = f.spec
    stmt = spec.statement
    lhs = stmt.lhs
    formats = spec.formats
    nested = tuple(i for i in spec.indices if i not in stmt.loop_indices)
    levels: dict[str, list[tuple[str, ...]]] = {}
    for a in dict.fromkeys(accesses(stmt.rhs)):
        levels.setdefault(a.name, []).append(level_indices(a, formats[a.name]))
    plan = make_plan(
        f.commands,
        order,
        indices=spec.indices,
        nested=nested,
        tensors={t.name: t.order for t in spec.tensors},
        output=lhs.name,
        tensor_levels=levels,
    )
    hard, _ = edges(everything, formats, set(stmt.loop_indices), set())
    hard += [e for e in extra if e.before in stmt.loop_indices and e.after in stmt.loop_indices]
    check_order(plan, hard, {t.name: str(t.format) for t in spec.tensors})
    placement = None
    if f.layout is not None:
        _check_sparse_schedule(f, plan, workspace)
    elif plan.precompute:
        placement = place(spec, plan, plan.precompute[0], tuple(plan.order))
    for command in f.commands:
        if command.name != "assemble":
            continue
        if f.layout is None:
            raise ScheduleError(
                f"{command}: the output {lhs.name} is dense; assemble applies to sparse outputs"
            )
        if command.args[1] == "Append" and workspace is not None:
            raise ScheduleError(
                f"{command}: {lhs.name}'s last level ({workspace}) is reduced "
                f"over after its loop, so its entries cannot be appended in order; "
                f"use assemble({lhs.name},Insert) (a workspace)"
            )
    return f.schedule(tuple(plan.order), plan=plan, workspace=workspace, placement=placement)


def pos_access(spec: Spec, space: Space) -> Access:
    """The access whose positions a position space iterates."""
    found = [a for a in dict.fromkeys(accesses(spec.statement.rhs)) if a.name == space.tensor]
    assert len(found) == 1, found
    return found[0]


def _distinct_rows(spec: Spec, space: Space, rows: set[str]) -> bool:
    """A position space over one row variable of a rowwise sparse output at a level whose
    coordinates are unique (with unique levels above it): each position is its own row
    (DCSR's rows), so threads count and fill them independently."""
    if space.kind != "pos" or len(space.vars) != 1 or not set(space.vars) <= rows:
        return False
    access = pos_access(spec, space)
    fmt = spec.formats[access.name]
    k = level_indices(access, fmt).index(space.vars[0])
    return all(level.unique for level in fmt.levels[: k + 1])


def _check_sparse_schedule(f: _Facts, plan: Plan, workspace: str | None) -> None:
    """Sparse outputs are appended in order: only order-keeping commands apply."""
    spec = f.spec
    lhs = spec.statement.lhs
    layout = f.layout
    assert layout is not None
    if f.gpu:
        _gpu_sparse_output(f)
    rowwise = layout.rowwise and not f.rows_in_order
    rows = set(level_indices(lhs, spec.output.format)[: layout.dense_prefix]) if rowwise else set()
    for space in plan.spaces.values():
        if f.gpu and space.kind == "dense" and set(space.vars) <= rows:
            continue  # rows are counted and filled independently: GPU threads split them
        if f.gpu and _distinct_rows(spec, space, rows):
            continue  # a position per row: threads split the rows as above
        if f.gpu and space.kind == "pos" and set(space.vars) <= rows:
            name = pos_access(spec, space).name
            raise ScheduleError(
                f"{space.origin}: {name}'s positions over {space.vars[0]} are not one per "
                f"row (its level is not unique, as COO's rows are not): each row of the "
                f"sparse output {lhs.name} is filled by one GPU thread, so store {name} "
                "with unique row levels (csr, dcsr: Tensor.to_format), or use target='c'"
            )
        if set(space.vars) & set(lhs.indices):
            raise ScheduleError(
                f"{space.origin}: the output {lhs.name} is sparse "
                f"({spec.output.format}) and is appended in loop order; split, "
                "divide, pos, fuse and bound apply to its reduction loops only (for "
                "example k in A(i,j) = B(i,j) * C(i,k) * D(k,j))"
            )
    rhs = spec.statement.rhs
    for pre in plan.precompute:
        want = sorted(map(str, factors(rhs)))
        got = sorted(map(str, factors(pre.expr)))
        whole = got == want if want else pre.expr == rhs  # a sum: the whole of it
        if not whole or pre.var != workspace:
            raise ScheduleError(
                f"{pre.origin}: for the sparse output {lhs.name}, precompute takes the "
                f"whole right-hand side over its last level: precompute("
                f"{rhs},{workspace},{pre.workspace})"
            )


def _gpu_support(f: _Facts, plan: Plan | None) -> None:
    """What the CUDA target cannot map (yet), refused before any code exists."""
    _gpu_sparse_output(f)
    if plan is None or not any(p.unit.gpu for p in plan.parallel.values()):
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


def _gpu_sparse_output(f: _Facts) -> None:
    """A sparse output on the GPU: rows counted and filled independently (csr-like, no
    workspace), else refused."""
    if f.layout is not None and (not f.layout.rowwise or f.rows_in_order):
        raise ScheduleError(
            f"the output {f.spec.statement.lhs.name} is sparse ({f.spec.output.format}), "
            "assembled in one sequence; such sparse outputs have no GPU mapping yet (rows "
            "counted and filled independently, e.g. csr, do): use target='c', or a dense "
            "output"
        )


def _sequence(f: _Facts) -> Schedule | None:
    """The statement lowered as a sequence (`lower.sequence`), or None when it is not one
    (a lifted sum over the whole right-hand side, no sum under ``+``/``-``, a step with no
    order of its own, or a sparse output that cannot take it): its shared loops, under the
    commands' plan.

    A sparse output takes a sequence when its last level can be scattered into a dense
    workspace (`OutputLayout.can_scatter`, e.g. csr) and the shared loops are its levels
    above the last, in storage order: per row the steps scatter into the workspace, which
    is gathered into the row once (Gustavson's SpGEMM, the initialisation first). Its
    counting and filling phases lower the same steps, so they agree on the pattern."""
    spec = f.spec
    stmt = spec.statement
    lhs = stmt.lhs
    if stmt.top_sums or (f.layout is not None and not f.layout.can_scatter):
        return None
    steps = split_terms(stmt.rhs)
    if not steps.contractions:
        return None
    free = lhs.indices
    parts: list[CExpr] = list(steps.contractions)
    if steps.init is not None:
        parts.append(steps.init)
    try:
        orders = [step_order(spec, free, part, ()) for part in parts]
    except LoweringError:
        return None
    shared: list[str] = []
    for column in zip(*orders, strict=False):
        if len(set(column)) != 1 or column[0] not in free:
            break
        shared.append(column[0])
    order = tuple(shared)
    into = ""
    workspace = None
    if f.layout is not None:
        rows = level_indices(lhs, spec.output.format)
        if order != rows[:-1]:
            return None
        workspace = rows[-1]
        into = f"; per row a dense workspace over {rows[-1]}, gathered into the row"
    op = "+=" if stmt.accumulate else "="
    first = f"{lhs.name} {op} {steps.init if steps.init is not None else 0}"
    then = "".join(f", then {lhs.name} += {s}" for s in steps.contractions)
    loops = f"in the loop{'s' if len(order) > 1 else ''} over {', '.join(order)}"
    words = (
        f"lowered as a sequence {loops if order else 'of loop nests'}: {first}{then}, "
        f"each in its own loop order{into}"
    )
    if not f.commands:
        return f.schedule(order, workspace=workspace, sequence=words)
    plan = _schedule_shared(f, order)
    return f.schedule(tuple(plan.order), plan=plan, workspace=workspace, sequence=words)


def _schedule_shared(f: _Facts, order: tuple[str, ...]) -> Plan:
    """The schedule applies to the shared loops only (split, divide and parallelize
    there): each step's loops are the step's own."""
    spec = f.spec
    for command in f.commands:
        if command.name not in SHARED_COMMANDS:
            raise ScheduleError(
                f"{command}: {spec.statement.lhs} is lowered as a sequence of loop nests "
                "(its sums under +/- each run in their own loop order); a schedule applies "
                f"to the loops the steps share ({', '.join(order) or 'none'}), with "
                f"{', '.join(sorted(SHARED_COMMANDS))} only"
            )
    return make_plan(
        f.commands,
        order,
        indices=spec.indices,
        nested=(),
        tensors={t.name: t.order for t in spec.tensors},
        output=spec.statement.lhs.name,
        tensor_levels={},
    )


# ---------------------------------------------------------------- loop orders


def loop_nest(spec: Spec, commands: tuple[Command, ...] = ()) -> tuple[str, ...]:
    """The loops `lower` runs for ``spec`` under ``commands``, outermost first: the
    default policy names its loops from it."""
    return make_schedule(spec, commands).order


def natural_loops(spec: Spec) -> tuple[str, ...]:
    """The loops the lowering runs for ``spec`` with no schedule; raises
    `middle.order.OrderConflict` where no loop order fits (`middle.derive`'s question)."""
    return loop_nest(spec)


def every_loop(spec: Spec, lower_serially: Callable[[Spec], object]) -> tuple[str, ...]:
    """The loops of `natural_loops`, then each nested sum's loops as the lowerer orders
    them (`loop_order` inside the loops around it): a sum kept under a function, a
    division or a ``+`` (``a = cos(Σ B(i,j) * C(i,j))``) runs its own nest, whose reads'
    level orders must fit too. It is `middle.derive`'s probe: a re-layout takes its order
    from these loops. Where a nested sum fits no order inside the outer loops,
    ``lower_serially(spec)`` says whether the statement lowers all the same (a sum
    lowered as a sequence of whole nests does): its `OrderConflict` is the answer."""
    found = list(natural_loops(spec))
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
        lower_serially(spec)
    return tuple(found)
