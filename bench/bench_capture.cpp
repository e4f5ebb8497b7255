// Capture overhead: gpt-mini training step time on `cpu` with graph-only capture, graph + stacks,
// and graph + stacks + MD5 + stats, against no capture (goals: <= 5%, <= 15%, <= 35%).
// Records go to a null writer so the figures measure capture itself, not SQLite.
#include <benchmark/benchmark.h>

#if __has_include("keel/capture/recorder.h")
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "keel/capture/recorder.h"
#include "keel/train.h"

namespace {

class NullWriter : public keel::storage::Writer {
 public:
  void writeStep(const keel::storage::StepRecord&) override {}
  void writeOp(const keel::storage::OpRecord&) override {}
  void writeStack(const keel::storage::StackRecord&) override {}
  void writeLog(const keel::storage::LogRecord&) override {}
  void writeMem(const keel::storage::MemRecord&) override {}
  void writeDump(const keel::storage::DumpRecord&) override {}
  void setRunStatus(const std::string&) override {}
  void addDropped(const std::string&, int64_t) override {}
  void commit() override {}
  void close() override {}
};

// Interleaved A/B: rounds of `perRound` steps without capture, then the same number with a
// recorder at `level` (1 graph, 2 graph+stacks, 3 graph+stacks+md5+stats, 4 graph+stacks+stats),
// on one trainer. The
// counters are the median step times of each side and the overhead of their ratio: interleaving
// keeps the shared machine's drift out of the comparison.
void captureOverhead(benchmark::State& state) {
  static auto corpus =
      std::make_shared<const keel::data::TextDataset>(keel::data::TextDataset::defaultCorpus());
  keel::GptConfig cfg =
      keel::loadGptConfig(std::string(KEEL_SOURCE_DIR) + "/configs/gpt-mini.json");
  keel::Trainer trainer(cfg, keel::Device("cpu"), 1, corpus, 1000);
  trainer.step();  // warm-up
  const int level = int(state.range(0));
  keel::capture::CaptureOptions o;
  o.stacks = level >= 2;
  o.md5 = level == 3;
  o.stats = level >= 3;
  constexpr int kRounds = 8, kPerRound = 3;
  std::vector<double> base, with;
  auto timeSteps = [&](std::vector<double>& out) {
    for (int i = 0; i < kPerRound; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      benchmark::DoNotOptimize(trainer.step().loss);
      out.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  };
  for (auto _ : state) {
    for (int r = 0; r < kRounds; ++r) {
      timeSteps(base);
      keel::capture::Recorder rec(std::make_unique<NullWriter>(), o);
      timeSteps(with);
      rec.finish();
    }
  }
  const double b = keel::bench::median(base), w = keel::bench::median(with);
  state.counters["base_ms"] = b;
  state.counters["capture_ms"] = w;
  state.counters["overhead_pct"] = 100.0 * (w / b - 1.0);
  state.SetLabel(level == 1   ? "graph"
                 : level == 2 ? "graph+stacks"
                 : level == 3 ? "graph+stacks+md5+stats"
                              : "graph+stacks+stats");
}
BENCHMARK(captureOverhead)->DenseRange(1, 4)->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace
#endif
