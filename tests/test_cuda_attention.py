"""The CUDA backend's attention kernels (src/cuda/codegen.cpp, attention_step): flash attention (query tiles against
key/value tiles in shared memory, softmax online), the decode kernel (up to 8 query rows per KV head: a block's
warps take turns over its key range, a lane per key), their split over key ranges (flash-decoding: partial rows
merged by a combine kernel), and the block-per-row kernel for any other row program or head size.

Parity with torch on every backend (the `backend` fixture: on a GPU the kernels run; in CI the cuda-nvrtc backend
compiles each of them for sm_80 and sm_90), at shapes that cross the kernels' tile edges (16 query rows, 32 keys,
128 head dims); and, without a GPU, which kernels the printer gives each attention, and the tensor-core kernels'
arithmetic run on the host (cuda_host.py), masked tiles skipped included."""
from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import luminal as lm
import luminal.nn.functional as F
import cuda_host
from helpers import FLOATS, TORCH, check, compare, needs_cuda, needs_nvrtc


def _sdpa(mask_kind=None, gqa=False):
    def lm_fn(*t):
        return F.scaled_dot_product_attention(*t[:3], attn_mask=t[3] if len(t) > 3 else None,
                                              is_causal=mask_kind == "causal", enable_gqa=gqa)

    def torch_fn(*t):
        return TF.scaled_dot_product_attention(*t[:3], attn_mask=t[3] if len(t) > 3 else None,
                                               is_causal=mask_kind == "causal", enable_gqa=gqa)
    return lm_fn, torch_fn


# (q shape, k shape, v shape, mask: None / "causal" / "float" / "bool", gqa). Odd lengths cross the tiles' edges.
CASES = {
    "causal-gqa": ((1, 4, 37, 64), (1, 2, 53, 64), (1, 2, 53, 64), "causal", True),
    "float-mask": ((2, 3, 19, 40), (2, 3, 70, 40), (2, 3, 70, 24), "float", False),
    "bool-mask": ((1, 2, 33, 128), (1, 2, 45, 128), (1, 2, 45, 128), "bool", False),
    "decode-split": ((1, 4, 1, 64), (1, 2, 1500, 64), (1, 2, 1500, 64), None, True),  # key ranges + combine
    # The decode kernel: 3 rows per KV head (a block's 4th row empty), an odd cache; 5 rows (two row blocks), head
    # sizes off the 16-byte paths (36: not 8 floats a step; 18: rows not 16-byte aligned); masks over the cache;
    # 8 rows (2 tokens x 4 heads).
    "decode-odd": ((1, 6, 1, 64), (1, 2, 301, 64), (1, 2, 301, 64), None, True),
    "decode-rows5": ((2, 10, 1, 36), (2, 2, 77, 36), (2, 2, 77, 18), None, True),
    "decode-float-mask": ((1, 4, 1, 128), (1, 4, 45, 128), (1, 4, 45, 128), "float", False),
    "decode-bool-mask": ((1, 8, 1, 32), (1, 2, 70, 32), (1, 2, 70, 48), "bool", True),
    "decode-2-tokens": ((1, 8, 2, 64), (1, 2, 130, 64), (1, 2, 130, 64), "causal", True),
    "wide-head": ((1, 2, 9, 160), (1, 2, 41, 160), (1, 2, 41, 136), "causal", False),  # block-per-row kernel
}


# Every compute dtype on one case (float32: the SIMT kernels; float16/bfloat16: the tensor-core one), float32 and
# bfloat16 on the others (each kernel is compiled with NVRTC in CI: keep the matrix small).
PAIRS = [(c, d) for c in ("causal-gqa", "decode-odd") for d in FLOATS] + \
    [(c, d) for c in CASES if c not in ("causal-gqa", "decode-odd") for d in ("float32", "bfloat16")]


@pytest.mark.parametrize("case,dtype", PAIRS)
def test_attention(backend, rng, dtype, case):
    qs, ks, vs, mask, gqa = CASES[case]
    arrays = [rng.data(qs), rng.data(ks), rng.data(vs)]
    if mask in ("float", "bool"):
        shape = (qs[-2], ks[-2])
        if mask == "bool":
            m = rng.bools(shape)
            m[:, 0] = True
        else:
            m = rng.data(shape).astype(np.float32)
            m[:, :5] = -np.inf  # masked keys, inside the first key tile
        arrays.append(m)
    lm_fn, torch_fn = _sdpa(mask, gqa)
    check(lm_fn, torch_fn, arrays=arrays, dtype=dtype, backend=backend, rng=rng, name=f"attention {case}",
          tol_scale=2)


def test_attention_symbolic(backend, rng):
    """One compiled graph, run at several lengths (the runtime plans each: tiles, key ranges)."""
    cx = lm.Graph()
    q = cx.tensor((2, 4, "s", 32))
    k = cx.tensor((2, 2, "t", 32))
    v = cx.tensor((2, 2, "t", 32))
    o = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).output()
    comps = backend.compilers("float32")
    cx.compile(lm.GenericCompiler(), *comps)
    for s, t in [(17, 40), (1, 700), (3, 33)]:
        arrs = [rng.data((2, 4, s, 32)).astype(np.float32), rng.data((2, 2, t, 32)).astype(np.float32),
                rng.data((2, 2, t, 32)).astype(np.float32)]
        for x, a in zip((q, k, v), arrs):
            x.set(a)
        cx.execute()
        want = TF.scaled_dot_product_attention(*map(torch.from_numpy, arrs), enable_gqa=True).numpy()
        compare(o.numpy(), want, "float32", f"symbolic attention s={s} t={t}", rng, tol_scale=2)


@pytest.mark.parametrize("chunk", ["32", "96", "100000"])
def test_decode_key_ranges(backend, rng, monkeypatch, chunk):
    """The decode kernel's key ranges forced (LUMINAL_CUDA_ATTENTION_CHUNK: keys per range): 32 (most of a block's
    warps without keys, 19 ranges), 96 (a range ending inside a tile), one range."""
    monkeypatch.setenv("LUMINAL_CUDA_ATTENTION_CHUNK", chunk)
    lm_fn, torch_fn = _sdpa(None, True)
    check(lm_fn, torch_fn, shapes=[(2, 4, 1, 64), (2, 2, 600, 64), (2, 2, 600, 64)], backend=backend, rng=rng,
          dtype="bfloat16", name=f"decode, ranges of {chunk} keys", tol_scale=2)


@pytest.mark.parametrize("dtype", FLOATS)
def test_decode_symbolic(backend, rng, dtype):
    """One compiled decode graph (a symbolic cache length) at several lengths: one range, several, a partial tile."""
    cx = lm.Graph()
    q = cx.tensor((1, 8, 1, 64), dtype=dtype)
    k = cx.tensor((1, 2, "t", 64), dtype=dtype)
    v = cx.tensor((1, 2, "t", 64), dtype=dtype)
    o = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).output()
    cx.compile(lm.GenericCompiler(), *backend.compilers(dtype))
    for t in (5, 130, 2100):
        arrs = [rng.data((1, 8, 1, 64)), rng.data((1, 2, t, 64)), rng.data((1, 2, t, 64))]
        arrs = [torch.from_numpy(a.astype(np.float32)).to(TORCH[dtype]) for a in arrs]
        for x, a in zip((q, k, v), arrs):
            x.set(a.float().numpy())
        cx.execute()
        want = TF.scaled_dot_product_attention(*[a.float() for a in arrs], enable_gqa=True).numpy()
        compare(o.numpy().astype(np.float32), want, dtype, f"symbolic decode t={t}", rng, tol_scale=2)


def _scaled_softmax(q, k, v):
    return ((q @ k.transpose(-1, -2)) * 0.25).softmax(-1) * 0.5 @ v


def test_attention_other_program(backend, rng):
    """A row program that is not softmax(x) (here scaled after the softmax) takes the block-per-row kernel."""
    check(_scaled_softmax, _scaled_softmax, shapes=[(3, 21, 16), (3, 45, 16), (3, 45, 8)], backend=backend, rng=rng,
          name="softmax * 0.5 attention")


@pytest.mark.parametrize("s", [1, 5])
def test_llama_attention_pattern(backend, rng, s):
    """Llama's grouped-query layout (python/luminal/nn/llama.py): query heads grouped per KV head along the rows,
    a token-major cache read through views, an additive causal mask over the cache and the new tokens (s = 1: a
    decode step, the decode kernel; 5: the SIMT flash kernel)."""
    hkv, rep, p, d = 2, 3, 40, 16
    t = p + s

    def fn(q, cache_k, cache_v, mask):
        keys, vals = cache_k.transpose(0, 1), cache_v.transpose(0, 1)  # (Hkv, t, d)
        qg = q.reshape(hkv, s * rep, d)
        scores = (qg @ keys.transpose(1, 2)) * (1.0 / d ** 0.5)
        scores = scores.reshape(hkv, rep, s, t) + mask
        return scores.softmax(-1).reshape(hkv, s * rep, t) @ vals

    mask = np.where(np.arange(t)[None, :] > p + np.arange(s)[:, None], -np.inf, 0.0).astype(np.float32)
    check(fn, fn, arrays=[rng.data((hkv * rep, s, d)), rng.data((t, hkv, d)), rng.data((t, hkv, d)), mask],
          backend=backend, rng=rng, name="llama attention")


# ---- which kernels the printer gives (no GPU needed) ----------------------------------------------------------------
def _variants(fn, shapes):
    cx = lm.Graph()
    ins = [cx.tensor(s) for s in shapes]
    fn(*ins).output()
    comp = lm.CudaCompiler("bfloat16", device=None)
    cx.compile(lm.GenericCompiler(), comp)
    return [[kind for kind, _ in vs] for _, vs, _ in comp.schedule.kernels()]


def test_printed_kernels():
    lm_fn, _ = _sdpa("causal", True)
    kinds = _variants(lm_fn, [(1, 4, "s", 64), (1, 2, "t", 64), (1, 2, "t", 64)])
    # One attention step: flash on tensor cores first, then the SIMT flash kernel, the block-per-row fallback last.
    att = [k for k in kinds if "attention" in k]
    assert len(att) == 1 and att[0] == ["flash-mma-skip", "flash-mma", "flash-decode", "flash", "attention"], kinds
    assert not any("mma" in k or "tiled" in k for k in kinds), kinds  # no separate score / value products
    kinds = _variants(_scaled_softmax, [(3, 21, 16), (3, 45, 16), (3, 45, 8)])
    assert ["attention"] in kinds and not any("flash" in k for k in kinds), kinds


@pytest.mark.skipif(needs_cuda() is not None, reason=f"{needs_cuda()}")
def test_long_cache_decode(rng):
    """Decode against an 8k cache (key ranges merged by the combine kernel) against torch."""
    cx = lm.Graph()
    q = cx.tensor((8, 4, 1, 128))
    k = cx.tensor((8, 1, "t", 128))
    v = cx.tensor((8, 1, "t", 128))
    o = F.scaled_dot_product_attention(q, k, v).output()
    cx.compile(lm.GenericCompiler(), lm.CudaCompiler("float32"))
    arrs = [rng.data((8, 4, 1, 128)).astype(np.float32), rng.data((8, 1, 8192, 128)).astype(np.float32),
            rng.data((8, 1, 8192, 128)).astype(np.float32)]
    for x, a in zip((q, k, v), arrs):
        x.set(a)
    cx.execute()
    want = TF.scaled_dot_product_attention(*map(torch.from_numpy, arrs)).numpy()
    compare(o.numpy(), want, "float32", "8k-cache decode", rng, tol_scale=4)


def test_llama_attention_is_one_kernel(rng):
    """Every layer of a Llama step graph (prefill and decode share it) runs attention as one step whose first
    variant is the tensor-core flash kernel."""
    from luminal.nn import Llama, LlamaConfig, Session

    cfg = LlamaConfig(vocab_size=61, hidden=64, ffn=96, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16)
    model = Llama(cfg)
    for name, p in model.named_parameters():
        p.set(rng.data(tuple(int(d) for d in p.shape)).astype(np.float32) * 0.3)
    comp = lm.CudaCompiler("bfloat16", device=None)
    s = Session(model, [lm.GenericCompiler(), comp], capacity=4)
    s.reset()
    s.step(rng.integers(0, cfg.vocab_size, (3,)))  # (compiles; runs the CUDA lowering on the CPU kernels)
    kinds = [[k for k, _ in vs] for _, vs, _ in comp.schedule.kernels()]
    want = [["flash-mma-skip", "flash-mma", "flash-decode", "flash", "attention"]] * cfg.n_layers
    assert [k for k in kinds if "attention" in k] == want, kinds


def test_flash_attention_flag():
    """Fused by default; flash_attention=False keeps the scores, softmax and weighted values as separate kernels."""
    lm_fn, _ = _sdpa(None, True)
    for flag, fused in ((None, True), (False, False)):
        cx = lm.Graph()
        ins = [cx.tensor(s) for s in [(1, 4, 1, 64), (1, 2, "t", 64), (1, 2, "t", 64)]]
        lm_fn(*ins).output()
        comp = lm.CudaCompiler("bfloat16", device=None, flash_attention=flag)
        cx.compile(lm.GenericCompiler(), comp)
        kinds = [k for _, vs, _ in comp.schedule.kernels() for k, _ in vs]
        assert ("flash-decode" in kinds) == fused and ("attention" in kinds) == fused, kinds


# ---- the tensor-core kernels run on the host (no GPU needed) --------------------------------------------------------
# The printed flash-mma kernels compiled as C++ (cuda_host.py: a thread per CUDA thread, mma.sync through shared
# fragments), with ldmatrix and the warp votes emulated through shared arrays between barriers (the kernels call them
# in uniform control flow). What CI can check of their indexing, the skipped tiles and the 16-byte staging beyond
# NVRTC's compile.
_HOST_ATTN = r"""
struct float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float op_exp2(float x) { return std::exp2(x); }
template <class T> inline T op_max(T acc, T x) { return (std::isnan(x) || x > acc) ? x : acc; }
template <class T> inline T rd_float32(T v) { return (T)(float)v; }
static int MMAS;  // (thread 0's tensor-core products: a fixed number per tile computed)
inline float __shfl_xor_sync(unsigned, float v, int m) { return shfl_xor(v, m); }
inline bool __any_sync(unsigned, bool v) {  // (through the warp's shuffle buffer: any lane's value)
  int t = threadIdx.x;
  xbuf[t] = v;
  wbar[t / 32].wait();
  bool r = false;
  for (int l = 0; l < 32; ++l) r = r || xbuf[(t & ~31) + l] != 0;
  wbar[t / 32].wait();
  return r;
}
inline unsigned atomicOr(unsigned* p, unsigned v) { std::lock_guard<std::mutex> l(atomics); unsigned o = *p; *p |= v; return o; }
inline int __ffs(unsigned x) { for (int i = 0; i < 32; ++i) if (x >> i & 1) return i + 1; return 0; }
inline float fast_exp2(float x) { return std::exp2(x); }
inline const u16* smem_u32(const u16* p) { return p; }
// cp.async as a plain copy (zeros where the copy is off), its groups complete at once.
inline void cp_async_host(void* d, const void* s, bool ok) {
  aligned16(d);
  if (ok) { aligned16(s); std::memcpy(d, s, 16); } else std::memset(d, 0, 16);
}
inline void cp_commit() {}
template <int N> void cp_wait() {}
static const u16* LP[1024];
// ldmatrix.m8n8.x4.trans: lane l gives row l & 7 of matrix l >> 3; lane l receives, of each matrix transposed, row
// l >> 2, columns (l & 3) * 2, + 1.
inline void ldsm_x4_t(unsigned* d, const u16* row) {
  int t = threadIdx.x, w = t & ~31, l = t & 31;
  LP[t] = row;
  __syncthreads();
  for (int m = 0; m < 4; ++m) {
    const u16 *r0 = LP[w + m * 8 + (l & 3) * 2], *r1 = LP[w + m * 8 + (l & 3) * 2 + 1];
    d[m] = unsigned(r0[l >> 2]) | (unsigned(r1[l >> 2]) << 16);
  }
  __syncthreads();
}
// ldmatrix.m8n8.x4: lane l gives row l & 7 of matrix l >> 3; lane l receives, of each matrix, row l >> 2, columns
// (l & 3) * 2, + 1.
inline void ldsm_x4(unsigned* d, const u16* row) {
  int t = threadIdx.x, w = t & ~31, l = t & 31;
  LP[t] = row;
  __syncthreads();
  for (int m = 0; m < 4; ++m) {
    const u16* r = LP[w + m * 8 + (l >> 2)];
    d[m] = unsigned(r[(l & 3) * 2]) | (unsigned(r[(l & 3) * 2 + 1]) << 16);
  }
  __syncthreads();
}
"""

# What the decode kernel uses beyond these: warp barriers, the tickets' atomic counter (blocks run one after another
# here, so the fences have nothing to order), L2 loads as plain ones.
_HOST_DECODE = r"""
inline void __syncwarp() { wbar[threadIdx.x / 32].wait(); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { std::lock_guard<std::mutex> l(atomics); unsigned o = *p; *p += v; return o; }
inline void __threadfence() {}
template <class T> T __ldcg(const T* p) { return *p; }
inline float bf16_f32(u16 h) { return bits_f32(unsigned(h) << 16); }
struct float2 { float x, y; };
"""

_HOST_ATTN_MAIN = r"""
int main(int argc, char** argv) {
  i64 np, nin, nout, G[3];
  FILE* f = std::fopen(argv[1], "rb");
  std::fread(&np, 8, 1, f); std::fread(&nin, 8, 1, f); std::fread(&nout, 8, 1, f); std::fread(G, 8, 3, f);
  std::vector<i64> p(np), sizes(nin);
  std::fread(p.data(), 8, np, f); std::fread(sizes.data(), 8, nin, f);
  std::vector<std::vector<char>> in(4);
  for (i64 k = 0; k < nin; ++k) { in[k].resize(sizes[k]); std::fread(in[k].data(), 1, sizes[k], f); }
  std::fclose(f);
  std::vector<float> out(nout, 12345.0f);
  std::vector<float> ws(WSFLOATS, 12345.0f);  // (the key ranges' partials)
  std::vector<unsigned char> sm(SMBYTES, 77);  // (a mask summary)
  int err = 0;
  PREP
  launch(G[0], G[1], G[2], THREADS, [&] { MAIN(p.data(), &err, out.data(), in[0].data(), in[1].data(), in[2].data(), in[3].data(), ws.data()SMARG); });
  POST
  f = std::fopen(argv[2], "wb"); std::fwrite(out.data(), 4, nout, f); std::fclose(f);
  std::printf("%d\n", MMAS);
}
"""


def _attention_on_host(fn, arrays, kind, vecs, tmp_path, kv_dtype="float32", window=None, chunk=None):
    """Runs the Attention step of fn(*inputs) (q, k, v, mask: graph inputs) through its printed `kind` kernel on the
    host, with the runtime's parameters (Runtime::applies: rows sharing k and v, one key range), once per value of
    the 16-byte staging flag in `vecs`; the outputs, flat, and the tiles skipped in each run. `kv_dtype`: k's and
    v's inputs in that dtype (a 16-bit KV cache: fn reads them through a float32 cast, which the kernel reads
    through). `window`: flash_tiles' window of key tiles classified at once, in keys (its 65536 shrunk to reach
    several windows at a small size). `chunk`: flash-decode's keys per range (ranges merged by the last of a
    tile's blocks, through its ticket, which must be back at 0 after the run)."""
    cx = lm.Graph()
    ins = [cx.tensor(a.shape, kv_dtype if i in (1, 2) else "float32").set(a) for i, a in enumerate(arrays)]
    fn(*ins).output()
    comp = lm.CudaCompiler("bfloat16", device=None)
    cx.compile(lm.GenericCompiler(), comp)
    g = cx._g
    array_of = {t.id: a for t, a in zip(ins, arrays)}
    (aid,) = [i for i in g.topo_order() if g.node(i).name == "Attention"]
    (variants,) = [vs for nid, vs, _ in comp.schedule.kernels() if nid == aid]
    name = dict(variants)[kind]
    texts = dict(comp.schedule.kernel_texts)
    text = texts[name]
    # flash-mma-skip with a loaded mask launches its summary kernel first (a block per distinct mask row)
    prep = comp.schedule.prep_kernels().get(aid) if kind == "flash-mma-skip" else None
    assert (prep is not None) == (kind == "flash-mma-skip"), (kind, prep)  # (every case's mask is loaded)
    if window:
        assert text.count("65536") == 2, text
        text = text.replace("65536", str(window))
    text = re.sub(r'asm volatile\("mma\.sync.*?\);', "{ unsigned Bq_[2] = {B0, B1}; mma_host(C, A, Bq_); "
                  "if (threadIdx.x == 0) ++MMAS; }", text, flags=re.S)
    stage = re.search(r"smem_ \+ st \* (\d+)", text)  # (a 16-bit cache: two stages in dynamic shared memory)
    if stage:
        text = text.replace("extern __shared__ __align__(16) u16 smem_[];",
                            "alignas(16) static u16 smem_[%d];" % (2 * int(stage[1])))
    text = re.sub(r"cp_async16\(smem_u32\((.*?)\), ", r"cp_async_host(\1, ", text)
    assert "asm" not in text, text
    node = g.node(aid)
    assert len(node.inputs) == len(arrays) == 4
    params, data, views = [aid, 0, 0, 0], [], []
    for e in node.inputs:  # (the arrays in the graph's input order: the attention's edges name the same nodes)
        src = g.node(e.node)
        stored = comp.schedule.storage_dtype(e.node)
        assert src.op == "Input" and stored == src.dtype, (src.op, src.name, stored)
        a = array_of[e.node]
        shape, strides = [int(s) for s in e.view.shape], [int(s) for s in e.view.strides]
        views.append((shape, strides))
        params += cuda_host.view_slots(e.view.offset, a.size, shape, strides)
        a = np.ascontiguousarray(a, np.float32)
        a = lm.dtypes.bf16_bits(a) if stored == "bfloat16" else a.astype(lm.dtypes.dtype(stored).np)
        data.append(a.tobytes())
    (qs, qst), (ks, kst), (vs, vst) = views[:3]
    rq, rv = len(qs), len(vs)
    params[2] = T = qs[rq - 2]
    D, N = qs[rq - 1], vs[rv - 2]

    def shared_rows(shape, strides, nrow):
        c = 1
        for d in reversed(range(nrow)):
            if strides[d] != 0 and shape[d] != 1:
                break
            c *= shape[d]
        return c
    rows = int(np.prod(qs[:rq - 2]))
    Tq = int(np.gcd(shared_rows(ks, kst, rq - 2), shared_rows(vs, vst, rv - 2)))
    B = rows // Tq
    decode = kind.startswith("flash-decode")
    chunk = chunk or T
    splits = -(-T // chunk)
    params += [D, N, Tq, B, splits, chunk, 0]
    threads = int(re.search(r"__launch_bounds__\((\d+)", text)[1])
    R = 4 if decode else threads // 2  # (query rows per block: 16 per warp in the tensor-core kernels)
    grid = [(Tq + R - 1) // R, B, splits]
    main = _HOST_ATTN_MAIN.replace("MAIN", name).replace("THREADS", str(threads))
    main = main.replace("WSFLOATS", str(rows * splits * (N + 2))).replace("SMBYTES", str(rows * -(-T // 64)))
    main = main.replace("SMARG", ", sm.data()" if prep else ", tk.data()" if decode else "")
    main = main.replace("PREP", "launch(2, 1, 1, 256, [&] { %s(p.data(), &err, out.data(), in[0].data(), "
                        "in[1].data(), in[2].data(), in[3].data(), ws.data(), sm.data()); });" % prep if prep else
                        "std::vector<unsigned> tk(%d, 0u);" % (grid[0] * B) if decode else "")
    main = main.replace("POST", "for (unsigned t : tk) if (t) return 3;  // (every ticket set back to 0)"
                        if decode else "")
    exe = cuda_host.build(_HOST_ATTN + (_HOST_DECODE if decode else "") + (texts[prep] if prep else "") + text + main,
                          tmp_path)
    outs, skips = [], []
    for vec in vecs:
        params[-1] = int(vec)
        head = [len(params), len(data), rows * N, *grid]
        (tmp_path / "in.bin").write_bytes(np.array(head + params + [len(d) for d in data], np.int64).tobytes() +
                                          b"".join(data))
        r = subprocess.run([str(exe), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True,
                           capture_output=True, text=True)
        outs.append(np.fromfile(tmp_path / "out.bin", np.float32))
        if decode:
            continue
        # thread 0 computes DH products per tile (8 D/16 for the scores, 4 D/8 for the values): the tiles skipped
        dh = int(re.search(r"Ks\)?\[(?:64\]\[)?(\d+)\]", text)[1]) - 8
        skips.append(grid[0] * grid[1] * -(-T // 64) - int(r.stdout) // dh)
    return outs, skips


def _llama_fn(hkv, rep, s, t, d):
    def fn(q, cache_k, cache_v, mask):
        keys, vals = cache_k.transpose(0, 1), cache_v.transpose(0, 1)
        scores = (q.reshape(hkv, s * rep, d) @ keys.transpose(1, 2)) * (1.0 / d ** 0.5)
        return (scores.reshape(hkv, rep, s, t) + mask).softmax(-1).reshape(hkv, s * rep, t) @ vals
    return fn


# (KV heads, query heads per KV head, new tokens s, cached tokens p, head size, mask). Causal masks with an offset
# (p > 0); "causal" with 1 query head per KV head and p = 0 leaves the first row block's last tiles masked whole (the
# skip); "middle" hides keys 64-127 (the second tile) from every row and keys 0-63 from some; row counts not a
# multiple of 128 and key counts not a multiple of 64 throughout.
HOST_CASES = {
    "causal": (1, 1, 160, 0, 64, "causal"),
    "causal-gqa-offset": (2, 3, 50, 37, 32, "causal"),
    "middle": (1, 2, 70, 100, 64, "middle"),
    "head-36": (1, 4, 35, 30, 36, "causal"),  # (a head size off the tiles' 16s, 8s: padded to 48)
}


def _host_case(case, gen_data):
    """q, k, v and the additive mask of HOST_CASES[case] (or KV16_CASES, WGMMA_CASES), and the function."""
    hkv, rep, s, p, d, mk = {**HOST_CASES, **KV16_CASES, **WGMMA_CASES}[case]
    t = p + s
    q, k, v = (gen_data(sh) for sh in ((hkv * rep, s, d), (t, hkv, d), (t, hkv, d)))
    i, j = np.arange(s)[:, None], np.arange(t)[None, :]
    hide = j > p + i
    if mk == "middle":
        hide = hide | ((j >= 64) & (j < 128)) | ((j < 64) & (i % 3 == 0) & (i >= 28))
    return _llama_fn(hkv, rep, s, t, d), [q, k, v, np.where(hide, -np.inf, 0.0).astype(np.float32)]


@pytest.mark.parametrize("case,dtype,fallback", [(c, "bfloat16", False) for c in HOST_CASES] +
                         [("causal-gqa-offset", "float16", False), ("middle", "bfloat16", True)])
def test_flash_mma_masks(backend, rng, monkeypatch, case, dtype, fallback):
    """The tensor-core kernels (on a GPU: flash-mma-skip, or with LUMINAL_CUDA_FLASH_MMA_SKIP=0 the flash-mma kernel)
    against torch: causal masks with offsets, tiles masked whole for some row blocks or in the middle, GQA."""
    if fallback:
        monkeypatch.setenv("LUMINAL_CUDA_FLASH_MMA_SKIP", "0")
    fn, arrays = _host_case(case, rng.data)
    check(fn, fn, arrays=arrays, dtype=dtype, backend=backend, rng=rng, name=f"flash-mma {case}", tol_scale=2)


def test_cuda_mask_summary_shared_by_attentions(rng, monkeypatch):
    """flash-mma-skip over a loaded mask (on a GPU): attentions reading one mask node through one view share its
    summary, computed once (every layer of a model reads one causal mask); a second mask node gets its own summary
    kernel. Both match torch."""
    if needs_cuda() is not None:
        pytest.skip(needs_cuda())
    monkeypatch.setenv("LUMINAL_CUDA_GRAPHS", "0")
    fn, (q, k, v, m) = _host_case("middle", rng.data)
    q2 = rng.data(q.shape)
    want = (fn(*map(torch.from_numpy, (q, k, v, m))) + fn(*map(torch.from_numpy, (q2, k, v, m)))).numpy()
    launches = []
    for shared in (True, False):
        cx = lm.Graph()
        tq, tq2, tk, tv, tm = (cx.tensor(a.shape).set(a) for a in (q, q2, k, v, m))
        tm2 = tm if shared else cx.tensor(m.shape).set(m)
        out = (fn(tq, tk, tv, tm) + fn(tq2, tk, tv, tm2)).output()
        comp = lm.CudaCompiler("bfloat16")
        cx.compile(lm.GenericCompiler(), comp)
        kinds = [[kind for kind, _ in vs][0] for _, vs, _ in comp.schedule.kernels()]
        assert kinds.count("flash-mma-skip") == 2 and len(comp.schedule.prep_kernels()) == 2, kinds
        cx.execute()
        np.testing.assert_allclose(out.numpy(), want, rtol=2e-2, atol=2e-2, err_msg=f"shared={shared}")
        launches.append(cx._runtime.rt.last_launches())
    assert launches[1] == launches[0] + 1, launches  # (the second mask's summary)


@pytest.mark.parametrize("case,kind,window", [(c, "flash-mma-skip", None) for c in HOST_CASES] +
                         [("middle", "flash-mma", None), ("causal", "flash-mma-skip", 128)])
def test_flash_mma_on_the_host(case, kind, window, tmp_path):
    if needs_nvrtc() is not None or not cuda_host.compiler():
        pytest.skip("needs the CUDA code generation and a host C++ compiler")
    gen = np.random.default_rng(1)
    # (operands exactly representable in bfloat16: only P's rounding and the sums' order differ from torch)
    fn, arrays = _host_case(case, lambda sh: torch.from_numpy(gen.standard_normal(sh).astype(np.float32))
                            .to(torch.bfloat16).float().numpy())
    want = fn(*map(torch.from_numpy, arrays)).numpy()
    vecs = (0, 1) if HOST_CASES[case][4] % 8 == 0 else (0,)  # (the 16-byte staging, where the runtime takes it)
    outs, skips = _attention_on_host(fn, arrays, kind, vecs, tmp_path, window=window)  # (128: 2 tiles a window)
    for vec, got in zip(vecs, outs):
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=2e-2, atol=2e-2, err_msg=f"vec={vec}")
    # Tiles masked for all of a block's 64 rows: causal, the first row block's last two tiles and the second's last;
    # middle, the second tile of all three row blocks.
    assert skips == [{"causal": 3, "middle": 3}.get(case, 0) if kind == "flash-mma-skip" else 0] * len(vecs), skips


# ---- a 16-bit KV cache (Session(cache_dtype=...)): k and v read through a float32 cast ------------------------------
def _llama_fn16(hkv, rep, s, t, d):
    """_llama_fn over a 16-bit cache read back as float32 (llama.py's _cache_rows): fuse_attention reads through the
    cast, so the kernels load the 16-bit rows as stored."""
    def fn(q, cache_k, cache_v, mask):
        keys, vals = cache_k.transpose(0, 1).float(), cache_v.transpose(0, 1).float()
        scores = (q.reshape(hkv, s * rep, d) @ keys.transpose(1, 2)) * (1.0 / d ** 0.5)
        return (scores.reshape(hkv, rep, s, t) + mask).softmax(-1).reshape(hkv, s * rep, t) @ vals
    return fn


# Decode over a 16-bit cache (FlashDecode's 16-bit vector loads: v's columns 4, 2 and 1 per lane), as HOST_CASES.
# (Head sizes and dtypes shared with a HOST_CASES case where they can be: the cuda-nvrtc check compiles each
# distinct kernel once, and kernels differ by head size and dtypes, not by lengths.)
KV16_CASES = {"decode-128": (2, 4, 1, 301, 128, "causal"), "decode-2-tokens": (2, 2, 2, 77, 64, "causal"),
              "decode-64": (1, 3, 1, 130, 64, "causal"), "decode-32": (1, 3, 1, 45, 32, "causal")}


def _cache16(kv_dtype, rng, case):
    """HOST_CASES[case] (or KV16_CASES, WGMMA_CASES) with k and v 16-bit graph inputs (their values rounded to
    kv_dtype, as a cache stores them): the function, the arrays, and the arrays torch reads."""
    hkv, rep, s, p, d, _ = {**HOST_CASES, **KV16_CASES, **WGMMA_CASES}[case]
    _, arrays = _host_case(case, lambda sh: np.asarray(rng(sh), np.float32))
    tdt = torch.bfloat16 if kv_dtype == "bfloat16" else torch.float16
    ref = [a if i in (0, 3) else torch.from_numpy(a).to(tdt).float().numpy() for i, a in enumerate(arrays)]
    return _llama_fn16(hkv, rep, s, p + s, d), arrays, ref


def _kv16_graph(fn, arrays, kv_dtype, compiler):
    cx = lm.Graph()
    ins = [cx.tensor(a.shape, kv_dtype if i in (1, 2) else "float32").set(a) for i, a in enumerate(arrays)]
    out = fn(*ins).output()
    cx.compile(lm.GenericCompiler(), *compiler)
    return cx, out


@pytest.mark.parametrize("case,kv_dtype,dtype", [("causal-gqa-offset", "bfloat16", "bfloat16"),
                                                 ("middle", "float16", "float16"), ("head-36", "bfloat16", "bfloat16"),
                                                 ("causal", "bfloat16", "float32"), ("middle", "float16", "bfloat16"),
                                                 ("decode-128", "bfloat16", "bfloat16"),
                                                 ("decode-2-tokens", "float16", "float16"),
                                                 ("decode-64", "bfloat16", "float32"),
                                                 ("decode-32", "bfloat16", "bfloat16")])
def test_attention_16bit_cache(backend, rng, case, kv_dtype, dtype):
    """Attention over 16-bit k and v read through a float32 cast against torch on the rounded values: one Attention
    node that reads the 16-bit inputs (no float32 copy), on every backend (on a GPU: flash-mma-skip's cp.async
    stages where the cache is in the compute dtype, loads rounded to it otherwise, the float32 Flash kernel, and
    the decode kernel's 16-bit vector loads for few rows per KV head)."""
    fn, arrays, ref = _cache16(kv_dtype, rng.data, case)
    want = fn(*map(torch.from_numpy, ref)).numpy()
    compilers = backend.compilers(dtype)
    cx, out = _kv16_graph(fn, arrays, kv_dtype, compilers)
    cx.execute()
    if compilers:  # (the reference executor runs the primops: no Attention node)
        g = cx._g
        (att,) = [i for i in g.topo_order() if g.node(i).name == "Attention"]
        assert [g.node(e.node).dtype for e in g.node(att).inputs[1:3]] == [kv_dtype] * 2
    tol = 2e-2 if dtype != "float32" else 1e-4
    np.testing.assert_allclose(out.numpy(), want, rtol=tol, atol=tol, err_msg=f"{case} {rng}")


@pytest.mark.parametrize("case,kv_dtype", [("causal", "bfloat16"), ("middle", "float16")])
def test_flash_mma_16bit_cache_on_the_host(case, kv_dtype, tmp_path):
    """flash-mma-skip over a 16-bit cache on the host: the two-stage pipeline (the next live tile's cp.async copies
    issued before this tile's products; here plain copies), the zero-filled rows past the keys, the skipped tiles,
    and the path that loads and rounds (a float16 cache under a bfloat16 compute dtype, or rows the runtime's flag
    says are not 16-byte aligned)."""
    if needs_nvrtc() is not None or not cuda_host.compiler():
        pytest.skip("needs the CUDA code generation and a host C++ compiler")
    gen = np.random.default_rng(2)
    fn, arrays, ref = _cache16(kv_dtype, lambda sh: torch.from_numpy(gen.standard_normal(sh).astype(np.float32))
                               .to(torch.bfloat16).float().numpy(), case)
    want = fn(*map(torch.from_numpy, ref)).numpy()
    vecs = (0, 1) if HOST_CASES[case][4] % 8 == 0 else (0,)  # (cp.async where the runtime takes it)
    outs, skips = _attention_on_host(fn, arrays, "flash-mma-skip", vecs, tmp_path, kv_dtype)
    for vec, got in zip(vecs, outs):
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=2e-2, atol=2e-2, err_msg=f"vec={vec}")
    assert skips == [{"causal": 3, "middle": 3}.get(case, 0)] * len(vecs), skips


@pytest.mark.parametrize("case,kv_dtype,chunk,kind", [
    ("decode-128", "bfloat16", None, "flash-decode"), ("decode-128", "bfloat16", 64, "flash-decode"),
    ("decode-64", "float16", 96, "flash-decode"), ("decode-2-tokens", "bfloat16", 32, "flash-decode"),
    ("decode-64", "float32", 64, "flash-decode"), ("decode-128", "bfloat16", None, "flash-decode-mma"),
    ("decode-128", "bfloat16", 64, "flash-decode-mma"), ("decode-64", "bfloat16", 96, "flash-decode-mma"),
    ("decode-2-tokens", "bfloat16", 32, "flash-decode-mma")])
def test_flash_decode_on_the_host(case, kv_dtype, chunk, kind, tmp_path):
    """flash-decode on the host, its vector loads and its element loops: one key range, or ranges merged by the
    tile's last block through its ticket (5 ranges, the last ending inside a tile: keys past it read the range's
    last key, weighted 0; 32 keys a range: three of a block's four warps without keys), 3 query rows per KV head
    (a row of the block's 4 computed and never stored), a float32 cache; flash-decode-mma (tensor cores, q and P
    rounded to bfloat16) the same where it is printed (a bfloat16 cache)."""
    if needs_nvrtc() is not None or not cuda_host.compiler():
        pytest.skip("needs the CUDA code generation and a host C++ compiler")
    gen = np.random.default_rng(3)
    data = lambda sh: gen.standard_normal(sh).astype(np.float32)
    if kv_dtype == "float32":
        _, arrays = _host_case(case, data)
        hkv, rep, sq, p, d, _ = KV16_CASES[case]
        fn, ref = _llama_fn(hkv, rep, sq, p + sq, d), arrays
    else:
        fn, arrays, ref = _cache16(kv_dtype, data, case)
    want = fn(*map(torch.from_numpy, ref)).numpy()
    vecs = (0, 1) if kind == "flash-decode" else (1,)  # (the runtime takes flash-decode-mma for aligned rows only)
    outs, _ = _attention_on_host(fn, arrays, kind, vecs, tmp_path, kv_dtype, chunk=chunk)
    tol = 1e-4 if kind == "flash-decode" else 2e-2
    for vec, got in zip(vecs, outs):
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=tol, atol=tol * np.abs(want).max(),
                                   err_msg=f"vec={vec}")


@pytest.mark.parametrize("mode", ["rows", "chunks"])
@pytest.mark.parametrize("case,kv_dtype", [("decode-128", "bfloat16"), ("causal-gqa-offset", "float16")])
def test_cpu_attention_16bit_cache(rng, monkeypatch, mode, case, kv_dtype):
    """The CPU Attention kernel over 16-bit k and v: the per-row path (LUMINAL_ATTENTION=rows) and the split-KV one
    cut into chunks of 64 keys (blocks of 16-bit rows widened once for a group of query rows)."""
    if mode == "rows":
        monkeypatch.setenv("LUMINAL_ATTENTION", "rows")
    else:
        monkeypatch.setenv("LUMINAL_ATTENTION", "split")
        monkeypatch.setenv("LUMINAL_ATTENTION_CHUNK", "64")
    fn, arrays, ref = _cache16(kv_dtype, rng.data, case)
    want = fn(*map(torch.from_numpy, ref)).numpy()
    cx, out = _kv16_graph(fn, arrays, kv_dtype, [lm.CPUCompiler()])
    assert cx.stats().get("Attention") == 1
    cx.execute()
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4, err_msg=f"{case} {rng}")


@pytest.mark.parametrize("case,env", [("causal-gqa-offset", "LUMINAL_CUDA_FLASH_MMA_SKIP"),
                                      ("causal-gqa-offset", "LUMINAL_CUDA_KV16_VECTOR"),
                                      ("decode-32", "LUMINAL_CUDA_FLASH_DECODE"),
                                      ("decode-128", "LUMINAL_CUDA_KV16_VECTOR")])
def test_attention_16bit_cache_variants(cuda_backend, rng, monkeypatch, case, env):
    """The other kernels over a bfloat16 cache, each by its switch (on a GPU; the cuda-nvrtc backend compiles them):
    flash-mma (skip off: its loads rounded element by element), flash-mma-skip staged element by element (no
    cp.async), decode without the decode kernel (the float32 tiles), and the decode kernel's element loops (k's
    and v's rows loaded element by element, as for rows not 16-byte aligned)."""
    monkeypatch.setenv(env, "0")
    fn, arrays, ref = _cache16("bfloat16", rng.data, case)
    want = fn(*map(torch.from_numpy, ref)).numpy()
    cx, out = _kv16_graph(fn, arrays, "bfloat16", cuda_backend.compilers("bfloat16"))
    cx.execute()
    np.testing.assert_allclose(out.numpy(), want, rtol=2e-2, atol=2e-2, err_msg=f"{case} {env} {rng}")


# ---- prefill on Hopper's warpgroup products (flash-wgmma: 128 query rows a block, a 16-bit cache) -----------------
# (KV heads, query heads per KV head, new tokens s, cached tokens p, head size, mask), as HOST_CASES: head sizes 128,
# 64 and 80 (padded to 128), 96 rows per KV head (under one block), a causal offset, masks hiding middle tiles,
# and a long cache over few row blocks (key ranges merged by the combine kernel).
WGMMA_CASES = {"causal-128": (2, 2, 200, 37, 128, "causal"), "middle-64": (1, 2, 70, 100, 64, "middle"),
               "head-80": (1, 2, 48, 20, 80, "causal"), "ranges-128": (1, 2, 64, 1000, 128, "causal")}


def _wgmma_expected(backend, cx):
    """On an sm_90 GPU, the attention ran as flash-wgmma (elsewhere the cuda-nvrtc check compiled it)."""
    if backend.name == "cuda" and lm._core.cuda_device()["compute_capability"] == 90:
        assert "flash-wgmma" in cx._runtime.rt.last_variants().values(), cx._runtime.rt.last_variants()


@pytest.mark.parametrize("case,dtype", [(c, "bfloat16") for c in WGMMA_CASES] + [("causal-128", "float16")])
def test_flash_wgmma(cuda_backend, rng, case, dtype):
    """flash-wgmma over a cache in the compute dtype against torch on the rounded values."""
    fn, arrays, ref = _cache16(dtype, rng.data, case)
    want = fn(*map(torch.from_numpy, ref)).numpy()
    cx, out = _kv16_graph(fn, arrays, dtype, cuda_backend.compilers(dtype))
    cx.execute()
    _wgmma_expected(cuda_backend, cx)
    np.testing.assert_allclose(out.numpy(), want, rtol=2e-2, atol=2e-2, err_msg=f"{case} {dtype} {rng}")


def test_flash_wgmma_symbolic(cuda_backend, rng):
    """One graph over a bfloat16 cache, is_causal, run at several lengths (the runtime plans its row blocks)."""
    cx = lm.Graph()
    q = cx.tensor((1, 4, "s", 64))
    k, v = cx.tensor((1, 2, "s", 64), "bfloat16"), cx.tensor((1, 2, "s", 64), "bfloat16")
    o = F.scaled_dot_product_attention(q, k.float(), v.float(), is_causal=True, enable_gqa=True).output()
    cx.compile(lm.GenericCompiler(), *cuda_backend.compilers("bfloat16"))
    for s in (150, 70, 301):
        arrs = [rng.data((1, 4, s, 64)).astype(np.float32)] + \
            [torch.from_numpy(rng.data((1, 2, s, 64)).astype(np.float32)).bfloat16().float().numpy() for _ in "kv"]
        for x, a in zip((q, k, v), arrs):
            x.set(a)
        cx.execute()
        _wgmma_expected(cuda_backend, cx)
        want = TF.scaled_dot_product_attention(*map(torch.from_numpy, arrs), is_causal=True, enable_gqa=True).numpy()
        np.testing.assert_allclose(o.numpy(), want, rtol=2e-2, atol=2e-2, err_msg=f"s={s} {rng}")
