// Matmul/matvec: SumReduce over the last axis of a Mul becomes one dot product per output element, read
// straight through the operands' (broadcast) views, vectorised for float32 and multithreaded.
#include <stdexcept>
#include <string>

#include "core/cpu/cpu.h"
#include "core/cpu/simd.h"
#include "core/lower/ops.h"

namespace luminal {
namespace {

// The range of element offsets an unmasked view can touch.
bool in_bounds(const KernelArg& a) { return a.view.reads_within(a.buf->numel()); }

// Copies a float32 operand whose reduced (last) axis is strided into a buffer where that axis is contiguous,
// keeping broadcast (stride-0) dims broadcast so nothing is duplicated. Returns the packed argument.
KernelArg pack_last_axis(const KernelArg& x, Buffer& storage) {
  const ConcreteView& v = x.view;
  size_t r = v.shape.size();
  std::vector<size_t> dims;  // non-broadcast dims other than the last, outermost first
  for (size_t d = 0; d + 1 < r; ++d)
    if (v.strides[d] != 0 && v.shape[d] != 1) dims.push_back(d);
  dims.push_back(r - 1);
  std::vector<int64_t> shape;
  for (size_t d : dims) shape.push_back(v.shape[d]);
  storage = Buffer::alloc(DType::F32, shape);
  ConcreteView packed = v;
  packed.offset = 0;
  int64_t stride = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    packed.strides[dims[i]] = stride;
    stride *= v.shape[dims[i]];
  }
  for (size_t d = 0; d + 1 < r; ++d)
    if (!(v.strides[d] != 0 && v.shape[d] != 1)) packed.strides[d] = 0;
  const float* src = static_cast<const float*>(x.buf->data.get());
  float* dst = static_cast<float*>(storage.data.get());
  std::vector<int64_t> idx(dims.size(), 0);
  for (int64_t i = 0, n = storage.numel(); i < n; ++i) {
    int64_t off = v.offset;
    for (size_t k = 0; k < dims.size(); ++k) off += idx[k] * v.strides[dims[k]];
    dst[i] = src[off];
    for (size_t k = dims.size(); k-- > 0;) {
      if (++idx[k] < shape[k]) break;
      idx[k] = 0;
    }
  }
  return KernelArg{&storage, packed};
}

void matmul_kernel(const std::vector<KernelArg>& in_args, const Node& node, Buffer& out) {
  DType out_dtype = node.dtype;
  {
    // out[.., n] = sum_k a[.., k] * b[.., k, n] with b's rows contiguous along n and a the same for every n
    // (attention weights @ V): accumulate scaled rows of b, with no packing of b, while b fits in L2 (a larger b
    // is packed for the register tiles below, which read it once per four rows instead of once per row).
    const KernelArg &a = in_args.at(0), &b = in_args.at(1);
    const ConcreteView &va = a.view, &vb = b.view;
    size_t r = va.shape.size();
    if (r >= 2 && out_dtype == DType::F32 && a.buf->dtype == DType::F32 && b.buf->dtype == DType::F32 &&
        !va.masked && !vb.masked && va.strides[r - 2] == 0 && vb.strides[r - 2] == 1 && vb.strides[r - 1] != 1 &&
        va.shape[r - 1] * va.shape[r - 2] <= 64 * 1024 && in_bounds(a) && in_bounds(b)) {
      int64_t K = va.shape[r - 1], N = va.shape[r - 2], rows = out.numel() / (N ? N : 1);
      int64_t ska = va.strides[r - 1], skb = vb.strides[r - 1];
      const float* pa = static_cast<const float*>(a.buf->data.get());
      const float* pb = static_cast<const float*>(b.buf->data.get());
      float* po = static_cast<float*>(out.data.get());
      parallel_for(rows, N * K, [&](int64_t r0, int64_t r1) {
        for (int64_t row = r0; row < r1; ++row) {
          const float *x = pa + outer_offset(va, row, 2), *y = pb + outer_offset(vb, row, 2);
          float* o = po + row * N;
          std::fill(o, o + N, 0.0f);
          for (int64_t k = 0; k < K; ++k) simd::axpy_f32(x[k * ska], y + k * skb, o, N);
        }
      });
      return;
    }
  }
  {
    // A large true matrix product per batch (a independent of n, b of m), any strides: the packed GEMM.
    const KernelArg &a = in_args.at(0), &b = in_args.at(1);
    const ConcreteView &va = a.view, &vb = b.view;
    size_t r = va.shape.size();
    int64_t M = r >= 3 ? va.shape[r - 3] : 1, N = r >= 2 ? va.shape[r - 2] : 1, K = r ? va.shape[r - 1] : 1;
    if (r >= 3 && out_dtype == DType::F32 && a.buf->dtype == DType::F32 && b.buf->dtype == DType::F32 &&
        !va.masked && !vb.masked && va.strides[r - 2] == 0 && vb.strides[r - 3] == 0 && M >= 16 && N >= 16 &&
        K >= 16 && M * N * K >= (int64_t(1) << 18) && in_bounds(a) && in_bounds(b)) {
      const float* pa = static_cast<const float*>(a.buf->data.get());
      const float* pb = static_cast<const float*>(b.buf->data.get());
      float* po = static_cast<float*>(out.data.get());
      bool done = true;
      for (int64_t bt = 0; bt < out.numel() / (M * N) && done; ++bt)
        done = gemm_f32(M, N, K, pa + outer_offset(va, bt * M, 2), va.strides[r - 3], va.strides[r - 1],
                        pb + outer_offset(vb, bt * M, 2), vb.strides[r - 2], vb.strides[r - 1], po + bt * M * N, N);
      if (done) return;
    }
  }
  // A float32 operand read with a strided reduced axis (e.g. a row-major right-hand matrix) is packed first.
  std::vector<KernelArg> args = in_args;
  Buffer packed[2];
  for (int i = 0; i < 2; ++i) {
    const KernelArg& x = args.at(i);
    size_t r = x.view.shape.size();
    if (r && x.buf->dtype == DType::F32 && !x.view.masked && x.view.strides[r - 1] != 1 && in_bounds(x))
      args[i] = pack_last_axis(x, packed[i]);
  }
  const KernelArg &a = args.at(0), &b = args.at(1);
  const ConcreteView &va = a.view, &vb = b.view;
  size_t r = va.shape.size();
  if (r == 0 || vb.shape != va.shape) throw std::logic_error("MatMul: operand views disagree");
  int64_t K = va.shape[r - 1];
  int64_t N = r >= 2 ? va.shape[r - 2] : 1;
  int64_t rows = out.numel() / (N ? N : 1);
  bool f32 = !va.masked && !vb.masked && a.buf->dtype == DType::F32 && b.buf->dtype == DType::F32 &&
             out_dtype == DType::F32 && in_bounds(a) && in_bounds(b);
  bool fast = f32 && va.strides[r - 1] == 1 && vb.strides[r - 1] == 1;  // both rows contiguous: SIMD dot
  int64_t ska = va.strides[r - 1], skb = vb.strides[r - 1];
  auto generic_at = [](const KernelArg& x, int64_t off, const std::vector<int64_t>& idx) -> double {
    const ConcreteView& v = x.view;
    if (v.masked)
      for (size_t d = 0; d < idx.size(); ++d)
        if (idx[d] < v.lo[d] || idx[d] >= v.hi[d]) return 0.0;
    if (off < 0 || off >= x.buf->numel())
      throw std::out_of_range("MatMul: a view reads outside its buffer");
    return load_as_double(x.buf->data.get(), off, x.buf->dtype);
  };
  int64_t sna = r >= 2 ? va.strides[r - 2] : 0, snb = r >= 2 ? vb.strides[r - 2] : 0;
  int64_t M = r >= 3 ? va.shape[r - 3] : 1;
  bool product = fast && r >= 3 && sna == 0 && vb.strides[r - 3] == 0;  // a true matrix product per batch
  if (product && M >= 4 && N >= 3) {
    // A true matrix product per batch (a independent of n, b of m): 4 x 3 register tiles.
    const float* pa = static_cast<const float*>(a.buf->data.get());
    const float* pb = static_cast<const float*>(b.buf->data.get());
    float* po = static_cast<float*>(out.data.get());
    int64_t groups = (N + 2) / 3, batches = rows / M;
    parallel_for(batches * groups, M * K * 3, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        int64_t bt = t / groups, n = 3 * (t % groups), cols = std::min<int64_t>(3, N - n);
        int64_t ob = outer_offset(vb, bt * M, 2);
        const float* w[3];
        for (int64_t c = 0; c < 3; ++c) w[c] = pb + ob + (n + std::min(c, cols - 1)) * snb;
        for (int64_t m = 0; m < M; m += 4) {
          int rr = int(std::min<int64_t>(4, M - m));
          const float* a4[4];
          for (int i = 0; i < rr; ++i) a4[i] = pa + outer_offset(va, bt * M + m + i, 2);
          float r12[12];
          simd::dot_rx3_f32(rr, a4, w, K, r12);
          for (int i = 0; i < rr; ++i)
            for (int64_t c = 0; c < cols; ++c) po[(bt * M + m + i) * N + n + c] = r12[3 * i + c];
        }
      }
    });
    return;
  }
  // Parallel over N so each thread streams its own slice of the (usually weight) operand. Row offsets are worked
  // out once (a division per dim), not per output.
  std::vector<int64_t> row_a(rows), row_b(rows);
  for (int64_t row = 0; row < rows; ++row) {
    row_a[row] = outer_offset(va, row, 2);
    row_b[row] = outer_offset(vb, row, 2);
  }
  parallel_for(N, rows * K, [&](int64_t n0, int64_t n1) {
    std::vector<int64_t> idx(r);
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t row = 0; row < rows; ++row) {
        int64_t oa = row_a[row] + n * sna, ob = row_b[row] + n * snb;
        int64_t o = row * N + n;
        if (fast) {
          const float* pa = static_cast<const float*>(a.buf->data.get()) + oa;
          const float* pb = static_cast<const float*>(b.buf->data.get()) + ob;
          static_cast<float*>(out.data.get())[o] = simd::dot_f32(pa, pb, K);
          continue;
        }
        if (f32) {  // strided float32 (e.g. attention weights @ V)
          const float* pa = static_cast<const float*>(a.buf->data.get()) + oa;
          const float* pb = static_cast<const float*>(b.buf->data.get()) + ob;
          float s = 0;
          for (int64_t k = 0; k < K; ++k) s += pa[k * ska] * pb[k * skb];
          static_cast<float*>(out.data.get())[o] = s;
          continue;
        }
        // Any dtype, masks: the reference semantics, element by element.
        int64_t rr = row;
        for (int d = int(r) - 3; d >= 0; --d) { idx[d] = rr % va.shape[d]; rr /= va.shape[d]; }
        if (r >= 2) idx[r - 2] = n;
        double s = 0;
        for (int64_t k = 0; k < K; ++k) {
          idx[r - 1] = k;
          s += generic_at(a, oa + k * va.strides[r - 1], idx) * generic_at(b, ob + k * vb.strides[r - 1], idx);
        }
        store_from_double(out.data.get(), o, out_dtype, s);
      }
  });
}

struct Registrar {
  Registrar() { register_cpu_kernel(typeid(MatMulOp), matmul_kernel); }
} registrar;

}  // namespace

}  // namespace luminal
