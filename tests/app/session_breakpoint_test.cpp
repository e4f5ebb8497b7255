// Live divergence hunting: a session run with KEEL_TEST_PERTURB=matmul:20:nan (set by CTest; the
// 20th matmul is a backward matmul of step 1) pauses at the first MD5 that differs from a clean
// reference recording of the same config and seed — exactly the perturbed op — and, resumed with
// the NaN breakpoint instead, nowhere else before the end (the NaN is already past); the
// Breakpoints dialog's list, and a step-level breakpoint pausing between steps.
#include <QAbstractGraphicsShapeItem>
#include <QApplication>
#include <QComboBox>
#include <QContextMenuEvent>
#include <QDialogButtonBox>
#include <QGraphicsView>
#include <QLabel>
#include <QMenu>
#include <QPushButton>
#include <QSignalSpy>
#include <QSpinBox>
#include <QStandardPaths>
#include <QTableView>
#include <QTableWidget>
#include <QTimer>
#include <QtTest>

#include "dialogs.h"
#include "keel/storage/reader.h"
#include "keel/views/graph_view.h"
#include "keel/views/op_table.h"
#include "keel/views/selection.h"
#include "main_window.h"
#include "studio_test_util.h"
#include "view_test_util.h"

using namespace keel;
using keel::studio::MainWindow;
using keel::studio::Session;

namespace {

// Once the context menu about to be opened is up, triggers its action named `text` (setting
// *triggered) and closes it.
void chooseFromNextMenu(const QString& text, bool* triggered) {
  QTimer::singleShot(200, [text, triggered] {
    auto* menu = qobject_cast<QMenu*>(QApplication::activePopupWidget());
    if (!menu) return;
    for (QAction* a : menu->actions())
      if (a->text() == text) {
        *triggered = true;
        a->trigger();
      }
    menu->close();
  });
}

}  // namespace

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
    studio::SessionConfig c = studio::test::tinySession(2, 3, dir + "/live.db");
    c.capture.md5 = c.capture.stats = true;
    Session* s = w.session();
    studio::Breakpoints b;
    b.add("md5-ref:" + dir + "/ref.db");
    s->setBreakpoints(b);
    QSignalSpy paused(s, &Session::pausedAt);
    QVERIFY(studio::test::startAndRun(w, c));
    QVERIFY(QTest::qWaitFor([&] { return paused.count() >= 1; }, 60000));
    QCOMPARE(paused.first().at(0).toULongLong(), quint64(perturbedSeq));
    QVERIFY2(paused.first().at(2).toString().contains("MD5"),
             qPrintable(paused.first().at(2).toString()));

    b = {};
    b.add("nan");
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

  // `@N` pauses at the Nth hit only, as docs/studio.md says: a session paused at hits 3, 6 and 9.
  void aHitCountPausesOnlyAtTheNthHit() {
    QStandardPaths::setTestModeEnabled(true);
    MainWindow w;
    w.show();
    const studio::SessionConfig c =
        studio::test::tinySession(2, 3, views::test::tempDir() + "/hits.db");
    Session* s = w.session();
    studio::Breakpoints b;
    b.add("op:matmul@3");
    s->setBreakpoints(b);
    QSignalSpy paused(s, &Session::pausedAt);
    QSignalSpy finished(s, &Session::finished);
    QVERIFY(studio::test::startAndRun(w, c));
    QVERIFY(QTest::qWaitFor([&] { return paused.count() >= 1; }, 60000));
    QVERIFY2(paused.first().at(2).toString().endsWith("(hit 3)"),
             qPrintable(paused.first().at(2).toString()));
    s->run();
    QVERIFY(QTest::qWaitFor([&] { return finished.count() >= 1; }, 60000));
    QCOMPARE(paused.count(), 1);
  }

  // For a live session the dialog refuses what could never pause it (step:99 of a 10-step run,
  // a hit count on a step, an item listed twice: all were accepted) and warns that a reference
  // recorded with another seed differs from the first random op (keel record warned; the studio
  // paused at the first embedding without a word).
  void theDialogRefusesWhatCouldNeverPauseTheSessionAndWarnsOfAnotherSeed() {
    QStandardPaths::setTestModeEnabled(true);
    const QString ref = views::test::tempDir() + "/seed0.db";
    QVERIFY(views::test::recordFixture(ref, "--steps 1 --seed 0 --md5", "KEEL_TEST_PERTURB="));
    studio::BreakpointsDialog dlg({});
    dlg.setSession(1, 10);
    auto* kind = dlg.findChild<QComboBox*>("breakpointKind");
    auto* value = dlg.findChild<QComboBox*>("breakpointValue");
    auto* hits = dlg.findChild<QSpinBox*>("breakpointHits");
    auto* add = dlg.findChild<QPushButton*>("breakpointAdd");
    auto* err = dlg.findChild<QLabel*>("breakpointError");
    QVERIFY(kind && value && hits && add && err);
    auto tryAdd = [&](const QString& k, const QString& v, int n) {
      kind->setCurrentIndex(kind->findData(k));
      value->setCurrentText(v);
      hits->setValue(n);
      QTest::mouseClick(add, Qt::LeftButton);
      return err->isHidden() ? QString() : err->text();
    };
    QCOMPARE(tryAdd("step:", "99", 0),
             QString("step:99 lies past the session's 10 steps: it would never pause it"));
    QCOMPARE(dlg.table()->rowCount(), 0);
    QCOMPARE(tryAdd("step:", "2", 0), QString());
    QVERIFY(!hits->isEnabled());  // a step ends once: no hit count
    QCOMPARE(tryAdd("nan", "", 0), QString());
    QCOMPARE(tryAdd("nan", "", 0), QString("nan is in the list already"));
    QCOMPARE(dlg.table()->rowCount(), 2);
    const QString warned = tryAdd("md5-ref:", ref, 0);
    QCOMPARE(dlg.table()->rowCount(), 3);  // a warning, not a refusal
    QVERIFY2(warned.startsWith("Warning: " + ref +
                               " was recorded with seed 0 and this session uses seed 1: "),
             qPrintable(warned));
  }

  // Note [Op numbers per run]: a studio's second session numbers its ops from #1, as its first
  // and keel record do (it went on from the first session's last op: #2880).
  void eachSessionsRecordingNumbersItsOpsFromOne() {
    QStandardPaths::setTestModeEnabled(true);
    MainWindow w;
    w.show();
    Session* s = w.session();
    QSignalSpy finished(s, &Session::finished);
    for (int i = 1; i <= 2; ++i) {
      const QString out = views::test::tempDir() + QString("/numbered-%1.db").arg(i);
      QVERIFY(studio::test::startAndRun(w, studio::test::tinySession(1, 3, out)));
      QVERIFY(QTest::qWaitFor([&] { return finished.count() >= i; }, 60000));
      storage::Recording rec = storage::Recording::open(out.toStdString());
      const auto ops = rec.stepOps(0);
      QVERIFY(!ops.empty());
      QCOMPARE(ops.front().seq, uint64_t(1));
    }
  }

  // While a session runs, the graph and the op table follow it (at most once a second): they
  // stayed on step 0, the initialisation, until the run ended.
  void aRunningSessionsViewsFollowTheRun() {
    QStandardPaths::setTestModeEnabled(true);
    MainWindow w;
    w.show();
    const studio::SessionConfig c =
        studio::test::tinySession(40, 3, views::test::tempDir() + "/follow.db");
    Session* s = w.session();
    QList<qint64> whileRunning;
    connect(&w, &MainWindow::stepShown, this, [&](qint64 step) {
      if (s->state() == Session::State::Running) whileRunning << step;
    });
    QSignalSpy finished(s, &Session::finished);
    QVERIFY(studio::test::startAndRun(w, c));
    QVERIFY(QTest::qWaitFor([&] { return finished.count() >= 1; }, 120000));
    QVERIFY2(std::any_of(whileRunning.begin(), whileRunning.end(), [](qint64 v) { return v >= 1; }),
             qPrintable(QString::number(whileRunning.size())));
    // Following to the end: the last step is shown once the run ends. (The spy counts the
    // session's `finished` on the worker's thread; the window handles it later, through its
    // queue: waiting for idle at once could look before the window had begun to.)
    QVERIFY(QTest::qWaitFor([&] { return w.currentStep() && w.currentStep()->step == 40; }, 30000));
    QVERIFY(studio::test::waitIdle(w));
    QCOMPARE(w.currentStep()->step, int64_t(40));
  }

  // The Breakpoints dialog is a list: rows made from a kind, a value and a hit count, each on or
  // off, and a bad item keeps the dialog open with capture's error. A live session pauses at a
  // step-level breakpoint (step 1) between steps; a disabled one (op:matmul) never hits.
  void breakpointListEditsAndStepBreakpointPausesBetweenSteps() {
    QStandardPaths::setTestModeEnabled(true);
    studio::Breakpoints start;
    start.add("op:matmul", false);
    studio::BreakpointsDialog dlg(start);
    QTableWidget* table = dlg.table();
    QCOMPARE(table->rowCount(), 1);
    QCOMPARE(table->item(0, 0)->checkState(), Qt::Unchecked);
    auto* kind = dlg.findChild<QComboBox*>("breakpointKind");
    auto* value = dlg.findChild<QComboBox*>("breakpointValue");
    auto* hits = dlg.findChild<QSpinBox*>("breakpointHits");
    auto* add = dlg.findChild<QPushButton*>("breakpointAdd");
    QVERIFY(kind && value && hits && add);
    kind->setCurrentIndex(kind->findData("step:"));
    value->setCurrentText("1");
    QTest::mouseClick(add, Qt::LeftButton);
    kind->setCurrentIndex(kind->findData("grad-norm>"));
    value->setCurrentText("1e9");
    hits->setValue(2);
    QTest::mouseClick(add, Qt::LeftButton);
    kind->setCurrentIndex(kind->findData("loss>"));
    value->setCurrentText("3");
    hits->setValue(0);
    QTest::mouseClick(add, Qt::LeftButton);
    QCOMPARE(table->rowCount(), 4);
    studio::Breakpoints b = dlg.breakpoints();
    QCOMPARE(b.list.size(), 4);
    QCOMPARE(b.list[0], (studio::Breakpoint{"op:matmul", false}));
    QCOMPARE(b.list[1], (studio::Breakpoint{"step:1", true}));
    QCOMPARE(b.list[2], (studio::Breakpoint{"grad-norm>1e9@2", true}));
    QCOMPARE(b.list[3], (studio::Breakpoint{"loss>3*mean", true}));
    QVERIFY(b.error().isEmpty());
    // A bad row: OK says why and the dialog stays open.
    dlg.addBreakpoint("step:zero");
    dlg.show();
    auto* box = dlg.findChild<QDialogButtonBox*>();
    QTest::mouseClick(box->button(QDialogButtonBox::Ok), Qt::LeftButton);
    QVERIFY(dlg.isVisible());
    auto* err = dlg.findChild<QLabel*>("breakpointError");
    QVERIFY2(err->text().contains("step:zero"), qPrintable(err->text()));
    table->selectRow(4);
    QTest::mouseClick(dlg.findChild<QPushButton*>("breakpointRemove"), Qt::LeftButton);
    QCOMPARE(table->rowCount(), 4);
    QVERIFY(err->isHidden());  // the removed row's error goes with it (it stayed on screen)
    // Add checks the item at once: it is not listed, and the error says why.
    kind->setCurrentIndex(kind->findData("step:"));
    value->setCurrentText("abc");
    QTest::mouseClick(add, Qt::LeftButton);
    QCOMPARE(table->rowCount(), 4);
    QVERIFY(!err->isHidden());
    QVERIFY2(err->text().contains("step:abc"), qPrintable(err->text()));
    value->setCurrentText("2");
    QTest::mouseClick(add, Qt::LeftButton);
    QCOMPARE(table->rowCount(), 5);
    QVERIFY(err->isHidden());
    table->removeRow(4);
    QTest::mouseClick(box->button(QDialogButtonBox::Ok), Qt::LeftButton);
    QCOMPARE(dlg.result(), int(QDialog::Accepted));

    MainWindow w;
    w.show();
    const studio::SessionConfig c =
        studio::test::tinySession(3, 3, views::test::tempDir() + "/steps.db");
    Session* s = w.session();
    s->setBreakpoints(dlg.breakpoints());
    QSignalSpy paused(s, &Session::pausedAt);
    QSignalSpy finished(s, &Session::finished);
    QVERIFY(studio::test::startAndRun(w, c));
    QVERIFY(QTest::qWaitFor([&] { return paused.count() >= 1; }, 60000));
    QCOMPARE(paused.first().at(1).toLongLong(), qint64(1));
    QCOMPARE(paused.first().at(2).toString(), QString("breakpoint: step 1"));
    QVERIFY(QTest::qWaitFor([&] { return s->state() == Session::State::Paused; }, 10000));
    QCOMPARE(s->stepsDone(), int64_t(1));
    // Paused after step 1's last op: it is the recording's last op so far.
    storage::Recording rec = storage::Recording::open(c.output.toStdString(), false);
    const auto ops = rec.stepOps(1);
    QVERIFY(!ops.empty());
    QCOMPARE(paused.first().at(0).toULongLong(), quint64(ops.back().seq));
    s->run();
    QVERIFY(QTest::qWaitFor([&] { return finished.count() >= 1; }, 60000));
    QCOMPARE(paused.count(), 1);
    QCOMPARE(s->stepsDone(), int64_t(3));
  }

  // "Break here" in the op table's context menu adds "op:NAME in SCOPE" for that op; the run
  // then pauses after that op of the next step.
  void breakHereInTheOpTablePausesAtThatOpNextStep() {
    QStandardPaths::setTestModeEnabled(true);
    MainWindow w;
    w.show();
    const studio::SessionConfig c =
        studio::test::tinySession(3, 3, views::test::tempDir() + "/here.db");
    Session* s = w.session();
    studio::Breakpoints b;
    b.add("step:1");
    s->setBreakpoints(b);
    QSignalSpy paused(s, &Session::pausedAt);
    QSignalSpy shown(&w, &MainWindow::stepShown);
    QVERIFY(studio::test::startAndRun(w, c));
    QVERIFY(QTest::qWaitFor([&] { return paused.count() >= 1; }, 60000));
    QVERIFY(QTest::qWaitFor([&] { return w.currentStep() && w.currentStep()->step == 1; }, 20000));
    // The row of step 1's first forward matmul in blocks.0.mlp.w2.
    QTableView* table = w.opTable()->table();
    QAbstractItemModel* m = table->model();
    int row = -1;
    for (int r = 0; r < m->rowCount() && row < 0; ++r)
      if (m->index(r, views::OpTableModel::Name).data().toString() == "matmul" &&
          m->index(r, views::OpTableModel::Scope).data().toString() == "blocks.0.mlp.w2")
        row = r;
    QVERIFY(row >= 0);
    table->scrollTo(m->index(row, 0));
    const QPoint at = table->visualRect(m->index(row, 1)).center();
    bool triggered = false;
    chooseFromNextMenu("Break here", &triggered);
    emit table->customContextMenuRequested(at);
    QVERIFY(QTest::qWaitFor([&] { return triggered; }, 5000));
    studio::Breakpoints now = s->breakpoints();
    QCOMPARE(now.list.size(), 2);
    QCOMPARE(now.list[1].item, QString("op:matmul in blocks.0.mlp.w2"));
    // The graph's context menu on step 1's first forward matmul (blocks.0.attn.qkv).
    uint64_t normSeq = 0;
    for (const auto& o : w.currentStep()->ops)
      if (o.name == "matmul" && o.phase == Phase::Forward && !normSeq) normSeq = o.seq;
    QVERIFY(normSeq);
    views::GraphView* g = w.graphView(views::Side::A);
    w.selection()->select(views::Side::A, normSeq, true);  // the graph reveals and centres it
    QVERIFY(studio::test::waitIdle(w, 20000));
    QVERIFY2(QTest::qWaitFor([&] { return g->opItem(normSeq) != nullptr; }, 5000),
             qPrintable(QString("step %1, %2 op nodes, %3 module nodes, seq %4")
                            .arg(g->step() ? g->step()->step : -1)
                            .arg(g->visibleOpNodeCount())
                            .arg(g->moduleNodeCount())
                            .arg(normSeq)));
    QAbstractGraphicsShapeItem* node = g->opItem(normSeq);
    QGraphicsView* gv = g->graphicsView();
    gv->centerOn(node);
    QApplication::processEvents();
    const QPoint nodeAt = gv->mapFromScene(node->sceneBoundingRect().center());
    triggered = false;
    chooseFromNextMenu("Break here", &triggered);
    QContextMenuEvent ev(QContextMenuEvent::Mouse, nodeAt, gv->viewport()->mapToGlobal(nodeAt));
    QApplication::sendEvent(gv->viewport(), &ev);
    QVERIFY(QTest::qWaitFor([&] { return triggered; }, 5000));
    now = s->breakpoints();
    QCOMPARE(now.list.size(), 3);
    QCOMPARE(now.list[2].item, QString("op:matmul in blocks.0.attn.qkv"));
    now.list[2].enabled = false;  // off again: the matmul one is what the run meets next
    s->setBreakpoints(now);
    s->run();
    QVERIFY(QTest::qWaitFor([&] { return paused.count() >= 2; }, 60000));
    QCOMPARE(paused.last().at(1).toLongLong(), qint64(2));
    QCOMPARE(paused.last().at(2).toString(), QString("breakpoint: op matmul in blocks.0.mlp.w2"));
    storage::Recording rec = storage::Recording::open(c.output.toStdString(), false);
    auto op = rec.op(paused.last().at(0).toULongLong());
    QVERIFY(op);
    QCOMPARE(QString::fromStdString(op->scope), QString("blocks.0.mlp.w2"));
    QCOMPARE(op->step, int64_t(2));
    s->stop();
    QVERIFY(QTest::qWaitFor([&] { return s->state() == Session::State::Idle; }, 30000));
  }
};

QTEST_MAIN(SessionBreakpointTest)
#include "session_breakpoint_test.moc"
