// The schedule: which nodes run, in which order, computing what, and which steps run as one kernel. Made once per
// graph in the core, for every backend: the CPU executor runs its steps in order (one by one), the CUDA backend
// prints a kernel per step and per group and launches them. Needs no device.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "core/graph.h"
#include "core/kernel_ir.h"

namespace luminal {

struct Step {
  enum Kind : uint8_t {
    Input, Constant, Iota,  // leaves: their data is given (or computed once per set of dims)
    Alias,                  // an Output reading its producer as stored: that buffer is the result
    Kernel,                 // computed by a kernel of the backend
    Host,                   // a user op run by its CPU kernel on the host (an explicit fallback of a device backend)
  } kind;
  int64_t node;
  // Kernel: the register program computing the node when it is one (primops, MatMul, Fused, an Output's copy),
  // reading input k through its view with axes reordered by `perm` (a reduction over any axis reads it last).
  std::shared_ptr<const Program> program;
  std::vector<int> perm;
  // A Scatter computing its source in its row writes: the element-wise step that only it reads (that step does
  // not run itself), or -1.
  int64_t producer = -1;
  bool absorbed = false;  // that element-wise step
  // A MatMul whose float operands are read unpadded: it may take a matrix-vector kernel.
  bool matvec = false;
  int group = -1;  // a member of Schedule::groups[group]
  int prologue_of = -1;  // the row program Schedule::groups[prologue_of] computes itself (Group::prologue)
  // A float32 MatMul whose only reader is an element-wise Add of it and another float32 tensor of the same shape,
  // both read as stored: that Add's node, which a GEMM with an accumulating epilogue (D = A.B + C) may compute in
  // the product's place (the residual add after a layer's o and down projections), or -1.
  int64_t add_epilogue = -1;

  // A loop over its output's elements: an element-wise program with no reduction.
  bool elementwise() const {
    return kind == Kernel && program && !matvec && program->reduce == Op::Input && !program->has_row_reductions();
  }
  bool leaf() const { return kind == Input || kind == Constant || kind == Iota; }
};

// Steps that may run as one kernel; its steps are [first, last], next to each other. A backend that takes another
// path for one of them (a matrix product with many rows) runs them one by one, which is always correct.
struct Group {
  enum Kind : uint8_t {
    // Matrix-vector products reading the same activations (a layer's q/k/v, gate and up) in `members`, with the
    // element-wise steps that are the only readers of members computed as they store (`epilogues`, one per unit).
    MatVec,
    // Element-wise loops (programs, a Scatter's row writes) that read none of each other's results.
    Batch,
  } kind;
  std::vector<size_t> members, epilogues;  // MatVec: step indices, in kernel argument order
  std::vector<size_t> units;               // MatVec: per unit (a row of work), its first member's index in `members`
  std::vector<long> unit_epilogue;         // MatVec: per unit, its epilogue's index in `epilogues`, or -1
  std::vector<size_t> batch;               // Batch: its steps
  size_t first = 0, last = 0;
  // MatVec: the step computing the activations when it is a row program of the factored form (RowFactors: RMSNorm)
  // that only the members read, or -1. The group's kernel computes its k-wise part in the dot products' loop (and
  // the row's sums alongside), then scales each dot product by the row scalar, so that the program's own kernel
  // need not run (a backend that runs the group's steps one by one runs it). It comes before `first`.
  long prologue = -1;
};

// A row program (no final reduction) whose output is a product of factors that are each either k-wise (depend on
// no Reduce step) or a row scalar (depend on Reduce steps and immediates only), every Reduce a float32 sum of a
// k-wise register: RMSNorm's x_k * g_k * rsqrt(sum x_k^2 / K + eps). Then sum_k out_k W_jk is
// scalar * sum_k part_k W_jk, the row's sums accumulated in the same pass over k. Registers of Program::code.
struct RowFactors {
  std::vector<int> part, scalar;  // the factors (Mul operands, float32 products)
  std::vector<int> sums;          // the Reduce steps
};
std::optional<RowFactors> row_factors(const Program& prog);

struct Schedule {
  std::vector<Step> steps;   // producers first
  std::vector<Group> groups;
  std::vector<DType> storage;  // per node id: the dtype its buffer holds (weights may be kept in a compute dtype)
};

struct ScheduleOptions {
  DType weights = DType::F32;  // float32 inputs that a matmul multiplies or a gather reads rows of are stored so
  bool groups = false;         // matrix-vector groups, batches, Scatters computing their source
  bool host_fallback = false;  // user ops become Host steps (otherwise the backend must have kernels for them)
  bool prologues = true;       // groups: MatVec groups take the row program producing their activations
};

Schedule make_schedule(const Graph& g, const ScheduleOptions& opts);

// The nodes a step's kernels read: its inputs, with a Scatter's computed source replaced by that source's inputs.
std::vector<int64_t> kernel_reads(const Graph& g, const Step& st);

}  // namespace luminal
