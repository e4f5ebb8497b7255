// Run diff cost (issue goal: two 100,000-op recordings in ≤ 2 s): end to end from the files
// (BM_DiffRecordings), and diffRuns alone on
// synthetic steps of N ops with realistic tensors (2 inputs, 1 output, MD5s and
// stats), for three shapes of difference: identical, one divergence half-way
// (everything after it differs), 200 inserted ops, and 2,000 scattered
// deletions (every 50th op missing in B: the LCS budget runs out, greedy
// resync).
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "bench_recording.h"
#include "keel/storage/diff.h"
#include "keel/storage/reader.h"
#include "keel/storage/writer.h"

namespace {

namespace ks = keel::storage;

std::vector<ks::OpRecord> makeRun(int n, int changedFrom, int insertions, int dropEvery = 0) {
  static const char* const names[] = {"matmul", "add", "gelu", "softmax", "layer_norm", "mul"};
  std::vector<ks::OpRecord> ops;
  ops.reserve(static_cast<size_t>(n + insertions));
  auto md5 = [&](int i) {
    return std::string(changedFrom >= 0 && i >= changedFrom ? "b" : "a").append(std::to_string(i));
  };
  for (int i = 0; i < n; ++i) {
    if (insertions > 0 && i > 0 && i % (n / (insertions + 1)) == 0 &&
        static_cast<int>(ops.size()) - i < insertions) {
      ks::OpRecord extra;
      extra.step = 1;
      extra.name = "contiguous";
      extra.phase = keel::Phase::Forward;
      ops.push_back(std::move(extra));
    }
    if (dropEvery > 0 && i % dropEvery == dropEvery / 2) continue;
    ks::OpRecord op;
    op.step = 1;
    op.phase = keel::Phase::Forward;
    op.name = names[i % 6];
    op.scope = std::string("blocks.").append(std::to_string(i / 500));
    op.stackId = i % 97;
    for (int r = 0; r < 3; ++r) {
      ks::TensorRecord t;
      t.role = r < 2 ? ks::Role::Input : ks::Role::Output;
      t.index = r < 2 ? r : 0;
      t.tensorId = r == 0 ? static_cast<uint64_t>(i) : r == 1 ? 1'000'000u + i : i + 1u;
      t.version = 1;
      t.shape = {8, 64, 128};
      t.dtype = "float32";
      t.md5 = r == 1 ? std::string("p").append(std::to_string(i)) : md5(r == 0 ? i - 1 : i);
      t.hasStats = true;
      t.stats.mean = 0.5;
      op.tensors.push_back(std::move(t));
    }
    ops.push_back(std::move(op));
  }
  for (size_t i = 0; i < ops.size(); ++i) ops[i].seq = i + 1;
  return ops;
}

void diffBench(benchmark::State& state, int changedFrom, int insertions, int dropEvery = 0) {
  const int n = static_cast<int>(state.range(0));
  auto a = makeRun(n, -1, 0);
  auto b = makeRun(n, changedFrom < 0 ? -1 : n / 2, insertions, dropEvery);
  ks::DiffOptions opt;
  opt.mismatchesOnly = true;
  for (auto _ : state) {
    ks::DiffReport r = ks::diffRuns(a, b, opt);
    benchmark::DoNotOptimize(r.total.equal);
  }
  state.counters["ops/s"] =
      benchmark::Counter(static_cast<double>(n) * 2, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_DiffIdentical(benchmark::State& s) {
  diffBench(s, -1, 0);
}
void BM_DiffOneDivergence(benchmark::State& s) {
  diffBench(s, 1, 0);
}
void BM_DiffInsertions(benchmark::State& s) {
  diffBench(s, -1, 200);
}
void BM_DiffScatteredDeletions(benchmark::State& s) {
  diffBench(s, -1, 0, 50);
}

// End to end, as `keel diff` does it: open two 100,000-op recordings (one divergence half-way),
// load the step from each and diff them. The recordings are written once, outside the timing.
void BM_DiffRecordings(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const std::string dir = std::filesystem::temp_directory_path().string();
  const std::string pathA = dir + "/keel_bench_diff_" + std::to_string(::getpid()) + "_a.db";
  const std::string pathB = dir + "/keel_bench_diff_" + std::to_string(::getpid()) + "_b.db";
  auto write = [&](const std::string& path, const std::vector<ks::OpRecord>& ops) {
    auto w = ks::Writer::create(path, keel::bench::benchRunInfo());
    w->writeStep({1, 0, 1, 1.0});
    for (const auto& o : ops) w->writeOp(o);
    w->close();
  };
  write(pathA, makeRun(n, -1, 0));
  write(pathB, makeRun(n, n / 2, 0));
  ks::DiffOptions opt;
  opt.mismatchesOnly = true;
  for (auto _ : state) {
    ks::Recording a = ks::Recording::open(pathA), b = ks::Recording::open(pathB);
    ks::DiffReport r = ks::diffRuns(a.stepOps(1), b.stepOps(1), opt);
    benchmark::DoNotOptimize(r.total.equal);
  }
  for (const auto& p : {pathA, pathB})
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(p + suffix);
}
BENCHMARK(BM_DiffRecordings)->Arg(100'000)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK(BM_DiffIdentical)->Arg(100'000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DiffOneDivergence)->Arg(100'000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DiffInsertions)->Arg(100'000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DiffScatteredDeletions)->Arg(100'000)->Unit(benchmark::kMillisecond);

}  // namespace
