"""Generic walks over the loop IR of `nodes`: written once, used by every pass.

Expressions: `children` (the operands an expression reads directly) and `map_children`
(the same node rebuilt over new operands) are the two exhaustive matches; `subexpressions`,
`free_vars`, `arrays` and `substitute` are built on them. Statements: `exprs` (the
expressions a statement holds itself), `blocks` (the blocks it holds) and `map_blocks` (the
statement rebuilt over new blocks) are the exhaustive matches; `statements` walks a block
with everything nested in it, and `bindings` reads a run of declarations as a substitution.

A pass that rewrites recurses through `map_blocks` and decides only at the nodes it
understands; nodes are immutable, so every rewrite builds new ones (`dataclasses.replace`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import assert_never

from . import nodes as ir


# ---------------------------------------------------------------- expressions
def children(e: ir.Expr) -> tuple[ir.Expr, ...]:
    """The subexpressions ``e`` reads directly, left to right."""
    match e:
        case ir.Var() | ir.IntLit() | ir.FloatLit():
            return ()
        case ir.Load(index=index):
            return (index,)
        case ir.Bin(left=a, right=b):
            return (a, b)
        case ir.Unary(operand=x):
            return (x,)
        case ir.Call(args=args):
            return args
        case ir.Select(cond=c, then=a, other=b):
            return (c, a, b)
        case _:
            assert_never(e)


def map_children(e: ir.Expr, fn: Callable[[ir.Expr], ir.Expr]) -> ir.Expr:
    """``e`` with ``fn`` applied to each direct subexpression (leaves unchanged): the one
    place that rebuilds an expression node, so a rewrite recurses through it."""
    match e:
        case ir.Var() | ir.IntLit() | ir.FloatLit():
            return e
        case ir.Load(array=a, index=i):
            return ir.Load(a, fn(i))
        case ir.Bin(op=op, left=a, right=b):
            return ir.Bin(op, fn(a), fn(b))
        case ir.Unary(op=op, operand=x):
            return ir.Unary(op, fn(x))
        case ir.Call(fn=name, args=args):
            return ir.Call(name, tuple(fn(a) for a in args))
        case ir.Select(cond=c, then=a, other=b):
            return ir.Select(fn(c), fn(a), fn(b))
        case _:
            assert_never(e)


def subexpressions(e: ir.Expr) -> Iterator[ir.Expr]:
    """``e`` and every expression inside it, parents before their operands."""
    yield e
    for c in children(e):
        yield from subexpressions(c)


def free_vars(e: ir.Expr) -> set[str]:
    """The variables ``e`` reads."""
    return {x.name for x in subexpressions(e) if isinstance(x, ir.Var)}


def arrays(e: ir.Expr) -> set[str]:
    """The arrays ``e`` loads from."""
    return {x.array for x in subexpressions(e) if isinstance(x, ir.Load)}


def substitute(e: ir.Expr, env: Mapping[str, ir.Expr]) -> ir.Expr:
    """``e`` with the variables named in ``env`` replaced by their expressions (the
    replacements themselves are not substituted again)."""
    if isinstance(e, ir.Var):
        return env.get(e.name, e)
    return map_children(e, lambda c: substitute(c, env))


def bindings(stmts: Iterable[ir.Stmt]) -> dict[str, ir.Expr]:
    """What each initialised declaration among ``stmts`` stands for, in terms of the
    names declared before them (earlier declarations substituted into later ones)."""
    env: dict[str, ir.Expr] = {}
    for d in stmts:
        if isinstance(d, ir.Decl) and d.init is not None:
            env[d.name] = substitute(d.init, env)
    return env


# ----------------------------------------------------------------- statements
def exprs(s: ir.Stmt) -> tuple[ir.Expr, ...]:
    """The expressions ``s`` holds itself (an assignment's target included), not those of
    the statements nested in its blocks."""
    match s:
        case ir.Decl(init=init):
            return () if init is None else (init,)
        case ir.Assign(target=target, value=value):
            return (target, value)
        case ir.For(start=start, end=end):
            return (start, end)
        case ir.While(cond=cond):
            return (cond,)
        case ir.If(branches=branches):
            return tuple(c for c, _ in branches)
        case ir.Alloc(count=n, when=when):
            return (n,) if when is None else (n, when)
        case ir.Pointer(offset=offset):
            return (offset,)
        case ir.Effect(call=call):
            return (call,)
        case ir.Return(cond=cond):
            return (cond,)
        case ir.Comment() | ir.Free() | ir.Block():
            return ()
        case _:
            assert_never(s)


#: the statements that hold no block; with the cases after it, every kind of statement
#: (the type checker's `assert_never` finds a kind added to `nodes` and left out)
_LEAVES = (ir.Decl, ir.Assign, ir.Comment, ir.Alloc, ir.Pointer, ir.Free, ir.Effect, ir.Return)


def blocks(s: ir.Stmt) -> tuple[ir.Block, ...]:
    """The blocks ``s`` holds directly: a loop's body, an if's branches (then its else);
    a block is itself."""
    if isinstance(s, _LEAVES):
        return ()
    match s:
        case ir.For(body=body) | ir.While(body=body):
            return (body,)
        case ir.If(branches=branches, orelse=orelse):
            return tuple(b for _, b in branches) + (() if orelse is None else (orelse,))
        case ir.Block():
            return (s,)
        case _:
            assert_never(s)


def map_blocks(s: ir.Stmt, fn: Callable[[ir.Block], ir.Block]) -> ir.Stmt:
    """``s`` with ``fn`` applied to each block it holds directly (those `blocks` lists; an
    if's else goes first, an order the passes' numbering of what they rewrite depends on);
    a statement without blocks unchanged. Passes recurse through it."""
    if isinstance(s, _LEAVES):
        return s
    match s:
        case ir.For() | ir.While():
            return replace(s, body=fn(s.body))
        case ir.If():
            orelse = fn(s.orelse) if s.orelse is not None else None
            return replace(s, branches=tuple((c, fn(b)) for c, b in s.branches), orelse=orelse)
        case ir.Block():
            return fn(s)
        case _:
            assert_never(s)


def statements(b: ir.Block) -> Iterator[ir.Stmt]:
    """Every statement in ``b``, nested ones included: each before the statements in its
    blocks."""
    for s in b.body:
        yield s
        for inner in blocks(s):
            yield from statements(inner)
