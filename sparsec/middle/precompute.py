"""``precompute``'s arguments read against the statement: the expression, the workspace's
index variables (one, or TACO's ``{i,j}`` list) and their workspace variables."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..base.errors import ScheduleError
from .commands import Command, name_list, precompute_expr


@dataclass(frozen=True, slots=True)
class Precompute:
    """``precompute(expr, vars, workspaces[, name])``: ``expr`` into a dense workspace
    over ``vars`` (TACO's ``where``). ``workspaces`` are TACO's new index variables of the
    workspace, one per variable; each may reuse its variable's name (TACO's
    ``precompute(expr, i, i)``). sparsec's workspace is a local array indexed by the
    original variables' coordinates, so these names only label the generated code."""

    expr: Any  # a notation expression (product of accesses)
    vars: tuple[str, ...]
    workspaces: tuple[str, ...]
    origin: str
    #: the workspace tensor's name (the fourth argument), else the workspace variables'
    name: str = ""

    @property
    def var(self) -> str:
        """The workspace's variable (a one-variable workspace); several read as their
        ``{i,j}`` list, which names no loop."""
        return self.vars[0] if len(self.vars) == 1 else "{" + ",".join(self.vars) + "}"

    @property
    def workspace(self) -> str:
        """A name for the workspace in generated code and messages."""
        return self.name or "_".join(self.workspaces)


def read_precompute(
    command: Command,
    indices: tuple[str, ...],
    nested: tuple[str, ...],
    new_name: Callable[[str, Command], None],
) -> Precompute:
    """``precompute(expr, i, iw)``, ``precompute(expr, {i,j}, {iw,jw})`` and TACO's
    spellings ``precompute(expr, i, i)`` (the workspace variable reuses the original's
    name) and a fourth argument naming the workspace."""
    a = command.args
    vars_, wvars = name_list(a[1]), name_list(a[2])
    if len(vars_) != len(wvars):
        raise ScheduleError(
            f"{command}: {len(vars_)} index variables but {len(wvars)} workspace variables; "
            "give one workspace variable per index variable"
        )
    if len(set(vars_)) != len(vars_):
        raise ScheduleError(f"{command}: an index variable is listed twice")
    for var in vars_:
        if var not in indices or var in nested:
            raise ScheduleError(
                f"{command}: {var!r} is not an index variable of the outer loop nest"
            )
    for var, wvar in zip(vars_, wvars, strict=True):
        if wvar != var:
            new_name(wvar, command)
    name = a[3] if len(a) == 4 else ""
    if name:
        new_name(name, command)
    return Precompute(precompute_expr(a[0], command), vars_, wvars, str(command), name)
