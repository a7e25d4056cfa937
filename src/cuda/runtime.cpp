#include "cuda/runtime.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

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
  static size_t size_class(size_t bytes) {
    size_t b = std::max<size_t>(bytes, 256);
    size_t top = size_t(1) << (63 - __builtin_clzll(b));
    size_t step = std::max<size_t>(top / 8, 256);
    return (b + step - 1) / step * step;
  }
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

ConcreteView permuted(const ConcreteView& v, const std::vector<int>& perm) {
  if (perm.empty()) return v;
  ConcreteView p = v;
  for (size_t d = 0; d < perm.size(); ++d) {
    p.shape[d] = v.shape[perm[d]];
    p.strides[d] = v.strides[perm[d]];
    if (v.masked) {
      p.lo[d] = v.lo[perm[d]];
      p.hi[d] = v.hi[perm[d]];
    }
  }
  return p;
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

unsigned grid_for(int64_t threads_needed) {
  int64_t cap = int64_t(device().sms) * 32;
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((threads_needed + 255) / 256, cap)));
}

}  // namespace

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

void download(const DeviceArray& a, void* host) {
  set_context();
  if (a.nbytes()) check(driver().cuMemcpyDtoH(host, a.buf->ptr, a.nbytes()), "cuMemcpyDtoH");
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

struct Runtime::Plan {
  Bindings dims;
  std::vector<std::vector<int64_t>> shapes;  // per node id
  std::vector<int64_t> params;              // the parameter block
  std::vector<size_t> slot;                 // per step: its first slot in the block
  std::vector<int64_t> offset;              // per node: arena offset, or -1 (own allocation / not a buffer)
  std::vector<char> fresh;                  // per node: a new allocation per run (outputs and what they alias)
  size_t arena_bytes = 0;
  std::unordered_map<int64_t, std::vector<uint8_t>> iota;  // host values of Iota nodes
  std::vector<int64_t> items;               // per step: work items (elements, rows, blocks)
  std::vector<int64_t> items2;              // per step: Scatter's second kernel
};

Runtime::Runtime(const Graph& g, Schedule s) : g_(g), s_(std::move(s)) {
  const Device& dev = device();
  set_context();
  std::string cubin = compile_cubin(s_.source, dev.major * 10 + dev.minor);
  check(driver().cuModuleLoadData(&module_, cubin.data()), "cuModuleLoadData");
  for (auto& st : s_.steps) {
    for (const std::string* name : {&st.fn, &st.second_fn}) {
      if (name->empty() || fns_.count(*name)) continue;
      CUfunction f;
      check(driver().cuModuleGetFunction(&f, module_, name->c_str()), "cuModuleGetFunction", *name);
      fns_[*name] = f;
    }
    if (st.kind == Step::Constant) {
      const Node& n = g_.node(st.node);
      uint64_t v = 0;
      store_from_double(&v, 0, n.dtype, n.value);
      constants_[st.node] = upload(&v, n.dtype, {});
    }
  }
  err_ = device_alloc(sizeof(int));
  check(driver().cuMemsetD8(err_->ptr, 0, sizeof(int)), "cuMemsetD8");
}

void Runtime::build_plan(const Bindings& dims) {
  auto plan = std::make_shared<Plan>();
  plan->dims = dims;
  size_t nn = g_.size();
  plan->shapes.assign(nn, {});
  plan->offset.assign(nn, -1);
  plan->fresh.assign(nn, 0);
  std::vector<int64_t> last_use(nn, -1);
  for (size_t i = 0; i < s_.steps.size(); ++i) {
    const Step& st = s_.steps[i];
    const Node& n = g_.node(st.node);
    for (auto& e : n.shape) {
      int64_t v = e.eval(dims);
      if (v < 0) throw std::invalid_argument("dimension " + e.str() + " evaluates to a negative size " + std::to_string(v));
      plan->shapes[st.node].push_back(v);
    }
    for (auto& e : n.inputs) last_use[e.node] = int64_t(i);
    if (n.op == Op::Output) {
      plan->fresh[st.node] = 1;
      if (st.kind == Step::Alias) plan->fresh[n.inputs[0].node] = 1;
    }
  }
  // Parameters: every view each kernel reads, evaluated under these dims, checked against its buffer.
  for (size_t i = 0; i < s_.steps.size(); ++i) {
    const Step& st = s_.steps[i];
    const Node& n = g_.node(st.node);
    plan->slot.push_back(plan->params.size());
    plan->items.push_back(0);
    plan->items2.push_back(0);
    if (st.kind == Step::Iota) {
      int64_t len = plan->shapes[st.node][0];
      std::vector<uint8_t> host(size_t(len) * dtype_size(n.dtype));
      Bindings b = dims;
      for (int64_t z = 0; z < len; ++z) {
        b["z"] = z;
        store_from_double(host.data(), z, n.dtype, double(n.expr.eval(b)));
      }
      plan->iota[st.node] = std::move(host);
    }
    if (st.kind != Step::Kernel) continue;
    std::vector<int64_t> p(st.nparams, 0);
    p[0] = st.node;
    std::vector<ConcreteView> cv;
    for (auto& vs : st.views) {
      const Edge& e = n.inputs[vs.edge];
      ConcreteView v = permuted(ConcreteView(e.view, dims), vs.perm);
      int64_t size = 1;
      for (auto d : plan->shapes[e.node]) size *= d;
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
          throw std::out_of_range(std::string(n.op == Op::Custom ? n.name.c_str() : op_name(n.op)) + " (node " +
                                  std::to_string(st.node) + "): a view reads element " + std::to_string(lo < 0 ? lo : hi) +
                                  " of a buffer of " + std::to_string(size) + " elements");
      }
      cv.push_back(v);
    }
    int64_t out_n = numel_of(plan->shapes[st.node]);
    if (st.block_bytes && n.name.compare(0, 7, "QMatMul") == 0) {
      const ConcreteView &a = cv[0], &w = cv[1];
      size_t r = a.shape.size();
      int64_t K = a.shape[r - 1], N = a.shape[r - 2];
      if (a.strides[r - 1] != 1 || w.shape.size() != 2 || w.strides[1] != 1 || K % 32 ||
          w.shape[1] != K / 32 * st.block_bytes || w.shape[0] != N || w.masked)
        throw std::invalid_argument(n.name + ": expects contiguous activation rows and uint8 weight rows of whole blocks");
      p[2] = K;
      p[3] = N;
      plan->items.back() = out_n;
    } else if (st.block_bytes) {
      const ConcreteView& w = cv[0];
      int64_t bytes = w.shape.back();
      if (w.strides.back() != 1 || bytes % st.block_bytes)
        throw std::invalid_argument(n.name + ": expects uint8 rows of whole blocks");
      p[2] = bytes / st.block_bytes * 32;
      plan->items.back() = p[2] ? out_n / 32 : 0;
    } else if (st.program && st.program->reduce != Op::Input) {
      p[2] = cv[0].shape.back();
      plan->items.back() = out_n;
    } else {
      plan->items.back() = out_n;
    }
    if (!st.second_fn.empty()) {  // Scatter: rows of the index
      int64_t row = out_n / std::max<int64_t>(1, plan->shapes[st.node].empty() ? 1 : plan->shapes[st.node][0]);
      if (!plan->shapes[st.node].empty() && plan->shapes[st.node][0] == 0) row = 0;
      p[3] = row;
      p[2] = numel_of(cv[1].shape) * row;
      plan->items2.back() = p[2];
    }
    p[1] = plan->items.back();
    plan->params.insert(plan->params.end(), p.begin(), p.end());
  }
  // The arena: each intermediate gets an offset no buffer alive at the same time overlaps (first fit).
  struct Live { size_t off, bytes; int64_t until; };
  std::vector<Live> live;
  for (size_t i = 0; i < s_.steps.size(); ++i) {
    const Step& st = s_.steps[i];
    live.erase(std::remove_if(live.begin(), live.end(), [&](const Live& l) { return l.until < int64_t(i); }), live.end());
    bool buffer = st.kind == Step::Kernel || st.kind == Step::Iota || st.kind == Step::Host;
    if (!buffer || plan->fresh[st.node]) continue;
    size_t bytes = (size_t(numel_of(plan->shapes[st.node])) * dtype_size(s_.storage[st.node]) + 255) / 256 * 256;
    std::sort(live.begin(), live.end(), [](const Live& a, const Live& b) { return a.off < b.off; });
    size_t off = 0;
    for (auto& l : live) {
      if (off + bytes <= l.off) break;
      off = std::max(off, l.off + l.bytes);
    }
    plan->offset[st.node] = int64_t(off);
    plan->arena_bytes = std::max(plan->arena_bytes, off + bytes);
    live.push_back({off, bytes, std::max<int64_t>(last_use[st.node], int64_t(i))});
  }
  size_t pbytes = std::max<size_t>(plan->params.size(), 1) * sizeof(int64_t);
  if (!params_ || params_->bytes < pbytes) params_ = device_alloc(pbytes);
  if (!plan->params.empty())
    check(driver().cuMemcpyHtoD(params_->ptr, plan->params.data(), plan->params.size() * sizeof(int64_t)), "cuMemcpyHtoD");
  if (!arena_ || arena_->bytes < plan->arena_bytes) {
    arena_.reset();
    arena_ = device_alloc(std::max<size_t>(plan->arena_bytes, 256));
  }
  plan_ = plan;
}

void Runtime::launch(const std::string& fn, int64_t node, size_t slot, int64_t items, bool per_row,
                     const std::vector<CUdeviceptr>& ptrs) {
  if (items <= 0) return;
  CUdeviceptr p = params_->ptr + slot * sizeof(int64_t), e = err_->ptr;
  std::vector<void*> args = {&p, &e};
  std::vector<CUdeviceptr> copy = ptrs;
  for (auto& x : copy) args.push_back(&x);
  unsigned grid = grid_for(per_row ? items * 32 : items);
  const Node& n = g_.node(node);
  std::string what = fn + " for node " + std::to_string(node) + " (" + (n.op == Op::Custom ? n.name : op_name(n.op)) + ")";
  check(driver().cuLaunchKernel(fns_.at(fn), grid, 1, 1, 256, 1, 1, 0, nullptr, args.data(), nullptr), "cuLaunchKernel",
        what);
}

std::unordered_map<int64_t, DeviceArray> Runtime::run(const std::unordered_map<int64_t, DeviceArray>& inputs,
                                                      const Bindings& dims) {
  set_context();
  if (!plan_ || plan_->dims != dims) build_plan(dims);
  const Plan& plan = *plan_;
  std::unordered_map<int64_t, CUdeviceptr> ptr;
  std::unordered_map<int64_t, DeviceArray> owned;  // fresh allocations, inputs and constants
  std::unordered_map<int64_t, DeviceArray> results;
  for (size_t i = 0; i < s_.steps.size(); ++i) {
    const Step& st = s_.steps[i];
    const Node& n = g_.node(st.node);
    int64_t id = st.node;
    auto out_ptr = [&]() -> CUdeviceptr {
      if (plan.offset[id] >= 0) return arena_->ptr + plan.offset[id];
      DeviceArray a;
      a.dtype = s_.storage[id];
      a.shape = plan.shapes[id];
      a.buf = device_alloc(a.nbytes());
      owned[id] = a;
      return a.buf->ptr;
    };
    switch (st.kind) {
      case Step::Input: {
        auto it = inputs.find(id);
        if (it == inputs.end())
          throw std::invalid_argument("input '" + n.name + "' (node " + std::to_string(id) + ") has no data: call set() on it");
        if (it->second.shape != plan.shapes[id] || it->second.dtype != s_.storage[id])
          throw std::invalid_argument("input '" + n.name + "' holds data of the wrong shape or dtype");
        owned[id] = it->second;
        ptr[id] = it->second.buf->ptr;
        break;
      }
      case Step::Constant:
        owned[id] = constants_.at(id);
        ptr[id] = owned[id].buf->ptr;
        break;
      case Step::Iota: {
        ptr[id] = out_ptr();
        auto& host = plan.iota.at(id);
        if (!host.empty()) check(driver().cuMemcpyHtoD(ptr[id], host.data(), host.size()), "cuMemcpyHtoD", "Iota");
        break;
      }
      case Step::Alias: {
        int64_t src = n.inputs[0].node;
        DeviceArray a = owned.at(src);
        a.shape = plan.shapes[id];
        results[id] = convert(a, n.dtype);  // an input kept in the compute dtype is read back in its own
        break;
      }
      case Step::Kernel: {
        ptr[id] = out_ptr();
        std::vector<CUdeviceptr> ptrs = {ptr[id]};
        for (auto& e : n.inputs) ptrs.push_back(ptr.at(e.node));
        bool per_row = st.launch == Step::PerRow;
        launch(st.fn, id, plan.slot[i], plan.items[i], per_row, ptrs);
        if (!st.second_fn.empty()) launch(st.second_fn, id, plan.slot[i], plan.items2[i], false, ptrs);
        break;
      }
      case Step::Host: {
        // An op with only a CPU kernel (a Python custom op): inputs come to the host, the result goes back.
        const CustomKernel* k = g_.kernel(n.name);
        if (!k) throw std::runtime_error("custom op '" + n.name + "' has no CUDA kernel and no CPU kernel registered");
        std::vector<Buffer> host;
        host.reserve(n.inputs.size());
        for (auto& e : n.inputs) {
          Buffer b = Buffer::alloc(s_.storage[e.node], plan.shapes[e.node]);
          int64_t cnt = b.numel();
          if (g_.node(e.node).op == Op::Constant) cnt = 1;
          if (cnt) check(driver().cuMemcpyDtoH(b.data.get(), ptr.at(e.node), size_t(cnt) * dtype_size(b.dtype)), "cuMemcpyDtoH");
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
        Buffer r = (*k)(args, n);
        if (r.dtype != n.dtype || r.shape != plan.shapes[id])
          throw std::runtime_error("custom op '" + n.name + "' returned a result of the wrong shape or dtype");
        ptr[id] = out_ptr();
        if (r.nbytes()) check(driver().cuMemcpyHtoD(ptr[id], r.data.get(), r.nbytes()), "cuMemcpyHtoD", n.name);
        break;
      }
    }
    if (n.op == Op::Output && st.kind == Step::Kernel) results[id] = owned.at(id);
  }
  // A failed device-side check (padded view, gather or scatter index) raises here, naming the node.
  int code = 0;
  check(driver().cuMemcpyDtoH(&code, err_->ptr, sizeof code), "cuMemcpyDtoH", "error flag");
  if (code) {
    check(driver().cuMemsetD8(err_->ptr, 0, sizeof(int)), "cuMemsetD8");
    int64_t node = code / 4;
    const Node& n = g_.node(node);
    std::string op = n.op == Op::Custom ? n.name : op_name(n.op);
    const char* what[] = {"", "a padded view reads outside its buffer", "an index is out of range for the table's rows",
                          "an index is out of range for the destination's rows"};
    throw std::out_of_range(op + " (node " + std::to_string(node) + "): " + what[code % 4]);
  }
  return results;
}

}  // namespace cuda
}  // namespace luminal
