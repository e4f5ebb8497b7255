// Live divergence hunting: a session run with KEEL_TEST_PERTURB=matmul:20:nan (set by CTest; the
// 20th matmul is a backward matmul of step 1) pauses at the first MD5 that differs from a clean
// reference recording of the same config and seed — exactly the perturbed op — and, resumed with
// the NaN breakpoint instead, nowhere else before the end (the NaN is already past).
#include <QSignalSpy>
#include <QStandardPaths>
#include <QtTest>

#include "keel/storage/reader.h"
#include "main_window.h"
#include "view_test_util.h"

using namespace keel;
using keel::studio::MainWindow;
using keel::studio::Session;

class SessionBreakpointTest : public QObject {
  Q_OBJECT
 private slots:
  void referenceAndNanBreakpointsStopAtThePerturbedOp() {
    QVERIFY2(qgetenv("KEEL_TEST_PERTURB") == "matmul:20:nan", "run through ctest");
    QStandardPaths::setTestModeEnabled(true);
    const QString dir = views::test::tempDir();
    // The reference comes from another process: no perturbation there.
    QVERIFY(views::test::recordFixture(dir + "/ref.db", "--steps 2 --seed 3 --md5",
                                       "KEEL_TEST_PERTURB="));
    storage::Recording ref = storage::Recording::open((dir + "/ref.db").toStdString());
    uint64_t perturbedSeq = 0;
    int matmuls = 0;
    for (int64_t step : {0, 1})
      for (const auto& o : ref.stepOps(step))
        if (o.name == "matmul" && ++matmuls == 20) perturbedSeq = o.seq;
    QVERIFY(perturbedSeq != 0);

    MainWindow w;
    w.show();
    studio::SessionConfig c;
    c.configPath = QString(KEEL_SOURCE_DIR) + "/tests/fixtures/gpt-tiny.json";
    c.steps = 2;
    c.seed = 3;
    c.output = dir + "/live.db";
    c.capture.md5 = c.capture.stats = true;
    Session* s = w.session();
    studio::Breakpoints b;
    b.referencePath = dir + "/ref.db";
    s->setBreakpoints(b);
    QSignalSpy paused(s, &Session::pausedAt);
    w.startSession(c);
    QVERIFY(QTest::qWaitFor([&] { return s->state() == Session::State::Paused; }, 30000));
    s->run();
    QVERIFY(QTest::qWaitFor([&] { return paused.count() >= 1; }, 60000));
    QCOMPARE(paused.first().at(0).toULongLong(), quint64(perturbedSeq));
    QVERIFY2(paused.first().at(2).toString().contains("MD5"),
             qPrintable(paused.first().at(2).toString()));

    b = {};
    b.nonFinite = true;
    s->setBreakpoints(b);
    QSignalSpy finished(s, &Session::finished);
    s->run();
    // The NaN spreads to later ops: the NaN breakpoint pauses at the first one after the resume.
    QVERIFY(QTest::qWaitFor([&] { return paused.count() >= 2; }, 60000));
    QCOMPARE(paused.count(), 2);
    QVERIFY(paused.last().at(0).toULongLong() > perturbedSeq);
    QVERIFY(paused.last().at(2).toString().contains("NaN"));
    b = {};
    s->setBreakpoints(b);
    s->run();
    QVERIFY(QTest::qWaitFor([&] { return finished.count() >= 1; }, 60000));
  }
};

QTEST_MAIN(SessionBreakpointTest)
#include "session_breakpoint_test.moc"
