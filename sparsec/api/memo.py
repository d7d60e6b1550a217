"""`sparsec.kernel`'s memo key: the arguments that made a kernel, frozen, with the
environment and the machine whose facts its generated code holds."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..policy.machine import machine
from ..tensors.formats import Format
from ..tensors.maps import MappedFormat

_MEMO_ENVIRONMENT = (
    "SPARSEC_POISON",
    "SPARSEC_CC",
    "SPARSEC_CFLAGS",
    "SPARSEC_CXX",
    "SPARSEC_CXXFLAGS",
    "SPARSEC_CACHE_DIR",
)


def _memo_key(*args: Any) -> tuple[Any, ...] | None:
    """A hashable key for `kernel`'s arguments, or None when one of them has no exact
    frozen spelling (then the kernel is built anew, never confused with another)."""

    def freeze(v: Any) -> Any:
        if v is None or isinstance(v, str | int | float | Format | MappedFormat):
            return (type(v).__name__, v)
        if isinstance(v, np.dtype):
            return ("dtype", v.str)
        if isinstance(v, type) and issubclass(v, np.generic):
            return ("dtype", np.dtype(v).str)
        if isinstance(v, Mapping):
            return ("map", tuple(sorted((freeze(k), freeze(x)) for k, x in v.items())))
        if isinstance(v, list | tuple):
            return (type(v).__name__, tuple(freeze(x) for x in v))
        raise TypeError

    try:
        # a kernel keeps the library it built: a changed toolchain or cache gets a new one,
        # and so does another machine (its generated code holds the machine's facts)
        env = tuple(os.environ.get(name) for name in _MEMO_ENVIRONMENT)
        key = (*(freeze(a) for a in args), *env, machine())
        hash(key)
    except TypeError:
        return None
    return key
