// A small fixed pool of worker threads for the CPU kernels.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "core/cpu/cpu.h"

namespace luminal {
namespace {

class Pool {
 public:
  explicit Pool(int n) : n_(std::max(1, n)) {
    for (int i = 1; i < n_; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  ~Pool() {
    { std::lock_guard<std::mutex> l(mu_); stop_ = true; ++epoch_; }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return n_; }

  // Splits [0, n) into one chunk per thread; the caller runs chunk 0.
  void run(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    std::lock_guard<std::mutex> serial(run_mu_);
    {
      std::lock_guard<std::mutex> l(mu_);
      fn_ = &fn; n_items_ = n; pending_ = n_ - 1; ++epoch_;
    }
    cv_.notify_all();
    chunk(0);
    std::unique_lock<std::mutex> l(mu_);
    done_cv_.wait(l, [this] { return pending_ == 0; });
  }

 private:
  void chunk(int i) {
    int64_t per = (n_items_ + n_ - 1) / n_, b = std::min<int64_t>(n_items_, per * i), e = std::min<int64_t>(n_items_, b + per);
    if (b < e) (*fn_)(b, e);
  }
  void loop(int i) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return epoch_ != seen; });
        seen = epoch_;
        if (stop_) return;
      }
      chunk(i);
      std::lock_guard<std::mutex> l(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  int n_;
  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_items_ = 0;
  int pending_ = 0;
  uint64_t epoch_ = 0;
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
  if (num_threads() == 1 || n == 1 || n * cost_per_item < 32768) return fn(0, n);
  pool()->run(n, fn);
}

}  // namespace luminal
