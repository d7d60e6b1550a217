"""A CPU stand-in for CuPy and a GPU, so that the runtime's device path (``target="cuda"``:
the arguments in device form, uploads, the phases of a sparse output, the compaction on
device arrays, the arrays a result keeps on the device) runs in CI, where no GPU is.

- `DeviceArray` is host memory marked as GPU memory (it has ``__cuda_array_interface__``
  and ``.get()``, as a CuPy array does).
- `StandIn` answers what the runtime asks of the ``cupy`` module: its functions are numpy's,
  with results marked as device arrays, and each refuses a host (plain numpy) array as CuPy
  does, so a missing upload fails here as it would on a GPU.
- `RawKernel` compiles the ``.cu`` behind the emulation's shim (templates/cuda_shim.h) with
  a launcher that takes the arguments as CuPy takes them: device arrays, ``None`` as a null
  pointer, numpy scalars by value; it refuses anything else (a host array, a Python object).

The generated kernel, the launch geometry and the hardware's arithmetic are not what this
checks: the emulation target and the `gpu` tests do. It checks the Python between them."""

from __future__ import annotations

import ctypes
import functools
import types
from typing import Any

import numpy as np

from sparsec.backends.cuda import shim_launcher
from sparsec.runtime import build
from sparsec.runtime.device import MAX_EMULATED_GRID, behind_shim


class DeviceArray(np.ndarray):
    """Host memory standing in for GPU memory."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ctypes.data, False),
            "version": 3,
        }

    def get(self) -> np.ndarray:
        """A host copy (a plain numpy array), as ``cupy.ndarray.get``."""
        return np.array(self)


def _device(a: Any) -> Any:
    return a.view(DeviceArray) if isinstance(a, np.ndarray) else a


def _refuse_host(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    for a in (*args, *kwargs.values()):
        if type(a) is np.ndarray:
            raise TypeError("stand-in device: a host numpy array reached a CuPy function")


class StandIn(types.SimpleNamespace):
    """The ``cupy`` module, as far as the runtime uses it."""

    ndarray = DeviceArray

    def __init__(self) -> None:
        super().__init__(cuda=types.SimpleNamespace(is_available=lambda: True))
        self.uploads = 0

    def asarray(self, a: Any, dtype: Any = None) -> DeviceArray:
        if isinstance(a, DeviceArray) and (dtype is None or a.dtype == np.dtype(dtype)):
            return a
        if not isinstance(a, DeviceArray):
            self.uploads += 1
        copied = np.array(a, dtype=dtype)  # a copy, as an upload is
        if copied.dtype.kind not in "biuf":
            raise ValueError(f"stand-in device: unsupported dtype {copied.dtype}")  # as CuPy
        return copied.view(DeviceArray)

    def asnumpy(self, a: Any) -> np.ndarray:
        return np.array(a)

    def RawKernel(self, source: str, name: str, options: Any = ()) -> RawKernel:  # noqa: N802
        return RawKernel(source, name)

    def __getattr__(self, name: str) -> Any:
        found = getattr(np, name)
        if not callable(found) or isinstance(found, type):
            return found  # dtypes and constants

        def on_device(*args: Any, **kwargs: Any) -> Any:
            _refuse_host(args, kwargs)
            result = found(*args, **kwargs)
            return tuple(map(_device, result)) if isinstance(result, tuple) else _device(result)

        return on_device


_SCALARS = {
    np.dtype(np.int32): ("int", ctypes.c_int32),
    np.dtype(np.int64): ("long long", ctypes.c_int64),
    np.dtype(np.uint64): ("unsigned long long", ctypes.c_uint64),
    np.dtype(np.float32): ("float", ctypes.c_float),
    np.dtype(np.float64): ("double", ctypes.c_double),
    # an integral kernel's scalar operands (issue 40)
    np.dtype(np.int8): ("signed char", ctypes.c_int8),
    np.dtype(np.int16): ("short", ctypes.c_int16),
    np.dtype(np.uint8): ("unsigned char", ctypes.c_uint8),
    np.dtype(np.uint16): ("unsigned short", ctypes.c_uint16),
    np.dtype(np.uint32): ("unsigned int", ctypes.c_uint32),
    np.dtype(np.bool_): ("bool", ctypes.c_bool),
}


class RawKernel:
    """``cupy.RawKernel``: ``kernel((grid,), (block,), args)`` runs every thread of the grid
    through the emulation's shim."""

    def __init__(self, source: str, name: str) -> None:
        self.source, self.name = source, name

    def __call__(self, grid: tuple[int], block: tuple[int], args: tuple[Any, ...]) -> None:
        kinds, held = [], []
        for a in args:
            if a is None or isinstance(a, DeviceArray):
                kinds.append("*")
                held.append(ctypes.c_void_p(None if a is None else a.ctypes.data))
            elif isinstance(a, np.generic) and a.dtype in _SCALARS:
                c_name, c_type = _SCALARS[a.dtype]
                kinds.append(c_name)
                held.append(c_type(a.item()))
            else:
                raise TypeError(f"stand-in device: {type(a).__name__} is not a kernel argument")
        fn = _launcher(self.source, self.name, tuple(kinds))
        addresses = (ctypes.c_void_p * max(1, len(held)))(*[ctypes.addressof(h) for h in held])
        # the kernels' loops are strided over the grid, so a smaller one computes the same;
        # the emulation runs every block in turn (a GPU's 2^20 would take minutes)
        fn(min(grid[0], MAX_EMULATED_GRID), block[0], addresses)


@functools.cache
def _launcher(source: str, name: str, kinds: tuple[str, ...]) -> Any:
    passed = ", ".join(
        f"sc_any_pointer{{*(void**)sc_args[{i}]}}" if k == "*" else f"*({k}*)sc_args[{i}]"
        for i, k in enumerate(kinds)
    )
    pointer = (
        "\nstruct sc_any_pointer {\n"
        "  void* p;\n"
        "  template <class T> operator T*() const { return static_cast<T*>(p); }\n"
        "};\n"
    )
    launcher = shim_launcher(
        "sc_stand_in", "void** sc_args", f"{name}({passed})", "__shfl" in source
    )
    fn = build.compile_cached(behind_shim(source, pointer + launcher), "c++").sc_stand_in
    fn.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn
