"""A `Generated` kernel built and loaded: its entry points with their ctypes signatures, and
the one function that turns a kernel's status into an error.

Entry points of one library (`sparsec.abi` names them):

- ``sparsec_kernel`` (C) or ``sparsec_launch(grid, block, ...)`` (the CUDA emulation): the
  compute phase; for a sparse output, the fill once the output levels are allocated;
- ``sparsec_assemble``: a sparse output's symbolic phase (counts each level's positions;
  ``sparsec_launch_assemble(grid, block, ...)`` under the CUDA emulation);
- the single-pass entry (`Generated.append`): a sparse output appended into arrays of a
  proven capacity;
- ``sparsec_kernel_packed``: the compute phase taking the ABI's arguments as one int64
  array (C kernels without scalar value parameters).

``target="cuda"`` loads nothing here: CuPy compiles the source at the first launch
(`sparsec.runtime.gpu.Staged`).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from .. import abi
from ..abi import (
    ASSEMBLE_NAME,
    KERNEL_NAME,
    LAUNCH_ASSEMBLE_NAME,
    LAUNCH_NAME,
    PACKED_NAME,
    Param,
)
from ..backends import Generated
from ..errors import ShapeError, SparsecError
from . import build, gpu

#: a scalar value parameter's type (16-bit kernels compute, and take scalars, in float)
_VALUE_CTYPES = {
    "float32": ctypes.c_float,
    "float64": ctypes.c_double,
    "float16": ctypes.c_float,
    "bfloat16": ctypes.c_float,
}


@dataclass(frozen=True, slots=True)
class Loaded:
    """One kernel's entry points (None where the library has none)."""

    generated: Generated
    #: the compute phase (None on ``target="cuda"``)
    fn: Any
    #: the symbolic (counting) phase of a sparse output, else None
    assemble: Any = None
    #: the single-pass kernel of a sparse output (may be ``fn`` itself), else None
    append: Any = None
    #: ``sparsec_kernel_packed`` (takes a bytes object), where the C kernel has it, else None
    packed: Any = None


def load(generated: Generated, target: str, sparse_output: bool) -> Loaded:
    """Build ``generated`` through the on-disk cache (`build.compile_cached`) and load its
    entry points for ``target`` ("c", "cuda" or "cuda-emulated")."""
    types = [ctype(p, generated.dtype) for p in generated.signature.params]
    if target == "cuda":
        gpu.cupy_device()  # "no CUDA device" before anything else
        return Loaded(generated, None)
    if target == "cuda-emulated":
        lib = build.compile_cached(gpu.emulation_source(generated), "c++")
        launcher = [ctypes.c_int64, ctypes.c_int, *types]
        fn = _entry(lib, LAUNCH_NAME, launcher)
        if not sparse_output:
            return Loaded(generated, fn)
        return Loaded(generated, fn, _entry(lib, LAUNCH_ASSEMBLE_NAME, launcher))
    lib = build.compile_cached(generated.source)
    fn = _entry(lib, KERNEL_NAME, types)
    packed = _entry(lib, PACKED_NAME, [ctypes.c_char_p]) if generated.packed else None
    if not sparse_output:
        return Loaded(generated, fn, packed=packed)
    assemble = _entry(lib, ASSEMBLE_NAME, types)
    append = _entry(lib, generated.append, types) if generated.append else None
    return Loaded(generated, fn, assemble, append, packed)


def _entry(lib: ctypes.CDLL, name: str, argtypes: list[Any]) -> Any:
    fn = getattr(lib, name)
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


def ctype(p: Param, dtype: str) -> Any:
    """The ctypes type of parameter ``p`` for values of ``dtype``."""
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


def status_error(status: int, generated: Generated) -> SparsecError:
    """The error for a kernel's non-zero ``status`` (`sparsec.abi.STATUSES`)."""
    match status:
        case abi.OUT_OF_MEMORY:
            return SparsecError("the kernel could not allocate its workspace (out of memory)")
        case abi.BOUND_VIOLATED:
            bounds = "; ".join(generated.bounds)
            return ShapeError(f"the inputs break a bound of the schedule: {bounds}")
        case abi.CAPACITY_EXCEEDED:
            # the runtime answers this status of the single pass itself (it counts exactly
            # instead): reaching here, a phase that was given exact sizes passed them
            return SparsecError(
                "internal: the kernel's output passed the capacity the runtime allocated "
                "(nothing was written out of bounds)"
            )
        case abi.OK:
            raise AssertionError("status 0 is success, not an error")
    known = ", ".join(f"{name} ({code})" for name, code in abi.STATUSES.items())
    return SparsecError(f"kernel returned status {status}, none of the ABI's: {known}")
