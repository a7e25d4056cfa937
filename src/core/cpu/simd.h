// Dot-product kernels: a portable version and, on x86-64, an AVX2/FMA/F16C version chosen at run time by CPUID.
// GGUF weight blocks (32 weights: Q8_0 = d, 32 x int8; Q4_0 = d, 16 bytes of nibbles, q - 8; Q4_1 = d, m, 16 bytes)
// meet int8 activation blocks (scale da, sum sa = da * sum qa) as
//   sum_j (d*q_j + m) * da*qa_j = d*da * sum_j q_j*qa_j + m * sa
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/dtype.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define LUMINAL_X86 1
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

inline float dot_q8_portable(int block_bytes, const uint8_t* w, const int8_t* q, const float* d, const float* s,
                             int64_t nb) {
  float total = 0;
  for (int64_t b = 0; b < nb; ++b, w += block_bytes, q += 32) {
    int acc = 0;
    if (block_bytes == 34) {
      for (int j = 0; j < 32; ++j) acc += int(int8_t(w[2 + j])) * q[j];
      total += half(w) * (d[b] * float(acc));
      continue;
    }
    const uint8_t* p = w + (block_bytes == 20 ? 4 : 2);
    for (int j = 0; j < 16; ++j) acc += int(p[j] & 0xf) * q[j] + int(p[j] >> 4) * q[j + 16];
    total += block_bytes == 20 ? half(w) * (d[b] * float(acc)) + half(w + 2) * s[b]
                               : half(w) * (d[b] * float(acc) - 8.0f * s[b]);
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

__attribute__((target("avx2,fma"))) inline float dot_f32_avx2(const float* a, const float* b, int64_t k) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  int64_t i = 0;
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

// One block of weights (BB bytes: Q8_0 34, Q4_0 18, Q4_1 20) against 32 int8 activations: 8 lanes of int32
// partial sums.
template <int BB>
__attribute__((target("avx2,fma"))) inline __m256i block_dot_q8(const uint8_t* w, const int8_t* q) {
  __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)), p16;
  if (BB == 34) {
    // maddubs multiplies unsigned by signed bytes: move the weight's sign onto the activation.
    __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2));
    p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qa, qw));
  } else {
    // The 16 bytes in both halves, the upper half shifted right by a nibble (within 64-bit lanes: the bits that
    // cross into a byte from its neighbour are masked off with the other high nibbles).
    __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + (BB == 20 ? 4 : 2))));
    __m256i qw = _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0f));
    p16 = _mm256_maddubs_epi16(qw, qa);
  }
  return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

// The eight 8-lane sums p[0..7] of eight blocks -> one vector of their totals (block j in lane j).
__attribute__((target("avx2"))) inline __m256i block_totals(const __m256i* p) {
  __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
  __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
  // a: blocks 0-3 summed over each 128-bit half; b: blocks 4-7. Add the halves.
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

// Q8_0: blocks go eight at a time; each block's integer dot product is totalled in one lane, so the eight scales
// apply with one multiply-add instead of scalar work per block. The scales are put together by 16-bit inserts
// (cheaper than a gather on Zen 3); the last 1-7 blocks are a group with the missing lanes zero.
__attribute__((target("avx2,fma,f16c"))) inline float dot_q8_0_avx2(const uint8_t* w, const int8_t* q,
                                                                      const float* d, int64_t nb) {
  constexpr int BB = 34;
  auto half_at = [](const uint8_t* x) {
    uint16_t h;
    std::memcpy(&h, x, 2);
    return int(h);
  };
  __m256 acc = _mm256_setzero_ps();
  __m256i p[8];
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8, w += 8 * BB, q += 256) {
    for (int j = 0; j < 8; ++j) p[j] = block_dot_q8<BB>(w + j * BB, q + 32 * j);
    __m128i h = _mm_cvtsi32_si128(half_at(w));
    h = _mm_insert_epi16(h, half_at(w + BB), 1);
    h = _mm_insert_epi16(h, half_at(w + 2 * BB), 2);
    h = _mm_insert_epi16(h, half_at(w + 3 * BB), 3);
    h = _mm_insert_epi16(h, half_at(w + 4 * BB), 4);
    h = _mm_insert_epi16(h, half_at(w + 5 * BB), 5);
    h = _mm_insert_epi16(h, half_at(w + 6 * BB), 6);
    h = _mm_insert_epi16(h, half_at(w + 7 * BB), 7);
    acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(d + b)),
                          _mm256_cvtepi32_ps(block_totals(p)), acc);
  }
  if (int left = int(nb - b)) {
    alignas(16) uint16_t h[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < 8; ++j) {
      p[j] = j < left ? block_dot_q8<BB>(w + j * BB, q + 32 * j) : _mm256_setzero_si256();
      if (j < left) h[j] = uint16_t(half_at(w + j * BB));
    }
    __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h)));
    acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_maskload_ps(d + b, live)), _mm256_cvtepi32_ps(block_totals(p)),
                          acc);
  }
  return hsum(acc);
}

// Two Q4 blocks (BB bytes each, their nibbles after H header bytes) against activations laid out by
// pair_activations: one mask and one shift unpack both; 8 int32 lanes, the first block's partial sums in the low
// half. Each maddubs pair sum is at most 2 * 15 * 127, so two of them add without overflow in 16 bits.
template <int BB, int H>
__attribute__((target("avx2"))) inline __m256i pair_dot_q4(const uint8_t* w, const int8_t* q) {
  const __m256i low = _mm256_set1_epi8(0x0f);
  __m256i x = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(w + BB + H), reinterpret_cast<const __m128i*>(w + H));
  __m256i lo = _mm256_and_si256(x, low), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), low);
  __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32));
  return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, a), _mm256_maddubs_epi16(hi, c)),
                           _mm256_set1_epi16(1));
}

// Q4_0/Q4_1 eight blocks at a time, two blocks per vector (pair_dot_q4): the block totals come out of a three-step
// add tree in the order 0 2 4 6 1 3 5 7, the order in which four unaligned loads bring the blocks' scales (no
// gather: measured ~9 cycles a group on Zen 3). Then the leftover pairs, then an odd last block.
template <int BB>
__attribute__((target("avx2,fma,f16c"))) inline float dot_q4_pairs_avx2(const uint8_t* w, const int8_t* q,
                                                                          const float* d, const float* s, int64_t nb) {
  constexpr int H = BB == 20 ? 4 : 2;  // header bytes: the scale (and Q4_1's minimum)
  // Load k (at block 2k) holds block 2k's header at byte 0 and block 2k+1's at byte BB - 16 of its upper half; the
  // masks move them to 32-bit lane k of each half.
  struct Masks {
    alignas(32) int8_t m[4][32];
    Masks() {
      for (int k = 0; k < 4; ++k)
        for (int i = 0; i < 32; ++i)
          m[k][i] = i % 16 >= 4 * k && i % 16 < 4 * k + H ? int8_t(i % 16 - 4 * k + (i < 16 ? 0 : BB - 16)) : -1;
    }
  };
  static const Masks masks;
  const __m256i* pick = reinterpret_cast<const __m256i*>(masks.m);
  // Per 128-bit half: the low float16 of each lane into bytes 0-7, the high one into bytes 8-15; then the 64-bit
  // pieces in the order low(0), low(1), high(0), high(1).
  const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                         0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  __m256 acc = _mm256_setzero_ps(), mins = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8, w += 8 * BB, q += 256) {
    __m256i v[4];
    __m256i raw = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      const uint8_t* pair = w + 2 * k * BB;
      raw = _mm256_or_si256(raw, _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pair)),
                                                     pick[k]));
      v[k] = pair_dot_q4<BB, H>(pair, q + 64 * k);
    }
    __m256i totals = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    __m256i h = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(raw, split), 0xD8);
    __m256 dw = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_loadu_ps(d + b)), _mm256_cvtepi32_ps(totals), acc);
    if (BB == 20) mins = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), _mm256_loadu_ps(s + b), mins);
    else mins = _mm256_fmadd_ps(dw, _mm256_loadu_ps(s + b), mins);
  }
  // Leftover pairs, each half's scale applied on its own; an odd last block (laid out as usual) the same way.
  float extra = 0;
  for (; b < nb; b += 2, w += 2 * BB, q += 64) {
    bool pair = b + 1 < nb;
    __m256i v = pair ? pair_dot_q4<BB, H>(w, q) : block_dot_q8<BB>(w, q);
    float d0 = half_f16c(w), d1 = pair ? half_f16c(w + BB) : 0.0f;
    // A lone block's 8 lanes all belong to it; a pair's low half is its first block, its high half the second.
    __m256 scale = _mm256_set_m128(_mm_set1_ps(pair ? d1 * d[b + 1] : d0 * d[b]), _mm_set1_ps(d0 * d[b]));
    acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(v), acc);
    for (int j = 0; j < (pair ? 2 : 1); ++j) {
      const uint8_t* wj = w + j * BB;
      extra += BB == 20 ? half_f16c(wj + 2) * s[b + j] : -8.0f * half_f16c(wj) * s[b + j];
    }
  }
  return hsum(BB == 18 ? _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), mins, acc) : _mm256_add_ps(acc, mins)) + extra;
}

// 2^x for float32: x = n + f with |f| <= 1/2, 2^f by its degree-7 Taylor polynomial (truncation error below
// 1e-8 relative), times 2^n put into the exponent bits. Within 2 ulp of the correctly rounded result. Lanes outside
// [-126, 127] (overflow, subnormal results, inf, NaN) take the exact scalar path.
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
    _mm256_storeu_ps(o + i, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
    int odd = _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(v, _mm256_set1_ps(-126.0f), _CMP_NGE_UQ),
                                              _mm256_cmp_ps(v, _mm256_set1_ps(127.0f), _CMP_NLE_UQ)));
    for (int j = 0; odd; ++j, odd >>= 1)
      if (odd & 1) o[i + j] = float(std::exp2(double(x[i + j])));
  }
  for (; i < n; ++i) o[i] = float(std::exp2(double(x[i])));
}

__attribute__((target("avx2,fma"))) inline void axpy_f32_avx2(float alpha, const float* x, float* y, int64_t n) {
  __m256 a = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
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
    __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
    __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
    __m256 t = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    alignas(32) float o[8];
    _mm256_store_ps(o, t);
    for (int r = 0; r < 8; ++r) {
      for (int64_t j = kv; j < k; ++j) o[r] += x[j] * rows[(i + r) * stride + j];
      out[i + r] = o[r];
    }
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

// LUMINAL_NO_AVX2=1 forces the portable kernels (how the tests check them on an AVX2 machine).
inline bool have_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c") && !std::getenv("LUMINAL_NO_AVX2");
  return ok;
}
#endif

// ---- dispatch ------------------------------------------------------------------------------------------------------
inline float dot_f32(const float* a, const float* b, int64_t k) {
#ifdef LUMINAL_X86
  if (have_avx2()) return dot_f32_avx2(a, b, k);
#endif
  return dot_f32_portable(a, b, k);
}

inline void weighted_rows_f32(const float* w, const float* rows, int64_t stride, int64_t T, int64_t n, float* out) {
#ifdef LUMINAL_X86
  if (have_avx2()) return weighted_rows_f32_avx2(w, rows, stride, T, n, out);
#endif
  std::fill(out, out + n, 0.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < n; ++c) out[c] += w[t] * rows[t * stride + c];
}

inline void dot_rows_f32(const float* x, const float* rows, int64_t stride, int64_t n, int64_t k, float* out) {
#ifdef LUMINAL_X86
  if (have_avx2()) return dot_rows_f32_avx2(x, rows, stride, n, k, out);
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = dot_f32_portable(x, rows + i * stride, k);
}

inline void dot_rx3_f32(int rows, const float* const* a, const float* const* w, int64_t k, float* out) {
#ifdef LUMINAL_X86
  if (have_avx2()) {
    switch (rows) {
      case 4: return dot_rx3_f32_avx2<4>(a, w, k, out);
      case 3: return dot_rx3_f32_avx2<3>(a, w, k, out);
      case 2: return dot_rx3_f32_avx2<2>(a, w, k, out);
      case 1: return dot_rx3_f32_avx2<1>(a, w, k, out);
    }
  }
#endif
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
#ifdef LUMINAL_X86
  if (have_avx2()) return dequant_blocks_avx2(block_bytes, w, nb, out);
#endif
  dequant_blocks_portable(block_bytes, w, nb, out);
}

// y += alpha * x
inline void axpy_f32(float alpha, const float* x, float* y, int64_t n) {
#ifdef LUMINAL_X86
  if (have_avx2()) return axpy_f32_avx2(alpha, x, y, n);
#endif
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

inline void exp2_f32(const float* x, float* o, int64_t n) {
#ifdef LUMINAL_X86
  if (have_avx2()) return exp2_f32_avx2(x, o, n);
#endif
  for (int64_t i = 0; i < n; ++i) o[i] = float(std::exp2(double(x[i])));
}

inline void quantize_q8(const float* a, int64_t nb, int8_t* q, float* d, float* s) {
#ifdef LUMINAL_X86
  if (have_avx2()) return quantize_q8_avx2(a, nb, q, d, s);
#endif
  quantize_q8_portable(a, nb, q, d, s);
}

// Whether dot_q8 wants the activations of a weight in `block_bytes` blocks laid out by pair_activations.
inline bool wants_pairs(int block_bytes) {
#ifdef LUMINAL_X86
  return have_avx2() && block_bytes != 34;
#else
  (void)block_bytes;
  return false;
#endif
}

// Lays quantised activations out for dot_q4_pairs_avx2: each block pair (2k, 2k+1) as the low halves of both, then
// the high halves (an odd last block stays as it is); in each whole group of eight blocks the scales and sums in
// the order 0 2 4 6 1 3 5 7.
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

inline float dot_q8(int block_bytes, const uint8_t* w, const int8_t* q, const float* d, const float* s, int64_t nb) {
#ifdef LUMINAL_X86
  if (have_avx2()) {
    if (block_bytes == 34) return dot_q8_0_avx2(w, q, d, nb);
    if (block_bytes == 20) return dot_q4_pairs_avx2<20>(w, q, d, s, nb);
    return dot_q4_pairs_avx2<18>(w, q, d, s, nb);
  }
#endif
  return dot_q8_portable(block_bytes, w, q, d, s, nb);
}

}  // namespace luminal::simd
