// The VMM allocators' shared bookkeeping: best fit over mapped slots, the remap plan, compaction.
// Memory itself is reached only through VmmChunkOps (vmm_core.h), so the CPU and CUDA allocators
// run exactly this code. See Note [VMM remap] and Note [VMM compaction].
#include "alloc/vmm_core.h"

#include <algorithm>
#include <cstdint>

namespace keel::alloc {

// Note [VMM remap]: an address range is reserved once and divided into slots of one chunk. A slot
// is either unmapped or maps one physical chunk (CPU: a chunk-sized range of a memfd; CUDA: one
// cuMemCreate allocation). Unmapping keeps the addresses reserved and the chunk's bytes; releasing
// gives the chunk's memory back. A request is served best-fit from the free blocks. When none is
// large enough, the allocator looks for a window of addresses, between two live blocks, made of
// free bytes and unmapped slots, that needs the fewest new chunks (the simulation: nothing changes
// until a plan is found). Below defragThreshold reserved bytes the missing chunks are fresh ones;
// above it, chunks that no live block touches are first unmapped from elsewhere and mapped into
// the window (a remap: the chunk keeps its bytes, but those bytes are free, and no live byte
// moves). Fresh chunks fill any remainder while the limit allows, and are created before anything
// is unmapped, so a system that cannot provide them leaves the allocator as it was; otherwise the
// request fails with keel::Error. When no mapped chunk is free of live blocks nothing can be
// remapped, so the request first tries fresh chunks at the top of the used range.
//
// Note [VMM compaction]: when no window can be made from free bytes and chunks (every chunk is
// touched by some live block and the limit forbids fresh ones) and the request comes at a safe
// point (Note [Buffer move]), live blocks are moved out of the way. Candidate windows are the
// chunk-aligned ranges of the request's chunk count that hold only free space and movable live
// blocks (blocks of a Buffer); they are tried cheapest first (fewest live bytes), each after a
// simulation that best-fits the window's live blocks into free space outside it. The moves then
// copy each block, call Buffer::relocate, and free the old place; remapping then fills the window.
// Blocks not owned by a Buffer (raw allocate calls), and Buffers a reader has pinned (Note [Reading
// buffers off the engine thread]), are never moved.

VmmCore::VmmCore(const VmmAllocatorOptions& o, uintptr_t base, VmmChunkOps& ops, Device device)
    : o_(o), base_(base), ops_(ops) {
  g_.events.setDevice(device);
  KEEL_CHECK(o_.chunk > 0 && o_.round > 0 && o_.round <= o_.chunk && o_.reserve >= o_.chunk &&
                 o_.reserve % o_.chunk == 0,
             o_.name, " allocator: the reservation must be a whole number of chunks");
  nSlots_ = o_.reserve / o_.chunk;
  slotPhys_.assign(nSlots_, -1);
  touch_.assign(nSlots_, 0);
}

void VmmCore::updatePeaks() {
  st_.peakAllocated = std::max(st_.peakAllocated, st_.allocated);
  st_.peakReserved = std::max(st_.peakReserved, st_.reserved);
  st_.peakActive = std::max(st_.peakActive, st_.active);
}

AllocatorStats VmmCore::statsLocked() const {
  AllocatorStats s = st_;
  s.blocks = blocks_.size() - freeSet_.size();
  s.freeBlocks = freeSet_.size();
  s.totalFree = s.reserved - s.allocated;
  s.largestFree = freeSet_.empty() ? 0 : freeSet_.rbegin()->first;
  s.segments = s.reserved / o_.chunk;
  return s;
}

// Fresh chunks the limit still allows.
size_t VmmCore::freshLeft() const {
  if (!o_.limit) return SIZE_MAX;
  return o_.limit > st_.reserved ? (o_.limit - st_.reserved) / o_.chunk : 0;
}

size_t VmmCore::unmappedIn(size_t s0, size_t s1) const {
  size_t n = 0;
  for (size_t s = s0; s < s1; ++s) n += slotPhys_[s] < 0;
  return n;
}

void VmmCore::addRawFree(uintptr_t a, size_t size) {
  blocks_.emplace(a, Block{size, 0, true, {}});
  freeSet_.emplace(size, a);
}

// Re-keys the free-set entry (size, a) as (newSize, newA) without reallocating its node.
void VmmCore::rekeyFree(size_t size, uintptr_t a, size_t newSize, uintptr_t newA) {
  auto node = freeSet_.extract({size, a});
  node.value() = {newSize, newA};
  freeSet_.insert(std::move(node));
}

// Turns the block at `it` (not in freeSet_) free, merging it with free neighbours. Node handles
// are reused, so the common paths allocate nothing (the fast path of every free).
void VmmCore::makeFree(Blocks::iterator it) {
  Block& b = it->second;
  b.free = true;
  b.requested = 0;
  b.meta = {};
  if (auto next = std::next(it);
      next != blocks_.end() && next->second.free && it->first + b.size == next->first) {
    freeSet_.erase({next->second.size, next->first});
    b.size += next->second.size;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free && prev->first + prev->second.size == it->first) {
      size_t old = prev->second.size;
      prev->second.size += b.size;
      blocks_.erase(it);
      rekeyFree(old, prev->first, prev->second.size, prev->first);
      return;
    }
  }
  freeSet_.emplace(b.size, it->first);
}

// Adds [a, a+size) as free, merging with free neighbours.
void VmmCore::insertFree(uintptr_t a, size_t size) {
  makeFree(blocks_.emplace(a, Block{size, 0, true, {}}).first);
}

// Makes [a, a+len) of free space a live block and returns it. From the start of a free block
// (best fit) it reuses the free block's nodes: no allocation, one tree search.
VmmCore::Block& VmmCore::carve(uintptr_t a, size_t len) {
  auto it = blocks_.find(a);
  if (it == blocks_.end()) {  // inside a free block (a window made by growOrRemap)
    removeFreeRange(a, len);
    it = blocks_.emplace(a, Block{len, 0, true, {}}).first;
  } else if (size_t fs = it->second.size; fs > len) {
    auto node = blocks_.extract(it);
    node.key() = a + len;
    node.mapped().size = fs - len;
    auto rest = blocks_.insert(std::move(node)).position;
    rekeyFree(fs, a, fs - len, a + len);
    it = blocks_.emplace_hint(rest, a, Block{len, 0, true, {}});
  } else {
    freeSet_.erase({fs, a});
  }
  it->second.free = false;
  return it->second;
}

// Removes [a, a+len) from the one free block that contains it. Carving from the block's start
// (what best fit does) moves the remainder's nodes instead of reallocating them.
void VmmCore::removeFreeRange(uintptr_t a, size_t len) {
  auto it = std::prev(blocks_.upper_bound(a));
  uintptr_t f0 = it->first;
  size_t fs = it->second.size;
  if (a == f0 && fs > len) {
    auto node = blocks_.extract(it);
    node.key() = a + len;
    node.mapped().size = fs - len;
    blocks_.insert(std::move(node));
    rekeyFree(fs, f0, fs - len, a + len);
    return;
  }
  freeSet_.erase({fs, f0});
  blocks_.erase(it);
  if (a > f0) addRawFree(f0, a - f0);
  if (f0 + fs > a + len) addRawFree(a + len, f0 + fs - (a + len));
}

void VmmCore::touchRange(uintptr_t a, size_t size, int delta) {
  for (size_t s = slotOf(a); s <= slotOf(a + size - 1); ++s) {
    if (touch_[s] == 0) untouchedMapped_--;
    touch_[s] += uint32_t(delta);
    if (touch_[s] == 0) untouchedMapped_++;
  }
}

// The first block that ends after address a.
VmmCore::Blocks::iterator VmmCore::firstEndingAfter(uintptr_t a) {
  auto it = blocks_.upper_bound(a);
  if (it != blocks_.begin()) {
    auto p = std::prev(it);
    if (p->first + p->second.size > a) return p;
  }
  return it;
}

// Maps n slots from s onto the chunks phys..phys+n-1 (one ops_.map call).
void VmmCore::mapRun(size_t s, size_t n, int64_t phys) {
  ops_.map(slotAddr(s), phys, n);
  for (size_t i = 0; i < n; ++i) {
    slotPhys_[s + i] = phys + int64_t(i);
    st_.reserved += o_.chunk;
    g_.events.add(MemEventKind::Map, slotAddr(s + i), o_.chunk, st_.allocated, st_.reserved);
  }
  highSlot_ = std::max(highSlot_, s + n);
  untouchedMapped_ += n;
  insertFree(slotAddr(s), n * o_.chunk);
}

// Unmaps a slot no live block touches; returns its physical chunk (bytes kept).
int64_t VmmCore::unmapSlot(size_t s) {
  removeFreeRange(slotAddr(s), o_.chunk);
  ops_.unmap(slotAddr(s));
  int64_t phys = slotPhys_[s];
  slotPhys_[s] = -1;
  untouchedMapped_--;
  st_.reserved -= o_.chunk;
  g_.events.add(MemEventKind::Unmap, slotAddr(s), o_.chunk, st_.allocated, st_.reserved);
  return phys;
}

// Creates the n fresh chunks a plan needs (released indices first, then never-used ones); all
// or none, and nothing else changes when the system refuses one.
bool VmmCore::createFresh(size_t n, Fresh& f) {
  const size_t k = std::min(n, freePhys_.size());
  f.recycled.assign(freePhys_.rbegin(), freePhys_.rbegin() + ptrdiff_t(k));
  f.nextRecycled = 0;
  f.run = nextPhys_;
  std::vector<int64_t> created;
  auto createOne = [&](int64_t p) {
    if (!ops_.create(p)) return false;
    created.push_back(p);
    return true;
  };
  bool ok = true;
  for (int64_t p : f.recycled) ok = ok && createOne(p);
  for (int64_t p = nextPhys_; ok && p < nextPhys_ + int64_t(n - k); ++p) ok = createOne(p);
  if (!ok) {
    for (int64_t p : created) ops_.release(p);
    return false;
  }
  freePhys_.resize(freePhys_.size() - k);
  nextPhys_ += int64_t(n - k);
  return true;
}

// Maps the chunks of `f` into the unmapped slots of [s0, s1): recycled ones one at a time, then
// each run of slots onto consecutive never-used chunks with one map call.
void VmmCore::mapFresh(size_t s0, size_t s1, Fresh& f) {
  for (size_t s = s0; s < s1;) {
    if (slotPhys_[s] >= 0) {
      ++s;
      continue;
    }
    size_t e = s;
    while (e < s1 && slotPhys_[e] < 0) ++e;
    while (s < e && f.nextRecycled < f.recycled.size()) {
      mapRun(s++, 1, f.recycled[f.nextRecycled++]);
      st_.chunksMapped++;
    }
    if (s < e) {
      mapRun(s, e - s, f.run);
      f.run += int64_t(e - s);
      st_.chunksMapped += e - s;
    }
    s = e;
  }
}

// When no mapped chunk is free of live blocks there is nothing to remap: every window needs
// fresh chunks, so take the top of the used range (extending the free block that ends there).
// Returns 0 when that does not fit the limit, the reservation or the system's memory.
uintptr_t VmmCore::growAtTop(size_t size) {
  const size_t high = highSlot_;
  const uintptr_t top = slotAddr(high);
  uintptr_t a = top;
  if (!blocks_.empty()) {
    auto last = std::prev(blocks_.end());
    if (last->second.free && last->first + last->second.size == top) a = last->first;
  }
  if (a + size > base_ + nSlots_ * o_.chunk) return 0;
  const size_t s1 = slotOf(a + size - 1) + 1;
  Fresh f;
  if (s1 - high > freshLeft() || !createFresh(s1 - high, f)) return 0;
  mapFresh(high, s1, f);
  updatePeaks();
  return a;
}

// The simulation of Note [VMM remap]: the lowest window of `size` bytes between live blocks that
// needs the fewest new chunks; cost = SIZE_MAX when there is none.
uintptr_t VmmCore::findWindow(size_t size, size_t& bestCost) const {
  const uintptr_t end = base_ + nSlots_ * o_.chunk;
  uintptr_t bestA = 0;
  bestCost = SIZE_MAX;
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
  uintptr_t g0 = base_;
  for (auto& [a, b] : blocks_) {
    if (b.free) {
      gapFree.emplace_back(a, b.size);
      continue;
    }
    gap(g0, a);
    g0 = a + b.size;
  }
  gap(g0, end);
  return bestA;
}

// Slow path: see Note [VMM remap]. Returns 0 when the request cannot be met.
uintptr_t VmmCore::growOrRemap(size_t size) {
  if (untouchedMapped_ == 0)
    if (uintptr_t a = growAtTop(size)) return a;
  size_t need = 0;
  const uintptr_t a = findWindow(size, need);
  if (need == SIZE_MAX) return 0;
  const size_t w0 = slotOf(a), w1 = slotOf(a + size - 1) + 1;
  const size_t fresh = freshLeft();
  std::vector<size_t> sources;
  bool grow = st_.reserved + need * o_.chunk <= o_.defragThreshold && need <= fresh;
  if (!grow) {
    for (size_t s = 0; s < highSlot_ && sources.size() < need; ++s)
      if (slotPhys_[s] >= 0 && touch_[s] == 0 && (s < w0 || s >= w1)) sources.push_back(s);
    if (need - sources.size() > fresh) return 0;  // the simulation says it cannot fit
  }
  Fresh f;
  if (!createFresh(need - sources.size(), f)) return 0;
  if (!sources.empty()) ops_.sync();
  std::vector<int64_t> phys;
  for (size_t s : sources) phys.push_back(unmapSlot(s));
  if (!sources.empty()) {
    st_.defrags++;
    st_.chunksRemapped += sources.size();
  }
  for (size_t s = w0; s < w1 && !phys.empty(); ++s) {
    if (slotPhys_[s] >= 0) continue;
    int64_t p = phys.back();
    phys.pop_back();
    g_.events.add(MemEventKind::Move, slotAddr(sources[phys.size()]), o_.chunk, st_.allocated,
                  st_.reserved, slotAddr(s));
    mapRun(s, 1, p);
  }
  mapFresh(w0, w1, f);
  updatePeaks();
  return a;
}

// Free space outside [w0, w1) that a block of `size` bytes could move to: its address, or 0.
uintptr_t VmmCore::placeOutside(size_t size, uintptr_t w0, uintptr_t w1) const {
  for (auto it = freeSet_.lower_bound({size, 0}); it != freeSet_.end(); ++it) {
    auto [fs, fa] = *it;
    if (fa < w0 && std::min(fa + fs, w0) - fa >= size) return fa;
    uintptr_t r0 = std::max(fa, w1);
    if (fa + fs > r0 && fa + fs - r0 >= size) return r0;
  }
  return 0;
}

// See Note [VMM compaction]. True when a window was cleared of live blocks.
bool VmmCore::compactFor(size_t size) {
  detail::BufferMoveLock pins;  // no pin changes from here to the last move
  const size_t w = (size + o_.chunk - 1) / o_.chunk;
  // Chunks the window's unmapped slots can get: fresh ones under the limit, or mapped chunks
  // no live block touches (moving blocks out of the window only fills holes elsewhere).
  const size_t fresh = freshLeft();
  const size_t untouched = untouchedMapped_;
  std::vector<std::pair<size_t, size_t>> cands;  // (live bytes, first slot)
  for (size_t s = 0; s < highSlot_ && s + w <= nSlots_; ++s) {
    uintptr_t w0 = slotAddr(s), w1 = slotAddr(s + w);
    size_t holes = unmappedIn(s, s + w);
    if (holes > untouched && holes - untouched > fresh) continue;
    size_t cost = 0;
    bool movable = true;
    for (auto it = firstEndingAfter(w0); it != blocks_.end() && it->first < w1; ++it) {
      if (it->second.free) continue;
      if (!it->second.meta.owner || it->second.meta.owner->pinned()) {
        movable = false;  // a raw block, or a buffer a reader has pinned
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
    for (auto it = firstEndingAfter(w0); it != blocks_.end() && it->first < w1; ++it)
      if (!it->second.free) moving.push_back(it->first);
    std::sort(moving.begin(), moving.end(),
              [&](uintptr_t x, uintptr_t y) { return blocks_.at(x).size > blocks_.at(y).size; });
    // Simulation: best-fit the blocks into the free pieces outside the window.
    std::multiset<size_t> pieces;
    for (auto [fs, fa] : freeSet_) {
      if (fa < w0) pieces.insert(std::min(fa + fs, w0) - fa);
      if (fa + fs > w1) pieces.insert(fa + fs - std::max(fa, w1));
    }
    bool fits = true;
    for (uintptr_t a : moving) {
      size_t bs = blocks_.at(a).size;
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
    ops_.sync();
    for (uintptr_t a : moving) moveBlock(a, w0, w1);
    st_.compactions++;
    st_.defrags++;
    return true;
  }
  return false;
}

// Copies the live block at `a` to free space outside [w0, w1) and points its Buffer there.
void VmmCore::moveBlock(uintptr_t a, uintptr_t w0, uintptr_t w1) {
  Block b = blocks_.at(a);
  uintptr_t to = placeOutside(b.size, w0, w1);
  KEEL_CHECK(to != 0, o_.name, " allocator: compaction lost its planned space");  // simulated
  removeFreeRange(to, b.size);
  ops_.copy(to, a, b.requested);
  blocks_.emplace(to, b);
  touchRange(to, b.size, +1);
  blocks_.erase(a);
  touchRange(a, b.size, -1);
  insertFree(a, b.size);
  b.meta.owner->relocate(reinterpret_cast<void*>(to));
  st_.blocksMoved++;
  st_.bytesCopied += b.requested;
  g_.events.add(MemEventKind::Compact, a, b.size, st_.allocated, st_.reserved, to, b.meta.bufferId);
}

void* VmmCore::allocateLocked(size_t bytes) {
  size_t size = roundUp(std::max<size_t>(bytes, 1), o_.round);
  uintptr_t a = 0;
  if (auto it = freeSet_.lower_bound({size, 0}); it != freeSet_.end()) a = it->second;
  if (!a && size <= nSlots_ * o_.chunk) a = growOrRemap(size);
  if (!a && size <= nSlots_ * o_.chunk && o_.compaction && detail::allocContext().safePoint &&
      compactFor(size))
    a = growOrRemap(size);
  if (!a) {
    st_.ooms++;
    g_.events.add(MemEventKind::Oom, 0, bytes, st_.allocated, st_.reserved);
    throw outOfMemory(o_.name, bytes, o_.limit, statsLocked(), o_.chunk);
  }
  Block& b = carve(a, size);
  b.requested = bytes;
  b.meta = currentMeta(reuse_, a);
  touchRange(a, size, +1);
  st_.allocated += size;
  st_.active += bytes;
  st_.allocs++;
  updatePeaks();
  g_.events.add(MemEventKind::Alloc, a, size, st_.allocated, st_.reserved);
  return reinterpret_cast<void*>(a);
}

void VmmCore::deallocateLocked(void* p) {
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(p));
  if (it == blocks_.end() || it->second.free) return;  // not ours: ignored (must not throw)
  uintptr_t a = it->first;
  const Block& b = it->second;
  touchRange(a, b.size, -1);
  st_.allocated -= b.size;
  st_.active -= b.requested;
  st_.frees++;
  g_.events.add(MemEventKind::Free, a, b.size, st_.allocated, st_.reserved);
  makeFree(it);
}

void VmmCore::releaseLocked() {
  bool synced = false;
  for (size_t s = 0; s < highSlot_; ++s) {
    if (slotPhys_[s] < 0 || touch_[s] != 0) continue;
    if (!synced) ops_.sync(), synced = true;
    int64_t p = unmapSlot(s);
    ops_.release(p);
    freePhys_.push_back(p);
    st_.chunksReleased++;
    g_.events.add(MemEventKind::Release, slotAddr(s), o_.chunk, st_.allocated, st_.reserved);
  }
}

void* VmmCore::allocate(size_t bytes) {
  return lockedWithEvents(g_, [&] { return allocateLocked(bytes); });
}
void VmmCore::deallocate(void* ptr) {
  lockedWithEvents(g_, [&] { deallocateLocked(ptr); });
}
void VmmCore::emptyCache() {
  lockedWithEvents(g_, [&] { releaseLocked(); });
}
size_t VmmCore::allocatedBytes() const {
  std::lock_guard<std::mutex> lk(g_.mu);
  return st_.allocated;
}
size_t VmmCore::reservedBytes() const {
  std::lock_guard<std::mutex> lk(g_.mu);
  return st_.reserved;
}
AllocatorStats VmmCore::stats() const {
  std::lock_guard<std::mutex> lk(g_.mu);
  return statsLocked();
}
void VmmCore::resetPeaks() {
  std::lock_guard<std::mutex> lk(g_.mu);
  st_.peakAllocated = st_.allocated;
  st_.peakReserved = st_.reserved;
  st_.peakActive = st_.active;
}
void VmmCore::setLimit(size_t bytes) {
  std::lock_guard<std::mutex> lk(g_.mu);
  o_.limit = bytes;
}

MemorySnapshot VmmCore::snapshot() const {
  std::lock_guard<std::mutex> lk(g_.mu);
  MemorySnapshot snap;
  snap.allocator = o_.name;
  snap.stats = statsLocked();
  snap.chunk = o_.chunk;
  for (size_t s = 0; s < highSlot_;) {
    size_t e = s + 1;
    const bool mapped = slotPhys_[s] >= 0;
    while (e < highSlot_ && (slotPhys_[e] >= 0) == mapped) ++e;
    snap.segments.push_back({slotAddr(s), (e - s) * o_.chunk, mapped});
    if (!mapped)
      snap.blocks.push_back(
          blockInfo(slotAddr(s), (e - s) * o_.chunk, 0, BlockState::Unmapped, nullptr));
    s = e;
  }
  for (auto& [a, b] : blocks_)
    snap.blocks.push_back(blockInfo(a, b.size, b.requested,
                                    b.free ? BlockState::Free : BlockState::Allocated,
                                    b.free ? nullptr : &b.meta));
  std::sort(snap.blocks.begin(), snap.blocks.end(),
            [](const BlockInfo& x, const BlockInfo& y) { return x.address < y.address; });
  return snap;
}

}  // namespace keel::alloc
