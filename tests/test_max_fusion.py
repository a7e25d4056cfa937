"""The binary max lowering (src/core/lower/maximum.cpp): Tensor.maximum is recorded as stack([a, b]).amax(0); the
CPU and CUDA compilers turn that MaxReduce into an element-wise Maximum that fuses with its neighbours (relu after a
convolution's batch norm runs in the batch norm's kernel). Parity with torch's NaN, infinity and signed-zero
semantics on every backend, and the fused structure.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import luminal as lm
import luminal.nn.functional as F
from helpers import FLOATS, as_dtype, check

NAN, INF = float("nan"), float("inf")

# Pairs (x, y) covering torch.maximum's special cases: NaN on either side or both, infinities, signed zeros both
# ways round, ties; the rest of each row is random.
SPECIAL = [(NAN, 1.0), (1.0, NAN), (NAN, NAN), (INF, -INF), (-INF, INF), (-INF, -INF), (-0.0, 0.0), (0.0, -0.0),
           (-0.0, -0.0), (0.5, 0.5), (-0.0, -1.0), (0.0, 1.0)]


def special_pair(rng, shape=(3, 16)):
    x, y = rng.data(shape), rng.data(shape)
    for k, (a, b) in enumerate(SPECIAL):
        x.flat[k], y.flat[k] = a, b
    return x, y


def special_single(rng, shape=(3, 16)):
    x = rng.data(shape)
    for k, v in enumerate([NAN, INF, -INF, -0.0, 0.0, 6.0, -1.0, 1.0, 7.5, -6.0]):
        x.flat[k] = v
    return x


def assert_signs(got, want, what, ties=None):
    """Signed zeros as torch gives them (assert_allclose takes -0.0 == 0.0), except at `ties` (per result, where
    both operands are zeros: torch.maximum's scalar loop then returns the first, its vector loop the second)."""
    for i, (g, w) in enumerate(zip(got, want)):
        w = w.detach().float().numpy()
        g = np.asarray(g, np.float32)
        zero = (w == 0) & ~(ties[i] if ties is not None else np.zeros(w.shape, bool))
        np.testing.assert_array_equal(np.signbit(g[zero]), np.signbit(w[zero]), err_msg=f"{what}: result {i} zeros")


def _run_signs(backend, fn, tfn, arrays, dtype, what, ties=None):
    # The reference executor runs the stack as recorded: its Add turns -0.0 into +0.0 (-0.0 + 0.0), so only the
    # lowered backends give torch's signed zeros.
    got = check(fn, tfn, dtype=dtype, arrays=arrays, backend=backend, name=what)
    got = got if isinstance(got, list) else [got]
    if backend.name != "reference":
        want = tfn(*[torch.from_numpy(np.array(as_dtype(a, dtype))).to(getattr(torch, dtype)) for a in arrays])
        assert_signs(got, want if isinstance(want, list) else [want], what, ties)


@pytest.mark.parametrize("dtype", FLOATS)
def test_maximum_minimum_specials(backend, rng, dtype):
    x, y = special_pair(rng)
    tie = (x == 0) & (y == 0)  # the activations' test below pins x on ties (clamp keeps the input's zero)
    _run_signs(backend, lambda a, b: [a.maximum(b), a.minimum(b), b.maximum(a), lm.functional.maximum(a.T, b.T)],
               lambda a, b: [torch.maximum(a, b), torch.minimum(a, b), torch.maximum(b, a), torch.maximum(a.T, b.T)],
               [x, y], dtype, "maximum/minimum specials", ties=[tie, tie, tie, tie.T])


@pytest.mark.parametrize("dtype", FLOATS)
def test_activations_specials(backend, rng, dtype):
    x = special_single(rng)
    _run_signs(backend,
               lambda t: [t.relu(), t.clamp(-0.5, 0.7), t.clamp(min=0.0), t.clamp(max=-0.0), F.hardtanh(t),
                          F.hardtanh(t, -0.0, 2.0), F.relu6(t), t.clamp_min(-INF), t.clamp_max(INF)],
               lambda t: [t.relu(), t.clamp(-0.5, 0.7), t.clamp(min=0.0), t.clamp(max=-0.0), TF.hardtanh(t),
                          TF.hardtanh(t, -0.0, 2.0), TF.relu6(t), t.clamp_min(-INF), t.clamp_max(INF)],
               [x], dtype, "activations specials")


@pytest.mark.parametrize("dtype", FLOATS)
def test_maximum_broadcast_and_chain(backend, rng, dtype):
    # Broadcast operands (stride-0 views), a tensor bound, and a chain of maxima around other element-wise ops:
    # everything lands in one kernel, each step rounded to the dtype as the unfused ops are.
    x, y, lo = rng.data((4, 6)), rng.data((1, 6)), rng.data((4, 1), "small") - 1

    def fn(a, b, c):
        if isinstance(a, torch.Tensor):
            return [torch.maximum(a, b) * 3 + torch.minimum(a.exp(), b).relu(), a.clamp(min=c), torch.maximum(a, c).T]
        return [a.maximum(b) * 3 + a.exp().minimum(b).relu(), a.clamp(min=c), a.maximum(c).T]

    check(fn, fn, dtype=dtype, arrays=[x, y, lo], backend=backend, rng=rng, name="maximum chain")


def test_maximum_int32(backend, rng):
    x, y = rng.integers(-5, 6, (3, 7)), rng.integers(-5, 6, (3, 7))
    check(lambda a, b: [a.maximum(b), a.minimum(b), a.relu(), a.clamp(-2, 3)],
          lambda a, b: [torch.maximum(a, b), torch.minimum(a, b), a.relu(), a.clamp(-2, 3)],
          dtype="int32", arrays=[x, y], backend=backend, rng=rng, name="maximum int32")


def test_real_reductions_untouched(backend, rng):
    # MaxReduce over a length-2 axis that is not a stack of two, over a stack of three, and along another axis:
    # plain reductions, computed as such.
    x, y, z = rng.data((2, 5), "distinct"), rng.data((2, 5), "distinct"), rng.data((2, 5), "distinct")

    def fn(a, b, c):
        st = torch.stack if isinstance(a, torch.Tensor) else lm.functional.stack
        cat = torch.cat if isinstance(a, torch.Tensor) else lm.functional.cat
        return [a.amax(0), st([a, b, c]).amax(0), st([a, b], 2).amax(2), cat([a, b], 1).amax(1),
                (st([a, b]) + 1).amax(0)]

    check(fn, fn, arrays=[x, y, z], backend=backend, rng=rng, name="real max reductions")


def _compiled(fn, arrays, compilers):
    cx = lm.Graph()
    out = fn(*[cx.tensor(a.shape).set(a) for a in arrays]).output()
    cx.compile(lm.GenericCompiler(), *compilers)
    return cx, out


@pytest.mark.parametrize("target", ["cpu", "cuda-nvrtc"])
def test_relu_lowered(target):
    compilers = [lm.CPUCompiler()] if target == "cpu" else [lm.CudaCompiler("float32", device=None)]
    x = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)
    cx, _ = _compiled(lambda a, b: (a * b).relu().clamp(max=1.5) + a.maximum(b), list(x), compilers)
    stats = cx.stats()
    assert "MaxReduce" not in stats and "Maximum" not in stats, stats
    assert stats.get("Fused") == 1, stats


def test_conv_bn_relu_one_kernel():
    # conv -> batch norm -> relu: the Contraction, then one Fused kernel (bias, normalisation and relu) that the
    # output reads; the running variance's rsqrt is a separate small per-channel kernel.
    def fn(x, w, b, mean, var, gamma, beta):
        return F.batch_norm(F.conv2d(x, w, b, padding=1), mean, var, gamma, beta, False, 0.1, 1e-5).relu()

    r = np.random.default_rng(0)
    arrays = [r.standard_normal(s).astype(np.float32) for s in [(1, 3, 6, 6), (4, 3, 3, 3), (4,), (4,)]]
    arrays += [r.uniform(0.5, 2, 4).astype(np.float32)] + [r.standard_normal(4).astype(np.float32) for _ in "gb"]
    cx, out = _compiled(fn, arrays, [lm.CPUCompiler()])
    g = cx._g
    assert "MaxReduce" not in cx.stats(), cx.stats()
    (res,) = [g.node(i).inputs[0].node for i in g.topo_order() if g.node(i).op == "Output"]
    assert g.node(res).name == "Fused"
    assert "Contraction" in [g.node(e.node).name for e in g.node(res).inputs]
    cx.execute()
    x, w, b, mean, var, gamma, beta = map(torch.from_numpy, arrays)
    ref = TF.batch_norm(TF.conv2d(x, w, b, padding=1), mean, var, gamma, beta, False, 0.1, 1e-5)
    assert (ref < 0).any() and (ref > 0).any()  # the relu has work to do
    np.testing.assert_allclose(out.numpy(), ref.relu().numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("layout", ["plain", "permute", "flip", "slice", "broadcast"])
def test_fused_rows_through_views(backend, rng, layout):
    # The CPU kernel loads many short rows per chunk (elementwise.cpp load_rows): consecutive rows in one copy,
    # others by stepping through the outer indices; every kind of view, rows of 3 to 5.
    x, s = rng.data((2, 6, 4, 5)), rng.data((6,))

    def fn(a, c):
        if layout == "permute":
            a = a.permute(0, 2, 3, 1)[..., :3]
        elif layout == "flip":
            a = a.flip(1).flip(3)
        elif layout == "slice":
            a = a[:, 1::2, 1::2, 1:]
        elif layout == "broadcast":
            a = a[:, :, :1, :].expand(2, 6, 4, 5)
        c = c.reshape(-1, 1, 1)[: a.shape[1]] if layout != "permute" else c[:3]
        return (a * c + 1).relu()

    check(fn, fn, arrays=[x, s], backend=backend, rng=rng, name=f"fused rows ({layout})")


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32"])
def test_unfused_maximum_runs(rng, dtype):
    # The lowering alone (no ElementwiseFusion, as luminal.bisect steps through passes): the CPU executor runs the
    # Maximum node itself.
    from luminal.compiler import MaximumLowering

    if dtype == "int32":
        x, y = rng.integers(-5, 6, (3, 7)), rng.integers(-5, 6, (3, 7))
    else:
        x, y = special_pair(rng, (3, 7))
    x, y = as_dtype(x, dtype), as_dtype(y, dtype)
    cx = lm.Graph()
    a, b = cx.tensor(x.shape, dtype=dtype).set(x), cx.tensor(y.shape, dtype=dtype).set(y)
    outs = [a.maximum(b).output(), a.minimum(b).output(), a.relu().output()]
    cx.compile(lm.GenericCompiler(), MaximumLowering())
    assert cx.stats().get("Maximum") == 3 and "MaxReduce" not in cx.stats(), cx.stats()
    cx.execute()
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    for o, w in zip(outs, [torch.maximum(tx, ty), torch.minimum(tx, ty), tx.relu()]):
        np.testing.assert_array_equal(o.numpy(), w.numpy())
