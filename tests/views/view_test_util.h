// Helpers for the Qt tests: fixture recordings made by the real `keel` binary (so they are what a
// user records), and pictures of views saved to look at.
#pragma once
#include <QSize>
#include <QString>
#include <string>

#include "keel/views/run_data.h"

class QWidget;

namespace keel::storage {
class Recording;
}

namespace keel::views::test {

// A fresh temporary directory for this test binary (removed at exit).
QString tempDir();

// Runs `keel record --config tests/fixtures/<config> -o <out> <extra>` with `env` (e.g.
// "KEEL_TEST_PERTURB=matmul:5"); fails the test (QFAIL-style message, returns false) on error.
bool recordFixture(const QString& out, const std::string& extra, const std::string& env = "",
                   const std::string& config = "gpt-tiny.json");

// Runs the keel binary with `args`; returns its exit status (stdout/stderr go to `output`).
int runKeel(const std::string& args, std::string* output = nullptr, const std::string& env = "");

// Step `step` of a recording as the views are given it (its ops).
StepPtr stepOf(const storage::Recording& rec, int64_t step);
StepPtr stepOf(const QString& path, int64_t step);

// Shows `w` at `size` and waits until it is on screen; false when it never was.
bool showAt(QWidget& w, QSize size);

// KEEL_PANEL_SHOTS=<dir>: the folder (made here) the screenshot tests save pictures of views
// into, to look at; "" when unset (they skip then).
QString panelShotsDir();
// Step `step` of a recording as the views are given it (its ops).
StepPtr stepOf(const storage::Recording& rec, int64_t step);
StepPtr stepOf(const QString& path, int64_t step);

// Shows `w` at `size`, waits until it is on screen and painted, and saves it as <dir>/<name>.png;
// false when it could not.
bool saveShot(QWidget* w, QSize size, const QString& dir, const QString& name);

}  // namespace keel::views::test
