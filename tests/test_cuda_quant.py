"""Quantised matrix products on the CUDA backend (QMatMul over GGUF Q8_0, Q4_0, Q4_1 rows): the Q8_0 kernels for a
few rows (decode, `qgemv`) and for many (prefill on tensor cores, `qmma`), and the warp-per-output kernel every
other case takes, against numpy's float64 product with the dequantised weights. On the `cuda` backend each test
also asserts (through LUMINAL_PROFILE's per-kernel lines) which kernel ran; `cuda-nvrtc` compiles every kernel
without a GPU (its values come from the CPU kernels, which quantise decode activations: a loose check)."""
from __future__ import annotations

import numpy as np
import pytest

import luminal as lm
from conftest import BACKENDS
from helpers import as_dtype
from luminal.compiler import QuantizedLowering, QuantizedStacking
from luminal.quant import QuantizedWeight, dequantize

CUDA_BACKENDS = [b for b in BACKENDS if b.name in ("cuda", "cuda-nvrtc")]


@pytest.fixture(params=CUDA_BACKENDS, ids=lambda b: b.name)
def backend(request):
    reason = request.param.skip_reason()
    if reason:
        pytest.skip(f"backend {request.param.name}: {reason}")
    return request.param


def random_blocks(gen, qtype, rows, cols):
    """Random raw GGUF rows (uint8, rows x blocks * block bytes) and their float32 values."""
    nb = cols // 32
    d = gen.uniform(0.01, 0.1, (rows, nb)).astype(np.float16) * gen.choice([-1, 1], (rows, nb)).astype(np.float16)
    if qtype == "Q8_0":
        q = gen.integers(-128, 128, (rows, nb, 32)).astype(np.int8)  # (-128 too: llama.cpp never writes it, but may)
        raw = np.concatenate([d[..., None].view(np.uint8), q.view(np.uint8)], -1)
        vals = d.astype(np.float32)[..., None] * q.astype(np.float32)
    else:
        q = gen.integers(0, 16, (rows, nb, 32)).astype(np.uint8)
        packed = (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)
        if qtype == "Q4_0":
            raw = np.concatenate([d[..., None].view(np.uint8), packed], -1)
            vals = d.astype(np.float32)[..., None] * (q.astype(np.float32) - 8)
        else:
            m = gen.uniform(-0.5, 0.5, (rows, nb)).astype(np.float16)
            raw = np.concatenate([d[..., None].view(np.uint8), m[..., None].view(np.uint8), packed], -1)
            vals = d.astype(np.float32)[..., None] * q.astype(np.float32) + m.astype(np.float32)[..., None]
    return raw.reshape(rows, -1), vals.reshape(rows, cols)


def kernel_of(qtype: str, rows: int, dtype: str) -> str:
    """The variant the runtime picks for a QMatMul over `rows` aligned rows of activations (see Runtime::applies)."""
    if qtype != "Q8_0":
        return "warps"
    if rows <= 4:
        return "qgemv"
    return "qmma" if dtype != "float32" else "warps"


def expected(x, vals, qtype, rows, dtype):
    """float64 x @ vals.T; the tensor-core kernel rounds the activations to the compute dtype first."""
    if kernel_of(qtype, rows, dtype) == "qmma":
        x = as_dtype(x, dtype)
    return x.astype(np.float64) @ vals.astype(np.float64).T


def run_checked(g, backend, monkeypatch, capfd, kernels=()):
    """Executes g; on a GPU, asserts each of `kernels` ran (LUMINAL_PROFILE prints '<op>/<variant>' per kernel)."""
    if backend.name == "cuda":
        monkeypatch.setenv("LUMINAL_PROFILE", "1")
        capfd.readouterr()
    g.execute()
    if backend.name == "cuda":
        monkeypatch.delenv("LUMINAL_PROFILE")
        err = capfd.readouterr().err
        for k in kernels:
            assert f"/{k} " in err, f"expected the {k} kernel to run; the profile says:\n{err}"


def close(got, want, backend, rng):
    if backend.name == "cuda-nvrtc":  # the CPU kernels quantise decode activations to int8
        np.testing.assert_allclose(got, want, rtol=0, atol=3e-2 * np.abs(want).max(), err_msg=repr(rng))
    else:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=repr(rng))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("k", [160, 4160])  # 5 and 130 blocks (multiples of 32, not of 256): 1 and 2 steps
def test_qmatmul_symbolic_rows(backend, qtype, dtype, k, rng, monkeypatch, capfd):
    """One compiled graph over a symbolic number of rows: 1 and 3 (decode), 70 (prefill: a partial 64-row tile) and
    back to 2; 37 output columns (odd: the matrix-vector kernel's last pair has one column)."""
    n = 37
    raw, vals = random_blocks(rng.gen, qtype, n, k)
    g = lm.Graph()
    w = dequantize(g, QuantizedWeight(raw, qtype, (n, k)))
    xt = g.tensor(("s", k), name="x")
    y = ((xt * 1.5) @ w.T).output()  # (an activation computed on the device: stored float32)
    g.compile(lm.GenericCompiler(), *backend.compilers(dtype))
    for rows in (1, 3, 70, 2):
        x = rng.data((rows, k)).astype(np.float32)
        xt.set(x)
        run_checked(g, backend, monkeypatch, capfd, [kernel_of(qtype, rows, dtype)])
        close(y.numpy(), expected(x * np.float32(1.5), vals, qtype, rows, dtype), backend, rng)


@pytest.mark.parametrize("rows", [1, 9])
def test_q8_batched_rows(backend, rows, rng, monkeypatch, capfd):
    """Activations with leading batch dims, (2, rows, K): the kernels flatten them into rows."""
    n, k = 50, 96
    raw, vals = random_blocks(rng.gen, "Q8_0", n, k)
    g = lm.Graph()
    w = dequantize(g, QuantizedWeight(raw, "Q8_0", (n, k)))
    x = rng.data((2, rows, k)).astype(np.float32)
    xt = g.tensor((2, rows, k), name="x").set(x)
    y = ((xt * 1.5) @ w.T).output()
    g.compile(lm.GenericCompiler(), *backend.compilers("bfloat16"))
    run_checked(g, backend, monkeypatch, capfd, [kernel_of("Q8_0", 2 * rows, "bfloat16")])
    close(y.numpy(), expected(x * np.float32(1.5), vals, "Q8_0", 2 * rows, "bfloat16"), backend, rng)


@pytest.mark.parametrize("rows", [1, 66])
def test_q8_stacked_weights(backend, rows, rng, monkeypatch, capfd):
    """Three weights stacked into one QMatMul (QuantizedStacking: q/k/v): output columns straddle the weights (41, 7
    and 24 rows, so a pair of columns spans two), each weight's rows read from its own buffer."""
    k = 64
    x = rng.data((rows, k)).astype(np.float32)
    g = lm.Graph()
    xt = g.tensor((rows, k), name="x").set(x)
    h = xt * 1.5
    outs, vals = [], []
    for j, n in enumerate((41, 7, 24)):
        raw, v = random_blocks(rng.gen, "Q8_0", n, k)
        outs.append((h @ dequantize(g, QuantizedWeight(raw, "Q8_0", (n, k)), name=f"w{j}").T).output())
        vals.append(v)
    g.compile(lm.GenericCompiler(), QuantizedLowering(), QuantizedStacking(), *backend.compilers("float16"))
    run_checked(g, backend, monkeypatch, capfd, [kernel_of("Q8_0", rows, "float16")])
    for o, v in zip(outs, vals):
        close(o.numpy(), expected(x * np.float32(1.5), v, "Q8_0", rows, "float16"), backend, rng)


@pytest.mark.parametrize("rows", [1, 20])
def test_q8_unaligned_activations_fall_back(backend, rows, rng, monkeypatch, capfd):
    """Activation rows that are not 16-byte aligned (a column slice at an odd offset) take the warp-per-output
    kernel: same values."""
    n, k = 33, 64
    raw, vals = random_blocks(rng.gen, "Q8_0", n, k)
    g = lm.Graph()
    w = dequantize(g, QuantizedWeight(raw, "Q8_0", (n, k)))
    x = rng.data((rows, k + 1)).astype(np.float32)
    xt = g.tensor((rows, k + 1), name="x").set(x)
    y = ((xt * 1.5)[:, 1:] @ w.T).output()
    g.compile(lm.GenericCompiler(), *backend.compilers("bfloat16"))
    run_checked(g, backend, monkeypatch, capfd, ["warps"])
    close(y.numpy(), x[:, 1:].astype(np.float64) * 1.5 @ vals.T, backend, rng)


@pytest.mark.parametrize("rows", [1, 20])
def test_q8_weight_rows_2_byte_aligned(backend, rows, rng, monkeypatch, capfd):
    """Packed rows read through a view 2 bytes into a wider buffer (rows 2-byte but not 4-byte aligned, as every
    other row of an odd number of blocks is): both Q8_0 kernels read blocks with 2-byte loads."""
    n, k = 45, 128
    raw, vals = random_blocks(rng.gen, "Q8_0", n, k)
    wide = np.concatenate([rng.gen.integers(0, 256, (n, 2)).astype(np.uint8), raw], 1)
    g = lm.Graph()
    t = g.tensor(wide.shape, lm.uint8, name="raw").set(wide)
    w = g._wrap(g._g.dequant("Q8_0", t[:, 2:]._edge(), [n, k]))  # (what luminal.quant.dequantize records)
    x = rng.data((rows, k)).astype(np.float32)
    xt = g.tensor((rows, k), name="x").set(x)
    y = ((xt * 1.5) @ w.T).output()
    g.compile(lm.GenericCompiler(), *backend.compilers("bfloat16"))
    run_checked(g, backend, monkeypatch, capfd, ["qgemv" if rows <= 4 else "qmma"])
    close(y.numpy(), expected(x * np.float32(1.5), vals, "Q8_0", rows, "bfloat16"), backend, rng)
