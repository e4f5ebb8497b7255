// See view_test_util.h.
#include "view_test_util.h"

#include <sys/wait.h>

#include <QDir>
#include <QTemporaryDir>
#include <QTest>
#include <QWidget>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "keel/storage/reader.h"

namespace keel::views::test {

QString tempDir() {
  static QTemporaryDir dir;
  return dir.path();
}

QString panelShotsDir() {
  const QString dir = qEnvironmentVariable("KEEL_PANEL_SHOTS");
  if (!dir.isEmpty()) QDir().mkpath(dir);
  return dir;
}

StepPtr stepOf(const storage::Recording& rec, int64_t step) {
  auto d = std::make_shared<StepData>();
  d->step = step;
  d->ops = rec.stepOps(step);
  return d;
}

StepPtr stepOf(const QString& path, int64_t step) {
  return stepOf(storage::Recording::open(path.toStdString()), step);
}

bool showAt(QWidget& w, QSize size) {
  w.resize(size);
  w.show();
  return QTest::qWaitForWindowExposed(&w);
}

bool saveShot(QWidget* w, QSize size, const QString& dir, const QString& name) {
  if (!showAt(*w, size)) return false;
  QTest::qWait(50);
  return w->grab().save(dir + "/" + name + ".png");
}

int runKeel(const std::string& args, std::string* output, const std::string& env) {
  std::string cmd = "cd '" + std::string(KEEL_SOURCE_DIR) + "' && " + env + " KEEL_BLAS_TUNE=0 '" +
                    KEEL_CLI_PATH + "' " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = ::pclose(p);
  if (output) *output = out;
  if (status == -1) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

bool waitForStepLines(QProcess& rec, QByteArray& printed, int steps) {
  return QTest::qWaitFor(
      [&] {
        rec.waitForReadyRead(100);
        printed += rec.readAllStandardOutput();
        return printed.count("\nstep ") + (printed.startsWith("step ") ? 1 : 0) >= steps;
      },
      60000);
}

bool startLongRecord(QProcess& rec, const QString& out, QByteArray& printed, int steps,
                     const QStringList& extra) {
  QProcessEnvironment e = QProcessEnvironment::systemEnvironment();
  e.insert("KEEL_BLAS_TUNE", "0");
  rec.setProcessEnvironment(e);
  rec.start(KEEL_CLI_PATH, QStringList{"record", "--config",
                                       QString(KEEL_SOURCE_DIR) + "/tests/fixtures/gpt-tiny.json",
                                       "--steps", "100000", "-o", out} +
                               extra);
  return rec.waitForStarted() && waitForStepLines(rec, printed, steps);
}

bool recordFixture(const QString& out, const std::string& extra, const std::string& env,
                   const std::string& config) {
  std::string output;
  int rc = runKeel(
      "record --config tests/fixtures/" + config + " -o '" + out.toStdString() + "' " + extra,
      &output, env);
  if (rc != 0) std::fprintf(stderr, "keel record failed (%d): %s\n", rc, output.c_str());
  return rc == 0;
}

}  // namespace keel::views::test
