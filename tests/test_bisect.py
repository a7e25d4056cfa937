"""luminal.bisect: the first pass (and match) that makes a compiled graph compute something else."""
import os
import subprocess
import sys

import numpy as np
import pytest

import luminal as lm
from luminal.compiler import CustomOp, any_, const, op, rewrite

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from subtraction_compiler import SubtractionCompiler  # noqa: E402

# Wrong when b varies along the last axis (it reads b's row backwards); right when b is one value per row.
WRONG_SUBTRACT = CustomOp("Subtract", lambda a, b: a - np.broadcast_to(b, a.shape)[..., ::-1])


class WrongSubtractionCompiler:
    """The README's SubtractionCompiler with a wrong kernel."""

    def compile(self, graph, remap):
        pattern = op("Add", any_("a"), op("Mul", any_("b"), const(-1)))
        return rewrite(graph, pattern, lambda g, m: WRONG_SUBTRACT(g, m["a"], m["b"]), name="a + b*-1 -> Subtract")


def _graph(rng):
    """Three subtractions; only the second has a b that varies along the row, so only its match goes wrong."""
    cx = lm.Graph()
    x = cx.tensor(("s", 5), name="x").set(rng.data((3, 5)).astype(np.float32))
    y = cx.tensor(("s", 5), name="y").set(rng.data((3, 5)).astype(np.float32))
    first = x - x.amax(-1, keepdim=True)
    bad = first.exp() - y
    last = bad - bad.mean(-1, keepdim=True)
    (last * 2).output()
    return cx, bad


def test_names_the_wrong_compiler_and_match(rng):
    cx, bad = _graph(rng)
    before = len(cx)
    report = lm.bisect(cx, [lm.GenericCompiler(), WrongSubtractionCompiler(), lm.GenericCompiler(), lm.CPUCompiler()])
    assert not report.ok
    assert report.step == "compilers[1] WrongSubtractionCompiler", str(report)
    assert (report.match_index, report.matches) == (2, 3), str(report)
    assert report.match.rule == "a + b*-1 -> Subtract"
    assert report.match.root == bad._id  # the Add that `first.exp() - y` recorded
    assert report.replaced == {bad._id: report.match.replacement}
    assert "elements differ" in report.reason
    text = str(report)
    assert "WrongSubtractionCompiler" in text and "match 2 of 3" in text and f"node {bad._id} ->" in text
    assert f"node {bad._id}: Add" in report.dot and "Subtract" in report.dot
    assert len(cx) == before and not cx.compilers  # the user's graph is left as it was
    path = report.display(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"bisect_{os.getpid()}.svg"))
    assert os.path.exists(path)
    os.remove(path)


def test_all_correct(rng):
    cx, _ = _graph(rng)
    report = lm.bisect(cx, [lm.GenericCompiler(), SubtractionCompiler(), lm.GenericCompiler(), lm.CPUCompiler()])
    assert report.ok, str(report)
    assert report.steps > 10 and "keep the outputs" in str(report) and report.dot is None


def test_all_correct_cuda_codegen(rng):
    cx, _ = _graph(rng)
    report = lm.bisect(cx, [lm.GenericCompiler(), lm.CudaCompiler("float32", device=None)])
    assert report.ok, str(report)


class _RewireWrong:
    """Not a rewrite: rewires the first Exp2 to read its own input (a pass that is one step)."""

    def compile(self, graph, remap):
        for i in graph.nodes():
            n = graph.node(i)
            if n.op == "Exp2":
                remap.replace(i, n.inputs[0].node)
                graph._g.remove(i)
                return 1
        return 0


def test_names_a_pass_that_is_one_step(rng):
    cx = lm.Graph()
    x = cx.tensor((4, 3)).set(rng.data((4, 3)).astype(np.float32))
    e = (x * 3).exp()
    (e + 1).output()
    report = lm.bisect(cx, [lm.GenericCompiler(), _RewireWrong(), lm.CPUCompiler()])
    assert report.step == "compilers[1] _RewireWrong" and report.match is None, str(report)
    exp2 = [i for i in report.replaced if cx.node(i).op == "Exp2"]
    assert len(exp2) == 1 and report.replaced[exp2[0]] is not None
    assert "Exp2" in report.dot


class _Raises:
    def compile(self, graph, remap):
        raise RuntimeError("boom")


def test_names_a_pass_that_raises(rng):
    cx = lm.Graph()
    x = cx.tensor((2, 3)).set(rng.data((2, 3)).astype(np.float32))
    x.exp().output()
    report = lm.bisect(cx, [lm.GenericCompiler(), _Raises()])
    assert not report.ok and report.step == "compilers[1] _Raises" and "RuntimeError: boom" in report.reason


def test_inputs_and_tolerance(rng):
    cx = lm.Graph()
    x = cx.tensor(("s", 4), name="x")
    (x - x.sum(-1, keepdim=True)).output()
    data = rng.data((2, 4)).astype(np.float32)
    report = lm.bisect(cx, [lm.GenericCompiler(), SubtractionCompiler()], {"x": data}, tol=(1e-6, 1e-6))
    assert report.ok, str(report)
    assert not cx._data  # the inputs went to bisect's copy only


def test_bad_calls(rng):
    cx = lm.Graph()
    x = cx.tensor((2,)).set(rng.data((2,)).astype(np.float32))
    with pytest.raises(ValueError, match="no outputs"):
        lm.bisect(cx, [lm.GenericCompiler()])
    x.exp().output()
    cx.compile(lm.GenericCompiler())
    with pytest.raises(ValueError, match="before compilation"):
        lm.bisect(cx, [lm.GenericCompiler()])
    with pytest.raises(TypeError, match="luminal.Graph"):
        lm.bisect(3, [])


def wrong_pipeline():
    """For `python -m luminal.bisect --compilers test_bisect:wrong_pipeline`."""
    return [lm.GenericCompiler(), WrongSubtractionCompiler(), lm.CPUCompiler()]


def test_save_load_and_cli(rng, tmp_path, capsys):
    cx = lm.Graph()
    x = cx.tensor(("s", 6), name="x").set(rng.data((4, 6)).astype(np.float32))
    idx = cx.tensor((3,), dtype="int32", name="idx").set(np.array([2, 0, 1], np.int32))
    h = cx.tensor((6,), dtype="bfloat16", name="h").set(rng.data((6,)).astype(np.float32))
    y = x.pad((1, 2))[1:, ::2].softmax(-1)  # a padded, sliced, strided view
    z = x[idx] - lm.arange(6, graph=cx).float() * h.float()  # gather, iota, cast
    y.output(), z.output(), (x.flip(0) - x).to("bfloat16").output()
    path = str(tmp_path / "g.npz")
    lm.bisect.save(cx, path)
    back = lm.bisect.load(path)
    assert back.nodes() == cx.nodes() and back.dims == cx.dims
    cx.execute()
    back.execute()
    for o in cx._g.outputs():
        np.testing.assert_array_equal(back._result(o), cx._result(o))
    from luminal.bisect import main

    assert main([path, "--compilers", "test_bisect:wrong_pipeline"]) == 1
    out = capsys.readouterr().out
    assert "compilers[1] WrongSubtractionCompiler" in out and "at match" in out
    r = subprocess.run([sys.executable, "-m", "luminal.bisect", path, "--compilers", "cpu"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "keep the outputs" in r.stdout, r.stdout + r.stderr


def test_save_refuses_a_compiled_graph(rng, tmp_path):
    cx = lm.Graph()
    x = cx.tensor((2, 3)).set(rng.data((2, 3)).astype(np.float32))
    (x @ x.T).output()
    cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
    with pytest.raises(ValueError, match="backend op"):
        lm.bisect.save(cx, str(tmp_path / "g.npz"))


def test_graph_copy_is_independent(rng):
    cx = lm.Graph()
    x = cx.tensor(("s", 3)).set(rng.data((2, 3)).astype(np.float32))
    out = (x.exp() @ x.T).output()
    copy = cx.copy()
    assert lm.graph.default_graph() is cx  # copying does not change the graph being built
    assert copy.nodes() == cx.nodes() and copy.dims == cx.dims
    copy.compile(lm.GenericCompiler(), lm.CPUCompiler())
    assert "MatMul" in copy.stats() and "MatMul" not in cx.stats() and not cx.compilers
    cx.execute()
    copy.execute()
    np.testing.assert_allclose(copy._result(out._out), out.numpy(), rtol=1e-5, atol=1e-6)
