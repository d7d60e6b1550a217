"""A call's inputs bound to a kernel's tensors: names, dtypes, layouts and extents checked
before any pointer reaches a kernel (`Binder.prepare`), and the result handed back in the
caller's kind of array (`Prepared.wrap`).

Every input is validated: names (missing / extra), types, orders, dtypes, agreement of every
index variable's extent, and, for sparse inputs, the storage invariants (done once, when the
`Tensor` is built; Tensors are immutable). The conversions themselves are
`sparsec.runtime.binding`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..base.errors import DTypeError, InputError, ShapeError
from ..base.target import Target
from ..middle.spec import Derived, Folded, Spec, TensorVar
from ..policy.costs import Columns
from ..policy.dtypes import check_c_dtype
from ..tensors.convert import derive_dense
from ..tensors.halves import HALF, bfloat16_bits, readable, rounded, to_storage
from ..tensors.stored import Stored, half_tensor, stored
from ..tensors.tensor import Tensor
from . import device as runtime_device
from .binding import (
    INT64,
    VALUE_DTYPES,
    common_dtype,
    common_index_dtype,
    convert_input,
    is_torch,
    widen,
)
from .copies import contiguous_copy


def dtype_name(dt: Any, table: Mapping[str, Any], what: str) -> str | None:
    """The name in ``table`` of a dtype given as a name, numpy dtype or type, or torch dtype."""
    if dt is None:
        return None
    use = f"use {' or '.join(repr(n) for n in table)}"
    if isinstance(dt, str):
        try:
            name = np.dtype(dt).name  # 'f8', 'double', 'float' -> float64
        except TypeError:
            name = dt
    elif type(dt).__module__ == "torch" and str(dt).startswith("torch."):
        name = str(dt).removeprefix("torch.")  # torch.float32 -> float32
    else:
        try:
            name = np.dtype(dt).name
        except (TypeError, ValueError):
            raise DTypeError(f"{what} {dt!r} is not a dtype; {use}") from None
    if name not in table:
        raise DTypeError(f"{what} {name!r} is not supported; {use}")
    return name


@dataclass(frozen=True, slots=True)
class Prepared:
    """Inputs in kernel layout: floats (scalars), C-ordered ndarrays (dense), Tensors."""

    values: dict[str, Any]
    dims: dict[str, int]
    dtype: str
    index_dtype: str
    use_torch: bool
    #: some input is in GPU memory (target="cuda"): the output stays there too
    device: bool = False

    def wrap(self, out: Any) -> Any:
        """A kernel's result as the caller's kind of array (torch in, torch out)."""
        if isinstance(out, Tensor):  # a sparse output is a sparsec.Tensor, 16-bit ones too
            return half_tensor(out, self.dtype) if self.dtype in HALF else out
        # a bfloat16 result comes as float32 (numpy and CuPy have no bfloat16): torch's own
        bf16 = self.use_torch and self.dtype == "bfloat16"
        if self.device and np.ndim(out):
            out = runtime_device.cupy_device().ascontiguousarray(out)
            if self.use_torch:
                import torch

                got = torch.as_tensor(out, device="cuda")
                return got.to(torch.bfloat16) if bf16 else got
            return out
        if self.use_torch:
            import torch

            got = torch.from_numpy(np.ascontiguousarray(out)) if np.ndim(out) else torch.tensor(out)
            return got.to(torch.bfloat16) if bf16 else got
        return np.ascontiguousarray(out) if np.ndim(out) else out


class Binder:
    """The inputs one kernel takes and how their shapes bind its index variables.

    ``dtype`` and ``index_dtype`` are the kernel's fixed dtypes (None: inferred per call);
    ``statement`` names the kernel in errors (as written: a sparse '+=' is compiled as
    ``C = C_old + ...``)."""

    __slots__ = (
        "wanted",
        "names",
        "modes",
        "target",
        "dtype",
        "index_dtype",
        "statement",
        "_renamed",
        "_direct",
        "_carriers",
        "derived",
        "static",
    )

    def __init__(
        self,
        spec: Spec,
        target: Target,
        dtype: str | None,
        index_dtype: str | None,
        statement: str,
    ) -> None:
        #: inputs the runtime computes from a passed tensor (`sparsec.middle.derive`)
        self.derived = spec.derived
        #: extents the generated code holds as numbers (`Spec.static`): checked per call
        self.static = spec.static
        sources = {d.name: tuple(t for t, _ in d.reads) for d in spec.derived}
        #: the tensors a call passes: the inputs (a derived input's sources in its place),
        #: and a sparse '+='s current output
        passed = (s for t in spec.inputs for s in sources.get(t.name, (t,)))
        self.wanted: tuple[TensorVar, ...] = tuple({t.name: t for t in passed}.values()) + (
            (spec.output,) if spec.statement.accumulate else ()
        )
        #: the keywords a call passes (a sparse output's current value for '+=' comes as
        #: the output's name, `TensorVar.argument`)
        self.names = frozenset(t.argument for t in self.wanted)
        self._renamed = any(t.argument != t.name for t in self.wanted)
        #: the passed tensors the kernel reads as they are (not only through a derived copy)
        self._direct = frozenset(t.name for t in spec.inputs) | {spec.output.name}
        #: the dense operands a call may run in column panels, kept at their strides: a
        #: panel is packed from the operand as passed (a transposed view included), and a
        #: call run whole copies it C-ordered first (`Executable.run`)
        self._carriers = frozenset(Columns.of(spec, target).carriers)
        wanted = {t.name: t for t in self.wanted}
        #: (tensor, axis of the converted value, index) for every access of every input (a
        #: tensor used twice, as in A(k,i)*A(k,j), ties both index lists to its shape);
        #: dense values are kept in level order
        self.modes = tuple(
            dict.fromkeys(
                (a.name, t.format.level_of_mode(mode) if t.is_dense else mode, index)
                for a in spec.assignment.accesses()
                if (t := wanted.get(a.name)) is not None
                and (a is not spec.assignment.lhs or a.name in self.names)
                for mode, index in enumerate(a.indices)
            )
        ) + tuple(
            # a derived input's sources bind the variables of the accesses as written
            # (A(i,i) ties both of A's extents to i)
            (t.name, t.format.level_of_mode(mode) if t.is_dense else mode, index)
            for d in spec.derived
            for t, indices in d.reads
            for mode, index in enumerate(indices)
        )
        self.target = target
        self.dtype = dtype
        self.index_dtype = index_dtype
        self.statement = statement

    def name_error(self, inputs: Mapping[str, Any]) -> InputError:
        names = [t.argument for t in self.wanted]
        missing = [n for n in names if n not in inputs]
        extra = [n for n in inputs if n not in names]
        parts = []
        if missing:
            parts.append(f"missing input{'s' * (len(missing) > 1)} {', '.join(map(repr, missing))}")
        if extra:
            parts.append(f"unexpected input{'s' * (len(extra) > 1)} {', '.join(map(repr, extra))}")
        takes = ", ".join(names) or "no inputs"
        return InputError(f"{'; '.join(parts)}; kernel {self.statement} takes {takes}")

    def no_positional(self, args: tuple[Any, ...]) -> None:
        """Refuse inputs passed by position (a call names each one)."""
        if not args:
            return
        count = len(args)
        names = [t.argument for t in self.wanted]
        spelled = ", ".join(f"{n}=..." for n in names) or ""
        raise InputError(
            f"{count} input{'s' * (count > 1)} passed by position; a kernel takes its inputs "
            f"by name, as the statement {self.statement} names them: k({spelled})"
        )

    def prepare(self, inputs: Mapping[str, Any], threads: int = 1) -> Prepared:
        """Validate and convert the inputs; cheap when they already fit (the hot path). The
        copies that derived inputs need are made by up to ``threads`` threads."""
        if inputs.keys() != self.names:
            raise self.name_error(inputs)
        if self._renamed:
            inputs = {t.name: inputs[t.argument] for t in self.wanted}
        dtype = self.dtype or common_dtype(self.wanted, inputs)
        if not self.target.gpu and dtype in HALF:
            check_c_dtype(dtype)
        index_dtype = self.index_dtype or common_index_dtype(self.wanted, inputs)
        values = {}
        device = False
        for t in self.wanted:
            value = inputs[t.name]
            if runtime_device.on_device(value):
                values[t.name] = self._device_input(t, value, dtype, index_dtype)
                device = True
            else:
                direct = t.name in self._direct and t.name not in self._carriers
                values[t.name] = convert_input(t, value, dtype, index_dtype, direct, threads)
        if self.index_dtype is None and index_dtype == "int32":
            # A large input may have forced int64: bring every sparse input to one width.
            if any(isinstance(v, Tensor) and v.index_dtype == INT64 for v in values.values()):
                index_dtype = "int64"
                values = {n: widen(v) for n, v in values.items()}
        dims = self.dims(values)  # checks the extents a repeated index ties together
        for index, size in self.static:  # extents the generated code holds as numbers
            if dims.get(index, size) != size:
                raise ShapeError(
                    f"index {index} has extent {dims[index]} in the inputs, but the formats fix "
                    f"it at {size} (a block's inner index): pass tensors in the kernel's formats"
                )
        for d in self.derived:
            if isinstance(d, Folded):
                values[d.name] = _fold(d, values, dtype, threads)
            else:
                values[d.name] = _derive(d, values[d.source.name], threads)
        use_torch = any(is_torch(v) for v in inputs.values())
        return Prepared(values, dims, dtype, index_dtype, use_torch, device)

    def _device_input(self, t: TensorVar, value: Any, dtype: str, index_dtype: str) -> Any:
        """An input in GPU memory: dense operands stay there (a CuPy array in level order),
        sparse ones become `Tensor`s (whose arrays the runtime then keeps on the device)."""
        where = f"input {t.name!r}"
        if not self.target.device:
            raise InputError(
                f"{where} is in GPU memory, but this kernel's target is {self.target.name!r}: pass "
                "a host array (CuPy: .get(), torch: .cpu()) or build it with target='cuda'"
            )
        if t.order == 0:
            return convert_input(t, float(value), dtype, index_dtype)
        if t.is_dense:
            return runtime_device.device_dense(
                t.order, t.format.ordering, value, VALUE_DTYPES[dtype], where
            )
        return convert_input(t, runtime_device.device_sparse_to_host(value), dtype, index_dtype)

    def dims(self, values: Mapping[str, Any]) -> dict[str, int]:
        """Each index variable's extent, from the inputs' shapes (which must agree)."""
        dims: dict[str, int] = {}
        seen: dict[str, str] = {}
        for name, mode, index in self.modes:
            size = int(values[name].shape[mode])
            known = dims.get(index)
            if known is None:
                dims[index], seen[index] = size, f"{name} (mode {mode})"
            elif known != size:
                raise ShapeError(
                    f"index {index} has extent {known} in {seen[index]} but {size} in "
                    f"{name} (mode {mode}); shapes must agree wherever an index is shared"
                )
        return dims


def _derive(d: Derived, value: Any, threads: int = 1) -> Any:
    """Derived input ``d`` from its source's value in kernel layout: a sparse source's copy
    is kept on the `Tensor` (`Tensor.derived`), so a Tensor passed again costs nothing; a
    dense source (an array in level order) gives its diagonal, a C-ordered copy."""
    if isinstance(value, Stored):  # a 16-bit kernel's: the copy's values stored too
        return stored(value.derived(d.indices, d.format), value.value_dtype)
    if isinstance(value, Tensor):
        return value.derived(d.indices, d.format)
    source = d.source.format
    if runtime_device.on_device(value):
        raise InputError(
            f"input {d.source.name!r} is read as {d.source.name}({','.join(d.indices)}), "
            "whose diagonal is taken on the host: pass a host array (CuPy: .get(), "
            "torch: .cpu())"
        )
    level_indices = tuple(d.indices[m] for m in source.ordering)
    out = tuple(d.distinct[m] for m in d.format.ordering)
    return contiguous_copy(np.asarray(derive_dense(value, level_indices, out)), threads)


def _fold(d: Folded, values: Mapping[str, Any], dtype: str, threads: int = 1) -> Any:
    """Folded input ``d`` from its factors' values (dense arrays in level order, in the
    kernel's dtype; on the GPU when they are): each brought to ``d``'s level order (a
    view), then combined as `Folded` says, into a C-ordered array. Computed on every
    call, so it always follows the values passed. 16-bit values are combined in float32
    (as the kernel would) and stored back, rounded once."""
    if dtype in HALF:
        as_float = {f.source.name: readable(values[f.source.name], dtype) for f in d.factors}
        combined = _fold(d, {n: v.astype(np.float32) for n, v in as_float.items()}, "float32")
        if runtime_device.on_device(combined):
            return rounded(combined, dtype) if dtype == "float16" else _device_bits(combined)
        return to_storage(combined, dtype)
    levels = [d.distinct[m] for m in d.format.ordering]
    parts = []
    for f in d.factors:
        value = values[f.source.name]
        own = [f.indices[m] for m in f.source.format.ordering]
        parts.append(value.transpose([own.index(v) for v in levels]))
    out = parts[0]
    with np.errstate(all="ignore"):  # x/0 is ±inf and 0/0 NaN, as in the kernel
        if d.factors[0].divides:  # only divisors: their product, which the kernel divides by
            for part in parts[1:]:
                out = out * part
        else:
            for part, f in zip(parts[1:], d.factors[1:], strict=True):
                out = out / part if f.divides else out * part
    if runtime_device.on_device(out):
        return runtime_device.cupy_device().ascontiguousarray(out)
    return contiguous_copy(np.asarray(out), threads)


def _device_bits(values: Any) -> Any:
    """float32 values on the GPU as bfloat16 storage (rounded there)."""
    return bfloat16_bits(runtime_device.cupy_device().ascontiguousarray(values, dtype="float32"))
