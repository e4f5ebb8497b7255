// `keel memory ...` and `keel bench allocator`: allocation traces (from a recording, from a run of
// a model config, or generated for a large MoE) replayed through the caching and VMM allocators,
// with peak memory, fragmentation, defragmentation work and cost per call side by side.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cli_common.h"
#include "keel/alloc_trace.h"
#include "keel/data.h"
#include "keel/error.h"
#include "keel/gpt_config.h"
#include "keel/storage/reader.h"
#include "keel/train.h"

namespace keel::cli {
namespace {

bool isSqlite(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[16] = {};
  f.read(magic, 16);
  return f.gcount() == 16 && std::string(magic, 15) == "SQLite format 3";
}

// The alloc/free events of a recording as a trace (blocks named by Buffer id, else by address).
AllocTrace traceFromRecording(const std::string& path) {
  storage::Recording rec = storage::Recording::open(path);
  AllocTrace t;
  std::unordered_map<uint64_t, uint64_t> liveByAddress;  // address -> trace id
  uint64_t nextId = uint64_t(1) << 62;                   // ids for events without a Buffer
  int64_t step = -1;
  for (const auto& m : rec.memEvents({})) {
    if (m.kind != "alloc" && m.kind != "free") continue;
    if (m.step != step) {
      step = m.step;
      t.events.push_back({TraceEvent::Step, uint64_t(step), 0});
    }
    if (m.kind == "alloc") {
      uint64_t id = m.bufferId ? m.bufferId : nextId++;
      liveByAddress[m.address] = id;
      t.events.push_back({TraceEvent::Alloc, id, m.bytes});
    } else if (auto it = liveByAddress.find(m.address); it != liveByAddress.end()) {
      t.events.push_back({TraceEvent::Free, it->second, 0});
      liveByAddress.erase(it);
    }
  }
  if (t.allocs() == 0)
    throw Error("recording " + path +
                " has no allocator events (record with `keel record --allocator` or --all)");
  return t;
}

AllocTrace loadTrace(const std::string& path) {
  return isSqlite(path) ? traceFromRecording(path) : readAllocTrace(path);
}

// Runs `steps` training steps of a config and records the engine's allocations.
AllocTrace traceFromTraining(const std::string& config, int steps, uint64_t seed) {
  GptConfig cfg = loadGptConfig(config);
  auto corpus = std::make_shared<const data::TextDataset>(data::TextDataset::defaultCorpus());
  AllocTraceRecorder rec;
  Trainer tr(cfg, Device(Backend::Cpu), seed, corpus, steps);
  for (int s = 1; s <= steps; ++s) {
    rec.markStep(s);
    tr.step();
  }
  return rec.finish();
}

std::unique_ptr<Allocator> makeAllocator(const std::string& kind) {
  if (kind == "caching") return std::make_unique<CachingAllocator>();
  if (kind == "vmm") {
    VmmAllocatorOptions o;
    return std::make_unique<VmmAllocator>(o);
  }
  throw Error("unknown allocator '" + kind + "' (expected caching or vmm)");
}

// An allocator that hands out addresses without memory: replaying through it measures the replay
// loop itself, which is subtracted from the real allocators' cost per call.
class NullAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    next_ += (bytes + 511) / 512 * 512;
    return reinterpret_cast<void*>(next_);
  }
  void deallocate(void*, size_t) override {}
  std::string name() const override { return "null"; }
  size_t allocatedBytes() const override { return 0; }
  size_t reservedBytes() const override { return 0; }

 private:
  uintptr_t next_ = 4096;
};

double harnessNs(const AllocTrace& t) {
  NullAllocator n;
  double best = 1e300;
  for (int i = 0; i < 3; ++i) best = std::min(best, replayAllocTrace(t, n).nsPerCall);
  return best;
}

std::string mib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(1 << 20));
  return buf;
}

void printHeader() {
  std::printf("%-10s %12s %12s %9s %9s %8s %8s %8s %12s %9s\n", "allocator", "peak alloc",
              "peak resv", "frag@peak", "frag@end", "defrags", "remaps", "compacts", "copied",
              "ns/call");
}

void printRow(const ReplayResult& r, double harness) {
  const AllocatorStats& s = r.stats;
  std::printf("%-10s %12s %12s %8.2f%% %8.2f%% %8llu %8llu %8llu %12s %9.1f\n", r.allocator.c_str(),
              mib(s.peakAllocated).c_str(), mib(s.peakReserved).c_str(),
              100.0 * s.peakFragmentation(), 100.0 * s.fragmentation(),
              static_cast<unsigned long long>(s.defrags),
              static_cast<unsigned long long>(s.chunksRemapped),
              static_cast<unsigned long long>(s.compactions), mib(s.bytesCopied).c_str(),
              std::max(0.0, r.nsPerCall - harness));
}

void describe(const std::string& name, const AllocTrace& t) {
  std::printf("trace %s: %zu allocations, %zu events, %zu steps\n", name.c_str(), t.allocs(),
              t.events.size(), t.steps());
}

int runReplay(const std::string& path, const std::string& kind) {
  AllocTrace t = loadTrace(path);
  describe(path, t);
  double h = harnessNs(t);
  printHeader();
  for (const char* k : {"caching", "vmm"}) {
    if (kind != "both" && kind != k) continue;
    auto a = makeAllocator(k);
    printRow(replayAllocTrace(t, *a), h);
  }
  std::printf("ns/call: mean allocate/deallocate time, less the replay loop's own %.1f ns\n", h);
  return 0;
}

int runTrace(const std::string& config, const std::string& out, int steps, uint64_t seed,
             const MoeTraceOptions& moe, bool generate) {
  AllocTrace t = generate ? generateMoeTrace(moe) : traceFromTraining(config, steps, seed);
  std::ofstream f(out);
  if (!f) throw Error("cannot write '" + out + "'");
  writeAllocTrace(t, f);
  f.close();
  if (!f) throw Error("writing '" + out + "' failed");
  describe(out, t);
  return 0;
}

double threadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e9 + double(ts.tv_nsec);
}

// Five 8 MiB blocks, free the 2nd and 4th, one 16 MiB request under a 40 MiB limit: the thread CPU
// time of that request divided by the chunks it remapped; the median of 201 runs.
double remapUsPerChunk() {
  constexpr size_t kMiB = size_t(1) << 20;
  VmmAllocatorOptions o;
  o.reserve = size_t(1) << 30;
  o.limit = 40 * kMiB;
  VmmAllocator a(o);
  std::vector<double> perChunk;
  for (int i = 0; i < 201; ++i) {
    void* p[5];
    for (auto& x : p) x = a.allocate(8 * kMiB);
    a.deallocate(p[1], 8 * kMiB);
    a.deallocate(p[3], 8 * kMiB);
    uint64_t before = a.stats().chunksRemapped;
    double t0 = threadCpuNs();
    void* big = a.allocate(16 * kMiB);
    double ns = threadCpuNs() - t0;
    uint64_t chunks = a.stats().chunksRemapped - before;
    if (chunks) perChunk.push_back(ns / double(chunks));
    a.deallocate(big, 16 * kMiB);
    for (int k : {0, 2, 4}) a.deallocate(p[k], 8 * kMiB);
    a.emptyCache();
  }
  if (perChunk.empty()) return 0;
  std::nth_element(perChunk.begin(), perChunk.begin() + long(perChunk.size() / 2), perChunk.end());
  return perChunk[perChunk.size() / 2] / 1000.0;
}

int runBenchAllocator(const std::string& config, int steps, const MoeTraceOptions& moe) {
  struct Case {
    std::string name;
    AllocTrace trace;
  };
  std::vector<Case> cases;
  cases.push_back({config + " training, " + std::to_string(steps) + " steps",
                   traceFromTraining(config, steps, 1)});
  cases.push_back({"generated MoE (" + std::to_string(moe.experts) + " experts, top-" +
                       std::to_string(moe.topK) + ", skew " +
                       std::to_string(moe.skew).substr(0, 4) + ", " + std::to_string(moe.steps) +
                       " steps)",
                   generateMoeTrace(moe)});
  bool ok = true;
  for (auto& c : cases) {
    std::printf("\n");
    describe(c.name, c.trace);
    double h = harnessNs(c.trace);
    // Interleaved repeats; the best ns/call of each allocator counts (the machine is shared).
    ReplayResult best[2];
    for (int rep = 0; rep < 5; ++rep) {
      for (int k = 0; k < 2; ++k) {
        auto a = makeAllocator(k == 0 ? "caching" : "vmm");
        ReplayResult r = replayAllocTrace(c.trace, *a);
        if (rep == 0 || r.nsPerCall < best[k].nsPerCall) best[k] = r;
      }
    }
    printHeader();
    printRow(best[0], h);
    printRow(best[1], h);
    const AllocatorStats &cs = best[0].stats, &vs = best[1].stats;
    double resv = double(vs.peakReserved) / double(cs.peakReserved);
    double cost = std::max(0.0, best[1].nsPerCall - h) / std::max(1e-9, best[0].nsPerCall - h);
    bool g1 = vs.peakFragmentation() <= 0.03, g2 = cs.peakFragmentation() >= 0.10;
    bool g3 = resv <= 0.90, g4 = cost <= 1.5;
    std::printf(
        "vmm fragmentation at peak %.2f%% (goal <= 3%%: %s); caching %.2f%% (>= 10%%: %s)\n",
        100 * vs.peakFragmentation(), g1 ? "met" : "NOT MET", 100 * cs.peakFragmentation(),
        g2 ? "yes" : "no");
    std::printf("vmm peak reserved / caching: %.3f (goal <= 0.90: %s)\n", resv,
                g3 ? "met" : "NOT MET");
    std::printf("vmm cost per call / caching: %.2f (goal <= 1.5: %s)\n", cost,
                g4 ? "met" : "NOT MET");
    ok = ok && g1 && g3 && g4;
  }
  double us = remapUsPerChunk();
  std::printf("\nvmm remap: %.2f us per 2 MiB chunk (goal <= 10: %s)\n", us,
              us <= 10 ? "met" : "NOT MET");
  std::printf("%s\n", ok && us <= 10 ? "all goals met" : "some goals not met");
  return 0;
}

void addMoeOptions(CLI::App* c, MoeTraceOptions& m) {
  c->add_option("--experts", m.experts, "generated trace: experts per layer")
      ->check(CLI::Range(1, 4096));
  c->add_option("--top-k", m.topK, "generated trace: experts per token")->check(CLI::Range(1, 64));
  c->add_option("--layers", m.layers, "generated trace: MoE layers")->check(CLI::Range(1, 256));
  c->add_option("--tokens", m.tokens, "generated trace: tokens per step")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  c->add_option("--d-model", m.dModel, "generated trace: model width")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 16));
  c->add_option("--d-ff", m.dFf, "generated trace: expert hidden width")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 18));
  c->add_option("--moe-steps", m.steps, "generated trace: steps")->check(CLI::Range(1, 100000));
  c->add_option("--skew", m.skew, "generated trace: Zipf exponent of the routing")
      ->check(CLI::Range(0.0, 8.0));
  c->add_option("--trace-seed", m.seed, "generated trace: seed");
}

}  // namespace

void addAllocOption(CLI::App* c, std::string& kind) {
  c->add_option("--alloc", kind, "allocator for host tensors: host, caching or vmm")
      ->check(CLI::IsMember({"host", "caching", "vmm"}));
}

void applyAllocOption(const std::string& flag, const std::string& configValue) {
  const std::string& kind = flag.empty() ? configValue : flag;
  if (kind.empty()) return;
  auto k = parseAllocatorKind(kind);
  KEEL_CHECK(k, "--alloc: unknown allocator '", kind, "' (expected host, caching or vmm)");
  setDefaultAllocatorKind(*k);
}

Command addMemoryCommand(CLI::App& root) {
  CLI::App* c = root.add_subcommand("memory", "allocation traces: record, generate, replay");
  c->require_subcommand(1);
  struct Args {
    std::string trace, allocator = "both", config = "configs/moe-mini.json", out;
    int steps = 5;
    uint64_t seed = 1;
    bool generate = false;
    MoeTraceOptions moe;
  };
  auto a = std::make_shared<Args>();
  CLI::App* replay = c->add_subcommand(
      "replay",
      "replay a trace (text file or a recording with allocator events) through an "
      "allocator and print peak memory, fragmentation, defragmentation and ns per call");
  replay->add_option("TRACE", a->trace, "trace file or recording")->required();
  replay->add_option("--allocator", a->allocator, "caching, vmm or both")
      ->check(CLI::IsMember({"caching", "vmm", "both"}));
  CLI::App* trace = c->add_subcommand(
      "trace", "write the allocation trace of a training run (or a generated MoE trace)");
  trace->add_option("OUT", a->out, "output trace file")->required();
  trace->add_option("--config", a->config, "model config to train");
  trace->add_option("--steps", a->steps, "training steps")->check(CLI::Range(1, 100000));
  trace->add_option("--seed", a->seed, "run seed");
  trace->add_flag("--generate-moe", a->generate, "generate a large MoE trace instead");
  addMoeOptions(trace, a->moe);
  return {c, [a, replay, trace] {
            if (replay->parsed()) return runReplay(a->trace, a->allocator);
            if (trace->parsed())
              return runTrace(a->config, a->out, a->steps, a->seed, a->moe, a->generate);
            return fail("keel memory: expected replay or trace");
          }};
}

Command addBenchCommand(CLI::App& root) {
  CLI::App* c = root.add_subcommand("bench", "built-in comparisons");
  c->require_subcommand(1);
  struct Args {
    std::string config = "configs/moe-mini.json";
    int steps = 5;
    MoeTraceOptions moe;
  };
  auto a = std::make_shared<Args>();
  CLI::App* alloc =
      c->add_subcommand("allocator",
                        "caching vs VMM allocator on a model's training trace and a generated MoE "
                        "trace: fragmentation, peak reserved, cost per call, remap cost");
  alloc->add_option("--config", a->config, "model config whose training trace is replayed");
  alloc->add_option("--steps", a->steps, "training steps traced")->check(CLI::Range(1, 10000));
  addMoeOptions(alloc, a->moe);
  return {c, [a, alloc] {
            if (alloc->parsed()) return runBenchAllocator(a->config, a->steps, a->moe);
            return fail("keel bench: expected allocator");
          }};
}

}  // namespace keel::cli
