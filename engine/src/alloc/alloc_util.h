// Helpers shared by the caching and VMM allocators: rounding, the out-of-memory message and
// deferred observer events (collected under the allocator's lock, delivered after it is released).
#pragma once
#include <sys/resource.h>

#include <cstddef>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "keel/allocator.h"
#include "keel/base/text.h"
#include "keel/dispatch.h"
#include "keel/error.h"
#include "keel/observer.h"

namespace keel::alloc {

inline size_t roundUp(size_t x, size_t m) {
  return (x + m - 1) / m * m;
}

// Who a block belongs to, taken from the calling thread when it is allocated.
struct BlockMeta {
  uint64_t opSeq = 0;
  uint64_t bufferId = 0;
  Buffer* owner = nullptr;  // the Buffer to relocate on compaction; null: unmovable
  MemTag tag = MemTag::None;
  uint32_t reuse = 0;
};

// Counts allocations per address (the reuse half of a block id).
class ReuseCounter {
 public:
  uint32_t next(uintptr_t a) { return counts_[a]++; }

 private:
  std::unordered_map<uintptr_t, uint32_t> counts_;
};

inline BlockMeta currentMeta(ReuseCounter& reuse, uintptr_t address) {
  const detail::AllocContext& c = detail::allocContext();
  BlockMeta m;
  m.opSeq = currentOpSeq();
  m.bufferId = c.bufferId;
  m.owner = c.buffer;
  m.tag = detail::currentMemTag();
  m.reuse = reuse.next(address);
  return m;
}

inline BlockInfo blockInfo(uintptr_t address, size_t size, size_t requested, BlockState state,
                           const BlockMeta* m) {
  BlockInfo b;
  b.address = address;
  b.size = size;
  b.requested = requested;
  b.state = state;
  if (m) {
    b.opSeq = m->opSeq;
    b.bufferId = m->bufferId;
    b.tag = m->tag;
    b.reuse = m->reuse;
  }
  return b;
}

// With no limit of its own (limit 0) the allocator ran out because the system refused it memory:
// the message then names the process's address-space limit (ulimit -v) when there is one.
// `granule`: the least the allocator reserves at a time for this request (a VMM chunk, a caching
// segment); over the limit, no request could ever succeed, and the message says so (it read as if
// a 32 KiB request had overflowed 500 KB with nothing allocated).
// `pool`: which part of the allocator the request had to come from, when that is not all of it
// (the caching allocator's small and large pools), appended to the reason.
inline Error outOfMemory(const std::string& allocator, size_t bytes, size_t limit,
                         const AllocatorStats& s, size_t granule = 0,
                         const std::string& pool = {}) {
  uint64_t op = currentOpSeq();
  std::string why;
  if (limit != 0) {
    why = detail::concat(" with a limit of ", limit, " bytes");
    if (granule > limit)
      why += detail::concat(": the ", allocator, " allocator reserves at least ",
                            formatBytes(granule), " at a time, more than the limit allows");
  } else {
    rlimit as{};
    why = getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY
              ? detail::concat(" under the address-space limit (ulimit -v) of ",
                               formatBytes(uint64_t(as.rlim_cur)))
              : std::string(": the system refused the memory");
  }
  return Error(
      detail::concat("out of memory in the ", allocator, " allocator: requested ", bytes, " bytes",
                     op ? detail::concat(" by op #", op, " ", currentOpName()) : std::string(), why,
                     pool, "; ", memorySummary(s)));
}

// Events are queued while the lock is held and sent afterwards, so an observer may allocate.
class PendingEvents {
 public:
  // The device events are stamped with (default: cpu).
  void setDevice(Device d) { device_ = d; }
  void add(MemEventKind kind, uint64_t address, uint64_t bytes, size_t allocated, size_t reserved,
           uint64_t to = 0, uint64_t bufferId = 0) {
    if (!detail::hasObservers()) return;
    MemEvent e;
    e.bufferId = bufferId;
    e.device = device_;
    e.kind = kind;
    e.address = address;
    e.bytes = bytes;
    e.toAddress = to;
    e.allocatedAfter = allocated;
    e.reservedAfter = reserved;
    events_.push_back(e);
  }
  std::vector<MemEvent> take() {
    std::vector<MemEvent> out;
    out.swap(events_);
    return out;
  }

 private:
  std::vector<MemEvent> events_;
  Device device_;
};

inline void deliver(std::vector<MemEvent> events) {
  for (auto& e : events) detail::notifyMemory(e);
}

// Runs f() under impl.mu, then delivers the events it queued with the lock released — also when
// f throws (the exception then propagates). The shape of every mutating allocator entry point.
template <class Impl, class F>
auto lockedWithEvents(Impl& impl, F&& f) -> decltype(f()) {
  std::unique_lock<std::mutex> lk(impl.mu);
  auto flush = [&] {
    auto ev = impl.events.take();
    lk.unlock();
    deliver(std::move(ev));
  };
  try {
    if constexpr (std::is_void_v<decltype(f())>) {
      f();
      flush();
    } else {
      auto r = f();
      flush();
      return r;
    }
  } catch (...) {
    if (lk.owns_lock()) flush();
    throw;
  }
}

}  // namespace keel::alloc
