"""Bad inputs give clear Python exceptions whose messages help (never a crash).

Messages are checked on substrings: the op, both shapes, the dim's name, what was expected.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import luminal as lm


def has(*parts):
    """A `match=` pattern requiring every part, literally, in any order."""
    return "".join(f"(?=[\\s\\S]*{re.escape(p)})" for p in parts)


def compiled(cx, backend):
    cx.compile(lm.GenericCompiler(), *backend.compilers("float32"))
    return cx


# ---- shape mismatches at build time -------------------------------------------------------------------------------
BINARY = {
    "add": (lambda a, b: a + b, "Add"),
    "sub": (lambda a, b: a - b, "sub"),
    "mul": (lambda a, b: a * b, "Mul"),
    "div": (lambda a, b: a / b, "div"),
    "mod": (lambda a, b: a % b, "remainder"),
    "pow": (lambda a, b: a ** b, "pow"),
    "maximum": (lambda a, b: a.maximum(b), "maximum"),
    "lt": (lambda a, b: a < b, ""),
    "eq": (lambda a, b: a == b, ""),
    "where": (lambda a, b: lm.where(a > 0, a, b), "where"),
}


@pytest.mark.parametrize("op", list(BINARY))
def test_binary_shape_mismatch_names_both_shapes(op):
    f, name = BINARY[op]
    cx = lm.Graph()
    a, b = cx.tensor((3, 4)), cx.tensor((5, 4))
    with pytest.raises(ValueError, match=has(name, "(3, 4)", "(5, 4)", "broadcast")):
        f(a, b)


def test_binary_shape_mismatch_different_rank_names_original_shapes():
    cx = lm.Graph()
    a = cx.tensor((3, 4))
    with pytest.raises(ValueError, match=has("(3, 4)", "(2, 1, 5)")):
        a + cx.tensor((2, 1, 5))
    with pytest.raises(ValueError, match=has("(3, 4)", "(5,)")):
        a - cx.tensor((5,))


def test_binary_symbolic_mismatch_names_the_dim():
    cx = lm.Graph()
    with pytest.raises(ValueError, match=has("(s, 4)", "(3, 4)")):
        cx.tensor(("s", 4)) + cx.tensor((3, 4))


def test_binary_different_graphs_and_bad_operand():
    a, b = lm.Graph().tensor((3,)), lm.Graph().tensor((3,))
    with pytest.raises(ValueError, match="different graphs"):
        a + b
    with pytest.raises(TypeError, match=has("unsupported operand", "'x'")):
        a + "x"


@pytest.mark.parametrize("case", [
    ("2d", (3, 4), (5, 6), ["(3, 4)", "(5, 6)", "4", "5"]),
    ("1d", (4,), (5,), ["(4,)", "(5,)"]),
    ("2d@1d", (3, 4), (3,), ["(3, 4)", "(3,)"]),
    ("linear-like", (2, 3, 4), (5, 2), ["(2, 3, 4)", "(5, 2)"]),
], ids=lambda c: c[0])
def test_matmul_shape_mismatch_names_both_shapes(case):
    _, sa, sb, parts = case
    cx = lm.Graph()
    with pytest.raises(ValueError, match=has("matmul", *parts)):
        cx.tensor(sa) @ cx.tensor(sb)


def test_matmul_batch_mismatch_names_both_shapes():
    cx = lm.Graph()
    with pytest.raises(ValueError, match=has("matmul", "(2, 3, 4)", "(3, 4, 5)")):
        cx.tensor((2, 3, 4)) @ cx.tensor((3, 4, 5))


def test_matmul_0d_and_linear_mismatch():
    cx = lm.Graph()
    with pytest.raises(ValueError, match=has("matmul", "at least one dim")):
        cx.constant(1.0) @ cx.tensor((3,))
    with pytest.raises(ValueError, match=has("matmul", "(3, 4)", "(5, 6)")):
        cx.tensor((3, 4)).linear(cx.tensor((6, 5)))


def test_cat_stack_mismatch_names_both_shapes():
    cx = lm.Graph()
    a, b, c = cx.tensor((3, 4)), cx.tensor((4, 6)), cx.tensor((3,))
    with pytest.raises(ValueError, match=has("cat", "(3, 4)", "(4, 6)", "dim 0")):
        lm.cat([a, b], 0)
    with pytest.raises(ValueError, match=has("cat", "(3, 4)", "(3,)")):
        lm.cat([a, c], 0)
    with pytest.raises(ValueError, match=has("cat", "at least one")):
        lm.cat([], 0)
    with pytest.raises(ValueError, match=has("stack", "(3, 4)", "(4, 6)")):
        lm.stack([a, b])
    with pytest.raises(IndexError, match=has("dim 2", "(3, 4)")):
        lm.cat([a, a], 2)


@pytest.mark.parametrize("case", [
    ("count", lambda t: t.reshape(5, 2), ["(3, 4)", "(5, 2)"]),
    ("view", lambda t: t.view(7), ["(3, 4)", "(7,)"]),
    ("hole", lambda t: t.reshape(-1, 5), ["(3, 4)", "5"]),
    ("two-holes", lambda t: t.reshape(-1, -1), ["-1"]),
], ids=lambda c: c[0])
def test_reshape_mismatch_names_both_shapes(case):
    _, f, parts = case
    with pytest.raises(ValueError, match=has("reshape", *parts)):
        f(lm.Graph().tensor((3, 4)))


@pytest.mark.parametrize("case", [
    ("expand", lambda t: t.expand(3, 5), ValueError, ["expand", "(3, 4)", "(3, 5)"]),
    ("expand-fewer", lambda t: t.expand(4), ValueError, ["expand", "(3, 4)"]),
    ("permute-repeat", lambda t: t.permute(0, 0), ValueError, ["permute", "repeat"]),
    ("permute-short", lambda t: t.permute(0), ValueError, ["permute", "(3, 4)"]),
    ("split", lambda t: t.split([1, 1], 0), ValueError, ["split", "(3, 4)"]),
    ("pad-odd", lambda t: t.pad((1,)), ValueError, ["pad", "(3, 4)"]),
    ("pad-long", lambda t: t.pad((1,) * 6), ValueError, ["pad", "(3, 4)"]),
    ("repeat-short", lambda t: t.repeat(2), ValueError, ["repeat", "(3, 4)"]),
    ("step0", lambda t: t[::0], ValueError, ["step", "zero"]),
    ("gather-rank", lambda t: t.gather(0, t.graph.tensor((3,), dtype="int32")), ValueError, ["gather", "(3,)",
                                                                                           "(3, 4)"]),
    ("index_select-2d", lambda t: t.index_select(0, t.graph.tensor((3, 1), dtype="int32")), ValueError,
     ["index_select", "(3, 1)"]),
    ("tril-1d", lambda t: lm.tril(t[0]), ValueError, ["tril", "(4,)"]),
    ("chunk-symbolic", lambda t: t.graph.tensor(("q",)).chunk(2), ValueError, ["chunk", "symbolic"]),
    ("arange-step0", lambda t: t.graph.arange(0, 5, 0), ValueError, ["arange", "step"]),
    ("len-0d", lambda t: len(t.sum()), TypeError, ["0-d"]),
    ("neg-bool", lambda t: -(t > 0), TypeError, ["bool"]),
    ("invert-float", lambda t: ~t, TypeError, ["bool", "float32"]),
], ids=lambda c: c[0])
def test_other_build_errors(case):
    _, f, exc, parts = case
    with pytest.raises(exc, match=has(*parts)):
        f(lm.Graph().tensor((3, 4)))


# ---- out-of-range dims and indices ------------------------------------------------------------------------------
@pytest.mark.parametrize("case", [
    ("sum", lambda t: t.sum(2), "dim 2"),
    ("sum-neg", lambda t: t.sum(-3), "dim -3"),
    ("sum-tuple", lambda t: t.sum((0, 5)), "dim 5"),
    ("mean", lambda t: t.mean(4), "dim 4"),
    ("max", lambda t: t.max(2), "dim 2"),
    ("argmax", lambda t: t.argmax(2), "dim 2"),
    ("softmax", lambda t: t.softmax(-3), "dim -3"),
    ("log_softmax", lambda t: t.log_softmax(2), "dim 2"),
    ("cumsum", lambda t: t.cumsum(2), "dim 2"),
    ("var", lambda t: t.var(3), "dim 3"),
    ("logsumexp", lambda t: t.logsumexp(2), "dim 2"),
    ("unsqueeze", lambda t: t.unsqueeze(3), "dim 3"),
    ("unsqueeze-neg", lambda t: t.unsqueeze(-4), "dim -4"),
    ("squeeze", lambda t: t.squeeze(2), "dim 2"),
    ("transpose", lambda t: t.transpose(0, 2), "dim 2"),
    ("permute", lambda t: t.permute(0, 2), "dim 2"),
    ("flip", lambda t: t.flip(2), "dim 2"),
    ("flatten", lambda t: t.flatten(0, 2), "dim 2"),
    ("split", lambda t: t.split(1, 2), "dim 2"),
    ("chunk", lambda t: t.chunk(2, -3), "dim -3"),
    ("index_select", lambda t: t.index_select(2, t.graph.tensor((1,), dtype="int32")), "dim 2"),
    ("gather", lambda t: t.gather(2, t.graph.tensor((3, 4), dtype="int32")), "dim 2"),
    ("stack", lambda t: lm.stack([t, t], 3), "dim 3"),
    ("size", lambda t: t.size(2), "dim 2"),
], ids=lambda c: c[0])
def test_dim_out_of_range(case):
    _, f, part = case
    with pytest.raises(IndexError, match=has(part, "(3, 4)")):
        f(lm.Graph().tensor((3, 4)))


@pytest.mark.parametrize("case", [
    ("int", lambda t: t[3], ["index 3", "size 3"]),
    ("neg", lambda t: t[-4], ["index -4", "size 3"]),
    ("second-dim", lambda t: t[0, 4], ["index 4", "size 4"]),
    ("ellipsis", lambda t: t[..., -5], ["index -5", "size 4"]),
    ("too-many", lambda t: t[0, 0, 0], ["too many indices", "(3, 4)"]),
], ids=lambda c: c[0])
def test_index_out_of_range(case):
    _, f, parts = case
    with pytest.raises(IndexError, match=has(*parts)):
        f(lm.Graph().tensor((3, 4)))


def test_unsupported_index_types():
    t = lm.Graph().tensor((3, 4))
    with pytest.raises(TypeError, match="unsupported index"):
        t["a"]
    with pytest.raises(TypeError, match="unsupported index"):
        t[1.5]


# ---- dtypes ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["float64", "complex", "complex64", "int64", "float", np.float64, "f32", None])
def test_unknown_dtype(name):
    cx = lm.Graph()
    with pytest.raises(TypeError, match=has("unknown dtype", str(name), "float32", "bfloat16")):
        cx.tensor((2,), dtype=name)


def test_unknown_dtype_in_to_and_factories():
    cx = lm.Graph()
    t = cx.tensor((2,))
    with pytest.raises(TypeError, match=has("unknown dtype", "float64")):
        t.to("float64")
    with pytest.raises(TypeError, match=has("unknown dtype", "complex")):
        cx.full((2,), 1.0, dtype="complex")
    with pytest.raises(TypeError, match=has("unknown dtype", "double")):
        cx.constant(1.0, dtype="double")


def test_bad_dimension_values():
    cx = lm.Graph()
    with pytest.raises(TypeError, match=has("dimension", "2.5")):
        cx.tensor((2.5,))
    with pytest.raises(TypeError, match="dimension"):
        cx.tensor((True, 3))
    with pytest.raises(ValueError, match=has("cannot parse", "s+")):
        cx.tensor(("s+",))
    with pytest.raises(ValueError, match=has("'s'", "negative")):
        cx.set_dim("s", -1)


def test_negative_dimension_rejected_at_construction():
    with pytest.raises(ValueError, match="-2"):
        lm.Graph().tensor((-2, 3))


# ---- set() -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", [
    ("shape", (3, 5), ["'x'", "(3, 4)", "(3, 5)"]),
    ("ndim", (12,), ["'x'", "(3, 4)", "(12,)"]),
    ("ndim-more", (3, 4, 1), ["'x'", "(3, 4)", "(3, 4, 1)"]),
    ("scalar", (), ["'x'", "(3, 4)", "()"]),
], ids=lambda c: c[0])
def test_set_wrong_shape_says_what_was_expected(case):
    _, shape, parts = case
    t = lm.Graph().tensor((3, 4), name="x")
    with pytest.raises(ValueError, match=has(*parts)):
        t.set(np.ones(shape, np.float32))


def test_set_wrong_shape_with_symbolic_dims():
    t = lm.Graph().tensor(("s", 4), name="x")
    with pytest.raises(ValueError, match=has("'x'", "(s, 4)", "(3, 5)")):
        t.set(np.ones((3, 5), np.float32))


@pytest.mark.parametrize("case", [
    ("float32<-int32", "float32", np.ones((3,), np.int32), ["float32", "int32"]),
    ("float32<-bool", "float32", np.ones((3,), np.bool_), ["float32", "bool"]),
    ("float16<-int32", "float16", np.ones((3,), np.int32), ["float16", "int32"]),
    ("bfloat16<-uint8", "bfloat16", np.ones((3,), np.uint8), ["bfloat16", "uint8"]),
    ("int32<-float32", "int32", np.ones((3,), np.float32), ["int32", "float32"]),
    ("bool<-int32", "bool", np.ones((3,), np.int32), ["bool", "int32"]),
    ("bool<-float", "bool", np.ones((3,), np.float32), ["bool", "float32"]),
    ("float32<-str", "float32", np.array(["a", "b", "c"]), ["float32", "<U1"]),
    ("float32<-object", "float32", np.array([object()] * 3), ["float32", "object"]),
], ids=lambda c: c[0])
def test_set_wrong_dtype_kind_says_what_was_expected(case):
    _, want, arr, parts = case
    t = lm.Graph().tensor((3,), dtype=want, name="x")
    with pytest.raises(TypeError, match=has("'x'", *parts)):
        t.set(arr)


def test_set_converts_within_a_kind():
    """Not errors: float64 data into float32/bfloat16, int64 into int32, nested lists."""
    cx = lm.Graph()
    a = cx.tensor((2,)).set(np.array([1.5, 2.5]))
    b = cx.tensor((2,), dtype="int32").set(np.array([3, 4], np.int64))
    c = cx.tensor((2,), dtype="bfloat16").set([1.0, 2.0])
    oa, ob, oc = (a * 1).output(), (b * 1).output(), (c * 1).output()
    cx.execute()
    np.testing.assert_array_equal(oa.numpy(), [1.5, 2.5])
    np.testing.assert_array_equal(ob.numpy(), [3, 4])
    np.testing.assert_array_equal(oc.numpy(), [1.0, 2.0])


def test_set_on_computed_tensor():
    cx = lm.Graph()
    t = cx.tensor((3,))
    with pytest.raises(ValueError, match=has("set()", "input")):
        (t + 1).set(np.ones(3, np.float32))
    with pytest.raises(ValueError, match=has("set()", "input")):
        (t + 1).output().set(np.ones(3, np.float32))


def test_set_conflicting_symbolic_binding():
    cx = lm.Graph()
    a, b = cx.tensor(("s", 2), name="a"), cx.tensor(("s", 3), name="b")
    a.set(np.ones((4, 2), np.float32))
    with pytest.raises(ValueError, match=has("'b'", "s", "4", "5")):
        b.set(np.ones((5, 3), np.float32))
    c = cx.tensor(("s+1",), name="c")
    with pytest.raises(ValueError, match=has("'c'", "s + 1", "5", "4")):
        c.set(np.ones(4, np.float32))
    assert cx.dims == {"s": 4}  # a failed set() binds nothing


def test_set_conflicting_binding_within_one_array():
    t = lm.Graph().tensor(("s", "s"), name="sq")
    with pytest.raises(ValueError, match=has("'sq'", "s", "3", "4")):
        t.set(np.ones((3, 4), np.float32))


def test_set_unsolvable_dim():
    t = lm.Graph().tensor(("2*t",), name="even")
    with pytest.raises(ValueError, match=has("'even'", "t", "5")):
        t.set(np.ones(5, np.float32))


# ---- execute -----------------------------------------------------------------------------------------------------
def test_unbound_dimension_at_execute(backend):
    cx = lm.Graph()
    v = cx.tensor((2,)).set(np.ones(2, np.float32))
    out = (v.unsqueeze(0).expand(lm.Expr("n"), 2) * 2).output()
    compiled(cx, backend)
    with pytest.raises(lm.UnboundDimensionError, match="'n'") as e:
        cx.execute()
    assert isinstance(e.value, ValueError)
    cx.set_dim("n", 3)
    cx.execute()
    assert out.numpy().shape == (3, 2)


def test_unbound_dimension_of_an_input_without_data(backend):
    cx = lm.Graph()
    x = cx.tensor(("batch", 2), name="x")
    (x * 2).output()
    compiled(cx, backend)
    with pytest.raises(ValueError) as e:
        cx.execute()
    assert "'batch'" in str(e.value) or "'x'" in str(e.value), str(e.value)


def test_input_without_data(backend):
    cx = lm.Graph()
    x = cx.tensor((2,), name="x")
    (x * 2).output()
    compiled(cx, backend)
    with pytest.raises(ValueError, match=has("'x'", "set()")):
        cx.execute()


def test_stale_data_after_rebinding_a_dim(backend):
    cx = lm.Graph()
    a, b = cx.tensor(("s",), name="a"), cx.tensor(("s",), name="b")
    (a + b).output()
    compiled(cx, backend)
    a.set(np.ones(3, np.float32))
    b.set(np.ones(3, np.float32))
    cx.execute()
    cx.set_dim("s", 5)
    a.set(np.ones(5, np.float32))
    with pytest.raises(ValueError, match=has("'b'", "shape")):
        cx.execute()  # b still holds 3 elements


def test_numpy_before_execute_and_on_non_output(backend):
    cx = lm.Graph()
    x = cx.tensor((2,)).set(np.ones(2, np.float32))
    out = (x * 2).output()
    other = x * 3
    compiled(cx, backend)
    with pytest.raises(RuntimeError, match=has("execute()")):
        out.numpy()
    with pytest.raises(RuntimeError, match=has("not an output", ".output()")):
        other.numpy()
    cx.execute()
    with pytest.raises(RuntimeError, match=has("not an output", ".output()")):
        other.numpy()
    with pytest.raises(RuntimeError, match="not an output"):
        x.numpy()


def test_output_marked_after_execute_has_no_result(backend):
    cx = lm.Graph()
    x = cx.tensor((2,)).set(np.ones(2, np.float32))
    (x * 2).output()
    cx.execute()
    late = (x * 3).output()
    with pytest.raises(RuntimeError, match="execute()"):
        late.numpy()


def _gather_graph(kind, index, backend):
    cx = lm.Graph()
    table = cx.tensor((4, 3)).set(np.arange(12, dtype=np.float32).reshape(4, 3))
    idx = np.asarray(index, np.int32)
    i = cx.tensor(idx.shape, dtype="int32").set(idx)
    out = {"index_select0": lambda: table.index_select(0, i),
           "index_select1": lambda: table.index_select(1, i),
           "embedding": lambda: lm.embedding(i, table),
           "gather0": lambda: table.gather(0, i),
           "gather1": lambda: table.gather(1, i),
           "tensor-index": lambda: table[i]}[kind]().output()
    compiled(cx, backend)
    return cx, out


@pytest.mark.parametrize("kind,index", [
    ("index_select0", [1, 4]),
    ("index_select0", [-1, 0]),
    ("index_select1", [0, 3]),
    ("embedding", [[0, 9]]),
    ("tensor-index", [2, 7]),
    ("gather0", [[0, 1, 2], [4, 0, 0]]),
    ("gather1", [[0, 1, 2], [1, 2, 3], [0, 0, 0], [2, 2, 3]]),  # row 3's 3 is past the flat end too
], ids=str)
def test_gather_out_of_range_index_at_execute(backend, kind, index):
    cx, out = _gather_graph(kind, index, backend)
    with pytest.raises(IndexError, match="out of range"):
        cx.execute()


def test_a_queued_run_raises_its_device_error_when_read(backend):
    """execute(wait=False) only queues a GPU run: its out-of-range index is raised when a result is read; then the
    graph runs again with a good index (the CPU backends finish the run, and raise, in execute)."""
    cx = lm.Graph()
    table = cx.tensor((4, 3)).set(np.arange(12, dtype=np.float32).reshape(4, 3))
    i = cx.tensor((2,), dtype="int32").set(np.asarray([1, 4], np.int32))
    out = table.index_select(0, i).output()
    compiled(cx, backend)
    with pytest.raises(IndexError, match="out of range"):
        cx.execute(wait=False)
        out.numpy()
    i.set(np.asarray([3, 0], np.int32))
    cx.execute(wait=False)
    np.testing.assert_array_equal(out.numpy(), np.arange(12, dtype=np.float32).reshape(4, 3)[[3, 0]])


@pytest.mark.parametrize("index", [[[3, 0, 0], [0, 0, 0]], [[0, 0, 0], [-1, 0, 0]]], ids=["past-end", "negative"])
def test_gather_out_of_range_inside_flat_buffer(backend, index):
    cx, out = _gather_graph("gather1", index, backend)
    with pytest.raises(IndexError, match="out of range"):
        cx.execute()


def test_graph_still_usable_after_an_execute_error(backend):
    cx, out = _gather_graph("index_select0", [1, 4], backend)
    with pytest.raises(IndexError):
        cx.execute()
    cx2 = lm.Graph()
    t = cx2.tensor((2,)).set(np.ones(2, np.float32))
    o = (t + 1).output()
    cx2.execute()
    np.testing.assert_array_equal(o.numpy(), [2.0, 2.0])


# ---- never a segfault --------------------------------------------------------------------------------------------
CRASH_PROBES = r'''
import faulthandler, sys
faulthandler.enable()
import numpy as np, luminal as lm
from luminal import _core
results = []
def probe(name, f):
    try:
        f()
        results.append((name, None))
    except Exception as e:  # a Python exception is the point; a crash would kill the process
        results.append((name, type(e).__name__))

cx = lm.Graph(); a = cx.tensor((3, 4)); g = cx._g
probe("node-oob", lambda: g.node(10**6))
probe("node-neg", lambda: g.node(-1))
probe("edge-bad", lambda: g.unary("Exp2", _core.Edge(10**6, a.layout)))
probe("reduce-axis", lambda: g.reduce("SumReduce", a._edge(), 7))
probe("unknown-op", lambda: g.unary("Nope", a._edge()))
probe("remove-bad", lambda: g.remove(10**6))
probe("replace-bad", lambda: g.replace_uses(10**6, 0))
probe("view-permute", lambda: a.layout.permute([9, 0]))
probe("view-squeeze", lambda: a.layout.squeeze(9))
probe("view-slice", lambda: a.layout.slice(9, 0, 1))
probe("view-flip", lambda: a.layout.flip(-9))
probe("view-pad", lambda: a.layout.pad(9, 1, 1))
probe("expr-parse", lambda: lm.Expr("s+*"))
probe("expr-div0", lambda: lm.Expr(3) // 0)

def run(build, dims=None):
    c = lm.Graph()
    outs = build(c)
    for k, v in (dims or {}).items():
        c.set_dim(k, v)
    c.execute()
    return [o.numpy() for o in outs]

def slice_past(c):
    x = c.tensor(("s",)).set(np.ones(4, np.float32))
    return [x[: lm.Expr("s") + 3].output()]
probe("symbolic-slice-past-end", lambda: run(slice_past))

def nan_index(c):
    x = c.tensor((4,)).set(np.ones(4, np.float32))
    i = c.tensor((2,)).set(np.array([np.nan, 1e10], np.float32))
    return [x.index_select(0, i).output()]
probe("nan-index", lambda: run(nan_index))

def big_index(c):
    x = c.tensor((4, 2)).set(np.ones((4, 2), np.float32))
    i = c.tensor((2,), dtype="int32").set(np.array([2**31 - 1, -2**31], np.int32))
    return [lm.embedding(i, x).output(), x.gather(0, i.unsqueeze(1).expand(2, 2)).output()]
probe("huge-index", lambda: run(big_index))

def stale(c):
    x = c.tensor(("s",)).set(np.ones(3, np.float32))
    return [(x * 2).output()]
probe("rebound-larger", lambda: run(stale, {"s": 10**6}))

def huge(c):
    x = c.tensor((3,)).set(np.ones(3, np.float32))
    return [x.expand(lm.Expr("s"), 3).output()]
probe("huge-alloc", lambda: run(huge, {"s": 2**40}))

def empty(c):
    x = c.tensor(("s", 3)).set(np.ones((0, 3), np.float32))
    return [x.sum(0).output(), x.amax(0).output(), x.softmax(0).output(), x.mean(0).output()]
probe("zero-size", lambda: run(empty))

def neg_shape(c):
    x = c.tensor((-2,))
    return [(x * 2).output()]
probe("negative-shape", lambda: run(neg_shape))

def neg_expand(c):
    x = c.tensor((1,)).set(np.ones(1, np.float32))
    return [x.expand(lm.Expr("s") - 5).output()]
probe("negative-symbolic-size", lambda: run(neg_expand, {"s": 2}))

def direct_data(c):
    x = c.tensor((2,))
    c._data[x.id] = np.ones(5, np.float32)
    return [(x * 2).output()]
probe("wrong-data-direct", lambda: run(direct_data))

def wrong_dtype_direct(c):
    x = c.tensor((2,))
    c._data[x.id] = np.ones(2, np.float64)
    return [(x * 2).output()]
probe("wrong-itemsize-direct", lambda: run(wrong_dtype_direct))

def noncontig_direct(c):
    x = c.tensor((2, 2))
    c._data[x.id] = np.ones((2, 2), np.float32).T[::1]
    c._data[x.id] = np.ones((2, 4), np.float32)[:, ::2]
    return [(x * 2).output()]
probe("noncontiguous-direct", lambda: run(noncontig_direct))

for name, exc in results:
    print(name, exc)
print("FINISHED")
'''


def test_bad_inputs_never_crash_the_process():
    """Misuse of the public API and of the core bindings raises Python exceptions; the process survives."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(lm.__file__)))  # import the same luminal
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", CRASH_PROBES], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, (f"process died with {proc.returncode}\nstdout:\n{proc.stdout}\n"
                                  f"stderr:\n{proc.stderr[-3000:]}")
    assert "FINISHED" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    results = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line and line != "FINISHED")
    must_raise = ["node-oob", "node-neg", "edge-bad", "reduce-axis", "unknown-op", "remove-bad", "replace-bad",
                  "view-permute", "view-squeeze", "view-slice", "view-flip", "view-pad", "expr-parse", "expr-div0",
                  "symbolic-slice-past-end", "nan-index", "huge-index", "rebound-larger", "huge-alloc",
                  "negative-shape", "negative-symbolic-size", "wrong-data-direct", "wrong-itemsize-direct",
                  "noncontiguous-direct"]
    quiet = [n for n in must_raise if results.get(n) == "None"]
    assert not quiet, f"these bad inputs raised nothing: {quiet}\n{proc.stdout}"
