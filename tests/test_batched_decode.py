"""Batched decode: b sequences per step through one compiled graph (Session(batch=b)), against Hugging Face
transformers' LlamaForCausalLM on the same batch and against decoding each sequence alone, on every backend."""
import numpy as np
import pytest
import torch

import luminal as lm
from luminal.compiler import GenericCompiler
from luminal.nn import Llama, Session

from test_llama import hf_model, tiny_config

pytest.importorskip("transformers")


def reference(cfg, seed):
    """A random LlamaForCausalLM (norms away from 1) and its weights as numpy arrays."""
    torch.manual_seed(seed)
    ref = hf_model(cfg, {})
    for p in ref.parameters():
        if p.ndim == 1:
            p.data.uniform_(0.5, 1.5)
    return ref, {k: v.detach().numpy().copy() for k, v in ref.state_dict().items()}


def random_model(cfg, seed):
    """A luminal Llama with random weights (for configs transformers' Llama does not cover)."""
    model = Llama(cfg)
    rng = np.random.default_rng(seed)
    for name, t in model.named_parameters():
        w = rng.standard_normal(t.shape).astype(np.float32)
        t.set(1.0 + 0.2 * w if name.endswith("norm.weight") else 0.2 * w)
    return model


def compilers(backend):
    return [GenericCompiler()] + backend.compilers("float32")


def test_batch_matches_transformers_and_single(backend, seed):
    """Each sequence of a batch of 3 gets transformers' logits for the batch, and the logits and greedy tokens of
    decoding it alone. Capacity 4: the position-major caches grow (keeping their rows) during the steps."""
    cfg = tiny_config()
    ref, state = reference(cfg, seed)
    ids = np.random.default_rng(seed).integers(0, cfg.vocab_size, (3, 7))
    batch = Session(Llama(cfg).load_state_dict(state), compilers(backend), last_only=False, capacity=4, batch=3)
    got = np.concatenate([batch.step(ids[:, :5]), batch.step(ids[:, 5:6]), batch.step(ids[:, 6:])], axis=1)
    assert got.shape == (3, 7, cfg.vocab_size) and batch._capacity == 8 and batch.length == 7
    with torch.no_grad():
        want = ref(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=f"seed {seed}")

    single = Session(Llama(cfg).load_state_dict(state), compilers(backend), last_only=False, capacity=4)
    for i in range(3):
        single.reset()
        alone = np.concatenate([single.step(ids[i, :5]), single.step(ids[i, 5:])])
        np.testing.assert_allclose(got[i], alone, atol=2e-5, rtol=1e-5, err_msg=f"sequence {i}, seed {seed}")

    # Greedy: generate_batch against each prompt generated alone (which test_llama checks against the logits).
    prompts = ids[:, :5]
    tokens = batch.generate_batch(prompts, 8)
    alone = []
    for p in prompts:
        single.reset()
        alone.append(list(single.generate(p.tolist(), 8)))
    assert tokens == alone and len({t for seq in alone for t in seq}) > 3, f"seed {seed}"
    assert batch.length == 5 + 8 and batch.stats["decode_tokens"] == 8


@pytest.mark.parametrize("kw", [dict(qk_norm=True, sliding_window=3, attention_bias=True),
                                dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)],
                         ids=["qk_norm-window-bias", "moe"])
def test_batch_config_variants_match_single(backend, seed, kw):
    """Qwen-style flags (per-head q/k norms, a sliding window shorter than the sequence, biases) and routed experts
    through the batched path: each sequence's last logits equal its own unbatched session's. max_step_tokens=4
    bounds a step's tokens over the batch: the 4-token prompts of 2 sequences run as 2 steps."""
    cfg = tiny_config(**kw)
    ids = np.random.default_rng(seed).integers(0, cfg.vocab_size, (2, 6))
    batch = Session(random_model(cfg, seed), compilers(backend), batch=2, max_step_tokens=4)
    assert [p.shape for p in batch._pieces(ids[:, :4])] == [(2, 2), (2, 2)]
    single = Session(random_model(cfg, seed), compilers(backend))
    got = [batch.step(ids[:, :4])] + [batch.step(ids[:, j:j + 1]) for j in (4, 5)]
    assert got[0].shape == (2, cfg.vocab_size)
    for i in range(2):
        single.reset()
        alone = [single.step(ids[i, :4])] + [single.step(ids[i, j:j + 1]) for j in (4, 5)]
        for j, (g, a) in enumerate(zip(got, alone)):
            np.testing.assert_allclose(g[i], a[-1], atol=2e-5, rtol=1e-5, err_msg=f"seq {i} step {j}, seed {seed}")


def test_batch_of_one_equals_unbatched(backend, seed):
    cfg = tiny_config()
    _, state = reference(cfg, seed)
    ids = np.random.default_rng(seed).integers(0, cfg.vocab_size, 6)
    one = Session(Llama(cfg).load_state_dict(state), compilers(backend), batch=1)
    plain = Session(Llama(cfg).load_state_dict(state), compilers(backend))
    np.testing.assert_allclose(one.step(ids[None]), plain.step(ids), atol=1e-5, rtol=1e-5)  # both (1, vocab)
    np.testing.assert_allclose(one.step([[3]]), plain.step([3]), atol=1e-5, rtol=1e-5)
    assert one.next_token([[5]]) == [plain.next_token([5])]
    plain.reset()
    assert one.generate_batch([ids], 6) == [list(plain.generate(ids.tolist(), 6))]


def test_left_padding_matches_each_alone(backend, seed):
    """Prompts of lengths 5, 3 and 7 in one batch (Session(left_padding=True)): each sequence's logits are
    transformers' for it alone (the padding hidden, its positions counted from its first token), and its greedy
    tokens those of decoding it alone."""
    cfg = tiny_config()
    ref, state = reference(cfg, seed)
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, cfg.vocab_size, n) for n in (5, 3, 7)]
    batch = Session(Llama(cfg).load_state_dict(state), compilers(backend), last_only=False, capacity=4, batch=3,
                    left_padding=True)
    ids = batch.start_batch(prompts)
    assert ids.shape == (3, 7) and [ids[i, 7 - len(p):].tolist() for i, p in enumerate(prompts)] == \
        [p.tolist() for p in prompts]
    got, nxt = batch.step(ids), batch.step([[1], [2], [3]])
    assert np.isfinite(got).all()  # (the padding's own rows too: each sees at least itself)
    for i, p in enumerate(prompts):
        with torch.no_grad():
            want = ref(torch.tensor([p.tolist() + [i + 1]])).logits[0].numpy()
        np.testing.assert_allclose(got[i, 7 - len(p):], want[:-1], atol=1e-4, rtol=1e-4, err_msg=f"seq {i}")
        np.testing.assert_allclose(nxt[i, 0], want[-1], atol=1e-4, rtol=1e-4, err_msg=f"seq {i}, seed {seed}")
    single = Session(Llama(cfg).load_state_dict(state), compilers(backend), capacity=4)
    alone = []
    for p in prompts:
        single.reset()
        alone.append(list(single.generate(p.tolist(), 6)))
    assert batch.generate_batch(prompts, 6) == alone, f"seed {seed}"


def test_left_padding_with_a_sliding_window(seed):
    """A sliding window (shorter than the prompts) and per-head q/k norms with left padding: each sequence's last
    logits equal its own unbatched session's."""
    cfg = tiny_config(sliding_window=3, qk_norm=True)
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, cfg.vocab_size, n) for n in (2, 6)]
    comps = [GenericCompiler(), lm.CPUCompiler()]
    batch = Session(random_model(cfg, seed), comps, batch=2, left_padding=True)
    single = Session(random_model(cfg, seed), [GenericCompiler(), lm.CPUCompiler()])
    got = [batch.step(batch.start_batch(prompts)), batch.step([[4], [5]])]
    for i, p in enumerate(prompts):
        single.reset()
        alone = [single.step(p), single.step([4 + i])]
        for g, a in zip(got, alone):
            np.testing.assert_allclose(g[i], a[-1], atol=2e-5, rtol=1e-5, err_msg=f"seq {i}, seed {seed}")


@pytest.mark.parametrize("ahead", [False, True])
def test_generate_batch_stops_and_pads(seed, ahead, monkeypatch):
    """Fewer prompts than the batch (padded, then dropped); a stop token ends only its own sequence, and the run
    once every sequence has stopped; `ahead`: the GPU's path, each step queued before the previous token is read."""
    if ahead:
        monkeypatch.setattr(lm.Graph, "queues_runs", property(lambda self: True))
    cfg = tiny_config()
    _, state = reference(cfg, seed)
    prompts = np.random.default_rng(seed).integers(0, cfg.vocab_size, (2, 4))
    sess = Session(Llama(cfg).load_state_dict(state), [GenericCompiler(), lm.CPUCompiler()], capacity=4, batch=3)
    full = sess.generate_batch(prompts, 10)
    assert len(full) == 2 and all(len(t) == 10 for t in full)
    stop = full[0][3]
    k = full[0].index(stop)
    got = sess.generate_batch(prompts, 10, stop_ids={stop})
    assert got[0] == full[0][:k]
    assert got[1] == full[1][:full[1].index(stop) if stop in full[1] else 10]
    both = {full[0][2], full[1][2]}  # each sequence meets one by its third token: the run ends there
    got = sess.generate_batch(prompts, 10, stop_ids=both)
    assert all(len(t) <= 2 for t in got) and sess.length == 4 + max(
        min(i for i, t in enumerate(seq) if t in both) for seq in full)


def test_bad_batched_input(seed):
    cfg = tiny_config()
    _, state = reference(cfg, seed)
    with pytest.raises(ValueError, match="batch must be a positive int"):
        Session(Llama(cfg).load_state_dict(state), [GenericCompiler()], batch=0)
    sess = Session(Llama(cfg).load_state_dict(state), [GenericCompiler()], batch=2)
    with pytest.raises(ValueError, match=r"batch=2 takes tokens of shape \(2, s\), got shape \(3, 4\)"):
        sess.step(np.zeros((3, 4), np.int32))
    with pytest.raises(ValueError, match=r"got shape \(4,\)"):
        sess.step([1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"one \(nonzero\) length, got lengths \[3, 2\]; Session\(left_padding=True\)"):
        sess.generate_batch([[1, 2, 3], [4, 5]], 4)
    with pytest.raises(ValueError, match="got 3 prompts for a Session with batch=2"):
        sess.generate_batch([[1], [2], [3]], 4)
    with pytest.raises(ValueError, match="use generate_batch"):
        next(sess.generate([1, 2], 4))
    with pytest.raises(ValueError, match="left_padding needs a batch"):
        Session(Llama(cfg).load_state_dict(state), [GenericCompiler()], left_padding=True)
    padded = Session(Llama(cfg).load_state_dict(state), [GenericCompiler()], batch=2, left_padding=True)
    with pytest.raises(ValueError, match=r"nonzero\) length, got lengths \[2, 0\]$"):
        padded.generate_batch([[1, 2], []], 4)
    plain = Session(Llama(cfg).load_state_dict(state), [GenericCompiler()])
    with pytest.raises(ValueError, match="batch=b"):
        plain.generate_batch([[1, 2]], 4)
    model = Llama(cfg)
    g = model.graph
    tokens = g.tensor((2, "s"), lm.int32)
    caches = [(g.tensor(("c", cfg.n_kv_heads, cfg.head_dim)),) * 2 for _ in range(cfg.n_layers)]
    with pytest.raises(ValueError, match=r"layer 0's cache has shape \(c, 2, 16\); tokens of shape \(2, s\) need "
                                         r"\(capacity, 2, 2, 16\)"):
        model.forward(tokens, caches)
    with pytest.raises(ValueError, match=r"tokens must be \(s,\) or \(batch, s\), got shape \(1, 2, s\)"):
        model.forward(g.tensor((1, 2, "s"), lm.int32), caches)
    with pytest.raises(ValueError, match=r"starts of shape \(3,\) needs batched tokens of shape \(b, s\) with b its "
                                         r"length, got tokens of shape \(2, s\)"):
        model.forward(tokens, [(g.tensor(("c", 2, cfg.n_kv_heads, cfg.head_dim)),) * 2] * cfg.n_layers,
                      starts=g.tensor((3,), lm.int32))


def test_batched_attention_lowers_like_unbatched(seed):
    """The CUDA lowering (no GPU needed) gives the batched step graph the kernels and variants of the unbatched one;
    with flash attention each layer's attention is one step with the flash variants."""
    cfg = tiny_config()
    kinds = []
    for batch in (None, 3):
        comp = lm.CudaCompiler("bfloat16", device=None, flash_attention=True)
        sess = Session(random_model(cfg, seed), [GenericCompiler(), comp], capacity=4, batch=batch)
        ids = np.random.default_rng(seed).integers(0, cfg.vocab_size, (3,) if batch is None else (batch, 3))
        sess.step(ids)  # (the CUDA lowering runs on the CPU kernels)
        kinds.append([[k for k, _ in vs] for _, vs, _ in comp.schedule.kernels()])
    assert kinds[1] == kinds[0]
    attention = [k for k in kinds[1] if "attention" in k]
    assert len(attention) == cfg.n_layers and all("flash-decode" in k for k in attention), attention
