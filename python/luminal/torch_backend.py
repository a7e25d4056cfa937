"""torch.compile(model, backend="luminal"): the graphs dynamo captures, lowered by AOT autograd to the core aten
opset, translated node by node into luminal graphs; what luminal cannot translate runs in torch.

Three parts, in this order:
- the translation table (ATEN): aten overload -> a function over luminal tensors taking the overload's arguments;
- partitioning: a dry run of the translation finds each node it cannot take (no entry, a dtype luminal lacks, an
  entry that refuses its arguments or gives a shape torch disagrees with); CapabilityBasedPartitioner puts the rest
  into luminal submodules, the refused nodes stay in torch;
- the runtime (LuminalGraph): one luminal Graph per FX graph (or partition), compiled once; each call sets the
  inputs that changed, executes and hands the results back as torch tensors.

The public names live in `luminal.torch` (backend, explain, UnsupportedOpError).
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import operator
import warnings
from collections import Counter
from typing import Any, Callable

import numpy as np
import torch
import torch.fx as fx

from . import _core
from . import dtypes as dt
from .compiler import CPUCompiler, GenericCompiler
from .functional import arange as lm_arange
from .functional import cat, embedding, full, where
from . import graph as graph_module
from .graph import Graph, default_graph
from .tensor import Tensor, _scalar

aten = torch.ops.aten
UnsupportedOpError = _core.UnsupportedOpError

# How many FX graphs the backend compiled ("graphs") and how many luminal graphs it built ("luminal_graphs"): the
# dynamic-shape tests count recompilations with it.
COUNTERS: Counter = Counter()

# ================================================================================================================
# dtypes and symbolic sizes
# ================================================================================================================
# torch dtype -> luminal dtype (luminal has no 64-bit types: int64 values travel as int32).
_DTYPES = {torch.float32: dt.float32, torch.float16: dt.float16, torch.bfloat16: dt.bfloat16,
           torch.int64: dt.int32, torch.int32: dt.int32, torch.bool: dt.bool_, torch.uint8: dt.uint8}


class _Refused(Exception):
    """A node luminal does not take: the message says why."""


def _lm_dtype(t: torch.dtype, scalar: bool = True) -> dt.DType:
    """luminal's dtype for torch's. float64 is taken as float32 for 0-d tensors (`scalar`): dynamo turns Python
    floats into float64 scalars under dynamic shapes; as an op's dtype argument it is checked by the result's."""
    if t == torch.float64 and scalar:
        return dt.float32
    d = _DTYPES.get(t)
    if d is None:
        raise _Refused(f"dtype {t} (luminal has {', '.join(dt.ALL)})")
    return d


def _val_dtype(val: torch.Tensor) -> dt.DType:
    return _lm_dtype(val.dtype, val.dim() == 0)


def _opt_dtype(t):
    return None if t is None else _lm_dtype(t)


def _sym(e) -> _core.Expr:
    """A sympy size expression from torch's shape environment as a luminal Expr (symbols keep torch's names)."""
    import sympy

    if e.is_Integer:
        return _core.Expr(int(e))
    if e.is_Symbol:
        # u*: unbacked (data-dependent) sizes; z*: float symbols, and z is the variable of luminal's Iota
        if e.name.startswith(("u", "z")):
            raise _Refused(f"data-dependent or float size {e.name}")
        return _core.Expr.var(e.name)
    args = [_sym(a) for a in e.args]
    name = type(e).__name__
    if isinstance(e, sympy.Add):
        return _fold(args, operator.add)
    if isinstance(e, sympy.Mul):
        return _fold(args, operator.mul)
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
        return _fold([args[0]] * int(e.exp), operator.mul)
    if name in ("FloorDiv", "CleanDiv") and len(args) == 2:
        return args[0] // args[1]
    if name in ("Mod", "PythonMod") and len(args) == 2:
        return args[0] % args[1]
    if name in ("Max", "Min"):
        return _fold(args, _core.Expr.max if name == "Max" else _core.Expr.min)
    raise _Refused(f"symbolic size {e} ({name})")


def _fold(args, f):
    out = args[0]
    for a in args[1:]:
        out = f(out, a)
    return out


def _dim(d) -> _core.Expr:
    """An int, a torch SymInt or a luminal Expr as an Expr."""
    if isinstance(d, _core.Expr):
        return d
    if isinstance(d, torch.SymInt):
        c = d.node.maybe_as_int()
        return _core.Expr(c) if c is not None else _sym(d.node.expr)
    if isinstance(d, (int, np.integer)) and not isinstance(d, bool):
        return _core.Expr(int(d))
    raise _Refused(f"size {d!r} is not an integer")


def _shape(val: torch.Tensor) -> list:
    return [_dim(d) for d in val.shape]


def _fmt(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


# ================================================================================================================
# The translation table: aten overload -> function over luminal tensors
# ================================================================================================================
def _axes(dim, ndim):
    """aten's optional dim lists: None or [] means every dim."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    return list(dim) if isinstance(dim, (list, tuple)) else dim


def _big(v) -> bool:
    """aten spells an open slice bound as +-2^63-1."""
    return isinstance(v, int) and abs(v) >= 2**62


def _slice(x: Tensor, dim=0, start=None, end=None, step=1) -> Tensor:
    idx = [slice(None)] * x.ndim
    start = None if _big(start) or start == 0 else start
    end = None if _big(end) else end
    idx[x._axis(dim)] = slice(start, end, step)
    return x[tuple(idx)]


def _select(x: Tensor, dim, index) -> Tensor:
    idx = [slice(None)] * x.ndim
    idx[x._axis(dim)] = index
    return x[tuple(idx)]


def _split_sizes(x: Tensor, sizes, dim=0) -> list:
    out, at = [], _core.Expr(0)
    for n in sizes:
        out.append(x.narrow(dim, at, n))
        at = at + _dim(n)
    return out


def _index_range(x: Tensor, dim, start, end, step) -> Tensor:
    """The indices start, start+step, ... below end along dim (aten's slice bounds clamped to the dim)."""
    n = x.layout.shape[x._axis(dim)]
    s = _core.Expr(0) if start is None else _dim(start)
    e = n if end is None or _big(end) else _dim(end)
    if s.is_const() and int(s) < 0:
        s = n + s
    if e.is_const() and int(e) < 0:
        e = n + e
    if e.is_const() and n.is_const():
        e = _core.Expr(min(int(e), int(n)))
    return lm_arange(s, e, int(step), graph=x.graph)


def _slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    return x.index_copy(dim, _index_range(x, dim, start, end, step), src.to(x.dtype))


def _select_scatter(x, src, dim, index):
    ax = x._axis(dim)
    i = _dim(index)
    if i.is_const() and int(i) < 0:
        i = x.layout.shape[ax] + i
    return x.index_copy(ax, lm_arange(i, i + 1, graph=x.graph), src.to(x.dtype).unsqueeze(ax))


def _view(x: Tensor, size) -> Tensor:
    shape = [_dim(d) for d in size]
    try:
        return x.reshape(shape)
    except ValueError:
        if all(d.is_const() for d in shape + list(x.layout.shape)):
            raise
        # Sizes luminal cannot prove equal ((s, t) as (2*s, t//2)); torch's guards hold them equal for every
        # input this graph runs on, and the plan checks the view against its buffer when the dims are bound.
        return x.contiguous()._with_view(_core.View.contiguous(shape))


def _cat(tensors, dim=0):
    # torch still skips 1-d empty tensors next to others (an empty cache before its first step)
    keep = [t for t in tensors if not (t.ndim == 1 and t.layout.shape[0] == 0)]
    return cat(keep or tensors, dim)


def _to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    return x.to(_lm_dtype(dtype)) if dtype is not None else x


def _fill(shape, value, d: dt.DType, graph) -> Tensor:
    if isinstance(value, _core.Expr):  # a size as a value: read through an Iota, so it follows the bound dims
        if value.is_const():
            value = int(value)
        else:
            return _scalar(graph, value, dt.int32).to(d).expand_to(shape)
    return full(shape, value, d, graph=graph)


def _full(size, value, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    d = _opt_dtype(dtype) or (dt.bool_ if isinstance(value, bool) else dt.float32 if isinstance(value, float)
                              else dt.int32)
    return _fill([_dim(s) for s in size], value, d, default_graph())


def _full_like(x, value, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _fill(list(x.layout.shape), value, _opt_dtype(dtype) or x.dtype, x.graph)


def _arange(start, end=None, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    if end is None:
        start, end = 0, start
    d = _opt_dtype(dtype)
    return lm_arange(start, end, step, dtype=d)


def _reduction(method: str, whole: bool = False):
    """sum/mean/prod over dims (x, dim, keepdim=False, *, dtype=None), or over everything (x, *, dtype=None)."""
    def f(x, dim=None, keepdim=False, dtype=None):
        if dtype is not None:
            x = x.to(_lm_dtype(dtype))
        elif method == "sum" and not x.dtype.is_float:
            x = x.to(dt.int32)  # torch sums bools and ints as int64
        return getattr(x, method)(_axes(dim, x.ndim), keepdim=keepdim)

    return (lambda x, dtype=None: f(x, dtype=dtype)) if whole else f


def _var(x, dim=None, correction=None, keepdim=False):
    c = 1 if correction is None else correction
    c = int(c) if float(c).is_integer() else c  # torch passes 1.0
    return x.var(_axes(dim, x.ndim), keepdim=keepdim, correction=c)


def _var_mean(x, dim=None, correction=None, keepdim=False):
    return _var(x, dim, correction, keepdim), x.mean(_axes(dim, x.ndim), keepdim=keepdim)


def _softmax(method: str):
    def f(x, dim, half_to_float=False):
        return getattr(x.float() if half_to_float else x, method)(dim)

    return f


def _native_layer_norm(x, normalized_shape, weight, bias, eps):
    dims = list(range(-len(normalized_shape), 0))
    xf = x.float()
    mean = xf.mean(dims, keepdim=True)
    rstd = ((xf - mean).square().mean(dims, keepdim=True) + eps).rsqrt()
    return x.layer_norm(normalized_shape, weight, bias, eps), mean, rstd


def _batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    from .normalization import batch_norm

    # The other two results are empty in inference; nothing reads them.
    return batch_norm(x, running_mean, running_var, weight, bias, False, momentum, eps), None, None


def _batch_norm_no_stats(x, weight, bias, training, momentum, eps):
    """Batch statistics (instance norm's decomposition): over every dim but the channels."""
    dims = [0] + list(range(2, x.ndim))
    xf = x.float()
    mean = xf.mean(dims, keepdim=True)
    rstd = ((xf - mean).square().mean(dims, keepdim=True) + eps).rsqrt()
    out = (xf - mean) * rstd
    shape = [1, -1] + [1] * (x.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out, mean.reshape(-1), rstd.reshape(-1)


def _sdpa(q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None, enable_gqa=False):
    from .attention import scaled_dot_product_attention

    n = k.layout.shape[-2]
    if v.ndim >= 2 and v.layout.shape[-2] != n:
        # Keys and values of lengths torch traced as two symbols (a cache's keys and values): the kernel needs them
        # equal, so read the values through a view of the keys' length (no copy; the plan checks it fits).
        v = v[(Ellipsis, slice(None, n), slice(None))]
    return scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _sdpa_cpu(q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    """torch's CPU kernel (it takes fewer key/value heads than query heads, as with enable_gqa), with the
    log-sum-exp of each score row as its second result (dead unless read)."""
    gqa = q.ndim >= 3 and k.ndim >= 3 and q.layout.shape[-3] != k.layout.shape[-3]
    out = _sdpa(q, k, v, dropout_p, is_causal, attn_mask, scale, gqa)
    if gqa:
        k = k.repeat_interleave(int(q.shape[-3]) // int(k.shape[-3]), -3)
    s = (q.float() @ k.float().transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(int(q.shape[-1])))
    if attn_mask is not None:
        s = s + (attn_mask if attn_mask.dtype is not dt.bool_ else where(attn_mask, 0.0, float("-inf")))
    elif is_causal:
        s = s + full(s.layout.shape[-2:], float("-inf"), graph=s.graph).triu(1)
    return out, s.logsumexp(-1)


def _batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """Batch norm as AOT's functional form: (out, mean, rstd, new running mean, new running variance). In
    training the batch's statistics normalise and the running ones are returned updated (torch copies them back)."""
    if not training:
        out, _, _ = _batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps)
        return out, None, None, running_mean, running_var
    out, mean, rstd = _batch_norm_no_stats(x, weight, bias, True, momentum, eps)
    n = x.numel() // x.shape[1]
    var = (rstd.square().reciprocal() - eps) * (n / max(n - 1, 1))  # unbiased, as torch keeps it
    new_mean = running_mean * (1 - momentum) + mean.to(running_mean.dtype) * momentum
    new_var = running_var * (1 - momentum) + var.to(running_var.dtype) * momentum
    return out, mean, rstd, new_mean, new_var


def _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """aten._trilinear (bilinear's core): the three inputs unsqueezed at their expand dims, multiplied, summed over
    sumdim."""
    terms = []
    for t, dims in ((i1, expand1), (i2, expand2), (i3, expand3)):
        for d in sorted(dims):
            t = t.unsqueeze(d)
        terms.append(t)
    out = terms[0] * terms[1] * terms[2]
    return out.sum(list(sumdim)) if len(sumdim) else out


def _sdpa_results(val, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """torch's GPU attention kernels (flash, efficient, cuDNN) as luminal's attention: the output, the log-sum-exp
    of each score row in the kernel's layout, and the rest (sequence offsets, RNG state, debug mask: read only by the
    backward pass) as values a node reading them is refused for."""
    if dropout_p:
        raise _Refused("attention with dropout (random)")
    out, lse = _sdpa_cpu(q, k, v, 0.0, is_causal, attn_mask, scale)
    results = [out]
    for i, want in enumerate(val[1:], 1):
        if not isinstance(want, torch.Tensor):
            results.append(_dim(want) if isinstance(want, torch.SymInt) else want)  # max_q, max_k; None
        elif want.numel() == 0:
            results.append(None)
        elif i == 1 and want.dim() == lse.ndim + 1:  # cuDNN's (..., L, 1)
            results.append(lse.unsqueeze(-1))
        elif i == 1 and _shape(want) == list(lse.layout.shape):  # flash's (..., L)
            results.append(lse)
        elif i == 1 and all(d.is_const() for d in _shape(want)[-1:] + list(lse.layout.shape)[-1:]):
            # efficient's rows padded to a multiple of 32 (the padding only the backward pass reads)
            results.append(lse.pad([0, int(_shape(want)[-1]) - int(lse.layout.shape[-1])]))
        else:
            results.append(_Missing(f"result {i} of the attention kernel (its backward pass state)"))
    return results


def _takes_val(f):
    """Marks a translation that also gets torch's fake result (`val`), to shape results luminal has no use for."""
    f.takes_val = True
    return f


@_takes_val
def _sdpa_flash(q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, scale=None, val=None):
    return _sdpa_results(val, q, k, v, None, dropout_p, is_causal, scale)


@_takes_val
def _sdpa_efficient(q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, scale=None, val=None):
    return _sdpa_results(val, q, k, v, attn_bias, dropout_p, is_causal, scale)


@_takes_val
def _sdpa_cudnn(q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                scale=None, val=None):
    return _sdpa_results(val, q, k, v, attn_bias, dropout_p, is_causal, scale)


def _native_group_norm(x, weight, bias, n, c, hw, group, eps):
    from .normalization import group_norm

    g = x.float().reshape([_dim(n), group, _dim(c) // group * _dim(hw)])  # (an empty batch has no -1 to solve)
    mean = g.mean(-1)
    rstd = (g.var(-1, correction=0) + eps).rsqrt()
    return group_norm(x, group, weight, bias, eps), mean, rstd


def _convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    from . import convolution as conv

    nd = x.ndim - 2
    if transposed:
        f = {1: conv.conv_transpose1d, 2: conv.conv_transpose2d}.get(nd)
        if f is None:
            raise _Refused(f"transposed convolution over {nd} spatial dims")
        return f(x, w, b, stride, padding, output_padding, groups, dilation)
    f = {1: conv.conv1d, 2: conv.conv2d, 3: conv.conv3d}.get(nd)
    if f is None:
        raise _Refused(f"convolution over {nd} spatial dims")
    return f(x, w, b, stride, padding, dilation, groups)


def _max_pool(nd: int):
    def f(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        from . import convolution as conv

        fn = {1: conv.max_pool1d, 2: conv.max_pool2d}.get(nd)
        if fn is None:
            raise _Refused(f"max pooling over {nd} spatial dims")
        return fn(x, kernel_size, stride or None, padding, dilation, ceil_mode, return_indices=True)

    return f


def _avg_pool(nd: int):
    def f(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
        from . import convolution as conv

        if nd == 1:
            if divisor_override is not None:
                raise _Refused("avg_pool1d with a divisor_override")
            return conv.avg_pool1d(x, kernel_size, stride or None, padding, ceil_mode, count_include_pad)
        return conv.avg_pool2d(x, kernel_size, stride or None, padding, ceil_mode, count_include_pad,
                               divisor_override)

    return f


def _adaptive(name: str, indices: bool = False):
    def f(x, output_size):
        from . import convolution as conv

        fn = getattr(conv, name)
        return fn(x, output_size, return_indices=True) if indices else fn(x, output_size)

    return f


def _upsample(mode: str, overload: str):
    """upsample_*.vec (input, output_size, [align_corners,] scale_factors) and .default (input, output_size,
    [align_corners,] scales_h=None, scales_w=None)."""
    def f(x, output_size, *rest):
        from .convolution import interpolate

        align = rest[0] if mode != "nearest" else None
        scales = rest[1:] if mode != "nearest" else rest
        if overload == "vec":
            scales = scales[0] if scales else None
            if output_size is None:
                return interpolate(x, scale_factor=list(scales), mode=mode, align_corners=align)
        elif any(v is not None for v in scales):
            raise _Refused("upsampling with both an output size and scales")  # the scales would set the grid
        return interpolate(x, size=list(output_size), mode=mode, align_corners=align)

    return f


def _pad_mode(mode: str):
    return lambda x, pad: x.pad(list(pad), mode=mode)


def _index(x, indices):
    return x[tuple(slice(None) if i is None else i for i in indices)]


def _index_put(x, indices, values, accumulate=False):
    """aten.index_put: None stands for a whole dim (`cache[:, :, pos] = k` is [None, None, pos]). luminal's
    index_put indexes the leading dims, so the indexed dims move first and back after."""
    from .indexing import index_put
    from .tensor import broadcast_shapes

    at = [d for d, t in enumerate(indices) if t is not None]
    if at == list(range(len(at))):
        return index_put(x, tuple(indices[:len(at)]), values, accumulate)
    idx = [indices[d] for d in at]
    rest = [d for d in range(x.ndim) if d not in at]
    shape = list(x.layout.shape)
    bshape = idx[0].layout.shape
    for t in idx[1:]:
        bshape = broadcast_shapes(bshape, t.layout.shape, "index_put")
    nb = len(bshape)
    if not isinstance(values, Tensor):
        values = _fill([], values, x.dtype, x.graph)
    if at == list(range(at[0], at[-1] + 1)):
        # adjacent indexed dims: torch puts the indexed shape where they were
        v = values.expand_to(shape[:at[0]] + list(bshape) + shape[at[-1] + 1:])
        v = v.movedim(list(range(at[0], at[0] + nb)), list(range(nb)))
    else:  # apart: the indexed shape comes first
        v = values.expand_to(list(bshape) + [shape[d] for d in rest])
    perm = at + rest
    out = index_put(x.permute(perm), tuple(idx), v, accumulate)
    return out.permute([perm.index(d) for d in range(x.ndim)])


def _gelu(x, approximate="none"):
    return x.gelu(approximate)


def _elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    if scale == 1 and input_scale == 1:
        return x.elu(alpha)
    # selu's form: scale * (x where x > 0, else alpha * (exp(x * input_scale) - 1))
    return (x.relu() + (x.minimum(0) * input_scale).expm1() * alpha) * scale


def _dropout(x, p, train):
    if train and p > 0:
        raise _Refused("dropout in training mode (random)")
    return x, full(x.layout.shape, 1, dt.bool_, graph=x.graph)


def _round(x, decimals=0):
    if decimals == 0:
        return x.round()
    s = 10.0 ** decimals
    return (x * s).round() / s


def _logical(name: str):
    def f(a, b):
        if a.dtype is dt.bool_ and (not isinstance(b, Tensor) or b.dtype is dt.bool_):
            return getattr(a, f"logical_{name}")(b)
        return getattr(a, f"bitwise_{name}")(b)

    return f


def _bitwise_not(x):
    return x.logical_not() if x.dtype is dt.bool_ else x.bitwise_not()


def _fn(name: str) -> Callable:
    """luminal's function of torch's name, taking aten's arguments."""
    def f(*args, **kwargs):
        import luminal

        return getattr(luminal, name)(*args, **kwargs)

    return f


def _pdist(x, p=2.0):
    from .nn.functional import pdist

    return pdist(x, p)


def _indices(name: str):
    def f(row, col, offset=0, dtype=None, layout=None, device=None, pin_memory=None):
        return _fn(name)(row, col, offset, dtype=_opt_dtype(dtype) or dt.int32, graph=default_graph())

    return f


def _copy(dst, src, non_blocking=False):
    return src.to(dst.dtype).expand_to(dst.layout.shape)


def _m(name: str) -> Callable:
    """aten's overload whose arguments match Tensor.<name>'s. A number (or size) in the tensor's place, as
    decompositions write `sub(5, t)`, becomes a 0-d tensor of the other operand's kind."""
    def f(x, *args, **kwargs):
        if not isinstance(x, Tensor) and args and isinstance(args[0], Tensor):
            x = _fill([], x, args[0].dtype if not isinstance(x, float) or args[0].dtype.is_float else dt.float32,
                      args[0].graph)
        return getattr(x, name)(*args, **kwargs)

    f.__name__ = name
    return f


def _ix(name: str) -> Callable:
    def f(*args, **kwargs):
        from . import indexing

        return getattr(indexing, name)(*args, **kwargs)

    return f


def _noop(*args, **kwargs):
    return None


# Ops whose size argument is replaced by torch's result shape.
_SIZED = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default,
          aten.view_copy.default}

ATEN: dict[Any, Callable] = {
    # ---- arithmetic and math (Tensor methods) -------------------------------------------------------------------
    aten.add.Tensor: _m("add"), aten.add.Scalar: _m("add"),
    aten.sub.Tensor: _m("sub"), aten.sub.Scalar: _m("sub"), aten.rsub.Scalar: _m("rsub"), aten.rsub.Tensor: _m("rsub"),
    aten.mul.Tensor: _m("mul"), aten.mul.Scalar: _m("mul"),
    aten.div.Tensor: _m("div"), aten.div.Scalar: _m("div"), aten.true_divide.Tensor: _m("div"),
    aten.div.Tensor_mode: _m("div"), aten.div.Scalar_mode: _m("div"),
    aten.pow.Tensor_Scalar: _m("pow"), aten.pow.Tensor_Tensor: _m("pow"),
    aten.pow.Scalar: lambda s, e: e.__rpow__(s),
    aten.fmod.Tensor: _m("fmod"), aten.fmod.Scalar: _m("fmod"),
    aten.remainder.Tensor: _m("remainder"), aten.remainder.Scalar: _m("remainder"),
    aten.maximum.default: _m("maximum"), aten.minimum.default: _m("minimum"),
    aten.atan2.default: _m("atan2"),
    aten.clamp.default: _m("clamp"), aten.clamp.Tensor: _m("clamp"),
    aten.clamp_min.default: _m("clamp_min"), aten.clamp_max.default: _m("clamp_max"),
    aten.lerp.Scalar: _m("lerp"), aten.lerp.Tensor: _m("lerp"),
    aten.round.default: _round, aten.round.decimals: _round,
    aten.nan_to_num.default: _m("nan_to_num"),
    **{getattr(aten, n).default: _m(n) for n in (
        "abs", "neg", "reciprocal", "sqrt", "rsqrt", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin",
        "cos", "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "erf", "sigmoid",
        "sign", "floor", "ceil", "trunc", "frac", "relu", "isnan", "isinf", "isposinf", "isneginf", "logical_not",
        "hardswish", "hardsigmoid", "mish", "silu", "logit", "erfc", "erfinv", "lgamma", "digamma", "i0")},
    **{getattr(aten, n).default: _m(n) for n in ("fmax", "fmin", "hypot", "gcd", "lcm")},
    aten.copysign.Tensor: _m("copysign"), aten.copysign.Scalar: _m("copysign"), aten.ldexp.Tensor: _m("ldexp"),
    aten.polygamma.default: lambda n, x: x.polygamma(n), aten.frexp.Tensor: _m("frexp"),
    # ---- activations with arguments -----------------------------------------------------------------------------
    aten.gelu.default: _gelu, aten.hardtanh.default: _m("hardtanh"), aten.leaky_relu.default: _m("leaky_relu"),
    aten.elu.default: _elu, aten.softplus.default: _m("softplus"), aten.threshold.default: _m("threshold"),
    aten.native_dropout.default: _dropout,
    # ---- comparisons and logic --------------------------------------------------------------------------------
    **{getattr(aten, n).Tensor: _m(n) for n in ("eq", "ne", "lt", "le", "gt", "ge")},
    **{getattr(aten, n).Scalar: _m(n) for n in ("eq", "ne", "lt", "le", "gt", "ge")},
    aten.logical_and.default: _m("logical_and"), aten.logical_or.default: _m("logical_or"),
    aten.logical_xor.default: _m("logical_xor"),
    aten.bitwise_and.Tensor: _logical("and"), aten.bitwise_or.Tensor: _logical("or"),
    aten.bitwise_xor.Tensor: _logical("xor"), aten.bitwise_not.default: _bitwise_not,
    aten.bitwise_and.Scalar: _logical("and"), aten.bitwise_or.Scalar: _logical("or"),
    aten.bitwise_xor.Scalar: _logical("xor"),
    aten.bitwise_left_shift.Tensor: _m("bitwise_left_shift"), aten.bitwise_right_shift.Tensor: _m(
        "bitwise_right_shift"),
    aten.signbit.default: _m("signbit"),
    aten.where.self: where,
    aten.masked_fill.Scalar: _m("masked_fill"), aten.masked_fill.Tensor: _m("masked_fill"),
    # ---- reductions and scans -----------------------------------------------------------------------------------
    **{getattr(aten, n).default: _reduction(n, whole=True) for n in ("sum", "mean", "prod")},
    aten.sum.dim_IntList: _reduction("sum"), aten.mean.dim: _reduction("mean"), aten.prod.dim_int: _reduction("prod"),
    aten.amax.default: lambda x, dim=(), keepdim=False: x.amax(_axes(dim, x.ndim), keepdim),
    aten.amin.default: lambda x, dim=(), keepdim=False: x.amin(_axes(dim, x.ndim), keepdim),
    aten.max.dim: _m("max"), aten.min.dim: _m("min"), aten.max.default: _m("max"), aten.min.default: _m("min"),
    aten.argmax.default: _m("argmax"), aten.argmin.default: _m("argmin"),
    aten.any.dim: _m("any"), aten.any.dims: lambda x, dim=None, keepdim=False: x.any(_axes(dim, x.ndim), keepdim),
    aten.any.default: _m("any"),
    aten.all.dim: _m("all"), aten.all.dims: lambda x, dim=None, keepdim=False: x.all(_axes(dim, x.ndim), keepdim),
    aten.all.default: _m("all"),
    aten.var.correction: _var, aten.var_mean.correction: _var_mean,
    aten.logsumexp.default: _m("logsumexp"),
    aten.linalg_vector_norm.default: lambda x, ord=2, dim=None, keepdim=False, dtype=None: x.norm(
        ord, _axes(dim, x.ndim), keepdim, _opt_dtype(dtype)),
    aten.cumsum.default: lambda x, dim, dtype=None: (x.to(_lm_dtype(dtype)) if dtype else x).cumsum(dim),
    aten.cumprod.default: lambda x, dim, dtype=None: (x.to(_lm_dtype(dtype)) if dtype else x).cumprod(dim),
    aten._softmax.default: _softmax("softmax"), aten._log_softmax.default: _softmax("log_softmax"),
    aten.cummax.default: _m("cummax"), aten.cummin.default: _m("cummin"),
    aten.logcumsumexp.default: _m("logcumsumexp"),
    aten.kthvalue.default: _m("kthvalue"), aten.mode.default: _m("mode"),
    aten.median.default: _m("median"), aten.median.dim: _m("median"),
    aten.nanmedian.default: _m("nanmedian"), aten.nanmedian.dim: _m("nanmedian"),
    aten.histc.default: _m("histc"), aten.dist.default: _m("dist"),
    aten._cdist_forward.default: lambda x1, x2, p, compute_mode=None: _fn("cdist")(x1, x2, p),
    aten._pdist_forward.default: _pdist,
    aten.bucketize.Tensor: lambda x, boundaries, out_int32=False, right=False: _fn("bucketize")(
        x, boundaries, out_int32=out_int32, right=right),
    aten.searchsorted.Tensor: lambda seq, x, out_int32=False, right=False, side=None, sorter=None: _fn(
        "searchsorted")(seq, x, out_int32=out_int32, right=right, side=side, sorter=sorter),
    # ---- linear algebra ----------------------------------------------------------------------------------------
    aten.mm.default: _m("mm"), aten.bmm.default: _m("bmm"), aten.mv.default: _m("mv"), aten.dot.default: _m("dot"),
    aten.addmm.default: _m("addmm"), aten.addmv.default: _m("addmv"), aten.baddbmm.default: _m("baddbmm"),
    aten.addbmm.default: _m("addbmm"),
    # ---- movement (views) -------------------------------------------------------------------------------------
    aten.view.default: _view, aten._unsafe_view.default: _view, aten.reshape.default: _view,
    aten.permute.default: _m("permute"),
    aten.expand.default: lambda x, size, implicit=False: x.expand([_dim(d) for d in size]),
    aten.unsqueeze.default: _m("unsqueeze"),
    aten.squeeze.dim: _m("squeeze"), aten.squeeze.dims: _m("squeeze"), aten.squeeze.default: _m("squeeze"),
    aten.slice.Tensor: _slice, aten.select.int: _select,
    aten.split_with_sizes.default: _split_sizes, aten.split.Tensor: _m("split"),
    aten.cat.default: _cat,
    aten.clone.default: lambda x, memory_format=None: x,
    aten.alias.default: lambda x: x, aten.lift_fresh_copy.default: lambda x: x, aten.detach.default: lambda x: x,
    aten._to_copy.default: _to_copy, aten.copy.default: _copy,
    torch.ops.prims.convert_element_type.default: lambda x, dtype: x.to(_lm_dtype(dtype)),
    aten.flip.default: _m("flip"), aten.repeat.default: _m("repeat"),
    aten.roll.default: lambda x, shifts, dims=(): x.roll(shifts, list(dims) or None),  # no dims: the flat tensor
    aten.constant_pad_nd.default: lambda x, pad, value=0: x.pad(list(pad), value),
    aten.reflection_pad1d.default: _pad_mode("reflect"), aten.reflection_pad2d.default: _pad_mode("reflect"),
    aten.replication_pad1d.default: _pad_mode("replicate"), aten.replication_pad2d.default: _pad_mode("replicate"),
    aten.tril.default: _m("tril"), aten.triu.default: _m("triu"),
    aten.diagonal.default: _m("diagonal"), aten.unfold.default: _m("unfold"),
    aten.view_copy.default: _view, aten.permute_copy.default: _m("permute"),
    aten.narrow_copy.default: _m("narrow"), aten.unbind_copy.int: _m("unbind"),
    # ---- gathers and scatters ---------------------------------------------------------------------------------
    aten.embedding.default: lambda w, idx, padding_idx=-1, scale_grad_by_freq=False, sparse=False: embedding(idx, w),
    aten.index_select.default: _m("index_select"),
    aten.gather.default: lambda x, dim, index, sparse_grad=False: x.gather(dim, index),
    aten.index.Tensor: _index, aten.index_put.default: _index_put,
    aten.index_copy.default: _m("index_copy"),
    aten.scatter.src: _ix("scatter"), aten.scatter.value: lambda x, dim, idx, value: _ix("scatter")(
        x, dim, idx, value=value),
    aten.scatter_add.default: _ix("scatter_add"), aten.scatter_reduce.two: _ix("scatter_reduce"),
    aten.slice_scatter.default: _slice_scatter, aten.select_scatter.default: _select_scatter,
    aten.sort.default: _ix("sort"), aten.topk.default: _ix("topk"),
    aten.sort.stable: lambda x, stable=None, dim=-1, descending=False: _ix("sort")(x, dim, descending,
                                                                                  stable=bool(stable)),
    aten.scatter.reduce: lambda x, dim, idx, src, reduce: _ix("scatter")(x, dim, idx, src, reduce=reduce),
    aten.scatter.value_reduce: lambda x, dim, idx, value, reduce: _ix("scatter")(x, dim, idx, value=value,
                                                                                 reduce=reduce),
    aten.diagonal_scatter.default: _m("diagonal_scatter"), aten.masked_scatter.default: _m("masked_scatter"),
    aten.put.default: _m("put"), aten.index_reduce.default: _m("index_reduce"),
    # ---- factories --------------------------------------------------------------------------------------------
    aten.full.default: _full, aten.full_like.default: _full_like,
    aten.zeros_like.default: lambda x, **k: _full_like(x, 0, **k),
    aten.ones_like.default: lambda x, **k: _full_like(x, 1, **k),
    aten.empty_like.default: lambda x, **k: _full_like(x, 0, **k),  # contents undefined: zeros are fine
    aten.empty.memory_format: lambda size, **k: _full(size, 0, **k),
    aten.empty_strided.default: lambda size, stride, **k: _full(size, 0, **k),
    aten.empty_permuted.default: lambda size, physical_layout, **k: _full(size, 0, **k),
    aten.tril_indices.default: _indices("tril_indices"), aten.triu_indices.default: _indices("triu_indices"),
    aten.scalar_tensor.default: lambda s, **k: _full([], s, **k),
    aten.fill.Scalar: lambda x, v: _full_like(x, v),
    aten.arange.default: _arange, aten.arange.start: _arange, aten.arange.start_step: _arange,
    # ---- neural-network ops -----------------------------------------------------------------------------------
    aten.convolution.default: _convolution,
    aten._native_batch_norm_legit_no_training.default: _batch_norm_no_training,
    aten.native_layer_norm.default: _native_layer_norm,
    aten.native_group_norm.default: _native_group_norm,
    aten.scaled_dot_product_attention.default: _sdpa,
    aten._scaled_dot_product_flash_attention_for_cpu.default: _sdpa_cpu,
    aten._scaled_dot_product_flash_attention.default: _sdpa_flash,
    aten._scaled_dot_product_efficient_attention.default: _sdpa_efficient,
    aten._scaled_dot_product_cudnn_attention.default: _sdpa_cudnn,
    aten._native_batch_norm_legit.no_stats: _batch_norm_no_stats,
    aten._native_batch_norm_legit_functional.default: _batch_norm_functional,
    aten._trilinear.default: _trilinear,
    aten.max_pool2d_with_indices.default: _max_pool(2), aten.max_pool3d_with_indices.default: _max_pool(3),
    aten.avg_pool1d.default: _avg_pool(1), aten.avg_pool2d.default: _avg_pool(2),
    aten._adaptive_avg_pool2d.default: _adaptive("adaptive_avg_pool2d"),
    aten.adaptive_max_pool1d.default: _adaptive("adaptive_max_pool1d", True),
    aten.adaptive_max_pool2d.default: _adaptive("adaptive_max_pool2d", True),
    aten.upsample_nearest2d.vec: _upsample("nearest", "vec"),
    aten.upsample_nearest2d.default: _upsample("nearest", "default"),
    aten.upsample_bilinear2d.vec: _upsample("bilinear", "vec"),
    aten.upsample_bilinear2d.default: _upsample("bilinear", "default"),
    # ---- sizes and asserts (dynamic shapes) ---------------------------------------------------------------------
    aten.sym_size.int: lambda x, d: x.layout.shape[x._axis(d)],
    aten.sym_numel.default: lambda x: _dim(x.numel()),
    aten._assert_scalar.default: _noop, aten._assert_tensor_metadata.default: _noop,
    aten.sym_constrain_range_for_size.default: _noop,
    # ---- Python operators on results (tuples) and on sizes -------------------------------------------------
    operator.getitem: operator.getitem,
    operator.add: operator.add, operator.sub: operator.sub, operator.mul: operator.mul,
    operator.floordiv: operator.floordiv, operator.mod: operator.mod, operator.neg: operator.neg,
}


# ================================================================================================================
# Translating one FX graph
# ================================================================================================================
@dataclasses.dataclass
class Fallback:
    """A node left to torch: its op (aten.lgamma.default), the FX node's name and why; `stack` is the user code
    that made it (the FX node's stack trace, where dynamo kept one)."""
    op: str
    node: str
    reason: str
    stack: str = dataclasses.field(default="", repr=False)

    @property
    def where(self) -> str:
        """The innermost source line of the stack ("file", line n), or ""."""
        frames = [ln.strip() for ln in self.stack.splitlines() if ln.strip().startswith("File ")]
        return frames[-1].split(", in ")[0][len("File "):] if frames else ""


def _op_name(node: fx.Node) -> str:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return f"aten.{t.__name__}" if t.namespace == "aten" else f"{t.namespace}.{t.__name__}"
    return getattr(t, "__name__", str(t))


class _Missing:
    """A value luminal cannot hold (a tensor of a dtype it lacks, the result of a node left to torch)."""

    def __init__(self, reason: str):
        self.reason = reason


def _hints(gm: fx.GraphModule) -> dict[str, int]:
    """Example values of the graph's size symbols (to compare symbolic shapes that are equal but spelled apart)."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        for v in ([val] if isinstance(val, torch.SymInt) else
                  list(val.shape) if isinstance(val, torch.Tensor) else []):
            if isinstance(v, torch.SymInt) and v.node.shape_env is not None:
                env = v.node.shape_env
                vals = getattr(env, "backed_var_to_val", None) or env.var_to_val
                return {str(k): int(x) for k, x in vals.items()}
    return {}


def _same_dim(a: _core.Expr, b: _core.Expr, hints: dict) -> bool:
    if a == b:
        return True
    names = set(a.vars()) | set(b.vars())
    if not names or not all(n in hints for n in names):
        return False
    # Equal at the example sizes and at larger ones, each symbol moved apart from the others (two symbols equal in
    # the example are not equal for every input): the same polynomial (floor divisions included) in practice.
    for k, c in ((1, 0), (1, 1), (2, 3), (5, 7)):
        env = {n: hints[n] * k + c * (j + 1) for j, n in enumerate(sorted(names))}
        if a.eval(env) != b.eval(env):
            return False
    return True


class _Translator:
    """Walks an FX graph of aten ops and records it into a luminal Graph.

    strict: the first node it cannot take raises _Refused. Otherwise (the dry run) it records the node and goes on,
    standing an input of the node's shape in for its result, as a partition boundary would."""

    def __init__(self, gm: fx.GraphModule, strict: bool):
        self.gm, self.strict = gm, strict
        self.device = _device_of(gm).type  # a tensor elsewhere (a copy to another device) stays in torch
        prev = getattr(graph_module._current, "graph", None)
        self.cx = Graph()
        graph_module._current.graph = prev  # a new Graph becomes the default one: keep the caller's
        self.env: dict[fx.Node, Any] = {}
        self.inputs: list[tuple[fx.Node, Any]] = []  # placeholders in order: (node, luminal Tensor | Expr | None)
        self.refused: dict[fx.Node, str] = {}
        self.hints = _hints(gm)
        self.outputs: list = []  # luminal values the graph returns (Tensors marked as outputs, Exprs, constants)
        self.out_dtypes: list = []  # the torch dtype of each returned tensor (None elsewhere)
        self.constants: list[torch.Tensor] = []  # get_attr tensors kept alive (the graph holds numpy views)

    def run(self):
        with self.cx:
            for node in self.gm.graph.nodes:
                if node.op == "output":
                    self._output(node)
                    continue
                try:
                    self.env[node] = self._node(node)
                except Exception as e:  # noqa: BLE001 - any failure to translate means torch runs the node
                    reason = str(e) if isinstance(e, _Refused) else f"{type(e).__name__}: {e}"
                    if node.target is operator.getitem and not node.users:  # a result nothing reads
                        self.env[node] = _Missing(reason)
                        continue
                    if self.strict:
                        raise _Refused(f"{_op_name(node)} ({node.name}): {reason}") from e
                    self.refused[node] = reason
                    self.env[node] = self._stand_in(node.meta.get("val"), node.name, reason)
        return self

    # ---- one node ----------------------------------------------------------------------------------------------
    def _node(self, node: fx.Node):
        val = node.meta.get("val")
        if node.op == "placeholder":
            v = self._stand_in(val, node.name, "")
            if isinstance(v, _Missing):
                v = _Missing(f"input {node.name} is {v.reason}")
            self.inputs.append((node, v))
            return v
        if node.op == "get_attr":
            t = getattr(self.gm, node.target)
            if not isinstance(t, torch.Tensor):
                raise _Refused(f"attribute {node.target} is a {type(t).__name__}")
            x = self.cx.tensor(_shape(t), _val_dtype(t), name=node.name)
            self.constants.append(t)
            x.set(_host_array(t))
            return x
        if node.op != "call_function":
            raise _Refused(f"FX {node.op} node")
        fn = ATEN.get(node.target)
        if fn is None:
            raise _Refused("no luminal translation")
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: self.env[n])
        if node.target in _SIZED and isinstance(val, torch.Tensor):
            args = (args[0], _shape(val))  # torch's solved sizes: a -1 over symbolic dims is already divided out
        # a getitem reads one result of a node: only that one must be a value luminal has
        picked = node.target is operator.getitem and isinstance(args[0], (list, tuple))
        missing = _first_missing(args[0][args[1]] if picked else (args, kwargs))
        if missing is not None:
            raise _Refused(missing.reason)
        if node.target is operator.getitem and isinstance(node.args[0], fx.Node) and node.args[0] in self.refused:
            raise _Refused("reads a result of a node left to torch")
        if getattr(fn, "takes_val", False):
            kwargs = {**kwargs, "val": val}
        out = fn(*args, **kwargs)
        return self._conform(out, val)

    def _stand_in(self, val, name: str, reason: str):
        """A graph input holding `val` (a fake tensor), or a size, or _Missing for what luminal cannot hold."""
        if isinstance(val, torch.Tensor):
            try:
                return self.cx.tensor(_shape(val), _val_dtype(val), name=name)
            except _Refused as e:
                return _Missing(str(e))
        if isinstance(val, torch.SymInt):
            try:
                return _dim(val)
            except _Refused as e:
                return _Missing(str(e))
        if isinstance(val, (tuple, list)):
            return type(val)(self._stand_in(v, f"{name}_{i}", reason) for i, v in enumerate(val))
        if isinstance(val, (int, float, bool)) or val is None:
            return val
        return _Missing(reason or f"a value of type {type(val).__name__}")

    def _conform(self, out, val):
        """Checks a translation against torch's fake result (shape, where symbolic at the example sizes) and casts
        it to torch's dtype (luminal's binary ops promote a 0-d operand where torch does not)."""
        if isinstance(val, torch.Tensor):
            if not isinstance(out, Tensor):
                raise _Refused(f"translation gave {type(out).__name__}, torch a tensor")
            if val.device.type != self.device:
                raise _Refused(f"a tensor on {val.device}")
            want = _shape(val)
            have = list(out.layout.shape)
            if len(want) != len(have) or not all(_same_dim(a, b, self.hints) for a, b in zip(have, want)):
                raise _Refused(f"luminal's shape {_fmt(have)} differs from torch's {_fmt(want)}")
            d = _val_dtype(val)
            return out if out.dtype is d else out.to(d)
        if isinstance(val, (tuple, list)):
            if not isinstance(out, (tuple, list)) or len(out) != len(val):
                raise _Refused(f"translation gave {type(out).__name__}, torch {len(val)} results")
            return [o if isinstance(o, _Missing) or o is None and isinstance(v, torch.Tensor) and v.numel() == 0
                    else self._conform(o, v)
                    for o, v in zip(out, val)]
        return out

    def _output(self, node: fx.Node):
        (results,) = node.args
        for r in results if isinstance(results, (list, tuple)) else [results]:
            v = self.env[r] if isinstance(r, fx.Node) else r
            if isinstance(v, _Missing):
                if self.strict:
                    raise _Refused(f"output {r}: {v.reason}")
                self.outputs.append(v)
                self.out_dtypes.append(None)
            elif isinstance(v, Tensor):
                self.outputs.append(v.output())
                self.out_dtypes.append(r.meta["val"].dtype)
            else:
                self.outputs.append(v)
                self.out_dtypes.append(None)


def _first_missing(tree):
    found = []
    fx.node.map_aggregate(tree, lambda a: found.append(a) if isinstance(a, _Missing) else None)
    return found[0] if found else None


# ================================================================================================================
# The runtime: one compiled luminal graph called like the FX graph it came from
# ================================================================================================================
def _host_array(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's data for Tensor.set: a view where the dtype allows (float32, float16, int32, bool, uint8)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.float().numpy()  # Graph.set rounds float32 to bfloat16 bits
    a = t.numpy()
    return a.astype(np.int32) if a.dtype == np.int64 else a


class _Input:
    """One argument of a LuminalGraph: a tensor input, or a size binding `symbol` (the argument is a * symbol + b),
    or nothing to do (a size the graph does not need)."""
    __slots__ = ("tensor", "symbol", "a", "b", "dtype", "device", "last", "version", "ptr")

    def __init__(self, tensor=None, dtype=None, device=None, size: _core.Expr | None = None):
        self.tensor, self.dtype, self.device = tensor, dtype, device
        self.symbol = None
        self.last = self.version = self.ptr = None
        if size is not None and len(size.vars()) == 1:
            self.symbol = size.vars()[0]
            self.b = size.substitute(self.symbol, 0).eval({})
            self.a = size.substitute(self.symbol, 1).eval({}) - self.b
            if self.a == 0:
                self.symbol = None

    def bind(self, cx: Graph, value: int):
        n = int(value) - self.b
        if n % self.a:
            raise ValueError(f"size argument {value} is not {self.a} * {self.symbol} + {self.b}")
        cx.set_dim(self.symbol, n // self.a)


# DeviceArray dtypes as __cuda_array_interface__ type strings (bfloat16, which the interface lacks, as its bits).
_TYPESTR = {"float32": "<f4", "float16": "<f2", "bfloat16": "<i2", "int32": "<i4", "uint8": "|u1", "bool": "|b1"}


class _CudaArrayView:
    """A luminal DeviceArray behind __cuda_array_interface__: torch.as_tensor reads it in place (no copy) and keeps
    this object, and so the array, alive as long as the tensor."""

    def __init__(self, a):
        self.array = a
        self.__cuda_array_interface__ = {"shape": tuple(a.shape), "typestr": _TYPESTR[a.dtype],
                                         "data": (a.ptr, False), "strides": None, "version": 2}


def _torch_from_device(a, device: torch.device) -> torch.Tensor:
    """A luminal CUDA result as a torch CUDA tensor over the same memory."""
    t = torch.as_tensor(_CudaArrayView(a), device=device)
    return t.view(torch.bfloat16) if a.dtype == "bfloat16" else t


def _weights_dtype(gm: fx.GraphModule) -> str:
    """The CUDA backend's weight dtype when the options give none: the float dtype holding most of the graph's
    input elements (a model cast to half precision keeps its weights in it)."""
    sizes: Counter = Counter()
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder" and isinstance(val, torch.Tensor) and val.dtype in (
                torch.float32, torch.float16, torch.bfloat16):
            n = val.numel()
            sizes[val.dtype] += int(n) if isinstance(n, int) else 1  # a symbolic size counts little
    top = max(sizes, key=sizes.get) if sizes else torch.float32
    return str(top).replace("torch.", "")


class LuminalGraph:
    """An FX graph of aten ops run by luminal: built and compiled once; called with the FX graph's arguments.

    backend: 'cpu' or 'cuda', luminal's backend; results come back on the device of the graph's tensors. On CUDA,
    CUDA tensors are read in place (torch's memory borrowed, no copy; a dtype the kernels store differently is
    converted on the device) and the results are torch CUDA tensors over luminal's own result memory (no copy)."""

    def __init__(self, gm: fx.GraphModule, backend: str = "cpu", dtype=None, threads: int | None = None,
                 translated: _Translator | None = None):
        tr = translated or _Translator(gm, strict=True).run()
        self.cx, self.backend, self.device = tr.cx, backend, _device_of(gm)
        self.constants = tr.constants
        self.inputs = []
        for node, v in tr.inputs:
            val = node.meta.get("val")
            if isinstance(v, Tensor):
                self.inputs.append(_Input(v, val.dtype, val.device))
            elif isinstance(v, _core.Expr):
                self.inputs.append(_Input(size=v))
            else:
                self.inputs.append(_Input())  # a value fixed in the graph
        self.outputs, self.out_dtypes = tr.outputs, tr.out_dtypes
        if backend == "cuda":
            from .cuda import CudaCompiler

            compilers = [GenericCompiler(), CudaCompiler(dtype or _weights_dtype(gm))]
        else:
            compilers = [GenericCompiler(), CPUCompiler(threads)]
        self.cx.compile(*compilers)
        COUNTERS["luminal_graphs"] += 1

    def __call__(self, *args):
        cx = self.cx
        for spec, a in zip(self.inputs, args):  # sizes first: tensor shapes are checked against them
            if spec.symbol is not None:
                spec.bind(cx, a)
        synced = False
        for spec, a in zip(self.inputs, args):
            if spec.tensor is None:
                continue
            # Inference tensors keep no version counter: they are set again every call.
            version = None if a.is_inference() else a._version
            if a is spec.last and version is not None and version == spec.version and a.data_ptr() == spec.ptr:
                continue  # parameters and buffers: the graph still holds their data
            if a.dtype != spec.dtype or a.device != spec.device:
                raise TypeError(f"luminal graph input {spec.tensor.graph.node(spec.tensor.id).name} was compiled "
                                f"for {spec.dtype} on {spec.device}, called with {a.dtype} on {a.device}")
            if a.is_cuda and not synced:  # luminal copies on its own stream: torch's work on the inputs ends first
                torch.cuda.current_stream(a.device).synchronize()
                synced = True
            spec.tensor.set(self._device_array(a))
            spec.last, spec.version, spec.ptr = a, version, a.data_ptr()
        cx.execute()
        return [self._result(o, d) for o, d in zip(self.outputs, self.out_dtypes)]

    def _device_array(self, a: torch.Tensor):
        if self.backend == "cuda" and a.is_cuda:
            from .cuda import from_torch

            a = a.detach()
            if a.dtype == torch.int64:
                a = a.to(torch.int32)  # luminal's int32, converted on the device
            # Read in place: torch's stream was synchronised before, and an input changed by torch is set again
            # (its version moves) before the next run.
            return from_torch(a.contiguous(), copy=False)
        return _host_array(a)

    def _result(self, o, torch_dtype):
        if isinstance(o, Tensor):
            raw = o.result() if self.backend == "cuda" and self.device.type == "cuda" else None
            if raw is not None and not isinstance(raw, np.ndarray):  # a DeviceArray: read in place
                t = _torch_from_device(raw, self.device)
            else:
                t = torch.from_numpy(np.asarray(o.numpy()))
                t = t if self.device.type == "cpu" else t.to(self.device, non_blocking=True)
            return t if t.dtype == torch_dtype else t.to(torch_dtype)
        if isinstance(o, _core.Expr):
            return int(o.eval(self.cx.dims)) if not o.is_const() else int(o)
        return o


class _LuminalModule(torch.nn.Module):
    """A partition run by luminal, standing in for the fused submodule in the graph torch runs."""

    def __init__(self, graph: LuminalGraph, returns_tuple: bool):
        super().__init__()
        self.graph, self.returns_tuple = graph, returns_tuple

    def forward(self, *args):
        out = self.graph(*args)
        return tuple(out) if self.returns_tuple else out[0]


# ================================================================================================================
# Partitioning and the backend
# ================================================================================================================
_WARNED: set[str] = set()
_OPTIONS = {"fallback", "device", "dtype", "threads"}


@dataclasses.dataclass
class Explanation:
    """What luminal.torch.explain found: the FX graphs compiled, the aten nodes in them, and each node left to
    torch with the reason."""
    graphs: int = 0
    nodes: int = 0
    fallbacks: list[Fallback] = dataclasses.field(default_factory=list)
    result: Any = dataclasses.field(default=None, repr=False, compare=False)  # what the model returned
    _held: list = dataclasses.field(default_factory=list, repr=False, compare=False)

    @property
    def ops(self) -> dict[str, str]:
        """Each op that fell back, with the first reason given."""
        out: dict[str, str] = {}
        for f in self.fallbacks:
            out.setdefault(f.op, f.reason)
        return out

    @property
    def fallback_share(self) -> float:
        return len(self.fallbacks) / self.nodes if self.nodes else 0.0

    def __str__(self):
        lines = [f"{self.graphs} graph(s), {self.nodes} aten node(s), {len(self.fallbacks)} left to torch"]
        lines += [f"  {f.op} ({f.node}): {f.reason}" + (f" at {f.where}" if f.where else "") for f in self.fallbacks]
        return "\n".join(lines)


def _stack(node: fx.Node, stacks: dict) -> str:
    """The user code behind an aten node: its stack trace, else that of the dynamo node it came from."""
    if node.meta.get("stack_trace"):
        return node.meta["stack_trace"]
    src = (node.meta.get("from_node") or [None])[-1]
    while src is not None and src.from_node:
        src = src.from_node[-1]
    return stacks.get(src.name, "") if src is not None else ""


def _compile_fx(gm: fx.GraphModule, example_inputs, options: dict, report: Explanation | None,
                stacks: dict | None = None):
    """The AOT forward compiler: the whole graph in luminal, or partitions of it with torch running the rest.
    stacks: the dynamo graph's stack trace per node name (for the report)."""
    COUNTERS["graphs"] += 1
    tr = _Translator(gm, strict=False).run()
    compute = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
    refused = {n: r for n, r in tr.refused.items() if n.target is not operator.getitem}
    fallbacks = [Fallback(_op_name(n), n.name, r, _stack(n, stacks or {})) for n, r in refused.items()]
    if report is not None:
        report.graphs += 1
        report.nodes += len(compute)
        report.fallbacks += fallbacks
    if fallbacks and not options.get("fallback", True):
        f = fallbacks[0]
        more = f"; and {len(fallbacks) - 1} more node(s)" if len(fallbacks) > 1 else ""
        error = UnsupportedOpError(f"luminal cannot translate {f.op} (node {f.node}): {f.reason}{more}")

        # Raised when called: dynamo wraps an exception raised while compiling in BackendCompilerFailed.
        def refuse(*args):
            raise error

        return refuse
    kw = dict(backend=options.get("device") or tr.device, dtype=options.get("dtype"), threads=options.get("threads"))
    if not tr.refused and not any(isinstance(o, _Missing) for o in tr.outputs):
        try:
            return LuminalGraph(gm, translated=tr, **kw)
        except Exception as e:  # noqa: BLE001 - a backend that cannot compile the graph: torch runs it
            if not options.get("fallback", True):
                raise
            warnings.warn(f"luminal: the graph runs in torch: compiling it failed: {type(e).__name__}: {e}",
                          stacklevel=2)
            return gm.forward
    new = sorted({f.op for f in fallbacks} - _WARNED) if report is None else []
    if new:
        _WARNED.update(new)
        reasons = {f.op: f.reason for f in fallbacks}
        warnings.warn("luminal: these ops run in torch: " + "; ".join(f"{op} ({reasons[op]})" for op in new),
                      stacklevel=2)
    try:
        return _partitioned(gm, set(tr.refused), kw)
    except Exception as e:  # noqa: BLE001 - partitioning failed: torch runs the whole graph
        warnings.warn(f"luminal: the graph runs in torch: partitioning it failed: {type(e).__name__}: {e}",
                      stacklevel=2)
        return gm.forward


def _partitioned(gm: fx.GraphModule, refused: set, kw: dict):
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    class Support(OperatorSupportBase):
        def is_node_supported(self, submodules, node):
            return node.op == "call_function" and node not in refused

    parts = CapabilityBasedPartitioner(gm, Support(), allows_single_node_partition=False).partition_and_fuse(
        prefix="luminal_")
    sizes = [n for n in parts.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.SymInt)
             and n.meta["val"].node.expr.is_Symbol]
    for node in list(parts.graph.nodes):
        if node.op != "call_module":
            continue
        sub = getattr(parts, node.target)
        _pass_sizes(node, sub, sizes)
        out = next(n for n in sub.graph.nodes if n.op == "output")
        try:
            lg = LuminalGraph(sub, **kw)
        except Exception as e:  # noqa: BLE001 - it translated in the dry run; whatever fails now, torch runs it
            warnings.warn(f"luminal: partition {node.target} runs in torch: {type(e).__name__}: {e}", stacklevel=2)
            continue
        setattr(parts, node.target, _LuminalModule(lg, isinstance(out.args[0], (tuple, list))))
    parts.recompile()
    return parts.forward


def _pass_sizes(call: fx.Node, sub: fx.GraphModule, sizes: list):
    """Gives a partition the graph's size symbols it lacks as arguments: its inputs' shapes may be expressions of
    them (s//4) that the values alone cannot be solved for."""
    have = {n.meta["val"].node.expr for n in sub.graph.nodes
            if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.SymInt)}
    holders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    extra = []
    for s in sizes:
        if s.meta["val"].node.expr in have:
            continue
        where = sub.graph.inserting_after(holders[-1]) if holders else sub.graph.inserting_before(
            next(iter(sub.graph.nodes)))
        with where:
            holders.append(sub.graph.placeholder(f"size_{s.name}"))
        holders[-1].meta["val"] = s.meta["val"]
        extra.append(s)
    if extra:
        call.args = tuple(call.args) + tuple(extra)
        sub.recompile()


def _device_of(gm: fx.GraphModule) -> torch.device:
    """Where the graph's input tensors live (the CPU when none is on a GPU)."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder" and isinstance(val, torch.Tensor) and val.device.type == "cuda":
            return val.device
    return torch.device("cpu")


def _decompositions() -> dict:
    """Core aten, but attention stays whole: luminal's own composes it so the CPU backend fuses it (torch's
    decomposition guards fully masked rows with a select over the scores, which keeps it from fusing)."""
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    for op in (aten.scaled_dot_product_attention.default, aten._scaled_dot_product_flash_attention_for_cpu.default):
        table.pop(op, None)
    return table


def _backend(gm: fx.GraphModule, example_inputs, options: dict | None, report: Explanation | None = None):
    from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

    options = dict(options or {})
    unknown = set(options) - _OPTIONS
    if unknown:
        raise ValueError(f"luminal backend: unknown option(s) {sorted(unknown)} (known: {sorted(_OPTIONS)})")
    if options.get("device") not in (None, "cpu", "cuda"):
        raise ValueError(f"luminal backend: device must be 'cpu' or 'cuda', got {options['device']!r}")

    stacks = {n.name: n.meta.get("stack_trace") or "" for n in gm.graph.nodes} if report is not None else None

    def forward(g, inputs):
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():  # aot calls this under fake mode; graph constants are real tensors
            fn = _compile_fx(g, inputs, options, report, stacks)
        if report is not None:
            fn = _Held(fn)
            report._held.append(fn)
        return fn

    def backward(g, inputs):  # inference is what luminal compiles; a backward pass runs in torch
        return make_boxed_func(g.forward)

    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    try:
        return aot_module_simplified(gm, example_inputs, fw_compiler=forward, bw_compiler=backward,
                                     decompositions=_decompositions())
    except GuardOnDataDependentSymNode as e:  # a decomposition reads the data (take): torch runs the graph
        # (dynamo's own exceptions, which restart its analysis, pass through)
        if not options.get("fallback", True):
            raise
        reason = f"AOT autograd could not trace the graph: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
        if report is not None:
            report.graphs += 1
            report.fallbacks.append(Fallback("(whole graph)", "", reason))
        warnings.warn(f"luminal: the graph runs in torch: {reason}", stacklevel=2)
        return gm.forward


def backend(gm: fx.GraphModule, example_inputs, options: dict | None = None, mode: str | None = None):
    """The torch.compile backend: `torch.compile(model, backend="luminal", options={...})`.

    options: fallback (default True: ops luminal cannot translate run in torch; False raises UnsupportedOpError
    naming the first), device ('cpu' or 'cuda'; default: where the inputs are), dtype (the CUDA backend's weight
    dtype), threads (CPU worker threads)."""
    return _backend(gm, example_inputs, options)


class _Held:
    """A graph compiled for explain(): dynamo keeps its cache entry (until torch._dynamo.reset()), in a recompile
    region nothing looks up again, so explain() lets go of the compiled graph once it is done."""
    __slots__ = ("fn",)  # no __dict__: functools.wraps in AOT's wrappers would copy `fn` into theirs

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        if self.fn is None:
            raise RuntimeError("luminal: a graph compiled by explain() was called after explain() returned")
        return self.fn(*args)


# torch.compile's isolate_recompiles (newer torch); without it explain's fresh backend still compiles anew.
_ISOLATE = {"isolate_recompiles": True} if "isolate_recompiles" in inspect.signature(torch.compile).parameters else {}


def explain(model, *inputs, options: dict | None = None, **kwargs) -> Explanation:
    """Compiles and runs `model(*inputs, **kwargs)` (without grad) through the luminal backend and reports every
    aten node left to torch, and why; `result` is what the call returned.

    Every graph is compiled again, and the caller's compiled functions keep their caches: this compile has its own
    backend and its own recompile region (torch.compile's isolate_recompiles), so it neither reuses their entries
    nor counts against their recompile limit."""
    report = Explanation()

    def be(gm, example_inputs):
        return _backend(gm, example_inputs, options, report)

    # A compiled module or function: explain what it wraps.
    model = getattr(model, "_orig_mod", None) or getattr(model, "_torchdynamo_orig_callable", None) or model
    try:
        with torch.no_grad():
            report.result = torch.compile(model, backend=be, **_ISOLATE)(*inputs, **kwargs)
    finally:
        for h in report._held:
            h.fn = None
    return report
