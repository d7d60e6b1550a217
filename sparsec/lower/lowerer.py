"""The lowering recursion: concrete index notation + formats -> loop IR (TACO's
level-function lowering).

`loops` lowers ``Σ order . expr`` into a sink: for the first index variable it builds
the merge lattice of the expression and hands it to the co-iteration emitter
(`coiterate`), a schedule space's loop (`spaces`) or a precompute (`where`), passing
itself back as the callback that lowers the loops inside. Inside a case, `enter` locates
the levels that hold the bound variable when they are dense (``p_k = p_{k-1} * N + i``),
runs a sparse output's assembly around the body, and recurses on the case's simplified
expression. At the innermost level `compute` stores the value into the output (``+=``
into a zeroed dense output), or into a scalar accumulator when only reduction loops
remain. Nested sums (left under ``+``) are computed into scalar temporaries where they
are used.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import assert_never

from ..base.errors import LoweringError
from ..frontend.concrete import ZERO, CExpr, Sum, Zero, accesses, children, without_masked
from ..frontend.functions import FUNCTIONS
from ..frontend.notation import Access, BinOp, Call, Literal, Neg
from ..ir import nodes as ir
from ..middle.lattice import UnionLattice, build
from ..middle.order import loop_order
from .coiterate import Walk, coiterate
from .ctx import (
    AccSink,
    Ctx,
    DenseWsSink,
    NestPoint,
    OutputSink,
    SegmentSink,
    Sink,
    WorkspaceSink,
)
from .env import LowerEnv
from .levels import iterator
from .output import flush_run, nothing_written, one_store_per_part, output_slot, store_shared
from .output import write as write_output
from .rows import enter_output
from .semiring import combine, truth
from .sequence import emit_sequence
from .spaces import space_loop
from .union import flagged_union
from .where import emit_where, mark, marked, ws_slot


def loops(
    env: LowerEnv,
    order: tuple[str, ...],
    expr: CExpr,
    ctx: Ctx,
    sink: Sink,
    outermost: bool = False,
) -> ir.Block:
    """Code computing ``Σ order . expr`` (over the not-yet-bound ``order``) into ``sink``."""
    if masked := _masked_here(expr, ctx):
        expr = without_masked(expr, masked, frozenset(), env.inputs.exact)
    if expr is ZERO:
        nothing_written(env, sink)
        return ir.Block()
    lhs = env.inputs.lhs
    if (
        order
        and isinstance(sink, OutputSink)
        and not _binds(env, order) & set(lhs.indices)
        and ctx.depth(lhs) == lhs.order
    ):
        return _reduce_into_output(env, order, expr, ctx, outermost)

    def nest(order: tuple[str, ...], expr: CExpr, ctx: Ctx, sink: Sink) -> ir.Block:
        return loops(env, order, expr, ctx, sink)

    if not order and env.decided.sequence and not env.flags.in_sequence:
        # the shared loops of a sequence are bound: its steps, each in its own order
        return emit_sequence(env, expr, ctx, sink, nest)
    if not order:
        return compute(env, expr, ctx, sink)
    var, rest = order[0], order[1:]

    if (
        env.decided.where is not None
        and var == env.decided.where.placed.at
        and not env.flags.in_where
    ):
        return emit_where(env, expr, ctx, sink, nest)
    if env.decided.plan is not None and env.decided.plan.space_of(var) is not None:
        return space_loop(env, var, NestPoint(expr, ctx, rest, sink, nest), outermost)
    lattice = build(expr, lambda a: iterator(env, a, var, ctx), env.inputs.exact)
    if not lattice.points:
        nothing_written(env, sink)
        return ir.Block()

    def body(expr: CExpr, ctx: Ctx) -> ir.Block:
        return enter(env, var, rest, expr, ctx, sink)

    walk = Walk(var, ctx, sink, body, outermost)
    if isinstance(lattice, UnionLattice):
        return flagged_union(env, lattice, walk, rest, expr)
    return coiterate(env, lattice, walk)


def _masked_here(expr: CExpr, ctx: Ctx) -> frozenset[Access]:
    """The complemented masks ``~M`` still in ``expr`` with every level of ``M`` bound:
    its last level is dense (located, so ``M`` stores an entry here; an iterated last
    level is decided in the lattice, `middle.lattice.build`), so their products are absent
    (`without_masked`); what is left (a sparse ``+=``'s current value) is still computed."""
    return frozenset(a for a in accesses(expr) if a.complement and ctx.depth(a) == a.order)


def _reduce_into_output(
    env: LowerEnv, order: tuple[str, ...], expr: CExpr, ctx: Ctx, outermost: bool
) -> ir.Block:
    """Only reduction loops remain under a known output position: sum into a scalar
    accumulator, then store it once."""
    acc = env.inputs.namer.fresh("acc")
    asm = env.decided.assembler
    if asm is None:
        with _private_accumulator(env):
            inner = loops(env, order, expr, ctx, AccSink(acc), outermost)
        shared = acc in env.found.warp_reduced or acc in env.found.partial_accs
        store = store_shared(env, acc, ctx) if shared else [write_output(env, ctx, ir.Var(acc))]
        return ir.block(ir.Decl(ir.ACC, acc, ir.FloatLit(0.0)), inner, *store)
    # sparse output: an entry exists only if some term reached it
    reached = env.inputs.namer.fresh("reached")
    counting = asm.mode.counting
    return ir.block(
        None if counting else ir.Decl(ir.ACC, acc, ir.FloatLit(0.0)),
        ir.Decl(ir.BOOL, reached, ir.IntLit(0)),
        _private_loops(env, order, expr, ctx, AccSink("" if counting else acc, reached)),
        ir.If(((ir.Var(reached), write_output(env, ctx, None if counting else ir.Var(acc))),)),
    )


def _binds(env: LowerEnv, order: tuple[str, ...]) -> set[str]:
    """Original index variables bound by the loops ``order``."""
    if env.decided.plan is None:
        return set(order)
    return {v for loop in order for v in env.decided.plan.binds(loop)}


@contextmanager
def _private_accumulator(env: LowerEnv) -> Iterator[None]:
    """Lowering into an accumulator declared here: the parallel loops around it give
    each thread its own copy, so only loops inside may make its updates atomic (a
    CPUThread loop with Atomics). On the GPU an atomic on a local is illegal."""
    with env.scope(atomic_writes=False):
        yield


def _private_loops(
    env: LowerEnv, order: tuple[str, ...], expr: CExpr, ctx: Ctx, sink: AccSink
) -> ir.Block:
    with _private_accumulator(env):
        return loops(env, order, expr, ctx, sink)


def enter(
    env: LowerEnv, var: str, rest: tuple[str, ...], expr: CExpr, ctx: Ctx, sink: Sink
) -> ir.Block:
    """Code for the body of one iteration that has just bound ``var`` (`rows.enter_output`)."""

    def inner(ctx: Ctx, gather: bool) -> ir.Block:
        if gather:
            return scatter_gather(env, rest, expr, ctx)
        return loops(env, rest, expr, ctx, sink)

    return enter_output(env, var, expr, ctx, inner)


def scatter_gather(env: LowerEnv, rest: tuple[str, ...], expr: CExpr, ctx: Ctx) -> ir.Block:
    """Scatter the remaining loops into the workspace, then append its sorted row."""
    assert env.decided.assembler is not None
    return ir.block(loops(env, rest, expr, ctx, WorkspaceSink()), *env.decided.assembler.gather())


def compute(env: LowerEnv, expr: CExpr, ctx: Ctx, sink: Sink) -> ir.Block:
    """The innermost statement: add the value of ``expr`` into ``sink``.

    When only counting a sparse output's positions, no value is computed.
    """
    stmts: list[ir.Stmt] = []
    asm = env.decided.assembler
    counting = asm is not None and asm.mode.counting
    # the flags of this statement's nested sums (their bodies store through here too)
    with env.scope(reached_of={}):
        # a workspace's reset stores the identity: no value (nor a nested sum's loops)
        resetting = isinstance(sink, DenseWsSink) and sink.reset
        value = None if counting or resetting else _value(env, expr, ctx, stmts)
        # a sparse output has an entry only where some term is present, and a nested sum
        # that flags its terms (any output) is reached only where one is
        flagged = isinstance(sink, AccSink) and bool(sink.flag)
        present = _presence(env, expr, ctx, stmts) if asm is not None or flagged else None
        match sink:
            case OutputSink():
                stmts.append(_when(present, write_output(env, ctx, value)))
            case AccSink(name=name, flag=flag):
                if value is not None:
                    atomic = env.flags.atomic_writes
                    stmts.append(ir.Assign(ir.Var(name), value, "+=", atomic=atomic))
                if flag:
                    stmts.append(_when(present, ir.block(ir.Assign(ir.Var(flag), ir.IntLit(1)))))
            case SegmentSink(acc=acc, at=at):
                assert value is not None
                one_store_per_part(env)
                env.found.write_sites.append(False)
                env.found.repeats = True
                slot = output_slot(env, ctx).index
                restart = ir.block(
                    flush_run(env, sink),
                    ir.Assign(ir.Var(at), slot),
                    ir.Assign(ir.Var(acc), ir.FloatLit(0.0)),
                )
                stmts.append(ir.If(((ir.Bin("!=", slot, ir.Var(at)), restart),)))
                stmts.append(ir.Assign(ir.Var(acc), value, "+="))
            case DenseWsSink(array=array, vars=ws_vars, reset=True):
                # 0.0: the add's identity once a semiring rewrites it (`semiring.apply`)
                slot = ir.Load(array, ws_slot(env, ws_vars, ctx))
                stmts.append(ir.Assign(slot, ir.FloatLit(0.0)))
                stmts.extend(mark(env, sink, ctx))
            case DenseWsSink(array=array, vars=ws_vars):
                assert value is not None
                stmts.append(ir.Assign(ir.Load(array, ws_slot(env, ws_vars, ctx)), value, "+="))
                stmts.extend(mark(env, sink, ctx))
            case WorkspaceSink():
                assert asm is not None and env.decided.workspace is not None
                coord = ir.Var(env.decided.var_names[env.decided.workspace])
                stmts.append(_when(present, ir.block(*asm.scatter(coord, value))))
            case _:
                assert_never(sink)
    if not isinstance(sink, DenseWsSink):
        stmts = marked(env, ctx, sink, stmts)
    return ir.block(*stmts)


def _presence(env: LowerEnv, expr: CExpr, ctx: Ctx, stmts: list[ir.Stmt]) -> ir.Expr | None:
    """Whether a term of ``expr`` is structurally present at a sparse output's entry
    (None: surely). The accesses of a case's expression are present (the lattice
    chose the case) and so are literals; a nested sum is present where its loops
    reached a term (when counting, no value was computed, so its loops run here for
    that alone); ``*`` needs both operands, ``+`` and ``-`` either; a division by a
    non-literal is present everywhere under ``"ieee"`` (``0/0`` is NaN) and where its
    numerator is under ``"sparse"``; a function where its operands are when ``f(0) = 0``
    (``max``/``min``: either), else everywhere."""
    if _surely_present(expr, env.inputs.exact):
        return None
    match expr:
        case Neg(operand=x):
            return _presence(env, x, ctx, stmts)
        case Sum():
            reached_of = env.flags.reached_of
            if expr not in reached_of:
                stmts.extend(_nested_sum(env, expr, ctx, ""))
            return ir.Var(reached_of[expr])
        case BinOp(op="*", left=left, right=right):
            parts = (_presence(env, left, ctx, stmts), _presence(env, right, ctx, stmts))
            return ir.conj(*(p for p in parts if p is not None))
        case BinOp(op="+" | "-", left=left, right=right):
            first, second = _presence(env, left, ctx, stmts), _presence(env, right, ctx, stmts)
            assert first is not None and second is not None
            return ir.Bin("||", first, second)
        case BinOp(op="/", left=left):
            return _presence(env, left, ctx, stmts)
        case Zero():  # an operand of a function, absent here
            return ir.IntLit(0)
        case Call(fn="max" | "min", args=(left, right)):
            first, second = _presence(env, left, ctx, stmts), _presence(env, right, ctx, stmts)
            assert first is not None and second is not None
            return ir.Bin("||", first, second)
        case Call(args=args):  # keeps its first operand's pattern (else surely present)
            return _presence(env, args[0], ctx, stmts)
        case _:
            raise AssertionError(expr)


def _nested_sum(env: LowerEnv, expr: Sum, ctx: Ctx, acc: str) -> list[ir.Stmt]:
    """The loops of a nested sum adding into ``acc`` (``""``: counting, no value). For
    a sparse output they also set a flag when they reach a term (``reached_of``)."""
    order = loop_order(
        expr.indices, list(accesses(expr.body)), env.inputs.formats, tuple(ctx.coords)
    )
    stmts: list[ir.Stmt] = []
    flag = ""
    if env.decided.assembler is not None or _guards(env):
        flag = env.flags.reached_of[expr] = env.inputs.namer.fresh("reached")
        stmts.append(ir.Decl(ir.BOOL, flag, ir.IntLit(0)))
    return stmts + list(_private_loops(env, order, expr.body, ctx, AccSink(acc, flag)).body)


#: the one of each semiring multiply (`Semiring.multiply`): a mask's value
MULTIPLICATIVE_ONE = {"*": 1.0, "+": 0.0, "and": 1.0, "pair": 1.0, "second": 1.0}


def _value(env: LowerEnv, expr: CExpr, ctx: Ctx, stmts: list[ir.Stmt]) -> ir.Expr:
    """The IR value of ``expr`` with every variable bound; nested sums emit into ``stmts``.

    Where values may be infinite without exact lowering (a quotient under the ``"sparse"``
    convention, ``log``), a negation, product, quotient or function over nested sums is
    +0 where it is structurally absent (`_presence`: its sums reached no term), not ``0 *
    inf``, nor a ``-0`` that would turn a divisor's ``+inf`` into ``-inf``: the value of
    docs/semantics.md, inside a divisor too. Under a semiring it is the add's identity
    (absent), which is no annihilator of every multiply (``-inf * -2`` is ``+inf``)."""
    value = _value_of(env, expr, ctx, stmts)
    if _guarded(expr) and _guards(env):
        present = _presence(env, expr, ctx, stmts)
        assert present is not None
        return ir.Select(present, value, ir.FloatLit(env.inputs.ring.identity))
    return value


def _value_of(env: LowerEnv, expr: CExpr, ctx: Ctx, stmts: list[ir.Stmt]) -> ir.Expr:
    """`_value` before its structural guard."""
    match expr:
        case Access(name=name, order=0):
            return truth(env.inputs.ring, ir.Var(env.inputs.sig.value(name)))
        case Access(name=name) if name in env.inputs.spec.patterns:
            # a structural mask: its values are ignored; it multiplies by the semiring's one
            return ir.FloatLit(MULTIPLICATIVE_ONE[env.inputs.ring.multiply])
        case Access():
            last = ctx.levels.get((expr, expr.order - 1))
            if last is None:
                raise LoweringError(f"internal: {expr} read before all its levels are bound")
            vals = env.found.local_vals.get(expr.name) or env.inputs.sig.array(expr.name, "vals")
            return truth(env.inputs.ring, ir.Load(vals, last.pos))
        case Literal(value=v):
            return truth(env.inputs.ring, ir.FloatLit(v))
        case Zero():
            return ir.FloatLit(0.0)
        case Neg(operand=x):
            return ir.Unary("-", _value(env, x, ctx, stmts))
        case (
            BinOp(op="*", left=Access(name=name), right=other)
            | BinOp(op="*", left=other, right=Access(name=name))
        ) if name in env.inputs.spec.patterns:
            # a structural mask only filters: its product leaves the value as it is (under
            # ``pair`` a product with the mask's one would be 1, not the value)
            return _value(env, other, ctx, stmts)
        case BinOp(op=op, left=left, right=right):
            a, b = _value(env, left, ctx, stmts), _value(env, right, ctx, stmts)
            if op in ("*", "+"):
                # the semiring's multiply and add (plus_times: ``*`` and ``+`` themselves)
                return combine(env.inputs.ring, op, a, b)
            if op == "/":
                # the templates' division of values (an integral type's never traps)
                return ir.Call("vdiv", (a, b))
            return ir.Bin(op, a, b)
        case Call(fn=fn, args=args):
            return _function(env, fn, tuple(_value(env, a, ctx, stmts) for a in args), stmts)
        case Sum():
            t = env.inputs.namer.fresh("t")
            stmts.append(ir.Decl(ir.ACC, t, ir.FloatLit(0.0)))
            stmts.extend(_nested_sum(env, expr, ctx, t))
            return ir.Var(t)
        case _:
            raise AssertionError(expr)


def _guards(env: LowerEnv) -> bool:
    """Do nested sums flag whether they reached a term, so that `_value` makes what is
    absent the add's identity? Wherever values are not computed densely (exact lowering):
    a nested sum's value may be infinite (a quotient by a non-constant under the
    ``"sparse"`` convention, ``log``, infinite input data, ``max`` of nothing under a
    semiring), and an absent factor's product is never computed (``0 * inf``). Only
    where such a node holds a nested sum: a sum under ``+`` alone needs no flag."""
    if env.inputs.exact:
        return False
    sparse = frozenset(n for n, f in env.inputs.formats.items() if not f.is_dense)
    return _holds_guarded(env.inputs.spec.statement.rhs, sparse)


def _holds_guarded(expr: CExpr, sparse: frozenset[str]) -> bool:
    """Is a node of ``expr`` guarded in some case of the lattice: `_guarded` of the
    case's expression, where an access of a ``sparse`` tensor may be absent (dropped from
    a sum, so that ``(T0(k) + Σs T1(k,s)) / T2(k)`` is ``Σs T1(k,s) / T2(k)`` where T0
    stores nothing: a quotient present only where the sum reaches a term)?"""
    return _guarded(expr, sparse) or any(_holds_guarded(c, sparse) for c in children(expr))


def _guarded(expr: CExpr, absent: frozenset[str] = frozenset()) -> bool:
    """Is ``expr`` a node that `_value` guards: a negation, product, quotient or function
    that may be absent (over nested sums, or an access of a tensor in ``absent``)? ``+``
    and ``-`` combine what is present."""
    return (
        isinstance(expr, BinOp | Call | Neg)
        and not (isinstance(expr, BinOp) and expr.op in ("+", "-"))
        and not _surely_present(expr, False, absent)
    )


def _function(env: LowerEnv, fn: str, args: tuple[ir.Expr, ...], stmts: list[ir.Stmt]) -> ir.Expr:
    """A function of the language on lowered operands: a call the printer spells per
    language (``fn_sqrt``: `sparsec.backends.targets`), or an expression of others."""
    match fn:
        case "relu":
            # x < 0 ? 0 : x, the operand computed once (NaN stays NaN, as torch.relu)
            x = env.inputs.namer.fresh("f")
            stmts.append(ir.Decl(ir.ACC, x, args[0]))
            zero = ir.FloatLit(0.0)
            return ir.Select(ir.Bin("<", ir.Var(x), zero), zero, ir.Var(x))
        case "sign":
            x = env.inputs.namer.fresh("f")
            stmts.append(ir.Decl(ir.ACC, x, args[0]))
            zero, one = ir.FloatLit(0.0), ir.FloatLit(1.0)
            below = ir.Select(ir.Bin("<", ir.Var(x), zero), ir.FloatLit(-1.0), zero)
            return ir.Select(ir.Bin(">", ir.Var(x), zero), one, below)
        case "sigmoid":
            one = ir.FloatLit(1.0)
            exp = ir.Call("fn_exp", (ir.Unary("-", args[0]),))
            return ir.Call("vdiv", (one, ir.Bin("+", one, exp)))
        case _:
            return ir.Call(f"fn_{fn}", args)


def _surely_present(expr: CExpr, exact: bool, absent: frozenset[str] = frozenset()) -> bool:
    """A term of ``expr`` is present whatever its nested sums reach (see `_presence`).
    A `Zero` (an absent operand that exact lowering reads as ``0.0``, where ``inf * 0``
    is NaN) is present as the lattice's exact points are; elsewhere one is left only as
    an operand of a function (``max(0, x)``), present where the other operands are."""
    match expr:
        case Access(name=name):
            return name not in absent  # a lattice case may lack a tensor of ``absent``
        case Literal():
            return True
        case Zero():
            return exact
        case Sum():
            return False
        case Neg(operand=x):
            return _surely_present(x, exact, absent)
        case BinOp(op="*", left=left, right=right):
            return _surely_present(left, exact, absent) and _surely_present(right, exact, absent)
        case BinOp(op="+" | "-", left=left, right=right):
            return _surely_present(left, exact, absent) or _surely_present(right, exact, absent)
        case BinOp(op="/", left=left, right=right):
            literal = isinstance(right, Literal) and right.value != 0
            # exact: a quotient is present everywhere; sparse: where its numerator is
            return (exact and not literal) or _surely_present(left, exact, absent)
        case BinOp(op=op):
            raise AssertionError(f"unknown operator {op}")
        case Call(fn="max" | "min", args=args):
            return any(_surely_present(a, exact, absent) for a in args)
        case Call(fn=fn, args=args):
            keeps = FUNCTIONS[fn].keeps_pattern(args)
            return not keeps or _surely_present(args[0], exact, absent)
        case _:
            assert_never(expr)


def _when(cond: ir.Expr | None, then: ir.Stmt) -> ir.Stmt:
    """``then``, run only where ``cond`` holds (always when None)."""
    return then if cond is None else ir.If(((cond, ir.block(then)),))
