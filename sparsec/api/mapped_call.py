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
from ..frontend.derivative import NotDifferentiable
from ..middle.demap import Demapped, Split
from ..tensors.formats import Format
from ..tensors.mapped import MappedTensor, as_mapped, pack_mapped
from ..tensors.maps import MappedFormat
from ..tensors.storage import LevelStorage
from ..tensors.tensor import Tensor, as_tensor
from ..tensors.tensor import random as random_tensor


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
            given = as_tensor(value, split.plain, name=name)
            out[name] = _expand(given, split, demapped.formats[name], name)
        else:
            out[name] = _reshaped(value, split, name)
    return out


def from_levels(demapped: Demapped, name: str, result: Any) -> Any:
    """The user's result for the level-space kernel's ``result`` for tensor ``name``."""
    split = demapped.splits.get(name)
    if split is None or result is None:
        return result
    if split.mapped is not None:
        if not isinstance(result, Tensor):
            raise NotDifferentiable(
                f"{name} is stored as {split.mapped}: a call whose inputs require grad cannot "
                "return it; give the output a format without a map"
            )
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


def _expand(t: Tensor, split: Split, fmt: Format, name: str) -> Tensor:
    """A sparse operand whose split modes sit in dense levels: its own arrays, read under
    the level space's shape and format ``fmt`` (two dense levels hold the positions of
    one)."""
    shape = split.level_shape(_user_shape(t, split, name))
    levels: list[LevelStorage] = []
    for st, mode in zip(t.levels, t.format.ordering, strict=True):
        levels.extend([st, LevelStorage()] if split.blocks[mode] else [st])
    return Tensor(shape, fmt, tuple(levels), t.vals, t.index_dtype)


def random_inputs(
    kernel: Any, dims: Any, seed: int, density: float
) -> tuple[dict[str, Any], dict[str, int]]:
    """`Kernel.random_inputs` over mapped formats, as the user passes them: the mapped
    tensors drawn here (`random_mapped`), the others drawn in their level spaces and
    carried back; the extents are the user's."""
    from . import check

    demapped: Demapped = kernel.demapped
    mapped = {n: s.mapped for n, s in demapped.splits.items() if s.mapped is not None}
    wanted = tuple(t for t in kernel.binder.wanted if t.argument not in mapped)
    made, extents = check.random_inputs(
        kernel.assignment,
        kernel.spec,
        wanted,
        demapped.level_dims(dims),
        seed,
        density,
        kernel.dtype,
        kernel.index_dtype,
    )
    accesses = {a.name: a for a in kernel.assignment.accesses()}
    dtype = np.float32 if kernel.dtype == "float32" else np.float64
    out = {}
    for n, t in enumerate(kernel.binder.wanted):
        fmt = mapped.get(t.argument)
        if fmt is None:
            out[t.argument] = from_levels(demapped, t.argument, made[t.argument])
            continue
        shape = fmt.dims_of(tuple(extents[v] for v in accesses[t.argument].indices))
        rng = np.random.default_rng(seed + 7919 * (n + 1))
        out[t.argument] = random_mapped(fmt, shape, density, rng, dtype, kernel.index_dtype)
    return out, demapped.user_dims(extents)


def random_mapped(
    fmt: MappedFormat,
    shape: tuple[int, ...],
    density: float,
    rng: np.random.Generator,
    dtype: Any,
    index_dtype: Any,
) -> MappedTensor:
    """A random tensor in ``fmt``: a level-space draw (``density`` of each stored level's
    coordinates: blocks for bsr, with their zeros stored), or for a slot format each
    group's entries drawn apart, at most the slot's width of them."""
    if not fmt.slots():
        inner = random_tensor(
            fmt.level_shape(shape),
            density,
            fmt.inner,
            seed=int(rng.integers(1 << 31)),
            dtype=dtype,
            index_dtype=index_dtype,
        )
        return MappedTensor(shape, fmt, inner)
    last, group = len(shape) - 1, fmt.blocks()[len(shape) - 1]
    width = fmt.exprs[fmt.slots()[0]].block
    groups = int(np.prod(shape[:-1], dtype=np.int64)) * (shape[-1] // group)
    counts = rng.binomial(width, density, size=groups)
    picks = [rng.choice(group, size=c, replace=False) for c in counts]
    gid = np.repeat(np.arange(groups), counts)
    local = np.concatenate(picks).astype(np.int64) if picks else np.zeros(0, np.int64)
    lead, g = np.divmod(gid, shape[-1] // group) if groups else (gid, gid)
    coords = np.zeros((len(shape), len(gid)), dtype=np.int64)
    if last:
        coords[:last] = np.unravel_index(lead, shape[:-1])
    coords[last] = g * group + local
    vals = rng.uniform(-1, 1, len(gid)).astype(dtype)
    vals[rng.random(len(gid)) < 0.1] = 0.0  # stored zeros
    return pack_mapped(coords, vals, shape, fmt, index_dtype)
