"""An `Executable`: one compiled kernel for one (value dtype, index dtype) pair, and how a
call runs it.

`Executable.run` dispatches a call whose inputs are bound (`sparsec.runtime.inputs`):

- a sparse output: allocated and filled by `sparsec.runtime.sparse_out` (one pass or two
  phases);
- a dense output whose call pays to run in column panels (`sparsec.policy.costs.Columns`):
  each panel packed and run on its own, the panels shared among workers;
- a dense output otherwise: allocated here (aligned, zeroed or copied as the kernel needs)
  and the kernel run once, on the CPU (C, or the CUDA emulation) or on the GPU (CuPy).

It knows the kernel's `Spec`, its `Generated` code and the policy's column analysis; never
the `Kernel` that made it.
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from ..abi import ASSEMBLE_NAME, stage_hints
from ..backends import Generated
from ..base.target import Target
from ..frontend.semirings import semiring
from ..middle.spec import Spec
from ..policy import costs
from ..policy.costs import Columns
from ..tensors.buffers import address, aligned_empty
from ..tensors.halves import HALF, readable, result_dtype, rounded, storage_fill
from ..tensors.tensor import Tensor
from . import device, gpu_sparse, sparse_out
from .args import Source, arguments, slots
from .binding import VALUE_DTYPES, resolve_threads
from .copies import as_2d, packed_copy, panels_fn, scratch_array
from .inputs import Prepared
from .loaded import Loaded, load, status_error
from .sparse_out import SparseOutput

#: the first scratch buffer (`copies.scratch_array`) of a panel's packed operands
PANEL_SCRATCH = 16
#: the most arguments and workers the compiled panel driver takes (its SC_MAX_ARGS and
#: SC_MAX_WORKERS, ``templates/copies.c``)
PANEL_MAX_ARGS, PANEL_MAX_WORKERS = 64, 256
#: called with the seconds each call of the panel driver spent inside the kernel (the
#: kernel runs inside the driver, where no Python clock can reach it: `bench.breakdown`)
KERNEL_CLOCKS: list[Callable[[float], None]] = []


def _fill_bits(dtype: str, out: np.dtype) -> int:
    """The bits of the poisoned output's fill (test mode: NaN, or an integral type's
    poison, as `run_whole` fills) in ``out``'s values, as an int64."""
    fill = np.array([storage_fill(np.nan, dtype)]).astype(out)
    return int(fill.view(f"i{out.itemsize}")[0])


def _int64s(values: list[int]) -> Any:
    """``values`` as a C array of int64."""
    return (ctypes.c_int64 * len(values))(*values)


class Executable:
    """One kernel for one dtype pair. ``poison`` (``SPARSEC_POISON=1``, the tests) fills
    fresh outputs with NaN before each call, so an element the kernel fails to write shows."""

    __slots__ = (
        "loaded",
        "slots",
        "target",
        "output",
        "accumulate",
        "truth_mask",
        "columns",
        "out_identity",
        "sparse",
        "final",
        "rows",
        "poison",
        "_raw",
        "_lock",
    )

    def __init__(
        self, spec: Spec, loaded: Loaded, target: Target, columns: Columns, poison: bool
    ) -> None:
        self.loaded = loaded
        #: the ABI's parameters and where each one's value comes from
        self.slots = slots(loaded.generated.signature)
        #: what the kernel runs on (`sparsec.base.target`)
        self.target = target
        self.output = spec.output
        #: '+=' into a dense output: the kernel adds into a copy of its current value
        self.accumulate = spec.statement.accumulate
        #: '+=' under a boolean semiring: the mask's name and whether it is complemented
        #: ("" for none), and the current value's input (`_computed`, `_kept_outside`)
        self.truth_mask: tuple[str, bool, str] | None = None
        # a sparse '+=' is compiled as C = C_old + E, C_old an input passed as C
        current = next(
            (t.name for t in spec.inputs if t.argument == spec.output.name), spec.output.name
        )
        accumulates = self.accumulate or current != spec.output.name
        if accumulates and semiring(spec.semantics.semiring).boolean:
            self.truth_mask = (spec.pattern, spec.semantics.mask.startswith("~"), current)
        #: the column layouts open to the calls, and the output's indices in level order
        self.columns = columns
        self.out_identity = spec.output.format.ordering == tuple(range(spec.output.order))
        self.sparse = None if spec.output.is_dense else SparseOutput(spec, loaded, self.slots)
        #: a CUDA kernel computes an output the GPU cannot fill row by row into its rowwise
        #: staging output (`Generated.staging`), compacted into this one after
        self.final = None
        #: the staging output's own indices (a vector's row), each of extent 1
        self.rows: dict[str, int] = {}
        staging = loaded.generated.staging
        if staging is not None:
            self.final = spec.output
            self.sparse = SparseOutput(staging, loaded, self.slots)
            self.rows = {i: 1 for i in staging.indices if i not in spec.indices}
        self.poison = poison
        self._raw: Any = None  # target="cuda": CuPy's RawKernel, made at the first launch
        self._lock = threading.Lock()

    @staticmethod
    def build(
        spec: Spec,
        generated: Generated,
        target: Target,
        columns: Columns,
        poison: bool,
        prepared: Prepared | None = None,
    ) -> Executable:
        """Compile (through the on-disk cache) and load ``generated`` for ``target``: for a
        call's inputs ``prepared``, only the register-tile stages its extents need
        (`sparsec.abi.stage_hints`; other extents return STAGES_MISSING), else all of them,
        also where the call runs in column panels (`run`: the kernel sees the panels'
        widths, not the call's)."""
        if (
            prepared is not None
            and generated.tile_extents
            and not columns.width(prepared.dims, prepared.values)
        ):
            dims = prepared.dims
            dim_slots = (s for s in slots(generated.signature) if s.source is Source.DIM)
            extents = {s.param.name: dims[s.of] for s in dim_slots if s.of in dims}
            lines = stage_hints(generated.tile_extents, extents)
            generated = replace(generated, source=lines + generated.source)
        loaded = load(generated, target, sparse_output=not spec.output.is_dense)
        return Executable(spec, loaded, target, columns, poison)

    @property
    def generated(self) -> Generated:
        return self.loaded.generated

    def run(self, prepared: Prepared, threads: int | None) -> Any:
        """The kernel's result for bound inputs: a `Tensor` (sparse output), an array in
        the output's mode order, or a scalar."""
        if self.sparse is not None:
            if self.target.gpu:
                result = self._run_sparse_gpu(prepared)
            else:
                result = sparse_out.run(self.sparse, prepared, threads, self.poison)
            if self.truth_mask is not None and self.truth_mask[0]:
                return self._kept_outside(prepared, result)
            return result
        width = self.columns.width(prepared.dims, prepared.values)
        if width:
            return self.run_panels(prepared, threads, width)
        return self.run_whole(prepared, threads)

    def _level_shape(self, prepared: Prepared) -> tuple[int, ...]:
        return tuple(prepared.dims[i] for i in self.columns.out_indices)

    def _computed(self, prepared: Prepared, xp: Any) -> Any:
        """Where an ``or_and`` ``+=`` computes the output (flat, level order): inside its
        mask (None: everywhere, no mask or a dense ``M``, which stores every element)."""
        assert self.truth_mask is not None
        name, complement, _ = self.truth_mask
        mask = prepared.values.get(name) if name else None
        if not isinstance(mask, Tensor):
            return xp.zeros(1, dtype=bool) if name and complement else None
        stored = np.zeros(mask.shape, dtype=bool)
        stored[tuple(mask.coords()[0])] = True
        stored = np.transpose(stored, self.output.format.ordering).reshape(-1)
        return xp.asarray(~stored if complement else stored)

    def _kept_outside(self, prepared: Prepared, result: Tensor) -> Tensor:
        """A masked ``or_and`` ``+=`` into a sparse output, compiled as ``C = C_old + M*E``:
        outside the mask ``C`` keeps its current value (docs/semantics.md), which the
        kernel read as a truth value (a stored 2 came back 1)."""
        assert self.truth_mask is not None
        name, complement, current = self.truth_mask
        mask, old = prepared.values.get(name), prepared.values[current]
        if not isinstance(old, Tensor) or not old.nnz:
            return result
        coords, vals = result.coords()
        at = np.ravel_multi_index(tuple(coords), result.shape)
        if isinstance(mask, Tensor):
            inside = np.isin(at, np.ravel_multi_index(tuple(mask.coords()[0]), mask.shape))
        else:  # a dense mask stores every element
            inside = np.ones(at.shape, dtype=bool)
        outside = inside if complement else ~inside
        if not outside.any():
            return result
        old_coords, old_vals = old.coords()
        old_at = np.ravel_multi_index(tuple(old_coords), old.shape)
        order = np.argsort(old_at)
        # every entry outside the mask is one of C_old's: nothing else reaches it there
        found = order[np.searchsorted(old_at, at[outside], sorter=order)]
        vals[outside] = old_vals[found]
        return Tensor.from_coo(
            coords,
            vals,
            result.shape,
            result.format,
            dtype=vals.dtype,
            index_dtype=result.index_dtype,
        )

    def run_panels(self, prepared: Prepared, threads: int | None, width: int) -> np.ndarray:
        """The dense output in panels of ``width`` columns of j: each carrier's panel is
        packed contiguous, the kernel runs on it, and its output panel is copied into
        place. With several threads the panels are shared among that many workers (or run
        in sequence on all of them, `policy.costs.panels_in_sequence`), each
        packing, running (on its share of the threads) and placing its own, so the copies
        run in parallel too. Every output element gets the same additions in the same
        order, whichever worker computes it."""
        j = self.columns.index
        assert j is not None
        n = prepared.dims[j]
        out = np.empty(self._level_shape(prepared), dtype=result_dtype(prepared.dtype))
        starts = range(0, n, width)
        total = resolve_threads(threads)
        # in sequence, each panel on all the call's threads, where the host's calibration
        # found it faster (`costs.panels_in_sequence`): the kernel's OpenMP team is the one
        # a torch op just left spinning, where extra workers compete with it for the cores
        workers = 1 if costs.panels_in_sequence() else min(total, len(starts))

        inner = total // workers
        if self._panels_in_c(prepared, out, width, workers, inner):
            return out

        def panel(start: int) -> None:
            cols = min(width, n - start)
            values = dict(prepared.values)
            for number, name in enumerate(self.columns.carriers):
                panel = values[name][..., start : start + cols]
                # scratch numbers of their own: never those a whole run packs into
                values[name] = packed_copy(panel, inner, PANEL_SCRATCH + number)
            part = replace(prepared, values=values, dims={**prepared.dims, j: cols})
            out[..., start : start + cols] = self.run(part, inner)

        if workers == 1:
            for start in starts:
                panel(start)
        else:
            # numpy's copies and the kernel both release the GIL; list() re-raises
            with ThreadPoolExecutor(workers, thread_name_prefix="sparsec-panel") as pool:
                list(pool.map(panel, starts))
        return out

    def _panels_in_c(
        self, prepared: Prepared, out: np.ndarray, width: int, workers: int, inner: int
    ) -> bool:
        """``out`` filled in column panels of ``width`` by the compiled driver (one C call
        for all panels of one width: `copies.panels_fn`), as `run_panels` would fill it in
        Python; False where it cannot (the caller then does): a GPU or emulated target, an
        accumulated or 16-bit output, no packed entry or driver, a carrier that
        is not a 2-D view of 4- or 8-byte values, or panels on workers that would each use
        several threads (the driver's workers run their kernels on one)."""
        gen = self.loaded.generated
        if self.target.gpu or self.target.emulated or self.accumulate:
            return False
        if gen.wide_output or prepared.dtype in HALF or (workers > 1 and inner > 1):
            return False
        driver, fn = panels_fn(), self.loaded.packed_address
        if driver is None or fn is None or not out.flags.c_contiguous:
            return False
        if len(self.slots) > PANEL_MAX_ARGS or workers > PANEL_MAX_WORKERS:
            return False
        j = self.columns.index
        assert j is not None
        n = prepared.dims[j]
        sources = {}
        for name in self.columns.carriers:
            value = prepared.values[name]
            flat = as_2d(value) if isinstance(value, np.ndarray) else None
            if flat is None or flat.itemsize not in (4, 8) or value.dtype.hasobject:
                return False
            if any(st <= 0 or st % flat.itemsize for st in flat.strides):
                return False
            sources[name] = flat
        slot_of = {s.of: at for at, s in enumerate(self.slots) if s.source is Source.INPUT}
        out_slot = next(
            at
            for at, s in enumerate(self.slots)
            if s.source is Source.OUTPUT and s.key == ("vals", -1)
        )
        rows = math.prod(out.shape[:-1])
        full, rest = divmod(n, width)
        spent = ctypes.c_int64()
        for first, cols, count in ((0, width, full), (full * width, rest, 1)):
            if not cols or not count:
                continue
            # each worker's buffers in the calling thread's scratch (kept from call to call)
            numbers = iter(range(PANEL_SCRATCH, PANEL_SCRATCH + workers * (len(sources) + 1)))
            panels = {
                name: [
                    scratch_array(next(numbers), (*prepared.values[name].shape[:-1], cols), v.dtype)
                    for _ in range(workers)
                ]
                for name, v in sources.items()
            }
            outs = [scratch_array(next(numbers), (rows, cols), out.dtype) for _ in range(workers)]
            values = {**prepared.values, **{name: bufs[0] for name, bufs in panels.items()}}
            dims = {**prepared.dims, j: cols}
            args = arguments(
                self.slots,
                values,
                dims,
                {("vals", -1): outs[0]},
                inner,
                self.columns.band_tiles(dims, values),
                self.columns.depth_rows(dims, values),
            )
            carriers = [
                v
                for name, flat in sources.items()
                for v in (slot_of[name], address(flat), flat.shape[0],
                          flat.strides[0] // flat.itemsize, flat.strides[1] // flat.itemsize,
                          flat.itemsize)
            ]  # fmt: skip
            buffers = [
                address(b)
                for w in range(workers)
                for b in (*(bufs[w] for bufs in panels.values()), outs[w])
            ]
            status = driver(
                fn,
                _int64s(args),
                len(args),
                _int64s(carriers),
                len(sources),
                out_slot,
                address(out),
                rows,
                n,
                out.itemsize,
                first,
                cols,
                count,
                _int64s(buffers),
                workers,
                inner,
                int(self.poison),
                _fill_bits(prepared.dtype, out.dtype) if self.poison else 0,
                ctypes.byref(spent),
            )
            for hook in KERNEL_CLOCKS:
                hook(spent.value * 1e-9)
            if status != 0:
                raise status_error(status, gen)
        return True

    def run_whole(self, prepared: Prepared, threads: int | None) -> Any:
        """A dense output in one run of the kernel."""
        gen = self.loaded.generated
        dtype = prepared.dtype
        wide = gen.wide_output  # a 16-bit kernel adding into float32 values
        np_dtype = np.dtype(np.float32) if wide else VALUE_DTYPES[dtype]
        level_shape = self._level_shape(prepared)
        size = math.prod(level_shape)
        # the output lives where the inputs do: in GPU memory when any input does
        xp: Any = device.cupy_device() if prepared.device else np
        kept: Any = None  # or_and's +=: the current value, kept outside the mask
        computed: Any = None
        if self.accumulate:
            # the current value, already in level order: the kernel adds into a copy
            current = prepared.values[self.output.name]
            out = xp.empty(size, dtype=np_dtype)
            out[:size] = readable(xp.asarray(current), dtype).astype(np_dtype).reshape(-1)
            if self.truth_mask is not None:
                # or_and: `y or E` is a truth value wherever the output is computed, also
                # where no term reaches (docs/semantics.md: as a sparse output's C_old + E)
                kept = out[:size].copy()
                computed = self._computed(prepared, xp)
                truth = (kept != 0).astype(np_dtype)
                out[:size] = truth if computed is None else xp.where(computed, truth, kept)
        elif gen.launch is not None and gen.launch.zero_before:
            # CUDA kernels only add (a semiring's add: from its identity)
            fill = gen.launch.fill if wide else storage_fill(gen.launch.fill, dtype)
            out = xp.full(size, fill, dtype=np_dtype)
        else:
            out = aligned_empty(size, np.dtype(np_dtype)) if xp is np else xp.empty(size, np_dtype)
            if self.poison:
                # test mode: an element the kernel fails to write shows
                out.fill(np.nan if wide else storage_fill(np.nan, dtype))
        if self.target.gpu:
            out = self._launch_gpu(prepared, out)
        else:
            values, dims = prepared.values, prepared.dims
            j = self.columns.index
            if j is not None:
                # the panel operands, which the binder keeps at their strides
                # (`Binder._carriers`), C-ordered, and on a cache line where that pays
                carriers = self.columns.carriers
                packed = {n for n in carriers if not values[n].flags.c_contiguous}
                workers = resolve_threads(threads)
                shared = gen.shared_rows
                packed.update(costs.misaligned(dims[j], carriers, values, shared, workers))
                # each in the thread's scratch: they live for this kernel call only
                copied = {
                    n: packed_copy(values[n], workers, number)
                    for number, n in enumerate(sorted(packed))
                }
                values = {**values, **copied}
            args = arguments(
                self.slots,
                values,
                dims,
                {("vals", -1): out},
                resolve_threads(threads),
                self.columns.band_tiles(dims, values),
                self.columns.depth_rows(dims, values),
            )
            status = self.loaded.fn(*args)
            if status != 0:
                raise status_error(status, gen)
        if computed is not None:
            # outside the mask y keeps its value: the threads' copies are or-ed into every
            # element, which makes a kept 2 a 1
            out[:size] = xp.where(computed, out[:size], kept)
        out = rounded(out[:size], dtype) if wide else readable(out[:size], dtype)
        if self.output.order == 0:
            return result_dtype(dtype).type(float(out[0]) if prepared.device else out[0])
        if self.out_identity:
            return out.reshape(level_shape)
        return out.reshape(level_shape).transpose(tuple(np.argsort(self.output.format.ordering)))

    def _launch_gpu(self, prepared: Prepared, out: Any) -> Any:
        """A CUDA kernel into ``out``: on the CPU through the emulation, or on the device
        through CuPy (a host ``out`` comes back as a copy; a device one is filled)."""
        if self.target.device:
            launch, out_dev = self._stage(prepared, out)
            launch()
            return out_dev if prepared.device else device.cupy_device().asnumpy(out_dev)
        gen = self.loaded.generated
        device.emulate(self.loaded.fn, gen, self.slots, prepared.values, prepared.dims, out)
        return out

    def _run_sparse_gpu(self, prepared: Prepared) -> Any:
        """A rowwise sparse output: count, prefix-sum and fill (`gpu_sparse`), on the device
        (CuPy) or through the emulation (numpy)."""
        assert self.sparse is not None
        gen = self.loaded.generated
        emulated = self.target.emulated
        if self.rows:  # a staged vector's row
            prepared = replace(prepared, dims={**prepared.dims, **self.rows})
        if emulated:
            xp: Any = np
            kernels = {"assemble": self.loaded.assemble, "fill": self.loaded.fn}
        else:
            xp = device.cupy_device()
            with self._lock:
                if self._raw is None:
                    self._raw = {
                        "assemble": device.raw_kernel(gen.source, ASSEMBLE_NAME),
                        "fill": device.raw_kernel(gen.source),
                    }
            kernels = self._raw

        def phase(which: str, outputs: sparse_out.Arrays) -> None:
            values, dims = prepared.values, prepared.dims
            device.run_phase(kernels[which], gen, self.slots, values, dims, outputs, emulated)

        workspace = None
        if gen.launch.scratch:
            values, dims = prepared.values, prepared.dims
            fits = device.dense_rows_fit(gen, self.slots, values, dims, emulated)
            hashed = not fits if device.HASH_WORKSPACE is None else device.HASH_WORKSPACE
            workspace = (hashed, gen.launch.fill, device.workspace_budget(emulated))
        return gpu_sparse.run(self.sparse, self.final, prepared, phase, xp, self.poison, workspace)

    def _stage(self, prepared: Prepared, out: Any) -> tuple[Callable[[], None], Any]:
        """The arguments in GPU memory and a launch over them (`device.stage`)."""
        gen = self.loaded.generated
        with self._lock:
            if self._raw is None:
                self._raw = device.raw_kernel(gen.source)
        return device.stage(self._raw, gen, self.slots, prepared.values, prepared.dims, out)

    def device_launch(self, prepared: Prepared) -> tuple[Callable[[], None], Any]:
        """``(launch, out)`` for timing on a GPU: the inputs staged once; ``launch()`` runs
        the kernel on them into the flat device array ``out``, zeroing it first when the
        kernel only adds into it (atomics), so every launch computes the whole result."""
        size = math.prod(self._level_shape(prepared))
        gen = self.loaded.generated
        kind = np.float32 if gen.wide_output else VALUE_DTYPES[prepared.dtype]
        out = device.cupy_device().zeros(size, dtype=kind)
        kernel_only, out_dev = self._stage(prepared, out)
        if not self.loaded.generated.launch.zero_before:
            return kernel_only, out_dev

        def launch() -> None:
            out_dev.fill(self.loaded.generated.launch.fill)
            kernel_only()

        return launch, out_dev
