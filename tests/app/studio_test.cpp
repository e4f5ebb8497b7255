// Keel Studio end to end, driving the real window offscreen: replay, selection shared between
// views, comparison with an injected divergence, a live session stepped one step at a time with an
// op breakpoint, and bad input (a file that is no recording, a recording damaged inside) that
// shows a dialog while the app keeps running.
#include <QAbstractGraphicsShapeItem>
#include <QAction>
#include <QApplication>
#include <QComboBox>
#include <QDockWidget>
#include <QGraphicsView>
#include <QGuiApplication>
#include <QLabel>
#include <QLineEdit>
#include <QMenu>
#include <QMessageBox>
#include <QPlainTextEdit>
#include <QProcess>
#include <QPushButton>
#include <QScreen>
#include <QScrollBar>
#include <QSettings>
#include <QSignalSpy>
#include <QSpinBox>
#include <QStandardPaths>
#include <QStatusBar>
#include <QTabBar>
#include <QTableView>
#include <QTextEdit>
#include <QTimer>
#include <QToolBar>
#include <QTreeWidget>
#include <QtTest>
#include <cstdlib>

#include "dialogs.h"
#include "keel/storage/diff.h"
#include "keel/storage/reader.h"
#include "keel/views/diff_view.h"
#include "keel/views/graph_view.h"
#include "keel/views/inspector.h"
#include "keel/views/nonfinite_banner.h"
#include "keel/views/run_source.h"
#include "keel/views/selection.h"
#include "main_window.h"
#include "studio_test_util.h"
#include "view_test_util.h"

using namespace keel;
using keel::studio::MainWindow;
using keel::studio::Session;
using keel::studio::test::waitIdle;
using keel::views::Side;

namespace {

// Opens `path` in `w` and waits until its first step is shown and nothing is left to load.
bool openAndWait(MainWindow& w, const QString& path) {
  QSignalSpy shown(&w, &MainWindow::stepShown);
  w.openRecording(path);
  return QTest::qWaitFor([&] { return shown.count() >= 1; }, 30000) && waitIdle(w);
}

// Opens `a`, compares it with `b`, and waits until the diff is shown and nothing is left to load.
bool compareAndWait(MainWindow& w, const QString& a, const QString& b) {
  QSignalSpy opened(&w, &MainWindow::recordingOpened);
  QSignalSpy diffed(&w, &MainWindow::diffShown);
  w.openRecording(a);
  if (!QTest::qWaitFor([&] { return opened.count() >= 1; }, 30000)) return false;
  w.compareWith(b);
  return QTest::qWaitFor([&] { return diffed.count() >= 1; }, 60000) && waitIdle(w);
}

// All text shown by a widget tree (labels, line edits, tables, trees, text edits).
QString allText(QWidget* root) {
  QString out;
  for (QObject* o : root->findChildren<QObject*>()) {
    if (auto* l = qobject_cast<QLabel*>(o)) out += l->text() + "\n";
    if (auto* t = qobject_cast<QAbstractItemView*>(o)) {
      QAbstractItemModel* m = t->model();
      if (!m) continue;
      std::function<void(const QModelIndex&)> walk = [&](const QModelIndex& parent) {
        for (int r = 0; r < m->rowCount(parent); ++r)
          for (int c = 0; c < m->columnCount(parent); ++c) {
            QModelIndex i = m->index(r, c, parent);
            out += i.data().toString() + "\t";
            if (c == 0) walk(i);
          }
      };
      walk({});
    }
    if (auto* e = qobject_cast<QPlainTextEdit*>(o)) out += e->toPlainText() + "\n";
    if (auto* e = qobject_cast<QTextEdit*>(o)) out += e->toPlainText() + "\n";
  }
  return out;
}

}  // namespace

class StudioTest : public QObject {
  Q_OBJECT
  // 5,000 bytes of 'x' in the test folder: not a recording, not even SQLite.
  QString garbageFile(const QString& name) {
    const QString path = dir_ + "/" + name;
    QFile f(path);
    if (f.open(QIODevice::WriteOnly)) f.write(QByteArray(5000, 'x'));
    return path;
  }

 private slots:
  // The first window fits the screen it opens on (a 1366x768 laptop; the offscreen platform's
  // screen here is smaller than the 1400x900 default), so no dock is cut off at the right edge.
  void theFirstWindowFitsTheScreen() {
    QSettings().remove("window");  // no saved geometry: the first window
    MainWindow w;
    const QSize room = QGuiApplication::primaryScreen()->availableGeometry().size();
    QVERIFY2(room.width() < 1400 || room.height() < 900, "the test needs a screen under 1400x900");
    QVERIFY(w.width() <= room.width());
    QVERIFY(w.height() <= room.height());
  }
  void initTestCase() {
    QStandardPaths::setTestModeEnabled(true);
    dir_ = views::test::tempDir();
    QVERIFY(
        views::test::recordFixture(dir_ + "/a.db", "--steps 2 --seed 7 --md5 --stats --stacks"));
    QVERIFY(views::test::recordFixture(dir_ + "/b.db", "--steps 2 --seed 7 --md5 --stats --stacks",
                                       "KEEL_TEST_PERTURB=matmul:5"));
    QVERIFY(views::test::recordFixture(dir_ + "/nan.db", "--steps 2 --seed 7 --stats",
                                       "KEEL_TEST_PERTURB=matmul:20:nan"));
  }

  // The first NaN/Inf is named in the status bar and above the inspector; its button shows the
  // op's step and selects the op there (graph, op table, inspector).
  void firstNonFiniteBannerNamesTheOpAndSelectsIt() {
    storage::Recording rec = storage::Recording::open((dir_ + "/nan.db").toStdString());
    auto bad = rec.firstNonFinite();
    QVERIFY(bad);
    QCOMPARE(QString::fromStdString(bad->name), QString("matmul"));
    QCOMPARE(bad->step, int64_t(1));
    MainWindow w;
    w.show();
    QSignalSpy shown(&w, &MainWindow::stepShown);
    w.showStepOnOpen(2);
    w.openRecording(dir_ + "/nan.db");
    QVERIFY(QTest::qWaitFor([&] { return shown.count() >= 1; }, 30000));
    QVERIFY(waitIdle(w));
    QCOMPARE(w.currentStep()->step, int64_t(2));
    const QString expected = QString("first NaN/Inf: step 1, #%1 matmul, %2 — output 0: ")
                                 .arg(bad->seq)
                                 .arg(QString::fromStdString(bad->scope));
    for (views::NonFiniteBanner* b : {w.statusNonFiniteBanner(), w.inspectorNonFiniteBanner()}) {
      QVERIFY(b->isVisible());
      QVERIFY2(b->text().startsWith(expected), qPrintable(b->text() + " vs " + expected));
      QVERIFY2(b->text().contains(QRegularExpression(" output 0: \\d+ NaN")),
               qPrintable(b->text()));
    }
    QCOMPARE(w.statusNonFiniteBanner()->text(), views::nonFiniteBannerText(*bad));
    QSignalSpy inspected(&w, &MainWindow::opInspected);
    QTest::mouseClick(w.inspectorNonFiniteBanner()->selectButton(), Qt::LeftButton);
    QVERIFY(QTest::qWaitFor([&] { return inspected.count() >= 1; }, 20000));
    QVERIFY(waitIdle(w));
    QCOMPARE(w.currentStep()->step, int64_t(1));
    QCOMPARE(w.selection()->current(Side::A), std::optional<uint64_t>(bad->seq));
    QCOMPARE(inspected.last().at(0).toULongLong(), quint64(bad->seq));
    QVERIFY(w.graphView(Side::A)->opItem(bad->seq));
    // A clean run has no banner.
    w.openRecording(dir_ + "/a.db");
    QVERIFY(QTest::qWaitFor([&] { return shown.count() >= 3; }, 30000));
    QVERIFY(waitIdle(w));
    QVERIFY(!w.statusNonFiniteBanner()->isVisible());
    QVERIFY(!w.inspectorNonFiniteBanner()->isVisible());
  }

  // Opened without a step asked for, a run that went NaN opens at its first NaN/Inf op, selected
  // and on screen: what the user opened it for.
  void aNaNRunOpensAtItsFirstNaNSelectedAndInView() {
    storage::Recording rec = storage::Recording::open((dir_ + "/nan.db").toStdString());
    const auto bad = rec.firstNonFinite();
    QVERIFY(bad);
    MainWindow w;
    w.resize(1366, 768);
    w.show();
    QSignalSpy inspected(&w, &MainWindow::opInspected);
    QVERIFY(openAndWait(w, dir_ + "/nan.db"));
    QVERIFY(QTest::qWaitFor([&] { return inspected.count() >= 1; }, 20000));
    QVERIFY(waitIdle(w));
    QCOMPARE(w.currentStep()->step, bad->step);
    QCOMPARE(w.selection()->current(Side::A), std::optional<uint64_t>(bad->seq));
    QCOMPARE(inspected.last().at(0).toULongLong(), quint64(bad->seq));
    views::GraphView* g = w.graphView(Side::A);
    QVERIFY(g->opItem(bad->seq));
    QGraphicsView* gv = g->graphicsView();
    const QRectF onScreen = gv->mapToScene(gv->viewport()->rect()).boundingRect();
    QVERIFY2(onScreen.contains(g->opItem(bad->seq)->sceneBoundingRect().center()),
             "the first NaN op is not in the graph's view");
    // A clean run opens at its first step with nothing selected, as before.
    QVERIFY(openAndWait(w, dir_ + "/a.db"));
    QCOMPARE(w.currentStep()->step, int64_t(1));
    QCOMPARE(w.selection()->current(Side::A), std::nullopt);
  }

  void openingFillsGraphWithTheStepsOps() {
    MainWindow w;
    w.show();
    QVERIFY(openAndWait(w, dir_ + "/a.db"));
    storage::Recording rec = storage::Recording::open((dir_ + "/a.db").toStdString());
    int graphOps = 0;
    for (const auto& o : rec.stepOps(1))
      if (o.phase != Phase::Optimizer) ++graphOps;
    views::GraphView* g = w.graphView(Side::A);
    g->expandAll();
    QVERIFY(waitIdle(w));
    QCOMPARE(g->visibleOpNodeCount(), graphOps);
    QVERIFY(w.summary(Side::A));
    QCOMPARE(int(w.summary(Side::A)->steps.size()), 2);
  }

  void selectingAnOpFillsTheInspectorWithStackAndMd5() {
    MainWindow w;
    w.show();
    QVERIFY(openAndWait(w, dir_ + "/a.db"));
    storage::Recording rec = storage::Recording::open((dir_ + "/a.db").toStdString());
    storage::OpRecord target;
    for (const auto& o : rec.stepOps(1))
      if (o.name == "matmul" && o.phase == Phase::Forward) {
        target = o;
        break;
      }
    QVERIFY(target.seq != 0);
    QSignalSpy inspected(&w, &MainWindow::opInspected);
    // Click the op's node in the graph.
    views::GraphView* g = w.graphView(Side::A);
    QAbstractGraphicsShapeItem* node = g->opItem(target.seq);
    QVERIFY2(node, "the forward matmul has no node in the opened graph");
    QGraphicsView* gv = g->graphicsView();
    gv->centerOn(node);
    QApplication::processEvents();
    const QPoint at = gv->mapFromScene(node->sceneBoundingRect().center());
    QTest::mouseClick(gv->viewport(), Qt::LeftButton, {}, at);
    QVERIFY(QTest::qWaitFor([&] { return inspected.count() >= 1; }, 10000));
    QCOMPARE(inspected.last().at(0).toULongLong(), quint64(target.seq));
    QString text = allText(w.inspector());
    std::string md5;
    for (const auto& t : target.tensors)
      if (t.role == storage::Role::Output) md5 = t.md5;
    QVERIFY(!md5.empty());
    QVERIFY2(text.contains(QString::fromStdString(md5)), "inspector lacks the output MD5");
    auto stack = rec.stack(target.stackId);
    QVERIFY(stack && !stack->frames.empty());
    QVERIFY2(text.contains(QString::fromStdString(stack->frames[0].function).left(20)),
             "inspector lacks the stack");
  }

  void diffViewPutsTheInjectedDivergenceFirst() {
    MainWindow w;
    w.show();
    QVERIFY(compareAndWait(w, dir_ + "/a.db", dir_ + "/b.db"));
    views::DiffPtr report = w.diffReport();
    QVERIFY(report && report->first);
    QCOMPARE(QString::fromStdString(report->first->pair.name), QString("matmul"));
    auto* table = w.diffView()->findChild<QTableView*>();
    QVERIFY(table);
    QAbstractItemModel* m = table->model();
    QVERIFY(m->rowCount() > 0);
    QString row0;
    for (int c = 0; c < m->columnCount(); ++c) row0 += m->index(0, c).data().toString() + " ";
    QVERIFY2(row0.contains("matmul"), qPrintable(row0));
    QVERIFY2(row0.contains(QString::number(report->first->pair.seqA)), qPrintable(row0));
    // Clicking the row selects the pair in both graphs.
    QSignalSpy sel(w.selection(), &views::Selection::selected);
    table->setCurrentIndex(m->index(0, 0));
    QTest::mouseClick(table->viewport(), Qt::LeftButton, {},
                      table->visualRect(m->index(0, 0)).center());
    QVERIFY(QTest::qWaitFor([&] { return w.selection()->current(Side::B).has_value(); }, 5000));
    QCOMPARE(*w.selection()->current(Side::A), report->first->pair.seqA);
    QCOMPARE(*w.selection()->current(Side::B), report->first->pair.seqB);
    QVERIFY(w.graphView(Side::B)->isVisible());
  }

  // One phase selector: the graph's own, with every phase; the compared graph follows it.
  void onePhaseSelectorOffersEveryPhaseAndDrivesBothGraphs() {
    MainWindow w;
    w.show();
    QSignalSpy opened(&w, &MainWindow::recordingOpened);
    w.openRecording(dir_ + "/a.db");
    QVERIFY(QTest::qWaitFor([&] { return opened.count() >= 1; }, 30000));
    w.compareWith(dir_ + "/b.db");
    QVERIFY(QTest::qWaitFor([&] { return opened.count() >= 2; }, 30000));
    QVERIFY(waitIdle(w, 60000));
    auto* toolbar = w.findChild<QToolBar*>("toolbar.main");
    QVERIFY(toolbar);
    // No phase selector in the toolbar; its only combos are a run folder's rank selectors,
    // hidden for a single recording.
    for (auto* c : toolbar->findChildren<QComboBox*>()) {
      QVERIFY(c->findData("optimizer") < 0 && c->findText("optimizer") < 0);
      QVERIFY(!c->isVisible());
    }
    QComboBox* phases = nullptr;
    for (auto* c : w.graphView(Side::A)->findChildren<QComboBox*>())
      if (c->findData("optimizer") >= 0) phases = c;
    QVERIFY(phases);
    for (const char* p : {"both", "forward", "backward", "optimizer"})
      QVERIFY(phases->findData(p) >= 0);
    phases->setCurrentIndex(phases->findData("optimizer"));
    QCOMPARE(w.graphView(Side::A)->phaseFilter(), QString("optimizer"));
    QCOMPARE(w.graphView(Side::B)->phaseFilter(), QString("optimizer"));
    QVERIFY(waitIdle(w, 60000));
    QVERIFY(w.graphView(Side::A)->visibleOpNodeCount() > 0);
    w.graphView(Side::B)->setPhaseFilter("backward");
    QCOMPARE(w.graphView(Side::A)->phaseFilter(), QString("backward"));
    QCOMPARE(phases->currentData().toString(), QString("backward"));
  }

  void steppingALiveSessionAdvancesExactlyOneStep() {
    MainWindow w;
    w.show();
    studio::SessionConfig c = studio::test::tinySession(3, 2, dir_ + "/live.db");
    c.capture.md5 = c.capture.stats = c.capture.stacks = true;
    Session* s = w.session();
    QSignalSpy started(s, &Session::started);
    QSignalSpy stepped(s, &Session::stepFinished);
    w.startSession(c);
    QVERIFY(QTest::qWaitFor([&] { return started.count() >= 1; }, 30000));
    QVERIFY(QTest::qWaitFor([&] { return s->state() == Session::State::Paused; }, 30000));
    QCOMPARE(s->stepsDone(), int64_t(0));
    s->step();
    QVERIFY(QTest::qWaitFor([&] { return stepped.count() >= 1; }, 30000));
    QVERIFY(QTest::qWaitFor([&] { return s->state() == Session::State::Paused; }, 30000));
    QCOMPARE(stepped.count(), 1);
    QCOMPARE(stepped.first().at(0).toLongLong(), qint64(1));
    QCOMPARE(s->stepsDone(), int64_t(1));
    {
      storage::Recording rec = storage::Recording::open(c.output.toStdString(), false);
      auto steps = rec.steps();
      QCOMPARE(int(steps.size()), 1);
      QCOMPARE(steps[0].step, int64_t(1));
      QVERIFY(steps[0].endNs > 0);
      QVERIFY(rec.stepOps(1).size() > 100);
    }
    QVERIFY(QTest::qWaitFor(
        [&] { return w.summary(Side::A) && !w.summary(Side::A)->steps.empty(); }, 10000));

    // An op breakpoint pauses inside step 2, right after the first attention op, which is
    // committed and selected.
    studio::Breakpoints b;
    b.add("op:flashmask_attention");
    s->setBreakpoints(b);
    QSignalSpy paused(s, &Session::pausedAt);
    s->run();
    QVERIFY(QTest::qWaitFor([&] { return paused.count() >= 1; }, 30000));
    const quint64 seq = paused.first().at(0).toULongLong();
    QCOMPARE(paused.first().at(1).toLongLong(), qint64(2));
    QVERIFY(paused.first().at(2).toString().contains("flashmask_attention"));
    {
      storage::Recording rec = storage::Recording::open(c.output.toStdString(), false);
      auto op = rec.op(seq);
      QVERIFY(op.has_value());
      QCOMPARE(QString::fromStdString(op->name), QString("flashmask_attention"));
    }
    QVERIFY(QTest::qWaitFor([&] { return w.selection()->current(Side::A) == seq; }, 10000));
    s->setBreakpoints({});
    QSignalSpy finished(s, &Session::finished);
    s->run();
    QVERIFY(QTest::qWaitFor([&] { return finished.count() >= 1; }, 60000));
    QCOMPARE(s->state(), Session::State::Finished);
    storage::Recording rec = storage::Recording::open(c.output.toStdString());
    QCOMPARE(int(rec.steps().size()), 3);
    QCOMPARE(QString::fromStdString(rec.run().status), QString("finished"));
  }

  // A recording that opens but is wrong inside (Note [Damaged recordings]) shows the reader's one
  // line in a dialog: a forward link to the op itself (a cycle of one) when its step is shown, and
  // a dump claiming 3 GiB when its op is inspected (it made the studio take 3.2 GB).
  void damagedRecordingsShowTheReadersLineInADialog() {
    uint64_t backward = 0, first = 0;
    {
      storage::Recording rec = storage::Recording::open((dir_ + "/a.db").toStdString());
      storage::OpQuery q;
      q.step = 1;
      q.withTensors = false;
      for (const storage::OpRecord& o : rec.ops(q)) {
        if (!first) first = o.seq;
        if (!backward && o.forwardSeq) backward = o.seq;
      }
    }
    QVERIFY(backward && first);
    auto damaged = [&](const QString& name, const std::string& sql) {
      const QString path = dir_ + "/" + name;
      QFile::remove(path);
      if (!QFile::copy(dir_ + "/a.db", path)) return QString();
      const std::string cmd =
          "python3 -c \"import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); "
          "c.executescript(sys.argv[2]); c.commit()\" '" +
          path.toStdString() + "' \"" + sql + "\"";
      return std::system(cmd.c_str()) == 0 ? path : QString();
    };
    const QString cycle = damaged(
        "cycle.db", "UPDATE ops SET forward_seq = seq WHERE seq = " + std::to_string(backward));
    QVERIFY(!cycle.isEmpty());
    MainWindow w;
    w.show();
    QSignalSpy err(&w, &MainWindow::errorShown);
    w.showStepOnOpen(1);
    w.openRecording(cycle);
    QVERIFY(QTest::qWaitFor([&] { return err.count() >= 1; }, 30000));
    const QString b = QString::number(backward);
    QCOMPARE(err.last().at(0).toString(), "damaged recording " + cycle + ": op " + b +
                                              " links to forward op " + b +
                                              ", which did not run before it, in ops row " + b);
    QVERIFY(w.findChild<QMessageBox*>("errorDialog"));

    const QString dump = damaged(
        "dump.db",
        "INSERT INTO dumps(op_seq, role, idx, dtype_sid, shape, codec_sid, raw_bytes, data) "
        "VALUES (" +
            std::to_string(first) +
            ", 1, 0, (SELECT id FROM strings WHERE text = 'float32'), '2', (SELECT id FROM "
            "strings WHERE text = 'float32'), 3 << 30, x'00')");
    QVERIFY(!dump.isEmpty());
    QSignalSpy shown(&w, &MainWindow::stepShown);
    w.showStepOnOpen(1);
    w.openRecording(dump);
    QVERIFY(QTest::qWaitFor([&] { return shown.count() >= 1; }, 30000));
    QVERIFY(waitIdle(w));
    const int before = err.count();
    w.selection()->select(Side::A, first);
    QVERIFY(QTest::qWaitFor([&] { return err.count() > before; }, 30000));
    QCOMPARE(err.last().at(0).toString(),
             "damaged recording " + dump + ": dump of op " + QString::number(first) +
                 " output 0 claims 3221225472 bytes (out of range 0 .. 2^30), in dumps row 1");
    // Still alive: the undamaged recording opens afterwards.
    w.openRecording(dir_ + "/a.db");
    QVERIFY(QTest::qWaitFor([&] { return shown.count() >= 2; }, 30000));
  }

  void badFilesShowADialogAndTheAppKeepsRunning() {
    MainWindow w;
    w.show();
    const QString bad = garbageFile("garbage.db");
    QSignalSpy err(&w, &MainWindow::errorShown);
    w.openRecording(bad);
    QVERIFY(QTest::qWaitFor([&] { return err.count() >= 1; }, 10000));
    QVERIFY(err.first().at(0).toString().contains("not an SQLite file"));
    QVERIFY(w.findChild<QMessageBox*>("errorDialog"));
    // A truncated copy of a real recording.
    QString cut = dir_ + "/truncated.db";
    QFile::remove(cut);
    QVERIFY(QFile::copy(dir_ + "/a.db", cut));
    QFile t(cut);
    QVERIFY(t.open(QIODevice::ReadWrite));
    QVERIFY(t.resize(t.size() / 3));
    t.close();
    w.openRecording(cut);
    QVERIFY(QTest::qWaitFor([&] { return err.count() >= 2; }, 10000));
    // Still alive: a good recording opens afterwards.
    QSignalSpy shown(&w, &MainWindow::stepShown);
    w.openRecording(dir_ + "/a.db");
    QVERIFY(QTest::qWaitFor([&] { return shown.count() >= 1; }, 30000));
    // A bad session config fails the session, not the app.
    studio::SessionConfig c;
    c.configPath = dir_ + "/no-such-config.json";
    c.output = dir_ + "/never.db";
    QSignalSpy failed(w.session(), &Session::failed);
    w.startSession(c);
    QVERIFY(QTest::qWaitFor([&] { return failed.count() >= 1; }, 10000));
    QVERIFY(failed.first().at(0).toString().contains("no-such-config.json"));
    QCOMPARE(w.session()->state(), Session::State::Failed);
  }

  // File > Save screenshot follows --screenshot's rule: it wrote a PNG over a recording that was
  // not the open one (the file dialog's own "replace?" was all that asked). A name that is not
  // .png, a file that is not a picture, or the open recording: refused in a dialog, the file as it
  // was; a .png is written.
  void saveScreenshotNeverReplacesARecording() {
    MainWindow w;
    w.show();
    w.openRecording(dir_ + "/a.db");
    QVERIFY(waitIdle(w));
    const QString other = dir_ + "/other.db";
    QFile::remove(other);
    QVERIFY(QFile::copy(dir_ + "/b.db", other));
    const QByteArray before = [&] {
      QFile f(other);
      return f.open(QIODevice::ReadOnly) ? f.readAll() : QByteArray();
    }();
    QSignalSpy err(&w, &MainWindow::errorShown);
    QVERIFY(!w.saveScreenshotAs(other));
    QVERIFY2(err.last().first().toString().contains("name the file .png"),
             qPrintable(err.last().first().toString()));
    const QString disguised = dir_ + "/other.png";  // a recording named .png
    QFile::remove(disguised);
    QVERIFY(QFile::copy(other, disguised));
    QVERIFY(!w.saveScreenshotAs(disguised));
    QVERIFY2(err.last().first().toString().contains("is not a PNG picture"),
             qPrintable(err.last().first().toString()));
    QVERIFY(!w.saveScreenshotAs(dir_ + "/a.db"));
    for (const QString& f : {other, disguised}) {
      QFile in(f);
      QVERIFY(in.open(QIODevice::ReadOnly));
      QCOMPARE(in.readAll(), before);
    }
    const QString shot = dir_ + "/shot.png";
    QFile::remove(shot);
    QVERIFY(w.saveScreenshotAs(shot));
    QVERIFY(w.saveScreenshotAs(shot));  // a picture replaced by a picture
    QFile png(shot);
    QVERIFY(png.open(QIODevice::ReadOnly));
    QCOMPARE(png.read(4), QByteArray("\x89PNG"));
  }

  // File > Export (Note [Studio exports]): the step shown as a Chrome trace, its graph as SVG, the
  // op calls as CSV, written by keel export; a file that is no earlier export (a recording) is
  // refused in a dialog and left as it was.
  void exportWritesWhatKeelExportWrites() {
    MainWindow w;
    w.setKeelProgram(KEEL_CLI_PATH);
    w.show();
    w.openRecording(dir_ + "/a.db");
    QVERIFY(waitIdle(w));
    auto run = [&](const QString& kind, const QString& path) {
      QSignalSpy done(&w, &MainWindow::exportFinished);
      w.exportRecording(kind, path);
      return done.wait(60000) ? done.first().first().toString() : QString("timed out");
    };
    const QString trace = dir_ + "/step.json", svg = dir_ + "/step.svg", csv = dir_ + "/ops.csv";
    for (const QString& f : {trace, svg, csv}) QFile::remove(f);
    QCOMPARE(run("trace-step", trace), QString());
    QCOMPARE(run("graph", svg), QString());
    QCOMPARE(run("csv", csv), QString());
    auto head = [](const QString& f, int n) {
      QFile in(f);
      return in.open(QIODevice::ReadOnly) ? in.read(n) : QByteArray();
    };
    QCOMPARE(head(trace, 39), QByteArray(R"({"displayTimeUnit":"ns","traceEvents":[)"));
    QVERIFY(head(svg, 400).contains("<svg"));
    QVERIFY(head(csv, 4) == "seq,");
    // The step's trace holds step 1's ops only: fewer bytes than the whole run's.
    const QString whole = dir_ + "/whole.json";
    QFile::remove(whole);
    QCOMPARE(run("trace", whole), QString());
    QVERIFY(QFileInfo(whole).size() > QFileInfo(trace).size());
    // Not over a recording.
    const QString other = dir_ + "/keep.db";
    QFile::remove(other);
    QVERIFY(QFile::copy(dir_ + "/b.db", other));
    const QByteArray before = head(other, 1 << 20);
    const QString error = run("csv", other);
    QVERIFY2(!error.isEmpty() && !error.startsWith("keel: error"), qPrintable(error));
    QCOMPARE(head(other, 1 << 20), before);
  }

  // Open recent: a file gone since is said and dropped from the list (it stayed, failing each
  // time).
  void aRecentFileThatIsGoneLeavesTheList() {
    const QString gone = dir_ + "/gone.db";
    QFile::remove(gone);
    QVERIFY(QFile::copy(dir_ + "/a.db", gone));
    MainWindow w;
    w.show();
    w.openRecording(gone);
    QVERIFY(waitIdle(w));
    const QString abs = QFileInfo(gone).absoluteFilePath();
    QVERIFY(QSettings().value("recentFiles").toStringList().contains(abs));
    QVERIFY(QFile::remove(gone));
    QAction* entry = nullptr;
    for (QMenu* m : w.findChildren<QMenu*>())
      for (QAction* a : m->actions())
        if (a->text() == abs) entry = a;
    QVERIFY(entry);
    QSignalSpy err(&w, &MainWindow::errorShown);
    entry->trigger();
    QCOMPARE(err.count(), 1);
    QVERIFY2(err.first().first().toString().contains("no longer exists; it is removed from Open "
                                                     "recent"),
             qPrintable(err.first().first().toString()));
    QVERIFY(!QSettings().value("recentFiles").toStringList().contains(abs));
  }

  // The step box moved by the user: an op selected in another step is let go (the inspector
  // kept describing an op of step 1 with step 2 shown and nothing selected there).
  void aStepChosenLetsGoOfAnOpOfAnotherStep() {
    MainWindow w;
    w.show();
    w.openRecording(dir_ + "/a.db");
    QVERIFY(waitIdle(w));
    QCOMPARE(w.currentStep()->step, int64_t(1));
    const uint64_t seq = w.currentStep()->ops.front().seq;
    w.selection()->select(Side::A, seq);
    QVERIFY(waitIdle(w));
    QCOMPARE(w.selection()->current(Side::A), std::optional<uint64_t>(seq));
    w.findChild<QSpinBox*>("stepSpin")->setValue(2);
    QVERIFY(QTest::qWaitFor([&] { return w.currentStep() && w.currentStep()->step == 2; }, 30000));
    QVERIFY(waitIdle(w));
    QVERIFY(!w.selection()->current(Side::A));
  }

  // The keyboard moves through a run: Alt+Left/Right the steps, Ctrl+Shift+N the first NaN/Inf
  // op, Alt+1..6 the bottom views (there was no key for any of them).
  void keysMoveThroughStepsNaNsAndViews() {
    MainWindow w;
    w.show();
    w.openRecording(dir_ + "/nan.db");
    QVERIFY(waitIdle(w));
    auto* next = w.findChild<QAction*>("nextStepAction");
    auto* prev = w.findChild<QAction*>("previousStepAction");
    auto* nan = w.findChild<QAction*>("firstNonFiniteAction");
    QVERIFY(next && prev && nan);
    QCOMPARE(next->shortcut(), QKeySequence("Alt+Right"));
    QCOMPARE(nan->shortcut(), QKeySequence("Ctrl+Shift+N"));
    const auto first = w.summary(Side::A)->firstNonFinite;
    QVERIFY(first);
    QCOMPARE(w.currentStep()->step, first->step);  // a NaN run opens at its first NaN
    prev->trigger();
    QVERIFY(QTest::qWaitFor([&] { return w.currentStep()->step == first->step - 1; }, 30000));
    prev->trigger();  // step 0 is the first: nothing before it
    QVERIFY(waitIdle(w));
    QCOMPARE(w.currentStep()->step, int64_t(0));
    next->trigger();
    QVERIFY(QTest::qWaitFor([&] { return w.currentStep()->step == 1; }, 30000));
    QVERIFY(waitIdle(w));
    w.selection()->clear();
    nan->trigger();
    QVERIFY(QTest::qWaitFor(
        [&] { return w.selection()->current(Side::A) == std::optional<uint64_t>(first->seq); },
        30000));
    QVERIFY(waitIdle(w));
    QCOMPARE(w.currentStep()->step, first->step);
    auto* memory = w.findChild<QAction*>("showView.memory");
    QVERIFY(memory);
    QCOMPARE(memory->shortcut(), QKeySequence("Alt+4"));
    memory->trigger();
    QVERIFY(waitIdle(w));
    QCOMPARE(w.raisedBottomView(), QString("memory"));
    w.findChild<QAction*>("showView.ops")->trigger();
    QCOMPARE(w.raisedBottomView(), QString("ops"));
  }

  // The New session dialog opens with the last session's settings (a failed Start lost them),
  // keeps a recording file name only while no file has it, starts at --steps' default (50, it
  // said 20), and shows the start of the recording path (it showed "/gpt-mini-2026…db").
  void theNewSessionDialogStartsFromTheLastSession() {
    studio::SessionConfig last;
    last.configPath = QString(KEEL_SOURCE_DIR) + "/tests/fixtures/gpt-tiny.json";
    last.backend = "cpu-ref";
    last.seed = 7;
    last.steps = 3;
    last.output = dir_ + "/never-written.db";
    last.capture.stacks = false;
    last.capture.md5 = true;
    last.capture.stats = false;
    last.capture.allocator = false;
    last.capture.dumps = true;
    last.capture.dumpFilter.ops = {"matmul", "softmax"};
    studio::NewSessionDialog dlg(&last);
    const studio::SessionConfig c = dlg.config();
    QCOMPARE(c.configPath, last.configPath);
    QCOMPARE(c.backend, QString("cpu-ref"));
    QCOMPARE(c.seed, uint64_t(7));
    QCOMPARE(c.steps, int64_t(3));
    QCOMPARE(c.output, last.output);
    QVERIFY(!c.capture.stacks && c.capture.md5 && !c.capture.stats && !c.capture.allocator);
    QVERIFY(c.capture.dumps);
    QCOMPARE(c.capture.dumpFilter.ops, (std::vector<std::string>{"matmul", "softmax"}));
    auto* output = dlg.findChildren<QLineEdit*>().at(0);
    for (QLineEdit* e : dlg.findChildren<QLineEdit*>())
      if (e->text() == last.output) output = e;
    QCOMPARE(output->cursorPosition(), 0);
    // A recording file that exists now is not offered again: a new name is.
    last.output = dir_ + "/a.db";
    QVERIFY(studio::NewSessionDialog(&last).config().output != last.output);
    QCOMPARE(studio::NewSessionDialog().config().steps, int64_t(50));

    // A path typed into the config box is the config that runs (Start ran the listed choice,
    // gpt-mini, whatever was typed; only Enter took the text), and names the recording file.
    studio::NewSessionDialog typed;
    auto* combo = typed.findChild<QComboBox*>();
    QVERIFY(combo && combo->isEditable());
    const QString mine = dir_ + "/my-model.json";
    combo->setEditText(mine);
    QCOMPARE(typed.config().configPath, mine);
    QVERIFY2(QFileInfo(typed.config().output).fileName().startsWith("my-model-"),
             qPrintable(typed.config().output));
    combo->setEditText("gpt-mini");  // a listed name: its file
    QVERIFY2(typed.config().configPath.endsWith("/configs/gpt-mini.json"),
             qPrintable(typed.config().configPath));

    // A recording file that is not a recording is refused on Start, at once: it asked "Replace
    // it?" and, answered Yes, the session then refused it.
    const QString notes = dir_ + "/notes.txt";
    {
      QFile f(notes);
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write("my notes");
    }
    last.output = dir_ + "/elsewhere.db";
    studio::NewSessionDialog refusing(&last);
    for (QLineEdit* e : refusing.findChildren<QLineEdit*>())
      if (e->text() == last.output) e->setText(notes);
    QStringList boxes;
    QTimer::singleShot(0, &refusing, [&] {
      if (auto* box = qobject_cast<QMessageBox*>(QApplication::activeModalWidget())) {
        boxes << box->windowTitle() + ": " + box->text();
        box->reject();
      }
    });
    refusing.accept();
    QCOMPARE(boxes.size(), 1);
    QVERIFY2(boxes[0].startsWith("Recording file: output " + notes +
                                 " exists and is not a recording; refusing to replace it"),
             qPrintable(boxes[0]));
    QVERIFY(refusing.result() != QDialog::Accepted);
  }

  // Note [Paused time]: a step held at a breakpoint for 1.5 s keeps its tokens/s (the pause is
  // left out; it read about 100 times lower) and its log says how long it was held.
  void timeHeldAtABreakpointIsLeftOutOfTheStepsTokensPerSecond() {
    MainWindow w;
    w.show();
    const studio::SessionConfig c = studio::test::tinySession(4, 2, dir_ + "/held.db");
    Session* s = w.session();
    studio::Breakpoints b;
    b.add("op:matmul@40");  // inside step 2 or 3 of gpt-tiny
    s->setBreakpoints(b);
    QSignalSpy paused(s, &Session::pausedAt);
    QSignalSpy finished(s, &Session::finished);
    QVERIFY(studio::test::startAndRun(w, c));
    QVERIFY(QTest::qWaitFor([&] { return paused.count() >= 1; }, 60000));
    const int64_t heldStep = paused.first().at(1).toLongLong();
    QVERIFY(heldStep >= 1);
    QTest::qWait(1500);
    s->setBreakpoints({});
    s->run();
    QVERIFY(QTest::qWaitFor([&] { return finished.count() >= 1; }, 60000));
    storage::Recording rec = storage::Recording::open(c.output.toStdString());
    const auto steps = rec.steps();
    QCOMPARE(int(steps.size()), 4);
    double others = 0, held = 0;
    for (const auto& st : steps)
      (st.step == heldStep ? held : others) += st.tokensPerSec / (st.step == heldStep ? 1 : 3);
    // With the pause counted it reads below 1/100 of the others; left out, it is of their order
    // (0.16 to 1 of them on this loaded machine: the pause's flush and repaint stay in the step).
    QVERIFY2(held > 0.05 * others, qPrintable(QString("held %1, others %2").arg(held).arg(others)));
    const auto& hs = steps[size_t(heldStep - 1)];
    QVERIFY(hs.endNs - hs.beginNs > 1'400'000'000);  // its time, begin to end, spans the pause
    int lines = 0;
    for (const auto& l : rec.logs({}))
      if (l.scope == "studio" && QString::fromStdString(l.message).startsWith("paused 1.") &&
          l.step == heldStep)
        ++lines;
    QCOMPARE(lines, 1);
  }

  // Note [A live comparison]: a comparison made while the session is paused before step 1 (A
  // holds step 0 only) says it is out of date as soon as the run moves, and is made again when
  // the run finishes and on Reload. It kept the verdict of step 0 to the end ("EQUAL WITHIN
  // TOLERANCE", "A has 0 steps") for a run that diverged at its 5th matmul.
  void aComparisonWithALiveSessionFollowsIt() {
    MainWindow w;
    w.show();
    studio::SessionConfig c = studio::test::tinySession(2, 7, dir_ + "/live-cmp.db");
    c.capture.md5 = c.capture.stats = true;
    Session* s = w.session();
    w.startSession(c);
    QVERIFY(QTest::qWaitFor([&] { return s->state() == Session::State::Paused; }, 30000));
    QVERIFY(QTest::qWaitFor([&] { return w.summary(Side::A) != nullptr; }, 30000));
    QSignalSpy diffed(&w, &MainWindow::diffShown);
    w.compareWith(dir_ + "/b.db");
    QVERIFY(QTest::qWaitFor([&] { return diffed.count() >= 1; }, 60000));
    QVERIFY(waitIdle(w));
    auto* diff = w.diffView();
    QVERIFY2(!diff->summaryText().contains("OUT OF DATE"), qPrintable(diff->summaryText()));
    QVERIFY(!w.comparisonOutOfDate());

    QSignalSpy finished(s, &Session::finished);
    s->run();  // the recording changes from here: the step-0 verdict says it is out of date
    QVERIFY(w.comparisonOutOfDate());
    QVERIFY2(
        diff->summaryText().contains("OUT OF DATE") && diff->summaryText().contains("(step 0)"),
        qPrintable(diff->summaryText()));
    QVERIFY(w.runStatusText().contains("comparison out of date"));
    QVERIFY(QTest::qWaitFor([&] { return finished.count() >= 1; }, 60000));
    QVERIFY(QTest::qWaitFor([&] { return !w.comparisonOutOfDate(); }, 60000));
    QVERIFY(waitIdle(w));

    // What `keel diff` says of the finished recordings.
    const views::DiffPtr truth = views::DiffRunner::run(c.output, dir_ + "/b.db");
    QCOMPARE(storage::diffVerdict(*truth), storage::DiffVerdict::Diverged);
    QVERIFY(truth->first);
    const views::DiffPtr shown = w.diffReport();
    QVERIFY(shown && shown->first);
    QCOMPARE(shown->first->pair.seqA, truth->first->pair.seqA);
    QCOMPARE(shown->total.onlyInA + shown->total.onlyInB,
             truth->total.onlyInA + truth->total.onlyInB);
    const QString text = diff->summaryText();
    QVERIFY2(text.contains("DIVERGED") && !text.contains("OUT OF DATE") &&
                 !text.contains("A has 0 steps") && !text.contains("did not finish"),
             qPrintable(text));
    QVERIFY(!w.runStatusText().contains("comparison out of date"));

    // File > Reload compares again.
    QSignalSpy again(&w, &MainWindow::diffShown);
    w.reload();
    QVERIFY(QTest::qWaitFor([&] { return again.count() >= 1; }, 60000));
    QVERIFY(waitIdle(w));
    QVERIFY(!diff->summaryText().contains("OUT OF DATE"));
  }

  // Note [Where a live session ends]: what the window shows after Step, and after Stop inside a
  // step, agrees with itself: the step shown holds the op selected (an op of step 1 stayed in
  // the inspector with step 2 shown), and the status line says the file holds part of the step
  // it stopped in ("stopped after 2 of 3 steps" for a file holding ops of step 3).
  void theStepShownHoldsTheOpSelectedAfterStepAndStop() {
    MainWindow w;
    w.show();
    const studio::SessionConfig c = studio::test::tinySession(3, 2, dir_ + "/live-stop.db");
    Session* s = w.session();
    studio::Breakpoints b;
    b.add("op:flashmask_attention");
    s->setBreakpoints(b);
    QSignalSpy paused(s, &Session::pausedAt);
    QVERIFY(studio::test::startAndRun(w, c));
    QVERIFY(QTest::qWaitFor([&] { return paused.count() >= 1; }, 60000));
    const quint64 first = paused.first().at(0).toULongLong();
    QCOMPARE(paused.first().at(1).toLongLong(), qint64(1));
    QVERIFY(QTest::qWaitFor([&] { return w.selection()->current(Side::A) == first; }, 10000));
    QVERIFY(waitIdle(w));

    s->setBreakpoints({});
    // The rest of step 1: the op paused at is in the step shown, and stays selected.
    QSignalSpy stepped(s, &Session::stepFinished);
    s->step();
    QVERIFY(QTest::qWaitFor(
        [&] { return stepped.count() >= 1 && s->state() == Session::State::Paused; }, 60000));
    QVERIFY(waitIdle(w));
    QCOMPARE(w.currentStep()->step, int64_t(1));
    QCOMPARE(w.selection()->current(Side::A), std::optional<uint64_t>(first));
    // Step 2: the op of step 1 is let go.
    s->step();
    QVERIFY(QTest::qWaitFor(
        [&] { return stepped.count() >= 2 && s->state() == Session::State::Paused; }, 60000));
    QVERIFY(waitIdle(w));
    QCOMPARE(w.currentStep()->step, int64_t(2));
    const auto selected = w.selection()->current(Side::A);
    QVERIFY2(!selected || w.currentStep()->indexOf(*selected) >= 0,
             qPrintable(QString("#%1 selected, not in step 2").arg(selected.value_or(0))));

    // Paused inside step 3, then stopped: step 3 shown with the op it paused at.
    b.add("op:flashmask_attention");
    s->setBreakpoints(b);
    s->run();
    QVERIFY(QTest::qWaitFor([&] { return paused.count() >= 2; }, 60000));
    const quint64 last = paused.last().at(0).toULongLong();
    QCOMPARE(paused.last().at(1).toLongLong(), qint64(3));
    QSignalSpy finished(s, &Session::finished);
    s->stop();
    QVERIFY(QTest::qWaitFor([&] { return finished.count() >= 1; }, 60000));
    QVERIFY(waitIdle(w));
    QCOMPARE(w.currentStep()->step, int64_t(3));
    QCOMPARE(w.selection()->current(Side::A), std::optional<uint64_t>(last));
    QVERIFY(w.currentStep()->indexOf(last) >= 0);
    storage::Recording rec = storage::Recording::open(c.output.toStdString());
    const auto steps = rec.steps();  // step 3 begun, not ended
    QCOMPARE(int(steps.size()), 3);
    QVERIFY(steps[1].endNs > 0);
    QCOMPARE(steps[2].endNs, int64_t(0));
    QVERIFY(!rec.stepOps(3).empty());
    const QString said = w.statusBar()->currentMessage();
    QVERIFY2(said == "Session stopped in step 3 of 3 (2 complete): " + c.output,
             qPrintable(said + " (last error: " + w.lastError() + ")"));
    // The run's line says the last of its steps is incomplete ("3 steps" read as three done).
    QVERIFY(QTest::qWaitFor(
        [&] { return w.runStatusText().contains(", 3 steps (the last incomplete), "); }, 10000));
  }

  // A file that cannot be opened changes nothing else: the recording shown keeps its selection,
  // its inspector and its path, and Open recent does not list the bad file (a failed open
  // cleared the selection, the inspector and the first-NaN banner, and listed the file).
  void aFailedOpenLeavesTheShownRecordingAsItWas() {
    MainWindow w;
    w.show();
    QSettings().remove("recentFiles");
    QSignalSpy shown(&w, &MainWindow::stepShown);
    w.openRecording(dir_ + "/a.db");
    QVERIFY(QTest::qWaitFor([&] { return shown.count() >= 1; }, 30000));
    QVERIFY(waitIdle(w));
    const uint64_t seq = w.currentStep()->ops.at(3).seq;
    w.selection()->select(Side::A, seq);
    QVERIFY(QTest::qWaitFor(
        [&] { return w.inspector()->details() && w.inspector()->details()->op.seq == seq; },
        10000));
    const QString bad = garbageFile("garbage-open.db");
    QSignalSpy err(&w, &MainWindow::errorShown);
    w.openRecording(bad);
    QVERIFY(QTest::qWaitFor([&] { return err.count() >= 1; }, 10000));
    QVERIFY(waitIdle(w));
    QCOMPARE(w.selection()->current(Side::A), std::optional<uint64_t>(seq));
    QVERIFY(w.inspector()->details());  // single recording: the inspector's one op
    QCOMPARE(w.inspector()->details()->op.seq, seq);
    QVERIFY(w.summary(Side::A));
    QCOMPARE(QFileInfo(w.summary(Side::A)->path).fileName(), QString("a.db"));
    const QStringList recent = QSettings().value("recentFiles").toStringList();
    QVERIFY2(!recent.contains(QFileInfo(bad).absoluteFilePath()), qPrintable(recent.join(", ")));
    QVERIFY(recent.contains(QFileInfo(dir_ + "/a.db").absoluteFilePath()));
    // The recording still answers: another step loads.
    const int before = shown.count();
    w.showStep(2);
    QVERIFY(QTest::qWaitFor([&] { return shown.count() > before; }, 30000));
    QCOMPARE(w.currentStep()->step, int64_t(2));
  }

  // A recording `keel record` is still writing: the status bar says it has not finished, and
  // File > Reload shows the steps written since it was opened (it stayed at the first count).
  void aRecordingStillBeingWrittenSaysSoAndReloads() {
    const QString live = dir_ + "/still-writing.db";
    QProcess rec;
    QByteArray printed;
    QVERIFY(views::test::startLongRecord(rec, live, printed, 3));
    MainWindow w;
    w.show();
    QSignalSpy shown(&w, &MainWindow::stepShown);
    w.openRecording(live);
    QVERIFY(QTest::qWaitFor([&] { return shown.count() >= 1; }, 30000));
    QVERIFY(waitIdle(w));
    const size_t before = w.summary(Side::A)->steps.size();
    QVERIFY2(w.runStatusText().contains("running: killed, crashed or still being written"),
             qPrintable(w.runStatusText()));
    QVERIFY(views::test::waitForStepLines(rec, printed, int(before) + 6));
    QCOMPARE(w.summary(Side::A)->steps.size(), before);  // nothing reloads by itself
    w.reload();
    QVERIFY(QTest::qWaitFor([&] { return w.summary(Side::A)->steps.size() > before + 2; }, 30000));
    QVERIFY(waitIdle(w));
    rec.kill();
    rec.waitForFinished();
  }

  // Issue 14, item 5: at 1366x768 and 1920x1080 the window is that size, and the inspector reads
  // without scrolling sideways: every statistic in full, every tab in view, the calling code's
  // frame first.
  void inspectorIsReadableAtCommonScreenSizes() {
    for (const QSize size : {QSize(1366, 768), QSize(1920, 1080)}) {
      MainWindow w;
      QVERIFY(views::test::showAt(w, size));
      QVERIFY(compareAndWait(w, dir_ + "/a.db", dir_ + "/b.db"));
      const auto& p = w.diffReport()->first->pair;
      w.selection()->select(Side::A, p.seqA);  // one side: the other follows
      views::InspectorView* insp = w.inspector();
      QVERIFY(QTest::qWaitFor(
          [&] {
            return insp->details(Side::A) && insp->details(Side::B) &&
                   insp->details(Side::B)->op.seq == p.seqB;
          },
          10000));
      QVERIFY(waitIdle(w));
      QApplication::processEvents();
      if (w.size() != size) {
        for (QDockWidget* d : w.findChildren<QDockWidget*>())
          qWarning() << d->objectName() << d->minimumSizeHint() << d->widget()->minimumSizeHint();
        qWarning() << "central" << w.centralWidget()->minimumSizeHint();
      }
      QCOMPARE(w.size(), size);
      QVERIFY(insp->comparing());
      // The header (op, verdict, a line per run) is whole, above the tabs.
      auto* header = insp->findChild<QLabel*>("inspectorHeader");
      QVERIFY(header->text().contains("A: a.db · cpu") && header->text().contains("B: b.db · cpu"));
      QVERIFY2(header->height() >= header->heightForWidth(header->width()),
               qPrintable(QString("header %1 px, needs %2 at %3 px")
                              .arg(header->height())
                              .arg(header->heightForWidth(header->width()))
                              .arg(header->width())));
      QVERIFY2(header->geometry().bottom() < insp->tabs()->geometry().top(),
               qPrintable(QString("header ends at %1, tabs start at %2")
                              .arg(header->geometry().bottom())
                              .arg(insp->tabs()->geometry().top())));

      auto* tensors = insp->findChild<QTreeWidget*>("inspectorTensors");
      QVERIFY(tensors && tensors->isVisible());
      QVERIFY2(!tensors->horizontalScrollBar()->isVisible(), "tensor table scrolls sideways");
      // Every statistic's text fits its column (plus the cell's margins).
      const QStringList stats{"NaN", "Inf", "Zeros", "Min", "Max", "Mean", "Std", "|Max|"};
      int checked = 0;
      for (int t = 0; t < tensors->topLevelItemCount(); ++t) {
        QTreeWidgetItem* top = tensors->topLevelItem(t);
        for (int r = 0; r < top->childCount(); ++r) {
          QTreeWidgetItem* row = top->child(r);
          if (!stats.contains(row->text(0))) continue;
          for (int c = 1; c <= 2; ++c) {
            const int need = QFontMetrics(row->font(c)).horizontalAdvance(row->text(c)) + 8;
            QVERIFY2(need <= tensors->columnWidth(c),
                     qPrintable(QString("%1x%2: %3 %4 needs %5 px, column %6 is %7")
                                    .arg(size.width())
                                    .arg(size.height())
                                    .arg(row->text(0), row->text(c))
                                    .arg(need)
                                    .arg(c)
                                    .arg(tensors->columnWidth(c))));
            ++checked;
          }
        }
      }
      QVERIFY(checked >= 16);
      // Every tab in view, none elided.
      QTabBar* bar = insp->tabs()->tabBar();
      for (int i = 0; i < bar->count(); ++i) {
        if (!bar->isTabVisible(i)) continue;
        const QRect r = bar->tabRect(i);
        QVERIFY2(r.left() >= 0 && r.right() < bar->width(), qPrintable(bar->tabText(i)));
        QVERIFY2(r.width() >= bar->fontMetrics().horizontalAdvance(bar->tabText(i)) + 12,
                 qPrintable(bar->tabText(i)));
      }
      // Each stack opens on the model code that called the op, not Keel's dispatch.
      auto* stack = insp->findChild<QTreeWidget*>("inspectorStack");
      QCOMPARE(stack->topLevelItemCount(), 2);
      for (int side = 0; side < 2; ++side) {
        QTreeWidgetItem* first = stack->topLevelItem(side)->child(0);
        QVERIFY(first);
        QVERIFY2(!first->text(1).startsWith("keel::ops::") &&
                     !first->text(1).startsWith("keel::dispatch"),
                 qPrintable(first->text(1)));
      }
    }
  }

 private:
  QString dir_;
};

QTEST_MAIN(StudioTest)
#include "studio_test.moc"
