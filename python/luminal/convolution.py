"""Convolutions, pooling, interpolation and im2col, with torch.nn.functional's names and semantics (NCHW).

Everything reads its input through sliding-window views (`View.unfold`: overlapping strides, no copy). A padded
input is copied once with its padding (a window view cannot start inside padding). A convolution is then one
broadcast Mul summed over (channels, kernel window): on the CPU backend that sum is one `Contraction`, a GEMM that
packs the window view where it lies, so no im2col buffer is ever written.
"""
from __future__ import annotations

import math

import numpy as np

from . import _core
from . import dtypes as dt
from .tensor import Tensor, _fmt, _scalar

__all__ = [
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d",
    "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_max_pool1d", "adaptive_max_pool2d",
    "interpolate", "upsample", "unfold", "fold", "pixel_shuffle", "pixel_unshuffle",
]


# ---- argument checks -------------------------------------------------------------------------------------------------
def _tuple(v, n: int, what: str, fn: str) -> tuple:
    """An int or a sequence of n ints (torch accepts either)."""
    if isinstance(v, (int, np.integer)):
        return (int(v),) * n
    v = tuple(v)
    if len(v) == 1:
        v = v * n
    if len(v) != n or not all(isinstance(x, (int, np.integer)) for x in v):
        raise ValueError(f"{fn}: {what} must be an int or {n} ints, got {v!r}")
    return tuple(int(x) for x in v)


def _positive(v: tuple, what: str, fn: str):
    if any(x <= 0 for x in v):
        raise ValueError(f"{fn}: {what} must be positive, got {v}")


def _batched(x: Tensor, nd: int, fn: str) -> tuple[Tensor, bool]:
    """x with a batch dim: (C, *spatial) inputs are unbatched, as torch allows."""
    if x.ndim == nd + 1:
        return x.unsqueeze(0), True
    if x.ndim != nd + 2:
        raise ValueError(f"{fn}: expected a {nd + 1}-D (unbatched) or {nd + 2}-D (batched) input, got shape "
                         f"{_fmt(x.shape)}")
    return x, False


def _const(d) -> int | None:
    e = _core.to_expr(d)
    return int(e) if e.is_const() else None


def _padded(x: Tensor, pads: list[tuple], value: float = 0.0) -> Tensor:
    """x (N, C, *spatial) with (lo, hi) padding per spatial dim (negative crops), as a buffer a window view can
    read: padding is copied in once; an unpadded input is read where it lies unless its view masks something."""
    flat = [p for lo_hi in reversed(pads) for p in lo_hi]
    if any(not (_core.to_expr(p) == 0) for p in flat):
        x = x.pad(flat, value)
    return x.contiguous() if x.layout.mask else x


def _check_span(shape, kernel, dilation, fn: str, context: str):
    """Each window must fit in the (padded) input: a ValueError naming the shapes otherwise."""
    for i, (k, d) in enumerate(zip(kernel, dilation)):
        n = _const(shape[i])
        span = d * (k - 1) + 1
        if n is not None and span > n:
            raise ValueError(f"{fn}: the kernel spans {span} elements along spatial dim {i} but the padded input has "
                             f"{n}: {context}")


def _windows(x: Tensor, first: int, kernel, stride, dilation) -> Tensor:
    """Sliding windows over dims first.. of x: each becomes its window starts, and a window dim is appended per dim
    (torch's Tensor.unfold with dilation)."""
    v = x.layout
    for i, (k, s, d) in enumerate(zip(kernel, stride, dilation)):
        v = v.unfold(first + i, k, s, d)
    return x._with_view(v)


# ---- convolution ---------------------------------------------------------------------------------------------------
def _conv(x: Tensor, weight: Tensor, bias, stride, padding, dilation, groups: int, nd: int, fn: str) -> Tensor:
    x, unbatched = _batched(x, nd, fn)
    if weight.ndim != nd + 2:
        raise ValueError(f"{fn}: weight must be {nd + 2}-D (out_channels, in_channels/groups, *kernel), got shape "
                         f"{_fmt(weight.shape)} for input {_fmt(x.shape)}")
    stride = _tuple(stride, nd, "stride", fn)
    dilation = _tuple(dilation, nd, "dilation", fn)
    _positive(stride, "stride", fn)
    _positive(dilation, "dilation", fn)
    kernel = tuple(_const(k) for k in weight.shape[2:])
    if any(k is None for k in kernel):
        raise ValueError(f"{fn}: the kernel size must be constant, got weight shape {_fmt(weight.shape)}")
    if isinstance(padding, str):
        if padding == "valid":
            pads = [(0, 0)] * nd
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError(f"{fn}: padding='same' needs stride 1, got stride {stride}")
            # torch puts the odd element of the total padding on the right
            pads = [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for k, d in zip(kernel, dilation)]
        else:
            raise ValueError(f"{fn}: padding must be an int, a tuple, 'same' or 'valid', got {padding!r}")
    else:
        p = _tuple(padding, nd, "padding", fn)
        if any(v < 0 for v in p):
            raise ValueError(f"{fn}: padding must be non-negative, got {p}")
        pads = [(v, v) for v in p]
    if not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ValueError(f"{fn}: groups must be a positive int, got {groups!r}")
    c_in, c_out, c_w = _const(x.shape[1]), _const(weight.shape[0]), _const(weight.shape[1])
    if c_in is None or c_out is None:
        raise ValueError(f"{fn}: channel counts must be constant, got input {_fmt(x.shape)}, weight "
                         f"{_fmt(weight.shape)}")
    if c_in % groups or c_out % groups:
        raise ValueError(f"{fn}: groups={groups} must divide the input channels and the output channels: input "
                         f"{_fmt(x.shape)}, weight {_fmt(weight.shape)}")
    if c_w * groups != c_in:
        raise ValueError(f"{fn}: input {_fmt(x.shape)} has {c_in} channels but weight {_fmt(weight.shape)} expects "
                         f"{c_w * groups} (in_channels/groups = {c_w}, groups = {groups})")
    if x.dtype != weight.dtype:
        raise TypeError(f"{fn}: input is {x.dtype.name} but weight is {weight.dtype.name}")
    if bias is not None and (bias.ndim != 1 or _const(bias.shape[0]) != c_out):
        raise ValueError(f"{fn}: bias must have shape ({c_out},), got {_fmt(bias.shape)} for weight "
                         f"{_fmt(weight.shape)}")
    spatial = [_core.to_expr(d) + lo + hi for d, (lo, hi) in zip(x.shape[2:], pads)]
    _check_span(spatial, kernel, dilation, fn, f"input {_fmt(x.shape)}, weight {_fmt(weight.shape)}, padding {pads}")
    out = _correlate(x, weight.reshape([groups, c_out // groups, c_w, *kernel]), pads, stride, dilation)
    if bias is not None:
        out = out + bias.to(out.dtype).reshape([c_out] + [1] * nd)
    return out.squeeze(0) if unbatched else out


def _correlate(x: Tensor, w: Tensor, pads, stride, dilation) -> Tensor:
    """The convolution (cross-correlation) of x (N, G*Cg, *spatial) with w (G, Og, Cg, *kernel): (N, G*Og, *out)."""
    nd = len(pads)
    out_dtype = x.dtype
    if x.dtype in (dt.float16, dt.bfloat16):  # accumulate in float32 and round once, as torch does
        x, w = x.float(), w.float()
    elif not x.dtype.is_float:
        x, w, out_dtype = x.float(), w.float(), dt.float32
    g, og, cg = (int(d) for d in w.shape[:3])
    kernel = tuple(int(k) for k in w.shape[3:])
    n = x.shape[0]
    xp = _padded(x, pads)
    xw = _windows(xp.reshape([n, g, cg] + list(xp.layout.shape[2:])), 3, kernel, stride, dilation)
    # xw: (N, G, Cg, *out, *kernel) -> (N, G, 1, *out, Cg, *kernel); w -> (1, G, Og, 1.., Cg, *kernel)
    out_dims = list(range(3, 3 + nd))
    xw = xw.permute([0, 1] + out_dims + [2] + [3 + nd + i for i in range(nd)]).unsqueeze(2)
    ww = w.unsqueeze(0)
    for _ in range(nd):
        ww = ww.unsqueeze(3)
    if g == 1:  # the result is then (N, O, *out) as computed: no reshape for an Output to copy
        xw, ww = xw.squeeze(1), ww.squeeze(1)
    prod = xw * ww  # (N, [G,] Og, *out, Cg, *kernel)
    out = prod.sum(list(range(prod.ndim - 1 - nd, prod.ndim)))
    if g > 1:
        out = out.reshape([n, g * og] + list(out.layout.shape[3:]))
    return out.to(out_dtype)


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv(input, weight, bias, stride, padding, dilation, groups, 1, "conv1d")


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv(input, weight, bias, stride, padding, dilation, groups, 2, "conv2d")


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv(input, weight, bias, stride, padding, dilation, groups, 3, "conv3d")


def _zero_insert(x: Tensor, ax: int, s: int) -> Tensor:
    """s - 1 zeros between neighbours along dim ax (a transposed convolution's input): n -> (n - 1) * s + 1."""
    if s == 1:
        return x
    v = x.layout.unsqueeze(ax + 1).pad(ax + 1, 0, s - 1)  # (.., n, s, ..): each element then its zeros
    y = x._with_view(v)
    shape = list(v.shape)
    n = shape[ax]
    y = y.reshape(shape[:ax] + [n * s] + shape[ax + 2:])  # a copy: merging a padded dim needs one
    return y._with_view(y.layout.slice(ax, 0, (n - 1) * s + 1))


def _conv_transpose(x: Tensor, weight: Tensor, bias, stride, padding, output_padding, groups, dilation, nd: int,
                    fn: str) -> Tensor:
    x, unbatched = _batched(x, nd, fn)
    if weight.ndim != nd + 2:
        raise ValueError(f"{fn}: weight must be {nd + 2}-D (in_channels, out_channels/groups, *kernel), got shape "
                         f"{_fmt(weight.shape)} for input {_fmt(x.shape)}")
    stride = _tuple(stride, nd, "stride", fn)
    dilation = _tuple(dilation, nd, "dilation", fn)
    padding = _tuple(padding, nd, "padding", fn)
    output_padding = _tuple(output_padding, nd, "output_padding", fn)
    _positive(stride, "stride", fn)
    _positive(dilation, "dilation", fn)
    if any(p < 0 for p in padding) or any(p < 0 for p in output_padding):
        raise ValueError(f"{fn}: padding and output_padding must be non-negative, got {padding}, {output_padding}")
    if any(op >= max(s, d) for op, s, d in zip(output_padding, stride, dilation)):
        raise ValueError(f"{fn}: output_padding {output_padding} must be smaller than stride {stride} or dilation "
                         f"{dilation}")
    if not isinstance(groups, (int, np.integer)) or groups < 1:
        raise ValueError(f"{fn}: groups must be a positive int, got {groups!r}")
    kernel = tuple(_const(k) for k in weight.shape[2:])
    c_in, c_w, og = _const(x.shape[1]), _const(weight.shape[0]), _const(weight.shape[1])
    if None in kernel or None in (c_in, c_w, og):
        raise ValueError(f"{fn}: channel counts and kernel size must be constant, got input {_fmt(x.shape)}, "
                         f"weight {_fmt(weight.shape)}")
    if c_w % groups:
        raise ValueError(f"{fn}: groups={groups} must divide the input channels: input {_fmt(x.shape)}, weight "
                         f"{_fmt(weight.shape)}")
    if c_in != c_w:
        raise ValueError(f"{fn}: input {_fmt(x.shape)} has {c_in} channels but weight {_fmt(weight.shape)} expects "
                         f"{c_w}")
    if x.dtype != weight.dtype:
        raise TypeError(f"{fn}: input is {x.dtype.name} but weight is {weight.dtype.name}")
    if bias is not None and (bias.ndim != 1 or _const(bias.shape[0]) != og * groups):
        raise ValueError(f"{fn}: bias must have shape ({og * groups},), got {_fmt(bias.shape)} for weight "
                         f"{_fmt(weight.shape)}")
    # The adjoint of a strided convolution: the input spread out by the stride, padded by the kernel's reach minus
    # the padding (output_padding more on the right), convolved with the flipped kernel, channels in and out swapped.
    pads = [(d * (k - 1) - p, d * (k - 1) - p + op) for k, d, p, op in zip(kernel, dilation, padding, output_padding)]
    for i, (n, (lo, hi)) in enumerate(zip(x.shape[2:], pads)):
        size = _const((_core.to_expr(n) - 1) * stride[i] + 1 + lo + hi)
        if size is not None and size < dilation[i] * (kernel[i] - 1) + 1:
            raise ValueError(f"{fn}: the output would be empty along spatial dim {i}: input {_fmt(x.shape)}, weight "
                             f"{_fmt(weight.shape)}, stride {stride}, padding {padding}")
    xd = x
    for i, s in enumerate(stride):
        xd = _zero_insert(xd, 2 + i, s)
    cg = c_in // groups
    w = weight.reshape([groups, cg, og, *kernel]).transpose(1, 2).flip(list(range(3, 3 + nd)))
    out = _correlate(xd, w, pads, (1,) * nd, dilation)
    if bias is not None:
        out = out + bias.to(out.dtype).reshape([og * groups] + [1] * nd)
    return out.squeeze(0) if unbatched else out


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    return _conv_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation, 1,
                           "conv_transpose1d")


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    return _conv_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation, 2,
                           "conv_transpose2d")


# ---- pooling ---------------------------------------------------------------------------------------------------------
def _lowest(dtype) -> float:
    """The most negative finite value of a float dtype: max pooling's padding (never the max of a window that holds
    an element; -inf would make Tensor.pad's 0 * value a NaN)."""
    if dtype is dt.float16:
        return -65504.0
    if dtype is dt.bfloat16:
        return -3.3895313892515355e38
    return float(np.finfo(np.float32).min)


def _pool_args(kernel_size, stride, padding, dilation, nd: int, fn: str):
    k = _tuple(kernel_size, nd, "kernel_size", fn)
    s = k if stride is None or (isinstance(stride, (list, tuple)) and len(stride) == 0) else \
        _tuple(stride, nd, "stride", fn)
    p = _tuple(padding, nd, "padding", fn)
    d = _tuple(dilation, nd, "dilation", fn)
    _positive(k, "kernel_size", fn)
    _positive(s, "stride", fn)
    _positive(d, "dilation", fn)
    if any(v < 0 for v in p):
        raise ValueError(f"{fn}: padding must be non-negative, got {p}")
    if any(2 * pv > dv * (kv - 1) + 1 for kv, pv, dv in zip(k, p, d)):
        raise ValueError(f"{fn}: padding {p} must be at most half of the kernel's extent (kernel {k}, dilation {d})")
    return k, s, p, d


def _pool_sizes(x: Tensor, k, s, p, d, ceil_mode: bool, fn: str):
    """Output sizes (torch's rule, ceil_mode included) and the (lo, hi) padding that makes every window whole."""
    outs, pads = [], []
    for i, (n, kv, sv, pv, dv) in enumerate(zip(x.shape[2:], k, s, p, d)):
        n = _core.to_expr(n)
        span = dv * (kv - 1) + 1
        nc = _const(n)
        if nc is not None and nc + 2 * pv < span:
            raise ValueError(f"{fn}: the window spans {span} elements along spatial dim {i} but the padded input "
                             f"has {nc + 2 * pv}: input {_fmt(x.shape)}, kernel {k}, padding {p}")
        o = (n + 2 * pv - span + (sv - 1 if ceil_mode else 0)) // sv + 1
        if ceil_mode:  # the last window must start inside the input or its left padding
            o = o - _core.Expr.min(_core.Expr.max((o - 1) * sv - n - pv + 1, 0), 1)
        outs.append(o)
        extra = _core.Expr.max((o - 1) * sv + span - n - 2 * pv, 0) if ceil_mode else _core.Expr(0)
        pads.append((pv, pv + extra))  # hi: p, plus what ceil_mode's last window reaches past it
    return outs, pads


def _pool_axis(x: Tensor, ax: int, k: int, s: int, d: int, reduce: str) -> Tensor:
    """Windows of one dim reduced (sum or max): the dim becomes the window starts."""
    w = x._with_view(x.layout.unfold(ax, k, s, d))
    return w.sum(-1) if reduce == "sum" else w.amax(-1)


def _max_pool(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices, nd, fn):
    x, unbatched = _batched(x, nd, fn)
    k, s, p, d = _pool_args(kernel_size, stride, padding, dilation, nd, fn)
    outs, pads = _pool_sizes(x, k, s, p, d, ceil_mode, fn)
    xp = _padded(x, pads, _lowest(x.dtype)) if x.dtype.is_float else _padded(x, pads, -(2 ** 31))
    if return_indices:
        out, idx = _max_pool_indices(x, xp, k, s, p, d, outs)
        return (out.squeeze(0), idx.squeeze(0)) if unbatched else (out, idx)
    out = xp
    for i in reversed(range(nd)):  # a max over a box is the max over each of its sides in turn
        out = _pool_axis(out, 2 + i, k[i], s[i], d[i], "max")
    return out.squeeze(0) if unbatched else out


def _max_pool_indices(x, xp, k, s, p, d, outs):
    """The max of each window and where it is (an index into the flattened input plane), the first one in window
    order as torch picks."""
    nd = len(k)
    w = _windows(xp, 2, k, s, d)  # (N, C, *out, *kernel)
    shape = list(w.layout.shape)
    flat = w.reshape(shape[:2 + nd] + [int(np.prod(k))])  # a copy: window dims do not merge
    val = flat.amax(-1)
    arg = flat.argmax(-1)  # (N, C, *out), int32: position in the window
    index = None
    rem = arg
    for i in reversed(range(nd)):  # window position -> input coordinate along each dim
        ki = rem % k[i] if i else rem
        rem = rem // k[i]
        o = _arange_dim(x.graph, outs[i], 2 + i, 2 + nd)
        coord = o * s[i] - p[i] + ki * d[i]
        stride_in = _core.Expr(1)
        for n in x.shape[3 + i:]:
            stride_in = stride_in * _core.to_expr(n)
        term = coord * _scalar(x.graph, stride_in, dt.int32)
        index = term if index is None else index + term
    return val, index


def _arange_dim(graph, n, ax: int, ndim: int) -> Tensor:
    """0..n-1 (int32) laid along dim ax of an ndim tensor (size 1 elsewhere)."""
    r = graph._wrap(graph._g.iota(_core.Expr.var("z"), _core.to_expr(n)))
    for _ in range(ax):
        r = r.unsqueeze(0)
    for _ in range(ndim - 1 - ax):
        r = r.unsqueeze(-1)
    return r


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_pool(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices, 1, "max_pool1d")


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    return _max_pool(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices, 2, "max_pool2d")


def _window_counts(graph, n, k: int, s: int, p: int, hi: int, include_pad: bool) -> Tensor:
    """How many elements each window of one dim averages: those inside the input, or inside input and padding
    (never the part ceil_mode's last window reaches past the padding), as torch counts them (float32, 1-D)."""
    n = _core.to_expr(n)
    if include_pad:
        v = graph.constant(1, dt.float32).expand_to([n + 2 * p]).pad((0, hi - p))
    else:
        v = graph.constant(1, dt.float32).expand_to([n]).pad((p, hi))
    return _pool_axis(v.contiguous(), 0, k, s, 1, "sum")


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, nd, fn):
    x, unbatched = _batched(x, nd, fn)
    k, s, p, d = _pool_args(kernel_size, stride, padding, 1, nd, fn)
    if any(2 * pv > kv for pv, kv in zip(p, k)):
        raise ValueError(f"{fn}: padding {p} must be at most half of the kernel size {k}")
    outs, pads = _pool_sizes(x, k, s, p, d, ceil_mode, fn)
    out_dtype = x.dtype
    xf = x.float() if x.dtype in (dt.float16, dt.bfloat16) or not x.dtype.is_float else x
    out = _padded(xf, pads)
    for i in reversed(range(nd)):  # a sum over a box is the sum over each of its sides in turn
        out = _pool_axis(out, 2 + i, k[i], s[i], 1, "sum")
    if divisor_override:
        out = out / float(divisor_override)
    else:
        div = None
        for i in range(nd):
            c = _window_counts(x.graph, x.shape[2 + i], k[i], s[i], p[i], pads[i][1], count_include_pad)
            c = c.reshape([c.shape[0]] + [1] * (nd - 1 - i))
            div = c if div is None else div * c
        out = out / div
    out = out.to(out_dtype) if out_dtype.is_float else out
    return out.squeeze(0) if unbatched else out


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    return _avg_pool(input, kernel_size, stride, padding, ceil_mode, count_include_pad, None, 1, "avg_pool1d")


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2,
                     "avg_pool2d")


# ---- adaptive pooling ------------------------------------------------------------------------------------------------
def _adaptive_sizes(x: Tensor, output_size, nd: int, fn: str) -> list:
    if isinstance(output_size, (int, np.integer)) or output_size is None:
        output_size = (output_size,) * nd
    output_size = tuple(output_size)
    if len(output_size) == 1:
        output_size = output_size * nd
    if len(output_size) != nd:
        raise ValueError(f"{fn}: output_size must be an int or {nd} ints, got {output_size!r}")
    sizes = []
    for o, n in zip(output_size, x.shape[2:]):
        o = n if o is None else o  # None keeps the input's size, as torch
        if not isinstance(o, (int, np.integer, _core.Expr)) or (isinstance(o, (int, np.integer)) and o <= 0):
            raise ValueError(f"{fn}: output sizes must be positive ints, got {output_size!r} for input "
                             f"{_fmt(x.shape)}")
        sizes.append(_core.to_expr(o))
    return sizes


def _adaptive_bounds(graph, n, o):
    """Window i of an adaptive pool covers [floor(i n / o), ceil((i + 1) n / o)): both as int32 (o,) tensors."""
    z = _core.Expr.var("z")
    start = graph._wrap(graph._g.iota((z * n) // o, o))
    end = graph._wrap(graph._g.iota(((z + 1) * n + o - 1) // o, o))
    return start, end


def _longest_window(n: int, o: int) -> int:
    return max(-(-(i + 1) * n // o) - i * n // o for i in range(o))


def _adaptive_axis(x: Tensor, ax: int, o, reduce: str) -> Tensor:
    """One dim of an adaptive pool: n -> o windows, averaged ("mean") or maxed ("max")."""
    n = _core.to_expr(x.shape[ax])
    if n == o:
        return x
    if n.is_const() and o.is_const() and int(n) % int(o) == 0:  # equal windows side by side: a reshape
        k = int(n) // int(o)
        shape = list(x.layout.shape)
        y = x.reshape(shape[:ax] + [o, _core.Expr(k)] + shape[ax + 1:])
        return y.mean(ax + 1) if reduce == "mean" else y.amax(ax + 1)
    g = x.graph
    start, end = _adaptive_bounds(g, n, o)
    xl = x.transpose(ax, -1) if ax != x.ndim - 1 else x  # the pooled dim last
    if reduce == "mean":
        # A matrix product with the (o, n) averaging matrix: one MatMul.
        j = g._wrap(g._g.iota(_core.Expr.var("z"), n)).unsqueeze(0)
        inside = (j.ge(start.unsqueeze(1)) & j.lt(end.unsqueeze(1))).float()
        avg = inside / (end - start).float().unsqueeze(1)
        out = xl.matmul(avg.T)
    else:
        # Every window gathered at the longest window's length, short ones repeating their last element.
        kmax = _core.Expr(_longest_window(int(n), int(o))) if n.is_const() and o.is_const() else (n + o - 1) // o + 1
        j = g._wrap(g._g.iota(_core.Expr.var("z"), kmax)).unsqueeze(0)
        idx = (start.unsqueeze(1) + j).minimum(end.unsqueeze(1) - 1)  # (o, kmax)
        out = xl.index_select(xl.ndim - 1, idx.reshape(-1))
        out = out.reshape(list(out.layout.shape[:-1]) + [o, kmax]).amax(-1)
    return out.transpose(ax, -1) if ax != x.ndim - 1 else out


def _adaptive(x, output_size, nd: int, reduce: str, fn: str):
    x, unbatched = _batched(x, nd, fn)
    sizes = _adaptive_sizes(x, output_size, nd, fn)
    out_dtype = x.dtype
    out = x.float() if reduce == "mean" and x.dtype in (dt.float16, dt.bfloat16) else x
    if all(o == 1 for o in sizes):  # global pooling: one reduction over the whole plane
        flat = out.flatten(2)
        out = flat.mean(-1) if reduce == "mean" else flat.amax(-1)
        out = out.reshape(list(out.layout.shape) + [1] * nd).to(out_dtype)
        return out.squeeze(0) if unbatched else out
    for i in reversed(range(nd)):  # a box's mean (max) is the mean (max) along each of its sides in turn
        out = _adaptive_axis(out, 2 + i, sizes[i], reduce)
    out = out.to(out_dtype)
    return out.squeeze(0) if unbatched else out


def _adaptive_max_indices(x, output_size, nd: int, fn: str):
    """Adaptive max pooling with torch's indices (into the flattened input plane): windows gathered whole."""
    x, unbatched = _batched(x, nd, fn)
    sizes = _adaptive_sizes(x, output_size, nd, fn)
    g = x.graph
    out, kmaxes = x, []
    for i in range(nd):  # every window gathered at the longest window's length, dim by dim
        n, o = _core.to_expr(x.shape[2 + i]), sizes[i]
        if not (n.is_const() and o.is_const()):
            raise ValueError(f"{fn}: return_indices needs constant sizes, got input {_fmt(x.shape)}")
        kmax = _longest_window(int(n), int(o))
        start, end = _adaptive_bounds(g, n, o)
        j = g._wrap(g._g.iota(_core.Expr.var("z"), kmax)).unsqueeze(0)
        idx = (start.unsqueeze(1) + j).minimum(end.unsqueeze(1) - 1)  # (o, kmax): input coordinate
        ax = 2 + 2 * i  # the dims before became (o, kmax) pairs
        out = out.index_select(ax, idx.reshape(-1))
        shape = list(out.layout.shape)
        out = out.reshape(shape[:ax] + [o, _core.Expr(kmax)] + shape[ax + 1:])
        kmaxes.append(kmax)
    # out: (N, C, o0, k0, o1, k1, ..) -> (N, C, o0, o1, .., k0 * k1 ..)
    perm = [0, 1] + [2 + 2 * i for i in range(nd)] + [3 + 2 * i for i in range(nd)]
    flat = out.permute(perm)
    flat = flat.reshape(list(flat.layout.shape[:2 + nd]) + [int(np.prod(kmaxes))])
    val, arg = flat.amax(-1), flat.argmax(-1)
    index, rem = None, arg
    for i in reversed(range(nd)):
        ki = rem % kmaxes[i] if i else rem
        rem = rem // kmaxes[i]
        # coordinate = idx_i[o_i, ki] = min(start + ki, end - 1), laid along dim 2 + i
        start, end = _adaptive_bounds(g, _core.to_expr(x.shape[2 + i]), sizes[i])
        shape = [1] * (2 + nd)
        shape[2 + i] = sizes[i]
        coord = (start.reshape(shape) + ki).minimum(end.reshape(shape) - 1)
        stride_in = _core.Expr(1)
        for n in x.shape[3 + i:]:
            stride_in = stride_in * _core.to_expr(n)
        term = coord * _scalar(g, stride_in, dt.int32)
        index = term if index is None else index + term
    return (val.squeeze(0), index.squeeze(0)) if unbatched else (val, index)


def adaptive_avg_pool1d(input, output_size):
    return _adaptive(input, output_size, 1, "mean", "adaptive_avg_pool1d")


def adaptive_avg_pool2d(input, output_size):
    return _adaptive(input, output_size, 2, "mean", "adaptive_avg_pool2d")


def adaptive_max_pool1d(input, output_size, return_indices=False):
    if return_indices:
        return _adaptive_max_indices(input, output_size, 1, "adaptive_max_pool1d")
    return _adaptive(input, output_size, 1, "max", "adaptive_max_pool1d")


def adaptive_max_pool2d(input, output_size, return_indices=False):
    if return_indices:
        return _adaptive_max_indices(input, output_size, 2, "adaptive_max_pool2d")
    return _adaptive(input, output_size, 2, "max", "adaptive_max_pool2d")


# ---- interpolation ---------------------------------------------------------------------------------------------------
def _f32(v) -> float:
    return float(np.float32(v))


def _source_coords(graph, n_in: int | None, n_out, scale: float | None, mode: str, align_corners):
    """Per output position along one dim, torch's source coordinate as float32 (computed in float32 as torch's
    kernels do): nearest floor(i * scale), nearest-exact floor((i + 1/2) * scale), linear (i + 1/2) * scale - 1/2
    clamped at 0, or i * (n_in - 1) / (n_out - 1) with align_corners."""
    z = graph._wrap(graph._g.iota(_core.Expr.var("z"), _core.to_expr(n_out))).float()
    if mode == "linear" and align_corners:
        return z * scale
    if mode == "nearest":
        return z * scale
    src = (z + 0.5) * scale
    return src if mode == "nearest-exact" else (src - 0.5).relu()


def _axis_scale(n_in, n_out, scale_factor, mode, align_corners, recompute):
    """torch's per-dim scale (float32): 1/scale_factor when one is given (and not recomputed), else in/out; with
    align_corners, (in - 1)/(out - 1). None where a dim is symbolic."""
    if mode == "linear" and align_corners:
        if n_in is None or n_out is None:
            return None
        return _f32(np.float32(n_in - 1) / np.float32(n_out - 1)) if n_out > 1 else 0.0
    if scale_factor is not None and not recompute:
        return _f32(1.0 / scale_factor)
    if n_in is None or n_out is None:
        return None
    return _f32(np.float32(n_in) / np.float32(n_out))


def _interp_axis(x: Tensor, ax: int, n_out, scale_factor, mode: str, align_corners, recompute) -> Tensor:
    g = x.graph
    n_in_e, n_out_e = _core.to_expr(x.shape[ax]), _core.to_expr(n_out)
    n_in, n_out_c = _const(n_in_e), _const(n_out_e)
    if mode == "nearest" and n_in_e == n_out_e:  # torch's special case, whatever the scale
        return x
    scale = _axis_scale(n_in, n_out_c, scale_factor, mode, align_corners, recompute)
    if scale is None:  # a symbolic dim: the scale computed in the graph
        if mode == "linear" and align_corners:
            num, den = n_in_e - 1, _core.Expr.max(n_out_e - 1, 1)
        else:
            num, den = n_in_e, n_out_e
        scale_t = _scalar(g, num, dt.float32) / _scalar(g, den, dt.float32)
    else:
        scale_t = scale
    src = _source_coords(g, n_in, n_out_e, scale_t, mode, align_corners)
    last = _scalar(g, n_in_e - 1, dt.int32)
    i0 = src.floor().to(dt.int32).minimum(last)
    if mode != "linear":
        return x.index_select(ax, i0)
    lam = (src - i0.float()).clamp(0.0, 1.0)
    i1 = i0 + i0.lt(last).to(dt.int32)
    shape = [1] * x.ndim
    shape[ax] = n_out_e
    lam = lam.reshape(shape).to(x.dtype)
    # torch's order: x0 * (1 - lambda) + x1 * lambda, the inner dim first
    return x.index_select(ax, i0) * (1 - lam) + x.index_select(ax, i1) * lam


_MODES = {"nearest": "nearest", "nearest-exact": "nearest-exact", "linear": "linear", "bilinear": "linear",
          "trilinear": "linear", "area": "area"}


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """torch.nn.functional.interpolate over (N, C, *spatial): nearest, nearest-exact, (bi/tri)linear with or
    without align_corners, and area (adaptive average pooling)."""
    fn = "interpolate"
    nd = input.ndim - 2
    if nd < 1:
        raise ValueError(f"{fn}: expected a (N, C, *spatial) input, got shape {_fmt(input.shape)}")
    if mode not in _MODES:
        raise NotImplementedError(f"{fn}: mode {mode!r} is not supported (nearest, nearest-exact, linear, bilinear, "
                                  "trilinear, area)")
    want = {"linear": 1, "bilinear": 2, "trilinear": 3}.get(mode)
    if want is not None and want != nd:
        raise ValueError(f"{fn}: mode {mode!r} needs a {want + 2}-D input, got shape {_fmt(input.shape)}")
    if antialias:
        raise NotImplementedError(f"{fn}: antialias=True is not supported")
    kind = _MODES[mode]
    if align_corners is not None and kind != "linear":
        raise ValueError(f"{fn}: align_corners only applies to the linear modes, not {mode!r}")
    if (size is None) == (scale_factor is None):
        raise ValueError(f"{fn}: give exactly one of size and scale_factor")
    if size is not None:
        sizes = [size] * nd if isinstance(size, (int, np.integer, _core.Expr, str)) else list(size)
        if len(sizes) != nd:
            raise ValueError(f"{fn}: size {size!r} does not match the {nd} spatial dims of {_fmt(input.shape)}")
        sizes = [_core.to_expr(s) for s in sizes]
        if any(s.is_const() and int(s) <= 0 for s in sizes):
            raise ValueError(f"{fn}: sizes must be positive, got {size!r}")
        factors = [None] * nd
    else:
        factors = [scale_factor] * nd if isinstance(scale_factor, (int, float)) else list(scale_factor)
        if len(factors) != nd or any(f <= 0 for f in factors):
            raise ValueError(f"{fn}: scale_factor {scale_factor!r} must be positive, one per spatial dim of "
                             f"{_fmt(input.shape)}")
        sizes = []
        for n, f in zip(input.shape[2:], factors):
            if _const(n) is None:
                if float(f) != int(f):
                    raise ValueError(f"{fn}: a fractional scale_factor needs constant sizes, got {_fmt(input.shape)}")
                sizes.append(_core.to_expr(n) * int(f))
            else:
                sizes.append(_core.Expr(int(math.floor(float(_const(n)) * float(f)))))
    if kind == "area":
        return _adaptive(input, sizes, nd, "mean", fn)
    out_dtype = input.dtype
    x = input if input.dtype.is_float else input.float()
    for i in reversed(range(nd)):  # separable: the innermost dim first, as torch's kernels combine them
        x = _interp_axis(x, 2 + i, sizes[i], factors[i], kind, bool(align_corners), bool(recompute_scale_factor))
    return x.to(out_dtype) if kind != "linear" or out_dtype.is_float else x


def upsample(input, size=None, scale_factor=None, mode="nearest", align_corners=None):
    return interpolate(input, size, scale_factor, mode, align_corners)


# ---- im2col ----------------------------------------------------------------------------------------------------------
def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    """torch.nn.functional.unfold (im2col): (N, C, H, W) -> (N, C * kh * kw, L), L the number of windows."""
    fn = "unfold"
    x, unbatched = _batched(input, 2, fn)
    k = _tuple(kernel_size, 2, "kernel_size", fn)
    d = _tuple(dilation, 2, "dilation", fn)
    p = _tuple(padding, 2, "padding", fn)
    s = _tuple(stride, 2, "stride", fn)
    for v, what in ((k, "kernel_size"), (d, "dilation"), (s, "stride")):
        _positive(v, what, fn)
    if any(v < 0 for v in p):
        raise ValueError(f"{fn}: padding must be non-negative, got {p}")
    spatial = [_core.to_expr(n) + 2 * pv for n, pv in zip(x.shape[2:], p)]
    _check_span(spatial, k, d, fn, f"input {_fmt(x.shape)}, kernel_size {k}, padding {p}")
    w = _windows(_padded(x, [(pv, pv) for pv in p]), 2, k, s, d)  # (N, C, OH, OW, kh, kw)
    n, c, oh, ow = w.layout.shape[:4]
    out = w.permute(0, 1, 4, 5, 2, 3).reshape([n, c * k[0] * k[1], oh * ow])  # a copy: the im2col matrix
    return out.squeeze(0) if unbatched else out


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """torch.nn.functional.fold (col2im), unfold's adjoint: (N, C * kh * kw, L) -> (N, C, H, W), overlapping
    windows summed. Each kernel position's plane is spread by the stride and shifted into place (views and one copy
    per position where the stride is not 1), and the planes are added."""
    fn = "fold"
    x = input
    unbatched = x.ndim == 2
    if unbatched:
        x = x.unsqueeze(0)
    if x.ndim != 3:
        raise ValueError(f"{fn}: expected a 2-D or 3-D input, got shape {_fmt(input.shape)}")
    size = _tuple(output_size, 2, "output_size", fn)
    k = _tuple(kernel_size, 2, "kernel_size", fn)
    d = _tuple(dilation, 2, "dilation", fn)
    p = _tuple(padding, 2, "padding", fn)
    s = _tuple(stride, 2, "stride", fn)
    for v, what in ((k, "kernel_size"), (d, "dilation"), (s, "stride"), (size, "output_size")):
        _positive(v, what, fn)
    if any(v < 0 for v in p):
        raise ValueError(f"{fn}: padding must be non-negative, got {p}")
    blocks = [(size[i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(2)]
    ckk, L = _const(x.shape[1]), _const(x.shape[2])
    if ckk is None or ckk % (k[0] * k[1]):
        raise ValueError(f"{fn}: dim 1 of input {_fmt(x.shape)} must be a multiple of kernel_size {k}")
    if min(blocks) <= 0 or (L is not None and L != blocks[0] * blocks[1]):
        raise ValueError(f"{fn}: input {_fmt(x.shape)} has {L} blocks but output_size {size}, kernel_size {k}, "
                         f"padding {p}, stride {s} give {blocks[0]} x {blocks[1]}")
    n, c = x.shape[0], ckk // (k[0] * k[1])
    cols = x.reshape([n, c, k[0], k[1], blocks[0], blocks[1]])
    hp, wp = size[0] + 2 * p[0], size[1] + 2 * p[1]
    out = None
    for i in range(k[0]):
        for j in range(k[1]):
            plane = cols[:, :, i, j]  # (N, C, bh, bw)
            plane = _zero_insert(_zero_insert(plane, 2, s[0]), 3, s[1])
            top, left = i * d[0], j * d[1]
            bottom = hp - top - ((blocks[0] - 1) * s[0] + 1)
            right = wp - left - ((blocks[1] - 1) * s[1] + 1)
            plane = plane.pad((left, right, top, bottom))
            out = plane if out is None else out + plane
    out = out[:, :, p[0]:p[0] + size[0], p[1]:p[1] + size[1]]
    return out.squeeze(0) if unbatched else out


def pixel_shuffle(input, upscale_factor: int):
    """(*, C r^2, H, W) -> (*, C, H r, W r)."""
    r = int(upscale_factor)
    x = input
    if x.ndim < 3 or r <= 0 or _const(x.shape[-3]) is None or _const(x.shape[-3]) % (r * r):
        raise ValueError(f"pixel_shuffle: dim -3 of shape {_fmt(x.shape)} must be a multiple of "
                         f"upscale_factor^2 = {r * r}")
    *lead, c, h, w = x.layout.shape
    y = x.reshape(list(lead) + [c // (r * r), _core.Expr(r), _core.Expr(r), h, w])
    b = len(lead)
    y = y.permute(list(range(b)) + [b, b + 3, b + 1, b + 4, b + 2])
    return y.reshape(list(lead) + [c // (r * r), h * r, w * r])


def pixel_unshuffle(input, downscale_factor: int):
    """(*, C, H r, W r) -> (*, C r^2, H, W)."""
    r = int(downscale_factor)
    x = input
    if x.ndim < 3 or r <= 0 or any(_const(d) is None or _const(d) % r for d in x.shape[-2:]):
        raise ValueError(f"pixel_unshuffle: the last two dims of shape {_fmt(x.shape)} must be multiples of "
                         f"downscale_factor = {r}")
    *lead, c, h, w = x.layout.shape
    b = len(lead)
    y = x.reshape(list(lead) + [c, h // r, _core.Expr(r), w // r, _core.Expr(r)])
    y = y.permute(list(range(b)) + [b, b + 2, b + 4, b + 1, b + 3])
    return y.reshape(list(lead) + [c * r * r, h // r, w // r])
