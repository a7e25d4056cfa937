// The x86 int8 dot-product kernels of the quantised matvec (see simd.h), included once per instruction set:
// LM_Q_NS names the namespace, LM_Q_TARGET the target, LM_Q_VNNI 1 replaces each maddubs + madd pair by VNNI's
// vpdpbusd (256-bit, AVX-512 VL). Both sum the same exact integer products into the same int32 lanes, so the two
// instantiations give identical bits.
#define LM_Q_ATTR __attribute__((target(LM_Q_TARGET)))
namespace LM_Q_NS {

// One block of weights (BB bytes: Q8_0 34, Q4_0 18, Q4_1 20) against 32 int8 activations: 8 lanes of int32
// partial sums.
template <int BB>
LM_Q_ATTR inline __m256i block_dot_q8(const uint8_t* w, const int8_t* q) {
  __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)), p16;
  if (BB == 34) {
    // maddubs multiplies unsigned by signed bytes: move the weight's sign onto the activation.
    __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2));
#if LM_Q_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qa, qw));
#else
    p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qa, qw));
#endif
  } else {
    // The 16 bytes in both halves, the upper half shifted right by a nibble (within 64-bit lanes: the bits that
    // cross into a byte from its neighbour are masked off with the other high nibbles).
    __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + (BB == 20 ? 4 : 2))));
    __m256i qw = _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0f));
#if LM_Q_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), qw, qa);
#else
    p16 = _mm256_maddubs_epi16(qw, qa);
#endif
  }
  return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

// Q8_0: blocks go eight at a time; each block's integer dot product is totalled in one lane, so the eight scales
// apply with one multiply-add instead of scalar work per block. The scales are put together by 16-bit inserts
// (cheaper than a gather on Zen 3); the last 1-7 blocks are a group with the missing lanes zero.
LM_Q_ATTR inline float dot_q8_0(const uint8_t* w, const int8_t* q,
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
LM_Q_ATTR inline __m256i pair_dot_q4(const uint8_t* w, const int8_t* q) {
  const __m256i low = _mm256_set1_epi8(0x0f);
  __m256i x = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(w + BB + H), reinterpret_cast<const __m128i*>(w + H));
  __m256i lo = _mm256_and_si256(x, low), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), low);
  __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32));
#if LM_Q_VNNI
  return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, a), hi, c);
#else
  return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, a), _mm256_maddubs_epi16(hi, c)),
                           _mm256_set1_epi16(1));
#endif
}

// Q4_0/Q4_1 eight blocks at a time, two blocks per vector (pair_dot_q4): the block totals come out of a three-step
// add tree in the order 0 2 4 6 1 3 5 7, the order in which four unaligned loads bring the blocks' scales (no
// gather: measured ~9 cycles a group on Zen 3). Then the leftover pairs, then an odd last block.
template <int BB>
LM_Q_ATTR inline float dot_q4_pairs(const uint8_t* w, const int8_t* q,
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

}  // namespace LM_Q_NS
#undef LM_Q_ATTR
#undef LM_Q_NS
#undef LM_Q_TARGET
#undef LM_Q_VNNI
