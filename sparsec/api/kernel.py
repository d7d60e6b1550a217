"""The user-facing kernel: ``sparsec.kernel(expr, formats) -> Kernel``; ``Kernel(**inputs)``.

A `Kernel` is one statement in index notation with its formats and schedule: made, it parses,
builds the `Spec` and checks the schedule; it shows what it generates (`source`, `schedule`,
`generated`) and runs a call through an `Executable` made lazily per (value dtype, index
dtype), which generates, compiles (on-disk cache) and loads one C function at its first call;
later calls bind their inputs (`runtime.inputs`) and run it, or take `runtime.fastpath`.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from ..backends import Generated
from ..base.errors import InputError, NotationError, ScheduleError, SparsecError, StagesMissing
from ..base.target import by_name
from ..frontend.parser import parse_expression
from ..frontend.semantics import Semantics
from ..middle.commands import Command, parse_commands
from ..middle.demap import demap
from ..middle.derive import contiguous, derive
from ..middle.regroup import regroup
from ..middle.spec import FormatsArg, Spec, make_spec
from ..pipeline import generate, generate_cuda, lower_serially
from ..policy import calibrated, decision, tuning
from ..policy.costs import Columns
from ..policy.dtypes import check_kernel_type
from ..policy.schedules import vector_rows
from ..runtime import fastpath, nvrtc
from ..runtime.binding import INDEX_DTYPES, VALUE_DTYPES, resolve_threads
from ..runtime.executable import Executable
from ..runtime.fastpath import FastPath
from ..runtime.inputs import Binder, Prepared, dtype_name
from ..tensors.formats import Format
from ..tensors.maps import MappedFormat
from . import autograd, autotune, check, fills, footprint, mapped_call
from .auto import AutoKernel, wants_auto
from .check import CheckResult
from .memo import _memo_key
from .vector import VECTOR_NOTE, by_lane_groups

#: keyword options of `Kernel.__call__` and `Kernel.check`, so not usable as tensor names
RESERVED_INPUT_NAMES = frozenset({"threads"})


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
        division: str = "sparse",
        semiring: str = "plus_times",
        mask: str | None = None,
    ) -> None:
        if not isinstance(expr, str):
            raise InputError(f"expression must be a string, not {type(expr).__name__}")
        #: the target, made once from its name ("c": OpenMP C; "cuda": CUDA through CuPy;
        #: "cuda-emulated": CUDA on the CPU); ``target``, the name, rebuilds the kernel
        self.platform = on = by_name(target)
        self.expression, self.target = expr, target
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
            self.semantics = Semantics(division, semiring, mask or "")
            #: a statement over mapped formats (bsr, nm) is compiled over level spaces
            self.demapped = demap(self.assignment, formats, mask or "")
            if self.demapped is not None:
                self.assignment, formats = self.demapped.assignment, self.demapped.formats
            self.spec: Spec = make_spec(self.assignment, formats, self.semantics)
            if self.demapped is not None:
                fixed = tuple(self.demapped.level_dims(None).items())
                self.spec = replace(self.spec, maps=self.demapped.said(), static=fixed)
        except SparsecError as err:
            raise err.with_source(expr) from None
        self.parallel, self.commands = _schedule(schedule)
        prepare = decision.prepare(self.commands, on)
        try:
            # repeated indices read derived inputs; so does, where policy says, the cheapest
            # re-layout where no loop order fits (nested too)
            self.spec = derive(self.spec, lower_serially if prepare.relayout else None)
            if prepare.regroup:
                self.spec = regroup(self.spec)
            if prepare.contiguous:
                self.spec = contiguous(self.spec)
        except SparsecError as err:
            raise err.with_source(expr) from None
        self._schedule_arg = schedule  # what a pickle or copy rebuilds the kernel from
        #: schedule="auto": candidates are timed on the first call of each input kind
        self.auto = schedule == "auto"
        if self.auto and not on.openmp:
            raise ScheduleError("schedule='auto' tunes CPU schedules; give a CUDA schedule")
        #: auto: the tuning result per input kind (`autotune.key`), the last one chosen, and
        #: the executables of the schedules timed or chosen
        self._tuned: dict[str, dict[str, Any]] = {}
        self._last_tuned: dict[str, Any] | None = None
        self._candidates: dict[tuple[decision.Decision, str, str], Executable] = {}
        #: auto: each kind of call seen (dtypes, threads, `autotune.signature`, calibration)
        #: -> its executable and tuning result, so a repeated call decides nothing again
        self._auto_runs: dict[tuple[Any, ...], tuple[Executable, dict[str, Any]]] = {}
        if not on.openmp and schedule == "serial":
            raise ScheduleError(
                "schedule 'serial' is for the C target; CUDA kernels map loops to GPU units"
            )
        self._generated: dict[tuple[str, str], Generated] = {}
        self.dtype = dtype_name(dtype, VALUE_DTYPES, "value dtype")
        self.index_dtype = dtype_name(index_dtype, INDEX_DTYPES, "index dtype")
        if self.dtype is not None:  # what the statement cannot mean in it, refused now
            check_kernel_type(self.spec, self.dtype)
        if self.commands or on.gpu:
            self.generated()  # a schedule (or GPU mapping) is checked now, not at the first call
        #: the GPU default's rows that a call may give to lane groups (CSR-vector)
        self._vector = vector_rows(self.spec) if on.gpu and not self.commands else None
        self._executables: dict[tuple[str, str], Executable] = {}
        self._lock = threading.Lock()
        #: SPARSEC_POISON=1 fills fresh outputs with NaN before each call (used by the tests)
        self._poison = os.environ.get("SPARSEC_POISON") == "1"
        self._fast: FastPath | None = None
        #: whether builds take the call's extents (`executable`); off after STAGES_MISSING
        self._stage_hints = True
        #: the inputs a call passes, and how their shapes bind the index variables
        self.binder = Binder(self.spec, on, self.dtype, self.index_dtype, str(self.assignment))
        #: the column layouts (panels, bands, depth blocks) open to this kernel's calls
        self.columns = Columns.of(self.spec, on)

    # ------------------------------------------------------------- inspection
    @property
    def formats(self) -> dict[str, Format | MappedFormat]:
        """The format of each tensor of the statement, as ``formats=`` rebuilds this kernel
        from them (mapped formats included: `level_formats` are the compiled ones)."""
        if self.demapped is None:
            return dict(self.level_formats)
        return {n: self.demapped.user_format(n) for n in self.level_formats}

    @property
    def level_formats(self) -> dict[str, Format]:
        """The format of each tensor of the compiled statement, `assignment` (over level
        spaces where formats are mapped; a sparse ``+=``'s ``C_old`` is the spec's own,
        `TensorVar.argument`)."""
        made = {d.name for d in self.spec.derived}  # computed at call time, never given
        given = {t.name: t.format for t in self.spec.tensors if t.argument == t.name}
        given = {n: f for n, f in given.items() if n not in made}
        # a tensor read only through derived inputs is passed in its own format
        given.update((t.name, t.format) for d in self.spec.derived for t, _ in d.reads)
        return given

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
        said = self.generated().schedule
        if self._vector is not None:
            said += f"; {VECTOR_NOTE}"
        return said

    def generated(self, dtype: str | None = None, index_dtype: str | None = None) -> Generated:
        """The generated code for these dtypes (the kernel's own, else float64 and int32)."""
        key = (dtype or self.dtype or "float64", index_dtype or self.index_dtype or "int32")
        found = self._generated.get(key)
        if found is None:
            found = self._generated[key] = self._generate(key[0], key[1], self._decide(key[0]))
        return found

    def _decide(self, dtype: str, commands: tuple[Command, ...] | None = None) -> decision.Decision:
        """Policy's decision for this kernel's ``dtype`` values under ``commands`` (the
        kernel's own by default)."""
        return decision.decide(
            self.spec,
            self.platform,
            commands=self.commands if commands is None else commands,
            parallel=self.parallel,
            dtype=dtype,
        )

    def _generate(self, dtype: str, index_dtype: str, decided: decision.Decision) -> Generated:
        spec, on = self.spec, self.platform
        try:
            if on.gpu:
                return generate_cuda(
                    spec, dtype=dtype, index_dtype=index_dtype, decision=decided, target=on
                )
            return generate(spec, dtype=dtype, index_dtype=index_dtype, decision=decided)
        except SparsecError as err:
            raise err.with_source(self.expression) from None

    def verify(self) -> list[nvrtc.PtxasInfo]:
        """CUDA targets: compile the kernel with NVRTC (or nvcc) for sm_80 and sm_90 and
        return ptxas' report (registers, spills, occupancy); needs no GPU."""
        if not self.platform.gpu:
            raise SparsecError("verify() compiles CUDA; this kernel's target is 'c'")
        gen = self.generated()
        return nvrtc.verify(gen.source, gen.launch.block)

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
        sem = self.semantics
        return (
            _rebuild_kernel,
            (*args, self.dtype, self.index_dtype, sem.division, sem.semiring, sem.mask),
        )

    # ------------------------------------------------------------------- call
    def executable(
        self, dtype: str, index_dtype: str, prepared: Prepared | None = None
    ) -> Executable:
        """The compiled kernel for ``dtype`` values and ``index_dtype`` indices (made once), with
        the tile stages of the call ``prepared`` (`sparsec.passes.stages`; without: all)."""
        key = (dtype, index_dtype)
        with self._lock:
            found = self._executables.get(key)
            if found is None:
                found = self._executables[key] = Executable.build(
                    self.spec,
                    self.generated(dtype, index_dtype),
                    self.platform,
                    self.columns,
                    self._poison,
                    prepared if self._stage_hints else None,
                )
            return found

    def all_stages(self) -> None:
        """Every later build has all tile stages: after STAGES_MISSING, and on a worker."""
        with self._lock:
            self._stage_hints = False
            self._executables.clear()
            self._fast = None

    def __call__(self, /, *args: Any, threads: int | None = None, **inputs: Any) -> Any:
        self.binder.no_positional(args)
        swapped = fills.dense_for_fills(self, inputs) if self.demapped is None else None
        if swapped is not None:  # a fill that takes part: those operands read dense
            variant, inputs = swapped
            return variant(**inputs, threads=threads)
        if self.demapped is not None:
            out = self._levels_call(mapped_call.to_levels(self.demapped, inputs), threads)
            return mapped_call.from_levels(self.demapped, self.spec.output.name, out)
        return self._levels_call(inputs, threads)

    def keywords(self) -> dict[str, Any]:
        """The keyword arguments that made this kernel (all but the expression and the
        formats): a kernel made from another statement or formats with them computes as
        this one does (`dense_variant`, the distributed planner's parts)."""
        sem = self.semantics
        return {
            "target": self.target,
            "schedule": self._schedule_arg,
            "dtype": self.dtype,
            "index_dtype": self.index_dtype,
            "division": sem.division,
            "semiring": sem.semiring,
            "mask": sem.mask or None,
        }

    def dense_variant(self, names: frozenset[str]) -> Kernel:
        """This statement with the operands ``names`` dense (`fills.dense_for_fills`)."""
        formats: dict[str, Any] = {**self.formats, **{name: "dense" for name in names}}
        return kernel(self.expression, formats, **self.keywords())  # the memo's: made once

    def _levels_call(self, inputs: dict[str, Any], threads: int | None) -> Any:
        if autograd.wants_grad(inputs):  # torch inputs that require grad: a grad_fn
            return autograd.call(self, inputs, threads)
        return self.run_levels(inputs, threads)

    def run_levels(self, inputs: dict[str, Any], threads: int | None) -> Any:
        """One call on the compiled statement's own inputs (the level spaces' for mapped
        formats), without autograd: what a call and autograd's forward run."""
        try:
            return self._call(inputs, threads)
        except StagesMissing:
            self.all_stages()
            return self._call(inputs, threads)

    def _call(self, inputs: dict[str, Any], threads: int | None) -> Any:
        fast = self._fast
        if fast is not None:
            result = fast.call(inputs, threads)
            if result is not None:
                return result
        prepared = self.binder.prepare(inputs, resolve_threads(threads))
        executable = self._executable_for(prepared, threads)
        out = executable.run(prepared, threads)
        if fast is None and not self.auto:
            self._fast = fastpath.build(self.binder, executable, prepared, inputs)
        return prepared.wrap(out)

    def _executable_for(self, prepared: Prepared, threads: int | None) -> Executable:
        """The executable a call runs: schedule="auto" tunes it per kind of input."""
        if not self.auto:
            rows, warp = self._vector, self.platform.lanes
            vector = rows and by_lane_groups(self.spec, rows, prepared.values, warp)
            if vector:  # rows long enough for groups of lanes: the kernel for that group size
                try:
                    mapped = self._decide(prepared.dtype, parse_commands(vector))
                    return self._candidate(mapped, prepared.dtype, prepared.index_dtype)
                except ScheduleError:
                    self._vector = None  # not mappable by groups: thread-per-row stays
            return self.executable(prepared.dtype, prepared.index_dtype, prepared)
        dtype, index_dtype = prepared.dtype, prepared.index_dtype
        n = resolve_threads(threads)
        # a kind of call already decided in this process (under the same calibration) runs
        # its executable with no key, candidates or table to look at again
        kind = (
            dtype,
            index_dtype,
            n,
            autotune.signature(prepared.values),
            tuple(sorted(calibrated.overrides().items())),
        )
        known = self._auto_runs.get(kind)
        if known is not None:
            self._last_tuned = known[1]
            return known[0]
        entry = autotune.key(self.assignment, self.spec, prepared.values, dtype, index_dtype, n)
        decisions = tuning.candidates(self.spec, self.generated().loop_order, self._decide(dtype))
        # the recorded winner (`autotune.winner`); where there is none, or no candidate
        # bears its label any more, the candidates are timed
        found = self._tuned.get(entry) or autotune.lookup(entry)
        chosen = autotune.winner(found, decisions)
        if found is None or chosen is None:
            build = partial(self._candidate, dtype=dtype, index_dtype=index_dtype)
            found = autotune.tune(build, decisions, prepared, threads)
            autotune.record(entry, found)
            chosen = autotune.winner(found, decisions) or decisions[0]
        self._tuned[entry] = self._last_tuned = found
        executable = self._candidate(chosen, dtype, index_dtype)
        self._auto_runs[kind] = (executable, found)
        return executable

    def _candidate(self, decided: decision.Decision, dtype: str, index_dtype: str) -> Executable:
        """schedule="auto" or a lane-group mapping: the executable of one decision (kept)."""
        key = (decided, dtype, index_dtype)
        with self._lock:
            found = self._candidates.get(key)
            if found is None:
                gen = self._generate(dtype, index_dtype, decided)
                found = Executable.build(self.spec, gen, self.platform, self.columns, self._poison)
                self._candidates[key] = found
            return found

    def check(self, /, *args: Any, threads: int | None = None, **inputs: Any) -> CheckResult:
        """Run the kernel and compare with ``torch.einsum`` on densified inputs."""
        self.binder.no_positional(args)
        check.require_torch()
        swapped = fills.dense_for_fills(self, inputs) if self.demapped is None else None
        if swapped is not None:
            variant, inputs = swapped
            return variant.check(**inputs, threads=threads)
        if self.demapped is not None:
            inputs = mapped_call.to_levels(self.demapped, inputs)
        prepared = self.binder.prepare(inputs, resolve_threads(threads))
        footprint.ensure_fits(
            footprint.check_parts(self.spec, prepared.dims), f"check of {self.assignment}"
        )
        try:
            got = self._executable_for(prepared, threads).run(prepared, threads)
        except StagesMissing:
            self.all_stages()
            got = self._executable_for(prepared, threads).run(prepared, threads)
        return check.verdict(self.assignment, self.spec, self.binder.wanted, prepared, got)

    def extents(self, dims: Mapping[str, int] | None = None) -> dict[str, int]:
        """Every index's extent for `random_inputs`: ``dims`` where given, distinct small
        defaults elsewhere (so shape mix-ups show), equal where a tensor used twice needs it.
        Over mapped formats: the compiled statement's, from the user's indices or its own."""
        if self.demapped is not None:
            dims = self.demapped.level_dims(dims)
        return check.extents(self.assignment, self.spec, dims)

    def random_inputs(
        self, dims: Mapping[str, int] | None = None, *, seed: int = 0, density: float = 0.3
    ) -> tuple[dict[str, Any], dict[str, int]]:
        """Random inputs for this kernel and the extents used (`extents`).

        Sparse inputs are `sparsec.random` tensors in their declared formats (with empty
        rows/slices) holding ``density`` of their cells, built without a dense array; dense
        inputs have ~``1 - density`` zeros and an all-zero first slice. Extents whose
        inputs would not fit in memory raise `InputError`.
        """
        if self.demapped is not None:
            return mapped_call.random_inputs(self, dims, seed, density)
        wanted = self.binder.wanted
        return check.random_inputs(
            self.assignment, self.spec, wanted, dims, seed, density, self.dtype, self.index_dtype
        )

    def device_launch(self, /, **inputs: Any) -> tuple[Callable[[], None], Any]:
        """For timing on a GPU (``target="cuda"``, dense output): the inputs copied to the
        device once; returns ``(launch, out)``. ``launch()`` runs the kernel on them
        asynchronously, with no host copies, into the device array ``out`` (flat, in the
        output's level order); it zeroes ``out`` first when the kernel only adds into it
        (atomics), so every launch computes the whole result."""
        if not self.platform.device:
            raise SparsecError(
                f"device_launch needs target='cuda'; this kernel's is {self.target!r}"
            )
        if not self.spec.output.is_dense or self.spec.statement.accumulate or self.auto:
            raise SparsecError(
                "device_launch times plain kernels: a dense output, '=' (not '+='), and a "
                "fixed schedule"
            )
        prepared = self.binder.prepare(inputs)
        return self._executable_for(prepared, None).device_launch(prepared)


def _rebuild_kernel(
    expr: str,
    formats: FormatsArg,
    target: str,
    schedule: Any,
    dtype: Any,
    index_dtype: Any,
    division: str = "sparse",
    semiring: str = "plus_times",
    mask: str = "",
) -> Kernel:
    """`Kernel.__reduce__`'s constructor (its options are keyword-only)."""
    return Kernel(
        expr,
        formats,
        target=target,
        schedule=schedule,
        dtype=dtype,
        index_dtype=index_dtype,
        division=division,
        semiring=semiring,
        mask=mask,
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


def kernel(
    expr: str,
    formats: FormatsArg = None,
    *,
    target: str = "c",
    schedule: Any = None,
    dtype: Any = None,
    index_dtype: Any = None,
    division: str = "sparse",
    semiring: str = "plus_times",
    mask: str | None = None,
) -> Kernel:
    """Compile ``expr`` (index notation) for the given formats; see `Kernel`.

    ``division``, ``semiring`` and ``mask`` change what the statement computes
    (`sparsec.frontend.semantics`, docs/semantics.md). ``formats="auto"`` (or ``"auto"``
    for one input) returns an `auto.AutoKernel`, which chooses those formats at a call.

    Kernels are immutable, so the same arguments return the same `Kernel` (the last
    `KERNEL_MEMO` distinct ones are kept): a repeated request costs a dictionary lookup,
    and the compiled library and the call fast path come with it."""
    options = {"target": target, "schedule": schedule, "dtype": dtype}
    options |= {"index_dtype": index_dtype, "division": division}
    options |= {"semiring": semiring, "mask": mask}
    if wants_auto(formats):
        # formats chosen from the data at a call: a new AutoKernel each time (its choices
        # and `formats` are its own callers'), over memoized candidate kernels
        return AutoKernel(expr, formats, kernel, **options)  # type: ignore[return-value]
    key = _memo_key(
        expr, formats, target, schedule, dtype, index_dtype, division, semiring, mask or ""
    )
    if key is not None:
        with _memo_lock:
            found = _memo.get(key)
            if found is not None:
                _memo.move_to_end(key)
                return found
    made = Kernel(expr, formats, **options)
    if key is not None:
        with _memo_lock:
            _memo[key] = made
            while len(_memo) > KERNEL_MEMO:
                _memo.popitem(last=False)
    return made


KERNEL_MEMO = 256
_memo: OrderedDict[tuple[Any, ...], Kernel] = OrderedDict()
_memo_lock = threading.Lock()
