"""Tensor: a lazy value in a Graph. High-level ops with PyTorch names, composed from the 15 primitive ops.

A Tensor is (graph, node id, layout, dtype): `layout` is the core View through which it reads its node. Movement ops only edit the view; everything else adds nodes.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np

from . import _core
from . import dtypes as dt
from .dtypes import DType

LOG2_E = 1.4426950408889634
LN_2 = 0.6931471805599453
TAN_PI_8 = 0.41421356237309503
# atan(s) = s + s^3 * P(s^2) on |s| <= tan(pi/8): a least-squares fit of relative error (under 1e-9 there).
ATAN_POLY = (-0.3333331638, 0.199985306, -0.1424448339, 0.1059998719, -0.0609226802)


class MaxResult(NamedTuple):
    """What max(dim) returns, as torch.return_types.max: the largest values and their first indices."""
    values: "Tensor"
    indices: "Tensor"


class MinResult(NamedTuple):
    values: "Tensor"
    indices: "Tensor"


class AminmaxResult(NamedTuple):
    min: "Tensor"
    max: "Tensor"


class CummaxResult(NamedTuple):
    values: "Tensor"
    indices: "Tensor"


class CumminResult(NamedTuple):
    values: "Tensor"
    indices: "Tensor"


class MedianResult(NamedTuple):
    values: "Tensor"
    indices: "Tensor"


class ModeResult(NamedTuple):
    values: "Tensor"
    indices: "Tensor"


class HistogramResult(NamedTuple):
    hist: "Tensor"
    bin_edges: "Tensor"


class FrexpResult(NamedTuple):
    mantissa: "Tensor"
    exponent: "Tensor"


def _is_tensor(x) -> bool:
    return isinstance(x, Tensor)


def _fmt(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


class Tensor:
    __slots__ = ("graph", "_id", "layout", "dtype", "_out")

    def __init__(self, graph, nid: int, view, dtype: DType, out: int | None = None):
        self.graph, self._id, self.layout, self.dtype, self._out = graph, nid, view, dtype, out

    # ---- identity and shape --------------------------------------------------------------------------------------
    @property
    def id(self) -> int:
        """The node this tensor reads; follows any rewrite a compiler made."""
        return self.graph._g.resolve(self._id)

    @property
    def shape(self) -> tuple:
        return tuple(int(d) if d.is_const() else d for d in self.layout.shape)

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[self._axis(dim)]

    @property
    def ndim(self) -> int:
        return len(self.layout.shape)

    def dim(self) -> int:
        return self.ndim

    def numel(self):
        n = _core.Expr(1)
        for d in self.layout.shape:
            n = n * d
        return int(n) if n.is_const() else n

    def __len__(self):
        if not self.ndim:
            raise TypeError("len() of a 0-d tensor")
        d = self.layout.shape[0]
        if not d.is_const():
            raise TypeError(f"len() of a tensor whose first dim is symbolic ({d})")
        return int(d)

    def __repr__(self):
        return f"Tensor(shape={_fmt(self.shape)}, dtype={self.dtype.name}, node={self.id})"

    def _edge(self):
        return self.graph._g.resolve_edge(_core.Edge(self._id, self.layout))

    def _new(self, nid: int) -> "Tensor":
        return self.graph._wrap(nid)

    def _with_view(self, view) -> "Tensor":
        return Tensor(self.graph, self._id, view, self.dtype)

    def _axis(self, d: int, ndim: int | None = None) -> int:
        n = self.ndim if ndim is None else ndim
        if not isinstance(d, (int, np.integer)):
            raise TypeError(f"dim must be an int, got {d!r}")
        if not -max(n, 1) <= d < max(n, 1):
            raise IndexError(f"dim {d} is out of range for a tensor of shape {_fmt(self.shape)}")
        return int(d) % max(n, 1)

    # ---- data in and out -----------------------------------------------------------------------------------------
    def set(self, array, donate: bool = False) -> "Tensor":
        """Gives an input tensor its data (binding symbolic dims from the array's shape).

        `donate=True` hands the array over: executing may overwrite it in place. A Scatter that is this input's only
        reader (a KV-cache update) then writes the new rows into it instead of copying the whole array."""
        self.graph._set_input(self.id, array)
        if donate:
            self.graph._donated.add(self.id)
        else:
            self.graph._donated.discard(self.id)
        return self

    def output(self) -> "Tensor":
        """Marks this tensor as a result of the graph; read it with `.numpy()` after `execute()`."""
        out = self.graph._g.output(self._edge())
        return Tensor(self.graph, self._id, self.layout, self.dtype, out)

    def keep(self) -> "Tensor":
        """Keeps this tensor's node through dead-node removal (e.g. to inspect it after compiling)."""
        self.graph._g.keep(self.id)
        return self

    def numpy(self) -> np.ndarray:
        if self._out is None:
            raise RuntimeError("this tensor is not an output: call .output() on it before compiling")
        arr = self.graph._result(self._out)
        return dt.bf16_to_f32(arr) if self.dtype is dt.bfloat16 else arr

    def result(self):
        """The result as the backend holds it, not copied: a numpy array, or a `luminal.DeviceArray` on the CUDA
        backend (bfloat16 as raw bits). `set()` accepts either, which is how a KV cache stays on the GPU."""
        if self._out is None:
            raise RuntimeError("this tensor is not an output: call .output() on it before compiling")
        return self.graph._raw_result(self._out)

    def item(self):
        return self.numpy().item()

    # ---- building blocks -----------------------------------------------------------------------------------------
    def _unary(self, op: str) -> "Tensor":
        x = self if self.dtype.is_float else self.to(dt.float32)
        return x._new(x.graph._g.unary(op, x._edge()))

    def _const_like(self, value, dtype: DType | None = None) -> "Tensor":
        c = self.graph.constant(value, dtype or self.dtype)
        return c.expand_to(self.layout.shape)

    def _operands(self, other, op: str) -> tuple["Tensor", "Tensor"]:
        """Promotes dtypes and broadcasts shapes, PyTorch style."""
        if _is_tensor(other):
            if other.graph is not self.graph:
                raise ValueError(f"{op}: tensors belong to different graphs")
            t = dt.result_type(self.dtype, other.dtype)
            a, b = self.to(t), other.to(t)
        else:
            if isinstance(other, _core.Expr):
                return self._operands(_scalar(self.graph, other, self.dtype), op)
            if not isinstance(other, (int, float, bool, np.number)):
                raise TypeError(f"{op}: unsupported operand {other!r}")
            t = self.dtype
            if isinstance(other, float) and not t.is_float:
                t = dt.float32
            a = self.to(t)
            b = a.graph.constant(other, t)
        shape = broadcast_shapes(a.layout.shape, b.layout.shape, op)
        return a.expand_to(shape), b.expand_to(shape)

    def _binary(self, op: str, other) -> "Tensor":
        a, b = self._operands(other, op)
        return a._new(a.graph._g.binary(op, a._edge(), b._edge()))

    def _reduce(self, op: str, dim, keepdim: bool) -> "Tensor":
        axes = self._dims(dim)
        x = self
        for ax in sorted(axes, reverse=True):
            x = x._new(x.graph._g.reduce(op, x._edge(), ax))
        if keepdim:
            for ax in sorted(axes):
                x = x.unsqueeze(ax)
        return x

    def _dims(self, dim) -> list[int]:
        if dim is None:
            return list(range(self.ndim))
        if isinstance(dim, (list, tuple)):
            dims = sorted({self._axis(d) for d in dim})
        else:
            dims = [self._axis(dim)]
        return dims if self.ndim else []  # a 0-d tensor takes dim 0 / -1 as torch does: nothing to reduce

    def expand_to(self, shape) -> "Tensor":
        """Broadcasts to `shape` (a list of Exprs), adding leading dims as needed."""
        v = self.layout
        extra = len(shape) - len(v.shape)
        if extra < 0:
            raise ValueError(f"cannot broadcast shape {_fmt(self.shape)} to {_fmt(shape)}")
        for _ in range(extra):
            v = v.unsqueeze(0)
        for i, d in enumerate(shape):
            if v.shape[i] != d:
                v = v.expand(i, d)
        return self._with_view(v)

    # ---- dtype ---------------------------------------------------------------------------------------------------
    def to(self, dtype) -> "Tensor":
        dtype = dt.dtype(dtype)
        if dtype is self.dtype:
            return self
        return self._new(self.graph._g.cast(self._edge(), dtype.name))

    def float(self):
        return self.to(dt.float32)

    def half(self):
        return self.to(dt.float16)

    def bfloat16(self):
        return self.to(dt.bfloat16)

    def int(self):
        return self.to(dt.int32)

    def bool(self):
        return self.to(dt.bool_)

    # ---- arithmetic ----------------------------------------------------------------------------------------------
    def __add__(self, o):
        return self._binary("Add", o)

    def __radd__(self, o):
        return self._binary("Add", o)

    def __mul__(self, o):
        return self._binary("Mul", o)

    def __rmul__(self, o):
        return self._binary("Mul", o)

    def __neg__(self):
        if self.dtype is dt.bool_:
            raise TypeError("negation of a bool tensor: use ~ (logical_not)")
        return self * -1

    def __sub__(self, o):
        a, b = self._operands(o, "sub")
        return a + b * -1

    def __rsub__(self, o):
        a, b = self._operands(o, "sub")
        return b + a * -1

    def __truediv__(self, o):
        if _is_tensor(o):  # the reciprocal before broadcasting: once per element of the divisor
            broadcast_shapes(self.layout.shape, o.layout.shape, "div")
            t = dt.result_type(self.dtype, o.dtype)
            t = t if t.is_float else dt.float32
            return self.to(t) * o.to(t).reciprocal()
        a, b = self._operands(o, "div")
        if not a.dtype.is_float:
            a, b = a.float(), b.float()
        return a * b.reciprocal()

    def __rtruediv__(self, o):
        a, b = self._operands(o, "div")
        if not a.dtype.is_float:
            a, b = a.float(), b.float()
        return b * a.reciprocal()

    def __floordiv__(self, o):
        a, b = self._operands(o, "floor_divide")
        # (a - a mod b) / b is an integer; a * (1/b) can land just below it, so round it.
        q = ((a - a.remainder(b)).float() / b.float()).round()
        return q.to(a.dtype)

    def fmod(self, o):
        return self._binary("Mod", o)

    def remainder(self, o):
        """Floor modulo (Python's and torch's %): the result takes the divisor's sign."""
        a, b = self._operands(o, "remainder")
        r = a._binary("Mod", b)
        fix = (r * b).lt(0).to(a.dtype)
        return r + b * fix

    def __mod__(self, o):
        return self.remainder(o)

    def __rmod__(self, o):
        a, b = self._operands(o, "remainder")
        return b.remainder(a)

    def __pow__(self, o):
        return self.pow(o)

    def __rpow__(self, o):
        a, b = self._operands(o, "pow")
        return b.pow(a)

    def pow(self, exponent):
        if not _is_tensor(exponent):
            e = float(exponent)
            if e == int(e) and abs(e) <= 16:
                base = self if self.dtype.is_float or e >= 0 else self.float()
                out, sq, n = None, base, abs(int(e))
                while n:  # square and multiply
                    if n & 1:
                        out = sq if out is None else out * sq
                    n >>= 1
                    if n:
                        sq = sq * sq
                out = base._const_like(1) if out is None else out
                return out.reciprocal() if e < 0 else out
            if e == 0.5:
                return self.sqrt()
            exponent = e
        x, y = self._operands(exponent, "pow")
        ints = not x.dtype.is_float
        if ints:
            x, y = x.float(), y.float()
        # |x|^y (with 0^0 = 1), negated where x < 0 and y is an odd integer, NaN where x < 0 and y is fractional.
        zero_exp = y.eq(0).to(x.dtype)
        mag = (y * (x.abs() + zero_exp).log2()).exp2()
        odd = y.abs().remainder(2).eq(1).to(x.dtype)
        neg = x.lt(0).to(x.dtype)
        frac = y.ne(y.floor()).to(x.dtype)
        out = mag * (1 - 2 * neg * odd) * (1 - 2 * neg * frac).sqrt()  # sqrt(-1) is the NaN
        return out.round().to(self.dtype) if ints else out

    # ---- arithmetic with torch's method names ------------------------------------------------------------------
    def add(self, other, alpha=1):
        return self + (other if alpha == 1 else other * alpha)

    def sub(self, other, alpha=1):
        return self - (other if alpha == 1 else other * alpha)

    subtract = sub

    def rsub(self, other, alpha=1):
        """other - alpha * self."""
        return (self if alpha == 1 else self * alpha).__rsub__(other)

    def mul(self, other):
        return self * other

    multiply = mul

    def div(self, other, rounding_mode=None):
        """True division, or with rounding_mode 'trunc' / 'floor' the rounded quotient in the operands' dtype."""
        if rounding_mode is None:
            return self / other
        if rounding_mode == "floor":
            return self // other
        if rounding_mode != "trunc":
            raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
        a, b = self._operands(other, "div")
        if a.dtype.is_float:
            return (a / b).trunc()
        # (a - fmod(a, b)) / b is an integer; a * (1/b) can land just below it, so round before the cast.
        return ((a - a.fmod(b)).float() / b.float()).round().to(a.dtype)

    divide = div

    def true_divide(self, other):
        return self / other

    def floor_divide(self, other):
        return self // other

    def neg(self):
        return -self

    negative = neg

    def clone(self):
        """Values are immutable here, so a clone is the same value (a new Tensor reading the same node)."""
        return Tensor(self.graph, self._id, self.layout, self.dtype)

    # ---- unary math ----------------------------------------------------------------------------------------------
    def log2(self):
        return self._unary("Log2")

    def exp2(self):
        return self._unary("Exp2")

    def sin(self):
        return self._unary("Sin")

    def sqrt(self):
        return self._unary("Sqrt")

    def reciprocal(self):
        return self._unary("Recip")

    def exp(self):
        return (self._float() * LOG2_E).exp2()

    def log(self):
        return self.log2() * LN_2

    def cos(self):
        return (self._float() + math.pi / 2).sin()

    def rsqrt(self):
        return self.sqrt().reciprocal()

    def square(self):
        return self * self

    def abs(self):
        return self * (1 - 2 * self.lt(0).to(self.dtype))

    def sign(self):
        return self.gt(0).to(self.dtype) - self.lt(0).to(self.dtype)

    def relu(self):
        return self.maximum(0)

    def sigmoid(self):
        return ((-self._float()).exp() + 1).reciprocal()

    def silu(self):
        return self * self.sigmoid()

    def tanh(self):
        return 2 * (2 * self._float()).sigmoid() - 1

    def gelu(self, approximate: str = "none"):
        x = self._float()
        if approximate == "tanh":
            return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())
        return 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf())

    def erf(self):
        # Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), made odd by sign().
        x = self._float()
        a = x.abs()
        t = (1 + 0.3275911 * a).reciprocal()
        poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
        return x.sign() * (1 - poly * (-(a * a)).exp())

    def softplus(self, beta: float = 1.0, threshold: float = 20.0):
        # max(x, 0) + log(1 + exp(-|x|)): stable everywhere; equals x past the threshold to float precision.
        from .functional import where

        x = self._float() * beta
        soft = (x.relu() + ((-x.abs()).exp() + 1).log()) * (1 / beta)
        return where(x.gt(threshold), self._float(), soft)  # torch's linear region past the threshold

    def leaky_relu(self, negative_slope: float = 0.01):
        return self * (1 + (negative_slope - 1) * self.lt(0).to(self.dtype))

    def _float(self):
        return self if self.dtype.is_float else self.float()

    def _in_f32(self, fn) -> "Tensor":
        """fn over the values in float32, rounded to the input's float dtype once (ints give float32): for
        compositions whose intermediate steps would lose too much in 16 bits."""
        x = self._float()
        return fn(x.float()).to(x.dtype)

    # ---- more unary math (compositions of the primops) ------------------------------------------------------
    def atan2(self, other):
        """torch.atan2(self, other): the angle of the point (other, self), in (-pi, pi]."""
        y, x = self._operands(other, "atan2")
        dtype = y.dtype if y.dtype.is_float else dt.float32

        def f(y, x):
            ay, ax = y.abs(), x.abs()
            hi, lo = ay.maximum(ax), ay.minimum(ax)
            a = _atan_unit(lo / (hi + hi.eq(0).float()))  # the origin reads 0 / 1
            a = a + ay.gt(ax).float() * (math.pi / 2 - 2 * a)  # steeper than the diagonal: from the y axis
            a = a + x.lt(0).float() * (math.pi - 2 * a)  # left half-plane
            return a * (1 - 2 * y.lt(0).float())

        return f(y.float(), x.float()).to(dtype)

    arctan2 = atan2

    def atan(self):
        return self.atan2(1.0)

    def asin(self):
        return self._in_f32(lambda x: x.atan2(((1 - x) * (1 + x)).sqrt()))  # |x| > 1: sqrt gives the NaN

    def acos(self):
        return self._in_f32(lambda x: ((1 - x) * (1 + x)).sqrt().atan2(x))

    arctan, arcsin, arccos = atan, asin, acos

    def tan(self):
        return self._in_f32(lambda x: x.sin() / x.cos())

    def sinh(self):
        return self._in_f32(lambda x: (x.expm1() - (-x).expm1()) * 0.5)

    def cosh(self):
        return self._in_f32(lambda x: (x.exp() + (-x).exp()) * 0.5)

    def asinh(self):
        # sign(x) * log1p(a + a^2 / (1 + sqrt(a^2 + 1))), a = |x|: no cancellation near 0.
        def f(x):
            a = x.abs()
            return x.sign() * (a + a * a / (1 + (a * a + 1).sqrt())).log1p()
        return self._in_f32(f)

    def acosh(self):
        return self._in_f32(lambda x: (x + ((x - 1) * (x + 1)).sqrt()).log())  # x < 1: sqrt gives the NaN

    def atanh(self):
        return self._in_f32(lambda x: 0.5 * (2 * x / (1 - x)).log1p())

    arcsinh, arccosh, arctanh = asinh, acosh, atanh

    def log1p(self):
        def f(x):
            # Near 0, log(u) * x / (u - 1) with u = 1 + x cancels the rounding of u (Goldberg); elsewhere log(1 + x).
            # The near branch reads x clamped to [-0.5, 0.5], so it stays finite wherever it is not chosen.
            xs = x.clamp(-0.5, 0.5)
            d = (xs + 1) - 1
            one = d.eq(0).float()  # x below rounding: log1p(x) = x
            near = (xs + 1).log() * (xs / (d + one)) + xs * one
            m = x.abs().lt(0.5).float()
            return near * m + (x + 1).log() * (1 - m)
        return self._in_f32(f)

    def expm1(self):
        def f(x):
            # Near 0, (u - 1) * x / log(u) with u = exp(x) cancels the rounding of u (Kahan); elsewhere exp(x) - 1.
            xs = x.clamp(-0.5, 0.5)
            u = xs.exp()
            lu = u.log()
            one = lu.eq(0).float()  # u rounded to 1: expm1(x) = x
            near = (u - 1) * (xs / (lu + one)) + xs * one
            m = x.abs().lt(0.5).float()
            return near * m + (x.exp() - 1) * (1 - m)
        return self._in_f32(f)

    def log10(self):
        return self.log2() * math.log10(2)

    def _whole_part_input(self) -> "Tensor":
        """self clamped to the range past which every value of its dtype is an integer (so +-inf subtract a
        fraction of 0, not NaN)."""
        big = 2048.0 if self.dtype is dt.float16 else 16777216.0
        return self.clamp(-big, big)

    def trunc(self):
        return self - self._whole_part_input().fmod(1) if self.dtype.is_float else self

    fix = trunc

    def frac(self):
        if not self.dtype.is_float:
            raise TypeError(f"frac: needs a float tensor, got {self.dtype.name}")
        return self - self.trunc()  # inf - inf: NaN, as torch gives

    def isinf(self):
        if not self.dtype.is_float:
            return self._const_like(0, dt.bool_)
        return self.eq(float("inf")) | self.eq(float("-inf"))

    def isposinf(self):
        return self.eq(float("inf")) if self.dtype.is_float else self._const_like(0, dt.bool_)

    def isneginf(self):
        return self.eq(float("-inf")) if self.dtype.is_float else self._const_like(0, dt.bool_)

    def isfinite(self):
        if not self.dtype.is_float:
            return self._const_like(1, dt.bool_)
        inf = float("inf")
        return self.lt(inf) & self.gt(-inf)  # false for NaN too

    def nan_to_num(self, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None):
        """NaN, +inf and -inf replaced (by default with 0 and the dtype's largest and lowest finite values)."""
        if not self.dtype.is_float:
            return self
        big = _finfo_max(self.dtype)
        posinf, neginf = big if posinf is None else posinf, -big if neginf is None else neginf
        # The replacement for each element (finite: masks times finite values), then one selection.
        r = self.isnan().to(self.dtype) * nan + self.isposinf().to(self.dtype) * posinf + \
            self.isneginf().to(self.dtype) * neginf
        from .functional import where

        return where(self.isfinite(), self, r)

    def lerp(self, end, weight):
        """self + weight * (end - self)."""
        return self + weight * (end - self)

    def heaviside(self, values):
        """0 where self < 0, 1 where self > 0, `values` where self == 0."""
        from .functional import where

        return where(self.eq(0), values, self.gt(0).to(self.dtype))

    def logit(self, eps: float | None = None):
        x = self._float()
        if eps is not None:
            x = x.clamp(eps, 1 - eps)
        return (x / (1 - x)).log()

    # ---- activations (torch.nn.functional's, as methods) -------------------------------------------------------
    def relu6(self):
        return self.clamp(0, 6)

    def hardtanh(self, min_val: float = -1.0, max_val: float = 1.0):
        return self.clamp(min_val, max_val)

    def hardsigmoid(self):
        return (self._float() + 3).clamp(0, 6) * (1 / 6)

    def hardswish(self):
        return self * self.hardsigmoid()

    def mish(self):
        return self * self.softplus().tanh()

    def elu(self, alpha: float = 1.0):
        x = self._float()
        return x.relu() + alpha * x.minimum(0).expm1()

    def selu(self):
        return 1.0507009873554805 * self.elu(1.6732632423543772)

    def celu(self, alpha: float = 1.0):
        x = self._float()
        return x.relu() + alpha * (x.minimum(0) * (1 / alpha)).expm1()

    def glu(self, dim: int = -1):
        n = self.layout.shape[self._axis(dim)]
        if not n.is_const() or int(n) % 2:
            raise ValueError(f"glu: dim {dim} of shape {_fmt(self.shape)} must have an even size")
        a, b = self.chunk(2, dim)
        return a * b.sigmoid()

    def softmin(self, dim: int = -1, dtype=None):
        x = self.to(dtype) if dtype else self._float()
        return (-x).softmax(dim)

    def softsign(self):
        x = self._float()
        return x / (1 + x.abs())

    def tanhshrink(self):
        return self - self.tanh()

    def logsigmoid(self):
        return -((-self._float()).softplus())

    def threshold(self, threshold: float, value: float):
        """self where self > threshold, else value."""
        from .functional import where

        return where(self.gt(threshold), self, value)

    def softshrink(self, lambd: float = 0.5):
        return self - self.clamp(-lambd, lambd)

    def hardshrink(self, lambd: float = 0.5):
        return self * self.abs().gt(lambd).to(self.dtype)

    def prelu(self, weight: "Tensor"):
        """max(0, x) + weight * min(0, x), with one weight per channel (dim 1) or a single one."""
        w = weight.reshape(1) if weight.ndim == 0 else weight
        if self.ndim == 0:
            w = w.reshape([])
        elif w.ndim != 1:
            raise ValueError(f"prelu: weight must be 1-D, got shape {_fmt(weight.shape)}")
        if self.ndim >= 2 and w.layout.shape[0] != 1:
            if w.layout.shape[0] != self.layout.shape[1]:
                raise ValueError(f"prelu: weight of shape {_fmt(weight.shape)} does not match the channels (dim 1) "
                                 f"of input shape {_fmt(self.shape)}")
            w = w.reshape([w.layout.shape[0]] + [1] * (self.ndim - 2))
        return self.relu() + w * self.minimum(0)

    def rrelu(self, lower: float = 1 / 8, upper: float = 1 / 3, training: bool = False):
        if training:
            raise NotImplementedError("rrelu: training mode draws random slopes; only inference (training=False)")
        return self.leaky_relu((lower + upper) / 2)

    # ---- comparisons (results are bool) ----------------------------------------------------------------------------
    def lt(self, o):
        return self._binary("LessThan", o)

    def isnan(self):
        if not self.dtype.is_float:
            return self._const_like(0, dt.bool_)
        inf = float("inf")
        return ~(self.lt(inf) | self.gt(-inf))

    def gt(self, o):
        a, b = self._operands(o, "gt")
        return b._binary("LessThan", a)

    def _ordered(self, other) -> "Tensor | None":
        """Where neither operand is NaN (None for non-float types, which have no NaN)."""
        if not self.dtype.is_float:
            return None
        inf = float("inf")
        return (self.lt(inf) | self.gt(-inf)) & (other.lt(inf) | other.gt(-inf))

    def le(self, o):
        a, b = self._operands(o, "le")
        out, ok = ~b.lt(a), a._ordered(b)
        return out if ok is None else out & ok

    def ge(self, o):
        a, b = self._operands(o, "ge")
        return b.le(a)

    def ne(self, o):
        return ~self.eq(o)

    less, less_equal, greater, greater_equal, not_equal = lt, le, gt, ge, ne

    def eq(self, o):
        a, b = self._operands(o, "eq")
        out, ok = ~(a.lt(b) | b.lt(a)), a._ordered(b)
        return out if ok is None else out & ok

    __lt__, __gt__, __le__, __ge__ = lt, gt, le, ge

    def __eq__(self, o):  # noqa: D105 - elementwise, like torch
        return self.eq(o)

    def __ne__(self, o):
        return self.ne(o)

    __hash__ = object.__hash__

    def logical_not(self):
        return self.bool().to(dt.int32).lt(1)  # through bool: 0.5 and NaN are true

    def __invert__(self):
        if self.dtype is dt.bool_:
            return self.logical_not()
        if self.dtype is dt.int32:
            from .functional import where

            # two's complement: -(x + 1), except at the ends of the range, where x + 1 or the negation overflows
            big = 2 ** 31 - 1
            return where(self.eq(-big - 1), big, where(self.eq(big), -big - 1, -(self + 1)))
        if self.dtype is dt.uint8:
            return 255 - self
        raise TypeError(f"~ needs a bool or integer tensor, got {self.dtype.name}")

    bitwise_not = __invert__

    def _bits(self) -> list["Tensor"]:
        """The bits of an int32 (two's complement, 32) or uint8 (8) tensor, lowest first, as 0/1 of its dtype.
        Bit k is (x floor-mod 2^(k+1)) >= 2^k: exact integer arithmetic, negative values included."""
        n = 8 if self.dtype is dt.uint8 else 32
        x = self.to(dt.int32)
        bits = [x.remainder(2 ** (k + 1)).ge(2 ** k) for k in range(min(n, 30))]
        if n == 32:  # x mod 2^31 does not fit int32: bit 30 from the sign, bit 31 is the sign
            neg = x.lt(0)
            bits.append((neg & x.ge(-2 ** 30)) | (~neg & x.ge(2 ** 30)))
            bits.append(neg)
        return [b.to(dt.int32) for b in bits]

    def _bitwise(self, o, op: str, fn) -> "Tensor":
        a, b = self._operands(o, op)
        if a.dtype is dt.bool_:  # logical
            return {"bitwise_and": a.logical_and, "bitwise_or": a.logical_or, "bitwise_xor": a.logical_xor}[op](b)
        if a.dtype not in (dt.int32, dt.uint8):
            raise TypeError(f"{op}: needs bool or integer tensors, got {a.dtype.name}")
        out = None
        for k, (x, y) in enumerate(zip(a._bits(), b._bits())):
            bit = fn(x, y) * (-(2 ** 31) if k == 31 else 2 ** k)  # the sign bit first: the sum stays in range
            out = bit if out is None else bit + out
        return out.to(a.dtype)

    def __and__(self, o):
        return self._bitwise(o, "bitwise_and", lambda x, y: x * y)

    def __or__(self, o):
        return self._bitwise(o, "bitwise_or", lambda x, y: x + y - x * y)

    def __xor__(self, o):
        return self._bitwise(o, "bitwise_xor", lambda x, y: x + y - 2 * x * y)

    def _shift(self, other, left: bool) -> "Tensor":
        """x << s or x >> s (arithmetic) from the bits: bit k lands on k + s (or k - s) with the weight of that
        position, two's complement for int32 (the top bit weighs -2^31), so the result wraps as torch's does."""
        from .functional import where

        op = "bitwise_left_shift" if left else "bitwise_right_shift"
        a, b = self._operands(other, op)
        if a.dtype not in (dt.int32, dt.uint8):
            raise TypeError(f"{op}: needs integer tensors, got {a.dtype.name}")
        top = 7 if a.dtype is dt.uint8 else 31
        sh = b.to(dt.int32).clamp(0, top + 1 if left else top)
        out = None
        for k, bit in enumerate(a._bits()):
            pos = sh + k if left else sh * -1 + k
            w = (pos.clamp(0, 30).float().exp2().round()).to(dt.int32)  # 2^pos, exact for pos <= 30
            w = where(pos.lt(0) | pos.gt(top), 0, w)
            if top == 31:
                w = where(pos.eq(31), -2 ** 31, w)
            if top == 31 and k == 31 and not left:  # the sign bit fills the vacated top positions: -2^(31 - s)
                w = -(((31 - sh).clamp(0, 30).float().exp2().round()).to(dt.int32))
                w = where(sh.eq(0), -2 ** 31, w)  # 2^31 itself does not fit int32
            term = bit * w
            out = term if out is None else out + term
        return out.to(a.dtype)

    def bitwise_left_shift(self, other):
        return self._shift(other, True)

    def bitwise_right_shift(self, other):
        return self._shift(other, False)

    __lshift__, __rshift__ = bitwise_left_shift, bitwise_right_shift

    __rand__, __ror__, __rxor__ = __and__, __or__, __xor__
    bitwise_and, bitwise_or, bitwise_xor = __and__, __or__, __xor__

    def logical_and(self, other):
        return self.bool()._binary("Mul", other.bool() if _is_tensor(other) else bool(other))

    def logical_or(self, other):
        return self.bool()._binary("Add", other.bool() if _is_tensor(other) else bool(other))

    def logical_xor(self, other):
        a, b = self.bool(), (other.bool() if _is_tensor(other) else bool(other))
        return a.logical_or(b).logical_and(a.logical_and(b).logical_not())

    def maximum(self, o):
        a, b = self._operands(o, "maximum")
        from .functional import stack

        return stack([a, b]).amax(0)

    def minimum(self, o):
        a, b = self._operands(o, "minimum")
        return -((-a).maximum(-b))

    def clamp(self, min=None, max=None):
        x = self
        if min is not None:
            x = x.maximum(min)
        if max is not None:
            x = x.minimum(max)
        return x

    clip = clamp

    def clamp_min(self, min):
        return self.clamp(min=min)

    def clamp_max(self, max):
        return self.clamp(max=max)

    def where(self, condition, other):
        from .functional import where

        return where(condition, self, other)

    def masked_fill(self, mask, value):
        """`value` where mask is true, exactly (whatever the replaced values were)."""
        from .functional import where

        if _is_tensor(value):
            if value.ndim:
                raise ValueError(f"masked_fill: value must be a number or a 0-d tensor, got shape {_fmt(value.shape)}")
            return where(mask.bool(), value.to(self.dtype).expand_to(self.layout.shape), self)
        return where(mask.bool(), self._const_like(value), self)

    # ---- reductions ----------------------------------------------------------------------------------------------
    def sum(self, dim=None, keepdim: bool = False, dtype=None):
        x = self.to(dtype) if dtype else (self.to(dt.int32) if self.dtype in (dt.bool_, dt.uint8) else self)
        if x.dtype in (dt.float16, dt.bfloat16) and len(x._dims(dim)) > 1:
            # Over several axes, accumulate in float32 and round once, as torch does (not once per axis).
            return x.float()._reduce("SumReduce", dim, keepdim).to(x.dtype)
        return x._reduce("SumReduce", dim, keepdim)

    def max(self, dim=None, keepdim: bool = False):
        """torch.max: the largest element (no dim), the pair (values, indices) along an int dim, or the element-wise
        maximum with another tensor."""
        if _is_tensor(dim):
            return self.maximum(dim)
        if dim is None:
            return self.amax(None, keepdim)
        if not isinstance(dim, (int, np.integer)):
            raise TypeError(f"max: dim must be an int (use amax for several dims), got {dim!r}")
        return MaxResult(self.amax(dim, keepdim), self.argmax(dim, keepdim))

    def min(self, dim=None, keepdim: bool = False):
        """torch.min: the smallest element, the pair (values, indices) along an int dim, or the element-wise
        minimum with another tensor."""
        if _is_tensor(dim):
            return self.minimum(dim)
        if dim is None:
            return self.amin(None, keepdim)
        if not isinstance(dim, (int, np.integer)):
            raise TypeError(f"min: dim must be an int (use amin for several dims), got {dim!r}")
        return MinResult(self.amin(dim, keepdim), self.argmin(dim, keepdim))

    def amax(self, dim=None, keepdim=False):
        return self._reduce("MaxReduce", dim, keepdim)

    def amin(self, dim=None, keepdim=False):
        return -((-self).amax(dim, keepdim))

    def _count(self, dim):
        n = _core.Expr(1)
        for a in self._dims(dim):
            n = n * self.layout.shape[a]
        return n

    def mean(self, dim=None, keepdim: bool = False):
        x = self._float()
        return x.sum(dim, keepdim) / _scalar(self.graph, self._count(dim), x.dtype)

    def var(self, dim=None, unbiased: bool = True, keepdim: bool = False, correction=None):
        if isinstance(dim, bool):  # torch's var(input, unbiased)
            dim, unbiased = None, dim
        corr = (1 if unbiased else 0) if correction is None else correction
        x = self._float()
        d = x - x.mean(dim, keepdim=True)
        count = self._count(dim)
        if count.is_const():  # torch clamps the degrees of freedom at 0
            dof = x.graph.constant(max(int(count) - corr, 0), dt.float32)
        else:
            dof = (_scalar(self.graph, count, dt.float32) - corr).maximum(0)
        return (d * d).sum(dim, keepdim) / dof.to(x.dtype)

    def std(self, dim=None, unbiased: bool = True, keepdim: bool = False, correction=None):
        return self.var(dim, unbiased, keepdim, correction).sqrt()

    def prod(self, dim=None, keepdim: bool = False):
        x = self._float()
        mag = x.abs().log2().sum(dim, keepdim).exp2()
        negs = x.lt(0).to(dt.int32).sum(dim, keepdim)
        out = mag * (1 - 2 * negs.remainder(2).to(x.dtype))
        return out if self.dtype.is_float else out.round().to(self.dtype)

    def round(self, decimals: int = 0):
        if decimals:  # as torch: scale, round half to even, scale back
            s = 10.0 ** abs(decimals)
            x = self._float()
            return (x * s).round() / s if decimals > 0 else (x / s).round() * s
        if not self.dtype.is_float:
            return self
        # Round half to even, as torch does.
        x = self._float()
        f = (x + 0.5).floor()
        tie = (f - x).eq(0.5) & f.remainder(2).eq(1)
        return f - tie.to(x.dtype)

    def floor(self):
        if not self.dtype.is_float:
            return self
        return self - self._whole_part_input().remainder(1)

    def ceil(self):
        return -((-self).floor())

    def _arg(self, dim, keepdim, largest: bool) -> "Tensor":
        x = (self if largest else -self)._float()
        if dim is None:
            flat = x.reshape(-1)._arg(0, False, True)
            return flat.reshape([1] * self.ndim) if keepdim else flat
        ax = x._axis(dim)
        if not self.ndim:
            return self.graph.constant(0, dt.int32)
        n = x.layout.shape[ax]
        chunk = _arg_chunk(n)
        if chunk:
            return x._arg_chunked(ax, chunk, keepdim)
        m = x.amax(ax, keepdim=True)
        idx = _arange_along(x, ax)  # 0..n-1 along ax, broadcast
        # First index of the max: maximise n - i over the positions that hit it.
        # Equal to the max; if that is NaN (torch's argmax picks a NaN as the max), the NaNs (a comparison with a
        # NaN max is false everywhere, which would make every position a hit).
        hit = (~(x.lt(m) | m.lt(x)) & ~m.isnan()) | x.isnan()
        score = hit.to(dt.int32) * (_scalar(self.graph, n, dt.int32) - idx)
        out = _scalar(self.graph, n, dt.int32) - score.amax(ax, keepdim)
        return out

    def _arg_chunked(self, ax: int, chunk: int, keepdim: bool) -> "Tensor":
        """argmax along a long axis in two levels, so that many blocks share a row (a vocabulary's logits): the
        first max of each chunk, then the first chunk holding the row's max (NaN rules as one row: a NaN chunk
        max is the first NaN), then that chunk's own index, picked by a one-hot sum."""
        shape = list(self.layout.shape)
        n = int(shape[ax])
        rows = self.reshape(shape[:ax] + [n // chunk, chunk] + shape[ax + 1:])
        within = rows._arg(ax + 1, False, True)  # [..., chunks, ...]
        which = rows.amax(ax + 1)._arg(ax, True, True)  # [..., 1, ...]
        at = _arange_along(within, ax)
        pick = at.eq(which).to(dt.int32) * within
        out = which * _scalar(self.graph, chunk, dt.int32) + pick.sum(ax, keepdim=True, dtype=dt.int32)
        return out if keepdim else out.squeeze(ax)

    def argmax(self, dim=None, keepdim: bool = False):
        return self._arg(dim, keepdim, True)

    def argmin(self, dim=None, keepdim: bool = False):
        return self._arg(dim, keepdim, False)

    def softmax(self, dim: int = -1, dtype=None):
        x = self.to(dtype) if dtype else self._float()
        e = (x - x.amax(dim, keepdim=True)).exp()
        return e / e.sum(dim, keepdim=True)

    def log_softmax(self, dim: int = -1, dtype=None):
        x = self.to(dtype) if dtype else self._float()
        s = x - x.amax(dim, keepdim=True)
        return s - s.exp().sum(dim, keepdim=True).log()

    def logsumexp(self, dim=None, keepdim: bool = False):
        x = self._float()
        m = x.amax(dim, keepdim=True)
        out = (x - m).exp().sum(dim, keepdim=True).log() + m
        return out if keepdim else out.squeeze(self._dims(dim))

    def cumsum(self, dim: int, dtype=None):
        ax = self._axis(dim)
        x = self.to(dtype) if dtype else self
        if x.dtype in (dt.bool_, dt.uint8):
            x = x.to(dt.int32)
        if not self.ndim:
            return x
        x = x.transpose(ax, -1) if ax != self.ndim - 1 else x
        n = x.layout.shape[-1]
        j = _arange(self.graph, n)
        keep = j.unsqueeze(0).le(j.unsqueeze(1)).to(x.dtype)  # keep[i, j] = j <= i
        out = (x.unsqueeze(-2) * keep).sum(-1)
        return out.transpose(ax, -1) if ax != self.ndim - 1 else out

    def cumprod(self, dim: int, dtype=None):
        """Products of magnitudes as sums of logs (zeros clamp to a log no sum can climb back from), the sign from
        the running count of negatives."""
        x = self.to(dtype) if dtype else self
        f = x.float()
        mag = f.abs().log2().maximum(-1e6).cumsum(dim).exp2()
        negs = f.lt(0).to(dt.int32).cumsum(dim)
        out = mag * (1 - 2 * negs.remainder(2).float())
        if x.dtype.is_float:
            return out.to(x.dtype)
        return out.round().to(dt.int32 if x.dtype in (dt.bool_, dt.uint8) else x.dtype)

    def any(self, dim=None, keepdim: bool = False):
        return self.bool().to(dt.int32).amax(dim, keepdim).bool()

    def all(self, dim=None, keepdim: bool = False):
        return self.bool().to(dt.int32).amin(dim, keepdim).bool()

    def norm(self, p="fro", dim=None, keepdim: bool = False, dtype=None):
        """torch.norm: the vector p-norm over `dim` (all elements by default); 'fro' is the 2-norm."""
        x = self.to(dtype) if dtype else self._float()
        f = x.float()  # accumulate in float32, as torch does for 16-bit inputs
        if p == "fro" or p == 2:
            out = (f * f).sum(dim, keepdim).sqrt()
        elif p == 1:
            out = f.abs().sum(dim, keepdim)
        elif p == float("inf"):
            out = f.abs().amax(dim, keepdim)
        elif p == float("-inf"):
            out = f.abs().amin(dim, keepdim)
        elif p == 0:
            out = f.ne(0).float().sum(dim, keepdim)
        elif isinstance(p, (int, float)) and not isinstance(p, bool):
            out = f.abs().pow(p).sum(dim, keepdim).pow(1 / p)
        else:
            raise ValueError(f"norm: p must be a number or 'fro', got {p!r}")
        return out.to(x.dtype)

    # ---- movement (views) ----------------------------------------------------------------------------------------
    def reshape(self, *shape) -> "Tensor":
        shape = list(shape[0]) if len(shape) == 1 and isinstance(shape[0], (list, tuple)) else list(shape)
        shape = [_core.to_expr(d) for d in shape]
        holes = [i for i, d in enumerate(shape) if d.is_const() and int(d) == -1]
        if len(holes) > 1:
            raise ValueError("reshape: only one dim can be -1")
        if holes:
            known = _core.Expr(1)
            for i, d in enumerate(shape):
                if i != holes[0]:
                    known = known * d
            total = _core.to_expr(self.numel())
            q = total // known
            if q * known != total:
                raise ValueError(f"reshape: shape {_fmt(self.shape)} cannot be viewed as {_fmt(shape)}")
            shape[holes[0]] = q
        v = self.layout.reshape(shape)
        if v is None:  # the layout needs a copy first
            return self.contiguous()._with_view(_core.View.contiguous(shape))
        return self._with_view(v)

    def view(self, *shape) -> "Tensor":
        return self.reshape(*shape)

    def view_as(self, other) -> "Tensor":
        return self.reshape(other.layout.shape)

    def permute(self, *dims) -> "Tensor":
        dims = list(dims[0]) if len(dims) == 1 and isinstance(dims[0], (list, tuple)) else list(dims)
        return self._with_view(self.layout.permute([self._axis(d) for d in dims]))

    def transpose(self, dim0: int, dim1: int) -> "Tensor":
        p = list(range(self.ndim))
        a, b = self._axis(dim0), self._axis(dim1)
        if not self.ndim:
            return self
        p[a], p[b] = p[b], p[a]
        return self.permute(p)

    @property
    def T(self):
        return self.permute(list(range(self.ndim))[::-1])

    @property
    def mT(self):
        return self.transpose(-2, -1)

    def expand(self, *sizes) -> "Tensor":
        sizes = list(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (list, tuple)) else list(sizes)
        extra = len(sizes) - self.ndim
        if extra < 0:
            raise ValueError(f"expand: {len(sizes)} sizes given for shape {_fmt(self.shape)}")
        shape = []
        for i, s in enumerate(sizes):
            s = _core.to_expr(s)
            shape.append(self.layout.shape[i - extra] if s.is_const() and int(s) == -1 else s)
        try:
            return self.expand_to(shape)
        except ValueError as e:
            raise ValueError(f"expand: cannot expand shape {_fmt(self.shape)} to {_fmt(shape)}: {e}") from None

    def expand_as(self, other):
        return self.expand_to(other.layout.shape)

    def unsqueeze(self, dim: int) -> "Tensor":
        return self._with_view(self.layout.unsqueeze(self._axis(dim, self.ndim + 1)))

    def squeeze(self, dim=None) -> "Tensor":
        dims = [i for i, d in enumerate(self.layout.shape) if d.is_const() and int(d) == 1] if dim is None else \
            [a for a in self._dims(dim) if self.layout.shape[a].is_const() and int(self.layout.shape[a]) == 1]
        if self.ndim == 1 and dims and self.layout.mask:
            # A padded single element: a view of rank 0 has no mask to say whether it is padding, so copy first.
            return self.contiguous().squeeze(dim)
        v = self.layout
        for a in sorted(dims, reverse=True):
            v = v.squeeze(a)
        return self._with_view(v)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
        if self.ndim == 0:
            return self.reshape(1)
        s, e = self._axis(start_dim), self._axis(end_dim)
        shape = list(self.layout.shape)
        n = _core.Expr(1)
        for d in shape[s:e + 1]:
            n = n * d
        return self.reshape(shape[:s] + [n] + shape[e + 1:])

    def contiguous(self) -> "Tensor":
        if self.layout.is_contiguous():
            return self
        return self._new(self.graph._g.cast(self._edge(), self.dtype.name))  # a same-dtype Cast is a copy

    def flip(self, dims) -> "Tensor":
        v = self.layout
        for a in self._dims(dims):
            v = v.flip(a)
        return self._with_view(v)

    def pad(self, pad: Sequence, value: float = 0.0, mode: str = "constant") -> "Tensor":
        """torch.nn.functional.pad: (left, right) pairs from the last dim backwards; negative pads crop. `mode`
        'reflect', 'replicate' or 'circular' fills from the tensor's own edges (after cropping)."""
        if len(pad) % 2 or len(pad) // 2 > self.ndim:
            raise ValueError(f"pad: {len(pad)} values do not fit shape {_fmt(self.shape)}")
        if mode != "constant":
            return self._pad_edges(pad, mode)
        v = self.layout
        for i in range(len(pad) // 2):
            ax = self.ndim - 1 - i
            lo, hi = _core.to_expr(pad[2 * i]), _core.to_expr(pad[2 * i + 1])
            if lo.is_const() and int(lo) < 0:
                v, lo = v.slice(ax, -lo, v.shape[ax]), _core.Expr(0)
            if hi.is_const() and int(hi) < 0:
                v, hi = v.slice(ax, 0, v.shape[ax] + hi), _core.Expr(0)
            if v.shape[ax].is_const() and int(v.shape[ax]) < 0:
                raise ValueError(f"pad: {list(pad)} crops dim {ax} of shape {_fmt(self.shape)} below size 0")
            if not (lo == 0 and hi == 0):
                v = v.pad(ax, lo, hi)
        out = self._with_view(v)
        if value != 0:
            ones = self._const_like(1).pad(pad)
            out = out + (1 - ones) * value
        return out

    def _pad_edges(self, pad: Sequence, mode: str) -> "Tensor":
        if mode not in ("reflect", "replicate", "circular"):
            raise ValueError(f"pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', got {mode!r}")
        from .functional import cat

        x = self
        for i in range(len(pad) // 2):
            ax = self.ndim - 1 - i
            lo, hi = int(pad[2 * i]), int(pad[2 * i + 1])
            n = x.layout.shape[ax]
            if mode == "replicate" and (lo < 0 or hi < 0) and n.is_const():
                # torch's replicate reads input[clamp(i - lo, 0, n - 1)], negative pads included
                size = int(n) + lo + hi
                if int(n) == 0 or size < 0:
                    raise ValueError(f"pad: replicate padding ({lo}, {hi}) does not fit dim {ax} of shape "
                                     f"{_fmt(self.shape)}")
                src = (_arange(self.graph, size) - lo).clamp(0, int(n) - 1)
                x = x.index_select(ax, src)
                continue
            # Negative pads crop first; the edges then come from what is left (as torch does).
            x = x.narrow(ax, max(-lo, 0), x.layout.shape[ax] - max(-lo, 0) - max(-hi, 0))
            lo, hi = max(lo, 0), max(hi, 0)
            if not lo and not hi:
                continue
            n = x.layout.shape[ax]
            if n.is_const():
                size = int(n)
                if mode == "reflect" and max(lo, hi) >= size:
                    raise ValueError(f"pad: reflect padding ({lo}, {hi}) of dim {ax} must be smaller than its size "
                                     f"{size} (input shape {_fmt(self.shape)})")
                if mode == "circular" and max(lo, hi) > size:
                    raise ValueError(f"pad: circular padding ({lo}, {hi}) of dim {ax} must be at most its size "
                                     f"{size} (input shape {_fmt(self.shape)})")
                if mode == "replicate" and size == 0:
                    raise ValueError(f"pad: replicate padding of dim {ax} needs a non-empty dim (input shape "
                                     f"{_fmt(self.shape)})")
            if mode == "reflect":  # mirrored about the edge elements, which are not repeated
                left, right = x.narrow(ax, 1, lo).flip(ax), x.narrow(ax, n - 1 - hi, hi).flip(ax)
            elif mode == "replicate":
                shape = list(x.layout.shape)
                left = x.narrow(ax, 0, 1).expand_to(shape[:ax] + [_core.Expr(lo)] + shape[ax + 1:])
                right = x.narrow(ax, n - 1, 1).expand_to(shape[:ax] + [_core.Expr(hi)] + shape[ax + 1:])
            else:
                left, right = x.narrow(ax, n - lo, lo), x.narrow(ax, 0, hi)
            x = cat([p for p, k in ((left, lo), (x, 1), (right, hi)) if k], ax)
        return x

    def repeat(self, *sizes) -> "Tensor":
        sizes = list(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (list, tuple)) else list(sizes)
        if len(sizes) < self.ndim:
            raise ValueError(f"repeat: {len(sizes)} sizes for shape {_fmt(self.shape)}")
        x = self
        for _ in range(len(sizes) - self.ndim):
            x = x.unsqueeze(0)
        shape = list(x.layout.shape)
        for i, r in enumerate(sizes):
            if isinstance(r, int) and r == 1:
                continue
            # (.., n, ..) -> (.., r, n, ..) by broadcast, then merge the two dims.
            y = x.unsqueeze(i)
            y = y.expand_to(list(y.layout.shape[:i]) + [_core.to_expr(r)] + list(y.layout.shape[i + 1:]))
            shape[i] = _core.to_expr(r) * shape[i]
            x = y.reshape(shape)
        return x

    def split(self, split_size, dim: int = 0) -> list["Tensor"]:
        ax = self._axis(dim)
        n = self.layout.shape[ax]
        if isinstance(split_size, (list, tuple)):
            sizes = list(split_size)
        else:
            if not n.is_const():
                raise ValueError("split: the dim is symbolic; give explicit sizes")
            sizes = [split_size] * (int(n) // split_size) + ([int(n) % split_size] if int(n) % split_size else [])
        out, start = [], _core.Expr(0)
        for s in sizes:
            out.append(self._with_view(self.layout.slice(ax, start, start + s)))
            start = start + s
        if start != n:
            raise ValueError(f"split: sizes {sizes} do not add up to dim {dim} of shape {_fmt(self.shape)}")
        return out

    def chunk(self, chunks: int, dim: int = 0) -> list["Tensor"]:
        n = self.layout.shape[self._axis(dim)]
        if not n.is_const():
            raise ValueError("chunk: the dim is symbolic")
        size = -(-int(n) // chunks)
        return self.split(size, dim)

    def narrow(self, dim: int, start, length) -> "Tensor":
        ax = self._axis(dim)
        n = self.layout.shape[ax]
        if _is_tensor(start):  # known only when the graph runs: gather the rows start, start + 1, ...
            s0 = start.to(dt.int32).reshape([])
            s0 = s0 + s0.lt(0).to(dt.int32) * _scalar(self.graph, n, dt.int32)
            return self.index_select(ax, _arange(self.graph, length) + s0)
        start, length = _core.to_expr(start), _core.to_expr(length)
        if start.is_const() and int(start) < 0 and n.is_const():
            start = n + start
        end = start + length
        if all(e.is_const() for e in (start, length, n)) and not (0 <= int(start) <= int(end) <= int(n)):
            raise IndexError(f"narrow: start {int(start)} and length {int(length)} do not fit dim {dim} of shape "
                             f"{_fmt(self.shape)}")
        return self._with_view(self.layout.slice(ax, start, end))

    def unbind(self, dim: int = 0) -> tuple:
        ax = self._axis(dim)
        n = self.layout.shape[ax]
        if not n.is_const():
            raise ValueError(f"unbind: dim {dim} of shape {_fmt(self.shape)} is symbolic")
        return tuple(self.narrow(ax, i, 1).squeeze(ax) for i in range(int(n)))

    def movedim(self, source, destination) -> "Tensor":
        src = [source] if isinstance(source, (int, np.integer)) else list(source)
        dst = [destination] if isinstance(destination, (int, np.integer)) else list(destination)
        if len(src) != len(dst):
            raise ValueError(f"movedim: {len(src)} source dims but {len(dst)} destinations")
        src, dst = [self._axis(d) for d in src], [self._axis(d) for d in dst]
        if len(set(src)) != len(src) or len(set(dst)) != len(dst):
            raise ValueError(f"movedim: repeated dims in source {src} or destination {dst}")
        order = [None] * self.ndim
        for s_, d_ in zip(src, dst):
            order[d_] = s_
        rest = iter(i for i in range(self.ndim) if i not in src)  # the other dims keep their order
        return self.permute([o if o is not None else next(rest) for o in order])

    moveaxis = movedim

    def swapaxes(self, axis0: int, axis1: int) -> "Tensor":
        return self.transpose(axis0, axis1)

    swapdims = swapaxes

    def roll(self, shifts, dims=None) -> "Tensor":
        if dims is None:  # roll the flattened tensor
            return self.reshape(-1).roll(shifts, 0).reshape(self.layout.shape)
        shifts = [shifts] if isinstance(shifts, (int, np.integer)) else list(shifts)
        dims = [dims] if isinstance(dims, (int, np.integer)) else list(dims)
        if len(shifts) != len(dims):
            raise ValueError(f"roll: {len(shifts)} shifts for {len(dims)} dims")
        from .functional import cat

        x = self
        for sh, d in zip(shifts, dims):
            ax = self._axis(d)
            n = x.layout.shape[ax]
            if n.is_const():
                if int(n) == 0 or int(sh) % int(n) == 0:
                    continue
                k = _core.Expr(int(sh) % int(n))
            else:
                k = _core.to_expr(sh) if sh >= 0 else n + sh  # trusted to be within the dim
            x = cat([x.narrow(ax, n - k, k), x.narrow(ax, 0, n - k)], ax)
        return x

    def tile(self, *dims) -> "Tensor":
        dims = list(dims[0]) if len(dims) == 1 and isinstance(dims[0], (list, tuple)) else list(dims)
        return self.repeat([1] * (self.ndim - len(dims)) + dims)

    def repeat_interleave(self, repeats, dim=None, output_size=None) -> "Tensor":
        """Each element (slice along `dim`) repeated `repeats` times (an int, or one count per element)."""
        if _is_tensor(repeats):
            raise TypeError("repeat_interleave: repeats must be an int or a list of ints (a tensor of counts makes "
                            "the result's shape depend on data)")
        x, ax = (self.reshape(-1), 0) if dim is None else (self, self._axis(dim))
        if isinstance(repeats, (list, tuple)) and len(repeats) == 1:
            repeats = repeats[0]
        if isinstance(repeats, (int, np.integer)):
            if repeats < 0:
                raise ValueError(f"repeat_interleave: repeats must be non-negative, got {repeats}")
            shape = list(x.layout.shape)
            y = x.unsqueeze(ax + 1)
            y = y.expand_to(shape[:ax + 1] + [_core.Expr(int(repeats))] + shape[ax + 1:])
            return y.reshape(shape[:ax] + [shape[ax] * int(repeats)] + shape[ax + 1:])
        repeats = [int(r) for r in repeats]
        n = x.layout.shape[ax]
        if not n.is_const() or int(n) != len(repeats) or min(repeats, default=0) < 0:
            raise ValueError(f"repeat_interleave: {len(repeats)} non-negative counts needed for dim {ax} of shape "
                             f"{_fmt(x.shape)}, got {repeats}")
        # Output position z reads element sum_i [z >= end of block i]: one Iota over the block ends.
        z, src, end = _core.Expr.var("z"), _core.Expr(0), 0
        for r in repeats[:-1]:
            end += r
            src = src + 1 - (z < end)
        idx = self.graph._wrap(self.graph._g.iota(src, sum(repeats)))
        return x.index_select(ax, idx)

    def __getitem__(self, idx) -> "Tensor":
        if not isinstance(idx, tuple):
            idx = (idx,)
        if any(isinstance(i, list) for i in idx):  # a list of ints indexes like a tensor of them (a constant)
            idx = tuple(self.graph.named(np.asarray(i, dtype=np.int32), dt.int32) if isinstance(i, list) else i
                        for i in idx)
        if any(_is_tensor(i) for i in idx):  # torch's advanced indexing: negative indices wrap, on any dims
            from .indexing import advanced_index

            return advanced_index(self, idx)
        n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
        if n_real > self.ndim:
            raise IndexError(f"too many indices ({n_real}) for a tensor of shape {_fmt(self.shape)}")
        if Ellipsis in idx:
            k = idx.index(Ellipsis)
            idx = idx[:k] + (slice(None),) * (self.ndim - n_real) + idx[k + 1:]
        v, ax, drop = self.layout, 0, []
        for i in idx:
            if i is None:
                v = v.unsqueeze(ax)
                ax += 1
                continue
            n = v.shape[ax]
            if isinstance(i, slice) and i == slice(None):
                ax += 1
                continue
            if isinstance(i, slice):
                step = 1 if i.step is None else int(i.step)
                if step == 0:
                    raise ValueError("slice step cannot be zero")
                if step < 0:
                    # Flip, then take the same elements counted from the other end.
                    if n.is_const():
                        rng = range(*i.indices(int(n)))
                        first = int(n) - 1 - rng.start if len(rng) else 0
                        i = slice(first, first + (len(rng) - 1) * -step + 1 if len(rng) else 0, -step)
                    elif i.start is not None or i.stop is not None:
                        raise NotImplementedError("a negative step with bounds needs a constant dim")
                    else:
                        i = slice(None, None, -step)
                    v = v.flip(ax)
                    step = -step
                start = _clamp_index(i.start, n, 0)
                stop = _clamp_index(i.stop, n, n)
                if (stop - start).is_const() and int(stop - start) < 0:
                    stop = start  # an empty slice, as Python gives (symbolic bounds are trusted)
                v = v.slice(ax, start, stop, step)
                ax += 1
            elif isinstance(i, (int, np.integer, _core.Expr)):
                j = _core.to_expr(i)
                if j.is_const():
                    if n.is_const() and not -int(n) <= int(j) < int(n):
                        raise IndexError(f"index {int(j)} is out of range for dim {ax} of size {int(n)}")
                    if int(j) < 0:
                        j = n + j
                v = v.slice(ax, j, j + 1)
                drop.append(ax)
                ax += 1
            else:
                raise TypeError(f"unsupported index {i!r}")
        for a in reversed(drop):
            v = v.squeeze(a)
        return self._with_view(v)

    # ---- gathers -------------------------------------------------------------------------------------------------
    def index_select(self, dim: int, index: "Tensor") -> "Tensor":
        ax = self._axis(dim)
        if index.ndim == 0:
            index = index.reshape(1)
        if not self.ndim:  # torch reads a 0-d tensor as one element (the index must be 0)
            return self.reshape(1).index_select(0, index).reshape([])
        if index.ndim != 1:
            raise ValueError(f"index_select: index must be 1-D, got shape {_fmt(index.shape)}")
        if index.dtype.is_float or index.dtype is dt.bool_:  # as torch: no silent cast of a float index
            raise TypeError(f"index_select: index must be an integer tensor, got {index.dtype.name}")
        table = self.transpose(0, ax) if ax else self
        out = self._new(self.graph._g.gather(table._edge(), index.to(dt.int32)._edge()))
        return out.transpose(0, ax) if ax else out

    def index_copy(self, dim: int, index: "Tensor", source: "Tensor") -> "Tensor":
        """torch.index_copy: self with its slices index[i] along `dim` replaced by source's slices i (one Scatter).
        On a donated input (`set(array, donate=True)`) that nothing else reads, it updates the array in place."""
        ax = self._axis(dim)
        if index.ndim == 0:
            index = index.reshape(1)
        if not self.ndim:
            return self.reshape(1).index_copy(0, index, source.reshape(1)).reshape([])
        if source.ndim == 0:
            source = source.reshape(1)
        if index.ndim != 1:
            raise ValueError(f"index_copy: index must be 1-D, got shape {_fmt(index.shape)}")
        if source.dtype != self.dtype:
            raise TypeError(f"index_copy: source is {source.dtype.name} but self is {self.dtype.name}")
        dest = self.transpose(0, ax) if ax else self
        src = source.transpose(0, ax) if ax else source
        out = self._new(self.graph._g.scatter(dest._edge(), index.to(dt.int32)._edge(), src._edge()))
        return out.transpose(0, ax) if ax else out

    def gather(self, dim: int, index: "Tensor") -> "Tensor":
        """torch.gather: out[i][j][k] = self[i][index[i][j][k]][k] for dim=1."""
        ax = self._axis(dim)
        if index.dtype.is_float or index.dtype is dt.bool_:  # as torch: no silent cast of a float index
            raise TypeError(f"gather: index must be an integer tensor, got {index.dtype.name}")
        if not self.ndim and index.ndim <= 1:  # torch reads a 0-d input as one element
            return self.reshape(1).gather(0, index.reshape(-1)).reshape(index.layout.shape)
        if index.ndim != self.ndim:
            raise ValueError(f"gather: index shape {_fmt(index.shape)} and input shape {_fmt(self.shape)} "
                             "must have the same number of dims")
        src = self.contiguous()
        strides = _core.View.contiguous(src.layout.shape).strides
        idx = index.to(dt.int32)
        # An index outside [0, n) along `dim` is pushed past the end of the flat table, so Gather reports it.
        bad = idx.lt(0) | idx.ge(_scalar(self.graph, self.layout.shape[ax], dt.int32))
        flat = idx * _scalar(self.graph, strides[ax], dt.int32) + bad.to(dt.int32) * _scalar(
            self.graph, src.numel(), dt.int32)
        for d in range(self.ndim):
            if d != ax:
                flat = flat + _arange_along(index, d) * _scalar(self.graph, strides[d], dt.int32)
        table = src.reshape(-1)
        return self._new(self.graph._g.gather(table._edge(), flat._edge()))

    # ---- matmul --------------------------------------------------------------------------------------------------
    def matmul(self, other: "Tensor") -> "Tensor":
        a, b = self, other
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError("matmul: both operands need at least one dim")
        va, vb = a.ndim == 1, b.ndim == 1
        if va:
            a = a.unsqueeze(0)
        if vb:
            b = b.unsqueeze(1)
        if a.layout.shape[-1] != b.layout.shape[-2]:
            raise ValueError(f"matmul: shape mismatch {_fmt(self.shape)} @ {_fmt(other.shape)} "
                             f"(inner dims {a.layout.shape[-1]} and {b.layout.shape[-2]})")
        t = dt.result_type(a.dtype, b.dtype)
        a, b = a.to(t), b.to(t)
        try:
            batch = broadcast_shapes(a.layout.shape[:-2], b.layout.shape[:-2], "matmul")
        except ValueError:
            raise ValueError(f"matmul: batch dims of {_fmt(self.shape)} and {_fmt(other.shape)} cannot be "
                             "broadcast together") from None
        m, k, n = a.layout.shape[-2], a.layout.shape[-1], b.layout.shape[-1]
        # (.., m, 1, k) * (.., 1, n, k) summed over k: the broadcast-Mul + SumReduce that compilers turn into GEMMs.
        a3 = a.unsqueeze(-2).expand_to(list(batch) + [m, n, k])
        b3 = b.transpose(-1, -2).unsqueeze(-3).expand_to(list(batch) + [m, n, k])
        out = (a3 * b3).sum(-1)
        if va:
            out = out.squeeze(-2)
        if vb:
            out = out.squeeze(-1)
        return out

    __matmul__ = matmul

    def __rmatmul__(self, other):
        return other.matmul(self)

    def _need_dims(self, other, op: str, na: int, nb: int):
        if self.ndim != na or other.ndim != nb:
            raise ValueError(f"{op}: expected {na}-D and {nb}-D operands, got shapes {_fmt(self.shape)} and "
                             f"{_fmt(other.shape)}")

    def mm(self, mat2: "Tensor") -> "Tensor":
        self._need_dims(mat2, "mm", 2, 2)
        return self.matmul(mat2)

    def bmm(self, mat2: "Tensor") -> "Tensor":
        self._need_dims(mat2, "bmm", 3, 3)
        if self.layout.shape[0] != mat2.layout.shape[0]:
            raise ValueError(f"bmm: batch sizes differ: shapes {_fmt(self.shape)} and {_fmt(mat2.shape)}")
        return self.matmul(mat2)

    def mv(self, vec: "Tensor") -> "Tensor":
        self._need_dims(vec, "mv", 2, 1)
        return self.matmul(vec)

    def dot(self, other: "Tensor") -> "Tensor":
        self._need_dims(other, "dot", 1, 1)
        return self.matmul(other)

    inner_product = dot

    def outer(self, vec2: "Tensor") -> "Tensor":
        self._need_dims(vec2, "outer", 1, 1)
        return self.unsqueeze(1) * vec2.unsqueeze(0)

    ger = outer

    def _plus_product(self, prod: "Tensor", beta, alpha, op: str) -> "Tensor":
        """beta * self + alpha * prod, self broadcast to prod's shape (beta == 0 ignores self, NaNs included)."""
        try:
            shape = broadcast_shapes(self.layout.shape, prod.layout.shape, op)
        except ValueError:
            shape = None
        if shape is None or list(shape) != list(prod.layout.shape):
            raise ValueError(f"{op}: input of shape {_fmt(self.shape)} does not broadcast to the product's shape "
                             f"{_fmt(prod.shape)}")
        out = prod if alpha == 1 else prod * alpha
        if beta == 0:
            return out.to(dt.result_type(self.dtype, out.dtype))
        return out + (self if beta == 1 else self * beta)

    def addmm(self, mat1: "Tensor", mat2: "Tensor", *, beta=1, alpha=1) -> "Tensor":
        return self._plus_product(mat1.mm(mat2), beta, alpha, "addmm")

    def addmv(self, mat: "Tensor", vec: "Tensor", *, beta=1, alpha=1) -> "Tensor":
        return self._plus_product(mat.mv(vec), beta, alpha, "addmv")

    def baddbmm(self, batch1: "Tensor", batch2: "Tensor", *, beta=1, alpha=1) -> "Tensor":
        return self._plus_product(batch1.bmm(batch2), beta, alpha, "baddbmm")

    def addbmm(self, batch1: "Tensor", batch2: "Tensor", *, beta=1, alpha=1) -> "Tensor":
        return self._plus_product(batch1.bmm(batch2).sum(0), beta, alpha, "addbmm")

    # ---- nn helpers ----------------------------------------------------------------------------------------------
    def linear(self, weight: "Tensor", bias: "Tensor | None" = None) -> "Tensor":
        out = self.matmul(weight.T)
        return out + bias if bias is not None else out

    def _check_normalized_shape(self, op: str, normalized_shape):
        """As torch: the normalized shape must be the input's trailing dims."""
        if normalized_shape is None:
            return
        want = [normalized_shape] if isinstance(normalized_shape, (int, str, _core.Expr)) else list(normalized_shape)
        have = self.layout.shape[self.ndim - len(want):] if len(want) <= self.ndim else None
        if have is None or any(_core.to_expr(w) != h for w, h in zip(want, have)):
            raise ValueError(f"{op}: normalized_shape {tuple(want)} is not the trailing dims of shape "
                             f"{_fmt(self.shape)}")

    def layer_norm(self, normalized_shape=None, weight=None, bias=None, eps: float = 1e-5):
        nd = 1 if normalized_shape is None else (1 if isinstance(normalized_shape, int) else len(normalized_shape))
        self._check_normalized_shape("layer_norm", normalized_shape)
        dims = list(range(-nd, 0))
        x = self._float()
        mu = x.mean(dims, keepdim=True)
        d = x - mu
        out = d * ((d * d).mean(dims, keepdim=True) + eps).rsqrt()
        if weight is not None:
            out = out * weight
        if bias is not None:
            out = out + bias
        return out

    def rms_norm(self, normalized_shape=None, weight=None, eps: float | None = None):
        nd = 1 if normalized_shape is None else (1 if isinstance(normalized_shape, int) else len(normalized_shape))
        self._check_normalized_shape("rms_norm", normalized_shape)
        dims = list(range(-nd, 0))
        x = self._float()
        if eps is None:  # torch's default: the dtype's machine epsilon
            eps = float(np.finfo(np.float16 if x.dtype is dt.float16 else np.float32).eps) \
                if x.dtype is not dt.bfloat16 else 2.0 ** -7
        f = x.float()  # x * x overflows 16-bit floats past |x| = 256: torch computes in float32 too
        out = (f * ((f * f).mean(dims, keepdim=True) + eps).rsqrt()).to(x.dtype)
        return out * weight if weight is not None else out

    def triu(self, diagonal: int = 0):
        from .functional import triu

        return triu(self, diagonal)

    def tril(self, diagonal: int = 0):
        from .functional import tril

        return tril(self, diagonal)

    # ---- more of torch's surface (compositions of the above) -------------------------------------------------------
    # shape and views
    def t(self):
        if self.ndim > 2:
            raise ValueError(f"t: expects a tensor with at most 2 dims, got shape {_fmt(self.shape)}")
        return self.transpose(0, 1) if self.ndim == 2 else self

    def select(self, dim: int, index) -> "Tensor":
        ax = self._axis(dim)
        if not self.ndim:
            raise IndexError("select: a 0-d tensor has no dim to select from")
        return self[(slice(None),) * ax + (index,)]

    def slice(self, dim: int = 0, start=None, end=None, step: int = 1) -> "Tensor":
        """torch.ops.aten.slice: self[..., start:end:step] along `dim`."""
        ax = self._axis(dim)
        return self[(slice(None),) * ax + (slice(start, end, step),)]

    def ravel(self):
        return self.reshape(-1)

    def reshape_as(self, other):
        return self.reshape(other.layout.shape)

    def unflatten(self, dim: int, sizes) -> "Tensor":
        ax = self._axis(dim)
        shape = list(self.layout.shape)
        sizes = list(sizes)
        if sizes.count(-1) > 1:
            raise ValueError("unflatten: only one size can be -1")
        if -1 in sizes:
            known = 1
            for s_ in sizes:
                if s_ != -1:
                    known *= int(s_)
            sizes[sizes.index(-1)] = shape[ax] // known if known else 0
        return self.reshape(shape[:ax] + [_core.to_expr(s_) for s_ in sizes] + shape[ax + 1:])

    def broadcast_to(self, size) -> "Tensor":
        return self.expand(*size) if len(size) else self.expand_to([])

    def sum_to_size(self, *size) -> "Tensor":
        size = list(size[0]) if len(size) == 1 and isinstance(size[0], (list, tuple)) else list(size)
        lead = self.ndim - len(size)
        if lead < 0:
            raise ValueError(f"sum_to_size: shape {_fmt(self.shape)} is not expandable to size {_fmt(size)}")
        x = self.sum(list(range(lead))) if lead else self
        dims = [i for i, s_ in enumerate(size) if int(s_) == 1 and x.layout.shape[i] != 1]
        return x.sum(dims, keepdim=True) if dims else x

    def new_full(self, size, fill_value, *, dtype=None):
        from .functional import full

        return full(tuple(size), fill_value, dtype or self.dtype, graph=self.graph)

    def new_zeros(self, *size, dtype=None):
        size = size[0] if len(size) == 1 and isinstance(size[0], (list, tuple)) else size
        return self.new_full(size, 0, dtype=dtype)

    def new_ones(self, *size, dtype=None):
        size = size[0] if len(size) == 1 and isinstance(size[0], (list, tuple)) else size
        return self.new_full(size, 1, dtype=dtype)

    def fill(self, value):
        if _is_tensor(value):
            return value.to(self.dtype).expand_to(self.layout.shape)
        return self._const_like(value)

    def byte(self):
        return self.to(dt.uint8)

    def long(self):
        return self.to(dt.int32)  # luminal's widest integer

    def positive(self):
        return self

    def fliplr(self):
        if self.ndim < 2:
            raise ValueError(f"fliplr: needs at least 2 dims, got shape {_fmt(self.shape)}")
        return self.flip(1)

    def flipud(self):
        if self.ndim < 1:
            raise ValueError("flipud: needs at least 1 dim, got a 0-d tensor")
        return self.flip(0)

    def rot90(self, k: int = 1, dims=(0, 1)) -> "Tensor":
        if len(dims) != 2 or self.ndim < 2:
            raise ValueError(f"rot90: needs two dims of a tensor with at least 2, got dims {dims} and shape "
                             f"{_fmt(self.shape)}")
        a, b = self._axis(dims[0]), self._axis(dims[1])
        if a == b:
            raise ValueError(f"rot90: dims must differ, got {dims}")
        k %= 4
        if k == 1:
            return self.flip(b).transpose(a, b)
        if k == 2:
            return self.flip([a, b])
        if k == 3:
            return self.transpose(a, b).flip(b)
        return self

    def tensor_split(self, indices_or_sections, dim: int = 0) -> tuple:
        ax = self._axis(dim)
        n = self.layout.shape[ax]
        if _is_tensor(indices_or_sections):
            raise NotImplementedError("tensor_split: indices or sections in a tensor make the result's shapes depend "
                                      "on the data; give ints")
        if isinstance(indices_or_sections, (int, np.integer)):
            k = int(indices_or_sections)
            if k <= 0 or not n.is_const():
                raise ValueError(f"tensor_split: sections must be positive and dim {dim} constant, got {k} for "
                                 f"shape {_fmt(self.shape)}")
            q, r = divmod(int(n), k)
            bounds, at = [], 0
            for i in range(k - 1):
                at += q + (1 if i < r else 0)
                bounds.append(at)
        else:
            bounds = [int(i) for i in indices_or_sections]
        out, prev = [], 0
        for b in bounds + [None]:
            out.append(self[(slice(None),) * ax + (slice(prev, b),)])
            prev = b if b is not None else prev
        return tuple(out)

    def _split_dim(self, sections, dim: int, op: str, need: int) -> tuple:
        if self.ndim < need:
            raise ValueError(f"{op}: needs at least {need} dims, got shape {_fmt(self.shape)}")
        if isinstance(sections, (int, np.integer)):
            n = self.layout.shape[dim]
            if n.is_const() and int(n) % int(sections):
                raise ValueError(f"{op}: dim {dim} of shape {_fmt(self.shape)} does not split into {sections} equal "
                                 "parts")
        return self.tensor_split(sections, dim)

    def hsplit(self, sections):
        return self._split_dim(sections, 1 if self.ndim > 1 else 0, "hsplit", 1)

    def vsplit(self, sections):
        return self._split_dim(sections, 0, "vsplit", 2)

    def dsplit(self, sections):
        return self._split_dim(sections, 2, "dsplit", 3)

    def split_with_sizes(self, split_sizes, dim: int = 0):
        return self.split(list(split_sizes), dim)

    unsafe_split = split
    unsafe_chunk = chunk

    def unsafe_split_with_sizes(self, split_sizes, dim: int = 0):
        return self.split(list(split_sizes), dim)

    def unfold(self, dimension: int, size: int, step: int) -> "Tensor":
        """Windows of `size` along `dimension` every `step`, as a new last dim."""
        if not self.ndim:
            return self.reshape(1)
        ax = self._axis(dimension)
        n = self.layout.shape[ax]
        if not n.is_const() or size > int(n) or step <= 0:
            raise ValueError(f"unfold: size {size} and step {step} do not fit dim {dimension} of shape "
                             f"{_fmt(self.shape)}")
        count = (int(n) - size) // step + 1
        start = _arange(self.graph, count) * step
        idx = (start.unsqueeze(1) + _arange(self.graph, size).unsqueeze(0)).reshape(-1)
        out = self.index_select(ax, idx)
        shape = list(self.layout.shape)
        out = out.reshape(shape[:ax] + [_core.Expr(count), _core.Expr(size)] + shape[ax + 1:])
        return out.movedim(ax + 1, -1)

    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> "Tensor":
        a, b = self._axis(dim1), self._axis(dim2)
        if a == b:
            raise ValueError(f"diagonal: dim1 and dim2 must differ, got {dim1} and {dim2}")
        x = self.movedim((a, b), (-2, -1))
        rows, cols = x.layout.shape[-2], x.layout.shape[-1]
        if not (rows.is_const() and cols.is_const()):
            raise ValueError(f"diagonal: dims {dim1} and {dim2} of shape {_fmt(self.shape)} must be constant")
        r0, c0 = max(-offset, 0), max(offset, 0)
        n = max(min(int(rows) - r0, int(cols) - c0), 0)
        i = _arange(self.graph, n)
        flat = x.reshape(list(x.layout.shape[:-2]) + [rows * cols])
        return flat.index_select(-1, (i + r0) * int(cols) + c0 + i)

    def diag_embed(self, offset: int = 0, dim1: int = -2, dim2: int = -1) -> "Tensor":
        from .functional import where

        nd = self.ndim + 1
        a, b = self._axis(dim1, nd), self._axis(dim2, nd)
        if a == b:
            raise ValueError(f"diag_embed: dim1 and dim2 must differ, got {dim1} and {dim2}")
        n = self.layout.shape[-1]
        m = n + abs(offset)
        i = _arange(self.graph, m)
        on = (i.unsqueeze(0) - i.unsqueeze(1)).eq(offset)  # [row, col]: col - row == offset
        if offset >= 0:  # row i holds x[i]
            vals = self.pad((0, offset)).unsqueeze(-1)
        else:  # column j holds x[j]
            vals = self.pad((0, -offset)).unsqueeze(-2)
        out = where(on, vals, 0)
        return out.movedim((-2, -1), (a, b))

    def diag(self, diagonal: int = 0) -> "Tensor":
        if self.ndim == 1:
            return self.diag_embed(diagonal)
        if self.ndim == 2:
            return self.diagonal(diagonal)
        raise ValueError(f"diag: needs a 1-D or 2-D tensor, got shape {_fmt(self.shape)}")

    def diagflat(self, offset: int = 0) -> "Tensor":
        return self.reshape(-1).diag_embed(offset)

    def trace(self):
        if self.ndim != 2:
            raise ValueError(f"trace: needs a 2-D tensor, got shape {_fmt(self.shape)}")
        return self.diagonal().sum()

    def _scatter_view(self, src: "Tensor", where_idx: tuple) -> "Tensor":
        """self with the positions self[where_idx] (a basic-index view) replaced by src, exactly."""
        from .functional import where

        pos = _arange(self.graph, self.numel()).reshape(self.layout.shape)
        hit = pos[where_idx]
        ones = self._const_like(0, dt.int32).reshape(self.layout.shape)
        # Mark the hit positions (a one-to-one gather back from the flat table built by index_copy).
        mark = ones.reshape(-1).index_copy(0, hit.reshape(-1), hit.reshape(-1) * 0 + 1).reshape(self.layout.shape)
        full = self.reshape(-1).index_copy(0, hit.reshape(-1), src.to(self.dtype).expand_to(hit.layout.shape)
                                           .reshape(-1)).reshape(self.layout.shape)
        return where(mark.bool(), full, self)

    def slice_scatter(self, src: "Tensor", dim: int = 0, start=None, end=None, step: int = 1) -> "Tensor":
        ax = self._axis(dim)
        return self._scatter_view(src, (slice(None),) * ax + (slice(start, end, step),))

    def select_scatter(self, src: "Tensor", dim: int, index: int) -> "Tensor":
        ax = self._axis(dim)
        return self._scatter_view(src, (slice(None),) * ax + (index,))

    def diagonal_scatter(self, src: "Tensor", offset: int = 0, dim1: int = 0, dim2: int = 1) -> "Tensor":
        pos = _arange(self.graph, self.numel()).reshape(self.layout.shape).diagonal(offset, dim1, dim2)
        flat = self.reshape(-1).index_copy(0, pos.reshape(-1), src.to(self.dtype).expand_to(pos.layout.shape)
                                           .reshape(-1))
        return flat.reshape(self.layout.shape)

    def take(self, index: "Tensor") -> "Tensor":
        n = _scalar(self.graph, self.numel(), dt.int32)
        i = index.to(dt.int32)
        i = i + i.lt(0).to(dt.int32) * n  # negative indices count from the end
        return self.reshape(-1).index_select(0, i.reshape(-1)).reshape(index.layout.shape)

    # element-wise math
    def addcmul(self, tensor1, tensor2, *, value=1):
        return self + value * tensor1 * tensor2 if value != 1 else self + tensor1 * tensor2

    def addcdiv(self, tensor1, tensor2, *, value=1):
        return self + value * (tensor1 / tensor2)

    def erfc(self):
        def f(x):
            # A&S 7.1.26's p(t) * exp(-x^2) is erfc(|x|) itself: no 1 - erf cancellation for large x.
            a = x.abs()
            t = (1 + 0.3275911 * a).reciprocal()
            p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
            e = p * (-(a * a)).exp()
            return e + x.lt(0).float() * (2 - 2 * e)
        return self._in_f32(f)

    def erfinv(self):
        def f(x):
            # Giles' single-precision approximation: two polynomials in w = -log(1 - x^2).
            w = -((1 - x) * (1 + x)).log()
            w1 = w - 2.5
            p1 = 2.81022636e-08
            for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                      -0.00417768164, 0.246640727, 1.50140941):
                p1 = p1 * w1 + c
            w2 = w.sqrt() - 3
            p2 = -0.000200214257
            for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
                      0.00943887047, 1.00167406, 2.83297682):
                p2 = p2 * w2 + c
            from .functional import where

            y = where(w.lt(5), p1, p2) * x
            return where(x.abs().eq(1), x * float("inf"), y)  # +-1: the polynomials would give inf - inf
        return self._in_f32(f)

    def logaddexp(self, other):
        from .functional import where

        a, b = self._operands(other, "logaddexp")
        a, b = a._float(), b._float()
        m = a.maximum(b)
        return where(a.eq(b), a + LN_2, m + (-(a - b).abs()).exp().log1p())  # equal infinities: no inf - inf

    def logaddexp2(self, other):
        from .functional import where

        a, b = self._operands(other, "logaddexp2")
        a, b = a._float(), b._float()
        m = a.maximum(b)
        return where(a.eq(b), a + 1, m + (-(a - b).abs()).exp2().log1p() * LOG2_E)

    def xlogy(self, other):
        from .functional import where

        if not _is_tensor(other):
            other = _scalar(self.graph, 0, dt.float32) + other
        x, y = self._operands(other, "xlogy")
        x, y = x._float(), y._float()
        return where(x.eq(0) & ~y.isnan(), 0.0, x * y.log())

    def hypot(self, other):
        a, b = self._operands(other, "hypot")
        return (a * a + b * b).sqrt()

    def fmax(self, other):
        from .functional import where

        a, b = self._operands(other, "fmax")
        return where(b.isnan(), a, where(a.isnan(), b, a.maximum(b)))

    def fmin(self, other):
        from .functional import where

        a, b = self._operands(other, "fmin")
        return where(b.isnan(), a, where(a.isnan(), b, a.minimum(b)))

    def signbit(self):
        if not self.dtype.is_float:
            return self.lt(0)
        return self.lt(0) | (self.eq(0) & self.reciprocal().lt(0))  # -0.0: 1 / -0 = -inf

    def copysign(self, other):
        a, b = self._operands(other, "copysign")
        a = a._float()
        neg = (b.signbit() if _is_tensor(other) else b.lt(0)).to(a.dtype)
        return a.abs() * (1 - 2 * neg)

    def sinc(self):
        def f(x):
            px = x * math.pi
            zero = x.eq(0).float()
            return px.sin() / (px + zero) * (1 - zero) + zero
        return self._in_f32(f)

    def sgn(self):
        return self.sign()

    def deg2rad(self):
        return self._float() * (math.pi / 180)

    def rad2deg(self):
        return self._float() * (180 / math.pi)

    def isclose(self, other, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False):
        a, b = self._operands(other, "isclose")
        if not a.dtype.is_float:
            a, b = a.float(), b.float()
        close = a.eq(b) | (a - b).abs().le(atol + rtol * b.abs())
        return close | (a.isnan() & b.isnan()) if equal_nan else close

    def float_power(self, exponent):
        return self.float().pow(exponent.float() if _is_tensor(exponent) else exponent)

    # reductions and scans
    def nansum(self, dim=None, keepdim: bool = False, dtype=None):
        x = self.to(dtype) if dtype else self
        from .functional import where

        return (where(x.isnan(), 0, x) if x.dtype.is_float else x).sum(dim, keepdim)

    def nanmean(self, dim=None, keepdim: bool = False, dtype=None):
        x = (self.to(dtype) if dtype else self)._float()
        n = (~x.isnan()).to(x.dtype).sum(dim, keepdim)
        return x.nansum(dim, keepdim) / n

    def var_mean(self, dim=None, unbiased: bool = True, keepdim: bool = False, correction=None):
        if isinstance(dim, bool):
            dim, unbiased = None, dim
        return self.var(dim, unbiased, keepdim, correction), self.mean(dim, keepdim)

    def std_mean(self, dim=None, unbiased: bool = True, keepdim: bool = False, correction=None):
        if isinstance(dim, bool):
            dim, unbiased = None, dim
        return self.std(dim, unbiased, keepdim, correction), self.mean(dim, keepdim)

    def aminmax(self, *, dim=None, keepdim: bool = False):
        return AminmaxResult(self.amin(dim, keepdim), self.amax(dim, keepdim))

    def count_nonzero(self, dim=None):
        return self.ne(0).to(dt.int32).sum(dim)

    def _cum_ext(self, dim: int, largest: bool):
        """(values, indices) of the running max (min) along dim: the last index of the best so far, as torch."""
        from .functional import where

        ax = self._axis(dim)
        if not self.ndim:
            return self, self._const_like(0, dt.int32)
        x = self.transpose(ax, -1) if ax != self.ndim - 1 else self
        n = x.layout.shape[-1]
        j = _arange(self.graph, n)
        keep = j.unsqueeze(0).le(j.unsqueeze(1))  # keep[i, j] = j <= i
        xs = x.unsqueeze(-2).expand_to(list(x.layout.shape[:-1]) + [n, n])
        worst = float("-inf") if largest else float("inf")
        if not x.dtype.is_float:
            worst = -2 ** 31 if largest else 2 ** 31 - 1
        masked = where(keep, xs, worst)
        nan = masked.isnan().to(dt.int32).amax(-1, keepdim=True).bool()  # a NaN so far wins
        vals = masked.amax(-1, keepdim=True) if largest else masked.amin(-1, keepdim=True)
        hit = keep & (masked.eq(vals) | (masked.isnan() & nan) if x.dtype.is_float else masked.eq(vals))
        idx = (hit.to(dt.int32) * (j + 1)).amax(-1) - 1
        vals = where(nan, float("nan"), vals).squeeze(-1) if x.dtype.is_float else vals.squeeze(-1)
        vals = vals.to(self.dtype)
        if ax != self.ndim - 1:
            vals, idx = vals.transpose(ax, -1), idx.transpose(ax, -1)
        return vals, idx

    def cummax(self, dim: int):
        return CummaxResult(*self._cum_ext(dim, True))

    def cummin(self, dim: int):
        return CumminResult(*self._cum_ext(dim, False))

    def logcumsumexp(self, dim: int):
        from .functional import where

        ax = self._axis(dim)
        x = self._float()
        if not self.ndim:
            return x
        x = x.transpose(ax, -1) if ax != self.ndim - 1 else x
        n = x.layout.shape[-1]
        j = _arange(self.graph, n)
        keep = j.unsqueeze(0).le(j.unsqueeze(1))
        xs = x.unsqueeze(-2).expand_to(list(x.layout.shape[:-1]) + [n, n])
        out = where(keep, xs, float("-inf")).float().logsumexp(-1).to(x.dtype)  # per prefix: no underflow
        return out.transpose(ax, -1) if ax != self.ndim - 1 else out

    def diff(self, n: int = 1, dim: int = -1, prepend=None, append=None) -> "Tensor":
        from .functional import cat

        ax = self._axis(dim)
        parts = [p if p.ndim else p.expand_to([*self.layout.shape[:ax], _core.Expr(1), *self.layout.shape[ax + 1:]])
                 for p in (prepend, self, append) if p is not None]
        x = cat(parts, ax) if len(parts) > 1 else self
        for _ in range(n):
            m = x.layout.shape[ax]
            if m.is_const() and int(m) == 0:
                break
            hi, lo = x.narrow(ax, 1, m - 1), x.narrow(ax, 0, m - 1)
            x = hi.logical_xor(lo) if x.dtype is dt.bool_ else hi - lo
        return x

    def dist(self, other, p: float = 2):
        return (self - other).norm(p)

    def renorm(self, p: float, dim: int, maxnorm: float) -> "Tensor":
        from .functional import where

        ax = self._axis(dim)
        others = [d for d in range(self.ndim) if d != ax]
        x = self._float()
        norm = x.float().norm(p, others, keepdim=True) if others else x.float().abs()
        scale = where(norm.gt(maxnorm), maxnorm / (norm + 1e-7), 1.0)
        return (x * scale.to(x.dtype))

    def cross(self, other, dim=None) -> "Tensor":
        a, b = self._operands(other, "cross")
        if dim is None:
            dim = next((i for i, d in enumerate(a.layout.shape) if d == 3), None)
            if dim is None:
                raise ValueError(f"cross: no dim of size 3 in shape {_fmt(a.shape)}")
        ax = a._axis(dim)
        a0, a1, a2 = a.unbind(ax)
        b0, b1, b2 = b.unbind(ax)
        from .functional import stack

        return stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], ax)

    def inner(self, other):
        if not self.ndim or not other.ndim:
            return self * other
        return (self.reshape(list(self.layout.shape[:-1]) + [_core.Expr(1)] * (other.ndim - 1) +
                             [self.layout.shape[-1]]) * other.movedim(-1, -1)).sum(-1)

    def addr(self, vec1, vec2, *, beta=1, alpha=1):
        return self._plus_product(vec1.outer(vec2), beta, alpha, "addr")

    def kron(self, other) -> "Tensor":
        n = max(self.ndim, other.ndim)
        a = self.reshape([1] * (n - self.ndim) + list(self.layout.shape))
        b = other.reshape([1] * (n - other.ndim) + list(other.layout.shape))
        # (a0, 1, a1, 1, ..) * (1, b0, 1, b1, ..), then merge each pair
        ai = a.reshape([d for s_ in a.layout.shape for d in (s_, _core.Expr(1))])
        bi = b.reshape([d for s_ in b.layout.shape for d in (_core.Expr(1), s_)])
        return (ai * bi).reshape([x * y for x, y in zip(a.layout.shape, b.layout.shape)])

    def cov(self, *, correction: int = 1, fweights=None, aweights=None):
        """torch.cov: rows are variables, columns observations (weighted by fweights * aweights)."""
        x = self._float()
        if aweights is not None and aweights.dtype.is_float:  # float weights promote, as torch
            x = x.to(dt.result_type(x.dtype, aweights.dtype))
        x = x.reshape(1, -1) if x.ndim < 2 else x
        n = x.layout.shape[1]
        w = None
        for v in (fweights, aweights):
            if v is not None:
                w = v.to(x.dtype) if w is None else w * v.to(x.dtype)
        if w is None:
            d = x - x.mean(1, keepdim=True)
            norm = (_scalar(self.graph, n, dt.float32) - correction).to(x.dtype)
            c = d.matmul(d.T)
        else:
            sw = w.sum()
            d = x - (x * w).sum(1, keepdim=True) / sw
            norm = sw - (correction * (w * aweights.to(x.dtype)).sum() / sw if aweights is not None else correction)
            c = (d * w).matmul(d.T)
        c = c / norm.maximum(0)
        return c.reshape([]) if x.layout.shape[0] == 1 else c

    def corrcoef(self):
        c = self.cov()
        if not c.ndim:
            return c / c
        s = c.diagonal().sqrt()
        return (c / s.unsqueeze(1) / s.unsqueeze(0)).clamp(-1, 1)

    # special functions (float32 inside; accurate to float32 tolerance)
    def lgamma(self):
        def pos(y):  # y > 0: Stirling's series at y + 8, shifted back by the recurrence
            z = y + 8
            s = (z - 0.5) * z.log() - z + 0.5 * math.log(2 * math.pi)
            r = z.reciprocal()
            r2 = r * r
            s = s + r * (1 / 12 + r2 * (-1 / 360 + r2 * (1 / 1260 - r2 / 1680)))
            prod = y
            for k in range(1, 8):
                prod = prod * (y + k)
            return s - prod.log()

        def f(x):
            from .functional import where

            neg = x.lt(0.5)
            y = where(neg, 1 - x, x)  # reflection: lgamma(x) = log(pi / |sin(pi x)|) - lgamma(1 - x)
            g = pos(y)
            # sin(pi x) with x reduced to [-1, 1] first: its period keeps large |x| accurate
            refl = math.log(math.pi) - (x.remainder(2) * math.pi).sin().abs().log() - g
            pole = x.le(0) & x.eq(x.floor())
            return where(pole, float("inf"), where(neg, refl, g))
        return self._in_f32(f)

    def digamma(self):
        def pos(y):  # y > 0: the asymptotic series at y + 8, minus 1/(y + k) for the shift
            z = y + 8
            r = z.reciprocal()
            r2 = r * r
            s = z.log() - 0.5 * r - r2 * (1 / 12 - r2 * (1 / 120 - r2 * (1 / 252 - r2 / 240)))
            for k in range(8):
                s = s - (y + k).reciprocal()
            return s

        def f(x):
            from .functional import where

            neg = x.lt(0.5)
            y = where(neg, 1 - x, x)  # reflection: psi(x) = psi(1 - x) - pi / tan(pi x)
            g = pos(y)
            t = x.remainder(1) * math.pi  # tan has period pi
            refl = g - math.pi * t.cos() / t.sin()
            out = where(neg, refl, g)
            out = where(x.eq(0), float("-inf"), out)
            return where(x.lt(0) & x.eq(x.floor()), float("nan"), out)
        return self._in_f32(f)

    def polygamma(self, n: int):
        """polygamma(n, x); for n >= 1 the series at x + 24 and the recurrence: accurate for x > -16."""
        if n == 0:
            return self.digamma()
        if n < 0:
            raise ValueError(f"polygamma: n must be non-negative, got {n}")

        def f(x):
            k0 = 24
            z = x + k0
            r = z.reciprocal()
            fact = math.factorial
            # (n-1)!/z^n + n!/(2 z^(n+1)) + sum_k B_2k (2k+n-1)! / ((2k)! z^(2k+n))
            s = fact(n - 1) * r.pow(n) + fact(n) * 0.5 * r.pow(n + 1)
            for k, b in ((1, 1 / 6), (2, -1 / 30), (3, 1 / 42), (4, -1 / 30), (5, 5 / 66)):
                s = s + b * fact(2 * k + n - 1) / fact(2 * k) * r.pow(2 * k + n)
            for k in range(k0):
                s = s + fact(n) * (x + k).reciprocal().pow(n + 1)
            return s * (1 if n % 2 else -1)
        return self._in_f32(f)

    def mvlgamma(self, p: int):
        x = self._float()
        out = x.lgamma()
        for j in range(1, p):
            out = out + (x - j / 2).lgamma()
        return out + p * (p - 1) / 4 * math.log(math.pi)

    def i0(self):
        def f(x):
            from .functional import where

            a = x.abs()
            t = (a / 3.75).square()  # A&S 9.8.1 below 3.75, 9.8.2 above
            small = 1 + t * (3.5156229 + t * (3.0899424 + t * (1.2067492 + t * (0.2659732 + t * (
                0.0360768 + t * 0.0045813)))))
            u = 3.75 / a.maximum(3.75)
            big = 0.39894228 + u * (0.01328592 + u * (0.00225319 + u * (-0.00157565 + u * (0.00916281 + u * (
                -0.02057706 + u * (0.02635537 + u * (-0.01647633 + u * 0.00392377)))))))
            big = big * (a.maximum(3.75).exp() * a.maximum(3.75).rsqrt())
            return where(a.lt(3.75), small, big)
        return self._in_f32(f)

    def gcd(self, other):
        from .functional import where

        a, b = self._operands(other, "gcd")
        if a.dtype.is_float or a.dtype is dt.bool_:
            raise TypeError(f"gcd: needs integer tensors, got {a.dtype.name}")
        a, b = a.abs(), b.abs()
        for _ in range(46):  # Euclid's steps: consecutive Fibonacci numbers below 2^31 take 45
            zero = b.eq(0)
            r = a.fmod(where(zero, 1, b))
            a, b = where(zero, a, b), where(zero, 0, r)
        return a

    def lcm(self, other):
        from .functional import where

        a, b = self._operands(other, "lcm")
        g = a.gcd(b)
        return where(g.eq(0), 0, (a // where(g.eq(0), 1, g) * b).abs())

    def ldexp(self, other):
        """self * 2^other."""
        x = self._float()
        if not _is_tensor(other):
            return x * 2.0 ** other
        t = dt.result_type(x.dtype, other.dtype) if other.dtype.is_float else x.dtype
        return x.to(t) * other.float().exp2().to(t)

    def isin(self, test_elements, *, assume_unique: bool = False, invert: bool = False):
        if _is_tensor(test_elements):
            t = test_elements.reshape(-1)
            hit = self.unsqueeze(-1).eq(t).any(-1)
        else:
            hit = self.eq(test_elements)
        return hit.logical_not() if invert else hit

    def put(self, index, source, accumulate: bool = False):
        n = _scalar(self.graph, self.numel(), dt.int32)
        i = index.to(dt.int32).reshape(-1)
        i = i + i.lt(0).to(dt.int32) * n
        flat, src = self.reshape(-1), source.to(self.dtype).reshape(-1)
        out = flat.index_add(0, i, src) if accumulate else flat.index_copy(0, i, src)
        return out.reshape(self.layout.shape)

    def histc(self, bins: int = 100, min: float = 0, max: float = 0):
        """Counts in `bins` equal bins over [min, max] (the data's range when both are 0); values outside are
        left out, the top edge falls in the last bin."""
        x = self._float().reshape(-1)
        if min == max:
            lo, hi = x.amin(), x.amax()
            same = hi.eq(lo).to(x.dtype)
            lo, hi = lo - same, hi + same
        else:
            lo, hi = min, max
        pos = ((x - lo) * bins / (hi - lo)).floor().to(dt.int32).clamp(0, bins - 1)
        inside = x.ge(lo) & x.le(hi)
        idx = _arange(self.graph, bins)
        return (pos.unsqueeze(-1).eq(idx) & inside.unsqueeze(-1)).to(x.dtype).sum(0)

    def _quantile(self, q, dim, keepdim: bool, interpolation: str, ignore_nan: bool, op: str) -> "Tensor":
        from .functional import where

        if interpolation not in ("linear", "lower", "higher", "midpoint", "nearest"):
            raise ValueError(f"{op}: interpolation must be linear, lower, higher, midpoint or nearest, got "
                             f"{interpolation!r}")
        x = self._float()
        if dim is None:
            x, ax = x.reshape(-1), 0
        else:
            ax = self._axis(dim)
            if not x.ndim:
                x = x.reshape(1)
        s = x.movedim(ax, -1).sort(-1)[0]  # NaN sorts last
        nan = s.isnan().to(dt.int32)
        n = _scalar(self.graph, s.layout.shape[-1], x.dtype)
        cnt = n - nan.sum(-1, keepdim=True).to(x.dtype) if ignore_nan else n.expand_to(
            list(s.layout.shape[:-1]) + [_core.Expr(1)])
        scalar_q = not _is_tensor(q)
        qt = (self.graph.constant(float(q), x.dtype) if scalar_q else q.to(x.dtype)).reshape(-1)
        k = qt.layout.shape[0]
        lead = [k] + list(s.layout.shape)
        qb = qt.reshape([k] + [1] * s.ndim)
        pos = qb * (cnt - 1).maximum(0)  # (k, ..., 1)
        lo, hi = pos.floor(), pos.ceil()
        if interpolation == "nearest":
            lo = hi = pos.round()
        se = s.unsqueeze(0).expand_to(lead)
        vlo = se.gather(-1, lo.to(dt.int32).expand_to(lead[:-1] + [_core.Expr(1)]))
        vhi = se.gather(-1, hi.to(dt.int32).expand_to(lead[:-1] + [_core.Expr(1)]))
        if interpolation in ("lower", "nearest"):
            out = vlo
        elif interpolation == "higher":
            out = vhi
        elif interpolation == "midpoint":
            out = (vlo + vhi) * 0.5
        else:
            out = vlo + (vhi - vlo) * (pos - lo)
        bad = cnt.eq(0) if ignore_nan else nan.amax(-1, keepdim=True).bool()  # all NaN / any NaN: NaN
        out = where(bad.unsqueeze(0), float("nan"), out).squeeze(-1)  # (k, ...)
        if keepdim:
            if dim is None:
                out = out.reshape([k] + [1] * self.ndim)
            elif self.ndim:
                out = out.unsqueeze(ax + 1)
        return out.squeeze(0) if scalar_q else out

    def quantile(self, q, dim=None, keepdim: bool = False, *, interpolation: str = "linear"):
        return self._quantile(q, dim, keepdim, interpolation, False, "quantile")

    def nanquantile(self, q, dim=None, keepdim: bool = False, *, interpolation: str = "linear"):
        return self._quantile(q, dim, keepdim, interpolation, True, "nanquantile")

    def nanmedian(self, dim=None, keepdim: bool = False):
        """The lower median of the values that are not NaN (NaN where all are); with dim, (values, indices)."""
        from .functional import where

        if dim is None:
            return self.reshape(-1).nanmedian(0)[0].reshape([1] * self.ndim if keepdim else [])
        ax = self._axis(dim)
        if not self.ndim:
            return MedianResult(self, self._const_like(0, dt.int32))
        x = self.movedim(ax, -1)
        vals, idx = x.sort(-1)
        cnt = (~x.isnan()).to(dt.int32).sum(-1, keepdim=True)
        k = ((cnt - 1).maximum(0) // 2)
        v, i = vals.gather(-1, k), idx.gather(-1, k)
        v = where(cnt.eq(0), float("nan"), v) if x.dtype.is_float else v
        v, i = v.squeeze(-1), i.squeeze(-1)
        if keepdim:
            v, i = v.unsqueeze(ax), i.unsqueeze(ax)
        return MedianResult(v, i)

    def frexp(self):
        """(mantissa in [0.5, 1), int32 exponent) with self = mantissa * 2^exponent; 0, inf and NaN give
        themselves and exponent 0."""
        from .functional import where

        x = self._float().float()
        a = x.abs()
        finite = x.isfinite() & x.ne(0)
        e = where(finite, a, 1.0).log2().floor() + 1
        m = x * (-e).exp2()
        # log2 rounding near a power of two: move one step where the mantissa left [0.5, 1)
        up, down = m.abs().ge(1), m.abs().lt(0.5)
        e = e + up.float() - down.float()
        m = where(up, m * 0.5, where(down, m * 2, m))
        return FrexpResult(where(finite, m, x).to(self._float().dtype), where(finite, e, 0.0).to(dt.int32))

    def index_reduce(self, *a, **k):
        from .indexing import index_reduce

        return index_reduce(self, *a, **k)

    def mode(self, dim: int = -1, keepdim: bool = False):
        """The most frequent value along dim (the smallest among equally frequent ones) and an index of it (the
        last, as torch's CPU kernel gives). O(n^2) comparisons per row."""
        from .functional import where

        ax = self._axis(dim)
        if not self.ndim:
            return ModeResult(self, self._const_like(0, dt.int32))
        x = self.movedim(ax, -1)
        same = x.unsqueeze(-1).eq(x.unsqueeze(-2))  # (..., n, n)
        count = same.to(dt.int32).sum(-1)
        best = count.eq(count.amax(-1, keepdim=True))
        big = float("inf") if x.dtype.is_float else 2 ** 31 - 1
        val = where(best, x, big).amin(-1, keepdim=True)
        n = x.layout.shape[-1]
        idx = (x.eq(val).to(dt.int32) * (_arange(self.graph, n) + 1)).amax(-1, keepdim=True) - 1
        val, idx = val.squeeze(-1), idx.squeeze(-1)
        if keepdim:
            val, idx = val.unsqueeze(ax), idx.unsqueeze(ax)
        return ModeResult(val, idx)

    def histogram(self, bins=100, *, range=None, weight=None, density: bool = False):
        """(hist, bin_edges) over `bins` equal bins of range (the data's min and max by default)."""
        x = self._float().reshape(-1)
        if _is_tensor(bins):  # the edges themselves: the bin is the number of inner edges at or below x
            edges = bins.to(x.dtype).reshape(-1)
            k = edges.layout.shape[0] - 1
            pos = x.unsqueeze(-1).ge(edges.narrow(0, 1, k - 1)).to(dt.int32).sum(-1)
            inside = (x.ge(edges.narrow(0, 0, 1).reshape([])) & x.le(edges.narrow(0, k, 1).reshape([])))
            w = inside.to(x.dtype) if weight is None else inside.to(x.dtype) * weight.to(x.dtype).reshape(-1)
            hist = (pos.unsqueeze(-1).eq(_arange(self.graph, k)).to(x.dtype) * w.unsqueeze(-1)).sum(0)
            if density:
                hist = hist / (hist.sum() * edges.diff())
            return HistogramResult(hist, edges)
        if range is None:
            lo, hi = x.amin(), x.amax()
            same = hi.eq(lo).to(x.dtype)
            lo, hi = lo - 0.5 * same, hi + 0.5 * same  # torch widens an empty range by 1/2 each side
        else:
            lo, hi = (self.graph.constant(float(v), x.dtype) for v in range)
        i = _arange(self.graph, bins + 1).to(x.dtype)
        edges = lo + (hi - lo) * (i / bins)
        pos = ((x - lo) * bins / (hi - lo)).floor().to(dt.int32).clamp(0, bins - 1)
        inside = (x.ge(lo) & x.le(hi)).to(x.dtype)
        w = inside if weight is None else inside * weight.to(x.dtype).reshape(-1)
        hist = (pos.unsqueeze(-1).eq(_arange(self.graph, bins)).to(x.dtype) * w.unsqueeze(-1)).sum(0)
        if density:
            hist = hist / (hist.sum() * ((hi - lo) / bins))
        return HistogramResult(hist, edges)

    def gradient(self, *, spacing=None, dim=None, edge_order: int = 1):
        """torch.gradient: spacing a number, one per dim, or 1-D coordinate tensors per dim; central differences
        inside, one-sided ones of order edge_order at the ends."""
        dims = list(range(self.ndim)) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
        if spacing is None:
            hs = [1.0] * len(dims)
        elif isinstance(spacing, (int, float)):
            hs = [float(spacing)] * len(dims)
        else:
            hs = list(spacing)
            if len(hs) != len(dims):
                hs = hs[:1] * len(dims)
            hs = [h if _is_tensor(h) else float(h) for h in hs]
        from .functional import cat

        x = self._float()
        out = []
        for d, h in zip(dims, hs):
            ax = self._axis(d)
            n = x.layout.shape[ax]
            if not n.is_const() or int(n) < edge_order + 1:
                raise ValueError(f"gradient: dim {d} of shape {_fmt(self.shape)} needs at least {edge_order + 1} "
                                 "elements")
            n = int(n)

            def at(i, k=1):
                return x.narrow(ax, i, k)
            if _is_tensor(h):  # coordinates along the dim: the second-order formulas for uneven steps
                c = h.to(x.dtype).reshape([n] + [1] * (x.ndim - 1 - ax))

                def xc(i, k=1):
                    return c.narrow(0, i, k)
                hl, hr = xc(1, n - 2) - xc(0, n - 2), xc(2, n - 2) - xc(1, n - 2)
                mid = (-hr / (hl * (hl + hr))) * at(0, n - 2) + ((hr - hl) / (hl * hr)) * at(1, n - 2) + \
                    (hl / (hr * (hl + hr))) * at(2, n - 2)
                if edge_order == 1:
                    first = (at(1) - at(0)) / (xc(1) - xc(0))
                    last = (at(n - 1) - at(n - 2)) / (xc(n - 1) - xc(n - 2))
                else:
                    d1, d2 = xc(1) - xc(0), xc(2) - xc(1)
                    first = -(2 * d1 + d2) / (d1 * (d1 + d2)) * at(0) + (d1 + d2) / (d1 * d2) * at(1) - \
                        d1 / (d2 * (d1 + d2)) * at(2)
                    d1, d2 = xc(n - 2) - xc(n - 3), xc(n - 1) - xc(n - 2)
                    last = d2 / (d1 * (d1 + d2)) * at(n - 3) - (d1 + d2) / (d1 * d2) * at(n - 2) + \
                        (2 * d2 + d1) / (d2 * (d1 + d2)) * at(n - 1)
                out.append(cat([first, mid, last], ax) if n > 2 else cat([first, last], ax))
                continue
            mid = (at(2, n - 2) - at(0, n - 2)) * (0.5 / h)
            if edge_order == 1:
                first, last = (at(1) - at(0)) / h, (at(n - 1) - at(n - 2)) / h
            else:
                first = (-1.5 * at(0) + 2 * at(1) - 0.5 * at(2)) / h
                last = (0.5 * at(n - 3) - 2 * at(n - 2) + 1.5 * at(n - 1)) / h
            out.append(cat([first, mid, last], ax) if n > 2 else cat([first, last], ax))
        return tuple(out)

    # ---- indexing, sorting, scatter (indexing.py) ------------------------------------------------------------------
    def topk(self, *a, **k):
        from .indexing import topk

        return topk(self, *a, **k)

    def sort(self, *a, **k):
        from .indexing import sort

        return sort(self, *a, **k)

    def argsort(self, *a, **k):
        from .indexing import argsort

        return argsort(self, *a, **k)

    def msort(self):
        from .indexing import msort

        return msort(self)

    def kthvalue(self, *a, **k):
        from .indexing import kthvalue

        return kthvalue(self, *a, **k)

    def median(self, *a, **k):
        from .indexing import median

        return median(self, *a, **k)

    def scatter(self, *a, **k):
        from .indexing import scatter

        return scatter(self, *a, **k)

    def scatter_add(self, *a, **k):
        from .indexing import scatter_add

        return scatter_add(self, *a, **k)

    def scatter_reduce(self, *a, **k):
        from .indexing import scatter_reduce

        return scatter_reduce(self, *a, **k)

    def index_add(self, *a, **k):
        from .indexing import index_add

        return index_add(self, *a, **k)

    def index_put(self, *a, **k):
        from .indexing import index_put

        return index_put(self, *a, **k)

    def index_fill(self, *a, **k):
        from .indexing import index_fill

        return index_fill(self, *a, **k)

    def masked_scatter(self, *a, **k):
        from .indexing import masked_scatter

        return masked_scatter(self, *a, **k)

    def take_along_dim(self, *a, **k):
        from .indexing import take_along_dim

        return take_along_dim(self, *a, **k)


def broadcast_shapes(a, b, op: str):
    """NumPy broadcasting over dims that may be symbolic."""
    n = max(len(a), len(b))
    pa = [_core.Expr(1)] * (n - len(a)) + list(a)
    pb = [_core.Expr(1)] * (n - len(b)) + list(b)
    out = []
    for x, y in zip(pa, pb):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ValueError(f"{op}: shapes {_fmt(a)} and {_fmt(b)} cannot be broadcast together")
    return out


def _scalar(graph, value, dtype: DType) -> Tensor:
    """A scalar tensor from an int or a symbolic Expr (via Iota, so dims bound at run time flow in)."""
    e = _core.to_expr(value)
    if e.is_const():
        return graph.constant(int(e), dtype)
    t = graph._wrap(graph._g.iota(e, 1)).reshape([])
    return t.to(dtype)


def _arange(graph, n) -> Tensor:
    return graph._wrap(graph._g.iota(_core.Expr.var("z"), n))


def _arange_along(x: Tensor, ax: int) -> Tensor:
    """0..n-1 along dim `ax` of x, broadcast to x's shape (int32)."""
    r = _arange(x.graph, x.layout.shape[ax])
    for _ in range(x.ndim - 1 - ax):
        r = r.unsqueeze(-1)
    return r.expand_to(x.layout.shape)


# Rows at least this long reduce in two levels (Tensor._arg_chunked): one block per row would leave the GPU's other
# multiprocessors idle over a vocabulary of logits.
_ARG_SPLIT = 8192


def _arg_chunk(n) -> int:
    """The chunk length for an argmax over n elements: the largest divisor of n in [128, 1024] when n is a known
    length of at least _ARG_SPLIT, else 0 (one level)."""
    if not n.is_const() or int(n) < _ARG_SPLIT:
        return 0
    n = int(n)
    return next((c for c in range(1024, 127, -1) if n % c == 0), 0)


def _clamp_index(i, n, default):
    """A slice bound in [0, n]; with a symbolic n, bounds are trusted to be in range (no min/max to carry)."""
    if i is None:
        return _core.to_expr(default)
    j = _core.to_expr(i)
    if j.is_const():
        v = int(j)
        if not n.is_const():
            return n + v if v < 0 else j
        return _core.Expr(max(int(n) + v, 0) if v < 0 else min(v, int(n)))
    return j


def _finfo_max(dtype: DType) -> float:
    return {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}.get(dtype.name, 3.4028234663852886e38)


def _atan_unit(r: Tensor) -> Tensor:
    """atan(r) for r in [0, 1] (float32). Above tan(pi/8), atan(r) = pi/4 + atan((r - 1) / (r + 1)) brings the
    argument into [-tan(pi/8), tan(pi/8)], where a short odd polynomial is accurate to float32."""
    hi = r.gt(TAN_PI_8).float()
    s = r + hi * ((r - 1) / (r + 1) - r)
    z = s * s
    p = ATAN_POLY[-1]
    for c in reversed(ATAN_POLY[:-1]):
        p = p * z + c
    return s + s * z * p + hi * (math.pi / 4)
