// Capture overhead: gpt-mini training step time on `cpu` with no capture, graph-only, graph +
// stacks, and graph + stacks + MD5 + stats (goals: <= 5%, <= 15%, <= 35% over no capture).
// Records go to a null writer so the figures measure capture itself, not SQLite.
#include <benchmark/benchmark.h>

#if __has_include("keel/capture/recorder.h")
#include <memory>
#include <string>

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

// level: 0 none, 1 graph, 2 graph+stacks, 3 graph+stacks+md5+stats
void captureSteps(benchmark::State& state) {
  static auto corpus =
      std::make_shared<const keel::data::TextDataset>(keel::data::TextDataset::defaultCorpus());
  keel::GptConfig cfg =
      keel::loadGptConfig(std::string(KEEL_SOURCE_DIR) + "/configs/gpt-mini.json");
  keel::Trainer trainer(cfg, keel::Device("cpu"), 1, corpus, 1000);
  trainer.step();  // warm-up
  const int level = int(state.range(0));
  std::unique_ptr<keel::capture::Recorder> rec;
  if (level > 0) {
    keel::capture::CaptureOptions o;
    o.stacks = level >= 2;
    o.md5 = o.stats = level >= 3;
    rec = std::make_unique<keel::capture::Recorder>(std::make_unique<NullWriter>(), o);
  }
  for (auto _ : state) benchmark::DoNotOptimize(trainer.step().loss);
  if (rec) rec->finish();
  state.SetLabel(level == 0   ? "none"
                 : level == 1 ? "graph"
                 : level == 2 ? "graph+stacks"
                              : "graph+stacks+md5+stats");
}
BENCHMARK(captureSteps)
    ->DenseRange(0, 3)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(10)
    ->Repetitions(3)
    ->ReportAggregatesOnly(true)
    ->UseRealTime();

}  // namespace
#endif
