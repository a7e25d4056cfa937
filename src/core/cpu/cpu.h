// The native CPU backend: its kernels for the backend ops (registered by op type), and what they share.
#pragma once
#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <typeindex>

#include "core/graph.h"

namespace luminal {

// The CPU kernel of a backend op type (each kernel file registers its own at start-up).
void register_cpu_kernel(std::type_index op, CustomKernel k);
// The kernel for `op`: a HostOp's own, a registered one, or null where the CPU has none.
const CustomKernel* cpu_kernel(const KernelOp& op);

// Runs fn(begin, end) over [0, n) split across the worker threads (serially when the work is small).
void parallel_for(int64_t n, int64_t cost_per_item, const std::function<void(int64_t, int64_t)>& fn);
void set_num_threads(int n);

// The element offset where outer index `i` starts: `i` is unravelled over every dim but the last `inner` ones.
inline int64_t outer_offset(const ConcreteView& v, int64_t i, int inner) {
  int64_t off = v.offset;
  for (int d = int(v.shape.size()) - 1 - inner; d >= 0; --d) {
    off += (i % v.shape[d]) * v.strides[d];
    i /= v.shape[d];
  }
  return off;
}
int num_threads();

// An operand of gemm_f32: element (r, k) at base[row[r] + k[k]] (offset tables: any view, rows or a reduced axis
// made of several dims).
struct GemmOperand {
  const float* base;
  const int64_t *row, *k;
};
// The result: element (m, n) at base[row[m] + col[n]].
struct GemmOut {
  float* base;
  const int64_t *row, *col;
};
// C[m, n] = sum_k A[m, k] B[n, k]; packed, cache-blocked, multithreaded.
void gemm_f32(int64_t M, int64_t N, int64_t K, const GemmOperand& A, const GemmOperand& B, const GemmOut& C);

// Loads elements [j0, j1) of row `row` of a kernel input: the last axis, every other one unravelled from `row`
// (padding reads as zero). `kernel` names the caller when the view reads outside its buffer.
template <class T>
void load_row(const KernelArg& a, int64_t row, int64_t j0, int64_t j1, T* out, const char* kernel) {
  const ConcreteView& v = a.view;
  size_t r = v.shape.size();
  int64_t n = j1 - j0;
  int64_t base = v.offset, rest = row;
  bool valid = true;
  for (int d = int(r) - 2; d >= 0; --d) {
    int64_t i = rest % v.shape[d];
    rest /= v.shape[d];
    base += i * v.strides[d];
    if (v.masked && (i < v.lo[d] || i >= v.hi[d])) valid = false;
  }
  int64_t lo = j0, hi = j1, s = r ? v.strides[r - 1] : 0;
  if (v.masked && r) { lo = std::max(j0, v.lo[r - 1]); hi = std::min(j1, v.hi[r - 1]); }
  if (!valid || lo >= hi) { std::fill(out, out + n, T(0)); return; }
  std::fill(out, out + (lo - j0), T(0));
  std::fill(out + (hi - j0), out + n, T(0));
  int64_t first = base + lo * s, last = base + (hi - 1) * s;
  if (std::min(first, last) < 0 || std::max(first, last) >= a.buf->numel())
    throw std::out_of_range(std::string(kernel) + ": a view reads outside its buffer");
  const void* p = a.buf->data.get();
  T* o = out + (lo - j0);
  if (a.buf->dtype == DType::F32) {
    const float* f = static_cast<const float*>(p) + first;
    if (s == 1) std::copy(f, f + (hi - lo), o);
    else for (int64_t j = 0; j < hi - lo; ++j) o[j] = f[j * s];
  } else {
    for (int64_t j = 0; j < hi - lo; ++j) o[j] = T(load_as_double(p, first + j * s, a.buf->dtype));
  }
}

struct Program;
// Evaluates a float-register program over row `row` (of length L) of its iteration space, input `given` reading
// `given_row` instead of its buffer; the output row goes to `out`.
void eval_program_row(const Program& prog, const std::vector<KernelArg>& args, int64_t row, int64_t L, int given,
                      const float* given_row, float* out);

}  // namespace luminal
