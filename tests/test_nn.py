"""sparsec.nn: SparseLinear against the dense masked nn.Linear (forward, backward, training,
state_dict), sparsify, and torch.compile(fullgraph=True) through the custom op."""

from __future__ import annotations

import copy
import importlib.util
import math

import pytest
import torch

import sparsec
import sparsec.nn
from sparsec.api.torch_op import Components, identity, torch_op
from sparsec.nn import SparseLinear, magnitude_mask, report, sparsify
from sparsec.nn import linear as linear_module
from sparsec.policy import calibrated, costs
from sparsec.policy.machine import use

HAS_GRADIENTS = importlib.util.find_spec("sparsec.api.gradient") is not None
needs_gradients = pytest.mark.skipif(
    not HAS_GRADIENTS, reason="sparsec.api.gradient (H1, issue 20 item 1) has not landed"
)


def pruned_linear(i, o, sparsity, dtype=torch.float64, bias=True, seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(i, o, bias=bias, dtype=dtype)
    with torch.no_grad():
        lin.weight.mul_(magnitude_mask(lin.weight, sparsity))
        if o > 2:
            lin.weight[1] = 0.0  # an empty row
    return lin


def integer_linear(i, o, sparsity, seed):
    """`pruned_linear` with small integer weights (at its pattern) and bias: sums exact in
    any order."""
    lin = pruned_linear(i, o, sparsity, seed=seed)
    with torch.no_grad():
        lin.weight.copy_(torch.randint(-3, 4, lin.weight.shape) * (lin.weight != 0))
        lin.bias.copy_(torch.randint(-3, 4, lin.bias.shape))
    return lin


def tol(dtype):
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}


# ---------------------------------------------------------------- from_linear


def test_from_linear_keeps_the_zeros():
    lin = pruned_linear(7, 6, 0.6)
    layer = SparseLinear.from_linear(lin)
    assert layer.nnz == int((lin.weight != 0).sum())
    assert torch.equal(layer.to_dense(), lin.weight.detach())
    assert layer.pos.dtype == layer.crd.dtype == torch.int32
    assert int(layer.pos[2] - layer.pos[1]) == 0  # the empty row stores nothing


@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.9, 0.97, 1.0])
def test_from_linear_prunes_to_the_sparsity_exactly(sparsity):
    torch.manual_seed(1)
    lin = torch.nn.Linear(13, 11)
    layer = SparseLinear.from_linear(lin, sparsity)
    n = 13 * 11
    assert layer.nnz == round((1 - sparsity) * n)  # the documented count (at 0.5: 72)
    kept = layer.to_dense().detach().abs()
    dropped = lin.weight.detach().abs()[kept == 0]
    if layer.nnz and dropped.numel():
        assert float(kept[kept > 0].min()) >= float(dropped.max())  # by magnitude


@pytest.mark.parametrize(("shape", "sparsity", "kept"), [((1, 5), 0.1, 4), ((11, 13), 0.5, 72)])
def test_from_linear_keeps_the_documented_count_at_a_tie(shape, sparsity, kept):
    """Issue 36 item 9: round((1 - s) * numel) entries, not numel - round(s * numel)
    (0.9 * 5 = 4.5 rounds to 4; 5 - round(0.5) kept 5)."""
    lin = torch.nn.Linear(shape[1], shape[0])
    assert SparseLinear.from_linear(lin, sparsity).nnz == kept
    assert int(magnitude_mask(lin.weight, sparsity).sum()) == kept


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: SparseLinear.from_linear(torch.nn.Conv1d(8, 8, 1)), "not a Conv1d"),
        (lambda: SparseLinear.from_linear(torch.nn.Linear(3, 3).weight), "magnitude_mask"),
        (lambda: sparsify(torch.nn.Linear(3, 3).weight, 0.9), "magnitude_mask"),
        (lambda: sparsify([torch.nn.Linear(3, 3)], 0.9), "not a list"),
    ],
)
def test_wrong_objects_get_a_sparsec_error(make, fragment):
    """Issue 36 item 16: a Conv1d or a weight tensor where a layer or model belongs is an
    InputError saying what to pass (was a raw ValueError / AttributeError)."""
    with pytest.raises(sparsec.InputError, match=fragment):
        make()


def test_bad_sparsity_and_activation_are_refused():
    lin = torch.nn.Linear(3, 2)
    with pytest.raises(sparsec.InputError, match="sparsity"):
        SparseLinear.from_linear(lin, 1.5)
    with pytest.raises(sparsec.InputError, match="activation"):
        SparseLinear.from_linear(lin, activation="gelu_fast")


# ---------------------------------------------------------------- forward


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("lead", [(5,), (2, 3), (2, 1, 4), ()])
@pytest.mark.parametrize("bias", [True, False])
def test_forward_equals_the_masked_linear(dtype, lead, bias):
    lin = pruned_linear(9, 8, 0.7, dtype, bias)
    layer = SparseLinear.from_linear(lin)
    x = torch.randn(*lead, 9, dtype=dtype)
    with torch.no_grad():
        got, want = layer(x), lin(x)
    assert got.shape == (*lead, 8)
    torch.testing.assert_close(got, want, **tol(dtype))


@pytest.mark.parametrize("activation", ["relu", "tanh", "sigmoid"])
def test_activation(activation):
    lin = pruned_linear(6, 5, 0.5)
    layer = SparseLinear.from_linear(lin, activation=activation)
    x = torch.randn(4, 6, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), getattr(torch, activation)(lin(x)))


def test_wrong_input_shape_and_dtype_are_refused():
    layer = SparseLinear.from_linear(pruned_linear(6, 5, 0.5))
    with pytest.raises(sparsec.ShapeError, match=r"\(\.\.\., 6\)"):
        layer(torch.randn(3, 5, dtype=torch.float64))
    with pytest.raises(sparsec.DTypeError, match="float32"):
        layer(torch.randn(3, 6, dtype=torch.float32))


def test_a_fully_pruned_layer_gives_the_bias():
    lin = pruned_linear(4, 3, 1.0)
    layer = SparseLinear.from_linear(lin)
    assert layer.nnz == 0
    x = torch.randn(2, 4, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), lin.bias.expand(2, 3))


# ---------------------------------------------------------------- state_dict


def test_state_dict_round_trip_adopts_the_pattern():
    trained = SparseLinear.from_linear(pruned_linear(8, 6, 0.7, seed=2))
    state = trained.state_dict()
    assert {"pos", "crd", "values", "bias"} <= set(state)
    fresh = SparseLinear.from_linear(pruned_linear(8, 6, 0.4, seed=3))  # another pattern
    fresh.load_state_dict(state)
    x = torch.randn(3, 8, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), trained(x))
    assert torch.equal(fresh.crd, trained.crd)


def test_a_mismatched_pattern_is_a_clear_error():
    layer = SparseLinear.from_linear(pruned_linear(8, 6, 0.7))
    other = SparseLinear.from_linear(pruned_linear(8, 5, 0.7)).state_dict()
    with pytest.raises(sparsec.StorageError, match="pos of length 7"):
        layer.load_state_dict(other)
    bad = layer.state_dict()
    bad["crd"] = bad["crd"].flip(0).contiguous()
    with pytest.raises(sparsec.StorageError, match="increase strictly"):
        layer.load_state_dict(bad)
    bad = layer.state_dict()
    bad["crd"] = bad["crd"] + 8
    with pytest.raises(sparsec.StorageError, match=r"in \[0, 8\)"):
        layer.load_state_dict(bad)


# ---------------------------------------------------------------- column blocks


def test_column_blocks_follow_the_l1_cache_and_divide_the_inputs():
    """A block of a packed panel's rows (128 columns) fills the L1 data cache; the divisor
    of the inputs nearest that within a factor of two, else one block."""
    with use(l1_data=48 << 10):
        assert costs.column_block(1536, 4) == 96  # 96 x 128 float32: 48 KB
        assert costs.column_block(1536, 8) == 48
        assert costs.column_block(1000, 4) == 100  # no divisor is 96: the nearest
        assert costs.column_block(997, 4) == 997  # a prime: one block
        assert costs.column_block(64, 4) == 64  # fits whole
        assert costs.block_tokens(384, 4) == 33  # 384 x 32 float32 fit in 48 KB
    with use(l1_data=32 << 10):
        assert costs.column_block(1536, 4) == 64


def test_a_layer_in_column_blocks_equals_the_masked_linear():
    """384 float64 inputs in blocks of 48 (the L1 of 48 KB), a row and a whole block empty,
    integer values: the output and the gradients exactly as dense torch's."""
    lin = integer_linear(384, 40, 0.5, seed=4)
    with torch.no_grad():
        lin.weight[:, 48:96] = 0.0  # block 1 stores nothing
    with use(l1_data=48 << 10):
        layer = SparseLinear.from_linear(lin)
    assert (layer.block, layer.block_tokens) == (48, 17)
    assert layer.kernel.generated().loop_order == ("o0", "b", "o1", "k", "t")
    for tokens in (1, 16, 17, 300):  # whole rows below 17 tokens, blocks from there
        x = torch.randint(-3, 4, (tokens, 384), dtype=torch.float64, requires_grad=True)
        twin = dense_twin(layer)
        x_ref = x.detach().clone().requires_grad_(True)
        y, y_ref = layer(x), twin(x_ref)
        torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
        dy = torch.randint(-2, 3, y.shape, dtype=torch.float64)
        layer.zero_grad()
        y.backward(dy)
        y_ref.backward(dy)
        torch.testing.assert_close(x.grad, x_ref.grad, rtol=0, atol=0)
        mask = layer.to_dense().detach() != 0
        torch.testing.assert_close(layer.values.grad, twin.weight.grad[mask], rtol=0, atol=0)
        torch.testing.assert_close(layer.bias.grad, twin.bias.grad, rtol=0, atol=0)


def test_kept_block_values_follow_optimizer_steps_and_give_exact_gradients():
    """The values in block order are kept between calls (`_block_values`), also for calls
    that record a gradient: two calls between steps share the copy, an optimizer's
    in-place step is followed at the next call, and every step's gradient is dense torch's
    (integer data, SGD steps of 1 keep the values integers)."""
    lin = integer_linear(384, 40, 0.5, seed=11)
    with use(l1_data=48 << 10):
        layer = SparseLinear.from_linear(lin)
    assert layer.block < 384
    opt = torch.optim.SGD(layer.parameters(), lr=1.0)
    x = torch.randint(-3, 4, (40, 384), dtype=torch.float64)
    for step in range(3):
        twin = dense_twin(layer)
        y, y_ref = layer(x), twin(x)
        kept = layer._gathered
        assert layer(x) is not None and layer._gathered is kept  # no second gather
        torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
        dy = torch.randint(-2, 3, y.shape, dtype=torch.float64)
        opt.zero_grad()
        y.backward(dy)
        y_ref.backward(dy)
        want = at_pattern(layer, twin.weight.grad)
        torch.testing.assert_close(layer.values.grad, want, rtol=0, atol=0)
        before = layer.values.detach().clone()
        opt.step()
        assert not torch.equal(layer.values.detach(), before), step


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_blocks_and_whole_rows_give_the_same_bits(dtype):
    """Both ways add each row's entries in rising i: the choice between them is speed."""
    with use(l1_data=48 << 10):
        layer = SparseLinear.from_linear(pruned_linear(768, 70, 0.6, dtype=dtype, seed=8))
    assert layer.block < 768
    xt = torch.randn(768, 200, dtype=dtype)
    with torch.no_grad():
        assert torch.equal(layer._run(xt, True), layer._run(xt, False))


@pytest.mark.parametrize("fastest", [linear_module.BLOCKS, linear_module.ROWS, linear_module.DENSE])
def test_the_way_of_a_call_as_measured_on_the_host(fastest, monkeypatch):
    """With host measurements on, the first call of a size class of tokens times each way
    three times in interleaved rounds (a fake clock here) and keeps the fastest; later calls
    of that class run it untimed. Each way gives dense torch's result."""
    monkeypatch.setattr(calibrated, "enabled", lambda: True)
    now = [0.0]
    monkeypatch.setattr(linear_module, "clock", lambda: now[0])
    runs: list[str] = []
    real = SparseLinear._forward_way

    def forward_way(self, x, way):
        runs.append(way)
        now[0] += 1.0 if way == fastest else 3.0
        return real(self, x, way)

    monkeypatch.setattr(SparseLinear, "_forward_way", forward_way)
    with use(l1_data=1 << 10):
        layer = SparseLinear.from_linear(pruned_linear(64, 8, 0.5, seed=9))
    x = torch.randn(40, 64, dtype=torch.float64)
    twin = dense_twin(layer)
    ways = ("blocks", "rows", "dense")
    assert layer.ways(40) == ways
    with torch.no_grad():
        torch.testing.assert_close(layer(x), twin(x))
        assert layer.ways_measured == {(40).bit_length(): fastest}
        assert runs == [*ways, *ways, *ways, fastest]
        assert layer.ways_spent[(40).bit_length()] == {
            w: 1.0 if w == fastest else 3.0 for w in ways
        }
        assert (layer._dense is None) == (fastest != "dense")  # kept only where chosen
        runs.clear()
        torch.testing.assert_close(layer(x[:33]), twin(x[:33]))  # the same class: 33..63
        assert runs == [fastest]
        assert layer.block_tokens == 3
        layer(x[:2])  # below block_tokens: whole rows or dense, measured for their class
        assert runs[-1] == ("dense" if fastest == "dense" else "rows")
        assert set(runs[1:-1]) == {"rows", "dense"}


def test_a_measured_way_that_is_no_longer_a_way_is_measured_again(monkeypatch):
    """A way measured for a size class that the layer no longer has (dense, measured before
    a sparser pattern was loaded) is not run: the class is measured again."""
    monkeypatch.setattr(calibrated, "enabled", lambda: True)
    with use(l1_data=1 << 10):
        layer = SparseLinear.from_linear(pruned_linear(64, 8, 0.9, seed=9))
    assert "dense" not in layer.ways(40)
    layer.ways_measured[(40).bit_length()] = "dense"
    x = torch.randn(40, 64, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), dense_twin(layer)(x))
    assert layer.ways_measured[(40).bit_length()] in layer.ways(40)
    assert set(layer.ways_spent[(40).bit_length()]) == set(layer.ways(40))


def test_a_layer_stored_below_a_quarter_never_runs_dense():
    """The dense copy is a candidate only where it costs at most twice the sparse
    storage (a quarter of W stored, `DENSE_MIN_DENSITY`), and for float32/float64 values."""
    with use(l1_data=1 << 10):
        sparse = SparseLinear.from_linear(pruned_linear(64, 8, 0.8, seed=9))
        half = SparseLinear.from_linear(pruned_linear(64, 8, 0.5, seed=9))
    assert "dense" not in sparse.ways(40) and half.ways(40)[-1] == "dense"
    assert "dense" not in half.to(torch.bfloat16).ways(40)


@pytest.mark.parametrize("way", ["blocks", "rows", "dense"])
def test_every_way_trains_exactly_across_optimizer_steps(way):
    """Each way's output and gradients (the values', the input's, the bias') are dense
    torch's on integer data, step after step: the kept copies (block order, dense) follow
    the optimizer's in-place steps."""
    lin = integer_linear(96, 12, 0.5, seed=12)
    with use(l1_data=1 << 10):
        layer = SparseLinear.from_linear(lin)
    opt = torch.optim.SGD(layer.parameters(), lr=1.0)
    for step in range(3):
        x = torch.randint(-3, 4, (40, 96), dtype=torch.float64, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_(True)
        twin = dense_twin(layer)
        y = layer._forward_way(x, way)
        y_ref = twin(x_ref)
        torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
        dy = torch.randint(-2, 3, y.shape, dtype=torch.float64)
        opt.zero_grad()
        y.backward(dy)
        y_ref.backward(dy)
        torch.testing.assert_close(x.grad, x_ref.grad, rtol=0, atol=0)
        want = at_pattern(layer, twin.weight.grad)
        torch.testing.assert_close(layer.values.grad, want, rtol=0, atol=0)
        torch.testing.assert_close(layer.bias.grad, twin.bias.grad, rtol=0, atol=0)
        with torch.no_grad():
            torch.testing.assert_close(layer._forward_way(x, way), y_ref, rtol=0, atol=0)
        before = layer.values.detach().clone()
        opt.step()
        assert not torch.equal(layer.values.detach(), before), step


def test_a_pattern_changed_in_place_or_loaded_is_followed_in_blocks():
    """The blocks are derived from pos/crd: a pattern changed in place through torch, or
    adopted from a state_dict, is the one the next call uses."""
    with use(l1_data=64):
        layer = SparseLinear.from_linear(pruned_linear(8, 6, 0.0, seed=5), 0.5)
        other = SparseLinear.from_linear(pruned_linear(8, 6, 0.0, seed=6), 0.5)
    layer.block_tokens = 1
    assert layer.block < 8
    x = torch.randn(5, 8, dtype=torch.float64)
    with torch.no_grad():
        layer(x)  # blocks derived
        layer.pos.copy_(other.pos)
        layer.crd.copy_(other.crd)
        layer.values.copy_(other.values)
        layer.bias.copy_(other.bias)
        torch.testing.assert_close(layer(x), other(x))
        again = SparseLinear.from_linear(pruned_linear(8, 6, 0.3, seed=7))
        layer.load_state_dict(again.state_dict())
        torch.testing.assert_close(layer(x), again(x))


# ---------------------------------------------------------------- sparsify


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.big = torch.nn.Linear(16, 32)
        self.small = torch.nn.Linear(32, 2)
        self.inner = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU())
        self.attn = torch.nn.MultiheadAttention(16, 2)

    def forward(self, x):
        return self.small(self.inner(self.big(x)).relu().repeat(1, 2))


def test_sparsify_swaps_only_eligible_layers():
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(5, 16)
    assert sparsify(model, 0.8, min_features=8) is model
    assert isinstance(model.big, SparseLinear) and isinstance(model.inner[0], SparseLinear)
    assert type(model.small) is torch.nn.Linear  # 2 < min_features
    assert not isinstance(model.attn.out_proj, SparseLinear)  # MHA reads its weight
    rows = {r.name: r for r in report(model)}
    assert set(rows) == {"big", "inner.0"}
    assert rows["big"].nnz == 16 * 32 - round(0.8 * 16 * 32)
    assert abs(rows["inner.0"].sparsity - 0.8) < 1e-3
    with torch.no_grad():
        assert model(x).shape == (5, 2)


# ---------------------------------------------------------------- the custom op


def test_one_op_per_kernel_identity():
    a = torch_op(sparsec.kernel("Yt(o,t) += W(o,i) * Xt(i,t)", {"W": "csr"}))
    b = torch_op(sparsec.kernel("Yt(o,t) += W(o,i) * Xt(i,t)", {"W": "csr"}))
    c = torch_op(sparsec.kernel("Yt(o,t) += W(o,i) * Xt(i,t)", {"W": "csc"}))
    assert a is b and a.name != c.name
    assert a.name == identity(a.kernel) and a.name.startswith("sparsec::k_")
    with pytest.raises(sparsec.InputError, match="sparse"):
        torch_op(sparsec.kernel("C(i,j) = A(i,j) * 2", {"A": "csr", "C": "csr"}))


def test_an_op_called_with_a_missing_or_unknown_input_says_which():
    """A missing input was a raw KeyError; an unknown one was ignored."""
    op = torch_op(sparsec.kernel("y(i) = W(i,j) * x(j)", {"W": "csr"}))
    w = sparsec.as_tensor(torch.eye(2, dtype=torch.float64).to_sparse_csr())
    w = Components(
        w.shape,
        tuple(
            (torch.from_numpy(p), torch.from_numpy(c)) if p is not None else (None, None)
            for p, c in ((lv.pos, lv.crd) for lv in w.levels)
        ),
        torch.from_numpy(w.vals),
    )
    with pytest.raises(sparsec.InputError, match="missing x"):
        op(W=w)
    with pytest.raises(sparsec.InputError, match="unexpected z"):
        op(W=w, x=torch.ones(2, dtype=torch.float64), z=torch.ones(2))


def test_an_eager_call_without_gradients_runs_the_ops_implementation(monkeypatch):
    """Eager calls that record no gradient skip torch's dispatch and run what the op would
    run; a call that records one, one under a dispatch mode, and a traced one, go through
    the op. Every way gives the same result."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from sparsec.api.torch_op import TorchOp

    torch.manual_seed(0)
    layer = SparseLinear.from_linear(torch.nn.Linear(12, 6, dtype=torch.float64), 0.5)
    x = torch.randn(5, 12, dtype=torch.float64)
    want = dense_twin(layer)(x).detach()
    dispatched: list[int] = []
    op = linear_module._OP
    assert isinstance(op, TorchOp) and layer.block == 12  # whole rows: this op
    inner = op.op

    def counted(*args):
        dispatched.append(1)
        return inner(*args)

    monkeypatch.setattr(op, "op", counted)

    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with torch.no_grad():
        torch.testing.assert_close(layer(x), want)
    assert dispatched == []
    torch.testing.assert_close(layer(x), want)  # the values require a gradient
    assert len(dispatched) == 1
    with torch.no_grad(), Passing():
        torch.testing.assert_close(layer(x), want)
    assert len(dispatched) == 2
    with torch.no_grad():
        traced = torch.jit.trace(layer, x, check_trace=False)
    assert len(dispatched) == 3
    torch.testing.assert_close(traced(x), want)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_fullgraph_has_no_graph_break(backend):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(12, 10), torch.nn.ReLU(), torch.nn.Linear(10, 6), torch.nn.Tanh()
    )
    sparsify(model, 0.6)
    x = torch.randn(2, 3, 12)
    explained = torch._dynamo.explain(model)(x)
    assert explained.graph_break_count == 0
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


def test_compile_inductor():
    torch.manual_seed(0)
    model = sparsify(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()), 0.5)
    x = torch.randn(4, 8)
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


# ---------------------------------------------------------------- training


def dense_twin(layer: SparseLinear) -> torch.nn.Linear:
    lin = torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
    lin = lin.to(layer.values.dtype)
    with torch.no_grad():
        lin.weight.copy_(layer.to_dense())
        if layer.bias is not None:
            lin.bias.copy_(layer.bias)
    return lin


def at_pattern(layer: SparseLinear, dense: torch.Tensor) -> torch.Tensor:
    rows = torch.repeat_interleave(torch.arange(layer.out_features), torch.diff(layer.pos.long()))
    return dense[rows, layer.crd.long()]


@needs_gradients
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_backward_equals_the_masked_linear(dtype):
    layer = SparseLinear.from_linear(pruned_linear(9, 7, 0.6, dtype))
    lin = dense_twin(layer)
    x = torch.randn(2, 3, 9, dtype=dtype, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    (layer(x) ** 2).sum().backward()
    (lin(x2) ** 2).sum().backward()
    torch.testing.assert_close(layer.values.grad, at_pattern(layer, lin.weight.grad), **tol(dtype))
    torch.testing.assert_close(layer.bias.grad, lin.bias.grad, **tol(dtype))
    torch.testing.assert_close(x.grad, x2.grad, **tol(dtype))


@needs_gradients
def test_training_follows_the_dense_masked_model():
    torch.manual_seed(5)
    layer = SparseLinear.from_linear(pruned_linear(10, 6, 0.7), activation="tanh")
    lin = dense_twin(layer)
    mask = layer.to_dense().detach() != 0
    opt_s = torch.optim.SGD(layer.parameters(), lr=0.5)
    opt_d = torch.optim.SGD(lin.parameters(), lr=0.5)
    x, target = torch.randn(16, 10, dtype=torch.float64), torch.randn(16, 6, dtype=torch.float64)
    losses = []
    for _ in range(20):
        for opt in (opt_s, opt_d):
            opt.zero_grad()
        loss_s = ((layer(x) - target) ** 2).mean()
        loss_d = ((torch.tanh(lin(x)) - target) ** 2).mean()
        loss_s.backward()
        loss_d.backward()
        lin.weight.grad *= mask  # the dense masked model: the pattern stays fixed
        opt_s.step()
        opt_d.step()
        torch.testing.assert_close(loss_s, loss_d)
        losses.append(float(loss_s.detach()))
    assert losses[-1] < 0.85 * losses[0]
    torch.testing.assert_close(layer.to_dense(), lin.weight * mask)
    torch.testing.assert_close(layer.bias, lin.bias)


class TinyBert(torch.nn.Module):
    """Two BERT layers, hidden 32, 4 heads, every projection an nn.Linear it calls."""

    def __init__(self, hidden=32, heads=4, inner=64, layers=2):
        super().__init__()
        self.heads = heads
        self.layers = torch.nn.ModuleList()
        for _ in range(layers):
            block = torch.nn.ModuleDict(
                {
                    "q": torch.nn.Linear(hidden, hidden),
                    "k": torch.nn.Linear(hidden, hidden),
                    "v": torch.nn.Linear(hidden, hidden),
                    "o": torch.nn.Linear(hidden, hidden),
                    "up": torch.nn.Linear(hidden, inner),
                    "down": torch.nn.Linear(inner, hidden),
                    "ln1": torch.nn.LayerNorm(hidden),
                    "ln2": torch.nn.LayerNorm(hidden),
                }
            )
            self.layers.append(block)

    def forward(self, h):
        b, s, d = h.shape
        size = d // self.heads
        for blk in self.layers:

            def split(x, b=b, s=s, size=size):
                return x.view(b, s, self.heads, size).transpose(1, 2)

            q, k, v = split(blk["q"](h)), split(blk["k"](h)), split(blk["v"](h))
            att = (q @ k.transpose(-1, -2) / math.sqrt(size)).softmax(-1) @ v
            h = blk["ln1"](blk["o"](att.transpose(1, 2).reshape(b, s, d)) + h)
            h = blk["ln2"](blk["down"](torch.nn.functional.gelu(blk["up"](h))) + h)
        return h.mean(1)


@needs_gradients
def test_tiny_bert_forward_and_backward_match_dense():
    torch.manual_seed(7)
    dense = TinyBert().double()
    for m in dense.modules():
        if isinstance(m, torch.nn.Linear):
            with torch.no_grad():
                m.weight.mul_(magnitude_mask(m.weight, 0.8))
    sparse = sparsify(copy.deepcopy(dense), None)
    assert len(report(sparse)) == 12
    h = torch.randn(2, 5, 32, dtype=torch.float64)
    out_s, out_d = sparse(h), dense(h)
    torch.testing.assert_close(out_s, out_d)
    out_s.square().sum().backward()
    out_d.square().sum().backward()
    pairs = zip(sparse.modules(), dense.modules(), strict=True)
    checked = 0
    for s, d in pairs:
        if isinstance(s, SparseLinear):
            torch.testing.assert_close(s.values.grad, at_pattern(s, d.weight.grad))
            torch.testing.assert_close(s.bias.grad, d.bias.grad)
            checked += 1
    assert checked == 12


@needs_gradients
def test_compiled_training_step_matches_eager():
    torch.manual_seed(3)
    model = sparsify(torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU()), 0.5)
    twin = copy.deepcopy(model)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(4, 8)
    compiled(x).sum().backward()
    twin(x).sum().backward()
    torch.testing.assert_close(model[0].values.grad, twin[0].values.grad)


@pytest.mark.parametrize(
    ("target", "fmt"),
    [("c", "csr"), ("c", "csc"), ("c", "coo"), ("cuda-emulated", "csr")],
)
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
def test_op_of_any_kernel_matches_dense(target, fmt, index):
    # the op of a plain SpMM, its sparse operand as the level arrays of its format
    kern = sparsec.kernel("C(i,j) = A(i,k) * B(k,j) + d(i)", {"A": fmt}, target=target)
    op = torch_op(kern)
    dense = torch.randn(6, 5, dtype=torch.float64)
    dense[dense.abs() < 0.8] = 0.0
    dense[2] = 0.0
    a = sparsec.Tensor.from_dense(dense.numpy(), fmt, index_dtype=str(index).split(".")[1])
    levels = tuple(
        tuple(None if arr is None else torch.from_numpy(arr.copy()) for arr in (st.pos, st.crd))
        for st in a.levels
    )
    vals = torch.from_numpy(a.vals.copy())
    b, d = torch.randn(5, 3, dtype=torch.float64), torch.randn(6, dtype=torch.float64)

    def call(vals, b, d):
        return op(A=Components(a.shape, levels, vals), B=b, d=d)

    want = dense @ b + d[:, None]
    torch.testing.assert_close(call(vals, b, d), want)
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(vals, b, d), want)
