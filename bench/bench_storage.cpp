// Storage benchmarks: writer throughput in op records per second (each op with 3 tensor rows,
// MD5s and statistics, committed every 10,000 ops like capture's batches; goal >= 200,000/s) and
// the bulk loader diff uses (Recording::stepOps over 100,000 ops; goal well under a second).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "bench_recording.h"
#include "keel/storage/reader.h"
#include "keel/storage/writer.h"

namespace {

using namespace keel::storage;

std::string benchPath(const char* name) {
  return (std::filesystem::temp_directory_path() /
          ("keel_bench_" + std::to_string(::getpid()) + "_" + name + ".db"))
      .string();
}

void removeRecording(const std::string& path) {
  std::error_code ec;
  for (const char* s : {"", "-wal", "-shm"}) std::filesystem::remove(path + s, ec);
}

// A realistic op: a handful of names and scopes, 2 inputs + 1 output, hashed, with statistics.
OpRecord benchOp(uint64_t seq) {
  static const char* kNames[] = {"matmul", "add", "gelu", "layer_norm", "softmax", "mul"};
  static const keel::Phase kPhases[] = {keel::Phase::Forward, keel::Phase::Backward};
  OpRecord o;
  o.seq = seq;
  o.step = 1;
  o.phase = kPhases[(seq / 500) % 2];
  o.name = kNames[seq % 6];
  o.attrsJson = seq % 6 == 0 ? R"({"transpose_b":false})" : "";
  o.scope = "blocks." + std::to_string(seq % 12) + ".attn";
  o.beginNs = static_cast<int64_t>(seq) * 1000;
  o.endNs = o.beginNs + 700;
  o.stackId = static_cast<int64_t>(seq % 64);
  for (int i = 0; i < 3; ++i) {
    TensorRecord t;
    t.role = i < 2 ? Role::Input : Role::Output;
    t.index = i % 2;
    t.tensorId = seq * 3 + static_cast<uint64_t>(i);
    t.bufferId = t.tensorId;
    t.shape = {8, 128, 256};
    t.strides = {32768, 256, 1};
    t.dtype = "float32";
    t.device = "cpu";
    t.bytes = 8 * 128 * 256 * 4;
    t.md5 = "d41d8cd98f00b204e9800998ecf8427e";
    t.md5Rounded = "0cc175b9c0f1b6a831c399e269772661";
    t.hasStats = true;
    t.stats = {-3.5, 4.25, 0.01, 1.0, 4.25, 0, 0, 17};
    o.tensors.push_back(std::move(t));
  }
  return o;
}

void BM_StorageWriterOps(benchmark::State& state) {
  const std::string path = benchPath("writer");
  const int64_t n = state.range(0);
  std::vector<OpRecord> ops;
  for (int64_t i = 0; i < n; ++i) ops.push_back(benchOp(static_cast<uint64_t>(i + 1)));
  for (auto _ : state) {
    auto w = Writer::create(path, keel::bench::benchRunInfo());
    for (int64_t i = 0; i < n; ++i) {
      w->writeOp(ops[static_cast<size_t>(i)]);
      if ((i + 1) % 10000 == 0) w->commit();
    }
    w->close();
  }
  state.counters["ops/s"] =
      benchmark::Counter(static_cast<double>(n * state.iterations()), benchmark::Counter::kIsRate);
  removeRecording(path);
}
BENCHMARK(BM_StorageWriterOps)->Arg(100000)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_StorageStepOps(benchmark::State& state) {
  const std::string path = benchPath("reader");
  const int64_t n = state.range(0);
  {
    auto w = Writer::create(path, keel::bench::benchRunInfo());
    for (int64_t i = 0; i < n; ++i) w->writeOp(benchOp(static_cast<uint64_t>(i + 1)));
    w->close();
  }
  Recording rec = Recording::open(path);
  for (auto _ : state) {
    auto ops = rec.stepOps(1);
    benchmark::DoNotOptimize(ops.data());
    if (static_cast<int64_t>(ops.size()) != n) state.SkipWithError("wrong op count");
  }
  state.counters["ops/s"] =
      benchmark::Counter(static_cast<double>(n * state.iterations()), benchmark::Counter::kIsRate);
  removeRecording(path);
}
BENCHMARK(BM_StorageStepOps)->Arg(100000)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
