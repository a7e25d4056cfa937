// The native CPU backend's lowering: rewrite rules that put native kernels in place of primop patterns.
#pragma once
#include <functional>

#include "core/rewrite.h"

namespace luminal {

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

// SumReduce(last axis) of a Mul read as stored: a dot product per output, i.e. matmul/matvec over any
// broadcast views. Returns the number of rewrites.
size_t lower_matmuls(Graph& g);

// MatMul over a Dequant<type>(raw rows) -> QMatMul<type> (weights unpacked on the fly), and
// Gather(Dequant(raw)) -> Dequant(Gather(raw)). Run after lower_matmuls.
size_t lower_quantized(Graph& g);

// QMatMuls of one format over the same activations (q/k/v, gate/up) -> one QMatMul over their stacked weights.
size_t stack_qmatmuls(Graph& g);

// Chains of elementwise primops (and a sum/max over the last axis at their end) -> one "Fused" kernel each. With
// `row_reductions`, reductions over the row also fuse into the consumers that read them broadcast along the row
// (Instr::Reduce): RMSNorm and softmax become one kernel each.
size_t fuse_elementwise(Graph& g, bool row_reductions = false);

}  // namespace luminal
