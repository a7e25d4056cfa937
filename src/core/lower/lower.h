// The core lowering passes: rewrite rules that put backend ops (ops.h) in place of primop patterns. Shared by
// every backend: CPUCompiler and CudaCompiler are lists of these passes, and each backend runs or prints the ops.
#pragma once
#include <cstddef>

#include "core/lower/ops.h"

namespace luminal {

// SumReduce(last axis) of a Mul read as stored -> MatMul. Returns the number of rewrites.
size_t lower_matmuls(Graph& g);

// SumReduce(last axis) of a MatMul (or Contraction) only it reads -> one Contraction over both reduced axes
// (convolutions). Run after lower_matmuls.
size_t lower_contractions(Graph& g);

// MatMul over a Dequant(raw rows) -> QMatMul (weights unpacked on the fly), and Gather(Dequant(raw)) ->
// Dequant(Gather(raw)). Run after lower_matmuls.
size_t lower_quantized(Graph& g);

// QMatMuls of one format over the same activations (q/k/v, gate/up) -> one QMatMul over their stacked weights.
size_t stack_qmatmuls(Graph& g);

// MaxReduce over a length-2 axis of a stack of two tensors (an Add of two pieces padded to index 0 and 1 of that
// axis: how Tensor.maximum, relu and clamp are built) -> Maximum of the two pieces' views, which fuses with its
// neighbours. Run before fuse_elementwise.
size_t lower_maximum(Graph& g);

// Chains of elementwise primops (and a sum/max over the last axis at their end) -> one Fused kernel each. With
// `row_reductions`, reductions over the row also fuse into the consumers that read them broadcast along the row
// (Instr::Reduce): RMSNorm and softmax become one kernel each.
size_t fuse_elementwise(Graph& g, bool row_reductions = false);

// MatMul(rows of a float32 row program over the rows of another MatMul, V) -> one Attention kernel: the scores,
// the program (scale, mask, softmax) and the weighted sum of V's rows, without the scores in memory. Run after
// fuse_elementwise.
size_t fuse_attention(Graph& g);

// A Fused node only Linear layers read (MatMuls by a float32 weight input) -> the same program stored in `compute`
// when that is a 16-bit type: the products round it to that anyway. Then such a Linear's product that only 16-bit
// programs read -> stored in `compute` too. Run after fuse_attention (attention's products keep their float32
// operands).
size_t store_matmul_inputs(Graph& g, DType compute);

}  // namespace luminal
