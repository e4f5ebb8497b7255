// The caching allocator: the yardstick the VMM allocator is measured against.
// Invariants: every byte of a segment belongs to exactly one block; blocks of a segment form a
// doubly linked list in address order; no two free neighbours exist (they are merged at once).
#include <sys/mman.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <unordered_map>

#include "alloc/alloc_util.h"

namespace keel {

// Note [Caching allocator pools]: the conventions match the allocators frameworks ship, so the
// comparison with the VMM allocator is fair. Requests are rounded to 512 bytes. Requests up to
// 1 MiB come from 2 MiB segments (the small pool) and split whenever 512 bytes remain; larger
// requests under 10 MiB share 20 MiB segments, and requests of 10 MiB or more get a segment
// rounded up to 2 MiB (the large pool), where a block splits only if more than 1 MiB remains.
// Best fit is the smallest free block of the right pool with size >= the request, lowest address
// first among equals. A request that would exceed the limit first releases every wholly free
// segment and retries; only then does it raise keel::Error.

namespace {
struct Block {
  uintptr_t addr = 0;
  size_t size = 0;
  size_t requested = 0;
  bool free = true;
  bool small = false;
  alloc::BlockMeta meta;  // live blocks
  Block* prev = nullptr;  // neighbours inside the same segment
  Block* next = nullptr;
};
struct BySizeAddr {
  bool operator()(const Block* a, const Block* b) const {
    return a->size != b->size ? a->size < b->size : a->addr < b->addr;
  }
};
using Pool = std::set<Block*, BySizeAddr>;

// Merges `right` into its left neighbour `left` (same segment) and deletes it; the caller has
// taken any free one of them out of its pool first (the pool is ordered by size).
void absorbRight(Block* left, Block* right) {
  left->size += right->size;
  left->next = right->next;
  if (right->next) right->next->prev = left;
  delete right;
}
}  // namespace

struct CachingAllocator::Impl {
  CachingAllocatorOptions o;
  mutable std::mutex mu;
  Pool smallFree, largeFree;
  std::unordered_map<uintptr_t, Block*> live;
  AllocatorStats st;
  alloc::PendingEvents events;

  // A segment from the options' source, or anonymous mmap; null when out of memory.
  void* mapSegment(size_t bytes) const {
    if (o.mapSegment) return o.mapSegment(bytes);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  void unmapSegment(void* p, size_t bytes) const {
    if (o.unmapSegment)
      o.unmapSegment(p, bytes);
    else
      munmap(p, bytes);
  }
  alloc::ReuseCounter reuse;

  Pool& poolOf(bool small) { return small ? smallFree : largeFree; }

  // Why a request found no block (Note [Caching allocator pools]): the allocator's largest free
  // block may sit in the other pool, which never serves it.
  std::string poolShortage(size_t size, bool small) {
    const Pool& own = poolOf(small);
    const Pool& other = poolOf(!small);
    const size_t ownLargest = own.empty() ? 0 : (*own.rbegin())->size;
    std::string s = detail::concat("; a ", small ? "small" : "large", "-pool request (",
                                   small ? "up to " : "over ", formatBytes(o.smallMax), "; ", size,
                                   " bytes once rounded): the largest free block of that pool is ",
                                   ownLargest, " bytes");
    if (!other.empty())
      s += detail::concat(", and the ", small ? "large" : "small", " pool's free blocks (up to ",
                          (*other.rbegin())->size, " bytes) never serve it");
    return s;
  }

  void updatePeaks() {
    st.peakAllocated = std::max(st.peakAllocated, st.allocated);
    st.peakReserved = std::max(st.peakReserved, st.reserved);
    st.peakActive = std::max(st.peakActive, st.active);
  }

  AllocatorStats statsLocked() const {
    AllocatorStats s = st;
    s.blocks = live.size();
    s.freeBlocks = smallFree.size() + largeFree.size();
    s.totalFree = s.reserved - s.allocated;
    s.largestFree = 0;
    if (!smallFree.empty()) s.largestFree = (*smallFree.rbegin())->size;
    if (!largeFree.empty()) s.largestFree = std::max(s.largestFree, (*largeFree.rbegin())->size);
    return s;
  }

  // Unmaps every segment that is one free block.
  void releaseCached() {
    for (Pool* pool : {&smallFree, &largeFree}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* b = *it;
        if (b->prev || b->next) {
          ++it;
          continue;
        }
        it = pool->erase(it);
        unmapSegment(reinterpret_cast<void*>(b->addr), b->size);
        st.reserved -= b->size;
        st.segments--;
        events.add(MemEventKind::Release, b->addr, b->size, st.allocated, st.reserved);
        delete b;
      }
    }
  }

  Block* newSegment(size_t size, bool small) {
    size_t segSize = small             ? o.smallSegment
                     : size < o.midMax ? o.largeSegment
                                       : alloc::roundUp(size, o.largeRound);
    segSize = std::max(segSize, size);
    if (o.limit && st.reserved + segSize > o.limit) {
      releaseCached();
      if (st.reserved + segSize > o.limit) return nullptr;
    }
    void* p = mapSegment(segSize);
    if (!p) {
      releaseCached();
      p = mapSegment(segSize);
      if (!p) return nullptr;
    }
    auto* b = new Block;
    b->addr = reinterpret_cast<uintptr_t>(p);
    b->size = segSize;
    b->small = small;
    st.reserved += segSize;
    st.segments++;
    events.add(MemEventKind::Reserve, b->addr, segSize, st.allocated, st.reserved);
    return b;
  }

  void* allocate(size_t bytes) {
    size_t size = alloc::roundUp(std::max<size_t>(bytes, 1), o.round);
    bool small = size <= o.smallMax;
    Pool& pool = poolOf(small);
    Block key;
    key.size = size;
    Block* b = nullptr;
    if (auto it = pool.lower_bound(&key); it != pool.end()) {
      b = *it;
      pool.erase(it);
    } else {
      b = newSegment(size, small);
      if (!b) {
        st.ooms++;
        events.add(MemEventKind::Oom, 0, bytes, st.allocated, st.reserved);
        throw alloc::outOfMemory(
            o.name, bytes, o.limit, statsLocked(),
            small ? o.smallSegment : std::max(size, size < o.midMax ? o.largeSegment : size),
            poolShortage(size, small));
      }
    }
    size_t rest = b->size - size;
    if (small ? rest >= o.round : rest > o.smallMax) {
      auto* r = new Block;
      r->addr = b->addr + size;
      r->size = rest;
      r->small = small;
      r->prev = b;
      r->next = b->next;
      if (b->next) b->next->prev = r;
      b->next = r;
      b->size = size;
      pool.insert(r);
    }
    b->free = false;
    b->requested = bytes;
    b->meta = alloc::currentMeta(reuse, b->addr);
    live.emplace(b->addr, b);
    st.allocated += b->size;
    st.active += bytes;
    st.allocs++;
    updatePeaks();
    events.add(MemEventKind::Alloc, b->addr, b->size, st.allocated, st.reserved);
    return reinterpret_cast<void*>(b->addr);
  }

  void deallocate(void* p) {
    auto it = live.find(reinterpret_cast<uintptr_t>(p));
    if (it == live.end()) return;  // not ours: ignored (called from destructors; must not throw)
    Block* b = it->second;
    live.erase(it);
    st.allocated -= b->size;
    st.active -= b->requested;
    st.frees++;
    events.add(MemEventKind::Free, b->addr, b->size, st.allocated, st.reserved);
    b->free = true;
    b->requested = 0;
    b->meta = {};
    Pool& pool = poolOf(b->small);
    if (Block* prev = b->prev; prev && prev->free) {
      pool.erase(prev);
      absorbRight(prev, b);
      b = prev;
    }
    if (Block* next = b->next; next && next->free) {
      pool.erase(next);
      absorbRight(b, next);
    }
    pool.insert(b);
  }
};

CachingAllocator::CachingAllocator(CachingAllocatorOptions o) : impl_(std::make_unique<Impl>()) {
  KEEL_CHECK(o.round > 0 && o.smallSegment >= o.smallMax && o.largeRound > 0,
             "caching allocator: inconsistent options");
  impl_->events.setDevice(o.device);
  impl_->o = std::move(o);
}

CachingAllocator::~CachingAllocator() {
  // Segments are unmapped whole; blocks still live here would be a caller's bug (see allocator.h).
  std::set<Block*> heads;
  auto headOf = [](Block* b) {
    while (b->prev) b = b->prev;
    return b;
  };
  for (Pool* pool : {&impl_->smallFree, &impl_->largeFree})
    for (Block* b : *pool) heads.insert(headOf(b));
  for (auto& [a, b] : impl_->live) heads.insert(headOf(b));
  for (Block* h : heads) {
    size_t total = 0;
    for (Block* b = h; b;) {
      Block* n = b->next;
      total += b->size;
      if (b != h) delete b;
      b = n;
    }
    impl_->unmapSegment(reinterpret_cast<void*>(h->addr), total);
    delete h;
  }
}

void* CachingAllocator::allocate(size_t bytes) {
  return alloc::lockedWithEvents(*impl_, [&] { return impl_->allocate(bytes); });
}

void CachingAllocator::deallocate(void* ptr, size_t) {
  alloc::lockedWithEvents(*impl_, [&] { impl_->deallocate(ptr); });
}

std::string CachingAllocator::name() const {
  return impl_->o.name;
}
size_t CachingAllocator::allocatedBytes() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->st.allocated;
}
size_t CachingAllocator::reservedBytes() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->st.reserved;
}
AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->statsLocked();
}
void CachingAllocator::emptyCache() {
  alloc::lockedWithEvents(*impl_, [&] { impl_->releaseCached(); });
}
void CachingAllocator::resetPeaks() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  auto& s = impl_->st;
  s.peakAllocated = s.allocated;
  s.peakReserved = s.reserved;
  s.peakActive = s.active;
}
MemorySnapshot CachingAllocator::snapshot() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  MemorySnapshot snap;
  snap.allocator = impl_->o.name;
  snap.stats = impl_->statsLocked();
  std::set<const Block*, bool (*)(const Block*, const Block*)> heads(
      +[](const Block* a, const Block* b) { return a->addr < b->addr; });
  auto headOf = [](const Block* b) {
    while (b->prev) b = b->prev;
    return b;
  };
  for (const Pool* pool : {&impl_->smallFree, &impl_->largeFree})
    for (const Block* b : *pool) heads.insert(headOf(b));
  for (auto& [a, b] : impl_->live) heads.insert(headOf(b));
  for (const Block* h : heads) {
    SegmentInfo seg{h->addr, 0, true};
    for (const Block* b = h; b; b = b->next) {
      seg.size += b->size;
      snap.blocks.push_back(alloc::blockInfo(b->addr, b->size, b->requested,
                                             b->free ? BlockState::Free : BlockState::Allocated,
                                             b->free ? nullptr : &b->meta));
    }
    snap.segments.push_back(seg);
  }
  return snap;
}

void CachingAllocator::setLimit(size_t bytes) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->o.limit = bytes;
}

}  // namespace keel
