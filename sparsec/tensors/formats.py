"""Tensor formats: a tuple of level formats plus a mode ordering.

Vocabulary (as in TACO and the MLIR sparsifier): a tensor of order n has n *modes*
(logical axes, the positions in ``B(i,j,k)``) and n *levels* (storage axes).
Level ``k`` stores mode ``ordering[k]``. Each level format is a class that tells the
lowerer what it can do; the lowerer asks these capabilities and never tests a name.

Level letters (TACO's spelling)::

    d  dense        coordinates 0..N-1, no arrays; positions are located: p_k = p_{k-1}*N + i
    s  compressed   pos and crd arrays; iterate positions pos[p_{k-1}] .. pos[p_{k-1}+1]
    u  compressed, non-unique (a coordinate may repeat; COO's first level)
    q  singleton    crd array only; one coordinate per parent position (COO's lower levels);
                    unique when it is the last level, non-unique when a singleton follows
    p  padded singleton (TACO's CLI letter: ``Singleton(PADDED)``, ELL's last level, e.g.
                    ``ddp``): a unique singleton whose parents without an entry hold a
                    padding entry (coordinate 0, value 0). sparsec pads every singleton
                    this way when it packs one, so ``p`` reads and runs as a unique ``q``

A spec is a preset name or letters with an optional mode ordering:
``"csr"``, ``"ds"``, ``"ds:1,0"`` (= ``"d1s0"``, CSC), ``"sss"``, ``"uqq"`` (COO).

Each level format also carries its *level functions* (TACO's ``ModeFormatImpl``): the loop
IR for the position bounds of level k under its parent position, coordinate access,
locate, and append. The lowerer and the assembler call them, so each of these is written
once; they name the kernel's arrays through a `LevelNames`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from ..base.errors import FormatError
from ..ir import nodes as ir


@dataclass(frozen=True, slots=True)
class LevelNames:
    """The kernel's names for one level of one tensor: its ``pos`` and ``crd`` arrays
    (empty where the level stores none) and its extent N."""

    dim: ir.Expr
    pos: str = ""
    crd: str = ""


#: a parent position's segment of this level: (p_{k-1}, its end); singletons use the end
Parent = tuple[ir.Expr, ir.Expr] | None


@dataclass(frozen=True, slots=True)
class LevelFormat:
    """One storage level. Subclasses set the capability flags."""

    unique: bool = True

    letter: ClassVar[str] = "?"
    name: ClassVar[str] = "?"
    #: arrays this level stores, in ABI order
    arrays: ClassVar[tuple[str, ...]] = ()
    #: coordinates are iterated directly (0..N-1) and positions computed from them
    coordinate_iteration: ClassVar[bool] = False
    #: positions are iterated over a range and coordinates read from ``crd``
    position_iteration: ClassVar[bool] = False
    #: random access: position of coordinate i is computable in O(1) (`locate_position`)
    locate: ClassVar[bool] = False
    #: the position range of this level comes from the parent's position range
    #: (singleton) rather than from a ``pos`` array indexed by the parent position
    inherits_parent_range: ClassVar[bool] = False

    @property
    def spelling(self) -> str:
        return self.letter

    def __str__(self) -> str:
        return self.name if self.unique else f"{self.name}(non-unique)"

    # ------------------------------------------------------- level functions
    def bounds(self, parent: Parent, at: LevelNames) -> tuple[ir.Expr, ir.Expr]:
        """The positions ``[begin_k, end_k)`` of this level under the parent position
        ``parent`` (None: level 0, under the root)."""
        raise NotImplementedError(self.name)

    def range_bounds(self, lo: ir.Expr, hi: ir.Expr, at: LevelNames) -> tuple[ir.Expr, ir.Expr]:
        """The positions of this level under the parent positions ``[lo, hi)`` (a fused
        position space spans several parents at once)."""
        raise NotImplementedError(self.name)

    def coordinate(self, pos: ir.Expr, at: LevelNames, top: bool) -> ir.Expr:
        """The coordinate stored at position ``pos`` (``top``: this is level 0)."""
        raise NotImplementedError(self.name)

    def parent_position(self, pos: ir.Expr, at: LevelNames) -> ir.Expr | None:
        """The parent's position of position ``pos``, where it is computable (None: the
        parent's ``pos`` array must be searched)."""
        return None

    def locate_position(self, parent: ir.Expr | None, coord: ir.Expr, at: LevelNames) -> ir.Expr:
        """The position of coordinate ``coord`` under the parent position ``parent``
        (levels with the `locate` capability only)."""
        raise NotImplementedError(f"{self.name} levels cannot locate")

    def append_coord(self, pos: ir.Expr, coord: ir.Expr, at: LevelNames) -> list[ir.Stmt]:
        """Assembly: record coordinate ``coord`` at the appended position ``pos``."""
        return [ir.Assign(ir.Load(at.crd, pos), coord)] if "crd" in self.arrays else []

    def append_edges(self, parent: ir.Expr, end: ir.Expr, at: LevelNames) -> ir.Stmt:
        """Assembly: the children of parent position ``parent`` end at ``end``."""
        raise NotImplementedError(f"{self.name} levels have no edges")


@dataclass(frozen=True, slots=True)
class Dense(LevelFormat):
    letter: ClassVar[str] = "d"
    name: ClassVar[str] = "dense"
    coordinate_iteration: ClassVar[bool] = True
    locate: ClassVar[bool] = True

    def bounds(self, parent: Parent, at: LevelNames) -> tuple[ir.Expr, ir.Expr]:
        lo = ir.mul(parent[0], at.dim) if parent else ir.IntLit(0)
        return lo, ir.add(lo, at.dim)

    def range_bounds(self, lo: ir.Expr, hi: ir.Expr, at: LevelNames) -> tuple[ir.Expr, ir.Expr]:
        return ir.mul(lo, at.dim), ir.mul(hi, at.dim)

    def coordinate(self, pos: ir.Expr, at: LevelNames, top: bool) -> ir.Expr:
        return pos if top else ir.Bin("%", pos, at.dim)

    def parent_position(self, pos: ir.Expr, at: LevelNames) -> ir.Expr | None:
        return ir.Bin("/", pos, at.dim)

    def locate_position(self, parent: ir.Expr | None, coord: ir.Expr, at: LevelNames) -> ir.Expr:
        """``p_k = p_{k-1} * N + i`` (``i`` itself at level 0)."""
        return coord if parent is None else ir.add(ir.mul(parent, at.dim), coord)


def dense_extent(dims: Iterable[ir.Expr]) -> ir.Expr:
    """The positions of consecutive dense levels of extents ``dims`` under one parent
    position (the product of the extents: each locates ``p_k = p_{k-1} * N_k + i_k``)."""
    size: ir.Expr = ir.IntLit(1)
    for dim in dims:
        size = ir.mul(size, dim)
    return size


@dataclass(frozen=True, slots=True)
class Compressed(LevelFormat):
    name: ClassVar[str] = "compressed"
    arrays: ClassVar[tuple[str, ...]] = ("pos", "crd")
    position_iteration: ClassVar[bool] = True

    @property
    def spelling(self) -> str:
        return "s" if self.unique else "u"

    def bounds(self, parent: Parent, at: LevelNames) -> tuple[ir.Expr, ir.Expr]:
        """``pos[p_{k-1}] .. pos[p_{k-1} + 1]``."""
        p = parent[0] if parent else ir.IntLit(0)
        return ir.Load(at.pos, p), _end_slot(p, at)

    def range_bounds(self, lo: ir.Expr, hi: ir.Expr, at: LevelNames) -> tuple[ir.Expr, ir.Expr]:
        return ir.Load(at.pos, lo), ir.Load(at.pos, hi)

    def coordinate(self, pos: ir.Expr, at: LevelNames, top: bool) -> ir.Expr:
        return ir.Load(at.crd, pos)

    def append_edges(self, parent: ir.Expr, end: ir.Expr, at: LevelNames) -> ir.Stmt:
        """``pos[p_{k-1} + 1] = end`` (the slot `bounds` reads as the segment's end)."""
        return ir.Assign(_end_slot(parent, at), end)


def _end_slot(parent: ir.Expr, at: LevelNames) -> ir.Load:
    """``pos[p + 1]``: where the segment of parent position ``p`` ends."""
    return ir.Load(at.pos, ir.add(parent, ir.IntLit(1)))


@dataclass(frozen=True, slots=True)
class Singleton(LevelFormat):
    name: ClassVar[str] = "singleton"
    arrays: ClassVar[tuple[str, ...]] = ("crd",)
    position_iteration: ClassVar[bool] = True
    inherits_parent_range: ClassVar[bool] = True

    #: TACO's padded singleton (letter ``p``); storage and lowering are the same as a
    #: unique ``q``'s (`packing` pads the parents without an entry), the letter is kept
    padded: bool = False

    @property
    def spelling(self) -> str:
        return "p" if self.padded else "q"

    def bounds(self, parent: Parent, at: LevelNames) -> tuple[ir.Expr, ir.Expr]:
        """The parent's own segment: one coordinate per parent position."""
        assert parent is not None, "a singleton level has a parent"
        return parent

    def range_bounds(self, lo: ir.Expr, hi: ir.Expr, at: LevelNames) -> tuple[ir.Expr, ir.Expr]:
        return lo, hi

    def coordinate(self, pos: ir.Expr, at: LevelNames, top: bool) -> ir.Expr:
        return ir.Load(at.crd, pos)

    def parent_position(self, pos: ir.Expr, at: LevelNames) -> ir.Expr | None:
        return pos


@dataclass(frozen=True, slots=True)
class Format:
    """Level formats plus the mode each level stores (``ordering[k]`` = mode of level k)."""

    levels: tuple[LevelFormat, ...]
    ordering: tuple[int, ...]

    def __post_init__(self) -> None:
        if sorted(self.ordering) != list(range(len(self.levels))):
            raise FormatError(
                f"mode ordering {list(self.ordering)} is not a permutation of "
                f"0..{len(self.levels) - 1}"
            )
        for k, level in enumerate(self.levels):
            below = self.levels[k + 1] if k + 1 < len(self.levels) else None
            if not level.unique and not isinstance(below, Singleton):
                raise FormatError(
                    f"level {k} ({level}) repeats coordinates, so the level below it must be "
                    f"a singleton (as in COO 'uq'); got {below or 'nothing'}"
                )
            if isinstance(level, Singleton) and k == 0:
                raise FormatError("a singleton level needs a parent level; it cannot be level 0")
            if k > 0 and not self.levels[k - 1].unique and not isinstance(level, Singleton):
                raise FormatError(
                    f"level {k} sits under a non-unique level and must be a singleton"
                )

    @property
    def order(self) -> int:
        return len(self.levels)

    @property
    def is_dense(self) -> bool:
        return all(isinstance(level, Dense) for level in self.levels)

    @property
    def pads(self) -> bool:
        """Some singleton level holds padding: a singleton stores one coordinate per parent
        position, and under a dense parent (ELL's ``ddq``/``ddp``) a position without an
        entry is packed as coordinate 0 with value 0 — a stored zero at a coordinate that may
        also hold a real entry, harmless to ``+`` and ``*`` but a value to min/max."""
        head: LevelFormat | None = None
        for level in self.levels:
            if not isinstance(level, Singleton):
                head = level
            elif isinstance(head, Dense):
                return True
        return False

    def level_of_mode(self, mode: int) -> int:
        return self.ordering.index(mode)

    @property
    def spelling(self) -> str:
        letters = "".join(level.spelling for level in self.levels)
        if self.ordering == tuple(range(self.order)):
            return letters
        return f"{letters}:{','.join(map(str, self.ordering))}"

    def __str__(self) -> str:
        if self.is_dense and self.order and self.ordering == _identity(self.order):
            return "dense"
        for name in ("csr", "csc", "dcsr", "dcsc"):
            if self.order == 2 and PRESETS[name](2) == self:
                return name
        if self.order >= 2 and _coo(self.order) == self:
            return "coo"
        if self.order >= 3 and PRESETS["csf"](self.order) == self:
            return "csf"
        return self.spelling or "scalar"


def _levels(letters: str) -> tuple[LevelFormat, ...]:
    levels: list[LevelFormat] = []
    for k, ch in enumerate(letters):
        match ch:
            case "d":
                levels.append(Dense())
            case "s":
                levels.append(Compressed())
            case "u":
                levels.append(Compressed(unique=False))
            case "q":
                last = k == len(letters) - 1 or letters[k + 1] not in "qp"
                levels.append(Singleton(unique=last))
            case "p":
                levels.append(Singleton(unique=True, padded=True))
            case _:
                raise FormatError(f"unknown level letter {ch!r}")
    return tuple(levels)


def _identity(order: int) -> tuple[int, ...]:
    return tuple(range(order))


def _need_order(name: str, wanted: int, order: int) -> None:
    if order != wanted:
        raise FormatError(f"format {name!r} is for order-{wanted} tensors, not order {order}")


def _matrix(name: str, letters: str, ordering: tuple[int, int]):
    def make(order: int) -> Format:
        _need_order(name, 2, order)
        return Format(_levels(letters), ordering)

    return make


def _coo(order: int) -> Format:
    letters = "s" if order == 1 else "u" + "q" * (order - 1)
    return Format(_levels(letters[:order]), _identity(order))


PRESETS = {
    "dense": lambda n: Format(_levels("d" * n), _identity(n)),
    "csr": _matrix("csr", "ds", (0, 1)),
    "csc": _matrix("csc", "ds", (1, 0)),
    "dcsr": _matrix("dcsr", "ss", (0, 1)),
    "dcsc": _matrix("dcsc", "ss", (1, 0)),
    "coo": _coo,
    "csf": lambda n: Format(_levels("s" * n), _identity(n)),
    "sparse": lambda n: Format(_levels("s" * n), _identity(n)),
    "compressed": lambda n: Format(_levels("s" * n), _identity(n)),
}

_LETTERS_WITH_ORDER = re.compile(r"^([dsuqp]+)(?::(\d+(?:,\d+)*))?$")
_INTERLEAVED = re.compile(r"^(?:[dsuqp]\d+)+$")

FORMAT_HELP = (
    "a preset (dense, csr, csc, dcsr, dcsc, coo, csf) or level letters d/s/u/q/p with an "
    "optional mode ordering, e.g. 'ds', 'sss', 'uqq', 'ddp' (ELL), 'ds:1,0' or 'd1s0'"
)


def parse_format(spec: str | Format, order: int, tensor: str = "") -> Format:
    """Resolve a user format spec for a tensor of the given order."""
    where = f" for tensor {tensor!r}" if tensor else ""
    if isinstance(spec, Format):
        if spec.order != order:
            raise FormatError(
                f"format {spec.spelling!r}{where} has {_count(spec.order, 'level')} but the "
                f"tensor has order {order}"
            )
        return spec
    if not isinstance(spec, str):
        raise FormatError(f"format{where} must be a string or Format, not {type(spec).__name__}")
    text = spec.strip().lower().replace(" ", "")
    try:
        if text in PRESETS:
            return PRESETS[text](order)
        if order == 0 and text in ("", "scalar"):
            return Format((), ())
        if m := _LETTERS_WITH_ORDER.match(text):
            letters, ordering_text = m.groups()
            ordering = (
                tuple(int(x) for x in ordering_text.split(","))
                if ordering_text
                else _identity(len(letters))
            )
            if len(ordering) != len(letters):
                raise FormatError(
                    f"{len(letters)} level letters but {len(ordering)} entries in the ordering"
                )
            fmt = Format(_levels(letters), ordering)
        elif _INTERLEAVED.match(text):
            letters = "".join(re.findall(r"[dsuqp]", text))
            ordering = tuple(int(x) for x in re.findall(r"\d+", text))
            fmt = Format(_levels(letters), ordering)
        else:
            raise FormatError(f"unknown format {spec!r}; expected {FORMAT_HELP}")
    except FormatError as err:
        raise FormatError(f"bad format {spec!r}{where}: {err.message}") from None
    if fmt.order != order:
        raise FormatError(
            f"format {spec!r}{where} has {_count(fmt.order, 'level')} but the tensor has order "
            f"{order}"
        )
    return fmt


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


_CANONICAL: dict[Format, Format] = {}


def canonical(fmt: Format) -> Format:
    """One shared instance per distinct format, so that a kernel call can compare a
    tensor's format with the one it was compiled for by identity (``is``) instead of a
    field-by-field comparison (about a microsecond per call)."""
    return _CANONICAL.setdefault(fmt, fmt)


def default_sparse(order: int) -> Format:
    """The sparse format a tensor gets when the user names none: s, ds (CSR), sss (CSF)."""
    if order == 0:
        return Format((), ())
    if order == 2:
        return PRESETS["csr"](2)
    return PRESETS["csf"](order)


def dense(order: int) -> Format:
    return PRESETS["dense"](order)
