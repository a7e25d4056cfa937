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
            return sorted({self._axis(d) for d in dim})
        return [self._axis(dim)]

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
        x = self._float() * beta
        return (x.relu() + ((-x.abs()).exp() + 1).log()) * (1 / beta)

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
        w = weight
        if w.ndim != 1:
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
        if self.dtype is not dt.bool_:
            raise TypeError(f"~ needs a bool tensor, got {self.dtype.name}")
        return self.logical_not()

    def __and__(self, o):
        return self.bool()._binary("Mul", o.bool() if _is_tensor(o) else bool(o))

    def __or__(self, o):
        return self.bool()._binary("Add", o.bool() if _is_tensor(o) else bool(o))

    def __xor__(self, o):
        return self.logical_xor(o)

    def logical_and(self, other):
        return self.bool() & (other.bool() if _is_tensor(other) else bool(other))

    def logical_or(self, other):
        return self.bool() | (other.bool() if _is_tensor(other) else bool(other))

    def logical_xor(self, other):
        a, b = self.bool(), (other.bool() if _is_tensor(other) else bool(other))
        return (a | b) & ~(a & b)

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
        corr = (1 if unbiased else 0) if correction is None else correction
        x = self._float()
        d = x - x.mean(dim, keepdim=True)
        return (d * d).sum(dim, keepdim) / _scalar(self.graph, self._count(dim) - corr, x.dtype)

    def std(self, dim=None, unbiased: bool = True, keepdim: bool = False, correction=None):
        return self.var(dim, unbiased, keepdim, correction).sqrt()

    def prod(self, dim=None, keepdim: bool = False):
        x = self._float()
        mag = x.abs().log2().sum(dim, keepdim).exp2()
        negs = x.lt(0).to(dt.int32).sum(dim, keepdim)
        out = mag * (1 - 2 * negs.remainder(2).to(x.dtype))
        return out if self.dtype.is_float else out.round().to(self.dtype)

    def round(self):
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
        n = x.layout.shape[ax]
        m = x.amax(ax, keepdim=True)
        idx = _arange_along(x, ax)  # 0..n-1 along ax, broadcast
        # First index of the max: maximise n - i over the positions that hit it.
        # Equal to the max; if that is NaN (torch's argmax picks a NaN as the max), the NaNs (a comparison with a
        # NaN max is false everywhere, which would make every position a hit).
        hit = (~(x.lt(m) | m.lt(x)) & ~m.isnan()) | x.isnan()
        score = hit.to(dt.int32) * (_scalar(self.graph, n, dt.int32) - idx)
        out = _scalar(self.graph, n, dt.int32) - score.amax(ax, keepdim)
        return out

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

    def cumsum(self, dim: int):
        ax = self._axis(dim)
        x = self.transpose(ax, -1) if ax != self.ndim - 1 else self
        if x.dtype in (dt.bool_, dt.uint8):
            x = x.to(dt.int32)
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
        if index.ndim != 1:
            raise ValueError(f"index_select: index must be 1-D, got shape {_fmt(index.shape)}")
        table = self.transpose(0, ax) if ax else self
        out = self._new(self.graph._g.gather(table._edge(), index.to(dt.int32)._edge()))
        return out.transpose(0, ax) if ax else out

    def index_copy(self, dim: int, index: "Tensor", source: "Tensor") -> "Tensor":
        """torch.index_copy: self with its slices index[i] along `dim` replaced by source's slices i (one Scatter).
        On a donated input (`set(array, donate=True)`) that nothing else reads, it updates the array in place."""
        ax = self._axis(dim)
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

    def layer_norm(self, normalized_shape=None, weight=None, bias=None, eps: float = 1e-5):
        nd = 1 if normalized_shape is None else (1 if isinstance(normalized_shape, int) else len(normalized_shape))
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
        dims = list(range(-nd, 0))
        x = self._float()
        if eps is None:  # torch's default: the dtype's machine epsilon
            eps = float(np.finfo(np.float16 if x.dtype is dt.float16 else np.float32).eps) \
                if x.dtype is not dt.bfloat16 else 2.0 ** -7
        out = x * ((x * x).mean(dims, keepdim=True) + eps).rsqrt()
        return out * weight if weight is not None else out

    def triu(self, diagonal: int = 0):
        from .functional import triu

        return triu(self, diagonal)

    def tril(self, diagonal: int = 0):
        from .functional import tril

        return tril(self, diagonal)

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
