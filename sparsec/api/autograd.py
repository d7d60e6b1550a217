"""Eager autograd: a kernel called with torch tensors that require grad returns an output
carrying a ``grad_fn``.

`Kernel.__call__` asks `wants_grad` first (torch not imported, or no torch input requiring
grad: one scan of the inputs, nothing else), then `call` runs the kernel inside a
``torch.autograd.Function`` whose backward runs the gradient statements of
`sparsec.api.gradient` (derived from the notation, compiled and kept like any kernel).

A dense torch input's gradient is dense, of its shape. A torch sparse input (COO, CSR, CSC;
its values requiring grad, e.g. ``torch.sparse_csr_tensor(crow, col, v)`` with
``v.requires_grad``) gets a sparse gradient of the same layout and pattern (stored zeros
included), which torch's own backward of the sparse constructor turns into ``v``'s
gradient. A sparse output (a kernel whose output format is sparse) is returned as a torch
sparse tensor of the output's layout carrying the ``grad_fn``; its incoming gradient is
read densely. torch is imported only when some input is a torch tensor.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..frontend.derivative import NotDifferentiable
from ..tensors.tensor import Tensor, as_tensor

_MODULES = sys.modules


def wants_grad(inputs: Mapping[str, Any]) -> bool:
    """Does a kernel call record autograd (torch loaded, grad mode on, some input a torch
    tensor that requires grad)? Cheap for numpy/scipy calls: no import, one plain loop,
    a small part of a fast-path call (docs/decisions.md, "A repeated call")."""
    torch = _MODULES.get("torch")
    if torch is not None:
        tensor = torch.Tensor
        for v in inputs.values():
            if isinstance(v, tensor) and v.requires_grad:
                return bool(torch.is_grad_enabled())
    return False


@dataclass(frozen=True, slots=True)
class _Call:
    """What the autograd function needs besides the tensors it tracks."""

    kernel: Any  # the `Kernel` (api.kernel imports this module)
    names: tuple[str, ...]
    others: Mapping[str, Any]
    threads: int | None


def call(kernel: Any, inputs: Mapping[str, Any], threads: int | None) -> Any:
    """``kernel(**inputs)`` recorded by autograd (see the module docstring)."""
    import torch

    names = tuple(k for k, v in inputs.items() if isinstance(v, torch.Tensor))
    others = {k: v for k, v in inputs.items() if k not in names}
    return _function().apply(_Call(kernel, names, others, threads), *(inputs[n] for n in names))


_FUNCTION: Any = None


def _function() -> Any:
    """The ``torch.autograd.Function`` (made on first use: torch is optional)."""
    global _FUNCTION
    if _FUNCTION is not None:
        return _FUNCTION
    import torch

    class KernelFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, how: _Call, *tensors: Any) -> Any:
            detached = dict(zip(how.names, (t.detach() for t in tensors), strict=True))
            ctx.how, ctx.detached = how, detached
            out = how.kernel.run_levels({**how.others, **detached}, how.threads)
            if isinstance(out, Tensor):  # a sparse output, in the output's torch layout
                return out.to_torch()
            return out

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            from .gradient import gradients

            how: _Call = ctx.how
            needs = ctx.needs_input_grad[1:]
            wanted = [n for n, need in zip(how.names, needs, strict=True) if need]
            if grad.layout != torch.strided:
                grad = grad.to_dense()
            inputs = {**how.others, **ctx.detached}
            found = gradients(how.kernel, inputs, grad, wanted, how.threads)
            return (
                None,
                *(_shaped(found[n], ctx.detached[n]) if n in found else None for n in how.names),
            )

    _FUNCTION = KernelFunction
    return _FUNCTION


def _shaped(grad: Any, source: Any) -> Any:
    """A gradient as torch gives it back for ``source``: dense of its shape and dtype, or
    for a sparse input a sparse tensor of its layout (COO for CSC) and pattern (``grad`` holds the values
    aligned with ``as_tensor(source).vals``)."""
    import torch

    values = torch.as_tensor(np.asarray(grad) if not torch.is_tensor(grad) else grad)
    values = values.to(dtype=source.dtype)
    layout = source.layout
    if layout == torch.strided:
        return values.reshape(source.shape)
    if values.shape != (source._nnz(),):
        # never hand torch values that do not match the pattern (it does not check them)
        raise AssertionError(f"a gradient of {values.shape} values for {source._nnz()} entries")
    if layout == torch.sparse_csr:
        return torch.sparse_csr_tensor(
            source.crow_indices(), source.col_indices(), values, source.shape
        )
    if layout in (torch.sparse_coo, torch.sparse_csc):
        # a CSC input gets its pattern as COO: torch accumulates no CSC gradient into a
        # leaf ("Sparse CSC tensors do not have is_contiguous"); a CSC built from values
        # hands a COO one to them all the same
        coords = torch.from_numpy(as_tensor(source).coords()[0])
        return torch.sparse_coo_tensor(coords, values, source.shape).coalesce()
    raise NotDifferentiable(
        f"a torch input of layout {layout} gets no gradient; use COO, CSR or CSC"
    )
