"""luminal: a deep-learning inference compiler.

Build a graph with a PyTorch-like API (nothing runs), compile it with composable compilers, execute it.
"""
from . import _core
from ._core import Expr, UnboundDimensionError, UnsupportedOpError
from .dtypes import DType, bfloat16, bool_, dtype, float16, float32, int32, uint8
from .graph import Graph
from .tensor import Tensor
from .functional import (arange, cat, embedding, full, full_like, ones, ones_like, stack, tril, triu, where,
                         zeros, zeros_like)
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
from .indexing import (argsort, index_add, index_fill, index_put, kthvalue, masked_scatter, median, msort, scatter,
                       scatter_add, scatter_reduce, sort, take_along_dim, topk)
from .compiler import CPUCompiler, GenericCompiler
from .cuda import CudaCompiler, CudaError, DeviceArray, cuda_available

bool = bool_  # noqa: A001 - torch spells it luminal.bool

__version__ = "0.1.0"
