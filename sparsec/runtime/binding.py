"""Binding inputs to a kernel: dtype inference, conversion into the kernel's layout, and
the checks that run before any pointer reaches C.

A scalar operand becomes a float; a dense operand a C-ordered ndarray *in level order* of
the kernel's value dtype; a sparse operand a validated `Tensor` in the declared format
(converted when it was passed in another one). Unsupported dtypes (complex, strings) are
refused rather than converted. A float16/bfloat16 kernel takes its values in 16-bit storage
(`sparsec.tensors.halves`): dense operands as storage arrays, sparse ones as `Stored`
tensors.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..base.errors import DTypeError, InputError, ShapeError, SparsecError
from ..base.values import integral_name, is_integral, promote, value_type
from ..middle.spec import TensorVar
from ..policy import machine as policy_machine
from ..policy.machine import LOAD_INTERVAL_S, Machine, busy, machine, threads_for
from ..tensors.halves import HALF, STORAGE, to_storage
from ..tensors.stored import Stored, stored
from ..tensors.tensor import Tensor, as_tensor
from .copies import contiguous_copy

#: value dtype name -> the host dtype of its kernel's value arrays (16-bit storage for
#: float16/bfloat16: numpy float16, and the bits as uint16 for bfloat16)
VALUE_DTYPES = dict(STORAGE)
INDEX_DTYPES = {"int32": np.int32, "int64": np.int64}


def configured_threads(on: Machine | None = None) -> int:
    """The threads a default call uses on a quiet machine: ``OMP_NUM_THREADS`` (first
    entry) if set, else every core of the machine ``on`` (`machine()` when None)."""
    wanted = _omp_num_threads() or (on or machine()).cores
    return min(max(1, wanted), MAX_THREADS)


def default_threads() -> int:
    """The threads a call without ``threads=`` uses: `configured_threads`, fewer while
    other work keeps cores busy (`threads_for`), unless ``OMP_DYNAMIC=false`` asks for
    the configured count always. Decided at most every `LOAD_INTERVAL_S` (the load is
    measured no more often) or when the machine changes: a call pays a clock read."""
    global _decided
    due, seen, threads = _decided
    if _clock() < due and seen == policy_machine.epoch:
        return threads
    seen, on = policy_machine.epoch, machine()
    threads = configured_threads(on)
    if threads > 1 and not _omp_dynamic_off():
        threads = threads_for(threads, on.cores, busy(on))
    _decided = (_clock() + LOAD_INTERVAL_S, seen, threads)
    return threads


_clock = time.monotonic
#: (decided until, `policy_machine.epoch` then, the threads decided)
_decided: tuple[float, int, int] = (0.0, -1, 1)


@functools.cache
def _omp_num_threads() -> int | None:
    """``OMP_NUM_THREADS``'s first entry, read once per process."""
    try:
        return int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0])
    except ValueError:
        return None


@functools.cache
def _omp_dynamic_off() -> bool:
    return os.environ.get("OMP_DYNAMIC", "").strip().lower() in ("false", "0", "no", "off")


#: upper bound on ``threads=``: OpenMP teams (and per-thread workspaces) far beyond the
#: machine only cost memory, and the C side holds the count in an ``int``
MAX_THREADS = 1024


def resolve_threads(threads: int | None) -> int:
    if threads is None:
        return use_threads(default_threads())
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
        raise InputError(f"threads must be an integer from 1 to {MAX_THREADS}, not {threads!r}")
    return use_threads(threads)


# ---- OpenMP across fork
# GNU libgomp keeps the team of its first multi-threaded parallel region for the rest of the
# process; a child forked after that inherits the team's bookkeeping but not its threads, and
# its first parallel region with more than one thread waits for them forever. So a call with
# more than one thread is recorded, and a child forked after one runs kernels on one thread.
_parallel_started = False
_forked_after_parallel = False


def use_threads(threads: int) -> int:
    """The thread count a kernel call runs with: ``threads``, or 1 in a process forked after
    a multi-threaded call (see above); records a multi-threaded call."""
    global _parallel_started
    if _forked_after_parallel:
        return 1
    if threads > 1:
        _parallel_started = True
    return threads


def _after_fork_in_child() -> None:
    global _forked_after_parallel
    _forked_after_parallel = _forked_after_parallel or _parallel_started


os.register_at_fork(after_in_child=_after_fork_in_child)


def is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch")


FLOAT32, FLOAT64, INT64 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64)
INT32 = np.dtype(np.int32)
_TORCH_FLOATS = {
    "torch.float32": "float32",
    "torch.float64": "float64",
    "torch.float16": "float16",
    "torch.bfloat16": "bfloat16",
}
#: the value dtypes a call's inputs promote to, narrowest first (torch's rule among them)
_NARROW = {"float16": 0, "bfloat16": 0, "float32": 1}


def _value_dtype_of(value: Any) -> str | None:
    """The name of ``value``'s value dtype (floating, integer or bool); None for nested
    lists and numbers, which take part in a call's promotion by their kind only
    (`_scalar_kind`), and for what has no such dtype."""
    if isinstance(value, Stored):
        return value.value_dtype  # a 16-bit tensor promotes as its type
    if isinstance(value, Tensor):
        return value.vals.dtype.name
    dt: Any = getattr(value, "dtype", None)
    if isinstance(dt, np.dtype):
        return dt.name if dt.kind == "f" else integral_name(dt)
    if dt is None:
        return None
    return _TORCH_FLOATS.get(str(dt)) or integral_name(dt)


def _scalar_kind(value: Any) -> str:
    """A number's or nested list's kind ("f" floating, else "i"): a float scalar makes a
    call of integer arrays compute in float64, as numpy's weak scalars do."""
    if isinstance(value, (float, np.floating)):
        return "f"
    if isinstance(value, (list, tuple)) or type(value) is np.ndarray:
        try:
            return "f" if np.asarray(value).dtype.kind == "f" else "i"
        except (ValueError, TypeError):
            return "i"
    return "i"


def common_dtype(wanted: tuple[TensorVar, ...], inputs: Mapping[str, Any]) -> str:
    """The value dtype of a call. Where any input has a floating dtype, as torch promotes
    over those inputs only: float16 (bfloat16) when every one is float16 (bfloat16); float32
    when every one is float16, bfloat16 or float32; float64 otherwise. Where none has, as
    numpy promotes the integer and bool ones (`values.promote`), or float64 when a number
    or nested list is a float, or nothing has a dtype. The one rule for numpy, scipy, torch
    and Tensor inputs (docs/semantics.md, "Value types")."""
    floats: set[str] = set()
    integral: list[str] = []
    weak_float = False
    for t in wanted:
        value = inputs[t.name]
        dt = _value_dtype_of(value)
        if dt is None:
            weak_float = weak_float or _scalar_kind(value) == "f"
        elif is_integral(dt):
            integral.append(dt)
        elif t.order and dt not in _NARROW:
            return "float64"
        elif t.order:
            floats.add(dt)
        else:
            weak_float = True  # a float 0-d array is a scalar
    if floats:
        return floats.pop() if len(floats) == 1 else "float32"
    if weak_float or not integral:
        return "float64"
    return promote(integral)


def common_index_dtype(wanted: tuple[TensorVar, ...], inputs: Mapping[str, Any]) -> str:
    for t in wanted:
        if t.is_dense:
            continue
        v = inputs[t.name]
        if isinstance(v, Tensor):
            if v.index_dtype == INT64:
                return "int64"
        elif getattr(getattr(v, "indices", None), "dtype", None) == INT64:
            return "int64"
    return "int32"


def widen(value: Any) -> Any:
    if isinstance(value, Tensor) and value.order and value.index_dtype != INT64:
        wide = value.astype(index_dtype="int64")
        # a 16-bit kernel's operand keeps its 16-bit values (astype gives a plain Tensor)
        return stored(wide, value.value_dtype) if isinstance(value, Stored) else wide
    return value


def convert_input(
    t: TensorVar,
    value: Any,
    dtype: str,
    index_dtype: str,
    contiguous: bool = True,
    threads: int = 1,
) -> Any:
    """One input in the kernel's layout: float for scalars, ndarray for dense, Tensor else.
    ``contiguous`` off: a dense one only read through a derived copy (a transpose the
    runtime makes anyway) keeps its strides, so the copy is made once, from it. A dense
    one's C-ordered copy, where it needs one, is made by up to ``threads`` threads."""
    where = f"input {t.name!r}"
    if t.order == 0:
        return _scalar(value, where, dtype)
    if t.is_dense:
        return _dense(t, value, dtype, where, contiguous, threads)
    _reject_dtype(value, where)
    half = dtype in HALF
    np_dtype = FLOAT32 if half else VALUE_DTYPES[dtype]
    if isinstance(value, Stored) and not (half and value.value_dtype == dtype):
        value = value.plain()  # its float values (exact), stored anew below for a half kernel
    if not (
        isinstance(value, Tensor)
        and (value.format is t.format or value.format == t.format)
        and (value.vals.dtype == np_dtype or (half and value.vals.dtype == FLOAT64))
        and value.order == t.order
    ):
        try:
            # a half kernel's sparse operand: its values in float32 (exact for 16-bit
            # inputs), stored in 16 bits below
            value = as_tensor(value, t.format, name=t.name, dtype=np_dtype.name)
        except SparsecError:
            raise
        except Exception as err:  # a foreign object we could not read
            raise InputError(
                f"{where}: cannot convert {type(value).__name__} to a sparse tensor: {err}"
            ) from None
    if value.order != t.order:
        raise ShapeError(
            f"{where} has order {value.order}, but the expression uses it with order {t.order}"
        )
    if index_dtype == "int64":
        value = widen(value)
    elif value.index_dtype != INT32:
        # a kernel built for int32 indices: narrow, or say why it cannot hold this input
        try:
            value = value.astype(index_dtype="int32")
        except DTypeError as err:
            raise DTypeError(
                f"{where}: the kernel was built for int32 indices, but {err}"
            ) from None
    return stored(value, dtype) if half else value


def _scalar(value: Any, where: str, dtype: str) -> float | int:
    """A scalar operand as the kernel's C argument: a float, or for an integral kernel an
    int of its type (a float that is not such an integer, or an integer out of the type's
    range, is refused rather than truncated or wrapped, as numpy refuses it)."""
    if isinstance(value, float) and not is_integral(dtype):
        return value
    if is_torch(value):
        value = value.detach().cpu().numpy()
    flag = isinstance(value, (bool, np.bool_)) and dtype != "bool"  # True is no number
    if flag or not isinstance(value, (int, float, np.number, np.bool_, np.ndarray)):
        raise InputError(f"{where} is a scalar operand: pass a number, not {type(value).__name__}")
    arr = np.asarray(value)
    if arr.ndim != 0:
        raise ShapeError(f"{where} is a scalar operand but has shape {arr.shape}")
    if arr.dtype.kind not in "biuf":
        raise DTypeError(f"{where}: {arr.dtype} values are not supported; {_TYPES_HINT}")
    if not is_integral(dtype):
        return float(arr)
    number = arr.item()
    vt = value_type(dtype)
    if isinstance(number, float) and not number.is_integer():
        raise DTypeError(
            f"{where}: {number!r} is not a value of {dtype}; pass dtype='float64' to compute "
            "in floating point"
        )
    if not vt.low <= number <= vt.high:
        raise DTypeError(
            f"{where}: {number!r} is out of the range of {dtype} ({vt.low} to {vt.high}); "
            "pass a wider dtype="
        )
    return int(number)


_TYPES_HINT = "use a floating, integer or bool type"


_BAD_TORCH = ("torch.complex64", "torch.complex128")


def _reject_dtype(value: Any, where: str) -> None:
    """Refuse value dtypes a kernel cannot compute in (rather than silently converting)."""
    dt = value.vals.dtype if isinstance(value, Tensor) else getattr(value, "dtype", None)
    if dt is None or dt is FLOAT64 or dt is FLOAT32:
        return
    text = str(dt)
    if text in _BAD_TORCH or (isinstance(dt, np.dtype) and dt.kind not in "fiub"):
        shown = text[6:] if text.startswith("torch.") else text
        raise DTypeError(f"{where}: {shown} values are not supported; {_TYPES_HINT}")


def _dense(
    t: TensorVar, value: Any, dtype: str, where: str, contiguous: bool = True, threads: int = 1
) -> np.ndarray:
    """A dense operand as an array *in level order* of the kernel's value dtype: C-ordered,
    unless ``contiguous`` is off (`convert_input`). A transposed view is copied by the
    compiled copy (`contiguous_copy`; numpy's copy of a transpose reads a source column for
    every output row)."""
    if type(value) is not np.ndarray:
        if isinstance(value, Tensor):
            value = value.to_dense()
        elif is_torch(value):
            if getattr(value, "is_cuda", False):
                raise InputError(f"{where} is a CUDA tensor; the C target takes CPU tensors")
            _reject_dtype(value, where)
            value = value.detach()
            value = value if value.layout == _torch_strided() else value.to_dense()
            if str(value.dtype) == "torch.bfloat16":  # no numpy dtype: float32 holds it exactly
                value = value.float()
            value = value.cpu().numpy()
        elif hasattr(value, "toarray") and hasattr(value, "tocoo"):
            value = value.toarray()
        else:
            try:
                value = np.asarray(value)
            except Exception as err:
                raise InputError(
                    f"{where}: cannot read {type(value).__name__} as an array: {err}"
                ) from None
    _reject_dtype(value, where)
    if value.ndim != t.order:
        raise ShapeError(
            f"{where} has {value.ndim} dimensions, but the expression uses it with order {t.order}"
        )
    ordering = t.format.ordering
    if ordering != tuple(range(t.order)):
        value = np.transpose(value, ordering)
    if dtype in HALF:
        return to_storage(value, dtype)
    if not contiguous:
        return np.asarray(value, dtype=VALUE_DTYPES[dtype])
    return contiguous_copy(np.asarray(value, dtype=VALUE_DTYPES[dtype]), threads)


def _torch_strided() -> Any:
    import torch

    return torch.strided
