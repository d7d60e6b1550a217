"""The decisions ``schedule="auto"`` times (`sparsec.api.autotune` times them and keeps the
fastest): the default `Decision` and others built from it by replacing fields, never
schedule text parsed again.

Candidates, each kept by the tuner only if it is legal for the expression and formats: the
default; the outermost loop split into blocks of 16 and of 128 rows on threads; the
default's parallel loop with the innermost loop vectorised (``CPUVector``); and
position-space parallelism over the leading sparse operand's nonzeros (``fuse`` + ``pos`` +
``split``, with Atomics or per-thread Temporary copies), which balances skewed rows; and the
default under each other value of each option host calibration sets
(`policy.calibrated.CHOICES`: the stream prefetches' hint or none, the gathered rows'
prefetch distance or none), so a kernel whose data favours another value than the host's
finds it.
"""

from __future__ import annotations

from ..base.target import C
from ..middle.commands import Command, name_supply
from ..middle.spec import Spec
from . import calibrated
from .decision import Decision, decide, option_of

#: the position-space candidates' chunk of nonzeros per task
POSITION_CHUNK = 2048
#: the row-block candidates' rows per block
ROW_BLOCKS = (16, 128)


def candidates(
    spec: Spec, loop_order: tuple[str, ...], default: Decision | None = None
) -> list[Decision]:
    """Decisions worth timing for ``spec``'s C kernel, whose ``default`` decision (by
    default `decide`'s) runs its loops in ``loop_order`` (outermost first); the default
    first. Each other candidate is the default under other commands (`Decision.under`)."""
    default = default or decide(spec, C)
    found = [default]
    if not loop_order:
        return found
    found.extend(_option_candidates(default))
    v, last = loop_order[0], loop_order[-1]
    fresh = name_supply(set(spec.indices) | {t.name for t in spec.tensors})

    def par(loop: str, unit: str, races: str) -> Command:
        return Command("parallelize", (loop, unit, races))

    def candidate(*commands: Command) -> Decision:
        return default.under(commands)

    outer, inner = fresh(f"{v}_blk"), fresh(f"{v}_in")
    for block in ROW_BLOCKS:
        split = Command("split", (v, outer, inner, str(block)))
        found.append(candidate(split, par(outer, "CPUThread", "NoRaces")))
    if len(loop_order) > 1:
        found.append(candidate(par(v, "CPUThread", "NoRaces"), par(last, "CPUVector", "NoRaces")))
        w = loop_order[1]
        sparse = next((t for t in spec.inputs if not t.format.is_dense), None)
        if sparse is not None:  # the leading sparse operand's nonzeros, in chunks
            f, fp, c, rest = fresh("fused"), fresh("fpos"), fresh("chunk"), fresh("fpos1")
            for races in ("Atomics", "Temporary"):
                found.append(
                    candidate(
                        Command("fuse", (v, w, f)),
                        Command("pos", (f, fp, sparse.name)),
                        Command("split", (fp, c, rest, str(POSITION_CHUNK))),
                        par(c, "CPUThread", races),
                    )
                )
    return found


def _option_candidates(default: Decision) -> list[Decision]:
    """The default under each other value of each calibrated pass option (a cost model's
    threshold decides a call's layout, not the kernel's code: not a candidate)."""
    found = []
    for name, values in calibrated.CHOICES.items():
        if name.startswith("costs."):
            continue
        now = option_of(default.passes, name)
        for value in values:
            if value != now:
                found.append(default.tuning(**{name.replace("tile.", "tile_", 1): value}))
    return found
