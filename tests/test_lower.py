"""Lowering, stage by stage: the level functions of the level formats, the environment's
scoped flags, the co-iteration emitter on a table of lattices, the race analysis, and the
CPU default as the explicit commands lowering sees."""

from __future__ import annotations

import pytest

from sparsec.abi import BOUND_VIOLATED, Namer, signature
from sparsec.base.errors import ScheduleError
from sparsec.frontend.parser import parse_expression
from sparsec.ir import nodes as ir
from sparsec.ir.visit import statements
from sparsec.lower import lower
from sparsec.lower.assemble import Assembler
from sparsec.lower.coiterate import Walk, coiterate
from sparsec.lower.ctx import AccSink, Ctx, OutputSink
from sparsec.lower.env import Flags, LowerEnv
from sparsec.lower.levels import iterator
from sparsec.lower.races import race, race_strategies
from sparsec.middle.commands import Command, parse_commands
from sparsec.middle.lattice import build
from sparsec.middle.schedule import loop_nest, make_schedule
from sparsec.middle.spec import make_spec
from sparsec.policy.schedules import cpu_default
from sparsec.tensors.formats import Compressed, Dense, LevelNames, Singleton, dense_extent
from sparsec.tensors.layout import AssemblyMode

P, Q, I, N = ir.Var("p"), ir.Var("q"), ir.Var("i"), ir.Var("N")
AT = LevelNames(N, "B2_pos", "B2_crd")


def load(array: str, index: ir.Expr) -> ir.Load:
    return ir.Load(array, index)


def plus1(e: ir.Expr) -> ir.Expr:
    return ir.Bin("+", e, ir.IntLit(1))


# ------------------------------------------------------------ level functions
@pytest.mark.parametrize(
    "level, parent, want",
    [
        (Dense(), None, (ir.IntLit(0), N)),
        (Dense(), (P, plus1(P)), (ir.Bin("*", P, N), ir.Bin("+", ir.Bin("*", P, N), N))),
        (Compressed(), None, (load("B2_pos", ir.IntLit(0)), load("B2_pos", ir.IntLit(1)))),
        (Compressed(), (P, plus1(P)), (load("B2_pos", P), load("B2_pos", plus1(P)))),
        # a singleton shares its parent's segment, whatever its end
        (Singleton(), (P, Q), (P, Q)),
    ],
)
def test_bounds_under_a_parent(level, parent, want):
    assert level.bounds(parent, AT) == want


@pytest.mark.parametrize(
    "level, want",
    [
        (Dense(), (ir.Bin("*", P, N), ir.Bin("*", Q, N))),
        (Compressed(), (load("B2_pos", P), load("B2_pos", Q))),
        (Singleton(), (P, Q)),
    ],
)
def test_bounds_under_a_range_of_parents(level, want):
    assert level.range_bounds(P, Q, AT) == want


@pytest.mark.parametrize(
    "level, top, coord, parent",
    [
        (Dense(), True, P, ir.Bin("/", P, N)),
        (Dense(), False, ir.Bin("%", P, N), ir.Bin("/", P, N)),
        (Compressed(), False, load("B2_crd", P), None),  # the parent is searched in pos
        (Singleton(), False, load("B2_crd", P), P),
    ],
)
def test_coordinate_and_parent_position(level, top, coord, parent):
    assert level.coordinate(P, AT, top) == coord
    assert level.parent_position(P, AT) == parent


def test_dense_locate_is_the_inverse_of_coordinate_and_parent():
    dense = Dense()
    assert dense.locate_position(None, I, AT) == I
    assert dense.locate_position(P, I, AT) == ir.Bin("+", ir.Bin("*", P, N), I)
    for level in (Compressed(), Singleton()):
        assert not level.locate
        with pytest.raises(NotImplementedError):
            level.locate_position(P, I, AT)


def test_dense_extent():
    M = ir.Var("M")
    assert dense_extent([]) == ir.IntLit(1)
    assert dense_extent([N]) == N
    assert dense_extent([N, M]) == ir.Bin("*", N, M)


def test_append():
    assert Compressed().append_coord(Q, I, AT) == [ir.Assign(load("B2_crd", Q), I)]
    assert Singleton().append_coord(Q, I, AT) == [ir.Assign(load("B2_crd", Q), I)]
    assert Dense().append_coord(Q, I, AT) == []  # a dense level stores no coordinate
    # the edges are written where `bounds` reads the segment's end
    edges = Compressed().append_edges(P, Q, AT)
    assert edges == ir.Assign(Compressed().bounds((P, P), AT)[1], Q)
    assert Compressed().append_edges(ir.IntLit(0), Q, AT).target == load("B2_pos", ir.IntLit(1))


# --------------------------------------------------------------- environment
def _env(expr: str, formats: dict[str, str], **options) -> LowerEnv:
    spec = make_spec(parse_expression(expr), formats)
    namer = Namer()
    return LowerEnv(spec, signature(spec, namer), namer, **options)


def test_scope_sets_and_restores_flags():
    env = _env("y(i) = A(i,j) * x(j)", {"A": "csr"})
    assert env.flags == Flags()
    with env.scope(in_threads=True):
        assert env.flags.in_threads
        with env.scope(atomic_writes=True, gpu_units=("GPUBlock",)):
            assert env.flags.in_threads and env.flags.atomic_writes
            assert env.flags.gpu_units == ("GPUBlock",)
        assert env.flags.in_threads and not env.flags.atomic_writes
    assert env.flags == Flags()
    with pytest.raises(RuntimeError), env.scope(in_vector=True):
        raise RuntimeError
    assert not env.flags.in_vector  # restored on the way out of an error too
    with pytest.raises(TypeError), env.scope(no_such_flag=True):
        pass


# ------------------------------------------------- co-iteration on lattices
def _shape(block: ir.Block) -> list[str]:
    """The loops of ``block`` and the cases the body callback marked, in order."""
    out: list[str] = []
    for s in block.body:
        match s:
            case ir.For():
                out.append("for")
                out += [f"  {x}" for x in _shape(s.body)]
            case ir.While():
                out.append("while")
                out += [f"  {x}" for x in _shape(s.body)]
            case ir.If():
                for _, b in s.branches:
                    out += _shape(b)
                if s.orelse is not None:
                    out += _shape(s.orelse)
            case ir.Comment():
                out.append(s.text)
    return out


@pytest.mark.parametrize(
    "expr, formats, want",
    [
        # a dense lattice: one for loop over 0..N
        ("y(i) = x(i) * z(i)", {}, ["for", "  x(i) * z(i)"]),
        # one iterator: a position loop
        ("y(i) = a(i) * x(i)", {"a": "s"}, ["for", "  a(i) * x(i)"]),
        # an intersection: one while loop, one case
        ("y(i) = a(i) * b(i)", {"a": "s", "b": "s"}, ["while", "  a(i) * b(i)"]),
        # a union: a while loop per lattice point, each with its sub-points' cases
        (
            "y(i) = a(i) + b(i)",
            {"a": "s", "b": "s"},
            ["while", "  a(i) + b(i)", "  a(i)", "  b(i)", "while", "  a(i)", "while", "  b(i)"],
        ),
        # a full lattice with a sparse iterator: a dense loop co-iterating it
        ("y(i) = a(i) + x(i)", {"a": "s"}, ["for", "  a(i) + x(i)", "  x(i)"]),
    ],
)
def test_coiterate_on_a_lattice(expr, formats, want):
    env = _env(expr, formats, parallel=False)
    rhs = env.inputs.spec.statement.rhs
    lattice = build(rhs, lambda a: iterator(env, a, "i", Ctx()), env.inputs.exact)

    def body(case, ctx):
        assert "i" in ctx.coords  # the variable is bound inside
        return ir.block(ir.Comment(str(case)))

    got = coiterate(env, lattice, Walk("i", Ctx(), OutputSink(), body, outermost=True))
    assert _shape(got) == want


# ------------------------------------------------------------- race analysis
@pytest.mark.parametrize(
    "loop, distinct, sink, races",
    [
        ("i", frozenset({"i"}), OutputSink(), False),  # each i writes its own y(i)
        ("j", frozenset({"j"}), OutputSink(), True),  # every j adds into y(i)
        ("j", frozenset(), OutputSink(), True),  # iterations not known apart
        ("j", frozenset({"j"}), AccSink("acc"), True),  # all add into one accumulator
    ],
)
def test_race(loop, distinct, sink, races):
    env = _env("y(i) = A(i,j) * x(j)", {"A": "csr"})
    assert (race(env, loop, distinct, sink) is not None) == races


@pytest.mark.parametrize(
    "out, unit, into_sum, want",
    [
        ("dense", "CPUThread", False, ["Atomics", "Temporary"]),
        ("dense", "CPUThread", True, ["Atomics", "Temporary", "ParallelReduction"]),
        ("dense", "CPUVector", False, []),
        ("dense", "CPUVector", True, ["Temporary", "ParallelReduction"]),
        # a sparse output is appended, never updated in place: no atomics
        ("csr", "CPUThread", False, ["Temporary"]),
    ],
)
def test_race_strategies(out, unit, into_sum, want):
    env = _env("C(i,j) = A(i,j) * B(i,j)", {"A": "csr", "B": "csr", "C": out})
    assert race_strategies(env, unit, into_sum) == want


# ------------------------------------------------------------------ epilogue
@pytest.mark.parametrize(
    "expr, formats, schedule, counting",
    [
        ("y(i) = A(i,j) * x(j)", {"A": "csr"}, "bound(i,ib,8,MaxExact)", False),
        (
            "A(i,j) = B(i,j) * C(i,k) * D(k,j)",
            {"A": "csr", "B": "csr"},
            "bound(k,kb,8,MaxExact)",
            False,
        ),
        (
            "A(i,j) = B(i,j) * C(i,k) * D(k,j)",
            {"A": "csr", "B": "csr"},
            "bound(k,kb,8,MaxExact)",
            True,
        ),
    ],
)
def test_one_epilogue_checks_bounds_first(expr, formats, schedule, counting):
    """Dense and sparse outputs (both phases) share the epilogue: the schedule's entry
    checks come before anything the output opens."""
    spec = make_spec(parse_expression(expr), formats)

    def names():
        namer = Namer()
        return signature(spec, namer), namer

    options = {"mode": AssemblyMode.COUNT} if counting else {}
    lowered, _ = lower(
        spec, names, schedule=make_schedule(spec, parse_commands(schedule)), **options
    )
    first = lowered.body.body[0]
    assert isinstance(first, ir.Return) and first.status == BOUND_VIOLATED
    assert lowered.bounds


# ----------------------------------------------------------------- assembler
def test_assembler_stands_alone():
    """The assembler needs the output and the kernel's names, not a lowering: a csr
    output appends coordinate and value at its counter, and a row starts at pos[p]."""
    spec = make_spec(
        parse_expression("C(i,j) = A(i,j) * B(i,j)"), {"A": "csr", "B": "csr", "C": "csr"}
    )
    namer = Namer()
    sig = signature(spec, namer)
    var_names = {i: namer.fresh(i) for i in spec.indices}
    asm = Assembler(spec.output, spec.statement.lhs, sig, namer, var_names, AssemblyMode.FILL)
    count = ir.Var(asm.count[1])
    crd, vals, pos = sig.array("C", "crd", 1), sig.array("C", "vals"), sig.array("C", "pos", 1)
    stored = asm.store(ir.Load(vals, count), ir.FloatLit(2.0), checked=True)
    assert stored == [
        ir.Assign(ir.Load(crd, count), ir.Var(var_names["j"])),
        ir.Assign(ir.Load(vals, count), ir.FloatLit(2.0)),
        ir.Assign(count, ir.Bin("+", count, ir.IntLit(1))),
    ]
    before, after = asm.around(0, P)  # the row's dense level, rows filled independently
    assert before == [ir.Decl(ir.I64, count.name, ir.Load(pos, P))]
    assert after == []


# ------------------------------------------------------------- CPU default
def _names_of(spec):
    def names():
        namer = Namer()
        return signature(spec, namer), namer

    return names


def _default_of(expr: str, formats: dict[str, str], schedule: str = "") -> list[str]:
    spec = make_spec(parse_expression(expr), formats)
    commands = parse_commands(schedule) if schedule else ()
    made = cpu_default(spec, loop_nest(spec, commands), commands)
    assert all(c.policy for c in made)
    return [str(c) for c in made]


@pytest.mark.parametrize(
    "expr, formats, schedule, want",
    [
        # SpMV: the row loop writes its own y(i)
        ("y(i) = A(i,j) * x(j)", {"A": "csr"}, "", ["parallelize(i,CPUThread,NoRaces)"]),
        # rows of A share the y(j) they add into: a copy of y per thread
        ("y(j) = A(i,j) * x(i)", {"A": "csr"}, "", ["parallelize(i,CPUThread,Temporary)"]),
        # a dot product sums into one scalar: OpenMP's reduction
        ("a = x(i) * y(i)", {}, "", ["parallelize(i,CPUThread,ParallelReduction)"]),
        ("a = x(i) * y(i)", {"x": "s"}, "", ["parallelize(i,CPUThread,ParallelReduction)"]),
        # SpGEMM into csr: rows are counted and filled independently
        (
            "C(i,j) = A(i,k) * B(k,j)",
            {"A": "csr", "B": "csr", "C": "csr"},
            "",
            ["parallelize(i,CPUThread,NoRaces)"],
        ),
        # a dcsr output is appended in one sequence: serial
        ("C(i,j) = A(i,k) * B(k,j)", {"A": "dcsr", "B": "dcsr", "C": "dcsr"}, "", []),
        # a union (or intersection) of sparse levels at the outermost loop is a while loop
        ("C(i,j) = A(i,j) + B(i,j)", {"A": "dcsr", "B": "dcsr"}, "", []),
        ("C(i,j) = A(i,j) + B(i,j)", {"A": "dcsr", "B": "dcsr", "C": "csr"}, "", []),
        ("C(i,j) = A(i,j) * B(i,j)", {"A": "dcsr", "B": "dcsr"}, "", []),
        # runs of a non-unique level are walked by a while loop
        ("C(i,j) = A(i,j) * B(i,j)", {"A": "coo"}, "", []),
        # the user's schedule: an unrolled outermost loop stays serial, a split's outer
        # piece is left to the race analysis, and the user's own parallelize is the only one
        ("y(i) = A(i,j) * x(j)", {"A": "csr"}, "unroll(i,4)", []),
        (
            "y(i) = A(i,j) * x(j)",
            {"A": "csr"},
            "split(i,i0,i1,16)",
            ["parallelize(i0,CPUThread,Temporary)"],
        ),
        ("y(i) = A(i,j) * x(j)", {"A": "csr"}, "parallelize(j,CPUVector,NoRaces)", []),
    ],
)
def test_cpu_default_is_explicit_commands(expr, formats, schedule, want):
    assert _default_of(expr, formats, schedule) == want


def _parallel_loops(block: ir.Block) -> list[ir.For]:
    return [s for s in statements(block) if isinstance(s, ir.For) and s.parallel is not None]


def test_lowering_without_commands_is_serial():
    """The lowerer decides no default: with no commands every loop is serial."""
    spec = make_spec(parse_expression("y(i) = A(i,j) * x(j)"), {"A": "csr"})
    lowered, _ = lower(spec, _names_of(spec), schedule=make_schedule(spec))
    assert _parallel_loops(lowered.body) == [] and lowered.parallel_loops == ()


@pytest.mark.parametrize(
    "expr, races, user_note, default_note",
    [
        (
            "y(i) = A(i,j) * x(j)",
            "NoRaces",
            "i: CPUThread, race-free (each iteration writes its own y elements)",
            None,
        ),
        (
            "a = A(i,j) * B(i,j)",
            "ParallelReduction",
            "i: CPUThread, reduction(+) into a private accumulator",
            "i: CPUThread, reduction(+) into a",
        ),
    ],
)
def test_a_policy_command_lowers_like_the_users_and_is_worded_as_the_default(
    expr, races, user_note, default_note
):
    spec = make_spec(parse_expression(expr), {"A": "csr"})
    args = ("i", "CPUThread", races)
    user, _ = lower(
        spec, _names_of(spec), schedule=make_schedule(spec, (Command("parallelize", args),))
    )
    made, _ = lower(
        spec, _names_of(spec), schedule=make_schedule(spec, (Command("parallelize", args, True),))
    )
    assert made.body == user.body and len(_parallel_loops(made.body)) == 1
    assert user.notes == (user_note,)
    assert made.notes == ((default_note,) if default_note else ())


def test_a_policy_command_inside_a_precompute_leaves_the_loop_serial():
    """A precompute over the outermost loop moves that loop inside its workspace: the
    default's command there leaves the loop serial, the user's is refused. (The whole
    product is precomputed: a workspace multiplied by another factor is marked, and the
    output its guarded stores skip is zeroed by a loop that may run on threads.)"""
    spec = make_spec(parse_expression("y(i) = b(i) * c(i)"), {})
    pre = parse_commands("precompute(b(i)*c(i),i,w)")
    args = ("i", "CPUThread", "NoRaces")
    made, _ = lower(
        spec,
        _names_of(spec),
        schedule=make_schedule(spec, (*pre, Command("parallelize", args, True))),
    )
    plain, _ = lower(spec, _names_of(spec), schedule=make_schedule(spec, pre))
    assert made.body == plain.body and _parallel_loops(made.body) == []
    with pytest.raises(ScheduleError, match="inside a workspace"):
        lower(
            spec,
            _names_of(spec),
            schedule=make_schedule(spec, (*pre, Command("parallelize", args))),
        )
