"""Copies a call makes of its inputs, made on the call's threads.

A dense operand read through a derived copy (SDDMM's ``D`` read as ``D(j,k)``,
`sparsec.middle.derive`) is copied at every call, so that the copy always follows the
values passed. On one thread the copy of a large operand was serial work in every call
(64 x 20000 float64: about 1.1 ms of a 4.5 ms SDDMM call on two threads).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..policy.machine import machine

#: a copy of at least this many bytes is made by several threads, in slabs of its first axis
#: (numpy copies without holding the GIL); below it, one thread's copy is faster than handing
#: work to others (about 30 us)
PARALLEL_COPY_BYTES = 1 << 20
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
