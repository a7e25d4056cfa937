"""PyTorch's OpInfo samples through torch.compile(backend="luminal"): each sample's call, captured by dynamo, lowered
by AOT autograd and translated to luminal with no aten node left to torch, gives torch eager's result.

The entries are test_opinfo's M (opinfo_map.excluded() keeps them) that luminal has a callable for; the samples are
test_opinfo's (seeded, in the entry's first dtype: float32 for float ops), skipping what luminal cannot hold
(float64 or complex tensors, int64 beyond int32, out=, ...). The call is torch's own (OpInfo.op), so what is tested
is the translation of the aten ops torch records, not luminal's spelling of the op.

Compiling costs per graph, so samples run in batches: one compiled function calls BATCH samples, one per line of
its source, with options={"fallback": False} (an aten op without a translation raises UnsupportedOpError); a batch
that fails as a whole runs its samples one by one with fallback allowed, each node left to torch traced back to its
sample by its stack trace (explain's report), so every sample gets its own outcome.

test_first_sample (CI): the first applicable sample of every entry; it prints the coverage line "luminal runs N of M
OpInfo entries through torch.compile". test_sweep (slow, LUMINAL_SLOW=1): up to SWEEP samples per entry, spread as
test_opinfo spreads them. KNOWN_FAILURES lists the entries whose first sample fails, with the reason, and
SWEEP_FAILURES those whose later samples fail: an unlisted failure fails the test, and so does a listed entry that
passes (drop its row). `python tests/test_torch_compile_opinfo.py` prints the current failures as rows.
"""
from __future__ import annotations

import dataclasses
import re
import warnings

import pytest
import torch

import test_opinfo as T
from helpers import TOL
from luminal import torch_backend
from opinfo_map import has_luminal, primary_dtype

BATCH = 24  # samples per compiled function
SWEEP = 8  # samples per entry in the slow sweep
_SOURCE = "<opinfo-batch>"

DATA = "torch's implementation reads tensor data into Python (dynamo cannot capture it in one graph)"
# entry -> why its first sample fails through torch.compile (a fallback, an error or a wrong result).
KNOWN_FAILURES: dict[str, str] = {
    "combinations": "aten.masked_select: the result's shape depends on the data",
    "corrcoef": DATA + ": aten.equal",
    "cov": DATA + ": aten.equal",
    "nn.functional.gaussian_nll_loss": DATA + ": a check that var is positive",
    "nn.functional.one_hot": DATA + ": num_classes=-1 is the data's maximum",
    "tensor_split": DATA + ": split points from a tensor (aten._local_scalar_dense)",
    "histogram": "aten.histogram.bin_ct has no translation",
    "nn.functional.embedding_bag": "aten._embedding_bag_forward_only has no translation",
    "logspace": "torch computes it in float64 (aten.full of float64), which luminal lacks",
    "logspace.tensor_overload": "torch computes it in float64 (aten.full of float64), which luminal lacks",
}
# entry -> why a later sample fails (the first passes).
SWEEP_FAILURES: dict[str, str] = {
    "float_power": "torch computes it in float64, which luminal lacks",
    "gather": "an empty index with fewer dims than the input (luminal's gather wants equal dims)",
    "index_put": "a bool mask as index: the result's shape depends on the data",
    "narrow": DATA + ": a tensor start (aten._local_scalar_dense)",
    "nn.functional.embedding": "max_norm renormalises the weight in place (aten.embedding_renorm)",
    "nn.functional.interpolate.area": "3-d adaptive average pooling (luminal has 1-d and 2-d)",
    "repeat_interleave": "a tensor of counts: the result's shape depends on the data",
    "take": "torch's decomposition reads the data (AOT autograd cannot trace it): runs in torch",
    "unravel_index": "indices beyond int32 (luminal computes int64 values in int32)",
}


# OpInfo's call where it wraps torch's op in something dynamo cannot trace (wrapper_set_seed seeds torch's RNG; the
# samples luminal takes have dropout_p 0).
CALLS = {"nn.functional.scaled_dot_product_attention": torch.nn.functional.scaled_dot_product_attention}


@dataclasses.dataclass
class Item:
    key: str
    index: int  # the sample's index in OpInfo's order
    call: object  # OpInfo.op
    args: tuple  # (input, args, kwargs)
    want: object  # eager's result


@dataclasses.dataclass
class Outcome:
    status: str  # "pass", "fallback", "differs" or "error"
    detail: str = ""


def items(op, n: int | None) -> list[Item]:
    """The entry's first applicable sample (n None), or up to n spread over its applicable samples."""
    k, d = T.key(op), primary_dtype(op)
    fit = []
    for idx, s, native in T.samples(op, d):
        try:
            tr = T.Translator(None, d, native)
            tr(s.input), tr(s.args), tr.kwargs(s.kwargs)
        except T.Skip:
            continue
        fit.append((idx, s, native))
    out = []
    for idx, s, native in (fit if n is None else T._spread(fit, n)):
        try:
            want, _ = T.reference(op, s, d, native)
        except T.Skip:
            continue
        s = s.transform(lambda t: t.clone() if isinstance(t, torch.Tensor) else t)
        out.append(Item(k, idx, CALLS.get(k, op.op), (s.input, tuple(s.args), dict(s.kwargs)), want))
        if n is None:
            break
    return out


def _batch(calls: list):
    """A function calling calls[i] on its i-th argument, each on its own line of source _SOURCE (line i + 2)."""
    lines = ["def batch(calls, *xs):"]
    lines += [f"    r{i} = calls[{i}](xs[{i}][0], *xs[{i}][1], **xs[{i}][2])" for i in range(len(calls))]
    lines.append("    return (" + "".join(f"r{i}, " for i in range(len(calls))) + ")")
    ns: dict = {}
    exec(compile("\n".join(lines) + "\n", _SOURCE, "exec"), ns)
    fn = ns["batch"]
    return lambda *xs: fn(calls, *xs)


def _compare(got, want):
    """Float tensors within float32's tolerance; integers, bools and Python values exactly; the same nesting."""
    from torch.utils._pytree import tree_flatten

    g, _ = tree_flatten(got)
    w, _ = tree_flatten(want)
    assert len(g) == len(w), f"{len(g)} results, eager gives {len(w)}"
    for a, b in zip(g, w):
        tol = TOL["float32"] if isinstance(b, torch.Tensor) and b.is_floating_point() else (0, 0)
        torch.testing.assert_close(a, b, atol=tol[0], rtol=tol[1], equal_nan=True)


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


def run_batch(batch: list[Item], strict: bool) -> dict[int, Outcome] | None:
    """Outcomes by position in the batch, or None when the batch failed as a whole (run its items alone)."""
    report = torch_backend.Explanation()
    options = {"fallback": False} if strict else None
    torch._dynamo.reset()
    fn = torch.compile(_batch([it.call for it in batch]), fullgraph=True, dynamic=False,
                       backend=lambda gm, ex: torch_backend._backend(gm, ex, options, report))
    try:
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            got = fn(*[it.args for it in batch])
    except Exception as e:  # noqa: BLE001 - a sample dynamo or luminal cannot take
        return None if len(batch) > 1 else {0: Outcome("error", _one_line(e))}
    lost = [str(w.message) for w in caught if str(w.message).startswith(("luminal: the graph", "luminal: partition"))]
    if lost:  # a graph or partition luminal failed to compile ran in torch: not traceable to one sample
        return None if len(batch) > 1 else {0: Outcome("error", lost[0])}
    out: dict[int, Outcome] = {}
    for f in report.fallbacks:
        m = re.search(rf'File "{_SOURCE}", line (\d+)', f.stack)
        if m is None:
            if len(batch) > 1:
                return None
            at = 0
        else:
            at = int(m.group(1)) - 2
        out.setdefault(at, Outcome("fallback", f"{f.op}: {f.reason}"))
    for i, it in enumerate(batch):
        if i in out:
            continue
        try:
            _compare(got[i], it.want)
            out[i] = Outcome("pass")
        except Exception as e:  # noqa: BLE001
            out[i] = Outcome("differs", _one_line(e))
    return out


def run(all_items: list[Item], expected_to_fail: set) -> dict[tuple[str, int], Outcome]:
    """{(entry, sample index): outcome}. Entries expected to pass run in strict batches, the others with fallback
    allowed; a batch that fails as a whole runs its items alone."""
    results = {}
    for strict in (True, False):
        group = [it for it in all_items if (it.key in expected_to_fail) != strict]
        for at in range(0, len(group), BATCH):
            batch = group[at:at + BATCH]
            res = run_batch(batch, strict)
            if res is None:
                res = {i: run_batch([it], False)[0] for i, it in enumerate(batch)}
            results.update({(it.key, it.index): res[i] for i, it in enumerate(batch)})
    torch._dynamo.reset()
    return results


ENTRIES = {k: op for k, op in T.OPS.items() if has_luminal(op)}


class _Summary:
    def __init__(self, line):
        self.line = line

    def pytest_terminal_summary(self, terminalreporter):
        terminalreporter.write_line(self.line)


def _fmt(rows: dict) -> str:
    return "\n".join(f"  {k!r}: {why!r}," for k, why in sorted(rows.items()))


def test_first_sample(request):
    for k in list(KNOWN_FAILURES) + list(SWEEP_FAILURES):
        assert k in ENTRIES, f"{k!r} is no OpInfo entry luminal has a callable for"
    firsts = [it for op in ENTRIES.values() for it in items(op, None)]
    results = run(firsts, set(KNOWN_FAILURES))
    status = {k: o for (k, _), o in results.items()}
    n = sum(o.status == "pass" for o in status.values())
    line = f"luminal runs {n} of {len(T.OPS)} OpInfo entries through torch.compile (first sample, no fallback; " \
           f"{len(ENTRIES)} have a luminal callable, {len(ENTRIES) - len(status)} no applicable sample)"
    print(line)
    if not request.config.pluginmanager.has_plugin("luminal_tc_opinfo_summary"):
        request.config.pluginmanager.register(_Summary(line), "luminal_tc_opinfo_summary")
    bad = {k: f"{o.status}: {o.detail}" for k, o in status.items() if o.status != "pass" and k not in KNOWN_FAILURES}
    fixed = [k for k in KNOWN_FAILURES if k in status and status[k].status == "pass"]
    assert not bad, f"{len(bad)} entries fail through torch.compile (fix, or list them in KNOWN_FAILURES):\n" + \
        _fmt(bad)
    assert not fixed, f"KNOWN_FAILURES rows that pass now (remove them): {fixed}"


@pytest.mark.slow
def test_sweep():
    every = [it for op in ENTRIES.values() for it in items(op, SWEEP)]
    results = run(every, set(KNOWN_FAILURES) | set(SWEEP_FAILURES))
    failing: dict[str, str] = {}
    for (k, idx), o in sorted(results.items()):
        if o.status != "pass":
            failing.setdefault(k, f"sample {idx}: {o.status}: {o.detail}")
    bad = {k: why for k, why in failing.items() if k not in KNOWN_FAILURES and k not in SWEEP_FAILURES}
    fixed = [k for k in SWEEP_FAILURES if k not in failing]
    assert not bad, f"{len(bad)} entries have failing samples (fix, or list them in SWEEP_FAILURES):\n" + _fmt(bad)
    assert not fixed, f"SWEEP_FAILURES rows whose samples all pass now (remove them): {fixed}"


if __name__ == "__main__":
    import sys

    res = run([it for op in ENTRIES.values() for it in items(op, SWEEP if "--sweep" in sys.argv else None)], set())
    rows: dict[str, str] = {}
    for (k, idx), o in sorted(res.items()):
        if o.status != "pass":
            rows.setdefault(k, f"sample {idx}: {o.status}: {o.detail}")
    print(_fmt(rows))
    print(f"# {sum(o.status == 'pass' for o in res.values())} of {len(res)} samples pass")
