// Q8_0 weights stored split on the GPU. GGUF's Q8_0 rows are 34-byte blocks (an f16 scale, then 32 int8 quants),
// only 2-byte aligned, so a kernel must read them in 2-byte pieces. Stored split, a weight of N rows and K columns
// holds the quants' rows first (N x K bytes: a lane's 8 quants are one 8-byte load), then the scales' (N x K / 32
// f16): the same bytes, rearranged. The code generator chooses which graph inputs its kernels read split
// (Module::q8_split); the runtime rearranges their arrays when it runs (in place: the array's buffer then says so,
// and reading it back joins the blocks again; borrowed memory is never rearranged: a split copy is made per run).
#pragma once
#include <cstdint>

#include "cuda/runtime.h"

namespace luminal {
namespace cuda {

// Rearranges `b` (N rows of K / 32 blocks) into the split layout, or back (join), on the device, in place: the
// buffer's memory is replaced (the device is synchronised first: queued runs may still read the old layout).
void q8_store_split(DeviceBuffer& b, int64_t N, int64_t K);
void q8_store_joined(DeviceBuffer& b);
// A split copy of `in` (N rows of K / 32 blocks, as given) in new memory.
std::shared_ptr<DeviceBuffer> q8_split_copy(CUdeviceptr in, int64_t N, int64_t K);
// On the host: `split` (N x K quants, then N x K / 32 scales) as GGUF blocks into `blocks`.
void q8_join_host(const uint8_t* split, uint8_t* blocks, int64_t N, int64_t K);

}  // namespace cuda
}  // namespace luminal
