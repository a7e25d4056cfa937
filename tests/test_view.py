"""Tests of the C++ core's View (luminal._core.View) against numpy.

A View maps a logical index i to the element offset + sum(i_d * stride_d) of a flat buffer, valid iff
mask[d][0] <= i_d < mask[d][1] for every d (an invalid element reads as 0). The tests apply the same chain of
movement ops to a numpy array and to a View over a flat buffer, materialise the View element by element and
compare. The buffer holds 1..n, so that padding (0) never looks like a real element.
"""
from __future__ import annotations


import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from luminal import _core

Expr, View = _core.Expr, _core.View

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------------------------------------------
# Helpers


def ev(e, env=None):
    return Expr(e).eval(env or {})


def concrete(view, env=None):
    """(shape, strides, offset, mask or None) with every expression evaluated."""
    shape = [ev(d, env) for d in view.shape]
    strides = [ev(d, env) for d in view.strides]
    offset = ev(view.offset, env)
    mask = [(ev(lo, env), ev(hi, env)) for lo, hi in view.mask] if view.has_mask() else None
    if mask is not None:
        assert len(mask) == len(shape)
    assert len(strides) == len(shape)
    return shape, strides, offset, mask


def offsets_and_validity(view, env=None):
    shape, strides, offset, mask = concrete(view, env)
    assert all(d >= 0 for d in shape), shape
    idx = np.indices(shape, dtype=np.int64) if shape else np.zeros((0,), dtype=np.int64)
    off = np.full(shape, offset, dtype=np.int64)
    valid = np.ones(shape, dtype=bool)
    for d in range(len(shape)):
        off = off + idx[d] * strides[d]
        if mask is not None:
            valid &= (idx[d] >= mask[d][0]) & (idx[d] < mask[d][1])
    return off, valid


def materialise(view, buf, env=None):
    """The View's logical tensor over the flat buffer `buf`."""
    off, valid = offsets_and_validity(view, env)
    assert np.all((off[valid] >= 0) & (off[valid] < len(buf))), f"valid index reads outside the buffer: {view}"
    safe = np.clip(off, 0, max(len(buf) - 1, 0))
    return np.where(valid, buf[safe] if len(buf) else 0, 0)


def strided_numpy(view, buf):
    """An unmasked View as a numpy view of `buf` (no copy), to ask numpy whether a reshape needs a copy."""
    shape, strides, offset, mask = concrete(view)
    assert mask is None
    item = buf.itemsize
    return np.ndarray(shape, buf.dtype, buffer=buf, offset=offset * item, strides=[st_ * item for st_ in strides])


def numpy_reshapes_without_copy(view, buf, new_shape):
    x = strided_numpy(view, buf)
    try:
        y = np.reshape(x, new_shape, copy=False)
    except ValueError:
        return False
    assert np.shares_memory(y, buf) or y.size == 0
    return True


def check(view, expected, buf, env=None):
    got = materialise(view, buf, env)
    assert got.shape == expected.shape, (view, got.shape, expected.shape)
    np.testing.assert_array_equal(got, expected, err_msg=repr(view))
    if view.is_contiguous():
        n = int(np.prod(expected.shape))
        np.testing.assert_array_equal(got.ravel(), buf[:n], err_msg=f"is_contiguous but {view}")


def contiguous_reference(shape):
    n = int(np.prod(shape))
    buf = np.arange(1, n + 1, dtype=np.int64)
    return buf, buf.reshape(shape)


# ---------------------------------------------------------------------------------------------------------------
# A random chain of movement ops, applied to numpy and to View side by side.

shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4)


def _divisors(n):
    return [f for f in range(1, n + 1) if n % f == 0]


def _factorisations(data, n, max_dims=4):
    """A random shape with `n` elements (it may contain 1s)."""
    dims = []
    rest = n
    while rest > 1 and len(dims) < max_dims - 1:
        f = data.draw(st.sampled_from(_divisors(rest)))
        dims.append(f)
        rest //= f
    dims.append(rest)
    if data.draw(st.booleans()):
        dims.insert(data.draw(st.integers(0, len(dims))), 1)
    return dims


def draw_reshape(data, shape):
    n = int(np.prod(shape))
    kind = data.draw(st.sampled_from(["merge", "split", "ones", "any", "flatten"]))
    if kind == "merge" and len(shape) >= 2:
        i = data.draw(st.integers(0, len(shape) - 2))
        j = data.draw(st.integers(i + 1, len(shape) - 1))
        return list(shape[:i]) + [int(np.prod(shape[i:j + 1]))] + list(shape[j + 1:])
    if kind == "split":
        i = data.draw(st.integers(0, len(shape) - 1))
        f = data.draw(st.sampled_from(_divisors(shape[i])))
        return list(shape[:i]) + [f, shape[i] // f] + list(shape[i + 1:])
    if kind == "ones":
        new = [d for d in shape if d != 1]
        for _ in range(data.draw(st.integers(0, 2))):
            new.insert(data.draw(st.integers(0, len(new))), 1)
        return new or [1]
    if kind == "flatten":
        return [n]
    return _factorisations(data, n)


class Chain:
    """A View over a flat buffer and the numpy array it must equal."""

    def __init__(self, shape):
        self.buf, self.arr = contiguous_reference(shape)
        self.view = View.contiguous(shape)
        self.log = [f"contiguous({shape})"]

    def shape(self):
        return list(self.arr.shape)

    def check(self):
        assert [ev(d) for d in self.view.shape] == self.shape(), (self.log, self.view)
        check(self.view, self.arr, self.buf)

    def step(self, data):
        shape = self.shape()
        rank = len(shape)
        ops = ["permute", "unsqueeze", "slice", "pad", "flip", "reshape", "reshape"]
        if any(d == 1 for d in shape):
            ops += ["expand", "expand"]
            if rank >= 2:
                ops.append("squeeze")
        op = data.draw(st.sampled_from(ops))
        v, a = self.view, self.arr
        if op == "permute":
            axes = data.draw(st.permutations(range(rank)))
            self.view, self.arr = v.permute(list(axes)), np.transpose(a, axes)
            self.log.append(f"permute({list(axes)})")
        elif op == "unsqueeze":
            ax = data.draw(st.integers(0, rank))
            self.view, self.arr = v.unsqueeze(ax), np.expand_dims(a, ax)
            self.log.append(f"unsqueeze({ax})")
        elif op == "squeeze":
            ax = data.draw(st.sampled_from([i for i, d in enumerate(shape) if d == 1]))
            self.view, self.arr = v.squeeze(ax), np.squeeze(a, ax)
            self.log.append(f"squeeze({ax})")
        elif op == "expand":
            ax = data.draw(st.sampled_from([i for i, d in enumerate(shape) if d == 1]))
            size = data.draw(st.integers(1, 4))
            new = list(shape)
            new[ax] = size
            self.view, self.arr = v.expand(ax, size), np.broadcast_to(a, new)
            self.log.append(f"expand({ax}, {size})")
        elif op == "slice":
            ax = data.draw(st.integers(0, rank - 1))
            n = shape[ax]
            start = data.draw(st.integers(0, n - 1))
            stop = data.draw(st.integers(start + 1, n))
            step = data.draw(st.integers(1, 3))
            sl = (slice(None),) * ax + (slice(start, stop, step),)
            self.view, self.arr = v.slice(ax, start, stop, step), a[sl]
            self.log.append(f"slice({ax}, {start}, {stop}, {step})")
        elif op == "pad":
            ax = data.draw(st.integers(0, rank - 1))
            before, after = data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))
            widths = [(0, 0)] * rank
            widths[ax] = (before, after)
            self.view, self.arr = v.pad(ax, before, after), np.pad(a, widths)
            self.log.append(f"pad({ax}, {before}, {after})")
        elif op == "flip":
            ax = data.draw(st.integers(0, rank - 1))
            self.view, self.arr = v.flip(ax), np.flip(a, ax)
            self.log.append(f"flip({ax})")
        elif op == "reshape":
            new = draw_reshape(data, shape)
            if v.has_mask() and all(d == 1 for d in shape):
                return  # see test_reshape_all_ones_fully_padded (a known failure)
            r = v.reshape(new)
            self.log.append(f"reshape({new}) -> {'copy' if r is None else 'view'}")
            if not v.has_mask() and numpy_reshapes_without_copy(v, self.buf, new):
                # numpy (like torch) can view this layout with the new shape: so must View.
                assert r is not None, (self.log, v, new)
            expected = np.reshape(a, new)
            if r is None:
                # Needs a copy: materialise, and go on from a contiguous buffer.
                self.buf = materialise(v, self.buf).ravel().copy()
                r = View.contiguous(new)
            self.view, self.arr = r, expected
        self.check()


@SETTINGS
@given(shapes, st.data())
def test_random_chains_match_numpy(shape, data):
    chain = Chain(shape)
    chain.check()
    for _ in range(data.draw(st.integers(1, 6))):
        chain.step(data)


@SETTINGS
@given(shapes, st.data())
def test_reshape_of_unmasked_views_matches_numpy(shape, data):
    # Views without padding (permute, slice, flip, expand), then one reshape: View must give a view exactly
    # when numpy can reshape without a copy (numpy and torch use the same rule), or be right where it does more.
    buf, arr = contiguous_reference(shape)
    v = View.contiguous(shape)
    for _ in range(data.draw(st.integers(0, 3))):
        op = data.draw(st.sampled_from(["permute", "slice", "flip", "expand"]))
        rank = len(arr.shape)
        if op == "permute":
            axes = data.draw(st.permutations(range(rank)))
            v, arr = v.permute(list(axes)), np.transpose(arr, axes)
        elif op == "slice":
            ax = data.draw(st.integers(0, rank - 1))
            n = arr.shape[ax]
            start = data.draw(st.integers(0, n - 1))
            stop = data.draw(st.integers(start + 1, n))
            step = data.draw(st.integers(1, 2))
            v, arr = v.slice(ax, start, stop, step), arr[(slice(None),) * ax + (slice(start, stop, step),)]
        elif op == "flip":
            ax = data.draw(st.integers(0, rank - 1))
            v, arr = v.flip(ax), np.flip(arr, ax)
        else:
            ax = data.draw(st.integers(0, rank))
            size = data.draw(st.integers(1, 3))
            v, arr = v.unsqueeze(ax).expand(ax, size), np.expand_dims(arr, ax).repeat(size, ax)
    check(v, arr, buf)
    new = draw_reshape(data, list(arr.shape))
    r = v.reshape(new)
    if numpy_reshapes_without_copy(v, buf, new):
        assert r is not None, (v, new)
    if r is not None:
        check(r, arr.reshape(new), buf)


# ---------------------------------------------------------------------------------------------------------------
# Symbolic dims: the same chain over a shape with a symbolic dim must evaluate to the same offsets.


class SymChain:
    """A chain over a shape whose dim `sym_axis` is the variable s, bound to its concrete size."""

    def __init__(self, shape, sym_axis):
        self.env = {"s": shape[sym_axis]}
        sym_shape = list(shape)
        sym_shape[sym_axis] = "s"
        self.buf, self.arr = contiguous_reference(shape)
        self.view = View.contiguous(sym_shape)
        self.log = [f"contiguous({sym_shape})"]

    def check(self):
        assert [ev(d, self.env) for d in self.view.shape] == list(self.arr.shape), (self.log, self.view)
        check(self.view, self.arr, self.buf, self.env)

    def step(self, data):
        v, a = self.view, self.arr
        shape = list(a.shape)
        rank = len(shape)
        sym = [not Expr(d).is_const() for d in v.shape]
        ops = ["permute", "unsqueeze", "slice", "pad", "flip", "merge", "split"]
        if any(d == 1 and not s for d, s in zip(shape, sym)):
            ops.append("expand")
        op = data.draw(st.sampled_from(ops))
        if op == "permute":
            axes = data.draw(st.permutations(range(rank)))
            self.view, self.arr = v.permute(list(axes)), np.transpose(a, axes)
        elif op == "unsqueeze":
            ax = data.draw(st.integers(0, rank))
            self.view, self.arr = v.unsqueeze(ax), np.expand_dims(a, ax)
        elif op == "expand":
            ax = data.draw(st.sampled_from([i for i, d in enumerate(shape) if d == 1 and not sym[i]]))
            # Expand to the symbolic size itself.
            new = list(shape)
            new[ax] = self.env["s"]
            self.view, self.arr = v.expand(ax, "s"), np.broadcast_to(a, new)
        elif op == "slice":
            ax = data.draw(st.integers(0, rank - 1))
            n = shape[ax]
            start = data.draw(st.integers(0, n - 1))
            stop = data.draw(st.integers(start + 1, n))
            step = data.draw(st.integers(1, 3))
            # On a symbolic dim, the stop is written relative to the symbolic size.
            stop_e = Expr(v.shape[ax]) - (n - stop) if sym[ax] else stop
            self.view = v.slice(ax, start, stop_e, step)
            self.arr = a[(slice(None),) * ax + (slice(start, stop, step),)]
        elif op == "pad":
            ax = data.draw(st.integers(0, rank - 1))
            before, after = data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))
            widths = [(0, 0)] * rank
            widths[ax] = (before, after)
            self.view, self.arr = v.pad(ax, before, after), np.pad(a, widths)
        elif op == "flip":
            ax = data.draw(st.integers(0, rank - 1))
            self.view, self.arr = v.flip(ax), np.flip(a, ax)
        else:
            if op == "merge" and rank >= 2:
                i = data.draw(st.integers(0, rank - 2))
                new_sym = list(v.shape[:i]) + [Expr(v.shape[i]) * v.shape[i + 1]] + list(v.shape[i + 2:])
                new = shape[:i] + [shape[i] * shape[i + 1]] + shape[i + 2:]
            else:
                cands = [i for i in range(rank) if not sym[i]]
                if not cands:
                    return
                i = data.draw(st.sampled_from(cands))
                f = data.draw(st.sampled_from(_divisors(shape[i])))
                new = shape[:i] + [f, shape[i] // f] + shape[i + 1:]
                new_sym = list(v.shape[:i]) + [f, shape[i] // f] + list(v.shape[i + 1:])
            r = v.reshape(new_sym)
            if r is None:
                self.buf = materialise(v, self.buf, self.env).ravel().copy()
                r = View.contiguous(new_sym)
            self.view, self.arr = r, np.reshape(a, new)
        self.log.append(op)
        self.check()


@SETTINGS
@given(st.lists(st.integers(2, 4), min_size=1, max_size=3), st.data())
def test_symbolic_chains_match_numpy(shape, data):
    sym_axis = data.draw(st.integers(0, len(shape) - 1))
    chain = SymChain(shape, sym_axis)
    chain.check()
    for _ in range(data.draw(st.integers(1, 5))):
        chain.step(data)


@SETTINGS
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.data())
def test_symbolic_view_evaluates_to_concrete_view(shape, data):
    # The same ops (no reshape) on a symbolic and a concrete shape give views that agree field by field once s
    # is bound: shape, strides and offset exactly, masks in the validity they imply.
    sym_axis = data.draw(st.integers(0, len(shape) - 1))
    n = shape[sym_axis]
    env = {"s": n}
    sym_shape = list(shape)
    sym_shape[sym_axis] = "s"
    vc, vs = View.contiguous(shape), View.contiguous(sym_shape)
    symbolic = [i == sym_axis for i in range(len(shape))]
    for _ in range(data.draw(st.integers(0, 4))):
        cshape = [ev(d) for d in vc.shape]
        rank = len(cshape)
        op = data.draw(st.sampled_from(["permute", "slice", "pad", "flip", "unsqueeze"]))
        if op == "permute":
            axes = list(data.draw(st.permutations(range(rank))))
            vc, vs = vc.permute(axes), vs.permute(axes)
            symbolic = [symbolic[a] for a in axes]
        elif op == "unsqueeze":
            ax = data.draw(st.integers(0, rank))
            vc, vs = vc.unsqueeze(ax), vs.unsqueeze(ax)
            symbolic.insert(ax, False)
        elif op == "slice":
            ax = data.draw(st.integers(0, rank - 1))
            start = data.draw(st.integers(0, cshape[ax] - 1))
            stop = data.draw(st.integers(start + 1, cshape[ax]))
            step = data.draw(st.integers(1, 3))
            stop_e = Expr(vs.shape[ax]) - (cshape[ax] - stop) if symbolic[ax] else stop
            vc, vs = vc.slice(ax, start, stop, step), vs.slice(ax, start, stop_e, step)
        elif op == "pad":
            ax = data.draw(st.integers(0, rank - 1))
            b, a = data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))
            vc, vs = vc.pad(ax, b, a), vs.pad(ax, b, a)
        else:
            ax = data.draw(st.integers(0, rank - 1))
            vc, vs = vc.flip(ax), vs.flip(ax)
    shape_c, strides_c, off_c, _ = concrete(vc)
    shape_s, strides_s, off_s, _ = concrete(vs, env)
    assert (shape_s, strides_s, off_s) == (shape_c, strides_c, off_c), (vc, vs)
    assert vs.has_mask() == vc.has_mask()
    oc, valid_c = offsets_and_validity(vc)
    os_, valid_s = offsets_and_validity(vs, env)
    np.testing.assert_array_equal(oc, os_)
    np.testing.assert_array_equal(valid_c, valid_s)


# ---------------------------------------------------------------------------------------------------------------
# Unit tests: each op against numpy.


def test_contiguous():
    v = View.contiguous([2, 3, 4])
    assert [int(d) for d in v.shape] == [2, 3, 4]
    assert [int(d) for d in v.strides] == [12, 4, 1]
    assert int(v.offset) == 0
    assert not v.has_mask() and list(v.mask) == []
    assert v.is_contiguous()
    buf, arr = contiguous_reference([2, 3, 4])
    check(v, arr, buf)
    s = View.contiguous([])
    assert list(s.shape) == [] and s.is_contiguous()
    check(s, np.array(1), np.array([1]))


def test_permute():
    buf, arr = contiguous_reference([2, 3, 4])
    v = View.contiguous([2, 3, 4]).permute([2, 0, 1])
    assert [int(d) for d in v.strides] == [1, 12, 4]
    assert not v.is_contiguous()
    check(v, arr.transpose(2, 0, 1), buf)
    assert v.permute([1, 2, 0]) == View.contiguous([2, 3, 4])


def test_expand():
    buf, arr = contiguous_reference([3, 1])
    v = View.contiguous([3, 1]).expand(1, 4)
    assert [int(d) for d in v.strides] == [1, 0]
    check(v, np.broadcast_to(arr, (3, 4)), buf)
    v2 = View.contiguous([3]).unsqueeze(0).expand(0, 2)
    check(v2, np.broadcast_to(arr[:, 0], (2, 3)), buf)
    assert View.contiguous([3, 4]).expand(1, 4) == View.contiguous([3, 4])  # same size: no-op


def test_unsqueeze_squeeze():
    buf, arr = contiguous_reference([2, 3])
    for ax in range(3):
        v = View.contiguous([2, 3]).unsqueeze(ax)
        check(v, np.expand_dims(arr, ax), buf)
        assert v.is_contiguous()
        assert v.squeeze(ax) == View.contiguous([2, 3])


def test_slice():
    buf, arr = contiguous_reference([5, 7])
    for ax, start, stop, step in [(0, 1, 4, 1), (1, 0, 7, 2), (1, 1, 7, 3), (0, 0, 5, 4), (1, 6, 7, 5), (0, 2, 2, 1)]:
        v = View.contiguous([5, 7]).slice(ax, start, stop, step)
        sl = (slice(None),) * ax + (slice(start, stop, step),)
        check(v, arr[sl], buf)
    v = View.contiguous([5, 7]).slice(1, 1, 6, 2).slice(0, 1, 5, 2).slice(1, 1, 3)
    check(v, arr[1:5:2, 1:6:2][:, 1:3], buf)


def test_pad():
    buf, arr = contiguous_reference([2, 3])
    v = View.contiguous([2, 3]).pad(1, 2, 1)
    assert v.has_mask()
    assert [(int(lo), int(hi)) for lo, hi in v.mask] == [(0, 2), (2, 5)]
    check(v, np.pad(arr, [(0, 0), (2, 1)]), buf)
    v2 = v.pad(0, 1, 0).pad(1, 0, 2)
    check(v2, np.pad(np.pad(np.pad(arr, [(0, 0), (2, 1)]), [(1, 0), (0, 0)]), [(0, 0), (0, 2)]), buf)
    assert not v2.is_contiguous()


def test_flip():
    buf, arr = contiguous_reference([3, 4])
    check(View.contiguous([3, 4]).flip(0), np.flip(arr, 0), buf)
    check(View.contiguous([3, 4]).flip(1), np.flip(arr, 1), buf)
    check(View.contiguous([3, 4]).flip(0).flip(1), arr[::-1, ::-1], buf)
    assert View.contiguous([3, 4]).flip(1).flip(1) == View.contiguous([3, 4])


def test_masked_compositions():
    buf, arr = contiguous_reference([3, 4])
    padded = np.pad(arr, [(1, 2), (0, 3)])
    v = View.contiguous([3, 4]).pad(0, 1, 2).pad(1, 0, 3)
    check(v, padded, buf)
    check(v.flip(0), np.flip(padded, 0), buf)
    check(v.slice(0, 1, 6, 2), padded[1:6:2], buf)
    check(v.slice(1, 2, 7, 3), padded[:, 2:7:3], buf)
    check(v.flip(1).slice(1, 0, 7, 2).permute([1, 0]), np.flip(padded, 1)[:, 0:7:2].T, buf)
    # Slicing only padding, then expanding / squeezing that size-1 dim.
    only_pad = v.slice(0, 4, 5)  # a row of padding
    check(only_pad, padded[4:5], buf)
    check(only_pad.expand(0, 3), np.broadcast_to(padded[4:5], (3, 7)), buf)
    check(only_pad.squeeze(0), padded[4], buf)
    real_row = v.slice(0, 1, 2)
    check(real_row.expand(0, 2), np.broadcast_to(padded[1:2], (2, 7)), buf)
    check(real_row.squeeze(0), padded[1], buf)
    check(real_row.reshape([1, 1, 7]), padded[1:2].reshape(1, 1, 7), buf)


# ---------------------------------------------------------------------------------------------------------------
# Reshape: a view where torch would give one, None where it truly needs a copy.


def _reshaped(v, buf, arr, new):
    r = v.reshape(new)
    assert r is not None, f"{v} reshaped to {new} should be a view"
    check(r, arr.reshape(new), buf)
    return r


def test_reshape_contiguous_to_anything():
    buf, arr = contiguous_reference([2, 3, 4])
    v = View.contiguous([2, 3, 4])
    for new in ([24], [6, 4], [4, 6], [2, 12], [1, 24, 1], [3, 2, 2, 2], [2, 3, 4], [4, 3, 2]):
        r = _reshaped(v, buf, arr, new)
        assert r.is_contiguous()
        assert r == View.contiguous(new)
    # A contiguous slice (offset) keeps its offset.
    buf, arr = contiguous_reference([4, 6])
    r = _reshaped(View.contiguous([4, 6]).slice(0, 1, 3), buf, arr[1:3], [3, 4])
    assert int(r.offset) == 6


def test_reshape_merges_dims_contiguous_with_each_other():
    buf, arr = contiguous_reference([2, 3, 4])
    v = View.contiguous([2, 3, 4]).permute([2, 0, 1])  # (4, 2, 3), strides (1, 12, 4)
    r = _reshaped(v, buf, arr.transpose(2, 0, 1), [4, 6])
    assert [int(d) for d in r.strides] == [1, 4]
    # Sliced rows: dims 1, 2 of (2, 3, 4)[:, :, :2] are not mergeable, but dims 0, 1 are.
    v = View.contiguous([2, 3, 4]).slice(2, 0, 2)
    sl = arr[:, :, :2]
    _reshaped(v, buf, sl, [6, 2])
    assert v.reshape([2, 6]) is None
    # Expanded dims merge with each other (stride 0).
    buf, arr = contiguous_reference([3])
    v = View.contiguous([3]).unsqueeze(1).unsqueeze(2).expand(1, 2).expand(2, 4)
    _reshaped(v, buf, np.broadcast_to(arr[:, None, None], (3, 2, 4)), [3, 8])


def test_reshape_splits_dim_of_permuted():
    buf, arr = contiguous_reference([3, 4])
    t = View.contiguous([3, 4]).permute([1, 0])  # (4, 3), strides (1, 4)
    r = _reshaped(t, buf, arr.T, [2, 2, 3])
    assert [int(d) for d in r.strides] == [2, 1, 4]
    _reshaped(t, buf, arr.T, [4, 3, 1])
    _reshaped(t, buf, arr.T, [1, 4, 1, 3])
    _reshaped(t, buf, arr.T, [4, 3])
    # Splitting both dims of a transposed matrix.
    buf, arr = contiguous_reference([4, 6])
    t = View.contiguous([4, 6]).permute([1, 0])
    _reshaped(t, buf, arr.T, [2, 3, 2, 2])
    # Negative strides: a fully flipped tensor flattens as a view.
    buf, arr = contiguous_reference([3, 4])
    _reshaped(View.contiguous([3, 4]).flip(0).flip(1), buf, arr[::-1, ::-1], [12])
    # Every other column of a (4, 6) matrix: strides (6, 2) are one stride-2 run.
    buf, arr = contiguous_reference([4, 6])
    r = _reshaped(View.contiguous([4, 6]).slice(1, 0, 6, 2), buf, arr[:, ::2], [12])
    assert [int(d) for d in r.strides] == [2]


def test_reshape_needs_copy():
    # Flattening a transposed matrix truly needs a copy.
    assert View.contiguous([3, 4]).permute([1, 0]).reshape([12]) is None
    assert View.contiguous([2, 3]).permute([1, 0]).reshape([2, 3]) is None
    assert View.contiguous([2, 3, 4]).permute([0, 2, 1]).reshape([2, 12]) is None
    # Flattening a broadcast, a strided slice or a half-flipped matrix, too.
    assert View.contiguous([3, 1]).expand(1, 4).reshape([12]) is None
    assert View.contiguous([4, 5]).slice(1, 0, 5, 2).reshape([12]) is None  # strides (5, 2)
    assert View.contiguous([4, 6]).slice(1, 0, 4).reshape([16]) is None  # strides (6, 1)
    assert View.contiguous([3, 4]).flip(1).reshape([12]) is None


def test_reshape_with_padding():
    buf, arr = contiguous_reference([2, 3])
    v = View.contiguous([2, 3]).pad(1, 1, 1)
    padded = np.pad(arr, [(0, 0), (1, 1)])
    # Inserting or removing size-1 dims keeps the mask.
    r = _reshaped(v, buf, padded, [2, 1, 5])
    assert r.has_mask()
    r2 = _reshaped(r, buf, padded.reshape(2, 1, 5), [1, 2, 5])
    _reshaped(r2, buf, padded.reshape(1, 2, 5), [2, 5])
    # Otherwise a masked view may ask for a copy (None); a view it returns must be right.
    for new in ([10], [5, 2]):
        r = v.reshape(new)
        if r is not None:
            check(r, padded.reshape(new), buf)


def test_reshape_all_ones_fully_padded():
    # A size-1 tensor whose one element is padding, with an extra size-1 dim: (1, 1) -> (1,) only drops a dim.
    v = View.contiguous([1]).pad(0, 1, 0).slice(0, 0, 1)  # the pad element: [0]
    check(v, np.zeros(1, dtype=np.int64), np.array([1]))
    u = v.unsqueeze(0)
    check(u, np.zeros((1, 1), dtype=np.int64), np.array([1]))
    r = u.reshape([1])  # core bug: raises "squeeze: cannot drop the only (padded) dim"
    assert r is not None
    check(r, np.zeros(1, dtype=np.int64), np.array([1]))


def test_reshape_same_numel_required():
    with pytest.raises(ValueError):
        View.contiguous([2, 3]).reshape([5])
    with pytest.raises(ValueError):
        View.contiguous(["s", 3]).reshape(["s", 4])


# ---------------------------------------------------------------------------------------------------------------
# Symbolic dims


def _same_after_binding(sym, conc, env):
    shape_s, strides_s, off_s, mask_s = concrete(sym, env)
    shape_c, strides_c, off_c, mask_c = concrete(conc)
    assert (shape_s, strides_s, off_s) == (shape_c, strides_c, off_c), (sym, conc)
    a, va = offsets_and_validity(sym, env)
    b, vb = offsets_and_validity(conc)
    np.testing.assert_array_equal(va, vb)
    np.testing.assert_array_equal(np.where(va, a, 0), np.where(vb, b, 0))


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_symbolic_contiguous(n):
    v = View.contiguous(["s", 4])
    assert v.strides[0] == 4 and v.strides[1] == 1
    assert v.shape[0] == Expr.var("s")
    assert v.is_contiguous()
    _same_after_binding(v, View.contiguous([n, 4]), {"s": n})
    w = View.contiguous([2, "s", 3])
    assert w.strides[0] == Expr("3*s") and w.strides[0].eval({"s": n}) == 3 * n
    _same_after_binding(w, View.contiguous([2, n, 3]), {"s": n})
    buf, arr = contiguous_reference([2, n, 3])
    check(w, arr, buf, {"s": n})


@pytest.mark.parametrize("n", [2, 3, 4])
def test_symbolic_ops(n):
    env = {"s": n}
    buf, arr = contiguous_reference([n, 4])
    v = View.contiguous(["s", 4])
    cases = [
        (v.permute([1, 0]), arr.T),
        (v.flip(0), arr[::-1]),
        (v.slice(0, 1, "s"), arr[1:]),
        (v.slice(0, 0, "s", 2), arr[0::2]),
        (v.slice(1, 1, 4, 2), arr[:, 1::2]),
        (v.pad(0, 1, 2), np.pad(arr, [(1, 2), (0, 0)])),
        (v.pad(0, 1, 2).flip(0).slice(0, 1, "s+2"), np.flip(np.pad(arr, [(1, 2), (0, 0)]), 0)[1:n + 2]),
        (v.pad(1, 1, 0).slice(0, 0, "s", 2), np.pad(arr, [(0, 0), (1, 0)])[0::2]),
        (v.unsqueeze(1).expand(1, "s"), np.broadcast_to(arr[:, None, :], (n, n, 4))),
    ]
    for view, expected in cases:
        check(view, expected, buf, env)
    # Symbolic padding amounts.
    penv = {"s": n, "p": 2}
    check(v.pad(1, "p", 1), np.pad(arr, [(0, 0), (2, 1)]), buf, penv)


@pytest.mark.parametrize("n", [2, 3])
def test_symbolic_reshape(n):
    env = {"s": n}
    buf, arr = contiguous_reference([n, 4])
    v = View.contiguous(["s", 4])
    for new_sym, new in [(["4*s"], [4 * n]), ([Expr("s") * 4], [4 * n]), (["s", 2, 2], [n, 2, 2]),
                         ([1, "s", 4], [1, n, 4])]:
        r = v.reshape(new_sym)
        assert r is not None, new_sym
        check(r, arr.reshape(new), buf, env)
    # Splitting a dim of the transposed symbolic tensor: (4, s) strides (1, 4) -> (2, 2, s).
    t = v.permute([1, 0])
    r = t.reshape([2, 2, "s"])
    assert r is not None
    check(r, arr.T.reshape(2, 2, n), buf, env)
    assert r.strides[2] == 4 and r.strides[0] == 2 and r.strides[1] == 1
    # ... and merging contiguous dims of a permuted 3-d one: (s, 2, 3) -> permute (2, 0, 1) -> (3, s*2).
    buf3, arr3 = contiguous_reference([n, 2, 3])
    w = View.contiguous(["s", 2, 3]).permute([2, 0, 1])
    r = w.reshape([3, "2*s"])
    assert r is not None
    check(r, arr3.transpose(2, 0, 1).reshape(3, 2 * n), buf3, env)
    # Flattening the transposed symbolic matrix needs a copy.
    assert t.reshape(["4*s"]) is None


@pytest.mark.parametrize("pad", [0, 1, 2])
def test_symbolic_pad_then_expand(pad):
    # Pad a size-1 dim by a symbolic amount p before it, then take element 0: it is the real element iff p == 0.
    # Expanding (or squeezing) that size-1 dim must keep that, whatever p is bound to.
    env = {"p": pad}
    buf = np.array([7], dtype=np.int64)
    v = View.contiguous([1]).pad(0, "p", 0).slice(0, 0, 1)
    expected = np.pad(buf, [(pad, 0)])[0:1]
    check(v, expected, buf, env)
    # Core bug: expand treats any mask that is not literally [0, 1) as all padding, so for p == 0 the
    # expanded element reads as 0 instead of 7.
    check(v.expand(0, 3), np.broadcast_to(expected, (3,)), buf, env)


@pytest.mark.parametrize("pad", [0, 1])
def test_symbolic_pad_then_squeeze(pad):
    env = {"p": pad}
    buf = np.array([7, 8], dtype=np.int64)
    v = View.contiguous([1, 2]).pad(0, "p", 0).slice(0, 0, 1)  # row 0 is real iff p == 0
    expected = np.pad(buf.reshape(1, 2), [(pad, 0), (0, 0)])[0:1]
    check(v, expected, buf, env)
    # Core bug: squeeze (and the size-1 path of reshape) likewise treat the row as padding for p == 0.
    check(v.squeeze(0), expected[0], buf, env)
    check(v.reshape([2]), expected.reshape(2), buf, env)


# ---------------------------------------------------------------------------------------------------------------
# Errors and identity


def test_errors():
    v = View.contiguous([2, 3])
    with pytest.raises(ValueError):
        v.expand(0, 4)  # not a size-1 dim
    with pytest.raises(ValueError):
        v.squeeze(1)
    with pytest.raises(ValueError):
        v.permute([0, 0])
    with pytest.raises(ValueError):
        v.permute([0])
    with pytest.raises(IndexError):
        v.permute([0, 2])
    with pytest.raises(IndexError):
        v.flip(2)
    with pytest.raises(IndexError):
        v.slice(-1, 0, 1)
    with pytest.raises(IndexError):
        v.pad(5, 1, 1)
    with pytest.raises(IndexError):
        v.unsqueeze(3)
    with pytest.raises(ValueError):
        v.slice(0, 0, 2, 0)


def test_equality_and_hash():
    a = View.contiguous([2, 3]).permute([1, 0]).flip(0)
    b = View.contiguous([2, 3]).permute([1, 0]).flip(0)
    assert a == b and hash(a) == hash(b)
    assert a != View.contiguous([3, 2])
    assert View.contiguous(["s", "t"]) == View.contiguous([Expr.var("s"), "t"])
    assert View.contiguous(["s+1", 2]) == View.contiguous(["1+s", 2])
    assert hash(View.contiguous(["s+1", 2])) == hash(View.contiguous(["1+s", 2]))
