"""Frontend tests: text -> AST (round trip, tree shape, spans) and text -> error (class, message,
caret). Tables first; hypothesis properties at the end."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsec.base.errors import NotationError, ParseError, SparsecError
from sparsec.frontend.notation import Access, Assignment, BinOp, Expr, Literal, Neg
from sparsec.frontend.parser import MAX_DEPTH, MAX_LENGTH, check, parse, parse_expression


def acc(name: str, *indices: str) -> Access:
    return Access(name, indices)


def lit(value: float) -> Literal:
    return Literal(value)


def add(a: Expr, b: Expr) -> BinOp:
    return BinOp("+", a, b)


def sub(a: Expr, b: Expr) -> BinOp:
    return BinOp("-", a, b)


def mul(a: Expr, b: Expr) -> BinOp:
    return BinOp("*", a, b)


def div(a: Expr, b: Expr) -> BinOp:
    return BinOp("/", a, b)


a, b, c, d = acc("a"), acc("b"), acc("c"), acc("d")

# --- round trip ----------------------------------------------------------------------------

ROUND_TRIP = [
    "y(i) = A(i,j) * x(j)",
    "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)",
    "a = B(i,j) * C(i,j)",
    "y(i) += A(i,j)*x(j)",
    "a(i) = alpha * B(i,k) * c(k) + beta * d(i)",
    "A(i,j) = B(i,j) + C(i,j)",
    "A(i,j) = B(i,j) - C(i,j)",
    "A(i,j) = B(i,k) * C(k,j)",
    "A(i,j,k) = B(i,j,k) * C(i,j,k)",
    "a = ((b))",
    "a = ((b + c) * (d - e))",
    "a = (((b + c) * d) - e) / f",
    "a = b - (c - d)",
    "a = b - c - d",
    "a = b / (c / d)",
    "a = b / c / d",
    "a = -(b + c)",
    "a = --b",
    "a = ---b",
    "a = -b * -c",
    "a = b - -c",
    "a = -(b * c)",
    "a = 2",
    "a = 0.5 * b",
    "a = .5 * b",
    "a = 1e-3 * b",
    "a = 2.5E+10 * b",
    "a = 2. + b",
    "a = 1.7976931348623157e308",
    "a = 5e-324",
    "a = b()",
    "a() = b",
    "y(i) = A(i, j) *\n  x(j)",
    "  y ( i ) =\tA ( i , j )*x( j )  ",
    "_x1(i_2) = B_(i_2, Z9) * c__(Z9)",
    "a = b + c * d - e / f",
    "a = (b + c) * (d + e)",
    "y(i) += 2 * A(i,j) * x(j) + -y0(i)",
    "a = b * (c * d)",
    "a = b + (c + d)",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(text: str) -> None:
    ast = parse(text)
    printed = str(ast)
    assert parse(printed) == ast
    assert str(parse(printed)) == printed


# --- tree shape: precedence and associativity ---------------------------------------------

SHAPES = [
    ("y = a - b - c", sub(sub(a, b), c)),
    ("y = a - (b - c)", sub(a, sub(b, c))),
    ("y = a / b / c", div(div(a, b), c)),
    ("y = a / (b / c)", div(a, div(b, c))),
    ("y = a + b * c", add(a, mul(b, c))),
    ("y = a * b + c", add(mul(a, b), c)),
    ("y = (a + b) * c", mul(add(a, b), c)),
    ("y = a - b + c", add(sub(a, b), c)),
    ("y = a * b / c", div(mul(a, b), c)),
    ("y = a / b * c", mul(div(a, b), c)),
    ("y = -a * b", mul(Neg(a), b)),
    ("y = -a + b", add(Neg(a), b)),
    ("y = -(a + b)", Neg(add(a, b))),
    ("y = --a", Neg(Neg(a))),
    ("y = a * -b", mul(a, Neg(b))),
    ("y = 2 * a", mul(lit(2.0), a)),
    ("y = -2", Neg(lit(2.0))),
    ("y = .5", lit(0.5)),
    ("y = 1e-3", lit(0.001)),
    ("y = 2.5E+10", lit(2.5e10)),
    ("y = B()", acc("B")),
    ("y = A(i,j) * x(j)", mul(acc("A", "i", "j"), acc("x", "j"))),
]


@pytest.mark.parametrize(("text", "rhs"), SHAPES)
def test_tree_shape(text: str, rhs: Expr) -> None:
    assert parse(text).rhs == rhs


@pytest.mark.parametrize(
    ("text", "lhs", "accumulate"),
    [
        ("y(i) = x(i)", acc("y", "i"), False),
        ("y(i) += x(i)", acc("y", "i"), True),
        ("a = b", a, False),
        ("a() += b", a, True),
        ("A(i,j) = B(i,j)", acc("A", "i", "j"), False),
    ],
)
def test_left_hand_side(text: str, lhs: Access, accumulate: bool) -> None:
    ast = parse(text)
    assert (ast.lhs, ast.accumulate) == (lhs, accumulate)


def test_spans() -> None:
    text = "y(i) = (A(i, j)) * -x(j)"
    ast = parse(text)
    assert ast.span == (0, len(text))
    assert ast.lhs.span == (0, 4) and ast.lhs.index_spans == ((2, 3),)
    assert isinstance(ast.rhs, BinOp)
    product, matrix, negated = ast.rhs, ast.rhs.left, ast.rhs.right
    assert text[slice(*product.span)] == "(A(i, j)) * -x(j)"
    assert isinstance(matrix, Access)
    assert text[slice(*matrix.span)] == "(A(i, j))"  # a node's span includes its parentheses
    assert [text[slice(*s)] for s in matrix.index_spans] == ["i", "j"]
    assert isinstance(negated, Neg)
    assert text[slice(*negated.span)] == "-x(j)"
    assert text[slice(*negated.operand.span)] == "x(j)"


def test_check_returns_the_assignment_unchanged() -> None:
    ast = parse("y(i) = A(i,j) * x(j)")
    assert check(ast) is ast
    assert parse_expression("y(i) = A(i,j) * x(j)") == ast


# --- errors --------------------------------------------------------------------------------

DEEP = "y = " + "(" * 10_000 + "x" + ")" * 10_000

ERRORS = [
    # text, error class, message substring, caret column (err.span[0]) or None
    ("", ParseError, "empty expression", 0),
    ("   \n\t", ParseError, "empty expression", 0),
    ("=", ParseError, "unexpected '='; expected the output", 0),
    ("3 = x", ParseError, "unexpected number 3; expected the output", 0),
    ("y(i) =", ParseError, "expression ends early; expected an operand after '='", 6),
    ("y(i) = A(i) +", ParseError, "expression ends early; expected an operand after '+'", 13),
    ("y(i) = -", ParseError, "expected an operand after '-'", 8),
    ("y(i)", ParseError, "ends early; expected '=' or '+=' after the left-hand side", 4),
    ("y(i) A(i)", ParseError, "unexpected name 'A'; expected '=' or '+='", 5),
    ("y(i) = A(i,", ParseError, "'(' at column 9 is never closed", 8),
    ("y(i) = (A(i)", ParseError, "unbalanced parentheses: '(' at column 8 is never closed", 7),
    ("y(i) = A(i))", ParseError, "unbalanced parentheses: ')' at column 12 has no matching", 11),
    (")y = x(", ParseError, "')' at column 1 has no matching '('", 0),
    ("y = a\n  + (b", ParseError, "'(' at line 2, column 5 is never closed", 10),
    ("y(1) = A(1)", ParseError, "unexpected number 1; expected an index variable", 2),
    ("y(i) = A(i,,j)", ParseError, "unexpected ','; expected an index variable after ','", 11),
    ("y(i) = A(i,)", ParseError, "unexpected ')'; expected an index variable after ','", 11),
    ("y(i) = A(i j)", ParseError, "unexpected name 'j'; expected ',' or ')'", 11),
    (
        "y(i) = A(i) x(i)",
        ParseError,
        "unexpected name 'x'; expected '+', '-', '*', '/' or the end",
        12,
    ),
    ("y = a b", ParseError, "unexpected name 'b'; expected '+', '-', '*', '/', '(' or the end", 6),
    ("y = 2a", ParseError, "unexpected name 'a'", 5),
    ("y = .", ParseError, "unexpected character '.'; expected an operand after '='", 4),
    ("y(i) == x(i)", ParseError, "unexpected '='; expected an operand after '='", 6),
    ("y = a += b", ParseError, "unexpected '+='", 6),
    ("y(i) = A(i) = B(i)", ParseError, "unexpected '='", 12),
    ("y = ()", ParseError, "unexpected ')'; expected an operand after '('", 5),
    ("y(i) = A(i)$x(i)", ParseError, "unknown character '$'", 11),
    ("y(i) = A(i)·x(i)", ParseError, "unknown character '·' (U+00B7)", 11),
    ("y = 😀", ParseError, "unknown character '😀'", 4),
    ("ÿ = x", ParseError, "unknown character 'ÿ'", 0),
    ('A;system("ls")', ParseError, "unknown character ';'", 1),
    ('A;system("rm -rf /")', ParseError, "unknown character ';'", 1),
    ("y = x\x00", ParseError, "unknown character '\\x00'", 5),
    (
        DEEP,
        ParseError,
        f"parentheses nest too deeply (more than {MAX_DEPTH} levels)",
        4 + MAX_DEPTH,
    ),
    ("y = " + "-" * 1000 + "x", ParseError, "expression nests too deeply", None),
    ("y = " + "+".join(["x"] * 1000), ParseError, "expression nests too deeply", None),
    ("y = " + "x" * (MAX_LENGTH + 1), ParseError, "expression is too long", MAX_LENGTH),
    ("y = 1e999", NotationError, "numeric literal 1e999 is out of range", 4),
    ("y = 2 * " + "9" * 400, NotationError, "is out of range", 8),
    ("A(i,j) = B(i,k)", NotationError, "index variable 'j' of the output does not appear", 4),
    ("y(i) = 2", NotationError, "index variable 'i' of the output", 2),
    ("B(i,i) = C(i)", NotationError, "index variable 'i' appears twice in B(i,i)", 4),
    # a read may repeat an index (issue 23: the diagonal); the output may not
    ("y(i,j,j) = C(i,j)", NotationError, "'j' appears twice in y(i,j,j)", 6),
    (
        "y(i) = A(i,j)*A(j)",
        NotationError,
        "'A' is used as an order-1 tensor here but as an order-2",
        14,
    ),
    (
        "y = a * a(i)",
        NotationError,
        "used as an order-1 tensor here but as a scalar at column 5",
        8,
    ),
    ("y(i) = x(i) * y", NotationError, "'y' is used as a scalar here but as an order-1 tensor", 14),
    ("y(i) = y(i) + x(i)", NotationError, "use += to accumulate into it", 7),
    ("y(i) += y(i) * x(i)", NotationError, "cannot be read on the right-hand side", 8),
    ("a = a", NotationError, "the output 'a' cannot be read on the right-hand side", 4),
]


@pytest.mark.parametrize(("text", "error", "message", "column"), ERRORS)
def test_errors(text: str, error: type[SparsecError], message: str, column: int | None) -> None:
    with pytest.raises(error) as caught:
        parse_expression(text)
    err = caught.value
    assert type(err) is error
    assert message in err.message
    assert err.source == text and err.span is not None
    if column is not None:
        assert err.span[0] == column


def test_error_table_is_large_enough() -> None:
    assert len(ERRORS) >= 30 and len(ROUND_TRIP) >= 30


def test_caret_rendering() -> None:
    with pytest.raises(ParseError) as caught:
        parse_expression("y(i) = A(i,j) $ x(j)")
    assert str(caught.value) == ("unknown character '$'\n  y(i) = A(i,j) $ x(j)\n                ^")
    with pytest.raises(NotationError) as notation:
        parse_expression("A(i,j) = B(i,k)")
    assert str(notation.value) == (
        "index variable 'j' of the output does not appear on the right-hand side\n"
        "  A(i,j) = B(i,k)\n"
        "      ^"
    )
    with pytest.raises(ParseError) as caught:
        parse_expression("y(i) = A(i) +")
    assert str(caught.value).splitlines()[1:] == ["  y(i) = A(i) +", "               ^"]


def test_deep_nesting_fails_fast() -> None:
    start = time.perf_counter()
    with pytest.raises(ParseError):
        parse_expression(DEEP)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("y = " + "(" * MAX_DEPTH + "x" + ")" * MAX_DEPTH, True),
        ("y = " + "(" * (MAX_DEPTH + 1) + "x" + ")" * (MAX_DEPTH + 1), False),
        ("y = " + "-" * (MAX_DEPTH - 1) + "x", True),
        ("y = " + "-" * MAX_DEPTH + "x", False),
        ("y = " + "+".join(["x"] * MAX_DEPTH), True),
        ("y = " + "+".join(["x"] * (MAX_DEPTH + 2)), False),
        ("y = " + "x" * (MAX_LENGTH - 4), True),
    ],
)
def test_limits(text: str, ok: bool) -> None:
    if ok:
        parse(text)
    else:
        with pytest.raises(ParseError, match="too deeply"):
            parse(text)


def test_check_without_source_still_locates() -> None:
    ast = parse("y(i) = A(i,j)*A(j)")
    with pytest.raises(NotationError) as caught:
        check(ast)
    assert caught.value.source is None and caught.value.span == (14, 18)
    assert "at column 8" in str(caught.value)


def test_non_string_input() -> None:
    with pytest.raises(ParseError, match="expected the expression as a string"):
        parse(42)  # type: ignore[arg-type]


# --- properties ----------------------------------------------------------------------------

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,4}", fullmatch=True)
accesses = st.builds(Access, names, st.lists(names, max_size=3).map(tuple))
literals = st.builds(
    Literal,
    st.floats(min_value=0.0, allow_nan=False, allow_infinity=False).map(abs),
)
expressions = st.recursive(
    accesses | literals,
    lambda inner: (
        st.builds(Neg, inner)
        | st.builds(BinOp, st.sampled_from(["+", "-", "*", "/"]), inner, inner)
    ),
    max_leaves=16,
)
assignments = st.builds(Assignment, accesses, expressions, st.booleans())


@given(assignments)
def test_round_trip_property(ast: Assignment) -> None:
    assert parse(str(ast)) == ast


@settings(max_examples=300)
@given(st.text(max_size=40) | st.text(alphabet="yAij(),=+-*/.1e \n", max_size=40))
def test_any_text_gives_an_assignment_or_a_sparsec_error(text: str) -> None:
    try:
        result = parse_expression(text)
    except (ParseError, NotationError) as err:
        assert err.source == text and err.span is not None
        assert 0 <= err.span[0] <= len(text) + 1
        assert str(err).startswith(err.message)
    else:
        assert isinstance(result, Assignment)


def test_parser_tables_are_cached_and_a_bad_file_is_rebuilt(tmp_path, monkeypatch) -> None:
    """The grammar's LALR tables are written to the cache directory by the first process
    and loaded by later ones; a corrupt file is rebuilt, and an unusable cache directory
    only costs the analysis: every parse gives the same assignment."""
    from sparsec.base.resources import read_entry
    from sparsec.frontend import parser as p

    text = "A(i,j) = B(i,k) * C(k,j) + 2 * -D(i,j)"
    want = parse(text)
    monkeypatch.setenv("SPARSEC_CACHE_DIR", str(tmp_path / "cache"))
    try:
        p._lark.cache_clear()
        assert parse(text) == want
        (tables,) = (tmp_path / "cache").glob("grammar-*.lark")
        written, stamp = tables.read_bytes(), tables.stat().st_mtime_ns
        p._lark.cache_clear()
        assert parse(text) == want  # loaded from the file, which is left as it was
        assert tables.read_bytes() == written and tables.stat().st_mtime_ns == stamp
        tables.write_bytes(b"not lark's tables\n" + written[: len(written) // 2])
        p._lark.cache_clear()
        assert parse(text) == want
        # rewritten whole: an entry whose payload matches the digest heading it
        assert read_entry(tables) is not None
        stamp = tables.stat().st_mtime_ns
        p._lark.cache_clear()
        assert parse(text) == want
        assert tables.stat().st_mtime_ns == stamp  # and loaded, not rebuilt, next time
        (tmp_path / "file").write_text("")
        monkeypatch.setenv("SPARSEC_CACHE_DIR", str(tmp_path / "file" / "cache"))
        p._lark.cache_clear()
        assert parse(text) == want
    finally:
        p._lark.cache_clear()
