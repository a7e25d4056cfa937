"""Normalisation functions with torch.nn.functional's names: group_norm, batch_norm, instance_norm,
local_response_norm (layer_norm and rms_norm are Tensor methods, re-exported here).

Statistics are computed in float32 and the result rounded once to the input's dtype, as torch's CPU kernels do for
float16/bfloat16.
"""
from __future__ import annotations

from . import _core
from . import dtypes as dt
from .functional import layer_norm, rms_norm
from .tensor import Tensor, _fmt

__all__ = ["group_norm", "batch_norm", "instance_norm", "layer_norm", "rms_norm", "local_response_norm",
           "native_layer_norm", "native_group_norm", "native_batch_norm"]


def _per_channel(t: Tensor | None, x: Tensor, what: str, op: str) -> Tensor | None:
    """A (C,) tensor viewed as (C, 1, ..., 1) to broadcast over x's (N, C, *spatial) from dim 1."""
    if t is None:
        return None
    c = x.layout.shape[1]
    if t.ndim != 1 or t.layout.shape[0] != c:
        raise ValueError(f"{op}: {what} must have shape ({c},) for input {_fmt(x.shape)}, got {_fmt(t.shape)}")
    t = t.to(dt.float32)
    for _ in range(x.ndim - 2):
        t = t.unsqueeze(-1)
    return t


def _affine(y: Tensor, x: Tensor, weight, bias, op: str) -> Tensor:
    w, b = _per_channel(weight, x, "weight", op), _per_channel(bias, x, "bias", op)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y.to(x.dtype if x.dtype.is_float else dt.float32)


def _need_channels(x: Tensor, op: str, min_dims: int = 2):
    if x.ndim < min_dims:
        raise ValueError(f"{op}: input needs at least {min_dims} dims (N, C, ...), got shape {_fmt(x.shape)}")


def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """torch.nn.functional.group_norm: input (N, C, *) normalised over each group of C / num_groups channels (and
    all spatial positions), then scaled and shifted per channel."""
    _need_channels(input, "group_norm")
    shape = list(input.layout.shape)
    c = shape[1]
    if not c.is_const() or num_groups <= 0 or int(c) % num_groups:
        raise ValueError(f"group_norm: {c} channels (input {_fmt(input.shape)}) cannot be split into {num_groups} "
                         "groups")
    x = input.to(dt.float32).reshape([shape[0], num_groups, int(c) // num_groups] + shape[2:])
    dims = list(range(2, x.ndim))
    mu = x.mean(dims, keepdim=True)
    d = x - mu
    y = (d * ((d * d).mean(dims, keepdim=True) + eps).rsqrt()).reshape(shape)
    return _affine(y, input, weight, bias, "group_norm")


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None,
               bias: Tensor | None = None, training: bool = False, momentum: float = 0.1,
               eps: float = 1e-5) -> Tensor:
    """torch.nn.functional.batch_norm: input (N, C, *) normalised per channel with the running statistics
    (inference), or with the batch's own statistics when training=True and no running statistics are given (a
    graph cannot update running statistics in place, so training=True with them raises)."""
    _need_channels(input, "batch_norm")
    if training:
        if running_mean is not None or running_var is not None:
            raise NotImplementedError("batch_norm: training=True would update running_mean/running_var in place, "
                                      "which a luminal graph cannot do; pass training=False (inference) or None "
                                      "for both to normalise with the batch's statistics")
        return _stats_norm(input, [0] + list(range(2, input.ndim)), weight, bias, eps, "batch_norm")
    if running_mean is None or running_var is None:
        raise ValueError("batch_norm: training=False needs running_mean and running_var")
    mean = _per_channel(running_mean, input, "running_mean", "batch_norm")
    var = _per_channel(running_var, input, "running_var", "batch_norm")
    y = (input.to(dt.float32) - mean) * (var + eps).rsqrt()
    return _affine(y, input, weight, bias, "batch_norm")


def _stats_norm(input: Tensor, dims, weight, bias, eps: float, op: str) -> Tensor:
    x = input.to(dt.float32)
    mu = x.mean(dims, keepdim=True)
    d = x - mu
    y = d * ((d * d).mean(dims, keepdim=True) + eps).rsqrt()
    return _affine(y, input, weight, bias, op)


def instance_norm(input: Tensor, running_mean: Tensor | None = None, running_var: Tensor | None = None,
                  weight: Tensor | None = None, bias: Tensor | None = None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """torch.nn.functional.instance_norm: each (sample, channel) normalised over its spatial positions; with
    use_input_stats=False, the running statistics instead (like batch_norm's inference)."""
    _need_channels(input, "instance_norm", 3)
    if not use_input_stats:
        return batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)
    return _stats_norm(input, list(range(2, input.ndim)), weight, bias, eps, "instance_norm")


def local_response_norm(input: Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> Tensor:
    """torch.nn.functional.local_response_norm: x / (k + alpha * mean of x^2 over `size` neighbouring channels,
    zero-padded) ** beta."""
    _need_channels(input, "local_response_norm", 3)
    if size < 1:
        raise ValueError(f"local_response_norm: size must be positive, got {size}")
    x = input.to(dt.float32)
    sq = (x * x).transpose(1, -1)  # channels last, to pad and slice them
    c = sq.layout.shape[-1]
    padded = sq.pad([size // 2, (size - 1) // 2])
    total = None
    for s in range(size):  # the window as a sum of shifted views: exact, and `size` is small
        part = padded._with_view(padded.layout.slice(padded.ndim - 1, _core.to_expr(s), c + s))
        total = part if total is None else total + part
    div = (total.transpose(1, -1) * (alpha / size) + k).pow(beta)
    return (x / div).to(input.dtype if input.dtype.is_float else dt.float32)


def _stats(x: Tensor, dims, eps: float):
    """(mean, 1 / sqrt(biased variance + eps)) over dims, in float32, kept as size-1 dims."""
    f = x.float()
    mean = f.mean(dims, keepdim=True)
    d = f - mean
    return mean, ((d * d).mean(dims, keepdim=True) + eps).rsqrt()


def native_layer_norm(input: Tensor, normalized_shape, weight: Tensor | None, bias: Tensor | None, eps: float):
    """torch.native_layer_norm: (output, mean, rstd), the statistics shaped like input with the normalised dims 1."""
    nd = len(normalized_shape)
    dims = list(range(input.ndim - nd, input.ndim))
    mean, rstd = _stats(input, dims, eps)
    y = (input.float() - mean) * rstd
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(input.dtype), mean.to(input.dtype), rstd.to(input.dtype)


def native_group_norm(input: Tensor, weight: Tensor | None, bias: Tensor | None, N: int, C: int, HxW: int,
                      group: int, eps: float):
    """torch.native_group_norm: (output, mean, rstd), the statistics of shape (N, group)."""
    g = input.reshape([input.layout.shape[0], group, -1])
    mean, rstd = _stats(g, [2], eps)
    y = ((g.float() - mean) * rstd).reshape(input.layout.shape)
    y = _affine(y, input, weight, bias, "native_group_norm")
    return y, mean.squeeze(-1).to(input.dtype), rstd.squeeze(-1).to(input.dtype)


def native_batch_norm(input: Tensor, weight: Tensor | None, bias: Tensor | None, running_mean: Tensor | None,
                      running_var: Tensor | None, training: bool, momentum: float, eps: float):
    """torch.native_batch_norm: (output, saved mean, saved 1/std); the saved statistics are the batch's in training
    (running_mean / running_var are not updated: a graph has no in-place state), else empty, as torch gives."""
    dims = [0] + list(range(2, input.ndim))
    if training or running_mean is None:
        mean, rstd = _stats(input, dims, eps)
        y = (input.float() - mean) * rstd
        saved = mean.reshape(-1).to(input.dtype), rstd.reshape(-1).to(input.dtype)
    else:
        m = _per_channel(running_mean, input, "running_mean", "native_batch_norm")
        v = _per_channel(running_var, input, "running_var", "native_batch_norm")
        y = (input.float() - m) * (v + eps).rsqrt()
        from .functional import zeros

        saved = zeros((0,), input.dtype, graph=input.graph), zeros((0,), input.dtype, graph=input.graph)
    return (_affine(y, input, weight, bias, "native_batch_norm"), *saved)
