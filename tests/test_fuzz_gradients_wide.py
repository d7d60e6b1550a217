"""Differential fuzz of gradients (the wide family; tests/test_fuzz_gradients.py is a
smaller one, written apart): random differentiable statements against torch autograd
on the dense statement, through both entry points (``Kernel.__call__`` with torch leaves,
then ``out.backward(dY)``; and `sparsec.api.gradient.gradients`).

The reference is written here from docs/semantics.md, not from sparsec's derivation: a
random tree (reads of 1-3 of i, j, k, l, scalar reads, literals, ``+ - *``, unary minus,
division by a non-zero literal, ``abs exp sin cos tanh sigmoid relu sign max min`` and
``pow(x, p)`` for a literal ``p`` in {0, 1, 2, 3}) is printed as index notation and
evaluated densely in torch with every summed index summed at the smallest subexpression
holding all its uses ("Reductions"), then differentiated by torch. That covers sums nested
at different depths, functions around sums, broadcasts (a read at fewer indices than the
output, a sum over a read that does not use its index), a tensor read twice, scalar
outputs and ``+=`` outputs (whose current value's gradient is dY).

Sparse inputs (csr, csc, dcsr, coo, csf; torch CSR/CSC/COO leaves on the autograd path,
``sparsec.Tensor`` on the other) hold explicit stored zeros; their gradient is torch's
dense gradient at the stored entries ("Gradients": the unstored entries are the constant
0). Data are small integers, so kinks (relu/abs/sign at 0, max/min ties) are hit exactly
and the documented torch conventions are asserted there; a draw where a kink's argument is
computed through a rounding function (exp, sin, ...) and lands within 1e-6 of it, or where
a value overflows, is redrawn. Refused constructs are not generated here; a separate test
checks that each documented one raises `NotDifferentiable` (any other exception fails).

CI runs 40 statements x 5 draws from a fixed seed; ``-m slow`` runs 600 x 6.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

import sparsec
from sparsec.api.gradient import gradients
from sparsec.frontend.derivative import NotDifferentiable
from sparsec.middle.order import OrderConflict

F64 = torch.float64
POOL = ("i", "j", "k", "l")
UNARY = ("abs", "exp", "sin", "cos", "tanh", "sigmoid", "relu", "sign")
#: functions whose value is computed exactly from exact (small dyadic) operands
EXACT = {"abs", "relu", "sign", "max", "min", "pow"}
KINKED = {"abs", "relu", "sign"}
#: input names (not O, o: the output's)
NAMES = "BCDEFGHKMNPQRSTUVWXZ"
SPARSE = {1: ("coo", "s"), 2: ("csr", "csc", "dcsr", "coo"), 3: ("coo", "csf")}


# ------------------------------------------------------------------- statements
# A node: ("read", name), ("lit", value), ("bin", op, a, b), ("div", a, c), ("neg", a),
# ("fn", name, a), ("fn2", name, a, b), ("pow", a, p); reads index through `Case.reads`.


@dataclass
class Case:
    text: str
    rhs: tuple
    lhs: tuple[str, ...]
    accumulate: bool
    #: each input's index tuple (the first read's; a second read of it permutes them)
    inputs: dict[str, tuple[str, ...]]
    #: each read's (name, indices), by the node's number
    reads: dict[int, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    #: variables whose extents must agree (a permuted second read)
    tied: list[tuple[str, str]] = field(default_factory=list)
    formats: dict[str, str] = field(default_factory=dict)


def random_case(r: random.Random, depth: int) -> Case:
    inputs: dict[str, tuple[str, ...]] = {}
    reads: dict[int, tuple[str, tuple[str, ...]]] = {}
    tied: list[tuple[str, str]] = []

    def read() -> tuple:
        roll = r.random()
        if inputs and roll < 0.15:
            # the same tensor again, maybe at permuted indices (tying their extents)
            name = r.choice(sorted(inputs))
            ix = list(inputs[name])
            if r.random() < 0.5:
                r.shuffle(ix)
                tied.extend(zip(inputs[name], ix, strict=True))
            found: tuple[str, tuple[str, ...]] = (name, tuple(ix))
        else:
            name = NAMES[len(inputs)]
            ix = () if roll > 0.95 else tuple(r.sample(POOL, r.randint(1, 3)))
            inputs[name] = ix
            found = (name, ix)
        reads[len(reads)] = found
        return ("read", len(reads) - 1)

    def leaf() -> tuple:
        if r.random() < 0.1:
            return ("lit", r.choice([2.0, 0.5, 3.0]))
        return read()

    def expr(level: int) -> tuple:
        if level == 0 or r.random() < 0.25:
            return leaf()
        roll = r.random()
        if roll < 0.5:
            return ("bin", r.choice("+-*"), expr(level - 1), expr(level - 1))
        if roll < 0.58:
            return ("div", expr(level - 1), r.choice([2.0, 0.5, 3.0]))
        if roll < 0.65:
            return ("neg", expr(level - 1))
        if roll < 0.85:
            return ("fn", r.choice(UNARY), expr(level - 1))
        if roll < 0.93:
            return ("fn2", r.choice(["max", "min"]), expr(level - 1), expr(level - 1))
        return ("pow", expr(level - 1), r.choice([0, 1, 2, 2, 3]))

    rhs = expr(depth)
    while not reads:
        rhs = ("bin", "+", rhs, read())
    used = sorted({v for _, ix in reads.values() for v in ix})
    lhs = tuple(r.sample(used, r.randint(0, min(3, len(used)))))
    accumulate = r.random() < 0.15
    out = ("O" if lhs else "o") + (f"({','.join(lhs)})" if lhs else "")
    case = Case("", rhs, lhs, accumulate, inputs, reads, tied)
    case.text = f"{out} {'+=' if accumulate else '='} {show(case, rhs)}"
    for name, ix in inputs.items():
        if ix and r.random() < 0.4:
            case.formats[name] = r.choice(SPARSE[len(ix)])
    return case


def _out(case: Case) -> str:
    """The output's name."""
    return case.text.split(" ", 1)[0].split("(")[0]


def show(case: Case, node: tuple) -> str:
    kind = node[0]
    if kind == "read":
        name, ix = case.reads[node[1]]
        return f"{name}({','.join(ix)})" if ix else name
    if kind == "lit":
        return repr(node[1])
    if kind == "bin":
        return f"({show(case, node[2])} {node[1]} {show(case, node[3])})"
    if kind == "div":
        return f"({show(case, node[1])} / {node[2]!r})"
    if kind == "neg":
        return f"-({show(case, node[1])})"
    if kind == "fn":
        return f"{node[1]}({show(case, node[2])})"
    if kind == "fn2":
        return f"{node[1]}({show(case, node[2])}, {show(case, node[3])})"
    return f"pow({show(case, node[1])}, {node[2]})"


# ------------------------------------------------------------- dense reference


class Unstable(Exception):
    """A draw whose kink argument is inexact and near 0, or whose values overflow."""


def _uses(case: Case, node: tuple, path: tuple[int, ...], out: dict[str, list]) -> None:
    if node[0] == "read":
        for v in case.reads[node[1]][1]:
            out.setdefault(v, []).append(path)
        return
    for n, child in enumerate(node[1:]):
        if isinstance(child, tuple):
            _uses(case, child, (*path, n), out)


def placements(case: Case) -> dict[tuple[int, ...], list[str]]:
    """Per node path, the variables summed there: the smallest subexpression holding every
    use of a variable the output lacks (the longest common prefix of its reads' paths)."""
    uses: dict[str, list] = {}
    _uses(case, case.rhs, (), uses)
    at: dict[tuple[int, ...], list[str]] = {}
    for v, paths in uses.items():
        if v in case.lhs:
            continue
        prefix = paths[0]
        for p in paths[1:]:
            n = 0
            while n < min(len(p), len(prefix)) and p[n] == prefix[n]:
                n += 1
            prefix = prefix[:n]
        at.setdefault(prefix, []).append(v)
    return at


def _align(t: torch.Tensor, have: tuple[str, ...], want: tuple[str, ...]) -> torch.Tensor:
    """``t`` over ``have`` as a broadcastable tensor over ``want`` (a superset)."""
    kept = [v for v in want if v in have]
    if len(kept) > 1:
        t = t.permute(*[have.index(v) for v in kept])
    return t.reshape([t.shape[kept.index(v)] if v in have else 1 for v in want])


def evaluate(case: Case, leaves: dict[str, torch.Tensor]) -> torch.Tensor:
    """The statement's value in the lhs's variable order (``+=`` adds the current value)."""
    summed = placements(case)

    def ev(node: tuple, path: tuple[int, ...]) -> tuple[torch.Tensor, tuple[str, ...], bool]:
        kind = node[0]
        if kind == "read":
            name, ix = case.reads[node[1]]
            # mode m of the tensor is indexed by ix[m], at this read as at any other
            t, vs, exact = leaves[name], ix, True
        elif kind == "lit":
            t, vs, exact = torch.tensor(node[1], dtype=F64), (), True
        elif kind in ("bin", "fn2"):
            a, va, ea = ev(node[2], (*path, 1))
            b, vb, eb = ev(node[3], (*path, 2))
            vs = tuple(sorted(set(va) | set(vb)))
            a, b, exact = _align(a, va, vs), _align(b, vb, vs), ea and eb
            if kind == "fn2":
                _kink(a - b, exact)
                t = torch.maximum(a, b) if node[1] == "max" else torch.minimum(a, b)
            else:
                t = a + b if node[1] == "+" else a - b if node[1] == "-" else a * b
        elif kind in ("div", "neg", "pow"):
            a, vs, exact = ev(node[1], (*path, 0))
            if kind == "div":
                t, exact = a / node[2], exact and node[2] != 3.0
            else:
                t = -a if kind == "neg" else torch.pow(a, node[2])
        else:
            a, vs, exact = ev(node[2], (*path, 1))
            if node[1] in KINKED:
                _kink(a, exact)
            t = getattr(torch, node[1])(a)
            exact = exact and node[1] in EXACT
        here = [v for v in summed.get(path, []) if v in vs]
        if here:
            t = t.sum([vs.index(v) for v in here])
            vs = tuple(v for v in vs if v not in here)
        return t, vs, exact

    t, vs, _ = ev(case.rhs, ())
    t = _align(t, vs, case.lhs)
    if case.accumulate:
        t = t + leaves[_out(case)]
    _bounded(t)
    return t


def _bounded(t: torch.Tensor) -> None:
    a = t.detach().numpy()
    if not np.isfinite(a).all() or np.abs(a).max(initial=0.0) > 1e9:
        raise Unstable


def _kink(x: torch.Tensor, exact: bool) -> None:
    if not exact and bool((x.abs() < 1e-6).any()):
        raise Unstable


# ------------------------------------------------------------------------ data


@dataclass
class Draw:
    extents: dict[str, int]
    #: each input's dense value (unstored entries 0)
    dense: dict[str, np.ndarray]
    #: a sparse input's stored coordinates (order, nnz), row-major
    stored: dict[str, np.ndarray]
    dy: np.ndarray


def draw(case: Case, rng: np.random.Generator) -> Draw:
    extents = {v: int(rng.integers(1, 4)) for v in POOL}
    for _ in case.tied:
        for a, b in case.tied:
            extents[a] = extents[b] = min(extents[a], extents[b])
    dense, stored = {}, {}
    for name, ix in case.inputs.items():
        shape = tuple(extents[v] for v in ix)
        values = rng.integers(-2, 3, shape).astype(np.float64)
        if name in case.formats:
            # stored entries hold 0 a fifth of the time: explicit zeros
            keep = rng.random(shape) < rng.choice([0.0, 0.3, 0.6, 1.0])
            stored[name] = np.array(np.nonzero(keep), dtype=np.int64).reshape(len(ix), -1)
            values = values * keep
        dense[name] = values
    out_shape = tuple(extents[v] for v in case.lhs)
    if case.accumulate:
        dense[_out(case)] = rng.integers(-2, 3, out_shape).astype(np.float64)
    return Draw(extents, dense, stored, rng.integers(-2, 3, out_shape).astype(np.float64))


def reference(case: Case, d: Draw) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The value and every input's dense gradient (torch autograd on the dense statement)."""
    leaves = {n: torch.tensor(v, dtype=F64, requires_grad=True) for n, v in d.dense.items()}
    out = evaluate(case, leaves)
    out.backward(torch.tensor(d.dy, dtype=F64))
    grads = {}
    for n, leaf in leaves.items():
        g = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        _bounded(g)
        grads[n] = g.numpy()
    return out.detach().numpy(), grads


def _torch_input(case: Case, d: Draw, name: str) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """(the argument, the leaf whose gradient is read, the leaf's entries as coordinates):
    a dense leaf, or a torch CSR/CSC/COO tensor built from a values leaf."""
    values = d.dense[name]
    fmt = case.formats.get(name)
    if fmt is None:
        leaf = torch.tensor(values, dtype=F64, requires_grad=True)
        return leaf, leaf, np.zeros((0, 0), np.int64)
    coords = d.stored[name]
    if fmt == "csc":
        coords = coords[:, np.lexsort((coords[0], coords[1]))]
    leaf = torch.tensor(values[tuple(coords)], dtype=F64, requires_grad=True)
    shape = values.shape
    if fmt in ("csr", "csc"):
        outer, inner = (coords[0], coords[1]) if fmt == "csr" else (coords[1], coords[0])
        n = shape[0] if fmt == "csr" else shape[1]
        ptr = torch.tensor(np.searchsorted(outer, np.arange(n + 1)), dtype=torch.int64)
        build = torch.sparse_csr_tensor if fmt == "csr" else torch.sparse_csc_tensor
        arg = build(ptr, torch.tensor(inner), leaf, shape, dtype=F64)
    else:
        arg = torch.sparse_coo_tensor(torch.tensor(coords), leaf, shape, is_coalesced=True)
    return arg, leaf, coords


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * scale, err_msg=what)


def check(case: Case, kernel: object, d: Draw) -> None:
    """Both entry points against the reference, for one draw (`Unstable` if it is one)."""
    value, grads = reference(case, d)
    out_name = _out(case)
    names = list(case.inputs) + ([out_name] if case.accumulate else [])
    where = f"{case.text} formats={case.formats} extents={d.extents}"
    # torch autograd
    args, leaves = {}, {}
    for n in names:
        args[n], leaf, coords = _torch_input(case, d, n)
        leaves[n] = (leaf, coords)
    out = kernel(**args)  # type: ignore[operator]
    _close(out.detach().numpy(), value, f"value of {where}")
    out.backward(torch.tensor(d.dy, dtype=F64))
    for n, (leaf, coords) in leaves.items():
        assert leaf.grad is not None, f"no gradient for {n}: {where}"
        want = grads[n][tuple(coords)] if n in case.formats else grads[n]
        _close(leaf.grad.numpy(), want, f"autograd d{n} of {where}")
    # sparsec.api.gradient.gradients with numpy and sparsec.Tensor inputs
    plain: dict[str, object] = {}
    for n in names:
        if n in case.formats:
            stored = d.stored[n]
            values = d.dense[n][tuple(stored)]
            plain[n] = sparsec.Tensor.from_coo(stored, values, d.dense[n].shape, case.formats[n])
        else:
            plain[n] = d.dense[n]
    got = gradients(kernel, plain, d.dy, names)
    for n in names:
        if n in case.formats:
            t = plain[n]
            assert isinstance(t, sparsec.Tensor)
            want = grads[n][tuple(t.coords()[0])]
        else:
            want = grads[n]
        _close(np.asarray(got[n]), want, f"gradients d{n} of {where}")


def run_statement(seed: int, draws: int) -> int:
    """Checks ``draws`` data draws of statement ``seed``; the number of compared draws."""
    r = random.Random(seed)
    case = random_case(r, r.choice([2, 2, 3, 3]))
    kernel = sparsec.kernel(case.text, dict(case.formats))
    rng = np.random.default_rng(seed)
    compared = 0
    for _ in range(draws):
        for _attempt in range(4):
            try:
                check(case, kernel, draw(case, rng))
            except Unstable:
                continue
            compared += 1
            break
    return compared


@pytest.fixture(autouse=True)
def _quick_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Values, not speed, are tested: -O0 compiles the many small kernels ~10x faster."""
    monkeypatch.setenv("SPARSEC_CFLAGS", "-O0 -fopenmp")


def parsed(text: str, formats: dict[str, str]) -> Case:
    """A `Case` for a written statement in the generator's grammar (fully parenthesised)."""
    lhs_text, op, rhs_text = text.partition(" += " if " += " in text else " = ")
    lhs = tuple(v for v in lhs_text[lhs_text.find("(") + 1 : -1].split(",") if v)
    case = Case(text, (), lhs, op.strip() == "+=", {}, formats=dict(formats))
    tokens = rhs_text.replace("(", " ( ").replace(")", " ) ").replace(",", " , ").split()

    def atom(at: int) -> tuple[tuple, int]:
        tok = tokens[at]
        if tok == "-":
            inner, at = atom(at + 1)
            return ("neg", inner), at
        if tok == "(":
            left, at = atom(at + 1)
            if tokens[at] == ")":
                return left, at + 1
            op, (right, at) = tokens[at], atom(at + 1)
            node = ("div", left, right[1]) if op == "/" else ("bin", op, left, right)
            return node, at + 1
        if tok in UNARY or tok in ("max", "min", "pow"):
            a, at = atom(at + 2)
            if tok in UNARY:
                return ("fn", tok, a), at + 1
            b, at = atom(at + 1)
            return (("pow", a, int(b[1])) if tok == "pow" else ("fn2", tok, a, b)), at + 1
        if tok[0].isdigit():
            return ("lit", float(tok)), at + 1
        ix: tuple[str, ...] = ()
        if at + 1 < len(tokens) and tokens[at + 1] == "(":
            end = tokens.index(")", at)
            ix, at = tuple(t for t in tokens[at + 2 : end] if t != ","), end
        case.inputs.setdefault(tok, ix)
        case.tied.extend(zip(case.inputs[tok], ix, strict=True))
        case.reads[len(case.reads)] = (tok, ix)
        return ("read", len(case.reads) - 1), at + 1

    case.rhs = atom(0)[0]
    return case


#: the shapes the brief names, written out (each also arises at random)
WRITTEN = (
    ("a = ((B(k) + D(k,i)) + C(i))", {}),  # B summed over i: dB = n_i
    ("a = ((B(k) + D(k,i)) + C(i))", {"D": "csr", "B": "s"}),
    ("A(i) = (B(i,j,k) - (C(j) + D(k)))", {"B": "csf"}),
    ("y(j) = ((relu(B(j,i)) * c(j)) + D(j,i))", {"B": "csr"}),
    ("y(i) = relu((A(i,k) * x(k)))", {"A": "coo"}),
    ("C(i,j) = (A(k,i) * A(k,j))", {"A": "csc"}),
    ("y(i) += (max(A(i,j), B(i,j)) * sign(x(j)))", {"A": "dcsr"}),
    ("a = exp((B(i,j) * B(j,i)))", {"B": "csr"}),
    ("y(i) = (B(i,j) * (C(j,k) * x(k)))", {"B": "csr", "C": "csr"}),
)


@pytest.mark.parametrize("n", range(len(WRITTEN)))
def test_written_gradients_match_torch(n: int) -> None:
    text, formats = WRITTEN[n]
    case = parsed(text, formats)
    kernel = sparsec.kernel(case.text, dict(case.formats))
    rng = np.random.default_rng(n)
    for _ in range(5):
        check(case, kernel, draw(case, rng))


@pytest.mark.parametrize("seed", range(40))
def test_gradients_match_torch(seed: int) -> None:
    assert run_statement(seed, 5) >= 1


#: seeds whose statement meets an open bug, each held by a strict xfail (it flips when fixed)
OPEN = {
    173: "a masked CSF gradient is an OrderConflict, not a re-layout: "
    "test_gradient_regressions.py::test_a_masked_csf_gradient_with_sums_in_functions_compiles",
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "seed",
    [
        pytest.param(s, marks=pytest.mark.xfail(strict=True, raises=OrderConflict, reason=OPEN[s]))
        if s in OPEN
        else s
        for s in range(40, 640)
    ],
)
def test_gradients_match_torch_slow(seed: int) -> None:
    assert run_statement(seed, 6) >= 1


#: what docs/semantics.md "Gradients" refuses, for input A (J another input)
REFUSED = (
    "(A(i) / J(i))",
    "(2.0 / A(i))",
    "sqrt(A(i))",
    "log(A(i))",
    "pow(A(i), J(i))",
    "pow(A(i), 0.5)",
    "A(i,i)",
)


@pytest.mark.parametrize("refused", REFUSED)
@pytest.mark.parametrize("seed", range(3))
def test_refused_gradients_raise_not_differentiable(refused: str, seed: int) -> None:
    """A refused construct inside a random statement: the forward runs, and A's gradient
    raises `NotDifferentiable` on both paths (any other exception fails)."""
    r = random.Random(1000 + seed)
    case = random_case(r, 2)
    case.accumulate = False
    lhs = f"O({','.join(case.lhs)})" if case.lhs else "o"
    text = f"{lhs} = {show(case, case.rhs)} + {refused}"
    kernel = sparsec.kernel(text, dict(case.formats))
    d = draw(case, np.random.default_rng(seed))
    n = d.extents["i"]
    extra = {"A": np.arange(1.0, n * n + 1).reshape(n, n) if "i,i" in refused else np.ones(n) * 2}
    extra["J"] = np.full(n, 3.0)
    plain = {**{k: d.dense[k] for k in case.inputs}, **{k: extra[k] for k in extra if k in text}}
    with pytest.raises(NotDifferentiable, match="A"):
        gradients(kernel, plain, d.dy, ["A"])
    args = {k: torch.tensor(v, dtype=F64) for k, v in plain.items()}
    args["A"].requires_grad_()
    out = kernel(**args)
    with pytest.raises(NotDifferentiable, match="A"):
        out.backward(torch.tensor(d.dy, dtype=F64))
