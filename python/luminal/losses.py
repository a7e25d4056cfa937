"""Losses and distances with torch.nn.functional's names and semantics, composed from Tensor methods.

Class-index targets select their class through a comparison with the class ids (no Gather), so an ignored target
(ignore_index) simply selects nothing. A target outside [0, C) that is not ignore_index also selects nothing here
(torch raises when it runs; a static graph cannot check data while it is built).
"""
from __future__ import annotations

import math

from . import dtypes as dt
from .functional import where
from .tensor import Tensor, _arange, _fmt, _scalar

__all__ = [
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "kl_div", "cosine_similarity", "normalize", "pairwise_distance",
    "soft_margin_loss", "margin_ranking_loss", "hinge_embedding_loss", "poisson_nll_loss", "gaussian_nll_loss",
    "cosine_embedding_loss", "multilabel_soft_margin_loss", "triplet_margin_loss", "triplet_margin_with_distance_loss",
    "multi_margin_loss", "multilabel_margin_loss", "linear_cross_entropy",
]


def _reduce(loss: Tensor, reduction: str, op: str) -> Tensor:
    if reduction == "none":
        return loss
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    raise ValueError(f"{op}: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")


def _check_reduction(reduction: str, op: str, extra: tuple = ()):
    if reduction not in ("none", "mean", "sum") + extra:
        raise ValueError(f"{op}: reduction must be one of {('none', 'mean', 'sum') + extra}, got {reduction!r}")


def _same_shape(input: Tensor, target: Tensor, op: str):
    if input.layout.shape != target.layout.shape:
        raise ValueError(f"{op}: target shape {_fmt(target.shape)} must equal input shape {_fmt(input.shape)}")


def _class_layout(input: Tensor, target: Tensor, op: str) -> tuple[Tensor, Tensor, bool]:
    """(N, C, d...) input and (N, d...) target; a single (C,) input with a 0-d target gets a batch of one."""
    if input.ndim == 0:
        raise ValueError(f"{op}: input must have a class dim, got shape {_fmt(input.shape)}")
    single = input.ndim == 1
    x, t = (input.unsqueeze(0), target.reshape([1] if target.ndim == 0 else target.layout.shape)) if single \
        else (input, target)
    want = [x.layout.shape[0]] + list(x.layout.shape[2:])
    if list(t.layout.shape) != want:
        raise ValueError(f"{op}: target shape {_fmt(target.shape)} does not match input shape {_fmt(input.shape)} "
                         f"(expected {_fmt(want if not single else [])})")
    return x, t, single


def _class_weight(weight: Tensor, x: Tensor, op: str) -> Tensor:
    """weight (C,) shaped to broadcast along the class dim (1) of x."""
    c = x.layout.shape[1]
    if weight.ndim != 1 or weight.layout.shape[0] != c:
        raise ValueError(f"{op}: weight must have shape ({c},) for input shape {_fmt(x.shape)}, got "
                         f"{_fmt(weight.shape)}")
    return weight.to(x.dtype).reshape([c] + [1] * (x.ndim - 2))


def _hits(x: Tensor, target: Tensor) -> Tensor:
    """hit[n, c, ...] = target[n, ...] == c (bool, x's shape)."""
    classes = _arange(x.graph, x.layout.shape[1]).reshape([x.layout.shape[1]] + [1] * (x.ndim - 2))
    return target.to(dt.int32).unsqueeze(1).eq(classes).expand_to(x.layout.shape)


def _picked(x, target, weight, ignore_index, op):
    """(-w[t] * x[t] per sample, w[t] per sample): both 0 where the target is ignore_index."""
    hit = _hits(x, target) & target.ne(ignore_index).unsqueeze(1)  # ignore_index may name a class too
    picked = where(hit, x, 0).sum(1)  # where, not a product: a -inf log-probability elsewhere stays out
    if weight is not None:
        wt = (hit.to(x.dtype) * _class_weight(weight, x, op)).sum(1)
    else:
        wt = hit.to(dt.int32).amax(1).to(x.dtype)  # 1, or 0 where the target names no class (ignored)
    return -picked * wt, wt


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
             reduction: str = "mean") -> Tensor:
    """-input[n, target[n]] * weight[target[n]]; 'mean' divides by the summed weights of the targets not ignored."""
    _check_reduction(reduction, "nll_loss")
    if target.dtype.is_float:
        raise TypeError(f"nll_loss: target must hold class indices (an integer tensor), got {target.dtype.name}")
    x, t, single = _class_layout(input, target, "nll_loss")
    loss, wt = _picked(x, t, weight, ignore_index, "nll_loss")
    if reduction == "none":
        return loss.reshape([]) if single else loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / wt.sum()


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """log_softmax over the class dim (1) then the negative log-likelihood of class indices, or of class
    probabilities when `target` is a float tensor of input's shape. label_smoothing mixes in the uniform
    distribution, weighted and normalised as torch does."""
    _check_reduction(reduction, "cross_entropy")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    if input.ndim == 0:
        raise ValueError(f"cross_entropy: input must have a class dim, got shape {_fmt(input.shape)}")
    single = input.ndim == 1
    x = input.unsqueeze(0) if single else input
    logp = x.log_softmax(1)
    w = _class_weight(weight, x, "cross_entropy") if weight is not None else None
    if target.dtype.is_float:  # class probabilities
        _same_shape(input, target, "cross_entropy")
        p = target.unsqueeze(0) if single else target
        if label_smoothing:
            p = p * (1 - label_smoothing) + _per_class(x, label_smoothing)
        prod = logp * p if w is None else logp * p * w
        loss = -prod.sum(1)
        if reduction == "none":
            return loss.reshape([]) if single else loss
        return _reduce(loss, reduction, "cross_entropy")
    x, t, single = _class_layout(input, target, "cross_entropy")
    nll, wt = _picked(logp, t, weight, ignore_index, "cross_entropy")
    if not label_smoothing:
        smooth = None
    else:
        # The uniform part: -sum_c w_c log p_c per sample, 0 where the target is ignored.
        smooth = -(logp if w is None else logp * w).sum(1)
        smooth = where(t.ne(ignore_index), smooth, 0)
    if reduction == "none":
        out = nll if smooth is None else nll * (1 - label_smoothing) + smooth * _per_class(x, label_smoothing)
        return out.reshape([]) if single else out
    if reduction == "sum":
        nll_r, smooth_r = nll.sum(), (smooth.sum() if smooth is not None else None)
    else:
        total = wt.sum()
        nll_r = nll.sum() / total
        smooth_r = smooth.sum() / total if smooth is not None else None
    if smooth_r is None:
        return nll_r
    return nll_r * (1 - label_smoothing) + smooth_r * _per_class(x, label_smoothing)


def _per_class(x: Tensor, value: float):
    """value / C for the class dim (1) of x: a Python float, or a tensor where C is symbolic."""
    c = x.layout.shape[1]
    if c.is_const():
        return value / int(c)
    return _scalar(x.graph, c, dt.float32).reciprocal().to(x.dtype) * value


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    return _reduce((input - target).square(), reduction, "mse_loss")


def l1_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    return _reduce((input - target).abs(), reduction, "l1_loss")


def smooth_l1_loss(input: Tensor, target: Tensor, reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (beta = 0: the L1 loss)."""
    d = (input - target).abs()
    if beta == 0:
        return _reduce(d, reduction, "smooth_l1_loss")
    return _reduce(where(d.lt(beta), d * d * (0.5 / beta), d - 0.5 * beta), reduction, "smooth_l1_loss")


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:
    """0.5 d^2 where |d| < delta, else delta * (|d| - 0.5 delta)."""
    d = (input - target).abs()
    return _reduce(where(d.lt(delta), d * d * 0.5, (d - 0.5 * delta) * delta), reduction, "huber_loss")


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                         reduction: str = "mean") -> Tensor:
    """-(t log x + (1 - t) log(1 - x)), each log clamped at -100 as torch does (so x = 0 or 1 stays finite)."""
    _same_shape(input, target, "binary_cross_entropy")
    loss = -(target * input.log().clamp_min(-100) + (1 - target) * (1 - input).log().clamp_min(-100))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction, "binary_cross_entropy")


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                     reduction: str = "mean", pos_weight: Tensor | None = None) -> Tensor:
    """binary_cross_entropy(sigmoid(x), t) without forming the sigmoid: (1 - t) x + (1 + (pw - 1) t) softplus(-x)."""
    _same_shape(input, target, "binary_cross_entropy_with_logits")
    sp = (-input).softplus()  # log(1 + exp(-x)), stable for either sign
    if pos_weight is None:
        loss = (1 - target) * input + sp
    else:
        loss = (1 - target) * input + ((pos_weight - 1) * target + 1) * sp
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction, "binary_cross_entropy_with_logits")


def kl_div(input: Tensor, target: Tensor, reduction: str = "mean", log_target: bool = False) -> Tensor:
    """Pointwise target * (log target - input), input being log-probabilities (0 where target is 0).
    'batchmean' divides the sum by the batch size (the mathematically right KL divergence)."""
    _check_reduction(reduction, "kl_div", ("batchmean",))
    if log_target:
        loss = target.exp() * (target - input)
    else:
        loss = where(target.eq(0), 0, target * target.log()) - target * input
    if reduction == "batchmean":
        n = input.layout.shape[0] if input.ndim else 1
        return loss.sum() / _scalar(input.graph, n, loss.dtype)
    return _reduce(loss, reduction, "kl_div")


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """input / max(||input||_p over dim, eps)."""
    return input / input.norm(p, dim, keepdim=True).clamp_min(eps)


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """Each vector divided by its 2-norm (at least eps), then their dot product along dim."""
    a, b = x1._operands(x2, "cosine_similarity")
    a, b = a._float(), b._float()
    return (normalize(a, 2.0, dim, eps) * normalize(b, 2.0, dim, eps)).sum(dim)


def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> Tensor:
    """||x1 - x2 + eps||_p along the last dim."""
    d = x1 - x2 + eps
    return d.norm(p, -1, keepdim)


def soft_margin_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """log(1 + exp(-y x))."""
    return _reduce((-(target * input)).softplus(), reduction, "soft_margin_loss")


def margin_ranking_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                        reduction: str = "mean") -> Tensor:
    """max(0, -y (x1 - x2) + margin)."""
    return _reduce((-target * (input1 - input2) + margin).clamp_min(0), reduction, "margin_ranking_loss")


def hinge_embedding_loss(input: Tensor, target: Tensor, margin: float = 1.0, reduction: str = "mean") -> Tensor:
    """x where y == 1, max(0, margin - x) where y == -1 (as torch: each term where y is not the other label)."""
    loss = where(target.ne(1), (margin - input).clamp_min(0), 0) + where(target.ne(-1), input, 0)
    return _reduce(loss, reduction, "hinge_embedding_loss")


def poisson_nll_loss(input: Tensor, target: Tensor, log_input: bool = True, full: bool = False, eps: float = 1e-8,
                     reduction: str = "mean") -> Tensor:
    """exp(x) - t x (log_input), else x - t log(x + eps); full adds Stirling's term for t > 1."""
    if log_input:
        loss = input.exp() - target * input
    else:
        loss = input - target * (input + eps).log()
    if full:
        t = target._float()
        stirling = t * t.log() - t + 0.5 * (2 * math.pi * t).log()
        loss = loss + where(t.gt(1), stirling, 0)
    return _reduce(loss, reduction, "poisson_nll_loss")


def gaussian_nll_loss(input: Tensor, target: Tensor, var, full: bool = False, eps: float = 1e-6,
                      reduction: str = "mean") -> Tensor:
    """0.5 (log(max(var, eps)) + (x - t)^2 / max(var, eps)) (+ 0.5 log(2 pi) with full)."""
    if not isinstance(var, Tensor):
        var = input._const_like(float(var))
    elif var.ndim == input.ndim - 1 and var.ndim and var.layout.shape == input.layout.shape[:-1]:
        var = var.unsqueeze(-1)  # one variance per sample (torch's homoscedastic case)
    v = var.clamp_min(eps)
    loss = 0.5 * (v.log() + (input - target).square() / v)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction, "gaussian_nll_loss")


def cosine_embedding_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                          reduction: str = "mean") -> Tensor:
    """1 - cos(x1, x2) where y == 1, max(0, cos - margin) where y == -1 (cos over the last dim)."""
    eps = 1e-12  # as torch, inside each squared magnitude
    dot = (input1 * input2).sum(-1)
    cos = dot / (((input1 * input1).sum(-1) + eps) * ((input2 * input2).sum(-1) + eps)).sqrt()
    loss = where(target.eq(1), 1 - cos, 0) + where(target.eq(-1), (cos - margin).clamp_min(0), 0)
    return _reduce(loss, reduction, "cosine_embedding_loss")


def multilabel_soft_margin_loss(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                reduction: str = "mean") -> Tensor:
    """-(t log sigmoid(x) + (1 - t) log sigmoid(-x)), averaged over the classes (last dim)."""
    loss = -(target * input.logsigmoid() + (1 - target) * (-input).logsigmoid())
    if weight is not None:
        loss = loss * weight
    return _reduce(loss.mean(-1), reduction, "multilabel_soft_margin_loss")


def triplet_margin_with_distance_loss(anchor: Tensor, positive: Tensor, negative: Tensor, *, distance_function=None,
                                      margin: float = 1.0, swap: bool = False, reduction: str = "mean") -> Tensor:
    """max(d(a, p) - d(a, n) + margin, 0), d(a, n) the smaller of d(a, n) and d(p, n) with swap."""
    d = distance_function or pairwise_distance
    d_ap, d_an = d(anchor, positive), d(anchor, negative)
    if swap:
        d_an = d_an.minimum(d(positive, negative))
    return _reduce((margin + d_ap - d_an).clamp_min(0), reduction, "triplet_margin_with_distance_loss")


def triplet_margin_loss(anchor: Tensor, positive: Tensor, negative: Tensor, margin: float = 1.0, p: float = 2,
                        eps: float = 1e-6, swap: bool = False, reduction: str = "mean") -> Tensor:
    return triplet_margin_with_distance_loss(anchor, positive, negative,
                                             distance_function=lambda a, b: pairwise_distance(a, b, p, eps),
                                             margin=margin, swap=swap, reduction=reduction)


def multi_margin_loss(input: Tensor, target: Tensor, p: int = 1, margin: float = 1.0, weight: Tensor | None = None,
                      reduction: str = "mean") -> Tensor:
    """sum over i != y of max(0, margin - x[y] + x[i])^p / C (times weight[y])."""
    if p not in (1, 2):
        raise ValueError(f"multi_margin_loss: p must be 1 or 2, got {p}")
    single = input.ndim <= 1
    x = input.reshape(1, -1) if single else input
    t = target.reshape([1]) if single else target
    if x.ndim != 2 or list(t.layout.shape) != [x.layout.shape[0]]:
        raise ValueError(f"multi_margin_loss: input shape {_fmt(input.shape)} and target shape {_fmt(target.shape)} "
                         "must be (N, C) and (N,)")
    hit = _hits(x, t)
    xy = where(hit, x, 0).sum(1, keepdim=True)
    z = (margin - xy + x).clamp_min(0)
    z = where(hit, 0, z * z if p == 2 else z)
    if weight is not None:
        z = z * (hit.to(x.dtype) * weight.to(x.dtype)).sum(1, keepdim=True)
    loss = z.sum(1) / _scalar(x.graph, x.layout.shape[1], x.dtype)
    return _reduce(loss.reshape([]) if single else loss, reduction, "multi_margin_loss")


def multilabel_margin_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """For each sample, sum over its target classes j (target's entries before the first -1) and the classes i not
    among them of max(0, 1 - (x[j] - x[i])), divided by C."""
    single = input.ndim <= 1
    x = input.reshape(1, -1) if single else input
    t = target.reshape(1, -1) if single else target
    if x.ndim != 2 or t.layout.shape != x.layout.shape:
        raise ValueError(f"multilabel_margin_loss: input shape {_fmt(input.shape)} and target shape "
                         f"{_fmt(target.shape)} must be equal, (C,) or (N, C)")
    t = t.to(dt.int32)
    valid = t.eq(-1).to(dt.int32).cumsum(1).eq(0)  # (N, J): before the first -1
    c = x.layout.shape[1]
    classes = _arange(x.graph, c)
    named = (t.unsqueeze(-1).eq(classes) & valid.unsqueeze(-1)).any(1)  # (N, C): class i is a target
    xt = x.gather(1, where(valid, t, 0))  # (N, J): x at each target
    term = (1 - xt.unsqueeze(-1) + x.unsqueeze(1)).clamp_min(0)  # (N, J, C)
    keep = valid.unsqueeze(-1) & named.logical_not().unsqueeze(1)
    loss = where(keep, term, 0).sum([1, 2]) / _scalar(x.graph, c, x.dtype)
    return _reduce(loss.reshape([]) if single else loss, reduction, "multilabel_margin_loss")


def linear_cross_entropy(input: Tensor, linear_weight: Tensor, target: Tensor, *, linear_bias: Tensor | None = None,
                         weight: Tensor | None = None, reduction: str = "mean", ignore_index: int | None = None,
                         label_smoothing: float = 0.0, options=None) -> Tensor:
    """cross_entropy(linear(input, linear_weight, linear_bias), target, ...) (torch's chunking options only change
    how torch schedules it)."""
    # An N-D linear_weight (C, d..., in) gives logits (N, C, d...): cross_entropy's layout, class dim 1.
    w = linear_weight
    logits = input.linear(w.reshape(-1, w.layout.shape[-1]), None)
    logits = logits.reshape(list(input.layout.shape[:-1]) + list(w.layout.shape[:-1]))
    if linear_bias is not None:
        logits = logits + linear_bias
    return cross_entropy(logits, target, weight, -100 if ignore_index is None else ignore_index, reduction,
                         label_smoothing)
