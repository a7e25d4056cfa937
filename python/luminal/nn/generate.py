"""Running a Llama step graph: prefill once, then one token per step reusing the KV cache; sampling."""
from __future__ import annotations

import time

import numpy as np

from .. import dtypes as dt
from ..compiler import CPUCompiler, GenericCompiler
from .llama import Llama


def sample(logits: np.ndarray, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
           rng: np.random.Generator | None = None) -> int:
    """Greedy when temperature is 0; otherwise softmax(logits / T) restricted to the top-k and the top-p mass."""
    logits = np.asarray(logits, np.float64).reshape(-1)
    if temperature <= 0:
        return int(np.argmax(logits))
    rng = rng or np.random.default_rng()
    z = logits / temperature
    order = np.argsort(-z, kind="stable")
    if top_k > 0:
        order = order[:top_k]
    p = np.exp(z[order] - z[order[0]])
    p /= p.sum()
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p), top_p) + 1)
        order, p = order[:keep], p[:keep] / p[:keep].sum()
    return int(order[rng.choice(len(order), p=p)])


class Session:
    """A compiled step graph with its KV cache. `compilers` default to GenericCompiler + CPUCompiler."""

    def __init__(self, model: Llama, compilers=None, last_only: bool = True):
        c, g = model.config, model.graph
        self.model, self.graph = model, g
        self.tokens = g.tensor(("s",), dt.int32, name="tokens")
        self.cache_in = [(g.tensor((c.n_kv_heads, "p", c.head_dim), name=f"k_cache{i}"),
                          g.tensor((c.n_kv_heads, "p", c.head_dim), name=f"v_cache{i}")) for i in range(c.n_layers)]
        logits, new = model.forward(self.tokens, self.cache_in, last_only=last_only)
        self.logits = logits.output()
        self.cache_out = [(k.output(), v.output()) for k, v in new]
        t = time.perf_counter()
        g.compile(*(compilers if compilers is not None else [GenericCompiler(), CPUCompiler()]))
        self.compile_seconds = time.perf_counter() - t
        self.reset()

    def reset(self):
        c = self.model.config
        empty = np.zeros((c.n_kv_heads, 0, c.head_dim), np.float32)
        self.graph.set_dim("p", 0)
        for k, v in self.cache_in:
            k.set(empty)
            v.set(empty)
        self.length = 0

    def step(self, ids) -> np.ndarray:
        """Feeds tokens after the cached ones; returns their logits."""
        ids = np.asarray(ids, np.int32).reshape(-1)
        self.tokens.set(ids)
        self.graph.execute()
        self.graph.set_dim("p", self.length + len(ids))
        for (ki, vi), (ko, vo) in zip(self.cache_in, self.cache_out):
            ki.set(ko.result())  # no copy: on the GPU the cache never leaves the device
            vi.set(vo.result())
        self.length += len(ids)
        return self.logits.numpy()

    def generate(self, prompt_ids, max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int | None = None, stop_ids=()):
        """Yields new token ids; `self.stats` holds prefill and decode timings afterwards."""
        rng = np.random.default_rng(seed)
        t0 = time.perf_counter()
        logits = self.step(prompt_ids)
        t1 = time.perf_counter()
        self.stats = {"prefill_tokens": len(prompt_ids), "prefill_s": t1 - t0, "decode_tokens": 0, "decode_s": 0.0}
        for _ in range(max_new_tokens):
            tok = sample(logits[-1], temperature, top_k, top_p, rng)
            if tok in stop_ids:
                break
            yield tok
            t = time.perf_counter()
            logits = self.step([tok])
            self.stats["decode_tokens"] += 1
            self.stats["decode_s"] += time.perf_counter() - t
