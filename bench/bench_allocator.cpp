// Allocator costs: mean alloc+free ns of the host, caching and vmm allocators on a mixed-size
// churn, and the VMM remap cost per 2 MiB chunk (the classic case, re-run each iteration).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "keel/allocator.h"

namespace {

constexpr size_t kMiB = size_t(1) << 20;

// A fixed trace of sizes: mostly small, one in eight between 1 and 8 MiB.
const std::vector<size_t>& sizes() {
  static std::vector<size_t> s = [] {
    std::mt19937_64 rng(11);
    std::vector<size_t> v(4096);
    for (auto& x : v) x = rng() % 8 == 0 ? kMiB + rng() % (7 * kMiB) : 64 + rng() % (64 << 10);
    return v;
  }();
  return s;
}

// Keeps a window of 64 live blocks: each iteration frees the oldest and allocates the next size.
void churn(benchmark::State& state, keel::Allocator& a) {
  const auto& sz = sizes();
  std::vector<std::pair<void*, size_t>> ring(64, {nullptr, 0});
  size_t i = 0;
  for (auto _ : state) {
    auto& slot = ring[i % ring.size()];
    if (slot.first) a.deallocate(slot.first, slot.second);
    size_t n = sz[i % sz.size()];
    slot = {a.allocate(n), n};
    benchmark::DoNotOptimize(slot.first);
    ++i;
  }
  for (auto& [p, n] : ring)
    if (p) a.deallocate(p, n);
  state.SetLabel("ns per alloc+free pair");
}

void allocHostChurn(benchmark::State& state) {
  churn(state, keel::hostAllocator());
}
BENCHMARK(allocHostChurn);

void allocCachingChurn(benchmark::State& state) {
  keel::CachingAllocator a;
  churn(state, a);
}
BENCHMARK(allocCachingChurn);

void allocVmmChurn(benchmark::State& state) {
  keel::VmmAllocatorOptions o;
  o.reserve = size_t(8) << 30;
  keel::VmmAllocator a(o);
  churn(state, a);
}
BENCHMARK(allocVmmChurn);

// Five 8 MiB blocks, free the 2nd and 4th, request 16 MiB under a 40 MiB limit: 8 chunks remap.
// The reported time is per remapped chunk.
void allocVmmRemapPerChunk(benchmark::State& state) {
  keel::VmmAllocatorOptions o;
  o.reserve = size_t(1) << 30;
  o.limit = 40 * kMiB;
  keel::VmmAllocator a(o);
  uint64_t chunks = 0;
  for (auto _ : state) {
    state.PauseTiming();
    void* p[5];
    for (auto& x : p) x = a.allocate(8 * kMiB);
    a.deallocate(p[1], 8 * kMiB);
    a.deallocate(p[3], 8 * kMiB);
    uint64_t before = a.stats().chunksRemapped;
    state.ResumeTiming();
    void* big = a.allocate(16 * kMiB);
    state.PauseTiming();
    chunks += a.stats().chunksRemapped - before;
    a.deallocate(big, 16 * kMiB);
    for (int i : {0, 2, 4}) a.deallocate(p[i], 8 * kMiB);
    a.emptyCache();  // every iteration starts from an empty allocator
    state.ResumeTiming();
  }
  state.counters["chunks_per_iter"] =
      benchmark::Counter(double(chunks) / double(std::max<int64_t>(1, state.iterations())));
  state.counters["time_per_chunk"] =
      benchmark::Counter(double(chunks), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(allocVmmRemapPerChunk)->UseRealTime();

}  // namespace
