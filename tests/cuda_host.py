"""Printed CUDA kernels compiled as C++ and run on the host, so that CI (no GPU) checks their arithmetic and
indexing, not only that NVRTC compiles them: a thread per CUDA thread (std::thread), a barrier for __syncthreads,
warp shuffles through a per-warp barrier, blocks one after another, and the intrinsics the kernels use emulated.
Slow and small: for a few tiles at the edges, not for sweeps."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

PRELUDE = r"""
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>
typedef long long i64;
typedef unsigned short u16;
typedef unsigned char u8;
struct D3 { unsigned x, y, z; };
thread_local D3 threadIdx, blockIdx;
D3 blockDim, gridDim;
struct Barrier {
  std::mutex m; std::condition_variable cv; int n = 1, count = 0, gen = 0;
  void wait() {
    std::unique_lock<std::mutex> l(m);
    int g = gen;
    if (++count == n) { count = 0; ++gen; cv.notify_all(); } else cv.wait(l, [&] { return g != gen; });
  }
} bar, wbar[32];
inline void __syncthreads() { bar.wait(); }
#define __global__
#define __shared__ static
#define __restrict__
#define __launch_bounds__(...)
#define __align__(n)
inline void pdl_start() {}
[[noreturn]] inline void __trap() { std::abort(); }
using std::min;
struct int2 { int x, y; };
inline int2 make_int2(int a, int b) { return {a, b}; }
struct uint2 { unsigned x, y; };
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
template <class T> T __ldg(const T* p) { return *p; }
std::mutex atomics;
inline float atomicAdd(float* p, float v) { std::lock_guard<std::mutex> l(atomics); float o = *p; *p += v; return o; }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  unsigned long long v = x | ((unsigned long long)y << 32);
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= unsigned((v >> (8 * ((s >> (4 * i)) & 7))) & 255) << (8 * i);
  return r;
}
inline int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; ++i) c += int((signed char)(a >> (8 * i))) * int((signed char)(b >> (8 * i)));
  return c;
}
inline int __float2int_rn(float f) { return int(std::nearbyint(f)); }
inline float bits_f32(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float f16_f32(u16 h) {
  int e = (h >> 10) & 31, m = h & 1023;
  float v = e == 0 ? std::ldexp(float(m), -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(float(m | 1024), e - 25);
  return h >> 15 ? -v : v;
}
inline u16 f32_bf16(float f) {  // round to nearest even
  unsigned x; std::memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1u);
  return u16(x >> 16);
}
inline u16 f32_f16(float f) {  // round to nearest even (no _Float16: older host compilers lack it)
  unsigned x; std::memcpy(&x, &f, 4);
  unsigned sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return u16(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));  // inf, NaN
  if (ax >= 0x477ff000u) return u16(sign | 0x7c00u);  // 65520 and up round to inf
  if (ax < 0x38800000u) return u16(sign | unsigned(std::nearbyint(bits_f32(ax) * 16777216.0f)));  // subnormal
  unsigned m = ax - 0x38000000u;  // the exponent rebiased from 127 to 15
  m += 0x0fffu + ((m >> 13) & 1u);
  return u16(sign | (m >> 13));
}
// Loads and stores by dtype; the 16-byte ones abort on a misaligned address, as the GPU would fault.
inline void aligned16(const void* p) {
  if (uintptr_t(p) % 16) { std::fprintf(stderr, "unaligned 16-byte access\n"); std::abort(); }
}
inline float ld_float32(const void* b, i64 o) { return ((const float*)b)[o]; }
inline float ld_bfloat16(const void* b, i64 o) { return bits_f32(unsigned(((const u16*)b)[o]) << 16); }
inline float ld_float16(const void* b, i64 o) { return f16_f32(((const u16*)b)[o]); }
inline void st_float32(void* b, i64 o, float v) { ((float*)b)[o] = v; }
template <class T> void st_bfloat16(void* b, i64 o, T v) { ((u16*)b)[o] = f32_bf16((float)v); }
template <class T> void st_float16(void* b, i64 o, T v) { ((u16*)b)[o] = f32_f16((float)v); }
inline void ld8_float32(const void* b, i64 o, float* x) {
  aligned16((const float*)b + o); for (int j = 0; j < 8; ++j) x[j] = ld_float32(b, o + j);
}
inline void ld8_bfloat16(const void* b, i64 o, float* x) {
  aligned16((const u16*)b + o); for (int j = 0; j < 8; ++j) x[j] = ld_bfloat16(b, o + j);
}
inline void ld8_float16(const void* b, i64 o, float* x) {
  aligned16((const u16*)b + o); for (int j = 0; j < 8; ++j) x[j] = ld_float16(b, o + j);
}
inline unsigned pack_bfloat16(float lo, float hi) { return f32_bf16(lo) | unsigned(f32_bf16(hi)) << 16; }
inline unsigned pack_float16(float lo, float hi) { return f32_f16(lo) | unsigned(f32_f16(hi)) << 16; }
// Warp shuffles: each lane publishes its value, the warp meets, each reads its partner's.
static double xbuf[1024];
template <class T> T shfl_xor(T v, int o) {
  int t = threadIdx.x;
  xbuf[t] = double(v);
  wbar[t / 32].wait();
  T r = T(xbuf[t ^ o]);
  wbar[t / 32].wait();
  return r;
}
template <class T> T warp_sum(T v) { for (int o = 16; o > 0; o >>= 1) v += shfl_xor(v, o); return v; }
template <class T> T warp_max(T v) { for (int o = 16; o > 0; o >>= 1) v = std::max(v, shfl_xor(v, o)); return v; }
// mma.sync.m16n8k16.row.col with float32 accumulators (16-bit operands given as bfloat16 bits): the warp's
// fragments gathered through shared arrays (behind the warp's barrier), each thread then computing its 4 outputs.
static unsigned FA[1024][4], FB[1024][2];
inline float lo16(unsigned r) { return bits_f32(r << 16); }
inline float hi16(unsigned r) { return bits_f32(r & 0xffff0000u); }
inline void mma_host(float* c, const unsigned* a, const unsigned* b) {
  int t = threadIdx.x, w = t / 32 * 32, g = (t % 32) >> 2, q = (t & 3) * 2;
  std::memcpy(FA[t], a, 16); std::memcpy(FB[t], b, 8);
  wbar[t / 32].wait();
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    int gl = l >> 2, ql = (l & 3) * 2;
    const unsigned *fa = FA[w + l], *fb = FB[w + l];
    A[gl][ql] = lo16(fa[0]); A[gl][ql + 1] = hi16(fa[0]); A[gl + 8][ql] = lo16(fa[1]); A[gl + 8][ql + 1] = hi16(fa[1]);
    A[gl][ql + 8] = lo16(fa[2]); A[gl][ql + 9] = hi16(fa[2]); A[gl + 8][ql + 8] = lo16(fa[3]); A[gl + 8][ql + 9] = hi16(fa[3]);
    B[ql][gl] = lo16(fb[0]); B[ql + 1][gl] = hi16(fb[0]); B[ql + 8][gl] = lo16(fb[1]); B[ql + 9][gl] = hi16(fb[1]);
  }
  for (int k = 0; k < 16; ++k) {
    c[0] += A[g][k] * B[k][q]; c[1] += A[g][k] * B[k][q + 1];
    c[2] += A[g + 8][k] * B[k][q]; c[3] += A[g + 8][k] * B[k][q + 1];
  }
  wbar[t / 32].wait();
}
// A grid of blocks run one after another, each as `threads` host threads.
template <class F> void launch(unsigned gx, unsigned gy, unsigned gz, int threads, F f) {
  bar.n = threads;
  for (auto& b : wbar) b.n = std::min(threads, 32);
  gridDim = {gx, gy, gz};
  blockDim = {unsigned(threads), 1, 1};
  for (unsigned z = 0; z < gz; ++z)
    for (unsigned y = 0; y < gy; ++y)
      for (unsigned x = 0; x < gx; ++x) {
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t)
          ts.emplace_back([&, t] { threadIdx = {unsigned(t), 0, 0}; blockIdx = {x, y, z}; f(); });
        for (auto& t : ts) t.join();
      }
}
std::vector<char> load(const char* path) {
  FILE* f = std::fopen(path, "rb");
  std::vector<char> v;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) v.insert(v.end(), buf, buf + n);
  std::fclose(f);
  return v;
}
"""


# What the matrix-vector group kernels use beyond PRELUDE: the warp shuffle (through the warp barrier), word
# funnel shifts, 8-float loads from shared memory; the L2 prefetch is a hint (nothing to do).
MATVEC = r"""
inline float __uint_as_float(unsigned u) { return bits_f32(u); }
inline unsigned __funnelshift_rc(unsigned lo, unsigned hi, unsigned s) {
  return unsigned(((unsigned long long)hi << 32 | lo) >> (s > 32 ? 32 : s));
}
template <class T> T __shfl_sync(unsigned, T v, int src) {
  int t = threadIdx.x;
  xbuf[t] = double(v);
  wbar[t / 32].wait();
  T r = T(xbuf[(t & ~31) + src]);
  wbar[t / 32].wait();
  return r;
}
inline void lds8_float32(const void* b, i64 o, float* x) { ld8_float32(b, o, x); }
// A lane's 8 elements as raw words (ldr8; ldsr8 streamed), widened by the prelude's own cvt8 (below).
struct f32x8 { uint4 lo, hi; };
inline uint4 raw16(const void* p) { aligned16(p); uint4 u; std::memcpy(&u, p, 16); return u; }
inline uint4 ldr8_bfloat16(const void* b, i64 o) { return raw16((const u16*)b + o); }
inline uint4 ldr8_float16(const void* b, i64 o) { return raw16((const u16*)b + o); }
inline f32x8 ldr8_float32(const void* b, i64 o) { return {raw16((const float*)b + o), raw16((const float*)b + o + 4)}; }
inline uint4 ldsr8_bfloat16(const void* b, i64 o) { return ldr8_bfloat16(b, o); }
inline uint4 ldsr8_float16(const void* b, i64 o) { return ldr8_float16(b, o); }
inline f32x8 ldsr8_float32(const void* b, i64 o) { return ldr8_float32(b, o); }
inline uint2 ld_stream8(const void* p) {
  if (uintptr_t(p) % 8) { std::fprintf(stderr, "unaligned 8-byte access\n"); std::abort(); }
  uint2 u; std::memcpy(&u, p, 8); return u;
}
inline uint4 ld_stream16(const void* p) {
  if (uintptr_t(p) % 16) { std::fprintf(stderr, "unaligned 16-byte access\n"); std::abort(); }
  uint4 u; std::memcpy(&u, p, 16); return u;
}
template <class T> T __shfl_xor_sync(unsigned, T v, int o) { return shfl_xor(v, o); }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline void prefetch_l2(const void*, i64, i64, int) {}  // (a hint)
template <class T> T rd_float32(T v) { return (T)(float)v; }
template <class T> T rd_bfloat16(T v) { return (T)bits_f32(unsigned(f32_bf16((float)v)) << 16); }
template <class T> T rd_float16(T v) { return (T)f16_f32(f32_f16((float)v)); }
inline float __fmul_rn(float a, float b) { return a * b; }
"""


def _prelude_function(name: str) -> str:
    """A device function of the CUDA prelude as host C++ (its intrinsics are emulated above)."""
    import luminal as lm

    text = lm._core.cuda_prelude()
    start = re.search(rf"^__device__ __forceinline__ \w+ {name}\(", text, re.M).start()
    end = text.index("\n}\n", start) + 3
    return text[start:end].replace("__device__ __forceinline__ ", "inline ")


# Split Q8_0 operands quantise their activations as the GPU does, and raw words widen as on the GPU (the prelude's
# own text).
MATVEC += _prelude_function("q8_quantize8")
for _dt in ("float32", "bfloat16", "float16"):
    MATVEC += _prelude_function(f"cvt8_{_dt}")
# Unravelled indices divide by their dims' dividers (udiv), as on the GPU.
PRELUDE += "inline unsigned __umulhi(unsigned a, unsigned b) { return unsigned(((unsigned long long)a * b) >> 32); }\n"
PRELUDE += _prelude_function("udiv")


def view_slots(offset: int, size: int, shape, strides) -> list[int]:
    """An unmasked view's slots in a kernel's parameter slice, as the runtime writes them: offset, buffer size, shape,
    strides, and each dim's divider."""
    import luminal as lm

    shape, strides = [int(s) for s in shape], [int(s) for s in strides]
    return [int(offset), int(size)] + shape + strides + [lm._core.cuda_div_magic(s) for s in shape]


def compiler() -> str | None:
    """The host C++ compiler (CXX, c++ or g++), or None."""
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def build(source: str, folder: Path) -> Path:
    """PRELUDE + `source` (printed kernels and a main) compiled into folder/k; returns the program's path."""
    (folder / "k.cpp").write_text(PRELUDE + source)
    subprocess.run([compiler(), "-O1", "-std=c++17", "-w", "-pthread", "-o", str(folder / "k"), str(folder / "k.cpp")],
                   check=True, capture_output=True)
    return folder / "k"
