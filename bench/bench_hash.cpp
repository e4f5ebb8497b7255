// Tensor checksum and statistics throughput (capture's per-tensor cost) on a 4 MiB float32 tensor,
// with memcpy of the same bytes as the baseline: bytes/s in the counters.
#include <benchmark/benchmark.h>

#if __has_include("keel/capture/hash.h")
#include <cstring>
#include <vector>

#include "keel/capture/hash.h"
#include "keel/ops.h"

namespace {

keel::Tensor sample() {
  return keel::ops::normal({1024, 1024}, 0.0, 1.0, 3, 0, keel::DType::Float32, keel::Device("cpu"));
}

void hashMemcpyBaseline(benchmark::State& state) {
  keel::Tensor t = sample();
  std::vector<char> out(t.nbytes());
  for (auto _ : state) {
    std::memcpy(out.data(), t.data(), t.nbytes());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(t.nbytes()));
}
BENCHMARK(hashMemcpyBaseline);

void hashMd5(benchmark::State& state) {
  keel::Tensor t = sample();
  for (auto _ : state) benchmark::DoNotOptimize(keel::capture::tensorMd5(t));
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(t.nbytes()));
}
BENCHMARK(hashMd5);

void hashMd5Rounded(benchmark::State& state) {
  keel::Tensor t = sample();
  for (auto _ : state) benchmark::DoNotOptimize(keel::capture::tensorMd5Rounded(t, 6));
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(t.nbytes()));
}
BENCHMARK(hashMd5Rounded);

void hashStats(benchmark::State& state) {
  keel::Tensor t = sample();
  for (auto _ : state) benchmark::DoNotOptimize(keel::capture::tensorStats(t).mean);
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(t.nbytes()));
}
BENCHMARK(hashStats);

}  // namespace
#endif
