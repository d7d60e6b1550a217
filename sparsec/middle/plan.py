"""A schedule's commands applied to one loop nest: an immutable `Plan` the lowerer follows.

Loop-transforming commands apply in order to the default loop order; the new variables
keep their provenance (`Space`, `Piece`): every derived loop belongs to one *space*, an
integer range whose offset binds original index variables (a dense range, a tensor's
positions, or a fused product), and split pieces partition that offset. This is TACO's
provenance graph, specialised to the relations sparsec supports.

`make_plan` checks what the loop nest decides (the loops exist, new names are new, pos
walks one access's consecutive levels, split halves stay nested); `order.check_order` checks
the plan against the iteration graph's hard edges. What the plan cannot know (whether a
loop turns out dense, a merge, or racy) is checked by the lowerer, which raises
`ScheduleError` naming the command.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from ..base.errors import ScheduleError
from .commands import (
    ASSEMBLIES,
    BOUND_KINDS,
    MERGES,
    RACES,
    UNITS,
    Command,
    Races,
    Unit,
    parse_factor,
    pos_tensor,
)
from .precompute import Precompute, read_precompute


# ----------------------------------------------------------------- provenance
@dataclass(frozen=True, slots=True)
class Space:
    """An integer range [lo, lo+extent) whose offset binds original index variables.

    ``kind``: "dense" (one original variable, a plain range, maybe `bound`), "pos" (the
    positions of ``tensor``'s level of ``vars[0]``), "fused" (the product of dense ranges,
    row-major), "fusedpos" (the positions of ``tensor``'s last level of ``vars``).
    """

    name: str
    kind: str
    vars: tuple[str, ...]
    tensor: str = ""
    bound: tuple[int, str] | None = None
    #: the command that made this space (for error messages)
    origin: str = ""


@dataclass(frozen=True, slots=True)
class Piece:
    """One half of a split: ``parent = outer * F + inner`` (``divide``: F pieces)."""

    var: str
    parent: str
    space: str
    outer: bool
    factor: int
    divide: bool
    sibling: str
    origin: str


@dataclass(frozen=True, slots=True)
class Parallelize:
    var: str
    unit: Unit
    races: Races
    origin: str
    #: the command came from the default policy (`Command.policy`)
    default: bool = False


class _Provenance:
    """Queries over the provenance graph, shared by a `Plan` and the draft it is built from."""

    __slots__ = ()
    order: Sequence[str]
    spaces: Mapping[str, Space]
    pieces: Mapping[str, Piece]
    #: split children of a space or piece: (outer, inner)
    children: Mapping[str, tuple[str, str]]

    def space_of(self, var: str) -> str | None:
        """The space a loop variable belongs to (itself, or through split pieces)."""
        if var in self.spaces:
            return var
        piece = self.pieces.get(var)
        return piece.space if piece else None

    def leaves(self, var: str) -> list[str]:
        """The loop variables that together give ``var``'s offset (itself if unsplit)."""
        kids = self.children.get(var)
        if kids is None:
            return [var]
        return self.leaves(kids[0]) + self.leaves(kids[1])

    def origin(self, var: str) -> str:
        """The command that derived loop ``var``, for messages."""
        if var in self.pieces:
            return f"from {self.pieces[var].origin}"
        return f"from {self.spaces[var].origin}"


@dataclass(frozen=True, slots=True)
class Plan(_Provenance):
    """The schedule, resolved against one loop nest."""

    commands: tuple[Command, ...]
    order: tuple[str, ...]
    spaces: Mapping[str, Space]
    pieces: Mapping[str, Piece]
    children: Mapping[str, tuple[str, str]]
    parallel: Mapping[str, Parallelize]
    unroll: Mapping[str, int]
    mergeby: Mapping[str, str]
    assemble: Mapping[str, str]
    precompute: tuple[Precompute, ...]

    @property
    def transforms_loops(self) -> bool:
        return bool(self.spaces or self.precompute)

    def binds(self, loop: str) -> tuple[str, ...]:
        """Original index variables whose value is known once ``loop``'s iteration starts
        (the last leaf of a space binds all its variables)."""
        space = self.space_of(loop)
        if space is None:
            return (loop,)
        if self.leaves(space)[-1] == loop:
            return self.spaces[space].vars
        return ()

    def entry(self, space: str) -> int:
        """Position in `order` of the first loop of ``space``."""
        return min(self.order.index(v) for v in self.leaves(space))

    def describe(self) -> str:
        return ", ".join(str(c) for c in self.commands)


@dataclass
class _Draft(_Provenance):
    """A `Plan` while `make_plan` applies the commands one by one."""

    commands: tuple[Command, ...]
    order: list[str]
    spaces: dict[str, Space] = field(default_factory=dict)
    pieces: dict[str, Piece] = field(default_factory=dict)
    children: dict[str, tuple[str, str]] = field(default_factory=dict)
    parallel: dict[str, Parallelize] = field(default_factory=dict)
    unroll: dict[str, int] = field(default_factory=dict)
    mergeby: dict[str, str] = field(default_factory=dict)
    assemble: dict[str, str] = field(default_factory=dict)
    precompute: list[Precompute] = field(default_factory=list)

    def freeze(self) -> Plan:
        ro = MappingProxyType
        return Plan(
            self.commands,
            tuple(self.order),
            ro(self.spaces),
            ro(self.pieces),
            ro(self.children),
            ro(self.parallel),
            ro(self.unroll),
            ro(self.mergeby),
            ro(self.assemble),
            tuple(self.precompute),
        )


def make_plan(
    commands: tuple[Command, ...],
    order: tuple[str, ...],
    *,
    indices: tuple[str, ...],
    nested: tuple[str, ...],
    tensors: dict[str, int],
    output: str,
    tensor_levels: dict[str, list[tuple[str, ...]]],
) -> Plan:
    """Apply ``commands`` to the default loop ``order``.

    ``indices``: every index variable of the statement; ``nested``: those summed in a nested
    sum (their loops are not in ``order``); ``tensors``: name → order; ``tensor_levels``:
    for each input, the index variable of each storage level, per access.
    """
    plan = _Draft(commands, list(order))
    taken = set(indices) | set(tensors)

    def known_loop(var: str, command: Command) -> None:
        if var in plan.order:
            return
        if var in nested:
            raise ScheduleError(
                f"{command}: {var} is summed inside a nested sum, which runs in its own loop "
                f"nest (docs/semantics.md, Reductions); schedules apply to the outer loops "
                f"({', '.join(plan.order) or 'none here'}): drop the command, or write the "
                "statement so that the sum encloses what you want in its loop"
            )
        raise ScheduleError(
            f"{command}: {var!r} is not a loop of this kernel; the loops are "
            f"{', '.join(plan.order) or '(none)'}"
        )

    def new_name(var: str, command: Command) -> None:
        if var in taken:
            raise ScheduleError(
                f"{command}: {var!r} is already a tensor or index variable; pick a new name"
            )
        taken.add(var)

    def replace(old: list[str], new: list[str]) -> None:
        at = plan.order.index(old[0])
        plan.order[at : at + len(old)] = new

    for command in commands:
        a = command.args
        match command.name:
            case "reorder":
                for v in a:
                    known_loop(v, command)
                if len(set(a)) != len(a):
                    raise ScheduleError(f"{command}: a variable is listed twice")
                slots = sorted(plan.order.index(v) for v in a)
                for slot, v in zip(slots, a, strict=True):
                    plan.order[slot] = v
            case "split" | "divide":
                var, outer, inner = a[0], a[1], a[2]
                known_loop(var, command)
                factor = parse_factor(a[3], command)
                new_name(outer, command)
                new_name(inner, command)
                space = plan.space_of(var)
                if space is None:  # an original variable: its range becomes a space
                    space = var
                    plan.spaces[var] = Space(var, "dense", (var,), origin=str(command))
                divide = command.name == "divide"
                plan.pieces[outer] = Piece(
                    outer, var, space, True, factor, divide, inner, str(command)
                )
                plan.pieces[inner] = Piece(
                    inner, var, space, False, factor, divide, outer, str(command)
                )
                plan.children[var] = (outer, inner)
                replace([var], [outer, inner])
            case "pos":
                var, pvar = a[0], a[1]
                tensor, named = pos_tensor(a[2])
                known_loop(var, command)
                if tensor not in tensors:
                    raise ScheduleError(
                        f"{command}: {tensor!r} is not a tensor of this kernel "
                        f"({', '.join(tensors)})"
                    )
                if tensor == output:
                    raise ScheduleError(
                        f"{command}: {tensor} is the output; pos iterates the stored "
                        "positions of an input"
                    )
                if named is not None and not any(
                    sorted(named) == sorted(levels) for levels in tensor_levels.get(tensor, [])
                ):
                    raise ScheduleError(
                        f"{command}: {a[2]} is not an access of this kernel's statement; name "
                        f"{tensor} as the statement indexes it, or by its name alone"
                    )
                if var in plan.pieces or (var in plan.spaces and plan.spaces[var].kind != "fused"):
                    raise ScheduleError(
                        f"{command}: {var} is already derived ({plan.origin(var)}); pos "
                        "applies to an original index variable or to a fuse of them"
                    )
                covered = plan.spaces[var].vars if var in plan.spaces else (var,)
                _check_pos_levels(command, tensor, covered, tensor_levels[tensor])
                new_name(pvar, command)
                plan.spaces.pop(var, None)
                kind = "fusedpos" if len(covered) > 1 else "pos"
                plan.spaces[pvar] = Space(pvar, kind, covered, tensor, origin=str(command))
                replace([var], [pvar])
            case "fuse":
                outer, inner, joint = a
                known_loop(outer, command)
                known_loop(inner, command)
                if plan.order.index(inner) != plan.order.index(outer) + 1:
                    raise ScheduleError(
                        f"{command}: {outer} must directly enclose {inner}, but the loop "
                        f"order is {', '.join(plan.order)}; reorder them first"
                    )
                parts: list[str] = []
                for v in (outer, inner):
                    if v in plan.pieces or (v in plan.spaces and plan.spaces[v].kind != "fused"):
                        raise ScheduleError(
                            f"{command}: {v} is already derived ({plan.origin(v)}); fuse "
                            "applies to original index variables or earlier fuses"
                        )
                    parts += plan.spaces.pop(v).vars if v in plan.spaces else [v]
                new_name(joint, command)
                plan.spaces[joint] = Space(joint, "fused", tuple(parts), origin=str(command))
                replace([outer, inner], [joint])
            case "bound":
                var, bvar = a[0], a[1]
                known_loop(var, command)
                if var in plan.pieces or var in plan.spaces:
                    raise ScheduleError(
                        f"{command}: {var} is already derived; bound applies to an original "
                        "index variable"
                    )
                size = parse_factor(a[2], command)
                if a[3] not in BOUND_KINDS:
                    raise ScheduleError(
                        f"{command}: bound kind {a[3]!r} is not supported; use "
                        f"{' or '.join(BOUND_KINDS)}"
                    )
                new_name(bvar, command)
                plan.spaces[bvar] = Space(
                    bvar, "dense", (var,), bound=(size, a[3]), origin=str(command)
                )
                replace([var], [bvar])
            case "precompute":
                plan.precompute.append(read_precompute(command, indices, nested, new_name))
            case "unroll":
                plan.unroll[a[0]] = parse_factor(a[1], command)
            case "parallelize":
                var, unit, races = a
                if unit not in UNITS:
                    raise ScheduleError(
                        f"{command}: unknown unit {unit!r}; units: {', '.join(UNITS)}"
                    )
                if races not in RACES:
                    raise ScheduleError(
                        f"{command}: unknown race strategy {races!r}; strategies: "
                        f"{', '.join(RACES)}"
                    )
                if var in plan.parallel:
                    raise ScheduleError(f"{command}: {var} is already parallelized")
                origin = str(command)
                plan.parallel[var] = Parallelize(
                    var, Unit(unit), Races(races), origin, command.policy
                )
            case "assemble":
                tensor, how = a[0], a[1]
                if tensor != output:
                    raise ScheduleError(
                        f"{command}: assemble names the output ({output}), not {tensor!r}"
                    )
                if how not in ASSEMBLIES:
                    raise ScheduleError(
                        f"{command}: strategy {how!r} is not one of {', '.join(ASSEMBLIES)}"
                    )
                # a[2], TACO's separatelySchedulable, makes the assembly's queries a
                # statement of their own that can be scheduled; sparsec's assembly has
                # no such statement (its counting pass follows the compute's schedule)
                plan.assemble[tensor] = how
            case "mergeby":
                if a[1] not in MERGES:
                    raise ScheduleError(
                        f"{command}: strategy {a[1]!r} is not one of {', '.join(MERGES)}"
                    )
                plan.mergeby[a[0]] = a[1]
            case _:
                raise AssertionError(command)
    for table, what in ((plan.parallel, "parallelize"), (plan.unroll, "unroll")):
        for var in table:
            if var not in plan.order:
                raise ScheduleError(
                    f"{what}({var},...): {var!r} is not a loop after the schedule's "
                    f"transformations; the loops are {', '.join(plan.order)}"
                )
    for var in plan.mergeby:
        if var not in plan.order and any(var in sp.vars for sp in plan.spaces.values()):
            # TACO's mergeby(i, ...) then split/pos/fuse of i: the derived loops are ranges
            # or position loops, which merge nothing (pos locates other sparse operands
            # by galloping); TACO calls it a no-op
            continue
        if var not in plan.order:
            raise ScheduleError(
                f"mergeby({var},...): {var!r} is not a loop; the loops are {', '.join(plan.order)}"
            )
        if plan.space_of(var) is not None:
            raise ScheduleError(
                f"mergeby({var},...): {var} is a derived loop; mergeby applies to a loop "
                "that co-iterates sparse operands"
            )
    if len(plan.precompute) > 1:
        raise ScheduleError("one precompute per kernel is supported")
    done = plan.freeze()
    _check_splits(done)
    return done


def _check_pos_levels(
    command: Command, tensor: str, fused: tuple[str, ...], accesses: list[tuple[str, ...]]
) -> None:
    if len(accesses) != 1:
        raise ScheduleError(
            f"{command}: {tensor} is accessed {len(accesses)} times; pos needs one access"
        )
    levels = accesses[0]
    if fused[0] not in levels:
        raise ScheduleError(
            f"{command}: {tensor} is not indexed by {fused[0]} ({tensor} is indexed by "
            f"{', '.join(levels) or 'nothing'})"
        )
    first = levels.index(fused[0])
    if tuple(levels[first : first + len(fused)]) != fused:
        raise ScheduleError(
            f"{command}: the fused variables {', '.join(fused)} are not consecutive storage "
            f"levels of {tensor} (its levels hold {', '.join(levels)})"
        )


def _check_splits(plan: Plan) -> None:
    """Split halves stay nested: every leaf of the outer half before every leaf of the inner."""
    for parent, (outer, inner) in plan.children.items():
        last_outer = max(plan.order.index(v) for v in plan.leaves(outer))
        first_inner = min(plan.order.index(v) for v in plan.leaves(inner))
        if last_outer > first_inner:
            raise ScheduleError(
                f"{plan.pieces[outer].origin}: {outer} must enclose {inner} (the inner "
                f"range depends on the outer index), but the loop order is "
                f"{', '.join(plan.order)}"
            )
        del parent
