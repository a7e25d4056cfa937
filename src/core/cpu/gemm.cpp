// A packed float32 GEMM for large products (prefill of float models): C = A B^T, each operand read through any
// strides (packing makes them contiguous). Cache-blocked the usual way: a block of k (KC) of B is packed into
// panels of NR columns (shared by the threads), each thread packs MC rows of A into panels of MR rows, and a 6 x 16
// register tile runs over them.
#include <algorithm>
#include <vector>

#include "core/cpu/cpu.h"
#include "core/cpu/simd.h"

namespace luminal {
namespace {

constexpr int MR = 6, NR = 16;
constexpr int64_t KC = 256, MC = 72;

// Elements (r, k) at src[r * sr + k * sk], r in [r0, r0 + rows), k in [k0, k0 + kc), as kc groups of `width` values
// (missing rows zero). The loop walks whichever stride is 1, so a row-major right operand (a @ b) packs as fast as
// a transposed one.
void pack(const float* src, int64_t sr, int64_t sk, int64_t r0, int64_t rows, int64_t k0, int64_t kc, int width,
          float* dst) {
  if (rows < width) std::fill(dst, dst + kc * width, 0.0f);
  if (sr == 1) {
    for (int64_t k = 0; k < kc; ++k) std::copy(src + r0 + (k0 + k) * sk, src + r0 + (k0 + k) * sk + rows, dst + k * width);
    return;
  }
  for (int64_t j = 0; j < rows; ++j) {
    const float* s = src + (r0 + j) * sr + k0 * sk;
    for (int64_t k = 0; k < kc; ++k) dst[k * width + j] = s[k * sk];
  }
}

#ifdef LUMINAL_X86
// C[0..mr, 0..nr) (+)= a_panel^T b_panel over kc: twelve accumulators, one broadcast of A per row and two loads of B
// per k. The accumulators are named variables: kept in an array, GCC spilled them to the stack every iteration.
__attribute__((target("avx2,fma"))) void tile_6x16(int64_t kc, const float* a, const float* b, float* c, int64_t ldc,
                                                   bool add, int mr, int nr) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
         c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t k = 0; k < kc; ++k, a += MR, b += NR) {
    __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8), x;
    x = _mm256_broadcast_ss(a + 0); c00 = _mm256_fmadd_ps(x, b0, c00); c01 = _mm256_fmadd_ps(x, b1, c01);
    x = _mm256_broadcast_ss(a + 1); c10 = _mm256_fmadd_ps(x, b0, c10); c11 = _mm256_fmadd_ps(x, b1, c11);
    x = _mm256_broadcast_ss(a + 2); c20 = _mm256_fmadd_ps(x, b0, c20); c21 = _mm256_fmadd_ps(x, b1, c21);
    x = _mm256_broadcast_ss(a + 3); c30 = _mm256_fmadd_ps(x, b0, c30); c31 = _mm256_fmadd_ps(x, b1, c31);
    x = _mm256_broadcast_ss(a + 4); c40 = _mm256_fmadd_ps(x, b0, c40); c41 = _mm256_fmadd_ps(x, b1, c41);
    x = _mm256_broadcast_ss(a + 5); c50 = _mm256_fmadd_ps(x, b0, c50); c51 = _mm256_fmadd_ps(x, b1, c51);
  }
  alignas(32) float t[MR][NR];
  const __m256 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  for (int i = 0; i < MR; ++i) {
    _mm256_store_ps(t[i], acc[i][0]);
    _mm256_store_ps(t[i] + 8, acc[i][1]);
  }
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) c[i * ldc + j] = add ? c[i * ldc + j] + t[i][j] : t[i][j];
}
#endif

}  // namespace

bool gemm_f32(int64_t M, int64_t N, int64_t K, const float* A, int64_t sam, int64_t sak, const float* B, int64_t sbn,
              int64_t sbk, float* C, int64_t ldc) {
#ifdef LUMINAL_X86
  if (!simd::have_avx2()) return false;
  int64_t panels = (N + NR - 1) / NR, blocks = (M + MC - 1) / MC;
  thread_local std::vector<float> bp;  // the caller's: kept, so a run does not fault in a fresh megabyte each time
  bp.resize(size_t(panels * NR * std::min(K, KC)));
  float* packed_b = bp.data();  // the workers must not name `bp`: they would get their own (empty) one
  for (int64_t k0 = 0; k0 < K; k0 += KC) {
    int64_t kc = std::min(KC, K - k0);
    parallel_for(panels, NR * kc, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p)
        pack(B, sbn, sbk, p * NR, std::min<int64_t>(NR, N - p * NR), k0, kc, NR, packed_b + p * NR * kc);
    });
    parallel_for(blocks, MC * N * kc, [&](int64_t b0, int64_t b1) {
      thread_local std::vector<float> ap;
      ap.resize(size_t(MC * KC));
      for (int64_t blk = b0; blk < b1; ++blk) {
        int64_t m0 = blk * MC, mc = std::min(MC, M - m0), rows = (mc + MR - 1) / MR;
        for (int64_t i = 0; i < rows; ++i)
          pack(A, sam, sak, m0 + i * MR, std::min<int64_t>(MR, mc - i * MR), k0, kc, MR, ap.data() + i * MR * kc);
        for (int64_t p = 0; p < panels; ++p)
          for (int64_t i = 0; i < rows; ++i)
            tile_6x16(kc, ap.data() + i * MR * kc, packed_b + p * NR * kc, C + (m0 + i * MR) * ldc + p * NR, ldc,
                      k0 > 0, int(std::min<int64_t>(MR, mc - i * MR)), int(std::min<int64_t>(NR, N - p * NR)));
      }
    });
  }
  return true;
#else
  (void)M, (void)N, (void)K, (void)A, (void)sam, (void)sak, (void)B, (void)sbn, (void)sbk, (void)C, (void)ldc;
  return false;
#endif
}

}  // namespace luminal
