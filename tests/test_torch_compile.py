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
    """bessel_j0 (no luminal translation) between two linears, and an FFT (complex tensors, which luminal lacks)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        h = torch.special.bessel_j0(self.a(x).relu() + 1) * 2
        return self.b(h).softmax(-1), torch.fft.rfft(h, dim=-1).abs().sum(-1)


def test_unsupported_ops_run_in_torch():
    m, x = WithUnsupported().eval(), torch.randn(3, 8)
    report = lt.explain(m, x)
    ops = report.ops
    assert ops["aten.special_bessel_j0.default"] == "no luminal translation"
    assert ops["aten._fft_r2c.default"] == "no luminal translation"
    assert "complex64" in ops["aten.abs.default"]
    assert 0 < report.fallback_share < 0.5
    assert "aten.special_bessel_j0.default" in str(report)
    assert "test_torch_compile.py" in str(report)  # where in the model: the source line

    torch._dynamo.reset()
    lt.COUNTERS.clear()
    with pytest.warns(UserWarning, match="bessel_j0") as caught:
        want, got = compiled(m, x)
    assert len([w for w in caught if "luminal" in str(w.message)]) == 1
    assert_close(got, want)
    assert lt.COUNTERS["luminal_graphs"] == 2  # the linear before bessel_j0, and the rest after it

    torch._dynamo.reset()  # compiled again: the warning named these ops once already
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_close(*reversed(compiled(m, x)))


def test_fallback_false_raises():
    m, x = WithUnsupported().eval(), torch.randn(3, 8)
    with pytest.raises(lm.UnsupportedOpError, match=r"aten\.special_bessel_j0\.default"):
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


def test_infinite_causal_mask():
    """A causal mask made as torch.full(-inf).triu(1) (the masked entries -inf, the rest 0, not nan). AOT's
    decompositions make the triangle a where; luminal's own triu (the flash kernels' causal log-sum-exp) is
    test_gpu_attention_kernels_translate[flash]."""
    def fn(x):
        mask = torch.full((x.shape[-1], x.shape[-1]), float("-inf")).triu(1)
        return (x + mask).softmax(-1), mask.tril(-1)

    x = torch.randn(2, 5, 5)
    want, got = compiled_whole(fn, x)
    assert_close(got, want, atol=1e-6, rtol=1e-5)


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


def _direct_graph():
    """The LuminalGraph of `x * 2` for a float32 CPU x of 3 elements, to call directly (not through dynamo)."""
    from torch._functorch.aot_autograd import aot_module_simplified

    gm = torch.fx.symbolic_trace(lambda x: (x * 2,))
    seen = {}

    def grab(g, example_inputs):
        seen["graph"] = torch_backend.LuminalGraph(g)
        return seen["graph"]

    with torch.no_grad():
        aot_module_simplified(gm, [torch.randn(3)], fw_compiler=grab)(torch.randn(3))
    return seen["graph"]


def test_input_dtype_checked_when_called_directly():
    """A LuminalGraph called with another dtype than it was compiled for raises, rather than reading garbage."""
    with pytest.raises(TypeError, match="float32"):
        _direct_graph()(torch.randn(3, dtype=torch.float16))


# ---- explain keeps the caller's compiled functions ---------------------------------------------------------------
def test_explain_keeps_other_caches():
    """explain compiles in its own recompile region: the caller's compiled model is not recompiled after it, and
    explain called more times than dynamo's recompile limit still compiles (and reports) every time."""
    m, x = MLP().eval(), torch.randn(5, 16)
    f = torch.compile(m, backend="luminal")
    with torch.no_grad():
        want = f(x)
    assert lt.COUNTERS["graphs"] == 1
    with torch._dynamo.config.patch(recompile_limit=2):
        for _ in range(4):
            report = lt.explain(m, x)
            assert report.graphs == 1 and report.nodes > 0 and not report.fallbacks, str(report)
            assert_close(report.result, want)
    assert lt.explain(f, x).graphs == 1  # a compiled module: what it wraps is explained
    graphs = lt.COUNTERS["graphs"]
    with torch.no_grad():
        assert_close(f(x), want)
    assert lt.COUNTERS["graphs"] == graphs  # the caller's graph still cached


def test_explain_lets_go_of_its_graphs(monkeypatch):
    """The luminal graphs explain compiled are freed once it returns (dynamo keeps only a stub)."""
    import gc
    import weakref

    made, real = [], torch_backend._compile_fx

    def spy(*args, **kwargs):
        fn = real(*args, **kwargs)
        made.append(weakref.ref(fn))
        return fn

    monkeypatch.setattr(torch_backend, "_compile_fx", spy)
    lt.explain(MLP().eval(), torch.randn(5, 16))
    gc.collect()
    assert made and all(r() is None for r in made)


# ---- a static KV cache's update: index_put with whole dims before the index --------------------------------------
def test_index_put_after_whole_dims():
    def fn(cache, pos, k, rows, cols, v):
        c = cache.clone()
        c[:, :, pos] = k  # [None, None, pos]
        d = cache.clone()
        d[rows, :, cols] = v  # indexed dims apart: the indexed shape first
        return c, d, torch.ops.aten.index_put(cache, [None, rows.repeat(2)], v, True)  # duplicates accumulate

    cache = torch.randn(2, 3, 8, 4)
    args = (cache, torch.tensor([1, 5]), torch.randn(2, 3, 2, 4), torch.tensor([0, 1]), torch.tensor([3, 3]),
            torch.randn(4))
    want, got = compiled_whole(fn, *args)
    assert_close(got, want)


# ---- devices ------------------------------------------------------------------------------------------------------
def test_device_change_recompiles():
    """Dynamo guards on the device: a call on another device compiles again. luminal runs CPU and CUDA tensors; a
    graph on any other device (meta here) runs in torch, with a warning naming it, and the CPU graph is reused."""
    def fn(x):
        return F.gelu(x) * 2

    f = torch.compile(fn, backend="luminal")
    x = torch.randn(3, 8)
    assert_close(f(x), fn(x))
    with pytest.warns(UserWarning, match="a tensor on meta"):
        y = f(torch.randn(3, 8, device="meta"))
    assert y.device.type == "meta" and y.shape == (3, 8)
    assert_close(f(x), fn(x))
    assert lt.COUNTERS["graphs"] == 2 and lt.COUNTERS["luminal_graphs"] == 1


def test_input_device_checked_when_called_directly():
    with pytest.raises(TypeError, match="on cpu, called with torch.float32 on meta"):
        _direct_graph()(torch.empty(3, device="meta"))


# ---- CUDA -------------------------------------------------------------------------------------------------------
def gpu_attention_graph(kernel: str, q, k, v, bias):
    """A hand-built aten graph calling one of torch's GPU attention kernels (traced with fake tensors: no GPU
    needed), returning its output and log-sum-exp."""
    from torch.fx.experimental.proxy_tensor import make_fx

    a = torch.ops.aten
    fns = {
        "flash": lambda q, k, v, b: a._scaled_dot_product_flash_attention.default(q, k, v, 0.0, True, scale=0.3)[:2],
        "efficient": lambda q, k, v, b: a._scaled_dot_product_efficient_attention.default(q, k, v, b, True)[:2],
        "cudnn": lambda q, k, v, b: a._scaled_dot_product_cudnn_attention.default(q, k, v, b, True)[:2],
    }
    return make_fx(fns[kernel], tracing_mode="fake")(q, k, v, bias)


@pytest.mark.parametrize("kernel", ["flash", "efficient", "cudnn"])
def test_gpu_attention_kernels_translate(kernel):
    """torch's CUDA attention kernels (what sdpa becomes on a GPU) translate to luminal's attention: the output and
    the log-sum-exp row statistics in each kernel's layout, here run on the CPU backend."""
    n = 6 if kernel == "flash" else 9  # flash: causal, square
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 4, n, 8), torch.randn(2, 4, n, 8)
    bias = torch.randn(2, 1, 6, n)
    out, lse = torch_backend.LuminalGraph(gpu_attention_graph(kernel, q, k, v, bias))(q, k, v, bias)
    if kernel == "flash":
        scores = (q @ k.transpose(-1, -2)) * 0.3 + torch.full((6, 6), float("-inf")).triu(1)
    else:
        scores = (q @ k.transpose(-1, -2)) / 8 ** 0.5 + bias
    assert_close(out, scores.softmax(-1) @ v)
    want_lse = scores.logsumexp(-1)
    if kernel == "cudnn":
        want_lse = want_lse.unsqueeze(-1)
    if kernel == "efficient":  # rows padded to a multiple of 32 (read only by the backward pass)
        assert lse.shape == (2, 4, 32)
        lse = lse[..., :6]
    assert_close(lse, want_lse)


def test_cuda_weights_dtype_follows_the_model():
    for dtype, name in ((torch.float32, "float32"), (torch.float16, "float16"), (torch.bfloat16, "bfloat16")):
        m = nn.Linear(16, 16).to(dtype)
        gm = torch.fx.symbolic_trace(m)
        for node in gm.graph.nodes:  # the fake values dynamo would record
            if node.op == "placeholder":
                node.meta["val"] = torch.empty(4, 16, dtype=dtype)
        gm.graph.placeholder("w").meta["val"] = torch.empty(16, 16, dtype=dtype)
        assert torch_backend._weights_dtype(gm) == name


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available())")


@cuda
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-4), (torch.float16, 2e-2)])
def test_cuda_models(dtype, tol):
    """CUDA tensors run on luminal's CUDA backend (weights in the model's dtype); results are CUDA tensors."""
    for make in (bert, llama):
        m = make().to("cuda", dtype)
        ids = torch.randint(0, 97, (2, 11), device="cuda")
        report = lt.explain(m, ids)
        assert not report.fallbacks, str(report)
        with torch.no_grad():
            want = m(ids).last_hidden_state
        got = report.result.last_hidden_state
        assert got.device == want.device and got.dtype == dtype
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    q, k, v = (torch.randn(2, 4, 16, 32, device="cuda", dtype=dtype) for _ in range(3))
    report = lt.explain(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v)
    assert not report.fallbacks, str(report)
    torch.testing.assert_close(report.result.float(), F.scaled_dot_product_attention(q, k, v, is_causal=True).float(),
                               atol=tol, rtol=tol)


@cuda
def test_cuda_weights_updated_and_device_checked():
    m = MLP().eval().to("cuda")
    x = torch.randn(5, 16, device="cuda")
    f = torch.compile(m, backend="luminal")
    with torch.no_grad():
        assert_close(f(x), m(x))
        m.net[0].weight.mul_(-2)  # changed in place on the GPU
        assert_close(f(x), m(x))
        got = f(x * 2)
        assert got.is_cuda
        assert_close(got, m(x * 2))
    m.cpu()
    with torch.no_grad():  # the same model moved to the CPU: dynamo compiles it again, for luminal's CPU backend
        got = f(x.cpu())
    assert got.device.type == "cpu"
    assert_close(got, m(x.cpu()))


@cuda
def test_cuda_tensors_read_in_place():
    """from_torch(copy=False) borrows torch's memory: the graph reads it where it is, and keeps it alive."""
    from luminal.cuda import from_torch

    t = torch.randn(4, 5, device="cuda")
    torch.cuda.synchronize()
    a = from_torch(t, copy=False)
    assert a.ptr == t.data_ptr()
    cx = lm.Graph()
    x = cx.tensor((4, 5)).set(a)
    y = (x * 2 + 1).output()
    cx.compile(lm.GenericCompiler(), lm.CudaCompiler("float32"))
    cx.execute()
    assert_close(torch.from_numpy(y.numpy()), (t * 2 + 1).cpu())
    want = (t * 3 * 2 + 1).cpu()
    t.mul_(3)  # torch writes the same memory: the graph reads the new values
    torch.cuda.synchronize()  # luminal runs on its own stream
    x.set(from_torch(t, copy=False))
    del t, a  # luminal holds the tensor now
    cx.execute()
    assert_close(torch.from_numpy(y.numpy()), want)


def test_graph_aot_cannot_trace_runs_in_torch():
    """torch.take of a 0-d index decomposes into code that reads the data: AOT autograd cannot trace it, so the
    graph runs in torch (a warning says why; fallback=False raises instead). fullgraph: dynamo may not split the
    graph itself."""
    def fn(x, i):
        return torch.take(x, i) * 2

    x, i = torch.randn(1), torch.tensor(0)
    with pytest.warns(UserWarning, match="AOT autograd could not trace"):
        assert_close(torch.compile(fn, backend="luminal", fullgraph=True)(x, i), fn(x, i))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="data-dependent"):
        torch.compile(fn, backend="luminal", fullgraph=True, options={"fallback": False})(x, i)
