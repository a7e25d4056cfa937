"""The CUDA backend's attention kernels (src/cuda/codegen.cpp, attention_step): flash attention (query tiles against
key/value tiles in shared memory, softmax online), the decode kernel (up to 8 query rows per KV head: a block's
warps take turns over its key range, a lane per key), their split over key ranges (flash-decoding: partial rows
merged by a combine kernel), and the block-per-row kernel for any other row program or head size.

Parity with torch on every backend (the `backend` fixture: on a GPU the kernels run; in CI the cuda-nvrtc backend
compiles each of them for sm_80 and sm_90), at shapes that cross the kernels' tile edges (16 query rows, 32 keys,
128 head dims); and, without a GPU, which kernels the printer gives each attention."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import luminal as lm
import luminal.nn.functional as F
from helpers import FLOATS, TORCH, check, compare, needs_cuda


def _sdpa(mask_kind=None, gqa=False):
    def lm_fn(*t):
        return F.scaled_dot_product_attention(*t[:3], attn_mask=t[3] if len(t) > 3 else None,
                                              is_causal=mask_kind == "causal", enable_gqa=gqa)

    def torch_fn(*t):
        return TF.scaled_dot_product_attention(*t[:3], attn_mask=t[3] if len(t) > 3 else None,
                                               is_causal=mask_kind == "causal", enable_gqa=gqa)
    return lm_fn, torch_fn


# (q shape, k shape, v shape, mask: None / "causal" / "float" / "bool", gqa). Odd lengths cross the tiles' edges.
CASES = {
    "causal-gqa": ((1, 4, 37, 64), (1, 2, 53, 64), (1, 2, 53, 64), "causal", True),
    "float-mask": ((2, 3, 19, 40), (2, 3, 70, 40), (2, 3, 70, 24), "float", False),
    "bool-mask": ((1, 2, 33, 128), (1, 2, 45, 128), (1, 2, 45, 128), "bool", False),
    "decode-split": ((1, 4, 1, 64), (1, 2, 1500, 64), (1, 2, 1500, 64), None, True),  # key ranges + combine
    # The decode kernel: 3 rows per KV head (a block's 4th row empty), an odd cache; 5 rows (two row blocks), head
    # sizes off the 16-byte paths (36: not 8 floats a step; 18: rows not 16-byte aligned); masks over the cache;
    # 8 rows (2 tokens x 4 heads).
    "decode-odd": ((1, 6, 1, 64), (1, 2, 301, 64), (1, 2, 301, 64), None, True),
    "decode-rows5": ((2, 10, 1, 36), (2, 2, 77, 36), (2, 2, 77, 18), None, True),
    "decode-float-mask": ((1, 4, 1, 128), (1, 4, 45, 128), (1, 4, 45, 128), "float", False),
    "decode-bool-mask": ((1, 8, 1, 32), (1, 2, 70, 32), (1, 2, 70, 48), "bool", True),
    "decode-2-tokens": ((1, 8, 2, 64), (1, 2, 130, 64), (1, 2, 130, 64), "causal", True),
    "wide-head": ((1, 2, 9, 160), (1, 2, 41, 160), (1, 2, 41, 136), "causal", False),  # block-per-row kernel
}


# Every compute dtype on one case (float32: the SIMT kernels; float16/bfloat16: the tensor-core one), float32 and
# bfloat16 on the others (each kernel is compiled with NVRTC in CI: keep the matrix small).
PAIRS = [(c, d) for c in ("causal-gqa", "decode-odd") for d in FLOATS] + \
    [(c, d) for c in CASES if c not in ("causal-gqa", "decode-odd") for d in ("float32", "bfloat16")]


@pytest.mark.parametrize("case,dtype", PAIRS)
def test_attention(backend, rng, dtype, case):
    qs, ks, vs, mask, gqa = CASES[case]
    arrays = [rng.data(qs), rng.data(ks), rng.data(vs)]
    if mask in ("float", "bool"):
        shape = (qs[-2], ks[-2])
        if mask == "bool":
            m = rng.bools(shape)
            m[:, 0] = True
        else:
            m = rng.data(shape).astype(np.float32)
            m[:, :5] = -np.inf  # masked keys, inside the first key tile
        arrays.append(m)
    lm_fn, torch_fn = _sdpa(mask, gqa)
    check(lm_fn, torch_fn, arrays=arrays, dtype=dtype, backend=backend, rng=rng, name=f"attention {case}",
          tol_scale=2)


def test_attention_symbolic(backend, rng):
    """One compiled graph, run at several lengths (the runtime plans each: tiles, key ranges)."""
    cx = lm.Graph()
    q = cx.tensor((2, 4, "s", 32))
    k = cx.tensor((2, 2, "t", 32))
    v = cx.tensor((2, 2, "t", 32))
    o = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).output()
    comps = backend.compilers("float32")
    cx.compile(lm.GenericCompiler(), *comps)
    for s, t in [(17, 40), (1, 700), (3, 33)]:
        arrs = [rng.data((2, 4, s, 32)).astype(np.float32), rng.data((2, 2, t, 32)).astype(np.float32),
                rng.data((2, 2, t, 32)).astype(np.float32)]
        for x, a in zip((q, k, v), arrs):
            x.set(a)
        cx.execute()
        want = TF.scaled_dot_product_attention(*map(torch.from_numpy, arrs), enable_gqa=True).numpy()
        compare(o.numpy(), want, "float32", f"symbolic attention s={s} t={t}", rng, tol_scale=2)


@pytest.mark.parametrize("chunk", ["32", "96", "100000"])
def test_decode_key_ranges(backend, rng, monkeypatch, chunk):
    """The decode kernel's key ranges forced (LUMINAL_CUDA_ATTENTION_CHUNK: keys per range): 32 (most of a block's
    warps without keys, 19 ranges), 96 (a range ending inside a tile), one range."""
    monkeypatch.setenv("LUMINAL_CUDA_ATTENTION_CHUNK", chunk)
    lm_fn, torch_fn = _sdpa(None, True)
    check(lm_fn, torch_fn, shapes=[(2, 4, 1, 64), (2, 2, 600, 64), (2, 2, 600, 64)], backend=backend, rng=rng,
          dtype="bfloat16", name=f"decode, ranges of {chunk} keys", tol_scale=2)


@pytest.mark.parametrize("dtype", FLOATS)
def test_decode_symbolic(backend, rng, dtype):
    """One compiled decode graph (a symbolic cache length) at several lengths: one range, several, a partial tile."""
    cx = lm.Graph()
    q = cx.tensor((1, 8, 1, 64), dtype=dtype)
    k = cx.tensor((1, 2, "t", 64), dtype=dtype)
    v = cx.tensor((1, 2, "t", 64), dtype=dtype)
    o = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).output()
    cx.compile(lm.GenericCompiler(), *backend.compilers(dtype))
    for t in (5, 130, 2100):
        arrs = [rng.data((1, 8, 1, 64)), rng.data((1, 2, t, 64)), rng.data((1, 2, t, 64))]
        arrs = [torch.from_numpy(a.astype(np.float32)).to(TORCH[dtype]) for a in arrs]
        for x, a in zip((q, k, v), arrs):
            x.set(a.float().numpy())
        cx.execute()
        want = TF.scaled_dot_product_attention(*[a.float() for a in arrs], enable_gqa=True).numpy()
        compare(o.numpy().astype(np.float32), want, dtype, f"symbolic decode t={t}", rng, tol_scale=2)


def _scaled_softmax(q, k, v):
    return ((q @ k.transpose(-1, -2)) * 0.25).softmax(-1) * 0.5 @ v


def test_attention_other_program(backend, rng):
    """A row program that is not softmax(x) (here scaled after the softmax) takes the block-per-row kernel."""
    check(_scaled_softmax, _scaled_softmax, shapes=[(3, 21, 16), (3, 45, 16), (3, 45, 8)], backend=backend, rng=rng,
          name="softmax * 0.5 attention")


@pytest.mark.parametrize("s", [1, 5])
def test_llama_attention_pattern(backend, rng, s):
    """Llama's grouped-query layout (python/luminal/nn/llama.py): query heads grouped per KV head along the rows,
    a token-major cache read through views, an additive causal mask over the cache and the new tokens (s = 1: a
    decode step, the decode kernel; 5: the SIMT flash kernel)."""
    hkv, rep, p, d = 2, 3, 40, 16
    t = p + s

    def fn(q, cache_k, cache_v, mask):
        keys, vals = cache_k.transpose(0, 1), cache_v.transpose(0, 1)  # (Hkv, t, d)
        qg = q.reshape(hkv, s * rep, d)
        scores = (qg @ keys.transpose(1, 2)) * (1.0 / d ** 0.5)
        scores = scores.reshape(hkv, rep, s, t) + mask
        return scores.softmax(-1).reshape(hkv, s * rep, t) @ vals

    mask = np.where(np.arange(t)[None, :] > p + np.arange(s)[:, None], -np.inf, 0.0).astype(np.float32)
    check(fn, fn, arrays=[rng.data((hkv * rep, s, d)), rng.data((t, hkv, d)), rng.data((t, hkv, d)), mask],
          backend=backend, rng=rng, name="llama attention")


# ---- which kernels the printer gives (no GPU needed) ----------------------------------------------------------------
def _variants(fn, shapes):
    cx = lm.Graph()
    ins = [cx.tensor(s) for s in shapes]
    fn(*ins).output()
    comp = lm.CudaCompiler("bfloat16", device=None)
    cx.compile(lm.GenericCompiler(), comp)
    return [[kind for kind, _ in vs] for _, vs, _ in comp.schedule.kernels()]


def test_printed_kernels():
    lm_fn, _ = _sdpa("causal", True)
    kinds = _variants(lm_fn, [(1, 4, "s", 64), (1, 2, "t", 64), (1, 2, "t", 64)])
    # One attention step: flash on tensor cores first, then the SIMT flash kernel, the block-per-row fallback last.
    att = [k for k in kinds if "attention" in k]
    assert len(att) == 1 and att[0] == ["flash-mma", "flash-decode", "flash", "attention"], kinds
    assert not any("mma" in k or "tiled" in k for k in kinds), kinds  # no separate score / value products
    kinds = _variants(_scaled_softmax, [(3, 21, 16), (3, 45, 16), (3, 45, 8)])
    assert ["attention"] in kinds and not any("flash" in k for k in kinds), kinds


@pytest.mark.skipif(needs_cuda() is not None, reason=f"{needs_cuda()}")
def test_long_cache_decode(rng):
    """Decode against an 8k cache (key ranges merged by the combine kernel) against torch."""
    cx = lm.Graph()
    q = cx.tensor((8, 4, 1, 128))
    k = cx.tensor((8, 1, "t", 128))
    v = cx.tensor((8, 1, "t", 128))
    o = F.scaled_dot_product_attention(q, k, v).output()
    cx.compile(lm.GenericCompiler(), lm.CudaCompiler("float32"))
    arrs = [rng.data((8, 4, 1, 128)).astype(np.float32), rng.data((8, 1, 8192, 128)).astype(np.float32),
            rng.data((8, 1, 8192, 128)).astype(np.float32)]
    for x, a in zip((q, k, v), arrs):
        x.set(a)
    cx.execute()
    want = TF.scaled_dot_product_attention(*map(torch.from_numpy, arrs)).numpy()
    compare(o.numpy(), want, "float32", "8k-cache decode", rng, tol_scale=4)


def test_llama_attention_is_one_kernel(rng):
    """Every layer of a Llama step graph (prefill and decode share it) runs attention as one step whose first
    variant is the tensor-core flash kernel."""
    from luminal.nn import Llama, LlamaConfig, Session

    cfg = LlamaConfig(vocab_size=61, hidden=64, ffn=96, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16)
    model = Llama(cfg)
    for name, p in model.named_parameters():
        p.set(rng.data(tuple(int(d) for d in p.shape)).astype(np.float32) * 0.3)
    comp = lm.CudaCompiler("bfloat16", device=None)
    s = Session(model, [lm.GenericCompiler(), comp], capacity=4)
    s.reset()
    s.step(rng.integers(0, cfg.vocab_size, (3,)))  # (compiles; runs the CUDA lowering on the CPU kernels)
    kinds = [[k for k, _ in vs] for _, vs, _ in comp.schedule.kernels()]
    want = [["flash-mma", "flash-decode", "flash", "attention"]] * cfg.n_layers
    assert [k for k in kinds if "attention" in k] == want, kinds


def test_flash_attention_flag():
    """Fused by default; flash_attention=False keeps the scores, softmax and weighted values as separate kernels."""
    lm_fn, _ = _sdpa(None, True)
    for flag, fused in ((None, True), (False, False)):
        cx = lm.Graph()
        ins = [cx.tensor(s) for s in [(1, 4, 1, 64), (1, 2, "t", 64), (1, 2, "t", 64)]]
        lm_fn(*ins).output()
        comp = lm.CudaCompiler("bfloat16", device=None, flash_attention=flag)
        cx.compile(lm.GenericCompiler(), comp)
        kinds = [k for _, vs, _ in comp.schedule.kernels() for k, _ in vs]
        assert ("flash-decode" in kinds) == fused and ("attention" in kinds) == fused, kinds
