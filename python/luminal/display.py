"""Graphviz views of a graph: nodes labelled with op, shape and dtype; edges with their view when it is not plain."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from . import _core

_COLORS = {"Input": "#cfe8ff", "Output": "#ffe2b8", "Constant": "#eeeeee", "Iota": "#eeeeee", "Custom": "#d8f5d0"}


def _esc(text) -> str:
    """Text for a double-quoted DOT string (our labels use \\n for line breaks, added after escaping)."""
    return str(text).replace("\\", "\\\\").replace('"', '\\"')


def _label(n) -> str:
    shape = "(" + ", ".join(str(d) for d in n.shape) + ")"
    head = n.name if n.op in ("Custom", "Input") else n.op
    if n.op == "Constant":
        head = f"Constant {n.value:g}"
    elif n.op in ("SumReduce", "MaxReduce"):
        head = f"{n.op}(axis={n.axis})"
    elif n.op == "Iota":
        head = f"Iota({n.expr})"
    elif n.op == "Cast":
        head = f"Cast -> {n.dtype}"
    elif n.op == "Input":
        head = f"Input '{n.name}'"
    return f"{_esc(head)}\\n{_esc(shape)} {n.dtype}"


def to_dot(graph, title: str | None = None, prefix: str = "n") -> str:
    """The graph as Graphviz DOT source."""
    return "digraph luminal {\n" + _body(graph, title, prefix) + "}\n"


def _body(graph, title, prefix) -> str:
    g = graph._g
    lines = ["  rankdir=TB; node [shape=box, style=\"rounded,filled\", fontname=Helvetica, fontsize=10];"]
    if title:
        lines.append(f'  label="{_esc(title)}"; labelloc=t;')
    for i in g.topo_order():
        n = g.node(i)
        lines.append(f'  {prefix}{i} [label="{_label(n)}", fillcolor="{_COLORS.get(n.op, "white")}"];')
        for e in n.inputs:
            attrs = ""
            if not _core.is_plain(g, e):
                v = e.view
                desc = "view " + "(" + ", ".join(str(d) for d in v.shape) + ")"
                if any(str(s) == "0" for s in v.strides):
                    desc += " bcast"
                if v.has_mask():
                    desc += " pad"
                attrs = f' [label="{desc}", fontsize=8, style=dashed]'
            lines.append(f"  {prefix}{e.node} -> {prefix}{i}{attrs};")
    return "\n".join(lines) + "\n"


def compare_dot(graph) -> str:
    """The graph before its last compile and now, side by side."""

    def cluster(key, label, body):
        return f"  subgraph cluster_{key} {{\n    label=\"{label}\";\n{body}  }}\n"

    return ("digraph luminal {\n" + cluster("before", "before compile", graph._dot_before_compile) +
            cluster("after", "after compile", _body(graph, None, "a")) + "}\n")


def snapshot(graph) -> str:
    """Recorded by Graph.compile so display() can show what compilation changed."""
    return _body(graph, None, "b")


def display(graph, path: str | None = None, fmt: str = "svg", compare: bool = True) -> str:
    """Renders the graph (beside its state before the last compile, if there was one) with Graphviz `dot`.
    Returns the written file's path; without `dot` installed, writes the .dot source and says how to get it."""
    dot = compare_dot(graph) if compare and graph._dot_before_compile else to_dot(graph)
    path = path or os.path.join(tempfile.gettempdir(), f"luminal_graph_{id(graph)}.{fmt}")
    exe = shutil.which("dot")
    if exe is None:
        src = os.path.splitext(path)[0] + ".dot"
        with open(src, "w") as f:
            f.write(dot)
        print(f"Graphviz 'dot' is not installed, so wrote the DOT source to {src}. Install it (e.g. "
              f"'apt-get install graphviz' or 'brew install graphviz') to render {fmt.upper()}.")
        return src
    subprocess.run([exe, f"-T{fmt}", "-o", path], input=dot.encode(), check=True)
    return path
