"""The race analysis: can two iterations of a parallel loop write one output element
(`race`), and which strategies carry a racy loop (`race_strategies`). A `LoopSetup` is
what `parallel.loop_setup` decides for one loop."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import nodes as ir
from ..middle.commands import Races, Unit
from .ctx import AccSink, Sink
from .env import FlagChanges, LowerEnv


@dataclass(frozen=True, slots=True)
class Loop:
    """A loop being set up (`parallel.loop_setup`): its variable, the original variables
    in which any two of its iterations are sure to differ, where its stores go, "for" or
    why it is a while loop, its trip count, and whether it is the kernel's first."""

    var: str
    distinct: frozenset[str]
    sink: Sink
    kind: str
    trip: ir.Expr
    outermost: bool = False


@dataclass
class LoopSetup:
    """How one loop runs (see `parallel.loop_setup`)."""

    parallel: ir.Parallel | None = None
    unroll: int = 0
    #: statements before the loop, at the start of its body, and after it
    pre: list[ir.Stmt] = field(default_factory=list)
    body_pre: list[ir.Stmt] = field(default_factory=list)
    post: list[ir.Stmt] = field(default_factory=list)
    #: the changes to the `Flags` its body is lowered under (`LowerEnv.scope`): changes,
    #: not a snapshot, since the body may be lowered inside a scope opened after the
    #: setup (`coiterate.capacity_checked`)
    flags: FlagChanges = field(default_factory=FlagChanges)


def race(env: LowerEnv, loop: str, distinct: frozenset[str], sink: Sink) -> str | None:
    """Why two iterations of ``loop`` can write one output element, or None if they
    cannot: its iterations differ in ``distinct``, and writes go to ``sink``."""
    out = env.inputs.lhs.name
    if isinstance(sink, AccSink):
        return (
            f"every index of {out} is bound outside {loop}, so all its iterations add "
            "into one element"
        )
    if distinct and distinct <= set(env.inputs.lhs.indices):
        return None
    return (
        f"{out} is indexed by {', '.join(env.inputs.lhs.indices) or 'nothing'}, and two "
        f"iterations of {loop} can share those coordinates"
    )


def race_strategies(env: LowerEnv, unit: Unit, into_sum: bool) -> list[Races]:
    """The race strategies `loop_setup` carries out for a racy CPU loop of ``unit``
    (``into_sum``: its iterations add into a scalar accumulator, not the output)."""
    table = (
        (Races.Atomics, unit == Unit.CPUThread and env.decided.assembler is None),
        (Races.Temporary, into_sum or unit == Unit.CPUThread),
        (Races.ParallelReduction, into_sum),
    )
    return [name for name, applies in table if applies]


def why_not(env: LowerEnv, races: Races, unit: Unit) -> str:
    """Why strategy ``races`` cannot serve a racy CPU loop of ``unit`` (see `race_strategies`)."""
    out = env.inputs.lhs.name
    if races == Races.Atomics and unit != Unit.CPUThread:
        return f"{unit} loops make no atomic updates"
    if races == Races.Atomics:
        return f"the sparse output {out} is appended entry by entry, never updated in place"
    return f"the loop adds straight into {out}, not into a sum of its own"
