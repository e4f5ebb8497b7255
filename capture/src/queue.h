// RecordQueue: the bounded hand-off between the engine thread(s) and the one writer thread
// (mutex + two condition variables). Invariant: it never holds more than `capacity` records; a
// full queue blocks the producer, or refuses droppable records when asked to drop.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <variant>
#include <vector>

#include "keel/storage/records.h"
#include "stacks.h"

namespace keel::capture {

struct RawStackItem {
  int64_t id = 0;
  RawStack addrs;
};
using Item = std::variant<storage::StepRecord, storage::OpRecord, RawStackItem, storage::LogRecord,
                          storage::MemRecord, storage::DumpRecord>;

class RecordQueue {
 public:
  explicit RecordQueue(size_t capacity) : capacity_(capacity) {}

  // Blocks while full, unless dropIfFull: then returns false without queueing. Also returns
  // false (discarding the item) once the queue was aborted.
  bool push(Item&& item, bool dropIfFull) {
    std::unique_lock<std::mutex> lk(mu_);
    if (items_.size() >= capacity_) {
      if (dropIfFull || aborted_) return false;
      ++producersWaiting_;
      notFull_.wait(lk, [&] { return items_.size() < capacity_ || aborted_; });
      --producersWaiting_;
    }
    if (aborted_) return false;
    items_.push_back(std::move(item));
    if (writerWaiting_) notEmpty_.notify_one();
    return true;
  }

  // Writer side: waits up to `timeout` for records, then moves all queued ones into out.
  // Returns false when the queue is closed and empty (the writer should stop).
  bool popAll(std::vector<Item>& out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lk(mu_);
    if (items_.empty() && !closed_) {
      writerWaiting_ = true;
      notEmpty_.wait_for(lk, timeout, [&] { return !items_.empty() || closed_; });
      writerWaiting_ = false;
    }
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
  int producersWaiting_ = 0;
  bool writerWaiting_ = false;
  bool closed_ = false;
  bool aborted_ = false;
};

}  // namespace keel::capture
