// RunSource and DiffRunner on real recordings: results arrive as signals, errors as failed() with
// the storage layer's one-line message, never an exception into Qt.
#include <QFile>
#include <QSignalSpy>
#include <QtTest>

#include "keel/storage/reader.h"
#include "keel/views/run_source.h"
#include "view_test_util.h"

using namespace keel::views;

class RunSourceTest : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    path_ = test::tempDir() + "/run.db";
    QVERIFY(test::recordFixture(path_, "--steps 2 --seed 5 --md5 --stats --stacks"));
  }

  void opensAndLoadsStepsAndOps() {
    RunSource src;
    QSignalSpy opened(&src, &RunSource::opened);
    src.open(path_);
    QVERIFY(QTest::qWaitFor([&] { return opened.count() >= 1; }, 10000));
    auto summary = opened.takeFirst().at(0).value<SummaryPtr>();
    QCOMPARE(int(summary->steps.size()), 2);
    keel::storage::Recording rec = keel::storage::Recording::open(path_.toStdString());
    QCOMPARE(summary->opCount, rec.opCount());

    QSignalSpy stepSpy(&src, &RunSource::stepLoaded);
    src.requestStep(1);
    QVERIFY(QTest::qWaitFor([&] { return stepSpy.count() >= 1; }, 10000));
    auto step = stepSpy.takeFirst().at(0).value<StepPtr>();
    QCOMPARE(step->ops.size(), rec.stepOps(1).size());
    QVERIFY(step->ops.size() > 50);

    const uint64_t seq = step->ops[10].seq;
    QCOMPARE(step->indexOf(seq), int64_t(10));
    QSignalSpy opSpy(&src, &RunSource::opLoaded);
    src.requestOp(seq);
    QVERIFY(QTest::qWaitFor([&] { return opSpy.count() >= 1; }, 10000));
    auto details = opSpy.takeFirst().at(0).value<OpDetailsPtr>();
    QVERIFY(details->error.empty());
    QCOMPARE(details->op.seq, seq);
    QVERIFY(details->stack.has_value());
    QVERIFY(!details->stack->frames.empty());
  }

  void badFileFailsWithOneLine() {
    QString bad = test::tempDir() + "/not-a-recording.db";
    QFile f(bad);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("this is not sqlite at all, just text");
    f.close();
    RunSource src;
    QSignalSpy failed(&src, &RunSource::failed);
    src.open(bad);
    QVERIFY(QTest::qWaitFor([&] { return failed.count() >= 1; }, 10000));
    QString msg = failed.takeFirst().at(0).toString();
    QVERIFY2(msg.contains("not an SQLite file"), qPrintable(msg));
    QVERIFY(!msg.contains('\n'));
    QVERIFY(!src.isOpen());  // nothing was open: nothing is

    // A failed open leaves the recording it had; an open that failed before a later one was
    // asked for leaves the later one's (a failure used to restore whatever came before).
    QSignalSpy opened(&src, &RunSource::opened);
    QSignalSpy openFailed(&src, &RunSource::openFailed);
    src.open(path_);
    QVERIFY(QTest::qWaitFor([&] { return opened.count() >= 1; }, 10000));
    src.open(bad);
    QVERIFY(QTest::qWaitFor([&] { return openFailed.count() >= 1; }, 10000));
    QCOMPARE(src.path(), path_);
    QVERIFY(src.isOpen());
    src.open(bad);
    src.open(path_);  // asked for before the first fails
    // `opened` reaches the spy on the worker's thread, `openFailed` through the main thread's
    // queue: wait for both, or the later open can be counted before the earlier failure is.
    QVERIFY(QTest::qWaitFor([&] { return opened.count() >= 2 && openFailed.count() >= 2; }, 10000));
    QCOMPARE(openFailed.count(), 2);
    QCOMPARE(src.path(), path_);
    QVERIFY(src.isOpen());
    QSignalSpy stepSpy(&src, &RunSource::stepLoaded);
    src.requestStep(1);
    QVERIFY(QTest::qWaitFor([&] { return stepSpy.count() >= 1; }, 10000));
  }

  void diffRunnerFindsThePerturbedOp() {
    QString bad = test::tempDir() + "/perturbed.db";
    QVERIFY(test::recordFixture(bad, "--steps 2 --seed 5 --md5 --stats --stacks",
                                "KEEL_TEST_PERTURB=matmul:5"));
    DiffRunner runner;
    QSignalSpy done(&runner, &DiffRunner::finished);
    runner.start(path_, bad);
    QVERIFY(QTest::qWaitFor([&] { return done.count() >= 1; }, 30000));
    auto report = done.takeFirst().at(0).value<DiffPtr>();
    QVERIFY(report->root.has_value());
    QCOMPARE(QString::fromStdString(report->root->pair.name), QString("matmul"));
  }

 private:
  QString path_;
};

QTEST_MAIN(RunSourceTest)
#include "run_source_test.moc"
