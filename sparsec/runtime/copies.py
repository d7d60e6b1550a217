"""Copies a call makes of its inputs, made on the call's threads.

A dense operand read through a derived copy (SDDMM's ``D`` read as ``D(j,k)``,
`sparsec.middle.derive`) is copied at every call, so that the copy always follows the
values passed. On one thread the copy of a large operand was serial work in every call
(a quarter of an SDDMM call on two threads: docs/decisions.md, "A call's derived dense
copy"). A 2-D copy that
reads across the source's rows (a transpose) is made by a compiled copy in bands of one
cache line per output row, on the call's OpenMP threads (`STRIDED_COPY_BYTES`); any other
large copy by numpy, in slabs on a pool of Python threads (`PARALLEL_COPY_BYTES`).
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

import numpy as np

from ..base.errors import CompileError
from ..base.resources import data_dir
from ..policy.machine import machine
from ..tensors.buffers import address, aligned_array, aligned_copy
from .build import compile_cached

#: a copy of at least this many bytes is made by several threads, in slabs of its first axis
#: (numpy copies without holding the GIL); below it, one thread's copy is faster than handing
#: work to others (docs/decisions.md, "A call's derived dense copy")
PARALLEL_COPY_BYTES = 1 << 20
#: a 2-D copy that reads across the source's rows (a transpose: SDDMM's ``D``) of at least
#: this many bytes is made by the compiled band copy (``templates/copies.c``) on the call's
#: OpenMP threads: numpy's copy of a transpose reads a source column for every output row,
#: slowly, and its slabs on Python threads contended with the kernel's OpenMP team
#: (measured: docs/decisions.md, "A transposed copy is made by compiled code")
STRIDED_COPY_BYTES = 64 << 10
#: the copy threads (one pool, made on first use; a child forked after it starts anew)
_POOLS: list[ThreadPoolExecutor] = []
_POOL_LOCK = threading.Lock()


def _forked() -> None:
    global _POOL_LOCK
    _POOL_LOCK = threading.Lock()  # a thread of the parent may have held it
    _POOLS.clear()  # their threads were not forked


os.register_at_fork(after_in_child=_forked)


def contiguous_copy(array: np.ndarray, threads: int = 1) -> np.ndarray:
    """``array`` as a C-ordered array: itself when it is one, else a copy, made by up to
    ``threads`` threads in slabs of its first axis when it is large."""
    if array.flags.c_contiguous:
        return array
    flat = as_2d(array)
    if array.nbytes >= STRIDED_COPY_BYTES and flat is not None and _across_rows(flat):
        copied = _band_copy(flat, threads, np.empty(flat.shape, flat.dtype))
        if copied is not None:
            return copied.reshape(array.shape)
    rows = array.shape[0] if array.ndim else 0
    parts = min(threads, rows)
    if parts < 2 or array.nbytes < PARALLEL_COPY_BYTES:
        return np.ascontiguousarray(array)
    out = np.empty(array.shape, array.dtype)
    cuts = [rows * n // parts for n in range(parts + 1)]

    def copy(n: int) -> None:
        np.copyto(out[cuts[n] : cuts[n + 1]], array[cuts[n] : cuts[n + 1]])

    list(_pool().map(copy, range(parts)))  # re-raises a copy's exception
    return out


def _pool() -> ThreadPoolExecutor:
    """The process's copy threads (as many as the machine's cores), made on first use."""
    with _POOL_LOCK:
        if not _POOLS:
            cores = max(2, machine().cores)
            _POOLS.append(ThreadPoolExecutor(cores, thread_name_prefix="sparsec-copy"))
        return _POOLS[0]


def _across_rows(array: np.ndarray) -> bool:
    """Whether ``array`` is 2-D, of plain values 2, 4 or 8 bytes wide, aligned, at positive
    strides, with no two neighbours in a row adjacent in memory (the band copy's case)."""
    size = array.itemsize
    if array.ndim != 2 or size not in (2, 4, 8) or array.dtype.hasobject:
        return False
    if not array.flags.aligned or any(s <= 0 or s % size for s in array.strides):
        return False
    return array.strides[1] != size


def packed_copy(array: np.ndarray, threads: int = 1, scratch: int | None = None) -> np.ndarray:
    """``array`` C-ordered, on a 64-byte boundary, whatever its strides: a packed panel of a
    dense operand (`Executable.run_panels`). A panel of an operand passed transposed (the
    tokens-first activations of `sparsec.nn.SparseLinear`, read as Xt(i,t)) is packed by the
    compiled band copy straight from it, so the operand is never transposed whole.

    ``scratch``: the copy lives only while one kernel call runs, and is made in the calling
    thread's scratch buffer number ``scratch`` (`scratch_array`; each operand of a call
    its own number) instead of fresh memory."""
    flat = as_2d(array)
    if flat is not None and not array.flags.c_contiguous and _across_rows(flat):
        if scratch is None:
            into = aligned_array(flat.shape, flat.dtype)
        else:
            into = scratch_array(scratch, flat.shape, flat.dtype)
        copied = _band_copy(flat, threads, into)
        if copied is not None:
            return copied.reshape(array.shape)
    if scratch is None:
        return aligned_copy(array)
    into = scratch_array(scratch, array.shape, array.dtype)
    np.copyto(into, array)
    return into


#: each thread's scratch buffers (`scratch_array`)
_SCRATCH = threading.local()
#: the largest scratch buffer kept: a larger copy is made in fresh memory (a one-off call on
#: a huge operand keeps nothing), where the copy's own time outweighs its page faults
SCRATCH_MAX_BYTES = 64 << 20


def scratch_array(number: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised C-ordered array on a 64-byte boundary in the calling thread's
    scratch buffer ``number``, kept from call to call and grown to the largest asked for.

    A packed copy made afresh at every call was freed at its end; glibc returns freed
    memory at the top of its heap to the system past a threshold that grows with the
    blocks it has mapped, so the next call's copy, and often its output, faulted in every
    page again (docs/decisions.md, "Packed copies in kept scratch buffers"). The buffer is
    the thread's until its next call with the same number: a copy made in it must not
    outlive the kernel call it feeds. Beyond `SCRATCH_MAX_BYTES` the array is fresh."""
    dtype = np.dtype(dtype)
    need = math.prod(shape) * dtype.itemsize + 64
    if need > SCRATCH_MAX_BYTES:
        return aligned_array(shape, dtype)
    buffers: dict[int, np.ndarray] = _SCRATCH.__dict__.setdefault("buffers", {})
    raw = buffers.get(number)
    if raw is None or raw.nbytes < need:
        raw = buffers[number] = np.empty(need, np.uint8)
    start = -address(raw) % 64
    return raw[start : start + need - 64].view(dtype).reshape(shape)


def as_2d(array: np.ndarray) -> np.ndarray | None:
    """``array`` as a 2-D view, its leading axes merged (their strides nest), or None."""
    if array.ndim < 2:
        return None
    strides, shape = array.strides, array.shape
    if any(strides[a] != strides[a + 1] * shape[a + 1] for a in range(array.ndim - 2)):
        return None
    rows = math.prod(shape[:-1])
    return np.lib.stride_tricks.as_strided(array, (rows, shape[-1]), strides[-2:])


def _band_copy(array: np.ndarray, threads: int, out: np.ndarray) -> np.ndarray | None:
    """``array`` written C-ordered into ``out`` by the compiled band copy; None where it
    cannot be built (no C compiler: a CUDA-only installation), and numpy copies."""
    copy = _copy_fn(array.itemsize)
    if copy is None:
        return None
    rs, cs = (s // array.itemsize for s in array.strides)
    copy(array.ctypes.data, out.ctypes.data, *array.shape, rs, cs, max(1, threads))
    return out


@cache
def _library() -> Any:
    """The compiled copies (``templates/copies.c``: built once, then cached on disk as
    kernels are), or None when they cannot be built."""
    source = (data_dir("templates") / "copies.c").read_text()
    try:
        return compile_cached(source)
    except CompileError:
        return None


@cache
def _copy_fn(size: int) -> Any:
    """The compiled band copy for values of ``size`` bytes, or None (`_library`)."""
    lib = _library()
    if lib is None:
        return None
    fn = getattr(lib, f"sparsec_copy2d_{size}")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, *[ctypes.c_int64] * 4, ctypes.c_int]
    fn.restype = None
    return fn


@cache
def panels_fn() -> Any:
    """The compiled panel driver (``sparsec_panels`` in ``templates/copies.c``: a kernel's
    call in column panels in one C call, `Executable.run_panels`), or None (`_library`)."""
    lib = _library()
    if lib is None:
        return None
    fn = lib.sparsec_panels
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = [i64, ptr, i64, ptr, i64, i64, i64, i64, i64, i64, i64, i64, i64, ptr]
    fn.argtypes += [ctypes.c_int, ctypes.c_int, ctypes.c_int, i64, ctypes.POINTER(i64)]
    fn.restype = ctypes.c_int
    return fn
