"""Differential fuzzing of gradients (issue 36): random statements (sums nested under
functions and products, scalar outputs, the differentiable functions of docs/semantics.md
"Gradients", division by a literal) with dense and sparse inputs (torch CSR/COO with
explicit stored zeros and empty rows, and sparsec.Tensor in several formats), through
torch autograd and through `sparsec.api.gradient.gradients`.

The reference is written here from docs/semantics.md, apart from sparsec: the statement's
tree is evaluated densely in torch with each summed variable summed at the smallest
subtree holding every read of it ("Reductions"), unstored entries the constant 0, and
differentiated by ``.backward()``; a sparse input's gradient is compared at its stored
entries only. Data are small integers and quarters (exact in any order of the sums).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparsec
from sparsec.api.gradient import gradients

FAST, SLOW, DRAWS = 40, 700, 5
F64 = torch.float64
EXTENT = {"i": 3, "j": 2, "k": 4}
#: name -> (torch function, arity); the differentiable functions of "Gradients"
FUNCS = {
    "exp": (torch.exp, 1),
    "sin": (torch.sin, 1),
    "cos": (torch.cos, 1),
    "tanh": (torch.tanh, 1),
    "sigmoid": (torch.sigmoid, 1),
    "abs": (torch.abs, 1),
    "relu": (torch.relu, 1),
    "sign": (torch.sign, 1),
    "max": (torch.maximum, 2),
    "min": (torch.minimum, 2),
}
SPARSE = {1: ["s"], 2: ["csr", "csc", "coo", "dcsr"]}


class Gen:
    """A random statement: a tree of ("read", name, vars), ("op", sym, l, r),
    ("fn", name, args), ("div", e, literal), ("pow", e, p)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng, self.reads = rng, {}

    def read(self) -> tuple:
        name = "BCDEFGH"[len(self.reads)]
        order = int(self.rng.integers(1, 3))
        vars_ = "".join(self.rng.permutation(list("ijk"))[:order])
        self.reads[name] = vars_
        return ("read", name, vars_)

    def expr(self, depth: int) -> tuple:
        r = self.rng.random()
        if depth == 0 or r < 0.25 or len(self.reads) >= 5:
            return self.read()
        if r < 0.65:
            sym = "+-*"[int(self.rng.integers(3))]
            return ("op", sym, self.expr(depth - 1), self.expr(depth - 1))
        if r < 0.85:
            name = list(FUNCS)[int(self.rng.integers(len(FUNCS)))]
            return ("fn", name, [self.expr(depth - 1) for _ in range(FUNCS[name][1])])
        if r < 0.93:
            return ("div", self.expr(depth - 1), [2.0, 0.5, -4.0][int(self.rng.integers(3))])
        return ("pow", self.expr(depth - 1), int(self.rng.integers(1, 4)))


def text(e: tuple) -> str:
    kind = e[0]
    if kind == "read":
        return f"{e[1]}({','.join(e[2])})"
    if kind == "op":
        return f"({text(e[2])} {e[1]} {text(e[3])})"
    if kind == "fn":
        return f"{e[1]}({', '.join(text(a) for a in e[2])})"
    if kind == "div":
        return f"({text(e[1])} / {e[2]})"
    return f"pow({text(e[1])}, {e[2]})"


def children(e: tuple) -> list[tuple]:
    if e[0] == "op":
        return [e[2], e[3]]
    if e[0] == "fn":
        return list(e[2])
    return [] if e[0] == "read" else [e[1]]


def reads_of(e: tuple, v: str) -> int:
    own = int(v in e[2]) if e[0] == "read" else 0
    return own + sum(reads_of(c, v) for c in children(e))


def placement(e: tuple, v: str) -> int:
    """id of the smallest subtree of ``e`` holding every read of ``v``."""
    total = reads_of(e, v)
    while True:
        inner = [c for c in children(e) if reads_of(c, v) == total]
        if not inner:
            return id(e)
        e = inner[0]


def align(t: torch.Tensor, have: str, want: str) -> torch.Tensor:
    """``t`` over ``have`` viewed over ``want`` (missing dims of size 1)."""
    t = t.permute(*[have.index(v) for v in want if v in have]) if have else t
    return t.reshape([EXTENT[v] if v in have else 1 for v in want])


def evaluate(e: tuple, leaves: dict, places: dict[int, list[str]]) -> tuple[torch.Tensor, str]:
    """``e``'s dense value and its free variables (naming its dims)."""
    if e[0] == "read":
        val, vars_ = leaves[e[1]], e[2]
    else:
        parts = [evaluate(c, leaves, places) for c in children(e)]
        vars_ = "".join(sorted(set("".join(v for _, v in parts))))
        args = [align(t, v, vars_).expand([EXTENT[x] for x in vars_]) for t, v in parts]
        if e[0] == "op":
            a, b = args
            val = a + b if e[1] == "+" else a - b if e[1] == "-" else a * b
        elif e[0] == "fn":
            val = FUNCS[e[1]][0](*args)
        elif e[0] == "div":
            val = args[0] / e[2]
        else:
            val = args[0] ** e[2]
    for v in places.get(id(e), []):
        val, vars_ = val.sum(vars_.index(v)), vars_.replace(v, "")
    return val, vars_


def draw_kernel(rng: np.random.Generator) -> tuple[str, tuple, str, dict[str, str]]:
    gen = Gen(rng)
    tree = gen.expr(int(rng.integers(1, 4)))
    free = sorted(set("".join(gen.reads.values())))
    out = "".join(v for v in free if rng.random() < 0.5)
    lhs = f"y({','.join(out)})" if out else "a"
    return f"{lhs} = {text(tree)}", tree, out, gen.reads


def values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Small integers and quarters, a third of them zero, and an empty first row."""
    v = rng.integers(-3, 4, shape) / rng.choice([1.0, 4.0])
    v[rng.random(shape) < 0.33] = 0.0
    if len(shape) == 2:
        v[0] = 0.0
    return v


def pattern(rng: np.random.Generator, v: np.ndarray) -> np.ndarray:
    """Stored entries: the non-zeros and some explicit zeros."""
    return (v != 0) | (rng.random(v.shape) < 0.3)


def reference(tree: tuple, out: str, reads: dict[str, str], dense: dict, dy: torch.Tensor) -> dict:
    leaves = {n: torch.tensor(a, dtype=F64, requires_grad=True) for n, a in dense.items()}
    summed = set("".join(reads.values())) - set(out)
    places: dict[int, list[str]] = {}
    for v in sorted(summed):
        places.setdefault(placement(tree, v), []).append(v)
    val, vars_ = evaluate(tree, leaves, places)
    val = align(val, vars_, out).expand([EXTENT[x] for x in out])
    val.backward(dy)
    return {n: t.grad.numpy() for n, t in leaves.items()}


def torch_input(
    rng: np.random.Generator, v: np.ndarray, keep: np.ndarray, layout: str
) -> torch.Tensor:
    idx = np.nonzero(keep)
    coo = torch.sparse_coo_tensor(
        np.array(idx), v[idx], v.shape, dtype=F64, check_invariants=True
    ).coalesce()
    if layout == "csr":
        crow = np.concatenate([[0], np.cumsum(keep.sum(1))])
        # from a list: numpy's nonzero gives strided views, and a 1-element array keeps a
        # stride torch copies and its CSR check refuses ("contiguous tensor per batch")
        crd = torch.tensor(idx[1].tolist(), dtype=torch.int64)
        return torch.sparse_csr_tensor(
            torch.tensor(crow, dtype=torch.int64),
            crd,
            torch.tensor(v[idx], dtype=F64),
            v.shape,
            dtype=F64,
            check_invariants=True,
        ).requires_grad_()
    return coo.requires_grad_()


def run_case(seed: int) -> int:
    """Draws a kernel and checks ``DRAWS`` data draws; returns the cases checked."""
    rng = np.random.default_rng(seed)
    stmt, tree, out, reads = draw_kernel(rng)
    via_torch = rng.random() < 0.5
    formats: dict[str, str] = {}
    for name, vars_ in reads.items():
        if rng.random() < 0.5:
            formats[name] = "dense" if len(vars_) == 2 else "d"
        elif via_torch:
            formats[name] = ["csr", "coo"][int(rng.integers(2))] if len(vars_) == 2 else "d"
        else:
            opts = SPARSE[len(vars_)]
            formats[name] = opts[int(rng.integers(len(opts)))]
    kernel = sparsec.kernel(stmt, formats)
    for _ in range(DRAWS):
        dense, stored, args = {}, {}, {}
        for name, vars_ in reads.items():
            shape = tuple(EXTENT[v] for v in vars_)
            dense[name] = values(rng, shape)
            sparse = formats[name] not in ("dense", "d")
            stored[name] = pattern(rng, dense[name]) if sparse else np.ones(shape, bool)
            dense[name] = np.where(stored[name], dense[name], 0.0)
            if not sparse:
                args[name] = torch.tensor(dense[name], dtype=F64, requires_grad=True)
            elif via_torch:
                args[name] = torch_input(rng, dense[name], stored[name], formats[name])
            else:
                idx = np.array(np.nonzero(stored[name]))
                args[name] = sparsec.Tensor.from_coo(
                    idx, dense[name][tuple(idx)], shape, formats[name]
                )
        dy = torch.tensor(rng.integers(-2, 3, [EXTENT[v] for v in out]), dtype=F64)
        want = reference(tree, out, reads, dense, dy)
        ctx = f"{stmt} {formats} torch={via_torch}"
        if via_torch:
            kernel(**args).backward(dy)
            for name, t in args.items():
                grad = (
                    t.grad.to_dense().numpy() if t.grad.layout != torch.strided else t.grad.numpy()
                )
                exp = np.where(stored[name], want[name], 0.0)
                np.testing.assert_allclose(
                    grad, exp, rtol=1e-9, atol=1e-9, err_msg=f"{ctx} d{name}"
                )
        else:
            got = gradients(kernel, args, dy, list(reads))
            for name, a in args.items():
                g = np.asarray(got[name])
                if isinstance(a, sparsec.Tensor):
                    coords = sparsec.as_tensor(a).coords()[0]
                    g, exp = g, want[name][tuple(coords)]
                else:
                    exp = want[name]
                np.testing.assert_allclose(g, exp, rtol=1e-9, atol=1e-9, err_msg=f"{ctx} d{name}")
    return DRAWS


def test_gradients_match_torch_autograd() -> None:
    assert sum(run_case(seed) for seed in range(FAST)) == FAST * DRAWS


@pytest.mark.slow
def test_gradients_match_torch_autograd_slow() -> None:
    assert sum(run_case(seed) for seed in range(1000, 1000 + SLOW)) == SLOW * DRAWS
