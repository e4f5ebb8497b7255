// What the studio's tests share: the live sessions they start.
#pragma once
#include <QString>
#include <cstdint>

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

}  // namespace keel::studio::test
