"""The GPU default's rows by lane groups (CSR-vector), chosen per call: the average row
length of the call's sparse operand picks the lanes per row (`policy.schedules.
vector_lanes`), and the kernel for that group size is made once and kept
(`Kernel._candidate`, cached by its schedule's text); short rows keep thread-per-row."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..middle.commands import name_supply
from ..middle.spec import Spec
from ..policy.schedules import VECTOR_MIN_ROW, vector_lanes, vector_schedule
from ..tensors.tensor import Tensor

#: how `Kernel.schedule` tells that a call may run another kernel than `Kernel.source`'s
VECTOR_NOTE = (
    f"a call whose rows hold {VECTOR_MIN_ROW} or more nonzeros on average gives each row a "
    "group of lanes instead (CSR-vector: 2-32 lanes, the largest power of two at most half "
    "the average; a kernel per group size)"
)


def by_lane_groups(
    spec: Spec, rows: tuple[str, str, str], values: Mapping[str, Any], warp: int
) -> str | None:
    """The schedule giving each row of ``rows`` = (row, col, tensor) a group of lanes of a
    warp of ``warp`` (`Target.lanes`), as text, for a call on ``values``; None where its
    rows are too short on average (or the operand is not a host `Tensor`)."""
    row, col, name = rows
    tensor = values.get(name)
    if not isinstance(tensor, Tensor) or not tensor.level_shape[0]:
        return None
    lanes = vector_lanes(tensor.nnz / tensor.level_shape[0], warp)
    if not lanes:
        return None
    fresh = name_supply(set(spec.indices) | {t.name for t in spec.tensors})
    return ", ".join(str(c) for c in vector_schedule(row, col, name, lanes, fresh, warp))
