// The memory plan: every intermediate buffer gets an offset in one arena, from when it is made to its last read.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace luminal {

constexpr size_t kArenaAlign = 64;  // a cache line, and the widest vector load

// Buffer i is made at step first[i] and last read at step last[i] (>= first[i]). Assigns offsets (multiples of
// kArenaAlign) so that buffers alive at the same step never overlap; a buffer made at step t never shares space
// with one read at t (kernels read their inputs while writing their output). First fit over the free gaps, in
// step order. Returns the arena size in bytes.
size_t plan_arena(const std::vector<size_t>& sizes, const std::vector<int64_t>& first, const std::vector<int64_t>& last,
                  std::vector<size_t>& offsets);

}  // namespace luminal
