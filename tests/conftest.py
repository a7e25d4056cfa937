"""Fixtures for the parity suite: `backend` (one run per backend in BACKENDS), `seed` and `rng`.

Seeds: one base seed per session, from LUMINAL_TEST_SEED or random (printed in the header); each test derives its
own from the base and its node id, and failure messages name both, so any failure reruns exactly with
`LUMINAL_TEST_SEED=<base> pytest <test id>`.
"""
from __future__ import annotations

import os
import random
import sys
import zlib

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _base_seed() -> int:
    env = os.environ.get("LUMINAL_TEST_SEED")
    if env:
        return int(env)
    seed = random.SystemRandom().randrange(2**31)
    os.environ["LUMINAL_TEST_SEED"] = str(seed)  # worker processes (pytest-xdist) inherit the same base
    return seed


BASE_SEED = _base_seed()


def _float(dtype: str) -> str:
    return dtype if dtype in ("float32", "float16", "bfloat16") else "float32"


def _backends():
    # Imported lazily so that a half-edited luminal does not break collection of unrelated tests (test_expr.py).
    from helpers import NVRTC_CHECK, REFERENCE, Backend, needs_attr, needs_cuda, needs_nvrtc  # noqa: F401
    import luminal as lm  # noqa: F401

    return [
        REFERENCE,  # the default executor: no backend compiler
        Backend("cpu", lambda dtype: [lm.CPUCompiler()], needs_attr("CPUCompiler")),
        # The test's float dtype is the GPU compute dtype (integer and bool tests compute in float32).
        Backend("cuda", lambda dtype: [lm.CudaCompiler(_float(dtype))], needs_cuda),
        # Code generation without a GPU: the CUDA lowering runs on the CPU kernels, and every kernel generated is
        # compiled with NVRTC for sm_80 and sm_90 (so a codegen error fails CI, which has no GPU).
        Backend("cuda-nvrtc", lambda dtype: [lm.CudaCompiler(_float(dtype), device=None), NVRTC_CHECK], needs_nvrtc),
    ]


# Add a backend with one line in _backends() above; each gives the compilers applied after lm.GenericCompiler().
try:
    BACKENDS = _backends()
except Exception:  # pragma: no cover - luminal failed to import; the ops tests report that themselves
    BACKENDS = []


def pytest_collection_modifyitems(config, items):
    """Exhaustive sweeps (marked slow) run only with LUMINAL_SLOW=1; they are deselected, not counted as passed."""
    if os.environ.get("LUMINAL_SLOW") == "1":
        return
    slow = [it for it in items if it.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [it for it in items if not it.get_closest_marker("slow")]


def pytest_report_header(config):
    names = ", ".join(b.name for b in BACKENDS) or "none (luminal failed to import)"
    return [f"luminal test seed: LUMINAL_TEST_SEED={BASE_SEED}", f"luminal backends: {names}"]


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request):
    """The CPU backend's thread count for one test (1 and 2), restored after it."""
    import luminal as lm

    before = lm._core.num_threads()
    lm._core.set_num_threads(request.param)
    yield request.param
    lm._core.set_num_threads(before)


@pytest.fixture(scope="session", autouse=True)
def _nvrtc_flush():
    """Compiles the kernels the cuda-nvrtc backend collected and has not compiled yet, once the tests are done."""
    yield
    from helpers import NVRTC_CHECK

    NVRTC_CHECK.flush()


def _usable(b):
    reason = b.skip_reason()
    if reason:
        pytest.skip(f"backend {b.name}: {reason}")
    return b


@pytest.fixture(params=BACKENDS, ids=lambda b: b.name)
def backend(request):
    return _usable(request.param)


@pytest.fixture(params=[b for b in BACKENDS if b.name.startswith("cuda")], ids=lambda b: b.name)
def cuda_backend(request):
    """The CUDA backends alone (the GPU, and NVRTC compile checks), for tests of CUDA kernels."""
    return _usable(request.param)


@pytest.fixture
def seed(request) -> int:
    return (BASE_SEED + zlib.crc32(request.node.nodeid.encode())) % 2**32


@pytest.fixture
def rng(seed):
    from helpers import Rand

    return Rand(seed, BASE_SEED)
