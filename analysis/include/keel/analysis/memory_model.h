// MemoryModel: a recording's allocator events (mem_events) replayed into the state of memory at
// any event: live blocks, segments (caching reserves, vmm chunks), why each block is still alive,
// tracked-section summaries and size histograms. Plain C++ over storage records (no Qt), built
// once off the GUI thread and shared read-only. See Note [Memory replay] in memory_model.cpp.
// Invariant: stateAt(k) equals replaying events 0..k from nothing (checkpoints only make it fast).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "keel/base/text.h"  // formatBytes
#include "keel/storage/records.h"

namespace keel::storage {
class Recording;
}

namespace keel::analysis {

// One op, as the memory view needs it (from storage::OpRecord).
struct MemOp {
  uint64_t seq = 0;
  int64_t step = 0;
  std::string name;
  Phase phase = Phase::Forward;
  std::string scope;
  int64_t beginNs = 0, endNs = 0;
  uint64_t forwardSeq = 0;  // backward ops: the forward op they differentiate
  int64_t stackId = -1;
  // Forward ops: the backward op (forwardSeq == seq) that ends last, and when; 0: none recorded.
  uint64_t backwardSeq = 0;
  int64_t backwardEndNs = 0;
  std::vector<uint64_t> outputBuffers;  // bufferId of each output tensor
};

// A tensor that lives in a buffer: the first op output (or, failing that, input) seen with it.
struct MemTensor {
  uint64_t opSeq = 0;
  bool output = true;
  int32_t index = 0;
  uint64_t tensorId = 0;
  std::vector<int64_t> shape;
  std::string dtype;
};

// What the recording says about one engine Buffer (by bufferId).
struct MemBuffer {
  std::optional<MemTensor> tensor;  // the first output with this buffer, else the first input
  // The first op output that views this buffer: same bufferId, another tensor id, a later op.
  uint64_t viewOpSeq = 0;
};

// A live block: its current address and size, and the index of the alloc event that made it
// (which carries the op, step, stack, bufferId and tag).
struct MemBlock {
  uint64_t address = 0, bytes = 0;
  uint32_t allocEvent = 0;
  bool operator==(const MemBlock&) const = default;
};

// A piece of reserved address space: a caching allocator's segment (reserve) or one vmm chunk
// (map); an unmapped vmm chunk stays, with mapped = false, so the map can show the hole.
struct MemSegment {
  uint64_t address = 0, bytes = 0;
  bool mapped = true;
  bool operator==(const MemSegment&) const = default;
};

// Memory right after event `cursor` (events 0..cursor applied).
struct MemState {
  int64_t cursor = -1;               // -1: before the first event
  std::vector<MemBlock> blocks;      // live, by address
  std::vector<MemSegment> segments;  // by address
  uint64_t liveBytes = 0;            // sum of blocks' bytes
};

// Why a block is still alive at the cursor: see Note [Why alive] in memory_model.cpp.
enum class AliveReason {
  Parameter,
  OptimizerState,
  InputBatch,
  SavedForBackward,
  ViewBase,
  UserReference
};
struct WhyAlive {
  AliveReason reason = AliveReason::UserReference;
  uint64_t opSeq = 0;  // SavedForBackward: the forward op; ViewBase: the op whose output views it
  std::string text;    // "parameter", "saved for backward (op #12 matmul)", ...
};

// Live memory of one kind of holder (AliveReason), at some event: what aliveByReason() returns.
struct MemAliveShare {
  AliveReason reason = AliveReason::UserReference;
  std::string what;  // "parameters", "saved for backward", ...
  uint64_t bytes = 0, blocks = 0;
};

// Where live blocks were allocated (MemoryModel::aliveBySite): one allocation site's share.
struct MemSiteShare {
  std::string site;  // "matmul (blocks.0.attn)", "leaky_cache_append (train.py:77)", "outside ops"
  uint64_t bytes = 0, blocks = 0;
  uint32_t largestAlloc = 0;  // the alloc event of its largest block
};

// A track_begin/track_end pair (keel::MemoryTrackingScope): what happened between the two marks.
struct MemSection {
  std::string name;
  size_t beginEvent = 0;
  std::optional<size_t> endEvent;  // empty: not ended in the recording (yet)
  uint64_t allocs = 0, frees = 0, bytesAllocated = 0, bytesFreed = 0;
  uint64_t peakBytes = 0;       // max over the section of bytes allocated in it and still live
  uint64_t aliveBytes = 0;      // allocated in the section and live at its end
  std::vector<MemBlock> alive;  // those blocks (address at the end), largest first
};

// Live blocks of one log2 size class: bytes in [2^log2, 2^(log2+1)).
struct MemBucket {
  int log2 = 0;
  uint64_t count = 0, bytes = 0;
};

// The block map's picture of a state: the address space cut into pieces laid end to end.
// Segments that touch form one span; gaps between spans are elided; live blocks outside every
// segment (the host allocator has none) are laid out compactly by address, each gap elided.
struct MemPiece {
  enum class Kind : uint8_t { Block, Free, Unmapped };
  Kind kind = Kind::Free;
  uint64_t address = 0, bytes = 0;
  int64_t block = -1;      // index into MemState::blocks for Kind::Block
  uint64_t offset = 0;     // where the piece starts in display units
  uint64_t length = 0;     // its display length
  bool gapBefore = false;  // elided address space (or a new span) right before it
  bool inSegment = false;  // inside a known segment
};
struct MemLayout {
  std::vector<MemPiece> pieces;  // by display offset
  uint64_t total = 0;            // display units of all pieces
  size_t spans = 0;              // runs of touching segments, plus one per cluster outside them
  size_t blocksOutside = 0;      // live blocks outside every segment
};
// Display scale of the block map: Linear = bytes; Log = 1 + log2(bytes / 256) units per piece
// (small blocks stay visible next to large ones).
enum class MemScale { Linear, Log };
MemLayout layoutMemory(const MemState& state, MemScale scale = MemScale::Linear);

// The memory figures at one moment, one definition for `keel memory stats` and the studio
// (Note [Memory figures] in memory_model.cpp). allocated / reserved are the allocator's own
// (the event's allocatedAfter / reservedAfter); the free blocks come from the replayed state.
struct MemFigures {
  int64_t event = -1;        // the figures hold right after this event
  uint64_t allocated = 0;    // bytes in live blocks (AllocatorStats::allocated)
  uint64_t reserved = 0;     // bytes obtained from the system (AllocatorStats::reserved)
  uint64_t cachedFree = 0;   // reserved - allocated: cached by the allocator, used by no block
  uint64_t largestFree = 0;  // the largest free block inside reserved memory
  uint64_t freeBlocks = 0;   // free blocks inside reserved memory
  // cachedFree / reserved (AllocatorStats::fragmentation(), which is cached memory, not
  // fragmentation); 0 when nothing is reserved.
  double cachedShare() const { return reserved ? double(cachedFree) / double(reserved) : 0.0; }
  // Fragmentation: 1 - largestFree / cachedFree (AllocatorStats::scatter()): the share of free
  // memory a request of all of it could not use; 0 when free memory is one block or none.
  double fragmentation() const {
    return cachedFree ? 1.0 - double(std::min(largestFree, cachedFree)) / double(cachedFree) : 0.0;
  }
  bool operator==(const MemFigures&) const = default;
};

// A live allocation drawn in one column of the active-memory timeline: stacked on the older
// live blocks (older lower), from `base` to `base + bytes`. allocEvent == kMergedBands: a run of
// consecutive blocks each smaller than the layout's minBytes, drawn as one slice.
inline constexpr uint32_t kMergedBands = UINT32_MAX;
struct MemBandSlice {
  uint32_t allocEvent = 0;
  uint64_t base = 0, bytes = 0;
  uint32_t blocks = 1;   // blocks in the slice (> 1 only for merged slices)
  uint32_t largest = 0;  // merged slices: the alloc event of the largest block in it (else 0)
  bool operator==(const MemBandSlice&) const = default;
};
// One column: the live blocks right after `event` (the event of the column's range with the most
// bytes allocated, so no peak falls between columns), by allocation order.
struct MemBandColumn {
  int64_t event = 0;
  int64_t firstEvent = 0, lastEvent = 0;  // the events the column stands for
  uint64_t total = 0;                     // live bytes (the top of the stack)
  std::vector<MemBandSlice> slices;
};
struct MemBands {
  int64_t first = 0, last = -1;  // the event range laid out
  uint64_t maxTotal = 0;         // the highest stack over the columns
  std::vector<MemBandColumn> columns;
};

class MemoryModel {
 public:
  // checkpointEvery = 0: chosen from the event count (at most ~256 checkpoints, at least 256
  // events apart).
  explicit MemoryModel(size_t checkpointEvery = 0);

  // Building: add every op (any order, several calls), the stacks the events refer to, then the
  // events (in recording order) last; setEvents replays them once (checkpoints, sections).
  void addOps(const std::vector<storage::OpRecord>& ops);
  void addStack(const storage::StackRecord& stack, size_t maxFrames = 8);
  void setEvents(std::vector<storage::MemRecord> events);

  size_t eventCount() const { return events_.size(); }
  const storage::MemRecord& event(size_t i) const { return events_[i]; }
  const std::vector<storage::MemRecord>& events() const { return events_; }
  // Any reserve/map event: the allocator has segments (caching, vmm); false for host.
  bool hasSegments() const { return hasSegments_; }
  // The allocator the events came from (by the event kinds seen); nullopt with no events.
  std::optional<AllocatorKind> allocatorKind() const;
  size_t checkpointEvery() const { return every_; }
  // The allocator's allocated / reserved bytes right after event i: the event's own figures, or
  // for a track_begin/track_end mark (which carries none) those of the event before it; and
  // fragmentation (reserved - allocated) / reserved as a fraction (0 when nothing is reserved).
  uint64_t allocatedAfter(size_t i) const { return allocated_[i]; }
  uint64_t reservedAfter(size_t i) const { return reserved_[i]; }
  double fragmentationAfter(size_t i) const;
  uint64_t peakAllocated() const { return peakAllocated_; }
  uint64_t peakReserved() const { return peakReserved_; }

  // The figures right after event k (see MemFigures); -1: before the first event.
  MemFigures figuresAt(int64_t k) const;
  // The same from a state stateAt() returned (its cursor names the event).
  MemFigures figures(const MemState& state) const;
  // The figures at the event where allocated memory peaked (the first such event).
  MemFigures figuresAtPeak() const;
  int64_t peakEvent() const { return peakEvent_; }
  // The requests the allocator refused (oom events), in order: the run failed at the first.
  const std::vector<size_t>& oomEvents() const { return ooms_; }
  // The active-memory timeline of events [first, last] in at most `columns` columns: every live
  // allocation a band stacked in allocation order, blocks under `minBytes` merged with their
  // neighbours of the same kind (level of detail). Costs one stateAt(first) and one pass over the
  // range; nothing outside it is read. See Note [Active memory bands] in memory_model.cpp.
  MemBands bands(int64_t first, int64_t last, size_t columns, uint64_t minBytes = 0) const;
  // Memory right after event k (k < eventCount()); -1 gives the empty state.
  MemState stateAt(int64_t k) const;

  const MemOp* op(uint64_t seq) const;  // nullptr when not recorded
  const MemBuffer* buffer(uint64_t bufferId) const;
  const std::vector<storage::StackFrame>* stack(int64_t id) const;
  const storage::MemRecord& allocOf(const MemBlock& b) const { return events_[b.allocEvent]; }
  // The op whose (top-level) call was running at event i: its opSeq; 0 outside ops.
  uint64_t opAt(size_t i) const { return events_[i].opSeq; }

  WhyAlive whyAlive(const MemBlock& b, int64_t cursor) const;
  // The blocks live right after event k, summed by why they are alive, the most bytes first:
  // what held the memory when a request was refused.
  std::vector<MemAliveShare> aliveByReason(int64_t k) const;
  // The same blocks summed by where they were allocated, the most bytes first: the op that
  // allocated each (name and scope), or for an allocation outside ops with a stack (an imported
  // PyTorch snapshot's) its allocation's innermost frame — who holds the memory, as memory_viz's
  // allocation-site view tells it, without hovering block after block.
  // `state`: one stateAt() returned (the view has the cursor's already).
  std::vector<MemSiteShare> aliveBySite(const MemState& state) const;
  // Blocks of `state` that belong to op `seq`: allocated by it, or holding one of its outputs.
  std::vector<size_t> blocksOfOp(const MemState& state, uint64_t seq) const;
  // The first and last event inside op `seq`, if any.
  std::optional<std::pair<size_t, size_t>> opEvents(uint64_t seq) const;
  // The last event at or before op `seq` began (by op seq); -1 when none.
  int64_t lastEventBeforeOp(uint64_t seq) const;

  // First event of each step, in order: (event index, step).
  const std::vector<std::pair<size_t, int64_t>>& stepStarts() const { return stepStarts_; }
  // Whether any event happened in a training step (not in an imported snapshot's, or in
  // initialisation alone): only then do the views name an event's step.
  bool hasSteps() const {
    return std::any_of(stepStarts_.begin(), stepStarts_.end(),
                       [](const auto& s) { return s.second > 0; });
  }
  const std::vector<MemSection>& sections() const { return sections_; }
  // Live blocks of `state` by log2 size class, from the smallest to the largest class present
  // (empty classes in between included).
  static std::vector<MemBucket> histogram(const MemState& state);

 private:
  struct Work;
  void apply(Work& w, size_t i) const;

  size_t every_ = 0;
  std::vector<storage::MemRecord> events_;
  std::vector<uint8_t> kinds_;                  // each event's kind, decoded once
  std::vector<uint64_t> allocated_, reserved_;  // see allocatedAfter()
  std::vector<MemOp> ops_;                      // by seq
  std::unordered_map<uint64_t, MemBuffer> buffers_;
  std::unordered_map<int64_t, std::vector<storage::StackFrame>> stacks_;
  std::vector<MemState> checkpoints_;  // checkpoints_[c]: state before event c * every_
  std::unordered_map<uint64_t, std::pair<size_t, size_t>> opEvents_;
  std::vector<std::pair<size_t, int64_t>> stepStarts_;
  std::vector<MemSection> sections_;
  bool hasSegments_ = false, hasChunks_ = false;
  uint64_t peakAllocated_ = 0, peakReserved_ = 0;
  int64_t peakEvent_ = -1;
  std::vector<size_t> ooms_;
};

// Reads every allocator event of `rec`, the ops (step by step) and the stacks the events use,
// and builds the model. Throws storage::StorageError on a damaged recording.
MemoryModel loadMemoryModel(const storage::Recording& rec);

}  // namespace keel::analysis
