// The executor: the CPU runtime. It runs the core schedule's steps in order (primops through the reference
// semantics, backend ops through their CPU kernels) with the core plan's views and memory: every intermediate in
// one arena at the plan's offset, so a run allocates only the buffers it returns. Rebuilt when the graph changes.
#pragma once
#include <memory>
#include <mutex>
#include <unordered_set>

#include "core/plan.h"
#include "core/reference.h"

namespace luminal {

class Executor {
 public:
  explicit Executor(const Graph& g);  // the graph must outlive the executor; edits to it are picked up

  // `inputs`: a buffer for every Input the outputs need. `donated`: inputs whose buffers this run may overwrite; a
  // Scatter that is such an input's only reader (a KV-cache update) then writes into it in place instead of
  // copying it. Returns one buffer per Output node.
  BufferMap run(const Bindings& dims, const BufferMap& inputs, const std::unordered_set<int64_t>& donated = {});

  size_t arena_bytes() const { return plan_ ? plan_->arena_bytes() : 0; }
  const Graph& graph() const { return g_; }

 private:
  void build();

  const Graph& g_;
  uint64_t version_ = ~uint64_t(0);
  std::unique_ptr<Schedule> sched_;
  std::unique_ptr<Plan> plan_;
  std::vector<const CustomKernel*> kernels_;  // per step: a backend op's CPU kernel
  std::vector<std::vector<KernelArg>> args_;  // per step: its inputs' buffers and the plan's views
  std::vector<Buffer> bufs_;                  // per node: its buffer during a run
  std::vector<Buffer> leaves_;                // per node: a Constant's or Iota's values, kept while their dims stay
  std::shared_ptr<void> arena_;
  size_t arena_capacity_ = 0;
  std::mutex mutex_;  // one run at a time
};

}  // namespace luminal
