"""The Python Graph: records tensors and ops into the C++ graph, holds input data, runs compilers and executes."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Sequence

import numpy as np

from . import _core
from . import dtypes as dt

if TYPE_CHECKING:
    from .tensor import Tensor

_current = threading.local()


def default_graph() -> "Graph":
    g = getattr(_current, "graph", None)
    if g is None:
        raise RuntimeError("no graph to build in: create a luminal.Graph() or pass graph=")
    return g


def _dim(d):
    """A dimension as the core's Expr (from an int, a str like 's+3', or an Expr)."""
    if isinstance(d, (bool, float)):
        raise TypeError(f"a dimension must be an int, a str or an Expr, got {d!r}")
    return _core.to_expr(d)


class Graph:
    """A static graph of primitive ops. Building it computes nothing; `execute()` runs it."""

    def __init__(self):
        self._g = _core.Graph()
        self._data: dict[int, np.ndarray] = {}  # Input node id -> data in storage layout
        self._changed: set[int] = set()  # inputs set since the last execute (a runtime keeping data sends only these)
        self._dims: dict[str, int] = {}
        self._fresh: set[str] = set()  # dims bound since the last execute: binding one differently is a conflict
        self._results: dict[int, np.ndarray] = {}
        self._runtime = None  # set by a backend compiler; None runs the native executor
        self._executor = None  # made on the first execute; follows later edits of the graph itself
        self._donated: set[int] = set()  # inputs whose arrays the next execute may overwrite
        self._on_device: set[int] = set()  # inputs holding a DeviceArray
        self.compilers: list = []
        self._dot_before_compile = None
        _current.graph = self

    def __enter__(self):
        self._prev = getattr(_current, "graph", None)
        _current.graph = self
        return self

    def __exit__(self, *exc):
        _current.graph = self._prev

    # ---- building -------------------------------------------------------------------------------------------
    def tensor(self, shape: Sequence, dtype=dt.float32, name: str | None = None) -> "Tensor":
        """An input tensor; its data is given later with `.set(array)`."""
        if isinstance(shape, (int, str)):
            shape = (shape,)
        dtype = dt.dtype(dtype)
        nid = self._g.input([_dim(d) for d in shape], dtype.name, name or f"input{len(self._g)}")
        return self._wrap(nid)

    def constant(self, value, dtype=dt.float32) -> "Tensor":
        """A scalar (shape ()) constant; broadcast it with expand, which costs nothing."""
        return self._wrap(self._g.constant(float(value), dt.dtype(dtype).name))

    def named(self, value, dtype=dt.float32, name: str | None = None) -> "Tensor":
        """An input of `value`'s shape, given its data now (weights, constants arrays)."""
        return self.tensor(np.shape(value), dtype, name).set(value)

    def copy(self) -> "Graph":
        """An independent copy of the graph with its input data and dims, not its compilers, backend or donations (a
        run of the copy never overwrites these arrays). Node ids are the same, so this graph's Tensors name the same
        nodes in the copy (`luminal.bisect` runs its trials on copies)."""
        prev = getattr(_current, "graph", None)
        new = Graph()
        _current.graph = prev  # copying does not change the graph being built
        new._g = self._g.copy()
        new._data, new._dims = dict(self._data), dict(self._dims)
        new._on_device = set(self._on_device)
        new._changed = set(self._data)
        return new

    def set_dim(self, name: str, value: int):
        value = int(value)
        if value < 0:
            raise ValueError(f"dimension '{name}' cannot be negative ({value})")
        self._dims[name] = value
        self._fresh.add(name)
        return self

    @property
    def dims(self) -> dict:
        return dict(self._dims)

    def _wrap(self, nid: int) -> "Tensor":
        from .tensor import Tensor

        node = self._g.node(nid)
        return Tensor(self, nid, _core.View.contiguous(node.shape), dt.dtype(node.dtype))

    # ---- compiling and running --------------------------------------------------------------------------------
    def compile(self, *compilers):
        """Applies compilers in order; each is anything with `compile(graph, remap)`."""
        from .compiler import Remap
        from .display import snapshot

        if self._dot_before_compile is None and len(self._g) < 2000:
            self._dot_before_compile = snapshot(self)
        remap = Remap(self)
        for c in compilers:
            for cc in c if isinstance(c, (list, tuple)) else [c]:
                cc.compile(self, remap)
                self.compilers.append(cc)
        return self

    @property
    def queues_runs(self) -> bool:
        """Whether `execute(wait=False)` returns before the run ends (a GPU backend); otherwise it runs it."""
        return self._runtime is not None

    def execute(self, wait: bool = True):
        """Runs every output with the data and dims bound so far.

        `wait=False` lets a backend that runs on a device (CUDA) return once the run is queued: reading a result
        waits for it (and raises the run's device-side error, such as an index out of range), and the host can
        prepare the next run meanwhile. The CPU backends always finish the run first."""
        self._results = {}
        if self._runtime is not None:
            out = self._runtime.run(self._data, self._dims, self._changed, wait)
        else:
            self._changed.clear()
            if self._executor is None:
                self._executor = _core.Executor(self._g)
            data = self._data
            if self._on_device:  # data left on a GPU (a DeviceArray) comes to the host for the CPU executor
                data = {k: v if isinstance(v, np.ndarray) else v.numpy() for k, v in data.items()}
            out = self._executor.run(self._dims, data, self._donated)
        self._results = out
        self._fresh = set()
        return self

    # ---- looking at it ------------------------------------------------------------------------------------------
    def nodes(self) -> list[int]:
        """Ids of live nodes, producers first."""
        return list(self._g.topo_order())

    def node(self, nid: int):
        return self._g.node(nid)

    def __len__(self):
        return self._g.alive_count()

    def stats(self) -> dict[str, int]:
        """Live node count per op."""
        counts: dict[str, int] = {}
        for i in self._g.topo_order():
            n = self._g.node(i)
            key = n.name if n.op == "Custom" else n.op
            counts[key] = counts.get(key, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))

    def to_dot(self, title: str | None = None) -> str:
        from .display import to_dot

        return to_dot(self, title)

    def display(self, path: str | None = None, fmt: str = "svg", compare: bool = True):
        """Renders the graph with Graphviz (beside the graph before compilation, if compiled); returns the path."""
        from .display import display

        return display(self, path, fmt, compare)

    # ---- graph-level factories (PyTorch names) ------------------------------------------------------------------
    def arange(self, start, end=None, step=1, dtype=None):
        from .functional import arange

        return arange(start, end, step, dtype=dtype, graph=self)

    def full(self, shape, value, dtype=dt.float32):
        from .functional import full

        return full(shape, value, dtype=dtype, graph=self)

    def zeros(self, shape, dtype=dt.float32):
        return self.full(shape, 0, dtype)

    def ones(self, shape, dtype=dt.float32):
        return self.full(shape, 1, dtype)

    # ---- data ---------------------------------------------------------------------------------------------------
    def _set_input(self, nid: int, array) -> None:
        node = self._g.node(nid)
        if node.op != "Input":
            raise ValueError("set() works on input tensors (made with Graph.tensor), not on computed ones")
        want = dt.dtype(node.dtype)
        if isinstance(array, _core.DeviceArray):  # a GPU result fed back (e.g. a KV cache): kept on the device
            have = dt.dtype(array.dtype)
            if have.is_float != want.is_float or array.ndim != len(node.shape):
                raise TypeError(f"input '{node.name}' is {want.name} of rank {len(node.shape)}; got a device array "
                                f"of {have.name} with shape {array.shape}")
            self._bind(node.shape, array.shape, node.name)
            self._data[nid] = array
            self._changed.add(nid)
            self._on_device.add(nid)
            return
        if hasattr(array, "detach"):  # a torch tensor
            array = array.detach().cpu()
            array = (array.float() if str(array.dtype) == "torch.bfloat16" else array).numpy()
        arr = np.asarray(array)
        raw_bf16 = want is dt.bfloat16 and arr.dtype == np.uint16  # raw bits, as result() gives them: kept as is
        kinds = "f" if want.is_float else "b" if want is dt.bool_ else "iu"
        if arr.dtype.kind not in kinds and not raw_bf16:
            raise TypeError(f"input '{node.name}' is {want.name}; got an array of {arr.dtype}")
        shape = node.shape
        if arr.ndim != len(shape):
            raise ValueError(f"input '{node.name}' expects shape {_fmt(shape)}, got an array of shape {arr.shape}")
        self._bind(shape, arr.shape, node.name)
        if raw_bf16:
            arr = np.require(arr, requirements="C")
        elif want is dt.bfloat16:
            arr = dt.bf16_bits(arr.astype(np.float32, copy=False))
        else:
            arr = np.require(arr, dtype=want.np, requirements="C")  # keeps 0-d arrays 0-d
        self._data[nid] = arr
        self._changed.add(nid)
        self._on_device.discard(nid)

    def _bind(self, shape, actual, name):
        """Binds the symbolic dims of `shape` from an array's `actual` shape. A dim bound since the last execute
        must agree (a conflict is an error); one bound before it takes the new value."""
        new = {}
        for expr, n in zip(shape, actual):
            if expr.is_const():
                if int(expr) != n:
                    raise ValueError(f"input '{name}' expects shape {_fmt(shape)}, got an array of shape {tuple(actual)}")
                continue
            vs = expr.vars()
            known = {**{k: v for k, v in self._dims.items() if k in self._fresh}, **new}
            unbound = [v for v in vs if v not in known]
            if not unbound:
                if expr.eval(known) != n:
                    raise ValueError(f"input '{name}': dim {expr} = {expr.eval(known)} under {known} (bound since "
                                     f"the last execute), but the array has {n} (shape {tuple(actual)}); to change "
                                     f"a dim before executing, call set_dim() first")
                continue
            if len(unbound) > 1:
                raise ValueError(f"input '{name}': cannot solve dim {expr} for {unbound} from size {n}")
            v = unbound[0]
            # Linear in v: expr = a*v + b.
            b = expr.substitute(v, 0).eval(known)
            a = expr.substitute(v, 1).eval(known) - b
            if a == 0 or (n - b) % a or expr.substitute(v, (n - b) // a).eval(known) != n:
                raise ValueError(f"input '{name}': cannot solve dim {expr} = {n} for '{v}'")
            new[v] = (n - b) // a
        self._dims.update(new)
        self._fresh.update(new)

    def _result(self, out_id: int) -> np.ndarray:
        r = self._raw_result(out_id)
        if not isinstance(r, np.ndarray):  # a DeviceArray: copied to the host once, when first read
            r = self._results[out_id] = r.numpy()
        return r

    def _raw_result(self, out_id: int):
        if out_id not in self._results:
            raise RuntimeError("no result for this tensor: mark it with .output() before compiling, then call execute()")
        return self._results[out_id]


def _fmt(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
