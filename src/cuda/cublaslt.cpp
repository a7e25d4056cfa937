#include "cuda/cublaslt.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <type_traits>

#include "cuda/codegen.h"

namespace luminal {
namespace cuda {
namespace {

// cublasLt.h's types, declared here (no header needed to build): opaque handles, the algorithm (8 words) and a
// heuristic's result, as laid out there.
using Status = int;
using LtHandle = struct LtContext*;
using LtDesc = struct LtMatmulDesc*;
using LtLayout = struct LtMatrixLayout*;
using LtPref = struct LtPreference*;
struct LtAlgo {
  uint64_t data[8];
};
struct LtHeuristic {
  LtAlgo algo;
  size_t workspace;
  Status state;
  float waves;
  int reserved[4];
};
// Enum values from cublasLt.h, library_types.h and cublas_api.h.
enum : int {
  CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14,  // cudaDataType
  COMPUTE_32F = 68,                                  // cublasComputeType_t
  OP_N = 0, OP_T = 1,                                // cublasOperation_t
  DESC_TRANSA = 3, DESC_TRANSB = 4,                  // cublasLtMatmulDescAttributes_t
  LAYOUT_BATCH_COUNT = 5, LAYOUT_BATCH_STRIDE = 6,   // cublasLtMatrixLayoutAttribute_t
  PREF_MAX_WORKSPACE = 1, PREF_ALIGN_A = 5, PREF_ALIGN_B = 6, PREF_ALIGN_C = 7, PREF_ALIGN_D = 8,
};

struct Lt {
  Status (*cublasLtCreate)(LtHandle*);
  size_t (*cublasLtGetVersion)();
  Status (*cublasLtMatmulDescCreate)(LtDesc*, int, int);
  Status (*cublasLtMatmulDescSetAttribute)(LtDesc, int, const void*, size_t);
  Status (*cublasLtMatrixLayoutCreate)(LtLayout*, int, uint64_t, uint64_t, int64_t);
  Status (*cublasLtMatrixLayoutSetAttribute)(LtLayout, int, const void*, size_t);
  Status (*cublasLtMatmulPreferenceCreate)(LtPref*);
  Status (*cublasLtMatmulPreferenceSetAttribute)(LtPref, int, const void*, size_t);
  Status (*cublasLtMatmulPreferenceDestroy)(LtPref);
  Status (*cublasLtMatmulAlgoGetHeuristic)(LtHandle, LtDesc, LtLayout, LtLayout, LtLayout, LtLayout, LtPref, int,
                                           LtHeuristic*, int*);
  Status (*cublasLtMatmul)(LtHandle, LtDesc, const void*, const void*, LtLayout, const void*, LtLayout, const void*,
                           const void*, LtLayout, void*, LtLayout, const LtAlgo*, void*, size_t, CUstream);
};

// cuBLASLt's own scratch: what it is allowed per call (split-k and stream-k algorithms use it).
constexpr size_t kLtWorkspace = size_t(32) << 20;

std::mutex mu;
std::vector<std::string> dirs;
bool tried = false;
std::string error, opened;
Lt lt{};

const char* status_name(Status s) {
  switch (s) {
    case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
    case 7: return "CUBLAS_STATUS_INVALID_VALUE";
    case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case 11: return "CUBLAS_STATUS_MAPPING_ERROR";
    case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case 16: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "unknown cuBLAS status";
}

void lt_check(Status s, const char* call) {
  if (s) throw CudaError(std::string(call) + " failed: " + status_name(s) + " (" + std::to_string(s) + ")");
}

// Opens the library once (under mu); a failure is remembered as the reason.
const Lt* load() {
  if (tried) return error.empty() ? &lt : nullptr;
  tried = true;
  const char* names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
  std::vector<std::string> cands;
  if (const char* forced = std::getenv("LUMINAL_CUBLASLT")) {
    cands.push_back(forced);  // the only candidate
  } else {
    for (auto& d : dirs)
      for (auto n : names) cands.push_back(d + "/" + n);
    for (const char* env : {"CUDA_HOME", "CUDA_PATH"})
      if (const char* root = std::getenv(env))
        for (auto n : names) cands.push_back(std::string(root) + "/lib64/" + n);
    for (auto n : names) cands.push_back(n);
  }
  void* h = nullptr;
  std::string tries;
  for (auto& c : cands) {
    if ((h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL))) {
      opened = c;
      break;
    }
    const char* e = dlerror();
    tries += "\n  " + c + ": " + (e ? e : "not found");
  }
  if (!h) {
    error = "cannot open cuBLASLt (install the nvidia-cublas wheel, or set LUMINAL_CUBLASLT); tried:" + tries;
    return nullptr;
  }
  auto bind = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
    if (!fn && error.empty()) error = opened + " lacks the entry point " + name;
  };
  bind(lt.cublasLtCreate, "cublasLtCreate");
  bind(lt.cublasLtGetVersion, "cublasLtGetVersion");
  bind(lt.cublasLtMatmulDescCreate, "cublasLtMatmulDescCreate");
  bind(lt.cublasLtMatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  bind(lt.cublasLtMatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  bind(lt.cublasLtMatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute");
  bind(lt.cublasLtMatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  bind(lt.cublasLtMatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  bind(lt.cublasLtMatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  bind(lt.cublasLtMatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  bind(lt.cublasLtMatmul, "cublasLtMatmul");
  return error.empty() ? &lt : nullptr;
}

const Lt* library() {
  std::lock_guard<std::mutex> l(mu);
  return load();
}

LtHandle handle() {
  static LtHandle h = [] {
    device();  // (its context current: cuBLASLt runs in it)
    LtHandle x = nullptr;
    lt_check(lt.cublasLtCreate(&x), "cublasLtCreate");
    return x;
  }();
  return h;
}

int data_type(DType d) { return d == DType::F32 ? CUDA_R_32F : d == DType::F16 ? CUDA_R_16F : CUDA_R_16BF; }

// The stride of axes [lo, hi) of a view read as one axis (the innermost moving axis's stride; 0 when none moves),
// or -1 when they do not line up.
int64_t merged_stride(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, size_t lo, size_t hi) {
  int64_t stride = 0, span = -1;  // span: the next outer axis's stride if it continues the inner ones
  for (size_t d = hi; d-- > lo;) {
    if (shape[d] == 1) continue;
    if (span < 0) stride = strides[d];
    else if (strides[d] != span) return -1;
    span = strides[d] * shape[d];
  }
  return stride;
}

// Side `s` read in place when it can be, over its [batch..., rows, K] view (batch axes merged into one stride, or with
// `fold` into the rows).
void place(BlasGemm::Side& s, int64_t rows, int64_t K, DType compute, bool fold) {
  size_t n = s.shape.size();
  s.copy = true;
  if (s.dtype != compute) return;
  int64_t sr = fold ? merged_stride(s.shape, s.strides, 0, n - 1) : s.strides[n - 2], sk = s.strides[n - 1];
  int64_t bs = fold ? 0 : merged_stride(s.shape, s.strides, 0, n - 2);
  if (sr < 0 || bs < 0) return;
  if (sk == 1 || K == 1) {
    s.k_major = true;
    s.ld = rows == 1 ? K : sr;
    if (s.ld < K) return;
  } else if (sr == 1 || rows == 1) {
    s.k_major = false;
    s.ld = K == 1 ? rows : sk;
    if (s.ld < rows) return;
  } else {
    return;
  }
  s.bstride = bs;
  s.copy = false;
}

// The copy of a view into contiguous rows of another dtype (see BlasCopy), compiled on first use per pair of dtypes.
struct View8 {
  int64_t n[8], s[8];
};
std::string copy_source(DType from, DType to) {
  std::string f = dtype_name(from), t = dtype_name(to);
  return "struct View8 { i64 n[8], s[8]; };\n"
         // A block per row (its index unravelled once), threads along k.
         "extern \"C\" __global__ void copy_rows(i64 rows, i64 K, int rank, View8 v, const void* in, void* out) {\n"
         "  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {\n"
         "    i64 r = row, o = 0;\n"
         "    for (int d = rank - 2; d >= 0; --d) { i64 q = r / v.n[d]; o += (r - q * v.n[d]) * v.s[d]; r = q; }\n"
         "    for (i64 k = threadIdx.x; k < K; k += blockDim.x)\n"
         "      st_" + t + "(out, row * K + k, ld_" + f + "(in, o + k * v.s[rank - 1]));\n  }\n}\n"
         // Unit stride along k, rows 16-byte aligned: blocks along y over rows, along x over a row's chunks of 8;
         // K past its last chunk (a single row only) element by element.
         // (Paired rounding needs sm_80: an older GPU keeps copy_rows.)
         "extern \"C\" __global__ void copy_rows8(i64 rows, i64 K, int rank, View8 v, const void* in, void* out) {\n"
         "#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800\n"
         "  i64 chunks = K >> 3;\n"
         "  for (i64 row = blockIdx.y; row < rows; row += gridDim.y) {\n"
         "    i64 r = row, o = 0;\n"
         "    for (int d = rank - 2; d >= 0; --d) { i64 q = r / v.n[d]; o += (r - q * v.n[d]) * v.s[d]; r = q; }\n"
         "    for (i64 c = blockIdx.x * (i64)blockDim.x + threadIdx.x; c < chunks; c += (i64)gridDim.x * blockDim.x) {\n"
         "      float x[8];\n"
         "      ld8_" + f + "(in, o + 8 * c, x);\n"
         "      uint4 u;\n"
         "      u.x = pack_" + t + "(x[0], x[1]); u.y = pack_" + t + "(x[2], x[3]);\n"
         "      u.z = pack_" + t + "(x[4], x[5]); u.w = pack_" + t + "(x[6], x[7]);\n"
         "      *(uint4*)((u16*)out + row * K + 8 * c) = u;\n"
         "    }\n"
         "    if (blockIdx.x == 0)\n"
         "      for (i64 k = 8 * chunks + threadIdx.x; k < K; k += blockDim.x) st_" + t + "(out, row * K + k, ld_" + f +
         "(in, o + k));\n"
         "  }\n#endif\n}\n";
}
// Q8_0 rows (34-byte blocks: an f16 scale, then 32 int8 quants; rows `ld` bytes apart, 2-byte aligned; ld 0: the
// whole weight stored split, see q8_layout.h) dequantised into contiguous rows of K values in a 16-bit dtype: a
// thread per block, its values scale * quant rounded once, as they are stored (16-byte stores).
std::string q8_source(DType to) {
  std::string t = dtype_name(to);
  return "extern \"C\" __global__ void q8_rows(i64 rows, i64 K, i64 ld, const void* in, void* out) {\n"
         "  i64 nb = K / 32;\n"
         "  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < rows * nb; i += (i64)gridDim.x * blockDim.x) {\n"
         "    i64 row = i / nb, b = i - row * nb;\n"
         "    const u16* q = ld ? (const u16*)((const u8*)in + row * ld + b * 34) : (const u16*)((const u8*)in + row * K + b * 32) - 1;\n"
         "    float d = f16_f32(ld ? q[0] : ((const u16*)((const u8*)in + rows * K))[i]);\n"
         "    uint4* o = (uint4*)((u16*)out + row * K + b * 32);\n"
         "#pragma unroll\n"
         "    for (int j = 0; j < 4; ++j) {\n"
         "      float x[8];\n"
         "#pragma unroll\n"
         "      for (int e = 0; e < 4; ++e) {\n"
         "        u16 w = q[1 + 4 * j + e];\n"
         "        x[2 * e] = d * (float)(signed char)(w & 255);\n"
         "        x[2 * e + 1] = d * (float)(signed char)(w >> 8);\n"
         "      }\n"
         "      uint4 u;\n"
         "      u.x = pack_" + t + "(x[0], x[1]); u.y = pack_" + t + "(x[2], x[3]);\n"
         "      u.z = pack_" + t + "(x[4], x[5]); u.w = pack_" + t + "(x[6], x[7]);\n"
         "      o[j] = u;\n"
         "    }\n  }\n}\n";
}
std::mutex copy_mu;
std::map<std::pair<int, int>, std::pair<CUfunction, CUfunction>> copy_loaded;
std::map<int, CUfunction> q8_loaded;
CUfunction q8_fn(DType to) {
  std::lock_guard<std::mutex> l(copy_mu);
  auto it = q8_loaded.find(int(to));
  if (it != q8_loaded.end()) return it->second;
  return q8_loaded[int(to)] = load_fns(q8_source(to), {"q8_rows"})[0];
}
std::pair<CUfunction, CUfunction> copy_fns(DType from, DType to) {
  std::lock_guard<std::mutex> l(copy_mu);
  auto key = std::make_pair(int(from), int(to));
  auto it = copy_loaded.find(key);
  if (it != copy_loaded.end()) return it->second;
  std::vector<CUfunction> f = load_fns(copy_source(from, to), {"copy_rows", "copy_rows8"});
  return copy_loaded[key] = {f[0], f[1]};
}

void copy_side(const BlasGemm::Side& s, DType to, CUdeviceptr in, CUdeviceptr out, CUstream stream) {
  in += CUdeviceptr(s.offset * int64_t(dtype_size(s.dtype)));  // (the kernel's offsets then start at 0)
  if (s.q8_ld > 0) {
    int64_t rows = s.shape[0], K = s.shape[1], ld = s.q8_split ? 0 : s.q8_ld;
    int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((rows * (K / 32) + 255) / 256, int64_t(device().sms) * 32));
    void* args[] = {&rows, &K, &ld, &in, &out};
    check(driver().cuLaunchKernel(q8_fn(to), unsigned(blocks), 1, 1, 256, 1, 1, 0, stream, args, nullptr),
          "cuLaunchKernel", "q8_rows");
    return;
  }
  BlasCopy c = blas_copy_layout(s.shape, s.strides, in, s.dtype, device().sms);
  if (device().major < 8) {  // (copy_rows8 does nothing there)
    c.vec = false;
    c.grid[0] = unsigned(std::max<int64_t>(1, std::min<int64_t>(c.rows, int64_t(device().sms) * 16)));
    c.grid[1] = 1;
  }
  View8 v{};
  for (int d = 0; d < 8; ++d) v.n[d] = c.n[d], v.s[d] = c.s[d];
  void* args[] = {&c.rows, &c.K, &c.rank, &v, &in, &out};
  auto fns = copy_fns(s.dtype, to);
  check(driver().cuLaunchKernel(c.vec ? fns.second : fns.first, c.grid[0], c.grid[1], 1, 256, 1, 1, 0, stream, args,
                                nullptr),
        "cuLaunchKernel", c.vec ? "copy_rows8" : "copy_rows");
}

// A product's descriptors and its algorithm (see prepare), per shape, layout and alignment (kept for the process: a
// handful per model).
struct Prepared {
  LtDesc desc = nullptr;
  LtLayout a = nullptr, b = nullptr, d = nullptr;  // cuBLASLt's A (our b), B (our a), C = D
  LtAlgo algo{};
};

unsigned alignment(CUdeviceptr p) {
  unsigned al = 256;
  while (al > 1 && p % al) al >>= 1;
  return al;
}

std::mutex prep_mu;
std::map<std::vector<int64_t>, Prepared> prepared;

// The operand cuBLASLt reads for side `s` (its buffer at `p`): in place, or its copy in the workspace.
CUdeviceptr operand_ptr(const BlasGemm::Side& s, CUdeviceptr p, CUdeviceptr ws) {
  return s.copy ? ws + s.ws_offset : p + CUdeviceptr(s.offset * int64_t(dtype_size(s.dtype)));
}

// C and D share one layout (and alignment): D = out, C = `c` when accumulating; `target` is what timing writes
// (out, or a scratch buffer of out's size when D may be C: timing runs must not change C).
unsigned out_alignment(CUdeviceptr out, CUdeviceptr c, CUdeviceptr target) {
  return std::min({alignment(out), c ? alignment(c) : 256u, alignment(target)});
}

// A side's layout as cuBLASLt reads it: its leading dimension, whether k is its unit-stride axis, its batch stride.
int64_t side_ld(const BlasGemm::Side& s, int64_t K) { return s.copy ? K : s.ld; }
bool side_k_major(const BlasGemm::Side& s) { return s.copy || s.k_major; }
int64_t side_bstride(const BlasGemm::Side& s, int64_t rows, int64_t K, int64_t batch) {
  return !s.copy ? s.bstride : batch > 1 && s.shape.size() > 2 ? rows * K : 0;
}

std::vector<int64_t> prepare_key(const BlasGemm& g, CUdeviceptr pa, CUdeviceptr pb, unsigned align_d) {
  auto ld = side_ld;
  auto km = side_k_major;
  auto bst = side_bstride;
  return {g.M, g.N, g.K, g.batch, int64_t(g.compute), int64_t(g.out), km(g.a), km(g.b), ld(g.a, g.K), ld(g.b, g.K),
          bst(g.a, g.M, g.K, g.batch), bst(g.b, g.N, g.K, g.batch), alignment(pa), alignment(pb), align_d};
}

// (Timing the candidates runs them on the call's own operands: pa, pb, ws on `stream`, writing `target`.)
const Prepared& prepare(const BlasGemm& g, CUdeviceptr pa, CUdeviceptr pb, unsigned align_d, CUdeviceptr target,
                        CUdeviceptr ws, CUstream stream) {
  unsigned align_a = alignment(pa), align_b = alignment(pb);
  CUdeviceptr out = target;
  auto ld = side_ld;
  auto km = side_k_major;
  auto bst = side_bstride;
  int64_t lda = ld(g.a, g.K), ldb = ld(g.b, g.K);
  int64_t sa = bst(g.a, g.M, g.K, g.batch), sb = bst(g.b, g.N, g.K, g.batch);
  bool ka = km(g.a), kb = km(g.b);
  std::vector<int64_t> key = prepare_key(g, pa, pb, align_d);
  std::lock_guard<std::mutex> l(prep_mu);
  auto it = prepared.find(key);
  if (it != prepared.end()) return it->second;
  LtHandle h = handle();
  Prepared p;
  lt_check(lt.cublasLtMatmulDescCreate(&p.desc, COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  // Column-major: out^T (N x M) = op(b) op(a)^T..., i.e. cuBLASLt's A is our b (N x K), its B our a^T (K x M).
  int32_t ta = kb ? OP_T : OP_N, tb = ka ? OP_N : OP_T;
  lt_check(lt.cublasLtMatmulDescSetAttribute(p.desc, DESC_TRANSA, &ta, sizeof ta), "cublasLtMatmulDescSetAttribute");
  lt_check(lt.cublasLtMatmulDescSetAttribute(p.desc, DESC_TRANSB, &tb, sizeof tb), "cublasLtMatmulDescSetAttribute");
  int ct = data_type(g.compute);
  auto layout = [&](LtLayout* lay, int type, int64_t rows, int64_t cols, int64_t ldx, int64_t stride) {
    lt_check(lt.cublasLtMatrixLayoutCreate(lay, type, uint64_t(rows), uint64_t(cols), ldx), "cublasLtMatrixLayoutCreate");
    if (g.batch > 1) {
      int32_t count = int32_t(g.batch);
      lt_check(lt.cublasLtMatrixLayoutSetAttribute(*lay, LAYOUT_BATCH_COUNT, &count, sizeof count),
               "cublasLtMatrixLayoutSetAttribute");
      lt_check(lt.cublasLtMatrixLayoutSetAttribute(*lay, LAYOUT_BATCH_STRIDE, &stride, sizeof stride),
               "cublasLtMatrixLayoutSetAttribute");
    }
  };
  if (kb) layout(&p.a, ct, g.K, g.N, ldb, sb);
  else layout(&p.a, ct, g.N, g.K, ldb, sb);
  if (ka) layout(&p.b, ct, g.K, g.M, lda, sa);
  else layout(&p.b, ct, g.M, g.K, lda, sa);
  layout(&p.d, data_type(g.out), g.N, g.M, g.N, g.M * g.N);
  LtPref pref = nullptr;
  lt_check(lt.cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  uint64_t ws_max = kLtWorkspace;
  uint32_t al[4] = {align_b, align_a, align_d, align_d};  // (cuBLASLt's A is our b)
  Status s = lt.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE, &ws_max, sizeof ws_max);
  for (int k = 0; k < 4 && !s; ++k)
    s = lt.cublasLtMatmulPreferenceSetAttribute(pref, PREF_ALIGN_A + k, &al[k], sizeof al[k]);
  // The heuristic's first algorithm, or (LUMINAL_CUDA_TUNE not 0) the fastest of its first 8 on these operands:
  // its first was seen to be a slower kernel family than torch's for some of the 8B model's shapes.
  const char* tune = std::getenv("LUMINAL_CUDA_TUNE");
  LtHeuristic res[8] = {};
  int found = 0;
  if (!s) s = lt.cublasLtMatmulAlgoGetHeuristic(h, p.desc, p.a, p.b, p.d, p.d, pref, tune && std::string(tune) == "0" ? 1 : 8,
                                                res, &found);
  lt.cublasLtMatmulPreferenceDestroy(pref);
  lt_check(s, "cublasLtMatmulAlgoGetHeuristic");
  if (!found)
    throw CudaError("cublasLtMatmulAlgoGetHeuristic found no algorithm for " + std::to_string(g.batch) + " x " +
                    std::to_string(g.M) + " x " + std::to_string(g.N) + " x " + std::to_string(g.K));
  p.algo = res[0].algo;
  if (found > 1) {
    const Driver& dr = driver();
    CUevent ev[2] = {nullptr, nullptr};
    float alpha = 1.0f, beta = 0.0f, best = 0, first = 0;
    int pick = 0;
    try {
      for (auto& e : ev) check(dr.cuEventCreate(&e, 0), "cuEventCreate");
      auto run = [&](const LtAlgo& al) {
        return lt.cublasLtMatmul(h, p.desc, &alpha, reinterpret_cast<const void*>(pb), p.a,
                                 reinterpret_cast<const void*>(pa), p.b, &beta, reinterpret_cast<const void*>(out), p.d,
                                 reinterpret_cast<void*>(out), p.d, &al, reinterpret_cast<void*>(ws), kLtWorkspace,
                                 stream);
      };
      for (int j = 0; j < found; ++j) {
        if (res[j].state || res[j].workspace > kLtWorkspace || run(res[j].algo)) continue;  // (one that cannot run)
        check(dr.cuEventRecord(ev[0], stream), "cuEventRecord");
        for (int r = 0; r < 3; ++r) lt_check(run(res[j].algo), "cublasLtMatmul");
        check(dr.cuEventRecord(ev[1], stream), "cuEventRecord");
        check(dr.cuEventSynchronize(ev[1]), "cuEventSynchronize");
        float ms = 0;
        check(dr.cuEventElapsedTime(&ms, ev[0], ev[1]), "cuEventElapsedTime");
        if (j == 0) first = ms;
        if (!best || ms < best) best = ms, pick = j, p.algo = res[j].algo;
      }
    } catch (...) {
      for (auto& e : ev) if (e) dr.cuEventDestroy(e);
      throw;
    }
    for (auto& e : ev) dr.cuEventDestroy(e);
    if (const char* t = std::getenv("LUMINAL_CUDA_TUNE_LOG"); t && *t && std::string(t) != "0")
      std::fprintf(stderr, "luminal tune: cuBLASLt %lld x %lld x %lld x %lld: algorithm %d of %d, %.4f ms (the first: %.4f)\n",
                   (long long)g.batch, (long long)g.M, (long long)g.N, (long long)g.K, pick, found, best / 3,
                   first / 3);
  }
  return prepared.emplace(key, p).first->second;
}

}  // namespace

// The copy kernels' module of `source` (after the prelude) compiled for this device and loaded, and its function
// `name`s, in order.
std::vector<CUfunction> load_fns(const std::string& source, std::initializer_list<const char*> names) {
  const Device& dev = device();
  std::string cubin = compile_cubin(std::string(prelude()) + source, dev.major * 10 + dev.minor);
  CUmodule mod;
  check(driver().cuModuleLoadData(&mod, cubin.data()), "cuModuleLoadData", *names.begin());
  std::vector<CUfunction> fns;
  for (const char* name : names) {
    fns.emplace_back();
    check(driver().cuModuleGetFunction(&fns.back(), mod, name), "cuModuleGetFunction", name);
  }
  return fns;
}

void set_cublas_dirs(const std::vector<std::string>& d) {
  std::lock_guard<std::mutex> l(mu);
  dirs = d;
}

std::string blas_unavailable_reason() {
  std::lock_guard<std::mutex> l(mu);
  load();
  return error;
}

std::string blas_path() {
  const Lt* L = library();
  return L ? opened + " (version " + std::to_string(L->cublasLtGetVersion()) + ")" : "";
}

BlasCopy blas_copy_layout(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, uint64_t in_addr,
                          DType from, int sms) {
  // Axes outer to inner, k last; size-1 row axes dropped, then an axis merged into the inner one it continues (a
  // row axis into k too: the output's rows are contiguous).
  std::vector<int64_t> n, st;
  size_t r = shape.size();
  for (size_t d = 0; d < r; ++d)
    if (shape[d] != 1 || d + 1 == r) n.push_back(shape[d]), st.push_back(strides[d]);
  for (size_t j = n.size(); j-- > 1;)
    if (st[j - 1] == n[j] * st[j]) {
      n[j] *= n[j - 1];
      n.erase(n.begin() + long(j - 1));
      st.erase(st.begin() + long(j - 1));
    }
  BlasCopy c;
  c.rank = int(n.size());
  c.K = n.back();
  c.rows = 1;
  for (int d = 0; d + 1 < c.rank; ++d) c.rows *= n[size_t(d)], c.n[d] = n[size_t(d)], c.s[d] = st[size_t(d)];
  c.s[c.rank - 1] = st.back();
  int64_t size = int64_t(dtype_size(from)), blocks = int64_t(std::max(sms, 1)) * 8;
  c.vec = st.back() == 1 && in_addr % 16 == 0 && (c.K % 8 == 0 || c.rows == 1);
  for (int d = 0; d + 1 < c.rank; ++d) c.vec = c.vec && c.s[d] * size % 16 == 0;
  if (c.vec) {
    int64_t gx = std::min<int64_t>(std::max<int64_t>(1, (c.K / 8 + 255) / 256), blocks);
    c.grid[0] = unsigned(gx);
    c.grid[1] = unsigned(std::max<int64_t>(1, std::min<int64_t>({c.rows, (blocks + gx - 1) / gx, 65535})));
  } else {
    c.grid[0] = unsigned(std::max<int64_t>(1, std::min<int64_t>(c.rows, blocks * 2)));
  }
  return c;
}

std::string blas_copy_source(DType from, DType to) { return copy_source(from, to); }
std::string blas_q8_source(DType to) { return q8_source(to); }

bool blas_plan(const ConcreteView& a, const ConcreteView& b, DType as, DType bs, DType out, DType compute,
               BlasGemm* g) {
  size_t r = a.shape.size();
  if ((compute != DType::BF16 && compute != DType::F16) || (out != DType::F32 && out != compute)) return false;
  if (!is_float(as) || !is_float(bs) || r < 3 || r > 9 || b.shape.size() != r || a.masked || b.masked) return false;
  if (a.strides[r - 2] != 0 || b.strides[r - 3] != 0 || !library()) return false;
  BlasGemm G;
  G.compute = compute;
  G.out = out;
  G.M = a.shape[r - 3], G.N = a.shape[r - 2], G.K = a.shape[r - 1];
  for (size_t d = 0; d + 3 < r; ++d) G.batch *= a.shape[d];
  if (G.M <= 0 || G.N <= 0 || G.K <= 0 || G.batch > INT32_MAX || G.M * G.batch > INT32_MAX || G.N > INT32_MAX ||
      G.K > INT32_MAX)
    return false;
  auto side = [&](BlasGemm::Side& s, const ConcreteView& v, size_t drop, DType dt) {
    s.dtype = dt;
    s.offset = v.offset;
    for (size_t d = 0; d < r; ++d)
      if (d != drop) {
        s.shape.push_back(v.shape[d]);
        s.strides.push_back(v.strides[d]);
      }
  };
  side(G.a, a, r - 2, as);
  side(G.b, b, r - 3, bs);
  // Weights shared by every batch (a Linear over [batch, tokens, features]): one product of batch x M rows.
  bool shared = G.batch > 1 && merged_stride(G.b.shape, G.b.strides, 0, r - 3) == 0;
  if (shared) {
    G.M *= G.batch;
    G.batch = 1;
    G.b.shape.erase(G.b.shape.begin(), G.b.shape.end() - 2);
    G.b.strides.erase(G.b.strides.begin(), G.b.strides.end() - 2);
  }
  place(G.a, G.M, G.K, compute, shared);
  place(G.b, G.N, G.K, compute, false);
  size_t at = 0;
  for (BlasGemm::Side* s : {&G.a, &G.b})
    if (s->copy) {
      s->ws_offset = at;
      int64_t n = 1;
      for (int64_t x : s->shape) n *= x;
      at += (size_t(n) * dtype_size(compute) + 255) / 256 * 256;
    }
  G.ws_bytes = at + kLtWorkspace;
  *g = std::move(G);
  return true;
}

bool blas_plan_q8(const ConcreteView& a, const ConcreteView& w, int64_t N, int64_t K, DType as, DType out,
                  DType compute, bool split, BlasGemm* g) {
  // The left operand as blas_plan takes it, against a stand-in right view of the weights' dequantisation (a
  // contiguous [N, K] shared by every batch and row), then the right side made the Q8_0 copy.
  size_t r = a.shape.size();
  if (w.shape.size() != 2 || w.masked || K % 32 || w.shape[0] != N || w.shape[1] != K / 32 * 34 || w.strides[1] != 1 ||
      w.offset % 2 || w.strides[0] % 2 || r < 3 || a.shape[r - 2] != N || a.shape[r - 1] != K ||
      (split && (w.offset != 0 || w.strides[0] != K / 32 * 34)))  // (split: the whole weight, see q8_layout.h)
    return false;
  ConcreteView b = a;
  for (size_t d = 0; d < r; ++d) b.strides[d] = 0;
  b.strides[r - 2] = K, b.strides[r - 1] = 1, b.offset = 0;
  b.lo.clear(), b.hi.clear(), b.masked = false;
  if (!blas_plan(a, b, as, compute, out, compute, g) || device().major < 8) return false;  // (q8_rows: sm_80 packs)
  BlasGemm::Side& s = g->b;
  s.dtype = DType::U8;
  s.offset = w.offset;
  s.q8_ld = w.strides[0];
  s.q8_split = split;
  s.shape = {N, K};
  s.strides = {K, 1};
  // (blas_plan read the stand-in in place: the copy goes after the left side's, if any)
  size_t at = g->ws_bytes - kLtWorkspace;
  s.copy = true;
  s.ws_offset = at;
  g->ws_bytes = at + (size_t(N * K) * dtype_size(compute) + 255) / 256 * 256 + kLtWorkspace;
  return true;
}

bool blas_ready(const BlasGemm& g, CUdeviceptr a, CUdeviceptr b, CUdeviceptr out, CUdeviceptr ws, CUdeviceptr c,
                CUdeviceptr scratch) {
  if (!library()) return false;
  {
    std::lock_guard<std::mutex> l(copy_mu);
    for (const BlasGemm::Side* s : {&g.a, &g.b})
      if (s->copy && !(s->q8_ld > 0 ? q8_loaded.count(int(g.compute)) : copy_loaded.count({int(s->dtype), int(g.compute)})))
        return false;
  }
  unsigned align_d = out_alignment(out, c, c ? scratch : out);
  std::vector<int64_t> key = prepare_key(g, operand_ptr(g.a, a, ws), operand_ptr(g.b, b, ws), align_d);
  std::lock_guard<std::mutex> l(prep_mu);
  return prepared.count(key) != 0;
}

void blas_run(const BlasGemm& g, CUdeviceptr a, CUdeviceptr b, CUdeviceptr out, CUdeviceptr ws, CUstream stream,
              bool a_copied, CUdeviceptr c, CUdeviceptr scratch) {
  if (!library()) throw CudaError(blas_unavailable_reason());
  CUdeviceptr pa = operand_ptr(g.a, a, ws), pb = operand_ptr(g.b, b, ws);
  if (g.a.copy && !a_copied) copy_side(g.a, g.compute, a, pa, stream);
  if (g.b.copy) copy_side(g.b, g.compute, b, pb, stream);
  size_t copies = g.ws_bytes - kLtWorkspace;
  CUdeviceptr target = c ? scratch : out;
  const Prepared& p = prepare(g, pa, pb, out_alignment(out, c, target), target, ws + copies, stream);
  float alpha = 1.0f, beta = c ? 1.0f : 0.0f;  // (beta 1: D = A.B + C, in float32)
  lt_check(lt.cublasLtMatmul(handle(), p.desc, &alpha, reinterpret_cast<const void*>(pb), p.a,
                             reinterpret_cast<const void*>(pa), p.b, &beta,
                             reinterpret_cast<const void*>(c ? c : out), p.d, reinterpret_cast<void*>(out), p.d,
                             &p.algo, reinterpret_cast<void*>(ws + copies), kLtWorkspace, stream),
           "cublasLtMatmul");
}

}  // namespace cuda
}  // namespace luminal
