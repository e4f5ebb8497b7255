// The capture's hashing thread and the batches it hashes (see hash_pool.h and Note [Hashing off
// the engine thread] in recorder.cpp).
#include "keel/capture/hash_pool.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <span>

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

// Whether a job's bytes can be read now (the pool's mutex held), holding a weakly held buffer for
// as long as the job is hashed. A weakly held buffer that cannot be held is being freed: the
// free's settle() copies the job's elements next (Note [Weakly held buffers]).
bool holdBuffer(HashJob& j) {
  if (j.detached || j.external || !j.tensor.defined() || j.tensor.impl()->buffer) return true;
  std::shared_ptr<Buffer> b = j.weakBuffer.lock();
  if (!b) return false;
  j.tensor.impl()->buffer = std::move(b);
  return true;
}

// How long the pool thread waits for the settle() of a buffer being freed before it gives the
// job up as failed (a free that no settle() followed: never expected, but not a hang).
constexpr auto kUnheldLimit = std::chrono::seconds(5);

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

// Note [Weakly held buffers]: while allocator events are recorded, a job holds a host tensor's
// buffer weakly (HashJob::weakBuffer), so what the recording shows is the run's memory, not the
// run's plus the tensors waiting to be hashed (up to the backlog: its peak rose by an eighth,
// differently in each run, and the last step's temporaries read as never freed). A job is held
// only from when a thread takes it until it is hashed (holdBuffer). When the engine lets go of a
// buffer, its destructor announces the free as a write (Observer::onBufferWrite) before the
// memory goes back to the allocator, and settle() copies the elements of the jobs still queued on
// it — the same copy an in-place write takes — so the free is recorded when the program freed it.
// A thread that finds a queued job's buffer already unheld leaves the job to that settle(). What
// the recording still shows late is the free of a buffer being hashed at that moment (one lane's
// tensor, while its MD5 finishes). The device tensors' host copies are the capture's own and held
// as before.
void HashPool::settle(uint64_t bufferId, const Buffer* buffer) {
  std::vector<Tensor> release;  // let go of after the lock (freeing reaches the observers)
  std::unique_lock<std::mutex> lk(mu_);
  if (!pending_.count(bufferId)) return;
  for (auto& j : queue_) {
    if (j->bufferId != bufferId || j->detached) continue;
    if (j->external) {
      j->snapshot.assign(j->external, j->external + j->bytes);
    } else {
      TensorImpl& view = *j->tensor.impl();
      if (!view.buffer) {  // weakly held: read through the buffer being written or freed
        KEEL_CHECK(buffer != nullptr, "capture: settle of a weakly held buffer without it");
        view.buffer =
            std::shared_ptr<Buffer>(std::shared_ptr<Buffer>(), const_cast<Buffer*>(buffer));
      }
      // This thread is the only writer: no pin needed.
      if (j->roundedDigits > 0) j->md5Rounded = md5RoundedElements(j->tensor, j->roundedDigits);
      if (j->md5 || j->stats) j->snapshot = contiguousBytes(j->tensor);
    }
    if (j->dtype == DType::Bool)
      for (auto& b : j->snapshot) b = b ? 1 : 0;
    j->detached = true;
    release.push_back(std::move(j->tensor));
    auto it = pending_.find(bufferId);
    if (it != pending_.end() && --it->second == 0) pending_.erase(it);
    counts_.snapshots++;
  }
  while (pending_.count(bufferId)) waitDone(lk);
  lk.unlock();
  work_.notify_all();  // a thread waiting to take a job of this buffer takes it now
  done_.notify_all();
  release.clear();
}

void HashPool::runQueued(std::unique_lock<std::mutex>& lk, Who who) {
  auto batch = takeQueuedLocked();
  if (batch.empty()) {  // every queued job's buffer is being freed: its settle() comes first
    waitDone(lk);
    return;
  }
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
  while (backlogBytes_ > 0 || !pending_.empty() || releasing_ > 0) {
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
  std::vector<HashJobPtr> batch;
  std::deque<HashJobPtr> left;
  for (auto& j : queue_) {
    if (holdBuffer(*j)) {
      j->taken_ = true;
      queuedBytes_ -= j->bytes;
      batch.push_back(std::move(j));
    } else {
      left.push_back(std::move(j));
    }
  }
  queue_ = std::move(left);
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
  complete(batch, who);
  batch.clear();
}

void HashPool::complete(std::span<const HashJobPtr> jobs, std::optional<Who> who) {
  // Buffers are let go of after the guard and outside the lock: freeing one calls the allocator
  // and the observers (Note [Reading buffers off the engine thread]). Until they are, drain()
  // waits: the frees are recorded before a recorder that drained stops listening.
  std::vector<Tensor> release;
  release.reserve(jobs.size());
  for (const auto& j : jobs) {
    if (j->tensor.defined()) release.push_back(std::move(j->tensor));
    j->finished_.store(true, std::memory_order_release);
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& j : jobs) {
      backlogBytes_ -= j->bytes;
      auto it = j->detached ? pending_.end() : pending_.find(j->bufferId);
      if (it != pending_.end() && --it->second == 0) pending_.erase(it);
      counts_.jobs++;
      counts_.bytes += j->bytes;
      if (who) (*who == Who::Engine ? counts_.helpedJobs : counts_.writerJobs)++;
    }
    releasing_ += int64_t(release.size());
  }
  done_.notify_all();
  if (release.empty()) return;
  const int64_t n = int64_t(release.size());
  release.clear();
  {
    std::lock_guard<std::mutex> lk(mu_);
    releasing_ -= n;
  }
  done_.notify_all();
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
    const HashJobPtr job = std::move(f.job);
    f.pin.reset();
    if (!f.scratch.empty() && spare_.size() < 64) spare_.push_back(std::move(f.scratch));
    complete({&job, 1}, std::nullopt);
  };
  // Since when the queue's first job has had a buffer being freed (Note [Weakly held buffers]).
  std::chrono::steady_clock::time_point unheldSince{};  // {}: it has not
  for (;;) {
    bool unheld = false;
    while (lanes.hasFreeLane()) {
      HashJobPtr job;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (queue_.empty()) break;
        if (!holdBuffer(*queue_.front())) {
          const auto now = std::chrono::steady_clock::now();
          if (unheldSince == std::chrono::steady_clock::time_point{}) unheldSince = now;
          if (now - unheldSince < kUnheldLimit) {
            unheld = true;  // its settle() comes next
            break;
          }
          queue_.front()->error = "its buffer was freed before it was hashed and nothing copied it";
        }
        unheldSince = {};
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
      if (f.job->error.empty()) {
        try {
          msg = prepare(f);
        } catch (const std::exception& e) {
          f.job->error = e.what();
        }
      }
      if (msg) {
        lanes.add(std::move(*msg), id);
      } else {
        finish(f);
        inFlight.erase(id);
      }
    }
    if (unheld && !lanes.busy()) {  // nothing else to do: wait for that settle()
      std::unique_lock<std::mutex> lk(mu_);
      work_.wait_for(lk, std::chrono::milliseconds(1));
      continue;
    }
    if (!lanes.busy()) break;
    if (lanes.hasFreeLane() && !unheld) {
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
