"""The compiler's pipeline: spec + schedule policy -> lower -> passes -> printer -> `Generated`.

One function per target lowers the kernel per schedule it considers (the user's commands
plus `policy.schedules.cpu_default`, or each of `policy.schedules.gpu_candidates` until one
lowers), runs the target's passes over the loop IR and hands the bodies to its printer
(`backends.c`, `backends.cuda`), which decides nothing. A sparse output's C source holds up
to three lowerings: the symbolic phase (counts), the numeric phase, and a single pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from .abi import (
    APPEND_NAME,
    APPEND_ROWS_NAME,
    ASSEMBLE_NAME,
    CHUNK_PARAM,
    GPU_HASH,
    GPU_WORKSPACE,
    INT,
    KERNEL_NAME,
    Namer,
    Param,
    Signature,
)
from .backends import Generated, Launch
from .backends.c import STREAM_OUT, STREAM_OUT_VALUES, Function, print_c
from .backends.cuda import print_cuda
from .errors import ScheduleError, SparsecError
from .frontend.semirings import semiring
from .ir import nodes as ir
from .ir.visit import map_blocks, statements
from .lower import LoweredKernel, lower, names_for, wrap_chunks
from .middle.bound import plan as plan_bound
from .middle.commands import Command
from .middle.derive import describe as describe_derived
from .middle.schedule import RowsOutOfOrder, Schedule, make_schedule
from .middle.spec import Spec
from .middle.staging import needs_staging, staged, staging_format
from .passes.bands import BAND, DEPTH, Walks, band
from .passes.coarsen import coarsen
from .passes.dots import vectorize_dots
from .passes.flags import count_in_closed_form, fold_flag_loops, light_count
from .passes.jam import jam
from .passes.streams import prefetch_streams
from .passes.tile import tile
from .policy.decision import Decision, Output, PassOptions, decide
from .policy.dtypes import check_c_dtype
from .policy.machine import machine
from .policy.schedules import cpu_default, describe_cpu, describe_gpu, gpu_candidates
from .target import CUDA, C, Target
from .tensors.layout import AssemblyMode, OutputLayout

# ------------------------------------------------------------------------ passes


@dataclass(frozen=True, slots=True)
class Passed:
    """A kernel body after some passes: the notes each pass made (by pass name; a pass
    that changed nothing has none) and the parameters the passes added (`BAND`, `DEPTH`)."""

    body: ir.Block
    notes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    params: tuple[str, ...] = ()

    def after(self, name: str, body: ir.Block, notes: tuple[str, ...]) -> Passed:
        return replace(self, body=body, notes={**self.notes, name: notes})

    def of(self, name: str) -> tuple[str, ...]:
        return self.notes.get(name, ())


@dataclass(frozen=True, slots=True)
class Unit:
    """What a pass may read besides the body: the statement, the kernel's ABI, the passes'
    options (`Decision.passes`: which run, and each one's) and the last-level cache's size
    (read once per kernel: the template's threshold and the schedule's note must agree)."""

    spec: Spec
    sig: Signature
    options: PassOptions
    #: C only (the GPU passes read no cache size)
    llc: int = 0


#: a pass: IR -> IR, with what it did (see `Passed`)
Pass = Callable[[Passed, Unit], Passed]


def _streams(p: Passed, unit: Unit) -> Passed:
    return p.after("streams", *prefetch_streams(p.body, unit.options))


def _tile(p: Passed, unit: Unit) -> Passed:
    return p.after("tile", *tile(p.body, unit.options.tile))


def _jam(p: Passed, unit: Unit) -> Passed:
    return p.after("jam", *jam(p.body, unit.options))


def _bands(p: Passed, unit: Unit) -> Passed:
    body, notes, params = band(p.body, _walks(unit.spec, unit.sig))
    return replace(p.after("bands", body, notes), params=params)


def _stream_output(p: Passed, unit: Unit) -> Passed:
    """A dense output's register tiles stored non-temporally when the output is at least
    the last-level cache (it would be evicted before anything reads it again): the flag is
    decided once from the extents, and the kernel ends with a store fence. Unchanged when
    nothing was tiled or no tile stores into the output. A call in depth blocks (the kernel
    takes `DEPTH`) reads its output tiles back, so it never streams them."""
    spec, sig = unit.spec, unit.sig
    if not (p.of("tile") and spec.output.is_dense):
        return p
    size: ir.Expr = ir.IntLit(1)
    for index in spec.statement.lhs.indices:
        size = ir.mul(size, ir.Var(sig.dim(index)))
    big: ir.Expr = ir.Bin(">=", size, STREAM_OUT_VALUES)
    if DEPTH in p.params:
        big = ir.conj(big, ir.Bin("==", ir.Var(DEPTH), ir.IntLit(0)))
    out = sig.array(spec.output.name, "vals")
    stored = ir.Block(tuple(_stores_out(s, out) for s in p.body.body))
    if stored == p.body:
        return p  # the tiles store elsewhere (a workspace), e.g. for a scalar output
    # a tile runs along the output's last level with stride 1 from a multiple of that
    # level's extent: when the array and that extent are whole vectors, every tile vector
    # is aligned, as a non-temporal store needs
    last = spec.statement.lhs.indices[spec.output.format.ordering[-1]]
    aligned = ir.Call("rows_aligned", (ir.Var(out), ir.Var(sig.dim(last))))
    flag = ir.Decl(ir.I64, STREAM_OUT, ir.conj(big, aligned))
    body = ir.block(flag, stored, ir.Effect(ir.Call("store_fence", ())))
    note = f"output tiles stored non-temporally from {unit.llc} bytes"
    return p.after("stream_output", body, (note,))


def _stores_out(s: ir.Stmt, out: str) -> ir.Stmt:
    """``s`` with each register tile's store into array ``out`` (the tile pass's
    ``vstore``) made an output store that may bypass the cache (``vstore_out``); tiles
    stored into a workspace, which is read again, keep the plain store."""
    if isinstance(s, ir.Effect) and s.call.fn == "vstore":
        at = s.call.args[0]
        if isinstance(at, ir.Bin) and at.op == "+" and at.left == ir.Var(out):
            return ir.Effect(ir.Call("vstore_out", (*s.call.args, ir.Var(STREAM_OUT))))
        return s
    return map_blocks(s, lambda b: ir.Block(tuple(_stores_out(x, out) for x in b.body)))


def _walks(spec: Spec, sig: Signature) -> Walks:
    """Each compressed input level's ``crd`` array -> (its ``pos`` array, the level's
    extent), for depth blocks; a level whose tensor is read at more than one index there
    is left out (its extent is not one index's)."""
    found: dict[str, tuple[str, ir.Expr]] = {}
    for p in sig.params:
        if p.field != "crd" or p.tensor is None or p.tensor == spec.output.name:
            continue
        t = spec.tensor(p.tensor)
        mode = t.format.ordering[p.level]
        indices = {a.indices[mode] for a in spec.assignment.accesses() if a.name == t.name}
        try:
            pos = sig.array(t.name, "pos", p.level)
        except KeyError:
            continue  # a singleton level: no segments
        if len(indices) == 1:
            found[p.name] = (pos, ir.Var(sig.dim(indices.pop())))
    return found


def _dots(p: Passed, unit: Unit) -> Passed:
    return p.after("dots", *vectorize_dots(p.body, unit.options))


def _coarsen(p: Passed, unit: Unit) -> Passed:
    return p.after("coarsen", *coarsen(p.body, unit.options))


#: the C kernel's passes, in order. Streams first: a loop that the tile pass will tile
#: nests the tiled loop, so it is no stream loop, and a stream loop's prefetches never sit
#: inside a region to be tiled. Column bands reorder the tiled parallel loop; the output
#: tiles are streamed once their loops are final; dot loops (innermost, serial, untiled;
#: the jammed ones included) go on vector lanes last, so no other pass meets their blocks
C_PASSES: tuple[Pass, ...] = (_streams, _tile, _jam, _bands, _stream_output, _dots)
#: a sparse output's single-pass append function: serial, so no bands
C_APPEND_PASSES: tuple[Pass, ...] = (_streams, _tile, _jam, _dots)
#: the comments above the single pass's functions
APPEND_SERIAL = (
    "single pass for one thread: append in order into arrays of a capacity the runtime "
    "proved (plus a row of slack); the final sizes are in pos"
)
APPEND_CHUNKED = (
    "single pass in chunks of rows on threads, each into a region of a capacity the runtime "
    "proved (plus a row of slack), then moved into place (sparsec.lower.chunks)"
)
APPEND_ROWS = "one chunk's rows of the single pass, appended into its region"
COUNT_COMMENT = "symbolic phase: count the positions of every output level into sc_sizes"
#: the CUDA kernel's passes (the decision runs them on a default GPU mapping only)
CUDA_PASSES: tuple[Pass, ...] = (_coarsen,)


def run_passes(passes: tuple[Pass, ...], body: ir.Block, unit: Unit) -> Passed:
    """``body`` through those of ``passes`` the decision runs (`PassOptions.run`)."""
    done = Passed(body)
    if unit.spec.semantics.semiring != "plus_times":
        # the passes' register tiles, bands and coarsened threads add with '+'
        return done
    for step in passes:
        if unit.options.runs(step.__name__.removeprefix("_")):
            done = step(done, unit)
    return done


# ---------------------------------------------------------------------- targets


def lower_serially(spec: Spec) -> None:
    """``spec`` lowered serially with no schedule, for what it raises (the question
    `middle.schedule.every_loop` asks where a nested sum fits no order)."""
    lower(spec, names_for(spec), schedule=make_schedule(spec), parallel=False)


def _record(
    lowered: LoweredKernel,
    sig: Signature,
    schedule: str,
    dtype: str,
    index_dtype: str,
    **rest: Any,
) -> Generated:
    """What is known of a kernel before it is printed (the printer adds the source)."""
    return Generated(
        "", sig, lowered.loop_order, schedule, dtype, index_dtype, lowered.bounds, **rest
    )


def generate(
    spec: Spec,
    *,
    dtype: str = "float64",
    index_dtype: str = "int32",
    parallel: bool = True,
    commands: tuple[Command, ...] = (),
    decision: Decision | None = None,
) -> Generated:
    """C source for ``spec`` as ``decision`` says (by default `decide`'s for ``commands``
    and ``parallel``): ``sparsec_kernel`` and, for a sparse output, also ``sparsec_assemble``,
    which only counts the output's positions into ``sc_sizes``, and where the decision's
    output strategy takes one pass, ``sparsec_append``."""
    check_c_dtype(dtype)
    decision = decision or decide(spec, C, commands=commands, parallel=parallel, dtype=dtype)
    commands, parallel = decision.commands, decision.parallel
    make_names = names_for(spec)
    # every lowering of the kernel: the statement, its names, the decision's chunks
    lowers = partial(lower, spec, make_names, chunks_per_thread=decision.chunks_per_thread)
    # the user's commands, then the default's (none for schedule="serial")
    schedule = commands
    # the user's commands' schedule: the default's loops, and the kernel's where it adds none
    plain = make_schedule(spec, commands)
    if decision.default_commands:
        schedule += cpu_default(spec, plain.order, commands)
    final = plain if schedule == commands else make_schedule(spec, schedule)
    lowered, sig = lowers(schedule=final, parallel=parallel)
    facts = machine()  # once: the template's constants and the schedule's notes agree
    unit = Unit(spec, sig, decision.passes, facts.last_level_cache)
    functions = []
    # whether the append function was tiled: the template's vector helpers serve it too
    append_tiled: tuple[str, ...] = ()
    comment = append = ""
    chunked = False
    if not spec.output.format.is_dense:
        counted, _ = lowers(schedule=final, parallel=parallel, mode=AssemblyMode.COUNT)
        counting = count_in_closed_form(fold_flag_loops(counted.body))
        light = light_count(counting)
        functions.append(Function(ASSEMBLE_NAME, COUNT_COMMENT, counting, light=light))
        comment = "numeric phase: append coordinates and values into the allocated arrays"
        single = None
        # the decision's rule (`Output.BY_COUNT`) needs the count: whether it loops or
        # allocates (SDDMM's count walks B's positions: neither)
        heavy = any(isinstance(s, ir.While | ir.Alloc) for s in statements(counted.body))
        rowwise = OutputLayout.of(spec.output.format, spec.output.name).rowwise
        output = decision.output_for(heavy, rowwise)
        if output in (Output.SINGLE_PASS, Output.SINGLE_PASS_CHUNKS):
            try:
                chunks = output is Output.SINGLE_PASS_CHUNKS
                mode = AssemblyMode.APPEND_CHUNKS if chunks else AssemblyMode.APPEND
                # no commands: `plain`, unless the pass keeps rowwise rows in storage order
                one = make_schedule(spec, append=True) if rowwise else plain
                single, _ = lowers(schedule=one, parallel=False, mode=mode)
            except RowsOutOfOrder:
                pass  # rows visited out of storage order: counted and filled, two phases
        if single is not None:
            appended = run_passes(C_APPEND_PASSES, single.body, unit)
            wrapped = (
                wrap_chunks(appended.body, single.chunks) if single.chunks is not None else None
            )
            if single.chunks is not None and wrapped is None:
                # rows not in one plain loop, or carried from row to row: the serial pass
                single, _ = lowers(schedule=one, parallel=False, mode=AssemblyMode.APPEND)
                appended = run_passes(C_APPEND_PASSES, single.body, unit)
            append_tiled, body = appended.of("tile"), appended.body
            if wrapped is not None:
                rows_body, body = wrapped
                chunked = True
                functions.append(
                    Function(APPEND_ROWS_NAME, APPEND_ROWS, rows_body, f"int64_t {CHUNK_PARAM}")
                )
            said_append = APPEND_CHUNKED if chunked else APPEND_SERIAL
            functions.append(Function(APPEND_NAME, said_append, body))
            append = APPEND_NAME
        elif not rowwise:
            append = KERNEL_NAME  # a serial kernel appends into any arrays large enough
        # else a light count, a user's schedule, or rows out of storage order: two phases
    done = run_passes(C_PASSES, lowered.body, unit)
    fields = {BAND: "band", DEPTH: "depth"}
    sig = Signature((*sig.params, *(Param(n, "value", INT, fields[n]) for n in done.params)))
    functions.append(Function(KERNEL_NAME, comment, done.body))
    said = describe_cpu(
        spec, parallel, lowered.parallel_loops, lowered.loop_order, commands, lowered.notes
    )
    if lowered.sequence:
        said = f"{lowered.sequence}; {said}"
    if spec.derived:
        said = f"{describe_derived(spec)}; {said}"
    tiled, streamed = done.of("tile"), done.of("streams")
    jammed, dots = done.of("jam"), done.of("dots")
    if tiled or streamed or jammed or dots:
        notes = (*tiled, *done.of("bands"), *done.of("stream_output"), *streamed, *jammed, *dots)
        said += f"; {'; '.join(notes)}"
    bound = None if spec.output.format.is_dense else plan_bound(spec.statement)
    gen = _record(
        lowered, sig, said, dtype, index_dtype, append=append, chunked=chunked, bound=bound
    )
    tiles = decision.passes.tile
    vectors = tiles.vectors if tiled or append_tiled else 0
    sizes = {"vectors": vectors, "narrowest": tiles.narrowest, "llc": unit.llc}
    return print_c(spec, gen, functions, **sizes, l1_way=facts.l1_way)


def _gpu_default(
    spec: Spec, make_names: Callable[[], tuple[Signature, Namer]], target: Target
) -> tuple[LoweredKernel, Signature, Schedule]:
    """The first default GPU mapping that lowers, each scheduled and lowered once; the
    mappings come from the spec and its natural loop order, with no lowering of their own.

    Only where no mapping lowers is the kernel lowered without one (serially): an
    expression that cannot be lowered at all (a nested sum's loop order, say) reports
    that, not the mapping's failure."""
    natural = make_schedule(spec)
    order = natural.order
    reasons: list[str] = []
    try:
        for candidate in gpu_candidates(spec, order):
            try:
                chosen = make_schedule(spec, candidate, target=target)
                lowered, sig = lower(spec, make_names, schedule=chosen)
            except ScheduleError as err:
                reasons.append(str(err))
                continue
            return lowered, sig, chosen
    except SparsecError:
        lower(spec, make_names, schedule=natural)
        raise
    lower(spec, make_names, schedule=natural)
    why = f" (tried thread-per-row over {order[0]}: {reasons[-1]})" if reasons else ""
    raise ScheduleError(
        f"no GPU mapping for {spec.assignment} with these formats{why}; give a "
        "schedule with GPUBlock/GPUThread loops, or use target='c'"
    )


def generate_cuda(
    spec: Spec,
    *,
    dtype: str = "float64",
    index_dtype: str = "int32",
    commands: tuple[Command, ...] = (),
    decision: Decision | None = None,
    target: Target = CUDA,
) -> Generated:
    """The CUDA source of ``spec``'s kernel as ``decision`` (by default `decide`'s for
    ``commands``) says: its commands or the default GPU mapping, then its passes. A sparse
    output not filled row by row is computed into its rowwise staging output (`staging`)."""
    decision = decision or decide(spec, target, commands=commands)
    commands = decision.commands
    stage_note = ""
    if needs_staging(spec):
        stage_note = (
            f"output {spec.output.name} ({spec.output.format}) computed as rows "
            f"({staging_format(spec.output.format)}), then compacted"
        )
        spec = staged(spec)
    make_names = names_for(spec)
    if commands:
        scheduled = make_schedule(spec, commands, target=target)
        lowered, sig = lower(spec, make_names, schedule=scheduled)
    else:
        lowered, sig, scheduled = _gpu_default(spec, make_names, target)
        done = run_passes(CUDA_PASSES, lowered.body, Unit(spec, sig, decision.passes))
        if done.of("coarsen"):
            block = decision.passes.coarsen_block
            coarse = replace(lowered.gpu, block=block) if lowered.gpu else None
            notes = (*lowered.notes, *done.of("coarsen"))
            lowered = replace(lowered, body=done.body, gpu=coarse, notes=notes)
    counted = None
    if not spec.output.format.is_dense:
        # rows counted (each into its pos slot) by the same mapping, prefix-summed by the
        # runtime, then filled
        counted, _ = lower(spec, make_names, schedule=scheduled, mode=AssemblyMode.COUNT)
    chosen, gpu = scheduled.commands, lowered.gpu
    assert gpu is not None, "lowered for a GPU target"
    fill = semiring(spec.semantics.semiring).identity
    assemble = counted.body if counted is not None else None
    head = (gpu.grid, gpu.block, gpu.zero_before, lowered.body, gpu.shuffles, fill, assemble)
    launch = Launch(*head, gpu.scratch, gpu.groups, gpu.segments)
    if gpu.scratch:
        # the workspace's slices, one per thread of the launch, allocated by the runtime
        out = spec.output.name
        sig = Signature(
            (
                *sig.params,
                *(
                    Param(name, "array", ty, f"ws_{role}", out, writable=True)
                    for role, (name, ty) in {**GPU_WORKSPACE, **GPU_HASH}.items()
                ),
            )
        )
    schedule = describe_gpu(chosen, not commands, lowered.notes)
    if stage_note:
        schedule = f"{stage_note}; {schedule}"
    if lowered.sequence:
        schedule = f"{lowered.sequence}; {schedule}"
    if spec.derived:
        schedule = f"{describe_derived(spec)}; {schedule}"
    staging = spec if stage_note else None
    gen = _record(
        lowered,
        sig,
        schedule,
        dtype,
        index_dtype,
        target=target,
        launch=launch,
        commands=chosen,
        staging=staging,
    )
    return print_cuda(spec, gen)
