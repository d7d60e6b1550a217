"""The one argument marshalling: a kernel's ABI parameters (`sparsec.abi.Signature.params`)
filled from a call's inputs, extents and output arrays.

`slots` reads each parameter once: where its value comes from in a call (`Source`). Every
caller fills the same slots:

- `arguments` with `ADDRESSES`: the ctypes call of the C kernel, its sparse-output phases
  and the CUDA emulation (arrays by address);
- `arguments` with `HOST`: the arrays themselves, by parameter name (`named`), from which the
  CUDA launch grid is evaluated on the host;
- `arguments` with a device form (`sparsec.runtime.device`): CuPy arrays and typed scalars for
  a ``RawKernel`` launch;
- `sparsec.runtime.fastpath`, which writes the same slots out as Python expressions.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, assert_never

from ..abi import Param, Signature
from ..tensors.buffers import address
from ..tensors.tensor import Tensor


class Source(enum.Enum):
    """Where a parameter's value comes from in a call."""

    #: an array the runtime allocates for the output (its vals, pos and crd; ``sc_sizes``)
    OUTPUT = "output"
    #: an input's storage array: a `Tensor`'s pos, crd or vals, or a dense operand
    INPUT = "input"
    #: a scalar input's value
    SCALAR = "scalar"
    #: an index variable's extent
    DIM = "dim"
    THREADS = "threads"
    #: register tiles per column band (`sparsec.policy.costs.Columns.band_tiles`)
    BAND = "band"
    #: coordinates per depth block (`sparsec.policy.costs.Columns.depth_rows`)
    DEPTH = "depth"


@dataclass(frozen=True, slots=True)
class Slot:
    """One ABI parameter, where its value comes from, and what it is looked up by."""

    param: Param
    source: Source
    #: (field, level): an array's key in an output's arrays and in `Tensor.addresses`
    key: tuple[str, int]
    #: the input (INPUT, SCALAR) or the index variable (DIM) it reads; "" for the others
    of: str


_BY_FIELD = {
    "value": Source.SCALAR,
    "dim": Source.DIM,
    "threads": Source.THREADS,
    "band": Source.BAND,
    "depth": Source.DEPTH,
    "sizes": Source.OUTPUT,
}


def slots(signature: Signature) -> tuple[Slot, ...]:
    """Each parameter of ``signature`` with its source (the output is the first tensor)."""
    out_name = signature.params[0].tensor
    found = []
    for p in signature.params:
        source = _BY_FIELD.get(p.field)
        if source is None:  # pos, crd, vals
            source = Source.OUTPUT if p.tensor == out_name else Source.INPUT
        of = p.index if source is Source.DIM else p.tensor
        found.append(Slot(p, source, (p.field, p.level), of or ""))
    return tuple(found)


@dataclass(frozen=True, slots=True)
class Form:
    """How one caller passes arrays and scalars: ``tensor(t, key)`` for an input `Tensor`'s
    array ``key`` (field, level), ``array(a)`` for a dense input, ``output(a)`` for an output
    array (None where the call has none, as the count phase's vals), ``scalar(param, v)``
    for a value (None: as it is)."""

    tensor: Callable[[Tensor, tuple[str, int]], Any]
    array: Callable[[Any], Any]
    output: Callable[[Any], Any]
    scalar: Callable[[Param, Any], Any] | None = None


def _tensor_array(t: Tensor, key: tuple[str, int]) -> Any:
    field, level = key
    return t.vals if field == "vals" else getattr(t.levels[level], field)


def _tensor_address(t: Tensor, key: tuple[str, int]) -> int:
    return t.addresses()[key]


def _address(array: Any) -> int:
    return address(array)  # looked up at each call, so tests may watch the addresses passed


def _output_address(array: Any) -> int | None:
    return None if array is None else address(array)


def _same(value: Any) -> Any:
    return value


#: ctypes: every array by address (a `Tensor`'s addresses are computed once per tensor)
ADDRESSES = Form(_tensor_address, _address, _output_address)
#: the arrays themselves (numpy, or whatever the caller's output is)
HOST = Form(_tensor_array, _same, _same)


def arguments(
    slots: tuple[Slot, ...],
    values: Mapping[str, Any],
    dims: Mapping[str, int],
    outputs: Mapping[tuple[str, int], Any],
    threads: int,
    band: int = 0,
    depth: int = 0,
    form: Form = ADDRESSES,
) -> list[Any]:
    """The ABI argument list of one call in ``form``: ``values`` the inputs in kernel layout
    (`sparsec.runtime.inputs.Prepared`), ``dims`` the extents, ``outputs[(field, level)]``
    the output's arrays, ``band`` and ``depth`` the column layout's knobs (on kernels that
    take them)."""
    found: list[Any] = []
    tensor, array, scalar = form.tensor, form.array, form.scalar
    for slot in slots:
        match slot.source:  # the commonest sources first: this runs per call
            case Source.INPUT:
                v = values[slot.of]
                found.append(tensor(v, slot.key) if isinstance(v, Tensor) else array(v))
                continue
            case Source.DIM:
                v = dims[slot.of]
            case Source.OUTPUT:
                found.append(form.output(outputs.get(slot.key)))
                continue
            case Source.SCALAR:
                v = values[slot.of]
            case Source.THREADS:
                v = threads
            case Source.BAND:
                v = band
            case Source.DEPTH:
                v = depth
            case other:
                assert_never(other)
        found.append(v if scalar is None else scalar(slot.param, v))
    return found


def named(slots: tuple[Slot, ...], arguments: list[Any]) -> dict[str, Any]:
    """``arguments`` by parameter name (as the kernel's source reads them)."""
    return {slot.param.name: value for slot, value in zip(slots, arguments, strict=True)}
