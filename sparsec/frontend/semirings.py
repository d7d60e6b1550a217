"""The semirings of ``sparsec.kernel(..., semiring=...)`` (GraphBLAS's model in index
notation), each defined once here: its add (the monoid of the implicit sums and of an
explicit ``+``, GraphBLAS's eWiseAdd), its multiply (``*``, eWiseMult), the add's
identity (the value of an absent entry, so of an output element no term reaches) and the
numpy ufuncs of a dense reference.

Structure never changes with the semiring: ``*`` intersects and ``+`` unites, exactly as
for ``plus_times``, so the merge lattices stay as they are; the add's identity is the
multiply's annihilator in each of these semirings (``inf + x = inf``, ``0 * x = 0``,
``false and x = false``), which is what lets an absent factor drop a term. ``or_and``
reads values as booleans (nonzero is true) and stores 1 or 0.

Only ``*``, ``+`` and sums have a semiring meaning: ``-``, ``/`` and functions have no
counterpart in a semiring (there is no additive inverse for ``min``, no division for
``+`` used as a product), so `check_expression` refuses them under any semiring but
``plus_times``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import assert_never

from ..base.errors import SparsecError
from .notation import Access, BinOp, Call, Expr, Literal, Neg


@dataclass(frozen=True, slots=True)
class Semiring:
    """One semiring: ``add`` and ``multiply`` are operator keys of the lowering
    (``"+" "*" "min" "max" "or" "and" "pair" "second"``); ``np_add``/``np_mul`` the numpy
    ufunc names a dense reference reduces and broadcasts with (``pair`` and ``second``:
    `semiring_reference`'s own)."""

    name: str
    add: str
    multiply: str
    identity: float
    np_add: str
    np_mul: str
    #: values are truth values (nonzero is true); results are 1 or 0
    boolean: bool = False
    #: the multiply distributes over the add for every value (it preserves the add's
    #: order), so a sum may cross a product (`concrete.lift`): ``min(a, b) + c = min(a + c,
    #: b + c)``, but ``max(a, b) * c`` is ``min(a*c, b*c)`` for a negative ``c``
    distributive: bool = True

    @property
    def is_default(self) -> bool:
        return self.name == "plus_times"


SEMIRING_TABLE: dict[str, Semiring] = {
    s.name: s
    for s in (
        Semiring("plus_times", "+", "*", 0.0, "add", "multiply"),
        Semiring("min_plus", "min", "+", math.inf, "minimum", "add"),
        Semiring("max_plus", "max", "+", -math.inf, "maximum", "add"),
        Semiring("max_times", "max", "*", -math.inf, "maximum", "multiply", distributive=False),
        Semiring("min_times", "min", "*", math.inf, "minimum", "multiply", distributive=False),
        Semiring("or_and", "or", "and", 0.0, "logical_or", "logical_and", boolean=True),
        # GraphBLAS's structural multiplies: ``pair`` is 1 wherever both operands are
        # present (their values unread), ``second`` is its right operand's value. They
        # distribute over an idempotent add (``min(second(x, a), second(x, b))`` is
        # ``second(x, min(a, b))``, and ``second(min(a, b), c)`` is ``c = min(c, c)``), not
        # over + (``pair(x, a + b)`` is 1, not 2), so under plus_pair no sum crosses them
        Semiring("plus_pair", "+", "pair", 0.0, "add", "pair", distributive=False),
        Semiring("any_pair", "or", "pair", 0.0, "logical_or", "pair", boolean=True),
        Semiring("min_second", "min", "second", math.inf, "minimum", "second"),
        # sums the right operands, the left's values unread (a pattern's: PageRank's
        # ``A' plus.second w``); as pair, it does not distribute over +
        Semiring("plus_second", "+", "second", 0.0, "add", "second", distributive=False),
        # GraphBLAS's ANY monoid: any one of the terms' values (a valid answer of min, so
        # it computes as min and combines as min; a serial scan into one accumulator
        # stops at the first value it finds, `lower.semiring`): BFS parents
        Semiring("any_second", "any", "second", math.inf, "minimum", "second"),
        Semiring("or_second", "or", "second", 0.0, "logical_or", "second", boolean=True),
    )
}


def semiring(name: str) -> Semiring:
    """The semiring called ``name`` (`Semantics` has already checked the name)."""
    return SEMIRING_TABLE[name]


class SemiringError(SparsecError):
    """An operator with no meaning under the kernel's semiring."""


def check_expression(expr: Expr, ring: Semiring) -> None:
    """Refuse what a non-default semiring gives no meaning: ``-`` (no additive inverse
    of min/max/or), ``/`` (no inverse of the multiply) and functions (their value at 0
    decides sparsity, but an absent entry is the add's identity, not 0)."""
    if ring.is_default:
        return
    match expr:
        case Access() | Literal():
            return
        case Neg():
            what = "negation '-'"
        case BinOp(op="*" | "+", left=left, right=right):
            check_expression(left, ring)
            check_expression(right, ring)
            return
        case BinOp(op=op):
            what = f"the operator {op!r}"
        case Call(fn=fn):
            what = f"the function {fn}(...)"
        case _:
            assert_never(expr)
    raise SemiringError(
        f"{what} has no meaning under semiring={ring.name!r}: a semiring has only its add "
        f"({ring.add}, for '+' and the implicit sums) and its multiply ({ring.multiply}, "
        "for '*'); write the expression with '*' and '+' alone, or use the default "
        "semiring 'plus_times'"
    )
