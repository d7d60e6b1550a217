"""The runtime's cost models: how a call of a dense-output kernel runs, from its extents,
its inputs and the host's facts (`sparsec.policy.machine`).

A kernel whose dense output's last index ``j`` is free, the last mode of every dense operand
it indexes and of no sparse operand, and whose dense operands along ``j`` are gathered again
and again (``C(i,j) = W(i,k) * X(k,j)``: every stored ``W(i,k)`` reads row ``k`` of ``X``)
may run a call in one of four layouts:

- whole: each row of the sparse operand gathers its rows of the dense operands;
- column panels (`panels_pay`): the call in panels of `PANEL_COLUMNS` columns, each
  carrier's panel packed contiguous, so the gathers hit cache;
- column bands (`bands_pay`, `sparsec.passes.bands`): the kernel's register tiles a band at
  a time, its slice of the dense operands kept in cache across all rows;
- depth blocks (`depth_rows`): under `PANEL_MIN_COLUMNS` columns, the reduction's
  coordinates a block at a time, that block of the dense operands kept in the core's cache.

`Columns` is that analysis for one kernel (`Columns.of`) and its per-call decisions. The
constants are measured; docs/decisions.md holds the logs. `SINGLE_PASS_ENTRIES` bounds the
memory of a sparse output's single pass (`sparsec.runtime.sparse_out`).

Every threshold is read from this module at each decision, so a test or a bench that sets
one (``monkeypatch.setattr(costs, "PANEL_MIN_BYTES", 0)``) steers every call, the runtime's
fast path included. A threshold seen to differ by CPU is calibrated on the host
(`policy.calibrated`, ``costs.`` options), and the calibrated value, where there is one,
takes the constant's place.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..base.target import Target
from ..middle.spec import Spec
from ..tensors.buffers import address
from ..tensors.formats import Dense, Format
from ..tensors.tensor import Tensor
from . import calibrated
from .machine import Machine, machine

#: the single pass allocates for its bound (plus one extent of the last level) up front:
#: past this many entries the two phases run instead, so a loose bound or a huge extent
#: never costs more memory than this
SINGLE_PASS_ENTRIES = 1 << 24
#: the chunked single pass (`sparsec.lower.chunks`) reserves each chunk the bound on its
#: own rows' entries (address space: only the pages a chunk writes are ever backed); past
#: this many entries in all the two phases run instead
CHUNKED_ENTRIES = 1 << 26
#: column panels (`Columns.width`): columns per panel; a call runs in panels when the panel
#: index has at least PANEL_MIN_COLUMNS, the dense operands along it hold more than
#: PANEL_MIN_BYTES, and `panels_pay` expects the gathers saved to repay the copies: at
#: least PANEL_MIN_REUSE bytes gathered per byte copied while the operands fit the
#: last-level cache, PANEL_MIN_REUSE_BEYOND_CACHE beyond it (the measurements behind each
#: threshold: docs/decisions.md, "Column panels, packed")
PANEL_COLUMNS = 128
PANEL_MIN_COLUMNS = 1024
#: the narrowest panel `panel_columns` makes (the narrowest measured)
PANEL_MIN_WIDTH = 64
PANEL_MIN_BYTES = 4 << 20
PANEL_MIN_REUSE = 48
PANEL_MIN_REUSE_BEYOND_CACHE = 10
#: a dense operand gathered by rows is copied onto a cache line where it is off one and at
#: least this many bytes are gathered from the operands per byte copied (`misaligned`)
REALIGN_MIN_REUSE = 16
#: column bands (`sparsec.passes.bands`, `bands_pay`), for calls that do not run in panels:
#: register tiles per band (4 tiles of 8 AVX2 vectors: 1 KB of each row), the dense
#: operands' size beyond which bands may pay, and the bytes gathered per output byte they
#: need (banded rows write the output in strided pieces, which costs where it dominates;
#: measured: docs/decisions.md, "Column bands, in place")
BAND_TILES = 4
BAND_MIN_BYTES = 4 << 20
BAND_MIN_REUSE = 24
#: depth blocks (`sparsec.passes.bands`, `depth_rows`), for calls under PANEL_MIN_COLUMNS
#: columns: the dense operands' size beyond which they may pay and their least size
#: relative to the output's (each block loads and stores the output), the bytes gathered
#: per byte of them they need, the stored entries per row and block they need (each
#: block searches every row), the share of the core's cache a block of them fills, and
#: the fewest coordinates per block (measured: see docs/decisions.md, "Depth blocks")
DEPTH_MIN_BYTES = 4 << 20
DEPTH_MIN_OVER_OUTPUT = 1
DEPTH_MIN_REUSE = 8
DEPTH_MIN_ENTRIES = 4
DEPTH_BLOCK_FRACTION = 2.0
DEPTH_MIN_ROWS = 16


def column_traffic(
    columns: int, carriers: tuple[str, ...], values: Mapping[str, Any]
) -> tuple[int, int, int]:
    """What the panel and band cost models weigh: the bytes of the dense operands along the
    panel index, the bytes gathered from them (stored sparse entries x columns x value
    size), and the value size."""
    carried = [values[n] for n in carriers]
    size = carried[0].itemsize
    gathered = sum(v.nnz for v in values.values() if isinstance(v, Tensor)) * columns * size
    return sum(a.nbytes for a in carried), gathered, size


def misaligned(
    columns: int,
    carriers: tuple[str, ...],
    values: Mapping[str, Any],
    shared: int = 1,
    threads: int = 1,
) -> tuple[str, ...]:
    """The dense operands along the panel index a call copies onto a cache line first
    (`sparsec.tensors.buffers.aligned_copy`): those whose first value is off a 64-byte
    boundary (numpy's large arrays are 16-byte aligned) while their rows are whole cache
    lines, so that every vector load of every row splits over two lines, in a call that
    gathers at least REALIGN_MIN_REUSE bytes from them per byte copied (measured:
    docs/decisions.md, "Packed panels start on a cache line"). ``shared``: the output rows
    each gathered vector serves (`Generated.shared_rows`: a bsr block's rows in one
    register tile), which divides the loads the stored entries make; ``threads``: the
    kernel's, which share the split loads while the calling thread copies alone."""
    off = tuple(
        n for n in carriers if address(values[n]) % 64 and values[n].strides[-1] * columns % 64 == 0
    )
    if not off:
        return ()
    carried_bytes, gathered, _ = column_traffic(columns, carriers, values)
    return off if gathered >= REALIGN_MIN_REUSE * carried_bytes * shared * threads else ()


def panels_pay(
    columns: int,
    carriers: tuple[str, ...],
    values: Mapping[str, Any],
    out_elements: int,
    on: Machine | None = None,
    slices: int = 1,
) -> bool:
    """Whether a call with ``columns`` along the panel index runs in packed panels on the
    machine ``on`` (the current `machine()` when None).

    A cost model: panels move the dense operands along j and the output once more (packing
    ``X``, placing each output panel: ``X + 2 Y`` bytes) to keep the gathers (stored sparse
    entries x columns x value size) in cache. Whole, those gathers come from memory once the
    operands outgrow the last-level cache, and mostly from cache (with conflict misses at
    power-of-two strides) below it; so panels need PANEL_MIN_REUSE_BEYOND_CACHE bytes
    gathered per byte moved in the first case and PANEL_MIN_REUSE in the second. Within
    the last-level cache, where a row's gathers span more than the core's own cache, how
    well the shared cache feeds them is the CPU's: that threshold is calibrated on the
    host (``costs.panel_min_reuse``). ``slices``: the windows the dense operands fall into,
    each gathered from by every row before the next (`Columns.sliced`: a weight stored in
    column blocks), so a row's gathers span one window."""
    if columns < PANEL_MIN_COLUMNS:
        return False
    carried_bytes, gathered, size = column_traffic(columns, carriers, values)
    if carried_bytes <= calibrated.cost("panel_min_bytes", PANEL_MIN_BYTES):
        return False
    moved = carried_bytes + 2 * out_elements * size
    host = on or machine()
    if carried_bytes > host.last_level_cache:
        least = PANEL_MIN_REUSE_BEYOND_CACHE
    elif carried_bytes // max(slices, 1) > host.core_cache:
        least = calibrated.cost("panel_min_reuse", PANEL_MIN_REUSE)
    else:
        least = PANEL_MIN_REUSE
    return gathered >= least * moved


def panel_columns(
    columns: int, carriers: tuple[str, ...], values: Mapping[str, Any], on: Machine | None = None
) -> int:
    """Columns per panel for a call with ``columns`` along the panel index: `PANEL_COLUMNS`,
    or, where the host's calibration says panels should fit the core's cache
    (``costs.panel_fit``), halved while a panel of the dense operands outgrows it, down to
    `PANEL_MIN_WIDTH` (measured: docs/decisions.md, "Column panels, packed")."""
    width = PANEL_COLUMNS
    if calibrated.cost("panel_fit", False):
        carried, _, _ = column_traffic(columns, carriers, values)
        per_column = carried // max(columns, 1)
        cache = (on or machine()).core_cache
        while width > PANEL_MIN_WIDTH and per_column * width > cache:
            width //= 2
    return width


def panels_in_sequence() -> bool:
    """Whether a call's panels run one after another, each on all the call's threads,
    rather than shared among as many workers, each on one thread: the host's calibration
    (``costs.panels_in_sequence``), else workers (measured: docs/decisions.md, "Column
    panels, packed")."""
    return bool(calibrated.cost("panels_in_sequence", False))


def bands_pay(
    columns: int, carriers: tuple[str, ...], values: Mapping[str, Any], out_elements: int
) -> bool:
    """Whether a call that does not run in packed panels runs its tiles in column bands
    (`sparsec.passes.bands`).

    A band keeps its slice of the dense operands in cache across all the rows that gather
    it, where whole rows gather from memory once those operands outgrow the caches; it
    costs the output's locality (each row is written a band at a time, in strided pieces).
    So bands need dense operands beyond BAND_MIN_BYTES and BAND_MIN_REUSE bytes gathered
    per byte of output."""
    if columns < PANEL_MIN_COLUMNS:
        return False
    carried_bytes, gathered, size = column_traffic(columns, carriers, values)
    if carried_bytes <= BAND_MIN_BYTES:
        return False
    return gathered >= BAND_MIN_REUSE * out_elements * size


def depth_rows(
    columns: int,
    carriers: tuple[str, ...],
    values: Mapping[str, Any],
    out_elements: int,
    on: Machine | None = None,
) -> int:
    """Coordinates per depth block for a call that runs neither in panels nor in bands on
    the machine ``on`` (the current `machine()` when None), or 0 for one block
    (`sparsec.passes.bands`).

    Rows whole, each row of the sparse operand gathers its rows of the dense operands from
    the shared cache once those outgrow the core's own; a depth block keeps
    DEPTH_BLOCK_FRACTION of the core's cache of them live across all rows, and costs a
    load and a store of the output and a search in each row per block. So depth blocks
    need dense operands beyond DEPTH_MIN_BYTES and DEPTH_MIN_OVER_OUTPUT times the
    output's size, DEPTH_MIN_REUSE bytes gathered per byte of them, and DEPTH_MIN_ENTRIES
    stored entries per row and block on average."""
    carried_bytes, gathered, size = column_traffic(columns, carriers, values)
    if carried_bytes <= DEPTH_MIN_BYTES:
        return 0
    if carried_bytes < DEPTH_MIN_OVER_OUTPUT * out_elements * size:
        return 0
    if gathered < DEPTH_MIN_REUSE * carried_bytes:
        return 0
    row_bytes = columns * size  # of a dense operand, per coordinate of the reduction
    block_bytes = int((on or machine()).core_cache * DEPTH_BLOCK_FRACTION)
    depth = max(DEPTH_MIN_ROWS, block_bytes // row_bytes)
    blocks = -(-carried_bytes // (depth * row_bytes))
    entries, rows = gathered // row_bytes, out_elements // max(columns, 1)
    if entries < DEPTH_MIN_ENTRIES * rows * blocks:
        return 0
    return depth


def column_block(features: int, itemsize: int, on: Machine | None = None) -> int:
    """Inputs per column block of a pruned layer's weight over ``features`` inputs
    (`sparsec.nn.SparseLinear`), or ``features`` for one block.

    The layer's product runs over W stored a block of its input columns at a time,
    ``Yt(o,t) = W(b,o,k) * Xt(b,k,t)``: while every output row gathers from block b, only
    block b's rows of a packed panel of Xt are live. A block of them the size of the core's
    L1 data cache (`Machine.l1_data`) at a panel's PANEL_COLUMNS columns stays in L1 across
    all output rows, where a whole panel is gathered from L2; each block's entries of W are
    stored together, one stream. The block must divide ``features`` (Xt is viewed as
    (blocks, block, tokens)): the divisor nearest the L1 fit within a factor of two, else
    one block (measured: docs/decisions.md, "SparseLinear in column blocks")."""
    fit = max(1, (on or machine()).l1_data // (PANEL_COLUMNS * itemsize))
    near = [d for d in range(max(1, fit // 2), 2 * fit + 1) if features % d == 0]
    if not near or features <= fit:
        return features
    return min(near, key=lambda d: (abs(d - fit), d))


def block_tokens(features: int, itemsize: int, on: Machine | None = None) -> int:
    """The fewest tokens from which a call runs in column blocks (`column_block`): where the
    activations (``features`` x tokens) outgrow the L1 data cache. Below that every gather
    hits L1 anyway, and each block would cost a parallel region of its own."""
    return (on or machine()).l1_data // (features * itemsize) + 1


@dataclass(frozen=True, slots=True)
class Columns:
    """The column layouts open to one kernel's calls, and the choice for each call.

    ``index`` is the panel index ``j`` (None: every call runs whole), ``carriers`` the dense
    operands indexed by it, ``out_indices`` the output's indices in level order (its
    elements are their extents' product). ``sliced``: summed indices of the carriers that
    every sparse operand indexing them stores in a dense level above all its others that
    are not dense (W(b,o,k) stored ``dds``: b), so that each of their coordinates is a
    window of the carriers all rows gather from before the next (`panels_pay`'s
    ``slices``: their extents' product)."""

    index: str | None
    carriers: tuple[str, ...]
    out_indices: tuple[str, ...]
    sliced: tuple[str, ...] = ()

    @staticmethod
    def of(spec: Spec, target: Target) -> Columns:
        """(j, the dense inputs indexed by j) when the output's columns can be computed in
        independent panels: j is the dense output's last index, not summed, and the last
        mode of every (dense, identity-ordered) operand it indexes; no sparse operand uses
        it; and some such operand is also indexed by a summed index (SpMM's X(k,j)), so it
        is read again and again. Else no index: C kernels only."""
        out, lhs = spec.output, spec.statement.lhs
        out_indices = tuple(lhs.indices[m] for m in out.format.ordering)
        none = Columns(None, (), out_indices)
        if target.gpu or not out.is_dense or spec.statement.accumulate:
            return none
        if out.order < 2 or out.format.ordering != tuple(range(out.order)):
            return none
        j = lhs.indices[-1]
        if lhs.indices.count(j) != 1:
            return none
        if all(t.is_dense for t in spec.inputs):
            return none  # dense operands only: nothing is gathered, nothing to keep cached
        carriers: dict[str, None] = {}
        gathered = False
        for a in spec.assignment.accesses():
            if a is lhs or j not in a.indices:
                continue
            t = spec.tensor(a.name)
            identity = t.format.ordering == tuple(range(t.order))
            if not (t.is_dense and identity and a.indices[-1] == j and a.indices.count(j) == 1):
                return none
            carriers[a.name] = None
            gathered = gathered or not set(a.indices) <= set(lhs.indices)
        # a panel pays when a carrier is read again and again (indexed by a summed index)
        if not gathered:
            return none
        return Columns(j, tuple(carriers), out_indices, _sliced(spec, tuple(carriers)))

    def slices(self, dims: Mapping[str, int]) -> int:
        """The windows the carriers fall into (`sliced`'s extents' product)."""
        return math.prod(dims[i] for i in self.sliced)

    def _out_elements(self, dims: Mapping[str, int]) -> int:
        return math.prod(dims[i] for i in self.out_indices)

    def width(self, dims: Mapping[str, int], values: Mapping[str, Any]) -> int:
        """Columns per panel for a call with these extents and inputs, or 0 to run whole:
        panels pay when the dense operands along j exceed the caches (each row of the
        sparse operand then streams them from memory; a packed panel stays in cache and has
        no power-of-two stride)."""
        j = self.index
        if j is None:
            return 0
        out = self._out_elements(dims)
        pays = panels_pay(dims[j], self.carriers, values, out, slices=self.slices(dims))
        return panel_columns(dims[j], self.carriers, values) if pays else 0

    def band_tiles(self, dims: Mapping[str, int], values: Mapping[str, Any]) -> int:
        """Register tiles per column band for a call with these extents and inputs, or 0 to
        run each row whole (only kernels that take ``sc_band`` ask)."""
        j = self.index
        if j is None or dims[j] < PANEL_MIN_COLUMNS:
            return 0
        pays = bands_pay(dims[j], self.carriers, values, self._out_elements(dims))
        return BAND_TILES if pays else 0

    def depth_rows(self, dims: Mapping[str, int], values: Mapping[str, Any]) -> int:
        """Coordinates of the reduction per depth block for a call with these extents and
        inputs, or 0 for one block (only kernels that take ``sc_depth`` ask)."""
        j = self.index
        if j is None or dims[j] >= PANEL_MIN_COLUMNS:
            return 0
        return depth_rows(dims[j], self.carriers, values, self._out_elements(dims))


def _sliced(spec: Spec, carriers: tuple[str, ...]) -> tuple[str, ...]:
    """`Columns.sliced` for ``spec``'s ``carriers``: the summed indices they all have that
    each sparse operand indexing them stores in a dense level with only dense levels above
    it, none of them over an output index (the rows' loops then run inside that index's,
    each coordinate a window of the carriers). A sparse operand in a mapped format (bsr,
    nm) slices nothing."""
    lhs = spec.statement.lhs
    accesses = [a for a in spec.assignment.accesses() if a is not lhs]
    held = [a for a in accesses if a.name in carriers]
    found: list[str] = []
    for index in held[0].indices if held else ():
        # a window of every carrier: an index each of them has, summed
        if index in lhs.indices or index in found or any(index not in a.indices for a in held):
            continue
        holders = [b for b in accesses if index in b.indices and not spec.tensor(b.name).is_dense]
        if holders and all(_outer_dense(spec, b, index, lhs.indices) for b in holders):
            found.append(index)
    return tuple(found)


def _outer_dense(spec: Spec, access: Any, index: str, rows: tuple[str, ...]) -> bool:
    """Whether ``access``'s tensor stores ``index`` in a dense level above which every
    level is dense and stores none of the output's indices ``rows`` (whose loops would
    then run outside the window's)."""
    fmt = spec.tensor(access.name).format
    if not isinstance(fmt, Format):
        return False
    for level, mode in zip(fmt.levels, fmt.ordering, strict=True):
        if not isinstance(level, Dense) or access.indices[mode] in rows:
            return False
        if access.indices[mode] == index:
            return True
    return False
