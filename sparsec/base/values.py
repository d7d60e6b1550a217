"""The value types of kernels and tensors, one table read by every stage: each type's
kind, width, host storage dtype, and its spelling in C and CUDA.

Floating types compute as docs/semantics.md says ("Value types"): float16 and bfloat16
are stored in 16 bits and computed in float32. Integer types compute in their own type,
and every operation wraps modulo 2^bits as in numpy (the C target builds with
``-fwrapv``); bool computes in C's ``_Bool`` (CUDA's ``bool``), so ``+`` is or, ``*`` is
and, and a stored value is 0 or 1. The promotion of a call's inputs (`promote`) is
numpy's among integer and bool types, which torch shares where it has the types.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class ValueType:
    name: str
    #: numpy's kind: "b" bool, "i" signed, "u" unsigned integer, "f" floating
    kind: str
    bits: int
    #: the type of a value in C and in CUDA (16-bit floats: their storage, per target)
    c: str
    cuda: str

    @property
    def integral(self) -> bool:
        """bool or an integer type: exact arithmetic, wrapping on overflow."""
        return self.kind in "biu"

    @property
    def low(self) -> int:
        """The smallest value of an integral type."""
        return -(1 << (self.bits - 1)) if self.kind == "i" else 0

    @property
    def high(self) -> int:
        """The largest value of an integral type."""
        if self.kind == "b":
            return 1
        return (1 << (self.bits - 1)) - 1 if self.kind == "i" else (1 << self.bits) - 1


def _integer(name: str, kind: str, bits: int) -> ValueType:
    c = f"{'u' if kind == 'u' else ''}int{bits}_t"
    cuda = {8: "char", 16: "short", 32: "int", 64: "long long"}[bits]
    cuda = f"unsigned {cuda}" if kind == "u" else ("signed char" if bits == 8 else cuda)
    return ValueType(name, kind, bits, c, cuda)


TYPES: dict[str, ValueType] = {
    t.name: t
    for t in (
        ValueType("float64", "f", 64, "double", "double"),
        ValueType("float32", "f", 32, "float", "float"),
        ValueType("float16", "f", 16, "", ""),
        ValueType("bfloat16", "f", 16, "", ""),
        ValueType("bool", "b", 8, "_Bool", "bool"),
        *(_integer(f"int{b}", "i", b) for b in (8, 16, 32, 64)),
        *(_integer(f"uint{b}", "u", b) for b in (8, 16, 32, 64)),
    )
}
#: the integral value types (bool and the integers), narrowest first per kind
INTEGRAL = tuple(name for name, t in TYPES.items() if t.integral)
#: each integral type's host storage dtype (numpy's bool is one byte of 0 or 1, as _Bool)
INTEGRAL_STORAGE: dict[str, np.dtype] = {name: np.dtype(name) for name in INTEGRAL}


def value_type(name: str) -> ValueType:
    return TYPES[name]


def is_integral(name: str | None) -> bool:
    return name in INTEGRAL


def integral_name(dtype: object) -> str | None:
    """The integral type a numpy or torch dtype (or a name) names; None for others."""
    name = str(dtype).removeprefix("torch.")
    if name in INTEGRAL:
        return name
    try:
        found = np.dtype(dtype).name  # type: ignore[call-overload]
    except TypeError:
        return None
    return found if found in INTEGRAL else None


def promote(names: Iterable[str]) -> str:
    """The type integral inputs of these types promote to, as numpy does: bool below every
    integer, the wider of one signedness, a signed type wide enough for both of mixed
    signedness (int16 for int8 and uint8), and float64 for uint64 with any signed type
    (no integer type holds both)."""
    found = np.dtype(np.bool_)
    for name in names:
        found = np.promote_types(found, np.dtype(name))
    return found.name
