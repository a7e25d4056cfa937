"""Fewer kernels per decode step on the GPU: a row program of the factored form (RMSNorm: a k-wise part times a row
scalar made of the row's sums) that only a matrix-vector group reads is that group's prologue (the group's kernel
computes the part where it loads the activations, the sums in the same loop, and scales each dot product by the
scalar; the norm's own kernel does not run), and the flash-decode kernel merges its key ranges itself (the last
range of a tile to finish, by a ticket it sets back to zero; no combine kernel). By default only groups of Q8_0
products stored split take their prologue (their kernel stages the row in shared memory, computing the norm once
per block); LUMINAL_CUDA_PROLOGUE=1: every group, in its dot loop; =0: none. Parity against torch on every
backend (reference, CPU, the NVRTC compile, the GPU), the group kernel's arithmetic run on the host (cuda_host.py),
and the kernels of a Llama decode layer counted (without a GPU from the printed module)."""
from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest
import torch

import cuda_host
import luminal as lm
import luminal.nn.functional as F
from helpers import expected_dp4a, needs_cuda, needs_nvrtc, random_quant_blocks, split_layout, tiny_llama_sessions
from luminal.quant import QuantizedWeight, dequantize

gpu = pytest.mark.skipif(needs_cuda() is not None, reason=str(needs_cuda()))


@pytest.fixture(autouse=True)
def _prologues(monkeypatch):
    """Prologues in the dot loop are off by default (LUMINAL_CUDA_PROLOGUE=1 turns them on): this module tests them."""
    monkeypatch.setenv("LUMINAL_CUDA_PROLOGUE", "1")

def _rms(x, w, eps):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)


def _scaled(x, g):
    """A factored row program written out (not Tensor.rms_norm): (x * g) * rsqrt(sum x^2 / K + 1)."""
    return (x * g) * ((x * x).sum(-1, keepdim=True) * (1.0 / x.shape[-1]) + 1.0).rsqrt()


@pytest.mark.parametrize("tokens,k", [(1, 64), (1, 136), (1, 203), (3, 64)])
def test_norm_is_the_prologue_of_the_products_reading_it(backend, tokens, k, rng):
    """RMSNorm before q/k (two products), before gate/up (an epilogue: silu(gate) * up) and before one product (the
    logits), and a factored program written out: each is its group's prologue. A norm that something else reads too
    keeps its own kernel, and so does LayerNorm (its output is a sum, not of the factored form). 136: whole 8-element
    loads but partial steps of the dot loop. An odd row length (unaligned rows: no matrix-vector kernel) and 3 rows
    run the steps one by one, norms included."""
    reason = backend.skip_reason()
    if reason:
        pytest.skip(f"backend {backend.name}: {reason}")
    names = {"q": 40, "k": 24, "g": 48, "u": 48, "l": 72, "z": 16, "a": 8, "b": 12, "c": 20}
    ws = {n: rng.data((r, k)).astype(np.float32) for n, r in names.items()}
    ns = {n: rng.data((k,)).astype(np.float32) for n in ("n1", "n2", "n3", "n4", "n5", "n6", "b6")}
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
    fa = (_scaled(x * 3, w["n5"]) @ w["a"].T).output()
    h6 = x.layer_norm(k, w["n6"], w["b6"])
    fb, fc = (h6 @ w["b"].T).output(), (h6 @ w["c"].T).output()
    comps = backend.compilers("float32")
    g.compile(lm.GenericCompiler(), *comps)
    for cc in comps:
        if isinstance(cc, lm.CudaCompiler):  # q/k, gate/up, logits and `a`, each with its norm; LayerNorm's b/c
            groups = cc.schedule.groups()
            assert sorted(len(ids) for _, ids in groups) == [2, 2, 2, 3, 4], groups
    g.execute()
    t = {n: torch.from_numpy(v).double() for n, v in {**ws, **ns}.items()}
    xt = torch.from_numpy(xv).double()
    r1, r2, r4 = _rms(xt, t["n1"], 1e-5), _rms(xt * 2, t["n2"], 1e-5), _rms(xt - 1, t["n4"], 1e-5)
    r6 = torch.nn.functional.layer_norm(xt, (k,), t["n6"], t["b6"])
    pg = r2 @ t["g"].T
    wants = [r1 @ t["q"].T, r1 @ t["k"].T, torch.nn.functional.silu(pg) * (r2 @ t["u"].T),
             _rms(xt + 0.5, t["n3"], 1e-5) @ t["l"].T, r4 @ t["z"].T, r4, _scaled(xt * 3, t["n5"]) @ t["a"].T,
             r6 @ t["b"].T, r6 @ t["c"].T]
    for o, want in zip((q, kk, m, logits, z, h4o, fa, fb, fc), wants):
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


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_norm_prologue_with_q8_members(cuda_backend, dtype, staged, rng, monkeypatch):
    """Q8_0 products (a warp per two rows, QRows) and a float one after an RMSNorm: one group with the norm as its
    prologue, the products scaled by the row's scalar. 192: six Q8_0 blocks (rows of whole 4-byte words, which QRows
    needs: with 96 the H100 ran the steps one by one), a partial step of the dot loop. Staged: the third product
    is Q8_0 too, and by default (LUMINAL_CUDA_PROLOGUE unset) the group's kernel computes the norm once per block
    as it stages the row in shared memory."""
    backend, k = cuda_backend, 192
    if staged:
        monkeypatch.delenv("LUMINAL_CUDA_PROLOGUE")
    reason = backend.skip_reason()
    if reason:
        pytest.skip(f"backend {backend.name}: {reason}")
    xv, nv = rng.data((1, k)).astype(np.float32), rng.data((k,)).astype(np.float32)
    g = lm.Graph()
    x, nw = g.tensor((1, k), name="x").set(xv), g.tensor((k,), name="n").set(nv)
    vals, outs, raws = {}, [], {}
    h = x.rms_norm(k, nw, 1e-5)
    for name, rows in (("q", 41), ("k", 7)) + ((("v", 13),) if staged else ()):
        raws[name], vals[name] = random_quant_blocks(rng.gen, "Q8_0", rows, k)
        raw = raws[name]
        outs.append((h @ dequantize(g, QuantizedWeight(raw, "Q8_0", (rows, k)), name=name).T).output())
    if not staged:
        vals["v"] = rng.data((12, k)).astype(np.float32)
        outs.append((h @ g.tensor((12, k), name="v").set(vals["v"]).T).output())
    comps = backend.compilers(dtype)
    g.compile(lm.GenericCompiler(), *comps)
    (cc,) = [c for c in comps if isinstance(c, lm.CudaCompiler)]
    assert sorted(len(ids) for _, ids in cc.schedule.groups()) == [4], cc.schedule.groups()
    ((fn, _),) = cc.schedule.groups()
    assert ("u8 xq_[" in dict(cc.schedule.kernel_texts)[fn]) == staged
    g.execute()
    r = _rms(torch.from_numpy(xv).double(), torch.from_numpy(nv).double(), 1e-5).numpy()
    for o, name in zip(outs, ("q", "k", "v")):
        v = vals[name].astype(np.float64)
        if name not in raws and dtype == "bfloat16":  # (a float weight is stored in the compute dtype)
            v = torch.from_numpy(vals[name]).bfloat16().double().numpy()
        want = r @ v.T
        if name in raws:  # (stored split: by __dp4a over the norm's part, x * n, quantised; then the row's scalar)
            assert any(g._g.node(i).name == name for i in cc.schedule.q8_split)
            if backend.name == "cuda":  # (x and n are read as float32 by the prologue alone)
                scale = 1 / np.sqrt(np.mean(xv.astype(np.float64) ** 2) + 1e-5)
                want = expected_dp4a(xv * nv, raws[name], k) * scale
        tol = 3e-2 if backend.name == "cuda-nvrtc" else 1e-4  # (the CPU kernels quantise decode activations)
        np.testing.assert_allclose(o.numpy(), want, rtol=0, atol=tol * np.abs(want).max(), err_msg=repr(rng))
    if backend.name == "cuda":
        assert g._runtime.rt.last_launches() == 1


def _decode_graph(n_layers, q8=False):
    """A tiny Llama's decode graph (token ids, per layer a KV cache of symbolic length) on the CUDA lowering; with
    `q8`, its projections and output head Q8_0 (graph inputs of GGUF blocks, dequantised), as a GGUF file loads."""
    from luminal.nn import Llama, LlamaConfig

    cfg = LlamaConfig(vocab_size=61, hidden=64, ffn=96, n_layers=n_layers, n_heads=4, n_kv_heads=2, head_dim=16)
    model = Llama(cfg)
    g = model.graph
    for name, p in list(model.named_parameters()) if q8 else []:
        if len(p.shape) == 2 and name != "model.embed_tokens.weight":
            t = g.tensor((p.shape[0], p.shape[1] // 32 * 34), lm.uint8, name=name)
            owner, attr = model._owner(name)
            setattr(owner, attr, g._wrap(g._g.dequant("Q8_0", t._edge(), list(p.shape))))
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


def test_q8_decode_layer_takes_its_norms_by_default(monkeypatch):
    """By default (LUMINAL_CUDA_PROLOGUE unset) a Llama layer of Q8_0 projections keeps the 8 sites above: its
    groups stage their activation row in shared memory (xq_), computing the norm there; the float layer's norms
    are kernels of their own (10 sites), as is the final norm before a float head."""
    monkeypatch.delenv("LUMINAL_CUDA_PROLOGUE")
    assert _launch_sites(_decode_graph(3, q8=True)) - _launch_sites(_decode_graph(2, q8=True)) == 8
    assert _launch_sites(_decode_graph(3)) - _launch_sites(_decode_graph(2)) == 10
    m = _decode_graph(1, q8=True)
    texts = dict(m.kernel_texts)
    staged = [ids for fn, ids in m.groups() if "u8 xq_[" in texts[fn]]
    assert len(staged) == 5, m.groups()  # (q/k/v, o, gate/up, down, and the head with the final norm)


@gpu
@pytest.mark.parametrize("graphs", ["1", "0"])
def test_llama_decode_launches_per_layer(graphs, rng, monkeypatch):
    """On the GPU, a decode step launches 6 kernels per layer (see above), and the logits match the CPU backend's
    at every step, with CUDA graphs on and off."""
    monkeypatch.setenv("LUMINAL_CUDA_GRAPHS", graphs)
    counts = {}
    for n_layers in (2, 3):
        sessions = tiny_llama_sessions(rng, ([lm.CPUCompiler()], [lm.CudaCompiler("float32")]), n_layers, capacity=4)
        ids = rng.integers(0, sessions[0].model.config.vocab_size, (12,))
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


# (what the group kernel needs beyond cuda_host's prelude)
_GROUP_HOST = cuda_host.MATVEC + r"""
inline float op_sqrt(float x) { return std::sqrt(x); }
"""


@pytest.mark.parametrize("members", ["mixed", "q8"])
@pytest.mark.parametrize("n,k", [(42, 160), (7, 1088)])
def test_prologue_group_kernel_on_the_host(n, k, members, rng, tmp_path):
    """The group kernel with an RMSNorm prologue run on the host (cuda_host.py), against float64 torch, on grids
    smaller than the work. Mixed: a Q8_0 member (two rows a warp) and a float one, the norm's part and sums computed
    in the dot loop (5 blocks: a partial step; 34: a whole step and a partial one), blocks of 64 threads. Q8: two
    Q8_0 members, the norm computed once per block as the row is staged in shared memory (its sums over the block's
    8 warps), 34 blocks with K split over 2 warps a row."""
    if needs_nvrtc() is not None or not cuda_host.compiler():
        pytest.skip("needs the CUDA code generation and a host C++ compiler")
    n2 = n + 1 if k // 32 % 2 == 0 else n + 2  # (the second member's row count: whole 4-byte words)
    raw, vals = random_quant_blocks(rng.gen, "Q8_0", n, k)
    raw2 = random_quant_blocks(rng.gen, "Q8_0", n2, k)[0] if members == "q8" else None
    wf = rng.data((n2, k)).astype(np.float32)
    x, nv = rng.data((1, k)).astype(np.float32), rng.data((k,)).astype(np.float32)
    cx = lm.Graph()
    xt, nt = cx.tensor(x.shape, name="x").set(x), cx.tensor(nv.shape, name="n").set(nv)
    h = xt.rms_norm(k, nt, 1e-5)
    wq = dequantize(cx, QuantizedWeight(raw, "Q8_0", (n, k)), name="w")
    w2 = (dequantize(cx, QuantizedWeight(raw2, "Q8_0", (n2, k)), name="wf") if members == "q8" else
          cx.tensor(wf.shape, name="wf").set(wf))
    outs = [(h @ wq.T).output(), (h @ w2.T).output()]
    comp = lm.CudaCompiler("float32", device=None)
    cx.compile(lm.GenericCompiler(), comp)
    g = cx._g
    texts = dict(comp.schedule.kernel_texts)
    ((group, ids),) = comp.schedule.groups()
    ids_out = [o._edge().node for o in outs]
    ms = [g.node(i).inputs[0].node if i not in ids else i for i in ids_out]  # (an Output aliasing its product)
    (pro,) = [i for i in ids if i not in ms]
    numel = lambda i: int(np.prod([int(d) for d in g.node(i).shape]))
    sizes = {"x": x.size, "n": nv.size, "w": raw.size, "wf": (raw2 if members == "q8" else wf).size}

    def slice_of(nid, items, k, extra, q8):
        p = [nid, items, k, extra]
        for e in g.node(nid).inputs:
            size = sizes.get(g.node(e.node).name, numel(e.node))
            p += cuda_host.view_slots(e.view.offset, size, e.view.shape, e.view.strides)
        return p + ([0, n] if q8 else [])

    q8 = members == "q8"
    slices = [slice_of(ms[0], n, k, n, True), slice_of(ms[1], n2, k, n2, q8), slice_of(pro, 1, k, 0, False)]
    kernel = texts[group]
    assert ("u8 xq_[" in kernel) == q8 and ("sl_ = w_ % 2" in kernel) == (q8 and k == 1088)
    args = re.search(r"void \w+\((.*?)\) \{", kernel).group(1)
    order = [int(m) for m in re.findall(r"const i64\* __restrict__ P(\d)", args)]  # (members in argument order)
    group_args = "".join(f", P[{j}].data(), out{j}.data(), {('w', 'wf')[j]}.data()" for j in order)
    main = f"""
int main() {{
  std::vector<std::vector<i64>> P = {{{", ".join("{" + ", ".join(map(str, s)) + "}" for s in slices)}}};
  std::vector<char> x = load("x.bin"), nv = load("n.bin"), w = load("w.bin"), wf = load("wf.bin");
  std::vector<float> out0({n}, 12345.0f), out1({n2}, 12345.0f);
  int err = 0;
  launch(3, 1, 1, {256 if q8 else 64}, [&] {{ {group}(P[{order[0]}].data(), &err, nullptr{group_args}, P[2].data(), x.data(), nv.data()); }});
  FILE* f = std::fopen("out.bin", "wb");
  for (auto* v : {{&out0, &out1}}) std::fwrite(v->data(), 4, v->size(), f);
  std::fclose(f);
}}
"""
    exe = cuda_host.build(_GROUP_HOST + kernel + main, tmp_path)
    # (the Q8_0 weight is stored split: its product by __dp4a over the norm's part, x * n, quantised in the loop,
    # then scaled by the row's scalar)
    assert sorted(g.node(i).name for i in comp.schedule.q8_split) == (["w", "wf"] if q8 else ["w"])
    for name, a in (("x", x), ("n", nv), ("w", split_layout(raw, k)), ("wf", split_layout(raw2, k) if q8 else wf)):
        (tmp_path / f"{name}.bin").write_bytes(np.ascontiguousarray(a).tobytes())
    subprocess.run([str(exe)], check=True, cwd=tmp_path)
    got = np.fromfile(tmp_path / "out.bin", np.float32)
    r = _rms(torch.from_numpy(x).double(), torch.from_numpy(nv).double(), 1e-5).numpy()
    scale = 1 / np.sqrt(np.mean(x.astype(np.float64) ** 2) + 1e-5)
    second = expected_dp4a(x * nv, raw2, k)[0] * scale if q8 else (r @ wf.T.astype(np.float64))[0]
    want = np.concatenate([expected_dp4a(x * nv, raw, k)[0] * scale, second])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=repr(rng))


@pytest.mark.parametrize("dtype,k,norm,split,pairs", [
    ("float32", 200, False, False, False), ("bfloat16", 200, False, False, False),
    ("float32", 1064, True, False, False), ("bfloat16", 1064, False, False, False),
    ("float32", 2120, False, True, False), ("bfloat16", 2120, False, True, False),
    ("float16", 1064, False, False, False),
    ("bfloat16", 1064, False, False, True), ("float32", 1064, True, False, True), ("float32", 2120, False, True, True)])
def test_float_group_kernel_on_the_host(dtype, k, norm, split, pairs, rng, tmp_path, monkeypatch):
    """A group of float members run on the host (cuda_host.py), against float64 torch: gate and up (37 rows, one
    unit of two members, silu(gate) * up) and o (24 rows, a residual add), every tensor float32 (two 16-byte loads
    a lane's 8 elements), bfloat16 or float16 (one). Each lane's loads of a step are raw words widened after them (ldr8),
    whole steps unchecked: 200 is one checked step only, 1064 whole steps and a checked one (float32: with an RMSNorm
    computed in the loop, the prologue), 2120 with K split over 4 warps a row (parts of whole steps, one of a checked
    step only, one empty). Three blocks of 4 warps for the work of more: the warps loop over rows. With
    LUMINAL_CUDA_FLOAT_PAIRS=1 (gate and up then 38 rows) a warp computes two rows of each member."""
    if needs_nvrtc() is not None or not cuda_host.compiler():
        pytest.skip("needs the CUDA code generation and a host C++ compiler")
    monkeypatch.setenv("LUMINAL_CUDA_SPLIT_WARPS", "1000000" if split else "0")
    monkeypatch.setenv("LUMINAL_CUDA_FLOAT_PAIRS", "1" if pairs else "0")
    t = getattr(torch, dtype)
    n = 38 if pairs else 37
    shapes = {"x": (1, k), "res": (1, 24), "nv": (k,), "o": (24, k), "g": (n, k), "u": (n, k)}
    # (the tensors as stored: bfloat16 ones rounded; the reference takes the rounded values)
    data = {n: torch.from_numpy(rng.data(s).astype(np.float32)).to(t) for n, s in shapes.items()}
    cx = lm.Graph()
    ts = {n: cx.tensor(tuple(v.shape), dtype, name=n).set(v.float().numpy()) for n, v in data.items()}
    h = ts["x"].rms_norm(k, ts["nv"], 1e-5) if norm else ts["x"]
    (ts["res"] + h @ ts["o"].T).output()
    ((h @ ts["g"].T).silu() * (h @ ts["u"].T)).output()
    comp = lm.CudaCompiler("float32", device=None)
    cx.compile(lm.GenericCompiler(), comp)
    g = cx._g
    ((group, ids),) = comp.schedule.groups()
    text = dict(comp.schedule.kernel_texts)[group]
    members = [i for i in ids if g.node(i).name.startswith("MatMul")]
    assert len(members) == 3 and f"ldsr8_{dtype}(W" in text and (f"ldr8_{dtype}(a_" in text) == (not norm)
    assert ("sl_ = w_ % 4" in text) == split and (text.count("i64 rq = ") == (6 if split else 4) * pairs)
    if pairs:  # (a mode only this test runs: the module compiles for the GPU too)
        assert lm.cuda.compile_source(comp.schedule.source, 90)[:4] == b"\x7fELF"
    name_of = {e.node: g.node(e.node).name for i in ids for e in g.node(i).inputs}
    numel = lambda i: int(np.prod([int(d) for d in g.node(i).shape]))
    pro = [i for i in ids if i == g.node(members[0]).inputs[0].node]  # (the norm the members read)
    epilogues = [i for i in ids if i not in members and i not in pro]
    assert len(pro) == int(norm) and len(epilogues) == 2

    def slice_of(nid, items, kk, extra):
        p = [nid, items, kk, extra]
        for e in g.node(nid).inputs:
            size = numel(e.node) if e.node in members + pro else data[name_of[e.node]].numel()
            p += cuda_host.view_slots(e.view.offset, size, e.view.shape, e.view.strides)
        return p

    slices = [slice_of(m, numel(m), k, numel(m)) for m in members] + [slice_of(e, numel(e), 0, 0) for e in epilogues]
    args = ["h0.data()" if norm else "x.data()"]
    args += [f"P[{j}].data(), o{m}.data(), {name_of[g.node(m).inputs[1].node]}.data()" for j, m in enumerate(members)]
    for j, e in enumerate(epilogues):
        ins = [f"o{ed.node}.data()" if ed.node in members else f"{name_of[ed.node]}.data()" for ed in g.node(e).inputs]
        args.append(", ".join([f"P[{len(members) + j}].data()", f"o{e}.data()"] + ins))
    if norm:
        slices.append(slice_of(pro[0], 1, k, 0))
        args.append(", ".join([f"P[{len(slices) - 1}].data()"] + [f"{name_of[e.node]}.data()"
                                                                   for e in g.node(pro[0]).inputs]))
    bufs = "".join(f"  std::vector<float> o{i}({numel(i)}, 12345.0f);\n" for i in members + epilogues)
    loads = "".join(f'  std::vector<char> {n} = load("{n}.bin");\n' for n in data)
    size = t.itemsize
    main = f"""
int main() {{
  std::vector<std::vector<i64>> P = {{{", ".join("{" + ", ".join(map(str, p)) + "}" for p in slices)}}};
{loads}{bufs}  std::vector<float> h0(1, 0.0f);  // (with a prologue the kernel reads the norm's inputs, not this)
  int err = 0;
  launch(3, 1, 1, 128, [&] {{ {group}(P[0].data(), &err, {", ".join(args)}); }});
  FILE* f = std::fopen("out.bin", "wb");
  std::fwrite(o{epilogues[0]}.data(), {size}, o{epilogues[0]}.size(), f);
  std::fwrite(o{epilogues[1]}.data(), {size}, o{epilogues[1]}.size(), f);
  std::fclose(f);
}}
"""
    exp2 = "inline float op_exp2(float x) { return std::exp2(x); }\n"  # (silu's)
    exe = cuda_host.build(_GROUP_HOST + exp2 + text + main, tmp_path)
    for n, v in data.items():
        (tmp_path / f"{n}.bin").write_bytes((v.view(torch.int16) if size == 2 else v).numpy().tobytes())
    subprocess.run([str(exe)], check=True, cwd=tmp_path)
    raw = np.fromfile(tmp_path / "out.bin", np.int16 if size == 2 else np.float32)
    got = torch.from_numpy(raw).view(t).double().numpy()
    d = {n: v.double() for n, v in data.items()}
    a = _rms(d["x"], d["nv"], 1e-5) if norm else d["x"]
    p = {n: (a @ d[n].T)[0].numpy() for n in ("o", "g", "u")}
    want = np.concatenate([d["res"][0].numpy() + p["o"], p["g"] / (1 + np.exp(-p["g"])) * p["u"]])
    tol = {"float32": 1e-5, "bfloat16": 8e-3, "float16": 2e-3}[dtype]  # (the outputs rounded to 24, 8, 11 bits)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max(), err_msg=repr(rng))
