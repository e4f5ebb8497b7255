// Allocator costs: mean alloc+free ns of the host, caching and vmm allocators on a mixed-size
// churn, and the VMM remap cost per 2 MiB chunk (the classic case, re-run each iteration).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "bench_util.h"
#include "keel/allocator.h"

namespace {

using keel::bench::churn;

constexpr size_t kMiB = size_t(1) << 20;

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
