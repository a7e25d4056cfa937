"""Compile-time benchmark: GenericCompiler on a Llama-style graph of >= 100,000 nodes.

Builds N stacked transformer blocks (RMSNorm, q/k/v/o projections as matmuls, rotary embeddings written in
primitive ops -- slices, cat, cos/sin tables from an iota over the symbolic sequence length "s" --, causal
attention with a softmax over "s", SwiGLU MLP) from luminal's high-level ops at a small hidden size (only the graph
size matters), then times `cx.compile(lm.GenericCompiler())` and each of its passes.

    PYTHONPATH=python python benchmarks/compile_time.py                # 32 blocks (more if under --min-nodes)
    PYTHONPATH=python python benchmarks/compile_time.py --no-check     # skip running a 2-block copy before/after
    PYTHONPATH=python python benchmarks/compile_time.py --profile      # also times one no-op sweep of each pass

Target: GenericCompiler in under 1 s on 100k nodes.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

import luminal as lm
from luminal.compiler import CSE, ArithmeticIdentities, ConstantFolding, DeadNodeRemoval


# ---- the model ------------------------------------------------------------------------------------------------------
def rotary(x, pos, inv_freq):
    """x: (heads, s, hd). Rotate-half RoPE with cos/sin tables built here from the positions (in primitive ops)."""
    hd = x.shape[-1]
    half = hd // 2
    freqs = pos.unsqueeze(1) * inv_freq.unsqueeze(0)                 # (s, hd/2)
    cos, sin = freqs.cos(), freqs.sin()
    cos = lm.cat([cos, cos], -1)                                      # (s, hd)
    sin = lm.cat([sin, sin], -1)
    # split, not x[..., :half]: a full slice of the symbolic dim would turn s into max(0, s) (a luminal bug)
    x1, x2 = x.split([half, hd - half], -1)
    rot = lm.cat([-x2, x1], -1)
    return x * cos + rot * sin


def attention_head(q, k, v, mask_add):
    """One head: q, k, v (s, hd); causal softmax over the symbolic s."""
    hd = q.shape[-1]
    scores = q.matmul(k.transpose(0, 1)) * (1.0 / math.sqrt(hd)) + mask_add   # (s, s)
    return scores.softmax(-1).matmul(v)                                         # (s, hd)


def block(cx, x, W, pos, inv_freq, n_heads, per_head):
    s = x.shape[0]
    d = x.shape[1]
    hd = d // n_heads
    h = x.rms_norm(weight=W["attn_norm"])
    q = h.matmul(W["wq"].T).reshape(s, n_heads, hd).transpose(0, 1)  # (heads, s, hd)
    k = h.matmul(W["wk"].T).reshape(s, n_heads, hd).transpose(0, 1)
    v = h.matmul(W["wv"].T).reshape(s, n_heads, hd).transpose(0, 1)
    q, k = rotary(q, pos, inv_freq), rotary(k, pos, inv_freq)
    # causal mask as an additive -inf above the diagonal, from iotas over s
    i = lm.arange(s, graph=cx).unsqueeze(1)
    j = lm.arange(s, graph=cx).unsqueeze(0)
    future = j.gt(i).float()                                           # (s, s)
    mask_add = lm.zeros((s, s), graph=cx).masked_fill(future, float("-inf"))
    if per_head:  # an unfused implementation: one attention per head, then cat
        qs, ks, vs = (t.split(1, 0) for t in (q, k, v))  # per-head (1, s, hd) pieces
        heads = [attention_head(a.squeeze(0), b.squeeze(0), c.squeeze(0), mask_add) for a, b, c in zip(qs, ks, vs)]
        o = lm.cat([hh.unsqueeze(0) for hh in heads], 0)               # (heads, s, hd)
    else:
        sc = q.matmul(k.transpose(1, 2)) * (1.0 / math.sqrt(hd)) + mask_add
        o = sc.softmax(-1).matmul(v)
    o = o.transpose(0, 1).reshape(s, d)
    x = x + o.matmul(W["wo"].T)
    h = x.rms_norm(weight=W["mlp_norm"])
    g = h.matmul(W["w1"].T).silu() * h.matmul(W["w3"].T)
    return x + g.matmul(W["w2"].T)


def build(n_blocks, hidden=64, n_heads=4, ffn=None, per_head=True, rng=None, min_nodes=0):
    """The graph, its output tensor and the number of blocks: at least `n_blocks`, more until the graph has
    `min_nodes` nodes. With `rng`, inputs get seeded data (to execute it)."""
    ffn = ffn or 2 * hidden
    cx = lm.Graph()
    hd = hidden // n_heads

    def weight(shape, name, scale, offset=0.0):
        t = cx.tensor(shape, name=name)
        if rng is not None:
            t.set((offset + rng.standard_normal(shape) * scale).astype(np.float32))
        return t

    x = cx.tensor(("s", hidden), name="x")
    inv = cx.tensor((hd // 2,), name="inv_freq")
    if rng is not None:
        inv.set((1.0 / 10000 ** (np.arange(0, hd, 2) / hd)).astype(np.float32))
    li = 0
    while li < n_blocks or len(cx) < min_nodes:
        W = {
            "attn_norm": weight((hidden,), f"l{li}.attn_norm", 0.1, 1.0),
            "wq": weight((hidden, hidden), f"l{li}.wq", hidden ** -0.5),
            "wk": weight((hidden, hidden), f"l{li}.wk", hidden ** -0.5),
            "wv": weight((hidden, hidden), f"l{li}.wv", hidden ** -0.5),
            "wo": weight((hidden, hidden), f"l{li}.wo", hidden ** -0.5),
            "mlp_norm": weight((hidden,), f"l{li}.mlp_norm", 0.1, 1.0),
            "w1": weight((ffn, hidden), f"l{li}.w1", hidden ** -0.5),
            "w3": weight((ffn, hidden), f"l{li}.w3", hidden ** -0.5),
            "w2": weight((hidden, ffn), f"l{li}.w2", ffn ** -0.5),
        }
        pos = lm.arange(x.shape[0], graph=cx).float()  # positions 0..s-1 from an iota over the symbolic s
        x = block(cx, x, W, pos, inv, n_heads, per_head)
        li += 1
    out = x.rms_norm().output()
    return cx, out, li


def bench(args):
    t0 = time.perf_counter()
    cx, out, n_blocks = build(args.layers, args.hidden, args.heads, per_head=not args.fused, min_nodes=args.min_nodes)
    build_s = time.perf_counter() - t0
    before = len(cx)
    stats_before = cx.stats()

    gc = lm.GenericCompiler()
    sweeps = []  # every run of every pass inside the fixed point: (pass, seconds, changes, live nodes after)

    class Timed:
        def __init__(self, p):
            self.p = p

        def compile(self, graph, remap):
            t = time.perf_counter()
            n = self.p.compile(graph, remap)
            sweeps.append((type(self.p).__name__, time.perf_counter() - t, n, len(graph)))
            return n

    core_passes = list(gc.passes)
    gc.passes = [Timed(p) for p in core_passes]  # GenericCompiler.compile runs whatever is in .passes
    t = time.perf_counter()
    cx.compile(gc)
    total = time.perf_counter() - t
    gc.passes = core_passes
    after = len(cx)

    rows = [("graph build (python)", f"{build_s:8.3f} s", "")]
    for p in gc.passes:
        rows.append((type(p).__name__, f"{p.seconds:8.3f} s", f"{p.changes:>9,d} changes"))
    overhead = total - sum(p.seconds for p in gc.passes)
    rows.append(("python / fixed-point overhead", f"{overhead:8.3f} s", ""))
    rows.append(("GenericCompiler total", f"{total:8.3f} s", "PASS (< 1 s)" if total < 1.0 else "SLOW (target < 1 s)"))
    print(f"Llama-style graph: {n_blocks} blocks, hidden {args.hidden}, {args.heads} heads "
          f"({'fused' if args.fused else 'per-head'} attention), symbolic sequence length 's'")
    print(f"nodes: {before:,} before -> {after:,} after GenericCompiler")
    print(f"  top ops before: {dict(list(stats_before.items())[:8])}")
    print(f"  top ops after:  {dict(list(cx.stats().items())[:8])}")
    w = max(len(r[0]) for r in rows)
    print(f"{'step':<{w}}  {'time':>10}  changes")
    print("-" * (w + 30))
    for r in rows:
        print(f"{r[0]:<{w}}  {r[1]:>10}  {r[2]}")
    print(f"\nfixed-point sweeps ({len(sweeps) // 4} iterations of the 4 passes):")
    for i, (name, sec, n, live) in enumerate(sweeps):
        print(f"  iter {i // 4 + 1}  {name:<22} {sec:8.3f} s  {n:>8,d} changes  {live:>9,d} nodes after"
              f"  ({1e6 * sec / max(live, 1):5.2f} us/node)")

    if args.profile:
        print("\none more sweep of each pass on the compiled graph (no changes left; the cost of a sweep):")
        for P in (ConstantFolding, ArithmeticIdentities, CSE, DeadNodeRemoval):
            p = P()
            p.compile(cx, None)
            print(f"  {P.__name__:<22} {p.seconds:8.3f} s  ({1e6 * p.seconds / len(cx):5.2f} us/node)")
        for name, fn in (("Graph.topo_order()", lambda: cx._g.topo_order()), ("len(graph)", lambda: len(cx))):
            t = time.perf_counter()
            fn()
            print(f"  {name:<22} {time.perf_counter() - t:8.3f} s")
    return total


def check(args):
    """Executes a 2-block graph with seeded weights, uncompiled and compiled: the results must agree."""
    res = []
    for compile_it in (False, True):
        cx, out, _ = build(2, 32, 4, rng=np.random.default_rng(0), per_head=not args.fused)
        x_in = [n for n in cx.nodes() if cx.node(n).op == "Input" and cx.node(n).name == "x"][0]
        cx._set_input(x_in, np.random.default_rng(1).standard_normal((7, 32)).astype(np.float32))
        n0 = len(cx)
        if compile_it:
            cx.compile(lm.GenericCompiler())
        cx.execute()
        res.append(out.numpy())
        print(f"check: {'compiled' if compile_it else 'uncompiled'} 2-block graph, {n0} -> {len(cx)} nodes")
    diff = float(np.max(np.abs(res[0] - res[1])))
    print(f"check: max |uncompiled - compiled| = {diff:g} ({'exact' if diff == 0 else 'DIFFERS'})")
    return diff


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--min-nodes", type=int, default=100_000)
    ap.add_argument("--fused", action="store_true", help="all heads in one batched attention (fewer nodes)")
    ap.add_argument("--profile", action="store_true", help="also time one no-op sweep of each pass, topo_order and len")
    ap.add_argument("--no-check", action="store_true", help="skip running a small copy before/after compiling")
    args = ap.parse_args(argv)
    if not args.no_check:
        check(args)
    bench(args)


if __name__ == "__main__":
    sys.exit(main())
