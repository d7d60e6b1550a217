"""An independent oracle for structured pruning (`sparsec.nn.masks`), written from its
documented rule with plain Python sorts: shared by tests/test_nn_masks.py and the nn fuzz.

- N:M: in every group of ``m`` consecutive inputs of a row, the ``n`` of largest magnitude;
- blocks: the weight cut into ``r x c`` blocks, the ``round((1 - s) * blocks)`` of largest
  L2 norm kept whole, or with sparsity None every block holding a nonzero;
- ties go to the lower index (position in the group, block in row-major order).
"""

from __future__ import annotations

import torch


def nm_reference(weight: torch.Tensor, n: int, m: int) -> torch.Tensor:
    rows, cols = weight.shape
    w = weight.abs().tolist()
    mask = torch.zeros(rows, cols, dtype=torch.bool)
    for i in range(rows):
        for g in range(0, cols, m):
            for k in sorted(range(m), key=lambda k: (-w[i][g + k], k))[:n]:
                mask[i, g + k] = True
    return mask


def block_reference(weight: torch.Tensor, sparsity: float | None, r: int, c: int) -> torch.Tensor:
    rows, cols = weight.shape
    w = weight.abs().tolist()
    grid = [(bi, bj) for bi in range(rows // r) for bj in range(cols // c)]
    norm = [
        sum(w[bi * r + a][bj * c + b] ** 2 for a in range(r) for b in range(c)) for bi, bj in grid
    ]
    if sparsity is None:
        kept = [n for n in range(len(grid)) if norm[n] > 0]
    else:
        order = sorted(range(len(grid)), key=lambda n: (-norm[n], n))
        kept = order[: int(round((1 - sparsity) * len(grid)))]
    mask = torch.zeros(rows, cols, dtype=torch.bool)
    for n in kept:
        bi, bj = grid[n]
        mask[bi * r : (bi + 1) * r, bj * c : (bj + 1) * c] = True
    return mask
