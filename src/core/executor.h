// The executor: runs a graph's Output nodes on the CPU, the primops through the reference semantics and Custom
// nodes through their kernels. Built once per graph version: the schedule (only what the outputs need, producers
// first), the views and shapes as indices into a table of the graph's distinct symbolic expressions, and the
// kernels looked up. Each run evaluates that table once; when the dims change it re-plans memory: every
// intermediate gets an offset in one arena by liveness, so a run allocates only the buffers it returns.
#pragma once
#include <mutex>
#include <unordered_set>

#include "core/reference.h"

namespace luminal {

class Executor {
 public:
  explicit Executor(const Graph& g);  // the graph must outlive the executor; edits to it are picked up

  // `inputs`: a buffer for every Input the outputs need. `donated`: inputs whose buffers this run may overwrite; a
  // Scatter that is such an input's only reader (a KV-cache update) then writes into it in place instead of
  // copying it. Returns one buffer per Output node.
  BufferMap run(const Bindings& dims, const BufferMap& inputs, const std::unordered_set<int64_t>& donated = {});

  size_t arena_bytes() const { return arena_size_; }
  const Graph& graph() const { return g_; }

 private:
  struct ViewRef {  // a View as indices into the expression table
    std::vector<int> shape, strides, lo, hi;
    int offset = 0;
    bool masked = false;
  };
  enum class Home { Arena, Own, Input, SameAsInput, InPlace };
  struct Step {
    int64_t id;
    std::vector<int64_t> inputs;
    std::vector<ViewRef> views;
    std::vector<int> shape;
    std::vector<int> deps;  // every expression its shape and views use
    const CustomKernel* kernel = nullptr;
    Home home = Home::Arena;
    bool may_run_in_place = false;  // a Scatter whose destination is an Input only it reads, read as stored
    // Per run:
    bool in_place = false;
    std::vector<KernelArg> args;
    std::vector<int64_t> out_shape;
    size_t offset = 0;
  };

  void build();
  void evaluate(Step& s);  // its shape and views under values_
  void concretize(const std::unordered_set<int64_t>& donated, const std::vector<char>& dirty, bool all);
  int intern(const Expr& e);
  ViewRef ref(const View& v);

  const Graph& g_;
  uint64_t version_ = ~uint64_t(0);
  std::vector<Step> steps_;
  std::vector<int64_t> last_read_;  // node id -> position of its last reader
  std::vector<Expr> exprs_;
  std::unordered_map<Expr, int, ExprHash> expr_index_;
  std::vector<int64_t> values_;  // exprs_ evaluated under the last run's dims
  bool planned_ = false;
  double plan_seconds_ = 0;
  std::vector<size_t> planned_sizes_;  // the arena buffers' sizes the offsets were planned for
  std::vector<Buffer> bufs_;  // node id -> its buffer during a run
  std::shared_ptr<void> arena_;
  size_t arena_size_ = 0, arena_capacity_ = 0;
  std::mutex mutex_;  // one run at a time
};

}  // namespace luminal
