"""GPU GEMM sweep on Llama-3-8B's shapes: a Linear layer, x (M, K) @ w (N, K)^T with the weights kept in bf16, as
luminal runs it with our tensor-core kernels (LUMINAL_CUDA_GEMM=own), with cuBLASLt (=cublas) and with the variant
timing picks (the default), against torch.matmul on bf16 operands (cuBLAS).

Two kinds of rows (--x): bf16, x and w bf16 inputs and a bf16 output (torch's product exactly: the GEMM alone);
f32, x a float32 intermediate (x * 2, as a model's activations are) and a float32 output (what luminal's graphs of
float32 models compute): our kernels round x to bf16 while staging, cuBLASLt's variant copies it, rounded, into its
workspace first; torch's peer for those rows is (x * 2).bfloat16() @ w.T, and in brackets the same with a float32
output (torch.mm's out_dtype).

Rows under 16 (a batched decode step's Linear; --m 1,2,8,32) add a column "rows16": the runtime as it was before
GEMM variants applied to 2-15 rows (LUMINAL_CUDA_GEMM_MIN_ROWS=16: the matrix-vector kernel, a weight read per row);
"tuned" then times the GEMM variants against that kernel (one row: the matrix-vector kernel, never timed), and
"own" is the 64-row tensor-core tiles.

Times are GPU time per run: the sum of the run's kernels (CUDA kernel activity through torch.profiler, --reps runs),
so the element-wise x * 2 and cuBLASLt's copy count; Nx is torch's time over luminal's; err luminal's relative L2
error against torch's result.

    PYTHONPATH=python python3 benchmarks/gemm_gpu.py [--m 512,2048,8192] [--kn 4096x4096,...] [--x bf16,f32]
    PYTHONPATH=python python3 benchmarks/gemm_gpu.py --m 1,2,8,32 --kn 4096x4096,4096x14336,14336x4096  # decode
"""
from __future__ import annotations

import argparse
import os

import torch

import luminal as lm
from attention_gpu import time_luminal  # the same timing for both kernel benchmarks

MODES = ("own", "cublas", "tuned")  # (--modes may add our variants by name: wgmma256, wgmma128, gemm128, gemm64)


def gpu_ms(fn, reps, table=False):
    """GPU milliseconds per call of fn: the summed duration of its CUDA kernels over `reps` calls (None if the
    profiler saw none); `table`: print the profiler's table of them."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
        if table:
            print(prof.key_averages().table(sort_by="device_time_total", row_limit=8))
        total = 0.0
        for e in prof.key_averages():
            if not e.key.startswith(("Memcpy", "Memset")):  # (kernels only: not a run's read of its error word)
                total += getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0) or 0
        return total / reps / 1e3 if total else None
    except Exception as e:  # (a profiler that cannot see luminal's kernels: the wall times still print)
        print(f"  (profiler: {e})")
        return None


def luminal_gemm(m, k, n, x, w, f32_act, mode):
    # (both read when a run plans its products)
    os.environ.pop("LUMINAL_CUDA_GEMM_MIN_ROWS", None)
    if mode in ("tuned", "rows16"):
        os.environ.pop("LUMINAL_CUDA_GEMM", None)
    else:
        os.environ["LUMINAL_CUDA_GEMM"] = mode
    if mode == "rows16":
        os.environ["LUMINAL_CUDA_GEMM_MIN_ROWS"] = "16"
    cx = lm.Graph()
    a = cx.tensor((m, k), dtype="float32" if f32_act else "bfloat16").set(lm.cuda.from_torch(x))
    # (float32 weights kept in bf16: these bf16 values as they are; bf16 weights: a bf16 product)
    b = cx.tensor((n, k), dtype="float32" if f32_act else "bfloat16").set(lm.cuda.from_torch(w))
    o = ((a * 2.0 if f32_act else a) @ b.transpose(0, 1)).output()
    cx.compile(lm.GenericCompiler(), lm.CudaCompiler("bfloat16"))
    return cx, o


def row(m, k, n, xk, reps, show=False, modes=MODES):
    f32_act = xk == "f32"
    g = torch.Generator(device="cuda").manual_seed(m + k + n)
    x = torch.randn(m, k, generator=g, device="cuda")
    w = (torch.randn(n, k, generator=g, device="cuda") / k ** 0.5).bfloat16()
    xb = x.bfloat16()
    xin = x if f32_act else xb
    peer = (lambda: (x * 2).bfloat16() @ w.T) if f32_act else (lambda: xb @ w.T)
    t_torch = gpu_ms(peer, reps)
    extra = ""
    if f32_act:  # torch with a float32 output too, where it has one (torch.mm's out_dtype)
        try:
            extra = f" (f32 out {gpu_ms(lambda: torch.mm((x * 2).bfloat16(), w.T, out_dtype=torch.float32), reps):7.3f})"
        except (TypeError, RuntimeError) as e:
            extra = f" (f32 out: {str(e).splitlines()[0][:40]})"
    want = peer().float()
    fl = 2 * m * k * n / 1e9
    cells = []
    for mode in tuple(modes) + (("rows16",) if m < 16 else ()):
        cx, o = luminal_gemm(m, k, n, xin, w, f32_act, mode)
        cx.execute()  # (compile, upload, plan; tuned: the timing of the variants)
        got = torch.from_numpy(o.numpy()).cuda().float()
        err = float((got - want).norm() / want.norm())
        t = gpu_ms(lambda: cx.execute(wait=False), reps, table=show and mode == "cublas")
        if t is None:  # (no profiler: wall time per run, the host's work and a result's read included)
            t = time_luminal(cx, o, reps)
        cells.append(f"{mode} {t:7.3f} ms {fl / t:4.0f} TF {t_torch / t:4.2f}x (err {err:.0e})")
        del cx, o
    os.environ.pop("LUMINAL_CUDA_GEMM", None)
    os.environ.pop("LUMINAL_CUDA_GEMM_MIN_ROWS", None)
    print(f"GEMM {m:5d}x{k:5d}x{n:5d} x={xk:4s} torch {t_torch:7.3f} ms {fl / t_torch:4.0f} TF{extra} | "
          + " | ".join(cells), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--m", default="512,2048,8192", help="rows (tokens)")
    p.add_argument("--kn", default="4096x4096,4096x6144,4096x14336,14336x4096",
                   help="K x N (Llama-3-8B's Linear layers: wo, fused qkv, gate/up, down)")
    p.add_argument("--x", default="bf16,f32", help="bf16 operands and output; float32 activations and output")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--modes", default=",".join(MODES),
                   help="luminal's columns: own, cublas, tuned, or one of our GEMM variants forced by name (e.g. wgmma256)")
    p.add_argument("--table", action="store_true", help="print the kernels of the first row's cuBLASLt runs")
    a = p.parse_args()
    print(torch.cuda.get_device_name(), "| cuBLASLt:", lm.cuda.cublas_available()[1].splitlines()[0], flush=True)
    print("(ms: GPU time per run; TF: TFLOP/s; Nx: torch's time over luminal's)", flush=True)
    for m in [int(v) for v in a.m.split(",") if v]:
        for kn in [v for v in a.kn.split(",") if v]:
            for xk in [v for v in a.x.split(",") if v]:
                row(m, *map(int, kn.split("x")), xk, a.reps, show=a.table, modes=a.modes.split(","))
                a.table = False


if __name__ == "__main__":
    main()
