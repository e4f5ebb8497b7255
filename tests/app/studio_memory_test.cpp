// The Memory dock of Keel Studio: a recording's allocator events load into it when the recording
// opens, clicking a block of another step's op shows that step and inspects the op, the memory
// cursor follows the step shown, and a live session with Run > Track memory per step records one
// tracked section per training step.
#include <QDockWidget>
#include <QFile>
#include <QJsonDocument>
#include <QJsonObject>
#include <QSignalSpy>
#include <QStandardPaths>
#include <QStatusBar>
#include <QtTest>

#include "keel/allocator.h"
#include "keel/storage/reader.h"
#include "keel/views/inspector.h"
#include "keel/views/memory_view.h"
#include "keel/views/selection.h"
#include "main_window.h"
#include "studio_test_util.h"
#include "view_test_util.h"

using namespace keel;
using keel::studio::MainWindow;
using keel::studio::Session;

using keel::studio::test::waitIdle;

class StudioMemoryTest : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() { QStandardPaths::setTestModeEnabled(true); }

  void memoryDockLoadsWithTheRecordingAndSelectsAcrossSteps() {
    const QString path = views::test::tempDir() + "/caching.db";
    QVERIFY(views::test::recordFixture(path, "--steps 2 --seed 6 --allocator",
                                       "KEEL_ALLOCATOR=caching"));
    const storage::Recording rec = storage::Recording::open(path.toStdString());
    const auto events = rec.memEvents({});

    MainWindow w;
    QVERIFY(views::test::showAt(w, {1600, 1000}));
    w.openRecording(path);
    QVERIFY(waitIdle(w));
    views::MemoryView* mv = w.memoryView();
    QCOMPARE(size_t(mv->eventCount()), events.size());
    QVERIFY(mv->message().isEmpty());
    QCOMPARE(w.currentStep()->step, int64_t(1));

    auto* dock = w.findChild<QDockWidget*>("dock.memory");
    QVERIFY(dock);
    dock->raise();
    QVERIFY(QTest::qWaitFor([&] { return mv->isVisible(); }, 5000));
    mv->setScale(analysis::MemScale::Log);
    // The last event of step 2 that an op allocated: click that block.
    int64_t k = -1;
    for (size_t i = 0; i < events.size(); ++i)
      if (events[i].kind == MemEventKind::Alloc && events[i].step == 2 && events[i].opSeq)
        k = int64_t(i);
    QVERIFY(k > 0);
    mv->setCursor(k);
    const uint64_t seq = events[size_t(k)].opSeq;
    size_t block = mv->state().blocks.size();
    for (size_t i = 0; i < mv->state().blocks.size(); ++i)
      if (mv->state().blocks[i].allocEvent == uint32_t(k)) block = i;
    QVERIFY(block < mv->state().blocks.size());
    const QPoint at = mv->blockPoint(block);
    QVERIFY(at.x() >= 0);
    QSignalSpy shown(&w, &MainWindow::stepShown);
    QSignalSpy inspected(&w, &MainWindow::opInspected);
    QTest::mouseClick(mv->blockMap(), Qt::LeftButton, {}, at);
    QCOMPARE(w.selection()->current(views::Side::A), std::optional<uint64_t>(seq));
    QVERIFY(QTest::qWaitFor([&] { return shown.count() >= 1; }, 30000));
    QCOMPARE(shown.last().at(0).toLongLong(), 2LL);
    QVERIFY(QTest::qWaitFor(
        [&] { return !inspected.isEmpty() && inspected.last().at(0).toULongLong() == seq; },
        30000));
    QCOMPARE(mv->cursor(), k);  // its own selection, echoed back, leaves the cursor alone
  }

  // The memory cursor follows the step the window shows: the step box moves it to that step.
  // File > Import > PyTorch memory snapshot (the dialog's two paths given): the snapshot is read
  // on a worker, the recording opens with the Memory view raised and every event in it; a pickle
  // that would run code is an error dialog, and nothing is written.
  void importsATorchMemorySnapshotAndRefusesAHostileOne() {
    const QString fixtures = QString(KEEL_SOURCE_DIR) + "/tests/fixtures/torch/";
    QFile json(fixtures + "snapshot-p4.json");
    QVERIFY(json.open(QIODevice::ReadOnly));
    const qint64 events = QJsonDocument::fromJson(json.readAll())["0"]["events"].toInteger();
    QVERIFY(events > 100);
    const QString out = views::test::tempDir() + "/imported.db";
    QFile::remove(out);
    MainWindow w;
    QVERIFY(views::test::showAt(w, {1600, 1000}));
    w.importTorchMemory(fixtures + "snapshot-p4.pickle", out);
    QVERIFY(QTest::qWaitFor([&] { return w.memoryView()->eventCount() == events; }, 60000));
    QVERIFY(waitIdle(w));
    QCOMPARE(w.raisedBottomView(), QString("memory"));
    QCOMPARE(w.summary(views::Side::A)->run.backend, std::string("torch"));
    // No ops to show: the Memory view takes the window; the graph and the right column (the
    // inspector, the metrics) are hidden (they took half of it, empty).
    QVERIFY2(w.memoryView()->height() > w.height() * 3 / 4,
             qPrintable(QString::number(w.memoryView()->height())));
    QVERIFY(!w.centralWidget()->isVisible());
    QVERIFY(!w.inspector()->isVisible());
    // The import is over: the status bar no longer says "Importing ..." (it did until a menu
    // was opened), and the status names what the recording holds, not "0 steps, 0 ops".
    QVERIFY2(!w.statusBar()->currentMessage().startsWith("Importing"),
             qPrintable(w.statusBar()->currentMessage()));
    QVERIFY2(w.runStatusText().contains("imported.db — allocator events only (PyTorch CUDA "
                                        "caching): see the Memory view"),
             qPrintable(w.runStatusText()));
    // A snapshot has no steps: no event reads as "initialisation".
    const QString line = w.memoryView()->cursorText();
    QVERIFY2(line.contains(" · outside ops · allocated ") && !line.contains("initialisation"),
             qPrintable(line));

    const QString evil = views::test::tempDir() + "/evil.pickle";
    QFile f(evil);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(
        QByteArray("\x80\x02"
                   "cposix\nsystem\nX\x05\x00\x00\x00"
                   "touch\x85R.",
                   29));
    f.close();
    QSignalSpy errors(&w, &MainWindow::errorShown);
    const QString out2 = views::test::tempDir() + "/evil.db";
    w.importTorchMemory(evil, out2);
    QVERIFY(errors.wait(30000));
    QVERIFY2(errors.first().first().toString().contains("which would run code"),
             qPrintable(errors.first().first().toString()));
    QVERIFY(!QFile::exists(out2));
    QVERIFY(!QFile::exists("touch"));
    // A snapshot opened as a recording: the dialog names the studio's own import (it named
    // keel's command line).
    errors.clear();
    w.openRecording(fixtures + "snapshot-p4.pickle");
    QVERIFY(!errors.isEmpty() || errors.wait(30000));  // said at once: nothing is opened
    QVERIFY2(errors.first().first().toString().contains(
                 "a PyTorch memory snapshot is opened after File > Import > PyTorch memory "
                 "snapshot… turns it into a recording") &&
                 !errors.first().first().toString().contains("keel import"),
             qPrintable(errors.first().first().toString()));
    // The output may not be the snapshot.
    errors.clear();
    w.importTorchMemory(evil, evil);
    QCOMPARE(errors.size(), 1);
    QVERIFY(errors.first().first().toString().contains("is the snapshot"));
    // A recording with ops brings the graph and the right column back.
    const QString ops = views::test::tempDir() + "/with-ops.db";
    QVERIFY(views::test::recordFixture(ops, "--steps 1 --allocator"));
    w.openRecording(ops);
    QVERIFY(QTest::qWaitFor([&] { return w.centralWidget()->isVisible(); }, 30000));
    QVERIFY(waitIdle(w));
    QVERIFY(w.inspector()->isVisible());
    QVERIFY(w.centralWidget()->isVisible());
  }

  void memoryCursorFollowsTheStepShown() {
    const QString path = views::test::tempDir() + "/follow.db";
    QVERIFY(views::test::recordFixture(path, "--steps 2 --seed 6 --allocator",
                                       "KEEL_ALLOCATOR=caching"));
    MainWindow w;
    QVERIFY(views::test::showAt(w, {1600, 1000}));
    w.openRecording(path);
    QVERIFY(waitIdle(w));
    views::MemoryView* mv = w.memoryView();
    QVERIFY(mv->cursor() >= 0);
    auto cursorStep = [&] { return mv->memory()->event(size_t(mv->cursor())).step; };
    QCOMPARE(cursorStep(), w.currentStep()->step);
    w.showStep(2);
    QVERIFY(waitIdle(w));
    QCOMPARE(cursorStep(), int64_t(2));
    w.showStep(0);
    QVERIFY(waitIdle(w));
    QCOMPARE(cursorStep(), int64_t(0));
  }

  void trackMemoryPerStepRecordsOneSectionPerStep() {
    setDefaultAllocatorKind(AllocatorKind::Caching);
    MainWindow w;
    QVERIFY(views::test::showAt(w, {1600, 1000}));
    w.trackMemoryAction()->setChecked(true);
    QVERIFY(w.session()->trackMemoryPerStep());
    studio::SessionConfig c = studio::test::tinySession(2, 3, views::test::tempDir() + "/live.db");
    c.capture.allocator = true;
    Session* s = w.session();
    QSignalSpy finished(s, &Session::finished);
    QVERIFY(studio::test::startAndRun(w, c));
    QVERIFY(QTest::qWaitFor([&] { return finished.count() >= 1; }, 60000));
    QVERIFY(waitIdle(w));
    views::MemoryView* mv = w.memoryView();
    // The Memory tab was behind the Ops tab while the run went on: raising it loads the run.
    w.findChild<QDockWidget*>("dock.memory")->raise();
    QVERIFY(QTest::qWaitFor([&] { return mv->memory() && mv->memory()->sections().size() == 2; },
                            30000));
    const auto& sections = mv->memory()->sections();
    QCOMPARE(sections[0].name, std::string("step 1"));
    QCOMPARE(sections[1].name, std::string("step 2"));
    for (const analysis::MemSection& sec : sections) {
      QVERIFY(sec.endEvent);
      QVERIFY(sec.allocs > 0);
      QVERIFY(sec.peakBytes > 0);
    }
    QCOMPARE(mv->sectionModel()->rowCount(), 2);
    w.trackMemoryAction()->setChecked(false);
    QVERIFY(!w.session()->trackMemoryPerStep());
  }
};

QTEST_MAIN(StudioMemoryTest)
#include "studio_memory_test.moc"
