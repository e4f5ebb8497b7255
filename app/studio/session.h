// Session: a live training run inside the studio. The engine trains on a worker thread while a
// capture Recorder writes the recording the views read; Run / Pause / Step / Stop and breakpoints
// (op name, scope, first NaN/Inf output, first output MD5 that differs from a reference recording)
// pause the engine thread inside the step, after the op that hit, with everything so far committed;
// step-level ones (step N, gradient norm above x, loss above k × its mean) pause between steps.
// Invariant: the GUI thread never waits on the engine; every report is a queued signal.
#pragma once
#include <QList>
#include <QObject>
#include <QString>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "keel/capture/options.h"

namespace keel::studio {

struct SessionConfig {
  QString configPath;               // model + training config (JSON), e.g. configs/gpt-mini.json
                                    // (with a workload library: its config, "" for its defaults)
  QString workloadPath;             // a workload library (docs/api.md); "" for the built-in trainer
  QString backend = "cpu";          // cpu | cpu-ref | cuda[:N]
  uint64_t seed = 0;                // keel record's default
  int64_t steps = 20;               // length of the run (and of the LR schedule)
  QString output;                   // recording file to write
  capture::CaptureOptions capture;  // what to record
};

// One breakpoint: a `keel record --break-on` item ("op:matmul", "scope:blocks.1", "nan",
// "md5-ref:ref.db", "step:3", "grad-norm>10", "loss>2*mean", each optionally "@N": the Nth hit;
// capture::BreakCondition reads it), on or off.
struct Breakpoint {
  QString item;
  bool enabled = true;
  bool operator==(const Breakpoint&) const = default;
};

// The breakpoint list; the first enabled one that holds pauses the run.
struct Breakpoints {
  QList<Breakpoint> list;
  bool any() const {
    for (const Breakpoint& b : list)
      if (b.enabled) return true;
    return false;
  }
  void add(const QString& item, bool enabled = true) { list.push_back({item, enabled}); }
  // The error of the first item capture cannot read ("" when all are good).
  QString error() const;
};

class Session : public QObject {
  Q_OBJECT
 public:
  enum class State { Idle, Starting, Paused, Running, Stepping, Stopping, Finished, Failed };
  Q_ENUM(State)

  explicit Session(QObject* parent = nullptr);
  ~Session() override;  // stops and joins the worker

  // Starts the worker: loads the config, creates the recording and the model (initialisation is
  // recorded as step 0), then pauses before step 1 (emits started, then stateChanged(Paused)).
  // Errors (bad config, unwritable output) arrive as failed().
  void start(const SessionConfig& config);
  void run();    // run to the end, or to the next breakpoint / pause
  void pause();  // pause after the op running now
  void step();   // run one training step (the rest of the current one when paused inside it)
  void stop();   // stop; the recording keeps everything so far
  // The same, with the reason the recording's status gives ("interrupted (SIGINT)"; stop():
  // "stopped in the studio").
  void stop(const std::string& reason);
  void setBreakpoints(const Breakpoints& b);
  Breakpoints breakpoints() const;
  // Wraps each following training step in a keel::MemoryTrackingScope("step N"), so the
  // recording holds one tracked section per step (the memory view's table). Any thread.
  void setTrackMemoryPerStep(bool on) { trackMemory_ = on; }
  bool trackMemoryPerStep() const { return trackMemory_; }

  State state() const;
  QString recordingPath() const { return config_.output; }
  int64_t stepsDone() const;
  int64_t totalSteps() const { return config_.steps; }
  uint64_t seed() const { return config_.seed; }

 signals:
  void stateChanged(keel::studio::Session::State state);
  void started(QString recordingPath);                      // step 0 committed: open the recording
  void stepFinished(qint64 step, double loss);              // committed
  void pausedAt(quint64 seq, qint64 step, QString reason);  // after op `seq`; committed
  void failed(QString message, quint64 seq);                // seq of the failing op, or 0
  void finished();                                          // all steps done; recording closed

 private:
  class Worker;
  friend class Worker;
  void setState(State s);
  void join();

  SessionConfig config_;
  std::unique_ptr<Worker> worker_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::Idle;
  bool pauseRequested_ = false;
  std::string stopReason_;  // under mu_: the status a stop gives the recording
  std::string stopReasonNow() {
    std::lock_guard<std::mutex> lk(mu_);
    return stopReason_;
  }
  Breakpoints breakpoints_;
  int64_t stepsDone_ = 0;
  std::atomic<bool> trackMemory_{false};
};

}  // namespace keel::studio
