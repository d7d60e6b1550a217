"""CUDA kernels run without a GPU (the CPU emulation) and with one (CuPy).

* `emulation_source` is the generated ``.cu`` text behind a shim header (``cuda_shim.h``)
  plus the launchers printed with it (`Generated.launchers`); the runtime builds it with
  a C++20 compiler (``target="cuda-emulated"``), so every CUDA kernel runs in ordinary
  tests; `emulate` runs it.
* `grid_size` evaluates the launch grid on the host from the kernel's own prelude.
* `stage` puts a call's arguments in GPU memory (`sparsec.runtime.args`' slots in a device
  form) and returns a CuPy ``RawKernel`` launch over them.
* Inputs already in GPU memory: `on_device`, `device_dense`, `device_sparse_to_host`.

Compile checks (NVRTC, ptxas' report) are `sparsec.runtime.nvrtc`'s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..abi import GPU_WORKSPACE, KERNEL_NAME
from ..base.errors import DTypeError, ShapeError, SparsecError
from ..base.resources import data_dir
from ..ir import nodes as ir
from ..tensors.halves import bfloat16_bits, compute_dtype, compute_fill
from ..tensors.tensor import Tensor
from .args import ADDRESSES, HOST, Form, Slot, Source, arguments, named

#: launches never exceed this many blocks (the loops are grid-stride, so any grid is correct)
MAX_GRID = 1 << 20
#: the most bytes a GPU workspace's slices take in all (the emulation: a 16th)
WORKSPACE_BYTES = 1 << 30
#: a GPU workspace's form: None picks per call (hash tables per row when a dense row per
#: thread of the whole launch would not fit `WORKSPACE_BYTES`), True or False forces it
HASH_WORKSPACE: bool | None = None
#: the emulation runs at most this many blocks (each block's threads run in turn)
MAX_EMULATED_GRID = 4096


# ---------------------------------------------------------------- emulation
def emulation_source(generated: Any) -> str:
    """The ``.cu`` text behind the shim, then its launchers (`Generated.launchers`:
    ``sparsec_launch(grid, block, <arguments>)``, and ``sparsec_launch_assemble`` for a
    sparse output's count)."""
    return behind_shim(generated.source, generated.launchers)


def behind_shim(source: str, launchers: str) -> str:
    """A ``.cu`` text compiled as C++ behind templates/cuda_shim.h, then ``launchers``."""
    shim = (data_dir("templates") / "cuda_shim.h").read_text()
    return f'{shim}\n#line 1 "sparsec_kernel.cu"\n{source}{launchers}'


def grid_size(launch: Any, params: dict[str, Any]) -> int | None:
    """The trip count of the GPUBlock loop, evaluated from the kernel's prelude with the
    call's arguments (arrays are read where the prelude loads from them); None when the
    loop does not sit at the top of the kernel."""
    if launch.grid is None:
        return None
    env = dict(params)
    for stmt in launch.body.body:
        match stmt:
            case ir.Decl(name=name, init=init) if init is not None:
                value = _eval(init, env)
                if value is None:
                    return None
                env[name] = value
            case ir.Comment():
                continue
            case ir.For(parallel=par, start=start, end=end) if par is not None:
                lo, hi = _eval(start, env), _eval(end, env)
                if lo is None or hi is None or par.unit != "GPUBlock":
                    return None
                return max(0, hi - lo)
            case _:
                return None
    return None


def _eval(node: ir.Expr, env: dict[str, Any]) -> int | None:
    match node:
        case ir.IntLit(value=v):
            return v
        case ir.Var(name=name):
            value = env.get(name)
            return int(value) if isinstance(value, int) else None
        case ir.Load(array=array, index=index):
            arr, at = env.get(array), _eval(index, env)
            if arr is None or at is None or isinstance(arr, int):
                return None
            return int(arr[at])
        case ir.Bin(op=op, left=left, right=right):
            a, b = _eval(left, env), _eval(right, env)
            if a is None or b is None:
                return None
            match op:
                case "+":
                    return a + b
                case "-":
                    return a - b
                case "*":
                    return a * b
                case "/":
                    return None if b == 0 else _cdiv(a, b)
                case "%":
                    return None if b == 0 else a - b * _cdiv(a, b)
            return None
        case ir.Call(fn="min", args=(x, y)):
            a, b = _eval(x, env), _eval(y, env)
            return None if a is None or b is None else min(a, b)
        case ir.Call(fn="max", args=(x, y)):
            a, b = _eval(x, env), _eval(y, env)
            return None if a is None or b is None else max(a, b)
    return None


def _cdiv(a: int, b: int) -> int:
    """C's integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def launch_grid(launch: Any, params: dict[str, Any], emulated: bool) -> int:
    grid = grid_size(launch, params)
    cap = MAX_EMULATED_GRID if emulated else MAX_GRID
    if grid is None:
        return cap if not emulated else 64
    return max(1, min(grid, cap))


# --------------------------------------------------------------------- CuPy
@functools.cache
def cupy_device() -> Any:
    """The cupy module when a CUDA device is usable, else a clear `SparsecError` (a found
    device is remembered; an error is not)."""
    try:
        import cupy  # type: ignore[import-not-found]
    except ImportError:
        raise SparsecError(
            "no CUDA device: target='cuda' runs through CuPy, which is not installed "
            "(pip install 'sparsec[cuda]'); target='cuda-emulated' runs the same kernel on "
            "the CPU"
        ) from None
    try:
        available = cupy.cuda.is_available()
    except Exception:  # a broken driver reports itself in many ways
        available = False
    if not available:
        raise SparsecError(
            "no CUDA device: CuPy finds no usable GPU; target='cuda-emulated' runs the same "
            "kernel on the CPU"
        )
    return cupy


# ------------------------------------------------------------ device inputs
def on_device(value: Any) -> bool:
    """Whether ``value`` is an array in GPU memory (CuPy, a CUDA torch tensor, a
    ``cupyx.scipy.sparse`` matrix, anything with ``__cuda_array_interface__``)."""
    module = type(value).__module__
    if module.startswith("torch"):
        return bool(getattr(value, "is_cuda", False))
    if module.startswith("cupyx.scipy.sparse"):
        return True  # a sparse matrix in GPU memory (no __cuda_array_interface__ of its own)
    return hasattr(type(value), "__cuda_array_interface__")


def device_sparse_to_host(value: Any) -> Any:
    """A sparse operand given on the device (cupyx.scipy.sparse, a CUDA torch sparse
    tensor) as its host counterpart: sparse operands are `Tensor`s, which the runtime keeps
    on the device once copied."""
    if type(value).__module__.startswith("torch"):
        return value.detach().cpu()
    getter = getattr(value, "get", None)
    return getter() if callable(getter) else value


def device_dense(order: int, ordering: tuple[int, ...], value: Any, dtype: Any, where: str) -> Any:
    """A dense operand in GPU memory as a C-ordered CuPy array in level order of ``dtype``
    (no copy when it already is one)."""
    cp = cupy_device()
    if type(value).__module__.startswith("torch"):
        value = value.detach()
        if str(value.layout) != "torch.strided":
            value = value.to_dense()
        if str(value.dtype) == "torch.bfloat16":  # no CuPy dtype: float32 holds it exactly
            value = value.float()
    array = cp.asarray(value)
    if array.dtype.kind != "f":
        raise DTypeError(f"{where}: {array.dtype} values are not supported; use float32 or float64")
    if array.ndim != order:
        raise ShapeError(
            f"{where} has {array.ndim} dimensions, but the expression uses it with order {order}"
        )
    if ordering != tuple(range(order)):
        array = cp.transpose(array, ordering)
    if dtype == np.uint16:  # bfloat16 storage: rounded on the device, through float32
        return bfloat16_bits(cp.ascontiguousarray(array, dtype=cp.float32))
    return cp.ascontiguousarray(array, dtype=dtype)


def to_device(host: Any) -> Any:
    """A host array copied to the GPU (C-ordered)."""
    return cupy_device().asarray(np.ascontiguousarray(host))


# ------------------------------------------------------------------ launches
def _device_form(dtype: str) -> Form:
    """CuPy arrays (a `Tensor`'s copied once per tensor and kept; host arrays per call;
    device arrays where they are) and scalars typed as the kernel declares them."""
    value = compute_dtype(dtype).type
    typed = {"val": value, "int": np.int32, "i64": np.int64}

    def tensor(t: Tensor, key: tuple[str, int]) -> Any:
        return t.device_array(*key, to_device)

    def array(a: Any) -> Any:
        return a if on_device(a) else to_device(a)

    def output(a: Any) -> Any:
        # an array a phase does not write (a count phase's crd and vals): NULL, as on the
        # C target (CuPy passes None as a null pointer)
        return None if a is None else array(a)

    return Form(tensor, array, output, lambda p, v: typed[p.type](v))


def _host_grid(
    generated: Any, slots: tuple[Slot, ...], values: Mapping[str, Any], dims: Any, out: Any
) -> dict[str, Any]:
    """Each parameter's value by name, arrays as they are: what `grid_size` reads."""
    host = arguments(slots, values, dims, {("vals", -1): out}, 1, form=HOST)
    return named(slots, host)


def emulate(
    fn: Any,
    generated: Any,
    slots: tuple[Slot, ...],
    values: Mapping[str, Any],
    dims: Mapping[str, int],
    out: Any,
) -> None:
    """Run the CUDA emulation's launcher (`emulation_source`) into the host array ``out``."""
    grid = launch_grid(generated.launch, _host_grid(generated, slots, values, dims, out), True)
    args = arguments(slots, values, dims, {("vals", -1): out}, 1, form=ADDRESSES)
    fn(grid, generated.launch.block, *args)


def run_phase(
    kernel: Any,
    generated: Any,
    slots: tuple[Slot, ...],
    values: Mapping[str, Any],
    dims: Mapping[str, int],
    outputs: dict[tuple[str, int], Any],
    emulated: bool,
) -> None:
    """One launch of a sparse output's phase into ``outputs`` (numpy arrays for the
    emulation's launcher ``kernel``, CuPy arrays for the ``RawKernel`` ``kernel``)."""
    host = named(slots, arguments(slots, values, dims, outputs, 1, form=HOST))
    grid = launch_grid(generated.launch, host, emulated)
    block = generated.launch.block
    threads = 1
    if generated.launch.scratch:
        grid, block = _workspace(generated, host, grid, outputs, emulated)
        threads = grid * block
    if emulated:
        kernel(grid, block, *arguments(slots, values, dims, outputs, threads, form=ADDRESSES))
        return
    form = _device_form(generated.dtype)
    args = tuple(arguments(slots, values, dims, outputs, threads, form=form))
    kernel((grid,), (block,), args)


def _workspace(
    generated: Any,
    host: dict[str, Any],
    grid: int,
    outputs: dict[tuple[str, int], Any],
    emulated: bool,
) -> tuple[int, int]:
    """A GPU workspace's slices, one per thread of the launch, into ``outputs``; the grid
    and block, shrunk so that the slices fit in `WORKSPACE_BYTES` (the loops are strided
    over the grid and the block, so any launch is correct). Nothing when the runtime
    chose the hash tables for this launch (``outputs`` then holds placeholder slices)."""
    if ("ws_vals", -1) in outputs:
        return grid, generated.launch.block
    xp: Any = np if emulated else cupy_device()
    kinds = _kinds(generated)
    per, each = _slices(generated, host)
    fit = max(1, workspace_budget(emulated) // max(1, each))
    block = min(generated.launch.block, fit)
    grid = max(1, min(grid, fit // block))
    for role, (_, kind) in GPU_WORKSPACE.items():
        size = max(1, grid * block * per.get(role, 0))
        # values start at the add's identity (a semiring's), as the C target fills its own
        fill = compute_fill(generated.launch.fill, generated.dtype) if role == "vals" else 0
        outputs[(f"ws_{role}", -1)] = xp.full(size, fill, dtype=kinds[kind])
    return grid, block


def workspace_budget(emulated: bool) -> int:
    return WORKSPACE_BYTES // 16 if emulated else WORKSPACE_BYTES


def _kinds(generated: Any) -> dict[str, np.dtype]:
    # workspace values are the kernel's compute type (float for 16-bit values)
    kinds = {"val": compute_dtype(generated.dtype), "u64": np.dtype(np.uint64)}
    kinds["i64"] = np.dtype(np.int64)
    return kinds


def _slices(generated: Any, host: dict[str, Any]) -> tuple[dict[str, int], int]:
    """A thread's dense workspace slices: elements by role, and bytes in all."""
    kinds = _kinds(generated)
    per: dict[str, int] = {}
    for role, count in generated.launch.scratch:
        n = _eval(count, host)
        if n is None:
            raise SparsecError(f"internal: the workspace's {role} slice has no size on the host")
        per[role] = n
    return per, sum(n * kinds[GPU_WORKSPACE[role][1]].itemsize for role, n in per.items())


def dense_rows_fit(
    generated: Any,
    slots: tuple[Slot, ...],
    values: Mapping[str, Any],
    dims: Mapping[str, int],
    emulated: bool,
) -> bool:
    """Whether a dense workspace row per thread of the full launch fits the budget (else
    `_workspace` would shrink the launch: the runtime takes hash tables per row instead)."""
    host = named(slots, arguments(slots, values, dims, {}, 1, form=HOST))
    grid = launch_grid(generated.launch, host, emulated)
    _, each = _slices(generated, host)
    return grid * generated.launch.block * each <= workspace_budget(emulated)


def stage(
    raw: Any,
    generated: Any,
    slots: tuple[Slot, ...],
    values: Mapping[str, Any],
    dims: Mapping[str, int],
    out: Any,
) -> tuple[Callable[[], None], Any]:
    """The arguments in GPU memory, and a launch of the CuPy ``RawKernel`` ``raw`` over
    them (no copies); returns ``(launch, the output's device array)``."""
    grid = launch_grid(generated.launch, _host_grid(generated, slots, values, dims, out), False)
    form = _device_form(generated.dtype)
    staged = tuple(arguments(slots, values, dims, {("vals", -1): out}, 1, form=form))
    out_dev = next(
        a
        for slot, a in zip(slots, staged, strict=True)
        if slot.source is Source.OUTPUT and slot.param.field == "vals"
    )
    block = generated.launch.block

    def launch() -> None:
        raw((grid,), (block,), staged)

    return launch, out_dev


def raw_kernel(source: str, name: str = KERNEL_NAME) -> Any:
    """The CuPy ``RawKernel`` ``name`` of a generated ``.cu`` (compiled by CuPy at its first
    launch)."""
    return cupy_device().RawKernel(source, name, options=("-std=c++17",))
