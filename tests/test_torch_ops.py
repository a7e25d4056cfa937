"""PyTorch parity of the torch op surface: torch-named arithmetic, more math, logic, norms, linear algebra and
einsum, scans and movement, activations, pad modes, ranges and losses (tensor.py, functional.py, losses.py).

Each test puts many ops into one graph (one compile per backend) to stay fast; see helpers.check.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import luminal as lm
import luminal.nn.functional as LF
from helpers import FLOATS, check

NAN, INF = float("nan"), float("inf")


def is_torch(t) -> bool:
    return isinstance(t, torch.Tensor)


def frac_data(rng, shape, scale=1.0):
    """Values (k + f) * scale with f in [0.1, 0.9]: away from the integer steps of trunc, floor and friends."""
    k = rng.gen.integers(-4, 5, size=shape)
    return (k + rng.gen.uniform(0.1, 0.9, size=shape)) * scale


# =====================================================================================================================
# Arithmetic with torch's names and dtypes
# =====================================================================================================================
def test_arithmetic_torch_names(backend, rng):
    a, b = frac_data(rng, (3, 4), 1.5), rng.data((4,), "signed")
    b = np.where(np.abs(b) < 0.3, 0.75, b)  # divisors away from 0: a / b stays moderate

    def f(x, y):
        return [x.add(y, alpha=2.5), x.sub(y, alpha=-0.5), x.subtract(y), x.rsub(y, alpha=2), x.mul(y),
                x.multiply(3), x.div(y), x.divide(y, rounding_mode="trunc"), x.div(y, rounding_mode="floor"),
                x.true_divide(y), x.floor_divide(y), x.neg(), x.negative(), x.clone() * 1, x.rsub(1.5)]

    def tf(x, y):
        return [x.add(y, alpha=2.5), x.sub(y, alpha=-0.5), x.subtract(y), torch.rsub(x, y, alpha=2), x.mul(y),
                x.multiply(3), x.div(y), x.divide(y, rounding_mode="trunc"), x.div(y, rounding_mode="floor"),
                x.true_divide(y), x.floor_divide(y), x.neg(), x.negative(), x.clone() * 1, torch.rsub(x, 1.5)]

    check(f, tf, arrays=[a, b], backend=backend, rng=rng, name="torch-named arithmetic")


def test_integer_division_and_dtypes(backend, rng):
    """Ints: true division gives float32, trunc/floor division stay int (exact, negative operands included);
    comparisons give bool."""
    a = rng.integers(-40, 41, (4, 6))
    b = rng.data((4, 6), "int").astype(np.int32)
    a[0, :3], b[0, :3] = [9, -9, 7], [3, 3, -2]  # exact multiples and a negative quotient

    def f(x, y):
        return [x / y, x.div(y), x.true_divide(y), x.div(y, rounding_mode="trunc"), x.div(y, rounding_mode="floor"),
                x // y, x.floor_divide(y), x.gt(y), x.le(y), x.neg(), x.add(y, alpha=3), x.atan(), x.log1p().isnan()]

    check(f, None, arrays=[a, b], backend=backend, rng=rng, name="int division")


# =====================================================================================================================
# More unary math
# =====================================================================================================================
def _math(x, u, p):
    """x: signed data, u: inside (-1, 1), p: positive."""
    at2 = lm.atan2 if not is_torch(x) else torch.atan2
    return [at2(x, p.flip(0) - 1.5), at2(x, x.flip(1)), (x * 4).atan(), u.asin(), u.acos(), u.tan(), x.sinh(),
            x.cosh(), (x * 3).asinh(), (p + 1).acosh(), u.atanh(), x.log1p(),
            (p - 0.1).log1p(), x.expm1(), (x * 1e-3).expm1(), p.log10(), (x * 2).trunc(), (x * 2).frac(), x.fix(),
            (u.abs() * 0.9 + 0.05).logit(), x.square(), x.arctan2(p)]


def _math_low(x, u, p):
    """A subset for 16-bit inputs (these compute in float32 and round once)."""
    return [(lm.atan2 if not is_torch(x) else torch.atan2)(x, p), u.asin(), x.cosh(), u.atanh(), x.log1p(),
            x.expm1(), (x * 2).trunc(), p.log10()]


@pytest.mark.parametrize("dtype", FLOATS)
def test_unary_math(backend, rng, dtype):
    x = frac_data(rng, (3, 5), 0.5)  # 2x is (integer + [0.1, 0.9]): away from the steps of trunc
    u, p = rng.data((3, 5), "unit"), rng.data((3, 5), "pos")
    check(_math if dtype == "float32" else _math_low, None, dtype=dtype, arrays=[x, u, p], backend=backend, rng=rng,
          name="unary math", tol_scale=1 if dtype == "float32" else 2)


def test_log1p_expm1_near_zero(backend, rng):
    """Relative accuracy near 0, where log(1 + x) and exp(x) - 1 would cancel."""
    x = rng.data((64,), "signed") * 10.0 ** rng.gen.integers(-7, 0, size=64)
    got = check(lambda t: [t.log1p(), t.expm1(), t.asinh()], None, arrays=[x],
                backend=backend, rng=rng, name="near zero", atol=0, rtol=2e-6)
    assert all(np.all(g != 0) for g in got)


def test_atan2_quadrants_and_edges(backend, rng):
    y = np.array([1.0, 1.0, -1.0, -1.0, 0.0, 2.0, -2.0, 0.0, 3.0, INF, -5.0, 1e-30, NAN])
    x = np.array([1.0, -1.0, 1.0, -1.0, 1.0, 0.0, 0.0, -1.0, 1e-30, 1.0, INF, -1.0, 1.0])
    check(lambda a, b: [a.atan2(b), a.atan(), b.atan()],
          lambda a, b: [torch.atan2(a, b), a.atan(), b.atan()], arrays=[y, x], backend=backend, rng=rng,
          name="atan2 edges")


@pytest.mark.parametrize("dtype", FLOATS)
def test_nonfinite(backend, rng, dtype):
    a = np.array([NAN, INF, -INF, 1.5, -2.0, 0.0, 1e3, -0.25])
    if dtype == "float32":
        f = lambda t: [t.isinf(), t.isposinf(), t.isneginf(), t.isfinite(), t.isnan(), t.nan_to_num(),  # noqa: E731
                       t.nan_to_num(1.0, 2.0, -3.0), t.log1p(), t.expm1(), t.trunc(), t.atan(),
                       t.heaviside(t.flip(0)), t.floor(), t.frac()]
    else:  # the default replacements are the dtype's own extremes
        f = lambda t: [t.isinf(), t.isfinite(), t.nan_to_num(), t.nan_to_num(neginf=-1.0), t.trunc()]  # noqa: E731
    check(f, None, dtype=dtype, arrays=[a], backend=backend, rng=rng, name="non-finite")


def test_nonfinite_ints(backend, rng):
    a = rng.integers(-5, 6, (2, 5))
    check(lambda t: [t.isinf(), t.isfinite(), t.isnan(), t.nan_to_num(), t.trunc(), t.floor()], None, arrays=[a],
          backend=backend, rng=rng, name="int non-finite")


# =====================================================================================================================
# Logic, any/all, max/min with indices, norms
# =====================================================================================================================
def test_logical_any_all(backend, rng):
    a = rng.data((3, 4, 5)) * rng.bools((3, 4, 5))  # zeros in places
    a[0, 0, 0], a[1, 1, 1] = 0.3, NAN  # a fraction and a NaN are true
    b = rng.bools((4, 5))

    def f(x, m):
        lnot = x.logical_not() if not is_torch(x) else torch.logical_not(x)
        return [x.logical_and(m), x.logical_or(m), x.logical_xor(m), lnot, m.logical_xor(x.gt(0)), x.any(),
                x.all(), x.any(1), x.all(-1, keepdim=True), m.all(), (x > -5).all((0, 2)),
                m.to(torch.int32 if is_torch(x) else lm.int32).any(1)]

    check(f, None, arrays=[a, b], backend=backend, rng=rng, name="logic")


@pytest.mark.parametrize("dtype", ["float32"])
def test_max_min_with_indices(backend, rng, dtype):
    data = rng.data((3, 5, 4), "distinct")
    other = rng.data((5, 4), "distinct")

    def f(x, y):
        mx, mn = x.max(1), x.min(-1, keepdim=True)
        fmax = lm.max if not is_torch(x) else torch.max
        fmin = lm.min if not is_torch(x) else torch.min
        v, i = fmax(x, 0)
        return [mx.values, mx.indices, mn[0], mn[1], x.max(), x.min(), v, i, fmax(x, y), fmin(x, y), x.max(y),
                fmin(x, 2, keepdim=True).indices]

    check(f, None, dtype=dtype, arrays=[data, other], backend=backend, rng=rng, name="max/min")


def test_max_min_result_types():
    cx = lm.Graph()
    x = cx.tensor((3, 4))
    r = x.max(1)
    assert isinstance(r, tuple) and r._fields == ("values", "indices")
    assert r.values.dtype is lm.float32 and r.indices.dtype is lm.int32 and r.values.shape == (3,)
    assert isinstance(x.max(), lm.Tensor) and x.min(0, keepdim=True).values.shape == (1, 4)
    with pytest.raises(TypeError, match="amax"):
        x.max((0, 1))


NORMS = [("fro", None, False), (2, 1, False), (1, 0, True), (INF, -1, False), (-INF, 1, True), (0, None, False),
         (3, (0, 2), False), (0.5, 2, True), ("fro", (1, 2), False)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_norm(backend, rng, dtype):
    data = rng.data((2, 3, 4)) * rng.bools((2, 3, 4))  # zeros for p = 0
    norms = NORMS if dtype == "float32" else NORMS[:4]
    check(lambda t: [t.norm(p, d, k) for p, d, k in norms], None,
          dtype=dtype, arrays=[data], backend=backend, rng=rng, name="norm", tol_scale=1 if dtype == "float32" else 2)


# =====================================================================================================================
# Linear algebra and einsum
# =====================================================================================================================
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_linear_algebra(backend, rng, dtype):
    shapes = [(3, 4), (4, 5), (2, 3, 4), (2, 4, 5), (4,), (5,), (3, 5), (2, 3, 5), (5,)]

    def f(a, b, ba, bb, v, w, c, bc, r):
        lmod = torch if is_torch(a) else lm
        return [a.mm(b), ba.bmm(bb), a.mv(v), v.dot(v.flip(0)), v.outer(w), lmod.outer(w, v),
                c.addmm(a, b, beta=0.5, alpha=2.0), r.addmm(a, b), lmod.addmm(c, a, b, beta=0), bc.baddbmm(ba, bb),
                r.baddbmm(ba, bb, beta=-1.0, alpha=0.5), v[:3].addmv(a, v, alpha=3),
                c.addbmm(ba, bb, beta=2), lmod.bmm(ba, bb), lmod.mm(a, b), lmod.dot(w, w), lmod.mv(b.T, v)]

    check(f, None, dtype=dtype, shapes=shapes, backend=backend, rng=rng, name="linear algebra",
          tol_scale=1 if dtype == "float32" else 2)


EINSUMS = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,kj->ik", [(3, 4), (5, 4)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("ij,jk", [(3, 4), (4, 2)]),  # implicit output
    ("ba,ab", [(3, 4), (4, 3)]),  # implicit: nothing left, a full contraction
    ("i,j->ij", [(3,), (4,)]),
    ("i,i->", [(5,), (5,)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),  # trace
    ("iji->j", [(3, 2, 3)]),
    ("ijk->kji", [(2, 3, 4)]),
    ("ijk->j", [(2, 3, 4)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),  # broadcast batch dims
    ("...ij,jk->ik", [(2, 3, 4), (4, 5)]),  # the ellipsis summed away
    ("b...,b->...", [(3, 2, 4), (3,)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("abc,cd,bd->ad", [(2, 3, 4), (4, 5), (3, 5)]),  # two labels summed in one contraction
    ("ijk,jkl->il", [(2, 3, 4), (3, 4, 5)]),
    ("ij,ij->ij", [(2, 3), (1, 3)]),  # size-1 broadcast of a label
    ("ij,jk->ik", [(2, 1), (3, 4)]),  # a summed label of size 1 against 3
    (" i j , j k -> i k ", [(3, 4), (4, 2)]),
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_einsum(backend, rng, dtype):
    eqs = EINSUMS if dtype == "float32" else EINSUMS[:4] + EINSUMS[13:14] + EINSUMS[16:18]
    shapes, spans = [], []
    for _, ss in eqs:
        spans.append((len(shapes), len(shapes) + len(ss)))
        shapes += ss

    def f(*ts):
        es = lm.einsum if not is_torch(ts[0]) else torch.einsum
        return [es(eq, *ts[a:b]) for (eq, _), (a, b) in zip(eqs, spans)]

    check(f, None, dtype=dtype, shapes=shapes, backend=backend, rng=rng, name="einsum",
          tol_scale=1 if dtype == "float32" else 2)


def test_einsum_list_operands_and_int(backend, rng):
    a, b = rng.integers(-5, 6, (3, 4)), rng.integers(-5, 6, (4, 2))
    check(lambda x, y: [lm.einsum("ij,jk->ik", [x, y]), lm.einsum("ij->", x)] if not is_torch(x) else
          [torch.einsum("ij,jk->ik", [x, y]), torch.einsum("ij->", x)],
          None, arrays=[a, b], backend=backend, rng=rng, name="einsum ints")


def test_einsum_compiles_to_matmul():
    """Each contraction is a broadcast Mul summed over its last axis, which the CPU lowering makes a MatMul."""
    cx = lm.Graph()
    a, b, c = cx.tensor((2, 3, 4)), cx.tensor((2, 4, 5)), cx.tensor((5, 6))
    lm.einsum("bij,bjk,kl->bil", a, b, c).output()
    lm.einsum("abc,cd,bd->ad", a, c[:4, :5], cx.tensor((3, 5))).output()
    cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
    assert cx.stats().get("MatMul", 0) >= 4, cx.stats()


# =====================================================================================================================
# Scans, movement, selection helpers
# =====================================================================================================================
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_scans_and_movement(backend, rng, dtype):
    data = rng.data((3, 4, 5), "small")
    data[1, 2, 1] = 0.0  # a zero: every later product along dim 2 is 0
    w = rng.data((4, 5), "unit")

    def f(x, y):
        t = is_torch(x)
        return [x.cumprod(2), x.cumprod(0), x.roll(2, 1), x.roll((1, -2), (0, 2)), x.roll(-7), x.tile((2, 1)),
                x.tile((2, 1, 1, 2)), x.movedim(0, -1), x.movedim((0, 1), (2, 0)), x.moveaxis(1, 0),
                x.swapaxes(0, 2), x.swapdims(-1, 1), x.narrow(1, 1, 2), x.narrow(-1, -3, 2), *x.unbind(1),
                x.repeat_interleave(2, dim=1), x.repeat_interleave(2),
                x.repeat_interleave([2, 0, 1, 3] if not t else torch.tensor([2, 0, 1, 3]), dim=1),
                x.clamp_min(-0.3), x.clamp_max(y), x.lerp(y, 0.3), x.lerp(y, y.abs()),
                (lm if not t else torch).lerp(y, x, 0.75), x.heaviside(y)]

    def f16(x, y):  # 16-bit: the ops that compute (the rest are views, the same in every dtype)
        rep = [2, 0, 1, 3] if not is_torch(x) else torch.tensor([2, 0, 1, 3])
        return [x.cumprod(2), x.roll(2, 1), x.repeat_interleave(rep, dim=1), x.clamp_max(y), x.lerp(y, y.abs()),
                x.heaviside(y)]

    check(f if dtype == "float32" else f16, None, dtype=dtype, arrays=[data, w], backend=backend, rng=rng,
          name="scans and movement", tol_scale=1 if dtype == "float32" else 3)


def test_int_scans_one_hot_where(backend, rng):
    a = rng.data((3, 4), "int").astype(np.int32) % 4 + 1
    cls = rng.integers(0, 5, (2, 3))
    c = rng.bools((3, 4))

    def f(x, k, m):
        if is_torch(x):
            return [x.cumprod(1), F.one_hot(k.long(), 5), torch.where(m, 1.5, -2.0), torch.where(m, 2, 3),
                    torch.where(m, x, 7), torch.where(m, 0.5, x), x.repeat_interleave(torch.tensor([1, 2, 0]), dim=0),
                    x.roll(1, 0), (x > 2).cumprod(1)]
        return [x.cumprod(1), lm.one_hot(k, 5), lm.where(m, 1.5, -2.0), lm.where(m, 2, 3), lm.where(m, x, 7),
                lm.where(m, 0.5, x), x.repeat_interleave([1, 2, 0], dim=0), x.roll(1, 0), (x > 2).cumprod(1)]

    got = check(f, None, arrays=[a, cls, c], backend=backend, rng=rng, name="ints, one_hot, where")
    assert got[1].dtype == np.int32 and LF.one_hot is lm.one_hot


def test_symbolic_dims(backend, rng):
    """A symbolic dim: roll and narrow by Exprs, linear algebra, einsum, reflect padding and a loss over it."""
    x, y = rng.data((6, 4)), rng.data((4, 3))
    check(lambda a, b: [a.roll(2, 0), lm.einsum("si,ij->sj", a, b), a.mm(b), a.norm(dim=0), a.cumprod(0),
                        LF.pad(a, (2, 1, 0, 0), mode="reflect"), LF.mse_loss(a, a.flip(0))]
          if not is_torch(a) else
          [a.roll(2, 0), torch.einsum("si,ij->sj", a, b), a.mm(b), a.norm(dim=0), a.cumprod(0),
           F.pad(a[None], (2, 1, 0, 0), mode="reflect")[0], F.mse_loss(a, a.flip(0))],
          None, arrays=[x, y], dims=[("s", 4), None], backend=backend, rng=rng, name="symbolic")


# =====================================================================================================================
# Activations (F.* names)
# =====================================================================================================================
ACTS = [
    ("mish", (), {}), ("hardswish", (), {}), ("hardsigmoid", (), {}), ("hardtanh", (-0.5, 1.25), {}),
    ("relu6", (), {}), ("elu", (), {"alpha": 0.7}), ("selu", (), {}), ("celu", (), {"alpha": 1.5}),
    ("silu", (), {}), ("gelu", (), {}), ("gelu", (), {"approximate": "tanh"}), ("glu", (), {"dim": 1}),
    ("softmin", (), {"dim": -1}), ("softsign", (), {}), ("tanhshrink", (), {}), ("logsigmoid", (), {}),
    ("threshold", (0.3, -1.5), {}), ("softshrink", (0.4,), {}), ("hardshrink", (), {"lambd": 0.6}),
    ("leaky_relu", (0.2,), {}), ("relu", (), {}), ("sigmoid", (), {}), ("tanh", (), {}), ("softplus", (), {}),
    ("rrelu", (0.1, 0.3), {}),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_activations(backend, rng, dtype):
    x = rng.data((4, 6)) * 3  # over the kinks at +-3 of the hard ones
    wt = rng.data((6,), "pos") * 0.3

    acts = ACTS if dtype == "float32" else ACTS[:8]

    def f(t, w):
        mod = F if is_torch(t) else LF
        # inplace=True is accepted (and changes nothing here); torch's gets a copy to write into.
        return [getattr(mod, n)(t, *a, **k) for n, a, k in acts] + [mod.prelu(t, w), mod.prelu(t, w[:1]),
                                                                    mod.relu(t * 1, inplace=True),
                                                                    mod.elu(t * 1, 0.5, inplace=True)]

    check(f, None, dtype=dtype, arrays=[x, wt], backend=backend, rng=rng, name="activations",
          tol_scale=1 if dtype == "float32" else 2)


# =====================================================================================================================
# Pad modes and ranges
# =====================================================================================================================
PAD_MODES = [
    ("reflect", (2, 1)), ("reflect", (1, 3, 2, 0)), ("reflect", (-1, 2)), ("reflect", (0, 0, 1, 1)),
    ("replicate", (3, 1)), ("replicate", (1, 0, 2, 3)), ("replicate", (2, -1, 0, 1)),
    ("circular", (2, 4)), ("circular", (1, 2, 3, 1)), ("circular", (-1, 2, 1, -1)),
    ("constant", (1, 2, 0, 1)),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pad_modes(backend, rng, dtype):
    data = rng.data((2, 3, 4))

    def f(t):
        if is_torch(t):
            return [F.pad(t, p, mode=m) for m, p in PAD_MODES] + [F.pad(t[None], (1, 1, 1, 1, 1, 1), "replicate")[0],
                                                                  F.pad(t, (1, 1), value=-2.0)]
        return [LF.pad(t, p, mode=m) for m, p in PAD_MODES] + [LF.pad(t, (1, 1, 1, 1, 1, 1), "replicate"),
                                                              LF.pad(t, (1, 1), value=-2.0)]

    check(f, None, dtype=dtype, arrays=[data], backend=backend, rng=rng, name="pad modes")


def test_ranges(backend, rng):
    x = rng.data((1,))

    def f(t):
        if is_torch(t):
            return [torch.linspace(-1.5, 2.25, 7), torch.linspace(3.0, -1.0, 10), torch.linspace(0.5, 0.5, 1),
                    torch.logspace(-2.0, 1.5, 6), torch.logspace(0.0, 3.0, 4, base=2.0), torch.arange(0.5, 2.0, 0.25),
                    torch.linspace(0, 10, 6, dtype=torch.int32) + t.int()]
        g = t.graph
        return [lm.linspace(-1.5, 2.25, 7, graph=g), lm.linspace(3.0, -1.0, 10, graph=g),
                lm.linspace(0.5, 0.5, 1, graph=g), lm.logspace(-2.0, 1.5, 6, graph=g),
                lm.logspace(0.0, 3.0, 4, base=2.0, graph=g), lm.arange(0.5, 2.0, 0.25, graph=g),
                lm.linspace(0, 10, 6, dtype=lm.int32, graph=g) + t.int()]

    check(f, None, arrays=[x], backend=backend, rng=rng, name="ranges")


# =====================================================================================================================
# Losses
# =====================================================================================================================
def _losses(x, t, w, p, q, x4, t4, y):
    """x (N, C) logits, t (N,) classes with one ignored, w (C,) weights, p/q (N, C) probabilities, x4/t4 a 4-D
    input and its targets, y (N, C) signed data."""
    mod = F if is_torch(x) else LF
    if is_torch(x):
        t, t4 = t.long(), t4.long()
    out = []
    for red in ("mean", "none"):
        out += [mod.cross_entropy(x, t, reduction=red), mod.cross_entropy(x, t, w, reduction=red, label_smoothing=0.1),
                mod.cross_entropy(x4, t4, w, reduction=red), mod.cross_entropy(x, p, reduction=red),
                mod.cross_entropy(x, p, w, reduction=red, label_smoothing=0.2),
                mod.nll_loss(x.log_softmax(1), t, w, reduction=red), mod.kl_div(x.log_softmax(1), p, reduction=red)]
    out += [mod.cross_entropy(x, t, w, reduction="sum", label_smoothing=0.1), mod.nll_loss(x, t, reduction="sum"),
            mod.kl_div(x.log_softmax(1), p, reduction="sum")]
    for red in ("mean", "none"):  # 'sum' is the same reduction as 'mean' for these, without the division
        out += [mod.mse_loss(x, y, reduction=red), mod.l1_loss(x, y, reduction=red),
                mod.smooth_l1_loss(x, y, reduction=red, beta=0.5), mod.huber_loss(x, y, reduction=red, delta=0.8),
                mod.binary_cross_entropy(p, q, reduction=red), mod.binary_cross_entropy(p, q, w, reduction=red),
                mod.binary_cross_entropy_with_logits(y, q, reduction=red),
                mod.binary_cross_entropy_with_logits(y, q, w, reduction=red, pos_weight=w * 2),
                mod.kl_div(x.log_softmax(1), q.log(), reduction=red, log_target=True)]
    out += [mod.l1_loss(x, y, reduction="sum")]
    out += [mod.kl_div(x.log_softmax(1), p, reduction="batchmean"), mod.cross_entropy(x[0], t[1]),
            mod.cross_entropy(x[:3], t[:3], ignore_index=2),
            mod.cosine_similarity(x, y), mod.cosine_similarity(x, y[:1], dim=0), mod.normalize(x),
            mod.normalize(y, p=1.0, dim=0), mod.pairwise_distance(x, y), mod.pairwise_distance(p, q, p=3, keepdim=True)]
    return out


def _losses_low(x, t, w, p, q, x4, t4, y):
    """A subset for float16."""
    mod = F if is_torch(x) else LF
    t = t.long() if is_torch(x) else t
    return [mod.cross_entropy(x, t), mod.cross_entropy(x, p, w, label_smoothing=0.2, reduction="sum"),
            mod.binary_cross_entropy_with_logits(y, q, reduction="none"), mod.kl_div(x.log_softmax(1), p),
            mod.cosine_similarity(x, y), mod.smooth_l1_loss(x, y)]


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides")  # kl_div's 'mean' is tested as torch defines it
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_losses(backend, rng, dtype):
    n, c = 6, 4
    x, y = rng.data((n, c)), rng.data((n, c))
    t = rng.integers(0, c, (n,))
    t[0], t[3] = 2, -100  # t[0] is the ignore_index of one call below; -100 is ignored by default
    p = rng.gen.dirichlet(np.ones(c), size=n)
    q = rng.gen.uniform(0.05, 0.95, (n, c))
    x4, t4 = rng.data((2, c, 3, 2)), rng.integers(0, c, (2, 3, 2))
    w = rng.data((c,), "pos")
    check(_losses if dtype == "float32" else _losses_low, None, dtype=dtype, arrays=[x, t, w, p, q, x4, t4, y],
          backend=backend, rng=rng, name="losses", tol_scale=1 if dtype == "float32" else 2)


# =====================================================================================================================
# Errors at graph-build time
# =====================================================================================================================
def _raises(fn, exc, *words):
    with pytest.raises(exc) as e:
        fn()
    for w in words:
        assert w in str(e.value), f"{w!r} not in {str(e.value)!r}"


def test_errors():
    cx = lm.Graph()
    a, b, v = cx.tensor((2, 3)), cx.tensor((4, 5)), cx.tensor((3,))
    _raises(lambda: lm.einsum("ij,jk->ik", a, b), ValueError, "'j'", "(2, 3)", "(4, 5)")
    _raises(lambda: lm.einsum("ijk,jk->i", a, b), ValueError, "ijk", "(2, 3)")
    _raises(lambda: lm.einsum("ij->ik", a), ValueError, "'k'")
    _raises(lambda: lm.einsum("ij,jk->ik", a), ValueError, "2 operands")
    _raises(lambda: lm.einsum("i1->i", v), ValueError, "not a letter")
    _raises(lambda: LF.pad(a, (3, 0), mode="reflect"), ValueError, "reflect", "(3, 0)", "size 3", "(2, 3)")
    _raises(lambda: LF.pad(a, (1, 4), mode="circular"), ValueError, "circular", "(2, 3)")
    _raises(lambda: LF.pad(a, (1, 1), mode="wrap"), ValueError, "mode")
    _raises(lambda: LF.pad(a, (1, 1), mode="reflect", value=2.0), ValueError, "value")
    _raises(lambda: a.mm(b), ValueError, "(2, 3)", "(4, 5)")
    _raises(lambda: a.bmm(b), ValueError, "3-D", "(2, 3)", "(4, 5)")
    _raises(lambda: v.dot(cx.tensor((4,))), ValueError, "(3,)", "(4,)")
    _raises(lambda: a.outer(v), ValueError, "(2, 3)")
    _raises(lambda: cx.tensor((3, 2)).addmm(a, cx.tensor((3, 2))), ValueError, "(3, 2)", "(2, 2)")
    _raises(lambda: a.div(v, rounding_mode="round"), ValueError, "rounding_mode")
    _raises(lambda: a.glu(), ValueError, "glu", "(2, 3)")
    _raises(lambda: a.narrow(1, 2, 2), IndexError, "(2, 3)")
    _raises(lambda: a.repeat_interleave([1, 2], dim=1), ValueError, "(2, 3)")
    _raises(lambda: a.repeat_interleave(v), TypeError, "repeats")
    _raises(lambda: a.movedim((0, 1), 0), ValueError, "movedim")
    _raises(lambda: a.roll((1, 2), 0), ValueError, "roll")
    _raises(lambda: a.norm("nuc"), ValueError, "nuc")
    idx = cx.tensor((2,), lm.int32)
    _raises(lambda: lm.one_hot(idx), ValueError, "num_classes")
    _raises(lambda: lm.one_hot(a, 3), TypeError, "float32")
    _raises(lambda: LF.cross_entropy(a, cx.tensor((3,), lm.int32)), ValueError, "(3,)", "(2, 3)")
    _raises(lambda: LF.cross_entropy(a, idx, weight=cx.tensor((4,))), ValueError, "(4,)", "(3,)")
    _raises(lambda: LF.cross_entropy(a, idx, reduction="avg"), ValueError, "reduction")
    _raises(lambda: LF.nll_loss(a, a), TypeError, "class indices")
    _raises(lambda: LF.binary_cross_entropy(a, b), ValueError, "(2, 3)", "(4, 5)")
    _raises(lambda: LF.kl_div(a, a, reduction="batch"), ValueError, "batchmean")


# =====================================================================================================================
# More of torch's surface: 0-d dims, bitwise ints, views and shape helpers, element-wise math, statistics, losses
# =====================================================================================================================
def test_zero_d_dims_and_fixed_arguments(backend, rng):
    """dim 0 / -1 on a 0-d tensor (as torch), var/std's positional unbiased and float correction, round(decimals),
    softplus's threshold, cumsum(dtype), a 0-d masked_fill value."""
    s, a, m = np.array(1.75), rng.data((3, 5)) * 8, rng.bools((3, 5))

    def f(x, y, mask, v):
        return [x.sum(0), x.argmax(0), x.cumsum(-1), x.softmax(0), x.transpose(0, -1), x.squeeze(0), x.logsumexp(0),
                y.var(False), y.std(1, correction=0.5), y.var(0, unbiased=True), y.round(decimals=1),
                y.round(decimals=-1), y.softplus(beta=2, threshold=3), y.cumsum(1, dtype=lm.int32),
                y.masked_fill(mask, v)]

    def tf(x, y, mask, v):
        return [x.sum(0), x.argmax(0).int(), x.cumsum(-1), x.softmax(0), x.transpose(0, -1), x.squeeze(0),
                x.logsumexp(0), y.var(False), y.std(1, correction=0.5), y.var(0, unbiased=True), y.round(decimals=1),
                y.round(decimals=-1), F.softplus(y, beta=2, threshold=3), y.cumsum(1, dtype=torch.int32),
                y.masked_fill(mask, v)]

    check(f, tf, arrays=[s, a, m, np.array(-2.5)], backend=backend, rng=rng, name="0-d dims, fixed arguments")


def test_bitwise_int32(backend, rng):
    """&, |, ^, ~ on int32 are bitwise (two's complement, negatives and the sign bit included), on bool logical."""
    a = rng.integers(-2 ** 31, 2 ** 31 - 1, (4, 6))
    b = rng.integers(-300, 300, (4, 6))
    a[0, :4] = [-2 ** 31, 2 ** 31 - 1, -1, 0]

    def f(x, y):
        s = y.remainder(33)  # shifts 0..32: past the width too
        return [x & y, x | y, x ^ y, ~x, x & 0x0F0F, x.bitwise_or(-7), 5 ^ y, (x > 0) & (y > 0), ~(y > 0),
                x << s, x >> s, x.bitwise_left_shift(3), x >> 31, (x > 0) ^ (y > 0), (x > 0) | (y > 0)]

    def tf(x, y):
        s = y.remainder(33)
        # torch's CPU kernel gives 0 / the sign fill for shifts past the width
        return [x & y, x | y, x ^ y, ~x, x & 0x0F0F, x.bitwise_or(-7), 5 ^ y, (x > 0) & (y > 0), ~(y > 0),
                x << s, x >> s, x.bitwise_left_shift(3), x >> 31, (x > 0) ^ (y > 0), (x > 0) | (y > 0)]

    check(f, tf, arrays=[a, b], backend=backend, rng=rng, name="bitwise int32")


def test_arange_negative_step_and_factories(backend, rng):
    def f(x):
        g = x.graph
        return [lm.arange(5, -4, -2, graph=g), lm.arange(3.0, -1.0, -0.5, graph=g), lm.eye(3, 4, graph=g) + x,
                lm.scalar_tensor(2.5, graph=g), x.new_full((2, 2), 1.5), x.new_zeros(3), x.new_ones((1, 2)),
                x.fill(-1.25), lm.tril_indices(3, 4, 1, graph=g), lm.triu_indices(4, 3, -1, graph=g)]

    def tf(x):
        return [torch.arange(5, -4, -2).int(), torch.arange(3.0, -1.0, -0.5), torch.eye(3, 4) + x,
                torch.scalar_tensor(2.5), x.new_full((2, 2), 1.5), x.new_zeros(3), x.new_ones((1, 2)),
                x.fill_(-1.25) * 1, torch.tril_indices(3, 4, 1).int(), torch.triu_indices(4, 3, -1).int()]

    check(f, tf, shapes=[(3, 4)], backend=backend, rng=rng, name="negative arange, factories")


def test_view_and_shape_helpers(backend, rng):
    a, b, c = rng.data((3, 4)), rng.data((2, 3, 4)), rng.data((4,))

    def f(x, y, v, idx):
        return [x.t(), y.select(1, -1), y.diagonal(1, 1, 2), x.diag(-1), v.diag(), v.diag_embed(1), v.diagflat(-2),
                y.diag_embed(0, 0, 2), x.trace(), y.unflatten(2, (2, -1)), y.ravel(), v.broadcast_to((3, 4)),
                *lm.broadcast_tensors(x, v), lm.atleast_3d(x), *y.tensor_split(3, 2), *x.hsplit([1, 3]),
                *y.dsplit(2), lm.hstack([x, x]), lm.vstack([v, x]), lm.dstack([x, x]), lm.column_stack([v, v]),
                y.rot90(1, (1, 2)), y.rot90(-1, (2, 0)), x.rot90(2), x.fliplr(), y.flipud(), *lm.meshgrid(v, v[:2] * 2,
                indexing="xy"), x.kron(v.reshape(2, 2)), lm.block_diag(x, v.reshape(2, 2), v[0]),
                x.slice_scatter(x[:, :2] * 9, 1, 1, 4, 2), y.select_scatter(x * 7, 0, 1),
                y.diagonal_scatter(x[:2, :3] * 5, 0, 1, 2), y.unfold(2, 2, 1), x.take(idx),
                lm.tensordot(y, x, ([1, 2], [0, 1])), lm.cartesian_prod(v[:2], v[2:]), y.sum_to_size(1, 3, 1),
                lm.diagonal_copy(x), lm.permute_copy(y, (2, 0, 1))]

    def tf(x, y, v, idx):
        return [x.t(), y.select(1, -1), y.diagonal(1, 1, 2), x.diag(-1), v.diag(), v.diag_embed(1), v.diagflat(-2),
                y.diag_embed(0, 0, 2), x.trace(), y.unflatten(2, (2, -1)), y.ravel(), v.broadcast_to((3, 4)),
                *torch.broadcast_tensors(x, v), torch.atleast_3d(x), *y.tensor_split(3, 2), *x.hsplit([1, 3]),
                *y.dsplit(2), torch.hstack([x, x]), torch.vstack([v, x]), torch.dstack([x, x]),
                torch.column_stack([v, v]), y.rot90(1, (1, 2)), y.rot90(-1, (2, 0)), x.rot90(2), x.fliplr(),
                y.flipud(), *torch.meshgrid(v, v[:2] * 2, indexing="xy"), x.kron(v.reshape(2, 2)),
                torch.block_diag(x, v.reshape(2, 2), v[0]),
                x.slice_scatter(x[:, :2] * 9, 1, 1, 4, 2), y.select_scatter(x * 7, 0, 1),
                y.diagonal_scatter(x[:2, :3] * 5, 0, 1, 2), y.unfold(2, 2, 1), x.take(idx.long()),
                torch.tensordot(y, x, ([1, 2], [0, 1])), torch.cartesian_prod(v[:2], v[2:]), y.sum_to_size(1, 3, 1),
                torch.diagonal_copy(x), torch.permute_copy(y, (2, 0, 1))]

    check(f, tf, arrays=[a, b, c, np.array([[0, -1], [5, 11]], np.int32)], backend=backend, rng=rng,
          name="views and shape helpers")


def test_more_elementwise_math(backend, rng):
    a, b, u = rng.data((3, 5)), rng.data((3, 5)), rng.data((3, 5), "unit")
    b[0, :3] = [NAN, 0.0, -0.0]
    a[1, :2] = [NAN, 0.0]
    u[0, :2] = [0.999, -0.9999]

    def f(x, y, z):
        return [x.addcmul(y, z, value=0.5), x.addcdiv(z, y.abs() + 1, value=-2), x.erfc(), (x * 2).erfc(),
                z.erfinv(), x.logaddexp(y), x.logaddexp2(y), x.xlogy(y.abs()), x.hypot(y), x.fmax(y), x.fmin(y),
                x.copysign(y), x.sinc(), y.signbit(), x.sgn(), x.deg2rad(), x.rad2deg(), x.isclose(y),
                x.isclose(x + 1e-6), x.isclose(y, equal_nan=True), lm.float_power(x, 2)]

    def tf(x, y, z):
        return [x.addcmul(y, z, value=0.5), x.addcdiv(z, y.abs() + 1, value=-2), x.erfc(), (x * 2).erfc(),
                z.erfinv(), x.logaddexp(y), x.logaddexp2(y), x.xlogy(y.abs()), x.hypot(y), x.fmax(y), x.fmin(y),
                x.copysign(y), x.sinc(), y.signbit(), x.sgn(), x.deg2rad(), x.rad2deg(), x.isclose(y),
                x.isclose(x + 1e-6), x.isclose(y, equal_nan=True), torch.float_power(x, 2).float()]

    check(f, tf, arrays=[a, b, u], backend=backend, rng=rng, name="more element-wise math")


def test_more_statistics(backend, rng):
    a, b, v = rng.data((3, 5)), rng.data((4, 5)), rng.data((3, 3))
    nan = a.copy()
    nan[0, 1], nan[2, 4] = NAN, NAN
    a[1, 2], a[1, 4] = a[1, 0], 0.0  # ties for cummax's last index, a zero for count_nonzero

    def f(x, n, y, s):
        return [n.nansum(), n.nansum(1), n.nanmean(0), *x.var_mean(1), *x.std_mean(0, correction=0), *x.aminmax(),
                *x.aminmax(dim=1, keepdim=True), x.count_nonzero(), x.count_nonzero(0), *x.cummax(1), *x.cummin(0),
                x.logcumsumexp(1), x.diff(), x.diff(2, 0, prepend=y[:1]), x.dist(y[:3], 3), lm.cdist(x, y),
                x.renorm(2, 0, 1.5), x.cov(), x.corrcoef(), s.cross(s.flip(0), 1), x.inner(y), lm.trapezoid(x),
                lm.cumulative_trapezoid(x, dim=0)]

    def tf(x, n, y, s):
        return [n.nansum(), n.nansum(1), n.nanmean(0), *torch.var_mean(x, 1), *torch.std_mean(x, 0, correction=0),
                *x.aminmax(), *x.aminmax(dim=1, keepdim=True), x.count_nonzero().int(), x.count_nonzero(0).int(),
                *[t if t.is_floating_point() else t.int() for t in x.cummax(1)],
                *[t if t.is_floating_point() else t.int() for t in x.cummin(0)], x.logcumsumexp(1), x.diff(),
                x.diff(2, 0, prepend=y[:1]), x.dist(y[:3], 3), torch.cdist(x, y), x.renorm(2, 0, 1.5), x.cov(),
                x.corrcoef(), s.cross(s.flip(0), 1), x.inner(y), torch.trapezoid(x),
                torch.cumulative_trapezoid(x, dim=0)]

    check(f, tf, arrays=[a, nan, b, v], backend=backend, rng=rng, name="more statistics")


def test_more_losses(backend, rng):
    x1, x2, y = rng.data((4, 5)), rng.data((4, 5)), np.where(rng.bools((4,)), 1.0, -1.0)
    t = np.where(rng.bools((4, 5)), 1.0, -1.0)
    lab = rng.bools((4, 5)).astype(np.float64)
    pos = rng.data((4, 5), "pos")
    cls = rng.integers(0, 5, (4,))

    def f(a, b, yv, tv, lv, p, c):
        return [LF.soft_margin_loss(a, tv), LF.margin_ranking_loss(a[:, 0], b[:, 0], yv, margin=0.3),
                LF.hinge_embedding_loss(a, tv, margin=0.5, reduction="none"), LF.poisson_nll_loss(a, p),
                LF.poisson_nll_loss(p, p * 2, log_input=False, full=True, reduction="sum"),
                LF.gaussian_nll_loss(a, b, p), LF.gaussian_nll_loss(a, b, p[:, 0], full=True, reduction="none"),
                LF.cosine_embedding_loss(a, b, yv, margin=0.2), LF.multilabel_soft_margin_loss(a, lv),
                LF.triplet_margin_loss(a, b, p, margin=0.5, swap=True), LF.multi_margin_loss(a, c),
                LF.multi_margin_loss(a, c, p=2, margin=0.7, weight=p[0], reduction="none")]

    def tf(a, b, yv, tv, lv, p, c):
        c = c.long()
        return [F.soft_margin_loss(a, tv), F.margin_ranking_loss(a[:, 0], b[:, 0], yv, margin=0.3),
                F.hinge_embedding_loss(a, tv, margin=0.5, reduction="none"), F.poisson_nll_loss(a, p),
                F.poisson_nll_loss(p, p * 2, log_input=False, full=True, reduction="sum"),
                F.gaussian_nll_loss(a, b, p), F.gaussian_nll_loss(a, b, p[:, 0], full=True, reduction="none"),
                F.cosine_embedding_loss(a, b, yv, margin=0.2), F.multilabel_soft_margin_loss(a, lv),
                F.triplet_margin_loss(a, b, p, margin=0.5, swap=True), F.multi_margin_loss(a, c),
                F.multi_margin_loss(a, c, p=2, margin=0.7, weight=p[0], reduction="none")]

    check(f, tf, arrays=[x1, x2, y, t, lab, pos, cls], backend=backend, rng=rng, name="more losses")


def test_more_errors():
    cx = lm.Graph()
    a, b3 = cx.tensor((2, 3)), cx.tensor((2, 3, 4))
    _raises(lambda: b3.t(), ValueError, "(2, 3, 4)")
    _raises(lambda: a.diagonal(0, 1, 1), ValueError, "dim1")
    _raises(lambda: b3.diag(), ValueError, "(2, 3, 4)")
    _raises(lambda: a.rot90(1, (0, 0)), ValueError, "rot90")
    _raises(lambda: a.vsplit(3), ValueError, "(2, 3)")
    _raises(lambda: a.hsplit(2), ValueError, "(2, 3)")
    _raises(lambda: a & a, TypeError, "float32")
    _raises(lambda: a.masked_fill(a.gt(0), a), ValueError, "(2, 3)")
    _raises(lambda: a.unfold(1, 4, 1), ValueError, "(2, 3)")
    _raises(lambda: LF.multi_margin_loss(a, cx.tensor((3,), lm.int32)), ValueError, "(2, 3)", "(3,)")
    _raises(lambda: lm.tensordot(a, b3, ([1], [2])), ValueError, "(2, 3)", "(2, 3, 4)")


def test_special_functions(backend, rng):
    """lgamma, digamma (reflection for x < 1/2), polygamma, mvlgamma and i0 against torch, poles included."""
    a = rng.data((4, 6)) * 4
    neg = a < 0  # at least 0.2 from the poles, where float32 can't carry 1e-4 of relative accuracy
    a[neg] = np.floor(a[neg]) + 0.2 + 0.6 * (a[neg] - np.floor(a[neg]))
    a[0, :5] = [0.5, 1.0, 2.0, -2.5, -0.25]
    p, big = rng.data((4, 6), "pos") * 3, rng.data((4, 6)) * 6

    def f(x, y, z):
        return [x.lgamma(), x.digamma(), lm.polygamma(1, y), lm.polygamma(3, x), (y + 1).mvlgamma(3), z.i0()]

    def tf(x, y, z):
        return [x.lgamma(), x.digamma(), torch.polygamma(1, y), torch.polygamma(3, x), (y + 1).mvlgamma(3), z.i0()]

    check(f, tf, arrays=[a, p, big], backend=backend, rng=rng, name="special functions")


def test_integer_and_search_ops(backend, rng):
    a, b = rng.integers(-60, 60, (3, 5)), rng.integers(-12, 12, (3, 5))
    a[0, :3], b[0, :3] = [0, 0, 1836311903], [0, 7, 1134903170]  # gcd(0, 0), gcd(0, b), Fibonacci neighbours
    x, edges = rng.data((3, 5)), np.sort(rng.data((6,)))
    idx = np.array([0, -1, 7, 3], np.int32)

    def f(i, j, v, e, k):
        return [i.gcd(j), i[1:].lcm(j[1:]), v.ldexp(j.clamp(-4, 4)), i.isin(j), i.isin(j, invert=True),
                v.put(k, v[0, :4] * 10), v.put(k, v[1, :4], accumulate=True), lm.bucketize(v, e),
                lm.bucketize(v, e, right=True), lm.searchsorted(e, v), *lm.unravel_index(i.abs(), (4, 5)),
                lm.combinations(e[:4], 2), lm.combinations(e[:3], 2, with_replacement=True), v.histc(4, -1, 1),
                v.histc(3)]

    def tf(i, j, v, e, k):
        k = k.long()
        return [i.gcd(j), i[1:].lcm(j[1:]), v.ldexp(j.clamp(-4, 4)), torch.isin(i, j), torch.isin(i, j, invert=True),
                v.put(k, v[0, :4] * 10), v.put(k, v[1, :4], accumulate=True), torch.bucketize(v, e).int(),
                torch.bucketize(v, e, right=True).int(), torch.searchsorted(e, v).int(),
                *[t.int() for t in torch.unravel_index(i.abs().long(), (4, 5))], torch.combinations(e[:4], 2),
                torch.combinations(e[:3], 2, with_replacement=True), v.histc(4, -1, 1), v.histc(3)]

    check(f, tf, arrays=[a, b, x, edges, idx], backend=backend, rng=rng, name="integer and search ops")


def test_quantiles_and_frexp(backend, rng):
    a = rng.data((4, 7), "distinct")
    n = a.copy()
    n[0, 2], n[3, :5] = NAN, NAN
    e = rng.data((3, 4)) * 100
    e[0, :3] = [0.0, 0.5, 1.0]
    q = np.array([0.1, 0.5, 0.95])

    def f(x, y, z, qs):
        return [x.quantile(0.3), x.quantile(qs, 1, keepdim=True), x.quantile(0.5, 0, interpolation="midpoint"),
                x.quantile(0.4, 1, interpolation="nearest"), x.quantile(0.7, 1, interpolation="lower"),
                y.quantile(0.5, 1), y.nanquantile(qs, 1), *y.nanmedian(1), y.nanmedian(), *z.frexp()]

    def tf(x, y, z, qs):
        return [x.quantile(0.3), x.quantile(qs, 1, keepdim=True), x.quantile(0.5, 0, interpolation="midpoint"),
                x.quantile(0.4, 1, interpolation="nearest"), x.quantile(0.7, 1, interpolation="lower"),
                y.quantile(0.5, 1), y.nanquantile(qs, 1), *[t if t.is_floating_point() else t.int()
                                                          for t in y.nanmedian(1)], y.nanmedian(), *z.frexp()]

    check(f, tf, arrays=[a, n, e, q], backend=backend, rng=rng, name="quantiles and frexp")


def test_more_nn_functions(backend, rng):
    x4, w, x2 = rng.data((2, 6, 3, 3)), rng.data((5, 3)), rng.data((4, 3))
    idx = np.array([[0, 4], [2, 2]], np.int32)
    wb = rng.data((2, 3, 4))
    ml = np.array([[1, 0, -1], [2, -1, 0], [0, 1, 2], [-1, 1, 1]], np.int32)  # targets end at the first -1

    def f(x, ww, v, i, b3, s, ml):
        return [LF.channel_shuffle(x, 3), LF.bilinear(v, v.flip(0), b3[:, :, :3]),
                LF.pdist(v), LF.pdist(v, 1), LF.upsample_nearest(x, scale_factor=2),
                LF.upsample_bilinear(x, size=(4, 5)), LF.embedding(i, ww, max_norm=1.0), LF.embedding(i, ww, 0),
                *lm.native_layer_norm(v, (3,), ww[0], ww[1], 1e-5), *lm.native_group_norm(x, None, None, 2, 6, 9, 3,
                                                                                        1e-5),
                *lm.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-5),
                LF.pad(x, (-1, 2, 1, -2), mode="replicate"), v.narrow(0, s, 2), v[[0, 2, -1]], v[:, [1, 1]],
                v.prelu(s.float() * 0 + 0.25), lm.linspace(s.float(), 3.0, 5),
                LF.multilabel_margin_loss(v, ml),
                LF.linear_cross_entropy(v, ww, i.reshape(-1))]

    def tf(x, ww, v, i, b3, s, ml):
        i = i.long()
        return [F.channel_shuffle(x, 3), F.bilinear(v, v.flip(0), b3[:, :, :3]), F.pdist(v), F.pdist(v, 1),
                F.interpolate(x, scale_factor=2, mode="nearest"),
                F.interpolate(x, size=(4, 5), mode="bilinear", align_corners=True),
                F.embedding(i, ww.clone(), max_norm=1.0), F.embedding(i, ww, 0),
                *torch.native_layer_norm(v, (3,), ww[0], ww[1], 1e-5),
                *torch.native_group_norm(x, None, None, 2, 6, 9, 3, 1e-5),
                *torch.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-5),
                F.pad(x, (-1, 2, 1, -2), mode="replicate"), v.narrow(0, s, 2), v[[0, 2, -1]], v[:, [1, 1]],
                F.prelu(v, s.float() * 0 + 0.25), torch.linspace(s.float(), 3.0, 5),
                F.multilabel_margin_loss(v, ml.long()),
                F.linear_cross_entropy(v, ww, i.reshape(-1))]

    check(f, tf, arrays=[x4, w, x2, idx, wb, np.array(1, np.int32), ml], backend=backend, rng=rng,
          name="more nn functions")


def test_mode_histogram_gradient_bags(backend, rng):
    a = rng.integers(0, 4, (3, 8)).astype(np.float64)  # repeats, for mode
    x = rng.data((4, 6))
    edges = np.array([-1.5, -0.5, 0.0, 0.7, 2.0])
    w, tab = rng.data((4, 6), "pos"), rng.data((6, 3))
    flat, offs = np.array([0, 2, 5, 5, 1, 3], np.int32), np.array([0, 2, 2, 6], np.int32)
    idx, src = np.array([0, 2, 0], np.int32), rng.data((4, 3))

    def f(m, v, e, wt, t, i, o, ri, s):
        return [*m.mode(1), *m.mode(0, keepdim=True), *v.histogram(5), *v.histogram(3, range=(-1.0, 1.0), weight=wt),
                *v.histogram(e, density=True), *v.gradient(), *v.gradient(spacing=[2.0, 0.5], edge_order=2),
                *v.gradient(spacing=[wt[:, 0].cumsum(0)], dim=0), *v.gradient(spacing=[wt[0].cumsum(0)], dim=1,
                                                                              edge_order=2),
                v[:1].masked_scatter(v.gt(0), v * 3),
                LF.embedding_bag(i, t, o, mode="sum"), LF.embedding_bag(i, t, o, mode="max", padding_idx=5),
                LF.embedding_bag(i.reshape(2, 3), t, per_sample_weights=wt[0].reshape(2, 3), mode="sum"),
                LF.embedding_bag(i, t, o, mode="mean", include_last_offset=True),
                v[:, :3].index_reduce(1, ri, s, "prod"), v[:, :3].index_reduce(1, ri, s, "amax", include_self=False),
                v[:, :3].index_reduce(1, ri, s, "mean")]

    def tf(m, v, e, wt, t, i, o, ri, s):
        i, o, ri = i.long(), o.long(), ri.long()
        mo0, mo1 = m.mode(1), m.mode(0, keepdim=True)
        return [mo0[0], mo0[1].int(), mo1[0], mo1[1].int(), *v.histogram(5), *v.histogram(3, range=(-1.0, 1.0),
                                                                                          weight=wt),
                *v.histogram(e, density=True), *torch.gradient(v), *torch.gradient(v, spacing=[2.0, 0.5], edge_order=2),
                *torch.gradient(v, spacing=[wt[:, 0].cumsum(0)], dim=0),
                *torch.gradient(v, spacing=[wt[0].cumsum(0)], dim=1, edge_order=2),
                v[:1].masked_scatter(v.gt(0), v * 3),
                F.embedding_bag(i, t, o, mode="sum"), F.embedding_bag(i, t, o, mode="max", padding_idx=5),
                F.embedding_bag(i.reshape(2, 3), t, per_sample_weights=wt[0].reshape(2, 3), mode="sum"),
                F.embedding_bag(i, t, o, mode="mean", include_last_offset=True),
                v[:, :3].index_reduce(1, ri, s[:, :3], "prod"),
                v[:, :3].index_reduce(1, ri, s[:, :3], "amax", include_self=False),
                v[:, :3].index_reduce(1, ri, s[:, :3], "mean")]

    check(f, tf, arrays=[a, x, edges, w, tab, flat, offs, idx, src[:, :3]], backend=backend, rng=rng,
          name="mode, histogram, gradient, embedding_bag, index_reduce")
