// The plan: what a schedule needs for one set of bound dims, made in the core for every runtime. Every step's shape
// and input views evaluated (and checked against their buffers), which copies these dims make the identity, and
// the memory: where each node's buffer lives (an arena offset from liveness, a fresh allocation for what a run
// returns, another node's buffer). A plan is updated in place when the dims change: only the steps whose numbers
// depend on a dim that changed are evaluated again (a decode step: the few that depend on the cache length), and
// the arena keeps its offsets while the buffers' size classes stay the same, so a recorded CUDA graph stays valid.
#pragma once
#include <cstdint>
#include <vector>

#include "core/schedule.h"

namespace luminal {

class Plan {
 public:
  enum class Home : uint8_t {
    None,    // no buffer: not run (a Scatter computes it), or no step
    Input,   // the data given for an Input
    Leaf,    // a Constant or Iota: the runtime keeps its values
    Arena,   // `offset` bytes into the arena
    Fresh,   // a new allocation per run: an output, or what an output aliases
    SameAs,  // the buffer of node `same_as` (an output read as stored, a copy these dims make the identity)
  };

  Plan(const Graph& g, const Schedule& s);  // both must outlive the plan

  // Brings the plan to `dims`. Raises (naming the node) for an unbound or negative dim and for an unpadded view
  // reading outside its buffer; the plan is then invalid until an update succeeds.
  void update(const Bindings& dims);
  bool valid() const { return valid_; }
  void invalidate() { valid_ = false; }  // the next update evaluates every step
  const Bindings& dims() const { return dims_; }
  // The steps the last update evaluated again (every step after the first update or a failed one).
  const std::vector<size_t>& stale() const { return stale_; }
  // Step i's numbers depend on no dim: evaluated once (a runtime may treat its values as constants).
  bool dim_free(size_t step) const { return step_vars_[step] == 0; }

  const std::vector<int64_t>& shape(int64_t node) const { return shapes_[size_t(node)]; }
  int64_t numel(int64_t node) const;
  // Step i's input views, one per input edge, as the node reads them (not permuted).
  const std::vector<ConcreteView>& views(size_t step) const { return views_[step]; }
  // Step i is a copy these dims make the identity (its view reads its input in order from its start, same storage
  // dtype): it need not run; its buffer is its input's.
  bool identity(size_t step) const { return identity_[step]; }
  // Step i is a Scatter whose destination is an Input only it reads, as stored, in the same storage dtype: a run
  // whose caller donates that input may write the rows into it in place (the KV-cache update).
  bool may_write_in_place(size_t step) const { return in_place_ok_[step]; }

  Home home(int64_t node) const { return home_[size_t(node)]; }
  size_t offset(int64_t node) const { return offset_[size_t(node)]; }
  int64_t same_as(int64_t node) const { return same_as_[size_t(node)]; }
  size_t arena_bytes() const { return arena_bytes_; }
  // The step computing a node, or -1.
  int64_t step_of(int64_t node) const { return step_of_[size_t(node)]; }

 private:
  struct Num {  // a number of a shape or view: a constant, or an expression over the dims
    int64_t value = 0;
    const Expr* expr = nullptr;
    int64_t eval(const Bindings& b) const { return expr ? expr->eval(b) : value; }
  };
  struct SymView {
    Num offset;
    std::vector<Num> shape, strides, lo, hi;
    bool masked = false;
  };
  static Num num(const Expr& e);
  void evaluate(size_t step, const Bindings& dims);
  void plan_memory();

  const Graph& g_;
  const Schedule& s_;
  std::vector<std::vector<Num>> shape_nums_;     // per node
  std::vector<char> grows_;                      // per node: its shape depends on a dim (planned in powers of two)
  std::vector<std::vector<SymView>> sym_views_;  // per step
  std::vector<std::string> var_names_;
  std::vector<uint64_t> step_vars_;  // per step: the dims its numbers depend on, bits over var_names_ (63: the rest)
  std::vector<char> in_place_ok_, may_alias_;  // per step
  std::vector<char> fresh_;                    // per node: the run returns its buffer
  std::vector<int64_t> step_of_, reads_last_;  // per node: its step; the last step whose kernels read it

  bool valid_ = false;
  Bindings dims_;
  std::vector<size_t> stale_;
  std::vector<std::vector<int64_t>> shapes_;         // per node
  std::vector<std::vector<ConcreteView>> views_;     // per step
  std::vector<char> identity_;                       // per step
  std::vector<Home> home_;                           // per node
  std::vector<size_t> offset_;                       // per node
  std::vector<int64_t> same_as_;                     // per node
  std::vector<size_t> planned_sizes_;                // the arena buffers' size classes the offsets were planned for
  bool planned_ = false;
  size_t arena_bytes_ = 0;
};

// Sizes rounded up to 1/8 of their power of two (at least 256 bytes): the arena's size classes, and a device pool's.
size_t size_class(size_t bytes);

}  // namespace luminal
