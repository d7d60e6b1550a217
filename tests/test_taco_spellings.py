"""TACO's own schedule and format spellings (issue 23, item 8), each on a kernel where it
applies, against numpy on densified inputs (empty rows and columns, stored zeros): the
three-argument ``assemble``, ``precompute(expr, i, i)``, ``precompute(expr, {i,j}, {i,j})``,
``pos(i, ipos, A)`` on ``A(i) * B(i)`` with B sparse too, pos naming an access, and the
padded-singleton level letter ``p`` (``ddp``, ELL)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import sparse_array

import sparsec
from sparsec import FormatError, ScheduleError
from sparsec.tensors.formats import Singleton, parse_format

TYPES = pytest.mark.parametrize(
    ("dtype", "index_dtype"), [("float64", "int32"), ("float32", "int64")], ids=["f64i32", "f32i64"]
)


def _operands(fmts, shapes, dtype, index_dtype, seed=23):
    """Dense arrays with real zeros and empty slices; sparse ones as `sparsec.Tensor`s
    with a stored zero where the format keeps explicit entries."""
    rng = np.random.default_rng(seed)
    dense, given = {}, {}
    for name, shape in shapes.items():
        arr = sparse_array(shape, rng).astype(dtype)
        dense[name] = arr
        fmt = fmts.get(name, "dense")
        if fmt == "dense":
            given[name] = arr
            continue
        given[name] = _with_stored_zero(arr, fmt, index_dtype)
    return dense, given


def _with_stored_zero(arr, fmt, index_dtype):
    """``arr`` packed in ``fmt`` with its nonzeros and one stored zero (at a zero of
    ``arr``, the last in C order)."""
    coords = np.array(np.nonzero(arr))
    zeros = np.argwhere(arr == 0)
    if len(zeros):
        coords = np.concatenate([coords, zeros[-1][:, None]], axis=1)
    values = arr[tuple(coords)]
    t = sparsec.Tensor.from_coo(coords, values, arr.shape, fmt, index_dtype=index_dtype)
    assert len(zeros) == 0 or t.nnz > np.count_nonzero(arr) or fmt.startswith("d")
    return t


def _close(got, want, dtype):
    got = got.to_dense() if isinstance(got, sparsec.Tensor) else np.asarray(got)
    tol = 1e-4 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def _header(k: sparsec.Kernel) -> str:
    return k.generated().source.split("*/", 1)[0]


# ------------------------------------------------------------------- assemble
@TYPES
@pytest.mark.parametrize("flag", ["true", "false"])
def test_assemble_with_taco_third_argument(flag, dtype, index_dtype):
    """TACO's assemble(C, Insert, separatelySchedulable): same kernel as two arguments."""
    fmts = {"A": "csr", "B": "csr", "C": "csr"}
    dense, given = _operands(fmts, {"A": (7, 6), "B": (6, 9)}, dtype, index_dtype)
    cmd = f"assemble(C,Insert,{flag})"
    k = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", fmts, schedule=cmd)
    _close(k(**given), dense["A"] @ dense["B"], dtype)
    assert cmd in k.schedule and cmd in _header(k)
    two = sparsec.kernel("C(i,j) = A(i,k) * B(k,j)", fmts, schedule="assemble(C,Insert)")
    assert two.generated().source.split("*/", 1)[1] == k.generated().source.split("*/", 1)[1]


def test_assemble_with_precompute_as_taco_spgemm():
    """TACO's scheduleSpGEMMCPU: precompute(rhs, j, j) then assemble(C, Insert, true)."""
    fmts = {"A": "csr", "B": "csr", "C": "csr"}
    dense, given = _operands(fmts, {"A": (8, 5), "B": (5, 7)}, "float64", "int32")
    k = sparsec.kernel(
        "C(i,j) = A(i,k) * B(k,j)",
        fmts,
        schedule="precompute(A(i,k)*B(k,j),j,j), assemble(C,Insert,true)",
    )
    _close(k(**given), dense["A"] @ dense["B"], "float64")


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ("assemble(C,Insert,maybe)", "true or false"),
        ("assemble(C,Insert,true,1)", "2 or 3 arguments"),
        ("assemble(C)", "2 or 3 arguments"),
        ("assemble(C,Sorted,true)", "not one of Append, Insert"),
        ("assemble(A,Insert,true)", "names the output"),
    ],
)
def test_assemble_arguments_are_checked(schedule, message):
    with pytest.raises(ScheduleError, match=message):
        sparsec.kernel(
            "C(i,j) = A(i,k) * B(k,j)", {"A": "csr", "B": "csr", "C": "csr"}, schedule=schedule
        )


# ----------------------------------------------------------------- precompute
SPMV = "y(i) = A(i,j) * x(j)"


@TYPES
@pytest.mark.parametrize(
    "schedule",
    [
        "precompute(A(i,j)*x(j),i,i)",  # TACO's schedulePrecompute1D
        "precompute(A(i,j)*x(j),{i},{iw})",
        "precompute(A(i,j)*x(j),i,iw,w)",  # the CLI's fourth argument names the workspace
        "precompute(A(i,j)*x(j),{i,j},{i,j})",  # several variables, names reused
        "precompute(A(i,j)*x(j),{i,j},{iw,jw})",
        "precompute(A(i,j)*x(j), { i , j }, { iw, jw })",
    ],
)
def test_precompute_spellings_on_spmv(schedule, dtype, index_dtype):
    dense, given = _operands({"A": "csr"}, {"A": (9, 7), "x": (7,)}, dtype, index_dtype)
    k = sparsec.kernel(SPMV, {"A": "csr"}, schedule=schedule)
    _close(k(**given), dense["A"] @ dense["x"], dtype)
    assert "precompute(A(i,j)*x(j)," in _header(k)


ADD3 = "A(i,j) = B(i,j) + C(i,j) + D(i,j)"


@TYPES
@pytest.mark.parametrize(
    "fmts", [{}, {"B": "csr", "C": "csr", "D": "csr"}, {"B": "dcsr", "C": "csr", "D": "dcsr"}]
)
@pytest.mark.parametrize(
    "schedule",
    ["precompute(B(i,j)+C(i,j),{i,j},{i,j})", "precompute(B(i,j)+C(i,j),j,jw)"],
)
def test_precompute_a_sum(schedule, fmts, dtype, index_dtype):
    """Issue 36, item 15: TACO's ``precompute(B(i,j)+C(i,j),{i,j},{i,j})`` on a sum of three
    (it was refused as "not a product"): the term goes into a workspace the rest reads;
    dcsr's row level has the loops above a workspace over j see B and D absent."""
    shapes = {"B": (7, 6), "C": (7, 6), "D": (7, 6)}
    dense, given = _operands(fmts, shapes, dtype, index_dtype)
    k = sparsec.kernel(ADD3, fmts, schedule=schedule)
    assert "a dense workspace over" in k.generated().source
    _close(k(**given), dense["B"] + dense["C"] + dense["D"], dtype)
    k.check(**given)


def test_precompute_a_term_holding_a_sum():
    """A term whose sum is placed on it (``Σj A*x`` in ``A*x + z``) is precomputed whole."""
    dense, given = _operands({"A": "csr"}, {"A": (8, 5), "x": (5,), "z": (8,)}, "float64", "int32")
    k = sparsec.kernel(
        "y(i) = A(i,j) * x(j) + z(i)", {"A": "csr"}, schedule="precompute(A(i,j)*x(j),i,iw)"
    )
    _close(k(**given), dense["A"] @ dense["x"] + dense["z"], "float64")


@pytest.mark.parametrize(
    ("expr", "schedule", "message"),
    [
        (ADD3, "precompute(C(i,j)+D(i,j),{i,j},{i,j})", "nor one of its terms"),
        ("y(i) = (A(i,j) + B(i,j)) * x(j)", "precompute(A(i,j)+B(i,j),j,jw)", "under a product"),
        ("y(i) = (A(i,j) + B(i,j)) / x(j)", "precompute(A(i,j)+B(i,j),j,jw)", "nor one of"),
    ],
)
def test_precompute_of_what_is_no_term_refused(expr, schedule, message):
    """A subexpression that is no term of the sum (``+`` is left-associative), or one under a
    product or quotient, where the dense workspace's zeros would read differently from an
    absent value (``0 / 0``)."""
    with pytest.raises(ScheduleError, match=message):
        sparsec.kernel(expr, {"B": "csr"}, schedule=schedule)


def test_precompute_a_sum_into_a_sparse_output_takes_the_whole_sum():
    with pytest.raises(ScheduleError, match="whole right-hand side"):
        sparsec.kernel(ADD3, {n: "csr" for n in "ABCD"}, schedule="precompute(B(i,j)+C(i,j),j,jw)")


def test_precompute_reusing_the_name_equals_a_fresh_name():
    """``precompute(e, i, i)`` is ``precompute(e, i, iw)``: only the workspace's label
    in the generated code differs."""
    same = sparsec.kernel(SPMV, {"A": "csr"}, schedule="precompute(A(i,j)*x(j),i,i)")
    fresh = sparsec.kernel(SPMV, {"A": "csr"}, schedule="precompute(A(i,j)*x(j),i,iw)")

    def body(k: sparsec.Kernel) -> str:
        return k.generated().source.split("*/", 1)[1]

    assert body(fresh) != body(same)
    assert body(fresh).replace("iw_", "i_").replace(",i,iw)", ",i,i)") == body(same)


@TYPES
@pytest.mark.parametrize(
    "schedule",
    [
        "precompute(A(i,j,k)*x(k,l),{i,j,l},{i,j,l})",  # TACO's schedulePrecompute3D
        "precompute(A(i,j,k)*x(k,l),{j,l},{jw,lw})",
        "precompute(A(i,j,k)*x(k,l),{l,j},{lw,jw})",
    ],
)
def test_multi_variable_workspace_3d(schedule, dtype, index_dtype):
    fmts = {"A": "dds"}
    dense, given = _operands(fmts, {"A": (4, 3, 5), "x": (5, 3)}, dtype, index_dtype)
    k = sparsec.kernel("y(i,j,l) = A(i,j,k) * x(k,l)", fmts, schedule=schedule)
    _close(k(**given), np.einsum("ijk,kl->ijl", dense["A"], dense["x"]), dtype)
    src = k.generated().source
    assert "a dense workspace over" in src and "_dim * " in src  # one workspace of a product


def test_multi_variable_workspace_of_some_factors():
    """Two of three factors into a 2-D workspace over (i, k), the third reads it."""
    expr = "y(i) = A(i,k) * B(k,j) * x(j)"
    fmts = {"A": "csr", "B": "csr"}
    dense, given = _operands(fmts, {"A": (6, 5), "B": (5, 4), "x": (4,)}, "float64", "int32")
    k = sparsec.kernel(expr, fmts, schedule="precompute(B(k,j)*x(j),{k},{kw})")
    _close(k(**given), dense["A"] @ dense["B"] @ dense["x"], "float64")


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ("precompute(A(i,j)*x(j),{i,j},{iw})", "2 index variables but 1 workspace"),
        ("precompute(A(i,j)*x(j),{i,i},{a,b})", "listed twice"),
        ("precompute(A(i,j)*x(j),{i,q},{a,b})", "'q' is not an index variable"),
        ("precompute(A(i,j)*x(j),{i,2},{a,b})", "not an index variable name"),
        ("precompute(A(i,j)*x(j),{i,j,{i,j})", "unbalanced"),
        ("precompute(A(i,j)*x(j),i,A)", "already a tensor"),
        ("precompute(A(i,j)*x(j),i,iw,x)", "already a tensor"),
        ("precompute(A(i,j)*x(j),i)", "3 or 4 arguments"),
    ],
)
def test_precompute_arguments_are_checked(schedule, message):
    with pytest.raises(ScheduleError, match=message):
        sparsec.kernel(SPMV, {"A": "csr"}, schedule=schedule)


def test_multi_variable_precompute_on_a_sparse_output_is_refused_clearly():
    with pytest.raises(ScheduleError, match="whole right-hand side over its last level"):
        sparsec.kernel(
            "C(i,j) = A(i,k) * B(k,j)",
            {"A": "csr", "B": "csr", "C": "csr"},
            schedule="precompute(A(i,k)*B(k,j),{i,j},{i,j})",
        )


# ------------------------------------------------------------------------ pos
MUL = "C(i) = A(i) * B(i)"


def _pattern_vectors(dtype, index_dtype):
    """TACO's pos_mul_sparse shape: two sparse vectors, overlapping in part, one with a
    stored zero, the other empty at the start."""
    a = np.array([0.0, 1.5, 0.0, 2.0, 3.0, 0.0, 0.0, 4.0, 5.0, 0.0], dtype=dtype)
    b = np.array([1.0, 2.0, 0.0, 0.0, 5.0, 6.0, 0.0, 7.0, 0.0, 8.0], dtype=dtype)
    ta = _with_stored_zero(a, "s", index_dtype)
    tb = _with_stored_zero(b, "s", index_dtype)
    return a, b, ta, tb


POS_SCHEDULES = [
    "pos(i,ipos,A)",
    "pos(i,ipos,A(i))",  # TACO's C++ spelling names the access
    "pos(i,ipos,A), split(ipos,i0,i1,2)",
    "pos(i,ipos,A), split(ipos,i0,i1,3), parallelize(i0,CPUThread,NoRaces)",
]


@TYPES
@pytest.mark.parametrize("schedule", POS_SCHEDULES)
def test_pos_over_one_sparse_operand_meets_another(schedule, dtype, index_dtype):
    a, b, ta, tb = _pattern_vectors(dtype, index_dtype)
    k = sparsec.kernel(MUL, {"A": "s", "B": "s"}, schedule=schedule)
    _close(k(A=ta, B=tb), a * b, dtype)
    assert "sc_gallop(" in k.generated().source  # B is located, not merged
    assert schedule.replace(" ", "") in k.schedule.replace(" ", "")


@TYPES
def test_pos_meets_sparse_under_cuda_emulation(dtype, index_dtype):
    a, b, ta, tb = _pattern_vectors(dtype, index_dtype)
    k = sparsec.kernel(
        MUL,
        {"A": "s", "B": "s"},
        target="cuda-emulated",
        schedule="pos(i,ipos,A), split(ipos,blk,t,4), parallelize(blk,GPUBlock,NoRaces), "
        "parallelize(t,GPUThread,NoRaces)",
    )
    _close(k(A=ta, B=tb), a * b, dtype)


@pytest.mark.parametrize(
    ("expr", "ref"),
    [
        ("C(i) = A(i) * (B(i) + D(i))", lambda a, b, d: a * (b + d)),
        ("C(i) = A(i) * B(i) * D(i)", lambda a, b, d: a * b * d),
        ("C(i) = A(i) * B(i) + A(i) * D(i)", lambda a, b, d: a * b + a * d),
    ],
)
@pytest.mark.parametrize("dfmt", ["s", "dense"])
def test_pos_lattice_cases(expr, ref, dfmt):
    """Each lattice point of the others' presence picks its own expression."""
    rng = np.random.default_rng(5)
    a, b, d = (sparse_array((12,), rng, 0.5) for _ in range(3))
    fmts = {"A": "s", "B": "s", "D": dfmt}
    given = {
        n: (v if fmts[n] == "dense" else _with_stored_zero(v, fmts[n], "int32"))
        for n, v in (("A", a), ("B", b), ("D", d))
    }
    for schedule in ("pos(i,ipos,A)", "pos(i,ipos,A), split(ipos,i0,i1,4)"):
        k = sparsec.kernel(expr, fmts, schedule=schedule)
        _close(k(**given), ref(a, b, d), "float64")


@TYPES
@pytest.mark.parametrize("bfmt", ["csr", "dcsr", "coo"])
@pytest.mark.parametrize(
    "schedule",
    ["pos(j,jpos,A)", "pos(j,jpos,A(i,j)), split(jpos,j0,j1,2)"],
)
def test_pos_inner_level_meets_sparse_matrix(schedule, bfmt, dtype, index_dtype):
    fmts = {"A": "csr", "B": bfmt}
    dense, given = _operands(fmts, {"A": (8, 7), "B": (8, 7)}, dtype, index_dtype)
    k = sparsec.kernel("y(i) = A(i,j) * B(i,j)", fmts, schedule=schedule)
    _close(k(**given), (dense["A"] * dense["B"]).sum(axis=1), dtype)


def test_pos_meeting_sparse_into_a_sparse_output():
    fmts = {"A": "csr", "B": "csr", "y": "s"}
    dense, given = _operands(
        {"A": "csr", "B": "csr"}, {"A": (8, 7), "B": (8, 7)}, "float64", "int32"
    )
    k = sparsec.kernel("y(i) = A(i,j) * B(i,j)", fmts, schedule="pos(j,jpos,A)")
    _close(k(**given), (dense["A"] * dense["B"]).sum(axis=1), "float64")


@pytest.mark.parametrize(
    ("expr", "fmts", "schedule", "message"),
    [
        ("C(i) = A(i) + B(i)", {"A": "s", "B": "s"}, "pos(i,ipos,A)", "has no entry"),
        ("C(i) = A(i) * B(i)", {"A": "s", "B": "s"}, "pos(i,ipos,x(i))", "not a tensor"),
        ("C(i) = A(i) * B(i)", {"A": "s", "B": "s"}, "pos(i,ipos,A(j))", "not an access"),
        ("C(i) = A(i) * B(i)", {"A": "s", "B": "s"}, "pos(i,ipos,C(i))", "is the output"),
        ("C(i) = A(i) * B(i)", {"A": "s", "B": "s"}, "pos(i,ipos,A(i)", "unbalanced"),
        (
            "y(i) = A(i,j) * B(i,j)",
            {"A": "dcsr", "B": "coo"},
            "pos(i,ipos,A)",
            "repeats coordinates",
        ),
    ],
)
def test_pos_errors(expr, fmts, schedule, message):
    with pytest.raises(ScheduleError, match=message):
        sparsec.kernel(expr, fmts, schedule=schedule)


def test_pos_with_dense_others_generates_the_same_code():
    """No sparse operand to meet: the position loop is the one it was before."""
    k = sparsec.kernel(MUL, {"A": "s"}, schedule="pos(i,ipos,A)")
    assert (
        "sc_gallop(" not in k.generated().source.split("*/", 1)[1].split("int sparsec_kernel(")[1]
    )


# --------------------------------------------------------------- format letter
def test_letter_p_is_a_padded_unique_singleton():
    fmt = parse_format("ddp", 3)
    last = fmt.levels[2]
    assert isinstance(last, Singleton) and last.unique and last.padded
    assert fmt.spelling == "ddp" and str(fmt) == "ddp"
    assert parse_format("d1d0p2", 3).spelling == "ddp:1,0,2"
    assert parse_format("uqp", 3).levels[1].unique is False  # q over p is non-unique
    assert parse_format("ddp", 3) != parse_format("ddq", 3)


def _ell(rows, width, cols, rng):
    """An ELL tensor E(slot, row, col): row r's nonzeros spread over the slots, rows with
    fewer than ``width`` nonzeros padded (no entry there), empty rows included."""
    e = np.zeros((width, rows, cols))
    for r in range(rows):
        n = 0 if r == 2 else int(rng.integers(0, width + 1))
        for s, c in enumerate(sorted(rng.choice(cols, size=n, replace=False))):
            e[s, r, c] = rng.uniform(-1, 1) if (r, s) != (0, 0) else 0.0  # a stored zero
    return e


@TYPES
@pytest.mark.parametrize("target", ["c", "cuda-emulated"])
def test_ell_spmv_with_ddp(target, dtype, index_dtype):
    """TACO's espmv: a(i) = B(j,i,k) * c(k) with B in ELL ({Dense, Dense, Singleton(PADDED)})."""
    rng = np.random.default_rng(3)
    e = _ell(6, 3, 5, rng).astype(dtype)
    c = rng.uniform(-1, 1, 5).astype(dtype)
    tb = sparsec.Tensor.from_dense(e, "ddp", index_dtype=index_dtype)
    assert tb.format.spelling == "ddp"
    k = sparsec.kernel("a(i) = B(j,i,k) * c(k)", {"B": "ddp"}, target=target)
    _close(k(B=tb, c=c), np.einsum("jik,k->i", e, c), dtype)
    assert "ddp" in _header(k)


def test_p_in_cli_format_and_help():
    from sparsec.tensors.formats import FORMAT_HELP

    assert "p" in FORMAT_HELP.split("letters")[1]
    with pytest.raises(FormatError, match="unknown format 'ddx'"):
        parse_format("ddx", 3)


# ------------------------------------------------------- TACO's scheduling tests
MERGEBY = "y(i) = A(i,j) * B(i,j) * x(j)"
MERGEBY_FORMATS = {"A": "ss", "B": "ds", "x": "s"}


@pytest.mark.parametrize(
    "schedule",
    [
        "mergeby(j,Gallop)",
        "mergeby(j,TwoFinger)",
        "mergeby(i,Gallop)",
        "mergeby(i,Gallop), pos(i,ipos,A(i,j))",  # mergeby then pos: moot, as in TACO
        "mergeby(i,Gallop), parallelize(i,CPUThread,NoRaces)",
    ],
)
def test_taco_mergeby_suite(schedule):
    """tests-scheduling.cpp's mergeby test, on integers."""
    rng = np.random.default_rng(59393)
    a = sparse_array((12, 12), rng, 0.3, integer=True)
    b = np.where(a != 0, a + 1, 0.0)
    x = sparse_array((12,), rng, 0.6, integer=True)
    given = {
        "A": _with_stored_zero(a, "ss", "int32"),
        "B": _with_stored_zero(b, "ds", "int32"),
        "x": _with_stored_zero(x, "s", "int32"),
    }
    k = sparsec.kernel(MERGEBY, MERGEBY_FORMATS, schedule=schedule)
    _close(k(**given), (a * b) @ x, "float64")


def test_taco_mergeby_then_split_of_a_sparse_loop_says_to_use_pos():
    """TACO splits i in coordinate space; sparsec refuses a split of a loop over a
    compressed level and names the pos that makes it a range (mergeby is not the cause)."""
    with pytest.raises(ScheduleError, match=r"not a plain range; iterate its positions with pos"):
        k = sparsec.kernel(
            MERGEBY, MERGEBY_FORMATS, schedule="mergeby(i,Gallop), split(i,i1,i2,16)"
        )
        k.source  # noqa: B018 - generation raises


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ("pos(j,ipos,x(i))", "'j' is not a loop"),  # pos_var_not_in_access
        ("pos(i,ipos,x(j))", "not an access"),  # pos_wrong_access
        ("pos(i,ipos,y(i))", "is the output"),
    ],
)
def test_taco_pos_errors(schedule, message):
    with pytest.raises(ScheduleError, match=message):
        sparsec.kernel("y(i) = x(i)", {}, schedule=schedule)


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ("split(i,i0,i1,2), precompute(A(i,j)*x(j),i1,i1w)", "not an index variable"),
        ("precompute(A(i,j)*x(j),i,iw), split(iw,i0,i1,8)", "'iw' is not a loop"),
        ("split(i,i0,iInner,2), pos(iInner,ipos,A)", "already derived"),
        ("bound(i,ib,8,MinExact)", "bound kind 'MinExact' is not supported"),
        ("split(i,i0,i1,16),precompute(A(i,j)*x(j),i,i)", "runs inside the workspace"),
    ],
)
def test_taco_spellings_sparsec_still_refuses(schedule, message):
    """Listed in docs/scheduling.md: each refusal names what is wrong."""
    with pytest.raises(ScheduleError, match=message):
        sparsec.kernel(SPMV, {"A": "csr"}, schedule=schedule).source  # noqa: B018


@pytest.mark.parametrize(
    "schedule",
    [
        "precompute(b(i,j)*1*c(j),j,j)",
        "precompute(b(i,j)*1*c(j),j,k)",
        "precompute(b(i,j)*1,j,j)",
        "precompute(b(i,j)*1,j,k)",
    ],
)
def test_taco_cli_precompute_directives(schedule):
    """taco-cli-test.bats: a(i) = b(i,j)*1 * c(j), -f=b:ds."""
    dense, given = _operands({"b": "ds"}, {"b": (6, 7), "c": (7,)}, "float64", "int32")
    k = sparsec.kernel("a(i) = b(i,j)*1 * c(j)", {"b": "ds"}, schedule=schedule)
    _close(k(**given), dense["b"] @ dense["c"], "float64")


@pytest.mark.parametrize("check", [False, True])
def test_cli_takes_taco_spellings(capsys, check):
    from sparsec.cli import main

    args = [
        "compile",
        "C(i,j) = A(i,k) * B(k,j)",
        "-f", "A:csr", "-f", "B:csr", "-f", "C:csr",
        "-s", "precompute(A(i,k)*B(k,j),j,j)",
        "-s", "assemble(C,Insert,true)",
    ]  # fmt: skip
    code = main([*args, "--check"] if check else args)
    out = capsys.readouterr()
    assert code == 0, out
    if check:
        assert "check: ok" in out.out
    else:
        assert "schedule: user: precompute(A(i,k)*B(k,j),j,j), assemble(C,Insert,true)" in out.out


@pytest.mark.parametrize(
    ("expr", "schedule", "ref"),
    [
        (  # tests-scheduling-eval.cpp scheduleSpMVCPU
            SPMV,
            "split(i,i0,i1,16), reorder({i0,i1,j}), parallelize(i0,CPUThread,NoRaces)",
            lambda d: d["A"] @ d["x"],
        ),
        (  # scheduleSpMMCPU
            "y(i,k) = A(i,j) * x(j,k)",
            "split(i,i0,i1,16), pos(j,jpos,A(i,j)), split(jpos,jpos0,jpos1,8), "
            "reorder({i0,i1,jpos0,k,jpos1}), parallelize(i0,CPUThread,NoRaces), "
            "parallelize(k,CPUVector,IgnoreRaces)",
            lambda d: d["A"] @ d["x"],
        ),
    ],
)
def test_taco_cpu_schedules_verbatim(expr, schedule, ref):
    """TACO's C++ schedules written as text: reorder takes its {list}, pos an access."""
    shapes = {"A": (37, 29), "x": (29, 5) if "k" in expr else (29,)}
    dense, given = _operands({"A": "csr"}, shapes, "float64", "int32")
    k = sparsec.kernel(expr, {"A": "csr"}, schedule=schedule)
    _close(k(**given), ref(dense), "float64")
    assert "reorder(i0,i1," in k.schedule  # the list is read as the order


def test_reorder_list_errors():
    with pytest.raises(ScheduleError, match="at least two index variables"):
        sparsec.kernel(SPMV, {"A": "csr"}, schedule="reorder({i})")
    with pytest.raises(ScheduleError, match="not an index variable name"):
        sparsec.kernel(SPMV, {"A": "csr"}, schedule="reorder({i,2})")


@pytest.mark.parametrize(
    ("expr", "ref"),
    [("y(i) = a(i) * b(i)", lambda a, b: a * b), ("y(i) = a(i) + b(i)", lambda a, b: a + b)],
)
def test_pos_over_a_dense_level_locates_sparse_others(expr, ref):
    """pos over a dense level visits every coordinate: a sparse operand there is located,
    and the terms without it (a union's) run where it is absent."""
    rng = np.random.default_rng(8)
    a, b = sparse_array((15,), rng, 0.6), sparse_array((15,), rng, 0.4)
    k = sparsec.kernel(expr, {"a": "d", "b": "s"}, schedule="pos(i,ipos,a), split(ipos,i0,i1,4)")
    _close(k(a=a, b=_with_stored_zero(b, "s", "int32")), ref(a, b), "float64")


@pytest.mark.parametrize(
    "schedule",
    [
        "pos(j,jpos,A), split(jpos,j0,j1,4), parallelize(j0,CPUThread,Atomics)",
        "pos(j,jpos,A), split(jpos,j0,j1,4), parallelize(j0,CPUThread,ParallelReduction)",
        "pos(j,jpos,A), parallelize(jpos,CPUVector,ParallelReduction)",
        "pos(i,ipos,A), split(ipos,i0,i1,2), parallelize(i0,CPUThread,Temporary)",
    ],
)
@pytest.mark.parametrize("afmt", ["csr", "dcsr"])
def test_pos_meeting_sparse_under_parallel_strategies(schedule, afmt):
    fmts = {"A": afmt, "B": "dcsr"}
    dense, given = _operands(fmts, {"A": (13, 11), "B": (13, 11)}, "float64", "int32")
    k = sparsec.kernel("y(i) = A(i,j) * B(i,j)", fmts, schedule=schedule)
    _close(k(**given), (dense["A"] * dense["B"]).sum(axis=1), "float64")
