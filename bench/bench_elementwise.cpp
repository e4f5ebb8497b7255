// Memory-bound ops on 16M float32 elements (64 MiB per tensor) on `cpu`: add, mul, exp, gelu and
// sum/mean/max reductions, reported as bytes/s (bytes read + written) and `vs_memcpy` = that rate /
// memcpy's rate on the same byte count (read + write), measured in this process. Each Keel op
// allocates its output, so the figures include Keel's allocation cost. Wall-clock time.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <vector>

#include "keel/ops.h"

namespace {

using Clock = std::chrono::steady_clock;
// Sizes are benchmark arguments: 1M elements (4 MiB, what a gpt-mini activation is) and 16M
// (64 MiB, past glibc's mmap threshold, so every fresh output pays page faults).

// memcpy bandwidth (bytes read + written per second) for one copy of n floats, measured once
// per size.
double memcpyRate(int64_t kN) {
  static std::map<int64_t, double> rates;
  if (auto it = rates.find(kN); it != rates.end()) return it->second;
  const double kTensorBytes = double(kN) * sizeof(float);
  double rate = [&] {
    std::vector<float> src(size_t(kN), 1.0f), dst(size_t(kN), 0.0f);
    std::memcpy(dst.data(), src.data(), size_t(kTensorBytes));
    int64_t iters = 0;
    auto t0 = Clock::now();
    double secs = 0;
    do {
      std::memcpy(dst.data(), src.data(), size_t(kTensorBytes));
      benchmark::ClobberMemory();
      ++iters;
      secs = std::chrono::duration<double>(Clock::now() - t0).count();
    } while (secs < 0.5);
    return 2.0 * kTensorBytes * double(iters) / secs;
  }();
  rates[kN] = rate;
  return rate;
}

void BM_Memcpy(benchmark::State& state) {
  const int64_t kN = state.range(0);
  const double kTensorBytes = double(kN) * sizeof(float);
  std::vector<float> src(size_t(kN), 1.0f), dst(size_t(kN), 0.0f);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), size_t(kTensorBytes));
    benchmark::ClobberMemory();
  }
  state.counters["bytes/s"] =
      benchmark::Counter(2.0 * kTensorBytes, benchmark::Counter::kIsIterationInvariantRate);
}

// The floor for any op that writes a fresh 64 MiB output: allocate, first-touch (page faults),
// free; bytes/s counts the bytes written (n floats). Compare with BM_Memcpy, whose buffers stay
// mapped.
void BM_FreshOutputFirstTouch(benchmark::State& state) {
  const int64_t kN = state.range(0);
  const double kTensorBytes = double(kN) * sizeof(float);
  for (auto _ : state) {
    void* p = std::aligned_alloc(64, size_t(kTensorBytes));
    std::memset(p, 0, size_t(kTensorBytes));
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
  state.counters["bytes/s"] =
      benchmark::Counter(kTensorBytes, benchmark::Counter::kIsIterationInvariantRate);
}

// Runs op over fresh n-element inputs (n = the benchmark argument); bytesMoved = tensors read +
// written, in tensor sizes.
void runOp(benchmark::State& state, int numInputs, double tensorsMoved,
           const std::function<keel::Tensor(const std::vector<keel::Tensor>&)>& op) {
  const int64_t kN = state.range(0);
  const double kTensorBytes = double(kN) * sizeof(float);
  keel::Device cpu("cpu");
  std::vector<keel::Tensor> in;
  for (int i = 0; i < numInputs; ++i)
    in.push_back(keel::ops::uniform({kN}, -2, 2, uint64_t(i + 1), 0, keel::DType::Float32, cpu));
  keel::NoGradGuard ng;
  benchmark::DoNotOptimize(op(in).data());  // warm-up
  int64_t iters = 0;
  auto t0 = Clock::now();
  for (auto _ : state) {
    keel::Tensor out = op(in);
    benchmark::DoNotOptimize(out.data());
    ++iters;
  }
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  double bytes = tensorsMoved * kTensorBytes;
  state.counters["bytes/s"] =
      benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["vs_memcpy"] = (bytes * double(iters) / secs) / memcpyRate(kN);
}

void BM_KeelAdd(benchmark::State& s) {
  runOp(s, 2, 3, [](const auto& in) { return keel::ops::add(in[0], in[1]); });
}
void BM_KeelMul(benchmark::State& s) {
  runOp(s, 2, 3, [](const auto& in) { return keel::ops::mul(in[0], in[1]); });
}
void BM_KeelExp(benchmark::State& s) {
  runOp(s, 1, 2, [](const auto& in) { return keel::ops::exp(in[0]); });
}
void BM_KeelGelu(benchmark::State& s) {
  runOp(s, 1, 2, [](const auto& in) { return keel::ops::gelu(in[0]); });
}
void BM_KeelSum(benchmark::State& s) {
  runOp(s, 1, 1, [](const auto& in) { return keel::ops::sum(in[0]); });
}
void BM_KeelMean(benchmark::State& s) {
  runOp(s, 1, 1, [](const auto& in) { return keel::ops::mean(in[0]); });
}
void BM_KeelMax(benchmark::State& s) {
  runOp(s, 1, 1, [](const auto& in) { return keel::ops::max(in[0], 0); });
}

BENCHMARK(BM_Memcpy)->Arg(1 << 20)->Arg(1 << 24)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FreshOutputFirstTouch)
    ->Arg(1 << 20)
    ->Arg(1 << 24)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_KeelAdd)->Arg(1 << 20)->Arg(1 << 24)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_KeelMul)->Arg(1 << 20)->Arg(1 << 24)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_KeelExp)->Arg(1 << 20)->Arg(1 << 24)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_KeelGelu)->Arg(1 << 20)->Arg(1 << 24)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_KeelSum)->Arg(1 << 20)->Arg(1 << 24)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_KeelMean)->Arg(1 << 20)->Arg(1 << 24)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_KeelMax)->Arg(1 << 20)->Arg(1 << 24)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
