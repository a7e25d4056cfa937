"""Running a Llama step graph: prefill once, then one token per step reusing the KV cache; sampling."""
from __future__ import annotations

import math
import mmap
import os
import time

import numpy as np

from .. import _core
from .. import dtypes as dt
from ..compiler import CPUCompiler, GenericCompiler
from .llama import Llama

_MADV_POPULATE_WRITE = 23  # Linux's value; Python's mmap module names it from 3.13


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


def _cache_dtype(d) -> dt.DType:
    """Session's cache_dtype: None (float32), or float32/bfloat16/float16 by name or luminal dtype."""
    if d is None:
        return dt.float32
    try:
        t = dt.dtype(d)
    except TypeError:
        t = None
    if t not in (dt.float32, dt.bfloat16, dt.float16):
        raise ValueError(f"Session: cache_dtype must be None, 'float32', 'bfloat16' or 'float16', got {d!r}")
    return t


def _same_buffer(a, b) -> bool:
    """Whether two results share memory (a host array, or a GPU DeviceArray updated in place)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    return hasattr(a, "ptr") and hasattr(b, "ptr") and a.ptr == b.ptr


class Session:
    """A compiled step graph with its KV cache. `compilers` default to GenericCompiler + CPUCompiler.

    The caches are token-major arrays (capacity, Hkv, d) donated to the graph, so each step writes its new rows in
    place. On the host they are views of one anonymous memory map whose pages stay unbacked until written, so the
    default reserves `max_context` rows up front: rows cost memory only once a step writes them, and the cache never
    moves as the sequence grows. Past that (or past an explicit `capacity`, and always on a GPU, where the arrays
    are device memory: 256 rows by default) the capacity doubles with one copy.

    `max_step_tokens`: longer inputs (prompts) run as several steps of at most this many tokens (the same graph),
    which bounds the memory a step's intermediates take; by default the model's `step_tokens` (a bound only when
    routed experts gather s * k experts' weights per step), 0 for no bound.

    `batch`: b sequences decoded together through one graph (fixed at b), all at the same position: `step` and
    `next_token` take tokens (b, s) and return (b, vocab) logits (the last position's with last_only, else
    (b, s, vocab)) or b greedy tokens; `generate_batch` decodes b prompts of equal length greedily. The caches
    are (capacity, b, Hkv, d): row i holds position i of every sequence. A step's tokens are those of every
    sequence (max_step_tokens bounds b * s). `left_padding`: prompts of different
    lengths too (`start_batch`), each left-padded to the longest, the padding hidden from its sequence.

    `cache_dtype`: the caches' element type, float32 (the default, None) or a 16-bit "bfloat16"/"float16" (a name or
    a luminal dtype), which halves their memory and the bytes attention reads: each step's new keys and values are
    rounded to it when written, and attention reads them back as float32 (on CUDA and the CPU backend, the fused
    attention kernel reads the 16-bit rows directly). On the host a bfloat16 cache is held as its raw bits
    (uint16 arrays)."""

    def __init__(self, model: Llama, compilers=None, last_only: bool = True, capacity: int | None = None,
                 max_step_tokens: int | None = None, max_context: int = 32768, batch: int | None = None,
                 left_padding: bool = False, cache_dtype=None):
        c, g = model.config, model.graph
        self.cache_dtype = _cache_dtype(cache_dtype)
        if batch is not None and (not isinstance(batch, (int, np.integer)) or batch < 1):
            raise ValueError(f"batch must be a positive int (or None for one unbatched sequence), got {batch!r}")
        self.batch = None if batch is None else int(batch)
        if left_padding and batch is None:
            raise ValueError("left_padding needs a batch (Session(batch=b, left_padding=True))")
        # One cache row: a position's keys (or values), of every sequence when batched.
        self._row = (c.n_kv_heads, c.head_dim) if batch is None else (self.batch, c.n_kv_heads, c.head_dim)
        if max_step_tokens is None:
            max_step_tokens = getattr(model, "step_tokens", None)
        elif max_step_tokens < 0:
            raise ValueError(f"max_step_tokens must be positive (or 0 for no bound), got {max_step_tokens}")
        max_step_tokens = max_step_tokens or None
        self.model, self.graph = model, g
        self.last_only, self.max_step_tokens = last_only, max_step_tokens
        self.tokens = g.tensor(("s",) if batch is None else (self.batch, "s"), dt.int32, name="tokens")
        self.cache_in = [(g.tensor(("c", *self._row), self.cache_dtype, name=f"k_cache{i}"),
                          g.tensor(("c", *self._row), self.cache_dtype, name=f"v_cache{i}")) for i in range(c.n_layers)]
        # Where each sequence starts (left padding): set by start_batch, zeros after reset.
        self.starts = g.tensor((self.batch,), dt.int32, name="starts") if left_padding else None
        logits, new = model.forward(self.tokens, self.cache_in, "p", last_only=last_only, starts=self.starts)
        self.logits = logits.output()
        # The greedy next token, computed in the graph: a greedy step reads it back (4 bytes), not the logits (a GPU
        # step would otherwise copy the whole vocabulary row to the host to argmax it there). Shaped (1,) like
        # `tokens` ((b, 1) batched), so that greedy decoding feeds it to the next step as it is, without the host.
        if batch is None:
            self.greedy = logits[-1].argmax(keepdim=True).output()
        else:
            self.greedy = (logits if last_only else logits[:, -1]).argmax(-1, keepdim=True).output()
        self.cache_out = [(k.output(), v.output()) for k, v in new]
        t = time.perf_counter()
        g.compile(*(compilers if compilers is not None else [GenericCompiler(), CPUCompiler()]))
        self.compile_seconds = time.perf_counter() - t
        self._cache_inputs = [x for pair in self.cache_in for x in pair]
        self._cache_outputs = [x for pair in self.cache_out for x in pair]
        self._caches: list[np.ndarray] = []
        if capacity is None:
            capacity = 256 if g.queues_runs else self._host_reservation(max_context)
        self._capacity = max(1, capacity)
        self.reset()

    def _host_reservation(self, rows: int) -> int:
        """`rows` cache rows, or fewer where their address space would exceed half the physical memory (an
        anonymous shared map is charged in full against the commit limit when created, though unbacked)."""
        row_bytes = self.cache_dtype.itemsize * len(self._cache_inputs) * math.prod(self._row)
        try:
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            ram = 1 << 32
        return max(256, min(rows, ram // 2 // row_bytes))

    def reset(self):
        """Starts a new sequence (the cache arrays are kept)."""
        self.length = 0
        if self.starts is not None:
            self.starts.set(np.zeros(self.batch, np.int32))
        if not self._caches:
            self._give_caches(self._capacity)

    def _give_caches(self, capacity: int, need: int = 0):
        """(Re)allocates the cache arrays with `capacity` rows (at least `need` where memory is short), keeping the
        first `length`, and donates them."""
        ins = self._cache_inputs
        # One anonymous memory map for all of them: its pages are zero until written, so only the rows in use take
        # memory (np.zeros would ask for huge pages, and one row written would make 2 MiB resident).
        while True:
            shape = (len(ins), capacity, *self._row)
            try:
                self._map = mmap.mmap(-1, self.cache_dtype.itemsize * math.prod(shape))
                break
            except OSError:  # a strict commit limit: reserve less (the capacity doubles later if needed)
                if capacity // 2 < max(need, 256):
                    raise
                capacity //= 2
        self._resident = 0  # rows made resident ahead of use (see _reserve)
        # (bfloat16 as its raw bits, which set() takes as they are and a GPU result's numpy() gives back)
        block = np.frombuffer(self._map, np.uint16 if self.cache_dtype is dt.bfloat16 else self.cache_dtype.np)
        block = block.reshape(shape)
        self.graph.set_dim("c", capacity)
        for i, t in enumerate(ins):
            if self._caches:
                old = self._caches[i]  # a DeviceArray on the GPU: comes to the host only when the capacity grows
                block[i, : self.length] = (old if isinstance(old, np.ndarray) else old.numpy())[: self.length]
            t.set(block[i], donate=True)
        self._caches = list(block)
        self._capacity = capacity

    def _reserve(self, rows: int):
        """Makes the cache rows up to `rows` (and up to 8 more) resident with one call per cache, ahead of the
        steps that write them: a page fault per new page, taken one at a time inside the step, costs more than the
        rest of the cache update (measured ~30 us each on a VM, ~11 per decode step for SmolLM2)."""
        if rows <= self._resident or not isinstance(self._caches[0], np.ndarray):  # a GPU keeps its own
            return
        end = min(self._capacity, max(rows, self._resident + 8))
        per_row = self._caches[0][0].nbytes
        page = mmap.PAGESIZE
        for i in range(len(self._caches)):
            a = (i * self._capacity + self._resident) * per_row // page * page
            b = (i * self._capacity + end) * per_row
            try:
                self._map.madvise(_MADV_POPULATE_WRITE, a, b - a)
            except (OSError, ValueError):  # before Linux 5.14: the pages fault in as they are written
                break
        self._resident = end

    def step(self, ids) -> np.ndarray:
        """Feeds tokens after the cached ones; returns their logits (the last token's with last_only). Batched: ids
        (b, s), logits (b, vocab) with last_only, else (b, s, vocab)."""
        pieces = self._pieces(ids)
        out = []
        for piece in pieces:
            self._feed_step(piece)
            if not self.last_only or piece is pieces[-1]:
                out.append(self.logits.numpy() if len(pieces) == 1 else self.logits.numpy().copy())
        return out[0] if len(out) == 1 else np.concatenate(out, axis=0 if self.batch is None else 1)

    def next_token(self, ids):
        """Feeds tokens after the cached ones; returns the greedy next token (the argmax of the last logits row),
        or batched (ids (b, s)) the list of each sequence's."""
        self._feed(ids)
        if self.batch is not None:
            return self.greedy.numpy().reshape(-1).tolist()
        return int(self.greedy.numpy()[0])

    def _pieces(self, ids) -> list:
        """The steps `ids` is fed in: one, or pieces of at most max_step_tokens (along the positions)."""
        if isinstance(ids, _core.DeviceArray):
            return [ids]
        if self.batch is None:
            ids = np.asarray(ids, np.int32).reshape(-1)
        else:
            ids = np.asarray(ids, np.int32)
            if ids.ndim != 2 or ids.shape[0] != self.batch:
                raise ValueError(f"a Session with batch={self.batch} takes tokens of shape ({self.batch}, s), got "
                                 f"shape {ids.shape}")
        m, n = self.max_step_tokens, ids.shape[-1]
        if m is not None and self.batch is not None:
            m = max(1, m // self.batch)  # (the bound counts the tokens of every sequence)
        return [ids] if m is None or n <= m else [ids[..., i:i + m] for i in range(0, n, m)]

    def _feed(self, ids, wait: bool = True):
        """`ids`: token ids, or a step's `greedy` result as the backend holds it (a DeviceArray stays on the GPU).
        `wait=False`: a GPU step is only queued (see Graph.execute)."""
        for piece in self._pieces(ids):
            self._feed_step(piece, wait)

    def _feed_step(self, ids, wait: bool = True):
        n = ids.shape[-1]
        if self.length + n > self._capacity:
            self._give_caches(max(2 * self._capacity, self.length + n), self.length + n)
        self._reserve(self.length + n)
        self.graph.set_dim("p", self.length)
        self.tokens.set(ids)
        self.graph.execute(wait=wait)
        # Every layer's update is the same Scatter: if the first ran in place (the CPU executor, the CUDA runtime once
        # the caches are on the GPU), all did, and nothing needs setting again. Otherwise the results (GPU device
        # arrays the first time) are fed back as they are, so the cache never leaves the device.
        if not _same_buffer(self.cache_out[0][0].result(), self._caches[0]):
            for i, (t_in, t_out) in enumerate(zip(self._cache_inputs, self._cache_outputs)):
                self._caches[i] = t_out.result()
                t_in.set(self._caches[i], donate=True)
        self.length += n

    def generate(self, prompt_ids, max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int | None = None, stop_ids=()):
        """Yields new token ids; `self.stats` holds prefill and decode timings afterwards."""
        if self.batch is not None:
            raise ValueError(f"generate decodes one sequence; this Session has batch={self.batch}: use "
                             "generate_batch")
        if temperature <= 0:
            yield from self._greedy(prompt_ids, max_new_tokens, stop_ids)
            return
        rng = np.random.default_rng(seed)

        def after(ids):
            return sample(self.step(ids)[-1], temperature, top_k, top_p, rng)

        t0 = time.perf_counter()
        tok = after(prompt_ids)
        t1 = time.perf_counter()
        self.stats = {"prefill_tokens": len(prompt_ids), "prefill_s": t1 - t0, "decode_tokens": 0, "decode_s": 0.0}
        for _ in range(max_new_tokens):
            if tok in stop_ids:
                break
            yield tok
            t = time.perf_counter()
            tok = after([tok])
            self.stats["decode_tokens"] += 1
            self.stats["decode_s"] += time.perf_counter() - t

    def generate_batch(self, prompts, max_new_tokens: int = 128, stop_ids=()) -> list[list[int]]:
        """Greedy decoding of up to `batch` prompts at once (a Session made with `batch`; of one length unless made
        with left_padding): returns each prompt's new tokens, up to `max_new_tokens`, a list ending before its first
        stop token. Fewer prompts than the batch are padded with copies of the last one (computed, then dropped).
        `self.stats` holds the timings: decode_tokens counts steps, each a token of every sequence of the batch.
        Starts new sequences (like reset)."""
        if self.batch is None:
            raise ValueError("generate_batch needs a Session made with batch=b; use generate for one sequence")
        n = len(prompts)
        ids = self.start_batch(prompts, "generate_batch")
        out, done = [[] for _ in range(n)], [False] * n

        def finished(toks) -> bool:  # every sequence has met a stop token (at this step or before)
            return all(d or int(t) in stop_ids for d, t in zip(done, toks))

        for toks in self._greedy_steps(ids, max_new_tokens, finished):
            for i in range(n):
                done[i] = done[i] or int(toks[i]) in stop_ids
                if not done[i]:
                    out[i].append(int(toks[i]))
        return out

    def start_batch(self, prompts, caller: str = "start_batch") -> np.ndarray:
        """Starts new sequences (like reset) for up to `batch` prompts; returns the (batch, s) tokens to feed first:
        the prompts, left-padded to the longest with a Session made with left_padding (which hides the padding),
        and fewer prompts than the batch padded with copies of the last one."""
        if self.batch is None:
            raise ValueError(f"{caller} needs a Session made with batch=b")
        prompts = [np.asarray(p, np.int32).reshape(-1) for p in prompts]
        if not 1 <= len(prompts) <= self.batch:
            raise ValueError(f"{caller}: got {len(prompts)} prompts for a Session with batch={self.batch}")
        lengths = [len(p) for p in prompts]
        if min(lengths) == 0 or (self.starts is None and len(set(lengths)) != 1):
            raise ValueError(f"{caller}: the prompts must have one (nonzero) length, got lengths {lengths}"
                             + ("" if min(lengths) == 0 else "; Session(left_padding=True) takes different lengths"))
        prompts += [prompts[-1]] * (self.batch - len(prompts))
        width = max(lengths)
        self.reset()
        if self.starts is not None:
            starts = np.array([width - len(p) for p in prompts], np.int32)
            self.starts.set(starts)
            # The padding repeats a sequence's first token (any token would do: hidden from the sequence).
            prompts = [np.concatenate([np.full(width - len(p), p[0], np.int32), p]) for p in prompts]
        return np.stack(prompts)

    def _greedy(self, prompt_ids, max_new_tokens: int, stop_ids):
        steps = self._greedy_steps(prompt_ids, max_new_tokens, lambda toks: int(toks[0]) in stop_ids)
        try:
            for toks in steps:
                yield int(toks[0])
        finally:
            steps.close()  # (forgets a step queued ahead when the caller stops early)

    def _greedy_steps(self, prompt_ids, max_new_tokens: int, stop):
        """Greedy decoding, yielding each step's tokens (an array: one per sequence) until `stop(tokens)`; on a
        backend that queues runs (a GPU), one step ahead: the step that feeds a token is queued (its input that
        token as the device holds it) before the token is read, so the GPU goes from step to step without waiting
        for the host. Each token yielded has been fed, as with sampling; a step fed the stop token, or queued when
        the caller stops early, is forgotten (its cache row is written again later)."""
        ahead = self.graph.queues_runs
        t0 = time.perf_counter()
        self._feed(prompt_ids, wait=False)
        self.stats = {"prefill_tokens": np.shape(prompt_ids)[-1], "prefill_s": 0.0, "decode_tokens": 0,
                      "decode_s": 0.0}
        pending, t_first = self._greedy_result(), t0
        for i in range(max_new_tokens + 1):
            queued = ahead and i < max_new_tokens
            if queued:
                self._feed(pending, wait=False)
                nxt = self._greedy_result()
            toks = (pending.numpy() if isinstance(pending, _core.DeviceArray) else pending).reshape(-1)  # waits
            now = time.perf_counter()
            if i == 0:
                self.stats["prefill_s"], t_first = now - t0, now
            else:
                self.stats["decode_tokens"], self.stats["decode_s"] = i, now - t_first
            if stop(toks) or i == max_new_tokens:
                self.length -= queued
                return
            try:
                yield toks
            except GeneratorExit:
                self.length -= queued
                raise
            if not queued:
                self._feed(pending)
                nxt = self._greedy_result()
            pending = nxt

    def _greedy_result(self):
        r = self.greedy.result()
        return r.copy() if isinstance(r, np.ndarray) else r  # (a host executor may reuse its output's memory)
