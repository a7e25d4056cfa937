"""The CUDA backend's matrix products (src/cuda/codegen.cpp: the pipelined tensor-core GEMM, gemm_kernel, 128 x 128
or 64 x 64 tiles for 16-byte aligned rows; the older tensor-core kernel, mma_kernel, for other rows; the float32 tiled
kernel): parity with torch on every backend at shapes off the tiles' edges, and the variants a linear layer gets;
cuBLASLt and the choice by timing (GPU only), with 2-15 rows (batched decode) against the matrix-vector kernel; the
copy of cuBLASLt's operands into its workspace (NVRTC, and on the host as C++); a product added into its only
reader (the residual add: cuBLASLt's D = A.B + C, the schedule's mark checked without a GPU) and cuBLASLt's calls
captured into the CUDA graph chunks, with graphs on and off."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import cuda_host
import luminal as lm
from helpers import NVRTC_CHECK, Backend, check, needs_cuda, needs_nvrtc, random_quant_blocks, tiny_llama_sessions


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
        # (both round the float32 intermediate to the compute dtype; the CPU's run of the lowering keeps the float32
        # weights as they were set, the GPU's tensor cores take them rounded too)
        xs, ws = (torch.from_numpy(x) * 2).to(td).float(), torch.from_numpy(w)
        want = xs @ (ws.to(td).float() if gpu else ws).T
        want = (want.to(td).float() if out16 else want).numpy()
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=3e-2, err_msg=f"{dtype} {m}x{k}x{n}")


def test_printed_variants():
    cx = lm.Graph()
    x, w = cx.tensor(("s", 256)), cx.tensor((512, 256))
    _linear(x, w).output()
    comp = lm.CudaCompiler("bfloat16", device=None)
    cx.compile(lm.GenericCompiler(), comp)
    kinds = [[k for k, _ in vs] for _, vs, _ in comp.schedule.kernels()]
    assert ["wgmma256", "wgmma128", "gemm128", "gemm64", "cublas", "mma", "gemv", "warps"] in kinds, kinds


def test_wgmma_kernels_compile():
    """The wgmma variants (Hopper's warpgroup products) assemble for sm_90 (as sm_90a) with their accumulators
    pinned (ptxas would otherwise serialise the products), and compile to an empty body for sm_80, whose devices
    never run them."""
    if needs_nvrtc():
        pytest.skip(needs_nvrtc())
    cx = lm.Graph()
    _linear(cx.tensor(("s", 4096), dtype="bfloat16"), cx.tensor((6144, 4096), dtype="bfloat16")).output()
    comp = lm.CudaCompiler("bfloat16", device=None)
    cx.compile(lm.GenericCompiler(), comp)
    (vs,) = [vs for _, vs, _ in comp.schedule.kernels() if vs[0][0] == "wgmma256"]
    texts = dict(comp.schedule.kernel_texts)
    for kind, fn in vs[:2]:
        assert "wgmma.mma_async.sync.aligned.m64n%sk16.f32.bf16.bf16" % kind[5:] in texts[fn], kind
        assert "cp.async.bulk.tensor" in texts[fn] or "tma_load" in texts[fn], kind
    for arch in (80, 90):
        assert lm.cuda.compile_source(comp.schedule.source, arch)[:4] == b"\x7fELF"


# ---- cuBLASLt as a GEMM variant, and the choice by timing (src/cuda/cublaslt.*, Runtime::choose) -----------------
CUDA = Backend("cuda", lambda dtype: [lm.CudaCompiler(dtype)], needs_cuda)


@pytest.fixture(params=["cublas", "own", "tuned", "wgmma128", "wgmma256", "gemm128"])
def gemm(request, monkeypatch):
    """The matrix products forced onto cuBLASLt, onto our kernels, onto one of them (where it applies), or chosen
    by timing (LUMINAL_CUDA_GEMM)."""
    if needs_cuda():
        pytest.skip(needs_cuda())
    if request.param == "cublas" and not lm.cuda.cublas_available()[0]:
        pytest.skip(lm.cuda.cublas_available()[1].splitlines()[0])
    if request.param.startswith("wgmma") and lm._core.cuda_device()["compute_capability"] != 90:
        pytest.skip("the wgmma kernels run on sm_90 devices")
    monkeypatch.delenv("LUMINAL_CUDA_TUNE", raising=False)
    if request.param == "tuned":
        monkeypatch.delenv("LUMINAL_CUDA_GEMM", raising=False)
    else:
        monkeypatch.setenv("LUMINAL_CUDA_GEMM", request.param)
    return request.param


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(300, 96, 200), (257, 72, 136), (70, 16, 130), (129, 63, 65), (1030, 136, 2100),
                                   (2100, 320, 2600)])
def test_gemm_linear(gemm, rng, dtype, shape):
    """Linear layers off the tiles' edges, K odd (cuBLASLt reads rows of 63 in place), enough tiles to fill an H100;
    more tiles than an H100 has multiprocessors (the wgmma kernels' blocks take several in turn, their rings'
    iterations running on across tiles: 5 k steps a tile), N a multiple of 8 (their outputs stored from shared
    memory) or not (from registers)."""
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
    """The variant that ran, from the per-step profile (LUMINAL_PROFILE=1): the one forced (cuBLASLt, or one of ours),
    never cuBLASLt when our kernels are; timing (with LUMINAL_CUDA_TUNE_LOG) picks one."""
    monkeypatch.setenv("LUMINAL_PROFILE", "1")
    monkeypatch.setenv("LUMINAL_CUDA_TUNE_LOG", "1")
    m, k, n = 1100, 120, 2000  # (no other test here times this shape: its choice is logged once per process; 9 x
    # 16 tiles of 128 rows, enough for gemm128 on 132 multiprocessors)
    check(_linear, _linear, shapes=[(m, k), (n, k)], dtype="bfloat16", backend=CUDA, rng=rng, name=gemm,
          domain="small", tol_scale=4, atol=0.25)
    err = capfd.readouterr().err
    ran = {line.split()[0].split("/")[-1] for line in err.splitlines() if line.startswith("MatMul/")}
    if gemm not in ("own", "tuned"):  # (one variant forced by name)
        assert ran == {gemm}, err
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
    with pytest.raises(ValueError, match="LUMINAL_CUDA_GEMM must be 'cublas', 'own' or one of our GEMM variants "
                                         r"\(wgmma256, wgmma128, gemm128, gemm64, qmma\), got 'fast'"):
        cx.execute()


# ---- few rows (batched decode): the GEMM variants timed against the matrix-vector kernel --------------------------
@pytest.mark.parametrize("m", [2, 3, 8, 15])
def test_gemm_few_rows(gemm, rng, m):
    """2-15 rows (a batched decode step's Linear): cuBLASLt forced, our kernels (the 64-row tiles, mostly empty) or
    the timed choice among them and the matrix-vector kernel; K and N off every tile's edge."""
    k, n = 72, 136
    check(_linear, _linear, shapes=[(m, k), (n, k)], dtype="bfloat16", backend=CUDA, rng=rng, name=f"{gemm} m={m}",
          domain="small", tol_scale=4, atol=0.25)


@pytest.mark.parametrize("batch", [2, 5, 8])
def test_gemm_batched_decode(gemm, rng, batch):
    """[batch, 1, features] @ w^T, float32 activations (as a model's): cuBLASLt folds the batch into one product of
    `batch` rows, its operand copied (rounded) into the workspace."""
    k, n = 64, 96
    x = rng.data((batch, 1, k)).astype(np.float32)
    w = (rng.data((n, k)) / k ** 0.5).astype(np.float32)
    cx = lm.Graph()
    xa, wa = cx.tensor((batch, 1, k)).set(x), cx.tensor((n, k)).set(w)
    y = ((xa * 2.0) @ wa.transpose(0, 1)).output()
    cx.compile(lm.GenericCompiler(), lm.CudaCompiler("bfloat16"))
    cx.execute()
    want = (torch.from_numpy(x) * 2).bfloat16().float() @ torch.from_numpy(w).bfloat16().float().T
    np.testing.assert_allclose(y.numpy(), want.numpy(), rtol=2e-2, atol=3e-2, err_msg=f"{gemm} batch {batch}")


def test_gemm_one_row_not_timed(gemm, rng, monkeypatch, capfd):
    """A single row (decode) keeps the matrix-vector kernel, never timed nor forced onto cuBLASLt; 8 rows are timed
    (tuned: a log line naming the matrix-vector kernel among the candidates)."""
    monkeypatch.setenv("LUMINAL_PROFILE", "1")
    monkeypatch.setenv("LUMINAL_CUDA_TUNE_LOG", "1")
    k, n = 88, 120  # (a shape no other test times: its choice is logged once per process)
    check(_linear, _linear, shapes=[(1, k), (n, k)], dtype="bfloat16", backend=CUDA, rng=rng, name=f"{gemm} m=1",
          domain="small", tol_scale=4, atol=0.25)
    err = capfd.readouterr().err
    ran = {line.split()[0].split("/")[-1] for line in err.splitlines() if line.startswith("MatMul/")}
    assert ran == {"gemv"} and "luminal tune" not in err, err
    check(_linear, _linear, shapes=[(8, k), (n, k)], dtype="bfloat16", backend=CUDA, rng=rng, name=f"{gemm} m=8",
          domain="small", tol_scale=4, atol=0.25)
    err = capfd.readouterr().err
    if gemm == "tuned":
        assert "luminal tune: MatMul" in err and "gemv" in err.split("luminal tune: MatMul")[1], err


# ---- the operand copy into cuBLASLt's workspace (cublaslt.cpp copy_rows, copy_rows8) ------------------------------
COPY_PAIRS = [("float32", "bfloat16"), ("float32", "float16"), ("float16", "bfloat16"), ("bfloat16", "float16"),
              ("bfloat16", "bfloat16")]


def test_copy_kernels_compile():
    """The copy kernels of every pair of dtypes compile with NVRTC (no GPU needed)."""
    if needs_nvrtc():
        pytest.skip(needs_nvrtc())
    for arch in (80, 90):
        for f, t in COPY_PAIRS:
            lm.cuda.compile_source(lm._core.cuda_prelude() + lm._core.cublas_copy_source(f, t), arch)
        for t in ("bfloat16", "float16"):
            lm.cuda.compile_source(lm._core.cuda_prelude() + lm._core.cublas_q8_source(t), arch)


COPY_CASES = [  # (shape [rows..., K], strides, offset in elements, from, vec expected)
    ((7, 40), (40, 1), 0, "float32", True),  # contiguous: one row of 280
    ((5, 13), (13, 1), 4, "float32", True),  # one row of 65: a scalar tail of 1, an aligned start past 0
    ((3, 5, 24), (200, 32, 1), 4, "float32", True),  # padded rows, 16-byte aligned: 15 rows of 24
    ((2, 4, 16), (128, 16, 1), 0, "float32", True),  # batch and rows merged: 2 rows of 64
    ((3, 5, 24), (200, 32, 1), 2, "float32", False),  # start 8 bytes off: element by element
    ((4, 20), (24, 1), 0, "float32", False),  # K not a multiple of 8 over several rows
    ((6, 16), (1, 6), 0, "float32", False),  # transposed (unit stride along the rows)
    ((2, 3, 1, 33), (99, 33, 7, 1), 0, "float32", True),  # a size-1 axis: one row of 198
    ((1, 5), (5, 1), 4, "float32", True),  # shorter than one chunk: the tail alone
    ((9, 17), (17, 1), 0, "float16", True),  # 16-bit storage: one row of 153, a tail of 1
    ((5, 32), (40, 1), 8, "bfloat16", True),  # 16-bit rows of 40 (80 bytes), start 16 bytes in
    ((5, 32), (36, 1), 0, "bfloat16", False),  # rows 72 bytes apart: not all 16-byte aligned
    ((4, 24), (48, 2), 0, "bfloat16", False),  # k strided
]

_COPY_MAIN = r"""
int main(int argc, char** argv) {
  i64 h[24];  // vec, rows, K, rank, n[8], s[8], gx, gy, in bytes, offset bytes
  FILE* f = std::fopen(argv[1], "rb");
  std::fread(h, 8, 24, f);
  std::vector<char> raw(size_t(h[22]) + 64);
  char* in = raw.data() + (16 - uintptr_t(raw.data()) % 16) % 16;  // (a 16-byte aligned base, as cuMemAlloc's)
  std::fread(in, 1, size_t(h[22]), f);
  std::fclose(f);
  View8 v;
  for (int d = 0; d < 8; ++d) v.n[d] = h[4 + d], v.s[d] = h[12 + d];
  std::vector<uint4> out(size_t(h[1] * h[2] + 7) / 8 + 1);
  gridDim = {unsigned(h[20]), unsigned(h[21]), 1};
  blockDim = {256, 1, 1};
  for (unsigned y = 0; y < gridDim.y; ++y)
    for (unsigned x = 0; x < gridDim.x; ++x)
      for (unsigned t = 0; t < 256; ++t) {
        blockIdx = {x, y, 0};
        threadIdx = {t, 0, 0};
        if (h[0]) copy_rows8(h[1], h[2], int(h[3]), v, in + h[23], out.data());
        else copy_rows(h[1], h[2], int(h[3]), v, in + h[23], out.data());
      }
  f = std::fopen(argv[2], "wb");
  std::fwrite(out.data(), 2, size_t(h[1] * h[2]), f);
  std::fclose(f);
}
"""


@pytest.fixture(scope="module")
def copy_program(tmp_path_factory):
    """The host build of the copy kernels per pair of dtypes, compiled once for the module."""
    if not cuda_host.compiler():
        pytest.skip("needs a host C++ compiler")
    built = {}

    def get(src, to):
        if (src, to) not in built:
            d = tmp_path_factory.mktemp(f"copy_{src}_{to}")
            built[src, to] = cuda_host.build(lm._core.cublas_copy_source(src, to) + _COPY_MAIN, d)
        return built[src, to]

    return get


@pytest.mark.parametrize("case", range(len(COPY_CASES)))
def test_copy_kernels_on_the_host(case, tmp_path, copy_program):
    """copy_rows / copy_rows8 compiled as C++ for the host (a loop over blocks and threads; the 16-byte loads check
    their alignment) with blas_copy_layout's launch: every element of the view, in order, rounded as torch rounds,
    for odd lengths, unaligned starts and rows, strided and transposed views."""
    shape, strides, offset, src, vec_expected = COPY_CASES[case]
    sms = 2  # (a small GPU: grid-stride loops over rows and chunks take several turns)
    td = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    size = torch.finfo(td[src]).bits // 8
    span = offset + 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    base = torch.from_numpy(np.random.default_rng(case).standard_normal(span).astype(np.float32)).to(td[src])
    view = torch.as_strided(base, shape, strides, offset)
    vec, rows, K, rank, n, s, grid = lm._core.cublas_copy_layout(list(shape), list(strides), offset * size, src, sms)
    assert vec == vec_expected and rows * K == view.numel(), (vec, rows, K)
    raw = base.view(torch.int16 if size == 2 else torch.int32).numpy().tobytes()
    for to in ("bfloat16", "float16"):
        head = [int(vec), rows, K, rank, *n, *s, *grid, len(raw), offset * size]
        (tmp_path / "in.bin").write_bytes(np.array(head, np.int64).tobytes() + raw)
        subprocess.run([str(copy_program(src, to)), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True)
        got = np.fromfile(tmp_path / "out.bin", np.int16)
        want = view.float().to(td[to]).contiguous().view(torch.int16).numpy().ravel()
        np.testing.assert_array_equal(got, want, err_msg=f"{shape} {strides} +{offset} {src} -> {to}")


_Q8_MAIN = r"""
int main(int argc, char** argv) {
  i64 h[5];  // rows, K, ld (bytes), in bytes, offset bytes
  FILE* f = std::fopen(argv[1], "rb");
  std::fread(h, 8, 5, f);
  std::vector<char> raw(size_t(h[3]) + 64);
  char* in = raw.data() + (16 - uintptr_t(raw.data()) % 16) % 16;
  std::fread(in, 1, size_t(h[3]), f);
  std::fclose(f);
  std::vector<uint4> out(size_t(h[0] * h[1]) / 8 + 1);
  gridDim = {3, 1, 1};  // (fewer threads than blocks: the grid-stride loop takes several turns)
  blockDim = {32, 1, 1};
  for (unsigned x = 0; x < gridDim.x; ++x)
    for (unsigned t = 0; t < 32; ++t) {
      blockIdx = {x, 0, 0};
      threadIdx = {t, 0, 0};
      q8_rows(h[0], h[1], h[2], in + h[4], out.data());
    }
  f = std::fopen(argv[2], "wb");
  std::fwrite(out.data(), 2, size_t(h[0] * h[1]), f);
  std::fclose(f);
}
"""


@pytest.mark.parametrize("rows,k,pad,offset", [(5, 64, 0, 0), (3, 96, 2, 2), (40, 32, 6, 4)])
def test_q8_dequant_kernel_on_the_host(rows, k, pad, offset, rng, tmp_path):
    """q8_rows (cuBLASLt's operand for Q8_0 weights in prefill) compiled for the host: every row's blocks dequantised
    exactly as torch rounds scale * quant to bf16 / f16, rows 2-byte aligned with padding between them and a start
    past the buffer's first byte."""
    if not cuda_host.compiler():
        pytest.skip("needs a host C++ compiler")
    raw, vals = random_quant_blocks(rng.gen, "Q8_0", rows, k)
    ld = raw.shape[1] + pad
    buf = np.zeros((offset + rows * ld,), np.uint8)
    for r in range(rows):
        buf[offset + r * ld: offset + r * ld + raw.shape[1]] = raw[r]
    blob = buf.tobytes()
    for to, tdt in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        d = tmp_path / to
        d.mkdir()
        exe = cuda_host.build(lm._core.cublas_q8_source(to) + _Q8_MAIN, d)
        (d / "in.bin").write_bytes(np.array([rows, k, ld, len(blob), offset], np.int64).tobytes() + blob)
        subprocess.run([str(exe), str(d / "in.bin"), str(d / "out.bin")], check=True)
        got = np.fromfile(d / "out.bin", np.int16)
        want = torch.from_numpy(vals.astype(np.float32)).to(tdt).view(torch.int16).numpy().ravel()
        np.testing.assert_array_equal(got, want, err_msg=f"{rows}x{k} -> {to}")


def test_gemm_shared_operand_copy(gemm, rng):
    """q, k and v of one float32 activation (cuBLASLt: one copy of it read by the three products when they run one
    after another), over two runs with new activations (a copy is never kept from one run to the next), at 8 rows
    (batched decode) and 40."""
    k, n = 64, (96, 32, 48)
    ws = [(rng.data((m, k)) / k ** 0.5).astype(np.float32) for m in n]
    for rows in (8, 40):
        cx = lm.Graph()
        x = cx.tensor((rows, k))
        h = x * 2.0
        outs = [(h @ cx.tensor((m, k)).set(w).transpose(0, 1)).output() for m, w in zip(n, ws)]
        cx.compile(lm.GenericCompiler(), lm.CudaCompiler("bfloat16"))
        for run in range(2):
            xs = rng.data((rows, k)).astype(np.float32)
            x.set(xs)
            cx.execute()
            hb = (torch.from_numpy(xs) * 2).bfloat16().float()
            for o, w in zip(outs, ws):
                want = (hb @ torch.from_numpy(w).bfloat16().float().T).numpy()
                np.testing.assert_allclose(o.numpy(), want, rtol=2e-2, atol=3e-2, err_msg=f"{gemm} {rows} run {run}")


# ---- a product added into its only reader (the residual add): cuBLASLt's D = A.B + C (Step::add_epilogue) ----------
def _residual_graph(cx, m, k, n, *, swap=False):
    """r + x @ w^T over float32 inputs (x, w stored in the weights' dtype: both are a product's operands)."""
    x, w, r = cx.tensor((m, k)), cx.tensor((n, k)), cx.tensor((m, n))
    p = _linear(x, w)
    return x, w, r, ((p + r) if swap else (r + p))


def _epilogues(build):
    """The (product, Add) pairs the schedule of the graph `build(cx)` makes marks."""
    cx = lm.Graph()
    build(cx)
    comp = lm.CudaCompiler("bfloat16", device=None)
    cx.compile(lm.GenericCompiler(), comp)
    return comp.schedule.add_epilogues()


def test_add_epilogue_marked():
    """The schedule marks a float32 product whose only reader is an Add of it and a tensor of its shape, either
    order, symbolic rows too; not a product read twice, an Add that broadcasts (a bias), a sum of the product with
    itself, nor a 16-bit sum. (No GPU needed: the schedule is the core's.)"""
    for swap in (False, True):
        assert len(_epilogues(lambda cx: _residual_graph(cx, 40, 24, 16, swap=swap)[3].output())) == 1

    def symbolic(cx):
        x, w, r = cx.tensor(("s", 24)), cx.tensor((16, 24)), cx.tensor(("s", 16))
        (r + _linear(x, w)).output()

    assert len(_epilogues(symbolic)) == 1

    def read_twice(cx):
        x, w, r = cx.tensor((40, 24)), cx.tensor((16, 24)), cx.tensor((40, 16))
        p = _linear(x, w)
        (r + p).output()
        (p * 2.0).output()

    def bias(cx):
        x, w, b = cx.tensor((40, 24)), cx.tensor((16, 24)), cx.tensor((16,))
        (_linear(x, w) + b).output()

    def doubled(cx):
        x, w = cx.tensor((40, 24)), cx.tensor((16, 24))
        p = _linear(x, w)
        (p + p).output()

    def half(cx):
        x, w, r = cx.tensor((40, 24)), cx.tensor((16, 24)), cx.tensor((40, 16), lm.float16)
        (_linear(x, w).to(lm.float16) + r).output()

    for build in (read_twice, bias, doubled, half):
        assert _epilogues(build) == [], build.__name__


def _residual_want(x, w, r):
    """torch: the operands rounded to bfloat16 (as stored), the product and the sum in float32."""
    xb, wb = torch.from_numpy(x).bfloat16().float(), torch.from_numpy(w).bfloat16().float()
    return (torch.from_numpy(r) + xb @ wb.transpose(-1, -2)).numpy()


@pytest.fixture(params=["1", "0"], ids=["graphs", "no-graphs"])
def graphs(request, monkeypatch):
    """CUDA graphs on (cuBLASLt's calls captured into the chunks) and off (LUMINAL_CUDA_GRAPHS=0)."""
    monkeypatch.setenv("LUMINAL_CUDA_GRAPHS", request.param)
    monkeypatch.delenv("LUMINAL_CUDA_BLAS_EPILOGUE", raising=False)
    monkeypatch.delenv("LUMINAL_CUDA_BLAS_GRAPHS", raising=False)
    return request.param


@pytest.mark.parametrize("shape", [(300, 96, 200), (129, 63, 65), (2, 72, 136), (1030, 136, 2100)])
def test_gemm_residual(gemm, graphs, rng, shape, monkeypatch, capfd):
    """r + x @ w^T (either order) off the tiles' edges, K odd (read in place), 2 rows (batched decode), enough tiles
    to fill an H100; three runs with new inputs (graph replay). cuBLASLt forced: the Add's kernel does not run (one
    launch fewer than with LUMINAL_CUDA_BLAS_EPILOGUE=0), and its call is captured (no warning)."""
    m, k, n = shape
    for swap in (False, True):
        cx = lm.Graph()
        x, w, r, y = _residual_graph(cx, m, k, n, swap=swap)
        y = y.output()
        cx.compile(lm.GenericCompiler(), lm.CudaCompiler("bfloat16"))
        launches = {}
        for run, fused in enumerate(("1", "0", "1")):
            monkeypatch.setenv("LUMINAL_CUDA_BLAS_EPILOGUE", fused)
            xs, rs = rng.data((m, k)).astype(np.float32), rng.data((m, n)).astype(np.float32)
            ws = (rng.data((n, k)) / k ** 0.5).astype(np.float32)
            x.set(xs), w.set(ws), r.set(rs)
            cx.execute()
            np.testing.assert_allclose(y.numpy(), _residual_want(xs, ws, rs), rtol=2e-3, atol=2e-3,
                                       err_msg=f"{gemm} {shape} swap={swap} run {run}")
            launches[fused] = cx._runtime.rt.last_launches()
        if gemm == "cublas":
            assert launches["1"] == launches["0"] - 1, launches
    assert "could not be captured" not in capfd.readouterr().err


def test_gemm_residual_symbolic_rows(gemm, graphs, rng, capfd):
    """One compiled graph, prompts of several lengths (each planned, and captured, again), a length seen before
    again, and every run with new inputs."""
    k, n = 64, 96
    w = (rng.data((n, k)) / k ** 0.5).astype(np.float32)
    cx = lm.Graph()
    x, wt, r = cx.tensor(("s", k)), cx.tensor((n, k)).set(w), cx.tensor(("s", n))
    y = (r + _linear(x, wt)).output()
    cx.compile(lm.GenericCompiler(), lm.CudaCompiler("bfloat16"))
    for s in (40, 300, 17, 300, 300, 2):
        xs, rs = rng.data((s, k)).astype(np.float32), rng.data((s, n)).astype(np.float32)
        x.set(xs), r.set(rs)
        cx.execute()
        np.testing.assert_allclose(y.numpy(), _residual_want(xs, w, rs), rtol=2e-3, atol=2e-3, err_msg=f"{gemm} s={s}")
    assert "could not be captured" not in capfd.readouterr().err


@pytest.mark.parametrize("case", ["residual read again", "residual is a", "chained", "shared weights", "batched"])
def test_gemm_residual_aliasing(gemm, graphs, rng, case):
    """The Add's other operand read by another op too (it must stay as it was), the product's own left operand as
    the residual (h + h @ w^T), two residual layers in a row (the first's sum is the second's residual and operand),
    a Linear over [batch, tokens, features] (one product of batch x tokens rows), a batch of products (a batch
    stride each); two runs each with new inputs."""
    k = 72
    cx = lm.Graph()
    ws = [(rng.data((k, k)) / k ** 0.5).astype(np.float32) for _ in range(2)]
    w1, w2 = cx.tensor((k, k)).set(ws[0]), cx.tensor((k, k)).set(ws[1])
    shape = {"shared weights": (3, 50, k), "batched": (3, 50, k)}.get(case, (130, k))
    x, r = cx.tensor(shape), cx.tensor(shape)
    bf = lambda a: torch.from_numpy(a).bfloat16().float()
    tw = [bf(w) for w in ws]
    if case == "residual read again":
        outs = [(r + _linear(x, w1)).output(), (r * 2.0).output()]
        want = lambda xs, rs: [torch.from_numpy(rs) + bf(xs) @ tw[0].T, torch.from_numpy(rs) * 2]
    elif case == "residual is a":
        h = x * 2.0  # (float32: copied, rounded, into cuBLASLt's workspace)
        outs = [(h + _linear(h, w1)).output()]
        want = lambda xs, rs: [torch.from_numpy(xs) * 2 + (torch.from_numpy(xs) * 2).bfloat16().float() @ tw[0].T]
    elif case == "chained":
        h = x * 2.0
        y1 = h + _linear(h, w1)
        outs = [(y1 + _linear(y1, w2)).output()]

        def want(xs, rs):
            h = torch.from_numpy(xs) * 2
            y1 = h + h.bfloat16().float() @ tw[0].T
            return [y1 + y1.bfloat16().float() @ tw[1].T]

        # y1 is rounded to bfloat16 as the second product's operand: a y1 a rounding away from torch's (another
        # order of its sums) may round the other way, moving the result by up to one rounding of y1 through w2
        def slack(xs):
            h = torch.from_numpy(xs) * 2
            y1 = h + h.bfloat16().float() @ tw[0].T
            return [2.0 ** -8 * (y1.abs() @ tw[1].abs().T).numpy()]
    elif case == "shared weights":
        outs = [(r + _linear(x, w1)).output()]
        want = lambda xs, rs: [torch.from_numpy(rs) + bf(xs) @ tw[0].T]
    else:  # a batch of products: x[b] @ x[b]^T... of distinct right operands, the residual (3, 50, 50)
        r = cx.tensor((3, 50, 50))
        outs = [(r + x @ x.transpose(1, 2)).output()]
        want = lambda xs, rs: [torch.from_numpy(rs) + bf(xs) @ bf(xs).transpose(1, 2)]
    cx.compile(lm.GenericCompiler(), lm.CudaCompiler("bfloat16"))
    for run in range(2):
        xs = rng.data(shape).astype(np.float32)
        rs = rng.data(tuple(r.shape)).astype(np.float32)
        x.set(xs), r.set(rs)
        cx.execute()
        for k, (o, wt) in enumerate(zip(outs, want(xs, rs))):
            if case == "chained":
                bound = 5e-3 + 5e-3 * np.abs(wt.numpy()) + slack(xs)[k]
                assert np.all(np.abs(o.numpy() - wt.numpy()) <= bound), f"{gemm} {case} run {run}"
            else:
                np.testing.assert_allclose(o.numpy(), wt.numpy(), rtol=5e-3, atol=5e-3,
                                           err_msg=f"{gemm} {case} run {run}")


def test_llama_batched_decode_fused(graphs, rng, monkeypatch, capfd):
    """A tiny Llama, 4 sequences (a prompt, then decode steps of 4 rows) with cuBLASLt forced: the residual adds
    computed by its products, its calls captured into the chunks, give the logits of the same model run with both
    off (LUMINAL_CUDA_BLAS_EPILOGUE=0, LUMINAL_CUDA_BLAS_GRAPHS=0) at every step."""
    if needs_cuda():
        pytest.skip(needs_cuda())
    if not lm.cuda.cublas_available()[0]:
        pytest.skip(lm.cuda.cublas_available()[1].splitlines()[0])
    monkeypatch.setenv("LUMINAL_CUDA_GEMM", "cublas")
    sessions = tiny_llama_sessions(rng, [[lm.CudaCompiler("bfloat16")]] * 2, capacity=4, batch=4)
    ids = rng.integers(0, sessions[0].model.config.vocab_size, (4, 12))
    steps = [ids[:, :5]] + [ids[:, i:i + 1] for i in range(5, 12)]
    for j, tok in enumerate(steps):
        got = []
        for s, on in zip(sessions, ("1", "0")):
            monkeypatch.setenv("LUMINAL_CUDA_BLAS_EPILOGUE", on)
            monkeypatch.setenv("LUMINAL_CUDA_BLAS_GRAPHS", on)
            got.append(s.step(tok))
        np.testing.assert_allclose(got[0], got[1], rtol=1e-4, atol=1e-4, err_msg=f"step {j}")
    assert "could not be captured" not in capfd.readouterr().err
