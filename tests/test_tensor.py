"""Tensor storage tests: dense/COO/scipy/torch/file round trips for every format, the
broken-storage table (error class and message), index-dtype choice, immutability and `random`.
Tables first; hypothesis properties after."""

from __future__ import annotations

import dataclasses
import gzip
import itertools

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsec.base.errors import DTypeError, FormatError, InputError, ShapeError, StorageError
from sparsec.io import load, load_mtx, load_tns, save, save_mtx, save_tns
from sparsec.tensors.formats import Dense, Singleton, parse_format
from sparsec.tensors.tensor import LevelStorage, Tensor, as_tensor, pack, random

FORMATS = {
    1: ["dense", "d", "s", "coo", "csf"],
    2: ["dense", "csr", "csc", "dcsr", "dcsc", "coo", "csf", "sd", "ds:1,0", "dd:1,0", "sd:1,0"],
    3: [
        "dense",
        "coo",
        "csf",
        "uqq",
        "sss",
        "dss",
        "sds:2,0,1",
        "ssd",
        "dsd:1,2,0",
        "uqs",
        "sss:2,1,0",
        "ddd:2,0,1",
        "sdd",
    ],
}
#: torch warns that sparse CSR is beta and that invariant checks are off; neither is ours
pytestmark = pytest.mark.filterwarnings("ignore:Sparse:UserWarning")

ALL_FORMATS = [(order, fmt) for order, fmts in FORMATS.items() for fmt in fmts]


def has_dense_level(t: Tensor) -> bool:
    return any(isinstance(level, Dense) for level in t.format.levels)


def assert_same(t: Tensor, expected: np.ndarray) -> None:
    t.validate("T")
    dense = t.to_dense()
    assert dense.shape == expected.shape
    np.testing.assert_array_equal(dense, expected)


# --------------------------------------------------------------------------- strategies


@st.composite
def dense_arrays(draw, order: int) -> np.ndarray:
    """Small integer-valued arrays with real zeros and an empty first-mode slice."""
    shape = tuple(draw(st.integers(0, 5)) for _ in range(order))
    density = draw(st.sampled_from([0.0, 0.2, 0.5, 1.0]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    array = rng.integers(-3, 4, size=shape) * (rng.random(shape) < density)
    if order and shape[0] > 1:
        array[draw(st.integers(0, shape[0] - 1))] = 0
    return array.astype(np.float64)


# --------------------------------------------------------------------------- tables: storage


CSR_3x4 = np.array([[1.0, 0, 0, 2], [0, 0, 0, 0], [0, 3, 0, 0]])

#: (format, levels, vals) that are valid for CSR_3x4
VALID_STORAGE = [
    ("csr", [None, ([0, 2, 2, 3], [0, 3, 1])], [1, 2, 3]),
    ("csc", [None, ([0, 1, 2, 2, 3], [0, 2, 0])], [1, 3, 2]),
    ("dcsr", [([0, 2], [0, 2]), ([0, 2, 3], [0, 3, 1])], [1, 2, 3]),
    ("coo", [([0, 3], [0, 0, 2]), (None, [0, 3, 1])], [1, 2, 3]),
    ("uq", [{"pos": [0, 3], "crd": [0, 0, 2]}, np.array([0, 3, 1])], [1, 2, 3]),
    ("sd", [([0, 2], [0, 2]), None], [1, 0, 0, 2, 0, 3, 0, 0]),
    ("dense", [None, None], CSR_3x4.ravel()),
    ("csr", [LevelStorage(), LevelStorage(np.array([0, 2, 2, 3]), np.array([0, 3, 1]))], [1, 2, 3]),
]


@pytest.mark.parametrize("fmt,levels,vals", VALID_STORAGE)
def test_valid_storage(fmt, levels, vals):
    t = Tensor.from_arrays((3, 4), fmt, levels, vals, name="A")
    assert_same(t, CSR_3x4)
    # integer values stay integers (issue 40), float ones (CSR_3x4's) float64
    want = np.float64 if np.asarray(vals).dtype.kind == "f" else np.int64
    assert t.index_dtype == np.int32 and t.dtype == want


def test_valid_storage_segments_restart():
    # 'duq': each dense row is its own segment, so the COO ordering restarts per row
    levels = [None, ([0, 2, 3], [2, 2, 0]), (None, [0, 1, 1])]
    t = Tensor.from_arrays((2, 3, 2), "duq", levels, [1, 2, 3], name="A")
    expected = np.zeros((2, 3, 2))
    expected[0, 2, 0], expected[0, 2, 1], expected[1, 0, 1] = 1, 2, 3
    assert_same(t, expected)


def test_valid_singleton_under_dense_fills_zeros():
    # 'dq': one coordinate per row; an empty row stores coordinate 0 with value 0
    a = np.array([[0.0, 5, 0], [0, 0, 0], [7, 0, 0]])
    t = Tensor.from_dense(a, "dq")
    assert t.levels[1].crd.tolist() == [1, 0, 0]
    assert t.vals.tolist() == [5, 0, 7]
    assert_same(t, a)


CSR_POS, CSR_CRD = [0, 2, 2, 3], [0, 3, 1]
COO_ROWS = ([0, 3], [0, 0, 2])

#: (id, shape, format, levels, vals, error, message substring)
BROKEN = [
    ("pos0", (3, 4), "csr", [None, ([1, 2, 2, 3], CSR_CRD)], [1, 2, 3], StorageError,
     "tensor 'A' level 1 (compressed): pos[0]=1 (pos must start at 0)"),
    ("pos-falls", (3, 4), "csr", [None, ([0, 2, 1, 3], CSR_CRD)], [1, 2, 3], StorageError,
     "tensor 'A' level 1 (compressed): pos[1]=2 > pos[2]=1 (pos must be non-decreasing)"),
    ("pos-last", (3, 4), "csr", [None, ([0, 2, 2, 2], CSR_CRD)], [1, 2, 3], StorageError,
     "pos[3]=2 but crd has 3 entries"),
    ("pos-short", (3, 4), "csr", [None, ([0, 2, 3], CSR_CRD)], [1, 2, 3], StorageError,
     "pos has 3 entries; expected 4"),
    ("pos-long", (3, 4), "csr", [None, ([0, 2, 2, 3, 3], CSR_CRD)], [1, 2, 3], StorageError,
     "pos has 5 entries; expected 4"),
    ("crd-negative", (3, 4), "csr", [None, (CSR_POS, [0, -1, 1])], [1, 2, 3], StorageError,
     "crd[1]=-1 is out of range [0, 4)"),
    ("crd-too-big", (3, 4), "csr", [None, (CSR_POS, [0, 4, 1])], [1, 2, 3], StorageError,
     "crd[1]=4 is out of range [0, 4)"),
    ("crd-unsorted", (3, 4), "csr", [None, (CSR_POS, [3, 0, 1])], [1, 2, 3], StorageError,
     "crd[0]=3 > crd[1]=0 under parent position 0"),
    ("crd-duplicate", (3, 4), "csr", [None, (CSR_POS, [1, 1, 1])], [1, 2, 3], StorageError,
     "duplicate coordinate 1 at crd[0] and crd[1]"),
    ("dcsr-top-unsorted", (3, 4), "dcsr", [([0, 2], [2, 0]), ([0, 2, 3], [0, 3, 1])],
     [1, 2, 3], StorageError, "level 0 (compressed): crd[0]=2 > crd[1]=0"),
    ("dcsr-pos-vs-parent", (3, 4), "dcsr", [([0, 2], [0, 2]), ([0, 3], [0, 3, 1])], [1, 2, 3],
     StorageError, "level 1 (compressed): pos has 2 entries; expected 3"),
    ("singleton-length", (3, 4), "coo", [COO_ROWS, (None, [0, 3])], [1, 2, 3], StorageError,
     "crd has 2 entries but a singleton level stores one coordinate per parent position (3)"),
    ("singleton-range", (3, 4), "coo", [COO_ROWS, (None, [0, 9, 1])], [1, 2, 3], StorageError,
     "level 1 (singleton): crd[1]=9 is out of range [0, 4)"),
    ("coo-rows-unsorted", (3, 4), "coo", [([0, 3], [2, 0, 0]), (None, [0, 3, 1])], [1, 2, 3],
     StorageError, "(compressed(non-unique)): crd[0]=2 > crd[1]=0 under parent position 0 "
     "(coordinates must be non-decreasing in a segment)"),
    ("coo-tuples-unsorted", (3, 4), "coo", [COO_ROWS, (None, [3, 0, 1])], [1, 2, 3],
     StorageError, "out of order: (0, 3) at position 0 then (0, 0)"),
    ("coo-tuples-duplicate", (3, 4), "coo", [COO_ROWS, (None, [3, 3, 1])], [1, 2, 3],
     StorageError, "duplicate coordinate tuple (0, 3) (levels 0..1) at positions 0 and 1"),
    ("uqq-middle-unsorted", (2, 3, 2), "uqq", [([0, 2], [0, 0]), (None, [2, 1]), (None, [0, 0])],
     [1, 2], StorageError, "level 1 (singleton(non-unique)): coordinate tuples (levels 0..1)"),
    ("uqq-duplicate", (2, 3, 2), "uqq", [([0, 2], [0, 0]), (None, [1, 1]), (None, [0, 0])],
     [1, 2], StorageError, "duplicate coordinate tuple (0, 1, 0)"),
    ("vals-short", (3, 4), "csr", [None, (CSR_POS, CSR_CRD)], [1, 2], StorageError,
     "vals has 2 entries but the last level has 3 positions"),
    ("vals-dense-short", (3, 4), "dense", [None, None], np.zeros(11), StorageError,
     "vals has 11 entries but the last level has 12 positions"),
    ("vals-2d", (3, 4), "csr", [None, (CSR_POS, CSR_CRD)], [[1, 2, 3]], StorageError,
     "vals must be 1-d, got shape (1, 3)"),
    ("crd-2d", (3, 4), "csr", [None, (CSR_POS, [[0, 3, 1]])], [1, 2, 3], StorageError,
     "crd must be 1-d"),
    ("vals-float16", (3, 4), "csr", [None, (CSR_POS, CSR_CRD)], np.ones(3, np.float16),
     DTypeError, "float16 values are not supported; use float32, float64, an integer type or bool"),
    ("vals-complex", (3, 4), "csr", [None, (CSR_POS, CSR_CRD)], np.ones(3, complex), DTypeError,
     "tensor 'A': complex128 values are not supported; use float32, float64, an integer type or bool"),
    ("crd-float", (3, 4), "csr", [None, (CSR_POS, [0.0, 3.0, 1.0])], [1, 2, 3], DTypeError,
     "crd has dtype float64; index arrays must be integers"),
    ("pos-bool", (3, 4), "csr", [None, (np.array([0, 1, 1, 1], bool), [0])], [1], DTypeError,
     "pos has dtype bool"),
    ("dense-with-arrays", (3, 4), "csr", [([0, 1], [0]), (CSR_POS, CSR_CRD)], [1, 2, 3],
     StorageError, "level 0 (dense): stores no pos array"),
    ("compressed-no-crd", (3, 4), "csr", [None, (CSR_POS, None)], [1, 2, 3], StorageError,
     "level 1 (compressed): needs a crd array"),
    ("singleton-with-pos", (3, 4), "coo", [COO_ROWS, ([0, 1, 2, 3], [0, 3, 1])], [1, 2, 3],
     StorageError, "level 1 (singleton): stores no pos array"),
    ("level-count", (3, 4), "csr", [None], [1, 2, 3], StorageError,
     "format csr has 2 levels but 1 level storages were given"),
    ("unknown-key", (3, 4), "csr", [None, {"pos": CSR_POS, "idx": CSR_CRD}], [1, 2, 3],
     StorageError, "unknown storage arrays ['idx']"),
    ("negative-shape", (3, -4), "csr", [None, (CSR_POS, CSR_CRD)], [1, 2, 3], ShapeError,
     "must hold non-negative ints"),
]  # fmt: skip


@pytest.mark.parametrize(
    "shape,fmt,levels,vals,error,message",
    [case[1:] for case in BROKEN],
    ids=[case[0] for case in BROKEN],
)
def test_broken_storage(shape, fmt, levels, vals, error, message):
    with pytest.raises(error) as info:
        Tensor.from_arrays(shape, fmt, levels, vals, name="A")
    assert message in str(info.value)


def test_validate_catches_what_the_trusted_constructor_accepts():
    pos, crd = np.array([0, 2, 1, 3], np.int32), np.array([0, 3, 1], np.int32)
    t = Tensor((3, 4), parse_format("csr", 2), (LevelStorage(), LevelStorage(pos, crd)), np.ones(3))
    with pytest.raises(StorageError, match=r"tensor 'B' level 1 \(compressed\): pos\[1\]=2"):
        t.validate("B")


def test_trusted_constructor_checks_structure():
    pos, crd = np.array([0, 2, 2, 3], np.int32), np.array([0, 3, 1], np.int64)
    with pytest.raises(DTypeError, match="all index arrays of the tensor must be int32"):
        Tensor((3, 4), parse_format("csr", 2), (LevelStorage(), LevelStorage(pos, crd)), np.ones(3))
    with pytest.raises(DTypeError, match="float16 values are not supported"):
        Tensor((2,), parse_format("d", 1), (LevelStorage(),), np.ones(2, np.float16))


def test_from_arrays_converts_index_dtypes():
    levels = [None, (np.array([0, 2, 2, 3], np.uint8), np.array([0, 3, 1], np.int16))]
    t = Tensor.from_arrays((3, 4), "csr", levels, np.array([1, 2, 3]))
    assert t.index_dtype == np.int32 and t.levels[1].pos.dtype == np.int32
    assert t.dtype == np.int64  # integer values stay integers (issue 40)
    t64 = Tensor.from_arrays((3, 4), "csr", levels, [1, 2, 3], index_dtype="int64")
    assert t64.levels[1].crd.dtype == np.int64 and t64.index_dtype == np.int64
    t32 = Tensor.from_arrays((3, 4), "csr", levels, [1, 2, 3], dtype=np.float32)
    assert t32.dtype == np.float32


def test_from_arrays_forced_int32_too_small_for_values():
    with pytest.raises(DTypeError, match="do not fit int32"):
        Tensor.from_arrays((10,), "s", [([0, 1], [2**35])], [1.0], index_dtype="int32")


# --------------------------------------------------------------------------- index dtype


BIG = 2**31


def test_int64_chosen_for_a_huge_dimension():
    t = Tensor.from_coo([[0, 2, 2], [5, 0, BIG - 1]], [1.0, 2.0, 3.0], (3, BIG), "csr")
    assert t.index_dtype == np.int64 and t.levels[1].crd.dtype == np.int64
    coords, vals = t.coords()
    assert coords.tolist() == [[0, 2, 2], [5, 0, BIG - 1]] and vals.tolist() == [1, 2, 3]
    t.validate()


@pytest.mark.parametrize("fmt", ["coo", "dcsr", "csf", "dcsc"])
def test_int64_for_huge_sparse_formats(fmt):
    coords = [[0, BIG + 3, BIG + 3], [7, 1, BIG + 1]]
    t = Tensor.from_coo(coords, [1.0, 2.0, 3.0], (BIG + 5, BIG + 5), fmt)
    assert t.index_dtype == np.int64
    back, _ = t.coords()
    assert sorted(map(tuple, back.T.tolist())) == sorted(map(tuple, np.array(coords).T.tolist()))


def test_forced_int32_overflow_raises():
    with pytest.raises(DTypeError, match="int32 cannot hold dimension size 2147483648"):
        Tensor.from_coo([[0], [5]], [1.0], (3, BIG), "csr", index_dtype="int32")
    t = Tensor.from_coo([[0], [5]], [1.0], (3, BIG), "dcsr")
    with pytest.raises(DTypeError, match="int32 cannot hold"):
        t.astype(index_dtype="int32")


def test_index_dtype_kept_when_it_fits():
    t = Tensor.from_dense(CSR_3x4, "csr", index_dtype=np.dtype("int64"))
    assert t.index_dtype == np.int64
    assert t.astype(index_dtype="int32").levels[1].pos.dtype == np.int32
    assert t.to_format("csc").index_dtype == np.int64
    assert Tensor.from_dense(CSR_3x4, "dense", index_dtype="int64").index_dtype == np.int64


def test_random_with_huge_dimension():
    t = random((BIG + 1, 3), 2e-9, "dcsr")
    assert t.nnz == round(2e-9 * (BIG + 1) * 3) and t.index_dtype == np.int64
    t.validate()


@pytest.mark.parametrize("bad", ["int16", "float32", np.uint32])
def test_bad_index_dtype_spec(bad):
    with pytest.raises(DTypeError, match="index dtype"):
        Tensor.from_dense(CSR_3x4, "csr", index_dtype=bad)


# --------------------------------------------------------------------------- values


@pytest.mark.parametrize(
    "array,dtype,expected",
    [
        (np.array([1, 0]), None, np.int64),  # integers and bool are kept (issue 40)
        (np.array([True, False]), None, np.bool_),
        (np.array([1.0, 0.0]), "uint8", np.uint8),
        (np.array([1.0, 0.0], np.float32), None, np.float32),
        (np.array([1.0, 0.0]), "float32", np.float32),
        (np.array([1.0, 0.0], np.float16), "float32", np.float32),
        (np.array([1.0, 0.0]), torch.float32, np.float32),
        (torch.tensor([1.0, 0.0], dtype=torch.bfloat16), "float64", np.float64),
        (torch.tensor([1.0, 0.0], dtype=torch.float32), None, np.float32),
    ],
)
def test_value_dtypes(array, dtype, expected):
    t = Tensor.from_dense(array, "s", dtype=dtype)
    assert t.dtype == expected and t.to_dense().tolist() == [1.0, 0.0]


@pytest.mark.parametrize(
    "array,dtype,message",
    [
        (np.ones(2, complex), None, "complex128 values are not supported"),
        (np.ones(2, complex), "float64", "complex128 values are not supported"),
        (torch.ones(2, dtype=torch.complex64), None, "complex64 values are not supported"),
        (np.ones(2), "complex64", "value dtype complex64 is not supported"),
        (np.array(["a", "b"]), None, "values are not supported"),
    ],
)
def test_unsupported_value_dtypes(array, dtype, message):
    with pytest.raises(DTypeError, match=message):
        Tensor.from_dense(array, "s", dtype=dtype, name="x")


@pytest.mark.parametrize(
    ("array", "half"),
    [
        (np.array([1.0, 0.0, 1 / 3], np.float16), "float16"),
        (torch.tensor([1.0, 0.0, 1 / 3], dtype=torch.float16), "float16"),
        (torch.tensor([1.0, 0.0, 1 / 3], dtype=torch.bfloat16), "bfloat16"),
    ],
)
def test_16_bit_values_make_16_bit_tensors(array, half):
    """Issue 36 item 19: 16-bit inputs were refused ("float16 values are not supported")
    although the README lists them; they make a tensor of that type, exactly."""
    t = Tensor.from_dense(array, "s", name="x")
    assert t.value_dtype == half and half in repr(t)
    want = torch.as_tensor(array).float().numpy()
    assert t.to_dense().astype(np.float32).tolist() == want.tolist()
    assert t.to_torch().dtype == getattr(torch, half)
    assert as_tensor(array, "s").value_dtype == half


def test_nan_and_inf_are_data():
    a = np.array([[np.nan, 0], [np.inf, -np.inf]])
    for fmt in ("csr", "coo", "dense", "dcsc"):
        t = Tensor.from_dense(a, fmt)
        np.testing.assert_array_equal(t.to_dense(), a)


# --------------------------------------------------------------------------- packing


def test_from_coo_sums_duplicates_and_keeps_explicit_zeros():
    coords = [[2, 0, 2, 0, 1], [1, 0, 1, 3, 2]]
    t = Tensor.from_coo(coords, [1.0, 2.0, 3.0, 4.0, 0.0], (3, 4), "csr")
    expected = np.zeros((3, 4))
    expected[2, 1], expected[0, 0], expected[0, 3] = 4, 2, 4
    assert_same(t, expected)
    assert t.nnz == 4  # the explicit zero at (1, 2) is stored


@pytest.mark.parametrize("fmt", FORMATS[3])
def test_from_coo_sequence_of_modes_unsorted_duplicates(fmt):
    rng = np.random.default_rng(7)
    coords = [rng.integers(0, n, 40) for n in (3, 4, 2)]
    values = rng.integers(-3, 4, 40).astype(float)
    expected = np.zeros((3, 4, 2))
    np.add.at(expected, tuple(coords), values)
    assert_same(Tensor.from_coo(coords, values, (3, 4, 2), fmt), expected)


@pytest.mark.parametrize(
    "coords,values,shape,error,message",
    [
        ([[0, -1], [0, 0]], [1.0, 2.0], (2, 2), StorageError, "coordinate -1 of entry 1"),
        ([[0, 1], [0, 2]], [1.0, 2.0], (2, 2), StorageError, "out of range [0, 2) for mode 1"),
        ([[0.0, 1.0], [0, 1]], [1.0, 2.0], (2, 2), DTypeError, "coordinates must be integers"),
        ([[0, 1], [0]], [1.0, 2.0], (2, 2), ShapeError, ""),
        ([[0, 1]], [1.0, 2.0], (2, 2), ShapeError, "expected (2, 2)"),
        ([[0, 1], [0, 1]], [1.0], (2, 2), ShapeError, "expected (2, 1)"),
        ([[0, 1], [0, 1]], [[1.0, 2.0]], (2, 2), ShapeError, "values must be 1-d"),
    ],
)
def test_from_coo_errors(coords, values, shape, error, message):
    with pytest.raises(error) as info:
        Tensor.from_coo(coords, values, shape, "csr", name="A")
    assert message in str(info.value)


@pytest.mark.parametrize("fmt", ["sq", "dq"])
def test_singleton_format_that_cannot_hold_a_pattern(fmt):
    with pytest.raises(StorageError, match="cannot hold this pattern"):
        Tensor.from_dense(np.array([[1.0, 2.0], [0.0, 3.0]]), fmt)


#: shapes with a zero-extent mode, per order
ZERO_EXTENT_SHAPES = {1: [(0,)], 2: [(3, 0), (0, 3), (0, 0)], 3: [(3, 0, 2), (0, 4, 2), (2, 3, 0)]}


def _singleton_under_positions(fmt, shape) -> bool:
    """A singleton level whose mode has extent 0 while the level above has positions: no
    tensor of this shape fits the format (a dense level gives positions without entries)."""
    parsed = parse_format(fmt, len(shape))
    n = 1
    for level, mode in zip(parsed.levels, parsed.ordering, strict=True):
        if isinstance(level, Dense):
            n *= shape[mode]
        elif isinstance(level, Singleton) and shape[mode] == 0 and n > 0:
            return True
        elif not isinstance(level, Singleton):
            n = 0  # a compressed level of an empty tensor has no positions
    return False


@pytest.mark.parametrize(
    "order,fmt,shape",
    [
        (order, fmt, shape)
        for order, fmts in FORMATS.items()
        for fmt in [*fmts, *{2: ["dq", "uq"], 3: ["dsq", "ddq", "duq"]}.get(order, [])]
        for shape in ZERO_EXTENT_SHAPES[order]
    ],
)
def test_zero_extent_modes_pack_to_valid_storage(order, fmt, shape):
    # every constructor's storage is valid (crd inside its extent) or the format is refused
    empty = np.zeros((order, 0), np.int64)
    builders = [
        lambda: Tensor.from_coo(empty, np.zeros(0), shape, fmt),
        lambda: Tensor.from_dense(np.zeros(shape), fmt),
        lambda: random(shape, 0.0, fmt),
    ]
    for build in builders:
        if _singleton_under_positions(fmt, shape):
            with pytest.raises(FormatError, match="extent 0"):
                build()
            continue
        t = build()
        t.validate("T")
        assert t.to_dense().shape == shape and not t.to_dense().any()


def test_zero_extent_singleton_under_dense_is_refused():
    # 'dq' of shape (3, 0): each of the 3 rows needs one column coordinate and none exists
    with pytest.raises(FormatError, match=r"format dq cannot hold shape \(3, 0\).*'s' for 'q'"):
        Tensor.from_coo(np.zeros((2, 0), np.int64), np.zeros(0), (3, 0), "dq", name="A")
    with pytest.raises(FormatError, match="extent 0"):
        Tensor.from_dense(np.zeros((2, 3, 0)), "ddq")
    with pytest.raises(FormatError, match="extent 0"):
        as_tensor(sp.csr_array((3, 0)), "dq")
    # the same storage given by hand is refused by the same validation
    with pytest.raises(StorageError, match=r"out of range \[0, 0\)"):
        Tensor.from_arrays((3, 0), "dq", [None, (None, [0, 0, 0])], np.zeros(3))


def test_zero_extent_tns_file(tmp_path):
    path = tmp_path / "empty.tns"
    path.write_text("# shape: 3 0\n")
    assert load(path, "ds").shape == (3, 0)
    with pytest.raises(FormatError, match="extent 0"):
        load(path, "dq")


def test_packer_storage_goes_through_the_shared_validation(monkeypatch):
    # a packer bug becomes an error before any kernel reads the storage
    import sparsec.tensors.packing as packing

    seen = []
    real = packing.validate_storage
    monkeypatch.setattr(
        packing, "validate_storage", lambda *a, **k: seen.append(a[1]) or real(*a, **k)
    )
    Tensor.from_coo([[0, 1], [1, 0]], [1.0, 2.0], (2, 2), "coo")
    Tensor.from_dense(np.eye(2), "dense")
    Tensor.from_arrays((2, 2), "csr", [None, ([0, 1, 2], [1, 0])], [1.0, 2.0])
    assert [str(f) for f in seen] == ["coo", "dense", "csr"]


def test_pack_dense_level_below_sparse_fills_zeros():
    t = pack([[2, 2], [0, 3]], [1.0, 2.0], (4, 5), "sd")
    assert t.nnz == 5 and t.vals.tolist() == [1, 0, 0, 2, 0]
    assert t.levels[0].crd.tolist() == [2]


def test_pack_order_zero():
    t = pack(np.zeros((0, 3), np.int64), [1.0, 2.0, 4.5], (), "")
    assert t.order == 0 and t.vals.tolist() == [7.5] and t.to_dense().shape == ()
    assert Tensor.from_coo([], [], ()).to_dense() == 0.0


# --------------------------------------------------------------------------- immutability


def test_tensor_is_immutable():
    t = Tensor.from_dense(CSR_3x4, "dcsr")
    for array in (t.vals, t.levels[0].pos, t.levels[0].crd, t.levels[1].pos, t.levels[1].crd):
        assert not array.flags.writeable
        with pytest.raises(ValueError):
            array[0] = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.shape = (1, 1)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.levels[0].pos = None  # type: ignore[misc]


@pytest.mark.parametrize("order,fmt", ALL_FORMATS)
def test_pickle_and_copies_are_frozen_tensors_without_caches(order, fmt):
    import copy
    import pickle

    t = random((5, 4, 3)[:order], 0.4, fmt, seed=order)
    t.addresses()  # what a kernel call caches: addresses valid in this process only
    for clone in (lambda v: pickle.loads(pickle.dumps(v)), copy.copy, copy.deepcopy):
        u = clone(t)
        assert type(u) is Tensor and u is not t and u._addresses is None and u._device is None
        assert (u.shape, u.format, u.index_dtype) == (t.shape, t.format, t.index_dtype)
        arrays = [u.vals, *(a for st in u.levels for a in st.arrays())]
        assert not any(a.flags.writeable for a in arrays)
        assert_same(u, t.to_dense())


def test_inputs_are_copied_not_frozen():
    pos, crd, vals = np.array([0, 2, 2, 3]), np.array([0, 3, 1]), np.array([1.0, 2, 3])
    t = Tensor.from_arrays((3, 4), "csr", [None, (pos, crd)], vals)
    assert pos.flags.writeable and vals.flags.writeable
    crd[0], vals[0] = 2, 9.0
    assert_same(t, CSR_3x4)
    m = sp.csr_matrix(CSR_3x4)
    s = Tensor.from_scipy(m)
    m.data[:] = 0
    assert_same(s, CSR_3x4)
    a = CSR_3x4.copy()
    d = Tensor.from_dense(a)
    a[0, 0] = 5
    assert_same(d, CSR_3x4)


# --------------------------------------------------------------------------- conversions


def test_repr_and_properties():
    t = Tensor.from_dense(CSR_3x4, "csr", dtype="float32")
    assert repr(t) == "Tensor(shape=(3, 4), format=csr, nnz=3, dtype=float32, index_dtype=int32)"
    assert (t.order, t.nnz, t.level_shape) == (2, 3, (3, 4))
    assert Tensor.from_dense(CSR_3x4, "csc").level_shape == (4, 3)


def test_array_protocol():
    t = Tensor.from_dense(CSR_3x4, "csc")
    np.testing.assert_array_equal(np.asarray(t), CSR_3x4)
    assert np.array(t, dtype=np.float32).dtype == np.float32
    with pytest.raises(ValueError, match="copy=False"):
        np.array(t, copy=False)


def test_to_format_identity_and_stored_zeros():
    """A dense-format tensor stores every entry, its zeros too (issue 36, item 6: they were
    dropped): converted, every one stays stored; `eliminate_zeros` drops them explicitly."""
    t = Tensor.from_dense(CSR_3x4, "dense")
    assert t.to_format("dense") is t and t.to_format(t.format) is t
    csr = t.to_format("csr")
    assert csr.nnz == 12 and csr.to_format("csr") is csr
    assert_same(csr, CSR_3x4)
    nonzero = csr.eliminate_zeros()
    assert (
        nonzero.nnz == 3 and nonzero.format == csr.format and nonzero.eliminate_zeros() is nonzero
    )
    assert_same(nonzero, CSR_3x4)
    assert t.eliminate_zeros().nnz == 12  # a dense level stores its zeros all the same


@pytest.mark.parametrize("source", ["coo", "csr", "csc", "dcsr", "csf"])
@pytest.mark.parametrize("target", ["coo", "csr", "csc", "dcsr", "csf", "ds:1,0"])
def test_to_format_keeps_explicit_zeros(source, target):
    """Issue 36, item 6: every stored entry survives a conversion, explicit zeros included."""
    coords = np.array([[0, 0, 2, 3], [1, 3, 0, 2]])
    t = Tensor.from_coo(coords, np.array([0.0, 2.0, 0.0, -1.0]), (4, 4), source)
    got = t.to_format(target)
    assert got.nnz == 4
    assert sorted(zip(*got.coords()[0], got.coords()[1], strict=True)) == [
        (0, 1, 0.0),
        (0, 3, 2.0),
        (2, 0, 0.0),
        (3, 2, -1.0),
    ]
    assert as_tensor(t, target).nnz == 4


def test_min_plus_reads_a_stored_zero_packed_at_call_time():
    """Issue 36, item 6: a COO tensor's stored 0 is a distance under min_plus; packed into
    the kernel's declared csr at call time it was dropped ([inf, 6] instead of [1, 6])."""
    import sparsec

    a = Tensor.from_coo(np.array([[0, 1], [0, 1]]), np.array([0.0, 5.0]), (2, 2), "coo")
    k = sparsec.kernel("y(i) = A(i,j) * x(j)", {"A": "csr"}, semiring="min_plus")
    np.testing.assert_array_equal(k(A=a, x=np.array([1.0, 1.0])), [1.0, 6.0])
    np.testing.assert_array_equal(k(A=a.to_scipy(), x=np.array([1.0, 1.0])), [1.0, 6.0])
    np.testing.assert_array_equal(k(A=a.to_torch(), x=np.array([1.0, 1.0])), [1.0, 6.0])


def test_files_keep_explicit_zeros(tmp_path):
    """Issue 36, item 6: .tns and .mtx files hold every stored entry (they held the nonzeros);
    a matrix whose stored values are symmetric but whose pattern is not stays general."""
    t = Tensor.from_coo(np.array([[0, 1, 2], [1, 1, 0]]), np.array([0.0, 3.0, 0.0]), (3, 3))
    for name in ("t.tns", "t.mtx"):
        save(tmp_path / name, t)
        back = load(tmp_path / name, "coo")
        assert back.coords()[0].tolist() == t.coords()[0].tolist()
        assert back.coords()[1].tolist() == t.coords()[1].tolist()


@pytest.mark.parametrize("order", [1, 2, 3])
def test_to_format_all_pairs(order):
    shape = (4, 3, 5)[:order]
    for source, target in itertools.product(FORMATS[order], repeat=2):
        t = random(shape, 0.3, source, seed=order)
        assert_same(t.to_format(target), t.to_dense())


def test_coords_of_a_dense_format_include_zeros():
    coords, values = Tensor.from_dense(CSR_3x4).coords()
    assert coords.shape == (2, 12) and values.tolist() == CSR_3x4.ravel().tolist()
    coords, values = Tensor.from_dense(CSR_3x4, "csc").coords()
    assert coords.tolist() == [[0, 2, 0], [0, 1, 3]] and values.tolist() == [1, 3, 2]
    values[0] = 100  # a copy
    assert Tensor.from_dense(CSR_3x4, "csc").vals[0] == 1


def test_astype_shares_or_converts():
    t = Tensor.from_dense(CSR_3x4, "csr")
    assert t.astype() is t and t.astype("float64", index_dtype="int32") is t
    f = t.astype("float32")
    assert f.dtype == np.float32 and f.levels[1].pos is t.levels[1].pos


# ---- scipy


SCIPY_KINDS = [
    ("csr", "csr", sp.csr_matrix),
    ("csc", "csc", sp.csc_matrix),
    ("coo", "uq", sp.coo_matrix),
    ("csr_array", "csr", sp.csr_array),
    ("coo_array", "uq", sp.coo_array),
    ("lil", "uq", sp.lil_matrix),
    ("dok", "uq", sp.dok_array),
    ("bsr", "uq", sp.bsr_matrix),
]


@pytest.mark.parametrize("kind,default,make", SCIPY_KINDS, ids=[k[0] for k in SCIPY_KINDS])
def test_from_scipy_default_formats(kind, default, make):
    t = Tensor.from_scipy(make(CSR_3x4))
    assert t.format.spelling == parse_format(default, 2).spelling
    assert_same(t, CSR_3x4)
    assert_same(Tensor.from_scipy(make(CSR_3x4), "dcsc"), CSR_3x4)


@pytest.mark.parametrize("make", [sp.csr_matrix, sp.csc_matrix])
def test_from_scipy_non_canonical(make):
    # duplicates (summed) and unsorted indices within a row/column
    indptr, indices = np.array([0, 3, 3, 5]), np.array([3, 0, 3, 1, 0])
    m = make(
        (np.array([1.0, 2, 3, 4, 5]), indices, indptr),
        shape=(3, 4) if make is sp.csr_matrix else (4, 3),
    )
    assert not m.has_canonical_format
    expected = m.toarray()
    assert_same(Tensor.from_scipy(m), expected)
    assert_same(Tensor.from_scipy(m, "coo"), expected)
    assert m.indices.tolist() == indices.tolist()  # the caller's matrix is untouched


def test_from_scipy_int64_indices_become_int32():
    m = sp.csr_matrix(CSR_3x4)
    m.indptr, m.indices = m.indptr.astype(np.int64), m.indices.astype(np.int64)
    assert Tensor.from_scipy(m).index_dtype == np.int32
    assert Tensor.from_scipy(m, index_dtype="int64").index_dtype == np.int64


@pytest.mark.parametrize(
    "fmt,kind", [("csr", "csr"), ("csc", "csc"), ("coo", "coo"), ("dcsr", "coo"), ("dense", "coo")]
)
def test_to_scipy(fmt, kind):
    m = Tensor.from_dense(CSR_3x4, fmt).to_scipy()
    assert m.format == kind
    np.testing.assert_array_equal(m.toarray(), CSR_3x4)
    m.data[:] = 0  # writable, and a copy


def test_to_scipy_needs_a_matrix():
    with pytest.raises(FormatError, match="order-2"):
        random((2, 3, 4), 0.5).to_scipy()


def test_from_scipy_complex_values():
    with pytest.raises(DTypeError, match="complex128"):
        Tensor.from_scipy(sp.csr_matrix(np.eye(2, dtype=complex)), name="A")


# ---- torch


def test_from_torch_layouts():
    dense = torch.tensor(CSR_3x4, requires_grad=True)
    assert Tensor.from_torch(dense).format.is_dense
    coo = torch.sparse_coo_tensor([[2, 0, 2], [1, 3, 1]], [1.0, 2.0, 2.0], (3, 4))  # uncoalesced
    t = Tensor.from_torch(coo)
    assert t.format.spelling == "uq" and str(t.format) == "coo"
    expected = np.zeros((3, 4))
    expected[2, 1], expected[0, 3] = 3, 2
    assert_same(t, expected)
    for layout, fmt in ((torch.sparse_csr, "csr"), (torch.sparse_csc, "csc")):
        s = torch.tensor(CSR_3x4).to_sparse(layout=layout)
        converted = Tensor.from_torch(s)
        assert str(converted.format) == fmt
        assert_same(converted, CSR_3x4)
        assert_same(Tensor.from_torch(s, "dcsr"), CSR_3x4)


def test_from_torch_unsorted_csr_falls_back_to_packing():
    crow, col = torch.tensor([0, 2, 2, 3]), torch.tensor([3, 0, 1])
    s = torch.sparse_csr_tensor(crow, col, torch.tensor([2.0, 1.0, 3.0]), (3, 4))
    assert_same(Tensor.from_torch(s), CSR_3x4)


def test_from_torch_hybrid_refused():
    hybrid = torch.sparse_coo_tensor([[0, 1]], torch.ones(2, 3), (2, 3))
    with pytest.raises(FormatError, match="hybrid"):
        Tensor.from_torch(hybrid)


@pytest.mark.parametrize(
    "fmt,layout", [("dense", torch.strided), ("csr", torch.sparse_csr), ("coo", torch.sparse_coo),
                   ("csc", torch.sparse_coo), ("dcsr", torch.sparse_coo)]
)  # fmt: skip
def test_to_torch(fmt, layout):
    t = Tensor.from_dense(CSR_3x4, fmt, dtype="float32").to_torch()
    assert t.layout == layout and t.dtype == torch.float32
    np.testing.assert_array_equal(t.to_dense().numpy(), CSR_3x4)


# ---- as_tensor


@pytest.mark.parametrize(
    "make,fmt,expected_format",
    [
        (lambda: CSR_3x4, None, "dense"),
        (lambda: CSR_3x4, "csr", "csr"),
        (lambda: CSR_3x4.tolist(), "coo", "uq"),
        (lambda: sp.csc_matrix(CSR_3x4), None, "csc"),
        (lambda: sp.csc_matrix(CSR_3x4), "csr", "csr"),
        (lambda: torch.tensor(CSR_3x4).to_sparse_csr(), None, "csr"),
        (lambda: torch.tensor(CSR_3x4), "dcsr", "dcsr"),
    ],
)
def test_as_tensor_dispatch(make, fmt, expected_format):
    t = as_tensor(make(), fmt, name="A")
    assert t.format == parse_format(expected_format, t.order)
    assert_same(t, CSR_3x4)


def test_as_tensor_scalars():
    for value in (2.5, 3, np.float32(1.5), np.array(4.0), True):
        t = as_tensor(value)
        assert t.order == 0 and t.to_dense() == float(value)
    with pytest.raises(DTypeError):
        as_tensor(1j)


def test_as_tensor_of_a_tensor():
    t = Tensor.from_dense(CSR_3x4, "csr")
    assert as_tensor(t) is t and as_tensor(t, "csr") is t
    assert as_tensor(t, "ds:1,0").format == parse_format("csc", 2)
    f = as_tensor(t, dtype="float32", index_dtype="int64")
    assert (f.dtype, f.index_dtype) == (np.float32, np.int64)


@pytest.mark.parametrize("bad", [{"a": 1}, "abc", object(), None, [[1, 2], [3]]])
def test_as_tensor_rejects(bad):
    with pytest.raises(InputError, match="tensor 'A'"):
        as_tensor(bad, name="A")


def test_as_tensor_wrong_order_for_format():
    with pytest.raises(FormatError, match="tensor 'A'"):
        as_tensor(np.ones(3), "csr", name="A")


# --------------------------------------------------------------------------- random


@pytest.mark.parametrize(
    "shape,density",
    [((10, 8), 0.3), ((10, 8), 0.0), ((10, 8), 1.0), ((5, 6, 7), 0.1), ((100,), 0.5),
     ((0, 4), 0.5), ((3, 0, 2), 1.0), ((1, 1), 1.0), ((2, 2), 0.5), ((), 1.0)],
)  # fmt: skip
def test_random_exact_nnz(shape, density):
    t = random(shape, density, "coo" if shape else None)
    t.validate()
    expected = round(density * int(np.prod(shape)))
    assert t.nnz == expected and np.count_nonzero(t.to_dense()) == expected


def test_random_default_formats_and_dtypes():
    assert str(random((4,), 0.5).format) == "s"
    assert str(random((4, 4), 0.5).format) == "csr"
    assert str(random((4, 4, 4), 0.5).format) == "csf"
    t = random((6, 6), 0.5, dtype="float32", index_dtype="int64")
    assert (t.dtype, t.index_dtype) == (np.float32, np.int64)


def test_random_is_reproducible():
    a, b, c = (random((20, 30), 0.2, seed=s).to_dense() for s in (1, 1, 2))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("shape", [(10, 8), (20, 5, 3), (50, 50), (2, 6)])
def test_random_has_empty_rows_and_columns(shape):
    dense = random(shape, 0.5, seed=3).to_dense()
    row_counts = np.count_nonzero(dense.reshape(shape[0], -1), axis=1)
    assert np.sum(row_counts == 0) >= (round(0.2 * shape[0]) if shape[0] > 2 else 0)
    column_counts = np.count_nonzero(np.moveaxis(dense, 1, 0).reshape(shape[1], -1), axis=1)
    assert np.any(column_counts == 0)


def test_random_values():
    floats = random((30, 30), 0.5).vals
    assert np.all((floats >= -1) & (floats < 1) & (floats != 0))
    ints = random((30, 30), 0.5, integer=True).vals
    assert np.all((np.abs(ints) <= 4) & (ints != 0) & (ints == np.round(ints)))


@pytest.mark.parametrize("share", [0.01, 0.25, 0.3, 0.5, 0.9, 1.0])
def test_random_cells_take_memory_in_proportion_to_the_entries(share):
    # never one int64 per cell of the range (for a random sparse tensor: the dense size)
    import tracemalloc

    from sparsec.tensors.random import _sample_distinct

    total = 2_000_000
    k = int(share * total)
    tracemalloc.start()
    try:
        found = _sample_distinct(np.random.default_rng(1), total, k)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(found) == k and np.all(np.diff(found) > 0) and found[-1] < total
    assert peak <= 3 * 8 * k + total + 10**5  # the result, two copies, a bitmap of cells


def test_random_bad_seed():
    with pytest.raises(InputError, match="non-negative integer"):
        random((3, 3), 0.5, seed=-1)


def test_random_bad_density():
    with pytest.raises(InputError, match="density"):
        random((3, 3), 1.5)


# --------------------------------------------------------------------------- files


@pytest.mark.parametrize("shape", [(7,), (6, 5), (4, 3, 5)])
def test_tns_round_trip(tmp_path, shape):
    t = random(shape, 0.3)
    save_tns(tmp_path / "t.tns", t)
    back = load_tns(tmp_path / "t.tns")
    assert back.shape == shape and back.format == t.format
    assert_same(back, t.to_dense())
    assert_same(load(tmp_path / "t.tns", "coo"), t.to_dense())


def test_tns_round_trip_gzip_and_float32(tmp_path):
    t = random((5, 6, 7), 0.2, dtype="float32")
    save(tmp_path / "t.tns.gz", t)
    with gzip.open(tmp_path / "t.tns.gz", "rt") as f:
        assert f.readline().startswith("# shape: 5 6 7")
    assert_same(load(tmp_path / "t.tns.gz", dtype="float32"), t.to_dense())


def test_tns_frostt_file_infers_shape(tmp_path):
    path = tmp_path / "x.tns"
    path.write_text("# a comment\n1 1 2 1.5\n\n3 2 1 -2\n1 1 2 0.5   # duplicate, summed\n")
    t = load_tns(path)
    expected = np.zeros((3, 2, 2))
    expected[0, 0, 1], expected[2, 1, 0] = 2.0, -2
    assert t.shape == (3, 2, 2) and str(t.format) == "csf"
    assert_same(t, expected)
    assert load_tns(path, shape=(4, 4, 4)).shape == (4, 4, 4)


@pytest.mark.parametrize(
    "text,message",
    [
        ("1 1 1.0\n2 x 1.0\n", "line 2: cannot read '2 x 1.0'"),
        ("# c\n1 1 1.0\n2 1\n", "line 3: 2 columns where earlier lines have 3"),
        ("1 1 1.0\n\n0 1 1.0\n", "line 3: coordinates must be integers >= 1"),
        ("1 1.5 1.0\n", "line 1: coordinates must be integers >= 1"),
        ("1 1 1.0\n2 inf 1.0\n", "line 2: coordinates must be integers >= 1"),
        ("# nothing\n", "no entries, so the shape is unknown"),
    ],
)
def test_tns_bad_files(tmp_path, text, message):
    path = tmp_path / "bad.tns"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_tns(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_tns_errors_with_shape(tmp_path):
    path = tmp_path / "e.tns"
    path.write_text("")
    assert load_tns(path, shape=(2, 3)).shape == (2, 3)
    path.write_text("3 1 1.0\n")
    with pytest.raises(StorageError, match="e.tns: coordinate 2 of entry 0 is out of range"):
        load_tns(path, shape=(2, 3))
    with pytest.raises(InputError, match="no such file|cannot read"):
        load_tns(tmp_path / "missing.tns")


def test_mtx_round_trip(tmp_path):
    t = random((9, 7), 0.3)
    for name in ("m.mtx", "m.mtx.gz"):
        save_mtx(tmp_path / name, t)
        back = load(tmp_path / name)
        assert str(back.format) == "csr"
        assert_same(back, t.to_dense())
    assert load_mtx(tmp_path / "m.mtx", "coo").format.spelling == "uq"


def test_mtx_symmetric_pattern_integer_and_array(tmp_path):
    (tmp_path / "s.mtx").write_text(
        "%%MatrixMarket matrix coordinate real symmetric\n3 3 2\n2 1 5.0\n3 3 1.0\n"
    )
    assert_same(load_mtx(tmp_path / "s.mtx"), np.array([[0, 5.0, 0], [5, 0, 0], [0, 0, 1]]))
    (tmp_path / "p.mtx").write_text(
        "%%MatrixMarket matrix coordinate pattern general\n2 2 1\n1 2\n"
    )
    assert_same(load_mtx(tmp_path / "p.mtx"), np.array([[0, 1.0], [0, 0]]))
    assert load_mtx(tmp_path / "p.mtx").dtype == np.bool_  # a pattern: bool (issue 40)
    (tmp_path / "i.mtx").write_text(
        "%%MatrixMarket matrix coordinate integer general\n1 2 1\n1 2 7\n"
    )
    assert load_mtx(tmp_path / "i.mtx").dtype == np.int64  # integer files stay integers
    (tmp_path / "a.mtx").write_text("%%MatrixMarket matrix array real general\n2 1\n1.0\n0.0\n")
    assert load_mtx(tmp_path / "a.mtx").format.is_dense


def test_mtx_errors(tmp_path):
    (tmp_path / "bad.mtx").write_text(
        "%%MatrixMarket matrix coordinate real general\n3 3 2\n1 x 2\n"
    )
    with pytest.raises(InputError, match="bad.mtx"):
        load_mtx(tmp_path / "bad.mtx")
    (tmp_path / "c.mtx").write_text(
        "%%MatrixMarket matrix coordinate complex general\n1 1 1\n1 1 1 2\n"
    )
    with pytest.raises(DTypeError, match="c.mtx: complex"):
        load_mtx(tmp_path / "c.mtx")
    with pytest.raises(FormatError, match="matrices"):
        save_mtx(tmp_path / "x.mtx", random((2, 2, 2), 0.5))
    with pytest.raises(InputError, match="unknown tensor file type '.npz'"):
        load(tmp_path / "x.npz")


# --------------------------------------------------------------------------- properties


@pytest.mark.parametrize("order,fmt", ALL_FORMATS)
@given(data=st.data())
@settings(max_examples=20, deadline=None)
def test_dense_round_trip(order, fmt, data):
    array = data.draw(dense_arrays(order))
    index_dtype = data.draw(st.sampled_from(["int32", "int64"]))
    dtype = data.draw(st.sampled_from(["float32", "float64"]))
    t = Tensor.from_dense(array, fmt, index_dtype=index_dtype, dtype=dtype)
    assert_same(t, array.astype(dtype))
    assert (t.dtype, t.index_dtype) == (np.dtype(dtype), np.dtype(index_dtype))
    assert all(a.dtype == np.dtype(index_dtype) for level in t.levels for a in level.arrays())
    if not has_dense_level(t):
        assert t.nnz == np.count_nonzero(array)
    coords, values = t.coords()
    again = Tensor.from_coo(coords, values, array.shape, fmt, index_dtype=index_dtype)
    assert_same(again, array.astype(dtype))
    np.testing.assert_array_equal(again.vals, t.vals)


@given(array=dense_arrays(2), fmt=st.sampled_from(FORMATS[2]))
@settings(max_examples=50, deadline=None)
def test_scipy_and_torch_round_trips(array, fmt):
    t = Tensor.from_dense(array, fmt)
    np.testing.assert_array_equal(t.to_scipy().toarray(), array)
    np.testing.assert_array_equal(t.to_torch().to_dense().numpy(), array)
    assert_same(Tensor.from_scipy(t.to_scipy(), fmt), array)
    assert_same(Tensor.from_torch(t.to_torch(), fmt), array)


@given(
    shape=st.lists(st.integers(0, 6), min_size=1, max_size=3).map(tuple),
    density=st.floats(0, 1),
    seed=st.integers(0, 1000),
)
@settings(max_examples=50, deadline=None)
def test_random_properties(shape, density, seed):
    t = random(shape, density, "coo", seed=seed)
    t.validate()
    assert t.nnz == round(density * int(np.prod(shape)))
    assert np.all(t.vals != 0)
    if density <= 0.3:  # the empty slices always fit
        dense = t.to_dense()
        for mode in range(min(2, len(shape))):
            if shape[mode] > 2:
                counts = np.count_nonzero(np.moveaxis(dense, mode, 0).reshape(shape[mode], -1), 1)
                assert np.any(counts == 0)


def test_pack_keys_wider_than_int64():
    # the linear index of these coordinates does not fit int64: the lexsort path
    huge = 2**40
    coords = [[huge - 1, 0, huge - 1, 5], [3, huge - 2, 3, 0]]
    t = Tensor.from_coo(coords, [1.0, 2.0, 4.0, 8.0], (huge, huge), "dcsr")
    t.validate()
    back, values = t.coords()
    assert back.tolist() == [[0, 5, huge - 1], [huge - 2, 0, 3]] and values.tolist() == [2, 8, 5]


def test_random_on_a_grid_wider_than_int64():
    t = random((2**40, 2**40, 2**40), 1e-35, "coo", seed=5)
    assert t.nnz == round(1e-35 * 2**120) and t.index_dtype == np.int64
    t.validate()


def test_equal_formats_share_one_instance():
    """Kernel calls compare a tensor's format with the compiled one by identity first."""
    a = Tensor.from_scipy(sp.random(6, 5, density=0.4, format="csr", random_state=1))
    b = Tensor.from_dense(np.eye(4), "csr")
    built = Tensor(a.shape, dataclasses.replace(parse_format("csr", 2)), a.levels, a.vals)
    assert a.format is b.format is built.format
    assert a.format == parse_format("csr", 2)
    assert a.format is not Tensor.from_dense(np.eye(4), "csc").format


def test_a_csf_tensor_prints_its_format_as_csf():
    """Issue 36 item 22: a CSF tensor printed as format=sss."""
    t = random((4, 5, 6), 0.2, "csf", seed=0)
    assert "format=csf" in repr(t) and str(t.format) == "csf"
    assert str(parse_format("csf", 4)) == "csf"
    assert str(parse_format("ssd", 3)) == "ssd"  # not a preset


@pytest.mark.parametrize("suffix", [".mtx", ".tns"])
def test_save_takes_what_as_tensor_takes(tmp_path, suffix):
    """A scipy matrix or numpy array saves as its Tensor would (a raw AttributeError, found
    making the README's blocks run)."""
    a = sp.random(6, 5, density=0.4, format="coo", random_state=0)
    save(tmp_path / f"a{suffix}", a)
    back = load(tmp_path / f"a{suffix}", **({"shape": (6, 5)} if suffix == ".tns" else {}))
    np.testing.assert_array_equal(back.to_dense(), a.toarray())
