"""Table-driven bad-input corpus: malformed expressions, broken storage, wrong call inputs.

Every rejected row names the exact `SparsecError` subclass and a message fragment; nothing
here may crash, hang, leak a foreign exception or reach the generated C.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsec
from sparsec import (
    DTypeError,
    FormatError,
    InputError,
    NotationError,
    ParseError,
    ShapeError,
    SparsecError,
    StorageError,
    Tensor,
)
from sparsec.runtime.executable import Executable

SPMV = "y(i) = A(i,j) * x(j)"
MTTKRP = "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)"
ACCUM = "y(i) += alpha * (A(i,j) * x(j) - 2.5e-3 / z(i))"

# --------------------------------------------------------------------------- expressions


def _truncation_expectation(text: str) -> tuple[type[SparsecError], str] | None:
    """What a prefix of a valid expression must raise (None: the prefix is itself valid)."""
    stripped = text.strip()
    if not stripped:
        return ParseError, "empty expression"
    if text.count("(") > text.count(")"):
        return ParseError, "is never closed"
    if "=" not in stripped:
        return ParseError, "expected '=' or '+=' after the left-hand side"
    if stripped[-1] in "=+-*/":
        return ParseError, "expression ends early; expected an operand"
    return None


def _truncations(valid: str) -> list[tuple[str, type[SparsecError], str]]:
    rows = []
    for n in range(len(valid)):
        expected = _truncation_expectation(valid[:n])
        if expected is not None:
            rows.append((valid[:n], *expected))
    return rows


#: prefixes that parse but leave an output index unbound
UNBOUND_PREFIXES = [
    ("A(i,j) = B", NotationError, "index variable 'i' of the output does not appear"),
    ("A(i,j) = B(i,k,l)", NotationError, "index variable 'j' of the output does not appear"),
    ("A(i,j) = B(i,k,l) ", NotationError, "index variable 'j' of the output does not appear"),
    ("A(i,j) = B(i,k,l) * D", NotationError, "index variable 'j' of the output does not appear"),
    ("y(i) += alpha", NotationError, "index variable 'i' of the output does not appear"),
]

STRAY_CHARACTERS = "$#@!;{}[]:?~^%&|\\'\"`"
STRAY = [
    (SPMV[:pos] + ch + SPMV[pos:], ParseError, f"unknown character {ch!r}")
    for ch in STRAY_CHARACTERS
    for pos in (0, 7, len(SPMV))
]

#: (text, the first foreign character)
UNICODE = [
    ("y(i) = αA(i)", "α"),
    ("y(i) = A(ι)", "ι"),
    ("ÿ(i) = A(i)", "ÿ"),
    ("y(i) = A(i) * ２", "２"),
    ("y(i) = A(i) * \u0661", "\u0661"),
    ("y(i) = A（i）", "（"),
    ("y(i) = A(i) 😀", "😀"),
    ("y(i) = A(i)\u00a0", "\u00a0"),
    ("y(i) = A(i)\u200b", "\u200b"),
    ("y(i) = A(i)\x00", "\x00"),
    ("y(i) = Ａ(i)", "Ａ"),
    ("y(i) = A(i) \u2212 x(i)", "\u2212"),
    ("y(i) = A(i) × x(i)", "×"),
]


def _unicode_fragment(ch: str) -> str:
    return f"unknown character {ch!r}" + ("" if ch.isascii() else f" (U+{ord(ch):04X})")


MISC = [
    # empty, whitespace, lone operators
    ("", ParseError, "empty expression"),
    (" ", ParseError, "empty expression"),
    ("\t\n", ParseError, "empty expression"),
    ("\n\n\n", ParseError, "empty expression"),
    ("=", ParseError, "expected the output"),
    (" = ", ParseError, "expected the output"),
    ("+=", ParseError, "expected the output"),
    ("= A(i)", ParseError, "expected the output"),
    ("(", ParseError, "is never closed"),
    (")", ParseError, "has no matching '('"),
    ("()", ParseError, "expected the output"),
    # syntax
    ("y(i) = A(i,j) ** x(j)", ParseError, "unexpected '*'; expected an operand after '*'"),
    ("y(i) == A(i)", ParseError, "unexpected '='"),
    ("y(i) = A(i) = B(i)", ParseError, "unexpected '='"),
    ("y(i) -= A(i)", ParseError, "expected '=' or '+=' after the left-hand side"),
    ("y(i) *= A(i)", ParseError, "expected '=' or '+=' after the left-hand side"),
    ("y(i) = A(i,)", ParseError, "expected an index variable after ','"),
    ("y(i) = A(,i)", ParseError, "unexpected ','"),
    ("y(i) = A(i,,j)", ParseError, "unexpected ','"),
    ("y(i) = A((i))", ParseError, "unexpected '('"),
    ("y(i) = A(i j)", ParseError, "expected ',' or ')' in the index list"),
    ("y(i) = A(i) B(i)", ParseError, "unexpected name 'B'"),
    ("y(i) = ()", ParseError, "unexpected ')'"),
    ("y(i) = A()(i)", ParseError, "unexpected '('"),
    ("y(i) = 2(i)", ParseError, "unexpected '('"),
    ("y(i) = A(i) * 3x", ParseError, "unexpected name 'x'"),
    ("y(i) = A(i) * 1.2.3", ParseError, "unexpected number .3"),
    ("y(i) = A(i) * 1e", ParseError, "unexpected name 'e'"),
    ("y(i) = A(i) * .", ParseError, "unexpected character '.'"),
    ("y(i) = * A(i)", ParseError, "unexpected '*'"),
    ("y(i) = (A(i) +) x(i)", ParseError, "unexpected ')'"),
    ("y(i) A(i)", ParseError, "unexpected name 'A'"),
    ("y(i) = A(i)) * (x(i)", ParseError, "has no matching '('"),
    (")y(i) = A(i)(", ParseError, "has no matching '('"),
    ("y(i) = x(i)\ny(i) = x(i)", ParseError, "unexpected name 'y'"),
    # numeric index names
    ("y(i) = A(1)", ParseError, "unexpected number 1"),
    ("y(1) = A(1)", ParseError, "unexpected number 1"),
    ("y(i) = A(i,2)", ParseError, "unexpected number 2"),
    ("y(i) = A(1i)", ParseError, "unexpected number 1"),
    ("y(i) = A(0)", ParseError, "unexpected number 0"),
    # injection-looking text
    ('A;system("rm -rf /")', ParseError, "unknown character ';'"),
    ("A(i) = B(i); int main(){}", ParseError, "unknown character ';'"),
    ("y(i) = x(i) /* */", ParseError, "unexpected '*'; expected an operand after '/'"),
    ("y(i) = x(i) // comment", ParseError, "unexpected '/'"),
    ("__import__('os')", ParseError, 'unknown character "\'"'),
    ("y(i) = __import__('os').system('ls')", ParseError, 'unknown character "\'"'),
    # a call of a name that is no function (issue 23: the error lists the functions)
    ("y(i) = eval(x(i))", NotationError, "unknown function 'eval'; the functions are abs"),
    ("y(i) = x(i) \\\n * 2", ParseError, "unknown character '\\\\'"),
    # huge literals
    ("y(i) = A(i) * 1e999", NotationError, "numeric literal 1e999 is out of range"),
    ("y(i) = A(i) * " + "9" * 400, NotationError, "is out of range"),
    ("y(i) = A(i) * 1" + "0" * 400 + ".5", NotationError, "is out of range"),
    ("y(i) = A(i) * 1.8e308", NotationError, "is out of range"),
    # depth and length limits
    ("y(i) = " + "(" * 10_000 + "x(i)" + ")" * 10_000, ParseError, "parentheses nest too deeply"),
    ("y(i) = " + "-" * 10_000 + "x(i)", ParseError, "nests too deeply"),
    ("y(i) = " + "(" * 300 + "x(i)" + ")" * 300, ParseError, "parentheses nest too deeply"),
    ("y(i) = " + "-" * 300 + "x(i)", ParseError, "nests too deeply"),
    ("y(i) = x(i)" + " + x(i)" * 300, ParseError, "nests too deeply"),
    ("y(i) = x(i)" + " * x(i)" * 300, ParseError, "nests too deeply"),
    ("y(i) = " + "x(i) + " * 20_000 + "x(i)", ParseError, "expression is too long"),
    ("y(i) = " + "A" * 100_001, ParseError, "expression is too long"),
    # index rules
    ("B(i,i) = C(i)", NotationError, "'i' appears twice in B(i,i)"),
    # a read may repeat an index (issue 23: the diagonal); the output may not
    ("y(i,i,j) = A(i,j)", NotationError, "'i' appears twice in y(i,i,j)"),
    ("y(j,i,j) = A(i,j)", NotationError, "'j' appears twice"),
    ("y(i,i) = A(i)", NotationError, "'i' appears twice in y(i,i)"),
    ("y(i) = x(j)", NotationError, "index variable 'i' of the output does not appear"),
    ("y(i,j) = x(i)", NotationError, "index variable 'j' of the output does not appear"),
    ("a(i) = 1", NotationError, "index variable 'i' of the output does not appear"),
    # order mismatches
    ("y(i) = A(i,j) * A(j)", NotationError, "'A' is used as an order-1 tensor here"),
    ("y(i) = A(i) + A(i,j)", NotationError, "'A' is used as an order-2 tensor here"),
    ("y(i) = alpha*x(i) + alpha(i)", NotationError, "but as a scalar"),
    ("y = y(i)", NotationError, "'y' is used as an order-1 tensor here but as a scalar"),
    ("y(i) = A(i)*y", NotationError, "'y' is used as a scalar here"),
    # output read on the right
    ("y(i) = y(i) + x(i)", NotationError, "the output 'y' cannot be read"),
    ("y(i) += y(i)", NotationError, "'+=' already adds the right-hand side"),
    ("a = a", NotationError, "the output 'a' cannot be read"),
    ("y(i) = x(i) * y(i)", NotationError, "use += to accumulate into it"),
]

_ALL_EXPRESSIONS = (
    _truncations(MTTKRP)
    + _truncations(ACCUM)
    + _truncations(SPMV)
    + UNBOUND_PREFIXES
    + STRAY
    + [(text, ParseError, _unicode_fragment(ch)) for text, ch in UNICODE]
    + MISC
)
#: one row per text (truncations of different expressions share short prefixes)
EXPRESSIONS = list({row[0]: row for row in reversed(_ALL_EXPRESSIONS)}.values())[::-1]


def _ident(row: tuple[str, type, str]) -> str:
    text = row[0]
    return ascii(text if len(text) <= 40 else f"{text[:30]}...len{len(text)}")


def _assert_rejected(text: str, cls: type[SparsecError], fragment: str, formats=None) -> None:
    start = time.perf_counter()
    with pytest.raises(SparsecError) as info:
        sparsec.kernel(text, formats)
    elapsed = time.perf_counter() - start
    err = info.value
    assert type(err) is cls, f"{type(err).__name__}: {err}"
    assert fragment in err.message, err.message
    if err.span is not None:
        lines = str(err).splitlines()
        assert "^" in lines[-1] and set(lines[-1].strip()) == {"^"}, str(err)
    assert elapsed < 2.0, f"{elapsed:.2f} s"


def test_corpus_is_large():
    assert len(EXPRESSIONS) >= 100


@pytest.mark.parametrize("text,cls,fragment", EXPRESSIONS, ids=[_ident(r) for r in EXPRESSIONS])
def test_rejected_expression(text, cls, fragment):
    _assert_rejected(text, cls, fragment)


WITH_FORMATS = [
    ("y(i) = A(i,j) $ x(j)", {"A": "csr"}, ParseError, "unknown character '$'"),
    ("y(i) = A(i,j) * x(j", {"A": "csr"}, ParseError, "is never closed"),
    ("y(i,i) = A(i,i) * x(i)", {"A": "csr"}, NotationError, "appears twice"),
    ("y(i) = A(i,j) * A(j)", {"A": "csr"}, NotationError, "order"),
    ("A(i,j) = B(i,k,l) * D(l,j) * C(k,j) * 1e999", {"B": "csf"}, NotationError, "out of range"),
    ("y(i) = y(i) * A(i,j)", {"A": "dcsr", "y": "s"}, NotationError, "cannot be read"),
    ("y(i) = A(i,j) ＊ x(j)", {"A": "coo"}, ParseError, "(U+FF0A)"),
]


@pytest.mark.parametrize("text,formats,cls,fragment", WITH_FORMATS)
def test_rejected_expression_with_formats(text, formats, cls, fragment):
    _assert_rejected(text, cls, fragment, formats)


def test_whole_expression_corpus_is_fast():
    start = time.perf_counter()
    for text, cls, _ in EXPRESSIONS:
        with pytest.raises(cls):
            sparsec.kernel(text)
    assert time.perf_counter() - start < 5.0


def test_caret_sits_under_the_fault():
    with pytest.raises(ParseError) as info:
        sparsec.kernel("y(i) = A(i,j) * x(j) @ 2")
    source, caret = str(info.value).splitlines()[-2:]
    assert source[caret.index("^")] == "@"


# ---- valid but odd: C keywords, C library names, names reused as index variables

ACCEPTED = [
    ("int(i) = for(i)", None, lambda d: d["for"]),
    ("if = else", None, lambda d: d["else"]),
    ("return(i) = while(i,j) * void(j)", {"while": "csr"}, lambda d: d["while"] @ d["void"]),
    ("main(i) = printf(i)", None, lambda d: d["printf"]),
    ("y(x) = x(x)", None, lambda d: d["x"]),
    ("i(i) = j(i,j) * k(j)", {"j": "csr"}, lambda d: d["j"] @ d["k"]),
    (
        "NULL(i) = restrict(i) * sizeof(i)",
        {"restrict": "s"},
        lambda d: d["restrict"] * d["sizeof"],
    ),
    ("y(int) = A(int,for) * x(for)", {"A": "csr"}, lambda d: d["A"] @ d["x"]),
    ("sparsec_kernel(i) = _(i) - __(i)", None, lambda d: d["_"] - d["__"]),
]


@pytest.mark.parametrize("text,formats,expected", ACCEPTED, ids=[r[0] for r in ACCEPTED])
def test_accepted_odd_names(text, formats, expected):
    k = sparsec.kernel(text, formats)
    inputs, _ = k.random_inputs(seed=3)
    got = k(**inputs)
    dense = {name: np.asarray(value, dtype=np.float64) for name, value in inputs.items()}
    np.testing.assert_allclose(got, expected(dense), rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- broken storage


CSR_POS, CSR_CRD = [0, 2, 2, 3], [0, 3, 1]
CSC_POS, CSC_CRD = [0, 1, 2, 2, 3], [0, 2, 0]  # the same 3x4 matrix by columns
DCSR_TOP = ([0, 2], [0, 2])
DCSR_BOTTOM = ([0, 2, 3], [0, 3, 1])
COO_ROWS = ([0, 3], [0, 0, 2])
CSF = [([0, 2], [0, 1]), ([0, 1, 2], [2, 0]), ([0, 1, 3], [1, 0, 1])]  # 2x3x2, 3 entries
UQQ = [([0, 2], [0, 1]), (None, [1, 1]), (None, [0, 0])]  # 2x3x2, 2 entries
BIG = 2**31


def _csf(level: int, storage) -> list:
    levels = list(CSF)
    levels[level] = storage
    return levels


def _uqq(level: int, storage) -> list:
    levels = list(UQQ)
    levels[level] = storage
    return levels


#: (id, shape, format, levels, vals, from_arrays keywords, error, message fragment)
BROKEN = [
    # csr
    ("csr-pos0", (3, 4), "csr", [None, ([1, 2, 2, 3], CSR_CRD)], [1, 2, 3], {}, StorageError,
     "tensor 'A' level 1 (compressed): pos[0]=1 (pos must start at 0)"),
    ("csr-pos-falls", (3, 4), "csr", [None, ([0, 2, 1, 3], CSR_CRD)], [1, 2, 3], {},
     StorageError, "level 1 (compressed): pos[1]=2 > pos[2]=1 (pos must be non-decreasing)"),
    ("csr-pos-negative", (3, 4), "csr", [None, ([0, -1, 2, 3], CSR_CRD)], [1, 2, 3], {},
     StorageError, "pos[0]=0 > pos[1]=-1"),
    ("csr-pos-last", (3, 4), "csr", [None, ([0, 2, 2, 2], CSR_CRD)], [1, 2, 3], {},
     StorageError, "level 1 (compressed): pos[3]=2 but crd has 3 entries"),
    ("csr-pos-short", (3, 4), "csr", [None, ([0, 2, 3], CSR_CRD)], [1, 2, 3], {}, StorageError,
     "level 1 (compressed): pos has 3 entries; expected 4"),
    ("csr-pos-long", (3, 4), "csr", [None, ([0, 2, 2, 3, 3], CSR_CRD)], [1, 2, 3], {},
     StorageError, "pos has 5 entries; expected 4"),
    ("csr-crd-negative", (3, 4), "csr", [None, (CSR_POS, [0, -1, 1])], [1, 2, 3], {},
     StorageError, "level 1 (compressed): crd[1]=-1 is out of range [0, 4)"),
    ("csr-crd-equals-size", (3, 4), "csr", [None, (CSR_POS, [0, 4, 1])], [1, 2, 3], {},
     StorageError, "crd[1]=4 is out of range [0, 4)"),
    ("csr-crd-huge", (3, 4), "csr", [None, (CSR_POS, [0, 2**40, 1])], [1, 2, 3], {},
     StorageError, "crd[1]=1099511627776 is out of range [0, 4)"),
    ("csr-crd-int64-max", (3, 4), "csr", [None, (CSR_POS, [0, 2**63 - 1, 1])], [1, 2, 3], {},
     StorageError, "crd[1]=9223372036854775807 is out of range"),
    ("csr-crd-uint64-max", (3, 4), "csr",
     [None, (CSR_POS, np.array([0, 2**64 - 1, 1], np.uint64))], [1, 2, 3], {}, DTypeError,
     "level 1 (compressed): crd holds values that do not fit int64"),
    ("csr-crd-unsorted", (3, 4), "csr", [None, (CSR_POS, [3, 0, 1])], [1, 2, 3], {},
     StorageError, "crd[0]=3 > crd[1]=0 under parent position 0"),
    ("csr-crd-duplicate", (3, 4), "csr", [None, (CSR_POS, [1, 1, 1])], [1, 2, 3], {},
     StorageError, "duplicate coordinate 1 at crd[0] and crd[1]"),
    ("csr-crd-2d", (3, 4), "csr", [None, (CSR_POS, [[0, 3, 1]])], [1, 2, 3], {}, StorageError,
     "crd must be 1-d"),
    ("csr-pos-float", (3, 4), "csr", [None, (np.array(CSR_POS, float), CSR_CRD)], [1, 2, 3], {},
     DTypeError, "level 1 (compressed): pos has dtype float64; index arrays must be integers"),
    ("csr-crd-float", (3, 4), "csr", [None, (CSR_POS, [0.0, 3.0, 1.0])], [1, 2, 3], {},
     DTypeError, "crd has dtype float64; index arrays must be integers"),
    ("csr-pos-bool", (3, 4), "csr", [None, (np.array([0, 1, 1, 1], bool), [0])], [1], {},
     DTypeError, "pos has dtype bool; index arrays must be integers"),
    ("csr-crd-bool", (3, 4), "csr", [None, (CSR_POS, np.array([0, 1, 1], bool))], [1, 2, 3], {},
     DTypeError, "crd has dtype bool"),
    ("csr-vals-short", (3, 4), "csr", [None, (CSR_POS, CSR_CRD)], [1, 2], {}, StorageError,
     "tensor 'A': vals has 2 entries but the last level has 3 positions"),
    ("csr-vals-long", (3, 4), "csr", [None, (CSR_POS, CSR_CRD)], [1, 2, 3, 4], {}, StorageError,
     "vals has 4 entries but the last level has 3 positions"),
    ("csr-vals-2d", (3, 4), "csr", [None, (CSR_POS, CSR_CRD)], [[1, 2, 3]], {}, StorageError,
     "tensor 'A': vals must be 1-d, got shape (1, 3)"),
    ("csr-vals-scalar", (3, 4), "csr", [None, (CSR_POS, CSR_CRD)], 1.0, {}, StorageError,
     "vals must be 1-d, got shape ()"),
    ("csr-vals-float16", (3, 4), "csr", [None, (CSR_POS, CSR_CRD)], np.ones(3, np.float16), {},
     DTypeError, "tensor 'A': float16 values are not supported"),
    ("csr-vals-complex", (3, 4), "csr", [None, (CSR_POS, CSR_CRD)], np.ones(3, complex), {},
     DTypeError, "tensor 'A': complex128 values are not supported"),
    ("csr-vals-complex64", (3, 4), "csr", [None, (CSR_POS, CSR_CRD)], np.ones(3, np.complex64),
     {}, DTypeError, "complex64 values are not supported"),
    ("csr-vals-object", (3, 4), "csr", [None, (CSR_POS, CSR_CRD)],
     np.array([1, 2, 3], dtype=object), {}, DTypeError, "tensor 'A': object values"),
    ("csr-vals-string", (3, 4), "csr", [None, (CSR_POS, CSR_CRD)], ["a", "b", "c"], {},
     DTypeError, "<U1 values are not supported"),
    ("csr-vals-none", (3, 4), "csr", [None, (CSR_POS, CSR_CRD)], None, {}, DTypeError,
     "object values are not supported"),
    ("csr-dense-level-given-arrays", (3, 4), "csr", [(CSR_POS, CSR_CRD), (CSR_POS, CSR_CRD)],
     [1, 2, 3], {}, StorageError, "level 0 (dense): stores no pos array"),
    ("csr-compressed-level-missing", (3, 4), "csr", [None, None], [1, 2, 3], {}, StorageError,
     "level 1 (compressed): needs a pos array"),
    ("csr-one-level-storage", (3, 4), "csr", [(CSR_POS, CSR_CRD)], [1, 2, 3], {}, StorageError,
     "format csr has 2 levels but 1 level storages were given"),
    ("csr-level-triple", (3, 4), "csr", [None, (CSR_POS, CSR_CRD, CSR_CRD)], [1, 2, 3], {},
     StorageError, "storage must be None, (pos, crd), a dict or a LevelStorage"),
    ("csr-level-string", (3, 4), "csr", [None, "abc"], [1, 2, 3], {}, StorageError,
     "storage must be None, (pos, crd), a dict or a LevelStorage, not str"),
    # shapes
    ("shape-negative", (3, -4), "csr", [None, (CSR_POS, CSR_CRD)], [1, 2, 3], {}, ShapeError,
     "tensor 'A': shape (3, -4) must hold non-negative ints, got -4"),
    ("shape-float", (3, 4.0), "csr", [None, (CSR_POS, CSR_CRD)], [1, 2, 3], {}, ShapeError,
     "must hold non-negative ints, got 4.0"),
    ("shape-none", None, "csr", [None, (CSR_POS, CSR_CRD)], [1, 2, 3], {}, ShapeError,
     "tensor 'A': shape must be a tuple of ints, not None"),
    ("shape-too-short", (3,), "csr", [None, (CSR_POS, CSR_CRD)], [1, 2, 3], {}, FormatError,
     "format 'csr' is for order-2 tensors, not order 1"),
    ("shape-too-long", (3, 4, 5), "csr", [None, (CSR_POS, CSR_CRD)], [1, 2, 3], {}, FormatError,
     "for tensor 'A': format 'csr' is for order-2 tensors, not order 3"),
    ("int32-forced-big-dim", (3, BIG), "csr", [None, (CSR_POS, CSR_CRD)], [1, 2, 3],
     {"index_dtype": "int32"}, DTypeError,
     "tensor 'A': index dtype int32 cannot hold dimension size 2147483648"),
    ("int32-forced-big-rows", (BIG, 4), "csc", [None, (CSC_POS, CSC_CRD)], [1, 3, 2],
     {"index_dtype": "int32"}, DTypeError, "int32 cannot hold dimension size 2147483648"),
    ("int32-forced-big-crd", (10,), "s", [([0, 1], [2**35])], [1.0], {"index_dtype": "int32"},
     DTypeError, "crd holds values that do not fit int32"),
    # csc
    ("csc-pos0", (3, 4), "csc", [None, ([1, 1, 2, 2, 3], CSC_CRD)], [1, 3, 2], {}, StorageError,
     "level 1 (compressed): pos[0]=1"),
    ("csc-crd-equals-rows", (3, 4), "csc", [None, (CSC_POS, [0, 3, 0])], [1, 3, 2], {},
     StorageError, "crd[1]=3 is out of range [0, 3)"),
    ("csc-pos-short", (3, 4), "csc", [None, (CSR_POS, CSC_CRD)], [1, 3, 2], {}, StorageError,
     "pos has 4 entries; expected 5"),
    ("csc-crd-duplicate", (3, 4), "csc", [None, ([0, 2, 2, 2, 3], [1, 1, 0])], [1, 3, 2], {},
     StorageError, "duplicate coordinate 1 at crd[0] and crd[1]"),
    # dcsr
    ("dcsr-top-pos0", (3, 4), "dcsr", [([1, 2], [0, 2]), DCSR_BOTTOM], [1, 2, 3], {},
     StorageError, "level 0 (compressed): pos[0]=1"),
    ("dcsr-top-last", (3, 4), "dcsr", [([0, 3], [0, 2]), DCSR_BOTTOM], [1, 2, 3], {},
     StorageError, "level 0 (compressed): pos[1]=3 but crd has 2 entries"),
    ("dcsr-top-range", (3, 4), "dcsr", [([0, 2], [0, 3]), DCSR_BOTTOM], [1, 2, 3], {},
     StorageError, "level 0 (compressed): crd[1]=3 is out of range [0, 3)"),
    ("dcsr-top-unsorted", (3, 4), "dcsr", [([0, 2], [2, 0]), DCSR_BOTTOM], [1, 2, 3], {},
     StorageError, "level 0 (compressed): crd[0]=2 > crd[1]=0"),
    ("dcsr-top-duplicate", (3, 4), "dcsr", [([0, 2], [2, 2]), DCSR_BOTTOM], [1, 2, 3], {},
     StorageError, "level 0 (compressed): duplicate coordinate 2"),
    ("dcsr-bottom-falls", (3, 4), "dcsr", [DCSR_TOP, ([0, 3, 2], [0, 3, 1])], [1, 2, 3], {},
     StorageError, "level 1 (compressed): pos[1]=3 > pos[2]=2"),
    ("dcsr-bottom-vs-parent", (3, 4), "dcsr", [DCSR_TOP, ([0, 3], [0, 3, 1])], [1, 2, 3], {},
     StorageError, "level 1 (compressed): pos has 2 entries; expected 3"),
    # coo (uq)
    ("coo-rows-unsorted", (3, 4), "coo", [([0, 3], [2, 0, 0]), (None, [0, 3, 1])], [1, 2, 3], {},
     StorageError, "(compressed(non-unique)): crd[0]=2 > crd[1]=0 under parent position 0"),
    ("coo-rows-pos-last", (3, 4), "coo", [([0, 2], [0, 0, 2]), (None, [0, 3, 1])], [1, 2, 3],
     {}, StorageError, "level 0 (compressed(non-unique)): pos[1]=2 but crd has 3 entries"),
    ("coo-tuples-unsorted", (3, 4), "coo", [COO_ROWS, (None, [3, 0, 1])], [1, 2, 3], {},
     StorageError, "out of order: (0, 3) at position 0 then (0, 0)"),
    ("coo-tuples-duplicate", (3, 4), "coo", [COO_ROWS, (None, [3, 3, 1])], [1, 2, 3], {},
     StorageError, "duplicate coordinate tuple (0, 3) (levels 0..1) at positions 0 and 1"),
    ("coo-singleton-short", (3, 4), "coo", [COO_ROWS, (None, [0, 3])], [1, 2, 3], {},
     StorageError, "level 1 (singleton): crd has 2 entries but a singleton level stores one "
     "coordinate per parent position (3)"),
    ("coo-singleton-long", (3, 4), "coo", [COO_ROWS, (None, [0, 3, 1, 2])], [1, 2, 3], {},
     StorageError, "crd has 4 entries but a singleton level stores one coordinate"),
    ("coo-singleton-range", (3, 4), "coo", [COO_ROWS, (None, [0, 9, 1])], [1, 2, 3], {},
     StorageError, "level 1 (singleton): crd[1]=9 is out of range [0, 4)"),
    ("uq-dict-level", (3, 4), "uq", [{"pos": [0, 3], "crd": [0, 0, 2]}, np.array([0, 4, 1])],
     [1, 2, 3], {}, StorageError, "level 1 (singleton): crd[1]=4 is out of range [0, 4)"),
    # uqq
    ("uqq-head-pos-last", (2, 3, 2), "uqq", _uqq(0, ([0, 3], [0, 1])), [1, 2], {},
     StorageError, "level 0 (compressed(non-unique)): pos[1]=3 but crd has 2 entries"),
    ("uqq-middle-unsorted", (2, 3, 2), "uqq",
     [([0, 2], [0, 0]), (None, [2, 1]), (None, [0, 0])], [1, 2], {}, StorageError,
     "level 1 (singleton(non-unique)): coordinate tuples (levels 0..1) out of order"),
    ("uqq-duplicate", (2, 3, 2), "uqq", [([0, 2], [0, 0]), (None, [1, 1]), (None, [0, 0])],
     [1, 2], {}, StorageError, "duplicate coordinate tuple (0, 1, 0)"),
    ("uqq-last-range", (2, 3, 2), "uqq", _uqq(2, (None, [0, 2])), [1, 2], {}, StorageError,
     "level 2 (singleton): crd[1]=2 is out of range [0, 2)"),
    ("uqq-last-short", (2, 3, 2), "uqq", _uqq(2, (None, [0])), [1, 2], {}, StorageError,
     "level 2 (singleton): crd has 1 entries"),
    ("uqq-middle-negative", (2, 3, 2), "uqq", _uqq(1, (None, [1, -1])), [1, 2], {},
     StorageError, "crd[1]=-1 is out of range [0, 3)"),
    # csf (sss)
    ("csf-top-duplicate", (2, 3, 2), "csf", _csf(0, ([0, 2], [1, 1])), [1, 2, 3], {},
     StorageError, "level 0 (compressed): duplicate coordinate 1 at crd[0] and crd[1]"),
    ("csf-middle-range", (2, 3, 2), "csf", _csf(1, ([0, 1, 2], [3, 0])), [1, 2, 3], {},
     StorageError, "level 1 (compressed): crd[0]=3 is out of range [0, 3)"),
    ("csf-middle-pos-length", (2, 3, 2), "csf", _csf(1, ([0, 2], [2, 0])), [1, 2, 3], {},
     StorageError, "level 1 (compressed): pos has 2 entries; expected 3"),
    ("csf-bottom-last", (2, 3, 2), "csf", _csf(2, ([0, 1, 2], [1, 0, 1])), [1, 2, 3], {},
     StorageError, "level 2 (compressed): pos[2]=2 but crd has 3 entries"),
    ("csf-bottom-duplicate", (2, 3, 2), "csf", _csf(2, ([0, 1, 3], [1, 0, 0])), [1, 2, 3], {},
     StorageError, "level 2 (compressed): duplicate coordinate 0 at crd[1] and crd[2]"),
    ("csf-bottom-unsorted", (2, 3, 2), "csf", _csf(2, ([0, 1, 3], [1, 1, 0])), [1, 2, 3], {},
     StorageError, "level 2 (compressed): crd[1]=1 > crd[2]=0 under parent position 1"),
    ("csf-vals-short", (2, 3, 2), "sss", CSF, [1, 2], {}, StorageError,
     "vals has 2 entries but the last level has 3 positions"),
    # singletons under a unique parent
    ("sq-singleton-short", (3, 4), "sq", [([0, 2], [0, 2]), (None, [3])], [1, 2], {},
     StorageError, "level 1 (singleton): crd has 1 entries but a singleton level stores one "
     "coordinate per parent position (2)"),
    ("dq-singleton-range", (3, 4), "dq", [None, (None, [0, 4, 1])], [1, 2, 3], {},
     StorageError, "level 1 (singleton): crd[1]=4 is out of range [0, 4)"),
    ("dq-singleton-negative", (3, 4), "dq", [None, (None, [0, -4, 1])], [1, 2, 3], {},
     StorageError, "crd[1]=-4 is out of range [0, 4)"),
]  # fmt: skip


KERNELS = {
    1: ("a = A(i) * x(i)", "s"),
    2: ("y(i) = A(i,j) * x(j)", "csr"),
    3: ("y(i) = A(i,j,k) * x(j) * z(k)", "csf"),
}


def _kernel_for(order: int, fmt: str) -> sparsec.Kernel:
    text, fallback = KERNELS[order]
    try:
        return sparsec.kernel(text, {"A": fmt})
    except FormatError:  # the row's format does not fit: the row is about the shape
        return sparsec.kernel(text, {"A": fallback})


def _operands(order: int, shape) -> dict[str, np.ndarray]:
    """Dense operands that agree with ``shape`` wherever it is readable."""
    size = lambda d: d if isinstance(d, int) and 0 <= d < 100 else 4  # noqa: E731
    dims = [size(d) for d in shape] if isinstance(shape, tuple) else [3, 4]
    if order == 1:
        return {"x": np.ones(dims[0])}
    ops = {"x": np.ones(dims[1])}
    if order == 3:
        ops["z"] = np.ones(dims[2])
    return ops


@pytest.fixture
def never_reach_c(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("broken storage reached the generated C")

    monkeypatch.setattr(Executable, "run", refuse)
    monkeypatch.setattr(sparsec.runtime.build, "compile_cached", refuse)


def test_broken_table_is_large():
    assert len(BROKEN) >= 40
    assert len({row[0] for row in BROKEN}) == len(BROKEN)


@pytest.mark.parametrize(
    "shape,fmt,levels,vals,kwargs,error,fragment",
    [r[1:] for r in BROKEN],
    ids=[r[0] for r in BROKEN],
)
def test_broken_storage(never_reach_c, shape, fmt, levels, vals, kwargs, error, fragment):
    with pytest.raises(SparsecError) as info:
        Tensor.from_arrays(shape, fmt, levels, vals, name="A", **kwargs)
    assert type(info.value) is error, f"{type(info.value).__name__}: {info.value}"
    assert fragment in str(info.value)
    assert "'A'" in str(info.value) or "level" in str(info.value)
    # the same arrays on their way into a kernel call: refused before any C runs
    order = len(shape) if isinstance(shape, tuple) else 2
    k = _kernel_for(order, fmt)
    with pytest.raises(error) as info:
        k(
            A=Tensor.from_arrays(shape, fmt, levels, vals, name="A", **kwargs),
            **_operands(order, shape),
        )
    assert fragment in str(info.value)


#: broken CSR arrays that scipy constructs anyway: the kernel refuses them at the call
SCIPY_BROKEN = [
    ([0, 2, 2, 3], [0, -1, 1], "crd[0]=-1 is out of range [0, 4)"),
    ([0, 2, 2, 3], [0, 4, 1], "crd[1]=4 is out of range [0, 4)"),
    ([0, 2, 2, 3], [0, 2**40, 1], "crd[1]=1099511627776 is out of range"),
]


@pytest.mark.parametrize("pos,crd,fragment", SCIPY_BROKEN)
def test_broken_scipy_never_reaches_c(never_reach_c, pos, crd, fragment):
    k = sparsec.kernel(SPMV, {"A": "csr"})
    A = sp.csr_matrix((np.ones(3), np.array(crd), np.array(pos)), shape=(3, 4))
    with pytest.raises(StorageError) as info:
        k(A=A, x=np.ones(4))
    assert fragment in str(info.value) and "tensor 'A' level 1" in str(info.value)


@pytest.mark.parametrize("crd", [[0, -1, 1], [0, 4, 1], [0, 2**40, 1]])
def test_broken_torch_column_indices_never_reach_c(never_reach_c, crd):
    k = sparsec.kernel(SPMV, {"A": "csr"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        A = torch.sparse_csr_tensor(
            torch.tensor(CSR_POS),
            torch.tensor(crd),
            torch.ones(3, dtype=torch.float64),
            (3, 4),
            check_invariants=False,
        )
    with pytest.raises(StorageError, match="out of range"):
        k(A=A, x=np.ones(4))


# ---- NaN and inf are data


NONFINITE = np.array(
    [[np.nan, 0.0, 1.0], [0.0, 0.0, 0.0], [np.inf, 2.0, 0.0], [0.0, -np.inf, 3.0], [1.0, 0, 2.0]]
)


def test_nonfinite_values_build_and_propagate():
    A = sp.csr_matrix(NONFINITE)
    t = Tensor.from_arrays(A.shape, "csr", [None, (A.indptr, A.indices)], A.data, name="A")
    np.testing.assert_array_equal(t.to_dense(), NONFINITE)
    x = np.array([1.0, 2.0, 3.0])
    k = sparsec.kernel("y(i)=A(i,j)*x(j)", {"A": "csr"})
    expected = A @ x
    for operand in (t, A):
        y = k(A=operand, x=x)
        np.testing.assert_array_equal(y, expected)
    assert np.isnan(y[0]) and y[1] == 0 and y[2] == np.inf and y[3] == -np.inf and y[4] == 7
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        At = torch.tensor(NONFINITE).to_sparse_csr()
        want = (At @ torch.tensor(x)).numpy()
    np.testing.assert_array_equal(k(A=At, x=torch.tensor(x)).numpy(), want)


# --------------------------------------------------------------------------- call inputs


@pytest.fixture(scope="module")
def spmv():
    return sparsec.kernel(SPMV, {"A": "csr"})


A54 = sp.random(5, 4, density=0.5, format="csr", random_state=1)

CALL_ERRORS = [
    ("missing-x", lambda: {"A": A54}, InputError, "missing input 'x'"),
    ("missing-A", lambda: {"x": np.ones(4)}, InputError, "missing input 'A'"),
    ("missing-all", lambda: {}, InputError, "missing inputs 'A', 'x'"),
    ("extra", lambda: {"A": A54, "x": np.ones(4), "z": 1}, InputError, "unexpected input 'z'"),
    ("misspelt", lambda: {"a": A54, "x": np.ones(4)}, InputError, "unexpected input 'a'"),
    ("x-2d", lambda: {"A": A54, "x": np.ones((4, 1))}, ShapeError,
     "input 'x' has 2 dimensions, but the expression uses it with order 1"),
    ("x-0d", lambda: {"A": A54, "x": np.float64(1.0)}, ShapeError, "input 'x' has 0 dimensions"),
    ("A-1d", lambda: {"A": np.ones(4), "x": np.ones(4)}, FormatError,
     "has 2 levels but the tensor has order 1"),
    ("A-3d", lambda: {"A": np.ones((5, 4, 1)), "x": np.ones(4)}, FormatError,
     "has 2 levels but the tensor has order 3"),
    ("x-string", lambda: {"A": A54, "x": "abc"}, DTypeError, "input 'x': <U3 values"),
    ("x-none", lambda: {"A": A54, "x": None}, DTypeError, "input 'x': object values"),
    ("x-dict", lambda: {"A": A54, "x": {"a": 1}}, DTypeError, "input 'x': object values"),
    ("x-object", lambda: {"A": A54, "x": object()}, DTypeError, "object values"),
    ("A-string", lambda: {"A": "abc", "x": np.ones(4)}, InputError, "tensor 'A' must be a numpy"),
    ("A-none", lambda: {"A": None, "x": np.ones(4)}, InputError, "not NoneType"),
    ("A-dict", lambda: {"A": {"a": 1}, "x": np.ones(4)}, InputError, "not dict"),
    ("A-ragged", lambda: {"A": [[1, 2], [3]], "x": np.ones(4)}, InputError,
     "tensor 'A': cannot be read as an array"),
    ("scipy-wrong-cols", lambda: {"A": sp.random(5, 3, density=0.5, format="csr"),
     "x": np.ones(4)}, ShapeError, "index j has extent 3 in A (mode 1) but 4 in x (mode 0)"),
    ("scipy-csc-wrong", lambda: {"A": sp.random(5, 4, density=0.5, format="csc"),
     "x": np.ones(5)}, ShapeError, "index j has extent 4 in A (mode 1) but 5 in x"),
    ("x-strided", lambda: {"A": A54, "x": np.ones(4)[::2]}, ShapeError, "but 2 in x"),
    ("x-scipy-row", lambda: {"A": A54, "x": sp.csr_matrix(np.ones((1, 4)))}, ShapeError,
     "input 'x' has 2 dimensions"),
    ("x-complex128", lambda: {"A": A54, "x": np.ones(4, np.complex128)}, DTypeError,
     "complex128 values are not supported"),
    ("x-torch-complex", lambda: {"A": A54, "x": torch.ones(4, dtype=torch.complex64)},
     DTypeError, "complex64 values are not supported"),
]  # fmt: skip


@pytest.mark.parametrize(
    "make,error,fragment", [r[1:] for r in CALL_ERRORS], ids=[r[0] for r in CALL_ERRORS]
)
def test_call_errors(spmv, make, error, fragment):
    with pytest.raises(SparsecError) as info:
        spmv(**make())
    assert type(info.value) is error, f"{type(info.value).__name__}: {info.value}"
    assert isinstance(info.value, InputError) or error is FormatError
    assert fragment in str(info.value)


def test_cpu_torch_inputs_are_fine(spmv):
    x = np.arange(4.0)
    expected = A54 @ x
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for A in (
            torch.tensor(A54.toarray()),
            torch.tensor(A54.toarray()).to_sparse_csr(),
            torch.tensor(A54.toarray()).to_sparse(),
        ):
            y = spmv(A=A, x=torch.tensor(x))
            assert isinstance(y, torch.Tensor)
            np.testing.assert_allclose(y.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(spmv(A=A54, x=x.tolist()), expected, rtol=1e-12)
