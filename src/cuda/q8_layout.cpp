#include "cuda/q8_layout.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "cuda/cublaslt.h"

namespace luminal {
namespace cuda {
namespace {

// A thread per block: its scale and its 16 pairs of quants moved between the two layouts.
const char* kSource = R"(
extern "C" __global__ void q8_split(i64 N, i64 K, const u8* in, u8* out) {
  i64 nb = K / 32;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < N * nb; i += (i64)gridDim.x * blockDim.x) {
    i64 row = i / nb, b = i - row * nb;
    const u16* q = (const u16*)(in + i * 34);
    u16* o = (u16*)(out + row * K + b * 32);
    for (int j = 0; j < 16; ++j) o[j] = q[1 + j];
    ((u16*)(out + N * K))[i] = q[0];
  }
}
extern "C" __global__ void q8_join(i64 N, i64 K, const u8* in, u8* out) {
  i64 nb = K / 32;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < N * nb; i += (i64)gridDim.x * blockDim.x) {
    i64 row = i / nb, b = i - row * nb;
    const u16* q = (const u16*)(in + row * K + b * 32);
    u16* o = (u16*)(out + i * 34);
    for (int j = 0; j < 16; ++j) o[1 + j] = q[j];
    o[0] = ((const u16*)(in + N * K))[i];
  }
}
)";

std::mutex mu;
CUfunction fns[2] = {nullptr, nullptr};

// Runs q8_split (0) or q8_join (1) and waits for it.
void rearrange(int which, CUdeviceptr in, CUdeviceptr out, int64_t N, int64_t K) {
  {
    std::lock_guard<std::mutex> l(mu);
    if (!fns[0]) {
      std::vector<CUfunction> f = load_fns(kSource, {"q8_split", "q8_join"});
      fns[0] = f[0], fns[1] = f[1];
    }
  }
  int64_t blocks = N * (K / 32);
  if (blocks == 0) return;
  unsigned grid = unsigned(std::max<int64_t>(1, std::min<int64_t>((blocks + 255) / 256, int64_t(device().sms) * 32)));
  void* args[] = {&N, &K, &in, &out};
  const char* name = which ? "q8_join" : "q8_split";
  check(driver().cuLaunchKernel(fns[which], grid, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr), "cuLaunchKernel", name);
  check(driver().cuCtxSynchronize(), "cuCtxSynchronize", name);
}

// In place: the rearranged bytes in new memory, which then becomes the buffer's (the old memory returns to the pool).
void swap_in(DeviceBuffer& b, int which, int64_t N, int64_t K) {
  check(driver().cuCtxSynchronize(), "cuCtxSynchronize", "Q8_0 layout");
  std::shared_ptr<DeviceBuffer> t = device_alloc(b.bytes);
  rearrange(which, b.ptr, t->ptr, N, K);
  std::swap(b.ptr, t->ptr);
}

}  // namespace

void q8_store_split(DeviceBuffer& b, int64_t N, int64_t K) {
  swap_in(b, 0, N, K);
  b.q8_split_rows = N, b.q8_split_k = K;
}

void q8_store_joined(DeviceBuffer& b) {
  swap_in(b, 1, b.q8_split_rows, b.q8_split_k);
  b.q8_split_rows = b.q8_split_k = 0;
}

std::shared_ptr<DeviceBuffer> q8_split_copy(CUdeviceptr in, int64_t N, int64_t K) {
  std::shared_ptr<DeviceBuffer> t = device_alloc(size_t(N * (K / 32) * 34));
  rearrange(0, in, t->ptr, N, K);
  return t;
}

void q8_join_host(const uint8_t* split, uint8_t* blocks, int64_t N, int64_t K) {
  int64_t nb = K / 32;
  for (int64_t r = 0; r < N; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* o = blocks + (r * nb + b) * 34;
      std::memcpy(o, split + N * K + (r * nb + b) * 2, 2);
      std::memcpy(o + 2, split + r * K + b * 32, 32);
    }
}

}  // namespace cuda
}  // namespace luminal
