"""Long contexts on the CPU: the split-KV (flash-decoding) path of the Attention kernel against torch SDPA, and the
KV-cache session's reserved capacity (the cache never moves as a sequence grows) against the doubling one."""
import numpy as np
import pytest
import torch

import luminal as lm
from luminal.nn import Llama, LlamaConfig, Session

transformers = pytest.importorskip("transformers")


def gqa_attention(q, k_cache, v_cache, mask):
    """nn.Llama's attention over token-major caches: q (Hkv, rep * s, d), caches (t, Hkv, d), mask (s, t)."""
    cx = lm.Graph()
    tq, tk, tv, tm = (cx.tensor(a.shape).set(a) for a in (q, k_cache, v_cache, mask))
    hk, rows, d = q.shape
    s, t = mask.shape
    scores = (tq @ tk.transpose(0, 1).transpose(1, 2)) * (1 / np.sqrt(d))
    probs = (scores.reshape(hk, rows // s, s, t) + tm).softmax(-1).reshape(hk, rows, t)
    out = (probs @ tv.transpose(0, 1)).output()
    cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
    assert cx.stats().get("Attention") == 1, cx.stats()
    cx.execute()
    return out.numpy()


def sdpa(q, k_cache, v_cache, mask):
    """torch's SDPA in float64, its query heads grouped over the KV heads (enable_gqa)."""
    hk, rows, d = q.shape
    s = mask.shape[0]
    tq = torch.tensor(q, dtype=torch.float64).reshape(hk, rows // s, s, d).reshape(hk * rows // s, s, d)
    tk = torch.tensor(k_cache, dtype=torch.float64).transpose(0, 1)
    tv = torch.tensor(v_cache, dtype=torch.float64).transpose(0, 1)
    tm = torch.tensor(mask, dtype=torch.float64)
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm, enable_gqa=True)
    return out.reshape(hk, rows, d).numpy()


def case(seed, t, hk, rep, s, d, hide_first=0):
    """Random q, caches and a causal mask (the s queries are the last s positions); `hide_first` keys masked out for
    every query (whole chunks that contribute nothing)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((hk, rep * s, d)).astype(np.float32)
    k = rng.standard_normal((t, hk, d)).astype(np.float32) * 2
    v = rng.standard_normal((t, hk, d)).astype(np.float32)
    mask = np.where(np.arange(t)[None, :] > (t - s + np.arange(s))[:, None], -np.inf, 0.0).astype(np.float32)
    mask[:, :hide_first] = -np.inf
    return q, k, v, mask


# (t, kv heads, query heads per KV head, queries, head dim, chunk): odd lengths, lengths not divisible by the chunk
# nor by the kernel's 128-key blocks, GQA groups of 1 to 9 rows (a group of more than 8 rows is split), prefill rows.
CASES = [
    (1, 2, 3, 1, 16, None),
    (37, 3, 3, 1, 64, None),
    (301, 2, 4, 1, 24, 64),
    (300, 1, 9, 1, 16, 7),
    (777, 3, 3, 1, 64, None),  # 777 >= 512 keys: split over threads without a chunk given
    (1031, 2, 1, 1, 40, 200),
    (129, 2, 3, 5, 16, 50),    # prefill: 5 queries, causal
]


@pytest.mark.parametrize("t,hk,rep,s,d,chunk", CASES)
def test_split_kv_matches_sdpa(t, hk, rep, s, d, chunk, threads, seed, monkeypatch):
    monkeypatch.setenv("LUMINAL_ATTENTION", "split")  # an error if this attention fell back to the per-row path
    if chunk:
        monkeypatch.setenv("LUMINAL_ATTENTION_CHUNK", str(chunk))
    q, k, v, mask = case(seed, t, hk, rep, s, d)
    got = gqa_attention(q, k, v, mask)
    np.testing.assert_allclose(got, sdpa(q, k, v, mask), rtol=1e-4, atol=2e-5, err_msg=f"seed {seed}")
    monkeypatch.setenv("LUMINAL_ATTENTION", "rows")  # the per-row path agrees
    np.testing.assert_allclose(got, gqa_attention(q, k, v, mask), rtol=1e-5, atol=1e-6)


def test_split_kv_peaked_softmax(threads, seed, monkeypatch):
    """Large scores (a peaked softmax, most weights far under 2^-64 of the largest, which the kernel drops, and
    products with V that would be subnormal) still match float64."""
    monkeypatch.setenv("LUMINAL_ATTENTION", "split")
    monkeypatch.setenv("LUMINAL_ATTENTION_CHUNK", "300")
    q, k, v, mask = case(seed, 1000, 2, 3, 1, 32)
    k *= 20
    np.testing.assert_allclose(gqa_attention(q, k, v, mask), sdpa(q, k, v, mask), rtol=1e-4, atol=2e-5)


def test_split_kv_masked_chunks(threads, seed, monkeypatch):
    """Chunks whose every key is masked out contribute nothing (their max is -inf); a row with no visible key gives
    softmax's NaN, as the reference does."""
    monkeypatch.setenv("LUMINAL_ATTENTION", "split")
    monkeypatch.setenv("LUMINAL_ATTENTION_CHUNK", "40")
    q, k, v, mask = case(seed, 333, 2, 3, 2, 16, hide_first=150)
    np.testing.assert_allclose(gqa_attention(q, k, v, mask), sdpa(q, k, v, mask), rtol=1e-4, atol=2e-5)
    mask[0] = -np.inf
    got = gqa_attention(q, k, v, mask)
    assert np.isnan(got.reshape(2, 3, 2, 16)[:, :, 0]).all() and not np.isnan(got.reshape(2, 3, 2, 16)[:, :, 1]).any()


def test_split_kv_refuses_other_programs(monkeypatch):
    """A row program that is no softmax (here softmax times 2) keeps the per-row path; demanding the split path
    then raises instead of computing something else."""
    q, k, v, mask = case(0, 50, 2, 2, 1, 8)
    cx = lm.Graph()
    tq, tk, tv = (cx.tensor(a.shape).set(a) for a in (q, k, v))
    out = (((tq @ tk.transpose(0, 1).transpose(1, 2)).softmax(-1) * 2) @ tv.transpose(0, 1)).output()
    cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
    assert cx.stats().get("Attention") == 1, cx.stats()
    cx.execute()
    want = 2 * sdpa(q * np.sqrt(8), k, v, mask)  # sdpa scales the scores by 1/sqrt(d): undone through q
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=2e-5)
    monkeypatch.setenv("LUMINAL_ATTENTION", "split")
    with pytest.raises(Exception, match="split-KV"):
        cx.execute()


# ---- the session's cache ---------------------------------------------------------------------------------------
def tiny_llama(seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=96, hidden=48, ffn=96, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=8,
                      rope_theta=10000.0, rms_eps=1e-5)
    hc = transformers.LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden, intermediate_size=cfg.ffn,
                                  num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                                  num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                                  rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_eps, max_position_embeddings=4096,
                                  tie_word_embeddings=False)
    ref = transformers.LlamaForCausalLM(hc).eval()
    with torch.no_grad():  # larger attention weights than the default init: peaked, position-dependent softmaxes
        for layer in ref.model.layers:
            layer.self_attn.q_proj.weight.mul_(8)
            layer.self_attn.k_proj.weight.mul_(8)
    return cfg, ref


def test_reserved_cache_never_moves_and_matches_doubling(threads):
    """The default session reserves its cache up front: the arrays stay where they are as the sequence grows, and
    greedy decoding gives the same tokens as a session that starts at 4 rows and doubles (copying) past them."""
    cfg, ref = tiny_llama()
    weights = {k: v.numpy() for k, v in ref.state_dict().items()}
    reserved = Session(Llama(cfg).load_state_dict(weights))
    small = Session(Llama(cfg).load_state_dict(weights), capacity=4)
    assert reserved._capacity >= 4096
    where = [c.__array_interface__["data"][0] for c in reserved._caches]
    prompt = list(np.random.default_rng(1).integers(0, cfg.vocab_size, 5))
    a = list(reserved.generate(prompt, max_new_tokens=40))
    b = list(small.generate(prompt, max_new_tokens=40))
    assert a == b
    assert small._capacity == 64  # grew 4 -> 8 -> ... -> 64
    assert [c.__array_interface__["data"][0] for c in reserved._caches] == where


def test_long_decode_logits_against_float64(seed):
    """Decode steps after a 700-token prompt (split over 2 threads: more than 512 keys) against transformers in
    float64 on the whole sequence."""
    before = lm._core.num_threads()
    lm._core.set_num_threads(2)
    try:
        cfg, ref = tiny_llama()
        sess = Session(Llama(cfg).load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()}))
        ids = list(np.random.default_rng(seed).integers(0, cfg.vocab_size, 700))
        got = [sess.step(ids)[-1]]
        for tok in (3, 14, 15):
            got.append(sess.step([tok])[-1])
        with torch.no_grad():
            want = ref.double()(torch.tensor([ids + [3, 14, 15]])).logits[0, -4:].numpy()
    finally:
        lm._core.set_num_threads(before)
    np.testing.assert_allclose(np.stack(got), want, rtol=1e-4, atol=2e-4, err_msg=f"seed {seed}")
