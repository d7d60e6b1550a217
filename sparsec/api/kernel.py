"""The user-facing kernel: ``sparsec.kernel(expr, formats) -> Kernel``; ``Kernel(**inputs)``.

A `Kernel` is specialised lazily per (value dtype, index dtype): the first call with
float32 CSR inputs generates, compiles (through the on-disk cache) and loads one C
function; later calls only validate and pack arguments.

Every input is validated before a pointer reaches C: names (missing / extra), types,
orders, dtypes, agreement of every index variable's extent, and, for sparse inputs,
the storage invariants (done once, when the `Tensor` is built; Tensors are immutable).
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..abi import BOUND_VIOLATED, CAPACITY_EXCEEDED, OUT_OF_MEMORY, Param
from ..backends import Generated, generate
from ..backends.cuda import generate_cuda
from ..errors import (
    DTypeError,
    InputError,
    NotationError,
    ScheduleError,
    ShapeError,
    SparsecError,
)
from ..frontend.parser import parse_expression
from ..lower.assemble import (
    BLOCK_SLACK,
    LAST_LEVEL_SLACK,
)
from ..middle.bound import entry_bound
from ..middle.schedule import Command, parse_commands
from ..middle.spec import FormatsArg, Spec, TensorVar, make_spec
from ..policy.machine import Machine, machine
from ..runtime import build as runtime
from ..runtime import gpu
from ..runtime.binding import (
    INDEX_DTYPES,
    INT64,
    MAX_THREADS,
    VALUE_DTYPES,
    common_dtype,
    common_index_dtype,
    convert_input,
    is_torch,
    resolve_threads,
    use_threads,  # noqa: F401 - called by the fast path's generated source
    widen,
)
from ..tensors.buffers import ALIGN_FROM_BYTES, address, aligned_empty
from ..tensors.formats import Format, Singleton, canonical
from ..tensors.layout import OutputLayout
from ..tensors.tensor import LevelStorage, Tensor
from . import autotune, footprint

#: "c": OpenMP C; "cuda": CUDA through CuPy; "cuda-emulated": the CUDA kernel on the CPU
TARGETS = ("c", "cuda", "cuda-emulated")
#: keyword options of `Kernel.__call__` and `Kernel.check`, so not usable as tensor names
RESERVED_INPUT_NAMES = frozenset({"threads"})
DEFAULT_EXTENTS = (23, 19, 17, 13, 11, 7)
_VALUE_CTYPES = {"float32": ctypes.c_float, "float64": ctypes.c_double}


@dataclass(frozen=True, slots=True)
class _Compiled:
    generated: Generated
    fn: Any
    #: the symbolic (counting) phase of a sparse output, else None
    assemble: Any
    #: (field, tensor, level, index) per ABI parameter, in order
    plan: tuple[tuple[str, str, int, str], ...]
    #: the single-pass kernel of a sparse output (may be ``fn`` itself), else None
    append: Any = None
    #: ``sparsec_kernel_packed``, the kernel taking its arguments as one array of int64
    #: (a bytes object), where the C kernel has it (no scalar value parameter), else None
    packed: Any = None


@dataclass(frozen=True, slots=True)
class CheckResult:
    """Outcome of `Kernel.check`: the largest absolute error against dense torch."""

    max_abs_error: float
    dtype: str

    def __str__(self) -> str:
        return f"ok: matches dense torch (max abs error {self.max_abs_error:.3g}, {self.dtype})"


def _dtype_name(dt: Any, table: Mapping[str, Any], what: str) -> str | None:
    """The name in ``table`` of a dtype given as a name, numpy dtype or type, or torch dtype."""
    if dt is None:
        return None
    use = f"use {' or '.join(repr(n) for n in table)}"
    if isinstance(dt, str):
        try:
            name = np.dtype(dt).name  # 'f8', 'double', 'float' -> float64
        except TypeError:
            name = dt
    elif type(dt).__module__ == "torch" and str(dt).startswith("torch."):
        name = str(dt).removeprefix("torch.")  # torch.float32 -> float32
    else:
        try:
            name = np.dtype(dt).name
        except (TypeError, ValueError):
            raise DTypeError(f"{what} {dt!r} is not a dtype; {use}") from None
    if name not in table:
        raise DTypeError(f"{what} {name!r} is not supported; {use}")
    return name


class Kernel:
    """A compiled tensor-algebra kernel for one expression and one set of formats."""

    def __init__(
        self,
        expr: str,
        formats: FormatsArg = None,
        *,
        target: str = "c",
        schedule: Any = None,
        dtype: Any = None,
        index_dtype: Any = None,
    ) -> None:
        if not isinstance(expr, str):
            raise InputError(f"expression must be a string, not {type(expr).__name__}")
        if target not in TARGETS:
            raise SparsecError(
                f"unknown target {target!r}; supported targets: {', '.join(TARGETS)}"
            )
        self.expression = expr
        self.target = target
        self.assignment = parse_expression(expr)
        for access in self.assignment.accesses():
            if access.name in RESERVED_INPUT_NAMES:
                raise NotationError(
                    f"{access.name!r} is reserved: kernel calls take `{access.name}=` as an "
                    "option, so a tensor cannot be passed under that name; rename it",
                    source=expr,
                    span=access.span,
                )
        try:
            self.spec: Spec = make_spec(self.assignment, formats)
        except SparsecError as err:
            raise err.with_source(expr) from None
        self.parallel, self.commands = _schedule(schedule)
        self._schedule_arg = schedule  # what a pickle or copy rebuilds the kernel from
        #: schedule="auto": candidates are timed on the first call of each input kind
        self.auto = schedule == "auto"
        if self.auto and target != "c":
            raise ScheduleError("schedule='auto' tunes CPU schedules; give a CUDA schedule")
        self._tuned: dict[str, dict[str, Any]] = {}
        self._last_tuned: dict[str, Any] | None = None
        self._variants: dict[str | None, Kernel] = {}
        if target != "c" and schedule == "serial":
            raise ScheduleError(
                "schedule 'serial' is for the C target; CUDA kernels map loops to GPU units"
            )
        self._generated: dict[tuple[str, str], Generated] = {}
        self._raw_kernels: dict[str, Any] = {}
        self.dtype = _dtype_name(dtype, VALUE_DTYPES, "value dtype")
        self.index_dtype = _dtype_name(index_dtype, INDEX_DTYPES, "index dtype")
        if self.commands or target != "c":
            self.generated()  # a schedule (or GPU mapping) is checked now, not at the first call
        self._compiled: dict[tuple[str, str], _Compiled] = {}
        self._lock = threading.Lock()
        #: SPARSEC_POISON=1 fills fresh outputs with NaN before each call (used by the tests)
        self._poison = os.environ.get("SPARSEC_POISON") == "1"
        self._fast: _FastPath | None = None
        spec = self.spec
        self._wanted = spec.inputs + ((spec.output,) if spec.statement.accumulate else ())
        #: the keywords a call passes (a sparse output's current value for '+=' comes as
        #: the output's name, `TensorVar.argument`)
        self._names = frozenset(t.argument for t in self._wanted)
        self._renamed = any(t.argument != t.name for t in self._wanted)
        # (tensor, axis of the converted value, index) for every access of every input (a
        # tensor used twice, as in A(k,i)*A(k,j), ties both index lists to its shape);
        # dense values are kept in level order
        wanted = {t.name: t for t in self._wanted}
        self._modes = tuple(
            dict.fromkeys(
                (a.name, t.format.level_of_mode(mode) if t.is_dense else mode, index)
                for a in spec.assignment.accesses()
                if (t := wanted.get(a.name)) is not None
                and (a is not spec.assignment.lhs or a.name in self._names)
                for mode, index in enumerate(a.indices)
            )
        )
        out = spec.output
        self._out_level_indices = tuple(spec.statement.lhs.indices[m] for m in out.format.ordering)
        self._out_identity = out.format.ordering == tuple(range(out.order))
        self._panel_index, self._panel_carriers = self._column_panels()

    def _column_panels(self) -> tuple[str | None, tuple[str, ...]]:
        """(j, the dense inputs indexed by j) when the output's columns can be computed in
        independent panels: j is the dense output's last index, not summed, and the last
        mode of every (dense, identity-ordered) operand it indexes; no sparse operand uses
        it; and some such operand is also indexed by a summed index (SpMM's X(k,j)), so it
        is read again and again. Else (None, ())."""
        spec, out = self.spec, self.spec.output
        lhs = spec.statement.lhs
        if self.target != "c" or not out.is_dense or spec.statement.accumulate:
            return None, ()
        if out.order < 2 or not self._out_identity:
            return None, ()
        j = lhs.indices[-1]
        if lhs.indices.count(j) != 1:
            return None, ()
        if all(t.is_dense for t in spec.inputs):
            return None, ()  # dense operands only: nothing is gathered, nothing to keep cached
        carriers: dict[str, None] = {}
        gathered = False
        for a in self.assignment.accesses():
            if a is lhs or j not in a.indices:
                continue
            t = spec.tensor(a.name)
            identity = t.format.ordering == tuple(range(t.order))
            if not (t.is_dense and identity and a.indices[-1] == j and a.indices.count(j) == 1):
                return None, ()
            carriers[a.name] = None
            gathered = gathered or not set(a.indices) <= set(lhs.indices)
        # a panel pays when a carrier is read again and again (indexed by a summed index)
        return (j, tuple(carriers)) if gathered else (None, ())

    def _panel_width(self, prepared: _Prepared) -> int:
        """Columns per panel for this call, or 0 to run whole: panels pay when the dense
        operands along j exceed the caches (each row of the sparse operand then streams
        them from memory; a packed panel stays in cache and has no power-of-two stride)."""
        j = self._panel_index
        if j is None:
            return 0
        out_elements = math.prod(prepared.dims[i] for i in self._out_level_indices)
        pays = _panels_pay(prepared.dims[j], self._panel_carriers, prepared.values, out_elements)
        return PANEL_COLUMNS if pays else 0

    def _band_tiles(self, dims: Mapping[str, int], values: Mapping[str, Any]) -> int:
        """Register tiles per column band for a call with these extents and inputs, or 0 to
        run each row whole (`sparsec.passes.bands`; only kernels that take ``sc_band`` ask)."""
        j = self._panel_index
        if j is None or dims[j] < PANEL_MIN_COLUMNS:
            return 0
        out_elements = math.prod(dims[i] for i in self._out_level_indices)
        return BAND_TILES if _bands_pay(dims[j], self._panel_carriers, values, out_elements) else 0

    def _depth_rows(self, dims: Mapping[str, int], values: Mapping[str, Any]) -> int:
        """Coordinates of the reduction per depth block for a call with these extents and
        inputs, or 0 for one block (`sparsec.passes.bands`; only kernels that take ``sc_depth``
        ask)."""
        j = self._panel_index
        if j is None or dims[j] >= PANEL_MIN_COLUMNS:
            return 0
        out_elements = math.prod(dims[i] for i in self._out_level_indices)
        return _depth_rows(dims[j], self._panel_carriers, values, out_elements)

    def _run_panels(
        self, compiled: _Compiled, prepared: _Prepared, threads: int | None, width: int
    ) -> np.ndarray:
        """The dense output in panels of ``width`` columns of j: each carrier's panel is
        packed contiguous, the kernel runs on it, and its output panel is copied into
        place. With several threads the panels are shared among that many workers, each
        packing, running (on its share of the threads) and placing its own, so the copies
        run in parallel too. Every output element gets the same additions in the same
        order, whichever worker computes it."""
        j = self._panel_index
        assert j is not None
        n = prepared.dims[j]
        level_shape = tuple(prepared.dims[i] for i in self._out_level_indices)
        out = np.empty(level_shape, dtype=VALUE_DTYPES[prepared.dtype])
        starts = range(0, n, width)
        total = resolve_threads(threads)
        workers = min(total, len(starts))

        def panel(start: int) -> None:
            cols = min(width, n - start)
            values = dict(prepared.values)
            for name in self._panel_carriers:
                values[name] = np.ascontiguousarray(values[name][..., start : start + cols])
            part = replace(prepared, values=values, dims={**prepared.dims, j: cols})
            out[..., start : start + cols] = self._run(compiled, part, total // workers)

        if workers == 1:
            for start in starts:
                panel(start)
        else:
            # numpy's copies and the kernel both release the GIL; list() re-raises
            with ThreadPoolExecutor(workers, thread_name_prefix="sparsec-panel") as pool:
                list(pool.map(panel, starts))
        return out

    @functools.cached_property
    def _out_layout(self) -> OutputLayout:
        """How a sparse output is assembled (computed once, on the first call)."""
        return OutputLayout.of(self.spec.output.format, self.spec.output.name)

    # ------------------------------------------------------------- inspection
    @property
    def formats(self) -> dict[str, Format]:
        """The format of each tensor of `assignment` (what ``formats=`` rebuilds this kernel
        from: a sparse ``+=``'s ``C_old`` is the spec's own, `TensorVar.argument`)."""
        return {t.name: t.format for t in self.spec.tensors if t.argument == t.name}

    @property
    def schedule(self) -> str:
        """The schedule actually applied (as in the generated code's header)."""
        if self.auto:
            tuned = self._last_tuned
            if tuned is None:
                return "auto: not tuned yet (the first call times the candidates)"
            medians = ", ".join(f"{k}: {v:.3g} ms" for k, v in tuned["medians_ms"].items())
            return (
                f"auto: {tuned['schedule'] or 'default'} (medians on the tuning inputs: {medians})"
            )
        return self.generated().schedule

    def generated(self, dtype: str | None = None, index_dtype: str | None = None) -> Generated:
        key = (dtype or self.dtype or "float64", index_dtype or self.index_dtype or "int32")
        found = self._generated.get(key)
        if found is not None:
            return found
        try:
            if self.target == "c":
                found = generate(
                    self.spec,
                    dtype=key[0],
                    index_dtype=key[1],
                    parallel=self.parallel,
                    commands=self.commands,
                )
            else:
                found = generate_cuda(
                    self.spec, dtype=key[0], index_dtype=key[1], commands=self.commands
                )
        except SparsecError as err:
            raise err.with_source(self.expression) from None
        self._generated[key] = found
        return found

    def verify(self) -> list[gpu.PtxasInfo]:
        """CUDA targets: compile the kernel with NVRTC (or nvcc) for sm_80 and sm_90 and
        return ptxas' report (registers, spills, occupancy); needs no GPU."""
        if self.target == "c":
            raise SparsecError("verify() compiles CUDA; this kernel's target is 'c'")
        gen = self.generated()
        return gpu.verify(gen.source, gen.launch.block)

    @property
    def source(self) -> str:
        """The generated C (for the kernel's dtypes; float64 values, int32 indices by default)."""
        return self.generated().source

    def __repr__(self) -> str:
        fmts = ", ".join(f"{t.name}:{t.format}" for t in self.spec.tensors)
        return f"Kernel({self.expression!r}, {fmts})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled and copied as the arguments that made it. The compiled library, the call
        fast path, the locks and the tuning caches belong to one process: the copy builds
        its own on first use (the library from the on-disk compile cache)."""
        args = (self.expression, self.formats, self.target, self._schedule_arg)
        return (_rebuild_kernel, (*args, self.dtype, self.index_dtype))

    def _compile(self, dtype: str, index_dtype: str) -> _Compiled:
        key = (dtype, index_dtype)
        with self._lock:
            found = self._compiled.get(key)
            if found is None:
                gen = self.generated(dtype, index_dtype)
                types = [_ctype(p, dtype) for p in gen.signature.params]
                packed = None
                if self.target == "cuda":
                    gpu.cupy_device()  # "no CUDA device" before anything else
                    fn: Any = None
                elif self.target == "cuda-emulated":
                    lib = runtime.compile_cached(gpu.emulation_source(gen), "c++")
                    fn = lib.sparsec_launch
                    fn.argtypes = [ctypes.c_int64, ctypes.c_int, *types]
                    fn.restype = ctypes.c_int
                else:
                    lib = runtime.compile_cached(gen.source)
                    fn = lib.sparsec_kernel
                    fn.argtypes = types
                    fn.restype = ctypes.c_int
                    if gen.packed:
                        packed = lib.sparsec_kernel_packed
                        packed.argtypes = [ctypes.c_char_p]
                        packed.restype = ctypes.c_int
                plan = tuple(
                    (p.field, p.tensor or "", p.level, p.index or "") for p in gen.signature.params
                )
                assemble = append = None
                if not self.spec.output.is_dense:
                    assemble = lib.sparsec_assemble
                    assemble.argtypes = fn.argtypes
                    assemble.restype = ctypes.c_int
                    if gen.append:
                        append = getattr(lib, gen.append)
                        append.argtypes = fn.argtypes
                        append.restype = ctypes.c_int
                found = self._compiled[key] = _Compiled(gen, fn, assemble, plan, append, packed)
            return found

    # ------------------------------------------------------------------- call
    def __call__(self, /, *, threads: int | None = None, **inputs: Any) -> Any:
        if self.auto:
            return self._tuned_variant(inputs, threads)(**inputs, threads=threads)
        fast = self._fast
        if fast is not None:
            result = fast.call(inputs, threads)
            if result is not None:
                return result
        prepared = self._prepare(inputs)
        compiled = self._compile(prepared.dtype, prepared.index_dtype)
        out = self._run(compiled, prepared, threads)
        if fast is None:
            self._fast = _FastPath.build(self, compiled, prepared, inputs)
        return prepared.wrap(out)

    def _tuned_variant(self, inputs: Mapping[str, Any], threads: int | None) -> Kernel:
        """schedule="auto": the kernel with the fastest schedule for inputs of this kind."""
        prepared = self._prepare(inputs)
        nthreads = resolve_threads(threads)
        entry = autotune.key(self, prepared.values, prepared.dtype, prepared.index_dtype, nthreads)
        found = self._tuned.get(entry) or autotune.lookup(entry)
        if found is None:
            found = autotune.tune(self, inputs, threads)
            autotune.record(entry, found)
        self._tuned[entry] = self._last_tuned = found
        schedule = found["schedule"]
        with self._lock:
            variant = self._variants.get(schedule)
            if variant is None:
                variant = self._variants[schedule] = Kernel(
                    self.expression,
                    self.formats,
                    schedule=schedule,
                    dtype=self.dtype,
                    index_dtype=self.index_dtype,
                )
        return variant

    def check(self, /, *, threads: int | None = None, **inputs: Any) -> CheckResult:
        """Run the kernel and compare with ``torch.einsum`` on densified inputs."""
        if self.auto:
            return self._tuned_variant(inputs, threads).check(threads=threads, **inputs)
        try:
            import torch
        except ImportError:
            raise SparsecError(
                "Kernel.check compares with torch, which is not installed; install a CPU "
                "build with `pip install torch==2.13.0` (or the extra sparsec[torch])"
            ) from None

        from .reference import compare, reference

        prepared = self._prepare(inputs)
        footprint.ensure_fits(
            footprint.check_parts(self.spec, prepared.dims), f"check of {self.assignment}"
        )
        compiled = self._compile(prepared.dtype, prepared.index_dtype)
        got = self._run(compiled, prepared, threads)
        if prepared.device and np.ndim(got):
            got = gpu.cupy_device().asnumpy(got)  # compared on the host
        dense = {}
        for t in self._wanted:
            v = prepared.values[t.name]
            if gpu.on_device(v):
                v = gpu.cupy_device().asnumpy(v)  # in level order, like a host value
            if isinstance(v, Tensor):
                v = v.to_dense()
            elif t.order and t.format.ordering != tuple(range(t.order)):
                v = np.transpose(v, np.argsort(t.format.ordering))  # back to mode order
            dense[t.argument] = torch.from_numpy(np.array(v, dtype=np.float64))
        current = dense.pop(self.spec.output.name, None)
        want = reference(self.assignment, dense, prepared.dims, current).numpy()
        if isinstance(got, Tensor):
            got.validate(self.spec.output.name)  # the assembled storage keeps every invariant
        err = compare(np.asarray(got), want, prepared.dtype, f"kernel {self.assignment}")
        return CheckResult(err, prepared.dtype)

    def extents(self, dims: Mapping[str, int] | None = None) -> dict[str, int]:
        """Every index's extent for `random_inputs`: ``dims`` where given, distinct small
        defaults elsewhere (so shape mix-ups show), equal where a tensor used twice needs it."""
        dims = dict(dims or {})
        given = set(dims)
        unknown = [i for i in dims if i not in self.spec.indices]
        if unknown:
            raise InputError(
                f"--dims names {', '.join(unknown)}, not an index of {self.assignment} "
                f"(indices: {', '.join(self.spec.indices)})"
            )
        for n, index in enumerate(self.spec.indices):
            dims.setdefault(index, DEFAULT_EXTENTS[n % len(DEFAULT_EXTENTS)])
        # a tensor used with different index lists needs equal extents mode by mode
        for a in self.spec.assignment.accesses():
            first = next(b for b in self.spec.assignment.accesses() if b.name == a.name)
            for mine, theirs in zip(a.indices, first.indices, strict=True):
                if dims[mine] != dims[theirs]:
                    if mine in given:
                        raise InputError(
                            f"{a.name} is used as {first} and {a}, so {theirs} and {mine} "
                            f"need equal extents, not {dims[theirs]} and {dims[mine]}"
                        )
                    dims[mine] = dims[theirs]
        return {i: dims[i] for i in self.spec.indices}

    def random_inputs(
        self, dims: Mapping[str, int] | None = None, *, seed: int = 0, density: float = 0.3
    ) -> tuple[dict[str, Any], dict[str, int]]:
        """Random inputs for this kernel and the extents used (`extents`).

        Sparse inputs are `sparsec.random` tensors in their declared formats (with empty
        rows/slices) holding ``density`` of their cells, built without a dense array; dense
        inputs have ~``1 - density`` zeros and an all-zero first slice. Extents whose
        inputs would not fit in memory raise `InputError`.
        """
        from ..tensors.tensor import random

        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise InputError(f"seed must be a non-negative integer, not {seed!r}")
        if not 0 <= density <= 1:
            raise InputError(f"density must be in [0, 1], got {density}")
        dims = self.extents(dims)
        shown = ",".join(f"{i}={n}" for i, n in dims.items())
        parts = footprint.check_parts(self.spec, dims, density=density, check=False)
        footprint.ensure_fits(parts, f"random inputs for {self.assignment} ({shown})")
        rng = np.random.default_rng(seed)
        dtype = self.dtype or "float64"
        accesses = {a.name: a for a in self.spec.assignment.accesses()}
        inputs: dict[str, Any] = {}
        for n, t in enumerate(self._wanted):
            shape = tuple(dims[i] for i in accesses[t.name].indices)
            if t.order == 0:
                inputs[t.argument] = float(rng.uniform(0.5, 2.0))
            elif t.is_dense:
                arr = np.where(
                    rng.random(shape) < max(density, 0.5), rng.uniform(-1, 1, shape), 0.0
                )
                if shape[0] > 2:
                    arr[rng.integers(shape[0])] = 0.0
                inputs[t.argument] = arr.astype(dtype)
            else:
                inputs[t.argument] = random(
                    shape,
                    density,
                    t.format,
                    seed=seed + n,
                    dtype=dtype,
                    index_dtype=self.index_dtype,
                )
        return inputs, dims

    def _run_sparse(self, compiled: _Compiled, prepared: _Prepared, threads: int | None) -> Tensor:
        """One pass into arrays of a proven capacity when the kernel appends serially
        anyway or runs on one thread; else two: count each output level's positions,
        allocate exactly, then fill (rows in parallel)."""
        nthreads = resolve_threads(threads)
        if compiled.append is not None and (nthreads == 1 or not self._out_layout.rowwise):
            bound = entry_bound(self.spec.statement, prepared.values, prepared.dims)
            if bound <= SINGLE_PASS_ENTRIES:
                done = self._run_single_pass(compiled, prepared, bound)
                if done is not None:
                    return done
        return self._run_two_phase(compiled, prepared, nthreads)

    def _run_single_pass(
        self, compiled: _Compiled, prepared: _Prepared, bound: int
    ) -> Tensor | None:
        """Append into capacities from `entry_bound` (each unique level: at most its parents
        times its extent, and at most ``bound``), then cut the arrays to the sizes the kernel
        reached. None when an index would not fit the kernel's index type."""
        out_t = self.spec.output
        sizes = np.zeros(max(1, out_t.order), dtype=np.int64)
        parents = 1
        for k, level in enumerate(out_t.format.levels):
            size = prepared.dims[self._out_level_indices[k]]
            if level.locate:
                parents *= size
            elif isinstance(level, Singleton):
                sizes[k] = parents  # one coordinate per parent position
            elif level.unique:
                parents = sizes[k] = min(parents * size, bound)
                layout = self._out_layout
                if k == layout.last and layout.one_entry_per_step:
                    # room for the up-front checks of the last level's loops
                    parents = sizes[k] = parents + LAST_LEVEL_SLACK * size
            else:  # COO's first level: one position per entry, repeated coordinates
                parents = sizes[k] = bound
        if parents > SINGLE_PASS_ENTRIES:
            return None  # a loose bound, or a huge extent as slack: count exactly instead
        largest = max(parents, *prepared.dims.values(), 0)
        if prepared.index_dtype == "int32" and largest > _INT32_MAX:
            return None  # the two phases count exactly, and say so if it does not fit
        arrays, levels, vals = self._allocate(prepared, sizes, {("sizes", -1): sizes})
        args = _arguments(compiled, prepared, arrays, 1)
        status = compiled.append(*args)
        if status == CAPACITY_EXCEEDED:
            if self._poison:  # the tests: a bound that was too small is a bug to see
                raise SparsecError(f"internal: the capacity bound {bound} was too small")
            return None
        self._check_status(status, compiled)
        # the sizes reached, level by level, from the pos arrays the kernel wrote
        parents = 1
        cut: list[LevelStorage] = []
        for k, (level, st) in enumerate(zip(out_t.format.levels, levels, strict=True)):
            pos = crd = None
            if level.locate:
                parents *= prepared.dims[self._out_level_indices[k]]
            elif st.pos is not None:
                pos = _cut(st.pos, parents + 1)
                parents = int(pos[parents])
            if st.crd is not None:
                crd = _cut(st.crd, parents)
            cut.append(LevelStorage(pos, crd))
        shape = tuple(prepared.dims[i] for i in self.spec.statement.lhs.indices)
        index_dtype = np.dtype(INDEX_DTYPES[prepared.index_dtype])
        return Tensor(shape, out_t.format, tuple(cut), _cut(vals, parents), index_dtype)

    def _run_two_phase(self, compiled: _Compiled, prepared: _Prepared, nthreads: int) -> Tensor:
        out_t = self.spec.output
        sizes = np.zeros(max(1, out_t.order), dtype=np.int64)
        index_dtype = INDEX_DTYPES[prepared.index_dtype]
        layout = self._out_layout
        counted: dict[tuple[str, int], np.ndarray] = {("sizes", -1): sizes}
        if layout.rowwise:
            # each row counts its entries into pos[p + 1]; the prefix sum makes them offsets
            rows = math.prod(prepared.dims[self._out_level_indices[k]] for k in range(layout.last))
            counted[("pos", layout.last)] = np.zeros(rows + 1, dtype=index_dtype)
        args = _arguments(compiled, prepared, counted, nthreads)
        self._check_status(compiled.assemble(*args), compiled)
        arrays: dict[tuple[str, int], np.ndarray] = {("sizes", -1): sizes}
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
        arrays, levels, vals = self._allocate(prepared, sizes, arrays)
        status = compiled.fn(*_arguments(compiled, prepared, arrays, nthreads))
        self._check_status(status, compiled)
        shape = tuple(prepared.dims[i] for i in self.spec.statement.lhs.indices)
        used = len(vals) - self._block_slack(prepared)
        return Tensor(shape, out_t.format, tuple(levels), vals[:used], np.dtype(index_dtype))

    def _block_slack(self, prepared: _Prepared) -> int:
        """Spare values past the last dense block below the output's last sparse level."""
        blocks = self._out_layout.block
        if not blocks:
            return 0
        return BLOCK_SLACK * math.prod(prepared.dims[self._out_level_indices[k]] for k in blocks)

    def _allocate(
        self,
        prepared: _Prepared,
        sizes: np.ndarray,
        arrays: dict[tuple[str, int], np.ndarray],
    ) -> tuple[dict[tuple[str, int], np.ndarray], list[LevelStorage], np.ndarray]:
        """The output's arrays for ``sizes[k]`` positions at each sparse level ``k`` (the
        given ``arrays``, such as a prefix-summed rowwise pos, are kept)."""
        out_t = self.spec.output
        index_dtype = INDEX_DTYPES[prepared.index_dtype]
        levels = []
        parents = 1
        for k, level in enumerate(out_t.format.levels):
            size = prepared.dims[self._out_level_indices[k]]
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
        slack = self._block_slack(prepared)
        vals = arrays[("vals", -1)] = np.empty(parents + slack, dtype=VALUE_DTYPES[prepared.dtype])
        if self._poison:
            vals.fill(np.nan)
            for key, arr in arrays.items():
                if key[0] == "crd" or (key[0] == "pos" and not self._out_layout.rowwise):
                    arr.fill(-1)
        return arrays, levels, vals

    def _check_status(self, status: int, compiled: _Compiled) -> None:
        """A sparse output's kernel status read as a dense output's is (a broken `bound`
        is a ShapeError here too)."""
        if status != 0:
            raise _status_error(status, compiled.generated)

    # -------------------------------------------------------------- internals
    def _name_error(self, inputs: Mapping[str, Any]) -> InputError:
        names = [t.argument for t in self._wanted]
        missing = [n for n in names if n not in inputs]
        extra = [n for n in inputs if n not in names]
        parts = []
        if missing:
            parts.append(f"missing input{'s' * (len(missing) > 1)} {', '.join(map(repr, missing))}")
        if extra:
            parts.append(f"unexpected input{'s' * (len(extra) > 1)} {', '.join(map(repr, extra))}")
        takes = ", ".join(names) or "no inputs"
        return InputError(f"{'; '.join(parts)}; kernel {self.assignment} takes {takes}")

    def _prepare(self, inputs: Mapping[str, Any]) -> _Prepared:
        """Validate and convert the inputs; cheap when they already fit (the hot path)."""
        if inputs.keys() != self._names:
            raise self._name_error(inputs)
        if self._renamed:
            inputs = {t.name: inputs[t.argument] for t in self._wanted}
        dtype = self.dtype or common_dtype(self._wanted, inputs)
        index_dtype = self.index_dtype or common_index_dtype(self._wanted, inputs)
        values = {}
        device = False
        for t in self._wanted:
            value = inputs[t.name]
            if gpu.on_device(value):
                values[t.name] = self._device_input(t, value, dtype, index_dtype)
                device = True
            else:
                values[t.name] = convert_input(t, value, dtype, index_dtype)
        if self.index_dtype is None and index_dtype == "int32":
            # A large input may have forced int64: bring every sparse input to one width.
            if any(isinstance(v, Tensor) and v.index_dtype == INT64 for v in values.values()):
                index_dtype = "int64"
                values = {n: widen(v) for n, v in values.items()}
        dims = self._dims(values)
        use_torch = any(is_torch(v) for v in inputs.values())
        return _Prepared(values, dims, dtype, index_dtype, use_torch, device)

    def _device_input(self, t: TensorVar, value: Any, dtype: str, index_dtype: str) -> Any:
        """An input in GPU memory: dense operands stay there (a CuPy array in level order),
        sparse ones become `Tensor`s (whose arrays the runtime then keeps on the device)."""
        where = f"input {t.name!r}"
        if self.target != "cuda":
            raise InputError(
                f"{where} is in GPU memory, but this kernel's target is {self.target!r}: pass "
                "a host array (CuPy: .get(), torch: .cpu()) or build it with target='cuda'"
            )
        if t.order == 0:
            return convert_input(t, float(value), dtype, index_dtype)
        if t.is_dense:
            return gpu.device_dense(t.order, t.format.ordering, value, VALUE_DTYPES[dtype], where)
        return convert_input(t, gpu.device_sparse_to_host(value), dtype, index_dtype)

    def _dims(self, values: Mapping[str, Any]) -> dict[str, int]:
        dims: dict[str, int] = {}
        seen: dict[str, str] = {}
        for name, mode, index in self._modes:
            size = int(values[name].shape[mode])
            known = dims.get(index)
            if known is None:
                dims[index], seen[index] = size, f"{name} (mode {mode})"
            elif known != size:
                raise ShapeError(
                    f"index {index} has extent {known} in {seen[index]} but {size} in "
                    f"{name} (mode {mode}); shapes must agree wherever an index is shared"
                )
        return dims

    def _run(self, compiled: _Compiled, prepared: _Prepared, threads: int | None) -> Any:
        if compiled.assemble is not None:
            return self._run_sparse(compiled, prepared, threads)
        width = self._panel_width(prepared)
        if width:
            return self._run_panels(compiled, prepared, threads, width)
        gen = compiled.generated
        out_t = self.spec.output
        np_dtype = VALUE_DTYPES[prepared.dtype]
        level_shape = tuple(prepared.dims[i] for i in self._out_level_indices)
        # the output lives where the inputs do: in GPU memory when any input does
        xp: Any = gpu.cupy_device() if prepared.device else np
        if self.spec.statement.accumulate:
            # the current value, already in level order: the kernel adds into a copy
            out = xp.array(prepared.values[out_t.name], dtype=np_dtype, order="C").reshape(-1)
        elif gen.launch is not None and gen.launch.zero_before:
            out = xp.zeros(math.prod(level_shape), dtype=np_dtype)  # CUDA kernels only add
        else:
            if xp is np:
                out = aligned_empty(math.prod(level_shape), np.dtype(np_dtype))
            else:
                out = xp.empty(math.prod(level_shape), dtype=np_dtype)
            if self._poison:
                out.fill(np.nan)  # test mode: an element the kernel fails to write shows
        if gen.target == "cuda":
            out = self._launch_gpu(compiled, prepared, out)
        else:
            args = _arguments(
                compiled,
                prepared,
                {("vals", -1): out},
                resolve_threads(threads),
                self._band_tiles(prepared.dims, prepared.values),
                self._depth_rows(prepared.dims, prepared.values),
            )
            status = compiled.fn(*args)
            if status != 0:
                raise _status_error(status, gen)
        if out_t.order == 0:
            return np_dtype(float(out[0]) if prepared.device else out[0])
        if self._out_identity:
            return out.reshape(level_shape)
        return out.reshape(level_shape).transpose(tuple(np.argsort(out_t.format.ordering)))

    def _launch_gpu(self, compiled: _Compiled, prepared: _Prepared, out: Any) -> Any:
        """A CUDA kernel into ``out``: on the CPU through the emulation, or on the device
        through CuPy (a host ``out`` comes back as a copy; a device one is filled)."""
        gen = compiled.generated
        if self.target == "cuda":
            launch, out_dev = self._stage_cupy(compiled, prepared, out)
            launch()
            return out_dev if prepared.device else gpu.cupy_device().asnumpy(out_dev)
        params = _named_arguments(compiled, prepared, out)
        grid = gpu.launch_grid(gen.launch, params, emulated=True)
        args = _arguments(compiled, prepared, {("vals", -1): out}, 1)
        compiled.fn(grid, gen.launch.block, *args)
        return out

    def _stage_cupy(
        self, compiled: _Compiled, prepared: _Prepared, out: Any
    ) -> tuple[Callable[[], None], Any]:
        """The arguments in GPU memory, and a launch over them (no copies). A sparse
        `Tensor`'s arrays are copied once per tensor and kept (they are immutable); host
        dense arrays are copied per call; device arrays are used where they are."""
        cp = gpu.cupy_device()
        gen = compiled.generated
        params = _named_arguments(compiled, prepared, out)
        grid = gpu.launch_grid(gen.launch, params, emulated=False)
        with self._lock:
            raw = self._raw_kernels.get(gen.source)
            if raw is None:
                raw = cp.RawKernel(gen.source, "sparsec_kernel", options=("-std=c++17",))
                self._raw_kernels[gen.source] = raw
        out_name = self.spec.output.name
        args: list[Any] = []
        out_dev = None
        vals_dtype = VALUE_DTYPES[gen.dtype]
        for p, (field_name, tensor, level, _) in zip(
            gen.signature.params, compiled.plan, strict=True
        ):
            value = params[p.name]
            if p.kind == "array":
                source = prepared.values.get(tensor)
                is_out = tensor == out_name and field_name == "vals"
                if not is_out and isinstance(source, Tensor) and field_name in _STORAGE:
                    dev = source.device_array(field_name, level, gpu.to_device)
                else:
                    dev = value if gpu.on_device(value) else gpu.to_device(value)
                if is_out:
                    out_dev = dev
                args.append(dev)
            elif p.field == "value":
                args.append(vals_dtype(value))
            elif p.field == "threads":
                args.append(np.int32(1))
            else:
                args.append(np.int64(value))
        assert out_dev is not None
        staged = tuple(args)
        block = gen.launch.block

        def launch() -> None:
            raw((grid,), (block,), staged)

        return launch, out_dev

    def device_launch(self, /, **inputs: Any) -> tuple[Callable[[], None], Any]:
        """For timing on a GPU (``target="cuda"``, dense output): the inputs copied to the
        device once; returns ``(launch, out)``. ``launch()`` runs the kernel on them
        asynchronously, with no host copies, into the device array ``out`` (flat, in the
        output's level order); it zeroes ``out`` first when the kernel only adds into it
        (atomics), so every launch computes the whole result."""
        if self.target != "cuda":
            raise SparsecError(
                f"device_launch needs target='cuda'; this kernel's is {self.target!r}"
            )
        if not self.spec.output.is_dense or self.spec.statement.accumulate or self.auto:
            raise SparsecError(
                "device_launch times plain kernels: a dense output, '=' (not '+='), and a "
                "fixed schedule"
            )
        prepared = self._prepare(inputs)
        compiled = self._compile(prepared.dtype, prepared.index_dtype)
        gen = compiled.generated
        level_shape = tuple(prepared.dims[i] for i in self._out_level_indices)
        out = gpu.cupy_device().zeros(math.prod(level_shape), dtype=VALUE_DTYPES[prepared.dtype])
        kernel_only, out_dev = self._stage_cupy(compiled, prepared, out)
        if not gen.launch.zero_before:
            return kernel_only, out_dev

        def launch() -> None:
            out_dev.fill(0)
            kernel_only()

        return launch, out_dev


#: the storage arrays of a `Tensor` argument
_STORAGE = ("pos", "crd", "vals")


def _named_arguments(compiled: _Compiled, prepared: _Prepared, out: np.ndarray) -> dict[str, Any]:
    """Each ABI parameter's value by name: arrays as numpy arrays (for the CUDA launch and
    for evaluating its grid on the host)."""
    found: dict[str, Any] = {}
    out_name = compiled.generated.signature.params[0].tensor
    for p, (field, tensor, level, index) in zip(
        compiled.generated.signature.params, compiled.plan, strict=True
    ):
        if field == "vals" and tensor == out_name:
            found[p.name] = out
        elif field in _STORAGE:
            v = prepared.values[tensor]
            if isinstance(v, Tensor):
                found[p.name] = v.vals if field == "vals" else getattr(v.levels[level], field)
            else:
                found[p.name] = v
        elif field == "value":
            found[p.name] = prepared.values[tensor]
        elif field == "dim":
            found[p.name] = prepared.dims[index]
        elif field in ("band", "depth"):
            found[p.name] = 0
        else:
            found[p.name] = 1
    return found


class _FastPath:
    """The hot path for repeated calls whose inputs already fit the kernel exactly.

    Built after the first call when every input was a `Tensor` in the declared format, a
    C-ordered ndarray of the kernel's dtype (identity-ordered dense operand) or a float.
    A call that fits the same way skips conversion and re-planning; anything else
    (including a shape mismatch, which then gets its error) takes the general path.
    """

    @staticmethod
    def build(
        kernel: Kernel, compiled: _Compiled, prepared: _Prepared, inputs: Mapping[str, Any]
    ) -> _FastPath | None:
        spec = kernel.spec
        if spec.statement.accumulate or prepared.use_torch or not spec.output.is_dense:
            return None
        if kernel.target != "c":
            return None
        if not kernel._out_identity:
            return None
        for t in kernel._wanted:
            v = inputs[t.name]
            if t.order == 0:
                ok = type(v) is float
            elif t.is_dense:
                ok = type(v) is np.ndarray and t.format.ordering == tuple(range(t.order))
            else:
                ok = isinstance(v, Tensor)
            if not ok or prepared.values[t.name] is not v:
                return None
        try:
            return _FastPath(kernel, compiled, prepared)
        except _NoFastPath:
            return None

    def __init__(self, kernel: Kernel, compiled: _Compiled, prepared: _Prepared) -> None:
        source, constants = _fast_source(kernel, compiled, prepared)
        made: dict[str, Any] = {}
        # the call's own function: the checks and the argument list written out for this
        # kernel, so a call runs no loops over inputs, slots or extents. Its identifiers
        # are generated (v0, d1, ...); names and other values come in as `constants`, and
        # module-level names (`address`, the cost models' thresholds) are looked up live
        exec(compile(source, "<sparsec fast path>", "exec"), globals(), made)
        self.call: Callable[[Mapping[str, Any], int | None], Any] = made["make"](**constants)
        self.source = source


def _fast_source(
    kernel: Kernel, compiled: _Compiled, prepared: _Prepared
) -> tuple[str, dict[str, Any]]:
    """Python source of `_FastPath`'s call for this kernel (``make(**constants)`` returns
    it), and the constants it binds. It does what the general path would for inputs that
    already fit, or returns None where they do not."""
    spec = kernel.spec
    dtype = np.dtype(VALUE_DTYPES[prepared.dtype])
    constants: dict[str, Any] = {
        "NAMES": kernel._names,
        "DT": dtype,
        "IDT": np.dtype(INDEX_DTYPES[prepared.index_dtype]),
        "ITEMSIZE": dtype.itemsize,
        "FN": compiled.fn,
        "GEN": compiled.generated,
        "KERNEL": kernel,
    }
    lines = ["if inputs.keys() != NAMES:", "    return None"]
    modes: dict[str, list[tuple[int, str]]] = {}
    for name, axis, index in kernel._modes:
        modes.setdefault(name, []).append((axis, index))
    local: dict[str, str] = {}  # tensor name -> its local (v0, v1, ...)
    extent: dict[str, str] = {}  # index -> the local holding its extent (d0, d1, ...)
    for n, t in enumerate(kernel._wanted):
        v = local[t.name] = f"v{n}"
        constants[f"N{n}"] = t.name
        lines.append(f"{v} = inputs[N{n}]")
        if t.order == 0:
            test = f"type({v}) is not float"
        elif t.is_dense:
            test = (
                f"type({v}) is not np.ndarray or ({v}.dtype is not DT and {v}.dtype != DT) "
                f"or {v}.ndim != {t.order} or not {v}.flags.c_contiguous"
            )
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
    fields = {field for field, _, _, _ in compiled.plan}
    needed = {index for field, _, _, index in compiled.plan if field == "dim"}
    if not needed <= set(extent) or not set(kernel._out_level_indices) <= set(extent):
        raise _NoFastPath  # an extent no input gives
    shape = [extent[i] for i in kernel._out_level_indices]
    size = " * ".join(shape) or "1"
    j = kernel._panel_index
    if j is not None and not set(kernel._panel_carriers) <= set(local):
        raise _NoFastPath  # a dense operand along j that the call does not pass
    if j is not None:
        # only wide calls may run in panels or bands (both cost models need the columns)
        constants["CARRIERS"] = kernel._panel_carriers
        constants["INDICES"] = tuple(extent)
        dims = f"dict(zip(INDICES, ({', '.join(extent.values())},)))"
        lines += [
            f"wide = {extent[j]} >= PANEL_MIN_COLUMNS",
            f"if wide and _panels_pay({extent[j]}, CARRIERS, inputs, {size}):",
            "    return None  # the general path runs it in column panels",
        ]
        if "band" in fields:
            lines.append(f"band = KERNEL._band_tiles({dims}, inputs) if wide else 0")
        if "depth" in fields:
            carried = " + ".join(f"{local[c]}.nbytes" for c in kernel._panel_carriers)
            lines += [
                "depth = 0",
                # `_depth_rows`'s first test, without its call
                f"if not wide and {carried} > DEPTH_MIN_BYTES:",
                f"    depth = KERNEL._depth_rows({dims}, inputs)",
            ]
    else:
        lines += ["band = 0", "depth = 0"]
    lines += [
        "th = (use_threads(threads) if type(threads) is int and 0 < threads <= MAX_THREADS"
        " else resolve_threads(threads))",
        f"if {size} * ITEMSIZE < ALIGN_FROM_BYTES:",
        f"    out = np.empty(({''.join(d + ', ' for d in shape)}), DT)",
        "else:",
        f"    out = aligned_empty({size}, DT).reshape(({''.join(d + ', ' for d in shape)}))",
    ]
    if kernel._poison:
        lines.append("out.fill(np.nan)  # test mode: an element the kernel fails to write shows")
    args = []
    for n, (field, tensor, level, index) in enumerate(compiled.plan):
        if field == "dim":
            args.append(extent[index])
        elif field == "threads":
            args.append("th")
        elif field in ("band", "depth"):
            args.append(field)
        elif tensor == spec.output.name:
            args.append("address(out)")
        else:
            t = spec.tensor(tensor)
            m = local[tensor].removeprefix("v")
            if t.order == 0:
                args.append(f"v{m}")
            elif t.is_dense:
                args.append(f"x{m}")
            else:
                constants[f"K{n}"] = (field, level)
                args.append(f"a{m}[K{n}]")
    if compiled.packed is not None:
        # one ctypes argument: the int64s packed in a bytes object (see `_Compiled.packed`)
        constants["FNP"] = compiled.packed
        constants["PACK"] = struct.Struct(f"={len(args)}q").pack
        lines.append(f"status = FNP(PACK({', '.join(args)}))")
    else:
        lines.append(f"status = FN({', '.join(args)})")
    lines += [
        "if status != 0:",
        "    raise _status_error(status, GEN)",
        "return out[()]" if spec.output.order == 0 else "return out",
    ]
    body = "\n".join("        " + line for line in lines)
    source = f"def make({', '.join(constants)}):\n    def call(inputs, threads):\n{body}\n    return call\n"
    return source, constants


class _NoFastPath(Exception):
    """The kernel's calls cannot take the fast path (`_FastPath.build` gives None)."""


#: imported names only `_fast_source`'s generated calls use (looked up in this module)
_FAST_PATH_GLOBALS = (MAX_THREADS, ALIGN_FROM_BYTES)


def _column_traffic(
    columns: int, carriers: tuple[str, ...], values: Mapping[str, Any]
) -> tuple[int, int, int]:
    """What the panel and band cost models weigh: the bytes of the dense operands along the
    panel index, the bytes gathered from them (stored sparse entries x columns x value
    size), and the value size."""
    carried = [values[n] for n in carriers]
    size = carried[0].itemsize
    gathered = sum(v.nnz for v in values.values() if isinstance(v, Tensor)) * columns * size
    return sum(a.nbytes for a in carried), gathered, size


def _panels_pay(
    columns: int,
    carriers: tuple[str, ...],
    values: Mapping[str, Any],
    out_elements: int,
    on: Machine | None = None,
) -> bool:
    """Whether a call with ``columns`` along the panel index runs in packed panels on the
    machine ``on`` (the current `machine()` when None).

    A cost model: panels move the dense operands along j and the output once more (packing
    ``X``, placing each output panel: ``X + 2 Y`` bytes) to keep the gathers (stored sparse
    entries x columns x value size) in cache. Whole, those gathers come from memory once the
    operands outgrow the last-level cache, and mostly from cache (with conflict misses at
    power-of-two strides) below it; so panels need PANEL_MIN_REUSE_BEYOND_CACHE bytes
    gathered per byte moved in the first case and PANEL_MIN_REUSE in the second."""
    if columns < PANEL_MIN_COLUMNS:
        return False
    carried_bytes, gathered, size = _column_traffic(columns, carriers, values)
    if carried_bytes <= PANEL_MIN_BYTES:
        return False
    moved = carried_bytes + 2 * out_elements * size
    beyond = carried_bytes > (on or machine()).last_level_cache
    return gathered >= (PANEL_MIN_REUSE_BEYOND_CACHE if beyond else PANEL_MIN_REUSE) * moved


def _bands_pay(
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
    carried_bytes, gathered, size = _column_traffic(columns, carriers, values)
    if carried_bytes <= BAND_MIN_BYTES:
        return False
    return gathered >= BAND_MIN_REUSE * out_elements * size


def _depth_rows(
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
    carried_bytes, gathered, size = _column_traffic(columns, carriers, values)
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


def _arguments(
    compiled: _Compiled,
    prepared: _Prepared,
    output: dict[tuple[str, int], Any],
    threads: int,
    band: int = 0,
    depth: int = 0,
) -> list[Any]:
    """The ABI argument list; ``output[(field, level)]`` gives the output's arrays,
    ``band`` the tiles per column band and ``depth`` the coordinates per depth block (on
    kernels that take them)."""
    values, dims = prepared.values, prepared.dims
    out_name = next(t for f, t, _, _ in compiled.plan if f == "vals")
    args: list[Any] = []
    for field, tensor, level, index in compiled.plan:
        if field in ("vals", "pos", "crd", "sizes") and (tensor == out_name or field == "sizes"):
            arr = output.get((field, level))
            args.append(None if arr is None else address(arr))
        elif field in ("vals", "pos", "crd"):
            v = values[tensor]
            args.append(v.addresses()[(field, level)] if isinstance(v, Tensor) else address(v))
        elif field == "value":
            args.append(values[tensor])
        elif field == "dim":
            args.append(dims[index])
        elif field == "band":
            args.append(band)
        elif field == "depth":
            args.append(depth)
        else:
            args.append(threads)
    return args


_INT32_MAX = 2**31 - 1
#: the single pass allocates for its bound (plus one extent of the last level) up front:
#: past this many entries the two phases run instead, so a loose bound or a huge extent
#: never costs more memory than this
SINGLE_PASS_ENTRIES = 1 << 24
#: column panels (`Kernel._run_panels`): columns per panel; a call runs in panels when
#: the panel index has at least PANEL_MIN_COLUMNS and the dense operands along it hold more
#: than PANEL_MIN_BYTES (measured on pruned-BERT SpMM, 2 cores with 8 MB of L3: 768x3072 at
#: 80 % x 2048 columns 171 -> 79 ms; at 512 columns panels were as often slower as faster)
#: and `_panels_pay`'s cost model expects the gathers saved to repay the copies (measured,
#: 2 threads, the copies shared between two workers: beyond the 8 MB cache panels won at
#: 10-27 bytes gathered per byte moved and lost at 5-9 (one exception: 1.34x at 7.7 with a
#: 24 MB X); within it they won from about 51 and lost at 17-27)
PANEL_COLUMNS = 128
PANEL_MIN_COLUMNS = 1024
PANEL_MIN_BYTES = 4 << 20
PANEL_MIN_REUSE = 48
PANEL_MIN_REUSE_BEYOND_CACHE = 10
#: column bands (`sparsec.passes.bands`, `_bands_pay`), for calls that do not run in panels:
#: register tiles per band (4 tiles of 8 AVX2 vectors: 1 KB of each row), the dense
#: operands' size beyond which bands may pay, and the bytes gathered per output byte they
#: need. Measured on pruned-BERT SpMM, float32, 2048 columns, 2 threads, 2-core Zen 1 VM
#: with 8 MB of L3 (`scratch`-style A/B of the same kernel banded and whole): bands won
#: 1.1-1.6x at 31-77 gathered bytes per output byte with X of 6-12 MB, lost 1.5x at 15
#: (3072x768 at 98 %: the output, 25 MB, dominates) and at 7.6; with X of 3 MB or 512
#: columns they were neutral
BAND_TILES = 4
BAND_MIN_BYTES = 4 << 20
BAND_MIN_REUSE = 24
#: depth blocks (`sparsec.passes.bands`, `_depth_rows`), for calls under PANEL_MIN_COLUMNS
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


def _cut(array: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` elements: a view when they are most of ``array``, else a copy (so a
    loose capacity does not stay allocated behind a small result)."""
    return array[:n] if 2 * n >= len(array) else array[:n].copy()


@dataclass(frozen=True, slots=True)
class _Prepared:
    """Inputs in kernel layout: floats (scalars), C-ordered ndarrays (dense), Tensors."""

    values: dict[str, Any]
    dims: dict[str, int]
    dtype: str
    index_dtype: str
    use_torch: bool
    #: some input is in GPU memory (target="cuda"): the output stays there too
    device: bool = False

    def wrap(self, out: Any) -> Any:
        if isinstance(out, Tensor):
            return out  # a sparse output is a sparsec.Tensor (to_torch()/to_scipy() convert)
        if self.device and np.ndim(out):
            out = gpu.cupy_device().ascontiguousarray(out)
            if self.use_torch:
                import torch

                return torch.as_tensor(out, device="cuda")
            return out
        if self.use_torch:
            import torch

            return (
                torch.from_numpy(np.ascontiguousarray(out)) if np.ndim(out) else torch.tensor(out)
            )
        return np.ascontiguousarray(out) if np.ndim(out) else out


def _rebuild_kernel(
    expr: str, formats: FormatsArg, target: str, schedule: Any, dtype: Any, index_dtype: Any
) -> Kernel:
    """`Kernel.__reduce__`'s constructor (its options are keyword-only)."""
    return Kernel(
        expr, formats, target=target, schedule=schedule, dtype=dtype, index_dtype=index_dtype
    )


def _schedule(schedule: Any) -> tuple[bool, tuple[Command, ...]]:
    """(threads allowed, the user's commands) from the ``schedule=`` argument."""
    match schedule:
        case None | "default" | "auto":
            return True, ()
        case "serial":
            return False, ()
        case str() | list() | tuple():
            commands = parse_commands(schedule)
            return True, commands
        case _:
            raise ScheduleError(
                f"schedule must be None, 'default', 'serial', a string of commands or a list "
                f"of them, not {type(schedule).__name__}"
            )


def _status_error(status: int, gen: Generated) -> SparsecError:
    """The error for a non-zero kernel status."""
    if status == OUT_OF_MEMORY:
        return SparsecError("the kernel could not allocate its workspace (out of memory)")
    if status == BOUND_VIOLATED:
        return ShapeError("the inputs break a bound of the schedule: " + "; ".join(gen.bounds))
    return SparsecError(f"kernel returned error status {status}")


def _ctype(p: Param, dtype: str) -> Any:
    if p.kind == "array":
        return ctypes.c_void_p
    match p.type:
        case "val":
            return _VALUE_CTYPES[dtype]
        case "i64":
            return ctypes.c_int64
        case "int":
            return ctypes.c_int
    raise AssertionError(p)


def kernel(
    expr: str,
    formats: FormatsArg = None,
    *,
    target: str = "c",
    schedule: Any = None,
    dtype: Any = None,
    index_dtype: Any = None,
) -> Kernel:
    """Compile ``expr`` (index notation) for the given formats; see `Kernel`.

    Kernels are immutable, so the same arguments return the same `Kernel` (the last
    `KERNEL_MEMO` distinct ones are kept): a repeated request costs a dictionary lookup,
    and the compiled library and the call fast path come with it."""
    key = _memo_key(expr, formats, target, schedule, dtype, index_dtype)
    if key is not None:
        with _memo_lock:
            found = _memo.get(key)
            if found is not None:
                _memo.move_to_end(key)
                return found
    made = Kernel(
        expr, formats, target=target, schedule=schedule, dtype=dtype, index_dtype=index_dtype
    )
    if key is not None:
        with _memo_lock:
            _memo[key] = made
            while len(_memo) > KERNEL_MEMO:
                _memo.popitem(last=False)
    return made


KERNEL_MEMO = 256
_MEMO_ENVIRONMENT = (
    "SPARSEC_POISON",
    "SPARSEC_CC",
    "SPARSEC_CFLAGS",
    "SPARSEC_CXX",
    "SPARSEC_CXXFLAGS",
    "SPARSEC_CACHE_DIR",
)
_memo: OrderedDict[tuple[Any, ...], Kernel] = OrderedDict()
_memo_lock = threading.Lock()


def _memo_key(*args: Any) -> tuple[Any, ...] | None:
    """A hashable key for `kernel`'s arguments, or None when one of them has no exact
    frozen spelling (then the kernel is built anew, never confused with another)."""

    def freeze(v: Any) -> Any:
        if v is None or isinstance(v, str | int | float | Format):
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
