"""The CUDA backend's runtime: library loading and errors, NVRTC compilation and its cache (these need no GPU), and
on a GPU, device arrays, data that stays on the device, and the compute dtype. The op and LLM parity suites run on
the `cuda` backend through conftest's backend list; `cuda-nvrtc` compiles every kernel they generate without a GPU."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

import luminal as lm
from helpers import check, needs_cuda, needs_nvrtc, random_quant_blocks, tiny_llama_sessions

PY = os.path.dirname(os.path.dirname(os.path.abspath(lm.__file__)))  # this luminal: a checkout's or the installed one

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
    z = (x.T @ w.to(lm.float32).T).amax(0).output()
    e = w[idx].to(lm.float16).output()
    g.compile(lm.GenericCompiler(), c := lm.CudaCompiler("float16", device=None))
    sched = c.schedule
    assert g._runtime is None  # nothing to run on
    assert len(sched.kernels()) >= 4 and not sched.host_steps()
    assert sched.storage_dtype(x.id) == "float16" and sched.storage_dtype(idx.id) == "int32"  # x: a matmul operand
    assert sched.storage_dtype(w.id) == "bfloat16"  # not a float32 input: stays as it is
    for arch in (80, 90):
        assert lm.cuda.compile_source(sched.source, arch)[:4] == b"\x7fELF"
    del y, z, e


@pytest.mark.parametrize("dtype, fast", [("bfloat16", ["wgmma256", "wgmma128", "gemm128", "gemm64", "cublas", "mma"]),
                                         ("float32", ["tiled"])])
def test_each_step_lists_its_kernel_variants(dtype, fast):
    """Variants are data: per op family a list in order of preference (the runtime takes the first that applies to
    the evaluated views); the last always applies."""
    g = lm.Graph()
    a, b = g.tensor((2, "s", 64), name="a"), g.tensor((64, 32), name="b")
    mm = (a @ b).output()  # a batched matrix product over weights: tensor cores / tiled, matrix-vector, generic
    v = (g.tensor((5, 64), name="v").pad((1, 0)) @ g.tensor((65, 3), name="m")).output()  # padded
    r = g.tensor((8, 100), name="r").softmax(-1).output()  # row reductions: a block per row
    t = g.tensor((3, 700), name="t").sum(-1).output()  # a plain reduction: a block for few long rows, else warps
    g.compile(lm.GenericCompiler(), c := lm.CudaCompiler(dtype, device=None))
    kinds = {node: [k for k, _ in variants] for node, variants, _ in c.schedule.kernels()}
    assert [*fast, "gemv", "warps"] in kinds.values()
    assert ["block", "warps"] in kinds.values()  # the padded product (no matrix-vector kernel) and the plain sum
    assert ["block"] in kinds.values()
    assert all(ks and ks[-1] in ("warps", "elements", "block") for ks in kinds.values())
    del mm, v, r, t


_PTXAS_LOG = """ptxas info    : 11 bytes gmem
ptxas info    : Compiling entry function 'k21' for 'sm_90'
ptxas info    : Function properties for k21
    88 bytes stack frame, 84 bytes spill stores, 308 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 88 bytes cumulative stack size, 256 bytes smem
ptxas info    : Compiling entry function 'k3' for 'sm_90'
ptxas info    : Function properties for k3
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers
"""


def test_kernel_resources_reads_ptxas_and_names_the_steps():
    """benchmarks/kernel_resources.py: ptxas's report per kernel, and the steps each of a model's kernels serves
    (generated without a GPU); the nvcc run itself only where the toolkit is installed."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_resources.py"
    spec = importlib.util.spec_from_file_location("kernel_resources", path)
    kr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kr)
    assert kr.parse_ptxas(_PTXAS_LOG) == {
        "k21": {"registers": 255, "spill_stores": 84, "spill_loads": 308, "stack": 88, "smem": 256},
        "k3": {"registers": 32, "spill_stores": 0, "spill_loads": 0, "stack": 0, "smem": 0}}
    source, ops = kr.generate("135m", "bfloat16", "bfloat16")
    assert "Attention/flash-mma-skip" in ops.values()
    assert all(f"void {k}(" in source for k in ops)
    source, ops = kr.generate("135m", "bfloat16", "bfloat16", q8=True)  # (the q/k/v group stages its norm's row)
    assert "Fused+MatMul x3/group" in ops.values() and "u8 xq_[" in source


_NCU_RAW = """KERNEL k5 Fused/block
==PROF== Connected to process 1759
"ID","Kernel Name","gpu__time_duration.sum","dram__bytes.sum","launch__registers_per_thread","smsp__inst_executed.sum"
"","","nsecond","byte","register/thread","inst"
"0","k5","41,632","40,271,104","32","19,922,944"
"1","nvjet_sm90_tss","1,031,168","27,391,488","168","4,633,600"
"""


def test_kernel_profile_reads_ncu_csv():
    """benchmarks/kernel_profile.py: ncu's raw CSV (units in the second row) and the child's kernel labels -> a row
    per launch in us, MB and millions of instructions; kernels of no step (cuBLASLt) say so."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_profile.py"
    spec = importlib.util.spec_from_file_location("kernel_profile", path)
    kp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kp)
    rows = kp.parse(_NCU_RAW)
    assert [r["name"] for r in rows] == ["k5", "nvjet_sm90_tss"]
    assert rows[0]["label"] == "Fused/block" and rows[1]["label"].startswith("(cuBLASLt")
    assert rows[0]["us"] == pytest.approx(41.632) and rows[1]["us"] == pytest.approx(1031.168)
    assert rows[0]["MB"] == pytest.approx(40.271104) and rows[1]["regs"] == 168
    assert rows[0]["Minstr"] == pytest.approx(19.922944)
    assert "2 launches, 1072.8 us in all" in kp.table(rows)
    # (other ncu versions print short unit names)
    short = kp.parse(_NCU_RAW.replace('"nsecond","byte"', '"ns","B"'))
    assert [r["us"] for r in short] == [r["us"] for r in rows] and [r["MB"] for r in short] == [r["MB"] for r in rows]


# (ncu's `--page source --print-source sass --csv`, two kernels, a few of its columns)
_NCU_SOURCE = """"Kernel Name","k64",
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_imc","stall_long_sb","stall_long_sb (Not Issued)"
"0x7f00","      ULDC.64 UR14, c[0x0][0x208]","5","256","5","0","0"
"0x7f10","      LDG.E.64.CONSTANT R2, desc[UR14][R2.64+0x10]","0","256","0","0","0"
"0x7f20","      ISETP.NE.U32.AND P0, PT, R18, RZ, PT","15","1,032","0","15","12"
"Kernel Name","k5",
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_imc","stall_long_sb","stall_long_sb (Not Issued)"
"0x8f00","      EXIT","0","32","0","0","0"
"Kernel Name","k64",
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_imc","stall_long_sb","stall_long_sb (Not Issued)"
"0x7f00","      ULDC.64 UR14, c[0x0][0x208]","1","256","1","0","0"
"0x7f10","      LDG.E.64.CONSTANT R2, desc[UR14][R2.64+0x10]","0","256","0","0","0"
"0x7f20","      ISETP.NE.U32.AND P0, PT, R18, RZ, PT","4","1,032","0","4","4"
"""


def test_kernel_profile_reads_ncu_sass_samples():
    """benchmarks/kernel_profile.py --sass: ncu's source page (per kernel launch, its SASS with warp samples by
    stall reason; a kernel's launches added) -> the kernel's samples by reason and its instructions with the most
    samples, in kernel order."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_profile.py"
    spec = importlib.util.spec_from_file_location("kernel_profile", path)
    kp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kp)
    ks = kp.parse_source(_NCU_SOURCE)
    assert sorted(ks) == ["k5", "k64"] and len(ks["k64"]) == 3 and len(ks["k5"]) == 1
    third = ks["k64"][2]
    assert third["sass"].startswith("ISETP.NE") and third["samples"] == 19 and third["executed"] == 2064
    assert third["stalls"] == {"long_sb": 19}  # (the not-issued column is a part of it, not another reason)
    text = kp.sass_table("k64", ks["k64"], top=2)
    lines = text.splitlines()
    assert lines[0] == "k64: 3 instructions, 25 warp samples: long_sb 76%, imc 24%"
    assert len(lines) == 3 and "ULDC.64" in lines[1] and "imc 6" in lines[1] and "long_sb 19" in lines[2]


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
def test_reads_through_the_staging_buffer(rng):
    """Reads of 64 KiB to 16 MiB go through a page-locked staging buffer (grown as needed), the others directly:
    every size reads back what was uploaded, also after a larger read grew the buffer."""
    for n in [1000, 70_000, 300_000, 130_000, 5_000_000, 90_000]:  # 4 KB .. 20 MB of float32
        arr = rng.data((n,)).astype(np.float32)
        a = lm._core.cuda_upload(arr, "float32")
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
def test_compute_dtype_keeps_weights_in_it(dtype, rng):
    g = lm.Graph()
    x = g.tensor((3, 64), name="x")
    w = g.tensor((5, 64), name="w")
    y = ((x * 2) @ w.T).output()  # x feeds a multiplication, not the matmul: not a weight
    z = (x + 0.5).output()
    g.compile(lm.GenericCompiler(), c := lm.CudaCompiler(dtype))
    assert c.schedule.storage_dtype(w.id) == dtype  # a weight: rounded once, when uploaded
    assert c.schedule.storage_dtype(x.id) == "float32"  # anything else keeps its dtype
    a, b = rng.data((3, 64)).astype(np.float32), rng.data((5, 64)).astype(np.float32)
    x.set(a)
    w.set(b)
    g.execute()
    from helpers import as_dtype

    bw = as_dtype(b, dtype).astype(np.float64)
    want = 2 * a.astype(np.float64) @ bw.T
    # The timed choice may run the product on tensor cores (activations rounded to the compute dtype too) or as
    # matrix-vector rows (float32 activations): both within one rounding of each activation.
    unit = {"float16": 2.0**-11, "bfloat16": 2.0**-8}[dtype]
    bound = unit * (2 * np.abs(a).astype(np.float64) @ np.abs(bw).T) + 1e-5 * (1 + np.abs(want))
    assert np.all(np.abs(y.numpy() - want) <= bound), np.abs(y.numpy() - want) / bound
    np.testing.assert_array_equal(z.numpy(), a + np.float32(0.5))


def _linear_input_dtypes(g):
    """The stored dtype of each MatMul's activations (its operand beside an Input), by the MatMul's node id."""
    gg = g._g
    out = {}
    for i in gg.topo_order():
        n = gg.node(i)
        if n.op == "Custom" and n.name == "MatMul":
            a, w = (gg.node(e.node) for e in n.inputs)
            out[i] = (a.dtype if w.op == "Input" else w.dtype)
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_linear_inputs_are_stored_in_the_compute_dtype(dtype):
    """MatMulInputPrecision (no GPU needed): a computed activation that only Linear layers read is stored in a
    16-bit compute dtype, which the product rounds it to anyway; one that anything else reads too, and a plain copy
    (a transpose: for one row the identity, launching nothing), keep float32. A product that only such 16-bit
    programs read is stored in 16 bits too; one an output reads keeps float32."""
    g = lm.Graph()
    x = g.tensor(("s", 64), name="x")
    w1, w2 = g.tensor((32, 64), name="w1"), g.tensor((32, 64), name="w2")
    h = x * 1.5 + 0.25  # read by two Linears only
    (h @ w1.T).output(), (h @ w2.T).output()
    u = x.exp()  # read by a Linear and an output
    u.output(), (u @ w1.T).output()
    t = g.tensor((64, "s"), name="t")
    (t.T.contiguous() @ w2.T).output()  # a copy feeding a Linear
    w3, w4 = g.tensor((64, 32), name="w3"), g.tensor((32, 64), name="w4")
    (((h @ w4.T) * 2) @ w3.T).output()  # a product only a 16-bit program reads: 16-bit too
    g.compile(lm.GenericCompiler(), lm.CudaCompiler(dtype, device=None))
    got = sorted(_linear_input_dtypes(g).values())
    low = "float32" if dtype == "float32" else dtype
    assert got == sorted([low] * 4 + ["float32"] * 2), got
    products = sorted(g._g.node(i).dtype for i in _linear_input_dtypes(g))
    assert products == sorted(["float32"] * 5 + [low]), products


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("rows", [1, 70])  # matrix-vector rows (decode), a GEMM
def test_linear_input_rounded_once_to_the_compute_dtype(dtype, rows, rng):
    from helpers import as_dtype

    g = lm.Graph()
    x = g.tensor((rows, 96), name="x")
    w1, w2 = g.tensor((40, 96), name="w1"), g.tensor((24, 96), name="w2")
    h = x * 1.5 + 0.25
    y1, y2 = (h @ w1.T).output(), (h @ w2.T).output()
    g.compile(lm.GenericCompiler(), lm.CudaCompiler(dtype))
    a = rng.data((rows, 96)).astype(np.float32)
    b1, b2 = rng.data((40, 96)).astype(np.float32), rng.data((24, 96)).astype(np.float32)
    x.set(a), w1.set(b1), w2.set(b2)
    g.execute()
    act = as_dtype(a * np.float32(1.5) + np.float32(0.25), dtype).astype(np.float64)
    for y, b in ((y1, b1), (y2, b2)):
        want = act @ as_dtype(b, dtype).astype(np.float64).T
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=repr(rng))


# ---- quantised weights on every backend (QMatMul and Dequant kernels; no model file needed) ---------------------------
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
@pytest.mark.parametrize("tokens", [1, 5])
def test_quantized_matmul_and_embedding(backend, qtype, tokens, rng):
    from helpers import run_full  # noqa: F401 (skips like the parity suite when the backend cannot run)
    from luminal.quant import QuantizedWeight, dequantize

    reason = backend.skip_reason()
    if reason:
        pytest.skip(f"backend {backend.name}: {reason}")
    raw, vals = random_quant_blocks(rng.gen, qtype, 48, 96)
    x = rng.data((tokens, 96)).astype(np.float32)
    idx = rng.integers(0, 48, (4,))
    g = lm.Graph()
    w = dequantize(g, QuantizedWeight(raw, qtype, (48, 96)))
    xt = g.tensor((tokens, 96), name="x").set(x)
    it = g.tensor((4,), lm.int32, name="idx").set(idx)
    y = (xt @ w.T).output()
    e = w[it].output()
    g.compile(lm.GenericCompiler(), *backend.compilers("float32"))
    g.execute()
    want = x.astype(np.float64) @ vals.T
    # The CPU kernels (which also run the cuda-nvrtc lowering) quantise decode activations to int8, as the CUDA Q8_0
    # decode kernel (qdot) does: approximate.
    int8 = backend.name in ("cpu", "cuda-nvrtc") or (backend.name == "cuda" and qtype == "Q8_0")
    atol = 3e-2 * np.abs(want).max() if int8 and tokens == 1 else 1e-4
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=atol, err_msg=repr(rng))
    np.testing.assert_array_equal(e.numpy(), vals[idx])


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("k", [96, 72])  # a multiple of 32 (16-byte staging loads) and not
def test_tensor_core_matmul_rounds_operands_to_the_compute_dtype(dtype, k, rng):
    from helpers import as_dtype

    g = lm.Graph()
    x = g.tensor((2, 70, k), name="x")
    w = g.tensor((100, k), name="w")
    y = (x * 1.5 @ w.T).output()  # x * 1.5: an activation computed in float32, then fed to the matmul
    g.compile(lm.GenericCompiler(), lm.CudaCompiler(dtype))
    a, b = rng.data((2, 70, k)).astype(np.float32), rng.data((100, k)).astype(np.float32)
    x.set(a)
    w.set(b)
    g.execute()
    want = as_dtype(a * np.float32(1.5), dtype).astype(np.float64) @ as_dtype(b, dtype).astype(np.float64).T
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-3, err_msg=repr(rng))


@gpu
def test_graph_replay_matches_direct_launches_as_dims_change(rng, monkeypatch):
    """By default runs are replayed as CUDA graphs (updated in place as sizes and buffers change); with
    LUMINAL_CUDA_GRAPHS=0 each kernel is launched directly. Both must give the same results, step after step."""
    g = lm.Graph()
    x = g.tensor(("n", 64), name="x")
    w = g.tensor((48, 64), name="w")
    h = (x @ w.T).softmax(-1)
    y = (h.sum(0) + lm.arange(0, 48, graph=g).to(lm.float32)).output()
    z = h.output()
    g.compile(lm.GenericCompiler(), lm.CudaCompiler())
    w.set(rng.data((48, 64)).astype(np.float32))
    for n in (1, 2, 2, 20, 3, 3):
        x.set(rng.data((n, 64)).astype(np.float32))
        monkeypatch.setenv("LUMINAL_CUDA_GRAPHS", "0")
        g.execute()
        direct = (y.numpy(), z.numpy())
        monkeypatch.setenv("LUMINAL_CUDA_GRAPHS", "1")
        g.execute()
        np.testing.assert_array_equal(y.numpy(), direct[0])
        np.testing.assert_array_equal(z.numpy(), direct[1])


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
@pytest.mark.parametrize("tokens", [1, 5])
def test_stacked_quantized_matmuls(backend, qtype, tokens, rng):
    """Projections of one activation (q/k/v) become one QMatMul over the stacked weights; each reads its columns."""
    from luminal.quant import QuantizedWeight, dequantize

    reason = backend.skip_reason()
    if reason:
        pytest.skip(f"backend {backend.name}: {reason}")
    x = rng.data((tokens, 64)).astype(np.float32)
    g = lm.Graph()
    xt = g.tensor((tokens, 64), name="x").set(x)
    outs, wants = [], []
    for j, rows in enumerate((40, 8, 24)):
        raw, vals = random_quant_blocks(rng.gen, qtype, rows, 64)
        w = dequantize(g, QuantizedWeight(raw, qtype, (rows, 64)), name=f"w{j}")
        outs.append((xt @ w.T).output())
        wants.append(x.astype(np.float64) @ vals.T)
    g.compile(lm.GenericCompiler(), *backend.compilers("float32"))
    g.execute()
    for o, want in zip(outs, wants):
        int8 = backend.name in ("cpu", "cuda-nvrtc") or (backend.name == "cuda" and qtype == "Q8_0")  # (CUDA: qdot)
        atol = 3e-2 * np.abs(want).max() if int8 and tokens == 1 else 1e-4
        np.testing.assert_allclose(o.numpy(), want, rtol=1e-4, atol=atol, err_msg=repr(rng))


@pytest.mark.parametrize("pairs", ["0", "1"])
@pytest.mark.parametrize("tokens", [1, 5, 20])
def test_grouped_matvecs_and_their_epilogues(backend, tokens, pairs, rng, monkeypatch):
    """On the GPU, matrix-vector products of one activation run as one kernel (here all five), and an elementwise
    step that alone reads some of them is computed as they store (a residual add; silu(gate) * up from two
    products). 20 rows take the tiled kernels, so the same steps run one by one. Both against float64 numpy. With
    LUMINAL_CUDA_FLOAT_PAIRS=1 a warp computes two rows of each product (even row counts: a pair never spans two
    activation rows, 5 of them here)."""
    reason = backend.skip_reason()
    if reason:
        pytest.skip(f"backend {backend.name}: {reason}")
    monkeypatch.setenv("LUMINAL_CUDA_FLOAT_PAIRS", pairs)
    x, res = rng.data((tokens, 64)).astype(np.float32), rng.data((tokens, 32)).astype(np.float32)
    ws = {k: rng.data((n, 64)).astype(np.float32) for k, n in (("q", 40), ("k", 24), ("o", 32), ("g", 48), ("u", 48))}
    g = lm.Graph()
    xt = g.tensor((tokens, 64), name="x").set(x)
    rt = g.tensor((tokens, 32), name="res").set(res)
    w = {k: g.tensor(v.shape, name=k).set(v) for k, v in ws.items()}
    q, k = (xt @ w["q"].T).output(), (xt @ w["k"].T).output()
    r = (rt + xt @ w["o"].T).output()
    m = ((xt @ w["g"].T).silu() * (xt @ w["u"].T)).output()
    g.compile(lm.GenericCompiler(), *backend.compilers("float32"))
    g.execute()
    x64 = x.astype(np.float64)
    p = {k: x64 @ v.T.astype(np.float64) for k, v in ws.items()}
    wants = [p["q"], p["k"], res + p["o"], p["g"] / (1 + np.exp(-p["g"])) * p["u"]]
    for o, want in zip((q, k, r, m), wants):
        np.testing.assert_allclose(o.numpy(), want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=repr(rng))
    if backend.name == "cuda":  # one kernel; one by one: 5 products, the residual add and silu(gate) * up
        assert g._runtime.rt.last_launches() == (1 if tokens < 16 else 7)


def test_independent_steps_run_as_one_batch(backend, rng):
    """Element-wise steps that read none of each other's results, and a Scatter writing a donated cache in place,
    run as one kernel on the GPU (a batch); the Scatter computes its source (rows * 2 + 1, which only it reads) in
    its row writes. Not donated, the Scatter copies its destination first, so the steps run one by one. Both
    against numpy, run after run (the cache keeps its rows)."""
    reason = backend.skip_reason()
    if reason:
        pytest.skip(f"backend {backend.name}: {reason}")
    g = lm.Graph()
    cache = g.tensor(("c", 6), name="cache")
    rows = g.tensor(("s", 6), name="rows")
    idx = g.tensor(("s",), lm.int32, name="idx")
    a, b = g.tensor((5, 3), name="a"), g.tensor((7,), name="b")
    outs = [cache.index_copy(0, idx, rows * 2 + 1).output(), (a.exp() + 1).output(), (b * 3 - 1).output()]
    comps = backend.compilers("float32")
    g.compile(lm.GenericCompiler(), *comps)
    for cc in comps:
        if isinstance(cc, lm.CudaCompiler):  # the scatter and the two element-wise steps: one batch
            assert [len(ids) for _, ids in cc.schedule.groups()] == [3]
    c = rng.data((9, 6)).astype(np.float32)
    av, bv = rng.data((5, 3)).astype(np.float32), rng.data((7,)).astype(np.float32)
    a.set(av)
    b.set(bv)
    for donate, slots in ((True, [1, 4]), (True, [0, 8]), (False, [2])):
        r = rng.data((len(slots), 6)).astype(np.float32)
        rows.set(r)
        idx.set(np.array(slots, np.int32))
        cache.set(c, donate=donate)
        g.execute()
        c = c.copy()
        c[slots] = r * 2 + 1
        got = [o.numpy() for o in outs]
        np.testing.assert_array_equal(got[0], c)
        np.testing.assert_allclose(got[1], np.exp(av.astype(np.float64)) + 1, rtol=1e-5)
        np.testing.assert_allclose(got[2], bv * 3.0 - 1, rtol=1e-5, atol=1e-5)
        if backend.name == "cuda":  # not donated: the copy, the rows, a's and b's steps
            assert g._runtime.rt.last_launches() == (1 if donate else 4)


# (what a batch of element loops and a Scatter's row writes needs beyond cuda_host's prelude)
_BATCH_HOST = r"""
inline double ld_int32(const void* b, i64 o) { return ((const int*)b)[o]; }
template <int N> void ldv_float32(const void* b, i64 o, i64 s, float* x) {
  for (int e = 0; e < N; ++e) x[e] = ld_float32(b, o + e * s);
}
template <int N> void stv_float32(void* b, i64 o, const float* v) {
  for (int e = 0; e < N; ++e) st_float32(b, o + e, v[e]);
}
template <class T> T rd_float32(T v) { return (T)(float)v; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float op_exp2(float x) { return std::exp2(x); }
inline void fail(int* err, const i64* p, int code) {  // (the first failing check wins, as atomicCAS does)
  std::lock_guard<std::mutex> l(atomics);
  if (!*err) *err = int(p[0] * 4 + code);
}
"""


@pytest.mark.parametrize("threads", [32, 64])
def test_batch_kernel_on_the_host(threads, rng, tmp_path):
    """The batch of test_independent_steps_run_as_one_batch (a Scatter writing rows * 2 + 1 into a cache in place,
    its source computed by its producer through the producer's own parameter slice, and two element-wise steps)
    run on the host (cuda_host.py) with the runtime's parameter slices: the kernel first copies the four slices into
    shared memory (more slots than a block of 32 threads, fewer than one of 64), then every part reads them there.
    Two blocks, so that the grid-stride loop takes more than one turn; then an index past the cache, whose error
    names the Scatter's node (read from its staged slice)."""
    import cuda_host

    if needs_nvrtc() is not None or not cuda_host.compiler():
        pytest.skip("needs the CUDA code generation and a host C++ compiler")
    g = lm.Graph()
    cache, rows = g.tensor((9, 6), name="cache"), g.tensor((2, 6), name="rows")
    idx = g.tensor((2,), lm.int32, name="idx")
    a, b = g.tensor((5, 3), name="a"), g.tensor((7,), name="b")
    outs = [cache.index_copy(0, idx, rows * 2 + 1).output(), (a.exp() + 1).output(), (b * 3 - 1).output()]
    comp = lm.CudaCompiler("float32", device=None)
    g.compile(lm.GenericCompiler(), comp)
    gg = g._g
    ((name, ids),) = comp.schedule.groups()
    kernel = dict(comp.schedule.kernel_texts)[name]
    scatter, ea, eb = ids
    assert [gg.node(i).op for i in ids] == ["Scatter", "Custom", "Custom"]
    assert "__shared__ i64 ps_[58];" in kernel  # (25 + 12 slots: the Scatter's and its producer's; 12, 9)
    producer = gg.node(scatter).inputs[2].node
    arrays = {k: rng.data(shape).astype(np.float32) for k, shape in
              (("cache", (9, 6)), ("rows", (2, 6)), ("a", (5, 3)), ("b", (7,)))}
    sizes = {gg.node(t._edge().node).name: a.size for t, a in ((cache, arrays["cache"]), (rows, arrays["rows"]),
                                                              (a, arrays["a"]), (b, arrays["b"]))}
    sizes["idx"] = 2

    def slice_of(nid, header):
        p = [nid] + header
        for e in gg.node(nid).inputs:
            src = gg.node(e.node)
            size = sizes.get(src.name) or int(np.prod([int(d) for d in src.shape]))
            p += cuda_host.view_slots(e.view.offset, size, e.view.shape, e.view.strides)
        return p

    slices = [slice_of(scatter, [54, 2 * 6, 6]), slice_of(producer, [12, 0, 0]), slice_of(ea, [15, 0, 0]),
              slice_of(eb, [7, 0, 0])]
    assert [len(s) for s in slices] == [25, 12, 12, 9]
    main = f"""
int main(int argc, char** argv) {{
  std::vector<std::vector<i64>> P = {{{", ".join("{" + ", ".join(map(str, s)) + "}" for s in slices)}}};
  std::vector<char> cache = load("cache.bin"), rows = load("rows.bin"), a = load("a.bin"), b = load("b.bin");
  int idx[2] = {{std::atoi(argv[1]), std::atoi(argv[2])}};
  std::vector<float> ya(15, 12345.0f), yb(7, 12345.0f);
  int err = 0;
  launch(2, 1, 1, {threads}, [&] {{ {name}(P[0].data(), &err, P[0].data(), cache.data(), cache.data(), idx, nullptr,
      P[1].data(), rows.data(), P[2].data(), ya.data(), a.data(), P[3].data(), yb.data(), b.data()); }});
  FILE* f = std::fopen("out.bin", "wb");
  std::fwrite(cache.data(), 1, cache.size(), f);
  std::fwrite(ya.data(), 4, ya.size(), f);
  std::fwrite(yb.data(), 4, yb.size(), f);
  std::fclose(f);
  std::printf("err %d\\n", err);
}}
"""
    exe = cuda_host.build(_BATCH_HOST + kernel + main, tmp_path)
    for k, v in arrays.items():
        (tmp_path / f"{k}.bin").write_bytes(v.tobytes())
    for slots, err in (([7, 2], 0), ([4, 9], scatter * 4 + 3)):
        r = subprocess.run([str(exe), *map(str, slots)], cwd=tmp_path, capture_output=True, text=True, check=True)
        assert r.stdout.split() == ["err", str(err)], r.stdout
        got = np.fromfile(tmp_path / "out.bin", np.float32)
        want = arrays["cache"].copy()
        for row, s in enumerate(slots):
            if s < 9:
                want[s] = arrays["rows"][row] * np.float32(2) + np.float32(1)
        np.testing.assert_array_equal(got[:54].reshape(9, 6), want)
        np.testing.assert_allclose(got[54:69], np.exp(arrays["a"].astype(np.float64)).ravel() + 1, rtol=1e-5)
        np.testing.assert_allclose(got[69:], arrays["b"] * 3.0 - 1, rtol=1e-5, atol=1e-6)


def test_a_copy_that_is_the_identity_is_skipped(backend, rng):
    """Heads put back in token order (a transpose, then a reshape: a copy) are the identity for one token: the GPU
    then skips the copy and reads its input's buffer; for two tokens it runs. Both against numpy, as the dims move
    (the plan's arena changes with them)."""
    g = lm.Graph()
    x = g.tensor((8, "s", 3), name="x")
    w = g.tensor((24, 5), name="w")
    y = ((x * 2).transpose(0, 1).reshape("s", 24) @ w).output()
    g.compile(lm.GenericCompiler(), *backend.compilers("float32"))
    wv = rng.data((24, 5)).astype(np.float32)
    w.set(wv)
    for s in (1, 2, 1, 3):
        xv = rng.data((8, s, 3)).astype(np.float32)
        x.set(xv)
        g.execute()
        want = (2 * xv.astype(np.float64)).transpose(1, 0, 2).reshape(s, 24) @ wv
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5)
        if backend.name == "cuda":  # x * 2, the copy (not for one token), the product
            assert g._runtime.rt.last_launches() == (2 if s == 1 else 3)


def test_attention_over_a_cache(backend, rng):
    """Scores, a masked softmax and the weighted values over a token-major cache (grouped heads, as Llama decodes),
    for few rows (decode), many rows (a prompt) and many keys, each against float64 numpy."""
    reason = backend.skip_reason()
    if reason:
        pytest.skip(f"backend {backend.name}: {reason}")
    H, D = 4, 16
    g = lm.Graph()
    q = g.tensor((H, "m", D), name="q")
    kc, vc = g.tensor(("t", H, D), name="k"), g.tensor(("t", H, D), name="v")
    mask = g.tensor(("m", "t"), name="mask")
    s = (q @ kc.transpose(0, 1).transpose(1, 2)) * (1 / math.sqrt(D)) + mask
    o = (s.softmax(-1) @ vc.transpose(0, 1)).output()
    g.compile(lm.GenericCompiler(), *backend.compilers("float32"))
    for m, t in ((3, 37), (160, 37), (3, 11000)):
        x = {n: rng.data(shape).astype(np.float32) for n, shape in (("q", (H, m, D)), ("k", (t, H, D)), ("v", (t, H, D)))}
        mk = np.where(rng.data((m, t)) > 0.6, -np.inf, 0.0).astype(np.float32)
        mk[:, 0] = 0.0
        q.set(x["q"]), kc.set(x["k"]), vc.set(x["v"]), mask.set(mk)
        g.execute()
        k64, v64 = x["k"].astype(np.float64).transpose(1, 0, 2), x["v"].astype(np.float64).transpose(1, 0, 2)
        sc = x["q"].astype(np.float64) @ k64.transpose(0, 2, 1) / math.sqrt(D) + mk
        p = np.exp(sc - sc.max(-1, keepdims=True))
        want = (p / p.sum(-1, keepdims=True)) @ v64
        np.testing.assert_allclose(o.numpy(), want, rtol=1e-4, atol=1e-5, err_msg=f"{m} rows, {t} keys; {rng!r}")


@gpu
def test_donated_scatter_writes_rows_in_place(rng):
    """A Scatter whose destination is a donated input that only it reads writes its rows into that input's device
    array (no copy): the result is the same array. Without donation the input is left as it was."""
    g = lm.Graph()
    cache = g.tensor(("c", 6), name="cache")
    rows = g.tensor(("s", 6), name="rows")
    idx = g.tensor(("s",), lm.int32, name="idx")
    new = cache.index_copy(0, idx, rows)
    out = new.output()
    total = new.sum(0).output()  # a second reader of the result (not of the input): still in place
    g.compile(lm.GenericCompiler(), lm.CudaCompiler())
    c0 = rng.data((9, 6)).astype(np.float32)
    want = c0.copy()
    cache.set(c0, donate=True)
    for step, slots in enumerate([[1, 4], [0], [8, 2, 5]]):
        r = rng.data((len(slots), 6)).astype(np.float32)
        rows.set(r)
        idx.set(np.array(slots, np.int32))
        g.execute()
        res = out.result()  # (before numpy(), which replaces it with the host copy)
        want[slots] = r
        np.testing.assert_array_equal(out.numpy(), want)
        np.testing.assert_allclose(total.numpy(), want.sum(0), rtol=1e-5, atol=1e-5)
        if step:
            assert res.ptr == given.ptr, "the donated array was copied, not updated in place"
            assert res is given, "an array updated in place comes back as the same Python object"
        given = res
        cache.set(res, donate=True)
    # Not donated: the scatter copies, and the input keeps its values from run to run.
    cache.set(c0)
    rows.set(np.ones((1, 6), np.float32))
    idx.set(np.array([3], np.int32))
    for _ in range(2):
        g.execute()
        assert out.result().ptr != given.ptr
        want = c0.copy()
        want[3] = 1
        np.testing.assert_array_equal(out.numpy(), want)


@gpu
@pytest.mark.parametrize("graphs", ["1", "0"])
def test_llama_decode_steps_match_the_cpu(graphs, rng, monkeypatch):
    """A decode loop on the GPU (KV caches updated in place, the capacity doubling twice, CUDA graphs on and off)
    gives the CPU backend's logits at every step."""
    monkeypatch.setenv("LUMINAL_CUDA_GRAPHS", graphs)
    sessions = tiny_llama_sessions(rng, ([lm.CPUCompiler()], [lm.CudaCompiler("float32")]), capacity=4)
    ids = rng.integers(0, sessions[0].model.config.vocab_size, (20,))
    for s in sessions:
        s.reset()
    steps = [ids[:3]] + [ids[i:i + 1] for i in range(3, 20)]
    for k, tok in enumerate(steps):
        cpu, gpu_ = (s.step(tok) for s in sessions)
        np.testing.assert_allclose(gpu_, cpu, rtol=2e-4, atol=2e-4, err_msg=f"step {k}")
    assert sessions[1]._capacity == 32


@pytest.mark.parametrize("per", ["1", "2", "4", "8"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_element_loop_elements_per_thread(cuda_backend, rng, monkeypatch, per, dtype):
    """Element-wise loops at 1, 2, 4 and 8 elements a thread (LUMINAL_CUDA_ELEMENTS): rows of 7 (groups cross rows
    and step their index over the row's end), a transposed input, a total not a multiple of the group, and float,
    16-bit and bool results (the vector stores)."""
    monkeypatch.setenv("LUMINAL_CUDA_ELEMENTS", per)

    def fn(a, b):
        x = a * b.transpose(0, 1) + a.exp()
        return [x, x.gt(0.5)]

    check(fn, shapes=[(5, 3, 7), (3, 5, 7)], dtype=dtype, backend=cuda_backend, rng=rng)
    check(lambda a: (a * 3.0 + 1.0).sin(), shapes=[(2, 1029)], dtype=dtype, backend=cuda_backend, rng=rng)


def test_element_loop_setting_is_checked(monkeypatch):
    monkeypatch.setenv("LUMINAL_CUDA_ELEMENTS", "3")
    cx = lm.Graph()
    (cx.tensor((4, 4)) * 2.0).output()
    with pytest.raises(ValueError, match="LUMINAL_CUDA_ELEMENTS must be 1, 2, 4 or 8"):
        cx.compile(lm.GenericCompiler(), lm.CudaCompiler("float32", device=None))


def test_split_warps_setting_is_checked(monkeypatch):
    """LUMINAL_CUDA_SPLIT_WARPS (a matrix-vector group's warps per row) must be an integer: a typo raises, naming it,
    rather than reading as 0 (never split)."""
    monkeypatch.setenv("LUMINAL_CUDA_SPLIT_WARPS", "4k")
    cx = lm.Graph()
    x = cx.tensor((1, 64), name="x")
    (x @ cx.tensor((32, 64), name="a").T).output()
    (x @ cx.tensor((16, 64), name="b").T).output()
    with pytest.raises(ValueError, match="LUMINAL_CUDA_SPLIT_WARPS must be an integer, got '4k'"):
        cx.compile(lm.GenericCompiler(), lm.CudaCompiler("float32", device=None))


def test_index_division_by_dividers(tmp_path, rng):
    """Kernels unravel indices by the prelude's udiv with each dim's divider from the parameter slice
    (`cuda_div_magic`): run on the host against exact division, for dims 1..2100, powers of two and their
    neighbours, dims near 2^31 and 2^32, and dividends 0, d-1, d, d+1, random ones and the largest 32-bit ones; dims
    past 32 bits (divider 0) and dividends past 32 bits take the division itself."""
    import cuda_host

    if not cuda_host.compiler():
        pytest.skip("needs a host C++ compiler")
    ds = list(range(1, 2101)) + [2**k + o for k in range(11, 33) for o in (-1, 0, 1)] + [2**31 - 7, 2**32 - 1, 2**33 + 5]
    ds += [int(x) for x in rng.gen.integers(1, 2**32, 300)]
    cases = []
    for d in ds:
        ns = [0, 1, d - 1, d, d + 1, 2 * d + 3, 2**32 - 1, 2**32 - 2, 2**32, 2**40 + 17]
        ns += [int(x) for x in rng.gen.integers(0, 2**32, 4)]
        cases += [(n, d, lm._core.cuda_div_magic(d)) for n in ns]
    assert lm._core.cuda_div_magic(2**33 + 5) == 0 and lm._core.cuda_div_magic(0) == 0
    (tmp_path / "cases.bin").write_bytes(np.array(cases, np.int64).tobytes())
    main = """
#include <cstdio>
int main(int, char** argv) {
  FILE* f = std::fopen(argv[1], "rb");
  i64 c[3];
  long bad = 0, n = 0;
  while (std::fread(c, 8, 3, f) == 3) {
    ++n;
    if (udiv(c[0], c[1], c[2]) != c[0] / c[1] && bad++ < 5)
      std::printf("udiv(%lld, %lld) = %lld\\n", c[0], c[1], udiv(c[0], c[1], c[2]));
  }
  std::printf("%ld of %ld wrong\\n", bad, n);
  return bad != 0;
}
"""
    exe = cuda_host.build(main, tmp_path)
    r = subprocess.run([str(exe), str(tmp_path / "cases.bin")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    assert f"0 of {len(cases)} wrong" in r.stdout
