"""A kernel call over mapped formats: the user's tensors carried into the level spaces of
`sparsec.middle.demap`'s statement, and the result carried back.

A mapped operand is converted to its format once (`tensors.mapped.as_mapped`: a
`MappedTensor` in it is taken as it is) and its level-space tensor is passed. A dense
operand or output whose modes are split is reshaped, a view where its memory allows (a
C-ordered array always does); a sparse one whose split modes are dense levels keeps its
arrays under the longer shape. The dense result is reshaped back (a view), a mapped
result wrapped as a `MappedTensor`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base.errors import ShapeError
from ..middle.demap import Demapped, Split
from ..tensors.formats import Format
from ..tensors.mapped import MappedTensor, as_mapped
from ..tensors.storage import LevelStorage
from ..tensors.tensor import Tensor, as_tensor


def to_levels(demapped: Demapped, inputs: dict[str, Any]) -> dict[str, Any]:
    """The inputs of the level-space kernel for the user's ``inputs``."""
    out = dict(inputs)
    for name, value in inputs.items():
        split = demapped.splits.get(name)
        if split is None:
            continue
        if split.mapped is not None:
            out[name] = as_mapped(value, split.mapped, name).inner
        elif split.plain is not None:
            out[name] = _expand(as_tensor(value, split.plain, name=name), split, name)
        else:
            out[name] = _reshaped(value, split, name)
    return out


def from_levels(demapped: Demapped, name: str, result: Any) -> Any:
    """The user's result for the level-space kernel's ``result`` for tensor ``name``."""
    split = demapped.splits.get(name)
    if split is None or result is None:
        return result
    if split.mapped is not None:
        return MappedTensor(split.mapped.dims_of(result.shape), split.mapped, result)
    shape = split.user_shape(tuple(result.shape))
    if isinstance(result, Tensor):
        assert split.plain is not None
        kept = [st for st, level in zip(result.levels, _kept(split), strict=True) if level]
        return Tensor(shape, split.plain, tuple(kept), result.vals, result.index_dtype)
    return result.reshape(shape)


def _kept(split: Split) -> list[bool]:
    """For each level of the level-space format: whether the user's format has it (the
    second level of each split mode is the added one)."""
    assert split.plain is not None
    keep: list[bool] = []
    for mode in split.plain.ordering:
        keep.extend([True, False] if split.blocks[mode] else [True])
    return keep


def _user_shape(value: Any, split: Split, name: str) -> tuple[int, ...]:
    shape = (
        tuple(int(n) for n in np.shape(value))
        if not hasattr(value, "shape")
        else tuple(int(n) for n in value.shape)
    )
    if len(shape) != len(split.blocks):
        raise ShapeError(
            f"{name} has shape {shape}; the statement reads it with {len(split.blocks)} indices"
        )
    for mode, (size, block) in enumerate(zip(shape, split.blocks, strict=True)):
        if block and size % block:
            raise ShapeError(
                f"{name} has {size} along mode {mode}, which a mapped format in the statement "
                f"splits into blocks of {block}: its extent must be a multiple of {block}"
            )
    return shape


def _reshaped(value: Any, split: Split, name: str) -> Any:
    """A dense operand in its level space (a view where the memory allows)."""
    if isinstance(value, Tensor | MappedTensor):
        value = value.to_dense()
    elif hasattr(value, "toarray"):  # scipy sparse for a dense operand
        value = value.toarray()
    elif not hasattr(value, "reshape"):
        value = np.asarray(value)
    return value.reshape(split.level_shape(_user_shape(value, split, name)))


def _expand(t: Tensor, split: Split, name: str) -> Tensor:
    """A sparse operand whose split modes sit in dense levels: its own arrays, read under
    the level space's shape and format (two dense levels hold the positions of one)."""
    shape = split.level_shape(_user_shape(t, split, name))
    levels: list[LevelStorage] = []
    for st, mode in zip(t.levels, t.format.ordering, strict=True):
        levels.extend([st, LevelStorage()] if split.blocks[mode] else [st])
    fmt = _level_format(split, t.format)
    return Tensor(shape, fmt, tuple(levels), t.vals, t.index_dtype)


def _level_format(split: Split, plain: Format) -> Format:
    from ..middle.demap import _split_format

    return _split_format("", plain, split.blocks)


def random_in_user_space(demapped: Demapped, inputs: dict[str, Any]) -> dict[str, Any]:
    """`Kernel.random_inputs` of the level-space kernel, as the user passes them."""
    return {name: from_levels(demapped, name, value) for name, value in inputs.items()}
