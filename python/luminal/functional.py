"""Functions with PyTorch names that build tensors or combine several (factories, cat, where, ...)."""
from __future__ import annotations

import builtins
import math
from typing import Sequence

from . import _core
from . import dtypes as dt
from .graph import default_graph
from .tensor import Tensor, _arange, _fmt, _scalar, broadcast_shapes


def _graph_of(tensors, graph):
    for t in tensors:
        if isinstance(t, Tensor):
            return t.graph
    return graph or default_graph()


def arange(start, end=None, step=1, *, dtype=None, graph=None) -> Tensor:
    g = graph or default_graph()
    if end is None:
        start, end = 0, start
    start, end = (_core.to_expr(v) if isinstance(v, str) else v for v in (start, end))
    if all(isinstance(v, (int, _core.Expr)) for v in (start, end)) and isinstance(step, int):
        if step <= 0:
            raise ValueError("arange: step must be positive")
        s, e = _core.to_expr(start), _core.to_expr(end)
        n = (e - s + (step - 1)) // step
        t = g._wrap(g._g.iota(s + _core.Expr.var("z") * step, n))
        return t.to(dtype) if dtype else t
    n = builtins.max(0, math.ceil((end - start) / step))
    return (_arange(g, n).to(dt.float32) * step + start).to(dtype or dt.float32)


def full(shape, value, dtype=dt.float32, *, graph=None) -> Tensor:
    g = graph or default_graph()
    if isinstance(shape, (int, str, _core.Expr)):
        shape = (shape,)
    return g.constant(value, dtype).expand_to([_core.to_expr(d) for d in shape])


def zeros(shape, dtype=dt.float32, *, graph=None) -> Tensor:
    return full(shape, 0, dtype, graph=graph)


def ones(shape, dtype=dt.float32, *, graph=None) -> Tensor:
    return full(shape, 1, dtype, graph=graph)


def zeros_like(t: Tensor, dtype=None) -> Tensor:
    return full(t.layout.shape, 0, dtype or t.dtype, graph=t.graph)


def ones_like(t: Tensor, dtype=None) -> Tensor:
    return full(t.layout.shape, 1, dtype or t.dtype, graph=t.graph)


def full_like(t: Tensor, value, dtype=None) -> Tensor:
    return full(t.layout.shape, value, dtype or t.dtype, graph=t.graph)


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Pads each piece to the full length along `dim` (padding reads as zero) and adds them: exact."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat: needs at least one tensor")
    t0 = tensors[0]
    ax = t0._axis(dim)
    rtype = t0.dtype
    for t in tensors[1:]:
        rtype = dt.result_type(rtype, t.dtype)
        if t.ndim != t0.ndim or any(i != ax and a != b for i, (a, b) in enumerate(zip(t.layout.shape, t0.layout.shape))):
            raise ValueError(f"cat: shapes {_fmt(t0.shape)} and {_fmt(t.shape)} differ outside dim {dim}")
    if len(tensors) == 1:
        return t0.to(rtype)
    total = _core.Expr(0)
    for t in tensors:
        total = total + t.layout.shape[ax]
    out, before = None, _core.Expr(0)
    for t in tensors:
        n = t.layout.shape[ax]
        v = t.to(rtype).layout.pad(ax, before, total - before - n)
        piece = t.to(rtype)._with_view(v)
        out = piece if out is None else out + piece
        before = before + n
    return out


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack: needs at least one tensor")
    ax = tensors[0]._axis(dim, tensors[0].ndim + 1)
    for t in tensors[1:]:
        if t.layout.shape != tensors[0].layout.shape:
            raise ValueError(f"stack: shapes {_fmt(tensors[0].shape)} and {_fmt(t.shape)} differ")
    return cat([t.unsqueeze(ax) for t in tensors], ax)


def where(condition: Tensor, input, other) -> Tensor:
    """Selects exactly (no 0 * inf): stack the two choices and gather by the condition."""
    g = _graph_of([condition, input, other], None)
    if not isinstance(input, Tensor):
        input = g.constant(input, other.dtype if isinstance(other, Tensor) and isinstance(input, (int, float)) and
                           other.dtype.is_float else (dt.float32 if isinstance(input, float) else dt.int32))
    a, b = input._operands(other, "where")
    shape = broadcast_shapes(a.layout.shape, condition.layout.shape, "where")
    a, b, c = a.expand_to(shape), b.expand_to(shape), condition.expand_to(shape)
    n = a.numel()
    table = stack([b, a]).reshape(-1)  # [other..., input...]
    idx = c.to(dt.int32) * _scalar(g, n, dt.int32) + _arange(g, n).reshape([_core.to_expr(d) for d in shape])
    return table._new(g._g.gather(table._edge(), idx._edge()))


def _tri(t: Tensor, diagonal: int, lower: bool) -> Tensor:
    if t.ndim < 2:
        raise ValueError(f"tril/triu need at least 2 dims, got shape {_fmt(t.shape)}")
    rows, cols = t.layout.shape[-2], t.layout.shape[-1]
    i = _arange(t.graph, rows).unsqueeze(1)
    j = _arange(t.graph, cols).unsqueeze(0)
    keep = (j - i).le(diagonal) if lower else (j - i).ge(diagonal)  # (rows, cols)
    return t * keep.to(t.dtype)


def tril(t: Tensor, diagonal: int = 0) -> Tensor:
    return _tri(t, diagonal, True)


def triu(t: Tensor, diagonal: int = 0) -> Tensor:
    return _tri(t, diagonal, False)


def embedding(input: Tensor, weight: Tensor) -> Tensor:
    return weight._new(weight.graph._g.gather(weight._edge(), input.to(dt.int32)._edge()))


# Functional forms of Tensor methods, torch.nn.functional style.
def softmax(x, dim=-1, dtype=None):
    return x.softmax(dim, dtype)


def log_softmax(x, dim=-1, dtype=None):
    return x.log_softmax(dim, dtype)


def linear(x, weight, bias=None):
    return x.linear(weight, bias)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    return x.layer_norm(normalized_shape, weight, bias, eps)


def rms_norm(x, normalized_shape, weight=None, eps=1e-6):
    return x.rms_norm(normalized_shape, weight, eps)


def pad(x, pad, value=0.0):
    return x.pad(pad, value)


def maximum(a, b):
    return a.maximum(b)


def minimum(a, b):
    return a.minimum(b)


def matmul(a, b):
    return a.matmul(b)


for _name in ("exp", "log", "exp2", "log2", "sin", "cos", "sqrt", "rsqrt", "reciprocal", "abs", "sign", "square",
              "relu", "sigmoid", "silu", "gelu", "tanh", "softplus", "leaky_relu", "erf", "clamp", "pow", "lt", "le",
              "gt", "ge", "eq", "ne", "sum", "mean", "max", "min", "prod", "argmax", "argmin", "var", "std",
              "logsumexp", "cumsum", "reshape", "permute", "transpose", "unsqueeze", "squeeze", "flatten", "flip",
              "gather", "index_select", "split", "chunk"):
    globals()[_name] = (lambda n: lambda x, *a, **k: getattr(x, n)(*a, **k))(_name)
