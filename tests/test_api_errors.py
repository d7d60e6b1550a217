"""Bad input at the API: each is a `SparsecError` subclass with a clear message, never a crash."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsec
from sparsec import (
    DTypeError,
    FormatError,
    InputError,
    LoweringError,
    NotationError,
    ParseError,
    ShapeError,
    SparsecError,
    StorageError,
)

SPMV = "y(i) = A(i,j) * x(j)"

EXPRESSION_ERRORS = [
    ("y(i) = (A(i,j) * x(j)", ParseError, "unbalanced parentheses"),
    ("y(i) = A(i,j) * x(j))", ParseError, "unbalanced parentheses"),
    ("y(i) = A(i,j) $ x(j)", ParseError, "unknown character '$'"),
    ("A(i,j) = B(i,k)", NotationError, "j"),
    ("B(i,i) = C(i)", NotationError, "appears twice"),
    ("y(i) = A(i,j) * A(j)", NotationError, "order"),
    ("", ParseError, "empty"),
]


@pytest.mark.parametrize("text,cls,fragment", EXPRESSION_ERRORS)
def test_expression_errors(text, cls, fragment):
    with pytest.raises(cls) as err:
        sparsec.kernel(text)
    assert fragment in str(err.value)
    assert isinstance(err.value, SparsecError)


def test_error_shows_caret_under_fault():
    with pytest.raises(ParseError) as err:
        sparsec.kernel("y(i) = A(i,j) $ x(j)")
    lines = str(err.value).splitlines()
    assert lines[-2].strip() == "y(i) = A(i,j) $ x(j)"
    assert lines[-1].index("^") == lines[-2].index("$")


FORMAT_ERRORS = [
    ({"A": "xyz"}, "unknown format 'xyz'"),
    ({"A": "sss"}, "3 levels but the tensor has order 2"),
    ({"A": "csf3"}, "unknown format"),
    ({"x": "csr"}, "order-2"),
    ({"Z": "csr"}, "not a tensor of this expression"),
    ({"y": "q"}, "singleton level needs a parent"),
    ({"A": "ds:0,0"}, "not a permutation"),
    ({"A": "ud"}, "must be a singleton"),
]


@pytest.mark.parametrize("formats,fragment", FORMAT_ERRORS)
def test_format_errors(formats, fragment):
    with pytest.raises(FormatError, match=None) as err:
        sparsec.kernel(SPMV, formats)
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    "formats,shown",
    [
        (
            "csr",
            "not the format 'csr' alone: say which tensor each format is for, e.g. "
            "formats={'A': 'csr'}",
        ),
        (["csr"], "not list ['csr']"),
        (("A", "csr"), "not tuple ('A', 'csr')"),
        ([("A", "csr")], "not list [('A', 'csr')]"),
        (3, "not int 3"),
        (sparsec.tensors.formats.parse_format("csc", 2), "formats={'A': 'csc'}"),
    ],
    ids=["str", "list", "tuple", "pairs", "int", "Format"],
)
def test_formats_must_be_a_mapping(formats, shown):
    # issue 18: a string where the mapping goes raised a bare ValueError from dict()
    with pytest.raises(FormatError) as err:
        sparsec.kernel(SPMV, formats)
    msg = str(err.value)
    assert "formats must be a mapping from tensor name to format" in msg
    assert shown in msg and "(tensors: y, A, x)" in msg


@pytest.mark.parametrize(
    "formats,fragment",
    [
        ({3: "csr"}, "formats keys are tensor names (strings), not int 3"),
        ({None: "csr"}, "formats keys are tensor names (strings), not NoneType None"),
        ({"A": None}, "format for tensor 'A' must be a string or Format, not NoneType"),
        ({"A": 2}, "format for tensor 'A' must be a string or Format, not int"),
        ({"A": b"csr"}, "must be a string or Format, not bytes"),
        ({"A": "s"}, "format 's' for tensor 'A' has 1 level but the tensor has order 2"),
        ({"x": "ds"}, "format 'ds' for tensor 'x' has 2 levels but the tensor has order 1"),
        ({"a": "csr"}, "not a tensor of this expression (tensors: y, A, x)"),
    ],
)
def test_format_arguments_of_every_wrong_kind(formats, fragment):
    with pytest.raises(FormatError) as err:
        sparsec.kernel(SPMV, formats)
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    "expr,fmt,fix",
    [
        ("C(i,j) = A(i,j)", "dq", "csr"),
        ("C(i,j) = A(i,j)", "dq:1,0", "csc"),
        ("C(i,j,k) = A(i,j,k)", "ddq", "dds"),
        ("C(i,j,k) = A(i,j,k)", "dqq", "duq"),
    ],
)
def test_a_singleton_output_level_without_a_compressed_parent(expr, fmt, fix):
    # issue 18: an IndexError in OutputLayout.of; now the error names a format that works
    with pytest.raises(FormatError) as err:
        sparsec.kernel(expr, {"C": fmt, "A": "dense"})
    assert f"store C as '{fix}' instead" in str(err.value)
    rng = np.random.default_rng(0)
    a = rng.uniform(size=(3, 4, 2)[: fmt.count("d") + fmt.count("q")])
    a[a < 0.5] = 0.0
    got = sparsec.kernel(expr, {"C": fix, "A": "dense"})(A=a)
    np.testing.assert_array_equal(got.to_dense(), a)


@pytest.mark.parametrize(
    "kwargs,fragment",
    [
        ({"dtype": 3}, "value dtype 3 is not a dtype; use 'float32' or 'float64'"),
        ({"index_dtype": [1]}, "index dtype [1] is not a dtype; use 'int32' or 'int64'"),
        # float16 and bfloat16 are value dtypes since issue 22 (tests/test_half.py)
        ({"dtype": "complex64"}, "value dtype 'complex64' is not supported"),
        # the integer types and bool are value dtypes since issue 40 (tests/test_value_types.py)
        ({"dtype": torch.complex128}, "value dtype 'complex128' is not supported"),
        ({"index_dtype": "int16"}, "index dtype 'int16' is not supported"),
    ],
)
def test_bad_dtype_arguments(kwargs, fragment):
    with pytest.raises(DTypeError) as err:
        sparsec.kernel(SPMV, {"A": "csr"}, **kwargs)
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    "kwargs,want",
    [
        ({"dtype": torch.float32}, ("float32", None)),
        ({"dtype": "f8", "index_dtype": np.int64}, ("float64", "int64")),
        ({"index_dtype": torch.int32}, (None, "int32")),
        ({"dtype": torch.float16}, ("float16", None)),
        ({"dtype": "bfloat16"}, ("bfloat16", None)),
        ({"dtype": torch.int16}, ("int16", None)),
        ({"dtype": np.bool_}, ("bool", None)),
        ({"dtype": "u8"}, ("uint64", None)),
    ],
)
def test_dtype_arguments_in_every_spelling(kwargs, want):
    k = sparsec.kernel(SPMV, {"A": "csr"}, **kwargs)
    assert (k.dtype, k.index_dtype) == want


def test_no_loop_order_is_a_clear_error():
    # issue 23: with no schedule C is converted at call time; a user schedule's refusal
    # stands, and says which format would fit
    converted = sparsec.kernel("A(i,j) = B(i,j) + C(j,i)", {"B": "csr", "C": "csr"})
    assert "converted at call time" in converted.schedule
    k = None
    with pytest.raises(LoweringError, match="Store C with mode ordering"):
        k = sparsec.kernel(
            "A(i,j) = B(i,j) + C(j,i)", {"B": "csr", "C": "csr"}, schedule="reorder(i,j)"
        )
        k.source  # noqa: B018 - generation raises


@pytest.fixture
def spmv():
    return sparsec.kernel(SPMV, {"A": "csr"})


def test_missing_and_extra_inputs(spmv):
    A = np.eye(3)
    with pytest.raises(InputError, match="missing input 'x'"):
        spmv(A=A)
    with pytest.raises(InputError, match="unexpected input 'z'"):
        spmv(A=A, x=np.ones(3), z=1)


def test_positional_inputs_say_to_pass_keywords(spmv):
    """Issue 36 item 16: ``k(A, x)`` is an InputError naming the keywords (was a raw
    TypeError from Python)."""
    for call in (spmv, spmv.check):
        with pytest.raises(InputError, match=r"by position.*k\(A=\.\.\., x=\.\.\.\)"):
            call(np.eye(3), np.ones(3))


def test_wrong_dimensions(spmv):
    with pytest.raises(ShapeError, match="index j has extent 3 in A .mode 1. but 4 in x"):
        spmv(A=np.eye(3), x=np.ones(4))
    with pytest.raises(ShapeError, match="order 1"):
        spmv(A=np.eye(3), x=np.ones((3, 1)))


@pytest.mark.parametrize(
    "value",
    [
        np.ones(3, dtype=np.complex64),
        np.ones(3, dtype=np.complex128),
        torch.ones(3, dtype=torch.complex128),
        torch.ones(3, dtype=torch.complex64),
        np.array(["a", "b", "c"]),
    ],
)
def test_unsupported_value_dtypes(spmv, value):
    with pytest.raises(DTypeError, match="not supported"):
        spmv(A=np.eye(3), x=value)


@pytest.mark.parametrize(
    "value", [np.eye(3).astype(str), np.eye(3, dtype=np.complex64)], ids=["str", "c64"]
)
def test_unsupported_sparse_value_dtypes(spmv, value):
    with pytest.raises(DTypeError):
        spmv(A=value, x=np.ones(3))


def _csr(indptr, indices, data, shape):
    return sp.csr_matrix((np.array(data, float), np.array(indices), np.array(indptr)), shape=shape)


BROKEN_CSR = [
    # (pos, crd, shape, message fragment)
    ([0, 2, 1, 3], [0, 1, 2], (3, 3), "non-decreasing"),
    ([0, 1, 2, 4], [0, 1, 2], (3, 3), "the last pos must equal len(crd)"),
    ([1, 1, 2, 3], [0, 1, 2], (3, 3), "pos[0]"),
    ([0, 1, 2, 3], [0, 5, 2], (3, 3), "out of range"),
    ([0, 1, 2, 3], [0, -1, 2], (3, 3), "out of range"),
    ([0, 2, 2, 3], [1, 0, 2], (3, 3), "increasing"),
    ([0, 2, 2, 3], [1, 1, 2], (3, 3), "increasing"),
]


@pytest.mark.parametrize("pos,crd,shape,fragment", BROKEN_CSR)
def test_broken_csr_arrays_never_reach_c(spmv, pos, crd, shape, fragment):
    with pytest.raises(StorageError) as err:
        bad = sparsec.Tensor.from_arrays(
            shape, "csr", [None, (np.array(pos), np.array(crd))], np.ones(len(crd)), name="A"
        )
        spmv(A=bad, x=np.ones(shape[1]))
    assert fragment in str(err.value)


def test_scalar_operand_must_be_a_number():
    k = sparsec.kernel("a(i) = alpha * b(i)", {"b": "s"})
    assert np.allclose(k(alpha=np.float32(2.0), b=np.ones(3)), 2.0)
    assert np.allclose(k(alpha=torch.tensor(3.0), b=np.ones(3)), 3.0)
    with pytest.raises(ShapeError, match="scalar operand"):
        k(alpha=np.ones(2), b=np.ones(3))
    with pytest.raises(InputError, match="scalar operand"):
        k(alpha="2", b=np.ones(3))


def test_unknown_target_and_schedule():
    with pytest.raises(SparsecError, match="unknown target"):
        sparsec.kernel(SPMV, target="fpga")
    with pytest.raises(sparsec.ScheduleError, match="unknown schedule command 'explode'"):
        sparsec.kernel(SPMV, schedule="explode(i)")
    with pytest.raises(sparsec.ScheduleError, match="schedule must be"):
        sparsec.kernel(SPMV, schedule=42)


def test_non_string_expression():
    with pytest.raises(InputError, match="must be a string"):
        sparsec.kernel(42)  # type: ignore[arg-type]


def test_bad_thread_count(spmv):
    with pytest.raises(InputError, match="threads"):
        spmv(A=np.eye(2), x=np.ones(2), threads=0)


# ---- regressions found by the bad-input corpus (each once crashed or leaked an exception)
@pytest.mark.parametrize("threads", [100_000, 2**31, True, 0, -1, 2.0])
def test_thread_counts_are_bounded(spmv, threads):
    with pytest.raises(InputError, match="threads must be an integer from 1 to"):
        spmv(A=np.eye(2), x=np.ones(2), threads=threads)


@pytest.mark.parametrize("threads", [100_000, True, 0, -1, 2.0, "2"])
def test_thread_counts_are_bounded_on_a_warm_kernel(threads):
    """The fast path (a second call with the same kinds of inputs) checks threads too."""
    k = sparsec.kernel(SPMV, {"A": "csr"})
    a = sparsec.Tensor.from_dense(np.eye(3))
    x = np.ones(3)
    np.testing.assert_array_equal(k(A=a, x=x, threads=2), x)
    np.testing.assert_array_equal(k(A=a, x=x, threads=1), x)
    with pytest.raises(InputError, match="threads must be an integer from 1 to"):
        k(A=a, x=x, threads=threads)


def test_reserved_and_method_names():
    with pytest.raises(NotationError, match="'threads' is reserved"):
        sparsec.kernel("y(i) = x(i) * threads")
    k = sparsec.kernel("y(i) = self(i)")  # `self` is a fine tensor name
    np.testing.assert_array_equal(k(self=np.arange(3.0)), np.arange(3.0))
    k.check(self=np.arange(3.0))


@pytest.mark.parametrize("crow", [[0, 2, 1, 3], [0, 2, 3], [0, 2, 2, 2]])
def test_broken_torch_csr_is_refused_before_torch_reads_it(crow):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        t = torch.sparse_csr_tensor(
            torch.tensor(crow),
            torch.tensor([0, 3, 1]),
            torch.ones(3, dtype=torch.float64),
            (3, 4),
            check_invariants=False,
        )
    with pytest.raises(StorageError):
        sparsec.Tensor.from_torch(t, name="A")
    with pytest.raises(StorageError):
        sparsec.kernel(SPMV, {"A": "csr"})(A=t, x=torch.ones(4, dtype=torch.float64))


@pytest.mark.parametrize(
    "levels",
    [5, [None, ([0, 2, 2, 3], [[0], [1, 2]])], "pos"],
    ids=["not-a-list", "ragged-crd", "string"],
)
def test_malformed_raw_storage(levels):
    with pytest.raises(StorageError):
        sparsec.Tensor.from_arrays((3, 4), "csr", levels, [1.0, 2.0, 3.0])
