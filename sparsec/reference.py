"""Dense reference: evaluate a statement with torch on densified inputs, and compare.

Each `Sum` over a product is one ``torch.einsum`` (so MTTKRP never materialises the
four-index product); other nodes broadcast by index label. The comparison tolerance
is dtype-aware: ``|got - want| <= rtol * (|want| + max(1, max|want|))`` with ``rtol``
1e-4 for float32 and 1e-9 for float64 results; NaNs must coincide.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import assert_never

import numpy as np
import torch

from .concrete import CExpr, Statement, Sum, Zero
from .errors import CheckError
from .lattice import divides
from .notation import Access, BinOp, Literal, Neg

Labelled = tuple[torch.Tensor, tuple[str, ...]]

RTOL = {"float32": 1e-4, "float64": 1e-9}


def _align(t: torch.Tensor, labels: tuple[str, ...], target: tuple[str, ...]) -> torch.Tensor:
    """``t`` with its dims permuted to ``target`` order and size-1 dims for missing labels."""
    perm = [labels.index(x) for x in target if x in labels]
    t = t.permute(perm) if perm else t
    shape = []
    it = iter(t.shape)
    for x in target:
        shape.append(next(it) if x in labels else 1)
    return t.reshape(shape)


def _union(*label_sets: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(x for ls in label_sets for x in ls))


def _factors(expr: CExpr) -> tuple[list[CExpr], float]:
    """Flatten a product (through negations) into factors and a sign."""
    match expr:
        case BinOp(op="*", left=left, right=right):
            fl, sl = _factors(left)
            fr, sr = _factors(right)
            return fl + fr, sl * sr
        case Neg(operand=x):
            f, s = _factors(x)
            return f, -s
        case _:
            return [expr], 1.0


def evaluate(expr: CExpr, inputs: Mapping[str, torch.Tensor], exact: bool = False) -> Labelled:
    """The dense value of ``expr`` labelled by its free indices.

    ``exact`` evaluates every product and sum as written, elementwise (no einsum): einsum
    may factor ``Σk a(k) * c`` into ``c * Σk a(k)``, which differs when ``c`` is infinite
    and some ``a(k)`` is zero. Used when the expression divides (so infinities arise).
    """
    match expr:
        case Access(name=name, indices=indices):
            return inputs[name], indices
        case Literal(value=v):
            return torch.tensor(v, dtype=torch.float64), ()
        case Zero():
            return torch.tensor(0.0, dtype=torch.float64), ()
        case Neg(operand=x):
            t, labels = evaluate(x, inputs, exact)
            return -t, labels
        case Sum(indices=indices, body=body) if exact:
            t, labels = evaluate(body, inputs, exact)
            dims = [labels.index(i) for i in indices if i in labels]
            kept = tuple(x for x in labels if x not in indices)
            return (t.sum(dim=dims) if dims else t), kept
        case Sum(indices=indices, body=body):
            return _reduce(body, indices, inputs)
        case BinOp(op="*") if not exact:
            return _reduce(expr, (), inputs)
        case BinOp(op=op, left=left, right=right):
            a, la = evaluate(left, inputs, exact)
            b, lb = evaluate(right, inputs, exact)
            labels = _union(la, lb)
            a, b = _align(a, la, labels), _align(b, lb, labels)
            match op:
                case "+":
                    return a + b, labels
                case "-":
                    return a - b, labels
                case "*":
                    return a * b, labels
                case "/":
                    return a / b, labels
            raise AssertionError(op)
        case _:
            assert_never(expr)


def _reduce(body: CExpr, indices: tuple[str, ...], inputs: Mapping[str, torch.Tensor]) -> Labelled:
    factors, sign = _factors(body)
    evaluated = [evaluate(f, inputs) for f in factors]
    labels = _union(*(ls for _, ls in evaluated))
    out = tuple(x for x in labels if x not in indices)
    letters = dict(zip(labels, string.ascii_letters, strict=False))
    spec = ",".join("".join(letters[x] for x in ls) for _, ls in evaluated)
    spec += "->" + "".join(letters[x] for x in out)
    operands = [t for t, _ in evaluated]
    if sign < 0:
        # negate a factor, not the sum: each term is computed as written (as the kernel
        # does), so a sum of zeros keeps the sign IEEE addition gives it
        operands[0] = -operands[0]
    return torch.einsum(spec, *operands), out


def reference(
    statement: Statement,
    inputs: Mapping[str, torch.Tensor],
    dims: Mapping[str, int],
    current: torch.Tensor | None = None,
) -> torch.Tensor:
    """The dense float64 value of ``statement``'s left-hand side."""
    rhs: CExpr = Sum(statement.top_sums, statement.rhs) if statement.top_sums else statement.rhs
    t, labels = evaluate(rhs, inputs, exact=divides(rhs))
    lhs = statement.lhs.indices
    t = _align(t, labels, lhs)
    t = t.expand(*(dims[i] for i in lhs)).clone() if lhs else t.clone()
    if current is not None:
        t = t + current
    return t


def compare(got: np.ndarray, want: np.ndarray, dtype: str, what: str) -> float:
    """Max abs error of ``got`` against ``want``; raises `CheckError` beyond tolerance."""
    got64 = np.asarray(got, dtype=np.float64)
    want64 = np.asarray(want, dtype=np.float64)
    if got64.shape != want64.shape:
        raise CheckError(f"{what}: result shape {got64.shape} != reference shape {want64.shape}")
    if got64.size == 0:
        return 0.0
    rtol = RTOL[dtype]
    finite = np.isfinite(want64)
    scale = max(1.0, float(np.max(np.abs(want64[finite]), initial=0.0)))
    tol = rtol * (np.abs(np.where(finite, want64, 0.0)) + scale)
    with np.errstate(invalid="ignore"):
        diff = np.abs(got64 - want64)
        same_special = (np.isnan(got64) & np.isnan(want64)) | (~finite & (got64 == want64))
        bad = ~same_special & ~(diff <= tol)
    if bad.any():
        excess = np.where(bad, np.nan_to_num(diff / tol, nan=np.inf, posinf=np.inf), -1.0)
        worst = np.unravel_index(int(np.argmax(excess)), got64.shape)
        at = ",".join(map(str, worst))
        raise CheckError(
            f"{what}: result differs from dense torch at [{at}]: got {got64[worst]!r}, "
            f"expected {want64[worst]!r} (tolerance {tol[worst]:.3g}); "
            f"{int(bad.sum())} of {bad.size} elements differ"
        )
    ok = ~(np.isnan(diff))
    return float(np.max(diff[ok], initial=0.0))
