// CUDA VMM allocator costs on a device: ns per alloc+free pair on a mixed-size churn, and the
// remap cost per chunk in the classic case (five blocks, free the 2nd and 4th, one block of twice
// the size). Built with keel_engine_cuda; reports an error row (skips) without a CUDA device.
#include <benchmark/benchmark.h>

#if defined(KEEL_HAVE_CUDA)
#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "keel/cuda_allocator.h"

namespace {

// The allocator under test, or nothing (and a skipped benchmark) without a device.
std::unique_ptr<keel::CudaVmmAllocator> deviceAllocator(benchmark::State& state) {
  if (keel::cudaDeviceCount() == 0) {
    state.SkipWithError("no CUDA device");
    return nullptr;
  }
  keel::CudaVmmAllocatorOptions o;
  o.reserve = size_t(8) << 30;
  return std::make_unique<keel::CudaVmmAllocator>(o);
}

void cudaVmmChurn(benchmark::State& state) {
  auto a = deviceAllocator(state);
  if (!a) return;
  std::mt19937_64 rng(11);
  std::vector<size_t> sizes(4096);  // mostly small, one in eight between 1 and 8 MiB
  for (auto& s : sizes) s = rng() % 8 ? 64 + rng() % (64 << 10) : (1 << 20) + rng() % (7 << 20);
  std::vector<std::pair<void*, size_t>> live(64, {nullptr, 0});
  size_t i = 0;
  for (auto _ : state) {
    auto& [p, n] = live[i % live.size()];
    if (p) a->deallocate(p, n);
    n = sizes[i++ % sizes.size()];
    p = a->allocate(n);
    benchmark::DoNotOptimize(p);
  }
  for (auto& [p, n] : live)
    if (p) a->deallocate(p, n);
  state.SetLabel("ns per alloc+free pair");
}
BENCHMARK(cudaVmmChurn);

void cudaVmmRemapPerChunk(benchmark::State& state) {
  auto a = deviceAllocator(state);
  if (!a) return;
  const size_t block = 4 * a->chunkBytes();
  a->setLimit(5 * block);
  uint64_t remapped = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<void*> p;
    for (int k = 0; k < 5; ++k) p.push_back(a->allocate(block));
    a->deallocate(p[1], block);
    a->deallocate(p[3], block);
    const uint64_t before = a->stats().chunksRemapped;
    state.ResumeTiming();
    void* big = a->allocate(2 * block);
    state.PauseTiming();
    remapped += a->stats().chunksRemapped - before;
    a->deallocate(big, 2 * block);
    for (int k : {0, 2, 4}) a->deallocate(p[k], block);
    a->emptyCache();
    state.ResumeTiming();
  }
  state.counters["chunks_per_iter"] =
      benchmark::Counter(double(remapped) / double(std::max<int64_t>(1, state.iterations())));
  state.counters["time_per_chunk"] = benchmark::Counter(
      double(remapped), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(cudaVmmRemapPerChunk)->UseRealTime();

}  // namespace
#endif  // KEEL_HAVE_CUDA
