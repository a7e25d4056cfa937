"""The CUDA backend: `CudaCompiler(dtype)` lowers a graph to CUDA C kernels (the same lowering as the CPU backend:
MatMul, QMatMul/Dequant, fused register programs), compiles them with NVRTC for the GPU in this machine, and runs
them through the driver API. libcuda and NVRTC are opened at run time, so this module imports anywhere.

`dtype` is the float type the *weights* are kept in on the GPU: a float32 input that a matmul multiplies by or a
gather reads rows of (linear and embedding weights) is rounded to `dtype` once, when uploaded, and kernels widen it
on load, so decoding reads half the bytes. Other inputs (KV caches, RoPE tables, activations you set) and everything
the graph computes keep their own dtype; kernels compute in float32 registers (float64 where int32 values need
exactness) and round every step to its node's dtype, as the reference executor does. One exception: with a 16-bit
`dtype`, a matrix product over 16 or more rows (prefill, attention over a prompt) runs on tensor cores, which round
both operands to `dtype` (float32 accumulators), as torch does in that dtype; so does attention (scores, softmax and
weighted values: one flash-attention kernel), rounding q, k, the probabilities and v. With dtype=float32 the GPU
computes what the reference computes, up to the rounding of the transcendental functions and the order of sums.

Data stays on the GPU: inputs are uploaded when set (not again while unchanged), outputs are `luminal.DeviceArray`s
copied to the host only when read (`Tensor.numpy()`), and a DeviceArray given to `Tensor.set` is used in place (how
`Session` feeds the KV cache back)."""
from __future__ import annotations

import glob
import os

import numpy as np

from . import _core
from . import dtypes as dt
from .compiler import (AttentionFusion, ContractionLowering, DeadNodeRemoval, ElementwiseFusion, MatMulInputPrecision,
                       MatMulLowering, MaximumLowering, QuantizedLowering, Sequence)

CudaError = _core.CudaError
DeviceArray = _core.DeviceArray


def _nvrtc_dirs() -> list[str]:
    """Library folders of the nvidia-cuda-nvrtc wheel(s) installed beside us (CUDA 13 and 12 layouts)."""
    dirs = []
    try:
        import nvidia  # namespace package of NVIDIA's wheels

        for root in nvidia.__path__:
            for sub in ("cu13/lib", "cuda_nvrtc/lib"):
                d = os.path.join(root, sub)
                if glob.glob(os.path.join(d, "libnvrtc.so*")):
                    dirs.append(d)
    except ImportError:
        pass
    return dirs


_core.cuda_set_nvrtc_dirs(_nvrtc_dirs())


def _cublas_dirs() -> list[str]:
    """Library folders of the nvidia-cublas wheel(s) installed beside us (torch's dependency; CUDA 13 and 12 layouts)."""
    try:
        import nvidia
    except ImportError:
        return []
    return [d for root in nvidia.__path__ for d in (os.path.join(root, s) for s in ("cu13/lib", "cublas/lib", "cu12/lib"))
            if glob.glob(os.path.join(d, "libcublasLt.so*"))]


_core.cuda_set_cublas_dirs(_cublas_dirs())


def cublas_available() -> tuple[bool, str]:
    """(True, the library and its version) when cuBLASLt opens here (then it is one of the matrix products' variants,
    used where timing finds it faster: LUMINAL_CUDA_GEMM=cublas|own forces it or our kernels), else (False, why not)."""
    reason = _core.cublas_unavailable_reason()
    return (False, reason) if reason else (True, _core.cublas_path())


def cuda_available() -> tuple[bool, str]:
    """(True, device name) when kernels can run on a GPU here, else (False, the reason)."""
    reason = _core.cuda_unavailable_reason()
    if reason:
        return False, reason
    return True, _core.cuda_device()["name"]


def from_torch(t, copy: bool = True) -> DeviceArray:
    """A contiguous torch CUDA tensor as a DeviceArray for Tensor.set: a copy on the device (no trip through the
    host), or with copy=False its own memory read in place (the tensor is kept alive; writing to it between runs
    changes what the graph reads)."""
    names = {"torch.float32": "float32", "torch.float16": "float16", "torch.bfloat16": "bfloat16",
             "torch.int32": "int32", "torch.uint8": "uint8", "torch.bool": "bool"}
    if not t.is_cuda or not t.is_contiguous() or str(t.dtype) not in names:
        raise ValueError(f"from_torch needs a contiguous CUDA tensor of {', '.join(names)}; got {t.dtype} on {t.device}")
    if t.device.index not in (None, 0):  # luminal runs on the first GPU
        raise ValueError(f"from_torch: the tensor is on {t.device}; luminal runs on cuda:0")
    if not copy:
        return _core.cuda_borrow(t.data_ptr(), list(t.shape), names[str(t.dtype)], t)
    return _core.cuda_copy_from_device(t.data_ptr(), list(t.shape), names[str(t.dtype)])


def generate_sources(graph, dtype="float32") -> str:
    """The CUDA C module a compiled graph runs (call after the compilers; needs no GPU)."""
    return _core.cuda_generate(graph._g, dt.dtype(dtype).name).source


def compile_source(source: str, arch: int) -> bytes:
    """Compiles CUDA C with NVRTC for sm_<arch> (90: sm_90a, where the wgmma GEMM kernels assemble); raises CudaError
    with NVRTC's log and the source on an error."""
    return _core.cuda_compile(source, int(arch))[0]


class CudaCompiler:
    """Lowers the graph to CUDA kernels and makes `graph.execute()` run them on the GPU (run GenericCompiler first,
    and this compiler last). `device=None` generates the kernels without a GPU (see `schedule.source`).

    An op with no CUDA kernel raises `luminal.UnsupportedOpError` here, at compile time. `host_fallback=True` runs a
    user's CustomOp on the host instead (its inputs copied to the host and its result back, CUDA graphs off);
    `host_nodes` then lists those nodes.

    `flash_attention` (on by default) fuses attention (scores, softmax, weighted values) into one flash-attention
    kernel: tensor cores for prefill, a decode kernel for few query rows per KV head, split over key ranges for long
    caches (flash-decoding). `flash_attention=False` keeps the three unfused kernels (scores, softmax, values)."""

    flash_attention_default = True

    def __init__(self, dtype="float32", device="auto", host_fallback=False, flash_attention=None):
        self.dtype = dt.dtype(dtype)
        if not self.dtype.is_float:
            raise ValueError(f"CudaCompiler: dtype must be float32, float16 or bfloat16, got {self.dtype.name}")
        self.device, self.host_fallback = device, host_fallback
        # Row reductions: RMSNorm and softmax fuse into one kernel each (a block per row, see codegen.cpp).
        flash = self.flash_attention_default if flash_attention is None else flash_attention
        self.passes = [MatMulLowering(), QuantizedLowering(), ContractionLowering(), MaximumLowering(),
                       ElementwiseFusion(row_reductions=True)] + ([AttentionFusion()] if flash else []) + \
            [MatMulInputPrecision(self.dtype), DeadNodeRemoval()]
        self.schedule = None

    def compile(self, graph, remap):
        n = Sequence(*self.passes).compile(graph, remap)
        self.schedule = _core.cuda_generate(graph._g, self.dtype.name, self.host_fallback)
        self.host_nodes = self.schedule.host_steps()
        if self.device is not None:
            graph._runtime = _Runtime(graph, self.schedule)
        return n


class _Runtime:
    """Runs a schedule: sends the inputs that changed since the last run (the runtime keeps the others), runs, returns
    {output id: DeviceArray}."""

    def __init__(self, graph, schedule):
        self.graph, self.schedule = graph, schedule
        self.rt = _core.CudaRuntime(graph._g, schedule)
        self.uploaded: dict[int, tuple[object, DeviceArray]] = {}  # input id -> (host array, its device copy)
        self.sent: dict[int, object] = {}  # input id -> the value the runtime holds (as set by the user)
        g = graph._g
        self.live_inputs = {i for i in g.topo_order() if g.node(i).op == "Input"}  # data for others is not sent
        self.in_place = set(self.rt.in_place_inputs())  # inputs a Scatter updates in place when donated
        self.kept: dict = {}  # results updated in place, returned as the same objects next run (see CudaRuntime.run)
        self._donated_key = None  # (graph._donated as a frozenset, the donated in-place inputs): rebuilt when it changes
        self._want: dict[int, tuple[str, str]] = {}  # input id -> (storage dtype, node dtype)
        self.resend: set | None = None  # inputs to send though not set again (None: all, on the first run)

    def _device_input(self, nid: int, value) -> DeviceArray:
        want, node_dtype = self._want.get(nid) or self._want.setdefault(
            nid, (self.schedule.storage_dtype(nid), dt.dtype(self.graph._g.node(nid).dtype).name))
        if isinstance(value, DeviceArray):
            return value if value.dtype == want else value.astype(want)
        cached = self.uploaded.get(nid)
        if cached is not None and cached[0] is value:
            return cached[1]
        arr = np.asarray(value)
        if want != node_dtype:  # a float32 input kept in the compute dtype
            arr = arr.astype(np.float32)
            arr = dt.bf16_bits(arr) if want == "bfloat16" else arr.astype(dt.dtype(want).np)
        dev = _core.cuda_upload(np.require(arr, requirements="C"), want)  # keeps 0-d arrays 0-d
        self.uploaded[nid] = (value, dev)
        return dev

    def run(self, data: dict, dims: dict, changed: set, wait: bool = True) -> dict:
        """`changed`: the inputs set since the last run (cleared once sent); only those, and the ones not sent yet,
        can differ from what the runtime holds (a decode step sets one small input of several hundred)."""
        inputs = {}
        sent = self.sent
        for nid in (data if self.resend is None else changed | self.resend):
            v = data[nid]
            if sent.get(nid) is not v and nid in self.live_inputs:  # (set again to the same array: not sent again)
                inputs[nid] = self._device_input(nid, v)
                sent[nid] = v
        changed.clear()
        self.resend = set()
        # The donated in-place inputs, worked out again only when the set of donated inputs changed (a decode step
        # donates the same caches every time).
        key = self._donated_key
        if key is None or key[0] != self.graph._donated:
            key = self._donated_key = (frozenset(self.graph._donated),
                                       [nid for nid in self.graph._donated if nid in self.in_place])
        donated = key[1]
        try:
            return self.rt.run(inputs, dims, donated, self.kept, wait)
        finally:
            # A donated host array's device copy was updated in place and no longer holds what was set: the next run
            # uploads the array again (after a failed run too, which may have written some rows). A device array set
            # is the one updated, and stays as sent.
            for nid in donated:
                if not isinstance(sent.get(nid), DeviceArray):
                    self.uploaded.pop(nid, None)
                    sent.pop(nid, None)
                    self.resend.add(nid)
