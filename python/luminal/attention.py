"""Attention: torch.nn.functional.scaled_dot_product_attention over luminal tensors.

Composed the way the Llama model composes attention (q @ k^T * scale, an additive mask, softmax, @ v), so the CPU
backend's attention fusion turns it into one `Attention` op whose scores never reach memory.
"""
from __future__ import annotations

import math

from . import _core
from . import dtypes as dt
from .tensor import Tensor, _arange, _fmt, broadcast_shapes

__all__ = ["scaled_dot_product_attention"]


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """torch.nn.functional.scaled_dot_product_attention (inference).

    query (..., L, E), key (..., S, E), value (..., S, Ev) -> (..., L, Ev); batch dims broadcast. attn_mask: bool
    (True = attend) or float (added to the scores), broadcastable to (..., L, S). is_causal: query i attends keys
    j <= i (top-left aligned, as torch). scale: default 1/sqrt(E). enable_gqa: query heads (dim -3) share the key/
    value heads in groups, read through views. A row whose mask hides every key gives zeros, as torch does.
    float16/bfloat16 inputs are computed in float32 and rounded once at the end (as torch's CPU kernels accumulate).
    """
    if dropout_p != 0.0:
        raise ValueError(f"scaled_dot_product_attention: dropout_p={dropout_p}: only 0.0 is supported (inference)")
    q, k, v = query, key, value
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        raise ValueError(f"scaled_dot_product_attention: query, key and value need at least 2 dims, got "
                         f"{_fmt(q.shape)}, {_fmt(k.shape)}, {_fmt(v.shape)}")
    L, S, E = q.layout.shape[-2], k.layout.shape[-2], q.layout.shape[-1]
    if k.layout.shape[-1] != E:
        raise ValueError(f"scaled_dot_product_attention: query {_fmt(q.shape)} and key {_fmt(k.shape)} differ in "
                         "their last dim (the embedding size)")
    if v.layout.shape[-2] != S:
        raise ValueError(f"scaled_dot_product_attention: key {_fmt(k.shape)} and value {_fmt(v.shape)} differ in "
                         "their sequence length (dim -2)")
    if attn_mask is not None and is_causal:
        raise ValueError("scaled_dot_product_attention: give attn_mask or is_causal=True, not both")
    out_dtype = dt.result_type(dt.result_type(q.dtype, k.dtype), v.dtype)
    if not out_dtype.is_float:
        raise TypeError(f"scaled_dot_product_attention: needs float inputs, got {q.dtype.name}, {k.dtype.name}, "
                        f"{v.dtype.name}")
    q, k, v = q.to(dt.float32), k.to(dt.float32), v.to(dt.float32)
    if scale is None:
        if not E.is_const():
            raise ValueError("scaled_dot_product_attention: the embedding size is symbolic; pass scale=")
        scale = 1.0 / math.sqrt(int(E))

    # Grouped-query attention: (..., Hkv*rep, L, E) queries as (..., Hkv, rep, L, E) against keys (..., Hkv, 1, S, E).
    rep = None
    hq = q.layout.shape[-3] if q.ndim >= 3 else None
    hk = k.layout.shape[-3] if k.ndim >= 3 else None
    if enable_gqa and q.ndim >= 3 and k.ndim >= 3 and hq != hk:
        if v.ndim < 3 or v.layout.shape[-3] != hk:
            raise ValueError(f"scaled_dot_product_attention: key {_fmt(k.shape)} and value {_fmt(v.shape)} need "
                             "the same number of heads (dim -3)")
        if not (hq.is_const() and hk.is_const()) or int(hq) % int(hk):
            raise ValueError(f"scaled_dot_product_attention: enable_gqa needs query heads ({hq}) to be a multiple "
                             f"of key/value heads ({hk}); shapes {_fmt(query.shape)} and {_fmt(key.shape)}")
        rep = int(hq) // int(hk)
        lead = list(q.layout.shape[:-3])
        q = q.reshape(lead + [hk, _core.Expr(rep), L, E])
        k, v = k.unsqueeze(-3), v.unsqueeze(-3)
    try:
        batch = broadcast_shapes(broadcast_shapes(q.layout.shape[:-2], k.layout.shape[:-2], "sdpa"),
                                 v.layout.shape[:-2], "sdpa")
    except ValueError:
        raise ValueError(f"scaled_dot_product_attention: batch dims of query {_fmt(query.shape)}, key "
                         f"{_fmt(key.shape)} and value {_fmt(value.shape)} cannot be broadcast together"
                         + ("" if enable_gqa else " (different head counts need enable_gqa=True)")) from None

    scores = (q @ k.transpose(-1, -2)) * scale  # (..., L, S)
    keep_rows = None
    if attn_mask is not None:
        add, keep_rows = _additive_mask(attn_mask, L, S, rep)
        full = list(scores.layout.shape)
        try:
            broadcast_shapes(full, add.layout.shape, "sdpa")
            if len(add.layout.shape) > len(full) or broadcast_shapes(full, add.layout.shape, "sdpa") != full:
                raise ValueError
        except ValueError:
            raise ValueError(f"scaled_dot_product_attention: attn_mask {_fmt(attn_mask.shape)} cannot be broadcast "
                             f"to the attention scores (..., L={L}, S={S}) of query {_fmt(query.shape)} and key "
                             f"{_fmt(key.shape)}") from None
        scores = scores + add
    elif is_causal:
        from .functional import where

        hidden = _arange(q.graph, S).unsqueeze(0).gt(_arange(q.graph, L).unsqueeze(1))  # key j > query i
        scores = scores + where(hidden, float("-inf"), 0.0)
    out = scores.softmax(-1) @ v
    if keep_rows is not None:
        out = out * keep_rows  # rows that attend nothing: zeros, as torch gives
    if rep is not None:
        shp = list(out.layout.shape)
        out = out.reshape(shp[:-4] + [shp[-4] * shp[-3]] + shp[-2:])
    return out.to(out_dtype)


def _additive_mask(mask: Tensor, L, S, rep):
    """The mask as a float32 tensor to add to the scores, and per row 1.0 (attends something) or 0.0 (attends
    nothing). A row that attends nothing is made all zeros in the mask, so its softmax stays finite (no -inf - -inf);
    the output row is multiplied by 0 instead."""
    from .functional import where

    if mask.ndim < 2:
        raise ValueError(f"scaled_dot_product_attention: attn_mask {_fmt(mask.shape)} needs at least 2 dims "
                         f"(..., L, S) for L={L}, S={S}")
    if mask.dtype is dt.bool_:
        dead = mask.to(dt.int32).amax(-1, keepdim=True).lt(1)
        add = where(mask | dead, 0.0, float("-inf"))
    else:
        dead = mask.to(dt.float32).amax(-1, keepdim=True).eq(float("-inf"))
        add = where(dead, 0.0, mask.to(dt.float32))
    keep = 1 - dead.to(dt.float32)
    if rep is not None and mask.ndim >= 3:  # a per-head mask (..., Hq, L, S) as (..., Hkv, rep, L, S)
        h = mask.layout.shape[-3]
        if h != 1:
            lead = list(add.layout.shape[:-3])
            add = add.reshape(lead + [h // rep, _core.Expr(rep), L, S])
            keep = keep.reshape(lead + [h // rep, _core.Expr(rep), L, 1])
        else:
            add, keep = add.unsqueeze(-3), keep.unsqueeze(-3)
    return add, keep
