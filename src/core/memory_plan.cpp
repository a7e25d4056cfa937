#include "core/memory_plan.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <numeric>
#include <stdexcept>

namespace luminal {

size_t plan_arena(const std::vector<size_t>& sizes, const std::vector<int64_t>& first, const std::vector<int64_t>& last,
                  std::vector<size_t>& offsets) {
  size_t n = sizes.size();
  offsets.assign(n, 0);
  std::vector<size_t> by_first(n), by_last(n);
  std::iota(by_first.begin(), by_first.end(), 0);
  std::iota(by_last.begin(), by_last.end(), 0);
  std::stable_sort(by_first.begin(), by_first.end(), [&](size_t a, size_t b) { return first[a] < first[b]; });
  std::stable_sort(by_last.begin(), by_last.end(), [&](size_t a, size_t b) { return last[a] < last[b]; });
  std::map<size_t, size_t> free_gaps;  // offset -> size, coalesced; the space past `top` is free too
  size_t top = 0, f = 0, l = 0;
  auto release = [&](size_t i) {
    size_t off = offsets[i], size = (sizes[i] + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
    if (!size) return;
    auto next = free_gaps.lower_bound(off);
    if (next != free_gaps.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) { off = prev->first; size += prev->second; free_gaps.erase(prev); }
    }
    if (next != free_gaps.end() && off + size == next->first) { size += next->second; free_gaps.erase(next); }
    if (off + size == top) top = off;  // the gap reaches the end: give it back to the top
    else free_gaps[off] = size;
  };
  while (f < n) {
    int64_t step = first[by_first[f]];
    // Free what was read for the last time before this step; what this step reads stays.
    for (; l < n && last[by_last[l]] < step; ++l) release(by_last[l]);
    for (; f < n && first[by_first[f]] == step; ++f) {
      size_t i = by_first[f], size = (sizes[i] + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
      if (last[i] < first[i]) throw std::logic_error("plan_arena: a buffer is read before it is made");
      auto gap = std::find_if(free_gaps.begin(), free_gaps.end(), [&](auto& g) { return g.second >= size; });
      if (size == 0) {
        offsets[i] = 0;
      } else if (gap != free_gaps.end()) {
        offsets[i] = gap->first;
        size_t rest = gap->second - size, at = gap->first + size;
        free_gaps.erase(gap);
        if (rest) free_gaps[at] = rest;
      } else {
        offsets[i] = top;
        top += size;
      }
    }
  }
  size_t peak = 0;
  for (size_t i = 0; i < n; ++i) peak = std::max(peak, offsets[i] + sizes[i]);
  return peak;
}

}  // namespace luminal
