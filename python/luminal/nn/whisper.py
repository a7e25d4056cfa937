"""Whisper (Radford et al.): a log-mel encoder (two conv1d + gelu, sinusoidal positions, pre-norm transformer) and a
text decoder (learned positions, causal self-attention with a KV cache, cross-attention over the encoder output).

Parameter names are transformers' WhisperForConditionalGeneration's (`model.encoder.conv1.weight`,
`model.decoder.layers.0.encoder_attn.q_proj.weight`, `proj_out.weight`); a WhisperModel state dict (no `model.`
prefix) loads too.

Two graphs: the encoder graph runs once per input and also projects the encoder output to every decoder layer's
cross-attention keys and values; the decoder graph runs once per step. In the decoder graph the new tokens' count `s`
and the cache length `p` are symbolic dims, so one compiled graph serves the prompt and every decode step.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .. import _core
from .. import dtypes as dt
from ..compiler import CPUCompiler, GenericCompiler
from ..functional import arange, where
from ..graph import Graph
from ..tensor import Tensor
from . import functional as F
from .layers import Conv1d
from .hf import activation, config_dict, dataclass_from
from .module import Embedding, LayerNorm, Linear, Module


@dataclass
class WhisperConfig:
    """whisper-tiny by default (openai/whisper-tiny)."""

    vocab_size: int = 51865
    num_mel_bins: int = 80
    d_model: int = 384
    encoder_layers: int = 4
    decoder_layers: int = 4
    encoder_attention_heads: int = 6
    decoder_attention_heads: int = 6
    encoder_ffn_dim: int = 1536
    decoder_ffn_dim: int = 1536
    max_source_positions: int = 1500
    max_target_positions: int = 448
    activation_function: str = "gelu"
    decoder_start_token_id: int = 50258
    eos_token_id: int | None = 50257
    pad_token_id: int | None = 50257
    tie_word_embeddings: bool = True

    @classmethod
    def from_hf(cls, config) -> "WhisperConfig":
        """From a transformers WhisperConfig, a config.json path or a dict."""
        return dataclass_from(cls, config_dict(config))

    @property
    def n_frames(self) -> int:
        """The mel frames the encoder takes (its second conv halves them to max_source_positions)."""
        return 2 * self.max_source_positions


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """(b, s, n_heads * d) -> (b, n_heads, s, d)."""
    b, s, hidden = x.layout.shape
    return x.reshape(b, s, n_heads, int(hidden) // n_heads).transpose(1, 2)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """Scaled dot-product attention over (b, H, s, d) heads, merged back to (b, s, H * d)."""
    b, h, s, d = q.layout.shape
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, s, h * d)


class WhisperAttention(Module):
    """q/k/v/out projections (k without bias, as Whisper has). `kv_graph`: where k_proj and v_proj live, for the
    cross-attention, whose keys and values are computed once per input in the encoder graph."""

    def __init__(self, dim: int, n_heads: int, graph, kv_graph=None):
        super().__init__(graph)
        if dim % n_heads:
            raise ValueError(f"Whisper: d_model {dim} is not a multiple of the head count {n_heads}")
        kv_graph = graph if kv_graph is None else kv_graph
        self.k_proj = Linear(dim, dim, bias=False, graph=kv_graph)
        self.v_proj = Linear(dim, dim, bias=True, graph=kv_graph)
        self.q_proj = Linear(dim, dim, bias=True, graph=graph)
        self.out_proj = Linear(dim, dim, bias=True, graph=graph)
        self.n_heads = n_heads

    def forward(self, x: Tensor) -> Tensor:
        """Self-attention without a mask (the encoder's)."""
        q, k, v = (split_heads(p(x), self.n_heads) for p in (self.q_proj, self.k_proj, self.v_proj))
        return self.out_proj(attend(q, k, v))

    def keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(b, S, dim) -> keys and values as (b, H, S, d)."""
        return split_heads(self.k_proj(x), self.n_heads), split_heads(self.v_proj(x), self.n_heads)

    def cached(self, x, mask, k_cache, v_cache, slots):
        """Causal self-attention over the cache and the new tokens. x: (b, s, dim); k_cache, v_cache: (capacity, b,
        H, d), token-major so that the new rows p..p+s-1 (`slots`) are written by one Scatter each (in place when
        the caller donates the arrays); mask: (s, p+s) of 0 / -inf. Returns the output and the updated caches."""
        b, s, dim = x.layout.shape
        h, d = self.n_heads, int(dim) // self.n_heads
        q = split_heads(self.q_proj(x), h)
        k = self.k_proj(x).reshape(b, s, h, d).transpose(0, 1)  # (s, b, H, d): the cache's row layout
        v = self.v_proj(x).reshape(b, s, h, d).transpose(0, 1)
        k_cache = k_cache.index_copy(0, slots, k)
        v_cache = v_cache.index_copy(0, slots, v)
        t = mask.layout.shape[1]
        keys, vals = (c[:t].permute(1, 2, 0, 3) for c in (k_cache, v_cache))  # (b, H, p+s, d)
        return self.out_proj(attend(q, keys, vals, mask)), k_cache, v_cache

    def cross(self, x: Tensor, keys: Tensor, vals: Tensor) -> Tensor:
        return self.out_proj(attend(split_heads(self.q_proj(x), self.n_heads), keys, vals))


class WhisperEncoderLayer(Module):
    def __init__(self, c: WhisperConfig, graph):
        super().__init__(graph)
        self.self_attn = WhisperAttention(c.d_model, c.encoder_attention_heads, graph)
        self.self_attn_layer_norm = LayerNorm(c.d_model, graph=graph)
        self.fc1 = Linear(c.d_model, c.encoder_ffn_dim, bias=True, graph=graph)
        self.fc2 = Linear(c.encoder_ffn_dim, c.d_model, bias=True, graph=graph)
        self.final_layer_norm = LayerNorm(c.d_model, graph=graph)
        self.act = c.activation_function

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        return x + self.fc2(activation(self.fc1(self.final_layer_norm(x)), self.act))


class WhisperEncoder(Module):
    def __init__(self, c: WhisperConfig, graph):
        super().__init__(graph)
        self.config = c
        self.conv1 = Conv1d(c.num_mel_bins, c.d_model, 3, padding=1, graph=graph)
        self.conv2 = Conv1d(c.d_model, c.d_model, 3, stride=2, padding=1, graph=graph)
        self.embed_positions = Embedding(c.max_source_positions, c.d_model, graph)
        self.layers = [WhisperEncoderLayer(c, graph) for _ in range(c.encoder_layers)]
        self.layer_norm = LayerNorm(c.d_model, graph=graph)

    def forward(self, input_features: Tensor) -> Tensor:
        """(b, n_mels, 2 * max_source_positions) log-mel frames -> (b, max_source_positions, d_model)."""
        c = self.config
        shape = tuple(input_features.shape)
        if len(shape) != 3 or shape[1:] != (c.num_mel_bins, c.n_frames):
            raise ValueError(f"Whisper: input_features must be (batch, {c.num_mel_bins}, {c.n_frames}) (log-mel "
                             f"frames padded to {c.n_frames}), got shape {shape}")
        x = self.conv2(self.conv1(input_features).gelu()).gelu()
        x = x.transpose(1, 2) + self.embed_positions.weight
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


class WhisperDecoderLayer(Module):
    def __init__(self, c: WhisperConfig, graph, encoder_graph):
        super().__init__(graph)
        self.self_attn = WhisperAttention(c.d_model, c.decoder_attention_heads, graph)
        self.self_attn_layer_norm = LayerNorm(c.d_model, graph=graph)
        self.encoder_attn = WhisperAttention(c.d_model, c.decoder_attention_heads, graph, kv_graph=encoder_graph)
        self.encoder_attn_layer_norm = LayerNorm(c.d_model, graph=graph)
        self.fc1 = Linear(c.d_model, c.decoder_ffn_dim, bias=True, graph=graph)
        self.fc2 = Linear(c.decoder_ffn_dim, c.d_model, bias=True, graph=graph)
        self.final_layer_norm = LayerNorm(c.d_model, graph=graph)
        self.act = c.activation_function

    def forward(self, x, mask, k_cache, v_cache, slots, cross_k, cross_v):
        h, k_cache, v_cache = self.self_attn.cached(self.self_attn_layer_norm(x), mask, k_cache, v_cache, slots)
        x = x + h
        x = x + self.encoder_attn.cross(self.encoder_attn_layer_norm(x), cross_k, cross_v)
        x = x + self.fc2(activation(self.fc1(self.final_layer_norm(x)), self.act))
        return x, k_cache, v_cache


class WhisperDecoder(Module):
    def __init__(self, c: WhisperConfig, graph, encoder_graph):
        super().__init__(graph)
        self.embed_tokens = Embedding(c.vocab_size, c.d_model, graph)
        self.embed_positions = Embedding(c.max_target_positions, c.d_model, graph)
        self.layers = [WhisperDecoderLayer(c, graph, encoder_graph) for _ in range(c.decoder_layers)]
        self.layer_norm = LayerNorm(c.d_model, graph=graph)

    def forward(self, tokens: Tensor, caches, cross, p="p"):
        """tokens: (b, s) int32 at positions p..p+s-1 (p symbolic: the tokens already in the caches); caches: per
        layer (k, v) of shape (capacity, b, H, d); cross: per layer (keys, values) (b, H, S, d) of the encoder
        output. Returns the final hidden states (b, s, d_model) and the updated caches."""
        g = self.graph
        s = tokens.layout.shape[1]
        p = _core.to_expr(p)
        slots = arange(p, p + s, graph=g)
        # Key j is hidden from query i when j > p + i: an additive 0 / -inf table shared by the layers.
        mask = where(arange(0, p + s, graph=g).unsqueeze(0).gt(slots.unsqueeze(1)), float("-inf"), 0.0)
        x = self.embed_tokens(tokens) + self.embed_positions.weight[p:p + s]
        new_caches = []
        for layer, (kc, vc), (ck, cv) in zip(self.layers, caches, cross):
            x, kc, vc = layer(x, mask, kc, vc, slots, ck, cv)
            new_caches.append((kc, vc))
        return self.layer_norm(x), new_caches


class WhisperModel(Module):
    """transformers' WhisperModel: `encoder` lives in `encoder_graph`, `decoder` in `graph` (the cross-attention key
    and value projections of the decoder layers in `encoder_graph`, where they are computed)."""

    def __init__(self, config: WhisperConfig, graph: Graph | None = None, encoder_graph: Graph | None = None):
        super().__init__(graph if graph is not None else Graph())
        self.config = config
        self.encoder_graph = encoder_graph if encoder_graph is not None else Graph()
        self.encoder = WhisperEncoder(config, self.encoder_graph)
        self.decoder = WhisperDecoder(config, self.graph, self.encoder_graph)

    def encode(self, input_features: Tensor):
        """Records the encoder: its output (b, S, d_model) and every decoder layer's cross-attention (keys, values)."""
        h = self.encoder(input_features)
        return h, [layer.encoder_attn.keys_values(h) for layer in self.decoder.layers]


class WhisperForConditionalGeneration(Module):
    """transformers' WhisperForConditionalGeneration; run it with a `WhisperSession` (or `generate`)."""

    def __init__(self, config: WhisperConfig, graph: Graph | None = None, encoder_graph: Graph | None = None):
        super().__init__(graph if graph is not None else Graph())
        self.config = config
        self.model = WhisperModel(config, self.graph, encoder_graph)
        self.encoder_graph = self.model.encoder_graph
        self.proj_out = None if config.tie_word_embeddings else \
            Linear(config.d_model, config.vocab_size, bias=False, graph=self.graph)

    def decode(self, tokens: Tensor, caches, cross, p="p", last_only: bool = True):
        """Records a decoder step: logits (b, s, vocab), or (b, vocab) for the last token with `last_only`, and the
        updated caches."""
        x, caches = self.model.decoder(tokens, caches, cross, p)
        if last_only:
            x = x[:, -1]
        head = self.model.decoder.embed_tokens.weight if self.proj_out is None else self.proj_out.weight
        return x.linear(head), caches

    def load_state_dict(self, weights: dict, *args, **kwargs):
        """Takes WhisperForConditionalGeneration's or WhisperModel's names; a tied `proj_out.weight` (transformers
        lists it) is the embedding and is dropped."""
        out = {}
        for k, v in weights.items():
            if k == "proj_out.weight" and self.proj_out is None:
                continue
            out[k if k.startswith(("model.", "proj_out.")) else "model." + k] = v
        return super().load_state_dict(out, *args, **kwargs)

    def generate(self, input_features, max_new_tokens: int = 32, decoder_input_ids=None, compilers=None):
        """Greedy decoding (see WhisperSession.generate), compiling a session on first use."""
        if getattr(self, "_session", None) is None:
            self._session = WhisperSession(self, compilers)
        return self._session.generate(input_features, max_new_tokens, decoder_input_ids)


class WhisperSession:
    """The compiled encoder and decoder-step graphs of a Whisper model, with the decoder's KV cache.

    `encode(features)` runs the encoder and starts a new sequence; `step(ids)` feeds (b, s) tokens after the cached
    ones and returns the last token's logits (b, vocab); `generate` decodes greedily. The caches are token-major
    arrays (max_target_positions, b, H, d) donated to the graph, so each step writes its rows in place."""

    def __init__(self, model: WhisperForConditionalGeneration, compilers=None):
        """`compilers` (default GenericCompiler, CPUCompiler) compile both graphs, the encoder's first."""
        c, g, eg = model.config, model.graph, model.encoder_graph
        self.model, self.graph, self.encoder_graph = model, g, eg
        h, d = c.decoder_attention_heads, c.d_model // c.decoder_attention_heads
        S = c.max_source_positions
        self.features = eg.tensor(("b", c.num_mel_bins, c.n_frames), name="input_features")
        hidden, cross = model.model.encode(self.features)
        self.encoder_out = hidden.output()
        self.cross_out = [(k.output(), v.output()) for k, v in cross]

        self.tokens = g.tensor(("b", "s"), dt.int32, name="decoder_input_ids")
        self.cross_in = [(g.tensor(("b", h, S, d), name=f"cross_k{i}"), g.tensor(("b", h, S, d), name=f"cross_v{i}"))
                         for i in range(c.decoder_layers)]
        self.cache_in = [(g.tensor(("c", "b", h, d), name=f"k_cache{i}"),
                          g.tensor(("c", "b", h, d), name=f"v_cache{i}")) for i in range(c.decoder_layers)]
        logits, new = model.decode(self.tokens, self.cache_in, self.cross_in, "p", last_only=True)
        self.logits = logits.output()
        self.greedy = logits.argmax(-1).output()  # (b,): the next tokens, read back instead of the logits
        self.cache_out = [(k.output(), v.output()) for k, v in new]

        compilers = compilers if compilers is not None else [GenericCompiler(), CPUCompiler()]
        t = time.perf_counter()
        eg.compile(*compilers)
        g.compile(*compilers)
        self.compile_seconds = time.perf_counter() - t
        self.length = 0
        self.batch = None

    def encode(self, input_features) -> np.ndarray:
        """Runs the encoder on (b, n_mels, frames) log-mel features; starts a new sequence. Returns the encoder
        output (b, max_source_positions, d_model)."""
        c = self.model.config
        x = np.ascontiguousarray(input_features, np.float32)
        if x.ndim != 3 or x.shape[1:] != (c.num_mel_bins, c.n_frames):
            raise ValueError(f"Whisper: input_features must be (batch, {c.num_mel_bins}, {c.n_frames}), got "
                             f"{x.shape}")
        self.features.set(x)
        self.encoder_graph.execute()
        for (ki, vi), (ko, vo) in zip(self.cross_in, self.cross_out):
            ki.set(ko.result())
            vi.set(vo.result())
        b = x.shape[0]
        h, d = c.decoder_attention_heads, c.d_model // c.decoder_attention_heads
        self.graph.set_dim("c", c.max_target_positions)
        self._caches = []
        for k, v in self.cache_in:
            for t in (k, v):
                arr = np.zeros((c.max_target_positions, b, h, d), np.float32)
                t.set(arr, donate=True)
                self._caches.append((t, arr))
        self.batch, self.length = b, 0
        return self.encoder_out.numpy()

    def _feed(self, ids):
        if self.batch is None:
            raise RuntimeError("WhisperSession: call encode(features) before feeding tokens")
        ids = np.asarray(ids, np.int32)
        if ids.ndim == 1:
            ids = ids.reshape(self.batch, -1)
        if ids.ndim != 2 or ids.shape[0] != self.batch:
            raise ValueError(f"WhisperSession: token ids must be (batch={self.batch}, n), got {ids.shape}")
        limit = self.model.config.max_target_positions
        if self.length + ids.shape[1] > limit:
            raise ValueError(f"WhisperSession: {self.length} + {ids.shape[1]} tokens exceed the decoder's "
                             f"{limit} positions")
        self.graph.set_dim("p", self.length)
        self.tokens.set(ids)
        self.graph.execute()
        # Caches updated out of place (the reference executor; a GPU backend's device arrays): feed the results back.
        for i, ((t_in, arr), t_out) in enumerate(zip(self._caches, [t for kv in self.cache_out for t in kv])):
            r = t_out.result()
            if not (isinstance(r, np.ndarray) and isinstance(arr, np.ndarray) and np.shares_memory(r, arr)):
                t_in.set(r, donate=True)
                self._caches[i] = (t_in, r)
        self.length += ids.shape[1]

    def step(self, ids) -> np.ndarray:
        """Feeds (b, s) tokens after the cached ones; returns the logits of the last one, (b, vocab)."""
        self._feed(ids)
        return self.logits.numpy()

    def next_tokens(self, ids) -> np.ndarray:
        """Feeds (b, s) tokens; returns the greedy next token of each sequence, (b,)."""
        self._feed(ids)
        return self.greedy.numpy().copy()

    def generate(self, input_features, max_new_tokens: int = 32, decoder_input_ids=None,
                 return_logits: bool = False):
        """Greedy decoding: encodes the features, feeds `decoder_input_ids` (default: the decoder start token) and
        then each argmax, for at most `max_new_tokens` new tokens or until every sequence has given the end token
        (a finished sequence continues with the pad token, as transformers does). Returns the new tokens (b, n),
        with each step's logits (n, b, vocab) if `return_logits`; `self.stats` holds timings."""
        c = self.model.config
        t0 = time.perf_counter()
        self.encode(input_features)
        t1 = time.perf_counter()
        b = self.batch
        ids = np.full((b, 1), c.decoder_start_token_id, np.int32) if decoder_input_ids is None else \
            np.asarray(decoder_input_ids, np.int32).reshape(b, -1)
        out, logits, done = [], [], np.zeros(b, bool)
        steps = []
        for _ in range(max_new_tokens):
            t = time.perf_counter()
            if return_logits:
                logits.append(self.step(ids))
                tok = logits[-1].argmax(-1).astype(np.int32)
            else:
                tok = self.next_tokens(ids)
            steps.append(time.perf_counter() - t)
            if c.eos_token_id is not None:
                if c.pad_token_id is not None:
                    tok = np.where(done, c.pad_token_id, tok).astype(np.int32)
                done |= tok == c.eos_token_id
            out.append(tok)
            if done.all():
                break
            ids = tok.reshape(b, 1)
        self.stats = {"encode_s": t1 - t0, "first_step_s": steps[0] if steps else 0.0,
                      "decode_steps": max(len(steps) - 1, 0), "decode_s": float(sum(steps[1:]))}
        tokens = np.stack(out, 1) if out else np.zeros((b, 0), np.int32)
        return (tokens, np.stack(logits)) if return_logits else tokens
