"""Compiler plumbing on the Python side (filled in by the compilers issue)."""
from __future__ import annotations


class Remap:
    """Ids users hold follow rewrites automatically (the core records each replacement); compilers that replace
    nodes by hand call `replace(old, new)`."""

    def __init__(self, graph):
        self.graph = graph

    def replace(self, old: int, new: int):
        self.graph._g.replace_uses(old, new)


class GenericCompiler:
    def compile(self, graph, remap):
        pass
