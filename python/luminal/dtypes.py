"""Element types. Names match PyTorch's; bfloat16 travels through numpy as float32 (numpy has no bfloat16)."""
from __future__ import annotations

import numpy as np


class DType:
    __slots__ = ("name", "np", "is_float", "itemsize")

    def __init__(self, name: str, np_dtype, is_float: bool, itemsize: int):
        self.name, self.np, self.is_float, self.itemsize = name, np.dtype(np_dtype), is_float, itemsize

    def __repr__(self):
        return f"luminal.{self.name}"

    def __str__(self):
        return self.name

    def __reduce__(self):
        return (dtype, (self.name,))


float32 = DType("float32", np.float32, True, 4)
float16 = DType("float16", np.float16, True, 2)
bfloat16 = DType("bfloat16", np.float32, True, 2)  # numpy side: float32 values, rounded on the way in
int32 = DType("int32", np.int32, False, 4)
uint8 = DType("uint8", np.uint8, False, 1)
bool_ = DType("bool", np.bool_, False, 1)
ALL = {d.name: d for d in (float32, float16, bfloat16, int32, uint8, bool_)}


def dtype(x) -> DType:
    """Accepts a luminal dtype, its name, a numpy dtype or a torch dtype."""
    if isinstance(x, DType):
        return x
    name = str(x).replace("torch.", "")
    if name in ALL:
        return ALL[name]
    raise TypeError(f"unknown dtype {x!r} (expected one of {', '.join(ALL)})")


def result_type(a: DType, b: DType) -> DType:
    """PyTorch's promotion for the types we have."""
    if a is b:
        return a
    if a.is_float and b.is_float:
        return float32  # f16 with bf16, or either with f32
    if a.is_float or b.is_float:
        return a if a.is_float else b
    order = [bool_, uint8, int32]
    return max(a, b, key=order.index)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even."""
    u = np.require(x, np.float32, "C").view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)
