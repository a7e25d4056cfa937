// Fusion passes shared by the backends: they put "Fused" and "Attention" kernels (see kernel_ir.h) in place of
// primop patterns; each backend then runs or prints those kernels.
#pragma once
#include <cstddef>

#include "core/graph.h"

namespace luminal {

// Chains of elementwise primops (and a sum/max over the last axis at their end) -> one "Fused" kernel each. With
// `row_reductions`, reductions over the row also fuse into the consumers that read them broadcast along the row
// (Instr::Reduce): RMSNorm and softmax become one kernel each.
size_t fuse_elementwise(Graph& g, bool row_reductions = false);

// MatMul(rows of a float32 row program over the rows of another MatMul, V) -> one "Attention" kernel (payload: an
// AttentionPlan): the scores, the program (scale, mask, softmax) and the weighted sum of V's rows, without the scores
// in memory. Run after fuse_elementwise.
size_t fuse_attention(Graph& g);

}  // namespace luminal
