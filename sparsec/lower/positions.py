"""Position spaces (`pos`, fused `pos`): the access whose positions a space iterates, and
what its iterations tell apart (a non-unique level repeats a coordinate across positions)."""

from __future__ import annotations

from ..base.errors import ScheduleError
from ..frontend.concrete import CExpr, Sum, children
from ..frontend.notation import Access
from ..middle.order import level_indices
from ..middle.plan import Space
from ..middle.schedule import pos_access as access_of
from .env import LowerEnv


def whole_coordinates(env: LowerEnv, space: Space, expr: CExpr) -> None:
    """A position space over a non-unique level visits each entry of a coordinate on its
    own; a nested sum below it (computed into a temporary, then divided, negated or
    passed to a function) would be taken over one entry at a time instead of over all the
    entries of its coordinate: ``sqrt(sum(i, T(i,j)))`` is not ``sum(sqrt(...))``."""
    if space.kind not in ("pos", "fusedpos") or distinct(env, space):
        return
    if _nested_sum(expr):
        raise ScheduleError(
            f"pos over {space.tensor}'s non-unique level visits its entries one at a time, "
            f"but {expr} takes a sum over all the entries of a coordinate; store "
            f"{space.tensor} with unique levels (e.g. csf or csr instead of coo) or drop the pos"
        )


def _nested_sum(expr: CExpr) -> bool:
    return isinstance(expr, Sum) or any(_nested_sum(c) for c in children(expr))


def distinct(env: LowerEnv, space: Space) -> frozenset[str]:
    """Variables in which two iterations of a space's loops always differ."""
    if space.kind in ("pos", "fusedpos"):
        access = pos_access(env, space)
        fmt = env.inputs.formats[access.name]
        first = level_indices(access, fmt).index(space.vars[0])
        unique = all(fmt.levels[first + n].unique for n in range(len(space.vars)))
        return frozenset(space.vars) if unique else frozenset()
    return frozenset(space.vars)


def pos_access(env: LowerEnv, space: Space) -> Access:
    """The access whose positions a position space iterates."""
    return access_of(env.inputs.spec, space)
