"""Running a kernel whose output is sparse: the output's levels are allocated here and the
kernel fills them (TACO's assemble / compute split).

Two ways (`run` picks):

- one pass (`single_pass`): the kernel appends into arrays of a capacity proven from the
  inputs (`Generated.bound`, `entry_bound`), then the arrays are cut to the sizes it
  reached. It stops with CAPACITY_EXCEEDED rather than write past a capacity, and the two
  phases run instead. Taken when the kernel appends serially anyway or runs on one thread,
  and the capacity stays under `sparsec.policy.costs.SINGLE_PASS_ENTRIES`, where the
  kernel has the function (a CSR-like output whose count is light has none);
- one pass in chunks of rows (`chunked_pass`), for CSR-like outputs whose rows can be
  cut (`Generated.chunked`), on any number of threads: each thread's chunk of rows
  appends into its own region of that capacity, then the chunks are moved together
  (`sparsec.lower.chunks`);
- two phases (`two_phase`): the symbolic phase (``sparsec_assemble``) counts each output
  level's positions (a rowwise layout: each row's, then prefix-summed into its pos), the
  levels are allocated exactly, and the compute phase fills them (rows in parallel).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import abi
from ..abi import BLOCK_SLACK, LAST_LEVEL_SLACK, chunk_table
from ..base.errors import DTypeError, SparsecError
from ..middle.spec import Spec
from ..policy import costs
from ..tensors.formats import Singleton
from ..tensors.halves import HALF, from_storage, storage_fill, to_storage
from ..tensors.layout import OutputLayout
from ..tensors.tensor import LevelStorage, Tensor
from .args import Slot, arguments
from .binding import INDEX_DTYPES, VALUE_DTYPES, resolve_threads
from .inputs import Prepared
from .loaded import Loaded, status_error

_INT32_MAX = 2**31 - 1
#: an output's arrays by (field, level): ("pos", k), ("crd", k), ("vals", -1), ("sizes", -1)
Arrays = dict[tuple[str, int], np.ndarray]


class SparseOutput:
    """One sparse-output kernel for one dtype pair: its entry points, its output's levels
    and its entry bound (`Generated.bound`)."""

    __slots__ = ("loaded", "slots", "output", "statement", "division", "out_indices", "layout")

    def __init__(self, spec: Spec, loaded: Loaded, slots: tuple[Slot, ...]) -> None:
        self.loaded = loaded
        self.slots = slots
        self.output = spec.output
        self.statement = spec.statement
        self.division = spec.semantics.division
        #: the output's indices in level order
        self.out_indices = tuple(spec.statement.lhs.indices[m] for m in spec.output.format.ordering)
        self.layout = OutputLayout.of(spec.output.format, spec.output.name)

    def shape(self, prepared: Prepared) -> tuple[int, ...]:
        return tuple(prepared.dims[i] for i in self.statement.lhs.indices)

    def extent(self, prepared: Prepared, level: int) -> int:
        return prepared.dims[self.out_indices[level]]

    def block_slack(self, prepared: Prepared) -> int:
        """Spare values past the last dense block below the output's last sparse level."""
        blocks = self.layout.block
        if not blocks:
            return 0
        return BLOCK_SLACK * math.prod(self.extent(prepared, k) for k in blocks)

    @property
    def bound(self) -> Any:
        """The output's entry bound (`Generated.bound`: `entry_bound` counts it)."""
        return self.loaded.generated.bound

    def call(self, fn: Any, prepared: Prepared, outputs: Arrays, threads: int) -> int:
        return fn(*arguments(self.slots, prepared.values, prepared.dims, outputs, threads))

    def check(self, status: int) -> None:
        """A sparse output's kernel status read as a dense output's is (a broken `bound`
        is a ShapeError here too)."""
        if status != 0:
            raise status_error(status, self.loaded.generated)


def run(out: SparseOutput, prepared: Prepared, threads: int | None, poison: bool) -> Tensor:
    """One pass into arrays of a proven capacity when the kernel appends serially anyway
    or runs on one thread; else two: count each output level's positions, allocate
    exactly, then fill (rows in parallel). ``poison`` (tests) fills fresh arrays with NaN
    and -1 and makes a capacity bound found too small an error."""
    nthreads = resolve_threads(threads)
    chunked = out.loaded.generated.chunked
    if out.loaded.append is not None and (nthreads == 1 or not out.layout.rowwise or chunked):
        done = None
        if chunked and min(nthreads, out.extent(prepared, 0)) > 1:
            # the chunks' own bounds make the whole's (the whole's alone would cost as
            # much again: SpGEMM's is a bincount over an operand's entries)
            done = chunked_pass(out, prepared, None, nthreads, poison)
        else:
            bound = entry_bound(out.bound, prepared.values, prepared.dims, out.division)
            if bound <= costs.SINGLE_PASS_ENTRIES:
                if chunked:
                    done = chunked_pass(out, prepared, bound, nthreads, poison)
                else:
                    done = single_pass(out, prepared, bound, poison)
        if done is not None:
            return done
    return two_phase(out, prepared, nthreads, poison)


def entry_bound(
    bound: Any,
    values: Mapping[str, Any],
    dims: Mapping[str, int],
    division: str = "sparse",
    rows: tuple[str, int, int] | None = None,
) -> int:
    """At most how many entries the output gets for these inputs (within ``rows``: an
    output index and a range of it), by its kernel's entry bound ``bound``."""
    return int(bound.count(values, dims, division, rows))


def chunked_pass(
    out: SparseOutput, prepared: Prepared, bound: int | None, nthreads: int, poison: bool
) -> Tensor | None:
    """The single pass in chunks of consecutive rows, one per thread, each appending into
    its own region, of room for its own rows' entries (`entry_bound` on those rows; see
    `sparsec.lower.chunks`), then the chunks moved behind each other here. ``bound``: the
    whole output's (`run` gives it for one chunk), or None: each chunk bounds its own
    rows, and their sum stands for the whole's. None
    when the output is too large for one pass (`costs.SINGLE_PASS_ENTRIES`), the regions'
    positions would not fit the index type, the capacities are too large
    (`costs.CHUNKED_ENTRIES`), or a bound was too small (the two phases count exactly
    instead)."""
    last = out.layout.last
    rows = out.extent(prepared, 0)
    size = out.extent(prepared, last)
    chunks = max(1, min(nthreads, rows))
    if bound is not None and min(rows * size, bound) + LAST_LEVEL_SLACK * size > (
        costs.SINGLE_PASS_ENTRIES
    ):
        return None
    levels_n = len(out.output.format.levels)
    row_at, region_at, end_at, length = chunk_table(levels_n, chunks)
    table = np.zeros(length, dtype=np.int64)
    table[levels_n] = chunks
    starts = table[row_at : row_at + chunks + 1]
    starts[:] = _row_starts(out, prepared, rows, chunks)
    regions = table[region_at : region_at + chunks + 1]
    row = out.out_indices[0]
    owns = []  # each chunk's bound
    for c in range(chunks):  # a chunk's room, and the up-front checks of its last loops
        lo, hi = int(starts[c]), int(starts[c + 1])
        own = bound
        if own is None:
            args = (out.bound, prepared.values, prepared.dims, out.division, (row, lo, hi))
            own = entry_bound(*args)
        owns.append(own)
        regions[c + 1] = regions[c] + min((hi - lo) * size, own) + LAST_LEVEL_SLACK * size
    reserved = int(regions[chunks])
    summed = reserved - (chunks - 1) * LAST_LEVEL_SLACK * size  # as one chunk's, above
    if bound is None and summed > costs.SINGLE_PASS_ENTRIES:
        return None
    limit = _INT32_MAX if prepared.index_dtype == "int32" else 2**62
    if max(reserved, size, rows) > limit or reserved > costs.CHUNKED_ENTRIES:
        return None
    room = np.zeros(max(1, out.output.order), dtype=np.int64)
    room[last] = reserved
    arrays, levels, vals = allocate(out, prepared, room, {("sizes", -1): table}, poison)
    out.check(out.call(out.loaded.append, prepared, arrays, nthreads))
    ends = table[end_at : end_at + chunks]
    counts = ends - regions[:chunks]
    total = int(counts.sum())
    if (ends < 0).any():  # a chunk out of room
        if poison:
            short = owns[int(np.argmax(ends < 0))]
            raise SparsecError(f"internal: the capacity bound {short} was too small")
        return None
    pos, crd = levels[last].pos, levels[last].crd
    assert pos is not None and crd is not None
    pos[0] = 0
    to = int(counts[0])
    # behind the chunks before it: leftwards, over at most its own region's start (numpy
    # copies an overlapping slice correctly) and never into the next region
    for c in range(1, chunks):
        n, at = int(counts[c]), int(regions[c])
        if n:
            crd[to : to + n] = crd[at : at + n]
            vals[to : to + n] = vals[at : at + n]
        pos[starts[c] + 1 : starts[c + 1] + 1] -= at - to
        to += n
    levels[last] = LevelStorage(pos, _cut(crd, total))
    index_dtype = np.dtype(INDEX_DTYPES[prepared.index_dtype])
    wide = out.loaded.generated.wide_output
    readable = readable_vals(_cut(vals, total), prepared.dtype, wide)
    return Tensor(out.shape(prepared), out.output.format, tuple(levels), readable, index_dtype)


def _row_starts(out: SparseOutput, prepared: Prepared, rows: int, chunks: int) -> np.ndarray:
    """The first row of each chunk (and ``rows``): chunks of about equal work, a row
    counting one plus its entries in every input stored by the same rows (CSR over the
    output's row index); equal row counts where no input is."""
    row = out.out_indices[0]
    pos = []
    for a in out.bound.operands:
        t = prepared.values.get(a.name)
        if not isinstance(t, Tensor) or len(t.levels) < 2:
            continue
        first = t.format.levels[0]
        if first.locate and a.indices[t.format.ordering[0]] == row:
            p = t.levels[1].pos
            if p is not None and len(p) == rows + 1:
                pos.append(p)
    starts = np.zeros(chunks + 1, dtype=np.int64)
    starts[chunks] = rows
    total = rows + sum(int(p[rows]) for p in pos)
    for c in range(1, chunks):
        target = total * c // chunks
        lo, hi = starts[c - 1], rows  # the first row whose start reaches the target
        while lo < hi:
            mid = (lo + hi) // 2
            if mid + sum(int(p[mid]) for p in pos) < target:
                lo = mid + 1
            else:
                hi = mid
        starts[c] = lo
    return starts


def single_pass(out: SparseOutput, prepared: Prepared, bound: int, poison: bool) -> Tensor | None:
    """Append into capacities from `entry_bound` (each unique level: at most its parents
    times its extent, and at most ``bound``), then cut the arrays to the sizes the kernel
    reached. None when an index would not fit the kernel's index type."""
    out_t = out.output
    sizes = np.zeros(max(1, out_t.order), dtype=np.int64)
    parents = 1
    for k, level in enumerate(out_t.format.levels):
        size = out.extent(prepared, k)
        if level.locate:
            parents *= size
        elif isinstance(level, Singleton):
            sizes[k] = parents  # one coordinate per parent position
        elif level.unique:
            parents = sizes[k] = min(parents * size, bound)
            if k == out.layout.last and out.layout.one_entry_per_step:
                # room for the up-front checks of the last level's loops
                parents = sizes[k] = parents + LAST_LEVEL_SLACK * size
        else:  # COO's first level: one position per entry, repeated coordinates
            parents = sizes[k] = bound
    if parents > costs.SINGLE_PASS_ENTRIES:
        return None  # a loose bound, or a huge extent as slack: count exactly instead
    largest = max(parents, *prepared.dims.values(), 0)
    if prepared.index_dtype == "int32" and largest > _INT32_MAX:
        return None  # the two phases count exactly, and say so if it does not fit
    arrays, levels, vals = allocate(out, prepared, sizes, {("sizes", -1): sizes}, poison)
    status = out.call(out.loaded.append, prepared, arrays, 1)
    if status == abi.CAPACITY_EXCEEDED:
        if poison:  # the tests: a bound that was too small is a bug to see
            raise SparsecError(f"internal: the capacity bound {bound} was too small")
        return None
    out.check(status)
    # the sizes reached, level by level, from the pos arrays the kernel wrote
    parents = 1
    cut: list[LevelStorage] = []
    for k, (level, st) in enumerate(zip(out_t.format.levels, levels, strict=True)):
        pos = crd = None
        if level.locate:
            parents *= out.extent(prepared, k)
        elif st.pos is not None:
            pos = _cut(st.pos, parents + 1)
            parents = int(pos[parents])
        if st.crd is not None:
            crd = _cut(st.crd, parents)
        cut.append(LevelStorage(pos, crd))
    index_dtype = np.dtype(INDEX_DTYPES[prepared.index_dtype])
    vals = readable_vals(_cut(vals, parents), prepared.dtype, out.loaded.generated.wide_output)
    return Tensor(out.shape(prepared), out_t.format, tuple(cut), vals, index_dtype)


def two_phase(out: SparseOutput, prepared: Prepared, nthreads: int, poison: bool) -> Tensor:
    """Count, allocate exactly, fill."""
    out_t, layout = out.output, out.layout
    sizes = np.zeros(max(1, out_t.order), dtype=np.int64)
    index_dtype = INDEX_DTYPES[prepared.index_dtype]
    counted: Arrays = {("sizes", -1): sizes}
    if layout.rowwise:
        # each row counts its entries into pos[p + 1]; the prefix sum makes them offsets
        rows = math.prod(out.extent(prepared, k) for k in range(layout.last))
        counted[("pos", layout.last)] = np.zeros(rows + 1, dtype=index_dtype)
    out.check(out.call(out.loaded.assemble, prepared, counted, nthreads))
    arrays: Arrays = {("sizes", -1): sizes}
    if layout.rowwise:
        row_pos = counted[("pos", layout.last)]
        total = int(row_pos.sum(dtype=np.int64))
        if prepared.index_dtype == "int32" and total > _INT32_MAX:
            raise DTypeError(
                f"output {out_t.name!r} has {total} entries, more than int32 "
                f"indices hold; use index_dtype='int64'"
            )
        np.cumsum(row_pos, out=row_pos)  # in place: the total fits the index dtype
        sizes[layout.last] = total
        arrays[("pos", layout.last)] = row_pos
    arrays, levels, vals = allocate(out, prepared, sizes, arrays, poison)
    out.check(out.call(out.loaded.fn, prepared, arrays, nthreads))
    used = len(vals) - out.block_slack(prepared)
    return Tensor(
        out.shape(prepared),
        out_t.format,
        tuple(levels),
        readable_vals(vals[:used], prepared.dtype, out.loaded.generated.wide_output),
        np.dtype(index_dtype),
    )


def allocate(
    out: SparseOutput, prepared: Prepared, sizes: np.ndarray, arrays: Arrays, poison: bool
) -> tuple[Arrays, list[LevelStorage], np.ndarray]:
    """The output's arrays for ``sizes[k]`` positions at each sparse level ``k`` (the
    given ``arrays``, such as a prefix-summed rowwise pos, are kept)."""
    out_t = out.output
    index_dtype = INDEX_DTYPES[prepared.index_dtype]
    levels = []
    parents = 1
    for k, level in enumerate(out_t.format.levels):
        size = out.extent(prepared, k)
        count = parents * size if level.locate else int(sizes[k])
        if prepared.index_dtype == "int32" and max(count, size, parents) > _INT32_MAX:
            raise DTypeError(
                f"output {out_t.name!r} needs {max(count, size, parents)} positions at "
                f"level {k + 1}, more than int32 indices hold; use index_dtype='int64'"
            )
        pos: np.ndarray | None = None
        crd: np.ndarray | None = None
        if "pos" in level.arrays:
            if ("pos", k) not in arrays:  # a rowwise pos already holds the offsets
                arrays[("pos", k)] = np.empty(parents + 1, dtype=index_dtype)
            pos = arrays[("pos", k)]
        if "crd" in level.arrays:
            crd = arrays[("crd", k)] = np.empty(count, dtype=index_dtype)
        levels.append(LevelStorage(pos, crd))
        parents = count
    slack = out.block_slack(prepared)
    wide = out.loaded.generated.wide_output  # 16-bit values added into as float32
    kind = np.float32 if wide else VALUE_DTYPES[prepared.dtype]
    vals = arrays[("vals", -1)] = np.empty(parents + slack, dtype=kind)
    if poison:
        vals.fill(np.nan if wide else storage_fill(np.nan, prepared.dtype))
        for key, arr in arrays.items():
            if key[0] == "crd" or (key[0] == "pos" and not out.layout.rowwise):
                arr.fill(-1)
    return arrays, levels, vals


def _cut(array: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` elements: a view when they are most of ``array``, else a copy (so a
    loose capacity does not stay allocated behind a small result). Never shrunk in place:
    glibc shrinks a large block by unmapping its tail, lowers its threshold for mapping
    fresh blocks to the smaller size, and so maps every later call's capacity anew, whose
    pages then fault in as the kernel writes them (a sparse add's output, 400k entries:
    ~790 faults a call, half its time)."""
    return array[:n] if 2 * n >= len(array) else array[:n].copy()


def readable_vals(vals: np.ndarray, dtype: str, wide: bool) -> np.ndarray:
    """A sparse result's values as a `Tensor` holds them: 16-bit results as float32 (exact;
    a `Tensor` holds float32 or float64 values), ``wide`` ones (float32 sums) rounded."""
    if dtype not in HALF:
        return vals
    return from_storage(to_storage(vals, dtype) if wide else vals, dtype)
