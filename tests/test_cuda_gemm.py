"""The CUDA backend's matrix products (src/cuda/codegen.cpp: the pipelined tensor-core GEMM, gemm_kernel, 128 x 128
or 64 x 64 tiles for 16-byte aligned rows; the older tensor-core kernel, mma_kernel, for other rows; the float32 tiled
kernel): parity with torch on every backend at shapes off the tiles' edges, and the variants a linear layer gets."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import luminal as lm
from helpers import NVRTC_CHECK, check, needs_cuda, needs_nvrtc


def _linear(x, w):
    return x @ w.transpose(-1, -2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(300, 96, 200), (257, 64, 136), (40, 64, 72), (260, 40, 24), (70, 16, 130),
                                   (33, 36, 18)])
def test_linear(backend, rng, dtype, shape):
    """Rows past the tiles' edges (M, N not multiples of 64 or 128); K a multiple of 32, of 8 only (the pipelined
    kernel zero-fills the last tile; 16 and 40: fewer tiles than its ring's stages) or neither (the older kernel);
    N odd (element stores)."""
    m, k, n = shape
    # (|x| <= 1: sums of k products rounded to a 16-bit output; atol covers the cancellations)
    check(_linear, _linear, shapes=[(m, k), (n, k)], dtype=dtype, backend=backend, rng=rng, name=f"linear {shape}",
          domain="small", tol_scale=4, atol=None if dtype == "float32" else 0.25)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_large_tiles(backend, rng, dtype):
    """Enough 128 x 128 tiles to fill an H100 (9 x 17): the large-tile kernel, 5 tiles of k (the last partial)."""
    if backend.name in ("reference", "cpu"):
        pytest.skip("a shape for the GPU's large-tile kernel (test_linear covers the CPU backends)")
    check(_linear, _linear, shapes=[(1030, 136), (2100, 136)], dtype=dtype, backend=backend, rng=rng,
          name="linear 1030x136x2100", domain="small", tol_scale=4, atol=0.25)


def test_batched(backend, rng):
    check(lambda a, b: a @ b, lambda a, b: a @ b, shapes=[(2, 270, 64), (2, 64, 40)], dtype="bfloat16",
          backend=backend, rng=rng, name="batched matmul", tol_scale=4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_float32_activations(rng, dtype):
    """A float32 intermediate times 16-bit weights: the kernel loads the activations as floats and rounds them
    (cvt.rn.*x2.f32) while staging; an output in the 16-bit dtype takes the paired stores."""
    # (on a GPU its kernels run; without one they are compiled with NVRTC and the lowering runs on the CPU)
    if needs_cuda() is None:
        compilers = [lm.CudaCompiler(dtype)]
    elif needs_nvrtc() is None:
        compilers = [lm.CudaCompiler(dtype, device=None), NVRTC_CHECK]
    else:
        pytest.skip(needs_nvrtc())
    for m, k, n, out16 in [(300, 96, 200, False), (1030, 72, 2100, False), (129, 64, 66, True)]:
        x = rng.data((m, k)).astype(np.float32)
        w = (rng.data((n, k)) / k ** 0.5).astype(np.float32)
        cx = lm.Graph()
        a, b = cx.tensor((m, k)).set(x), cx.tensor((n, k)).set(w)
        y = (a * 2.0) @ b.transpose(0, 1)  # (a float32 intermediate: stored as float32, not rounded to the weights')
        y = (y.to(dtype) if out16 else y).output()
        cx.compile(lm.GenericCompiler(), *compilers)
        cx.execute()
        got = y.numpy().astype(np.float32)
        td = getattr(torch, dtype)
        want = ((torch.from_numpy(x) * 2).to(td).float() @ torch.from_numpy(w).to(td).float().T)
        want = (want.to(td).float() if out16 else want).numpy()
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=3e-2, err_msg=f"{dtype} {m}x{k}x{n}")


def test_printed_variants():
    cx = lm.Graph()
    x, w = cx.tensor(("s", 256)), cx.tensor((512, 256))
    _linear(x, w).output()
    comp = lm.CudaCompiler("bfloat16", device=None)
    cx.compile(lm.GenericCompiler(), comp)
    kinds = [[k for k, _ in vs] for _, vs, _ in comp.schedule.kernels()]
    assert ["gemm128", "gemm64", "mma", "gemv", "warps"] in kinds, kinds
