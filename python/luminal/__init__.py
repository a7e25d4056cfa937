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
from .compiler import CPUCompiler, GenericCompiler
from .cuda import CudaCompiler, CudaError, DeviceArray, cuda_available

bool = bool_  # noqa: A001 - torch spells it luminal.bool

__version__ = "0.1.0"
