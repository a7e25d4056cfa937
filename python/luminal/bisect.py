"""Finds the pass, and the rewrite inside it, that makes a compiled graph compute something else.

    report = luminal.bisect(graph, [lm.GenericCompiler(), MyCompiler(), lm.CPUCompiler()], {x: x_data})
    print(report)            # the first pass whose result diverges, the match, the nodes it replaced
    report.display()         # that subgraph before and after, with Graphviz

The pipeline runs on a copy of the graph one pass at a time (Sequence, FixedPoint and the built-in compilers are
opened into their passes), and the outputs are compared with the uncompiled graph's after every pass that changed
something (trials run on `Graph.copy()`s: a C++ copy, no rebuild). Inside the first pass that diverges, the matches
of Python `rewrite`s are separable: the pass is run again on a copy of the graph as it was before it, applying only
its first k matches, and the smallest k that diverges (found by halving) names the match. A core pass (constant
folding, fusion...) is one step: its report lists every node it replaced.

`python -m luminal.bisect graph.npz` bisects a graph saved with `luminal.bisect.save(graph, path)`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types

import numpy as np

from . import _core
from . import compiler as _comp
from . import dtypes as dt
from .display import _esc, _label
from .graph import Graph

_TOL = {"float32": (1e-4, 1e-3), "float16": (1e-2, 1e-2), "bfloat16": (2e-2, 5e-2)}


# ---- the pipeline, one pass at a time --------------------------------------------------------------------------------
@dataclasses.dataclass
class _Step:
    path: str  # where the pass sits in the pipeline, e.g. "compilers[0] GenericCompiler > iteration 1 > CSE()"
    leaf: object  # the pass, run again on a copy when its matches are bisected


def _name(c) -> str:
    return type(c).__name__


def _cuda_types():
    try:
        from .cuda import CudaCompiler

        return (CudaCompiler,)
    except ImportError:  # pragma: no cover
        return ()


class _CudaCodegen:
    """CudaCompiler's work after its passes: generating (and, with a device, loading) the kernels."""

    def __init__(self, c):
        self.c = c

    def compile(self, graph, remap):
        passes, self.c.passes = self.c.passes, []  # its passes ran as steps of their own
        try:
            self.c.compile(graph, remap)
        finally:
            self.c.passes = passes
        return 1  # the results may now come from the device

    def __repr__(self):
        return "CudaCompiler code generation"


def _walk(c, graph, remap, path, sep=" > "):
    """Runs compiler `c` one leaf pass at a time; yields (step, changes) after each. Steps are named by where they
    sit: "compilers[0] GenericCompiler > iteration 2 > CSE()"."""
    if isinstance(c, (list, tuple)):
        for cc in c:
            yield from _walk(cc, graph, remap, path, sep)
    elif isinstance(c, _comp.Sequence):
        for cc in c.compilers:
            yield from _walk(cc, graph, remap, path, sep)
    elif isinstance(c, _comp.FixedPoint):
        for it in range(c.max_iters):
            total = 0
            for step, n in _walk(c.compiler, graph, remap, f"{path}{sep}iteration {it + 1}"):
                total += n
                yield step, n
            if total == 0:
                break
    elif isinstance(c, _comp.GenericCompiler):
        yield from _walk(_comp.FixedPoint(_comp.Sequence(*c.passes)), graph, remap, path + sep + _name(c))
    elif isinstance(c, _comp.CPUCompiler):
        yield from _walk(_comp.Sequence(*c.passes), graph, remap, path + sep + _name(c))
    elif isinstance(c, _cuda_types()):
        yield from _walk(_comp.Sequence(*c.passes, _CudaCodegen(c)), graph, remap, path + sep + _name(c))
    else:
        step = _Step(path + sep + (_name(c) if repr(c).startswith("<") else repr(c)), c)
        _walk.current = step  # the pass to name if it raises
        yield step, _comp._run(c, graph, remap)


# ---- matches of Python rewrites --------------------------------------------------------------------------------------
@dataclasses.dataclass
class Match:
    """A rewrite a pass applied: its rule, the root it replaced, the nodes the pattern bound, the replacement."""

    rule: str
    root: int
    bound: dict  # pattern name -> node id
    replacement: int

    def __str__(self):
        names = ", ".join(f"{k}={v}" for k, v in self.bound.items())
        bound = f" (bound {names})" if names else ""
        return f"rule '{self.rule}': node {self.root} -> node {self.replacement}{bound}"


class _Budget:
    """The rewrite hook: lets `limit` matches through (None: all) and records them."""

    def __init__(self, limit=None):
        self.limit, self.matches = limit, []

    def allow(self) -> bool:
        return self.limit is None or len(self.matches) < self.limit

    def record(self, rule, m, replacement):
        self.matches.append(Match(rule, m.root, {k: m[k].node for k in m.names()}, int(replacement)))


def _run_leaf(leaf, graph, limit=None):
    budget = _Budget(limit)
    prev, _comp._rewrite_hook = _comp._rewrite_hook, budget
    try:
        n = _comp._run(leaf, graph, _comp.Remap(graph))
    finally:
        _comp._rewrite_hook = prev
    return n, budget.matches


# ---- running and comparing -------------------------------------------------------------------------------------------
def _outputs(graph) -> dict:
    graph._executor = None  # the graph changed: a new schedule
    graph.execute()
    res = {}
    for oid in graph._g.outputs():
        r = graph._result(oid)
        res[oid] = dt.bf16_to_f32(r).reshape(r.shape) if graph._g.node(oid).dtype == "bfloat16" else r
    return res


def _tol(dtype, tol):
    if tol is None:
        return _TOL.get(dtype, (0.0, 0.0))
    return (float(tol), float(tol)) if np.isscalar(tol) else tuple(tol)


def _diverges(ref: dict, got: dict, dtypes: dict, tol) -> str | None:
    """Why `got` is not `ref` within tolerance, or None."""
    for oid, want in ref.items():
        if oid not in got:
            return f"output {oid} is gone"
        have = got[oid]
        if have.shape != want.shape:
            return f"output {oid} has shape {have.shape}, uncompiled {want.shape}"
        atol, rtol = _tol(dtypes[oid], tol)
        w, h = want.astype(np.float64), have.astype(np.float64)
        bad = ~np.isclose(h, w, rtol=rtol, atol=atol, equal_nan=True)
        if bad.any():
            i = np.unravel_index(int(np.argmax(bad)), bad.shape)
            err = float(np.nanmax(np.abs(h - w) * bad))
            return (f"output {oid}: {int(bad.sum())} of {bad.size} elements differ (max error {err:.4g}; at index "
                    f"{tuple(int(j) for j in i)}: {h[i]:.6g}, uncompiled {w[i]:.6g}; atol={atol}, rtol={rtol})")
    return None


def _attempt(graph, run, ref, dtypes, tol) -> tuple[str | None, object]:
    """Runs `run(graph)` then the graph; returns (why it diverges or None, what run returned)."""
    try:
        out = run(graph)
    except Exception as e:  # a pass that raises is a culprit too
        return f"the pass raised {type(e).__name__}: {e}", None
    try:
        got = _outputs(graph)
    except Exception as e:
        return f"running the graph raised {type(e).__name__}: {e}", out
    return _diverges(ref, got, dtypes, tol), out


# ---- the report ------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class BisectReport:
    """`ok`: every pass kept the outputs within tolerance. Otherwise `step` (the pass's place in the pipeline),
    `reason`, `match` (the first match that diverges, for a Python rewrite: its rule, root and bound nodes, of
    `matches` in that pass), `replaced` ({old node: its replacement or None}) and `dot` (that subgraph before and
    after, Graphviz source)."""

    ok: bool
    steps: int  # passes run
    step: str | None = None
    reason: str | None = None
    match: Match | None = None
    match_index: int | None = None  # 1-based, of `matches`
    matches: int = 0
    replaced: dict = dataclasses.field(default_factory=dict)
    dot: str | None = None

    def __str__(self):
        if self.ok:
            return (f"bisect: all {self.steps} passes keep the outputs equal to the uncompiled graph's "
                    "(within tolerance)")
        lines = [f"bisect: the first pass whose result diverges is {self.step}", f"  {self.reason}"]
        if self.match is not None:
            lines.append(f"  at match {self.match_index} of {self.matches}: {self.match}")
        if self.replaced:
            shown = list(self.replaced.items())[:20]
            pairs = [f"{o} -> {n}" if n is not None else f"{o} (removed)" for o, n in shown]
            lines.append("  replaced: " + ", ".join(pairs) + (" ..." if len(self.replaced) > 20 else ""))
        return "\n".join(lines)

    def display(self, path: str | None = None, fmt: str = "svg") -> str | None:
        """Renders the culprit's subgraph (before and after) with Graphviz; returns the file (the .dot source
        without Graphviz), or None when nothing diverged."""
        if self.dot is None:
            return None
        path = path or os.path.join(tempfile.gettempdir(), f"luminal_bisect_{id(self)}.{fmt}")
        exe = shutil.which("dot")
        if exe is None:
            path = os.path.splitext(path)[0] + ".dot"
            with open(path, "w") as f:
                f.write(self.dot)
            return path
        subprocess.run([exe, f"-T{fmt}", "-o", path], input=self.dot.encode(), check=True)
        return path


def _region(g, roots, stop=(), depth=2) -> list[int]:
    """`roots` and their producers up to `depth` edges back, not past the nodes in `stop`."""
    seen, frontier = set(roots), list(roots)
    for _ in range(depth):
        nxt = []
        for i in frontier:
            if i in stop:
                continue
            for e in g.node(i).inputs:
                if e.node not in seen:
                    seen.add(e.node)
                    nxt.append(e.node)
        frontier = nxt
    return sorted(seen)


def _cluster(g, nodes, key, label) -> str:
    lines = [f"  subgraph cluster_{key} {{", f'    label="{_esc(label)}";']
    keep = set(nodes)
    for i in nodes:
        n = g.node(i)
        if not n.alive:
            continue
        lines.append(f'    {key}{i} [label="node {i}: {_label(n)}"];')
        for e in n.inputs:
            if e.node in keep:
                lines.append(f"    {key}{e.node} -> {key}{i};")
    return "\n".join(lines) + "\n  }\n"


def _dot(before, after, removed, added, stop=()) -> str:
    b = _region(before._g, removed, stop)
    a = _region(after._g, added, stop, depth=1)
    return ('digraph bisect {\n  node [shape=box, style=rounded, fontname=Helvetica, fontsize=10];\n' +
            _cluster(before._g, b, "b", "before the pass") + _cluster(after._g, a, "a", "after the pass") + "}\n")


def _changes(before, after) -> tuple[dict, list[int]]:
    """({node alive before and not after: its replacement or None}, [nodes alive after and not before])."""
    was, now = set(before._g.topo_order()), set(after._g.topo_order())
    replaced = {}
    for i in sorted(was - now):
        r = after._g.resolve(i)
        replaced[i] = r if r != i else None
    return replaced, sorted(now - was)


# ---- bisect ----------------------------------------------------------------------------------------------------------
def bisect(graph, compilers, inputs=None, tol=None) -> BisectReport:
    """Runs `compilers` on a copy of `graph` one pass at a time and reports the first pass (and rewrite) whose
    outputs diverge from the uncompiled graph's beyond tolerance. The graph itself is left as it is.

    graph: an uncompiled Graph with outputs (or a function returning one). inputs: {Tensor, input name or node id:
    array}, added to the data already set. tol: None (per output dtype: float32 atol 1e-4 rtol 1e-3, 16-bit floats
    1e-2 and more, integers exact), a number (both) or (atol, rtol)."""
    if callable(graph) and not isinstance(graph, Graph):
        graph = graph()
    if not isinstance(graph, Graph):
        raise TypeError(f"bisect needs a luminal.Graph (or a function returning one), got {type(graph).__name__}")
    if graph.compilers:
        raise ValueError("bisect needs the graph before compilation (it compares every pass with it); this one was "
                         f"compiled with {[_name(c) for c in graph.compilers]}")
    if not graph._g.outputs():
        raise ValueError("bisect: the graph has no outputs (mark them with .output())")
    compilers = list(compilers) if isinstance(compilers, (list, tuple)) else [compilers]
    base = graph.copy()
    for key, arr in (inputs or {}).items():
        base._set_input(_input_id(base, key), arr)
    ref_graph = base.copy()
    ref = _outputs(ref_graph)
    dtypes = {oid: base._g.node(oid).dtype for oid in ref}

    work, steps = base.copy(), 0
    remap = _comp.Remap(work)
    for k, c in enumerate(compilers):
        walk = _walk(c, work, remap, f"compilers[{k}]", " ")
        while True:
            before = work.copy()
            try:
                step, n = next(walk)
            except StopIteration:
                break
            except Exception as e:  # the pass raised: name it
                return BisectReport(False, steps + 1, _walk.current.path, f"the pass raised {type(e).__name__}: {e}")
            steps += 1
            if n == 0 and isinstance(step.leaf, _comp._CorePass):
                continue  # a built-in pass that changed nothing (its count is exact; a user's may not be)
            why, _ = _attempt(work, lambda g: None, ref, dtypes, tol)
            if why is not None:
                return _blame(step, steps, before, work, ref, dtypes, tol, why)
        work.compilers.append(c)  # as Graph.compile does (a later compiler may read an earlier one's results)
    return BisectReport(True, steps)


def _blame(step, steps, before, after, ref, dtypes, tol, why) -> BisectReport:
    """Narrows a diverging pass to its first diverging match (Python rewrites), and describes what it replaced."""
    replaced, added = _changes(before, after)
    report = BisectReport(False, steps, step.path, why, replaced=replaced)
    trial = before.copy()
    _, matches = _run_leaf(step.leaf, trial)  # the pass again, recording its matches
    report.matches = len(matches)
    if matches:
        lo, hi = 1, len(matches)  # the smallest k whose first k matches diverge
        while lo < hi:
            mid = (lo + hi) // 2
            why_k, _ = _attempt(before.copy(), lambda g: _run_leaf(step.leaf, g, mid), ref, dtypes, tol)
            if why_k is None:
                lo = mid + 1
            else:
                hi = mid
        prefix = before.copy()
        _run_leaf(step.leaf, prefix, lo - 1)
        one = before.copy()
        why_k, out = _attempt(one, lambda g: _run_leaf(step.leaf, g, lo), ref, dtypes, tol)
        if why_k is not None and out and len(out[1]) == lo:
            m = out[1][-1]
            report.match, report.match_index, report.reason = m, lo, why_k
            report.replaced = {m.root: m.replacement}
            report.dot = _dot(prefix, one, [m.root], [m.replacement], stop=set(m.bound.values()))
            return report
    report.dot = _dot(before, after, list(replaced)[:40], added[:40])
    return report


def _input_id(graph, key) -> int:
    if hasattr(key, "id") and not isinstance(key, int):
        return key.id
    if isinstance(key, str):
        ids = [i for i in graph._g.topo_order() if graph._g.node(i).op == "Input" and graph._g.node(i).name == key]
        if not ids:
            raise KeyError(f"bisect: no input named '{key}'")
        return ids[0]
    return int(key)


# ---- saving a graph --------------------------------------------------------------------------------------------------
def _edge(e) -> dict:
    v = e.view
    return {"node": e.node, "shape": [str(d) for d in v.shape], "strides": [str(d) for d in v.strides],
            "offset": str(v.offset), "mask": [[str(lo), str(hi)] for lo, hi in v.mask]}


def save(graph, path: str) -> str:
    """Writes an uncompiled graph with its input data and dims to `path` (.npz), for `python -m luminal.bisect`."""
    g = graph._g
    nodes = []
    for i in range(len(g)):
        n = g.node(i)
        if not n.alive:
            nodes.append({"op": "Dead"})
            continue
        if n.op == "Custom":
            raise ValueError(f"save: node {i} is a backend op ({n.name}); save the graph before compiling it")
        d = {"op": n.op, "dtype": n.dtype, "inputs": [_edge(e) for e in n.inputs]}
        if n.op == "Input":
            d.update(shape=[str(s) for s in n.shape], name=n.name)
        elif n.op == "Constant":
            d["value"] = n.value
        elif n.op in ("SumReduce", "MaxReduce"):
            d["axis"] = n.axis
        elif n.op == "Iota":
            d.update(expr=str(n.expr), n=str(n.shape[0]))
        nodes.append(d)
    meta = {"version": 1, "nodes": nodes, "dims": graph._dims}
    arrays = {f"input_{k}": (v if isinstance(v, np.ndarray) else v.numpy()) for k, v in graph._data.items()}
    with open(path, "wb") as f:
        np.savez(f, graph=np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays)
    return path


def load(path: str) -> Graph:
    """A graph written by `save`, with its data and dims (the same node ids)."""
    with np.load(path) as z:
        meta = json.loads(bytes(z["graph"]).decode())
        arrays = {int(k[len("input_"):]): z[k] for k in z.files if k.startswith("input_")}
    graph = Graph()
    g = graph._g

    def edge(d):
        mask = [(_core.to_expr(lo), _core.to_expr(hi)) for lo, hi in d["mask"]]
        return _core.Edge(d["node"], _core.View.from_parts([_core.to_expr(s) for s in d["shape"]],
                                                           [_core.to_expr(s) for s in d["strides"]],
                                                           _core.to_expr(d["offset"]), mask))

    for i, d in enumerate(meta["nodes"]):
        o, ins = d["op"], [edge(e) for e in d.get("inputs", [])]
        if o == "Dead":
            nid = g.constant(0.0, "float32")
            g.remove(nid)
        elif o == "Input":
            nid = g.input([_core.to_expr(s) for s in d["shape"]], d["dtype"], d["name"])
        elif o == "Constant":
            nid = g.constant(d["value"], d["dtype"])
        elif o == "Output":
            nid = g.output(ins[0])
        elif o in ("SumReduce", "MaxReduce"):
            nid = g.reduce(o, ins[0], d["axis"])
        elif o == "Iota":
            nid = g.iota(_core.to_expr(d["expr"]), _core.to_expr(d["n"]))
        elif o == "Gather":
            nid = g.gather(*ins)
        elif o == "Scatter":
            nid = g.scatter(*ins)
        elif o == "Cast":
            nid = g.cast(ins[0], d["dtype"])
        elif len(ins) == 1:
            nid = g.unary(o, ins[0])
        else:
            nid = g.binary(o, *ins)
        if nid != i:
            raise ValueError(f"load: {path} is inconsistent (node {i} came back as {nid})")
    graph._data = arrays
    graph._changed = set(arrays)
    graph._dims = {k: int(v) for k, v in meta["dims"].items()}
    return graph


class _CallableModule(types.ModuleType):
    """`luminal.bisect(graph, ...)` calls `bisect`; `luminal.bisect.save` etc. are this module's."""

    def __call__(self, *args, **kwargs):
        return bisect(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule


# ---- python -m luminal.bisect ----------------------------------------------------------------------------------------
_PIPELINES = {
    "generic": lambda: [_comp.GenericCompiler()],
    "cpu": lambda: [_comp.GenericCompiler(), _comp.CPUCompiler()],
    "cuda-codegen": lambda: [_comp.GenericCompiler(), _cuda_types()[0]("float32", device=None)],
    "cuda": lambda: [_comp.GenericCompiler(), _cuda_types()[0]("float32")],
}


def _compilers_from(spec: str) -> list:
    if spec in _PIPELINES:
        return _PIPELINES[spec]()
    if ":" in spec:  # module:function returning the compilers
        import importlib

        mod, fn = spec.split(":", 1)
        got = getattr(importlib.import_module(mod), fn)()
        return list(got) if isinstance(got, (list, tuple)) else [got]
    raise ValueError(f"unknown pipeline '{spec}': one of {', '.join(_PIPELINES)} or module:function")


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m luminal.bisect", description=__doc__.split("\n\n")[0])
    p.add_argument("graph", help="a graph saved with luminal.bisect.save(graph, path)")
    p.add_argument("--compilers", default="cpu",
                   help=f"a pipeline ({', '.join(_PIPELINES)}) or module:function returning the compilers "
                        "(default cpu)")
    p.add_argument("--tol", type=float, default=None, help="atol and rtol (default: per output dtype)")
    p.add_argument("--display", metavar="PATH", help="render the culprit's subgraph here (Graphviz)")
    a = p.parse_args(argv)
    report = bisect(load(a.graph), _compilers_from(a.compilers), tol=a.tol)
    print(report)
    if a.display and report.dot:
        print("subgraph:", report.display(a.display, os.path.splitext(a.display)[1][1:] or "svg"))
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
