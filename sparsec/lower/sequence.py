"""Sums under ``+``/``-`` lowered as a sequence (TACO's ``where`` over a ``seq``).

``Y(i,j) = A(i,k)*B(k,j) + D(i,j)`` keeps its sum over ``k`` nested under ``+``
(`frontend.concrete`), and a nested sum runs inside the output's loops: ``k`` innermost,
which B in CSR (``k`` before ``j``) rules out. When the fused nest has no legal order, the
statement is lowered as

    where(Y(i,j) = w(j), seq(w(j) = D(i,j), w(j) += A(i,k)*B(k,j)))

with the output row itself as the workspace: inside the loops over the free indices every
term visits first, in the same order (``i`` here; the *shared loops*), the output is
initialised from the terms without a sum, then each contraction adds into it in its own
loop order, co-iterating its own operands' levels (``for k in A(i,:): for j in B(k,:)``).
Each iteration of the shared loops owns its slice of the output, so the outermost one
runs on threads without races, and the slice stays in cache between the steps.

`sequence_order` decides whether a statement is lowered so (the fused nest found no order)
and returns the shared loops; `emit_sequence` emits the steps where the shared loops have
bound their variables (`lowerer.loops` calls it there). A sparse output (csr-like) takes
the sequence per row through a dense workspace over its last level (see `sequence_order`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import LoweringError, ScheduleError
from ..frontend.concrete import ZERO, CExpr, Sum
from ..frontend.concrete import accesses as accesses_of
from ..frontend.notation import Access, BinOp, Neg
from ..ir import nodes as ir
from ..middle.order import level_indices, loop_order
from ..middle.plan import make_plan
from .ctx import Ctx, Sink
from .env import LowerEnv
from .where import Nest


@dataclass(frozen=True, slots=True)
class Steps:
    """A right-hand side as the steps of a sequence: the terms without a sum (one
    co-iterated initialisation, or None) and each contraction, signs applied."""

    init: CExpr | None
    contractions: tuple[Sum, ...]


def split_terms(expr: CExpr) -> Steps:
    """``expr``'s terms under ``+``/``-`` (through unary minus): the sums among them each
    a step of their own (a subtracted sum negated inside: ``Σk -(A*B)``), the rest
    added back into one expression. Structural zeros (absent at a lattice point) drop."""
    signed: list[tuple[bool, CExpr]] = []

    def walk(e: CExpr, negative: bool) -> None:
        match e:
            case BinOp(op="+", left=left, right=right):
                walk(left, negative)
                walk(right, negative)
            case BinOp(op="-", left=left, right=right):
                walk(left, negative)
                walk(right, not negative)
            case Neg(operand=x):
                walk(x, not negative)
            case _:
                if e is not ZERO:
                    signed.append((negative, e))

    walk(expr, False)
    init: CExpr | None = None
    sums: list[Sum] = []
    for negative, term in signed:
        if isinstance(term, Sum):
            body = Neg(term.body, (0, 0)) if negative else term.body  # type: ignore[arg-type]
            sums.append(Sum(term.indices, body))
        elif init is None:
            init = Neg(term, (0, 0)) if negative else term  # type: ignore[arg-type]
        else:
            init = BinOp("-" if negative else "+", init, term, (0, 0))  # type: ignore[arg-type]
    return Steps(init, tuple(sums))


def _step_order(
    env: LowerEnv, free: tuple[str, ...], step: CExpr, bound: tuple[str, ...]
) -> tuple[str, ...]:
    """One step's loop order inside the loops ``bound``: the output's unbound ``free``
    indices and, for a contraction, its summed ones, in the order its operands' levels
    need (the output, dense, only prefers its storage order)."""
    summed = step.indices if isinstance(step, Sum) else ()
    body = step.body if isinstance(step, Sum) else step
    everything: list[Access] = [env.lhs, *accesses_of(body)]
    return loop_order(free + summed, everything, env.formats, bound)


def sequence_order(env: LowerEnv) -> tuple[str, ...] | None:
    """The shared loops of ``env``'s statement lowered as a sequence, or None when it is
    not one (a lifted sum over the whole right-hand side, no sum under ``+``/``-``, a
    step with no order of its own, or a sparse output that cannot take it). Sets
    `LowerEnv.sequence` (the sequence in words, for the header) and applies the schedule
    to the shared loops.

    A sparse output takes a sequence when its last level can be scattered into a dense
    workspace (`Assembler.can_scatter`, e.g. csr) and the shared loops are its levels
    above the last, in storage order: per row the steps scatter into the workspace, which
    is gathered into the row once (Gustavson's SpGEMM, the initialisation first). Its
    counting and filling phases lower the same steps, so they agree on the pattern."""
    stmt = env.spec.statement
    asm = env.assembler
    if stmt.top_sums or (asm is not None and not asm.can_scatter()):
        return None
    steps = split_terms(stmt.rhs)
    if not steps.contractions:
        return None
    free = stmt.lhs.indices
    parts: list[CExpr] = list(steps.contractions)
    if steps.init is not None:
        parts.append(steps.init)
    try:
        orders = [_step_order(env, free, part, ()) for part in parts]
    except LoweringError:
        return None
    shared: list[str] = []
    for column in zip(*orders, strict=False):
        if len(set(column)) != 1 or column[0] not in free:
            break
        shared.append(column[0])
    order = tuple(shared)
    into = ""
    if asm is not None:
        rows = level_indices(env.lhs, env.spec.output.format)
        if order != rows[:-1]:
            return None
        env.workspace = rows[-1]
        into = f"; per row a dense workspace over {rows[-1]}, gathered into the row"
    op = "+=" if stmt.accumulate else "="
    first = f"{env.lhs.name} {op} {steps.init if steps.init is not None else 0}"
    then = "".join(f", then {env.lhs.name} += {s}" for s in steps.contractions)
    loops = f"in the loop{'s' if len(order) > 1 else ''} over {', '.join(order)}"
    env.sequence = (
        f"lowered as a sequence {loops if order else 'of loop nests'}: {first}{then}, "
        f"each in its own loop order{into}"
    )
    return _schedule_shared(env, order) if env.commands else order


#: the commands that apply to the shared loops of a sequence (its steps' loops are its own)
SHARED_COMMANDS = frozenset({"parallelize", "split", "divide"})


def _schedule_shared(env: LowerEnv, order: tuple[str, ...]) -> tuple[str, ...]:
    """The schedule applies to the shared loops only (split, divide and parallelize
    there): each step's loops are the step's own. Sets `LowerEnv.plan`; returns its
    loop order."""
    for command in env.commands:
        if command.name not in SHARED_COMMANDS:
            raise ScheduleError(
                f"{command}: {env.lhs} is lowered as a sequence of loop nests (its sums "
                "under +/- each run in their own loop order); a schedule applies to the "
                f"loops the steps share ({', '.join(order) or 'none'}), with "
                f"{', '.join(sorted(SHARED_COMMANDS))} only"
            )
    stmt = env.spec.statement
    env.plan = make_plan(
        env.commands,
        order,
        indices=env.spec.indices,
        nested=(),
        tensors={t.name: t.order for t in env.spec.tensors},
        output=stmt.lhs.name,
        tensor_levels={},
    )
    for v in env.plan.order:
        if v not in env.var_names:
            env.var_names[v] = env.namer.fresh(v)
    return tuple(env.plan.order)


def emit_sequence(env: LowerEnv, expr: CExpr, ctx: Ctx, sink: Sink, nest: Nest) -> ir.Block:
    """The steps of ``expr`` (the right-hand side at this point of the shared loops)
    into ``sink``, the output: the initialisation, then each contraction, each adding
    into the output (zeroed before) in its own loop order inside the bound loops."""
    steps = split_terms(expr)
    bound = tuple(ctx.coords)
    free = tuple(i for i in env.lhs.indices if i not in ctx.coords)
    parts: list[CExpr] = [] if steps.init is None else [steps.init]
    parts += steps.contractions
    stmts: list[ir.Stmt] = []
    with env.scope(in_sequence=True):
        for part in parts:
            order = _step_order(env, free, part, bound)
            body = part.body if isinstance(part, Sum) else part
            stmts.append(ir.Comment(f"{env.lhs.name} += {part}"))
            stmts.append(nest(order, body, ctx, sink))
    return ir.block(*stmts)
