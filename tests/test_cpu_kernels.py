"""The native CPU kernels against float64 references: quantised matvec/matmul on random blocks of every supported
type and odd sizes, float matmul through any layout, and thread counts 1 and N."""
import os

import numpy as np
import pytest

import luminal as lm
from luminal.quant import BLOCK, BLOCK_BYTES, QuantizedWeight, dequantize


def random_blocks(rng, qtype: str, rows: int, cols: int) -> np.ndarray:
    """Raw rows of random blocks with sane scales (half-precision d, and m for Q4_1)."""
    nb, size = cols // BLOCK, BLOCK_BYTES[qtype]
    raw = rng.integers(0, 256, (rows, nb, size), dtype=np.uint8)
    d = rng.uniform(0.001, 0.05, (rows, nb)).astype(np.float16)
    raw[:, :, 0:2] = d.view(np.uint8).reshape(rows, nb, 2)
    if qtype == "Q4_1":
        m = rng.uniform(-0.2, 0.2, (rows, nb)).astype(np.float16)
        raw[:, :, 2:4] = m.view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, nb * size)


def dequant64(raw: np.ndarray, qtype: str, cols: int) -> np.ndarray:
    """The GGUF definition, in float64."""
    rows, nb, size = raw.shape[0], cols // BLOCK, BLOCK_BYTES[qtype]
    b = raw.reshape(rows, nb, size)
    d = b[:, :, 0:2].copy().view(np.float16).astype(np.float64)
    if qtype == "Q8_0":
        q = b[:, :, 2:].view(np.int8).astype(np.float64)
        return (d * q).reshape(rows, cols)
    qs = b[:, :, 4:] if qtype == "Q4_1" else b[:, :, 2:]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=-1).astype(np.float64)
    if qtype == "Q4_0":
        return (d * (q - 8)).reshape(rows, cols)
    m = b[:, :, 2:4].copy().view(np.float16).astype(np.float64)
    return (d * q + m).reshape(rows, cols)


@pytest.mark.parametrize("qtype", sorted(BLOCK_BYTES))
# k = 256, 576, 800: eight-block groups of the decode kernel, with and without leftover blocks
@pytest.mark.parametrize("rows_a,n,k", [(1, 7, 32), (1, 33, 96), (3, 5, 64), (4, 9, 160), (5, 17, 96), (35, 11, 64),
                                        (1, 13, 576), (2, 5, 256), (1, 6, 800)])
def test_quantised_matmul_against_float64(qtype, rows_a, n, k, threads, seed):
    rng = np.random.default_rng(seed)
    raw = random_blocks(rng, qtype, n, k)
    x = rng.standard_normal((rows_a, k)).astype(np.float32)
    cx = lm.Graph()
    w = dequantize(cx, QuantizedWeight(raw, qtype, (n, k)))
    a = cx.tensor((rows_a, k)).set(x)
    out, wout = (a @ w.T).output(), w.output()
    cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
    assert f"QMatMul{qtype}" in cx.stats()
    cx.execute()
    w64 = dequant64(raw, qtype, k)
    np.testing.assert_array_equal(wout.numpy(), w64.astype(np.float32))  # unpacking is exact
    scale = np.abs(x).astype(np.float64) @ np.abs(w64).T
    exact = x.astype(np.float64) @ w64.T
    if rows_a <= 4:
        # Decode rows: activations are quantised to int8 blocks first (as llama.cpp does). Against that rounding
        # the kernel is exact up to float32 sums; against the float product it is within half a quantisation step.
        xq, step = quantize_q8_np(x)
        assert np.all(np.abs(out.numpy() - xq @ w64.T) <= 1e-5 * scale + 1e-6), f"seed {seed}"
        assert np.all(np.abs(out.numpy() - exact) <= (step / 2) @ np.abs(w64).T * 1.001 + 1e-5 * scale + 1e-6)
    else:
        assert np.all(np.abs(out.numpy() - exact) <= 1e-5 * scale + 1e-6), f"seed {seed}"


def quantize_q8_np(x: np.ndarray):
    """The decode kernels' int8 activation blocks, in float64: (dequantised activations, per-element step)."""
    b = x.astype(np.float32).reshape(x.shape[0], -1, BLOCK)
    d = (np.abs(b).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.rint((b * inv).astype(np.float32))
    return (q * d.astype(np.float64)).reshape(x.shape), np.broadcast_to(d, b.shape).reshape(x.shape).astype(np.float64)


@pytest.mark.parametrize("m,k,n", [(13, 37, 19), (150, 300, 37)], ids=["tiles", "packed GEMM"])
@pytest.mark.parametrize("layout", ["a @ b", "a @ b.T", "a.T @ b", "batched broadcast"])
def test_float_matmul_layouts(layout, m, k, n, threads, seed):
    """Small products take the register tiles; large ones the packed GEMM (150 rows: two row blocks and a partial
    one, 6-row tiles with a partial last; 37 columns: a partial 16-column panel; k = 300: a partial second k block)."""
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    cx = lm.Graph()
    a, b = cx.tensor(x.shape).set(x), cx.tensor(y.shape).set(y)
    fns = {"a @ b": (lambda: a @ b, x @ y), "a @ b.T": (lambda: a @ b.T.contiguous().T, x @ y),
           "a.T @ b": (lambda: a.T.contiguous().T @ b, x @ y),
           "batched broadcast": (lambda: a.unsqueeze(0).expand(3, m, k) @ b, np.stack([x @ y] * 3))}
    build, want = fns[layout]
    out = build().output()
    cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
    assert "MatMul" in cx.stats()
    cx.execute()
    want = want.astype(np.float64)  # float32 sums of 300 terms: within a few ulp of the magnitude sqrt(k)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=2e-5 * np.sqrt(k), err_msg=f"seed {seed}")


@pytest.mark.parametrize("t", [5, 70])
def test_attention_kernel_against_float64(t, threads, seed):
    """The fused Attention kernel (scores, mask, softmax, weighted V rows) for grouped heads over token-major caches
    (runs again at every other CPU ISA level, see tests/test_cpu_isa.py)."""
    rng = np.random.default_rng(seed)
    hk, rep, d = 2, 3, 24
    q = rng.standard_normal((hk, rep, d)).astype(np.float32)
    k, v = rng.standard_normal((t, hk, d)).astype(np.float32), rng.standard_normal((t, hk, d)).astype(np.float32)
    cx = lm.Graph()
    tq, tk, tv = (cx.tensor(a.shape).set(a) for a in (q, k, v))
    scores = (tq @ tk.transpose(0, 1).transpose(1, 2)) * (1 / np.sqrt(d))
    out = (scores.softmax(-1) @ tv.transpose(0, 1)).output()
    cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
    assert cx.stats().get("Attention") == 1
    cx.execute()
    s64 = np.einsum("hrd,thd->hrt", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(d)
    p64 = np.exp(s64 - s64.max(-1, keepdims=True))
    p64 /= p64.sum(-1, keepdims=True)
    want = np.einsum("hrt,thd->hrd", p64, v.astype(np.float64))
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-5, err_msg=f"seed {seed}")


def test_thread_counts_agree(seed):
    """1 and N threads give the same results up to reassociation (here: exactly, as chunks never split a sum)."""
    rng = np.random.default_rng(seed)
    raw = random_blocks(rng, "Q4_1", 64, 256)
    x = rng.standard_normal((6, 256)).astype(np.float32)
    results = []
    for t in (1, 2, 3):
        lm._core.set_num_threads(t)
        cx = lm.Graph()
        w = dequantize(cx, QuantizedWeight(raw, "Q4_1", (64, 256)))
        a = cx.tensor((6, 256)).set(x)
        out = ((a @ w.T).softmax(-1) * 2).output()
        cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
        cx.execute()
        results.append(out.numpy())
    lm._core.set_num_threads(0)
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_bad_index_raises_under_the_cpu_compiler():
    cx = lm.Graph()
    table = cx.tensor((4, 3)).set(np.ones((4, 3), np.float32))
    idx = cx.tensor((64,), lm.int32).set(np.full(64, 9, np.int32))
    out = lm.embedding(idx, table).output()
    cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
    with pytest.raises(IndexError, match="out of range"):
        cx.execute()
    idx.set(np.arange(64, dtype=np.int32) % 4)
    cx.execute()  # the graph stays usable
    assert out.numpy().shape == (64, 3)


def test_float32_exp2_within_one_ulp():
    """Fused float32 programs take a vector exp2: within 1 ulp of the correctly rounded value everywhere, and exact
    (the scalar path) for overflow, subnormal results, infinities and NaN."""
    x = np.concatenate([np.linspace(-130, 130, 100003), [np.inf, -np.inf, np.nan, 0.0, -0.0, 127.49, -126.5,
                                                           -149.5, -150.5, 1e-30, -1e-30]]).astype(np.float32)
    cx = lm.Graph()
    out = cx.tensor(x.shape).set(x).exp2().output()
    cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
    assert "Fused" in cx.stats()
    cx.execute()
    with np.errstate(over="ignore"):
        want = np.exp2(x.astype(np.float64)).astype(np.float32)
    got = out.numpy()
    normal = np.isfinite(want) & (np.abs(want) >= np.finfo(np.float32).tiny)
    np.testing.assert_array_max_ulp(got[normal], want[normal], maxulp=1)
    np.testing.assert_array_equal(got[~normal], want[~normal])


@pytest.mark.parametrize("rows_a", [3, 7], ids=["decode", "prefill"])
def test_projections_of_the_same_activations_are_stacked(rows_a, seed):
    """Three quantised matmuls of one input become one QMatMul over the stacked weights; their consumers read their
    columns through rebased views (reshape + transpose, rotate_half's slices and padding, plain)."""
    rng = np.random.default_rng(seed)
    ns, k = (32, 16, 48), 64
    raws = [random_blocks(rng, "Q4_1", n, k) for n in ns]
    x = rng.standard_normal((rows_a, k)).astype(np.float32)
    cx = lm.Graph()
    a = cx.tensor((rows_a, k)).set(x)
    ws = [dequantize(cx, QuantizedWeight(r, "Q4_1", (n, k))) for r, n in zip(raws, ns)]
    y1, y2, y3 = (a @ w.T for w in ws)
    outs = [(y1.reshape(rows_a, 4, 8).transpose(0, 1) * 2).output(),
            lm.cat([-y2[..., 8:], y2[..., :8]], -1).output(),
            (y3 + 1).output()]
    cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
    assert cx.stats().get("QMatMulQ4_1") == 1
    cx.execute()
    xq = quantize_q8_np(x)[0] if rows_a <= 4 else x.astype(np.float64)
    z = [xq @ dequant64(r, "Q4_1", k).T for r in raws]
    want = [(z[0].reshape(rows_a, 4, 8).transpose(1, 0, 2) * 2), np.concatenate([-z[1][:, 8:], z[1][:, :8]], -1),
            z[2] + 1]
    for o, w in zip(outs, want):
        np.testing.assert_allclose(o.numpy(), w, rtol=1e-4, atol=1e-4, err_msg=f"seed {seed}")


def test_simd_level():
    want = "portable" if os.environ.get("LUMINAL_NO_AVX2") else None
    assert lm._core.simd() in ("avx2", "portable") and (want is None or lm._core.simd() == want)


# The portable (and every other) level: tests/test_cpu_isa.py runs this file once per level the CPU supports.
