"""What the lowering knows at one point of the loop nest (`Ctx`), and where a value goes
(the sinks). All immutable: a loop extends its body's context with `Ctx.bind`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..frontend.concrete import CExpr
from ..frontend.notation import Access
from ..ir import nodes as ir
from ..middle.placement import Placement


@dataclass(frozen=True, slots=True)
class Position:
    """A storage level whose position is known: ``pos`` and the end of its segment."""

    pos: ir.Expr
    next: ir.Expr


def unit(pos: ir.Expr) -> Position:
    """A position whose segment holds it alone (``[p, p + 1)``)."""
    return Position(pos, ir.Bin("+", pos, ir.IntLit(1)))


@dataclass(frozen=True, slots=True)
class SpaceState:
    """A schedule space once entered: its range, and per fused level its position range."""

    lo: ir.Expr
    extent: ir.Expr
    #: (lo, hi) of the positions of each level of a fused position space
    levels: tuple[tuple[ir.Expr, ir.Expr], ...] = ()


@dataclass(frozen=True, slots=True)
class Ctx:
    """What is known at a point of the loop nest (immutable; extended by `bind`)."""

    coords: dict[str, ir.Expr] = field(default_factory=dict)
    levels: dict[tuple[Access, int], Position] = field(default_factory=dict)
    #: variables bound by plain dense loops, which visit every coordinate exactly once
    covered: frozenset[str] = frozenset()
    #: values of the schedule's derived loop variables (split pieces, pos, fuse)
    loopvars: dict[str, ir.Expr] = field(default_factory=dict)
    #: ranges of the schedule's spaces entered so far
    spaces: dict[str, SpaceState] = field(default_factory=dict)

    def bind(
        self,
        coords: dict[str, ir.Expr] | None = None,
        levels: dict[tuple[Access, int], Position] | None = None,
        covered: str | None = None,
        loopvars: dict[str, ir.Expr] | None = None,
        spaces: dict[str, SpaceState] | None = None,
    ) -> Ctx:
        return replace(
            self,
            coords={**self.coords, **(coords or {})},
            levels={**self.levels, **(levels or {})},
            covered=self.covered | {covered} if covered else self.covered,
            loopvars={**self.loopvars, **(loopvars or {})},
            spaces={**self.spaces, **(spaces or {})},
        )

    def depth(self, access: Access) -> int:
        """Number of leading levels of ``access`` whose positions are known."""
        k = 0
        while (access, k) in self.levels:
            k += 1
        return k


# ------------------------------------------------------------------- sinks
@dataclass(frozen=True, slots=True)
class OutputSink:
    """Store into the output at the context's output position."""


@dataclass(frozen=True, slots=True)
class AccSink:
    """Add into the scalar accumulator ``name`` (``""``: counting, no value)."""

    name: str
    #: set to 1 when a term is added (sparse outputs store only reached entries)
    flag: str = ""


@dataclass(frozen=True, slots=True)
class WorkspaceSink:
    """Scatter into a dense workspace over the output's last level (Gustavson)."""


@dataclass(frozen=True, slots=True)
class DenseWsSink:
    """Add into a precompute workspace ``array`` at the coordinates of ``vars``
    (row-major, `where.ws_slot`); with ``reset``, store the add's identity there instead
    (the producer's loops run again to clear what they filled, `where.emit_where`)."""

    array: str
    vars: tuple[str, ...]
    reset: bool = False
    #: this thread's marks (`Where.marks`), set with each add and cleared with each reset
    marks: str | None = None
    float_only: bool = False


@dataclass(frozen=True, slots=True)
class SegmentSink:
    """Atomic stores from a serial loop, combined while they hit the same output element:
    ``acc`` sums the run, ``at`` holds its element (-1 before the first)."""

    acc: str
    at: str


Sink = OutputSink | AccSink | WorkspaceSink | DenseWsSink | SegmentSink

#: lowers the loops ``order`` of ``expr`` into ``sink`` in ``ctx`` (`lowerer.loops`)
Nest = Callable[[tuple[str, ...], CExpr, Ctx, Sink], ir.Block]


@dataclass(frozen=True, slots=True)
class NestPoint:
    """The point of the nest being lowered: ``expr`` in ``ctx``, with the loops ``rest``
    still to lower inside it, into ``sink``, by ``nest``."""

    expr: CExpr
    ctx: Ctx
    rest: tuple[str, ...]
    sink: Sink
    nest: Nest

    def inside(self, ctx: Ctx, sink: Sink | None = None) -> ir.Block:
        """The loops ``rest`` lowered in ``ctx`` (into ``sink``, else the point's)."""
        return self.nest(self.rest, self.expr, ctx, self.sink if sink is None else sink)


@dataclass(frozen=True, slots=True)
class Where:
    """A dense precompute the schedule placed (`middle.placement.Placement`: ``ws(vars) =
    producer`` then ``consumer`` reads ``ws``), with the threads' workspaces allocated."""

    placed: Placement
    #: the C name of the allocation that holds every thread's workspace
    base: str
    #: the allocation of every thread's marks (a byte per slot: its producer reached it),
    #: where the consumer multiplies by a workspace whose cleared value does not
    #: annihilate every value (`where.marks_needed`); None where it does
    marks: str | None = None
    #: the marks are read only where the kernel's type is floating (0 annihilates every
    #: integer under plus_times: the template's ``SC_ZERO_ANNIHILATES``)
    float_only: bool = False
