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
(`sparsec.runtime.device.Staged`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
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
from ..base.errors import ShapeError, SparsecError, StagesMissing
from ..base.target import Target
from ..base.values import is_integral
from . import build, device

#: the line before a kernel's source that builds only its single pass (`Loaded`)
APPEND_ONLY = "#define SC_APPEND_ONLY 1"

#: a scalar value parameter's type (16-bit kernels compute, and take scalars, in float)
_VALUE_CTYPES = {
    "float32": ctypes.c_float,
    "float64": ctypes.c_double,
    "float16": ctypes.c_float,
    "bfloat16": ctypes.c_float,
    "bool": ctypes.c_bool,
    **{f"{u}int{b}": getattr(ctypes, f"c_{u}int{b}") for u in ("", "u") for b in (8, 16, 32, 64)},
}


class Loaded:
    """One kernel's entry points (None where the library has none).

    A C kernel whose sparse output has a single-pass function beside its two phases is
    built first without the phases (``SC_APPEND_ONLY``, a much shorter compile:
    docs/decisions.md, "A cold compile's time"): the single pass is what its calls run,
    and the phases (a capacity bound too small, rows that cannot be cut into chunks on
    threads) are built from the whole source the first time an entry of theirs is asked
    for."""

    __slots__ = ("generated", "append", "_fn", "_assemble", "_packed", "_later", "_address")

    def __init__(
        self,
        generated: Generated,
        fn: Any,
        assemble: Any = None,
        append: Any = None,
        packed: Any = None,
        later: Callable[[], tuple[Any, Any, Any]] | None = None,
    ) -> None:
        self.generated = generated
        #: the single-pass kernel of a sparse output (may be ``fn`` itself), else None
        self.append = append
        self._fn, self._assemble, self._packed = fn, assemble, packed
        #: builds and loads (fn, assemble, packed) on first use, else None
        self._later = later
        self._address = _address_of(packed)

    def _built(self) -> None:
        later = self._later
        if later is not None:
            self._fn, self._assemble, self._packed = later()
            self._address = _address_of(self._packed)
            self._later = None

    @property
    def phases_built(self) -> bool:
        """Whether the entries built on first use (if any) are built."""
        return self._later is None

    @property
    def fn(self) -> Any:
        """The compute phase (None on ``target="cuda"``)."""
        self._built()
        return self._fn

    @property
    def assemble(self) -> Any:
        """The symbolic (counting) phase of a sparse output, else None."""
        self._built()
        return self._assemble

    @property
    def packed_address(self) -> int | None:
        """The address of ``sparsec_kernel_packed`` in the library (for compiled callers:
        the panel driver, `sparsec.runtime.copies.panels`), where the C kernel has it."""
        self._built()
        return self._address

    @property
    def packed(self) -> Any:
        """``sparsec_kernel_packed`` (takes a bytes object), where the C kernel has it."""
        self._built()
        return self._packed


def _address_of(fn: Any) -> int | None:
    """The address of a function loaded by ctypes (None for none)."""
    return None if fn is None else ctypes.cast(fn, ctypes.c_void_p).value


def load(generated: Generated, target: Target, sparse_output: bool) -> Loaded:
    """Build ``generated`` through the on-disk cache (`build.compile_cached`) and load its
    entry points for ``target``: a device's kernel is compiled at its first launch, an
    emulated GPU kernel is built with the emulation's shim, a C kernel as it is."""
    types = [ctype(p, generated.dtype) for p in generated.signature.params]
    if target.device:
        device.cupy_device()  # "no CUDA device" before anything else
        return Loaded(generated, None)
    if target.emulated:
        lib = build.compile_cached(device.emulation_source(generated), "c++", _flags(generated))
        launcher = [ctypes.c_int64, ctypes.c_int, *types]
        fn = _entry(lib, LAUNCH_NAME, launcher)
        if not sparse_output:
            return Loaded(generated, fn)
        return Loaded(generated, fn, _entry(lib, LAUNCH_ASSEMBLE_NAME, launcher))

    def phases() -> tuple[Any, Any, Any]:
        lib = build.compile_cached(generated.source, "c", _flags(generated))
        fn = _entry(lib, KERNEL_NAME, types)
        packed = _entry(lib, PACKED_NAME, [ctypes.c_char_p]) if generated.packed else None
        return fn, _entry(lib, ASSEMBLE_NAME, types) if sparse_output else None, packed

    if sparse_output and generated.append not in ("", KERNEL_NAME):
        lib = build.compile_cached(f"{APPEND_ONLY}\n{generated.source}", "c", _flags(generated))
        return Loaded(generated, None, append=_entry(lib, generated.append, types), later=phases)
    fn, assemble, packed = phases()
    append = fn if generated.append == KERNEL_NAME else None
    return Loaded(generated, fn, assemble, append, packed)


def _entry(lib: ctypes.CDLL, name: str, argtypes: list[Any]) -> Any:
    fn = getattr(lib, name)
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


def _flags(generated: Generated) -> tuple[str, ...]:
    """The build flags ``generated`` asks for beyond the toolchain's: wrapping integer
    arithmetic in an integral type, associative math where its (C) decision reassociates."""
    if is_integral(generated.dtype):
        return build.WRAP_FLAGS
    return build.REASSOCIATE_FLAGS if generated.reassociate else ()


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
        case abi.STAGES_MISSING:
            return StagesMissing(
                "internal: the kernel was built for another extent's register-tile stages "
                "(`Kernel` builds it with all of them and runs the call again)"
            )
        case abi.OK:
            raise AssertionError("status 0 is success, not an error")
    known = ", ".join(f"{name} ({code})" for name, code in abi.STATUSES.items())
    return SparsecError(f"kernel returned status {status}, none of the ABI's: {known}")
