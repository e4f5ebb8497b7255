// Capture overhead: gpt-mini training step time on `cpu` with graph-only capture, graph + stacks,
// and graph + stacks + MD5 + stats, against no capture (goals: <= 5%, <= 15%, <= 35%).
// Records go to a null writer so the figures measure capture itself, not SQLite.
#include <benchmark/benchmark.h>

#if __has_include("keel/capture/recorder.h")
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
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
// recorder at `level` (1 graph, 2 graph+stacks, 3 graph+stacks+md5+stats, 4 graph+stacks+stats,
// 5 graph+stacks+md5+stats hashed in the op callbacks — the path before the hashing thread, 6
// everything (--all) but for steps outside the recorder's step range), on
// one trainer. A captured round starts a recorder and runs one untimed step (its new call stacks
// are symbolized once, as in a long run), then times kPerRound steps and a flush (everything
// captured is hashed and handed to the writer), so hashing that runs on after the steps counts. The
// counters are the median step times of each side (a round's time / perRound) and the overhead of
// their ratio: interleaving keeps the shared machine's drift out of the comparison.
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
  o.md5 = level == 3 || level == 5 || level == 6;
  o.stats = level >= 3;
  o.hashThread = level != 5;
  o.allocator = level == 6;
  if (level == 6) o.filter.stepMin = o.filter.stepMax = int64_t(1) << 40;  // never reached
  constexpr int kRounds = 8, kPerRound = 3;
  std::vector<double> base, with, hashed, hashedTensors;
  auto ms = [](auto t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  for (auto _ : state) {
    for (int r = 0; r < kRounds; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kPerRound; ++i) benchmark::DoNotOptimize(trainer.step().loss);
      base.push_back(ms(t0) / kPerRound);
      keel::capture::Recorder rec(std::make_unique<NullWriter>(), o);
      benchmark::DoNotOptimize(trainer.step().loss);
      rec.flush();
      t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kPerRound; ++i) benchmark::DoNotOptimize(trainer.step().loss);
      rec.flush();
      with.push_back(ms(t0) / kPerRound);
      rec.finish();
      hashed.push_back(double(rec.counts().hashedBytes) / (kPerRound + 1) / (1 << 20));
      hashedTensors.push_back(double(rec.counts().hashedTensors) / (kPerRound + 1));
    }
  }
  const double b = keel::bench::median(base), w = keel::bench::median(with);
  state.counters["base_ms"] = b;
  state.counters["capture_ms"] = w;
  state.counters["overhead_pct"] = 100.0 * (w / b - 1.0);
  if (o.hashThread && (o.md5 || o.stats)) {
    state.counters["hashed_MiB_per_step"] = keel::bench::median(hashed);
    state.counters["hashed_tensors_per_step"] = keel::bench::median(hashedTensors);
  }
  state.SetLabel(level == 1   ? "graph"
                 : level == 2 ? "graph+stacks"
                 : level == 3 ? "graph+stacks+md5+stats"
                 : level == 4 ? "graph+stacks+stats"
                 : level == 5 ? "graph+stacks+md5+stats, hashed in the callbacks"
                              : "--all, steps outside --step-range");
}
BENCHMARK(captureOverhead)->DenseRange(1, 6)->Unit(benchmark::kMillisecond)->Iterations(1);

#ifdef KEEL_CLI_PATH
// Whole processes, as a user runs them: `keel train` and `keel record --all` (and the other
// commands below) of the same 10 gpt-mini steps, alternated kRounds times; the counters are the
// medians and their ratio to train (goal for --all: <= 1.35). The recording goes to /dev/shm
// (or the temp folder) so that this VM's disk is not what is measured.
double runSeconds(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = std::system(cmd.c_str());
  if (rc != 0) throw std::runtime_error("benchmark command failed: " + cmd);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void recordVsTrainProcess(benchmark::State& state) {
  const std::string dir = std::filesystem::exists("/dev/shm")
                              ? "/dev/shm"
                              : std::filesystem::temp_directory_path().string();
  const std::string db = dir + "/keel_bench_record_" + std::to_string(::getpid()) + ".db";
  const std::string base = std::string(KEEL_CLI_PATH) + " %s --config " + KEEL_SOURCE_DIR +
                           "/configs/gpt-mini.json --steps 10 --seed 1";
  auto cmd = [&](const std::string& verb, const std::string& extra) {
    std::string c = base;
    c.replace(c.find("%s"), 2, verb);
    return c + " " + extra + " > /dev/null";
  };
  const std::vector<std::pair<std::string, std::string>> variants = {
      {"train", cmd("train", "")},
      {"record_graph", cmd("record", "-o " + db)},
      {"record_all", cmd("record", "--all -o " + db)},
      {"record_all_inline", cmd("record", "--all --hash-inline -o " + db)}};
  constexpr int kRounds = 5;
  std::vector<std::vector<double>> t(variants.size());
  for (auto _ : state)
    for (int r = 0; r < kRounds; ++r)
      for (size_t v = 0; v < variants.size(); ++v) t[v].push_back(runSeconds(variants[v].second));
  std::filesystem::remove(db);
  const double train = keel::bench::median(t[0]);
  state.counters["train_s"] = train;
  for (size_t v = 1; v < variants.size(); ++v) {
    state.counters[variants[v].first + "_s"] = keel::bench::median(t[v]);
    state.counters[variants[v].first + "_ratio"] = keel::bench::median(t[v]) / train;
  }
}
BENCHMARK(recordVsTrainProcess)->Unit(benchmark::kSecond)->Iterations(1);
#endif

}  // namespace
#endif
