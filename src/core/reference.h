// The reference semantics of the primitive ops, which the executor runs for every op no backend kernel replaced:
// any view and dtype, one element at a time in double precision, rounding to the node's dtype on store. Simple and
// obviously right, not fast.
#pragma once
#include <unordered_map>

#include "core/graph.h"

namespace luminal {

using BufferMap = std::unordered_map<int64_t, Buffer>;

// One primitive op (or Constant/Output) in double precision, rounding to the node's dtype on store; `out` is
// allocated with the node's dtype and evaluated shape. A Scatter whose `out` is its destination runs in place.
void run_primop(const Node& n, const std::vector<KernelArg>& ins, const Bindings& dims, Buffer& out);

// Copies what `view` selects from `src` into a new contiguous buffer (padding reads as zero).
Buffer materialize(const Buffer& src, const ConcreteView& view);

}  // namespace luminal
