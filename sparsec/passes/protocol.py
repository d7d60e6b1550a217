"""The pass protocol: a pass takes the body so far with the notes of the passes before it
(`Passed`) and what it may read besides (`PassInput`); `run_passes` runs a target's list
(`sparsec.pipeline.lists`) in order."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..abi import Signature
from ..ir import nodes as ir
from ..middle.spec import Spec
from ..policy.decision import PassOptions


@dataclass(frozen=True, slots=True)
class Passed:
    """A kernel body after some passes: the notes each pass made (by pass name; a pass
    that changed nothing has none) and the parameters the passes added (`BAND`, `DEPTH`)."""

    body: ir.Block
    notes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    params: tuple[str, ...] = ()
    #: the fewest output rows a register tile holds together (`passes.tile`): each vector
    #: gathered from a dense operand serves at least that many (1: one row per tile)
    rows: int = 1

    def after(self, name: str, body: ir.Block, notes: tuple[str, ...]) -> Passed:
        return replace(self, body=body, notes={**self.notes, name: notes})

    def of(self, name: str) -> tuple[str, ...]:
        return self.notes.get(name, ())


@dataclass(frozen=True, slots=True)
class PassInput:
    """What a pass may read besides the body: the statement, the kernel's ABI, the passes'
    options (`Decision.passes`: which run, and each one's) and the last-level cache's size
    (read once per kernel: the template's threshold and the schedule's note must agree)."""

    spec: Spec
    sig: Signature
    options: PassOptions
    #: C only (the GPU passes read no cache size)
    llc: int = 0


#: a pass: IR -> IR, with what it did (see `Passed`)
Pass = Callable[[Passed, PassInput], Passed]


def run_passes(passes: tuple[Pass, ...], body: ir.Block, unit: PassInput) -> Passed:
    """``body`` through those of ``passes`` the decision runs (`PassOptions.run`)."""
    done = Passed(body)
    if unit.spec.semantics.semiring != "plus_times":
        # the passes' register tiles, bands and coarsened threads add with '+'
        return done
    for step in passes:
        if unit.options.runs(step.__name__.removeprefix("_")):
            done = step(done, unit)
    return done
