"""Dense reference under a semiring other than ``plus_times`` (GraphBLAS's model), for
`Kernel.check`: the statement evaluated with numpy on densified inputs, from the notation
as the user wrote it, independently of the compiler.

Each node is a value over its index labels and where it is structurally present: a
sparse operand where it stores an entry (explicit zeros included), a dense one and a
literal everywhere; ``*`` (the semiring's multiply) where both operands are, ``+`` (its
add, GraphBLAS's eWiseAdd) where either is; a summed index is reduced with the add at the
smallest subexpression holding all its uses (docs/semantics.md), present where some term
is. Absent, a node holds the add's identity (``+inf`` for ``min``), whatever its
operands' values: an absent factor's product is never computed (``-inf * 0`` is no NaN).
``or_and`` reads values as truth values and yields 1 or 0. A dense output holds the
identity where nothing is present; a sparse output's absent entries read as 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, assert_never

import numpy as np

from ..frontend.notation import Access, Assignment, BinOp, Call, Expr, Literal, Neg, accesses
from ..frontend.semirings import Semiring

#: a node: its value and presence, over its labels
Node = tuple[np.ndarray, np.ndarray, tuple[str, ...]]


def semiring_reference(
    assignment: Assignment,
    dense: Mapping[str, np.ndarray],
    stored: Mapping[str, np.ndarray],
    ring: Semiring,
    current: np.ndarray | None = None,
    sparse_output: bool = False,
    dtype: str = "float64",
) -> np.ndarray:
    """The output of ``assignment`` under ``ring``: ``dense`` holds every operand densified
    (by tensor name), ``stored`` the stored-entry mask of each sparse one; ``current`` the
    output's value before a ``+=``. ``dtype``: the type every node is computed in (an
    integral one wraps at each operation, as the kernel does); for an integral type the
    statement may also hold ``-``, ``/`` and the integral functions under plus_times."""
    ev = _Evaluator(assignment, dense, stored, ring, np.dtype(dtype))
    value, present, labels = ev.node(assignment.rhs)
    lhs = assignment.lhs.indices
    # an rhs index that the lhs lacks and no node reduced (a lone access's): reduce now
    rest = tuple(x for x in labels if x not in lhs)
    if rest:
        value, present, labels = ev.reduce(value, present, labels, rest)
    shape = tuple(ev.extent(x) for x in lhs)
    value = np.broadcast_to(_align(value, labels, lhs), shape)
    present = np.broadcast_to(_align(present, labels, lhs), shape)
    if current is not None:
        value = ev.add(np.asarray(current, dtype=ev.dt), value)
        present = np.ones(shape, dtype=bool)
    if sparse_output:
        return np.where(present, value, ev.dt.type(0))
    return np.array(value, dtype=ev.dt)


class _Evaluator:
    def __init__(
        self,
        assignment: Assignment,
        dense: Mapping[str, np.ndarray],
        stored: Mapping[str, np.ndarray],
        ring: Semiring,
        dt: np.dtype,
    ) -> None:
        self.ring = ring
        self.dt = dt
        self.integral = dt.kind in "biu"
        self.identity = in_type(ring.identity, dt)
        self.dense = dense
        self.stored = stored
        self.lhs = set(assignment.lhs.indices)
        self.uses: Counter[str] = Counter(x for a in accesses(assignment.rhs) for x in a.indices)
        self.extents: dict[str, int] = {}
        for a in assignment.accesses():
            if a.name in dense:
                for x, n in zip(a.indices, np.shape(dense[a.name]), strict=True):
                    self.extents[x] = n
        self.np_add: Any = getattr(np, ring.np_add)
        self.np_mul: Any = _MULTIPLIES.get(ring.np_mul) or getattr(np, ring.np_mul)

    def extent(self, x: str) -> int:
        return self.extents[x]

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._truth(self.np_add(a, b))

    def _truth(self, v: np.ndarray) -> np.ndarray:
        if self.ring.boolean:
            return (np.asarray(v) != 0).astype(self.dt)
        return np.asarray(v).astype(self.dt, copy=False)

    def node(self, expr: Expr) -> Node:
        """``expr``'s value and presence, its own sums reduced."""
        match expr:
            case Access(name=name, indices=indices):
                value, present = self._operand(name, indices)
                return self._close(expr, value, present, indices)
            case Literal(value=v):
                one = np.ones((), dtype=bool)
                literal = np.array(int(v) if self.integral else float(v))
                return self._truth(literal), one, ()
            case BinOp(op="*" | "+", left=left, right=right):
                a, pa, la = self.node(left)
                b, pb, lb = self.node(right)
                labels = tuple(dict.fromkeys((*la, *lb)))
                a, pa = _align(a, la, labels), _align(pa, la, labels)
                b, pb = _align(b, lb, labels), _align(pb, lb, labels)
                ident = self.identity
                if expr.op == "*":
                    present = pa & pb
                    with np.errstate(invalid="ignore", over="ignore"):
                        value = np.where(present, self._truth(self.np_mul(a, b)), ident)
                else:
                    present = pa | pb
                    value = self.add(a, b)
                return self._close(expr, value, present, labels)
            case Neg() | BinOp() | Call() if self.integral and self.ring.is_default:
                return self._integral(expr)
            case Neg() | BinOp() | Call():
                raise AssertionError(f"{expr} has no semiring meaning (refused by make_spec)")
            case _:
                assert_never(expr)

    def _operand(self, name: str, indices: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        """A tensor's values over its distinct labels (a repeated index reads a diagonal)."""
        value = np.asarray(self.dense[name], dtype=self.dt)
        mask = self.stored.get(name)
        present = np.ones(value.shape, dtype=bool) if mask is None else np.asarray(mask)
        value = np.where(present, self._truth(value), self.identity)
        labels = tuple(dict.fromkeys(indices))
        letters = {x: chr(ord("a") + n) for n, x in enumerate(labels)}
        spec = "".join(letters[x] for x in indices) + "->" + "".join(letters[x] for x in labels)
        if len(labels) != len(indices):
            value, present = np.einsum(spec, value).copy(), np.einsum(spec, present).copy()
        return value, present

    def _close(
        self, expr: Expr, value: np.ndarray, present: np.ndarray, labels: tuple[str, ...]
    ) -> Node:
        """Reduce the summed indices whose every use lies inside ``expr``."""
        inside = Counter(x for a in accesses(expr) for x in a.indices)
        done = tuple(x for x in labels if x not in self.lhs and inside[x] == self.uses[x])
        if not done:
            return value, present, labels
        return self.reduce(value, present, labels, done)

    def reduce(
        self, value: np.ndarray, present: np.ndarray, labels: tuple[str, ...], over: tuple[str, ...]
    ) -> Node:
        axes = tuple(labels.index(x) for x in over)
        value = np.asarray(value, dtype=self.dt)
        for axis in sorted(axes, reverse=True):
            # numpy sums small integers in a wider type: cast back, the same value modulo
            # 2^bits as the kernel's wrapping sum (or, for bool: nonzero)
            value = (
                self._truth(self.np_add.reduce(value, axis=axis))
                if value.shape[axis]
                else np.full(value.shape[:axis] + value.shape[axis + 1 :], self.identity)
            )
        present = np.any(present, axis=axes)
        kept = tuple(x for x in labels if x not in over)
        return self._truth(value), present, kept

    def _integral(self, expr: Neg | BinOp | Call) -> Node:
        """``-``, ``/`` and the integral functions of a plus_times kernel in an integral
        type: present as docs/semantics.md says (``-``, ``max`` and ``min`` where either
        operand is, a quotient where its numerator is, ``abs``, ``relu`` and ``sign`` where
        their operand is), 0 where absent; each result wraps to the type."""
        parts = [self.node(x) for x in _operands(expr)]
        labels = tuple(dict.fromkeys(x for _, _, ls in parts for x in ls))
        values = [_align(v, ls, labels) for v, _, ls in parts]
        presence = [_align(p, ls, labels) for _, p, ls in parts]
        dt, zero = self.dt, self.dt.type(0)
        with np.errstate(all="ignore"):
            match expr:
                case Neg():
                    value, present = np.subtract(zero, values[0], dtype=dt), presence[0]
                case BinOp(op="-"):
                    value, present = np.subtract(*values, dtype=dt), presence[0] | presence[1]
                case BinOp(op="/"):
                    value, present = integral_divide(values[0], values[1], dt), presence[0]
                case Call(fn="max" | "min" as fn):
                    pick = np.maximum if fn == "max" else np.minimum
                    value, present = pick(*values).astype(dt), presence[0] | presence[1]
                case Call(fn="abs" | "relu") if dt.kind != "i":
                    value, present = values[0], presence[0]  # never negative
                case Call(fn="abs"):
                    negated = np.subtract(zero, values[0], dtype=dt)  # wraps: abs(-128) = -128
                    value, present = np.where(values[0] < 0, negated, values[0]), presence[0]
                case Call(fn="relu"):
                    value, present = np.where(values[0] < 0, zero, values[0]), presence[0]
                case Call(fn="sign"):
                    signs = np.sign(values[0]) if dt.kind == "i" else values[0] != 0
                    value, present = np.asarray(signs).astype(dt), presence[0]
                case _:
                    raise AssertionError(f"{expr} is refused in an integral type")
        value = np.where(present, np.asarray(value, dtype=dt), zero)
        return self._close(expr, value, present, labels)


#: the structural multiplies numpy has no ufunc for: ``pair`` (1) and ``second`` (b)
_MULTIPLIES: dict[str, Any] = {
    "pair": lambda a, b: np.ones(np.broadcast_shapes(np.shape(a), np.shape(b)), dtype=np.int8),
    "second": lambda a, b: np.broadcast_arrays(a, b)[1],
}


def _operands(expr: Neg | BinOp | Call) -> tuple[Expr, ...]:
    match expr:
        case Neg(operand=x):
            return (x,)
        case BinOp(left=left, right=right):
            return left, right
        case Call(args=args):
            return args


def in_type(value: float, dt: np.dtype) -> Any:
    """A semiring's identity in ``dt``: an integral type's infinities are its limits."""
    if dt.kind not in "biu" or not np.isinf(value):
        return dt.type(value)
    info = (0, 1) if dt.kind == "b" else (np.iinfo(dt).min, np.iinfo(dt).max)
    return dt.type(info[1] if value > 0 else info[0])


def integral_divide(a: np.ndarray, b: np.ndarray, dt: np.dtype) -> np.ndarray:
    """``a / b`` in the integral type ``dt`` as kernels divide (docs/semantics.md):
    truncated toward zero; ``x / 0`` the type's largest value for ``x > 0``, its smallest
    for ``x < 0``, 0 for 0; the smallest value / -1 wraps to itself."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=dt), np.asarray(b, dtype=dt))
    zero = dt.type(0)
    signed = dt.kind == "i"
    minus_one = (b == dt.type(-1)) if signed else np.zeros(b.shape, dtype=bool)
    safe = np.where((b == 0) | minus_one, dt.type(1), b).astype(dt)
    with np.errstate(all="ignore"):
        quotient = np.floor_divide(a, safe)
        if signed:  # floor to truncation: one up where the signs differ and it is inexact
            inexact = (np.remainder(a, safe) != 0) & ((a < 0) != (safe < 0))
            quotient = quotient + inexact.astype(dt)
            quotient = np.where(minus_one, np.subtract(zero, a, dtype=dt), quotient)
    high, low = in_type(np.inf, dt), in_type(-np.inf, dt)
    by_zero = np.where(a == 0, zero, np.where(a > 0, high, low)).astype(dt)
    return np.where(b == 0, by_zero, quotient).astype(dt)


def _align(t: np.ndarray, labels: tuple[str, ...], target: tuple[str, ...]) -> np.ndarray:
    """``t`` with its axes in ``target`` order and size-1 axes for labels it lacks."""
    t = np.asarray(t)
    perm = [labels.index(x) for x in target if x in labels]
    t = np.transpose(t, perm) if perm else t
    shape = []
    it = iter(t.shape)
    for x in target:
        shape.append(next(it) if x in labels else 1)
    return t.reshape(shape)
