"""The C target's generation: the kernel lowered under the user's commands and the CPU
default, a sparse output's count and single pass, the C passes (`lists.C_PASSES`), printed by
`backends.c`."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from ..abi import (
    APPEND_NAME,
    APPEND_ROWS_NAME,
    ASSEMBLE_NAME,
    CHUNK_PARAM,
    INT,
    KERNEL_NAME,
    ROWS_NAME,
    Param,
    Signature,
)
from ..backends import Generated
from ..backends.c import Function, print_c
from ..backends.targets import C as C_TARGET
from ..base.target import C
from ..ir import nodes as ir
from ..ir.visit import statements
from ..lower import lower, names_for, wrap_chunks
from ..lower.outline import outline_rows
from ..middle.capacity import entry_bound_of
from ..middle.commands import Command
from ..middle.derive import describe as describe_derived
from ..middle.schedule import RowsOutOfOrder, make_schedule
from ..middle.spec import Spec
from ..passes.bands import BAND, DEPTH
from ..passes.flags import count_in_closed_form, fold_flag_loops, light_count
from ..passes.protocol import PassInput, run_passes
from ..policy.decision import Decision, Output, decide
from ..policy.dtypes import check_c_dtype, check_kernel_type
from ..policy.machine import machine
from ..policy.schedules import cpu_default, describe_cpu
from ..tensors.layout import AssemblyMode, OutputLayout
from . import lists
from .shared import record

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
ROWS_COMMENT = (
    "rows lo..hi of the kernel's parallel loop, serially: a function of their own keeps the "
    "parameters' restrict, which the body of an OpenMP loop loses (sparsec.lower.outline)"
)
COUNT_COMMENT = "symbolic phase: count the positions of every output level into sc_sizes"


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
    check_kernel_type(spec, dtype)
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
    unit = PassInput(spec, sig, decision.passes, facts.last_level_cache)
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
            appended = run_passes(lists.C_APPEND_PASSES, single.body, unit)
            wrapped = (
                wrap_chunks(appended.body, single.chunks) if single.chunks is not None else None
            )
            if single.chunks is not None and wrapped is None:
                # rows not in one plain loop, or carried from row to row: the serial pass
                single, _ = lowers(schedule=one, parallel=False, mode=AssemblyMode.APPEND)
                appended = run_passes(lists.C_APPEND_PASSES, single.body, unit)
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
    done = run_passes(lists.C_PASSES, lowered.body, unit)
    fields = {BAND: "band", DEPTH: "depth"}
    sig = Signature(
        (*sig.params, *(Param(n, "value", INT, fields[n]) for n in done.params)), sig.static
    )
    kernel_body = done.body
    # only where the formats fix loop extents: short fixed loops are what the restrict
    # lets GCC vectorise (docs/decisions.md, "A parallel loop's rows in a function of their own")
    where = decision.passes.outline
    outlined = where == "all" or (where == "fixed" and bool(sig.static))
    moved = outline_rows(kernel_body, sig) if outlined else None
    if moved is not None:
        extra = ", ".join(f"{C_TARGET.types[t]} {name}" for t, name in moved.extra)
        functions.append(Function(ROWS_NAME, ROWS_COMMENT, moved.rows, extra))
        kernel_body = moved.kernel
    functions.append(Function(KERNEL_NAME, comment, kernel_body))
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
    bound = None if spec.output.format.is_dense else entry_bound_of(spec.statement)
    gen = record(
        lowered, sig, said, dtype, index_dtype, append=append, chunked=chunked, bound=bound
    )
    gen = replace(gen, shared_rows=done.rows)
    tiles = decision.passes.tile
    vectors = tiles.vectors if tiled or append_tiled else 0
    sizes = {"vectors": vectors, "narrowest": tiles.narrowest, "llc": unit.llc}
    # None: no loop prefetches a stream, and the template's helper goes unused
    locality = decision.passes.stream_locality or 0
    return print_c(
        spec,
        gen,
        functions,
        **sizes,
        l1_way=facts.l1_way,
        l1_data=facts.l1_data,
        stream_locality=locality,
        stream_lines=decision.passes.stream_lines,
        reassociate=decision.passes.reassociate,
    )
