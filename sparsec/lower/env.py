"""The lowering environment (MLIR's ``CodegenEnv``): the immutable inputs of one lowering,
what it decides before the loop nest and collects while building it, and the scoped
`Flags` of the point being lowered.

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
from ..frontend.concrete import Sum, exact
from ..frontend.semirings import semiring
from ..ir import nodes as ir
from ..middle.plan import Plan
from ..middle.schedule import Schedule
from ..middle.spec import Spec
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
    #: inside the steps of a statement lowered as a sequence (`sequence.emit_sequence`)
    in_sequence: bool = False
    #: GPU units of the loops enclosing the point, outermost first
    gpu_units: tuple[str, ...] = ()
    #: lanes per group of the enclosing "group" loop (a GPUThread loop over sub-warp
    #: groups; 32: a whole warp)
    group_lanes: int = 32
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


class LowerEnv:
    """One lowering: inputs, decisions, findings, and the scoped `flags`."""

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
    ) -> None:
        # ------------------------------------------------------------ inputs
        self.spec = spec
        self.sig = sig
        self.namer = namer
        #: tensor formats by name (a precompute adds its workspace's)
        self.formats = spec.formats
        self.lhs = spec.statement.lhs
        #: what runs, decided by the middle end (`middle.schedule`) before the lowering
        self.schedule = schedule
        #: "c" (OpenMP loops) or "cuda" (GPU loops; the runtime zeroes the output)
        self.target = schedule.target
        self.gpu = schedule.target == "cuda"
        #: the schedule: the user's commands and the default policy's (`Command.policy`)
        self.commands = schedule.commands
        #: threads may be used at all (``schedule="serial"`` turns them off)
        self.threads_ok = parallel
        #: dense-exact lowering (see `lattice.build`) when the expression may make inf/NaN
        self.exact = exact(spec.statement.rhs, spec.semantics.division)
        #: the algebra of ``*`` and the sums (`frontend.semirings`; plus_times by default)
        self.ring = semiring(spec.semantics.semiring)
        #: second pass: output writes are known to be exclusive (see `lower`)
        self.exclusive = exclusive
        #: second pass: no element is written twice, but some may never be (zeroed first)
        self.once = once
        self.out_op = "=" if exclusive or once else "+="
        self.var_names = {i: namer.fresh(i) for i in spec.indices}
        #: sparse output: the kernel assembles pos/crd/vals, in ``mode`` (made the layout's)
        self.assembler = (
            None
            if spec.output.format.is_dense
            else Assembler(
                spec.output,
                self.lhs,
                sig,
                namer,
                self.var_names,
                mode,
            )
        )
        # ------------------------------------------- decided before the nest
        #: the schedule's plan (None: no commands)
        self.plan: Plan | None = schedule.plan
        #: the plan's new loop variables (split pieces, pos, fuse) named after the output's
        for v in self.plan.order if self.plan is not None else ():
            if v not in self.var_names:
                self.var_names[v] = namer.fresh(v)
        #: a dense precompute's placement, its workspaces allocated (`where.plan_where`)
        self.where: Where | None = None
        #: the statement lowered as a sequence of steps inside its shared loops, in words
        #: (`sequence`: its sums under +/- have no fused loop order); "": one fused nest
        self.sequence = schedule.sequence
        #: index of the output's last level when it is scattered into a workspace
        self.workspace: str | None = schedule.workspace
        #: zero the output slice of each outermost iteration (cache-hot) instead of up front
        self.zero_in_loop = False
        # ------------------------------------------- found while lowering
        #: the trip count of the GPUBlock loop (the launch's grid)
        self.grid: ir.Expr | None = None
        #: per-thread accumulators whose lanes a warp adds up (ParallelReduction on a lane
        #: loop in the accumulator's scope) before lane 0 stores the warp's sum
        self.warp_reduced: set[str] = set()
        #: of those, the ones a group of fewer lanes adds up, with the group's lanes
        self.group_reduced: dict[str, int] = {}
        #: a warp's lanes combine their last runs of atomic stores (`output.flush_runs`)
        self.segmented = False
        #: accumulators that a GPU loop with Atomics shares (its threads, warps or blocks
        #: each hold a part), so each part is added atomically into the output
        self.partial_accs: set[str] = set()
        #: the GPU units of the loops in each accumulator's scope ("lane": a GPUThread loop
        #: inside a GPUWarp loop)
        self.acc_units: dict[str, set[str]] = {}
        #: local arrays read like tensors (precompute workspaces): tensor name -> C name
        self.local_vals: dict[str, str] = {}
        #: how each parallel loop runs, in words
        self.notes: list[str] = []
        #: the schedule's checks at entry (`bound`) and what each promises
        self.entry_checks: list[ir.Stmt] = []
        self.bound_messages: list[str] = []
        #: allocations at the start of the kernel and their release at the end
        self.top: list[ir.Stmt] = []
        self.bottom: list[ir.Stmt] = []
        #: per output write site: does it write each element exactly once?
        self.write_sites: list[bool] = []
        #: some write may store into an element another write (or iteration) stored into
        self.repeats = False
        self.parallel_loops: list[str] = []
        #: the outermost loop zeroed the output's slices itself
        self.zeroed_slices = False
        # ------------------------------------------------------------ scoped
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
