"""The kernels of the TACO side by side (`bench.taco`, `bench.taco_compile`): each one's
expression (one text, read by TACO's parser and by sparsec), its operands (an input of
`bench.taco_data` in a TACO format), its reference from scipy/numpy, and the check that
every result, sparsec's and TACO's, must pass before it is timed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

import sparsec

from .taco_data import Coo, Data, read

#: TACO format letters -> sparsec's name for the same storage
_SPARSEC_FORMAT = {"ds": "csr", "sss": "csf"}


@dataclass(frozen=True, slots=True)
class Case:
    """One kernel. ``operands``: tensor name -> (input name, TACO format letters);
    ``result``: the result's TACO format; ``order``: an explicit TACO loop order, or "-"
    for TACO's own (see sddmm); ``float32``: the values' type (float64 if not)."""

    name: str
    expr: str
    operands: dict[str, tuple[str, str]]
    result: str
    reference: Callable[[dict[str, Data]], Any]
    order: str = "-"
    float32: bool = False

    @property
    def output(self) -> str:
        return self.expr.split("(", 1)[0].strip()

    @property
    def sparse(self) -> bool:
        return "s" in self.result

    def sparsec_formats(self) -> dict[str, str]:
        given = {name: fmt for name, (_, fmt) in self.operands.items()}
        given[self.output] = self.result
        return {name: _SPARSEC_FORMAT[fmt] for name, fmt in given.items() if "s" in fmt}

    def load(self, files: dict[str, Path]) -> dict[str, Data]:
        return {name: read(files[source]) for name, (source, _) in self.operands.items()}

    def sparsec_inputs(self, data: dict[str, Data]) -> dict[str, Any]:
        """The operands as sparsec takes them (packed here, once)."""
        out: dict[str, Any] = {}
        for name, value in data.items():
            if not isinstance(value, Coo):
                out[name] = value
            elif len(value.dims) == 2:
                out[name] = sparsec.Tensor.from_scipy(value.csr())
            else:
                out[name] = sparsec.Tensor.from_coo(
                    list(value.coords), value.vals, value.dims, "csf", index_dtype=np.int32
                )
        return out

    def describe(self, data: dict[str, Data]) -> str:
        parts = []
        for name, value in data.items():
            shape = "x".join(map(str, value.dims if isinstance(value, Coo) else value.shape))
            nnz = f" nnz {value.vals.size}" if isinstance(value, Coo) else ""
            dtype = (value.vals if isinstance(value, Coo) else value).dtype
            parts.append(f"{name} {shape}{nnz}{' f32' if dtype == np.float32 else ''}")
        return f"{self.expr}: " + ", ".join(parts)


def _csr(d: dict[str, Data], name: str) -> sp.csr_matrix:
    value = d[name]
    assert isinstance(value, Coo)
    return value.csr()


def _dense(d: dict[str, Data], name: str) -> np.ndarray:
    value = d[name]
    assert isinstance(value, np.ndarray)
    return value.astype(np.float64)


def _mttkrp(d: dict[str, Data]) -> np.ndarray:
    """A(i,j) = sum over B's entries of B(i,k,l) D(l,j) C(k,j): the entries' row products
    in slices (sorted by i, so each slice's rows sum by `np.add.reduceat`)."""
    B, D, C = d["B"], _dense(d, "D"), _dense(d, "C")
    assert isinstance(B, Coo)
    i, k, l = B.coords
    out = np.zeros((B.dims[0], D.shape[1]))
    for s in range(0, B.vals.size, 1 << 17):
        rows = slice(s, s + (1 << 17))
        terms = B.vals[rows, None] * D[l[rows]] * C[k[rows]]
        first = np.flatnonzero(np.r_[True, np.diff(i[rows]) != 0])
        out[i[rows][first]] += np.add.reduceat(terms, first, axis=0)
    return out


def _ttv(d: dict[str, Data]) -> np.ndarray:
    B, c = d["B"], _dense(d, "c")
    assert isinstance(B, Coo)
    i, j, k = B.coords
    flat = i.astype(np.int64) * B.dims[1] + j
    sums = np.bincount(flat, weights=B.vals * c[k], minlength=B.dims[0] * B.dims[1])
    return sums.reshape(B.dims[0], B.dims[1])


def _sddmm(d: dict[str, Data]) -> sp.csr_matrix:
    """B's entries times the dot products of C's rows and D's columns at them."""
    B, C, D = _csr(d, "B"), _dense(d, "C"), _dense(d, "D")
    rows = np.repeat(np.arange(B.shape[0]), np.diff(B.indptr))
    dots = np.einsum("pk,kp->p", C[rows], D[:, B.indices])
    return sp.csr_matrix((B.data * dots, B.indices, B.indptr), shape=B.shape)


def _spmv(rows: str, x: str) -> Case:
    return Case(
        "",
        "y(i) = A(i,j) * x(j)",
        {"A": (rows, "ds"), "x": (x, "d")},
        "d",
        lambda d: _csr(d, "A") @ _dense(d, "x"),
    )


_SPMM = "C(i,j) = W(i,k) * X(k,j)"
_SPGEMM = "C(i,j) = A(i,k) * B(k,j)"
CASES: dict[str, Case] = {
    c.name: c
    for c in [
        replace(_spmv("rows50k", "x50k"), name="spmv_randhalf"),
        replace(_spmv("rows100k", "x100k"), name="spmv_rand"),
        replace(_spmv("rows200k", "x200k"), name="spmv_randdouble"),
        replace(_spmv("sprandom100k", "x100k"), name="spmv_sprandom"),
        replace(_spmv("band2m", "x2m"), name="spmv_band"),
        Case(
            "spmm",
            _SPMM,
            {"W": ("pruned3072x768", "ds"), "X": ("dense768x512", "dd")},
            "dd",
            lambda d: _csr(d, "W").astype(np.float64) @ _dense(d, "X"),
        ),
        Case(
            "spmm32",
            _SPMM,
            {"W": ("pruned3072x768_f4", "ds"), "X": ("dense768x512_f4", "dd")},
            "dd",
            lambda d: _csr(d, "W").astype(np.float64) @ _dense(d, "X"),
            float32=True,
        ),
        Case(
            "mttkrp",
            "A(i,j) = B(i,k,l) * D(l,j) * C(k,j)",
            {"B": ("t2000", "sss"), "D": ("dense2000x32a", "dd"), "C": ("dense2000x32b", "dd")},
            "dd",
            _mttkrp,
        ),
        Case(
            "ttv",
            "A(i,j) = B(i,j,k) * c(k)",
            {"B": ("t2000", "sss"), "c": ("x2000", "d")},
            "dd",
            _ttv,
        ),
        Case(
            "spgemm1",
            _SPGEMM,
            {"A": ("pruned3072x768", "ds"), "B": ("pruned768x3072", "ds")},
            "ds",
            lambda d: (_csr(d, "A") @ _csr(d, "B")).tocsr(),
        ),
        Case(
            "spgemm2",
            _SPGEMM,
            {"A": ("rows20k", "ds"), "B": ("rows20k", "ds")},
            "ds",
            lambda d: (_csr(d, "A") @ _csr(d, "B")).tocsr(),
        ),
        Case(
            "add",
            "A(i,j) = B(i,j) + C(i,j)",
            {"B": ("rows20k", "ds"), "C": ("rows20k_b", "ds")},
            "ds",
            lambda d: (_csr(d, "B") + _csr(d, "C")).tocsr(),
        ),
        # TACO's own loop order here is i, k, j, which appends to A's row inside the k loop
        # and gives wrong values (the check catches it); i, j, k is the order a TACO user
        # writes for this kernel (its SDDMM examples do)
        Case(
            "sddmm",
            "A(i,j) = B(i,j) * C(i,k) * D(k,j)",
            {"B": ("rows20k", "ds"), "C": ("dense20000x64", "dd"), "D": ("dense64x20000", "dd")},
            "ds",
            _sddmm,
            order="i,j,k",
        ),
    ]
}


def check(got: Any, ref: Any, float32: bool) -> str | None:
    """None when ``got`` (an array, a `Coo`, a scipy matrix or a sparsec Tensor) matches
    ``ref`` (same shape; a sparse one the same pattern; values within float64's or float32's
    rounding of the reference's size); otherwise what differs."""
    if isinstance(got, Coo):
        got = got.csr()
    elif hasattr(got, "to_scipy"):
        got = got.to_scipy()
    scale = max(1.0, float(np.abs(ref.data if sp.issparse(ref) else ref).max(initial=0.0)))
    tol = (1e-4 if float32 else 1e-9) * scale
    if sp.issparse(ref):
        got = sp.csr_matrix(got)
        if got.shape != ref.shape or got.nnz != ref.nnz:
            return f"shape {got.shape} nnz {got.nnz}, expected {ref.shape} nnz {ref.nnz}"
        got.sort_indices()
        ref = ref.copy()
        ref.sort_indices()
        if not (
            np.array_equal(got.indptr, ref.indptr) and np.array_equal(got.indices, ref.indices)
        ):
            return "a different pattern of entries"
        err = float(np.abs(got.data.astype(np.float64) - ref.data).max(initial=0.0))
    else:
        got = np.asarray(got)
        if got.shape != ref.shape:
            return f"shape {got.shape}, expected {ref.shape}"
        if not np.isfinite(got).all():
            return "values not written (NaN left)"
        err = float(np.abs(got.astype(np.float64) - ref).max(initial=0.0))
    return None if err <= tol else f"max error {err:.3g} (tolerance {tol:.3g})"
