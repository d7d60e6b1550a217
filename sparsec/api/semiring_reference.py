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
) -> np.ndarray:
    """The output of ``assignment`` under ``ring``: ``dense`` holds every operand densified
    (by tensor name), ``stored`` the stored-entry mask of each sparse one; ``current`` the
    output's value before a ``+=``."""
    ev = _Evaluator(assignment, dense, stored, ring)
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
        value = ev.add(np.asarray(current, dtype=np.float64), value)
        present = np.ones(shape, dtype=bool)
    if sparse_output:
        return np.where(present, value, 0.0)
    return np.array(value, dtype=np.float64)


class _Evaluator:
    def __init__(
        self,
        assignment: Assignment,
        dense: Mapping[str, np.ndarray],
        stored: Mapping[str, np.ndarray],
        ring: Semiring,
    ) -> None:
        self.ring = ring
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
        self.np_mul: Any = getattr(np, ring.np_mul)

    def extent(self, x: str) -> int:
        return self.extents[x]

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._truth(self.np_add(a, b))

    def _truth(self, v: np.ndarray) -> np.ndarray:
        return (np.asarray(v) != 0).astype(np.float64) if self.ring.boolean else v

    def node(self, expr: Expr) -> Node:
        """``expr``'s value and presence, its own sums reduced."""
        match expr:
            case Access(name=name, indices=indices):
                value, present = self._operand(name, indices)
                return self._close(expr, value, present, indices)
            case Literal(value=v):
                one = np.ones((), dtype=bool)
                return self._truth(np.array(float(v))), one, ()
            case BinOp(op="*" | "+", left=left, right=right):
                a, pa, la = self.node(left)
                b, pb, lb = self.node(right)
                labels = tuple(dict.fromkeys((*la, *lb)))
                a, pa = _align(a, la, labels), _align(pa, la, labels)
                b, pb = _align(b, lb, labels), _align(pb, lb, labels)
                ident = self.ring.identity
                if expr.op == "*":
                    present = pa & pb
                    with np.errstate(invalid="ignore"):
                        value = np.where(present, self._truth(self.np_mul(a, b)), ident)
                else:
                    present = pa | pb
                    value = self.add(a, b)
                return self._close(expr, value, present, labels)
            case Neg() | BinOp() | Call():
                raise AssertionError(f"{expr} has no semiring meaning (refused by make_spec)")
            case _:
                assert_never(expr)

    def _operand(self, name: str, indices: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        """A tensor's values over its distinct labels (a repeated index reads a diagonal)."""
        value = np.asarray(self.dense[name], dtype=np.float64)
        mask = self.stored.get(name)
        present = np.ones(value.shape, dtype=bool) if mask is None else np.asarray(mask)
        value = np.where(present, self._truth(value), self.ring.identity)
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
        value = np.asarray(value, dtype=np.float64)
        for axis in sorted(axes, reverse=True):
            value = (
                self.np_add.reduce(value, axis=axis)
                if value.shape[axis]
                else np.full(value.shape[:axis] + value.shape[axis + 1 :], self.ring.identity)
            )
        present = np.any(present, axis=axes)
        kept = tuple(x for x in labels if x not in over)
        return self._truth(value).astype(np.float64), present, kept


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
