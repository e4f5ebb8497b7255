// Training throughput: tokens/s of full gpt-mini / moe-mini training steps (forward, backward,
// clipping, AdamW) on the `cpu` and `cpu-ref` backends, default corpus. Compare with
// bench/torch_gpt.py (PyTorch CPU, same model, batch and optimizer).
#include <benchmark/benchmark.h>

#include <memory>
#include <string>

#include "keel/train.h"

namespace {

std::shared_ptr<const keel::data::TextDataset> corpus() {
  static auto d =
      std::make_shared<const keel::data::TextDataset>(keel::data::TextDataset::defaultCorpus());
  return d;
}

void trainSteps(benchmark::State& state, const char* config, const char* backend) {
  keel::GptConfig cfg = keel::loadGptConfig(std::string(KEEL_SOURCE_DIR) + "/configs/" + config);
  keel::Trainer trainer(cfg, keel::Device(backend), 1, corpus(), 1000);
  trainer.step();  // warm-up: first-touch allocations
  int64_t tokens = 0;
  for (auto _ : state) {
    keel::StepStats s = trainer.step();
    benchmark::DoNotOptimize(s.loss);
    tokens += cfg.batch_size * cfg.seq_len;
  }
  state.counters["tokens/s"] = benchmark::Counter(double(tokens), benchmark::Counter::kIsRate);
}

void BM_TrainGptMiniCpu(benchmark::State& s) {
  trainSteps(s, "gpt-mini.json", "cpu");
}
void BM_TrainGptMiniCpuRef(benchmark::State& s) {
  trainSteps(s, "gpt-mini.json", "cpu-ref");
}
void BM_TrainMoeMiniCpu(benchmark::State& s) {
  trainSteps(s, "moe-mini.json", "cpu");
}

BENCHMARK(BM_TrainGptMiniCpu)->Unit(benchmark::kMillisecond)->Iterations(10)->UseRealTime();
BENCHMARK(BM_TrainGptMiniCpuRef)->Unit(benchmark::kMillisecond)->Iterations(2)->UseRealTime();
BENCHMARK(BM_TrainMoeMiniCpu)->Unit(benchmark::kMillisecond)->Iterations(10)->UseRealTime();

}  // namespace
