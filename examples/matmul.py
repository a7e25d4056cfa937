"""The canonical first example: record a matmul, compile, execute, read the result."""
import numpy as np

import luminal as lm

cx = lm.Graph()
a = cx.tensor((3, 1)).set(np.array([[1.0], [2.0], [3.0]], np.float32))
b = cx.tensor((1, 4)).set(np.array([[1.0, 2.0, 3.0, 4.0]], np.float32))
c = a.matmul(b).output()          # nothing computed yet
cx.compile(lm.GenericCompiler())  # any number of compilers, applied in order
cx.execute()
print(c.numpy())                  # (3, 4) float32
