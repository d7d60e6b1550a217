"""Interleaved reductions: several iterations of a serial loop run their inner sums together.

SDDMM with a sparse output, ``A(i,j) = B(i,j) * C(i,k) * D(k,j)``, lowers to

    for p in row i of B:  j = crd[p]; acc = 0; for k: acc += B[p] * C[i,k] * D[j,k];
                          append (j, acc)

Each ``acc`` is one chain of dependent additions, ``k`` long: the core waits an addition's
latency (3-4 cycles) per multiply-add while its FMA units idle. Reassociating the sum
(partial sums over ``k``, as ``-ffast-math`` lets a compiler) would change its rounding.
This pass instead runs ``jam_ways`` iterations of the outer loop at once (unroll and jam): their
declarations, then one ``k`` loop whose body holds each iteration's body in turn (their
chains are independent), then each iteration's statements after the ``k`` loop, in the
original order. The iterations left over (fewer than ``jam_ways``) run through the original
loop. Every output gets the same additions in the same order: results are bit-identical.
(The dots pass runs after this one: where the jammed inner loop reads only contiguous
elements it sums them on vector lanes, which reorders each sum; see `dots.py`.)

The pass is C-only and conservative. A loop qualifies when it is serial, and its body is
local declarations, then exactly one serial loop (the *inner* loop), then any statements
but loops (the *tail*), where

- the inner loop's bounds do not change with the outer iteration, its body only declares
  and assigns locals of the outer body (no store, no call for effect, no nested block),
  and one of them is a compound assignment (``+=``: the chain to interleave);
- neither the declarations nor the inner loop read a variable the tail assigns or an
  array the tail stores into (so moving later iterations' work before a tail is exact).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import count

from ..ir import nodes as ir
from ..ir.visit import arrays, blocks, exprs, free_vars, map_blocks, statements, substitute
from ..policy.decision import DEFAULTS, PassOptions

#: the statements a tail may hold (no loop: its variable would need renaming too)
_TAIL = (ir.Decl, ir.Assign, ir.If, ir.Return, ir.Effect, ir.Comment, ir.Block)


def jam(body: ir.Block, options: PassOptions = DEFAULTS) -> tuple[ir.Block, tuple[str, ...]]:
    """``body`` with every qualifying loop interleaved ``options.jam_ways`` ways, and a
    note per loop."""
    ways = options.jam_ways
    taken = _names(body)
    notes: list[str] = []
    ids = count()

    def visit(b: ir.Block) -> ir.Block:
        out: list[ir.Stmt] = []
        for s in b.body:
            s = map_blocks(s, visit)
            made = _jam(s, taken, next(ids), ways) if isinstance(s, ir.For) else None
            if made is None:
                out.append(s)
                continue
            assert isinstance(s, ir.For)
            out.extend(made)
            notes.append(f"loop {s.var} runs {ways} iterations' sums interleaved")
        return ir.Block(tuple(out))

    return visit(body), tuple(notes)


def _names(body: ir.Block) -> set[str]:
    """Every name declared, assigned, looped over or read in ``body``."""
    names: set[str] = set()
    for s in statements(body):
        if isinstance(s, ir.Decl):
            names.add(s.name)
        if isinstance(s, ir.For):
            names.add(s.var)
        for e in exprs(s):
            names |= free_vars(e)
    return names


def _assigned(s: ir.Stmt) -> tuple[set[str], set[str]]:
    """The variables and the arrays that ``s`` (with its nested statements) writes."""
    names: set[str] = set()
    stored: set[str] = set()
    for t in statements(ir.Block((s,))):
        if isinstance(t, ir.Assign):
            if isinstance(t.target, ir.Var):
                names.add(t.target.name)
            else:
                stored.add(t.target.array)
        elif isinstance(t, ir.Decl):
            names.add(t.name)
    return names, stored


def _reads(stmts: tuple[ir.Stmt, ...]) -> tuple[set[str], set[str]]:
    """The variables and the arrays that ``stmts`` read."""
    names: set[str] = set()
    loaded: set[str] = set()
    for s in statements(ir.Block(stmts)):
        for e in exprs(s):
            if isinstance(s, ir.Assign) and e is s.target:
                if isinstance(e, ir.Load):
                    names |= free_vars(e.index)
                    loaded |= arrays(e.index)
                continue
            names |= free_vars(e)
            loaded |= arrays(e)
    return names, loaded


def _jam(loop: ir.For, taken: set[str], ident: int, ways: int) -> list[ir.Stmt] | None:
    """``loop`` interleaved ``ways`` ways (statements replacing it), or None."""
    if loop.parallel is not None or loop.unroll:
        return None
    body = loop.body.body
    inner_at = [n for n, s in enumerate(body) if isinstance(s, ir.For)]
    if len(inner_at) != 1:
        return None
    at = inner_at[0]
    head, inner, tail = body[:at], body[at], body[at + 1 :]
    assert isinstance(inner, ir.For)
    if not all(isinstance(s, ir.Decl) for s in head):
        return None
    if inner.parallel is not None or inner.unroll:
        return None
    if not all(isinstance(s, _TAIL) for s in statements(ir.Block(tail))):
        return None
    local = {loop.var} | {s.name for s in head if isinstance(s, ir.Decl)}
    for s in inner.body.body:
        if isinstance(s, ir.Decl):
            local.add(s.name)
        elif not (isinstance(s, ir.Assign) and isinstance(s.target, ir.Var) and not s.atomic):
            return None
        elif s.target.name not in local:
            return None
    if not any(isinstance(s, ir.Assign) and s.op != "=" for s in inner.body.body):
        return None
    if (free_vars(inner.start) | free_vars(inner.end)) & local:
        return None  # the inner loop's range changes with the outer iteration
    tail_names: set[str] = set()
    tail_stored: set[str] = set()
    for s in tail:
        names, stored = _assigned(s)
        tail_names |= names
        tail_stored |= stored
    if loop.var in tail_names or any(
        isinstance(s, ir.Assign) and s.target == ir.Var(loop.var) for s in inner.body.body
    ):
        return None  # the body moves its own loop variable
    reads, loaded = _reads((*head, inner))
    if (reads & (tail_names - local)) or (loaded & tail_stored):
        return None
    for s in statements(ir.Block(tail)):
        if isinstance(s, ir.Decl):
            local.add(s.name)
    if inner.var in local:
        return None
    renamed = [{v: f"{v}_w{u}" for v in local} for u in range(ways)]
    if any(n in taken for env in renamed for n in env.values()):
        return None
    prefix = f"sc_jam{ident}"
    start, end, groups = f"{prefix}_start", f"{prefix}_end", f"{prefix}_n"
    group = f"{prefix}_g"
    if {start, end, groups, group} & taken:
        return None
    span = ir.Bin("-", ir.Var(end), ir.Var(start))
    stmts: list[ir.Stmt] = [
        ir.Decl(ir.I64, start, loop.start),
        ir.Decl(ir.I64, end, loop.end),
        ir.Decl(
            ir.I64,
            groups,
            ir.Select(
                ir.Bin(">", ir.Var(end), ir.Var(start)),
                ir.Bin("/", span, ir.IntLit(ways)),
                ir.IntLit(0),
            ),
        ),
    ]
    first = ir.Bin("+", ir.Var(start), ir.Bin("*", ir.Var(group), ir.IntLit(ways)))
    grouped: list[ir.Stmt] = []
    for u, env in enumerate(renamed):
        grouped.append(ir.Decl(ir.I64, env[loop.var], ir.add(first, ir.IntLit(u))))
    for env in renamed:
        grouped.extend(_rename(s, env) for s in head)
    jammed = tuple(_rename(s, env) for env in renamed for s in inner.body.body)
    grouped.append(replace(inner, body=ir.Block(jammed)))
    for env in renamed:
        grouped.extend(_rename(s, env) for s in tail)
    stmts.append(ir.For(group, ir.IntLit(0), ir.Var(groups), ir.Block(tuple(grouped))))
    left = ir.Bin("+", ir.Var(start), ir.Bin("*", ir.Var(groups), ir.IntLit(ways)))
    stmts.append(replace(loop, start=left, end=ir.Var(end)))
    return stmts


def _rename(s: ir.Stmt, names: dict[str, str]) -> ir.Stmt:
    """``s`` with the variables in ``names`` renamed (declarations, reads and targets)."""
    env = {old: ir.Var(new) for old, new in names.items()}
    if isinstance(s, ir.Decl):
        init = None if s.init is None else substitute(s.init, env)
        return replace(s, name=names.get(s.name, s.name), init=init)
    if isinstance(s, ir.Assign):
        target = substitute(s.target, env)
        assert isinstance(target, ir.Var | ir.Load)
        return replace(s, target=target, value=substitute(s.value, env))
    if isinstance(s, ir.If):
        branches = tuple((substitute(c, env), _rename_block(b, names)) for c, b in s.branches)
        orelse = None if s.orelse is None else _rename_block(s.orelse, names)
        return replace(s, branches=branches, orelse=orelse)
    if isinstance(s, ir.Return):
        return replace(s, cond=substitute(s.cond, env))
    if isinstance(s, ir.Effect):
        call = substitute(s.call, env)
        assert isinstance(call, ir.Call)
        return replace(s, call=call)
    if isinstance(s, ir.Block):
        return _rename_block(s, names)
    assert not blocks(s) and not exprs(s), f"jam: unexpected statement {type(s).__name__}"
    return s


def _rename_block(b: ir.Block, names: dict[str, str]) -> ir.Block:
    return ir.Block(tuple(_rename(s, names) for s in b.body))
