// The CPU kernels of GGUF block-quantised weights (Q8_0, Q4_0, Q4_1): Dequant unpacks rows; QMatMul unpacks each
// weight row on the fly (prefill) or multiplies whole blocks in integer arithmetic against int8-quantised
// activations (decode), so no float copy of the weights is ever made. The lowering is core/lower/quant.cpp.
#include <algorithm>
#include <optional>
#include <tuple>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/cpu/cpu.h"
#include "core/cpu/simd.h"
#include "core/lower/ops.h"

namespace luminal {
namespace {

using Format = QuantFormatInfo;
constexpr int kBlock = kQuantBlock;

// Unpacks one row of `k` weights.
void dequant_row(const Format& f, const uint8_t* row, int64_t k, float* out) {
  simd::dequant_blocks(f.block_bytes, row, k / kBlock, out);
}

// Rows of raw bytes read through `v`: unmasked, bytes contiguous. Returns a pointer to row i.
const uint8_t* raw_row(const KernelArg& a, int64_t i) {
  int64_t off = outer_offset(a.view, i, 1), bytes = a.view.shape.back();
  if (off < 0 || off + bytes > a.buf->numel()) throw std::out_of_range("Dequant: a row lies outside its buffer");
  return static_cast<const uint8_t*>(a.buf->data.get()) + off;
}

void check_raw(const KernelArg& a, const Format& f, const char* op) {
  const ConcreteView& v = a.view;
  if (a.buf->dtype != DType::U8 || v.masked || v.shape.empty() || v.strides.back() != 1 ||
      v.shape.back() % f.block_bytes)
    throw std::invalid_argument(std::string(op) + ": expects uint8 rows of whole " + f.name + " blocks");
}

CustomKernel dequant_kernel(const Format& f) {
  return [&f](const std::vector<KernelArg>& args, const Node& node, Buffer& out) {
    const KernelArg& a = args.at(0);
    check_raw(a, f, "Dequant");
    if (node.dtype != DType::F32) throw std::invalid_argument("Dequant produces float32");
    int64_t k = a.view.shape.back() / f.block_bytes * kBlock;
    int64_t rows = k ? out.numel() / k : 0;
    float* o = static_cast<float*>(out.data.get());
    parallel_for(rows, k, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) dequant_row(f, raw_row(a, r), k, o + r * k);
    });
  };
}

// The rows of one or more weights stacked (QMatMul over q/k/v at once): row n of the stack. Each weight's rows are
// read through a view of whole rows (W[n, :], broadcast over the other dims): a base pointer and a row stride,
// checked against the buffer once, so the hot loop does no index arithmetic per row.
struct StackedRows {
  std::vector<const uint8_t*> base;
  std::vector<int64_t> stride;
  std::vector<int64_t> start;  // first stacked row of each weight, and the total at the end
  StackedRows(const std::vector<KernelArg>& args, const Format& f) : start{0} {
    for (size_t i = 1; i < args.size(); ++i) {
      const KernelArg& a = args[i];
      check_raw(a, f, "QMatMul");
      size_t r = a.view.shape.size();
      int64_t rows = r >= 2 ? a.view.shape[r - 2] : 1;
      base.push_back(raw_row(a, 0));
      stride.push_back(r >= 2 ? a.view.strides[r - 2] : 0);
      if (rows > 1) raw_row(a, rows - 1);  // the last row lies inside the buffer too
      start.push_back(start.back() + rows);
    }
  }
  // The weight holding stacked row n, and n's row within it.
  size_t which(int64_t n) const {
    size_t j = 0;
    while (j + 1 < base.size() && n >= start[j + 1]) ++j;
    return j;
  }
  const uint8_t* operator()(int64_t n) const {
    size_t j = which(n);
    return base[j] + (n - start[j]) * stride[j];
  }
};

// out[..., m, n] = sum_k a[..., m, n, k] * W[n, k] with W's rows unpacked once per row and reused for every m. W is
// the stack of the weight inputs' rows (one weight, or several that read the same activations).
CustomKernel qmatmul_kernel(const Format& f) {
  return [&f](const std::vector<KernelArg>& args, const Node&, Buffer& out) {
    const KernelArg& a = args.at(0);
    StackedRows w(args, f);
    const ConcreteView& va = a.view;
    size_t r = va.shape.size();
    int64_t K = va.shape[r - 1], N = va.shape[r - 2];
    if (N != w.start.back()) throw std::logic_error("QMatMul: the activations' view does not span the weight rows");
    int64_t rows = N ? out.numel() / N : 0;
    const float* pa = static_cast<const float*>(a.buf->data.get());
    float* o = static_cast<float*>(out.data.get());
    std::vector<int64_t> row_off(rows);
    for (int64_t row = 0; row < rows; ++row) {
      int64_t off = outer_offset(va, row, 2);
      row_off[row] = off;
      if (off < 0 || off + K > a.buf->numel()) throw std::out_of_range("QMatMul: activations outside their buffer");
    }
    int64_t nb = K / kBlock;
    if (rows <= 4) {
      // Few rows (decode): quantise the activations to int8 blocks once, then multiply straight from the packed
      // weight blocks in integer arithmetic (memory-bound: each weight byte is read once).
      std::vector<int8_t> q(rows * K);
      std::vector<float> d(rows * nb), s(rows * nb);
      for (int64_t row = 0; row < rows; ++row) {
        simd::quantize_q8(pa + row_off[row], nb, q.data() + row * K, d.data() + row * nb, s.data() + row * nb);
        if (simd::wants_pairs(f.block_bytes))
          simd::pair_activations(q.data() + row * K, d.data() + row * nb, s.data() + row * nb, nb);
      }
      parallel_for(N, rows * K, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1;) {
          size_t j = w.which(n);
          int64_t end = std::min(n1, w.start[j + 1]);  // this weight's rows in [n, n1)
          const uint8_t* wr = w(n);
          for (; n < end; ++n, wr += w.stride[j])
            for (int64_t row = 0; row < rows; ++row)
              o[row * N + n] = simd::dot_q8(f.block_bytes, wr, q.data() + row * K, d.data() + row * nb,
                                            s.data() + row * nb, nb);
        }
      });
      return;
    }
    // Many rows (prefill): unpack weight rows once, three at a time, and run them against 4 rows of activations
    // at a time (a 4 x 3 register tile; fewer rows at the end).
    parallel_for((N + 2) / 3, rows * K * 3, [&](int64_t t0, int64_t t1) {
      std::vector<float> buf(3 * K, 0.0f);  // a last group of fewer than 3 rows computes on zeros, discarded
      const float* wr[3] = {buf.data(), buf.data() + K, buf.data() + 2 * K};
      for (int64_t t = t0; t < t1; ++t) {
        int64_t n = 3 * t, cols = std::min<int64_t>(3, N - n);
        for (int64_t c = 0; c < cols; ++c) dequant_row(f, w(n + c), K, buf.data() + c * K);
        for (int64_t row = 0; row < rows; row += 4) {
          int rr = int(std::min<int64_t>(4, rows - row));
          const float* a4[4];
          for (int i = 0; i < rr; ++i) a4[i] = pa + row_off[row + i];
          float r12[12];
          simd::dot_rx3_f32(rr, a4, wr, K, r12);
          for (int i = 0; i < rr; ++i)
            for (int64_t c = 0; c < cols; ++c) o[(row + i) * N + n + c] = r12[3 * i + c];
        }
      }
    });
  };
}

// One kernel per format, made once; the op type's kernel picks by the node's format.
template <class OpT>
CustomKernel by_format(CustomKernel (*make)(const Format&)) {
  auto kernels = std::make_shared<std::vector<CustomKernel>>();
  for (QuantFormat f : {QuantFormat::Q8_0, QuantFormat::Q4_0, QuantFormat::Q4_1}) kernels->push_back(make(format_info(f)));
  return [kernels](const std::vector<KernelArg>& args, const Node& node, Buffer& out) {
    (*kernels)[size_t(op_as<OpT>(node)->format)](args, node, out);
  };
}

struct Registrar {
  Registrar() {
    register_cpu_kernel(typeid(DequantOp), by_format<DequantOp>(dequant_kernel));
    register_cpu_kernel(typeid(QMatMulOp), by_format<QMatMulOp>(qmatmul_kernel));
  }
} registrar;

}  // namespace

}  // namespace luminal
