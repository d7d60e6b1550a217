"""Formats chosen from the data (``formats="auto"``): what a matrix looks like, and which
formats could read it fastest.

`Shape.of` inspects a matrix once from its coordinates (O(nnz), numpy): its rows that store
anything, its row lengths, and for each candidate block size how many blocks its entries
fall into. `candidates` ranks the formats sparsec has by a transparent model of the bytes a
row-wise pass reads (each stored value, each index, each row's pointers) and returns the
cheapest few, CSR always among them; the caller (`sparsec.api.auto`) times those on the
call's inputs and keeps the fastest, so the model only has to rank, not to predict.

Per stored value of ``v`` bytes, with 4-byte indices::

    csr       (rows + 1) * 4  +  nnz * (4 + v)
    dcsr      nonempty * 8 + 4  +  nnz * (4 + v)           rows without entries cost nothing
    bsr(R,C)  (rows / R + 1) * 4  +  blocks * (4 + R*C*v)   a block's zeros are read too

A format is a candidate only where it can hold the matrix: bsr where R and C divide the
shape. A blocked format whose bytes are more than `BLOCK_SLACK` times CSR's is dropped
before any timing (its zeros would outweigh the indices and gathers it saves).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: the block sizes tried for bsr
BLOCKS = ((2, 2), (4, 4), (8, 8), (1, 4), (4, 1))
#: a blocked format is timed only when its modelled bytes are at most this times CSR's:
#: more than 1, since the model counts no gathers, which a block reads contiguously (a
#: diagonal in bsr(2,2) reads half its values as zeros and still ran faster than CSR)
BLOCK_SLACK = 1.5
#: formats timed at most, CSR included
MOST = 5


@dataclass(frozen=True, slots=True)
class Shape:
    """What `candidates` reads of a matrix."""

    rows: int
    cols: int
    nnz: int
    nonempty: int
    longest: int
    #: (R, C) -> the number of R x C blocks its entries fall into
    blocks: dict[tuple[int, int], int]

    @staticmethod
    def of(shape: tuple[int, int], coords: np.ndarray) -> Shape:
        """From a matrix's shape and its entries' coordinates ``(2, nnz)``."""
        rows, cols = shape
        r, c = coords[0].astype(np.int64), coords[1].astype(np.int64)
        counts = np.bincount(r, minlength=rows) if rows else np.zeros(0, np.int64)
        blocks = {}
        for br, bc in BLOCKS:
            if rows % br or cols % bc:
                continue
            width = -(-cols // bc)
            blocks[(br, bc)] = int(np.unique((r // br) * width + c // bc).size)
        return Shape(
            rows,
            cols,
            int(r.size),
            int(np.count_nonzero(counts)),
            int(counts.max(initial=0)),
            blocks,
        )

    def bytes(self, fmt: str, value: int) -> float:
        """The modelled bytes of one row-wise pass over the matrix stored as ``fmt``."""
        if fmt == "csr":
            return (self.rows + 1) * 4 + self.nnz * (4 + value)
        if fmt == "dcsr":
            return self.nonempty * 8 + 4 + self.nnz * (4 + value)
        br, bc = (int(x) for x in fmt[4:-1].split(","))
        count = self.blocks[(br, bc)]
        return (self.rows // br + 1) * 4 + count * (4 + br * bc * value)


def candidates(shape: Shape, value: int) -> list[str]:
    """The formats worth timing for this matrix, cheapest first by `Shape.bytes`, at most
    `MOST`, CSR always among them."""
    csr = shape.bytes("csr", value)
    options = ["csr", "dcsr"] + [
        f"bsr({br},{bc})"
        for br, bc in shape.blocks
        if shape.bytes(f"bsr({br},{bc})", value) <= BLOCK_SLACK * csr
    ]
    ranked = sorted(options, key=lambda f: shape.bytes(f, value))
    chosen = ranked[: MOST - 1]
    return chosen + ["csr"] if "csr" not in chosen else ranked[:MOST]
