"""torch.nn parity of luminal.nn's layers: state-dict names and shapes, loading, and outputs on every backend.

Each layer is checked against the torch layer holding the same random state (weights, biases and BatchNorm's
running statistics all random, never torch's zeros/ones initialisation), loaded through `load_state_dict`.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import luminal as lm
import luminal.nn as lnn
from helpers import check

tnn = torch.nn


def randomize(tm: torch.nn.Module, rng, dtype=torch.float32) -> dict:
    """Gives every float entry of tm's state random data (variances positive), fan-in scaled so outputs stay O(1);
    returns the state dict."""
    with torch.no_grad():
        for name, t in tm.state_dict().items():
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                data = rng.data(t.shape, "pos")
            else:
                data = rng.data(t.shape, "small")
                if t.ndim >= 2:
                    data = data / np.sqrt(np.prod(t.shape[1:]))
            t.copy_(torch.from_numpy(data).to(t.dtype))
    tm.to(dtype).eval()
    return tm.state_dict()


def check_module(tm, make, shapes, backend, rng, *, call=None, tcall=None, dtype="float32", arrays=None,
                 dims=None, dtypes=None, domain="signed", tol_scale=1.0, atol=None, rtol=None):
    """`make(graph)` builds the luminal layer; it loads tm's (randomized) state and runs on the inputs."""
    tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    sd = randomize(tm, rng, tdt)
    call = call or (lambda m, *xs: m(*xs))
    tcall = tcall or (lambda m, *xs: m(*xs))

    def fn(*xs):
        m = make(xs[0].graph)
        m.load_state_dict(sd)
        return call(m, *xs)

    def torch_fn(*ts):
        with torch.no_grad():
            return tcall(tm, *ts)

    return check(fn, torch_fn, shapes, dtype, backend=backend, rng=rng, arrays=arrays, dims=dims, dtypes=dtypes,
                 domain=domain, tol_scale=tol_scale, atol=atol, rtol=rtol, name=type(tm).__name__)


# ---- state-dict names and shapes -----------------------------------------------------------------------------------
PAIRS = {
    "Linear": (lambda: tnn.Linear(6, 4), lambda g: lnn.Linear(6, 4, graph=g)),
    "Linear-nobias": (lambda: tnn.Linear(6, 4, bias=False), lambda g: lnn.Linear(6, 4, bias=False, graph=g)),
    "LayerNorm": (lambda: tnn.LayerNorm((3, 4)), lambda g: lnn.LayerNorm((3, 4), graph=g)),
    "LayerNorm-noaffine": (lambda: tnn.LayerNorm(4, elementwise_affine=False),
                           lambda g: lnn.LayerNorm(4, elementwise_affine=False, graph=g)),
    "LayerNorm-nobias": (lambda: tnn.LayerNorm(4, bias=False), lambda g: lnn.LayerNorm(4, bias=False, graph=g)),
    "Conv1d": (lambda: tnn.Conv1d(4, 6, 3, groups=2), lambda g: lnn.Conv1d(4, 6, 3, groups=2, graph=g)),
    "Conv2d": (lambda: tnn.Conv2d(3, 5, (3, 2), bias=False), lambda g: lnn.Conv2d(3, 5, (3, 2), bias=False, graph=g)),
    "ConvTranspose2d": (lambda: tnn.ConvTranspose2d(4, 6, 3, groups=2),
                        lambda g: lnn.ConvTranspose2d(4, 6, 3, groups=2, graph=g)),
    "BatchNorm1d": (lambda: tnn.BatchNorm1d(5), lambda g: lnn.BatchNorm1d(5, graph=g)),
    "BatchNorm2d-noaffine": (lambda: tnn.BatchNorm2d(5, affine=False), lambda g: lnn.BatchNorm2d(5, affine=False,
                                                                                                 graph=g)),
    "GroupNorm": (lambda: tnn.GroupNorm(2, 6), lambda g: lnn.GroupNorm(2, 6, graph=g)),
    "MultiheadAttention": (lambda: tnn.MultiheadAttention(8, 2), lambda g: lnn.MultiheadAttention(8, 2, graph=g)),
    "MultiheadAttention-kvdim": (lambda: tnn.MultiheadAttention(8, 2, kdim=4, vdim=6),
                                 lambda g: lnn.MultiheadAttention(8, 2, kdim=4, vdim=6, graph=g)),
    "MultiheadAttention-nobias": (lambda: tnn.MultiheadAttention(8, 2, bias=False),
                                  lambda g: lnn.MultiheadAttention(8, 2, bias=False, graph=g)),
    "TransformerEncoderLayer": (lambda: tnn.TransformerEncoderLayer(8, 2, 16),
                                lambda g: lnn.TransformerEncoderLayer(8, 2, 16, graph=g)),
    "Sequential": (lambda: tnn.Sequential(tnn.Linear(3, 4), tnn.ReLU(), tnn.Sequential(tnn.Linear(4, 2))),
                   lambda g: lnn.Sequential(lnn.Linear(3, 4, graph=g), lnn.ReLU(),
                                            lnn.Sequential(lnn.Linear(4, 2, graph=g)))),
}


@pytest.mark.parametrize("name", list(PAIRS))
def test_state_dict_names_match_torch(name):
    tmake, make = PAIRS[name]
    want = {k: tuple(v.shape) for k, v in tmake().state_dict().items() if not k.endswith("num_batches_tracked")}
    got = make(lm.Graph()).state_dict_shapes()
    assert got == want


def test_buffers_are_state_not_parameters():
    m = lnn.BatchNorm2d(3, graph=lm.Graph())
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]
    assert [n for n, _ in m.named_buffers()] == ["running_mean", "running_var"]


def test_module_list_attribute_names():
    class Net(lnn.Module):
        def __init__(self, g):
            super().__init__(g)
            self.blocks = lnn.ModuleList([lnn.Linear(2, 2, graph=g) for _ in range(2)])
            self.extra = [lnn.LayerNorm(2, graph=g)]  # a plain list of modules works the same way

    t = tnn.Module()
    t.blocks = tnn.ModuleList([tnn.Linear(2, 2) for _ in range(2)])
    t.extra = tnn.ModuleList([tnn.LayerNorm(2)])
    want = {k: tuple(v.shape) for k, v in t.state_dict().items()}
    assert Net(lm.Graph()).state_dict_shapes() == want


# ---- loading -------------------------------------------------------------------------------------------------------
def _run_linear(m, x):
    g = m.graph
    inp = g.tensor(x.shape).set(x)
    out = m(inp).output()
    g.compile(lm.GenericCompiler())
    g.execute()
    return out.numpy()


def test_load_torch_tensors_numpy_and_bfloat16(rng):
    torch.manual_seed(rng.seed)
    t = tnn.Linear(5, 3)
    randomize(t, rng)
    x = rng.data((2, 5)).astype(np.float32)
    want = t(torch.from_numpy(x)).detach().numpy()
    for sd in (t.state_dict(), {k: v.numpy() for k, v in t.state_dict().items()}):
        np.testing.assert_allclose(_run_linear(lnn.Linear(5, 3, graph=lm.Graph()).load_state_dict(sd), x), want,
                                   rtol=1e-5, atol=1e-6)
    # bfloat16 tensors arrive through float32: the result is the bf16-rounded layer's
    tb = {k: v.bfloat16() for k, v in t.state_dict().items()}
    want_b = torch.nn.functional.linear(torch.from_numpy(x), tb["weight"].float(), tb["bias"].float()).numpy()
    got = _run_linear(lnn.Linear(5, 3, graph=lm.Graph()).load_state_dict(tb), x)
    np.testing.assert_allclose(got, want_b, rtol=1e-5, atol=1e-6)


def test_load_safetensors_path(tmp_path, rng):
    from safetensors.torch import save_file

    t = tnn.Sequential(tnn.Linear(4, 6), tnn.GELU(), tnn.Linear(6, 2))
    randomize(t, rng)
    save_file({k: v.contiguous() for k, v in t.state_dict().items()}, tmp_path / "m.safetensors")
    g = lm.Graph()
    m = lnn.Sequential(lnn.Linear(4, 6, graph=g), lnn.GELU(), lnn.Linear(6, 2, graph=g))
    m.load_state_dict(tmp_path / "m.safetensors")
    x = rng.data((3, 4)).astype(np.float32)
    np.testing.assert_allclose(_run_linear(m, x), t(torch.from_numpy(x)).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_load_errors_list_every_problem():
    g = lm.Graph()
    m = lnn.Sequential(lnn.Linear(4, 6, graph=g), lnn.BatchNorm1d(6, graph=g))
    sd = {"0.weight": np.ones((6, 5), np.float32),  # mis-shaped
          "0.bias": np.ones(6, np.float32), "1.weight": np.ones(6, np.float32), "1.bias": np.ones(6, np.float32),
          "1.running_mean": np.ones(6, np.float32),  # running_var missing
          "1.num_batches_tracked": np.zeros((), np.int64),  # ignored, as torch does
          "2.weight": np.ones((3, 3), np.float32)}  # unexpected
    with pytest.raises(ValueError) as e:
        m.load_state_dict(sd)
    msg = str(e.value)
    assert "0.weight: expected (6, 4), got (6, 5)" in msg, msg
    assert "missing key(s): 1.running_var (6,)" in msg, msg
    assert "unexpected key(s): 2.weight (3, 3)" in msg, msg
    assert "num_batches_tracked" not in msg
    # strict=False lets missing and unexpected keys pass, never a wrong shape
    with pytest.raises(ValueError, match=r"0\.weight: expected \(6, 4\), got \(6, 5\)"):
        m.load_state_dict(sd, strict=False)
    sd["0.weight"] = np.ones((6, 4), np.float32)
    m.load_state_dict(sd, strict=False)


# ---- layers without state ------------------------------------------------------------------------------------------
ACTIVATIONS = {
    "ReLU": (tnn.ReLU(), lnn.ReLU()),
    "ReLU6": (tnn.ReLU6(), lnn.ReLU6()),
    "GELU": (tnn.GELU(), lnn.GELU()),
    "GELU-tanh": (tnn.GELU(approximate="tanh"), lnn.GELU(approximate="tanh")),
    "SiLU": (tnn.SiLU(), lnn.SiLU()),
    "Tanh": (tnn.Tanh(), lnn.Tanh()),
    "Sigmoid": (tnn.Sigmoid(), lnn.Sigmoid()),
    "Softmax": (tnn.Softmax(dim=1), lnn.Softmax(dim=1)),
    "LogSoftmax": (tnn.LogSoftmax(dim=-1), lnn.LogSoftmax(dim=-1)),
    "Hardswish": (tnn.Hardswish(), lnn.Hardswish()),
    "Hardsigmoid": (tnn.Hardsigmoid(), lnn.Hardsigmoid()),
    "Mish": (tnn.Mish(), lnn.Mish()),
    "ELU": (tnn.ELU(alpha=0.7), lnn.ELU(alpha=0.7)),
    "LeakyReLU": (tnn.LeakyReLU(0.2), lnn.LeakyReLU(0.2)),
    "Softplus": (tnn.Softplus(beta=2.0), lnn.Softplus(beta=2.0)),
    "Identity": (tnn.Identity(), lnn.Identity()),
    "Dropout": (tnn.Dropout(0.3).eval(), lnn.Dropout(0.3)),
    "Flatten": (tnn.Flatten(), lnn.Flatten()),
    "Flatten-0": (tnn.Flatten(0, 1), lnn.Flatten(0, 1)),
    "Unflatten": (tnn.Unflatten(2, (2, 2)), lnn.Unflatten(2, (2, 2))),
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_stateless_layers(name, backend, rng):
    tm, m = ACTIVATIONS[name]
    # |x| up to 4 reaches the kinks of Hardswish and ReLU6 (-3, 3, 6)
    x = rng.data((2, 3, 4)) * 2
    check(lambda t: m(t), lambda t: tm(t), arrays=[x], backend=backend, rng=rng, tol_scale=2, name=name)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_linear_and_layer_norm(dtype, backend, rng):
    torch.manual_seed(rng.seed)
    scale = 1 if dtype == "float32" else 2
    check_module(tnn.Linear(6, 5), lambda g: lnn.Linear(6, 5, graph=g, dtype=dtype), [(3, 6)], backend, rng,
                 dtype=dtype, tol_scale=scale)
    check_module(tnn.LayerNorm((3, 4)), lambda g: lnn.LayerNorm((3, 4), graph=g, dtype=dtype), [(2, 3, 4)],
                 backend, rng, dtype=dtype, tol_scale=4 * scale)


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_elementwise_affine(affine, backend, rng):
    check_module(tnn.LayerNorm(6, eps=1e-3, elementwise_affine=affine),
                 lambda g: lnn.LayerNorm(6, eps=1e-3, elementwise_affine=affine, graph=g), [(2, 5, 6)], backend, rng,
                 tol_scale=4)


def test_sequential(backend, rng):
    tm = tnn.Sequential(tnn.Linear(4, 8), tnn.SiLU(), tnn.Dropout(), tnn.Linear(8, 3), tnn.Softmax(-1))
    check_module(tm, lambda g: lnn.Sequential(lnn.Linear(4, 8, graph=g), lnn.SiLU(), lnn.Dropout(),
                                              lnn.Linear(8, 3, graph=g), lnn.Softmax(-1)),
                 [(5, 4)], backend, rng, tol_scale=2)


# ---- convolution, normalization, pooling (luminal.nn.functional) ----------------------------------------------------
CONVS = {
    "1d": (lambda: tnn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2),
           lambda g: lnn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2, graph=g), (2, 4, 9)),
    "1d-same-reflect": (lambda: tnn.Conv1d(3, 2, 4, padding="same", padding_mode="reflect"),
                        lambda g: lnn.Conv1d(3, 2, 4, padding="same", padding_mode="reflect", graph=g), (2, 3, 7)),
    "2d": (lambda: tnn.Conv2d(3, 4, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2)),
           lambda g: lnn.Conv2d(3, 4, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), graph=g), (2, 3, 7, 6)),
    "2d-depthwise-same": (lambda: tnn.Conv2d(4, 4, 3, padding="same", groups=4, bias=False),
                          lambda g: lnn.Conv2d(4, 4, 3, padding="same", groups=4, bias=False, graph=g), (1, 4, 5, 5)),
    "2d-circular": (lambda: tnn.Conv2d(2, 3, 3, padding=1, padding_mode="circular"),
                    lambda g: lnn.Conv2d(2, 3, 3, padding=1, padding_mode="circular", graph=g), (1, 2, 5, 4)),
    "2d-replicate": (lambda: tnn.Conv2d(2, 3, 3, padding=(2, 1), padding_mode="replicate"),
                     lambda g: lnn.Conv2d(2, 3, 3, padding=(2, 1), padding_mode="replicate", graph=g), (1, 2, 4, 4)),
    "2d-unbatched": (lambda: tnn.Conv2d(2, 3, 2), lambda g: lnn.Conv2d(2, 3, 2, graph=g), (2, 5, 4)),
    "transpose2d": (lambda: tnn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
                    lambda g: lnn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, graph=g),
                    (2, 4, 3, 4)),
    "transpose2d-dilated": (lambda: tnn.ConvTranspose2d(3, 2, (2, 3), dilation=2, bias=False),
                            lambda g: lnn.ConvTranspose2d(3, 2, (2, 3), dilation=2, bias=False, graph=g),
                            (1, 3, 4, 3)),
}


@pytest.mark.parametrize("name", list(CONVS))
def test_conv(name, backend, rng):
    torch.manual_seed(rng.seed)
    tmake, make, shape = CONVS[name]
    check_module(tmake(), make, [shape], backend, rng, tol_scale=2)


def test_conv_transpose_output_size(backend, rng):
    tm = tnn.ConvTranspose2d(2, 3, 3, stride=2)
    check_module(tm, lambda g: lnn.ConvTranspose2d(2, 3, 3, stride=2, graph=g), [(1, 2, 3, 4)], backend, rng,
                 call=lambda m, x: m(x, output_size=(8, 10)), tcall=lambda m, x: m(x, output_size=(8, 10)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_conv2d_low_precision(dtype, backend, rng):
    check_module(tnn.Conv2d(3, 4, 3, padding=1), lambda g: lnn.Conv2d(3, 4, 3, padding=1, graph=g, dtype=dtype),
                 [(1, 3, 5, 5)], backend, rng, dtype=dtype, tol_scale=2)


NORMS = {
    "BatchNorm1d-2d": (lambda: tnn.BatchNorm1d(5), lambda g: lnn.BatchNorm1d(5, graph=g), (4, 5)),
    "BatchNorm1d-3d": (lambda: tnn.BatchNorm1d(3, eps=1e-3), lambda g: lnn.BatchNorm1d(3, eps=1e-3, graph=g),
                       (2, 3, 6)),
    "BatchNorm2d": (lambda: tnn.BatchNorm2d(3), lambda g: lnn.BatchNorm2d(3, graph=g), (2, 3, 4, 5)),
    "BatchNorm2d-noaffine": (lambda: tnn.BatchNorm2d(3, affine=False),
                             lambda g: lnn.BatchNorm2d(3, affine=False, graph=g), (2, 3, 4, 5)),
    "BatchNorm2d-batchstats": (lambda: tnn.BatchNorm2d(3, track_running_stats=False),
                               lambda g: lnn.BatchNorm2d(3, track_running_stats=False, graph=g), (2, 3, 4, 5)),
    "GroupNorm": (lambda: tnn.GroupNorm(2, 6), lambda g: lnn.GroupNorm(2, 6, graph=g), (2, 6, 3, 3)),
    "GroupNorm-noaffine": (lambda: tnn.GroupNorm(3, 3, affine=False),
                           lambda g: lnn.GroupNorm(3, 3, affine=False, graph=g), (2, 3, 7)),
}


@pytest.mark.parametrize("name", list(NORMS))
def test_norm(name, backend, rng):
    tmake, make, shape = NORMS[name]
    check_module(tmake(), make, [shape], backend, rng, tol_scale=4)


POOLS = {
    "max": (tnn.MaxPool2d(3, stride=2, padding=1), lambda: lnn.MaxPool2d(3, stride=2, padding=1)),
    "max-ceil-dilated": (tnn.MaxPool2d(2, dilation=2, ceil_mode=True), lambda: lnn.MaxPool2d(2, dilation=2,
                                                                                             ceil_mode=True)),
    "max-indices": (tnn.MaxPool2d(2, return_indices=True), lambda: lnn.MaxPool2d(2, return_indices=True)),
    "avg": (tnn.AvgPool2d(2), lambda: lnn.AvgPool2d(2)),
    "avg-pad-exclude": (tnn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False),
                        lambda: lnn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)),
    "adaptive-avg": (tnn.AdaptiveAvgPool2d((2, 3)), lambda: lnn.AdaptiveAvgPool2d((2, 3))),
    "adaptive-avg-1": (tnn.AdaptiveAvgPool2d(1), lambda: lnn.AdaptiveAvgPool2d(1)),
}


@pytest.mark.parametrize("name", list(POOLS))
def test_pool(name, backend, rng):
    tm, make = POOLS[name]
    m = make()
    check(lambda t: m(t), lambda t: tm(t), [(2, 3, 7, 6)], backend=backend, rng=rng, domain="distinct", name=name)


# ---- attention -----------------------------------------------------------------------------------------------------
def _mha_pair(E=8, H=2, batch_first=False, **kw):
    return (tnn.MultiheadAttention(E, H, batch_first=batch_first, **kw),
            lambda g: lnn.MultiheadAttention(E, H, batch_first=batch_first, graph=g, **kw))


def _padding(rng, N, S):
    """A key padding mask (True = ignore) that leaves every row at least one key."""
    m = rng.bools((N, S))
    m[:, 0] = False
    return m


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_self_attention(batch_first, need_weights, backend, rng):
    N, L, E = 2, 5, 8
    tm, make = _mha_pair(E, 2, batch_first)
    x = rng.data((N, L, E) if batch_first else (L, N, E))
    kpm = _padding(rng, N, L)

    def call(m, x, kpm):
        out, w = m(x, x, x, key_padding_mask=kpm, need_weights=need_weights)
        return [out, w] if need_weights else out

    res = check_module(tm, make, None, backend, rng, arrays=[x, kpm], call=call, tcall=call, tol_scale=4)
    if not need_weights:
        assert not isinstance(res, list)


def test_mha_masks_cross_attention_and_kvdims(backend, rng):
    N, L, S, E, H = 2, 3, 5, 8, 2
    tm, make = _mha_pair(E, H, True, kdim=4, vdim=6)
    q, k, v = rng.data((N, L, E)), rng.data((N, S, 4)), rng.data((N, S, 6))
    am = rng.data((N * H, L, S))  # a float mask per head, added to the scores
    kpm = rng.data((N, S))  # a float key padding mask, added too

    def call(m, q, k, v, am, kpm):
        return list(m(q, k, v, key_padding_mask=kpm, attn_mask=am, average_attn_weights=False))

    check_module(tm, make, None, backend, rng, arrays=[q, k, v, am, kpm], call=call, tcall=call, tol_scale=4)


def test_mha_bool_attn_mask_causal_and_unbatched(backend, rng):
    L, E = 4, 8
    tm, make = _mha_pair(E, 4, False)
    x = rng.data((L, E))
    causal = np.triu(np.ones((L, L), bool), 1)  # True = not allowed

    def call(m, x, am):
        return m(x, x, x, attn_mask=am, need_weights=False, is_causal=True)[0]

    check_module(tm, make, None, backend, rng, arrays=[x, causal], call=call, tcall=call, tol_scale=4)


def test_mha_symbolic_length(backend, rng):
    N, L, E = 2, 6, 8
    tm, make = _mha_pair(E, 2, True)
    x = rng.data((N, L, E))

    def call(m, x):
        return m(x, x, x, need_weights=False)[0]

    check_module(tm, make, None, backend, rng, arrays=[x], dims=[("b", "s", E)], call=call, tcall=call,
                 tol_scale=4)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation,batch_first", [("relu", False), ("gelu", True)])
def test_transformer_encoder_layer(norm_first, activation, batch_first, backend, rng):
    N, L, E = 2, 5, 8
    kw = dict(dim_feedforward=16, activation=activation, batch_first=batch_first, norm_first=norm_first)
    tm = tnn.TransformerEncoderLayer(E, 2, **kw)
    x = rng.data((N, L, E) if batch_first else (L, N, E))
    kpm = _padding(rng, N, L)
    causal = np.triu(np.ones((L, L), bool), 1)

    def call(m, x, kpm, am):
        return m(x, src_mask=am, src_key_padding_mask=kpm)

    check_module(tm, lambda g: lnn.TransformerEncoderLayer(E, 2, graph=g, **kw), None, backend, rng,
                 arrays=[x, kpm, causal], call=call, tcall=call, tol_scale=8)


# ---- bad input -----------------------------------------------------------------------------------------------------
def test_bad_input_is_a_clear_error():
    g = lm.Graph()
    with pytest.raises(ValueError, match=r"Linear\(4, 3\).*\(2, 5\)"):
        lnn.Linear(4, 3, graph=g)(g.tensor((2, 5)))
    with pytest.raises(ValueError, match=r"LayerNorm\(6,\).*\(2, 5\)"):
        lnn.LayerNorm(6, graph=g)(g.tensor((2, 5)))
    with pytest.raises(ValueError, match=r"Conv2d.*3 channels.*\(1, 4, 5, 5\)"):
        lnn.Conv2d(3, 2, 3, graph=g)(g.tensor((1, 4, 5, 5)))
    with pytest.raises(ValueError, match="divisible by groups"):
        lnn.Conv2d(3, 4, 3, groups=2, graph=g)
    with pytest.raises(ValueError, match=r"BatchNorm2d\(3\).*\(2, 3, 4\)"):
        lnn.BatchNorm2d(3, graph=g)(g.tensor((2, 3, 4)))
    mha = lnn.MultiheadAttention(8, 2, graph=g)
    with pytest.raises(ValueError, match=r"key of shape \(3, 2, 6\)"):
        x = g.tensor((3, 2, 8))
        mha(x, g.tensor((3, 2, 6)), x)
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(2, 3\), got \(3, 2\)"):
        x = g.tensor((3, 2, 8))
        mha(x, x, x, key_padding_mask=g.tensor((3, 2), lm.bool))
    with pytest.raises(ValueError, match="divisible by num_heads"):
        lnn.MultiheadAttention(8, 3, graph=g)
    with pytest.raises(ValueError, match="relu/gelu"):
        lnn.TransformerEncoderLayer(8, 2, activation="tanh", graph=g)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_padding_modes(mode, backend, rng):
    from luminal.nn.layers import _pad_mode

    pads = (2, 1, 1, 3)
    check(lambda t: _pad_mode(t, pads, mode), lambda t: torch.nn.functional.pad(t, pads, mode=mode),
          [(2, 3, 5, 4)], backend=backend, rng=rng, name=f"pad {mode}")


def test_sequential_of_stateless_layers_needs_no_graph(rng):
    m = lnn.Sequential(lnn.ReLU(), lnn.Tanh())
    assert m.state_dict_shapes() == {}
    x = rng.data((3, 4))
    check(lambda t: m(t), lambda t: t.relu().tanh(), arrays=[x], rng=rng)
