"""The hot path for repeated calls whose inputs already fit a kernel exactly: a Python
function written for one `Executable` (`build`), which checks the inputs and calls the C
kernel with no loops over inputs, parameters or extents.

Built after a first call whose every input was a `Tensor` in the declared format, a
C-ordered ndarray of the kernel's dtype (identity-ordered dense operand) or a float. A call
that fits the same way skips conversion and re-planning; anything else (including a shape
mismatch, which then gets its error) returns None, and the caller takes the general path.

Its arguments are the ABI's slots (`sparsec.runtime.args.slots`), each written out as the
expression that fills it. Its identifiers are generated (v0, d1, ...): names and other
values come in as bound constants, so no user text reaches the source. The module-level
names it calls (`address`, `resolve_threads`, `costs`' thresholds) are looked up in this
module at each call.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..policy import costs  # noqa: F401 - read by the generated source
from ..tensors.buffers import ALIGN_FROM_BYTES, address, aligned_empty  # noqa: F401
from ..tensors.formats import canonical
from ..tensors.halves import HALF, storage_fill
from ..tensors.tensor import Tensor
from .args import Source
from .binding import INDEX_DTYPES, MAX_THREADS, VALUE_DTYPES, resolve_threads, use_threads  # noqa: F401
from .copies import packed_copy  # noqa: F401 - called by the generated source
from .executable import Executable
from .inputs import Binder, Prepared
from .loaded import status_error  # noqa: F401 - raised by the generated source


class FastPath:
    """One kernel's generated call: ``call(inputs, threads)`` -> the output, or None."""

    __slots__ = ("call", "source")

    def __init__(self, source: str, constants: dict[str, Any]) -> None:
        made: dict[str, Any] = {}
        exec(compile(source, "<sparsec fast path>", "exec"), globals(), made)
        self.call: Callable[[Mapping[str, Any], int | None], Any] = made["make"](**constants)
        self.source = source


def build(
    binder: Binder, executable: Executable, prepared: Prepared, inputs: Mapping[str, Any]
) -> FastPath | None:
    """The fast path of ``executable`` for calls like this first one, or None where its
    calls cannot take one (a sparse or accumulated output, torch inputs, a GPU target, a
    reordered output, an input that was converted, an extent no input gives)."""
    if executable.accumulate or prepared.use_torch or executable.sparse is not None:
        return None
    if prepared.dtype in HALF:
        return None  # outputs in 16-bit storage are converted and padded (`Executable`)
    if binder.derived:
        return None  # derived inputs are computed from the passed ones on every call
    if executable.target.gpu or not executable.out_identity:
        return None
    for t in binder.wanted:
        v = inputs[t.name]
        if t.order == 0:
            ok = type(v) is float
        elif t.is_dense:
            ok = type(v) is np.ndarray and t.format.ordering == tuple(range(t.order))
        else:
            ok = isinstance(v, Tensor)
        if not ok or prepared.values[t.name] is not v:
            return None
    written = _source(binder, executable, prepared)
    return None if written is None else FastPath(*written)


def _source(
    binder: Binder, executable: Executable, prepared: Prepared
) -> tuple[str, dict[str, Any]] | None:
    """Python source of the fast path's call (``make(**constants)`` returns it), and the
    constants it binds; None where an extent or a column operand is not among the inputs.
    It does what the general path would for inputs that already fit, or returns None where
    they do not."""
    loaded = executable.loaded
    dtype = np.dtype(VALUE_DTYPES[prepared.dtype])
    constants: dict[str, Any] = {
        "NAMES": binder.names,
        "DT": dtype,
        "IDT": np.dtype(INDEX_DTYPES[prepared.index_dtype]),
        "ITEMSIZE": dtype.itemsize,
        "FN": loaded.fn,
        "GEN": loaded.generated,
    }
    lines = ["if inputs.keys() != NAMES:", "    return None"]
    modes: dict[str, list[tuple[int, str]]] = {}
    for name, axis, index in binder.modes:
        modes.setdefault(name, []).append((axis, index))
    local: dict[str, str] = {}  # tensor name -> its local (v0, v1, ...)
    dense = {t.name: t.is_dense for t in binder.wanted}
    extent: dict[str, str] = {}  # index -> the local holding its extent (d0, d1, ...)
    carriers = set(executable.columns.carriers)
    for n, t in enumerate(binder.wanted):
        v = local[t.name] = f"v{n}"
        constants[f"N{n}"] = t.name
        lines.append(f"{v} = inputs[N{n}]")
        if t.order == 0:
            test = f"type({v}) is not float"
        elif t.is_dense:
            test = (
                f"type({v}) is not np.ndarray or ({v}.dtype is not DT and {v}.dtype != DT) "
                f"or {v}.ndim != {t.order}"
            )
            if t.name not in carriers:  # a panel operand may come strided: copied below
                test += f" or not {v}.flags.c_contiguous"
        else:
            constants[f"F{n}"] = canonical(t.format)
            test = (
                f"type({v}) is not Tensor or ({v}.vals.dtype is not DT and {v}.vals.dtype != DT)"
                f" or ({v}.index_dtype is not IDT and {v}.index_dtype != IDT)"
                f" or ({v}.format is not F{n} and {v}.format != F{n})"
            )
        lines += [f"if {test}:", "    return None"]
        if t.order and t.is_dense:
            lines.append(f"x{n} = address({v})")
        elif t.order:
            lines.append(f"a{n} = {v}.addresses()")
        if modes.get(t.name):
            lines.append(f"s{n} = {v}.shape")
        for axis, index in modes.get(t.name, []):
            if index in extent:
                lines += [f"if s{n}[{axis}] != {extent[index]}:", "    return None"]
            else:
                extent[index] = f"d{len(extent)}"
                lines.append(f"{extent[index]} = s{n}[{axis}]")
    slots = executable.slots
    sources = {slot.source for slot in slots}
    needed = {slot.of for slot in slots if slot.source is Source.DIM}
    columns = executable.columns
    if not needed <= set(extent) or not set(columns.out_indices) <= set(extent):
        return None  # an extent no input gives
    shape = [extent[i] for i in columns.out_indices]
    size = " * ".join(shape) or "1"
    j = columns.index
    if j is not None and not set(columns.carriers) <= set(local):
        return None  # a dense operand along j that the call does not pass
    if j is not None:
        # only wide calls may run in panels or bands (both cost models need the columns)
        constants["COLUMNS"] = columns
        constants["CARRIERS"] = columns.carriers
        constants["SHARED"] = executable.loaded.generated.shared_rows
        constants["INDICES"] = tuple(extent)
        dims = f"dict(zip(INDICES, ({', '.join(extent.values())},)))"
        off = " or ".join(f"x{local[c].removeprefix('v')} % 64" for c in columns.carriers)
        slices = " * ".join(extent[i] for i in columns.sliced) or "1"
        lines += [
            f"wide = {extent[j]} >= costs.PANEL_MIN_COLUMNS",
            f"if wide and costs.panels_pay({extent[j]}, CARRIERS, inputs, {size}, None, {slices}):",
            "    return None  # the general path runs it in column panels",
        ]
        realign = [
            f"if ({off}) and costs.misaligned({extent[j]}, CARRIERS, inputs, SHARED, th):",
            "    return None  # the general path copies them onto a cache line",
        ]
        if Source.BAND in sources:
            lines.append(f"band = COLUMNS.band_tiles({dims}, inputs) if wide else 0")
        if Source.DEPTH in sources:
            carried = " + ".join(f"{local[c]}.nbytes" for c in columns.carriers)
            lines += [
                "depth = 0",
                # `Columns.depth_rows`'s first test, without its call
                f"if not wide and {carried} > costs.DEPTH_MIN_BYTES:",
                f"    depth = COLUMNS.depth_rows({dims}, inputs)",
            ]
    else:
        lines += ["band = 0", "depth = 0"]
        realign = []
    lines += [
        "th = (use_threads(threads) if type(threads) is int and 0 < threads <= MAX_THREADS"
        " else resolve_threads(threads))",
        *realign,
    ]
    for number, name in enumerate(sorted(carriers & set(local))):
        # a panel operand passed strided (SparseLinear's transposed activations) is made
        # C-ordered on a cache line by the compiled copy, as the general path's whole run
        # does, in the thread's scratch buffer (it lives for this call only)
        v, m = local[name], local[name].removeprefix("v")
        lines += [
            f"if not {v}.flags.c_contiguous:",
            f"    {v} = packed_copy({v}, th, {number})",
            f"    x{m} = address({v})",
        ]
    lines += [
        f"if {size} * ITEMSIZE < ALIGN_FROM_BYTES:",
        f"    out = np.empty(({''.join(d + ', ' for d in shape)}), DT)",
        "else:",
        f"    out = aligned_empty({size}, DT).reshape(({''.join(d + ', ' for d in shape)}))",
    ]
    if executable.poison:
        # test mode: an element the kernel fails to write shows
        constants["POISON"] = storage_fill(np.nan, prepared.dtype)
        lines.append("out.fill(POISON)")
    args = []
    for n, slot in enumerate(slots):
        match slot.source:
            case Source.DIM:
                args.append(extent[slot.of])
            case Source.THREADS:
                args.append("th")
            case Source.BAND | Source.DEPTH:
                args.append(slot.source.value)
            case Source.OUTPUT:
                args.append("address(out)")
            case Source.SCALAR:
                args.append(local[slot.of])
            case Source.INPUT:
                m = local[slot.of].removeprefix("v")
                if dense[slot.of]:
                    args.append(f"x{m}")
                else:
                    constants[f"K{n}"] = slot.key
                    args.append(f"a{m}[K{n}]")
    if loaded.packed is not None:
        # one ctypes argument: the int64s packed in a bytes object (see `Loaded.packed`)
        constants["FNP"] = loaded.packed
        constants["PACK"] = struct.Struct(f"={len(args)}q").pack
        lines.append(f"status = FNP(PACK({', '.join(args)}))")
    else:
        lines.append(f"status = FN({', '.join(args)})")
    lines += [
        "if status != 0:",
        "    raise status_error(status, GEN)",
        "return out[()]" if executable.output.order == 0 else "return out",
    ]
    body = "\n".join("        " + line for line in lines)
    source = f"def make({', '.join(constants)}):\n    def call(inputs, threads):\n{body}\n    return call\n"
    return source, constants
