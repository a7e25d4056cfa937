"""luminal.torch: PyTorch integration. `torch.compile(model, backend="luminal")` (registered through the
`torch_dynamo_backends` entry point) is `luminal.torch.backend`; `explain(model, *inputs)` lists the aten ops that
run in torch and why. The implementation is in torch_backend.py."""
from ._core import UnsupportedOpError
from .torch_backend import ATEN, COUNTERS, Explanation, Fallback, LuminalGraph, backend, explain

__all__ = ["ATEN", "COUNTERS", "Explanation", "Fallback", "LuminalGraph", "UnsupportedOpError", "backend",
           "explain"]


def _register():
    """Where luminal is imported without being installed (no entry point), importing this module registers it."""
    from torch._dynamo.backends.registry import lookup_backend, register_backend

    try:
        lookup_backend("luminal")
    except Exception:
        register_backend(compiler_fn=backend, name="luminal")


_register()
