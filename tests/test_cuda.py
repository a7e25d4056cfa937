"""The CUDA backend's runtime: library loading and errors, NVRTC compilation and its cache (these need no GPU), and
on a GPU, device arrays, data that stays on the device, and the compute dtype. The op and LLM parity suites run on
the `cuda` backend through conftest's backend list; `cuda-nvrtc` compiles every kernel they generate without a GPU."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import luminal as lm
from helpers import needs_cuda, needs_nvrtc

PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")

nvrtc = pytest.mark.skipif(needs_nvrtc() is not None, reason=str(needs_nvrtc()))
gpu = pytest.mark.skipif(needs_cuda() is not None, reason=str(needs_cuda()))


def _in_subprocess(code: str, **env) -> str:
    """Runs code in a fresh interpreter (libraries are opened once per process) and returns its stdout."""
    e = dict(os.environ, PYTHONPATH=PY + os.pathsep + os.environ.get("PYTHONPATH", ""), **env)
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_bad_driver_path_gives_a_clear_reason_and_error():
    out = _in_subprocess(
        "import luminal as lm\n"
        "ok, why = lm.cuda_available()\n"
        "print(ok); print(why)\n"
        "g = lm.Graph(); x = g.tensor((3,)); (x + 1).output()\n"
        "try:\n"
        "    g.compile(lm.GenericCompiler(), lm.CudaCompiler())\n"
        "except lm.CudaError as e:\n"
        "    print('CudaError:', e)\n",
        LUMINAL_LIBCUDA="/no/such/dir/libcuda.so.1")
    assert out.startswith("False\n")
    assert "/no/such/dir/libcuda.so.1" in out and "cannot open the CUDA driver library" in out
    assert "CudaError: cannot open the CUDA driver library" in out


def test_bad_nvrtc_path_gives_a_clear_error():
    out = _in_subprocess(
        "import luminal as lm\n"
        "try:\n"
        "    lm.cuda.compile_source('__global__ void f() {}', 90)\n"
        "except lm.CudaError as e:\n"
        "    print('CudaError:', e)\n",
        LUMINAL_NVRTC="/no/such/libnvrtc.so.13")
    assert "CudaError: cannot open NVRTC" in out and "/no/such/libnvrtc.so.13" in out


@nvrtc
def test_compile_error_carries_the_log_and_the_source():
    src = 'extern "C" __global__ void broken(float* x) { x[0] = undefined_name; }\n'
    with pytest.raises(lm.CudaError) as e:
        lm.cuda.compile_source(src, 90)
    msg = str(e.value)
    assert "undefined_name" in msg and "identifier" in msg  # NVRTC's log
    assert "1\textern \"C\" __global__ void broken" in msg  # the numbered source


@nvrtc
def test_compiled_kernels_are_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("LUMINAL_CACHE", str(tmp_path))
    src = 'extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }\n// %s\n' % tmp_path
    cubin, hit = lm._core.cuda_compile(src, 80)
    assert not hit and cubin[:4] == b"\x7fELF"
    cubin2, hit2 = lm._core.cuda_compile(src, 80)
    assert hit2 and cubin2 == cubin
    assert len(list(tmp_path.glob("*.cubin"))) == 1
    _, hit3 = lm._core.cuda_compile(src, 90)  # another arch is another entry
    assert not hit3


@nvrtc
def test_codegen_without_a_gpu_covers_every_op(rng):
    g = lm.Graph()
    x = g.tensor((4, "s"), name="x")
    idx = g.tensor((3,), lm.int32, name="idx")
    w = g.tensor((5, 4), lm.bfloat16, name="w")
    y = (x.softmax(-1).sum(0) + lm.arange(0, "s", graph=g).to(lm.float32)).output()
    z = (x.T @ w.to(lm.float32).T).max(0).output()
    e = w[idx].to(lm.float16).output()
    g.compile(lm.GenericCompiler(), c := lm.CudaCompiler("float16", device=None))
    sched = c.schedule
    assert g._runtime is None  # nothing to run on
    assert len(sched.kernels()) >= 4 and not sched.host_steps()
    assert sched.storage_dtype(x.id) == "float16" and sched.storage_dtype(idx.id) == "int32"
    for arch in (80, 90):
        assert lm.cuda.compile_source(sched.source, arch)[:4] == b"\x7fELF"
    del y, z, e


def test_compiler_rejects_a_non_float_compute_dtype():
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        lm.CudaCompiler("int32")


# ---- on a GPU --------------------------------------------------------------------------------------------------------
@gpu
def test_device_array_round_trip(rng):
    for d, arr in [("float32", rng.data((3, 5)).astype(np.float32)), ("int32", rng.integers(-9, 9, (7,))),
                   ("bool", rng.bools((2, 2))), ("float16", rng.data((4,)).astype(np.float16))]:
        a = lm._core.cuda_upload(arr, d)
        assert a.shape == arr.shape and a.dtype == d
        np.testing.assert_array_equal(a.numpy(), arr)


@gpu
def test_outputs_stay_on_the_device_until_read_and_feed_back(rng):
    g = lm.Graph()
    x = g.tensor((2, "n"), name="x")
    y = (x * 2 + 1).output()
    g.compile(lm.GenericCompiler(), lm.CudaCompiler())
    a = rng.data((2, 3)).astype(np.float32)
    x.set(a)
    g.execute()
    r = y.result()
    assert isinstance(r, lm.DeviceArray) and r.shape == (2, 3)
    x.set(r)  # fed back without a copy
    g.execute()
    np.testing.assert_allclose(y.numpy(), (a * 2 + 1) * 2 + 1, rtol=1e-6)
    x.set(np.ones((2, 5), np.float32))  # a new size re-plans
    g.execute()
    np.testing.assert_array_equal(y.numpy(), np.full((2, 5), 3, np.float32))


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_compute_dtype_rounds_float32_inputs_once(dtype, rng):
    g = lm.Graph()
    x = g.tensor((64,), name="x")
    y = (x * 1).output()  # identities fold away: a plain copy of the stored input
    z = (x + 0.5).output()
    g.compile(lm.GenericCompiler(), c := lm.CudaCompiler(dtype))
    assert c.schedule.storage_dtype(x.id) == dtype
    a = rng.data((64,)).astype(np.float32)
    x.set(a)
    g.execute()
    from helpers import as_dtype

    want = as_dtype(a, dtype).astype(np.float32)
    assert y.numpy().dtype == np.float32
    np.testing.assert_array_equal(y.numpy(), want)
    np.testing.assert_allclose(z.numpy(), want + 0.5, rtol=1e-6)
