// Observer seam overhead: the dispatch cost of a tiny op (add of two 4-element float32 tensors on
// `cpu`) with no observer installed versus with one observer whose callbacks do nothing. The
// difference is what an installed observer costs per op; with none it should be one branch.
#include <benchmark/benchmark.h>

#include <memory>

#include "keel/observer.h"
#include "keel/ops.h"

namespace {

class NoopObserver : public keel::Observer {};

void tinyAddLoop(benchmark::State& state) {
  keel::Device cpu("cpu");
  keel::Tensor a = keel::Tensor::full({4}, 1.0, keel::DType::Float32, cpu);
  keel::Tensor b = keel::Tensor::full({4}, 2.0, keel::DType::Float32, cpu);
  keel::NoGradGuard ng;
  for (auto _ : state) {
    keel::Tensor c = keel::ops::add(a, b);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["ops/s"] = benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_TinyAdd_NoObserver(benchmark::State& state) {
  tinyAddLoop(state);
}

void BM_TinyAdd_NoopObserver(benchmark::State& state) {
  auto obs = std::make_shared<NoopObserver>();
  keel::addObserver(obs);
  tinyAddLoop(state);
  keel::removeObserver(obs);
}

BENCHMARK(BM_TinyAdd_NoObserver);
BENCHMARK(BM_TinyAdd_NoopObserver);

}  // namespace
