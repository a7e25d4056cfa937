"""Backend ops are typed (structural equality, display names), and a backend without a kernel for an op says so at
compile time (luminal.UnsupportedOpError) instead of running it somewhere slow."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import luminal as lm
from luminal.compiler import CSE, CustomOp, any_, op, rewrite
from helpers import needs_cuda

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from subtraction_compiler import SubtractionCompiler  # noqa: E402  (the README's example)


def _subtraction_graph(rng):
    cx = lm.Graph()
    a, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    c = (cx.tensor((2, 3)).set(a) - cx.tensor((3,)).set(b)).output()
    cx.compile(lm.GenericCompiler(), SubtractionCompiler())
    assert cx.stats().get("Subtract") == 1
    return cx, a, b, c


def test_unsupported_op_error_is_exported():
    assert issubclass(lm.UnsupportedOpError, NotImplementedError)


def test_cuda_raises_at_compile_time_for_an_op_it_has_no_kernel_for():
    rng = np.random.default_rng(0)
    cx, *_ = _subtraction_graph(rng)
    sub = next(i for i in cx._g.topo_order() if cx._g.node(i).name == "Subtract")
    with pytest.raises(lm.UnsupportedOpError, match=rf"CUDA backend has no kernel for Subtract \(node {sub}\)"):
        cx.compile(lm.CudaCompiler("float32", device=None))


def test_host_fallback_is_explicit_and_lists_its_nodes():
    rng = np.random.default_rng(1)
    cx, *_ = _subtraction_graph(rng)
    compiler = lm.CudaCompiler("float32", device=None, host_fallback=True)
    cx.compile(compiler)
    subs = [i for i in cx._g.topo_order() if cx._g.node(i).name == "Subtract"]
    assert compiler.host_nodes == subs and len(subs) == 1


@pytest.mark.skipif(needs_cuda() is not None, reason="needs a GPU")
def test_host_fallback_runs_on_a_gpu():
    rng = np.random.default_rng(2)
    cx, a, b, c = _subtraction_graph(rng)
    cx.compile(lm.CudaCompiler("float32", host_fallback=True))
    cx.execute()
    np.testing.assert_allclose(c.numpy(), a - b, rtol=1e-6)


def test_cpu_runs_the_user_op():
    rng = np.random.default_rng(3)
    cx, a, b, c = _subtraction_graph(rng)
    cx.compile(lm.CPUCompiler())
    cx.execute()
    np.testing.assert_allclose(c.numpy(), a - b, rtol=1e-6)


def test_equal_fused_kernels_are_one_after_cse():
    """Two chains computing the same thing from the same inputs become two Fused nodes with equal programs: CSE
    compares backend ops by their attributes (the program), not by identity, and keeps one."""
    rng = np.random.default_rng(4)
    cx = lm.Graph()
    xs = rng.standard_normal((4, 8)).astype(np.float32)
    x = cx.tensor((4, 8)).set(xs)
    y = ((x * 2.0).exp() + 1.0).output()
    z = ((x * 2.0).exp() + 1.0).output()
    cx.compile(lm.CPUCompiler())  # no GenericCompiler first: the primop chains stay apart until fused
    assert cx.stats().get("Fused") == 2
    cx.compile(CSE())
    assert cx.stats().get("Fused") == 1
    cx.execute()
    want = np.exp(xs.astype(np.float64) * 2) + 1
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(z.numpy(), want, rtol=1e-6)


def test_different_programs_stay_apart_after_cse():
    rng = np.random.default_rng(5)
    cx = lm.Graph()
    xs = rng.standard_normal((4, 8)).astype(np.float32)
    x = cx.tensor((4, 8)).set(xs)
    y = ((x * 2.0).exp() + 1.0).output()
    z = ((x * 3.0).exp() + 1.0).output()
    cx.compile(lm.CPUCompiler(), CSE())
    assert cx.stats().get("Fused") == 2
    cx.execute()
    np.testing.assert_allclose(z.numpy(), np.exp(xs.astype(np.float64) * 3) + 1, rtol=1e-6)
    np.testing.assert_allclose(y.numpy(), np.exp(xs.astype(np.float64) * 2) + 1, rtol=1e-6)


def test_user_ops_are_equal_by_name():
    twice = CustomOp("Twice", lambda a: a * 2)
    cx = lm.Graph()
    x = cx.tensor((3,)).set(np.array([1.0, 2.0, 3.0], np.float32))
    y, z = x.exp().output(), x.exp().output()

    class ToTwice:
        def compile(self, graph, remap):
            return rewrite(graph, op("Exp2", any_("x")), lambda g, m: twice(g, m["x"]))

    cx.compile(ToTwice())
    assert cx.stats().get("Twice") == 2
    cx.compile(CSE())
    assert cx.stats().get("Twice") == 1
    cx.execute()
    np.testing.assert_allclose(y.numpy(), z.numpy())


def test_patterns_match_backend_ops_by_display_name():
    cx = lm.Graph()
    a = cx.tensor((4, 8)).set(np.ones((4, 8), np.float32))
    b = cx.tensor((8, 5)).set(np.ones((8, 5), np.float32))
    (a @ b).output()
    cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
    from luminal.compiler import find
    assert len(find(cx, op("MatMul", any_("a"), any_("b")))) == 1
    assert not find(cx, op("Fused"))


def test_unknown_quantised_format_is_a_clear_error():
    cx = lm.Graph()
    raw = cx.tensor((2, 34), lm.uint8)
    with pytest.raises(ValueError, match="unknown quantised format 'Q5_K'"):
        cx._g.dequant("Q5_K", raw._edge(), [2, 32])
