"""The user-facing kernel: ``sparsec.kernel(expr, formats) -> Kernel``; ``Kernel(**inputs)``.

A `Kernel` is specialised lazily per (value dtype, index dtype): the first call with
float32 CSR inputs generates, compiles (through the on-disk cache) and loads one C
function; later calls only validate and pack arguments.

Every input is validated before a pointer reaches C: names (missing / extra), types,
orders, dtypes, agreement of every index variable's extent, and, for sparse inputs,
the storage invariants (done once, when the `Tensor` is built; Tensors are immutable).
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from . import runtime
from .abi import Param
from .codegen import Generated, generate
from .errors import DTypeError, InputError, ScheduleError, ShapeError, SparsecError
from .formats import Format
from .ir import VAL
from .parser import parse_expression
from .reference import compare, reference
from .spec import FormatsArg, Spec, TensorVar, make_spec
from .tensor import Tensor, as_tensor

TARGETS = ("c",)
VALUE_DTYPES = {"float32": np.float32, "float64": np.float64}
INDEX_DTYPES = {"int32": np.int32, "int64": np.int64}
_VALUE_CTYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double}


@dataclass(frozen=True, slots=True)
class _Compiled:
    generated: Generated
    fn: Any


@dataclass(frozen=True, slots=True)
class CheckResult:
    """Outcome of `Kernel.check`: the largest absolute error against dense torch."""

    max_abs_error: float
    dtype: str

    def __str__(self) -> str:
        return f"ok: matches dense torch (max abs error {self.max_abs_error:.3g}, {self.dtype})"


def _dtype_name(dt: Any, table: Mapping[str, Any], what: str) -> str | None:
    if dt is None:
        return None
    name = np.dtype(dt).name if not isinstance(dt, str) else dt
    if name not in table:
        raise DTypeError(f"{what} {name!r} is not supported; use {' or '.join(table)}")
    return name


class Kernel:
    """A compiled tensor-algebra kernel for one expression and one set of formats."""

    def __init__(
        self,
        expr: str,
        formats: FormatsArg = None,
        *,
        target: str = "c",
        schedule: Any = None,
        dtype: Any = None,
        index_dtype: Any = None,
    ) -> None:
        if not isinstance(expr, str):
            raise InputError(f"expression must be a string, not {type(expr).__name__}")
        if target not in TARGETS:
            raise SparsecError(f"unknown target {target!r}; supported targets: {', '.join(TARGETS)}")
        self.expression = expr
        self.target = target
        self.assignment = parse_expression(expr)
        try:
            self.spec: Spec = make_spec(self.assignment, formats)
        except SparsecError as err:
            raise err.with_source(expr) from None
        self.parallel = _schedule_flag(schedule)
        self.dtype = _dtype_name(dtype, VALUE_DTYPES, "value dtype")
        self.index_dtype = _dtype_name(index_dtype, INDEX_DTYPES, "index dtype")
        self._compiled: dict[tuple[str, str], _Compiled] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------- inspection
    @property
    def formats(self) -> dict[str, Format]:
        return self.spec.formats

    @property
    def schedule(self) -> str:
        return "default (parallel outermost output loop)" if self.parallel else "serial"

    def generated(self, dtype: str | None = None, index_dtype: str | None = None) -> Generated:
        key = (dtype or self.dtype or "float64", index_dtype or self.index_dtype or "int32")
        return generate(self.spec, dtype=key[0], index_dtype=key[1], parallel=self.parallel)

    @property
    def source(self) -> str:
        """The generated C (for the kernel's dtypes; float64 values, int32 indices by default)."""
        return self.generated().source

    def __repr__(self) -> str:
        fmts = ", ".join(f"{t.name}:{t.format}" for t in self.spec.tensors)
        return f"Kernel({self.expression!r}, {fmts})"

    def _compile(self, dtype: str, index_dtype: str) -> _Compiled:
        key = (dtype, index_dtype)
        with self._lock:
            found = self._compiled.get(key)
            if found is None:
                gen = self.generated(dtype, index_dtype)
                lib = runtime.compile_cached(gen.source)
                fn = getattr(lib, "sparsec_kernel")
                fn.argtypes = [_ctype(p, dtype) for p in gen.signature.params]
                fn.restype = ctypes.c_int
                found = self._compiled[key] = _Compiled(gen, fn)
            return found

    # ------------------------------------------------------------------- call
    def __call__(self, *, threads: int | None = None, **inputs: Any) -> Any:
        prepared = self._prepare(inputs)
        compiled = self._compile(prepared.dtype, prepared.index_dtype)
        out = self._run(compiled, prepared, threads)
        return prepared.wrap(out)

    def check(self, *, threads: int | None = None, **inputs: Any) -> CheckResult:
        """Run the kernel and compare with ``torch.einsum`` on densified inputs."""
        import torch

        prepared = self._prepare(inputs)
        compiled = self._compile(prepared.dtype, prepared.index_dtype)
        got = self._run(compiled, prepared, threads)
        dense = {name: torch.from_numpy(np.asarray(a, dtype=np.float64)) for name, a in prepared.dense().items()}
        current = dense.pop(self.spec.output.name, None)
        want = reference(self.spec.statement, dense, prepared.dims, current).numpy()
        err = compare(np.asarray(got), want, prepared.dtype, f"kernel {self.assignment}")
        return CheckResult(err, prepared.dtype)

    # -------------------------------------------------------------- internals
    def _prepare(self, inputs: Mapping[str, Any]) -> _Prepared:
        spec = self.spec
        wanted = [t for t in spec.inputs] + ([spec.output] if spec.statement.accumulate else [])
        names = [t.name for t in wanted]
        missing = [n for n in names if n not in inputs]
        extra = [n for n in inputs if n not in names]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing input{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")
            if extra:
                parts.append(f"unexpected input{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))}")
            raise InputError(
                f"{'; '.join(parts)}; kernel {self.assignment} takes {', '.join(names) or 'no inputs'}"
            )
        use_torch = any(_is_torch(v) for v in inputs.values())
        dtype = self.dtype or _common_dtype(wanted, inputs)
        index_dtype = self.index_dtype or _common_index_dtype(wanted, inputs)
        values: dict[str, Any] = {}
        for t in wanted:
            values[t.name] = _convert(t, inputs[t.name], dtype, index_dtype)
        if self.index_dtype is None:
            # A large input may have forced int64: bring every sparse input to one width.
            widths = {v.index_dtype.name for v in values.values() if isinstance(v, Tensor) and v.order}
            if "int64" in widths and index_dtype != "int64":
                index_dtype = "int64"
                values = {
                    n: v.astype(index_dtype="int64") if isinstance(v, Tensor) and v.order else v
                    for n, v in values.items()
                }
        dims = _dims(spec, wanted, values)
        return _Prepared(spec, values, dims, dtype, index_dtype, use_torch)

    def _run(self, compiled: _Compiled, prepared: _Prepared, threads: int | None) -> np.ndarray:
        spec = self.spec
        out_t = spec.output
        np_dtype = VALUE_DTYPES[prepared.dtype]
        level_shape = tuple(prepared.dims[spec.statement.lhs.indices[m]] for m in out_t.format.ordering)
        if spec.statement.accumulate:
            current = prepared.values[out_t.name]
            out = np.ascontiguousarray(np.transpose(current, out_t.format.ordering), dtype=np_dtype).reshape(-1).copy()
        else:
            out = np.empty(int(np.prod(level_shape, dtype=np.int64)) if level_shape else 1, dtype=np_dtype)
        nthreads = _threads(threads)
        args: list[Any] = []
        keep: list[Any] = [out]
        for p in compiled.generated.signature.params:
            args.append(_argument(p, spec, prepared, out, nthreads, keep))
        status = compiled.fn(*args)
        if status != 0:
            raise SparsecError(f"kernel returned error status {status}")
        if out_t.order == 0:
            return out[0]
        inverse = np.argsort(out_t.format.ordering)
        return np.transpose(out.reshape(level_shape), inverse)


@dataclass
class _Prepared:
    spec: Spec
    values: dict[str, Any]
    dims: dict[str, int]
    dtype: str
    index_dtype: str
    use_torch: bool

    def dense(self) -> dict[str, np.ndarray]:
        return {n: (v.to_dense() if isinstance(v, Tensor) else np.asarray(v)) for n, v in self.values.items()}

    def wrap(self, out: np.ndarray) -> Any:
        if self.use_torch:
            import torch

            return torch.from_numpy(np.ascontiguousarray(out)) if np.ndim(out) else torch.tensor(out)
        return np.ascontiguousarray(out) if np.ndim(out) else out


def _schedule_flag(schedule: Any) -> bool:
    match schedule:
        case None | "default":
            return True
        case "serial":
            return False
        case _:
            raise ScheduleError(
                f"schedule {schedule!r} is not supported yet; use None (default: parallel "
                f"outermost output loop) or 'serial'"
            )


def _ctype(p: Param, dtype: str) -> Any:
    if p.kind == "array":
        return ctypes.c_void_p
    match p.type:
        case "val":
            return _VALUE_CTYPES[dtype]
        case "i64":
            return ctypes.c_int64
        case "int":
            return ctypes.c_int
    raise AssertionError(p)


def _threads(threads: int | None) -> int:
    if threads is None:
        env = os.environ.get("OMP_NUM_THREADS", "")
        try:
            return max(1, int(env.split(",")[0]))
        except ValueError:
            return max(1, os.cpu_count() or 1)
    if not isinstance(threads, int) or threads < 1:
        raise InputError(f"threads must be a positive integer, not {threads!r}")
    return threads


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch")


def _value_dtype_of(value: Any) -> str | None:
    if isinstance(value, Tensor):
        return value.dtype.name
    dt = getattr(value, "dtype", None)
    if dt is None:
        return None
    name = str(dt).replace("torch.", "")
    return name if name in VALUE_DTYPES else None


def _common_dtype(wanted: list[TensorVar], inputs: Mapping[str, Any]) -> str:
    """float32 only when every floating input is float32; float64 otherwise (torch rule)."""
    names = {_value_dtype_of(inputs[t.name]) for t in wanted if t.order}
    names.discard(None)
    return "float32" if names == {"float32"} else "float64"


def _common_index_dtype(wanted: list[TensorVar], inputs: Mapping[str, Any]) -> str:
    for t in wanted:
        v = inputs[t.name]
        if isinstance(v, Tensor) and v.order and not t.format.is_dense and v.index_dtype.name == "int64":
            return "int64"
        idx = getattr(v, "indices", None)
        if getattr(idx, "dtype", None) == np.int64 and not t.format.is_dense:
            return "int64"
    return "int32"


def _convert(t: TensorVar, value: Any, dtype: str, index_dtype: str) -> Any:
    """One input in the kernel's layout: float for scalars, ndarray for dense, Tensor else."""
    where = f"input {t.name!r}"
    if t.order == 0:
        return _scalar(value, where)
    if t.format.is_dense:
        return _dense(t, value, dtype, where)
    try:
        tensor = as_tensor(value, t.format, name=t.name, index_dtype=None, dtype=dtype)
    except SparsecError:
        raise
    except Exception as err:  # a foreign object we could not read
        raise InputError(f"{where}: cannot convert {type(value).__name__} to a sparse tensor: {err}") from None
    if tensor.order != t.order:
        raise ShapeError(f"{where} has order {tensor.order}, but the expression uses it with order {t.order}")
    if tensor.index_dtype.name != index_dtype and index_dtype == "int64":
        tensor = tensor.astype(index_dtype="int64")
    return tensor


def _scalar(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number, np.ndarray)) and not _is_torch(value):
        raise InputError(f"{where} is a scalar operand: pass a number, not {type(value).__name__}")
    arr = np.asarray(value.detach().cpu() if _is_torch(value) else value)
    if arr.ndim != 0:
        raise ShapeError(f"{where} is a scalar operand but has shape {arr.shape}")
    if arr.dtype.kind == "c" or arr.dtype == np.float16:
        raise DTypeError(f"{where}: {arr.dtype} values are not supported; use float32 or float64")
    return float(arr)


def _dense(t: TensorVar, value: Any, dtype: str, where: str) -> np.ndarray:
    if isinstance(value, Tensor):
        arr = value.to_dense()
    elif _is_torch(value):
        if getattr(value, "is_cuda", False):
            raise InputError(f"{where} is a CUDA tensor; the C target takes CPU tensors")
        v = value.detach()
        v = v.to_dense() if v.layout != _torch_strided() else v
        if str(v.dtype) in ("torch.float16", "torch.bfloat16", "torch.complex64", "torch.complex128"):
            raise DTypeError(f"{where}: {str(v.dtype)[6:]} values are not supported; use float32 or float64")
        arr = v.cpu().numpy()
    elif hasattr(value, "toarray") and hasattr(value, "tocoo"):
        arr = value.toarray()
    else:
        try:
            arr = np.asarray(value)
        except Exception as err:
            raise InputError(f"{where}: cannot read {type(value).__name__} as an array: {err}") from None
    if arr.dtype.kind not in "fiub" or arr.dtype == np.float16:
        raise DTypeError(
            f"{where}: {arr.dtype} values are not supported; use float32 or float64"
        )
    if arr.ndim != t.order:
        raise ShapeError(f"{where} has {arr.ndim} dimensions, but the expression uses it with order {t.order}")
    return np.ascontiguousarray(arr, dtype=VALUE_DTYPES[dtype])


def _torch_strided() -> Any:
    import torch

    return torch.strided


def _dims(spec: Spec, wanted: list[TensorVar], values: Mapping[str, Any]) -> dict[str, int]:
    dims: dict[str, int] = {}
    seen: dict[str, str] = {}
    accesses = {a.name: a for a in spec.assignment.accesses()}
    for t in wanted:
        if t.order == 0:
            continue
        shape = tuple(values[t.name].shape)
        for mode, index in enumerate(accesses[t.name].indices):
            size = int(shape[mode])
            if index in dims and dims[index] != size:
                raise ShapeError(
                    f"index {index} has extent {dims[index]} in {seen[index]} but {size} in "
                    f"{t.name} (mode {mode}); shapes must agree wherever an index is shared"
                )
            if index not in dims:
                dims[index], seen[index] = size, f"{t.name} (mode {mode})"
    return dims


def _argument(
    p: Param, spec: Spec, prepared: _Prepared, out: np.ndarray, threads: int, keep: list[Any]
) -> Any:
    match p.field:
        case "threads":
            return threads
        case "dim":
            return prepared.dims[p.index]
        case "value":
            return prepared.values[p.tensor]
    if p.tensor == spec.output.name and p.field == "vals":
        return out.ctypes.data
    value = prepared.values[p.tensor]
    t = spec.tensor(p.tensor)
    if t.format.is_dense:
        arr = np.ascontiguousarray(np.transpose(value, t.format.ordering))
    elif p.field == "vals":
        arr = value.vals
    else:
        level = value.levels[p.level]
        arr = level.pos if p.field == "pos" else level.crd
    expected = VALUE_DTYPES[prepared.dtype] if p.type == VAL else INDEX_DTYPES[prepared.index_dtype]
    if arr.dtype != expected or not arr.flags.c_contiguous:
        raise DTypeError(f"internal: {p.name} has dtype {arr.dtype}, expected {np.dtype(expected)}")
    keep.append(arr)
    return arr.ctypes.data


def kernel(
    expr: str,
    formats: FormatsArg = None,
    *,
    target: str = "c",
    schedule: Any = None,
    dtype: Any = None,
    index_dtype: Any = None,
) -> Kernel:
    """Compile ``expr`` (index notation) for the given formats; see `Kernel`."""
    return Kernel(expr, formats, target=target, schedule=schedule, dtype=dtype, index_dtype=index_dtype)
