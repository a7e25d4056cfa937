#include "cuda/runtime.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "core/lower/ops.h"
#include "core/plan.h"
#include "core/reference.h"

namespace luminal {
namespace cuda {
namespace {


// Freed device memory is kept by size class (sizes rounded up to 1/8 of their power of two) and reused, so runs
// allocate nothing from the driver once warm (cuMemFree would also synchronise the device). Never destroyed: it
// must outlive every array, including those Python frees at exit.
class Pool {
 public:
  std::shared_ptr<DeviceBuffer> alloc(size_t bytes) {
    size_t cls = size_class(bytes);
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = free_.find(cls);
      if (it != free_.end()) {
        CUdeviceptr p = it->second;
        free_.erase(it);
        return std::make_shared<DeviceBuffer>(p, cls);
      }
    }
    const Driver& d = driver();
    CUdeviceptr p = 0;
    CUresult r = d.cuMemAlloc(&p, cls);
    if (r == 2 /* CUDA_ERROR_OUT_OF_MEMORY */) {
      release_cached();
      r = d.cuMemAlloc(&p, cls);
    }
    check(r, ("cuMemAlloc(" + std::to_string(cls) + " bytes)").c_str());
    return std::make_shared<DeviceBuffer>(p, cls);
  }
  void give_back(CUdeviceptr p, size_t cls) {
    std::lock_guard<std::mutex> l(mu_);
    free_.emplace(cls, p);
  }
  void release_cached() {
    std::lock_guard<std::mutex> l(mu_);
    const Driver& d = driver();
    d.cuCtxSynchronize();
    for (auto& [_, p] : free_) d.cuMemFree(p);
    free_.clear();
  }

 private:
  std::mutex mu_;
  std::multimap<size_t, CUdeviceptr> free_;
};
Pool& pool() {
  static Pool* p = new Pool;
  return *p;
}

void set_context() { check(driver().cuCtxSetCurrent(device().ctx), "cuCtxSetCurrent"); }

int64_t numel_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}


// Conversion kernels between dtypes, compiled on first use.
CUfunction convert_fn(DType from, DType to) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, CUfunction> fns;
  std::lock_guard<std::mutex> l(mu);
  auto key = std::make_pair(int(from), int(to));
  auto it = fns.find(key);
  if (it != fns.end()) return it->second;
  std::string src = std::string(prelude()) +
                    "extern \"C\" __global__ void convert(i64 n, const void* in, void* out) {\n"
                    "  for (i64 t = blockIdx.x * (i64)blockDim.x + threadIdx.x; t < n; t += (i64)gridDim.x * blockDim.x)\n"
                    "    st_" + dtype_name(to) + "(out, t, (double)ld_" + dtype_name(from) + "(in, t));\n}\n";
  const Device& dev = device();
  std::string cubin = compile_cubin(src, dev.major * 10 + dev.minor);
  CUmodule m;
  check(driver().cuModuleLoadData(&m, cubin.data()), "cuModuleLoadData", "convert");
  CUfunction f;
  check(driver().cuModuleGetFunction(&f, m, "convert"), "cuModuleGetFunction", "convert");
  fns[key] = f;
  return f;
}

// Whether environment variable `name` is "0": how the runtime's features are turned off (for comparison).
bool env_zero(const char* name) {
  const char* v = std::getenv(name);
  return v && std::string(v) == "0";
}

// An Iota's `len` values under `dims` (its expression over the element index z), in its dtype.
std::vector<uint8_t> iota_values(const Node& n, int64_t len, Bindings dims) {
  std::vector<uint8_t> host(size_t(len) * dtype_size(n.dtype));
  for (int64_t z = 0; z < len; ++z) {
    dims["z"] = z;
    store_from_double(host.data(), z, n.dtype, double(n.expr.eval(dims)));
  }
  return host;
}

// Fences are reused (an event and a page-locked error word each): a decode step makes one, and creating events or
// page-locked memory per run would cost more than the rest of the run's host work.
struct FencePool {
  std::mutex mu;
  std::vector<Fence*> free;
  int* words = nullptr;  // page-locked error words, handed out in blocks
  size_t left = 0;
};
FencePool& fence_pool() {
  static FencePool* p = new FencePool;  // never destroyed: fences may outlive everything else at exit
  return *p;
}

// Makes page-locked `host` (`bytes` long) hold at least `need` bytes: a new one of need's size class (at least
// `floor`), the old one freed.
void reserve_pinned(void*& host, size_t& bytes, size_t need, size_t floor = 0) {
  if (bytes >= need) return;
  size_t want = std::max(size_class(need), floor);
  void* p = nullptr;
  check(driver().cuMemAllocHost(&p, want), "cuMemAllocHost");
  if (host) check(driver().cuMemFreeHost(host), "cuMemFreeHost");
  host = p;
  bytes = want;
}

// Reads of a finished run's results go through this stream: it does not wait for the runs queued after it, as the
// default stream would (a non-blocking stream does not synchronise with the legacy default stream).
CUstream read_stream() {
  static CUstream s = [] {
    CUstream st = nullptr;
    check(driver().cuStreamCreate(&st, 1 /* CU_STREAM_NON_BLOCKING */), "cuStreamCreate");
    return st;
  }();
  return s;
}

unsigned grid_for(int64_t threads_needed) {
  int64_t cap = int64_t(device().sms) * 32;
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((threads_needed + 255) / 256, cap)));
}

}  // namespace

std::shared_ptr<Fence> new_fence() {
  FencePool& pool = fence_pool();
  std::lock_guard<std::mutex> l(pool.mu);
  Fence* f = nullptr;
  if (!pool.free.empty()) {
    f = pool.free.back();
    pool.free.pop_back();
  } else {
    auto made = std::make_unique<Fence>();
    check(driver().cuEventCreate(&made->event, 2 /* CU_EVENT_DISABLE_TIMING */), "cuEventCreate");
    if (!pool.left) {
      void* p = nullptr;
      check(driver().cuMemAllocHost(&p, 4096), "cuMemAllocHost");
      pool.words = static_cast<int*>(p);
      pool.left = 4096 / sizeof(int);
    }
    made->err = pool.words++;
    pool.left--;
    f = made.release();
  }
  f->waited = false;
  f->code = 0;
  f->labels.reset();
  // Back to the pool with its last owner. (A copy still queued into its word lands before the next run's copy,
  // which is queued after it on the same stream.)
  return std::shared_ptr<Fence>(f, [](Fence* x) {
    FencePool& p = fence_pool();
    std::lock_guard<std::mutex> l(p.mu);
    p.free.push_back(x);
  });
}

void Fence::wait() {
  if (!waited) {
    set_context();
    check(driver().cuEventSynchronize(event), "cuEventSynchronize");
    waited = true;
    code = *err;
    if (code) check(driver().cuMemsetD8(err_word, 0, sizeof(int)), "cuMemsetD8");  // (runs queued since may see it too)
  }
  if (!code) return;
  int64_t node = code / 4;
  std::string op = labels && size_t(node) < labels->size() ? (*labels)[size_t(node)] : "a kernel";
  const char* what[] = {"", "a padded view reads outside its buffer", "an index is out of range for the table's rows",
                        "an index is out of range for the destination's rows"};
  throw std::out_of_range(op + " (node " + std::to_string(node) + "): " + what[code % 4]);
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr) pool().give_back(ptr, bytes);
}

std::shared_ptr<DeviceBuffer> device_alloc(size_t bytes) {
  set_context();
  return pool().alloc(bytes);
}

int64_t DeviceArray::numel() const { return numel_of(shape); }

DeviceArray upload(const void* host, DType dtype, const std::vector<int64_t>& shape) {
  DeviceArray a;
  a.dtype = dtype;
  a.shape = shape;
  a.buf = device_alloc(a.nbytes());
  if (a.nbytes()) check(driver().cuMemcpyHtoD(a.buf->ptr, host, a.nbytes()), "cuMemcpyHtoD");
  return a;
}

// Reads wait for the run that wrote the array (its fence), then copy on the read stream, so that runs queued after
// it keep the device busy meanwhile; an array no run wrote (an upload) is read behind everything queued. Reads up
// to 16 MiB (a decode step's token or logits) go through one page-locked staging buffer: the device writes it at
// full PCIe speed and a memcpy moves it on, where a copy into pageable memory is staged by the driver in pieces.
void download(const DeviceArray& a, void* host) {
  set_context();
  size_t n = a.nbytes();
  if (!n) return;
  std::shared_ptr<Fence> fence = a.buf->fence;
  if (fence) fence->wait();
  CUstream stream = fence ? read_stream() : nullptr;
  const Driver& d = driver();
  if (n > (size_t(16) << 20)) {
    check(d.cuMemcpyDtoHAsync(host, a.buf->ptr, n, stream), "cuMemcpyDtoHAsync");
    check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
    return;
  }
  static std::mutex mu;
  static void* staging = nullptr;  // kept for the process (freeing page-locked memory may synchronise)
  static size_t staging_bytes = 0;
  std::lock_guard<std::mutex> l(mu);
  reserve_pinned(staging, staging_bytes, n, size_t(64) << 10);
  check(d.cuMemcpyDtoHAsync(staging, a.buf->ptr, n, stream), "cuMemcpyDtoHAsync");
  check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
  std::memcpy(host, staging, n);
}

DeviceArray convert(const DeviceArray& a, DType to) {
  if (a.dtype == to) return a;
  DeviceArray out;
  out.dtype = to;
  out.shape = a.shape;
  out.buf = device_alloc(out.nbytes());
  int64_t n = a.numel();
  if (n == 0) return out;
  CUfunction f = convert_fn(a.dtype, to);
  CUdeviceptr in = a.buf->ptr, o = out.buf->ptr;
  void* args[] = {&n, &in, &o};
  check(driver().cuLaunchKernel(f, grid_for(n), 1, 1, 256, 1, 1, 0, nullptr, args, nullptr), "cuLaunchKernel", "convert");
  return out;
}

// A plan holds everything derived from one set of bound dims. It is updated in place when the dims change: only
// the steps whose numbers depend on a dim that changed are evaluated again (a decode step: the few that depend on
// the cache length), and the arena keeps its offsets while the buffers' size classes stay the same, so a CUDA graph
// recorded from it stays valid.
struct Runtime::Plan {
  Bindings dims;
  std::vector<std::vector<int64_t>> shapes;  // per node id
  std::vector<int64_t> params;              // the parameter block
  std::vector<size_t> slot;                 // per step: its first slot in the block
  std::vector<int64_t> offset;              // per node: arena offset, or -1 (own allocation / not a buffer)
  std::vector<char> fresh;                  // per node: a new allocation per run (outputs and what they alias)
  std::vector<int64_t> last_use;            // per node: the last step reading it
  size_t arena_bytes = 0;
  std::vector<size_t> arena_sizes;          // the size classes the arena was planned for
  std::unordered_map<int64_t, std::vector<uint8_t>> iota;  // host values of Iota nodes
  std::unordered_map<int64_t, size_t> iota_off;             // ... their offsets in the uploaded block
  std::vector<int64_t> items;               // per step: work items (elements, rows, blocks)
  std::vector<int64_t> items2;              // per step: Scatter's second kernel
  // per step: 0 the generic kernel; MatMul 1 matrix-vector, 2 tiled, 3 mma; 4 block per row; 5 a copy that these
  // dims make the identity, not run: its result is its input's buffer
  std::vector<int> variant;
  std::vector<std::array<unsigned, 3>> grid;  // per step: the tiled kernel's grid
  std::vector<unsigned> threads;             // per step: the row-reduction kernel's block size
};

namespace {
// Whether a step copies its input unchanged through a view that, evaluated, reads it in order from its start
// (attention's heads put back in token order are the identity for one token): then it need not run.
bool identity_copy(const Step& st, const Node& n, const std::vector<ConcreteView>& cv, const std::vector<int64_t>& shape,
                   const std::vector<DType>& storage) {
  if (!st.program || st.launch != Step::PerElement || st.program->reduce != Op::Input || cv.size() != 1) return false;
  const std::vector<Instr>& code = st.program->code;
  if (code[0].kind != Instr::Load || code[0].dtype != n.dtype || code.size() > 2) return false;
  if (code.size() == 2 && !(code[1].kind == Instr::Apply && code[1].op == Op::Cast && code[1].a == 0 && code[1].dtype == n.dtype))
    return false;
  const ConcreteView& v = cv[0];
  if (v.masked || v.offset != 0 || v.shape != shape || storage[n.inputs[0].node] != storage[st.node]) return false;
  int64_t expect = 1;
  for (size_t d = v.shape.size(); d-- > 0;) {
    if (v.shape[d] != 1 && v.strides[d] != expect) return false;
    expect *= v.shape[d];
  }
  return true;
}

// Which MatMul kernel these evaluated views allow (see Step::gemv_fn / gemm_fn).
int matmul_variant(const Step& st, const std::vector<ConcreteView>& cv, int64_t out_n, std::array<unsigned, 3>& grid,
                   bool& vec16) {
  const ConcreteView &a = cv[0], &b = cv[1];
  size_t r = a.shape.size();
  if (st.gemv_fn.empty() || a.masked || b.masked || out_n == 0) return 0;
  // Rows of k contiguous and every row start 8-element (16-byte or more) aligned: buffers are 256-byte aligned.
  bool aligned = a.shape[r - 1] % 8 == 0 && a.strides[r - 1] == 1 && b.strides[r - 1] == 1 && a.offset % 8 == 0 &&
                 b.offset % 8 == 0;
  for (size_t d = 0; d + 1 < r; ++d)
    if (a.strides[d] % 8 || b.strides[d] % 8) aligned = false;
  if (!st.gemm_fn.empty() && r >= 3 && a.strides[r - 2] == 0 && b.strides[r - 3] == 0 && a.shape[r - 3] >= 16) {
    int64_t M = a.shape[r - 3], N = a.shape[r - 2], batch = out_n / (M * N);
    if (batch <= 65535 && (M + 63) / 64 <= 65535) {
      grid = {unsigned((N + 63) / 64), unsigned((M + 63) / 64), unsigned(batch)};
      if (st.mma_fn.empty()) return 2;
      vec16 = aligned && a.shape[r - 1] % 32 == 0;
      return 3;
    }
  }
  return aligned ? 1 : 0;
}
}  // namespace

Runtime::Runtime(const Graph& g, Module s) : g_(g), s_(std::move(s)) {
  const Device& dev = device();
  sms_ = dev.sms;
  set_context();
  std::string cubin = compile_cubin(s_.source, dev.major * 10 + dev.minor);
  check(driver().cuModuleLoadData(&module_, cubin.data()), "cuModuleLoadData");
  auto load = [&](const std::string& name) {
    if (name.empty() || fns_.count(name)) return;
    CUfunction f;
    check(driver().cuModuleGetFunction(&f, module_, name.c_str()), "cuModuleGetFunction", name);
    fns_[name] = f;
  };
  for (auto& st : s_.steps) {
    for (const std::string* name : {&st.fn, &st.second_fn, &st.gemv_fn, &st.gemm_fn, &st.mma_fn, &st.block_fn}) load(*name);
    if (st.kind == Step::Constant) {
      const Node& n = g_.node(st.node);
      uint64_t v = 0;
      store_from_double(&v, 0, n.dtype, n.value);
      constants_[st.node] = upload(&v, n.dtype, {});
    }
  }
  for (const Group& G : s_.groups) load(G.fn);
  auto labels = std::make_shared<std::vector<std::string>>(g_.size());
  for (int64_t id = 0; id < int64_t(g_.size()); ++id) {
    const Node& n = g_.node(id);
    (*labels)[size_t(id)] = op_label(n);
  }
  labels_ = labels;
  // Symbolic numbers of every shape and view, evaluated per plan.
  shape_nums_.resize(g_.size());
  grows_.assign(g_.size(), 0);
  for (auto& st : s_.steps) {
    const Node& n = g_.node(st.node);
    for (auto& e : n.shape) shape_nums_[st.node].push_back(num(e));
    grows_[st.node] = std::any_of(shape_nums_[st.node].begin(), shape_nums_[st.node].end(), [](const Num& x) { return x.expr; });
    std::vector<SymView> views;
    for (auto& vs : st.views) {
      const View& v = n.inputs[vs.edge].view;
      SymView sv;
      sv.offset = num(v.offset);
      sv.masked = v.has_mask();
      for (size_t d = 0; d < v.rank(); ++d) {
        size_t src = vs.perm.empty() ? d : size_t(vs.perm[d]);
        sv.shape.push_back(num(v.shape[src]));
        sv.strides.push_back(num(v.strides[src]));
        if (sv.masked) {
          sv.lo.push_back(num(v.mask[src].first));
          sv.hi.push_back(num(v.mask[src].second));
        }
      }
      views.push_back(std::move(sv));
    }
    step_views_.push_back(std::move(views));
  }
  // The dims each step's numbers depend on (its views, its output's and inputs' sizes): a new plan evaluates a step
  // again only when one of them changed.
  std::vector<int64_t> readers(g_.size(), 0);
  for (auto& st : s_.steps)
    for (auto& e : g_.node(st.node).inputs) readers[e.node]++;
  for (size_t i = 0; i < s_.steps.size(); ++i) {
    const Step& st = s_.steps[i];
    const Node& n = g_.node(st.node);
    std::vector<std::string> vars;
    auto add = [&](const Expr& e) {
      if (e.is_const()) return;
      for (auto& v : e.vars()) vars.push_back(v);
    };
    for (auto& e : n.shape) add(e);
    if (st.kind == Step::Iota)
      for (auto& v : n.expr.vars())
        if (v != "z") vars.push_back(v);  // z is the element index
    for (auto& in : n.inputs)
      for (auto& e : g_.node(in.node).shape) add(e);
    for (auto& vs : st.views) {
      const View& v = n.inputs[vs.edge].view;
      add(v.offset);
      for (size_t d = 0; d < v.rank(); ++d) {
        add(v.shape[d]);
        add(v.strides[d]);
        if (v.has_mask()) {
          add(v.mask[d].first);
          add(v.mask[d].second);
        }
      }
    }
    std::sort(vars.begin(), vars.end());
    vars.erase(std::unique(vars.begin(), vars.end()), vars.end());
    uint64_t mask = 0;
    for (auto& v : vars) {
      size_t k = std::find(var_names_.begin(), var_names_.end(), v) - var_names_.begin();
      if (k == var_names_.size()) var_names_.push_back(v);
      mask |= uint64_t(1) << std::min<size_t>(k, 63);
    }
    step_vars_.push_back(mask);
    // A Scatter may write its rows into its destination when that is an input only it reads, as stored, in the
    // same dtype (the CPU executor's rule); the run does so when the caller donated that input.
    const Edge* dest = n.op == Op::Scatter && st.kind == Step::Kernel ? &n.inputs[0] : nullptr;
    in_place_ok_.push_back(dest && g_.node(dest->node).op == Op::Input && readers[dest->node] == 1 &&
                           is_plain(g_, *dest) && s_.storage[dest->node] == s_.storage[st.node]);
    absorbed_.push_back(0);
    // A copy may be skipped (see identity_copy) when it is not an output, not computed by a matrix-vector group,
    // and reads a buffer this run computed (not an input a Scatter may update in place, nor such a Scatter's result).
    const Node* src = st.kind == Step::Kernel && n.inputs.size() == 1 ? &g_.node(n.inputs[0].node) : nullptr;
    may_alias_.push_back(src && n.op != Op::Output && (st.group < 0 || !s_.groups[size_t(st.group)].batch.empty()) &&
                         src->op != Op::Input && src->op != Op::Constant && src->op != Op::Iota && src->op != Op::Scatter);
  }
  step_of_.assign(g_.size(), -1);
  for (size_t i = 0; i < s_.steps.size(); ++i) step_of_[size_t(s_.steps[i].node)] = int64_t(i);
  for (const Step& st : s_.steps)  // (a Scatter's source computed in its row writes does not run itself)
    if (st.producer >= 0) absorbed_[size_t(step_of_[size_t(st.producer)])] = 1;
  // An Iota that depends on no dim (an argmax's index row) is computed and uploaded once, like a constant (in the
  // plan's Iota block, the 128256 indices of a vocabulary were sent again with every plan).
  for (size_t i = 0; i < s_.steps.size(); ++i) {
    const Step& st = s_.steps[i];
    if (st.kind != Step::Iota || step_vars_[i]) continue;
    const Node& n = g_.node(st.node);
    int64_t len = n.shape.empty() ? 1 : n.shape[0].as_const();
    constants_[st.node] = upload(iota_values(n, len, {}).data(), n.dtype, {len});
  }
  for (auto& st : s_.steps) has_host_steps_ = has_host_steps_ || st.kind == Step::Host;
  err_ = device_alloc(sizeof(int));
  check(driver().cuMemsetD8(err_->ptr, 0, sizeof(int)), "cuMemsetD8");
}

std::vector<int64_t> Runtime::in_place_inputs() const {
  std::vector<int64_t> out;
  for (size_t i = 0; i < s_.steps.size(); ++i)
    if (in_place_ok_[i]) out.push_back(g_.node(s_.steps[i].node).inputs[0].node);
  return out;
}

Runtime::Num Runtime::num(const Expr& e) {
  Num n;
  if (e.is_const()) n.value = e.as_const();
  else n.expr = &e;  // points into g_, which the runtime owns and never changes
  return n;
}

void Runtime::build_plan(const Bindings& dims) {
  const bool first = !plan_;
  if (first) {
    plan_ = std::make_shared<Plan>();
    Plan& P = *plan_;
    size_t nn = g_.size(), ns = s_.steps.size();
    P.shapes.assign(nn, {});
    P.offset.assign(nn, -1);
    P.fresh.assign(nn, 0);
    P.last_use.assign(nn, -1);
    P.items.assign(ns, 0);
    P.items2.assign(ns, 0);
    P.variant.assign(ns, 0);
    P.grid.assign(ns, {1, 1, 1});
    P.threads.assign(ns, 256);
    size_t nparams = 0;
    for (size_t i = 0; i < ns; ++i) {
      const Step& st = s_.steps[i];
      const Node& n = g_.node(st.node);
      P.slot.push_back(nparams);
      if (st.kind == Step::Kernel) nparams += size_t(st.nparams);
      for (int64_t r : kernel_reads(g_, s_.steps[i])) P.last_use[r] = int64_t(i);
      if (n.op == Op::Output) {
        P.fresh[st.node] = 1;
        if (st.kind == Step::Alias) P.fresh[n.inputs[0].node] = 1;
      }
    }
    P.params.assign(nparams, 0);
    // A group's kernel computes all its steps at once: what they read stays alive, and what they write is kept
    // apart from it, through the whole group (as if the group were one step).
    for (const Group& G : s_.groups)
      for (size_t i = G.first; i <= G.last; ++i)
        for (int64_t r : kernel_reads(g_, s_.steps[i]))
          if (P.last_use[r] >= int64_t(G.first)) P.last_use[r] = std::max<int64_t>(P.last_use[r], int64_t(G.last));
  }
  Plan& P = *plan_;
  // A step is evaluated again when a dim it depends on changed (or was never bound: evaluating then names it).
  uint64_t changed = 0;
  for (size_t k = 0; k < var_names_.size(); ++k) {
    auto a = P.dims.find(var_names_[k]);
    auto b = dims.find(var_names_[k]);
    if (a == P.dims.end() || b == dims.end() || a->second != b->second) changed |= uint64_t(1) << std::min<size_t>(k, 63);
  }
  auto stale = [&](size_t i) { return first || (step_vars_[i] & changed) != 0; };
  size_t lo_slot = P.params.size(), hi_slot = 0;  // the range of the parameter block that changed
  bool iota_changed = false;
  for (size_t i = 0; i < s_.steps.size(); ++i) {
    if (!stale(i)) continue;
    const Step& st = s_.steps[i];
    const Node& n = g_.node(st.node);
    std::vector<int64_t>& shape = P.shapes[st.node];
    shape.clear();
    for (size_t d = 0; d < n.shape.size(); ++d) {
      int64_t v = shape_nums_[st.node][d].eval(dims);
      if (v < 0)
        throw std::invalid_argument("dimension " + n.shape[d].str() + " evaluates to a negative size " + std::to_string(v));
      shape.push_back(v);
    }
    if (st.kind == Step::Iota && !constants_.count(st.node)) {
      P.iota[st.node] = iota_values(n, shape[0], dims);
      iota_changed = true;
    }
    if (st.kind != Step::Kernel) continue;
    // Parameters: every view the kernel reads, evaluated under these dims, checked against its buffer.
    P.items[i] = P.items2[i] = 0;
    P.variant[i] = 0;
    P.grid[i] = {1, 1, 1};
    P.threads[i] = 256;
    int64_t* p = P.params.data() + P.slot[i];  // the step's slice of the block, written in place
    std::fill(p, p + st.nparams, 0);
    p[0] = st.node;
    std::vector<ConcreteView> cv;
    for (size_t k = 0; k < st.views.size(); ++k) {
      const ViewSlot& vs = st.views[k];
      const SymView& sv = step_views_[i][k];
      const Edge& e = n.inputs[vs.edge];
      static const View no_view;
      static const Bindings no_dims;
      ConcreteView v(no_view, no_dims);
      v.offset = sv.offset.eval(dims);
      v.masked = sv.masked;
      for (int d = 0; d < vs.rank; ++d) {
        v.shape.push_back(sv.shape[d].eval(dims));
        v.strides.push_back(sv.strides[d].eval(dims));
        if (sv.masked) {
          v.lo.push_back(sv.lo[d].eval(dims));
          v.hi.push_back(sv.hi[d].eval(dims));
        }
      }
      int64_t size = numel_of(P.shapes[e.node]);
      if (g_.node(e.node).op == Op::Constant) size = 1;
      p[vs.base] = v.offset;
      p[vs.base + 1] = size;
      for (int d = 0; d < vs.rank; ++d) {
        p[vs.base + 2 + d] = v.shape[d];
        p[vs.base + 2 + vs.rank + d] = v.strides[d];
        if (vs.masked) {
          p[vs.base + 2 + 2 * vs.rank + d] = v.lo[d];
          p[vs.base + 2 + 3 * vs.rank + d] = v.hi[d];
        }
      }
      if (!vs.masked && numel_of(v.shape) > 0) {  // padded views are checked per element on the device
        int64_t lo = v.offset, hi = v.offset;
        for (int d = 0; d < vs.rank; ++d) (v.strides[d] < 0 ? lo : hi) += (v.shape[d] - 1) * v.strides[d];
        if (lo < 0 || hi >= size)
          throw std::out_of_range(op_label(n) + " (node " +
                                  std::to_string(st.node) + "): a view reads element " + std::to_string(lo < 0 ? lo : hi) +
                                  " of a buffer of " + std::to_string(size) + " elements");
      }
      cv.push_back(v);
    }
    int64_t out_n = numel_of(shape);
    if (st.block_bytes && op_as<QMatMulOp>(n)) {
      const ConcreteView& a = cv[0];
      size_t r = a.shape.size();
      int64_t K = a.shape[r - 1], N = a.shape[r - 2], rows = 0;
      size_t m = cv.size() - 1, S = size_t(st.nparams) - (m + 1);  // the weights' first rows follow the views
      bool ok = a.strides[r - 1] == 1 && K % 32 == 0;
      for (size_t j = 1; j <= m; ++j) {
        const ConcreteView& w = cv[j];
        ok = ok && w.shape.size() == 2 && w.strides[1] == 1 && !w.masked && w.shape[1] == K / 32 * st.block_bytes;
        p[S + j - 1] = rows;
        rows += ok ? w.shape[0] : 0;
      }
      p[S + m] = rows;
      if (!ok || rows != N)
        throw std::invalid_argument(op_label(n) + ": expects contiguous activation rows and uint8 weight rows of whole blocks");
      p[2] = K;
      p[3] = N;
      P.items[i] = out_n;
    } else if (st.block_bytes) {
      const ConcreteView& w = cv[0];
      int64_t bytes = w.shape.back();
      if (w.strides.back() != 1 || bytes % st.block_bytes)
        throw std::invalid_argument(op_label(n) + ": expects uint8 rows of whole blocks");
      p[2] = bytes / st.block_bytes * 32;
      P.items[i] = p[2] ? out_n / 32 : 0;
    } else if (st.program && st.program->has_row_reductions()) {
      // A block per row (codegen's row_kernel): p[2] the row length, items the rows.
      int64_t L = cv[0].shape.empty() ? 1 : cv[0].shape.back();
      p[2] = L;
      P.items[i] = st.program->reduce != Op::Input ? out_n : (L ? out_n / L : 0);
      P.variant[i] = 4;
      P.grid[i] = {unsigned(std::max<int64_t>(1, std::min<int64_t>(P.items[i], int64_t(sms_) * 16))), 1, 1};
      // Threads: about a quarter of the row, so each thread has ~4 elements per pass, all loads in flight at once
      // (the passes are unrolled by 4); a decode step's RMSNorm over 4096 was latency-bound at 16 per thread.
      unsigned t = 32;
      while (t < 1024 && int64_t(t) * 4 < L) t *= 2;
      P.threads[i] = t;
    } else if (st.program && st.program->reduce != Op::Input) {
      p[2] = cv[0].shape.back();
      P.items[i] = out_n;
      // Few long rows: a block per row keeps the machine busy (a warp per row would use a few SMs).
      if (!st.block_fn.empty() && out_n < int64_t(sms_) * 8 && p[2] >= 512) {
        P.variant[i] = 4;
        P.grid[i] = {unsigned(std::min<int64_t>(out_n, int64_t(sms_) * 16)), 1, 1};
      }
    } else if (may_alias_[i] && identity_copy(st, n, cv, shape, s_.storage)) {
      P.variant[i] = 5;  // (items 0: in a batch, its loop does nothing)
    } else {
      P.items[i] = out_n;
    }
    if (!st.gemv_fn.empty()) {
      bool vec16 = false;
      P.variant[i] = matmul_variant(st, cv, out_n, P.grid[i], vec16);
      p[3] = vec16;  // the mma kernel's 16-byte staging loads
    }
    if (!st.second_fn.empty()) {  // Scatter: rows of the index
      int64_t row = out_n / std::max<int64_t>(1, shape.empty() ? 1 : shape[0]);
      if (!shape.empty() && shape[0] == 0) row = 0;
      p[3] = row;
      p[2] = numel_of(cv[1].shape) * row;
      P.items2[i] = p[2];
    }
    p[1] = P.items[i];
    lo_slot = std::min(lo_slot, P.slot[i]);
    hi_slot = std::max(hi_slot, P.slot[i] + size_t(st.nparams));
  }
  P.dims = dims;
  // The arena: each intermediate gets an offset no buffer alive at the same time overlaps (first fit). Planned for
  // size classes (1/8 of a power of two, or a power of two for a buffer that grows with the dims), so a buffer that
  // grows by a row per decode step keeps the plan (and the pointers a CUDA graph holds) for many steps.
  std::vector<size_t> sizes;
  for (size_t i = 0; i < s_.steps.size(); ++i) {
    const Step& st = s_.steps[i];
    bool buffer = st.kind == Step::Kernel || st.kind == Step::Host;
    if (buffer && !P.fresh[st.node] && (P.variant[i] == 5 || absorbed_[i])) {
      sizes.push_back(0);  // (its input's buffer; or none)
    } else if (buffer && !P.fresh[st.node]) {
      // (With 1/8 classes, a decode step's attention scores moved the plan every few steps, and with it every
      // kernel argument in the graph.)
      size_t bytes = size_t(numel_of(P.shapes[st.node])) * dtype_size(s_.storage[st.node]);
      size_t cls = size_class(bytes);
      if (grows_[st.node]) cls = size_t(1) << (64 - __builtin_clzll(std::max<size_t>(cls, 2) - 1));
      sizes.push_back(cls);
    }
  }
  if (first || sizes != P.arena_sizes) {
    struct Live { size_t off, bytes; int64_t until; };
    std::vector<Live> live;
    P.arena_bytes = 0;
    // A buffer lives until its last reader, or its aliases' (identity copies, latest first: they may chain).
    std::vector<int64_t> until = P.last_use;
    for (size_t i = s_.steps.size(); i-- > 0;)
      if (P.variant[i] == 5) {
        int64_t in = g_.node(s_.steps[i].node).inputs[0].node;
        until[in] = std::max(until[in], std::max(until[s_.steps[i].node], int64_t(i)));
      }
    size_t k = 0;
    for (size_t i = 0; i < s_.steps.size(); ++i) {
      const Step& st = s_.steps[i];
      int64_t now = st.group >= 0 ? int64_t(s_.groups[size_t(st.group)].first) : int64_t(i);
      live.erase(std::remove_if(live.begin(), live.end(), [&](const Live& l) { return l.until < now; }), live.end());
      bool buffer = st.kind == Step::Kernel || st.kind == Step::Host;
      if (!buffer || P.fresh[st.node]) continue;
      size_t bytes = sizes[k++];
      if (P.variant[i] == 5 || absorbed_[i]) {
        P.offset[st.node] = absorbed_[i] ? -1 : P.offset[g_.node(st.node).inputs[0].node];
        continue;
      }
      size_t off = 0;  // `live` is kept sorted by offset
      auto pos = live.begin();
      for (; pos != live.end(); ++pos) {
        if (off + bytes <= pos->off) break;
        off = std::max(off, pos->off + pos->bytes);
      }
      P.offset[st.node] = int64_t(off);
      P.arena_bytes = std::max(P.arena_bytes, off + bytes);
      live.insert(pos, {off, bytes, std::max<int64_t>(until[st.node], int64_t(i))});
    }
    P.arena_sizes = std::move(sizes);
  }
  up_lo_ = std::min(up_lo_, lo_slot);
  up_hi_ = std::max(up_hi_, hi_slot);
  up_iota_ = up_iota_ || iota_changed;
}

// What planning changed reaches the device: the parameter block's changed range, the Iota block, a larger arena.
// (Separate from build_plan, which may run ahead while the device still reads the previous step's numbers.)
void Runtime::upload_plan() {
  Plan& P = *plan_;
  size_t lo_slot = up_lo_, hi_slot = up_hi_;
  bool iota_changed = up_iota_;
  up_lo_ = SIZE_MAX;
  up_hi_ = 0;
  up_iota_ = false;
  size_t pbytes = std::max<size_t>(P.params.size(), 1) * sizeof(int64_t);
  if (!params_ || params_->bytes < pbytes) {
    params_ = device_alloc(pbytes);
    lo_slot = 0;
    hi_slot = P.params.size();
  }
  if (!arena_ || arena_->bytes < P.arena_bytes) {
    arena_.reset();
    arena_ = device_alloc(std::max<size_t>(P.arena_bytes, 256));
  }
  // Iota values not returned as outputs: one block, uploaded when they change (its address stays while it fits).
  std::vector<uint8_t> block;
  if (iota_changed) {
    P.iota_off.clear();
    for (auto& [id, host] : P.iota) {
      if (P.fresh[id]) continue;
      P.iota_off[id] = block.size();
      block.insert(block.end(), host.begin(), host.end());
      block.resize((block.size() + 255) / 256 * 256);
    }
    if (!block.empty() && (!iota_ || iota_->bytes < block.size())) iota_ = device_alloc(size_class(block.size()));
  }
  size_t pn = lo_slot < hi_slot ? (hi_slot - lo_slot) * sizeof(int64_t) : 0;
  if (!pn && block.empty()) return;
  // Through page-locked staging, queued behind the runs before: they may still be reading the old numbers.
  const Driver& d = driver();
  Staging& S = staging_[uploads_++ % staging_.size()];
  if (S.copied) check(d.cuEventSynchronize(S.copied), "cuEventSynchronize");
  else check(d.cuEventCreate(&S.copied, 2 /* CU_EVENT_DISABLE_TIMING */), "cuEventCreate");
  reserve_pinned(S.host, S.bytes, pn + block.size());
  char* host = static_cast<char*>(S.host);
  std::memcpy(host, P.params.data() + lo_slot, pn);
  if (!block.empty()) std::memcpy(host + pn, block.data(), block.size());
  if (pn)
    check(d.cuMemcpyHtoDAsync(params_->ptr + lo_slot * sizeof(int64_t), host, pn, nullptr), "cuMemcpyHtoDAsync",
          "parameters");
  if (!block.empty()) check(d.cuMemcpyHtoDAsync(iota_->ptr, host + pn, block.size(), nullptr), "cuMemcpyHtoDAsync", "Iota");
  check(d.cuEventRecord(S.copied, nullptr), "cuEventRecord");
}

void Runtime::launch(const std::string& fn, int64_t node, size_t slot, int64_t items, bool per_row,
                     const std::vector<CUdeviceptr>& ptrs, const unsigned* grid3, unsigned threads) {
  if (items <= 0 && !graphs_on_) return;  // (in a graph the node stays, a no-op: the sequence stays the same)
  ++launched_;
  // Recorded into a reused entry (no allocation per launch once warm).
  if (npending_ == pending_.size()) pending_.emplace_back();
  Launch& l = pending_[npending_];
  l.f = fns_.at(fn);
  l.node = node;
  l.threads = threads;
  // Kernels loop over their work (grid-stride), so any grid is correct: blocks are rounded up to a power of two,
  // so that a decode step whose work grows by a row keeps its grid (and a CUDA graph its node) for many steps.
  int64_t threads_needed = std::max<int64_t>(1, per_row ? items * 32 : items);
  int64_t blocks = (threads_needed + 255) / 256, pow2 = 1;
  while (pow2 < blocks) pow2 <<= 1;
  l.grid[0] = unsigned(std::min<int64_t>(pow2, int64_t(sms_) * 32));
  l.grid[1] = l.grid[2] = 1;
  if (grid3)
    for (int k = 0; k < 3; ++k) l.grid[k] = std::max(1u, grid3[k]);
  l.args.clear();
  l.args.push_back(params_->ptr + slot * sizeof(int64_t));
  l.args.push_back(err_->ptr);
  l.args.insert(l.args.end(), ptrs.begin(), ptrs.end());
  if (!graphs_on_) execute(l);
  else if (++npending_ == chunk_size(nchunk_)) replay(npending_);
}

void Runtime::execute(const Launch& l) {
  void* small[16];
  std::vector<void*> big;
  void** args = small;
  if (l.args.size() > 16) {
    big.resize(l.args.size());
    args = big.data();
  }
  for (size_t k = 0; k < l.args.size(); ++k) args[k] = const_cast<CUdeviceptr*>(&l.args[k]);
  CUresult r = driver().cuLaunchKernel(l.f, l.grid[0], l.grid[1], l.grid[2], l.threads, 1, 1, 0, nullptr, args, nullptr);
  if (r) {
    const Node& n = g_.node(l.node);
    check(r, "cuLaunchKernel", "node " + std::to_string(l.node) + " (" + op_label(n) + ")");
  }
}

namespace {
KernelNodeParams node_params(CUfunction f, const unsigned* grid, unsigned threads, std::vector<void*>& argp,
                             std::vector<CUdeviceptr>& args) {
  argp.resize(args.size());
  for (size_t k = 0; k < args.size(); ++k) argp[k] = &args[k];
  KernelNodeParams p{};
  p.func = f;
  p.gridDimX = grid[0];
  p.gridDimY = grid[1];
  p.gridDimZ = grid[2];
  p.blockDimX = threads;
  p.blockDimY = p.blockDimZ = 1;
  p.kernelParams = argp.data();
  return p;
}
}  // namespace

// Replays the current chunk's `n` recorded launches as its CUDA graph: the same sequence of kernels as the graph
// holds updates only the nodes whose grid or pointers changed (a decode step: usually none, since the numbers that
// change live in the parameter block); another sequence (prefill after decode) builds the chunk's graph again.
void Runtime::replay(size_t n) {
  const Driver& d = driver();
  if (chunks_.size() <= nchunk_) chunks_.resize(nchunk_ + 1);
  Chunk& c = chunks_[nchunk_++];
  npending_ = 0;
  bool same = c.exec && n == c.launches.size() && c.pdl == pdl_;
  for (size_t i = 0; same && i < n; ++i)
    same = pending_[i].f == c.launches[i].f && pending_[i].args.size() == c.launches[i].args.size();
  std::vector<void*> argp;
  if (same) {
    for (size_t i = 0; i < n; ++i) {
      Launch &now = pending_[i], &was = c.launches[i];
      if (now.args == was.args && now.threads == was.threads && std::equal(now.grid, now.grid + 3, was.grid)) continue;
      KernelNodeParams p = node_params(now.f, now.grid, now.threads, argp, now.args);
      check(d.cuGraphExecKernelNodeSetParams(c.exec, c.nodes[i], &p), "cuGraphExecKernelNodeSetParams");
    }
  } else {
    CUgraphExec exec = c.exec;
    CUgraph graph = c.graph;
    c.exec = nullptr;  // (cleared first: a failure below must not leave them for the destructor to free again)
    c.graph = nullptr;
    if (exec) check(d.cuGraphExecDestroy(exec), "cuGraphExecDestroy");
    if (graph) check(d.cuGraphDestroy(graph), "cuGraphDestroy");
    check(d.cuGraphCreate(&c.graph, 0), "cuGraphCreate");
    c.nodes.assign(n, nullptr);
    c.pdl = pdl_;
    GraphEdgeData edge;  // programmatic: the next kernel launches as this one's blocks start (see pdl_start)
    edge.from_port = 1;
    edge.type = 1;
    for (size_t i = 0; i < n; ++i) {
      KernelNodeParams p = node_params(pending_[i].f, pending_[i].grid, pending_[i].threads, argp, pending_[i].args);
      bool chain = i && !pdl_;
      check(d.cuGraphAddKernelNode(&c.nodes[i], c.graph, chain ? &c.nodes[i - 1] : nullptr, chain ? 1 : 0, &p),
            "cuGraphAddKernelNode");
      if (i && pdl_) check(d.cuGraphAddDependencies(c.graph, &c.nodes[i - 1], &c.nodes[i], &edge, 1), "cuGraphAddDependencies");
    }
    check(d.cuGraphInstantiateWithFlags(&c.exec, c.graph, 0), "cuGraphInstantiateWithFlags");
  }
  // The recorded launches become the chunk's (the vectors swap, keeping their memory for the next recording).
  std::swap(pending_, c.launches);
  c.launches.resize(n);
  if (pending_.size() < n) pending_.resize(n);
  check(d.cuGraphLaunch(c.exec, nullptr), "cuGraphLaunch");
}

Runtime::~Runtime() {
  // (Unchecked: a destructor cannot raise, and these fail only once the context itself is gone. A graph still
  // running is freed when it finishes; the staging is freed after its copies.)
  for (Chunk& c : chunks_) {
    if (c.exec) driver().cuGraphExecDestroy(c.exec);
    if (c.graph) driver().cuGraphDestroy(c.graph);
  }
  for (Staging& S : staging_) {
    if (S.copied) driver().cuEventSynchronize(S.copied);
    if (S.copied) driver().cuEventDestroy(S.copied);
    if (S.host) driver().cuMemFreeHost(S.host);
  }
}

// A Scatter writing its rows into its destination, a donated input: that array becomes its result.
void Runtime::write_into_dest(size_t i) {
  int64_t id = s_.steps[i].node, dest = g_.node(id).inputs[0].node;
  owned_[id] = inputs_.at(dest);
  ptr_[id] = ptr_[dest];
}

// A Scatter computing its source: the source's parameter slice and inputs follow its arguments.
void Runtime::add_producer(size_t i, std::vector<CUdeviceptr>& args) const {
  int64_t pn = s_.steps[i].producer;
  if (pn < 0) return;
  args.push_back(params_->ptr + plan_->slot[size_t(step_of_[size_t(pn)])] * sizeof(int64_t));
  for (auto& e : g_.node(pn).inputs) args.push_back(ptr_[e.node]);
}

// A group's kernel, at its first step, when every member takes the matrix-vector path (see codegen.h's Group);
// marks the group's steps done. Otherwise (prefill) returns false and the steps run one by one.
template <class OutOf, class InPlace>
bool Runtime::launch_group(const Group& G, const OutOf& out_of, const InPlace& in_place_of, std::vector<char>& done) {
  const Plan& plan = *plan_;
  std::vector<CUdeviceptr>& args = group_args_;
  auto slot = [&](size_t i) { return params_->ptr + plan.slot[i] * sizeof(int64_t); };
  if (!G.batch.empty()) {
    // A batch: each step's plain loop (a Scatter's row writes only when they go into its destination in place).
    for (size_t b : G.batch)
      if (s_.steps[b].launch == Step::Scatter ? !in_place_of(b) : plan.variant[b] != 0 && plan.variant[b] != 5) return false;
    args.clear();
    int64_t items = 0;
    for (size_t b : G.batch) {
      const Step& st = s_.steps[b];
      const Node& n = g_.node(st.node);
      if (st.launch == Step::Scatter) {
        write_into_dest(b);
        items += plan.items2[b];
      } else {  // (an identity copy counts no items: its loop does nothing)
        ptr_[st.node] = plan.variant[b] == 5 ? ptr_[n.inputs[0].node] : out_of(st.node);
        items += plan.items[b];
      }
      args.insert(args.end(), {slot(b), ptr_[st.node]});
      for (auto& in : n.inputs) args.push_back(ptr_[in.node]);
      add_producer(b, args);
    }
    launch(G.fn, s_.steps[G.batch[0]].node, plan.slot[G.batch[0]], items, false, args);
    for (size_t k = G.first; k <= G.last; ++k) done[k] = 1;
    return true;
  }
  for (size_t m : G.members)
    if (plan.variant[m] != 1) return false;
  const Step& s0 = s_.steps[G.members[0]];
  args.assign(1, ptr_[g_.node(s0.node).inputs[0].node]);
  for (size_t m : G.members) {
    const Node& n = g_.node(s_.steps[m].node);
    ptr_[s_.steps[m].node] = out_of(s_.steps[m].node);
    args.insert(args.end(), {slot(m), ptr_[s_.steps[m].node], ptr_[n.inputs[1].node]});
  }
  for (size_t e : G.epilogues) {
    const Node& n = g_.node(s_.steps[e].node);
    ptr_[s_.steps[e].node] = out_of(s_.steps[e].node);
    args.insert(args.end(), {slot(e), ptr_[s_.steps[e].node]});
    for (auto& in : n.inputs) args.push_back(ptr_[in.node]);
  }
  int64_t rows = 0;
  for (size_t u : G.units) rows += plan.items[G.members[u]];
  launch(G.fn, s0.node, plan.slot[G.members[0]], rows, true, args);
  for (size_t k = G.first; k <= G.last; ++k) done[k] = 1;
  return true;
}

void Runtime::drop_plan() {
  plan_.reset();
  up_lo_ = SIZE_MAX;
  up_hi_ = 0;
  up_iota_ = false;
}

// The next run's plan, made on the host while the device works, when the dims moved the same way in the last two
// runs (decode: the cache length grows by one): a run with the predicted dims then only uploads what changed
// (~0.3 ms of planning per 8B decode step no longer keeps the GPU waiting). A wrong guess costs what planning would
// have (the next run re-evaluates the steps whose dims differ). One that planning rejects (a view past a buffer's
// end: the cache is about to grow) drops the plan, which the next run makes from scratch (once per cache doubling).
// Other changes (prefill after decode) are not guessed: planning a 2048-token prefill was measured at ~150 ms of
// host time, and a rejected guess there cost a second plan from scratch.
void Runtime::plan_ahead(const Bindings& dims) {
  Bindings delta;
  for (auto& [name, v] : dims) {
    auto it = last_dims_.find(name);
    if (it == last_dims_.end()) delta[name] = INT64_MAX;  // newly bound: not a steady move
    else if (it->second != v) delta[name] = v - it->second;
  }
  bool steady = !delta.empty() && delta == last_delta_;
  last_dims_ = dims;
  last_delta_ = std::move(delta);
  if (!steady || !plan_) return;
  Bindings next = dims;
  for (auto& [name, d] : last_delta_) {  // (steady: no dim newly bound, so no INT64_MAX here)
    if (next[name] + d < 0) return;
    next[name] += d;
  }
  try {
    build_plan(next);
  } catch (...) {
    drop_plan();
  }
}

std::unordered_map<int64_t, DeviceArray> Runtime::run(const std::unordered_map<int64_t, DeviceArray>& inputs,
                                                      const Bindings& dims, const std::vector<int64_t>& donated,
                                                      bool wait) {
  set_context();
  for (auto& [id, a] : inputs) inputs_[id] = a;
  // LUMINAL_PROFILE=1: synchronise after every step and print the time per op kind (and planning) to stderr.
  const bool profile = std::getenv("LUMINAL_PROFILE") != nullptr;  // read per run: cheap, and may change
  using clock = std::chrono::steady_clock;
  std::map<std::string, std::pair<double, int>> prof;
  auto t_run = clock::now();
  try {
    if (!plan_ || plan_->dims != dims) build_plan(dims);
    upload_plan();
  } catch (...) {
    drop_plan();  // half updated: the next run plans from scratch
    throw;
  }
  std::shared_ptr<Plan> keep = plan_;  // (planning ahead may drop plan_ before this run ends)
  auto secs = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  auto t_planned = clock::now();
  times_ = {secs(t_run, t_planned), 0, 0, 0};
  if (profile) prof["(plan)"] = {times_[0], 1};
  // CUDA graphs (LUMINAL_CUDA_GRAPHS=0 turns them off), unless profiling (which times each kernel) or a step runs on
  // the host.
  graphs_on_ = !profile && !has_host_steps_ && !env_zero("LUMINAL_CUDA_GRAPHS");
  one_graph_ = env_zero("LUMINAL_CUDA_GRAPH_CHUNKS");  // one graph for the whole run
  pdl_ = graphs_on_ && device().major >= 9 && driver().cuGraphAddDependencies && !env_zero("LUMINAL_CUDA_PDL");
  npending_ = launched_ = nchunk_ = 0;
  const Plan& plan = *plan_;
  std::vector<CUdeviceptr>& ptr = ptr_;
  ptr.assign(g_.size(), 0);
  std::vector<char>& done = done_;
  done.assign(s_.steps.size(), 0);
  std::unordered_map<int64_t, DeviceArray>& owned = owned_;
  owned.clear();
  std::unordered_map<int64_t, DeviceArray> results;
  auto array_of = [&](int64_t src) -> const DeviceArray& {
    auto o = owned.find(src);
    if (o != owned.end()) return o->second;
    auto in = inputs_.find(src);
    if (in != inputs_.end()) return in->second;
    return constants_.at(src);
  };
  // Whether step i (a Scatter) writes its rows into its destination, a donated input.
  auto in_place_of = [&](size_t i) {
    const Node& n = g_.node(s_.steps[i].node);
    return in_place_ok_[i] && std::find(donated.begin(), donated.end(), n.inputs[0].node) != donated.end();
  };
  for (size_t i = 0; i < s_.steps.size(); ++i) {
    const Step& st = s_.steps[i];
    const Node& n = g_.node(st.node);
    int64_t id = st.node;
    auto t_step = clock::now();
    auto out_of = [&](int64_t node) -> CUdeviceptr {
      if (plan.offset[node] >= 0) return arena_->ptr + plan.offset[node];
      DeviceArray a;
      a.dtype = s_.storage[node];
      a.shape = plan.shapes[node];
      a.buf = device_alloc(a.nbytes());
      owned[node] = a;
      return a.buf->ptr;
    };
    auto out_ptr = [&]() { return out_of(id); };
    switch (st.kind) {
      case Step::Input: {
        auto it = inputs_.find(id);
        if (it == inputs_.end())
          throw std::invalid_argument("input '" + n.name + "' (node " + std::to_string(id) + ") has no data: call set() on it");
        if (it->second.shape != plan.shapes[id] || it->second.dtype != s_.storage[id])
          throw std::invalid_argument("input '" + n.name + "' holds data of the wrong shape or dtype");
        ptr[id] = it->second.buf->ptr;
        break;
      }
      case Step::Constant:
        ptr[id] = constants_.at(id).buf->ptr;
        break;
      case Step::Iota: {
        auto c = constants_.find(id);
        if (c != constants_.end()) {
          ptr[id] = c->second.buf->ptr;
          break;
        }
        auto off = plan.iota_off.find(id);
        if (off != plan.iota_off.end()) {
          ptr[id] = iota_->ptr + off->second;
          break;
        }
        ptr[id] = out_ptr();
        auto& host = plan.iota.at(id);
        if (!host.empty()) check(driver().cuMemcpyHtoD(ptr[id], host.data(), host.size()), "cuMemcpyHtoD", "Iota");
        break;
      }
      case Step::Alias: {
        int64_t src = n.inputs[0].node;
        DeviceArray a = array_of(src);
        a.shape = plan.shapes[id];
        results[id] = convert(a, n.dtype);  // an input kept in the compute dtype is read back in its own
        break;
      }
      case Step::Kernel: {
        if (done[i] || absorbed_[i]) break;  // computed by its group's kernel, or in a Scatter's row writes
        if (st.group >= 0 && launch_group(s_.groups[size_t(st.group)], out_of, in_place_of, done)) break;
        if (plan.variant[i] == 5) {  // an identity copy: its input's buffer is the result
          ptr[id] = ptr[n.inputs[0].node];
          break;
        }
        bool in_place = in_place_of(i);
        if (in_place) write_into_dest(i);
        else ptr[id] = out_ptr();
        std::vector<CUdeviceptr>& ptrs = scratch_ptrs_;
        ptrs.assign(1, ptr[id]);
        for (auto& e : n.inputs) ptrs.push_back(ptr[e.node]);
        add_producer(i, ptrs);  // (the copy kernel before the rows takes only its own arguments: the rest are unread)
        bool per_row = st.launch == Step::PerRow;
        if (plan.variant[i] == 4) launch(st.block_fn, id, plan.slot[i], plan.items[i], false, ptrs, plan.grid[i].data(), plan.threads[i]);
        else if (plan.variant[i] == 3) launch(st.mma_fn, id, plan.slot[i], plan.items[i], false, ptrs, plan.grid[i].data(), 128);
        else if (plan.variant[i] == 2) launch(st.gemm_fn, id, plan.slot[i], plan.items[i], false, ptrs, plan.grid[i].data());
        else if (!in_place) launch(plan.variant[i] == 1 ? st.gemv_fn : st.fn, id, plan.slot[i], plan.items[i], per_row, ptrs);
        if (!st.second_fn.empty()) launch(st.second_fn, id, plan.slot[i], plan.items2[i], false, ptrs);
        break;
      }
      case Step::Host: {
        // A user's op with only a CPU kernel, compiled with the host fallback: inputs come to the host, the result
        // goes back.
        const CustomKernel* k = &op_as<HostOp>(n)->kernel();
        std::vector<Buffer> host;
        host.reserve(n.inputs.size());
        for (auto& e : n.inputs) {
          Buffer b = Buffer::alloc(s_.storage[e.node], plan.shapes[e.node]);
          int64_t cnt = b.numel();
          if (g_.node(e.node).op == Op::Constant) cnt = 1;
          if (cnt) check(driver().cuMemcpyDtoH(b.data.get(), ptr[e.node], size_t(cnt) * dtype_size(b.dtype)), "cuMemcpyDtoH");
          DType want = g_.node(e.node).dtype;
          if (b.dtype != want) {
            Buffer c = Buffer::alloc(want, b.shape);
            for (int64_t j = 0; j < b.numel(); ++j) store_from_double(c.data.get(), j, want, load_as_double(b.data.get(), j, b.dtype));
            b = c;
          }
          host.push_back(b);
        }
        std::vector<KernelArg> args;
        for (size_t k2 = 0; k2 < n.inputs.size(); ++k2) args.push_back(KernelArg{&host[k2], ConcreteView(n.inputs[k2].view, dims)});
        Buffer r = Buffer::alloc(n.dtype, plan.shapes[id]);
        (*k)(args, n, r);
        ptr[id] = out_ptr();
        if (r.nbytes()) check(driver().cuMemcpyHtoD(ptr[id], r.data.get(), r.nbytes()), "cuMemcpyHtoD", op_label(n));
        break;
      }
    }
    if (n.op == Op::Output && st.kind == Step::Kernel) results[id] = owned.at(id);
    if (profile && st.kind != Step::Input && st.kind != Step::Constant && st.kind != Step::Alias) {
      check(driver().cuCtxSynchronize(), "cuCtxSynchronize", op_label(n));
      std::string key = op_label(n);
      const char* variants[] = {"", "/gemv", "/tiled", "/mma", "/block", "/skipped"};
      if (st.kind == Step::Kernel) key += variants[plan.variant[i]];
      auto& e = prof[key];
      e.first += std::chrono::duration<double>(clock::now() - t_step).count();
      e.second += 1;
    }
  }
  if (profile) {
    for (auto& [k, v] : prof) std::fprintf(stderr, "%-16s %5d steps %9.3f ms\n", k.c_str(), v.second, v.first * 1e3);
    std::fprintf(stderr, "%-16s %5zu steps %9.3f ms\n", "(run)", s_.steps.size(),
                 std::chrono::duration<double>(clock::now() - t_run).count() * 1e3);
  }
  auto t_recorded = clock::now();
  if (graphs_on_ && npending_) replay(npending_);  // the last chunk
  auto t_replayed = clock::now();
  if (graphs_on_ && !env_zero("LUMINAL_CUDA_PLAN_AHEAD")) plan_ahead(dims);  // while the GPU runs what was launched
  // The run's fence: its error word comes to the host behind its last kernel, then the event. Every array the run
  // wrote carries it (below), so reading one waits for this run only; a failed device-side check (padded view,
  // gather or scatter index) raises then, naming the node.
  std::shared_ptr<Fence> fence = new_fence();
  fence->err_word = err_->ptr;
  fence->labels = labels_;
  check(driver().cuMemcpyDtoHAsync(fence->err, err_->ptr, sizeof(int), nullptr), "cuMemcpyDtoHAsync", "error word");
  check(driver().cuEventRecord(fence->event, nullptr), "cuEventRecord");
  for (auto& [id, a] : owned)
    if (a.buf) a.buf->fence = fence;
  times_[1] = secs(t_planned, t_recorded);
  times_[2] = secs(t_recorded, t_replayed);
  if (wait) fence->wait();
  times_[3] = secs(t_replayed, clock::now());
  // The results that are a donated input's own array (sorted buffer addresses: ~65 lookups per decode step).
  in_place_outputs_.clear();
  if (!donated.empty()) {
    std::vector<const DeviceBuffer*> bufs;
    for (int64_t d : donated) {
      auto in = inputs_.find(d);
      if (in != inputs_.end() && in->second.buf) bufs.push_back(in->second.buf.get());
    }
    std::sort(bufs.begin(), bufs.end());
    for (auto& [id, a] : results)
      if (a.buf && std::binary_search(bufs.begin(), bufs.end(), a.buf.get())) in_place_outputs_.push_back(id);
  }
  owned.clear();  // (holding them would delay their buffers' reuse)
  return results;
}

}  // namespace cuda
}  // namespace luminal
