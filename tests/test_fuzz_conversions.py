"""Differential fuzzing of format conversions (issue 36): every way into and out of a
`sparsec.Tensor` keeps every stored entry, coordinates and values, explicit zeros included.

The reference is written here from docs/semantics.md ("Stored zeros are entries") and the
storage model of `sparsec.tensors.tensor`, not from sparsec's packer: a dict of
coordinates -> value (duplicates summed, a sum of 0 kept), and `stored`, the entries a
format holds for such a dict -- the dict's own, plus the zeros its dense levels force and a
padded singleton's filler (coordinate 0) under a parent that has no entry. A pattern a
unique singleton cannot hold (two children under one parent) is a `StorageError`; a
singleton over a mode of extent 0 below stored parents a `FormatError`.

Paths: `Tensor.from_coo` (duplicates), `from_arrays`, `to_format`, `as_tensor`, `to_dense`, `to_scipy`,
`to_torch`, `from_scipy` (coo with duplicates, csr/csc with unsorted indices and zeros),
`from_torch` (uncoalesced COO, CSR, CSC, dense), `from_dense` (numpy: its nonzeros), the
call-time packing of a kernel's input into its declared format (read back through the
pattern of ``O = A``), and .tns/.mtx files. Orders 1-4, every level letter (d s u q p) in
random mode orderings, extents 0-5, empty slices. The fast suite draws `FAST` cases from a
fixed seed; ``-m slow`` draws `SLOW`.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsec
from sparsec.base.errors import FormatError, StorageError
from sparsec.tensors.formats import parse_format

FAST, SLOW = 600, 10000
#: one case in this many also runs the call-time packing (a kernel compile each)
KERNEL_EVERY = 40
PRESETS = {
    1: ["dense", "coo", "csf"],
    2: ["csr", "csc", "dcsr", "dcsc", "coo", "csf", "dense"],
    3: ["coo", "csf", "dense"],
    4: ["coo", "csf"],
}

Entries = dict[tuple[int, ...], float]


# ------------------------------------------------------------------ the reference
def random_format(rng: np.random.Generator, order: int) -> str:
    """A preset, or level letters in a random mode ordering, drawn until the format grammar
    takes them (``u`` above singletons only, no singleton first)."""
    if rng.random() < 0.25:
        return str(rng.choice(PRESETS[order]))
    while True:
        spec = "".join(rng.choice(list("dsuqp"), order)) + ":"
        spec += ",".join(map(str, rng.permutation(order)))
        try:
            parse_format(spec, order)
        except FormatError:
            continue
        return spec


def level_info(spec: str, order: int) -> tuple[str, tuple[int, ...]]:
    """(letters, ordering) of a format spec, read with sparsec's parser (the grammar is not
    what is tested here; the storage is)."""
    fmt = parse_format(spec, order)
    return "".join(level.spelling for level in fmt.levels), fmt.ordering


def stored(entries: Entries, shape: tuple[int, ...], spec: str) -> Entries:
    """What ``spec`` stores for ``entries`` (mode-order coordinates -> value), by the
    storage model: level by level, the set of stored coordinate prefixes (level order).
    Raises StorageError / FormatError where sparsec must refuse."""
    order = len(shape)
    letters, ordering = level_info(spec, order)
    keys = [tuple(c[m] for m in ordering) for c in entries]
    sizes = [shape[m] for m in ordering]
    prefixes: set[tuple[int, ...]] = {()}
    for k, (ch, size) in enumerate(zip(letters, sizes, strict=True)):
        if ch == "d":
            prefixes = {p + (c,) for p in prefixes for c in range(size)}
            continue
        children = {e[: k + 1] for e in keys}
        if ch in "qp":
            if not _in_chain(letters, k):
                by_parent: dict[tuple[int, ...], set[int]] = {}
                for e in children:
                    by_parent.setdefault(e[:k], set()).add(e[k])
                if any(len(cs) > 1 for cs in by_parent.values()):
                    raise StorageError("two children under one parent of a singleton")
            if size == 0 and prefixes:
                raise FormatError("a singleton over an empty mode")
            have = {e[:k] for e in children}
            children |= {p + (0,) for p in prefixes if p not in have}  # padding
        prefixes = {e for e in children if e[:k] in prefixes}
    inverse = np.argsort(ordering)
    values = {tuple(c[m] for m in ordering): v for c, v in entries.items()}
    return {tuple(int(p[i]) for i in inverse): values.get(p, 0.0) for p in prefixes}


def _in_chain(letters: str, k: int) -> bool:
    """Is the singleton at level ``k`` in a ``u`` level's chain (down to the chain's first
    unique singleton), whose positions are the chain's distinct tuples? Else it stores one
    coordinate per parent position."""
    h = k - 1
    while letters[h] == "q" and letters[h + 1] in "qp":  # a non-unique singleton
        h -= 1
    return letters[h] == "u"


def entries_of(t: sparsec.Tensor) -> Entries:
    coords, vals = t.coords()
    found = {tuple(int(x) for x in c): float(v) for c, v in zip(coords.T, vals, strict=True)}
    assert len(found) == t.nnz, "a coordinate stored twice"
    return found


def summed(coords: np.ndarray, values: np.ndarray) -> Entries:
    out: Entries = {}
    for c, v in zip(coords.T, values, strict=True):
        key = tuple(int(x) for x in c)
        out[key] = out.get(key, 0.0) + float(v)
    return out


def _nonzero(entries: Entries) -> Entries:
    return {c: v for c, v in entries.items() if v != 0}


def as_dense(entries: Entries, shape: tuple[int, ...]) -> np.ndarray:
    out = np.zeros(shape)
    for c, v in entries.items():
        out[c] = v
    return out


def same(got: Entries, want: Entries, what: str) -> None:
    assert got.keys() == want.keys(), (
        f"{what}: coordinates differ: missing {sorted(want.keys() - got.keys())[:5]}, "
        f"extra {sorted(got.keys() - want.keys())[:5]}"
    )
    for c, v in want.items():
        assert got[c] == v, f"{what}: value at {c}: {got[c]} != {v}"


def expect(fn, entries: Entries, shape: tuple[int, ...], spec: str, what: str) -> None:
    """``fn()`` stores exactly `stored`'s entries, or raises the same refusal."""
    try:
        want = stored(entries, shape, spec)
    except (StorageError, FormatError) as err:
        with pytest.raises(type(err)):
            fn()
        return
    same(entries_of(fn()), want, what)


# ------------------------------------------------------------------ the case
def draw(rng: np.random.Generator) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
    """A shape (extents 0-5), mode-order coordinates with duplicates and empty slices,
    integer values with explicit zeros (and duplicates that cancel)."""
    order = int(rng.integers(1, 5))
    shape = tuple(
        int(rng.choice([0, 1, 2, 3, 4, 5], p=[0.05, 0.1, 0.2, 0.25, 0.2, 0.2]))
        for _ in range(order)
    )
    size = int(np.prod(shape))
    if size == 0:
        return shape, np.zeros((order, 0), dtype=np.int64), np.zeros(0)
    n = int(rng.integers(0, min(size, 14) + 1))
    flat = rng.integers(0, size, n)
    if shape[0] > 1 and n:
        flat = flat[np.unravel_index(flat, shape)[0] != rng.integers(shape[0])]  # an empty slice
    coords = np.array(np.unravel_index(flat, shape), dtype=np.int64).reshape(order, -1)
    values = rng.integers(-2, 3, coords.shape[1]).astype(float)  # zeros among them
    if coords.shape[1] and rng.random() < 0.3:  # a duplicate that cancels: a stored 0
        coords = np.concatenate([coords, coords[:, :1]], axis=1)
        values = np.concatenate([values, -values[:1]])
    return shape, coords, values


def run_case(seed: int, tmp: Path) -> None:
    rng = np.random.default_rng(seed)
    shape, coords, values = draw(rng)
    order = len(shape)
    dtype = str(rng.choice(["float32", "float64"]))
    index = str(rng.choice(["int32", "int64"]))
    given = summed(coords, values)
    source_spec = random_format(rng, order)
    try:
        source_want = stored(given, shape, source_spec)
    except (StorageError, FormatError) as err:
        with pytest.raises(type(err)):
            sparsec.Tensor.from_coo(coords, values, shape, source_spec, dtype=dtype)
        source_spec = "coo" if order > 1 else "s"
        source_want = stored(given, shape, source_spec)
    src = sparsec.Tensor.from_coo(
        coords, values, shape, source_spec, dtype=dtype, index_dtype=index
    )
    same(entries_of(src), source_want, f"from_coo {source_spec}")
    np.testing.assert_array_equal(src.to_dense(), as_dense(source_want, shape))
    raw = sparsec.Tensor.from_arrays(shape, source_spec, list(src.levels), src.vals)
    same(entries_of(raw), source_want, f"from_arrays {source_spec}")
    target = random_format(rng, order)
    expect(lambda: src.to_format(target), source_want, shape, target, f"to_format {target}")
    expect(lambda: sparsec.as_tensor(src, target), source_want, shape, target, "as_tensor")
    if rng.random() < 0.5:  # eliminate_zeros: the nonzeros, then what the format forces
        nonzero = {c: v for c, v in source_want.items() if v != 0}
        expect(src.eliminate_zeros, nonzero, shape, source_spec, "eliminate_zeros")
    _torch_paths(rng, src, source_want, shape, target)
    if order == 2:
        _scipy_paths(rng, src, source_want, shape, target)
    nonzeros = {c: v for c, v in given.items() if v != 0}  # a dense array stores these
    dense = as_dense(given, shape)
    expect(lambda: sparsec.Tensor.from_dense(dense, target), nonzeros, shape, target, "from_dense")
    _files(rng, src, source_want, shape, target, tmp)
    if seed % KERNEL_EVERY == 0:
        _packed_at_call_time(rng, src, source_want, shape, target, dense)


def _torch_paths(rng, src, want: Entries, shape, target: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        out = src.to_torch()
        if out.layout == torch.strided:
            np.testing.assert_array_equal(out.numpy(), as_dense(want, shape))
        else:
            same(_torch_entries(out), want, "to_torch")
        keys = list(want)
        if not keys or len(shape) == 0:
            return
        # an uncoalesced COO with each entry split in two (duplicates summed on the way in)
        coords = torch.tensor(np.array(keys + keys).T, dtype=torch.int64)
        vals = np.array([want[c] for c in keys])
        half = np.floor(vals / 2)
        coo = torch.sparse_coo_tensor(
            coords, torch.tensor(np.concatenate([half, vals - half])), shape
        )
        expect(
            lambda: sparsec.Tensor.from_torch(coo, target), want, shape, target, "from_torch coo"
        )
        if len(shape) == 2:
            m = sp.csr_array((vals, np.array(keys).T), shape=shape)  # sorted; zeros kept
            for layout in ("csr", "csc"):
                mat = m if layout == "csr" else m.tocsc()
                pos, crd = torch.tensor(mat.indptr), torch.tensor(mat.indices)
                make = torch.sparse_csr_tensor if layout == "csr" else torch.sparse_csc_tensor
                t = make(pos, crd, torch.tensor(mat.data), shape)
                assert int(t.values().numel()) == len(keys)
                expect(
                    lambda t=t: sparsec.Tensor.from_torch(t, target),
                    want,
                    shape,
                    target,
                    f"from_torch {layout}",
                )


def _torch_entries(t) -> Entries:
    if t.layout == torch.sparse_csr:
        pos, crd, vals = t.crow_indices().numpy(), t.col_indices().numpy(), t.values().numpy()
        rows = np.repeat(np.arange(len(pos) - 1), np.diff(pos))
        return summed(np.array([rows, crd]), vals)
    assert t.is_coalesced()
    return summed(t.indices().numpy(), t.values().numpy())


def _scipy_paths(rng, src, want: Entries, shape, target: str) -> None:
    out = src.to_scipy()
    if out.format in ("csr", "csc"):
        outer = np.repeat(np.arange(len(out.indptr) - 1), np.diff(out.indptr))
        rc = [outer, out.indices] if out.format == "csr" else [out.indices, outer]
        got = summed(np.array(rc), out.data)
        assert out.nnz == len(got)
    else:
        got = summed(np.array(out.coords), out.data)
        assert out.nnz == len(got)
    same(got, want, f"to_scipy ({out.format})")
    keys = list(want)
    rc = np.array(keys, dtype=np.int64).T.reshape(2, -1)
    vals = np.array([want[c] for c in keys])
    # COO with every entry twice (halves), CSR/CSC with each row's indices reversed
    half = np.floor(vals / 2)
    coo = sp.coo_array(
        (np.concatenate([half, vals - half]), np.concatenate([rc, rc], axis=1)), shape=shape
    )
    expect(lambda: sparsec.Tensor.from_scipy(coo, target), want, shape, target, "from_scipy coo")
    for kind in ("csr", "csc"):
        m = (
            sp.csr_array((vals, rc), shape=shape)
            if kind == "csr"
            else sp.csc_array((vals, rc), shape=shape)
        )
        if m.nnz != len(keys):  # scipy's constructor summed nothing away; keep the check honest
            raise AssertionError("scipy dropped an entry")
        indices = m.indices.copy()
        for a, b in itertools.pairwise(m.indptr):
            indices[a:b] = indices[a:b][::-1]
        data = m.data.copy()
        for a, b in itertools.pairwise(m.indptr):
            data[a:b] = data[a:b][::-1]
        make = sp.csr_array if kind == "csr" else sp.csc_array
        unsorted = make((data, indices, m.indptr.copy()), shape=shape)
        expect(
            lambda u=unsorted: sparsec.Tensor.from_scipy(u, target),
            want,
            shape,
            target,
            f"from_scipy {kind}",
        )
        expect(
            lambda u=unsorted: sparsec.as_tensor(u, target), want, shape, target, "as_tensor scipy"
        )


def _files(rng, src, want: Entries, shape, target: str, tmp: Path) -> None:
    kinds = [".tns"] + ([".mtx"] if len(shape) == 2 else [])
    for suffix in kinds:
        path = tmp / f"t{suffix}"
        sparsec.io.save(path, src)
        expect(lambda p=path: sparsec.io.load(p, target), want, shape, target, f"load {suffix}")
        path.unlink()


_KERNELS: dict[tuple[int, str], sparsec.Kernel] = {}


def _packed_at_call_time(rng, src, want: Entries, shape, target: str, dense: np.ndarray) -> None:
    """``O = A`` with A declared ``target``: O (compressed levels in A's mode ordering)
    stores exactly A's entries as packed at call time, from a Tensor, numpy, scipy and
    torch (dense, COO, CSR, CSC)."""
    order = len(shape)
    try:
        stored(want, shape, target)  # else the target cannot hold them: nothing to pack
    except (StorageError, FormatError):
        return
    _, ordering = level_info(target, order)
    idx = "ijkl"[:order]
    access = ",".join(idx)
    out = "s" * order + ":" + ",".join(map(str, ordering))
    key = (order, target)
    if key not in _KERNELS:
        _KERNELS[key] = sparsec.kernel(f"O({access}) = A({access})", {"A": target, "O": out})
    k = _KERNELS[key]
    # each input with the entries it holds: a dense array (numpy, dense torch) its nonzeros
    inputs: list[tuple[object, Entries]] = [(src, want), (src.to_dense(), _nonzero(want))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        t = src.to_torch()
        inputs.append((t, _nonzero(want) if t.layout == torch.strided else want))
        if order == 2:
            inputs.append((src.to_scipy(), want))
            keys = list(want)
            m = sp.csc_array(
                ([want[c] for c in keys], np.array(keys).T.reshape(2, -1)), shape=shape
            )
            csc = torch.sparse_csc_tensor(
                torch.tensor(m.indptr), torch.tensor(m.indices), torch.tensor(m.data), shape
            )
            inputs.append((csc, want))
        for a, holds in inputs:
            what = f"call-time packing of {type(a).__name__} into {target}"
            expect(lambda a=a: k(A=a), holds, shape, target, what)


@pytest.mark.parametrize("chunk", range(6))
def test_conversions_keep_every_stored_entry(chunk: int, tmp_path: Path) -> None:
    for seed in range(chunk, FAST, 6):
        run_case(seed, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(20))
def test_conversions_keep_every_stored_entry_slow(chunk: int, tmp_path: Path) -> None:
    for seed in range(FAST + chunk, FAST + SLOW, 20):
        run_case(seed, tmp_path)


def test_the_reference_model() -> None:
    """`stored` on known formats: csr with an empty row, ELL's padding, a dense level."""
    e = {(0, 1): 0.0, (2, 0): 3.0}
    assert stored(e, (3, 2), "csr") == e
    assert stored(e, (3, 2), "dp") == {(0, 1): 0.0, (1, 0): 0.0, (2, 0): 3.0}
    assert stored(e, (3, 2), "sd") == {(0, 0): 0.0, (0, 1): 0.0, (2, 0): 3.0, (2, 1): 0.0}
    with pytest.raises(StorageError):
        stored({(0, 0): 1.0, (0, 1): 1.0}, (1, 2), "sq")
