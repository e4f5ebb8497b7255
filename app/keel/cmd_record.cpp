// `keel record`: trains like `keel train` while a capture Recorder writes everything the engine
// does into one recording file (see docs/capture.md and docs/recording.md).
// Invariant: a failed recording (unwritable path, disk full) is reported as one error line with
// exit status 2; what was committed before the failure stays readable. A --break-on condition
// stops the run (exit 1) keeping everything. The sequence itself is capture::RecordingRun's.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "cli_common.h"
#include "keel/allocator.h"
#include "keel/base/text.h"
#include "keel/capture/recording_run.h"
#include "keel/data.h"
#include "keel/dispatch.h"
#include "keel/dist.h"
#include "keel/error.h"
#include "keel/log.h"
#include "keel/registry.h"
#include "keel/train.h"
#include "keel/workload.h"

namespace keel::cli {
namespace {

struct RecordArgs {
  std::string config, backend = "cpu", data, output;
  std::string workload;  // a workload library; empty: the built-in gpt workload
  int64_t steps = 5;
  uint64_t seed = 0;
  int threads = 0;
  bool all = false, stacks = false, md5 = false, stats = false, dumps = false, allocator = false;
  bool noLogs = false, noGraph = false, drop = false, trackMemory = false, hashInline = false;
  int64_t hashBacklogMiB = 64;
  std::string alloc;
  int roundedMd5 = 0;
  std::string ops, scope, stepRange, dumpOps, dumpScope, dumpSteps, onError = "stop", verbose;
  std::vector<std::string> breakOn;
  ParallelArgs parallel;  // --dp, --tp (keel/dist.h): -o is then a run folder
};

std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// "A:B", "A:" or "A" (inclusive) into filter bounds.
// "'<what>' lies past the run's N steps (--steps)": a range or stop that could never be reached.
std::string pastTheRun(const std::string& what, int64_t steps) {
  return what + " lies past the run's " + std::to_string(steps) + " step" +
         (steps == 1 ? "" : "s") + " (--steps)";
}

// `steps`: the run's; a range wholly past it would record (or dump) nothing without a word.
void parseStepRange(const std::string& s, capture::OpFilter& f, const char* what, int64_t steps) {
  if (s.empty()) return;
  auto colon = s.find(':');
  try {
    size_t used = 0;
    std::string lo = s.substr(0, colon), hi = colon == std::string::npos ? lo : s.substr(colon + 1);
    if (!lo.empty()) {
      f.stepMin = std::stoll(lo, &used);
      if (used != lo.size()) throw std::invalid_argument(lo);
    }
    if (!hi.empty()) {
      f.stepMax = std::stoll(hi, &used);
      if (used != hi.size()) throw std::invalid_argument(hi);
    }
  } catch (const std::exception&) {
    throw Error(std::string(what) + ": bad step range '" + s + "' (expected A:B, A: or A)");
  }
  if (f.stepMin > f.stepMax) throw Error(std::string(what) + ": empty step range '" + s + "'");
  if (f.stepMin > steps) throw Error(pastTheRun(std::string(what) + " '" + s + "'", steps));
}

std::vector<std::string> checkedOps(const std::string& list, const char* what) {
  auto names = splitList(list);
  for (const auto& n : names)
    if (!Registry::get().find(n))
      throw Error(std::string(what) + ": unknown op '" + n + "' (see `keel ops`)");
  return names;
}

capture::CaptureOptions captureOptions(const RecordArgs& a) {
  capture::CaptureOptions o;
  o.graph = !a.noGraph;
  o.stacks = a.stacks || a.all;
  o.md5 = a.md5 || a.all;
  o.stats = a.stats || a.all;
  // Tracking memory per step records the allocator's events too: without them the sections had
  // nothing under them, and keel memory stats called the recording one without allocator events.
  o.allocator = a.allocator || a.all || a.trackMemory;
  o.roundedMd5 = a.roundedMd5;
  o.logs = !a.noLogs;
  // Choosing what to dump asks for dumps (it was ignored without --dumps).
  o.dumps = a.dumps || !a.dumpOps.empty() || !a.dumpScope.empty() || !a.dumpSteps.empty();
  o.filter.ops = checkedOps(a.ops, "--ops");
  o.filter.scope = a.scope;
  parseStepRange(a.stepRange, o.filter, "--step-range", a.steps);
  o.dumpFilter.ops = checkedOps(a.dumpOps, "--dump-ops");
  o.dumpFilter.scope = a.dumpScope;
  parseStepRange(a.dumpSteps, o.dumpFilter, "--dump-steps", a.steps);
  o.dropPolicy = a.drop ? capture::DropPolicy::Drop : capture::DropPolicy::Block;
  o.hashThread = !a.hashInline;
  o.hashBacklogBytes = a.hashBacklogMiB << 20;
  if (a.onError == "stop")
    o.onError = capture::ErrorPolicy::Stop;
  else if (a.onError == "throw")
    o.onError = capture::ErrorPolicy::Throw;
  else
    throw Error("--on-error: expected stop or throw, got '" + a.onError + "'");
  return o;
}

// Ctrl-C (SIGINT) or SIGTERM (Note [Interrupts], cli_common.h): the run stops after the op
// running now, like a break condition, and the recording is finished and put in place ("stopped:
// interrupted (SIGINT)") instead of a hidden replacement file and a stale lock left behind. A
// second signal ends a process alone at once. A rank of a multi-rank run stops only between
// steps (stopping mid-step would leave its peers waiting in a collective) and ignores a second
// signal (the launcher's, which would cut its recording short). The launcher forwards the signal
// to every rank at once and the ranks move in lockstep, so they stop at the same step boundary
// unless the signal lands just as one rank enters the next step; that rank then waits in its
// first collective until the launcher ends it, its recording keeping every step it finished.
// (Agreeing through a collective after every step would make every step of every run pay for
// it, and hang where a peer is gone.)
int runRecord(const RecordArgs& a) {
  prepareEngineRun();
  startProcessGroup(a.parallel);
  // Rank 0 speaks for a multi-rank run; the others print only their errors and, on the job's
  // stdout, where they stopped (a --break-on condition one rank hit).
  FILE* stopOut = stdout;
  if (dist::worldRank() != 0) {
    const int fd = ::dup(STDOUT_FILENO);
    stopOut = fd >= 0 ? ::fdopen(fd, "w") : nullptr;
    std::freopen("/dev/null", "w", stdout);
  }
  checkConfigFound(a.config);
  capture::RunSpec spec;
  spec.configPath = a.config;
  spec.workloadPath = a.workload;
  spec.backend = a.backend;
  spec.dataPath = a.data;
  spec.seed = a.seed;
  spec.steps = a.steps;
  spec.allocator = a.alloc;
  spec.output = a.output;
  spec.capture = captureOptions(a);
  spec.trackMemoryPerStep = a.trackMemory;
  for (const std::string& b : a.breakOn) spec.breaks.add(b);
  for (const capture::BreakCondition& c : spec.breaks.conditions)  // it would never stop the run
    if (c.kind == capture::BreakCondition::Kind::Step && c.value > double(a.steps))
      return fail(pastTheRun("--break-on step:" + std::to_string(int64_t(c.value)), a.steps));
  // Everything is validated (config, workload, backend, allocator, reference) before the
  // recording is created.
  const bool alone = dist::worldSize() == 1;
  capture::RecordingRun run(spec, [alone](const OpEvent&, const std::string& breakReason) {
    if (!breakReason.empty()) capture::RecordingRun::stopHere(breakReason);
    if (alone)
      if (const std::string why = interruptReason(); !why.empty())
        capture::RecordingRun::stopHere(why);
  });
  catchInterrupts(alone);
  if (!run.allocatorWarning().empty()) warn(run.allocatorWarning());
  if (!run.referenceWarning().empty()) warn(run.referenceWarning());
  if (!a.verbose.empty()) setGlobalVerboseRules(parseVerboseRules(a.verbose));
  useCpuThreads(a.threads);
  std::optional<capture::RunStopped> stopped;
  // --track-memory's section of each step, that of a step that stopped or failed too (it is the
  // one a user looks for), printed once.
  bool trackPrinted = false;
  auto printTrack = [&] {
    if (trackPrinted || !run.lastTrack()) return;
    trackPrinted = true;
    std::printf("%s\n", formatTrackSummary(*run.lastTrack(), 3).c_str());
    std::fflush(stdout);
  };
  try {
    run.start();  // a break condition can hit while the model is built (step 0): a stop, kept
    std::printf("keel record: %s on %s, %lld step%s -> %s\n", run.modelName().c_str(),
                run.device().name().c_str(), static_cast<long long>(a.steps),
                a.steps == 1 ? "" : "s", a.output.c_str());
    while (!run.done()) {
      trackPrinted = false;
      WorkloadMetrics s = run.step();
      std::printf("step %lld/%lld  loss %.4f", static_cast<long long>(run.stepsDone()),
                  static_cast<long long>(a.steps), unsignedNaN(s.loss));
      if (std::isfinite(s.tokensPerSec)) std::printf("  %.0f tok/s", s.tokensPerSec);
      std::printf("\n");
      printTrack();
      std::fflush(stdout);
      // The recording failed (a full disk, a size limit): training on would record nothing.
      if (const std::string err = run.recorder().error(); !err.empty())
        throw Error("recording failed: " + err);
      // A step-level break condition, or a signal between ops: stop here, between steps.
      std::string why = run.stepBreak();
      const uint64_t seq = why.empty() ? 0 : lastOpSeq();  // a step condition: the step's last op
      if (why.empty()) why = interruptReason();
      if (!why.empty()) {
        run.markStopped(why);
        throw capture::RunStopped(why, seq, run.stepsDone());
      }
    }
  } catch (const capture::RunStopped& s) {
    stopped = s;  // a break condition: everything so far is kept
    printTrack();
  } catch (const std::exception& e) {
    // The run failed (a workload error, an op that threw): keep what was recorded, mark it failed.
    printTrack();
    run.fail(e.what());
    throw;
  }
  if (!run.finish()) return fail("recording failed: " + run.recorder().error());
  auto c = run.recorder().counts();
  // Every step's loss is recorded; with --step-range its ops only inside the range.
  const capture::OpFilter& f = run.recorder().options().filter;
  std::string range;
  if (f.stepMin > 0 || f.stepMax < c.steps)
    range = " (ops of steps " + std::to_string(f.stepMin) + " to " +
            std::to_string(std::min<int64_t>(f.stepMax, c.steps)) + ": --step-range)";
  auto n = [](int64_t v, const char* one, const char* many) {
    return countText(uint64_t(v), one, many);
  };
  std::printf("recorded %s%s, %s, %s, %s, %s, %s", n(c.steps, "step", "steps").c_str(),
              range.c_str(), n(c.ops, "op", "ops").c_str(), n(c.stacks, "stack", "stacks").c_str(),
              n(c.logs, "log line", "log lines").c_str(),
              n(c.mems, "memory event", "memory events").c_str(),
              n(c.dumps, "dump", "dumps").c_str());
  int64_t dropped = c.droppedOps + c.droppedLogs + c.droppedMems + c.droppedDumps;
  if (dropped > 0)
    std::printf(" (%lld records dropped by the drop policy)", static_cast<long long>(dropped));
  if (c.droppedHashes > 0)
    std::printf(" (%lld tensors without checksums: the hashing backlog was full)",
                static_cast<long long>(c.droppedHashes));
  std::printf("\n");
  // A filter that matched nothing (a mistyped scope) left a recording without ops: say so.
  if (c.ops == 0 && !a.noGraph && (!a.scope.empty() || !a.ops.empty()) && !stopped)
    warn(std::string(!a.scope.empty() ? "--scope '" + a.scope + "'" : "--ops '" + a.ops + "'") +
         " matched no op the run called: the recording holds no op calls");
  if (c.hashedTensors > 0)
    std::printf(
        "hashed %lld tensors, %s (%lld on the run's own thread, %lld by the writer, %lld copied "
        "before an in-place write; at most %s waiting)\n",
        static_cast<long long>(c.hashedTensors), formatBytes(uint64_t(c.hashedBytes)).c_str(),
        static_cast<long long>(c.hashedByEngine), static_cast<long long>(c.hashedByWriter),
        static_cast<long long>(c.copiedBeforeWrite),
        formatBytes(uint64_t(c.peakHashBacklogBytes)).c_str());
  if (stopped) {
    // One line saying where, on stdout after the counts (a CI job greps it), and exit 1; a rank
    // of a multi-rank run names itself ("keel record: rank 1 stopped at ...").
    const std::string who =
        dist::worldSize() > 1 ? "rank " + std::to_string(dist::worldRank()) + " " : "";
    if (stopOut && stopped->seq == 0)  // between steps
      std::fprintf(stopOut, "keel record: %sstopped after step %lld: %s\n", who.c_str(),
                   static_cast<long long>(stopped->step), stopped->what());
    else if (stopOut)
      std::fprintf(stopOut, "keel record: %sstopped at op #%llu (step %lld): %s\n", who.c_str(),
                   static_cast<unsigned long long>(stopped->seq),
                   static_cast<long long>(stopped->step), stopped->what());
    if (stopOut) std::fflush(stopOut);
    std::fflush(stdout);
    return interruptSignal() != 0 ? 128 + interruptSignal() : 1;
  }
  return 0;
}

}  // namespace

Command addRecordCommand(CLI::App& root) {
  auto a = std::make_shared<RecordArgs>();
  CLI::App* c = root.add_subcommand("record", "train and record everything the engine does");
  c->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  c->add_option("--config,--workload-config", a->config,
                "model + training config (JSON); with --workload, the workload's config");
  c->add_option("--workload", a->workload,
                "a workload library (KEEL_WORKLOAD, see docs/api.md); default: the built-in gpt");
  c->add_option("-o,--output", a->output, "recording file to write (SQLite)")->required();
  c->add_option("--backend", a->backend, "cpu | cpu-ref | cuda[:N]")->capture_default_str();
  c->add_option("--steps", a->steps, "training steps")
      ->check(wholeNumber(1, kMaxSteps))
      ->capture_default_str();
  c->add_option("--seed", a->seed, "random seed")->check(seedNumber())->capture_default_str();
  c->add_option("--data", a->data, "text file or directory (default: the Debian licenses)")
      ->check(nonEmptyName());
  c->add_option("--threads", a->threads,
                "Keel's cpu threads (default: all cores; OpenBLAS's: OPENBLAS_NUM_THREADS)")
      ->check(wholeNumber(1));
  c->add_flag("--all", a->all, "stacks, md5, stats and allocator events");
  c->add_flag("--stacks", a->stacks, "native call stack of every op");
  c->add_flag("--md5", a->md5, "MD5 of every tensor an op reads or writes");
  c->add_option("--rounded-md5", a->roundedMd5, "also hash values rounded to N significant digits")
      ->check(wholeNumber(1, 17));
  c->add_flag("--stats", a->stats, "min/max/mean/std/abs-max and NaN/Inf/zero counts");
  c->add_flag("--allocator", a->allocator, "allocator events");
  addAllocOption(c, a->alloc);
  c->add_flag("--track-memory", a->trackMemory,
              "track memory per step: sections in the recording, with the allocator's events, "
              "and a summary per step");
  c->add_flag("--no-logs", a->noLogs, "do not record log lines");
  c->add_flag("--no-graph", a->noGraph, "do not record op calls");
  c->add_option("--ops", a->ops, "record only these ops (comma-separated names)")
      ->check(nonEmptyValue());
  c->add_option("--scope", a->scope, "record only ops under this module scope (e.g. blocks.1)")
      ->check(nonEmptyValue());
  c->add_option("--step-range", a->stepRange, "record only these steps (A:B, inclusive)")
      ->check(nonEmptyValue());
  c->add_flag("--dumps", a->dumps, "store output values (zstd) of the ops chosen below");
  c->add_option("--dump-ops", a->dumpOps, "dump only these ops (comma-separated; implies --dumps)")
      ->check(nonEmptyValue());
  c->add_option("--dump-scope", a->dumpScope, "dump only ops under this scope (implies --dumps)")
      ->check(nonEmptyValue());
  c->add_option("--dump-steps", a->dumpSteps, "dump only in these steps (A:B; implies --dumps)")
      ->check(nonEmptyValue());
  c->add_flag(
      "--drop", a->drop,
      "when the queue (or the hashing backlog) is full drop records, or tensors' checksums, "
      "counted, instead of waiting");
  c->add_option("--hash-backlog", a->hashBacklogMiB,
                "MiB of tensors waiting to be hashed beyond which the run waits (or drops)")
      ->check(wholeNumber(1, int64_t(1) << 20))
      ->capture_default_str();
  c->add_flag("--hash-inline", a->hashInline,
              "hash tensors inside each op (one at a time, on the engine's thread) instead of on "
              "the hashing thread");
  c->add_option("--on-error", a->onError, "writer failure: stop recording | throw (stop the run)")
      ->capture_default_str();
  c->add_option("--break-on", a->breakOn,
                "stop after the op that meets a condition: nan (first NaN/Inf output), op:NAME, "
                "scope:SCOPE, md5-ref:REF.db (first output MD5 differing from REF); or at the end "
                "of a step: step:N, grad-norm>X, loss>K*mean (K times the earlier steps' mean); "
                "@N after any: the Nth hit. Keeps everything recorded, prints where it stopped "
                "and exits 1 (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  addParallelOptions(c, a->parallel);
  c->add_option("--verbose", a->verbose,
                "verbose engine logs only in these scopes, e.g. blocks.1.attn,blocks.0:backward");
  return {c, [a] { return runRecord(*a); }};
}

}  // namespace keel::cli
