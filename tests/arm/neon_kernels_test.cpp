// The NEON CPU kernels against the portable ones on random data, built for AArch64 (cross-compiled and run under
// qemu-user on x86 by tests/arm/run.sh). Integer dot products and the int8 quantisation must match bit for bit;
// float kernels within a few ulp of the sum's magnitude. Exits non-zero on any mismatch.
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/cpu/cpu.h"
#include "core/cpu/isa.h"
#include "core/cpu/simd.h"

#ifndef LUMINAL_ARM
#error "build this for AArch64 (tests/arm/run.sh)"
#endif

using namespace luminal;

static int failures = 0, checks = 0;
static bool has_dotprod = false;  // the CPU's (qemu's) dotprod, read at the start
static std::mt19937 rng(1234);

static std::vector<float> randn(size_t n, float scale = 1.0f) {
  std::normal_distribution<float> g(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

static void check(bool ok, const char* what, long a = 0, long b = 0) {
  ++checks;
  if (!ok) {
    ++failures;
    std::printf("FAIL %s (%ld, %ld)\n", what, a, b);
  }
}

// |got - want| within tol times the sum of |terms| (a float sum in another order).
static bool close(double got, double want, double mag, double tol = 1e-6) {
  return std::fabs(got - want) <= tol * (mag + 1e-30) || (std::isnan(got) && std::isnan(want));
}

// Random GGUF blocks: a float16 scale (and Q4_1's minimum) in a sane range, random quants.
static std::vector<uint8_t> random_blocks(int bb, int64_t nb) {
  std::vector<uint8_t> w(size_t(bb * nb));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& x : w) x = uint8_t(byte(rng));
  std::uniform_real_distribution<float> sc(0.001f, 0.1f);
  for (int64_t b = 0; b < nb; ++b) {
    for (int h = 0; h < (bb == 20 ? 2 : 1); ++h) {
      uint16_t f = f32_to_f16(h ? -sc(rng) : sc(rng));
      std::memcpy(&w[size_t(b * bb + 2 * h)], &f, 2);
    }
  }
  return w;
}

static void test_float_kernels() {
  for (int64_t k : {1, 3, 4, 7, 15, 16, 17, 33, 64, 100, 1000}) {
    auto a = randn(size_t(k)), b = randn(size_t(k));
    double mag = 0;
    for (int64_t i = 0; i < k; ++i) mag += std::fabs(double(a[i]) * b[i]);
    check(close(simd::dot_f32_neon(a.data(), b.data(), k), simd::dot_f32_portable(a.data(), b.data(), k), mag),
          "dot_f32", long(k));
    // R x 3 tiles
    auto rows = randn(size_t(4 * k)), ws = randn(size_t(3 * k));
    const float* ar[4] = {rows.data(), rows.data() + k, rows.data() + 2 * k, rows.data() + 3 * k};
    const float* wr[3] = {ws.data(), ws.data() + k, ws.data() + 2 * k};
    for (int R = 1; R <= 4; ++R) {
      float got[12], want[12];
      set_cpu_isa("neon");
      simd::dot_rx3_f32(R, ar, wr, k, got);
      simd::dot_rx3_f32_portable(R, ar, wr, k, want);
      for (int j = 0; j < 3 * R; ++j) {
        double m = 0;
        for (int64_t i = 0; i < k; ++i) m += std::fabs(double(ar[j / 3][i]) * wr[j % 3][i]);
        check(close(got[j], want[j], m), "dot_rx3_f32", long(k), R);
      }
    }
    // axpy
    auto y = randn(size_t(k)), y2 = y;
    simd::axpy_f32_neon(0.37f, a.data(), y.data(), k);
    for (int64_t i = 0; i < k; ++i) y2[i] += 0.37f * a[i];
    for (int64_t i = 0; i < k; ++i) check(close(y[i], y2[i], std::fabs(y2[i]) + std::fabs(0.37 * a[i])), "axpy", long(k));
  }
  // weighted rows and dot rows (attention's shapes, and ragged ones)
  for (auto [T, n, stride] : {std::tuple<int64_t, int64_t, int64_t>{5, 64, 64}, {37, 19, 23}, {70, 130, 131}}) {
    auto w = randn(size_t(T)), rows = randn(size_t(T * stride));
    std::vector<float> got(static_cast<size_t>(n));
    simd::weighted_rows_f32_neon(w.data(), rows.data(), stride, T, n, got.data());
    for (int64_t c = 0; c < n; ++c) {
      double m = 0, s = 0;
      for (int64_t t = 0; t < T; ++t) s += double(w[t]) * rows[t * stride + c], m += std::fabs(double(w[t]) * rows[t * stride + c]);
      check(close(got[c], s, m), "weighted_rows", long(T), long(c));
    }
    int64_t k = std::min(n, stride);
    auto x = randn(size_t(k));
    std::vector<float> dr(static_cast<size_t>(T));
    set_cpu_isa("neon");
    simd::dot_rows_f32(x.data(), rows.data(), stride, T, k, dr.data());
    for (int64_t t = 0; t < T; ++t) {
      double m = 0;
      for (int64_t j = 0; j < k; ++j) m += std::fabs(double(x[j]) * rows[t * stride + j]);
      check(close(dr[t], simd::dot_f32_portable(x.data(), rows.data() + t * stride, k), m), "dot_rows", long(t));
    }
  }
  // exp2: within 2 ulp of the correctly rounded value; out-of-range, infinite and NaN lanes exact; in place too.
  auto x = randn(1003, 40.0f);
  x[0] = -INFINITY, x[1] = INFINITY, x[2] = NAN, x[3] = -126.5f, x[4] = 127.5f, x[5] = -149.0f, x[6] = 0.0f;
  std::vector<float> o(x.size()), inplace = x;
  simd::exp2_f32_neon(x.data(), o.data(), int64_t(x.size()));
  simd::exp2_f32_neon(inplace.data(), inplace.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    double want = std::exp2(double(x[i]));
    bool ok = std::isnan(want) ? std::isnan(o[i]) : o[i] == want || std::fabs(o[i] - want) <= 2.5e-7 * want;
    check(ok, "exp2", long(i));
    check(std::memcmp(&o[i], &inplace[i], 4) == 0, "exp2 in place", long(i));
  }
}

static void test_quantised() {
  for (int64_t nb : {1, 2, 3, 7, 8, 9, 24, 33, 64, 65, 130}) {
    auto a = randn(size_t(32 * nb));
    a[5] = 0;  // a zero, and one all-zero block where there are several
    if (nb > 2) std::fill(a.begin() + 32, a.begin() + 64, 0.0f);
    std::vector<int8_t> q1(a.size()), q2(a.size());
    std::vector<float> d1(nb), d2(nb), s1(nb), s2(nb);
    simd::quantize_q8_portable(a.data(), nb, q1.data(), d1.data(), s1.data());
    simd::quantize_q8_neon(a.data(), nb, q2.data(), d2.data(), s2.data());
    check(q1 == q2 && d1 == d2 && s1 == s2, "quantize_q8 bits", long(nb));
    for (int bb : {34, 18, 20}) {
      auto w = random_blocks(bb, nb);
      float want = simd::dot_q8_portable(bb, w.data(), q1.data(), d1.data(), s1.data(), nb);
      float plain = simd::dot_q8_neon(bb, w.data(), q1.data(), d1.data(), s1.data(), nb);
      check(std::memcmp(&want, &plain, 4) == 0, "dot_q8 (neon) bits", bb, long(nb));
      if (has_dotprod) {
        float dot = simd::dot_q8_neon_dotprod(bb, w.data(), q1.data(), d1.data(), s1.data(), nb);
        check(std::memcmp(&want, &dot, 4) == 0, "dot_q8 (dotprod) bits", bb, long(nb));
      }
      // the dispatcher at each level
      for (const char* level : {"neon", "portable"}) {
        set_cpu_isa(level);
        float got = simd::dot_q8(bb, w.data(), q1.data(), d1.data(), s1.data(), nb);
        check(!simd::wants_pairs(bb) && std::memcmp(&want, &got, 4) == 0, "dot_q8 dispatch bits", bb, long(nb));
      }
      // extreme quants: every weight and activation at its limit (int16 products must not saturate)
      std::vector<uint8_t> wx = w;
      for (int64_t b = 0; b < nb; ++b)
        for (int j = (bb == 20 ? 4 : 2); j < bb; ++j) wx[size_t(b * bb + j)] = bb == 34 ? 0x80 : 0xff;
      std::vector<int8_t> qx(q1.size(), -127);
      float e1 = simd::dot_q8_portable(bb, wx.data(), qx.data(), d1.data(), s1.data(), nb);
      float e2 = simd::dot_q8_neon(bb, wx.data(), qx.data(), d1.data(), s1.data(), nb);
      check(std::memcmp(&e1, &e2, 4) == 0, "dot_q8 extremes bits", bb, long(nb));
    }
  }
}

static void test_gemm() {
  set_num_threads(2);
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{7, 19, 33}, {50, 70, 600}, {130, 9, 1100}, {1, 40, 5}}) {
    auto a = randn(size_t(M * K)), b = randn(size_t(N * K));
    std::vector<int64_t> ar(M), br(N), kk(K), cr(M), cc(N);
    for (int64_t i = 0; i < M; ++i) ar[i] = i * K, cr[i] = i * N;
    for (int64_t i = 0; i < N; ++i) br[i] = i * K, cc[i] = i;
    for (int64_t i = 0; i < K; ++i) kk[i] = i;
    std::vector<float> c1(size_t(M * N)), c2(size_t(M * N));
    GemmOperand A{a.data(), ar.data(), kk.data()}, B{b.data(), br.data(), kk.data()};
    set_cpu_isa("portable");
    gemm_f32(M, N, K, A, B, GemmOut{c1.data(), cr.data(), cc.data()});
    set_cpu_isa("neon");
    gemm_f32(M, N, K, A, B, GemmOut{c2.data(), cr.data(), cc.data()});
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double mag = 0;
        for (int64_t k = 0; k < K; ++k) mag += std::fabs(double(a[m * K + k]) * b[n * K + k]);
        check(close(c2[m * N + n], c1[m * N + n], mag), "gemm", long(m), long(n));
      }
  }
}

int main() {
  check(cpu_isa() == CpuIsa::Neon, "neon is the default level on AArch64");
  auto levels = supported_cpu_isas();
  check(levels.size() == 2 && levels[0] == "neon" && levels[1] == "portable", "supported levels");
  bool threw = false;
  try {
    set_cpu_isa("avx2");
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  check(threw && cpu_isa() == CpuIsa::Neon, "an x86 level is refused on AArch64");
  has_dotprod = isa_dotprod();
  std::printf("dotprod: %s\n", has_dotprod ? "yes" : "no");
  test_float_kernels();
  test_quantised();
  test_gemm();
  std::printf("%d checks, %d failures\n", checks, failures);
  return failures ? 1 : 0;
}
