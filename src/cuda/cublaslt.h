// cuBLASLt as one GEMM variant of a MatMul step (Variant::Blas): opened at run time with dlopen, like NVRTC, through
// our own declarations of the few entry points used, and never required: without the library the variant simply
// does not apply (`blas_unavailable_reason` says why).
//
// A step's product is out[z, m, n] = sum_k a[z, m, k] * b[z, n, k] over the kernel's views [batch..., M, N, K]
// (a does not move along n, b not along m), out contiguous. cuBLASLt reads an operand in place when it is stored in
// the compute dtype with unit stride along k (or along its rows: a transposed operand) and one batch stride;
// otherwise the operand is first copied, rounded to the compute dtype, into the runtime's workspace (the rounding
// the tensor-core kernels do while staging).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/plan.h"
#include "cuda/api.h"

namespace luminal {
namespace cuda {

// Library search: `set_cublas_dirs` takes the folders Python found (the nvidia-cublas wheels); LUMINAL_CUBLASLT
// forces a path; then the system loader (libcublasLt.so.13, .12, .so).
void set_cublas_dirs(const std::vector<std::string>& dirs);
std::string blas_unavailable_reason();  // "" when cuBLASLt opened (then blas_path() names it)
std::string blas_path();

// How cuBLASLt runs one step's product under the current dims (made on the host by blas_plan).
struct BlasGemm {
  int64_t M = 0, N = 0, K = 0, batch = 1;  // out: batch x M x N, contiguous rows
  DType compute = DType::BF16, out = DType::F32;
  struct Side {
    DType dtype = DType::F32;             // as stored
    int64_t offset = 0;                   // of the view, in elements
    bool copy = false;                    // copied into the workspace as contiguous [batch, rows, K] (compute dtype)
    std::vector<int64_t> shape, strides;  // copy: the view over [batch..., rows, K]
    bool k_major = true;                  // in place: unit stride along k (else along the rows)
    int64_t ld = 0, bstride = 0;          // in place: the other stride, and the batch stride
    size_t ws_offset = 0;                 // copy: where in the workspace
    int64_t q8_ld = 0;                    // > 0: Q8_0 rows [rows, K] `q8_ld` bytes apart from byte `offset`,
                                          // dequantised into the copy (dtype U8: the packed bytes)
    bool q8_split = false;                // ... the whole weight stored split (q8_layout.h)
  } a, b;
  size_t ws_bytes = 0;  // workspace: the copies, then cuBLASLt's own scratch
};

// The product of views `a`, `b` (kernel order [batch..., M, N, K]) with storage dtypes `as`, `bs` into an output of
// `out` dtype, as cuBLASLt runs it; false when it cannot (library missing, dtypes, shapes past its limits).
bool blas_plan(const ConcreteView& a, const ConcreteView& b, DType as, DType bs, DType out, DType compute,
               BlasGemm* g);
// The same for a product whose right operand is Q8_0 weight rows (a QMatMul over one weight, `w` its view of the
// packed rows [N, K / 32 * 34]): cuBLASLt then reads their dequantisation (blas_q8_source), made in the workspace by
// each run. `N`, `K`: the weights' shape. Needs 2-byte aligned rows. `split`: the whole weight, stored split
// (q8_layout.h).
bool blas_plan_q8(const ConcreteView& a, const ConcreteView& w, int64_t N, int64_t K, DType as, DType out,
                  DType compute, bool split, BlasGemm* g);
// The copy of a side into the workspace, as blas_run launches it (exposed with its kernel's source for tests without a
// GPU): the view's axes that line up merged (a contiguous view is one row), then 8 elements a thread with 16-byte
// loads and stores (copy_rows8) where k has unit stride and every row starts 16-byte aligned, else an element a
// thread (copy_rows). `in_addr`: the view's first element's address (only its alignment matters).
struct BlasCopy {
  bool vec = false;
  int64_t rows = 0, K = 0;
  int rank = 0;                      // row axes + 1 (k)
  int64_t n[8] = {}, s[8] = {};      // the row axes' sizes and strides, then k's stride (at rank - 1)
  unsigned grid[2] = {1, 1};
};
BlasCopy blas_copy_layout(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, uint64_t in_addr,
                          DType from, int sms);
std::string blas_copy_source(DType from, DType to);  // copy_rows and copy_rows8 (NVRTC source, prelude first)
std::string blas_q8_source(DType to);  // q8_rows: Q8_0 rows dequantised into contiguous rows (NVRTC source, prelude first)
// A module of `source` (after the prelude) compiled for this device and loaded: its functions `names`, in order (the
// runtime's own small kernels: copies, Q8_0 layouts).
std::vector<CUfunction> load_fns(const std::string& source, std::initializer_list<const char*> names);
// Runs it on `stream` (a's and b's buffers and the output; `ws`: at least g.ws_bytes). Raises CudaError naming the
// failing call and its status. `a_copied`: a's copy is in the workspace already (the caller knows it unchanged).
// `c` (float32 output only): out = a.b + c, where c has out's layout and is out itself or apart from it (cuBLASLt's
// in-place rule); the first call of a shape then times its algorithms into `scratch` (out's size, apart from the
// operands and c), not into out.
void blas_run(const BlasGemm& g, CUdeviceptr a, CUdeviceptr b, CUdeviceptr out, CUdeviceptr ws, CUstream stream,
              bool a_copied = false, CUdeviceptr c = 0, CUdeviceptr scratch = 0);
// Whether blas_run with these arguments issues only stream work (copies, the product), so that it may be captured
// into a CUDA graph: its algorithm chosen (timed) and its copy kernels loaded by an earlier call.
bool blas_ready(const BlasGemm& g, CUdeviceptr a, CUdeviceptr b, CUdeviceptr out, CUdeviceptr ws, CUdeviceptr c = 0,
                CUdeviceptr scratch = 0);

}  // namespace cuda
}  // namespace luminal
