// CUDA VMM allocator costs on a device: ns per alloc+free pair on a mixed-size churn, and the
// remap cost per chunk in the classic case (five blocks, free the 2nd and 4th, one block of twice
// the size). Baselines in the same run: the same churn through cudaMalloc/cudaFree and through the
// driver's stream-ordered pool (cudaMallocAsync/cudaFreeAsync), and a device-to-device copy of one
// chunk (what a copying defragmenter pays per chunk instead of a remap). Built with
// keel_engine_cuda; reports an error row (skips) without a CUDA device.
#include <benchmark/benchmark.h>

#if defined(KEEL_HAVE_CUDA)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include <cuda_runtime_api.h>

#include "bench_util.h"
#include "keel/cuda_allocator.h"

namespace {

using keel::bench::churn;

[[noreturn]] void fail(const char* what, cudaError_t e, size_t bytes = 0) {
  size_t freeBytes = 0, total = 0;
  cudaMemGetInfo(&freeBytes, &total);
  std::fprintf(stderr, "%s(%zu) failed: %s (device: %zu of %zu bytes free)\n", what, bytes,
               cudaGetErrorString(e), freeBytes, total);
  std::exit(1);
}

bool haveDevice(benchmark::State& state) {
  if (keel::cudaDeviceCount() > 0) return true;
  state.SkipWithError("no CUDA device");
  return false;
}

// The allocator under test, or nothing (and a skipped benchmark) without a device.
std::unique_ptr<keel::CudaVmmAllocator> deviceAllocator(benchmark::State& state) {
  if (!haveDevice(state)) return nullptr;
  keel::CudaVmmAllocatorOptions o;
  o.reserve = size_t(8) << 30;
  return std::make_unique<keel::CudaVmmAllocator>(o);
}

void cudaVmmChurn(benchmark::State& state) {
  auto a = deviceAllocator(state);
  if (!a) return;
  churn(state, *a);
}
BENCHMARK(cudaVmmChurn);

// Baseline: the driver's allocator, synchronous.
void cudaMallocChurn(benchmark::State& state) {
  if (!haveDevice(state)) return;
  churn(
      state,
      [](size_t n) {
        void* p = nullptr;
        if (cudaError_t e = cudaMalloc(&p, n); e != cudaSuccess) fail("cudaMalloc", e, n);
        return p;
      },
      [](void* p, size_t) {
        if (cudaError_t e = cudaFree(p); e != cudaSuccess) fail("cudaFree", e);
      });
}
BENCHMARK(cudaMallocChurn);

// Baseline: the stream-ordered pool (cudaMallocAsync on one stream, the pool's release threshold
// raised so that it caches like a caching allocator), the stream synchronised every 1024 pairs as
// a training loop would. On the H200 seen here the pool still kept taking new memory until the
// device was full (76 GB after 100,000 pairs), with or without the syncs (README).
void cudaMallocAsyncChurn(benchmark::State& state) {
  if (!haveDevice(state)) return;
  cudaMemPool_t pool = nullptr;
  cudaDeviceGetDefaultMemPool(&pool, 0);
  uint64_t threshold = UINT64_MAX;
  cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  size_t pairs = 0;
  churn(
      state,
      [&](size_t n) {
        if (++pairs % 1024 == 0) cudaStreamSynchronize(cudaStreamPerThread);
        void* p = nullptr;
        if (cudaError_t e = cudaMallocAsync(&p, n, cudaStreamPerThread); e != cudaSuccess)
          fail("cudaMallocAsync", e, n);
        return p;
      },
      [](void* p, size_t) {
        if (cudaError_t e = cudaFreeAsync(p, cudaStreamPerThread); e != cudaSuccess)
          fail("cudaFreeAsync", e);
      });
  cudaStreamSynchronize(cudaStreamPerThread);
  cudaMemPoolTrimTo(pool, 0);
}
BENCHMARK(cudaMallocAsyncChurn);

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

// Baseline for the remap: copying one chunk's bytes device to device and waiting for it.
void cudaCopyPerChunk(benchmark::State& state) {
  if (!haveDevice(state)) return;
  const size_t chunk = size_t(2) << 20;
  void* from = nullptr;
  void* to = nullptr;
  if (cudaMalloc(&from, chunk) != cudaSuccess || cudaMalloc(&to, chunk) != cudaSuccess)
    std::abort();
  for (auto _ : state) {
    cudaMemcpy(to, from, chunk, cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
  }
  cudaFree(from);
  cudaFree(to);
  state.SetLabel("2 MiB chunk, cudaMemcpy D2D + sync");
}
BENCHMARK(cudaCopyPerChunk)->UseRealTime();

}  // namespace
#endif  // KEEL_HAVE_CUDA
