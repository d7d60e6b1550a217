"""`SparseLinear`: a pruned ``torch.nn.Linear`` whose product runs as a sparsec kernel.

The weight W(o,i) is stored CSR (level 0 dense over the outputs o, level 1 compressed over
the inputs i): its pattern as the int buffers ``pos`` (out_features + 1) and ``crd`` (nnz),
its values as the 1-D parameter ``values`` (nnz, in CSR order), the bias as a parameter.
The call is the statement

    Yt(o,t) = W(o,i) * Xt(i,t)

over the activations transposed (Xt = X^T, tokens last), through the torch op of
`sparsec.api.torch_op` (so eager and ``torch.compile`` run, and train through, one path),
then torch adds the bias to Yt in place. Why this spelling (measured: docs/decisions.md,
"SparseLinear"): the loop nest (o, i, t) walks each stored row of W once and streams a
contiguous row of Xt per entry, the fastest form measured. Writing the bias as ``+ b(o)``
in the statement puts the sum over i in a scalar temporary per (o, t) (loop order o, t, i:
Xt read down a column), far slower. Tokens first, ``Y(t,o) = X(t,i) * W(o,i) + b(o)`` in
CSR or CSC, or ``Y(t,o) += X(t,i) * W(o,i)`` in CSC, is slower too (each token re-reads
all of W). The bias as the start of a ``+=`` costs more than torch's one pass over Yt: the
start is expanded and copied twice before the kernel runs, and a ``+=`` call takes neither
the runtime's fast path nor its column panels (`sparsec.policy.costs.Columns`), which keep
a panel of Xt in the core's cache. An activation fused into the statement,
``relu(W*Xt + b)``, forces the scalar-temporary form again, so the activation (a function
of the language: relu, tanh, ...) is applied to the op's output by torch, elementwise.
The output is Yt's transpose, a view: a following SparseLinear's transpose of it is free.

Where the activations outgrow the core's L1 data cache, the product runs over W in column
blocks (`sparsec.policy.costs.column_block`): ``Yt(o,t) = W(b,o,k) * Xt(b,k,t)``, W stored
``dds`` (block b of the inputs, output o, input k = i - b*B compressed) and Xt viewed as
(blocks, B, tokens), each block's rows of Xt kept in L1 while every output row gathers
from them (docs/decisions.md, "SparseLinear in column blocks"). That pattern is derived
once from (pos, crd) and kept as buffers beside them, with the permutation that takes the
values from CSR order to its order; the parameter stays in CSR order.

Where at least a quarter of W is stored, dense ``F.linear`` on a kept dense copy of W is a
third way. Which of the ways a call takes (`SparseLinear.ways`) is measured on the host at
the first call of each size class of tokens (docs/decisions.md, "SparseLinear runs dense
where dense measured faster").
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from ..api.kernel import Kernel, kernel
from ..api.torch_op import Components, torch_op
from ..base.errors import DTypeError, InputError, StorageError
from ..policy import calibrated, costs
from ..tensors.mapped import resolve
from .blocked import from_weight
from .layers import activate, check_activation, check_input
from .masks import structured_mask

#: the layer's product; torch adds the bias to its output
_OP = torch_op(kernel("Yt(o,t) = W(o,i) * Xt(i,t)", {"W": "csr"}))
#: the product over W in column blocks: chunks of 64 output rows shared among the threads,
#: each chunk walking all blocks (no barrier between blocks; the default schedule would run
#: the blocks on threads, each adding into its own copy of Yt)
_BLOCKED = torch_op(
    kernel(
        "Yt(o,t) = W(b,o,k) * Xt(b,k,t)",
        {"W": "dds"},
        schedule="split(o,o0,o1,64), reorder(o0,b,o1,k,t), parallelize(o0,CPUThread,NoRaces)",
    )
)
#: the clock `SparseLinear._way` times the ways with (tests set a fake one)
clock = time.perf_counter
#: the ways a call may run (`SparseLinear.ways`): the sparse product over W in column
#: blocks, over whole rows of W, or dense ``F.linear`` on a dense copy of W
BLOCKS, ROWS, DENSE = "blocks", "rows", "dense"
#: the least fraction of W stored for a dense copy to be a candidate: at a quarter, the
#: copy (4 bytes an element in float32) costs twice the sparse storage (a value and an
#: int32 index per entry), which bounds the memory a measurement may add
DENSE_MIN_DENSITY = 0.25
_DENSE_DTYPES = (torch.float32, torch.float64)


_VALUE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


class SparseLinear(torch.nn.Module):
    """``y = activation(x W^T + b)`` with W stored CSR over a fixed pattern.

    ``x`` may have any leading shape (``(..., in_features)``): it is flattened to tokens,
    multiplied, and reshaped back. The pattern (``pos``, ``crd``) is fixed; ``values`` and
    ``bias`` train. ``state_dict`` holds the pattern: loading adopts the stored one (checked:
    pos non-decreasing from 0 to nnz, crd in range and strictly increasing per row,
    as many values as crd entries), so a model sparsified afresh loads a trained one.
    """

    pos: torch.Tensor
    crd: torch.Tensor
    #: the pattern in column blocks (`_derive_blocks`): not saved, derived from pos/crd
    block_pos: torch.Tensor
    block_crd: torch.Tensor
    block_perm: torch.Tensor
    block_inverse: torch.Tensor
    #: what the blocks and the values kept in block order were made from (`_pattern_key`,
    #: `_block_values`)
    _blocks_of: tuple[int, ...]
    _gathered_of: tuple[Any, ...] | None
    _gathered_from: Any

    def __init__(
        self,
        in_features: int,
        out_features: int,
        pos: torch.Tensor,
        crd: torch.Tensor,
        values: torch.Tensor,
        bias: torch.Tensor | None = None,
        activation: str | None = None,
        threads: int | None = None,
    ) -> None:
        super().__init__()
        check_activation(activation)
        if values.dtype not in _VALUE_DTYPES:
            raise DTypeError(f"SparseLinear values must be float32 or float64, not {values.dtype}")
        self.in_features = in_features
        self.out_features = out_features
        self.activation = activation
        #: sparsec's thread count for the kernel (None: its default)
        self.threads = threads
        pos, crd = _check_pattern(in_features, out_features, pos, crd, values.numel())
        self.register_buffer("pos", pos)
        self.register_buffer("crd", crd)
        self.values = torch.nn.Parameter(values.detach().clone().reshape(-1))
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().clone())
        #: inputs per column block (`costs.column_block`; in_features: one block), and the
        #: fewest tokens of a call in blocks (`costs.block_tokens`): host facts, read here
        #: once, so a compiled forward traces no machine query
        self.block = costs.column_block(in_features, values.element_size())
        self.block_tokens = costs.block_tokens(in_features, values.element_size())
        #: the way measured fastest, by size class of tokens (`_way`), and the times
        self.ways_measured: dict[int, str] = {}
        self.ways_spent: dict[int, dict[str, float]] = {}
        #: W dense, kept for calls that run dense (`_dense_weight`), and what it was made of
        self._dense: torch.Tensor | None = None
        self._dense_of: tuple[Any, ...] | None = None
        self._flat: torch.Tensor | None = None
        self._derive_blocks()

    # ------------------------------------------------------------------ building
    @classmethod
    def from_linear(
        cls,
        linear: torch.nn.Linear,
        sparsity: float | None = None,
        activation: str | None = None,
        threads: int | None = None,
        *,
        block: tuple[int, int] | None = None,
        pattern: str | None = None,
        format: str = "csr",
    ) -> Any:
        """The layer of ``linear``: its nonzeros (sparsity None) or its
        ``round((1 - sparsity) * numel)`` largest weights by magnitude (ties: lower flat
        index first), stored even where they are zero. With ``pattern="N:M"``, the N
        largest of every M consecutive inputs of each row; with ``block=(r, c)``, whole
        r x c blocks of largest L2 norm (`sparsec.nn.masks`). ``format="bsr(R,C)"`` stores
        W in R x C blocks (a `blocked.BlockSparseLinear`; ``block`` defaults to (R, C))."""
        weight = _linear_weight(linear)
        bsr = resolve(format, 2) if format != "csr" else None
        if format != "csr" and (bsr is None or not bsr.name.startswith("bsr(")):
            raise InputError(
                f"SparseLinear stores its weight as 'csr' or 'bsr(R,C)', not {format!r}"
            )
        if bsr is not None:
            blocks = bsr.blocks()
            mask = structured_mask(weight, sparsity, block or (blocks[0], blocks[1]), pattern)
            bias = None if linear.bias is None else linear.bias.detach()
            check_activation(activation)
            return from_weight(weight, mask, bsr, bias, activation, threads)
        mask = structured_mask(weight, sparsity, block, pattern)
        rows, cols = mask.nonzero(as_tuple=True)  # row-major: CSR order
        out_features, in_features = weight.shape
        wide = max(out_features, in_features, rows.numel()) >= 2**31 - 1
        index = torch.int64 if wide else torch.int32
        pos = torch.zeros(out_features + 1, dtype=torch.int64)
        pos[1:] = torch.cumsum(torch.bincount(rows, minlength=out_features), 0)
        return cls(
            in_features,
            out_features,
            pos.to(index),
            cols.to(index),
            weight[rows, cols],
            None if linear.bias is None else linear.bias.detach(),
            activation,
            threads,
        )

    @property
    def kernel(self) -> Kernel:
        """The sparsec kernel this layer calls on many tokens (``generated()`` shows its
        loop nest): over W in column blocks where it has more than one."""
        return _BLOCKED.kernel if self.block < self.in_features else _OP.kernel

    @property
    def kernels(self) -> tuple[Kernel, ...]:
        """Every kernel this layer may call (whole rows for a few tokens, column blocks
        for many)."""
        return (_OP.kernel, _BLOCKED.kernel) if self.block < self.in_features else (_OP.kernel,)

    @property
    def nnz(self) -> int:
        return int(self.crd.numel())

    @property
    def sparsity(self) -> float:
        """The fraction of W's entries not stored."""
        return 1.0 - self.nnz / max(1, self.in_features * self.out_features)

    def to_dense(self) -> torch.Tensor:
        """W as a dense (out_features, in_features) tensor (differentiable in ``values``)."""
        dense = self.values.new_zeros(self.out_features, self.in_features)
        rows = self._entry_rows()
        return dense.index_put((rows, self.crd.long()), self.values)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"nnz={self.nnz}, sparsity={self.sparsity:.3f}, bias={self.bias is not None}, "
            f"activation={self.activation}"
        )

    # ------------------------------------------------------------------ calling
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input("SparseLinear", x, self.in_features, self.values.dtype)
        lead = x.shape[:-1]
        tokens = x.reshape(-1, self.in_features)
        y = self._forward_way(tokens, self._way(tokens))
        return activate(y.reshape(*lead, self.out_features), self.activation)

    def _forward_way(self, x: torch.Tensor, way: str) -> torch.Tensor:
        """``x W^T + b`` for tokens ``x`` of shape (tokens, in_features), the way ``way``
        (`BLOCKS`, `ROWS` or `DENSE`)."""
        if way == DENSE:
            return torch.nn.functional.linear(x, self._dense_weight(), self.bias)
        # Xt as a view: the runtime packs each column panel straight from it, or, run whole,
        # makes it C-ordered by the same compiled copy (`sparsec.runtime.copies.packed_copy`)
        yt = self._run(x.t(), way == BLOCKS)
        if self.bias is not None:
            yt = yt.add_(self.bias[:, None])  # the op's own fresh output: no copy
        return yt.t()

    def _run(self, xt: torch.Tensor, blocked: bool) -> torch.Tensor:
        features, tokens = xt.shape
        if blocked:
            if not torch.compiler.is_compiling() and self._blocks_of != self._pattern_key():
                self._derive_blocks()  # pos or crd changed in place since the derivation
            blocks = features // self.block
            weight = Components(
                (blocks, self.out_features, self.block),
                ((None, None), (None, None), (self.block_pos, self.block_crd)),
                self._block_values(),
            )
            Xt = xt.view(blocks, self.block, tokens)
            return _BLOCKED(W=weight, Xt=Xt, threads=self.threads)
        weight = Components(
            (self.out_features, features), ((None, None), (self.pos, self.crd)), self.values
        )
        return _OP(W=weight, Xt=xt, threads=self.threads)

    def _sparse_ways(self, tokens: int) -> tuple[str, ...]:
        """Column blocks (where W has several and the activations outgrow the L1 data cache,
        `costs.block_tokens`), then whole rows."""
        if self.block >= self.in_features or tokens < self.block_tokens:
            return (ROWS,)
        return (BLOCKS, ROWS)

    def ways(self, tokens: int) -> tuple[str, ...]:
        """The ways a call of ``tokens`` tokens may run, the default first: the sparse ones
        (`_sparse_ways`), and dense ``F.linear`` on a dense copy of W where that copy costs
        at most twice the layer's sparse storage (`DENSE_MIN_DENSITY`) and the values are
        float32 or float64."""
        ways = self._sparse_ways(tokens)
        size = self.in_features * self.out_features
        if self.values.dtype in _DENSE_DTYPES and self.nnz >= DENSE_MIN_DENSITY * size:
            ways = (*ways, DENSE)
        return ways

    def _way(self, x: torch.Tensor) -> str:
        """How a call on tokens ``x`` (tokens, in_features) runs (`ways`), measured on the
        host, on the call's own tokens.

        Blocks and whole rows add each row's entries in the same order (rising i, a block
        after another), so that choice changes the speed only; dense ``F.linear`` sums in
        its own order, so it changes the rounding too (within the sums' rounding bound).
        At the first call of each size class of tokens (a power of two), each way is timed
        three times on the call's tokens, in interleaved rounds, without recording
        gradients (the forward's speed), and the fastest (least time) kept
        (`ways_measured`; the times in `ways_spent`; `clock` times them). Blocks lose where
        the whole rows' gathers run well from L2 (BERT-base's 3072 -> 768 at 90 % on a Zen
        5 core: docs/decisions.md, "SparseLinear in column blocks"); dense wins where the
        host's dense GEMM runs near its peak and W is half full (an Intel server core:
        "SparseLinear runs dense where dense measured faster"). Without host measurements
        (``SPARSEC_TUNE=0``, `sparsec.policy.calibrated`) or while traced, the default (the
        first way) is taken."""
        tokens = x.shape[0]
        ways = self.ways(tokens)
        if len(ways) == 1 or torch.compiler.is_compiling() or not calibrated.enabled():
            return ways[0]
        size = tokens.bit_length()
        if self.ways_measured.get(size) not in ways:  # unmeasured, or not a way any more
            spent = dict.fromkeys(ways, math.inf)
            with torch.no_grad():
                for _ in range(3):
                    for way in ways:
                        start = clock()
                        self._forward_way(x, way)
                        spent[way] = min(spent[way], clock() - start)
            chosen = min(ways, key=lambda w: (spent[w], ways.index(w)))
            self.ways_measured[size] = chosen
            self.ways_spent[size] = spent
            if DENSE not in self.ways_measured.values():
                self._dense = self._dense_of = self._flat = None  # not kept where never chosen
        return self.ways_measured[size]

    def _dense_weight(self) -> torch.Tensor:
        """W dense, kept while the values and the pattern are unchanged. A call that records
        a gradient gets the kept copy through `_Kept`, whose gradient gathers W's gradient
        at the stored entries (``flat``: each entry's row * in_features + column); a traced call densifies afresh (`to_dense`)."""
        values = self.values
        if torch.compiler.is_compiling():
            return self.to_dense()
        key = (values.data_ptr(), values._version, self._pattern_key())
        if self._dense is None or self._dense_of != key:
            self._flat = self._entry_rows() * self.in_features + self.crd.long()
            dense = values.new_zeros(self.out_features * self.in_features)
            dense[self._flat] = values.detach()
            self._dense = dense.view(self.out_features, self.in_features)
            self._dense_of = key
            # held, so no other tensor can take the address while the key names it
            self._dense_from = (values.untyped_storage(), *self._blocks_from)
        if torch.is_grad_enabled() and values.requires_grad:
            return _Kept.apply(values, self._flat, self._dense)
        return self._dense

    def _block_values(self) -> torch.Tensor:
        """The values in block order, kept while the values and the blocks are unchanged
        (calls between optimizer steps skip a pass over the values). A call that records a
        gradient gets the kept copy through `_Kept`, whose gradient takes the values'
        gradient back to CSR order by the inverse permutation; a traced call
        gathers afresh."""
        values = self.values
        if torch.compiler.is_compiling():
            return values.index_select(0, self.block_perm)
        key = (values.data_ptr(), values._version, self._blocks_of)
        if self._gathered_of != key:
            # index_select: a third of the time of values[perm] (torch 2.13, one thread)
            self._gathered = values.detach().index_select(0, self.block_perm)
            self._gathered_of = key
            # held, so no other tensor can take the address while the key names it
            self._gathered_from = values.untyped_storage()
        if torch.is_grad_enabled() and values.requires_grad:
            return _Kept.apply(values, self.block_inverse, self._gathered)
        return self._gathered

    def _entry_rows(self) -> torch.Tensor:
        """Each stored entry's row o (int64, in CSR order), from pos."""
        return torch.repeat_interleave(
            torch.arange(self.out_features, device=self.crd.device), torch.diff(self.pos.long())
        )

    def _pattern_key(self) -> tuple[int, ...]:
        """What identifies the pattern's current contents: its tensors and their versions."""
        return (
            self.pos.data_ptr(),
            self.pos._version,
            self.crd.data_ptr(),
            self.crd._version,
            self.block,
        )

    def _derive_blocks(self) -> None:
        """The pattern in column blocks of ``self.block`` inputs: level 2's pos and crd of
        W(b,o,k) stored ``dds``, and the permutation that takes the values from CSR order
        (row o, then i) to block order (b, then o, then k). pos and crd are checked (at
        construction and at loading), so the blocks are a valid pattern too."""
        out_features, block = self.out_features, self.block
        with torch.no_grad():
            rows = self._entry_rows()
            cols = self.crd.long()
            key = cols.div(block, rounding_mode="floor") * out_features + rows
            perm = torch.sort(key, stable=True).indices  # a row's crd rise: k rises too
            segments = (self.in_features // block) * out_features
            pos = torch.zeros(segments + 1, dtype=torch.int64, device=self.crd.device)
            pos[1:] = torch.cumsum(torch.bincount(key, minlength=segments), 0)
        self.register_buffer("block_pos", pos.to(self.pos.dtype), persistent=False)
        self.register_buffer(
            "block_crd", cols.remainder(block)[perm].to(self.crd.dtype), persistent=False
        )
        self.register_buffer("block_perm", perm, persistent=False)
        self.register_buffer("block_inverse", torch.argsort(perm), persistent=False)
        self._blocks_of = self._pattern_key()
        # held, so no other tensor can take their addresses while the key names them
        self._blocks_from = (self.pos.untyped_storage(), self.crd.untyped_storage())
        self._gathered_of = None
        self._gathered = perm.new_empty(0)
        self._gathered_from = None

    # ------------------------------------------------------------------ state
    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        """Adopt the stored pattern (checked) before torch copies the tensors in; the
        values parameter is re-made only when its size changes (an optimizer made before
        the load then holds the old one)."""
        keys = [prefix + k for k in ("pos", "crd", "values")]
        if all(k in state_dict for k in keys):
            pos, crd, values = (state_dict[k] for k in keys)
            pos, crd = _check_pattern(
                self.in_features, self.out_features, pos, crd, values.numel(), "loaded "
            )
            self.pos = pos.to(self.pos.device)
            self.crd = crd.to(self.crd.device)
            self._derive_blocks()
            if values.shape != self.values.shape:
                self.values = torch.nn.Parameter(self.values.new_empty(values.shape))
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


class _Kept(torch.autograd.Function):
    """A tensor made from the values and kept by the layer (``made``: the values in block
    order, or W dense), given already made: the forward returns it as it is, and the
    values' gradient is its gradient gathered at ``index``, ``grad.flatten()[index]``
    (the inverse permutation; each stored entry's flat position in W). A gather, where
    torch's own gradient of an index is a scatter-add."""

    @staticmethod
    def forward(ctx: Any, values: torch.Tensor, index: torch.Tensor, made: torch.Tensor) -> Any:
        ctx.save_for_backward(index)
        return made

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        (index,) = ctx.saved_tensors
        return grad.reshape(-1).index_select(0, index), None, None


def _linear_weight(linear: Any) -> torch.Tensor:
    """The (out_features, in_features) weight of an ``nn.Linear``, or an InputError saying
    what ``from_linear`` takes instead."""
    if not isinstance(linear, torch.nn.Linear):
        kind = type(linear).__name__
        hint = (
            "; prune a weight tensor with sparsec.nn.magnitude_mask(weight, sparsity)"
            if isinstance(linear, torch.Tensor)
            else "; only linear layers have a sparse kernel here (a 1x1 Conv1d is an "
            "nn.Linear over channels: copy its weight[:, :, 0] into one)"
            if isinstance(linear, torch.nn.Module)
            else ""
        )
        raise InputError(f"SparseLinear.from_linear takes a torch.nn.Linear, not a {kind}{hint}")
    return linear.weight.detach()


def _check_pattern(
    in_features: int,
    out_features: int,
    pos: torch.Tensor,
    crd: torch.Tensor,
    nnz: int,
    who: str = "",
) -> tuple[torch.Tensor, torch.Tensor]:
    """pos/crd as a valid CSR pattern of an (out_features, in_features) weight with
    ``nnz`` values, or a StorageError saying what does not fit."""
    where = f"SparseLinear({in_features} -> {out_features}): {who}pattern"
    if pos.dtype not in (torch.int32, torch.int64) or crd.dtype != pos.dtype:
        raise StorageError(
            f"{where} pos/crd must be int32 or int64 of one dtype, got {pos.dtype}/{crd.dtype}"
        )
    if pos.shape != (out_features + 1,) or crd.shape != (nnz,):
        raise StorageError(
            f"{where} has pos of shape {tuple(pos.shape)} and crd of shape {tuple(crd.shape)} "
            f"for {nnz} values; a {out_features} x {in_features} CSR weight needs pos of "
            f"length {out_features + 1} and one crd per value (was it saved from a layer of "
            "another shape?)"
        )
    p, c = pos.long(), crd.long()
    if p[0] != 0 or p[-1] != nnz or bool((p[1:] < p[:-1]).any()):
        raise StorageError(f"{where} pos must rise from 0 to {nnz}")
    if nnz and (bool((c < 0).any()) or bool((c >= in_features).any())):
        raise StorageError(f"{where} crd must lie in [0, {in_features})")
    rows = torch.repeat_interleave(torch.arange(out_features), torch.diff(p))
    same_row = rows[1:] == rows[:-1]
    if bool((same_row & (c[1:] <= c[:-1])).any()):
        raise StorageError(f"{where} crd must increase strictly within each row")
    return pos.detach().clone(), crd.detach().clone()
