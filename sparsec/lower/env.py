"""The lowering environment (MLIR's ``CodegenEnv``): the immutable `Inputs` of one
lowering, what is `Decided` before the loop nest (the middle end's schedule and what
follows from it), what is `Found` while building it, and the scoped `Flags` of the point
being lowered; each attribute is reached through its part (``env.found.notes``).

Every lowering function takes the `LowerEnv` as its first argument. A loop body that runs
under other rules (on threads, atomically, into a private copy) is lowered inside
``with env.scope(flag=value):``, which restores the enclosing flags on the way out.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import TypedDict, Unpack

from ..abi import Namer, Signature
from ..base.target import Target
from ..frontend.concrete import Sum, exact
from ..frontend.notation import Access
from ..frontend.semirings import Semiring, semiring
from ..ir import nodes as ir
from ..middle.plan import Plan
from ..middle.schedule import Schedule
from ..middle.spec import Spec
from ..policy.decision import CHUNKS_PER_THREAD
from ..tensors.formats import Format, dense
from ..tensors.layout import AssemblyMode
from .assemble import Assembler
from .ctx import Where


@dataclass(frozen=True, slots=True)
class Flags:
    """The rules in force at the point being lowered, set for a loop body by `scope`."""

    #: inside a CPUThread loop / a CPUVector loop
    in_threads: bool = False
    in_vector: bool = False
    #: stores into the output or an accumulator are atomic (a racy loop with Atomics)
    atomic_writes: bool = False
    #: this thread's private copy of the output's vals (Temporary), instead of vals
    out_redirect: str | None = None
    #: inside the loops of a precompute workspace
    in_where: bool = False
    #: inside a precompute's consumer, whose stores count only where the workspace's
    #: slot was reached (`where.emit_where`): the thread's marks, the workspace's
    #: variables, and whether only a floating type reads them
    ws_marks: tuple[str, tuple[str, ...], bool] | None = None
    #: inside the steps of a statement lowered as a sequence (`sequence.emit_sequence`)
    in_sequence: bool = False
    #: GPU units of the loops enclosing the point, outermost first
    gpu_units: tuple[str, ...] = ()
    #: lanes per group of the enclosing "group" loop (a GPUThread loop over sub-warp
    #: groups; 0: a whole warp, the target's `Target.lanes`)
    group_lanes: int = 0
    #: the innermost plain GPUThread loop (strided by the block's threads): its schedule
    #: name, variable and trip count, which tell the lanes of a warp that run an iteration
    thread_loop: tuple[str, str, ir.Expr] | None = None
    #: the store is lane 0's (a warp's sum) / one part of a shared accumulator, atomic
    lane0: bool = False
    partial: bool = False
    #: the loop's appends were capacity-checked up front (`Assembler.precheck`)
    checked: bool = False
    #: sparse output: per nested sum of the statement being stored, the flag its loops
    #: set when they reach a term (see `lowerer.presence`)
    reached_of: dict[Sum, str] = field(default_factory=dict)


class FlagChanges(TypedDict, total=False):
    """Changes to the `Flags` in force, by field (`LowerEnv.scope`, `races.LoopSetup`):
    mypy checks each change's name and type here, and these types against `Flags`' where
    `scope` applies them; `Flags` says what each flag means."""

    in_threads: bool
    in_vector: bool
    atomic_writes: bool
    out_redirect: str | None
    in_where: bool
    ws_marks: tuple[str, tuple[str, ...], bool] | None
    in_sequence: bool
    gpu_units: tuple[str, ...]
    group_lanes: int
    thread_loop: tuple[str, str, ir.Expr] | None
    lane0: bool
    partial: bool
    checked: bool
    reached_of: dict[Sum, str]


_FLAG_NAMES = frozenset(f.name for f in fields(Flags))
# one list of flags: a field of Flags no change can set, or a change of no flag, is a slip
assert FlagChanges.__optional_keys__ == _FLAG_NAMES, "FlagChanges must name Flags' fields"

#: no schedule decided: no loops, no commands (an environment built to lower parts of a
#: statement, not a whole kernel)
UNSCHEDULED = Schedule(())


@dataclass(frozen=True, slots=True)
class Inputs:
    """What one lowering is given: the statement, the kernel's names, and how it stores."""

    spec: Spec
    sig: Signature
    namer: Namer
    #: tensor formats by name, a dense precompute's workspace's among them (complete
    #: from the start: nothing adds to it)
    formats: dict[str, Format]
    lhs: Access
    #: what the kernel is lowered for: OpenMP loops, or GPU loops (the runtime zeroes
    #: the output)
    target: Target
    gpu: bool
    #: threads may be used at all (``schedule="serial"`` turns them off)
    threads_ok: bool
    #: dense-exact lowering (see `lattice.build`) when the expression may make inf/NaN
    exact: bool
    #: the algebra of ``*`` and the sums (`frontend.semirings`; plus_times by default)
    ring: Semiring
    #: second pass: output writes are known to be exclusive (see `lower`)
    exclusive: bool
    #: second pass: no element is written twice, but some may never be (zeroed first)
    once: bool
    out_op: str
    #: a parallel CPU loop's dynamic chunks per thread (`policy.decision.Decision`)
    chunks_per_thread: int


@dataclass(slots=True)
class Decided:
    """What runs: the middle end's `Schedule` and what the lowering decides from it before
    the loop nest (`entry.lower_kernel`); the nest only reads it."""

    #: what runs, decided by the middle end (`middle.schedule`) before the lowering
    schedule: Schedule
    #: the C name of each index variable, the plan's new loops (split pieces, pos, fuse) too
    var_names: dict[str, str]
    #: sparse output: the kernel assembles pos/crd/vals, in its `AssemblyMode`
    assembler: Assembler | None
    #: a dense precompute's placement, its workspaces allocated (`where.plan_where`)
    where: Where | None = None
    #: zero the output slice of each outermost iteration (cache-hot) instead of up front
    zero_in_loop: bool = False

    @property
    def plan(self) -> Plan | None:
        """The schedule's plan (None: no commands)."""
        return self.schedule.plan

    @property
    def sequence(self) -> str:
        """The statement lowered as a sequence of steps inside its shared loops, in words
        (`sequence`: its sums under +/- have no fused loop order); "": one fused nest."""
        return self.schedule.sequence

    @property
    def workspace(self) -> str | None:
        """Index of the output's last level when it is scattered into a workspace."""
        return self.schedule.workspace


@dataclass(slots=True)
class Found:
    """What the lowering collects while it builds the loop nest."""

    #: the trip count of the GPUBlock loop (the launch's grid)
    grid: ir.Expr | None = None
    #: per-thread accumulators whose lanes a warp adds up (ParallelReduction on a lane
    #: loop in the accumulator's scope) before lane 0 stores the warp's sum
    warp_reduced: set[str] = field(default_factory=set)
    #: of those, the ones a group of fewer lanes adds up, with the group's lanes
    group_reduced: dict[str, int] = field(default_factory=dict)
    #: a warp's lanes combine their last runs of atomic stores (`output.flush_runs`)
    segmented: bool = False
    #: accumulators that a GPU loop with Atomics shares (its threads, warps or blocks
    #: each hold a part), so each part is added atomically into the output
    partial_accs: set[str] = field(default_factory=set)
    #: the GPU units of the loops in each accumulator's scope ("lane": a GPUThread loop
    #: inside a GPUWarp loop)
    acc_units: dict[str, set[str]] = field(default_factory=dict)
    #: local arrays read like tensors (precompute workspaces): tensor name -> C name
    local_vals: dict[str, str] = field(default_factory=dict)
    #: how each parallel loop runs, in words
    notes: list[str] = field(default_factory=list)
    #: the schedule's checks at entry (`bound`) and what each promises
    entry_checks: list[ir.Stmt] = field(default_factory=list)
    bound_messages: list[str] = field(default_factory=list)
    #: allocations at the start of the kernel and their release at the end
    top: list[ir.Stmt] = field(default_factory=list)
    bottom: list[ir.Stmt] = field(default_factory=list)
    #: per output write site: does it write each element exactly once?
    write_sites: list[bool] = field(default_factory=list)
    #: some write may store into an element another write (or iteration) stored into
    repeats: bool = False
    parallel_loops: list[str] = field(default_factory=list)
    #: the outermost loop zeroed the output's slices itself
    zeroed_slices: bool = False


class LowerEnv:
    """One lowering: its `inputs`, what is `decided` before the nest, what is `found`
    while building it, and the scoped `flags`."""

    __slots__ = ("inputs", "decided", "found", "flags")

    def __init__(
        self,
        spec: Spec,
        sig: Signature,
        namer: Namer,
        *,
        parallel: bool = True,
        exclusive: bool = False,
        once: bool = False,
        mode: AssemblyMode = AssemblyMode.FILL,
        schedule: Schedule = UNSCHEDULED,
        chunks_per_thread: int = CHUNKS_PER_THREAD,
    ) -> None:
        formats = spec.formats
        placed = schedule.placement
        if placed is not None:  # the workspace is read like a tensor
            formats[placed.workspace.name] = dense(len(placed.vars))
        self.inputs = Inputs(
            spec,
            sig,
            namer,
            formats,
            spec.statement.lhs,
            schedule.target,
            schedule.target.gpu,
            parallel,
            exact(spec.statement.rhs, spec.semantics.division),
            semiring(spec.semantics.semiring),
            exclusive,
            once,
            "=" if exclusive or once else "+=",
            chunks_per_thread,
        )
        var_names = {i: namer.fresh(i) for i in spec.indices}
        out = spec.output
        asm = None
        if not out.format.is_dense:
            asm = Assembler(out, spec.statement.lhs, sig, namer, var_names, mode)
        for v in schedule.plan.order if schedule.plan is not None else ():
            if v not in var_names:
                var_names[v] = namer.fresh(v)
        self.decided = Decided(schedule, var_names, asm)
        self.found = Found()
        self.flags = Flags()

    @contextmanager
    def scope(self, **changes: Unpack[FlagChanges]) -> Iterator[Flags]:
        """Lower what the block builds with ``changes`` to the `Flags` in force (their
        names and types are `FlagChanges`'; another name is a TypeError); the enclosing
        flags come back on the way out."""
        saved = self.flags
        # most loop bodies change nothing, and a replace costs a few microseconds; a value
        # that is not the very object in force (a fresh dict) always makes new flags
        unknown = changes.keys() - _FLAG_NAMES
        if unknown:
            raise TypeError(f"no lowering flag named {', '.join(sorted(unknown))}")
        if any(getattr(saved, name) is not value for name, value in changes.items()):
            self.flags = replace(saved, **changes)
        try:
            yield self.flags
        finally:
            self.flags = saved
