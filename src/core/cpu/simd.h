// Dot-product kernels: a portable version and, per instruction-set level (isa.h: chosen once at load), AVX2/FMA/F16C
// and AVX-512 (VNNI) versions on x86-64 and NEON (dotprod) versions on AArch64.
// GGUF weight blocks (32 weights: Q8_0 = d, 32 x int8; Q4_0 = d, 16 bytes of nibbles, q - 8; Q4_1 = d, m, 16 bytes)
// meet int8 activation blocks (scale da, sum sa = da * sum qa) as
//   sum_j (d*q_j + m) * da*qa_j = d*da * sum_j q_j*qa_j + m * sa
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/cpu/isa.h"
#include "core/dtype.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define LUMINAL_X86 1
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define LUMINAL_ARM 1
#endif

namespace luminal::simd {

inline float half(const uint8_t* p) {
  // A table lookup: these conversions sit in the innermost loop of every quantised matvec.
  static const float* table = [] {
    float* t = new float[65536];
    for (uint32_t i = 0; i < 65536; ++i) t[i] = f16_to_f32(uint16_t(i));
    return t;
  }();
  uint16_t h;
  std::memcpy(&h, p, 2);
  return table[h];
}

// ---- portable ----------------------------------------------------------------------------------------------------
inline float dot_f32_portable(const float* a, const float* b, int64_t k) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < k; ++i) s += a[i] * b[i];
  return s;
}

// An R x 3 tile (R <= 4): rows a[0..R) against weight rows w[0..2] (out is row-major R x 3). With R = 4, twelve
// accumulators, three weight vectors and one activation vector fill AVX2's sixteen registers.
inline void dot_rx3_f32_portable(int rows, const float* const* a, const float* const* w, int64_t k, float* out) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < 3; ++c) out[3 * r + c] = dot_f32_portable(a[r], w[c], k);
}

// Decode quantises the activations to int8 once per row, 32 per block (scale d = max|a| / 127, q = a / d rounded
// to nearest even, s = d * sum q), so a weight block's dot product runs in integer arithmetic as llama.cpp's does.
// `d`, `s` and `q` are per block; the portable and AVX2 versions give identical q, d and s.
inline void quantize_q8_portable(const float* a, int64_t nb, int8_t* q, float* d, float* s) {
  for (int64_t b = 0; b < nb; ++b, a += 32, q += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(a[j]));
    float db = amax / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      q[j] = int8_t(std::nearbyint(a[j] * id));
      sum += q[j];
    }
    d[b] = db;
    s[b] = db * float(sum);
  }
}

// The float steps of blocks [0, n) from their integer dot products acc with the activation blocks (scales d, sums
// s). Out of line, so the portable and NEON kernels round (and fuse multiply-adds) exactly alike.
__attribute__((noinline)) inline float blocks_total(int block_bytes, const uint8_t* w, const int32_t* acc,
                                                    const float* d, const float* s, int64_t n) {
  float total = 0;
  for (int64_t b = 0; b < n; ++b, w += block_bytes) {
    float x = d[b] * float(acc[b]);
    if (block_bytes == 34) total += half(w) * x;
    else if (block_bytes == 20) total += half(w) * x + half(w + 2) * s[b];
    else total += half(w) * (x - 8.0f * s[b]);
  }
  return total;
}
constexpr int64_t kBlocksPerTotal = 64;  // blocks whose integer dots are gathered before blocks_total runs

inline float dot_q8_portable(int block_bytes, const uint8_t* w, const int8_t* q, const float* d, const float* s,
                             int64_t nb) {
  float total = 0;
  int32_t acc[kBlocksPerTotal];
  for (int64_t b0 = 0; b0 < nb; b0 += kBlocksPerTotal) {
    int64_t n = std::min(kBlocksPerTotal, nb - b0);
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* wb = w + (b0 + j) * block_bytes;
      const int8_t* qb = q + 32 * (b0 + j);
      int a = 0;
      if (block_bytes == 34) {
        for (int i = 0; i < 32; ++i) a += int(int8_t(wb[2 + i])) * qb[i];
      } else {
        const uint8_t* p = wb + (block_bytes == 20 ? 4 : 2);
        for (int i = 0; i < 16; ++i) a += int(p[i] & 0xf) * qb[i] + int(p[i] >> 4) * qb[i + 16];
      }
      acc[j] = a;
    }
    total += blocks_total(block_bytes, w + b0 * block_bytes, acc, d + b0, s + b0, n);
  }
  return total;
}

#ifdef LUMINAL_X86
// ---- AVX2 / FMA / F16C ---------------------------------------------------------------------------------------------
__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The dot product from element i on, with the four accumulators so far (the AVX-512 version hands over here).
__attribute__((target("avx2,fma"))) inline float dot_f32_avx2_from(const float* a, const float* b, int64_t k,
                                                                   int64_t i, __m256 s0, __m256 s1, __m256 s2,
                                                                   __m256 s3) {
  for (; i + 32 <= k; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= k; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < k; ++i) s += a[i] * b[i];
  return s;
}

__attribute__((target("avx2,fma"))) inline float dot_f32_avx2(const float* a, const float* b, int64_t k) {
  __m256 z = _mm256_setzero_ps();
  return dot_f32_avx2_from(a, b, k, 0, z, z, z, z);
}

__attribute__((target("avx2,fma,f16c"))) inline float half_f16c(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

template <int R>
__attribute__((target("avx2,fma"))) inline void dot_rx3_f32_avx2(const float* const* a, const float* const* w,
                                                                 int64_t k, float* out) {
  __m256 s[3 * R];
  for (auto& x : s) x = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 x0 = _mm256_loadu_ps(w[0] + i), x1 = _mm256_loadu_ps(w[1] + i), x2 = _mm256_loadu_ps(w[2] + i);
    for (int r = 0; r < R; ++r) {
      __m256 y = _mm256_loadu_ps(a[r] + i);
      s[3 * r] = _mm256_fmadd_ps(y, x0, s[3 * r]);
      s[3 * r + 1] = _mm256_fmadd_ps(y, x1, s[3 * r + 1]);
      s[3 * r + 2] = _mm256_fmadd_ps(y, x2, s[3 * r + 2]);
    }
  }
  for (int j = 0; j < 3 * R; ++j) out[j] = hsum(s[j]);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 3; ++c)
      for (int64_t j = i; j < k; ++j) out[3 * r + c] += a[r][j] * w[c][j];
}

// Unpacks nb blocks to floats.
__attribute__((target("avx2,fma,f16c"))) inline void dequant_blocks_avx2(int block_bytes, const uint8_t* w, int64_t nb,
                                                                           float* out) {
  const __m128i low = _mm_set1_epi8(0x0f);
  for (int64_t b = 0; b < nb; ++b, w += block_bytes, out += 32) {
    __m256 f[4];
    if (block_bytes == 34) {
      __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2));
      __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 18));
      f[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q0));
      f[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q0, 8)));
      f[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q1));
      f[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q1, 8)));
    } else {
      __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + (block_bytes == 20 ? 4 : 2)));
      __m128i lo = _mm_and_si128(q, low), hi = _mm_and_si128(_mm_srli_epi16(q, 4), low);
      f[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
      f[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
      f[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
      f[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
    }
    __m256 d = _mm256_set1_ps(half_f16c(w));
    // Q4_1: d*q + m; Q4_0: d*(q - 8); Q8_0: d*q, rounded exactly as the portable path (and gguf) round them.
    if (block_bytes == 18)
      for (int i = 0; i < 4; ++i) f[i] = _mm256_sub_ps(f[i], _mm256_set1_ps(8.0f));
    __m256 m = _mm256_set1_ps(block_bytes == 20 ? half_f16c(w + 2) : 0.0f);
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_add_ps(_mm256_mul_ps(d, f[i]), m));
  }
}

__attribute__((target("avx2,fma"))) inline void quantize_q8_avx2(const float* a, int64_t nb, int8_t* q, float* d,
                                                                 float* s) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < nb; ++b, a += 32, q += 32) {
    __m256 v[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(a + 8 * i);
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float db = _mm_cvtss_f32(h) / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
    __m256i i32[4];
    for (int i = 0; i < 4; ++i)
      i32[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], _mm256_set1_ps(id)),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    // Pack 4 x 8 int32 to 32 int8; the packs interleave 128-bit lanes, which the permute puts back in order.
    __m256i a16 = _mm256_packs_epi32(i32[0], i32[1]), b16 = _mm256_packs_epi32(i32[2], i32[3]);
    __m256i q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a16, b16), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), q8);
    __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i32[0], i32[1]), _mm256_add_epi32(i32[2], i32[3]));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    d[b] = db;
    s[b] = db * float(_mm_cvtsi128_si32(t));
  }
}

// The eight 8-lane sums p[0..7] of eight blocks -> one vector of their totals (block j in lane j).
__attribute__((target("avx2"))) inline __m256i block_totals(const __m256i* p) {
  __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
  __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
  // a: blocks 0-3 summed over each 128-bit half; b: blocks 4-7. Add the halves.
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

#define LM_Q_NS q_avx2
#define LM_Q_TARGET "avx2,fma,f16c"
#define LM_Q_VNNI 0
#include "core/cpu/simd_q8.inl"

// 2^x for float32: x = n + f with |f| <= 1/2, 2^f by its degree-7 Taylor polynomial (truncation error below
// 1e-8 relative), times 2^n put into the exponent bits. Within 2 ulp of the correctly rounded result. Lanes outside
// [-126, 127] (overflow, subnormal results, inf, NaN) take the exact scalar path. x may be o (in place).
__attribute__((target("avx2,fma"))) inline void exp2_f32_avx2(const float* x, float* o, int64_t n) {
  const __m256 c[8] = {_mm256_set1_ps(1.0f), _mm256_set1_ps(0.693147180559945f), _mm256_set1_ps(0.240226506959101f),
                       _mm256_set1_ps(0.0555041086648216f), _mm256_set1_ps(0.00961812910762848f),
                       _mm256_set1_ps(0.00133335581464284f), _mm256_set1_ps(0.000154035303933816f),
                       _mm256_set1_ps(1.52527338040598e-05f)};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    __m256 r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm256_sub_ps(v, r);
    __m256 p = c[7];
    for (int k = 6; k >= 0; --k) p = _mm256_fmadd_ps(p, f, c[k]);
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(r), _mm256_set1_epi32(127)), 23);
    int odd = _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(v, _mm256_set1_ps(-126.0f), _CMP_NGE_UQ),
                                              _mm256_cmp_ps(v, _mm256_set1_ps(127.0f), _CMP_NLE_UQ)));
    alignas(32) float in[8];
    if (odd) _mm256_store_ps(in, v);  // x may be o (in place): keep the inputs the scalar path needs
    _mm256_storeu_ps(o + i, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
    for (int j = 0; odd; ++j, odd >>= 1)
      if (odd & 1) o[i + j] = float(std::exp2(double(in[j])));
  }
  for (; i < n; ++i) o[i] = float(std::exp2(double(x[i])));
}

__attribute__((target("avx2,fma"))) inline void axpy_f32_avx2(float alpha, const float* x, float* y, int64_t n) {
  __m256 a = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

// Totals eight rows' 8-lane accumulators (over their first kv values) by one add tree, adds their tails [kv, k)
// and stores them to out[0..8): the end of both dot_rows kernels, so that they give the same bits.
__attribute__((target("avx2,fma"))) inline void finish_rows8(const __m256* acc, const float* x, const float* rows,
                                                             int64_t stride, int64_t kv, int64_t k, float* out) {
  __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
  __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
  __m256 t = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  alignas(32) float o[8];
  _mm256_store_ps(o, t);
  for (int r = 0; r < 8; ++r) {
    for (int64_t j = kv; j < k; ++j) o[r] += x[j] * rows[r * stride + j];
    out[r] = o[r];
  }
}

// out[i] = x . rows[i * stride ..] for n rows of k values: eight rows at a time, their eight accumulators totalled by
// one add tree (instead of a horizontal sum per row: attention scores, a short row against many keys).
__attribute__((target("avx2,fma"))) inline void dot_rows_f32_avx2(const float* x, const float* rows, int64_t stride,
                                                                  int64_t n, int64_t k, float* out) {
  int64_t i = 0, kv = k / 8 * 8;
  for (; i + 8 <= n; i += 8) {
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int64_t j = 0; j < kv; j += 8) {
      __m256 xv = _mm256_loadu_ps(x + j);
      for (int r = 0; r < 8; ++r) acc[r] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(rows + (i + r) * stride + j), acc[r]);
    }
    finish_rows8(acc, x, rows + i * stride, stride, kv, k, out + i);
  }
  for (; i < n; ++i) out[i] = dot_f32_avx2(x, rows + i * stride, k);
}

// out[0..n) = sum_t w[t] * rows[t * stride + 0..n): the accumulators stay in registers across the rows (64 columns
// at a time) instead of a load and store of the output per row.
__attribute__((target("avx2,fma"))) inline void weighted_rows_f32_avx2(const float* w, const float* rows,
                                                                       int64_t stride, int64_t T, int64_t n,
                                                                       float* out) {
  int64_t c = 0;
  for (; c + 64 <= n; c += 64) {
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int64_t t = 0; t < T; ++t) {
      __m256 wt = _mm256_set1_ps(w[t]);
      const float* r = rows + t * stride + c;
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(wt, _mm256_loadu_ps(r + 8 * j), acc[j]);
    }
    for (int j = 0; j < 8; ++j) _mm256_storeu_ps(out + c + 8 * j, acc[j]);
  }
  for (; c + 8 <= n; c += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t t = 0; t < T; ++t) acc = _mm256_fmadd_ps(_mm256_set1_ps(w[t]), _mm256_loadu_ps(rows + t * stride + c), acc);
    _mm256_storeu_ps(out + c, acc);
  }
  for (; c < n; ++c) {
    float acc = 0;
    for (int64_t t = 0; t < T; ++t) acc += w[t] * rows[t * stride + c];
    out[c] = acc;
  }
}

// ---- AVX-512 (F/VL/BW/DQ; VNNI for the int8 dots) --------------------------------------------------------------
// Every function gives the AVX2 version's bits: elementwise ones (exp2, axpy, weighted_rows) do the same operations
// per lane and hand their last partial vector to the AVX2 version; the dot products keep the AVX2 version's 8-lane
// accumulators, two side by side in one 512-bit register, so every lane adds the same products in the same order.
#define LM_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")))
// GCC 12's AVX-512 headers start casts, extracts and broadcasts from a self-initialised "undefined" register, which
// -Wall reports wherever they are inlined (a false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define LM_Q_NS q_vnni
#define LM_Q_TARGET "avx512f,avx512vl,avx512bw,avx512dq,avx512vnni,avx2,fma,f16c"
#define LM_Q_VNNI 1
#include "core/cpu/simd_q8.inl"

// The AVX2 version's accumulators s0 s1 (s2 s3) side by side in one 512-bit register: the same lanes add the
// same products in the same order, with half the instructions.
LM_AVX512 inline float dot_f32_avx512(const float* a, const float* b, int64_t k) {
  __m512 s01 = _mm512_setzero_ps(), s23 = s01;
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    s01 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s01);
    s23 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s23);
  }
  return dot_f32_avx2_from(a, b, k, i, _mm512_castps512_ps256(s01), _mm512_extractf32x8_ps(s01, 1),
                           _mm512_castps512_ps256(s23), _mm512_extractf32x8_ps(s23, 1));
}

// Two rows' 8-lane accumulators side by side (rows r and r + 1 against the same weights), as dot_rx3_f32_avx2.
template <int R>
LM_AVX512 inline void dot_rx3_f32_avx512(const float* const* a, const float* const* w, int64_t k, float* out) {
  if constexpr (R % 2) {
    return dot_rx3_f32_avx2<R>(a, w, k, out);
  } else {
    constexpr int P = R / 2;
    __m512 s[3 * P];
    for (auto& x : s) x = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
      __m512 x0 = _mm512_broadcast_f32x8(_mm256_loadu_ps(w[0] + i)), x1 = _mm512_broadcast_f32x8(_mm256_loadu_ps(w[1] + i)),
             x2 = _mm512_broadcast_f32x8(_mm256_loadu_ps(w[2] + i));
      for (int p = 0; p < P; ++p) {
        __m512 y = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(a[2 * p] + i)),
                                      _mm256_loadu_ps(a[2 * p + 1] + i), 1);
        s[3 * p] = _mm512_fmadd_ps(y, x0, s[3 * p]);
        s[3 * p + 1] = _mm512_fmadd_ps(y, x1, s[3 * p + 1]);
        s[3 * p + 2] = _mm512_fmadd_ps(y, x2, s[3 * p + 2]);
      }
    }
    for (int p = 0; p < P; ++p)
      for (int c = 0; c < 3; ++c) {
        out[3 * (2 * p) + c] = hsum(_mm512_castps512_ps256(s[3 * p + c]));
        out[3 * (2 * p + 1) + c] = hsum(_mm512_extractf32x8_ps(s[3 * p + c], 1));
      }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 3; ++c)
        for (int64_t j = i; j < k; ++j) out[3 * r + c] += a[r][j] * w[c][j];
  }
}

LM_AVX512 inline void exp2_f32_avx512(const float* x, float* o, int64_t n) {
  const float c[8] = {1.0f, 0.693147180559945f, 0.240226506959101f, 0.0555041086648216f, 0.00961812910762848f,
                      0.00133335581464284f, 0.000154035303933816f, 1.52527338040598e-05f};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    __m512 r = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm512_sub_ps(v, r);
    __m512 p = _mm512_set1_ps(c[7]);
    for (int k = 6; k >= 0; --k) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[k]));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(r), _mm512_set1_epi32(127)), 23);
    unsigned odd = _mm512_cmp_ps_mask(v, _mm512_set1_ps(-126.0f), _CMP_NGE_UQ) |
                   _mm512_cmp_ps_mask(v, _mm512_set1_ps(127.0f), _CMP_NLE_UQ);
    alignas(64) float in[16];
    if (odd) _mm512_store_ps(in, v);  // x may be o (in place)
    _mm512_storeu_ps(o + i, _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
    for (; odd; odd &= odd - 1) {
      int j = __builtin_ctz(odd);
      o[i + j] = float(std::exp2(double(in[j])));
    }
  }
  exp2_f32_avx2(x + i, o + i, n - i);
}

LM_AVX512 inline void axpy_f32_avx512(float alpha, const float* x, float* y, int64_t n) {
  __m512 a = _mm512_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(a, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  axpy_f32_avx2(alpha, x + i, y + i, n - i);
}

// As dot_rows_f32_avx2 with rows r and r + 1 side by side in one register (x in both halves): the same bits.
LM_AVX512 inline void dot_rows_f32_avx512(const float* x, const float* rows, int64_t stride, int64_t n, int64_t k,
                                          float* out) {
  int64_t i = 0, kv = k / 8 * 8;
  for (; i + 8 <= n; i += 8) {
    __m512 acc[4];
    for (auto& a : acc) a = _mm512_setzero_ps();
    for (int64_t j = 0; j < kv; j += 8) {
      __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + j));
      for (int p = 0; p < 4; ++p) {
        const float* r0 = rows + (i + 2 * p) * stride + j;
        __m512 y = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(r0)), _mm256_loadu_ps(r0 + stride), 1);
        acc[p] = _mm512_fmadd_ps(xv, y, acc[p]);
      }
    }
    __m256 h[8];
    for (int p = 0; p < 4; ++p) h[2 * p] = _mm512_castps512_ps256(acc[p]), h[2 * p + 1] = _mm512_extractf32x8_ps(acc[p], 1);
    finish_rows8(h, x, rows + i * stride, stride, kv, k, out + i);
  }
  for (; i < n; ++i) out[i] = dot_f32_avx512(x, rows + i * stride, k);
}

// As weighted_rows_f32_avx2, 64 columns at a time in four 16-lane accumulators.
LM_AVX512 inline void weighted_rows_f32_avx512(const float* w, const float* rows, int64_t stride, int64_t T,
                                               int64_t n, float* out) {
  int64_t c = 0;
  for (; c + 64 <= n; c += 64) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t t = 0; t < T; ++t) {
      __m512 wt = _mm512_set1_ps(w[t]);
      const float* r = rows + t * stride + c;
      a0 = _mm512_fmadd_ps(wt, _mm512_loadu_ps(r), a0);
      a1 = _mm512_fmadd_ps(wt, _mm512_loadu_ps(r + 16), a1);
      a2 = _mm512_fmadd_ps(wt, _mm512_loadu_ps(r + 32), a2);
      a3 = _mm512_fmadd_ps(wt, _mm512_loadu_ps(r + 48), a3);
    }
    _mm512_storeu_ps(out + c, a0), _mm512_storeu_ps(out + c + 16, a1);
    _mm512_storeu_ps(out + c + 32, a2), _mm512_storeu_ps(out + c + 48, a3);
  }
  for (; c + 16 <= n; c += 16) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t t = 0; t < T; ++t) acc = _mm512_fmadd_ps(_mm512_set1_ps(w[t]), _mm512_loadu_ps(rows + t * stride + c), acc);
    _mm512_storeu_ps(out + c, acc);
  }
  if (c < n) weighted_rows_f32_avx2(w, rows + c, stride, T, n - c, out + c);
}
#pragma GCC diagnostic pop
#undef LM_AVX512
#endif  // LUMINAL_X86

#ifdef LUMINAL_ARM
// ---- NEON (AArch64 Advanced SIMD; sdot where the CPU has dotprod) --------------------------------------------------
inline float dot_f32_neon(const float* a, const float* b, int64_t k) {
  float32x4_t s0 = vdupq_n_f32(0), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
    s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
    s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
  }
  for (; i + 4 <= k; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
  float s = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
  for (; i < k; ++i) s += a[i] * b[i];
  return s;
}

template <int R>
inline void dot_rx3_f32_neon(const float* const* a, const float* const* w, int64_t k, float* out) {
  float32x4_t s[3 * R];
  for (auto& x : s) x = vdupq_n_f32(0);
  int64_t i = 0;
  for (; i + 4 <= k; i += 4) {
    float32x4_t x0 = vld1q_f32(w[0] + i), x1 = vld1q_f32(w[1] + i), x2 = vld1q_f32(w[2] + i);
    for (int r = 0; r < R; ++r) {
      float32x4_t y = vld1q_f32(a[r] + i);
      s[3 * r] = vfmaq_f32(s[3 * r], y, x0);
      s[3 * r + 1] = vfmaq_f32(s[3 * r + 1], y, x1);
      s[3 * r + 2] = vfmaq_f32(s[3 * r + 2], y, x2);
    }
  }
  for (int j = 0; j < 3 * R; ++j) out[j] = vaddvq_f32(s[j]);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 3; ++c)
      for (int64_t j = i; j < k; ++j) out[3 * r + c] += a[r][j] * w[c][j];
}

// The same polynomial as exp2_f32_avx2; lanes outside [-126, 127] (and NaN) take the exact scalar path.
inline void exp2_f32_neon(const float* x, float* o, int64_t n) {
  const float c[8] = {1.0f, 0.693147180559945f, 0.240226506959101f, 0.0555041086648216f, 0.00961812910762848f,
                      0.00133335581464284f, 0.000154035303933816f, 1.52527338040598e-05f};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    float32x4_t v = vld1q_f32(x + i), r = vrndnq_f32(v), f = vsubq_f32(v, r);
    float32x4_t p = vdupq_n_f32(c[7]);
    for (int k = 6; k >= 0; --k) p = vfmaq_f32(vdupq_n_f32(c[k]), p, f);
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(r), vdupq_n_s32(127)), 23);
    uint32x4_t ok = vandq_u32(vcgeq_f32(v, vdupq_n_f32(-126.0f)), vcleq_f32(v, vdupq_n_f32(127.0f)));
    float in[4];
    vst1q_f32(in, v);  // x may be o (in place)
    vst1q_f32(o + i, vmulq_f32(p, vreinterpretq_f32_s32(e)));
    if (vminvq_u32(ok) == 0)
      for (int j = 0; j < 4; ++j)
        if (!(in[j] >= -126.0f && in[j] <= 127.0f)) o[i + j] = float(std::exp2(double(in[j])));
  }
  for (; i < n; ++i) o[i] = float(std::exp2(double(x[i])));
}

inline void axpy_f32_neon(float alpha, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), alpha));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

inline void weighted_rows_f32_neon(const float* w, const float* rows, int64_t stride, int64_t T, int64_t n,
                                   float* out) {
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) {
    float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t t = 0; t < T; ++t) {
      const float* r = rows + t * stride + c;
      a0 = vfmaq_n_f32(a0, vld1q_f32(r), w[t]);
      a1 = vfmaq_n_f32(a1, vld1q_f32(r + 4), w[t]);
      a2 = vfmaq_n_f32(a2, vld1q_f32(r + 8), w[t]);
      a3 = vfmaq_n_f32(a3, vld1q_f32(r + 12), w[t]);
    }
    vst1q_f32(out + c, a0), vst1q_f32(out + c + 4, a1), vst1q_f32(out + c + 8, a2), vst1q_f32(out + c + 12, a3);
  }
  for (; c < n; ++c) {
    float acc = 0;
    for (int64_t t = 0; t < T; ++t) acc += w[t] * rows[t * stride + c];
    out[c] = acc;
  }
}

// The same q, d and s as quantize_q8_portable (vcvtnq rounds to nearest even, as nearbyint does).
inline void quantize_q8_neon(const float* a, int64_t nb, int8_t* q, float* d, float* s) {
  for (int64_t b = 0; b < nb; ++b, a += 32, q += 32) {
    float32x4_t v[8];
    float32x4_t m = vdupq_n_f32(0);
    for (int i = 0; i < 8; ++i) {
      v[i] = vld1q_f32(a + 4 * i);
      m = vmaxq_f32(m, vabsq_f32(v[i]));
    }
    float db = vmaxvq_f32(m) / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
    int32x4_t sum = vdupq_n_s32(0);
    for (int i = 0; i < 8; i += 2) {
      int32x4_t x0 = vcvtnq_s32_f32(vmulq_n_f32(v[i], id)), x1 = vcvtnq_s32_f32(vmulq_n_f32(v[i + 1], id));
      sum = vaddq_s32(sum, vaddq_s32(x0, x1));
      int16x8_t h = vcombine_s16(vqmovn_s32(x0), vqmovn_s32(x1));
      vst1_s8(q + 4 * i, vqmovn_s16(h));
    }
    d[b] = db;
    s[b] = db * float(vaddvq_s32(sum));
  }
}

// One block's 32 integer products, in four int32 lanes: widening multiplies, or sdot (4 products a lane).
inline int32x4_t block_dot_neon(int8x16_t w0, int8x16_t w1, const int8_t* q) {
  int8x16_t a0 = vld1q_s8(q), a1 = vld1q_s8(q + 16);
  // Two products of at most 128 * 127 each fit int16.
  int16x8_t p0 = vmlal_s8(vmull_s8(vget_low_s8(w0), vget_low_s8(a0)), vget_high_s8(w0), vget_high_s8(a0));
  int16x8_t p1 = vmlal_s8(vmull_s8(vget_low_s8(w1), vget_low_s8(a1)), vget_high_s8(w1), vget_high_s8(a1));
  return vpadalq_s16(vpaddlq_s16(p0), p1);
}

#ifdef __clang__
#define LM_DOTPROD __attribute__((target("dotprod")))
#else
#define LM_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))  // as GCC's arm_neon.h declares vdotq_s32
#endif
LM_DOTPROD inline int32x4_t block_sdot_neon(int8x16_t w0, int8x16_t w1, const int8_t* q) {
  return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, vld1q_s8(q)), w1, vld1q_s8(q + 16));
}

// Activations laid out as quantize_q8 leaves them: each block's integer dot product, then blocks_total as
// dot_q8_portable does, so all three give identical bits.
#define LM_DOT_Q8_NEON(NAME, ATTR, BLOCK)                                                                         \
  ATTR inline float NAME(int block_bytes, const uint8_t* w, const int8_t* q, const float* d, const float* s,      \
                         int64_t nb) {                                                                            \
    float total = 0;                                                                                              \
    int32_t acc[kBlocksPerTotal];                                                                                 \
    const uint8x16_t low = vdupq_n_u8(0x0f);                                                                      \
    for (int64_t b0 = 0; b0 < nb; b0 += kBlocksPerTotal) {                                                        \
      int64_t n = std::min(kBlocksPerTotal, nb - b0);                                                             \
      for (int64_t j = 0; j < n; ++j) {                                                                           \
        const uint8_t* wb = w + (b0 + j) * block_bytes;                                                           \
        int8x16_t w0, w1;                                                                                         \
        if (block_bytes == 34) {                                                                                  \
          w0 = vld1q_s8(reinterpret_cast<const int8_t*>(wb + 2));                                                 \
          w1 = vld1q_s8(reinterpret_cast<const int8_t*>(wb + 18));                                                \
        } else {                                                                                                  \
          uint8x16_t x = vld1q_u8(wb + (block_bytes == 20 ? 4 : 2));                                              \
          w0 = vreinterpretq_s8_u8(vandq_u8(x, low)), w1 = vreinterpretq_s8_u8(vshrq_n_u8(x, 4));                \
        }                                                                                                         \
        acc[j] = vaddvq_s32(BLOCK(w0, w1, q + 32 * (b0 + j)));                                                    \
      }                                                                                                           \
      total += blocks_total(block_bytes, w + b0 * block_bytes, acc, d + b0, s + b0, n);                           \
    }                                                                                                             \
    return total;                                                                                                 \
  }
LM_DOT_Q8_NEON(dot_q8_neon, , block_dot_neon)
LM_DOT_Q8_NEON(dot_q8_neon_dotprod, LM_DOTPROD, block_sdot_neon)
#undef LM_DOT_Q8_NEON
#undef LM_DOTPROD
#endif  // LUMINAL_ARM

// Kept for callers of the older switch: whether the x86 AVX2 (or AVX-512) kernels run.
inline bool have_avx2() { return isa_at_least_avx2(); }

// ---- dispatch: every kernel family on cpu_isa() ---------------------------------------------------------------------
#ifdef LUMINAL_X86
#define LM_X86(avx512_call, avx2_call)           \
  switch (cpu_isa()) {                           \
    case CpuIsa::Avx512: return avx512_call;     \
    case CpuIsa::Avx2: return avx2_call;         \
    default: break;                              \
  }
#else
#define LM_X86(avx512_call, avx2_call)
#endif
#ifdef LUMINAL_ARM
#define LM_ARM(neon_call) \
  if (isa_neon()) return neon_call;
#else
#define LM_ARM(neon_call)
#endif

inline float dot_f32(const float* a, const float* b, int64_t k) {
  LM_X86(dot_f32_avx512(a, b, k), dot_f32_avx2(a, b, k))
  LM_ARM(dot_f32_neon(a, b, k))
  return dot_f32_portable(a, b, k);
}

inline void weighted_rows_f32(const float* w, const float* rows, int64_t stride, int64_t T, int64_t n, float* out) {
  LM_X86(weighted_rows_f32_avx512(w, rows, stride, T, n, out), weighted_rows_f32_avx2(w, rows, stride, T, n, out))
  LM_ARM(weighted_rows_f32_neon(w, rows, stride, T, n, out))
  std::fill(out, out + n, 0.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < n; ++c) out[c] += w[t] * rows[t * stride + c];
}

inline void dot_rows_f32(const float* x, const float* rows, int64_t stride, int64_t n, int64_t k, float* out) {
  LM_X86(dot_rows_f32_avx512(x, rows, stride, n, k, out), dot_rows_f32_avx2(x, rows, stride, n, k, out))
  for (int64_t i = 0; i < n; ++i) out[i] = dot_f32(x, rows + i * stride, k);
}

inline void dot_rx3_f32(int rows, const float* const* a, const float* const* w, int64_t k, float* out) {
#define LM_RX3(fn)                               \
  switch (rows) {                                \
    case 4: return fn<4>(a, w, k, out);          \
    case 3: return fn<3>(a, w, k, out);          \
    case 2: return fn<2>(a, w, k, out);          \
    case 1: return fn<1>(a, w, k, out);          \
  }
#ifdef LUMINAL_X86
  if (isa_avx512()) { LM_RX3(dot_rx3_f32_avx512) }
  if (isa_at_least_avx2()) { LM_RX3(dot_rx3_f32_avx2) }
#endif
#ifdef LUMINAL_ARM
  if (isa_neon()) { LM_RX3(dot_rx3_f32_neon) }
#endif
#undef LM_RX3
  dot_rx3_f32_portable(rows, a, w, k, out);
}

inline void dequant_blocks_portable(int block_bytes, const uint8_t* w, int64_t nb, float* out) {
  for (int64_t b = 0; b < nb; ++b, w += block_bytes, out += 32) {
    float d = half(w);
    if (block_bytes == 34) {
      for (int j = 0; j < 32; ++j) out[j] = d * float(int8_t(w[2 + j]));
    } else if (block_bytes == 18) {
      for (int j = 0; j < 16; ++j) {
        out[j] = d * float(int(w[2 + j] & 0xf) - 8);
        out[j + 16] = d * float(int(w[2 + j] >> 4) - 8);
      }
    } else {
      float m = half(w + 2);
      for (int j = 0; j < 16; ++j) {
        out[j] = d * float(w[4 + j] & 0xf) + m;
        out[j + 16] = d * float(w[4 + j] >> 4) + m;
      }
    }
  }
}

inline void dequant_blocks(int block_bytes, const uint8_t* w, int64_t nb, float* out) {
  LM_X86(dequant_blocks_avx2(block_bytes, w, nb, out), dequant_blocks_avx2(block_bytes, w, nb, out))
  dequant_blocks_portable(block_bytes, w, nb, out);
}

// y += alpha * x
inline void axpy_f32(float alpha, const float* x, float* y, int64_t n) {
  LM_X86(axpy_f32_avx512(alpha, x, y, n), axpy_f32_avx2(alpha, x, y, n))
  LM_ARM(axpy_f32_neon(alpha, x, y, n))
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

inline void exp2_f32(const float* x, float* o, int64_t n) {
  LM_X86(exp2_f32_avx512(x, o, n), exp2_f32_avx2(x, o, n))
  LM_ARM(exp2_f32_neon(x, o, n))
  for (int64_t i = 0; i < n; ++i) o[i] = float(std::exp2(double(x[i])));
}

inline void quantize_q8(const float* a, int64_t nb, int8_t* q, float* d, float* s) {
  LM_X86(quantize_q8_avx2(a, nb, q, d, s), quantize_q8_avx2(a, nb, q, d, s))
  LM_ARM(quantize_q8_neon(a, nb, q, d, s))
  quantize_q8_portable(a, nb, q, d, s);
}

// Whether dot_q8 wants the activations of a weight in `block_bytes` blocks laid out by pair_activations.
inline bool wants_pairs(int block_bytes) { return isa_at_least_avx2() && block_bytes != 34; }

// Lays quantised activations out for the x86 dot_q4_pairs: each block pair (2k, 2k+1) as the low halves of both,
// then the high halves (an odd last block stays as it is); in each whole group of eight blocks the scales and sums
// in the order 0 2 4 6 1 3 5 7.
inline void pair_activations(int8_t* q, float* d, float* s, int64_t nb) {
  int8_t t[64];
  for (int64_t b = 0; b + 2 <= nb; b += 2) {
    int8_t* p = q + 32 * b;
    for (int half = 0; half < 2; ++half) {
      std::memcpy(t + 32 * half, p + 16 * half, 16);
      std::memcpy(t + 32 * half + 16, p + 32 + 16 * half, 16);
    }
    std::memcpy(p, t, 64);
  }
  float td[8], ts[8];
  static const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  for (int64_t b = 0; b + 8 <= nb; b += 8) {
    for (int j = 0; j < 8; ++j) {
      td[j] = d[b + order[j]];
      ts[j] = s[b + order[j]];
    }
    std::memcpy(d + b, td, sizeof td);
    std::memcpy(s + b, ts, sizeof ts);
  }
}

// The int8 dot products (VNNI and AVX2 give identical bits; NEON with or without dotprod the portable ones).
inline float dot_q8(int block_bytes, const uint8_t* w, const int8_t* q, const float* d, const float* s, int64_t nb) {
#ifdef LUMINAL_X86
  if (isa_vnni()) {
    if (block_bytes == 34) return q_vnni::dot_q8_0(w, q, d, nb);
    if (block_bytes == 20) return q_vnni::dot_q4_pairs<20>(w, q, d, s, nb);
    return q_vnni::dot_q4_pairs<18>(w, q, d, s, nb);
  }
  if (isa_at_least_avx2()) {
    if (block_bytes == 34) return q_avx2::dot_q8_0(w, q, d, nb);
    if (block_bytes == 20) return q_avx2::dot_q4_pairs<20>(w, q, d, s, nb);
    return q_avx2::dot_q4_pairs<18>(w, q, d, s, nb);
  }
#endif
#ifdef LUMINAL_ARM
  if (isa_dotprod()) return dot_q8_neon_dotprod(block_bytes, w, q, d, s, nb);
  if (isa_neon()) return dot_q8_neon(block_bytes, w, q, d, s, nb);
#endif
  return dot_q8_portable(block_bytes, w, q, d, s, nb);
}
#undef LM_X86
#undef LM_ARM

}  // namespace luminal::simd
