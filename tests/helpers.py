"""Shared machinery for the PyTorch parity tests: backends, seeded data, `run` and `check`.

`run(fn, *arrays, dtype=..., dims=..., backend=...)` builds a luminal graph with one input per array, applies
`fn` to the input tensors, compiles with the backend's compilers, executes and returns numpy results.

`check(fn, torch_fn, shapes, dtype, backend=..., rng=...)` makes seeded random inputs, runs them through luminal
and through PyTorch (on the CPU, in the same dtype) and compares values, shapes and result dtypes.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import shutil
from typing import Callable

import numpy as np
import pytest
import torch

import luminal as lm
from luminal import dtypes as ldt

# ---- dtypes ---------------------------------------------------------------------------------------------------------
FLOATS = ["float32", "float16", "bfloat16"]
LOW = ["float16", "bfloat16"]

TORCH = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int32": torch.int32,
    "bool": torch.bool,
    "uint8": torch.uint8,
}
# torch result dtype -> the luminal dtype we expect (luminal has no 64-bit types: indices are int32).
TORCH_TO_LM = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int32: "int32",
    torch.int64: "int32",
    torch.bool: "bool",
    torch.uint8: "uint8",
}

# Per-dtype tolerances (atol, rtol). Ops that compose many primitive ops get `tol_scale` in check().
TOL = {
    "float32": (1e-5, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (2e-2, 5e-2),
    "int32": (0, 0),
    "bool": (0, 0),
    "uint8": (0, 0),
}


def tol(dtype: str, scale: float = 1.0) -> dict:
    a, r = TOL[dtype]
    return dict(atol=a * scale, rtol=r * scale)


# ---- backends -------------------------------------------------------------------------------------------------------
def gpu_available() -> bool:
    """True when an NVIDIA GPU is visible (torch here is the CPU build, so ask the driver)."""
    if torch.cuda.is_available():
        return True
    if shutil.which("nvidia-smi") is None:
        return False
    return os.system("nvidia-smi -L >/dev/null 2>&1") == 0


@dataclasses.dataclass(frozen=True)
class Backend:
    """A way to run graphs: `compilers(dtype)` lists the compilers applied after lm.GenericCompiler().

    `requires` returns None when the backend can run here, else the reason to skip (never a silent pass)."""

    name: str
    compilers: Callable[[str], list] = lambda dtype: []
    requires: Callable[[], str | None] = lambda: None

    def skip_reason(self) -> str | None:
        return self.requires()

    def __str__(self):
        return self.name


def needs_attr(name: str) -> Callable[[], str | None]:
    return lambda: None if hasattr(lm, name) else f"this luminal build has no lm.{name}"


def needs_gpu(name: str) -> Callable[[], str | None]:
    def check():
        if not hasattr(lm, name):
            return f"this luminal build has no lm.{name}"
        if not gpu_available():
            return "no CUDA GPU on this machine"
        return None

    return check


def needs_cuda() -> str | None:
    """None when luminal can run kernels on a CUDA GPU here, else why not."""
    if not hasattr(lm, "CudaCompiler"):
        return "this luminal build has no lm.CudaCompiler"
    ok, why = lm.cuda_available()
    return None if ok else f"no usable CUDA GPU ({why.splitlines()[0]})"


def needs_nvrtc() -> str | None:
    """None when NVRTC (the nvidia-cuda-nvrtc wheel, or a CUDA toolkit) can be opened."""
    if not hasattr(lm, "CudaCompiler"):
        return "this luminal build has no lm.CudaCompiler"
    try:
        lm._core.nvrtc_path()
        return None
    except lm.CudaError as e:
        return f"NVRTC not found ({str(e).splitlines()[0]})"


class NvrtcCheck:
    """A compiler applied after `CudaCompiler(dtype, device=None)`: collects every kernel generated for the graph and
    compiles them with NVRTC for sm_80 and sm_90 (no GPU needed), in batches so the prelude is parsed once per
    batch. A kernel NVRTC rejects fails the test that generated it (or the session's last flush), with its log.
    Each run of the graph first brings the CUDA runtime's plan to its dims (views checked against their buffers,
    the memory planned), raising what a run on a GPU would."""

    ARCHS = (80, 90)
    BATCH = 400

    def __init__(self):
        self.pending: dict[str, str] = {}  # kernel text (named NAME) -> test that generated it
        self.done: set[str] = set()
        self.compiled = 0

    def compile(self, graph, remap):
        sched = graph.compilers[-1].schedule
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        for name, text in sched.kernel_texts:
            key = text.replace(f"void {name}(", "void NAME(", 1)
            if key not in self.done and key not in self.pending:
                self.pending[key] = test
        if len(self.pending) >= self.BATCH:
            self.flush()
        graph._executor = _PlanChecked(graph, sched)
        return 0

    def flush(self):
        texts = list(self.pending.items())
        self.pending = {}
        if not texts:
            return
        prelude = lm._core.cuda_prelude()
        src = prelude + "".join(t.replace("NAME", f"c{i}", 1) for i, (t, _) in enumerate(texts))

        def compile_for(arch):
            try:
                lm.cuda.compile_source(src, arch)
            except lm.CudaError:
                for t, test in texts:  # find the culprit, for a readable failure
                    try:
                        lm.cuda.compile_source(prelude + t.replace("NAME", "c0", 1), arch)
                    except lm.CudaError as e:
                        raise AssertionError(f"a kernel generated by {test} does not compile for sm_{arch}:\n{e}")
                raise

        # (one thread per architecture: NVRTC releases the GIL, so the two compile side by side)
        with concurrent.futures.ThreadPoolExecutor(len(self.ARCHS)) as pool:
            for f in [pool.submit(compile_for, arch) for arch in self.ARCHS]:
                f.result()
        self.done.update(t for t, _ in texts)
        self.compiled += len(texts)


class _PlanChecked:
    """The CPU executor, each run preceded by the CUDA plan's update to the run's dims (see NvrtcCheck)."""

    def __init__(self, graph, sched):
        self.plan = lm._core.CudaPlan(graph._g, sched)
        self.executor = lm._core.Executor(graph._g)

    def run(self, dims, data, donated):
        self.plan.update(dims)
        return self.executor.run(dims, data, donated)


NVRTC_CHECK = NvrtcCheck()

REFERENCE = Backend("reference")


# ---- seeded data ----------------------------------------------------------------------------------------------------
class Rand:
    """A seeded numpy Generator with helpers for in-domain test data. `seed` goes into failure messages."""

    def __init__(self, seed: int, base: int | None = None, nodeid: str = ""):
        self.seed, self.base, self.nodeid = seed, base, nodeid
        self.gen = np.random.default_rng(seed)

    def __repr__(self):
        hint = f"; rerun with LUMINAL_TEST_SEED={self.base}" if self.base is not None else ""
        return f"seed={self.seed}{hint}"

    def data(self, shape, domain: str = "signed") -> np.ndarray:
        """float64 data, never zero. domains:
        signed   -- random sign, |x| in [0.1, 2]
        pos      -- x in [0.2, 3]
        unit     -- random sign, |x| in [0.05, 0.95] (inside (-1, 1))
        small    -- random sign, |x| in [0.1, 1]
        distinct -- distinct multiples of 1/4 (exact in every float dtype; no ties for max/argmax)
        int      -- nonzero integers in [-9, 9]
        """
        shape = tuple(shape)
        g = self.gen
        if domain == "signed":
            return g.choice([-1.0, 1.0], size=shape) * g.uniform(0.1, 2.0, size=shape)
        if domain == "pos":
            return g.uniform(0.2, 3.0, size=shape)
        if domain == "unit":
            return g.choice([-1.0, 1.0], size=shape) * g.uniform(0.05, 0.95, size=shape)
        if domain == "small":
            return g.choice([-1.0, 1.0], size=shape) * g.uniform(0.1, 1.0, size=shape)
        if domain == "distinct":
            n = int(np.prod(shape, dtype=np.int64))
            v = (g.permutation(n) - n // 2 + 0.5) / 4  # never zero: half-odd multiples of 1/4
            return v.reshape(shape)
        if domain == "int":
            return (g.integers(1, 10, size=shape) * g.choice([-1, 1], size=shape)).astype(np.float64)
        raise ValueError(domain)

    def integers(self, lo, hi, shape) -> np.ndarray:
        return self.gen.integers(lo, hi, size=tuple(shape)).astype(np.int32)

    def bools(self, shape) -> np.ndarray:
        return self.gen.random(tuple(shape)) < 0.5


def as_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """Rounds data into `dtype` as numpy carries it for luminal (bf16 as float32 holding bf16 values)."""
    if dtype == "float32":
        return np.asarray(x, np.float32)
    if dtype == "float16":
        return np.asarray(x, np.float16)
    if dtype == "bfloat16":
        x = np.asarray(x, np.float32)
        return ldt.bf16_to_f32(ldt.bf16_bits(x)).reshape(x.shape)  # bf16_bits makes 0-d arrays 1-d
    if dtype == "int32":
        return np.asarray(x).astype(np.int32)
    if dtype == "bool":
        return np.asarray(x).astype(np.bool_)
    if dtype == "uint8":
        return np.asarray(x).astype(np.uint8)
    raise ValueError(dtype)


def _lm_dtype_of(arr: np.ndarray, dtype: str | None) -> str:
    """The luminal dtype of an input built from `arr`: float arrays take `dtype` (the test's float dtype)."""
    k = arr.dtype.kind
    if k == "f":
        if dtype in FLOATS:
            return dtype
        return "float16" if arr.dtype == np.float16 else "float32"
    if k == "b":
        return "bool"
    if arr.dtype == np.uint8:
        return "uint8"
    return "int32"


def to_torch(arr: np.ndarray, dtype: str) -> torch.Tensor:
    t = torch.from_numpy(np.array(arr))  # a copy: torch may write, numpy may be read-only
    return t.to(TORCH[dtype])


def torch_to_numpy(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        t = t.detach()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.numpy()
    return np.asarray(t)


# ---- running luminal ------------------------------------------------------------------------------------------------
def build(fn, arrays, dtype=None, dims=None, dtypes=None):
    """Builds a graph: inputs for `arrays` (declared with the shapes in `dims`, where given), outputs of fn."""
    cx = lm.Graph()
    dims = list(dims) if dims is not None else [None] * len(arrays)
    dims += [None] * (len(arrays) - len(dims))
    ins = []
    for k, (arr, shape) in enumerate(zip(arrays, dims)):
        d = dtypes[k] if dtypes is not None and dtypes[k] is not None else _lm_dtype_of(arr, dtype)
        t = cx.tensor(tuple(arr.shape) if shape is None else tuple(shape), dtype=d, name=f"x{k}")
        t.set(as_dtype(arr, d))
        ins.append(t)
    res = fn(*ins)
    single = not isinstance(res, (list, tuple))
    outs = [r.output() for r in ([res] if single else res)]
    return cx, outs, single


def run_full(fn, *arrays, dtype=None, dims=None, backend=REFERENCE, dtypes=None):
    """Like run() but returns ([arrays], [luminal dtype names], single)."""
    reason = backend.skip_reason()
    if reason:
        pytest.skip(f"backend {backend.name}: {reason}")
    cx, outs, single = build(fn, arrays, dtype, dims, dtypes)
    cx.compile(lm.GenericCompiler(), *backend.compilers(dtype or "float32"))
    cx.execute()
    res = [o.numpy() for o in outs]
    for i, (o, r) in enumerate(zip(outs, res)):  # the shape known at build time must be the one computed
        static = tuple(int(d) if not isinstance(d, lm.Expr) else d.eval(cx.dims) for d in o.shape)
        assert static == r.shape, f"result {i}: Tensor.shape {o.shape} = {static} at build time, computed {r.shape}"
    return res, [o.dtype.name for o in outs], single


def run(fn, *arrays, dtype=None, dims=None, backend=REFERENCE, dtypes=None):
    """Runs fn over luminal inputs holding `arrays`; returns a numpy array (or a list, if fn returns several).

    dtype: the luminal dtype of float inputs ("float32", "float16", "bfloat16"); int arrays go in as int32,
    bool arrays as bool. dims: per array, a declared shape that may name symbolic dims, e.g. [("s", 7), None];
    the symbols are bound by set()."""
    res, _, single = run_full(fn, *arrays, dtype=dtype, dims=dims, backend=backend, dtypes=dtypes)
    return res[0] if single else res


# ---- comparing with torch -------------------------------------------------------------------------------------------
def compare(got, want, dtype: str, what: str, rng=None, tol_scale: float = 1.0, atol=None, rtol=None,
            got_dtype: str | None = None, want_dtype: str | None = None, check_dtype: bool = True):
    tag = f"{what} [{dtype}] ({rng!r})"
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{tag}: shape {got.shape}, torch gives {want.shape}"
    if check_dtype and got_dtype is not None and want_dtype is not None:
        assert got_dtype == want_dtype, f"{tag}: result dtype {got_dtype}, torch gives {want_dtype}"
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got.astype(np.int64), want.astype(np.int64), err_msg=tag)
        return
    rdt = want_dtype if want_dtype in TOL else dtype
    t = tol(rdt if rdt in FLOATS else "float32", tol_scale)
    if atol is not None:
        t["atol"] = atol
    if rtol is not None:
        t["rtol"] = rtol
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), equal_nan=True, err_msg=tag, **t)


def check(fn, torch_fn=None, shapes=(), dtype="float32", *, backend=REFERENCE, rng=None, dims=None,
          domain="signed", arrays=None, dtypes=None, tol_scale=1.0, atol=None, rtol=None, check_dtype=True,
          name=None):
    """Compares luminal with PyTorch on the same seeded data.

    fn takes luminal tensors, torch_fn torch tensors (default: fn itself, for ops spelled the same in both); each
    returns a tensor or a list of tensors. `shapes` gives one input shape per argument (data from `domain`, a str or
    one per input), or `arrays` gives the data. Float inputs are rounded into `dtype` first and torch computes in
    that dtype on the CPU. Returns the luminal results."""
    torch_fn = fn if torch_fn is None else torch_fn
    if arrays is None:
        assert rng is not None, "check() needs rng= (or arrays=)"
        doms = [domain] * len(shapes) if isinstance(domain, str) else list(domain)
        arrays = [rng.data(s, d) for s, d in zip(shapes, doms)]
    in_dtypes = []
    prepared = []
    for k, a in enumerate(arrays):
        a = np.asarray(a)
        d = dtypes[k] if dtypes is not None and dtypes[k] is not None else _lm_dtype_of(a, dtype)
        in_dtypes.append(d)
        prepared.append(as_dtype(a, d))
    got, got_dtypes, single = run_full(fn, *prepared, dtype=dtype, dims=dims, backend=backend, dtypes=in_dtypes)
    tins = [to_torch(a, d) for a, d in zip(prepared, in_dtypes)]
    want = torch_fn(*tins)
    want = [want] if not isinstance(want, (list, tuple)) else list(want)
    assert len(want) == len(got), f"{len(got)} luminal results vs {len(want)} torch results"
    what = name or getattr(fn, "__name__", "fn")
    shapes_desc = [tuple(a.shape) for a in prepared]
    for i, (g, gd, w) in enumerate(zip(got, got_dtypes, want)):
        wd = TORCH_TO_LM.get(w.dtype, str(w.dtype)) if isinstance(w, torch.Tensor) else None
        compare(g, torch_to_numpy(w), dtype, f"{what} on inputs {shapes_desc} -> result {i}", rng, tol_scale,
                atol, rtol, gd, wd, check_dtype)
    return got[0] if single else got


def random_quant_blocks(gen, qtype, rows, cols):
    """Random raw GGUF rows (uint8, rows x blocks * block bytes) and their float32 values."""
    nb = cols // 32
    d = gen.uniform(0.01, 0.1, (rows, nb)).astype(np.float16) * gen.choice([-1, 1], (rows, nb)).astype(np.float16)
    if qtype == "Q8_0":
        q = gen.integers(-128, 128, (rows, nb, 32)).astype(np.int8)  # (-128 too: llama.cpp never writes it, but may)
        raw = np.concatenate([d[..., None].view(np.uint8), q.view(np.uint8)], -1)
        vals = d.astype(np.float32)[..., None] * q.astype(np.float32)
    else:
        q = gen.integers(0, 16, (rows, nb, 32)).astype(np.uint8)
        packed = (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)
        if qtype == "Q4_0":
            raw = np.concatenate([d[..., None].view(np.uint8), packed], -1)
            vals = d.astype(np.float32)[..., None] * (q.astype(np.float32) - 8)
        else:
            m = gen.uniform(-0.5, 0.5, (rows, nb)).astype(np.float16)
            raw = np.concatenate([d[..., None].view(np.uint8), m[..., None].view(np.uint8), packed], -1)
            vals = d.astype(np.float32)[..., None] * q.astype(np.float32) + m.astype(np.float32)[..., None]
    return raw.reshape(rows, -1), vals.reshape(rows, cols)


def tiny_llama_sessions(rng, compiler_lists, n_layers: int = 2, **session_kw) -> list:
    """Sessions over one tiny Llama's random weights (the same values in each), one per list of backend compilers
    (each after GenericCompiler): to compare backends or settings step by step."""
    from luminal.nn import Llama, LlamaConfig, Session

    cfg = LlamaConfig(vocab_size=61, hidden=64, ffn=96, n_layers=n_layers, n_heads=4, n_kv_heads=2, head_dim=16)
    weights, sessions = None, []
    for comps in compiler_lists:
        model = Llama(cfg)
        if weights is None:
            weights = {n: rng.data(tuple(int(d) for d in p.shape)).astype(np.float32) * 0.3
                       for n, p in model.named_parameters()}
        for n, p in model.named_parameters():
            p.set(weights[n])
        sessions.append(Session(model, [lm.GenericCompiler(), *comps], **session_kw))
    return sessions


# ---- Q8_0 products as the GPU's __dp4a kernels compute them (test_cuda_quant, test_cuda_decode) ----
def quantize_rows(x):
    """float32 rows (..., K) as int8 blocks of 32 and their scales, as q8_quantize (and the CPU's quantize_q8) does:
    d = max|a| / 127, q = a * (1 / d) rounded to nearest even, every step in float32."""
    b = np.asarray(x, np.float32).reshape(*x.shape[:-1], -1, 32)
    d = np.abs(b).max(-1) / np.float32(127)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    return np.rint(b * inv[..., None]).astype(np.int8), d.astype(np.float32)


def q8_parts(raw, k):
    """A Q8_0 weight's int8 quants (n, blocks, 32) and float32 scales (n, blocks) from its raw rows."""
    blocks = np.ascontiguousarray(raw).reshape(len(raw), k // 32, 34)
    return blocks[..., 2:].copy().view(np.int8), blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)


def expected_dp4a(x, raw, k):
    """float64 sum over blocks of d_w * d_x * (integer dot product of the blocks' quants)."""
    qx, dx = quantize_rows(x)
    qw, dw = q8_parts(raw, k)
    dots = np.einsum("...bi,nbi->...nb", qx.astype(np.int64), qw.astype(np.int64))
    return (dots * dx[..., None, :].astype(np.float64) * dw.astype(np.float64)).sum(-1)


def split_layout(raw, k):
    """A Q8_0 weight's bytes as the GPU stores them split (q8_layout.h): the quants' rows, then the scales'."""
    blocks = np.ascontiguousarray(raw).reshape(len(raw), k // 32, 34)
    return np.concatenate([blocks[..., 2:].reshape(-1), blocks[..., :2].reshape(-1)])
