"""Fill values at a kernel call (docs/semantics.md, "Fill values").

A sparse operand's absent entries are the kernel's *absent value*: 0 under ``plus_times``,
the semiring's add identity otherwise (an integral type's limit for an infinity), which
is what lets the loops skip them (it annihilates ``*`` and is neutral for ``+``). A
`Tensor` whose ``fill_value`` is another value is no such operand: its absent entries
hold a value that takes part, so the call reads it as the dense array it stands for, through
the same statement compiled with that operand dense (`dense_for_fills`). A tensor without
a fill (None, the default) takes the absent value of the kernel that reads it, as a
GraphBLAS matrix does; a kernel's sparse output has none.
"""

from __future__ import annotations

from typing import Any

from ..base.values import is_integral
from ..frontend.semirings import semiring
from ..tensors.halves import compute_fill
from ..tensors.storage import same_fill
from ..tensors.tensor import Tensor

#: a `sparsec.api.kernel.Kernel` (not imported: the kernel imports this module)
Kernel = Any


def absent_value(kernel: Kernel, dtype: str | None = None) -> Any:
    """The value of a sparse operand's absent entry in ``kernel`` (in ``dtype``'s terms for
    an integral type: its limits for infinities)."""
    identity = semiring(kernel.semantics.semiring).identity
    return compute_fill(identity, dtype) if dtype and is_integral(dtype) else identity


def reads_as_absent(value: Tensor, kernel: Kernel) -> bool:
    """Whether ``value``'s fill is the kernel's absent value (in its own value type); an
    unspecified fill (None) is."""
    fill = value.fill_value
    return fill is None or same_fill(fill, absent_value(kernel, value.vals.dtype.name))


def dense_for_fills(kernel: Kernel, inputs: dict[str, Any]) -> tuple[Kernel, dict[str, Any]] | None:
    """Where a sparse `Tensor` input's fill is not the kernel's absent value: the same
    statement with those operands dense (made once per kernel and set of names), and the
    inputs with them densified (their fill written); None where every fill fits (at once
    where no input declares one: this runs on every call)."""
    if all(getattr(value, "fill_value", None) is None for value in inputs.values()):
        return None
    patterns = kernel.spec.patterns
    output = kernel.spec.output.name
    names = {t.argument: t.name for t in kernel.binder.wanted}
    swapped = frozenset(
        names[arg]
        for arg, value in inputs.items()
        if isinstance(value, Tensor)
        and value.order
        and not value.format.is_dense
        and names.get(arg) not in (*patterns, output, None)
        and not reads_as_absent(value, kernel)
    )
    if not swapped:
        return None
    variant = kernel.dense_variant(swapped)
    densified = {
        arg: value.to_dense() if names.get(arg) in swapped else value
        for arg, value in inputs.items()
    }
    return variant, densified
