// Tensor checksum and statistics throughput (capture's per-tensor cost) on a 4 MiB float32 tensor,
// with memcpy of the same bytes as the baseline: bytes/s in the counters. And multi-buffer MD5
// (md5Many) over a step's worth of tensors at each lane width, against OpenSSL one message at a
// time.
#include <benchmark/benchmark.h>

#if __has_include("keel/capture/hash.h")
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "keel/capture/hash.h"
#include "keel/capture/md5_multi.h"
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

// A batch of messages like a step's tensors: each one element bytes, then a 40-byte trailer.
struct Md5Batch {
  std::vector<std::vector<uint8_t>> data;
  std::string trailer = std::string(40, 't');
  std::vector<keel::capture::Md5Message> msgs;
  int64_t bytes = 0;
};

Md5Batch makeBatch(const std::vector<size_t>& sizes) {
  Md5Batch b;
  std::mt19937_64 rng(1);
  for (size_t n : sizes) {
    std::vector<uint8_t> v(n);
    for (auto& x : v) x = uint8_t(rng());
    b.data.push_back(std::move(v));
  }
  const std::span<const uint8_t> t(reinterpret_cast<const uint8_t*>(b.trailer.data()),
                                   b.trailer.size());
  for (const auto& v : b.data) {
    b.msgs.push_back({{std::span<const uint8_t>(v), t}});
    b.bytes += int64_t(v.size() + t.size());
  }
  return b;
}

// 300 tensors of 4 KiB .. 1 MiB, log-uniform, scaled to about 64 MiB in all (multiples of 4 bytes).
const Md5Batch& mixedBatch() {
  static const Md5Batch b = [] {
    std::mt19937_64 rng(300);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::vector<double> draw(300);
    double sum = 0;
    for (double& d : draw) sum += (d = 4096.0 * std::pow(256.0, u(rng)));
    std::vector<size_t> sizes;
    for (double d : draw)
      sizes.push_back(size_t(std::clamp(d * double(64 << 20) / sum, 4096.0, 1048576.0)) &
                      ~size_t(3));
    return makeBatch(sizes);
  }();
  return b;
}

// 256 tensors of 256 KiB: 64 MiB.
const Md5Batch& uniformBatch() {
  static const Md5Batch b = makeBatch(std::vector<size_t>(256, size_t(256) << 10));
  return b;
}

// Seconds for OpenSSL (lanes = 1) over batch b: the best of three runs, measured once per batch.
double opensslSeconds(const Md5Batch& b) {
  std::vector<keel::capture::Md5Digest> out(b.msgs.size());
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    keel::capture::md5ManyWithLanes(b.msgs, out, 1);
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// state.range(0) lanes over batch b; "vs_openssl" = OpenSSL's time over this run's time per batch.
void md5ManyOver(benchmark::State& state, const Md5Batch& b, double openssl) {
  const int lanes = int(state.range(0));
  if (!keel::capture::md5LanesSupported(lanes)) {
    state.SkipWithError("this CPU cannot run that lane count");
    return;
  }
  std::vector<keel::capture::Md5Digest> out(b.msgs.size());
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    keel::capture::md5ManyWithLanes(b.msgs, out, lanes);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * b.bytes);
  state.counters["messages"] = double(b.msgs.size());
  state.counters["MiB"] = double(b.bytes) / double(1 << 20);
  state.counters["vs_openssl"] = openssl / (seconds / double(state.iterations()));
}

// The lane counts the multi-buffer benchmarks run at: one lane (the scalar path) up to the 48 of
// three interleaved AVX-512 groups.
void laneCounts(benchmark::internal::Benchmark* b) {
  b->ArgName("lanes")->Unit(benchmark::kMillisecond);
  for (int lanes : {1, 8, 16, 32, 48}) b->Arg(lanes);
}

void md5ManyMixed(benchmark::State& state) {
  static const double openssl = opensslSeconds(mixedBatch());
  md5ManyOver(state, mixedBatch(), openssl);
}
BENCHMARK(md5ManyMixed)->Apply(laneCounts);

void md5ManyUniform(benchmark::State& state) {
  static const double openssl = opensslSeconds(uniformBatch());
  md5ManyOver(state, uniformBatch(), openssl);
}
BENCHMARK(md5ManyUniform)->Apply(laneCounts);

// What the capture's hashing thread does for a step (Note [Hashing off the engine thread]):
// midstates of the mixed batch's messages (float32 elements, 64 MiB, more than the L3 cache),
// statistics of each, and both in one pass (the statistics fed by the lanes' byte sink). Counters:
// GiB/s of each (range(0): 0 md5, 1 stats, 2 fused) over the batch's bytes.
void hashStepPass(benchmark::State& state) {
  const Md5Batch& b = mixedBatch();
  const int what = int(state.range(0));
  std::vector<keel::capture::Md5Message> msgs;  // elements only (the trailer is finished later)
  for (const auto& v : b.data) msgs.push_back({{std::span<const uint8_t>(v)}});
  std::vector<keel::capture::Md5Midstate> mids(msgs.size());
  struct Sink final : keel::capture::Md5ByteSink {
    std::vector<keel::capture::StatsStream>* streams = nullptr;
    void bytes(size_t m, const uint8_t* p, size_t n) override {
      (*streams)[m].add(p, int64_t(n / 4));
    }
  };
  double seconds = 0;
  for (auto _ : state) {
    std::vector<keel::capture::StatsStream> streams;
    for (size_t i = 0; i < msgs.size(); ++i) streams.emplace_back(keel::DType::Float32, 0.0);
    Sink sink;
    sink.streams = &streams;
    const auto t0 = std::chrono::steady_clock::now();
    if (what == 0) keel::capture::md5ManyMidstates(msgs, mids);
    if (what == 1)
      for (size_t i = 0; i < msgs.size(); ++i)
        streams[i].add(msgs[i].parts[0].data(), int64_t(msgs[i].parts[0].size() / 4));
    if (what == 2) keel::capture::md5ManyMidstates(msgs, mids, 0, &sink);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    benchmark::DoNotOptimize(mids.data());
    benchmark::DoNotOptimize(streams.back().finish());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * b.bytes);
  state.SetLabel(what == 0   ? "md5 midstates"
                 : what == 1 ? "statistics"
                             : "md5 + statistics, one pass");
}
BENCHMARK(hashStepPass)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);

}  // namespace
#endif
