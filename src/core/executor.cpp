#include "core/executor.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>

#include "core/cpu/cpu.h"
#include "core/memory_plan.h"

namespace luminal {

Executor::Executor(const Graph& g) : g_(g) {}

void Executor::build() {
  plan_.reset();
  sched_ = std::make_unique<Schedule>(make_schedule(g_, {}));
  plan_ = std::make_unique<Plan>(g_, *sched_);
  bufs_.assign(g_.size(), Buffer{});
  leaves_.assign(g_.size(), Buffer{});
  kernels_.assign(sched_->steps.size(), nullptr);
  args_.assign(sched_->steps.size(), {});
  for (size_t i = 0; i < sched_->steps.size(); ++i) {
    const Node& n = g_.node(sched_->steps[i].node);
    for (auto& e : n.inputs) args_[i].push_back(KernelArg{&bufs_[size_t(e.node)], ConcreteView()});
    if (n.op != Op::Custom) continue;
    kernels_[i] = cpu_kernel(*n.kop);
    if (!kernels_[i])
      throw UnsupportedOpError("the CPU backend has no kernel for " + op_label(n) + " (node " +
                               std::to_string(sched_->steps[i].node) + ")");
  }
  version_ = g_.version();
}

BufferMap Executor::run(const Bindings& dims, const BufferMap& inputs, const std::unordered_set<int64_t>& donated) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto start = std::chrono::steady_clock::now();
  if (version_ != g_.version()) build();
  const std::vector<Step>& steps = sched_->steps;
  Plan& plan = *plan_;
  bool planned = !plan.valid() || plan.dims() != dims;
  if (planned) {
    plan.update(dims);
    for (size_t i : plan.stale()) {
      const std::vector<ConcreteView>& views = plan.views(i);
      for (size_t k = 0; k < views.size(); ++k) args_[i][k].view = views[k];
      if (steps[i].leaf()) leaves_[size_t(steps[i].node)].data.reset();  // computed again below
    }
  }
  double plan_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The arena grows as needed and is kept, but not when a plan needs under a quarter of it: a long prompt's arena
  // would otherwise stay resident through every decode step.
  size_t need = plan.arena_bytes();
  bool shrink = need < arena_capacity_ / 4 && arena_capacity_ > (size_t(1) << 18);
  if (need > arena_capacity_ || !arena_ || shrink) {
    arena_capacity_ = std::max(need, kArenaAlign);
    arena_ = std::shared_ptr<void>(::operator new(arena_capacity_, std::align_val_t(kArenaAlign)),
                                   [](void* p) { ::operator delete(p, std::align_val_t(kArenaAlign)); });
  }
  char* arena = static_cast<char*>(arena_.get());

  static const bool profile = std::getenv("LUMINAL_PROFILE") != nullptr;  // time per op kind, to stderr
  std::map<std::string, std::pair<double, int>> prof;
  BufferMap results;
  try {
    for (size_t i = 0; i < steps.size(); ++i) {
      const Step& st = steps[i];
      const Node& n = g_.node(st.node);
      Buffer& out = bufs_[size_t(st.node)];
      const std::vector<int64_t>& shape = plan.shape(st.node);
      auto t0 = profile ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      if (st.kind == Step::Input) {
        auto it = inputs.find(st.node);
        if (it == inputs.end())
          throw std::invalid_argument("input '" + n.name + "' (node " + std::to_string(st.node) +
                                      ") has no data: call set() on it");
        if (it->second.shape != shape || it->second.dtype != n.dtype)
          throw std::invalid_argument("input '" + n.name + "' holds data of the wrong shape or dtype");
        out = it->second;
        continue;
      }
      Plan::Home home = plan.home(st.node);
      if (st.leaf()) {  // computed when its dims change; a fresh copy when the run returns it
        Buffer& keep = leaves_[size_t(st.node)];
        if (!keep.data || home == Plan::Home::Fresh) {
          keep = Buffer::alloc(n.dtype, shape);
          run_primop(n, args_[i], dims, keep);
        }
        out = keep;
      } else if (home == Plan::Home::SameAs) {  // an output read as stored, a copy these dims make the identity
        out = bufs_[size_t(plan.same_as(st.node))];
        if (plan.home(plan.same_as(st.node)) == Plan::Home::Leaf) {  // (the kept values are not handed out)
          Buffer copy = Buffer::alloc(out.dtype, out.shape);
          std::memcpy(copy.data.get(), out.data.get(), out.nbytes());
          out = copy;
        }
        out.shape = shape;
      } else {
        out.dtype = n.dtype;
        out.shape = shape;
        bool in_place = plan.may_write_in_place(i) && donated.count(n.inputs[0].node);
        if (in_place) out.data = bufs_[size_t(n.inputs[0].node)].data;
        else if (home == Plan::Home::Fresh) out.data = Buffer::alloc(n.dtype, shape).data;
        else out.data = std::shared_ptr<void>(arena_, arena + plan.offset(st.node));
        if (kernels_[i]) (*kernels_[i])(args_[i], n, out);
        else run_primop(n, args_[i], dims, out);
      }
      if (n.op == Op::Output) results[st.node] = out;
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
    std::fprintf(stderr, "%-12s %5zu steps %9.3f ms (planning included: %.3f ms)\n", "run", steps.size(), total * 1e3,
                 planned ? plan_seconds * 1e3 : 0.0);
  }
  return results;
}

}  // namespace luminal
