"""The CUDA Contraction kernels (src/cuda/codegen.cpp contraction_step, src/cuda/contraction.cpp): convolutions as
an implicit GEMM through the input's window view, on tensor cores with a 16-bit compute dtype and in float32
otherwise, and a warp per output for padded views and integers. Parity with torch at shapes off the 64 x 64 tiles'
edges, k past its 16- or 32-wide tiles, batch dims (groups), symbolic batches and flipped (transposed-convolution)
weights. On a GPU the kernels run (`cuda`); everywhere NVRTC opens they are compiled for sm_80 and sm_90 while the
CPU kernels execute the same lowering (`cuda-nvrtc`, what CI runs), and the implicit-GEMM kernels also run as C++
on the host (test_kernels_on_the_host), so that CI checks their arithmetic too."""
from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import luminal as lm
import luminal.nn.functional as LF
import cuda_host
from helpers import NVRTC_CHECK, check, compare, needs_cuda, needs_nvrtc, run

@pytest.fixture
def backend(cuda_backend):
    return cuda_backend


def _pair(name, **kw):
    return (lambda *ts: getattr(LF, name)(*ts, **kw)), (lambda *ts: getattr(F, name)(*ts, **kw))


CONV2D = [  # (input, weight, kwargs): M = batch x output pixels and N = output channels past 64-wide tiles
    ((2, 40, 13, 11), (70, 40, 3, 3), dict(padding=1)),  # k = 360: 12 tiles of 32, 23 of 16, the last partial
    ((1, 8, 40, 37), (10, 8, 3, 3), dict(stride=2, padding=1)),  # strided rows
    ((2, 16, 9, 9), (130, 16, 1, 1), dict(stride=2)),  # a ResNet downsample: 1 x 1, stride 2, N over two tiles
    ((3, 24, 7, 7), (33, 24, 1, 1), {}),  # 1 x 1: a plain GEMM with channel-strided k
    ((1, 3, 23, 21), (20, 3, 7, 7), dict(stride=2, padding=3)),  # a ResNet stem (k = 147)
    ((2, 12, 11, 9), (18, 4, 3, 3), dict(groups=3, dilation=(2, 1), padding=(2, 1))),  # groups: a batch dim
    ((1, 10, 9, 8), (10, 1, 3, 3), dict(groups=10, padding=1)),  # depthwise
]


def _id(case):
    xs, ws, kw = case
    return f"{xs}x{ws}-" + "-".join(f"{k}={v}" for k, v in kw.items()).replace(" ", "")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("case", CONV2D, ids=_id)
def test_conv2d(backend, rng, case, dtype):
    xs, ws, kw = case
    lf, tf = _pair("conv2d", **kw)
    k = ws[1] * ws[2] * ws[3]
    check(lf, tf, [xs, ws, (ws[0],)], dtype=dtype, backend=backend, rng=rng, name="conv2d", domain="small",
          tol_scale=10 if dtype == "float32" else 4, atol=None if dtype == "float32" else 0.02 * k ** 0.5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_conv1d(backend, rng, dtype):
    lf, tf = _pair("conv1d", stride=2, padding=2, dilation=3)
    check(lf, tf, [(3, 20, 150), (67, 20, 5)], dtype=dtype, backend=backend, rng=rng, name="conv1d", domain="small",
          tol_scale=10 if dtype == "float32" else 4, atol=None if dtype == "float32" else 0.2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_symbolic_batch(backend, rng, dtype):
    """The batch bound at run time: the rows (batch x pixels) and their tiles follow it, one compiled graph."""
    lf, tf = _pair("conv2d", stride=2, padding=1)
    check(lf, tf, [(5, 6, 15, 12), (70, 6, 3, 3)], dims=[("n", 6, 15, 12), None], dtype=dtype, backend=backend,
          rng=rng, name="conv2d batch", domain="small", tol_scale=10 if dtype == "float32" else 4,
          atol=None if dtype == "float32" else 0.15)


def test_conv_transpose2d(backend, rng):
    """Flipped weights (negative strides in k) over a zero-inserted input."""
    lf, tf = _pair("conv_transpose2d", stride=2, padding=1, output_padding=1)
    check(lf, tf, [(2, 12, 9, 8), (12, 66, 3, 3), (66,)], backend=backend, rng=rng, name="conv_transpose2d",
          domain="small", tol_scale=10)


def test_contraction_not_a_convolution(backend, rng):
    """A product summed over two axes with a transposed operand: rows along k for one operand, along the output
    rows for the other; and a batch dim both move along."""
    f = lambda a, b: (a.unsqueeze(2) * b.transpose(-1, -2).unsqueeze(1)).sum((-2, -1))  # noqa: E731
    tf = lambda a, b: torch.einsum("bmij,bnji->bmn", a, b)  # noqa: E731
    check(f, tf, [(2, 70, 9, 12), (2, 66, 12, 9)], backend=backend, rng=rng, name="contraction", tol_scale=10)


def test_padded_and_integer_contractions(backend, rng):
    """A padded operand view and integers take the warp-per-output kernel."""
    a, b = rng.data((5, 6, 7)), rng.data((5, 8, 9))
    got = run(lambda p, q: (p.pad((1, 1, 1, 1)) * q).sum((-2, -1)), a, b, backend=backend)
    compare(got, np.einsum("ijk,ijk->i", np.pad(a, ((0, 0), (1, 1), (1, 1))), b), "float32", "padded", rng,
            tol_scale=10)
    ia, ib = rng.integers(-9, 9, (4, 1, 5, 6)), rng.integers(-9, 9, (1, 3, 5, 6))
    got = run(lambda p, q: (p * q).sum((-2, -1)), ia, ib, backend=backend)
    compare(got, (ia.astype(np.int64) * ib).sum((-2, -1)), "int32", "integers", rng)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_float32_graph_16bit_compute(rng, dtype):
    """A float32 graph with 16-bit compute (how models run on the GPU): the weights are kept in the compute dtype,
    the float32 activations rounded to it as they are staged; float32 accumulators and output."""
    if needs_cuda() is None:
        compilers = [lm.CudaCompiler(dtype)]
    elif needs_nvrtc() is None:
        compilers = [lm.CudaCompiler(dtype, device=None), NVRTC_CHECK]
    else:
        pytest.skip(needs_nvrtc())
    x = rng.data((2, 32, 14, 14)).astype(np.float32)
    w = (rng.data((96, 32, 3, 3)) / 17).astype(np.float32)
    cx = lm.Graph()
    a, b = cx.tensor(x.shape).set(x), cx.tensor(w.shape).set(w)
    y = LF.relu(LF.conv2d(a * 2.0, b, padding=1)).output()
    cx.compile(lm.GenericCompiler(), *compilers)
    cx.execute()
    td = getattr(torch, dtype)
    want = F.relu(F.conv2d((torch.from_numpy(x) * 2).to(td).float(), torch.from_numpy(w).to(td).float(), padding=1))
    np.testing.assert_allclose(y.numpy().astype(np.float32), want.numpy(), rtol=2e-2, atol=3e-2, err_msg=dtype)


@pytest.mark.parametrize("dtype,fast", [("float32", "implicit-gemm"), ("bfloat16", "implicit-mma"),
                                        ("float16", "implicit-mma")])
def test_printed_variants(dtype, fast):
    """A convolution is one Contraction step with the implicit GEMM first and a warp per output last; a padded
    operand or integers only the latter."""
    def variants(fn, shapes, dt=dtype):
        cx = lm.Graph()
        fn(*[cx.tensor(s, dtype=dt) for s in shapes]).output()
        comp = lm.CudaCompiler(dtype if dt != "int32" else "float32", device=None)
        cx.compile(lm.GenericCompiler(), comp)
        assert cx.stats().get("Contraction") == 1, cx.stats()
        return [[k for k, _ in vs] for _, vs, _ in comp.schedule.kernels()]

    assert [fast, "warps"] in variants(lambda x, w: LF.conv2d(x, w, padding=1), [(1, 4, 9, 9), (8, 4, 3, 3)])
    # (float32 operands: a 16-bit product is rounded before its sum, which is then no matrix product)
    padded = variants(lambda p, q: (p.pad((1, 1, 1, 1)) * q).sum((-2, -1)), [(5, 6, 7), (5, 8, 9)], dt="float32")
    assert ["warps"] in padded and not any(fast in v for v in padded), padded
    ints = variants(lambda p, q: (p * q).sum((-2, -1)), [(4, 1, 5, 6), (1, 3, 5, 6)], dt="int32")
    assert ["warps"] in ints and not any(fast in v for v in ints), ints


# ---- the kernels' arithmetic without a GPU ----------------------------------------------------------------------------
# The implicit-GEMM kernels compiled as C++ for the host (cuda_host.py): what CI can check of their indexing (row,
# column and batch offsets, k tables, the register pipeline, k splits) beyond NVRTC's compile.
_HOST_MAIN = r"""
int main(int argc, char** argv) {
  i64 np, na, nb, nout, G[3], threads, zero, splits;
  FILE* f = std::fopen(argv[1], "rb");
  std::fread(&np, 8, 1, f); std::fread(&na, 8, 1, f); std::fread(&nb, 8, 1, f); std::fread(&nout, 8, 1, f);
  std::fread(G, 8, 3, f); std::fread(&threads, 8, 1, f); std::fread(&zero, 8, 1, f); std::fread(&splits, 8, 1, f);
  std::vector<i64> p(np); std::vector<char> a(na), b(nb); std::vector<float> out(nout, 12345.0f);
  std::fread(p.data(), 8, np, f); std::fread(a.data(), 1, na, f); std::fread(b.data(), 1, nb, f); std::fclose(f);
  int err = 0;
  if (splits > 1) launch(1, 1, 1, 1, [&] { ZERO(p.data(), &err, out.data()); });
  launch(G[0], G[1], G[2], int(threads), [&] { MAIN(p.data(), &err, out.data(), a.data(), b.data()); });
  f = std::fopen(argv[2], "wb"); std::fwrite(out.data(), 4, nout, f); std::fclose(f);
}
"""


def _run_on_host(fn, arrays, dtype, sms, tmp_path):
    """Runs the Contraction of fn(*inputs) (its operands graph inputs) through its printed implicit-GEMM kernel on
    the host, with the runtime's layout (contraction.cpp) for a GPU of `sms` multiprocessors."""
    cx = lm.Graph()
    y = fn(*[cx.tensor(a.shape).set(a) for a in arrays]).output()
    comp = lm.CudaCompiler(dtype, device=None)
    cx.compile(lm.GenericCompiler(), comp)
    g = cx._g
    (cid,) = [i for i in g.topo_order() if g.node(i).name == "Contraction"]
    (variants,) = [vs for nid, vs, _ in comp.schedule.kernels() if nid == cid]
    kind, name = variants[0]
    assert kind == ("implicit-gemm" if dtype == "float32" else "implicit-mma"), variants
    texts = dict(comp.schedule.kernel_texts)
    main = re.sub(r'asm volatile\("mma\.sync.*?\);', "mma_host(acc[i][j], af[i], bf[j]);", texts[name], flags=re.S)
    zero = [t for t in texts.values() if "((float*)out)[t] = 0.0f;" in t]
    node = g.node(cid)
    shape = [int(s) for s in node.inputs[0].view.shape]
    axes = len(shape) - len(node.shape)
    params = [cid, int(np.prod([int(s) for s in node.shape])), 0, 0]
    data = []
    for e, arr in zip(node.inputs, arrays):
        assert g.node(e.node).op == "Input"
        params += cuda_host.view_slots(e.view.offset, arr.size, shape, e.view.strides)
        stored = comp.schedule.storage_dtype(e.node)
        data.append(torch.from_numpy(arr).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
                    if stored == "bfloat16" else arr.astype(np.float32).tobytes())
    ok, slots, grid = lm._core.cuda_contraction_layout(shape, [int(s) for s in node.inputs[0].view.strides],
                                                       [int(s) for s in node.inputs[1].view.strides], axes,
                                                       16 if dtype == "float32" else 32, bool(zero), sms)
    assert ok
    params += slots
    exe = cuda_host.build(main + "".join(zero) + _HOST_MAIN.replace("MAIN", name).replace(
        "ZERO", re.search(r"void (k\d+)\(", zero[0]).group(1) if zero else "MAIN"), tmp_path)
    head = [len(params), len(data[0]), len(data[1]), params[1], *grid, 128 if dtype != "float32" else 256,
            int(bool(zero)), slots[6]]
    (tmp_path / "in.bin").write_bytes(np.array(head + params, np.int64).tobytes() + data[0] + data[1])
    subprocess.run([str(exe), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True)
    return np.fromfile(tmp_path / "out.bin", np.float32).reshape([int(s) for s in node.shape]), slots[6]


HOST_CASES = [  # (dtype, sms, x, w, kwargs, k split expected)
    ("float32", 132, (2, 5, 9, 11), (70, 5, 3, 3), {}, False),  # 2 x 2 tiles, k over 3 tiles of 16
    ("float32", 132, (1, 40, 5, 5), (8, 40, 3, 3), {}, True),  # one tile, k = 360 split over blocks
    ("bfloat16", 1, (2, 12, 11, 9), (18, 4, 3, 3), dict(groups=3, dilation=(2, 1)), False),  # batch dims
    ("bfloat16", 132, (3, 300, 6, 7), (70, 300, 1, 1), dict(stride=2), True),  # 1 x 1 strided, k split
]


@pytest.mark.parametrize("case", HOST_CASES, ids=lambda c: f"{c[0]}-{c[2]}x{c[3]}-sms{c[1]}")
def test_kernels_on_the_host(case, tmp_path):
    dtype, sms, xs, ws, kw, split = case
    if needs_nvrtc() is not None or not cuda_host.compiler():
        pytest.skip("needs the CUDA code generation and a host C++ compiler")
    gen = np.random.default_rng(0)
    x, w = (torch.from_numpy(gen.standard_normal(s).astype(np.float32)) for s in (xs, ws))
    if dtype != "float32":  # (operands exactly representable: the products are exact, only the sums' order differs)
        x, w = x.to(torch.bfloat16).float(), w.to(torch.bfloat16).float()
    got, splits = _run_on_host(lambda a, b: LF.conv2d(a, b, **kw), [x.numpy(), w.numpy()], dtype, sms, tmp_path)
    assert (splits > 1) == split, splits
    want = F.conv2d(x, w, **kw).numpy()
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4)  # (groups: (N, G, O/G, ...))
