"""Functions with PyTorch names that build tensors or combine several (factories, cat, where, ...)."""
from __future__ import annotations

import builtins
import math
from typing import Sequence

from . import _core
from . import dtypes as dt
from .graph import default_graph
from .tensor import Tensor, _arange, _fmt, _scalar
from .tensor import broadcast_shapes as _broadcast


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
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    if builtins.all(isinstance(v, int) for v in (start, end, step)) and step < 0:
        n = builtins.max(0, -((start - end) // step))  # ceil((end - start) / step)
        t = g._wrap(g._g.iota(start + _core.Expr.var("z") * step, n))
        return t.to(dtype) if dtype else t
    if builtins.all(isinstance(v, (int, _core.Expr)) for v in (start, end)) and isinstance(step, int):
        if step < 0:
            raise ValueError("arange: a negative step needs constant start and end")
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
    shape = _broadcast(a.layout.shape, condition.layout.shape, "where")
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
    # a select, not a product: an infinite entry (a -inf mask) times 0 would be nan
    return where(keep, t, 0.0) if t.dtype.is_float else t * keep.to(t.dtype)


def tril(t: Tensor, diagonal: int = 0) -> Tensor:
    return _tri(t, diagonal, True)


def triu(t: Tensor, diagonal: int = 0) -> Tensor:
    return _tri(t, diagonal, False)


def embedding(input: Tensor, weight: Tensor, padding_idx=None, max_norm=None, norm_type: float = 2.0,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    """weight's rows at input. padding_idx, scale_grad_by_freq and sparse only concern gradients; max_norm scales
    each looked-up row whose norm exceeds it down to max_norm (torch renormalises weight in place, the same rows)."""
    out = weight._new(weight.graph._g.gather(weight._edge(), input.to(dt.int32)._edge()))
    if max_norm is not None:
        norm = out.float().norm(norm_type, -1, keepdim=True)
        scale = where(norm.gt(max_norm), max_norm / (norm + 1e-7), 1.0)
        out = out * scale.to(out.dtype)
    return out


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


def constant_pad_nd(x, pad, value=0):
    return x.pad(pad, value)


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
    # more of torch's surface
    "t", "select", "ravel", "unflatten", "sum_to_size", "fliplr", "flipud", "rot90", "tensor_split", "hsplit",
    "vsplit", "dsplit", "split_with_sizes", "unsafe_split", "unsafe_chunk", "diagonal", "diag_embed", "diag",
    "diagflat", "trace", "slice_scatter", "select_scatter", "diagonal_scatter", "take", "addcmul", "addcdiv",
    "erfc", "erfinv", "logaddexp", "logaddexp2", "xlogy", "hypot", "fmax", "fmin", "signbit", "copysign", "sinc",
    "sgn", "deg2rad", "rad2deg", "isclose", "nansum", "nanmean", "var_mean", "std_mean", "aminmax",
    "count_nonzero", "cummax", "cummin", "logcumsumexp", "diff", "dist", "renorm", "cross", "inner", "addr", "cov",
    "corrcoef", "positive", "masked_fill", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "erf",
    "float_power", "unfold", "lgamma", "digamma", "mvlgamma", "i0", "gcd", "lcm", "ldexp", "isin", "put", "histc",
    "quantile", "nanquantile", "nanmedian", "frexp", "mode", "histogram", "gradient", "bitwise_left_shift",
    "bitwise_right_shift",
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
        if isinstance(start, Tensor):  # a 0-d tensor start (torch's tensor overload)
            return start.to(dtype or dt.float32).reshape(1)
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


# ---- more of torch's functions ----------------------------------------------------------------------------------
def _seq(tensors):
    return tuple(tensors[0]) if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)) else tuple(tensors)


def broadcast_shapes(*shapes) -> tuple:
    """torch.broadcast_shapes: the shape the given shapes broadcast to (ints or tuples)."""
    out = []
    for s in shapes:
        s = (s,) if isinstance(s, int) else tuple(s)
        out = _broadcast(out, [_core.to_expr(d) for d in s], "broadcast_shapes")
    return tuple(int(d) if d.is_const() else d for d in out)


def broadcast_tensors(*tensors) -> tuple:
    tensors = _seq(tensors)
    shape = []
    for t in tensors:
        shape = _broadcast(shape, t.layout.shape, "broadcast_tensors")
    return tuple(t.expand_to(shape) for t in tensors)


def broadcast_to(x, size):
    return x.broadcast_to(size)


def _atleast(n: int, tensors):
    tensors = _seq(tensors) if tensors and isinstance(tensors[0], (list, tuple)) else tensors
    out = []
    for t in tensors:
        if t.ndim < n:
            shape = list(t.layout.shape)
            # torch: 0-d -> (1,)/(1, 1)/(1, 1, 1); 1-d (n,) -> (1, n) / (1, n, 1); 2-d (a, b) -> (a, b, 1)
            if n == 3:
                shape = {0: [1, 1, 1], 1: [1] + shape + [1], 2: shape + [1]}[t.ndim]
            else:
                shape = [1] * (n - t.ndim) + shape
            t = t.reshape(shape)
        out.append(t)
    return out[0] if len(out) == 1 else tuple(out)


def atleast_1d(*tensors):
    return _atleast(1, tensors)


def atleast_2d(*tensors):
    return _atleast(2, tensors)


def atleast_3d(*tensors):
    return _atleast(3, tensors)


def hstack(tensors):
    tensors = atleast_1d(*tensors) if len(tensors) > 1 else (atleast_1d(tensors[0]),)
    return cat(tensors, 0 if tensors[0].ndim == 1 else 1)


def vstack(tensors):
    t = atleast_2d(*tensors)
    return cat(t if isinstance(t, tuple) else (t,), 0)


row_stack = vstack


def dstack(tensors):
    t = atleast_3d(*tensors)
    return cat(t if isinstance(t, tuple) else (t,), 2)


def column_stack(tensors):
    cols = [t.reshape(-1, 1) if t.ndim <= 1 else t for t in tensors]
    return cat(cols, 1)


def meshgrid(*tensors, indexing: str = "ij"):
    tensors = _seq(tensors)
    if indexing not in ("ij", "xy"):
        raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    ts = [t.reshape(-1) for t in tensors]
    swap = indexing == "xy" and len(ts) >= 2
    if swap:
        ts[0], ts[1] = ts[1], ts[0]
    shape = [t.layout.shape[0] for t in ts]
    out = []
    for i, t in enumerate(ts):
        view = [_core.Expr(1)] * len(ts)
        view[i] = shape[i]
        out.append(t.reshape(view).expand_to(shape))
    if swap:  # 'xy': the first two inputs vary along dims 1 and 0
        out[0], out[1] = out[1], out[0]
    return tuple(out)


def eye(n, m=None, *, dtype=None, graph=None) -> Tensor:
    g = graph or default_graph()
    m = n if m is None else m
    i, j = _arange(g, n), _arange(g, m)
    return i.unsqueeze(1).eq(j.unsqueeze(0)).to(dtype or dt.float32)


def scalar_tensor(value, *, dtype=None, graph=None) -> Tensor:
    return full((), value, dtype or dt.float32, graph=graph)


def fill(x, value):
    return x.fill(value)


def _tri_indices(row: int, col: int, offset: int, lower: bool, dtype, graph):
    pairs = [(i, j) for i in range(row) for j in range(col) if ((j - i <= offset) if lower else (j - i >= offset))]
    g = graph or default_graph()
    if not pairs:
        return full((2, 0), 0, dtype or dt.int32, graph=g)
    # The pairs as a small constant input (an Iota expression for them would be long).
    import numpy as np

    t = g.named(np.array(pairs, dtype=np.int32).T.copy(), dt.int32)
    return t.to(dtype) if dtype else t


def tril_indices(row: int, col: int, offset: int = 0, *, dtype=None, graph=None):
    return _tri_indices(row, col, offset, True, dtype, graph)


def triu_indices(row: int, col: int, offset: int = 0, *, dtype=None, graph=None):
    return _tri_indices(row, col, offset, False, dtype, graph)


def block_diag(*tensors):
    ts = [t.reshape(1, -1) if t.ndim == 1 else (t.reshape(1, 1) if t.ndim == 0 else t) for t in tensors]
    rtype = ts[0].dtype
    for t in ts[1:]:
        rtype = dt.result_type(rtype, t.dtype)
    rows = builtins.sum((t.layout.shape[0] for t in ts), _core.Expr(0))
    cols = builtins.sum((t.layout.shape[1] for t in ts), _core.Expr(0))
    out, r, c = None, _core.Expr(0), _core.Expr(0)
    for t in ts:
        h, w = t.layout.shape
        piece = t.to(rtype).pad((c, cols - c - w, r, rows - r - h))
        out = piece if out is None else out + piece
        r, c = r + h, c + w
    return out


def cartesian_prod(*tensors):
    tensors = _seq(tensors)
    if len(tensors) == 1:
        return tensors[0]
    grids = meshgrid(*tensors, indexing="ij")
    return stack([g.reshape(-1) for g in grids], 1)


def kron(a, b):
    return a.kron(b)


def cdist(x1, x2, p: float = 2.0, compute_mode=None):
    d = x1.unsqueeze(-2) - x2.unsqueeze(-3)
    return d.norm(p, -1)


def trapezoid(y, x=None, *, dx=None, dim: int = -1):
    ax = y._axis(dim)
    n = y.layout.shape[ax]
    if n.is_const() and int(n) == 0:
        return y.sum(ax) * 0
    lo, hi = y.narrow(ax, 0, n - 1), y.narrow(ax, 1, n - 1)
    if x is not None:
        xd = x.diff(dim=dim if x.ndim > 1 else -1)
        if x.ndim == 1 and y.ndim > 1:
            xd = xd.reshape([xd.layout.shape[0]] + [1] * (y.ndim - 1 - ax))
        return ((hi + lo) * xd).sum(ax) * 0.5
    return (hi + lo).sum(ax) * (0.5 * (1.0 if dx is None else dx))


trapz = trapezoid


def cumulative_trapezoid(y, x=None, *, dx=None, dim: int = -1):
    ax = y._axis(dim)
    n = y.layout.shape[ax]
    lo, hi = y.narrow(ax, 0, n - 1), y.narrow(ax, 1, n - 1)
    if x is not None:
        xd = x.diff(dim=dim if x.ndim > 1 else -1)
        if x.ndim == 1 and y.ndim > 1:
            xd = xd.reshape([xd.layout.shape[0]] + [1] * (y.ndim - 1 - ax))
        return ((hi + lo) * xd * 0.5).cumsum(ax)
    return ((hi + lo) * (0.5 * (1.0 if dx is None else dx))).cumsum(ax)


def tensordot(a, b, dims=2):
    if isinstance(dims, int):
        da, db = list(range(a.ndim - dims, a.ndim)), list(range(dims))
    else:
        da, db = ([dims[0]] if isinstance(dims[0], int) else list(dims[0])), \
            ([dims[1]] if isinstance(dims[1], int) else list(dims[1]))
    da, db = [a._axis(d) for d in da], [b._axis(d) for d in db]
    ra = [d for d in range(a.ndim) if d not in da]
    rb = [d for d in range(b.ndim) if d not in db]
    sa, sb = list(a.layout.shape), list(b.layout.shape)
    for x, y in zip(da, db):  # size 1 against n broadcasts, as torch does
        if sa[x] != sb[y]:
            if sa[x] != 1 and sb[y] != 1:
                raise ValueError(f"tensordot: contracted dims {x} of {_fmt(a.shape)} and {y} of {_fmt(b.shape)} "
                                 "differ")
            sa[x] = sb[y] = sa[x] if sb[y] == 1 else sb[y]
    a, b = a.expand_to(sa), b.expand_to(sb)
    k = _core.Expr(1)
    for d in da:
        k = k * a.layout.shape[d]
    am = a.permute(ra + da).reshape([-1, k] if ra else [1, k])
    bm = b.permute(db + rb).reshape([k, -1] if rb else [k, 1])
    out = am.matmul(bm)
    return out.reshape([a.layout.shape[d] for d in ra] + [b.layout.shape[d] for d in rb])


def _copy_of(name: str):
    def f(input, *args, **kwargs):
        out = getattr(input, name)(*args, **kwargs)
        return type(out)(o.contiguous() for o in out) if isinstance(out, (list, tuple)) else out.contiguous()

    f.__name__ = f.__qualname__ = name + "_copy"
    f.__doc__ = f"torch's {name}_copy: Tensor.{name} (values are immutable here, so the view is the copy)."
    return f


def polygamma(n: int, input):
    return input.polygamma(n)


def bucketize(input, boundaries, *, out_int32: bool = False, right: bool = False):
    """The index of each value's bucket among sorted 1-D boundaries: how many boundaries lie below it (or at or
    below it with right=True)."""
    if not isinstance(input, Tensor):
        input = boundaries.graph.constant(input, boundaries.dtype)
    below = boundaries.le(input.unsqueeze(-1)) if right else boundaries.lt(input.unsqueeze(-1))
    return below.to(dt.int32).sum(-1)


def searchsorted(sorted_sequence, input, *, out_int32: bool = False, right: bool = False, side=None, sorter=None):
    if side is not None:
        right = side == "right"
    seq = sorted_sequence
    if sorter is not None:
        seq = seq.gather(-1, sorter)
    if not isinstance(input, Tensor):
        input = seq.graph.constant(input, seq.dtype)
    if seq.ndim == 1:
        return bucketize(input, seq, right=right)
    below = seq.unsqueeze(-2).le(input.unsqueeze(-1)) if right else seq.unsqueeze(-2).lt(input.unsqueeze(-1))
    return below.to(dt.int32).sum(-1)


def unravel_index(indices, shape):
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    i = indices.to(dt.int32)
    out, stride = [], 1
    for d in reversed(shape):
        out.append((i // stride).remainder(d) if stride > 1 else i.remainder(d))
        stride *= d
        if stride >= 2 ** 31:
            stride = 2 ** 31  # beyond int32: every index is below it
    return tuple(reversed(out))


def combinations(input, r: int = 2, with_replacement: bool = False):
    import itertools

    n = input.layout.shape[0]
    if input.ndim != 1 or not n.is_const():
        raise ValueError(f"combinations: needs a 1-D tensor of constant size, got shape {_fmt(input.shape)}")
    pick = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    rows = list(pick(range(int(n)), r))
    if not rows or not r:
        return full((0, r) if r else (0,), 0, input.dtype, graph=input.graph)
    import numpy as np

    idx = input.graph.named(np.asarray(rows, dtype=np.int32).reshape(-1), dt.int32)
    return input.index_select(0, idx).reshape(len(rows), r)


def channel_shuffle(input, groups: int):
    n, c = input.layout.shape[0], input.layout.shape[1]
    rest = list(input.layout.shape[2:])
    x = input.reshape([n, _core.Expr(groups), c // groups] + rest)
    return x.transpose(1, 2).reshape(input.layout.shape)


def bilinear(input1, input2, weight, bias=None):
    """y[..., o] = sum_ij x1[..., i] W[o, i, j] x2[..., j] + b[o]."""
    out = einsum("...i,oij,...j->...o", input1, weight, input2)
    return out + bias if bias is not None else out


def pdist(input, p: float = 2.0):
    """The distances between each pair of rows i < j of an (N, M) input, in row-major order."""
    n = input.layout.shape[0]
    if input.ndim != 2 or not n.is_const():
        raise ValueError(f"pdist: needs a 2-D input with a constant first dim, got shape {_fmt(input.shape)}")
    import itertools

    import numpy as np

    pairs = list(itertools.combinations(range(int(n)), 2))
    if not pairs:
        return full((0,), 0, input.dtype, graph=input.graph)
    idx = np.asarray(pairs, dtype=np.int32)
    a = input.index_select(0, input.graph.named(idx[:, 0].copy(), dt.int32))
    b = input.index_select(0, input.graph.named(idx[:, 1].copy(), dt.int32))
    return (a - b).norm(p, -1)


def upsample_nearest(input, size=None, scale_factor=None):
    from .convolution import interpolate

    return interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input, size=None, scale_factor=None):
    from .convolution import interpolate

    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)


def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type: float = 2.0, scale_grad_by_freq=False,
                  mode: str = "mean", sparse: bool = False, per_sample_weights=None, include_last_offset=False,
                  padding_idx=None):
    """Sums, means or maxima of bags of embedding rows: the rows of a 2-D input, or the stretches of a 1-D input
    that start at offsets. An empty bag gives zeros; padding_idx entries are left out."""
    if mode not in ("sum", "mean", "max"):
        raise ValueError(f"embedding_bag: mode must be 'sum', 'mean' or 'max', got {mode!r}")
    idx = input.to(dt.int32)
    p = idx.reshape(-1)
    rows = embedding(p, weight, max_norm=max_norm, norm_type=norm_type)  # (P, D)
    n = p.layout.shape[0]
    pos = _arange(weight.graph, n)
    if input.ndim == 2:
        length = input.layout.shape[1]
        bag = pos // _scalar(weight.graph, length, dt.int32)
        member = bag.unsqueeze(0).eq(_arange(weight.graph, input.layout.shape[0]).unsqueeze(1))  # (B, P)
    else:
        if offsets is None:
            raise ValueError("embedding_bag: a 1-D input needs offsets")
        o = offsets.to(dt.int32)
        starts = o.narrow(0, 0, o.layout.shape[0] - 1) if include_last_offset else o
        ends = o.narrow(0, 1, o.layout.shape[0] - 1) if include_last_offset else cat(
            [o.narrow(0, 1, o.layout.shape[0] - 1), _scalar(weight.graph, n, dt.int32).reshape(1)])
        member = pos.unsqueeze(0).ge(starts.unsqueeze(1)) & pos.unsqueeze(0).lt(ends.unsqueeze(1))
    if padding_idx is not None:
        member = member & p.ne(padding_idx).unsqueeze(0)
    m = member.to(rows.dtype)
    if mode == "max":
        big = where(member.unsqueeze(-1), rows.unsqueeze(0), float("-inf")).amax(1)
        return where(member.any(1).unsqueeze(-1), big, 0)
    if per_sample_weights is not None:
        m = m * per_sample_weights.to(rows.dtype).reshape(1, -1)
    out = m.matmul(rows)
    if mode == "mean":
        out = out / member.to(rows.dtype).sum(1, keepdim=True).maximum(1)
    return out


def alias_copy(input):
    return input.contiguous()


_COPIES = ("diagonal", "expand", "permute", "squeeze", "t", "transpose", "unsqueeze", "view", "unbind",
           "unfold", "split_with_sizes", "narrow")
for _name in _COPIES:
    globals()[_name + "_copy"] = _copy_of(_name)
del _name


__all__ = [
    "arange", "full", "zeros", "ones", "zeros_like", "ones_like", "full_like", "cat", "concat", "concatenate",
    "stack", "where", "tril", "triu", "embedding", "softmax", "log_softmax", "linear", "layer_norm", "rms_norm",
    "pad", "maximum", "minimum", "matmul", "einsum", "linspace", "logspace", "one_hot", "constant_pad_nd",
    "broadcast_shapes", "broadcast_tensors", "broadcast_to", "atleast_1d", "atleast_2d", "atleast_3d", "hstack",
    "vstack", "row_stack", "dstack", "column_stack", "meshgrid", "eye", "scalar_tensor", "fill", "tril_indices",
    "triu_indices", "block_diag", "cartesian_prod", "kron", "cdist", "trapezoid", "trapz", "cumulative_trapezoid",
    "tensordot", "embedding_bag", "channel_shuffle", "bilinear", "pdist", "upsample_nearest", "upsample_bilinear",
    "polygamma", "bucketize", "searchsorted", "unravel_index", "combinations",
] + ["alias_copy"] + [n + "_copy" for n in _COPIES] + list(_METHODS)
