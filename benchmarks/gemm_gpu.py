"""GPU GEMM sweep: luminal's tensor-core matrix product (a Linear layer, x (M, K) @ w (N, K)^T, weights kept in bf16)
against torch.matmul on bf16 operands (cuBLAS), on Llama-3-8B's shapes. Two rows per shape: the activations an input
(stored in bf16, so both operands are copied as stored) and a float32 intermediate (x * 2, as a model's activations
are: rounded to bf16 while staging; the extra element-wise kernel is not counted).

Times are the GEMM kernel's own (CUDA kernel activity through torch.profiler: the longest kernel of a run), besides
luminal's whole run (--reps runs queued, best of 3, the host's launch work included) and torch's (events, median).

    PYTHONPATH=python python3 benchmarks/gemm_gpu.py [--m 2048,512,32] [--kn 4096x4096,4096x14336,14336x4096]
"""
from __future__ import annotations

import argparse

import torch

import luminal as lm
from attention_gpu import time_luminal, time_torch  # the same timing for both kernel benchmarks


def kernel_ms(fn, reps):
    """The longest GPU kernel's mean duration over `reps` calls of fn, in ms (None if the profiler saw none)."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
        best = None
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if e.count and t and (best is None or t / e.count > best):
                best = t / e.count
        return None if best is None else best / 1e3
    except Exception as e:  # (a profiler that cannot see luminal's kernels: the wall times still print)
        print(f"  (profiler: {e})")
        return None


def luminal_gemm(m, k, n, x, w, f32_act):
    cx = lm.Graph()
    a, b = cx.tensor((m, k)).set(x), cx.tensor((n, k)).set(w)
    o = ((a * 2.0 if f32_act else a) @ b.transpose(0, 1)).output()
    cx.compile(lm.GenericCompiler(), lm.CudaCompiler("bfloat16"))
    return cx, o


def row(m, k, n, reps):
    g = torch.Generator().manual_seed(m + k + n)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) / k ** 0.5
    tx, tw = x.cuda().bfloat16(), w.cuda().bfloat16()
    tt = time_torch(lambda: tx @ tw.T, reps)
    tk = kernel_ms(lambda: tx @ tw.T, reps) or tt
    fl = 2 * m * k * n / 1e9
    for f32_act in (False, True):
        cx, o = luminal_gemm(m, k, n, x.numpy(), w.numpy(), f32_act)
        wall = time_luminal(cx, o, reps)
        got = torch.from_numpy(o.numpy()).cuda()
        want = ((tx.float() * 2).bfloat16() if f32_act else tx).float() @ tw.float().T
        err = float((got - want).norm() / want.norm())
        kern = kernel_ms(lambda: cx.execute(wait=False), reps)
        t = kern if kern is not None else wall
        print(f"GEMM {m:5d}x{k:5d}x{n:5d} x={'f32' if f32_act else 'bf16'}  luminal kernel {t:7.3f} ms "
              f"({fl / t:4.0f} TFLOP/s, run {wall:7.3f} ms)  cuBLAS {tk:7.3f} ms ({fl / tk:4.0f})  "
              f"ratio {tk / t:.2f}x  rel.err {err:.1e}", flush=True)
        del cx, o


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--m", default="2048,512,32", help="rows (tokens)")
    p.add_argument("--kn", default="4096x4096,4096x14336,14336x4096", help="K x N (Llama-3-8B's Linear layers)")
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    print(torch.cuda.get_device_name(), flush=True)
    for m in [int(v) for v in a.m.split(",") if v]:
        for kn in [v for v in a.kn.split(",") if v]:
            row(m, *map(int, kn.split("x")), a.reps)


if __name__ == "__main__":
    main()
