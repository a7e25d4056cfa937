"""PyTorch parity of scaled_dot_product_attention (python/luminal/attention.py) and the normalisation functions
(python/luminal/normalization.py), on every backend; and that the CPU backend fuses sdpa into one Attention op."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import luminal as lm
import luminal.nn.functional as F
from helpers import FLOATS, check


# ---- scaled_dot_product_attention -----------------------------------------------------------------------------------
def _mask_data(rng, shape, kind):
    if kind == "bool":
        m = rng.bools(shape)
        m[..., 1, :] = False  # a row that attends nothing: zeros, as torch gives
        m[..., 0, :] = True
        return m
    m = rng.data(shape).astype(np.float32)
    m[..., 0, :3] = -np.inf
    m[..., 2, :] = -np.inf  # a fully masked row
    return m


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("mask", [None, "bool", "float", "causal"])
def test_sdpa(backend, rng, dtype, mask):
    B, H, L, S, E, Ev = 2, 3, 5, 7, 8, 6
    q, k, v = rng.data((B, H, L, E)), rng.data((B, H, S, E)), rng.data((B, H, S, Ev))
    arrays = [q, k, v]
    if mask in ("bool", "float"):
        arrays.append(_mask_data(rng, (B, 1, L, S), mask))
    causal = mask == "causal"
    check(lambda *t: F.scaled_dot_product_attention(*t[:3], attn_mask=t[3] if len(t) > 3 else None,
                                                    is_causal=causal),
          lambda *t: TF.scaled_dot_product_attention(*t[:3], attn_mask=t[3] if len(t) > 3 else None,
                                                     is_causal=causal),
          arrays=arrays, dtype=dtype, backend=backend, rng=rng, name=f"sdpa mask={mask}", tol_scale=2)


def test_sdpa_shapes(backend, rng):
    """Causal with L > S and L < S (top-left aligned), a custom scale, broadcast batch dims, no head dim, a per-head
    mask, and a symbolic sequence length."""
    q, k, v = rng.data((2, 9, 4)), rng.data((1, 6, 4)), rng.data((1, 6, 5))
    check(lambda q, k, v: [F.scaled_dot_product_attention(q, k, v, is_causal=True),
                           F.scaled_dot_product_attention(q[:, :4], k, v, is_causal=True, scale=0.3),
                           F.scaled_dot_product_attention(q, k, v, scale=1.7)],
          lambda q, k, v: [TF.scaled_dot_product_attention(q, k, v, is_causal=True),
                           TF.scaled_dot_product_attention(q[:, :4], k, v, is_causal=True, scale=0.3),
                           TF.scaled_dot_product_attention(q, k, v, scale=1.7)],
          arrays=[q, k, v], backend=backend, rng=rng, name="sdpa shapes")
    q, k, v = rng.data((2, 3, 5, 4)), rng.data((2, 3, 7, 4)), rng.data((2, 3, 7, 4))
    m = _mask_data(rng, (3, 5, 7), "float")
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m),
          lambda q, k, v, m: TF.scaled_dot_product_attention(q, k, v, m),
          arrays=[q, k, v, m], backend=backend, rng=rng, name="per-head mask")
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
          lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, is_causal=True),
          arrays=[q, k, v], dims=[(2, 3, "s", 4), (2, 3, "t", 4), (2, 3, "t", 4)], backend=backend, rng=rng,
          name="symbolic lengths")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mask", [None, "bool-per-head", "causal"])
def test_sdpa_gqa(backend, rng, dtype, mask):
    q, k, v = rng.data((2, 6, 5, 8)), rng.data((2, 2, 7, 8)), rng.data((2, 2, 7, 4))
    arrays = [q, k, v]
    if mask == "bool-per-head":
        arrays.append(_mask_data(rng, (6, 5, 7), "bool"))
    causal = mask == "causal"
    check(lambda *t: F.scaled_dot_product_attention(*t[:3], attn_mask=t[3] if len(t) > 3 else None,
                                                    is_causal=causal, enable_gqa=True),
          lambda *t: TF.scaled_dot_product_attention(*t[:3], attn_mask=t[3] if len(t) > 3 else None,
                                                     is_causal=causal, enable_gqa=True),
          arrays=arrays, dtype=dtype, backend=backend, rng=rng, name=f"sdpa gqa mask={mask}", tol_scale=2)


@pytest.mark.parametrize("mask", [None, "bool", "float", "causal", "gqa"])
def test_sdpa_fuses_to_attention(rng, mask):
    """The CPU backend turns the composition into one Attention op, and it still matches torch."""
    cx = lm.Graph()
    hq = 4 if mask == "gqa" else 2
    arrays = [rng.data((1, hq, 5, 8)), rng.data((1, 2, 9, 8)), rng.data((1, 2, 9, 8))]
    if mask in ("bool", "float"):
        arrays.append(_mask_data(rng, (5, 9), mask))
    ins = [cx.tensor(a.shape, dtype="bool" if a.dtype == bool else "float32").set(
        a if a.dtype == bool else a.astype(np.float32)) for a in arrays]
    kw = dict(attn_mask=ins[3] if len(ins) > 3 else None, is_causal=mask == "causal", enable_gqa=mask == "gqa")
    out = F.scaled_dot_product_attention(*ins[:3], **kw).output()
    cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
    assert cx.stats().get("Attention", 0) == 1, cx.stats()
    assert "MatMul" not in cx.stats(), cx.stats()
    cx.execute()
    t = [torch.from_numpy(a if a.dtype == bool else a.astype(np.float32)) for a in arrays]
    want = TF.scaled_dot_product_attention(*t[:3], attn_mask=t[3] if len(t) > 3 else None,
                                           is_causal=kw["is_causal"], enable_gqa=kw["enable_gqa"])
    np.testing.assert_allclose(out.numpy(), want.numpy(), atol=1e-5, rtol=1e-4)


def test_sdpa_errors():
    cx = lm.Graph()
    q, k, v = cx.tensor((2, 4, 5, 8)), cx.tensor((2, 2, 7, 8)), cx.tensor((2, 2, 7, 6))
    sdpa = F.scaled_dot_product_attention
    with pytest.raises(ValueError, match="dropout_p=0.1: only 0.0"):
        sdpa(q, k, v, dropout_p=0.1)
    with pytest.raises(ValueError, match=r"batch dims .* cannot be broadcast together \(different head counts need "
                                         r"enable_gqa=True\)"):
        sdpa(q, k, v)
    with pytest.raises(ValueError, match=r"query \(2, 4, 5, 8\) and key \(2, 2, 7, 6\) differ in their last dim"):
        sdpa(q, v, v, enable_gqa=True)
    with pytest.raises(ValueError, match=r"key \(2, 2, 7, 8\) and value \(2, 2, 6, 6\) differ in their sequence"):
        sdpa(q, k, cx.tensor((2, 2, 6, 6)), enable_gqa=True)
    with pytest.raises(ValueError, match=r"attn_mask \(5, 6\) cannot be broadcast to the attention scores "
                                         r"\(\.\.\., L=5, S=7\)"):
        sdpa(q, k, v, attn_mask=cx.tensor((5, 6), dtype="bool"), enable_gqa=True)
    with pytest.raises(ValueError, match="not both"):
        sdpa(q, k, v, attn_mask=cx.tensor((5, 7), dtype="bool"), is_causal=True, enable_gqa=True)
    with pytest.raises(ValueError, match=r"query heads \(4\) to be a multiple of key/value heads \(3\)"):
        sdpa(q, cx.tensor((2, 3, 7, 8)), cx.tensor((2, 3, 7, 6)), enable_gqa=True)


# ---- normalisation --------------------------------------------------------------------------------------------------
def test_group_instance_batch_norm(backend, rng, dtype="float32"):
    x = rng.data((2, 6, 5, 3))
    w, b = rng.data((6,)), rng.data((6,))
    mean, var = rng.data((6,)), rng.data((6,), "pos")
    check(lambda x, w, b, m, v: [F.group_norm(x, 3, w, b), F.group_norm(x, 6, eps=1e-3), F.group_norm(x, 1, w),
                                 F.instance_norm(x, weight=w, bias=b), F.batch_norm(x, m, v, w, b),
                                 F.batch_norm(x, None, None, w, b, training=True),
                                 F.instance_norm(x, m, v, use_input_stats=False)],
          lambda x, w, b, m, v: [TF.group_norm(x, 3, w, b), TF.group_norm(x, 6, eps=1e-3), TF.group_norm(x, 1, w),
                                 TF.instance_norm(x, weight=w, bias=b), TF.batch_norm(x, m, v, w, b),
                                 TF.batch_norm(x, None, None, w, b, training=True),
                                 TF.instance_norm(x, m, v, use_input_stats=False)],
          arrays=[x, w, b, mean, var], dtype=dtype, backend=backend, rng=rng, name="norms", tol_scale=2)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_norms_low_precision(backend, rng, dtype):
    """Statistics in float32, rounded once to the input's dtype, as torch's CPU kernels do."""
    x = rng.data((2, 6, 5, 3))
    w, b = rng.data((6,)), rng.data((6,))
    mean, var = rng.data((6,)), rng.data((6,), "pos")
    check(lambda x, w, b, m, v: [F.group_norm(x, 3, w, b), F.batch_norm(x, m, v, w, b)],
          lambda x, w, b, m, v: [TF.group_norm(x, 3, w, b), TF.batch_norm(x, m, v, w, b)],
          arrays=[x, w, b, mean, var], dtype=dtype, backend=backend, rng=rng, name="norms", tol_scale=2)


def test_norms_symbolic_and_1d(backend, rng):
    """A symbolic batch and spatial length; (N, C) inputs for batch_norm."""
    x = rng.data((3, 4, 7))
    w, b = rng.data((4,)), rng.data((4,))
    check(lambda x, w, b: [F.group_norm(x, 2, w, b), F.instance_norm(x), F.batch_norm(x, None, None, w, b, True)],
          lambda x, w, b: [TF.group_norm(x, 2, w, b), TF.instance_norm(x), TF.batch_norm(x, None, None, w, b, True)],
          arrays=[x, w, b], dims=[("n", 4, "l"), None, None], backend=backend, rng=rng, name="norms symbolic")
    y, m, v = rng.data((5, 4)), rng.data((4,)), rng.data((4,), "pos")
    check(lambda y, m, v, w, b: F.batch_norm(y, m, v, w, b, eps=1e-3),
          lambda y, m, v, w, b: TF.batch_norm(y, m, v, w, b, eps=1e-3),
          arrays=[y, m, v, w, b], backend=backend, rng=rng, name="batch_norm 2d")


@pytest.mark.parametrize("size", [1, 2, 5])
def test_local_response_norm(backend, rng, size):
    check(lambda x: F.local_response_norm(x, size, alpha=0.1, beta=0.6, k=1.5),
          lambda x: TF.local_response_norm(x, size, alpha=0.1, beta=0.6, k=1.5),
          arrays=[rng.data((2, 7, 3, 4))], backend=backend, rng=rng, name="lrn")


def test_layer_rms_norm_reexported(backend, rng):
    import luminal.normalization as N

    x, w = rng.data((3, 8)), rng.data((8,))
    check(lambda x, w: [N.layer_norm(x, (8,), w), N.rms_norm(x, (8,), w, 1e-5)],
          lambda x, w: [TF.layer_norm(x, (8,), w), TF.rms_norm(x, (8,), w, 1e-5)],
          arrays=[x, w], backend=backend, rng=rng, name="layer/rms norm")


def test_norm_errors():
    cx = lm.Graph()
    x = cx.tensor((2, 6, 5))
    with pytest.raises(ValueError, match=r"group_norm: 6 channels \(input \(2, 6, 5\)\) cannot be split into 4"):
        F.group_norm(x, 4)
    with pytest.raises(ValueError, match=r"group_norm: weight must have shape \(6,\) for input \(2, 6, 5\), got "
                                         r"\(5,\)"):
        F.group_norm(x, 3, cx.tensor((5,)))
    with pytest.raises(NotImplementedError, match="running_mean/running_var in place"):
        F.batch_norm(x, cx.tensor((6,)), cx.tensor((6,)), training=True)
    with pytest.raises(ValueError, match="training=False needs running_mean and running_var"):
        F.batch_norm(x, None, None)
    with pytest.raises(ValueError, match=r"instance_norm: input needs at least 3 dims"):
        F.instance_norm(cx.tensor((2, 6)))
