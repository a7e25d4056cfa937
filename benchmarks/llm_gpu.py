"""GPU LLM benchmark: luminal's CUDA backend vs PyTorch eager (Hugging Face transformers) on random bf16 models.

For each model shape (Llama-3-8B: hidden 4096, FFN 14336, 32 layers, 32 heads, 8 KV heads, vocab 128256, RoPE theta
500000; SmolLM2-135M: the bundled model's shape) the same seeded random bf16 weights are generated on the GPU and
copied into luminal (`luminal.cuda.from_torch`, no trip through the host). Then:
  * logits check: one forward over a 32-token prompt in both; relative L2 error and top-1 agreement are printed
    (luminal computes in float32 registers over the bf16 weights, torch in bf16);
  * decode: greedy, --decode tokens after a 32-token prompt, tokens/s and achieved GB/s (weight bytes read per token
    over the time per token), as % of the device-to-device copy bandwidth measured in the same run;
  * prefill: one --prefill-token prompt, milliseconds;
  * the peers, in the same run: torch eager (HF model, DynamicCache, one token per forward), and a hand-written
    torch.compile decode loop (`StaticDecoder`: the same weights, one reused static KV cache, mode="reduce-overhead",
    i.e. CUDA graphs), both greedy (luminal and the compiled loop take the argmax on the GPU) and reading every
    token on the host; ratios to each. Luminal's `generate` queues the step that feeds a token before reading it
    (the GPU never waits for the host between steps); the compiled loop is timed both ways ("ahead": the same), and
    so is luminal ("token read first": `next_token`, each token read before the next step).
Decode rates are medians over --reps timed runs per engine, engines alternating (the machine is shared); torch
eager, ~10x slower, runs once.

    PYTHONPATH=python python3 benchmarks/llm_gpu.py [--models 8b,135m] [--decode 256] [--prefill 2048] [--reps 3]
        [--no-compile] [--luminal-only] [--graphs-off] [--pdl-off] [--trace] [--profile] [--no-flash]
        [--batches 1,8,32] [--only batch] [--contexts 128,4096,8192] [--prefills 512,2048,8192]
        [--cache-dtype auto|float32|bfloat16|float16] [--layers N]
--batches adds batched decode rows (run_batches: Session(batch=B) against a batched compiled loop, tok/s summed
over the batch); --only batch skips the other rows. --models 8b-q8: the 8B shape with Q8_0 projections and head
(run_q8: quantised on the GPU, luminal alone; GB/s on the Q8_0 bytes). --contexts / --prefills add long-cache
decode and prefill rows (run_contexts; --only context). --cache-dtype: luminal's KV cache (Session(cache_dtype=));
by default bfloat16 for the 8B shapes (as the peers' caches) and float32 for 135m; printed in each table's header.
--layers N builds every shape with N layers (quick profiles: with --profile, each kernel kind's time for N layers).
"""
from __future__ import annotations

import argparse
import gc
import inspect
import os
import statistics
import time

import numpy as np
import torch

import luminal as lm
from luminal.compiler import GenericCompiler
from luminal.nn import Llama, LlamaConfig, Session

SHAPES = {
    "8b": LlamaConfig(vocab_size=128256, hidden=4096, ffn=14336, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
                      rope_theta=500000.0, rms_eps=1e-5),
    "135m": LlamaConfig(vocab_size=49152, hidden=576, ffn=1536, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64,
                        rope_theta=100000.0, rms_eps=1e-5, tie_word_embeddings=True),
}


def copy_bandwidth(gb: float = 2.0) -> float:
    """Device-to-device copy, bytes read + written per second (median of 20)."""
    n = int(gb * 1e9) // 2
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    times = []
    for _ in range(23):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        y.copy_(x)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del x, y
    return 2 * n * 2 / statistics.median(times[3:])


def hf_model(c: LlamaConfig, seed: int):
    from transformers import LlamaConfig as HFConfig, LlamaForCausalLM

    hc = HFConfig(vocab_size=c.vocab_size, hidden_size=c.hidden, intermediate_size=c.ffn, num_hidden_layers=c.n_layers,
                  num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim,
                  rope_theta=c.rope_theta, rms_norm_eps=c.rms_eps, tie_word_embeddings=c.tie_word_embeddings,
                  max_position_embeddings=8192)
    torch.manual_seed(seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16 on the GPU directly (an 8B float32 copy would not fit twice)
    try:
        with torch.device("cuda"):
            m = LlamaForCausalLM(hc).eval()
    finally:
        torch.set_default_dtype(prev)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.02)
    return m


def cache_dtype(key: str, args) -> str:
    """The KV cache's dtype for model `key`: --cache-dtype, or by default bfloat16 for the 8B shapes (the torch
    peers' caches are bf16) and float32 for 135m (its rows stay comparable with the earlier float32-cache ones)."""
    if args.cache_dtype != "auto":
        return args.cache_dtype
    return "float32" if key == "135m" else "bfloat16"


def luminal_session(c: LlamaConfig, hf, dtype: str, capacity: int, batch: int | None = None,
                    cache: str = "float32"):
    model = Llama(c)
    params = dict(model.named_parameters())
    for name, p in hf.named_parameters():
        if name in params:
            params[name].set(lm.cuda.from_torch(p.detach().contiguous()))
    t = time.perf_counter()
    s = Session(model, [GenericCompiler(), lm.CudaCompiler(dtype)], capacity=capacity,  # (the peer's cache size)
                batch=batch, cache_dtype=cache)
    return s, time.perf_counter() - t


def weight_bytes(c: LlamaConfig) -> int:
    """Bytes of weights one decode step reads (bf16), the embedding table excluded (one row is read) unless tied."""
    per_layer = 2 * c.hidden + c.hidden * (c.n_heads + 2 * c.n_kv_heads) * c.head_dim + c.n_heads * c.head_dim * c.hidden
    per_layer += 3 * c.hidden * c.ffn
    return 2 * (c.n_layers * per_layer + c.hidden + c.vocab_size * c.hidden)


def torch_decode(hf, prompt, n):
    from transformers import DynamicCache

    with torch.no_grad():
        cache = DynamicCache()
        out = hf(torch.tensor([prompt], device="cuda"), past_key_values=cache, use_cache=True)
        tok = int(out.logits[0, -1].argmax())
        toks = [tok]
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n - 1):
            out = hf(torch.tensor([[tok]], device="cuda"), past_key_values=cache, use_cache=True)
            tok = int(out.logits[0, -1].argmax())
            toks.append(tok)
        torch.cuda.synchronize()
        return toks, (n - 1) / (time.perf_counter() - t)


class StaticDecoder(torch.nn.Module):
    """The honest compiled peer: a hand-written Llama decode step over the HF model's weights, with one static KV
    cache (max_len rows, written in place at `pos`, attention masked beyond it), compiled with
    mode="reduce-overhead" (CUDA graphs). Greedy decoding reads each token on the host, as the luminal loop does."""

    def __init__(self, hf, c: LlamaConfig, max_len: int):
        super().__init__()
        self.c, self.hf, self.max_len = c, hf, max_len
        dev, bf = "cuda", torch.bfloat16
        self.register_buffer("kc", torch.zeros(c.n_layers, max_len, c.n_kv_heads, c.head_dim, device=dev, dtype=bf))
        self.register_buffer("vc", torch.zeros_like(self.kc))
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, device=dev, dtype=torch.float64) / c.head_dim))
        f = torch.arange(max_len, device=dev, dtype=torch.float64)[:, None] * inv[None]
        emb = torch.cat([f, f], -1)
        self.register_buffer("cos", emb.cos().float())
        self.register_buffer("sin", emb.sin().float())
        self.register_buffer("ar", torch.arange(max_len, device=dev))

    def norm(self, x, w):
        x = x.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c.rms_eps)).to(torch.bfloat16) * w

    def rope(self, x, cos, sin):
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], -1)
        return (x.float() * cos + rot.float() * sin).to(torch.bfloat16)

    def forward(self, tok, pos):  # tok, pos: (1,) int64 on the GPU
        c, m = self.c, self.hf.model
        H, Hkv, d = c.n_heads, c.n_kv_heads, c.head_dim
        x = m.embed_tokens.weight[tok]  # (1, hidden)
        cos, sin = self.cos[pos], self.sin[pos]  # (1, d)
        valid = (self.ar <= pos)[None, None, :]  # (1, 1, max_len)
        for i, layer in enumerate(m.layers):
            a = layer.self_attn
            h = self.norm(x, layer.input_layernorm.weight)
            q = self.rope((h @ a.q_proj.weight.t()).view(H, d), cos, sin)
            k = self.rope((h @ a.k_proj.weight.t()).view(Hkv, d), cos, sin)
            v = (h @ a.v_proj.weight.t()).view(Hkv, d)
            self.kc[i].index_copy_(0, pos, k[None])
            self.vc[i].index_copy_(0, pos, v[None])
            keys, vals = self.kc[i].transpose(0, 1), self.vc[i].transpose(0, 1)  # (Hkv, max_len, d)
            qg = q.view(Hkv, H // Hkv, d)
            sc = (qg @ keys.transpose(1, 2)).float() * (1.0 / d ** 0.5)  # (Hkv, rep, max_len)
            sc = sc.masked_fill(~valid, float("-inf")).softmax(-1).to(torch.bfloat16)
            o = (sc @ vals).reshape(1, H * d)
            x = x + o @ a.o_proj.weight.t()
            h = self.norm(x, layer.post_attention_layernorm.weight)
            mlp = layer.mlp
            g = torch.nn.functional.silu(h @ mlp.gate_proj.weight.t()) * (h @ mlp.up_proj.weight.t())
            x = x + g @ mlp.down_proj.weight.t()
        x = self.norm(x, m.norm.weight)
        return (x @ self.hf.lm_head.weight.t()).float()[0]


def compiled_decode(dec, step, prompt, n, ahead=False, start=0):
    """Greedy: the prompt one token at a time (fills the cache), then n tokens; returns (tokens, tok/s). `ahead`: each
    step's token stays on the GPU as the next step's input, and is read (through page-locked memory and an event)
    once that next step is queued, as luminal's generate does; otherwise it is read before the next step. `start`:
    the prompt's first position (rows before it are whatever the cache holds)."""
    with torch.no_grad():
        pos = torch.zeros(1, dtype=torch.long, device="cuda")
        for i, t in enumerate(prompt, start):
            pos.fill_(i)
            logits = step(torch.tensor([t], device="cuda"), pos)
        tok = int(logits.argmax())
        toks = [tok]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if not ahead:
            for i in range(n - 1):
                pos.fill_(start + len(prompt) + i)
                tok = int(step(torch.tensor([tok], device="cuda"), pos).argmax())
                toks.append(tok)
            return toks, (n - 1) / (time.perf_counter() - t0)
        host = torch.empty(n, dtype=torch.long, pin_memory=True)
        cur, done = torch.tensor([tok], device="cuda"), None
        for i in range(n - 1):
            pos.fill_(start + len(prompt) + i)
            cur = step(cur, pos).argmax().view(1)
            host[i].copy_(cur[0], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            if done is not None:  # the step before this one
                done.synchronize()
                toks.append(int(host[i - 1]))
            done = ev
        done.synchronize()
        toks.append(int(host[n - 2]))
        return toks, (n - 1) / (time.perf_counter() - t0)


def luminal_decode(s: Session, prompt, n, ahead=True):
    """Greedy, n tokens after the prompt; returns (tokens, tok/s). `ahead`: Session.generate, which queues the step
    feeding a token before reading it; otherwise next_token, which reads each token before the next step."""
    s.reset()
    if ahead:
        toks = list(s.generate(prompt, n))
        return toks, s.stats["decode_tokens"] / s.stats["decode_s"]
    tok = s.next_token(prompt)
    toks = [tok]
    t = time.perf_counter()
    for _ in range(n - 1):
        tok = s.next_token([tok])
        toks.append(tok)
    return toks, (n - 1) / (time.perf_counter() - t)


def prefill_ms(fn, reps=3):
    fn()  # warm-up (luminal: the cache grows to the prompt, a plan for its length)
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def run_model(key, args, bw):
    c = SHAPES[key]
    rng = np.random.default_rng(args.seed)
    hf = hf_model(c, args.seed)
    prompt = rng.integers(0, c.vocab_size, 32).tolist()
    s, compile_s = luminal_session(c, hf, "bfloat16", len(prompt) + args.decode + 8, cache=cache_dtype(key, args))
    # Logits check (the last prompt position).
    s.reset()
    got = s.step(prompt)
    with torch.no_grad():
        want = hf(torch.tensor([prompt], device="cuda")).logits[0, -1:].float().cpu().numpy()
    got = got[-1:]
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    top1 = float(np.mean(np.argmax(got, -1) == np.argmax(want, -1)))
    # Decode: engines alternate, --reps timed runs each; medians.
    luminal_decode(s, prompt, args.decode)  # warm-up: plans, graphs and arena sizes for the lengths timed
    dec = step = None
    if not args.no_compile and not args.luminal_only:
        t = time.perf_counter()
        dec = StaticDecoder(hf, c, len(prompt) + args.decode + 8)
        step = torch.compile(dec, mode="reduce-overhead", fullgraph=True)
        compiled_decode(dec, step, prompt[:4], 4)  # compiles and records the graphs
        compile_peer_s = time.perf_counter() - t
    # Variants of luminal's runtime, for comparison: each the same loop under one environment setting, run right
    # after luminal's own (timed runs in a row favoured whichever came later by up to 7%).
    variants = [(name, var) for on, name, var in (
        (True, "luminal (token read first)", None),  # next_token: each token read before the next step is queued
        (args.one_graph, "luminal (one graph)", "LUMINAL_CUDA_GRAPH_CHUNKS"),  # one graph, not chunks
        (args.graphs_off, "luminal (no graphs)", "LUMINAL_CUDA_GRAPHS"),  # direct launches
        (args.pdl_off, "luminal (no PDL)", "LUMINAL_CUDA_PDL")) if on]  # no programmatic dependent launch
    peers = ["torch.compile", "torch.compile (ahead)"] if step is not None else []
    rates = {"luminal": [], "torch eager": [], **{p: [] for p in peers}, **{name: [] for name, _ in variants}}
    toks, launches = {}, None
    for rep in range(args.reps):
        order = [("luminal", None)] + variants
        for name, var in order[::-1] if rep % 2 else order:  # (alternating which goes first)
            if var:
                os.environ[var] = "0"
            toks[name], r = luminal_decode(s, prompt, args.decode, ahead="read first" not in name)
            rates[name].append(r)
            if name == "luminal" and args.kernels:  # (of a decode step: the prefill below launches more)
                launches = args.kernels(s)
            if var:
                del os.environ[var]
        for p in peers[::-1] if rep % 2 else peers:
            toks[p], r = compiled_decode(dec, step, prompt, args.decode, ahead=p.endswith("(ahead)"))
            rates[p].append(r)
        if not rates["torch eager"] and not args.luminal_only:  # slow (~10 tok/s on the 8B shape): once
            toks["torch eager"], r = torch_decode(hf, prompt, args.decode)
            rates["torch eager"].append(r)
    med = {k: statistics.median(v) for k, v in rates.items() if v}
    def agree(a, b):  # greedy tokens two engines share from the start (random weights: near-tied logits split them)
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    wb = weight_bytes(c)
    # Prefill.
    long = rng.integers(0, c.vocab_size, args.prefill).tolist()

    def lum_prefill():
        s.reset()
        s.step(long)

    def torch_prefill():
        with torch.no_grad():
            hf(torch.tensor([long], device="cuda"))

    lp = prefill_ms(lum_prefill, 2)
    if args.profile:  # one decode step with every kernel synchronised: where the time goes (stderr)
        os.environ["LUMINAL_PROFILE"] = "1"
        print(f"-- profile of one {key} decode step (LUMINAL_PROFILE=1)", flush=True)
        s.step([0])
        del os.environ["LUMINAL_PROFILE"]
    host_breakdown(s, key, prompt)
    if args.trace:
        trace_decode(s, key, prompt)
    tp = float("nan") if args.luminal_only else prefill_ms(torch_prefill, 3)
    print(f"\n== {key}: {wb / 1e9:.2f} GB of bf16 weights read per token; {cache_dtype(key, args)} KV cache; "
          f"luminal compile {compile_s:.1f} s"
          + ("" if step is None else f"; torch.compile peer ready in {compile_peer_s:.1f} s"))
    print(f"logits (last prompt position) vs torch bf16: relative L2 error {rel:.3e}, top-1 agreement {top1:.0%}")
    same = [f"{a} = {b} for the first {agree(toks[a], toks[b])}" for a, b in
            (("luminal", "torch eager"), ("torch.compile", "torch eager"), ("luminal", "torch.compile"))
            if toks.get(a) and toks.get(b)]
    if same:
        print(f"greedy tokens of {args.decode}: " + "; ".join(same))
    print(f"decode, median of {args.reps} runs of {args.decode} tokens (all runs: "
          + "; ".join(f"{k} " + ",".join(f"{x:.1f}" for x in v) for k, v in rates.items() if v) + ")")
    # "x compile": against the faster of the compiled loop's two forms.
    best = max((med[p] for p in peers), default=None)
    print(f"{'':28}{'tok/s':>9}{'GB/s':>8}{'% copy bw':>11}{'x eager':>9}{'x compile':>11}")
    for k, r in med.items():
        xc = f"{r / best:11.2f}" if best else f"{'-':>11}"
        xe = f"{r / med['torch eager']:9.2f}" if "torch eager" in med else f"{'-':>9}"
        print(f"{k:28}{r:9.1f}{wb * r / 1e9:8.0f}{100 * wb * r / bw:10.1f}%{xe}{xc}")
    print(f"{'prefill ' + str(args.prefill) + ' ms':28} luminal {lp:.1f}, torch eager {tp:.1f}: {tp / lp:.2f}x")
    if launches is not None:
        print(f"kernels per decode step: {launches}")
    del s, hf
    torch.cuda.empty_cache()


class BatchDecoder(StaticDecoder):
    """StaticDecoder for up to `max_batch` sequences at the same position: per layer a (max_batch, max_len, Hkv, d)
    cache, of which a step uses the first B rows (B = the tokens given). One module for every batch size, compiled
    with static shapes, once per size, like the batch-1 peer (a dynamic batch dim compiles once, but its steps were
    much slower: a weaker peer)."""

    def __init__(self, hf, c: LlamaConfig, max_len: int, max_batch: int):
        super().__init__(hf, c, max_len)
        self.kc = torch.zeros(c.n_layers, max_batch, max_len, c.n_kv_heads, c.head_dim, device="cuda",
                              dtype=torch.bfloat16)
        self.vc = torch.zeros_like(self.kc)

    def forward(self, tok, pos):  # tok: (B,), pos: (1,) int64 on the GPU; returns (B, vocab) float32 logits
        c, m = self.c, self.hf.model
        H, Hkv, d, b = c.n_heads, c.n_kv_heads, c.head_dim, tok.shape[0]
        x = m.embed_tokens.weight[tok]  # (B, hidden)
        cos, sin = self.cos[pos], self.sin[pos]  # (1, d)
        valid = (self.ar <= pos)[None, None, None, :]
        for i, layer in enumerate(m.layers):
            a = layer.self_attn
            h = self.norm(x, layer.input_layernorm.weight)
            q = self.rope((h @ a.q_proj.weight.t()).view(b, H, d), cos, sin)
            k = self.rope((h @ a.k_proj.weight.t()).view(b, Hkv, d), cos, sin)
            v = (h @ a.v_proj.weight.t()).view(b, Hkv, d)
            kc, vc = self.kc[i, :b], self.vc[i, :b]
            kc.index_copy_(1, pos, k[:, None])
            vc.index_copy_(1, pos, v[:, None])
            keys, vals = kc.permute(0, 2, 1, 3), vc.permute(0, 2, 1, 3)  # (B, Hkv, max_len, d)
            qg = q.view(b, Hkv, H // Hkv, d)
            sc = (qg @ keys.transpose(2, 3)).float() * (1.0 / d ** 0.5)  # (B, Hkv, rep, max_len)
            sc = sc.masked_fill(~valid, float("-inf")).softmax(-1).to(torch.bfloat16)
            x = x + (sc @ vals).reshape(b, H * d) @ a.o_proj.weight.t()
            h = self.norm(x, layer.post_attention_layernorm.weight)
            mlp = layer.mlp
            g = torch.nn.functional.silu(h @ mlp.gate_proj.weight.t()) * (h @ mlp.up_proj.weight.t())
            x = x + g @ mlp.down_proj.weight.t()
        x = self.norm(x, m.norm.weight)
        return (x @ self.hf.lm_head.weight.t()).float()


def batch_compiled_decode(step, prompts: np.ndarray, n: int):
    """Greedy over a batch, as compiled_decode's `ahead` form: the prompts a position at a time, then n steps, each
    step's tokens read (page-locked memory, an event) once the next step is queued. Returns (tokens per sequence,
    total tok/s over the batch)."""
    b, p = prompts.shape
    with torch.no_grad():
        ids = torch.tensor(prompts.T.copy(), device="cuda")  # position-major: each step's tokens contiguous
        pos = torch.zeros(1, dtype=torch.long, device="cuda")
        for i in range(p):
            pos.fill_(i)
            cur = step(ids[i], pos).argmax(-1)
        torch.cuda.synchronize()
        host = torch.empty(n, b, dtype=torch.long, pin_memory=True)
        host[0].copy_(cur)
        t0, events = time.perf_counter(), []
        for i in range(1, n):
            pos.fill_(p + i - 1)
            cur = step(cur, pos).argmax(-1)
            host[i].copy_(cur, non_blocking=True)
            events.append(torch.cuda.Event())
            events[-1].record()
            if len(events) > 1:
                events[-2].synchronize()  # the step before this one (its tokens are in `host`)
        events[-1].synchronize()
        rate = b * (n - 1) / (time.perf_counter() - t0)
    return host.numpy().T.tolist(), rate


def run_batches(key, args, bw):
    """Batched decode rows: for each batch size, `batch` prompts of 32 tokens, then --decode greedy tokens each,
    luminal's Session(batch=B).generate_batch against BatchDecoder under torch.compile (mode="reduce-overhead");
    tok/s summed over the batch, medians of --reps runs, engines alternating."""
    c = SHAPES[key]
    batches = [int(b) for b in args.batches.split(",")]
    hf = hf_model(c, args.seed)
    rng = np.random.default_rng(args.seed)
    capacity = 32 + args.decode + 8
    step = None
    if not (args.no_compile or args.luminal_only):
        t = time.perf_counter()
        dec = BatchDecoder(hf, c, capacity, max(batches))
        step = torch.compile(dec, mode="reduce-overhead", fullgraph=True, dynamic=False)
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 2 * len(batches))
        print(f"-- {key} batched peer: BatchDecoder built in {time.perf_counter() - t:.1f} s (compiled on first use)")
    wb = weight_bytes(c)
    rows = []
    for b in batches:
        prompts = rng.integers(0, c.vocab_size, (b, 32))
        s, compile_s = luminal_session(c, hf, "bfloat16", capacity, batch=b, cache=cache_dtype(key, args))
        s.generate_batch(prompts, args.decode)  # warm-up: kernels, plans, graphs
        if step is not None:
            t = time.perf_counter()
            batch_compiled_decode(step, prompts, 4)  # compiles (or records its CUDA graphs for this batch)
            peer_s = time.perf_counter() - t
        rates = {"luminal": [], "torch.compile": []}
        toks = {}
        for rep in range(args.reps):
            engines = ["luminal", "torch.compile"] if step is not None else ["luminal"]
            for name in engines[::-1] if rep % 2 else engines:
                if name == "luminal":
                    toks[name] = s.generate_batch(prompts, args.decode)
                    rates[name].append(b * s.stats["decode_tokens"] / s.stats["decode_s"])
                else:
                    toks[name], r = batch_compiled_decode(step, prompts, args.decode)
                    rates[name].append(r)
        lum = statistics.median(rates["luminal"])
        peer = statistics.median(rates["torch.compile"]) if rates["torch.compile"] else float("nan")
        agree = ""
        if "torch.compile" in toks:  # greedy tokens: the first position where the engines differ, per sequence
            firsts = [next((i for i, (x, y) in enumerate(zip(u, v)) if x != y), len(u))
                      for u, v in zip(toks["luminal"], toks["torch.compile"])]
            agree = f"; tokens equal up to {statistics.median(firsts):.0f} of {args.decode} (median over the batch)"
        steps_per_s = lum / b
        rows.append((b, lum, peer))
        print(f"{key} batch {b:3d} decode: luminal {lum:8.1f} tok/s ({steps_per_s:.1f} steps/s, weights at "
              f"{100 * wb * steps_per_s / bw:.1f}% of copy bw; compile {compile_s:.1f} s), torch.compile {peer:8.1f} "
              f"tok/s" + ("" if step is None else f" (first use {peer_s:.1f} s)") + f": {lum / peer:.2f}x{agree}",
              flush=True)
        del s
        gc.collect()  # (this batch's copy of the weights)
        torch.cuda.empty_cache()
    print(f"\n== {key} batched decode (tok/s summed over the batch, {args.decode} tokens after 32-token prompts; "
          f"{cache_dtype(key, args)} KV cache)")
    print(f"{'batch':>6}{'luminal':>10}{'torch.compile':>15}{'ratio':>8}")
    for b, lum, peer in rows:
        print(f"{b:6d}{lum:10.1f}{peer:15.1f}{lum / peer:8.2f}")
    del hf
    torch.cuda.empty_cache()


# ---- Q8_0 (GGUF blocks of 32 int8 quants and an f16 scale: 34 bytes per 32 weights) ---------------------------------
Q8_MODELS = {"8b-q8": "8b"}  # model key -> the shape quantised


def q8_blocks(w):
    """A (rows, K) torch weight quantised to Q8_0 where it lives (the GPU): (raw uint8 (rows, K / 32 * 34), its
    dequantisation in w's dtype). Scale absmax / 127 as f16, quants rounded against the f16 scale."""
    rows, k = w.shape
    b = w.float().view(rows, k // 32, 32)
    d = (b.abs().amax(-1) / 127).half()
    q = torch.where(d[..., None] > 0, b / d.float()[..., None], torch.zeros_like(b)).round().clamp(-127, 127)
    raw = torch.cat([d.view(torch.uint8).view(rows, k // 32, 2), q.to(torch.int8).view(torch.uint8)], -1)
    return raw.reshape(rows, -1).contiguous(), (d.float()[..., None] * q).view(rows, k).to(w.dtype)


def q8_bytes(c: LlamaConfig) -> int:
    """Bytes one decode step reads: the projections and the output head as Q8_0, the norms as bf16."""
    per_layer = c.hidden * (c.n_heads + 2 * c.n_kv_heads) * c.head_dim + c.n_heads * c.head_dim * c.hidden
    per_layer += 3 * c.hidden * c.ffn
    return (c.n_layers * per_layer + c.vocab_size * c.hidden) // 32 * 34 + 2 * (2 * c.n_layers + 1) * c.hidden


def q8_session(c: LlamaConfig, hf, capacity: int, cache: str):
    """A luminal Session of `hf`'s model with Q8_0 projections and output head: each 2-D weight but the embedding is
    quantised on the GPU (q8_blocks) and becomes Dequant(raw), as a GGUF state dict does; `hf`'s weights are replaced
    by their dequantisation, so that torch computes with exactly the weights luminal unpacks. Returns (session, its
    compile time in seconds, the packed rows, which luminal reads in place and the caller keeps alive)."""
    model = Llama(c)
    params = dict(model.named_parameters())
    raws = []
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name not in params:
                continue
            if p.ndim == 2 and name != "model.embed_tokens.weight":
                raw, deq = q8_blocks(p)
                p.copy_(deq)
                raws.append(raw)
                t = model.graph.tensor(tuple(raw.shape), lm.uint8, name=name).set(lm.cuda.from_torch(raw))
                owner, attr = model._owner(name)
                setattr(owner, attr, model.graph._wrap(model.graph._g.dequant("Q8_0", t._edge(), list(p.shape))))
            else:
                params[name].set(lm.cuda.from_torch(p.detach().contiguous()))
    t = time.perf_counter()
    s = Session(model, [GenericCompiler(), lm.CudaCompiler("bfloat16")], capacity=capacity, cache_dtype=cache)
    return s, time.perf_counter() - t, raws


def run_q8(key, args, bw):
    """Llama with Q8_0 projections and output head (quantised on the GPU from the random bf16 model, whose weights
    are then replaced by their dequantisation: the torch reference computes with exactly the weights luminal
    unpacks, in bf16): logits check, decode tok/s and GB/s on the Q8_0 bytes, prefill."""
    c = SHAPES[Q8_MODELS[key]]
    rng = np.random.default_rng(args.seed)
    hf = hf_model(c, args.seed)
    prompt = rng.integers(0, c.vocab_size, 32).tolist()
    s, compile_s, raws = q8_session(c, hf, len(prompt) + args.decode + 8, cache_dtype(key, args))
    s.reset()
    got = s.step(prompt)[-1:]
    with torch.no_grad():
        want = hf(torch.tensor([prompt], device="cuda")).logits[0, -1:].float().cpu().numpy()
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    top1 = float(np.mean(np.argmax(got, -1) == np.argmax(want, -1)))
    luminal_decode(s, prompt, args.decode)  # warm-up
    rates = [luminal_decode(s, prompt, args.decode)[1] for _ in range(args.reps)]
    r = statistics.median(rates)
    launches = args.kernels(s) if args.kernels else None  # (of a decode step: the prefill below launches more)
    long = rng.integers(0, c.vocab_size, args.prefill).tolist()

    def lum_prefill():
        s.reset()
        s.step(long)

    lp = prefill_ms(lum_prefill, 2)
    if args.profile:
        os.environ["LUMINAL_PROFILE"] = "1"
        print(f"-- profile of one {key} decode step (LUMINAL_PROFILE=1)", flush=True)
        s.step([0])
        del os.environ["LUMINAL_PROFILE"]
    wb = q8_bytes(c)
    print(f"\n== {key}: {wb / 1e9:.2f} GB of Q8_0 weights read per token; {cache_dtype(key, args)} KV cache; "
          f"luminal compile {compile_s:.1f} s")
    print(f"logits (last prompt position) vs torch bf16 over the dequantised weights: relative L2 error {rel:.3e}, "
          f"top-1 agreement {top1:.0%}")
    print(f"decode, median of {args.reps} runs of {args.decode} tokens ({', '.join(f'{x:.1f}' for x in rates)}): "
          f"{r:.1f} tok/s, {wb * r / 1e9:.0f} GB/s, {100 * wb * r / bw:.1f}% of copy bandwidth")
    print(f"prefill {args.prefill} ms: luminal {lp:.1f}")
    if launches is not None:
        print(f"kernels per decode step: {launches}")
    del s, hf, raws
    torch.cuda.empty_cache()


def run_contexts(key, args, bw):
    """Long-cache rows (--contexts, --prefills): decode at each cache length (a random prompt of that length, then
    --decode greedy tokens; luminal's Session.generate, tok/s over the decoded tokens) against the compiled loop
    (StaticDecoder, its cache covering the longest context: it attends over its whole static cache at every length,
    as gpt-fast does, so it is started at the context's position without feeding the prompt), each with its ratio
    to its own rate at the shortest context; then prefill of each --prefills length against torch eager (HF,
    SDPA attention, last position's logits only, as luminal). Medians of --reps runs; flash attention as compiled
    (--no-flash: off)."""
    c = SHAPES[key]
    rng = np.random.default_rng(args.seed)
    ctxs = [int(x) for x in args.contexts.split(",") if x]
    pres = [int(x) for x in args.prefills.split(",") if x]
    hf = hf_model(c, args.seed)
    s, compile_s = luminal_session(c, hf, "bfloat16", max(ctxs + pres + [0]) + args.decode + 8,
                                   cache=cache_dtype(key, args))
    step = None
    if ctxs and not args.no_compile and not args.luminal_only:
        dec = StaticDecoder(hf, c, max(ctxs) + args.decode + 8)
        step = torch.compile(dec, mode="reduce-overhead", fullgraph=True)

    def peer_rate(start, n):  # the compiled loop from position `start`, each token read once the next is queued
        return compiled_decode(dec, step, [1], n, ahead=True, start=start)[1]

    flash = "on" if lm.CudaCompiler.flash_attention_default else "off"
    print(f"\n== {key}: decode at cache lengths {ctxs} ({args.decode} tokens; flash attention {flash}; "
          f"{cache_dtype(key, args)} KV cache; luminal compile "
          f"{compile_s:.1f} s)", flush=True)
    rows = {}
    for n in ctxs:
        prompt = rng.integers(0, c.vocab_size, n).tolist()
        luminal_decode(s, prompt, args.decode)  # warm-up: the plans and graphs of these lengths
        if step is not None:
            peer_rate(n, 4)  # (compiles on first use; later lengths reuse its graphs)
        lr, pr = [], []
        for _ in range(args.reps):
            lr.append(luminal_decode(s, prompt, args.decode)[1])
            if step is not None:
                pr.append(peer_rate(n, args.decode))
        rows[n] = (statistics.median(lr), statistics.median(pr) if pr else float("nan"))
    if rows:
        l0, p0 = rows[min(rows)]
        print(f"{'cache':>7}{'luminal tok/s':>15}{'x short':>9}{'compiled tok/s':>16}{'x short':>9}{'x compiled':>12}")
        for n, (lr, pr) in rows.items():
            print(f"{n:7d}{lr:15.1f}{lr / l0:9.2f}{pr:16.1f}{pr / p0:9.2f}{lr / pr:12.2f}", flush=True)
    del step
    last = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(hf.forward).parameters else {}
    for n in pres:
        long = rng.integers(0, c.vocab_size, n).tolist()

        def lum_prefill():
            s.reset()
            s.step(long)

        def torch_prefill():
            with torch.no_grad():
                hf(torch.tensor([long], device="cuda"), **last)

        lp = prefill_ms(lum_prefill, args.reps)
        if args.profile:  # one prefill with every kernel synchronised: where the time goes (stderr)
            os.environ["LUMINAL_PROFILE"] = "1"
            print(f"-- profile of one {key} prefill of {n} tokens (LUMINAL_PROFILE=1)", flush=True)
            lum_prefill()
            del os.environ["LUMINAL_PROFILE"]
        tp = float("nan") if args.luminal_only else prefill_ms(torch_prefill, args.reps)
        print(f"prefill {n:5d} tokens: luminal {lp:8.1f} ms, torch eager {tp:8.1f} ms: {tp / lp:.2f}x", flush=True)
    del s, hf
    gc.collect()
    torch.cuda.empty_cache()


def trace_decode(s: Session, key: str, prompt, steps: int = 8):
    """Decode steps under torch.profiler (CUPTI sees the kernels of our CUDA graph): GPU time per kernel kind, the
    GPU busy time per step, and the wall time per step; the difference is host work and launch gaps."""
    from torch.profiler import ProfilerActivity, profile

    s.reset()
    tok = s.next_token(prompt)
    for _ in range(3):
        tok = s.next_token([tok])
    torch.cuda.synchronize()
    rt = s.graph._runtime.rt
    host = np.zeros(6)  # plan, record, replay, wait (C++); the rest of execute(); the rest of the step (Python)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            t0 = time.perf_counter()
            ex = s.graph.execute
            t_ex = [0.0]

            def timed(*a, **k):
                t1 = time.perf_counter()
                r = ex(*a, **k)
                t_ex[0] = time.perf_counter() - t1
                return r

            s.graph.execute = timed
            tok = s.next_token([tok])
            del s.graph.execute
            parts = np.array(rt.last_times())
            host += np.concatenate([parts, [t_ex[0] - parts.sum(), time.perf_counter() - t0 - t_ex[0]]])
        wall = (time.perf_counter() - t) / steps
    host *= 1e3 / steps
    print(f"-- host per {key} decode step (ms): plan {host[0]:.3f}, record launches {host[1]:.3f}, replay "
          f"{host[2]:.3f}, wait for the GPU {host[3]:.3f}; rest of execute() {host[4]:.3f}; rest of the step "
          f"(Python, token read) {host[5]:.3f}")
    ops = s.graph._runtime.schedule.kernel_ops(s.graph._g)
    kinds: dict[str, list] = {}
    busy = 0.0
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        busy += us
        k = kinds.setdefault(ops.get(e.name, e.name), [0, 0.0])
        k[0] += 1
        k[1] += us
    print(f"-- trace of {steps} {key} decode steps: wall {wall * 1e3:.3f} ms/step, GPU busy {busy / steps / 1e3:.3f} "
          f"ms/step ({len(prof.events()) and sum(v[0] for v in kinds.values()) // steps} kernels/step)")
    for name, (n, us) in sorted(kinds.items(), key=lambda kv: -kv[1][1])[:25]:
        print(f"   {name:40} {n // steps:5d}/step {us / steps:9.1f} us/step {us / max(n, 1):8.2f} us each")


def host_breakdown(s: Session, key: str, prompt, steps: int = 32):
    """Where a decode step's wall time goes, without a profiler (whose hooks slow every driver call): the C++ run's
    own parts, what surrounds it, the token read; and what reading the logits and their argmax on the host would
    cost instead. The GPU idles for about the step's time - wait - record."""
    class Timed:  # the runtime, with run() timed
        def __init__(self, rt):
            self.rt, self.t = rt, 0.0

        def run(self, *a):
            t = time.perf_counter()
            try:
                return self.rt.run(*a)
            finally:
                self.t = time.perf_counter() - t

        def __getattr__(self, name):
            return getattr(self.rt, name)

    s.reset()
    tok = s.next_token(prompt)
    for _ in range(3):
        tok = s.next_token([tok])
    runtime = s.graph._runtime
    timed = runtime.rt = Timed(runtime.rt)
    read = s.graph._result
    t_read = [0.0]

    def timed_read(out):  # the step's token read (a device-to-host copy), shadowing the method
        t = time.perf_counter()
        try:
            return read(out)
        finally:
            t_read[0] = time.perf_counter() - t

    s.graph._result = timed_read
    try:
        t = np.zeros(8)
        for _ in range(steps):
            t0 = time.perf_counter()
            tok = s.next_token([tok])
            t1 = time.perf_counter()
            cpp = np.array(timed.last_times())
            t += np.concatenate([[t1 - t0, timed.t], cpp, [timed.t - cpp.sum(), t_read[0]]])
        logits = s.logits.numpy  # and what a step returning the logits would read instead
        t_logits = time.perf_counter()
        x = logits()
        t_logits = time.perf_counter() - t_logits
        t_argmax = time.perf_counter()
        np.argmax(x[-1])
        t_argmax = time.perf_counter() - t_argmax
    finally:
        runtime.rt = timed.rt
        del s.graph._result
    t *= 1e3 / steps
    print(f"-- host per {key} decode step, untraced (ms, {steps} steps): Session.next_token {t[0]:.3f}, of which "
          f"CudaRuntime.run {t[1]:.3f} = plan {t[2]:.3f} + record {t[3]:.3f} + replay {t[4]:.3f} + wait {t[5]:.3f} + "
          f"bindings and the rest {t[6]:.3f}; the rest of the step {t[0] - t[1]:.3f} (the token read {t[7]:.3f}). "
          f"Reading the logits instead would take {t_logits * 1e3:.3f}, and their argmax {t_argmax * 1e3:.3f}")


def kernels_per_step(s: Session) -> int:
    """Kernels the last run (a decode step) launched."""
    return s.graph._runtime.rt.last_launches()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="8b,135m")
    p.add_argument("--decode", type=int, default=256)
    p.add_argument("--prefill", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", action="store_true",
                   help="print the time per op kind of one decode step (and of each --prefills prefill)")
    p.add_argument("--reps", type=int, default=3, help="timed decode runs per engine (medians are printed)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    p.add_argument("--luminal-only", action="store_true",
                   help="no torch peers (eager decode and prefill, compiled loop): to compare luminal builds")
    p.add_argument("--trace", action="store_true", help="trace decode steps with torch.profiler: GPU time per kernel")
    p.add_argument("--one-graph", action="store_true", help="also time luminal replaying each run as one CUDA graph")
    p.add_argument("--graphs-off", action="store_true", help="also time luminal with LUMINAL_CUDA_GRAPHS=0")
    p.add_argument("--pdl-off", action="store_true", help="also time luminal with LUMINAL_CUDA_PDL=0")
    p.add_argument("--no-flash", action="store_true", help="compile with CudaCompiler(flash_attention=False)")
    p.add_argument("--contexts", default="", help="decode rows at these cache lengths, e.g. 128,4096,8192")
    p.add_argument("--prefills", default="", help="prefill rows at these prompt lengths, e.g. 512,2048,8192")
    p.add_argument("--batches", default="", help="batched decode rows for these batch sizes, e.g. 1,8,32")
    p.add_argument("--only", default="", help="run only these row groups (comma-separated): batch")
    p.add_argument("--cache-dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="luminal's KV cache dtype (auto: bfloat16 for the 8B shapes, as the torch peers; float32 "
                        "for 135m)")
    p.add_argument("--layers", type=int, default=0, help="build the shapes with this many layers (quick profiles)")
    args = p.parse_args()
    if args.layers:
        for c in SHAPES.values():
            c.n_layers = args.layers
    lm.CudaCompiler.flash_attention_default = not args.no_flash
    args.kernels = kernels_per_step
    ok, why = lm.cuda_available()
    if not ok:
        raise SystemExit(f"no GPU: {why}")
    bw = copy_bandwidth()
    print(f"device: {why}; device-to-device copy {bw / 1e9:.0f} GB/s (read + write)")
    only = set(filter(None, args.only.split(",")))
    for key in args.models.split(","):
        if not only:
            (run_q8 if key in Q8_MODELS else run_model)(key, args, bw)
        if args.batches and (not only or "batch" in only):
            run_batches(key, args, bw)
        if (args.contexts or args.prefills) and (not only or "context" in only):
            run_contexts(key, args, bw)


if __name__ == "__main__":
    main()
