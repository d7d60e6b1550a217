"""Formats whose levels store expressions of the dimensions: BSR, N:M, a map spelled out.

A `Format` stores each mode in one level (its ordering is a permutation). A `MappedFormat`
maps a tensor's *dimensions* to *levels* as the MLIR sparsifier does: each level stores
one `LevelExpr` -- a dimension ``d``, ``d floordiv B`` or ``d mod B`` -- or a *slot* (the
k-th stored entry of its parent, ELL's middle level). Under the map the tensor is an
ordinary tensor over its levels (its *level space*), stored as `inner` (a `Format` with
the identity ordering over the level-space modes); a coordinate is rebuilt from its
levels (``i = ib * B + ii``). `sparsec.middle.demap` rewrites a statement over such
tensors into one over level spaces, so no later stage sees a map.

Named formats (matrices; N:M also for higher orders, along the last dimension)::

    bsr(R,C)   (i, j) -> (i floordiv R : dense, j floordiv C : compressed,
                          i mod R : dense, j mod C : dense)          R x C dense blocks
    nm(N,M)    (i, j) -> (i : dense, j floordiv M : dense, slot N : dense,
                          j mod M : padded singleton)               N stored in every M

The map spelled out: ``"(i,j) -> (i/4 : d, j/4 : s, i%4 : d, j%4 : d)"`` (``floordiv`` and
``mod`` may be written out; level letters as in `formats`, or their names). A map that only
permutes is the plain `Format` with that ordering.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..base.errors import FormatError, ShapeError
from .formats import Format, _levels

#: the operations a level expression may apply to its dimension
PLAIN, DIV, MOD, SLOT = "", "floordiv", "mod", "slot"


@dataclass(frozen=True, slots=True)
class LevelExpr:
    """What one level stores: ``dim`` (``op`` PLAIN), ``dim floordiv block``, ``dim mod
    block``, or (``op`` SLOT, no dimension) the position among its parent's ``block``
    stored entries."""

    dim: int
    op: str = PLAIN
    block: int = 1

    def extent(self, shape: Sequence[int]) -> int:
        if self.op == SLOT:
            return self.block
        size = shape[self.dim]
        return size // self.block if self.op == DIV else self.block if self.op == MOD else size

    def spelled(self, names: Sequence[str]) -> str:
        if self.op == SLOT:
            return f"slot {self.block}"
        name = names[self.dim]
        return f"{name} {self.op} {self.block}" if self.op else name


@dataclass(frozen=True, slots=True)
class MappedFormat:
    """A tensor of ``order`` dimensions stored over ``len(exprs)`` levels (see the module)."""

    order: int
    exprs: tuple[LevelExpr, ...]
    #: the level-space format: one level per expression, identity ordering
    inner: Format
    #: the name it was given ("bsr(4,4)") or its spelled-out map
    name: str

    def __post_init__(self) -> None:
        if len(self.exprs) != self.inner.order:
            raise FormatError(
                f"{self.name}: {len(self.exprs)} level expressions, "
                f"{self.inner.order} level formats"
            )
        for dim in range(self.order):
            ops = [(e.op, e.block) for e in self.exprs if e.dim == dim and e.op != SLOT]
            if ops in ([(PLAIN, 1)],):
                continue
            kinds = [op for op, _ in ops]
            if kinds != [DIV, MOD] or ops[0][1] != ops[1][1] or ops[0][1] < 1:
                got = ", ".join(f"{op} {b}" if op else "itself" for op, b in ops) or "nothing"
                raise FormatError(
                    f"{self.name}: dimension {dim} must be stored once as itself, or as "
                    f"'floordiv B' and then 'mod B' with one block B >= 1; got {got}"
                )
        for e in self.exprs:
            if e.op == SLOT and e.block < 1:
                raise FormatError(f"{self.name}: a slot level needs a width >= 1")

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"MappedFormat({self.name!r})"

    @property
    def spelling(self) -> str:
        return self.name

    @property
    def is_dense(self) -> bool:
        return False

    def blocks(self) -> dict[int, int]:
        """Each dimension stored in two levels -> its block B."""
        return {e.dim: e.block for e in self.exprs if e.op == DIV}

    def slots(self) -> tuple[int, ...]:
        """The levels that store a slot."""
        return tuple(k for k, e in enumerate(self.exprs) if e.op == SLOT)

    def check_shape(self, shape: Sequence[int], name: str = "") -> None:
        if len(shape) != self.order:
            raise ShapeError(
                f"{_who(name)}format {self.name} is for order-{self.order} tensors, not "
                f"shape {tuple(shape)}"
            )
        for dim, block in self.blocks().items():
            if shape[dim] % block:
                raise ShapeError(
                    f"{_who(name)}shape {tuple(shape)} does not divide into {self.name}'s "
                    f"blocks: dimension {dim} has {shape[dim]}, not a multiple of {block}; "
                    f"pad the tensor to a multiple of {block} or choose a block that divides it"
                )

    def level_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        return tuple(e.extent(shape) for e in self.exprs)

    def dims_of(self, level_shape: Sequence[int]) -> tuple[int, ...]:
        """The tensor's shape from its level-space shape."""
        out = [0] * self.order
        for e, size in zip(self.exprs, level_shape, strict=True):
            if e.op == PLAIN:
                out[e.dim] = size
            elif e.op == DIV:
                out[e.dim] = size * e.block
        return tuple(out)

    def level_coords(self, coords: np.ndarray) -> list[np.ndarray | None]:
        """Each level's coordinates of entries at dimension ``coords`` ``(order, nnz)``
        (None for a slot: its value depends on the other entries, `mapped.slot_numbers`)."""
        out: list[np.ndarray | None] = []
        for e in self.exprs:
            if e.op == SLOT:
                out.append(None)
            else:
                c = coords[e.dim]
                out.append(c // e.block if e.op == DIV else c % e.block if e.op == MOD else c)
        return out

    def dim_coords(self, level_coords: Sequence[np.ndarray]) -> np.ndarray:
        """Dimension coordinates ``(order, nnz)`` rebuilt from level coordinates."""
        n = len(level_coords[0]) if level_coords else 0
        out = np.zeros((self.order, n), dtype=np.int64)
        for e, c in zip(self.exprs, level_coords, strict=True):
            if e.op == PLAIN or e.op == MOD:
                out[e.dim] += c
            elif e.op == DIV:
                out[e.dim] += np.asarray(c, dtype=np.int64) * e.block
        return out


#: `sparsec.tensors.mapped.construct`, registered on its import (`tensor` cannot import
#: `mapped`, which builds on it): the public constructors call it for a mapped format
MAPPED: list[Callable[..., Any]] = []


def _who(name: str) -> str:
    return f"tensor {name!r}: " if name else ""


_BSR = re.compile(r"^bsr\((\d+),(\d+)\)$")
_NM = re.compile(r"^nm\((\d+),(\d+)\)$")
_MAP = re.compile(r"^\s*\(([^)]*)\)\s*->\s*\((.*)\)\s*$")
_EXPR = re.compile(r"^\s*([a-z_]\w*?)\s*(?:(/|%|\sfloordiv|\smod)\s*(\d+))?\s*$")
_LETTER_NAMES = {"dense": "d", "compressed": "s", "singleton": "q", "padded": "p"}

NAMED_HELP = "'bsr(R,C)' (R x C blocks), 'nm(N,M)' (N stored in every M along the last mode)"


def looks_mapped(spec: object) -> bool:
    """Whether a format spec names a map (a `MappedFormat`, bsr/nm, or a spelled map)."""
    if isinstance(spec, MappedFormat):
        return True
    if not isinstance(spec, str):
        return False
    text = spec.strip().lower().replace(" ", "")
    return bool(_BSR.match(text) or _NM.match(text) or "->" in text)


def parse_mapped(spec: str | MappedFormat, order: int, tensor: str = "") -> MappedFormat | Format:
    """A mapped format spec for a tensor of ``order`` dimensions (a map that only permutes
    is returned as the plain `Format`)."""
    where = f" for tensor {tensor!r}" if tensor else ""
    if isinstance(spec, MappedFormat):
        if spec.order != order:
            raise FormatError(
                f"format {spec.name}{where} is for order-{spec.order} tensors, not order {order}"
            )
        return spec
    text = spec.strip().lower().replace(" ", "")
    try:
        if m := _BSR.match(text):
            r, c = int(m[1]), int(m[2])
            if order != 2:
                raise FormatError(f"bsr is for matrices (order 2), not order {order}")
            if r < 1 or c < 1:
                raise FormatError("block sizes must be at least 1")
            exprs = (
                LevelExpr(0, DIV, r),
                LevelExpr(1, DIV, c),
                LevelExpr(0, MOD, r),
                LevelExpr(1, MOD, c),
            )
            return MappedFormat(2, exprs, Format(_levels("dsdd"), (0, 1, 2, 3)), f"bsr({r},{c})")
        if m := _NM.match(text):
            n, mm = int(m[1]), int(m[2])
            if not 1 <= n <= mm:
                raise FormatError(f"N:M needs 1 <= N <= M, got {n}:{mm}")
            if order < 1:
                raise FormatError("nm needs a tensor of order 1 or more")
            last = order - 1
            nm_exprs = (
                *(LevelExpr(d) for d in range(last)),
                LevelExpr(last, DIV, mm),
                LevelExpr(-1, SLOT, n),
                LevelExpr(last, MOD, mm),
            )
            letters = "d" * (order + 1) + "p"
            inner = Format(_levels(letters), tuple(range(len(letters))))
            return MappedFormat(order, nm_exprs, inner, f"nm({n},{mm})")
        if m := _MAP.match(spec.lower()):
            return _spelled(m[1], m[2], order, spec.strip())
    except FormatError as err:
        raise FormatError(f"bad format {spec!r}{where}: {err.message}") from None
    raise FormatError(f"unknown format {spec!r}{where}; mapped formats are {NAMED_HELP}")


def _spelled(dims_text: str, levels_text: str, order: int, spelled: str) -> MappedFormat | Format:
    names = [n.strip() for n in dims_text.split(",")] if dims_text.strip() else []
    if len(names) != order or len(set(names)) != order:
        raise FormatError(f"the map names {len(names)} distinct dimensions; the tensor has {order}")
    exprs, letters = [], []
    for part in levels_text.split(","):
        expr, colon, letter = part.partition(":")
        letter = _LETTER_NAMES.get(letter.strip(), letter.strip())
        if not colon or letter not in ("d", "s", "u", "q", "p"):
            raise FormatError(
                f"level {part!r}: write 'expression : level', the level one of d, s, u, q, p "
                "(or dense, compressed, singleton, padded)"
            )
        m = _EXPR.match(expr)
        if not m or m[1] not in names:
            raise FormatError(
                f"level expression {expr!r}: a dimension ({', '.join(names)}), 'd / B' or "
                "'d % B' (or 'd floordiv B', 'd mod B')"
            )
        op = {None: PLAIN, "/": DIV, "floordiv": DIV, "%": MOD, "mod": MOD}[m[2] and m[2].strip()]
        exprs.append(LevelExpr(names.index(m[1]), op, int(m[3]) if m[3] else 1))
        letters.append(letter)
    if all(e.op == PLAIN for e in exprs) and len(exprs) == order:
        return Format(_levels("".join(letters)), tuple(e.dim for e in exprs))
    inner = Format(_levels("".join(letters)), tuple(range(len(letters))))
    return MappedFormat(order, tuple(exprs), inner, spelled)
