// Helpers for the Qt tests: fixture recordings made by the real `keel` binary (so they are what a
// user records), and pictures of views saved to look at.
#pragma once
#include <QObject>
#include <QProcess>
#include <QSize>
#include <QString>
#include <QTest>
#include <QtDebug>
#include <string>

#include "keel/views/run_data.h"
#include "keel/views/run_source.h"

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

// A recording still being written: starts `keel record` of gpt-tiny for 100,000 steps into
// `out` (with `extra` options) in `rec`, and waits until it has printed `steps` step lines
// (collected in `printed`, which waitForStepLines extends). False when it did not get there.
bool startLongRecord(QProcess& rec, const QString& out, QByteArray& printed, int steps,
                     const QStringList& extra = {});
// Waits until `rec` has printed `steps` step lines in all.
bool waitForStepLines(QProcess& rec, QByteArray& printed, int steps);

// Runs the keel binary with `args`; returns its exit status (stdout/stderr go to `output`).
int runKeel(const std::string& args, std::string* output = nullptr, const std::string& env = "");

// Step `step` of a recording as the views are given it (its ops).
StepPtr stepOf(const storage::Recording& rec, int64_t step);
StepPtr stepOf(const QString& path, int64_t step);

// Opens `path` in a RunSource, asks it with `request(source)` and returns what its signal
// `loaded` answers, as the studio gets it (from RunSource's worker thread); nullptr, with a
// warning, when the open or the request failed or nothing came within `ms`. The answers are
// caught by a GUI-thread receiver (queued): a QSignalSpy armed after the request could miss a
// fast one.
template <typename Ptr, typename Request>
Ptr loadThroughRunSource(const QString& path, void (RunSource::*loaded)(Ptr), Request request,
                         int ms = 60000) {
  RunSource src;
  QObject receiver;
  bool opened = false;
  QString failed;
  Ptr result;
  QObject::connect(&src, &RunSource::opened, &receiver, [&](SummaryPtr) { opened = true; });
  QObject::connect(&src, &RunSource::failed, &receiver, [&](QString m) { failed = m; });
  QObject::connect(&src, &RunSource::memoryFailed, &receiver, [&](QString m) { failed = m; });
  QObject::connect(&src, loaded, &receiver, [&](Ptr p) { result = p; });
  src.open(path);
  if (!QTest::qWaitFor([&] { return opened || !failed.isEmpty(); }, ms) || !opened) {
    qWarning() << "open failed:" << (failed.isEmpty() ? QString("timeout") : failed);
    return nullptr;
  }
  request(src);
  if (!QTest::qWaitFor([&] { return result || !failed.isEmpty(); }, ms))
    qWarning() << "no answer from RunSource";
  if (!failed.isEmpty()) qWarning() << "failed:" << failed;
  return result;
}

// Op `seq`'s details as the inspector is given them.
inline OpDetailsPtr loadOp(const QString& path, uint64_t seq) {
  return loadThroughRunSource(path, &RunSource::opLoaded,
                              [seq](RunSource& src) { src.requestOp(seq); });
}

// Shows `w` at `size` and waits until it is on screen; false when it never was.
bool showAt(QWidget& w, QSize size);

// KEEL_PANEL_SHOTS=<dir>: the folder (made here) the screenshot tests save pictures of views
// into, to look at; "" when unset (they skip then).
QString panelShotsDir();
// Shows `w` at `size`, waits until it is on screen and painted, and saves it as <dir>/<name>.png;
// false when it could not.
bool saveShot(QWidget* w, QSize size, const QString& dir, const QString& name);

}  // namespace keel::views::test
