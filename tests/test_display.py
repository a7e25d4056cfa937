"""Graph display: `to_dot()` (Graphviz DOT source) and `display()` (renders with `dot`, or writes the .dot source
and says how to install Graphviz). The DOT checks use a small parser of the DOT grammar below, so they need no
Graphviz; where a real `dot` is installed, one test also renders with it."""
from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest

import luminal as lm
from luminal import display as ldisplay
from luminal.compiler import CustomOp, any_, op, rewrite


# ---- a DOT parser (https://graphviz.org/doc/info/lang.html), enough to reject what dot would reject ----------------
_TOKEN = re.compile(r"""
    (?P<ws>\s+|//[^\n]*|/\*.*?\*/|^\#[^\n]*)
  | (?P<edgeop>->|--)
  | (?P<punct>[{}\[\];,=:])
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<num>-?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?))
  | (?P<id>[A-Za-z_\x80-\uffff][A-Za-z_0-9\x80-\uffff]*)
""", re.S | re.X | re.M)
KEYWORDS = {"strict", "graph", "digraph", "node", "edge", "subgraph"}


def tokenize(src: str):
    out, pos = [], 0
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if not m:
            raise SyntaxError(f"DOT: bad character {src[pos]!r} at {pos}: ...{src[max(0, pos - 40):pos + 40]!r}")
        pos = m.end()
        kind = m.lastgroup
        if kind == "ws":
            continue
        text = m.group()
        if kind == "id" and text.lower() in KEYWORDS:
            kind = "kw"
        out.append((kind, text.lower() if kind == "kw" else text))
    return out


class DotGraph:
    def __init__(self):
        self.nodes: dict[str, dict] = {}  # id -> attrs (merged)
        self.edges: list[tuple[str, str, dict]] = []
        self.subgraphs: list[str | None] = []
        self.graph_attrs: list[dict] = []


class DotParser:
    """Recursive descent over the DOT grammar; raises SyntaxError on anything dot would not accept."""

    def __init__(self, src):
        self.toks, self.i, self.g = tokenize(src), 0, DotGraph()

    def peek(self, k=0):
        return self.toks[self.i + k] if self.i + k < len(self.toks) else (None, None)

    def take(self, kind=None, text=None):
        t = self.peek()
        if t[0] is None or (kind and t[0] != kind) or (text and t[1] != text):
            ctx = " ".join(x[1] for x in self.toks[max(0, self.i - 6):self.i + 6])
            raise SyntaxError(f"DOT: expected {text or kind}, got {t[1]!r} (token {self.i}) near: {ctx}")
        self.i += 1
        return t

    def is_id(self, k=0):
        return self.peek(k)[0] in ("id", "string", "num")

    def take_id(self):
        if not self.is_id():
            self.take("id")
        kind, text = self.take()
        if kind == "string":
            text = text[1:-1].replace('\\"', '"')
        return text

    def parse(self) -> DotGraph:
        if self.peek()[1] == "strict":
            self.take()
        if self.peek()[1] not in ("graph", "digraph"):
            self.take("kw", "digraph")
        self.directed = self.take()[1] == "digraph"
        if self.is_id():
            self.take_id()
        self.take("punct", "{")
        self.stmt_list()
        self.take("punct", "}")
        if self.i != len(self.toks):
            raise SyntaxError(f"DOT: trailing tokens after the graph: {self.toks[self.i:self.i + 5]}")
        return self.g

    def stmt_list(self):
        while self.peek()[1] != "}" and self.peek()[0] is not None:
            self.stmt()
            if self.peek()[1] == ";":
                self.take()

    def attr_list(self) -> dict:
        attrs = {}
        while self.peek()[1] == "[":
            self.take()
            while self.peek()[1] != "]":
                k = self.take_id()
                self.take("punct", "=")
                attrs[k] = self.take_id()
                if self.peek()[1] in (",", ";"):
                    self.take()
            self.take("punct", "]")
        return attrs

    def stmt(self):
        kind, text = self.peek()
        if kind == "kw" and text in ("graph", "node", "edge"):
            self.take()
            self.g.graph_attrs.append(self.attr_list())
            return
        if kind == "kw" and text == "subgraph" or text == "{":
            first = self.subgraph()
            if self.peek()[0] == "edgeop":
                self.edge_rhs(first, {})
            return
        if self.is_id() and self.peek(1)[1] == "=":
            k = self.take_id()
            self.take()
            self.g.graph_attrs.append({k: self.take_id()})
            return
        nid = self.node_id()
        if self.peek()[0] == "edgeop":
            self.edge_rhs([nid], None)
        else:
            self.g.nodes.setdefault(nid, {}).update(self.attr_list())

    def node_id(self):
        nid = self.take_id()
        if self.peek()[1] == ":":
            self.take()
            self.take_id()
            if self.peek()[1] == ":":
                self.take()
                self.take_id()
        return nid

    def edge_rhs(self, left, _):
        chain = [left]
        while self.peek()[0] == "edgeop":
            op_ = self.take()[1]
            if op_ != ("->" if self.directed else "--"):
                raise SyntaxError(f"DOT: edge op {op_} in a {'di' if self.directed else ''}graph")
            if self.peek()[1] in ("subgraph", "{"):
                chain.append(self.subgraph())
            else:
                chain.append([self.node_id()])
        attrs = self.attr_list()
        for a, b in zip(chain, chain[1:]):
            for x in a:
                for y in b:
                    self.g.edges.append((x, y, attrs))
                    self.g.nodes.setdefault(x, {})
                    self.g.nodes.setdefault(y, {})

    def subgraph(self):
        name = None
        if self.peek()[1] == "subgraph":
            self.take()
            if self.is_id():
                name = self.take_id()
        self.g.subgraphs.append(name)
        before = set(self.g.nodes)
        self.take("punct", "{")
        self.stmt_list()
        self.take("punct", "}")
        return [n for n in self.g.nodes if n not in before]


def parse_dot(src: str) -> DotGraph:
    return DotParser(src).parse()


def test_dot_parser_rejects_bad_dot():
    parse_dot('digraph g { a [label="x\\"y"]; a -> b; subgraph cluster_x { label="t"; c } }')
    for bad in ['digraph g { subgraph cluster_a b { } }', 'digraph g { a [label="x"] ', 'digraph { a -> }',
                'digraph g { a [label=] }', 'digraph g { a [label="x"y"] }', 'graph g { a -> b }']:
        with pytest.raises(SyntaxError):
            parse_dot(bad)


# ---- graphs to show -------------------------------------------------------------------------------------------------
def sample_graph():
    """Inputs, constants, broadcast and padded and permuted edges, a reduction, a cast, an iota, a custom op."""
    cx = lm.Graph()
    x = cx.tensor((2, 3), name="x").set(np.arange(6, dtype=np.float32).reshape(2, 3))
    w = cx.tensor((3,), lm.float16, name="w").set(np.ones(3, np.float16))
    y = (x * 1 + w.float()).T.exp().sum(0)              # bcast edge, permuted edge, SumReduce
    z = lm.ones((2,), graph=cx).pad((1, 1)) * 2          # padded edge, constant
    r = lm.arange(4, graph=cx).float() + z               # Iota
    twice = CustomOp("Twice", lambda a: a * 2)
    y.output()
    r.output()
    h = x.half().output()                                # Cast -> float16
    return cx, twice, h


def label_of(attrs):
    return attrs.get("label", "")


def check_dot_matches_graph(dot: str, cx, prefix="n"):
    g = parse_dot(dot)
    live = cx.nodes()
    ids = {f"{prefix}{i}" for i in live}
    assert ids <= set(g.nodes), f"nodes missing from the DOT: {sorted(ids - set(g.nodes))}"
    for i in live:
        n = cx.node(i)
        label = label_of(g.nodes[f"{prefix}{i}"])
        shape = "(" + ", ".join(str(d) for d in n.shape) + ")"
        head = n.name if n.op == "Custom" else n.op
        assert head in label, f"node {i}: label {label!r} does not name its op {head}"
        assert shape in label, f"node {i}: label {label!r} does not give its shape {shape}"
        assert n.dtype in label, f"node {i}: label {label!r} does not give its dtype {n.dtype}"
    want_edges = sorted((f"{prefix}{e.node}", f"{prefix}{i}") for i in live for e in cx.node(i).inputs)
    got_edges = sorted((a, b) for a, b, _ in g.edges if a in ids or b in ids)
    assert got_edges == want_edges
    return g


# ---- to_dot ---------------------------------------------------------------------------------------------------------
def test_to_dot_is_valid_and_labels_every_node():
    cx, _, _ = sample_graph()
    dot = cx.to_dot()
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    g = check_dot_matches_graph(dot, cx)
    labels = " | ".join(label_of(a) for a in g.nodes.values())
    for want in ("Input 'x'", "Input 'w'", "Constant 1", "SumReduce(axis=0)", "Cast -> float16", "Iota(", "Output"):
        assert want in labels, f"{want!r} not in {labels}"


def test_to_dot_marks_views_on_edges():
    cx, _, _ = sample_graph()
    g = parse_dot(cx.to_dot())
    edge_labels = [a.get("label", "") for _, _, a in g.edges]
    assert any("bcast" in lab for lab in edge_labels), edge_labels
    assert any("pad" in lab for lab in edge_labels), edge_labels
    assert any(lab.startswith("view") and "bcast" not in lab and "pad" not in lab for lab in edge_labels)
    # plain edges carry no label
    assert any(lab == "" for lab in edge_labels)


def test_to_dot_after_compile_and_with_custom_ops():
    cx, twice, _ = sample_graph()

    class TwiceCompiler:
        def compile(self, graph, remap):
            return rewrite(graph, op("Exp2", any_("x")), lambda g, m: twice(g, m["x"]))

    cx.compile(lm.GenericCompiler(), TwiceCompiler())
    g = check_dot_matches_graph(cx.to_dot(), cx)
    assert any(label_of(a).startswith("Twice") for a in g.nodes.values())
    assert not any(label_of(a).startswith("Exp2") for a in g.nodes.values())


def test_to_dot_title_and_symbolic_shapes():
    cx = lm.Graph()
    x = cx.tensor(("s", 4), name="tokens")
    x.mean(-1).output()
    dot = cx.to_dot(title="my graph")
    g = check_dot_matches_graph(dot, cx)
    assert {"label": "my graph"} in g.graph_attrs
    assert any("(s, 4)" in label_of(a) for a in g.nodes.values())


def test_to_dot_of_empty_graph():
    g = parse_dot(lm.Graph().to_dot())
    assert g.nodes == {} and g.edges == []


@pytest.mark.parametrize("where", ["input name", "title"])
def test_to_dot_escapes_quotes(where):
    cx = lm.Graph()
    x = cx.tensor((2,), name='a"b' if where == "input name" else "x")
    (x * 2).output()
    g = parse_dot(cx.to_dot(title='say "hi"' if where == "title" else None))
    if where == "title":  # parses (as label="say ", a node hi, a node ""), but the title is lost
        assert {"label": 'say "hi"'} in g.graph_attrs and set(g.nodes) == {f"n{i}" for i in cx.nodes()}
    else:
        assert "Input 'a\"b'" in label_of(g.nodes[f"n{x.id}"])


# ---- display --------------------------------------------------------------------------------------------------------
def test_display_without_graphviz_writes_dot_and_says_how_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ldisplay.shutil, "which", lambda name: None)
    cx, _, _ = sample_graph()
    out = cx.display(str(tmp_path / "g.svg"))
    assert out == str(tmp_path / "g.dot")
    text = open(out).read()
    check_dot_matches_graph(text, cx)
    msg = capsys.readouterr().out
    assert "not installed" in msg and "graphviz" in msg.lower() and "apt-get install graphviz" in msg
    assert str(tmp_path / "g.dot") in msg


def test_display_default_path_without_graphviz(monkeypatch, capsys):
    monkeypatch.setattr(ldisplay.shutil, "which", lambda name: None)
    cx, _, _ = sample_graph()
    out = cx.display()
    try:
        assert out.endswith(".dot") and os.path.exists(out)
        parse_dot(open(out).read())
    finally:
        os.remove(out)


FAKE_DOT = """#!{python}
import sys
args = sys.argv[1:]
out = args[args.index("-o") + 1]
with open(out + ".args", "w") as f:
    f.write(" ".join(args))
with open(out, "wb") as f:
    f.write(sys.stdin.buffer.read())
"""


@pytest.fixture
def fake_dot(tmp_path, monkeypatch):
    """A `dot` on PATH that copies its stdin to the -o file (and records its arguments beside it)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "dot"
    exe.write_text(FAKE_DOT.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    monkeypatch.setenv("PATH", str(bindir) + os.pathsep + os.environ.get("PATH", ""))
    assert shutil.which("dot") == str(exe)
    return exe


@pytest.mark.parametrize("fmt", ["svg", "png"])
def test_display_with_dot_renders_file(tmp_path, fake_dot, fmt):
    cx, _, _ = sample_graph()
    path = str(tmp_path / f"graph.{fmt}")
    assert cx.display(path, fmt=fmt) == path
    assert os.path.exists(path)
    check_dot_matches_graph(open(path).read(), cx)
    assert f"-T{fmt}" in open(path + ".args").read().split()


def test_display_after_compile_shows_before_and_after(tmp_path, fake_dot):
    cx = lm.Graph()
    x = cx.tensor((2, 3), name="x")
    ((x * 1 + 0) * (lm.full((2, 3), 2.0, graph=cx) * 3)).exp().output()
    before_ops = {cx.node(i).op for i in cx.nodes()}
    cx.compile(lm.GenericCompiler())
    path = cx.display(str(tmp_path / "g.svg"))
    src = open(path).read()
    assert 'label="before compile"' in src and 'label="after compile"' in src
    before, after = src.split('label="after compile"')
    # nodes the compiler removed appear only before; both halves show the input
    assert "Input 'x'" in before and "Input 'x'" in after
    assert before.count("Mul") > after.count("Mul")
    assert "Constant 6" in after and "Constant 6" not in before  # the folded 2 * 3
    assert before_ops >= {"Mul", "Add", "Exp2"}
    # compare=False: only the graph as it is now
    flat = open(cx.display(str(tmp_path / "now.svg"), compare=False)).read()
    assert "before compile" not in flat
    check_dot_matches_graph(flat, cx)


def test_display_after_compile_is_valid_dot(tmp_path, fake_dot):
    cx = lm.Graph()
    x = cx.tensor((2, 3), name="x")
    (x * 1 + 1).output()
    cx.compile(lm.GenericCompiler())
    g = parse_dot(open(cx.display(str(tmp_path / "g.svg"))).read())
    assert len([s for s in g.subgraphs if s and s.startswith("cluster")]) == 2


def test_display_of_large_graph_shows_only_after(tmp_path, fake_dot):
    """Graphs of 2000+ nodes keep no before-compile snapshot (it would be unreadable): display shows the graph."""
    cx = lm.Graph()
    x = cx.tensor((2,), name="x")
    y = x
    for _ in range(700):
        y = y * 1 + 1
    y.output()
    assert len(cx) > 2000
    cx.compile(lm.GenericCompiler())
    src = open(cx.display(str(tmp_path / "g.svg"))).read()
    assert "before compile" not in src
    check_dot_matches_graph(src, cx)


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' is not installed")
def test_real_graphviz_renders(tmp_path):
    cx, _, _ = sample_graph()
    path = cx.display(str(tmp_path / "g.svg"), compare=False)
    assert open(path).read().lstrip().startswith(("<?xml", "<svg"))
    subprocess.run([shutil.which("dot"), "-Tcanon"], input=cx.to_dot().encode(), check=True, capture_output=True)
