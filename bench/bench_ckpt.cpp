// FlexCheckpoint benchmarks: (1) converting a generated ~2 GiB tp=4 checkpoint to tp=2 with
// fused_qkv and ^T on about a third of the bytes, as a fraction of this machine's memcpy
// bandwidth measured in the same run, with the peak resident memory of the conversion;
// (2) planning a reshard of 50,000 keys x 64 source shards x 64 target shards.
// KEEL_BENCH_CKPT_MIB sets the checkpoint size (default 2048), KEEL_BENCH_CKPT_DIR its folder
// (default /dev/shm when it has room, else the temp directory).
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>

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
    std::atexit([] { fs::remove_all(gCleanup); });
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

// Single-thread memcpy bandwidth (bytes copied per second) over 256 MiB buffers, best of 5, by
// wall time and by CPU time (the second is robust on a loaded machine).
double memcpyCpuBps = 0;
double memcpyBandwidth() {
  const size_t n = size_t(256) << 20;
  std::unique_ptr<char[]> a(new char[n]), b(new char[n]);
  std::memset(a.get(), 1, n);
  std::memset(b.get(), 2, n);
  double best = 0;
  memcpyCpuBps = 0;
  for (int i = 0; i < 5; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpuSeconds(CLOCK_THREAD_CPUTIME_ID);
    std::memcpy(b.get(), a.get(), n);
    benchmark::DoNotOptimize(b.get());
    benchmark::ClobberMemory();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, double(n) / s);
    memcpyCpuBps = std::max(memcpyCpuBps, double(n) / (cpuSeconds(CLOCK_THREAD_CPUTIME_ID) - c0));
  }
  return best;
}

// The kernel's own file-to-file copy (copy_file_range, what `cp` does) of every source file:
// the ceiling for any conversion that writes through the page cache. Bytes per wall second and
// per CPU second.
std::pair<double, double> fileCopyBandwidth(const std::string& dir) {
  double bytes = 0, wall = 0, cpu = 0;
  for (const auto& e : fs::directory_iterator(dir + "/src")) {
    if (e.path().extension() != ".safetensors") continue;
    const std::string out = dir + "/copy.tmp";
    fs::remove(out);
    const int in = ::open(e.path().c_str(), O_RDONLY),
              o = ::open(out.c_str(), O_WRONLY | O_CREAT, 0644);
    const uint64_t n = fs::file_size(e.path());
    auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
    uint64_t left = n;
    while (left > 0) {
      ssize_t k = ::copy_file_range(in, nullptr, o, nullptr, size_t(left), 0);
      if (k <= 0) break;
      left -= uint64_t(k);
    }
    wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cpu += cpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - c0;
    bytes += double(n - left);
    ::close(in);
    ::close(o);
    fs::remove(out);
  }
  return {bytes / wall, bytes / cpu};
}

void BM_CkptConvertTp4ToTp2(benchmark::State& state) {
  const Generated& g = generated();
  const double memcpyBps = memcpyBandwidth();
  const auto [copyBps, copyCpuBps] = fileCopyBandwidth(g.dir);
  ckpt::Checkpoint src = ckpt::Checkpoint::open(g.dir + "/src");
  aoa::Program rules = aoa::parseFile(g.dir + "/rules.aoa");
  ckpt::TargetSpec spec;
  spec.tp = 2;
  ckpt::ConvertOptions opt;
  opt.threads = int(state.range(0));
  const std::string dst = g.dir + "/dst";
  double seconds = 0, cpu = 0, peak = 0, base = 0, largest = 0;
  uint64_t bytes = 0;
  for (auto _ : state) {
    state.PauseTiming();
    fs::remove_all(dst);
    base = double(procStatus("VmRSS:"));
    resetPeakRss();
    state.ResumeTiming();
    auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
    ckpt::ConvertStats st = ckpt::convert(src, dst, spec, &rules, opt);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cpu += cpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - c0;
    peak = std::max(peak, double(procStatus("VmHWM:")));
    bytes += st.bytesWritten;
  }
  largest = double(ckpt::makePlan(src.metadata(), &rules, spec).maxShardBytes);
  fs::remove_all(dst);
  const double bps = double(bytes) / seconds;
  state.counters["ckpt_GiB"] = double(g.bytes) / (kMiB * 1024);
  state.counters["GiB/s"] = bps / (kMiB * 1024);
  state.counters["memcpy_GiB/s"] = memcpyBps / (kMiB * 1024);
  state.counters["of_memcpy"] = bps / memcpyBps;
  // Per CPU-second of work (all threads, user + kernel) against memcpy per CPU-second.
  state.counters["cpu_GiB/s"] = double(bytes) / cpu / (kMiB * 1024);
  state.counters["of_memcpy_cpu"] = double(bytes) / cpu / memcpyCpuBps;
  state.counters["filecopy_GiB/s"] = copyBps / (kMiB * 1024);
  state.counters["of_filecopy"] = bps / copyBps;
  state.counters["of_filecopy_cpu"] = double(bytes) / cpu / copyCpuBps;
  state.counters["peak_rss_MiB"] = peak / kMiB;
  state.counters["rss_before_MiB"] = base / kMiB;
  state.counters["largest_shard_MiB"] = largest / kMiB;
  state.SetBytesProcessed(int64_t(bytes));
}
BENCHMARK(BM_CkptConvertTp4ToTp2)
    ->Arg(1)
    ->Arg(2)
    ->Iterations(2)
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

}  // namespace
