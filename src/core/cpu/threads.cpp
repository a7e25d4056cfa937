// A small fixed pool of worker threads for the CPU kernels.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <utility>
#include <mutex>
#include <thread>
#include <vector>

#include "core/cpu/cpu.h"

namespace luminal {
namespace {

class Pool {
 public:
  explicit Pool(int n) : n_(std::max(1, n)) {
    for (int i = 1; i < n_; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    { std::lock_guard<std::mutex> l(mu_); stop_ = true; epoch_.fetch_add(1); }  // workers wake and return
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return n_; }

  // Splits [0, n) into a few chunks per thread, taken first come first served; the caller works too. The caller
  // waits only for workers that joined before it ran out of chunks: a worker the OS has not scheduled yet (a busy
  // machine) delays nothing, it finds the run closed and goes back to waiting.
  void run(int64_t n, int64_t per, const std::function<void(int64_t, int64_t)>& fn) {
    std::lock_guard<std::mutex> serial(run_mu_);
    fn_ = &fn;
    n_items_ = n;
    per_ = per;
    next_.store(0);
    closed_.store(false);
    {
      std::lock_guard<std::mutex> l(mu_);
      epoch_.fetch_add(1);
    }
    cv_.notify_all();
    work();
    closed_.store(true);  // seq_cst: a worker that joins after this sees it (see loop())
    spin_until([&] { return active_.load() == 0; }, kCallerSpin);
    if (active_.load() != 0) {
      std::unique_lock<std::mutex> l(mu_);
      done_cv_.wait(l, [this] { return active_.load() == 0; });
    }
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  // Spins until done() or `budget` has passed; true if done. Without the pause instruction: a hypervisor may
  // take a vCPU that loops on pause away for a while (pause-loop exiting), which is what the spin should avoid.
  static constexpr std::chrono::microseconds kWorkerSpin{300}, kCallerSpin{100};
  template <class F>
  static bool spin_until(F done, std::chrono::microseconds budget) {
    auto end = std::chrono::steady_clock::now() + budget;
    for (;;) {
      for (int i = 0; i < 64; ++i) {
        if (done()) return true;
        std::atomic_signal_fence(std::memory_order_seq_cst);  // keeps the compiler from folding the loop
      }
      if (std::chrono::steady_clock::now() > end) return done();
    }
  }
  void work() {
    try {
      for (int64_t b; (b = next_.fetch_add(per_)) < n_items_;) (*fn_)(b, std::min(n_items_, b + per_));
    } catch (...) {
      // Kernels report bad input by throwing: carry the first error to the caller, skip the remaining chunks.
      std::lock_guard<std::mutex> l(err_mu_);
      if (!error_) error_ = std::current_exception();
      next_.store(n_items_);
    }
  }
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      // Spin a while (the next kernel usually follows within microseconds), then sleep.
      spin_until([&] { return epoch_.load(std::memory_order_acquire) != seen; }, kWorkerSpin);
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return epoch_.load() != seen; });
        seen = epoch_.load();
        if (stop_) return;
      }
      // Join, then look: either the caller sees us in active_ and waits, or we see the run closed and leave.
      active_.fetch_add(1);
      if (!closed_.load()) work();
      if (active_.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> l(mu_);
        done_cv_.notify_one();
      }
    }
  }

  int n_;
  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_items_ = 0, per_ = 1;
  std::atomic<int64_t> next_{0};
  std::mutex err_mu_;
  std::exception_ptr error_;
  std::atomic<int> active_{0};
  std::atomic<bool> closed_{true};
  std::atomic<uint64_t> epoch_{0};
  bool stop_ = false;
};

int default_threads() {
  unsigned h = std::thread::hardware_concurrency();
  return h ? int(h) : 1;
}

std::mutex pool_mu;
std::unique_ptr<Pool>& pool() {
  static std::unique_ptr<Pool> p;
  return p;
}

}  // namespace

void set_num_threads(int n) {
  std::lock_guard<std::mutex> l(pool_mu);
  pool() = std::make_unique<Pool>(n <= 0 ? default_threads() : n);
}

int num_threads() {
  std::lock_guard<std::mutex> l(pool_mu);
  if (!pool()) pool() = std::make_unique<Pool>(default_threads());
  return pool()->size();
}

void parallel_for(int64_t n, int64_t cost_per_item, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  int threads = num_threads();
  if (threads == 1 || n == 1 || n * cost_per_item < 32768) return fn(0, n);
  // Two chunks per thread: each streams a long contiguous range (measured on the LLM's matvecs: finer chunks,
  // and the atomics they cost, were up to 30% slower), with some slack for a thread that starts late.
  int64_t per = std::max<int64_t>(1, (n + 2 * threads - 1) / (2 * threads));
  pool()->run(n, per, fn);
}

}  // namespace luminal
