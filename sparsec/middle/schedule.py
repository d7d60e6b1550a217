"""The scheduling language: TACO's commands (Senanayake et al., OOPSLA 2020) over sparsec's
loop nest, parsed, validated and turned into a `Plan` the lowerer follows.

A schedule is a list of commands (or one string of commands separated by commas):

    reorder(i, j, ...)            permute these loops among the slots they occupy
    split(i, i0, i1, F)           i = i0*F + i1, with i1 < F           (F > 0)
    divide(i, i0, i1, F)          i0 < F pieces of ceil(N/F)           (F > 0)
    pos(i, ip, A)                 iterate A's stored positions of i's level
    fuse(i, j, f)                 one loop f over the (i, j) pairs (i directly encloses j)
    precompute(expr, i, iw)       compute expr into a dense workspace over i
    unroll(i, F)                  ask the C compiler to unroll i's loop F times
    bound(i, ib, B, kind)         i's extent is B (MaxExact) or at most B (MaxConstraint)
    parallelize(i, unit, races)   units CPUThread, CPUVector (GPUBlock, GPUWarp, GPUThread on
                                  CUDA); races NoRaces, IgnoreRaces, Atomics, Temporary,
                                  ParallelReduction
    assemble(T, Append|Insert)    how the sparse output T is built
    mergeby(i, TwoFinger|Gallop)  how i's intersection advances the lagging iterators

Loop-transforming commands apply in order to the default loop order; the new variables
keep their provenance (`Space`, `Piece`): every derived loop belongs to one *space*, an
integer range whose offset binds original index variables (a dense range, a tensor's
positions, or a fused product), and split pieces partition that offset. This is TACO's
provenance graph, specialised to the relations sparsec supports.

What the plan cannot know (whether a loop turns out dense, a merge, or racy) is checked by
the lowerer, which raises `ScheduleError` naming the command.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ScheduleError
from ..frontend.notation import Access, BinOp, Literal, Neg
from ..frontend.parser import parse

CPU_UNITS = ("CPUThread", "CPUVector")
GPU_UNITS = ("GPUBlock", "GPUWarp", "GPUThread")
UNITS = CPU_UNITS + GPU_UNITS
RACES = ("NoRaces", "IgnoreRaces", "Atomics", "Temporary", "ParallelReduction")
BOUND_KINDS = ("MaxExact", "MaxConstraint")
MERGES = ("TwoFinger", "Gallop")
ASSEMBLIES = ("Append", "Insert")

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_COMMANDS = 64
MAX_FACTOR = 1 << 20


# ------------------------------------------------------------------- commands
@dataclass(frozen=True, slots=True)
class Command:
    """One parsed command: its name, arguments (as text) and its normalised spelling."""

    name: str
    args: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.name}({','.join(self.args)})"


_ARITY = {
    "reorder": None,
    "split": 4,
    "divide": 4,
    "pos": 3,
    "fuse": 3,
    "precompute": 3,
    "unroll": 2,
    "bound": 4,
    "parallelize": 3,
    "assemble": 2,
    "mergeby": 2,
}


def _split_top(text: str, where: str) -> list[tuple[str, int]]:
    """Split at commas outside parentheses; each part with its offset in ``text``."""
    parts: list[tuple[str, int]] = []
    depth, start = 0, 0
    for n, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ScheduleError(f"unbalanced ')' in {where} {text!r}")
        elif ch == "," and depth == 0:
            parts.append((text[start:n], start))
            start = n + 1
    if depth != 0:
        raise ScheduleError(f"unbalanced '(' in {where} {text!r}")
    parts.append((text[start:], start))
    return parts


def parse_commands(schedule: str | Sequence[str]) -> tuple[Command, ...]:
    """Commands from one string (commas between commands) or a list of strings."""
    if isinstance(schedule, str):
        texts = [schedule]
    elif isinstance(schedule, Sequence) and all(isinstance(s, str) for s in schedule):
        texts = list(schedule)
    elif isinstance(schedule, Sequence):
        bad = next(s for s in schedule if not isinstance(s, str))
        raise ScheduleError(
            f"a schedule is a string or a list of strings; this list holds {bad!r} "
            f"({type(bad).__name__}), not a command string: write e.g. schedule=['split(i,i0,i1,16)', "
            "'parallelize(i0,CPUThread,NoRaces)'] or one string with commas between commands"
        )
    else:
        raise ScheduleError(
            f"a schedule is a string or a list of strings, not {type(schedule).__name__}; "
            "write e.g. schedule='split(i,i0,i1,16), parallelize(i0,CPUThread,NoRaces)'"
        )
    commands: list[Command] = []
    for text in texts:
        if len(text) > 10_000:
            raise ScheduleError(f"schedule text is too long ({len(text)} characters)")
        for part, _ in _split_top(text, "schedule"):
            if not part.strip():
                if len(texts) == 1 and not text.strip():
                    continue
                raise ScheduleError(f"empty command in schedule {text!r}")
            commands.append(_command(part.strip()))
    if len(commands) > MAX_COMMANDS:
        raise ScheduleError(f"a schedule has at most {MAX_COMMANDS} commands")
    return tuple(commands)


def _command(text: str) -> Command:
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\s*\((.*)\)", text, re.S)
    if m is None:
        raise ScheduleError(
            f"cannot read schedule command {text!r}: expected name(arguments), e.g. "
            "split(i,i0,i1,16)"
        )
    name, inner = m.group(1), m.group(2)
    if name not in _ARITY:
        raise ScheduleError(
            f"unknown schedule command {name!r} in {text!r}; commands: {', '.join(_ARITY)}"
        )
    args = tuple(a.strip() for a, _ in _split_top(inner, f"{name}(...)"))
    if args == ("",):
        args = ()
    want = _ARITY[name]
    if want is not None and len(args) != want:
        raise ScheduleError(f"{name} takes {want} arguments, got {len(args)} in {text!r}")
    if want is None and len(args) < 2:
        raise ScheduleError(f"{name} needs at least two index variables, got {text!r}")
    for n, a in enumerate(args):
        if not a:
            raise ScheduleError(f"argument {n + 1} of {text!r} is empty")
        if name == "precompute" and n == 0:
            continue
        if not _IDENT.match(a) and not re.fullmatch(r"[+-]?[0-9]+", a):
            raise ScheduleError(f"argument {a!r} of {text!r} is not a name or an integer")
    spelled = (" ".join(args[0].split()), *args[1:]) if name == "precompute" else args
    return Command(name, tuple(spelled))


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
    unit: str
    races: str
    origin: str


@dataclass(frozen=True, slots=True)
class Precompute:
    expr: Any  # a notation expression (product of accesses)
    var: str
    workspace: str
    origin: str


@dataclass
class Plan:
    """The schedule, resolved against one loop nest."""

    commands: tuple[Command, ...]
    order: list[str]
    spaces: dict[str, Space] = field(default_factory=dict)
    pieces: dict[str, Piece] = field(default_factory=dict)
    #: split children of a space or piece: (outer, inner)
    children: dict[str, tuple[str, str]] = field(default_factory=dict)
    parallel: dict[str, Parallelize] = field(default_factory=dict)
    unroll: dict[str, int] = field(default_factory=dict)
    mergeby: dict[str, str] = field(default_factory=dict)
    assemble: dict[str, str] = field(default_factory=dict)
    precompute: list[Precompute] = field(default_factory=list)

    @property
    def transforms_loops(self) -> bool:
        return bool(self.spaces or self.precompute)

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


def _factor(text: str, command: Command) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ScheduleError(f"{command}: the factor {text!r} is not an integer") from None
    if value <= 0:
        raise ScheduleError(f"{command}: the factor must be positive, got {value}")
    if value > MAX_FACTOR:
        raise ScheduleError(f"{command}: the factor {value} is larger than {MAX_FACTOR}")
    return value


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
    plan = Plan(commands, list(order))
    taken = set(indices) | set(tensors)

    def known_loop(var: str, command: Command) -> None:
        if var in plan.order:
            return
        if var in nested:
            raise ScheduleError(
                f"{command}: {var} is summed inside a nested sum, which runs in its own loop "
                f"nest; schedules apply to the outer loops ({', '.join(plan.order)})"
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
                factor = _factor(a[3], command)
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
                var, pvar, tensor = a
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
                if var in plan.pieces or (var in plan.spaces and plan.spaces[var].kind != "fused"):
                    raise ScheduleError(
                        f"{command}: {var} is already derived ({_origin(plan, var)}); pos "
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
                            f"{command}: {v} is already derived ({_origin(plan, v)}); fuse "
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
                size = _factor(a[2], command)
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
                expr_text, var, wvar = a
                if var not in indices or var in nested:
                    raise ScheduleError(
                        f"{command}: {var!r} is not an index variable of the outer loop nest"
                    )
                new_name(wvar, command)
                plan.precompute.append(
                    Precompute(_precompute_expr(expr_text, command), var, wvar, str(command))
                )
            case "unroll":
                plan.unroll[a[0]] = _factor(a[1], command)
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
                plan.parallel[var] = Parallelize(var, unit, races, str(command))
            case "assemble":
                tensor, how = a
                if tensor != output:
                    raise ScheduleError(
                        f"{command}: assemble names the output ({output}), not {tensor!r}"
                    )
                if how not in ASSEMBLIES:
                    raise ScheduleError(
                        f"{command}: strategy {how!r} is not one of {', '.join(ASSEMBLIES)}"
                    )
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
    _check_splits(plan)
    return plan


def _origin(plan: Plan, var: str) -> str:
    if var in plan.pieces:
        return f"from {plan.pieces[var].origin}"
    return f"from {plan.spaces[var].origin}"


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


def _precompute_expr(text: str, command: Command) -> Any:
    from ..errors import SparsecError

    try:
        expr = parse(f"sc_ws = {text}").rhs
    except SparsecError as err:
        raise ScheduleError(f"{command}: cannot read the expression {text!r}: {err}") from None
    if not factors(expr):
        raise ScheduleError(f"{command}: {text!r} is not a product of tensor accesses")
    return expr


def factors(expr: Any) -> list[Any]:
    """The factors of a product (accesses and literals), or [] if ``expr`` is not one."""
    match expr:
        case BinOp(op="*", left=left, right=right):
            a, b = factors(left), factors(right)
            return a + b if a and b else []
        case Access() | Literal():
            return [expr]
        case Neg(operand=x):
            inner = factors(x)
            return [Literal(-1.0), *inner] if inner else []
        case _:
            return []


def name_supply(taken: set[str]) -> Callable[[str], str]:
    """Fresh names for the variables of a generated schedule: ``base``, ``base2``, ...,
    never one in ``taken`` (the expression's tensors and indices) or handed out before."""

    def fresh(base: str) -> str:
        name, n = base, 2
        while name in taken:
            name, n = f"{base}{n}", n + 1
        taken.add(name)
        return name

    return fresh


def check_order(plan: Plan, hard: Sequence[Any], describe: dict[str, str]) -> None:
    """Every hard edge (``before`` bound before ``after``'s loops start) still holds.

    ``hard`` are `order.Edge` values over original variables; ``describe`` maps a tensor
    name to its format in words, for the message.
    """
    bound_at: dict[str, int] = {}
    entered_at: dict[str, int] = {}
    space_of: dict[str, str] = {}
    for n, loop in enumerate(plan.order):
        space = plan.space_of(loop)
        for v in plan.binds(loop):
            bound_at[v] = n
        if space is None:
            entered_at[loop] = n
        else:
            for v in plan.spaces[space].vars:
                entered_at.setdefault(v, n)
                space_of[v] = space
    for edge in hard:
        if edge.before not in bound_at or edge.after not in entered_at:
            continue
        same = space_of.get(edge.before)
        found = f"the loop order is {', '.join(plan.order)}"
        if same is not None and same == space_of.get(edge.after):
            # a fused space (a range, or the positions of the pos tensor's levels) binds its
            # variables in the order they were fused: every tensor's levels must agree with
            # that order, not only the pos tensor's (checked by pos)
            joint = plan.spaces[same]
            if joint.vars.index(edge.before) < joint.vars.index(edge.after):
                continue
            found = f"{same} ({joint.origin}) binds {', '.join(joint.vars)} in that order"
        elif bound_at[edge.before] < entered_at[edge.after]:
            continue
        raise ScheduleError(
            f"schedule {plan.describe()}: {edge.tensor} ({describe.get(edge.tensor, '')}) "
            f"is iterated level by level, so {edge.before} must be bound before the loop "
            f"over {edge.after} starts, but {found}. Keep {edge.before} outside "
            f"{edge.after}, or store {edge.tensor} with another mode ordering"
        )
