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
// Then per dim its shape's divider (div_magic), so that unravelling an index divides by a multiply-high.
struct ViewSlot {
  int edge = 0;
  std::vector<int> perm;
  int rank = 0;
  bool masked = false;
  int base = 0;
  int shape_slot(int d) const { return base + 2 + d; }
  int stride_slot(int d) const { return base + 2 + rank + d; }
  int lo_slot(int d) const { return base + 2 + 2 * rank + d; }  // (masked views)
  int hi_slot(int d) const { return base + 2 + 3 * rank + d; }
  int div_slot(int d) const { return base + 2 + (masked ? 4 : 2) * rank + d; }
  int slots() const { return 2 + (masked ? 5 : 3) * rank; }
};
// The divider of d (for udiv in the prelude): for 1 <= d < 2^32, m | l << 32 with l = ceil(log2 d) and
// m = floor(2^32 (2^l - d) / d) + 1, so that n / d = (umulhi(n, m) + n) >> l for every n < 2^32; else 0 (divide).
inline int64_t div_magic(int64_t d) {
  if (d < 1 || d > int64_t(0xffffffff)) return 0;
  int l = 0;
  while ((int64_t(1) << l) < d) ++l;
  uint64_t m = (uint64_t(1) << 32) * ((uint64_t(1) << l) - uint64_t(d)) / uint64_t(d) + 1;
  return int64_t(m | (uint64_t(l) << 32));
}

// One way to run a step: a printed kernel and how it covers the step's work. A step lists its variants in order of
// preference (per op family: a MatMul's tensor-core, tiled, matrix-vector and generic kernels; a reduction's
// block-per-row and warp-per-row kernels); the runtime runs the first that applies to the views the bound dims
// give (see applies() in runtime.cpp); the last always applies.
struct Variant {
  enum Kind : uint8_t {
    Elements,     // a grid-stride loop over items (elements, or a Dequant's blocks)
    Warps,        // a warp per item (an output row of a reduction or a dot product)
    BlockPerRow,  // a block per row: a row reduction's passes, or few long rows of a plain reduction
    MatVec,       // MatMul, a warp per output with 16-byte loads: contiguous, aligned rows
    Tiled,        // MatMul over rows sharing the weights (prefill), 64 x 64 tiles in shared memory
    TensorCore,   // the same with mma.sync, operands rounded to the 16-bit compute dtype
    Flash,        // Attention: 16 query rows per block against tiles of keys and values in shared memory, softmax
                  // online, float32 (see attention_step in codegen.cpp)
    AttentionRows,  // Attention, any row program and views: a block per query row, a pass per Reduce step
    FlashMma,     // Flash on tensor cores (mma.sync, a 16-bit compute dtype): 128 query rows per block
    Gemm128,      // TensorCore pipelined (cp.async ring, ldmatrix), 128 x 128 tiles: 16-byte aligned rows
    Gemm64,       // the same, 64 x 64 tiles: for products with too few 128 x 128 tiles to fill the GPU
    FlashDecode,  // Attention for few query rows per KV head (decode): a block's warps split its key range, a lane
                  // per key; 16-byte loads, no shared tiles (see attention_step)
    ImplicitGemm,  // Contraction (a convolution) as a GEMM whose k runs over several reduced dims, read through the
                   // operands' views (no im2col buffer): 64 x 64 tiles, float32 (see contraction_step)
    ImplicitMma,   // the same on tensor cores (mma.sync), operands rounded to the 16-bit compute dtype
    Blas,          // MatMul by cuBLASLt (src/cuda/cublaslt.*), no kernel of ours: where the library opens
    QMatVec,       // QMatMul Q8_0 over a few rows (decode): a block of 8 warps per 2 outputs, 2-byte aligned blocks
    QGemm,         // QMatMul Q8_0 over more rows (prefill): 64 x 64 tiles on tensor cores, a 16-bit compute dtype
    QDot,          // QMatMul Q8_0 over a few rows (decode) by __dp4a: Step::prep_fn quantises the activations to
                   // int8 blocks in the workspace first, then a block of 8 warps per 4 outputs
    FlashMmaSkip,  // prefill attention on tensor cores (flash_tiles): 64 query rows per block, K and V in two
                   // cp.async stages, the additive mask classified first (tiles no row sees never loaded, tiles whose
                   // loaded mask is 0 run without it); LUMINAL_CUDA_FLASH_MMA_SKIP=0: FlashMma instead
    QRows,         // QMatMul Q8_0 over one row (decode) as MatVec does (dot_rows: a warp per output, float activations,
                   // the quants unpacked in registers): what a MatVec group takes a Q8_0 member in
    Wgmma128,      // Hopper's warpgroup products (wgmma, sm_90) over a ring of stages that the Tensor Memory
                   // Accelerator fills (tensor maps): 128 x 128 tiles, k in 64s, both operands stored in the compute
                   // dtype, rows that a tensor map can describe
    Wgmma256,      // the same, 128 x 256 tiles
    FlashWgmma,    // prefill attention on Hopper's warpgroup products (flash_tiles, sm_90): 128 query rows per block
                   // of two warpgroups, K and V in the compute dtype staged as the descriptors' swizzled tiles;
                   // otherwise as FlashMmaSkip. LUMINAL_CUDA_FLASH_WGMMA=0: FlashMmaSkip instead
    FlashDecodeMma,  // FlashDecode on tensor cores (mma.sync): a 16-bit KV cache in the compute dtype, 16-byte
                     // aligned rows, head sizes of 32s (q) and 64s (v); otherwise FlashDecode.
                     // LUMINAL_CUDA_FLASH_DECODE_MMA=0: FlashDecode instead
  } kind;
  std::string fn;
  int smem = 0;  // dynamic shared memory, bytes (the Gemm kernels)
  int threads = 0;  // the block size where it is not the kind's usual one (FlashMmaSkip's 128, FlashWgmma's 256)
};
const char* variant_name(Variant::Kind k);

// A pipelined GEMM variant's tiles (rows of A, rows of B, k) and ring stages: its dynamic shared memory is
// stages x (bm + bn) x bk 16-bit values. `f32`: an operand is staged from float32 through registers.
struct GemmShape {
  int bm, bn, bk, stages;
  int smem_bytes() const { return stages * (bm + bn) * bk * 2; }
};
inline bool is_wgmma(Variant::Kind k) { return k == Variant::Wgmma128 || k == Variant::Wgmma256; }
// The prefill attention kernels flash_tiles prints (a loaded mask summarised first, 16-byte staging)
inline bool is_flash_tiles(Variant::Kind k) { return k == Variant::FlashMmaSkip || k == Variant::FlashWgmma; }
// The decode attention kernels (4 query rows per block, key ranges merged through the tickets)
inline bool is_flash_decode(Variant::Kind k) { return k == Variant::FlashDecode || k == Variant::FlashDecodeMma; }
GemmShape gemm_shape(Variant::Kind k, bool f32);

// The kernels printed for one step of the core schedule: the parameter slice they read and the variants.
struct Step {
  std::vector<ViewSlot> views;    // what the parameter slice holds after its 4 header slots
  int nparams = 4;                // slots in the parameter slice
  std::vector<Variant> variants;  // Kernel steps: at least one
  std::string rows_fn;            // Scatter: the rows' writes, after the variant's copy of the destination (unless
                                  // the rows go into the destination in place)
  int block_bytes = 0;            // QMatMul / Dequant: bytes per GGUF block
  std::string combine_fn;         // Attention split over key ranges (flash-decoding): merges the ranges' partial
                                  // results, after the Flash variant, when the runtime split the keys; a float32
                                  // Contraction split over k: zeroes the output its blocks then add into
  std::string prep_fn;            // QMatMul's QDot variant: quantises the activation rows into the workspace first;
                                  // FlashMmaSkip: summarises its loaded mask first (mask_summary; into the
                                  // runtime's summaries, shared by steps reading one mask)
  int summary_edge = -1;          // ... that mask's input edge
  const std::string& fn() const { return variants.front().fn; }
};

// The core schedule with the CUDA C that runs it: kernels per step (`steps[i]` for `sched.steps[i]`) and per group.
// A MatVec group's kernel takes: parameters, error word, the activations; per member its parameter slice, output
// and weights; per epilogue its parameter slice, output and inputs. A batch's: parameters, error word; per step its
// parameter slice, output and inputs.
struct Module {
  Schedule sched;
  std::vector<Step> steps;
  std::vector<std::string> group_fns;
  std::vector<std::vector<char>> group_pairs;  // MatVec groups: per unit, whether a warp computes two of its rows
  std::vector<int> group_split;  // MatVec groups: warps per row (K split over them; 1 for other groups)
  std::vector<int64_t> group_stage;  // MatVec groups: the row length staged quantised in shared memory, or 0
  int group_blocks = 2;  // MatVec groups' kernels: blocks a multiprocessor fits (a staged group's grid cap)
  std::string source;             // the CUDA C module holding every kernel
  std::vector<std::pair<std::string, std::string>> kernels;  // each kernel's name and text (without the prelude)
  const std::vector<DType>& storage() const { return sched.storage; }  // per node: the dtype on the device
  DType compute = DType::F32;     // generate's `compute` (what the tensor-core variants round operands to)
  // Input nodes of Q8_0 weights the kernels read stored split (q8_layout.h): the runtime splits their arrays
  std::vector<int64_t> q8_split;
};

// The helpers every generated module starts with (loads, stores, rounding per dtype).
const char* prelude();
// Environment variable `name` as an integer (`fallback` when unset or empty); anything else raises, naming it.
int env_int(const char* name, int fallback);

// `compute` is the float type float32 inputs are stored in on the device (see python/luminal/cuda.py). An op the
// backend has no kernel for raises UnsupportedOpError, except a user op (HostOp) with `host_fallback`: it then
// runs its CPU kernel on the host (a Step::Host).
Module generate(const Graph& g, DType compute, bool host_fallback = false);

}  // namespace cuda
}  // namespace luminal
