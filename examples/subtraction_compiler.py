"""A compiler written in Python. The primitive set has no subtract, so `a - b` records as add(a, mul(b, -1));
this compiler finds that pattern and replaces it with a custom `Subtract` op that has its own CPU kernel."""
import numpy as np

import luminal as lm
from luminal.compiler import CustomOp, any_, const, op, rewrite

SUBTRACT = CustomOp("Subtract", lambda a, b: a - b)


class SubtractionCompiler:
    def compile(self, graph, remap):
        pattern = op("Add", any_("a"), op("Mul", any_("b"), const(-1)))
        return rewrite(graph, pattern, lambda g, m: SUBTRACT(g, m["a"], m["b"]), name="a + b*-1 -> Subtract")


if __name__ == "__main__":
    cx = lm.Graph()
    a = cx.tensor((2, 3)).set(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = cx.tensor((3,)).set(np.array([1.0, 10.0, 100.0], np.float32))
    c = (a - b).output()
    before = len(cx)
    cx.compile(lm.GenericCompiler(), SubtractionCompiler(), lm.GenericCompiler())
    cx.execute()
    print(f"nodes: {before} -> {len(cx)}  ops: {cx.stats()}")
    print(c.numpy())
