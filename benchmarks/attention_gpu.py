"""GPU attention micro-benchmark: luminal's attention kernel (flash attention; key ranges merged for decode) against
the unfused path (scores, softmax, weighted values as three kernels) and torch's scaled_dot_product_attention, on
Llama-3-8B's attention shape (32 query heads, 8 KV heads, head dim 128), inputs in float32 as a luminal graph computes
them. Prints milliseconds per run (luminal: --reps runs queued, best of 3; torch: the median of --reps, timed with
events) per shape. Prefill rows also time the mma.sync kernel in place of Hopper's (LUMINAL_CUDA_FLASH_WGMMA=0:
flash-mma-skip in place of flash-wgmma, which takes a 16-bit cache in the compute dtype on an sm_90 GPU) and that
kernel without its masked-tile skipping (LUMINAL_CUDA_FLASH_MMA_SKIP=0: flash-mma); decode rows the SIMT flash
kernel in place of the decode kernel (LUMINAL_CUDA_FLASH_DECODE=0), and with --chunks the decode kernel at each
forced key-range length (LUMINAL_CUDA_ATTENTION_CHUNK). The luminal columns time whole runs of the graph, more than
the attention kernel (benchmarks/kernel_profile.py times kernels alone). --kv-dtype bfloat16/float16: k and v as a
16-bit KV cache gives them (inputs of that dtype read through a float32 cast, which the attention kernel reads
through; torch gets the same rounded values).

    PYTHONPATH=python python3 benchmarks/attention_gpu.py [--prefill 512,2048] [--decode 128,4096,8192] [--reps 20]
        [--chunks 128,256,512,1024] [--kv-dtype float32|bfloat16|float16]

The GEMM sweep is benchmarks/gemm_gpu.py.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as TF

import luminal as lm
import luminal.nn.functional as F

H, HKV, D = 32, 8, 128
KV_DTYPE = "float32"  # (--kv-dtype)


def luminal_attention(L, S, fused=True, dtype="bfloat16", causal=False):
    cx = lm.Graph()
    q, k, v = cx.tensor((1, H, L, D)), cx.tensor((1, HKV, S, D), KV_DTYPE), cx.tensor((1, HKV, S, D), KV_DTYPE)
    o = F.scaled_dot_product_attention(q, k.float(), v.float(), is_causal=causal, enable_gqa=True).output()
    cx.compile(lm.GenericCompiler(), lm.CudaCompiler(dtype, flash_attention=fused))
    g = torch.Generator().manual_seed(L * 7 + S)
    arrs = [torch.randn(s, generator=g) for s in [(1, H, L, D), (1, HKV, S, D), (1, HKV, S, D)]]
    if KV_DTYPE != "float32":  # (the values a 16-bit cache holds)
        arrs[1:] = [a.to(getattr(torch, KV_DTYPE)).float() for a in arrs[1:]]
    arrs = [a.numpy() for a in arrs]
    for t, a in zip((q, k, v), arrs):
        t.set(a)
    return cx, o, arrs


def time_luminal(cx, o, reps):
    """Milliseconds per run: `reps` runs queued back to back (the host's launch work overlaps the GPU's), best of 3."""
    cx.execute()  # compile, upload, first plan
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reps):
            cx.execute(wait=False)
        o.numpy()
        best = min(best, (time.perf_counter() - t) / reps)
    return best * 1e3


def time_torch(fn, reps):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def time_with(env, L, S, reps, causal):
    """time_luminal of a fresh graph with environment variables `env` set while it is planned and run."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        cx, o, _ = luminal_attention(L, S, causal=causal)
        return time_luminal(cx, o, reps)
    finally:
        for k, v in old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def row(L, S, reps, causal, chunks=()):
    cx, o, arrs = luminal_attention(L, S, causal=causal)
    fused = time_luminal(cx, o, reps)
    got = o.numpy()
    tq, tk, tv = (torch.from_numpy(a).cuda() for a in arrs)
    want = TF.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=True)
    err = float((torch.from_numpy(got).cuda() - want).norm() / want.norm())
    cx2, o2, _ = luminal_attention(L, S, fused=False, causal=causal)
    unfused = time_luminal(cx2, o2, reps)
    t32 = time_torch(lambda: TF.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=True), reps)
    bq, bk, bv = tq.bfloat16(), tk.bfloat16(), tv.bfloat16()
    t16 = time_torch(lambda: TF.scaled_dot_product_attention(bq, bk, bv, is_causal=causal, enable_gqa=True), reps)
    flops = 4 * H * L * S * D / (2 if causal else 1)
    off = {"LUMINAL_CUDA_FLASH_WGMMA": "0"}
    simt = f"  simt flash {time_with({'LUMINAL_CUDA_FLASH_DECODE': '0'}, L, S, reps, causal):8.3f} ms" if L == 1 else \
        f"  mma.sync {time_with(off, L, S, reps, causal):8.3f} ms" \
        f"  no skip {time_with({**off, 'LUMINAL_CUDA_FLASH_MMA_SKIP': '0'}, L, S, reps, causal):8.3f} ms"
    print(f"L={L:5d} S={S:5d} causal={int(causal)}  luminal {fused:8.3f} ms ({flops / fused / 1e9:6.1f} TFLOP/s)  "
          f"unfused {unfused:8.3f} ms{simt}  torch f32 {t32:8.3f} ms  torch bf16 {t16:8.3f} ms  rel.err {err:.1e}",
          flush=True)
    if L == 1 and chunks:
        print("    decode kernel, keys per range: " + "  ".join(
            f"{c}: {time_with({'LUMINAL_CUDA_ATTENTION_CHUNK': str(c)}, L, S, reps, causal):.4f} ms" for c in chunks),
            flush=True)
    return fused


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prefill", default="512,2048")
    p.add_argument("--decode", default="128,4096,8192")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--chunks", default="", help="decode rows: also time these key-range lengths")
    p.add_argument("--kv-dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="k and v as a KV cache of this dtype holds them")
    a = p.parse_args()
    global KV_DTYPE
    KV_DTYPE = a.kv_dtype
    chunks = [int(x) for x in a.chunks.split(",") if x]
    print(f"{torch.cuda.get_device_name()}; {KV_DTYPE} k and v", flush=True)
    for n in [int(x) for x in a.prefill.split(",") if x]:
        row(n, n, a.reps, causal=True)
    dec = {}
    for n in [int(x) for x in a.decode.split(",") if x]:
        dec[n] = row(1, n, a.reps, causal=False, chunks=chunks)
    if len(dec) > 1:
        short = min(dec)
        for n, t in dec.items():
            print(f"decode rate at {n} keys / at {short}: {dec[short] / t:.2f}x")


if __name__ == "__main__":
    main()
