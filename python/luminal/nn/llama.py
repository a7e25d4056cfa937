"""The Llama family: RMSNorm, rotary embeddings, grouped-query attention with a KV cache, SwiGLU MLPs or routed
experts. Config flags cover Mistral (sliding window), Qwen2 (q/k/v biases), Qwen3 (per-head q/k RMSNorm), and
mixtures of experts (Qwen3-MoE, Mixtral: softmax router, top-k, optional renormalisation).

One graph serves every step: the new tokens' count `s` and the cache length `p` are symbolic dims, and each
layer's cache goes in as an input of length p and comes out (concatenated) as an output of length p + s.

Experts with static shapes: which tokens an expert gets is known only when the graph runs, so a graph cannot give
each expert a batch of its tokens (that batch's size is data). The "routed" form works per (token, chosen expert)
pair instead: a Gather by expert index fetches that expert's weight rows, so s * k expert MLPs are computed and
s * k experts' weights read (decode: the k routed experts only); the "dense" form runs all E experts on every token
and weights them by the routing (zero for the others), reading each expert's weights once.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import numpy as np

from .. import _core
from ..functional import arange, cat, where
from ..graph import Graph
from ..tensor import Tensor
from .module import Embedding, Linear, Module, RMSNorm, _fmt_shape


_HF_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral")
_GGUF_ARCHS = ("llama", "qwen2", "qwen3", "qwen3moe")


@dataclass
class LlamaConfig:
    """The Llama family: Llama, Mistral, Qwen2 (q/k/v biases), Qwen3 (per-head q/k RMSNorm), and mixtures of experts
    (Qwen3-MoE, Mixtral): every difference is a flag here, one model class serves them all."""
    vocab_size: int
    hidden: int
    ffn: int  # the dense MLP's intermediate size (layers without experts)
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # biases on q_proj, k_proj, v_proj (Qwen2; Llama's attention_bias)
    attention_out_bias: bool = False  # a bias on o_proj (Llama's attention_bias; Qwen2 has none there)
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k (q_norm, k_norm) before the rotation
    sliding_window: int | None = None  # a query sees only the last `sliding_window` positions (itself included)
    layer_types: tuple | None = None  # per layer "full_attention" / "sliding_attention"; None: every layer slides
    num_experts: int = 0  # > 0: the MLPs are routed experts (a SparseMoE) except in `mlp_only_layers`
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True  # renormalise the k routing weights to sum to 1 (Mixtral always does)
    mlp_only_layers: tuple = ()
    decoder_sparse_step: int = 1
    model_type: str = "llama"

    def __post_init__(self):
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.n_heads} attention heads cannot be grouped over {self.n_kv_heads} KV heads")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for the rotary embedding")
        if self.num_experts and not (0 < self.num_experts_per_tok <= self.num_experts
                                     and self.moe_intermediate_size > 0):
            raise ValueError(f"a mixture of {self.num_experts} experts needs 1 <= num_experts_per_tok <= "
                             f"{self.num_experts} (got {self.num_experts_per_tok}) and moe_intermediate_size > 0 "
                             f"(got {self.moe_intermediate_size})")
        if self.layer_types is not None:
            self.layer_types = tuple(self.layer_types)
            if len(self.layer_types) != self.n_layers or \
                    not set(self.layer_types) <= {"full_attention", "sliding_attention"}:
                raise ValueError(f"layer_types must give 'full_attention' or 'sliding_attention' for each of the "
                                 f"{self.n_layers} layers, got {self.layer_types}")
        self.mlp_only_layers = tuple(self.mlp_only_layers)

    def is_moe(self, layer: int) -> bool:
        """Whether this layer's MLP is routed experts (Hugging Face's Qwen3-MoE rule)."""
        return self.num_experts > 0 and layer not in self.mlp_only_layers and \
            (layer + 1) % self.decoder_sparse_step == 0

    def is_sliding(self, layer: int) -> bool:
        return self.sliding_window is not None and (
            self.layer_types is None or self.layer_types[layer] == "sliding_attention")

    @classmethod
    def from_gguf(cls, gguf) -> "LlamaConfig":
        """From a GGUF file's metadata: architectures llama (Llama, Mistral, Mixtral), qwen2, qwen3, qwen3moe."""
        from ..gguf import GGUFError, llama_config

        c = llama_config(gguf)
        if c["architecture"] not in _GGUF_ARCHS:
            raise GGUFError(f"{getattr(gguf, 'path', gguf)}: architecture {c['architecture']!r} is not supported "
                            f"(supported: {', '.join(_GGUF_ARCHS)})")
        try:
            return cls(c["vocab_size"], c["hidden"], c["ffn"], c["n_layers"], c["n_heads"], c["n_kv_heads"],
                       c["head_dim"], c["rope_theta"], c["rms_eps"], c["tie_word_embeddings"],
                       attention_bias=c["attention_bias"], attention_out_bias=c["attention_out_bias"],
                       qk_norm=c["qk_norm"], num_experts=c["expert_count"], num_experts_per_tok=c["expert_used_count"],
                       moe_intermediate_size=c["expert_feed_forward_length"], norm_topk_prob=c["expert_weights_norm"],
                       mlp_only_layers=tuple(c["dense_layers"]), model_type=c["architecture"])
        except ValueError as e:  # the hyper-parameters do not fit together
            raise GGUFError(f"{getattr(gguf, 'path', gguf)}: {e}") from None

    @classmethod
    def from_hf(cls, config) -> "LlamaConfig":
        """From a Hugging Face config.json path or dict: model_type llama, mistral, qwen2, qwen3, qwen3_moe or
        mixtral (transformers 4 and 5 spellings)."""
        from ..loaders import ConfigError, UnsupportedConfigError, check_config

        config, source = check_config(config)  # a wrong or missing value: a ConfigError naming the file and key
        mt = config.get("model_type", "llama")
        if mt not in _HF_MODEL_TYPES:
            raise ConfigError(f"{source}: model_type {mt!r} is not supported (supported: "
                              f"{', '.join(_HF_MODEL_TYPES)})")
        if config.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"{source}: {mt}: hidden_act {config['hidden_act']!r} is not supported (only 'silu')")
        if config.get("mlp_bias"):
            raise ConfigError(f"{source}: {mt}: mlp_bias is not supported")
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise UnsupportedConfigError(f"{source}: {mt}: rope_type {rope_type!r} (scaled rotary embeddings) is not "
                                         "supported")
        theta = config.get("rope_theta", rope.get("rope_theta", 10000.0))
        h, nh, n_layers = config["hidden_size"], config["num_attention_heads"], config["num_hidden_layers"]
        kw = {}
        if mt == "qwen2":
            kw.update(attention_bias=True)  # q, k, v only
        elif mt != "mixtral":
            kw.update(attention_bias=bool(config.get("attention_bias")),
                      attention_out_bias=bool(config.get("attention_bias")))
        if mt in ("qwen3", "qwen3_moe"):
            kw.update(qk_norm=True)
        if mt in ("qwen2", "qwen3", "qwen3_moe"):
            window = config.get("sliding_window") if config.get("use_sliding_window") else None
            if window is not None and mt != "qwen3_moe":
                start = config.get("max_window_layers", 28)
                kw.update(layer_types=config.get("layer_types") or [
                    "sliding_attention" if i >= start else "full_attention" for i in range(n_layers)])
        else:
            window = config.get("sliding_window")
        if mt == "qwen3_moe":
            kw.update(num_experts=config.get("num_experts", config.get("num_local_experts")),
                      moe_intermediate_size=config["moe_intermediate_size"],
                      norm_topk_prob=bool(config.get("norm_topk_prob", False)),
                      mlp_only_layers=tuple(config.get("mlp_only_layers") or ()),
                      decoder_sparse_step=config.get("decoder_sparse_step", 1))
        elif mt == "mixtral":
            kw.update(num_experts=config["num_local_experts"], moe_intermediate_size=config["intermediate_size"])
        if kw.get("num_experts"):
            kw.update(num_experts_per_tok=config["num_experts_per_tok"])
        try:
            return cls(config["vocab_size"], h, config["intermediate_size"], n_layers, nh,
                       config.get("num_key_value_heads") or nh, config.get("head_dim") or h // nh,
                       float(theta), float(config.get("rms_norm_eps", 1e-6)),
                       bool(config.get("tie_word_embeddings", False)), sliding_window=window, model_type=mt, **kw)
        except ValueError as e:
            raise ConfigError(f"{source}: {e}") from None


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return cat([-x[..., half:], x[..., :half]], -1)


def swap_halves(x: Tensor) -> Tensor:
    """rotate_half without the sign: rotate_half(x) * sin == swap_halves(x) * cat([-sin1, sin2]). Folding the sign
    into the (shared) sine table leaves the rotation reading x through views only, so it fuses into one kernel."""
    half = x.shape[-1] // 2
    return cat([x[..., half:], x[..., :half]], -1)


def _cache_rows(rows: Tensor) -> Tensor:
    """A view of cache rows as attention reads them: float32. A 16-bit cache (Session(cache_dtype=...)) stores each
    step's new rows rounded to its dtype and is read back through this cast, which AttentionFusion folds into the
    attention kernel (it reads the 16-bit rows directly)."""
    return rows.float()


class Attention(Module):
    def __init__(self, c: LlamaConfig, graph):
        super().__init__(graph)
        self.c = c
        self.q_proj = Linear(c.hidden, c.n_heads * c.head_dim, bias=c.attention_bias, graph=graph)
        self.k_proj = Linear(c.hidden, c.n_kv_heads * c.head_dim, bias=c.attention_bias, graph=graph)
        self.v_proj = Linear(c.hidden, c.n_kv_heads * c.head_dim, bias=c.attention_bias, graph=graph)
        self.o_proj = Linear(c.n_heads * c.head_dim, c.hidden, bias=c.attention_out_bias, graph=graph)
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_eps, graph)
            self.k_norm = RMSNorm(c.head_dim, c.rms_eps, graph)

    def forward(self, x, cos, sin, mask, k_cache, v_cache, slots, batch=None):
        """x: (s, hidden); cos, sin: (s, d), sin with its first half negated (see swap_halves); mask: (s, p+s);
        k_cache, v_cache: (capacity, Hkv, d) whose first p rows hold the earlier positions; slots: the positions
        p..p+s-1. Returns the output and the updated caches. With `batch` b: see `batched`."""
        if batch is not None:
            return self.batched(x, cos, sin, mask, k_cache, v_cache, slots, batch)
        c = self.c
        s = x.layout.shape[0]
        q = self.q_proj(x).reshape(s, c.n_heads, c.head_dim)
        k = self.k_proj(x).reshape(s, c.n_kv_heads, c.head_dim)  # (s, Hkv, d): the cache's row layout
        v = self.v_proj(x).reshape(s, c.n_kv_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.transpose(0, 1)  # (H, s, d)
        q = q * cos + swap_halves(q) * sin
        k = k * cos.unsqueeze(1) + swap_halves(k) * sin.unsqueeze(1)
        # Token-major caches: this step writes rows p..p+s-1, one Scatter each, which runs in place when the
        # session donates the cache arrays; attention reads rows 0..p+s-1 through views.
        k_cache = k_cache.index_copy(0, slots, k.to(k_cache.dtype))
        v_cache = v_cache.index_copy(0, slots, v.to(v_cache.dtype))
        t = mask.layout.shape[1]  # p + s
        keys = _cache_rows(k_cache[:t].transpose(0, 1))  # (Hkv, p+s, d)
        vals = _cache_rows(v_cache[:t].transpose(0, 1))
        rep = c.n_heads // c.n_kv_heads
        # Group the query heads that share a KV head: (Hkv, rep*s, d) against (Hkv, p+s, d).
        qg = q.reshape(c.n_kv_heads, s * rep, c.head_dim)
        scores = (qg @ keys.transpose(1, 2)) * (1.0 / math.sqrt(c.head_dim))
        scores = scores.reshape(c.n_kv_heads, rep, s, t) + mask  # mask: 0 or -inf
        out = scores.softmax(-1).reshape(c.n_kv_heads, s * rep, t) @ vals
        out = out.reshape(c.n_heads, s, c.head_dim).transpose(0, 1).reshape(s, c.n_heads * c.head_dim)
        return self.o_proj(out), k_cache, v_cache

    def batched(self, x, cos, sin, mask, k_cache, v_cache, slots, b):
        """b sequences at the same positions p..p+s-1: x (b*s, hidden), sequence by sequence; k_cache, v_cache
        (capacity, b, Hkv, d). Position-major caches: a step's new keys are s whole rows, written by one Scatter
        in place as unbatched; the other arguments as in forward."""
        c = self.c
        s, d = slots.layout.shape[0], c.head_dim
        if cos.ndim == 3:  # each sequence's own positions (left padding): cos, sin (b, s, d), mask (b, s, p+s)
            cos_q, sin_q = cos.unsqueeze(1), sin.unsqueeze(1)
            cos_k, sin_k = cos.transpose(0, 1).unsqueeze(2), sin.transpose(0, 1).unsqueeze(2)
            mask = mask.unsqueeze(1).unsqueeze(1)
        else:
            cos_q, sin_q = cos, sin
            cos_k, sin_k = cos.reshape(s, 1, 1, d), sin.reshape(s, 1, 1, d)
        q = self.q_proj(x).reshape(b, s, c.n_heads, d)
        k = self.k_proj(x).reshape(b, s, c.n_kv_heads, d)
        v = self.v_proj(x).reshape(b, s, c.n_kv_heads, d)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.transpose(1, 2)  # (b, H, s, d)
        q = q * cos_q + swap_halves(q) * sin_q
        k = k.transpose(0, 1)  # (s, b, Hkv, d): the cache's row layout
        k = k * cos_k + swap_halves(k) * sin_k
        k_cache = k_cache.index_copy(0, slots, k.to(k_cache.dtype))
        v_cache = v_cache.index_copy(0, slots, v.transpose(0, 1).to(v_cache.dtype))
        t = mask.layout.shape[-1]  # p + s
        keys = _cache_rows(k_cache[:t].permute(1, 2, 0, 3))  # (b, Hkv, p+s, d)
        vals = _cache_rows(v_cache[:t].permute(1, 2, 0, 3))
        rep = c.n_heads // c.n_kv_heads
        qg = q.reshape(b, c.n_kv_heads, s * rep, d)  # the query heads sharing a KV head, as unbatched
        scores = (qg @ keys.transpose(2, 3)) * (1.0 / math.sqrt(d))
        scores = scores.reshape(b, c.n_kv_heads, rep, s, t) + mask
        out = scores.softmax(-1).reshape(b, c.n_kv_heads, s * rep, t) @ vals
        out = out.reshape(b, c.n_heads, s, d).transpose(1, 2).reshape(b * s, c.n_heads * d)
        return self.o_proj(out), k_cache, v_cache


class MLP(Module):
    def __init__(self, c: LlamaConfig, graph):
        super().__init__(graph)
        self.gate_proj = Linear(c.hidden, c.ffn, bias=False, graph=graph)
        self.up_proj = Linear(c.hidden, c.ffn, bias=False, graph=graph)
        self.down_proj = Linear(c.ffn, c.hidden, bias=False, graph=graph)

    def forward(self, x):
        return self.down_proj(self.gate_proj(x).silu() * self.up_proj(x))


def _expert_rows(table: Tensor, experts: Tensor, rows: int) -> Tensor:
    """The `rows` rows of each chosen expert in a row-stacked (E * rows, cols) table: experts (s, k) -> (s, k, rows,
    cols), one Gather (on packed weights the core moves it before the unpacking: only these rows are read)."""
    s, k = experts.layout.shape
    idx = experts.unsqueeze(-1) * rows + arange(0, rows, graph=table.graph)  # (s, k, rows)
    return table.index_select(0, idx.reshape(-1)).reshape(s, k, rows, table.shape[1])


class Experts(Module):
    """`num_experts` SwiGLU MLPs, stacked by rows as 2-D parameters so that quantised experts stay packed:
    gate_up_proj (E * 2I, hidden), expert e's gate rows then its up rows from row 2I*e (transformers 5's
    `experts.gate_up_proj` (E, 2I, hidden) with its first two dims merged); down_proj (E * hidden, I)."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, graph):
        super().__init__(graph)
        self.num_experts, self.hidden, self.intermediate = num_experts, hidden, intermediate
        self.gate_up_proj = self.param(num_experts * 2 * intermediate, hidden)
        self.down_proj = self.param(num_experts * hidden, intermediate)

    def routed(self, x: Tensor, weights: Tensor, experts: Tensor) -> Tensor:
        """Sparse: each token runs only its k experts. x: (s, hidden); weights, experts: (s, k). Each (token,
        expert) pair gathers that expert's weight rows by index and multiplies them with the token: s * k expert
        MLPs computed, and s * k experts' weights read (at decode, s = 1: exactly the k routed experts). The k
        outputs of a token are summed with its routing weights."""
        s, hdim, inter = x.layout.shape[0], self.hidden, self.intermediate
        gate_up = _expert_rows(self.gate_up_proj, experts, 2 * inter)  # (s, k, 2I, hidden)
        h = (gate_up * x.reshape(s, 1, 1, hdim)).sum(-1)  # (s, k, 2I): a matrix-vector product per pair
        a = h[..., :inter].silu() * h[..., inter:] * weights.unsqueeze(-1)
        down = _expert_rows(self.down_proj, experts, hdim)  # (s, k, hidden, I)
        return (down * a.unsqueeze(2)).sum(-1).sum(1)

    def dense(self, x: Tensor, weights: Tensor, experts: Tensor) -> Tensor:
        """Every expert on every token, weighted by the routing weights (zero for experts not routed to): E MLPs
        per token, but each expert's weights are read once however many tokens there are."""
        s, e, hdim, inter = x.layout.shape[0], self.num_experts, self.hidden, self.intermediate
        chosen = arange(0, e, graph=x.graph).eq(experts.unsqueeze(-1))  # (s, k, E)
        w = (chosen.to(weights.dtype) * weights.unsqueeze(-1)).sum(1)  # (s, E)
        h = x.linear(self.gate_up_proj).reshape(s, e, 2 * inter)
        a = h[..., :inter].silu() * h[..., inter:] * w.unsqueeze(-1)  # (s, E, I)
        down = self.down_proj.reshape(e, hdim, inter)
        return (down.unsqueeze(0) * a.unsqueeze(2)).sum(-1).sum(1)


class SparseMoE(Module):
    """A mixture-of-experts MLP (Qwen3-MoE's `mlp`, Mixtral's `block_sparse_moe`): a linear router (`gate`), softmax
    over the experts, the top k of them per token (weights renormalised to sum to 1 with norm_topk_prob), and the
    routed experts' outputs summed with those weights. `form`: "routed" (Experts.routed, the default) or "dense"
    (Experts.dense); both compute the same function."""

    FORMS = ("routed", "dense")
    ROUTED_STEP_TOKENS = 16  # Session's default bound on a step's tokens for the routed form (Llama.step_tokens)

    def __init__(self, c: LlamaConfig, graph, form: str = "routed"):
        super().__init__(graph)
        if form not in self.FORMS:
            raise ValueError(f"unknown MoE form {form!r} (choose from {', '.join(self.FORMS)})")
        self.top_k, self.norm_topk_prob, self.form = c.num_experts_per_tok, c.norm_topk_prob, form
        self.gate = Linear(c.hidden, c.num_experts, bias=False, graph=graph)
        self.experts = Experts(c.num_experts, c.hidden, c.moe_intermediate_size, graph)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(weights, experts), each (s, k): the k most probable experts of each token and their weights."""
        weights, experts = self.gate(x).softmax(-1).topk(self.top_k, -1)
        experts = experts.int()
        if self.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights, experts

    def forward(self, x: Tensor) -> Tensor:
        weights, experts = self.route(x)
        return (self.experts.routed if self.form == "routed" else self.experts.dense)(x, weights, experts)


class TransformerBlock(Module):
    def __init__(self, c: LlamaConfig, graph, layer: int = 0, moe_form: str = "routed"):
        super().__init__(graph)
        self.self_attn = Attention(c, graph)
        self.mlp = SparseMoE(c, graph, moe_form) if c.is_moe(layer) else MLP(c, graph)
        self.input_layernorm = RMSNorm(c.hidden, c.rms_eps, graph)
        self.post_attention_layernorm = RMSNorm(c.hidden, c.rms_eps, graph)

    def forward(self, x, cos, sin, mask, k_cache, v_cache, slots, batch=None):
        h, k, v = self.self_attn(self.input_layernorm(x), cos, sin, mask, k_cache, v_cache, slots, batch)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), k, v


class LlamaModel(Module):
    def __init__(self, c: LlamaConfig, graph, moe_form: str = "routed"):
        super().__init__(graph)
        self.embed_tokens = Embedding(c.vocab_size, c.hidden, graph)
        self.layers = [TransformerBlock(c, graph, i, moe_form) for i in range(c.n_layers)]
        self.norm = RMSNorm(c.hidden, c.rms_eps, graph)


class Llama(Module):
    """A causal LM of the Llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
    Qwen3MoeForCausalLM, MixtralForCausalLM, as the config says) with Hugging Face parameter names. Call
    `forward(tokens)` once to record the step graph. `moe_form`: how routed experts are computed (see SparseMoE)."""

    def __init__(self, c: LlamaConfig, graph: Graph | None = None, moe_form: str = "routed"):
        if moe_form not in SparseMoE.FORMS:
            raise ValueError(f"unknown MoE form {moe_form!r} (choose from {', '.join(SparseMoE.FORMS)})")
        super().__init__(graph if graph is not None else Graph())
        self.config = c
        self.model = LlamaModel(c, self.graph, moe_form)
        self.lm_head = None if c.tie_word_embeddings else Linear(c.hidden, c.vocab_size, bias=False, graph=self.graph)

    def forward(self, tokens: Tensor, caches, p="p", last_only: bool = False, starts: Tensor | None = None):
        """tokens: (s,) int32; caches: per layer (k, v) of shape (capacity, Hkv, d) whose first `p` rows (a symbolic
        dim) hold the positions before these tokens. Returns logits (s, vocab), or (1, vocab) for the last token
        with `last_only`, and the updated caches (rows p..p+s-1 written).

        Batched: tokens (b, s), b sequences all at positions p..p+s-1, and caches (capacity, b, Hkv, d) (row i
        holds position i of every sequence); logits (b, s, vocab), or (b, vocab) with `last_only`. The linear
        layers see the b*s tokens as one matrix; only attention tells the sequences apart. `starts` (b,) int32: left
        padding, sequence i's first real token is at cache row starts[i]; its positions count from there, and the
        rows before it are hidden from it."""
        c, g = self.config, self.graph
        if tokens.ndim not in (1, 2):
            raise ValueError(f"Llama: tokens must be (s,) or (batch, s), got shape {_fmt_shape(tokens.shape)}")
        batch = tokens.layout.shape[0] if tokens.ndim == 2 else None
        row = (c.n_kv_heads, c.head_dim) if batch is None else (batch, c.n_kv_heads, c.head_dim)
        for i, pair in enumerate(caches):
            for t in pair:
                if t.ndim != len(row) + 1 or tuple(t.layout.shape[1:]) != tuple(_core.to_expr(n) for n in row):
                    raise ValueError(f"Llama: layer {i}'s cache has shape {_fmt_shape(t.shape)}; tokens of shape "
                                     f"{_fmt_shape(tokens.shape)} need (capacity, {', '.join(map(str, row))})")
        if starts is not None and (batch is None or starts.ndim != 1 or
                                   _core.to_expr(starts.layout.shape[0]) != _core.to_expr(batch)):
            raise ValueError(f"Llama: starts of shape {_fmt_shape(starts.shape)} needs batched tokens of shape "
                             f"(b, s) with b its length, got tokens of shape {_fmt_shape(tokens.shape)}")
        s = tokens.layout.shape[-1]
        if batch is not None:
            tokens = tokens.reshape(-1)  # (b*s,): sequence by sequence
        p = _core.to_expr(p)
        # Rotary tables for positions p .. p+s-1 (HF's half-split layout).
        inv_freq = 1.0 / (c.rope_theta ** (np.arange(0, c.head_dim, 2, dtype=np.float64) / c.head_dim))
        self.inv_freq = g.tensor((c.head_dim // 2,), name="inv_freq").set(inv_freq.astype(np.float32))
        slots = arange(p, p + s, graph=g)
        if starts is None:
            freqs = slots.float().unsqueeze(1) * self.inv_freq.unsqueeze(0)
        else:  # (b, s, d/2): position 0 at each sequence's start
            freqs = (slots.unsqueeze(0) - starts.unsqueeze(1)).float().unsqueeze(-1) * self.inv_freq
        cos = cat([freqs, freqs], -1).cos()  # (s, d)
        sin = cat([-freqs.sin(), freqs.sin()], -1)  # the sign of rotate_half folded in (see swap_halves)
        # Causal mask over the cache and the new tokens: key j is hidden from query i when j > p + i (and, in a
        # sliding-window layer, when j <= p + i - window). Built once as an additive 0 / -inf table, so each
        # layer's masking fuses into its softmax.
        keys = arange(0, p + s, graph=g).unsqueeze(0)
        hidden = keys.gt(slots.unsqueeze(1))
        if starts is not None:  # (b, s, p+s): padding hidden, except from its own position (a query seeing no
            # key would give a NaN row, and NaN keys and values in the cache)
            hidden = hidden | (keys.lt(starts.reshape(-1, 1, 1)) & keys.ne(slots.unsqueeze(1)))
        mask = where(hidden, float("-inf"), 0.0)
        if any(c.is_sliding(i) for i in range(c.n_layers)):
            old = keys.le(slots.unsqueeze(1) - c.sliding_window)
            window_mask = where(hidden | old, float("-inf"), 0.0)
        x = self.model.embed_tokens(tokens)
        new_caches = []
        for i, (layer, (kc, vc)) in enumerate(zip(self.model.layers, caches)):
            x, k, v = layer(x, cos, sin, window_mask if c.is_sliding(i) else mask, kc, vc, slots, batch)
            new_caches.append((k, v))
        if batch is not None:
            x = x.reshape(batch, s, c.hidden)
            if last_only:
                x = x[:, -1]
        elif last_only:
            x = x[-1:]
        x = self.model.norm(x)
        head = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return x.linear(head), new_caches

    @property
    def step_tokens(self) -> int | None:
        """The most tokens a Session feeds in one step by default: None (any), or SparseMoE.ROUTED_STEP_TOKENS when
        experts are routed, whose step gathers s * k experts' weight rows (a long prompt at once could take more
        memory than the model)."""
        routed = any(isinstance(layer.mlp, SparseMoE) and layer.mlp.form == "routed" for layer in self.model.layers)
        return SparseMoE.ROUTED_STEP_TOKENS if routed else None

    def named_parameters(self, prefix: str = ""):
        for name, t in super().named_parameters(prefix):
            if not name.endswith("inv_freq"):
                yield name, t

    def load_state_dict(self, state, strict: bool = True, source: str | None = None):
        """Module.load_state_dict after `convert_state_dict`: also takes checkpoints that store experts one by one
        (Qwen3-MoE's mlp.experts.N.gate_proj.weight, Mixtral's block_sparse_moe.experts.N.w1.weight) or as
        transformers 5 holds them in memory (mlp.experts.gate_up_proj of shape (E, 2I, hidden))."""
        if isinstance(state, (str, os.PathLike)):
            from ..loaders import load_safetensors

            source = source or os.fspath(state)
            state = load_safetensors(state)
        return super().load_state_dict(convert_state_dict(state), strict, source)


_PER_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
_PER_EXPERT_ROLE = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def _numpy(v) -> np.ndarray:
    if hasattr(v, "detach"):  # a torch tensor
        v = v.detach().cpu()
        return (v.float() if str(v.dtype) == "torch.bfloat16" else v).numpy()
    return np.asarray(v)


def convert_state_dict(state: dict) -> dict:
    """Hugging Face checkpoint names and layouts -> this module's: Mixtral's `block_sparse_moe` is `mlp`; experts
    stored one by one are stacked into Experts' row-stacked `gate_up_proj` / `down_proj`; transformers 5's 3-D
    expert tensors are reshaped to 2-D. Other entries pass through untouched (an expert list with a gap too, so
    that loading reports it)."""
    out, experts = {}, {}
    for name, v in state.items():
        name = name.replace(".block_sparse_moe.", ".mlp.")
        m = _PER_EXPERT.match(name)
        if m:
            experts.setdefault(m.group(1), {})[(int(m.group(2)), _PER_EXPERT_ROLE.get(m.group(3), m.group(3)))] = \
                (name, v)
        elif name.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")) and len(v.shape) == 3:
            out[name] = _numpy(v).reshape(-1, v.shape[2])
        else:
            out[name] = v
    for prefix, parts in experts.items():
        n = 1 + max(e for e, _ in parts)
        if set(parts) != {(e, r) for e in range(n) for r in ("gate_proj", "up_proj", "down_proj")}:
            out.update(dict(parts.values()))
            continue
        gate_up = np.stack([np.concatenate([_numpy(parts[e, "gate_proj"][1]), _numpy(parts[e, "up_proj"][1])])
                            for e in range(n)])
        out[f"{prefix}.gate_up_proj"] = gate_up.reshape(-1, gate_up.shape[-1])
        out[f"{prefix}.down_proj"] = np.concatenate([_numpy(parts[e, "down_proj"][1]) for e in range(n)])
    return out


# GGUF tensor names -> Hugging Face names.
_GGUF_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", "ffn_gate_inp": "mlp.gate",
}
_GGUF_EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
# llama.cpp's converter reorders q/k rows into interleaved rotary pairs for the llama architecture only; Qwen
# models rotate half-split (NeoX style), as Hugging Face does, and keep their rows.
_GGUF_PERMUTED_QK = ("llama",)


def gguf_state_dict(gguf, config: LlamaConfig, progress: bool = True, quantized: bool = True) -> dict:
    """Hugging Face-named weights from a GGUF file (q/k rows un-permuted to HF's rotary layout where the converter
    permuted them). Block-quantised tensors stay packed (`QuantizedWeight`) unless `quantized=False`; the rest
    become float32. Expert tensors (blk.N.ffn_{gate,up,down}_exps, (E, rows, cols)) become Experts' row-stacked
    gate_up_proj and down_proj, packed as well."""
    from ..gguf import GGUFError, GGUFFile, unpermute_qk
    from ..quant import BLOCK_BYTES, QuantizedWeight

    g = gguf if isinstance(gguf, GGUFFile) else GGUFFile(gguf)
    arch = g.metadata.get("general.architecture", "llama")
    names = list(g.tensors)
    if progress:
        from tqdm.auto import tqdm

        names = tqdm(names, desc=f"loading {os.path.basename(str(g.path))}", unit="tensor")
    out, experts = {}, {}
    for name in names:
        t = g.tensors[name]
        parts = name.split(".")
        if parts[0] == "blk" and len(parts) != 4:
            raise GGUFError(f"{g.path}: tensor {name!r}: experts stored one by one (an old Mixtral conversion) are "
                            "not supported; convert the model again with a current llama.cpp")
        if parts[0] == "blk" and parts[2] in _GGUF_EXPERTS:
            have = experts.setdefault(parts[1], {})
            have[parts[2]] = name
            if parts[2] == "ffn_down_exps":
                out[f"model.layers.{parts[1]}.mlp.experts.down_proj"] = _gguf_experts(g, [name], quantized)
            elif "ffn_gate_exps" in have and "ffn_up_exps" in have:
                out[f"model.layers.{parts[1]}.mlp.experts.gate_up_proj"] = _gguf_experts(
                    g, [have["ffn_gate_exps"], have["ffn_up_exps"]], quantized)
            continue
        packed = quantized and t.type_name in BLOCK_BYTES and len(t.shape) == 2
        w = g.raw(name).reshape(t.shape[0], -1) if packed else g.dequantize(name)
        if parts[0] == "token_embd":
            key = "model.embed_tokens.weight"
        elif parts[0] == "output_norm":
            key = "model.norm.weight"
        elif parts[0] == "output":
            key = "lm_head.weight"
        elif parts[0] == "blk" and parts[2] in _GGUF_NAMES:
            key = f"model.layers.{parts[1]}.{_GGUF_NAMES[parts[2]]}.{parts[-1]}"
            if parts[2] == "attn_q" and arch in _GGUF_PERMUTED_QK:
                w = unpermute_qk(w, config.n_heads)
            elif parts[2] == "attn_k" and arch in _GGUF_PERMUTED_QK:
                w = unpermute_qk(w, config.n_kv_heads)
        else:
            continue  # e.g. rope_freqs: recomputed from the config
        out[key] = QuantizedWeight(w, t.type_name, tuple(t.shape)) if packed else np.ascontiguousarray(w, np.float32)
        if not np.may_share_memory(out[key].raw if packed else out[key], g.raw(name)):
            g.release(name)  # a copy: the file's pages are not needed in memory any more
    return out


def _gguf_experts(g, names: list, quantized: bool):
    """GGUF expert tensors (E, rows, cols), [down] or [gate, up], as one row-stacked (E * rows', cols) weight: gate
    and up interleaved per expert (expert e's gate rows, then its up rows). Packed when all share a block type."""
    from ..quant import BLOCK_BYTES, QuantizedWeight

    ts = [g.tensors[n] for n in names]
    e, cols = ts[0].shape[0], ts[0].shape[-1]
    rows = sum(t.shape[1] for t in ts)
    if quantized and len({t.type_name for t in ts}) == 1 and ts[0].type_name in BLOCK_BYTES:
        raw = [g.raw(n).reshape(e, t.shape[1], -1) for n, t in zip(names, ts)]
        raw = raw[0] if len(raw) == 1 else np.concatenate(raw, axis=1)
        w = QuantizedWeight(raw.reshape(e * rows, -1), ts[0].type_name, (e * rows, cols))
    else:
        w = np.concatenate([g.dequantize(n) for n in names], axis=1).reshape(e * rows, cols).astype(np.float32)
    if len(names) > 1 or not quantized or not isinstance(w, QuantizedWeight):
        for n in names:
            g.release(n)  # copied out
    return w
