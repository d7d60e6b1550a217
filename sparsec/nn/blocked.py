"""`BlockSparseLinear`: a linear layer whose weight is stored ``bsr(R,C)`` over a fixed
pattern of blocks (`SparseLinear.from_linear(..., format="bsr(R,C)")`).

The product is the bsr kernel ``Yt(o,t) = W(o,i) * Xt(i,t)`` as a torch op (`torch_op`),
which runs over the format's levels (`sparsec.middle.demap`): W as its block rows' ``pos``
and ``crd`` and its blocks' values, the activations as the view ``Xt(i0,i1,t)`` of their
transpose, the output as ``Yt(o0,o1,t)``. Its backward is the op's derived gradients: the
blocks' values (every cell of a kept block trains, zeros included) and the activations.
"""

from __future__ import annotations

import torch

from ..api.kernel import Kernel, kernel
from ..api.torch_op import Components, TorchOp, torch_op
from ..base.errors import ShapeError
from ..tensors.mapped import MappedTensor
from ..tensors.maps import MappedFormat
from .layers import activate, check_activation, check_input

#: the op of each block size, made on first use
_OPS: dict[tuple[int, int], TorchOp] = {}


def _op(block: tuple[int, int]) -> TorchOp:
    found = _OPS.get(block)
    if found is None:
        fmt = f"bsr({block[0]},{block[1]})"
        found = _OPS[block] = torch_op(kernel("Yt(o,t) = W(o,i) * Xt(i,t)", {"W": fmt}))
    return found


class BlockSparseLinear(torch.nn.Module):
    """``y = activation(x W^T + b)`` with W stored ``bsr(R,C)``: ``pos`` and ``crd`` index
    W's blocks by block row (fixed), ``values`` holds each kept block's R x C cells in row
    order (trained)."""

    pos: torch.Tensor
    crd: torch.Tensor

    def __init__(
        self,
        weight: MappedTensor,
        bias: torch.Tensor | None,
        activation: str | None,
        threads: int | None,
    ) -> None:
        super().__init__()
        check_activation(activation)
        block = weight.blocksize()
        if block is None:
            raise ShapeError(f"BlockSparseLinear stores a bsr(R,C) weight, not {weight.format}")
        self.out_features, self.in_features = weight.shape
        self.block = block
        self.format: MappedFormat = weight.format
        st = weight.inner.levels[1]
        self.register_buffer("pos", torch.from_numpy(st.pos.copy()))
        self.register_buffer("crd", torch.from_numpy(st.crd.copy()))
        self.values = torch.nn.Parameter(torch.from_numpy(weight.inner.vals.copy()))
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().clone())
        self.activation = activation
        self.threads = threads

    @property
    def kernel(self) -> Kernel:
        """The sparsec kernel of the product (over the format's levels)."""
        return _op(self.block).kernel

    @property
    def nnz(self) -> int:
        """Stored values: every cell of every kept block."""
        return int(self.values.numel())

    @property
    def sparsity(self) -> float:
        return 1.0 - self.nnz / max(1, self.in_features * self.out_features)

    def to_dense(self) -> torch.Tensor:
        """W as a dense (out_features, in_features) tensor (differentiable in ``values``)."""
        r, c = self.block
        rows = torch.repeat_interleave(
            torch.arange(self.out_features // r), torch.diff(self.pos.long())
        )
        blocks = self.values.new_zeros(self.out_features // r, self.in_features // c, r, c)
        blocks = blocks.index_put((rows, self.crd.long()), self.values.reshape(-1, r, c))
        return blocks.permute(0, 2, 1, 3).reshape(self.out_features, self.in_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"format={self.format}, nnz={self.nnz}, sparsity={self.sparsity:.3f}, "
            f"bias={self.bias is not None}, activation={self.activation}"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input("BlockSparseLinear", x, self.in_features, self.values.dtype)
        r, c = self.block
        lead = x.shape[:-1]
        xt = x.reshape(-1, self.in_features).t()  # (in, tokens), a view
        tokens = xt.shape[1]
        levels = (self.out_features // r, self.in_features // c, r, c)
        none = (None, None)
        w = Components(levels, (none, (self.pos, self.crd), none, none), self.values)
        yt = _op(self.block)(
            W=w, Xt=xt.reshape(self.in_features // c, c, tokens), threads=self.threads
        )
        yt = yt.reshape(self.out_features, tokens)
        if self.bias is not None:
            yt = yt + self.bias[:, None]
        y = yt.t().reshape(*lead, self.out_features)
        return activate(y, self.activation)


def from_weight(
    weight: torch.Tensor,
    mask: torch.Tensor,
    fmt: MappedFormat,
    bias: torch.Tensor | None,
    activation: str | None,
    threads: int | None,
) -> BlockSparseLinear:
    """The layer of ``weight`` keeping the cells ``mask`` holds, stored in ``fmt`` (every
    cell of a block that holds one of them: the blocks' zeros train too)."""
    from ..tensors.mapped import pack_mapped

    rows, cols = mask.nonzero(as_tuple=True)
    coords = torch.stack([rows, cols]).numpy()
    values = weight.detach()[rows, cols].numpy()
    stored = pack_mapped(coords, values, tuple(weight.shape), fmt)
    return BlockSparseLinear(stored, bias, activation, threads)
