// Allocators: a caching allocator (the baseline most frameworks ship) and a virtual-memory (VMM)
// allocator that defragments by remapping physical chunks and compacting live buffers — the
// default for host memory (the plain aligned_alloc "host" allocator remains selectable).
// Invariant: an allocator outlives every Buffer it served; the process-wide instances below are
// never destroyed. Statistics are defined in docs/memory.md. See Note [VMM remap].
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <vector>

#include "keel/base/non_copyable.h"
#include "keel/buffer.h"
#include "keel/observer.h"

namespace keel {

// A point-in-time summary of an allocator (all sizes in bytes). See docs/memory.md.
struct AllocatorStats {
  size_t allocated = 0;      // sum of live block sizes (after rounding)
  size_t reserved = 0;       // memory obtained from the system (segments or mapped chunks)
  size_t active = 0;         // sum of the sizes callers asked for, over live blocks
  size_t peakAllocated = 0;  // maxima since construction or resetPeaks()
  size_t peakReserved = 0;
  size_t peakActive = 0;
  size_t segments = 0;     // caching: mmap'd segments; vmm: mapped 2 MiB chunks
  size_t blocks = 0;       // live blocks
  size_t freeBlocks = 0;   // free blocks inside reserved memory
  size_t largestFree = 0;  // largest free block
  size_t totalFree = 0;    // reserved - allocated
  uint64_t allocs = 0, frees = 0, ooms = 0;
  // VMM only: defragmentations that remapped at least one chunk, chunks remapped, fresh chunks
  // mapped, chunks released, bytes of live data copied (always 0: no compaction).
  // VMM only: defragmentations (remap or compaction), chunks remapped, fresh chunks mapped, chunks
  // released, compactions, live blocks moved by them and the bytes they copied.
  uint64_t defrags = 0, chunksRemapped = 0, chunksMapped = 0, chunksReleased = 0;
  uint64_t compactions = 0, blocksMoved = 0, bytesCopied = 0;

  // (reserved - allocated) / reserved; 0 when nothing is reserved.
  double fragmentation() const;
  // 1 - peakAllocated / peakReserved: the share of the high-water mark of reserved memory that
  // the high-water mark of live data did not need. 0 when nothing was reserved.
  double peakFragmentation() const;
  // 1 - largestFree / totalFree: 0 when all free memory is one block; 0 when none is free.
  double scatter() const;
};

// ---- snapshots -------------------------------------------------------------------------------
enum class BlockState : uint8_t { Allocated, Free, Unmapped };
std::string_view blockStateName(BlockState s);  // "allocated", "free", "unmapped"

struct BlockInfo {
  uint64_t address = 0;
  uint64_t size = 0;       // bytes (after rounding)
  uint64_t requested = 0;  // bytes asked for (allocated blocks)
  BlockState state = BlockState::Free;
  uint64_t opSeq = 0;     // op that allocated it (0: outside ops)
  uint64_t bufferId = 0;  // owning Buffer (Buffer::id(); tensors carry it); 0: a raw allocation
  MemTag tag = MemTag::None;
  // Block id = (address, reuse): reuse counts the blocks allocated at this address before.
  uint32_t reuse = 0;
};

struct SegmentInfo {
  uint64_t address = 0;
  uint64_t size = 0;
  bool mapped = true;  // vmm: false for a run of unmapped slots below the highest mapped one
};

struct MemorySnapshot {
  std::string allocator;
  AllocatorStats stats;
  std::vector<SegmentInfo> segments;  // by address
  std::vector<BlockInfo> blocks;      // by address: allocated, free and (vmm) unmapped
  uint64_t chunk = 0;  // vmm: its chunk size (a segment is a run of chunks); 0 for the others
};

// ---- tracking scopes -----------------------------------------------------------------------
struct TrackedBlock {
  uint64_t address = 0, bytes = 0, opSeq = 0, bufferId = 0;
  std::string op;  // name of the op that allocated it; empty outside ops
  MemTag tag = MemTag::None;
};

struct MemoryTrackSummary {
  std::string name;
  uint64_t allocs = 0, frees = 0;  // every alloc/free event inside the section
  uint64_t bytesAllocated = 0, bytesFreed = 0;
  uint64_t peakBytes = 0;   // max over the section of the bytes allocated in it and still live
  uint64_t aliveBytes = 0;  // allocated in the section and live at its end
  std::vector<TrackedBlock> alive;  // those blocks, largest first
};
// A few lines: counts, bytes, peak, and the blocks still alive with the op that allocated them.
std::string formatTrackSummary(const MemoryTrackSummary& s, size_t maxBlocks = 10);

// Records every allocation and free (all allocators, all threads) between construction and end()
// or destruction, and marks the section in recordings (track_begin/track_end events).
class MemoryTrackingScope : NonCopyable {
 public:
  explicit MemoryTrackingScope(std::string name);
  ~MemoryTrackingScope();
  MemoryTrackSummary summary() const;  // so far
  MemoryTrackSummary end();            // stops tracking (idempotent) and returns the summary

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// "allocated 3.0 MiB, reserved 8.0 MiB, largest free block 2.0 MiB, fragmentation 62.5%, ..."
std::string memorySummary(const AllocatorStats& s);

struct CachingAllocatorOptions {
  size_t limit = 0;                // bytes that may be reserved; 0 = unlimited
  size_t round = 512;              // every request is rounded up to this
  size_t smallMax = 1 << 20;       // requests <= this use the small pool
  size_t smallSegment = 2 << 20;   // segment size of the small pool
  size_t midMax = 10 << 20;        // large requests < this share a largeSegment
  size_t largeSegment = 20 << 20;  // segment size for requests in (smallMax, midMax)
  size_t largeRound = 2 << 20;     // requests >= midMax get a segment rounded to this
  std::string name = "caching";
  // Where segments come from: null, anonymous mmap (host memory); otherwise these (a device's
  // memory: the CUDA backend passes cudaMalloc and cudaFree). mapSegment returns null when out of
  // memory. `device` stamps the allocator's events.
  std::function<void*(size_t)> mapSegment;
  std::function<void(void*, size_t)> unmapSegment;
  Device device;
};

// Best-fit over free blocks ordered by (size, address) in a small and a large pool; splits blocks
// and merges free neighbours; segments come from mmap and go back only in emptyCache() (or when a
// request would exceed the limit). One instance serves one device.
class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(CachingAllocatorOptions o = {});
  ~CachingAllocator() override;
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  std::string name() const override;
  size_t allocatedBytes() const override;
  size_t reservedBytes() const override;
  AllocatorStats stats() const override;
  void emptyCache() override;
  void resetPeaks() override;
  MemorySnapshot snapshot() const override;
  void setLimit(size_t bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct VmmAllocatorOptions {
  size_t reserve = size_t(64) << 30;  // virtual address range reserved once
  size_t chunk = 2 << 20;             // physical chunk size (multiple of the page size)
  size_t limit = 0;                   // physical bytes that may be mapped; 0 = unlimited
  // Below this many reserved bytes a request that does not fit grows with fresh chunks; at or
  // above it free chunks are remapped first. 0: always remap before growing.
  size_t defragThreshold = 0;
  // When remapping cannot make room, move live Buffers out of the way (at safe points only; see
  // Note [Buffer move]).
  bool compaction = true;
  size_t round = 512;
  std::string name = "vmm";
};

// Linux CPU virtual-memory allocator: a PROT_NONE reservation, physical chunks from a memfd mapped
// with MAP_FIXED|MAP_SHARED, best-fit over the mapped space, and defragmentation by remapping free
// chunks (no live byte is copied) and, when that cannot help, by compacting live Buffers. See
// Note [VMM remap] and Note [VMM compaction].
class VmmAllocator final : public Allocator {
 public:
  explicit VmmAllocator(VmmAllocatorOptions o = {});
  ~VmmAllocator() override;
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  std::string name() const override;
  size_t allocatedBytes() const override;
  size_t reservedBytes() const override;
  AllocatorStats stats() const override;
  // Unmaps every chunk no live block touches and releases its memory (fallocate PUNCH_HOLE).
  void emptyCache() override;
  void resetPeaks() override;
  MemorySnapshot snapshot() const override;
  void setLimit(size_t bytes);
  // Start of the reservation (tests compute chunk indices from it).
  uintptr_t base() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- selection (KEEL_ALLOCATOR) -------------------------------------------------------------

// The allocator host backends use when setAllocator installed none. Read once from the
// environment variable KEEL_ALLOCATOR=host|caching|vmm (default vmm, host in ASan builds; else
// throws keel::Error at the first allocation); setDefaultAllocatorKind overrides it for new
// buffers.
AllocatorKind defaultAllocatorKind();
void setDefaultAllocatorKind(AllocatorKind k);
// What KEEL_ALLOCATOR (or, unset, the build's default) says, whatever setDefaultAllocatorKind
// installed since: the choice a run makes when neither its command line nor its config names
// an allocator. Throws keel::Error on a bad KEEL_ALLOCATOR.
AllocatorKind environmentAllocatorKind();
// A run's allocator: `flag` (a command line's --alloc) if given, else `configValue` (a config's
// "allocator"), else environmentAllocatorKind(). Throws keel::Error naming `what` and the value
// when it is not host, caching or vmm.
AllocatorKind resolveAllocatorKind(std::string_view flag, std::string_view configValue,
                                   std::string_view what = "allocator");
// The allocator a run gets when it asks for k: k itself, or the caching allocator when k is vmm
// and the process's VMM allocator cannot be created here (an address-space or file-size limit
// smaller than its reservation: Note [VMM fallback]); *why then says why in one line (else it is
// emptied). Creates the VMM allocator when k is vmm.
AllocatorKind usableAllocatorKind(AllocatorKind k, std::string* why);
// Process-wide instances (created on first use, never destroyed). KEEL_MEMORY_LIMIT (bytes, with
// an optional K/M/G suffix) sets the caching and vmm limits.
Allocator& hostAllocator();
CachingAllocator& cachingAllocator();
VmmAllocator& vmmAllocator();
Allocator& allocatorOfKind(AllocatorKind k);
// Snapshots of the allocators new host buffers come from (the cpu and cpu-ref backends'; each
// allocator once). A capture that starts mid-run records from them what was already live.
std::vector<MemorySnapshot> hostAllocatorSnapshots();

}  // namespace keel
