"""Iteration graph: a loop order consistent with every tensor's level order.

A level that iterates positions (compressed, singleton) can only be entered once the
positions of all levels above it are known, so its variable must come after theirs:
these are *hard* edges. Dense levels are located and add no hard edge; their level order,
and the output's, are *soft* edges that the greedy topological sort follows where it can
(row-major traversal of dense operands). Ties go to first appearance.

When no order exists the error names the tensor and a format that works: the same levels
in another mode ordering when one exists (checked against every read of the tensor), or,
for a tensor read in two mode orders (``B(i,j) * B(j,i)``), a transposed copy under a
second name or a dense format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..base.errors import LoweringError, ScheduleError
from ..frontend.notation import Access
from ..tensors.formats import Format
from .plan import Plan


class OrderConflict(LoweringError):
    """No loop order fits every tensor's level order (`loop_order`): the one refusal that
    a re-layout of some inputs (`sparsec.middle.derive.fit`) can cure."""


@dataclass(frozen=True, slots=True)
class Edge:
    before: str
    after: str
    tensor: str
    #: the read of ``tensor`` that makes the edge (None for the output's assembly order)
    access: Access | None = field(default=None, compare=False)


def level_indices(access: Access, fmt: Format) -> tuple[str, ...]:
    """The index variable of each storage level of ``access``."""
    return tuple(access.indices[mode] for mode in fmt.ordering)


def edges(
    accesses: list[Access], formats: dict[str, Format], scope: set[str], outer: set[str]
) -> tuple[list[Edge], list[Edge]]:
    """Hard and soft edges among ``scope`` for loops nested inside ``outer``."""
    hard: list[Edge] = []
    soft: list[Edge] = []
    for access in accesses:
        fmt = formats[access.name]
        levels = level_indices(access, fmt)
        for k, var in enumerate(levels):
            if var not in scope:
                continue
            for m in range(k):
                above = levels[m]
                if above in outer:
                    continue
                iterated = fmt.levels[k].position_iteration
                if above not in scope:
                    if iterated:
                        raise _inner_before_outer(access, fmt, above, var, scope, outer)
                    continue
                if iterated:
                    hard.append(Edge(above, var, access.name, access))
                elif m == k - 1:
                    soft.append(Edge(above, var, access.name, access))
    return hard, soft


def topological(
    scope: tuple[str, ...], hard: list[Edge], soft: list[Edge]
) -> tuple[str, ...] | None:
    """Greedy order: ready variables first, fewest pending soft predecessors, then first use."""
    placed: list[str] = []
    left = list(scope)
    while left:
        ready = [v for v in left if all(e.before in placed for e in hard if e.after == v)]
        if not ready:
            return None
        best = min(
            ready,
            key=lambda v: (
                sum(1 for e in soft if e.after == v and e.before not in placed),
                scope.index(v),
            ),
        )
        placed.append(best)
        left.remove(best)
    return tuple(placed)


def loop_order(
    scope: tuple[str, ...],
    accesses: list[Access],
    formats: dict[str, Format],
    outer: tuple[str, ...] = (),
    extra: tuple[Edge, ...] = (),
) -> tuple[str, ...]:
    """Order the variables ``scope`` of one loop nest placed inside loops ``outer``.

    ``extra`` are further hard edges (a sparse output's assembly order).

    A pure function of its arguments, asked the same question by each lowering of one
    kernel (the CPU default's, the numeric, the counting and the single-pass ones): orders
    found are remembered (`_ORDERS`); a conflict is worked out again, so each caller gets
    its own error.
    """
    key = (
        scope,
        tuple(accesses),
        tuple((a.name, formats[a.name]) for a in accesses),
        outer,
        extra,
    )
    found = _ORDERS.get(key)
    if found is not None:
        return found
    hard, soft = edges(accesses, formats, set(scope), set(outer))
    hard += [e for e in extra if e.before in scope and e.after in scope]
    order = topological(scope, hard, soft)
    if order is None:
        raise _conflict(scope, accesses, formats, hard, soft, outer)
    if len(_ORDERS) >= _ORDERS_KEPT:
        _ORDERS.clear()  # a bound, not a policy: the next kernels refill it
    _ORDERS[key] = order
    return order


#: loop orders found, by `loop_order`'s arguments (at most `_ORDERS_KEPT`)
_ORDERS: dict[tuple[object, ...], tuple[str, ...]] = {}
_ORDERS_KEPT = 1024


def _reordered(access: Access, fmt: Format, order: tuple[str, ...]) -> Format:
    """``fmt``'s levels with the mode ordering that stores ``access``'s modes in loop ``order``."""
    rank = {v: n for n, v in enumerate(order)}
    ordering = sorted(range(access.order), key=lambda mode: rank.get(access.indices[mode], 1 << 30))
    return Format(fmt.levels, tuple(ordering))


#: for `sparsec.middle.derive`, which re-lays out a read in the loop order found without it
reordered = _reordered


def _advice(name: str, fmt: Format) -> str:
    """How a message tells the user to store ``name`` in ``fmt`` (a preset's name if any)."""
    ordering = ",".join(map(str, fmt.ordering))
    return f"Store {name} with mode ordering {ordering} (format '{fmt}')"


def output_edges(
    lhs: Access, fmt: Format, reductions: tuple[str, ...], rows_in_order: bool = True
) -> tuple[Edge, ...]:
    """A sparse output is appended in order: its sparse levels' indices come before every
    reduction index, and dense levels below them come after the last sparse one.

    ``rows_in_order``: the dense levels above the first sparse one are visited in their
    storage order too (one sequence of positions across rows); without it (rows counted
    and filled independently, see `assemble.OutputLayout.rowwise`) they may come in any
    order."""
    if fmt.is_dense:
        return ()
    levels = level_indices(lhs, fmt)
    sparse = [k for k, level in enumerate(fmt.levels) if level.position_iteration]
    found: list[Edge] = []
    if rows_in_order:
        found += [Edge(levels[k - 1], levels[k], lhs.name) for k in range(1, sparse[0])]
    for k in range(sparse[-1] + 1):  # dense levels above take part: pos is written per row
        found += [Edge(levels[k], r, lhs.name) for r in reductions]
    for k in range(sparse[-1] + 1, len(levels)):
        found.append(Edge(levels[sparse[-1]], levels[k], lhs.name))
    return tuple(found)


def _describe(edges_of: list[Edge]) -> str:
    return ", ".join(sorted({f"{e.before} before {e.after}" for e in edges_of}))


def _conflict(
    scope: tuple[str, ...],
    accesses: list[Access],
    formats: dict[str, Format],
    hard: list[Edge],
    soft: list[Edge],
    outer: tuple[str, ...],
) -> OrderConflict:
    reads = list(dict.fromkeys(accesses))
    needs = "; ".join(
        f"{a} ({formats[a.name]}) needs {_describe(made)}"
        for a in reads
        if (made := [e for e in hard if e.access == a or (e.access is None and e.tensor == a.name)])
    )
    head = f"no loop order fits every tensor's level order: {needs}"
    names = list(dict.fromkeys(a.name for a in reads if any(e.tensor == a.name for e in hard)))
    for name in reversed(names):
        rest = [e for e in hard if e.tensor != name]
        order = topological(scope, rest, soft)
        if order is None:
            continue
        own = [a for a in reads if a.name == name]
        for access in own:
            fmt = _reordered(access, formats[name], outer + order)
            if fmt == formats[name] or not _fits(scope, own, fmt, rest, soft, outer):
                continue
            return OrderConflict(
                f"{head}. {_advice(name, fmt)} so that loops can run in the order "
                f"{', '.join(outer + order)}"
            )
    for name in names:
        own = [a for a in reads if a.name == name]
        if len({a.indices for a in own}) > 1:
            taken = {a.name for a in reads}
            advice = _two_orders(name, formats[name], own, taken)
            return OrderConflict(f"{head}. {advice}")
    return OrderConflict(head)


def _fits(
    scope: tuple[str, ...],
    reads: list[Access],
    fmt: Format,
    rest: list[Edge],
    soft: list[Edge],
    outer: tuple[str, ...],
) -> bool:
    """Does some loop order suit every read of one tensor stored as ``fmt``, and the rest?"""
    try:
        mine, _ = edges(reads, {reads[0].name: fmt}, set(scope), set(outer))
    except LoweringError:
        return False
    return topological(scope, rest + mine, soft) is not None


def _two_orders(name: str, fmt: Format, reads: list[Access], taken: set[str]) -> str:
    """Advice for a sparse tensor read in several mode orders (``B(i,j) * B(j,i)``)."""
    first = reads[0]
    other = next(a for a in reads if a.indices != first.indices)
    copy = next(c for n in range(1000) if (c := f"{name}_t{n or ''}") not in taken)
    # the copy is read in the first read's index order and holds the other read's values
    mine = [v for v in first.indices if v in other.indices]
    if len(set(first.indices)) < len(first.indices) or len(mine) != len(other.indices):
        return (
            f"{name} is read in two mode orders ({', '.join(map(str, reads))}); its levels are "
            f"stored in one order, so no mode ordering serves both reads: store {name} dense"
        )
    written = f"{copy}({','.join(mine)})"
    how = ""
    if first.order == 2:
        how = f" (for a matrix, {copy}=sparsec.Tensor.from_scipy({name}.to_scipy().T, '{fmt}'))"
    return (
        f"{name} is read in two mode orders ({', '.join(map(str, reads))}); its levels are "
        f"stored in one order, so no mode ordering of {name} serves both reads. Pass the "
        f"transposed copy as a second tensor: write {written} in place of {other}, give "
        f"{copy} the format '{fmt}' and call with {written} = {other}{how}; or store {name} "
        "dense"
    )


def _inner_before_outer(
    access: Access,
    fmt: Format,
    above: str,
    var: str,
    scope: set[str],
    outer: set[str],
) -> OrderConflict:
    early = [v for v in access.indices if v in outer or v in scope]
    late = [v for v in access.indices if v not in early]
    fix = _reordered(access, fmt, tuple(early + late))
    return OrderConflict(
        f"{access} is stored as {fmt}, which needs {above} before {var}, but {above} is "
        f"summed in a loop nested inside the loop over {var}. {_advice(access.name, fix)}"
    )


def check_order(plan: Plan, hard: Sequence[Edge], describe: dict[str, str]) -> None:
    """Every hard edge (``before`` bound before ``after``'s loops start) still holds.

    ``hard`` are edges over original variables; ``describe`` maps a tensor
    name to its format in words, for the message.
    """
    bound_at: dict[str, int] = {}
    entered_at: dict[str, int] = {}
    space_of: dict[str, str] = {}
    for n, loop in enumerate(plan.order):
        space = plan.space_of(loop)
        for v in plan.binds(loop):
            bound_at[v] = n
        if space is None:
            entered_at[loop] = n
        else:
            for v in plan.spaces[space].vars:
                entered_at.setdefault(v, n)
                space_of[v] = space
    for edge in hard:
        if edge.before not in bound_at or edge.after not in entered_at:
            continue
        same = space_of.get(edge.before)
        found = f"the loop order is {', '.join(plan.order)}"
        if same is not None and same == space_of.get(edge.after):
            # a fused space (a range, or the positions of the pos tensor's levels) binds its
            # variables in the order they were fused: every tensor's levels must agree with
            # that order, not only the pos tensor's (checked by pos)
            joint = plan.spaces[same]
            if joint.vars.index(edge.before) < joint.vars.index(edge.after):
                continue
            found = f"{same} ({joint.origin}) binds {', '.join(joint.vars)} in that order"
        elif bound_at[edge.before] < entered_at[edge.after]:
            continue
        raise ScheduleError(
            f"schedule {plan.describe()}: {edge.tensor} ({describe.get(edge.tensor, '')}) "
            f"is iterated level by level, so {edge.before} must be bound before the loop "
            f"over {edge.after} starts, but {found}. Keep {edge.before} outside "
            f"{edge.after}, or store {edge.tensor} with another mode ordering"
        )
