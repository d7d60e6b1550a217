"""The derivative of a statement, in index notation (reverse mode, one input at a time).

For ``Y(out) = rhs`` and an input ``X`` read as ``X(ix)``, the gradient of ``X`` given the
output's gradient ``dY`` is itself a statement::

    dX(ix) = Σ_{vars not in ix} dY(out) * ∂rhs/∂X(ix)

which sparsec compiles like any kernel: ``Y(i,j) = W(i,k) * X(k,j)`` gives
``dX(k,j) = dY(i,j) * W(i,k)`` (i summed) and ``dW(i,k) = dY(i,j) * X(k,j)`` (j summed; an
SDDMM once the caller masks it by W's pattern). Each read of ``X`` is one term: a product
chain from the root down to the read, of the siblings of every ``*`` on the way and the
derivative of every function on the way (`DERIVATIVES`); ``X`` read twice
(``A(k,i) * A(k,j)``) is the sum of both terms, the second's variables renamed onto the
first read's.

Sums: sparsec places an implicit sum at the smallest subexpression holding every use of its
variable (docs/semantics.md). A copy of a forward subexpression in a term (a sibling, a
function's argument under its derivative) renames the variables summed inside it to fresh
ones, so ``relu(A(i,k) * x(k))`` differentiated for ``x(k)`` reads
``dY(i) * relu(sign(A(i,k1) * x(k1))) * A(i,k)``: the copy keeps its own inner sum while
the chain's ``k`` is the gradient's free variable. The other variables of a term are summed
over that term, which for a product chain is the sum over the whole term.

A variable the forward sums at or above the read (its sum's subexpression holds the read)
and that the read does not use sums the read's derivative too: ``a = (B(k) + D(k,i)) +
C(i)`` adds ``B(k)`` once per ``i``, and ``y(j) = relu(B(j,i)) * c(j) + D(j,i)`` gives
``dc(j) = Σi dy(j) * relu(B(j,i))``. Re-read by the smallest-subexpression rule, the term
would lose that sum (no factor uses ``i``) or place it inside a function (``relu(Σi B)``).
Such a term gets a factor ``ones(i)``, a dense vector of ones over ``i`` (`Derivative.ones`:
the caller binds it, of ``i``'s extent), which puts ``i``'s sum over the whole term.

Not differentiable here (`NotDifferentiable`, naming the construct and the input): a
division by anything but a non-zero literal, ``sqrt``/``log`` (their derivatives divide),
``pow`` with a non-literal exponent or a literal one below 1 (but 0), a repeated index in
the input's read (``A(i,i)``). Semirings and masks are refused by the caller
(`sparsec.api.gradient`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import assert_never

from ..base.errors import SparsecError
from .functions import FUNCTIONS
from .notation import Access, Assignment, BinOp, Call, Expr, Literal, Neg, accesses

#: a path from the rhs's root to one read: the child taken at each node (0 left, 1 right,
#: or a function's argument position)
Path = tuple[int, ...]
#: a function's arguments: each call returns fresh copies (`_Names.copy`)
Args = Callable[[], tuple[Expr, ...]]


class NotDifferentiable(SparsecError):
    """A statement whose gradient sparsec does not derive (raised at ``backward()``)."""


def _one() -> Expr:
    return Literal(1.0)


def _half_sign(a: Expr, b: Expr, plus: bool) -> Expr:
    """``0.5 ± 0.5 * sign(a - b)``: the derivative of max/min in one operand; 0.5 at a tie,
    as torch splits the gradient of ``maximum`` between equal operands."""
    half = BinOp("*", Literal(0.5), Call("sign", (BinOp("-", a, b),)))
    return BinOp("+" if plus else "-", Literal(0.5), half)


def _pow(args: Args, k: int) -> Expr | str:
    exponent = args()[1]
    if k != 0 or not isinstance(exponent, Literal):
        return "pow with a non-literal exponent (its derivative needs log)"
    p = exponent.value
    if p == 0:
        return Literal(0.0)
    if p == 1:
        return _one()
    if p < 1:
        return f"pow(x, {p:g}) (its derivative divides by x at 0)"
    if p == 2:
        return BinOp("*", Literal(2.0), args()[0])
    return BinOp("*", Literal(p), Call("pow", (args()[0], Literal(p - 1))))


def _tanh(args: Args, k: int) -> Expr:
    return BinOp("-", _one(), BinOp("*", Call("tanh", args()), Call("tanh", args())))


def _sigmoid(args: Args, k: int) -> Expr:
    return BinOp("*", Call("sigmoid", args()), BinOp("-", _one(), Call("sigmoid", args())))


def _extreme(plus_first: bool) -> Callable[[Args, int], Expr]:
    def rule(args: Args, k: int) -> Expr:
        a, b = args()
        return _half_sign(a, b, plus_first == (k == 0))

    return rule


#: each function's derivative in argument ``k`` as an expression of copies of its
#: arguments (each call of ``args`` makes new ones: a copy's inner sums are its own, so
#: ``tanh(Σ) * tanh(Σ)`` is not one sum of a product), or the reason it is not derived. Functions of `functions.FUNCTIONS` only;
#: ``relu' = relu(sign(x))`` is 0 at 0, as torch's; ``abs' = sign``.
DERIVATIVES: dict[str, Callable[[Args, int], Expr | str]] = {
    "exp": lambda a, k: Call("exp", a()),
    "sin": lambda a, k: Call("cos", a()),
    "cos": lambda a, k: Neg(Call("sin", a())),
    "tanh": _tanh,
    "sigmoid": _sigmoid,
    "abs": lambda a, k: Call("sign", a()),
    "sign": lambda a, k: Literal(0.0),
    "relu": lambda a, k: Call("relu", (Call("sign", a()),)),
    "max": _extreme(True),
    "min": _extreme(False),
    "pow": _pow,
    "sqrt": lambda a, k: "sqrt (its derivative 1 / (2 sqrt(x)) divides)",
    "log": lambda a, k: "log (its derivative 1 / x divides)",
}


@dataclass(frozen=True, slots=True)
class Derivative:
    """``statement`` computes the gradient of ``wrt`` from ``grad_output`` (an access of the
    forward output's indices); its lhs is ``grad_input`` at the first read's indices, and
    its rhs ``Literal(0.0)`` where every term vanishes (``sign``'s derivative). ``ones``:
    (name, forward variable) of each dense vector of ones the statement reads, of that
    variable's extent (see the module docstring)."""

    wrt: str
    statement: Assignment
    ones: tuple[tuple[str, str], ...] = ()


def derivative(stmt: Assignment, wrt: str, grad_output: str, grad_input: str) -> Derivative:
    """The gradient statement of input ``wrt`` of ``stmt`` (see the module docstring):
    ``grad_input(ix) = Σ grad_output(out) * ∂rhs/∂wrt(ix)``. ``grad_output`` and
    ``grad_input`` must be names ``stmt`` does not use."""
    reads = [(p, a) for p, a in _reads(stmt.rhs, ()) if a.name == wrt]
    if not reads:
        raise NotDifferentiable(f"'{wrt}' is not read by {stmt}; it has no gradient")
    for _, access in reads:
        if len(set(access.indices)) != len(access.indices):
            raise NotDifferentiable(
                f"'{wrt}' is read as {access} with a repeated index (a diagonal) in {stmt}; "
                "its gradient is not derived"
            )
    names = _Names(stmt)
    target = reads[0][1].indices
    placed = _sum_paths(stmt)
    tensors = {a.name for a in stmt.accesses()} | {grad_output, grad_input} | set(FUNCTIONS)
    ones: dict[str, str] = {}
    terms: list[Expr] = []
    for path, access in reads:
        coeff, chain = _chain(stmt.rhs, path, stmt, names, wrt)
        factors = [Access(grad_output, stmt.lhs.indices), *chain]
        for v, at in placed.items():
            if v in access.indices or path[: len(at)] != at or _placed_over(v, factors):
                continue
            if v not in ones:
                ones[v] = fresh_name(f"ones_{v}", tensors)
                tensors.add(ones[v])
            factors.append(Access(ones[v], (v,)))
        term = _product(coeff, factors)
        if term is not None:
            terms.append(_onto(term, access.indices, target, names))
    rhs: Expr = terms[0] if terms else Literal(0.0)
    for term in terms[1:]:
        rhs = BinOp("+", rhs, term)
    used = {a.name for a in accesses(rhs)}
    kept = tuple((name, v) for v, name in ones.items() if name in used)
    return Derivative(wrt, Assignment(Access(grad_input, target), rhs), kept)


def _sum_paths(stmt: Assignment) -> dict[str, Path]:
    """Each summed variable's place in the forward: the path of the smallest subexpression
    holding all its uses (docs/semantics.md, Reductions)."""
    found: dict[str, Path] = {}
    for path, access in _reads(stmt.rhs, ()):
        for v in access.indices:
            if v in stmt.lhs.indices:
                continue
            at = found.get(v, path)
            n = 0
            while n < min(len(at), len(path)) and at[n] == path[n]:
                n += 1
            found[v] = at[:n]
    return found


def _placed_over(v: str, factors: list[Expr]) -> bool:
    """Does the smallest-subexpression rule sum ``v`` over the product of ``factors`` (as
    much as over the whole product)? Yes where two factors use it, or one that is a plain
    access; not where none does, or only a compound one (a function's argument, a copy with
    sums of its own), where the rule would place the sum inside it."""
    users = [f for f in factors if any(v in a.indices for a in accesses(f))]
    return len(users) >= 2 or (len(users) == 1 and isinstance(users[0], Access))


def fresh_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base_1``, ``base_2``, ... : the first not in ``taken``."""
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    return name


def _reads(expr: Expr, path: Path) -> list[tuple[Path, Access]]:
    match expr:
        case Access():
            return [(path, expr)]
        case Literal():
            return []
        case Neg(operand=x):
            return _reads(x, (*path, 0))
        case BinOp(left=left, right=right):
            return _reads(left, (*path, 0)) + _reads(right, (*path, 1))
        case Call(args=args):
            return [r for k, a in enumerate(args) for r in _reads(a, (*path, k))]
        case _:
            assert_never(expr)


class _Names:
    """Fresh index-variable names and the forward's use counts (which variables a copied
    subexpression sums inside itself)."""

    def __init__(self, stmt: Assignment) -> None:
        self.free = frozenset(stmt.lhs.indices)
        self.uses = Counter(i for a in accesses(stmt.rhs) for i in a.indices)
        self.taken = {i for a in stmt.accesses() for i in a.indices}

    def fresh(self, base: str) -> str:
        n = 1
        while f"{base}{n}" in self.taken:
            n += 1
        self.taken.add(f"{base}{n}")
        return f"{base}{n}"

    def copy(self, expr: Expr) -> Expr:
        """``expr`` with the variables summed inside it (every forward use is in it, and it
        is not an output variable) renamed to fresh ones."""
        inner = Counter(i for a in accesses(expr) for i in a.indices)
        local = [v for v, n in inner.items() if v not in self.free and n == self.uses[v]]
        return _rename(expr, {v: self.fresh(v) for v in local})


def _chain(
    expr: Expr, path: Path, stmt: Assignment, names: _Names, wrt: str
) -> tuple[float, list[Expr]]:
    """The literal coefficient and the factors of ∂expr/∂(the read at ``path``)."""
    if not path:
        return 1.0, []
    k, rest = path[0], path[1:]

    def refuse(what: str) -> NotDifferentiable:
        return NotDifferentiable(
            f"the gradient of '{wrt}' in {stmt} meets {what}; sparsec derives gradients "
            "through sums, differences, products, literals and the functions "
            f"{', '.join(f for f in DERIVATIVES if f not in ('sqrt', 'log'))}"
        )

    match expr:
        case Access() | Literal():
            raise AssertionError(expr)
        case Neg(operand=x):
            c, f = _chain(x, rest, stmt, names, wrt)
            return -c, f
        case BinOp(op="+" | "-" as op, left=left, right=right):
            c, f = _chain(left if k == 0 else right, rest, stmt, names, wrt)
            return (-c if op == "-" and k == 1 else c), f
        case BinOp(op="*", left=left, right=right):
            c, f = _chain(left if k == 0 else right, rest, stmt, names, wrt)
            other = right if k == 0 else left
            if isinstance(other, Literal):
                return c * other.value, f
            return c, [names.copy(other), *f]
        case BinOp(op="/", left=left, right=right):
            divisor = _literal(right)
            if k == 0 and divisor is not None and divisor != 0:
                c, f = _chain(left, rest, stmt, names, wrt)
                return c / divisor, f
            raise refuse(f"the division {expr}")
        case BinOp():
            raise AssertionError(expr.op)
        case Call(fn=fn, args=args):
            rule = DERIVATIVES.get(fn)
            found = rule(lambda: tuple(names.copy(a) for a in args), k) if rule else fn
            if isinstance(found, str):
                raise refuse(found)
            c, f = _chain(args[k], rest, stmt, names, wrt)
            if isinstance(found, Literal):
                return c * found.value, f
            return c, [found, *f]
        case _:
            assert_never(expr)


def _product(coeff: float, factors: list[Expr]) -> Expr | None:
    """``coeff * f0 * f1 * ...``, or None when the coefficient is 0."""
    if coeff == 0:
        return None
    out = factors[0]
    for f in factors[1:]:
        out = BinOp("*", out, f)
    if coeff == -1:
        return Neg(out)
    return out if coeff == 1 else BinOp("*", Literal(coeff), out)


def _onto(term: Expr, read: tuple[str, ...], target: tuple[str, ...], names: _Names) -> Expr:
    """``term`` (for a read at ``read``) with its variables renamed so that the read's are
    ``target``'s; a variable of the term that is one of ``target``'s otherwise is renamed
    away first."""
    if read == target:
        return term
    mapping = dict(zip(read, target, strict=True))
    used = {i for a in accesses(term) for i in a.indices}
    for v in used:
        if v not in mapping and v in target:
            mapping[v] = names.fresh(v)
    return _rename(term, mapping)


def _rename(expr: Expr, mapping: dict[str, str]) -> Expr:
    if not mapping:
        return expr
    match expr:
        case Access():
            return Access(
                expr.name,
                tuple(mapping.get(i, i) for i in expr.indices),
                expr.span,
                (),
                expr.complement,
                expr.pattern,
            )
        case Literal():
            return expr
        case Neg(operand=x):
            return Neg(_rename(x, mapping))
        case BinOp(op=op, left=left, right=right):
            return BinOp(op, _rename(left, mapping), _rename(right, mapping))
        case Call(fn=fn, args=args):
            return Call(fn, tuple(_rename(a, mapping) for a in args))
        case _:
            assert_never(expr)


def _literal(expr: Expr) -> float | None:
    """The value of a literal, negated ones included (``x / -4.0`` parses as a division by
    ``Neg(4.0)``); None for anything else."""
    if isinstance(expr, Neg):
        inner = _literal(expr.operand)
        return None if inner is None else -inner
    return expr.value if isinstance(expr, Literal) else None
