// The VMM allocator on Linux CPU: one PROT_NONE reservation, physical 2 MiB chunks from a memfd,
// best-fit over the mapped space, defragmentation by remapping free chunks (no byte copied).
// Invariants: blocks cover only mapped chunks; address-adjacent free blocks are always merged;
// touch_[slot] counts the live blocks touching a slot, and only untouched slots are remapped.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "alloc/alloc_util.h"

namespace keel {

// Note [VMM remap]: the address range is reserved once with mmap(PROT_NONE, MAP_NORESERVE) and
// divided into slots of one chunk. A slot is either unmapped (PROT_NONE) or maps one physical
// chunk, a chunk-sized range of a memfd, with mmap(MAP_FIXED|MAP_SHARED). Unmapping maps
// PROT_NONE anonymous memory over the slot (munmap would give the addresses away); releasing
// punches a hole in the memfd. A request is served best-fit from the free blocks. When none is
// large enough, the allocator looks for a window of addresses, between two live blocks, made of
// free bytes and unmapped slots, that needs the fewest new chunks (the simulation: nothing changes
// until a plan is found). Below defragThreshold reserved bytes the missing chunks are fresh ones;
// above it, chunks that no live block touches are first unmapped from elsewhere and mapped into
// the window (a remap: a shared mapping keeps the chunk's bytes, but those bytes are free, and no
// live byte moves). Fresh chunks fill any remainder while the limit allows; otherwise the request
// fails with keel::Error.
//
// Note [VMM compaction]: when no window can be made from free bytes and chunks (every chunk is
// touched by some live block and the limit forbids fresh ones) and the request comes at a safe
// point (Note [Buffer move]), live blocks are moved out of the way. Candidate windows are the
// chunk-aligned ranges of the request's chunk count that hold only free space and movable live
// blocks (blocks of a Buffer); they are tried cheapest first (fewest live bytes), each after a
// simulation that best-fits the window's live blocks into free space outside it. The moves then
// copy each block, call Buffer::relocate, and free the old place; remapping then fills the window.
// Blocks not owned by a Buffer (raw allocate calls) are never moved.

namespace {
struct VBlock {
  size_t size = 0;
  size_t requested = 0;
  bool free = true;
  alloc::BlockMeta meta;  // live blocks
};
}  // namespace

struct VmmAllocator::Impl {
  VmmAllocatorOptions o;
  mutable std::mutex mu;
  int fd = -1;
  uintptr_t base = 0;
  size_t nSlots = 0;
  std::vector<int64_t> slotPhys;  // physical chunk index per slot, -1 = unmapped
  std::vector<uint32_t> touch;    // live blocks touching each slot
  size_t highSlot = 0;            // one past the highest slot ever mapped
  size_t untouchedMapped = 0;     // mapped slots no live block touches (remap sources)
  std::vector<int64_t> freePhys;  // released physical chunks (holes punched)
  int64_t nextPhys = 0;
  std::map<uintptr_t, VBlock> blocks;  // free and live blocks by address
  std::set<std::pair<size_t, uintptr_t>> freeSet;
  AllocatorStats st;
  alloc::PendingEvents events;
  alloc::ReuseCounter reuse;

  size_t slotOf(uintptr_t a) const { return (a - base) / o.chunk; }
  uintptr_t slotAddr(size_t s) const { return base + s * o.chunk; }

  void updatePeaks() {
    st.peakAllocated = std::max(st.peakAllocated, st.allocated);
    st.peakReserved = std::max(st.peakReserved, st.reserved);
    st.peakActive = std::max(st.peakActive, st.active);
  }

  AllocatorStats statsLocked() const {
    AllocatorStats s = st;
    s.blocks = blocks.size() - freeSet.size();
    s.freeBlocks = freeSet.size();
    s.totalFree = s.reserved - s.allocated;
    s.largestFree = freeSet.empty() ? 0 : freeSet.rbegin()->first;
    s.segments = s.reserved / o.chunk;
    return s;
  }

  void addRawFree(uintptr_t a, size_t size) {
    blocks.emplace(a, VBlock{size, 0, true, {}});
    freeSet.emplace(size, a);
  }

  // Re-keys the free-set entry (size, a) as (newSize, newA) without reallocating its node.
  void rekeyFree(size_t size, uintptr_t a, size_t newSize, uintptr_t newA) {
    auto node = freeSet.extract({size, a});
    node.value() = {newSize, newA};
    freeSet.insert(std::move(node));
  }

  // Turns the block at `it` (not in freeSet) free, merging it with free neighbours. Node handles
  // are reused, so the common paths allocate nothing (the fast path of every free).
  void makeFree(std::map<uintptr_t, VBlock>::iterator it) {
    VBlock& b = it->second;
    b.free = true;
    b.requested = 0;
    b.meta = {};
    if (auto next = std::next(it);
        next != blocks.end() && next->second.free && it->first + b.size == next->first) {
      freeSet.erase({next->second.size, next->first});
      b.size += next->second.size;
      blocks.erase(next);
    }
    if (it != blocks.begin()) {
      auto prev = std::prev(it);
      if (prev->second.free && prev->first + prev->second.size == it->first) {
        size_t old = prev->second.size;
        prev->second.size += b.size;
        blocks.erase(it);
        rekeyFree(old, prev->first, prev->second.size, prev->first);
        return;
      }
    }
    freeSet.emplace(b.size, it->first);
  }

  // Adds [a, a+size) as free, merging with free neighbours.
  void insertFree(uintptr_t a, size_t size) {
    makeFree(blocks.emplace(a, VBlock{size, 0, true, {}}).first);
  }

  // Makes [a, a+len) of free space a live block and returns it. From the start of a free block
  // (best fit) it reuses the free block's nodes: no allocation, one tree search.
  VBlock& carve(uintptr_t a, size_t len) {
    auto it = blocks.find(a);
    if (it == blocks.end()) {  // inside a free block (a window made by growOrRemap)
      removeFreeRange(a, len);
      it = blocks.emplace(a, VBlock{len, 0, true, {}}).first;
    } else if (size_t fs = it->second.size; fs > len) {
      auto node = blocks.extract(it);
      node.key() = a + len;
      node.mapped().size = fs - len;
      auto rest = blocks.insert(std::move(node)).position;
      rekeyFree(fs, a, fs - len, a + len);
      it = blocks.emplace_hint(rest, a, VBlock{len, 0, true, {}});
    } else {
      freeSet.erase({fs, a});
    }
    it->second.free = false;
    return it->second;
  }

  // Removes [a, a+len) from the one free block that contains it. Carving from the block's start
  // (what best fit does) moves the remainder's nodes instead of reallocating them.
  void removeFreeRange(uintptr_t a, size_t len) {
    auto it = std::prev(blocks.upper_bound(a));
    uintptr_t f0 = it->first;
    size_t fs = it->second.size;
    if (a == f0 && fs > len) {
      auto node = blocks.extract(it);
      node.key() = a + len;
      node.mapped().size = fs - len;
      blocks.insert(std::move(node));
      rekeyFree(fs, f0, fs - len, a + len);
      return;
    }
    freeSet.erase({fs, f0});
    blocks.erase(it);
    if (a > f0) addRawFree(f0, a - f0);
    if (f0 + fs > a + len) addRawFree(a + len, f0 + fs - (a + len));
  }

  // Maps n slots from s onto the physical chunks phys..phys+n-1 with one mmap call.
  void mapRun(size_t s, size_t n, int64_t phys) {
    void* p = mmap(reinterpret_cast<void*>(slotAddr(s)), n * o.chunk, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED, fd, off_t(phys) * off_t(o.chunk));
    KEEL_CHECK(p != MAP_FAILED, "vmm allocator: mapping a chunk failed: ", std::strerror(errno));
    for (size_t i = 0; i < n; ++i) {
      slotPhys[s + i] = phys + int64_t(i);
      st.reserved += o.chunk;
      events.add(MemEventKind::Map, slotAddr(s + i), o.chunk, st.allocated, st.reserved);
    }
    highSlot = std::max(highSlot, s + n);
    untouchedMapped += n;
    insertFree(slotAddr(s), n * o.chunk);
  }

  void mapSlot(size_t s, int64_t phys) { mapRun(s, 1, phys); }

  // Maps fresh chunks into the unmapped slots [s0, s1); never-used chunks are contiguous in the
  // memfd, so each run of slots takes one mmap call.
  void mapFresh(size_t s0, size_t s1) {
    for (size_t s = s0; s < s1;) {
      if (slotPhys[s] >= 0) {
        ++s;
        continue;
      }
      size_t e = s;
      while (e < s1 && slotPhys[e] < 0) ++e;
      while (s < e && !freePhys.empty()) {
        mapSlot(s++, freshPhys());
        st.chunksMapped++;
      }
      if (s < e) {
        mapRun(s, e - s, nextPhys);
        nextPhys += int64_t(e - s);
        st.chunksMapped += e - s;
      }
      s = e;
    }
  }

  // Unmaps a slot no live block touches; returns its physical chunk (bytes kept).
  int64_t unmapSlot(size_t s) {
    removeFreeRange(slotAddr(s), o.chunk);
    mmap(reinterpret_cast<void*>(slotAddr(s)), o.chunk, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    int64_t phys = slotPhys[s];
    slotPhys[s] = -1;
    untouchedMapped--;
    st.reserved -= o.chunk;
    events.add(MemEventKind::Unmap, slotAddr(s), o.chunk, st.allocated, st.reserved);
    return phys;
  }

  int64_t freshPhys() {
    if (!freePhys.empty()) {
      int64_t p = freePhys.back();
      freePhys.pop_back();
      return p;
    }
    return nextPhys++;
  }

  size_t unmappedIn(size_t s0, size_t s1) const {
    size_t n = 0;
    for (size_t s = s0; s < s1; ++s) n += slotPhys[s] < 0;
    return n;
  }

  // Slow path: see Note [VMM remap]. Returns 0 when the request cannot be met.
  // Fresh chunks the limit still allows.
  size_t freshChunksLeft() const {
    return o.limit ? (o.limit > st.reserved ? (o.limit - st.reserved) / o.chunk : 0) : SIZE_MAX;
  }

  // When no mapped chunk is free of live blocks there is nothing to remap: every window needs
  // fresh chunks, so take the top of the used range (extending the free block that ends there).
  // Returns 0 when that does not fit the limit or the reservation.
  uintptr_t growAtTop(size_t size) {
    const uintptr_t top = slotAddr(highSlot);
    uintptr_t a = top;
    if (!blocks.empty()) {
      auto last = std::prev(blocks.end());
      if (last->second.free && last->first + last->second.size == top) a = last->first;
    }
    if (a + size > base + nSlots * o.chunk) return 0;
    const size_t s1 = slotOf(a + size - 1) + 1;
    if (s1 - highSlot > freshChunksLeft()) return 0;
    mapFresh(highSlot, s1);
    updatePeaks();
    return a;
  }

  uintptr_t growOrRemap(size_t size) {
    if (untouchedMapped == 0)
      if (uintptr_t a = growAtTop(size)) return a;
    const uintptr_t end = base + nSlots * o.chunk;
    uintptr_t bestA = 0;
    size_t bestCost = SIZE_MAX;
    auto consider = [&](uintptr_t a, uintptr_t g0, uintptr_t g1) {
      if (a < g0 || a + size > g1) return;
      size_t cost = unmappedIn(slotOf(a), slotOf(a + size - 1) + 1);
      if (cost < bestCost || (cost == bestCost && a < bestA)) bestCost = cost, bestA = a;
    };
    std::vector<std::pair<uintptr_t, size_t>> gapFree;
    auto gap = [&](uintptr_t g0, uintptr_t g1) {
      if (g1 - g0 >= size) {
        consider(g0, g0, g1);
        if (g1 < end) consider(g1 - size, g0, g1);
        for (auto [fa, fs] : gapFree) {
          consider(fa, g0, g1);
          if (fa + fs >= size) consider(fa + fs - size, g0, g1);
        }
      }
      gapFree.clear();
    };
    uintptr_t g0 = base;
    for (auto& [a, b] : blocks) {
      if (b.free) {
        gapFree.emplace_back(a, b.size);
        continue;
      }
      gap(g0, a);
      g0 = a + b.size;
    }
    gap(g0, end);
    if (bestCost == SIZE_MAX) return 0;

    size_t w0 = slotOf(bestA), w1 = slotOf(bestA + size - 1) + 1;
    size_t need = bestCost;
    size_t freshLeft = freshChunksLeft();
    std::vector<size_t> sources;
    bool grow = st.reserved + need * o.chunk <= o.defragThreshold && need <= freshLeft;
    if (!grow) {
      for (size_t s = 0; s < highSlot && sources.size() < need; ++s)
        if (slotPhys[s] >= 0 && touch[s] == 0 && (s < w0 || s >= w1)) sources.push_back(s);
      if (need - sources.size() > freshLeft) return 0;  // the simulation says it cannot fit
    }
    std::vector<int64_t> phys;
    for (size_t s : sources) phys.push_back(unmapSlot(s));
    if (!sources.empty()) {
      st.defrags++;
      st.chunksRemapped += sources.size();
    }
    for (size_t s = w0; s < w1 && !phys.empty(); ++s) {
      if (slotPhys[s] >= 0) continue;
      int64_t p = phys.back();
      phys.pop_back();
      events.add(MemEventKind::Move, slotAddr(sources[phys.size()]), o.chunk, st.allocated,
                 st.reserved, slotAddr(s));
      mapSlot(s, p);
    }
    mapFresh(w0, w1);
    updatePeaks();
    return bestA;
  }

  void touchRange(uintptr_t a, size_t size, int delta) {
    for (size_t s = slotOf(a); s <= slotOf(a + size - 1); ++s) {
      if (touch[s] == 0) untouchedMapped--;
      touch[s] += uint32_t(delta);
      if (touch[s] == 0) untouchedMapped++;
    }
  }

  // The first block that ends after address a.
  std::map<uintptr_t, VBlock>::iterator firstEndingAfter(uintptr_t a) {
    auto it = blocks.upper_bound(a);
    if (it != blocks.begin()) {
      auto p = std::prev(it);
      if (p->first + p->second.size > a) return p;
    }
    return it;
  }

  // Free space outside [w0, w1) that a block of `size` bytes could move to: its address, or 0.
  uintptr_t placeOutside(size_t size, uintptr_t w0, uintptr_t w1) const {
    for (auto it = freeSet.lower_bound({size, 0}); it != freeSet.end(); ++it) {
      auto [fs, fa] = *it;
      if (fa < w0 && std::min(fa + fs, w0) - fa >= size) return fa;
      uintptr_t r0 = std::max(fa, w1);
      if (fa + fs > r0 && fa + fs - r0 >= size) return r0;
    }
    return 0;
  }

  // See Note [VMM compaction]. True when a window was cleared of live blocks.
  bool compactFor(size_t size) {
    const size_t w = (size + o.chunk - 1) / o.chunk;
    // Chunks the window's unmapped slots can get: fresh ones under the limit, or mapped chunks
    // no live block touches (moving blocks out of the window only fills holes elsewhere).
    size_t freshLeft = freshChunksLeft();
    size_t untouched = untouchedMapped;
    std::vector<std::pair<size_t, size_t>> cands;  // (live bytes, first slot)
    for (size_t s = 0; s < highSlot && s + w <= nSlots; ++s) {
      uintptr_t w0 = slotAddr(s), w1 = slotAddr(s + w);
      size_t holes = unmappedIn(s, s + w);
      if (holes > untouched && holes - untouched > freshLeft) continue;
      size_t cost = 0;
      bool movable = true;
      for (auto it = firstEndingAfter(w0); it != blocks.end() && it->first < w1; ++it) {
        if (it->second.free) continue;
        if (!it->second.meta.owner) {
          movable = false;
          break;
        }
        cost += it->second.size;
      }
      if (movable && cost > 0) cands.emplace_back(cost, s);
    }
    std::sort(cands.begin(), cands.end());
    for (size_t c = 0; c < std::min<size_t>(cands.size(), 4); ++c) {
      uintptr_t w0 = slotAddr(cands[c].second), w1 = slotAddr(cands[c].second + w);
      std::vector<uintptr_t> moving;
      for (auto it = firstEndingAfter(w0); it != blocks.end() && it->first < w1; ++it)
        if (!it->second.free) moving.push_back(it->first);
      std::sort(moving.begin(), moving.end(),
                [&](uintptr_t x, uintptr_t y) { return blocks[x].size > blocks[y].size; });
      // Simulation: best-fit the blocks into the free pieces outside the window.
      std::multiset<size_t> pieces;
      for (auto [fs, fa] : freeSet) {
        if (fa < w0) pieces.insert(std::min(fa + fs, w0) - fa);
        if (fa + fs > w1) pieces.insert(fa + fs - std::max(fa, w1));
      }
      bool fits = true;
      for (uintptr_t a : moving) {
        size_t bs = blocks[a].size;
        auto it = pieces.lower_bound(bs);
        if (it == pieces.end()) {
          fits = false;
          break;
        }
        size_t rest = *it - bs;
        pieces.erase(it);
        if (rest) pieces.insert(rest);
      }
      if (!fits) continue;
      for (uintptr_t a : moving) moveBlock(a, w0, w1);
      st.compactions++;
      st.defrags++;
      return true;
    }
    return false;
  }

  // Copies the live block at `a` to free space outside [w0, w1) and points its Buffer there.
  void moveBlock(uintptr_t a, uintptr_t w0, uintptr_t w1) {
    VBlock b = blocks.at(a);
    uintptr_t to = placeOutside(b.size, w0, w1);
    KEEL_CHECK(to != 0, "vmm allocator: compaction lost its planned space");  // simulated above
    removeFreeRange(to, b.size);
    std::memcpy(reinterpret_cast<void*>(to), reinterpret_cast<const void*>(a), b.requested);
    blocks.emplace(to, b);
    touchRange(to, b.size, +1);
    blocks.erase(a);
    touchRange(a, b.size, -1);
    insertFree(a, b.size);
    b.meta.owner->relocate(reinterpret_cast<void*>(to));
    st.blocksMoved++;
    st.bytesCopied += b.requested;
    events.add(MemEventKind::Compact, a, b.size, st.allocated, st.reserved, to, b.meta.bufferId);
  }

  void* allocate(size_t bytes) {
    size_t size = alloc::roundUp(std::max<size_t>(bytes, 1), o.round);
    uintptr_t a = 0;
    if (auto it = freeSet.lower_bound({size, 0}); it != freeSet.end()) a = it->second;
    if (!a && size <= nSlots * o.chunk) a = growOrRemap(size);
    if (!a && size <= nSlots * o.chunk && o.compaction && detail::allocContext().safePoint &&
        compactFor(size))
      a = growOrRemap(size);
    if (!a) {
      st.ooms++;
      throw alloc::outOfMemory(o.name, bytes, o.limit, statsLocked());
    }
    VBlock& b = carve(a, size);
    b.requested = bytes;
    b.meta = alloc::currentMeta(reuse, a);
    touchRange(a, size, +1);
    st.allocated += size;
    st.active += bytes;
    st.allocs++;
    updatePeaks();
    events.add(MemEventKind::Alloc, a, size, st.allocated, st.reserved);
    return reinterpret_cast<void*>(a);
  }

  void deallocate(void* p) {
    auto it = blocks.find(reinterpret_cast<uintptr_t>(p));
    if (it == blocks.end() || it->second.free) return;  // not ours: ignored (must not throw)
    uintptr_t a = it->first;
    const VBlock& b = it->second;
    touchRange(a, b.size, -1);
    st.allocated -= b.size;
    st.active -= b.requested;
    st.frees++;
    events.add(MemEventKind::Free, a, b.size, st.allocated, st.reserved);
    makeFree(it);
  }

  void release() {
    for (size_t s = 0; s < highSlot; ++s) {
      if (slotPhys[s] < 0 || touch[s] != 0) continue;
      int64_t p = unmapSlot(s);
      fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(p) * off_t(o.chunk),
                off_t(o.chunk));
      freePhys.push_back(p);
      st.chunksReleased++;
      events.add(MemEventKind::Release, slotAddr(s), o.chunk, st.allocated, st.reserved);
    }
  }
};

VmmAllocator::VmmAllocator(VmmAllocatorOptions o) : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  long page = sysconf(_SC_PAGESIZE);
  KEEL_CHECK(o.chunk > 0 && o.chunk % size_t(page) == 0 && o.round > 0 && o.round <= o.chunk,
             "vmm allocator: the chunk size must be a multiple of the page size");
  o.reserve = alloc::roundUp(std::max(o.reserve, o.chunk), o.chunk);
  m.o = std::move(o);
  m.nSlots = m.o.reserve / m.o.chunk;
  m.fd = memfd_create("keel-vmm", MFD_CLOEXEC);
  KEEL_CHECK(m.fd >= 0, "vmm allocator: memfd_create failed: ", std::strerror(errno));
  if (ftruncate(m.fd, off_t(m.o.reserve)) != 0) {
    int e = errno;
    close(m.fd);
    throw Error(detail::concat("vmm allocator: ftruncate failed: ", std::strerror(e)));
  }
  void* p =
      mmap(nullptr, m.o.reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(m.fd);
    throw Error(detail::concat("vmm allocator: reserving ", m.o.reserve,
                               " bytes of addresses failed: ", std::strerror(e)));
  }
  m.base = reinterpret_cast<uintptr_t>(p);
  m.slotPhys.assign(m.nSlots, -1);
  m.touch.assign(m.nSlots, 0);
}

VmmAllocator::~VmmAllocator() {
  munmap(reinterpret_cast<void*>(impl_->base), impl_->o.reserve);
  close(impl_->fd);
}

void* VmmAllocator::allocate(size_t bytes) {
  return alloc::lockedWithEvents(*impl_, [&] { return impl_->allocate(bytes); });
}

void VmmAllocator::deallocate(void* ptr, size_t) {
  alloc::lockedWithEvents(*impl_, [&] { impl_->deallocate(ptr); });
}

std::string VmmAllocator::name() const {
  return impl_->o.name;
}
size_t VmmAllocator::allocatedBytes() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->st.allocated;
}
size_t VmmAllocator::reservedBytes() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->st.reserved;
}
AllocatorStats VmmAllocator::stats() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->statsLocked();
}
void VmmAllocator::emptyCache() {
  alloc::lockedWithEvents(*impl_, [&] { impl_->release(); });
}
void VmmAllocator::resetPeaks() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  auto& s = impl_->st;
  s.peakAllocated = s.allocated;
  s.peakReserved = s.reserved;
  s.peakActive = s.active;
}
void VmmAllocator::setLimit(size_t bytes) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->o.limit = bytes;
}
MemorySnapshot VmmAllocator::snapshot() const {
  const auto& m = *impl_;
  std::lock_guard<std::mutex> lk(m.mu);
  MemorySnapshot snap;
  snap.allocator = m.o.name;
  snap.stats = m.statsLocked();
  for (size_t s = 0; s < m.highSlot;) {
    size_t e = s + 1;
    const bool mapped = m.slotPhys[s] >= 0;
    while (e < m.highSlot && (m.slotPhys[e] >= 0) == mapped) ++e;
    snap.segments.push_back({m.slotAddr(s), (e - s) * m.o.chunk, mapped});
    if (!mapped)
      snap.blocks.push_back(
          alloc::blockInfo(m.slotAddr(s), (e - s) * m.o.chunk, 0, BlockState::Unmapped, nullptr));
    s = e;
  }
  for (auto& [a, b] : m.blocks)
    snap.blocks.push_back(alloc::blockInfo(a, b.size, b.requested,
                                           b.free ? BlockState::Free : BlockState::Allocated,
                                           b.free ? nullptr : &b.meta));
  std::sort(snap.blocks.begin(), snap.blocks.end(),
            [](const BlockInfo& x, const BlockInfo& y) { return x.address < y.address; });
  return snap;
}

uintptr_t VmmAllocator::base() const {
  return impl_->base;
}

}  // namespace keel
