// Allocation traces: a sequence of allocs and frees, replayed through any allocator to compare
// peak memory, fragmentation, defragmentation work and cost per call. Traces come from a run
// (recordAllocTrace while training, or a recording's allocator events) or from the MoE generator.
// Text format (one event per line, '#' starts a comment): "a ID BYTES" allocates a block named
// ID, "f ID" frees it; "s N" marks the start of step N. See docs/memory.md.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "keel/allocator.h"
#include "keel/base/non_copyable.h"

namespace keel {

// The largest block a trace may allocate (16 TiB): anything larger is a broken file, and replaying
// it would make the allocator reserve without bound.
inline constexpr uint64_t kMaxTraceBlock = uint64_t(1) << 44;

struct TraceEvent {
  enum Kind : uint8_t { Alloc, Free, Step } kind = Alloc;
  uint64_t id = 0;     // block name (Alloc/Free), step number (Step)
  uint64_t bytes = 0;  // Alloc
};

struct AllocTrace {
  std::vector<TraceEvent> events;
  size_t allocs() const;
  size_t steps() const;
};

// Parses the text format; throws keel::Error naming the file and line (unknown event, a free of a
// block that is not live, an id allocated twice, a zero or absurd size).
AllocTrace readAllocTrace(const std::string& path);
AllocTrace parseAllocTrace(std::istream& in, const std::string& name);
void writeAllocTrace(const AllocTrace& t, std::ostream& out);

// Records the allocs and frees of engine Buffers on every thread while alive (an observer).
class AllocTraceRecorder : NonCopyable {
 public:
  AllocTraceRecorder();
  ~AllocTraceRecorder();
  void markStep(int64_t step);
  // Stops recording; blocks still live are left allocated at the end of the trace.
  AllocTrace finish();

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// A synthetic Mixture-of-Experts training trace: per step, per layer, attention activations of
// fixed size and one activation set per expert whose token count follows a skewed (Zipf-like)
// routing that changes every step; activations are saved for backward and freed in reverse
// order; parameters, gradients and optimizer state stay live. Deterministic in `seed`.
struct MoeTraceOptions {
  int layers = 4;
  int experts = 64;
  int topK = 2;
  int64_t tokens = 4096;  // per step
  int64_t dModel = 1024;
  int64_t dFf = 2048;
  int steps = 20;
  double skew = 1.2;  // Zipf exponent of the routing (0 = uniform)
  uint64_t seed = 1;
};
AllocTrace generateMoeTrace(const MoeTraceOptions& o);

struct ReplayResult {
  std::string allocator;
  AllocatorStats stats;  // after the replay (peaks over it), before the trace's live blocks go
  uint64_t calls = 0;    // allocs + frees replayed
  double nsPerCall = 0;  // mean thread CPU time of one allocate or deallocate (incl. the loop)
};

// Replays `t` through `a` (raw allocate/deallocate; blocks still live at the end are freed after
// the statistics are taken). Throws keel::Error if the allocator runs out of memory.
ReplayResult replayAllocTrace(const AllocTrace& t, Allocator& a);

// A fresh caching or VMM allocator with its default options, for a replay (throws keel::Error for
// the host allocator, which keeps no statistics worth replaying).
std::unique_ptr<Allocator> makeReplayAllocator(AllocatorKind k);
// The replay loop's own cost per call (an allocator that hands out addresses without memory; best
// of 3), subtracted from the real allocators' ns/call.
double replayHarnessNs(const AllocTrace& t);

struct GptConfig;
// The allocation trace of `steps` training steps of `cfg` on the cpu backend (default corpus).
AllocTrace traceTraining(const GptConfig& cfg, int steps, uint64_t seed);

// `keel bench allocator`'s comparison of the caching and VMM allocators on one trace, with the
// goals the VMM allocator was built to (docs/memory.md).
struct AllocatorComparison {
  static constexpr double kVmmPeakFragmentationMax = 0.03;  // VMM fragmentation at peak
  static constexpr double kCachingFragmentationMin = 0.10;  // the trace really fragments
  static constexpr double kReservedRatioMax = 0.90;         // VMM / caching peak reserved
  static constexpr double kCostRatioMax = 1.5;              // VMM / caching ns per call
  ReplayResult caching, vmm;  // best ns/call of the interleaved repeats
  double harnessNs = 0;       // the replay loop's own cost (subtracted below)
  double reservedRatio() const;
  double costRatio() const;
  bool vmmFragmentationMet() const {
    return vmm.stats.peakFragmentation() <= kVmmPeakFragmentationMax;
  }
  bool cachingFragments() const {
    return caching.stats.peakFragmentation() >= kCachingFragmentationMin;
  }
  bool reservedMet() const { return reservedRatio() <= kReservedRatioMax; }
  bool costMet() const { return costRatio() <= kCostRatioMax; }
  bool goalsMet() const { return vmmFragmentationMet() && reservedMet() && costMet(); }
};
// Replays `t` through a fresh caching and a fresh VMM allocator `repeats` times, interleaved (the
// machine is shared): the best ns/call of each counts.
AllocatorComparison compareAllocators(const AllocTrace& t, int repeats = 5);

// VMM remap cost: five 8 MiB blocks, free the 2nd and 4th, one 16 MiB request under a 40 MiB
// limit; the thread CPU time of that request over the chunks it remapped, median of 201 runs.
double vmmRemapUsPerChunk();
inline constexpr double kVmmRemapUsPerChunkMax = 10;

}  // namespace keel
