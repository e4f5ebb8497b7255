// Buffer: an owning handle to device memory, shared by a tensor and all its views.
// Invariant: code reads the address through data() each time; an allocator that moves memory
// (defragmentation) updates the handle, so no raw pointer is kept across ops. See Note [Buffer
// move].
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "keel/base/non_copyable.h"
#include "keel/device.h"

namespace keel {

// Note [Buffer move]: an allocator may relocate a live buffer (compaction) only at a safe point:
// while the dispatcher allocates the outputs of a top-level op (detail::AllocContext::safePoint),
// or in an explicit compact() call between ops. It copies the bytes and calls Buffer::relocate;
// tensors find the new address through their Buffer. Kernels read data() when they start, and
// nothing else may keep a raw address across an op that allocates.

struct AllocatorStats;  // keel/allocator.h
struct MemorySnapshot;  // keel/allocator.h

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  virtual std::string name() const = 0;
  virtual size_t allocatedBytes() const = 0;
  virtual size_t reservedBytes() const = 0;
  // Statistics (keel/allocator.h); the default fills allocated and reserved only.
  virtual AllocatorStats stats() const;
  // Every segment and block (keel/allocator.h); the default has the statistics only.
  virtual MemorySnapshot snapshot() const;
  // Returns cached memory that holds no live block to the system; a no-op by default.
  virtual void emptyCache() {}
  virtual void resetPeaks() {}
};

// The allocator used for new buffers on a device (host backends share one by default, chosen by
// KEEL_ALLOCATOR; see keel/allocator.h).
Allocator& allocatorFor(Device d);
// Replaces the allocator for a backend; returns the previous one. Buffers remember their allocator.
Allocator* setAllocator(Backend b, Allocator* a);

// Note [Reading buffers off the engine thread]: a thread that reads live buffers' bytes while the
// engine runs on (the capture's hasher, Note [Hashing off the engine thread]) pins each buffer
// for as long as it reads it (BufferPin) and reads data() after pinning. An allocator that moves
// live buffers (compaction) holds a detail::BufferMoveLock from choosing what to move until the
// moves are done and never moves a pinned buffer, so a reader never sees a buffer moved under it.
// Pinning and unpinning take the lock briefly; a pin holds no lock, so a reader may free other
// buffers (call the allocator) while it holds pins.
class Buffer;
class BufferPin : NonCopyable {
 public:
  explicit BufferPin(const Buffer& b);
  ~BufferPin();

 private:
  const Buffer* b_;
};

namespace detail {
class BufferMoveLock : NonCopyable {
 public:
  BufferMoveLock();
  ~BufferMoveLock();
};
}  // namespace detail

class Buffer : NonCopyable {
 public:
  Buffer(size_t bytes, Device device);
  ~Buffer();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  // Version counter shared by all views of this buffer: bumped by in-place writes.
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bumpVersion() { version_.fetch_add(1, std::memory_order_relaxed); }
  void relocate(void* newData) { data_ = newData; }
  // Process-wide identity (starts at 1, never reused); allocator events carry it.
  uint64_t id() const { return id_; }
  // A reader holds a BufferPin on it: compaction leaves it where it is. Read under a
  // detail::BufferMoveLock (Note [Reading buffers off the engine thread]).
  bool pinned() const { return pins_ > 0; }

 private:
  friend class BufferPin;
  mutable int pins_ = 0;  // guarded by the move lock
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;
  uint64_t id_ = 0;
  std::atomic<uint64_t> version_{0};
};

}  // namespace keel
