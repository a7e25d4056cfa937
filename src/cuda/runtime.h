// The CUDA runtime: device memory (a caching pool; arrays that stay on the GPU between runs), and the launcher of a
// Module: its kernels loaded once; per set of bound dims the core plan (shapes, views, memory) and what the
// launches derive from it (the parameter block, each step's variant and grid); a launch per kernel step.
#pragma once
#include <algorithm>
#include <cstdint>
#include <array>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/graph.h"
#include "core/plan.h"
#include "cuda/api.h"
#include "cuda/codegen.h"
#include "cuda/cublaslt.h"

namespace luminal {
namespace cuda {

// The end of a run on the device: an event recorded after its last kernel, and the run's error word copied to
// page-locked memory just before it. A buffer a run writes carries that run's fence, so reading it waits for that
// run only, not for runs queued after it (a decode step reads its token while the next step already runs).
struct Fence {
  CUevent event = nullptr;
  int* err = nullptr;                       // page-locked: the run's error word, once the event has passed
  CUdeviceptr err_word = 0;                 // the device's error word (cleared after a failure is seen)
  std::shared_ptr<const std::vector<std::string>> labels;  // per node, for the message
  bool waited = false;
  int code = 0;
  // Waits for the run; raises its device-side error (a padded view or an index out of range), naming the node.
  void wait();
};
std::shared_ptr<Fence> new_fence();  // from a pool: events and page-locked words are reused

// A device allocation, returned to the pool (not to the driver) when the last owner lets go.
struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  std::shared_ptr<Fence> fence;  // the run that last wrote it, if a run did
  // Set for memory luminal borrows (a torch tensor's, through from_torch): kept alive while the buffer lives, and
  // the pointer is never returned to the pool.
  std::shared_ptr<void> owner;
  // Q8_0 weights of N rows and K columns held split (q8_layout.h), as a compiled graph's kernels read them; 0: as given
  int64_t q8_split_rows = 0, q8_split_k = 0;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(CUdeviceptr p, size_t b) : ptr(p), bytes(b) {}
  ~DeviceBuffer();
};
std::shared_ptr<DeviceBuffer> device_alloc(size_t bytes);

// A contiguous array on the GPU: what outputs are, and what Graph.set accepts to feed one back without a copy.
struct DeviceArray {
  std::shared_ptr<DeviceBuffer> buf;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
};
DeviceArray upload(const void* host, DType dtype, const std::vector<int64_t>& shape);
void download(const DeviceArray& a, void* host);
DeviceArray convert(const DeviceArray& a, DType to);  // on the device, rounding as a Cast does

// A wgmma GEMM's operands as its tensor maps describe them (3 dims: k or columns, rows, batch; the byte strides of
// rows and batch; the view's offset, elements), and the maps last encoded from them and the output (for which
// variant and pointers; the output's only where its kernel stores through it: 16-bit, rows of 8k, a 16-byte aligned
// start).
struct GemmMaps {
  struct Side {
    unsigned long long dim[3], stride[2];
    int64_t offset;
  } a, b;
  int kind = -1;  // (Variant::Kind of the maps below; -1: none yet)
  CUdeviceptr pa = 0, pb = 0, po = 0;
  std::vector<TensorMap> maps;
};

// A product's Add (Step::add_epilogue) that cuBLASLt computes in its place: out = a.b + c into the Add's buffer.
struct BlasAdd {
  int64_t node = -1;  // the Add (-1: none)
  CUdeviceptr c = 0;  // its other operand
};

class Runtime {
 public:
  Runtime(const Graph& g, Module s);
  // `inputs`: device arrays (in their storage dtype) for Input nodes, merged into the ones given before (the runtime
  // keeps them, so a caller sends only what changed). `donated`: inputs the run may overwrite: a Scatter that is
  // the only reader of a donated input writes its rows into it instead of copying it (the KV-cache update); its
  // result is then that same array. Returns one array per Output. `wait`: return once the device has finished
  // (raising a device-side error of the run); otherwise once the run is queued: reading a result waits for it.
  std::unordered_map<int64_t, DeviceArray> run(const std::unordered_map<int64_t, DeviceArray>& inputs,
                                               const Bindings& dims, const std::vector<int64_t>& donated = {},
                                               bool wait = true);
  const Module& schedule() const { return s_; }
  size_t last_launches() const { return launched_; }  // kernels the last run launched (or replayed)
  // node -> the variant (variant_name) each kernel step of the last run's plan chose; for tests and profiles
  std::unordered_map<int64_t, std::string> last_variants() const;
  // Host seconds the last run spent: planning, recording the launches, replaying the graph (updates and
  // cuGraphLaunch), and waiting for the device (the error word's read); for profiles.
  std::array<double, 4> last_times() const { return times_; }
  // Inputs that a Scatter may update in place when donated (their device arrays are then overwritten).
  std::vector<int64_t> in_place_inputs() const;
  // Outputs of the last run that are a donated input's own array, updated in place (the KV caches of a decode
  // step): the same buffer as the run before, so the caller may keep using the object it already has for them.
  const std::vector<int64_t>& last_in_place_outputs() const { return in_place_outputs_; }

 private:
  // What the launches derive from the core plan, per step (updated for the steps the plan evaluated again).
  struct Launches {
    std::vector<int64_t> params;              // the parameter block
    std::vector<size_t> slot;                 // per step: its first slot in the block
    std::vector<int64_t> items, rows_items;   // per step: work items (elements, rows, blocks); a Scatter's rows
    std::vector<int64_t> prep_items;          // per step: warps of the kernel before (FlashMmaSkip's mask summary;
                                              // 0 where an earlier step's summary is the same)
    std::vector<int64_t> summary_rows;        // per step: FlashMmaSkip's mask summary, distinct rows (0: none) ...
    std::vector<size_t> summary_off;          // ... and its offset in summaries_
    std::vector<size_t> variant;              // per step: the index of its variant (Step::variants) these dims allow
    std::vector<std::array<unsigned, 3>> grid;  // per step: an explicit grid (tiled products, blocks per row)
    std::vector<unsigned> threads;            // per step: the block-per-row kernel's block size
    std::vector<size_t> extra;                // per step: Attention's first slot after its views
    std::unordered_map<int64_t, Buffer> iota;   // host values of Iota nodes
    std::unordered_map<int64_t, size_t> iota_off;             // ... their offsets in the uploaded block
    // per step: the GEMM variants that apply when several do (each with its grid), timed at its first run (choose)
    std::vector<std::vector<std::pair<size_t, std::array<unsigned, 3>>>> cands;
    std::vector<BlasGemm> blas;                               // per step: its product as cuBLASLt runs it
    std::vector<GemmMaps> maps;                               // per step: its operands as a wgmma GEMM reads them
  };
  const luminal::Step& core(size_t i) const { return s_.sched.steps[i]; }
  void configure(size_t i);  // step i's parameter slice, variant and launch, from the plan
  CUdeviceptr q8_layout_of(int64_t id, const DeviceArray& a);  // input id's memory as its kernels read it
  bool split_input(int64_t id) const {  // whether the kernels read input id's Q8_0 weights split (Module::q8_split)
    return std::binary_search(s_.q8_split.begin(), s_.q8_split.end(), id);
  }
  std::unordered_map<int64_t, std::shared_ptr<DeviceBuffer>> split_copies_;  // (borrowed Q8_0 inputs, split)
  bool applies(const Variant& v, const std::vector<ConcreteView>& cv, int64_t out_n, int64_t* p, size_t i);
  std::vector<ConcreteView> views_;  // (configure's scratch)
  void add_producer(size_t step, std::vector<CUdeviceptr>& args) const;
  void write_into_dest(size_t step);
  void build_plan(const Bindings& dims);  // host work only; upload_plan sends it (raises: drop_plan)
  void upload_plan();
  void assign_summaries();  // after build_plan's steps: each distinct mask summary's place, its first step
  void plan_ahead(const Bindings& dims);
  void drop_plan();
  size_t up_lo_ = SIZE_MAX, up_hi_ = 0;  // the parameter slots planned but not uploaded yet
  bool up_iota_ = false;                 // ... and whether the Iota values changed
  Bindings last_dims_, last_delta_;      // the dims of the run before, and how they moved (to predict the next)
  void launch(const std::string& fn, int64_t node, size_t param_slot, int64_t items, bool per_row,
              const std::vector<CUdeviceptr>& ptrs, const unsigned* grid3 = nullptr, unsigned threads = 256,
              unsigned smem = 0, const std::vector<TensorMap>* maps = nullptr);

  Graph g_;
  Module s_;
  CUmodule module_ = nullptr;
  std::unordered_map<std::string, CUfunction> fns_;
  std::unordered_map<int64_t, DeviceArray> constants_;
  Plan plan_;   // (after g_ and s_, which it reads)
  Launches L_;
  // CUDA graphs: a run's kernels are recorded, then replayed as one graph. The graph is rebuilt only when the
  // sequence of kernels changes; otherwise the nodes whose grid or arguments changed (new inputs, outputs, sizes)
  // are updated in place, since the numbers kernels read live in the parameter block, not in their arguments.
  struct Launch {
    CUfunction f;  // null: a cuBLASLt product, `child` (captured by launch_gemm), a child graph node of the chunk
    unsigned grid[3], threads, smem = 0;  // (smem: dynamic shared memory, bytes)
    std::vector<CUdeviceptr> args;  // parameter slice, error word, output, inputs
    std::vector<TensorMap> maps;    // then these, by value (a wgmma GEMM's operands and output)
    int64_t node;
    CUgraph child = nullptr;
    uint64_t child_id = 0;  // (which capture: an address may come back for another graph)
  };
  // A run's launches are replayed in chunks of growing size (16, 32, 64, then 128 each), each its own graph,
  // launched as soon as it is recorded: the GPU starts on the first chunk while the host records and launches the
  // rest (cuGraphLaunch costs host time per node; one graph of ~700 nodes cost ~0.6 ms before the GPU started).
  struct Chunk {
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    std::vector<CUgraphNode> nodes;
    std::vector<Launch> launches;
    bool pdl = false;  // built with programmatic edges
  };
  size_t chunk_size(size_t k) const { return one_graph_ ? SIZE_MAX : k < 3 ? size_t(16) << k : 128; }
  bool one_graph_ = false;  // LUMINAL_CUDA_GRAPH_CHUNKS=0: the whole run as one graph (for comparison)
  bool pdl_ = false;        // programmatic edges between a chunk's kernels (sm_90+; LUMINAL_CUDA_PDL=0: off)
  std::vector<Launch> pending_;
  size_t npending_ = 0, launched_ = 0, nchunk_ = 0;  // launches recorded into the current chunk; chunks this run
  std::array<double, 4> times_{};
  std::vector<int64_t> in_place_outputs_;
  std::vector<Chunk> chunks_;
  void replay(size_t n);  // the current chunk's n launches
  template <class OutOf, class InPlace>
  bool launch_group(size_t g, const OutOf& out_of, const InPlace& in_place_of, std::vector<char>& done);
  bool group_runs(size_t g) const;
  bool prologue_fits(size_t g) const;
  std::unordered_map<int64_t, DeviceArray> owned_;  // this run's own allocations (outputs), and arrays updated in place
  std::vector<char> done_;                // per step this run: computed already (by its group's kernel)
  std::vector<CUdeviceptr> group_args_;
  void execute(const Launch& l);
  // The GEMM variants (own kernels, cuBLASLt): one launched; the fastest of several chosen by timing them on the
  // device, once per product shape (LUMINAL_CUDA_TUNE=0: the first that applies).
  // `add`: the product's Add (Step::add_epilogue) that cuBLASLt computes in its place (blas_add), if any.
  void launch_gemm(size_t i, const Variant& v, const std::vector<CUdeviceptr>& ptrs, BlasAdd add = {});
  void choose(size_t i, const std::vector<CUdeviceptr>& ptrs);
  BlasAdd blas_add(size_t i, const std::vector<CUdeviceptr>& ptrs);
  std::shared_ptr<DeviceBuffer> blas_ws_;  // cuBLASLt's workspace and the operands copied for it
  // cuBLASLt's calls captured as graphs (each a chunk's child graph node), by everything the call reads: kept while
  // the workspace stays (cleared, after the chunk recorded so far is replayed, when it moves or they grow many).
  struct BlasGraph {
    CUgraph graph = nullptr;
    uint64_t id = 0;
  };
  std::map<std::vector<int64_t>, BlasGraph> blas_graphs_;
  uint64_t blas_graph_ids_ = 0;
  bool blas_capture_off_ = false;  // a capture failed: cuBLASLt's calls end the chunks, as with capture off
  void clear_blas_graphs();
  // The left operand copied into blas_ws_ by the last cuBLASLt product (its source, view, dtypes) and launched_ just
  // after that product (SIZE_MAX: none known): see launch_gemm.
  std::pair<std::vector<int64_t>, size_t> blas_copied_{{}, SIZE_MAX};
  bool timing_ = false;  // choose() is timing the candidates

 public:
  ~Runtime();

 private:
  std::shared_ptr<DeviceBuffer> arena_, params_, err_;
  std::shared_ptr<DeviceBuffer> ws_;  // attention split over key ranges: the ranges' partial rows
  size_t ws_bytes_ = 0;               // what the plans so far need of it
  std::shared_ptr<DeviceBuffer> summaries_;  // FlashMmaSkip's mask summaries (assign_summaries)
  size_t summaries_bytes_ = 0;
  // FlashDecode's tickets (a counter per tile of rows, zero between launches: the last key range to finish resets
  // it), and the bytes the plans so far need of them
  std::shared_ptr<DeviceBuffer> tickets_;
  size_t tickets_bytes_ = 0;
  bool tickets_on_ = true;
  int sms_ = 1;
  bool hopper_ = false;  // an sm_90 device: the wgmma GEMM variants run
  bool graphs_on_ = false, has_host_steps_ = false;
  std::vector<CUdeviceptr> scratch_ptrs_, ptr_;
  std::unordered_map<int64_t, DeviceArray> inputs_;     // the inputs given so far
  std::shared_ptr<DeviceBuffer> iota_;                  // the Iota values of the current plan (one upload per plan)
  std::shared_ptr<const std::vector<std::string>> labels_;  // per node: its op's name (device-side error messages)
  // Page-locked staging of a run's uploads (parameters, Iota values), queued behind the runs before it (a plain
  // copy from pageable memory would first wait for them). Two, used in turn, each with an event after its copies,
  // so that preparing a run never overwrites what a queued copy has still to read.
  struct Staging {
    void* host = nullptr;  // page-locked
    size_t bytes = 0;
    CUevent copied = nullptr;
  };
  std::array<Staging, 2> staging_;
  size_t uploads_ = 0;
};

}  // namespace cuda
}  // namespace luminal
