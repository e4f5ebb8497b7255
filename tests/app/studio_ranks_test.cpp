// Keel Studio on a multi-rank run folder (recorded here under mpirun, with one replica made to
// drift): the folder opens on a rank with the rank selector and the Ranks panel raised, the panel
// names the replica difference, its link shows that op on that rank, the selector switches rank,
// a damaged manifest is a dialog — and keel-studio's --rank through its real main().
#include <QComboBox>
#include <QFileInfo>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QProcess>
#include <QScrollBar>
#include <QSignalSpy>
#include <QStandardPaths>
#include <QTableWidget>
#include <QtTest>
#include <cstdlib>
#include <fstream>

#include "keel/views/diff_view.h"
#include "keel/views/ranks_view.h"
#include "keel/views/selection.h"
#include "main_window.h"
#include "studio_test_util.h"
#include "view_test_util.h"

using keel::studio::MainWindow;
using keel::studio::test::waitIdle;
using keel::views::Side;

namespace {

// `keel record` of gpt-tiny (3 steps, MD5s and statistics) into `out`: at dp 2 under mpirun
// (`ranks` 2) or in one process (1), with `env` set (a perturbation).
bool recordTiny(const QString& out, int ranks, const std::string& env = "") {
  const std::string launch =
      ranks > 1
          ? "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
            "OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "
            "OMPI_MCA_memory=^patcher ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_orte_tmpdir_base='" +
                QFileInfo(out).absolutePath().toStdString() + "' KEEL_BLAS_TUNE=0 " + env +
                " timeout 120 mpirun -np 2 -x KEEL_BLAS_TUNE -x KEEL_TEST_PERTURB -x "
                "KEEL_TEST_PERTURB_RANK "
          : "KEEL_BLAS_TUNE=0 timeout 120 ";
  const std::string cmd = "cd '" KEEL_SOURCE_DIR "' && " + launch +
                          "'" KEEL_CLI_PATH
                          "' record --config tests/fixtures/gpt-tiny.json "
                          "--steps 3 --md5 --stats" +
                          (ranks > 1 ? " --dp 2" : "") + " -o '" + out.toStdString() +
                          "' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// The drifting run: rank 1's fourth all_reduce (step 2's gradient bucket) changed.
bool recordDriftingRun(const QString& folder) {
  return recordTiny(folder, 2, "KEEL_TEST_PERTURB=all_reduce:4 KEEL_TEST_PERTURB_RANK=1");
}

// Opens `a` in `w` (at a desktop's size), compares it with `b` and waits for the comparison of the
// whole runs (Note [Comparing whole runs]) and everything it loads.
bool openAndCompareRuns(MainWindow& w, const QString& a, const QString& b) {
  w.resize(1400, 900);
  w.show();
  w.openRecording(a);
  if (!waitIdle(w)) return false;
  w.compareWith(b);
  return QTest::qWaitFor([&] { return w.runsComparison() != nullptr; }, 60000) && waitIdle(w);
}

}  // namespace

class StudioRanksTest : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    QStandardPaths::setTestModeEnabled(true);
    dir_ = keel::views::test::tempDir();
    QVERIFY(recordDriftingRun(dir_ + "/run"));
    QVERIFY(recordTiny(dir_ + "/clean", 2));
    QVERIFY(recordTiny(dir_ + "/single.db", 1));
  }

  // Note [Comparing whole runs]: two run folders of one layout compared in the studio are
  // compared rank by rank, as keel diff RUN_A/ RUN_B/ does. Rank 0's comparison (what opened)
  // showed no difference in step 2 at all: the drift was made on rank 1. The window moves to the
  // rank that diverged first, and the diff view lists every rank's verdict.
  void twoRunFoldersCompareRankByRankOnTheRankThatDivergedFirst() {
    MainWindow w;
    QVERIFY(openAndCompareRuns(w, dir_ + "/clean", dir_ + "/run"));
    const keel::views::RunsPtr runs = w.runsComparison();
    QCOMPARE(int(runs->kind), int(keel::views::RunsComparison::Kind::RankByRank));
    QCOMPARE(runs->firstRank, std::optional<int>(1));
    QVERIFY(runs->diverged);
    QCOMPARE(runs->rankLines.size(), size_t(2));
    QVERIFY2(runs->rankLines[1].startsWith("diverged: first at step 2, op #") &&
                 runs->rankLines[1].contains(" all_reduce (dp_grad_sync)"),
             qPrintable(runs->rankLines[1]));
    QVERIFY(w.summary(Side::A)->path.endsWith("/clean/rank-1.db"));
    QVERIFY(w.summary(Side::B)->path.endsWith("/run/rank-1.db"));
    QCOMPARE(w.findChild<QComboBox*>("rankCombo")->currentIndex(), 1);
    QVERIFY(w.diffReport() && w.diffReport()->first);
    QCOMPARE(w.diffReport()->first->pair.step, int64_t(2));
    const QString summary = w.diffView()->summaryText();
    QVERIFY2(summary.contains("rank 1 diverged first") &&
                 summary.contains("the table: rank 1 of A against rank 1 of B") &&
                 summary.contains("rank 0: ") && summary.contains("rank 1: diverged: first at "),
             qPrintable(summary));

    // The tolerance fields: a value that is no number is marked and compares nothing again;
    // tolerances wide enough for the drift make every rank equal within them.
    auto* atol = w.diffView()->findChild<QLineEdit*>("diffAtol");
    auto* rtol = w.diffView()->findChild<QLineEdit*>("diffRtol");
    QVERIFY(atol && rtol && atol->isVisible());
    QCOMPARE(atol->text(), QString("1e-06"));
    QSignalSpy changed(w.diffView(), &keel::views::DiffView::toleranceChanged);
    atol->setText("abc");
    emit atol->editingFinished();
    QCOMPARE(changed.count(), 0);
    QVERIFY(atol->styleSheet().contains("background"));
    QCOMPARE(atol->toolTip(), QString("atol: expected a number >= 0, got 'abc'"));
    QCOMPARE(w.diffView()->toleranceError(), atol->toolTip());
    atol->setText("1e9");
    rtol->setText("1e9");
    emit atol->editingFinished();
    QCOMPARE(changed.count(), 1);
    QVERIFY(atol->styleSheet().isEmpty());
    QVERIFY(QTest::qWaitFor([&] { return w.runsComparison() != runs; }, 60000));
    QVERIFY(waitIdle(w));
    QCOMPARE(w.diffOptions().atol, 1e9);
    QVERIFY(!w.runsComparison()->diverged);
    QVERIFY(!w.runsComparison()->firstRank);
    QCOMPARE(w.diffReport()->options.atol, 1e9);
    QVERIFY(!w.diffReport()->first);
    QVERIFY2(w.diffView()->summaryText().contains("every rank equal"),
             qPrintable(w.diffView()->summaryText()));

    // A rank the user chose stays: another window asked for rank 0 keeps it, and says where the
    // runs diverged first.
    MainWindow w0;
    w0.showRankOnOpen(0);
    QVERIFY(openAndCompareRuns(w0, dir_ + "/clean", dir_ + "/run"));
    QVERIFY(w0.summary(Side::A)->path.endsWith("/clean/rank-0.db"));
    QVERIFY2(w0.diffView()->summaryText().contains("rank 1 diverged first") &&
                 w0.diffView()->summaryText().contains("the table: rank 0 of A against rank 0"),
             qPrintable(w0.diffView()->summaryText()));
  }

  // A run folder against one process: their ops see other shares of the batch, so an op-by-op
  // diff of one rank against the other run called every op diverged; they compare by parameter
  // (as keel diff does), with no op table, and the update of the first parameter to differ
  // selected on both sides.
  void aRunFolderAgainstOneProcessComparesByParameter() {
    MainWindow w;
    QVERIFY(openAndCompareRuns(w, dir_ + "/single.db", dir_ + "/clean"));
    keel::views::RunsPtr runs = w.runsComparison();
    QCOMPARE(int(runs->kind), int(keel::views::RunsComparison::Kind::ByParameter));
    QVERIFY2(!runs->diverged, qPrintable(runs->text));
    QVERIFY(!w.diffReport());
    QVERIFY(!w.diffView()->table()->isVisible());
    QVERIFY(w.diffView()->findChild<QLabel*>("diffByParameter")->isVisible());
    QVERIFY2(w.diffView()->summaryText().contains("EQUAL WITHIN TOLERANCE") &&
                 w.diffView()->summaryText().contains("A is one process, B is dp 2 x tp 1"),
             qPrintable(w.diffView()->summaryText()));
    QCOMPARE(w.raisedBottomView(), QString("diff"));

    // The drifting run: rank 1's step 2 gradients were changed, so its parameters differ from
    // step 3 (a parameter's pieces are read from one replica of each, rank 0: its step 3
    // gradients are averaged with rank 1's).
    w.compareWith(dir_ + "/run");
    QVERIFY(QTest::qWaitFor(
        [&] { return w.runsComparison() && w.runsComparison()->pathB == dir_ + "/run"; }, 60000));
    QVERIFY(waitIdle(w));
    runs = w.runsComparison();
    QVERIFY(runs->diverged);
    QCOMPARE(runs->firstStep, std::optional<int64_t>(3));
    QVERIFY(!runs->firstParameter.isEmpty());
    QCOMPARE(w.currentStep()->step, int64_t(3));
    for (const Side side : {Side::A, Side::B}) {
      const auto seq = w.selection()->current(side);
      QVERIFY(seq);
      const keel::views::StepPtr step = side == Side::A ? w.currentStep() : nullptr;
      if (step) {
        const auto& op = step->ops[size_t(step->indexOf(*seq))];
        QCOMPARE(QString::fromStdString(op.name), QString("adamw_step"));
        QCOMPARE(QString::fromStdString(op.scope), runs->firstParameter);
      }
    }
    QVERIFY2(w.diffView()->summaryText().contains("DIVERGED") &&
                 w.diffView()->summaryText().contains("First difference: step 3, parameter " +
                                                      runs->firstParameter),
             qPrintable(w.diffView()->summaryText()));
  }

  void aRunFolderOpensWithItsRanksAndTheReplicaVerdict() {
    MainWindow w;
    w.resize(1400, 900);  // a desktop's window: the rank pickers in the toolbar, not its overflow
    w.show();
    w.openRecording(dir_ + "/run");
    QVERIFY(waitIdle(w));
    QCOMPARE(w.runFolder(), dir_ + "/run");
    QVERIFY(w.summary(Side::A)->path.endsWith("/run/rank-0.db"));
    QCOMPARE(w.raisedBottomView(), QString("ranks"));
    auto* combo = w.findChild<QComboBox*>("rankCombo");
    QVERIFY(combo && combo->isVisible());
    QCOMPARE(combo->count(), 2);
    QCOMPARE(combo->itemText(1), QString("1 (dp 1, tp 0)"));
    keel::views::RanksView* rv = w.ranksView();
    QCOMPARE(rv->rankTable()->rowCount(), 2);
    QCOMPARE(rv->rankTable()->item(1, 9)->text(), QString("finished"));
    QCOMPARE(rv->rankTable()->item(0, 3)->text(), QString("3"));  // steps
    // Each step: a gradient bucket and two loss means per dp group.
    QCOMPARE(rv->collectiveTable()->rowCount(), 9);
    // The two tables share the dock's width as their columns need it: at 1400 pixels neither
    // scrolls sideways (fixed halves cut the collectives' waits and last-to-arrive columns).
    QApplication::processEvents();
    for (QTableWidget* t : {rv->rankTable(), rv->collectiveTable()}) {
      const QHeaderView* h = t->horizontalHeader();
      const int last = t->columnCount() - 1;
      QVERIFY2(
          h->sectionViewportPosition(last) + h->sectionSizeHint(last) <= t->viewport()->width(),
          qPrintable(t->objectName() + QString(": last column at %1 in a viewport of %2")
                                           .arg(h->sectionViewportPosition(last))
                                           .arg(t->viewport()->width())));
      QCOMPARE(t->horizontalScrollBar()->maximum(), 0);
    }
    const QString verdict = rv->verdictLabel()->text();
    QVERIFY2(
        verdict.contains("Replicas differ:") &&
            verdict.contains("step 2, op all_reduce (backward, dp_grad_sync), output 0 differs"),
        qPrintable(verdict));
    QVERIFY(rv->data() && rv->data()->replicas && rv->data()->replicas->first);
    const keel::analysis::ReplicaDifference d = *rv->data()->replicas->first;
    QCOMPARE(d.rankB, int64_t(1));

    // The verdict's link: rank 1's recording, step 2, the op selected.
    QSignalSpy inspected(&w, &MainWindow::opInspected);
    emit rv->verdictLabel()->linkActivated(
        QString("op:%1:%2:%3").arg(d.rankB).arg(d.step).arg(d.seqB));
    QVERIFY(QTest::qWaitFor([&] { return inspected.count() >= 1; }, 30000));
    QVERIFY(waitIdle(w));
    QVERIFY(w.summary(Side::A)->path.endsWith("/run/rank-1.db"));
    QCOMPARE(combo->currentIndex(), 1);
    QCOMPARE(w.currentStep()->step, int64_t(2));
    QCOMPARE(w.selection()->current(Side::A), std::optional<uint64_t>(d.seqB));

    // The selector back to rank 0; opening a single recording leaves the run folder.
    w.showRank(0);
    QVERIFY(waitIdle(w));
    QVERIFY(w.summary(Side::A)->path.endsWith("/run/rank-0.db"));
    // A comparison stays open across a rank switch, against the new rank.
    QSignalSpy diffs(&w, &MainWindow::diffShown);
    w.compareWith(dir_ + "/run/rank-1.db");
    QVERIFY(QTest::qWaitFor([&] { return diffs.count() >= 1; }, 30000));
    QVERIFY(waitIdle(w));
    w.showRank(1);
    QVERIFY(QTest::qWaitFor([&] { return diffs.count() >= 2; }, 30000));
    QVERIFY(waitIdle(w));
    QVERIFY(w.summary(Side::A)->path.endsWith("/run/rank-1.db"));
    QVERIFY(w.summary(Side::B) && w.summary(Side::B)->path.endsWith("/run/rank-1.db"));
    w.showRank(0);
    QVERIFY(waitIdle(w));
    w.openRecording(dir_ + "/run/rank-1.db");  // a file of the folder keeps it open
    QVERIFY(waitIdle(w));
    QCOMPARE(w.runFolder(), dir_ + "/run");
  }

  // Note [Switching ranks]: a rank switch kept nothing — the bottom view went back to the op
  // table, the step to the first, the selection away. The new rank opens at the step shown, the
  // view raised stays, and the op in the selected op's place is selected. The Ranks panel marks
  // the rank shown, gives collectives' sizes in bytes units, and a collective double-clicked
  // selects its op on the rank shown.
  void switchingRanksKeepsThePlace() {
    MainWindow w;
    w.resize(1400, 900);
    w.show();
    w.openRecording(dir_ + "/run");
    QVERIFY(waitIdle(w));
    keel::views::RanksView* rv = w.ranksView();
    QCOMPARE(rv->rankTable()->item(0, 0)->text(), QString("▶ 0"));
    QCOMPARE(rv->rankTable()->item(1, 0)->text(), QString("1"));
    w.showStep(2);
    QVERIFY(waitIdle(w));
    const keel::views::StepPtr step0 = w.currentStep();
    const size_t at = step0->ops.size() / 2;
    w.selection()->select(Side::A, step0->ops[at].seq);
    QVERIFY(w.showView("timeline"));
    QVERIFY(waitIdle(w));
    w.showRank(1);
    QVERIFY(QTest::qWaitFor(
        [&] { return w.summary(Side::A)->path.endsWith("/run/rank-1.db") && w.currentStep(); },
        30000));
    QVERIFY(waitIdle(w));
    QCOMPARE(w.currentStep()->step, int64_t(2));
    QCOMPARE(w.raisedBottomView(), QString("timeline"));
    const auto sel = w.selection()->current(Side::A);
    QVERIFY(sel);
    const keel::views::StepPtr step1 = w.currentStep();
    QCOMPARE(step1->indexOf(*sel), int64_t(at));
    QCOMPARE(step1->ops[at].name, step0->ops[at].name);
    QCOMPARE(rv->rankTable()->item(1, 0)->text(), QString("▶ 1"));
    QVERIFY(rv->rankTable()->item(1, 3)->font().bold());
    QVERIFY(!rv->rankTable()->item(0, 3)->font().bold());

    // The collectives: sizes in units, and a double-click selects the op on rank 1.
    QTableWidget* ct = rv->collectiveTable();
    int row = -1;
    for (int r = 0; r < ct->rowCount(); ++r)
      if (ct->item(r, 0)->text().startsWith("all_reduce") && ct->item(r, 2)->text() == "3") row = r;
    QVERIFY(row >= 0);
    QVERIFY2(ct->item(row, 4)->text().contains("B"), qPrintable(ct->item(row, 4)->text()));
    QVERIFY(ct->item(row, 4)->toolTip().endsWith(" bytes"));
    QSignalSpy inspected(&w, &MainWindow::opInspected);
    emit ct->cellDoubleClicked(row, 0);
    QVERIFY(QTest::qWaitFor([&] { return inspected.count() >= 1; }, 30000));
    QVERIFY(waitIdle(w));
    QVERIFY(w.summary(Side::A)->path.endsWith("/run/rank-1.db"));
    QCOMPARE(w.currentStep()->step, int64_t(3));
    const auto op = w.selection()->current(Side::A);
    QVERIFY(op);
    const int64_t i = w.currentStep()->indexOf(*op);
    QVERIFY(i >= 0);
    QCOMPARE(w.currentStep()->ops[size_t(i)].name, std::string("all_reduce"));
  }

  void aDamagedManifestIsADialog() {
    QDir().mkpath(dir_ + "/bad");
    std::ofstream(QString(dir_ + "/bad/manifest.json").toStdString())
        << R"({"world_size": 4, "dp": 3, "tp": 1, "ranks": []})";
    MainWindow w;
    w.show();
    QSignalSpy errors(&w, &MainWindow::errorShown);
    w.openRecording(dir_ + "/bad");
    QVERIFY(QTest::qWaitFor([&] { return errors.count() >= 1; }, 10000));
    QVERIFY2(errors.first().at(0).toString().contains("damaged manifest.json: world size 4 is not "
                                                      "dp 3 x tp 1"),
             qPrintable(errors.first().at(0).toString()));
    QVERIFY(w.runFolder().isEmpty());
  }

  // keel-studio RUN --rank R through main(): the rank's recording, the Ranks panel raised; a rank
  // out of range or --rank without a run folder is one line and exit 2.
  void theStudioCommandLineTakesARank() {
    auto studio = [](const QStringList& args) {
      QProcess p;
      QProcessEnvironment e = QProcessEnvironment::systemEnvironment();
      e.insert("QT_QPA_PLATFORM", "offscreen");
      p.setProcessEnvironment(e);
      p.start(KEEL_STUDIO_PATH, args);
      p.waitForFinished(120000);
      return std::make_pair(p.exitCode(), QString::fromLocal8Bit(p.readAllStandardOutput() +
                                                                 p.readAllStandardError()));
    };
    const auto [code, out] =
        studio({dir_ + "/run", "--rank", "1", "--screenshot", dir_ + "/shot.png"});
    QVERIFY2(code == 0, qPrintable(out));
    QVERIFY2(out.contains("/run/rank-1.db: 3 steps") && out.contains("bottom dock: ranks"),
             qPrintable(out));
    const auto [c2, o2] = studio({dir_ + "/run", "--rank", "2"});
    QCOMPARE(c2, 2);
    QVERIFY2(o2.contains("keel-studio: error: --rank: " + dir_ + "/run has ranks 0..1, not 2"),
             qPrintable(o2));
    const auto [c3, o3] = studio({dir_ + "/run/rank-0.db", "--rank", "0"});
    QCOMPARE(c3, 2);
    QVERIFY2(o3.contains("--rank needs a run folder"), qPrintable(o3));
    // --compare RUN_FOLDER: its recording of the rank shown (rank 0 beside a single recording);
    // it failed after the window opened ("recording run is a directory").
    const auto [c4, o4] = studio({dir_ + "/run", "--rank", "1", "--compare", dir_ + "/run",
                                  "--screenshot", dir_ + "/cmp.png"});
    QVERIFY2(c4 == 0, qPrintable(o4));
    QVERIFY2(o4.contains("compared with " + dir_ + "/run/rank-1.db"), qPrintable(o4));
    const auto [c5, o5] = studio(
        {dir_ + "/run/rank-1.db", "--compare", dir_ + "/run", "--screenshot", dir_ + "/cmp0.png"});
    QVERIFY2(c5 == 0, qPrintable(o5));
    QVERIFY2(o5.contains("compared with " + dir_ + "/run/rank-0.db"), qPrintable(o5));
    // Two run folders: rank by rank, the window on the rank that diverged first, with the
    // tolerances asked for (and bad ones refused in a line).
    const auto [c6, o6] = studio(
        {dir_ + "/clean", "--compare", dir_ + "/run", "--screenshot", dir_ + "/folders.png"});
    QVERIFY2(c6 == 0, qPrintable(o6));
    QVERIFY2(o6.contains("/clean/rank-1.db: 3 steps") &&
                 o6.contains("rank by rank: rank 1 diverged first; first divergence: A #"),
             qPrintable(o6));
    const auto [c7, o7] = studio({dir_ + "/clean", "--compare", dir_ + "/run", "--atol", "1e9",
                                  "--rtol", "1e9", "--screenshot", dir_ + "/folders-tol.png"});
    QVERIFY2(c7 == 0 && o7.contains("rank by rank: equal"), qPrintable(o7));
    const auto [c8, o8] = studio({dir_ + "/clean", "--compare", dir_ + "/run", "--rtol", "-1"});
    QCOMPARE(c8, 2);
    QVERIFY2(o8.trimmed() == "keel-studio: error: --rtol: expected a number >= 0, got '-1'",
             qPrintable(o8));
    const auto [c9, o9] = studio({dir_ + "/single.db", "--compare", dir_ + "/run", "--screenshot",
                                  dir_ + "/by-parameter.png"});
    QVERIFY2(c9 == 0 && o9.contains("by parameter: first difference at step 3, "), qPrintable(o9));
  }

 private:
  QString dir_;
};

QTEST_MAIN(StudioRanksTest)
#include "studio_ranks_test.moc"
