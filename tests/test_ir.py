"""The loop IR's generic walks (`sparsec.ir.visit`), as tables: expression in, operands /
variables / substituted expression out; statement in, its expressions and blocks out; and a
`map_blocks` rewrite that rebuilds what it walks."""

from __future__ import annotations

import pytest

from sparsec.ir import nodes as ir
from sparsec.ir import visit

i, j, p = ir.Var("i"), ir.Var("j"), ir.Var("p")
one = ir.IntLit(1)
crd_p = ir.Load("crd", p)
#: SpMV's gather x[crd[p]], and its row bound pos[i + 1]
gather = ir.Load("x", crd_p)
row_end = ir.Load("pos", ir.Bin("+", i, one))

# (expression, children, free variables, arrays loaded)
EXPRESSIONS = [
    (i, (), {"i"}, set()),
    (one, (), set(), set()),
    (ir.FloatLit(0.5), (), set(), set()),
    (gather, (crd_p,), {"p"}, {"x", "crd"}),
    (ir.Bin("*", gather, j), (gather, j), {"p", "j"}, {"x", "crd"}),
    (ir.Unary("-", row_end), (row_end,), {"i"}, {"pos"}),
    (ir.Call("min", (i, j, one)), (i, j, one), {"i", "j"}, set()),
    (ir.Call("vzero", ()), (), set(), set()),
    (
        ir.Select(ir.Bin("<", i, j), gather, one),
        (ir.Bin("<", i, j), gather, one),
        {"i", "j", "p"},
        {"x", "crd"},
    ),
]


def _id(value: object) -> str:
    """A test id that is the same in every process: sets print in sorted order (pytest-xdist
    workers must collect the same ids, and set order follows the hash seed)."""
    return str(sorted(value)) if isinstance(value, set) else str(value)


@pytest.mark.parametrize(("e", "kids", "names", "loaded"), EXPRESSIONS, ids=_id)
def test_children_free_vars_and_arrays(e, kids, names, loaded):
    assert visit.children(e) == kids
    assert visit.free_vars(e) == names
    assert visit.arrays(e) == loaded
    # every node once, parents first; an identity map rebuilds an equal expression
    subs = list(visit.subexpressions(e))
    assert subs[0] == e and len(subs) == 1 + sum(len(list(visit.subexpressions(c))) for c in kids)
    assert visit.map_children(e, lambda c: c) == e


# (expression, environment, substituted)
SUBSTITUTIONS = [
    (i, {"i": j}, j),
    (i, {"j": one}, i),
    (gather, {"p": ir.Bin("+", p, one)}, ir.Load("x", ir.Load("crd", ir.Bin("+", p, one)))),
    # the array of a load is a name, not a variable
    (gather, {"x": one}, gather),
    # replacements are not substituted again
    (ir.Bin("+", i, j), {"i": j, "j": i}, ir.Bin("+", j, i)),
    (
        ir.Select(i, ir.Call("max", (i, p)), ir.Unary("-", i)),
        {"i": one},
        ir.Select(one, ir.Call("max", (one, p)), ir.Unary("-", one)),
    ),
]


@pytest.mark.parametrize(("e", "env", "want"), SUBSTITUTIONS, ids=_id)
def test_substitute(e, env, want):
    assert visit.substitute(e, env) == want


def test_bindings_substitute_earlier_declarations_into_later():
    stmts = [
        ir.Decl(ir.I64, "q", ir.Bin("+", i, one)),
        ir.Decl(ir.I64, "uninit"),
        ir.Comment("between"),
        ir.Decl(ir.I64, "end", ir.Load("pos", ir.Var("q"))),
    ]
    assert visit.bindings(stmts) == {"q": ir.Bin("+", i, one), "end": row_end}


body = ir.block(ir.Assign(ir.Var("acc"), gather, "+="))
orelse = ir.block(ir.Comment("else"))
# (statement, expressions it holds itself, blocks it holds directly)
STATEMENTS = [
    (ir.Decl(ir.VAL, "acc", ir.FloatLit(0.0)), (ir.FloatLit(0.0),), ()),
    (ir.Decl(ir.VAL, "acc"), (), ()),
    (ir.Assign(ir.Load("y", i), ir.Var("acc")), (ir.Load("y", i), ir.Var("acc")), ()),
    (ir.For("p", crd_p, row_end, body), (crd_p, row_end), (body,)),
    (ir.While(ir.Bin("<", p, j), body), (ir.Bin("<", p, j),), (body,)),
    (ir.If(((i, body), (j, orelse))), (i, j), (body, orelse)),
    (ir.If(((i, body),), orelse), (i,), (body, orelse)),
    (ir.Comment("c"), (), ()),
    (ir.Alloc(ir.VAL, "w", j), (j,), ()),
    (ir.Alloc(ir.VAL, "w", j, when=i), (j, i), ()),
    (ir.Pointer(ir.VAL, "t", "w", i), (i,), ()),
    (ir.Free("w"), (), ()),
    (ir.Effect(ir.Call("sort", (p,))), (ir.Call("sort", (p,)),), ()),
    (ir.Return(3, ir.Bin(">", i, j)), (ir.Bin(">", i, j),), ()),
    (body, (), (body,)),
]


@pytest.mark.parametrize(("s", "held", "inner"), STATEMENTS, ids=lambda x: type(x).__name__)
def test_exprs_and_blocks(s, held, inner):
    assert visit.exprs(s) == held
    assert visit.blocks(s) == inner
    assert visit.map_blocks(s, lambda b: b) == s


def _nest() -> ir.Block:
    """SpMV: a row loop, a while over positions, an if/else with a nested block."""
    inner = ir.If(((ir.Bin("<", p, j), body),), ir.Block((ir.Comment("none"), body)))
    return ir.block(
        ir.Decl(ir.I64, "n", one),
        ir.For("i", ir.IntLit(0), ir.Var("n"), ir.block(ir.While(i, ir.Block((inner,))))),
    )


def _rename_acc(s: ir.Stmt) -> ir.Stmt:
    """A rewrite in the passes' style: decide at the nodes it knows, recurse through
    `map_blocks` everywhere else."""
    match s:
        case ir.Assign(target=ir.Var(name="acc")):
            return ir.Assign(ir.Var("sum"), s.value, s.op)
    return visit.map_blocks(s, lambda b: ir.Block(tuple(_rename_acc(x) for x in b.body)))


def test_map_blocks_rewrite_round_trip():
    nest = _nest()
    renamed = ir.Block(tuple(_rename_acc(s) for s in nest.body))
    assert renamed != nest
    found = [s for s in visit.statements(renamed) if isinstance(s, ir.Assign)]
    assert [s.target for s in found] == [ir.Var("sum")] * 2
    # renaming back gives the tree it started from, equal node for node
    back = visit.map_blocks(
        renamed,
        lambda b: ir.Block(tuple(_restore(x) for x in b.body)),
    )
    assert back == nest


def _restore(s: ir.Stmt) -> ir.Stmt:
    match s:
        case ir.Assign(target=ir.Var(name="sum")):
            return ir.Assign(ir.Var("acc"), s.value, s.op)
    return visit.map_blocks(s, lambda b: ir.Block(tuple(_restore(x) for x in b.body)))


def test_statements_walks_every_nested_statement_parents_first():
    kinds = [type(s).__name__ for s in visit.statements(_nest())]
    assert kinds == [
        "Decl", "For", "While", "If", "Assign", "Comment", "Block", "Assign",
    ]  # fmt: skip
