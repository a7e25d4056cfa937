"""Parity with PyTorch on PyTorch's own test data: the OpInfo database (torch's common_methods_invocations.op_db).

For every OpInfo entry luminal has a callable for (tests/opinfo_map.py: torch's name as a luminal Tensor method or
function, or an explicit row where the name or argument order differs), the entry's sample inputs run through luminal
and through torch, and the results are compared: values, shapes and result dtypes. test_opinfo runs one entry in one
dtype on one backend: float32 samples (int32/int64 for integer-only ops), and float16/bfloat16 samples (where torch's
CPU kernels don't take the dtype: the float32 samples rounded to it, torch computing in float32 from the rounded
values; likewise where a half kernel raises), within helpers.TOL (plus, for sums of products, two roundings per unit
of the sums of |products|). Backends: conftest's reference executor, CPU backend and CUDA where a GPU is present; the
NVRTC codegen check only with LUMINAL_OPINFO_NVRTC=1 (OpInfo's many shapes make about a thousand distinct kernels per
dtype: minutes of NVRTC on CI's two cores). A failing sample fails the test unless opinfo_map.KNOWN_FAILURES lists it
with its reason (test_known_failures_current fails for a row nothing fails any more); a sample luminal refuses with
NotImplementedError is a miss, not a failure.

Coverage (test_coverage). M: the op_db entries (name plus variant, each counted once) that opinfo_map.excluded()
keeps: all but the fft, linalg, sparse, special, masked, signal, float8, jiterator and private families, random ops,
uninitialised memory, in-place-only/storage ops, backward kernels, complex numbers, conversions to dtypes luminal
lacks, factorisations and solvers, and ops returning Python values (opinfo_map's docstring lists them). N: the entries
luminal supports: it has a callable, refuses none of the applicable samples of the entry's first dtype (float32 for
float ops), and every one of them passes on the reference executor and on the CPU backend (or at least 90% pass and
each failing one is a known failure). The test prints "luminal supports N of M OpInfo ops" and fails if N falls below
the number in tests/opinfo_floor.txt. LUMINAL_OPINFO_REPORT=path writes the supported entries (with the luminal
callable), the unsupported ones with why (missing op, refused or failing samples), the excluded ones with why, the
skipped samples by reason and any unexpected failure; `python tests/test_opinfo.py` prints the unexpected failures as
KNOWN_FAILURES rows.

Skipped per sample, counted by reason and never as a pass: complex or float64 tensors or dtype arguments, int64
values beyond int32, out=, device/memory-format/generator arguments other than the defaults, dropout_p > 0 (random),
a tensor over MAX_NUMEL elements or a graph computing over MAX_WORK (the reference executor runs element by element),
and empty tensors where the op fails on them. Of an entry's first SCAN samples (OpInfo's sample generator, seeded),
MAX_SAMPLES spread evenly over the applicable ones run, all in one graph per backend.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import random

import numpy as np
import pytest
import torch

import luminal as lm
from conftest import BACKENDS
from helpers import TOL, TORCH_TO_LM, as_dtype, torch_to_numpy
from opinfo_map import KNOWN_FAILURES, SUM_OF_PRODUCTS, excluded, has_luminal, key, primary_dtype, resolve

from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402 - needs the expecttest package

MAX_SAMPLES = {"float16": 4, "bfloat16": 4}  # samples run per entry and dtype (default below)
MAX_SAMPLES_DEFAULT = 8
SCAN = 64  # samples looked at per entry and dtype (OpInfo's first ones are the smallest; variants come later)
MAX_NUMEL = 20_000  # elements in one input tensor
MAX_WORK = 1_000_000  # elements computed by one sample's graph (sorting 8000 values compares 64M pairs)
LOW = ("float16", "bfloat16")
LOW_EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}  # machine epsilon
FLOOR_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "opinfo_floor.txt")

OPS = {key(op): op for op in op_db if excluded(op) is None}  # the M entries
TORCH_DTYPE = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
               "int32": torch.int32, "int64": torch.int64, "bool": torch.bool, "uint8": torch.uint8}
LM_DTYPE = {torch.float32: lm.float32, torch.float16: lm.float16, torch.bfloat16: lm.bfloat16,
            torch.int32: lm.int32, torch.int64: lm.int32, torch.bool: lm.bool, torch.uint8: lm.uint8}
INT32 = np.iinfo(np.int32)


def dtypes_of(op) -> list[str]:
    p = primary_dtype(op)
    return [p, *LOW] if p == "float32" else [p]


class Skip(Exception):
    """A sample luminal can't take: counted by reason, never a pass."""


@dataclasses.dataclass
class Outcome:
    status: str  # "pass", "fail", "skip", or "unsupported" (luminal raised NotImplementedError: a miss, no bug)
    detail: str = ""


# ---- samples --------------------------------------------------------------------------------------------------------
_SAMPLES: dict = {}


def samples(op, dtype: str) -> list:
    """[(index, SampleInput, native)]: the entry's first SCAN samples made in `dtype` (seeded); for a low dtype the op
    doesn't take in torch, its float32 samples rounded to that dtype (native=False)."""
    k = (key(op), dtype)
    if k not in _SAMPLES:
        td = TORCH_DTYPE[dtype]
        native = td in op.supported_dtypes("cpu")
        # The generator OpInfo.sample_inputs wraps (the wrapper inspects the call stack for a unittest test on every
        # call: most of this module's time), seeded the same for every entry; some use Python's or numpy's RNG too.
        saved = random.getstate(), np.random.get_state()
        with torch.random.fork_rng():
            torch.manual_seed(0)
            random.seed(0)
            np.random.seed(0)
            gen = op.sample_inputs_func(op, "cpu", td if native else torch.float32, False)
            out = []
            for i, s in enumerate(itertools.islice(gen, SCAN)):
                if not native:
                    s = s.transform(lambda t: t.to(td).float() if isinstance(t, torch.Tensor) and
                                    t.is_floating_point() else t)
                out.append((i, s, native))
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        _SAMPLES[k] = out
    return _SAMPLES[k]


def _spread(xs: list, n: int) -> list:
    """n items spread evenly over xs, first and last included (all of them if there are n or fewer)."""
    if len(xs) <= n:
        return xs
    return [xs[round(i * (len(xs) - 1) / (n - 1))] for i in range(n)]


def _tensors(v):
    """Every tensor in a nested sample value."""
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from _tensors(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _tensors(x)


# ---- torch's side ---------------------------------------------------------------------------------------------------
def reference(op, sample, dtype: str, native: bool):
    """(torch's result, computed_in_float32): in the sample's dtype, or from the same values in float32 where torch
    has no kernel for a low dtype."""
    sample = sample.transform(lambda t: t.clone() if isinstance(t, torch.Tensor) else t)  # torch may write to it
    if native:
        try:
            return op(sample.input, *sample.args, **sample.kwargs), False
        except Exception as e:  # noqa: BLE001 - any torch error: a low dtype retries in float32
            if dtype not in LOW:
                raise Skip(f"torch raises ({type(e).__name__})") from e
        sample = sample.transform(lambda t: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t)
    try:
        return op(sample.input, *sample.args, **sample.kwargs), dtype in LOW
    except Exception as e:  # noqa: BLE001
        raise Skip(f"torch raises ({type(e).__name__})") from e


def magnitude(op, sample, dtype: str, want):
    """For an entry in SUM_OF_PRODUCTS in a low dtype: the op over |inputs| in float32 (the sums of |products| its
    rounding error scales with), else None."""
    if dtype not in LOW or key(op) not in SUM_OF_PRODUCTS or not isinstance(want, torch.Tensor):
        return None
    absolute = sample.transform(lambda v: v.abs().float() if isinstance(v, torch.Tensor) and v.is_floating_point()
                                else abs(v) if isinstance(v, float) else v)
    return op(absolute.input, *absolute.args, **absolute.kwargs).abs()


# ---- luminal's side -------------------------------------------------------------------------------------------------
class Translator:
    """A sample's values as luminal's: tensors become graph inputs holding their data, torch dtypes luminal dtypes,
    Python values pass through. With cx None it only checks that the values translate."""

    def __init__(self, cx: lm.Graph | None, dtype: str, native: bool):
        # native False: the sample's float32 tensors hold `dtype` values (rounded), so they go in as `dtype`.
        self.cx, self.dtype, self.native, self.n = cx, dtype, native, 0

    def __call__(self, v):
        if isinstance(v, torch.Tensor):
            return self.tensor(v)
        if isinstance(v, torch.Size):
            return tuple(v)
        if isinstance(v, (list, tuple)):
            out = [self(x) for x in v]
            return out if isinstance(v, list) else tuple(out)
        if isinstance(v, torch.dtype):
            if v not in LM_DTYPE:
                raise Skip(f"{v} argument")
            return LM_DTYPE[v]
        if isinstance(v, complex):
            raise Skip("complex scalar")
        if v is None or v is Ellipsis or isinstance(v, (bool, int, float, str, slice)):
            return v
        raise Skip(f"{type(v).__name__} argument")

    def kwargs(self, kw: dict) -> dict:
        """Keyword arguments. Those that only steer torch's allocation (device, layout, pin_memory, requires_grad,
        a default memory format) are dropped: a lazy graph decides where and how it stores."""
        out = {}
        for k, v in kw.items():
            if k == "out":
                raise Skip("out=")
            if k == "dropout_p" and v:
                raise Skip("random (dropout_p > 0)")
            if k == "device" and torch.device(v).type == "cpu" or k == "layout" and v == torch.strided or \
                    k in ("pin_memory", "requires_grad") and v is False or \
                    k == "memory_format" and v in (torch.preserve_format, torch.contiguous_format):
                continue
            out[k] = self(v)
        return out

    def tensor(self, t: torch.Tensor):
        if t.layout != torch.strided:
            raise Skip("sparse tensor")
        if t.is_complex():
            raise Skip("complex tensor")
        if t.dtype == torch.float64:
            raise Skip("float64 tensor")
        if t.numel() > MAX_NUMEL:
            raise Skip(f"a tensor over {MAX_NUMEL} elements")
        if t.is_floating_point():
            d = TORCH_TO_LM[t.dtype] if self.native else self.dtype
            arr = t.detach().float().numpy()
        elif t.dtype in (torch.bool, torch.uint8):
            d, arr = TORCH_TO_LM[t.dtype], t.numpy()
        elif t.dtype in (torch.int64, torch.int32, torch.int16, torch.int8):
            arr = t.numpy()
            if arr.size and (arr.min() < INT32.min or arr.max() > INT32.max):
                raise Skip("int64 values beyond int32")
            d, arr = "int32", arr.astype(np.int32)
        else:
            raise Skip(f"{t.dtype} tensor")
        self.n += 1
        if self.cx is None:
            return None
        return self.cx.tensor(tuple(t.shape), dtype=d, name=f"x{self.n}").set(as_dtype(arr, d))


def _outputs(res):
    """Marks every luminal tensor in a result as a graph output (same nesting; sequences become lists)."""
    if isinstance(res, lm.Tensor):
        return res.output()
    if isinstance(res, (list, tuple)):
        return [_outputs(r) for r in res]
    return res


def _work(cx: lm.Graph, first: int) -> int:
    """Elements computed by the nodes numbered `first` on (the reference executor's time goes with it)."""
    total = 0
    for nid in cx.nodes():
        if nid >= first:
            n = 1
            for d in cx.node(nid).shape:
                n *= int(d) if d.is_const() else 1
            total += n
    return total


# ---- comparing ------------------------------------------------------------------------------------------------------
def _expected_dtype(w: torch.Tensor, dtype: str, in_f32: bool) -> str:
    if w.is_complex() or w.dtype not in TORCH_TO_LM:
        raise Skip(f"{w.dtype} result")
    want = TORCH_TO_LM[w.dtype]
    return dtype if in_f32 and want == "float32" else want  # torch computed in float32 for the low dtype


def _close(g: np.ndarray, w: np.ndarray, dtype: str, mag, path: str):
    """g == w within the dtype's tolerance, plus, for a sum of products (mag: the same sums of |products|), two
    roundings of the dtype per unit of magnitude: where terms cancel, that is the error a low dtype leaves."""
    atol, rtol = TOL[dtype if dtype in LOW else "float32"]
    if mag is None:
        np.testing.assert_allclose(g, w, atol=atol, rtol=rtol, equal_nan=True, err_msg=path)
        return
    allowed = atol + rtol * np.abs(w) + 2 * LOW_EPS[dtype] * torch_to_numpy(mag).astype(np.float64)
    off = ~(np.abs(g - w) <= allowed) & ~(np.isnan(g) & np.isnan(w))
    if off.any():
        at = tuple(np.argwhere(off)[0])
        raise AssertionError(f"{path}: {int(off.sum())} of {g.size} elements differ beyond tolerance "
                             f"(atol {atol}, rtol {rtol}, + 2 eps x magnitude); first at {at}: luminal {g[at]}, "
                             f"torch {w[at]}, allowed {allowed[at]:.3g}")


def compare(cx, got, want, dtype: str, in_f32: bool, mag=None, path: str = "result"):
    """Asserts luminal's result (outputs, nested like torch's) equals torch's within the dtype's tolerance."""
    if isinstance(want, torch.Tensor):
        wd = _expected_dtype(want, dtype, in_f32)
        w = torch_to_numpy(want)
        if want.dtype == torch.int64 and w.size and (w.min() < INT32.min or w.max() > INT32.max):
            raise Skip("int64 result beyond int32")
        if not isinstance(got, lm.Tensor):
            raise AssertionError(f"{path}: luminal gives {type(got).__name__}, torch a tensor")
        g = got.numpy()
        static = tuple(int(d) if not isinstance(d, lm.Expr) else d.eval(cx.dims) for d in got.shape)
        assert static == g.shape, f"{path}: Tensor.shape {got.shape} at build time, computed {g.shape}"
        assert g.shape == w.shape, f"{path}: shape {g.shape}, torch gives {w.shape}"
        assert got.dtype.name == wd, f"{path}: dtype {got.dtype.name}, torch gives {wd}"
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g.astype(np.int64), w.astype(np.int64), err_msg=path)
        else:
            _close(g.astype(np.float64), w.astype(np.float64), dtype, mag, path)
    elif isinstance(want, (list, tuple)) and not isinstance(want, torch.Size):
        if not isinstance(got, (list, tuple)):
            raise AssertionError(f"{path}: luminal gives {type(got).__name__}, torch a sequence of {len(want)}")
        assert len(got) == len(want), f"{path}: {len(got)} results, torch gives {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            compare(cx, g, w, dtype, in_f32, None, f"{path}[{i}]")
    else:  # a Python value (torch.Size, a number, None)
        g = tuple(got) if isinstance(want, torch.Size) and isinstance(got, (list, tuple)) else got
        assert g == want, f"{path}: luminal gives {got!r}, torch {want!r}"


# ---- running an entry -----------------------------------------------------------------------------------------------
def _fail(e: BaseException, stage: str) -> Outcome:
    msg = " ".join(str(e).split())
    return Outcome("fail", f"{stage}: {type(e).__name__}: {msg[:400]}")


def _run_group(op, dtype: str, backend, items: list) -> dict[int, Outcome]:
    """Builds the samples in `items` ([(index, sample, native, want, in_f32)]) into one graph, runs it and compares.
    A compile or run error with several samples runs each alone, to name the one that fails."""
    out: dict[int, Outcome] = {}
    cx = lm.Graph()
    built = []
    with cx:
        for idx, s, native, want, in_f32 in items:
            tr = Translator(cx, dtype, native)
            try:
                x, args, kwargs = tr(s.input), tr(s.args), tr.kwargs(s.kwargs)
                found = resolve(op, isinstance(x, lm.Tensor))
                if found is None:
                    raise Skip("luminal's op takes a tensor, this sample's input is not one")
                first = max(cx.nodes(), default=-1) + 1
                res = found[0](x, args, kwargs)
                if _work(cx, first) > MAX_WORK:  # not marked as outputs: dead-node removal drops it
                    raise Skip(f"a graph computing over {MAX_WORK} elements")
                res = _outputs(res)
            except Skip as e:
                out[idx] = Outcome("skip", str(e))
                continue
            except NotImplementedError as e:  # luminal says clearly it lacks this feature: a miss, not a bug
                out[idx] = Outcome("unsupported", f"{type(e).__name__}: {' '.join(str(e).split())[:200]}")
                continue
            except Exception as e:  # noqa: BLE001 - luminal rejected the call: a failing sample
                out[idx] = _fail(e, "build")
                continue
            built.append((idx, s, want, in_f32, res))
    if not built:
        return out
    try:
        cx.compile(lm.GenericCompiler(), *backend.compilers(dtype if dtype in LOW else "float32"))
        cx.execute()
    except Exception as e:  # noqa: BLE001
        if len(built) == 1:
            out[built[0][0]] = Outcome("unsupported", f"{type(e).__name__}: {e}") if isinstance(
                e, NotImplementedError) else _fail(e, "compile/run")
            return out
        ran = {b[0] for b in built}
        for it in items:
            if it[0] in ran:
                out.update(_run_group(op, dtype, backend, [it]))
        return out
    for idx, s, want, in_f32, res in built:
        try:
            compare(cx, res, want, dtype, in_f32, magnitude(op, s, dtype, want))
            out[idx] = Outcome("pass")
        except Skip as e:
            out[idx] = Outcome("skip", str(e))
        except Exception as e:  # noqa: BLE001
            out[idx] = _fail(e, "compare")
    return out


_RESULTS: dict = {}


def results(op, dtype: str, backend) -> dict[int, Outcome]:
    """{sample index: outcome} for the entry in `dtype` on `backend` (cached for the session)."""
    k = (key(op), dtype, backend.name)
    if k in _RESULTS:
        return _RESULTS[k]
    out: dict[int, Outcome] = {}
    fit = []
    for idx, s, native in samples(op, dtype):
        try:
            tr = Translator(None, dtype, native)
            tr(s.input), tr(s.args), tr.kwargs(s.kwargs)
        except Skip as e:
            out[idx] = Outcome("skip", str(e))
            continue
        fit.append((idx, s, native))
    items = []
    for idx, s, native in _spread(fit, MAX_SAMPLES.get(dtype, MAX_SAMPLES_DEFAULT)):
        try:
            want, in_f32 = reference(op, s, dtype, native)
        except Skip as e:
            out[idx] = Outcome("skip", str(e))
            continue
        items.append((idx, s, native, want, in_f32))
    out.update(_run_group(op, dtype, backend, items))
    for idx, s, native, want, in_f32 in items:  # luminal may not take empty tensors: counted neither way
        if out[idx].status == "fail" and any(t.numel() == 0 for t in _tensors([s.input, s.args, s.kwargs, want])):
            out[idx] = Outcome("skip", "empty tensor (fails)")
    _RESULTS[k] = dict(sorted(out.items()))
    return _RESULTS[k]


# ---- known failures -------------------------------------------------------------------------------------------------
def _selected(selector: str, dtype: str, backend_name: str) -> bool:
    return selector in ("*", dtype, backend_name, f"{backend_name}:{dtype}")


def known_reason(k: str, dtype: str, backend_name: str, idx: int, detail: str) -> str | None:
    """The KNOWN_FAILURES reason covering this failing sample, if any."""
    for selector, match, reason in KNOWN_FAILURES.get(k, ()):
        if _selected(selector, dtype, backend_name) and _matches(match, idx, detail):
            return reason
    return None


def _matches(match, idx: int, detail: str) -> bool:
    """A row's match: "*" (every sample), a sample index, or a piece of the failure's message."""
    if match == "*":
        return True
    return match in detail if isinstance(match, str) else match == idx


def verdict(k: str, dtype: str, backend_name: str, res: dict[int, Outcome]):
    """(unexpected failures {index: detail}, known failures {index: reason}, unsupported {index: detail},
    n applicable, n passed)."""
    bad, kn = {}, {}
    for i, o in res.items():
        if o.status == "fail":
            why = known_reason(k, dtype, backend_name, i, o.detail)
            (kn if why else bad)[i] = why or o.detail
    unsup = {i: o.detail for i, o in res.items() if o.status == "unsupported"}
    ran = sum(o.status != "skip" for o in res.values())
    return bad, kn, unsup, ran, sum(o.status == "pass" for o in res.values())


def _backends(names) -> list:
    """conftest's backends of these names that can run here."""
    names = set(names)
    return [b for b in BACKENDS if b.name in names and b.skip_reason() is None]


# ---- tests ----------------------------------------------------------------------------------------------------------
CASES = [(k, d) for k, op in OPS.items() if has_luminal(op) for d in dtypes_of(op)]
RUN_ON = [b for b in BACKENDS if b.name != "cuda-nvrtc" or os.environ.get("LUMINAL_OPINFO_NVRTC")]


@pytest.mark.parametrize("k,dtype", CASES, ids=[f"{k}-{d}" for k, d in CASES])
@pytest.mark.parametrize("backend", RUN_ON, ids=str)
def test_opinfo(backend, k, dtype):
    reason = backend.skip_reason()
    if reason:
        pytest.skip(f"backend {backend.name}: {reason}")
    res = results(OPS[k], dtype, backend)
    bad, kn, unsup, n, npass = verdict(k, dtype, backend.name, res)
    assert not bad, f"{k} [{dtype}, {backend.name}]: {len(bad)} of {n} samples fail (fix, or list them with the " \
                    f"reason in opinfo_map.KNOWN_FAILURES):\n" + "\n".join(f"  sample {i}: {d}" for i, d in bad.items())
    if npass == 0:  # nothing compared equal: not a pass
        why = collections.Counter([o.detail for o in res.values() if o.status == "skip"] + list(kn.values()) +
                                  list(unsup.values()))
        pytest.skip(f"no sample passes ({dict(why)})")


def supported(k: str, op, backends) -> tuple[bool, str]:
    """(supported, why not): every applicable sample of the entry's first dtype passes on each backend (or at least
    90% pass and each failure is a known one). A sample luminal refuses (NotImplementedError) is a miss."""
    if not has_luminal(op):
        return False, "missing op"
    d = primary_dtype(op)
    for b in backends:
        res = results(op, d, b)
        bad, kn, unsup, n, npass = verdict(k, d, b.name, res)
        if n == 0:
            skipped = collections.Counter(o.detail for o in res.values())
            return False, f"no applicable sample ({', '.join(f'{r} x{c}' for r, c in skipped.items())})"
        if bad:
            return False, f"failing samples on {b.name} [{d}]: {len(bad)} of {n}; first: {next(iter(bad.values()))}"
        if unsup:
            return False, f"luminal refuses {len(unsup)} of {n} samples: {next(iter(unsup.values()))}"
        if npass < 0.9 * n:
            return False, f"known failures on {b.name} [{d}], {n - npass} of {n} samples: " + \
                "; ".join(sorted(set(kn.values())))
    return True, ""


class _Summary:
    """Puts the coverage line in pytest's closing summary (a test's output is captured)."""

    def __init__(self, line):
        self.line = line

    def pytest_terminal_summary(self, terminalreporter):
        terminalreporter.write_line(self.line)


def test_coverage(request):
    backends = _backends(("reference", "cpu"))
    status = {k: supported(k, op, backends) for k, op in OPS.items()}
    n, m = sum(ok for ok, _ in status.values()), len(OPS)
    line = f"luminal supports {n} of {m} OpInfo ops"
    print(line)
    if not request.config.pluginmanager.has_plugin("luminal_opinfo_summary"):
        request.config.pluginmanager.register(_Summary(line), "luminal_opinfo_summary")
    path = os.environ.get("LUMINAL_OPINFO_REPORT")
    if path:
        write_report(path, line, status, backends)
    with open(FLOOR_FILE) as f:
        floor = int(f.read().split()[0])
    assert n >= floor, f"{line}: below the floor {floor} in {FLOOR_FILE} (LUMINAL_OPINFO_REPORT=path says why)"


def test_known_failures_current():
    """Every KNOWN_FAILURES row still matches a failing sample somewhere (else the op got fixed: drop the row)."""
    stale = []
    for k, rows in KNOWN_FAILURES.items():
        assert k in OPS, f"KNOWN_FAILURES names {k!r}, which is no OpInfo entry in M"
        for selector, match, reason in rows:
            hit = False
            for d in dtypes_of(OPS[k]):
                for b in _backends(r.name for r in RUN_ON):
                    if _selected(selector, d, b.name) and has_luminal(OPS[k]):
                        hit |= any(o.status == "fail" and _matches(match, i, o.detail)
                                   for i, o in results(OPS[k], d, b).items())
            if not hit:
                stale.append(f"{k}: ({selector!r}, {match!r}, {reason!r})")
    assert not stale, "KNOWN_FAILURES rows that no sample fails any more (remove them):\n  " + "\n  ".join(stale)


# ---- reports --------------------------------------------------------------------------------------------------------
def _unexpected():
    return [(k, d, b, i, det) for (k, d, b), res in sorted(_RESULTS.items())
            for i, det in verdict(k, d, b, res)[0].items()]


def write_report(path, line, status, backends):
    """The supported entries (with the luminal callable), the unsupported ones with why, the excluded ones with why,
    the skipped samples by reason, and every unexpected sample failure."""
    sup = sorted(k for k, (ok, _) in status.items() if ok)
    uns = sorted((k, why) for k, (ok, why) in status.items() if not ok)
    ex = sorted((key(op), excluded(op)) for op in op_db if excluded(op))
    skips = collections.Counter(o.detail for res in _RESULTS.values() for o in res.values() if o.status == "skip")
    fails = _unexpected()
    out = [line, "",
           f"M: op_db entries that tests/opinfo_map.py's excluded() keeps. Supported: every applicable sample of the "
           f"entry's first dtype passes on {' and '.join(b.name for b in backends)}.", "",
           f"## supported ({len(sup)})",
           *(f"{k}  -> {(resolve(OPS[k], True) or resolve(OPS[k], False))[1]}" for k in sup), "",
           f"## unsupported ({len(uns)})", *(f"{k}: {why}" for k, why in uns), "",
           f"## excluded from M ({len(ex)})", *(f"{k}: {why}" for k, why in ex), "",
           "## skipped samples by reason (over every entry, dtype and backend run)",
           *(f"{c:6d}  {r}" for r, c in skips.most_common()), "",
           f"## unexpected sample failures ({len(fails)})",
           *(f"{k} [{b}:{d}] sample {i}: {det}" for k, d, b, i, det in fails), ""]
    with open(path, "w") as f:
        f.write("\n".join(out))


def suggest_rows() -> str:
    """The unexpected failures of every case on the backends here, as KNOWN_FAILURES rows (the error message stands
    in for the reason: rewrite it as one; a piece of the message can stand for the sample index)."""
    backends = [b.name for b in _backends(r.name for r in RUN_ON)]
    for k, d in CASES:
        for b in _backends(backends):
            results(OPS[k], d, b)
    where = collections.defaultdict(set)  # (entry, index, message) -> {(backend, dtype)}
    for k, d, b, i, det in _unexpected():
        where[(k, i, det[:90])].add((b, d))
    lines, last = [], None
    for (k, i, det), at in sorted(where.items()):
        dts = dtypes_of(OPS[k])
        sels = [d for d in dts if all((b, d) in at for b in backends)]
        sels += [f"{b}:{d}" for b, d in sorted(at) if d not in sels]
        if len(sels) == len(dts) and set(sels) == set(dts):
            sels = ["*"]
        if k != last:
            lines += ["    ],"] if last else []
            lines.append(f"    {k!r}: [")
            last = k
        lines += [f"        ({sel!r}, {i}, {det!r})," for sel in sels]
    return "\n".join(lines + (["    ],"] if last else []))


if __name__ == "__main__":
    print(suggest_rows())
