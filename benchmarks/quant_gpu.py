"""Q8_0 matrix-vector bandwidth on the GPU per Llama-3-8B weight shape, one activation row, bf16 compute, GB/s
counted on the Q8_0 bytes: the matrix-vector group kernel with Q8_0 members (qrows: float activations, the quants
unpacked in registers; the default for products in a group, LUMINAL_CUDA_Q8_ROWS=1 makes a lone product take it
too), the int8-dot kernel (qdot, LUMINAL_CUDA_Q8_ROWS=0) and the float kernel (qgemv, LUMINAL_CUDA_Q8_ROWS=0
LUMINAL_CUDA_Q8_DP4A=0). Each graph multiplies the same activations by up to 16 weights so that they do not fit in
L2 together (qrows: one group kernel over all of them).

    PYTHONPATH=python python3 benchmarks/quant_gpu.py [--cpu]   (--cpu: a syntax check on the CPU backend)
"""
import os
import sys
import time

import numpy as np

import luminal as lm
from luminal.quant import QuantizedWeight, dequantize
cpu = "--cpu" in sys.argv  # (syntax check without a GPU)
gen = np.random.default_rng(0)
MODES = {"qrows": {"LUMINAL_CUDA_Q8_ROWS": "1", "LUMINAL_CUDA_Q8_DP4A": "1"},
         "qdot": {"LUMINAL_CUDA_Q8_ROWS": "0", "LUMINAL_CUDA_Q8_DP4A": "1"},
         "qgemv": {"LUMINAL_CUDA_Q8_ROWS": "0", "LUMINAL_CUDA_Q8_DP4A": "0"}}
for name, n, k in [("q/o", 4096, 4096), ("k/v", 1024, 4096), ("qkv", 6144, 4096), ("gate/up", 28672, 4096),
                   ("down", 4096, 14336), ("lm_head", 128256, 4096)]:
    copies = max(1, min(16, int(8e8 // (n * k))))  # (lm_head alone: one)
    if cpu:
        n, copies = 64, 2
    raws = [np.concatenate([gen.uniform(-0.1, 0.1, (n, k // 32, 1)).astype(np.float16).view(np.uint8),
                            gen.integers(-127, 128, (n, k // 32, 32), dtype=np.int8).view(np.uint8)], -1).reshape(n, -1)
            for _ in range(copies)]
    rates = {}
    for mode, env in MODES.items():
        os.environ.update(env)
        g = lm.Graph()
        x = g.tensor((1, k), name="x").set(gen.standard_normal((1, k)).astype(np.float32))
        h = x * 1.0
        ys = [(h @ dequantize(g, QuantizedWeight(r, "Q8_0", (n, k)), name=f"w{j}").T).output() for j, r in enumerate(raws)]
        g.compile(lm.GenericCompiler(), lm.CPUCompiler() if cpu else lm.CudaCompiler("bfloat16"))
        for _ in range(3):
            g.execute(); ys[-1].numpy()
        reps = 2 if cpu else 20
        t = time.perf_counter()
        for _ in range(reps):
            g.execute()
        ys[-1].numpy()
        dt = (time.perf_counter() - t) / reps / copies
        rates[mode] = n * k // 32 * 34 / dt / 1e9
    for env in MODES.values():
        for key in env:
            os.environ.pop(key, None)
    print(f"{name:8s} {n:6d} x {k:5d}: " + "   ".join(f"{m} {r:7.0f} GB/s" for m, r in rates.items()), flush=True)
