// See recording_run.h. Note [Stopping a run from an observer]: a break condition (or a debugger's
// Stop) ends a run from inside an op's onOpEnd by throwing; the exception unwinds the step like
// any engine error. A workload's entry points turn every exception into an error string (Note
// [Workload ABI]), so step() cannot tell a stop from a failure by the exception it gets back:
// the observer records the stop (stopped_) before throwing, and step() checks that first.
#include "keel/capture/recording_run.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <mutex>

#include "keel/base/number_words.h"
#include "keel/base/output_path.h"
#include "keel/base/text.h"
#include "keel/capture/hash.h"
#include "keel/data.h"
#include "keel/dispatch.h"
#include "keel/dist.h"
#include "keel/dtype.h"
#include "keel/error.h"
#include "keel/gpt_config.h"
#include "keel/log.h"
#include "keel/registry.h"
#include "keel/storage/reader.h"
#include "keel/storage/run_folder.h"

namespace keel::capture {

namespace {

// What stopHere throws through the engine (see Note [Stopping a run from an observer]).
struct StopRequest {
  std::string reason;
};

}  // namespace

// ---- BreakSpec / BreakConditions --------------------------------------------------------------

namespace {
std::string number(double v) {
  if (std::isnan(v)) return "NaN";  // not "-nan": the sign of a NaN means nothing
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
}  // namespace

std::string BreakCondition::item() const {
  std::string s;
  switch (kind) {
    case Kind::Op:
      s = "op:" + text + (scope.empty() ? "" : " in " + scope);
      break;
    case Kind::Scope:
      s = "scope:" + text;
      break;
    case Kind::NonFinite:
      s = "nan";
      break;
    case Kind::Md5Ref:
      s = "md5-ref:" + text;
      break;
    case Kind::Step:
      s = "step:" + std::to_string(int64_t(value));
      break;
    case Kind::GradNorm:
      s = "grad-norm>" + number(value);
      break;
    case Kind::LossSpike:
      s = "loss>" + number(value) + "*mean";
      break;
  }
  if (hitCount > 1) s += "@" + std::to_string(hitCount);
  return s;
}

BreakCondition BreakCondition::parse(const std::string& itemText) {
  const char* const kExpected =
      "': expected nan, op:NAME, scope:SCOPE, md5-ref:RECORDING.db, step:N, grad-norm>X or "
      "loss>K*mean, optionally followed by @N (stop at the Nth hit)";
  BreakCondition c;
  std::string item = itemText;
  // "@N": the hit count (only when all digits follow the last '@': a path may hold one).
  if (size_t at = item.rfind('@');
      at != std::string::npos && at + 1 < item.size() &&
      item.find_first_not_of("0123456789", at + 1) == std::string::npos) {
    c.hitCount = std::stoll(item.substr(at + 1));
    KEEL_CHECK(c.hitCount >= 1, "--break-on '", itemText, "': the hit count must be at least 1");
    item.resize(at);
  }
  auto value = [&](const char* prefix) -> std::optional<std::string> {
    const std::string p = prefix;
    if (item.compare(0, p.size(), p) != 0) return std::nullopt;
    std::string v = item.substr(p.size());
    KEEL_CHECK(!v.empty(), "--break-on '", itemText, "': expected a value after '", p, "'");
    return v;
  };
  auto positive = [&](const std::string& v) {
    const std::optional<double> d = parseFiniteNumber(v);
    KEEL_CHECK(d && *d > 0, "--break-on '", itemText, "': '", v, "' is not a positive number");
    return *d;
  };
  if (item == "nan") {
    c.kind = Kind::NonFinite;
  } else if (auto op = value("op:")) {
    if (size_t in = op->find(" in "); in != std::string::npos) {  // "op:NAME in SCOPE"
      c.scope = op->substr(in + 4);
      op->resize(in);
      KEEL_CHECK(!c.scope.empty(), "--break-on '", itemText, "': expected a scope after ' in '");
    }
    KEEL_CHECK(Registry::get().find(*op), "--break-on '", itemText, "': unknown op '", *op,
               "' (see `keel ops`)");
    c.kind = Kind::Op;
    c.text = *op;
  } else if (auto scope = value("scope:")) {
    c.kind = Kind::Scope;
    c.text = *scope;
  } else if (auto ref = value("md5-ref:")) {
    c.kind = Kind::Md5Ref;
    c.text = *ref;
  } else if (auto st = value("step:")) {
    c.kind = Kind::Step;
    c.value = positive(*st);
    KEEL_CHECK(c.value == std::floor(c.value), "--break-on '", itemText,
               "': the step must be a whole number");
  } else if (auto g = value("grad-norm>")) {
    c.kind = Kind::GradNorm;
    c.value = positive(*g);
  } else if (auto l = value("loss>")) {
    const std::string suffix = "*mean";
    KEEL_CHECK(l->size() > suffix.size() &&
                   l->compare(l->size() - suffix.size(), suffix.size(), suffix) == 0,
               "--break-on '", itemText, "': expected loss>K*mean");
    c.kind = Kind::LossSpike;
    c.value = positive(l->substr(0, l->size() - suffix.size()));
  } else {
    throw Error("--break-on '" + itemText + kExpected);
  }
  return c;
}

// What one condition has seen: its hits, whether a once-only kind already hit, its reference.
struct BreakConditions::State {
  BreakCondition cond;
  int64_t hits = 0;
  bool done = false;
  std::unique_ptr<storage::Recording> reference;
  uint64_t referenceBase = 1;  // the reference's first op seq
  uint64_t referenceSeed = 0;
};

BreakConditions::BreakConditions() = default;
BreakConditions::BreakConditions(BreakSpec spec) {
  setSpec(std::move(spec));
}
BreakConditions::~BreakConditions() = default;
BreakConditions::BreakConditions(BreakConditions&&) noexcept = default;
BreakConditions& BreakConditions::operator=(BreakConditions&&) noexcept = default;

void BreakConditions::setSpec(BreakSpec spec) {
  auto same = [](const BreakCondition& a, const BreakCondition& b) {
    return a.kind == b.kind && a.text == b.text && a.scope == b.scope && a.value == b.value &&
           a.hitCount == b.hitCount;
  };
  std::vector<std::unique_ptr<State>> states;
  for (const BreakCondition& c : spec.conditions) {
    std::unique_ptr<State> st;
    for (auto& old : states_)
      if (old && same(old->cond, c)) {
        st = std::move(old);
        break;
      }
    if (!st) {
      st = std::make_unique<State>();
      if (c.kind == BreakCondition::Kind::Md5Ref) {
        st->reference = std::make_unique<storage::Recording>(
            storage::Recording::open(c.text, /*verify=*/false));
        const storage::RunInfo info = st->reference->run();
        st->referenceSeed = info.seed;
        bool hasMd5 = true;  // options this build cannot read: the pairing finds out
        try {
          hasMd5 = CaptureOptions::fromJson(info.captureOptionsJson).md5;
        } catch (const Error&) {
        }
        // Without MD5s in the reference nothing can differ from it: the run would never stop.
        KEEL_CHECK(hasMd5, "--break-on md5-ref:", c.text,
                   ": the reference holds no MD5s (record it with --md5 or --all)");
        storage::OpQuery q;
        q.limit = 1;
        q.withTensors = false;
        auto first = st->reference->ops(q);
        st->referenceBase = first.empty() ? 1 : first[0].seq;
      }
    }
    st->cond = c;
    states.push_back(std::move(st));
  }
  states_ = std::move(states);
  spec_ = std::move(spec);
}

std::vector<std::pair<std::string, uint64_t>> BreakConditions::referenceSeeds() const {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (const auto& st : states_)
    if (st->reference) out.emplace_back(st->cond.text, st->referenceSeed);
  return out;
}

std::string BreakConditions::hit(State& s, std::string reason) {
  // `@N` pauses at the Nth hit only, as documented (a studio session paused at hits 3, 6, 9);
  // without one, at every hit.
  const int64_t nth = std::max<int64_t>(1, s.cond.hitCount);
  ++s.hits;
  if (nth > 1 ? s.hits != nth : false) return {};
  if (nth > 1) {  // "first NaN/Inf" is not what the third hit is
    const std::string first = "breakpoint: first ";
    if (reason.rfind(first, 0) == 0) reason.erase(12, 6);
    reason += " (hit " + std::to_string(s.hits) + ")";
  }
  return reason;
}

std::string BreakConditions::check(const OpEvent& e, int64_t step) {
  using Kind = BreakCondition::Kind;
  if (liveBase_ == 0) liveBase_ = e.seq;
  std::string out;
  for (auto& sp : states_) {
    State& s = *sp;
    const BreakCondition& c = s.cond;
    if (!c.enabled || c.stepLevel() || s.done) continue;
    std::string r;
    if (c.kind == Kind::Op && step > 0 && e.op->name == c.text &&
        (c.scope.empty() || e.scope == c.scope)) {
      r = hit(s, "breakpoint: op " + c.text + (c.scope.empty() ? "" : " in " + c.scope));
    } else if (c.kind == Kind::Scope && step > 0 && scopeWithin(e.scope, c.text)) {
      r = hit(s, "breakpoint: scope " + c.text);
    } else if (c.kind == Kind::NonFinite) {
      if (std::string why = nonFiniteReason(e); !why.empty()) r = hit(s, why);
      s.done = !r.empty();
    } else if (c.kind == Kind::Md5Ref) {
      if (std::string why = referenceReason(s, e); !why.empty()) r = hit(s, why);
      s.done = !r.empty();
    }
    if (out.empty()) out = std::move(r);
  }
  return out;
}

std::string BreakConditions::checkStep(int64_t step, const WorkloadMetrics& m) {
  using Kind = BreakCondition::Kind;
  std::string out;
  const double mean = lossCount_ > 0 ? lossSum_ / double(lossCount_) : 0;
  for (auto& sp : states_) {
    State& s = *sp;
    const BreakCondition& c = s.cond;
    if (!c.enabled || !c.stepLevel()) continue;
    std::string r;
    if (c.kind == Kind::Step && double(step) == c.value) {
      r = hit(s, "breakpoint: step " + std::to_string(step));
    } else if (c.kind == Kind::GradNorm && std::isnan(m.gradNorm) &&
               (m.reportsAll || gradNormSeen_)) {
      // NaN is past any bound: a guard against blow-ups must stop on it (NaN from a workload
      // that never reports a norm means "not reported").
      r = hit(s, "breakpoint: gradient norm NaN (bound " + number(c.value) + ") at step " +
                     std::to_string(step));
    } else if (c.kind == Kind::GradNorm && m.gradNorm > c.value) {  // +Inf included
      r = hit(s, "breakpoint: gradient norm " + number(m.gradNorm) + " > " + number(c.value) +
                     " at step " + std::to_string(step));
    } else if (c.kind == Kind::LossSpike && !std::isfinite(m.loss) &&
               (std::isinf(m.loss) || m.reportsAll || lossSeen_)) {
      r = hit(s, "breakpoint: loss " + number(m.loss) + " (not finite) at step " +
                     std::to_string(step));
    } else if (c.kind == Kind::LossSpike && lossCount_ > 0 && m.loss > c.value * mean) {
      r = hit(s, "breakpoint: loss " + number(m.loss) + " > " + number(c.value) + " × mean " +
                     number(mean) + " at step " + std::to_string(step));
    }
    if (out.empty()) out = std::move(r);
  }
  if (std::isfinite(m.loss)) {
    lossSum_ += m.loss;
    ++lossCount_;
  }
  lossSeen_ = lossSeen_ || !std::isnan(m.loss);
  gradNormSeen_ = gradNormSeen_ || !std::isnan(m.gradNorm);
  return out;
}

// Stops where NaN/Inf values appear, by the recordings' rule (Note [Where non-finite values
// appear]): any NaN; an infinity unless the op is a masking fill or took one from its inputs.
std::string BreakConditions::nonFiniteReason(const OpEvent& e) {
  std::string infinity;  // the report of the first output holding an infinity (and no NaN)
  // What the op wrote: its outputs, or for an optimizer-style op the inputs it writes in place
  // (adamw_step's parameter and moments: the recording counts them as its outputs too).
  std::vector<std::pair<const Tensor*, std::string>> written;
  for (size_t i = 0; i < e.outputs.size(); ++i)
    written.push_back({&e.outputs[i], "output " + std::to_string(i)});
  for (size_t i = 0; i < e.inputs.size(); ++i)
    if (e.op->writesInput(i))
      written.push_back({&e.inputs[i], "input " + std::to_string(i) + " (written)"});
  for (const auto& [t, what] : written) {
    if (!t->defined() || !isFloating(t->dtype())) continue;
    const storage::TensorStats st = tensorStats(hostCopy(*t));
    if (st.nanCount > 0 || (st.infCount > 0 && infinity.empty())) {
      std::string why = "breakpoint: first NaN/Inf (" + what + " of " + e.op->name + ": " +
                        std::to_string(st.nanCount) + " NaN, " + std::to_string(st.infCount) +
                        " Inf)";
      if (st.nanCount > 0) return why;
      infinity = std::move(why);
    }
  }
  if (infinity.empty() || storage::isMaskingFill(e.op->name)) return {};
  for (size_t i = 0; i < e.inputs.size(); ++i) {
    const Tensor& in = e.inputs[i];
    if (!e.op->writesInput(i) && in.defined() && isFloating(in.dtype()) &&
        tensorStats(hostCopy(in)).infCount > 0)
      return {};  // carried in
  }
  return infinity;
}

std::string BreakConditions::referenceReason(State& st, const OpEvent& e) {
  const uint64_t refSeq = e.seq - liveBase_ + st.referenceBase;
  std::optional<storage::OpRecord> ref = st.reference->op(refSeq);
  if (!ref) {  // past its end, as a rule: the run goes on longer than the reference did
    const auto steps = st.reference->steps();
    return "breakpoint: the reference recording ends before op #" + std::to_string(e.seq) + " (" +
           e.op->name + "): it holds " + std::to_string(st.reference->opCount()) + " ops" +
           (steps.empty() ? std::string()
                          : ", to the end of step " + std::to_string(steps.back().step)) +
           " (record a longer reference to compare further)";
  }
  if (ref->name != e.op->name) {
    return "breakpoint: op #" + std::to_string(e.seq) + " is " + e.op->name + " here but " +
           ref->name + " in the reference";
  }
  for (const auto& rt : ref->tensors) {
    if (rt.role != storage::Role::Output || rt.md5.empty()) continue;
    if (rt.index < 0 || size_t(rt.index) >= e.outputs.size()) continue;
    const Tensor& t = e.outputs[size_t(rt.index)];
    if (!t.defined()) continue;
    const std::string live = tensorMd5(hostCopy(t));
    if (live != rt.md5) {
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
  KEEL_CHECK(spec_.steps >= 1 && spec_.steps <= kMaxRunSteps,
             "steps: ", notAWholeNumberIn(1, kMaxRunSteps, std::to_string(spec_.steps)));
  if (dist::worldSize() > 1) {
    // A multi-rank run records into a run folder, each rank its own file (Note [Run folders]).
    std::error_code ec;
    KEEL_CHECK(!std::filesystem::exists(spec_.output, ec) ||
                   std::filesystem::is_directory(spec_.output, ec),
               spec_.output, ": a multi-rank run records into a folder (one file per rank), and ",
               "this is a file");
    runDir_ = spec_.output;
    spec_.output =
        (std::filesystem::path(runDir_) / storage::rankFileName(dist::worldRank())).string();
  }
  {  // Note [Outputs never destroy inputs]
    std::vector<NamedInput> inputs{{"the config", spec_.configPath},
                                   {"the workload library", spec_.workloadPath},
                                   {"the training data", spec_.dataPath}};
    if (spec_.dataPath.empty() && spec_.workloadPath.empty())
      inputs.push_back({"the default training data", data::kDefaultCorpusDir});
    for (const BreakCondition& c : spec_.breaks.conditions)
      if (c.kind == BreakCondition::Kind::Md5Ref)
        inputs.push_back({"the reference recording", c.text});
    checkOutputPath("output", spec_.output, inputs);
    checkReplacesOnlyARecording("output", spec_.output);
    checkWritable(spec_.output);                    // a read-only recording is not replaced
    spec_.output = followOutputLink(spec_.output);  // a symlink's file is written, not the link
  }
  const bool builtIn = spec_.workloadPath.empty();
  KEEL_CHECK(!builtIn || !spec_.configPath.empty(),
             "--config is required (a model config, or a workload's config with --workload)");
  if (!spec_.configPath.empty())
    configText_ = readFile(spec_.configPath, "config file", kMaxConfigBytes);
  workload_ = builtIn ? gptWorkload() : loadWorkload(spec_.workloadPath);
  std::string configAllocator;
  if (builtIn) {  // validated before anything is created; parsed once (the workload gets it too)
    gptConfig_ = parseGptConfig(configText_, spec_.configPath);
    name_ = gptConfig_->name;
    configAllocator = gptConfig_->allocator;
  } else {
    name_ = workload_.name;
  }
  device_ = trainingDevice(spec_.backend);
  // The allocator: the explicit choice, else the config's, else KEEL_ALLOCATOR (never what an
  // earlier run in this process installed).
  allocator_ = usableAllocatorKind(resolveAllocatorKind(spec_.allocator, configAllocator),
                                   &allocatorWarning_);  // Note [VMM fallback]
  trackMemory_ = spec_.trackMemoryPerStep;
  breaks_.setSpec(spec_.breaks);
  for (const auto& [path, seed] : breaks_.referenceSeeds())
    if (seed != spec_.seed && referenceWarning_.empty())
      referenceWarning_ = path + " was recorded with seed " + std::to_string(seed) +
                          " and this run uses seed " + std::to_string(spec_.seed) +
                          ": their MD5s differ from the first random op (--seed " +
                          std::to_string(seed) + " to follow it)";

  run_.backend = std::string(backendName(device_.backend));
  run_.device = device_.name();
  run_.configJson = configText_.empty() ? "{}" : configText_;
  run_.seed = spec_.seed;
  run_.allocator = std::string(allocatorKindName(allocator_));
  const dist::Layout layout = dist::layout();
  run_.rank = dist::worldRank();
  run_.worldSize = dist::worldSize();
  if (run_.worldSize > 1)
    run_.layout =
        storage::layoutText(layout.dp, layout.tp, layout.ep, layout.cp, layout.zero, layout.vocab);
}

RecordingRun::~RecordingRun() {
  if (recorder_ && !finished_) fail("abandoned");
  if (hangHandler_) dist::removeHangHandler(hangHandler_);
}

void RecordingRun::start() {
  KEEL_CHECK(!recorder_, "RecordingRun::start: already started");
  setDefaultAllocatorKind(allocator_);
  // The start time, host and keel version: the Recorder's (a RunInfo leaves them to it).
  // The recorder starts before the model is built so initialisation (step 0) is recorded too.
  // One writer per output (Note [Outputs never destroy inputs]); the lock is taken before the
  // output is looked at, so two runs cannot both decide to replace it.
  if (!runDir_.empty()) {  // every rank makes the folder; rank 0 writes the manifest (below)
    std::error_code ec;
    std::filesystem::create_directories(runDir_, ec);
    KEEL_CHECK(!ec, runDir_, ": cannot create the run folder (", ec.message(), ")");
  }
  outputLock_ = std::make_unique<OutputLock>(spec_.output);
  if (!runDir_.empty() && dist::worldRank() == 0) {
    if (storage::isRunFolder(runDir_))
      manifestPending_ = true;  // written with this rank's file (commitOutput)
    else
      writeRunManifest();  // a new folder: readable even if setup fails
  }
  writePath_ = !spec_.replaceInPlace && fileIdentity(spec_.output) ? replacementPath(spec_.output)
                                                                   : spec_.output;
  recorder_ = std::make_unique<Recorder>(writePath_, run_, spec_.capture);
  // A rank stuck in a collective (Note [Collective timeouts]): the report goes into the recording,
  // which ends as failed, before the watchdog ends the process. Only into the recording: the
  // watchdog prints the report's first line, once per rank (the ring, up to 64 lines a rank,
  // buried it; KEEL_LOG_LEVEL does not bring it back: keel inspect RANK.db shows it).
  hangHandler_ = dist::addHangHandler([this](const std::string& report) {
    std::string first = report.substr(0, report.find('\n'));
    size_t at = 0;
    while (at < report.size()) {
      const size_t end = std::min(report.find('\n', at), report.size());
      logWithoutEcho(LogLevel::Error, "collectives", report.substr(at, end - at));
      at = end + 1;
    }
    recorder_->flush();
    recorder_->finishFailed("hang: " + first);
  });
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
    // The built-in trainer takes the config parsed above: Note [Built-in config parsed once].
    job_ = gptConfig_ ? gptWorkloadRun(*gptConfig_, params)
                      : std::make_unique<WorkloadRun>(workload_, params);
  } catch (const std::exception& e) {
    if (stopped_) {  // stopped while initialising (see Note [Stopping a run from an observer])
      finish();
      throw *stopped_;
    }
    setupFailed_ = true;  // fail() keeps an existing output as it was
    fail(e.what());
    throw;
  }
}

// Rank 0's manifest of the run folder. A new folder gets it before setup, once this rank holds
// its output, so that a new run whose setup fails or hangs can still be inspected. An existing
// folder's manifest is replaced only once this rank's file is (commitOutput): a run whose setup
// fails, or that is killed mid-run (its files still hidden replacements), leaves the old
// manifest beside the old rank files — rewritten at setup, the old rank files read as the new
// layout and the folder opened no more.
void RecordingRun::writeRunManifest() {
  const dist::Layout l = dist::layout();
  storage::RunManifest m = storage::makeManifest(l.dp, l.tp);
  m.zero = l.zero;
  m.vocab = l.vocab;
  m.ep = l.ep;
  m.cp = l.cp;
  m.model = name_;
  m.seed = spec_.seed;
  m.steps = spec_.steps;
  storage::writeManifest(runDir_, m);
}

void RecordingRun::commitOutput() {
  if (writePath_ != spec_.output) {
    // The old file's WAL companions belong to it: SQLite would apply a stale WAL to the new file.
    for (const char* suffix : {"-wal", "-shm", "-journal"})
      std::remove((spec_.output + suffix).c_str());
    renameOver(writePath_, spec_.output);
    writePath_ = spec_.output;
  }
  if (manifestPending_) {  // See writeRunManifest
    manifestPending_ = false;
    writeRunManifest();
  }
}

void RecordingRun::discardOutput() {
  if (writePath_ == spec_.output) return;
  for (const char* suffix : {"", "-wal", "-shm", "-journal"})
    std::remove((writePath_ + suffix).c_str());
  writePath_ = spec_.output;
}

void RecordingRun::setBreaks(BreakSpec b) {
  std::lock_guard<std::mutex> lk(breaksMu_);
  pendingBreaks_ = std::move(b);
  breaksChanged_ = true;
}

void RecordingRun::applyPendingBreaks() {
  if (!breaksChanged_.exchange(false)) return;
  std::optional<BreakSpec> b;
  {
    std::lock_guard<std::mutex> lk(breaksMu_);
    b = std::move(pendingBreaks_);
    pendingBreaks_.reset();
  }
  if (b) breaks_.setSpec(std::move(*b));  // a bad reference path throws: the run fails
}

void RecordingRun::afterOp(const OpEvent& e) {
  applyPendingBreaks();
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
  // The section's begin is the step's (it was tagged the step before, and at a --step-range's
  // first step the paused recorder dropped it, losing that step's section).
  if (recorder_) recorder_->beforeStep(job_->steps() + 1);
  if (trackMemory_) track.emplace("step " + std::to_string(job_->steps() + 1));
  lastTrack_.reset();
  try {
    WorkloadMetrics m = job_->step();
    if (track) lastTrack_ = track->end();  // the section ends with the step
    applyPendingBreaks();
    stepBreak_ = breaks_.checkStep(job_->steps(), m);
    if (!stepBreak_.empty() && !afterOp_) {
      stopped_.emplace(stepBreak_, lastOpSeq(), job_->steps());
      throw *stopped_;
    }
    return m;
  } catch (const RunStopped&) {
    if (track) lastTrack_ = track->end();  // a stopped or failed step's section is the one asked
    throw;
  } catch (...) {
    if (track) lastTrack_ = track->end();
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
  commitOutput();
  outputLock_.reset();
  return !recorder_->failed();
}

void RecordingRun::fail(const std::string& reason) {
  if (!recorder_ || finished_) return;
  finished_ = true;
  if (obs_) removeObserver(obs_);
  recorder_->finishFailed(reason);
  teardown();
  if (setupFailed_) {
    discardOutput();
  } else {
    try {
      commitOutput();  // a run that failed in a step: its recording is what the user asked for
    } catch (const std::exception&) {
      discardOutput();  // never throws (the destructor calls fail); the old file is kept
    }
  }
  outputLock_.reset();
}

}  // namespace keel::capture
