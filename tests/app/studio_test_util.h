// What the studio's tests share: the live sessions they start, and waiting on the main window.
#pragma once
#include <QString>
#include <QtTest>
#include <cstdint>

#include "main_window.h"
#include "session.h"

namespace keel::studio::test {

// A live session of tests/fixtures/gpt-tiny.json: `steps` steps of seed `seed`, recorded to
// `output`, capturing only what CaptureOptions has on by default (each test adds what it checks).
inline SessionConfig tinySession(int64_t steps, uint64_t seed, const QString& output) {
  SessionConfig c;
  c.configPath = QString(KEEL_SOURCE_DIR) + "/tests/fixtures/gpt-tiny.json";
  c.steps = steps;
  c.seed = seed;
  c.output = output;
  return c;
}

// A live session of the workload library `library` (its default config), `steps` steps to `output`.
inline SessionConfig workloadSession(const QString& library, int64_t steps, const QString& output) {
  SessionConfig c;
  c.workloadPath = library;
  c.steps = steps;
  c.output = output;
  return c;
}

// Starts `c` in the window's session, waits until it pauses before its first step (a session
// starts paused) and runs it; false when it never paused.
inline bool startAndRun(MainWindow& w, const SessionConfig& c) {
  w.startSession(c);
  Session* s = w.session();
  if (!QTest::qWaitFor([&] { return s->state() == Session::State::Paused; }, 30000)) return false;
  s->run();
  return true;
}

// Waits until the window has nothing left to load (at most `ms`).
inline bool waitIdle(MainWindow& w, int ms = 60000) {
  // What the session emitted on its thread (a spy counted it there, at once) reaches the window
  // through its queue: let it in first, or "idle" is the window before it began to handle it.
  QCoreApplication::sendPostedEvents();
  bool idle = false;
  w.whenIdle([&] { idle = true; });
  return QTest::qWaitFor([&] { return idle; }, ms);
}

}  // namespace keel::studio::test
