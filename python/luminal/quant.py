"""Block-quantised weights (GGUF Q8_0, Q4_0, Q4_1) kept packed in memory and unpacked inside the graph."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import dtypes as dt

BLOCK = 32
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}


@dataclass
class QuantizedWeight:
    """Raw rows of a quantised (rows, cols) matrix: `raw` is uint8 (rows, cols / 32 * block bytes)."""
    raw: np.ndarray
    qtype: str
    shape: tuple

    def __post_init__(self):
        if self.qtype not in BLOCK_BYTES:
            raise ValueError(f"unsupported quantisation type {self.qtype!r} (supported: {', '.join(BLOCK_BYTES)})")
        rows, cols = self.shape
        want = (rows, cols // BLOCK * BLOCK_BYTES[self.qtype])
        if cols % BLOCK or self.raw.dtype != np.uint8 or self.raw.shape != want:
            raise ValueError(f"{self.qtype} weight of shape {self.shape} needs uint8 raw rows of shape {want}, "
                             f"got {self.raw.dtype} {self.raw.shape}")


def dequantize(graph, w: QuantizedWeight, name: str = "qweight"):
    """A float32 (rows, cols) tensor computed from `w`'s packed rows, which become a uint8 graph input."""
    raw = graph.tensor(w.raw.shape, dt.uint8, name=name).set(np.ascontiguousarray(w.raw))
    nid = graph._g.dequant(w.qtype, raw._edge(), list(w.shape))
    return graph._wrap(nid)
