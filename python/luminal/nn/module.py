"""Module: named parameters (graph inputs) whose names match Hugging Face checkpoints, loaded from a dict."""
from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from ..graph import Graph, default_graph
from ..quant import QuantizedWeight, dequantize
from ..tensor import Tensor


class Module:
    """Holds parameters (input tensors of a graph) and sub-modules; `forward` records ops."""

    def __init__(self, graph: Graph | None = None):
        self.graph = graph or default_graph()

    def param(self, *shape, dtype=dt.float32) -> Tensor:
        return self.graph.tensor(shape, dtype, name="param")

    def named_parameters(self, prefix: str = ""):
        for name, v in vars(self).items():
            if name == "graph" or v is None:
                continue
            full = f"{prefix}{name}"
            if isinstance(v, Tensor):
                yield full, v
            elif isinstance(v, Module):
                yield from v.named_parameters(full + ".")
            elif isinstance(v, (list, tuple)):
                for i, m in enumerate(v):
                    if isinstance(m, Module):
                        yield from m.named_parameters(f"{full}.{i}.")

    def state_dict_shapes(self) -> dict:
        return {k: t.shape for k, t in self.named_parameters()}

    def load_state_dict(self, weights: dict, strict: bool = True, source: str = "weights"):
        """Gives every parameter its data; names and shapes must match (the error names the tensor and source)."""
        params = dict(self.named_parameters())
        missing = [k for k in params if k not in weights]
        unexpected = [k for k in weights if k not in params]
        if strict and (missing or unexpected):
            raise ValueError(f"{source}: state dict does not match the model: missing {missing[:5]}"
                             f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
                             f"{'...' if len(unexpected) > 5 else ''}")
        for name, t in params.items():
            if name not in weights:
                continue
            arr = weights[name]
            if isinstance(arr, QuantizedWeight):
                if tuple(arr.shape) != tuple(t.shape):
                    raise ValueError(f"{source}: tensor '{name}' has shape {tuple(arr.shape)}, "
                                     f"the model expects {tuple(t.shape)} (does the config match the weights?)")
                # The parameter becomes the dequantisation of packed rows; the weights stay quantised.
                *path, attr = name.split(".")
                owner = self
                for part in path:
                    owner = owner[int(part)] if isinstance(owner, (list, tuple)) else getattr(owner, part)
                setattr(owner, attr, dequantize(self.graph, arr, name))
                continue
            if tuple(np.shape(arr)) != tuple(t.shape):
                raise ValueError(f"{source}: tensor '{name}' has shape {tuple(np.shape(arr))}, "
                                 f"the model expects {tuple(t.shape)} (does the config match the weights?)")
            t.set(arr)
        return self

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


class Linear(Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False, graph=None, dtype=dt.float32):
        super().__init__(graph)
        self.weight = self.param(out_features, in_features, dtype=dtype)
        self.bias = self.param(out_features, dtype=dtype) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return x.linear(self.weight, self.bias)


class Embedding(Module):
    def __init__(self, num_embeddings: int, dim: int, graph=None, dtype=dt.float32):
        super().__init__(graph)
        self.weight = self.param(num_embeddings, dim, dtype=dtype)

    def forward(self, ids: Tensor) -> Tensor:
        from ..functional import embedding

        return embedding(ids, self.weight)


class RMSNorm(Module):
    def __init__(self, dim: int, eps: float = 1e-6, graph=None):
        super().__init__(graph)
        self.weight = self.param(dim)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return x.rms_norm(None, self.weight, self.eps)


class LayerNorm(Module):
    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, graph=None):
        super().__init__(graph)
        self.weight = self.param(dim)
        self.bias = self.param(dim) if bias else None
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return x.layer_norm(None, self.weight, self.bias, self.eps)
