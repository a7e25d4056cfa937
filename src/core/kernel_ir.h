// The kernel IR that backends share: a fused kernel is a small register program over its inputs' views, evaluated
// over an iteration space whose last axis is the row (optionally ending in a sum or max over that axis). A `Reduce`
// step sums or maxes a register over the whole row and gives that value to every element of the row, so
// normalisations (RMSNorm, softmax, layer norm) are one kernel. The lowering (what to fuse) builds it once; each
// backend runs or prints it (the CPU interprets it, CUDA prints it as CUDA C).
#pragma once
#include <vector>

#include "core/graph.h"

namespace luminal {

struct Instr {
  enum Kind : uint8_t { Load, Imm, Apply, Reduce } kind;
  // Apply: a unary or binary primop, Cast, or MaxReduce as the binary max of a and b (torch.maximum: NaN if either
  // is, else b if b > a, else a); Reduce: SumReduce or MaxReduce
  Op op = Op::Input;
  int a = -1, b = -1;  // operand registers
  int input = -1;      // Load: which kernel input
  double imm = 0;      // Imm
  DType dtype = DType::F32;  // the step's result type: values are rounded to it
};

struct Program {
  std::vector<Instr> code;  // register i is code[i]'s result; the last one is the output
  bool has_row_reductions() const {
    for (auto& in : code)
      if (in.kind == Instr::Reduce) return true;
    return false;
  }
  // The registers a pass computing register `target` evaluates (a program with Reduce steps runs a pass per Reduce
  // step, then one for the output): what `target` depends on, with earlier Reduce steps as leaves (their values are
  // known by then); a Reduce target needs its operand.
  std::vector<char> needed_for(size_t target) const {
    std::vector<char> need(code.size(), 0);
    need[target] = 1;
    for (size_t i = target + 1; i-- > 0;) {
      const Instr& in = code[i];
      if (!need[i] || (in.kind == Instr::Reduce && i != target)) continue;
      if (in.a >= 0) need[in.a] = 1;
      if (in.b >= 0) need[in.b] = 1;
    }
    return need;
  }
  Op reduce = Op::Input;    // SumReduce / MaxReduce over the last axis, or Input for none
  bool float_registers = false;  // CPU: every step float32 or bool, every load float32 or bool
};

// The payload of an "Attention" node: `prog` runs over each row of scores S = Q K^T (its input `scores` is that
// row), and the output row is the program's row times V. The node's inputs: q, k (S's operands), v, then the
// program's inputs other than `scores`, in order.
struct AttentionPlan {
  Program prog;
  int scores;
};

// Structural equality and hash: two fused kernels computing the same program are the same op.
inline bool operator==(const Instr& a, const Instr& b) {
  return a.kind == b.kind && a.op == b.op && a.a == b.a && a.b == b.b && a.input == b.input && a.dtype == b.dtype &&
         (a.imm == b.imm || (a.imm != a.imm && b.imm != b.imm));
}
inline bool operator==(const Program& a, const Program& b) {
  return a.code == b.code && a.reduce == b.reduce && a.float_registers == b.float_registers;
}
inline size_t hash_program(const Program& p) {
  size_t h = size_t(p.reduce) * 131 + p.code.size();
  for (auto& in : p.code)
    h = h * 1000003 ^ (size_t(in.kind) | size_t(in.op) << 4 | size_t(in.dtype) << 12 | size_t(in.input + 1) << 16 |
                       size_t(in.a + 1) << 32 | size_t(in.b + 1) << 48);
  return h;
}

}  // namespace luminal
