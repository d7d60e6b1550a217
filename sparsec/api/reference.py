"""Dense reference: evaluate a statement with torch on densified inputs, and compare.

The reference reads the statement as the user wrote it, from the notation AST: each
summed index is summed at the smallest subexpression that holds all its uses (the rule
of docs/semantics.md), computed here on its own, never from the compiler's concrete
statement, so a rewrite that changes the value (a sum moved across a division) shows
up as a difference. A product whose sums close inside it is one ``torch.einsum`` (so
MTTKRP never materialises the four-index product); other nodes broadcast by index label.
The comparison tolerance is dtype-aware: ``|got - want| <= rtol * (|want| + max(1,
max|want|))`` with ``rtol`` 1e-4 for float32 and 1e-9 for float64 results; NaNs must
coincide.

Structural presence is evaluated on its own too, from the notation and the inputs' stored
entries (docs/semantics.md): a sparse operand is present where it stores an entry (an
explicit zero included), a dense one everywhere; ``*`` needs both operands, ``+``/``-``
either, a quotient under the ``"sparse"`` division its numerator, a function with
``f(0) = 0`` its operands (``max``/``min`` either), any other function nothing; a sum is
present where some term is. A node is 0 where absent, whatever its operands' values
(``0 * inf`` of an absent factor is 0, as the kernel never computes it). Only the exact
lowering (``"ieee"`` division by a non-constant) computes every node densely instead.
"""

from __future__ import annotations

import string
from collections import Counter
from collections.abc import Mapping
from typing import assert_never

import numpy as np
import torch

from ..base.errors import CheckError
from ..base.values import is_integral
from ..frontend.concrete import exact, unbounded
from ..frontend.functions import FUNCTIONS
from ..frontend.notation import Access, Assignment, BinOp, Call, Expr, Literal, Neg, accesses

Labelled = tuple[torch.Tensor, tuple[str, ...]]
#: where a node is structurally present, over its labels (None: everywhere)
Presence = torch.Tensor | None

#: 16-bit results: twice the rounding of the result (float32 sums, 2^-11 and 2^-8)
RTOL = {"float32": 1e-4, "float64": 1e-9, "float16": 1e-3, "bfloat16": 8e-3}


def _align(t: torch.Tensor, labels: tuple[str, ...], target: tuple[str, ...]) -> torch.Tensor:
    """``t`` with its dims permuted to ``target`` order and size-1 dims for missing labels."""
    perm = [labels.index(x) for x in target if x in labels]
    t = t.permute(perm) if perm else t
    shape = []
    it = iter(t.shape)
    for x in target:
        shape.append(next(it) if x in labels else 1)
    return t.reshape(shape)


def _union(*label_sets: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(x for ls in label_sets for x in ls))


def _counts(expr: Expr) -> Counter[str]:
    return Counter(i for a in accesses(expr) for i in a.indices)


def _factors(expr: Expr) -> tuple[list[Expr], float]:
    """Flatten a product (through negations) into factors and a sign."""
    match expr:
        case BinOp(op="*", left=left, right=right):
            fl, sl = _factors(left)
            fr, sr = _factors(right)
            return fl + fr, sl * sr
        case Neg(operand=x):
            f, s = _factors(x)
            return f, -s
        case _:
            return [expr], 1.0


class _Evaluator:
    """The dense value of each subexpression, with the sums that close inside it done.

    A summed index closes at a node when every one of its uses lies below that node; its
    children have already summed the indices that close inside them, so whatever summed
    label is left and closes here has its smallest enclosing subexpression here.

    ``exact`` (the statement divides under ``"ieee"``, so infinities arise) evaluates
    every node as written, elementwise: einsum may factor ``Σk a(k) * c`` into ``c * Σk
    a(k)``, which differs when ``c`` is infinite and some ``a(k)`` is zero. Otherwise each
    node is 0 where it is structurally absent (`_presence`, from ``stored``: a sparse
    input's stored entries); where a value may be infinite (a sparse division, ``log``)
    every node is evaluated elementwise too, for the same reason.
    """

    def __init__(
        self,
        assignment: Assignment,
        inputs: Mapping[str, torch.Tensor],
        exact: bool,
        stored: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        self.summed = frozenset(assignment.summed_indices)
        self.totals = _counts(assignment.rhs)
        self.inputs = inputs
        self.exact = exact
        self.stored = stored or {}
        # einsum only where every value is finite: a sum of products then factors freely
        # (an absent factor's product is 0, never computed: not so for an infinite datum)
        finite = all(bool(torch.isfinite(t).all()) for t in inputs.values())
        self.elementwise = exact or unbounded(assignment.rhs) or not finite
        #: structural presence of each node `value` returned (its sums taken), and its
        #: labels, by node identity (the tree lives as long as this evaluator)
        self._present: dict[int, Presence] = {}
        self._labels: dict[int, tuple[str, ...]] = {}
        #: inside a divisor (how deep): IEEE values, where a zero's sign decides the sign
        #: of an infinity, as the kernel computes them; an absent node is +0 there
        self._divisor = 0

    def _closing(self, expr: Expr, labels: tuple[str, ...]) -> tuple[str, ...]:
        here = _counts(expr)
        return tuple(x for x in labels if x in self.summed and here[x] == self.totals[x])

    def value(self, expr: Expr) -> Labelled:
        if self.exact:
            return self._closed(expr, *self._node(expr))
        if isinstance(expr, BinOp) and expr.op == "*" and not (self.elementwise or self._divisor):
            # every value finite: a product is present where it is not zero, and reading
            # absent as 0 gives the same value; so is every node above it
            return self._product(expr)
        t, labels = self._node(expr)
        present = self._presence(expr, labels)
        if present is not None:
            # absent: +0 whatever its operands' values (an absent 0/0 is never computed),
            # inside a divisor too (an absent -x or 0 * -3 is +0, not IEEE's -0)
            t = torch.where(present, t, torch.zeros((), dtype=t.dtype))
        closing = self._closing(expr, labels)
        if closing:
            dims = [labels.index(x) for x in closing]
            if present is None and any(t.shape[d] == 0 for d in dims):
                # a sum over an empty range reaches no term: absent, as in the kernel
                kept = [n for d, n in enumerate(t.shape) if d not in dims]
                present = torch.zeros(kept, dtype=torch.bool)
            elif present is not None:
                present = present.any(dim=dims)
        self._present[id(expr)] = present
        return self._closed(expr, t, labels)

    def _closed(self, expr: Expr, t: torch.Tensor, labels: tuple[str, ...]) -> Labelled:
        """``t`` with the sums that close at ``expr`` taken."""
        closing = self._closing(expr, labels)
        if not closing:
            return t, labels
        dims = [labels.index(x) for x in closing]
        return t.sum(dim=dims), tuple(x for x in labels if x not in closing)

    def _presence(self, expr: Expr, labels: tuple[str, ...]) -> Presence:
        """Where ``expr`` (its children already evaluated) is structurally present, over
        ``labels``, before its closing sums."""

        def child(e: Expr) -> Presence:
            p = self._present.get(id(e))
            return None if p is None else _align(p, self._labels[id(e)], labels)

        match expr:
            case Access(name=name):
                present = self.stored.get(name)
                return None if present is None else _diagonal(present, expr.indices)
            case Literal():
                return None
            case Neg(operand=x):
                return child(x)
            case BinOp(op="*", left=left, right=right):
                return _both(child(left), child(right))
            case BinOp(op="+" | "-", left=left, right=right):
                return _either(child(left), child(right))
            case BinOp(op="/", left=left):
                # not exact: a literal divisor, or the sparse convention
                return child(left)
            case Call(fn=fn, args=args):
                if fn in ("max", "min"):
                    return _either(child(args[0]), child(args[1]))
                if FUNCTIONS[fn].keeps_pattern(args):
                    return child(args[0])
                return None
            case BinOp(op=op):
                raise AssertionError(f"unknown operator {op}")
            case _:
                assert_never(expr)

    def _node(self, expr: Expr) -> Labelled:
        match expr:
            case Access(name=name, indices=indices):
                return _diagonal(self.inputs[name], indices), tuple(dict.fromkeys(indices))
            case Literal(value=v):
                return torch.tensor(v, dtype=torch.float64), ()
            case Neg(operand=x):
                t, labels = self._child(x)
                return -t, labels
            case Call(fn=fn, args=args):
                evaluated = [self._child(a) for a in args]
                labels = _union(*(ls for _, ls in evaluated))
                operands = [_align(t, ls, labels) for t, ls in evaluated]
                return getattr(torch, FUNCTIONS[fn].torch)(*operands), labels
            case BinOp(op=op, left=left, right=right):
                a, la = self._child(left)
                self._divisor += op == "/"
                b, lb = self._child(right)
                self._divisor -= op == "/"
                labels = _union(la, lb)
                a, b = _align(a, la, labels), _align(b, lb, labels)
                match op:
                    case "+":
                        return a + b, labels
                    case "-":
                        return a - b, labels
                    case "*":
                        return a * b, labels
                    case "/":
                        return a / b, labels
                raise AssertionError(op)
            case _:
                assert_never(expr)

    def _child(self, expr: Expr) -> Labelled:
        """`value`, remembering the labels its presence is over."""
        t, labels = self.value(expr)
        self._labels[id(expr)] = labels
        return t, labels

    def _product(self, expr: BinOp) -> Labelled:
        """A product chain as one einsum, summing the indices that close inside it.

        Only used when nothing divides: then every value is finite (for finite inputs)
        and a sum that closes in a sub-product may be taken over the whole chain.
        """
        factors, sign = _factors(expr)
        evaluated = [self.value(f) for f in factors]
        labels = _union(*(ls for _, ls in evaluated))
        closing = self._closing(expr, labels)
        out = tuple(x for x in labels if x not in closing)
        letters = dict(zip(labels, string.ascii_letters, strict=False))
        spec = ",".join("".join(letters[x] for x in ls) for _, ls in evaluated)
        spec += "->" + "".join(letters[x] for x in out)
        operands = [t for t, _ in evaluated]
        if sign < 0:
            # negate a factor, not the sum: each term is computed as written (as the kernel
            # does), so a sum of zeros keeps the sign IEEE addition gives it
            operands[0] = -operands[0]
        return torch.einsum(spec, *operands), out


def _diagonal(t: torch.Tensor, indices: tuple[str, ...]) -> torch.Tensor:
    """``t`` read as ``indices`` on each distinct index once: its diagonal where an index
    repeats (``A(i,i)``, torch.einsum's ``ii->i``), ``t`` itself otherwise."""
    if len(set(indices)) == len(indices):
        return t
    if t.dtype == torch.bool:  # a presence mask
        return _diagonal(t.to(torch.float64), indices) != 0
    letters = dict(zip(dict.fromkeys(indices), string.ascii_letters, strict=False))
    spec = "".join(letters[x] for x in indices) + "->" + "".join(letters.values())
    return torch.einsum(spec, t)


def reference(
    assignment: Assignment,
    inputs: Mapping[str, torch.Tensor],
    dims: Mapping[str, int],
    current: torch.Tensor | None = None,
    stored: Mapping[str, torch.Tensor] | None = None,
    division: str = "ieee",
) -> torch.Tensor:
    """The dense float64 value of ``assignment``'s left-hand side, as written.

    ``inputs`` are dense float64 tensors in mode order; ``current`` is the output's given
    value for ``+=``. ``stored``: per sparse input, a boolean tensor in mode order, True
    at its stored entries (an input without one is present everywhere); ``division``: the
    convention of the kernel's `Semantics`.
    """
    evaluator = _Evaluator(assignment, inputs, exact(assignment.rhs, division), stored)
    t, labels = evaluator.value(assignment.rhs)
    lhs = assignment.lhs.indices
    t = _align(t, labels, lhs)
    t = t.expand(*(dims[i] for i in lhs)).clone() if lhs else t.clone()
    if current is not None:
        t = t + current
    return t


def _both(a: Presence, b: Presence) -> Presence:
    if a is None or b is None:
        return b if a is None else a
    return a & b


def _either(a: Presence, b: Presence) -> Presence:
    return None if a is None or b is None else a | b


def compare(
    got: np.ndarray, want: np.ndarray, dtype: str, what: str, against: str = "dense torch"
) -> float:
    """Max abs error of ``got`` against ``want`` (computed by ``against``); raises
    `CheckError` beyond tolerance."""
    if is_integral(dtype):
        return _compare_exactly(np.asarray(got), np.asarray(want), dtype, what, against)
    got64 = np.asarray(got, dtype=np.float64)
    want64 = np.asarray(want, dtype=np.float64)
    if got64.shape != want64.shape:
        raise CheckError(f"{what}: result shape {got64.shape} != reference shape {want64.shape}")
    if got64.size == 0:
        return 0.0
    rtol = RTOL[dtype]
    finite = np.isfinite(want64)
    scale = max(1.0, float(np.max(np.abs(want64[finite]), initial=0.0)))
    tol = rtol * (np.abs(np.where(finite, want64, 0.0)) + scale)
    with np.errstate(invalid="ignore"):
        diff = np.abs(got64 - want64)
        same_special = (np.isnan(got64) & np.isnan(want64)) | (~finite & (got64 == want64))
        bad = ~same_special & ~(diff <= tol)
    if bad.any():
        excess = np.where(bad, np.nan_to_num(diff / tol, nan=np.inf, posinf=np.inf), -1.0)
        worst = np.unravel_index(int(np.argmax(excess)), got64.shape)
        at = ",".join(map(str, worst))
        raise CheckError(
            f"{what}: result differs from {against} at [{at}]: got {float(got64[worst])!r}, "
            f"expected {float(want64[worst])!r} (tolerance {tol[worst]:.3g}); "
            f"{int(bad.sum())} of {bad.size} elements differ"
        )
    ok = ~(np.isnan(diff))
    return float(np.max(diff[ok], initial=0.0))


def _compare_exactly(
    got: np.ndarray, want: np.ndarray, dtype: str, what: str, against: str
) -> float:
    """An integral result: equal to ``want`` in every element, or `CheckError` (0.0)."""
    if got.shape != want.shape:
        raise CheckError(f"{what}: result shape {got.shape} != reference shape {want.shape}")
    if got.dtype != np.dtype(dtype):
        raise CheckError(f"{what}: result dtype {got.dtype}, expected {dtype}")
    bad = got != want.astype(dtype)
    if bad.any():
        worst = np.unravel_index(int(np.argmax(bad)), got.shape)
        at = ",".join(map(str, worst))
        raise CheckError(
            f"{what}: result differs from {against} at [{at}]: got {got[worst]!r}, expected "
            f"{want[worst]!r} (exact, {dtype}); {int(bad.sum())} of {bad.size} elements differ"
        )
    return 0.0
