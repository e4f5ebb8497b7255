// A small fixed thread pool for parallelFor. See parallel.h for the determinism contract.
#include "parallel.h"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace keel {
namespace {

thread_local bool t_inWorker = false;

class Pool {
 public:
  explicit Pool(int n) : n_(n) {
    for (int i = 1; i < n_; ++i) threads_.emplace_back([this, i] { loop(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      ++gen_;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int size() const { return n_; }

  void run(int chunks, const std::function<void(int)>& task) {
    std::unique_lock<std::mutex> runLock(runMu_);  // one parallel region at a time
    {
      std::lock_guard<std::mutex> lk(mu_);
      task_ = &task;
      chunks_ = chunks;
      pending_ = chunks - 1;
      ++gen_;
    }
    cv_.notify_all();
    t_inWorker = true;
    task(0);
    t_inWorker = false;
    std::unique_lock<std::mutex> lk(mu_);
    done_.wait(lk, [&] { return pending_ == 0; });
    task_ = nullptr;
  }

 private:
  void loop(int idx) {
    t_inWorker = true;
    pthread_setname_np(pthread_self(), "keel-pool");  // as debuggers and profilers show it
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* task;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return gen_ != seen; });
        seen = gen_;
        if (stop_) return;
        if (idx >= chunks_) continue;
        task = task_;
      }
      (*task)(idx);
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (--pending_ == 0) done_.notify_one();
      }
    }
  }

  int n_;
  std::vector<std::thread> threads_;
  std::mutex mu_, runMu_;
  std::condition_variable cv_, done_;
  const std::function<void(int)>* task_ = nullptr;
  int chunks_ = 0, pending_ = 0;
  uint64_t gen_ = 0;
  bool stop_ = false;
};

int defaultThreads() {
  if (const char* e = std::getenv("KEEL_NUM_THREADS")) {
    int v = std::atoi(e);
    if (v > 0) return std::min(v, 256);
  }
  return std::max(1, int(std::thread::hardware_concurrency()));
}

int g_threads = defaultThreads();

Pool& pool() {
  static Pool p(g_threads);
  return p;
}

}  // namespace

int numThreads() {
  return g_threads;
}
void setNumThreads(int n) {
  g_threads = std::max(1, std::min(n, pool().size()));
}

void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t chunks = std::min<int64_t>(g_threads, (n + grain - 1) / grain);
  if (chunks <= 1 || t_inWorker) {
    fn(0, n);
    return;
  }
  int64_t per = (n + chunks - 1) / chunks;
  chunks = (n + per - 1) / per;
  std::function<void(int)> task = [&](int c) {
    int64_t b = c * per, e = std::min(n, b + per);
    if (b < e) fn(b, e);
  };
  pool().run(int(chunks), task);
}

}  // namespace keel
