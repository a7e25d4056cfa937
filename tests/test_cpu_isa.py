"""The CPU kernels' instruction-set levels (LUMINAL_CPU_ISA=avx2|avx512|neon|portable): the level reported and
forced, clear errors for levels the CPU lacks, the CPU kernel tests once per level the machine supports, the levels
against the reference executor and each other (AVX-512 gives AVX2's bits), and the NEON kernels cross-built for
AArch64 and run under qemu-user (tests/arm/run.sh)."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import luminal as lm
from luminal.quant import BLOCK_BYTES, QuantizedWeight, dequantize

core = lm._core
HERE = os.path.dirname(os.path.abspath(__file__))
SUPPORTED = core.supported_cpu_isas()
DEFAULT = core.cpu_isa()


def env_for_subprocess(**extra) -> dict:
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(lm.__file__)))  # this luminal, wherever it is
    env = {k: v for k, v in os.environ.items() if k not in ("LUMINAL_CPU_ISA", "LUMINAL_NO_AVX2", "LUMINAL_NO_AVX512")}
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env.update(extra)
    return env


@pytest.fixture
def level():
    """Switches the level in process for one test, restoring the previous one after."""
    before = core.cpu_isa()
    yield core._set_cpu_isa
    core._set_cpu_isa(before)


def test_level_reported():
    assert DEFAULT in SUPPORTED and SUPPORTED[-1] == "portable"
    assert set(SUPPORTED) <= {"avx512", "avx2", "neon", "portable"}
    forced = os.environ.get("LUMINAL_CPU_ISA") or ("portable" if os.environ.get("LUMINAL_NO_AVX2") else None)
    assert DEFAULT == (forced or SUPPORTED[0]) or os.environ.get("LUMINAL_NO_AVX512")  # the best unless forced
    feats = core.cpu_isa_features()
    assert set(feats) <= {"vnni", "dotprod"}
    assert "vnni" not in feats or DEFAULT == "avx512"
    assert "dotprod" not in feats or DEFAULT == "neon"
    assert core.simd() == ("avx2" if DEFAULT in ("avx2", "avx512") else "portable")  # the older name


def test_unknown_or_missing_level_raises(level):
    with pytest.raises(ValueError, match=r"unknown CPU ISA level 'sse4'.*this CPU supports: " + SUPPORTED[0]):
        level("sse4")
    missing = [x for x in ("avx512", "avx2", "neon") if x not in SUPPORTED]
    with pytest.raises(ValueError, match=rf"cannot run the '{missing[0]}' kernels \(it supports: {SUPPORTED[0]}"):
        level(missing[0])
    assert core.cpu_isa() == DEFAULT  # unchanged by the failed switches


@pytest.mark.parametrize("value,message", [("sse4", "unknown CPU ISA level 'sse4'"),
                                           ("missing", "this CPU cannot run the")])
def test_bad_environment_is_an_import_error(value, message):
    """A forced level the CPU lacks fails at import, naming it, instead of an illegal instruction later."""
    if value == "missing":
        value = [x for x in ("avx512", "avx2", "neon") if x not in SUPPORTED][0]
    r = subprocess.run([sys.executable, "-c", "import luminal"], env=env_for_subprocess(LUMINAL_CPU_ISA=value),
                       capture_output=True, text=True)
    assert r.returncode != 0 and "ImportError" in r.stderr and message in r.stderr, r.stderr[-2000:]
    assert "LUMINAL_CPU_ISA" in r.stderr


@pytest.mark.parametrize("isa", [x for x in SUPPORTED if x != DEFAULT])
def test_cpu_kernel_tests_at_each_level(isa, tmp_path):
    """tests/test_cpu_kernels.py (quantised matvec and matmul, float matmul and GEMM, fused and attention kernels)
    again with the kernels of every other level this CPU supports (this run covers the default level)."""
    code = (f"import luminal, sys; assert luminal._core.cpu_isa() == {isa!r}, luminal._core.cpu_isa(); "
            "import pytest; sys.exit(pytest.main(['-q', '-x', '-p', 'no:cacheprovider', sys.argv[1]]))")
    r = subprocess.run([sys.executable, "-c", code, os.path.join(HERE, "test_cpu_kernels.py")],
                       env=env_for_subprocess(LUMINAL_CPU_ISA=isa), capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and " failed" not in r.stdout


# ---- the levels against the reference executor and each other, in process -------------------------------------------
def random_blocks(rng, qtype: str, rows: int, cols: int) -> np.ndarray:
    nb, size = cols // 32, BLOCK_BYTES[qtype]
    raw = rng.integers(0, 256, (rows, nb, size), dtype=np.uint8)
    raw[:, :, 0:2] = rng.uniform(0.001, 0.05, (rows, nb)).astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    if qtype == "Q4_1":
        raw[:, :, 2:4] = rng.uniform(-0.2, 0.2, (rows, nb)).astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, nb * size)


def kernel_graph(rng):
    """One graph exercising every kernel family: quantised matvec (decode rows, every format, block counts with and
    without leftover groups) and matmul (prefill rows), float matvec, the packed GEMM, fused elementwise/row
    kernels with exp2, and causal attention (masked keys: exp2 of -inf in place). Returns (graph, outputs)."""
    cx = lm.Graph()
    outs = []
    for qtype, k in [("Q4_1", 576), ("Q4_0", 800), ("Q8_0", 288), ("Q4_1", 96)]:
        w = dequantize(cx, QuantizedWeight(random_blocks(rng, qtype, 19, k), qtype, (19, k)))
        for rows in (1, 3, 9):
            a = cx.tensor((rows, k)).set(rng.standard_normal((rows, k)).astype(np.float32))
            outs.append((a @ w.T).output())
    x = cx.tensor((1, 200)).set(rng.standard_normal((1, 200)).astype(np.float32))
    m = cx.tensor((37, 200)).set(rng.standard_normal((37, 200)).astype(np.float32))
    outs.append((x @ m.T).output())  # matvec
    big = cx.tensor((70, 200)).set(rng.standard_normal((70, 200)).astype(np.float32))
    outs.append((big @ m.T).softmax(-1).output())  # GEMM, then a fused softmax
    outs.append(big.silu().output())
    t, h, d = 70, 2, 24
    q, kk, v = (cx.tensor((h, t, d)).set(rng.standard_normal((h, t, d)).astype(np.float32)) for _ in range(3))
    causal = np.triu(np.full((t, t), -np.inf, np.float32), 1)
    mask = cx.tensor((t, t)).set(causal)
    scores = (q @ kk.transpose(1, 2)) * (1 / np.sqrt(d)) + mask
    outs.append((scores.softmax(-1) @ v).output())
    return cx, outs


def run_graph(seed, isa=None):
    cx, outs = kernel_graph(np.random.default_rng(seed))
    if isa is None:
        cx.compile(lm.GenericCompiler())  # the reference executor
    else:
        core._set_cpu_isa(isa)
        cx.compile(lm.GenericCompiler(), lm.CPUCompiler())
        stats = cx.stats()
        assert all(f"QMatMul{q}" in stats for q in ("Q4_0", "Q4_1", "Q8_0")) and "Attention" in stats, stats
    cx.execute()
    return [o.numpy() for o in outs]


@pytest.mark.parametrize("isa", SUPPORTED)
def test_each_level_against_the_reference_executor(isa, level, seed):
    want = run_graph(seed)
    got = run_graph(seed, isa)
    for i, (g, w) in enumerate(zip(got, want)):
        assert np.isfinite(g).all(), f"output {i}: non-finite values at {isa}"
        # Decode rows quantise activations to int8 (the reference does not): half a quantisation step per term.
        np.testing.assert_allclose(g, w, rtol=2e-2, atol=2e-2 * (np.abs(w).max() + 1), err_msg=f"output {i}, {isa}")


@pytest.mark.skipif(not {"avx512", "avx2"} <= set(SUPPORTED), reason="needs a CPU with AVX-512 and AVX2")
def test_avx512_gives_avx2_bits(level, seed):
    """The AVX-512 kernels (VNNI int8 dots, 512-bit float paths) compute the same sums in the same order as the
    AVX2 ones: identical bits, so greedy tokens do not depend on the level."""
    a = run_graph(seed, "avx2")
    b = run_graph(seed, "avx512")
    for i, (x, y) in enumerate(zip(a, b)):
        np.testing.assert_array_equal(x, y, err_msg=f"output {i}")


# ---- NEON, cross-built and emulated -------------------------------------------------------------------------------------
ARM_TOOLS = shutil.which("aarch64-linux-gnu-g++") and shutil.which("qemu-aarch64")


@pytest.mark.skipif(not ARM_TOOLS and not os.environ.get("LUMINAL_REQUIRE_ARM"),
                    reason="no aarch64 cross compiler / qemu-user (apt-get install g++-aarch64-linux-gnu qemu-user)")
def test_neon_kernels_under_qemu(tmp_path):
    """tests/arm/neon_kernels_test.cpp: every NEON kernel (with and without dotprod) against the portable one on
    random data, bit for bit for the integer dots; CI sets LUMINAL_REQUIRE_ARM where it installed the tools."""
    r = subprocess.run(["bash", os.path.join(HERE, "arm", "run.sh"), str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count(" 0 failures") == 2 and "dotprod: yes" in r.stdout and "dotprod: no" in r.stdout, r.stdout
