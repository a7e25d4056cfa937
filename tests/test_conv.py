"""PyTorch parity of luminal's convolutions, pooling, interpolation and im2col (luminal.nn.functional), on every
backend in conftest.BACKENDS, and the CPU lowering of a convolution into one Contraction (a GEMM over its window
view).

Shapes are small and odd on purpose; parameters cover strides, dilations, groups, 'same'/'valid' padding, ceil_mode,
symbolic batch and length dims, and unbatched inputs. Bad arguments raise at graph-build time naming the shapes.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import luminal as lm
import luminal.nn.functional as LF
from helpers import LOW, check, compare, run


def _pair(name, **kw):
    """luminal's and torch's function of that name, with the same keyword arguments."""
    return (lambda *ts: getattr(LF, name)(*ts, **kw)), (lambda *ts: getattr(F, name)(*ts, **kw))


def _id(case):
    return "-".join(f"{k}={v}" for k, v in case.items()).replace(" ", "") or "default"


# =====================================================================================================================
# Convolution
# =====================================================================================================================
CONV2D = [  # (input, weight, bias?, kwargs)
    ((2, 4, 7, 9), (6, 4, 3, 3), True, {}),
    ((1, 3, 8, 7), (5, 3, 1, 1), False, {}),
    ((2, 4, 9, 8), (6, 4, 3, 2), True, dict(stride=2, padding=1)),
    ((1, 4, 11, 9), (4, 4, 3, 3), False, dict(dilation=2, padding=2)),
    ((2, 4, 7, 9), (6, 2, 3, 3), True, dict(groups=2, stride=(2, 1), padding=(1, 0), dilation=(1, 2))),
    ((1, 6, 7, 8), (6, 1, 3, 3), True, dict(groups=6, padding=1)),  # depthwise
    ((2, 3, 7, 8), (4, 3, 4, 3), True, dict(padding="same")),  # even kernel: the odd padding goes right
    ((1, 3, 9, 7), (4, 3, 3, 3), False, dict(padding="same", dilation=2)),
    ((1, 3, 6, 7), (4, 3, 3, 3), False, dict(padding="valid", stride=3)),
    ((1, 3, 15, 13), (8, 3, 7, 7), True, dict(stride=2, padding=3)),  # a small ResNet stem
    ((1, 2, 5, 75), (3, 2, 3, 3), False, dict(stride=2, padding=1)),  # rows of 38 outputs: whole strided panels
    ((3, 7, 9), (5, 3, 3, 3), True, dict(padding=1)),  # unbatched
]


@pytest.mark.filterwarnings("ignore:Using padding='same'")  # torch's note on even kernels
@pytest.mark.parametrize("case", CONV2D, ids=lambda c: f"{c[0]}x{c[1]}-{_id(c[3])}".replace(" ", ""))
def test_conv2d(backend, rng, case):
    xs, ws, bias, kw = case
    shapes = [xs, ws] + ([(ws[0],)] if bias else [])
    lf, tf = _pair("conv2d", **kw)
    check(lf, tf, shapes, backend=backend, rng=rng, name="conv2d", tol_scale=5)


CONV1D = [
    ((2, 3, 11), (5, 3, 3), {}),
    ((2, 4, 12), (6, 2, 4), dict(stride=2, padding=2, dilation=2, groups=2)),
    ((1, 3, 9), (4, 3, 5), dict(padding="same")),
    ((3, 10), (4, 3, 3), dict(stride=3)),  # unbatched
]


@pytest.mark.parametrize("case", CONV1D, ids=lambda c: f"{c[0]}x{c[1]}-{_id(c[2])}".replace(" ", ""))
def test_conv1d(backend, rng, case):
    xs, ws, kw = case
    lf, tf = _pair("conv1d", **kw)
    check(lf, tf, [xs, ws, (ws[0],)], backend=backend, rng=rng, name="conv1d", tol_scale=5)


def test_conv3d(backend, rng):
    lf, tf = _pair("conv3d", stride=(1, 2, 1), padding=1)
    check(lf, tf, [(1, 2, 4, 5, 4), (3, 2, 3, 3, 2), (3,)], backend=backend, rng=rng, name="conv3d", tol_scale=5)


def test_conv_symbolic_dims(backend, rng):
    """A batch dim and a length dim bound at run time."""
    lf, tf = _pair("conv2d", stride=2, padding=1)
    check(lf, tf, [(3, 2, 7, 6), (4, 2, 3, 3)], dims=[("n", 2, 7, 6), None], backend=backend, rng=rng,
          name="conv2d batch", tol_scale=5)
    lf, tf = _pair("conv1d", padding=1, dilation=2)
    check(lf, tf, [(2, 3, 13), (4, 3, 3)], dims=[(2, 3, "t"), None], backend=backend, rng=rng, name="conv1d len",
          tol_scale=5)


@pytest.mark.parametrize("dtype", LOW)
def test_conv2d_low_precision(backend, rng, dtype):
    lf, tf = _pair("conv2d", padding=1, groups=2)
    check(lf, tf, [(1, 4, 6, 5), (4, 2, 3, 3), (4,)], dtype=dtype, backend=backend, rng=rng, name="conv2d",
          domain="small", tol_scale=4)


CONVT2D = [
    ((2, 3, 5, 4), (3, 4, 3, 3), {}),
    ((1, 3, 4, 5), (3, 2, 3, 2), dict(stride=2)),
    ((2, 4, 5, 4), (4, 3, 3, 3), dict(stride=2, padding=1, output_padding=1, groups=2)),
    ((1, 3, 4, 4), (3, 2, 2, 3), dict(stride=(2, 3), padding=(0, 1), dilation=2, output_padding=(1, 0))),
    ((3, 4, 4), (3, 2, 3, 3), dict(stride=2, padding=2)),  # unbatched, padding past the kernel's reach
]


@pytest.mark.parametrize("case", CONVT2D, ids=lambda c: f"{c[0]}x{c[1]}-{_id(c[2])}".replace(" ", ""))
def test_conv_transpose2d(backend, rng, case):
    xs, ws, kw = case
    groups = kw.get("groups", 1)
    lf, tf = _pair("conv_transpose2d", **kw)
    check(lf, tf, [xs, ws, (ws[1] * groups,)], backend=backend, rng=rng, name="conv_transpose2d", tol_scale=5)


@pytest.mark.parametrize("kw", [{}, dict(stride=3, padding=1, output_padding=2), dict(groups=2, dilation=2)],
                         ids=_id)
def test_conv_transpose1d(backend, rng, kw):
    lf, tf = _pair("conv_transpose1d", **kw)
    check(lf, tf, [(2, 4, 7), (4, 3, 3)], backend=backend, rng=rng, name="conv_transpose1d", tol_scale=5)


# =====================================================================================================================
# Pooling
# =====================================================================================================================
MAX_POOL2D = [
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(2, 3), stride=(2, 1), padding=(1, 0), dilation=(2, 1)),
    dict(kernel_size=2, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, return_indices=True),
    dict(kernel_size=(3, 2), stride=2, dilation=2, ceil_mode=True, return_indices=True),
]


@pytest.mark.parametrize("kw", MAX_POOL2D, ids=_id)
def test_max_pool2d(backend, rng, kw):
    lf, tf = _pair("max_pool2d", **kw)
    check(lf, tf, [(2, 3, 9, 8)], backend=backend, rng=rng, name="max_pool2d", domain="distinct")


@pytest.mark.parametrize("kw", [dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2, ceil_mode=True),
                                dict(kernel_size=3, dilation=2, padding=1, return_indices=True)], ids=_id)
def test_max_pool1d(backend, rng, kw):
    lf, tf = _pair("max_pool1d", **kw)
    check(lf, tf, [(2, 3, 11)], backend=backend, rng=rng, name="max_pool1d", domain="distinct")


AVG_POOL2D = [
    dict(kernel_size=3),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    dict(kernel_size=(2, 3), stride=(1, 2), ceil_mode=True),
    dict(kernel_size=2, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=2, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=3, padding=1, divisor_override=5),
]


@pytest.mark.parametrize("kw", AVG_POOL2D, ids=_id)
def test_avg_pool2d(backend, rng, kw):
    lf, tf = _pair("avg_pool2d", **kw)
    check(lf, tf, [(2, 3, 9, 8)], backend=backend, rng=rng, name="avg_pool2d")


@pytest.mark.parametrize("kw", [dict(kernel_size=4, stride=3, padding=2, ceil_mode=True, count_include_pad=False),
                                dict(kernel_size=2)], ids=_id)
def test_avg_pool1d(backend, rng, kw):
    lf, tf = _pair("avg_pool1d", **kw)
    check(lf, tf, [(2, 3, 11)], backend=backend, rng=rng, name="avg_pool1d")


def test_pool_symbolic_and_low_precision(backend, rng):
    lf, tf = _pair("max_pool2d", kernel_size=3, stride=2, padding=1)
    check(lf, tf, [(3, 2, 9, 8)], dims=[("n", 2, 9, 8)], backend=backend, rng=rng, name="max_pool2d n",
          domain="distinct")
    lf, tf = _pair("avg_pool1d", kernel_size=3, stride=2, padding=1, count_include_pad=False)
    check(lf, tf, [(2, 3, 12)], dims=[(2, 3, "t")], backend=backend, rng=rng, name="avg_pool1d t")
    lf, tf = _pair("avg_pool2d", kernel_size=2)
    check(lf, tf, [(1, 2, 6, 4)], dtype="bfloat16", backend=backend, rng=rng, name="avg_pool2d bf16")


@pytest.mark.parametrize("size", [1, (3, 5), (5, None)], ids=str)
@pytest.mark.parametrize("name", ["adaptive_avg_pool2d", "adaptive_max_pool2d"])
def test_adaptive_pool2d(backend, rng, name, size):
    lf, tf = _pair(name, output_size=size)
    check(lf, tf, [(2, 3, 7, 10)], backend=backend, rng=rng, name=name, domain="distinct")


def test_adaptive_pool_more(backend, rng):
    for name in ("adaptive_avg_pool1d", "adaptive_max_pool1d"):
        lf, tf = _pair(name, output_size=4)
        check(lf, tf, [(2, 3, 11)], backend=backend, rng=rng, name=name, domain="distinct")
    lf, tf = _pair("adaptive_max_pool2d", output_size=(3, 4), return_indices=True)
    check(lf, tf, [(2, 3, 7, 10)], backend=backend, rng=rng, name="adaptive_max_pool2d indices", domain="distinct")
    lf, tf = _pair("adaptive_max_pool1d", output_size=3, return_indices=True)
    check(lf, tf, [(3, 8)], backend=backend, rng=rng, name="adaptive_max_pool1d indices", domain="distinct")
    lf, tf = _pair("adaptive_avg_pool2d", output_size=(3, 2))
    check(lf, tf, [(3, 2, 7, 5)], dims=[("n", 2, 7, 5)], backend=backend, rng=rng, name="adaptive_avg_pool2d n")


# =====================================================================================================================
# Interpolation, im2col, pixel shuffle
# =====================================================================================================================
INTERP2D = [
    dict(size=(10, 14)), dict(scale_factor=1.7), dict(scale_factor=(0.5, 3)),
    dict(size=(9, 13), mode="nearest-exact"),
    dict(size=(9, 13), mode="bilinear"), dict(size=(3, 4), mode="bilinear"),
    dict(scale_factor=1.3, mode="bilinear", align_corners=True),
    dict(scale_factor=1.7, mode="bilinear", recompute_scale_factor=True), dict(size=(3, 4), mode="area"),
]


@pytest.mark.parametrize("kw", INTERP2D, ids=_id)
def test_interpolate2d(backend, rng, kw):
    lf, tf = _pair("interpolate", **kw)
    check(lf, tf, [(2, 3, 5, 7)], backend=backend, rng=rng, name="interpolate")


@pytest.mark.parametrize("kw", [dict(size=12, mode="linear"), dict(size=5, mode="linear", align_corners=True),
                                dict(scale_factor=2.5)], ids=_id)
def test_interpolate1d(backend, rng, kw):
    lf, tf = _pair("interpolate", **kw)
    check(lf, tf, [(2, 3, 7)], backend=backend, rng=rng, name="interpolate")


def test_interpolate_symbolic_and_low_precision(backend, rng):
    lf, tf = _pair("interpolate", scale_factor=2, mode="bilinear")
    check(lf, tf, [(3, 2, 4, 5)], dims=[("n", 2, 4, 5)], backend=backend, rng=rng, name="bilinear n")
    lf, tf = _pair("interpolate", scale_factor=2)
    check(lf, tf, [(1, 2, 6)], dims=[(1, 2, "t")], backend=backend, rng=rng, name="nearest t")
    lf, tf = _pair("interpolate", size=(7, 9), mode="bilinear")
    check(lf, tf, [(1, 2, 4, 5)], dtype="float16", backend=backend, rng=rng, name="bilinear f16", tol_scale=2)


@pytest.mark.parametrize("kw", [dict(kernel_size=3), dict(kernel_size=(2, 3), stride=2, padding=1, dilation=(1, 2))],
                         ids=_id)
def test_unfold(backend, rng, kw):
    lf, tf = _pair("unfold", **kw)
    check(lf, tf, [(2, 3, 5, 7)], backend=backend, rng=rng, name="unfold")


@pytest.mark.parametrize("case", [((2, 18, 16), dict(output_size=(5, 7), kernel_size=(2, 3), stride=(1, 2),
                                                     padding=(0, 1))),
                                  ((2, 12, 9), dict(output_size=4, kernel_size=2)),
                                  ((12, 6), dict(output_size=(4, 5), kernel_size=(2, 3), stride=2, dilation=(1, 2),
                                                 padding=1))],
                         ids=lambda c: _id(c[1]))
def test_fold(backend, rng, case):
    shape, kw = case
    lf, tf = _pair("fold", **kw)
    check(lf, tf, [shape], backend=backend, rng=rng, name="fold")


def test_pixel_shuffle(backend, rng):
    lf, tf = _pair("pixel_shuffle", upscale_factor=2)
    check(lf, tf, [(2, 8, 3, 5)], backend=backend, rng=rng, name="pixel_shuffle")
    lf, tf = _pair("pixel_unshuffle", downscale_factor=2)
    check(lf, tf, [(2, 3, 4, 6)], backend=backend, rng=rng, name="pixel_unshuffle")


# =====================================================================================================================
# The CPU lowering: one Contraction, no reference loops
# =====================================================================================================================
def _cpu_graph(xs, ws, **kw):
    cx = lm.Graph()
    x = cx.tensor(xs).set(np.random.default_rng(0).standard_normal(xs).astype(np.float32))
    w = cx.tensor(ws).set(np.random.default_rng(1).standard_normal(ws).astype(np.float32))
    out = (LF.conv2d(x, w, **kw) * 0.5 + 1).output()
    cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
    return cx, out


@pytest.mark.parametrize("kw", [dict(padding=1), dict(stride=2, padding=3), dict(groups=2, dilation=2)], ids=_id)
def test_conv_lowers_to_one_contraction(kw):
    """The sum over (channels, kernel window) becomes one Contraction (a GEMM reading the window view); what is
    left is the padded input copy and the fused element-wise epilogue, no primop reference loop."""
    cx, out = _cpu_graph((2, 4, 12, 11), (6, 2 if kw.get("groups") else 4, 3, 3), **kw)
    stats = cx.stats()
    assert stats.get("Contraction") == 1, stats
    assert set(stats) <= {"Input", "Output", "Contraction", "Fused"}, stats
    cx.execute()
    x, w = (torch.from_numpy(np.random.default_rng(i).standard_normal(s).astype(np.float32))
            for i, s in enumerate([(2, 4, 12, 11), (6, 2 if kw.get("groups") else 4, 3, 3)]))
    compare(out.numpy(), (F.conv2d(x, w, **kw) * 0.5 + 1).numpy(), "float32", "conv2d epilogue", tol_scale=10)


@pytest.mark.parametrize("shape", [(1, 16, 23, 21), (2, 40, 9, 10), (1, 2, 4, 5)], ids=str)
def test_contraction_gemm_and_dot_paths(rng, shape):
    """Products summed over three axes on the CPU backend, against torch: large ones (the packed GEMM, with many
    or few output channels) and a tiny one (a dot product per output); and one through a padded view (element by
    element)."""
    n, c, h, w = shape
    x, k = rng.data(shape), rng.data((24, c, 3, 3))
    for oc in (24, 3):
        got = run(lambda a, b: LF.conv2d(a, b[:oc], padding=1), x, k, backend=_CPU)
        want = F.conv2d(torch.from_numpy(x).float(), torch.from_numpy(k[:oc]).float(), padding=1).numpy()
        compare(got, want, "float32", f"conv2d {shape} x {oc}", rng, tol_scale=10)
    a, b = rng.data((5, 6, 7)), rng.data((5, 8, 9))
    got = run(lambda p, q: (p.pad((1, 1, 1, 1)) * q).sum((-2, -1)), a, b, backend=_CPU)
    compare(got, np.einsum("ijk,ijk->i", np.pad(a, ((0, 0), (1, 1), (1, 1))), b), "float32", "padded", rng)


class _CpuBackend:
    name = "cpu"

    @staticmethod
    def compilers(dtype):
        return [lm.CPUCompiler()]

    @staticmethod
    def skip_reason():
        return None


_CPU = _CpuBackend()


# =====================================================================================================================
# Bad arguments: ValueError at graph-build time, naming the shapes
# =====================================================================================================================
def _build(fn, *shapes):
    cx = lm.Graph()
    return fn(*[cx.tensor(s) for s in shapes])


BAD = [
    ("kernel larger than padded input", lambda x, w: LF.conv2d(x, w), [(1, 3, 4, 4), (2, 3, 5, 3)],
     r"\(1, 3, 4, 4\).*\(2, 3, 5, 3\)"),
    ("groups not dividing channels", lambda x, w: LF.conv2d(x, w, groups=2), [(1, 3, 6, 6), (4, 3, 3, 3)],
     r"groups=2.*\(1, 3, 6, 6\).*\(4, 3, 3, 3\)"),
    ("channel mismatch", lambda x, w: LF.conv2d(x, w), [(1, 3, 6, 6), (4, 2, 3, 3)],
     r"\(1, 3, 6, 6\).*3 channels.*\(4, 2, 3, 3\)"),
    ("grouped channel mismatch", lambda x, w: LF.conv2d(x, w, groups=2), [(1, 4, 6, 6), (4, 1, 3, 3)],
     r"\(1, 4, 6, 6\).*\(4, 1, 3, 3\)"),
    ("stride zero", lambda x, w: LF.conv2d(x, w, stride=0), [(1, 3, 6, 6), (4, 3, 3, 3)], "stride"),
    ("negative stride", lambda x, w: LF.conv1d(x, w, stride=-1), [(1, 3, 6), (4, 3, 3)], "stride"),
    ("wrong input rank", lambda x, w: LF.conv2d(x, w), [(1, 1, 3, 6, 6), (4, 3, 3, 3)], r"\(1, 1, 3, 6, 6\)"),
    ("wrong weight rank", lambda x, w: LF.conv2d(x, w), [(1, 3, 6, 6), (4, 3, 3)], r"\(4, 3, 3\).*\(1, 3, 6, 6\)"),
    ("same with stride", lambda x, w: LF.conv2d(x, w, padding="same", stride=2), [(1, 3, 6, 6), (4, 3, 3, 3)],
     "same"),
    ("bad bias", lambda x, w, b: LF.conv2d(x, w, b), [(1, 3, 6, 6), (4, 3, 3, 3), (3,)], r"\(3,\).*\(4, 3, 3, 3\)"),
    ("transpose channel mismatch", lambda x, w: LF.conv_transpose2d(x, w), [(1, 3, 4, 4), (2, 3, 3, 3)],
     r"\(1, 3, 4, 4\).*\(2, 3, 3, 3\)"),
    ("transpose output_padding", lambda x, w: LF.conv_transpose2d(x, w, stride=2, output_padding=2),
     [(1, 3, 4, 4), (3, 3, 3, 3)], "output_padding"),
    ("pool window larger than input", lambda x: LF.max_pool2d(x, 5), [(1, 2, 3, 3)], r"\(1, 2, 3, 3\)"),
    ("pool padding too large", lambda x: LF.avg_pool2d(x, 2, padding=2), [(1, 2, 6, 6)], "padding"),
    ("pool stride zero", lambda x: LF.max_pool1d(x, 2, stride=0), [(1, 2, 6)], "stride"),
    ("pool wrong rank", lambda x: LF.max_pool2d(x, 2), [(6, 6)], r"\(6, 6\)"),
    ("interpolate both size and scale", lambda x: LF.interpolate(x, size=4, scale_factor=2), [(1, 2, 3)], "one of"),
    ("bilinear on 3-D", lambda x: LF.interpolate(x, size=4, mode="bilinear"), [(1, 2, 3)], r"\(1, 2, 3\)"),
    ("fold block count", lambda x: LF.fold(x, (4, 4), 2), [(1, 8, 5)], r"\(1, 8, 5\)"),
    ("pixel_shuffle channels", lambda x: LF.pixel_shuffle(x, 2), [(1, 6, 2, 2)], r"\(1, 6, 2, 2\)"),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: c[0])
def test_bad_arguments(case):
    _, fn, shapes, pattern = case
    with pytest.raises(ValueError, match=pattern):
        _build(fn, *shapes)


def test_dtype_mismatch():
    cx = lm.Graph()
    with pytest.raises(TypeError, match="float16.*float32|float32.*float16"):
        LF.conv2d(cx.tensor((1, 3, 5, 5), dtype="float16"), cx.tensor((2, 3, 3, 3)))
