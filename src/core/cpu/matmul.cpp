// Matmul/matvec: SumReduce over the last axis of a Mul becomes one dot product per output element, read
// straight through the operands' (broadcast) views, vectorised for float32 and multithreaded. Contraction: the same
// over several trailing axes (convolutions). Large float32 products of either go to the packed GEMM (gemm.cpp).
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

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

// Offsets of every index over `sizes` (row-major) with `strides`.
std::vector<int64_t> offsets(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  std::vector<int64_t> t{0};
  for (size_t d = 0; d < sizes.size(); ++d) {
    std::vector<int64_t> next;
    next.reserve(t.size() * size_t(sizes[d]));
    for (int64_t x : t)
      for (int64_t i = 0; i < sizes[d]; ++i) next.push_back(x + i * strides[d]);
    t = std::move(next);
  }
  return t;
}

// out = sum over the last `axes` dims of a * b through the packed GEMM, where the product is large enough
// (min(M, N) >= min_size, M N K >= min_work). Each output dim goes to the GEMM's rows (b does not depend on it),
// its columns (a does not) or its batch (both do); the reduced dims are its k; all through offset tables, so a
// convolution reads its input's window view where it lies. False (nothing written) where it does not apply.
bool gemm_contraction(const KernelArg& a, const KernelArg& b, int axes, Buffer& out, int64_t min_size,
                      int64_t min_work) {
  const ConcreteView &va = a.view, &vb = b.view;
  size_t r = va.shape.size(), outer = r - size_t(axes);
  if (r < size_t(axes) || out.dtype != DType::F32 || a.buf->dtype != DType::F32 || b.buf->dtype != DType::F32 ||
      va.masked || vb.masked || vb.shape != va.shape || !in_bounds(a) || !in_bounds(b))
    return false;
  std::vector<int64_t> cstride(outer);
  for (size_t d = outer, s = 1; d-- > 0;) {
    cstride[d] = int64_t(s);
    s *= size_t(va.shape[d]);
  }
  struct Side {
    std::vector<int64_t> size, sa, sb, sc;
    int64_t n = 1;
    void add(int64_t size_, int64_t a_, int64_t b_, int64_t c_) {
      size.push_back(size_), sa.push_back(a_), sb.push_back(b_), sc.push_back(c_);
      n *= size_;
    }
  } rows, cols, batch, red;
  bool last_is_row = false;
  for (size_t d = 0; d < outer; ++d) {
    int64_t n = va.shape[d], sa = va.strides[d], sb = vb.strides[d];
    if (n == 1) continue;
    if (sa && sb) batch.add(n, sa, sb, cstride[d]);
    else if (!sb) rows.add(n, sa, 0, cstride[d]);
    else cols.add(n, 0, sb, cstride[d]);
    last_is_row = !sb && !(sa && sb);
  }
  for (size_t d = outer; d < r; ++d) red.add(va.shape[d], va.strides[d], vb.strides[d], 0);
  int64_t M = rows.n, N = cols.n, K = red.n;
  if (std::min(M, N) < min_size || M * N * K < min_work) return false;
  // The tile's 16 columns are stored as one run: give them the output's innermost dim.
  bool swap = last_is_row;
  std::vector<int64_t> arow = offsets(rows.size, rows.sa), crow = offsets(rows.size, rows.sc);
  std::vector<int64_t> brow = offsets(cols.size, cols.sb), ccol = offsets(cols.size, cols.sc);
  std::vector<int64_t> ak = offsets(red.size, red.sa), bk = offsets(red.size, red.sb);
  std::vector<int64_t> ba = offsets(batch.size, batch.sa), bb = offsets(batch.size, batch.sb),
                       bc = offsets(batch.size, batch.sc);
  const float* pa = static_cast<const float*>(a.buf->data.get()) + va.offset;
  const float* pb = static_cast<const float*>(b.buf->data.get()) + vb.offset;
  float* po = static_cast<float*>(out.data.get());
  for (size_t i = 0; i < ba.size(); ++i) {
    GemmOperand A{pa + ba[i], arow.data(), ak.data()}, B{pb + bb[i], brow.data(), bk.data()};
    if (swap) gemm_f32(N, M, K, B, A, GemmOut{po + bc[i], ccol.data(), crow.data()});
    else gemm_f32(M, N, K, A, B, GemmOut{po + bc[i], crow.data(), ccol.data()});
  }
  return true;
}

void matmul_kernel(const std::vector<KernelArg>& in_args, const Node& node, Buffer& out) {
  DType out_dtype = node.dtype;
  // A large product (a independent of some output dims, b of others): the packed GEMM.
  if (gemm_contraction(in_args.at(0), in_args.at(1), 1, out, /*min_size=*/16, /*min_work=*/int64_t(1) << 18)) return;
  {
    // out[.., n] = sum_k a[.., k] * b[.., k, n] with b's rows contiguous along n and a the same for every n
    // (attention weights @ V, few rows): accumulate scaled rows of b, with no packing of b, while b fits in L2 (a
    // larger b is packed for the register tiles below, which read it once per four rows instead of once per row).
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

// Contraction: a product summed over its last `axes` dims (a convolution over channels and window). The GEMM where
// the product is large enough, else a dot product per output through offset tables; masked views and other
// dtypes element by element in double, as the reference.
void contraction_kernel(const std::vector<KernelArg>& in_args, const Node& node, Buffer& out) {
  int axes = op_as<ContractionOp>(node)->axes;
  const KernelArg &a = in_args.at(0), &b = in_args.at(1);
  if (gemm_contraction(a, b, axes, out, 1, 4096)) return;
  const ConcreteView &va = a.view, &vb = b.view;
  size_t r = va.shape.size(), outer = r - size_t(axes);
  if (r < size_t(axes) || vb.shape != va.shape) throw std::logic_error("Contraction: operand views disagree");
  std::vector<int64_t> ksize(va.shape.begin() + outer, va.shape.end());
  std::vector<int64_t> ak = offsets(ksize, std::vector<int64_t>(va.strides.begin() + outer, va.strides.end()));
  std::vector<int64_t> bk = offsets(ksize, std::vector<int64_t>(vb.strides.begin() + outer, vb.strides.end()));
  int64_t K = int64_t(ak.size()), total = out.numel();
  bool f32 = !va.masked && !vb.masked && a.buf->dtype == DType::F32 && b.buf->dtype == DType::F32 &&
             out.dtype == DType::F32 && in_bounds(a) && in_bounds(b);
  if (f32) {
    const float* pa = static_cast<const float*>(a.buf->data.get());
    const float* pb = static_cast<const float*>(b.buf->data.get());
    float* po = static_cast<float*>(out.data.get());
    parallel_for(total, K, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const float *x = pa + outer_offset(va, i, axes), *y = pb + outer_offset(vb, i, axes);
        float s = 0;
        for (int64_t k = 0; k < K; ++k) s += x[ak[k]] * y[bk[k]];
        po[i] = s;
      }
    });
    return;
  }
  auto at = [](const KernelArg& x, int64_t off, const std::vector<int64_t>& idx) -> double {
    const ConcreteView& v = x.view;
    if (v.masked)
      for (size_t d = 0; d < idx.size(); ++d)
        if (idx[d] < v.lo[d] || idx[d] >= v.hi[d]) return 0.0;
    if (off < 0 || off >= x.buf->numel()) throw std::out_of_range("Contraction: a view reads outside its buffer");
    return load_as_double(x.buf->data.get(), off, x.buf->dtype);
  };
  parallel_for(total, K, [&](int64_t i0, int64_t i1) {
    std::vector<int64_t> idx(r);
    for (int64_t i = i0; i < i1; ++i) {
      for (size_t d = outer, rest = size_t(i); d-- > 0;) {
        idx[d] = int64_t(rest) % va.shape[d];
        rest /= size_t(va.shape[d]);
      }
      int64_t oa = outer_offset(va, i, axes), ob = outer_offset(vb, i, axes);
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        for (size_t d = r, rest = size_t(k); d-- > outer;) {
          idx[d] = int64_t(rest) % va.shape[d];
          rest /= size_t(va.shape[d]);
        }
        s += at(a, oa + ak[k], idx) * at(b, ob + bk[k], idx);
      }
      store_from_double(out.data.get(), i, out.dtype, s);
    }
  });
}

struct Registrar {
  Registrar() {
    register_cpu_kernel(typeid(MatMulOp), matmul_kernel);
    register_cpu_kernel(typeid(ContractionOp), contraction_kernel);
  }
} registrar;

}  // namespace

}  // namespace luminal
