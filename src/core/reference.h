// The reference executor: runs any graph of primitive ops over any views and dtypes on the CPU, one element
// at a time in double precision, rounding to each node's dtype on store. Simple and obviously right, not fast.
#pragma once
#include <unordered_map>

#include "core/graph.h"

namespace luminal {

using BufferMap = std::unordered_map<int64_t, Buffer>;

// `inputs` holds a buffer for every Input node that an Output depends on; returns one buffer per Output node.
BufferMap run_reference(const Graph& g, const Bindings& dims, const BufferMap& inputs);

// Copies what `view` selects from `src` into a new contiguous buffer (padding reads as zero).
Buffer materialize(const Buffer& src, const ConcreteView& view);

}  // namespace luminal
