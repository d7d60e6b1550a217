"""Kernels as torch custom ops: ``torch_op(kernel)`` registers one `torch.library` op per
kernel identity, so ``torch.compile(fullgraph=True)`` traces a model that calls it with no
graph break, and autograd runs the kernel's derived gradient statements.

The op's operands are the kernel's passed tensors (`Binder.wanted`, a dense ``+=``'s current
output included), each flattened to plain dense torch tensors: a dense operand is itself; a
sparse one is its level arrays (pos then crd, per level, as its format stores them) then its
1-D vals, with its shape as static ints. Dynamo's fake tensors cannot carry torch sparse
layouts, so none enter. The fake implementation gives the output's shape (each output index
variable's extent, read from the first operand access that binds it) and dtype (the first
floating operand's) without running anything.

The op's name is ``sparsec::k_<hash>``, the hash of what rebuilds the kernel (expression,
formats, target, schedule, dtypes, division, semiring, mask): no user text enters the name
or the generated schema (operands are named ``a0, a1, ...``). It is registered once per
process; a second Kernel with the same identity reuses it. The backward calls
`sparsec.api.gradient.gradients` (the gradient statements derived from the notation); the
level arrays get no gradient (the pattern is fixed). torch is imported inside functions
only: ``import sparsec`` stays free of it.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..base.errors import InputError, SparsecError
from ..middle.spec import TensorVar
from ..tensors.halves import HALF
from ..tensors.storage import LevelStorage
from ..tensors.stored import stored
from ..tensors.tensor import Tensor
from .kernel import Kernel


@dataclass(frozen=True, slots=True)
class Components:
    """A sparse operand as torch tensors: ``levels[k]`` is ``(pos, crd)`` of storage level k
    (None where the level stores no such array: both for dense, pos for singleton), ``vals``
    the 1-D values in storage order, ``shape`` the dimensions (static ints)."""

    shape: tuple[int, ...]
    levels: tuple[tuple[Any, Any], ...]
    vals: Any


@dataclass(frozen=True, slots=True)
class _Operand:
    """One passed tensor of the kernel: ``arrays`` are the (level, 'pos'|'crd') slots it
    contributes before its vals (empty for a dense operand)."""

    var: TensorVar
    indices: tuple[str, ...]
    arrays: tuple[tuple[int, str], ...]

    @property
    def sparse(self) -> bool:
        return not self.var.is_dense

    @property
    def width(self) -> int:
        return len(self.arrays) + 1


class TorchOp:
    """A kernel registered as the torch op ``name``; call it like the kernel, with torch
    tensors for dense operands and `Components` for sparse ones."""

    def __init__(self, kernel: Kernel, name: str) -> None:
        self.kernel = kernel
        self.name = name
        accesses = {a.name: tuple(a.indices) for a in kernel.assignment.accesses()}
        self.operands = tuple(
            _Operand(
                t,
                accesses[t.argument if t.argument in accesses else t.name],
                tuple(
                    (k, field)
                    for k, level in enumerate(t.format.levels)
                    for field in ("pos", "crd")
                    if field in level.arrays
                ),
            )
            for t in kernel.binder.wanted
        )
        self.output_indices = tuple(kernel.assignment.lhs.indices)
        #: the arguments the runtime may pack in column panels (`Columns.carriers`)
        carriers = set(kernel.columns.carriers)
        self._carriers = frozenset(t.argument for t in kernel.binder.wanted if t.name in carriers)
        #: each operand's name and the flat slot of its values (a sparse one's vals, a dense
        #: one itself): the slots that take a gradient
        self.value_slots = tuple(
            (o.var.argument, sum(p.width for p in self.operands[: n + 1]) - 1)
            for n, o in enumerate(self.operands)
        )
        self.op = _register(self)

    # ------------------------------------------------------------------ calling
    def __call__(self, /, *args: Any, threads: int | None = None, **inputs: Any) -> Any:
        """The kernel's output as a torch tensor (differentiable in the vals and the dense
        operands)."""
        self.kernel.binder.no_positional(args)
        wanted = [o.var.argument for o in self.operands]
        missing, unknown = [n for n in wanted if n not in inputs], set(inputs) - set(wanted)
        if missing or unknown:
            raise InputError(
                f"the op takes the inputs {', '.join(wanted)} by name: "
                + "; ".join(
                    f"{what} {', '.join(sorted(names))}"
                    for what, names in (("missing", missing), ("unexpected", unknown))
                    if names
                )
            )
        flat: list[Any] = []
        shapes: list[int] = []
        for operand in self.operands:
            value = inputs[operand.var.argument]
            if operand.sparse:
                flat.extend(value.levels[k][0 if f == "pos" else 1] for k, f in operand.arrays)
                flat.append(value.vals)
                shapes.extend(value.shape)
            else:
                flat.append(value)
        args = (*flat, shapes, -1 if threads is None else threads)
        if _eager_without_grad(flat):
            # what the op would run, without torch's dispatch around a Python custom op
            # (docs/decisions.md, "An eager call without gradients runs the op's
            # implementation")
            return self.run(args)
        return self.op(*args)

    def unflatten(self, args: tuple[Any, ...]) -> tuple[dict[str, Any], dict[str, int]]:
        """The kernel's inputs from the op's arguments (sparse ones as `Tensor` over numpy
        views of the level arrays), and which flat argument holds each operand's values."""
        tensors, shapes = args[:-2], list(args[-2])
        inputs: dict[str, Any] = {}
        where: dict[str, int] = {}
        at = 0
        for operand in self.operands:
            name = operand.var.argument
            if operand.sparse:
                order = operand.var.order
                shape, shapes = tuple(shapes[:order]), shapes[order:]
                inputs[name] = self._tensor(operand, shape, tensors[at : at + operand.width])
            else:
                inputs[name] = tensors[at]
            where[name] = at + operand.width - 1
            at += operand.width
        return inputs, where

    def _tensor(self, operand: _Operand, shape: tuple[int, ...], parts: tuple[Any, ...]) -> Any:
        arrays = {slot: _host(a) for slot, a in zip(operand.arrays, parts, strict=False)}
        levels = tuple(
            LevelStorage(arrays.get((k, "pos")), arrays.get((k, "crd")))
            for k in range(len(operand.var.format.levels))
        )
        index_dtype = arrays[operand.arrays[0]].dtype  # a sparse operand has index arrays
        vals, half = parts[-1], str(parts[-1].dtype).removeprefix("torch.")
        if half not in HALF:
            return Tensor(shape, operand.var.format, levels, _host(vals), index_dtype)
        # 16-bit values: float32 holds them exactly, and the kernel reads them in 16 bits
        exact = _host(vals.float())
        return stored(Tensor(shape, operand.var.format, levels, exact, index_dtype), half)

    def gradients(self, args: tuple[Any, ...]) -> list[Any]:
        """The gradient op's CPU implementation: ``args`` are the operands, the output's
        gradient, the shapes, the threads and the flat slots wanted (each a dense operand or
        a sparse one's vals); `gradients` derives and runs the gradient statements."""
        import torch

        # H1's module (the gradient statements derived from the notation), imported at the
        # first backward only
        from .gradient import gradients

        count = len(args) - 4
        tensors, grad = args[:count], args[count]
        shapes, threads, wanted = args[count + 1 :]
        inputs, _ = self.unflatten((*tensors, shapes, threads))
        names = {at: name for name, at in self.value_slots}
        # a dense '+=' adds the statement to the output's current value: that operand's
        # gradient is the output's (plus_times); the rest are derived statements
        spec = self.kernel.spec
        start = spec.output.argument if spec.statement.accumulate else None
        if self.kernel.semantics.semiring != "plus_times":
            start = None
        derived = [names[at] for at in wanted if names[at] != start]
        found: dict[str, Any] = {start: grad} if start is not None else {}
        if derived:
            found |= gradients(
                self.kernel,
                inputs,
                grad,  # made C-ordered there, once, by the compiled copy
                derived,
                threads=threads if threads >= 0 else None,
            )
        taken = {t.untyped_storage().data_ptr() for t in (*tensors, grad)}
        out = []
        for at in wanted:
            value = found[names[at]]
            g = torch.as_tensor(value if torch.is_tensor(value) else np.asarray(value))
            g = g.to(tensors[at]).reshape(tensors[at].shape)
            # an op's output may not alias its inputs (d(Yt_old) of a '+=' is the gradient)
            out.append(g.clone() if g.untyped_storage().data_ptr() in taken else g.contiguous())
        return out

    def run(self, args: tuple[Any, ...]) -> Any:
        """The op's CPU implementation: the kernel on numpy views, the output as torch."""
        import torch

        inputs, _ = self.unflatten(args)
        threads = args[-1] if args[-1] >= 0 else None
        # a dense operand the runtime may pack in column panels keeps its strides: a panel is
        # packed straight from a transposed view (`Binder._carriers`)
        kept = self._carriers
        # the operands are the compiled statement's own (over a mapped format's levels):
        # `run_levels`, not the call that carries a user's tensors into them
        out = self.kernel.run_levels(
            {k: v if isinstance(v, Tensor) else _host(v, k in kept) for k, v in inputs.items()},
            threads,
        )
        return torch.from_numpy(np.ascontiguousarray(out))

    def fake(self, args: tuple[Any, ...]) -> Any:
        """The output's shape and dtype from the operands' extents, for fake/meta tensors."""
        tensors, shapes = args[:-2], list(args[-2])
        extents: dict[str, Any] = {}
        dtype = None
        at = 0
        for operand in self.operands:
            if operand.sparse:
                order = operand.var.order
                dims, shapes = shapes[:order], shapes[order:]
            else:
                dims = list(tensors[at].shape)
            value = tensors[at + operand.width - 1]
            dtype = dtype or (value.dtype if value.dtype.is_floating_point else None)
            for index, dim in zip(operand.indices, dims, strict=True):
                extents.setdefault(index, dim)
            at += operand.width
        shape = [extents[i] for i in self.output_indices]
        return tensors[0].new_empty(shape, dtype=dtype)


def _host(t: Any, strided: bool = False) -> np.ndarray:
    """A torch CPU tensor as a C-contiguous numpy view (copied only if strided), or, with
    ``strided``, a numpy view at its own strides where they are positive."""
    t = t.detach()
    if strided and all(s > 0 for s in t.stride()) and t.dtype.is_floating_point:
        try:
            return t.numpy()
        except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16)
            pass
    return t.contiguous().numpy()


_LOCK = threading.Lock()
_REGISTERED: dict[str, TorchOp] = {}


def identity(kernel: Kernel) -> str:
    """The op name of ``kernel``: a hash of what rebuilds it (`Kernel.__reduce__`)."""
    digest = hashlib.sha256(repr(kernel.__reduce__()[1]).encode()).hexdigest()
    return f"sparsec::k_{digest[:20]}"


def torch_op(kernel: Kernel) -> TorchOp:
    """The torch op for ``kernel``, registered on the first request for its identity."""
    if kernel.platform.device:  # kernels on the host run on torch's CPU tensors
        raise SparsecError(
            f"torch ops run on CPU tensors; this kernel's target is {kernel.target!r} "
            "(build it with target='c')"
        )
    if not kernel.spec.output.is_dense:
        raise InputError(
            "a torch op returns a dense tensor; this kernel's output is sparse "
            f"({kernel.spec.output.format}): give the output a dense format"
        )
    name = identity(kernel)
    with _LOCK:
        found = _REGISTERED.get(name)
        if found is None:
            found = _REGISTERED[name] = TorchOp(kernel, name)
        return found


def _eager_without_grad(flat: list[Any]) -> bool:
    """Whether a call's operands ``flat`` are plain CPU tensors in plain eager mode, where
    no gradient is recorded: not traced or compiled (dynamo, ``torch.jit.trace``, an FX
    proxy, a fake or functional tensor), under no dispatch or function mode, and no
    operand requiring a gradient while gradients are recorded. The op's implementation
    then runs as the op would run it."""
    import torch

    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    if torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled():
        return False
    grad, plain = torch.is_grad_enabled(), (torch.Tensor, torch.nn.Parameter)
    for t in flat:
        if type(t) not in plain or t.device.type != "cpu" or (grad and t.requires_grad):
            return False
    return True


def _register(op: TorchOp) -> Any:
    """Define the op and its gradient op (``<name>_grad``: the operands, the output's
    gradient and the flat slots wanted -> their gradients), each with a fake implementation,
    and the autograd formula that calls the gradient op, so a compiled backward traces it
    too."""
    import torch

    count = sum(o.width for o in op.operands)
    params = ", ".join(f"Tensor a{n}" for n in range(count))
    schema = f"({params}, int[] shapes, int threads) -> Tensor"
    grad_schema = f"({params}, Tensor grad, int[] shapes, int threads, int[] wanted) -> Tensor[]"

    def run(*args: Any) -> Any:
        return op.run(args)

    def fake(*args: Any) -> Any:
        return op.fake(args)

    def run_grad(*args: Any) -> Any:
        return op.gradients(args)

    def fake_grad(*args: Any) -> Any:
        return [torch.empty_like(args[at]) for at in args[-1]]

    grad_op = torch.library.custom_op(
        f"{op.name}_grad", run_grad, mutates_args=(), schema=grad_schema
    )
    grad_op.register_fake(fake_grad)
    defined = torch.library.custom_op(op.name, run, mutates_args=(), schema=schema)
    defined.register_fake(fake)

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.save_for_backward(*inputs[:-2])
        ctx.shapes = list(inputs[-2])
        ctx.threads = inputs[-1]

    def backward(ctx: Any, grad: Any) -> tuple[Any, ...]:
        wanted = [at for _, at in op.value_slots if ctx.needs_input_grad[at]]
        out: list[Any] = [None] * count
        if wanted:
            grads = grad_op(*ctx.saved_tensors, grad, ctx.shapes, ctx.threads, wanted)
            for at, g in zip(wanted, grads, strict=True):
                out[at] = g
        return (*out, None, None)

    defined.register_autograd(backward, setup_context=setup_context)
    return defined
