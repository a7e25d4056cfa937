"""The CUDA backend's matrix products (src/cuda/codegen.cpp: the tensor-core kernel, mma_kernel, 64 x 64 tiles, with
16-byte staging for aligned rows and element loads otherwise; the float32 tiled kernel): parity with torch on every
backend at shapes off the tiles' edges, and the variants a linear layer gets."""
from __future__ import annotations

import pytest

import luminal as lm
from helpers import check


def _linear(x, w):
    return x @ w.transpose(-1, -2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(300, 96, 200), (257, 64, 136), (40, 64, 72), (260, 40, 24)])
def test_linear(backend, rng, dtype, shape):
    """Rows past the tiles' edges (M, N not multiples of 64); K a multiple of 32 (16-byte staging) or not."""
    m, k, n = shape
    # (|x| <= 1: sums of k products rounded to a 16-bit output; atol covers the cancellations)
    check(_linear, _linear, shapes=[(m, k), (n, k)], dtype=dtype, backend=backend, rng=rng, name=f"linear {shape}",
          domain="small", tol_scale=4, atol=None if dtype == "float32" else 0.25)


def test_batched(backend, rng):
    check(lambda a, b: a @ b, lambda a, b: a @ b, shapes=[(2, 270, 64), (2, 64, 40)], dtype="bfloat16",
          backend=backend, rng=rng, name="batched matmul", tol_scale=4)


def test_printed_variants():
    cx = lm.Graph()
    x, w = cx.tensor(("s", 256)), cx.tensor((512, 256))
    _linear(x, w).output()
    comp = lm.CudaCompiler("bfloat16", device=None)
    cx.compile(lm.GenericCompiler(), comp)
    kinds = [[k for k, _ in vs] for _, vs, _ in comp.schedule.kernels()]
    assert ["mma", "gemv", "warps"] in kinds, kinds
