// Marking the training steps of your own loop, for whatever records the run (a
// keel::capture::Recorder, keel record's --step-range and --break-on, the studio's live session):
//
//   for (int64_t n = 1; n <= steps; ++n) {
//     keel::Step step(n);
//     ... zero the gradients, forward, backward, optimizer step ...
//     step.end({.loss = loss.item(), .lr = lr});
//   }
//
// keel::Trainer and keel::WorkloadRun mark their steps themselves; a workload that sets
// KEEL_WORKLOAD_MARKS_STEPS marks its own with keel::Step.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "keel/base/non_copyable.h"

namespace keel {

// What a step reports when it ends. What is left empty is unknown (a recording stores NULL); a
// value that is NaN is a NaN (a loss gone NaN), which the step's log line flags as a warning.
struct StepMetrics {
  std::optional<double> loss = std::nullopt;
  std::optional<double> lr = std::nullopt;
  std::optional<double> gradNorm = std::nullopt;  // before clipping
  std::optional<double> auxLoss = std::nullopt;   // a mixture of experts' auxiliary loss
  std::optional<double> tokensPerSec = std::nullopt;
  std::optional<double> valLoss = std::nullopt;  // validation loss, where evaluated
};

// One training step, from construction to end() (or destruction). Steps are numbered from 1 and
// upward through the whole run — across epochs too — and one runs at a time: the constructor
// throws keel::Error for a number below 1, a number not above the last step's while something
// records (an observer is installed), or a step begun while another has not ended. The numbering
// starts again when a recorder is installed, so one program can record several runs, each from
// step 1, and train unrecorded as it likes.
//
// end() reports the metrics and writes the step's log line ("step 3: loss 1.2345, lr 0.001"),
// as the built-in trainer does. A Step destroyed without end() ends with its metrics unknown;
// destroyed by an exception, it does not end: the recording shows the step the run failed in.
class Step : NonCopyable {
 public:
  explicit Step(int64_t number);
  ~Step();
  void end(const StepMetrics& metrics = {});  // throws keel::Error when called twice
  int64_t number() const { return number_; }

 private:
  int64_t number_;
  int uncaught_;  // std::uncaught_exceptions() at construction
  bool ended_ = false;
};

namespace detail {
// The step's log line, "step N: loss L, lr R, grad norm G, aux loss A, T tokens/s, val loss V"
// with the metrics that are known.
std::string stepLogLine(int64_t step, const StepMetrics& metrics);
// Ends step `step`: writes its log line (a warning when a known metric is NaN or infinite) and
// tells the observers. For keel::Step, the Trainer and WorkloadRun, which number their own steps.
void endStep(int64_t step, const StepMetrics& metrics);
// keel::Step's numbering starts again (addObserver calls it).
void restartStepNumbering();
// Some observer is installed, paused or not (observer.cpp).
bool anyObserverInstalled();
// Note [Paused time]: a debugger that holds the engine inside a step (the studio's breakpoints)
// adds the time it held it; a trainer subtracts what was added during its step from the time
// its tokens/s is computed over. Any thread.
void addPausedNs(int64_t ns);
int64_t pausedNs();
}  // namespace detail

}  // namespace keel
