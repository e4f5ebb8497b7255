// Keel Studio on a multi-rank run folder (recorded here under mpirun, with one replica made to
// drift): the folder opens on a rank with the rank selector and the Ranks panel raised, the panel
// names the replica difference, its link shows that op on that rank, the selector switches rank,
// a damaged manifest is a dialog — and keel-studio's --rank through its real main().
#include <QComboBox>
#include <QFileInfo>
#include <QHeaderView>
#include <QLabel>
#include <QProcess>
#include <QScrollBar>
#include <QSignalSpy>
#include <QStandardPaths>
#include <QTableWidget>
#include <QtTest>
#include <cstdlib>
#include <fstream>

#include "keel/views/ranks_view.h"
#include "keel/views/selection.h"
#include "main_window.h"
#include "studio_test_util.h"
#include "view_test_util.h"

using keel::studio::MainWindow;
using keel::studio::test::waitIdle;
using keel::views::Side;

namespace {

// `keel record` of gpt-tiny at dp 2 under mpirun into `folder`, rank 1's fourth all_reduce (step
// 2's gradient bucket) changed.
bool recordDriftingRun(const QString& folder) {
  const std::string cmd =
      "cd '" KEEL_SOURCE_DIR
      "' && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "
      "OMPI_MCA_memory=^patcher ASAN_OPTIONS=detect_leaks=0 "
      "OMPI_MCA_orte_tmpdir_base='" +
      QFileInfo(folder).absolutePath().toStdString() +
      "' KEEL_BLAS_TUNE=0 KEEL_TEST_PERTURB=all_reduce:4 KEEL_TEST_PERTURB_RANK=1 timeout 120 "
      "mpirun -np 2 -x KEEL_BLAS_TUNE -x KEEL_TEST_PERTURB -x KEEL_TEST_PERTURB_RANK "
      "'" KEEL_CLI_PATH
      "' record --config tests/fixtures/gpt-tiny.json --steps 3 --dp 2 --md5 -o '" +
      folder.toStdString() + "' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

}  // namespace

class StudioRanksTest : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    QStandardPaths::setTestModeEnabled(true);
    dir_ = keel::views::test::tempDir();
    QVERIFY(recordDriftingRun(dir_ + "/run"));
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
  }

 private:
  QString dir_;
};

QTEST_MAIN(StudioRanksTest)
#include "studio_ranks_test.moc"
