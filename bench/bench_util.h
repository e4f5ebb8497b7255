// Helpers shared by the benchmarks: the median of samples, and the allocator churn (a fixed
// trace of request sizes, 64 blocks live) that the host, caching, VMM and CUDA allocators and
// the driver's own allocators are all measured on.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "keel/allocator.h"

namespace keel::bench {

// The median of v (the mean of the middle two for an even count); 0 when empty.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

// A fixed trace of sizes: mostly small, one in eight between 1 and 8 MiB.
inline const std::vector<size_t>& churnSizes() {
  static const std::vector<size_t> s = [] {
    constexpr size_t kMiB = size_t(1) << 20;
    std::mt19937_64 rng(11);
    std::vector<size_t> v(4096);
    for (auto& x : v) x = rng() % 8 == 0 ? kMiB + rng() % (7 * kMiB) : 64 + rng() % (64 << 10);
    return v;
  }();
  return s;
}

// Keeps a window of 64 live blocks: each iteration frees the oldest (free(p, n)) and allocates
// the next size (alloc(n)).
template <class Alloc, class Free>
void churn(benchmark::State& state, Alloc alloc, Free free) {
  const auto& sz = churnSizes();
  std::vector<std::pair<void*, size_t>> ring(64, {nullptr, 0});
  size_t i = 0;
  for (auto _ : state) {
    auto& slot = ring[i % ring.size()];
    if (slot.first) free(slot.first, slot.second);
    const size_t n = sz[i % sz.size()];
    slot = {alloc(n), n};
    benchmark::DoNotOptimize(slot.first);
    ++i;
  }
  for (auto& [p, n] : ring)
    if (p) free(p, n);
  state.SetLabel("ns per alloc+free pair");
}

inline void churn(benchmark::State& state, Allocator& a) {
  churn(
      state, [&](size_t n) { return a.allocate(n); },
      [&](void* p, size_t n) { a.deallocate(p, n); });
}

}  // namespace keel::bench
