// HashPool: the capture's tensor checksums and statistics, computed off the engine thread
// (Note [Hashing off the engine thread]). A HashJob holds its tensor (and so its buffer) until it
// is done; the buffer is pinned while its bytes are read (Note [Reading buffers off the engine
// thread]), and jobs go through the multi-buffer MD5 lanes as they come, with statistics fused
// into the same pass. Invariant: a job's results are
// written once, before done() turns true, and never change afterwards.
// Used by the capture's recorder and by keel_torch (python/keel_torch/_keel.cpp), whose jobs read
// PyTorch's memory (`external`): one hasher for both.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "keel/capture/hash.h"
#include "keel/capture/md5_multi.h"
#include "keel/storage/records.h"
#include "keel/tensor.h"

namespace keel::capture::detail {

struct HashJob {
  // Set before the job is queued; the pool drops `tensor` once the job is done.
  Tensor tensor;
  // Instead of holding `tensor`'s buffer: the buffer, held weakly (Note [Weakly held buffers]);
  // `tensor` is then a private view of the same geometry whose buffer is set only while the job
  // is hashed.
  std::weak_ptr<Buffer> weakBuffer;
  // Instead of `tensor`: `bytes` contiguous element bytes owned by the caller (bool as 0/1),
  // valid and unchanged until the job is done or settle() of its bufferId returns. No rounded
  // MD5 (it reads a tensor).
  const uint8_t* external = nullptr;
  uint64_t bufferId = 0;
  bool md5 = false;
  int roundedDigits = 0;  // 0: no rounded MD5
  bool stats = false;
  int64_t bytes = 0;  // element bytes the job reads
  DType dtype = DType::Float32;
  // Set when the buffer was about to be written before the job ran (HashPool::settle): the
  // elements, contiguous (bool as 0/1), copied then; the job reads them instead of the tensor.
  std::vector<uint8_t> snapshot;
  bool detached = false;

  // Results: valid once done().
  Md5Midstate md5State;
  Md5Stream md5Rounded;
  storage::TensorStats statsResult;
  std::string error;  // non-empty: hashing failed (the recording fails with this reason)

  bool done() const { return finished_.load(std::memory_order_acquire); }

 private:
  friend class HashPool;
  std::atomic<bool> finished_{false};
  bool taken_ = false;  // a thread is hashing it (pool mutex)
};
using HashJobPtr = std::shared_ptr<HashJob>;

// Whether this thread is one of the capture's own (the hashing thread): records it pushes never
// wait for room in the writer's queue, since the writer may be waiting for this thread.
bool onCaptureThread();
void markCaptureThread();

// Hashes a batch of jobs on the calling thread: md5 jobs through md5ManyMidstates (statistics
// fused), the rest one by one. Results only; does not mark the jobs done.
// lanes: md5ManyMidstates' lane count (0: the widest here).
void hashBatch(const std::vector<HashJobPtr>& batch, int lanes);

struct HashPoolCounts {
  int64_t jobs = 0;              // jobs hashed
  int64_t bytes = 0;             // element bytes hashed
  int64_t helpedJobs = 0;        // of those, hashed by a thread that was waiting: the engine's
                                 // (settle, a full backlog) ...
  int64_t writerJobs = 0;        // ... or the writer's (wait)
  int64_t peakBacklogBytes = 0;  // most element bytes waiting at once
  int64_t snapshots = 0;         // queued jobs whose elements were copied before a write
};

class HashPool {
 public:
  // backlogBytes: element bytes queued or being hashed beyond which submit() pushes back.
  // lanes: the MD5 lane count (0: the widest this CPU runs).
  HashPool(int64_t backlogBytes, int lanes);
  ~HashPool();  // hashes what is queued, then stops the thread
  HashPool(const HashPool&) = delete;
  HashPool& operator=(const HashPool&) = delete;

  // Queues job. Past the backlog limit: with block, this thread hashes queued jobs itself (or
  // waits for running ones) until the backlog is under the limit; without, returns false and the
  // job is not queued (the caller records the tensor without its checksums and counts it).
  bool submit(const HashJobPtr& job, bool block);
  // Returns once job is done; hashes it here (with everything else queued) if no thread has
  // taken it yet.
  void wait(const HashJobPtr& job);
  // Returns once no job still reads this buffer (it is about to be written, or freed): queued
  // jobs on it take a copy of their elements and stay queued (a copy costs far less than hashing
  // the queue on this thread; a rounded MD5, which reads the elements as values, is computed
  // here), running ones are waited for. `buffer`: the buffer itself, which weakly held jobs read
  // it through (nullptr: only `external` jobs read it).
  void settle(uint64_t bufferId, const Buffer* buffer = nullptr);
  // Returns once every job queued so far is done (hashing queued ones on this thread).
  void drain();
  HashPoolCounts counts() const;

 private:
  void loop();
  // Takes every queued job whose bytes can be read (mutex held; Note [Weakly held buffers]);
  // returns them to be hashed outside the lock.
  std::vector<HashJobPtr> takeQueuedLocked();
  enum class Who : uint8_t { Engine, Writer };
  // Hashes and completes a batch taken by a thread that waits for it.
  void runBatch(std::vector<HashJobPtr>& batch, Who who);
  // Marks hashed jobs done and lets go of their buffers; `who`: the waiting thread that hashed
  // them, none for the pool thread.
  void complete(std::span<const HashJobPtr> jobs, std::optional<Who> who);
  // The pool thread: hashes queued jobs through a lane stream until none is left.
  void streamRun();
  // Takes the queue and hashes it on the calling thread (`who`), the lock released meanwhile;
  // waits for a job to complete instead if it can take none (Note [Weakly held buffers]).
  void runQueued(std::unique_lock<std::mutex>& lk, Who who);
  // Waits for some job to complete (mutex held by lk), counted as a waiter meanwhile.
  void waitDone(std::unique_lock<std::mutex>& lk);

  const int64_t backlogLimit_;
  const int lanes_;
  mutable std::mutex mu_;
  std::condition_variable work_;  // jobs queued, or stop
  std::condition_variable done_;  // jobs completed
  std::deque<HashJobPtr> queue_;
  int64_t queuedBytes_ = 0;
  int64_t backlogBytes_ = 0;                       // queued + being hashed
  std::unordered_map<uint64_t, int64_t> pending_;  // buffer id -> jobs not done
  int64_t releasing_ = 0;  // buffers of done jobs not yet let go of (complete())
  bool stop_ = false;
  bool idle_ = true;  // the pool thread waits for work
  int waiters_ = 0;   // threads waiting in wait(), settle() or submit() for jobs to complete
  std::vector<std::vector<uint8_t>> spare_;  // the pool thread's scratch copies, kept for reuse
  HashPoolCounts counts_;
  std::thread thread_;
};

}  // namespace keel::capture::detail
