// RecordingRun: the one record-a-run sequence, shared by `keel record` and the studio's live
// sessions: read and validate the config once → choose the allocator → build the run's metadata
// → start the recorder → build the workload (initialisation recorded as step 0) → run steps →
// finish (before the model is torn down) or fail. BreakConditions stop or pause a run after the op
// that meets one (op name, scope, first NaN/Inf, first MD5 differing from a reference recording)
// or at the end of a step that meets one (step N, gradient norm above x, loss above k × its mean).
// Invariant: the constructor validates everything and touches no file; start() creates the output.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "keel/allocator.h"
#include "keel/capture/options.h"
#include "keel/capture/recorder.h"
#include "keel/device.h"
#include "keel/gpt_config.h"
#include "keel/observer.h"
#include "keel/storage/records.h"
#include "keel/workload.h"

namespace keel::storage {
class Recording;
}

namespace keel {
class OutputLock;  // keel/base/output_path.h
}

namespace keel::capture {

// ---- break conditions -------------------------------------------------------------------------

// One breakpoint. Op-level kinds are checked after each op, step-level kinds at each step's end
// (from the step's metrics). `hitCount` N > 1: stop only at the Nth time the condition holds (and
// for op/scope, every Nth time after); 0 or 1: every time (NaN/Inf and MD5: the first time).
struct BreakCondition {
  enum class Kind {
    Op,         // after every call of op `text` (in exactly scope `scope` when set)
    Scope,      // after every op in module scope `text` or below
    NonFinite,  // after the first op with a NaN or Inf in a floating output
    Md5Ref,     // at the first op whose output MD5 differs from recording `text`
    Step,       // at the end of step `value`
    GradNorm,   // at the end of a step whose gradient norm is above `value`
    LossSpike,  // at the end of a step whose loss is above `value` × the mean of the earlier ones
  };
  Kind kind = Kind::NonFinite;
  std::string text;
  std::string scope;  // Op: only calls in this scope ("op:matmul in blocks.0.mlp.w2"; "" any)
  double value = 0;
  int64_t hitCount = 0;
  bool enabled = true;
  bool stepLevel() const {
    return kind == Kind::Step || kind == Kind::GradNorm || kind == Kind::LossSpike;
  }
  // The `--break-on` item it parses from ("nan", "op:matmul", "op:matmul in blocks.0.attn.qkv",
  // "step:3", "grad-norm>10",
  // "loss>2*mean", "md5-ref:ref.db"), with "@N" for a hit count ("op:matmul@3").
  std::string item() const;
  // Parses one `--break-on` item; throws keel::Error naming it when it is none of the kinds (or
  // names an unknown op, or a value is not a positive number).
  static BreakCondition parse(const std::string& item);
  bool operator==(const BreakCondition&) const = default;
};

// Where a run should stop: a list of conditions; the first enabled one that holds wins.
struct BreakSpec {
  std::vector<BreakCondition> conditions;
  bool any() const {
    for (const auto& c : conditions)
      if (c.enabled) return true;
    return false;
  }
  // Appends BreakCondition::parse(item).
  void add(const std::string& item) { conditions.push_back(BreakCondition::parse(item)); }
  bool operator==(const BreakSpec&) const = default;
};

// Evaluates a BreakSpec op by op (and step by step) on the engine thread. NaN/Inf and the
// reference each hit once (the first time); op and scope hit every time. Ops are matched with the
// reference by position in the run (the first op seen pairs with the reference's first op:
// sequence numbers are per process, and a studio may have run sessions before). A condition keeps
// its hit count and once-only state across setSpec while it stays in the list unchanged.
class BreakConditions {
 public:
  BreakConditions();
  // Opens the reference recording if the spec names one (throws keel::Error / StorageError).
  explicit BreakConditions(BreakSpec spec);
  ~BreakConditions();
  BreakConditions(BreakConditions&&) noexcept;
  BreakConditions& operator=(BreakConditions&&) noexcept;

  // Replaces the spec; keeps each unchanged condition's state (an open reference included), and
  // opens the references of new ones.
  void setSpec(BreakSpec spec);
  const BreakSpec& spec() const { return spec_; }
  // The seed each md5-ref reference was recorded with, by reference path.
  std::vector<std::pair<std::string, uint64_t>> referenceSeeds() const;
  // Why to stop after this op of `step` ("breakpoint: op matmul", ...), or "" to go on. Call it
  // for every op in order (the reference pairing counts ops). Op and scope conditions hold from
  // step 1: initialisation (step 0) ops carry their parameters' scopes (Note [Initialisation
  // scopes]), and `scope:blocks.1` means the layer's training ops, not its weights' creation.
  std::string check(const OpEvent& e, int64_t step);
  // Why to stop at the end of training step `step` with these metrics, or "". Call it once per
  // step, in order (the loss mean is of the steps before).
  std::string checkStep(int64_t step, const WorkloadMetrics& m);

 private:
  struct State;
  std::string hit(State& s, std::string reason);  // counts a hit, "" until the Nth
  std::string nonFiniteReason(const OpEvent& e);
  std::string referenceReason(State& s, const OpEvent& e);

  BreakSpec spec_;
  std::vector<std::unique_ptr<State>> states_;  // one per condition of spec_
  uint64_t liveBase_ = 0;                       // this run's first op seq (0: none seen yet)
  double lossSum_ = 0;                          // finite losses of the steps checked so far
  int64_t lossCount_ = 0;
  bool lossSeen_ = false, gradNormSeen_ = false;  // the workload reported a number for them
};

// ---- the run ----------------------------------------------------------------------------------

// The longest run a user may ask for, in steps (`keel record/train --steps`, the studio's
// --steps): beyond it a step counter's arithmetic and a recording's size stop making sense.
inline constexpr int64_t kMaxRunSteps = 1000000000;

// What a user asks for: `keel record`'s options and the studio's "New session…" dialog alike.
struct RunSpec {
  std::string configPath;    // the model config, or a workload's config ("" none: its defaults)
  std::string workloadPath;  // a workload library (docs/api.md); "" the built-in gpt trainer
  std::string backend = "cpu";
  std::string dataPath;  // the built-in trainer's corpus ("" the default)
  uint64_t seed = 0;
  int64_t steps = 5;      // length of the run (and of the LR schedule)
  std::string allocator;  // "host" | "caching" | "vmm"; "" the config's, else KEEL_ALLOCATOR
  std::string output;     // the recording file
  // An existing output is replaced in place (the studio: its views read the file while it is
  // written); else it is kept until the new recording is complete (Note [Outputs never destroy
  // inputs], keel/base/output_path.h).
  bool replaceInPlace = false;
  CaptureOptions capture;
  bool trackMemoryPerStep = false;  // each step in a MemoryTrackingScope("step N")
  BreakSpec breaks;
};

// The run stopped at a break condition (or by request); what was recorded is kept.
struct RunStopped : std::runtime_error {
  RunStopped(const std::string& reason, uint64_t seq, int64_t step)
      : std::runtime_error(reason), seq(seq), step(step) {}
  uint64_t seq;  // the op after which the run stopped (0: between ops)
  int64_t step;  // the step it was in
};

class RecordingRun {
 public:
  // Called on the engine thread after every op the recorder has seen, with the break reason (""
  // none). It may block (a debugger pausing) or throw RecordingRun::stopHere(...) to end the run.
  // Without one, a break reason stops the run (step() throws RunStopped).
  using AfterOp = std::function<void(const OpEvent& e, const std::string& breakReason)>;

  // Reads the config once and validates everything: the output path (not an input, not a device
  // or FIFO), the config (the built-in trainer's schema), the workload library, the backend, the
  // allocator, the break conditions (a reference recording is opened). Touches no output. Throws
  // keel::Error naming the problem.
  explicit RecordingRun(RunSpec spec, AfterOp afterOp = {});
  // An unfinished run is finished as failed ("abandoned"); never throws.
  ~RecordingRun();
  RecordingRun(const RecordingRun&) = delete;
  RecordingRun& operator=(const RecordingRun&) = delete;

  const RunSpec& spec() const { return spec_; }
  const std::string& modelName() const { return name_; }         // config's or workload's name
  const std::string& configText() const { return configText_; }  // "" without a config
  // The allocator the run uses: the one asked for, or caching where the VMM allocator cannot be
  // created (Note [VMM fallback]; allocatorWarning() then says why, in one line).
  AllocatorKind allocator() const { return allocator_; }
  const std::string& allocatorWarning() const { return allocatorWarning_; }
  // Set where an md5-ref reference was recorded with another seed than this run's: their MD5s
  // differ from the first random op on (one line; the run still starts).
  const std::string& referenceWarning() const { return referenceWarning_; }
  const Device& device() const { return device_; }
  // The run's metadata as recorded (start time set by start()).
  const storage::RunInfo& runInfo() const { return run_; }

  // Installs the allocator, creates the recording and builds the workload (its initialisation
  // is recorded as step 0). Throws (keel::Error, storage::StorageError, RunStopped when stopped
  // during initialisation) with the recording finished and nothing left running. An existing
  // output is replaced only by finish() or fail() after a successful start: a run whose setup
  // fails (a bad data path) leaves it as it was.
  void start();
  // Runs one training step and returns its metrics. Throws RunStopped when a break condition
  // (or AfterOp) stopped it, else what the workload threw (the op's keel::Error). A step-level
  // condition met at the step's end throws RunStopped too without AfterOp; with one, step()
  // returns and stepBreak() says why (a debugger pauses between steps).
  WorkloadMetrics step();
  const std::string& stepBreak() const { return stepBreak_; }
  int64_t stepsDone() const { return job_ ? job_->steps() : 0; }
  // The step running now (engine thread; 0 during initialisation).
  int64_t currentStep() const { return step_; }
  bool done() const { return stepsDone() >= spec_.steps; }
  // The summary of the last step's memory tracking section (trackMemoryPerStep), if any.
  const std::optional<MemoryTrackSummary>& lastTrack() const { return lastTrack_; }
  void setTrackMemoryPerStep(bool on) { trackMemory_ = on; }  // any thread
  bool trackMemoryPerStep() const { return trackMemory_; }
  // Replaces the break conditions; takes effect at the next op (any thread).
  void setBreaks(BreakSpec b);
  uint64_t failedSeq() const { return failedSeq_; }  // the op that threw, or 0
  // Marks a run ended early between ops (a debugger's Stop while paused between steps): finish()
  // then records "stopped: <reason>".
  void markStopped(const std::string& reason) {
    if (!stopped_) stopped_.emplace(reason, 0, step_);
  }

  // Ends the recording with status "finished" ("stopped: <reason>" after RunStopped) while the
  // model is alive, then tears the model down. Returns false when the recording itself failed
  // (recorder().error() says why).
  bool finish();
  // Ends the recording with status "failed: <reason>", then tears the model down.
  void fail(const std::string& reason);
  Recorder& recorder() { return *recorder_; }
  bool started() const { return recorder_ != nullptr; }

  // Thrown from AfterOp to end the run after this op; step() turns it into RunStopped.
  [[noreturn]] static void stopHere(const std::string& reason);

 private:
  class Observer;
  friend class Observer;
  void afterOp(const OpEvent& e);
  void applyPendingBreaks();  // engine thread: takes what setBreaks left
  void teardown();
  void commitOutput();      // a replacement written beside the output: renamed over it
  void writeRunManifest();  // rank 0: the run folder's manifest.json (see start())
  void discardOutput();     // a replacement whose run never started: removed

  std::string runDir_;  // a multi-rank run's folder (spec_.output is this rank's file in it)
  // Rank 0 into a folder that had a manifest: it writes its own once its rank file is committed
  // (commitOutput), so a run killed before leaves the old folder as it was.
  bool manifestPending_ = false;
  int hangHandler_ = 0;    // dist::addHangHandler's id (0: none)
  std::string writePath_;  // where the recording is written: the output, or a replacement
  std::unique_ptr<OutputLock> outputLock_;  // held from start() to finish()/fail()
  bool setupFailed_ = false;

  RunSpec spec_;
  AfterOp afterOp_;
  std::string configText_, name_;
  // The built-in trainer's config, parsed once here and handed to its workload (Note [Built-in
  // config parsed once] in engine/src/workload/gpt_workload.cpp); empty with --workload.
  std::optional<GptConfig> gptConfig_;
  WorkloadInfo workload_;
  Device device_;
  AllocatorKind allocator_ = AllocatorKind::Host;
  std::string allocatorWarning_;
  std::string referenceWarning_;
  storage::RunInfo run_;
  std::unique_ptr<Recorder> recorder_;
  std::unique_ptr<WorkloadRun> job_;
  std::shared_ptr<Observer> obs_;
  std::atomic<bool> trackMemory_{false};
  std::optional<MemoryTrackSummary> lastTrack_;
  // Engine thread: the break conditions, replaced by setBreaks under mu_ (pending_).
  BreakConditions breaks_;
  std::mutex breaksMu_;
  std::optional<BreakSpec> pendingBreaks_;
  std::atomic<bool> breaksChanged_{false};
  int64_t step_ = 0;
  std::string stepBreak_;
  uint64_t failedSeq_ = 0;
  std::optional<RunStopped> stopped_;  // set on the engine thread when the run was stopped
  bool finished_ = false;
};

}  // namespace keel::capture
