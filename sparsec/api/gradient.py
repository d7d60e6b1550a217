"""Gradients of a kernel's inputs, each one a kernel derived from the notation.

``gradients(kernel, inputs, grad_output, wanted)`` runs, per wanted input ``X``, the
statement `sparsec.frontend.derivative.derivative` derives (``dX(ix) = Σ dY(out) *
∂rhs/∂X(ix)``), compiled like any kernel (same target, dtypes and
division convention as the forward one) and kept per (kernel, input) while the forward
kernel lives:

* a dense ``X``: a dense output over ``ix``; variables of ``ix`` the statement does not
  read (``y(i) = A(i,j)`` gives ``dA(i,j) = dY(i)``) are a broadcast of the result;
* a sparse ``X`` (CSR, CSC, COO, CSF, ...): the statement masked by ``X``'s stored pattern
  (``mask=X``, structural: stored zeros count) into an output in ``X``'s format, so
  ``Y(i,j) = W(i,k) * X(k,j)`` gives the SDDMM ``dW(i,k) = dY(i,j) * X(k,j)`` at W's stored
  (i, k) only; the values come back aligned with ``as_tensor(X).vals`` (entries the masked
  product leaves absent are 0). Where the statement does not read every variable of ``ix``,
  it runs over the ones it reads and is gathered at X's stored coordinates. W's gradient is
  never dense.
  On a GPU target it is computed by the C target (sparse outputs have no GPU mapping).
* a scalar: the full sum; the output of a ``+=`` (its current value): ``dY`` itself.

Refused with `NotDifferentiable` (at backward, naming the input): semirings other than
plus_times, masks, and what `derivative` refuses (division by a non-literal, sqrt, log).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..frontend.derivative import NotDifferentiable, derivative, fresh_name
from ..frontend.functions import FUNCTIONS
from ..frontend.notation import Access, Assignment, Literal, accesses, indices_of
from ..tensors.formats import Format, dense
from ..tensors.tensor import Tensor, as_tensor


@dataclass(frozen=True, slots=True)
class GradientKernel:
    """The kernel computing input ``wrt``'s gradient from the output's gradient
    ``grad_name``: ``kept`` are the positions of ``wrt``'s indices the statement's output
    has (a broadcast or gather supplies the rest); ``masked``: the name of the mask (the
    input's pattern, passed as the input) of a sparse output in the input's format, or ""."""

    wrt: str
    grad_name: str
    kernel: Any  # a `Kernel`; None where the gradient is 0 everywhere (`sign`'s)
    kept: tuple[int, ...]
    order: int
    masked: str
    #: (name, the forward access and mode giving its extent) of each vector of ones read
    ones: tuple[tuple[str, str, int], ...] = ()

    @property
    def statement(self) -> str:
        return "0" if self.kernel is None else str(self.kernel.assignment)


#: the gradient kernels of each forward `Kernel` (this module does not import api.kernel,
#: which imports the autograd hook that calls it: the forward kernel's class builds them)
_made: weakref.WeakKeyDictionary[Any, dict[str, GradientKernel]] = weakref.WeakKeyDictionary()
_made_lock = threading.Lock()


def gradient_kernel(forward: Any, wrt: str) -> GradientKernel:
    """The gradient kernel of input ``wrt`` of ``forward`` (derived once, then kept)."""
    with _made_lock:
        found = _made.setdefault(forward, {}).get(wrt)
    if found is None:
        found = _derive(forward, wrt)
        with _made_lock:
            _made[forward][wrt] = found
    return found


def _derive(forward: Any, wrt: str) -> GradientKernel:
    sem = forward.semantics
    stmt = forward.assignment
    if sem.semiring != "plus_times":
        raise NotDifferentiable(
            f"the gradient of '{wrt}': {stmt} is computed under the {sem.semiring} "
            "semiring; sparsec derives gradients of plus_times statements only"
        )
    if sem.mask:
        raise NotDifferentiable(
            f"the gradient of '{wrt}': {stmt} is masked by '{sem.mask}'; sparsec derives "
            "gradients of unmasked statements only"
        )
    # "d"+name and name+"_pattern" are never "threads", the one reserved input name
    taken = {a.name for a in stmt.accesses()} | set(FUNCTIONS)
    grad_out = fresh_name(f"d{stmt.lhs.name}", taken)
    grad_in = fresh_name(f"d{wrt}", taken | {grad_out})
    made_here = derivative(Assignment(stmt.lhs, stmt.rhs), wrt, grad_out, grad_in)
    found = made_here.statement
    target = found.lhs.indices
    if isinstance(found.rhs, Literal):
        # every term vanished (sign' = 0): zeros of the input's shape or entries, no kernel
        return GradientKernel(wrt, grad_out, None, (), len(target), "")
    read = indices_of(found.rhs)
    kept = tuple(n for n, i in enumerate(target) if i in read)
    lhs = Access(grad_in, tuple(target[n] for n in kept))
    formats: dict[str, str | Format] = dict(forward.level_formats)
    formats[grad_out] = dense(stmt.lhs.order)
    source = formats[wrt]
    sparse = isinstance(source, Format) and not source.is_dense
    masked = sparse and len(kept) == len(target)
    formats[grad_in] = source if masked else dense(len(kept))
    # the mask is an extra input (the statement may read the input itself): the caller
    # passes the input under this name too
    pattern = fresh_name(f"{wrt}_pattern", taken | {grad_out, grad_in})
    formats[pattern] = source
    ones = []  # each vector of ones with the forward read and mode giving its extent
    for name, v in made_here.ones:
        formats[name] = dense(1)
        use = next(a for a in accesses(stmt.rhs) if v in a.indices)
        ones.append((name, use.name, use.indices.index(v)))
    statement = Assignment(lhs, found.rhs)
    named = {a.name for a in statement.accesses()} | ({pattern} if masked else set())
    made = type(forward)(
        str(statement),
        {k: v for k, v in formats.items() if k in named},
        # sparse outputs have no GPU mapping yet: a pattern gradient runs on the host
        target="c" if masked else forward.target,
        dtype=forward.dtype,
        index_dtype=forward.index_dtype,
        division=sem.division,
        mask=pattern if masked else None,
    )
    masked_by = pattern if masked else ""
    return GradientKernel(wrt, grad_out, made, kept, len(target), masked_by, tuple(ones))


def gradients(
    kernel: Any,
    inputs: Mapping[str, Any],
    grad_output: Any,
    wanted: Sequence[str],
    threads: int | None = None,
) -> dict[str, Any]:
    """The gradient of each input named in ``wanted`` given the output's gradient.
    ``inputs`` as a kernel call takes them (numpy, torch (requires_grad allowed; detached
    here), scipy, sparsec.Tensor). A dense input's gradient: an array of its shape (torch
    when grad_output is torch, else numpy). A sparse input's: a 1-D array of values aligned
    with its stored entries in the order sparsec.Tensor(as_tensor(input)).vals holds them."""
    torch_out = _is_torch(grad_output)
    plain = {k: _detached(v) for k, v in inputs.items()}
    dy = _detached(grad_output)
    if isinstance(dy, Tensor) or _is_sparse_torch(dy):
        dy = np.asarray(as_tensor(dy).to_dense())
    dy = _c_ordered(dy, threads)
    stmt = kernel.assignment
    out: dict[str, Any] = {}
    found: Any
    for name in wanted:
        if stmt.accumulate and name == stmt.lhs.name:
            # d(Y_old) = dY: at its stored entries for a sparse current value
            found = _as_numpy(dy).copy()
            if _is_sparse(plain[name]):
                found = found[tuple(as_tensor(plain[name]).coords()[0])]
        else:
            grad = gradient_kernel(kernel, name)
            found = _run(grad, plain, dy, threads)
        out[name] = _as_torch(found) if torch_out else _as_numpy(found)
    return out


def _run(grad: GradientKernel, inputs: Mapping[str, Any], dy: Any, threads: int | None) -> Any:
    source = inputs[grad.wrt]
    # a sparse input is packed once here (each as_tensor of a torch or scipy one converts)
    packed = as_tensor(source) if _is_sparse(source) else None
    shape = tuple(packed.shape) if packed is not None else tuple(np.shape(source))
    dtype = _value_dtype(dy)
    if grad.kernel is None:
        return np.zeros(packed.nnz if packed is not None else shape, dtype=dtype)
    names = {t.argument for t in grad.kernel.binder.wanted}
    args = {k: v for k, v in inputs.items() if k in names}
    args[grad.grad_name] = dy
    if grad.masked:
        # a dense array packed into a sparse format is a dense input: its gradient is
        # wanted at every element, so the pattern is all of them
        args[grad.masked] = source if packed is not None else np.ones(shape, dtype=dtype)
    for name, tensor, mode in grad.ones:
        # in dY's own type, so that the call's value dtype stays dY's
        extent = _shape(inputs[tensor])[mode]
        if _is_torch(dy):
            import torch

            args[name] = torch.ones(extent, dtype=dy.dtype)
        else:
            args[name] = np.ones(extent, dtype=dtype)
    result = grad.kernel(threads=threads, **args)
    if grad.masked:
        if packed is None:
            return np.asarray(result.to_dense())
        return _aligned(result, packed)
    result = _as_numpy(result)
    # variables of the input the statement does not read are a broadcast of the result
    missing = [n for n in range(grad.order) if n not in grad.kept]
    full = np.broadcast_to(np.expand_dims(result, missing), shape) if missing else result
    if packed is not None:
        # gathered at the input's stored entries (one value each, whatever ``missing``)
        return np.ascontiguousarray(full[tuple(packed.coords()[0])])
    return np.ascontiguousarray(full) if missing else result


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(as_tensor(x).shape) if _is_sparse(x) else tuple(np.shape(x))


def _value_dtype(dy: Any) -> Any:
    """The value dtype of the output's gradient as numpy spells it (float32 for torch's
    16-bit dtypes, which numpy lacks or the kernels read as float32 anyway)."""
    if _is_torch(dy):
        name = str(dy.dtype).removeprefix("torch.")
        return np.dtype(name) if name in ("float32", "float64") else np.dtype(np.float32)
    dt = np.asarray(dy).dtype
    return dt if dt.kind == "f" else np.dtype(np.float64)


def _aligned(result: Tensor, reference: Tensor) -> np.ndarray:
    """``result``'s values (a subset of ``reference``'s stored entries, in its format) at
    each stored entry of ``reference``, 0 where ``result`` has none."""
    if result.format == reference.format and all(
        _same(a.pos, b.pos) and _same(a.crd, b.crd)
        for a, b in zip(result.levels, reference.levels, strict=True)
    ):
        return result.vals.copy()
    shape = reference.shape
    want = np.ravel_multi_index(tuple(reference.coords()[0]), shape) if shape else np.zeros(1)
    have = np.ravel_multi_index(tuple(result.coords()[0]), shape) if shape else np.zeros(1)
    order = np.argsort(have, kind="stable")
    have, vals = have[order], result.vals[order]
    at = np.minimum(np.searchsorted(have, want), max(len(have) - 1, 0))
    out = np.zeros(reference.nnz, dtype=result.vals.dtype)
    if len(have):
        hit = have[at] == want
        out[hit] = vals[at[hit]]
    return out


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool(np.array_equal(a, b))


# ----------------------------------------------------------------- array kinds


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def _is_sparse_torch(x: Any) -> bool:
    return _is_torch(x) and str(x.layout) != "torch.strided"


def _is_sparse(x: Any) -> bool:
    if isinstance(x, Tensor):
        return not x.format.is_dense
    return _is_sparse_torch(x) or hasattr(x, "tocoo")


def _detached(x: Any) -> Any:
    return x.detach() if _is_torch(x) else x


def _c_ordered(dy: Any, threads: int | None) -> Any:
    """The output's gradient C-ordered once for every gradient kernel that reads it, by the
    compiled copy where it is a strided float array (SparseLinear's arrives transposed, and
    torch's copy of a transpose is the slower: docs/decisions.md, "A dense operand is bound
    C-ordered by the compiled copy"); other torch tensors by torch, anything else as it is
    (the binder converts it)."""
    from ..runtime.binding import resolve_threads
    from ..runtime.copies import contiguous_copy

    if _is_torch(dy):
        floats = str(dy.dtype) in ("torch.float32", "torch.float64")
        if dy.is_contiguous() or not (floats and dy.is_cpu):
            return dy.contiguous()
        import torch

        return torch.from_numpy(contiguous_copy(dy.numpy(), resolve_threads(threads)))
    if isinstance(dy, np.ndarray) and not dy.flags.c_contiguous:
        return contiguous_copy(dy, resolve_threads(threads))
    return dy


def _as_numpy(x: Any) -> Any:
    if _is_torch(x):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _as_torch(x: Any) -> Any:
    import torch

    return x if torch.is_tensor(x) else torch.from_numpy(np.ascontiguousarray(x))
