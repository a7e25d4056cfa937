"""torch.nn's layers over luminal tensors, with torch's constructor arguments and state-dict names.

Each layer holds its parameters and buffers as graph inputs (`Module.load_state_dict` fills them from a torch state
dict) and calls the function of the same name in `luminal.nn.functional`. Inference only: dropout is the identity
and BatchNorm uses its running statistics.
"""
from __future__ import annotations

import math

from .. import _core
from .. import dtypes as dt
from ..functional import cat, where
from ..tensor import Tensor
from . import functional as F
from .module import LayerNorm, Linear, Module, ModuleList, Sequential, _fmt_shape

__all__ = [
    "Identity", "Dropout", "Flatten", "Unflatten", "ReLU", "ReLU6", "GELU", "SiLU", "Tanh", "Sigmoid", "Softmax",
    "LogSoftmax", "Hardswish", "Hardsigmoid", "Mish", "ELU", "LeakyReLU", "Softplus", "Conv1d", "Conv2d",
    "ConvTranspose2d", "BatchNorm1d", "BatchNorm2d", "GroupNorm", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d",
    "MultiheadAttention", "TransformerEncoderLayer", "LayerNorm", "Linear", "ModuleList", "Sequential",
]


def _tuple(v, n: int, what: str) -> tuple:
    if isinstance(v, int):
        return (v,) * n
    v = tuple(v)
    if len(v) != n or not all(isinstance(i, int) for i in v):
        raise ValueError(f"{what} must be an int or a tuple of {n} ints, got {v!r}")
    return v


class _Stateless(Module):
    """A layer without state; it may be built outside any graph (`nn.ReLU()` before a Graph exists)."""

    def __init__(self):
        self._buffer_names = set()

    @property
    def graph(self):  # a stateless layer belongs to whatever graph its input does
        return None


# ---- layers without parameters -------------------------------------------------------------------------------------
class Identity(_Stateless):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x


class Dropout(_Stateless):
    """Inference: the identity (torch's eval mode)."""

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p

    def forward(self, x):
        return x


class Flatten(_Stateless):
    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)


class Unflatten(_Stateless):
    def __init__(self, dim: int, unflattened_size):
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, x):
        ax = x._axis(self.dim)
        return x.reshape(list(x.shape[:ax]) + list(self.unflattened_size) + list(x.shape[ax + 1:]))


class _Activation(_Stateless):
    def __init__(self, inplace: bool = False):  # torch's `inplace` changes nothing in a graph
        super().__init__()


class ReLU(_Activation):
    def forward(self, x):
        return x.relu()


class ReLU6(_Activation):
    def forward(self, x):
        return x.clamp(0, 6)


class SiLU(_Activation):
    def forward(self, x):
        return x.silu()


class Tanh(_Activation):
    def forward(self, x):
        return x.tanh()


class Sigmoid(_Activation):
    def forward(self, x):
        return x.sigmoid()


class Hardswish(_Activation):
    def forward(self, x):
        return x * (x + 3).clamp(0, 6) * (1 / 6)


class Hardsigmoid(_Activation):
    def forward(self, x):
        return (x + 3).clamp(0, 6) * (1 / 6)


class Mish(_Activation):
    def forward(self, x):
        return x * x.softplus().tanh()


class GELU(_Stateless):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        return x.gelu(approximate=self.approximate)


class ELU(_Stateless):
    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__()
        self.alpha = alpha

    def forward(self, x):
        # exp of the negative part only, so a large positive x never makes an inf.
        return x.relu() + self.alpha * (x.minimum(0).exp() - 1)


class LeakyReLU(_Stateless):
    def __init__(self, negative_slope: float = 0.01, inplace: bool = False):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        return x.leaky_relu(self.negative_slope)


class Softplus(_Stateless):
    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, x):
        return x.softplus(self.beta, self.threshold)


class Softmax(_Stateless):
    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        if self.dim is None:  # torch's deprecated implicit choice
            return x.softmax(0 if x.ndim in (0, 1, 3) else 1)
        return x.softmax(self.dim)


class LogSoftmax(Softmax):
    def forward(self, x):
        if self.dim is None:
            return x.log_softmax(0 if x.ndim in (0, 1, 3) else 1)
        return x.log_softmax(self.dim)


# ---- convolutions --------------------------------------------------------------------------------------------------
def _pad_mode(x: Tensor, pads, mode: str) -> Tensor:
    """torch.nn.functional.pad's non-constant modes, over the trailing dims; pads as (left, right) from the last
    dim backwards. Built from slices and cat, so it stays a view plus copies."""
    for i in range(len(pads) // 2):
        ax = x.ndim - 1 - i
        lo, hi = pads[2 * i], pads[2 * i + 1]
        if not lo and not hi:
            continue
        n = x.shape[ax]
        if mode == "reflect" and (lo >= n or hi >= n):
            raise ValueError(f"reflect padding ({lo}, {hi}) must be smaller than dim {ax} of shape "
                             f"{_fmt_shape(x.shape)}")
        if mode == "circular" and (lo > n or hi > n):
            raise ValueError(f"circular padding ({lo}, {hi}) is larger than dim {ax} of shape {_fmt_shape(x.shape)}")

        def take(a, b, flip=False):
            idx = [slice(None)] * x.ndim
            idx[ax] = slice(a, b)
            piece = x[tuple(idx)]
            return piece.flip(ax) if flip else piece

        if mode == "reflect":
            left, right = take(1, lo + 1, True), take(n - 1 - hi, n - 1, True)
        elif mode == "replicate":
            left = take(0, 1).expand_to(_with(x, ax, lo))
            right = take(n - 1, n).expand_to(_with(x, ax, hi))
        elif mode == "circular":
            left, right = take(n - lo, n), take(0, hi)
        else:
            raise ValueError(f"padding_mode must be 'zeros', 'reflect', 'replicate' or 'circular', got {mode!r}")
        x = cat(([left] if lo else []) + [x] + ([right] if hi else []), ax)
    return x


def _with(x: Tensor, ax: int, n: int):
    """x's shape with dim `ax` set to n."""
    shape = list(x.layout.shape)
    shape[ax] = _core.Expr(n)
    return shape


class _ConvNd(Module):
    _nd = 2

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                 padding_mode, graph, dtype, transposed=False, output_padding=0):
        super().__init__(graph)
        n, name = self._nd, type(self).__name__
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"{name}: in_channels ({in_channels}) and out_channels ({out_channels}) must be "
                             f"divisible by groups ({groups})")
        if padding_mode not in ("zeros", "reflect", "replicate", "circular"):
            raise ValueError(f"{name}: padding_mode must be 'zeros', 'reflect', 'replicate' or 'circular', got "
                             f"{padding_mode!r}")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _tuple(kernel_size, n, "kernel_size")
        self.stride = _tuple(stride, n, "stride")
        self.dilation = _tuple(dilation, n, "dilation")
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"{name}: padding must be 'same', 'valid' or ints, got {padding!r}")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError(f"{name}: padding='same' is not supported for strided convolutions")
            self.padding = padding
        else:
            self.padding = _tuple(padding, n, "padding")
        self.padding_mode = padding_mode
        self.output_padding = _tuple(output_padding, n, "output_padding")
        wshape = (in_channels, out_channels // groups) if transposed else (out_channels, in_channels // groups)
        self.weight = self.param(*wshape, *self.kernel_size, dtype=dtype)
        self.bias = self.param(out_channels, dtype=dtype) if bias else None

    def _pads(self):
        """(left, right) per spatial dim, last dim first (torch.nn.functional.pad's order)."""
        out = []
        for i in reversed(range(self._nd)):
            if self.padding == "valid":
                lo = hi = 0
            elif self.padding == "same":
                total = self.dilation[i] * (self.kernel_size[i] - 1)
                lo, hi = total // 2, total - total // 2
            else:
                lo = hi = self.padding[i]
            out += [lo, hi]
        return out

    def _check(self, x: Tensor):
        n, name = self._nd, type(self).__name__
        if x.ndim not in (n + 1, n + 2) or x.shape[-n - 1] != self.in_channels:
            raise ValueError(f"{name}: expected a ({n + 1}D unbatched or {n + 2}D batched) input with "
                             f"{self.in_channels} channels, got shape {_fmt_shape(x.shape)}")

    def _conv(self, x: Tensor, fn: str) -> Tensor:
        self._check(x)
        fn = getattr(F, fn)
        if self.padding_mode != "zeros":
            x = _pad_mode(x, self._pads(), self.padding_mode)
            padding = 0
        else:
            padding = self.padding
        return fn(x, self.weight, self.bias, self.stride, padding, self.dilation, self.groups)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}")


class Conv1d(_ConvNd):
    _nd = 1

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", device=None, dtype=dt.float32, graph=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, graph, dtype)

    def forward(self, x):
        return self._conv(x, "conv1d")


class Conv2d(_ConvNd):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", device=None, dtype=dt.float32, graph=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, graph, dtype)

    def forward(self, x):
        return self._conv(x, "conv2d")


class ConvTranspose2d(_ConvNd):
    """weight: (in_channels, out_channels / groups, kH, kW), as torch stores it."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1, padding_mode="zeros", device=None, dtype=dt.float32, graph=None):
        if padding_mode != "zeros":
            raise ValueError(f"Only 'zeros' padding mode is supported for ConvTranspose2d, got {padding_mode!r}")
        if isinstance(padding, str):
            raise ValueError(f"ConvTranspose2d: padding must be ints, got {padding!r}")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, graph, dtype, transposed=True, output_padding=output_padding)
        for op, s, d in zip(self.output_padding, self.stride, self.dilation):
            if op >= max(s, d):
                raise ValueError(f"ConvTranspose2d: output_padding {self.output_padding} must be smaller than "
                                 f"either stride {self.stride} or dilation {self.dilation}")

    def forward(self, x, output_size=None):
        self._check(x)
        output_padding = self.output_padding
        if output_size is not None:
            # torch's choice: the output_padding that reaches the requested size (within one stride).
            size = list(output_size)[-2:]
            output_padding = []
            for i in range(2):
                n_in = x.shape[-2 + i]
                least = (n_in - 1) * self.stride[i] - 2 * self.padding[i] + \
                    self.dilation[i] * (self.kernel_size[i] - 1) + 1
                extra = size[i] - least
                if not 0 <= extra < self.stride[i]:
                    raise ValueError(f"ConvTranspose2d: requested output size {tuple(size)} is not reachable from "
                                     f"input shape {_fmt_shape(x.shape)} (dim {i}: between {least} and "
                                     f"{least + self.stride[i] - 1})")
                output_padding.append(extra)
            output_padding = tuple(output_padding)
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding, output_padding,
                                  self.groups, self.dilation)


# ---- normalization -------------------------------------------------------------------------------------------------
class _BatchNorm(Module):
    _ignored_state = ("num_batches_tracked",)
    _dims: tuple[int, ...] = ()

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, device=None,
                 dtype=dt.float32, graph=None):
        super().__init__(graph)
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = self.param(num_features, dtype=dtype) if affine else None
        self.bias = self.param(num_features, dtype=dtype) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", self.param(num_features, dtype=dtype))
            self.register_buffer("running_var", self.param(num_features, dtype=dtype))
        else:
            self.running_mean = self.running_var = None

    def forward(self, x):
        if x.ndim not in self._dims or x.shape[1] != self.num_features:
            dims = " or ".join(map(str, self._dims))
            raise ValueError(f"{type(self).__name__}({self.num_features}): expected a {dims}"
                             f"D input with {self.num_features} channels in dim 1, got shape {_fmt_shape(x.shape)}")
        # Without running statistics torch normalises by the batch's own, in eval mode too.
        use_batch = self.running_mean is None
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, use_batch,
                            self.momentum, self.eps)

    def extra_repr(self):
        return f"{self.num_features}, eps={self.eps}"


class BatchNorm1d(_BatchNorm):
    _dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    _dims = (4,)


class GroupNorm(Module):
    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, device=None, dtype=dt.float32, graph=None):
        super().__init__(graph)
        if num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels ({num_channels}) must be divisible by num_groups "
                             f"({num_groups})")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = self.param(num_channels, dtype=dtype) if affine else None
        self.bias = self.param(num_channels, dtype=dtype) if affine else None

    def forward(self, x):
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise ValueError(f"GroupNorm({self.num_groups}, {self.num_channels}): expected an input with "
                             f"{self.num_channels} channels in dim 1, got shape {_fmt_shape(x.shape)}")
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}"


# ---- pooling -------------------------------------------------------------------------------------------------------
class MaxPool2d(_Stateless):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.ceil_mode, self.return_indices = dilation, ceil_mode, return_indices

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                            self.return_indices)


class AvgPool2d(_Stateless):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad, self.divisor_override = ceil_mode, count_include_pad, divisor_override

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                            self.divisor_override)


class AdaptiveAvgPool2d(_Stateless):
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return F.adaptive_avg_pool2d(x, self.output_size)


# ---- attention -----------------------------------------------------------------------------------------------------
def _additive(mask: Tensor | None, dtype) -> Tensor | None:
    """A float mask to add to attention scores: a bool mask's True (masked out) becomes -inf, exactly."""
    if mask is None:
        return None
    if mask.dtype is dt.bool_:
        return where(mask, float("-inf"), 0.0).to(dtype)
    if not mask.dtype.is_float:
        raise TypeError(f"attention masks must be bool or float, got {mask.dtype.name}")
    return mask.to(dtype)


def _attend(q, k, v, mask, need_weights: bool):
    """softmax(q k^T / sqrt(d) + mask) v over (N, H, L, d) operands: (output, weights or None). Without weights,
    F.scaled_dot_product_attention (the backends' fused attention)."""
    if not need_weights:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), None
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        scores = scores + mask
    w = scores.softmax(-1)
    return w @ v, (w if need_weights else None)


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention (inference). State: in_proj_weight (3E, E) and in_proj_bias (3E), or
    q/k/v_proj_weight when kdim/vdim differ from embed_dim; out_proj.weight/bias."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=dt.float32, graph=None):
        super().__init__(graph)
        if embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim ({embed_dim}) must be divisible by num_heads "
                             f"({num_heads})")
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError("MultiheadAttention: add_bias_kv and add_zero_attn are not supported")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.batch_first, self.dropout = batch_first, dropout
        self._same_dims = self.kdim == embed_dim and self.vdim == embed_dim
        if self._same_dims:
            self.in_proj_weight = self.param(3 * embed_dim, embed_dim, dtype=dtype)
        else:
            self.q_proj_weight = self.param(embed_dim, embed_dim, dtype=dtype)
            self.k_proj_weight = self.param(embed_dim, self.kdim, dtype=dtype)
            self.v_proj_weight = self.param(embed_dim, self.vdim, dtype=dtype)
        self.in_proj_bias = self.param(3 * embed_dim, dtype=dtype) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, graph=self.graph, dtype=dtype)

    def _projections(self, query, key, value):
        E = self.embed_dim
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:E], b[E:2 * E], b[2 * E:])
        if not self._same_dims:
            return (query.linear(self.q_proj_weight, bq), key.linear(self.k_proj_weight, bk),
                    value.linear(self.v_proj_weight, bv))
        w = self.in_proj_weight
        if query is key and key is value:  # self-attention: one product for q, k and v
            return query.linear(w, b).split(E, -1)
        return query.linear(w[:E], bq), key.linear(w[E:2 * E], bk), value.linear(w[2 * E:], bv)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        E, H, d = self.embed_dim, self.num_heads, self.head_dim
        if query.ndim not in (2, 3):
            raise ValueError(f"MultiheadAttention: query must be 2D (unbatched) or 3D, got shape "
                             f"{_fmt_shape(query.shape)}")
        unbatched = query.ndim == 2
        for name, t, n in (("query", query, E), ("key", key, self.kdim), ("value", value, self.vdim)):
            if t.ndim != query.ndim or t.shape[-1] != n:
                raise ValueError(f"MultiheadAttention: {name} of shape {_fmt_shape(t.shape)} does not match "
                                 f"(expected {query.ndim}D with {n} features; query is {_fmt_shape(query.shape)})")
        if is_causal and attn_mask is None:
            raise RuntimeError("MultiheadAttention: need attn_mask if specifying the is_causal hint")
        if unbatched or not self.batch_first:  # to (N, L, E), keeping self-attention's q is k is v
            move = (lambda t: t.unsqueeze(0)) if unbatched else (lambda t: t.transpose(0, 1))
            same = query is key, key is value
            query = move(query)
            key = query if same[0] else move(key)
            value = key if same[1] else move(value)
            if unbatched and key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        N, L, S = query.shape[0], query.shape[1], key.shape[1]
        if key.shape[:2] != value.shape[:2] or key.shape[0] != N:
            raise ValueError(f"MultiheadAttention: key {_fmt_shape(key.shape)} and value {_fmt_shape(value.shape)} "
                             f"do not match each other or the query's batch {N}")
        q, k, v = self._projections(query, key, value)
        q = q.reshape(N, L, H, d).transpose(1, 2)
        k = k.reshape(N, S, H, d).transpose(1, 2)
        v = v.reshape(N, S, H, d).transpose(1, 2)
        mask = self._mask(key_padding_mask, attn_mask, N, L, S, q.dtype)
        out, w = _attend(q, k, v, mask, need_weights)
        out = self.out_proj(out.transpose(1, 2).reshape(N, L, E))
        if w is not None and average_attn_weights:
            w = w.mean(1)
        if unbatched:
            out = out.squeeze(0)
            w = None if w is None else w.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        return out, w

    def _mask(self, key_padding_mask, attn_mask, N, L, S, dtype):
        H = self.num_heads
        mask = None
        if key_padding_mask is not None:
            if tuple(key_padding_mask.shape) != (N, S):
                raise ValueError(f"MultiheadAttention: key_padding_mask must have shape {_fmt_shape((N, S))}, got "
                                 f"{_fmt_shape(key_padding_mask.shape)}")
            mask = _additive(key_padding_mask, dtype).reshape(N, 1, 1, S)
        if attn_mask is not None:
            shape = tuple(attn_mask.shape)
            if shape == (L, S):
                am = attn_mask
            elif shape == (N * H, L, S):
                am = attn_mask.reshape(N, H, L, S)
            else:
                raise ValueError(f"MultiheadAttention: attn_mask must have shape {_fmt_shape((L, S))} or "
                                 f"{_fmt_shape((N * H, L, S))}, got {_fmt_shape(shape)}")
            am = _additive(am, dtype)
            mask = am if mask is None else mask + am
        return mask


class TransformerEncoderLayer(Module):
    """torch.nn.TransformerEncoderLayer (inference): self-attention and a feed-forward block, each with a residual
    and a LayerNorm, before (norm_first) or after the block."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu", layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True, device=None, dtype=dt.float32, graph=None):
        super().__init__(graph)
        g = self.graph
        self.self_attn = MultiheadAttention(d_model, nhead, bias=bias, batch_first=batch_first, dtype=dtype, graph=g)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, graph=g, dtype=dtype)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, graph=g, dtype=dtype)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, graph=g, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, graph=g, dtype=dtype)
        self.norm_first = norm_first
        if isinstance(activation, str):
            if activation not in ("relu", "gelu"):
                raise ValueError(f"activation should be relu/gelu, not {activation}")
            activation = ReLU() if activation == "relu" else GELU()
        self.activation = activation

    def _sa(self, x, mask, key_padding_mask, is_causal):
        return self.self_attn(x, x, x, key_padding_mask=key_padding_mask, attn_mask=mask, need_weights=False,
                              is_causal=is_causal)[0]

    def _ff(self, x):
        return self.linear2(self.activation(self.linear1(x)))

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = x + self._sa(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff(self.norm2(x))
        x = self.norm1(x + self._sa(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff(x))
