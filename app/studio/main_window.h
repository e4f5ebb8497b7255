// MainWindow: Keel Studio's window. Wires one RunSource per recording (A, and B when comparing),
// the shared Selection, the views (graph in the centre; op table, inspector, diff, logs, memory and
// loss as docks) and a live Session. Wiring only: loading is RunSource's, drawing is the views'.
#pragma once
#include <QElapsedTimer>
#include <QMainWindow>
#include <QPointer>
#include <QString>
#include <QStringList>
#include <functional>
#include <optional>
#include <tuple>

#include "keel/views/run_data.h"
#include "load_state.h"
#include "session.h"

class QAction;
class QComboBox;
class QLabel;
class QMenu;
class QProgressBar;
class QSpinBox;
class QSplitter;

namespace keel::views {
class DiffRunner;
class DiffView;
class RunsDiffRunner;
class GraphView;
class InspectorView;
class LogView;
class LossPlot;
class MemoryView;
class TimelineView;
class NonFiniteBanner;
class OpTableView;
class RanksView;
class RunSource;
class Selection;
}  // namespace keel::views

namespace keel::studio {

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  explicit MainWindow(QWidget* parent = nullptr);
  ~MainWindow() override;

  // Replays a recording (side A). verify = SQLite quick_check (off for a file being written).
  // A run folder (a multi-rank run) opens its rank 0, with a rank selector and the Ranks panel.
  void openRecording(const QString& path, bool verify = true);
  // The run folder's rank `rank` in every view (a run folder must be open).
  void showRank(int rank);
  QString runFolder() const { return runFolder_; }
  // The rank to show when the next run folder opens (instead of rank 0); used once. A rank asked
  // for is kept when its folder is compared with another (not the rank that diverged first).
  void showRankOnOpen(int rank) {
    rankOnOpen_ = rank;
    rankAsked_ = true;
  }
  views::RanksView* ranksView() { return ranksView_; }
  // Opens `path` as side B, side by side with A, and diffs the two. A run folder is compared as
  // a whole too (Note [Comparing whole runs] in keel/views/run_data.h): with a run folder of one
  // layout open, rank by rank, and the window shows the rank that diverged first (unless a rank
  // was chosen); against a run of another layout, by parameter.
  void compareWith(const QString& path);
  // The tolerances of the comparisons (keel diff's --atol, --rtol, --ulps): the diff view's
  // fields show them, and the runs open are compared again with them.
  void setDiffTolerance(double atol, double rtol, uint64_t ulps);
  const storage::DiffOptions& diffOptions() const { return diffOptions_; }
  // The comparison of whole runs shown (none: nullptr).
  views::RunsPtr runsComparison() const { return runs_; }
  // A comparison is shown: an op-by-op diff, or the runs' by parameter (which has none).
  bool comparisonShown() const {
    return diff_ || (runs_ && runs_->kind == views::RunsComparison::Kind::ByParameter);
  }
  // File > Import > PyTorch memory snapshot: reads `snapshot` (Note [Torch memory snapshots],
  // storage/) on a worker thread into the recording `output` (written beside it and renamed, so
  // an existing file is replaced only by a complete one), then opens it with the Memory view
  // raised. Errors (a hostile or damaged pickle, an output that may not be written): a dialog.
  void importTorchMemory(const QString& snapshot, const QString& output);
  // Starts a live session recording to config.output.
  void startSession(const SessionConfig& config);
  void showStep(int64_t step);
  // The step to show when the next recording opens (instead of its first step, or a live
  // recording's last); used once.
  void showStepOnOpen(int64_t step) { stepOnOpen_ = step; }
  // The step to show when the next live session ends (instead of where it ended: its first
  // NaN/Inf op, or its last step); used once. See Note [Where a live session ends].
  void showStepWhenSessionEnds(int64_t step) { stepWhenEnded_ = step; }
  // The diff shown is of a state the live run A has left (Note [A live comparison]).
  bool comparisonOutOfDate() const;

  // Calls fn once nothing is loading (summary, step, op, logs, diff, graph layout): the
  // screenshot mode and the tests use it.
  void whenIdle(std::function<void()> fn);
  bool isIdle() const;
  // Saves the window, and with `viewsDir` also each view, as PNGs. Returns the first picture it
  // could not write, "" when all were written.
  QString saveScreenshots(const QString& windowPng, const QString& viewsDir = {});
  // File > Save screenshot's save: the window as a PNG at `path`, refused in a dialog where
  // --screenshot refuses it (screenshotRefusal: an input, a device, a name that is not .png, a
  // file that is not a picture). False when refused or not written.
  bool saveScreenshotAs(const QString& path);
  // File > Export (Note [Studio exports]): `kind` "trace-step" (the step shown), "trace",
  // "graph" (the step shown, SVG) or "csv" of the recording shown, to `path`, by the keel beside
  // this binary; exportFinished follows ("" or the error, also shown in a dialog).
  void exportRecording(const QString& kind, const QString& path);
  // The keel binary exports run ("": the one beside this binary; tests built elsewhere name it).
  void setKeelProgram(const QString& path) { keelProgram_ = path; }
  // Raises the dock named `view` ("memory" is dock.memory) on top of its tab group; false when
  // there is no such dock.
  bool showView(const QString& view);
  // The bottom dock view on top of its tab group ("ops", "memory", ...; "" none visible).
  QString raisedBottomView() const;

  Session* session() { return session_; }
  views::Selection* selection() { return selection_; }
  views::GraphView* graphView(views::Side side) {
    return side == views::Side::A ? graphA_ : graphB_;
  }
  views::OpTableView* opTable() { return opTable_; }
  views::InspectorView* inspector() { return inspector_; }
  views::DiffView* diffView() { return diffView_; }
  views::LogView* logView() { return logView_; }
  views::LossPlot* lossPlot() { return lossPlot_; }
  views::TimelineView* timeline() { return timeline_; }
  views::MemoryView* memoryView() { return memoryView_; }
  QAction* trackMemoryAction() { return trackMemoryAct_; }
  // The first-NaN/Inf banners: in the status bar and above the inspector.
  views::NonFiniteBanner* statusNonFiniteBanner() { return statusBanner_; }
  views::NonFiniteBanner* inspectorNonFiniteBanner() { return inspectorBanner_; }
  views::SummaryPtr summary(views::Side side) const {
    return side == views::Side::A ? summaryA_ : summaryB_;
  }
  views::StepPtr currentStep() const { return stepA_; }
  views::DiffPtr diffReport() const { return diff_; }
  QString lastError() const { return lastError_; }

  // File > Reload (Ctrl+R): the open recordings' steps written since (a file `keel record` is
  // still writing).
  void reload();
  // The status bar's text about the open recording (rich text).
  QString runStatusText() const;

 signals:
  void recordingOpened(views::Side side);
  void stepShown(qint64 step);    // the step's ops reached the views
  void opInspected(quint64 seq);  // the inspector shows this op
  void diffShown();
  void errorShown(QString message);    // an error dialog was shown
  void exportFinished(QString error);  // exportRecording's end: "" when written

 protected:
  void closeEvent(class QCloseEvent* e) override;
  void dragEnterEvent(class QDragEnterEvent* e) override;
  void dropEvent(class QDropEvent* e) override;

 private:
  // Raises the view asked for with showView, else `byDefault` (what a load would raise).
  void raiseBottom(QDockWidget* byDefault);
  QPointer<QDockWidget> shownView_;
  void buildActions();
  void buildDocks();
  void connectSources();
  void connectSession();
  void updateActions();
  void updateStatus();
  void showError(const QString& title, const QString& message);
  void addRecent(const QString& path);
  void rebuildRecentMenu();
  void openDialog();
  void importTorchMemoryDialog();
  void openFile(const QString& path, bool verify);
  void clearForOpened();  // the views, for the recording that has just opened
  void openRunFolder(const QString& folder);
  void leaveRunFolder();
  QString rankFile(int rank) const;
  void compareDialog();
  void newSessionDialog();
  void breakpointsDialog();
  void checkIdle();
  void busy(int delta);  // counts a load begun (+1) or ended (-1), then showBusy()
  void showBusy();       // the progress bar and idle waiters follow load_
  void loadMemory();     // (re)loads side A's allocator events into the memory view
  // Selects op `seq` of side A everywhere, showing its step first when another one is shown.
  void selectOpInStep(uint64_t seq, int64_t step);
  // "Break here" (graph and op table context menus): a breakpoint after op `seq` of the shown
  // step, its name in its scope ("op:matmul in blocks.0.mlp.w2"), added to the session's list.
  void breakHere(uint64_t seq);

  views::Selection* selection_;
  views::RunSource* sourceA_;
  views::RunSource* sourceB_;
  views::DiffRunner* diffRunner_;
  Session* session_;

  QSplitter* graphs_;
  views::GraphView* graphA_;
  views::GraphView* graphB_;
  views::OpTableView* opTable_;
  views::InspectorView* inspector_;
  views::DiffView* diffView_;
  views::LogView* logView_;
  views::LossPlot* lossPlot_;
  views::MemoryView* memoryView_;
  views::TimelineView* timeline_;
  views::NonFiniteBanner* statusBanner_ = nullptr;
  views::NonFiniteBanner* inspectorBanner_ = nullptr;
  QDockWidget* memoryDock_ = nullptr;
  bool memoryGrown_ = false;  // the bottom docks were made taller for the memory view once
  // A recording of allocator events alone (an imported PyTorch snapshot): the graph and the
  // right column have nothing to show, and are hidden while it is open (setMemoryOnly).
  void setMemoryOnly(bool on);
  QDockWidget *inspectorDock_ = nullptr, *lossDock_ = nullptr;
  std::vector<QWidget*> hiddenForMemory_;
  bool memoryOnly_ = false;
  QDockWidget* diffDock_ = nullptr;
  QDockWidget* opsDock_ = nullptr;
  views::RanksView* ranksView_ = nullptr;
  QDockWidget* ranksDock_ = nullptr;
  QString runFolder_;      // the open run folder; "" when a single recording is open
  QStringList rankFiles_;  // its ranks' recordings, by rank
  QComboBox* rankCombo_ = nullptr;
  QComboBox* compareRankCombo_ = nullptr;
  QList<QAction*> rankActs_;
  int rankOnOpen_ = 0;
  bool ranksFirst_ = false;  // the next load raises the Ranks panel (a run folder opened)
  QString pendingCompare_;   // compared again once the next side A has opened (rank switch)
  QString keelProgram_;      // setKeelProgram
  bool rankAsked_ = false;   // showRankOnOpen was called for the run folder opening
  // A rank switch (Note [Switching ranks]): the bottom view stays; the op at (step, index in the
  // step, name) is selected on the new rank when it has that op there.
  bool keepBottomView_ = false;
  std::optional<std::tuple<int64_t, int64_t, QString>> selectAtOnOpen_;
  // The rank shown was chosen (--rank, the rank selector, the Ranks panel): a comparison rank by
  // rank does not move to the rank that diverged first.
  bool rankChosen_ = false;
  QString compareFolder_;  // the run folder B compared (its rank of A's shown rank is open)
  storage::DiffOptions diffOptions_;
  // The comparison of whole runs (Note [Comparing whole runs]): which kind the open recordings
  // call for (none: one recording against another, op by op alone), the key of one made of them
  // with the options now, and the one shown, asked for and queued.
  std::optional<views::RunsComparison::Kind> runsKind() const;
  QString runsKey(views::RunsComparison::Kind kind) const;
  void startRuns(views::RunsComparison::Kind kind);
  views::RunsDiffRunner* runsRunner_;
  views::RunsPtr runs_;
  QString runsShownKey_, runsAskedKey_;
  bool runsRunning_ = false, runsAgain_ = false;
  // A comparison by parameter's first difference: its step and parameter, whose update (the
  // optimizer op of that scope) is selected on each side when the step arrives.
  std::optional<std::pair<int64_t, QString>> pendingUpdateA_, pendingUpdateB_;
  void selectUpdate(views::Side side, const views::StepPtr& step);

  QAction *newSessionAct_, *openAct_, *compareAct_, *runAct_, *pauseAct_, *stepAct_, *stopAct_,
      *breakpointsAct_, *fitAct_, *trackMemoryAct_;
  QMenu* recentMenu_;
  QSpinBox* stepSpin_;
  QLabel* statusRun_;
  QLabel* statusState_;
  QProgressBar* progress_;

  views::SummaryPtr summaryA_, summaryB_;
  views::StepPtr stepA_, stepB_;
  views::DiffPtr diff_;
  int64_t shownStep_ = -1;
  // showStep calls so far, and their count when side A's selected op was asked for: an op of
  // another step is shown in its step only if no step was shown in between.
  uint64_t stepsShown_ = 0, opAskedAtStep_ = 0;
  bool live_ = false;
  std::optional<uint64_t> pendingSelectA_;
  std::optional<uint64_t> failedSeq_;  // a failed session's failing op (painted as failed)
  bool failedShown_ = false;           // its step was shown once
  std::optional<int64_t> stepOnOpen_;
  std::optional<SessionConfig> lastSession_;  // the New session dialog's starting point
  int64_t headStep_ = 0;                      // a live session's latest step
  int64_t followedStep_ = 0;                  // the step the view last followed it to
  bool followingRun() const;
  // Shows `step` as the run's own move (following it, or where it ended): a selected op of
  // another step is let go when the step arrives, so the inspector never shows an op of a step
  // the graph does not.
  void followTo(int64_t step);
  bool dropOutsideStep_ = false;  // the step on its way was followTo's
  // The end of a live session, once the summary read after it has landed: the status line and
  // the step it shows (Note [Where a live session ends]).
  void sessionEnded(const views::SummaryPtr& s);
  void refreshA();                        // sourceA_->refresh(), counted in refreshesA_
  int refreshesA_ = 0;                    // side A's summary refreshes not yet answered
  bool endPending_ = false;               // sessionEnded waits for refreshesA_ to reach 0
  std::optional<int64_t> stepWhenEnded_;  // showStepWhenSessionEnds
  // A comparison with a live run A (Note [A live comparison]).
  void startDiff();           // diffs A with B now, or again once the diff in flight lands
  void updateDiffCurrency();  // says in the diff view (and status bar) whether the diff is current
  bool diffRunning_ = false, diffAgain_ = false;
  bool diffRaise_ = false;                    // the next diff is a new comparison's: raise its dock
  std::pair<QString, QString> diffPaths_;     // the recordings the diff in flight reads
  uint64_t liveMoves_ = 0;                    // the live run started to move (run, step, stop)
  uint64_t askedMoves_ = 0, shownMoves_ = 0;  // liveMoves_ when the diff asked / shown was asked
  QString livePos_;           // where the live run is ("after step 3", "at op #412 in step 4")
  QElapsedTimer followed_;    // since the view last followed a running session
  bool pendingLive_ = false;  // the open in flight is a live session's
  QString pendingRecent_, pendingRecentB_;  // listed in Open recent once they open
  LoadState load_;  // outstanding loads, the Ranks panel's and the memory view's load
  std::vector<std::function<void()>> idleWaiters_;
  QString lastError_;
};

}  // namespace keel::studio
