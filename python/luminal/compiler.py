"""Compilers: anything with `compile(graph, remap)` that rewrites the graph. Built-in passes run in the C++ core;
Python compilers use the same pattern engine through `find` / `rewrite` and the pattern builders below.

    class SubtractionCompiler:
        def compile(self, graph, remap):
            pat = op("Add", any_("a"), op("Mul", any_("b"), const(-1)))
            return rewrite(graph, pat, lambda g, m: SUBTRACT(g, m["a"], m["b"]))
"""
from __future__ import annotations

import time

import numpy as np

from . import _core
from . import dtypes as dt


class Remap:
    """Ids users hold follow rewrites: the core records every replacement and `Tensor.id` resolves through it.
    A compiler that rewires by hand calls `replace(old, new)`."""

    def __init__(self, graph):
        self.graph = graph

    def replace(self, old: int, new: int):
        self.graph._g.replace_uses(old, new)

    def __call__(self, nid: int) -> int:
        return self.graph._g.resolve(nid)


# ---- patterns ---------------------------------------------------------------------------------------------------
def op(name: str, *inputs, bind: str = "", dtype=None, single_use: bool = False, commutative: bool = True,
       where=None) -> _core.Pattern:
    """A node of op `name` whose inputs match `inputs` (in either order for Add/Mul unless commutative=False). A name
    that is no primop matches a backend op by its display name ("MatMul", "Fused", a CustomOp's name)."""
    kind = {"op": name} if name in _core.OPS else {"custom": name}
    return _core.Pattern(**kind, name=bind, inputs=list(inputs), dtype=None if dtype is None else dt.dtype(dtype).name,
                         single_use=single_use, commutative=commutative, where=where)


def any_(name: str = "", dtype=None, where=None) -> _core.Pattern:
    """Any node; binds (node, view) under `name`."""
    return _core.Pattern(name=name, dtype=None if dtype is None else dt.dtype(dtype).name, where=where)


def _unpadded(_g, _node, view) -> bool:
    return not view.has_mask()


def const(value=None, name: str = "") -> _core.Pattern:
    """A Constant node (of the given value, if any) read without padding, so every element it yields is its value."""
    return _core.Pattern(op="Constant", name=name, value=None if value is None else float(value), where=_unpadded)


def find(graph, pattern) -> list:
    return _core.find(graph._g, pattern)


# Set by luminal.bisect while it runs a pass: limits how many matches Python rewrites apply and records them.
_rewrite_hook = None


def rewrite(graph, pattern, fn, name: str = "python rule") -> int:
    """One sweep: fn(graph, match) returns a Tensor or node id to replace the match's root, or None. Returns the
    number of rewrites."""
    hook = _rewrite_hook

    def call(_g, m):
        if hook is not None and not hook.allow():
            return None
        r = fn(graph, m)
        r = r.id if hasattr(r, "id") and not isinstance(r, int) else r
        if hook is not None and r is not None and r != m.root:
            hook.record(name, m, r)
        return r

    return _core.rewrite(graph._g, pattern, call, name)


# ---- custom ops ---------------------------------------------------------------------------------------------------
class CustomOp:
    """An op a compiler puts in the graph, with its CPU implementation as a numpy function. Only the CPU backends
    can run it: CudaCompiler raises `luminal.UnsupportedOpError` for it unless `host_fallback=True`.

    `SUBTRACT = CustomOp("Subtract", lambda a, b: a - b)`; then `SUBTRACT(graph, edge_a, edge_b)` adds a node
    whose shape and dtype are the first input's unless given."""

    def __init__(self, name: str, cpu, shape_fn=None, dtype_fn=None):
        self.name, self.cpu, self.shape_fn, self.dtype_fn = name, cpu, shape_fn, dtype_fn

    def __call__(self, graph, *edges, shape=None, dtype=None) -> int:
        first = graph._g.node(edges[0].node)
        shape = shape if shape is not None else (self.shape_fn(*edges) if self.shape_fn else edges[0].view.shape)
        dtype = dt.dtype(dtype or (self.dtype_fn(*edges) if self.dtype_fn else first.dtype))
        return graph._g.custom(self.name, list(edges), list(shape), dtype.name, self._kernel)

    def _kernel(self, *args):
        *arrays, out_dtype = args
        arrays = [dt.bf16_to_f32(a) if a.dtype == np.uint16 else a for a in arrays]
        out = np.asarray(self.cpu(*arrays))
        want = dt.dtype(out_dtype)
        return dt.bf16_bits(out) if want is dt.bfloat16 else np.ascontiguousarray(out, dtype=want.np)


# ---- composition ----------------------------------------------------------------------------------------------------
def _fingerprint(graph):
    g = graph._g
    return len(g), g.alive_count()


class Sequence:
    """Runs compilers in order; returns the total number of changes."""

    def __init__(self, *compilers):
        self.compilers = list(compilers)

    def compile(self, graph, remap):
        return sum(_run(c, graph, remap) for c in self.compilers)


class FixedPoint:
    """Repeats a compiler until it changes nothing (at most `max_iters` times)."""

    def __init__(self, compiler, max_iters: int = 32):
        self.compiler, self.max_iters = compiler, max_iters

    def compile(self, graph, remap):
        total = 0
        for _ in range(self.max_iters):
            n = _run(self.compiler, graph, remap)
            total += n
            if n == 0:
                break
        return total


def _run(c, graph, remap) -> int:
    """A compiler's change count; one that returns None counts as changed when the graph's size moved."""
    before = _fingerprint(graph)
    n = c.compile(graph, remap)
    return int(n) if n is not None else int(_fingerprint(graph) != before)


# ---- GenericCompiler's passes -----------------------------------------------------------------------------------------
class _CorePass:
    fn = None

    def __init__(self):
        self.seconds = 0.0
        self.changes = 0

    def compile(self, graph, remap):
        t = time.perf_counter()
        n = self.run(graph._g)
        self.seconds += time.perf_counter() - t
        self.changes += n
        return n

    def run(self, g) -> int:
        return type(self).fn(g)

    def __repr__(self):
        return type(self).__name__ + "()"


class DeadNodeRemoval(_CorePass):
    """Removes nodes no output (or kept tensor) depends on."""
    fn = staticmethod(_core.remove_dead_nodes)


class CSE(_CorePass):
    """Merges structurally identical nodes (op, attributes, inputs and their views)."""
    fn = staticmethod(_core.eliminate_common_subexpressions)


class ArithmeticIdentities(_CorePass):
    """x+0, x*1, -(-x), recip(recip(x)), exp2(log2(x)), no-op casts and copies."""
    fn = staticmethod(_core.apply_arithmetic_identities)


class ConstantFolding(_CorePass):
    """Evaluates ops on constants (and integer arithmetic on symbolic scalars) at compile time."""
    fn = staticmethod(_core.fold_constants)


class MatMulLowering(_CorePass):
    """SumReduce(last axis) of a Mul -> a native dot-product kernel (matmul/matvec over any broadcast views)."""
    fn = staticmethod(_core.lower_matmuls)


class ContractionLowering(_CorePass):
    """SumReduce(last axis) of a MatMul only it reads -> one Contraction over both axes, repeatedly: a convolution's
    sum over channels and kernel window becomes one GEMM that reads its input's window view in place."""
    fn = staticmethod(_core.lower_contractions)


class MaximumLowering(_CorePass):
    """MaxReduce over a stack of two tensors (Tensor.maximum: relu, clamp, minimum) -> an element-wise Maximum,
    which fuses with its neighbours (run before ElementwiseFusion)."""
    fn = staticmethod(_core.lower_maximum)


class QuantizedLowering(_CorePass):
    """MatMul over Dequant(raw GGUF rows) -> a kernel that unpacks weight rows on the fly; gathers move before
    dequantisation."""
    fn = staticmethod(_core.lower_quantized)


class QuantizedStacking(_CorePass):
    """QMatMuls of one format over the same activations (q/k/v, gate/up) -> one over their stacked weights, read
    back through views: the activations are quantised once, and the threads split one range of rows."""
    fn = staticmethod(_core.stack_qmatmuls)


class ElementwiseFusion(_CorePass):
    """Chains of elementwise primops, and a sum/max over the last axis at their end, -> one fused kernel each.
    With `row_reductions`, a reduction over the row also fuses into the consumers that read it broadcast along the
    row (RMSNorm, softmax, layer norm: one kernel each); a backend turns it on once it can run such programs."""

    def __init__(self, row_reductions: bool = False):
        super().__init__()
        self.row_reductions = row_reductions

    def run(self, g) -> int:
        return _core.fuse_elementwise(g, self.row_reductions)


class AttentionFusion(_CorePass):
    """MatMul(softmax-like row program over MatMul(q, k), v) -> one kernel per row that never writes the scores
    (run after ElementwiseFusion with row reductions)."""
    fn = staticmethod(_core.fuse_attention)


class MatMulInputPrecision(_CorePass):
    """Fused kernels whose results only Linear layers read (MatMuls by a weight) store them in `dtype` when that is a
    16-bit type: the products round them to it anyway, so they are written at half the bytes and read in place. A
    Linear's product that only such 16-bit programs read is stored in `dtype` too (run after AttentionFusion)."""

    def __init__(self, dtype):
        super().__init__()
        self.dtype = dt.dtype(dtype).name

    def run(self, g) -> int:
        return _core.store_matmul_inputs(g, self.dtype)


class CPUCompiler:
    """Lowers to the native CPU kernels (run GenericCompiler first). `threads` sets the worker count."""

    def __init__(self, threads: int | None = None):
        if threads is not None:
            _core.set_num_threads(threads)
        self.passes = [MatMulLowering(), QuantizedLowering(), QuantizedStacking(), ContractionLowering(),
                       MaximumLowering(), ElementwiseFusion(row_reductions=True), AttentionFusion(), DeadNodeRemoval()]

    def compile(self, graph, remap):
        return Sequence(*self.passes).compile(graph, remap)


class GenericCompiler:
    """The hardware-agnostic passes, to a fixed point. Runs first. `passes` keep their time and change counts."""

    def __init__(self):
        self.passes = [ConstantFolding(), ArithmeticIdentities(), CSE(), DeadNodeRemoval()]

    def compile(self, graph, remap):
        return FixedPoint(Sequence(*self.passes)).compile(graph, remap)
