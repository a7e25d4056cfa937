"""Llama: RMSNorm, rotary embeddings, grouped-query attention with a KV cache, SwiGLU MLP.

One graph serves every step: the new tokens' count `s` and the cache length `p` are symbolic dims, and each
layer's cache goes in as an input of length p and comes out (concatenated) as an output of length p + s.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import numpy as np

from .. import _core
from ..functional import arange, cat, where
from ..graph import Graph
from ..tensor import Tensor
from .module import Embedding, Linear, Module, RMSNorm


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden: int
    ffn: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tie_word_embeddings: bool = False

    @classmethod
    def from_gguf(cls, gguf) -> "LlamaConfig":
        from ..gguf import llama_config

        c = llama_config(gguf)
        return cls(c["vocab_size"], c["hidden"], c["ffn"], c["n_layers"], c["n_heads"], c["n_kv_heads"],
                   c["head_dim"], c["rope_theta"], c["rms_eps"], c["tie_word_embeddings"])

    @classmethod
    def from_hf(cls, config) -> "LlamaConfig":
        """From a Hugging Face config.json path or dict."""
        if isinstance(config, (str, os.PathLike)):
            with open(config) as f:
                config = json.load(f)
        h, nh = config["hidden_size"], config["num_attention_heads"]
        return cls(config["vocab_size"], h, config["intermediate_size"], config["num_hidden_layers"], nh,
                   config.get("num_key_value_heads", nh), config.get("head_dim") or h // nh,
                   float(config.get("rope_theta", 10000.0)), float(config.get("rms_norm_eps", 1e-6)),
                   bool(config.get("tie_word_embeddings", False)))


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return cat([-x[..., half:], x[..., :half]], -1)


def swap_halves(x: Tensor) -> Tensor:
    """rotate_half without the sign: rotate_half(x) * sin == swap_halves(x) * cat([-sin1, sin2]). Folding the sign
    into the (shared) sine table leaves the rotation reading x through views only, so it fuses into one kernel."""
    half = x.shape[-1] // 2
    return cat([x[..., half:], x[..., :half]], -1)


class Attention(Module):
    def __init__(self, c: LlamaConfig, graph):
        super().__init__(graph)
        self.c = c
        self.q_proj = Linear(c.hidden, c.n_heads * c.head_dim, graph=graph)
        self.k_proj = Linear(c.hidden, c.n_kv_heads * c.head_dim, graph=graph)
        self.v_proj = Linear(c.hidden, c.n_kv_heads * c.head_dim, graph=graph)
        self.o_proj = Linear(c.n_heads * c.head_dim, c.hidden, graph=graph)

    def forward(self, x, cos, sin, mask, k_cache, v_cache, slots):
        """x: (s, hidden); cos, sin: (s, d), sin with its first half negated (see swap_halves); mask: (s, p+s); k_cache, v_cache: (capacity, Hkv, d) whose first p rows
        hold the earlier positions; slots: the positions p..p+s-1. Returns the output and the updated caches."""
        c = self.c
        s = x.layout.shape[0]
        q = self.q_proj(x).reshape(s, c.n_heads, c.head_dim).transpose(0, 1)  # (H, s, d)
        k = self.k_proj(x).reshape(s, c.n_kv_heads, c.head_dim)  # (s, Hkv, d): the cache's row layout
        v = self.v_proj(x).reshape(s, c.n_kv_heads, c.head_dim)
        q = q * cos + swap_halves(q) * sin
        k = k * cos.unsqueeze(1) + swap_halves(k) * sin.unsqueeze(1)
        # Token-major caches: this step writes rows p..p+s-1, one Scatter each, which runs in place when the
        # session donates the cache arrays; attention reads rows 0..p+s-1 through views.
        k_cache = k_cache.index_copy(0, slots, k)
        v_cache = v_cache.index_copy(0, slots, v)
        t = mask.layout.shape[1]  # p + s
        keys, vals = k_cache[:t].transpose(0, 1), v_cache[:t].transpose(0, 1)  # (Hkv, p+s, d)
        rep = c.n_heads // c.n_kv_heads
        # Group the query heads that share a KV head: (Hkv, rep*s, d) against (Hkv, p+s, d).
        qg = q.reshape(c.n_kv_heads, s * rep, c.head_dim)
        scores = (qg @ keys.transpose(1, 2)) * (1.0 / math.sqrt(c.head_dim))
        scores = scores.reshape(c.n_kv_heads, rep, s, t) + mask  # mask: 0 or -inf
        out = scores.softmax(-1).reshape(c.n_kv_heads, s * rep, t) @ vals
        out = out.reshape(c.n_heads, s, c.head_dim).transpose(0, 1).reshape(s, c.n_heads * c.head_dim)
        return self.o_proj(out), k_cache, v_cache


class MLP(Module):
    def __init__(self, c: LlamaConfig, graph):
        super().__init__(graph)
        self.gate_proj = Linear(c.hidden, c.ffn, graph=graph)
        self.up_proj = Linear(c.hidden, c.ffn, graph=graph)
        self.down_proj = Linear(c.ffn, c.hidden, graph=graph)

    def forward(self, x):
        return self.down_proj(self.gate_proj(x).silu() * self.up_proj(x))


class TransformerBlock(Module):
    def __init__(self, c: LlamaConfig, graph):
        super().__init__(graph)
        self.self_attn = Attention(c, graph)
        self.mlp = MLP(c, graph)
        self.input_layernorm = RMSNorm(c.hidden, c.rms_eps, graph)
        self.post_attention_layernorm = RMSNorm(c.hidden, c.rms_eps, graph)

    def forward(self, x, cos, sin, mask, k_cache, v_cache, slots):
        h, k, v = self.self_attn(self.input_layernorm(x), cos, sin, mask, k_cache, v_cache, slots)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), k, v


class LlamaModel(Module):
    def __init__(self, c: LlamaConfig, graph):
        super().__init__(graph)
        self.embed_tokens = Embedding(c.vocab_size, c.hidden, graph)
        self.layers = [TransformerBlock(c, graph) for _ in range(c.n_layers)]
        self.norm = RMSNorm(c.hidden, c.rms_eps, graph)


class Llama(Module):
    """LlamaForCausalLM with Hugging Face parameter names. Call `forward(tokens)` once to record the step graph."""

    def __init__(self, c: LlamaConfig, graph: Graph | None = None):
        super().__init__(graph or Graph())
        self.config = c
        self.model = LlamaModel(c, self.graph)
        self.lm_head = None if c.tie_word_embeddings else Linear(c.hidden, c.vocab_size, graph=self.graph)

    def forward(self, tokens: Tensor, caches, p="p", last_only: bool = False):
        """tokens: (s,) int32; caches: per layer (k, v) of shape (capacity, Hkv, d) whose first `p` rows (a symbolic
        dim) hold the positions before these tokens. Returns logits (s, vocab), or (1, vocab) for the last token
        with `last_only`, and the updated caches (rows p..p+s-1 written)."""
        c, g = self.config, self.graph
        s = tokens.layout.shape[0]
        p = _core.to_expr(p)
        # Rotary tables for positions p .. p+s-1 (HF's half-split layout).
        inv_freq = 1.0 / (c.rope_theta ** (np.arange(0, c.head_dim, 2, dtype=np.float64) / c.head_dim))
        self.inv_freq = g.tensor((c.head_dim // 2,), name="inv_freq").set(inv_freq.astype(np.float32))
        slots = arange(p, p + s, graph=g)
        freqs = slots.float().unsqueeze(1) * self.inv_freq.unsqueeze(0)
        cos = cat([freqs, freqs], -1).cos()  # (s, d)
        sin = cat([-freqs.sin(), freqs.sin()], -1)  # the sign of rotate_half folded in (see swap_halves)
        # Causal mask over the cache and the new tokens: key j is hidden from query i when j > p + i. Built once as
        # an additive 0 / -inf table, so each layer's masking fuses into its softmax.
        hidden = arange(0, p + s, graph=g).unsqueeze(0).gt(slots.unsqueeze(1))
        mask = where(hidden, float("-inf"), 0.0)
        x = self.model.embed_tokens(tokens)
        new_caches = []
        for layer, (kc, vc) in zip(self.model.layers, caches):
            x, k, v = layer(x, cos, sin, mask, kc, vc, slots)
            new_caches.append((k, v))
        if last_only:
            x = x[-1:]
        x = self.model.norm(x)
        head = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return x.linear(head), new_caches

    def named_parameters(self, prefix: str = ""):
        for name, t in super().named_parameters(prefix):
            if not name.endswith("inv_freq"):
                yield name, t


# GGUF tensor names -> Hugging Face names.
_GGUF_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}


def gguf_state_dict(gguf, config: LlamaConfig, progress: bool = True, quantized: bool = True) -> dict:
    """Hugging Face-named weights from a GGUF file (q/k rows un-permuted to HF's rotary layout). Block-quantised
    tensors stay packed (`QuantizedWeight`) unless `quantized=False`; the rest become float32."""
    from ..gguf import GGUFFile, unpermute_qk
    from ..quant import BLOCK_BYTES, QuantizedWeight

    g = gguf if isinstance(gguf, GGUFFile) else GGUFFile(gguf)
    names = list(g.tensors)
    if progress:
        from tqdm.auto import tqdm

        names = tqdm(names, desc=f"loading {os.path.basename(str(g.path))}", unit="tensor")
    out = {}
    for name in names:
        t = g.tensors[name]
        packed = quantized and t.type_name in BLOCK_BYTES and len(t.shape) == 2
        w = g.raw(name).reshape(t.shape[0], -1) if packed else g.dequantize(name)
        parts = name.split(".")
        if parts[0] == "token_embd":
            key = "model.embed_tokens.weight"
        elif parts[0] == "output_norm":
            key = "model.norm.weight"
        elif parts[0] == "output":
            key = "lm_head.weight"
        elif parts[0] == "blk" and parts[2] in _GGUF_NAMES:
            key = f"model.layers.{parts[1]}.{_GGUF_NAMES[parts[2]]}.{parts[-1]}"
            if parts[2] == "attn_q":
                w = unpermute_qk(w, config.n_heads)
            elif parts[2] == "attn_k":
                w = unpermute_qk(w, config.n_kv_heads)
        else:
            continue  # e.g. rope_freqs: recomputed from the config
        out[key] = QuantizedWeight(w, t.type_name, tuple(t.shape)) if packed else np.ascontiguousarray(w, np.float32)
        if not np.may_share_memory(out[key].raw if packed else out[key], g.raw(name)):
            g.release(name)  # a copy: the file's pages are not needed in memory any more
    return out
