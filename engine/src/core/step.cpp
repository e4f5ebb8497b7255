// keel::Step and the step-end line shared with the Trainer and WorkloadRun.
#include "keel/step.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <mutex>

#include "keel/base/text.h"
#include "keel/error.h"
#include "keel/log.h"
#include "keel/observer.h"

namespace keel {

namespace {
std::mutex g_stepMu;
int64_t g_lastStep = 0;  // the last step begun by a keel::Step since the numbering restarted
int64_t g_running = 0;   // the keel::Step that has begun and not ended; 0: none

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
double valueOr(const std::optional<double>& v) {
  return v ? *v : kNaN;
}
}  // namespace

Step::Step(int64_t number) : number_(number), uncaught_(std::uncaught_exceptions()) {
  {
    std::lock_guard<std::mutex> lk(g_stepMu);
    const std::string self = "keel::Step(" + std::to_string(number) + "): ";
    if (number < 1) throw Error(self + "steps are numbered from 1");
    if (g_running != 0)
      throw Error(self + "step " + std::to_string(g_running) +
                  " has not ended (one step at a time: end it, or let its keel::Step go out of "
                  "scope, first)");
    // Only while something records: a program that trains twice unrecorded may start at 1 again.
    if (number <= g_lastStep && detail::anyObserverInstalled())
      throw Error(self + "step " + std::to_string(number) + " comes after step " +
                  std::to_string(g_lastStep) +
                  "; number the steps upward through the whole run, across epochs too");
    g_lastStep = number;
    g_running = number;
  }
  try {
    detail::notifyStep({number, true, 0.0, 0});
  } catch (...) {  // an observer refused the step: it never began
    std::lock_guard<std::mutex> lk(g_stepMu);
    g_running = 0;
    throw;
  }
}

Step::~Step() {
  if (ended_) return;
  if (std::uncaught_exceptions() > uncaught_) {  // the step failed: it stays unended
    std::lock_guard<std::mutex> lk(g_stepMu);
    if (g_running == number_) g_running = 0;
    return;
  }
  try {
    end();
  } catch (...) {  // a destructor does not throw; the step is over either way
    std::lock_guard<std::mutex> lk(g_stepMu);
    if (g_running == number_) g_running = 0;
  }
}

void Step::end(const StepMetrics& metrics) {
  if (ended_) throw Error("keel::Step(" + std::to_string(number_) + "): end() called twice");
  ended_ = true;
  {
    std::lock_guard<std::mutex> lk(g_stepMu);
    if (g_running == number_) g_running = 0;
  }
  detail::endStep(number_, metrics);
}

namespace detail {

std::string stepLogLine(int64_t step, const StepMetrics& m) {
  std::string line = "step " + std::to_string(step);
  const char* sep = ": ";
  char buf[64];
  auto add = [&](const std::optional<double>& v, const char* format) {
    if (!v) return;
    std::snprintf(buf, sizeof buf, format, unsignedNaN(*v));
    line += sep;
    line += buf;
    sep = ", ";
  };
  add(m.loss, "loss %.4f");
  add(m.lr, "lr %.3g");
  add(m.gradNorm, "grad norm %.4g");
  add(m.auxLoss, "aux loss %.4f");
  add(m.tokensPerSec, "%.0f tokens/s");
  add(m.valLoss, "val loss %.4f");
  return line;
}

void endStep(int64_t step, const StepMetrics& m) {
  // A loss or gradient norm gone NaN/Inf is a warning (the log view shows it as one), not info.
  bool finite = true;
  for (const auto* v : {&m.loss, &m.lr, &m.gradNorm, &m.auxLoss, &m.tokensPerSec, &m.valLoss})
    finite = finite && (!*v || std::isfinite(**v));
  log(finite ? LogLevel::Info : LogLevel::Warn, "train", stepLogLine(step, m));
  StepEvent end{step, false, valueOr(m.loss), 0};
  end.lr = valueOr(m.lr);
  end.gradNorm = valueOr(m.gradNorm);
  end.tokensPerSec = valueOr(m.tokensPerSec);
  end.auxLoss = valueOr(m.auxLoss);
  end.valLoss = valueOr(m.valLoss);
  unsigned bit = 1;  // in StepEvent::nanMetrics' order
  for (const auto* v : {&m.loss, &m.lr, &m.gradNorm, &m.tokensPerSec, &m.auxLoss, &m.valLoss}) {
    if (*v && std::isnan(**v)) end.nanMetrics |= uint8_t(bit);
    bit <<= 1;
  }
  notifyStep(end);
}

namespace {
std::atomic<int64_t> g_pausedNs{0};
}  // namespace

void addPausedNs(int64_t ns) {
  if (ns > 0) g_pausedNs.fetch_add(ns, std::memory_order_relaxed);
}
int64_t pausedNs() {
  return g_pausedNs.load(std::memory_order_relaxed);
}

void restartStepNumbering() {
  std::lock_guard<std::mutex> lk(g_stepMu);
  g_lastStep = 0;
}

}  // namespace detail
}  // namespace keel
