"""Sorting, selection, scatter and advanced indexing with torch's names and semantics, composed from the primops.

Sorting ranks each element by counting, along its row, the elements that sort before it (a broadcast compare and a
SumReduce over (..., n, n), which the compilers fuse into one reduction), then writes every element to its rank
with one Scatter. That is O(n^2) per row: meant for the rows models sort (MoE routing over <= a few hundred experts,
top-k sampling over modest rows), not for sorting millions of elements.

Ties: elements that compare equal keep their index order (every sort is stable; torch's unstable sort and topk may
order ties differently). NaN sorts as the largest value, as in torch.

The accumulating scatters (scatter_add, scatter_reduce, index_add, index_put(accumulate=True)) compare each index
with every position of the destination, a one-hot broadcast compare reduced over the source axis: exact, fusable,
and duplicate indices accumulate. For "sum" this is a multiply by 0 or 1, so an inf or NaN in the source turns the
other positions of its reduction into NaN where torch leaves them alone (finite sources are exact). The
overwriting ones (scatter, index_put) write with the Scatter primop: with duplicate indices one of the written
values wins, as in torch (the CPU executor: the last).

Indices out of range raise when the graph runs (the Gather or Scatter reading them reports it), never garbage.
"""
from __future__ import annotations

from collections import namedtuple

from . import _core
from . import dtypes as dt
from .tensor import Tensor, _arange, _arange_along, _fmt, _scalar, broadcast_shapes

__all__ = ["topk", "sort", "argsort", "msort", "kthvalue", "median", "scatter", "scatter_add", "scatter_reduce",
           "index_add", "index_put", "index_fill", "masked_scatter", "take_along_dim", "index_reduce"]

# torch.return_types.* look-alikes: tuples with .values and .indices.
topk_result = namedtuple("topk", ["values", "indices"])
sort_result = namedtuple("sort", ["values", "indices"])
kthvalue_result = namedtuple("kthvalue", ["values", "indices"])
median_result = namedtuple("median", ["values", "indices"])


# ---- helpers --------------------------------------------------------------------------------------------------------
def _to_last(x: Tensor, ax: int) -> Tensor:
    return x.transpose(ax, -1) if ax != x.ndim - 1 else x


def _known(e) -> int | None:
    e = _core.to_expr(e)
    return int(e) if e.is_const() else None


def _prod(dims):
    n = _core.Expr(1)
    for d in dims:
        n = n * d
    return n


def _int_index(index, op: str) -> Tensor:
    if not isinstance(index, Tensor):
        raise TypeError(f"{op}: index must be a Tensor, got {type(index).__name__}")
    if index.dtype.is_float or index.dtype is dt.bool_:
        raise TypeError(f"{op}: index must be an integer tensor, got {index.dtype.name}")
    return index.to(dt.int32)


def _checked(idx: Tensor, n, wrap: bool) -> Tensor:
    """idx (int32) as positions in [0, n): negatives counted from the end if `wrap`. Read through a Gather of
    0..n-1, so an index out of range raises when the graph runs instead of being silently ignored."""
    if wrap:
        idx = idx + idx.lt(0).to(dt.int32) * _scalar(idx.graph, n, dt.int32)
    table = _arange(idx.graph, n)
    return idx._new(idx.graph._g.gather(table._edge(), idx._edge()))


def _le(a, b) -> bool:
    """a <= b for dims that may be symbolic (equal expressions, or both constant)."""
    a, b = _core.to_expr(a), _core.to_expr(b)
    return a == b or (a.is_const() and b.is_const() and int(a) <= int(b))


def _ranks(x: Tensor, descending: bool) -> Tensor:
    """x (..., n) -> int32 (..., n): each element's position in the stable sorted order of its row.

    Element j sorts before element i if it is strictly before by value, or neither is before the other and
    t_j < t_i, where t is the index shifted by -n (descending) or +n (ascending) for NaN: a comparison with NaN is
    false both ways, so the index shift alone puts NaN first (descending) or last (ascending), NaNs in index order.
    Per pair that is a few LessThans and bool logic, in float32 registers for float inputs: one fused reduction."""
    n = x.layout.shape[-1]
    g = x.graph
    if x.dtype is not dt.int32:
        x = x.to(dt.float32)  # exact for every other dtype, and the fused loop stays in float registers
    t = _arange(g, n).to(dt.float32)
    if x.dtype.is_float:
        t = t + x.isnan().to(dt.float32) * _scalar(g, n, dt.float32) * (-1 if descending else 1)
    xi, xj = x.unsqueeze(-1), x.unsqueeze(-2)  # element i down the rows, element j across
    ti, tj = t.unsqueeze(-1), t.unsqueeze(-2)
    ahead, behind = (xi.lt(xj), xj.lt(xi)) if descending else (xj.lt(xi), xi.lt(xj))
    first = ahead | (tj.lt(ti) & behind.lt(True))
    return first.to(dt.float32).sum(-1).to(dt.int32)


def _scatter_rows(x: Tensor, rank: Tensor) -> Tensor:
    """out[..., rank[..., i]] = x[..., i] for a permutation `rank` of each row: one Scatter over the flat rows."""
    shape = list(x.layout.shape)
    n = shape[-1]
    rows = _prod(shape[:-1])
    g = x.graph
    flat = rank.reshape([rows, n]) + (_arange(g, rows) * _scalar(g, n, dt.int32)).unsqueeze(-1)
    dest = g.constant(0, x.dtype).expand_to([rows * n, _core.Expr(1)])
    src = x.reshape([rows, n, _core.Expr(1)])
    out = x._new(g._g.scatter(dest._edge(), flat._edge(), src._edge()))
    return out.reshape(shape)


def _sorted(x: Tensor, dim: int, descending: bool):
    if x.ndim == 0:
        v, i = _sorted(x.reshape(1), 0, descending)
        return v.reshape([]), i.reshape([])
    ax = x._axis(dim)
    y = _to_last(x, ax)
    rank = _ranks(y, descending)
    values = _scatter_rows(y, rank)
    indices = _scatter_rows(_arange_along(y, y.ndim - 1), rank)
    return _to_last(values, ax), _to_last(indices, ax)


# ---- sorting and selection -----------------------------------------------------------------------------------------
def sort(input: Tensor, dim: int = -1, descending: bool = False, *, stable: bool = False):
    """torch.sort -> (values, indices). Always stable: equal elements keep their index order. NaN sorts last
    (first when descending). O(n^2) per row (see the module's doc)."""
    return sort_result(*_sorted(input, dim, descending))


def argsort(input: Tensor, dim: int = -1, descending: bool = False, *, stable: bool = False) -> Tensor:
    return _sorted(input, dim, descending)[1]


def msort(input: Tensor) -> Tensor:
    """torch.msort: sorted along dim 0."""
    return _sorted(input, 0, False)[0]


def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    """torch.topk -> (values, indices): the k largest (smallest with largest=False) along `dim`, in order. Among
    equal values the lower index comes first; NaN counts as the largest. The result is always sorted."""
    ax = input._axis(dim) if input.ndim else 0
    n = input.layout.shape[ax] if input.ndim else _core.Expr(1)
    if not isinstance(k, int) or isinstance(k, bool):
        raise TypeError(f"topk: k must be an int, got {k!r}")
    if k < 0 or (_known(n) is not None and k > _known(n)):
        raise ValueError(f"topk: k={k} is out of range for dim {dim} of size {n} (input shape {_fmt(input.shape)})")
    values, indices = _sorted(input, ax, largest)
    if input.ndim == 0:
        return topk_result(values, indices)
    sl = tuple([slice(None)] * ax + [slice(0, k)])
    return topk_result(values[sl], indices[sl])


def kthvalue(input: Tensor, k: int, dim: int = -1, keepdim: bool = False):
    """torch.kthvalue -> (values, indices): the k-th smallest (k from 1) along `dim`."""
    x = input.reshape(1) if input.ndim == 0 else input
    ax = x._axis(dim)
    n = x.layout.shape[ax]
    if not isinstance(k, int) or k < 1 or (_known(n) is not None and k > _known(n)):
        raise ValueError(f"kthvalue: k={k} is out of range for dim {dim} of size {n} (input shape "
                         f"{_fmt(input.shape)})")
    values, indices = _sorted(x, ax, False)
    sl = tuple([slice(None)] * ax + [slice(k - 1, k)])
    values, indices = values[sl], indices[sl]
    if not keepdim or input.ndim == 0:
        values, indices = values.squeeze(ax), indices.squeeze(ax)
    return kthvalue_result(values, indices)


def median(input: Tensor, dim: int | None = None, keepdim: bool = False):
    """torch.median: the lower median. With `dim`, (values, indices); without, the median of all elements. A row
    holding NaN gives NaN (and the index of its first NaN), as torch does."""
    if dim is None:
        return median(input.reshape(-1), 0).values
    x = input.reshape(1) if input.ndim == 0 else input
    ax = x._axis(dim)
    n = x.layout.shape[ax]
    values, indices = _sorted(x, ax, False)
    g = x.graph
    pos = (_scalar(g, n, dt.int32) - 1) // 2
    if x.dtype.is_float:  # NaNs sort last: the first of them is at n - count
        cnt = x.isnan().to(dt.int32).sum(ax, keepdim=True)
        pos = pos + cnt.gt(0).to(dt.int32) * (_scalar(g, n, dt.int32) - cnt - pos)
    else:
        pos = pos.reshape([1] * x.ndim)
    shape = list(x.layout.shape)
    shape[ax] = _core.Expr(1)
    pos = pos.expand_to(shape)
    values, indices = values.gather(ax, pos), indices.gather(ax, pos)
    if not keepdim or input.ndim == 0:
        values, indices = values.squeeze(ax), indices.squeeze(ax)
    return median_result(values, indices)


# ---- scatter --------------------------------------------------------------------------------------------------------
def _scatter_args(op: str, input: Tensor, dim: int, index, src=None):
    """Checks torch's shape rules; returns (axis, int32 index, src cut to the index's shape or None)."""
    ax = input._axis(dim) if input.ndim else 0
    idx = _int_index(index, op)
    x = input if input.ndim else input.reshape(1)
    if idx.ndim != x.ndim and not (input.ndim == 0 and idx.ndim <= 1):
        raise ValueError(f"{op}: index {_fmt(index.shape)} and input {_fmt(input.shape)} must have the same number "
                         "of dims")
    if idx.ndim == 0:
        idx = idx.reshape(1)
    for d in range(x.ndim):
        if d != ax and not _le(idx.layout.shape[d], x.layout.shape[d]):
            raise ValueError(f"{op}: index {_fmt(index.shape)} is larger than input {_fmt(input.shape)} in dim {d}")
    if isinstance(src, Tensor):
        s = src if src.ndim else src.reshape(1)
        if s.ndim != idx.ndim or not all(_le(a, b) for a, b in zip(idx.layout.shape, s.layout.shape)):
            raise ValueError(f"{op}: index {_fmt(index.shape)} is larger than src {_fmt(src.shape)} (src needs the "
                             "same number of dims and at least the index's size in each)")
        src = s[tuple(slice(0, d) for d in idx.layout.shape)].to(input.dtype)
    return ax, idx, src


def scatter(input: Tensor, dim: int, index: Tensor, src=None, *, value=None, reduce: str | None = None) -> Tensor:
    """torch.scatter: out[..., index[i, j], ...] = src[i, j] along `dim` (or `value`). With duplicate indices one of
    the values is written (torch leaves it undefined too). reduce="add"/"multiply": torch's older spelling of
    scatter_reduce with "sum"/"prod"."""
    if src is None and value is None:
        raise TypeError("scatter: needs src (a tensor) or value")
    if src is not None and not isinstance(src, Tensor):
        src, value = None, src
    if reduce is not None:
        red = {"add": "sum", "multiply": "prod"}.get(reduce)
        if red is None:
            raise ValueError(f"scatter: reduce must be 'add' or 'multiply', got {reduce!r}")
        if src is None:
            src = input.graph.constant(value, input.dtype).expand_to(index.layout.shape)
        return _reduce_into("scatter", input, dim, index, src, red, True)
    ax, idx, src = _scatter_args("scatter", input, dim, index, src)
    x = input if input.ndim else input.reshape(1)
    if src is None:
        src = x.graph.constant(value, x.dtype).expand_to(idx.layout.shape)
    # One Scatter over the flat input: element (.., index[..], ..) of a contiguous layout is at sum(coord * stride).
    shape = list(x.layout.shape)
    strides = _core.View.contiguous(shape).strides
    g = x.graph
    n = shape[ax]
    bad = idx.lt(0) | idx.ge(_scalar(g, n, dt.int32))  # pushed past the end, so the Scatter reports it
    flat = idx * _scalar(g, strides[ax], dt.int32) + bad.to(dt.int32) * _scalar(g, x.numel(), dt.int32)
    for d in range(x.ndim):
        if d != ax:
            flat = flat + _arange_along(idx, d) * _scalar(g, strides[d], dt.int32)
    dest = x.reshape([x.numel(), 1])
    out = x._new(g._g.scatter(dest._edge(), flat._edge(), src.unsqueeze(-1)._edge()))
    return out.reshape(input.layout.shape)


_REDUCES = ("sum", "prod", "mean", "amax", "amin")


def scatter_reduce(input: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str,
                   include_self: bool = True) -> Tensor:
    """torch.scatter_reduce: combines src[i, j] into out[..., index[i, j], ...] with reduce = "sum", "prod",
    "mean", "amax" or "amin"; duplicate indices all count. include_self=False leaves the input's own value out of
    the positions that receive something. Integer "mean" rounds down, as torch does."""
    return _reduce_into("scatter_reduce", input, dim, index, src, reduce, include_self)


def _reduce_into(op: str, input: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str,
                 include_self: bool) -> Tensor:
    if reduce not in _REDUCES:
        raise ValueError(f"{op}: reduce must be one of {', '.join(_REDUCES)}, got {reduce!r}")
    if not isinstance(src, Tensor):
        raise TypeError(f"{op}: src must be a Tensor, got {type(src).__name__}")
    ax, idx, src = _scatter_args(op, input, dim, index, src)
    x = input if input.ndim else input.reshape(1)
    g = x.graph
    n = x.layout.shape[ax]
    idx = _checked(idx, n, wrap=False)
    # hit[..., p, i]: source i (along dim, moved last) lands on position p.
    it, st = _to_last(idx, ax), _to_last(src, ax)
    hit = it.unsqueeze(-2).eq(_arange(g, n).unsqueeze(-1))
    count = hit.to(dt.int32).sum(-1)  # (..., n) over the index's extent
    if reduce in ("sum", "mean"):
        red = (hit.to(x.dtype) * st.unsqueeze(-2)).sum(-1)
    else:
        from .functional import where

        fill = {"prod": 1, "amax": float("-inf"), "amin": float("inf")}[reduce]
        if not x.dtype.is_float and reduce != "prod":
            fill = -2**31 if reduce == "amax" else 2**31 - 1
        picked = where(hit, st.unsqueeze(-2).expand_to(hit.layout.shape), x.graph.constant(fill, x.dtype))
        red = picked.prod(-1) if reduce == "prod" else picked.amax(-1) if reduce == "amax" else picked.amin(-1)
    # Back to the input's extent: positions the index does not reach get count 0 (padding reads zero).
    xt = _to_last(x, ax)
    pads = []
    for have, want in zip(reversed(count.layout.shape), reversed(xt.layout.shape)):
        pads += [0, want - have]
    count, red = count.pad(pads), red.pad(pads)
    hitany = count.gt(0)
    if reduce == "sum":
        out = xt + red if include_self else _where(hitany, red, xt)
    elif reduce == "mean":
        total = xt + red if include_self else red
        cnt = (count + 1 if include_self else count.maximum(1)).to(x.dtype)
        mean = total / cnt if x.dtype.is_float else (total // cnt)
        out = _where(hitany, mean.to(x.dtype), xt)
    else:
        comb = red if not include_self else (xt * red if reduce == "prod" else
                                             xt.maximum(red) if reduce == "amax" else xt.minimum(red))
        out = _where(hitany, comb.to(x.dtype), xt)
    return _to_last(out, ax).reshape(input.layout.shape)


def _where(c, a, b):
    from .functional import where

    return where(c, a, b)


def scatter_add(input: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """torch.scatter_add: out[..., index[i, j], ...] += src[i, j]; duplicate indices accumulate."""
    return _reduce_into("scatter_add", input, dim, index, src, "sum", True)


def index_add(input: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha=1) -> Tensor:
    """torch.index_add: out[..., index[i], ...] += alpha * source[..., i, ...] along `dim`; duplicate indices
    accumulate. A (n, m) one-hot matrix times source: one MatMul."""
    x = input if input.ndim else input.reshape(1)
    ax = x._axis(dim)
    idx = _int_index(index, "index_add")
    if idx.ndim > 1:
        raise ValueError(f"index_add: index must be 1-D, got shape {_fmt(index.shape)}")
    idx = idx.reshape(-1)
    s = source if source.ndim else source.reshape(1)
    want = list(x.layout.shape)
    want[ax] = idx.layout.shape[0]
    if list(s.layout.shape) != want:
        raise ValueError(f"index_add: source {_fmt(source.shape)} must have input {_fmt(input.shape)}'s shape with "
                         f"dim {dim} the index's length ({_fmt(want)})")
    n = x.layout.shape[ax]
    idx = _checked(idx, n, wrap=False)
    onehot = idx.unsqueeze(0).eq(_arange(x.graph, n).unsqueeze(-1)).to(x.dtype)  # (n, m)
    rest = [d for i, d in enumerate(want) if i != ax]
    src = s.to(x.dtype).transpose(0, ax) if ax else s.to(x.dtype)
    src = src.reshape([want[ax], _prod(rest)])
    added = onehot @ src  # (n, rest)
    shape = list(x.layout.shape)
    moved = [shape[ax]] + [d for i, d in enumerate(shape) if i != ax] if ax else shape
    added = added.reshape(moved)
    if ax:
        added = added.permute([*range(1, ax + 1), 0, *range(ax + 1, x.ndim)])
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        added = added * alpha
    return (x + added).to(x.dtype).reshape(input.layout.shape)


def index_put(input: Tensor, indices, values, accumulate: bool = False) -> Tensor:
    """torch.index_put: out[indices] = values (or += with accumulate, duplicates accumulating). `indices` is a
    tuple of integer tensors for the leading dims, broadcast together; negative indices count from the end. Bool
    masks as indices are not supported (their result shape depends on the data): use masked_fill or where."""
    if isinstance(indices, Tensor):
        indices = (indices,)
    indices = list(indices)
    if not indices or len(indices) > input.ndim:
        raise IndexError(f"index_put: {len(indices)} index tensors for input {_fmt(input.shape)}")
    for t in indices:
        if isinstance(t, Tensor) and t.dtype is dt.bool_:
            raise NotImplementedError("index_put: bool mask indices make a data-dependent shape; use masked_fill "
                                      "or where")
    idxs = [_int_index(t, "index_put") for t in indices]
    g = input.graph
    try:
        bshape = idxs[0].layout.shape
        for t in idxs[1:]:
            bshape = broadcast_shapes(bshape, t.layout.shape, "index_put")
    except ValueError:
        raise ValueError("index_put: index shapes " + ", ".join(_fmt(t.shape) for t in idxs) +
                         " cannot be broadcast together") from None
    k = len(idxs)
    shape = list(input.layout.shape)
    lead, rest = shape[:k], shape[k:]
    flat = None
    for d, t in enumerate(idxs):
        t = _checked(t, lead[d], wrap=True).expand_to(bshape)
        stride = _prod(lead[d + 1:])
        term = t * _scalar(g, stride, dt.int32) if not (stride.is_const() and int(stride) == 1) else t
        flat = term if flat is None else flat + term
    rows = _prod(lead)
    table = input.reshape([rows] + rest)
    if not isinstance(values, Tensor):
        values = g.constant(values, input.dtype)
    try:
        vals = values.to(input.dtype).expand_to(list(bshape) + rest)
    except ValueError:
        raise ValueError(f"index_put: values {_fmt(values.shape)} cannot be broadcast to the indexed shape "
                         f"{_fmt(list(bshape) + rest)}") from None
    if accumulate:
        m = _prod(bshape)
        out = index_add(table, 0, flat.reshape([m]), vals.reshape([m] + rest))
    else:
        if flat.ndim == 0:
            flat, vals = flat.reshape(1), vals.unsqueeze(0)
        out = input._new(g._g.scatter(table._edge(), flat._edge(), vals._edge()))
    return out.reshape(shape)


def index_fill(input: Tensor, dim: int, index: Tensor, value) -> Tensor:
    """torch.index_fill: the slices index[i] along `dim` set to `value` (negative indices count from the end)."""
    x = input if input.ndim else input.reshape(1)
    ax = x._axis(dim)
    idx = _int_index(index, "index_fill")
    if idx.ndim > 1:
        raise ValueError(f"index_fill: index must be 0-D or 1-D, got shape {_fmt(index.shape)}")
    n = x.layout.shape[ax]
    idx = _checked(idx.reshape(-1), n, wrap=True)
    hit = idx.unsqueeze(0).eq(_arange(x.graph, n).unsqueeze(-1)).to(dt.int32).amax(-1).bool()  # (n,)
    for _ in range(x.ndim - 1 - ax):
        hit = hit.unsqueeze(-1)
    if isinstance(value, Tensor):
        if value.ndim:
            raise ValueError(f"index_fill: value must be a 0-d tensor, got shape {_fmt(value.shape)}")
        value = value.to(x.dtype).expand_to(x.layout.shape)
    else:
        value = x._const_like(value)
    return _where(hit.expand_to(x.layout.shape), value, x).reshape(input.layout.shape)


def masked_scatter(input: Tensor, mask: Tensor, source: Tensor) -> Tensor:
    """torch.masked_scatter: the positions where mask is true (broadcast to input) take source's elements in order.
    Finding each position's source element is a cumulative count over all elements: quadratic in input.numel()."""
    if mask.dtype is not dt.bool_:
        raise TypeError(f"masked_scatter: mask must be bool, got {mask.dtype.name}")
    try:  # torch broadcasts input and mask together
        shape = broadcast_shapes(input.layout.shape, mask.layout.shape, "masked_scatter")
    except ValueError:
        raise ValueError(f"masked_scatter: mask {_fmt(mask.shape)} cannot be broadcast with input "
                         f"{_fmt(input.shape)}") from None
    input, m = input.expand_to(shape), mask.expand_to(shape)
    mi = m.to(dt.int32).reshape(-1)
    pos = (mi.cumsum(0) - 1) * mi  # the source element of each masked position (0 elsewhere)
    taken = source.to(input.dtype).reshape(-1).gather(0, pos)
    return _where(m, taken.reshape(input.layout.shape), input)


def take_along_dim(input: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
    """torch.take_along_dim: gather along `dim` with input and indices broadcast in the other dims (negative
    indices count from the end); dim=None reads the flattened input (negative indices are an error there, as in
    torch)."""
    idx = _int_index(indices, "take_along_dim")
    if dim is None:
        flat = input.reshape(-1)
        return flat.gather(0, idx.reshape(-1))  # torch does not wrap negative indices here
    ax = input._axis(dim)
    if idx.ndim != input.ndim:
        raise ValueError(f"take_along_dim: indices {_fmt(indices.shape)} and input {_fmt(input.shape)} must have "
                         "the same number of dims")
    a, b = list(input.layout.shape), list(idx.layout.shape)
    try:
        other = broadcast_shapes(a[:ax] + a[ax + 1:], b[:ax] + b[ax + 1:], "take_along_dim")
    except ValueError:
        raise ValueError(f"take_along_dim: indices {_fmt(indices.shape)} and input {_fmt(input.shape)} cannot be "
                         f"broadcast outside dim {dim}") from None
    x = input.expand_to(other[:ax] + [a[ax]] + other[ax:])
    idx = idx + idx.lt(0).to(dt.int32) * _scalar(input.graph, a[ax], dt.int32)  # gather reports the rest
    idx = idx.expand_to(other[:ax] + [b[ax]] + other[ax:])
    return x.gather(ax, idx)


# ---- advanced indexing ----------------------------------------------------------------------------------------------
def advanced_index(x: Tensor, idx: tuple) -> Tensor:
    """x[idx] where idx holds integer tensors (on any dims) among slices, ints, None and Ellipsis, as torch does:
    ints and slices apply first; the tensors broadcast together and their dims replace the indexed dims in place
    when the tensors sit next to each other, else go first. Negative indices count from the end."""
    from .tensor import _is_tensor

    for i in idx:
        if _is_tensor(i) and i.dtype is dt.bool_:
            raise NotImplementedError("indexing with a bool mask makes a data-dependent shape; use masked_fill, "
                                      "where or masked_scatter")
    n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    if n_real > x.ndim:
        raise IndexError(f"too many indices ({n_real}) for a tensor of shape {_fmt(x.shape)}")
    ell = [k for k, i in enumerate(idx) if i is Ellipsis]  # `in` would compare tensors element-wise
    if ell:
        k = ell[0]
        idx = idx[:k] + (slice(None),) * (x.ndim - n_real) + idx[k + 1:]
    # Basic indexing with every tensor replaced by a full slice; note where each tensor's dim lands.
    basic, axes, tensors, ax = [], [], [], 0
    for i in idx:
        if _is_tensor(i):
            basic.append(slice(None))
            axes.append(ax)
            tensors.append(_int_index(i, "index"))
            ax += 1
        else:
            basic.append(i)
            if i is None or isinstance(i, slice):
                ax += 1
    y = x[tuple(basic)]
    try:
        bshape = tensors[0].layout.shape
        for t in tensors[1:]:
            bshape = broadcast_shapes(bshape, t.layout.shape, "index")
    except ValueError:
        raise IndexError("index: index tensors of shapes " + ", ".join(_fmt(t.shape) for t in tensors) +
                         " cannot be broadcast together") from None
    # The indexed dims first, as one flat dim of rows to gather.
    rest = [d for d in range(y.ndim) if d not in axes]
    yp = y.permute(axes + rest)
    sizes = [y.layout.shape[a] for a in axes]
    g = x.graph
    flat = None
    for d, t in enumerate(tensors):
        if len(tensors) == 1:  # the Gather itself reports an index out of range
            t = t + t.lt(0).to(dt.int32) * _scalar(g, sizes[d], dt.int32)
        else:  # each index must be in its own dim's range, not only the flat one
            t = _checked(t, sizes[d], wrap=True)
        t = t.expand_to(bshape)
        stride = _prod(sizes[d + 1:])
        term = t * _scalar(g, stride, dt.int32) if not (stride.is_const() and int(stride) == 1) else t
        flat = term if flat is None else flat + term
    table = yp.reshape([_prod(sizes)] + [y.layout.shape[d] for d in rest])
    if flat.ndim == 0:
        out = y._new(g._g.gather(table._edge(), flat.reshape(1)._edge())).squeeze(0)
    else:
        out = y._new(g._g.gather(table._edge(), flat._edge()))
    adjacent = axes == list(range(axes[0], axes[0] + len(axes)))
    if adjacent and axes[0] > 0:  # the broadcast dims go where the indexed dims were
        nb, first = len(bshape), axes[0]
        order = list(range(nb, nb + first)) + list(range(nb)) + list(range(nb + first, out.ndim))
        out = out.permute(order)
    return out


def index_reduce(input: Tensor, dim: int, index: Tensor, source: Tensor, reduce: str, *,
                 include_self: bool = True) -> Tensor:
    """torch.index_reduce: source's slices i along dim combined ("prod", "mean", "amax", "amin") into input's
    slices index[i]: scatter_reduce with the index broadcast over the slices."""
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise ValueError(f"index_reduce: reduce must be 'prod', 'mean', 'amax' or 'amin', got {reduce!r}")
    ax = input._axis(dim)
    if index.ndim > 1:
        raise ValueError(f"index_reduce: index must be 1-D, got shape {_fmt(index.shape)}")
    if not input.ndim:
        return scatter_reduce(input, 0, index.reshape(-1), source.reshape(-1), reduce, include_self)
    src = source if source.ndim else source.reshape(1)
    idx = index.reshape([-1] + [1] * (src.ndim - 1 - ax)) if index.ndim else index.reshape([1] * (src.ndim - ax))
    return scatter_reduce(input, ax, idx.expand_to(src.layout.shape), src, reduce, include_self)
