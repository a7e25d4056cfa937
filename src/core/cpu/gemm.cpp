// A packed float32 GEMM for large products (prefill of float models, convolutions): C = A B^T with every operand
// addressed through offset tables (element (r, k) of A at A.base[A.row[r] + A.k[k]]), so any strided view, several
// dims folded into rows, and a reduced axis made of several dims (a convolution's channels x kernel window read
// through the input's overlapping window view) all pack straight from where they lie: no im2col buffer.
// Cache-blocked the usual way: the smaller operand's block of k (KC) is packed once and shared by the threads,
// which split the other operand into chunks, pack them into panels and run a register tile over them: 8 x 32 with
// AVX-512, 6 x 16 with AVX2 or NEON (by cpu_isa()).
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cpu/cpu.h"
#include "core/cpu/simd.h"

namespace luminal {
namespace {

constexpr int64_t MC = 72, NC = 128;  // rows of A per block (a multiple of every MR), columns of B per chunk

#ifdef LUMINAL_X86
// d[j] = s[2 j] for j < n (n a multiple of 8, at least 16): a stride-2 convolution's window along a row. Pairs of
// vectors are split into their even lanes; the last eight come from the odd lanes of a load one element earlier,
// so nothing past s[2 n - 2] is read.
__attribute__((target("avx2"))) void copy_stride2_avx2(const float* s, float* d, int n) {
  int j = 0;
  for (; j + 8 < n; j += 8) {
    __m256 t = _mm256_shuffle_ps(_mm256_loadu_ps(s + 2 * j), _mm256_loadu_ps(s + 2 * j + 8), _MM_SHUFFLE(2, 0, 2, 0));
    _mm256_storeu_ps(d + j, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t), 0xD8)));
  }
  __m256 t = _mm256_shuffle_ps(_mm256_loadu_ps(s + 2 * j - 1), _mm256_loadu_ps(s + 2 * j + 7), _MM_SHUFFLE(3, 1, 3, 1));
  _mm256_storeu_ps(d + j, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t), 0xD8)));
}
#endif

// Rows [r0, r0 + rows) over k in [k0, k0 + kc) of `x` as panels of W rows (each kc groups of W values, missing
// rows zero), one after another in dst. Rows that lie next to each other (a row-major matrix, a convolution's
// window along a row) are copied as runs, walking k outermost so that the rows of k, which may lie a power of two
// apart and fight for the same cache sets, are each read once; rows contiguous along k are read one by one;
// anything else is gathered.
template <int W>
void pack(const GemmOperand& x, int64_t r0, int64_t rows, int64_t k0, int64_t kc, float* dst) {
  const int64_t *row = x.row + r0, *kt = x.k + k0;
  int64_t np = (rows + W - 1) / W, tail = rows - (np - 1) * W;
  if (tail < W) std::fill(dst + (np - 1) * W * kc, dst + np * W * kc, 0.0f);
  // Per panel: the step between its rows where it is constant (1: a run; a strided convolution's window along a
  // row: its stride), else 0.
  thread_local std::vector<int64_t> step;
  step.assign(size_t(np), 0);
  bool runs = true;
  for (int64_t q = 0; q < np; ++q) {
    const int64_t* rq = row + q * W;
    int64_t n = q + 1 < np ? W : tail, st = n > 1 ? rq[1] - rq[0] : 1;
    for (int64_t j = 2; j < n && st; ++j)
      if (rq[j] - rq[j - 1] != st) st = 0;
    step[size_t(q)] = st;
    runs = runs && st == 1;
  }
  bool k_run = true;
  for (int64_t k = 1; k < kc && k_run; ++k) k_run = kt[k] == kt[0] + k;
#ifdef LUMINAL_X86
  const bool stride2 = isa_at_least_avx2();
#else
  constexpr bool stride2 = false;
  auto copy_stride2_avx2 = [](const float*, float*, int) {};
#endif
  if (!runs && k_run) {
    for (int64_t j = 0; j < rows; ++j) {
      const float* s = x.base + row[j] + kt[0];
      float* d = dst + (j / W) * W * kc + j % W;
      for (int64_t k = 0; k < kc; ++k) d[k * W] = s[k];
    }
    return;
  }
  for (int64_t k = 0; k < kc; ++k) {
    const float* s = x.base + kt[k];
    for (int64_t q = 0; q < np; ++q) {
      const int64_t* rq = row + q * W;
      float* d = dst + q * W * kc + k * W;
      int n = int(q + 1 < np ? W : tail);
      int64_t st = step[size_t(q)];
      if (st == 1 && n == W) {
        std::memcpy(d, s + rq[0], W * sizeof(float));  // a whole panel: vector moves
      } else if (st == 2 && n == W && W % 8 == 0 && W >= 16 && stride2) {
        copy_stride2_avx2(s + rq[0], d, W);
      } else if (st) {
        const float* s0 = s + rq[0];
        for (int j = 0; j < n; ++j) d[j] = s0[j * st];
      } else {
        for (int j = 0; j < n; ++j) d[j] = s[rq[j]];
      }
    }
  }
}

// Writes (or adds) an mr x nr tile t (row stride NR) to C rows m0.., columns n0.. .
template <int NR>
void store(const float* t, const GemmOut& c, int64_t m0, int64_t n0, int mr, int nr, bool add) {
  const int64_t* col = c.col + n0;
  bool run = col[nr - 1] == col[0] + nr - 1;  // the columns of a panel are usually one run
  for (int i = 0; i < mr; ++i) {
    float* o = c.base + c.row[m0 + i] + col[0];
    const float* s = t + i * NR;
    if (run) {
      if (add)
        for (int j = 0; j < nr; ++j) o[j] += s[j];
      else
        std::copy(s, s + nr, o);
    } else {
      float* b = c.base + c.row[m0 + i];
      for (int j = 0; j < nr; ++j) b[col[j]] = add ? b[col[j]] + s[j] : s[j];
    }
  }
}

// A register tile: t (MR x NR) = a_panel^T b_panel over kc, A packed (panels of MR rows) or read as MR rows where
// they lie (each contiguous along k).
template <int MR, int NR>
struct Tiles {
  static constexpr int mr = MR, nr = NR;
  void (*packed)(int64_t kc, const float* a, const float* b, float* t);
  void (*rows)(int64_t kc, const float* const* a, const float* b, float* t);
};

template <int MR, int NR>
void tile_portable(int64_t kc, const float* a, const float* b, float* t) {
  float acc[MR][NR] = {};
  for (int64_t k = 0; k < kc; ++k, a += MR, b += NR)
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] += a[i] * b[j];
  for (int i = 0; i < MR; ++i) std::copy(acc[i], acc[i] + NR, t + i * NR);
}

template <int MR, int NR>
void tile_rows_portable(int64_t kc, const float* const* a, const float* b, float* t) {
  float acc[MR][NR] = {};
  for (int64_t k = 0; k < kc; ++k, b += NR)
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] += a[i][k] * b[j];
  for (int i = 0; i < MR; ++i) std::copy(acc[i], acc[i] + NR, t + i * NR);
}

#ifdef LUMINAL_X86
// Each row: one broadcast of A and two vector FMAs into its two accumulators. The accumulators are named variables:
// kept in an array, GCC spilled them to the stack every iteration.
#define LM_ROW256(i, A) \
  x = _mm256_broadcast_ss(A); c##i##0 = _mm256_fmadd_ps(x, b0, c##i##0); c##i##1 = _mm256_fmadd_ps(x, b1, c##i##1);
#define LM_STORE256(i) _mm256_storeu_ps(t + i * 16, c##i##0); _mm256_storeu_ps(t + i * 16 + 8, c##i##1);
#define LM_ACC256 \
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00, \
         c40 = c00, c41 = c00, c50 = c00, c51 = c00;

// 6 x 16: twelve accumulators, two loads of B per k.
__attribute__((target("avx2,fma"))) void tile_avx2(int64_t kc, const float* a, const float* b, float* t) {
  LM_ACC256
  for (int64_t k = 0; k < kc; ++k, a += 6, b += 16) {
    __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8), x;
    LM_ROW256(0, a) LM_ROW256(1, a + 1) LM_ROW256(2, a + 2) LM_ROW256(3, a + 3) LM_ROW256(4, a + 4)
    LM_ROW256(5, a + 5)
  }
  LM_STORE256(0) LM_STORE256(1) LM_STORE256(2) LM_STORE256(3) LM_STORE256(4) LM_STORE256(5)
}

__attribute__((target("avx2,fma"))) void tile_rows_avx2(int64_t kc, const float* const* a, const float* b,
                                                        float* t) {
  LM_ACC256
  const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
  for (int64_t k = 0; k < kc; ++k, b += 16) {
    __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8), x;
    LM_ROW256(0, a0 + k) LM_ROW256(1, a1 + k) LM_ROW256(2, a2 + k) LM_ROW256(3, a3 + k) LM_ROW256(4, a4 + k)
    LM_ROW256(5, a5 + k)
  }
  LM_STORE256(0) LM_STORE256(1) LM_STORE256(2) LM_STORE256(3) LM_STORE256(4) LM_STORE256(5)
}

#define LM_ROW512(i, A) \
  x = _mm512_set1_ps(*(A)); c##i##0 = _mm512_fmadd_ps(x, b0, c##i##0); c##i##1 = _mm512_fmadd_ps(x, b1, c##i##1);
#define LM_STORE512(i) _mm512_storeu_ps(t + i * 32, c##i##0); _mm512_storeu_ps(t + i * 32 + 16, c##i##1);
#define LM_ACC512 \
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00, \
         c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;

// 8 x 32: sixteen of the 32 registers accumulate, two loads of B per k.
__attribute__((target("avx512f"))) void tile_avx512(int64_t kc, const float* a, const float* b, float* t) {
  LM_ACC512
  for (int64_t k = 0; k < kc; ++k, a += 8, b += 32) {
    __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16), x;
    LM_ROW512(0, a) LM_ROW512(1, a + 1) LM_ROW512(2, a + 2) LM_ROW512(3, a + 3) LM_ROW512(4, a + 4)
    LM_ROW512(5, a + 5) LM_ROW512(6, a + 6) LM_ROW512(7, a + 7)
  }
  LM_STORE512(0) LM_STORE512(1) LM_STORE512(2) LM_STORE512(3) LM_STORE512(4) LM_STORE512(5) LM_STORE512(6)
  LM_STORE512(7)
}

__attribute__((target("avx512f"))) void tile_rows_avx512(int64_t kc, const float* const* a, const float* b,
                                                         float* t) {
  LM_ACC512
  const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5], *a6 = a[6], *a7 = a[7];
  for (int64_t k = 0; k < kc; ++k, b += 32) {
    __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16), x;
    LM_ROW512(0, a0 + k) LM_ROW512(1, a1 + k) LM_ROW512(2, a2 + k) LM_ROW512(3, a3 + k) LM_ROW512(4, a4 + k)
    LM_ROW512(5, a5 + k) LM_ROW512(6, a6 + k) LM_ROW512(7, a7 + k)
  }
  LM_STORE512(0) LM_STORE512(1) LM_STORE512(2) LM_STORE512(3) LM_STORE512(4) LM_STORE512(5) LM_STORE512(6)
  LM_STORE512(7)
}
#undef LM_ROW256
#undef LM_STORE256
#undef LM_ACC256
#undef LM_ROW512
#undef LM_STORE512
#undef LM_ACC512

#endif

#ifdef LUMINAL_ARM
// 6 x 16: 24 accumulators of four lanes, four loads of B and two of A per k (32 registers in all).
#define LM_ROWN(i, lane, A)                    \
  c##i##0 = vfmaq_laneq_f32(c##i##0, b0, A, lane); \
  c##i##1 = vfmaq_laneq_f32(c##i##1, b1, A, lane); \
  c##i##2 = vfmaq_laneq_f32(c##i##2, b2, A, lane); \
  c##i##3 = vfmaq_laneq_f32(c##i##3, b3, A, lane);
#define LM_STOREN(i) \
  vst1q_f32(t + i * 16, c##i##0), vst1q_f32(t + i * 16 + 4, c##i##1), vst1q_f32(t + i * 16 + 8, c##i##2), \
      vst1q_f32(t + i * 16 + 12, c##i##3);
#define LM_ACCN                                                                                              \
  float32x4_t c00 = vdupq_n_f32(0), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00, c13 = c00, \
              c20 = c00, c21 = c00, c22 = c00, c23 = c00, c30 = c00, c31 = c00, c32 = c00, c33 = c00, c40 = c00, \
              c41 = c00, c42 = c00, c43 = c00, c50 = c00, c51 = c00, c52 = c00, c53 = c00;
#define LM_BODYN                                                                                          \
  float32x4_t b0 = vld1q_f32(b), b1 = vld1q_f32(b + 4), b2 = vld1q_f32(b + 8), b3 = vld1q_f32(b + 12); \
  LM_ROWN(0, 0, x) LM_ROWN(1, 1, x) LM_ROWN(2, 2, x) LM_ROWN(3, 3, x) LM_ROWN(4, 0, y) LM_ROWN(5, 1, y)
#define LM_STOREALLN LM_STOREN(0) LM_STOREN(1) LM_STOREN(2) LM_STOREN(3) LM_STOREN(4) LM_STOREN(5)

void tile_neon(int64_t kc, const float* a, const float* b, float* t) {
  LM_ACCN
  for (int64_t k = 0; k < kc; ++k, a += 6, b += 16) {
    float32x4_t x = vld1q_f32(a), y = vcombine_f32(vld1_f32(a + 4), vdup_n_f32(0));
    LM_BODYN
  }
  LM_STOREALLN
}

void tile_rows_neon(int64_t kc, const float* const* a, const float* b, float* t) {
  LM_ACCN
  const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
  for (int64_t k = 0; k < kc; ++k, b += 16) {
    float32x4_t x = {a0[k], a1[k], a2[k], a3[k]}, y = {a4[k], a5[k], 0.0f, 0.0f};
    LM_BODYN
  }
  LM_STOREALLN
}
#undef LM_ROWN
#undef LM_STOREN
#undef LM_ACCN
#undef LM_BODYN
#undef LM_STOREALLN
#endif

// Rows [m0, m0 + mc) of A against packed B panels [p0, p1) (of NR columns, panel p at column p * NR) over k in
// [k0, k0 + kc): every tile, written (or added) to C. A's rows come packed (`ap`: panels of MR rows from m0) or,
// with `ap` null, from where they lie (each contiguous along k).
template <class T>
void macro(const T& tiles, int64_t kc, const float* ap, const GemmOperand& A, int64_t k0, int64_t m0, int64_t mc,
           const float* bp, int64_t p0, int64_t p1, int64_t N, const GemmOut& c, bool add) {
  constexpr int MR = T::mr, NR = T::nr;
  alignas(64) float t[MR * NR];
  for (int64_t p = p0; p < p1; ++p) {
    int nr = int(std::min<int64_t>(NR, N - p * NR));
    const float* b = bp + (p - p0) * NR * kc;
    for (int64_t i = 0; i * MR < mc; ++i) {
      int mr = int(std::min<int64_t>(MR, mc - i * MR));
      if (ap) {
        tiles.packed(kc, ap + i * MR * kc, b, t);
      } else {
        const float* rows[MR];
        for (int r = 0; r < MR; ++r) rows[r] = A.base + A.row[m0 + i * MR + std::min(r, mr - 1)] + A.k[k0];
        tiles.rows(kc, rows, b, t);
      }
      store<NR>(t, c, m0 + i * MR, p * NR, mr, nr, add);
    }
  }
}

// The shared operand is packed whole (every block of k) when it is at most this many floats: each thread then
// runs every block of k over its own chunk of the other operand while that chunk's results stay in cache.
constexpr int64_t kWhole = int64_t(1) << 20;
constexpr int64_t kMaxKC = 512;

template <class T>
void gemm(const T& tiles, int64_t M, int64_t N, int64_t K, const GemmOperand& A, const GemmOperand& B,
          const GemmOut& C) {
  constexpr int MR = T::mr, NR = T::nr;
  // Blocks of k as even as they come, at most kMaxKC: one block up to kMaxKC, so C is written once, not added to.
  int64_t kblocks = (K + kMaxKC - 1) / kMaxKC, KC = (K + kblocks - 1) / kblocks;
  int64_t panels = (N + NR - 1) / NR, mpanels = (M + MR - 1) / MR;
  bool a_rows = true;  // A's rows contiguous along k (a row-major matrix, a weight): read without packing
  for (int64_t k = 1; k < K && a_rows; ++k) a_rows = A.k[k] == A.k[0] + k;
  thread_local std::vector<float> shared;  // the caller's: kept, so a run does not fault in fresh pages each time
  auto pack_a = [&](float* dst, int64_t k0, int64_t kc, int64_t m0, int64_t mc) { pack<MR>(A, m0, mc, k0, kc, dst); };
  if (M <= N && M * K <= kWhole) {
    // Few rows (a convolution's output channels against its many output positions): A packed whole, shared; the
    // threads split the columns in chunks, each packing its own.
    shared.resize(size_t(mpanels * MR * K));
    float* ap = shared.data();  // the workers must not name `shared`: they would get their own (empty) one
    parallel_for(kblocks * mpanels, MR * KC, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        int64_t k0 = (t / mpanels) * KC, kc = std::min(KC, K - k0), i = t % mpanels;
        pack<MR>(A, i * MR, std::min<int64_t>(MR, M - i * MR), k0, kc, ap + k0 * mpanels * MR + i * MR * kc);
      }
    });
    int64_t per = NC / NR, chunks = (panels + per - 1) / per;
    parallel_for(chunks, M * NC * K, [&](int64_t c0, int64_t c1) {
      thread_local std::vector<float> bp;
      bp.resize(size_t(NC * KC));
      for (int64_t ch = c0; ch < c1; ++ch) {
        int64_t p0 = ch * per, p1 = std::min(panels, p0 + per);
        for (int64_t k0 = 0; k0 < K; k0 += KC) {
          int64_t kc = std::min(KC, K - k0);
          pack<NR>(B, p0 * NR, std::min(N, p1 * NR) - p0 * NR, k0, kc, bp.data());
          for (int64_t m0 = 0; m0 < M; m0 += MC)  // A's rows in blocks that stay in L2 while B's chunk streams
            macro(tiles, kc, ap + k0 * mpanels * MR + m0 * kc, A, k0, m0, std::min(MC, M - m0), bp.data(), p0, p1,
                  N, C, k0 > 0);
        }
      }
    });
    return;
  }
  if (M > N && N * K <= kWhole) {
    // Few columns (a linear layer's outputs against many tokens, a late convolution's positions): B packed whole,
    // shared; the threads split the rows in blocks, reading A where it lies if they can.
    shared.resize(size_t(panels * NR * K));
    float* bp = shared.data();
    parallel_for(kblocks * panels, NR * KC, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        int64_t k0 = (t / panels) * KC, kc = std::min(KC, K - k0), p = t % panels;
        pack<NR>(B, p * NR, std::min<int64_t>(NR, N - p * NR), k0, kc, bp + k0 * panels * NR + p * NR * kc);
      }
    });
    int64_t blocks = (M + MC - 1) / MC;
    parallel_for(blocks, MC * N * K, [&](int64_t b0, int64_t b1) {
      thread_local std::vector<float> ap;
      ap.resize(size_t(MC * KC));
      for (int64_t blk = b0; blk < b1; ++blk) {
        int64_t m0 = blk * MC, mc = std::min(MC, M - m0);
        for (int64_t k0 = 0; k0 < K; k0 += KC) {
          int64_t kc = std::min(KC, K - k0);
          if (!a_rows) pack_a(ap.data(), k0, kc, m0, mc);
          macro(tiles, kc, a_rows ? nullptr : ap.data(), A, k0, m0, mc, bp + k0 * panels * NR, 0, panels, N, C,
                k0 > 0);
        }
      }
    });
    return;
  }
  // Both large: one block of k at a time, the smaller operand's block packed once and shared.
  for (int64_t k0 = 0; k0 < K; k0 += KC) {
    int64_t kc = std::min(KC, K - k0);
    bool add = k0 > 0;
    if (M <= N) {
      shared.resize(size_t(mpanels * MR * kc));
      float* ap = shared.data();
      parallel_for(mpanels, MR * kc, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i)
          pack<MR>(A, i * MR, std::min<int64_t>(MR, M - i * MR), k0, kc, ap + i * MR * kc);
      });
      int64_t per = NC / NR, chunks = (panels + per - 1) / per;
      parallel_for(chunks, M * NC * kc, [&](int64_t c0, int64_t c1) {
        thread_local std::vector<float> bp;
        bp.resize(size_t(NC * KC));
        for (int64_t ch = c0; ch < c1; ++ch) {
          int64_t p0 = ch * per, p1 = std::min(panels, p0 + per);
          pack<NR>(B, p0 * NR, std::min(N, p1 * NR) - p0 * NR, k0, kc, bp.data());
          for (int64_t m0 = 0; m0 < M; m0 += MC)
            macro(tiles, kc, ap + m0 * kc, A, k0, m0, std::min(MC, M - m0), bp.data(), p0, p1, N, C, add);
        }
      });
    } else {
      shared.resize(size_t(panels * NR * kc));
      float* bp = shared.data();
      parallel_for(panels, NR * kc, [&](int64_t q0, int64_t q1) {
        for (int64_t p = q0; p < q1; ++p)
          pack<NR>(B, p * NR, std::min<int64_t>(NR, N - p * NR), k0, kc, bp + p * NR * kc);
      });
      int64_t blocks = (M + MC - 1) / MC;
      parallel_for(blocks, MC * N * kc, [&](int64_t b0, int64_t b1) {
        thread_local std::vector<float> ap;
        ap.resize(size_t(MC * KC));
        for (int64_t blk = b0; blk < b1; ++blk) {
          int64_t m0 = blk * MC, mc = std::min(MC, M - m0);
          if (!a_rows) pack_a(ap.data(), k0, kc, m0, mc);
          macro(tiles, kc, a_rows ? nullptr : ap.data(), A, k0, m0, mc, bp, 0, panels, N, C, add);
        }
      });
    }
  }
}

}  // namespace

void gemm_f32(int64_t M, int64_t N, int64_t K, const GemmOperand& A, const GemmOperand& B, const GemmOut& C) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) C.base[C.row[m] + C.col[n]] = 0.0f;
    return;
  }
#ifdef LUMINAL_X86
  if (isa_avx512()) return gemm(Tiles<8, 32>{tile_avx512, tile_rows_avx512}, M, N, K, A, B, C);
  if (isa_at_least_avx2()) return gemm(Tiles<6, 16>{tile_avx2, tile_rows_avx2}, M, N, K, A, B, C);
#endif
#ifdef LUMINAL_ARM
  if (isa_neon()) return gemm(Tiles<6, 16>{tile_neon, tile_rows_neon}, M, N, K, A, B, C);
#endif
  gemm(Tiles<6, 16>{tile_portable<6, 16>, tile_rows_portable<6, 16>}, M, N, K, A, B, C);
}

}  // namespace luminal
