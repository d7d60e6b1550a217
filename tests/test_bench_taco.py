"""The TACO side by side's own parts (`bench.taco_data`, `bench.taco_cases`): the inputs
are the same on every draw, files read back what was written, and the check refuses
results that differ. The suite's runs are smoke-tested in test_examples.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from bench import taco_data
from bench.taco_cases import CASES, check
from bench.taco_data import Coo, draw, ensure, read, write


def test_every_kernel_reads_drawn_inputs() -> None:
    for case in CASES.values():
        for source, fmt in case.operands.values():
            assert source in taco_data.INPUTS, (case.name, source)
            assert set(fmt) <= {"d", "s"}


@pytest.mark.parametrize("name", ["rows50k", "sprandom100k", "t2000", "dense768x512_f4"])
def test_an_input_is_the_same_on_every_draw(name: str) -> None:
    first, again = draw(name, scale=10), draw(name, scale=10)
    if isinstance(first, Coo):
        assert isinstance(again, Coo) and first.dims == again.dims
        for a, b in zip(first.coords, again.coords, strict=True):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(first.vals, again.vals)
    else:
        np.testing.assert_array_equal(first, again)


def test_the_inputs_have_their_shapes() -> None:
    rows = draw("rows50k", scale=10)
    assert isinstance(rows, Coo) and rows.dims == (5000, 5000)
    np.testing.assert_array_equal(np.diff(rows.csr().indptr), 10)  # exactly 10 a row
    varied = draw("sprandom100k", scale=10)
    assert isinstance(varied, Coo)
    lengths = np.diff(varied.csr().indptr)
    assert abs(lengths.mean() - 10) < 0.5 and lengths.min() < 5 < 15 < lengths.max()
    three = draw("t2000", scale=10)
    assert isinstance(three, Coo) and three.dims == (200, 200, 200) and three.vals.size == 1000
    flat = np.ravel_multi_index(three.coords, three.dims)
    assert np.all(np.diff(flat) > 0)  # sorted, distinct
    assert draw("dense768x512_f4", scale=10).dtype == np.float32


def test_files_read_back_what_was_written(tmp_path: Path) -> None:
    three = draw("t2000", scale=10)
    dense = draw("dense768x512_f4", scale=10)
    write(tmp_path / "t.sct", three)
    write(tmp_path / "d.sct", dense)
    back = read(tmp_path / "t.sct")
    assert isinstance(back, Coo) and back.dims == three.dims
    np.testing.assert_array_equal(back.vals, three.vals)
    np.testing.assert_array_equal(read(tmp_path / "d.sct"), dense)
    paths = ensure(["x2000"], tmp_path / "data", 10)
    assert read(paths["x2000"]).shape == (200,)
    with pytest.raises(ValueError, match="float32 or float64"):
        write(tmp_path / "i.sct", np.arange(3))


def test_the_check_refuses_a_different_result() -> None:
    ref = sp.random(30, 30, density=0.2, format="csr", random_state=np.random.default_rng(1))
    assert check(ref.copy(), ref, float32=False) is None
    assert check(taco_data.coo_of(ref), ref, float32=False) is None
    moved = ref.copy()
    moved.data = moved.data + 1e-3
    assert "max error" in str(check(moved, ref, float32=False))
    assert "nnz" in str(check(ref[:, :29].tocsr(), ref, float32=False))
    dense = ref.toarray()
    holes = dense.copy()
    holes[3, 4] = np.nan
    assert check(dense, dense, float32=True) is None
    assert "NaN" in str(check(holes, dense, float32=False))


def test_the_ratio_is_the_median_of_the_rounds_own_ratios() -> None:
    """A slow spell (2x) over three of TACO's five blocks and one of sparsec's, that one in a
    round where TACO's was slow too: the pooled medians say 2.0x, the rounds' own ratios
    1.0x in three rounds of five."""
    from bench.taco import ratio_of

    theirs = {"median_ms": 2.0, "round_medians_ms": [2.0, 2.0, 2.0, 1.0, 1.0]}
    mine = {"median_ms": 1.0, "round_medians_ms": [2.0, 1.0, 1.0, 1.0, 1.0]}
    assert theirs["median_ms"] / mine["median_ms"] == 2.0  # what the pooled ratio said
    assert ratio_of(theirs, mine) == pytest.approx(1.0)
