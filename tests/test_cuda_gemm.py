"""The CUDA backend's matrix products (src/cuda/codegen.cpp: the pipelined tensor-core GEMM, gemm_kernel, 128 x 128
or 64 x 64 tiles for 16-byte aligned rows; the older tensor-core kernel, mma_kernel, for other rows; the float32 tiled
kernel): parity with torch on every backend at shapes off the tiles' edges, and the variants a linear layer gets."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import luminal as lm
from helpers import NVRTC_CHECK, Backend, check, needs_cuda, needs_nvrtc


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
    gpu = needs_cuda() is None
    if gpu:
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
        # (the CPU's run of the lowering keeps the activations in float32: only the GPU's tensor cores round them)
        xs = torch.from_numpy(x) * 2
        want = ((xs.to(td).float() if gpu else xs) @ torch.from_numpy(w).to(td).float().T)
        want = (want.to(td).float() if out16 else want).numpy()
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=3e-2, err_msg=f"{dtype} {m}x{k}x{n}")


def test_printed_variants():
    cx = lm.Graph()
    x, w = cx.tensor(("s", 256)), cx.tensor((512, 256))
    _linear(x, w).output()
    comp = lm.CudaCompiler("bfloat16", device=None)
    cx.compile(lm.GenericCompiler(), comp)
    kinds = [[k for k, _ in vs] for _, vs, _ in comp.schedule.kernels()]
    assert ["gemm128", "gemm64", "cublas", "mma", "gemv", "warps"] in kinds, kinds


# ---- cuBLASLt as a GEMM variant, and the choice by timing (src/cuda/cublaslt.*, Runtime::choose) -----------------
CUDA = Backend("cuda", lambda dtype: [lm.CudaCompiler(dtype)], needs_cuda)


@pytest.fixture(params=["cublas", "own", "tuned"])
def gemm(request, monkeypatch):
    """The matrix products forced onto cuBLASLt, onto our kernels, or chosen by timing (LUMINAL_CUDA_GEMM)."""
    if needs_cuda():
        pytest.skip(needs_cuda())
    if request.param == "cublas" and not lm.cuda.cublas_available()[0]:
        pytest.skip(lm.cuda.cublas_available()[1].splitlines()[0])
    monkeypatch.delenv("LUMINAL_CUDA_TUNE", raising=False)
    if request.param == "tuned":
        monkeypatch.delenv("LUMINAL_CUDA_GEMM", raising=False)
    else:
        monkeypatch.setenv("LUMINAL_CUDA_GEMM", request.param)
    return request.param


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(300, 96, 200), (257, 72, 136), (70, 16, 130), (129, 63, 65), (1030, 136, 2100)])
def test_gemm_linear(gemm, rng, dtype, shape):
    """Linear layers off the tiles' edges, K odd (cuBLASLt reads rows of 63 in place), enough tiles to fill an H100."""
    m, k, n = shape
    check(_linear, _linear, shapes=[(m, k), (n, k)], dtype=dtype, backend=CUDA, rng=rng, name=f"{gemm} {shape}",
          domain="small", tol_scale=4, atol=0.25)


@pytest.mark.parametrize("case", ["batched", "shared weights", "transposed a"])
def test_gemm_layouts(gemm, rng, case):
    """A batch of products (a batch stride each), a Linear over [batch, tokens, features] (one product of batch x
    tokens rows), an operand with unit stride along its rows (cuBLASLt's transposed operand)."""
    fn, shapes = {
        "batched": (lambda a, b: a @ b, [(3, 270, 64), (3, 64, 40)]),
        "shared weights": (_linear, [(2, 70, 64), (48, 64)]),
        "transposed a": (lambda x, w: x.transpose(0, 1) @ w.transpose(0, 1), [(64, 90), (40, 64)]),
    }[case]
    check(fn, fn, shapes=shapes, dtype="bfloat16", backend=CUDA, rng=rng, name=f"{gemm} {case}", domain="small",
          tol_scale=4, atol=0.25)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gemm_float32_operands(gemm, rng, dtype):
    """Computed float32 operands (a model's activations; both here, as attention's scores): rounded to the compute
    dtype on the way (cuBLASLt: copied, rounded, into its workspace), as the tensor-core kernels stage them; a batch
    of products over strided views; a 16-bit output."""
    for (b, m, k, n), out16 in [((1, 300, 96, 200), False), ((4, 129, 64, 66), True)]:
        x = rng.data((b, m, k)).astype(np.float32)
        w = (rng.data((b, n, k)) / k ** 0.5).astype(np.float32)
        cx = lm.Graph()
        xa, wa = cx.tensor((b, m, k)).set(x), cx.tensor((b, n, k)).set(w)
        y = (xa * 2.0) @ (wa * 0.5).transpose(1, 2)
        y = (y.to(dtype) if out16 else y).output()
        cx.compile(lm.GenericCompiler(), lm.CudaCompiler(dtype))
        cx.execute()
        td = getattr(torch, dtype)
        want = (torch.from_numpy(x) * 2).to(td).float() @ (torch.from_numpy(w) * 0.5).to(td).float().transpose(1, 2)
        want = (want.to(td).float() if out16 else want).numpy()
        np.testing.assert_allclose(y.numpy().astype(np.float32), want, rtol=2e-2, atol=3e-2,
                                   err_msg=f"{gemm} {dtype} {b}x{m}x{k}x{n}")


def test_gemm_symbolic_rows(gemm, rng):
    """One compiled graph, prompts of several lengths: each length plans (and, tuned, times) its own product."""
    k, n = 64, 96
    w = (rng.data((n, k)) / k ** 0.5).astype(np.float32)
    cx = lm.Graph()
    x, wt = cx.tensor(("s", k)), cx.tensor((n, k)).set(w)
    y = _linear(x, wt).output()
    cx.compile(lm.GenericCompiler(), lm.CudaCompiler("bfloat16"))
    wb = torch.from_numpy(w).bfloat16().float()
    for s in (40, 300, 17, 300):
        xs = rng.data((s, k)).astype(np.float32)
        x.set(xs)
        cx.execute()
        want = (torch.from_numpy(xs).bfloat16().float() @ wb.T).numpy()
        np.testing.assert_allclose(y.numpy(), want, rtol=2e-2, atol=3e-2, err_msg=f"{gemm} s={s}")


def test_gemm_forced_variant_runs(gemm, rng, monkeypatch, capfd):
    """The variant that ran, from the per-step profile (LUMINAL_PROFILE=1): cuBLASLt when forced, never when our
    kernels are; timing (with LUMINAL_CUDA_TUNE_LOG) picks one of the two."""
    monkeypatch.setenv("LUMINAL_PROFILE", "1")
    monkeypatch.setenv("LUMINAL_CUDA_TUNE_LOG", "1")
    m, k, n = 1000, 120, 2000  # (a shape no other test here times: its choice is logged once per process)
    check(_linear, _linear, shapes=[(m, k), (n, k)], dtype="bfloat16", backend=CUDA, rng=rng, name=gemm,
          domain="small", tol_scale=4, atol=0.25)
    err = capfd.readouterr().err
    ran = {line.split()[0].split("/")[-1] for line in err.splitlines() if line.startswith("MatMul/")}
    if gemm == "cublas":
        assert ran == {"cublas"}, err
    elif gemm == "own":
        assert ran and "cublas" not in ran, err
    else:
        assert len(ran) == 1, err
        if lm.cuda.cublas_available()[0]:
            assert "luminal tune: MatMul" in err, err


def test_cublas_missing_library(tmp_path):
    """A cuBLASLt that cannot be opened (LUMINAL_CUBLASLT at a missing file): cublas_available() says why, naming
    what it tried; the products still compile (NVRTC) and, on a GPU, run on our kernels even with cuBLASLt forced."""
    code = textwrap.dedent("""
        import numpy as np, luminal as lm
        ok, why = lm.cuda.cublas_available()
        assert not ok and "cannot open cuBLASLt" in why and "missing-cublasLt.so" in why, why
        x = np.random.default_rng(0).standard_normal((70, 64)).astype(np.float32)
        w = np.random.default_rng(1).standard_normal((48, 64)).astype(np.float32) / 8
        cx = lm.Graph()
        y = (cx.tensor((70, 64)).set(x) @ cx.tensor((48, 64)).set(w).transpose(0, 1)).output()
        gpu = lm.cuda_available()[0]
        comp = lm.CudaCompiler("bfloat16", device="auto" if gpu else None)
        cx.compile(lm.GenericCompiler(), comp)
        kinds = [k for _, vs, _ in comp.schedule.kernels() for k, _ in vs]
        assert "cublas" in kinds, kinds
        if gpu:
            cx.execute()
            np.testing.assert_allclose(y.numpy(), x @ w.T, rtol=5e-2, atol=0.1)
            print("ran")
        else:
            lm.cuda.compile_source(comp.schedule.source, 90)
            print("compiled")
    """)
    env = dict(os.environ, LUMINAL_CUBLASLT=str(tmp_path / "missing-cublasLt.so"), LUMINAL_CUDA_GEMM="cublas")
    if needs_cuda() and needs_nvrtc():
        pytest.skip(needs_nvrtc())
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() in ("ran", "compiled"), r.stdout


def test_cublas_available_reason():
    ok, why = lm.cuda.cublas_available()
    assert isinstance(ok, bool) and isinstance(why, str) and why
    assert ("libcublasLt" in why) if ok else ("cannot open cuBLASLt" in why or "lacks the entry point" in why)


def test_gemm_env_rejects_unknown(monkeypatch):
    if needs_cuda():
        pytest.skip(needs_cuda())
    monkeypatch.setenv("LUMINAL_CUDA_GEMM", "fast")
    cx = lm.Graph()
    (cx.tensor((32, 16)).set(np.ones((32, 16), np.float32)) @ cx.tensor((16, 8)).set(np.ones((16, 8), np.float32))).output()
    cx.compile(lm.GenericCompiler(), lm.CudaCompiler("bfloat16"))
    with pytest.raises(ValueError, match="LUMINAL_CUDA_GEMM must be 'cublas' or 'own'"):
        cx.execute()
