// See recording_run.h. Note [Stopping a run from an observer]: a break condition (or a debugger's
// Stop) ends a run from inside an op's onOpEnd by throwing; the exception unwinds the step like
// any engine error. A workload's entry points turn every exception into an error string (Note
// [Workload ABI]), so step() cannot tell a stop from a failure by the exception it gets back:
// the observer records the stop (stopped_) before throwing, and step() checks that first.
#include "keel/capture/recording_run.h"

#include <unistd.h>

#include <chrono>
#include <mutex>

#include "keel/base/text.h"
#include "keel/capture/hash.h"
#include "keel/dtype.h"
#include "keel/error.h"
#include "keel/gpt_config.h"
#include "keel/log.h"
#include "keel/registry.h"
#include "keel/storage/reader.h"
#include "keel/version.h"

namespace keel::capture {

namespace {

// What stopHere throws through the engine (see Note [Stopping a run from an observer]).
struct StopRequest {
  std::string reason;
};

std::string hostName() {
  char host[256] = {0};
  return gethostname(host, sizeof(host) - 1) == 0 ? std::string(host) : std::string();
}

}  // namespace

// ---- BreakSpec / BreakConditions --------------------------------------------------------------

void BreakSpec::add(const std::string& item) {
  auto value = [&](const char* prefix) -> std::optional<std::string> {
    const std::string p = prefix;
    if (item.compare(0, p.size(), p) != 0) return std::nullopt;
    std::string v = item.substr(p.size());
    KEEL_CHECK(!v.empty(), "--break-on '", item, "': expected a value after '", p, "'");
    return v;
  };
  if (item == "nan") {
    nonFinite = true;
  } else if (auto op = value("op:")) {
    KEEL_CHECK(Registry::get().find(*op), "--break-on '", item, "': unknown op '", *op,
               "' (see `keel ops`)");
    opName = *op;
  } else if (auto scope = value("scope:")) {
    this->scope = *scope;
  } else if (auto ref = value("md5-ref:")) {
    referencePath = *ref;
  } else {
    throw Error("--break-on '" + item +
                "': expected nan, op:NAME, scope:SCOPE or md5-ref:RECORDING.db");
  }
}

BreakConditions::BreakConditions() = default;
BreakConditions::BreakConditions(BreakSpec spec) {
  setSpec(std::move(spec));
}
BreakConditions::~BreakConditions() = default;
BreakConditions::BreakConditions(BreakConditions&&) noexcept = default;
BreakConditions& BreakConditions::operator=(BreakConditions&&) noexcept = default;

void BreakConditions::setSpec(BreakSpec spec) {
  if (spec.referencePath.empty()) {
    reference_.reset();
  } else if (!reference_ || spec.referencePath != spec_.referencePath) {
    auto ref = std::make_unique<storage::Recording>(
        storage::Recording::open(spec.referencePath, /*verify=*/false));
    storage::OpQuery q;
    q.limit = 1;
    q.withTensors = false;
    auto first = ref->ops(q);
    referenceBase_ = first.empty() ? 1 : first[0].seq;
    reference_ = std::move(ref);
    referenceHit_ = false;
  }
  spec_ = std::move(spec);
}

std::string BreakConditions::check(const OpEvent& e, int64_t step) {
  if (liveBase_ == 0) liveBase_ = e.seq;
  if (step > 0 && !spec_.opName.empty() && e.op->name == spec_.opName)
    return "breakpoint: op " + e.op->name;
  if (step > 0 && !spec_.scope.empty() && scopeWithin(e.scope, spec_.scope))
    return "breakpoint: scope " + spec_.scope;
  if (spec_.nonFinite && !nonFiniteHit_)
    if (std::string r = nonFiniteReason(e); !r.empty()) return r;
  if (reference_ && !referenceHit_)
    if (std::string r = referenceReason(e); !r.empty()) return r;
  return {};
}

std::string BreakConditions::nonFiniteReason(const OpEvent& e) {
  for (size_t i = 0; i < e.outputs.size(); ++i) {
    const Tensor& t = e.outputs[i];
    if (!t.defined() || !t.device().isHost() || !isFloating(t.dtype())) continue;
    const storage::TensorStats st = tensorStats(t);
    if (st.nanCount > 0 || st.infCount > 0) {
      nonFiniteHit_ = true;
      return "breakpoint: first NaN/Inf (output " + std::to_string(i) + " of " + e.op->name + ": " +
             std::to_string(st.nanCount) + " NaN, " + std::to_string(st.infCount) + " Inf)";
    }
  }
  return {};
}

std::string BreakConditions::referenceReason(const OpEvent& e) {
  const uint64_t refSeq = e.seq - liveBase_ + referenceBase_;
  std::optional<storage::OpRecord> ref = reference_->op(refSeq);
  if (!ref) {
    referenceHit_ = true;
    return "breakpoint: op #" + std::to_string(e.seq) + " (" + e.op->name +
           ") is not in the reference recording";
  }
  if (ref->name != e.op->name) {
    referenceHit_ = true;
    return "breakpoint: op #" + std::to_string(e.seq) + " is " + e.op->name + " here but " +
           ref->name + " in the reference";
  }
  for (const auto& rt : ref->tensors) {
    if (rt.role != storage::Role::Output || rt.md5.empty()) continue;
    if (rt.index < 0 || size_t(rt.index) >= e.outputs.size()) continue;
    const Tensor& t = e.outputs[size_t(rt.index)];
    if (!t.defined() || !t.device().isHost()) continue;
    const std::string live = tensorMd5(t);
    if (live != rt.md5) {
      referenceHit_ = true;
      return "breakpoint: first MD5 difference from the reference: output " +
             std::to_string(rt.index) + " of " + e.op->name + " (reference " + rt.md5.substr(0, 8) +
             ", live " + live.substr(0, 8) + ")";
    }
  }
  return {};
}

// ---- RecordingRun -----------------------------------------------------------------------------

// Runs after the recorder's observer (observers run in the order they were added), so an op is
// captured before the run stops or pauses on it.
class RecordingRun::Observer : public keel::Observer {
 public:
  explicit Observer(RecordingRun* run) : run_(run) {}
  void onStep(const StepEvent& e) override {
    if (e.begin) run_->step_ = e.step;
  }
  void onOpError(const OpEvent& e, std::string_view) override { run_->failedSeq_ = e.seq; }
  void onOpEnd(const OpEvent& e) override { run_->afterOp(e); }

 private:
  RecordingRun* run_;
};

RecordingRun::RecordingRun(RunSpec spec, AfterOp afterOp)
    : spec_(std::move(spec)), afterOp_(std::move(afterOp)), device_("cpu") {
  KEEL_CHECK(spec_.steps >= 1, "steps: expected a positive number, got ", spec_.steps);
  const bool builtIn = spec_.workloadPath.empty();
  KEEL_CHECK(!builtIn || !spec_.configPath.empty(),
             "--config is required (a model config, or a workload's config with --workload)");
  if (!spec_.configPath.empty()) configText_ = readFile(spec_.configPath, "config file");
  workload_ = builtIn ? gptWorkload() : loadWorkload(spec_.workloadPath);
  std::string configAllocator;
  if (builtIn) {  // validated before anything is created
    const GptConfig cfg = parseGptConfig(configText_, spec_.configPath);
    name_ = cfg.name;
    configAllocator = cfg.allocator;
  } else {
    name_ = workload_.name;
  }
  device_ = Device(spec_.backend);
  KEEL_CHECK(device_.isHost(), "backend '", spec_.backend,
             "' is not available (expected cpu or cpu-ref)");
  // The allocator: the explicit choice, else the config's, else KEEL_ALLOCATOR (never what an
  // earlier run in this process installed).
  allocator_ = resolveAllocatorKind(spec_.allocator, configAllocator);
  trackMemory_ = spec_.trackMemoryPerStep;
  breaks_.setSpec(spec_.breaks);

  run_.backend = std::string(backendName(device_.backend));
  run_.device = device_.name();
  run_.host = hostName();
  run_.configJson = configText_.empty() ? "{}" : configText_;
  run_.seed = spec_.seed;
  run_.engineVersion = KEEL_VERSION_STRING;
  run_.allocator = std::string(allocatorKindName(allocator_));
}

RecordingRun::~RecordingRun() {
  if (recorder_ && !finished_) fail("abandoned");
}

void RecordingRun::start() {
  KEEL_CHECK(!recorder_, "RecordingRun::start: already started");
  setDefaultAllocatorKind(allocator_);
  run_.startTimeUnixNs = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  // The recorder starts before the model is built so initialisation (step 0) is recorded too.
  recorder_ = std::make_unique<Recorder>(spec_.output, run_, spec_.capture);
  obs_ = std::make_shared<Observer>(this);
  addObserver(obs_);
  WorkloadParams params;
  params.configJson = configText_;
  params.configPath = spec_.configPath;
  params.dataPath = spec_.dataPath;
  params.device = device_;
  params.seed = spec_.seed;
  params.totalSteps = spec_.steps;
  try {
    job_ = std::make_unique<WorkloadRun>(workload_, params);
  } catch (const std::exception& e) {
    if (stopped_) {  // stopped while initialising (see Note [Stopping a run from an observer])
      finish();
      throw *stopped_;
    }
    fail(e.what());
    throw;
  }
}

void RecordingRun::setBreaks(BreakSpec b) {
  std::lock_guard<std::mutex> lk(breaksMu_);
  pendingBreaks_ = std::move(b);
  breaksChanged_ = true;
}

void RecordingRun::afterOp(const OpEvent& e) {
  if (breaksChanged_.exchange(false)) {
    std::optional<BreakSpec> b;
    {
      std::lock_guard<std::mutex> lk(breaksMu_);
      b = std::move(pendingBreaks_);
      pendingBreaks_.reset();
    }
    if (b) breaks_.setSpec(std::move(*b));  // a bad reference path throws: the run fails
  }
  std::string reason = breaks_.check(e, step_);
  try {
    if (afterOp_)
      afterOp_(e, reason);
    else if (!reason.empty())
      stopHere(reason);
  } catch (const StopRequest& s) {
    stopped_.emplace(s.reason, e.seq, step_);
    throw;
  }
}

void RecordingRun::stopHere(const std::string& reason) {
  throw StopRequest{reason};
}

WorkloadMetrics RecordingRun::step() {
  KEEL_CHECK(job_, "RecordingRun::step: not started");
  if (stopped_) throw *stopped_;
  std::optional<MemoryTrackingScope> track;
  if (trackMemory_) track.emplace("step " + std::to_string(job_->steps() + 1));
  lastTrack_.reset();
  try {
    WorkloadMetrics m = job_->step();
    if (track) lastTrack_ = track->end();  // the section ends with the step
    return m;
  } catch (...) {
    // See Note [Stopping a run from an observer].
    if (stopped_) throw *stopped_;
    throw;
  }
}

void RecordingRun::teardown() {
  if (obs_) removeObserver(obs_);
  obs_.reset();
  job_.reset();
}

bool RecordingRun::finish() {
  if (!recorder_ || finished_) return recorder_ && !recorder_->failed();
  finished_ = true;
  if (obs_) removeObserver(obs_);
  // Finished while the model is alive: the recording ends with the run's state, not with the
  // frees of tearing the model down.
  if (stopped_)
    recorder_->finishStopped(stopped_->what());
  else
    recorder_->finish();
  teardown();
  return !recorder_->failed();
}

void RecordingRun::fail(const std::string& reason) {
  if (!recorder_ || finished_) return;
  finished_ = true;
  if (obs_) removeObserver(obs_);
  recorder_->finishFailed(reason);
  teardown();
}

}  // namespace keel::capture
