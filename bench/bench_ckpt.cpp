// FlexCheckpoint benchmarks: (1) converting a generated ~2 GiB tp=4 checkpoint to tp=2 with
// fused_qkv and ^T on about a third of the bytes, as a fraction of this machine's memcpy
// bandwidth measured in the same run (single-thread memcpy and memcpy on as many threads as the
// conversion), against the write floor (the same bytes written from memory into new files in the
// same folder: what any conversion through the page cache pays at least), with the peak resident
// memory of the conversion; (2) planning a reshard of 50,000 keys x 64 source shards x 64 target
// shards; (3) opening, planning and loading checkpoints of 5,000 to 40,000 keys, fitted to O(N)
// (Note [Linear headers]). KEEL_BENCH_CKPT_MIB sets the checkpoint size (default 2048),
// KEEL_BENCH_CKPT_DIR its folder (default /dev/shm when it has room, else the temp directory).
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "ckpt/ckpt_internal.h"
#include "keel/checkpoint.h"

namespace {

namespace fs = std::filesystem;
using namespace keel;
using ckpt::Dims;

constexpr double kMiB = 1024.0 * 1024.0;

// Model: d = 1024, 16 query heads and 4 kv groups (head_dim 64), SwiGLU with d_ff 1664.
// Per layer: q 4 MiB, k 1 MiB, v 1 MiB, proj 4 MiB (^T), w1 w3 w2 6.5 MiB each = 29.5 MiB;
// fused_qkv and ^T touch 10 of them (34%).
constexpr int64_t kD = 1024, kKv = 256, kFF = 1664;

struct Generated {
  std::string dir;
  uint64_t bytes = 0;
  int layers = 0;
};

// VmHWM / VmRSS of this process in bytes.
uint64_t procStatus(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0)
      return uint64_t(std::strtoull(line.c_str() + std::strlen(field) + 1, nullptr, 10)) * 1024;
  return 0;
}
// Resets VmHWM to the current RSS (Linux >= 4.0).
void resetPeakRss() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

std::string gCleanup;  // the generated folder, removed at exit

const Generated& generated() {
  static Generated g = [] {
    Generated out;
    const char* mib = std::getenv("KEEL_BENCH_CKPT_MIB");
    const double target = mib ? std::atof(mib) : 2048.0;
    out.layers = std::max(1, int(target / 29.5 + 0.5));
    // tmpfs when it has room for source, target and a copy (so the disk, ~130 MB/s of writeback
    // on this VM, is not what is measured), else the temp directory.
    const char* dir = std::getenv("KEEL_BENCH_CKPT_DIR");
    std::string base = fs::temp_directory_path().string();
    std::error_code ec;
    if (fs::is_directory("/dev/shm", ec) &&
        double(fs::space("/dev/shm", ec).available) > 3.2 * target * kMiB)
      base = "/dev/shm";
    out.dir =
        (fs::path(dir ? dir : base) / ("keel_bench_ckpt_" + std::to_string(::getpid()))).string();
    fs::remove_all(out.dir);
    fs::create_directories(out.dir + "/src");
    gCleanup = out.dir;
    if (!std::getenv("KEEL_BENCH_CKPT_KEEP")) std::atexit([] { fs::remove_all(gCleanup); });
    const int tp = 4;
    struct Key {
      std::string name;
      Dims shape;
      int axis;
    };
    std::vector<Key> keys;
    for (int l = 0; l < out.layers; ++l) {
      const std::string b = "blocks." + std::to_string(l) + ".";
      keys.push_back({b + "attn.q.weight", {kD, kD}, 0});
      keys.push_back({b + "attn.k.weight", {kKv, kD}, 0});
      keys.push_back({b + "attn.v.weight", {kKv, kD}, 0});
      keys.push_back({b + "attn.proj.weight", {kD, kD}, 1});
      keys.push_back({b + "mlp.w1.weight", {kFF, kD}, 0});
      keys.push_back({b + "mlp.w3.weight", {kFF, kD}, 0});
      keys.push_back({b + "mlp.w2.weight", {kD, kFF}, 1});
      keys.push_back({b + "norm1.weight", {kD}, -1});
    }
    ckpt::Metadata meta;
    std::vector<std::vector<st::WriteEntry>> entries(tp);
    std::vector<std::vector<std::pair<size_t, size_t>>> where(keys.size());  // (file, index)
    for (size_t k = 0; k < keys.size(); ++k) {
      ckpt::KeyInfo ki;
      ki.key = keys[k].name;
      ki.shape = keys[k].shape;
      ki.splitAxis = keys[k].axis;
      const int parts = keys[k].axis >= 0 ? tp : 1;
      for (int r = 0; r < parts; ++r) {
        ckpt::ShardInfo s;
        s.offset.assign(ki.shape.size(), 0);
        s.shape = ki.shape;
        if (keys[k].axis >= 0)
          ckpt::splitRange(ki.shape[size_t(keys[k].axis)], tp, r, s.offset[size_t(keys[k].axis)],
                           s.shape[size_t(keys[k].axis)]);
        s.file = uint32_t(keys[k].axis >= 0 ? r : int(k % tp));
        where[k].push_back({s.file, entries[s.file].size()});
        entries[s.file].push_back({ki.key, st::DType::F32, s.shape});
        ki.shards.push_back(s);
      }
      meta.keys.push_back(std::move(ki));
    }
    // Random-looking data: one 8 MiB buffer of noise, written at rotating offsets.
    std::vector<uint32_t> noise(size_t(8) << 18);
    std::mt19937 rng(1);
    for (auto& x : noise) x = rng();
    std::vector<std::unique_ptr<st::Writer>> writers;
    for (int r = 0; r < tp; ++r) {
      meta.files.push_back(ckpt::detail::fileName(r, tp));
      writers.push_back(
          std::make_unique<st::Writer>(out.dir + "/src/" + meta.files.back(), entries[size_t(r)]));
    }
    for (size_t k = 0; k < keys.size(); ++k)
      for (size_t i = 0; i < where[k].size(); ++i) {
        auto [f, idx] = where[k][i];
        auto& s = meta.keys[k].shards[i];
        s.begin = writers[f]->offsetOf(idx);
        s.end = s.begin + writers[f]->bytesOf(idx);
        const auto* src = reinterpret_cast<const uint8_t*>(noise.data()) + (k * 4096) % (4 << 20);
        writers[f]->write(idx, 0, src, size_t(s.end - s.begin));
        out.bytes += s.end - s.begin;
      }
    for (auto& w : writers) w->close();
    std::ofstream(out.dir + "/src/" + ckpt::kMetadataFile) << ckpt::metadataToJson(meta);
    std::ofstream(out.dir + "/rules.aoa")
        << "blocks.$LAYER_ID.attn.q.weight, blocks.$LAYER_ID.attn.k.weight, "
           "blocks.$LAYER_ID.attn.v.weight -> blocks.$LAYER_ID.attn.qkv.weight, fused_qkv, "
           "num_heads=16, num_key_value_groups=4\n"
           "blocks.$LAYER_ID.attn.proj.weight^T -> blocks.$LAYER_ID.attn.proj_t.weight\n";
    return out;
  }();
  return g;
}

double cpuSeconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

// Runs fn(t) on `threads` threads at once; wall seconds.
template <class Fn>
double onThreads(int threads, Fn fn) {
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(fn, t);
  for (auto& t : pool) t.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// memcpy bandwidth (bytes copied per second, all threads together) over 256 MiB buffers per
// thread, best of 5.
double memcpyBandwidth(int threads) {
  const size_t n = size_t(256) << 20;
  std::vector<std::unique_ptr<char[]>> a, b;
  for (int t = 0; t < threads; ++t) {
    a.emplace_back(new char[n]);
    b.emplace_back(new char[n]);
    std::memset(a.back().get(), 1, n);
    std::memset(b.back().get(), 2, n);
  }
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    const double s = onThreads(threads, [&](int t) {
      std::memcpy(b[size_t(t)].get(), a[size_t(t)].get(), n);
      benchmark::DoNotOptimize(b[size_t(t)].get());
      benchmark::ClobberMemory();
    });
    best = std::max(best, double(n) * threads / s);
  }
  return best;
}

// The write floor: writing `bytes` from a warm 4 MiB buffer into `files` new files in `dir`
// (pwrite, 4 MiB at a time, one thread per file as far as threads go): what any conversion that
// writes through the page cache must pay at least. Bytes per wall second.
double writeFloor(const std::string& dir, uint64_t bytes, int files, int threads) {
  const size_t block = size_t(4) << 20;
  std::vector<char> buf(block, 7);
  std::vector<int> fds;
  for (int f = 0; f < files; ++f)
    fds.push_back(::open((dir + "/floor" + std::to_string(f) + ".tmp").c_str(),
                         O_WRONLY | O_CREAT | O_TRUNC, 0644));
  const uint64_t perFile = bytes / uint64_t(files);
  std::atomic<int> nextFile{0};
  const double s = onThreads(threads, [&](int) {
    for (int f; (f = nextFile.fetch_add(1)) < files;)
      for (uint64_t at = 0; at < perFile; at += block)
        if (::pwrite(fds[size_t(f)], buf.data(), size_t(std::min<uint64_t>(block, perFile - at)),
                     off_t(at)) < 0)
          std::abort();
  });
  for (int f = 0; f < files; ++f) {
    ::close(fds[size_t(f)]);
    fs::remove(dir + "/floor" + std::to_string(f) + ".tmp");
  }
  return double(perFile * uint64_t(files)) / s;
}

// Converts the generated checkpoint (tp=4) to tp=2, with the rules when state.range(1) is 1, on
// state.range(0) threads. Each iteration is one conversion into a fresh folder, preceded by one
// write-floor run of the same bytes; figures are medians over the iterations.
void BM_CkptConvertTp4ToTp2(benchmark::State& state) {
  const Generated& g = generated();
  const int threads = int(state.range(0));
  const bool withRules = state.range(1) != 0;
  const double memcpy1 = memcpyBandwidth(1);
  const double memcpyT = threads == 1 ? memcpy1 : memcpyBandwidth(threads);
  ckpt::Checkpoint src = ckpt::Checkpoint::open(g.dir + "/src");
  aoa::Program rules = aoa::parseFile(g.dir + "/rules.aoa");
  ckpt::TargetSpec spec;
  spec.tp = 2;
  ckpt::ConvertOptions opt;
  opt.threads = threads;
  const std::string dst = g.dir + "/dst";
  std::vector<double> rate, cpuRate, floorRate;
  double peak = 0, base = 0;
  for (auto _ : state) {
    state.PauseTiming();
    fs::remove_all(dst);
    floorRate.push_back(writeFloor(g.dir, g.bytes, spec.tp, threads));
    base = double(procStatus("VmRSS:"));
    resetPeakRss();
    state.ResumeTiming();
    auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
    ckpt::ConvertStats st = ckpt::convert(src, dst, spec, withRules ? &rules : nullptr, opt);
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = cpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - c0;
    peak = std::max(peak, double(procStatus("VmHWM:")));
    rate.push_back(double(st.bytesWritten) / wall);
    cpuRate.push_back(double(st.bytesWritten) / cpu);
  }
  const double largest =
      double(ckpt::makePlan(src.metadata(), withRules ? &rules : nullptr, spec).maxShardBytes);
  fs::remove_all(dst);
  const double bps = keel::bench::median(rate), floorBps = keel::bench::median(floorRate);
  state.counters["ckpt_GiB"] = double(g.bytes) / (kMiB * 1024);
  state.counters["GiB/s"] = bps / (kMiB * 1024);
  state.counters["GiB/s_min"] = *std::min_element(rate.begin(), rate.end()) / (kMiB * 1024);
  state.counters["GiB/s_max"] = *std::max_element(rate.begin(), rate.end()) / (kMiB * 1024);
  state.counters["cpu_GiB/s"] = keel::bench::median(cpuRate) / (kMiB * 1024);
  state.counters["memcpy_GiB/s"] = memcpy1 / (kMiB * 1024);
  state.counters["memcpy_T_GiB/s"] = memcpyT / (kMiB * 1024);
  state.counters["of_memcpy"] = bps / memcpy1;
  state.counters["of_memcpy_T"] = bps / memcpyT;
  state.counters["floor_GiB/s"] = floorBps / (kMiB * 1024);
  state.counters["of_floor"] = bps / floorBps;
  state.counters["peak_rss_MiB"] = peak / kMiB;
  state.counters["rss_before_MiB"] = base / kMiB;
  state.counters["largest_shard_MiB"] = largest / kMiB;
}
BENCHMARK(BM_CkptConvertTp4ToTp2)
    ->ArgNames({"threads", "rules"})
    ->Args({2, 1})
    ->Args({1, 1})
    ->Args({2, 0})
    ->Iterations(5)
    ->Unit(benchmark::kSecond)
    ->UseRealTime();

// 50,000 keys [4096 + k % 64, 256], 64 source shards with uneven boundaries (a layout saved
// elsewhere), 64 target shards (the balanced split): every target shard overlaps 1-3 sources.
void BM_CkptPlan50kKeys64x64(benchmark::State& state) {
  const int keys = 50000, parts = 64;
  ckpt::Metadata m;
  for (int f = 0; f < parts; ++f) m.files.push_back(ckpt::detail::fileName(f, parts));
  std::mt19937_64 rng(5);
  for (int k = 0; k < keys; ++k) {
    ckpt::KeyInfo ki;
    ki.key = "layers." + std::to_string(k / 8) + ".mlp.w" + std::to_string(k % 8) + ".weight";
    ki.shape = {4096 + k % 64, 256};
    ki.splitAxis = 0;
    int64_t at = 0;
    for (int p = 0; p < parts; ++p) {
      int64_t len =
          p + 1 == parts ? ki.shape[0] - at : ki.shape[0] / parts + int64_t(rng() % 9) - 4;
      ckpt::ShardInfo s;
      s.offset = {at, 0};
      s.shape = {len, 256};
      s.file = uint32_t(p);
      ki.shards.push_back(s);
      at += len;
    }
    m.keys.push_back(std::move(ki));
  }
  ckpt::TargetSpec spec;
  spec.tp = parts;
  spec.axis = [](const std::string&, const Dims&) { return 0; };
  size_t items = 0, shards = 0;
  for (auto _ : state) {
    ckpt::Plan p = ckpt::makePlan(m, nullptr, spec);
    items = p.items.size();
    shards = p.shards.size();
    benchmark::DoNotOptimize(p.bytesRead);
  }
  state.counters["target_shards"] = double(shards);
  state.counters["reads"] = double(items);
}
BENCHMARK(BM_CkptPlan50kKeys64x64)->Iterations(3)->Unit(benchmark::kMillisecond)->UseRealTime();

// ---- many keys (Note [Linear headers]) ----------------------------------------------------

// A safetensors file of n small tensors ("layers.<i/4>.w<i%4>", F32 [2]) and its tp=2 conversion
// (a checkpoint directory: metadata JSON and two files), made once per n in the temp directory.
struct ManyKeys {
  std::string file, dir;
};
const ManyKeys& manyKeys(int n) {
  static std::map<int, ManyKeys> made;
  auto it = made.find(n);
  if (it != made.end()) return it->second;
  const fs::path root = fs::temp_directory_path() /
                        ("keel_bench_keys_" + std::to_string(::getpid()) + "_" + std::to_string(n));
  static std::vector<fs::path> roots;  // removed at exit
  if (roots.empty())
    std::atexit([] {
      for (const auto& r : roots) fs::remove_all(r);
    });
  roots.push_back(root);
  fs::remove_all(root);
  fs::create_directories(root);
  ManyKeys m{(root / "many.safetensors").string(), (root / "tp2").string()};
  std::vector<st::WriteEntry> entries;
  for (int i = 0; i < n; ++i)
    entries.push_back(
        {"layers." + std::to_string(i / 4) + ".w" + std::to_string(i % 4), st::DType::F32, {2}});
  {
    st::Writer w(m.file, entries);
    const float v[2] = {1.0f, 2.0f};
    for (size_t i = 0; i < entries.size(); ++i) w.write(i, 0, v, sizeof v);
    w.close();
  }
  ckpt::TargetSpec spec;
  spec.tp = 2;
  ckpt::convert(ckpt::Checkpoint::open(m.file), m.dir, spec, nullptr);
  return made.emplace(n, m).first->second;
}

// Opening a safetensors file of n keys (its header parsed and checked) and planning a tp=2
// reshard of it; with rules, through an AOA macro whose wildcard runs once per layer
// ("layers.$LAYER_ID.* -> blocks.$LAYER_ID.*"). Linear in n: the big-O fit below is O(N).
void ckptOpenPlan(benchmark::State& state, bool rules) {
  const int n = int(state.range(0));
  const ManyKeys& m = manyKeys(n);
  aoa::Program prog = aoa::parse("layers.$LAYER_ID.* -> blocks.$LAYER_ID.*\n", "bench.aoa");
  ckpt::TargetSpec spec;
  spec.tp = 2;
  for (auto _ : state) {
    ckpt::Checkpoint c = ckpt::Checkpoint::open(m.file);
    ckpt::Plan p = ckpt::makePlan(c.metadata(), rules ? &prog : nullptr, spec);
    benchmark::DoNotOptimize(p.bytesWritten);
  }
  state.SetComplexityN(n);
}
void BM_CkptOpenPlanKeys(benchmark::State& state) {
  ckptOpenPlan(state, false);
}
void BM_CkptOpenPlanKeysMacroRule(benchmark::State& state) {
  ckptOpenPlan(state, true);
}

// Opening the tp=2 checkpoint directory of n keys (metadata JSON read, shards checked against
// both files' headers) and loading every key into memory (the AOA key space, the load plan, the
// reads): what `keel train --resume` does with a checkpoint.
void BM_CkptOpenLoadKeys(benchmark::State& state) {
  const int n = int(state.range(0));
  const ManyKeys& m = manyKeys(n);
  std::vector<float> values(size_t(n) * 2);
  for (auto _ : state) {
    ckpt::Checkpoint c = ckpt::Checkpoint::open(m.dir);
    std::vector<ckpt::HostTensor> targets;
    targets.reserve(size_t(n));
    for (const auto& k : c.metadata().keys)
      targets.push_back({k.key, k.dtype, k.shape, values.data() + 2 * targets.size()});
    ckpt::loadTensors(c, nullptr, targets);
    benchmark::DoNotOptimize(values.data());
  }
  state.SetComplexityN(n);
}

// 5k to 40k keys, with the fitted complexity (near-linear is the goal).
void manyKeys(benchmark::internal::Benchmark* b) {
  b->Arg(5000)
      ->Arg(10000)
      ->Arg(20000)
      ->Arg(40000)
      ->Complexity(benchmark::oN)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}
BENCHMARK(BM_CkptOpenPlanKeys)->Apply(manyKeys);
BENCHMARK(BM_CkptOpenPlanKeysMacroRule)->Apply(manyKeys);
BENCHMARK(BM_CkptOpenLoadKeys)->Apply(manyKeys);

}  // namespace
