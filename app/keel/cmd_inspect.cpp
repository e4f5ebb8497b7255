// `keel inspect run.db`: a summary of a recording (of a run folder: keel/analysis/ranks.h) — run
// metadata, steps with their loss, op counts by name and phase, the attention masks of the first
// recorded step (kind, block sparsity, tile map of each flashmask_attention op), records lost to a
// drop policy, and the first NaN/Inf (the earliest op in execution order with a non-finite output)
// with its call stack.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <map>
#include <optional>
#include <string>

#include "cli_common.h"
#include "keel/analysis/ranks.h"
#include "keel/analysis/tile_map.h"
#include "keel/base/output_path.h"
#include "keel/capture/options.h"
#include "keel/storage/diff.h"
#include "keel/storage/export.h"
#include "keel/storage/reader.h"
#include "keel/storage/run_folder.h"

namespace keel::cli {
namespace {

std::string wallClock(int64_t unixNs) {
  std::time_t t = std::time_t(unixNs / 1000000000);
  char buf[64];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// A step range in the --step-range syntax ("2:3", "2:" open-ended); "" for every step.
std::string stepRangeText(const capture::OpFilter& f) {
  if (f.stepMin <= 0 && f.stepMax == std::numeric_limits<int64_t>::max()) return {};
  return std::to_string(f.stepMin) + ":" +
         (f.stepMax == std::numeric_limits<int64_t>::max() ? "" : std::to_string(f.stepMax));
}

// A capture filter in words ("ops matmul,add, scope blocks.1, steps 2:3"); "" for none.
std::string filterText(const capture::OpFilter& f) {
  std::string t;
  auto add = [&](const std::string& s) { t += (t.empty() ? "" : ", ") + s; };
  if (!f.ops.empty()) {
    std::string names;
    for (const std::string& n : f.ops) names += (names.empty() ? "" : ",") + n;
    add("ops " + names);
  }
  if (!f.scope.empty()) add("scope " + f.scope);
  if (const std::string steps = stepRangeText(f); !steps.empty()) add("steps " + steps);
  return t;
}

// What a recording holds and of which ops, in words ("op graph, stacks, MD5, statistics, logs;
// only steps 2:3"); options this keel does not know (an imported or keel_torch recording's)
// print as recorded.
std::string describeCapture(const std::string& json) {
  capture::CaptureOptions o;
  try {
    o = capture::CaptureOptions::fromJson(json);
  } catch (const std::exception&) {
    return json;
  }
  std::string t;
  auto add = [&](const std::string& s) { t += (t.empty() ? "" : ", ") + s; };
  if (o.graph) add("op graph");
  if (o.stacks) add("stacks");
  if (o.md5) add("MD5");
  if (o.roundedMd5 > 0) add("MD5 rounded to " + std::to_string(o.roundedMd5) + " digits");
  if (o.stats) add("statistics");
  if (o.logs) add("logs");
  if (o.allocator) add("allocator events");
  if (o.dumps) {
    const std::string only = filterText(o.dumpFilter);
    add("dumps" + (only.empty() ? std::string() : " (" + only + ")"));
  }
  if (t.empty()) t = "nothing";
  if (const std::string only = filterText(o.filter); !only.empty()) t += "; only " + only;
  if (o.dropPolicy == capture::DropPolicy::Drop) t += "; records dropped when behind (--drop)";
  return t;
}

// One line per flashmask_attention forward op of the first step that has one: its recorded mask
// attributes (docs/flashmask.md, "What a recording shows").
void printAttention(const storage::Recording& rec) {
  storage::OpQuery q;
  q.name = "flashmask_attention";
  q.phase = Phase::Forward;
  q.withTensors = false;
  q.limit = 1;
  auto first = rec.ops(q);
  if (first.empty()) return;
  q.step = first[0].step;
  q.limit = -1;
  std::printf("\nattention  step %lld; tile map of batch 0: s skipped, p partial, f full\n",
              static_cast<long long>(first[0].step));
  for (const auto& op : rec.ops(q)) {
    // The studio's mask tab reads the same summary (keel/analysis/tile_map.h).
    const std::optional<analysis::MaskSummary> m = analysis::maskSummaryFromAttrs(op.attrsJson);
    if (!m) continue;
    std::string map = analysis::tileMapText(m->grid);
    constexpr size_t kShown = 40;
    if (map.size() > kShown) map = map.substr(0, kShown - 3) + "...";
    std::printf("  %-20s %-22s block sparsity %.3f  %s\n",
                op.scope.empty() ? "-" : op.scope.c_str(), m->kind.c_str(),
                std::max(m->blockSparsity, 0.0), map.c_str());
  }
}

int runInspect(const std::string& path) {
  storage::Recording rec = storage::Recording::open(path);
  storage::RunInfo run = rec.run();
  std::printf("recording  %s (schema v%d)\n", path.c_str(), rec.schemaVersion());
  std::printf("run        backend %s, device %s, host %s, seed %llu, allocator %s, keel %s\n",
              run.backend.c_str(), run.device.c_str(), run.host.c_str(),
              static_cast<unsigned long long>(run.seed),
              run.allocator.empty() ? "unknown" : run.allocator.c_str(), run.engineVersion.c_str());
  // "running" with nobody writing the file: the process was killed or crashed mid-run.
  const bool ended = run.status == "running" && !outputLockHeld(path);
  std::printf("started    %s; status %s\n", wallClock(run.startTimeUnixNs).c_str(),
              ended ? "running, but no process is writing it: the run was killed or crashed "
                      "(its committed steps are below)"
                    : run.status.c_str());
  std::printf("capture    %s\n", describeCapture(run.captureOptionsJson).c_str());

  auto steps = rec.steps();
  std::printf("\nsteps      %zu\n", steps.size());
  for (const auto& s : steps) {
    double ms = double(s.endNs - s.beginNs) / 1e6;
    if (s.endNs <= 0)  // begun, never ended: a stopped or failed run
      std::printf("  step %-4lld (incomplete)\n", static_cast<long long>(s.step));
    else if (std::isnan(s.loss))  // Note [Reported NaN]: a NaN loss, or none reported
      std::printf("  step %-4lld loss %s  %.1f ms\n", static_cast<long long>(s.step),
                  s.reported(storage::StepMetric::Loss) ? "NaN" : "not reported", ms);
    else
      std::printf("  step %-4lld loss %.4f  %.1f ms\n", static_cast<long long>(s.step), s.loss, ms);
  }

  auto counts = rec.opCountsByNameAndPhase();
  std::map<std::string, std::map<std::string, int64_t>> byName;
  std::map<std::string, int64_t> byPhase;
  for (const auto& c : counts) {
    const std::string phase(phaseName(c.phase));  // the maps keep the printed order by name
    byName[c.name][phase] += c.count;
    byPhase[phase] += c.count;
  }
  std::printf("\nops        %lld", static_cast<long long>(rec.opCount()));
  for (const auto& [phase, n] : byPhase)
    std::printf("  %s %lld", phase.c_str(), static_cast<long long>(n));
  int width = 24;  // the op column fits the longest name (flashmask_attention_backward: 28)
  for (const auto& [name, phases] : byName) width = std::max(width, int(name.size()));
  std::printf("\n  %-*s %10s %10s %10s\n", width, "op", "forward", "backward", "optimizer");
  for (const auto& [name, phases] : byName) {
    auto get = [&](const char* p) {
      auto it = phases.find(p);
      return static_cast<long long>(it == phases.end() ? 0 : it->second);
    };
    std::printf("  %-*s %10lld %10lld %10lld\n", width, name.c_str(), get("forward"),
                get("backward"), get("optimizer"));
  }

  printAttention(rec);

  // Which kernels ran the ops (schema v7; see Note [Kernel identity]).
  if (auto kernels = rec.kernelUses(); !kernels.empty()) {
    std::printf("\nkernels    %zu (calls, variant, run-time parameters, ops)\n", kernels.size());
    for (const auto& k : kernels) {
      std::string ops;
      for (size_t i = 0; i < k.ops.size() && i < 4; ++i) ops += (i ? ", " : "") + k.ops[i].first;
      if (k.ops.size() > 4) ops += ", +" + std::to_string(k.ops.size() - 4);
      std::printf("  %7lld  %s %s%s  [%s]\n", static_cast<long long>(k.calls),
                  k.kernel.backend.c_str(), k.kernel.variant.c_str(),
                  k.kernel.params.empty() ? "" : (" (" + k.kernel.params + ")").c_str(),
                  ops.c_str());
    }
  }

  for (const auto& d : rec.dropped())
    if (d.count > 0)
      std::printf("\ndropped    %lld %s records (drop policy)\n", static_cast<long long>(d.count),
                  d.kind.c_str());

  auto bad = rec.firstNonFinite();
  if (!bad && !storage::recordedStatistics(run)) {
    // --break-on nan found it without recording statistics: the run stopped right after it.
    if (run.status.find("breakpoint: first NaN/Inf") != std::string::npos)
      std::printf(
          "\nfirst NaN/Inf: the last op recorded, where --break-on nan stopped the run "
          "(see status; recorded without --stats, so no statistics to show)\n");
    else if (storage::recordingFramework(run) == "torch")
      std::printf(
          "\nfirst NaN/Inf: unknown (recorded without statistics: record with "
          "keel_torch.record(..., stats=True) to find it)\n");
    else
      std::printf(
          "\nfirst NaN/Inf: unknown (recorded without --stats: record with --stats, "
          "--all or --break-on nan to find it)\n");
    return 0;
  }
  if (!bad) {
    std::printf("\nfirst NaN/Inf: none (in the recorded statistics)\n");
    return 0;
  }
  std::printf("\nfirst NaN/Inf: op #%llu %s (%s) in step %lld, scope '%s'\n",
              static_cast<unsigned long long>(bad->seq), bad->name.c_str(),
              phaseName(bad->phase).data(), static_cast<long long>(bad->step), bad->scope.c_str());
  for (const auto& t : bad->tensors)
    std::printf("  %s %d: %s %s  nan %lld  inf %lld\n",
                t.role == storage::Role::Input ? "input " : "output", t.index,
                storage::shapeText(t.shape).c_str(), t.dtype.c_str(),
                static_cast<long long>(t.stats.nanCount), static_cast<long long>(t.stats.infCount));
  auto printStack = [&](int64_t stackId, const char* title) {
    auto st = stackId >= 0 ? rec.stack(stackId) : std::nullopt;
    if (!st) return;
    std::printf("  %s:\n", title);
    for (const auto& f : st->frames)
      std::printf("    %s  %s:%d\n", f.function.empty() ? "??" : f.function.c_str(),
                  f.file.empty() ? "??" : f.file.c_str(), f.line);
  };
  printStack(bad->stackId, "stack");
  // A backward op's own stack is the autograd engine's (or loss.backward()): the forward op it
  // differentiates is where the user's code is, as the studio's inspector links it.
  if (bad->forwardSeq != 0) {
    if (auto fwd = rec.op(bad->forwardSeq)) {
      std::printf("  gradient of forward op #%llu %s in step %lld, scope '%s'\n",
                  static_cast<unsigned long long>(fwd->seq), fwd->name.c_str(),
                  static_cast<long long>(fwd->step), fwd->scope.c_str());
      printStack(fwd->stackId, "its stack");
    }
  }
  return 0;
}

}  // namespace

std::string whyNoOps(const storage::RunInfo& run, int64_t step) {
  capture::CaptureOptions o;
  try {
    o = capture::CaptureOptions::fromJson(run.captureOptionsJson);
  } catch (const std::exception&) {
    return {};  // an imported or keel_torch recording's options: nothing to say
  }
  if (!o.graph) return "recorded with --no-graph: it holds no op calls";
  if (step < 0 || o.filter.matchesStep(step)) return {};
  const int64_t nearest = step < o.filter.stepMin ? o.filter.stepMin : o.filter.stepMax;
  return "step " + std::to_string(step) + "'s ops were not recorded (only steps " +
         stepRangeText(o.filter) + "): try --step " + std::to_string(nearest);
}

Command addInspectCommand(CLI::App& root) {
  struct Args {
    std::string path;
    int64_t rank = -1;
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = root.add_subcommand("inspect", "summarise a recording or a multi-rank run folder");
  c->add_option("recording", a->path, "recording file (.db) or run folder")
      ->required()
      ->check(nonEmptyName());
  addRankOption(c, a->rank);
  return {c, [a] {
            // A run folder: every rank in one table, collectives lined up, a hang explained.
            if (storage::isRunFolder(a->path) && a->rank < 0) {
              std::printf("run folder %s\n%s", a->path.c_str(),
                          analysis::runSummaryText(analysis::summarizeRun(a->path)).c_str());
              return 0;
            }
            return runInspect(recordingOfRank(a->path, a->rank));
          }};
}

}  // namespace keel::cli
