// Session: see session.h. The worker thread owns the capture::RecordingRun (the one record-a-run
// sequence `keel record` uses too: config, allocator, metadata, recorder, workload, steps, break
// conditions); its after-op hook pauses the engine thread. See Note [Session pause].
#include "session.h"

#include <chrono>
#include <cstdio>
#include <exception>
#include <optional>

#include "keel/allocator.h"
#include "keel/capture/recording_run.h"
#include "keel/dispatch.h"
#include "keel/error.h"
#include "keel/log.h"
#include "keel/observer.h"
#include "keel/op_sequence.h"
#include "keel/registry.h"
#include "keel/step.h"
#include "keel/storage/writer.h"
#include "keel/workload.h"

namespace keel::studio {

// Note [Session pause]: a pause (breakpoint, Pause button) happens on the engine thread inside
// the RecordingRun's after-op hook: it flushes the recorder (so the views can read the op that
// hit), reports pausedAt, and waits on the session's condition variable. Run / Step resume it;
// Stop ends the run from there (RecordingRun::stopHere), which unwinds the step like any engine
// error; the recording keeps what was committed and says "stopped". The GUI thread only flips
// the state under the mutex and notifies.
namespace {

// The list as capture's BreakSpec; items it cannot read are left out (the dialog rejects them).
capture::BreakSpec toSpec(const Breakpoints& b) {
  capture::BreakSpec s;
  for (const Breakpoint& p : b.list) {
    try {
      capture::BreakCondition c = capture::BreakCondition::parse(p.item.trimmed().toStdString());
      c.enabled = p.enabled;
      s.conditions.push_back(std::move(c));
    } catch (const std::exception&) {
    }
  }
  return s;
}

const char* const kStoppedByUser = "stopped in the studio";

}  // namespace

class Session::Worker {
 public:
  explicit Worker(Session* s) : s_(s) {}

  capture::RecordingRun* run() { return run_.get(); }  // under s_->mu_

  void main() {
    std::string failure;
    uint64_t failedSeq = 0;
    bool done = false;
    try {
      setup();
      emit s_->started(s_->config_.output);
      bool stopNow = false;
      {
        std::lock_guard<std::mutex> lk(s_->mu_);
        stopNow = s_->state_ == State::Stopping;
      }
      if (stopNow) throw capture::RunStopped(s_->stopReasonNow(), 0, 0);
      s_->setState(State::Paused);
      for (;;) {
        {
          std::unique_lock<std::mutex> lk(s_->mu_);
          s_->cv_.wait(lk, [&] {
            return s_->state_ == State::Running || s_->state_ == State::Stepping ||
                   s_->state_ == State::Stopping;
          });
          if (s_->state_ == State::Stopping) {
            run_->markStopped(s_->stopReason_);
            break;
          }
        }
        run_->setTrackMemoryPerStep(s_->trackMemory_);
        WorkloadMetrics st = run_->step();
        run_->recorder().flush();
        int64_t n;
        {
          std::lock_guard<std::mutex> lk(s_->mu_);
          n = ++s_->stepsDone_;
        }
        emit s_->stepFinished(qint64(run_->stepsDone()), st.loss);
        if (n >= s_->config_.steps) {
          done = true;
          break;
        }
        bool toPaused = false;
        {
          std::lock_guard<std::mutex> lk(s_->mu_);
          toPaused = s_->state_ == State::Stepping;
        }
        // A step-level breakpoint (step N, gradient norm, loss spike): pause between steps,
        // after the step's last op.
        if (const std::string& why = run_->stepBreak(); !why.empty()) {
          s_->setState(State::Paused);
          emit s_->pausedAt(quint64(lastOpSeq()), qint64(run_->stepsDone()),
                            QString::fromStdString(why));
        } else if (toPaused) {
          s_->setState(State::Paused);
        }
      }
    } catch (const capture::RunStopped&) {
      // Stopped by the user (or a condition): everything recorded so far is kept.
    } catch (const std::exception& e) {
      failure = e.what();
      if (run_) failedSeq = run_->failedSeq();
    }
    if (run_ && run_->started()) {
      if (failure.empty()) {
        if (!run_->finish()) failure = "recording failed: " + run_->recorder().error();
      } else {
        run_->fail(failure);
      }
    }
    std::string written;
    {
      std::lock_guard<std::mutex> lk(s_->mu_);
      if (run_ && run_->started()) written = run_->spec().output;
      run_.reset();
    }
    // The views read the file while it was written, so it closed in WAL mode: checkpoint it into
    // the .db (the views keep reading; the -wal goes when the studio lets go of the file).
    if (!written.empty()) storage::settleRecording(written);
    if (!failure.empty()) {
      s_->setState(State::Failed);
      emit s_->failed(QString::fromStdString(failure), quint64(failedSeq));
    } else {
      s_->setState(done ? State::Finished : State::Idle);
      emit s_->finished();
    }
  }

 private:
  void setup() {
    const SessionConfig& c = s_->config_;
    capture::RunSpec spec;
    spec.configPath = c.configPath.toStdString();
    spec.workloadPath = c.workloadPath.toStdString();
    spec.backend = c.backend.toStdString();
    spec.seed = c.seed;
    spec.steps = c.steps;
    spec.output = c.output.toStdString();
    spec.replaceInPlace = true;  // the views read the recording while it is written
    spec.capture = c.capture;
    {
      std::lock_guard<std::mutex> lk(s_->mu_);
      spec.breaks = toSpec(s_->breakpoints_);
    }
    auto run = std::make_unique<capture::RecordingRun>(
        spec, [this](const OpEvent& e, const std::string& reason) { afterOp(e, reason); });
    {  // held before start: a failure while setting up is reported with its op (failedSeq)
      std::lock_guard<std::mutex> lk(s_->mu_);
      run_ = std::move(run);
    }
    run_->start();
    run_->recorder().flush();
  }

  // ---- engine thread ----
  void afterOp(const OpEvent& e, std::string reason) {
    bool pauseNow = false, stopping = false;
    {
      std::lock_guard<std::mutex> lk(s_->mu_);
      stopping = s_->state_ == State::Stopping;
      pauseNow = s_->pauseRequested_;
    }
    if (stopping) capture::RecordingRun::stopHere(s_->stopReasonNow());
    if (reason.empty() && pauseNow) reason = "paused";
    if (!reason.empty()) pauseAt(e.seq, reason);
  }

  void pauseAt(uint64_t seq, const std::string& reason) {
    // run_ is set before the first step (ops of step 0 run inside start(), where no pause can
    // be asked for: the session is Starting).
    run_->recorder().flush();
    {
      std::lock_guard<std::mutex> lk(s_->mu_);
      s_->pauseRequested_ = false;
    }
    s_->setState(State::Paused);
    emit s_->pausedAt(quint64(seq), qint64(run_->currentStep()), QString::fromStdString(reason));
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lk(s_->mu_);
    s_->cv_.wait(lk, [&] { return s_->state_ != State::Paused; });
    const bool stopping = s_->state_ == State::Stopping;
    lk.unlock();
    // Note [Paused time]: the step's tokens/s leaves the pause out, and its log says how long
    // the step was held (its time, begin to end, still spans it).
    const int64_t held =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    keel::detail::addPausedNs(held);
    char line[128];
    std::snprintf(line, sizeof line,
                  "paused %.2f s after op #%llu (left out of the step's tokens/s)",
                  double(held) / 1e9, static_cast<unsigned long long>(seq));
    keel::log(LogLevel::Info, "studio", line);
    if (stopping) capture::RecordingRun::stopHere(s_->stopReasonNow());
  }

  Session* s_;
  std::unique_ptr<capture::RecordingRun> run_;
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
  // Each session's recording numbers its ops from #1, as keel record's does: the previous
  // session has ended (joined above). Note [Op numbers per run].
  keel::detail::restartOpSequence();
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
  stop(kStoppedByUser);
}

void Session::stop(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (state_ == State::Idle || state_ == State::Finished || state_ == State::Failed ||
        state_ == State::Stopping)
      return;
    stopReason_ = reason;
    state_ = State::Stopping;
    cv_.notify_all();
  }
  emit stateChanged(State::Stopping);
}

QString Breakpoints::error() const {
  for (const Breakpoint& p : list) {
    try {
      const capture::BreakCondition c =
          capture::BreakCondition::parse(p.item.trimmed().toStdString());
      if (c.kind == capture::BreakCondition::Kind::Md5Ref) {  // the reference opens, holds MD5s
        capture::BreakSpec one;
        one.conditions.push_back(c);
        capture::BreakConditions check(std::move(one));
      }
    } catch (const std::exception& e) {
      return QString::fromStdString(e.what());
    }
  }
  return {};
}

void Session::setBreakpoints(const Breakpoints& b) {
  std::lock_guard<std::mutex> lk(mu_);
  breakpoints_ = b;
  if (worker_ && worker_->run()) worker_->run()->setBreaks(toSpec(b));
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
