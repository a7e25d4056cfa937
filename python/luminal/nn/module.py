"""Module: named parameters (graph inputs) whose names match PyTorch / Hugging Face state dicts, loaded from a dict
or a .safetensors file."""
from __future__ import annotations

import os

import numpy as np

from .. import dtypes as dt
from ..graph import Graph, default_graph
from ..quant import QuantizedWeight, dequantize
from ..tensor import Tensor


def _fmt_shape(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _as_array(value):
    """A state-dict value as numpy (torch tensors detached and moved to the CPU; bfloat16 through float32)."""
    if isinstance(value, (np.ndarray, QuantizedWeight)):
        return value
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        return value.numpy()
    return np.asarray(value)


class Module:
    """Holds parameters and buffers (input tensors of a graph) and sub-modules; `forward` records ops.

    State names follow torch: an attribute `fc` holding a module with a `weight` gives `fc.weight`; a list (or
    `ModuleList`) attribute `layers` gives `layers.0.weight`. Buffers (`register_buffer`) are state too.
    Keys listed in `_ignored_state` (suffixes) are accepted in a state dict and dropped, as torch drops
    BatchNorm's `num_batches_tracked` or Hugging Face's non-persistent `position_ids`."""

    _ignored_state: tuple[str, ...] = ()

    def __init__(self, graph: Graph | None = None):
        self.graph = graph if graph is not None else default_graph()  # (an empty Graph is falsy: len() 0)
        self._buffer_names: set[str] = set()

    def param(self, *shape, dtype=dt.float32) -> Tensor:
        return self.graph.tensor(shape, dtype, name="param")

    def register_buffer(self, name: str, tensor: Tensor | None) -> Tensor | None:
        """Makes `tensor` (an input of this module's graph) the buffer `name`: state, but not a parameter."""
        if "_buffer_names" not in vars(self):
            self._buffer_names = set()
        self._buffer_names.add(name)
        setattr(self, name, tensor)
        return tensor

    # ---- walking the tree ----------------------------------------------------------------------------------------
    def named_children(self):
        for name, v in vars(self).items():
            if name == "graph":
                continue
            if isinstance(v, Module):
                yield name, v
            elif isinstance(v, (list, tuple)):
                for i, m in enumerate(v):
                    if isinstance(m, Module):
                        yield f"{name}.{i}", m

    def children(self):
        return (m for _, m in self.named_children())

    def named_modules(self, prefix: str = ""):
        yield prefix, self
        for name, m in self.named_children():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self):
        return (m for _, m in self.named_modules())

    def _own_tensors(self, buffers: bool):
        names = vars(self).get("_buffer_names", ())
        for name, v in vars(self).items():
            if isinstance(v, Tensor) and (name in names) == buffers:
                yield name, v

    def named_parameters(self, prefix: str = ""):
        for name, t in self._own_tensors(buffers=False):
            yield prefix + name, t
        for name, m in self.named_children():
            yield from m.named_parameters(f"{prefix}{name}.")

    def named_buffers(self, prefix: str = ""):
        for name, t in self._own_tensors(buffers=True):
            yield prefix + name, t
        for name, m in self.named_children():
            yield from m.named_buffers(f"{prefix}{name}.")

    def parameters(self):
        return (t for _, t in self.named_parameters())

    def buffers(self):
        return (t for _, t in self.named_buffers())

    def _state(self) -> dict:
        return {**dict(self.named_parameters()), **dict(self.named_buffers())}

    def state_dict_shapes(self) -> dict:
        """{state name: shape}: what `load_state_dict` expects."""
        return {k: t.shape for k, t in self._state().items()}

    def _ignored(self) -> tuple[str, ...]:
        out = []
        for prefix, m in self.named_modules():
            out += [f"{prefix}.{s}" if prefix else s for s in type(m)._ignored_state]
        return tuple(out)

    def _owner(self, name: str):
        *path, attr = name.split(".")
        owner = self
        for part in path:
            owner = owner[int(part)] if isinstance(owner, (list, tuple, ModuleList)) else getattr(owner, part)
        return owner, attr

    # ---- loading -------------------------------------------------------------------------------------------------
    def load_state_dict(self, state, strict: bool = True, source: str | None = None):
        """Gives every parameter and buffer its data, from a dict of numpy arrays or torch tensors, or the path of a
        .safetensors file. Every problem is reported in one ValueError: missing keys (unless strict=False),
        unexpected keys (unless strict=False) and shape mismatches (always), each with both shapes."""
        if isinstance(state, (str, os.PathLike)):
            from ..loaders import load_safetensors

            source = source or os.fspath(state)
            state = load_safetensors(state)
        source = source or "state dict"
        params = self._state()
        ignored = self._ignored()
        missing = [k for k in params if k not in state]
        unexpected = [k for k in state if k not in params and not k.endswith(ignored)] if ignored else \
            [k for k in state if k not in params]
        arrays, mismatched = {}, []
        for name, t in params.items():
            if name not in state:
                continue
            arr = _as_array(state[name])
            have = tuple(arr.shape)
            if have != tuple(t.shape):
                mismatched.append(f"{name}: expected {_fmt_shape(t.shape)}, got {_fmt_shape(have)}")
            arrays[name] = arr
        problems = []
        if mismatched:
            problems.append(f"{len(mismatched)} shape mismatch(es): " + "; ".join(mismatched))
        if strict and missing:
            problems.append(f"{len(missing)} missing key(s): " + ", ".join(
                f"{k} {_fmt_shape(params[k].shape)}" for k in missing))
        if strict and unexpected:
            problems.append(f"{len(unexpected)} unexpected key(s): " + ", ".join(
                f"{k} {_fmt_shape(tuple(np.shape(_as_array(state[k]))))}" for k in unexpected))
        if problems:
            raise ValueError(f"{source} does not match {type(self).__name__} (does the config match the "
                             "weights?):\n  " + "\n  ".join(problems))
        for name, arr in arrays.items():
            if isinstance(arr, QuantizedWeight):
                # The parameter becomes the dequantisation of packed rows; the weights stay quantised.
                owner, attr = self._owner(name)
                setattr(owner, attr, dequantize(self.graph, arr, name))
            else:
                params[name].set(arr)
        return self

    # ---- torch's inference conveniences ----------------------------------------------------------------------------
    def eval(self):
        return self

    def train(self, mode: bool = True):
        if mode:
            raise NotImplementedError("luminal modules are for inference: train() is not supported")
        return self

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self):
        kids = [f"  ({n}): " + repr(m).replace("\n", "\n  ") for n, m in self.named_children()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        return head + ("\n" + "\n".join(kids) + "\n)" if kids else ")")


class ModuleList(Module):
    """torch.nn.ModuleList: sub-modules named by their index."""

    def __init__(self, modules=(), graph=None):
        modules = list(modules)
        if graph is None:  # the members' graph (stateless layers such as ReLU have none)
            graph = next((m.graph for m in modules if m.graph is not None), None)
        self.graph = graph
        self._buffer_names = set()
        self._modules = modules

    def named_children(self):
        for i, m in enumerate(self._modules):
            yield str(i), m

    def append(self, module: Module):
        self._modules.append(module)
        return self

    def __getitem__(self, i):
        return ModuleList(self._modules[i], self.graph) if isinstance(i, slice) else self._modules[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)


class Sequential(ModuleList):
    """torch.nn.Sequential: calls its modules in order; state names `0.weight`, `1.bias`, ..."""

    def __init__(self, *modules: Module, graph=None):
        super().__init__(modules, graph)

    def __getitem__(self, i):
        return Sequential(*self._modules[i], graph=self.graph) if isinstance(i, slice) else self._modules[i]

    def forward(self, x):
        for m in self._modules:
            x = m(x)
        return x


class Linear(Module):
    """torch.nn.Linear: weight (out_features, in_features), bias (out_features) unless bias=False."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, graph=None, dtype=dt.float32):
        super().__init__(graph)
        self.in_features, self.out_features = in_features, out_features
        self.weight = self.param(out_features, in_features, dtype=dtype)
        self.bias = self.param(out_features, dtype=dtype) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1:] != (self.in_features,):
            raise ValueError(f"Linear({self.in_features}, {self.out_features}): input of shape {_fmt_shape(x.shape)}"
                             f" does not end in {self.in_features} features")
        return x.linear(self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


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
    """torch.nn.LayerNorm over the trailing `normalized_shape` dims; weight and bias only with elementwise_affine."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 graph=None, dtype=dt.float32):
        super().__init__(graph)
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.weight = self.param(*self.normalized_shape, dtype=dtype) if elementwise_affine else None
        self.bias = self.param(*self.normalized_shape, dtype=dtype) if elementwise_affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        n = len(self.normalized_shape)
        if tuple(x.shape[-n:]) != self.normalized_shape or x.ndim < n:
            raise ValueError(f"LayerNorm{_fmt_shape(self.normalized_shape)}: input of shape {_fmt_shape(x.shape)} "
                             "does not end in the normalized shape")
        return x.layer_norm(self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"
