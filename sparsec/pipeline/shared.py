"""What both targets' generation shares: the record of a lowered kernel before it is printed,
and the questions the API asks of the lowering without generating."""

from __future__ import annotations

from typing import Any

from ..abi import Signature
from ..backends import Generated
from ..lower import LoweredKernel, lower, names_for
from ..middle.schedule import make_schedule
from ..middle.spec import Spec


def lower_serially(spec: Spec) -> None:
    """``spec`` lowered serially with no schedule, for what it raises (the question
    `middle.schedule.every_loop` asks where a nested sum fits no order)."""
    lower(spec, names_for(spec), schedule=make_schedule(spec), parallel=False)


def record(
    lowered: LoweredKernel,
    sig: Signature,
    schedule: str,
    dtype: str,
    index_dtype: str,
    **rest: Any,
) -> Generated:
    """What is known of a kernel before it is printed (the printer adds the source)."""
    return Generated(
        "", sig, lowered.loop_order, schedule, dtype, index_dtype, lowered.bounds, **rest
    )
