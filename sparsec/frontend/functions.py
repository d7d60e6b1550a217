"""The functions of the language (``sqrt(A(i,j))``, ``max(a, b)``): one table, read by
every stage.

Per function: its arity; its value at 0, which decides sparsity (docs/semantics.md):

* ``f(0) == 0`` (``zero_preserving``): the result is structurally absent where its
  operand is, so the merge lattice of ``abs(A(i,j))`` is A's and a sparse output keeps
  A's pattern (TACO's and MLIR's "sparsity-preserving" unary ops);
* otherwise (``exp``, ``cos``, ``sigmoid``, ``log`` with ``log(0) = -inf``) the result is
  present everywhere: the lattice is made *full* and an absent operand computes ``f(0)``;
* binary ``max``/``min`` have ``f(0, 0) = 0``, so they co-iterate as a union (like ``+``);
  ``pow(a, b)`` keeps ``a``'s pattern only when ``b`` is a positive literal (``0^p = 0``).

``finite``: the value is finite for finite operands. A sum is never lifted across a
product with a factor that may be infinite or NaN (``(Σk X) * Y`` against ``Σk X * Y``
when ``Y`` is ``inf`` and some ``X`` is 0), as for a division.

``torch``: the dense reference's torch function. ``relu``, ``sign`` and ``sigmoid`` are
expressions the lowerer builds from others (`sparsec.lower.lowerer`); the others are calls
each language spells in its printer's table (`sparsec.backends.targets`), so this table
says what a function means and no target's spelling.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base.errors import NotationError
from .notation import Literal


@dataclass(frozen=True, slots=True)
class Function:
    name: str
    arity: int
    #: f(0) == 0 (unary), f(0, 0) == 0 (max/min): the result's pattern is the operands'
    zero_preserving: bool
    #: finite for finite operands
    finite: bool
    #: the dense reference: the name of the torch function (torch is optional, so only
    #: its name is here)
    torch: str

    def keeps_pattern(self, args: tuple[object, ...]) -> bool:
        """Is the result absent where the (first) operand is? ``pow`` only for a positive
        literal exponent; the others by their value at 0."""
        if self.name == "pow":
            exponent = args[1]
            return isinstance(exponent, Literal) and exponent.value > 0
        return self.zero_preserving


FUNCTIONS: dict[str, Function] = {
    f.name: f
    for f in (
        Function("abs", 1, True, True, "abs"),
        Function("sqrt", 1, True, False, "sqrt"),
        Function("exp", 1, False, False, "exp"),
        Function("log", 1, False, False, "log"),
        Function("sin", 1, True, True, "sin"),
        Function("cos", 1, False, True, "cos"),
        Function("tanh", 1, True, True, "tanh"),
        # 1 / (1 + exp(-x)), built by the lowerer from exp
        Function("sigmoid", 1, False, True, "sigmoid"),
        # x < 0 ? 0 : x (NaN stays NaN, as torch.relu)
        Function("relu", 1, True, True, "relu"),
        # x > 0 ? 1 : x < 0 ? -1 : 0 (the derivative of abs; sparsec.frontend.derivative)
        Function("sign", 1, True, True, "sign"),
        Function("max", 2, True, True, "maximum"),
        Function("min", 2, True, True, "minimum"),
        Function("pow", 2, False, False, "pow"),
    )
}


def function(name: str, span: tuple[int, int] = (0, 0), source: str | None = None) -> Function:
    """The function called ``name``; an unknown name is a `NotationError` that lists the
    functions that exist."""
    found = FUNCTIONS.get(name)
    if found is None:
        raise NotationError(
            f"unknown function '{name}'; the functions are {', '.join(FUNCTIONS)}",
            source=source,
            span=span,
        )
    return found
