"""What a statement means beyond its notation: the options of `sparsec.kernel` that change
values (docs/semantics.md).

* ``division``: ``"sparse"`` (the default; TACO's, MLIR's and scipy's ``multiply``
  convention): ``a / b`` is absent where ``a`` is structurally absent, so dividing costs
  what multiplying costs and a sparse result keeps the numerator's pattern. ``"ieee"``:
  the dense IEEE value everywhere (``0 / 0`` is NaN at absent entries).
* ``semiring``: the algebra of ``*`` and of the implicit sums (GraphBLAS's model); absent
  entries are the add's identity. ``"plus_times"`` is ordinary arithmetic.
* ``mask``: ``"M"`` computes the output only where tensor ``M`` has a stored entry
  (structural: its values are ignored), ``"~M"`` only where it has none; ``""``: no mask.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base.errors import SparsecError
from .semirings import SEMIRING_TABLE

DIVISIONS = ("sparse", "ieee")
#: the semirings' names, from their one table (`semirings.SEMIRING_TABLE`)
SEMIRINGS = tuple(SEMIRING_TABLE)


@dataclass(frozen=True, slots=True)
class Semantics:
    division: str = "sparse"
    semiring: str = "plus_times"
    mask: str = ""

    def __post_init__(self) -> None:
        if self.division not in DIVISIONS:
            raise SparsecError(
                f"unknown division {self.division!r}; choose one of {', '.join(DIVISIONS)} "
                "('sparse': absent where the numerator is absent; 'ieee': dense IEEE values)"
            )
        if self.semiring not in SEMIRINGS:
            raise SparsecError(
                f"unknown semiring {self.semiring!r}; choose one of {', '.join(SEMIRINGS)}"
            )
        if not isinstance(self.mask, str):
            raise SparsecError(
                f"mask must be a tensor name such as 'M' or '~M', not {type(self.mask).__name__}"
            )

    @property
    def is_default(self) -> bool:
        return self == DEFAULT


DEFAULT = Semantics()
