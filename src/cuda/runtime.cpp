#include "cuda/runtime.h"
#include "cuda/q8_layout.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>

#include "core/lower/ops.h"
#include "core/plan.h"
#include "core/reference.h"
#include "cuda/contraction.h"

namespace luminal {
namespace cuda {
namespace {
// An Iota's `len` values under `dims`, through the reference semantics (one definition of what an Iota holds).
Buffer iota_values(const Node& n, int64_t len, const Bindings& dims) {
  Buffer b = Buffer::alloc(n.dtype, {len});
  run_primop(n, {}, dims, b);
  return b;
}

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

// Our GEMM variants, in the order the printer lists them (see timed()).
constexpr Variant::Kind kOurGemms[] = {Variant::Wgmma256, Variant::Wgmma128, Variant::Gemm128, Variant::Gemm64,
                                       Variant::QGemm};

// LUMINAL_CUDA_GEMM=cublas|own|<variant>: the matrix products forced onto cuBLASLt (where it applies), onto our
// kernels, or onto one of our GEMM variants by its name (variant_name: where it applies, else the first that does);
// "" when chosen by timing (see Runtime::choose).
std::string gemm_forced() {
  const char* v = std::getenv("LUMINAL_CUDA_GEMM");
  if (!v || !*v) return "";
  std::string s(v), ours;
  if (s == "cublas" || s == "own") return s;
  for (Variant::Kind k : kOurGemms) {
    if (s == variant_name(k)) return s;
    ours += std::string(", ") + variant_name(k);
  }
  throw std::invalid_argument("LUMINAL_CUDA_GEMM must be 'cublas', 'own' or one of our GEMM variants (" +
                              ours.substr(2) + "), got '" + s + "'");
}

// The GEMM variants, timed against each other when several apply (each is a launch with no side effect but its
// output: see Runtime::choose).
bool timed(Variant::Kind k) {
  return k == Variant::Blas || std::find(std::begin(kOurGemms), std::end(kOurGemms), k) != std::end(kOurGemms);
}

// Whether LUMINAL_CUDA_GEMM forces our kernels (cuBLASLt then never applies).
bool ours_forced() {
  std::string f = gemm_forced();
  return !f.empty() && f != "cublas";
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

CUstream nonblocking_stream() {
  CUstream st = nullptr;
  check(driver().cuStreamCreate(&st, 1 /* CU_STREAM_NON_BLOCKING */), "cuStreamCreate");
  return st;
}

// Reads of a finished run's results go through this stream: it does not wait for the runs queued after it, as the
// default stream would (a non-blocking stream does not synchronise with the legacy default stream).
CUstream read_stream() {
  static CUstream s = nonblocking_stream();
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
  if (ptr && !owner) pool().give_back(ptr, bytes);
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
// (read_bytes: the first `n` bytes of a buffer, as download reads them.)
namespace {
void read_bytes(const DeviceBuffer& b, size_t n, void* host) {
  std::shared_ptr<Fence> fence = b.fence;
  if (fence) fence->wait();
  CUstream stream = fence ? read_stream() : nullptr;
  const Driver& d = driver();
  if (n > (size_t(16) << 20)) {
    check(d.cuMemcpyDtoHAsync(host, b.ptr, n, stream), "cuMemcpyDtoHAsync");
    check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
    return;
  }
  static std::mutex mu;
  static void* staging = nullptr;  // kept for the process (freeing page-locked memory may synchronise)
  static size_t staging_bytes = 0;
  std::lock_guard<std::mutex> l(mu);
  reserve_pinned(staging, staging_bytes, n, size_t(64) << 10);
  check(d.cuMemcpyDtoHAsync(staging, b.ptr, n, stream), "cuMemcpyDtoHAsync");
  check(d.cuStreamSynchronize(stream), "cuStreamSynchronize");
  std::memcpy(host, staging, n);
}
}  // namespace

void download(const DeviceArray& a, void* host) {
  set_context();
  size_t n = a.nbytes();
  if (!n) return;
  if (!a.buf->q8_split_k) return read_bytes(*a.buf, n, host);
  std::vector<uint8_t> split(n);  // (Q8_0 weights a graph holds split: read back as given, GGUF blocks)
  read_bytes(*a.buf, n, split.data());
  q8_join_host(split.data(), static_cast<uint8_t*>(host), a.buf->q8_split_rows, a.buf->q8_split_k);
}

DeviceArray convert(const DeviceArray& a, DType to) {
  if (a.dtype == to) return a;
  if (a.buf && a.buf->q8_split_k)
    throw std::invalid_argument("this uint8 array holds Q8_0 weights that a compiled graph reads rearranged on the "
                                "GPU; read it back with numpy() to convert it");
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

Runtime::Runtime(const Graph& g, Module s) : g_(g), s_(std::move(s)), plan_(g_, s_.sched) {
  const Device& dev = device();
  sms_ = dev.sms;
  hopper_ = dev.major == 9 && dev.minor == 0;
  set_context();
  std::string cubin = compile_cubin(s_.source, dev.major * 10 + dev.minor);
  check(driver().cuModuleLoadData(&module_, cubin.data()), "cuModuleLoadData");
  auto load = [&](const std::string& name) {
    if (name.empty() || fns_.count(name)) return;
    CUfunction f;
    check(driver().cuModuleGetFunction(&f, module_, name.c_str()), "cuModuleGetFunction", name);
    fns_[name] = f;
  };
  size_t ns = s_.steps.size(), nparams = 0;
  for (size_t i = 0; i < ns; ++i) {
    const luminal::Step& cs = core(i);
    const Node& n = g_.node(cs.node);
    for (const Variant& v : s_.steps[i].variants) {
      load(v.fn);
      // (8: CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES; over 48 KB needs it)
      if (v.kind == Variant::Gemm128 || v.kind == Variant::Gemm64 || is_wgmma(v.kind) ||
          (is_flash_tiles(v.kind) && v.smem))
        check(driver().cuFuncSetAttribute(fns_[v.fn], 8, v.smem), "cuFuncSetAttribute", v.fn);
    }
    load(s_.steps[i].rows_fn);
    load(s_.steps[i].combine_fn);
    load(s_.steps[i].prep_fn);
    L_.slot.push_back(nparams);
    if (cs.kind == luminal::Step::Kernel) nparams += size_t(s_.steps[i].nparams);
    if (cs.kind == luminal::Step::Constant) {
      uint64_t v = 0;
      store_from_double(&v, 0, n.dtype, n.value);
      constants_[cs.node] = upload(&v, n.dtype, {});
    }
    // An Iota that depends on no dim (an argmax's index row) is computed and uploaded once, like a constant (in the
    // plan's Iota block, the 128256 indices of a vocabulary were sent again with every plan).
    if (cs.kind == luminal::Step::Iota && plan_.dim_free(i)) {
      int64_t len = n.shape[0].as_const();
      Buffer b = iota_values(n, len, {});
      constants_[cs.node] = upload(b.data.get(), n.dtype, {len});
    }
    has_host_steps_ = has_host_steps_ || cs.kind == luminal::Step::Host;
  }
  for (const std::string& fn : s_.group_fns) load(fn);
  L_.params.assign(nparams, 0);
  L_.items.assign(ns, 0);
  L_.rows_items.assign(ns, 0);
  L_.prep_items.assign(ns, 0);
  L_.summary_rows.assign(ns, 0);
  L_.summary_off.assign(ns, 0);
  L_.variant.assign(ns, 0);
  L_.grid.assign(ns, {1, 1, 1});
  L_.threads.assign(ns, 256);
  L_.extra.assign(ns, 0);
  L_.cands.assign(ns, {});
  L_.blas.assign(ns, {});
  L_.maps.assign(ns, {});
  auto labels = std::make_shared<std::vector<std::string>>(g_.size());
  for (int64_t id = 0; id < int64_t(g_.size()); ++id) (*labels)[size_t(id)] = op_label(g_.node(id));
  labels_ = labels;
  err_ = device_alloc(sizeof(int));
  check(driver().cuMemsetD8(err_->ptr, 0, sizeof(int)), "cuMemsetD8");
}

std::vector<int64_t> Runtime::in_place_inputs() const {
  std::vector<int64_t> out;
  for (size_t i = 0; i < s_.steps.size(); ++i)
    if (plan_.may_write_in_place(i)) out.push_back(g_.node(core(i).node).inputs[0].node);
  return out;
}

namespace {
// A product's rows that share its weights (views [batch..., M, N, K]): M, times the batch axes b does not move along
// (a Linear over [batch, 1, features], batched decode, is one product of batch rows for cuBLASLt).
int64_t weight_rows(const ConcreteView& a, const ConcreteView& b) {
  size_t r = a.shape.size();
  int64_t rows = a.shape[r - 3];
  for (size_t d = 0; d + 3 < r; ++d) {
    if (b.strides[d] != 0 && a.shape[d] != 1) return a.shape[r - 3];
    rows *= a.shape[d];
  }
  return rows;
}
// Rows from which the GEMM variants apply: 2 (batched decode), where up to kFewRows - 1 rows they are timed against
// the matrix-vector kernel, which reads the weights once per row. A single row (decode) keeps the matrix-vector
// kernel, never timed. LUMINAL_CUDA_GEMM_MIN_ROWS: another least number of rows (16: as before batched decode; for
// comparison), read when a product is planned.
constexpr int64_t kFewRows = 16;
int64_t gemm_min_rows() {
  const char* e = std::getenv("LUMINAL_CUDA_GEMM_MIN_ROWS");
  return e && std::atoll(e) > 1 ? int64_t(std::atoll(e)) : int64_t(2);
}

// Rows of k contiguous and every row start 8-element (16-byte or more) aligned (buffers are 256-byte aligned).
bool rows_aligned(const ConcreteView& a, const ConcreteView& b) {
  size_t r = a.shape.size();
  bool aligned = a.shape[r - 1] % 8 == 0 && a.strides[r - 1] == 1 && b.strides[r - 1] == 1 && a.offset % 8 == 0 &&
                 b.offset % 8 == 0;
  for (size_t d = 0; d + 1 < r; ++d)
    if (a.strides[d] % 8 || b.strides[d] % 8) aligned = false;
  return aligned;
}

// Operand `v` (in the GEMM's axis order: batch..., M, N, K) as a tensor map describes it, its rows along axis
// `rows`: false where no map can (rows of k contiguous and 16-byte aligned, see rows_aligned; its batch axes one
// run of `batch` matrices, not broadcast over them).
bool tma_side(const ConcreteView& v, size_t rows, int64_t batch, GemmMaps::Side* s) {
  size_t r = v.shape.size();
  int64_t n = 1, first = 0, want = 0;
  for (size_t d = r - 3; d-- > 0;) {  // (the batch axes, innermost first)
    if (v.shape[d] == 1) continue;
    if (n == 1) first = want = v.strides[d];
    else if (v.strides[d] != want) return false;
    want *= v.shape[d];
    n *= v.shape[d];
  }
  int64_t rs = v.strides[rows];
  if (n != batch || rs <= 0 || (batch > 1 && first <= 0)) return false;
  int64_t bs = batch > 1 ? first : rs * v.shape[rows];  // (one matrix: any stride a map takes)
  if (std::max(rs, bs) * 2 >= (int64_t(1) << 40)) return false;
  *s = {{(unsigned long long)v.shape[r - 1], (unsigned long long)v.shape[rows], (unsigned long long)batch},
        {(unsigned long long)rs * 2, (unsigned long long)bs * 2}, v.offset};
  return true;
}
}  // namespace

std::unordered_map<int64_t, std::string> Runtime::last_variants() const {
  std::unordered_map<int64_t, std::string> out;
  for (size_t i = 0; i < L_.variant.size() && i < s_.steps.size(); ++i)
    if (core(i).kind == luminal::Step::Kernel && L_.variant[i] < s_.steps[i].variants.size())
      out[core(i).node] = variant_name(s_.steps[i].variants[L_.variant[i]].kind);
  return out;
}

// Whether variant `v` of a step runs the views `cv` (in the kernel's axis order) of an output of `out_n` elements,
// and its launch when it does (an explicit grid, the parameter slice's flags).
bool Runtime::applies(const Variant& v, const std::vector<ConcreteView>& cv, int64_t out_n, int64_t* p, size_t i) {
  switch (v.kind) {
    case Variant::Elements: case Variant::Warps: return true;
    case Variant::BlockPerRow:
      if (core(i).program->has_row_reductions()) {
        // Threads: about a quarter of the row, so each thread has ~4 elements per pass, all loads in flight at
        // once (the passes are unrolled by 4); a decode step's RMSNorm over 4096 was latency-bound at 16 per thread.
        unsigned t = 32;
        while (t < 1024 && int64_t(t) * 4 < p[2]) t *= 2;
        // Many rows (prefill): at most 256 threads, so that 8 rows a multiprocessor are in flight, not 2 (a row's
        // passes and block reductions are a chain of latencies).
        if (L_.items[i] >= 4 * int64_t(sms_)) t = std::min(t, 256u);
        L_.threads[i] = t;
        L_.grid[i] = {unsigned(std::max<int64_t>(1, std::min<int64_t>(L_.items[i], int64_t(sms_) * 16))), 1, 1};
        return true;
      }
      // A plain reduction: few long rows keep the machine busy with a block each (a warp per row uses a few SMs).
      if (out_n == 0 || out_n >= int64_t(sms_) * 8 || p[2] < 512) return false;
      L_.grid[i] = {unsigned(std::min<int64_t>(out_n, int64_t(sms_) * 16)), 1, 1};
      return true;
    case Variant::MatVec: return out_n != 0 && rows_aligned(cv[0], cv[1]);
    case Variant::Flash: case Variant::FlashMma: case Variant::FlashMmaSkip: case Variant::FlashWgmma:
    case Variant::FlashDecode: case Variant::FlashDecodeMma: {
      // q read once per row (broadcast over the keys); a tile of rows shares k and v: consecutive rows along the
      // trailing row axes over which neither moves (the query rows of one head, and the query heads of a KV head).
      const ConcreteView &q = cv[0], &k = cv[1], &vv = cv[2];
      size_t rq = q.shape.size(), rv = vv.shape.size();
      size_t E = L_.extra[i];
      int64_t D = p[E], N = p[E + 1], T = p[2], rows = L_.items[i];
      int64_t R = v.kind == Variant::Flash ? 16 : is_flash_decode(v.kind) ? 4 : v.threads ? v.threads / 2 : 128;
      // (R: query rows per block; the tensor-core kernels' 16 per warp)
      if (is_flash_decode(v.kind) && env_zero("LUMINAL_CUDA_FLASH_DECODE")) return false;  // (comparison)
      if (v.kind == Variant::FlashDecodeMma && env_zero("LUMINAL_CUDA_FLASH_DECODE_MMA")) return false;
      if (v.kind == Variant::FlashMmaSkip && env_zero("LUMINAL_CUDA_FLASH_MMA_SKIP")) return false;  // (the fallback)
      // (wgmma: an sm_90 device, the module compiled for sm_90a)
      if (v.kind == Variant::FlashWgmma && (!hopper_ || env_zero("LUMINAL_CUDA_FLASH_WGMMA"))) return false;
      if (out_n == 0 || rq < 2 || rv < 2 || D > 128 || N > 128 || q.strides[rq - 2] != 0) return false;
      auto shared_rows = [](const ConcreteView& x, size_t nrow) {
        int64_t c = 1;
        for (size_t d = nrow; d-- > 0;) {
          if (x.strides[d] != 0 && x.shape[d] != 1) break;
          c *= x.shape[d];
        }
        return c;
      };
      int64_t Tq = std::gcd(shared_rows(k, rq - 2), shared_rows(vv, rv - 2));
      if (Tq <= 0 || rows % Tq) return false;
      // The tensor-core tiles for rows enough to fill half of one (prefill); decode's few rows per KV head (its
      // query heads) go to the decode kernel, which holds more loads in flight.
      if ((v.kind == Variant::FlashMma || is_flash_tiles(v.kind)) && Tq < R / 2) return false;
      if (is_flash_decode(v.kind) && Tq > 2 * R) return false;  // (more rows: the tiled kernels share k and v)
      int64_t B = rows / Tq, tiles = (Tq + R - 1) / R * B;
      // Key ranges (flash-decoding) when the tiles fill under two waves of the GPU and the keys are many: about
      // four blocks per multiprocessor, at least 128 keys per range.
      int64_t splits = 1, chunk = T;
      if (is_flash_decode(v.kind)) {
        // Its warps take 32-key tiles in turn: ranges of 128+ keys, enough of them for about two blocks per
        // multiprocessor, as many as its registers let run at once (short caches too: a block's range is only 4
        // tiles). LUMINAL_CUDA_ATTENTION_CHUNK: keys per range (tests, tuning).
        const char* e = std::getenv("LUMINAL_CUDA_ATTENTION_CHUNK");
        int64_t want = (2 * int64_t(sms_) + tiles - 1) / tiles;
        chunk = e && std::atoll(e) > 0 ? std::atoll(e) : std::max<int64_t>(128, ((T + want - 1) / want + 127) / 128 * 128);
        splits = std::max<int64_t>(1, (T + chunk - 1) / chunk);
      } else if (tiles < 2 * int64_t(sms_) && T > 256) {
        int64_t want = (4 * int64_t(sms_) + tiles - 1) / tiles;
        chunk = std::max<int64_t>(128, ((T + want - 1) / want + 63) / 64 * 64);
        splits = (T + chunk - 1) / chunk;
      }
      if (splits > 65535 || (Tq + R - 1) / R > 65535) return false;
      p[E + 2] = Tq;
      p[E + 3] = B;
      p[E + 4] = splits;
      p[E + 5] = std::max<int64_t>(chunk, 1);
      // 16-byte loads of k's and v's rows: 4 float32 elements, or 8 of a 16-bit KV cache (the kernels print the
      // vector paths only for their storage types).
      const Node& an = g_.node(core(i).node);
      int64_t u = dtype_size(s_.storage()[size_t(an.inputs[1].node)]) == 2 &&
                          dtype_size(s_.storage()[size_t(an.inputs[2].node)]) == 2 ? 8 : 4;
      bool vec = k.strides[rq - 1] == 1 && vv.strides[rv - 2] == 1 && D % u == 0 && N % u == 0 && k.offset % u == 0 &&
                 vv.offset % u == 0;
      if (is_flash_tiles(v.kind)) vec = vec && D % 8 == 0 && N % 8 == 0;  // (8 elements a load, float32 too)
      for (size_t d = 0; d + 1 < rq; ++d) vec = vec && k.strides[d] % u == 0;
      for (size_t d = 0; d < rv; ++d) vec = vec && (d == rv - 2 || vv.strides[d] % u == 0);
      // LUMINAL_CUDA_KV16_VECTOR=0: a 16-bit cache staged element by element (no cp.async; comparison, fallback)
      if (u == 8 && env_zero("LUMINAL_CUDA_KV16_VECTOR")) vec = false;
      // (16-byte copies or loads only)
      if ((v.kind == Variant::FlashWgmma || v.kind == Variant::FlashDecodeMma) && !vec) return false;
      p[E + 6] = vec;
      L_.grid[i] = {unsigned((Tq + R - 1) / R), unsigned(std::min<int64_t>(B, 65535)), unsigned(splits)};
      L_.rows_items[i] = splits > 1 ? out_n : 0;  // the combine's elements
      ws_bytes_ = std::max(ws_bytes_, size_t(rows * splits * (N + 2)) * sizeof(float));
      const Step& st = s_.steps[i];
      if (is_flash_tiles(v.kind) && st.summary_edge >= 0) {  // (its mask summary: assign_summaries)
        const ConcreteView& m = cv[size_t(st.summary_edge)];
        L_.summary_rows[i] = 1;
        for (size_t d = 0; d + 1 < m.shape.size(); ++d) L_.summary_rows[i] *= m.strides[d] ? m.shape[d] : 1;
      }
      if (is_flash_decode(v.kind))  // (a ticket per block of the grid's x and its loop over the batches)
        tickets_bytes_ = std::max(tickets_bytes_, size_t((Tq + R - 1) / R * B) * sizeof(unsigned));
      return true;
    }
    case Variant::AttentionRows:
      L_.grid[i] = {unsigned(std::max<int64_t>(1, std::min<int64_t>(L_.items[i], int64_t(sms_) * 16))), 1, 1};
      return true;
    case Variant::QDot: {
      // Q8_0 by __dp4a (codegen's q8_quantize, q8_dp4a) for up to 4 rows: the activations (any view: the quantising
      // kernel reads them element by element) as int8 blocks in the workspace, rows x K bytes then their scales;
      // weight rows 2-byte aligned. LUMINAL_CUDA_Q8_DP4A=0: the float kernel (comparison).
      int64_t N = p[3], rows = N ? out_n / N : 0;
      if (rows == 0 || rows > 4 || env_zero("LUMINAL_CUDA_Q8_DP4A")) return false;
      for (size_t j = 1; j < cv.size(); ++j)
        if (cv[j].offset % 2) return false;
      L_.grid[i] = {unsigned(std::min<int64_t>(rows * ((N + 3) / 4), int64_t(sms_) * 16)), 1, 1};
      ws_bytes_ = std::max(ws_bytes_, size_t(rows * p[2] + rows * (p[2] / 32) * 4));
      return true;
    }
    case Variant::QRows: {
      // Q8_0 through dot_rows (codegen's QRows) for one row of activations: in a MatVec group, whose kernel then
      // computes it with the others (alone, QDot; LUMINAL_CUDA_Q8_ROWS=1: alone too, =0: never, the groups run
      // their steps one by one). Activation rows 16-byte aligned (ld8), weight rows 2-byte aligned in a buffer of
      // whole 4-byte words (a lane's last word may reach 2 bytes past its quants).
      const char* e = std::getenv("LUMINAL_CUDA_Q8_ROWS");
      const luminal::Step& cs = core(i);
      bool grouped = cs.group >= 0 && s_.sched.groups[size_t(cs.group)].kind == Group::MatVec;
      if ((e && std::strcmp(e, "0") == 0) || (!grouped && !(e && std::strcmp(e, "1") == 0))) return false;
      const ConcreteView &a = cv[0], &w = cv[1];
      size_t r = a.shape.size();
      int64_t N = p[3], u = 16 / int64_t(dtype_size(s_.storage()[size_t(g_.node(cs.node).inputs[0].node)]));
      int64_t wn = g_.node(cs.node).inputs[1].node;
      bool split = split_input(wn);  // (8-byte quant loads)
      if (N == 0 || out_n != N || a.offset % u || p[2] % u ||
          (!split && (w.offset % 2 || w.strides[0] % 2 || plan_.numel(wn) % 4)))
        return false;
      for (size_t d = 0; d + 1 < r; ++d)
        if (a.strides[d] % u && a.shape[d] != 1) return false;
      return true;
    }
    case Variant::QMatVec: case Variant::QGemm: {
      // Q8_0 (codegen's q8_matvec, q8_mma): up to 4 rows take the matrix-vector kernel, more the tensor cores.
      // Activation rows 16-byte aligned (float4 loads), weight rows 2-byte aligned. p[2]: K, p[3]: N.
      const ConcreteView& a = cv[0];
      size_t r = a.shape.size();
      int64_t N = p[3], rows = N ? out_n / N : 0;
      if (rows == 0 || a.offset % 4 || (v.kind == Variant::QMatVec) != (rows <= 4)) return false;
      for (size_t d = 0; d + 2 < r; ++d)
        if (a.strides[d] % 4 && a.shape[d] != 1) return false;
      for (size_t j = 1; j < cv.size(); ++j)
        if (cv[j].offset % 2) return false;
      if (v.kind == Variant::QMatVec)
        L_.grid[i] = {unsigned(std::min<int64_t>(rows * ((N + 1) / 2), int64_t(sms_) * 16)), 1, 1};
      else if ((rows + 63) / 64 > 65535 || (N + 63) / 64 > (int64_t(1) << 31) - 1) return false;
      else L_.grid[i] = {unsigned((N + 63) / 64), unsigned((rows + 63) / 64), 1};
      return true;
    }
    case Variant::Gemm128: case Variant::Gemm64: case Variant::Wgmma128: case Variant::Wgmma256: {
      // 16-byte aligned rows (the operands' chunks; K past its last tile is zero-filled); the 128-row tiles when
      // they alone fill the GPU, else the 64-row ones. wgmma: an sm_90 device (the module compiled for sm_90a) and
      // operands that tensor maps describe.
      const ConcreteView &a = cv[0], &b = cv[1];
      size_t r = a.shape.size();
      if (out_n == 0 || r < 3 || a.strides[r - 2] != 0 || b.strides[r - 3] != 0 ||
          a.shape[r - 3] < gemm_min_rows() || !rows_aligned(a, b))
        return false;
      int64_t M = a.shape[r - 3], N = a.shape[r - 2], batch = out_n / (M * N);
      int64_t TM = v.kind == Variant::Gemm64 ? 64 : 128, TN = v.kind == Variant::Wgmma256 ? 256 : TM;
      int64_t tm = (M + TM - 1) / TM, tn = (N + TN - 1) / TN;
      if (batch > 65535 || tn > 65535 || a.shape[r - 1] >= (int64_t(1) << 31)) return false;
      if (v.kind == Variant::Gemm128 && tm * tn * batch < int64_t(sms_)) return false;
      if (is_wgmma(v.kind)) {
        GemmMaps& g = L_.maps[i];
        if (!hopper_ || !driver().cuTensorMapEncodeTiled || tm * tn >= (int64_t(1) << 31) ||
            N >= (int64_t(1) << 31) || !tma_side(a, r - 3, batch, &g.a) || !tma_side(b, r - 2, batch, &g.b))
          return false;
        g.kind = -1;  // (encoded at launch)
        // Persistent: a block per multiprocessor at most, each taking tiles in turn.
        L_.grid[i] = {unsigned(std::min<int64_t>(tm * tn, sms_)), 1, unsigned(batch)};
        return true;
      }
      // (m tiles along x: the blocks running together share the weights' tiles, and the activations stay in L2)
      L_.grid[i] = {unsigned(tm), unsigned(tn), unsigned(batch)};
      return true;
    }
    case Variant::Blas: {
      // cuBLASLt, where it opens, for 2+ rows sharing the weights (one: the matrix-vector kernel); operands it
      // cannot read in place are copied into its workspace (blas_plan).
      const ConcreteView& a = cv[0];
      size_t r = a.shape.size();
      const Node& n = g_.node(core(i).node);
      if (op_as<QMatMulOp>(n)) {  // (Q8_0 weights: cuBLASLt over their dequantisation, see blas_plan_q8)
        int64_t N = p[3], K = p[2];
        if (out_n == 0 || N == 0 || out_n / N < gemm_min_rows() || ours_forced()) return false;
        bool split = split_input(n.inputs[1].node);
        return blas_plan_q8(a, cv[1], N, K, s_.storage()[size_t(n.inputs[0].node)], n.dtype, s_.compute, split,
                            &L_.blas[i]);
      }
      if (out_n == 0 || r < 3 || weight_rows(a, cv[1]) < gemm_min_rows() || ours_forced()) return false;
      return blas_plan(a, cv[1], s_.storage()[size_t(n.inputs[0].node)], s_.storage()[size_t(n.inputs[1].node)],
                       n.dtype, s_.compute, &L_.blas[i]);
    }
    case Variant::ImplicitGemm: case Variant::ImplicitMma: {  // a Contraction: its GEMM's layout after the views
      const Node& n = g_.node(core(i).node);
      int axes = op_as<ContractionOp>(n)->axes;
      int64_t* x = p + s_.steps[i].nparams - contraction_extra(int(cv[0].shape.size()) - axes);
      return out_n != 0 && contraction_layout(cv[0], cv[1], axes, contraction_bk(v.kind == Variant::ImplicitMma),
                                              !s_.steps[i].combine_fn.empty(), sms_, x, L_.grid[i].data());
    }
    case Variant::Tiled: case Variant::TensorCore: {
      // [batch..., M, N, K] where a does not depend on n nor b on m, with enough rows to share the weights.
      const ConcreteView &a = cv[0], &b = cv[1];
      size_t r = a.shape.size();
      if (out_n == 0 || r < 3 || a.strides[r - 2] != 0 || b.strides[r - 3] != 0 || a.shape[r - 3] < 16) return false;
      int64_t M = a.shape[r - 3], N = a.shape[r - 2], batch = out_n / (M * N);
      if (batch > 65535 || (M + 63) / 64 > 65535) return false;
      L_.grid[i] = {unsigned((N + 63) / 64), unsigned((M + 63) / 64), unsigned(batch)};
      if (v.kind == Variant::TensorCore) p[3] = rows_aligned(a, b) && a.shape[r - 1] % 32 == 0;  // 16-byte staging
      return true;
    }
  }
  return false;
}

// Step i's parameter slice (its views under the plan's dims, the header's counts), its variant and its launch.
void Runtime::configure(size_t i) {
  const luminal::Step& cs = core(i);
  const Step& st = s_.steps[i];
  const Node& n = g_.node(cs.node);
  const std::vector<int64_t>& shape = plan_.shape(cs.node);
  L_.items[i] = L_.rows_items[i] = L_.prep_items[i] = L_.summary_rows[i] = 0;
  L_.variant[i] = st.variants.size() - 1;
  L_.grid[i] = {1, 1, 1};
  L_.threads[i] = 256;
  int64_t* p = L_.params.data() + L_.slot[i];  // the step's slice of the block, written in place
  std::fill(p, p + st.nparams, 0);
  p[0] = cs.node;
  std::vector<ConcreteView>& cv = views_;
  cv.resize(st.views.size());
  for (size_t k = 0; k < st.views.size(); ++k) {
    const ViewSlot& vs = st.views[k];
    const ConcreteView& v = plan_.views(i)[size_t(vs.edge)];  // (checked against its buffer by the plan)
    ConcreteView& w = cv[k];
    w = v;
    for (size_t d = 0; d < vs.perm.size(); ++d) {
      size_t src = size_t(vs.perm[d]);
      w.shape[d] = v.shape[src];
      w.strides[d] = v.strides[src];
      if (v.masked) {
        w.lo[d] = v.lo[src];
        w.hi[d] = v.hi[src];
      }
    }
    int64_t src = n.inputs[size_t(vs.edge)].node;
    p[vs.base] = w.offset;
    p[vs.base + 1] = g_.node(src).op == Op::Constant ? 1 : plan_.numel(src);
    for (int d = 0; d < vs.rank; ++d) {
      p[vs.shape_slot(d)] = w.shape[size_t(d)];
      p[vs.stride_slot(d)] = w.strides[size_t(d)];
      if (vs.masked) {
        p[vs.lo_slot(d)] = w.lo[size_t(d)];
        p[vs.hi_slot(d)] = w.hi[size_t(d)];
      }
      p[vs.div_slot(d)] = div_magic(w.shape[size_t(d)]);
    }
  }
  int64_t out_n = numel_of(shape);
  if (op_as<AttentionOp>(n)) {  // p[2]: keys; after the views: D, N (the rest set by the variant)
    const ConcreteView &q = cv[0], &vv = cv[2];
    size_t rq = q.shape.size(), rv = vv.shape.size();
    int64_t N = vv.shape[rv - 2];
    L_.extra[i] = size_t(st.nparams - 7);
    p[2] = q.shape[rq - 2];
    p[L_.extra[i]] = q.shape[rq - 1];
    p[L_.extra[i] + 1] = N;
    p[L_.extra[i] + 4] = 1;
    L_.items[i] = N ? out_n / N : 0;
  } else if (st.block_bytes && op_as<QMatMulOp>(n)) {
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
    L_.items[i] = out_n;
  } else if (st.block_bytes) {  // Dequant: a thread per block of 32
    const ConcreteView& w = cv[0];
    int64_t bytes = w.shape.back();
    if (w.strides.back() != 1 || bytes % st.block_bytes)
      throw std::invalid_argument(op_label(n) + ": expects uint8 rows of whole blocks");
    p[2] = bytes / st.block_bytes * 32;
    L_.items[i] = p[2] ? out_n / 32 : 0;
  } else if (cs.program && cs.program->has_row_reductions()) {  // a block per row: p[2] the row length
    int64_t len = cv[0].shape.empty() ? 1 : cv[0].shape.back();
    p[2] = len;
    L_.items[i] = cs.program->reduce != Op::Input ? out_n : (len ? out_n / len : 0);
  } else if (cs.program && cs.program->reduce != Op::Input) {  // p[2]: the reduced row's length
    p[2] = cv[0].shape.back();
    L_.items[i] = out_n;
  } else if (!plan_.identity(i)) {  // (an identity copy counts no items: in a batch, its loop does nothing)
    L_.items[i] = out_n;
  }
  // The first variant that applies; when it is a GEMM variant, the GEMM variants after it that apply too are the
  // candidates that choose() times (LUMINAL_CUDA_TUNE=0: none; LUMINAL_CUDA_GEMM forces one).
  // For fewer than kFewRows rows the matrix-vector kernel is a candidate too, after a GEMM variant that applies
  // (the tensor-core kernel between them does not apply to so few rows).
  auto& cands = L_.cands[i];
  cands.clear();
  std::string forced;
  bool more = false;  // (whether to look past the first)
  size_t r = cv.size() >= 2 ? cv[0].shape.size() : 0;
  bool few = r >= 3 && cv[1].shape.size() == r && weight_rows(cv[0], cv[1]) < kFewRows;
  for (size_t v = 0; v < st.variants.size(); ++v) {
    Variant::Kind k = st.variants[v].kind;
    bool gemm = timed(k) || (few && !cands.empty() && k == Variant::MatVec);
    if (!cands.empty() && !more) break;
    if (!cands.empty() && !gemm && !(few && k == Variant::TensorCore)) break;
    if (!applies(st.variants[v], cv, out_n, p, i)) continue;
    L_.variant[i] = cands.empty() ? v : L_.variant[i];
    if (!gemm) break;
    if (cands.empty()) {  // (the environment read only here: decode's steps never get this far)
      forced = gemm_forced();
      more = !forced.empty() || !env_zero("LUMINAL_CUDA_TUNE");
    }
    cands.push_back({v, L_.grid[i]});
  }
  if (!cands.empty()) {
    size_t pick = 0;  // (the variant forced where it applies, else the first)
    for (size_t c = 0; !forced.empty() && forced != "own" && c < cands.size(); ++c)
      if (variant_name(st.variants[cands[c].first].kind) == forced) pick = c;
    L_.variant[i] = cands[pick].first;
    L_.grid[i] = cands[pick].second;  // (applies() left the grid of the last it took)
    if (!forced.empty() || cands.size() == 1) cands.clear();
  }
  if (!st.rows_fn.empty() && n.op == Op::Scatter) {  // Scatter: rows of the index
    int64_t row = out_n / std::max<int64_t>(1, shape.empty() ? 1 : shape[0]);
    if (!shape.empty() && shape[0] == 0) row = 0;
    p[3] = row;
    p[2] = numel_of(cv[1].shape) * row;
    L_.rows_items[i] = p[2];
  }
  p[1] = L_.items[i];
}

// The plan for `dims` (the steps whose dims changed, evaluated again), and the launches of those steps.
void Runtime::build_plan(const Bindings& dims) {
  plan_.update(dims);
  size_t lo_slot = L_.params.size(), hi_slot = 0;  // the range of the parameter block that changed
  for (size_t i : plan_.stale()) {
    const luminal::Step& cs = core(i);
    const Node& n = g_.node(cs.node);
    if (cs.kind == luminal::Step::Iota && !constants_.count(cs.node)) {
      L_.iota[cs.node] = iota_values(n, plan_.shape(cs.node)[0], dims);  // (host values, uploaded with the plan)
      up_iota_ = true;
    }
    if (cs.kind != luminal::Step::Kernel) continue;
    configure(i);
    lo_slot = std::min(lo_slot, L_.slot[i]);
    hi_slot = std::max(hi_slot, L_.slot[i] + size_t(s_.steps[i].nparams));
  }
  up_lo_ = std::min(up_lo_, lo_slot);
  up_hi_ = std::max(up_hi_, hi_slot);
  assign_summaries();
}

// Steps that read the same mask node through the same view (every layer's attention reading one causal mask) share
// its summary: computed by the first of them in step order (which the launches follow), read by the rest. Within a
// run a node's buffer holds its value until its last reader.
void Runtime::assign_summaries() {
  std::map<std::vector<int64_t>, size_t> seen;
  size_t at = 0;
  for (size_t i = 0; i < s_.steps.size(); ++i) {
    if (!L_.summary_rows[i]) continue;
    const Step& st = s_.steps[i];
    const ViewSlot& vs = st.views[size_t(st.summary_edge)];
    const int64_t* p = L_.params.data() + L_.slot[i];
    std::vector<int64_t> key{g_.node(core(i).node).inputs[size_t(st.summary_edge)].node, p[2]};
    key.insert(key.end(), p + vs.base, p + vs.base + 2 + 2 * vs.rank);  // (offset, size, shape, strides)
    auto [it, fresh] = seen.emplace(key, at);
    L_.summary_off[i] = it->second;
    L_.prep_items[i] = fresh ? L_.summary_rows[i] * 8 : 0;  // (a block of 8 warps per row)
    if (fresh) at += (size_t(L_.summary_rows[i] * ((p[2] + 63) / 64)) + 255) / 256 * 256;
  }
  summaries_bytes_ = std::max(summaries_bytes_, at);
}

// What planning changed reaches the device: the parameter block's changed range, the Iota block, a larger arena.
// (Separate from build_plan, which may run ahead while the device still reads the previous step's numbers.)
void Runtime::upload_plan() {
  size_t lo_slot = up_lo_, hi_slot = up_hi_;
  bool iota_changed = up_iota_;
  up_lo_ = SIZE_MAX;
  up_hi_ = 0;
  up_iota_ = false;
  size_t pbytes = std::max<size_t>(L_.params.size(), 1) * sizeof(int64_t);
  if (!params_ || params_->bytes < pbytes) {
    params_ = device_alloc(pbytes);
    lo_slot = 0;
    hi_slot = L_.params.size();
  }
  if (ws_bytes_ && (!ws_ || ws_->bytes < ws_bytes_)) {
    ws_.reset();
    ws_ = device_alloc(size_class(ws_bytes_));
  }
  if (summaries_bytes_ && (!summaries_ || summaries_->bytes < summaries_bytes_)) {
    summaries_.reset();
    summaries_ = device_alloc(size_class(summaries_bytes_));
  }
  if (tickets_bytes_ && (!tickets_ || tickets_->bytes < tickets_bytes_)) {
    tickets_.reset();
    tickets_ = device_alloc(size_class(tickets_bytes_));
    check(driver().cuMemsetD8(tickets_->ptr, 0, tickets_->bytes), "cuMemsetD8", "tickets");
  }
  if (!arena_ || arena_->bytes < plan_.arena_bytes()) {
    arena_.reset();
    arena_ = device_alloc(std::max<size_t>(plan_.arena_bytes(), 256));
  }
  // Iota values not returned as outputs: one block, uploaded when they change (its address stays while it fits).
  std::vector<uint8_t> block;
  if (iota_changed) {
    L_.iota_off.clear();
    for (auto& [id, host] : L_.iota) {
      if (plan_.home(id) == Plan::Home::Fresh) continue;
      L_.iota_off[id] = block.size();
      const uint8_t* h = static_cast<const uint8_t*>(host.data.get());
      block.insert(block.end(), h, h + host.nbytes());
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
  std::memcpy(host, L_.params.data() + lo_slot, pn);
  if (!block.empty()) std::memcpy(host + pn, block.data(), block.size());
  if (pn)
    check(d.cuMemcpyHtoDAsync(params_->ptr + lo_slot * sizeof(int64_t), host, pn, nullptr), "cuMemcpyHtoDAsync",
          "parameters");
  if (!block.empty()) check(d.cuMemcpyHtoDAsync(iota_->ptr, host + pn, block.size(), nullptr), "cuMemcpyHtoDAsync", "Iota");
  check(d.cuEventRecord(S.copied, nullptr), "cuEventRecord");
}

void Runtime::launch(const std::string& fn, int64_t node, size_t slot, int64_t items, bool per_row,
                     const std::vector<CUdeviceptr>& ptrs, const unsigned* grid3, unsigned threads, unsigned smem,
                     const std::vector<TensorMap>* maps) {
  if (items <= 0 && !graphs_on_) return;  // (in a graph the node stays, a no-op: the sequence stays the same)
  ++launched_;
  // Recorded into a reused entry (no allocation per launch once warm).
  if (npending_ == pending_.size()) pending_.emplace_back();
  Launch& l = pending_[npending_];
  l.f = fns_.at(fn);
  l.node = node;
  l.threads = threads;
  l.smem = smem;
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
  l.maps.clear();
  if (maps) l.maps = *maps;
  if (!graphs_on_) execute(l);
  else if (++npending_ == chunk_size(nchunk_)) replay(npending_);
}

namespace {
// A stream that only records: cuBLASLt's calls are captured on it into graphs (never run there).
CUstream capture_stream() {
  static CUstream s = nonblocking_stream();
  return s;
}

// The tensor map of a wgmma GEMM's operand (or output) at `base`: boxes of 64 k (columns) x `rows` rows, 16-bit
// elements, in shared memory with the 128-byte swizzle; zeros read past the edges, nothing written there.
TensorMap tensor_map(const GemmMaps::Side& s, CUdeviceptr base, unsigned rows) {
  TensorMap m;
  unsigned box[3] = {64, rows, 1}, one[3] = {1, 1, 1};
  check(driver().cuTensorMapEncodeTiled(&m, 1 /* UINT16 */, 3, reinterpret_cast<void*>(base + CUdeviceptr(s.offset) * 2),
                                        s.dim, s.stride, box, one, 0, 3 /* 128B swizzle */, 3 /* L2 256B */, 0),
        "cuTensorMapEncodeTiled");
  return m;
}

bool row_major(const ConcreteView& v) {
  int64_t want = 1;
  for (size_t d = v.shape.size(); d-- > 0;) {
    if (v.shape[d] != 1 && v.strides[d] != want) return false;
    want *= v.shape[d];
  }
  return !v.masked;
}
}  // namespace

// Whether cuBLASLt computes step i's product straight into the Add that is its only reader (Step::add_epilogue):
// out = a.b + c with the Add's other operand as c and the Add's buffer as out (the Add then does not run). Returns
// that Add's node and the pointer it adds (C), or no node: not this run (timing, LUMINAL_CUDA_BLAS_EPILOGUE=0, a 16-bit product), c not computed by
// now, steps between the two that might use the Add's memory (only within one group is it kept apart from them by
// the plan), or the Add's buffer over an operand that cuBLASLt reads in place or partly over c.
BlasAdd Runtime::blas_add(size_t i, const std::vector<CUdeviceptr>& ptrs) {
  int64_t id = core(i).node, add = core(i).add_epilogue;
  if (add < 0 || timing_ || L_.blas[i].out != DType::F32 || env_zero("LUMINAL_CUDA_BLAS_EPILOGUE")) return {};
  int64_t as = plan_.step_of(add);
  if (as <= int64_t(i) || done_[size_t(as)] || core(size_t(as)).kind != luminal::Step::Kernel || plan_.identity(size_t(as)))
    return {};
  bool grouped = core(i).group >= 0 && core(i).group == core(size_t(as)).group;
  for (size_t k = i + 1; k < size_t(as) && !grouped; ++k)
    if (core(k).kind != luminal::Step::Input && core(k).kind != luminal::Step::Constant) return {};
  const Node& an = g_.node(add);
  size_t e = an.inputs[0].node == id ? 1 : 0;
  int64_t cn = an.inputs[e].node;
  const ConcreteView &cv = plan_.views(size_t(as))[e], &pv = plan_.views(size_t(as))[1 - e];
  if (plan_.step_of(cn) < 0 || plan_.step_of(cn) >= int64_t(i) || !ptr_[size_t(cn)] || !row_major(cv) ||
      !row_major(pv) || pv.offset || plan_.shape(add) != plan_.shape(id) || cv.shape != plan_.shape(add))
    return {};
  Plan::Home h = plan_.home(add);
  if (h != Plan::Home::Arena && h != Plan::Home::Fresh) return {};
  size_t bytes = size_t(numel_of(plan_.shape(add))) * sizeof(float);
  CUdeviceptr c = ptr_[size_t(cn)] + CUdeviceptr(cv.offset) * sizeof(float);
  CUdeviceptr d = h == Plan::Home::Arena ? arena_->ptr + plan_.offset(add) : 0;  // (a fresh buffer is apart)
  auto apart = [](CUdeviceptr p, size_t pn, CUdeviceptr q, size_t qn) { return !p || !q || p + pn <= q || q + qn <= p; };
  auto buffer = [&](int64_t node) {
    return std::make_pair(ptr_[size_t(node)], size_t(plan_.numel(node)) * dtype_size(s_.storage()[size_t(node)]));
  };
  if (d != c && !apart(d, bytes, c, bytes)) return {};
  if (!apart(ptrs[0], bytes, c, bytes)) return {};  // (the product's own buffer: where the first call times)
  const Node& n = g_.node(id);
  for (size_t k = 0; k < 2; ++k) {
    auto [p, pn] = buffer(n.inputs[k].node);
    if (!apart(ptrs[0], bytes, p, pn)) return {};
    if (!(k ? L_.blas[i].b.copy : L_.blas[i].a.copy) && !apart(d, bytes, p, pn)) return {};
  }
  return {add, c};
}

// A GEMM variant of step i: our kernel, recorded like any launch; or cuBLASLt. Its call is captured into a graph
// (once per set of arguments) that the chunk holds as a child graph node; but its first call (which may time its
// algorithms and compile its copy kernels: work that no capture may hold), and every call where capture is off
// (LUMINAL_CUDA_BLAS_GRAPHS=0, an older driver), replays the launches recorded so far first (their chunk ends
// there), then runs on the same stream.
void Runtime::launch_gemm(size_t i, const Variant& v, const std::vector<CUdeviceptr>& ptrs, BlasAdd add) {
  int64_t id = core(i).node;
  if (v.kind == Variant::MatVec) {  // (a candidate for few rows: its grid as in any run)
    launch(v.fn, id, L_.slot[i], L_.items[i], true, ptrs);
    return;
  }
  if (is_wgmma(v.kind)) {  // (its operands' tensor maps: encoded again for another variant or other pointers)
    GemmMaps& g = L_.maps[i];
    if (g.kind != int(v.kind) || g.pa != ptrs[1] || g.pb != ptrs[2] || g.po != ptrs[0]) {
      g.maps = {tensor_map(g.a, ptrs[1], 128), tensor_map(g.b, ptrs[2], v.kind == Variant::Wgmma256 ? 256 : 128),
                TensorMap{}};
      // (the output [batch, M, N]: the kernel stores through its map where the same holds, else from registers)
      DType od = g_.node(id).dtype;
      uint64_t M = g.a.dim[1], N = g.b.dim[1];
      if ((od == DType::BF16 || od == DType::F16) && N % 8 == 0 && ptrs[0] % 16 == 0)
        g.maps[2] = tensor_map({{N, M, g.a.dim[2]}, {N * 2, N * 2 * M}, 0}, ptrs[0], 128);
      g.kind = int(v.kind);
      g.pa = ptrs[1];
      g.pb = ptrs[2];
      g.po = ptrs[0];
    }
    launch(v.fn, id, L_.slot[i], L_.items[i], false, ptrs, L_.grid[i].data(), unsigned(v.threads), unsigned(v.smem),
           &g.maps);
    return;
  }
  if (v.kind != Variant::Blas) {
    launch(v.fn, id, L_.slot[i], L_.items[i], false, ptrs, L_.grid[i].data(),
           v.threads ? unsigned(v.threads) : v.kind == Variant::QGemm ? 128 : 256, unsigned(v.smem));
    return;
  }
  const Driver& dr = driver();
  const BlasGemm& g = L_.blas[i];
  if (!blas_ws_ || blas_ws_->bytes < g.ws_bytes) {
    if (graphs_on_ && npending_) replay(npending_);  // (before the graphs that chunk holds are freed)
    clear_blas_graphs();
    blas_ws_.reset();  // (queued work that still uses it runs first: one stream)
    blas_ws_ = device_alloc(g.ws_bytes);
  }
  // Accumulating into the Add's buffer, c its other operand; the product's own buffer then for timing only.
  CUdeviceptr c = add.c, out = add.node >= 0 ? ptr_[size_t(add.node)] : ptrs[0];
  CUdeviceptr scratch = add.node >= 0 ? ptrs[0] : 0;
  bool capture = graphs_on_ && !timing_ && !blas_capture_off_ && dr.cuStreamBeginCapture && dr.cuStreamEndCapture &&
                 dr.cuGraphAddChildGraphNode && !env_zero("LUMINAL_CUDA_BLAS_GRAPHS") &&
                 blas_ready(g, ptrs[1], ptrs[2], out, blas_ws_->ptr, c, scratch);
  if (graphs_on_ && npending_ && !capture) replay(npending_);
  // The left operand's copy made by the product just before, when it is of the same view and nothing ran since
  // (q, k and v of one normalised input): read again instead of copied. Not while timing (choose), whose runs must
  // each pay their copy, nor with steps on the host (writes that no launch counts).
  std::vector<int64_t> key;
  if (g.a.copy) {
    key = {int64_t(ptrs[1]), int64_t(blas_ws_->ptr), int64_t(g.a.dtype), int64_t(g.compute), g.a.offset};
    key.insert(key.end(), g.a.shape.begin(), g.a.shape.end());
    key.insert(key.end(), g.a.strides.begin(), g.a.strides.end());
  }
  bool reuse = g.a.copy && !timing_ && !has_host_steps_ && !env_zero("LUMINAL_CUDA_BLAS_REUSE") &&
               blas_copied_.second == launched_ && blas_copied_.first == key;
  ++launched_;
  blas_copied_ = {std::move(key), g.a.copy ? launched_ : SIZE_MAX};  // (the workspace's left copy, if any, now)
  try {
    if (!capture) {
      blas_run(g, ptrs[1], ptrs[2], out, blas_ws_->ptr, nullptr, reuse, c, scratch);
      return;
    }
    // Everything the captured call depends on: the product's numbers, its pointers, whether a's copy is reused.
    std::vector<int64_t> gk{g.M, g.N, g.K, g.batch, int64_t(g.compute), int64_t(g.out), int64_t(g.ws_bytes), reuse,
                            int64_t(ptrs[1]), int64_t(ptrs[2]), int64_t(out), int64_t(blas_ws_->ptr), int64_t(c),
                            int64_t(scratch)};
    for (const BlasGemm::Side* sd : {&g.a, &g.b}) {
      gk.insert(gk.end(), {int64_t(sd->dtype), sd->offset, sd->copy, sd->k_major, sd->ld, sd->bstride,
                           int64_t(sd->ws_offset), int64_t(sd->shape.size())});
      gk.insert(gk.end(), sd->shape.begin(), sd->shape.end());
      gk.insert(gk.end(), sd->strides.begin(), sd->strides.end());
    }
    auto it = blas_graphs_.find(gk);
    if (it == blas_graphs_.end()) {
      if (blas_graphs_.size() >= 4096) {  // (prompts of many lengths: start again)
        if (npending_) replay(npending_);
        clear_blas_graphs();
      }
      CUstream cs = capture_stream();
      check(dr.cuStreamBeginCapture(cs, 2 /* CU_STREAM_CAPTURE_MODE_RELAXED */), "cuStreamBeginCapture");
      BlasGraph bg;
      std::string failed;
      try {
        blas_run(g, ptrs[1], ptrs[2], out, blas_ws_->ptr, cs, reuse, c, scratch);
      } catch (const CudaError& e) {
        failed = e.what();
      }
      CUresult ended = dr.cuStreamEndCapture(cs, &bg.graph);  // (ends the capture whatever happened)
      if (failed.empty() && ended) failed = "cuStreamEndCapture failed (" + std::to_string(ended) + ")";
      if (failed.empty()) {
        // What it captured must make a child graph node that instantiates (a chunk's build cannot fall back).
        CUgraph probe = nullptr;
        CUgraphNode node = nullptr;
        CUgraphExec exec = nullptr;
        CUresult r = dr.cuGraphCreate(&probe, 0);
        if (!r) r = dr.cuGraphAddChildGraphNode(&node, probe, nullptr, 0, bg.graph);
        if (!r) r = dr.cuGraphInstantiateWithFlags(&exec, probe, 0);
        if (exec) dr.cuGraphExecDestroy(exec);
        if (probe) dr.cuGraphDestroy(probe);
        if (r) failed = "its graph does not instantiate as a child graph node (" + std::to_string(r) + ")";
      }
      if (!failed.empty()) {
        // A call that cannot be captured runs as it did before capture (ending its chunk), from now on.
        if (bg.graph) dr.cuGraphDestroy(bg.graph);
        blas_capture_off_ = true;
        std::fprintf(stderr, "luminal: cuBLASLt's call could not be captured into a CUDA graph (%s); it ends the "
                     "graph's chunks instead\n", failed.c_str());
        if (npending_) replay(npending_);
        blas_run(g, ptrs[1], ptrs[2], out, blas_ws_->ptr, nullptr, reuse, c, scratch);
        return;
      }
      bg.id = ++blas_graph_ids_;
      it = blas_graphs_.emplace(std::move(gk), bg).first;
    }
    if (npending_ == pending_.size()) pending_.emplace_back();
    Launch& l = pending_[npending_];
    l.f = nullptr;
    l.child = it->second.graph;
    l.child_id = it->second.id;
    l.node = id;
    l.args.clear();
    l.grid[0] = l.grid[1] = l.grid[2] = 1;
    l.threads = 1;
    l.smem = 0;
    if (++npending_ == chunk_size(nchunk_)) replay(npending_);
  } catch (const CudaError& e) {
    blas_copied_.second = SIZE_MAX;
    throw CudaError(std::string(e.what()) + " (node " + std::to_string(id) + ", " + op_label(g_.node(id)) + ")");
  }
}

// Several GEMM variants apply to step i: each runs on the step's own operands (after the launches before it, outside
// graphs: a warm-up, then 3 runs between CUDA events) and the fastest is kept for every product of the same kinds,
// dtypes and views in this process (the layers of a model share theirs). A run writes only the step's output, which
// the chosen variant then computes again.
void Runtime::choose(size_t i, const std::vector<CUdeviceptr>& ptrs) {
  static std::mutex mu;
  static std::map<std::vector<int64_t>, Variant::Kind> fastest;
  const Step& st = s_.steps[i];
  const Node& n = g_.node(core(i).node);
  auto& cands = L_.cands[i];
  std::vector<int64_t> key;
  for (auto& c : cands) key.push_back(st.variants[c.first].kind);
  for (auto& e : n.inputs) key.push_back(int64_t(s_.storage()[size_t(e.node)]));
  key.push_back(int64_t(n.dtype));
  const int64_t* p = L_.params.data() + L_.slot[i];
  for (const ViewSlot& vs : st.views) {  // (offset's alignment, shape, strides: not the buffer's size)
    key.push_back(p[vs.base] % 128);
    key.insert(key.end(), p + vs.base + 2, p + vs.base + 2 + 2 * vs.rank);
  }
  std::unique_lock<std::mutex> lock(mu);
  auto it = fastest.find(key);
  if (it == fastest.end()) {
    if (graphs_on_ && npending_) replay(npending_);  // (its operands computed first)
    const Driver& d = driver();
    bool graphs = graphs_on_;
    size_t launched = launched_;
    graphs_on_ = false;  // (direct launches)
    timing_ = true;
    CUevent ev[2] = {nullptr, nullptr};
    std::string log;
    size_t best_c = 0;
    try {
      for (auto& e : ev) check(d.cuEventCreate(&e, 0), "cuEventCreate");
      // Two rounds over the candidates, each one's best kept: a first call's one-time work (cuBLASLt picking its
      // algorithm, a kernel's module loaded) falls in the first round, and once it had chosen our slower kernel.
      std::vector<float> t(cands.size(), 0.0f);
      for (int round = 0; round < 2; ++round)
        for (size_t c = 0; c < cands.size(); ++c) {
          L_.variant[i] = cands[c].first;
          L_.grid[i] = cands[c].second;
          const Variant& var = st.variants[cands[c].first];
          launch_gemm(i, var, ptrs);  // (warm-up)
          check(d.cuEventRecord(ev[0], nullptr), "cuEventRecord");
          for (int r = 0; r < 3; ++r) launch_gemm(i, var, ptrs);
          check(d.cuEventRecord(ev[1], nullptr), "cuEventRecord");
          check(d.cuEventSynchronize(ev[1]), "cuEventSynchronize");
          float ms = 0;
          check(d.cuEventElapsedTime(&ms, ev[0], ev[1]), "cuEventElapsedTime");
          t[c] = round == 0 ? ms : std::min(t[c], ms);
        }
      for (size_t c = 0; c < cands.size(); ++c) {
        const Variant& var = st.variants[cands[c].first];
        log += std::string(" ") + variant_name(var.kind) + " " + std::to_string(t[c] / 3) + " ms";
        if (t[c] < t[best_c]) best_c = c;
      }
    } catch (...) {
      graphs_on_ = graphs;
      timing_ = false;
      blas_copied_.second = SIZE_MAX;
      for (auto& e : ev) if (e) d.cuEventDestroy(e);
      throw;
    }
    graphs_on_ = graphs;
    timing_ = false;
    launched_ = launched;
    blas_copied_.second = SIZE_MAX;  // (the count goes back: a copy made while timing is not known to follow)
    for (auto& e : ev) d.cuEventDestroy(e);
    Variant::Kind best = st.variants[cands[best_c].first].kind;
    // LUMINAL_CUDA_TUNE_LOG=1: each choice and its times on stderr
    if (const char* t = std::getenv("LUMINAL_CUDA_TUNE_LOG"); t && *t && std::string(t) != "0")
      std::fprintf(stderr, "luminal tune: %s (node %lld):%s -> %s\n", op_label(n).c_str(), (long long)core(i).node,
                   log.c_str(), variant_name(best));
    it = fastest.emplace(key, best).first;
  }
  for (auto& [v, grid] : cands)
    if (st.variants[v].kind == it->second) {
      L_.variant[i] = v;
      L_.grid[i] = grid;
    }
}

void Runtime::clear_blas_graphs() {
  for (auto& [_, bg] : blas_graphs_) driver().cuGraphDestroy(bg.graph);  // (a chunk holds its own copy)
  blas_graphs_.clear();
}

void Runtime::execute(const Launch& l) {
  void* small[16];
  std::vector<void*> big;
  void** args = small;
  size_t na = l.args.size();
  if (na + l.maps.size() > 16) {
    big.resize(na + l.maps.size());
    args = big.data();
  }
  for (size_t k = 0; k < na; ++k) args[k] = const_cast<CUdeviceptr*>(&l.args[k]);
  for (size_t k = 0; k < l.maps.size(); ++k) args[na + k] = const_cast<TensorMap*>(&l.maps[k]);
  CUresult r =
      driver().cuLaunchKernel(l.f, l.grid[0], l.grid[1], l.grid[2], l.threads, 1, 1, l.smem, nullptr, args, nullptr);
  if (r) {
    const Node& n = g_.node(l.node);
    check(r, "cuLaunchKernel", "node " + std::to_string(l.node) + " (" + op_label(n) + ")");
  }
}

namespace {
KernelNodeParams node_params(CUfunction f, const unsigned* grid, unsigned threads, unsigned smem,
                             std::vector<void*>& argp, std::vector<CUdeviceptr>& args, std::vector<TensorMap>& maps) {
  argp.resize(args.size() + maps.size());
  for (size_t k = 0; k < args.size(); ++k) argp[k] = &args[k];
  for (size_t k = 0; k < maps.size(); ++k) argp[args.size() + k] = &maps[k];
  KernelNodeParams p{};
  p.func = f;
  p.gridDimX = grid[0];
  p.gridDimY = grid[1];
  p.gridDimZ = grid[2];
  p.blockDimX = threads;
  p.blockDimY = p.blockDimZ = 1;
  p.sharedMemBytes = smem;
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
    same = pending_[i].f == c.launches[i].f && pending_[i].args.size() == c.launches[i].args.size() &&
           pending_[i].maps.size() == c.launches[i].maps.size();
  std::vector<void*> argp;
  if (same) {
    for (size_t i = 0; i < n && same; ++i) {
      Launch &now = pending_[i], &was = c.launches[i];
      if (!now.f) {  // a cuBLASLt call: another capture (new pointers) updates the node, or rebuilds the chunk
        same = now.child_id == was.child_id ||
               (d.cuGraphExecChildGraphNodeSetParams && !d.cuGraphExecChildGraphNodeSetParams(c.exec, c.nodes[i], now.child));
        continue;
      }
      if (now.args == was.args && now.maps == was.maps && now.threads == was.threads &&
          std::equal(now.grid, now.grid + 3, was.grid))
        continue;
      KernelNodeParams p = node_params(now.f, now.grid, now.threads, now.smem, argp, now.args, now.maps);
      check(d.cuGraphExecKernelNodeSetParams(c.exec, c.nodes[i], &p), "cuGraphExecKernelNodeSetParams");
    }
  }
  if (!same) {
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
      const Launch& l = pending_[i];
      // (a cuBLASLt call's child graph node: plain edges on both sides; programmatic ones join kernels only)
      bool chain = i && (!pdl_ || !l.f || !pending_[i - 1].f);
      if (!l.f) {
        check(d.cuGraphAddChildGraphNode(&c.nodes[i], c.graph, chain ? &c.nodes[i - 1] : nullptr, chain ? 1 : 0,
                                         l.child),
              "cuGraphAddChildGraphNode");
        continue;
      }
      KernelNodeParams p = node_params(l.f, l.grid, l.threads, l.smem, argp, pending_[i].args, pending_[i].maps);
      check(d.cuGraphAddKernelNode(&c.nodes[i], c.graph, chain ? &c.nodes[i - 1] : nullptr, chain ? 1 : 0, &p),
            "cuGraphAddKernelNode");
      if (i && !chain) check(d.cuGraphAddDependencies(c.graph, &c.nodes[i - 1], &c.nodes[i], &edge, 1), "cuGraphAddDependencies");
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
  for (auto& [_, bg] : blas_graphs_) driver().cuGraphDestroy(bg.graph);
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
  int64_t id = core(i).node, dest = g_.node(id).inputs[0].node;
  owned_[id] = inputs_.at(dest);
  ptr_[id] = ptr_[dest];
}

// A Scatter computing its source: the source's parameter slice and inputs follow its arguments.
void Runtime::add_producer(size_t i, std::vector<CUdeviceptr>& args) const {
  int64_t pn = core(i).producer;
  if (pn < 0) return;
  args.push_back(params_->ptr + L_.slot[size_t(plan_.step_of(pn))] * sizeof(int64_t));
  for (auto& e : g_.node(pn).inputs) args.push_back(ptr_[e.node]);
}

// A group's kernel, at its first step, when every member takes the matrix-vector path (see core/schedule.h's Group);
// marks the group's steps done. Otherwise (prefill) returns false and the steps run one by one.
template <class OutOf, class InPlace>
bool Runtime::launch_group(size_t g, const OutOf& out_of, const InPlace& in_place_of, std::vector<char>& done) {
  const Group& G = s_.sched.groups[g];
  const std::string& fn = s_.group_fns[g];
  std::vector<CUdeviceptr>& args = group_args_;
  auto slot = [&](size_t i) { return params_->ptr + L_.slot[i] * sizeof(int64_t); };
  auto kind = [&](size_t i) { return s_.steps[i].variants[L_.variant[i]].kind; };
  if (G.kind == Group::Batch) {
    // A batch: each step's plain loop (a Scatter's row writes only when they go into its destination in place).
    for (size_t b : G.batch)
      if (done[b] || (s_.steps[b].rows_fn.empty() ? kind(b) != Variant::Elements : !in_place_of(b))) return false;
    args.clear();
    int64_t items = 0;
    for (size_t b : G.batch) {
      const luminal::Step& cs = core(b);
      const Node& n = g_.node(cs.node);
      if (!s_.steps[b].rows_fn.empty()) {
        write_into_dest(b);
        items += L_.rows_items[b];
      } else {  // (an identity copy counts no items: its loop does nothing)
        ptr_[cs.node] = plan_.identity(b) ? ptr_[n.inputs[0].node] : out_of(cs.node);
        items += L_.items[b];
      }
      args.insert(args.end(), {slot(b), ptr_[cs.node]});
      for (auto& in : n.inputs) args.push_back(ptr_[in.node]);
      add_producer(b, args);
    }
    launch(fn, core(G.batch[0]).node, L_.slot[G.batch[0]], items, false, args);
    for (size_t k = G.first; k <= G.last; ++k) done[k] = 1;
    return true;
  }
  if (!group_runs(g)) return false;
  int64_t a0 = core(G.members[0]).node;
  args.assign(1, ptr_[g_.node(a0).inputs[0].node]);
  for (size_t m : G.members) {
    int64_t id = core(m).node;
    ptr_[id] = out_of(id);
    args.insert(args.end(), {slot(m), ptr_[id], ptr_[g_.node(id).inputs[1].node]});
  }
  for (size_t e : G.epilogues) {
    int64_t id = core(e).node;
    ptr_[id] = out_of(id);
    args.insert(args.end(), {slot(e), ptr_[id]});
    for (auto& in : g_.node(id).inputs) args.push_back(ptr_[in.node]);
  }
  int64_t rows = 0;  // (warps' rows: a unit of Q8_0 members may have two outputs per warp, see group_kernel)
  for (size_t k = 0; k < G.units.size(); ++k) {
    int64_t n = L_.items[G.members[G.units[k]]];
    rows += k < s_.group_pairs[g].size() && s_.group_pairs[g][k] ? (n + 1) / 2 : n;
  }
  rows *= s_.group_split[g];  // (warps: the kernel's `split` warps per row)
  if (G.prologue >= 0) {  // the prologue's parameter slice and inputs (its rows are computed in the dot loops)
    size_t pro = size_t(G.prologue);
    args.push_back(slot(pro));
    for (auto& in : g_.node(core(pro).node).inputs) args.push_back(ptr_[in.node]);
  }
  if (s_.group_stage[g]) {
    // Each block stages the row once: no more blocks than run at once (the module's group_blocks a multiprocessor)
    unsigned grid[3] = {unsigned(std::min<int64_t>((rows + 7) / 8, int64_t(sms_) * s_.group_blocks)), 1, 1};
    launch(fn, a0, L_.slot[G.members[0]], rows, true, args, grid, 256);
  } else {
    launch(fn, a0, L_.slot[G.members[0]], rows, true, args);
  }
  for (size_t k = G.first; k <= G.last; ++k) done[k] = 1;
  return true;
}

// Whether group g's kernel may compute its prologue (codegen's group_prologue): each unit's activations are whole
// rows of the prologue's output (its row length K, offset and row strides multiples of K, elements contiguous), and
// every input of the prologue is read in aligned runs of 8 contiguous elements along the row.
bool Runtime::prologue_fits(size_t g) const {
  const Group& G = s_.sched.groups[g];
  size_t pro = size_t(G.prologue);
  const int64_t* pp = L_.params.data() + L_.slot[pro];
  int64_t K = pp[2];
  if (K <= 0 || K % 8) return false;
  auto view = [&](size_t i, size_t k, int64_t mult, int64_t* last_stride) {
    const ViewSlot& v = s_.steps[i].views[k];
    const int64_t* p = L_.params.data() + L_.slot[i] + v.base;
    if (v.masked || v.rank < 1 || p[0] % mult) return false;
    for (int d = 0; d + 1 < v.rank; ++d)
      if (p[2 + v.rank + d] % mult) return false;
    *last_stride = p[2 + 2 * v.rank - 1];
    return true;
  };
  int64_t ls = 0;
  for (size_t u : G.units) {
    size_t m = G.members[u];
    if (L_.params[L_.slot[m] + 2] != K || !view(m, 0, K, &ls) || ls != 1) return false;
  }
  for (size_t q = 0; q < g_.node(core(pro).node).inputs.size(); ++q)
    if (!view(pro, q, 8, &ls) || ls != 1) return false;
  return true;
}

// Whether MatVec group g runs as its kernel: every member on the matrix-vector path, and its prologue (if it has
// one) of a shape the kernel computes (prologue_fits). Otherwise its steps run one by one, the prologue's step
// included.
bool Runtime::group_runs(size_t g) const {
  const Group& G = s_.sched.groups[g];
  for (size_t m : G.members) {
    Variant::Kind k = s_.steps[m].variants[L_.variant[m]].kind;
    if (k != Variant::MatVec && k != Variant::QRows) return false;  // (QRows: a Q8_0 member)
  }
  if (int64_t K = s_.group_stage[g]) {  // (one activation row, staged once per block: every unit must read it)
    auto at = [&](size_t m) { return L_.params[L_.slot[m] + size_t(s_.steps[m].views[0].base)]; };
    for (size_t m : G.members)
      if (L_.params[L_.slot[m] + 2] != K || at(m) != at(G.members[0])) return false;
  }
  return G.prologue < 0 || prologue_fits(g);
}

void Runtime::drop_plan() {
  plan_.invalidate();
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
  if (!steady || !plan_.valid()) return;
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

// Input `id`'s memory in the layout its kernels read: Q8_0 weights the module reads split (Module::q8_split) are
// split in place the first time (a buffer the caller owns; borrowed memory gets a split copy, made again every run,
// since its owner may change it); an array another module split is joined back for kernels reading GGUF blocks.
CUdeviceptr Runtime::q8_layout_of(int64_t id, const DeviceArray& a) {
  DeviceBuffer& b = *a.buf;
  if (!split_input(id)) {
    if (b.q8_split_k) q8_store_joined(b);
    return b.ptr;
  }
  int64_t N = a.shape[0], K = a.shape[1] / 34 * 32;
  if (b.q8_split_k) return b.ptr;
  if (!b.owner) {
    q8_store_split(b, N, K);
    return b.ptr;
  }
  if (!split_copies_.count(id))  // (loud: a copy per run is the slow way to give the weights)
    std::fprintf(stderr,
                 "luminal: Q8_0 weight '%s' is memory borrowed from torch (from_torch(copy=False)); its kernels read it "
                 "rearranged, so each run rearranges a copy of it. from_torch(t) (a copy) is rearranged once.\n",
                 g_.node(id).name.c_str());
  std::shared_ptr<DeviceBuffer>& c = split_copies_[id];
  c = q8_split_copy(b.ptr, N, K);
  return c->ptr;
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
    if (!plan_.valid() || plan_.dims() != dims) build_plan(dims);
    upload_plan();
  } catch (...) {
    drop_plan();  // half updated: the next run plans from scratch
    throw;
  }
  auto secs = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  auto t_planned = clock::now();
  times_ = {secs(t_run, t_planned), 0, 0, 0};
  if (profile) prof["(plan)"] = {times_[0], 1};
  // CUDA graphs (LUMINAL_CUDA_GRAPHS=0 turns them off), unless profiling (which times each kernel) or a step runs on
  // the host.
  graphs_on_ = !profile && !has_host_steps_ && !env_zero("LUMINAL_CUDA_GRAPHS");
  one_graph_ = env_zero("LUMINAL_CUDA_GRAPH_CHUNKS");  // one graph for the whole run
  tickets_on_ = !env_zero("LUMINAL_CUDA_DECODE_TICKETS");
  pdl_ = graphs_on_ && device().major >= 9 && driver().cuGraphAddDependencies && !env_zero("LUMINAL_CUDA_PDL");
  npending_ = launched_ = nchunk_ = 0;
  blas_copied_.second = SIZE_MAX;  // (a copy of an earlier run's operand is not this run's)
  const Plan& plan = plan_;  // (planning ahead changes it only after the last launch)
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
    const Node& n = g_.node(core(i).node);
    return plan.may_write_in_place(i) && std::find(donated.begin(), donated.end(), n.inputs[0].node) != donated.end();
  };
  for (size_t i = 0; i < s_.steps.size(); ++i) {
    const luminal::Step& cs = core(i);
    const Step& st = s_.steps[i];
    const Node& n = g_.node(cs.node);
    int64_t id = cs.node;
    auto t_step = clock::now();
    auto out_of = [&](int64_t node) -> CUdeviceptr {
      if (plan.home(node) == Plan::Home::Arena) return arena_->ptr + plan.offset(node);
      DeviceArray a;  // a fresh allocation: what the run returns
      a.dtype = s_.storage()[size_t(node)];
      a.shape = plan.shape(node);
      a.buf = device_alloc(a.nbytes());
      owned[node] = a;
      return a.buf->ptr;
    };
    auto out_ptr = [&]() { return out_of(id); };
    switch (cs.kind) {
      case luminal::Step::Input: {
        auto it = inputs_.find(id);
        if (it == inputs_.end())
          throw std::invalid_argument("input '" + n.name + "' (node " + std::to_string(id) + ") has no data: call set() on it");
        if (it->second.shape != plan.shape(id) || it->second.dtype != s_.storage()[size_t(id)])
          throw std::invalid_argument("input '" + n.name + "' holds data of the wrong shape or dtype");
        ptr[id] = q8_layout_of(id, it->second);
        break;
      }
      case luminal::Step::Constant:
        ptr[id] = constants_.at(id).buf->ptr;
        break;
      case luminal::Step::Iota: {
        auto c = constants_.find(id);
        if (c != constants_.end()) {
          ptr[id] = c->second.buf->ptr;
          break;
        }
        auto off = L_.iota_off.find(id);
        if (off != L_.iota_off.end()) {
          ptr[id] = iota_->ptr + off->second;
          break;
        }
        ptr[id] = out_ptr();
        auto& host = L_.iota.at(id);
        if (host.nbytes()) check(driver().cuMemcpyHtoD(ptr[id], host.data.get(), host.nbytes()), "cuMemcpyHtoD", "Iota");
        break;
      }
      case luminal::Step::Alias: {
        int64_t src = n.inputs[0].node;
        DeviceArray a = array_of(src);
        a.shape = plan.shape(id);
        results[id] = convert(a, n.dtype);  // an input kept in the compute dtype is read back in its own
        break;
      }
      case luminal::Step::Kernel: {
        if (done[i] || cs.absorbed) break;  // computed by its group's kernel, or in a Scatter's row writes
        // A group's prologue: computed by that group's kernel (its only reader) when the group runs as one
        if (cs.prologue_of >= 0 && group_runs(size_t(cs.prologue_of))) break;
        if (cs.group >= 0 && launch_group(size_t(cs.group), out_of, in_place_of, done)) break;
        if (plan.identity(i)) {  // an identity copy: its input's buffer is the result
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
        if (!L_.cands[i].empty()) choose(i, ptrs);  // (several GEMM variants apply: the fastest)
        const Variant& v = st.variants[L_.variant[i]];
        size_t slot = L_.slot[i];
        switch (v.kind) {
          case Variant::Elements:
            if (!in_place) launch(v.fn, id, slot, L_.items[i], false, ptrs);  // (in place: no copy of the destination)
            break;
          case Variant::Warps: case Variant::MatVec: case Variant::QRows: launch(v.fn, id, slot, L_.items[i], true, ptrs); break;
          case Variant::BlockPerRow: launch(v.fn, id, slot, L_.items[i], false, ptrs, L_.grid[i].data(), L_.threads[i]); break;
          case Variant::Tiled: launch(v.fn, id, slot, L_.items[i], false, ptrs, L_.grid[i].data()); break;
          case Variant::TensorCore: launch(v.fn, id, slot, L_.items[i], false, ptrs, L_.grid[i].data(), 128); break;
          case Variant::ImplicitGemm: case Variant::ImplicitMma: {
            // k split over blocks (the splits after the views, see contraction.h): the output zeroed first
            int axes = op_as<ContractionOp>(n)->axes;
            size_t splits = slot + size_t(st.nparams - contraction_extra(int(n.inputs[0].view.rank()) - axes) + 6);
            if (L_.params[splits] > 1) launch(st.combine_fn, id, slot, L_.items[i], false, {ptr[id]});
            launch(v.fn, id, slot, L_.items[i], false, ptrs, L_.grid[i].data(), v.kind == Variant::ImplicitMma ? 128 : 256);
            break;
          }
          case Variant::Gemm128: case Variant::Gemm64: case Variant::Wgmma128: case Variant::Wgmma256:
          case Variant::Blas: case Variant::QGemm: {
            // cuBLASLt may add the product into its only reader, an Add, which then does not run (blas_add)
            BlasAdd add = v.kind == Variant::Blas ? blas_add(i, ptrs) : BlasAdd{};
            if (add.node >= 0) {
              ptr[add.node] = out_of(add.node);
              done[size_t(plan.step_of(add.node))] = 1;
            }
            launch_gemm(i, v, ptrs, add);
            break;
          }
          case Variant::QDot: {
            ptrs.push_back(ws_ ? ws_->ptr : 0);
            launch(st.prep_fn, id, slot, L_.items[i] / std::max<int64_t>(1, L_.params[slot + 3]) * (L_.params[slot + 2] / 32),
                   true, ptrs);
            launch(v.fn, id, slot, L_.items[i], false, ptrs, L_.grid[i].data(), 256);
            break;
          }
          case Variant::QMatVec: launch(v.fn, id, slot, L_.items[i], false, ptrs, L_.grid[i].data(), 256); break;
          case Variant::Flash: case Variant::FlashMma: case Variant::FlashMmaSkip: case Variant::FlashWgmma:
          case Variant::AttentionRows: case Variant::FlashDecode: case Variant::FlashDecodeMma: {
            ptrs.push_back(ws_ ? ws_->ptr : 0);
            // FlashDecode merges its key ranges itself, through the tickets (LUMINAL_CUDA_DECODE_TICKETS=0: none,
            // the combine kernel after it)
            bool tickets = is_flash_decode(v.kind) && tickets_on_;
            if (is_flash_decode(v.kind)) ptrs.push_back(tickets ? tickets_->ptr : 0);
            unsigned threads = v.threads ? v.threads : v.kind == Variant::Flash || is_flash_decode(v.kind) ? 128 : 256;
            if (is_flash_tiles(v.kind) && L_.summary_rows[i]) {
              ptrs.push_back(summaries_->ptr + L_.summary_off[i]);
              if (L_.prep_items[i]) launch(st.prep_fn, id, slot, L_.prep_items[i], true, ptrs);
            }
            launch(v.fn, id, slot, L_.items[i], false, ptrs, L_.grid[i].data(), threads, unsigned(v.smem));
            if (v.kind != Variant::AttentionRows && !tickets) {
              std::vector<CUdeviceptr> comb{ptr[id], ws_ ? ws_->ptr : 0};
              launch(st.combine_fn, id, slot, L_.rows_items[i], false, comb);
            }
            break;
          }
        }
        if (!st.rows_fn.empty()) launch(st.rows_fn, id, slot, L_.rows_items[i], false, ptrs);
        break;
      }
      case luminal::Step::Host: {
        // A user's op with only a CPU kernel, compiled with the host fallback: inputs come to the host, the result
        // goes back.
        const CustomKernel* k = &op_as<HostOp>(n)->kernel();
        std::vector<Buffer> host;
        host.reserve(n.inputs.size());
        for (auto& e : n.inputs) {
          Buffer b = Buffer::alloc(s_.storage()[size_t(e.node)], plan.shape(e.node));
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
        Buffer r = Buffer::alloc(n.dtype, plan.shape(id));
        (*k)(args, n, r);
        ptr[id] = out_ptr();
        if (r.nbytes()) check(driver().cuMemcpyHtoD(ptr[id], r.data.get(), r.nbytes()), "cuMemcpyHtoD", op_label(n));
        break;
      }
    }
    if (n.op == Op::Output && cs.kind == luminal::Step::Kernel) results[id] = owned.at(id);
    if (profile && cs.kind != luminal::Step::Input && cs.kind != luminal::Step::Constant && cs.kind != luminal::Step::Alias) {
      check(driver().cuCtxSynchronize(), "cuCtxSynchronize", op_label(n));
      std::string key = op_label(n);
      if (cs.kind == luminal::Step::Kernel) key += std::string("/") + (plan.identity(i) ? "skipped" : variant_name(st.variants[L_.variant[i]].kind));
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
