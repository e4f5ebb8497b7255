// A session whose op fails mid-run (KEEL_TEST_PERTURB=matmul:50:fail, set by CTest: the 50th
// matmul is in step 2) reports the error with the op, keeps everything recorded so far (step 1,
// the failing op with its stack and an Error log line) and returns to idle; the studio shows the
// failing op's step and selects the op there.
#include <QSignalSpy>
#include <QStandardPaths>
#include <QTableView>
#include <QtTest>

#include "keel/storage/reader.h"
#include "keel/views/graph_view.h"
#include "keel/views/loss_plot.h"
#include "keel/views/op_table.h"
#include "keel/views/selection.h"
#include "main_window.h"
#include "studio_test_util.h"
#include "view_test_util.h"

using namespace keel;
using keel::studio::MainWindow;
using keel::studio::Session;

class SessionFailureTest : public QObject {
  Q_OBJECT
 private slots:
  void failingOpFailsTheSessionAndKeepsTheRecording() {
    QVERIFY2(qgetenv("KEEL_TEST_PERTURB") == "matmul:50:fail", "run through ctest");
    QStandardPaths::setTestModeEnabled(true);
    MainWindow w;
    w.show();
    studio::SessionConfig c =
        studio::test::tinySession(3, 1, views::test::tempDir() + "/failing.db");
    c.capture.md5 = c.capture.stacks = true;
    Session* s = w.session();
    QSignalSpy failed(s, &Session::failed);
    QSignalSpy err(&w, &MainWindow::errorShown);
    QVERIFY(studio::test::startAndRun(w, c));
    QVERIFY(QTest::qWaitFor([&] { return failed.count() >= 1; }, 60000));
    const QString msg = failed.first().at(0).toString();
    const quint64 seq = failed.first().at(1).toULongLong();
    QVERIFY2(msg.contains("matmul") && msg.contains("injected failure"), qPrintable(msg));
    QVERIFY(seq > 0);
    QCOMPARE(s->state(), Session::State::Failed);
    QCOMPARE(s->stepsDone(), int64_t(1));
    QVERIFY(QTest::qWaitFor([&] { return err.count() >= 1; }, 5000));

    storage::Recording rec = storage::Recording::open(c.output.toStdString());
    QVERIFY(QString::fromStdString(rec.run().status).startsWith("failed: "));
    QCOMPARE(int(rec.steps().size()), 2);  // step 1 complete, step 2 begun
    QVERIFY(rec.steps()[0].endNs > 0);
    auto op = rec.op(seq);
    QVERIFY(op.has_value());
    QCOMPARE(QString::fromStdString(op->name), QString("matmul"));
    QCOMPARE(op->step, int64_t(2));
    QVERIFY(op->stackId >= 0);
    QVERIFY(rec.stack(op->stackId).has_value());
    storage::LogQuery q;
    q.opSeqBegin = seq;
    q.opSeqEnd = seq + 1;
    auto logs = rec.logs(q);
    QCOMPARE(int(logs.size()), 1);
    QCOMPARE(int(logs[0].level), int(storage::LogLevel::Error));
    // The studio selected the failing op.
    QVERIFY(QTest::qWaitFor([&] { return w.selection()->current(views::Side::A) == seq; }, 20000));
    // ... in its step (2), not in the step shown when the run failed: the graph has its node and
    // the op table its row, current.
    QVERIFY(QTest::qWaitFor([&] { return w.currentStep() && w.currentStep()->step == 2; }, 20000));
    QVERIFY(studio::test::waitIdle(w, 20000));
    QCOMPARE(w.selection()->current(views::Side::A), std::optional<uint64_t>(seq));
    QVERIFY(w.currentStep()->indexOf(seq) >= 0);
    QVERIFY(w.graphView(views::Side::A)->opItem(seq));
    QVERIFY(w.graphView(views::Side::A)->isFailed(seq));  // painted as failed
    auto* table = w.opTable()->findChild<QTableView*>();
    QVERIFY(table);
    const QModelIndex cur = table->currentIndex();
    QVERIFY(cur.isValid());
    QCOMPARE(cur.siblingAtColumn(0).data().toULongLong(), quint64(seq));
    // The unfinished step 2 has no loss: the metrics plot does not call it a NaN.
    QVERIFY2(w.lossPlot()->markedSteps().isEmpty(),
             qPrintable(w.lossPlot()->markerLabels().join(", ")));
  }
};

QTEST_MAIN(SessionFailureTest)
#include "session_failure_test.moc"
