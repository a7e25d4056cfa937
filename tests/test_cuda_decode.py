"""Fewer kernels per decode step on the GPU: a row program (RMSNorm) that only a matrix-vector group reads is that
group's prologue (the group's kernel computes the normalised rows into shared memory first; the norm's own kernel
does not run), and the flash-decode kernel merges its key ranges itself (the last range of a tile to finish, by a
ticket it sets back to zero; no combine kernel). Parity against torch on every backend (reference, CPU, the NVRTC
compile, the GPU), and the kernels of a Llama decode layer counted (without a GPU from the printed module)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import luminal as lm
import luminal.nn.functional as F
from helpers import needs_cuda

gpu = pytest.mark.skipif(needs_cuda() is not None, reason=str(needs_cuda()))


def _rms(x, w, eps):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)


@pytest.mark.parametrize("tokens,k", [(1, 64), (1, 203), (3, 64)])
def test_norm_is_the_prologue_of_the_products_reading_it(backend, tokens, k, rng):
    """RMSNorm before q/k (two products), before gate/up (an epilogue: silu(gate) * up) and before one product (the
    logits): each is its group's prologue. A norm that something else reads too keeps its own kernel. An odd row
    length (unaligned rows: no matrix-vector kernel) and 3 rows run the steps one by one, norms included."""
    reason = backend.skip_reason()
    if reason:
        pytest.skip(f"backend {backend.name}: {reason}")
    names = {"q": 40, "k": 24, "g": 48, "u": 48, "l": 72, "z": 16}
    ws = {n: rng.data((r, k)).astype(np.float32) for n, r in names.items()}
    ns = {n: rng.data((k,)).astype(np.float32) for n in ("n1", "n2", "n3", "n4")}
    xv = rng.data((tokens, k)).astype(np.float32)
    g = lm.Graph()
    x = g.tensor((tokens, k), name="x").set(xv)
    w = {n: g.tensor(v.shape, name=n).set(v) for n, v in {**ws, **ns}.items()}
    h1 = x.rms_norm(k, w["n1"], 1e-5)
    q, kk = (h1 @ w["q"].T).output(), (h1 @ w["k"].T).output()
    h2 = (x * 2).rms_norm(k, w["n2"], 1e-5)
    m = ((h2 @ w["g"].T).silu() * (h2 @ w["u"].T)).output()
    logits = ((x + 0.5).rms_norm(k, w["n3"], 1e-5) @ w["l"].T).output()
    h4 = (x - 1).rms_norm(k, w["n4"], 1e-5)
    z, h4o = (h4 @ w["z"].T).output(), h4.output()
    comps = backend.compilers("float32")
    g.compile(lm.GenericCompiler(), *comps)
    for cc in comps:
        if isinstance(cc, lm.CudaCompiler):  # the groups: q/k, gate/up, logits, each with its norm first
            groups = cc.schedule.groups()
            assert sorted(len(ids) for _, ids in groups) == [2, 3, 4], groups
    g.execute()
    t = {n: torch.from_numpy(v).double() for n, v in {**ws, **ns}.items()}
    xt = torch.from_numpy(xv).double()
    r1, r2, r4 = _rms(xt, t["n1"], 1e-5), _rms(xt * 2, t["n2"], 1e-5), _rms(xt - 1, t["n4"], 1e-5)
    pg = r2 @ t["g"].T
    wants = [r1 @ t["q"].T, r1 @ t["k"].T, torch.nn.functional.silu(pg) * (r2 @ t["u"].T),
             _rms(xt + 0.5, t["n3"], 1e-5) @ t["l"].T, r4 @ t["z"].T, r4]
    for o, want in zip((q, kk, m, logits, z, h4o), wants):
        want = want.numpy()
        np.testing.assert_allclose(o.numpy(), want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=repr(rng))
    if backend.name == "cuda":  # aligned rows: a launch per group (norms inside) and per other kernel step; an
        # odd row length: the groups' steps one by one, their norms included. (3 rows: the timed choice between
        # the matrix-vector kernel and the GEMMs decides, so only the odd length is asserted to split.)
        sites = _launch_sites(next(c for c in comps if isinstance(c, lm.CudaCompiler)).schedule)
        launched = g._runtime.rt.last_launches()
        if tokens == 1:
            assert launched == sites if k % 8 == 0 else launched > sites, (launched, sites)
        else:
            assert launched >= sites, (launched, sites)


def _decode_graph(n_layers):
    """A tiny Llama's decode graph (token ids, per layer a KV cache of symbolic length) on the CUDA lowering."""
    from luminal.nn import Llama, LlamaConfig

    cfg = LlamaConfig(vocab_size=61, hidden=64, ffn=96, n_layers=n_layers, n_heads=4, n_kv_heads=2, head_dim=16)
    model = Llama(cfg)
    g = model.graph
    caches = [(g.tensor(("c", 2, 16)), g.tensor(("c", 2, 16))) for _ in range(n_layers)]
    logits, new = model.forward(g.tensor(("s",), dtype=lm.int32), caches, "p", last_only=True)
    logits.output()
    for kc, vc in new:
        kc.output(), vc.output()
    comp = lm.CudaCompiler("bfloat16", device=None)
    g.compile(lm.GenericCompiler(), comp)
    return comp.schedule


def _launch_sites(m):
    """Kernels a run may launch: one per group, one per kernel step outside the groups (a group's prologue is in
    its group)."""
    in_group = {i for _, ids in m.groups() for i in ids}
    return len(m.groups()) + sum(1 for node, _, _ in m.kernels() if node not in in_group)


def test_llama_decode_layer_kernel_count(monkeypatch):
    """Per Llama layer, printed (no GPU): the q/k/v group with its RMSNorm, the rotations and cache writes (a batch;
    the k rotation computed by its cache write), attention, the heads' copy (the identity for one token: skipped),
    the o group (residual add), the gate/up group with its RMSNorm (SwiGLU) and the down group (residual add): 8
    sites, 6 launches at decode. Without prologues (LUMINAL_CUDA_PROLOGUE=0) both norms are kernels of their own."""
    assert _launch_sites(_decode_graph(3)) - _launch_sites(_decode_graph(2)) == 8
    groups = _decode_graph(2).groups()
    assert sum(1 for _, ids in groups if len(ids) == 4) == 2 * 2 + 0, groups  # q/k/v + norm, gate/up + norm + SwiGLU
    monkeypatch.setenv("LUMINAL_CUDA_PROLOGUE", "0")
    assert _launch_sites(_decode_graph(3)) - _launch_sites(_decode_graph(2)) == 10


@gpu
@pytest.mark.parametrize("graphs", ["1", "0"])
def test_llama_decode_launches_per_layer(graphs, rng, monkeypatch):
    """On the GPU, a decode step launches 6 kernels per layer (see above), and the logits match the CPU backend's
    at every step, with CUDA graphs on and off."""
    from luminal.nn import Llama, LlamaConfig, Session

    monkeypatch.setenv("LUMINAL_CUDA_GRAPHS", graphs)
    counts = {}
    for n_layers in (2, 3):
        cfg = LlamaConfig(vocab_size=61, hidden=64, ffn=96, n_layers=n_layers, n_heads=4, n_kv_heads=2, head_dim=16)
        weights, sessions = None, []
        for comps in ([lm.CPUCompiler()], [lm.CudaCompiler("float32")]):
            model = Llama(cfg)
            if weights is None:
                weights = {n: rng.data(tuple(int(d) for d in p.shape)).astype(np.float32) * 0.3
                           for n, p in model.named_parameters()}
            for n, p in model.named_parameters():
                p.set(weights[n])
            sessions.append(Session(model, [lm.GenericCompiler()] + comps, capacity=4))
        ids = rng.integers(0, cfg.vocab_size, (12,))
        for s in sessions:
            s.reset()
        outs = [[s.step(ids[:3]) for s in sessions]]
        for t in ids[3:]:
            outs.append([s.step(np.array([t])) for s in sessions])
        for i, (cpu, gpu_) in enumerate(outs):
            np.testing.assert_allclose(np.asarray(gpu_), np.asarray(cpu), rtol=2e-4, atol=2e-4, err_msg=f"step {i}")
        counts[n_layers] = sessions[1].graph._runtime.rt.last_launches()
    assert counts[3] - counts[2] == 6, counts


@gpu
@pytest.mark.parametrize("tickets", ["1", "0"])
def test_decode_key_ranges_merge_run_after_run(tickets, rng, monkeypatch):
    """Flash-decode over key ranges of 32 (LUMINAL_CUDA_ATTENTION_CHUNK), run after run as the cache grows and
    shrinks (the tickets must be back at zero after each launch and each CUDA graph replay), one range and many;
    LUMINAL_CUDA_DECODE_TICKETS=0 merges them in the combine kernel instead. Against torch's SDPA."""
    monkeypatch.setenv("LUMINAL_CUDA_ATTENTION_CHUNK", "32")
    monkeypatch.setenv("LUMINAL_CUDA_DECODE_TICKETS", tickets)
    g = lm.Graph()
    q = g.tensor((1, 8, 1, 64), name="q")
    k, v = g.tensor((1, 2, "t", 64), name="k"), g.tensor((1, 2, "t", 64), name="v")
    o = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).output()
    g.compile(lm.GenericCompiler(), lm.CudaCompiler("float32"))
    for t in (5, 700, 700, 33, 1000, 700):
        arrs = [rng.data((1, 8, 1, 64)), rng.data((1, 2, t, 64)), rng.data((1, 2, t, 64))]
        arrs = [a.astype(np.float32) for a in arrs]
        for x, a in zip((q, k, v), arrs):
            x.set(a)
        g.execute()
        want = torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, arrs), enable_gqa=True).numpy()
        np.testing.assert_allclose(o.numpy(), want, rtol=1e-4, atol=1e-5, err_msg=f"{t} keys; {rng!r}")
