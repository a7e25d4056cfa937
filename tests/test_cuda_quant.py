"""Quantised matrix products on the CUDA backend (QMatMul over GGUF Q8_0, Q4_0, Q4_1 rows): the Q8_0 kernels for a
few rows (decode: `qdot`, int8 activations and __dp4a, else `qgemv`, float32) and for many (prefill on tensor cores,
`qmma`), and the warp-per-output kernel every other case takes, against numpy's float64 product with the
dequantised weights (`qdot`: with the activations quantised as the kernel does, so the check stays tight). On the `cuda` backend each test
also asserts (through LUMINAL_PROFILE's per-kernel lines) which kernel ran; `cuda-nvrtc` compiles every kernel
without a GPU (its values come from the CPU kernels, which quantise decode activations: a loose check). Q8_0
products of one row in a matrix-vector group (`qrows`: over whole weights stored split, int8 activations quantised in
the loop and __dp4a; over weights read through a view, float activations and the quants unpacked in registers) are
checked on the GPU and, kernels printed and run as C++, on the host (cuda_host.py), as is the split layout's round
trip."""
from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

import cuda_host
import luminal as lm
from helpers import as_dtype, expected_dp4a, needs_nvrtc, random_quant_blocks, split_layout
from luminal.compiler import QuantizedLowering, QuantizedStacking
from luminal.quant import QuantizedWeight, dequantize

@pytest.fixture
def backend(cuda_backend):
    return cuda_backend


@pytest.fixture(autouse=True)
def own_gemm(monkeypatch):
    """Prefill's Q8_0 products on our tensor-core kernel (exact quants, float32 block scales), which these tests
    check exactly; timing may pick cuBLASLt over the weights' dequantisation instead (rounded to the compute
    dtype), checked by test_q8_prefill_through_cublas."""
    monkeypatch.setenv("LUMINAL_CUDA_GEMM", "own")


def kernel_of(qtype: str, rows: int, dtype: str) -> str:
    """The variant the runtime picks for a QMatMul over `rows` aligned rows of activations (see Runtime::applies)."""
    if qtype != "Q8_0":
        return "warps"
    if rows <= 4:
        return "qdot"
    return "qmma" if dtype != "float32" else "warps"


def is_split(g, comp, name):
    """Whether the kernels of `comp` read input `name` split (Module::q8_split)."""
    return any(g.node(i).name == name for i in comp.schedule.q8_split)


def cuda_of(comps):
    """The CudaCompiler among a backend's compilers."""
    return next(c for c in comps if isinstance(c, lm.CudaCompiler))


def expected(x, vals, qtype, rows, dtype, raw=None):
    """float64 x @ vals.T; the tensor-core kernel rounds the activations to the compute dtype first; qdot quantises
    them to int8 blocks (`raw`: the weight's packed rows)."""
    kernel = kernel_of(qtype, rows, dtype)
    if kernel == "qdot" and raw is not None:
        return expected_dp4a(x, raw, vals.shape[1])
    if kernel == "qmma":
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
    raw, vals = random_quant_blocks(rng.gen, qtype, n, k)
    g = lm.Graph()
    w = dequantize(g, QuantizedWeight(raw, qtype, (n, k)))
    xt = g.tensor(("s", k), name="x")
    y = ((xt * 1.5) @ w.T).output()  # (an activation computed on the device: stored float32)
    g.compile(lm.GenericCompiler(), *backend.compilers(dtype))
    for rows in (1, 3, 70, 2):
        x = rng.data((rows, k)).astype(np.float32)
        xt.set(x)
        run_checked(g, backend, monkeypatch, capfd, [kernel_of(qtype, rows, dtype)])
        close(y.numpy(), expected(x * np.float32(1.5), vals, qtype, rows, dtype, raw), backend, rng)


@pytest.mark.parametrize("rows", [1, 9])
def test_q8_batched_rows(backend, rows, rng, monkeypatch, capfd):
    """Activations with leading batch dims, (2, rows, K): the kernels flatten them into rows."""
    n, k = 50, 96
    raw, vals = random_quant_blocks(rng.gen, "Q8_0", n, k)
    g = lm.Graph()
    w = dequantize(g, QuantizedWeight(raw, "Q8_0", (n, k)))
    x = rng.data((2, rows, k)).astype(np.float32)
    xt = g.tensor((2, rows, k), name="x").set(x)
    y = ((xt * 1.5) @ w.T).output()
    g.compile(lm.GenericCompiler(), *backend.compilers("bfloat16"))
    run_checked(g, backend, monkeypatch, capfd, [kernel_of("Q8_0", 2 * rows, "bfloat16")])
    close(y.numpy(), expected(x * np.float32(1.5), vals, "Q8_0", 2 * rows, "bfloat16", raw), backend, rng)


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
        raw, v = random_quant_blocks(rng.gen, "Q8_0", n, k)
        outs.append((h @ dequantize(g, QuantizedWeight(raw, "Q8_0", (n, k)), name=f"w{j}").T).output())
        vals.append((v, raw))
    g.compile(lm.GenericCompiler(), QuantizedLowering(), QuantizedStacking(), *backend.compilers("float16"))
    # One row: the products read the same activations, so they run as one matrix-vector group (qrows: the weights
    # stored split, by __dp4a); more rows take the kernel of their row count.
    kernel = "qrows" if rows == 1 else kernel_of("Q8_0", rows, "float16")
    run_checked(g, backend, monkeypatch, capfd, [kernel])
    for o, (v, raw) in zip(outs, vals):
        want = expected_dp4a(x * np.float32(1.5), raw, k) if kernel == "qrows" else \
            expected(x * np.float32(1.5), v, "Q8_0", rows, "float16", raw)
        close(o.numpy(), want, backend, rng)


@pytest.mark.parametrize("rows", [1, 20])
def test_q8_unaligned_activations(backend, rows, rng, monkeypatch, capfd):
    """Activation rows that are not 16-byte aligned (a column slice at an odd offset): qdot's quantising kernel reads
    them element by element; more rows take the warp-per-output kernel (the tensor-core one loads float4s)."""
    n, k = 33, 64
    raw, vals = random_quant_blocks(rng.gen, "Q8_0", n, k)
    g = lm.Graph()
    w = dequantize(g, QuantizedWeight(raw, "Q8_0", (n, k)))
    x = rng.data((rows, k + 1)).astype(np.float32)
    xt = g.tensor((rows, k + 1), name="x").set(x)
    y = ((xt * 1.5)[:, 1:] @ w.T).output()
    g.compile(lm.GenericCompiler(), *backend.compilers("bfloat16"))
    run_checked(g, backend, monkeypatch, capfd, ["qdot" if rows <= 4 else "warps"])
    want = expected_dp4a(x[:, 1:] * np.float32(1.5), raw, k) if rows <= 4 else x[:, 1:].astype(np.float64) * 1.5 @ vals.T
    close(y.numpy(), want, backend, rng)


@pytest.mark.parametrize("rows", [1, 20])
def test_q8_weight_rows_2_byte_aligned(backend, rows, rng, monkeypatch, capfd):
    """Packed rows read through a view 2 bytes into a wider buffer (rows 2-byte but not 4-byte aligned, as every
    other row of an odd number of blocks is): the Q8_0 kernels read blocks with 2-byte loads."""
    n, k = 45, 128
    raw, vals = random_quant_blocks(rng.gen, "Q8_0", n, k)
    wide = np.concatenate([rng.gen.integers(0, 256, (n, 2)).astype(np.uint8), raw], 1)
    g = lm.Graph()
    t = g.tensor(wide.shape, lm.uint8, name="raw").set(wide)
    w = g._wrap(g._g.dequant("Q8_0", t[:, 2:]._edge(), [n, k]))  # (what luminal.quant.dequantize records)
    x = rng.data((rows, k)).astype(np.float32)
    xt = g.tensor((rows, k), name="x").set(x)
    y = ((xt * 1.5) @ w.T).output()
    g.compile(lm.GenericCompiler(), *backend.compilers("bfloat16"))
    run_checked(g, backend, monkeypatch, capfd, ["qdot" if rows <= 4 else "qmma"])
    close(y.numpy(), expected(x * np.float32(1.5), vals, "Q8_0", rows, "bfloat16", raw), backend, rng)


@pytest.mark.parametrize("rows", [1, 3])
def test_q8_float_matvec_when_dp4a_off(backend, rows, rng, monkeypatch, capfd):
    """LUMINAL_CUDA_Q8_DP4A=0 (comparison runs) leaves decode to the float32 kernel, qgemv, which keeps its exact
    values (no activation quantisation); K of 130 blocks, 37 columns (its last pair has one)."""
    n, k = 37, 4160
    raw, vals = random_quant_blocks(rng.gen, "Q8_0", n, k)
    monkeypatch.setenv("LUMINAL_CUDA_Q8_DP4A", "0")
    g = lm.Graph()
    w = dequantize(g, QuantizedWeight(raw, "Q8_0", (n, k)))
    x = rng.data((rows, k)).astype(np.float32)
    xt = g.tensor((rows, k), name="x").set(x)
    y = ((xt * 1.5) @ w.T).output()
    g.compile(lm.GenericCompiler(), *backend.compilers("float32"))
    run_checked(g, backend, monkeypatch, capfd, ["qgemv"])
    close(y.numpy(), (x * np.float32(1.5)).astype(np.float64) @ vals.astype(np.float64).T, backend, rng)


# ---- qdot's two kernels run on the host (no GPU, cuda_host.py): the values against quantize_rows. -----------------
@pytest.mark.parametrize("rows,n,k", [(2, 37, 4128), (1, 9, 96), (4, 6, 32)])
def test_qdot_kernels_on_the_host(rows, n, k, rng, tmp_path):
    """129 blocks (one warp's lanes take a second step; rows of 4,386 bytes: every other row only 2-byte aligned), 3
    blocks (most lanes idle) and 1; 37 and 9 columns (the last group of 4 partly past N); grids smaller than the
    work (grid-stride loops)."""
    if needs_nvrtc() is not None or not cuda_host.compiler():
        pytest.skip("needs the CUDA code generation and a host C++ compiler")
    raw, _ = random_quant_blocks(rng.gen, "Q8_0", n, k)
    x = rng.data((rows, k)).astype(np.float32)
    x[0, :32] = 0.0  # (an all-zero block: scale 0, no division by it)
    cx = lm.Graph()
    xt = cx.tensor(x.shape, name="x").set(x)
    (xt @ dequantize(cx, QuantizedWeight(raw, "Q8_0", (n, k))).T).output()
    comp = lm.CudaCompiler("float32", device=None)
    cx.compile(lm.GenericCompiler(), comp)
    g = cx._g
    ((nid, variants),) = [(i, dict(vs)) for i, vs, _ in comp.schedule.kernels() if "qdot" in dict(vs)]
    texts = dict(comp.schedule.kernel_texts)
    (quant,) = [name for name, t in texts.items() if "__float2int_rn" in t]
    node = g.node(nid)
    params = [nid, rows * n, k, n]
    for e in node.inputs:
        buf = g.node(e.node)
        size = x.size if buf.name == "x" else raw.size
        params += cuda_host.view_slots(e.view.offset, size, e.view.shape, e.view.strides)
    params += [0, n]  # (the weight's first output column, and N)
    ws_bytes = rows * k + rows * (k // 32) * 4
    main = f"""
int main() {{
  std::vector<i64> p = {{{", ".join(map(str, params))}}};
  std::vector<char> x = load("x.bin"), w = load("w.bin"), ws({ws_bytes}, 0x55);
  std::vector<float> out({rows * n}, 12345.0f);
  int err = 0;
  launch(2, 1, 1, 64, [&] {{ {quant}(p.data(), &err, out.data(), x.data(), w.data(), ws.data()); }});
  launch(3, 1, 1, 256, [&] {{ {variants["qdot"]}(p.data(), &err, out.data(), x.data(), w.data(), ws.data()); }});
  FILE* f = std::fopen("out.bin", "wb");
  std::fwrite(out.data(), 4, out.size(), f);
  std::fclose(f);
}}
"""
    dot = re.sub(r'asm volatile\("prefetch\.global\.L2.*?\);', ";", texts[variants["qdot"]], flags=re.S)  # (hints)
    exe = cuda_host.build(texts[quant] + dot + main, tmp_path)
    (tmp_path / "x.bin").write_bytes(x.tobytes())
    assert is_split(g, comp, "qweight")  # (a whole weight: stored split)
    (tmp_path / "w.bin").write_bytes(split_layout(raw, k).tobytes())
    subprocess.run([str(exe)], check=True, cwd=tmp_path)
    got = np.fromfile(tmp_path / "out.bin", np.float32).reshape(rows, n)
    want = expected_dp4a(x, raw, k)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=repr(rng))


# ---- Q8_0 products in the matrix-vector groups (qrows: dot_rows with the quants unpacked in registers) -------------
def q8_layers(g, rng, specs, raws=None):
    """For each (name, rows, k, kind): a weight (kind "q8": Dequant of random Q8_0 rows, kept in `raws`; "float":
    float32) and the float64 values it multiplies by."""
    ws, vals = {}, {}
    for name, n, k, kind in specs:
        if kind == "q8":
            raw, v = random_quant_blocks(rng.gen, "Q8_0", n, k)
            ws[name] = dequantize(g, QuantizedWeight(raw, "Q8_0", (n, k)), name=name)
            raws[name] = raw
        else:
            v = rng.data((n, k)).astype(np.float32)
            ws[name] = g.tensor(v.shape, name=name).set(v)
        vals[name] = v.astype(np.float64)
    return ws, vals


@pytest.mark.parametrize("tokens,dtype,up", [(1, "float32", "q8"), (1, "float32", "float"), (1, "bfloat16", "q8"),
                                             (5, "float32", "q8")])
@pytest.mark.parametrize("k", [192, 4160])  # 6 and 130 blocks (multiples of 32, not of 256: a partial last step)
def test_q8_grouped_matvecs_and_their_epilogues(backend, tokens, dtype, up, k, rng):
    """Q8_0 products of one activation row join the matrix-vector group (one kernel for all of them): q and k (k's
    weight float: a mixed group), o with a residual add, gate (Q8_0) and up (Q8_0, or float: one dot loop over both
    kinds) with silu(gate) * up; odd row counts (41, 7, 37: a Q8_0 unit's warps take two rows, the last one alone).
    5 rows: the same steps one by one (the tiled and warp-per-output kernels). Against float64 numpy: the group
    computes with float32 activations and sums, so the check stays tight. Rows this few give few warps: with 4160
    the group kernel splits K over 8 warps per row (group_split), whose sums meet in shared memory."""
    x, res = rng.data((tokens, k)).astype(np.float32), rng.data((tokens, 24)).astype(np.float32)
    g = lm.Graph()
    xt = g.tensor((tokens, k), name="x").set(x)
    rt = g.tensor((tokens, 24), name="res").set(res)
    h = xt * 0.02  # (an activation computed on the device: stored float32; products of a few units)
    raws = {}
    w, v = q8_layers(g, rng, [("q", 41, k, "q8"), ("k", 7, k, "float"), ("o", 24, k, "q8"), ("g", 37, k, "q8"),
                              ("u", 37, k, up)], raws)
    q, kk = (h @ w["q"].T).output(), (h @ w["k"].T).output()
    r = (rt + h @ w["o"].T).output()
    m = ((h @ w["g"].T).silu() * (h @ w["u"].T)).output()
    comps = backend.compilers(dtype)
    g.compile(lm.GenericCompiler(), *comps)
    g.execute()
    x64 = (x * np.float32(0.02)).astype(np.float64)
    floats = ("k", "u") if up == "float" else ("k",)
    v = {n: as_dtype(a, dtype).astype(np.float64) if n in floats else a for n, a in v.items()}  # (stored in dtype)
    p = {n: x64 @ a.T for n, a in v.items()}
    if tokens == 1:  # (the group's Q8_0 members: weights stored split, by __dp4a over the quantised activations)
        cuda = cuda_of(comps)
        for n in p:
            if n not in floats:
                assert is_split(g._g, cuda, n)
                p[n] = expected_dp4a(x * np.float32(0.02), raws[n], k)
    wants = [p["q"], p["k"], res + p["o"], p["g"] / (1 + np.exp(-p["g"])) * p["u"]]
    for o, want in zip((q, kk, r, m), wants):
        close(o.numpy(), want, backend, rng)
    if backend.name == "cuda" and tokens == 1:  # the activations' multiply, then one kernel for the rest
        assert g._runtime.rt.last_launches() == 2
    if backend.name.startswith("cuda") and tokens == 1:
        cuda = next(c for c in comps if isinstance(c, lm.CudaCompiler))
        (group,) = [t for _, t in cuda.schedule.kernel_texts if "const void* __restrict__ a_" in t]
        assert ("__shared__ float part_" in group) == (k == 4160) and ("sl_ = w_ % 8" in group) == (k == 4160)


def test_q8_groups_off(backend, rng, monkeypatch, capfd):
    """LUMINAL_CUDA_Q8_ROWS=0: a group's Q8_0 members take qdot one by one (the group kernel does not run)."""
    monkeypatch.setenv("LUMINAL_CUDA_Q8_ROWS", "0")
    k = 96
    x = rng.data((1, k)).astype(np.float32)
    g = lm.Graph()
    xt = g.tensor((1, k), name="x").set(x)
    h = xt * 1.5
    raws = {}
    w, v = q8_layers(g, rng, [("q", 9, k, "q8"), ("k", 5, k, "q8")], raws)
    outs = [(h @ w[n].T).output() for n in ("q", "k")]
    g.compile(lm.GenericCompiler(), *backend.compilers("float32"))
    g.execute()
    for o, n in zip(outs, ("q", "k")):  # (qdot quantises the activations: the check follows it)
        close(o.numpy(), expected_dp4a(x * np.float32(1.5), raws[n], k), backend, rng)
    if backend.name == "cuda":  # the activations' multiply, then per product its quantising kernel and qdot
        assert g._runtime.rt.last_launches() == 5
        run_checked(g, backend, monkeypatch, capfd, ["qdot"])


@pytest.mark.parametrize("n,layout,kernel", [(42, "packed", "qrows"), (41, "offset", "qrows"), (41, "packed", "qrows"),
                                             (41, "blocks", "qdot")])
def test_q8_rows_alone(backend, n, layout, kernel, rng, monkeypatch, capfd):
    """LUMINAL_CUDA_Q8_ROWS=1: a product alone takes qrows too. Rows of 5 blocks (170 bytes: every other row 2-byte
    aligned), or read 2 bytes into a wider buffer (kept as GGUF blocks: float activations); a whole weight is stored
    split (its 8-quant loads stay in its rows: __dp4a). Kept as blocks (LUMINAL_CUDA_Q8_SPLIT=0), 41 rows end 2 bytes
    into a word, which qrows' last lane would read past: qdot then."""
    monkeypatch.setenv("LUMINAL_CUDA_Q8_ROWS", "1")
    if layout == "blocks":
        monkeypatch.setenv("LUMINAL_CUDA_Q8_SPLIT", "0")
    k = 160
    raw, vals = random_quant_blocks(rng.gen, "Q8_0", n, k)
    g = lm.Graph()
    if layout != "offset":
        w = dequantize(g, QuantizedWeight(raw, "Q8_0", (n, k)))
    else:
        wide = np.concatenate([rng.gen.integers(0, 256, (n, 2)).astype(np.uint8), raw], 1)
        t = g.tensor(wide.shape, lm.uint8, name="raw").set(wide)
        w = g._wrap(g._g.dequant("Q8_0", t[:, 2:]._edge(), [n, k]))
    x = rng.data((1, k)).astype(np.float32)
    xt = g.tensor((1, k), name="x").set(x)
    y = ((xt * 1.5) @ w.T).output()
    g.compile(lm.GenericCompiler(), *backend.compilers("bfloat16"))
    run_checked(g, backend, monkeypatch, capfd, [kernel])
    x = x * np.float32(1.5)
    float_path = kernel == "qrows" and layout == "offset"
    close(y.numpy(), x.astype(np.float64) @ vals.astype(np.float64).T if float_path else expected_dp4a(x, raw, k),
          backend, rng)


# (what the qrows kernels need beyond cuda_host's prelude; the weight words' loads checked against their buffer)
QROWS_HOST = cuda_host.MATVEC + r"""
inline float op_exp2(float x) { return std::exp2(x); }
static std::vector<std::vector<char>*> packed;  // the packed weights' buffers
template <class T> T checked(const T* p) {
  const char *a = (const char*)p, *b = (const char*)(p + 1);
  for (auto* w : packed)
    if (a >= w->data() && b <= w->data() + w->size()) return *p;
  std::fprintf(stderr, "weight load out of bounds\n");
  std::abort();
}
inline unsigned __ldg(const unsigned* p) { return checked(p); }
inline u16 __ldg(const u16* p) { return checked(p); }
"""


def slice_of(g, nid, rows, n, k, sizes, q8):
    """A QMatMul's (q8) or MatMul's parameter slice as the runtime writes it: node, outputs, K, N, then its views
    (cuda_host.view_slots); a QMatMul's weights' first rows after them."""
    p = [nid, rows * n, k, n]
    for e in g.node(nid).inputs:
        p += cuda_host.view_slots(e.view.offset, sizes[g.node(e.node).name], e.view.shape, e.view.strides)
    return p + ([0, n] if q8 else [])


@pytest.mark.parametrize("n,k,layout", [(42, 160, "packed"), (10, 1088, "offset"), (4, 32, "packed"), (7, 2112, "packed")])
def test_qrows_kernels_on_the_host(n, k, layout, rng, tmp_path):
    """The qrows kernel alone and a group of Q8_0, float and Q8_0 members run on the host (cuda_host.py), against
    float64 numpy, every weight word's load checked against its buffer: 5 blocks (lanes 20-31 idle; 170-byte rows,
    every other one 2-byte aligned), 34 (a partial step: rows read 2 bytes into a wider buffer), 1, and 66 (two
    whole steps of 32 blocks, then a partial one); odd row counts; grids smaller than the work; the group kernel of
    34 and 66 blocks splits K over 2 and 4 warps a row (group_split), in blocks of 256 threads as the runtime
    launches it."""
    if needs_nvrtc() is not None or not cuda_host.compiler():
        pytest.skip("needs the CUDA code generation and a host C++ compiler")
    raw, vals = random_quant_blocks(rng.gen, "Q8_0", n, k)
    n2 = n + 1 if k // 32 % 2 == 0 else n + 2  # (rows of whole 4-byte words, as the runtime requires)
    raw2, vals2 = random_quant_blocks(rng.gen, "Q8_0", n2, k)
    wf = rng.data((7, k)).astype(np.float32)
    buf = raw if layout == "packed" else np.concatenate([rng.gen.integers(0, 256, (n, 2)).astype(np.uint8), raw], 1)
    x = rng.data((1, k)).astype(np.float32)
    cx = lm.Graph()
    xt = cx.tensor(x.shape, name="x").set(x)
    t = cx.tensor(buf.shape, lm.uint8, name="w").set(buf)
    w = cx._wrap(cx._g.dequant("Q8_0", (t if layout == "packed" else t[:, 2:])._edge(), [n, k]))
    w2 = dequantize(cx, QuantizedWeight(raw2, "Q8_0", (n2, k)), name="w2")
    outs = [(xt @ w.T).output(), (xt @ cx.tensor(wf.shape, name="wf").set(wf).T).output(), (xt @ w2.T).output()]
    comp = lm.CudaCompiler("float32", device=None)
    cx.compile(lm.GenericCompiler(), comp)
    g = cx._g
    texts = dict(comp.schedule.kernel_texts)
    ((group, members),) = comp.schedule.groups()
    kinds = {i: dict(vs) for i, vs, _ in comp.schedule.kernels()}
    ids = [o._edge().node for o in outs]
    ids = [g.node(i).inputs[0].node if i not in kinds else i for i in ids]  # (an Output aliasing its product)
    assert "qrows" in kinds[ids[0]] and "gemv" in kinds[ids[1]] and "qrows" in kinds[ids[2]]
    assert sorted(members) == sorted(ids)
    sizes = {"x": x.size, "w": buf.size, "w2": raw2.size, "wf": wf.size}
    rows = [n, 7, n2]
    slices = [slice_of(g, i, 1, r, k, sizes, q) for i, r, q in zip(ids, rows, (True, False, True))]
    order = [ids.index(m) for m in members]  # (the group kernel's argument order)
    arrays = ", ".join(f"out{j}({rows[j]}, 12345.0f)" for j in range(3))
    group_args = "".join(f", P[{j}].data(), out{j}.data(), {('w', 'wf', 'w2')[j]}.data()" for j in order)
    main = f"""
int main() {{
  std::vector<std::vector<i64>> P = {{{", ".join("{" + ", ".join(map(str, s)) + "}" for s in slices)}}};
  std::vector<char> x = load("x.bin"), w = load("w.bin"), w2 = load("w2.bin"), wf = load("wf.bin");
  std::vector<float> alone({n}, 12345.0f), {arrays};
  int err = 0;
  packed = {{&w, &w2}};
  launch(2, 1, 1, 64, [&] {{ {kinds[ids[0]]["qrows"]}(P[0].data(), &err, alone.data(), x.data(), w.data()); }});
  launch(3, 1, 1, 256, [&] {{ {group}(P[{order[0]}].data(), &err, x.data(){group_args}); }});
  FILE* f = std::fopen("out.bin", "wb");
  for (auto* v : {{&alone, &out0, &out1, &out2}}) std::fwrite(v->data(), 4, v->size(), f);
  std::fclose(f);
}}
"""
    exe = cuda_host.build(QROWS_HOST + texts[kinds[ids[0]]["qrows"]] + texts[group] + main, tmp_path)
    # (whole weights are stored split and meet the activations by __dp4a; w read through an offset view is not)
    assert is_split(g, comp, "w") == (layout == "packed") and is_split(g, comp, "w2")
    for name, a in (("x", x), ("w", split_layout(raw, k) if layout == "packed" else buf), ("w2", split_layout(raw2, k)),
                    ("wf", wf)):
        (tmp_path / f"{name}.bin").write_bytes(np.ascontiguousarray(a).tobytes())
    subprocess.run([str(exe)], check=True, cwd=tmp_path)
    got = np.fromfile(tmp_path / "out.bin", np.float32)
    x64 = x.astype(np.float64)
    p_w = expected_dp4a(x, raw, k)[0] if layout == "packed" else (x64 @ vals.T.astype(np.float64))[0]
    want = np.concatenate([p_w, p_w, (x64 @ wf.T.astype(np.float64))[0], expected_dp4a(x, raw2, k)[0]], None)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=repr(rng))


@pytest.mark.parametrize("staged", [True, False])
@pytest.mark.parametrize("k", [192, 2112])
def test_qrows_group_epilogues_on_the_host(k, staged, rng, tmp_path, monkeypatch):
    """A group of Q8_0 units with epilogues run on the host: o (24 rows) with a residual add, and gate and up (37
    rows: the last pair of rows has one) with silu(gate) * up; every warp computes two rows of its unit. Their
    weights are stored split, by __dp4a over the activation row quantised once per block into shared memory
    (staged), or in the loop (LUMINAL_CUDA_Q8_STAGE=0); 6 blocks (one partial step), 66 (K split over 4 warps a
    row). Three blocks for the work of more: each block stages the row before its rows. Against float64 numpy. The
    split kernel launched with blocks of 2 warps (fewer than a row's 4) stops instead of looping for ever."""
    if needs_nvrtc() is not None or not cuda_host.compiler():
        pytest.skip("needs the CUDA code generation and a host C++ compiler")
    if not staged:
        monkeypatch.setenv("LUMINAL_CUDA_Q8_STAGE", "0")
    x, res = rng.data((1, k), "small").astype(np.float32), rng.data((1, 24)).astype(np.float32)
    cx = lm.Graph()
    xt, rt = cx.tensor(x.shape, name="x").set(x), cx.tensor(res.shape, name="res").set(res)
    data, vals, w = {"x": x, "res": res}, {}, {}
    for name, n in (("o", 24), ("g", 37), ("u", 37)):
        data[name], vals[name] = random_quant_blocks(rng.gen, "Q8_0", n, k)
        w[name] = dequantize(cx, QuantizedWeight(data[name], "Q8_0", (n, k)), name=name)
    outs = [(rt + xt @ w["o"].T).output(), ((xt @ w["g"].T).silu() * (xt @ w["u"].T)).output()]
    comp = lm.CudaCompiler("float32", device=None)
    cx.compile(lm.GenericCompiler(), comp)
    g = cx._g
    ((group, ids),) = comp.schedule.groups()
    members = [i for i in ids if g.node(i).name.startswith("QMatMul")]
    epilogues = [i for i in ids if i not in members]
    text = dict(comp.schedule.kernel_texts)[group]
    assert len(members) == 3 and len(epilogues) == 2 and "(P0[1] + 1) / 2" in text and "q8_quantize8" in text
    assert ("sl_ = w_ % 4" in text) == (k == 2112) and (f"u8 xq_[{k}]" in text) == staged
    name_of = {e.node: g.node(e.node).name for i in ids for e in g.node(i).inputs}
    sizes = {n: a.size for n, a in data.items()}
    numel = lambda i: int(np.prod([int(d) for d in g.node(i).shape]))
    slices, args = [], ["x.data()"]
    for j, m in enumerate(members):
        n = numel(m)
        slices.append(slice_of(g, m, 1, n, k, sizes, True))
        args += [f"P[{j}].data()", f"o{m}.data()", f"{name_of[g.node(m).inputs[1].node]}.data()"]
    for e in epilogues:  # (in the members' order: o's, then gate and up's)
        p = [e, numel(e), 0, 0]
        for ed in g.node(e).inputs:
            size = numel(ed.node) if ed.node in members else sizes[name_of[ed.node]]
            p += cuda_host.view_slots(ed.view.offset, size, ed.view.shape, ed.view.strides)
        slices.append(p)
        args += [f"P[{len(slices) - 1}].data()", f"o{e}.data()"]
        args += [f"o{ed.node}.data()" if ed.node in members else f"{name_of[ed.node]}.data()" for ed in g.node(e).inputs]
    bufs = "".join(f"  std::vector<float> o{i}({numel(i)}, 12345.0f);\n" for i in ids)
    loads = "".join(f'  std::vector<char> {n} = load("{n}.bin");\n' for n in data)
    main = f"""
int main(int argc, char** argv) {{
  std::vector<std::vector<i64>> P = {{{", ".join("{" + ", ".join(map(str, p)) + "}" for p in slices)}}};
{loads}{bufs}  int err = 0;
  packed = {{&o, &g, &u}};
  launch(3, 1, 1, argc > 1 ? std::atoi(argv[1]) : 256, [&] {{ {group}(P[0].data(), &err, {", ".join(args)}); }});
  FILE* f = std::fopen("out.bin", "wb");
  std::fwrite(o{epilogues[0]}.data(), 4, o{epilogues[0]}.size(), f);
  std::fwrite(o{epilogues[1]}.data(), 4, o{epilogues[1]}.size(), f);
  std::fclose(f);
}}
"""
    exe = cuda_host.build(QROWS_HOST + dict(comp.schedule.kernel_texts)[group] + main, tmp_path)
    for n, a in data.items():
        assert is_split(g, comp, n) == (n not in ("x", "res"))
        (tmp_path / f"{n}.bin").write_bytes(np.ascontiguousarray(split_layout(a, k) if n in vals else a).tobytes())
    subprocess.run([str(exe)], check=True, cwd=tmp_path)
    got = np.fromfile(tmp_path / "out.bin", np.float32)
    p = {n: expected_dp4a(x, data[n], k) for n in vals}  # (split weights: by __dp4a)
    want = np.concatenate([(res + p["o"]).ravel(), (p["g"] / (1 + np.exp(-p["g"])) * p["u"]).ravel()])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=repr(rng))
    if k == 2112:  # (blocks of 2 warps for a row split over 4: the kernel stops, rather than loop for ever)
        assert subprocess.run([str(exe), "64"], cwd=tmp_path, timeout=60, capture_output=True).returncode != 0


def test_q8_group_as_rows_change(backend, rng, monkeypatch, capfd):
    """One compiled graph over a symbolic number of rows: 1 (the group kernel, qrows), 3 (its products one by one:
    qdot), 7 (the warp-per-output kernel) and 1 again; q and k of odd row counts (a warp's pair of rows with one
    left), K of 10 blocks (one partial step)."""
    k = 320
    g = lm.Graph()
    xt = g.tensor(("s", k), name="x")
    h = xt * 1.5
    raws = {}
    w, v = q8_layers(g, rng, [("q", 21, k, "q8"), ("k", 9, k, "q8")], raws)
    outs = {n: (h @ w[n].T).output() for n in ("q", "k")}
    g.compile(lm.GenericCompiler(), *backend.compilers("float32"))
    for rows in (1, 3, 7, 1):
        x = rng.data((rows, k)).astype(np.float32)
        xt.set(x)
        run_checked(g, backend, monkeypatch, capfd, [{1: "qrows", 3: "qdot", 7: "warps"}[rows]])
        x = x * np.float32(1.5)
        for n, o in outs.items():
            want = expected_dp4a(x, raws[n], k) if rows <= 3 else x.astype(np.float64) @ v[n].T  # (1: split, __dp4a)
            close(o.numpy(), want, backend, rng)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("mode", ["cublas", "tuned"])
def test_q8_prefill_through_cublas(backend, dtype, mode, rng, monkeypatch, capfd):
    """Many rows over one Q8_0 weight: cuBLASLt over the weights dequantised into its workspace (q8_rows: scale *
    quant rounded to the compute dtype, as torch's product with a dequantised 16-bit weight), the activations rounded
    the same way; 70 rows, 37 columns, 130 blocks, weight rows not 4-byte aligned (a 2-byte offset into the buffer).
    Timed against the tensor-core kernel ("tuned"), either may run: its check is the looser of the two."""
    if backend.name == "cuda" and not lm.cuda.cublas_available()[0]:
        pytest.skip(lm.cuda.cublas_available()[1].splitlines()[0])
    if mode == "cublas":
        monkeypatch.setenv("LUMINAL_CUDA_GEMM", "cublas")
    else:
        monkeypatch.delenv("LUMINAL_CUDA_GEMM")
    n, k, rows = 37, 4160, 70
    raw, vals = random_quant_blocks(rng.gen, "Q8_0", n, k)
    buf = np.concatenate([rng.gen.integers(0, 256, (n, 2)).astype(np.uint8), raw], 1)
    g = lm.Graph()
    t = g.tensor(buf.shape, lm.uint8, name="w").set(buf)
    w = g._wrap(g._g.dequant("Q8_0", t[:, 2:]._edge(), [n, k]))
    x = rng.data((rows, k)).astype(np.float32)
    xt = g.tensor((rows, k), name="x").set(x)
    y = ((xt * 1.5) @ w.T).output()
    g.compile(lm.GenericCompiler(), *backend.compilers(dtype))
    run_checked(g, backend, monkeypatch, capfd, ["cublas"] if mode == "cublas" else [])
    xs = as_dtype(x * np.float32(1.5), dtype).astype(np.float64)
    want = xs @ as_dtype(vals.astype(np.float32), dtype).astype(np.float64).T
    if backend.name == "cuda" and mode == "cublas":
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=repr(rng))
    else:  # (cuda-nvrtc: the CPU kernels; tuned: either kernel)
        np.testing.assert_allclose(y.numpy(), want, rtol=0, atol=1e-2 * np.abs(want).max(), err_msg=repr(rng))


def test_q8_weights_stored_split(backend, rng):
    """A whole Q8_0 weight given as a DeviceArray: the first run rearranges its memory in place (stored split, the
    group kernels' layout); numpy() still reads GGUF blocks; a graph that reads it as blocks (a Dequant alone) joins
    it back, and the first graph splits it again. Memory borrowed from torch is never rearranged: each run reads a
    split copy, so a change to the torch tensor shows in the next run."""
    if backend.name != "cuda":
        pytest.skip("runs on the GPU")
    import torch

    n, k = 37, 4160
    raw, vals = random_quant_blocks(rng.gen, "Q8_0", n, k)
    x = rng.data((1, k)).astype(np.float32)

    def product(arr):
        g = lm.Graph()
        t = g.tensor(raw.shape, lm.uint8, name="w").set(arr)
        y = (g.tensor(x.shape, name="x").set(x) @ g._wrap(g._g.dequant("Q8_0", t._edge(), [n, k])).T).output()
        comps = backend.compilers("float32")
        g.compile(lm.GenericCompiler(), *comps)
        assert is_split(g._g, cuda_of(comps), "w")
        return g, y

    dev = lm._core.cuda_upload(raw, "uint8")
    g, y = product(dev)
    g.execute()
    close(y.numpy(), expected_dp4a(x, raw, k), backend, rng)
    np.testing.assert_array_equal(dev.numpy(), raw)
    g2 = lm.Graph()
    d = g2._wrap(g2._g.dequant("Q8_0", g2.tensor(raw.shape, lm.uint8, name="w").set(dev)._edge(), [n, k])).output()
    comps = backend.compilers("float32")
    g2.compile(lm.GenericCompiler(), *comps)
    assert not cuda_of(comps).schedule.q8_split
    g2.execute()
    np.testing.assert_allclose(d.numpy(), vals, rtol=1e-6, atol=0)
    g.execute()
    close(y.numpy(), expected_dp4a(x, raw, k), backend, rng)

    tw = torch.from_numpy(raw.copy()).cuda()
    gb, yb = product(lm.cuda.from_torch(tw, copy=False))
    gb.execute()
    close(yb.numpy(), expected_dp4a(x, raw, k), backend, rng)
    np.testing.assert_array_equal(tw.cpu().numpy(), raw)  # (the caller's memory as it was)
    raw2, _ = random_quant_blocks(rng.gen, "Q8_0", n, k)
    tw.copy_(torch.from_numpy(raw2))
    torch.cuda.synchronize()
    gb.execute()
    close(yb.numpy(), expected_dp4a(x, raw2, k), backend, rng)
    np.testing.assert_array_equal(tw.cpu().numpy(), raw2)
