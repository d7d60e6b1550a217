"""Which weights a pruned layer keeps: by magnitude alone, in N:M groups, or in blocks.

- `magnitude_mask(weight, s)`: the ``round((1 - s) * numel)`` entries of largest magnitude.
- `nm_mask(weight, n, m)` (``pattern="2:4"``): in every group of ``m`` consecutive inputs of
  a row, the ``n`` of largest magnitude; the layer's sparsity is ``1 - n / m`` exactly.
- `block_mask(weight, s, (r, c))` (``block=(r, c)``): the weight cut into ``r x c`` blocks
  (rows of outputs by columns of inputs), the ``round((1 - s) * blocks)`` blocks of largest
  L2 norm kept whole. ``(1, 1)`` is `magnitude_mask`.

Ties go to the lower index (flat index, position in the group, block in row-major order),
so a mask is a function of the weight. A shape the groups or blocks do not divide is refused
with the fix, not cut ragged: the blocked and N:M formats (issue 39) store whole groups
and blocks only. The masks hold whatever storage the layer uses: today CSR, whose kernels
gain from the sparsity whether or not it has structure.
"""

from __future__ import annotations

import re

import torch

from ..base.errors import InputError


def magnitude_mask(weight: torch.Tensor, sparsity: float) -> torch.Tensor:
    """The ``round((1 - sparsity) * numel)`` entries of largest magnitude (ties: the lower
    flat index kept first), exactly that many, as a bool mask."""
    _check_sparsity(sparsity)
    return _top(weight.detach().abs().reshape(1, -1), _keep(sparsity, weight.numel())).reshape(
        weight.shape
    )


def nm_mask(weight: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """In every group of ``m`` consecutive entries of a row (the last dimension), the ``n``
    of largest magnitude (ties: the lower position first), as a bool mask."""
    if weight.dim() != 2:
        raise InputError(f"an N:M mask is for a 2-D weight, not one of shape {tuple(weight.shape)}")
    _check_nm(n, m)
    rows, cols = weight.shape
    if cols % m:
        raise InputError(
            f"a {n}:{m} pattern groups the {cols} inputs of each row in {m}s, and {cols} is "
            f"not a multiple of {m}: choose M dividing in_features, or leave this layer dense"
        )
    groups = weight.detach().abs().reshape(rows * (cols // m), m)
    return _top_each(groups, n).reshape(rows, cols)


def block_mask(
    weight: torch.Tensor, sparsity: float | None, block: tuple[int, int]
) -> torch.Tensor:
    """``weight`` (out, in) cut into ``block = (r, c)`` blocks; the ``round((1 - sparsity) *
    blocks)`` blocks of largest L2 norm kept whole (ties: the lower block in row-major
    order), or with ``sparsity`` None every block that holds a nonzero."""
    if weight.dim() != 2:
        raise InputError(
            f"a block mask is for a 2-D weight, not one of shape {tuple(weight.shape)}"
        )
    r, c = check_block(block)
    rows, cols = weight.shape
    if rows % r or cols % c:
        raise InputError(
            f"({r}, {c}) blocks do not tile a {rows} x {cols} weight (out_features x "
            f"in_features): r must divide {rows} and c must divide {cols}"
        )
    tiles = weight.detach().reshape(rows // r, r, cols // c, c).transpose(1, 2)
    if sparsity is None:
        kept = (tiles != 0).flatten(2).any(dim=2)
    else:
        _check_sparsity(sparsity)
        norms = tiles.double().square().sum(dim=(2, 3)).reshape(1, -1)
        kept = _top(norms, _keep(sparsity, norms.numel())).reshape(rows // r, cols // c)
    return kept[:, None, :, None].expand(rows // r, r, cols // c, c).reshape(rows, cols)


def parse_pattern(pattern: str) -> tuple[int, int]:
    """``"N:M"`` as (N, M), refused with the spelling wanted when it is not one."""
    found = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", pattern) if isinstance(pattern, str) else None
    if found is None:
        raise InputError(f"pattern {pattern!r} is not 'N:M' (N kept of every M inputs, e.g. '2:4')")
    n, m = int(found.group(1)), int(found.group(2))
    _check_nm(n, m)
    return n, m


def check_block(block: object) -> tuple[int, int]:
    """``block`` as (r, c) of positive ints, or an `InputError`."""
    if (
        not isinstance(block, tuple | list)
        or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in block)
    ):
        raise InputError(
            f"block must be (rows, columns) of positive ints, e.g. (1, 8), not {block!r}"
        )
    return int(block[0]), int(block[1])


def structured_mask(
    weight: torch.Tensor,
    sparsity: float | None,
    block: tuple[int, int] | None = None,
    pattern: str | None = None,
) -> torch.Tensor:
    """The mask `SparseLinear.from_linear` keeps: N:M groups (``pattern``), blocks
    (``block``), the largest magnitudes (``sparsity``) or the nonzeros (None)."""
    if block is not None and pattern is not None:
        raise InputError("give block or pattern, not both (an N:M pattern is along each row)")
    if pattern is not None:
        n, m = parse_pattern(pattern)
        if sparsity is not None and abs(sparsity - (1 - n / m)) > 1e-9:
            raise InputError(
                f"a {n}:{m} pattern is {1 - n / m:.4g} sparse, not {sparsity}: pass sparsity "
                "None (or equal to 1 - N/M) with a pattern"
            )
        return nm_mask(weight, n, m)
    if block is not None:
        return block_mask(weight, sparsity, block)
    if sparsity is None:
        return weight != 0
    return magnitude_mask(weight, sparsity)


def fits(shape: tuple[int, ...], block: tuple[int, int] | None, pattern: str | None) -> bool:
    """Whether a (out, in) weight divides into ``block``s or ``pattern``'s groups."""
    rows, cols = shape
    if pattern is not None:
        return cols % parse_pattern(pattern)[1] == 0
    if block is not None:
        r, c = check_block(block)
        return rows % r == 0 and cols % c == 0
    return True


def _check_sparsity(sparsity: float) -> None:
    if not 0.0 <= sparsity <= 1.0:
        raise InputError(f"sparsity must be in [0, 1], got {sparsity}")


def _check_nm(n: int, m: int) -> None:
    if not 1 <= n <= m:
        raise InputError(f"an N:M pattern keeps N of every M inputs with 1 <= N <= M, not {n}:{m}")


def _keep(sparsity: float, count: int) -> int:
    return int(round((1.0 - sparsity) * count))


def _top(scores: torch.Tensor, keep: int) -> torch.Tensor:
    """The ``keep`` largest of the single row ``scores``, ties to the lower index, as a
    bool mask of its shape."""
    order = torch.sort(scores.reshape(-1), descending=True, stable=True).indices[:keep]
    mask = torch.zeros(scores.numel(), dtype=torch.bool, device=scores.device)
    mask[order] = True
    return mask.reshape(scores.shape)


def _top_each(scores: torch.Tensor, keep: int) -> torch.Tensor:
    """The ``keep`` largest of each row of ``scores``, ties to the lower index."""
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :keep]
    mask = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    mask.scatter_(1, order, True)
    return mask
