// CUDA code generation: after the shared lowering (MatMul, QMatMul, Dequant, Fused register programs), every live
// node of a graph becomes a step of a schedule, and every step that computes on the GPU gets a kernel printed as
// CUDA C. Needs no GPU: `generate` is what CI compiles with NVRTC for sm_80 and sm_90.
//
// Kernels read their inputs through views whose concrete numbers (offsets, shapes, strides, masks: they depend on
// the bound dims) live in one parameter block of int64s that the runtime fills per set of dims; each kernel gets a
// pointer to its slice. Rank and masking are structural, so they are fixed in the source.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/graph.h"
#include "core/kernel_ir.h"
#include "core/schedule.h"

namespace luminal {
namespace cuda {

// One view a kernel reads: node input `edge`, its axes reordered by `perm` (empty: as is); `base` is its first
// slot in the kernel's parameter slice: [offset, buffer size, shape x rank, strides x rank, (lo, hi) x rank if masked].
struct ViewSlot {
  int edge = 0;
  std::vector<int> perm;
  int rank = 0;
  bool masked = false;
  int base = 0;
};

// A step of the core schedule (core/schedule.h) with its kernels: the parameter slice it reads and the functions.
struct Step : luminal::Step {
  Step() = default;
  explicit Step(const luminal::Step& s) : luminal::Step(s) {}
  std::string fn;                 // Kernel: the function's name in the module
  std::vector<ViewSlot> views;    // Kernel: what the parameter slice holds after its 4 header slots
  int nparams = 4;                // Kernel: slots in the parameter slice
  enum Launch { PerElement, PerRow, PerBlock32, Scatter } launch = PerElement;
  std::string second_fn;          // Scatter: the kernel writing the rows after the copy
  // MatMul: faster kernels the runtime picks when the evaluated views allow (see runtime.cpp): a matrix-vector
  // kernel with 16-byte loads (contiguous, aligned rows) and a shared-memory tiled matrix product (rows that share
  // the weights, i.e. prefill).
  std::string gemv_fn, gemm_fn;
  std::string block_fn;           // a reduction: the block-per-row kernel (for few, long rows)
  std::string mma_fn;             // MatMul with a 16-bit compute dtype: tensor cores (mma.sync), operands rounded to it
  int block_bytes = 0;            // QMatMul / Dequant: bytes per GGUF block
};

// A group of the core schedule and the kernel running it (see luminal::Group). A MatVec group's arguments:
// parameters, error word, the activations; per member its parameter slice, output and weights; per epilogue its
// parameter slice, output and inputs. A batch's: parameters, error word; per step its parameter slice, output and
// inputs.
struct Group : luminal::Group {
  explicit Group(const luminal::Group& g) : luminal::Group(g) {}
  std::string fn;
};

struct Module {
  std::vector<Step> steps;        // producers first; Output nodes are Alias (plain) or Kernel (a copy)
  std::string source;             // the CUDA C module holding every kernel
  std::vector<std::pair<std::string, std::string>> kernels;  // each kernel's name and text (without the prelude)
  std::vector<DType> storage;     // per node id: the dtype its buffer holds on the device
  std::vector<Group> groups;
};

// The helpers every generated module starts with (loads, stores, rounding per dtype).
const char* prelude();

// `compute` is the float type float32 inputs are stored in on the device (see python/luminal/cuda.py). An op the
// backend has no kernel for raises UnsupportedOpError, except a user op (HostOp) with `host_fallback`: it then
// runs its CPU kernel on the host (a Step::Host).
Module generate(const Graph& g, DType compute, bool host_fallback = false);

}  // namespace cuda
}  // namespace luminal
