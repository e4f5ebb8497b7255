// RecordQueue: the bounded hand-off between the engine thread(s) and the one writer thread
// (mutex + two condition variables). Invariant: it never holds more than `capacity` records; a
// full queue blocks the producer, or refuses droppable records when asked to drop.
//
// The writer is woken in batches, not per record: a wake-up per op costs a context switch that
// preempts a compute thread on a small machine (measured: +10-15% step time on 2 cores). push()
// notifies only when the queue reaches `wakeAt` records or the item is urgent (a step end); the
// writer otherwise wakes on its commit-interval timeout.
#pragma once
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <variant>
#include <vector>

#include "keel/capture/hash_pool.h"
#include "keel/storage/records.h"
#include "stacks.h"

namespace keel::capture {

struct RawStackItem {
  int64_t id = 0;
  RawStack addrs;
};
// Recorder::flush(): the writer commits when it reaches this marker (every record queued before it
// is then on disk) and reports `id` as done.
struct FlushMarker {
  int64_t id = 0;
};
// A checksum the writer fills into an op's tensor record once its job is done (Note [Hashing off
// the engine thread]).
struct HashFill {
  uint32_t tensor = 0;  // index into OpItem::rec.tensors
  DType dtype = DType::Float32;
  detail::HashJobPtr job;
};
struct OpItem {
  storage::OpRecord rec;
  std::vector<HashFill> fills;
};
using Item = std::variant<storage::StepRecord, OpItem, RawStackItem, storage::LogRecord,
                          storage::MemRecord, storage::DumpRecord, FlushMarker>;

class RecordQueue {
 public:
  explicit RecordQueue(size_t capacity)
      : capacity_(capacity), wakeAt_(std::max<size_t>(1, std::min<size_t>(capacity / 4, 2048))) {}

  // Blocks while full, unless dropIfFull: then returns false without queueing. Also returns
  // false (discarding the item) once the queue was aborted. The capture's own threads never wait
  // (detail::onCaptureThread(): the writer may be waiting for them); their few records may take
  // the queue past its capacity.
  bool push(Item&& item, bool dropIfFull, bool urgent = false) {
    std::unique_lock<std::mutex> lk(mu_);
    if (items_.size() >= capacity_ && !detail::onCaptureThread()) {
      if (dropIfFull || aborted_) return false;
      notEmpty_.notify_one();
      ++producersWaiting_;
      notFull_.wait(lk, [&] { return items_.size() < capacity_ || aborted_; });
      --producersWaiting_;
    }
    if (aborted_) return false;
    items_.push_back(std::move(item));
    if (urgent) urgent_ = true;
    if (writerWaiting_ && (urgent || items_.size() >= wakeAt_)) notEmpty_.notify_one();
    return true;
  }

  // Writer side: waits up to `timeout` for a batch (wakeAt records, an urgent one, or close),
  // then moves all queued ones into out.
  // Returns false when the queue is closed and empty (the writer should stop).
  bool popAll(std::vector<Item>& out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lk(mu_);
    auto ready = [&] { return items_.size() >= wakeAt_ || urgent_ || closed_; };
    if (!ready()) {
      writerWaiting_ = true;
      notEmpty_.wait_for(lk, timeout, ready);
      writerWaiting_ = false;
    }
    urgent_ = false;
    if (items_.empty()) return !closed_;
    for (auto& it : items_) out.push_back(std::move(it));
    items_.clear();
    if (producersWaiting_) notFull_.notify_all();
    return true;
  }

  // No more records will come; the writer drains what is left and stops.
  void close() {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
    notEmpty_.notify_all();
  }
  // The writer failed: discard queued records and release blocked producers.
  void abort() {
    std::lock_guard<std::mutex> lk(mu_);
    aborted_ = true;
    closed_ = true;
    items_.clear();
    notFull_.notify_all();
    notEmpty_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable notFull_, notEmpty_;
  std::deque<Item> items_;
  size_t capacity_;
  size_t wakeAt_;
  int producersWaiting_ = 0;
  bool writerWaiting_ = false;
  bool urgent_ = false;
  bool closed_ = false;
  bool aborted_ = false;
};

}  // namespace keel::capture
