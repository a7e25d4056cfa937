"""Whisper written with luminal's modules against transformers' WhisperForConditionalGeneration on the same random
weights: the encoder output, and greedy decoding (tokens and each step's logits) through the KV-cache session,
whose one compiled decoder graph serves the prompt and every step."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import luminal as lm
from luminal.nn.whisper import WhisperConfig, WhisperForConditionalGeneration, WhisperSession

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=96, num_mel_bins=8, encoder_layers=2, decoder_layers=2, d_model=32, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=48, max_source_positions=16,
            max_target_positions=24, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=3)


def make_reference(tied: bool = True, seed: int = 0):
    """A tiny transformers Whisper with seeded random weights (every tensor, the sinusoid table too: the model must
    read it from the state dict) and its state dict as numpy arrays."""
    torch.manual_seed(seed)
    ref = transformers.WhisperForConditionalGeneration(
        transformers.WhisperConfig(**TINY, tie_word_embeddings=tied)).eval()
    gen = np.random.default_rng(seed)
    with torch.no_grad():
        for k, v in ref.state_dict().items():
            if k.endswith("bias"):
                new = 0.05 * gen.standard_normal(v.shape)
            elif "norm" in k:
                new = 1 + 0.2 * gen.standard_normal(v.shape)
            elif "embed" in k:
                new = gen.standard_normal(v.shape)
            else:  # a projection or conv filter: unit gain
                new = gen.standard_normal(v.shape) / np.sqrt(np.prod(v.shape[1:]))
            v.copy_(torch.from_numpy(new.astype(np.float32)))
    return ref, {k: v.numpy().copy() for k, v in ref.state_dict().items()}


@pytest.fixture(scope="module")
def tiny():
    return make_reference()


def hf_greedy(ref, x: np.ndarray, prompt: np.ndarray, n: int):
    """transformers' greedy decoding without a cache (the whole sequence each step): tokens (b, n) and the logits
    (n, b, vocab) each step chose from."""
    ids = torch.from_numpy(prompt.astype(np.int64))
    feats = torch.from_numpy(x)
    logits = []
    with torch.no_grad():
        for _ in range(n):
            lg = ref(input_features=feats, decoder_input_ids=ids).logits[:, -1]
            logits.append(lg.numpy())
            ids = torch.cat([ids, lg.argmax(-1, keepdim=True)], 1)
    return ids[:, prompt.shape[1]:].numpy(), np.stack(logits)


def assert_close(got, want, what, rel=1e-4):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, torch gives {want.shape}"
    err, scale = np.abs(got - want).max(), np.abs(want).max()
    assert err <= rel * scale, f"{what}: max abs difference {err:.3g} against an output scale {scale:.3g}"


def session(sd, tied=True, backend=None):
    model = WhisperForConditionalGeneration(WhisperConfig.from_hf({**TINY, "tie_word_embeddings": tied}))
    model.load_state_dict(sd)
    comps = None if backend is None else [lm.GenericCompiler()] + backend.compilers("float32")
    return WhisperSession(model, comps)


def features(rng, batch: int) -> np.ndarray:
    return rng.data((batch, TINY["num_mel_bins"], 2 * TINY["max_source_positions"])).astype(np.float32)


def features_np(seed, batch):
    return np.random.default_rng(seed).standard_normal((batch, TINY["num_mel_bins"], 32)).astype(np.float32)


def test_encoder_matches_transformers(tiny, backend, rng):
    ref, sd = tiny
    x = features(rng, 2)
    got = session(sd, backend=backend).encode(x)
    with torch.no_grad():
        want = ref.model.encoder(torch.from_numpy(x)).last_hidden_state.numpy()
    assert_close(got, want, "encoder last_hidden_state")


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "proj_out"])
def test_greedy_matches_transformers(tied, backend):
    ref, sd = make_reference(tied, seed=1)
    x = features_np(7, 1)  # fixed data: the tokens compared must not hinge on a near tie
    want_tokens, want_logits = hf_greedy(ref, x, np.array([[3]]), 10)
    sess = session(sd, tied, backend)
    g = sess.graph
    nodes, compiles = len(g), len(g.compilers)
    tokens, logits = sess.generate(x, 10, return_logits=True)
    np.testing.assert_array_equal(tokens, want_tokens)
    for i in range(10):
        assert_close(logits[i], want_logits[i], f"step {i} logits")
    assert len(g) == nodes and len(g.compilers) == compiles, "the decoder graph was recompiled"
    # A greedy step that reads back the token only (the argmax computed in the graph) decodes the same tokens.
    np.testing.assert_array_equal(sess.generate(x, 10), want_tokens)


def test_prompt_batch_and_multi_token_steps(tiny, rng):
    """A batch of two, a three-token prompt (s = 3 at p = 0), then two tokens at once at p = 3 (the causal mask's
    offset), then single tokens: every step's last logits against transformers on the same sequence."""
    ref, sd = tiny
    x = features(rng, 2)
    seq = rng.integers(4, TINY["vocab_size"], (2, 9))
    seq[:, 0] = 3
    sess = session(sd)
    sess.encode(x)
    with torch.no_grad():
        full = ref(input_features=torch.from_numpy(x), decoder_input_ids=torch.from_numpy(seq.astype(np.int64)))
    want = full.logits.numpy()
    for lo, hi in [(0, 3), (3, 5), (5, 6), (6, 7), (7, 9)]:
        got = sess.step(seq[:, lo:hi])
        assert_close(got, want[:, hi - 1], f"logits after tokens {lo}..{hi - 1}")
    assert sess.length == 9
    # encode() starts over: the same prompt gives the same logits again.
    sess.encode(x)
    assert_close(sess.step(seq[:, :3]), want[:, 2], "logits after encode() restarted the sequence")


def test_generate_stops_at_the_end_token(tiny):
    ref, sd = tiny
    x = features_np(3, 1)
    want, _ = hf_greedy(ref, x, np.array([[3]]), 6)
    eos = int(want[0, 4])
    first = int(np.argmax(want[0] == eos))  # the first step giving it
    model = WhisperForConditionalGeneration(WhisperConfig.from_hf({**TINY, "eos_token_id": eos})).load_state_dict(sd)
    got = WhisperSession(model).generate(x, 6)
    np.testing.assert_array_equal(got, want[:, :first + 1])


def test_bad_inputs(tiny):
    _, sd = tiny
    sess = session(sd)
    with pytest.raises(RuntimeError, match="encode"):
        sess.step([[3]])
    with pytest.raises(ValueError, match=r"\(batch, 8, 32\).*\(1, 8, 30\)"):
        sess.encode(np.zeros((1, 8, 30), np.float32))
    sess.encode(features_np(0, 1))
    with pytest.raises(ValueError, match=r"batch=1"):
        sess.step(np.array([[3], [3]]))
    with pytest.raises(ValueError, match="exceed the decoder's 24 positions"):
        sess.step(np.full((1, 25), 3))
    model = WhisperForConditionalGeneration(WhisperConfig.from_hf(TINY))
    with pytest.raises(ValueError, match=r"\(batch, 8, 32\).*\(1, 8, 30\)"):
        model.model.encode(model.encoder_graph.tensor((1, 8, 30)))
    bad = dict(sd)
    bad["model.decoder.layers.1.fc1.weight"] = np.zeros((64, 32), np.float32)
    with pytest.raises(ValueError, match=r"decoder\.layers\.1\.fc1\.weight: expected \(48, 32\), got \(64, 32\)"):
        model.load_state_dict(bad)
    with pytest.raises(ValueError, match="not a multiple of the head count"):
        WhisperForConditionalGeneration(WhisperConfig.from_hf({**TINY, "decoder_attention_heads": 5}))
