// Matmul throughput: Keel's ops::matmul on `cpu` against a direct cblas_sgemm (OpenBLAS) of the
// same float32 shape, as FLOP/s, plus `vs_blas` = Keel's rate / BLAS's rate measured in this
// process (so the ratio does not depend on which benchmarks a filter selects). Wall-clock time.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <chrono>
#include <map>
#include <tuple>
#include <vector>

#include "keel/ops.h"

namespace {

using Clock = std::chrono::steady_clock;

struct MmShape {
  int64_t batch, m, k, n;
  double flops() const { return 2.0 * double(batch) * double(m) * double(k) * double(n); }
  auto key() const { return std::make_tuple(batch, m, k, n); }
};

MmShape shapeOf(const benchmark::State& s) {
  return {s.range(0), s.range(1), s.range(2), s.range(3)};
}

struct BlasOperands {
  std::vector<float> a, b, c;
  explicit BlasOperands(const MmShape& s)
      : a(size_t(s.batch * s.m * s.k)),
        b(size_t(s.batch * s.k * s.n)),
        c(size_t(s.batch * s.m * s.n)) {
    for (size_t i = 0; i < a.size(); ++i) a[i] = float(i % 17) * 0.01f - 0.08f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = float(i % 13) * 0.01f - 0.06f;
  }
  void run(const MmShape& s) {
    for (int64_t i = 0; i < s.batch; ++i)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(s.m), int(s.n), int(s.k), 1.0f,
                  a.data() + i * s.m * s.k, int(s.k), b.data() + i * s.k * s.n, int(s.n), 0.0f,
                  c.data() + i * s.m * s.n, int(s.n));
  }
};

// FLOP/s of cblas_sgemm for a shape, measured once per process (at least 0.3 s, after a warm-up).
double blasRate(const MmShape& s) {
  static std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, double> cache;
  auto it = cache.find(s.key());
  if (it != cache.end()) return it->second;
  BlasOperands ops(s);
  ops.run(s);
  int64_t iters = 0;
  auto t0 = Clock::now();
  double secs = 0;
  do {
    ops.run(s);
    ++iters;
    secs = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (secs < 0.3);
  double rate = s.flops() * double(iters) / secs;
  cache[s.key()] = rate;
  return rate;
}

keel::Shape lhsShape(const MmShape& s) {
  return s.batch == 1 ? keel::Shape{s.m, s.k} : keel::Shape{s.batch, s.m, s.k};
}
keel::Shape rhsShape(const MmShape& s) {
  return s.batch == 1 ? keel::Shape{s.k, s.n} : keel::Shape{s.batch, s.k, s.n};
}

void BM_KeelMatmul(benchmark::State& state) {
  MmShape s = shapeOf(state);
  keel::Device cpu("cpu");
  keel::Tensor a = keel::ops::uniform(lhsShape(s), -1, 1, 1, 0, keel::DType::Float32, cpu);
  keel::Tensor b = keel::ops::uniform(rhsShape(s), -1, 1, 2, 0, keel::DType::Float32, cpu);
  keel::NoGradGuard ng;
  benchmark::DoNotOptimize(keel::ops::matmul(a, b));  // warm-up
  int64_t iters = 0;
  auto t0 = Clock::now();
  for (auto _ : state) {
    keel::Tensor c = keel::ops::matmul(a, b);
    benchmark::DoNotOptimize(c.data());
    ++iters;
  }
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  state.counters["FLOP/s"] =
      benchmark::Counter(s.flops(), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["vs_blas"] = (s.flops() * double(iters) / secs) / blasRate(s);
}

void BM_CblasSgemm(benchmark::State& state) {
  MmShape s = shapeOf(state);
  BlasOperands ops(s);
  ops.run(s);
  for (auto _ : state) {
    ops.run(s);
    benchmark::DoNotOptimize(ops.c.data());
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(s.flops(), benchmark::Counter::kIsIterationInvariantRate);
}

// {batch, M, K, N}
void matmulShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"batch", "M", "K", "N"});
  b->Args({1, 256, 256, 256});
  b->Args({1, 512, 512, 512});
  b->Args({1, 1024, 1024, 1024});
  b->Args({1, 1024, 128, 384});  // a linear layer: 1024 tokens, 128 -> 384
  b->Args({16, 128, 64, 128});   // batched attention scores: 16 heads, T=128, head dim 64
  b->UseRealTime();
  b->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_CblasSgemm)->Apply(matmulShapes);
BENCHMARK(BM_KeelMatmul)->Apply(matmulShapes);

}  // namespace
