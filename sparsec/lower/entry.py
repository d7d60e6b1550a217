"""One kernel's lowering, start to end, under the schedule the middle end decided
(`middle.schedule`): the schedule's entry checks and workspaces, the loop nest
(`lowerer.loops`), and the one epilogue every output shares (`output.epilogue`). `lower`
runs it once or twice."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..abi import BOUND_VIOLATED, Namer, Signature, signature
from ..ir import nodes as ir
from ..middle.order import level_indices
from ..middle.plan import Space
from ..middle.schedule import Schedule
from ..middle.spec import Spec
from ..policy.decision import CHUNKS_PER_THREAD
from ..tensors.layout import AssemblyMode
from .chunks import ChunkFrame
from .ctx import Ctx, OutputSink
from .env import LowerEnv
from .levels import locate
from .lowerer import loops, scatter_gather
from .output import DenseFrame, OutputFrame, block_size, epilogue
from .semiring import apply as apply_semiring
from .where import plan_where


@dataclass(frozen=True, slots=True)
class GpuLaunch:
    """How a GPU kernel is launched, as its lowering found it (the pipeline hands it on
    in `backends.Launch`)."""

    #: the grid (trip count of the GPUBlock loop; None: known at the launch) and the
    #: threads per block
    grid: ir.Expr | None
    block: int
    #: the output must be zeroed before the launch (the kernel only adds into it)
    zero_before: bool = False
    #: the kernel reduces across a warp's lanes with shuffles
    shuffles: bool = False
    #: lanes reduce in groups smaller than a warp (the template's group shuffles)
    groups: bool = False
    #: a warp's lanes combine their runs of atomic stores (`output.flush_runs`)
    segments: bool = False
    #: the workspace's elements per thread, by role (`abi.GPU_WORKSPACE`)
    scratch: tuple[tuple[str, ir.Expr], ...] = ()


@dataclass(frozen=True, slots=True)
class LoweredKernel:
    body: ir.Block
    loop_order: tuple[str, ...]
    #: loops that run on CPU threads, by index variable
    parallel_loops: tuple[str, ...] = ()
    #: every output element is written exactly once (no zeroing; ``=`` stores)
    exclusive: bool = False
    #: no output element is written twice (zeroed first, then ``=`` stores)
    once: bool = False
    #: how each parallel loop runs, in words (header comment and `Kernel.schedule`)
    notes: tuple[str, ...] = ()
    #: what each `bound` promises (the kernel returns BOUND_VIOLATED when one fails)
    bounds: tuple[str, ...] = ()
    #: a GPU target's launch (None on a CPU target)
    gpu: GpuLaunch | None = None
    #: the statement lowered as a sequence of loop nests, in words ("": one fused nest)
    sequence: str = ""
    #: a single pass lowered to run in chunks of rows: what `chunks.wrap` needs
    chunks: ChunkFrame | None = None


def lower_kernel(env: LowerEnv) -> LoweredKernel:
    """The kernel of ``env``'s statement."""
    given, decided, found = env.inputs, env.decided, env.found
    stmt = given.spec.statement
    lhs = given.lhs
    asm = decided.assembler
    order = decided.schedule.order
    # the single pass's schedule keeps rowwise rows in storage order (`make_schedule`'s append)
    in_order = decided.schedule.rows_in_order
    assert in_order == (asm is None or not asm.mode.rowwise), "another row order"
    plan = decided.plan
    for space in plan.spaces.values() if plan is not None else ():
        if space.bound is not None:
            _bound_check(env, space)
    if decided.schedule.placement is not None:
        decided.where = plan_where(env, decided.schedule.placement)
    frame: OutputFrame = asm if asm is not None else DenseFrame(env)
    if asm is not None:
        asm.workspace_alloc(decided.workspace, given.gpu)
    decided.zero_in_loop = (
        asm is None
        and not given.gpu
        and not stmt.accumulate
        and not given.exclusive
        and lhs.order > 0
        and bool(order)
        and order[0] == level_indices(lhs, given.spec.output.format)[0]
    )
    located, ctx = locate(env, Ctx(), [lhs])
    if asm is not None and decided.workspace and asm.layout.last == 0:
        body = scatter_gather(env, order, stmt.rhs, ctx)
    else:
        body = loops(env, order, stmt.rhs, ctx, OutputSink(), outermost=True)
    # a semiring other than plus_times: every accumulation and its start follow its add
    kernel = apply_semiring(given.ring, epilogue(env, frame, ir.block(located, body)))
    sites = found.write_sites
    return LoweredKernel(
        kernel,
        order,
        tuple(found.parallel_loops),
        bool(sites) and all(sites) and not stmt.accumulate,
        bool(sites) and not (found.repeats or stmt.accumulate or decided.sequence or given.gpu),
        tuple(found.notes),
        tuple(found.bound_messages),
        gpu=_launch(env, frame) if given.gpu else None,
        sequence=decided.sequence,
        chunks=asm.chunk_frame() if asm is not None else None,
    )


def _launch(env: LowerEnv, frame: OutputFrame) -> GpuLaunch:
    """What a GPU kernel's launch needs: its grid and block, the output zeroed first, the
    template's warp helpers, and the workspace's slices (elements per thread, by role)."""
    scratch: tuple[tuple[str, ir.Expr], ...] = ()
    ws = env.decided.assembler.ws if env.decided.assembler is not None else None
    if ws is not None:
        roles = {ws.w: "vals", ws.seen: "seen", ws.reached: "list"}
        scratch = tuple((roles[name], count) for name, count in ws.strides)
    return GpuLaunch(
        env.found.grid,
        block_size(env),
        zero_before=isinstance(frame, DenseFrame) and not frame.zeroed,
        shuffles=bool(env.found.warp_reduced) or env.found.segmented,
        groups=bool(env.found.group_reduced),
        segments=env.found.segmented,
        scratch=scratch,
    )


def names_for(spec: Spec) -> Callable[[], tuple[Signature, Namer]]:
    """A fresh ABI signature and name supply for each lowering of ``spec``."""

    def make_names() -> tuple[Signature, Namer]:
        namer = Namer()
        return signature(spec, namer), namer

    return make_names


def _bound_check(env: LowerEnv, space: Space) -> None:
    """`bound` promises an extent: the kernel returns a status when it does not hold."""
    assert space.bound is not None
    size, kind = space.bound
    (var,) = space.vars
    dim = env.inputs.sig.extent(var)
    bad = ir.Bin("!=" if kind == "MaxExact" else ">", dim, ir.IntLit(size))
    env.found.entry_checks.append(ir.Return(BOUND_VIOLATED, bad))
    env.found.bound_messages.append(
        f"{space.origin}: the extent of {var} must be "
        f"{'exactly' if kind == 'MaxExact' else 'at most'} {size}"
    )


def lower(
    spec: Spec,
    make_names: Callable[[], tuple[Signature, Namer]],
    *,
    schedule: Schedule,
    parallel: bool = True,
    mode: AssemblyMode = AssemblyMode.FILL,
    chunks_per_thread: int = CHUNKS_PER_THREAD,
) -> tuple[LoweredKernel, Signature]:
    """Lower ``spec`` under ``schedule`` (`middle.schedule.make_schedule`: its loops, its
    commands, the user's and the default policy's (`policy.schedules.cpu_default`), and its
    target; with no commands every loop is serial); a second pass stores with ``=`` when
    no element is written twice (the loops around each write bind exactly the output's
    indices), and drops the output zeroing when every element is written exactly once
    (plain dense loops over them all).

    ``make_names()`` returns a fresh ``(Signature, Namer)``, so both passes name alike.
    A sparse output is assembled in ``mode``'s phase (`AssemblyMode.of` makes it the
    layout's): COUNT lowers its assemble kernel (sizes only), FILL its numeric kernel,
    APPEND its single-pass kernel (serial, appending into arrays of a proven capacity,
    even where the two-phase kernel fills rows in parallel; APPEND_CHUNKS: in chunks of
    rows, see `chunks`), whose schedule is made with ``append`` too. ``chunks_per_thread``:
    a parallel CPU loop's dynamic chunks per thread (`policy.decision.Decision`).
    """
    sig, namer = make_names()
    per = chunks_per_thread
    if not spec.output.format.is_dense:
        env = LowerEnv(
            spec, sig, namer, parallel=parallel, mode=mode, schedule=schedule, chunks_per_thread=per
        )
        return lower_kernel(env), sig
    first = lower_kernel(
        LowerEnv(spec, sig, namer, parallel=parallel, schedule=schedule, chunks_per_thread=per)
    )
    if not (first.exclusive or first.once):
        return first, sig
    sig, namer = make_names()
    # every element written once: no zeroing, ``=``; at most once: zeroing, ``=``
    again = LowerEnv(
        spec,
        sig,
        namer,
        parallel=parallel,
        exclusive=first.exclusive,
        once=True,
        schedule=schedule,
        chunks_per_thread=per,
    )
    return lower_kernel(again), sig
