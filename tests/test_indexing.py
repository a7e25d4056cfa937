"""PyTorch parity of sorting, selection, scatter and advanced indexing (python/luminal/indexing.py), on every
backend. Indices come in as int32 (luminal has no int64) and go to torch as int64."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import luminal as lm
from helpers import FLOATS, check


def L(t):
    return t.long()


# ---- sort, argsort, topk, kthvalue, median, msort -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sort(backend, rng, dtype):
    x = rng.data((4, 7, 5), "distinct")
    check(lambda t: [*lm.sort(t, 1), *t.sort(-1, descending=True), t.argsort(0), lm.msort(t)],
          lambda t: [*torch.sort(t, 1), *torch.sort(t, -1, descending=True), torch.argsort(t, 0), torch.msort(t)],
          arrays=[x], dtype=dtype, backend=backend, rng=rng, name="sort")


def test_sort_ties_stable_and_nan(backend, rng):
    """Equal elements keep their index order (torch's stable sort); NaN sorts as the largest value."""
    ints = rng.integers(0, 4, (3, 11))
    check(lambda t: [*lm.sort(t, stable=True), *lm.sort(t, 0, descending=True, stable=True)],
          lambda t: [*torch.sort(t, stable=True), *torch.sort(t, dim=0, descending=True, stable=True)],
          arrays=[ints], backend=backend, rng=rng, name="ties")
    x = rng.data((3, 9)).astype(np.float32)
    x[0, 2] = x[1, 7] = x[1, 0] = np.nan
    x[2, 1] = x[2, 5] = np.inf
    x[2, 3] = -np.inf
    x[0, 4] = x[0, 6]
    check(lambda t: [*lm.sort(t, stable=True), *lm.sort(t, descending=True, stable=True)],
          lambda t: [*torch.sort(t, stable=True), *torch.sort(t, descending=True, stable=True)],
          arrays=[x], backend=backend, rng=rng, name="nan")
    x[1, 0], x[0, 4] = 0.375, -0.625  # torch's topk orders ties its own way: no ties among the picks
    check(lambda t: [*t.topk(4), *t.topk(3, largest=False)], lambda t: [*t.topk(4), *t.topk(3, largest=False)],
          arrays=[x], backend=backend, rng=rng, name="topk nan")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("k,dim,largest", [(1, -1, True), (3, 1, False), (9, -1, True), (2, 0, True)])
def test_topk(backend, rng, dtype, k, dim, largest):
    x = rng.data((5, 9), "distinct")
    check(lambda t: list(lm.topk(t, k, dim, largest)), lambda t: list(torch.topk(t, k, dim, largest)),
          arrays=[x], dtype=dtype, backend=backend, rng=rng, name="topk")


def test_topk_symbolic_and_moe_routing(backend, rng):
    """A symbolic token count (rows) and sorted axis; MoE routing: softmax over 16 experts, top 2, renormalised."""
    x = rng.data((6, 16), "distinct")
    check(lambda t: list(t.topk(3, -1)), lambda t: list(torch.topk(t, 3, -1)), arrays=[x], dims=[("s", 16)],
          backend=backend, rng=rng, name="topk rows symbolic")
    check(lambda t: list(lm.sort(t, 0, descending=True)), lambda t: list(torch.sort(t, 0, descending=True)),
          arrays=[x], dims=[("s", 16)], backend=backend, rng=rng, name="sort along symbolic")

    def route(t, torch_mode=False):
        p = t.softmax(-1)
        w, i = (torch.topk(p, 2) if torch_mode else p.topk(2))
        return [w / w.sum(-1, keepdim=True), i]

    check(route, lambda t: route(t, True), arrays=[x], backend=backend, rng=rng, name="moe routing")


def test_kthvalue_median(backend, rng):
    x = rng.data((4, 7), "distinct")
    check(lambda t: [*lm.kthvalue(t, 3, 1), *t.kthvalue(2, 0, keepdim=True), *t.median(0, True), lm.median(t)],
          lambda t: [*torch.kthvalue(t, 3, 1), *t.kthvalue(2, 0, keepdim=True), *t.median(0, True), torch.median(t)],
          arrays=[x], backend=backend, rng=rng, name="kthvalue/median")
    y = rng.data((3, 6), "distinct").astype(np.float32)
    y[1, 4] = y[1, 2] = np.nan  # a row with NaN: its median is NaN, at its first NaN
    check(lambda t: list(lm.median(t, 1)), lambda t: list(torch.median(t, 1)), arrays=[y], backend=backend,
          rng=rng, name="median nan")


def test_sort_errors():
    cx = lm.Graph()
    x = cx.tensor((3, 5))
    with pytest.raises(ValueError, match=r"topk: k=6 is out of range for dim -1 of size 5"):
        lm.topk(x, 6)
    with pytest.raises(ValueError, match="k=-1"):
        x.topk(-1)
    with pytest.raises(ValueError, match=r"kthvalue: k=0"):
        x.kthvalue(0)
    with pytest.raises(IndexError, match="dim 2 is out of range"):
        x.sort(2)


# ---- scatter family -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
def test_scatter(backend, rng, dtype):
    """Distinct targets (torch leaves duplicates undefined): each column of the index a permutation's prefix."""
    inp, src = rng.data((5, 4, 3)), rng.data((4, 4, 3))
    idx0 = np.stack([rng.gen.permutation(5)[:3] for _ in range(4 * 2)], -1).reshape(3, 4, 2).astype(np.int32)
    idx2 = np.stack([rng.gen.permutation(3)[:2] for _ in range(5 * 4)]).reshape(5, 4, 2).astype(np.int32)
    check(lambda a, s, i, j: [lm.scatter(a, 0, i, s), a.scatter(2, j, value=2.5), a.scatter(0, i, -1.0)],
          lambda a, s, i, j: [torch.scatter(a, 0, L(i), s), a.scatter(2, L(j), value=2.5), a.scatter(0, L(i), -1.0)],
          arrays=[inp, src, idx0, idx2], dtype=dtype, backend=backend, rng=rng, name="scatter")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_add_duplicates(backend, rng, dtype, dim):
    """Many sources per target (duplicates accumulate); the index smaller than input and src in other dims."""
    inp, src = rng.data((5, 6, 4)), rng.data((10, 12, 10))
    ishape = {0: (9, 4, 3), 1: (4, 11, 2), -1: (3, 5, 9)}[dim]
    n = inp.shape[dim]
    idx = rng.integers(0, n, ishape)
    check(lambda a, s, i: [lm.scatter_add(a, dim, i, s), a.scatter(dim, i, s, reduce="add")],
          lambda a, s, i: [torch.scatter_add(a, dim, L(i), s), a.scatter_add(dim, L(i), s)],
          arrays=[inp, src, idx], dtype=dtype, backend=backend, rng=rng, name="scatter_add", tol_scale=3)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(backend, rng, reduce, include_self):
    inp, src = rng.data((4, 7)), rng.data((3, 9))
    idx = rng.integers(0, 7, (3, 8))
    idx[0, :3] = 2  # a position reached three times
    check(lambda a, s, i: a.scatter_reduce(1, i, s, reduce, include_self=include_self),
          lambda a, s, i: a.scatter_reduce(1, L(i), s, reduce, include_self=include_self),
          arrays=[inp, src, idx], backend=backend, rng=rng, name=f"scatter_reduce {reduce}", tol_scale=4)


def test_scatter_reduce_int(backend, rng):
    inp, src = rng.integers(-9, 10, (6,)), rng.integers(-9, 10, (8,))
    idx = rng.integers(0, 6, (8,))
    """Integer mean rounds down; amax/amin start from the int32 limits."""
    check(lambda a, s, i: [a.scatter_reduce(0, i, s, r, include_self=inc) for r in ("mean", "amax", "amin")
                           for inc in (True, False)],
          lambda a, s, i: [a.scatter_reduce(0, L(i), s, r, include_self=inc) for r in ("mean", "amax", "amin")
                           for inc in (True, False)],
          arrays=[inp, src, idx], backend=backend, rng=rng, name="scatter_reduce int")


def test_scatter_add_symbolic(backend, rng):
    """Token-count style: counts of expert ids over a symbolic number of tokens."""
    ids = rng.integers(0, 8, (13, 2))
    zeros = np.zeros((1, 8), np.float32) + 0.5
    check(lambda z, i: z.expand(1, 8).scatter_add(1, i.reshape(1, -1), lm.ones_like(i.reshape(1, -1), lm.float32)),
          lambda z, i: z.scatter_add(1, L(i.reshape(1, -1)), torch.ones(1, i.numel())),
          arrays=[zeros, ids], dims=[None, ("s", 2)], backend=backend, rng=rng, name="scatter_add symbolic")


@pytest.mark.parametrize("dtype", FLOATS)
def test_index_add(backend, rng, dtype):
    inp = rng.data((5, 6, 3))
    s0, s1 = rng.data((8, 6, 3)), rng.data((5, 4, 3))
    i0 = rng.integers(0, 5, (8,))
    i0[:3] = 1  # duplicates accumulate
    i1 = np.array([5, 0, 5, 2], np.int32)
    check(lambda a, x, y, i, j: [lm.index_add(a, 0, i, x), a.index_add(1, j, y, alpha=-0.5)],
          lambda a, x, y, i, j: [torch.index_add(a, 0, L(i), x), a.index_add(1, L(j), y, alpha=-0.5)],
          arrays=[inp, s0, s1, i0, i1], dtype=dtype, backend=backend, rng=rng, name="index_add", tol_scale=3)


def test_index_add_int_and_symbolic(backend, rng):
    check(lambda a, s, i: a.index_add(0, i, s), lambda a, s, i: a.index_add(0, L(i), s),
          arrays=[rng.integers(-5, 5, (4, 3)), rng.integers(-5, 5, (7, 3)), rng.integers(0, 4, (7,))],
          backend=backend, rng=rng, name="index_add int")
    # MoE combine: a symbolic number of routed rows added back into their tokens.
    check(lambda a, s, i: a.index_add(0, i, s), lambda a, s, i: a.index_add(0, L(i), s),
          arrays=[rng.data((4, 5)), rng.data((9, 5)), rng.integers(0, 4, (9,))], dims=[None, ("r", 5), ("r",)],
          backend=backend, rng=rng, name="index_add symbolic")


@pytest.mark.parametrize("dtype", FLOATS)
def test_index_put(backend, rng, dtype):
    inp = rng.data((4, 5, 3))
    rows, cols = np.array([0, -1, 2], np.int32), np.array([[1], [4], [0]], np.int32)  # broadcast to (3, 3)
    vals = rng.data((3, 3, 3))
    dup = np.array([1, -3, 1, 0], np.int32)  # -3 and 1 are the same row
    acc = rng.data((4, 5, 3))
    check(lambda a, r, c, v, d, w: [lm.index_put(a, (r, c), v), a.index_put((d,), w, accumulate=True),
                                    a.index_put((r, c), 7.0)],
          lambda a, r, c, v, d, w: [torch.index_put(a, (L(r), L(c)), v), a.index_put((L(d),), w, accumulate=True),
                                    a.index_put((L(r), L(c)), torch.tensor(7.0, dtype=a.dtype))],
          arrays=[inp, rows, cols, vals, dup, acc], dtype=dtype, backend=backend, rng=rng, name="index_put",
          tol_scale=3)


def test_index_fill_masked_scatter_take_along_dim(backend, rng):
    inp = rng.data((4, 6))
    idx = np.array([0, -1, 0, 2], np.int32)
    mask = rng.bools((4, 6))
    src = rng.data((30,))
    take = rng.integers(-6, 6, (4, 3))
    take_b = rng.integers(0, 6, (1, 2))  # broadcast over the rows
    check(lambda a, i, m, s, t, tb: [a.index_fill(1, i, -2.0), lm.index_fill(a, 0, i[1:2], 3.5),
                                     a.masked_scatter(m, s), lm.take_along_dim(a, t, 1), a.take_along_dim(tb, -1),
                                     lm.take_along_dim(a, tb)],
          lambda a, i, m, s, t, tb: [a.index_fill(1, L(i), -2.0), torch.index_fill(a, 0, L(i[1:2]), 3.5),
                                     a.masked_scatter(m, s), torch.take_along_dim(a, L(t), 1),
                                     a.take_along_dim(L(tb), -1), torch.take_along_dim(a, L(tb))],
          arrays=[inp, idx, mask, src, take, take_b], backend=backend, rng=rng, name="index_fill etc")


# ---- advanced indexing ----------------------------------------------------------------------------------------------
ADV = [
    lambda x, i, j, k: x[:, i],
    lambda x, i, j, k: x[:, i, :, j],  # separated: the index dims go first
    lambda x, i, j, k: x[i, 0, j],  # an int between: adjacent once it is applied
    lambda x, i, j, k: x[:, 0, :, j],
    lambda x, i, j, k: x[..., j],
    lambda x, i, j, k: x[:, i, 1:3, j],
    lambda x, i, j, k: x[None, i, :, ::2, j],
    lambda x, i, j, k: x[k],
    lambda x, i, j, k: x[1, k, 2:, k],
    lambda x, i, j, k: x[:, i.reshape(3, 1), j.reshape(1, 3)],
]


@pytest.mark.parametrize("case", range(len(ADV)))
def test_advanced_indexing(backend, rng, case):
    x = rng.data((2, 3, 4, 5))
    i, j = np.array([0, -1, 1], np.int32), np.array([1, -1, 3], np.int32)
    k = np.array([[0, 1], [-1, 0]], np.int32)
    check(ADV[case], lambda x, i, j, k: ADV[case](x, L(i), L(j), L(k)), arrays=[x, i, j, k], backend=backend,
          rng=rng, name=f"x[...] case {case}")


# ---- errors ---------------------------------------------------------------------------------------------------------
def test_index_errors():
    cx = lm.Graph()
    x, src = cx.tensor((4, 5)), cx.tensor((3, 5))
    i2, i1 = cx.tensor((3, 5), dtype="int32"), cx.tensor((3,), dtype="int32")
    with pytest.raises(ValueError, match=r"scatter_add: index \(3,\) and input \(4, 5\) must have the same number"):
        x.scatter_add(0, i1, src)
    with pytest.raises(ValueError, match=r"index \(3, 6\) is larger than input \(4, 5\) in dim 1"):
        x.scatter(0, cx.tensor((3, 6), dtype="int32"), 1.0)
    with pytest.raises(ValueError, match=r"index \(3, 5\) is larger than src \(2, 5\)"):
        x.scatter_reduce(0, i2, cx.tensor((2, 5)), "amax")
    with pytest.raises(ValueError, match="reduce must be one of"):
        x.scatter_reduce(0, i2, src, "max")
    with pytest.raises(TypeError, match="index must be an integer tensor, got float32"):
        x.scatter(0, src, src)
    with pytest.raises(ValueError, match=r"index_add: source \(3, 5\) must have input \(4, 5\)'s shape with dim 1"):
        x.index_add(1, i1, src)
    with pytest.raises(ValueError, match="index_add: index must be 1-D"):
        x.index_add(0, i2, src)
    with pytest.raises(ValueError, match=r"values \(2, 5\) cannot be broadcast to the indexed shape \(3, 5\)"):
        x.index_put((i1,), cx.tensor((2, 5)))
    with pytest.raises(NotImplementedError, match="data-dependent"):
        x.index_put((cx.tensor((4,), dtype="bool"),), 1.0)
    with pytest.raises(NotImplementedError, match="data-dependent"):
        x[:, cx.tensor((5,), dtype="bool")]
    with pytest.raises(IndexError, match=r"index tensors of shapes \(3,\), \(2,\) cannot be broadcast"):
        x[i1, cx.tensor((2,), dtype="int32")]
    with pytest.raises(ValueError, match=r"take_along_dim: indices \(3, 5\) and input \(4, 5\) cannot be broadcast"):
        x.take_along_dim(i2, 1)


@pytest.mark.parametrize("op", ["scatter_add", "scatter", "index_add", "index_put", "x[:, i]", "take_along_dim"])
def test_index_out_of_range_raises_at_run(op):
    """An index outside the dim raises when the graph runs (torch raises too), on the reference and CPU backends."""
    for compilers in ([], [lm.CPUCompiler()]):
        cx = lm.Graph()
        x = cx.tensor((4, 5)).set(np.ones((4, 5), np.float32))
        i = cx.tensor((1, 5), dtype="int32").set(np.array([[0, 1, 9, 2, 3]], np.int32))
        f = {"scatter_add": lambda: x.scatter_add(0, i, x), "scatter": lambda: x.scatter(0, i, x),
             "index_add": lambda: x.index_add(1, i[0], x), "index_put": lambda: x.index_put((i[0],), 1.0),
             "x[:, i]": lambda: x[:, i[0]], "take_along_dim": lambda: x.take_along_dim(i, 0)}[op]
        out = f().output()
        cx.compile(lm.GenericCompiler(), *compilers)
        with pytest.raises(IndexError, match="out of range"):
            cx.execute()
        del out


def test_scatter_add_matmul_form():
    """index_add's one-hot times source is a MatMul on the CPU backend (the sum over sources as a GEMM)."""
    cx = lm.Graph()
    x, s = cx.tensor((6, 32)), cx.tensor((10, 32))
    i = cx.tensor((10,), dtype="int32")
    x.index_add(0, i, s).output()
    cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
    assert cx.stats().get("MatMul", 0) == 1, cx.stats()

