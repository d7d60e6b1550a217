"""An independent oracle for the semiring and sum-placement fuzz (tests/test_fuzz_semirings.py),
written from docs/semantics.md with explicit loops, not from sparsec's own reference code.

A statement is a tree of `Leaf`, `Op` and `Neg` nodes that the fuzz prints in explicit
parentheses (so sparsec parses the same tree). Its meaning, per docs/semantics.md:

* each summed index (on the right-hand side, not on the left) is reduced at the smallest
  subtree holding all its uses, with the semiring's add, over the terms that are present;
  such a sum is present where some term is;
* a sparse operand is present at its stored entries (an explicit zero included), a dense
  one everywhere; ``*`` needs both operands, ``+`` and ``-`` either (a lone operand keeps
  its value, `-` negates a lone right operand); an absent node is never computed;
* ``or_and`` reads every value as a truth value and yields 1 or 0;
* a dense output holds the add's identity where nothing is present; ``+=`` combines the
  current value with the add (``or_and``: ``y or E``, a truth value even where no term
  reaches it); a mask ``M`` computes only where ``M`` stores an entry (``~M``: where it
  stores none), elsewhere the output is absent (``=``) or keeps its current value (``+=``).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

#: name -> (add, multiply, identity, boolean), as docs/semantics.md's table states them
RINGS: dict[
    str, tuple[Callable[[float, float], float], Callable[[float, float], float], float, bool]
] = {
    "plus_times": (lambda a, b: a + b, lambda a, b: a * b, 0.0, False),
    "min_plus": (min, lambda a, b: a + b, math.inf, False),
    "max_plus": (max, lambda a, b: a + b, -math.inf, False),
    "max_times": (max, lambda a, b: a * b, -math.inf, False),
    "min_times": (min, lambda a, b: a * b, math.inf, False),
    "or_and": (
        lambda a, b: float(bool(a) or bool(b)),
        lambda a, b: float(bool(a) and bool(b)),
        0.0,
        True,
    ),
    "plus_pair": (lambda a, b: a + b, lambda a, b: 1.0, 0.0, False),
    "any_pair": (lambda a, b: float(bool(a) or bool(b)), lambda a, b: 1.0, 0.0, True),
    "min_second": (min, lambda a, b: b, math.inf, False),
    "plus_second": (lambda a, b: a + b, lambda a, b: b, 0.0, False),
    # any one of the values: the oracle gives the least, and `any_bounds` the greatest
    "any_second": (min, lambda a, b: b, math.inf, False),
    "or_second": (lambda a, b: float(bool(a) or bool(b)), lambda a, b: float(bool(b)), 0.0, True),
}


@dataclass
class Leaf:
    name: str
    indices: tuple[str, ...]
    sums: tuple[str, ...] = ()

    def text(self) -> str:
        return f"{self.name}({','.join(self.indices)})" if self.indices else self.name


@dataclass
class Op:
    op: str
    left: Node
    right: Node
    sums: tuple[str, ...] = ()

    def text(self) -> str:
        return f"({self.left.text()} {self.op} {self.right.text()})"


@dataclass
class Neg:
    operand: Node
    sums: tuple[str, ...] = ()

    def text(self) -> str:
        return f"-{self.operand.text()}"


Node = Leaf | Op | Neg


def children(node: Node) -> tuple[Node, ...]:
    if isinstance(node, Op):
        return (node.left, node.right)
    if isinstance(node, Neg):
        return (node.operand,)
    return ()


def uses(node: Node) -> Counter[str]:
    if isinstance(node, Leaf):
        return Counter(node.indices)
    total: Counter[str] = Counter()
    for c in children(node):
        total += uses(c)
    return total


def place(root: Node, summed: set[str]) -> None:
    """Set each node's ``sums``: the summed indices whose every use lies below it and
    below none of its children (the smallest enclosing subtree)."""
    totals = uses(root)

    def visit(node: Node) -> None:
        here = uses(node)
        below = [uses(c) for c in children(node)]
        node.sums = tuple(
            sorted(
                x
                for x in summed
                if here[x] == totals[x] and not any(b[x] == totals[x] for b in below)
            )
        )
        for c in children(node):
            visit(c)

    visit(root)


@dataclass
class Operand:
    """A tensor's values (dense, mode order) and where it stores an entry."""

    values: np.ndarray
    stored: np.ndarray = field(default_factory=lambda: np.ones((), dtype=bool))


class Oracle:
    def __init__(self, ring: str, operands: Mapping[str, Operand], extents: Mapping[str, int]):
        self.add, self.mul, self.identity, self.boolean = RINGS[ring]
        self.operands = operands
        self.extents = extents

    def truth(self, v: float) -> float:
        return float(v != 0) if self.boolean else v

    def number(self, x: object) -> float:
        return float(x)  # type: ignore[arg-type]

    def empty(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape)

    def node(self, node: Node, env: dict[str, int]) -> tuple[bool, float]:
        """(present, value) of ``node`` at ``env``, its own sums taken."""
        if not node.sums:
            return self._core(node, env)
        present, acc = False, self.identity
        for point in itertools.product(*(range(self.extents[x]) for x in node.sums)):
            inner = dict(env, **dict(zip(node.sums, point, strict=True)))
            p, v = self._core(node, inner)
            if p:
                acc = v if not present else self.add(acc, v)
                present = True
        return present, (acc if present else 0.0)

    def _core(self, node: Node, env: dict[str, int]) -> tuple[bool, float]:
        if isinstance(node, Leaf):
            t = self.operands[node.name]
            at = tuple(env[x] for x in node.indices)
            stored = bool(t.stored[at]) if t.stored.ndim else True
            return stored, (self.truth(float(t.values[at])) if stored else 0.0)
        if isinstance(node, Neg):
            p, v = self.node(node.operand, env)
            return p, (-v if p else 0.0)
        pa, a = self.node(node.left, env)
        pb, b = self.node(node.right, env)
        if node.op == "*":
            return (pa and pb), (self.mul(a, b) if pa and pb else 0.0)
        if node.op == "+":
            if pa and pb:
                return True, self.add(a, b)
            return (pa or pb), (a if pa else b if pb else 0.0)
        assert node.op == "-"  # plus_times only
        if pa and pb:
            return True, a - b
        return (pa or pb), (a if pa else -b if pb else 0.0)

    def output(
        self,
        root: Node,
        free: tuple[str, ...],
        accumulate: bool,
        current: Operand | None,
        mask: tuple[bool, np.ndarray] | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The output's values and where it holds an entry (dense: everywhere, absent
        elements holding the identity)."""
        shape = tuple(self.extents[x] for x in free)
        values = self.empty(shape)
        present = np.zeros(shape, dtype=bool)
        for at in itertools.product(*(range(n) for n in shape)):
            p, v = self.node(root, dict(zip(free, at, strict=True)))
            allowed = True
            if mask is not None:
                complement, pattern = mask
                allowed = bool(pattern[at]) != complement
            have = current is not None and bool(current.stored[at] if current.stored.ndim else True)
            old = self.number(current.values[at]) if current is not None else 0.0
            if not allowed:
                p = False
                if accumulate:  # outside the mask the current value is kept as it is
                    values[at], present[at] = (old if have else 0.0), have
                    continue
            if accumulate and have:
                values[at] = self.add(self.truth(old), v if p else self.identity)
                present[at] = True
            else:
                values[at], present[at] = (v if p else 0.0), p
        return values, present


class TypedOracle(Oracle):
    """The oracle in an integral value type (docs/semantics.md, "Value types"), in Python
    integers: every operation's result wraps to the type (modulo 2^bits; bool: nonzero is
    1), a semiring's infinite identity is the type's largest (``+inf``) or smallest
    (``-inf``) value, and ``/`` divides as the docs say (truncated toward zero; ``x / 0``
    the largest value for ``x > 0``, the smallest for ``x < 0``, 0 for 0)."""

    def __init__(
        self,
        ring: str,
        operands: Mapping[str, Operand],
        extents: Mapping[str, int],
        dtype: str,
    ):
        super().__init__(ring, operands, extents)
        self.dtype = np.dtype(dtype)
        if self.dtype.kind == "b":
            self.low, self.high = 0, 1
        else:
            info = np.iinfo(self.dtype)
            self.low, self.high = int(info.min), int(info.max)
        add, mul = self.add, self.mul
        self.add = lambda a, b: self.wrap(add(a, b))
        self.mul = lambda a, b: self.wrap(mul(a, b))
        if math.isinf(self.identity):
            self.identity = self.high if self.identity > 0 else self.low
        self.identity = int(self.identity)

    def wrap(self, v: float) -> int:
        """``v`` as the type holds it (an integer: modulo 2^bits into its range)."""
        if self.dtype.kind == "b":
            return int(v != 0)
        span = self.high - self.low + 1
        return (int(v) - self.low) % span + self.low

    def truth(self, v: float) -> int:
        return int(v != 0) if self.boolean else self.wrap(v)

    def divide(self, a: int, b: int) -> int:
        if b == 0:
            return 0 if a == 0 else (self.high if a > 0 else self.low)
        q = abs(a) // abs(b)
        return self.wrap(q if (a >= 0) == (b > 0) else -q)

    def _core(self, node: Node, env: dict[str, int]) -> tuple[bool, float]:
        if isinstance(node, Leaf):
            t = self.operands[node.name]
            at = tuple(env[x] for x in node.indices)
            stored = bool(t.stored[at]) if t.stored.ndim else True
            return stored, (self.truth(int(t.values[at])) if stored else 0)
        if isinstance(node, Neg):
            p, v = self.node(node.operand, env)
            return p, (self.wrap(-v) if p else 0)
        if node.op == "/":  # present where the numerator is (docs/semantics.md, Division)
            pa, a = self.node(node.left, env)
            _, b = self.node(node.right, env)
            return pa, (self.divide(int(a), int(b)) if pa else 0)
        if node.op == "-":
            pa, a = self.node(node.left, env)
            pb, b = self.node(node.right, env)
            return (pa or pb), self.wrap((a if pa else 0) - (b if pb else 0))
        return super()._core(node, env)

    def number(self, x: object) -> int:
        return int(x)  # type: ignore[call-overload]

    def empty(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape, dtype=np.int64).astype(object)  # Python ints: any width


def any_bounds(oracle: Oracle) -> Oracle:
    """``oracle`` adding with max: under an ``any`` add (docs/semantics.md: any one of the
    terms' values) a result is right where it lies between the oracle's (the least) and
    this one's (the greatest); both are exact where at most one term is present."""
    if isinstance(oracle, TypedOracle):
        typed = oracle
        typed.add = lambda a, b: typed.wrap(max(a, b))
    else:
        oracle.add = max
    return oracle
