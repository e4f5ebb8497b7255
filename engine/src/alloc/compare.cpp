// Allocator comparisons on allocation traces (`keel bench allocator`, `keel memory replay`): fresh
// allocators by kind, the replay loop's own cost, training traces, the caching-vs-VMM comparison
// with its goals, and the VMM remap microbenchmark. The numbers and goals live here, the printing
// in the command-line tool.
#include <time.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "keel/alloc_trace.h"
#include "keel/data.h"
#include "keel/error.h"
#include "keel/gpt_config.h"
#include "keel/train.h"

namespace keel {

namespace {

// Hands out addresses without memory: replaying through it measures the replay loop itself.
class NullAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    next_ += (bytes + 511) / 512 * 512;
    return reinterpret_cast<void*>(next_);
  }
  void deallocate(void*, size_t) override {}
  std::string name() const override { return "null"; }
  size_t allocatedBytes() const override { return 0; }
  size_t reservedBytes() const override { return 0; }

 private:
  uintptr_t next_ = 4096;
};

double threadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e9 + double(ts.tv_nsec);
}

}  // namespace

std::unique_ptr<Allocator> makeReplayAllocator(AllocatorKind k) {
  switch (k) {
    case AllocatorKind::Caching:
      return std::make_unique<CachingAllocator>();
    case AllocatorKind::Vmm:
      return std::make_unique<VmmAllocator>(VmmAllocatorOptions{});
    case AllocatorKind::Host:
      break;
  }
  throw Error("replay: expected the caching or vmm allocator, got '" +
              std::string(allocatorKindName(k)) + "'");
}

double replayHarnessNs(const AllocTrace& t) {
  NullAllocator n;
  double best = 1e300;
  for (int i = 0; i < 3; ++i) best = std::min(best, replayAllocTrace(t, n).nsPerCall);
  return best;
}

AllocTrace traceTraining(const GptConfig& cfg, int steps, uint64_t seed) {
  auto corpus = std::make_shared<const data::TextDataset>(data::TextDataset::defaultCorpus());
  AllocTraceRecorder rec;
  Trainer tr(cfg, Device(Backend::Cpu), seed, corpus, steps);
  for (int s = 1; s <= steps; ++s) {
    rec.markStep(s);
    tr.step();
  }
  return rec.finish();
}

double AllocatorComparison::reservedRatio() const {
  return double(vmm.stats.peakReserved) / double(std::max<uint64_t>(1, caching.stats.peakReserved));
}

double AllocatorComparison::costRatio() const {
  return std::max(0.0, vmm.nsPerCall - harnessNs) / std::max(1e-9, caching.nsPerCall - harnessNs);
}

AllocatorComparison compareAllocators(const AllocTrace& t, int repeats) {
  AllocatorComparison c;
  c.harnessNs = replayHarnessNs(t);
  for (int rep = 0; rep < std::max(1, repeats); ++rep) {
    for (AllocatorKind k : {AllocatorKind::Caching, AllocatorKind::Vmm}) {
      auto a = makeReplayAllocator(k);
      ReplayResult r = replayAllocTrace(t, *a);
      ReplayResult& best = k == AllocatorKind::Caching ? c.caching : c.vmm;
      if (rep == 0 || r.nsPerCall < best.nsPerCall) best = r;
    }
  }
  return c;
}

double vmmRemapUsPerChunk() {
  constexpr size_t kMiB = size_t(1) << 20;
  VmmAllocatorOptions o;
  o.reserve = size_t(1) << 30;
  o.limit = 40 * kMiB;
  VmmAllocator a(o);
  std::vector<double> perChunk;
  for (int i = 0; i < 201; ++i) {
    void* p[5];
    for (auto& x : p) x = a.allocate(8 * kMiB);
    a.deallocate(p[1], 8 * kMiB);
    a.deallocate(p[3], 8 * kMiB);
    uint64_t before = a.stats().chunksRemapped;
    double t0 = threadCpuNs();
    void* big = a.allocate(16 * kMiB);
    double ns = threadCpuNs() - t0;
    uint64_t chunks = a.stats().chunksRemapped - before;
    if (chunks) perChunk.push_back(ns / double(chunks));
    a.deallocate(big, 16 * kMiB);
    for (int k : {0, 2, 4}) a.deallocate(p[k], 8 * kMiB);
    a.emptyCache();
  }
  if (perChunk.empty()) return 0;
  std::nth_element(perChunk.begin(), perChunk.begin() + long(perChunk.size() / 2), perChunk.end());
  return perChunk[perChunk.size() / 2] / 1000.0;
}

}  // namespace keel
