// The bookkeeping half of a virtual-memory allocator, shared by the CPU (memfd + mmap) and CUDA
// (cuMemCreate + cuMemMap) VMM allocators: slots of one chunk over a reserved range, best fit over
// the mapped space, the growOrRemap plan and compaction. It never touches memory itself: every
// map, unmap, chunk creation, release and copy goes through VmmChunkOps. See Note [VMM remap].
// Invariants: blocks cover only mapped slots; address-adjacent free blocks are always merged;
// touch_[slot] counts the live blocks touching a slot, and only untouched slots are remapped.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "alloc/alloc_util.h"

namespace keel::alloc {

// What a VMM allocator asks of its memory system. Physical chunks are named by small indices the
// core hands out (a released index may be handed out again). Called with the core's lock held.
class VmmChunkOps {
 public:
  virtual ~VmmChunkOps() = default;
  // Makes physical chunk `phys` exist, before it is first mapped (again, after a release). False
  // when the system has no memory for it; the request then fails with the out-of-memory error.
  virtual bool create(int64_t phys) = 0;
  // Maps the n chunks phys, phys+1, ... read-write at the n slots from `addr` (n > 1 only for
  // never-used chunks, so a memfd maps them with one call).
  virtual void map(uintptr_t addr, int64_t phys, size_t n) = 0;
  // Unmaps the slot at `addr`; the addresses stay reserved and the chunk keeps its bytes.
  virtual void unmap(uintptr_t addr) = 0;
  // Gives an unmapped chunk's memory back to the system.
  virtual void release(int64_t phys) = 0;
  // Copies live bytes (compaction); both ranges are mapped.
  virtual void copy(uintptr_t to, uintptr_t from, size_t bytes) = 0;
  // Called before chunks are unmapped or live bytes copied: waits for queued work that may still
  // use them (a GPU's streams). Host memory has none.
  virtual void sync() {}
};

class VmmCore {
 public:
  // `o.reserve` bytes of addresses from `base` (a multiple of o.chunk) are reserved by the caller,
  // who keeps them, and `ops`, alive as long as the core. Events carry `device`.
  VmmCore(const VmmAllocatorOptions& o, uintptr_t base, VmmChunkOps& ops, Device device = {});
  VmmCore(const VmmCore&) = delete;
  VmmCore& operator=(const VmmCore&) = delete;

  // The Allocator entry points; each takes the lock and delivers events after releasing it.
  void* allocate(size_t bytes);
  void deallocate(void* ptr);
  void emptyCache();  // unmaps and releases every chunk no live block touches
  size_t allocatedBytes() const;
  size_t reservedBytes() const;
  AllocatorStats stats() const;
  MemorySnapshot snapshot() const;
  void resetPeaks();
  void setLimit(size_t bytes);

  const std::string& name() const { return o_.name; }
  size_t chunk() const { return o_.chunk; }
  uintptr_t base() const { return base_; }
  // Calls f(address, phys) for every mapped slot (destructors unmap them before releasing).
  template <class F>
  void forEachMapped(F&& f) const {
    std::lock_guard<std::mutex> lk(g_.mu);
    for (size_t s = 0; s < highSlot_; ++s)
      if (slotPhys_[s] >= 0) f(slotAddr(s), slotPhys_[s]);
  }

 private:
  struct Block {
    size_t size = 0;
    size_t requested = 0;
    bool free = true;
    BlockMeta meta;  // live blocks
  };
  using Blocks = std::map<uintptr_t, Block>;
  struct Guarded {
    std::mutex mu;
    PendingEvents events;
  };

  // Chunks created for one plan before anything is unmapped: released indices first, then a run
  // of never-used ones.
  struct Fresh {
    std::vector<int64_t> recycled;
    size_t nextRecycled = 0;
    int64_t run = 0;
  };

  size_t slotOf(uintptr_t a) const { return (a - base_) / o_.chunk; }
  uintptr_t slotAddr(size_t s) const { return base_ + s * o_.chunk; }
  size_t freshLeft() const;
  size_t unmappedIn(size_t s0, size_t s1) const;
  void updatePeaks();
  AllocatorStats statsLocked() const;
  void addRawFree(uintptr_t a, size_t size);
  void rekeyFree(size_t size, uintptr_t a, size_t newSize, uintptr_t newA);
  void makeFree(Blocks::iterator it);
  void insertFree(uintptr_t a, size_t size);
  Block& carve(uintptr_t a, size_t len);
  void removeFreeRange(uintptr_t a, size_t len);
  void touchRange(uintptr_t a, size_t size, int delta);
  Blocks::iterator firstEndingAfter(uintptr_t a);
  void mapRun(size_t s, size_t n, int64_t phys);
  int64_t unmapSlot(size_t s);
  bool createFresh(size_t n, Fresh& f);
  void mapFresh(size_t s0, size_t s1, Fresh& f);
  uintptr_t growAtTop(size_t size);
  uintptr_t findWindow(size_t size, size_t& cost) const;
  uintptr_t growOrRemap(size_t size);
  uintptr_t placeOutside(size_t size, uintptr_t w0, uintptr_t w1) const;
  bool compactFor(size_t size);
  void moveBlock(uintptr_t a, uintptr_t w0, uintptr_t w1);
  void* allocateLocked(size_t bytes);
  void deallocateLocked(void* ptr);
  void releaseLocked();

  VmmAllocatorOptions o_;
  uintptr_t base_ = 0;
  size_t nSlots_ = 0;
  VmmChunkOps& ops_;
  mutable Guarded g_;
  std::vector<int64_t> slotPhys_;  // physical chunk per slot, -1 = unmapped
  std::vector<uint32_t> touch_;    // live blocks touching each slot
  size_t highSlot_ = 0;            // one past the highest slot ever mapped
  size_t untouchedMapped_ = 0;     // mapped slots no live block touches (remap sources)
  std::vector<int64_t> freePhys_;  // released chunk indices, to be created again
  int64_t nextPhys_ = 0;
  Blocks blocks_;  // free and live blocks by address
  std::set<std::pair<size_t, uintptr_t>> freeSet_;
  AllocatorStats st_;
  ReuseCounter reuse_;
};

}  // namespace keel::alloc
