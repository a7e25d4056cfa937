"""GPU LLM benchmark: luminal's CUDA backend vs PyTorch eager (Hugging Face transformers) on random bf16 models.

For each model shape (Llama-3-8B: hidden 4096, FFN 14336, 32 layers, 32 heads, 8 KV heads, vocab 128256, RoPE theta
500000; SmolLM2-135M: the bundled model's shape) the same seeded random bf16 weights are generated on the GPU and
copied into luminal (`luminal.cuda.from_torch`, no trip through the host). Then:
  * logits check: one forward over a 32-token prompt in both; relative L2 error and top-1 agreement are printed
    (luminal computes in float32 registers over the bf16 weights, torch in bf16);
  * decode: greedy, --decode tokens after a 32-token prompt, tokens/s and achieved GB/s (weight bytes read per token
    over the time per token), as % of the device-to-device copy bandwidth measured in the same run;
  * prefill: one --prefill-token prompt, milliseconds;
  * the ratio to torch eager (HF model, DynamicCache, one token per forward).
Not measured here (not built): the hand-written torch.compile "reduce-overhead" static-cache loop.

    PYTHONPATH=python python3 benchmarks/llm_gpu.py [--models 8b,135m] [--decode 256] [--prefill 2048]
"""
from __future__ import annotations

import argparse
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


def luminal_session(c: LlamaConfig, hf, dtype: str):
    model = Llama(c)
    params = dict(model.named_parameters())
    for name, p in hf.named_parameters():
        if name in params:
            params[name].set(lm.cuda.from_torch(p.detach().contiguous()))
    t = time.perf_counter()
    s = Session(model, [GenericCompiler(), lm.CudaCompiler(dtype)])
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


def luminal_decode(s: Session, prompt, n):
    s.reset()
    logits = s.step(prompt)
    tok = int(np.argmax(logits[-1]))
    toks = [tok]
    t = time.perf_counter()
    for _ in range(n - 1):
        tok = int(np.argmax(s.step([tok])[-1]))
        toks.append(tok)
    return toks, (n - 1) / (time.perf_counter() - t)


def prefill_ms(fn, reps=3):
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
    s, compile_s = luminal_session(c, hf, "bfloat16")
    prompt = rng.integers(0, c.vocab_size, 32).tolist()
    # Logits check (the last prompt position).
    s.reset()
    got = s.step(prompt)
    with torch.no_grad():
        want = hf(torch.tensor([prompt], device="cuda")).logits[0, -1:].float().cpu().numpy()
    got = got[-1:]
    rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    top1 = float(np.mean(np.argmax(got, -1) == np.argmax(want, -1)))
    # Decode.
    luminal_decode(s, prompt, 4)  # warm-up (compiles, plans)
    l_toks, l_tps = luminal_decode(s, prompt, args.decode)
    t_toks, t_tps = torch_decode(hf, prompt, args.decode)
    agree = next((i for i, (a, b) in enumerate(zip(l_toks, t_toks)) if a != b), len(l_toks))
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
        import os

        os.environ["LUMINAL_PROFILE"] = "1"
        print(f"-- profile of one {key} decode step (LUMINAL_PROFILE=1)", flush=True)
        s.step([0])
        del os.environ["LUMINAL_PROFILE"]
    tp = prefill_ms(torch_prefill, 3)
    print(f"\n== {key}: {wb / 1e9:.2f} GB of bf16 weights read per token; luminal compile {compile_s:.1f} s")
    print(f"logits (last prompt position) vs torch bf16: relative L2 error {rel:.3e}, top-1 agreement {top1:.0%}")
    print(f"greedy tokens identical for the first {agree} of {args.decode}")
    print(f"{'':22}{'luminal':>12}{'torch eager':>14}{'ratio':>8}")
    print(f"{'decode tok/s':22}{l_tps:12.1f}{t_tps:14.1f}{l_tps / t_tps:8.2f}")
    print(f"{'decode GB/s':22}{wb * l_tps / 1e9:12.0f}{wb * t_tps / 1e9:14.0f}")
    print(f"{'% of copy bandwidth':22}{100 * wb * l_tps / bw:11.1f}%{100 * wb * t_tps / bw:13.1f}%")
    print(f"{'prefill ' + str(args.prefill) + ' ms':22}{lp:12.1f}{tp:14.1f}{tp / lp:8.2f}")
    del s, hf
    torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="8b,135m")
    p.add_argument("--decode", type=int, default=256)
    p.add_argument("--prefill", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", action="store_true", help="print the time per op kind of one decode step")
    args = p.parse_args()
    ok, why = lm.cuda_available()
    if not ok:
        raise SystemExit(f"no GPU: {why}")
    bw = copy_bandwidth()
    print(f"device: {why}; device-to-device copy {bw / 1e9:.0f} GB/s (read + write)")
    for key in args.models.split(","):
        run_model(key, args, bw)


if __name__ == "__main__":
    main()
