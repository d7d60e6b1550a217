"""The CUDA target's generation: the user's GPU schedule or the first default mapping that
lowers, the CUDA passes (`lists.CUDA_PASSES`), a sparse output's counting kernel, printed by
`backends.cuda`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..abi import GPU_HASH, GPU_WORKSPACE, Namer, Param, Signature
from ..backends import Generated, Launch
from ..backends.cuda import print_cuda
from ..base.errors import ScheduleError, SparsecError
from ..base.target import CUDA, Target
from ..frontend.semirings import semiring
from ..lower import LoweredKernel, lower, names_for
from ..middle.commands import Command
from ..middle.derive import describe as describe_derived
from ..middle.schedule import Schedule, make_schedule
from ..middle.spec import Spec
from ..middle.staging import needs_staging, staged, staging_format
from ..passes.protocol import PassInput, run_passes
from ..policy.decision import Decision, decide
from ..policy.dtypes import check_kernel_type
from ..policy.schedules import describe_gpu, gpu_candidates
from ..tensors.layout import AssemblyMode
from . import lists
from .shared import record


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
    check_kernel_type(spec, dtype)
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
        done = run_passes(lists.CUDA_PASSES, lowered.body, PassInput(spec, sig, decision.passes))
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
            ),
            sig.static,
        )
    schedule = describe_gpu(chosen, not commands, lowered.notes)
    if stage_note:
        schedule = f"{stage_note}; {schedule}"
    if lowered.sequence:
        schedule = f"{lowered.sequence}; {schedule}"
    if spec.derived:
        schedule = f"{describe_derived(spec)}; {schedule}"
    staging = spec if stage_note else None
    gen = record(
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
