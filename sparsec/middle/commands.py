"""The scheduling language's text: TACO's commands (Senanayake et al., OOPSLA 2020), read into
`Command` values. What the commands mean for a loop nest is `plan`'s business.

A schedule is a list of commands (or one string of commands separated by commas):

    reorder(i, j, ...)            permute these loops among the slots they occupy (also
                                  spelled reorder({i, j, ...}), as TACO's C++ API)
    split(i, i0, i1, F)           i = i0*F + i1, with i1 < F           (F > 0)
    divide(i, i0, i1, F)          i0 < F pieces of ceil(N/F)           (F > 0)
    pos(i, ip, A)                 iterate A's stored positions of i's level (A may be
                                  spelled as its access, A(i,j), as TACO's C++ API does)
    fuse(i, j, f)                 one loop f over the (i, j) pairs (i directly encloses j)
    precompute(expr, i, iw)       compute expr (factors, or a term of a sum) into a dense
                                  workspace over i (iw may be i; {i,j}, {iw,jw}: a
                                  workspace over several variables; an optional fourth
                                  argument names the workspace)
    unroll(i, F)                  ask the C compiler to unroll i's loop F times
    bound(i, ib, B, kind)         i's extent is B (MaxExact) or at most B (MaxConstraint)
    parallelize(i, unit, races)   units CPUThread, CPUVector (GPUBlock, GPUWarp, GPUThread on
                                  CUDA); races NoRaces, IgnoreRaces, Atomics, Temporary,
                                  ParallelReduction
    assemble(T, Append|Insert[, true|false])
                                  how the sparse output T is built (the third argument,
                                  TACO's separately-schedulable flag, is accepted and moot)
    mergeby(i, TwoFinger|Gallop)  how i's intersection advances the lagging iterators

Reading checks only the text: a known command name, its arity, names or integers for its
arguments (``precompute``'s first is an expression, its next two a name or a ``{...}``
list of names) and the sizes below; whether a name is
a loop of the kernel is checked against the loop nest by `plan.make_plan`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..base.errors import ScheduleError, SparsecError
from ..frontend.parser import parse


class Unit(StrEnum):
    """What a ``parallelize``d loop runs on. A member is its spelling in the commands, and
    prints as it (messages and schedule notes read the text)."""

    CPUThread = "CPUThread"
    CPUVector = "CPUVector"
    GPUBlock = "GPUBlock"
    GPUWarp = "GPUWarp"
    GPUThread = "GPUThread"

    @property
    def gpu(self) -> bool:
        """A unit of a GPU launch (grid, warps, threads), not of a CPU."""
        return self in GPU_UNITS


class Races(StrEnum):
    """How a ``parallelize``d loop's iterations that write one element are reconciled;
    a member is its spelling in the commands (and prints as it)."""

    NoRaces = "NoRaces"
    IgnoreRaces = "IgnoreRaces"
    Atomics = "Atomics"
    Temporary = "Temporary"
    ParallelReduction = "ParallelReduction"


CPU_UNITS = (Unit.CPUThread, Unit.CPUVector)
GPU_UNITS = (Unit.GPUBlock, Unit.GPUWarp, Unit.GPUThread)
UNITS = CPU_UNITS + GPU_UNITS
RACES = tuple(Races)
BOUND_KINDS = ("MaxExact", "MaxConstraint")
MERGES = ("TwoFinger", "Gallop")
ASSEMBLIES = ("Append", "Insert")

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_COMMANDS = 64
MAX_FACTOR = 1 << 20


# ------------------------------------------------------------------- commands
@dataclass(frozen=True, slots=True)
class Command:
    """One parsed command: its name, arguments (as text) and its normalised spelling.

    ``policy``: made by the default policy (`policy.schedules.cpu_default`), not written by
    the user; the lowerer words its loop as the default's and, where the loop did not stay
    the outermost one (a precompute's workspace encloses it), leaves it serial instead of
    refusing it."""

    name: str
    args: tuple[str, ...]
    policy: bool = False

    def __str__(self) -> str:
        return f"{self.name}({','.join(self.args)})"


#: the argument counts each command takes (None: reorder's two or more)
_ARITY: dict[str, tuple[int, ...] | None] = {
    "reorder": None,
    "split": (4,),
    "divide": (4,),
    "pos": (3,),
    "fuse": (3,),
    "precompute": (3, 4),
    "unroll": (2,),
    "bound": (4,),
    "parallelize": (3,),
    "assemble": (2, 3),
    "mergeby": (2,),
}
#: TACO's spelling of ``assemble``'s third argument (``separatelySchedulable``)
FLAGS = ("true", "false")
_LIST = re.compile(r"^\{(.*)\}$", re.S)
_ACCESS = re.compile(
    r"^([A-Za-z_][A-Za-z0-9_]*)\s*\(\s*([A-Za-z_][A-Za-z0-9_]*(?:\s*,\s*[A-Za-z_][A-Za-z0-9_]*)*)?\s*\)$"
)


def _split_top(text: str, where: str) -> list[tuple[str, int]]:
    """Split at commas outside parentheses and braces (TACO's ``{i,j}`` lists); each part
    with its offset in ``text``."""
    parts: list[tuple[str, int]] = []
    depth, start = 0, 0
    for n, ch in enumerate(text):
        if ch in "({":
            depth += 1
        elif ch in ")}":
            depth -= 1
            if depth < 0:
                raise ScheduleError(f"unbalanced {ch!r} in {where} {text!r}")
        elif ch == "," and depth == 0:
            parts.append((text[start:n], start))
            start = n + 1
    if depth != 0:
        raise ScheduleError(f"unbalanced '(' or '{{' in {where} {text!r}")
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
    if name == "reorder" and len(args) == 1 and _LIST.match(args[0]):
        # TACO's C++ spelling passes the order as one list, reorder({i0, i1, j})
        args = name_list(_name_list(args[0], text))
    want = _ARITY[name]
    if want is not None and len(args) not in want:
        counts = " or ".join(map(str, want))
        raise ScheduleError(f"{name} takes {counts} arguments, got {len(args)} in {text!r}")
    if want is None and len(args) < 2:
        raise ScheduleError(f"{name} needs at least two index variables, got {text!r}")
    spelled: list[str] = []
    for n, a in enumerate(args):
        if not a:
            raise ScheduleError(f"argument {n + 1} of {text!r} is empty")
        if name == "precompute" and n == 0:
            spelled.append(" ".join(a.split()))
            continue
        if name == "precompute" and n in (1, 2) and _LIST.match(a):
            spelled.append(_name_list(a, text))
            continue
        if name == "pos" and n == 2 and _ACCESS.match(a):
            # TACO's C++ spelling names the access, pos(j, jpos, A(i,j))
            spelled.append(re.sub(r"\s+", "", a))
            continue
        if not _IDENT.match(a) and not re.fullmatch(r"[+-]?[0-9]+", a):
            raise ScheduleError(f"argument {a!r} of {text!r} is not a name or an integer")
        spelled.append(a)
    if name == "assemble" and len(args) == 3 and args[2] not in FLAGS:
        raise ScheduleError(
            f"{text!r}: assemble's third argument (TACO's separately-schedulable flag) is "
            f"true or false, not {args[2]!r}"
        )
    return Command(name, tuple(spelled))


def _name_list(arg: str, text: str) -> str:
    """A ``{i, j}`` argument (TACO's list of index variables), spelled ``{i,j}``."""
    m = _LIST.match(arg)
    assert m is not None
    names = [x.strip() for x in m.group(1).split(",")]
    for x in names:
        if not _IDENT.match(x):
            raise ScheduleError(
                f"{text!r}: {x!r} in the list {arg!r} is not an index variable name; write "
                "e.g. {i,j}"
            )
    return "{" + ",".join(names) + "}"


def pos_tensor(arg: str) -> tuple[str, tuple[str, ...] | None]:
    """``pos``'s third argument: a tensor name (TACO's CLI), or an access ``A(i,j)`` (its
    C++ API) with its index variables."""
    m = _ACCESS.match(arg)
    if m is None:
        return arg, None
    return m.group(1), tuple(m.group(2).split(",")) if m.group(2) else ()


def name_list(arg: str) -> tuple[str, ...]:
    """The names of a precompute variable argument: ``i`` or ``{i,j}`` (as `_command`
    spelled it)."""
    m = _LIST.match(arg)
    return tuple(m.group(1).split(",")) if m else (arg,)


def parse_factor(text: str, command: Command) -> int:
    """A command's integer argument (a split factor, an unroll count, a bound): positive
    and at most `MAX_FACTOR`."""
    try:
        value = int(text)
    except ValueError:
        raise ScheduleError(f"{command}: the factor {text!r} is not an integer") from None
    if value <= 0:
        raise ScheduleError(f"{command}: the factor must be positive, got {value}")
    if value > MAX_FACTOR:
        raise ScheduleError(f"{command}: the factor {value} is larger than {MAX_FACTOR}")
    return value


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


def precompute_expr(text: str, command: Command) -> Any:
    """The expression of ``precompute(expr, ...)``: some factors of the right-hand side's
    product, or any of its subexpressions (a sum too), as TACO's precompute takes."""
    try:
        return parse(f"sc_ws = {text}").rhs
    except SparsecError as err:
        raise ScheduleError(f"{command}: cannot read the expression {text!r}: {err}") from None
