"""torch.compile(model, backend="luminal"): whole models against eager, dynamic shapes compiled once, ops luminal
lacks running in torch (explain lists them), fallback=False raising, dtype changes recompiling.

Tiny configs, float32 on the CPU; every comparison is with torch eager on the same random weights and inputs."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import luminal as lm
import luminal.torch as lt
from luminal import torch_backend

transformers = pytest.importorskip("transformers")

ATOL, RTOL = 1e-4, 1e-4


@pytest.fixture(autouse=True)
def fresh(seed):
    torch._dynamo.reset()
    lt.COUNTERS.clear()
    torch_backend._WARNED.clear()
    torch.manual_seed(seed)
    yield
    torch._dynamo.reset()


def compiled(model, *inputs, **kw):
    """(eager result, luminal result) without grad."""
    with torch.no_grad():
        want = model(*inputs)
        got = torch.compile(model, backend="luminal", **kw)(*inputs)
    return want, got


def assert_close(got, want, atol=ATOL, rtol=RTOL):
    got, want = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol)


def compiled_whole(model, *inputs):
    """compiled() that also checks every aten node ran in luminal (explain's report, from the same compile)."""
    report = lt.Explanation()
    with torch.no_grad():
        want = model(*inputs)
        got = torch.compile(model, backend=lambda gm, ex: torch_backend._backend(gm, ex, None, report))(*inputs)
    assert report.graphs >= 1 and report.nodes > 0
    assert not report.fallbacks, str(report)
    return want, got


# ---- registration -------------------------------------------------------------------------------------------------
def test_registered_under_its_name():
    """The entry point registers the backend for torch.compile(backend="luminal") without importing luminal."""
    from torch._dynamo.backends.registry import lookup_backend

    assert "luminal" in torch._dynamo.list_backends()
    assert lookup_backend("luminal") is lt.backend


def test_unknown_option_raises():
    m = nn.Linear(4, 2)
    with pytest.raises(Exception, match="unknown option"):
        compiled(m, torch.randn(3, 4), options={"fusion": True})


# ---- models -------------------------------------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8), nn.Softmax(-1))
        self.register_buffer("offset", torch.arange(8))  # int64: luminal holds an int32 copy

    def forward(self, x):
        return self.net(x) + self.offset


def test_mlp_and_weights_changed_between_calls():
    m, x = MLP().eval(), torch.randn(5, 16)
    f = torch.compile(m, backend="luminal")
    with torch.no_grad():
        assert_close(f(x), m(x))
        assert_close(f(x * 3), m(x * 3))  # new data, same graph
        m.net[0].weight.mul_(-2)  # changed in place
        m.net[3].weight.data = torch.randn(8, 32)  # new storage under the same parameter
        m.offset.add_(5)  # the int32 copy must be made again
        assert_close(f(x), m(x))
    assert lt.COUNTERS["graphs"] == 1 and lt.COUNTERS["luminal_graphs"] == 1


def test_inference_mode_inputs():
    """Tensors made under torch.inference_mode keep no version counter: each call sets them again, so an input
    changed in place between calls is seen."""
    m = MLP().eval()
    f = torch.compile(m, backend="luminal")
    with torch.inference_mode():
        x = torch.randn(5, 16)
        assert_close(f(x), m(x))
        x.mul_(-3)
        assert_close(f(x), m(x))


def conv_net():
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(8, 8, 3, stride=2, groups=2, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))
    with torch.no_grad():
        for bn in (m[1], m[5]):  # running statistics away from (0, 1), so a wrong one shows
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    return m.eval()


def test_conv_net():
    m, x = conv_net(), torch.randn(2, 3, 16, 16)
    want, got = compiled_whole(m, x)
    assert_close(got, want)


def tiny(cls_name: str, config_name: str, **cfg):
    cfg = dict(vocab_size=97, **cfg)
    return getattr(transformers, cls_name)(getattr(transformers, config_name)(**cfg)).eval()


def bert():
    return tiny("BertModel", "BertConfig", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=64, max_position_embeddings=64)


def gpt2():
    return tiny("GPT2Model", "GPT2Config", n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=0,
                eos_token_id=0)


def llama():
    return tiny("LlamaModel", "LlamaConfig", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)


@pytest.mark.parametrize("make", [bert, gpt2, llama], ids=["bert", "gpt2", "llama"])
def test_transformers_model(make):
    m = make()
    ids = torch.randint(0, 97, (2, 11))
    want, got = compiled_whole(m, ids)
    assert_close(got.last_hidden_state, want.last_hidden_state)


def test_bert_attention_mask():
    m = bert()
    ids = torch.randint(0, 97, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0  # a padded row
    with torch.no_grad():
        want = m(ids, attention_mask=mask).last_hidden_state
        got = torch.compile(m, backend="luminal")(ids, attention_mask=mask).last_hidden_state
    assert_close(got, want)


@pytest.mark.parametrize("case", ["plain", "causal", "bool_mask", "float_mask", "gqa"])
def test_attention_kept_whole(case):
    """SDPA is not decomposed: luminal's attention (fused on the CPU) runs it, fully masked rows giving zeros."""
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 9, 8), torch.randn(2, 4, 9, 8)
    bool_mask = torch.rand(6, 9) > 0.4
    bool_mask[2] = False  # a row that attends nothing
    float_mask = torch.randn(2, 1, 6, 9)
    float_mask[0, 0, 3] = float("-inf")
    kw = {"plain": {}, "causal": {"is_causal": True}, "bool_mask": {"attn_mask": bool_mask},
          "float_mask": {"attn_mask": float_mask}, "gqa": {"enable_gqa": True}}[case]
    if case == "causal":
        k, v = k[:, :, :6], v[:, :, :6]
    if case == "gqa":
        k, v = k[:, :2], v[:, :2]
    want, got = compiled_whole(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw), q, k, v)
    assert_close(got, want)


# ---- dynamic shapes -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [bert, llama], ids=["bert", "llama"])
def test_dynamic_lengths_compile_once(make):
    """dynamic=True: sequence length and batch are luminal symbolic dims, so one compiled graph serves them all."""
    m = make()
    f = torch.compile(m, backend="luminal", dynamic=True)
    with torch.no_grad():
        for batch, length in ((2, 5), (2, 9), (3, 16)):
            ids = torch.randint(0, 97, (batch, length))
            assert_close(f(ids).last_hidden_state, m(ids).last_hidden_state)
    assert lt.COUNTERS["graphs"] == 1, lt.COUNTERS
    assert lt.COUNTERS["luminal_graphs"] == 1, lt.COUNTERS


def test_mark_dynamic():
    m = nn.Sequential(nn.Linear(8, 16), nn.SiLU(), nn.Linear(16, 8)).eval()
    f = torch.compile(m, backend="luminal")
    with torch.no_grad():
        for n in (4, 7, 13):
            x = torch.randn(n, 8)
            torch._dynamo.mark_dynamic(x, 0)
            assert_close(f(x), m(x))
    assert lt.COUNTERS["graphs"] == 1 and lt.COUNTERS["luminal_graphs"] == 1


# ---- what luminal lacks -------------------------------------------------------------------------------------------
class WithUnsupported(nn.Module):
    """lgamma (no luminal translation) between two linears, and an FFT (complex tensors, which luminal lacks)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        h = torch.lgamma(self.a(x).relu() + 1) * 2
        return self.b(h).softmax(-1), torch.fft.rfft(h, dim=-1).abs().sum(-1)


def test_unsupported_ops_run_in_torch():
    m, x = WithUnsupported().eval(), torch.randn(3, 8)
    report = lt.explain(m, x)
    ops = report.ops
    assert ops["aten.lgamma.default"] == "no luminal translation"
    assert ops["aten._fft_r2c.default"] == "no luminal translation"
    assert "complex64" in ops["aten.abs.default"]
    assert 0 < report.fallback_share < 0.5
    assert "aten.lgamma.default" in str(report)

    torch._dynamo.reset()
    lt.COUNTERS.clear()
    with pytest.warns(UserWarning, match="lgamma") as caught:
        want, got = compiled(m, x)
    assert len([w for w in caught if "luminal" in str(w.message)]) == 1
    assert_close(got, want)
    assert lt.COUNTERS["luminal_graphs"] == 2  # the linear before lgamma, and the rest after it

    torch._dynamo.reset()  # compiled again: the warning named these ops once already
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_close(*reversed(compiled(m, x)))


def test_fallback_false_raises():
    m, x = WithUnsupported().eval(), torch.randn(3, 8)
    with pytest.raises(lm.UnsupportedOpError, match=r"aten\.lgamma\.default"):
        compiled(m, x, options={"fallback": False})


def test_float64_runs_in_torch():
    """luminal has no float64: such a graph runs in torch, in float64."""
    f = torch.compile(lambda x: F.gelu(x * 2) + 1, backend="luminal")
    x = torch.randn(3, 8, dtype=torch.float64)
    with pytest.warns(UserWarning, match="float64"):
        got = f(x)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, F.gelu(x * 2) + 1, atol=0, rtol=0)


# ---- dtypes, grad ------------------------------------------------------------------------------------------------
def test_dtype_change_recompiles():
    """Dynamo guards on dtype: each dtype gets its own graph, computed in that dtype."""
    def fn(x, y):
        return F.gelu(x * 2) + y.softmax(-1)

    f = torch.compile(fn, backend="luminal")
    for i, (dtype, tol) in enumerate([(torch.float32, 1e-5), (torch.float16, 4e-3), (torch.bfloat16, 3e-2),
                                      (torch.float32, 1e-5)]):
        x, y = torch.randn(3, 8).to(dtype), torch.randn(3, 8).to(dtype)
        got, want = f(x, y), fn(x.float(), y.float())
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)
    assert lt.COUNTERS["graphs"] == 3  # float32 compiled once, reused at the end


def test_integer_outputs_and_inputs():
    """int64 travels as int32 inside luminal and comes back as int64."""
    def fn(ids, x):
        return (ids * 3 + 1) // 2, x.argmax(-1), (x > 0).sum(-1), torch.arange(ids.shape[-1]) + ids

    ids, x = torch.randint(-50, 50, (2, 6)), torch.randn(2, 6)
    want, got = fn(ids, x), torch.compile(fn, backend="luminal")(ids, x)
    assert_close(got, want, atol=0, rtol=0)


def test_backward_runs_in_torch():
    """With grad enabled the forward runs in luminal and the backward in torch: gradients match eager."""
    m = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    x = torch.randn(4, 8)
    torch.compile(m, backend="luminal")(x).sum().backward()
    got = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m(x).sum().backward()
    for g, p in zip(got, m.parameters()):
        torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-4)


def test_input_dtype_checked_when_called_directly():
    """A LuminalGraph called with another dtype than it was compiled for raises, rather than reading garbage."""
    gm = torch.fx.symbolic_trace(lambda x: (x * 2,))
    seen = {}

    def grab(g, example_inputs):
        seen["graph"] = torch_backend.LuminalGraph(g)
        return seen["graph"]

    from torch._functorch.aot_autograd import aot_module_simplified

    with torch.no_grad():
        aot_module_simplified(gm, [torch.randn(3)], fw_compiler=grab)(torch.randn(3))
    with pytest.raises(TypeError, match="float32"):
        seen["graph"](torch.randn(3, dtype=torch.float16))
