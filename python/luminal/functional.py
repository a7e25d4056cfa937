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
    if builtins.all(isinstance(v, (int, _core.Expr)) for v in (start, end)) and isinstance(step, int):
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
        if t.ndim != t0.ndim or builtins.any(i != ax and a != b for i, (a, b) in
                                             enumerate(zip(t.layout.shape, t0.layout.shape))):
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


concat = concatenate = cat


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


def pad(x, pad, mode="constant", value=None):
    """torch.nn.functional.pad. mode: 'constant' (with value, default 0), 'reflect', 'replicate' or 'circular'."""
    if not isinstance(mode, str):  # pad(x, pad, value) as this module spelled it before modes existed
        mode, value = "constant", mode
    if mode != "constant" and value not in (None, 0, 0.0):
        raise ValueError(f"pad: mode {mode!r} takes no value")
    return x.pad(pad, 0.0 if value is None else value, mode)


def maximum(a, b):
    return a.maximum(b)


def minimum(a, b):
    return a.minimum(b)


def matmul(a, b):
    return a.matmul(b)


def _method(name: str):
    """The function form of Tensor.<name> (torch.<name> / F.<name>); an `inplace` flag changes nothing here."""
    def f(input, *args, **kwargs):
        kwargs.pop("inplace", None)
        return getattr(input, name)(*args, **kwargs)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"torch's {name}(input, ...): Tensor.{name}."
    return f


_METHODS = (
    # math
    "exp", "log", "exp2", "log2", "log10", "log1p", "expm1", "sin", "cos", "tan", "sinh", "cosh", "asin", "acos",
    "atan", "asinh", "acosh", "atanh", "arcsin", "arccos", "arctan", "arcsinh", "arccosh", "arctanh", "atan2",
    "arctan2", "sqrt", "rsqrt", "reciprocal", "abs", "sign", "square", "erf", "pow", "round", "floor", "ceil",
    "trunc", "fix", "frac", "fmod", "remainder", "clamp", "clip", "clamp_min", "clamp_max", "lerp", "heaviside",
    "logit", "nan_to_num",
    "add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide", "floor_divide", "neg", "negative",
    "rsub", "clone",
    # activations
    "relu", "relu6", "sigmoid", "silu", "gelu", "tanh", "softplus", "leaky_relu", "elu", "selu", "celu", "mish",
    "hardswish", "hardsigmoid", "hardtanh", "glu", "softmin", "softsign", "tanhshrink", "logsigmoid", "threshold",
    "softshrink", "hardshrink", "prelu", "rrelu",
    # comparisons and logic
    "lt", "le", "gt", "ge", "eq", "ne", "less", "less_equal", "greater", "greater_equal", "not_equal", "isnan",
    "isinf", "isposinf", "isneginf", "isfinite", "logical_and", "logical_or", "logical_xor", "logical_not",
    # reductions and scans
    "sum", "mean", "max", "min", "amax", "amin", "prod", "argmax", "argmin", "var", "std", "logsumexp", "cumsum",
    "cumprod", "any", "all", "norm",
    # linear algebra
    "mm", "bmm", "mv", "dot", "outer", "ger", "addmm", "addmv", "baddbmm", "addbmm",
    # movement
    "reshape", "permute", "transpose", "unsqueeze", "squeeze", "flatten", "flip", "roll", "tile",
    "repeat_interleave", "movedim", "moveaxis", "swapaxes", "swapdims", "narrow", "unbind", "gather",
    "index_select", "split", "chunk",
)
for _name in _METHODS:
    globals()[_name] = _method(_name)
del _name


def einsum(equation: str, *operands) -> Tensor:
    """torch.einsum: each contraction is a broadcast multiply summed over the last axis (the contracted labels
    merged into it), which the compilers turn into a MatMul."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands or not builtins.all(isinstance(t, Tensor) for t in operands):
        raise TypeError("einsum: operands must be luminal Tensors")
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    subs = lhs.split(",")
    if len(subs) != len(operands):
        raise ValueError(f"einsum: '{equation}' names {len(subs)} operands but {len(operands)} were given")
    rtype = operands[0].dtype
    for t in operands[1:]:
        rtype = dt.result_type(rtype, t.dtype)
    ops = [t.to(rtype) for t in operands]

    def parse(sub: str, where: str) -> tuple[list, list]:
        """Letters before and after the ellipsis (after is None without one)."""
        if sub.count("...") > 1 or "." in sub.replace("...", ""):
            raise ValueError(f"einsum: bad ellipsis in {where} '{sub}' of '{equation}'")
        if not builtins.all(c.isalpha() for c in sub.replace("...", "")):
            raise ValueError(f"einsum: {where} '{sub}' of '{equation}' has a character that is not a letter")
        if "..." not in sub:
            return list(sub), None
        a, b = sub.split("...")
        return list(a), list(b)

    # Labels per operand; the dims an ellipsis covers get labels "...k", k counted from the right (they broadcast).
    labels, n_ell = [], 0
    for k, (sub, t) in enumerate(zip(subs, ops)):
        a, b = parse(sub, f"subscript {k}")
        named = len(a) + len(b or [])
        if (b is None and named != t.ndim) or named > t.ndim:
            raise ValueError(f"einsum: subscript '{sub}' names {named} dims but operand {k} has shape "
                             f"{_fmt(t.shape)}")
        e = t.ndim - named
        n_ell = builtins.max(n_ell, e)
        labels.append(a + [f"...{j}" for j in range(e - 1, -1, -1)] + (b or []))
    ell = [f"...{j}" for j in range(n_ell - 1, -1, -1)]
    if arrow:
        a, b = parse(rhs, "output")
        out = a + (ell + b if b is not None else [])
        for c in out:
            if out.count(c) > 1:
                raise ValueError(f"einsum: output subscript '{c}' repeats in '{equation}'")
            if not c.startswith("...") and not builtins.any(c in lab for lab in labels):
                raise ValueError(f"einsum: output subscript '{c}' appears in no operand of '{equation}'")
    else:  # implicit output: the broadcast dims, then the letters that appear once, in alphabetical order
        letters = [c for lab in labels for c in lab if not c.startswith("...")]
        out = ell + sorted(c for c in set(letters) if letters.count(c) == 1)

    # Each label's size, broadcasting size 1 as torch does; a mismatch names both operands' shapes.
    size, seen = {}, {}
    for k, (lab, t) in enumerate(zip(labels, ops)):
        for c, n in zip(lab, t.layout.shape):
            if c not in size or (size[c] == 1 and n != 1):
                size[c], seen[c] = n, k
            elif n != 1 and n != size[c]:
                j = seen[c]
                raise ValueError(f"einsum: subscript '{c}' has size {n} in operand {k} (shape {_fmt(t.shape)}) but "
                                 f"size {size[c]} in operand {j} (shape {_fmt(ops[j].shape)})")

    def diagonal(t: Tensor, lab: list) -> tuple[Tensor, list]:
        """A label repeated within one operand reads its diagonal: mask with the identity, sum the repeat."""
        for c in dict.fromkeys(lab):
            while lab.count(c) > 1:
                p = lab.index(c)
                q = lab.index(c, p + 1)
                n = t.layout.shape[p]
                if t.layout.shape[q] != n:
                    raise ValueError(f"einsum: subscript '{c}' repeats in one operand with sizes {n} and "
                                     f"{t.layout.shape[q]} (shape {_fmt(t.shape)})")
                i = _arange(t.graph, n)
                eye = i.unsqueeze(1).eq(i.unsqueeze(0)).to(t.dtype)
                shape = [_core.Expr(1)] * t.ndim
                shape[p], shape[q] = n, n
                t = (t * eye.reshape(shape)).sum(q)
                lab = lab[:q] + lab[q + 1:]
        return t, lab

    def sum_out(t: Tensor, lab: list, keep: set) -> tuple[Tensor, list]:
        gone = [i for i, c in enumerate(lab) if c not in keep]
        if gone:
            t = t.sum(gone)
            lab = [c for c in lab if c in keep]
        return t, lab

    def contract(a: Tensor, la: list, b: Tensor, lb: list, keep: set) -> tuple[Tensor, list]:
        batch = [c for c in la if c in lb and c in keep]
        red = [c for c in la if c in lb and c not in keep]
        ma = [c for c in la if c not in lb]
        nb = [c for c in lb if c not in la]
        pa = a.permute([la.index(c) for c in batch + ma + red])
        pb = b.permute([lb.index(c) for c in batch + nb + red])
        if not red:  # nothing to sum: a broadcast product
            pa = pa.reshape(list(pa.layout.shape) + [_core.Expr(1)] * len(nb))
            pb = pb.reshape(list(pb.layout.shape[:len(batch)]) + [_core.Expr(1)] * len(ma) +
                            list(pb.layout.shape[len(batch):]))
            return pa * pb, batch + ma + nb
        # The summed labels, at their common size, merged into one last axis K.
        k = _core.Expr(1)
        for c in red:
            k = k * size[c]

        def last_k(t: Tensor, lead: int) -> Tensor:
            shape = list(t.layout.shape[:lead]) + [size[c] for c in red]
            return t.expand_to(shape).reshape(shape[:lead] + [k])

        pa = last_k(pa, len(batch) + len(ma))
        pb = last_k(pb, len(batch) + len(nb))
        one = [_core.Expr(1)]
        pa = pa.reshape(list(pa.layout.shape[:-1]) + one * len(nb) + [k])
        pb = pb.reshape(list(pb.layout.shape[:len(batch)]) + one * len(ma) + list(pb.layout.shape[len(batch):]))
        return (pa * pb).sum(-1), batch + ma + nb

    outset = set(out)
    items = [diagonal(t, list(lab)) for t, lab in zip(ops, labels)]
    for k in range(len(items)):  # labels only this operand has, and the output lacks, are summed right away
        others = set(outset).union(*(items[j][1] for j in range(len(items)) if j != k))
        items[k] = sum_out(*items[k], others)
    acc, lab = items[0]
    for k in range(1, len(items)):
        keep = set(outset).union(*(items[j][1] for j in range(k + 1, len(items))))
        acc, lab = contract(acc, lab, *items[k], keep)
        acc, lab = sum_out(acc, lab, keep)  # labels of both that no one needs any more
    acc, lab = sum_out(acc, lab, outset)
    acc = acc.permute([lab.index(c) for c in out]) if out else acc
    return acc.expand_to([size[c] for c in out])  # a label of size 1 in every operand it was read from stays 1


def linspace(start, end, steps: int, *, dtype=None, graph=None) -> Tensor:
    """`steps` evenly spaced values from start to end; the second half counts back from end, as torch does, so
    both ends are exact."""
    g = graph or default_graph()
    steps = int(steps)
    if steps < 0:
        raise ValueError(f"linspace: steps must be non-negative, got {steps}")
    if steps == 1:
        return full((1,), start, dtype or dt.float32, graph=g)
    i = _arange(g, steps).to(dt.float32)
    step = (end - start) / builtins.max(steps - 1, 1)
    first = i.lt(steps // 2).to(dt.float32)
    out = first * (i * step + start) + (1 - first) * (end - (steps - 1 - i) * step)
    return out.to(dtype or dt.float32)


def logspace(start, end, steps: int, base: float = 10.0, *, dtype=None, graph=None) -> Tensor:
    t = linspace(start, end, steps, graph=graph)
    return (t * math.log2(base)).exp2().to(dtype or dt.float32)


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """torch.nn.functional.one_hot (int32 here, torch's int64): num_classes must be given (the data cannot set a
    shape)."""
    if tensor.dtype.is_float:
        raise TypeError(f"one_hot: needs an integer tensor of class indices, got {tensor.dtype.name}")
    if num_classes is None or int(num_classes) < 0:
        raise ValueError("one_hot: give num_classes (it cannot be inferred from the data in a static graph)")
    classes = _arange(tensor.graph, int(num_classes))
    return tensor.to(dt.int32).unsqueeze(-1).eq(classes).to(dt.int32)


__all__ = [
    "arange", "full", "zeros", "ones", "zeros_like", "ones_like", "full_like", "cat", "concat", "concatenate",
    "stack", "where", "tril", "triu", "embedding", "softmax", "log_softmax", "linear", "layer_norm", "rms_norm",
    "pad", "maximum", "minimum", "matmul", "einsum", "linspace", "logspace", "one_hot",
] + list(_METHODS)
