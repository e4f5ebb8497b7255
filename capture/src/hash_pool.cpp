// The capture's hashing thread and the batches it hashes (see hash_pool.h and Note [Hashing off
// the engine thread] in recorder.cpp).
#include "keel/capture/hash_pool.h"

#include <pthread.h>

#include <algorithm>
#include <optional>

#include "keel/buffer.h"
#include "keel/error.h"

namespace keel::capture::detail {

namespace {

// The pool thread starts a batch once this much is queued, or kWakeInterval after the first
// queued job: batches keep the MD5 lanes busy and the wake-ups few (a wake-up per op costs a
// context switch that preempts a compute thread on a small machine).
constexpr int64_t kWakeBytes = 8 << 20;
constexpr size_t kWakeJobs = 128;
constexpr auto kWakeInterval = std::chrono::milliseconds(10);
// How long a stream run waits for jobs to fill idle lanes before it runs the busy ones alone.
constexpr auto kFillWait = std::chrono::milliseconds(3);

// A job being hashed: its statistics stream and, for a view or a bool tensor, the contiguous copy
// its MD5 reads.
struct InFlight {
  HashJobPtr job;
  std::optional<BufferPin> pin;  // while its bytes are read (Note [Reading buffers off the engine
                                 // thread])
  std::optional<StatsStream> stats;
  std::vector<uint8_t> scratch;
  size_t elementBytes = 1;
};

// Starts a job: pins its buffer, computes what needs no MD5 lanes (rounded MD5, statistics of a
// job without MD5); returns the message for the lanes, or nothing.
std::optional<Md5Message> prepare(InFlight& f) {
  HashJob& job = *f.job;
  if (job.detached) {  // the elements were copied when the buffer was about to be written
    const int64_t n = job.bytes / int64_t(dtypeSize(job.dtype));
    if (job.stats) f.stats.emplace(job.dtype, statsShift(job.dtype, job.snapshot.data(), n));
    f.elementBytes = dtypeSize(job.dtype);
    if (!job.md5) {
      if (f.stats) {
        f.stats->add(job.snapshot.data(), n);
        job.statsResult = f.stats->finish();
      }
      return std::nullopt;
    }
    return Md5Message{{std::span<const uint8_t>(job.snapshot)}};
  }
  if (job.external) {  // the caller's memory (keel_torch: PyTorch's)
    const int64_t n = job.bytes / int64_t(dtypeSize(job.dtype));
    if (job.stats) f.stats.emplace(job.dtype, statsShift(job.dtype, job.external, n));
    f.elementBytes = dtypeSize(job.dtype);
    if (!job.md5) {
      if (f.stats) {
        f.stats->add(job.external, n);
        job.statsResult = f.stats->finish();
      }
      return std::nullopt;
    }
    return Md5Message{{std::span<const uint8_t>(job.external, size_t(job.bytes))}};
  }
  const Tensor& t = job.tensor;
  f.pin.emplace(*t.buffer());
  if (job.roundedDigits > 0) job.md5Rounded = md5RoundedElements(t, job.roundedDigits);
  if (!job.md5) {
    if (job.stats) job.statsResult = tensorStats(t);
    return std::nullopt;
  }
  if (job.stats) f.stats.emplace(t.dtype(), statsShift(t));
  f.elementBytes = dtypeSize(t.dtype());
  std::span<const uint8_t> bytes;
  if (t.isContiguous() && t.dtype() != DType::Bool) {
    bytes = {static_cast<const uint8_t*>(t.data()), t.nbytes()};
  } else {
    // A strided view is walked into a contiguous copy; bool bytes are hashed as 0/1.
    f.scratch = contiguousBytes(t);
    if (t.dtype() == DType::Bool)
      for (auto& b : f.scratch) b = b ? 1 : 0;
    bytes = f.scratch;
  }
  return Md5Message{{bytes}};
}

void finishMd5(InFlight& f, const Md5Midstate& m) {
  f.job->md5State = m;
  if (f.stats) f.job->statsResult = f.stats->finish();
}

// Routes the bytes the MD5 lanes read to each job's statistics (the fused pass).
template <typename Lookup>
class StatsSink final : public Md5ByteSink {
 public:
  explicit StatsSink(Lookup lookup) : lookup_(std::move(lookup)) {}
  void bytes(size_t id, const uint8_t* p, size_t n) override {
    InFlight& f = lookup_(id);
    if (f.stats) f.stats->add(p, int64_t(n / f.elementBytes));
  }

 private:
  Lookup lookup_;
};

thread_local bool t_captureThread = false;

}  // namespace

bool onCaptureThread() {
  return t_captureThread;
}
void markCaptureThread() {
  t_captureThread = true;
}

void hashBatch(const std::vector<HashJobPtr>& batch, int lanes) {
  std::vector<InFlight> fl(batch.size());
  std::vector<Md5Message> msgs;
  std::vector<size_t> msgJob;
  for (size_t i = 0; i < batch.size(); ++i) {
    fl[i].job = batch[i];
    if (auto m = prepare(fl[i])) {
      msgs.push_back(std::move(*m));
      msgJob.push_back(i);
    }
  }
  std::vector<Md5Midstate> mids(msgs.size());
  auto lookup = [&](size_t m) -> InFlight& { return fl[msgJob[m]]; };
  StatsSink<decltype(lookup)> sink(lookup);
  md5ManyMidstates(msgs, mids, lanes, &sink);
  for (size_t m = 0; m < msgs.size(); ++m) finishMd5(fl[msgJob[m]], mids[m]);
}

HashPool::HashPool(int64_t backlogBytes, int lanes) : backlogLimit_(backlogBytes), lanes_(lanes) {
  KEEL_CHECK(md5LanesSupported(lanes == 0 ? md5LaneWidth() : lanes), "capture: ", lanes,
             " MD5 lanes cannot run on this CPU (the widest here: ", md5LaneWidth(), ")");
  thread_ = std::thread([this] { loop(); });
}

HashPool::~HashPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  work_.notify_all();
  thread_.join();
}

bool HashPool::submit(const HashJobPtr& job, bool block) {
  std::unique_lock<std::mutex> lk(mu_);
  while (backlogBytes_ > 0 && backlogBytes_ + job->bytes > backlogLimit_) {
    if (!block) return false;
    if (!queue_.empty()) {
      runQueued(lk, Who::Engine);
    } else {
      waitDone(lk);
    }
  }
  queue_.push_back(job);
  queuedBytes_ += job->bytes;
  backlogBytes_ += job->bytes;
  ++pending_[job->bufferId];
  counts_.peakBacklogBytes = std::max(counts_.peakBacklogBytes, backlogBytes_);
  if (idle_ && (queuedBytes_ >= kWakeBytes || queue_.size() >= kWakeJobs || queue_.size() == 1))
    work_.notify_one();
  return true;
}

void HashPool::wait(const HashJobPtr& job) {
  if (job->done()) return;
  std::unique_lock<std::mutex> lk(mu_);
  while (!job->done()) {
    if (!job->taken_) {
      runQueued(lk, Who::Writer);
    } else {
      waitDone(lk);
    }
  }
}

void HashPool::settle(uint64_t bufferId) {
  std::vector<Tensor> release;  // let go of after the lock (freeing reaches the observers)
  std::unique_lock<std::mutex> lk(mu_);
  bool rounded = false;
  for (auto& j : queue_) {
    if (j->bufferId != bufferId || j->detached) continue;
    if (j->roundedDigits > 0) {
      rounded = true;  // needs the tensor itself: hashed below
      continue;
    }
    if (j->external)
      j->snapshot.assign(j->external, j->external + j->bytes);
    else
      j->snapshot = contiguousBytes(j->tensor);  // this thread is the only writer: no pin needed
    if (j->dtype == DType::Bool)
      for (auto& b : j->snapshot) b = b ? 1 : 0;
    j->detached = true;
    release.push_back(std::move(j->tensor));
    auto it = pending_.find(bufferId);
    if (it != pending_.end() && --it->second == 0) pending_.erase(it);
    counts_.snapshots++;
  }
  while (pending_.count(bufferId)) {
    if (rounded) {
      rounded = false;
      runQueued(lk, Who::Engine);
    } else {
      waitDone(lk);
    }
  }
  lk.unlock();
  release.clear();
}

void HashPool::runQueued(std::unique_lock<std::mutex>& lk, Who who) {
  auto batch = takeQueuedLocked();
  lk.unlock();
  runBatch(batch, who);
  lk.lock();
}

void HashPool::waitDone(std::unique_lock<std::mutex>& lk) {
  ++waiters_;
  work_.notify_all();  // a stream run waiting to fill its lanes runs them now
  done_.wait(lk);
  --waiters_;
}

void HashPool::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  while (backlogBytes_ > 0 || !pending_.empty()) {
    if (!queue_.empty()) {
      runQueued(lk, Who::Engine);
    } else {
      waitDone(lk);
    }
  }
}

HashPoolCounts HashPool::counts() const {
  std::lock_guard<std::mutex> lk(mu_);
  return counts_;
}

std::vector<HashJobPtr> HashPool::takeQueuedLocked() {
  std::vector<HashJobPtr> batch(std::make_move_iterator(queue_.begin()),
                                std::make_move_iterator(queue_.end()));
  queue_.clear();
  queuedBytes_ = 0;
  for (auto& j : batch) j->taken_ = true;
  return batch;
}

void HashPool::runBatch(std::vector<HashJobPtr>& batch, Who who) {
  if (batch.empty()) return;
  try {
    hashBatch(batch, lanes_);
  } catch (const std::exception& e) {
    for (auto& j : batch) j->error = e.what();
  } catch (...) {
    for (auto& j : batch) j->error = "unknown error while hashing";
  }
  // Buffers are let go of after the guard and outside the lock: freeing one calls the allocator
  // and the observers (Note [Reading buffers off the engine thread]).
  std::vector<Tensor> release;
  release.reserve(batch.size());
  for (auto& j : batch) {
    release.push_back(std::move(j->tensor));
    j->finished_.store(true, std::memory_order_release);
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& j : batch) {
      backlogBytes_ -= j->bytes;
      auto it = j->detached ? pending_.end() : pending_.find(j->bufferId);
      if (it != pending_.end() && --it->second == 0) pending_.erase(it);
      counts_.jobs++;
      counts_.bytes += j->bytes;
      (who == Who::Engine ? counts_.helpedJobs : counts_.writerJobs)++;
    }
  }
  done_.notify_all();
  release.clear();
  batch.clear();
}

// One stream run of the pool thread (Note [Lane streams]): queued jobs join free MD5 lanes as
// others finish. A job is complete the moment its lane is done: its buffer is unpinned and let
// go of, and its waiters go on.
void HashPool::streamRun() {
  std::unordered_map<size_t, InFlight> inFlight;
  size_t nextId = 0;
  auto lookup = [&](size_t id) -> InFlight& { return inFlight.at(id); };
  StatsSink<decltype(lookup)> sink(lookup);
  Md5LaneStream lanes(lanes_, &sink);
  std::vector<Md5LaneStream::Finished> done;
  auto finish = [&](InFlight& f) {
    HashJobPtr job = std::move(f.job);
    f.pin.reset();
    if (!f.scratch.empty() && spare_.size() < 64) spare_.push_back(std::move(f.scratch));
    Tensor release = std::move(job->tensor);
    job->finished_.store(true, std::memory_order_release);
    {
      std::lock_guard<std::mutex> lk(mu_);
      backlogBytes_ -= job->bytes;
      auto it = job->detached ? pending_.end() : pending_.find(job->bufferId);
      if (it != pending_.end() && --it->second == 0) pending_.erase(it);
      counts_.jobs++;
      counts_.bytes += job->bytes;
    }
    done_.notify_all();
    // `release` goes out of scope here, outside the lock: freeing calls the allocator and the
    // observers.
  };
  for (;;) {
    while (lanes.hasFreeLane()) {
      HashJobPtr job;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (queue_.empty()) break;
        job = std::move(queue_.front());
        queue_.pop_front();
        queuedBytes_ -= job->bytes;
        job->taken_ = true;
      }
      const size_t id = nextId++;
      InFlight& f = inFlight[id];
      f.job = std::move(job);
      if (!spare_.empty()) {
        f.scratch = std::move(spare_.back());  // keeps its capacity: no fresh pages to fault in
        spare_.pop_back();
      }
      std::optional<Md5Message> msg;
      try {
        msg = prepare(f);
      } catch (const std::exception& e) {
        f.job->error = e.what();
      }
      if (msg) {
        lanes.add(std::move(*msg), id);
      } else {
        finish(f);
        inFlight.erase(id);
      }
    }
    if (!lanes.busy()) break;
    if (lanes.hasFreeLane()) {
      // Lanes idle: rather than run a few lanes, give the engine the CPU until it queues more
      // (or someone waits for a job in flight, or kFillWait passes).
      std::unique_lock<std::mutex> lk(mu_);
      const bool more =
          work_.wait_for(lk, kFillWait, [&] { return !queue_.empty() || waiters_ > 0 || stop_; });
      if (more && !queue_.empty() && waiters_ == 0) continue;
    }
    lanes.step(done);
    for (const auto& d : done) {
      auto it = inFlight.find(d.id);
      finishMd5(it->second, d.midstate);
      finish(it->second);
      inFlight.erase(it);
    }
    done.clear();
  }
}

void HashPool::loop() {
  t_captureThread = true;
  pthread_setname_np(pthread_self(), "keel-hash");  // as debuggers and profilers show it
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    idle_ = true;
    if (queue_.empty() && !stop_) work_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (!stop_ && queuedBytes_ < kWakeBytes && queue_.size() < kWakeJobs)
      work_.wait_for(lk, kWakeInterval, [&] {
        return stop_ || queuedBytes_ >= kWakeBytes || queue_.size() >= kWakeJobs;
      });
    idle_ = false;
    if (queue_.empty()) {
      if (stop_) return;
      continue;
    }
    lk.unlock();
    streamRun();
    lk.lock();
  }
}

}  // namespace keel::capture::detail
