// The backend ops the core lowering puts in place of primop patterns. Every backend runs (or prints) the same ones.
#pragma once
#include <optional>
#include <string>

#include "core/graph.h"
#include "core/kernel_ir.h"

namespace luminal {

// SumReduce(last axis) of a Mul: one dot product per output, through the operands' broadcast views. The product
// is not rounded to the output type.
class MatMulOp : public TypedOp<MatMulOp> {
 public:
  std::string name() const override { return "MatMul"; }
  bool same(const MatMulOp&) const { return true; }
  size_t attr_hash() const { return 0; }
};

// A MatMul whose reduced axis is several: SumReduce over the last `axes` axes of a Mul (a convolution sums over
// channels and kernel window, which its input's overlapping window view cannot merge into one axis).
class ContractionOp : public TypedOp<ContractionOp> {
 public:
  explicit ContractionOp(int n) : axes(n) {}
  int axes;
  std::string name() const override { return "Contraction"; }
  bool same(const ContractionOp& o) const { return axes == o.axes; }
  size_t attr_hash() const { return size_t(axes); }
};

// The element-wise max of two tensors of one shape (torch.maximum), put in place of a MaxReduce over a stack of
// the two: it fuses as an Apply step (Instr op MaxReduce with two operands).
class MaximumOp : public TypedOp<MaximumOp> {
 public:
  std::string name() const override { return "Maximum"; }
  bool same(const MaximumOp&) const { return true; }
  size_t attr_hash() const { return 0; }
};

// GGUF block-quantised weight formats: blocks of 32 weights.
enum class QuantFormat : uint8_t { Q8_0, Q4_0, Q4_1 };
constexpr int kQuantBlock = 32;  // weights per block
struct QuantFormatInfo {
  const char* name;
  int block_bytes;
};
const QuantFormatInfo& format_info(QuantFormat f);
std::optional<QuantFormat> quant_format(const std::string& name);  // "Q8_0" -> Q8_0

// An op over packed weights of one format: equal when the format is.
template <class Derived>
class QuantOp : public TypedOp<Derived> {
 public:
  explicit QuantOp(QuantFormat f) : format(f) {}
  QuantFormat format;
  bool same(const Derived& o) const { return format == o.format; }
  size_t attr_hash() const { return size_t(format); }
};

// Float32 weights unpacked from uint8 rows of whole blocks (unpacking needs bit reinterpretation, which the primops
// lack, so the graph reads packed weights through this op).
class DequantOp : public QuantOp<DequantOp> {
 public:
  using QuantOp::QuantOp;
  std::string name() const override { return std::string("Dequant") + format_info(format).name; }
};

// MatMul over dequantised weights, unpacked on the fly: inputs are the activations, then one or more packed
// weights whose rows are stacked (several weights reading the same activations: q/k/v, gate/up).
class QMatMulOp : public QuantOp<QMatMulOp> {
 public:
  using QuantOp::QuantOp;
  std::string name() const override { return std::string("QMatMul") + format_info(format).name; }
};

// An element-wise chain (with row reductions, and a reduction at its end) as one kernel: its register program.
class FusedOp : public TypedOp<FusedOp> {
 public:
  explicit FusedOp(Program p) : prog(std::move(p)) {}
  Program prog;
  std::string name() const override { return "Fused"; }
  bool same(const FusedOp& o) const { return prog == o.prog; }
  size_t attr_hash() const { return hash_program(prog); }
};

// Scores, row program and weighted values in one kernel (see AttentionPlan).
class AttentionOp : public TypedOp<AttentionOp> {
 public:
  explicit AttentionOp(AttentionPlan p) : plan(std::move(p)) {}
  AttentionPlan plan;
  std::string name() const override { return "Attention"; }
  bool same(const AttentionOp& o) const { return plan.scores == o.plan.scores && plan.prog == o.plan.prog; }
  size_t attr_hash() const { return hash_program(plan.prog) * 31 + size_t(plan.scores); }
};

// The program a Fused node carries, or null for any other node.
inline const Program* program_of(const Node& n) {
  const FusedOp* f = op_as<FusedOp>(n);
  return f ? &f->prog : nullptr;
}

}  // namespace luminal
