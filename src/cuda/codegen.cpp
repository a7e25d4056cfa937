#include "cuda/codegen.h"
#include "cuda/contraction.h"

#include "core/lower/ops.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <algorithm>
#include <climits>
#include <map>
#include <optional>
#include <stdexcept>

namespace luminal {
namespace cuda {
namespace {

// Conversions and rounding helpers every module starts with. Rounding follows dtype.h exactly: a float result is
// rounded to float32 first, then to the storage type (round to nearest even); int32 truncates and saturates (NaN
// is 0); uint8 wraps; bool is `!= 0`.
const char* kPrelude = R"(typedef long long i64;
typedef unsigned short u16;
typedef unsigned char u8;
__device__ __forceinline__ float f16_f32(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ u16 f32_f16(float f) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float bf16_f32(u16 b) { return __uint_as_float(((unsigned)b) << 16); }
__device__ __forceinline__ u16 f32_bf16(float f) {
  unsigned x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (u16)(x >> 16);
}
__device__ __forceinline__ double trunc_i32(double v) {
  if (isnan(v)) return 0.0;
  return fmin(fmax(trunc(v), -2147483648.0), 2147483647.0);
}
__device__ __forceinline__ u8 wrap_u8(double v) {
  if (isnan(v)) return 0;
  double t = trunc(v);
  return (u8)((t < -9e18 || t > 9e18) ? 0 : ((long long)t & 0xff));
}
__device__ __forceinline__ float ld_float32(const void* b, i64 o) { return ((const float*)b)[o]; }
__device__ __forceinline__ float ld_float16(const void* b, i64 o) { return f16_f32(((const u16*)b)[o]); }
__device__ __forceinline__ float ld_bfloat16(const void* b, i64 o) { return bf16_f32(((const u16*)b)[o]); }
__device__ __forceinline__ double ld_int32(const void* b, i64 o) { return ((const int*)b)[o]; }
__device__ __forceinline__ double ld_uint8(const void* b, i64 o) { return ((const u8*)b)[o]; }
__device__ __forceinline__ float ld_bool(const void* b, i64 o) { return ((const u8*)b)[o] ? 1.0f : 0.0f; }
template <class T> __device__ __forceinline__ void st_float32(void* b, i64 o, T v) { ((float*)b)[o] = (float)v; }
template <class T> __device__ __forceinline__ void st_float16(void* b, i64 o, T v) { ((u16*)b)[o] = f32_f16((float)v); }
template <class T> __device__ __forceinline__ void st_bfloat16(void* b, i64 o, T v) { ((u16*)b)[o] = f32_bf16((float)v); }
template <class T> __device__ __forceinline__ void st_int32(void* b, i64 o, T v) { ((int*)b)[o] = (int)trunc_i32((double)v); }
template <class T> __device__ __forceinline__ void st_uint8(void* b, i64 o, T v) { ((u8*)b)[o] = wrap_u8((double)v); }
template <class T> __device__ __forceinline__ void st_bool(void* b, i64 o, T v) { ((u8*)b)[o] = v != (T)0; }
// r / d for r >= 0 by d's divider md (div_magic in codegen.h: a multiply-high and a shift) where both fit 32 bits;
// else by division.
__device__ __forceinline__ i64 udiv(i64 r, i64 d, i64 md) {
  if (md != 0 && (unsigned long long)r <= 0xffffffffull) {
    unsigned n = (unsigned)r;
    return (i64)(((unsigned long long)__umulhi(n, (unsigned)md) + n) >> (unsigned)(md >> 32));
  }
  return r / d;
}
// Elements o..o+V-1 (o a multiple of V) by one store where the address allows (element_loop's groups).
template <int V, class S> __device__ __forceinline__ void stv_raw(S* p, const S* x) {
  constexpr int B = V * sizeof(S);
  if (((size_t)p & (B - 1)) != 0 || (B != 4 && B != 8 && B != 16)) { for (int k = 0; k < V; ++k) p[k] = x[k]; return; }
  if (B == 16) *(uint4*)p = *(const uint4*)x;
  else if (B == 8) *(uint2*)p = *(const uint2*)x;
  else *(unsigned*)p = *(const unsigned*)x;
}
#define LUMINAL_STV(NAME, S, CONV) template <int V, class T> __device__ __forceinline__ void stv_##NAME(void* b, i64 o, const T* v) { \
  __align__(16) S x[V]; for (int k = 0; k < V; ++k) { T w = v[k]; x[k] = CONV; } stv_raw<V>((S*)b + o, x); }
LUMINAL_STV(float32, float, (float)w)
LUMINAL_STV(float16, u16, f32_f16((float)w))
LUMINAL_STV(bfloat16, u16, f32_bf16((float)w))
LUMINAL_STV(int32, int, (int)trunc_i32((double)w))
LUMINAL_STV(uint8, u8, wrap_u8((double)w))
LUMINAL_STV(bool, u8, (u8)(w != (T)0))
// Elements o, o + s, .., o + (V-1) s of an input, widened to T: by vector loads where s is 1 and the address allows
// (element_loop's groups).
#define LUMINAL_LDV(NAME, S, CONV) template <int V, class T> __device__ __forceinline__ void ldv_##NAME(const void* b, i64 o, i64 s, T* x) { \
  const S* q = (const S*)b + o; constexpr int B = V * sizeof(S); __align__(16) S y[V]; \
  if (s == 1 && (B == 4 || B == 8 || B % 16 == 0) && ((size_t)q & (B < 16 ? B - 1 : 15)) == 0) { \
    if (B % 16 == 0) { for (int k = 0; k < B / 16; ++k) ((uint4*)y)[k] = ((const uint4*)q)[k]; } \
    else if (B == 8) *(uint2*)y = *(const uint2*)q; else *(unsigned*)y = *(const unsigned*)q; \
  } else { for (int k = 0; k < V; ++k) y[k] = q[k * s]; } \
  for (int k = 0; k < V; ++k) { S w = y[k]; x[k] = (T)(CONV); } }
LUMINAL_LDV(float32, float, w)
LUMINAL_LDV(float16, u16, f16_f32(w))
LUMINAL_LDV(bfloat16, u16, bf16_f32(w))
LUMINAL_LDV(int32, int, (double)w)
LUMINAL_LDV(uint8, u8, (double)w)
LUMINAL_LDV(bool, u8, w ? 1.0f : 0.0f)
template <class T> __device__ __forceinline__ T rd_float32(T v) { return (T)(float)v; }
template <class T> __device__ __forceinline__ T rd_float16(T v) { return (T)f16_f32(f32_f16((float)v)); }
template <class T> __device__ __forceinline__ T rd_bfloat16(T v) { return (T)bf16_f32(f32_bf16((float)v)); }
template <class T> __device__ __forceinline__ T rd_int32(T v) { return (T)trunc_i32((double)v); }
template <class T> __device__ __forceinline__ T rd_uint8(T v) { return (T)wrap_u8((double)v); }
template <class T> __device__ __forceinline__ T rd_bool(T v) { return v != (T)0 ? (T)1 : (T)0; }
__device__ __forceinline__ float op_log2(float x) { return log2f(x); }
__device__ __forceinline__ double op_log2(double x) { return log2(x); }
__device__ __forceinline__ float op_exp2(float x) { return exp2f(x); }
__device__ __forceinline__ double op_exp2(double x) { return exp2(x); }
__device__ __forceinline__ float op_sin(float x) { return sinf(x); }
__device__ __forceinline__ double op_sin(double x) { return sin(x); }
__device__ __forceinline__ float op_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double op_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float op_mod(float a, float b) { return fmodf(a, b); }
__device__ __forceinline__ double op_mod(double a, double b) { return fmod(a, b); }
template <class T> __device__ __forceinline__ T op_max(T acc, T x) { return (isnan(x) || x > acc) ? x : acc; }
// The first failing check wins: node id * 4 + code (1: a padded view read outside its buffer, 2: a gather index,
// 3: a scatter index out of range).
__device__ __forceinline__ void fail(int* err, const i64* p, int code) { atomicCAS(err, 0, (int)(p[0] * 4 + code)); }
// Eight consecutive elements from a 16-byte-aligned address, as raw words (ldr8: 16-bit, one 16-byte load;
// float32, two), then widened to float (cvt8); ld8 does both. A dot loop issues all of a step's raw loads before
// the first widening, so they are in flight together, in half the registers of floats.
struct f32x8 { uint4 lo, hi; };
__device__ __forceinline__ uint4 ldr8_float16(const void* b, i64 o) { return *(const uint4*)((const u16*)b + o); }
__device__ __forceinline__ uint4 ldr8_bfloat16(const void* b, i64 o) { return *(const uint4*)((const u16*)b + o); }
__device__ __forceinline__ f32x8 ldr8_float32(const void* b, i64 o) {
  const uint4* q = (const uint4*)((const float*)b + o);
  return {q[0], q[1]};
}
__device__ __forceinline__ void cvt8_float32(f32x8 r, float* x) {
  unsigned w[8] = {r.lo.x, r.lo.y, r.lo.z, r.lo.w, r.hi.x, r.hi.y, r.hi.z, r.hi.w};
  for (int j = 0; j < 8; ++j) x[j] = __uint_as_float(w[j]);
}
__device__ __forceinline__ void cvt8_float16(uint4 u, float* x) {
  unsigned w[4] = {u.x, u.y, u.z, u.w};
  for (int j = 0; j < 4; ++j) { x[2 * j] = f16_f32((u16)(w[j] & 0xffff)); x[2 * j + 1] = f16_f32((u16)(w[j] >> 16)); }
}
__device__ __forceinline__ void cvt8_bfloat16(uint4 u, float* x) {
  unsigned w[4] = {u.x, u.y, u.z, u.w};
  for (int j = 0; j < 4; ++j) { x[2 * j] = __uint_as_float(w[j] << 16); x[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u); }
}
__device__ __forceinline__ void ld8_float32(const void* b, i64 o, float* x) { cvt8_float32(ldr8_float32(b, o), x); }
__device__ __forceinline__ void ld8_float16(const void* b, i64 o, float* x) { cvt8_float16(ldr8_float16(b, o), x); }
__device__ __forceinline__ void ld8_bfloat16(const void* b, i64 o, float* x) { cvt8_bfloat16(ldr8_bfloat16(b, o), x); }
// The same, streamed (ldsr8, lds8): read-only, not kept in L1 (weights read once per step).
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
  uint4 u;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p));
  return u;
}
__device__ __forceinline__ uint4 ldsr8_float16(const void* b, i64 o) { return ld_stream16((const u16*)b + o); }
__device__ __forceinline__ uint4 ldsr8_bfloat16(const void* b, i64 o) { return ld_stream16((const u16*)b + o); }
__device__ __forceinline__ f32x8 ldsr8_float32(const void* b, i64 o) {
  return {ld_stream16((const float*)b + o), ld_stream16((const float*)b + o + 4)};
}
__device__ __forceinline__ void lds8_float32(const void* b, i64 o, float* x) { cvt8_float32(ldsr8_float32(b, o), x); }
__device__ __forceinline__ void lds8_float16(const void* b, i64 o, float* x) { cvt8_float16(ldsr8_float16(b, o), x); }
__device__ __forceinline__ void lds8_bfloat16(const void* b, i64 o, float* x) { cvt8_bfloat16(ldsr8_bfloat16(b, o), x); }
// 8 bytes streamed past L1 (a lane's quants of Q8_0 weights stored split).
__device__ __forceinline__ uint2 ld_stream8(const void* p) {
  uint2 u;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(u.x), "=r"(u.y) : "l"(p));
  return u;
}
// A lane's 8 activations of a block of 32 spread over 4 consecutive lanes, quantised as q8_quantize does (d =
// max|a| / 127, q = a * (1 / d) rounded to nearest even), packed 4 quants a word: adding 1.5 * 2^23 rounds to an
// integer whose low byte is the quant's (two's complement), and byte permutes gather those bytes.
__device__ __forceinline__ void q8_quantize8(const float* a, unsigned* q, float& d) {
  float m = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) m = fmaxf(m, fabsf(a[e]));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
  d = m / 127.0f;
  float id = d != 0.0f ? 1.0f / d : 0.0f;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    unsigned f[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) f[e] = __float_as_uint(__fadd_rn(__fmul_rn(a[4 * j + e], id), 12582912.0f));
    q[j] = __byte_perm(__byte_perm(f[0], f[1], 0x40u), __byte_perm(f[2], f[3], 0x40u), 0x5410u);
  }
}
// A warp's L2 prefetch of `bytes` from w + o: a lane per 128-byte line (a hint: L2 is coherent).
__device__ __forceinline__ void prefetch_l2(const void* w, i64 o, i64 bytes, int lane) {
  size_t a = (size_t)((const u8*)w + o) & ~(size_t)127, end = (size_t)((const u8*)w + o) + bytes;
  for (a += (size_t)lane * 128; a < end; a += 32 * 128) asm volatile("prefetch.global.L2 [%0];" :: "l"(a));
}
// Programmatic dependent launch (sm_90+; CUDA graph edges of that type, see runtime.cpp): every kernel first waits
// for the kernel before it to finish (its writes visible), then lets the next one start launching, so that the
// next kernel's launch and block start-up overlap this one's tail instead of following it. Without such an edge
// both are no-ops.
__device__ __forceinline__ void pdl_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// The GEMM's staging (gemm_kernel): 16-byte asynchronous copies into shared memory (src-size 0 fills zeros: the
// rows and k past the edges), pairs of floats rounded to one register of 16-bit pairs, 8 x 8 fragment loads.
__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ unsigned pack_bfloat16(float lo, float hi) {
  unsigned r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ unsigned pack_float16(float lo, float hi) {
  unsigned r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ void ldsm_x4(unsigned* d, unsigned a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned* d, unsigned a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(a));
}
// Hopper's warpgroup products (the Wgmma GEMM variants; sm_90a, as the runtime compiles for an sm_90 device). A
// shared-memory operand's descriptor: rows of 128 bytes (64 16-bit k) stored with the 128-byte swizzle (chunk c of
// row r at c ^ (r & 7), as the GEMM's ring stores them), groups of 8 rows 1024 bytes apart.
// TmaMap: a tensor map (the driver's CUtensorMap, encoded by the runtime), passed by value as a __grid_constant__
// parameter; the Tensor Memory Accelerator copies boxes of it into shared memory and back.
struct __align__(64) TmaMap { unsigned long long w[16]; };
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
// An operand stored N-major (the products' imm-trans-b: FlashWgmma's V, its rows the product's k): rows of 64 n
// (128 bytes) with the same swizzle, groups of 8 rows 1024 bytes apart, the next 64 n `lbo` bytes on.
__device__ __forceinline__ unsigned long long wg_desc_n(unsigned addr, unsigned lbo) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) | (64ull << 32) | (1ull << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
// The ring's barriers (mbarrier): a stage full (the producer's copies landed), a stage empty (its products done).
__device__ __forceinline__ void mbar_init(unsigned a, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned a) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(a) : "memory");
}
// (an arrival once this thread's cp.async copies before it have landed; counted in the barrier's expected count)
__device__ __forceinline__ void cp_arrive_noinc(unsigned a) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(a) : "memory");
}
// (arrives and expects `bytes` more of asynchronous copies: the TMA copies that complete it)
__device__ __forceinline__ void mbar_expect(unsigned a, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes) : "memory");
}
// The box of `map` at (c0, c1, c2) into shared memory at dst, counted on barrier bar.
__device__ __forceinline__ void tma_load(unsigned dst, const TmaMap* map, int c0, int c1, int c2, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
               ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
}
// Shared memory at src into the box of `map` at (c0, c1, c2) (nothing written past the map's edges), as one bulk
// group of this thread once committed; tma_read_wait: until its groups have read their shared memory.
__device__ __forceinline__ void tma_store(const TmaMap* map, int c0, int c1, int c2, unsigned src) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];"
               ::"l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(src) : "memory");
}
__device__ __forceinline__ void tma_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void tma_read_wait() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void tma_wait() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// (shared memory written by threads, before the Tensor Memory Accelerator reads it)
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// A barrier of the GEMM's two consumer warpgroups only (named barrier 1; the producer warp runs on)
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, 256;" ::: "memory"); }
__device__ __forceinline__ void mbar_wait(unsigned a, unsigned parity) {
  unsigned done;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(a), "r"(parity) : "memory");
  } while (!done);
}
#endif
// exp2 of softmax weights that are rounded to 16 bits next (flash_tiles): the hardware's approximation, 2 ulp
__device__ __forceinline__ float fast_exp2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
template <class T> __device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <class T> __device__ __forceinline__ T warp_max(T v) {
  for (int o = 16; o > 0; o >>= 1) v = op_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// A sum or max over the block (blockDim.x a multiple of 32, at most 1024) that every thread receives; `part` is
// shared scratch of 32 values. The first barrier keeps a previous call's readers ahead of this call's writers.
template <class T> __device__ __forceinline__ T block_reduce(T v, bool sum, T* part) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = sum ? warp_sum(v) : warp_max(v);
  __syncthreads();
  if (lane == 0) part[w] = v;
  __syncthreads();
  v = lane < nw ? part[lane] : (sum ? (T)0 : (T)-__int_as_float(0x7f800000));
  return sum ? warp_sum(v) : warp_max(v);
}
)";

bool is_int(DType d) { return d == DType::I32 || d == DType::U8; }

std::string lit(double v, bool as_float) {
  char buf[64];
  if (std::isnan(v)) return as_float ? "__int_as_float(0x7fc00000)" : "__longlong_as_double(0x7ff8000000000000LL)";
  if (std::isinf(v)) {
    std::string s = as_float ? "__int_as_float(0x7f800000)" : "__longlong_as_double(0x7ff0000000000000LL)";
    return v < 0 ? "(-" + s + ")" : s;
  }
  std::snprintf(buf, sizeof buf, "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return as_float ? "(float)" + s : s;
}

// A string builder (iostreams are avoided: see api.cpp's note on libstdc++ locale facets).
struct Text {
  std::string s;
  Text& operator<<(const std::string& x) { s += x; return *this; }
  Text& operator<<(const char* x) { s += x; return *this; }
  Text& operator<<(char c) { s += c; return *this; }
  Text& operator<<(int v) { s += std::to_string(v); return *this; }
  Text& operator<<(long long v) { s += std::to_string(v); return *this; }
  const std::string& str() const { return s; }
};

// Text that reads slots of a view.
struct ViewText {
  const ViewSlot& s;
  static std::string at(int slot) { return "p[" + std::to_string(slot) + "]"; }
  std::string off() const { return at(s.base); }
  std::string size() const { return at(s.base + 1); }
  std::string shape(int d) const { return at(s.shape_slot(d)); }
  std::string stride(int d) const { return at(s.stride_slot(d)); }
  std::string lo(int d) const { return at(s.lo_slot(d)); }
  std::string hi(int d) const { return at(s.hi_slot(d)); }
  std::string div(int d) const { return at(s.div_slot(d)); }
  std::string offset(const std::vector<std::string>& idx) const {
    std::string e = off();
    for (int d = 0; d < s.rank; ++d) e += " + " + idx[d] + " * " + stride(d);
    return e;
  }
  std::string valid(const std::vector<std::string>& idx) const {
    std::string e;
    for (int d = 0; d < s.rank; ++d)
      e += (e.empty() ? "" : " && ") + idx[d] + " >= " + lo(d) + " && " + idx[d] + " < " + hi(d);
    return e.empty() ? "true" : e;
  }
};

// Statements that set `var` (already declared, of type T) to input `in`'s element at `idx` through its view.
// Unmasked views are checked against their buffer on the host before launch; padded ones are checked here.
std::string load(const ViewSlot& s, const std::vector<std::string>& idx, const std::string& in, DType storage,
                 const std::string& T, const std::string& var) {
  ViewText v{s};
  std::string ld = "ld_" + std::string(dtype_name(storage)) + "(" + in + ", ";
  if (!s.masked) return "    " + var + " = (" + T + ")" + ld + v.offset(idx) + ");\n";
  return "    { i64 o = " + v.offset(idx) + "; " + var + " = (" + T + ")0;\n      if (" + v.valid(idx) +
         ") { if (o < 0 || o >= " + v.size() + ") fail(err, p, 1); else " + var + " = (" + T + ")" + ld + "o); } }\n";
}

// Declares `var` = <running> % (the view's dim d) and divides <running> by it (udiv: the dim's divider).
std::string divmod_dim(const ViewSlot& s, int d, const std::string& var, const std::string& running = "q_") {
  ViewText v{s};
  return "    i64 " + var + ";\n    { i64 d_ = udiv(" + running + ", " + v.shape(d) + ", " + v.div(d) + "); " + var +
         " = " + running + " - d_ * " + v.shape(d) + "; " + running + " = d_; }\n";
}

// Declares i<from>..i<to-1> by unravelling `flat` over the view's shape (dims from..to-1, row-major).
std::string unravel(const ViewSlot& s, int from, int to, const std::string& flat, const std::string& prefix = "i") {
  if (from >= to) return "";
  std::string out = "    i64 r_ = " + flat + ";\n";
  for (int d = to - 1; d > from; --d) out += divmod_dim(s, d, prefix + std::to_string(d), "r_");
  return out + "    i64 " + prefix + std::to_string(from) + " = r_;\n";
}

// The row offset of view `vt` at the row indices <pre>0.. of its first nd dims.
std::string view_base(const ViewText& vt, const std::string& pre, int nd) {
  std::string e = vt.off();
  for (int d = 0; d < nd; ++d) e += " + " + pre + std::to_string(d) + " * " + vt.stride(d);
  return e;
}

std::vector<std::string> names(const std::string& prefix, int from, int to) {
  std::vector<std::string> v;
  for (int d = from; d < to; ++d) v.push_back(prefix + std::to_string(d));
  return v;
}

std::string arg_type(const std::string& name) { return name[0] == 'Q' ? "const i64* __restrict__ " : "const void* __restrict__ "; }

std::vector<std::string> input_names(int nin) { return names("in", 0, nin); }

// A kernel's parameter list: its parameter slice, the error word, its output, then `args` (Q...: a parameter slice).
std::string params(const std::vector<std::string>& args) {
  std::string s = "(const i64* __restrict__ p, int* __restrict__ err, void* __restrict__ out";
  for (auto& a : args) s += ", " + arg_type(a) + a;
  return s + ")";
}

std::string params(int nin) { return params(input_names(nin)); }

// A warp's 32 x 32 share of a 64 x 64 tile (warp wm, wn of 2 x 2) over `bk` k held in shared memory as As[row][k]
// and Bs[col][k] in the 16-bit type `ct`: mma.sync m16n8k16 into the float array `acc`[2][4][4] (lane: g = lane / 4,
// q = 2 * (lane % 4)).
std::string warp_mma_tile(const std::string& ct, int bk, const std::string& acc = "acc") {
  Text t;
  t << "#pragma unroll\n"
    << "    for (int kk = 0; kk < " << bk << "; kk += 16) {\n"
    << "      unsigned af[2][4], bf[4][2];\n"
    << "      for (int i = 0; i < 2; ++i) {\n"
    << "        int r = wm * 32 + i * 16 + g;\n"
    << "        af[i][0] = *(const unsigned*)&As[r][kk + q];\n"
    << "        af[i][1] = *(const unsigned*)&As[r + 8][kk + q];\n"
    << "        af[i][2] = *(const unsigned*)&As[r][kk + q + 8];\n"
    << "        af[i][3] = *(const unsigned*)&As[r + 8][kk + q + 8];\n      }\n"
    << "      for (int j = 0; j < 4; ++j) {\n"
    << "        int cn = wn * 32 + j * 8 + g;\n"
    << "        bf[j][0] = *(const unsigned*)&Bs[cn][kk + q];\n"
    << "        bf[j][1] = *(const unsigned*)&Bs[cn][kk + q + 8];\n      }\n"
    << "      for (int i = 0; i < 2; ++i)\n        for (int j = 0; j < 4; ++j)\n"
    << "          asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32." << ct << "." << ct << ".f32 "
    << "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\"\n"
    << "                       : \"+f\"(" << acc << "[i][j][0]), \"+f\"(" << acc << "[i][j][1]), \"+f\"(" << acc
    << "[i][j][2]), \"+f\"(" << acc << "[i][j][3])\n"
    << "                       : \"r\"(af[i][0]), \"r\"(af[i][1]), \"r\"(af[i][2]), \"r\"(af[i][3]), \"r\"(bf[j][0]), "
       "\"r\"(bf[j][1]));\n"
    << "    }\n";
  return t.str();
}

// A warp's dot products of one row of activations `a` (at offset `oa`) with rows of one or more weights (each
// operand: storage dtype, pointer, offset, accumulator name), sharing the activation loads: each lane issues `U`
// steps of 8 elements (raw 16-byte loads, ldr8) before the first is widened and multiplied, whole steps without
// bounds checks (dot_steps); weights are streamed past L1 (ldsr8). Leaves each warp-summed accumulator in every
// lane; K is the row length. Operands with `q8` set: see dot_rows_q8. With `act`, the activations are computed
// where they are loaded (a group's factored prologue, see group_kernel).
struct ActRow {
  std::string sig;   // the kernel's extra parameters
  std::string init;  // before the loop (`oa` known): the row's offsets, its sums' accumulators
  // Statements setting float dst[0..8) to the row's elements at..at+7 (in range), adding to the row's sums.
  std::function<std::string(const std::string& at, const std::string& dst)> load;
  std::string finish;  // after the loop: float scale_, what each dot product is multiplied by
  // finish's parts: the Reduce registers whose sums (s<r>_) give k<r>, then the statements and the expression of
  // the scale from them (stage_row sums over the block instead of the warp)
  std::vector<int> sums;
  std::string scalar, scale;
};
struct DotOperand {
  DType storage;
  std::string ptr, off, acc;
  bool q8 = false;    // Q8_0 blocks: `off` is the packed row's first byte
  std::string soff;   // Q8_0 stored split (q8_layout.h): `off` is the row's first quant, `soff` its first scale's byte
  bool blocks() const { return q8 && soff.empty(); }  // Q8_0 as GGUF blocks
  bool split() const { return q8 && !soff.empty(); }  // Q8_0 stored split
};
std::string dot_rows_q8(DType as, const std::string& a, const std::string& oa, const std::vector<DotOperand>& ws, int U,
                        const ActRow* act, const std::string& kb, const std::string& ke, bool staged);

// A dot loop's steps over [kb, ke) (`width` elements a warp each): whole steps unchecked, then one checked
// step (`step(checked)` prints one), then each operand's accumulator summed over the warp.
std::string dot_steps(const std::vector<DotOperand>& ws, const std::string& kb, const std::string& ke, int width,
                      const std::function<std::string(bool)>& step) {
  Text t;
  t << "    i64 k_ = " << kb << ";\n    for (; k_ + " << width << " <= " << ke << "; k_ += " << width << ") {\n"
    << step(false) << "    }\n    if (k_ < " << ke << ") {\n" << step(true) << "    }\n";
  for (auto& w : ws) t << "    " << w.acc << " = warp_sum(" << w.acc << ");\n";
  return t.str();
}

// [kb, ke): the part of the rows summed (kb a multiple of a step, 256 U; a group kernel's K split over warps).
// `staged`: every operand is Q8_0 stored split and the activations are already quantised in shared memory
// (stage_row, dot_rows_staged: steps of 512).
std::string dot_rows(DType as, const std::string& a, const std::string& oa, const std::vector<DotOperand>& ws, int U,
                     const ActRow* act = nullptr, const std::string& kb = "0", const std::string& ke = "K",
                     bool staged = false) {
  if (std::any_of(ws.begin(), ws.end(), [](const DotOperand& w) { return w.q8; }))
    return dot_rows_q8(as, a, oa, ws, U, act, kb, ke, staged);
  // (a lane's raw words of a step: see ldr8)
  auto raw = [](DType d) { return std::string(d == DType::F32 ? "f32x8" : "uint4"); };
  Text t;
  for (auto& w : ws) t << "    float " << w.acc << " = 0.0f;\n";
  auto step = [&](bool checked) {
    Text s;
    s << "      i64 k0 = k_ + lane * 8;\n";
    if (act) s << "      float a[" << U << "][8];\n";
    else s << "      " << raw(as) << " a[" << U << "];\n";
    for (auto& w : ws) s << "      " << raw(w.storage) << " b_" << w.acc << "[" << U << "];\n";
    s << "#pragma unroll\n      for (int u = 0; u < " << U << "; ++u) {\n";
    if (checked) s << "        if (k0 + u * 256 < " << ke << ") {\n";
    std::string in = checked ? "          " : "        ";
    if (!act) s << in << "a[u] = ldr8_" << dtype_name(as) << "(" << a << ", " << oa << " + k0 + u * 256);\n";
    for (auto& w : ws)
      s << in << "b_" << w.acc << "[u] = ldsr8_" << dtype_name(w.storage) << "(" << w.ptr << ", " << w.off
        << " + k0 + u * 256);\n";
    if (act) s << act->load("k0 + u * 256", "a[u]");  // (after the weights' loads: those are the ones to start first)
    if (checked) {
      s << "        } else {\n";
      if (act) s << "          for (int e = 0; e < 8; ++e) a[u][e] = 0.0f;\n";
      else s << "          a[u] = " << raw(as) << "{};\n";
      for (auto& w : ws) s << "          b_" << w.acc << "[u] = " << raw(w.storage) << "{};\n";
      s << "        }\n";
    }
    s << "      }\n#pragma unroll\n      for (int u = 0; u < " << U << "; ++u) {\n";
    if (act) s << "        const float* x = a[u];\n";
    else s << "        float x[8];\n        cvt8_" << dtype_name(as) << "(a[u], x);\n";
    for (auto& w : ws)
      s << "        { float y[8];\n          cvt8_" << dtype_name(w.storage) << "(b_" << w.acc << "[u], y);\n"
        << "          for (int e = 0; e < 8; ++e) " << w.acc << " += x[e] * y[e]; }\n";
    s << "      }\n";
    return s.str();
  };
  return t.str() + dot_steps(ws, kb, ke, 256 * U, step);
}

// dot_rows with Q8_0 operands (and float ones). Lane l's 8 elements of a step are quarter l & 3 of its block l / 4.
// Operands stored split (q8_layout.h): the lane's 8 quants in one 8-byte load and its block's scale, against its 8
// activations quantised in registers (q8_quantize8, once per step for all such operands), by two __dp4a. Operands
// as GGUF blocks: the quants unpacked in registers against the same float activations (float32 sums). Q8_0 block
// rows are only 2-byte aligned (34-byte blocks), so a lane loads the 3 aligned words that cover the 2 bytes before
// its quants and the quants: the block's first lane has the block's scale there, and shuffles it to the other 3.
// A lane's alignment is its block's parity, the same at every step: worked out once (qs, 0 or 16: the bits its
// window starts into its first word). (The last word may reach 2 bytes past the quants: the runtime checks the
// buffer is whole words.) Every lane runs every step (the shuffles need the whole warp): whole steps unchecked,
// then one checked step for a K that is not a multiple of 256 U.
// A matrix-vector kernel: a warp per output row (of the parameter slice's p[1]), over the activations' view `av`
// (inputs in0, in1); `w`'s row starts where its `off` says (in the row's indices i0...), lane 0 stores the dot.
std::string warp_rows_kernel(const ViewSlot& av, DType as, const DotOperand& w, DType out) {
  int R = av.rank;
  std::vector<std::string> idx = names("i", 0, R - 1);
  idx.push_back("0");
  Text k;
  k << "extern \"C\" __global__ __launch_bounds__(256) void NAME" << params(2) << " {\n"
    << "  int lane = threadIdx.x & 31;\n  i64 nw = ((i64)gridDim.x * blockDim.x) >> 5, K = p[2];\n"
    << "  for (i64 row = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5; row < p[1]; row += nw) {\n"
    << unravel(av, 0, R - 1, "row") << "    i64 oa = " << ViewText{av}.offset(idx) << ", " << w.off << ";\n"
    << dot_rows(as, "in0", "oa", {{w.storage, "in1", "ob", "acc", w.q8, w.soff.empty() ? "" : "obs"}}, 4)
    << "    if (lane == 0) st_" << dtype_name(out) << "(out, row, acc);\n  }\n}\n";
  return k.str();
}

// Flash-decoding's merge of one output element over a row's key ranges: each range's partial row at
// `wr` + z * (N + 2) holds its max, its sum, then its N accumulators; column `col` is rescaled to the common max in
// one online pass (the loads of several ranges in flight at once), leaving M, L and a. `ld`: the load function
// (__ldcg for rows other blocks just wrote; empty: plain loads). Needs nsplit, N, c_ and ninf.
std::string merge_ranges(const std::string& wr, const std::string& col, const std::string& ld, const std::string& in) {
  auto at = [&](const std::string& x) { return ld.empty() ? "*(" + x + ")" : ld + "(" + x + ")"; };
  Text t;
  t << in << "float M = ninf, L = 0.0f, a = 0.0f;\n#pragma unroll 8\n" << in << "for (i64 z = 0; z < nsplit; ++z) {\n"
    << in << "  const float* part = " << wr << " + z * (N + 2);\n"
    << in << "  float pm = " << at("part") << ", pl = " << at("part + 1") << ", pa = " << at("part + 2 + " + col) << ";\n"
    << in << "  float mn = op_max(M, pm), mu = mn == ninf ? 0.0f : mn;\n"
    << in << "  float so = op_exp2((M - mu) * c_), sn = op_exp2((pm - mu) * c_);\n"
    << in << "  L = L * so + pl * sn;\n" << in << "  a = a * so + pa * sn;\n" << in << "  M = mn;\n" << in << "}\n";
  return t.str();
}

// A block's activation row quantised once into shared memory, for a group kernel whose operands are all Q8_0
// stored split (see group_kernel): xq_ holds its K quants, xd_ its K / 32 block scales, as q8_quantize8 makes them
// (the same bytes the dot loop would make per step, so the sums are unchanged). Each warp quantises 256 elements
// at a time; the block then waits for the whole row. `at` declares `oa`, where the row starts in the activations
// a_. With a prologue (`act`) the row is its k-wise part, computed here, and its row sums are added over the
// block, giving scale_ (declared before) for every warp.
std::string stage_row(DType as, int64_t K, const std::string& at, const ActRow* act) {
  std::string k = std::to_string(K);
  Text t;
  t << "  __shared__ __align__(16) u8 xq_[" << k << "];\n  __shared__ float xd_[" << std::to_string(K / 32) << "];\n";
  if (act) t << "  __shared__ float red_[32][" << int(act->sums.size()) << "];\n  float scale_;\n";
  t << "  {\n" << at << (act ? act->init : "") << "    for (i64 k0 = threadIdx.x * 8; k0 - (threadIdx.x & 31) * 8 < " << k
    << "; k0 += blockDim.x * 8) {\n      float a[8];\n      unsigned q[2];\n      float d;\n"
    << "      if (k0 < " << k << ") {\n"
    << (act ? act->load("k0", "a") : "        ld8_" + std::string(dtype_name(as)) + "(a_, oa + k0, a);\n")
    << "      } else {\n        for (int e = 0; e < 8; ++e) a[e] = 0.0f;\n      }\n"
    << "      q8_quantize8(a, q, d);  // (every lane: its shuffles need the warp)\n"
    << "      if (k0 < " << k << ") {\n        *(uint2*)(xq_ + k0) = make_uint2(q[0], q[1]);\n"
    << "        if ((threadIdx.x & 3) == 0) xd_[k0 >> 5] = d;\n      }\n    }\n";
  if (act) {
    for (size_t j = 0; j < act->sums.size(); ++j)
      t << "    { float w_ = warp_sum(s" << act->sums[j] << "_); if ((threadIdx.x & 31) == 0) red_[threadIdx.x >> 5]["
        << int(j) << "] = w_; }\n";
    t << "    __syncthreads();\n";
    for (size_t j = 0; j < act->sums.size(); ++j)
      t << "    float t" << int(j) << "_ = 0.0f;\n    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t" << int(j)
        << "_ += red_[w][" << int(j) << "];\n    float k" << act->sums[j] << " = rd_float32<float>(t" << int(j) << "_);\n";
    t << act->scalar << "    scale_ = " << act->scale << ";\n";
  }
  t << "  }\n  __syncthreads();\n";
  return t.str();
}

// dot_rows over activations stage_row left in shared memory: per step a lane's 16 quants of each operand (one
// 16-byte load) and its block's scale, against the row's 16 quants and scale, by four __dp4a. A step covers 512
// elements (K is a multiple of 32: a lane's quants never cross a block).
std::string dot_rows_staged(const std::vector<DotOperand>& ws, int U, const std::string& kb, const std::string& ke) {
  Text t;
  for (auto& w : ws) t << "    float " << w.acc << " = 0.0f;\n";
  auto step = [&](bool checked) {
    Text s;
    s << "      i64 k0 = k_ + lane * 16;\n      uint4 x_[" << U << "];\n      float dx_[" << U << "];\n";
    for (auto& w : ws) s << "      uint4 b_" << w.acc << "[" << U << "];\n      u16 d_" << w.acc << "[" << U << "];\n";
    s << "#pragma unroll\n      for (int u = 0; u < " << U << "; ++u) {\n";
    if (checked) s << "        if (k0 + u * 512 < " << ke << ") {\n";
    for (auto& w : ws)
      s << "          b_" << w.acc << "[u] = ld_stream16((const u8*)" << w.ptr << " + " << w.off << " + k0 + u * 512);\n"
        << "          d_" << w.acc << "[u] = __ldg((const u16*)((const u8*)" << w.ptr << " + " << w.soff
        << ") + ((k0 + u * 512) >> 5));\n";
    s << "          x_[u] = *(const uint4*)(xq_ + k0 + u * 512);\n          dx_[u] = xd_[(k0 + u * 512) >> 5];\n";
    if (checked) {
      s << "        } else {\n          x_[u] = make_uint4(0u, 0u, 0u, 0u);\n          dx_[u] = 0.0f;\n";
      for (auto& w : ws) s << "          b_" << w.acc << "[u] = make_uint4(0u, 0u, 0u, 0u);\n          d_" << w.acc << "[u] = 0;\n";
      s << "        }\n";
    }
    s << "      }\n#pragma unroll\n      for (int u = 0; u < " << U << "; ++u) {\n";
    for (auto& w : ws) {
      std::string b = "(int)b_" + w.acc + "[u].";
      s << "        " << w.acc << " += (float)__dp4a(" << b << "w, (int)x_[u].w, __dp4a(" << b << "z, (int)x_[u].z, __dp4a("
        << b << "y, (int)x_[u].y, __dp4a(" << b << "x, (int)x_[u].x, 0)))) * (f16_f32(d_" << w.acc << "[u]) * dx_[u]);\n";
    }
    s << "      }\n";
    return s.str();
  };
  return t.str() + dot_steps(ws, kb, ke, 512 * U, step);
}

std::string dot_rows_q8(DType as, const std::string& a, const std::string& oa, const std::vector<DotOperand>& ws, int U,
                        const ActRow* act, const std::string& kb, const std::string& ke, bool staged) {
  if (staged) return dot_rows_staged(ws, U, kb, ke);
  Text t;
  bool any_split = std::any_of(ws.begin(), ws.end(), [](const DotOperand& w) { return w.split(); });
  for (auto& w : ws) {
    t << "    float " << w.acc << " = 0.0f;\n";
    if (w.blocks())
      t << "    const u8* qb_" << w.acc << " = (const u8*)" << w.ptr << " + " << w.off
        << " + (lane >> 2) * 34 + (lane & 3) * 8;\n"
        << "    unsigned qs_" << w.acc << " = 8u * ((unsigned)(size_t)qb_" << w.acc << " & 2u), qh_" << w.acc
        << " = qs_" << w.acc << " ? 0x4432u : 0x4410u;  // (qh: the scale's bytes)\n"
        << "    qb_" << w.acc << " -= qs_" << w.acc << " / 8;\n";
  }
  auto step = [&](bool checked) {
    Text s;
    s << "      i64 k0 = k_ + lane * 8;\n      float a[" << U << "][8]";
    for (auto& w : ws)
      if (!w.q8) s << ", b_" << w.acc << "[" << U << "][8]";
    s << ";\n";
    for (auto& w : ws)
      if (w.blocks()) s << "      unsigned b_" << w.acc << "[" << U << "][3];\n";
      else if (w.q8) s << "      uint2 b_" << w.acc << "[" << U << "];\n      u16 d_" << w.acc << "[" << U << "];\n";
    s << "#pragma unroll\n      for (int u = 0; u < " << U << "; ++u) {\n";
    if (checked) s << "        if (k0 + u * 256 < " << ke << ") {\n";
    if (!act) s << "          ld8_" << dtype_name(as) << "(" << a << ", " << oa << " + k0 + u * 256, a[u]);\n";
    for (auto& w : ws) {
      if (w.split())  // (8 quants: one 8-byte load; the block's scale, the same for its 4 lanes)
        s << "          b_" << w.acc << "[u] = ld_stream8((const u8*)" << w.ptr << " + " << w.off << " + k0 + u * 256);\n"
          << "          d_" << w.acc << "[u] = __ldg((const u16*)((const u8*)" << w.ptr << " + " << w.soff
          << ") + ((k0 + u * 256) >> 5));\n";
      else if (w.q8)
        s << "          { const unsigned* q_ = (const unsigned*)(qb_" << w.acc << " + (k_ >> 5) * 34 + u * 272);\n"
          << "            b_" << w.acc << "[u][0] = __ldg(q_); b_" << w.acc << "[u][1] = __ldg(q_ + 1); b_" << w.acc
          << "[u][2] = __ldg(q_ + 2); }\n";
      else
        s << "          lds8_" << dtype_name(w.storage) << "(" << w.ptr << ", " << w.off << " + k0 + u * 256, b_" << w.acc
          << "[u]);\n";
    }
    if (act) s << act->load("k0 + u * 256", "a[u]");
    if (checked) {
      s << "        } else {\n          for (int e = 0; e < 8; ++e) a[u][e] = 0.0f;\n";
      for (auto& w : ws)
        if (w.split()) s << "          b_" << w.acc << "[u] = make_uint2(0u, 0u);\n          d_" << w.acc << "[u] = 0;\n";
        else if (w.q8) s << "          b_" << w.acc << "[u][0] = b_" << w.acc << "[u][1] = b_" << w.acc << "[u][2] = 0u;\n";
        else s << "          for (int e = 0; e < 8; ++e) b_" << w.acc << "[u][e] = 0.0f;\n";
      s << "        }\n";
    }
    s << "      }\n#pragma unroll\n      for (int u = 0; u < " << U << "; ++u) {\n";
    for (auto& w : ws)
      if (!w.q8) s << "        for (int e = 0; e < 8; ++e) " << w.acc << " += a[u][e] * b_" << w.acc << "[u][e];\n";
    // Split operands by __dp4a: the lane's 8 activations quantised as the CPU backend's decode does (q8_quantize),
    // their block of 32 over the lane's 4-lane group (every lane runs every step: the shuffles need the warp)
    if (any_split)
      s << "        { unsigned xq_[2]; float dx_;\n          q8_quantize8(a[u], xq_, dx_);\n";
    for (auto& w : ws)
      if (w.split())
        s << "          " << w.acc << " += (float)__dp4a((int)b_" << w.acc << "[u].y, (int)xq_[1], __dp4a((int)b_" << w.acc
          << "[u].x, (int)xq_[0], 0)) * (f16_f32(d_" << w.acc << "[u]) * dx_);\n";
    if (any_split) s << "        }\n";
    for (auto& w : ws) {
      if (!w.blocks()) continue;
      std::string b = "b_" + w.acc + "[u]", sh = "16u + qs_" + w.acc;
      // Each quant byte (XOR 0x80: q + 128) under the exponent bits of 2^23 is the float 2^23 + q + 128 (a byte
      // permute instead of an int-to-float conversion), less 2^23 + 128.
      s << "        { unsigned d_ = __shfl_sync(0xffffffffu, __byte_perm(" << b << "[0], 0u, qh_" << w.acc << "), lane & 28);\n"
        << "          unsigned q_[2] = {__funnelshift_rc(" << b << "[0], " << b << "[1], " << sh << ") ^ 0x80808080u, "
        << "__funnelshift_rc(" << b << "[1], " << b << "[2], " << sh << ") ^ 0x80808080u};\n"
        << "          float s_[2] = {0.0f, 0.0f};  // (two sums: shorter chains of dependent adds)\n"
        << "#pragma unroll\n          for (int e = 0; e < 8; ++e)\n"
        << "            s_[e & 1] += a[u][e] * (__uint_as_float(__byte_perm(q_[e >> 2], 0x4b000000u, 0x7440u + (e & 3))) - 8388736.0f);\n"
        << "          " << w.acc << " += f16_f32((u16)d_) * (s_[0] + s_[1]); }\n";
    }
    s << "      }\n";
    return s.str();
  };
  return t.str() + dot_steps(ws, kb, ke, 256 * U, step);
}

// The text of a matrix product's tiles over [batch..., M, N, K] (views 0 and 1 of a MatMul's parameter slice).
struct Tiles {
  ViewText a, b;
  std::vector<std::string> batch;
  std::string M, N, K;
  explicit Tiles(const Step& st) : a{st.views[0]}, b{st.views[1]} {
    int R = st.views[0].rank;
    batch = names("i", 0, R - 3);
    M = a.shape(R - 3), N = a.shape(R - 2), K = a.shape(R - 1);
  }
  // The offset of element (m, n, k) of the batch at i0.. through view v.
  std::string off(const ViewText& v, const std::string& m, const std::string& n, const std::string& k) const {
    std::vector<std::string> idx = batch;
    idx.insert(idx.end(), {m, n, k});
    return v.offset(idx);
  }
};

// The row program as softmax(x): x an element-wise function of the scores (scale, additive mask), then
// exp2(c * (x - max x)) over its sum, c > 0 (what Tensor.softmax records). Such a program runs online (flash
// attention): a running max and sum, rescaled as tiles of keys arrive, so the scores are never kept.
// FlashWgmma's ring: stages of a K and a V tile (64 keys x 128 16-bit values each).
constexpr int kFlashWgmmaStages = 4;
// The attention kernels' tensor-core product C += A B (mma.sync m16n8k16, 16-bit operands of type `ct`, float32
// accumulators): C a float[4], A an unsigned[4], B0 and B1 in scope.
std::string mma_16816(const std::string& ct) {
  return "asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32." + ct + "." + ct +
         ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\" : \"+f\"(C[0]), \"+f\"(C[1]), "
         "\"+f\"(C[2]), \"+f\"(C[3]) : \"r\"(A[0]), \"r\"(A[1]), \"r\"(A[2]), \"r\"(A[3]), \"r\"(B0), \"r\"(B1));";
}
// The text the two tensor-core attention kernels share (Generator::flash_text).
struct FlashText {
  std::string mma, rows, qf, at, store;
  std::vector<std::string> idx;
};

struct SoftmaxForm {
  int x = -1;    // the register holding x
  double c = 1;  // exp2's scale
};
std::optional<SoftmaxForm> softmax_form(const Program& pr) {
  const std::vector<Instr>& c = pr.code;
  if (pr.reduce != Op::Input || c.empty()) return std::nullopt;
  auto apply = [&](int r, Op op) {
    return r >= 0 && c[size_t(r)].kind == Instr::Apply && c[size_t(r)].op == op && c[size_t(r)].dtype == DType::F32;
  };
  auto reduce = [&](int r, Op op, int of) {
    return r >= 0 && c[size_t(r)].kind == Instr::Reduce && c[size_t(r)].op == op && c[size_t(r)].a == of;
  };
  // A binary step with an immediate operand: the other operand and the immediate.
  auto with_imm = [&](int r, int* other, double* v) {
    const Instr& in = c[size_t(r)];
    for (int side = 0; side < 2; ++side) {
      int a = side ? in.b : in.a, b = side ? in.a : in.b;
      if (b >= 0 && c[size_t(b)].kind == Instr::Imm) {
        *other = a;
        *v = c[size_t(b)].imm;
        return true;
      }
    }
    return false;
  };
  int out = int(c.size()) - 1, e = -1;
  if (!apply(out, Op::Mul)) return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    int a = side ? c[size_t(out)].b : c[size_t(out)].a, r = side ? c[size_t(out)].a : c[size_t(out)].b;
    if (apply(r, Op::Recip) && reduce(c[size_t(r)].a, Op::SumReduce, a)) e = a;
  }
  if (!apply(e, Op::Exp2)) return std::nullopt;
  int t = c[size_t(e)].a;
  double k = 1;
  if (apply(t, Op::Mul)) {
    int o = -1;
    if (!with_imm(t, &o, &k) || !(k > 0)) return std::nullopt;
    t = o;
  }
  if (!apply(t, Op::Add)) return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    int x = side ? c[size_t(t)].b : c[size_t(t)].a, nm = side ? c[size_t(t)].a : c[size_t(t)].b, m = -1;
    double neg = 0;
    if (!apply(nm, Op::Mul) || !with_imm(nm, &m, &neg) || neg != -1 || !reduce(m, Op::MaxReduce, x)) continue;
    std::vector<char> need = pr.needed_for(size_t(x));
    bool elementwise = true;
    for (size_t i = 0; i < c.size(); ++i) elementwise = elementwise && !(need[i] && c[i].kind == Instr::Reduce);
    if (elementwise) return SoftmaxForm{x, k};
  }
  return std::nullopt;
}

class Generator {
 public:
  Generator(const Graph& g, DType compute, bool host_fallback)
      : g_(g), compute_(compute), host_fallback_(host_fallback) {}

  Module run();

 private:
  const Graph& g_;
  DType compute_;
  bool host_fallback_;
  // LUMINAL_CUDA_Q8_PAIRS=0: a group kernel's warp computes one row of a Q8_0 member, not two (comparison)
  bool q8_pairs_ = env_int("LUMINAL_CUDA_Q8_PAIRS", 1) != 0;
  // LUMINAL_CUDA_FLOAT_PAIRS=1: float members' rows in pairs too (see paired; to compare)
  bool float_pairs_ = env_int("LUMINAL_CUDA_FLOAT_PAIRS", 0) == 1;
  std::vector<char> split_;       // per node: a Q8_0 weight input stored split (choose_q8_split)
  void choose_q8_split();
  void drop_prologues();
  // Whether QMatMul n reads its weights split (all of them, or none: see choose_q8_split)
  bool split_q8(const Node& n) const { return n.inputs.size() > 1 && split_[size_t(n.inputs[1].node)]; }
  // A split Q8_0 weight's row `row` (view bv, K = `K`): "<q> = <first quant's byte>, <s> = <first scale's byte>"
  static std::string split_offsets(const ViewSlot& bv, const std::string& row, const std::string& K,
                                   const std::string& q, const std::string& s) {
    return q + " = " + row + " * " + K + ", " + s + " = " + ViewText{bv}.shape(0) + " * " + K + " + " + row + " * (" +
           K + " / 16)";
  }
  std::vector<char> last_pairs_;  // the last group kernel's units: whether a warp computes two rows
  int last_split_ = 1;            // and its warps per row (group_split)
  int64_t last_stage_ = 0;        // and the row length it stages in shared memory (group_stage), or 0
  // Elements an element-wise loop's thread takes along the innermost axis (element_loop): 0, 16 bytes of its output
  // (at most 8); LUMINAL_CUDA_ELEMENTS=1|2|4|8 to compare.
  int elements_ = elements_per_thread();
  static int elements_per_thread() {
    const char* e = std::getenv("LUMINAL_CUDA_ELEMENTS");
    if (!e || !*e) return 0;
    std::string v = e;
    if (v != "1" && v != "2" && v != "4" && v != "8")
      throw std::invalid_argument("LUMINAL_CUDA_ELEMENTS must be 1, 2, 4 or 8, got '" + v + "'");
    return std::stoi(v);
  }
  // Kernels copy their parameter slice into shared memory first (add_kernel, batch_kernel), before waiting for
  // the kernels before: the host wrote it before the step began, and latency-bound kernels read parameters one
  // after another, between branches, where each global load would be a round trip. LUMINAL_CUDA_STAGE_PARAMS=0:
  // read in place (to compare).
  bool stage_params_ = env_int("LUMINAL_CUDA_STAGE_PARAMS", 1) != 0;
  // Blocks of 256 threads a matrix-vector group's kernel fits a multiprocessor (its launch bounds, where no
  // prologue is in its dot loop; Module::group_blocks): LUMINAL_CUDA_GROUP_BLOCKS, 2 by default.
  int group_blocks_ = std::max(1, env_int("LUMINAL_CUDA_GROUP_BLOCKS", 2));
  Module mod_;
  std::map<std::string, std::string> bodies_;  // body text -> function name (identical kernels share one)
  std::string fns_;
  // Grid-stride kernels by name: the body of their loop over t and the parameter slot counting its items (what a
  // batch's kernel is made of).
  struct Loop {
    std::string body;
    int count = 1;
    int per = 1;  // elements per item: the body's t counts groups of `per` (element_loop)
    std::vector<std::string> args;  // the pointers after `out`, as the body names them (Q...: a parameter slice)
    int slots = 0, q_slots = 0;     // the sizes of the parameter slices p and Q (a batch copies them, batch_kernel)
  };
  std::map<std::string, Loop> loops_;
  std::string loop_kernel(const Loop& l);  // the kernel of one loop (added; returns its name)
  static std::string items(const Loop& l, const std::string& p) {  // its items, from parameter slice p
    std::string c = p + "[" + std::to_string(l.count) + "]";
    return l.per == 1 ? c : "(" + c + " + " + std::to_string(l.per - 1) + ") / " + std::to_string(l.per);
  }

  DType storage(int64_t id) const { return mod_.sched.storage[size_t(id)]; }

  // Adds a kernel whose text uses NAME for its function name; returns the name it gets. With `slots` (the size of
  // its parameter slice p), the slice is first copied into shared memory (stage_params_), unless the kernel places
  // pdl_start itself.
  std::string add_kernel(const std::string& text, int slots = 0) {
    auto it = bodies_.find(text);
    if (it != bodies_.end()) return it->second;
    std::string name = "k" + std::to_string(bodies_.size());
    bodies_[text] = name;
    std::string t = text;
    size_t at = t.find("NAME");
    t.replace(at, 4, name);
    size_t body = t.find(") {\n", at);
    if (body == std::string::npos) throw std::logic_error("CUDA codegen: a kernel without a body");
    const std::string arg = "(const i64* __restrict__ p, ";
    bool placed = t.find("pdl_start();") != std::string::npos;
    if (slots > 0 && stage_params_ && !placed && t.compare(at + name.size(), arg.size(), arg) == 0) {
      t.replace(at + name.size(), arg.size(), "(const i64* __restrict__ pg_, ");
      body += 3;  // ("pg_" for "p")
      std::string n = std::to_string(slots);
      t.insert(body + 4, "  __shared__ i64 ps_[" + n + "];\n  for (int i = threadIdx.x; i < " + n +
                             "; i += blockDim.x) ps_[i] = pg_[i];\n  __syncthreads();\n  pdl_start();\n" +
                             "  const i64* p = ps_;\n");
    }
    // first, in every kernel (see the prelude), unless it places it itself (q8_dp4a: L2 prefetches before it)
    if (t.find("pdl_start();") == std::string::npos) t.insert(body + 4, "  pdl_start();\n");
    fns_ += t + "\n";
    mod_.kernels.emplace_back(name, t);
    return name;
  }

  // Lays out views after the 4 header slots (node id, work items, length, extra).
  static void layout(Step& st) {
    int base = 4;
    for (auto& v : st.views) {
      v.base = base;
      base += v.slots();
    }
    st.nparams = base;
  }

  ViewSlot slot(const Node& n, int edge, std::vector<int> perm = {}) {
    ViewSlot s;
    s.edge = edge;
    s.perm = std::move(perm);
    s.rank = int(n.inputs[edge].view.rank());
    s.masked = n.inputs[edge].view.has_mask();
    return s;
  }

  bool double_registers(const Program& prog, const Node& n) const;
  std::string program_body(const Program& prog, const Step& st, const Node& n, const std::string& T, bool dbl,
                           const std::vector<std::string>& idx, const std::vector<char>& need, size_t skip,
                           const std::map<int, std::string>& given = {}) const;
  std::string program_kernel(const Program& prog, const Step& st, const Node& n, bool block_per_row = false);
  std::string program_at(const Program& prog, const Step& st, const Node& n, const std::string& t) const;
  std::pair<std::string, int> element_loop(const Program& prog, const Step& st, const Node& n) const;
  int group_elements(const Node& n) const;
  std::string group_loads(const Program& prog, const std::vector<char>& need, const Step& st, const Node& n,
                          const std::string& T, const std::vector<std::string>& idx, int V,
                          std::map<int, std::string>& given) const;
  std::string row_pass(const Program& prog, const Step& st, const Node& n, const std::string& T, bool dbl,
                       const std::vector<char>& need, size_t skip, const std::string& each, const std::string& each_tail,
                       const std::string& post) const;
  std::string row_kernel(const Program& prog, const Step& st, const Node& n, const std::string& T, bool dbl) const;
  void program_step(const luminal::Step& cs, Step& st, const Node& n);
  void gather_step(Step& st, const Node& n);
  void scatter_step(Step& st, const Node& n, const luminal::Step* producer, const Step* pk);
  void qmatmul_step(Step& st, const Node& n, int block_bytes);
  void contraction_step(Step& st, const Node& n, int axes);
  std::string q8_row(const Step& st, int S, const std::string& nn, const std::string& ptr,
                     const std::string& sptr = "") const;
  std::string q8_matvec(const Step& st, const Node& n, int S, bool split);
  std::string q8_mma(const Step& st, const Node& n, int S, bool split);
  std::string q8_quantize(const Step& st, const Node& n);
  std::string q8_dp4a(const Step& st, const Node& n, int S, bool split);
  void matmul_fast_kernels(const Node& n, Step& st);
  std::string mma_kernel(const Node& n, const Step& st);
  Variant gemm_kernel(const Node& n, const Step& st, Variant::Kind kind);
  std::string batch_kernel(const Group& G);
  template <class Members, class Epilogue>
  std::string group_kernel(size_t nunits, const Members& members_of, const Epilogue& epilogue_of, long prologue = -1);
  bool paired(const std::vector<size_t>& ms) const;
  template <class Members>
  int group_split(size_t nunits, const Members& members_of, bool whole_rows) const;
  template <class Members>
  int64_t group_stage(size_t nunits, const Members& members_of) const;
  ActRow group_prologue(size_t step);
  void dequant_step(Step& st, const Node& n, int block_bytes);
  void attention_step(Step& st, const Node& n);
  std::string flash_mma(const Step& st, const Node& n, const Step& ps, const Node& pn, const SoftmaxForm& sm,
                        const std::string& aliases, const std::vector<std::string>& args, int DH);
  std::string flash_tiles(Step& st, const Node& n, const Step& ps, const Node& pn, const SoftmaxForm& sm,
                          const std::string& aliases, const std::vector<std::string>& args, int DH, bool wg);
  std::string mask_summary(const ViewSlot& mv, DType dtype, const std::string& aliases,
                           const std::vector<std::string>& args, const std::string& in);
  FlashText flash_text(const Step& st, const Node& n, int DH,
                       const std::function<std::string(const std::string&)>& row_extra) const;
  // The attention kernels' load of edge e's element as float, up to its offset: "(float)ld_<storage>(e<e>, "
  std::string edge_load(const Node& n, int e) const {
    return "(float)ld_" + std::string(dtype_name(storage(n.inputs[size_t(e)].node))) + "(e" + std::to_string(e) + ", ";
  }
};

// Registers are float unless a value may be an integer float cannot hold exactly.
bool Generator::double_registers(const Program& prog, const Node& n) const {
  bool dbl = is_int(n.dtype);
  for (auto& in : prog.code) {
    if (is_int(in.dtype)) dbl = true;
    if (in.kind == Instr::Load && is_int(storage(n.inputs[in.input].node))) dbl = true;
    if (in.kind == Instr::Imm && double(float(in.imm)) != in.imm && !std::isnan(in.imm)) dbl = true;
  }
  return dbl;
}

// The statements computing the needed registers of `prog` at element `idx` (a Reduce step not computed here reads
// its row's value, `k<i>`, known by then). `given`: input edges whose value is already in a variable (a
// matrix-vector epilogue's accumulators), used instead of a load.
std::string Generator::program_body(const Program& prog, const Step& st, const Node& n, const std::string& T, bool dbl,
                                    const std::vector<std::string>& idx, const std::vector<char>& need, size_t skip,
                                    const std::map<int, std::string>& given) const {
  Text body;
  for (size_t i = 0; i < prog.code.size(); ++i) {
    if (!need[i] || i == skip) continue;
    const Instr& in = prog.code[i];
    std::string r = "r" + std::to_string(i);
    body << "    " << T << " " << r << ";\n";
    if (in.kind == Instr::Load) {
      auto g = given.find(in.input);
      if (g != given.end()) body << "    " << r << " = (" << T << ")" << g->second << ";\n";
      else body << load(st.views[in.input], idx, "in" + std::to_string(in.input), storage(n.inputs[in.input].node), T, r);
      continue;
    }
    if (in.kind == Instr::Imm) {
      body << "    " << r << " = " << lit(in.imm, !dbl) << ";\n";
      continue;
    }
    if (in.kind == Instr::Reduce) {
      body << "    " << r << " = k" << int(i) << ";\n";
      continue;
    }
    std::string a = "r" + std::to_string(in.a), b = in.b >= 0 ? "r" + std::to_string(in.b) : "";
    std::string e;
    switch (in.op) {
      case Op::Log2: e = "op_log2(" + a + ")"; break;
      case Op::Exp2: e = "op_exp2(" + a + ")"; break;
      case Op::Sin: e = "op_sin(" + a + ")"; break;
      case Op::Sqrt: e = "op_sqrt(" + a + ")"; break;
      case Op::Recip: e = "(" + T + ")1 / " + a; break;
      case Op::Add: e = a + " + " + b; break;
      // Rounded on its own, as every primop is: NVRTC would otherwise contract a product and a following sum into
      // one fma, whose single rounding moves results that feed floor() (nearest-neighbour indices).
      case Op::Mul: e = (T == "double" ? "__dmul_rn(" : "__fmul_rn(") + a + ", " + b + ")"; break;
      case Op::Mod: e = "op_mod(" + a + ", " + b + ")"; break;
      case Op::LessThan: e = "(" + a + " < " + b + ") ? (" + T + ")1 : (" + T + ")0"; break;
      case Op::MaxReduce: e = "op_max(" + a + ", " + b + ")"; break;  // binary max: NaN wins, a on ties
      default: e = a; break;  // Cast / copy: the rounding does the work
    }
    body << "    " << r << " = rd_" << dtype_name(in.dtype) << "<" << T << ">(" << e << ");\n";
  }
  return body.str();
}

std::string Generator::loop_kernel(const Loop& l) {
  Text k;
  k << "extern \"C\" __global__ void NAME" << params(l.args) << " {\n"
    << "  for (i64 t = blockIdx.x * (i64)blockDim.x + threadIdx.x; t < " << items(l, "p")
    << "; t += (i64)gridDim.x * blockDim.x) {\n" << l.body << "  }\n}\n";
  std::string name = add_kernel(k.str(), l.slots);
  loops_[name] = l;
  return name;
}

// The statements computing every register of an element-wise program at its element `t` (a flat index).
std::string Generator::program_at(const Program& prog, const Step& st, const Node& n, const std::string& t) const {
  bool dbl = double_registers(prog, n);
  int R = st.views.empty() ? 0 : st.views[0].rank;
  return (R ? unravel(st.views[0], 0, R, t) : std::string()) +
         program_body(prog, st, n, dbl ? "double" : "float", dbl, names("i", 0, R), std::vector<char>(prog.code.size(), 1),
                      size_t(-1));
}

// The body of an element-wise program's loop (see loop_kernel), and its elements per item (Loop::per). Item t is
// elements t * V.. in order, V = elements_ or else 16 bytes of the output (at most 8): its index unravelled once.
// Where the V stay in one row (almost always), every input's V elements are loaded first, by one vector load where
// the view's row is contiguous and aligned, so that all the item's loads are in flight together; then the program
// runs at each and one vector store writes the results. Otherwise (a group crossing a row's end, the last item)
// the index is stepped element by element in a rolled loop.
// The loads of a group of V consecutive elements along the innermost axis (index `idx`, its last at the group's
// first element) of every input the instructions in `need` read: into arrays L<input>_ (`given` maps each input to
// its element e_), by one ldv per view (vector loads where the row is contiguous and aligned), or element by element
// with bounds checks for padded views. All of a group's loads are issued before any of its arithmetic.
std::string Generator::group_loads(const Program& prog, const std::vector<char>& need, const Step& st, const Node& n,
                                   const std::string& T, const std::vector<std::string>& idx, int V,
                                   std::map<int, std::string>& given) const {
  Text b;
  std::string Vs = std::to_string(V), last = idx.back();
  for (size_t i = 0; i < prog.code.size(); ++i) {
    const Instr& in = prog.code[i];
    if (!need[i] || in.kind != Instr::Load || given.count(in.input)) continue;
    const ViewSlot& vs = st.views[size_t(in.input)];
    std::string L = "L" + std::to_string(in.input) + "_", src = "in" + std::to_string(in.input);
    DType sd = storage(n.inputs[size_t(in.input)].node);
    b << "    " << T << " " << L << "[" << Vs << "];\n";
    if (!vs.masked) {
      b << "    ldv_" << dtype_name(sd) << "<" << Vs << ">(" << src << ", " << ViewText{vs}.offset(idx) << ", "
        << ViewText{vs}.stride(int(idx.size()) - 1) << ", " << L << ");\n";
    } else {
      for (int e = 0; e < V; ++e) {
        std::vector<std::string> ie = idx;
        ie.back() = "(" + last + " + " + std::to_string(e) + ")";
        b << load(vs, ie, src, sd, T, L + "[" + std::to_string(e) + "]");
      }
    }
    given[in.input] = L + "[e_]";
  }
  return b.str();
}

int Generator::group_elements(const Node& n) const {
  return elements_ ? elements_ : std::min(8, int(16 / dtype_size(n.dtype)));
}

// The body of an element-wise program's loop (see loop_kernel), and its elements per item (Loop::per). Item t is
// elements t * V.. in order (V: group_elements): its index unravelled once. Where the V stay in one row (almost
// always), the group's loads go first (group_loads), then the program runs at each and one vector store writes the
// results. Otherwise (a group crossing a row's end, the last item) the index is stepped element by element in a
// rolled loop.
std::pair<std::string, int> Generator::element_loop(const Program& prog, const Step& st, const Node& n) const {
  std::string res = "r" + std::to_string(prog.code.size() - 1), st_fn = "st_" + std::string(dtype_name(n.dtype));
  int R = st.views.empty() ? 0 : st.views[0].rank;
  const int V = group_elements(n);
  if (R == 0 || V == 1) return {program_at(prog, st, n, "t") + "    " + st_fn + "(out, t, " + res + ");\n", 1};
  bool dbl = double_registers(prog, n);
  std::string Vs = std::to_string(V), T = dbl ? "double" : "float";
  ViewText v0{st.views[0]};
  std::vector<std::string> idx = names("i", 0, R);
  std::vector<char> all(prog.code.size(), 1);
  std::map<int, std::string> given;
  Text b;
  b << "    i64 t0_ = t * " << Vs << ";\n" << unravel(st.views[0], 0, R, "t0_")
    << "    if (t0_ + " << Vs << " <= p[1] && " << idx.back() << " + " << Vs << " <= " << v0.shape(R - 1) << ") {\n"
    << group_loads(prog, all, st, n, T, idx, V, given)
    << "    " << T << " v_[" << Vs << "];\n#pragma unroll\n    for (int e_ = 0; e_ < " << Vs << "; ++e_) {\n"
    << program_body(prog, st, n, T, dbl, idx, all, size_t(-1), given) << "    v_[e_] = " << res << ";\n    }\n"
    << "    stv_" << dtype_name(n.dtype) << "<" << Vs << ">(out, t0_, v_);\n"
    << "    } else {\n#pragma unroll 1\n    for (int e_ = 0; e_ < " << Vs << " && t0_ + e_ < p[1]; ++e_) {\n"
    << "    if (e_) {  // (the next element's index: a step, not a second unravel)\n";
  for (int d = R - 1; d >= 0; --d) {
    std::string I = "i" + std::to_string(d);
    b << "    ++" << I << ";\n";
    if (d > 0) b << "    if (" << I << " == " << v0.shape(d) << ") {\n    " << I << " = 0;\n";
  }
  for (int d = 1; d < R; ++d) b << "    }\n";
  b << "    }\n" << program_body(prog, st, n, T, dbl, idx, all, size_t(-1))
    << "    " << st_fn << "(out, t0_ + e_, " << res << ");\n    }\n    }\n";
  return {b.str(), V};
}

// One pass of a row program over row `row` (i<R-1> over p[2]) by the block's threads, a group of V consecutive
// elements each (group_loads first): `each` after the instructions in `need` at every element (the tail's
// elements one by one), `post` after a whole group's (with g_ its first element).
std::string Generator::row_pass(const Program& prog, const Step& st, const Node& n, const std::string& T, bool dbl,
                                const std::vector<char>& need, size_t skip, const std::string& each,
                                const std::string& each_tail, const std::string& post) const {
  int R = st.views[0].rank, V = group_elements(n);
  std::vector<std::string> idx = names("i", 0, R);
  std::string j = idx.back(), Vs = std::to_string(V);
  std::vector<char> nd = need;
  if (skip < nd.size()) nd[skip] = 0;
  std::map<int, std::string> given;
  Text k;
  k << "    for (i64 g_ = threadIdx.x * " << Vs << "; g_ < p[2]; g_ += blockDim.x * " << Vs << ") {\n"
    << "    if (g_ + " << Vs << " <= p[2]) {\n    i64 " << j << " = g_;\n"
    << group_loads(prog, nd, st, n, T, idx, V, given)
    << "#pragma unroll\n    for (int e_ = 0; e_ < " << Vs << "; ++e_) {\n"
    << program_body(prog, st, n, T, dbl, idx, need, skip, given) << each << "    }\n" << post
    << "    } else {\n    for (i64 " << j << " = g_; " << j << " < p[2]; ++" << j << ") {\n"
    << program_body(prog, st, n, T, dbl, idx, need, skip) << each_tail << "    }\n    }\n    }\n";
  return k.str();
}

// A program ending in a reduction: a warp per output row; or a block per row (with row reductions, or for few long
// rows).
std::string Generator::program_kernel(const Program& prog, const Step& st, const Node& n, bool block_per_row) {
  bool reduce = prog.reduce != Op::Input;
  bool dbl = double_registers(prog, n);
  std::string T = dbl ? "double" : "float";
  int R = st.views.empty() ? 0 : st.views[0].rank;
  std::vector<std::string> idx = names("i", 0, R);
  auto body_of = [&](const std::vector<char>& need, size_t skip) {
    return program_body(prog, st, n, T, dbl, idx, need, skip);
  };
  if (block_per_row || prog.has_row_reductions()) return row_kernel(prog, st, n, T, dbl);
  Text body;
  body << body_of(std::vector<char>(prog.code.size(), 1), size_t(-1));
  std::string res = "r" + std::to_string(prog.code.size() - 1);
  std::string st_fn = std::string("st_") + dtype_name(n.dtype);
  if (!reduce) throw std::logic_error("CUDA codegen: an element-wise program is a loop (element_loop)");
  Text k;
  k << "extern \"C\" __global__ void NAME" << params(int(n.inputs.size())) << " {\n";
  bool sum = prog.reduce == Op::SumReduce;
  std::string init = sum ? "(" + T + ")0" : lit(-INFINITY, !dbl);
  std::string combine = sum ? "acc + " + res : "op_max(acc, " + res + ")", wred = sum ? "warp_sum(acc)" : "warp_max(acc)";
  // One warp per output row: lanes stride over the reduced (last) axis, then combine by shuffles.
  k << "  int lane = threadIdx.x & 31;\n"
    << "  i64 nw = ((i64)gridDim.x * blockDim.x) >> 5;\n"
    << "  for (i64 row = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5; row < p[1]; row += nw) {\n";
  if (R > 1) k << unravel(st.views[0], 0, R - 1, "row");
  k << "    " << T << " acc = " << init << ";\n"
    << "    for (i64 i" << R - 1 << " = lane; i" << R - 1 << " < p[2]; i" << R - 1 << " += 32) {\n"
    << body.str() << "    acc = " << combine << ";\n    }\n"
    << "    acc = " << wred << ";\n"
    << "    if (lane == 0) " << st_fn << "(out, row, acc);\n  }\n}\n";
  return k.str();
}

// A program with row reductions (RMSNorm, softmax): a block per row. Each Reduce step is a pass over the row by the
// block's threads (evaluating only what it needs, from the loads: values are recomputed, not kept) ending in a
// block-wide sum or max that every thread receives; the last pass computes the output (stored per element, or
// reduced once more when the program ends in a reduction). p[1]: rows, p[2]: row length.
std::string Generator::row_kernel(const Program& prog, const Step& st, const Node& n, const std::string& T,
                                  bool dbl) const {
  int R = st.views[0].rank;
  if (R < 1) throw std::logic_error("CUDA codegen: a row reduction over a rank-0 iteration space");
  std::string st_fn = std::string("st_") + dtype_name(n.dtype), V = std::to_string(group_elements(n));
  auto init = [&](Op op) { return op == Op::SumReduce ? "(" + T + ")0" : lit(-INFINITY, !dbl); };
  auto combine = [&](Op op, const std::string& x) {
    return "    acc = " + (op == Op::SumReduce ? "acc + " + x : "op_max(acc, " + x + ")") + ";\n";
  };
  Text k;
  k << "extern \"C\" __global__ __launch_bounds__(1024) void NAME" << params(int(n.inputs.size())) << " {\n"
    << "  __shared__ " << T << " part[32];\n"
    << "  for (i64 row = blockIdx.x; row < p[1]; row += gridDim.x) {\n";
  if (R > 1) k << unravel(st.views[0], 0, R - 1, "row");
  // Each Reduce step: a pass ending in a block-wide sum or max (shared scratch `part`) that every thread receives
  // as k<i>.
  for (size_t i = 0; i < prog.code.size(); ++i) {
    const Instr& in = prog.code[i];
    if (in.kind != Instr::Reduce) continue;
    std::string c = combine(in.op, "r" + std::to_string(in.a));
    k << "    " << T << " k" << int(i) << ";\n    {\n    " << T << " acc = " << init(in.op) << ";\n"
      << row_pass(prog, st, n, T, dbl, prog.needed_for(i), i, c, c, "")
      << "    k" << int(i) << " = rd_" << dtype_name(in.dtype) << "<" << T << ">(block_reduce(acc, "
      << (in.op == Op::SumReduce ? "true" : "false") << ", part));\n    }\n";
  }
  size_t last = prog.code.size() - 1;
  std::string res = "r" + std::to_string(last);
  if (prog.reduce == Op::Input) {
    k << "    {\n    " << T << " v_[" << V << "];\n"
      << row_pass(prog, st, n, T, dbl, prog.needed_for(last), size_t(-1), "    v_[e_] = " + res + ";\n",
                  "    " + st_fn + "(out, row * p[2] + i" + std::to_string(R - 1) + ", " + res + ");\n",
                  "    stv_" + std::string(dtype_name(n.dtype)) + "<" + V + ">(out, row * p[2] + g_, v_);\n")
      << "    }\n";
  } else {
    std::string c = combine(prog.reduce, res);
    k << "    {\n    " << T << " acc = " << init(prog.reduce) << ";\n"
      << row_pass(prog, st, n, T, dbl, prog.needed_for(last), size_t(-1), c, c, "")
      << "    acc = block_reduce(acc, " << (prog.reduce == Op::SumReduce ? "true" : "false") << ", part);\n"
      << "    if (threadIdx.x == 0) " << st_fn << "(out, row, acc);\n    }\n";
  }
  k << "  }\n}\n";
  return k.str();
}

// An element-wise program is a loop over its elements; one ending in a reduction runs a warp per output row, or a
// block per row for few long rows; one with row reductions always a block per row.
void Generator::program_step(const luminal::Step& cs, Step& st, const Node& n) {
  const Program& prog = *cs.program;
  for (size_t k = 0; k < n.inputs.size(); ++k) st.views.push_back(slot(n, int(k), cs.perm));
  layout(st);
  if (prog.has_row_reductions()) {
    st.variants = {{Variant::BlockPerRow, add_kernel(program_kernel(prog, st, n), st.nparams)}};
  } else if (prog.reduce != Op::Input) {  // (a matrix-vector MatMul takes its own kernels for few long rows)
    if (!cs.matvec)
      st.variants.push_back({Variant::BlockPerRow, add_kernel(program_kernel(prog, st, n, true), st.nparams)});
    st.variants.push_back({Variant::Warps, add_kernel(program_kernel(prog, st, n), st.nparams)});
  } else {
    Loop l;
    std::tie(l.body, l.per) = element_loop(prog, st, n);
    l.args = input_names(int(n.inputs.size()));
    l.slots = st.nparams;
    st.variants = {{Variant::Elements, loop_kernel(l)}};
  }
}

void Generator::gather_step(Step& st, const Node& n) {
  st.views = {slot(n, 0), slot(n, 1)};  // table, index
  layout(st);
  const ViewSlot &tv = st.views[0], &iv = st.views[1];
  int Rt = tv.rank, Ri = iv.rank;
  DType ts = storage(n.inputs[0].node), is = storage(n.inputs[1].node);
  std::string T = is_int(ts) ? "double" : "float";
  Text k;
  k << "extern \"C\" __global__ void NAME" << params(2) << " {\n"
    << "  for (i64 t = blockIdx.x * (i64)blockDim.x + threadIdx.x; t < p[1]; t += (i64)gridDim.x * blockDim.x) {\n"
    << "    i64 q_ = t;\n";
  for (int d = Rt - 1; d >= 1; --d) k << divmod_dim(tv, d, "j" + std::to_string(d));
  k << unravel(iv, 0, Ri, "q_", "x") << "    double row;\n"
    << load(iv, names("x", 0, Ri), "in1", is, "double", "row")
    << "    if (!(row >= 0 && row < " << ViewText{tv}.shape(0) << ")) { fail(err, p, 2); " << "st_"
    << dtype_name(n.dtype) << "(out, t, 0.0f); continue; }\n"
    << "    i64 j0 = (i64)row;\n    " << T << " v;\n"
    << load(tv, names("j", 0, Rt), "in0", ts, T, "v") << "    st_" << dtype_name(n.dtype) << "(out, t, v);\n  }\n}\n";
  st.variants = {{Variant::Elements, add_kernel(k.str(), st.nparams)}};
}

// `producer`: the element-wise step computing the source (read as stored, by this Scatter only): the row writes
// evaluate its program instead of loading the source, through its own parameter slice and inputs (Q, J<k>).
void Generator::scatter_step(Step& st, const Node& n, const luminal::Step* producer, const Step* pk) {
  // First the destination is copied into the output (a one-load program), then the source rows are written.
  auto copy = std::make_shared<Program>();
  Instr ld{Instr::Load};
  ld.input = 0;
  ld.dtype = g_.node(n.inputs[0].node).dtype;
  copy->code.push_back(ld);
  st.views = {slot(n, 0), slot(n, 1), slot(n, 2)};  // dest, index, src
  layout(st);
  Loop cl;
  std::tie(cl.body, cl.per) = element_loop(*copy, st, n);
  cl.args = input_names(3);
  cl.slots = st.nparams;
  st.variants = {{Variant::Elements, loop_kernel(cl)}};
  const ViewSlot &dv = st.views[0], &iv = st.views[1], &sv = st.views[2];
  int R = dv.rank, Ri = iv.rank;
  DType ss = storage(n.inputs[2].node), is = storage(n.inputs[1].node);
  std::string T = is_int(ss) ? "double" : "float";
  // One element of the rows, t (< p[2]: index elements x row size; p[3]: row size; p[1] counts the copy's elements).
  Text k;
  k << "    i64 j = t % p[3], m = t / p[3];\n    i64 q_ = j;\n";
  for (int d = R - 1; d >= 1; --d) k << divmod_dim(dv, d, "s" + std::to_string(Ri + d - 1));
  k << unravel(iv, 0, Ri, "m", "s") << "    double row;\n"
    << load(iv, names("s", 0, Ri), "in1", is, "double", "row")
    << "    if (!(row >= 0 && row < " << ViewText{dv}.shape(0) << ")) { fail(err, p, 3); continue; }\n";
  Loop rows;
  rows.args = input_names(3);
  rows.slots = st.nparams;
  const Step* ps = producer ? pk : nullptr;
  const Node* pn = producer ? &g_.node(producer->node) : nullptr;
  if (producer) {
    rows.q_slots = ps->nparams;
    rows.args.push_back("Q");
    for (size_t q = 0; q < pn->inputs.size(); ++q) rows.args.push_back("J" + std::to_string(q));
  }
  // `one`: element t alone, the source's value at the s indices loaded, or the producer's program evaluated through
  // its own parameter slice (Q) and inputs (J<k>).
  auto producer_scope = [&]() {
    std::string o = "    const i64* p = Q;\n";
    for (size_t q = 0; q < pn->inputs.size(); ++q)
      o += "    const void* in" + std::to_string(q) + " = J" + std::to_string(q) + ";\n";
    return o;
  };
  std::vector<std::string> sidx = names("s", 0, sv.rank);
  std::string one = k.str() + "    " + T + " v;\n";
  if (!producer)
    one += load(sv, sidx, "in2", ss, T, "v");
  else
    one += "    { i64 ts_ = " + ViewText{sv}.offset(sidx) + ";\n" + producer_scope() +
           program_at(*producer->program, *ps, *pn, "ts_") + "    v = (" + T + ")r" +
           std::to_string(producer->program->code.size() - 1) + "; }\n";
  one += "    st_" + std::string(dtype_name(n.dtype)) + "(out, (i64)row * p[3] + j, v);\n";
  // Groups of V consecutive elements of a row (V as element loops take; rows and the destination's last dim
  // multiples of V): the row's index read once, the source's V values loaded first (group_loads, the producer's
  // program at V consecutive elements of its own rows), one vector store. Otherwise element by element.
  const int V = group_elements(n);
  std::string Vs = std::to_string(V), sl = "s" + std::to_string(sv.rank - 1);
  Text g;
  g << "    i64 t0_ = t * " << Vs << ";\n    bool grp_ = p[3] % " << Vs << " == 0 && t0_ + " << Vs << " <= p[2];\n"
    << "    " << T << " v_[" << Vs << "];\n    double row = 0.0;\n    i64 j = 0;\n    if (grp_) {\n"
    << "    i64 t = t0_;\n    j = t % p[3];\n    i64 m = t / p[3];\n    i64 q_ = j;\n";
  for (int d = R - 1; d >= 1; --d) g << divmod_dim(dv, d, "s" + std::to_string(Ri + d - 1));
  g << unravel(iv, 0, Ri, "m", "s") << load(iv, names("s", 0, Ri), "in1", is, "double", "row")
    << "    grp_ = row >= 0 && row < " << ViewText{dv}.shape(0) << " && " << sl << " + " << Vs << " <= "
    << ViewText{dv}.shape(R - 1) << ";\n";
  if (sv.masked) {  // (a padded source: element by element, each checked)
    g << "    grp_ = false;\n";
  } else if (!producer) {
    g << "    if (grp_) ldv_" << dtype_name(ss) << "<" << Vs << ">(in2, " << ViewText{sv}.offset(sidx) << ", "
      << ViewText{sv}.stride(sv.rank - 1) << ", v_);\n";
  } else {
    const Program& pp = *producer->program;
    int Rp = ps->views.empty() ? 0 : ps->views[0].rank;
    bool dbl = double_registers(pp, *pn);
    std::string PT = dbl ? "double" : "float";
    std::vector<char> all(pp.code.size(), 1);
    std::map<int, std::string> given;
    std::vector<std::string> idx = names("i", 0, Rp);
    if (Rp == 0) {
      g << "    grp_ = false;\n";
    } else {
      g << "    grp_ = grp_ && " << ViewText{sv}.stride(sv.rank - 1) << " == 1;\n    if (grp_) {\n    i64 ts_ = "
        << ViewText{sv}.offset(sidx) << ";\n" << producer_scope() << unravel(ps->views[0], 0, Rp, "ts_")
        << "    if (" << idx.back() << " + " << Vs << " <= " << ViewText{ps->views[0]}.shape(Rp - 1) << ") {\n"
        << group_loads(pp, all, *ps, *pn, PT, idx, V, given) << "#pragma unroll\n    for (int e_ = 0; e_ < " << Vs
        << "; ++e_) {\n" << program_body(pp, *ps, *pn, PT, dbl, idx, all, size_t(-1), given) << "    v_[e_] = ("
        << T << ")r" << int(pp.code.size() - 1) << ";\n    }\n    } else grp_ = false;\n    }\n";
    }
  }
  g << "    }\n    if (grp_) stv_" << dtype_name(n.dtype) << "<" << Vs << ">(out, (i64)row * p[3] + j, v_);\n"
    << "    else {\n#pragma unroll 1\n    for (int e_ = 0; e_ < " << Vs << " && t0_ + e_ < p[2]; ++e_) {\n"
    << "    i64 t = t0_ + e_;\n" << one << "    }\n    }\n";
  rows.body = g.str();
  rows.per = V;
  rows.count = 2;
  st.rows_fn = loop_kernel(rows);
}

// The MatMul's faster kernels; both use the generic kernel's parameter slice (views 0 and 1 of rank R).
void Generator::matmul_fast_kernels(const Node& n, Step& st) {
  const ViewSlot &av = st.views[0], &bv = st.views[1];
  int R = av.rank;
  DType as = storage(n.inputs[0].node), bs = storage(n.inputs[1].node);
  if (!is_float(as) || !is_float(bs) || !is_float(n.dtype) || av.masked || bv.masked || R < 1) return;
  std::string od = dtype_name(n.dtype), gemv;
  // Matrix-vector: a warp per output row. Memory-bound, so what counts is bytes in flight: each lane issues the
  // loads of 4 steps of 8 elements (16 bytes of a 2-byte type per operand) before the first multiply, and the
  // right operand (the weights of a Linear: read once, never again in this step) is streamed past L1
  // (ld.global.nc.L1::no_allocate) so that the activations, which every warp re-reads, stay there.
  {
    std::vector<std::string> idx = names("i", 0, R - 1);
    idx.push_back("0");
    gemv = add_kernel(warp_rows_kernel(av, as, {bs, "", "ob = " + ViewText{bv}.offset(idx), ""}, n.dtype));
  }
  auto finish = [&](std::vector<Variant> fast) {
    fast.push_back({Variant::MatVec, gemv});
    fast.push_back(st.variants.back());  // the generic warp per output
    st.variants = std::move(fast);
  };
  if (R < 3) return finish({});
  if (compute_ == DType::BF16 || compute_ == DType::F16) {
    std::vector<Variant> fast;
    // (empty: an operand stored in a 16-bit type other than the compute dtype; the older kernel converts it)
    Variant big = gemm_kernel(n, st, Variant::Gemm128), small = gemm_kernel(n, st, Variant::Gemm64);
    for (Variant::Kind k : {Variant::Wgmma256, Variant::Wgmma128})  // (an sm_90 device's: timed with the rest)
      if (Variant v = gemm_kernel(n, st, k); !v.fn.empty()) fast.push_back(v);
    if (!big.fn.empty()) fast.insert(fast.end(), {big, small});
    fast.push_back({Variant::Blas, ""});  // (after ours: with LUMINAL_CUDA_TUNE=0 the first that applies runs)
    fast.push_back({Variant::TensorCore, mma_kernel(n, st)});
    return finish(std::move(fast));
  }
  // Tiled matrix product over [batch..., M, N, K] where a does not depend on n nor b on m: 64 x 64 outputs per
  // block of 256 threads, 4 x 4 each, through shared-memory tiles of 16 along k (stored k-major).
  Text k;
  Tiles T(st);
  const ViewText &a = T.a, &b = T.b;
  const std::string &M = T.M, &N = T.N, &K = T.K;
  auto off = [&](const ViewText& v, const std::string& m, const std::string& nn, const std::string& kk) {
    return T.off(v, m, nn, kk);
  };
  k << "extern \"C\" __global__ __launch_bounds__(256) void NAME" << params(2) << " {\n"
    << "  __shared__ float As[16][68], Bs[16][68];\n"
    << "  i64 M = " << M << ", N = " << N << ", K = " << K << ";\n"
    << "  i64 m0 = (i64)blockIdx.y * 64, n0 = (i64)blockIdx.x * 64;\n"
    << unravel(av, 0, R - 3, "(i64)blockIdx.z")
    << "  int t = threadIdx.x, ty = t >> 4, tx = t & 15, lr = t >> 2, lk = (t & 3) * 4;\n"
    << "  float acc[4][4] = {};\n"
    << "  for (i64 k0 = 0; k0 < K; k0 += 16) {\n"
    << "    for (int j = 0; j < 4; ++j) {\n"
    << "      i64 kk = k0 + lk + j, m = m0 + lr, nn = n0 + lr;\n"
    << "      As[lk + j][lr] = (m < M && kk < K) ? (float)ld_" << dtype_name(as) << "(in0, " << off(a, "m", "0", "kk")
    << ") : 0.0f;\n"
    << "      Bs[lk + j][lr] = (nn < N && kk < K) ? (float)ld_" << dtype_name(bs) << "(in1, " << off(b, "0", "nn", "kk")
    << ") : 0.0f;\n    }\n"
    << "    __syncthreads();\n"
    << "#pragma unroll\n"
    << "    for (int kk = 0; kk < 16; ++kk) {\n"
    << "      float x[4], y[4];\n"
    << "      for (int i = 0; i < 4; ++i) { x[i] = As[kk][ty * 4 + i]; y[i] = Bs[kk][tx * 4 + i]; }\n"
    << "      for (int i = 0; i < 4; ++i)\n        for (int j = 0; j < 4; ++j) acc[i][j] += x[i] * y[j];\n    }\n"
    << "    __syncthreads();\n  }\n"
    << "  for (int i = 0; i < 4; ++i)\n    for (int j = 0; j < 4; ++j) {\n"
    << "      i64 m = m0 + ty * 4 + i, nn = n0 + tx * 4 + j;\n"
    << "      if (m < M && nn < N) st_" << od << "(out, ((i64)blockIdx.z * M + m) * N + nn, acc[i][j]);\n    }\n}\n";
  finish({{Variant::Tiled, add_kernel(k.str())}});
}

// The pipelined tensor-core GEMM (same parameter slice; the runtime runs it on 16-byte aligned rows, see
// applies()): BM x BN outputs per block of 8 warps, k in tiles of 32 or 64 through a ring of stages in dynamic
// shared memory (gemm_shape). An operand stored in the compute dtype is copied asynchronously (cp.async, 16 bytes,
// zero-filled past the edges); a float32 one is loaded into registers before the tile's products and rounded two
// floats per instruction into the ring after them, so its loads overlap the math too. Rows of 64 halves are 8
// chunks of 16 bytes, chunk c of row r stored at c ^ (r & 7) (rows of 32: 4 chunks, at c ^ ((r >> 1) & 3)): the 8
// rows an ldmatrix reads hit 8 distinct bank groups. The wgmma kinds (Hopper) keep the ring and its layout, which
// is the 128-byte swizzle their shared-memory descriptors name and the Tensor Memory Accelerator writes: a ninth
// warp has it copy the tiles, two warpgroups compute them (see below).
Variant Generator::gemm_kernel(const Node& n, const Step& st, Variant::Kind kind) {
  const ViewSlot& av = st.views[0];
  int R = av.rank;
  DType as = storage(n.inputs[0].node), bs = storage(n.inputs[1].node);
  auto raw = [&](DType d) { return d == compute_; };
  if ((!raw(as) && as != DType::F32) || (!raw(bs) && bs != DType::F32)) return {kind, ""};
  const bool wg = is_wgmma(kind);  // (Hopper's products read both operands from the ring: stored as computed)
  const bool tstore = wg && (n.dtype == DType::BF16 || n.dtype == DType::F16);  // (see the wgmma epilogue)
  if (wg && (!raw(as) || !raw(bs))) return {kind, ""};
  GemmShape G = gemm_shape(kind, !raw(as) || !raw(bs));
  const int BM = G.bm, BN = G.bn, BK = G.bk, S = G.stages, CH = BK / 8;
  const int WM = 2, WN = 4, TM = BM / WM, TN = BN / WN, MI = TM / 16, NJ = TN / 8;
  auto sw = [&](const std::string& r, const std::string& c) {
    std::string x = BK == 64 ? "(" + r + " & 7)" : "((" + r + " >> 1) & 3)";  // (rows of 128 or 64 bytes)
    return r + " * " + std::to_string(BK) + " + ((" + c + " ^ " + x + ") << 3)";
  };
  Tiles T(st);
  std::string ct = compute_ == DType::BF16 ? "bf16" : "f16", pk = "pack_" + std::string(dtype_name(compute_));
  std::string od = dtype_name(n.dtype);
  auto I = [](int v) { return std::to_string(v); };
  Text t;
  if (wg) {  // (the tensor maps of A, B and the output after the usual parameters)
    std::string ps = params(2);
    ps.pop_back();
    t << "extern \"C\" __global__ __launch_bounds__(288, 1) void NAME" << ps
      << ", const __grid_constant__ TmaMap ma, const __grid_constant__ TmaMap mb, const __grid_constant__ TmaMap mo) {\n";
  } else t << "extern \"C\" __global__ __launch_bounds__(256) void NAME" << params(2) << " {\n";
  if (wg)  // (the descriptors' swizzle repeats every 1024 bytes: each stage starts at such a boundary)
    t << "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n"
      << "  extern __shared__ __align__(1024) u16 smem_raw_[];\n"
      << "  u16* smem_ = smem_raw_ + ((1024 - (smem_u32(smem_raw_) & 1023)) & 1023) / 2;  // " << S
      << " stages of A's tile, then of B's\n";
  else t << "  extern __shared__ __align__(128) u16 smem_[];  // " << S << " stages of A's tile, then of B's\n";
  t << "  i64 M = " << T.M << ", N = " << T.N << ", K = " << T.K << ";\n"
    << (wg ? "" : "  i64 m0 = (i64)blockIdx.x * " + I(BM) + ", n0 = (i64)blockIdx.y * " + I(BN) + ";\n" +
                      unravel(av, 0, R - 3, "(i64)blockIdx.z"))
    << "  int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, "
    << (wg ? "" : "wm = w / " + I(WN) + ", wn = w % " + I(WN) + ", ") << "g = lane >> 2, q = (lane & 3) * 2;\n";
  // Staging (not wgmma's): chunk id = tid + 256 u of an operand's tile is row id / CH, k 8 (id % CH) .. + 8.
  const int LT = 256;
  auto stage_setup = [&](const char* x, const ViewText& v, DType d, int rows, bool is_a) {
    int U = rows * CH / LT;
    std::string X = x, in = is_a ? "in0" : "in1", r0 = is_a ? "m0" : "n0", lim = is_a ? "M" : "N";
    t << "  const char* g" << X << "[" << U << "]; bool r" << X << "[" << U << "]; int d" << X << "[" << U << "], c" << X
      << "[" << U << "];\n"
      << "  for (int u = 0; u < " << U << "; ++u) {\n"
      << "    int id = tid + " << LT << " * u, r = id / " << CH << ", c = id % " << CH << ";\n"
      << "    i64 row = " << r0 << " + r;\n"
      << "    r" << X << "[u] = row < " << lim << ";\n"
      << "    if (row >= " << lim << ") row = " << lim << " - 1;  // (a valid address; nothing is read)\n"
      << "    g" << X << "[u] = (const char*)" << in << " + (" << (is_a ? T.off(v, "row", "0", "0") : T.off(v, "0", "row", "0"))
      << " + c * 8) * " << (d == DType::F32 ? 4 : 2) << ";\n"
      << "    d" << X << "[u] = " << sw("r", "c") << ";\n    c" << X << "[u] = c * 8;\n  }\n";
    if (!raw(d)) t << "  float4 x" << X << "[" << U << "][2];\n";
  };
  if (!wg) {
    stage_setup("a", T.a, as, BM, true);
    stage_setup("b", T.b, bs, BN, false);
  }
  // (stage s of A's ring, or of B's)
  auto stage = [&](bool is_a, const std::string& s) {
    return "(smem_ + " + (is_a ? std::string() : std::to_string(S * BM * BK) + " + ") + s + " * " +
           std::to_string((is_a ? BM : BN) * BK) + ")";
  };
  // Issue tile kt's loads into stage s (cp.async, or float32 into registers); then round the registers into it.
  auto load = [&](const char* x, DType d, int rows, const char* ind) {
    int U = rows * CH / LT;
    std::string X = x, sm = stage(X == "a", "s");
    t << ind << "for (int u = 0; u < " << U << "; ++u) {\n"
      << ind << "  bool ok = r" << X << "[u] && k0 + c" << X << "[u] < K;\n";
    if (raw(d))
      t << ind << "  cp_async16(smem_u32(" << sm << " + d" << X << "[u]), g" << X << "[u] + k0 * 2, ok);\n";
    else
      t << ind << "  const float4* src = (const float4*)(g" << X << "[u] + k0 * 4);\n"
        << ind << "  x" << X << "[u][0] = ok ? src[0] : make_float4(0.f, 0.f, 0.f, 0.f);\n"
        << ind << "  x" << X << "[u][1] = ok ? src[1] : make_float4(0.f, 0.f, 0.f, 0.f);\n";
    t << ind << "}\n";
  };
  auto store = [&](const char* x, DType d, int rows, const char* ind) {
    if (raw(d)) return;
    int U = rows * CH / LT;
    std::string X = x, sm = stage(X == "a", "s");
    t << ind << "for (int u = 0; u < " << U << "; ++u) {\n"
      << ind << "  const float4 &l = x" << X << "[u][0], &h = x" << X << "[u][1];\n"
      << ind << "  *(uint4*)(" << sm << " + d" << X << "[u]) = make_uint4(" << pk << "(l.x, l.y), " << pk << "(l.z, l.w), "
      << pk << "(h.x, h.y), " << pk << "(h.z, h.w));\n"
      << ind << "}\n";
  };
  if (wg) {
    const int NR = BN / 2;  // (a warpgroup's m64 x BN accumulators: BN / 2 per thread)
    // Warp-specialised and persistent: a block takes tiles in turn, gridDim.x of them apart. One thread of the
    // ninth warp (the producer) has the Tensor Memory Accelerator copy its tiles' k steps (iteration `it` of the
    // block) into stage it % S (boxes of the tensor maps ma and mb, swizzled as the descriptors read them, zero
    // past the edges), counted on full_[s]; the two consumer warpgroups wait for it, compute 64 rows of the tile
    // each (4 products of k 16, from descriptors of the stage) and, once an iteration's products are done
    // (wg_wait<1> at the next one, wg_wait<0> at the tile's end), arrive on empty_[s], which the producer waits for
    // before refilling it: it runs ahead into the next tile while the consumers store the last.
    std::string regs, ops;
    for (int r = 0; r < NR; ++r) {
      regs += (r ? ", %" : "%") + I(r);
      ops += std::string(r ? ", " : "") + "\"+f\"(acc[" + I(r) + "])";
    }
    // (the accumulators pinned where the products' asynchronous pipeline starts and ends, so that the compiler
    // moves none of them in between)
    const std::string pin = "    asm volatile(\"\" : " + ops + " :: \"memory\");\n";
    // (tiles in groups of G rows of tiles, each group's columns in turn: the blocks running together share a group's
    // rows of A and a few columns of B, which L2 keeps, instead of all of A, which it may not)
    const int G = 16;
    const std::string tiles = "    for (int u = blockIdx.x; u < units; u += gridDim.x) {\n"
                              "      int grp = u / (" + I(G) + " * tn), in = u % (" + I(G) + " * tn), gm = min(" + I(G) +
                              ", tu - grp * " + I(G) + ");\n"
                              "      i64 m0 = (i64)(grp * " + I(G) + " + in % gm) * " + I(BM) + ", n0 = (i64)(in / gm) * " +
                              I(BN) + ";\n";
    t << "  __shared__ __align__(8) unsigned long long full_[" << S << "], empty_[" << S << "];\n"
      << "  if (tid == 0)\n    for (int s = 0; s < " << S << "; ++s) {\n"
      << "      mbar_init(smem_u32(&full_[s]), 1);\n      mbar_init(smem_u32(&empty_[s]), 8);\n    }\n"
      << "  __syncthreads();\n"
      << "  int KT = (int)((K + " << BK - 1 << ") / " << BK << "), z = blockIdx.z;\n"
      << "  int tu = (int)((M + " << BM - 1 << ") / " << BM << "), tn = (int)((N + " << BN - 1 << ") / " << BN
      << "), units = tu * tn;\n"
      << "  if (tid >= 256) {  // the producer\n"
      << "    if (tid == 256) {\n"
      << "    int it = 0;\n"
      << tiles
      << "      for (int kt = 0; kt < KT; ++kt, ++it) {\n"
      << "        int s = it % " << S << ";\n"
      << "        unsigned f = smem_u32(&full_[s]);\n"
      << "        if (it >= " << S << ") mbar_wait(smem_u32(&empty_[s]), ((it / " << S << ") & 1) ^ 1);\n"
      << "        mbar_expect(f, " << (BM + BN) * BK * 2 << ");\n"
      << "        tma_load(smem_u32" << stage(true, "s") << ", &ma, kt * " << BK << ", (int)m0, z, f);\n"
      << "        tma_load(smem_u32" << stage(false, "s") << ", &mb, kt * " << BK << ", (int)n0, z, f);\n"
      << "      }\n"
      << "    }\n"
      << "    }\n"
      << "  } else {\n"
      << "  float acc[" << NR << "];\n"
      << "  int wg_ = tid >> 7, it = 0;\n"
      << tiles
      << "#pragma unroll\n"
      << "    for (int r = 0; r < " << NR << "; ++r) acc[r] = 0.f;\n"
      << "  for (int kt = 0; kt < KT; ++kt, ++it) {\n"
      << "    int s = it % " << S << ";\n"
      << "    mbar_wait(smem_u32(&full_[s]), (it / " << S << ") & 1);\n"
      << "    unsigned sa = smem_u32" << stage(true, "s") << " + wg_ * " << 64 * BK * 2
      << ", sb = smem_u32" << stage(false, "s") << ";\n"
      << pin << "    wg_fence();\n"
      << "#pragma unroll\n"
      << "    for (int j = 0; j < " << BK / 16 << "; ++j) {\n"
      << "      unsigned long long da = wg_desc(sa + j * 32), db = wg_desc(sb + j * 32);\n"
      << "      asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n\"\n"
      << "                   \"wgmma.mma_async.sync.aligned.m64n" << BN << "k16.f32." << ct << "." << ct << " {" << regs
      << "}, %" << NR << ", %" << NR + 1 << ", p, 1, 1, 0, 0;\\n}\\n\"\n"
      << "                   : " << ops << "\n"
      << "                   : \"l\"(da), \"l\"(db));\n"
      << "    }\n"
      << "    wg_commit();\n"
      << "    wg_wait<1>();\n" << pin
      << "    if (kt > 0 && lane == 0) mbar_arrive(smem_u32(&empty_[(it - 1) % " << S << "]));  // (iteration it - 1's "
         "products are done)\n"
      << "  }\n"
      << "  wg_wait<0>();\n" << pin
      << "  if (lane == 0) mbar_arrive(smem_u32(&empty_[(it - 1) % " << S << "]));  // (and the tile's last)\n";
    if (tstore) {
      // A 16-bit output of rows of 8k at a 16-byte aligned address (the runtime encodes mo then): the tile stored
      // by the Tensor Memory Accelerator from shared memory after the ring, 128 columns at a time (two boxes of 64,
      // 128-byte swizzle: the 8 rows of a warp's store hit 8 distinct bank groups), so that the consumers go on to
      // the next tile while it writes; before the next 128 columns overwrite that memory, the stores before have
      // read it.
      std::string ebuf = "smem_u32(smem_ + " + I(S * (BM + BN) * BK) + ")";
      t << "  if ((N & 7) == 0 && ((unsigned long long)out & 15) == 0) {\n"
        << "#pragma unroll\n"
        << "    for (int c = 0; c < " << BN / 128 << "; ++c) {\n"
        << "      if (tid == 0) tma_read_wait();\n"
        << "      consumers_sync();\n"
        << "#pragma unroll\n"
        << "      for (int jj = 0; jj < 16; ++jj)\n"
        << "#pragma unroll\n"
        << "        for (int h = 0; h < 2; ++h) {\n"
        << "          int r = wg_ * 64 + (w & 3) * 16 + g + h * 8, j = c * 16 + jj;\n"
        << "          unsigned x = pack_" << od << "(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);\n"
        << "          asm volatile(\"st.shared.b32 [%0], %1;\" :: \"r\"(" << ebuf
        << " + (jj >> 3) * 16384 + r * 128 + (((jj & 7) ^ (r & 7)) << 4) + (lane & 3) * 4), \"r\"(x) : \"memory\");\n"
        << "        }\n"
        << "      fence_async_smem();\n"
        << "      consumers_sync();\n"
        << "      if (tid == 0) {\n"
        << "        tma_store(&mo, (int)n0 + c * 128, (int)m0, z, " << ebuf << ");\n"
        << "        tma_store(&mo, (int)n0 + c * 128 + 64, (int)m0, z, " << ebuf << " + 16384);\n"
        << "        tma_commit();\n"
        << "      }\n"
        << "    }\n"
        << "    continue;\n"
        << "  }\n";
    }
  } else {
    t << "  float acc[" << MI << "][" << NJ << "][4] = {};\n"
      << "  int KT = (int)((K + " << BK - 1 << ") / " << BK << ");\n"
      << "  for (int s = 0; s < " << S - 1 << "; ++s) {\n"
      << "    i64 k0 = (i64)s * " << BK << ";\n"
      << "    if (s < KT) {\n";
    load("a", as, BM, "      ");
    load("b", bs, BN, "      ");
    store("a", as, BM, "      ");
    store("b", bs, BN, "      ");
    t << "    }\n    cp_commit();\n  }\n"
      << "  for (int kt = 0; kt < KT; ++kt) {\n"
      << "    cp_wait<" << S - 2 << ">();  // tile kt is in\n"
      << "    __syncthreads();             // and every warp is done with the stage refilled below (tile kt - 1's)\n"
      << "    int nk = kt + " << S - 1 << ", s = nk % " << S << ";\n"
      << "    i64 k0 = (i64)nk * " << BK << ";\n"
      << "    if (nk < KT) {\n";
    load("a", as, BM, "      ");
    load("b", bs, BN, "      ");
    t << "    }\n"
      << "    const u16 *sa = " << stage(true, "(kt % " + I(S) + ")") << ", *sb = " << stage(false, "(kt % " + I(S) + ")")
      << ";\n"
      << "#pragma unroll\n"
      << "    for (int kk = 0; kk < " << CH << "; kk += 2) {  // (chunks: 16 of k)\n"
      << "      unsigned af[" << MI << "][4], bf[" << NJ << "][2];\n"
      << "#pragma unroll\n"
      << "      for (int i = 0; i < " << MI << "; ++i) {\n"
      << "        int r = wm * " << TM << " + i * 16 + (lane & 15), c = kk + (lane >> 4);\n"
      << "        ldsm_x4(af[i], smem_u32(sa + " << sw("r", "c") << "));\n      }\n"
      << "#pragma unroll\n"
      << "      for (int j = 0; j < " << NJ << "; j += 2) {\n"
      << "        int r = wn * " << TN << " + j * 8 + (lane & 7) + ((lane >> 4) << 3), c = kk + ((lane >> 3) & 1);\n"
      << "        unsigned f[4];\n"
      << "        ldsm_x4(f, smem_u32(sb + " << sw("r", "c") << "));\n"
      << "        bf[j][0] = f[0]; bf[j][1] = f[1]; bf[j + 1][0] = f[2]; bf[j + 1][1] = f[3];\n      }\n"
      << "#pragma unroll\n"
      << "      for (int i = 0; i < " << MI << "; ++i)\n"
      << "#pragma unroll\n"
      << "        for (int j = 0; j < " << NJ << "; ++j)\n"
      << "          asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32." << ct << "." << ct << ".f32 "
      << "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\"\n"
      << "                       : \"+f\"(acc[i][j][0]), \"+f\"(acc[i][j][1]), \"+f\"(acc[i][j][2]), \"+f\"(acc[i][j][3])\n"
      << "                       : \"r\"(af[i][0]), \"r\"(af[i][1]), \"r\"(af[i][2]), \"r\"(af[i][3]), \"r\"(bf[j][0]), "
         "\"r\"(bf[j][1]));\n"
      << "    }\n"
      << "    if (nk < KT) {\n";
    store("a", as, BM, "      ");
    store("b", bs, BN, "      ");
    t << "    }\n    cp_commit();\n  }\n"
      << "  cp_wait<0>();\n";
  }
  // Each thread holds pairs of adjacent columns: one 8-byte (float32) or 4-byte store when N is even.
  std::string pair;
  if (n.dtype == DType::F32) pair = "*(float2*)((float*)out + o) = make_float2(v0, v1);";
  else if (n.dtype == DType::BF16 || n.dtype == DType::F16) {
    std::string cv = n.dtype == DType::BF16 ? "f32_bf16" : "f32_f16";
    pair = "*(unsigned*)((u16*)out + o) = (unsigned)" + cv + "(v0) | ((unsigned)" + cv + "(v1) << 16);";
  }
  t << "  i64 ob = (i64)blockIdx.z * M;\n";
  if (wg)  // (a warpgroup's accumulators: per 8 columns j, rows g and g + 8 of its warp's 16, as mma.sync's)
    t << "#pragma unroll\n"
      << "    for (int j = 0; j < " << BN / 8 << "; ++j)\n"
      << "#pragma unroll\n"
      << "      for (int h = 0; h < 2; ++h) {\n"
      << "        i64 m = m0 + wg_ * 64 + (w & 3) * 16 + g + h * 8, nn = n0 + j * 8 + q;\n"
      << "        if (m >= M || nn >= N) continue;\n"
      << "        float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];\n";
  else
    t << "#pragma unroll\n"
      << "  for (int i = 0; i < " << MI << "; ++i)\n"
      << "#pragma unroll\n"
      << "    for (int j = 0; j < " << NJ << "; ++j)\n"
      << "#pragma unroll\n"
      << "      for (int h = 0; h < 2; ++h) {\n"
      << "        i64 m = m0 + wm * " << TM << " + i * 16 + g + h * 8, nn = n0 + wn * " << TN << " + j * 8 + q;\n"
      << "        if (m >= M || nn >= N) continue;\n"
      << "        float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];\n";
  t << "        i64 o = (ob + m) * N + nn;\n";
  if (!pair.empty())
    t << "        if ((N & 1) == 0) { " << pair << " continue; }\n";
  t << "        st_" << od << "(out, o, v0);\n"
    << "        if (nn + 1 < N) st_" << od << "(out, o + 1, v1);\n      }\n";
  if (wg) t << "    }\n" << (tstore ? "  if (tid == 0) tma_wait();  // (before the block's shared memory goes)\n" : "")
            << "  }\n#endif\n";
  t << "}\n";
  // (wgmma: the ring aligned by hand to 1024 bytes, and 128 x 128 16-bit outputs for the stores)
  return {kind, add_kernel(t.str()), G.smem_bytes() + (wg ? 1024 : 0) + (tstore ? 32768 : 0), wg ? 288 : 0};
}

// The tiled matrix product on tensor cores (same parameter slice): the fallback for rows gemm_kernel cannot take
// (unaligned, or K not a multiple of 8) and operands stored in another 16-bit type.
std::string Generator::mma_kernel(const Node& n, const Step& st) {
  const ViewSlot& av = st.views[0];
  int R = av.rank;
  DType as = storage(n.inputs[0].node), bs = storage(n.inputs[1].node);
  std::string od = dtype_name(n.dtype);
  Tiles T(st);
  const ViewText &a = T.a, &b = T.b;
  const std::string &M = T.M, &N = T.N, &K = T.K;
  auto off = [&](const ViewText& v, const std::string& m, const std::string& nn, const std::string& kk) {
    return T.off(v, m, nn, kk);
  };
  // Tensor cores: mma.sync m16n8k16 (bf16 or f16 operands, float32 accumulators). 64 x 64 outputs per block of 4
  // warps (32 x 32 each), k in steps of 32 through shared memory (rows padded to 40 halves: no bank conflicts on the
  // fragment loads). Each thread stages 16 consecutive k of one row of A and of B; p[3] == 1 says those rows are
  // contiguous, 16-byte aligned and K is a multiple of 32, so they load 16 bytes at a time.
  std::string ct = compute_ == DType::BF16 ? "bf16" : "f16", cv = compute_ == DType::BF16 ? "f32_bf16" : "f32_f16";
  Text t;
  t << "extern \"C\" __global__ __launch_bounds__(128) void NAME" << params(2) << " {\n"
    << "  __shared__ __align__(16) u16 As[64][40], Bs[64][40];\n"
    << "  i64 M = " << M << ", N = " << N << ", K = " << K << ";\n"
    << "  i64 m0 = (i64)blockIdx.y * 64, n0 = (i64)blockIdx.x * 64;\n"
    << unravel(av, 0, R - 3, "(i64)blockIdx.z")
    << "  int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, wm = w >> 1, wn = w & 1;\n"
    << "  int lr = tid >> 1, lk = (tid & 1) * 16, g = lane >> 2, q = (lane & 3) * 2;\n"
    << "  float acc[2][4][4] = {};\n"
    << "  for (i64 k0 = 0; k0 < K; k0 += 32) {\n"
    << "    i64 m = m0 + lr, nn = n0 + lr, kb = k0 + lk;\n"
    << "    float x[16], y[16];\n"
    << "    if (p[3] == 1) {\n"
    << "      if (m < M) { ld8_" << dtype_name(as) << "(in0, " << off(a, "m", "0", "kb") << ", x); ld8_" << dtype_name(as)
    << "(in0, " << off(a, "m", "0", "kb") << " + 8, x + 8); } else for (int j = 0; j < 16; ++j) x[j] = 0.0f;\n"
    << "      if (nn < N) { ld8_" << dtype_name(bs) << "(in1, " << off(b, "0", "nn", "kb") << ", y); ld8_" << dtype_name(bs)
    << "(in1, " << off(b, "0", "nn", "kb") << " + 8, y + 8); } else for (int j = 0; j < 16; ++j) y[j] = 0.0f;\n"
    << "    } else {\n"
    << "      for (int j = 0; j < 16; ++j) {\n"
    << "        i64 kk = kb + j;\n"
    << "        x[j] = (m < M && kk < K) ? (float)ld_" << dtype_name(as) << "(in0, " << off(a, "m", "0", "kk") << ") : 0.0f;\n"
    << "        y[j] = (nn < N && kk < K) ? (float)ld_" << dtype_name(bs) << "(in1, " << off(b, "0", "nn", "kk") << ") : 0.0f;\n"
    << "      }\n    }\n"
    << "    for (int j = 0; j < 16; ++j) { As[lr][lk + j] = " << cv << "(x[j]); Bs[lr][lk + j] = " << cv << "(y[j]); }\n"
    << "    __syncthreads();\n"
    << warp_mma_tile(ct, 32) << "    __syncthreads();\n  }\n"
    << "  for (int i = 0; i < 2; ++i)\n    for (int j = 0; j < 4; ++j)\n      for (int e = 0; e < 4; ++e) {\n"
    << "        i64 m = m0 + wm * 32 + i * 16 + g + (e >> 1) * 8, nn = n0 + wn * 32 + j * 8 + q + (e & 1);\n"
    << "        if (m < M && nn < N) st_" << od << "(out, ((i64)blockIdx.z * M + m) * N + nn, acc[i][j][e]);\n      }\n}\n";
  return add_kernel(t.str());
}

// Contraction: out[outer...] = sum over the last `axes` dims of a * b, through both operands' views (a convolution:
// the input's overlapping window view times the weights, summed over channels and kernel window; no im2col buffer).
// As an implicit GEMM: the runtime sorts the outer dims into rows (b does not move along them), columns (a does
// not) and batches (both do) and writes their sizes after the views (contraction_layout in contraction.cpp); a block
// computes 64 x 64 outputs of one batch, k in tiles through shared memory. A block's row and column offsets are
// worked out once, each k tile's offsets once per tile (the flat k unravelled over the reduced dims), so a load is
// two table reads and an add; the next tile's elements are loaded into registers while this tile's products run.
// Each operand is staged along whichever of its rows or k is contiguous (a convolution's input along its output
// rows, its weights along k) so that a warp's loads coalesce. With a 16-bit compute dtype on tensor cores (mma.sync
// m16n8k16, operands rounded to it, float32 accumulators), else float32 FMAs. A float32 output may have k split over
// blocks (blockIdx.z: batch and split) adding their partial sums atomically into the output, which the step's
// combine kernel zeroes first. Masked views and integer dtypes take a warp per output.
void Generator::contraction_step(Step& st, const Node& n, int axes) {
  st.views = {slot(n, 0), slot(n, 1)};
  layout(st);
  const ViewSlot &av = st.views[0], &bv = st.views[1];
  const ViewText a{av}, b{bv};
  int R = av.rank, O = R - axes;
  if (O < 0 || bv.rank != R) throw std::logic_error("CUDA codegen: a Contraction's operand views disagree");
  DType as = storage(n.inputs[0].node), bs = storage(n.inputs[1].node);
  std::string od = dtype_name(n.dtype);
  auto I = [](int v) { return std::to_string(v); };
  // A warp per output, lanes over the flat k (any view, any dtype).
  {
    bool dbl = is_int(n.dtype) || is_int(as) || is_int(bs);
    std::string T = dbl ? "double" : "float";
    Text k;
    k << "extern \"C\" __global__ void NAME" << params(2) << " {\n"
      << "  int lane = threadIdx.x & 31;\n  i64 nw = ((i64)gridDim.x * blockDim.x) >> 5, K = 1";
    for (int d = O; d < R; ++d) k << " * " << a.shape(d);
    k << ";\n  for (i64 row = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5; row < p[1]; row += nw) {\n"
      << unravel(av, 0, O, "row") << "    " << T << " acc = 0;\n"
      << "    for (i64 kk = lane; kk < K; kk += 32) {\n" << unravel(av, O, R, "kk") << "    " << T << " x, y;\n"
      << load(av, names("i", 0, R), "in0", as, T, "x") << load(bv, names("i", 0, R), "in1", bs, T, "y")
      << "    acc += x * y;\n    }\n    acc = warp_sum(acc);\n"
      << "    if (lane == 0) st_" << od << "(out, row, acc);\n  }\n}\n";
    st.variants = {{Variant::Warps, add_kernel(k.str())}};
  }
  if (!is_float(as) || !is_float(bs) || !is_float(n.dtype) || av.masked || bv.masked) return;
  int E = st.nparams;
  st.nparams += contraction_extra(O);
  auto x = [&](int slot) { return "p[" + I(E + slot) + "]"; };
  bool mma = compute_ == DType::BF16 || compute_ == DType::F16;
  bool split = n.dtype == DType::F32;  // (k split over blocks adds float32 partial sums atomically)
  // f32: 256 threads, 4 x 4 outputs each, k tiles of 16 stored k-major; mma: 128 threads (4 warps of 32 x 32), k
  // tiles of 32 stored row-major (rows padded to 40 halves: no bank conflicts on the fragment loads).
  const int TILE = kContractionTile, NT = mma ? 128 : 256, BK = contraction_bk(mma), U = TILE * BK / NT;
  Text t;
  t << "extern \"C\" __global__ __launch_bounds__(" << NT << ") void NAME" << params(2) << " {\n"
    << "  __shared__ i64 rA[" << TILE << "], rB[" << TILE << "], oM[" << TILE << "], oN[" << TILE << "], kA[2][" << BK
    << "], kB[2][" << BK << "];\n";
  if (mma) t << "  __shared__ __align__(16) u16 As[" << TILE << "][" << BK + 8 << "], Bs[" << TILE << "][" << BK + 8 << "];\n";
  else t << "  __shared__ float As[" << BK << "][" << TILE + 4 << "], Bs[" << BK << "][" << TILE + 4 << "];\n";
  t << "  i64 M = " << x(0) << ", N = " << x(1) << ", K = " << x(3) << ", S = " << x(6) << ";\n"
    << "  i64 m0 = (i64)blockIdx.x * " << TILE << ", n0 = (i64)blockIdx.y * " << TILE << ";\n"
    << "  int tid = threadIdx.x;\n  bool fa = " << x(4) << " != 0, fb = " << x(5) << " != 0;\n"
    // blockIdx.z: the batch, and (S > 1) the block's range of k tiles.
    << "  i64 nb = " << x(2) << ", per = ((K + " << BK - 1 << ") / " << BK << " + S - 1) / S;\n"
    << "  i64 kbeg = (i64)(blockIdx.z / nb) * per * " << BK << ", kend = min(K, kbeg + per * " << BK << ");\n"
    // The offsets of the tile's rows (a, and the output with the batch's offset) and columns (b, the output).
    << "  if (tid < " << 2 * TILE << ") {\n"
    << "    bool isb = tid >= " << TILE << ";\n    int r = tid % " << TILE << ";\n"
    << "    i64 oa = " << a.off() << ", ob = " << b.off() << ", oo = 0, z = blockIdx.z % nb;\n";
  for (int d = O - 1; d >= 0; --d)
    t << "    { i64 s = " << x(7 + 2 * O + d) << ", i = z % s; z /= s; oa += i * " << a.stride(d) << "; ob += i * "
      << b.stride(d) << "; oo += i * " << x(7 + 3 * O + d) << "; }\n";
  t << "    if (isb) oo = 0;\n"
    << "    i64 w = (isb ? n0 : m0) + r;\n"
    << "    if (w < (isb ? N : M)) {\n";
  for (int d = O - 1; d >= 0; --d)
    t << "      { i64 s = isb ? " << x(7 + O + d) << " : " << x(7 + d) << ", i = w % s; w /= s; oa += i * " << a.stride(d)
      << "; ob += i * " << b.stride(d) << "; oo += i * " << x(7 + 3 * O + d) << "; }\n";
  t << "    }\n"
    << "    if (isb) { rB[r] = ob; oN[r] = oo; } else { rA[r] = oa; oM[r] = oo; }\n  }\n";
  if (mma)
    t << "  int lane = tid & 31, wq = tid >> 5, wm = wq >> 1, wn = wq & 1, g = lane >> 2, q = (lane & 3) * 2;\n"
      << "  float acc[2][4][4] = {};\n";
  else t << "  int tm = tid & 15, tn = tid >> 4;\n  float acc[4][4] = {};\n";
  // Element e = tid + NT u of a tile: along rows (row e % TILE, k e / TILE) or along k (k e % BK, row e / BK).
  auto at = [&](const char* f) {
    return std::string("int row = ") + f + " ? e % " + I(TILE) + " : e / " + I(BK) + ", kk = " + f + " ? e / " + I(TILE) +
           " : e % " + I(BK) + ";";
  };
  // Tile k1's k offsets into table buffer b (the flat k unravelled over the reduced dims).
  auto tables = [&](const std::string& k1, const std::string& buf, const char* ind) {
    t << ind << "if (tid < " << BK << ") {\n" << ind << "  i64 k = " << k1 << " + tid, ka = 0, kb = 0;\n"
      << ind << "  if (k < kend) {\n";
    for (int d = R - 1; d >= O; --d)
      t << ind << "    { i64 i = " << (d == O ? std::string("k") : "k % " + a.shape(d) + "; k /= " + a.shape(d))
        << "; ka += i * " << a.stride(d) << "; kb += i * " << b.stride(d) << "; }\n";
    t << ind << "  }\n" << ind << "  kA[" << buf << "][tid] = ka;\n" << ind << "  kB[" << buf << "][tid] = kb;\n"
      << ind << "}\n";
  };
  // Tile k1's elements into registers (their loads stay in flight through the current tile's products).
  auto fetch = [&](const std::string& k1, const std::string& buf, const char* ind) {
    t << ind << "#pragma unroll\n" << ind << "for (int u = 0; u < " << U << "; ++u) {\n"
      << ind << "  int e = tid + " << NT << " * u;\n"
      << ind << "  { " << at("fa") << "\n" << ind << "    va[u] = (m0 + row < M && " << k1 << " + kk < kend) ? (float)ld_"
      << dtype_name(as) << "(in0, rA[row] + kA[" << buf << "][kk]) : 0.0f; }\n"
      << ind << "  { " << at("fb") << "\n" << ind << "    vb[u] = (n0 + row < N && " << k1 << " + kk < kend) ? (float)ld_"
      << dtype_name(bs) << "(in1, rB[row] + kB[" << buf << "][kk]) : 0.0f; }\n"
      << ind << "}\n";
  };
  std::string cv = compute_ == DType::BF16 ? "f32_bf16" : "f32_f16";
  t << "  float va[" << U << "], vb[" << U << "];\n";
  tables("kbeg", "0", "  ");
  t << "  __syncthreads();\n";
  fetch("kbeg", "0", "  ");
  t << "  int buf = 0;\n"
    << "  for (i64 k0 = kbeg; k0 < kend; k0 += " << BK << ", buf ^= 1) {\n"
    << "#pragma unroll\n    for (int u = 0; u < " << U << "; ++u) {\n      int e = tid + " << NT << " * u;\n";
  if (mma)
    t << "      { " << at("fa") << " As[row][kk] = " << cv << "(va[u]); }\n"
      << "      { " << at("fb") << " Bs[row][kk] = " << cv << "(vb[u]); }\n";
  else
    t << "      { " << at("fa") << " As[kk][row] = va[u]; }\n"
      << "      { " << at("fb") << " Bs[kk][row] = vb[u]; }\n";
  t << "    }\n    i64 k1 = k0 + " << BK << ";\n";
  tables("k1", "buf ^ 1", "    ");
  t << "    __syncthreads();\n    if (k1 < kend) {\n";
  fetch("k1", "buf ^ 1", "      ");
  t << "    }\n";
  if (mma) {
    std::string ct = compute_ == DType::BF16 ? "bf16" : "f16";
    t << warp_mma_tile(ct, BK) << "    __syncthreads();\n  }\n";
  } else {
    t << "#pragma unroll\n"
      << "    for (int kk = 0; kk < " << BK << "; ++kk) {\n"
      << "      float y[4], v[4];\n"
      << "      for (int i = 0; i < 4; ++i) { v[i] = As[kk][tm + 16 * i]; y[i] = Bs[kk][tn + 16 * i]; }\n"
      << "      for (int i = 0; i < 4; ++i)\n        for (int j = 0; j < 4; ++j) acc[i][j] += v[i] * y[j];\n    }\n"
      << "    __syncthreads();\n  }\n";
  }
  // (a split k: each block's partial sums added into the output, which the step's first kernel zeroed)
  std::string store = split ? "{ if (S > 1) atomicAdd((float*)out + o, v); else st_float32(out, o, v); }"
                            : "st_" + od + "(out, o, v);";
  if (mma)
    t << "  for (int i = 0; i < 2; ++i)\n    for (int j = 0; j < 4; ++j)\n      for (int e = 0; e < 4; ++e) {\n"
      << "        int r = wm * 32 + i * 16 + g + (e >> 1) * 8, c = wn * 32 + j * 8 + q + (e & 1);\n"
      << "        float v = acc[i][j][e];\n        i64 o = oM[r] + oN[c];\n"
      << "        if (m0 + r < M && n0 + c < N) " << store << "\n      }\n}\n";
  else
    t << "  for (int i = 0; i < 4; ++i)\n    for (int j = 0; j < 4; ++j) {\n"
      << "      int r = tm + 16 * i, c = tn + 16 * j;\n"
      << "      float v = acc[i][j];\n      i64 o = oM[r] + oN[c];\n"
      << "      if (m0 + r < M && n0 + c < N) " << store << "\n    }\n}\n";
  if (split)
    st.combine_fn = add_kernel("extern \"C\" __global__ void NAME" + params(std::vector<std::string>{}) + " {\n"
                               "  for (i64 t = blockIdx.x * (i64)blockDim.x + threadIdx.x; t < p[1]; t += (i64)gridDim.x * blockDim.x)\n"
                               "    ((float*)out)[t] = 0.0f;\n}\n");
  Variant fast{mma ? Variant::ImplicitMma : Variant::ImplicitGemm, add_kernel(t.str())};
  st.variants.insert(st.variants.begin(), fast);
}

// Statements pointing `ptr` (a const u8*) at the packed row `nn` (in range) of whichever weight holds it; with
// `sptr`, weights stored split: `ptr` at the row's quants, `sptr` (a const u16*) at its scales.
std::string Generator::q8_row(const Step& st, int S, const std::string& nn, const std::string& ptr,
                              const std::string& sptr) const {
  int m = int(st.views.size()) - 1;
  std::string t = "    ";
  for (int j = 1; j <= m; ++j) {
    ViewText wv{st.views[j]};
    if (j > 1) t += " else ";
    if (j < m) t += "if (" + nn + " < p[" + std::to_string(S + j) + "]) ";
    std::string in = "(const u8*)in" + std::to_string(j), r = "(" + nn + " - p[" + std::to_string(S + j - 1) + "])";
    if (sptr.empty())
      t += "{ " + ptr + " = " + in + " + " + wv.off() + " + " + r + " * " + wv.stride(0) + "; }";
    else
      t += "{ i64 " + split_offsets(st.views[size_t(j)], r, "p[2]", "q_", "s_") + "; " + ptr + " = " + in + " + q_; " +
           sptr + " = (const u16*)(" + in + " + s_); }";
  }
  return t + "\n";
}

namespace {
// sum_i x.i * q_i over the 4 int8 quants of `u` (the word XORed with 0x80808080, so byte i is q_i + 128): each byte
// becomes the float 2^23 + byte by putting it under the exponent bits of 2^23 (a byte permute, no int-to-float
// conversion, whose throughput would bound the kernel), less 2^23 + 128.
std::string q8_dot4(const std::string& u, const std::string& x) {
  std::string t = "(";
  const char* c[] = {".x", ".y", ".z", ".w"};
  for (int i = 0; i < 4; ++i)
    t += std::string(i ? " + " : "") + x + c[i] + " * (__uint_as_float(__byte_perm(" + u + ", 0x4b000000u, 0x744" +
         std::to_string(i) + ")) - 8388736.0f)";
  return t + ")";
}

// Four consecutive activations from element `o` into float4 `x`: one 16-byte load of float32 rows (applies() checks
// the alignment), else four loads.
std::string load4(DType as, const std::string& o, const std::string& x) {
  if (as == DType::F32) return x + " = __ldg((const float4*)((const float*)in0 + " + o + "));";
  std::string ld = "ld_" + std::string(dtype_name(as)) + "(in0, " + o;
  return x + " = make_float4(" + ld + "), " + ld + " + 1), " + ld + " + 2), " + ld + " + 3));";
}
}  // namespace

// Q8_0 rows of few tokens (decode): a block of 8 warps per 2 output columns of one row, the warps splitting K, each
// step of the block covering 32 consecutive blocks of 32 weights (1,088 contiguous bytes per weight row); a lane
// takes 4 quants of a block (8 lanes a block) with 2-byte loads (blocks are 34 bytes: only 2-byte aligned) and their
// 4 activations (which serve both rows), and 4 steps are loaded before the first multiply. Float32 accumulation.
// (Whole 4-byte words per lane, the neighbours' words and the scales by shuffles, measured no faster on the H100.)
std::string Generator::q8_matvec(const Step& st, const Node& n, int S, bool split) {
  const ViewSlot& av = st.views[0];
  int R = av.rank;
  DType as = storage(n.inputs[0].node);
  std::vector<std::string> idx = names("i", 0, R - 2);
  idx.insert(idx.end(), {"0", "0"});
  Text k;
  k << "extern \"C\" __global__ __launch_bounds__(256) void NAME" << params(int(st.views.size())) << " {\n"
    << "  __shared__ float part[8][2];\n"
    << "  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, j = lane & 7;\n"
    << "  i64 K = p[2], N = p[3], nb = K / 32, ng = (N + 1) / 2;\n"
    << "  if (N == 0) return;\n"
    << "  i64 items = p[1] / N * ng;\n"
    << "  for (i64 it = blockIdx.x; it < items; it += gridDim.x) {\n"
    << "    i64 row = it / ng, n0 = (it % ng) * 2;\n"
    << unravel(av, 0, R - 2, "row")
    << "    i64 abase = " << ViewText{av}.offset(idx) << ";\n"
    << "    const u8 *w0, *w1;\n" << (split ? "    const u16 *s0, *s1;\n" : "")
    << q8_row(st, S, "n0", "w0", split ? "s0" : "") << q8_row(st, S, "min(n0 + 1, N - 1)", "w1", split ? "s1" : "")
    << "    float acc0 = 0.0f, acc1 = 0.0f;\n"
    << "    for (i64 b0 = w * 4 + (lane >> 3); b0 < nb; b0 += 128) {\n"
    << "      float4 x[4];\n      unsigned q0[4], q1[4];\n      float d0[4], d1[4];\n"
    << "#pragma unroll\n"
    << "      for (int u = 0; u < 4; ++u) {\n"
    << "        i64 b = b0 + u * 32;\n"
    << "        if (b < nb) {\n"
    << "          " << load4(as, "abase + b * 32 + 4 * j", "x[u]") << "\n"
    << (split ? "          const u16 *a = (const u16*)(w0 + b * 32) - 1, *c = (const u16*)(w1 + b * 32) - 1;\n"
                "          d0[u] = f16_f32(__ldg(s0 + b));\n          d1[u] = f16_f32(__ldg(s1 + b));\n"
              : "          const u16 *a = (const u16*)(w0 + b * 34), *c = (const u16*)(w1 + b * 34);\n"
                "          d0[u] = f16_f32(__ldg(a));\n          d1[u] = f16_f32(__ldg(c));\n")
    << "          q0[u] = ((unsigned)__ldg(a + 1 + 2 * j) | ((unsigned)__ldg(a + 2 + 2 * j) << 16)) ^ 0x80808080u;\n"
    << "          q1[u] = ((unsigned)__ldg(c + 1 + 2 * j) | ((unsigned)__ldg(c + 2 + 2 * j) << 16)) ^ 0x80808080u;\n"
    << "        } else {\n"
    << "          x[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);\n"
    << "          d0[u] = d1[u] = 0.0f;\n          q0[u] = q1[u] = 0x80808080u;\n        }\n      }\n"
    << "#pragma unroll\n"
    << "      for (int u = 0; u < 4; ++u) {\n"
    << "        acc0 += d0[u] * " << q8_dot4("q0[u]", "x[u]") << ";\n"
    << "        acc1 += d1[u] * " << q8_dot4("q1[u]", "x[u]") << ";\n      }\n    }\n"
    << "    acc0 = warp_sum(acc0);\n    acc1 = warp_sum(acc1);\n"
    << "    if (lane == 0) { part[w][0] = acc0; part[w][1] = acc1; }\n"
    << "    __syncthreads();\n"
    << "    if (threadIdx.x < 2 && n0 + threadIdx.x < N) {\n"
    << "      float s = 0.0f;\n"
    << "      for (int v = 0; v < 8; ++v) s += part[v][threadIdx.x];\n"
    << "      st_" << dtype_name(n.dtype) << "(out, row * N + n0 + threadIdx.x, s);\n    }\n"
    << "    __syncthreads();\n  }\n}\n";
  return add_kernel(k.str());
}

// QDot's first kernel: the activation rows quantised to int8 blocks of 32 into the workspace, as the CPU backend's
// decode does (simd.h quantize_q8_portable: d = max|a| / 127, q = a / d rounded to nearest even): the rows' quants
// (rows x K bytes), then their scales (rows x K / 32 floats). A warp per block of 32, a lane per element.
std::string Generator::q8_quantize(const Step& st, const Node& n) {
  const ViewSlot& av = st.views[0];
  int R = av.rank;
  DType as = storage(n.inputs[0].node);
  std::vector<std::string> idx = names("i", 0, R - 2), args = input_names(int(st.views.size()));
  idx.insert(idx.end(), {"0", "k"});
  args.push_back("ws");
  Text k;
  k << "extern \"C\" __global__ void NAME" << params(args) << " {\n"
    << "  int lane = threadIdx.x & 31;\n"
    << "  i64 K = p[2], N = p[3], nb = K / 32;\n"
    << "  if (N == 0) return;\n"
    << "  i64 rows = p[1] / N, nw = ((i64)gridDim.x * blockDim.x) >> 5;\n"
    << "  signed char* q = (signed char*)ws;\n  float* d = (float*)((char*)ws + rows * K);\n"
    << "  for (i64 o = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5; o < rows * nb; o += nw) {\n"
    << "    i64 row = o / nb, k = o % nb * 32 + lane;\n"
    << unravel(av, 0, R - 2, "row")
    << "    float a = ld_" << dtype_name(as) << "(in0, " << ViewText{av}.offset(idx) << ");\n"
    << "    float db = warp_max(fabsf(a)) / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;\n"
    << "    q[row * K + k] = (signed char)__float2int_rn(a * id);\n"
    << "    if (lane == 0) d[o] = db;\n  }\n}\n";
  return add_kernel(k.str());
}

// Q8_0 rows of few tokens (decode) in integer arithmetic against the activations q8_quantize left in the workspace:
// a block of 8 warps per 4 output columns of one row (a group's rows in neighbouring blocks), the warps splitting K;
// 4 lanes per 32-weight block (8 quants each: four 2-byte loads, as blocks are 34 bytes, joined into two words by
// byte permutes), so a warp covers 8 blocks of each column per step and 2 steps are loaded before the first product.
// Per lane and block: two __dp4a, then one float multiply-add by the two scales; float32 accumulation.
std::string Generator::q8_dp4a(const Step& st, const Node& n, int S, bool split) {
  std::vector<std::string> args = input_names(int(st.views.size()));
  args.push_back("ws");
  Text k;
  // (4 blocks per multiprocessor, 64 registers: more loads in flight)
  k << "extern \"C\" __global__ __launch_bounds__(256, 4) void NAME" << params(args) << " {\n"
    << "  __shared__ float part[8][4];\n"
    << "  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, j = lane & 3;\n"
    << "  i64 K = p[2], N = p[3], nb = K / 32, ng = (N + 3) / 4;\n"
    << "  i64 rows = N ? p[1] / N : 0;\n"
    << "  // Before waiting for the kernels before (pdl_start): the first item's weight rows prefetched into L2, so that\n"
    << "  // streaming them overlaps the activations' quantisation (a hint only: L2 is coherent). (No return before it:\n"
    << "  // the kernel after this one waits for this one only.)\n"
    << "  if (blockIdx.x < rows * ng) {\n"
    << "    i64 n0 = blockIdx.x / rows * 4, bytes = nb * " << (split ? 32 : 34) << ";  // (split: the quants)\n"
    << "    const u8* r;\n" << (split ? "    const u16* rs;\n" : "");
  for (int c = 0; c < 4; ++c)
    k << q8_row(st, S, c ? "min(n0 + " + std::to_string(c) + ", N - 1)" : std::string("n0"), "r", split ? "rs" : "")
      << "    for (i64 l = threadIdx.x * 128; l < bytes; l += blockDim.x * 128)\n"
      << "      asm volatile(\"prefetch.global.L2 [%0];\" :: \"l\"(r + l));\n";
  k << "  }\n"
    << "  pdl_start();\n"
    << "  if (N == 0) return;\n"
    << "  const int2* xq = (const int2*)ws;\n  const float* xd = (const float*)((const char*)ws + rows * K);\n"
    << "  for (i64 it = blockIdx.x; it < rows * ng; it += gridDim.x) {\n"
    << "    i64 row = it % rows, n0 = it / rows * 4;  // (a group's rows in neighbouring blocks: its weights from L2)\n"
    << "    const u8* wr[4];\n" << (split ? "    const u16* wd[4];\n" : "");
  for (int c = 0; c < 4; ++c)
    k << q8_row(st, S, c ? "min(n0 + " + std::to_string(c) + ", N - 1)" : std::string("n0"), "wr[" + std::to_string(c) + "]",
                split ? "wd[" + std::to_string(c) + "]" : "");
  k << "    const int2* x8 = xq + row * (K / 8);\n    const float* x1 = xd + row * nb;\n"
    << "    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};\n"
    << "    for (i64 b0 = w * 8 + (lane >> 2); b0 < nb; b0 += 128) {\n"
    << "      int2 x[2];\n      float dx[2], dw[2][4];\n      int q[2][4][2];\n"
    << "#pragma unroll\n"
    << "      for (int u = 0; u < 2; ++u) {\n"
    << "        i64 b = b0 + u * 64;\n"
    << "        if (b < nb) {\n"
    << "          x[u] = __ldg(x8 + b * 4 + j);\n          dx[u] = __ldg(x1 + b);\n"
    << "#pragma unroll\n"
    << "          for (int c = 0; c < 4; ++c) {\n";
  if (split)  // (a lane's 8 quants in one load)
    k << "            dw[u][c] = f16_f32(__ldg(wd[c] + b));\n"
      << "            uint2 v = __ldg((const uint2*)(wr[c] + b * 32) + j);\n"
      << "            q[u][c][0] = (int)v.x;\n            q[u][c][1] = (int)v.y;\n";
  else
    k << "            const u16* a = (const u16*)(wr[c] + b * 34);\n"
      << "            dw[u][c] = f16_f32(__ldg(a));\n"
      << "            q[u][c][0] = (int)__byte_perm(__ldg(a + 1 + 4 * j), __ldg(a + 2 + 4 * j), 0x5410);\n"
      << "            q[u][c][1] = (int)__byte_perm(__ldg(a + 3 + 4 * j), __ldg(a + 4 + 4 * j), 0x5410);\n";
  k << "          }\n"
    << "        } else {\n"
    << "          x[u] = make_int2(0, 0);\n          dx[u] = 0.0f;\n"
    << "          for (int c = 0; c < 4; ++c) dw[u][c] = 0.0f, q[u][c][0] = q[u][c][1] = 0;\n        }\n      }\n"
    << "#pragma unroll\n"
    << "      for (int u = 0; u < 2; ++u)\n"
    << "#pragma unroll\n"
    << "        for (int c = 0; c < 4; ++c)\n"
    << "          acc[c] += dw[u][c] * dx[u] * (float)__dp4a(q[u][c][1], x[u].y, __dp4a(q[u][c][0], x[u].x, 0));\n"
    << "    }\n"
    << "#pragma unroll\n"
    << "    for (int c = 0; c < 4; ++c) {\n"
    << "      acc[c] = warp_sum(acc[c]);\n      if (lane == 0) part[w][c] = acc[c];\n    }\n"
    << "    __syncthreads();\n"
    << "    if (threadIdx.x < 4 && n0 + threadIdx.x < N) {\n"
    << "      float s = 0.0f;\n"
    << "      for (int v = 0; v < 8; ++v) s += part[v][threadIdx.x];\n"
    << "      st_" << dtype_name(n.dtype) << "(out, row * N + n0 + threadIdx.x, s);\n    }\n"
    << "    __syncthreads();\n  }\n}\n";
  return add_kernel(k.str());
}

// Q8_0 rows of many tokens (prefill) on tensor cores: mma.sync m16n8k16 over 64 x 64 outputs per block of 4 warps,
// k in steps of one block (32). The quants enter the 16-bit operand exactly (integers below 256); each step's
// products are scaled by their weight row's block scale as they join the float32 accumulators. The activations are
// rounded to the compute dtype (as the tensor-core MatMul rounds its operands).
std::string Generator::q8_mma(const Step& st, const Node& n, int S, bool split) {
  const ViewSlot& av = st.views[0];
  int R = av.rank;
  DType as = storage(n.inputs[0].node);
  std::vector<std::string> idx = names("i", 0, R - 2);
  idx.insert(idx.end(), {"0", "0"});
  std::string ct = compute_ == DType::BF16 ? "bf16" : "f16", cv = compute_ == DType::BF16 ? "f32_bf16" : "f32_f16";
  Text t;
  t << "extern \"C\" __global__ __launch_bounds__(128) void NAME" << params(int(st.views.size())) << " {\n"
    << "  __shared__ __align__(16) u16 As[64][40], Bs[64][40];\n"
    << "  __shared__ float Ds[64];\n"
    << "  i64 K = p[2], N = p[3], M = N ? p[1] / N : 0;\n"
    << "  if (M == 0) return;\n"
    << "  i64 m0 = (i64)blockIdx.y * 64, n0 = (i64)blockIdx.x * 64;\n"
    << "  int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, wm = w >> 1, wn = w & 1;\n"
    << "  int lr = tid >> 1, lk = (tid & 1) * 16, g = lane >> 2, q = (lane & 3) * 2;\n"
    << "  // Rows past the edges stage a copy of the last one (their outputs are not stored).\n"
    << "  i64 am = min(m0 + lr, M - 1), nn = min(n0 + lr, N - 1);\n"
    << unravel(av, 0, R - 2, "am")
    << "  i64 abase = " << ViewText{av}.offset(idx) << " + lk;\n"
    << "  const u8* wr;\n" << (split ? "  const u16* wd;\n" : "") << q8_row(st, S, "nn", "wr", split ? "wd" : "")
    << "  const u16* wq = (const u16*)wr + " << (split ? "" : "1 + ") << "lk / 2;\n"
    << "  float acc[2][4][4] = {};\n"
    << "  for (i64 kb = 0; kb < K / 32; ++kb) {\n"
    << "    float4 x[4];\n"
    << "#pragma unroll\n"
    << "    for (int u = 0; u < 4; ++u) { " << load4(as, "abase + kb * 32 + 4 * u", "x[u]") << " }\n"
    << "#pragma unroll\n"
    << "    for (int u = 0; u < 4; ++u) {\n"
    << "      As[lr][lk + 4 * u] = " << cv << "(x[u].x);\n      As[lr][lk + 4 * u + 1] = " << cv << "(x[u].y);\n"
    << "      As[lr][lk + 4 * u + 2] = " << cv << "(x[u].z);\n      As[lr][lk + 4 * u + 3] = " << cv << "(x[u].w);\n"
    << "    }\n"
    << "    if (lk == 0) Ds[lr] = f16_f32(__ldg(" << (split ? "wd + kb" : "(const u16*)wr + kb * 17") << "));\n"
    << "#pragma unroll\n"
    << "    for (int h = 0; h < 8; ++h) {\n"
    << "      unsigned v = __ldg(wq + kb * " << (split ? 16 : 17) << " + h);\n"
    << "      Bs[lr][lk + 2 * h] = " << cv << "((float)(signed char)(v & 255u));\n"
    << "      Bs[lr][lk + 2 * h + 1] = " << cv << "((float)(signed char)(v >> 8));\n    }\n"
    << "    __syncthreads();\n"
    << "    float c[2][4][4] = {};\n"
    << warp_mma_tile(ct, 32, "c")
    << "#pragma unroll\n"
    << "    for (int j = 0; j < 4; ++j) {\n"
    << "      float s0 = Ds[wn * 32 + j * 8 + q], s1 = Ds[wn * 32 + j * 8 + q + 1];\n"
    << "      for (int i = 0; i < 2; ++i) {\n"
    << "        acc[i][j][0] += s0 * c[i][j][0]; acc[i][j][1] += s1 * c[i][j][1];\n"
    << "        acc[i][j][2] += s0 * c[i][j][2]; acc[i][j][3] += s1 * c[i][j][3];\n      }\n    }\n"
    << "    __syncthreads();\n  }\n"
    << "  for (int i = 0; i < 2; ++i)\n    for (int j = 0; j < 4; ++j)\n      for (int e = 0; e < 4; ++e) {\n"
    << "        i64 m = m0 + wm * 32 + i * 16 + g + (e >> 1) * 8, col = n0 + wn * 32 + j * 8 + q + (e & 1);\n"
    << "        if (m < M && col < N) st_" << dtype_name(n.dtype) << "(out, m * N + col, acc[i][j][e]);\n      }\n}\n";
  return add_kernel(t.str());
}

// out[row, n] = sum_k a[row, n, k] * W[n, k], W unpacked from GGUF blocks in registers. p[1]: outputs, p[2]: K,
// p[3]: N. Several weights (main's stacked q/k/v or gate/up QMatMul): output column n reads weight j's row
// n - start[j]; the m + 1 starts follow the views in the parameter slice.
// Variants: Q8_0 only, QRows (one weight, one row: in a MatVec group, see applies() in runtime.cpp), QDot and
// QMatVec (a few rows: decode; QDot unless LUMINAL_CUDA_Q8_DP4A=0) and QGemm (more rows, 16-bit compute dtype:
// prefill), then a warp per output for anything (Warps).
void Generator::qmatmul_step(Step& st, const Node& n, int bb) {
  int m = int(n.inputs.size()) - 1;
  for (int k = 0; k <= m; ++k) st.views.push_back(slot(n, k));
  layout(st);
  int S = st.nparams;
  st.nparams += m + 1;
  st.block_bytes = bb;
  const ViewSlot& av = st.views[0];
  int R = av.rank;
  DType as = storage(n.inputs[0].node);
  st.variants.clear();
  bool sp = bb == 34 && split_q8(n);
  if (bb == 34 && m == 1) {
    // QRows: a warp per output through dot_rows, as a MatVec group's Q8_0 member computes it (the group kernel
    // reads the same parameter slice)
    std::string row = "i" + std::to_string(R - 2);
    std::string ob = sp ? split_offsets(st.views[1], row, "K", "ob", "obs") : "ob = " + ViewText{st.views[1]}.offset({row, "0"});
    st.variants.push_back({Variant::QRows, add_kernel(warp_rows_kernel(av, as, {DType::U8, "", ob, "", true, sp ? "obs" : ""},
                                                                       n.dtype))});
  }
  if (bb == 34) {
    st.prep_fn = q8_quantize(st, n);  // (QDot's first kernel)
    st.variants.push_back({Variant::QDot, q8_dp4a(st, n, S, sp)});
    st.variants.push_back({Variant::QMatVec, q8_matvec(st, n, S, sp)});
    // Many rows (prefill): cuBLASLt over the weights' dequantisation (one weight; the runtime's blas_plan_q8), timed
    // against our tensor-core kernel
    if ((compute_ == DType::BF16 || compute_ == DType::F16) && m == 1) st.variants.push_back({Variant::Blas, ""});
    if (compute_ == DType::BF16 || compute_ == DType::F16) st.variants.push_back({Variant::QGemm, q8_mma(st, n, S, sp)});
  }
  Text k;
  k << "extern \"C\" __global__ void NAME" << params(m + 1) << " {\n"
    << "  int lane = threadIdx.x & 31;\n  i64 nw = ((i64)gridDim.x * blockDim.x) >> 5;\n"
    << "  for (i64 o = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5; o < p[1]; o += nw) {\n"
    << "    i64 n = o % p[3];\n" << unravel(av, 0, R - 2, "o / p[3]");
  std::vector<std::string> idx = names("i", 0, R - 2);
  idx.push_back("n");
  idx.push_back("0");
  k << "    i64 abase = " << ViewText{av}.offset(idx) << ";\n    const u8* w8;\n    i64 wbase, sbase = 0;\n";
  for (int j = 1; j <= m; ++j) {
    ViewText wv{st.views[j]};
    std::string cond = j < m ? "if (n < p[" + std::to_string(S + j) + "]) " : "";
    std::string r = "(n - p[" + std::to_string(S + j - 1) + "])";
    k << "    " << (j > 1 ? "else " : "") << cond << "{ w8 = (const u8*)in" << j << "; "
      << (sp ? split_offsets(st.views[size_t(j)], r, "p[2]", "wbase", "sbase")
             : "wbase = " + wv.off() + " + " + r + " * " + wv.stride(0)) << "; }\n";
  }
  k << "    float acc = 0.0f;\n"
    << "    for (i64 b = lane; b < p[2] / 32; b += 32) {\n";
  if (sp)  // (split: the block's quants at wbase + 32 b, its scale at sbase + 2 b; q[2 + j] below is quant j)
    k << "      const u8* q = w8 + wbase + b * 32 - 2;\n"
      << "      float d = f16_f32(((const u16*)(w8 + sbase))[b]);\n";
  else
    k << "      const u8* q = w8 + wbase + b * " << bb << ";\n"
      << "      float d = f16_f32((u16)(q[0] | (q[1] << 8)));\n";
  k << "      float s = 0.0f;\n";
  std::string a = "ld_" + std::string(dtype_name(as)) + "(in0, abase + b * 32 + ";
  if (bb == 34) {
    k << "      for (int j = 0; j < 32; ++j) s += (float)(signed char)q[2 + j] * " << a << "j);\n"
      << "      acc += d * s;\n";
  } else {
    int qo = bb == 20 ? 4 : 2;
    k << "      float sa = 0.0f;\n"
      << "      for (int j = 0; j < 16; ++j) {\n"
      << "        float x0 = " << a << "j), x1 = " << a << "j + 16);\n"
      << "        s += (float)(q[" << qo << " + j] & 15) * x0 + (float)(q[" << qo << " + j] >> 4) * x1;\n"
      << "        sa += x0 + x1;\n      }\n";
    if (bb == 20) k << "      acc += d * s + f16_f32((u16)(q[2] | (q[3] << 8))) * sa;\n";
    else k << "      acc += d * (s - 8.0f * sa);\n";
  }
  k << "    }\n    acc = warp_sum(acc);\n    if (lane == 0) st_" << dtype_name(n.dtype) << "(out, o, acc);\n  }\n}\n";
  st.variants.push_back({Variant::Warps, add_kernel(k.str())});
}

// One thread per block of 32 weights. p[1]: blocks, p[2]: weights per row.
void Generator::dequant_step(Step& st, const Node& n, int bb) {
  st.views = {slot(n, 0)};
  layout(st);
  st.block_bytes = bb;
  const ViewSlot& v = st.views[0];
  int R = v.rank;
  Text k;
  k << "extern \"C\" __global__ void NAME" << params(1) << " {\n"
    << "  const u8* w8 = (const u8*)in0;\n"
    << "  for (i64 t = blockIdx.x * (i64)blockDim.x + threadIdx.x; t < p[1]; t += (i64)gridDim.x * blockDim.x) {\n"
    << "    i64 nb = p[2] / 32, row = t / nb, b = t % nb;\n" << unravel(v, 0, R - 1, "row");
  std::vector<std::string> idx = names("i", 0, R - 1);
  idx.push_back("b * " + std::to_string(bb));
  k << "    const u8* q = w8 + " << ViewText{v}.offset(idx) << ";\n"
    << "    float d = f16_f32((u16)(q[0] | (q[1] << 8)));\n"
    << "    i64 o = row * p[2] + b * 32;\n";
  if (bb == 34) {
    k << "    for (int j = 0; j < 32; ++j) st_" << dtype_name(n.dtype) << "(out, o + j, d * (float)(signed char)q[2 + j]);\n";
  } else {
    int qo = bb == 20 ? 4 : 2;
    std::string m = bb == 20 ? "f16_f32((u16)(q[2] | (q[3] << 8)))" : "0.0f";
    std::string sub = bb == 20 ? "" : " - 8.0f";
    k << "    float m = " << m << ";\n"
      << "    for (int j = 0; j < 16; ++j) {\n"
      << "      st_" << dtype_name(n.dtype) << "(out, o + j, d * ((float)(q[" << qo << " + j] & 15)" << sub << ") + m);\n"
      << "      st_" << dtype_name(n.dtype) << "(out, o + j + 16, d * ((float)(q[" << qo << " + j] >> 4)" << sub
      << ") + m);\n    }\n";
  }
  k << "  }\n}\n";
  st.variants = {{Variant::Elements, add_kernel(k.str())}};
}

// Attention (scores, row program and weighted values in one step; see AttentionPlan). Inputs: q, k, v, then the
// program's other inputs. Views: q and k as the scores' product reads them, (rows..., keys, D); v as the output
// product reads it, (rows..., N, keys); the program's inputs over P's rows, (rows..., keys). After the views: D, N,
// Tq (consecutive rows that share k and v: a KV head's query rows, see Runtime::applies), the batches (rows / Tq),
// the key ranges (splits), the keys per range and whether k's and v's rows take 16-byte loads. The kernels'
// pointers: e<edge>, aliased in<i> for program input i as program_body names them, then the workspace.
//
// Variants, in order: FlashMmaSkip, then FlashMma (flash_mma below: tensor cores, a 16-bit compute dtype, head sizes
// known when printing, 64+ rows per Tq). FlashDecode (up to 8 rows per Tq, head sizes known when printing; below). Flash
// (float32, any softmax program): 16 query rows per block of 4 warps (4 rows
// each), keys in tiles of 32 through shared memory with V's tile; a lane scores one key for its warp's 4 rows, the
// warp keeps each row's running max and sum, and lane l accumulates output columns l, l+32, .. (D, N <= 128).
// Both split the keys into ranges (grid z) when the tiles alone leave the GPU idle (decode over a long cache):
// each range writes its max, sum and unnormalised row to a workspace, and `combine_fn` merges them. Last,
// AttentionRows (any program): a block per row, a pass per Reduce step recomputing the scores, then the weighted
// rows of V accumulated in the output.
void Generator::attention_step(Step& st, const Node& n) {
  const AttentionPlan& plan = op_as<AttentionOp>(n)->plan;
  const Program& prog = plan.prog;
  int ne = int(n.inputs.size()), S = plan.scores, np = ne - 2;
  for (int k = 0; k < ne; ++k) st.views.push_back(slot(n, k));
  layout(st);
  int E = st.nparams;
  st.nparams += 7;
  auto P = [&](int k) { return "p[" + std::to_string(E + k) + "]"; };
  auto edge = [&](int i) { return 3 + i - (i > S ? 1 : 0); };
  // The program's own view of its inputs (the scores' slot is never loaded: they come from registers).
  Node pn = n;
  pn.inputs.clear();
  Step ps;
  std::string aliases;
  for (int i = 0; i < np; ++i) {
    int e = i == S ? 0 : edge(i);
    pn.inputs.push_back(n.inputs[size_t(e)]);
    ps.views.push_back(st.views[size_t(e)]);
    if (i != S) aliases += "  const void* in" + std::to_string(i) + " = e" + std::to_string(e) + ";\n";
  }
  int Rq = st.views[0].rank, Rv = st.views[2].rank, Rp = ne > 3 ? st.views[3].rank : 0;
  if (Rq < 2 || Rv < 2) throw std::logic_error("CUDA codegen: attention operands of rank < 2");
  ViewText q{st.views[0]}, kv{st.views[1]}, v{st.views[2]};
  auto ld = [&](int e) { return edge_load(n, e); };
  std::vector<std::string> args = names("e", 0, ne);
  args.push_back("ws");
  std::string jn = Rp ? "i" + std::to_string(Rp - 1) : "j_";
  bool dbl = double_registers(prog, pn);
  std::string T = dbl ? "double" : "float";
  auto body_of = [&](const std::vector<std::string>& idx, const std::vector<char>& need, size_t skip,
                     const std::string& s) {
    return program_body(prog, ps, pn, T, dbl, idx, need, skip, {{S, s}});
  };
  // The scores' row bases at flat row `row` (q's and k's view share their shape).
  auto qk_bases = [&](const std::string& row) {
    return "    {\n" + unravel(st.views[0], 0, Rq - 2, row, "a") + "    qb = " + view_base(q, "a", Rq - 2) +
           "; kb = " + view_base(kv, "a", Rq - 2) + ";\n    }\n";
  };
  auto v_base = [&](const std::string& row) {
    return "    {\n" + unravel(st.views[2], 0, Rv - 2, row, "a") + "    vb = " + view_base(v, "a", Rv - 2) + ";\n    }\n";
  };

  std::optional<SoftmaxForm> sm = softmax_form(prog);
  // The Flash kernel's online softmax for row i of a warp's rows, a lane per key j: x from the
  // score `score` (0 past the range), the row's running max and sum updated over the warp, pe<i> this lane's weight,
  // and the row's `ncols` accumulators (indexed by `col`) rescaled.
  auto online_row = [&](int i, const std::string& score, const std::string& col, const std::string& ncols) {
    std::string I = std::to_string(i);
    std::vector<std::string> idx;
    Text r;
    r << "      float pe" << I << " = 0.0f;\n      if (ok" << I << ") {\n        float x_ = ninf;\n"
      << "        if (j < jhi) {\n";
    for (int d = 0; d + 1 < Rp; ++d) {
      r << "    i64 i" << d << " = x" << I << "_" << d << ";\n";
      idx.push_back("i" + std::to_string(d));
    }
    r << "    i64 " << jn << " = j;\n";
    idx.push_back(jn);
    r << body_of(idx, prog.needed_for(size_t(sm->x)), size_t(-1), score) << "          x_ = (float)r" << sm->x
      << ";\n        }\n"
      << "        float mn = op_max(m" << I << ", warp_max(x_)), mu = mn == ninf ? 0.0f : mn;\n"
      << "        float al = op_exp2((m" << I << " - mu) * c_);\n"
      << "        pe" << I << " = op_exp2((x_ - mu) * c_);\n"
      << "        l" << I << " = l" << I << " * al + warp_sum(pe" << I << ");\n        m" << I << " = mn;\n"
      << "#pragma unroll\n        for (int " << col << " = 0; " << col << " < " << ncols << "; ++" << col << ") acc" << I
      << "[" << col << "] *= al;\n      }\n";
    return r.str();
  };
  bool f32kv = storage(n.inputs[1].node) == DType::F32 && storage(n.inputs[2].node) == DType::F32;
  if (sm && !dbl && (compute_ == DType::BF16 || compute_ == DType::F16)) {
    // Head sizes known when printing: the tensor-core kernel for them (D and N padded to a multiple of 16).
    Expr dq = n.inputs[0].view.shape.back(), dv = n.inputs[2].view.shape[size_t(Rv - 2)];
    if (dq.is_const() && dv.is_const() && dq.as_const() <= 128 && dv.as_const() <= 128) {
      int DH = int((std::max(dq.as_const(), dv.as_const()) + 15) / 16 * 16);
      // (flash_tiles: stages of K and V tiles in dynamic shared memory. FlashWgmma, an sm_90 device's: blocks of two
      // warpgroups, head sizes padded to 64s, the ring's stages and q's tile after them 1024-byte aligned.
      // FlashMmaSkip: blocks of 4 warps)
      bool async = storage(n.inputs[1].node) == compute_ && storage(n.inputs[2].node) == compute_;
      if (int DW = (DH + 63) / 64 * 64; async)
        st.variants.push_back({Variant::FlashWgmma, flash_tiles(st, n, ps, pn, *sm, aliases, args, DW, true),
                               (kFlashWgmmaStages * 2 * 64 + 128) * DW * 2 + 1024, 256});
      st.variants.push_back({Variant::FlashMmaSkip, flash_tiles(st, n, ps, pn, *sm, aliases, args, DH, false),
                             2 * 2 * 64 * (DH + 8) * 2, 128});
      st.variants.push_back({Variant::FlashMma, flash_mma(st, n, ps, pn, *sm, aliases, args, DH)});
    }
  }
  if (sm && !dbl) {
    // Decode (FlashDecode): head sizes known when printing. RW query rows per block (the query heads of a KV head);
    // the block's 4 warps take turns over its key range's 32-key tiles, a lane per key: the lane's key row in
    // registers (16-byte loads), its scores against the rows' q in shared memory, the warp's online softmax (the
    // tile's weights to shared memory), then each lane accumulates its CPL output columns over the tile's rows of V.
    // No block barrier inside the loop; the warps' partial rows merge in shared memory at the end.
    // A decode step runs this code once per block (a tile or two per warp), so its length is its cost: a lane past
    // the range reads the range's last key (weighted 0) instead of branching, every row runs the same unrolled
    // code, and the fallbacks for other layouts are rolled loops.
    Expr dq = n.inputs[0].view.shape.back(), dv = n.inputs[2].view.shape[size_t(Rv - 2)];
    if (dq.is_const() && dv.is_const() && dq.as_const() <= 128 && dv.as_const() <= 128) {
      const int RW = 4, Dc = int(dq.as_const()), Nc = int(dv.as_const()), CPL = std::max(1, (Nc + 31) / 32);
      // The vector paths (float32 k and v, or both 16-bit: a 16-bit KV cache read through fuse_attention), printed
      // where the sizes allow; taken when the runtime's flag (p[E + 6]) says the rows are contiguous and 16-byte
      // aligned. k: 8 elements per load; v: CPL consecutive ones (float4/2/1, or 8/4/2 bytes of 16-bit).
      DType ks = storage(n.inputs[1].node), vs = storage(n.inputs[2].node);
      bool kv16 = dtype_size(ks) == 2 && dtype_size(vs) == 2;
      bool kvec = Dc % 8 == 0 && (ks == DType::F32 || kv16);
      bool vvec = (CPL == 1 || CPL == 2 || CPL == 4) && Nc % CPL == 0 && (vs == DType::F32 || kv16);
      std::string RWs = std::to_string(RW), CP = std::to_string(CPL), DC = std::to_string(Dc);
      std::string DQ = std::to_string((Dc + 3) / 4 * 4);
      std::string QN = std::to_string((RW * Dc + 127) / 128), RD = std::to_string(RW * Dc);
      std::string ksr = kv.stride(Rq - 2), vsr = v.stride(Rv - 1);  // (a key's and a value row's strides)
      std::vector<std::string> dargs = args;
      dargs.push_back("tk");  // the tickets: per tile of rows, how many of its key ranges are done (see below)
      // Both decode kernels' start (`shared`: their shared arrays; Ms, Ls and As hold the warps' partial rows, As
      // `nc` columns a row) and end (decode_tail).
      auto decode_head = [&](const std::string& shared, int nc) {
        Text h;
        h << "extern \"C\" __global__ __launch_bounds__(128) void NAME" << params(dargs) << " {\n" << shared
          << "  __shared__ float Ms[4][" << RWs << "], Ls[4][" << RWs << "], As[4][" << RWs << "][" << nc << "];\n"
          << "  __shared__ bool last_;\n"
          << aliases << "  i64 T = p[2], N = " << P(1) << ", Tq = " << P(2) << ", B = " << P(3) << ", nsplit = " << P(4)
          << ", chunk = " << P(5) << ";\n"
          << "  int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;\n"
          << "  const float c_ = " << lit(sm->c, true) << ", ninf = -__int_as_float(0x7f800000);\n"
          << "  i64 jlo = (i64)blockIdx.z * chunk, jhi = min(T, jlo + chunk);\n"
          << "  for (i64 b = blockIdx.y; b < B; b += gridDim.y) {\n"
          << "    i64 t0 = (i64)blockIdx.x * " << RWs << ", rb_ = b * Tq + t0, qb, kb, vb;\n"
          << qk_bases("rb_") << v_base("rb_") << "    __syncthreads();\n";
        return h.str();
      };
      auto decode_tail = [&](int nc) {
        std::string NCs = std::to_string(nc), cells = std::to_string(RW * nc);
        Text t;
        // The warps' partial rows merged (rescaled to their common max): the normalised rows, or this key range's
        // partial result for the combine.
        t << "    __syncthreads();\n    float* o_ = (float*)out;\n    float* w_ = (float*)ws;\n"
          << "    for (int x = tid; x < " << cells << "; x += 128) {\n"
          << "      int r = x / " << NCs << ", c = x % " << NCs << ";\n"
          << "      if (c >= N || t0 + r >= Tq) continue;\n"
          << "      float M = op_max(op_max(Ms[0][r], Ms[1][r]), op_max(Ms[2][r], Ms[3][r])), mu = M == ninf ? 0.0f : M;\n"
          << "      float L = 0.0f, a = 0.0f;\n#pragma unroll\n      for (int u = 0; u < 4; ++u) {\n"
          << "        float sc = op_exp2((Ms[u][r] - mu) * c_);\n        L += Ls[u][r] * sc;\n        a += As[u][r][c] * sc;\n"
          << "      }\n      i64 row = rb_ + r;\n"
          << "      if (nsplit == 1) o_[row * N + c] = a * (1.0f / L);\n"
          << "      else {\n        float* part = w_ + (row * nsplit + blockIdx.z) * (N + 2);\n"
          << "        if (c == 0) { part[0] = M; part[1] = L; }\n        part[2 + c] = a;\n      }\n    }\n";
        // Split keys: the tile's last range to finish (its ticket, counted after the block's partial rows are
        // visible device-wide) merges every range's rows (as combine_fn does) and sets the ticket back to 0 for the
        // next launch, so that no combine kernel follows (a launch and a wait per layer in a decode step). Without
        // tickets (null: LUMINAL_CUDA_DECODE_TICKETS=0) combine_fn merges them.
        t << "    if (nsplit > 1 && tk) {\n      __threadfence();\n      __syncthreads();\n"
          << "      if (tid == 0) {\n        unsigned* t_ = (unsigned*)tk + b * gridDim.x + blockIdx.x;\n"
          << "        last_ = atomicAdd(t_, 1u) == (unsigned)(nsplit - 1);\n        if (last_) *t_ = 0u;\n      }\n"
          << "      __syncthreads();\n      if (last_) {\n        __threadfence();\n"
          << "        for (int x = tid; x < " << cells << "; x += 128) {\n"
          << "          int r = x / " << NCs << ", c = x % " << NCs << ";\n"
          << "          if (c >= N || t0 + r >= Tq) continue;\n"
          << "          i64 row = rb_ + r;\n          const float* wr = w_ + row * nsplit * (N + 2);\n"
          << merge_ranges("wr", "c", "__ldcg", "          ")  // (L2: other blocks wrote them)
          << "          o_[row * N + c] = a * (1.0f / L);\n        }\n      }\n    }\n  }\n}\n";
        return t.str();
      };
      // On tensor cores, where k and v are 16-bit in the compute dtype and the head sizes allow (FlashDecodeMma; the
      // runtime takes it for 16-byte aligned rows): per 32-key tile a warp computes S^T = K Q^T (keys as the
      // products' rows, query rows as their 8 columns, 4 of them used) and O^T += V^T P^T (v's columns as rows).
      // The sums run over head dims and keys, so each lane's fragments may take them in any order both operands
      // share: lane (g, q4) holds, of key rows g + 8h, the head dims q4 * DL.. (DL = Dc / 4: 16-byte loads), as
      // k-step s's pairs 4s, 4s + 1 and 4s + 2, 4s + 3; and, of value rows 2q4, 2q4 + 1, 2q4 + 8, 2q4 + 9 of each 16
      // keys, the columns g * CW.. (CW = Nc / 8), as m-tile t's columns g * CW + 2t, + 1 (byte permutes pair two
      // keys' values). q's fragments stay in registers; P goes through shared memory (the products' layouts
      // differ). q and P are rounded to the compute dtype, as in the prefill kernels.
      if ((compute_ == DType::BF16 || compute_ == DType::F16) && ks == compute_ && vs == compute_ && Dc % 32 == 0 &&
          Nc % 64 == 0) {
        const int DL = Dc / 4, DS = Dc / 16, CW = Nc / 8, NM = Nc / 16;
        std::string ct = compute_ == DType::BF16 ? "bf16" : "f16", tname = dtype_name(compute_);
        std::string cv = compute_ == DType::BF16 ? "f32_bf16" : "f32_f16";
        std::string sDL = std::to_string(DL), sDS = std::to_string(DS), sCW = std::to_string(CW), sNM = std::to_string(NM);
        std::string mma = mma_16816(ct), qs = q.stride(Rq - 1);
        Text m;
        m << decode_head("  __shared__ __align__(16) u16 Pt[4][8][40];\n", Nc)
          << "    int g = lane >> 2, q4 = lane & 3;\n"
          // q's fragments: row g (the products' column; past RW or Tq: zeros), head dims q4 * DL..
          << "    unsigned bq[" << sDS << "][2];\n    {\n    float qv[" << sDL << "];\n#pragma unroll\n"
          << "    for (int d = 0; d < " << sDL << "; ++d) qv[d] = 0.0f;\n"
          << "    if (g < " << RWs << " && t0 + g < Tq) {\n      i64 row = rb_ + g;\n" << unravel(st.views[0], 0, Rq - 2, "row", "a")
          << "      i64 qr_ = " << view_base(q, "a", Rq - 2) << " + (i64)(q4 * " << sDL << ") * " << qs << ";\n#pragma unroll\n"
          << "      for (int d = 0; d < " << sDL << "; ++d) qv[d] = " << ld(0) << "qr_ + d * " << qs << ");\n    }\n"
          << "#pragma unroll\n    for (int s = 0; s < " << sDS << "; ++s) {\n      bq[s][0] = pack_" << tname
          << "(qv[4 * s], qv[4 * s + 1]);\n      bq[s][1] = pack_" << tname << "(qv[4 * s + 2], qv[4 * s + 3]);\n    }\n    }\n";
        // The lane's two rows, 2q4 and 2q4 + 1: their indices into the program's inputs (past RW or Tq: 0s).
        for (int e = 0; e < 2 && Rp > 1; ++e) {
          std::string E = std::to_string(e);
          for (int d = 0; d + 1 < Rp; ++d) m << "    i64 y" << E << "_" << d << " = 0;\n";
          m << "    if (2 * q4 + " << E << " < " << RWs << " && t0 + 2 * q4 + " << E << " < Tq) {\n"
            << unravel(st.views[3], 0, Rp - 1, "rb_ + 2 * q4 + " + E, "u");
          for (int d = 0; d + 1 < Rp; ++d) m << "    y" << E << "_" << d << " = u" << d << ";\n";
          m << "    }\n";
        }
        m << "    float m_[2] = {ninf, ninf}, l_[2] = {0.0f, 0.0f}, acc_[" << sNM << "][4];\n#pragma unroll\n"
          << "    for (int t = 0; t < " << sNM << "; ++t) acc_[t][0] = acc_[t][1] = acc_[t][2] = acc_[t][3] = 0.0f;\n"
          << "    for (i64 j0 = jlo + w * 32; j0 < jhi; j0 += 128) {\n"
          // (keys past the range: the range's last, weighted 0)
          << "      unsigned kw[4][" << DL / 2 << "], vw[2][4][" << NM << "];\n#pragma unroll\n      for (int h = 0; h < 4; ++h) {\n"
          << "        const u16* kp = (const u16*)e1 + kb + min(j0 + g + 8 * h, jhi - 1) * " << ksr << " + q4 * " << sDL << ";\n"
          << "#pragma unroll\n        for (int c = 0; c < " << DL / 8 << "; ++c) {\n          uint4 t_ = *(const uint4*)(kp + c * 8);\n"
          << "          kw[h][4 * c] = t_.x; kw[h][4 * c + 1] = t_.y;\n"
          << "          kw[h][4 * c + 2] = t_.z; kw[h][4 * c + 3] = t_.w;\n        }\n      }\n"
          << "#pragma unroll\n      for (int ks = 0; ks < 2; ++ks)\n#pragma unroll\n        for (int kk = 0; kk < 4; ++kk) {\n"
          << "          const u16* vp = (const u16*)e2 + vb + min(j0 + 16 * ks + 2 * q4 + (kk & 1) + 8 * (kk >> 1), jhi - 1) * "
          << vsr << " + g * " << sCW << ";\n#pragma unroll\n"
          << "          for (int c = 0; c < " << CW / 8 << "; ++c) {\n            uint4 t_ = *(const uint4*)(vp + c * 8);\n"
          << "            vw[ks][kk][4 * c] = t_.x; vw[ks][kk][4 * c + 1] = t_.y; vw[ks][kk][4 * c + 2] = t_.z; "
             "vw[ks][kk][4 * c + 3] = t_.w;\n          }\n        }\n"
          // S^T: keys 16mt + g (+8) against the rows
          << "      float sc[2][4];\n#pragma unroll\n      for (int mt = 0; mt < 2; ++mt) {\n"
          << "        sc[mt][0] = sc[mt][1] = sc[mt][2] = sc[mt][3] = 0.0f;\n#pragma unroll\n"
          << "        for (int s = 0; s < " << sDS << "; ++s) {\n          float* C = sc[mt];\n"
          << "          unsigned A[4] = {kw[2 * mt][2 * s], kw[2 * mt + 1][2 * s],\n"
          << "                           kw[2 * mt][2 * s + 1], kw[2 * mt + 1][2 * s + 1]};\n"
          << "          unsigned B0 = bq[s][0], B1 = bq[s][1];\n          " << mma << "\n        }\n      }\n"
          << "      float x_[2][2][2];\n";
        // The program at each of the lane's scores: key 16mt + g + 8hh, row 2q4 + e (C[2hh + e]).
        for (int mt = 0; mt < 2; ++mt)
          for (int hh = 0; hh < 2; ++hh)
            for (int e = 0; e < 2; ++e) {
              std::string key = "j0 + " + std::to_string(16 * mt + 8 * hh) + " + g";
              std::vector<std::string> idx;
              m << "      {\n";
              for (int d = 0; d + 1 < Rp; ++d) {
                m << "      i64 i" << d << " = y" << e << "_" << d << ";\n";
                idx.push_back("i" + std::to_string(d));
              }
              m << "      i64 " << jn << " = min(" << key << ", jhi - 1);\n";
              idx.push_back(jn);
              m << body_of(idx, prog.needed_for(size_t(sm->x)), size_t(-1),
                           "sc[" + std::to_string(mt) + "][" + std::to_string(2 * hh + e) + "]")
                << "      x_[" << mt << "][" << hh << "][" << e << "] = " << key << " < jhi ? (float)r" << sm->x
                << " : ninf;\n      }\n";
            }
        // Each row's online softmax over the tile (its 32 keys: the lane's 4 and lane bits 2-4), P to Pt.
        m << "      float al_[2];\n#pragma unroll\n      for (int e = 0; e < 2; ++e) {\n"
          << "        float mx = op_max(op_max(x_[0][0][e], x_[0][1][e]), op_max(x_[1][0][e], x_[1][1][e]));\n"
          << "#pragma unroll\n        for (int o = 4; o < 32; o <<= 1) mx = op_max(mx, __shfl_xor_sync(0xffffffffu, mx, o));\n"
          << "        float mn = op_max(m_[e], mx), mu = mn == ninf ? 0.0f : mn, sum = 0.0f;\n"
          << "        al_[e] = op_exp2((m_[e] - mu) * c_);\n#pragma unroll\n        for (int mt = 0; mt < 2; ++mt)\n#pragma unroll\n"
          << "          for (int hh = 0; hh < 2; ++hh) {\n            float pe = op_exp2((x_[mt][hh][e] - mu) * c_);\n"
          << "            sum += pe;\n            Pt[w][2 * q4 + e][16 * mt + 8 * hh + g] = " << cv << "(pe);\n          }\n"
          << "#pragma unroll\n        for (int o = 4; o < 32; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);\n"
          << "        l_[e] = l_[e] * al_[e] + sum;\n        m_[e] = mn;\n      }\n#pragma unroll\n"
          << "      for (int t = 0; t < " << sNM << "; ++t) {\n        acc_[t][0] *= al_[0]; acc_[t][1] *= al_[1];\n"
          << "        acc_[t][2] *= al_[0]; acc_[t][3] *= al_[1];\n      }\n      __syncwarp();\n"
          // O^T += V^T P^T over the tile's two 16-key steps
          << "#pragma unroll\n      for (int ks = 0; ks < 2; ++ks) {\n"
          << "        unsigned B0 = *(const unsigned*)&Pt[w][g][16 * ks + 2 * q4],\n"
          << "                 B1 = *(const unsigned*)&Pt[w][g][16 * ks + 2 * q4 + 8];\n"
          << "#pragma unroll\n        for (int t = 0; t < " << sNM << "; ++t) {\n          float* C = acc_[t];\n"
          << "          unsigned A[4] = {__byte_perm(vw[ks][0][t], vw[ks][1][t], 0x5410u),\n"
          << "                           __byte_perm(vw[ks][0][t], vw[ks][1][t], 0x7632u),\n"
          << "                           __byte_perm(vw[ks][2][t], vw[ks][3][t], 0x5410u),\n"
          << "                           __byte_perm(vw[ks][2][t], vw[ks][3][t], 0x7632u)};\n"
          << "          " << mma << "\n        }\n      }\n      __syncwarp();\n    }\n"
          // the lanes holding rows 2q4, 2q4 + 1 < RW: their partial rows
          << "    if (2 * q4 < " << RWs << ") {\n      if (g == 0) {\n"
          << "        Ms[w][2 * q4] = m_[0]; Ms[w][2 * q4 + 1] = m_[1]; Ls[w][2 * q4] = l_[0]; Ls[w][2 * q4 + 1] = l_[1];\n      }\n"
          << "#pragma unroll\n      for (int t = 0; t < " << sNM << "; ++t) {\n"
          << "        int c = g * " << sCW << " + 2 * t;\n"
          << "        As[w][2 * q4][c] = acc_[t][0]; As[w][2 * q4 + 1][c] = acc_[t][1];\n"
          << "        As[w][2 * q4][c + 1] = acc_[t][2]; As[w][2 * q4 + 1][c + 1] = acc_[t][3];\n      }\n    }\n"
          << decode_tail(Nc);
        st.variants.push_back({Variant::FlashDecodeMma, add_kernel(m.str(), st.nparams)});
      }
      Text f;
      f << decode_head("  __shared__ __align__(16) float Qs[" + RWs + "][" + DQ + "];\n  __shared__ __align__(16) float Ps[4][" +
                           RWs + "][32];\n", 32 * CPL)
        << "  bool vk = " << (kvec ? P(6) : "0") << " != 0, vv_ = " << (vvec ? P(6) : "0") << " != 0;\n"
        // q's rows: a thread's loads all issued, then stored
        << "    {\n    float qv_[" << QN << "];\n#pragma unroll\n    for (int u = 0; u < " << QN << "; ++u) {\n"
        << "      int x = tid + u * 128, rr = x / " << DC << ", d = x % " << DC << ";\n      qv_[u] = 0.0f;\n"
        << "      if (x < " << RD << " && t0 + rr < Tq) {\n        i64 row = rb_ + rr;\n"
        << unravel(st.views[0], 0, Rq - 2, "row", "a") << "        qv_[u] = " << ld(0) << view_base(q, "a", Rq - 2)
        << " + d * " << q.stride(Rq - 1) << ");\n      }\n    }\n"
        << "#pragma unroll\n    for (int u = 0; u < " << QN << "; ++u) {\n      int x = tid + u * 128;\n"
        << "      if (x < " << RD << ") Qs[x / " << DC << "][x % " << DC << "] = qv_[u];\n    }\n    }\n"
        << "    float m_[" << RWs << "], l_[" << RWs << "], acc_[" << RWs << "][" << CP << "];\n"
        << "#pragma unroll\n    for (int r = 0; r < " << RWs << "; ++r) {\n      m_[r] = ninf;\n      l_[r] = 0.0f;\n"
        << "#pragma unroll\n      for (int u = 0; u < " << CP << "; ++u) acc_[r][u] = 0.0f;\n    }\n";
      // Each row's indices into the program's inputs (a row past Tq: 0s; it runs along, never stored).
      for (int i = 0; i < RW && Rp > 1; ++i) {
        std::string I = std::to_string(i);
        for (int d = 0; d + 1 < Rp; ++d) f << "    i64 x" << I << "_" << d << " = 0;\n";
        f << "    if (t0 + " << I << " < Tq) {\n" << unravel(st.views[3], 0, Rp - 1, "rb_ + " + I, "u");
        for (int d = 0; d + 1 < Rp; ++d) f << "    x" << I << "_" << d << " = u" << d << ";\n";
        f << "    }\n";
      }
      f << "    __syncthreads();\n"
        << "    for (i64 j0 = jlo + w * 32; j0 < jhi; j0 += 128) {\n"
        << "      i64 j = j0 + lane, jc = min(j, jhi - 1);\n";
      // A 16-bit V tile (32 rows of CPL values per lane, 2 to 8 bytes each) is loaded into registers first: its
      // latency runs under the scores and the softmax. (A lane past N reads column 0 and stores nothing.)
      std::string vt16;
      if (vvec && vs != DType::F32) vt16 = CPL == 4 ? "uint2" : CPL == 2 ? "unsigned" : "u16";
      if (!vt16.empty())
        f << "      " << vt16 << " vr_[32];\n      if (vv_) {\n        i64 vc_ = lane * " << CP << " < N ? lane * " << CP
          << " : 0;\n#pragma unroll\n        for (int jj = 0; jj < 32; ++jj)\n          vr_[jj] = *(const " << vt16
          << "*)((const u16*)e2 + vb + min(j0 + jj, jhi - 1) * " << vsr << " + vc_);\n      }\n";
      f << "      float s[" << RWs << "];\n#pragma unroll\n      for (int r = 0; r < " << RWs << "; ++r) s[r] = 0.0f;\n";
      if (kvec)
        f << "      if (vk) {\n#pragma unroll\n        for (int d8 = 0; d8 < " << Dc / 8 << "; ++d8) {\n"
          << "          float kx[8];\n          ld8_" << dtype_name(ks) << "(e1, kb + jc * " << ksr << " + d8 * 8, kx);\n"
          << "#pragma unroll\n          for (int u = 0; u < 8; ++u)\n#pragma unroll\n"
          << "            for (int r = 0; r < " << RWs << "; ++r) s[r] += Qs[r][d8 * 8 + u] * kx[u];\n"
          << "        }\n      } else\n";
      f << "#pragma unroll 4\n      for (int d = 0; d < " << DC << "; ++d) {\n        float kx = " << ld(1) << "kb + jc * "
        << ksr << " + d * " << kv.stride(Rq - 1) << ");\n#pragma unroll\n"
        << "        for (int r = 0; r < " << RWs << "; ++r) s[r] += Qs[r][d] * kx;\n      }\n"
        << "      float x_[" << RWs << "];\n";
      // The program at each row's score (past the range: -inf, weight 0).
      for (int i = 0; i < RW; ++i) {
        std::string I = std::to_string(i);
        std::vector<std::string> idx;
        f << "      {\n";
        for (int d = 0; d + 1 < Rp; ++d) {
          f << "      i64 i" << d << " = x" << I << "_" << d << ";\n";
          idx.push_back("i" + std::to_string(d));
        }
        f << "      i64 " << jn << " = jc;\n";
        idx.push_back(jn);
        f << body_of(idx, prog.needed_for(size_t(sm->x)), size_t(-1), "s[" + I + "]") << "      x_[" << I
          << "] = j < jhi ? (float)r" << sm->x << " : ninf;\n      }\n";
      }
      // The rows' online softmax (independent: their reductions interleave), the tile's weights to Ps.
      f << "#pragma unroll\n      for (int r = 0; r < " << RWs << "; ++r) {\n"
        << "        float mn = op_max(m_[r], warp_max(x_[r])), mu = mn == ninf ? 0.0f : mn;\n"
        << "        float al = op_exp2((m_[r] - mu) * c_), pe = op_exp2((x_[r] - mu) * c_);\n"
        << "        l_[r] = l_[r] * al + warp_sum(pe);\n        m_[r] = mn;\n"
        << "#pragma unroll\n        for (int u = 0; u < " << CP << "; ++u) acc_[r][u] *= al;\n"
        << "        Ps[w][r][lane] = pe;\n      }\n      __syncwarp();\n";
      // V's tile weighted: from the registers (16-bit), else a rolled loop of vector loads (float32) or of
      // elements. (The weights' shared loads merge into 16-byte ones.)
      auto accumulate = [&](const std::string& pw, const std::string& in) {
        return in + "#pragma unroll\n" + in + "for (int r = 0; r < " + RWs + "; ++r)\n" + in + "#pragma unroll\n" + in +
               "  for (int u = 0; u < " + CP + "; ++u) acc_[r][u] += " + pw + " * vv[u];\n";
      };
      if (!vt16.empty()) {
        std::string cvt = vs == DType::BF16 ? "bf16_f32" : "f16_f32";
        f << "      if (vv_) {\n#pragma unroll\n        for (int jj = 0; jj < 32; ++jj) {\n"
          << "          " << vt16 << " t_ = vr_[jj];\n          float vv[" << CP << "];\n";
        if (CPL == 1) f << "          vv[0] = " << cvt << "(t_);\n";
        else if (CPL == 2) f << "          vv[0] = " << cvt << "((u16)t_); vv[1] = " << cvt << "((u16)(t_ >> 16));\n";
        else
          f << "          vv[0] = " << cvt << "((u16)t_.x); vv[1] = " << cvt << "((u16)(t_.x >> 16));\n"
            << "          vv[2] = " << cvt << "((u16)t_.y); vv[3] = " << cvt << "((u16)(t_.y >> 16));\n";
        f << accumulate("Ps[w][r][jj]", "          ") << "        }\n      } else\n";
      }
      f << "#pragma unroll 2\n      for (int jj = 0; jj < 32; ++jj) {\n        i64 jv = min(j0 + jj, jhi - 1);\n"
        << "        float vv[" << CP << "];\n";
      if (vvec && vs == DType::F32) {
        const char* vt = CPL == 4 ? "float4" : CPL == 2 ? "float2" : "float";
        f << "        if (vv_) {\n          " << vt << " t_ = *(const " << vt << "*)((const float*)e2 + vb + jv * " << vsr
          << " + (lane * " << CP << " < N ? lane * " << CP << " : 0));\n";
        if (CPL == 1) f << "          vv[0] = t_;\n";
        else f << "          vv[0] = t_.x; vv[1] = t_.y;\n" << (CPL == 4 ? "          vv[2] = t_.z; vv[3] = t_.w;\n" : "");
        f << "        } else\n";
      }
      f << "#pragma unroll\n        for (int u = 0; u < " << CP << "; ++u) {\n          i64 c = lane * " << CP << " + u;\n"
        << "          vv[u] = c < N ? " << ld(2) << "vb + c * " << v.stride(Rv - 2) << " + jv * " << vsr << ") : 0.0f;\n"
        << "        }\n" << accumulate("Ps[w][r][jj]", "        ") << "      }\n      __syncwarp();\n    }\n";
      f << "    if (lane == 0) {\n#pragma unroll\n      for (int r = 0; r < " << RWs << "; ++r) { Ms[w][r] = m_[r]; Ls[w][r] = l_[r]; }\n    }\n"
        << "#pragma unroll\n    for (int r = 0; r < " << RWs << "; ++r)\n#pragma unroll\n      for (int u = 0; u < " << CP
        << "; ++u) As[w][r][lane * " << CP << " + u] = acc_[r][u];\n" << decode_tail(32 * CPL);
      st.variants.push_back({Variant::FlashDecode, add_kernel(f.str(), st.nparams)});
    }
  }
  if (sm && !dbl) {
    const int W = 4;  // rows per warp
    Text f;
    f << "extern \"C\" __global__ __launch_bounds__(128) void NAME" << params(args) << " {\n"
      << "  __shared__ float Qs[16][128], Ks[32][129];\n  __shared__ __align__(16) float Vs[32][128];\n" << aliases
      << "  i64 T = p[2], D = " << P(0) << ", N = " << P(1) << ", Tq = " << P(2) << ", B = " << P(3)
      << ", nsplit = " << P(4) << ", chunk = " << P(5) << ";\n"
      << "  int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;\n"
      << "  const float c_ = " << lit(sm->c, true) << ", ninf = -__int_as_float(0x7f800000);\n"
      << "  i64 jlo = (i64)blockIdx.z * chunk, jhi = min(T, jlo + chunk);\n"
      << "  for (i64 b = blockIdx.y; b < B; b += gridDim.y) {\n"
      << "    i64 t0 = (i64)blockIdx.x * 16, rb_ = b * Tq + t0, qb, kb, vb;\n"
      << qk_bases("rb_") << v_base("rb_")
      << "    __syncthreads();\n"
      << "    for (int x = tid; x < 16 * 128; x += 128) {\n"
      << "      int rr = x >> 7, d = x & 127;\n      float val = 0.0f;\n"
      << "      if (d < D && t0 + rr < Tq) {\n        i64 row = rb_ + rr;\n"
      << unravel(st.views[0], 0, Rq - 2, "row", "a") << "        val = " << ld(0) << view_base(q, "a", Rq - 2) << " + d * "
      << q.stride(Rq - 1) << ");\n      }\n      Qs[rr][d] = val;\n    }\n";
    for (int i = 0; i < W; ++i) {
      std::string I = std::to_string(i);
      f << "    i64 row" << I << " = rb_ + w * " << W << " + " << I << ";\n    bool ok" << I << " = t0 + w * " << W
        << " + " << I << " < Tq;\n    float m" << I << " = ninf, l" << I << " = 0.0f, acc" << I
        << "[4] = {0.0f, 0.0f, 0.0f, 0.0f};\n";
      for (int d = 0; d + 1 < Rp; ++d) f << "    i64 x" << I << "_" << d << " = 0;\n";
      if (Rp > 1) {
        f << "    if (ok" << I << ") {\n" << unravel(st.views[3], 0, Rp - 1, "row" + I, "u");
        for (int d = 0; d + 1 < Rp; ++d) f << "    x" << I << "_" << d << " = u" << d << ";\n";
        f << "    }\n";
      }
    }
    f << "    for (i64 j0 = jlo; j0 < jhi; j0 += 32) {\n      __syncthreads();\n";
    if (f32kv)  // p[E + 6]: rows of k and v contiguous and 16-byte aligned: 16-byte loads, all 16 in flight
      f << "      if (" << P(6) << ") {\n#pragma unroll\n        for (int u = 0; u < 8; ++u) {\n"
        << "          int x = tid + u * 128, jj = x >> 5, d = (x & 31) * 4;\n          i64 j = j0 + jj;\n"
        << "          float4 kx = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vx = kx;\n"
        << "          if (j < jhi) {\n            if (d < D) kx = *(const float4*)((const float*)e1 + kb + j * "
        << kv.stride(Rq - 2) << " + d);\n            if (d < N) vx = *(const float4*)((const float*)e2 + vb + j * "
        << v.stride(Rv - 1) << " + d);\n          }\n"
        << "          Ks[jj][d] = kx.x; Ks[jj][d + 1] = kx.y; Ks[jj][d + 2] = kx.z; Ks[jj][d + 3] = kx.w;\n"
        << "          *(float4*)&Vs[jj][d] = vx;\n        }\n      } else\n";
    f << "      for (int x = tid; x < 32 * 128; x += 128) {\n        int jj = x >> 7, d = x & 127;\n"
      << "        i64 j = j0 + jj;\n        float kx = 0.0f, vx = 0.0f;\n"
      << "        if (j < jhi) {\n          if (d < D) kx = " << ld(1) << "kb + j * " << kv.stride(Rq - 2) << " + d * "
      << kv.stride(Rq - 1) << ");\n          if (d < N) vx = " << ld(2) << "vb + d * " << v.stride(Rv - 2) << " + j * "
      << v.stride(Rv - 1) << ");\n        }\n        Ks[jj][d] = kx;\n        Vs[jj][d] = vx;\n      }\n"
      << "      __syncthreads();\n      i64 j = j0 + lane;\n      float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;\n"
      << "#pragma unroll 4\n      for (int d = 0; d < D; ++d) {\n        float kk = Ks[lane][d];\n"
      << "        s0 += Qs[w * 4][d] * kk;\n        s1 += Qs[w * 4 + 1][d] * kk;\n"
      << "        s2 += Qs[w * 4 + 2][d] * kk;\n        s3 += Qs[w * 4 + 3][d] * kk;\n      }\n";
    for (int i = 0; i < W; ++i) f << online_row(i, "s" + std::to_string(i), "cc", "4");
    f << "#pragma unroll 4\n      for (int jj = 0; jj < 32; ++jj) {\n"
      << "        float p0 = __shfl_sync(0xffffffffu, pe0, jj), p1 = __shfl_sync(0xffffffffu, pe1, jj);\n"
      << "        float p2 = __shfl_sync(0xffffffffu, pe2, jj), p3 = __shfl_sync(0xffffffffu, pe3, jj);\n"
      << "#pragma unroll\n        for (int cc = 0; cc < 4; ++cc) {\n          float vv = Vs[jj][lane + 32 * cc];\n"
      << "          acc0[cc] += p0 * vv;\n          acc1[cc] += p1 * vv;\n          acc2[cc] += p2 * vv;\n"
      << "          acc3[cc] += p3 * vv;\n        }\n      }\n    }\n";
    // The rows: normalised, or this key range's partial result (max, sum, unnormalised row) for the combine.
    f << "    float* o_ = (float*)out;\n    float* w_ = (float*)ws;\n";
    for (int i = 0; i < W; ++i) {
      std::string I = std::to_string(i);
      f << "    if (ok" << I << ") {\n      if (nsplit == 1) {\n        float inv = 1.0f / l" << I << ";\n"
        << "#pragma unroll\n        for (int cc = 0; cc < 4; ++cc) {\n          i64 nn = lane + 32 * cc;\n"
        << "          if (nn < N) o_[row" << I << " * N + nn] = acc" << I << "[cc] * inv;\n        }\n"
        << "      } else {\n        float* part = w_ + (row" << I << " * nsplit + blockIdx.z) * (N + 2);\n"
        << "        if (lane == 0) { part[0] = m" << I << "; part[1] = l" << I << "; }\n"
        << "#pragma unroll\n        for (int cc = 0; cc < 4; ++cc) {\n          i64 nn = lane + 32 * cc;\n"
        << "          if (nn < N) part[2 + nn] = acc" << I << "[cc];\n        }\n      }\n    }\n";
    }
    f << "  }\n}\n";
    st.variants.push_back({Variant::Flash, add_kernel(f.str())});
    // The combine: per output element, the ranges' rows rescaled to the common max.
    Text c;
    c << "extern \"C\" __global__ void NAME" << params(std::vector<std::string>{"ws"}) << " {\n"
      << "  i64 N = " << P(1) << ", nsplit = " << P(4) << ";\n"
      << "  if (nsplit == 1) return;  // (a CUDA graph keeps this launch when the keys are not split)\n"
      << "  const float c_ = " << lit(sm->c, true) << ", ninf = -__int_as_float(0x7f800000);\n"
      << "  for (i64 t = blockIdx.x * (i64)blockDim.x + threadIdx.x; t < p[1] * N; t += (i64)gridDim.x * blockDim.x) {\n"
      << "    i64 row = t / N, nn = t % N;\n    const float* w_ = (const float*)ws + row * nsplit * (N + 2);\n"
      << merge_ranges("w_", "nn", "", "    ") << "    ((float*)out)[t] = a * (1.0f / L);\n  }\n}\n";
    st.combine_fn = add_kernel(c.str(), st.nparams);
  }

  // Any program: a block per row.
  Text g;
  g << "extern \"C\" __global__ __launch_bounds__(256) void NAME" << params(args) << " {\n"
    << "  __shared__ " << T << " part[32];\n  __shared__ float pj_[256];\n" << aliases
    << "  i64 T = p[2], D = " << P(0) << ", N = " << P(1) << ";\n  float* o_ = (float*)out;\n"
    << "  for (i64 row = blockIdx.x; row < p[1]; row += gridDim.x) {\n    i64 qb, kb, vb;\n"
    << qk_bases("row") << v_base("row");
  if (Rp > 1) g << unravel(st.views[3], 0, Rp - 1, "row");
  std::vector<std::string> idx = names("i", 0, Rp);
  if (!Rp) idx.push_back(jn);
  std::string score = "    float s_ = 0.0f;\n    for (i64 d = 0; d < D; ++d) s_ += " + ld(0) + "qb + " + jn + " * " +
                      q.stride(Rq - 2) + " + d * " + q.stride(Rq - 1) + ") * " + ld(1) + "kb + " + jn + " * " +
                      kv.stride(Rq - 2) + " + d * " + kv.stride(Rq - 1) + ");\n";
  for (size_t i = 0; i < prog.code.size(); ++i) {
    const Instr& in = prog.code[i];
    if (in.kind != Instr::Reduce) continue;
    bool sum = in.op == Op::SumReduce;
    g << "    " << T << " k" << int(i) << ";\n    {\n    " << T << " acc = " << (sum ? "(" + T + ")0" : lit(-INFINITY, !dbl))
      << ";\n    for (i64 " << jn << " = threadIdx.x; " << jn << " < T; " << jn << " += blockDim.x) {\n" << score
      << body_of(idx, prog.needed_for(i), i, "s_") << "    acc = " << (sum ? "acc + r" : "op_max(acc, r") << in.a
      << (sum ? "" : ")") << ";\n    }\n    k" << int(i) << " = rd_" << dtype_name(in.dtype) << "<" << T
      << ">(block_reduce(acc, " << (sum ? "true" : "false") << ", part));\n    }\n";
  }
  size_t last = prog.code.size() - 1;
  g << "    for (i64 nn = threadIdx.x; nn < N; nn += blockDim.x) o_[row * N + nn] = 0.0f;\n"
    << "    for (i64 j0 = 0; j0 < T; j0 += blockDim.x) {\n      float pj = 0.0f;\n"
    << "      { i64 " << jn << " = j0 + threadIdx.x;\n      if (" << jn << " < T) {\n" << score
    << body_of(idx, prog.needed_for(last), size_t(-1), "s_") << "      pj = (float)r" << int(last) << ";\n      } }\n"
    << "      __syncthreads();\n      pj_[threadIdx.x] = pj;\n      __syncthreads();\n"
    << "      int cnt = (int)min((i64)blockDim.x, T - j0);\n"
    << "      for (i64 nn = threadIdx.x; nn < N; nn += blockDim.x) {\n        float a = o_[row * N + nn];\n"
    << "        for (int jj = 0; jj < cnt; ++jj) a += pj_[jj] * " << ld(2) << "vb + nn * " << v.stride(Rv - 2)
    << " + (j0 + jj) * " << v.stride(Rv - 1) << ");\n        o_[row * N + nn] = a;\n      }\n    }\n  }\n}\n";
  st.variants.push_back({Variant::AttentionRows, add_kernel(g.str())});
}

// What flash_mma and flash_tiles print alike (D8, D16: the head sizes' 8s and 16s): the tensor-core product
// C += A B; the thread's two rows (fragment rows g and g + 8 of its warp's 16: bases, validity, the program's row
// indices, then `row_extra` of each); q's A fragments and the accumulators; the program's element indices at row
// e >> 1, key j; the rows' end: the quad's sums, then normalised rows, or this key range's partial result.
FlashText Generator::flash_text(const Step& st, const Node& n, int DH,
                                const std::function<std::string(const std::string&)>& row_extra) const {
  int Rq = st.views[0].rank, Rp = n.inputs.size() > 3 ? st.views[3].rank : 0;
  ViewText q{st.views[0]};
  std::string ct = compute_ == DType::BF16 ? "bf16" : "f16", cv = compute_ == DType::BF16 ? "f32_bf16" : "f32_f16";
  std::string D16 = std::to_string(DH / 16), D8 = std::to_string(DH / 8);
  std::string ld0 = edge_load(n, 0);
  FlashText t;
  t.mma = mma_16816(ct);
  Text r;
  for (int h = 0; h < 2; ++h) {
    std::string H = std::to_string(h);
    r << "    i64 row" << H << " = rb_ + w * 16 + g + " << 8 * h << ", qb" << H << " = 0;\n"
      << "    bool ok" << H << " = t0 + w * 16 + g + " << 8 * h << " < Tq;\n";
    for (int d = 0; d + 1 < Rp; ++d) r << "    i64 x" << H << "_" << d << " = 0;\n";
    r << row_extra(H);
    r << "    if (ok" << H << ") {\n" << unravel(st.views[0], 0, Rq - 2, "row" + H, "a") << "    qb" << H << " = "
      << view_base(q, "a", Rq - 2) << ";\n";
    if (Rp > 1) {
      r << "    {\n" << unravel(st.views[3], 0, Rp - 1, "row" + H, "u");
      for (int d = 0; d + 1 < Rp; ++d) r << "    x" << H << "_" << d << " = u" << d << ";\n";
      r << "    }\n";
    }
    r << "    }\n";
  }
  t.rows = r.str();
  // Q's A fragments: a0 (row g, k q2..), a1 (row g+8, k q2..), a2 (row g, k q2+8..), a3 (row g+8, k q2+8..).
  Text qf;
  qf << "    unsigned qf[" << D16 << "][4];\n#pragma unroll\n    for (int ks = 0; ks < " << D16 << "; ++ks)\n"
     << "#pragma unroll\n      for (int e = 0; e < 4; ++e) {\n"
     << "        bool ok = (e & 1) ? ok1 : ok0;\n        i64 qb = (e & 1) ? qb1 : qb0;\n"
     << "        int c = ks * 16 + q2 + (e >> 1) * 8;\n"
     << "        float x0 = ok && c < D ? " << ld0 << "qb + c * " << q.stride(Rq - 1) << ") : 0.0f;\n"
     << "        float x1 = ok && c + 1 < D ? " << ld0 << "qb + (c + 1) * " << q.stride(Rq - 1) << ") : 0.0f;\n"
     << "        qf[ks][e] = (unsigned)" << cv << "(x0) | ((unsigned)" << cv << "(x1) << 16);\n      }\n"
     << "    float m0 = ninf, m1 = ninf, l0 = 0.0f, l1 = 0.0f, o[" << D8 << "][4];\n"
     << "#pragma unroll\n    for (int t = 0; t < " << D8 << "; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;\n";
  t.qf = qf.str();
  std::string jn = Rp ? "i" + std::to_string(Rp - 1) : "j_";
  for (int d = 0; d + 1 < Rp; ++d) {
    t.at += "    i64 i" + std::to_string(d) + " = (e >> 1) ? x1_" + std::to_string(d) + " : x0_" + std::to_string(d) + ";\n";
    t.idx.push_back("i" + std::to_string(d));
  }
  t.at += "    i64 " + jn + " = j;\n";
  t.idx.push_back(jn);
  Text e;
  e << "    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);\n    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);\n"
    << "    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);\n    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);\n"
    << "    float* o_ = (float*)out;\n    float* w_ = (float*)ws;\n";
  for (int h = 0; h < 2; ++h) {
    std::string H = std::to_string(h), e0 = std::to_string(2 * h), e1 = std::to_string(2 * h + 1);
    e << "    if (ok" << H << ") {\n      if (nsplit == 1) {\n        float inv = 1.0f / l" << H << ";\n"
      << "#pragma unroll\n        for (int t = 0; t < " << D8 << "; ++t) {\n          i64 c = t * 8 + q2;\n"
      << "          if (c < N) o_[row" << H << " * N + c] = o[t][" << e0 << "] * inv;\n"
      << "          if (c + 1 < N) o_[row" << H << " * N + c + 1] = o[t][" << e1 << "] * inv;\n        }\n"
      << "      } else {\n        float* part = w_ + (row" << H << " * nsplit + blockIdx.z) * (N + 2);\n"
      << "        if ((lane & 3) == 0) { part[0] = m" << H << "; part[1] = l" << H << "; }\n"
      << "#pragma unroll\n        for (int t = 0; t < " << D8 << "; ++t) {\n          i64 c = t * 8 + q2;\n"
      << "          if (c < N) part[2 + c] = o[t][" << e0 << "];\n"
      << "          if (c + 1 < N) part[3 + c] = o[t][" << e1 << "];\n        }\n      }\n    }\n";
  }
  e << "  }\n}\n";
  t.store = e.str();
  return t;
}

// Flash attention on tensor cores (mma.sync m16n8k16, q, k, p and v rounded to the 16-bit compute dtype, float32
// accumulators, as the tensor-core MatMul), the fallback of flash_tiles for any additive program: 16 query rows per
// warp, 8 warps per block, q fragments in registers; keys in tiles of 64: K (key-major) and V (transposed) staged in
// shared memory in the compute dtype, S = Q K^T in registers, the row program and the online softmax on S's
// fragments (a row spans the 4 lanes of a quad), then P, repacked in registers as the A operand, times V. DH: the
// head sizes rounded up to 16 (D, N <= DH). Same parameter slice, key ranges and workspace as Flash.
std::string Generator::flash_mma(const Step& st, const Node& n, const Step& ps, const Node& pn, const SoftmaxForm& sm,
                                 const std::string& aliases, const std::vector<std::string>& args, int DH) {
  const AttentionPlan& plan = op_as<AttentionOp>(n)->plan;
  const Program& prog = plan.prog;
  int E = st.nparams - 7, Rq = st.views[0].rank, Rv = st.views[2].rank;
  auto P = [&](int k) { return "p[" + std::to_string(E + k) + "]"; };
  ViewText kv{st.views[1]}, v{st.views[2]};
  auto ld = [&](int e) { return edge_load(n, e); };
  std::string cv = compute_ == DType::BF16 ? "f32_bf16" : "f32_f16";
  bool f32kv = storage(n.inputs[1].node) == DType::F32 && storage(n.inputs[2].node) == DType::F32;
  std::string D16 = std::to_string(DH / 16), D8 = std::to_string(DH / 8), DHs = std::to_string(DH);
  FlashText ft = flash_text(st, n, DH, [](const std::string&) { return std::string(); });
  const std::string& mma = ft.mma;
  Text f;
  f << "extern \"C\" __global__ __launch_bounds__(256) void NAME" << params(args) << " {\n"
    << "  __shared__ __align__(16) u16 Ks[64][" << DH + 8 << "], Vt[" << DHs << "][72];\n"
    << aliases
    << "  i64 T = p[2], D = " << P(0) << ", N = " << P(1) << ", Tq = " << P(2) << ", B = " << P(3)
    << ", nsplit = " << P(4) << ", chunk = " << P(5) << ";\n"
    << "  int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, q2 = (lane & 3) * 2;\n"
    << "  const float c_ = " << lit(sm.c, true) << ", ninf = -__int_as_float(0x7f800000);\n"
    << "  i64 jlo = (i64)blockIdx.z * chunk, jhi = min(T, jlo + chunk);\n"
    << "  for (i64 b = blockIdx.y; b < B; b += gridDim.y) {\n"
    << "    i64 t0 = (i64)blockIdx.x * 128, rb_ = b * Tq + t0, kb, vb;\n"
    << "    {\n" << unravel(st.views[0], 0, Rq - 2, "rb_", "a") << "    kb = " << view_base(kv, "a", Rq - 2) << ";\n    }\n"
    << "    {\n" << unravel(st.views[2], 0, Rv - 2, "rb_", "a") << "    vb = " << view_base(v, "a", Rv - 2) << ";\n    }\n";
  f << ft.rows << ft.qf
    << "    for (i64 j0 = jlo; j0 < jhi; j0 += 64) {\n      __syncthreads();\n";
  const std::string& at = ft.at;
  const std::vector<std::string>& idx = ft.idx;
  // The tiles: K as Ks[key][d], V transposed as Vt[n][key], in the compute dtype, zeros outside.
  if (f32kv)
    f << "      if (" << P(6) << ") {\n#pragma unroll 4\n        for (int x = tid; x < 64 * " << DH / 4
      << "; x += 256) {\n          int jj = x / " << DH / 4 << ", d = (x % " << DH / 4 << ") * 4;\n"
      << "          i64 j = j0 + jj;\n          float4 kx = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vx = kx;\n"
      << "          if (j < jhi) {\n            if (d < D) kx = *(const float4*)((const float*)e1 + kb + j * "
      << kv.stride(Rq - 2) << " + d);\n            if (d < N) vx = *(const float4*)((const float*)e2 + vb + j * "
      << v.stride(Rv - 1) << " + d);\n          }\n"
      << "          *(uint2*)&Ks[jj][d] = make_uint2((unsigned)" + cv + "(kx.x) | ((unsigned)" + cv +
             "(kx.y) << 16), (unsigned)" + cv + "(kx.z) | ((unsigned)" + cv + "(kx.w) << 16));\n"
      << "          Vt[d][jj] = " + cv + "(vx.x); Vt[d + 1][jj] = " + cv + "(vx.y); Vt[d + 2][jj] = " + cv +
             "(vx.z); Vt[d + 3][jj] = " + cv + "(vx.w);\n"
      << "        }\n      } else\n";
  f << "      for (int x = tid; x < 64 * " << DH << "; x += 256) {\n        int jj = x / " << DH << ", d = x % " << DH
    << ";\n        i64 j = j0 + jj;\n        float kx = 0.0f, vx = 0.0f;\n"
    << "        if (j < jhi) {\n          if (d < D) kx = " << ld(1) << "kb + j * " << kv.stride(Rq - 2) << " + d * "
    << kv.stride(Rq - 1) << ");\n          if (d < N) vx = " << ld(2) << "vb + d * " << v.stride(Rv - 2) << " + j * "
    << v.stride(Rv - 1) << ");\n        }\n        Ks[jj][d] = " << cv << "(kx);\n        Vt[d][jj] = " << cv
    << "(vx);\n      }\n      __syncthreads();\n";
  // S = Q K^T: 8 tiles of 8 keys; element e of tile t is (row g + 8 * (e >> 1), key t * 8 + q2 + (e & 1)).
  f << "      float s[8][4];\n#pragma unroll\n      for (int t = 0; t < 8; ++t) {\n"
    << "        float* C = s[t];\n        C[0] = C[1] = C[2] = C[3] = 0.0f;\n"
    << "#pragma unroll\n        for (int ks = 0; ks < " << D16 << "; ++ks) {\n"
    << "          const unsigned* A = qf[ks];\n"
    << "          unsigned B0 = *(const unsigned*)&Ks[t * 8 + g][ks * 16 + q2], B1 = *(const unsigned*)&Ks[t * 8 + g][ks * 16 + q2 + 8];\n"
    << "          " << mma << "\n        }\n      }\n"
    // The row program on each score, then the online softmax per row (max and sum over the quad).
    << "      float mx0 = ninf, mx1 = ninf;\n"
    << "#pragma unroll\n      for (int t = 0; t < 8; ++t)\n#pragma unroll\n        for (int e = 0; e < 4; ++e) {\n"
    << "          i64 j = j0 + t * 8 + q2 + (e & 1);\n          float x_ = ninf;\n"
    << "          if (j < jhi && ((e >> 1) ? ok1 : ok0)) {\n" << at
    << program_body(prog, ps, pn, "float", false, idx, prog.needed_for(size_t(sm.x)), size_t(-1), {{plan.scores, "s[t][e]"}})
    << "          x_ = (float)r" << sm.x << ";\n          }\n          s[t][e] = x_;\n"
    << "          if (e >> 1) mx1 = op_max(mx1, x_); else mx0 = op_max(mx0, x_);\n        }\n"
    << "      mx0 = op_max(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));\n"
    << "      mx0 = op_max(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));\n"
    << "      mx1 = op_max(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));\n"
    << "      mx1 = op_max(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));\n"
    << "      float mn0 = op_max(m0, mx0), mn1 = op_max(m1, mx1);\n"
    << "      float mu0 = mn0 == ninf ? 0.0f : mn0, mu1 = mn1 == ninf ? 0.0f : mn1;\n"
    << "      float al0 = op_exp2((m0 - mu0) * c_), al1 = op_exp2((m1 - mu1) * c_);\n"
    << "      m0 = mn0;\n      m1 = mn1;\n      l0 *= al0;\n      l1 *= al1;\n"
    << "#pragma unroll\n      for (int t = 0; t < " << D8 << "; ++t) { o[t][0] *= al0; o[t][1] *= al0; o[t][2] *= al1; o[t][3] *= al1; }\n"
    << "#pragma unroll\n      for (int t = 0; t < 8; ++t) {\n"
    << "        s[t][0] = op_exp2((s[t][0] - mu0) * c_); s[t][1] = op_exp2((s[t][1] - mu0) * c_);\n"
    << "        s[t][2] = op_exp2((s[t][2] - mu1) * c_); s[t][3] = op_exp2((s[t][3] - mu1) * c_);\n"
    << "        l0 += s[t][0] + s[t][1];\n        l1 += s[t][2] + s[t][3];\n      }\n"
    // P's A fragments for keys kt*16..: tiles 2kt (k q2..) and 2kt+1 (k q2+8..).
    << "#pragma unroll\n      for (int kt = 0; kt < 4; ++kt) {\n        unsigned A[4];\n"
    << "        A[0] = (unsigned)" << cv << "(s[2 * kt][0]) | ((unsigned)" << cv << "(s[2 * kt][1]) << 16);\n"
    << "        A[1] = (unsigned)" << cv << "(s[2 * kt][2]) | ((unsigned)" << cv << "(s[2 * kt][3]) << 16);\n"
    << "        A[2] = (unsigned)" << cv << "(s[2 * kt + 1][0]) | ((unsigned)" << cv << "(s[2 * kt + 1][1]) << 16);\n"
    << "        A[3] = (unsigned)" << cv << "(s[2 * kt + 1][2]) | ((unsigned)" << cv << "(s[2 * kt + 1][3]) << 16);\n"
    << "#pragma unroll\n        for (int t = 0; t < " << D8 << "; ++t) {\n          float* C = o[t];\n"
    << "          unsigned B0 = *(const unsigned*)&Vt[t * 8 + g][kt * 16 + q2], B1 = *(const unsigned*)&Vt[t * 8 + g][kt * 16 + q2 + 8];\n"
    << "          " << mma << "\n        }\n      }\n    }\n";
  f << ft.store;
  return add_kernel(f.str());
}

// Statements multiplying `srows_` by the mask view's row dims that are not broadcast (stride 0): its distinct rows,
// the rows of its summary (mask_summary writes them, flash_tiles reads them; Runtime::applies counts them alike).
std::string summary_rows(const ViewSlot& mv, const std::string& indent) {
  ViewText mt{mv};
  std::string s;
  for (int d = 0; d + 1 < mv.rank; ++d) s += indent + "if (" + mt.stride(d) + " != 0) srows_ *= " + mt.shape(d) + ";\n";
  return s;
}

// The loaded additive mask of flash_tiles, summarised: a byte per distinct row of its view (the broadcast row dims
// taken once) and 64-key tile, 1: some key of the tile seen (not -inf), 2: some key's mask not 0, laid out tile by
// tile in `sm`. Same parameters as the attention kernel, launched before it with a block of 8 warps per row.
std::string Generator::mask_summary(const ViewSlot& mv, DType dtype, const std::string& aliases,
                                    const std::vector<std::string>& args, const std::string& in) {
  ViewText mt{mv};
  int R = mv.rank;
  Text k;
  k << "extern \"C\" __global__ void NAME" << params(args) << " {\n" << aliases
    << "  i64 T = p[2];\n  unsigned char* sum_ = (unsigned char*)sm;\n"
    << "  const float ninf = -__int_as_float(0x7f800000);\n  i64 srows_ = 1, nt = (T + 63) / 64;\n";
  k << summary_rows(mv, "  ");
  // (a block per row: its offset unravelled once; the warps take its tiles in turn)
  k << "  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;\n"
    << "  for (i64 row = blockIdx.x; row < srows_; row += gridDim.x) {\n"
    << "    i64 r_ = row, o_ = " << mt.off() << ";\n";
  for (int d = R - 2; d >= 0; --d)
    k << "    if (" << mt.stride(d) << " != 0) { o_ += r_ % " << mt.shape(d) << " * " << mt.stride(d) << "; r_ /= "
      << mt.shape(d) << "; }\n";
  // (4 tiles a warp at once: their 8 loads a lane in flight together, then the votes)
  k << "    for (i64 t0 = w; t0 < nt; t0 += 4 * nw) {\n      bool live[4], dirty[4];\n#pragma unroll\n"
    << "      for (int u = 0; u < 4; ++u) {\n        i64 t = t0 + u * nw;\n        live[u] = dirty[u] = false;\n"
    << "#pragma unroll\n        for (int h = 0; h < 2; ++h) {\n          i64 j = t * 64 + h * 32 + lane;\n"
    << "          if (t < nt && j < T) {\n"
    << "            float x = (float)ld_" << dtype_name(dtype) << "(" << in << ", o_ + j * " << mt.stride(R - 1) << ");\n"
    << "            live[u] |= x != ninf;\n            dirty[u] |= x != 0.0f;\n          }\n        }\n      }\n"
    << "#pragma unroll\n      for (int u = 0; u < 4; ++u) {\n        i64 t = t0 + u * nw;\n"
    << "        bool l_ = __any_sync(0xffffffffu, live[u]), d_ = __any_sync(0xffffffffu, dirty[u]);\n"
    << "        if (lane == 0 && t < nt) sum_[t * srows_ + row] = (l_ ? 1 : 0) | (d_ ? 2 : 0);\n      }\n"
    << "    }\n  }\n}\n";
  return add_kernel(k.str());
}

// Prefill attention on tensor cores (FlashMmaSkip): blocks of 4 warps, 16 query rows each (64 rows), keys in tiles
// of 64 through two shared-memory stages (the next live tile's copies in flight while this one's products run).
// S = Q K^T with q's fragments in registers and K's by ldmatrix; the row program and the online softmax on S's
// fragments (a row spans a quad); P, repacked in registers as the A operand, times V (ldmatrix.trans). Operands
// rounded to the 16-bit compute dtype, float32 accumulators, as the tensor-core MatMul.
// An additive mask (x = A + M, M not reading the scores) is classified once per window of 1024 tiles, before any
// product: a tile whose M is -inf for all the block's rows is never loaded (causal prefill: the tiles past the
// diagonal), and where M is a loaded input, a tile where it is 0 at every element runs its program with M as 0
// (the tiles below the diagonal: no mask loads). A loaded M is read from its summary (mask_summary), each thread
// taking its row's byte per tile; a computed one is evaluated by each warp over its rows. The votes meet in shared
// bit sets. The program's unpadded inputs are read through per-row bases computed once (an element adds its key's
// stride).
std::string Generator::flash_tiles(Step& st, const Node& n, const Step& ps, const Node& pn, const SoftmaxForm& sm,
                                   const std::string& aliases, const std::vector<std::string>& args, int DH, bool wg) {
  const AttentionPlan& plan = op_as<AttentionOp>(n)->plan;
  const Program& prog = plan.prog;
  int E = st.nparams - 7, Rq = st.views[0].rank, Rv = st.views[2].rank, Rp = n.inputs.size() > 3 ? st.views[3].rank : 0;
  auto P = [&](int k) { return "p[" + std::to_string(E + k) + "]"; };
  ViewText kv{st.views[1]}, v{st.views[2]};
  auto ld = [&](int e) { return edge_load(n, e); };
  std::string cv = compute_ == DType::BF16 ? "f32_bf16" : "f32_f16", pk = compute_ == DType::BF16 ? "pack_bfloat16" : "pack_float16";
  std::string ct = compute_ == DType::BF16 ? "bf16" : "f16";
  DType kst = storage(n.inputs[1].node), vst = storage(n.inputs[2].node);
  bool f32kv = kst == DType::F32 && vst == DType::F32, kv16 = dtype_size(kst) == 2 && dtype_size(vst) == 2;
  bool async = kst == compute_ && vst == compute_;
  // (wg: K's and V's tiles as halves of 64 columns, rows of 128 bytes in the 128-byte swizzle its descriptors name;
  // else rows padded by 8 halves, which spreads an ldmatrix's 8 rows over the banks)
  const int TH = wg ? 256 : 128, RB = wg ? 128 : 64, WS = kFlashWgmmaStages;
  std::string LD = std::to_string(DH + 8), STAGE = std::to_string(wg ? 2 * 64 * DH : 2 * 64 * (DH + 8));
  int D16 = DH / 16, D8 = DH / 8;
  // The additive mask's register (mreg: x = A + M with M reading no scores or row reductions), and the input it
  // loads as stored (minput), or -1.
  int mreg = -1;
  const Instr& xi = prog.code[size_t(sm.x)];
  for (int side = 0; side < 2 && xi.kind == Instr::Apply && xi.op == Op::Add && mreg < 0; ++side) {
    int m = side ? xi.b : xi.a;
    std::vector<char> need = prog.needed_for(size_t(m));
    bool free = m >= 0;
    for (size_t r = 0; r < need.size() && free; ++r)
      free = !need[r] || (prog.code[r].kind != Instr::Reduce &&
                          !(prog.code[r].kind == Instr::Load && prog.code[r].input == plan.scores));
    if (free) mreg = m;
  }
  int minput = mreg >= 0 && prog.code[size_t(mreg)].kind == Instr::Load ? prog.code[size_t(mreg)].input : -1;
  // Per-row bases of the program's unpadded inputs (tb<i>_<h>: row h's element at this tile's first key).
  std::vector<int> based;
  for (int i = 0; i < int(ps.views.size()); ++i)
    if (i != plan.scores && !ps.views[size_t(i)].masked && ps.views[size_t(i)].rank == Rp) based.push_back(i);
  // A loaded mask is classified once per distinct row of it (mask_summary), not by every block: the query heads
  // that share its rows (a broadcast dim) read a byte per row and tile instead of the tile's elements.
  // The summary is its own buffer (`sm`, after the workspace): steps reading the same mask through the same view
  // (every layer of a model) share one, computed before the first of them (Runtime::assign_summaries).
  bool summ = minput >= 0 && std::count(based.begin(), based.end(), minput);
  std::vector<std::string> kargs = args;
  if (summ) {
    kargs.push_back("sm");
    st.prep_fn = mask_summary(ps.views[size_t(minput)], storage(pn.inputs[size_t(minput)].node), aliases, kargs,
                              "in" + std::to_string(minput));
    st.summary_edge = minput == plan.scores ? -1 : 3 + minput - (minput > plan.scores ? 1 : 0);
  }
  std::map<int, std::string> given;
  for (int i : based) {
    std::string I = std::to_string(i);
    given[i] = "ld_" + std::string(dtype_name(storage(pn.inputs[size_t(i)].node))) + "(in" + I + ", ((e >> 1) ? tb" + I +
               "_1 : tb" + I + "_0) + jj * js" + I + ")";
  }
  auto tile_bases = [&](const std::string& j0) {
    std::string s;
    for (int i : based) {
      std::string I = std::to_string(i), sl = "js" + I;
      s += "      i64 tb" + I + "_0 = ib" + I + "_0 + " + j0 + " * " + sl + ", tb" + I + "_1 = ib" + I + "_1 + " + j0 +
           " * " + sl + ";\n";
    }
    return s;
  };
  // The thread's rows (flash_text), each with its bases of those inputs (a row past Tq takes the block's first).
  FlashText ft = flash_text(st, n, DH, [&](const std::string& H) {
    std::string r;
    for (int i : based) r += "    i64 ib" + std::to_string(i) + "_" + H + " = 0;\n";
    r += "    {\n    i64 rr_ = ok" + H + " ? row" + H + " : rb_;  // (a row past Tq: the block's first)\n";
    if (Rp > 1) {
      r += unravel(st.views[3], 0, Rp - 1, "rr_", "u");
      for (int i : based)
        r += "    ib" + std::to_string(i) + "_" + H + " = " + view_base(ViewText{ps.views[size_t(i)]}, "u", Rp - 1) + ";\n";
    } else {
      for (int i : based) r += "    ib" + std::to_string(i) + "_" + H + " = " + ViewText{ps.views[size_t(i)]}.off() + ";\n";
    }
    return r + "    }\n";
  });
  const std::string &mma = ft.mma, &at = ft.at;
  const std::vector<std::string>& idx = ft.idx;
  // The 32 elements of a thread's fragment rows in a tile: rows g, g + 8 (e >> 1); keys t * 8 + q2 + (e & 1).
  // A tile of 64 keys within the range needs no checks: rows past Tq read the block's first row through the bases
  // (their results are never stored, and a copy of a row changes no vote), so only the range's last tile, printed
  // apart, checks its keys and rows. (`fast` false: checked always; the scores of a tile whose mask is loaded,
  // whose 32 loads at once in the unchecked copy made the kernel spill.)
  auto elements = [&](const std::function<std::string(const std::string&)>& body, bool fast = true) {
    auto loop = [&](const std::string& cond) {
      return "#pragma unroll\n      for (int t = 0; t < 8; ++t)\n#pragma unroll\n        for (int e = 0; e < 4; ++e) {\n"
             "          int jj = t * 8 + q2 + (e & 1);\n          i64 j = j0 + jj;\n" + body(cond) + "        }\n";
    };
    if (!fast) return loop("j < jhi && ((e >> 1) ? ok1 : ok0)");
    return "        if (j0 + 64 <= jhi) {\n" + loop("true") + "        } else {\n" +
           loop("j < jhi && ((e >> 1) ? ok1 : ok0)") + "        }\n";
  };

  Text f;
  f << "extern \"C\" __global__ __launch_bounds__(" << TH << (wg ? ", 1" : "") << ") void NAME" << params(kargs) << " {\n";
  if (wg)  // (the swizzle repeats every 1024 bytes: each tile starts at such a boundary)
    f << "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n  extern __shared__ __align__(1024) u16 smem_raw_[];\n"
      << "  u16* smem_ = smem_raw_ + ((1024 - (smem_u32(smem_raw_) & 1023)) & 1023) / 2;  // " << WS
      << " stages of K's tile, then V's: 64 x " << DH << "\n";
  else
    f << "  extern __shared__ __align__(16) u16 smem_[];  // 2 stages of Ks[64][" << LD << "], Vs[64][" << LD << "]\n";
  if (mreg >= 0)
    f << "  __shared__ unsigned live_[32], dirty_[32];  // per key tile of a window: seen by a row; mask not 0 somewhere\n";
  f << aliases
    << "  i64 T = p[2], D = " << P(0) << ", N = " << P(1) << ", Tq = " << P(2) << ", B = " << P(3)
    << ", nsplit = " << P(4) << ", chunk = " << P(5) << ";\n"
    << "  int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, q2 = (lane & 3) * 2;\n"
    << "  const float c_ = " << lit(sm.c, true) << ", ninf = -__int_as_float(0x7f800000);\n"
    << "  i64 jlo = (i64)blockIdx.z * chunk, jhi = min(T, jlo + chunk);\n"
    // (parameters read once, outside the loops' conditions: a load under a condition is not hoisted, so each
    // element would wait for its stride's load first)
    << "  const i64 kjs = " << kv.stride(Rq - 2) << ", kds = " << kv.stride(Rq - 1) << ", vjs = " << v.stride(Rv - 1)
    << ", vds = " << v.stride(Rv - 2) << ";\n  const bool vec_ = " << P(6) << " != 0;\n";
  for (int i : based) f << "  const i64 js" << i << " = " << ViewText{ps.views[size_t(i)]}.stride(Rp - 1) << ";\n";
  if (wg)  // (the ring's barriers: a stage full once every thread's copies landed; empty once both warpgroups'
           // products read it. Their phases run on across windows and batches, as do the counts of fills and tiles.)
    f << "  __shared__ __align__(8) unsigned long long full_[" << WS << "], empty_[" << WS << "];\n"
      << "  if (tid == 0)\n    for (int s = 0; s < " << WS << "; ++s) {\n"
      << "      mbar_init(smem_u32(&full_[s]), " << TH << ");\n      mbar_init(smem_u32(&empty_[s]), 2);\n    }\n"
      << "  __syncthreads();\n  unsigned ld_ = 0, it_ = 0;  // stages filled, tiles computed\n";
  f << "  for (i64 b = blockIdx.y; b < B; b += gridDim.y) {\n"
    // (the last row blocks first: under a causal mask they have the most live tiles, so the grid's tail is short)
    << "    i64 t0 = (i64)(gridDim.x - 1 - blockIdx.x) * " << RB << ", rb_ = b * Tq + t0, kb, vb;\n"
    << "    {\n" << unravel(st.views[0], 0, Rq - 2, "rb_", "a") << "    kb = " << view_base(kv, "a", Rq - 2) << ";\n    }\n"
    << "    {\n" << unravel(st.views[2], 0, Rv - 2, "rb_", "a") << "    vb = " << view_base(v, "a", Rv - 2) << ";\n    }\n";
  f << ft.rows << ft.qf;
  if (wg)
    // q's tile after the ring, as K's (halves of 64 columns, the 128-byte swizzle; a warpgroup's 64 rows 8192 bytes
    // apart), the scores' A operand by descriptor: from registers, ptxas gave P the registers of q's fragments
    // with 64-column tiles, so that the next tile's scores read P. Each warp stores and reads only its own rows;
    // the window's barrier below orders the stores before the products.
    f << "    u16* qs_ = smem_ + " << WS * 2 * 64 * DH << ";\n#pragma unroll\n    for (int ks = 0; ks < " << D16
      << "; ++ks)\n#pragma unroll\n      for (int e = 0; e < 4; ++e) {\n"
      << "        int r = w * 16 + g + 8 * (e & 1), c = ks * 16 + q2 + (e >> 1) * 8;\n"
      << "        *(unsigned*)(qs_ + (c >> 6) * 8192 + r * 64 + ((((c & 63) >> 3) ^ (r & 7)) << 3) + (c & 7)) = qf[ks][e];\n"
      << "      }\n    fence_async_smem();\n";
  f << "    for (i64 w0 = jlo; w0 < jhi; w0 += 65536) {  // windows of 1024 tiles\n"
    << "      int nt = (int)((min(jhi, w0 + 65536) - w0 + 63) / 64);\n"
    << "      __syncthreads();  // (the last window's or batch's readers of the stages and bits are done)\n";
  if (summ) {
    // The summary row of the thread's block row tid % RB (a row past Tq: the block's first), found here rather
    // than held through the loop over tiles (registers); the block's first RB threads take the even tiles, the
    // others the odd, each thread reading its row's byte, the warp voting.
    const ViewSlot& mv = ps.views[size_t(minput)];
    ViewText mt{mv};
    f << "      if (tid < 32) live_[tid] = dirty_[tid] = 0u;\n      __syncthreads();\n      {\n"
      << "      const unsigned char* sum_ = (const unsigned char*)sm;\n      i64 srows_ = 1, sr_ = 0;\n";
    f << summary_rows(mv, "      ");
    f << "      {\n    i64 rr_ = t0 + (tid & " << RB - 1 << ") < Tq ? rb_ + (tid & " << RB - 1 << ") : rb_, m_ = 1;\n"
      << unravel(mv, 0, Rp - 1, "rr_", "s");
    for (int d = Rp - 2; d >= 0; --d)
      f << "    if (" << mt.stride(d) << " != 0) { sr_ += s" << d << " * m_; m_ *= " << mt.shape(d) << "; }\n";
    f << "      }\n"
      << "      for (int tc = tid >> " << (RB == 64 ? 6 : 7) << "; tc < nt; tc += " << TH / RB << ") {\n"
      << "        unsigned char b_ = sum_[(w0 / 64 + tc) * srows_ + sr_];\n"
      << "        bool live = __any_sync(0xffffffffu, b_ & 1u), dirty = __any_sync(0xffffffffu, b_ & 2u);\n"
      << "        if (lane == 0 && live) atomicOr(&live_[tc >> 5], 1u << (tc & 31));\n"
      << "        if (lane == 0 && dirty) atomicOr(&dirty_[tc >> 5], 1u << (tc & 31));\n      }\n      }\n"
      << "      __syncthreads();\n";
  } else if (mreg >= 0) {
    std::map<int, std::string> vg = given;
    vg[plan.scores] = "0.0f";
    f << "      if (tid < 32) live_[tid] = dirty_[tid] = 0u;\n      __syncthreads();\n"
      << "#pragma unroll 2\n      for (int tc = 0; tc < nt; ++tc) {\n        i64 j0 = w0 + (i64)tc * 64;\n"
      << tile_bases("j0") << "        bool live = false, dirty = false;\n"
      << elements([&](const std::string& cond) {
           return "          if (" + cond + ") {\n" + at +
                  program_body(prog, ps, pn, "float", false, idx, prog.needed_for(size_t(mreg)), size_t(-1), vg) +
                  "          live |= (float)r" + std::to_string(mreg) + " != ninf;\n          dirty |= (float)r" +
                  std::to_string(mreg) + " != 0.0f;\n          }\n";
         })
      << "        live = __any_sync(0xffffffffu, live);\n        dirty = __any_sync(0xffffffffu, dirty);\n"
      << "        if (lane == 0 && live) atomicOr(&live_[tc >> 5], 1u << (tc & 31));\n"
      << "        if (lane == 0 && dirty) atomicOr(&dirty_[tc >> 5], 1u << (tc & 31));\n      }\n"
      << "      __syncthreads();\n";
  }
  if (mreg >= 0) {
    f << "      auto next_ = [&](int t) -> int {  // the first live tile from t (nt: none)\n"
      << "        while (t < nt) {\n          unsigned m_ = live_[t >> 5] >> (t & 31);\n"
      << "          if (m_) return t + __ffs(m_) - 1;\n          t = (t | 31) + 1;\n        }\n        return nt;\n      };\n";
  } else {
    f << "      auto next_ = [&](int t) -> int { return t; };\n";
  }
  // load_(j0, st): tile j0 of K and V into stage st, zeros past the keys and head sizes.
  const int D8c = DH / 8, RS = TH / D8c;  // (the 16-byte chunks of a row; rows a pass of the block covers)
  // (16-byte copies straight to shared memory: the cache is in the compute dtype). A thread copies chunk
  // tid % D8c of rows tid / D8c + k * RS: its row addresses found once per tile and stepped, the key check in 32
  // bits (per copy, the 64-bit index arithmetic had outnumbered the copies several times). `in`: the indent;
  // `kd`, `vd`: the destinations of row jj's chunk, after the statements `pre`.
  auto row_copies = [&](const std::string& in, const std::string& pre, const std::string& kd, const std::string& vd) {
    return in + "const int rem_ = (int)min((i64)64, jhi - j0), lr_ = tid / " + std::to_string(D8c) + ", lc_ = (tid % " +
           std::to_string(D8c) + ") * 8;\n" + in + "const bool okk_ = lc_ < D, okv_ = lc_ < N;\n" + pre + in +
           "const u16 *kp_ = (const u16*)e1 + kb + (j0 + lr_) * kjs + lc_, *vp_ = (const u16*)e2 + vb + (j0 + lr_) * vjs + lc_;\n"
           "#pragma unroll\n" + in + "for (int k = 0; k < " + std::to_string(64 / RS) + "; ++k) {\n" + in +
           "  int jj = lr_ + k * " + std::to_string(RS) + ";\n" + in + "  bool ok = jj < rem_;  // (else zeros; nothing read)\n" +
           in + "  cp_async16(smem_u32(" + kd + "), ok && okk_ ? kp_ : (const u16*)e1 + kb, ok && okk_);\n" + in +
           "  cp_async16(smem_u32(" + vd + "), ok && okv_ ? vp_ : (const u16*)e2 + vb, ok && okv_);\n" + in + "  kp_ += " +
           std::to_string(RS) + " * kjs;\n" + in + "  vp_ += " + std::to_string(RS) + " * vjs;\n" + in + "}\n";
  };
  f << "      auto load_ = [&](i64 j0, int st) {\n";
  if (wg)  // (only 16-byte copies: the runtime takes this kernel for such rows alone)
    // Chunk c of key row jj goes to half c / 8 of the tile, row jj, place (c % 8) ^ (jj & 7); the thread's rows
    // are lr_ + k * RS, RS a multiple of 8, so that jj & 7 is lr_ & 7 throughout.
    f << "        u16 *Ks = smem_ + st * " << STAGE << ", *Vs = Ks + " << 64 * DH << ";\n"
      << row_copies("        ", "        const int so_ = (lc_ >> 6) * 4096 + ((((lc_ >> 3) & 7) ^ (lr_ & 7)) << 3);\n",
                    "Ks + so_ + jj * 64", "Vs + so_ + jj * 64")
      << "      };\n";
  else {
    f << "        u16 (*Ks)[" << LD << "] = (u16 (*)[" << LD << "])(smem_ + st * " << STAGE << "), (*Vs)[" << LD << "] = Ks + 64;\n";
    std::string vec_loop = "#pragma unroll\n          for (int x = tid; x < 64 * " + std::to_string(DH / 8) + "; x += " +
                           std::to_string(TH) + ") {\n            int jj = x / " + std::to_string(DH / 8) + ", d = (x % " +
                           std::to_string(DH / 8) + ") * 8;\n            i64 j = j0 + jj;\n";
    if (async && TH % D8c == 0 && 64 % RS == 0)
      f << "        if (vec_) {\n" << row_copies("          ", "", "&Ks[jj][lc_]", "&Vs[jj][lc_]")
        << "          return;\n        }\n";
    else if (async)
      f << "        if (vec_) {\n" << vec_loop
        << "            bool okk = j < jhi && d < D, okv = j < jhi && d < N;  // (else zeros; nothing read)\n"
        << "            cp_async16(smem_u32(&Ks[jj][d]), (const u16*)e1 + kb + (okk ? j * kjs + d : 0), okk);\n"
        << "            cp_async16(smem_u32(&Vs[jj][d]), (const u16*)e2 + vb + (okv ? j * vjs + d : 0), okv);\n          }\n          return;\n        }\n";
    else if (kv16 || f32kv)  // (8 elements of a row per thread, rounded to the compute dtype: one 16-byte store each)
      f << "        if (vec_) {\n" << vec_loop
        << "            float a[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, c[8] = {0.0f, 0.0f, 0.0f, 0.0f, "
           "0.0f, 0.0f, 0.0f, 0.0f};\n"
        << "            if (j < jhi && d < D) ld8_" << dtype_name(kst) << "(e1, kb + j * kjs + d, a);\n"
        << "            if (j < jhi && d < N) ld8_" << dtype_name(vst) << "(e2, vb + j * vjs + d, c);\n"
        << "            *(uint4*)&Ks[jj][d] = make_uint4(" << pk << "(a[0], a[1]), " << pk << "(a[2], a[3]), " << pk
        << "(a[4], a[5]), " << pk << "(a[6], a[7]));\n"
        << "            *(uint4*)&Vs[jj][d] = make_uint4(" << pk << "(c[0], c[1]), " << pk << "(c[2], c[3]), " << pk
        << "(c[4], c[5]), " << pk << "(c[6], c[7]));\n          }\n          return;\n        }\n";
    f << "        for (int x = tid; x < 64 * " << DH << "; x += " << TH << ") {\n          int jj = x / " << DH
      << ", d = x % " << DH << ";\n          i64 j = j0 + jj;\n          float kx = 0.0f, vx = 0.0f;\n"
      << "          if (j < jhi) {\n            if (d < D) kx = " << ld(1) << "kb + j * kjs + d * kds);\n"
      << "            if (d < N) vx = " << ld(2) << "vb + d * vds + j * vjs);\n          }\n          Ks[jj][d] = " << cv << "(kx);\n          Vs[jj][d] = " << cv
      << "(vx);\n        }\n      };\n";
  }
  if (wg)
    // A ring of WS stages: the block's threads fill the stage of live tile i + WS - 1 while the warpgroups compute
    // tile i, each at its own pace (no block barrier per tile: one warpgroup's softmax runs under the other's
    // products). Refilling a stage waits until both warpgroups' products have read it.
    f << "      int tl = next_(0);  // the next tile to fill\n"
      << "      auto fill_ = [&]() {\n        int s = ld_ % " << WS << ";\n"
      << "        if (ld_ >= " << WS << ") mbar_wait(smem_u32(&empty_[s]), ((ld_ / " << WS << ") & 1) ^ 1);\n"
      << "        load_(w0 + (i64)tl * 64, s);\n        cp_arrive_noinc(smem_u32(&full_[s]));\n"
      << "        ++ld_;\n        tl = next_(tl + 1);\n      };\n"
      << "      for (int k = 0; k < " << WS - 1 << " && tl < nt; ++k) fill_();\n"
      << "      for (int tc = next_(0); tc < nt; tc = next_(tc + 1), ++it_) {\n        if (tl < nt) fill_();\n"
      << "        const int st = it_ % " << WS << ";\n        mbar_wait(smem_u32(&full_[st]), (it_ / " << WS << ") & 1);\n"
      << "        fence_async_smem();  // (copies by threads, read by the products' asynchronous proxy)\n"
      << "        i64 j0 = w0 + (i64)tc * 64;\n";
  else
    f << "      int tc = next_(0);\n      if (tc < nt) load_(w0 + (i64)tc * 64, 0);\n      cp_commit();\n"
      << "      for (int st = 0; tc < nt; st ^= 1) {\n        int tn = next_(tc + 1);\n"
      << "        if (tn < nt) load_(w0 + (i64)tn * 64, st ^ 1);\n        cp_commit();\n"
      << "        cp_wait<1>();  // this thread's copies of tile tc done; the barrier: every thread's\n"
      << "        __syncthreads();\n        i64 j0 = w0 + (i64)tc * 64;\n";
  // One warpgroup product: C (nn columns, acc[t][e] as the mma tiles' fragments) += A x B, B by descriptor
  // `desc`, read N-major where `tb`; A by descriptor `a` (K-major), or where `areg` from registers (the 4 of array
  // `a`, as mma.sync's fragment of the warp's 16 rows).
  auto wgmma = [&](int nn, const std::string& acc, const std::string& a, bool areg, const std::string& desc, bool tb) {
    std::string regs, ops;
    for (int r = 0; r < nn / 2; ++r) {
      regs += (r ? ", %" : "%") + std::to_string(r);
      ops += (r ? ", \"+f\"(" : "\"+f\"(") + acc + "[" + std::to_string(r / 4) + "][" + std::to_string(r % 4) + "])";
    }
    auto op = [&](int k) { return "%" + std::to_string(nn / 2 + k); };
    std::string A = areg ? "{" + op(0) + ", " + op(1) + ", " + op(2) + ", " + op(3) + "}" : op(0), B = op(areg ? 4 : 1);
    std::string ins = areg ? "\"r\"(" + a + "[0]), \"r\"(" + a + "[1]), \"r\"(" + a + "[2]), \"r\"(" + a + "[3])"
                           : "\"l\"(" + a + ")";
    return "        asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\nwgmma.mma_async.sync.aligned.m64n" +
           std::to_string(nn) + "k16.f32." + ct + "." + ct + " {" + regs + "}, " + A + ", " + B + ", p, 1, 1, " +
           (areg ? "" : "0, ") + (tb ? "1" : "0") + ";\\n}\\n\"\n                     : " + ops +
           "\n                     : " + ins + ", \"l\"(" + desc + "));\n";
  };
  // (registers pinned where the products' asynchronous pipeline starts and ends, so that the compiler moves none
  // of their accesses in between)
  auto pin = [&](const std::string& acc, int nn, const std::string& extra) {
    std::string ops;
    for (int r = 0; r < nn / 2; ++r)
      ops += (r ? ", \"+f\"(" : "\"+f\"(") + acc + "[" + std::to_string(r / 4) + "][" + std::to_string(r % 4) + "])";
    return "        asm volatile(\"\" : " + ops + extra + " :: \"memory\");\n";
  };
  if (wg) {
    // S = Q K^T, a warpgroup's 64 rows by 64 keys: k steps of 16 through q's and K's halves (32 bytes a step in
    // their rows).
    f << "        const unsigned ka_ = smem_u32(smem_ + st * " << STAGE << "), va_ = ka_ + " << 64 * DH * 2
      << ", qa_ = smem_u32(qs_) + (w >> 2) * 8192;\n"
      << tile_bases("j0")
      << "        float s[8][4];\n#pragma unroll\n        for (int t = 0; t < 8; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;\n"
      << pin("s", 64, "") << "        wg_fence();\n";
    for (int ks = 0; ks < D16; ++ks) {
      std::string o = std::to_string((ks % 4) * 32);
      f << wgmma(64, "s", "wg_desc(qa_ + " + std::to_string((ks / 4) * 16384) + " + " + o + ")", false,
                 "wg_desc(ka_ + " + std::to_string((ks / 4) * 8192) + " + " + o + ")", false);
    }
    f << "        wg_commit();\n        wg_wait<0>();\n" << pin("s", 64, "");
  } else {
    f << "        u16 (*Ks)[" << LD << "] = (u16 (*)[" << LD << "])(smem_ + st * " << STAGE << "), (*Vs)[" << LD << "] = Ks + 64;\n"
      << tile_bases("j0")
      // S = Q K^T: 8 tiles of 8 keys; K's B fragments for two k steps by one ldmatrix (matrices: k step ks, columns
      // 0-7 and 8-15; then ks + 1), lane l giving row l & 7 of matrix l >> 3.
      << "        float s[8][4];\n#pragma unroll\n        for (int t = 0; t < 8; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;\n"
      << "#pragma unroll\n        for (int ks = 0; ks < " << D16 << "; ks += 2) {\n"
      << "          int kl = ks + (lane >> 4) < " << D16 << " ? ks + (lane >> 4) : ks;\n"
      << "#pragma unroll\n          for (int t = 0; t < 8; ++t) {\n            unsigned Bk[4];\n"
      << "            ldsm_x4(Bk, smem_u32(&Ks[t * 8 + (lane & 7)][kl * 16 + ((lane >> 3) & 1) * 8]));\n"
      << "            {\n              float* C = s[t];\n              const unsigned* A = qf[ks];\n"
      << "              unsigned B0 = Bk[0], B1 = Bk[1];\n              " << mma << "\n            }\n"
      << "            if (ks + 1 < " << D16 << ") {\n              float* C = s[t];\n              const unsigned* A = qf[ks + 1 < "
      << D16 << " ? ks + 1 : ks];\n              unsigned B0 = Bk[2], B1 = Bk[3];\n              " << mma
      << "\n            }\n          }\n        }\n";
  }
  // The row program on each score, then the online softmax per row (max and sum over the quad).
  auto scores_loop = [&](std::map<int, std::string> gv, bool fast) {
    gv[plan.scores] = "s[t][e]";
    return elements([&](const std::string& cond) {
      return "          float x_ = ninf;\n          if (" + cond + ") {\n" + at +
             program_body(prog, ps, pn, "float", false, idx, prog.needed_for(size_t(sm.x)), size_t(-1), gv) +
             "          x_ = (float)r" + std::to_string(sm.x) + ";\n          }\n          s[t][e] = x_;\n";
    }, fast);
  };
  if (minput >= 0) {
    std::map<int, std::string> clean = given;
    clean[minput] = "-0.0f";  // (x + -0 is x: the add folds away, where x + 0 must turn -0 into 0)
    f << "        if (!((dirty_[tc >> 5] >> (tc & 31)) & 1u)) {\n" << scores_loop(clean, true) << "        } else {\n"
      << scores_loop(given, false) << "        }\n";
  } else {
    f << scores_loop(given, given.empty());
  }
  // The rows' maxima over the thread's 16 scores each as a tree: 4 dependent steps where a running max took 16, on
  // the way from the scores to P. fmaxf (one instruction) passes over a NaN score, which still makes its row NaN:
  // its weight exp2(NaN) goes into the row's sum.
  f << "        float mr0[8], mr1[8];\n"
    << "#pragma unroll\n        for (int t = 0; t < 8; ++t) { mr0[t] = fmaxf(s[t][0], s[t][1]); mr1[t] = fmaxf(s[t][2], s[t][3]); }\n"
    << "#pragma unroll\n        for (int h = 4; h > 0; h >>= 1)\n"
    << "#pragma unroll\n          for (int t = 0; t < h; ++t) { mr0[t] = fmaxf(mr0[t], mr0[t + h]); mr1[t] = fmaxf(mr1[t], mr1[t + h]); }\n"
    << "        float mx0 = mr0[0], mx1 = mr1[0];\n"
    << "        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));\n"
    << "        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));\n"
    << "        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));\n"
    << "        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));\n"
    << "        float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);\n"
    << "        float mu0 = mn0 == ninf ? 0.0f : mn0, mu1 = mn1 == ninf ? 0.0f : mn1;\n"
    << "        float al0 = fast_exp2((m0 - mu0) * c_), al1 = fast_exp2((m1 - mu1) * c_);\n"
    << "        m0 = mn0;\n        m1 = mn1;\n        l0 *= al0;\n        l1 *= al1;\n"
    // (wg: the accumulators rescaled unless no row of the warp has a new maximum, al = exp2(0) = 1; the mma.sync
    // kernel spilled with that branch)
    << (wg ? "        if (__any_sync(0xffffffffu, al0 != 1.0f || al1 != 1.0f))\n" : "")
    << "#pragma unroll\n          for (int t = 0; t < " << D8 << "; ++t) { o[t][0] *= al0; o[t][1] *= al0; o[t][2] *= al1; o[t][3] *= al1; }\n"
    << "        float mc0 = mu0 * c_, mc1 = mu1 * c_;\n"
    << "#pragma unroll\n        for (int t = 0; t < 8; ++t) {\n"
    << "          s[t][0] = fast_exp2(s[t][0] * c_ - mc0); s[t][1] = fast_exp2(s[t][1] * c_ - mc0);\n"
    << "          s[t][2] = fast_exp2(s[t][2] * c_ - mc1); s[t][3] = fast_exp2(s[t][3] * c_ - mc1);\n"
    << "          l0 += s[t][0] + s[t][1];\n          l1 += s[t][2] + s[t][3];\n        }\n";
  if (wg) {
    // O += P V: P's A fragments for keys kt * 16.. (tiles 2kt, 2kt + 1, as below), V's rows kt * 16.. N-major
    // (its halves of 64 columns 8192 bytes apart).
    std::string pa;
    for (int r = 0; r < 16; ++r) pa += ", \"+r\"(pa_[" + std::to_string(r / 4) + "][" + std::to_string(r % 4) + "])";
    f << "        unsigned pa_[4][4];\n#pragma unroll\n        for (int kt = 0; kt < 4; ++kt) {\n"
      << "          pa_[kt][0] = " << pk << "(s[2 * kt][0], s[2 * kt][1]);\n"
      << "          pa_[kt][1] = " << pk << "(s[2 * kt][2], s[2 * kt][3]);\n"
      << "          pa_[kt][2] = " << pk << "(s[2 * kt + 1][0], s[2 * kt + 1][1]);\n"
      << "          pa_[kt][3] = " << pk << "(s[2 * kt + 1][2], s[2 * kt + 1][3]);\n        }\n"
      << pin("o", DH, pa) << "        wg_fence();\n";
    for (int kt = 0; kt < 4; ++kt)
      f << wgmma(DH, "o", "pa_[" + std::to_string(kt) + "]", true,
                 "wg_desc_n(va_ + " + std::to_string(kt * 2048) + ", 8192)", true);
    f << "        wg_commit();\n        wg_wait<0>();\n" << pin("o", DH, "");
  } else {
    f // P's A fragments for keys kt*16..: tiles 2kt (k q2..) and 2kt+1 (k q2+8..); V's B fragments for output tiles t,
      // t + 1 by one ldmatrix.trans: (keys 0-7, columns t * 8..), (keys 8-15, t * 8..), (keys 0-7, t * 8 + 8..),
      // (keys 8-15, t * 8 + 8..); lane l gives row l & 15.
      << "#pragma unroll\n        for (int kt = 0; kt < 4; ++kt) {\n          unsigned A[4];\n"
      << "          A[0] = " << pk << "(s[2 * kt][0], s[2 * kt][1]);\n"
      << "          A[1] = " << pk << "(s[2 * kt][2], s[2 * kt][3]);\n"
      << "          A[2] = " << pk << "(s[2 * kt + 1][0], s[2 * kt + 1][1]);\n"
      << "          A[3] = " << pk << "(s[2 * kt + 1][2], s[2 * kt + 1][3]);\n"
      << "#pragma unroll\n          for (int t = 0; t < " << D8 << "; t += 2) {\n            unsigned Bv[4];\n"
      << "            ldsm_x4_t(Bv, smem_u32(&Vs[kt * 16 + (lane & 15)][t * 8 + (lane >> 4) * 8]));\n"
      << "#pragma unroll\n            for (int h = 0; h < 2; ++h) {\n              float* C = o[t + h];\n"
      << "              unsigned B0 = Bv[2 * h], B1 = Bv[2 * h + 1];\n              " << mma << "\n            }\n"
      << "          }\n        }\n";
  }
  if (wg)
    f << "        if ((tid & 127) == 0) mbar_arrive(smem_u32(&empty_[st]));  // (this warpgroup's products are done)\n"
      << "      }\n    }\n";
  else
    f << "        __syncthreads();  // (every warp done with stage st before the next tile's copies refill it)\n"
      << "        tc = tn;\n      }\n    }\n";
  std::string store = ft.store;
  if (wg) store.insert(store.size() - 2, "#endif\n");  // (before the kernel's closing brace)
  f << store;
  return add_kernel(f.str());
}

// The group kernel: a warp per row of the stacked outputs; a unit (one member, or the members one epilogue reads)
// computes its members' dot products for the row together, sharing the activation loads, then stores them or
// evaluates the epilogue at that element. Variables are shadowed (p, in<k>, out) so that the view text of each
// member's and epilogue's own parameter slice reads as in their own kernels.
// A group's prologue (core/schedule.h's Group::prologue): a row program of the factored form (row_factors) computing
// the activations. Its row is the one at the activations' offset `oa` (the runtime checks that the members read
// whole rows of its output, and that its inputs' rows are aligned, contiguous runs: 8-element loads); each lane
// evaluates the k-wise registers at its elements, the product of the k-wise factors going into the dot products
// and the Reduce operands into the lane's sums; after the loop the warp's sums give the row scalar.
ActRow Generator::group_prologue(size_t step) {
  const luminal::Step& cs = mod_.sched.steps[step];
  const Step& st = mod_.steps[step];
  const Node& n = g_.node(cs.node);
  const Program& prog = *cs.program;
  std::optional<RowFactors> f = row_factors(prog);
  if (!f) throw std::logic_error("CUDA codegen: a group prologue not of the factored form");
  int R = st.views[0].rank;
  std::vector<char> kw(prog.code.size(), 0), sc(prog.code.size(), 0);  // the k-wise and the scalar registers
  auto add = [&](std::vector<char>& need, int r) {
    std::vector<char> m = prog.needed_for(size_t(r));
    for (size_t i = 0; i < m.size(); ++i) need[i] |= m[i];
  };
  for (int r : f->part) add(kw, r);
  for (int r : f->sums) add(kw, prog.code[size_t(r)].a);
  for (int r : f->scalar) {
    if (prog.code[size_t(r)].kind == Instr::Reduce) sc[size_t(r)] = 1;  // (a sum itself: its operand is k-wise)
    else add(sc, r);
  }
  std::vector<std::pair<int, int>> sums;  // (Reduce register, its operand)
  for (int r : f->sums) sums.push_back({r, prog.code[size_t(r)].a});
  std::map<int, std::string> given;
  for (size_t i = 0; i < prog.code.size(); ++i)
    if (kw[i] && prog.code[i].kind == Instr::Load) given[prog.code[i].input] = "x" + std::to_string(prog.code[i].input) + "_[e]";
  ActRow a;
  Text init;
  init << "    i64 po_[" << int(std::max<size_t>(1, n.inputs.size())) << "];\n    { const i64* p = PP; i64 prow = oa / p[2];\n"
       << unravel(st.views[0], 0, R - 1, "prow");
  std::vector<std::string> idx = names("i", 0, R - 1);
  idx.push_back("0");
  for (size_t q = 0; q < n.inputs.size(); ++q) {
    a.sig += ", const void* __restrict__ PI" + std::to_string(q);
    init << "    po_[" << int(q) << "] = " << ViewText{st.views[q]}.offset(idx) << ";\n";
  }
  a.sig = ", const i64* __restrict__ PP" + a.sig;
  init << "    }\n";
  for (int r : f->sums) init << "    float s" << r << "_ = 0.0f;\n";
  a.init = init.str();
  std::string body = program_body(prog, st, n, "float", false, {}, kw, size_t(-1), given);
  std::string prod;
  for (int r : f->part) prod += (prod.empty() ? "r" : " * r") + std::to_string(r);
  a.load = [this, &n, given, body, prod, sums](const std::string& at, const std::string& dst) {
    Text t;
    t << "          {\n";
    for (auto& [q, x] : given)
      t << "          float x" << q << "_[8];\n          ld8_" << dtype_name(storage(n.inputs[size_t(q)].node)) << "(PI" << q
        << ", po_[" << q << "] + " << at << ", x" << q << "_);\n";
    t << "#pragma unroll\n          for (int e = 0; e < 8; ++e) {\n" << body << "          " << dst << "[e] = " << prod << ";\n";
    for (auto [r, o] : sums) t << "          s" << r << "_ += r" << o << ";\n";
    t << "          }\n          }\n";
    return t.str();
  };
  Text fin;
  for (int r : f->sums) fin << "    float k" << r << " = rd_float32<float>(warp_sum(s" << r << "_));\n";
  a.sums = f->sums;
  a.scalar = program_body(prog, st, n, "float", false, {}, sc, size_t(-1));
  for (int r : f->scalar) a.scale += (a.scale.empty() ? "r" : " * r") + std::to_string(r);
  fin << a.scalar << "    float scale_ = " << a.scale << ";\n";
  a.finish = fin.str();
  return a;
}

// A unit whose warp computes two rows of each member, rows r and rq, sharing the activation loads (which outnumber
// the packed weights' bytes 4 to 1) and the loop's turns: Q8_0 members (one activation row when the group runs,
// see applies()); float members with LUMINAL_CUDA_FLOAT_PAIRS=1, where every member's rows are an even number per
// activation row (so that a pair never spans two).
bool Generator::paired(const std::vector<size_t>& ms) const {
  auto q8 = [&](size_t m) { return op_as<QMatMulOp>(g_.node(mod_.sched.steps[m].node)) != nullptr; };
  auto even = [&](size_t m) {
    const Expr& n = g_.node(mod_.sched.steps[m].node).shape.back();
    return n.is_const() && n.as_const() % 2 == 0;
  };
  if (ms.size() > 2) return false;
  if (std::all_of(ms.begin(), ms.end(), q8)) return q8_pairs_;
  return float_pairs_ && std::none_of(ms.begin(), ms.end(), q8) && std::all_of(ms.begin(), ms.end(), even);
}

// Warps per row of a MatVec group's kernel: 1, or K split over 2, 4 or 8 warps while the group's rows give fewer
// than LUMINAL_CUDA_SPLIT_WARPS warps (4096; 0: never split), so that products of few rows still keep enough loads
// in flight: the 8B's Q8_0 o, down and q/k/v units (warps of two rows: 2048-3072 warps) split in 2, its bf16
// products (4096 rows and more) do not. (With more splits, 8192 or 16384 warps, both decoded slower on an H200.)
// Each part keeps at least two steps of 256 elements. Not when a warp needs whole rows (a prologue's row sums,
// unless the kernel stages the row: see group_stage) or K is unknown.
template <class Members>
int Generator::group_split(size_t nunits, const Members& members_of, bool whole_rows) const {
  const int target = env_int("LUMINAL_CUDA_SPLIT_WARPS", 4096);
  if (whole_rows || target <= 0) return 1;
  int64_t warps = 0, K = 0;
  for (size_t u = 0; u < nunits; ++u) {
    std::vector<size_t> ms = members_of(u);
    const Node& n = g_.node(mod_.sched.steps[ms[0]].node);
    const Expr& k = n.inputs[0].view.shape.back();
    if (!k.is_const()) return 1;
    K = k.as_const();
    int64_t rows = 1;  // (a symbolic dimension, the tokens of a step, counted as 1)
    for (const Expr& d : n.shape)
      if (d.is_const()) rows *= d.as_const();
    warps += paired(ms) ? (rows + 1) / 2 : rows;
  }
  int split = 1;
  while (split < 8 && warps * split < target && K >= 2 * 256 * 2 * split) split *= 2;
  return split;
}

// The row length K of a group kernel whose activation row is quantised once per block into shared memory
// (stage_row), or 0. Every member is a Q8_0 product with its weights stored split (so the group only runs for one
// activation row, which all units read: the runtime checks their offsets agree) and K is known, with its quants
// and scales within 40 KB of shared memory. Each warp then reads the row's quants from shared memory instead of
// loading and quantising activations in its loop; a prologue (RMSNorm) is computed once per block as the row is
// staged. LUMINAL_CUDA_Q8_STAGE=0: never (comparison).
template <class Members>
int64_t Generator::group_stage(size_t nunits, const Members& members_of) const {
  if (env_int("LUMINAL_CUDA_Q8_STAGE", 1) == 0) return 0;
  int64_t K = 0;
  for (size_t u = 0; u < nunits; ++u)
    for (size_t m : members_of(u)) {
      const Node& n = g_.node(mod_.sched.steps[m].node);
      const Expr& k = n.inputs[0].view.shape.back();
      if (!op_as<QMatMulOp>(n) || !split_q8(n) || !k.is_const() || (K && k.as_const() != K)) return 0;
      K = k.as_const();
    }
  return K % 32 == 0 && K + K / 8 <= 40960 ? K : 0;
}

template <class Members, class Epilogue>
std::string Generator::group_kernel(size_t nunits, const Members& members_of, const Epilogue& epilogue_of,
                                    long prologue) {
  const std::vector<Step>& steps = mod_.steps;
  const std::vector<luminal::Step>& cs = mod_.sched.steps;
  Text sig, esig, k;  // the members' arguments, then the epilogues'
  int64_t SK = group_stage(nunits, members_of);
  // With a prologue in the loop each lane holds the part's inputs' loads too (more registers, fewer resident
  // blocks): LUMINAL_CUDA_PROLOGUE_BLOCKS=n asks the compiler to fit n blocks on a multiprocessor (to compare).
  std::string bounds = "256";
  const int mb = env_int("LUMINAL_CUDA_PROLOGUE_BLOCKS", 0);
  bool in_loop = prologue >= 0 && !SK;
  if (in_loop && mb > 0) bounds += ", " + std::to_string(mb);
  // Otherwise group_blocks_ blocks fit a multiprocessor: few, with deep steps (below), so that the compiler can
  // issue all of a step's loads before the first one is used.
  else if (!in_loop) bounds += ", " + std::to_string(group_blocks_);
  sig << "extern \"C\" __global__ __launch_bounds__(" << bounds << ") void NAME(const i64* __restrict__ p, int* __restrict__ err, "
      << "const void* __restrict__ a_";
  int nm = 0;
  std::vector<std::string> rows;
  std::vector<char> pairs;
  Text body, pre;  // pre: the weight rows of a warp's first row, prefetched (see below)
  ActRow pro;
  if (prologue >= 0) pro = group_prologue(size_t(prologue));
  int split = group_split(nunits, members_of, in_loop);
  // A warp keeps LUMINAL_CUDA_GROUP_STEPS (8) weight loads in flight per step of its loop, shared among a unit's
  // operands: of 16 quants (staged; 5 registers an operand, the activations' 5 shared) or 8 elements (raw words),
  // SW a step's elements. (Four, at 4 blocks a multiprocessor, decoded the 8B bf16 and Q8_0 more slowly on an
  // H200: the compiler issued each step's loads in two halves, waiting on the first before the second.)
  const int nsteps = std::max(1, env_int("LUMINAL_CUDA_GROUP_STEPS", 8)), SW = SK ? 512 : 256;
  int nacc = 0;  // accumulators of the largest unit (a split kernel's partial sums per warp)
  Text body2;  // a split kernel's second pass: the partial sums added, the outputs stored
  for (size_t u = 0; u < nunits; ++u) {
    std::vector<size_t> ms = members_of(u);
    long f = epilogue_of(u);
    int m0 = nm;
    for (size_t j = 0; j < ms.size(); ++j, ++nm)
      sig << ", const i64* __restrict__ P" << nm << ", void* __restrict__ O" << nm << ", const void* __restrict__ W" << nm;
    bool pair = paired(ms);
    pairs.push_back(pair);
    rows.push_back(pair ? "(P" + std::to_string(m0) + "[1] + 1) / 2" : "P" + std::to_string(m0) + "[1]");
    const Step& s0 = steps[ms[0]];
    const ViewSlot& av = s0.views[0];
    int R = av.rank, c = int(ms.size()), U = std::max(1, nsteps / (pair ? 2 * c : c));
    std::vector<std::string> idx = names("i", 0, R - 1);
    idx.push_back("0");
    DType as = storage(g_.node(cs[ms[0]].node).inputs[0].node);
    body << (u == 0 ? "    if (r < n0) {\n" : "    } else if ((r -= n" + std::to_string(u - 1) + ") < n" + std::to_string(u) + ") {\n");
    if (pair) body << "    i64 rq = min(2 * r + 1, P" << m0 << "[1] - 1);\n    r *= 2;\n";
    std::string head = (u == 0 ? "    if (r < n0) {\n" : "    } else if ((r -= n" + std::to_string(u - 1) + ") < n" + std::to_string(u) + ") {\n");
    if (pair) head += "    i64 rq = min(2 * r + 1, P" + std::to_string(m0) + "[1] - 1);\n    r *= 2;\n";
    pre << head;
    body2 << head;
    // A split kernel's warp sums the part [kb_, ke_) of its rows, a multiple of a step's SW U long (the last one
    // shorter)
    std::string part = "    i64 kc_ = (K + " + std::to_string(SW * U * split - 1) + ") / " + std::to_string(SW * U * split) +
                       " * " + std::to_string(SW * U) + ", kb_ = min(K, sl_ * kc_), ke_ = min(K, kb_ + kc_);\n";
    for (int j = 0; j < c; ++j) {
      // (Float members are not prefetched: with their rows prefetched too the H100's 8B decode ran slower.)
      const Node& qn = g_.node(cs[ms[size_t(j)]].node);
      if (!op_as<QMatMulOp>(qn)) continue;
      bool sp = split_q8(qn);  // (split: the quants' row; its scales are a sixteenth of it)
      for (int half = 0; half < (pair ? 2 : 1); ++half) {
        pre << "    { const i64* p = P" << m0 + j << ";" << (half ? " i64 r = rq;\n" : "\n")
            << unravel(steps[ms[size_t(j)]].views[0], 0, R - 1, "r");
        std::string row = "i" + std::to_string(R - 2);
        std::string off = sp ? row + " * p[2]" : ViewText{steps[ms[size_t(j)]].views[1]}.offset({row, "0"});
        std::string per = sp ? "" : " / 32 * 34";
        if (split > 1)
          pre << "    i64 K = p[2];\n" << part << "    prefetch_l2(W" << m0 + j << ", " << off << " + kb_" << per
              << ", (ke_ - kb_)" << per << ", lane); }\n";
        else
          pre << "    prefetch_l2(W" << m0 + j << ", " << off << ", p[2]" << per << ", lane); }\n";
      }
    }
    // (a split Q8_0 weight's rows: their quants at ob<j>, their scales at os<j>)
    auto split_of = [&](int j) { return split_q8(g_.node(cs[ms[size_t(j)]].node)); };
    body << "    i64 oa = 0";
    for (int j = 0; j < c; ++j) {
      std::string J = std::to_string(m0 + j);
      body << ", ob" << J << " = 0" << (pair ? ", ob" + J + "_1 = 0" : "");
      if (split_of(j)) body << ", os" << J << " = 0" << (pair ? ", os" + J + "_1 = 0" : "");
    }
    body << ";\n";
    for (int j = 0; j < c; ++j) {
      const ViewSlot& bv = steps[ms[size_t(j)]].views[1];
      std::string J = std::to_string(m0 + j);
      body << "    { const i64* p = P" << m0 + j << ";\n" << unravel(steps[ms[size_t(j)]].views[0], 0, R - 1, "r");
      if (j == 0) body << "    oa = " << ViewText{av}.offset(idx) << ";\n";
      bool q8 = op_as<QMatMulOp>(g_.node(cs[ms[size_t(j)]].node)) != nullptr;  // (its weight: packed rows [N, bytes])
      auto row = [&] { return idx[size_t(R - 2)]; };  // (a Q8_0 weight's row: R >= 2)
      if (split_of(j)) body << "    " << split_offsets(bv, row(), "p[2]", "ob" + J, "os" + J) << "; }\n";
      else body << "    ob" << J << " = " << ViewText{bv}.offset(q8 ? std::vector<std::string>{row(), "0"} : idx) << "; }\n";
      if (pair) {
        body << "    { const i64* p = P" << m0 + j << "; i64 r = rq;\n" << unravel(steps[ms[size_t(j)]].views[0], 0, R - 1, "r");
        if (split_of(j)) body << "    " << split_offsets(bv, row(), "p[2]", "ob" + J + "_1", "os" + J + "_1") << "; }\n";
        else body << "    ob" << J << "_1 = " << ViewText{bv}.offset(q8 ? std::vector<std::string>{row(), "0"} : idx)
                  << "; }\n";
      }
    }
    std::vector<DotOperand> ws;
    for (int j = 0; j < c; ++j)
      ws.push_back({storage(g_.node(cs[ms[size_t(j)]].node).inputs[1].node), "W" + std::to_string(m0 + j),
                    "ob" + std::to_string(m0 + j), "acc" + std::to_string(m0 + j),
                    op_as<QMatMulOp>(g_.node(cs[ms[size_t(j)]].node)) != nullptr,
                    split_of(j) ? "os" + std::to_string(m0 + j) : ""});
    for (int j = 0; pair && j < c; ++j)  // (the pair's second rows)
      ws.push_back({ws[size_t(j)].storage, ws[size_t(j)].ptr, ws[size_t(j)].off + "_1", ws[size_t(j)].acc + "_1",
                    ws[size_t(j)].q8, ws[size_t(j)].soff.empty() ? "" : ws[size_t(j)].soff + "_1"});
    // (with a prologue, the activations computed in the loop, or staged; each dot product then scaled by the row's
    // scalar)
    body << "    i64 K = P" << m0 << "[2];\n" << (SK ? "" : pro.init);
    std::string scaled;
    if (prologue >= 0)
      for (auto& w : ws) scaled += "    " + w.acc + " *= scale_;\n";
    if (split > 1) {
      // each warp's sums into the block's table; the row's first warp adds them up in the second pass
      body << part << dot_rows(as, "a_", "oa", ws, U, nullptr, "kb_", "ke_", SK > 0) << scaled << "    if (lane == 0) {\n";
      for (int q = 0; q < int(ws.size()); ++q) {
        body << "      part_[w_][" << q << "] = " << ws[size_t(q)].acc << ";\n";
        body2 << "    float " << ws[size_t(q)].acc << " = part_[w_][" << q << "]";
        for (int z = 1; z < split; ++z) body2 << " + part_[w_ + " << z << "][" << q << "]";
        body2 << ";\n";
      }
      body << "    }\n";
      nacc = std::max(nacc, int(ws.size()));
    } else {
      body << dot_rows(as, "a_", "oa", ws, U, prologue >= 0 && !SK ? &pro : nullptr, "0", "K", SK > 0)
           << (SK ? "" : pro.finish) << scaled;
    }
    Text& fin = split > 1 ? body2 : body;  // the outputs' stores (and epilogue)
    fin << "    if (lane == 0) {\n";
    if (f < 0) {
      for (int j = 0; j < c; ++j)
        fin << "    st_" << dtype_name(g_.node(cs[ms[size_t(j)]].node).dtype) << "(O" << m0 + j << ", r, acc" << m0 + j
             << ");\n";
      for (int j = 0; pair && j < c; ++j)
        fin << "    if (rq != r) st_" << dtype_name(g_.node(cs[ms[size_t(j)]].node).dtype) << "(O" << m0 + j
             << ", rq, acc" << m0 + j << "_1);\n";
    } else {
      const Step& fs = steps[size_t(f)];
      const Node& fn = g_.node(cs[size_t(f)].node);
      std::string e = "E" + std::to_string(u);
      esig << ", const i64* __restrict__ " << e << ", void* __restrict__ " << e << "o";
      for (size_t q = 0; q < fn.inputs.size(); ++q) esig << ", const void* __restrict__ " << e << "i" << int(q);
      for (int half = 0; half < (pair ? 2 : 1); ++half) {  // (a pair's second row: rq, its accumulators acc<j>_1)
        fin << (half ? "    if (rq != r) { i64 r = rq; const i64* p = " : "    { const i64* p = ") << e << "; void* out = "
             << e << "o;\n";
        std::map<int, std::string> given;
        for (size_t q = 0; q < fn.inputs.size(); ++q) {
          fin << "    const void* in" << int(q) << " = " << e << "i" << int(q) << ";\n";
          for (int j = 0; j < c; ++j)
            if (fn.inputs[q].node == cs[ms[size_t(j)]].node) given[int(q)] = "acc" + std::to_string(m0 + j) + (half ? "_1" : "");
        }
        const Program& prog = *cs[size_t(f)].program;
        bool dbl = double_registers(prog, fn);
        int RF = fs.views.empty() ? 0 : fs.views[0].rank;
        fin << unravel(fs.views[0], 0, RF, "r")
             << program_body(prog, fs, fn, dbl ? "double" : "float", dbl, names("i", 0, RF),
                             std::vector<char>(prog.code.size(), 1), size_t(-1), given)
             << "    st_" << dtype_name(fn.dtype) << "(out, r, r" << int(prog.code.size() - 1) << "); }\n";
      }
    }
    fin << "    }\n";
  }
  k << sig.str() << esig.str() << pro.sig << ") {\n";
  // Before waiting for the kernels before (pdl_start, which then goes here): the weight rows (packed rows) of the
  // warp's first row prefetched into L2, so that their loads start during the tail of the kernel before (weights
  // depend on no kernel, and L2 is coherent anyway; the parameter block is written before the run). (No return
  // before it: the kernel after this one waits for this one only.)
  std::string per = "((i64)(blockDim.x >> 5) / " + std::to_string(split) + ")";  // a block's rows at a time
  k << "  {\n  int lane = threadIdx.x & 31;\n";
  if (split > 1) k << "  int w_ = threadIdx.x >> 5, sl_ = w_ % " << split << ";\n";
  for (size_t u = 0; u < rows.size(); ++u) k << "  i64 n" << int(u) << " = " << rows[u] << ";\n";
  k << (split > 1 ? "  i64 r = blockIdx.x * " + per + " + w_ / " + std::to_string(split) + ";\n"
                  : std::string("  i64 r = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5;\n"))
    << pre.str() << "    }\n  }\n  pdl_start();\n";
  k << "  int lane = threadIdx.x & 31;\n" << (split > 1 ? "" : "  i64 nw = ((i64)gridDim.x * blockDim.x) >> 5;\n");
  for (size_t u = 0; u < rows.size(); ++u) k << "  i64 n" << int(u) << " = " << rows[u] << ";\n";
  k << "  i64 total = n0";
  for (size_t u = 1; u < rows.size(); ++u) k << " + n" << int(u);
  k << ";\n";
  // (the row every unit reads: the first member's activations at row 0. Every block stages it, those without
  // rows too: with those returning first the 8B's Q8_0 decode measured 3% slower.)
  if (SK) {
    const ViewSlot& av = steps[members_of(0)[0]].views[0];
    k << stage_row(storage(g_.node(cs[members_of(0)[0]].node).inputs[0].node), SK,
                   "    i64 oa;\n    { const i64* p = P0; oa = " +
                       ViewText{av}.offset(std::vector<std::string>(size_t(av.rank), "0")) + "; }\n",
                   prologue >= 0 ? &pro : nullptr);
  }
  if (split > 1) {
    // `split` consecutive warps per row, each over a part of K; their sums meet in shared memory. The loop is the
    // same for the whole block (its barriers).
    // (a launch of other blocks than the runtime's 256 threads, which would never advance, or overrun part_,
    // stops the kernel loudly)
    k << "  int w_ = threadIdx.x >> 5, sl_ = w_ % " << split << ";\n  __shared__ float part_[8][" << nacc << "];\n"
      << "  if ((int)(blockDim.x >> 5) < " << split << " || blockDim.x > 256) __trap();\n"
      << "  for (i64 base_ = blockIdx.x * " << per << "; base_ < total; base_ += gridDim.x * " << per << ") {\n"
      << "    i64 row = base_ + w_ / " << split << ";\n    if (row < total) {\n    i64 r = row;\n" << body.str()
      << "    }\n    }\n    __syncthreads();\n    if (row < total && sl_ == 0) {\n    i64 r = row;\n" << body2.str()
      << "    }\n    }\n    __syncthreads();\n  }\n}\n";
  } else {
    k << "  for (i64 row = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5; row < total; row += nw) {\n"
      << "    i64 r = row;\n" << body.str() << "    }\n  }\n}\n";
  }
  last_pairs_ = pairs;
  last_split_ = split;
  last_stage_ = SK;
  return add_kernel(k.str());
}

// A batch's kernel: its steps' loops (a fused program, or a Scatter's row writes) one after the other in one
// grid-stride loop; each part reads its own parameter slice and pointers through shadowed names. The parts' slices
// and their producers' are first copied into shared memory (stage_params_), one load a thread.
std::string Generator::batch_kernel(const Group& G) {
  const std::vector<Step>& steps = mod_.steps;
  Text sig, k, copy, body;
  sig << "extern \"C\" __global__ void NAME(const i64* __restrict__ p_, int* __restrict__ err";
  k << "  i64 total = 0";
  int at = 0;  // the next free slot of ps_
  auto stage = [&](const std::string& from, int n) {  // (a thread's slot: one load, whichever slice it is in)
    if (!stage_params_) return from;
    copy << (at ? "      : i < " : "    const i64* s_ = i < ") << at + n << " ? " << from << " + (i - " << at << ")\n";
    std::string to = "ps_ + " + std::to_string(at);
    at += n;
    return to;
  };
  for (size_t j = 0; j < G.batch.size(); ++j) {
    const Step& st = steps[G.batch[j]];
    const Loop& l = loops_.at(st.rows_fn.empty() ? st.fn() : st.rows_fn);
    if (l.slots <= 0) throw std::logic_error("CUDA codegen: a batched loop without its parameter count");
    std::string J = std::to_string(j);
    sig << ", const i64* __restrict__ P" << J << ", void* __restrict__ O" << J;
    std::string P = stage("P" + J, l.slots);
    k << ", n" << J << " = " << items(l, "(" + P + ")");
    body << (j ? "    } else if ((t -= n" + std::to_string(j - 1) + ") < n" + J + ") {\n" : "    if (t < n0) {\n")
         << "    const i64* p = " << P << "; void* out = O" << J << ";\n";
    for (size_t q = 0; q < l.args.size(); ++q) {
      std::string a = "I" + J + "_" + std::to_string(q), type = arg_type(l.args[q]);
      sig << ", " << type << a;
      bool slice = l.args[q] == "Q";
      if (slice && l.q_slots <= 0)
        throw std::logic_error("CUDA codegen: a batched producer without its parameter count");
      body << "    " << type.substr(0, type.find(" __restrict__")) << " " << l.args[q] << " = "
           << (slice ? stage(a, l.q_slots) : a) << ";\n";
    }
    body << l.body;
  }
  k << ";\n  total = n0";
  for (size_t j = 1; j < G.batch.size(); ++j) k << " + n" << int(j);
  std::string A = std::to_string(at), staged;
  if (at)
    staged = "  __shared__ i64 ps_[" + A + "];\n  for (int i = threadIdx.x; i < " + A + "; i += blockDim.x) {\n" +
             copy.str() + "      : nullptr;\n    ps_[i] = *s_;\n  }\n  __syncthreads();\n";
  return add_kernel(sig.str() + ") {\n" + staged + "  pdl_start();\n" + k.str() + ";\n" +
                    "  for (i64 t_ = blockIdx.x * (i64)blockDim.x + threadIdx.x; t_ < total; t_ += (i64)gridDim.x * blockDim.x) {\n"
                    "    i64 t = t_;\n" + body.str() + "    }\n  }\n}\n");
}

// Q8_0 weights stored split (q8_layout.h: the quants' rows, then the scales'), so that a lane reads its 8 quants in
// one 8-byte load (34-byte blocks allow only 2-byte ones) and they meet the activations by __dp4a: the graph's inputs
// read only as whole weights of Q8_0 products (the runtime splits their arrays when it runs), and all of a product's
// weights or none (its kernels read one layout). LUMINAL_CUDA_Q8_SPLIT=0: none (comparison).
void Generator::choose_q8_split() {
  split_.assign(g_.size(), 0);
  const char* e = std::getenv("LUMINAL_CUDA_Q8_SPLIT");
  if (e && std::string(e) == "0") return;
  for (const luminal::Step& s : mod_.sched.steps) {
    const Node& n = g_.node(s.node);
    if (s.kind == luminal::Step::Input && n.dtype == DType::U8 && n.shape.size() == 2 && n.shape[0].is_const() &&
        n.shape[1].is_const() && n.shape[1].as_const() % 34 == 0)
      split_[size_t(s.node)] = 1;
  }
  auto q8 = [&](const Node& n) {
    const QMatMulOp* q = op_as<QMatMulOp>(n);
    return q && format_info(q->format).block_bytes == 34;
  };
  const std::vector<int64_t> alive = g_.topo_order();  // (the consumers: removed nodes are not)
  for (int64_t id : alive) {
    const Node& n = g_.node(id);
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const Edge& in = n.inputs[j];
      if (split_[size_t(in.node)] && !(q8(n) && j >= 1 && in.view.is_contiguous() && in.view.shape == g_.node(in.node).shape))
        split_[size_t(in.node)] = 0;
    }
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (int64_t id : alive) {
      const Node& n = g_.node(id);
      if (!q8(n)) continue;
      bool all = true;
      for (size_t j = 1; j < n.inputs.size(); ++j) all = all && split_[size_t(n.inputs[j].node)];
      for (size_t j = 1; j < n.inputs.size() && !all; ++j)
        if (split_[size_t(n.inputs[j].node)]) split_[size_t(n.inputs[j].node)] = 0, changed = true;
    }
  }
  for (size_t id = 0; id < g_.size(); ++id)
    if (split_[id]) mod_.q8_split.push_back(int64_t(id));
}

// A MatVec group's unit u: its members' step indices.
std::vector<size_t> members_of(const Group& G, size_t u) {
  size_t end = u + 1 < G.units.size() ? G.units[u + 1] : G.members.size();
  return std::vector<size_t>(G.members.begin() + long(G.units[u]), G.members.begin() + long(end));
}

// The prologues of groups whose kernel does not stage its row (group_stage) go back to their own kernels; a group
// that formed only for its prologue (one member, no epilogue) is dissolved, as if prologues were off.
void Generator::drop_prologues() {
  Schedule& S = mod_.sched;
  std::vector<Group> kept;
  std::vector<int> now(S.groups.size(), -1);
  for (size_t g = 0; g < S.groups.size(); ++g) {
    Group& G = S.groups[g];
    if (G.kind == Group::MatVec && G.prologue >= 0 &&
        !group_stage(G.units.size(), [&](size_t u) { return members_of(G, u); })) {
      S.steps[size_t(G.prologue)].prologue_of = -1;
      G.prologue = -1;
      if (G.members.size() == 1 && G.epilogues.empty()) {
        for (size_t k = G.first; k <= G.last; ++k) S.steps[k].group = -1;
        continue;
      }
    }
    now[g] = int(kept.size());
    kept.push_back(std::move(G));
  }
  S.groups = std::move(kept);
  for (luminal::Step& st : S.steps) {
    if (st.group >= 0) st.group = now[size_t(st.group)];
    if (st.prologue_of >= 0) st.prologue_of = now[size_t(st.prologue_of)];
  }
}

// Prints a kernel for every step and group of the core schedule.
Module Generator::run() {
  ScheduleOptions so{compute_, /*groups=*/true, host_fallback_};
  // Norms computed by the matrix-vector groups that read them (prologues): where the group's kernel stages its
  // row (group_stage), the norm is computed once per block. In the dot loop (the other groups) it cut the H100's
  // 8B decode launches by a quarter but ran slower (the loop's registers), so those groups keep the norm's own
  // kernel. LUMINAL_CUDA_PROLOGUE=1: every group takes its prologue; =0: none.
  const char* pe = std::getenv("LUMINAL_CUDA_PROLOGUE");
  std::string prologues = pe ? pe : "";
  so.prologues = prologues != "0";
  mod_.sched = make_schedule(g_, so);
  mod_.compute = compute_;
  mod_.group_blocks = group_blocks_;
  choose_q8_split();
  if (prologues != "1") drop_prologues();
  const std::vector<luminal::Step>& cs = mod_.sched.steps;
  std::vector<long> at(g_.size(), -1);  // node -> its step
  mod_.steps.resize(cs.size());
  for (size_t i = 0; i < cs.size(); ++i) {
    const Node& n = g_.node(cs[i].node);
    at[cs[i].node] = long(i);
    Step& st = mod_.steps[i];
    if (cs[i].kind != luminal::Step::Kernel) continue;
    if (cs[i].program) {
      program_step(cs[i], st, n);
      if (cs[i].matvec) matmul_fast_kernels(n, st);
    } else if (n.op == Op::Gather) {
      gather_step(st, n);
    } else if (n.op == Op::Scatter) {
      long p = cs[i].producer >= 0 ? at[cs[i].producer] : -1;
      scatter_step(st, n, p >= 0 ? &cs[size_t(p)] : nullptr, p >= 0 ? &mod_.steps[size_t(p)] : nullptr);
    } else if (const QMatMulOp* q = op_as<QMatMulOp>(n)) {
      qmatmul_step(st, n, format_info(q->format).block_bytes);
    } else if (const DequantOp* d = op_as<DequantOp>(n)) {
      dequant_step(st, n, format_info(d->format).block_bytes);
    } else if (op_as<AttentionOp>(n)) {
      attention_step(st, n);
    } else if (const ContractionOp* c = op_as<ContractionOp>(n)) {
      contraction_step(st, n, c->axes);
    } else {
      std::string why = op_as<HostOp>(n) ? ": it is a user op with only a CPU kernel (CudaCompiler(host_fallback="
                                           "True) runs such ops on the host, copying their inputs and result)"
                                         : "";
      throw UnsupportedOpError("the CUDA backend has no kernel for " + op_label(n) + " (node " +
                               std::to_string(cs[i].node) + ")" + why);
    }
  }
  for (const Group& G : mod_.sched.groups) {
    if (G.kind == Group::Batch) {
      mod_.group_fns.push_back(batch_kernel(G));
      continue;
    }
    auto epilogue = [&](size_t u) { return G.unit_epilogue[u] < 0 ? -1L : long(G.epilogues[size_t(G.unit_epilogue[u])]); };
    mod_.group_fns.push_back(group_kernel(G.units.size(), [&](size_t u) { return members_of(G, u); }, epilogue, G.prologue));
    mod_.group_pairs.resize(mod_.group_fns.size());
    mod_.group_pairs.back() = last_pairs_;
    mod_.group_split.resize(mod_.group_fns.size(), 1);
    mod_.group_split.back() = last_split_;
    mod_.group_stage.resize(mod_.group_fns.size(), 0);
    mod_.group_stage.back() = last_stage_;
  }
  mod_.source = std::string(kPrelude) + "\n" + fns_;
  return std::move(mod_);
}

}  // namespace

const char* prelude() { return kPrelude; }

int env_int(const char* name, int fallback) {
  const char* e = std::getenv(name);
  if (!e || !*e) return fallback;
  char* end = nullptr;
  long v = std::strtol(e, &end, 10);
  if (*end || v < INT_MIN || v > INT_MAX)
    throw std::invalid_argument(std::string(name) + " must be an integer, got '" + e + "'");
  return int(v);
}

GemmShape gemm_shape(Variant::Kind k, bool f32) {
  // 128 x 128 tiles: k in 32s (48 KB a block) when both operands are copied as stored; a float32 operand's loads
  // wait in registers for a tile's products, so 64s give them twice the time (96 KB). 64 x 64: 64 KB.
  if (k == Variant::Gemm128) return f32 ? GemmShape{128, 128, 64, 3} : GemmShape{128, 128, 32, 3};
  // wgmma: k in 64s (rows of 128 bytes, the 128-byte swizzle its descriptors name); as many stages as fit 192 KB,
  // next to the epilogue's 32 (LUMINAL_CUDA_WGMMA_STAGES: fewer, to compare)
  if (k == Variant::Wgmma128) return GemmShape{128, 128, 64, std::min(6, env_int("LUMINAL_CUDA_WGMMA_STAGES", 6))};
  if (k == Variant::Wgmma256) return GemmShape{128, 256, 64, std::min(4, env_int("LUMINAL_CUDA_WGMMA_STAGES", 4))};
  return GemmShape{64, 64, 64, 4};
}

const char* variant_name(Variant::Kind k) {
  static const char* names[] = {"elements", "warps", "block", "gemv", "tiled", "mma", "flash", "attention", "flash-mma",
                                "gemm128", "gemm64", "flash-decode", "implicit-gemm",
                                "implicit-mma", "cublas", "qgemv", "qmma", "qdot", "flash-mma-skip", "qrows",
                                "wgmma128", "wgmma256", "flash-wgmma", "flash-decode-mma"};
  return names[k];
}

Module generate(const Graph& g, DType compute, bool host_fallback) {
  if (!is_float(compute)) throw std::invalid_argument(std::string("CudaCompiler: dtype must be float32, float16 or bfloat16, got ") +
                                                      dtype_name(compute));
  return Generator(g, compute, host_fallback).run();
}

}  // namespace cuda
}  // namespace luminal
