"""A statement over mapped formats rewritten over level spaces (the MLIR sparsifier's
"demapping"): every later stage sees ordinary tensors whose modes are their levels.

A tensor in a `MappedFormat` (``bsr(4,4)``, ``nm(2,4)``) stores ``d floordiv B`` and
``d mod B`` of a dimension in two levels. The rewrite splits each such index variable ``i``
into an outer ``i0`` and an inner ``i1`` (``i = i0 * B + i1``) everywhere in the statement:

* the mapped tensor's access becomes its level space's, one variable per level
  (``A(i,j)`` -> ``A(i0,j0,i1,j1)`` for bsr); a slot level gets a variable of its own per
  access, summed where that access stands, which is exact because one slot holds a given
  coordinate (padding adds zeros);
* every other access of a split variable splits that mode in place (``x(j)`` ->
  ``x(j0,j1)``): a view of a dense operand or output, and of a sparse tensor's dense level
  (two dense levels store the same positions); a split mode stored in a compressed or
  singleton level of a tensor without the map is refused, as is a variable that two maps
  split by different blocks.

`Demapped` keeps what a call needs to carry the user's tensors into the level spaces and
the result back (`sparsec.runtime.mapped_io`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..base.errors import FormatError, NotationError, ShapeError
from ..frontend.notation import Access, Assignment, BinOp, Call, Expr, Neg
from ..tensors.formats import Dense, Format, LevelFormat, parse_format
from ..tensors.maps import DIV, PLAIN, SLOT, MappedFormat, looks_mapped, parse_mapped


@dataclass(frozen=True)
class Split:
    """How one tensor of the user's statement reaches its level space: ``mapped`` (its
    map) or ``blocks`` (per mode, the block it is split by, or 0), with ``plain``, its
    format as the user gave it (None: dense)."""

    mapped: MappedFormat | None
    blocks: tuple[int, ...]
    plain: Format | None

    def level_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.mapped is not None:
            return self.mapped.level_shape(shape)
        out: list[int] = []
        for size, block in zip(shape, self.blocks, strict=True):
            out.extend((size // block, block) if block else (size,))
        return tuple(out)

    def user_shape(self, level_shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.mapped is not None:
            return self.mapped.dims_of(level_shape)
        out, k = [], 0
        for block in self.blocks:
            out.append(level_shape[k] * level_shape[k + 1] if block else level_shape[k])
            k += 2 if block else 1
        return tuple(out)


@dataclass(frozen=True)
class Demapped:
    """The level-space statement and formats, and each tensor's `Split`."""

    assignment: Assignment
    formats: dict[str, Format]
    #: the formats as the user gave them (what `Kernel.formats` reports)
    user_formats: dict[str, Format | MappedFormat]
    splits: dict[str, Split]
    #: each split variable -> its block
    blocks: dict[str, int]
    #: each split variable -> its (outer, inner) variables
    parts: dict[str, tuple[str, str]]
    #: each slot level's variable -> its width
    slots: dict[str, int]
    #: each tensor of the user's statement -> its order
    orders: dict[str, int]

    def level_dims(self, dims: Mapping[str, int] | None) -> dict[str, int]:
        """Extents of the level-space variables for the user's ``dims`` (the inner part of
        each split variable and each slot always have theirs)."""
        out = {v: n for v, n in (dims or {}).items() if v not in self.parts}
        for v, (outer, inner) in self.parts.items():
            out[inner] = self.blocks[v]
            if dims and v in dims:
                if dims[v] % self.blocks[v]:
                    raise ShapeError(
                        f"extent {v}={dims[v]} is not a multiple of its block {self.blocks[v]}"
                    )
                out[outer] = dims[v] // self.blocks[v]
        out.update(self.slots)
        return out

    def user_dims(self, dims: Mapping[str, int]) -> dict[str, int]:
        """The user's extents from the level space's."""
        out = {v: n for v, n in dims.items() if v not in self.slots}
        for v, (outer, inner) in self.parts.items():
            out[v] = out.pop(outer) * out.pop(inner)
        return out

    def user_format(self, name: str) -> Format | MappedFormat:
        """``name``'s format as the user gave it (dense where none was given)."""
        return self.user_formats.get(name) or parse_format("dense", self.orders[name])

    def said(self) -> tuple[str, ...]:
        """The header's lines: each split index and each mapped tensor's level space."""
        lines = [f"{v} = {o} * {self.blocks[v]} + {i}" for v, (o, i) in self.parts.items()]
        for name, split in self.splits.items():
            if split.mapped is not None:
                access = next(a for a in self.assignment.accesses() if a.name == name)
                lines.append(f"{name} is {split.mapped}, stored over its levels as {access}")
        return tuple(lines)


def demap(assignment: Assignment, formats: Any, mask: str = "") -> Demapped | None:
    """The rewrite of ``assignment`` (see the module), or None where no format is mapped."""
    if not isinstance(formats, Mapping) or not any(looks_mapped(f) for f in formats.values()):
        return None
    orders = {a.name: a.order for a in assignment.accesses()}
    user: dict[str, Format | MappedFormat] = {}
    for name, spec in formats.items():
        if name not in orders:
            return None  # `make_spec` names the stray tensor
        user[name] = (parse_mapped if looks_mapped(spec) else parse_format)(
            spec, orders[name], name
        )
    mapped = {n: f for n, f in user.items() if isinstance(f, MappedFormat)}
    if not mapped:
        return None  # every map only permuted: plain formats
    if mask:
        raise FormatError(
            f"mask= with mapped formats ({', '.join(f'{n}: {f}' for n, f in mapped.items())}) "
            "is not supported yet; store the masked tensors in a format without a map"
        )
    blocks = _blocks(assignment, mapped)
    taken = set(orders) | {i for a in assignment.accesses() for i in a.indices}
    parts = {v: (_fresh(f"{v}0", taken), _fresh(f"{v}1", taken)) for v in blocks}
    splits: dict[str, Split] = {}
    new_formats: dict[str, Format] = {}
    for name, order in orders.items():
        fmt = user.get(name)
        if isinstance(fmt, MappedFormat):
            splits[name] = Split(fmt, (), None)
            new_formats[name] = fmt.inner
            continue
        access = next(a for a in assignment.accesses() if a.name == name)
        cut = tuple(blocks.get(v, 0) for v in access.indices)
        if any(cut):
            plain = fmt if fmt is not None and not fmt.is_dense else None
            splits[name] = Split(None, cut, plain)
            new_formats[name] = _split_format(name, fmt or parse_format("dense", order), cut)
        elif fmt is not None:
            new_formats[name] = fmt
    slots = iter(range(1 << 30))
    widths: dict[str, int] = {}

    def rewrite(access: Access) -> Access:
        fmt = mapped.get(access.name)
        if fmt is not None:
            names = []
            for e in fmt.exprs:
                if e.op == SLOT:
                    names.append(_fresh(f"s{next(slots)}", taken))
                    widths[names[-1]] = e.block
                else:
                    v = access.indices[e.dim]
                    names.append(v if e.op == PLAIN else parts[v][0 if e.op == DIV else 1])
            return replace(access, indices=tuple(names), index_spans=())
        if not any(v in parts for v in access.indices):
            return access
        indices = tuple(x for v in access.indices for x in (parts[v] if v in parts else (v,)))
        return replace(access, indices=indices, index_spans=())

    for name in orders:
        if name in splits and splits[name].mapped is None:
            _same_split_everywhere(assignment, name, blocks)
    rewritten = replace(
        assignment, lhs=rewrite(assignment.lhs), rhs=_map_accesses(assignment.rhs, rewrite)
    )
    return Demapped(rewritten, new_formats, user, splits, blocks, parts, widths, orders)


def _blocks(assignment: Assignment, mapped: Mapping[str, MappedFormat]) -> dict[str, int]:
    """Each index variable a map splits -> its block; one block per variable."""
    blocks: dict[str, int] = {}
    said: dict[str, str] = {}
    for access in assignment.accesses():
        fmt = mapped.get(access.name)
        if fmt is None:
            continue
        if len(set(access.indices)) != len(access.indices):
            raise NotationError(
                f"{access} repeats an index and {access.name} is stored as {fmt}: take the "
                "diagonal from a tensor in a format without a map",
                span=access.span,
            )
        for e in fmt.exprs:
            if e.op != DIV:
                continue
            v = access.indices[e.dim]
            if blocks.setdefault(v, e.block) != e.block:
                raise FormatError(
                    f"index {v!r} is split by {e.block} in {access.name} ({fmt}) and by "
                    f"{blocks[v]} in {said[v]}: blocks along one index must agree"
                )
            said.setdefault(v, f"{access.name} ({fmt})")
    for access in assignment.accesses():
        fmt = mapped.get(access.name)
        for e in fmt.exprs if fmt is not None else ():
            v = access.indices[e.dim] if e.op == PLAIN else ""
            if v in blocks:
                raise FormatError(
                    f"index {v!r} is split by {blocks[v]} in {said[v]}, but {access.name} "
                    f"({fmt}) stores it whole: use formats that block {v!r} alike"
                )
    return blocks


def _same_split_everywhere(assignment: Assignment, name: str, blocks: Mapping[str, int]) -> None:
    """A tensor read twice must split the same modes both times (one level space each)."""
    cuts = {
        tuple(blocks.get(v, 0) for v in a.indices) for a in assignment.accesses() if a.name == name
    }
    if len(cuts) > 1:
        raise FormatError(
            f"{name} is read with different modes split by the mapped formats' blocks in "
            f"different places; read it once, or pass it twice under two names"
        )


def _split_format(name: str, fmt: Format, cut: tuple[int, ...]) -> Format:
    """``fmt`` with each mode split by ``cut[mode]`` stored in two dense levels."""
    new_mode: list[int] = []
    k = 0
    for block in cut:
        new_mode.append(k)
        k += 2 if block else 1
    levels: list[LevelFormat] = []
    ordering: list[int] = []
    for level, mode in zip(fmt.levels, fmt.ordering, strict=True):
        if cut[mode] and not isinstance(level, Dense):
            raise FormatError(
                f"{name} stores mode {mode} in a {level} level, but a mapped format in the "
                f"statement blocks that index by {cut[mode]}: give {name} the same blocked "
                "format, or a format whose level for that mode is dense"
            )
        levels.extend([Dense(), Dense()] if cut[mode] else [level])
        ordering.extend([new_mode[mode], new_mode[mode] + 1] if cut[mode] else [new_mode[mode]])
    return Format(tuple(levels), tuple(ordering))


def _map_accesses(expr: Expr, f: Any) -> Expr:
    match expr:
        case Access():
            return f(expr)
        case Neg():
            return replace(expr, operand=_map_accesses(expr.operand, f))
        case BinOp():
            return replace(
                expr, left=_map_accesses(expr.left, f), right=_map_accesses(expr.right, f)
            )
        case Call():
            return replace(expr, args=tuple(_map_accesses(a, f) for a in expr.args))
        case _:
            return expr


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


__all__ = ["Demapped", "Split", "demap"]
