// Workload libraries in the studio (keel/workload.h): a library built for another workload API
// version and one that throws in its second step each fail their session with a clear message
// while the studio stays up and keeps working; the failed run's recording keeps step 1. Stopping
// a workload paused on a breakpoint inside a step is a stop, not a failure.
#include <QSignalSpy>
#include <QStandardPaths>
#include <QtTest>

#include "keel/storage/reader.h"
#include "main_window.h"
#include "studio_test_util.h"
#include "view_test_util.h"

using namespace keel;
using keel::studio::MainWindow;
using keel::studio::Session;

namespace {
QString workload(const char* name) {
  return QString(KEEL_TEST_WORKLOAD_DIR) + "/libtest_" + name + ".so";
}
}  // namespace

class StudioWorkloadTest : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() { QStandardPaths::setTestModeEnabled(true); }

  void mismatchedApiVersionFailsTheSessionNotTheStudio() {
    MainWindow w;
    w.show();
    studio::SessionConfig c = studio::test::workloadSession(workload("api_version_999"), 2,
                                                            views::test::tempDir() + "/v999.db");
    Session* s = w.session();
    QSignalSpy failed(s, &Session::failed);
    w.startSession(c);
    QVERIFY(QTest::qWaitFor([&] { return failed.count() >= 1; }, 30000));
    const QString msg = failed.first().at(0).toString();
    QVERIFY2(msg.contains("workload API version 999") && msg.contains("rebuild"), qPrintable(msg));
    QCOMPARE(s->state(), Session::State::Failed);
    QVERIFY(w.isVisible());

    // The studio still runs a good workload afterwards.
    studio::SessionConfig ok = studio::test::workloadSession(workload("throws_in_step2"), 1,
                                                             views::test::tempDir() + "/ok.db");
    QSignalSpy finished(s, &Session::finished);
    w.startSession(ok);
    QVERIFY(QTest::qWaitFor([&] { return s->state() == Session::State::Paused; }, 30000));
    s->run();
    QVERIFY(QTest::qWaitFor([&] { return finished.count() >= 1; }, 30000));
    QCOMPARE(s->stepsDone(), int64_t(1));
  }

  void throwingStepFailsTheSessionAndKeepsStepOne() {
    MainWindow w;
    w.show();
    studio::SessionConfig c = studio::test::workloadSession(workload("throws_in_step2"), 3,
                                                            views::test::tempDir() + "/throws.db");
    c.capture.md5 = true;
    Session* s = w.session();
    QSignalSpy failed(s, &Session::failed);
    QVERIFY(studio::test::startAndRun(w, c));
    QVERIFY(QTest::qWaitFor([&] { return failed.count() >= 1; }, 30000));
    const QString msg = failed.first().at(0).toString();
    QVERIFY2(msg.contains("workload 'throws-in-step-2' failed in step 2: injected failure"),
             qPrintable(msg));
    QCOMPARE(s->state(), Session::State::Failed);
    QCOMPARE(s->stepsDone(), int64_t(1));
    QVERIFY(w.isVisible());

    storage::Recording rec = storage::Recording::open(c.output.toStdString());
    QVERIFY(QString::fromStdString(rec.run().status).startsWith("failed: "));
    QVERIFY(!rec.steps().empty());
    QCOMPARE(rec.steps()[0].step, int64_t(1));
    QVERIFY(rec.steps()[0].endNs > 0);
    QVERIFY(!rec.stepOps(1).empty());
  }

  void stopAtABreakpointInsideAWorkloadStepIsNotAFailure() {
    MainWindow w;
    studio::SessionConfig c = studio::test::workloadSession(workload("throws_in_step2"), 3,
                                                            views::test::tempDir() + "/stopped.db");
    Session* s = w.session();
    studio::Breakpoints b;
    b.add("op:matmul");
    s->setBreakpoints(b);
    QSignalSpy failed(s, &Session::failed);
    QSignalSpy paused(s, &Session::pausedAt);
    QVERIFY(studio::test::startAndRun(w, c));
    QVERIFY(QTest::qWaitFor([&] { return paused.count() >= 1; }, 30000));
    s->stop();
    QVERIFY(QTest::qWaitFor(
        [&] {
          return s->state() != Session::State::Paused && s->state() != Session::State::Stopping;
        },
        30000));
    QTest::qWait(100);
    QCOMPARE(failed.count(), 0);
    QVERIFY(s->state() != Session::State::Failed);
  }
};

QTEST_MAIN(StudioWorkloadTest)
#include "studio_workload_test.moc"
