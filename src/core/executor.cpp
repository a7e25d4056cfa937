#include "core/executor.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>

#include "core/cpu/cpu.h"
#include "core/memory_plan.h"

namespace luminal {

Executor::Executor(const Graph& g) : g_(g) {}

int Executor::intern(const Expr& e) {
  auto [it, fresh] = expr_index_.emplace(e, int(exprs_.size()));
  if (fresh) exprs_.push_back(e);
  return it->second;
}

Executor::ViewRef Executor::ref(const View& v) {
  ViewRef r;
  for (auto& e : v.shape) r.shape.push_back(intern(e));
  for (auto& e : v.strides) r.strides.push_back(intern(e));
  for (auto& [lo, hi] : v.mask) {
    r.lo.push_back(intern(lo));
    r.hi.push_back(intern(hi));
  }
  r.offset = intern(v.offset);
  r.masked = v.has_mask();
  return r;
}

void Executor::build() {
  steps_.clear();
  exprs_.clear();
  expr_index_.clear();
  values_.clear();
  planned_ = false;
  // Only what the outputs need, producers first.
  std::vector<int64_t> order = g_.topo_order();
  std::vector<char> needed = g_.needed(order);
  std::vector<int> readers(g_.size(), 0);
  last_read_.assign(g_.size(), -1);
  for (int64_t id : order) {
    if (!needed[id]) continue;
    const Node& n = g_.node(id);
    Step s;
    s.id = id;
    for (auto& e : n.inputs) {
      s.inputs.push_back(e.node);
      s.views.push_back(ref(e.view));
      last_read_[e.node] = int64_t(steps_.size());
      readers[e.node] += 1;
    }
    for (auto& d : n.shape) s.shape.push_back(intern(d));
    s.deps = s.shape;
    for (auto& r : s.views) {
      for (auto* idx : {&r.shape, &r.strides, &r.lo, &r.hi}) s.deps.insert(s.deps.end(), idx->begin(), idx->end());
      s.deps.push_back(r.offset);
    }
    std::sort(s.deps.begin(), s.deps.end());
    s.deps.erase(std::unique(s.deps.begin(), s.deps.end()), s.deps.end());
    if (n.op == Op::Custom) {
      s.kernel = cpu_kernel(*n.kop);
      if (!s.kernel)
        throw UnsupportedOpError("the CPU backend has no kernel for " + op_label(n) + " (node " + std::to_string(id) + ")");
    }
    s.home = n.op == Op::Input ? Home::Input : n.op == Op::Output ? Home::Own : Home::Arena;
    steps_.push_back(std::move(s));
  }
  std::vector<int64_t> pos(g_.size(), -1);
  for (size_t p = 0; p < steps_.size(); ++p) pos[steps_[p].id] = int64_t(p);
  for (auto& s : steps_) {
    const Node& n = g_.node(s.id);
    if (n.op == Op::Output && is_plain(g_, n.inputs[0])) {
      // The output shares its producer's buffer, which must then outlive the run.
      s.home = Home::SameAsInput;
      Step& producer = steps_[pos[n.inputs[0].node]];
      if (producer.home == Home::Arena) producer.home = Home::Own;
    }
    const Edge* dest = n.op == Op::Scatter ? &n.inputs[0] : nullptr;
    s.may_run_in_place = dest && g_.node(dest->node).op == Op::Input && readers[dest->node] == 1 &&
                         is_plain(g_, *dest) && g_.node(dest->node).dtype == n.dtype;
  }
  bufs_.assign(g_.size(), Buffer{});
  version_ = g_.version();
}

void Executor::evaluate(Step& s) {
  auto val = [&](const std::vector<int>& idx, std::vector<int64_t>& out) {  // in place: no allocation per step
    out.resize(idx.size());
    for (size_t i = 0; i < idx.size(); ++i) out[i] = values_[idx[i]];
  };
  val(s.shape, s.out_shape);
  for (size_t d = 0; d < s.out_shape.size(); ++d)
    if (s.out_shape[d] < 0)
      throw std::invalid_argument("dimension " + g_.node(s.id).shape[d].str() + " evaluates to a negative size " +
                                  std::to_string(s.out_shape[d]));
  s.args.resize(s.inputs.size());
  for (size_t k = 0; k < s.inputs.size(); ++k) {
    ConcreteView& v = s.args[k].view;
    const ViewRef& r = s.views[k];
    val(r.shape, v.shape);
    val(r.strides, v.strides);
    val(r.lo, v.lo);
    val(r.hi, v.hi);
    v.offset = values_[r.offset];
    v.masked = r.masked;
  }
}

void Executor::concretize(const std::unordered_set<int64_t>& donated, const std::vector<char>& dirty, bool all) {
  std::vector<size_t> sizes, offsets;
  std::vector<int64_t> first, last;
  std::vector<Step*> in_arena;
  for (size_t p = 0; p < steps_.size(); ++p) {
    Step& s = steps_[p];
    const Node& n = g_.node(s.id);
    bool stale = all;  // only steps that read a changed expression are re-evaluated (decode: the few that use p)
    for (size_t i = 0; i < s.deps.size() && !stale; ++i) stale = dirty[s.deps[i]];
    if (stale) evaluate(s);
    s.in_place = s.may_run_in_place && donated.count(s.inputs[0]);
    if (s.home == Home::Arena && !s.in_place) {
      int64_t numel = 1;
      for (auto d : s.out_shape) numel *= d;
      // Planned in 1 KiB steps: a decode step's attention buffers grow by a few bytes per token, and the same
      // rounded sizes keep the last plan.
      sizes.push_back((size_t(numel) * dtype_size(n.dtype) + 1023) / 1024 * 1024);
      first.push_back(int64_t(p));
      last.push_back(std::max(int64_t(p), last_read_[s.id]));
      in_arena.push_back(&s);
    }
  }
  if (!all && sizes == planned_sizes_) return;  // the same buffers as last time: the same offsets
  arena_size_ = plan_arena(sizes, first, last, offsets);
  for (size_t i = 0; i < in_arena.size(); ++i) in_arena[i]->offset = offsets[i];
  planned_sizes_ = std::move(sizes);
}

BufferMap Executor::run(const Bindings& dims, const BufferMap& inputs, const std::unordered_set<int64_t>& donated) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto start = std::chrono::steady_clock::now();
  if (version_ != g_.version()) build();
  bool changed = !planned_;
  values_.resize(exprs_.size());
  std::vector<char> dirty(exprs_.size(), 0);
  for (size_t i = 0; i < exprs_.size(); ++i) {
    int64_t v = exprs_[i].eval(dims);
    dirty[i] = v != values_[i];
    changed |= dirty[i];
    values_[i] = v;
  }
  for (auto& s : steps_) changed |= s.in_place != (s.may_run_in_place && donated.count(s.inputs[0]));
  if (changed) {
    bool all = !planned_;
    planned_ = false;
    auto t = std::chrono::steady_clock::now();
    concretize(donated, dirty, all);
    planned_ = true;
    plan_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }
  // The arena grows as needed and is kept, but not when a plan needs under a quarter of it: a long prompt's arena
  // would otherwise stay resident through every decode step.
  bool shrink = arena_size_ < arena_capacity_ / 4 && arena_capacity_ > (size_t(1) << 18);
  if (arena_size_ > arena_capacity_ || !arena_ || shrink) {
    arena_capacity_ = std::max(arena_size_, kArenaAlign);
    arena_ = std::shared_ptr<void>(::operator new(arena_capacity_, std::align_val_t(kArenaAlign)),
                                   [](void* p) { ::operator delete(p, std::align_val_t(kArenaAlign)); });
  }
  char* arena = static_cast<char*>(arena_.get());

  static const bool profile = std::getenv("LUMINAL_PROFILE") != nullptr;  // time per op kind, to stderr
  std::map<std::string, std::pair<double, int>> prof;
  BufferMap results;
  try {
    for (auto& s : steps_) {
      const Node& n = g_.node(s.id);
      Buffer& out = bufs_[s.id];
      if (s.home == Home::Input) {
        auto it = inputs.find(s.id);
        if (it == inputs.end())
          throw std::invalid_argument("input '" + n.name + "' (node " + std::to_string(s.id) +
                                      ") has no data: call set() on it");
        if (it->second.shape != s.out_shape || it->second.dtype != n.dtype)
          throw std::invalid_argument("input '" + n.name + "' holds data of the wrong shape or dtype");
        out = it->second;
        continue;
      }
      auto t0 = profile ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      for (size_t k = 0; k < s.inputs.size(); ++k) s.args[k].buf = &bufs_[s.inputs[k]];
      if (s.home == Home::SameAsInput) {
        out = bufs_[s.inputs[0]];
      } else {
        out.dtype = n.dtype;
        out.shape = s.out_shape;
        if (s.in_place) out.data = bufs_[s.inputs[0]].data;
        else if (s.home == Home::Own) out.data = Buffer::alloc(n.dtype, s.out_shape).data;
        else out.data = std::shared_ptr<void>(arena_, arena + s.offset);
        if (n.op == Op::Custom) {
          (*s.kernel)(s.args, n, out);
        } else {
          run_primop(n, s.args, dims, out);
        }
      }
      if (n.op == Op::Output) results[s.id] = out;
      if (profile) {
        auto& e = prof[op_label(n)];
        e.first += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        e.second += 1;
      }
    }
  } catch (...) {
    for (auto& b : bufs_) b.data.reset();
    throw;
  }
  for (auto& b : bufs_) b.data.reset();  // the run holds nothing back: user arrays, arena slices
  if (profile) {
    for (auto& [k, v] : prof) std::fprintf(stderr, "%-12s %5d nodes %9.3f ms\n", k.c_str(), v.second, v.first * 1e3);
    double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "%-12s %5zu steps %9.3f ms (planning included: %.3f ms)\n", "run", steps_.size(), total * 1e3,
                 changed ? plan_seconds_ * 1e3 : 0.0);
  }
  return results;
}

}  // namespace luminal
