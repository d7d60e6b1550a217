"""The schedules ``schedule="auto"`` times (`sparsec.api.autotune` times them and keeps the
fastest).

Candidates, each kept by the tuner only if it is legal for the expression and formats: the
default; the outermost loop split into blocks of 16 and of 128 rows on threads; the
default's parallel loop with the innermost loop vectorised (``CPUVector``); and
position-space parallelism over the leading sparse operand's nonzeros (``fuse`` + ``pos`` +
``split``, with Atomics or per-thread Temporary copies), which balances skewed rows.
"""

from __future__ import annotations

from ..middle.commands import name_supply
from ..middle.spec import Spec

#: the position-space candidates' chunk of nonzeros per task
POSITION_CHUNK = 2048
#: the row-block candidates' rows per block
ROW_BLOCKS = (16, 128)


def candidates(spec: Spec, loop_order: tuple[str, ...]) -> list[str | None]:
    """Schedules worth timing for ``spec``'s kernel, whose default schedule runs its loops
    in ``loop_order`` (outermost first); None is the default itself."""
    found: list[str | None] = [None]
    if not loop_order:
        return found
    v, last = loop_order[0], loop_order[-1]
    fresh = name_supply(set(spec.indices) | {t.name for t in spec.tensors})

    outer, inner = fresh(f"{v}_blk"), fresh(f"{v}_in")
    for block in ROW_BLOCKS:
        found.append(f"split({v},{outer},{inner},{block}), parallelize({outer},CPUThread,NoRaces)")
    if len(loop_order) > 1:
        found.append(f"parallelize({v},CPUThread,NoRaces), parallelize({last},CPUVector,NoRaces)")
        w = loop_order[1]
        sparse = next((t for t in spec.inputs if not t.format.is_dense), None)
        if sparse is not None:  # the leading sparse operand's nonzeros, in chunks
            f, fp, c, rest = fresh("fused"), fresh("fpos"), fresh("chunk"), fresh("fpos1")
            for races in ("Atomics", "Temporary"):
                found.append(
                    f"fuse({v},{w},{f}), pos({f},{fp},{sparse.name}), "
                    f"split({fp},{c},{rest},{POSITION_CHUNK}), parallelize({c},CPUThread,{races})"
                )
    return found
