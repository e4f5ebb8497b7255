// Session: see session.h. The worker thread owns the Recorder, the workload run (the built-in
// trainer or a workload library, keel/workload.h) and a BreakObserver
// that runs on the engine thread after the recorder (observers run in the order they were added),
// so an op is captured before the run pauses on it. See Note [Session pause].
#include "session.h"

#include <unistd.h>

#include <chrono>
#include <exception>
#include <fstream>
#include <iterator>
#include <optional>

#include "keel/allocator.h"
#include "keel/capture/hash.h"
#include "keel/capture/recorder.h"
#include "keel/data.h"
#include "keel/error.h"
#include "keel/gpt_config.h"
#include "keel/observer.h"
#include "keel/registry.h"
#include "keel/storage/reader.h"
#include "keel/train.h"
#include "keel/workload.h"

namespace keel::studio {

// Note [Session pause]: a pause (breakpoint, Pause button) happens on the engine thread inside
// the observer's onOpEnd: it flushes the recorder (so the views can read the op that hit), reports
// pausedAt, and waits on the session's condition variable. Run / Step resume it; Stop makes it
// throw SessionStopped, which unwinds the step like any engine error (the recording keeps what was
// committed). The GUI thread only flips the state under the mutex and notifies. A workload's
// entry points turn every exception into an error (Note [Workload ABI]), so SessionStopped comes
// back from a step as a keel::Error: stopThrown_ says it was a stop, not a failure.
struct SessionStopped {};

class Session::Worker : public Observer {
 public:
  explicit Worker(Session* s) : s_(s) {}

  void main() {
    std::string failure;
    uint64_t failedSeq = 0;
    bool stopped = false, done = false;
    try {
      setup();
      emit s_->started(s_->config_.output);
      bool stopNow = false;
      {
        std::lock_guard<std::mutex> lk(s_->mu_);
        stopNow = s_->state_ == State::Stopping;
      }
      if (stopNow) throw SessionStopped{};
      s_->setState(State::Paused);
      for (;;) {
        {
          std::unique_lock<std::mutex> lk(s_->mu_);
          s_->cv_.wait(lk, [&] {
            return s_->state_ == State::Running || s_->state_ == State::Stepping ||
                   s_->state_ == State::Stopping;
          });
          if (s_->state_ == State::Stopping) {
            stopped = true;
            break;
          }
        }
        std::optional<MemoryTrackingScope> track;
        if (s_->trackMemory_) track.emplace("step " + std::to_string(s_->stepsDone() + 1));
        WorkloadMetrics st = job_->step();
        track.reset();  // the section ends with the step (its track_end is in this batch)
        recorder_->flush();
        int64_t n;
        {
          std::lock_guard<std::mutex> lk(s_->mu_);
          n = ++s_->stepsDone_;
        }
        emit s_->stepFinished(qint64(job_->steps()), st.loss);
        if (n >= s_->config_.steps) {
          done = true;
          break;
        }
        bool toPaused = false;
        {
          std::lock_guard<std::mutex> lk(s_->mu_);
          toPaused = s_->state_ == State::Stepping;
        }
        if (toPaused) s_->setState(State::Paused);
      }
    } catch (const SessionStopped&) {
      stopped = true;
    } catch (const std::exception& e) {
      if (stopThrown_) {
        stopped = true;
      } else {
        failure = e.what();
        failedSeq = failedSeq_;
      }
    }
    if (obs_) removeObserver(obs_);
    job_.reset();
    if (recorder_) {
      if (failure.empty())
        recorder_->finish();
      else
        recorder_->finishFailed(failure);
      if (failure.empty() && recorder_->failed())
        failure = "recording failed: " + recorder_->error();
    }
    if (!failure.empty()) {
      s_->setState(State::Failed);
      emit s_->failed(QString::fromStdString(failure), quint64(failedSeq));
    } else {
      s_->setState(done ? State::Finished : State::Idle);
      if (done || stopped) emit s_->finished();
    }
  }

  // ---- engine thread ----
  void onStep(const StepEvent& e) override {
    if (e.begin) step_ = e.step;
  }
  void onOpBegin(const OpEvent& e) override {
    if (liveBase_ == 0) liveBase_ = e.seq;
  }
  void onOpError(const OpEvent& e, std::string_view) override { failedSeq_ = e.seq; }

  void onOpEnd(const OpEvent& e) override {
    Breakpoints b;
    bool pauseNow = false, stopping = false, bpChanged = false;
    {
      std::lock_guard<std::mutex> lk(s_->mu_);
      stopping = s_->state_ == State::Stopping;
      pauseNow = s_->pauseRequested_;
      if (bpVersion_ != s_->bpVersion_) {
        bp_ = s_->breakpoints_;
        bpVersion_ = s_->bpVersion_;
        bpChanged = true;
      }
      b = bp_;
    }
    if (stopping) {
      stopThrown_ = true;
      throw SessionStopped{};
    }
    if (bpChanged) {  // breakpoints edited while running: (re)open or drop the reference
      if (b.referencePath.isEmpty()) {
        reference_.reset();
      } else if (b.referencePath != referencePath_ || !reference_) {
        openReference(b.referencePath);  // a bad path throws: the session fails with the message
        referenceHit_ = false;
      }
    }
    std::string reason;
    if (pauseNow) reason = "paused";
    if (reason.empty() && !b.opName.isEmpty() && e.op->name == b.opName.toStdString())
      reason = "breakpoint: op " + e.op->name;
    if (reason.empty() && !b.scope.isEmpty()) {
      const std::string sc = b.scope.toStdString();
      if (e.scope == sc || (e.scope.size() > sc.size() && e.scope.compare(0, sc.size(), sc) == 0 &&
                            e.scope[sc.size()] == '.'))
        reason = "breakpoint: scope " + sc;
    }
    if (reason.empty() && b.nonFinite && !nonFiniteHit_) reason = nonFiniteReason(e);
    if (reason.empty() && reference_ && !referenceHit_) reason = referenceReason(e);
    if (!reason.empty()) pauseAt(e.seq, reason);
  }

 private:
  void setup() {
    const SessionConfig& c = s_->config_;
    // One path: the built-in trainer is a workload like a user's library.
    WorkloadInfo workload =
        c.workloadPath.isEmpty() ? gptWorkload() : loadWorkload(c.workloadPath.toStdString());
    if (c.workloadPath.isEmpty()) loadGptConfig(c.configPath.toStdString());  // validate first
    Device device(c.backend.toStdString());
    KEEL_CHECK(device.isHost(), "backend '", c.backend.toStdString(),
               "' is not available here (expected cpu or cpu-ref)");
    {
      std::lock_guard<std::mutex> lk(s_->mu_);
      if (!s_->breakpoints_.referencePath.isEmpty()) openReference(s_->breakpoints_.referencePath);
    }
    storage::RunInfo run;
    run.backend = std::string(backendName(device.backend));
    run.device = device.name();
    char host[256] = {0};
    if (gethostname(host, sizeof(host) - 1) == 0) run.host = host;
    if (!c.configPath.isEmpty()) {
      std::ifstream f(c.configPath.toStdString(), std::ios::binary);
      KEEL_CHECK(f, "cannot read config file '", c.configPath.toStdString(), "'");
      run.configJson.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    run.seed = c.seed;
    run.engineVersion = KEEL_VERSION;
    run.startTimeUnixNs = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
    recorder_ = std::make_unique<capture::Recorder>(c.output.toStdString(), run, c.capture);
    obs_ = std::shared_ptr<Observer>(this, [](Observer*) {});  // owned by the Session
    addObserver(obs_);
    WorkloadParams params;
    params.configJson = run.configJson;
    params.configPath = c.configPath.toStdString();
    params.device = device;
    params.seed = c.seed;
    params.totalSteps = c.steps;
    job_ = std::make_unique<WorkloadRun>(workload, params);
    recorder_->flush();
  }

  void openReference(const QString& path) {
    reference_.emplace(storage::Recording::open(path.toStdString(), false));
    storage::OpQuery q;
    q.limit = 1;
    q.withTensors = false;
    auto first = reference_->ops(q);
    referenceBase_ = first.empty() ? 1 : first[0].seq;
    referencePath_ = path;
  }

  void pauseAt(uint64_t seq, const std::string& reason) {
    recorder_->flush();
    {
      std::lock_guard<std::mutex> lk(s_->mu_);
      s_->pauseRequested_ = false;
    }
    s_->setState(State::Paused);
    emit s_->pausedAt(quint64(seq), qint64(step_), QString::fromStdString(reason));
    std::unique_lock<std::mutex> lk(s_->mu_);
    s_->cv_.wait(lk, [&] { return s_->state_ != State::Paused; });
    if (s_->state_ == State::Stopping) {
      stopThrown_ = true;
      throw SessionStopped{};
    }
  }

  std::string nonFiniteReason(const OpEvent& e) {
    for (size_t i = 0; i < e.outputs.size(); ++i) {
      const Tensor& t = e.outputs[i];
      if (!t.defined() || !t.device().isHost() || !isFloating(t.dtype())) continue;
      storage::TensorStats st = capture::tensorStats(t);
      if (st.nanCount > 0 || st.infCount > 0) {
        nonFiniteHit_ = true;
        return "breakpoint: first NaN/Inf (output " + std::to_string(i) + " of " + e.op->name +
               ": " + std::to_string(st.nanCount) + " NaN, " + std::to_string(st.infCount) +
               " Inf)";
      }
    }
    return {};
  }

  // Ops are matched by position in the run: the reference's first op pairs with this session's
  // first op (op sequence numbers are per process, and the studio may have run sessions before).
  std::string referenceReason(const OpEvent& e) {
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
      std::string live = capture::tensorMd5(t);
      if (live != rt.md5) {
        referenceHit_ = true;
        return "breakpoint: first MD5 difference from the reference: output " +
               std::to_string(rt.index) + " of " + e.op->name + " (reference " +
               rt.md5.substr(0, 8) + ", live " + live.substr(0, 8) + ")";
      }
    }
    return {};
  }

  Session* s_;
  std::unique_ptr<capture::Recorder> recorder_;
  std::unique_ptr<WorkloadRun> job_;
  bool stopThrown_ = false;  // engine thread: SessionStopped was thrown (see Note [Session pause])
  std::shared_ptr<Observer> obs_;
  std::optional<storage::Recording> reference_;
  Breakpoints bp_;
  uint64_t bpVersion_ = ~uint64_t(0);
  int64_t step_ = 0;
  uint64_t failedSeq_ = 0;
  uint64_t liveBase_ = 0, referenceBase_ = 1;
  QString referencePath_;
  bool nonFiniteHit_ = false, referenceHit_ = false;
};

Session::Session(QObject* parent) : QObject(parent) {
  qRegisterMetaType<Session::State>("keel::studio::Session::State");
}

Session::~Session() {
  stop();
  join();
}

void Session::join() {
  if (thread_.joinable()) thread_.join();
  worker_.reset();
}

void Session::start(const SessionConfig& config) {
  stop();
  join();
  config_ = config;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stepsDone_ = 0;
    pauseRequested_ = false;
  }
  setState(State::Starting);
  worker_ = std::make_unique<Worker>(this);
  thread_ = std::thread([w = worker_.get()] { w->main(); });
}

// State changes from the GUI thread: flip the state under the lock, notify the worker, and emit
// after unlocking (a direct receiver may call state()).
void Session::run() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (state_ != State::Paused) return;
    state_ = State::Running;
    cv_.notify_all();
  }
  emit stateChanged(State::Running);
}

void Session::step() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (state_ != State::Paused) return;
    state_ = State::Stepping;
    cv_.notify_all();
  }
  emit stateChanged(State::Stepping);
}

void Session::pause() {
  std::lock_guard<std::mutex> lk(mu_);
  if (state_ == State::Running || state_ == State::Stepping) pauseRequested_ = true;
}

void Session::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (state_ == State::Idle || state_ == State::Finished || state_ == State::Failed ||
        state_ == State::Stopping)
      return;
    state_ = State::Stopping;
    cv_.notify_all();
  }
  emit stateChanged(State::Stopping);
}

void Session::setBreakpoints(const Breakpoints& b) {
  std::lock_guard<std::mutex> lk(mu_);
  breakpoints_ = b;
  ++bpVersion_;
}

Breakpoints Session::breakpoints() const {
  std::lock_guard<std::mutex> lk(mu_);
  return breakpoints_;
}

Session::State Session::state() const {
  std::lock_guard<std::mutex> lk(mu_);
  return state_;
}

int64_t Session::stepsDone() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stepsDone_;
}

void Session::setState(State s) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    state_ = s;
  }
  emit stateChanged(s);
}

}  // namespace keel::studio
