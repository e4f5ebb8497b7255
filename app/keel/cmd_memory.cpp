// `keel memory ...` and `keel bench allocator`: allocation traces (from a recording, from a run of
// a model config, or generated for a large MoE) replayed through the caching and VMM allocators,
// with peak memory, fragmentation, defragmentation work and cost per call side by side. Wiring and
// printing only: the replays, comparisons and goals are the engine's (keel/alloc_trace.h), the
// recording-to-trace conversion capture's (keel/capture/alloc_trace_io.h). `keel memory stats`
// prints a recording's memory figures as the studio's memory view computes them (analysis/).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_common.h"
#include "keel/alloc_trace.h"
#include "keel/allocator.h"
#include "keel/analysis/memory_model.h"
#include "keel/base/output_path.h"
#include "keel/base/text.h"
#include "keel/base/vocabulary.h"
#include "keel/capture/alloc_trace_io.h"
#include "keel/capture/options.h"
#include "keel/error.h"
#include "keel/gpt_config.h"
#include "keel/storage/reader.h"

namespace keel::cli {
namespace {

void printHeader() {
  std::printf("%-10s %12s %12s %9s %10s %8s %8s %8s %12s %9s\n", "allocator", "peak alloc",
              "peak resv", "frag@peak", "cached@end", "defrags", "remaps", "compacts", "copied",
              "ns/call");
}

// One allocator's row. A replay that ran out of memory (ranOut) has its peaks up to there and no
// end or cost: "-" in those columns.
void printRow(const ReplayResult& r, double harness, bool ranOut = false) {
  const AllocatorStats& s = r.stats;
  char cached[32] = "-", ns[32] = "-";
  if (!ranOut) {
    std::snprintf(cached, sizeof cached, "%.2f%%", 100.0 * s.fragmentation());
    std::snprintf(ns, sizeof ns, "%.1f", std::max(0.0, r.nsPerCall - harness));
  }
  std::printf("%-10s %12s %12s %8.2f%% %10s %8llu %8llu %8llu %12s %9s\n", r.allocator.c_str(),
              formatMiB(s.peakAllocated).c_str(), formatMiB(s.peakReserved).c_str(),
              100.0 * s.peakFragmentation(), cached, static_cast<unsigned long long>(s.defrags),
              static_cast<unsigned long long>(s.chunksRemapped),
              static_cast<unsigned long long>(s.compactions), formatMiB(s.bytesCopied).c_str(), ns);
}

// Passes every call to the allocator it wraps, counting the allocations: a replay under --limit
// that runs out of memory names the event it stopped at.
class CountingAllocator final : public Allocator {
 public:
  explicit CountingAllocator(std::unique_ptr<Allocator> a) : a_(std::move(a)) {}
  void* allocate(size_t bytes) override {
    ++allocs_;
    return a_->allocate(bytes);
  }
  void deallocate(void* ptr, size_t bytes) override { a_->deallocate(ptr, bytes); }
  std::string name() const override { return a_->name(); }
  size_t allocatedBytes() const override { return a_->allocatedBytes(); }
  size_t reservedBytes() const override { return a_->reservedBytes(); }
  AllocatorStats stats() const override { return a_->stats(); }
  MemorySnapshot snapshot() const override { return a_->snapshot(); }
  void emptyCache() override { a_->emptyCache(); }
  void resetPeaks() override { a_->resetPeaks(); }
  uint64_t allocs() const { return allocs_; }

 private:
  std::unique_ptr<Allocator> a_;
  uint64_t allocs_ = 0;
};

// A replay's allocator of kind k, under `limit` bytes (0: none).
std::unique_ptr<Allocator> replayAllocator(AllocatorKind k, uint64_t limit) {
  if (limit == 0) return makeReplayAllocator(k);
  std::unique_ptr<Allocator> a;
  if (k == AllocatorKind::Caching) {
    CachingAllocatorOptions o;
    o.limit = size_t(limit);
    a = std::make_unique<CachingAllocator>(o);
  } else {
    VmmAllocatorOptions o;
    o.limit = size_t(limit);
    a = std::make_unique<VmmAllocator>(o);
  }
  return std::make_unique<CountingAllocator>(std::move(a));
}

// Where a replay stopped: the event of its n-th allocation (1-based), with its step and bytes.
std::string refusedText(const AllocTrace& t, uint64_t n) {
  uint64_t seen = 0, step = 0;
  bool stepped = false;
  for (size_t i = 0; i < t.events.size(); ++i) {
    const TraceEvent& e = t.events[i];
    if (e.kind == TraceEvent::Step) {
      step = e.id;
      stepped = true;
    }
    if (e.kind != TraceEvent::Alloc || ++seen < n) continue;
    return "out of memory at event " + std::to_string(i) + " of " +
           std::to_string(t.events.size()) +
           (stepped ? " (step " + std::to_string(step) + ")" : std::string()) + ": " +
           formatBytes(e.bytes) + " (" + std::to_string(e.bytes) + " bytes) requested";
  }
  return "out of memory";
}

// The one-line summary of a trace, on `out` (stderr when the trace itself went to stdout).
void describe(const std::string& name, const AllocTrace& t, std::FILE* out = stdout) {
  std::fprintf(out, "trace %s: %zu allocation%s, %zu event%s, %zu step%s\n", name.c_str(),
               t.allocs(), t.allocs() == 1 ? "" : "s", t.events.size(),
               t.events.size() == 1 ? "" : "s", t.steps(), t.steps() == 1 ? "" : "s");
}

// Note [Replay under a limit]: `keel memory replay --limit N` answers "would this run fit in N
// bytes, on which allocator?". Each allocator gets the limit a run's KEEL_MEMORY_LIMIT would give
// it; one that runs out keeps its row (its peaks up to the refusal, "-" for the end and the
// cost) and a line after the table names the event, the step and the bytes refused. Running out
// is the answer asked for, not an error: the exit status is 0.
int runReplay(const std::string& path, const std::string& kind, uint64_t limit) {
  // "-": a text trace on stdin, as `keel memory trace ... -` writes one.
  AllocTrace t = path == "-" ? parseAllocTrace(std::cin, "stdin") : capture::loadAllocTrace(path);
  // As `keel memory stats` says a recording without allocator events is: an error a script sees.
  if (t.allocs() == 0)
    return fail(path + " has no allocations to replay (a trace has lines like 'a ID BYTES')");
  describe(path, t);
  double h = replayHarnessNs(t);
  // The allocators first, then the table: a VMM that cannot reserve its range here (an
  // address-space limit) printed half a table, then the error. With both asked for, the caching
  // allocator's row is printed and the VMM's skipped with a warning; asked for alone, an error.
  std::vector<std::unique_ptr<Allocator>> allocators;
  for (AllocatorKind k : {AllocatorKind::Caching, AllocatorKind::Vmm}) {
    if (kind != "both" && kind != allocatorKindName(k)) continue;
    try {
      allocators.push_back(replayAllocator(k, limit));
    } catch (const Error& e) {
      if (kind != "both") throw;
      warn(std::string("the ") + std::string(allocatorKindName(k)) +
           " allocator is left out: " + e.what());
    }
  }
  printHeader();
  std::vector<std::string> verdicts;  // See Note [Replay under a limit].
  for (auto& a : allocators) {
    if (limit == 0) {
      printRow(replayAllocTrace(t, *a), h);
      continue;
    }
    ReplayResult r;
    bool ranOut = false;
    try {
      r = replayAllocTrace(t, *a);
    } catch (const Error&) {
      ranOut = true;
      r.allocator = a->name();
      r.stats = a->stats();
    }
    printRow(r, h, ranOut);
    const uint64_t n = static_cast<CountingAllocator&>(*a).allocs();
    verdicts.push_back(r.allocator + ": " +
                       (ranOut ? refusedText(t, n)
                               : "fits (peak reserved " + formatBytes(r.stats.peakReserved) + ")"));
  }
  if (limit > 0) {
    std::printf("under a limit of %s (%llu bytes):\n", formatBytes(limit).c_str(),
                static_cast<unsigned long long>(limit));
    for (const std::string& v : verdicts) std::printf("  %s\n", v.c_str());
  }
  std::printf("ns/call: mean allocate/deallocate time, less the replay loop's own %.1f ns\n", h);
  std::printf(
      "frag@peak: 1 - peak allocated / peak reserved; cached@end: reserved - allocated at the end, "
      "of reserved (cached for reuse; keel memory stats' fragmentation is 1 - largest free block "
      "/ cached free)\n");
  return 0;
}

// The first refused request of a recording, in a line: where, how much, how many more.
std::string oomText(const analysis::MemoryModel& m, size_t k) {
  const storage::MemRecord& e = m.event(k);
  std::string where;
  if (const analysis::MemOp* o = e.opSeq ? m.op(e.opSeq) : nullptr)
    where = " by op #" + std::to_string(o->seq) + " " + o->name +
            (o->scope.empty() ? "" : " (" + o->scope + ")");
  else if (e.opSeq)
    where = " by op #" + std::to_string(e.opSeq);
  if (m.hasSteps()) where += " in step " + std::to_string(e.step);
  const size_t more = m.oomEvents().size() - 1;
  return "out of memory at event " + std::to_string(k) + ": " + formatBytes(e.bytes) + " (" +
         std::to_string(e.bytes) + " bytes) requested" + where + " and refused" +
         (e.label.empty() ? std::string() : " (" + e.label + ")") +
         (more ? " (" + countText(more, "more request", "more requests") + " refused after it)"
               : std::string());
}

// What held the memory live after event k, by why it was alive, in a line.
std::string aliveText(const analysis::MemoryModel& m, int64_t k) {
  std::string s = "live at the out of memory:";
  const char* sep = " ";
  for (const analysis::MemAliveShare& a : m.aliveByReason(k)) {
    s += sep + a.what + " " + formatBytes(a.bytes) + " (" + countText(a.blocks, "block", "blocks") +
         ")";
    sep = ", ";
  }
  return s;
}

// The figures of Note [Memory figures] (analysis/src/memory_model.cpp) at the peak of allocated
// memory, at the end, and at any events asked for: one column each, bytes exact.
int runStats(const std::string& path, const std::vector<int64_t>& at) {
  const storage::Recording rec = storage::Recording::open(path);
  const analysis::MemoryModel m = analysis::loadMemoryModel(rec);
  if (m.eventCount() == 0)  // as `keel memory replay` says it: an error a script sees
    return fail(capture::noAllocatorEventsText(rec));
  std::vector<std::pair<std::string, analysis::MemFigures>> cols;
  // "peak allocated": the figures at the peak of allocated memory (peak reserved can come at
  // another event; `keel memory replay` prints both peaks).
  cols.emplace_back("peak allocated", m.figuresAtPeak());
  // A refused request: the figures when it was refused (the run failed there).
  const int64_t oom = m.oomEvents().empty() ? -1 : int64_t(m.oomEvents().front());
  if (oom >= 0) cols.emplace_back("out of memory", m.figuresAt(oom));
  cols.emplace_back("end", m.figuresAt(int64_t(m.eventCount()) - 1));
  std::set<int64_t> asked;  // each event once, in order ("--event 5 --event 5": two columns)
  for (int64_t k : at) {
    if (k < 0 || size_t(k) >= m.eventCount())
      return fail("--event " + std::to_string(k) + " is outside 0.." +
                  std::to_string(m.eventCount() - 1));
    if (asked.insert(k).second) cols.emplace_back("after", m.figuresAt(k));
  }
  // The allocator the run used, as recorded; the events only suggest it (a recording that starts
  // at --step-range's first step has none of the VMM's chunk mappings, made at step 0).
  const storage::RunInfo run = rec.run();
  const std::string kind =
      run.allocator.empty() ? std::string(allocatorKindName(*m.allocatorKind())) : run.allocator;
  std::printf("%s: %zu allocator events, %s allocator\n", path.c_str(), m.eventCount(),
              kind.c_str());
  try {
    const capture::CaptureOptions o = capture::CaptureOptions::fromJson(run.captureOptionsJson);
    // Note [A step range's first step]: what was live then is in the file, labelled (the
    // recordings of older versions, and of the plain host allocator, lack it).
    uint64_t liveBlocks = 0, liveBytes = 0;
    for (const storage::MemRecord& e : m.events()) {
      if (e.label != storage::kLiveBefore) break;
      if (e.kind == MemEventKind::Alloc) ++liveBlocks, liveBytes += e.bytes;
    }
    if (o.filter.stepMin > 0 && m.event(0).label == storage::kLiveBefore)
      std::printf(
          "note: recorded from step %lld (--step-range): the %s (%s) and the memory "
          "the allocator held then open the recording, as its first events\n",
          static_cast<long long>(o.filter.stepMin),
          countText(liveBlocks, "live block", "live blocks").c_str(),
          formatBytes(liveBytes).c_str());
    else if (o.filter.stepMin > 0 && kind == "host")  // nothing to snapshot: totals still hold
      std::printf(
          "note: recorded from step %lld (--step-range): the host allocator keeps no list of its "
          "blocks, so those live before it are not among the recording's events (keel memory "
          "replay replays only what came after); allocated and reserved here are the "
          "allocator's own totals\n",
          static_cast<long long>(o.filter.stepMin));
    else if (o.filter.stepMin > 0)
      std::printf(
          "note: recorded from step %lld (--step-range): what the allocator reserved and freed "
          "before it is not in the recording, so reserved, cached free and free-block figures "
          "count only what came after\n",
          static_cast<long long>(o.filter.stepMin));
  } catch (const std::exception&) {  // options of an import: no step range
  }
  if (oom >= 0) std::printf("%s\n", oomText(m, size_t(oom)).c_str());
  // Columns as wide as their headings ("peak allocated (event 1234567)"), at least 28.
  int width = 28;
  for (const auto& [name, f] : cols)
    width = std::max(width, int((name + " (event " + std::to_string(f.event) + ")").size()));
  auto row = [&](const char* label, auto value) {
    std::printf("%-26s", label);
    for (const auto& [name, f] : cols) std::printf(" %*s", width, value(f).c_str());
    std::printf("\n");
  };
  auto bytes = [](uint64_t b) { return std::to_string(b); };
  auto pct = [](double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * x);
    return std::string(buf);
  };
  std::printf("%-26s", "");
  for (const auto& [name, f] : cols)
    std::printf(" %*s", width, (name + " (event " + std::to_string(f.event) + ")").c_str());
  std::printf("\n");
  using F = analysis::MemFigures;
  row("allocated (bytes)", [&](const F& f) { return bytes(f.allocated); });
  row("reserved (bytes)", [&](const F& f) { return bytes(f.reserved); });
  row("cached free (bytes)", [&](const F& f) { return bytes(f.cachedFree); });
  row("cached free / reserved", [&](const F& f) { return pct(f.cachedShare()); });
  row("largest free block (bytes)", [&](const F& f) { return bytes(f.largestFree); });
  row("free blocks", [&](const F& f) { return bytes(f.freeBlocks); });
  row("fragmentation", [&](const F& f) { return pct(f.fragmentation()); });
  std::printf(
      "cached free = reserved - allocated (held for reuse, not fragmentation); fragmentation = "
      "1 - largest free block / cached free\n");
  if (oom >= 0) std::printf("%s\n", aliveText(m, oom).c_str());
  return 0;
}

int runTrace(const std::string& config, const std::string& out, int steps, uint64_t seed,
             const MoeTraceOptions& moe, bool generate) {
  const bool toStdout = out == "-";
  KEEL_CHECK(generate || !config.empty(),
             "--config is required: the model config to train (or --generate-moe)");
  if (!toStdout) {  // an existing file only where it is a trace (it replaced a recording)
    checkOutputPath("OUT", out, {{"the config", generate ? std::string() : config}});
    checkReplacesOnly("OUT", out, "# keel allocation trace", "an allocation trace");
  }
  if (!generate) {
    prepareEngineRun();  // it trains to trace the allocations
    // The trace is of the allocation requests, whatever serves them: where the VMM allocator
    // cannot run (Note [VMM fallback]), the caching allocator does.
    std::string why;
    setDefaultAllocatorKind(usableAllocatorKind(defaultAllocatorKind(), &why));
    if (!why.empty()) warn(why);
  }
  AllocTrace t =
      generate ? generateMoeTrace(moe) : traceTraining(loadGptConfig(config), steps, seed);
  if (toStdout) {  // the trace on stdout, the summary on stderr
    std::ostringstream text;
    writeAllocTrace(t, text);
    const std::string s = text.str();
    if (const int rc = writeToStdout(s); rc != 0) return rc;
    describe(out, t, stderr);
    return 0;
  }
  {
    ReplaceOnCommit file(out);  // Note [Outputs never destroy inputs]
    std::ofstream f(file.path());
    if (!f) throw Error("cannot write " + out + ": " + std::strerror(errno));
    writeAllocTrace(t, f);
    f.close();
    if (!f)
      throw Error("cannot write " + out + ": " + (errno ? std::strerror(errno) : "write error"));
    file.commit();
  }
  describe(out, t);
  return 0;
}

int runBenchAllocator(const std::string& config, int steps, const MoeTraceOptions& moe) {
  prepareEngineRun();  // it trains to trace the allocations
  {                    // the benchmark is of the VMM allocator: no fallback
    std::string why;
    if (usableAllocatorKind(AllocatorKind::Vmm, &why) != AllocatorKind::Vmm) {
      const std::string fallback = ": using the caching allocator";
      if (why.size() > fallback.size() &&
          why.compare(why.size() - fallback.size(), fallback.size(), fallback) == 0)
        why.resize(why.size() - fallback.size());
      throw Error("bench allocator measures the VMM allocator, which cannot run here: " + why);
    }
  }
  struct Case {
    std::string name;
    AllocTrace trace;
  };
  std::vector<Case> cases;
  cases.push_back({config + " training, " + countText(uint64_t(steps), "step", "steps"),
                   traceTraining(loadGptConfig(config), steps, 1)});
  cases.push_back({"generated MoE (" + std::to_string(moe.experts) + " experts, top-" +
                       std::to_string(moe.topK) + ", skew " +
                       std::to_string(moe.skew).substr(0, 4) + ", " +
                       countText(uint64_t(moe.steps), "step", "steps") + ")",
                   generateMoeTrace(moe)});
  bool ok = true;
  for (auto& c : cases) {
    std::printf("\n");
    describe(c.name, c.trace);
    const AllocatorComparison r = compareAllocators(c.trace);
    printHeader();
    printRow(r.caching, r.harnessNs);
    printRow(r.vmm, r.harnessNs);
    auto met = [](bool m) { return m ? "met" : "NOT MET"; };
    std::printf(
        "vmm fragmentation at peak %.2f%% (goal <= %.0f%%: %s); caching %.2f%% (>= %.0f%%: %s)\n",
        100 * r.vmm.stats.peakFragmentation(), 100 * AllocatorComparison::kVmmPeakFragmentationMax,
        met(r.vmmFragmentationMet()), 100 * r.caching.stats.peakFragmentation(),
        100 * AllocatorComparison::kCachingFragmentationMin, r.cachingFragments() ? "yes" : "no");
    std::printf("vmm peak reserved / caching: %.3f (goal <= %.2f: %s)\n", r.reservedRatio(),
                AllocatorComparison::kReservedRatioMax, met(r.reservedMet()));
    std::printf("vmm cost per call / caching: %.2f (goal <= %.1f: %s)\n", r.costRatio(),
                AllocatorComparison::kCostRatioMax, met(r.costMet()));
    ok = ok && r.goalsMet();
  }
  const double us = vmmRemapUsPerChunk();
  std::printf("\nvmm remap: %.2f us per 2 MiB chunk (goal <= %.0f: %s)\n", us,
              kVmmRemapUsPerChunkMax, us <= kVmmRemapUsPerChunkMax ? "met" : "NOT MET");
  std::printf("%s\n", ok && us <= kVmmRemapUsPerChunkMax ? "all goals met" : "some goals not met");
  return 0;
}

// The generator's options; with `generate` (trace's --generate-moe) each needs it: given alone
// they were ignored without a word.
void addMoeOptions(CLI::App* c, MoeTraceOptions& m, CLI::Option* generate = nullptr) {
  std::vector<CLI::Option*> opts{
      c->add_option("--experts", m.experts, "generated trace: experts per layer")
          ->check(wholeNumber(1, 4096)),
      c->add_option("--top-k", m.topK, "generated trace: experts per token")
          ->check(wholeNumber(1, 64)),
      c->add_option("--layers", m.layers, "generated trace: MoE layers")
          ->check(wholeNumber(1, 256)),
      c->add_option("--tokens", m.tokens, "generated trace: tokens per step")
          ->check(wholeNumber(1, int64_t(1) << 24)),
      c->add_option("--d-model", m.dModel, "generated trace: model width")
          ->check(wholeNumber(1, int64_t(1) << 16)),
      c->add_option("--d-ff", m.dFf, "generated trace: expert hidden width")
          ->check(wholeNumber(1, int64_t(1) << 18)),
      c->add_option("--moe-steps", m.steps, "generated trace: steps")
          ->check(wholeNumber(1, 100000)),
      c->add_option("--skew", m.skew, "generated trace: Zipf exponent of the routing")
          ->check(finiteIn(0, 8)),
      c->add_option("--trace-seed", m.seed, "generated trace: seed")->check(seedNumber())};
  if (generate)
    for (CLI::Option* o : opts) o->needs(generate);
}

}  // namespace

void addAllocOption(CLI::App* c, std::string& kind) {
  c->add_option("--alloc", kind, "allocator for host tensors")
      ->check(CLI::IsMember(
          std::vector<std::string>(kAllocatorKindNames.begin(), kAllocatorKindNames.end())));
}

Command addMemoryCommand(CLI::App& root) {
  CLI::App* c = root.add_subcommand("memory",
                                    "allocation traces (trace: record or generate; replay) and a "
                                    "recording's memory figures (stats)");
  c->require_subcommand(1);
  struct Args {
    std::string trace, allocator = "both", config, out;
    int steps = 5;
    uint64_t seed = 0;   // keel record's and train's: a trace of the run they record
    uint64_t limit = 0;  // replay --limit
    bool generate = false;
    MoeTraceOptions moe;
    std::vector<int64_t> events;
  };
  auto a = std::make_shared<Args>();
  CLI::App* replay = c->add_subcommand(
      "replay",
      "replay a trace (text file or a recording with allocator events) through an "
      "allocator and print peak memory, fragmentation, defragmentation and ns per call");
  replay->add_option("TRACE", a->trace, "trace file or recording (- for stdin)")
      ->required()
      ->check(nonEmptyName());
  replay->add_option("--allocator", a->allocator, "caching, vmm or both")
      ->check(CLI::IsMember({"caching", "vmm", "both"}));
  replay
      ->add_option("--limit", a->limit,
                   "replay under this many bytes (K, M, G: powers of 1024), as KEEL_MEMORY_LIMIT "
                   "limits a run, and say where each allocator runs out")
      ->transform(CLI::AsSizeValue(false))
      ->check(wholeNumber(1));
  CLI::App* trace = c->add_subcommand(
      "trace", "write the allocation trace of a training run (or a generated MoE trace)");
  trace->add_option("OUT", a->out, "output trace file (- for stdout)")->required();
  CLI::Option* config = trace->add_option("--config", a->config, "model config to train");
  CLI::Option* steps = trace->add_option("--steps", a->steps, "training steps")
                           ->check(wholeNumber(1, 100000))
                           ->capture_default_str();
  CLI::Option* seed = trace->add_option("--seed", a->seed, "run seed (keel record's default)")
                          ->check(seedNumber())
                          ->capture_default_str();
  // A trace of a config's training, or a generated one: options of the other were ignored.
  CLI::Option* generate =
      trace->add_flag("--generate-moe", a->generate, "generate a large MoE trace instead")
          ->excludes(config)
          ->excludes(steps)
          ->excludes(seed);
  addMoeOptions(trace, a->moe, generate);
  CLI::App* stats = c->add_subcommand(
      "stats",
      "a recording's memory figures at its peak and end, as Keel Studio's memory view shows "
      "them: allocated, reserved, cached free, largest free block, fragmentation");
  stats->add_option("RECORDING", a->trace, "recording with allocator events")
      ->required()
      ->check(nonEmptyName());
  stats->add_option("--event", a->events, "also the figures right after these events")
      ->check(wholeNumber(0));
  return {c, [a, replay, trace, stats] {
            if (replay->parsed()) return runReplay(a->trace, a->allocator, a->limit);
            if (stats->parsed()) return runStats(a->trace, a->events);
            if (trace->parsed())
              return runTrace(a->config, a->out, a->steps, a->seed, a->moe, a->generate);
            return fail("keel memory: expected replay, trace or stats");
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
  alloc->add_option("--config", a->config, "model config whose training trace is replayed")
      ->capture_default_str();
  alloc->add_option("--steps", a->steps, "training steps traced (seed 1)")
      ->check(wholeNumber(1, 10000))
      ->capture_default_str();
  addMoeOptions(alloc, a->moe);
  return {
      c, [a, alloc] {
        if (!alloc->parsed()) return fail("keel bench: expected allocator");
        // The default config is the source tree's; an installed keel run elsewhere uses the
        // copy installed beside it (<prefix>/share/keel/configs).
        std::string config = a->config;
        std::error_code ec;
        if (alloc->get_option("--config")->count() == 0 && !std::filesystem::exists(config, ec)) {
          const std::filesystem::path installed = (std::filesystem::path(selfPath()).parent_path() /
                                                   "../share/keel/configs/moe-mini.json")
                                                      .lexically_normal();
          if (!std::filesystem::exists(installed, ec))
            return fail("keel bench allocator: no " + config + " here, nor installed at " +
                        installed.string() + ": give --config");
          config = installed.string();
        }
        return runBenchAllocator(config, a->steps, a->moe);
      }};
}

}  // namespace keel::cli
