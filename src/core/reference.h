// The reference executor: runs any graph of primitive ops over any views and dtypes on the CPU, one element
// at a time in double precision, rounding to each node's dtype on store. Simple and obviously right, not fast.
#pragma once
#include <unordered_map>

#include "core/graph.h"

namespace luminal {

using BufferMap = std::unordered_map<int64_t, Buffer>;

// `inputs` holds a buffer for every Input node that an Output depends on; returns one buffer per Output node.
// (An Executor built for this one run.)
BufferMap run_reference(const Graph& g, const Bindings& dims, const BufferMap& inputs);

// One primitive op (or Constant/Output) in double precision, rounding to the node's dtype on store; `out` is
// allocated with the node's dtype and evaluated shape. A Scatter whose `out` is its destination runs in place.
void run_primop(const Node& n, const std::vector<KernelArg>& ins, const Bindings& dims, Buffer& out);

// Copies what `view` selects from `src` into a new contiguous buffer (padding reads as zero).
Buffer materialize(const Buffer& src, const ConcreteView& view);

}  // namespace luminal
