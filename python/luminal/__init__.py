"""luminal: a deep-learning inference compiler.

Build a graph with a PyTorch-like API (nothing runs), compile it with composable compilers, execute it.
"""
from . import _core
from ._core import Expr, UnboundDimensionError, UnsupportedOpError
from .dtypes import DType, bfloat16, bool_, dtype, float16, float32, int32, uint8
from .graph import Graph
from .tensor import Tensor
from .functional import (arange, bilinear, cat, channel_shuffle, embedding, full, full_like, ones, ones_like, stack,
                         tril, triu, where, zeros, zeros_like)
# torch.* functions (these shadow Python's max/min/sum/any/all/abs inside this module, as in torch's namespace)
from .functional import (abs, acos, acosh, add, addbmm, addmm, addmv, all, amax, amin, any, argmax, argmin, asin,
                         asinh, atan, atan2, atanh, baddbmm, bmm, ceil, clamp, clamp_max, clamp_min, clip, concat,
                         cos, cosh, cumprod, cumsum, div, dot, einsum, exp, exp2, expm1, floor, floor_divide, fmod,
                         frac, heaviside, isfinite, isinf, isnan, isneginf, isposinf, lerp, linspace, log, log1p,
                         log2, log10, logical_and, logical_not, logical_or, logical_xor, logspace, logsumexp, matmul,
                         max, maximum, mean, min, minimum, mm, movedim, mul, mv, nan_to_num, narrow, neg, norm,
                         one_hot, outer, prod, remainder, repeat_interleave, roll, rsqrt, rsub, sigmoid, sign, sin,
                         sinh, softmax, sqrt, square, std, sub, sum, swapaxes, tan, tanh, tile, true_divide, trunc,
                         unbind, var)
from .functional import (addcdiv, addcmul, addr, alias_copy, aminmax, atleast_1d, atleast_2d, atleast_3d,
                         bitwise_and, bitwise_not, bitwise_or, bitwise_xor, block_diag, broadcast_shapes,
                         broadcast_tensors, broadcast_to, cartesian_prod, cdist, column_stack, constant_pad_nd,
                         copysign, corrcoef, count_nonzero, cov, cross, cummax, cummin, cumulative_trapezoid,
                         deg2rad, diag, diag_embed, diagflat, diagonal, diagonal_copy, diagonal_scatter, diff, dist,
                         dsplit, dstack, erf, erfc, erfinv, expand_copy, eye, fill, fliplr, flipud, float_power, fmax,
                         fmin, hsplit, hstack, hypot, inner, isclose, kron, logaddexp, logaddexp2, logcumsumexp,
                         masked_fill, meshgrid, nanmean, nansum, narrow_copy, permute_copy, positive, rad2deg, ravel,
                         renorm, rot90, row_stack, scalar_tensor, select, select_scatter, sgn, signbit, sinc,
                         slice_scatter, split_with_sizes, split_with_sizes_copy, squeeze_copy, std_mean,
                         sum_to_size, t, t_copy, take, tensor_split, tensordot, trace, transpose_copy, trapezoid,
                         trapz, tril_indices, triu_indices, unbind_copy, unflatten, unfold_copy, unsafe_chunk,
                         unsafe_split, unsqueeze_copy, var_mean, view_copy, vsplit, vstack, xlogy)
from .functional import (bucketize, combinations, digamma, gcd, histc, i0, isin, lcm, ldexp, lgamma, mvlgamma,
                         polygamma, put, searchsorted, unravel_index, quantile, nanquantile, nanmedian, frexp,
                         mode, histogram, gradient, bitwise_left_shift, bitwise_right_shift)
from .indexing import (argsort, index_add, index_fill, index_put, index_reduce, kthvalue, masked_scatter, median, msort,
                       scatter, scatter_add, scatter_reduce, sort, take_along_dim, topk)
from .normalization import native_batch_norm, native_group_norm, native_layer_norm
from .compiler import CPUCompiler, GenericCompiler
from .cuda import CudaCompiler, CudaError, DeviceArray, cuda_available

bool = bool_  # noqa: A001 - torch spells it luminal.bool

__version__ = "0.1.0"


def __getattr__(name):
    # luminal.bisect (a module one calls) is imported on first use, so that `python -m luminal.bisect` runs it fresh.
    if name == "bisect":
        from importlib import import_module

        return import_module(".bisect", __name__)
    raise AttributeError(f"module 'luminal' has no attribute {name!r}")
