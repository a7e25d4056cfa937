// The native CPU backend: its kernels for the backend ops (registered by op type), and what they share.
#pragma once
#include <functional>
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

struct Program;
// Evaluates a float-register program over row `row` (of length L) of its iteration space, input `given` reading
// `given_row` instead of its buffer; the output row goes to `out`.
void eval_program_row(const Program& prog, const std::vector<KernelArg>& args, int64_t row, int64_t L, int given,
                      const float* given_row, float* out);

}  // namespace luminal
