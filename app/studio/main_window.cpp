// MainWindow: see main_window.h.
#include "main_window.h"

#include <QAction>
#include <QApplication>
#include <QCloseEvent>
#include <QComboBox>
#include <QDir>
#include <QDockWidget>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QFutureWatcher>
#include <QGuiApplication>
#include <QKeySequence>
#include <QLabel>
#include <QMenuBar>
#include <QMessageBox>
#include <QMimeData>
#include <QProcess>
#include <QProgressBar>
#include <QSaveFile>
#include <QScreen>
#include <QScrollArea>
#include <QSettings>
#include <QSpinBox>
#include <QSplitter>
#include <QStatusBar>
#include <QTimer>
#include <QToolBar>
#include <QVBoxLayout>
#include <QtConcurrent/QtConcurrentRun>
#include <algorithm>
#include <limits>
#include <utility>

#include "command_line.h"
#include "dialogs.h"
#include "keel/base/output_path.h"
#include "keel/base/text.h"
#include "keel/capture/options.h"
#include "keel/error.h"
#include "keel/storage/errors.h"
#include "keel/storage/run_folder.h"
#include "keel/storage/torch_memory.h"
#include "keel/storage/writer.h"
#include "keel/views/diff_view.h"
#include "keel/views/graph_view.h"
#include "keel/views/inspector.h"
#include "keel/views/log_view.h"
#include "keel/views/loss_plot.h"
#include "keel/views/memory_view.h"
#include "keel/views/nonfinite_banner.h"
#include "keel/views/op_table.h"
#include "keel/views/ranks_view.h"
#include "keel/views/run_source.h"
#include "keel/views/selection.h"
#include "keel/views/timeline_view.h"

namespace keel::studio {

using views::Side;

namespace {
constexpr int kMaxRecent = 8;

QString stateName(Session::State s) {
  switch (s) {
    case Session::State::Idle:
      return "idle";
    case Session::State::Starting:
      return "starting";
    case Session::State::Paused:
      return "paused";
    case Session::State::Running:
      return "running";
    case Session::State::Stepping:
      return "stepping";
    case Session::State::Stopping:
      return "stopping";
    case Session::State::Finished:
      return "finished";
    case Session::State::Failed:
      return "failed";
  }
  return {};
}

// How the inspector names a run when comparing: its file and backend.
QString runLabel(const views::SummaryPtr& s, const QString& path) {
  const QString file = views::recordingName(s ? s->path : path);
  return s && !s->run.backend.empty() ? file + " · " + QString::fromStdString(s->run.backend)
                                      : file;
}
}  // namespace

MainWindow::MainWindow(QWidget* parent) : QMainWindow(parent) {
  views::registerViewTypes();
  setWindowTitle("Keel Studio");
  setAcceptDrops(true);
  setDockNestingEnabled(true);
  selection_ = new views::Selection(this);
  sourceA_ = new views::RunSource(this);
  sourceB_ = new views::RunSource(this);
  diffRunner_ = new views::DiffRunner(this);
  runsRunner_ = new views::RunsDiffRunner(this);
  session_ = new Session(this);

  graphA_ = new views::GraphView(selection_, Side::A);
  graphB_ = new views::GraphView(selection_, Side::B);
  graphB_->hide();
  graphs_ = new QSplitter(Qt::Horizontal);
  graphs_->addWidget(graphA_);
  graphs_->addWidget(graphB_);
  setCentralWidget(graphs_);

  buildActions();
  buildDocks();
  connectSources();
  connectSession();

  statusRun_ = new QLabel("No recording: File > Open recording, or New session");
  statusRun_->setTextFormat(Qt::RichText);  // a run that did not finish: its status in red
  statusState_ = new QLabel;
  progress_ = new QProgressBar;
  progress_->setRange(0, 0);
  progress_->setMaximumWidth(120);
  progress_->hide();
  statusBar()->addWidget(statusRun_, 1);
  statusBar()->addPermanentWidget(statusBanner_);
  statusBar()->addPermanentWidget(statusState_);
  statusBar()->addPermanentWidget(progress_);

  QSettings settings;
  // 1400x900, or what the screen has room for (a 1366x768 laptop): a first window that overflows
  // the screen hides the Inspector's right edge and the op count. A saved geometry wins.
  QSize first(1400, 900);
  if (const QScreen* screen = QGuiApplication::primaryScreen())
    first = first.boundedTo(screen->availableGeometry().size());
  resize(first);
  restoreGeometry(settings.value("window/geometry").toByteArray());
  restoreState(settings.value("window/state").toByteArray());
  ranksDock_->hide();  // a tab for a run folder only (it was there, empty, for every recording)
  rebuildRecentMenu();
  updateActions();
}

MainWindow::~MainWindow() {
  // Let go of the files the views read, then settle the live session's recording: it closed in
  // WAL mode while the views read it, and with no reader left it can leave it (its -wal and -shm
  // files go; storage::settleRecording).
  const QString written = session_ ? session_->recordingPath() : QString();
  delete sourceA_;
  delete sourceB_;
  sourceA_ = sourceB_ = nullptr;
  if (!written.isEmpty() && QFileInfo::exists(written))
    storage::settleRecording(written.toStdString());
}

void MainWindow::buildActions() {
  QMenu* file = menuBar()->addMenu("&File");
  newSessionAct_ = file->addAction("&New session…", this, &MainWindow::newSessionDialog);
  newSessionAct_->setShortcut(QKeySequence::New);
  openAct_ = file->addAction("&Open recording…", this, &MainWindow::openDialog);
  openAct_->setShortcut(QKeySequence::Open);
  compareAct_ = file->addAction("&Compare with…", this, &MainWindow::compareDialog);
  compareAct_->setShortcut(QKeySequence("Ctrl+D"));
  file->addAction("Open run &folder…", this, [this] {
    const QString d = QFileDialog::getExistingDirectory(this, "Open run folder (multi-rank run)");
    if (!d.isEmpty()) openRecording(d);
  });
  // A recording another process is still writing (keel record): its new steps, now.
  QAction* reload = file->addAction("Re&load", this, &MainWindow::reload);
  reload->setShortcut(QKeySequence("Ctrl+R"));
  recentMenu_ = file->addMenu("Open &recent");
  QMenu* import = file->addMenu("&Import");
  import->addAction("PyTorch &memory snapshot…", this, &MainWindow::importTorchMemoryDialog);
  // Note [Studio exports]: what `keel export` writes, of the recording shown.
  QMenu* exportMenu = file->addMenu("&Export");
  const struct {
    const char* kind;
    const char* label;
    const char* filter;
    const char* suffix;
  } kExports[] = {{"trace-step", "Chrome trace of this &step…", "Chrome traces (*.json)", "json"},
                  {"trace", "Chrome &trace of the whole run…", "Chrome traces (*.json)", "json"},
                  {"graph", "&Graph of this step (SVG)…", "SVG pictures (*.svg)", "svg"},
                  {"csv", "Op calls as &CSV…", "CSV files (*.csv)", "csv"}};
  for (const auto& e : kExports) {
    const QString kind = e.kind, filter = e.filter, suffix = e.suffix;
    exportMenu->addAction(e.label, this, [this, kind, filter, suffix] {
      if (!sourceA_->isOpen()) {
        showError("Export", "Open a recording first.");
        return;
      }
      QFileDialog d(this, "Export", QFileInfo(sourceA_->path()).completeBaseName() + "." + suffix,
                    filter);
      d.setAcceptMode(QFileDialog::AcceptSave);
      d.setDefaultSuffix(suffix);
      if (d.exec() == QDialog::Accepted && !d.selectedFiles().isEmpty())
        exportRecording(kind, d.selectedFiles().first());
    });
  }
  file->addSeparator();
  file->addAction("Save &screenshot…", this, [this] {
    QFileDialog d(this, "Save screenshot", "keel-studio.png", "PNG images (*.png)");
    d.setAcceptMode(QFileDialog::AcceptSave);
    d.setDefaultSuffix("png");
    // Asked here whether a file may be replaced, by the rule --screenshot follows (the dialog's
    // own "replace?" let a picture over a recording).
    d.setOption(QFileDialog::DontConfirmOverwrite);
    if (d.exec() != QDialog::Accepted || d.selectedFiles().isEmpty()) return;
    QString p = d.selectedFiles().first();
    if (!p.endsWith(".png", Qt::CaseInsensitive)) p += ".png";  // "nan.db": nan.db.png
    if (QFileInfo(p).isFile() && QFileInfo(p).size() > 0 &&
        QMessageBox::question(this, "Save screenshot", p + " exists. Replace the picture?") !=
            QMessageBox::Yes)
      return;
    saveScreenshotAs(p);
  });
  file->addSeparator();
  QAction* quit = file->addAction("&Quit", this, &QWidget::close);
  quit->setShortcut(QKeySequence::Quit);

  QMenu* run = menuBar()->addMenu("&Run");
  runAct_ = run->addAction("&Run", session_, &Session::run);
  runAct_->setShortcut(Qt::Key_F5);
  pauseAct_ = run->addAction("&Pause", session_, &Session::pause);
  pauseAct_->setShortcut(Qt::Key_F6);
  stepAct_ = run->addAction("&Step (one training step)", session_, &Session::step);
  stepAct_->setShortcut(Qt::Key_F10);
  stopAct_ = run->addAction("S&top", session_, [this] { session_->stop(); });
  stopAct_->setShortcut(QKeySequence("Shift+F5"));
  run->addSeparator();
  breakpointsAct_ = run->addAction("&Breakpoints…", this, &MainWindow::breakpointsDialog);
  breakpointsAct_->setShortcut(QKeySequence("Ctrl+B"));
  trackMemoryAct_ = run->addAction("Track &memory per step");
  trackMemoryAct_->setCheckable(true);
  trackMemoryAct_->setToolTip(
      "Live sessions: wrap each training step in a memory tracking section (Memory view)");
  trackMemoryAct_->setChecked(QSettings().value("session/trackMemoryPerStep", false).toBool());
  session_->setTrackMemoryPerStep(trackMemoryAct_->isChecked());
  connect(trackMemoryAct_, &QAction::toggled, this, [this](bool on) {
    session_->setTrackMemoryPerStep(on);
    QSettings().setValue("session/trackMemoryPerStep", on);
  });

  QMenu* view = menuBar()->addMenu("&View");
  fitAct_ = view->addAction("&Fit graph", this, [this] {
    graphA_->fitToView();
    if (graphB_->isVisible()) graphB_->fitToView();
  });
  fitAct_->setShortcut(QKeySequence("Ctrl+0"));
  view->addAction("Expand all modules", this, [this] {
    graphA_->expandAll();
    if (graphB_->isVisible()) graphB_->expandAll();
  });
  // Moving through a run from the keyboard: the steps, the first NaN/Inf, the bottom views.
  view->addSeparator();
  auto stepBy = [this](int delta) {
    if (!summaryA_ || shownStep_ < 0) return;
    const int next = int(shownStep_) + delta;
    if (next >= stepSpin_->minimum() && next <= stepSpin_->maximum()) stepSpin_->setValue(next);
  };
  QAction* prev = view->addAction("&Previous step", this, [stepBy] { stepBy(-1); });
  prev->setObjectName("previousStepAction");
  prev->setShortcut(QKeySequence("Alt+Left"));
  QAction* next = view->addAction("&Next step", this, [stepBy] { stepBy(1); });
  next->setObjectName("nextStepAction");
  next->setShortcut(QKeySequence("Alt+Right"));
  QAction* nan = view->addAction("First &NaN/Inf", this, [this] {
    if (summaryA_ && summaryA_->firstNonFinite)
      selectOpInStep(summaryA_->firstNonFinite->seq, summaryA_->firstNonFinite->step);
    else
      statusBar()->showMessage("No NaN or Inf in this recording's outputs", 5000);
  });
  nan->setObjectName("firstNonFiniteAction");
  nan->setShortcut(QKeySequence("Ctrl+Shift+N"));
  QMenu* bottom = view->addMenu("&Bottom view");
  int key = 1;
  for (const QString& name : kStudioViews) {  // --show's names, Alt+1 the first
    QAction* a = bottom->addAction(name.left(1).toUpper() + name.mid(1), this,
                                   [this, name] { showView(name); });
    a->setObjectName("showView." + name);
    a->setShortcut(QKeySequence(QString("Alt+%1").arg(key++)));
  }

  QToolBar* tb = addToolBar("Main");
  tb->setObjectName("toolbar.main");
  tb->setToolButtonStyle(Qt::ToolButtonTextOnly);
  tb->addAction(newSessionAct_);
  tb->addAction(openAct_);
  tb->addAction(compareAct_);
  tb->addSeparator();
  tb->addAction(runAct_);
  tb->addAction(pauseAct_);
  tb->addAction(stepAct_);
  tb->addAction(stopAct_);
  tb->addAction(breakpointsAct_);
  tb->addSeparator();
  tb->addWidget(new QLabel(" Step "));
  stepSpin_ = new QSpinBox;
  stepSpin_->setObjectName("stepSpin");
  stepSpin_->setRange(0, 0);
  stepSpin_->setToolTip("Training step to show (0: initialisation)");
  tb->addWidget(stepSpin_);
  connect(stepSpin_, &QSpinBox::valueChanged, this, [this](int v) {
    if (v == shownStep_) return;
    showStep(v);
    // The step shown holds the op selected: one of another step is let go when the step
    // arrives (the inspector described an op the graph and the table did not show).
    dropOutsideStep_ = true;
  });
  // A run folder's ranks (Note [Run folders]): the rank every view shows, and one to compare it
  // with in the diff view. Shown only while a run folder is open.
  rankCombo_ = new QComboBox;
  rankCombo_->setObjectName("rankCombo");
  rankCombo_->setToolTip("The rank whose recording every view shows");
  compareRankCombo_ = new QComboBox;
  compareRankCombo_->setObjectName("compareRankCombo");
  compareRankCombo_->setToolTip("Compare the shown rank with another rank of the run (diff view)");
  tb->addSeparator();
  rankActs_ = {tb->addWidget(new QLabel(" Rank ")), tb->addWidget(rankCombo_),
               tb->addWidget(new QLabel(" vs ")), tb->addWidget(compareRankCombo_)};
  for (QAction* a : rankActs_) a->setVisible(false);
  connect(rankCombo_, &QComboBox::activated, this, [this](int rank) {
    rankChosen_ = true;
    showRank(rank);
  });
  connect(compareRankCombo_, &QComboBox::activated, this, [this](int index) {
    if (index > 0) compareWith(rankFile(index - 1));
  });
  // The phases a graph shows: one selector, the graph's own (all phases, optimizer included);
  // the compared run's graph follows it, and the other way round.
  connect(graphA_, &views::GraphView::phaseFilterChanged, graphB_,
          &views::GraphView::setPhaseFilter);
  connect(graphB_, &views::GraphView::phaseFilterChanged, graphA_,
          &views::GraphView::setPhaseFilter);
}

void MainWindow::buildDocks() {
  auto dock = [this](const QString& title, const QString& name, QWidget* w, Qt::DockWidgetArea a) {
    auto* d = new QDockWidget(title, this);
    d->setObjectName(name);
    d->setWidget(w);
    addDockWidget(a, d);
    return d;
  };
  opTable_ = new views::OpTableView(selection_, Side::A);
  inspector_ = new views::InspectorView(selection_, Side::A);
  diffView_ = new views::DiffView(selection_, Side::A);
  logView_ = new views::LogView(selection_, Side::A);
  lossPlot_ = new views::LossPlot;
  memoryView_ = new views::MemoryView(selection_, Side::A);
  timeline_ = new views::TimelineView(selection_, Side::A);
  // The first-NaN/Inf banner sits above the inspector (and in the status bar); its button selects.
  statusBanner_ = new views::NonFiniteBanner;
  inspectorBanner_ = new views::NonFiniteBanner;
  for (views::NonFiniteBanner* b : {statusBanner_, inspectorBanner_})
    connect(b, &views::NonFiniteBanner::selectRequested, this,
            [this](quint64 seq, qint64 step) { selectOpInStep(seq, step); });
  auto* inspectorPane = new QWidget;
  auto* inspectorLayout = new QVBoxLayout(inspectorPane);
  inspectorLayout->setContentsMargins(0, 0, 0, 0);
  inspectorLayout->setSpacing(0);
  inspectorLayout->addWidget(inspectorBanner_);
  inspectorLayout->addWidget(inspector_, 1);
  QDockWidget* inspectorDock =
      dock("Inspector", "dock.inspector", inspectorPane, Qt::RightDockWidgetArea);
  QDockWidget* opsDock = dock("Ops", "dock.ops", opTable_, Qt::BottomDockWidgetArea);
  opsDock_ = opsDock;
  diffDock_ = dock("Diff", "dock.diff", diffView_, Qt::BottomDockWidgetArea);
  QDockWidget* logsDock = dock("Logs", "dock.logs", logView_, Qt::BottomDockWidgetArea);
  QDockWidget* lossDock = dock("Metrics", "dock.loss", lossPlot_, Qt::RightDockWidgetArea);
  inspectorDock_ = inspectorDock;
  lossDock_ = lossDock;
  // The memory view needs ~420 px of height for its timelines, block map and histogram: in a
  // shorter bottom area it scrolls, rather than holding the window taller than a 768-px screen.
  auto* memoryScroll = new QScrollArea;
  memoryScroll->setObjectName("memoryScroll");
  memoryScroll->setWidgetResizable(true);
  memoryScroll->setFrameShape(QFrame::NoFrame);
  memoryScroll->setWidget(memoryView_);
  memoryDock_ = dock("Memory", "dock.memory", memoryScroll, Qt::BottomDockWidgetArea);
  QDockWidget* timelineDock =
      dock("Timeline", "dock.timeline", timeline_, Qt::BottomDockWidgetArea);
  ranksView_ = new views::RanksView;
  ranksDock_ = dock("Ranks", "dock.ranks", ranksView_, Qt::BottomDockWidgetArea);
  connect(ranksView_, &views::RanksView::rankActivated, this, [this](int rank) {
    rankChosen_ = true;
    rankCombo_->setCurrentIndex(rank);
    showRank(rank);
  });
  connect(ranksView_, &views::RanksView::opActivated, this,
          [this](int rank, qint64 step, quint64 seq) {
            if (rankCombo_->currentIndex() == rank && summaryA_) {
              selectOpInStep(seq, step);
              return;
            }
            showStepOnOpen(step);
            rankChosen_ = true;
            showRank(rank);
            pendingSelectA_ = seq;
          });
  connect(ranksView_, &views::RanksView::failed, this, [this](const QString& msg) {
    load_.ranksEnded();
    showBusy();
    showError("Run folder", msg);
  });
  connect(ranksView_, &views::RanksView::loaded, this, [this] {
    load_.ranksEnded();
    showBusy();
  });
  tabifyDockWidget(opsDock, diffDock_);
  tabifyDockWidget(diffDock_, logsDock);
  tabifyDockWidget(logsDock, memoryDock_);
  tabifyDockWidget(memoryDock_, timelineDock);
  tabifyDockWidget(timelineDock, ranksDock_);
  // A live run's memory is reloaded when the Memory tab is looked at, not after every step.
  connect(memoryDock_, &QDockWidget::visibilityChanged, this, [this](bool visible) {
    if (visible && load_.memoryStale()) loadMemory();
    // The first time it shows, the bottom area grows to make room for the timeline and the map.
    if (visible && !memoryGrown_ && !memoryDock_->isFloating()) {
      memoryGrown_ = true;
      if (memoryDock_->height() < height() * 2 / 5)
        resizeDocks({memoryDock_}, {height() * 9 / 20}, Qt::Vertical);
    }
  });
  opsDock->raise();
  splitDockWidget(inspectorDock, lossDock, Qt::Vertical);
  resizeDocks({inspectorDock}, {540}, Qt::Horizontal);
  resizeDocks({opsDock}, {280}, Qt::Vertical);
  resizeDocks({inspectorDock, lossDock}, {540, 240}, Qt::Vertical);
  // Proportions for the window's first size, once it has one (a restored layout keeps its own):
  // the bottom docks a quarter of the height, the inspector two thirds of its column, so that at
  // 1366x768 a tensor's fields show without scrolling much.
  QTimer::singleShot(0, this, [this, inspectorDock, lossDock] {
    if (!QSettings().value("window/state").isNull()) return;
    // (The Memory tab, raised already by --show, keeps the room it grew to.)
    const int bottom = memoryGrown_ ? height() * 9 / 20 : std::max(160, height() / 4);
    resizeDocks({opsDock_}, {bottom}, Qt::Vertical);
    const int column = inspectorDock->height() + lossDock->height();
    resizeDocks({inspectorDock, lossDock}, {column * 2 / 3, column - column * 2 / 3}, Qt::Vertical);
  });
  QMenu* view = menuBar()->actions().size() > 2 ? menuBar()->actions()[2]->menu() : nullptr;
  if (view) {
    view->addSeparator();
    for (QDockWidget* d :
         {inspectorDock, opsDock, diffDock_, logsDock, memoryDock_, timelineDock, lossDock})
      view->addAction(d->toggleViewAction());
  }
}

namespace {

// Why a step of this recording may have no ops: its step range (every step's loss is recorded,
// its ops only inside the range), or no ops at all (allocator events only).
QString emptyStepNote(const views::RunSummary& s) {
  if (s.opCount == 0)
    return MainWindow::tr(
        "A recording of allocator events only (an imported PyTorch memory snapshot) is shown in "
        "the Memory view.");
  try {
    const capture::CaptureOptions o = capture::CaptureOptions::fromJson(s.run.captureOptionsJson);
    if (o.filter.stepMin > 0 || o.filter.stepMax < std::numeric_limits<int64_t>::max()) {
      const QString last = o.filter.stepMax == std::numeric_limits<int64_t>::max()
                               ? MainWindow::tr("the end")
                               : QString::number(o.filter.stepMax);
      return MainWindow::tr("This recording holds the ops of steps %1 to %2 only (--step-range).")
          .arg(o.filter.stepMin)
          .arg(last);
    }
  } catch (const std::exception&) {  // an import: no capture options
  }
  return MainWindow::tr("The capture's filters recorded no op of this step.");
}

}  // namespace

void MainWindow::connectSources() {
  using views::RunSource;
  connect(sourceA_, &RunSource::opened, this, [this](views::SummaryPtr s) {
    busy(-1);
    clearForOpened();
    setMemoryOnly(false);  // until its memory says it is one
    summaryA_ = s;
    graphA_->setRecordingNonFinite(s->firstNonFiniteSeq.has_value());  // opens coloured by NaNs
    const QString note = emptyStepNote(*s);
    graphA_->setEmptyStepNote(note);
    timeline_->setEmptyStepNote(note);
    statusBanner_->setSummary(s);
    inspectorBanner_->setSummary(s);
    int64_t last = s->steps.empty() ? 0 : s->steps.back().step;
    stepSpin_->setRange(0, int(last));
    lossPlot_->setRuns(summaryA_, summaryB_);
    updateStatus();
    // Replay: the op table (a run folder just opened: its Ranks panel); comparing: the diff
    // (unless a view was asked for: showView).
    if (!std::exchange(keepBottomView_, false) && !sourceB_->isOpen())
      raiseBottom(std::exchange(ranksFirst_, false) ? ranksDock_ : opsDock_);
    if (stepOnOpen_ && *stepOnOpen_ > last) stepOnOpen_ = last;  // a rank with fewer steps
    if (sourceB_->isOpen())
      inspector_->setCompare(runLabel(s, {}), runLabel(summaryB_, sourceB_->path()));
    if (sourceB_->isOpen()) graphA_->setRunLabel("A: " + runLabel(s, {}));
    emit recordingOpened(Side::A);
    if (!pendingCompare_.isEmpty()) compareWith(std::exchange(pendingCompare_, QString()));
    busy(1);
    sourceA_->requestLogs();
    // The first step with ops: a --step-range recording opened on an empty step 1.
    int64_t first = live_ ? last : (s->steps.empty() ? 0 : s->steps.front().step);
    if (!live_ && s->firstOpStep > first) first = s->firstOpStep;
    // A replay of a run that went NaN opens at its first NaN/Inf op, selected (what the user
    // opened it for), unless a step was asked for; the graph centres on the selection.
    if (!live_ && !stepOnOpen_ && s->firstNonFinite) {
      pendingSelectA_ = s->firstNonFinite->seq;
      first = s->firstNonFinite->step;
    }
    // A live session follows the run from the step shown now: steps that finished while the
    // recording was opening set followedStep_ past it, and the view, no longer "at the head",
    // stayed on that first step to the end (seen under load).
    if (live_ && !stepOnOpen_) followedStep_ = first;
    showStep(std::exchange(stepOnOpen_, std::nullopt).value_or(first));
    loadMemory();  // after the step: the worker answers in order, and the graph comes first
  });
  connect(sourceA_, &RunSource::summaryUpdated, this, [this](views::SummaryPtr s) {
    busy(-1);
    refreshesA_ = std::max(0, refreshesA_ - 1);
    summaryA_ = s;
    statusBanner_->setSummary(s);
    inspectorBanner_->setSummary(s);
    int64_t last = s->steps.empty() ? 0 : s->steps.back().step;
    stepSpin_->setMaximum(int(std::max<int64_t>(last, stepSpin_->maximum())));
    lossPlot_->setRuns(summaryA_, summaryB_);
    updateStatus();
    if (memoryDock_->visibleRegion().isEmpty())
      load_.memoryOutdated();
    else
      loadMemory();
    // The summary read after a live session ended (the replies come in order).
    if (endPending_ && refreshesA_ == 0) {
      endPending_ = false;
      sessionEnded(s);
    }
  });
  connect(sourceB_, &RunSource::summaryUpdated, this, [this](views::SummaryPtr s) {  // reload
    busy(-1);
    summaryB_ = s;
    lossPlot_->setRuns(summaryA_, summaryB_);
    updateStatus();
  });
  connect(sourceA_, &RunSource::memoryLoaded, this, [this](views::MemoryPtr m) {
    busy(-1);
    if (!load_.memoryLanded()) return;
    memoryView_->setMemory(m);
    // A recording of allocator events alone (an imported PyTorch snapshot) has no graph or loss
    // to show: the Memory view takes the window.
    if (summaryA_ && summaryA_->opCount == 0 && m && m->eventCount() > 0 && !live_ &&
        !sourceB_->isOpen())
      setMemoryOnly(true);
    if (load_.memoryStale() && !memoryDock_->visibleRegion().isEmpty()) loadMemory();
  });
  connect(sourceA_, &RunSource::memoryFailed, this, [this](const QString& msg) {
    busy(-1);
    if (!load_.memoryLanded()) return;
    memoryView_->showMessage("Cannot load the allocator events: " + msg.toHtmlEscaped());
    showError("Cannot load the allocator events", msg);
  });
  // Clicking a block selects its op; show that op's step so the graph and table have it too.
  connect(memoryView_, &views::MemoryView::blockClicked, this, [this](quint64 seq, qint64 step) {
    if (seq && step != shownStep_) {
      pendingSelectA_ = seq;
      showStep(step);
    }
  });
  connect(sourceB_, &RunSource::opened, this, [this](views::SummaryPtr s) {
    busy(-1);
    if (!pendingRecentB_.isEmpty()) addRecent(std::exchange(pendingRecentB_, QString()));
    summaryB_ = s;
    graphB_->setRecordingNonFinite(s->firstNonFiniteSeq.has_value());
    inspector_->setCompare(runLabel(summaryA_, sourceA_->path()), runLabel(s, {}));
    graphA_->setRunLabel("A: " + runLabel(summaryA_, sourceA_->path()));
    graphB_->setRunLabel("B: " + runLabel(s, {}));
    lossPlot_->setRuns(summaryA_, summaryB_);
    graphB_->show();
    graphB_->setPhaseFilter(graphA_->phaseFilter());
    updateStatus();
    emit recordingOpened(Side::B);
    if (shownStep_ >= 0) {
      busy(1);
      sourceB_->requestStep(shownStep_);
    }
    if (summaryA_) {
      diffRaise_ = true;  // a new comparison: its diff comes to the front
      startDiff();
    }
  });
  for (views::RunSource* src : {sourceA_, sourceB_}) {
    // An open that failed: what was asked for with it goes too (the recording shown stays).
    connect(src, &RunSource::openFailed, this, [this, src] {
      (src == sourceA_ ? pendingRecent_ : pendingRecentB_).clear();
      if (src != sourceA_) return;
      pendingSelectA_.reset();
      stepOnOpen_.reset();
      keepBottomView_ = false;  // a rank switch that failed (Note [Switching ranks])
      selectAtOnOpen_.reset();
      failedSeq_.reset();
    });
    connect(src, &RunSource::failed, this, [this, src](const QString& msg) {
      busy(-1);
      if (src == sourceA_ && !summaryA_) memoryView_->clear();
      showError(src == sourceA_ ? "Cannot open recording" : "Cannot open recording to compare",
                msg);
    });
  }
  connect(sourceA_, &RunSource::stepLoaded, this, [this](views::StepPtr step) {
    busy(-1);
    if (step->step != shownStep_) return;  // a newer request is on its way
    stepA_ = step;
    busy(1);
    graphA_->setStep(step);
    if (pendingUpdateA_ && pendingUpdateA_->first == step->step) selectUpdate(Side::A, step);
    // The op in the place of the one selected on the rank shown before (Note [Switching ranks]).
    if (const auto at = std::exchange(selectAtOnOpen_, std::nullopt);
        at && !pendingSelectA_ && std::get<0>(*at) == step->step &&
        std::get<1>(*at) < int64_t(step->ops.size()) &&
        QString::fromStdString(step->ops[size_t(std::get<1>(*at))].name) == std::get<2>(*at))
      pendingSelectA_ = step->ops[size_t(std::get<1>(*at))].seq;
    if (failedSeq_ && step->indexOf(*failedSeq_) >= 0) graphA_->markFailed(*failedSeq_);
    opTable_->setStep(step);
    timeline_->setStep(step);
    busy(-1);
    // The studio moved to this step on its own (following the run, or where it ended): an op
    // selected in another step is let go, so the inspector does not describe an op the graph
    // and the op table do not show.
    if (std::exchange(dropOutsideStep_, false) && !pendingSelectA_)
      if (const auto a = selection_->current(Side::A); a && step->indexOf(*a) < 0) {
        selection_->clear();
        inspector_->clear();
      }
    if (pendingSelectA_) {
      selection_->select(Side::A, *pendingSelectA_, true);
      pendingSelectA_.reset();
    }
    emit stepShown(step->step);
  });
  connect(sourceB_, &RunSource::stepLoaded, this, [this](views::StepPtr step) {
    busy(-1);
    if (step->step != shownStep_) return;
    stepB_ = step;
    graphB_->setStep(step);
    if (pendingUpdateB_ && pendingUpdateB_->first == step->step) selectUpdate(Side::B, step);
  });
  connect(sourceA_, &RunSource::logsLoaded, this, [this](views::LogsPtr logs) {
    busy(-1);
    logView_->setLogs(logs);
  });
  connect(selection_, &views::Selection::selected, this, [this](Side side, quint64 seq) {
    if (side == Side::A) opAskedAtStep_ = stepsShown_;  // see opLoaded
    busy(1);
    (side == Side::A ? sourceA_ : sourceB_)->requestOp(seq);
    // Comparing: an op chosen on one side brings its aligned op on the other, so the inspector
    // shows a pair.
    if (diff_)
      for (const auto& p : diff_->pairs)
        if (p.inA && p.inB && (side == Side::A ? p.seqA : p.seqB) == seq) {
          selection_->select(side == Side::A ? Side::B : Side::A,
                             side == Side::A ? p.seqB : p.seqA);
          break;
        }
  });
  for (views::RunSource* src : {sourceA_, sourceB_}) {
    connect(src, &RunSource::opLoaded, this, [this, src](views::OpDetailsPtr d) {
      busy(-1);
      // A failed session's failing op: show its step, select it there (and paint it failed).
      if (src == sourceA_ && failedSeq_ == d->op.seq && !std::exchange(failedShown_, true) &&
          d->error.empty()) {
        selectOpInStep(d->op.seq, d->op.step);
        return;
      }
      // An op of another step (--select-op, a log line): its step is shown, so the graph and
      // the op table agree with the inspector instead of showing another step unselected.
      // Not where a step was shown since the op was asked for: a late reply must not undo it.
      if (src == sourceA_ && d->error.empty() && d->op.step != shownStep_ && stepA_ &&
          opAskedAtStep_ == stepsShown_) {
        selectOpInStep(d->op.seq, d->op.step);
        return;
      }
      inspector_->setDetails(src == sourceA_ ? Side::A : Side::B, d);
      if (d->damaged) showError("Damaged recording", QString::fromStdString(d->error));
      emit opInspected(d->op.seq);
    });
  }
  connect(diffRunner_, &views::DiffRunner::finished, this, [this](views::DiffPtr report) {
    busy(-1);
    diffRunning_ = false;
    shownMoves_ = askedMoves_;
    if (std::exchange(diffAgain_, false)) startDiff();
    // Of recordings no longer side by side (another opened meanwhile): dropped.
    if (!summaryA_ || !summaryB_ || !sourceB_->isOpen() ||
        diffPaths_ != std::pair(summaryA_->path, summaryB_->path))
      return;
    diff_ = report;
    diffView_->setReport(report);
    inspector_->setDiff(report);
    graphA_->setDiff(report);
    graphB_->setDiff(report);
    graphA_->setAutomaticColorMode(views::GraphView::ColorMode::Divergence);
    graphB_->setAutomaticColorMode(views::GraphView::ColorMode::Divergence);
    // A new comparison raises the diff; the same one made again leaves the dock the user chose.
    if (std::exchange(diffRaise_, false)) raiseBottom(diffDock_);
    updateDiffCurrency();
    emit diffShown();
  });
  connect(diffRunner_, &views::DiffRunner::failed, this, [this](const QString& msg) {
    busy(-1);
    diffRunning_ = false;
    if (std::exchange(diffAgain_, false)) startDiff();
    diffView_->showFailure(msg);
    showError("Cannot compare the recordings", msg);
  });
  connect(runsRunner_, &views::RunsDiffRunner::finished, this, [this](views::RunsPtr runs) {
    busy(-1);
    runsRunning_ = false;
    if (std::exchange(runsAgain_, false)) startDiff();
    // Of runs no longer side by side, or with other options: dropped.
    const std::optional<views::RunsComparison::Kind> kind = runsKind();
    if (!kind || *kind != runs->kind || runsKey(*kind) != runsAskedKey_) return;
    runs_ = runs;
    runsShownKey_ = runsAskedKey_;
    const int rank = runFolder_.isEmpty() ? -1 : std::max(0, rankCombo_->currentIndex());
    diffView_->setRuns(runs, rank);
    if (runs->kind == views::RunsComparison::Kind::RankByRank) {
      // The rank that diverged first, once, unless the user chose one.
      if (runs->firstRank && !std::exchange(rankChosen_, true) && *runs->firstRank != rank) {
        statusBar()->showMessage(
            QString("Rank %1 diverged first: showing it (the diff view lists every rank)")
                .arg(*runs->firstRank),
            8000);
        showRank(*runs->firstRank);
      }
      return;
    }
    // By parameter: the first parameter to differ has its update selected on both sides, in
    // its step.
    if (runs->firstStep) {
      pendingUpdateA_ = pendingUpdateB_ = std::pair{*runs->firstStep, runs->firstParameter};
      if (shownStep_ == *runs->firstStep) {
        if (stepA_) selectUpdate(Side::A, stepA_);
        if (stepB_) selectUpdate(Side::B, stepB_);
      } else {
        showStep(*runs->firstStep);
      }
    }
    if (std::exchange(diffRaise_, false)) raiseBottom(diffDock_);
    emit diffShown();
  });
  connect(runsRunner_, &views::RunsDiffRunner::failed, this, [this](const QString& msg) {
    busy(-1);
    runsRunning_ = false;
    if (std::exchange(runsAgain_, false)) startDiff();
    if (runsKind() == views::RunsComparison::Kind::ByParameter) diffView_->showFailure(msg);
    showError("Cannot compare the runs", msg);
  });
  connect(diffView_, &views::DiffView::toleranceChanged, this,
          [this](double atol, double rtol, quint64 ulps) { setDiffTolerance(atol, rtol, ulps); });
  for (views::GraphView* g : {graphA_, graphB_})
    connect(g, &views::GraphView::layoutFinished, this, [this] { checkIdle(); });
  connect(graphA_, &views::GraphView::breakHereRequested, this,
          [this](quint64 seq) { breakHere(seq); });
  connect(opTable_, &views::OpTableView::breakHereRequested, this,
          [this](quint64 seq) { breakHere(seq); });
}

void MainWindow::connectSession() {
  connect(session_, &Session::stateChanged, this, [this](Session::State s) {
    // Running again: the "Paused after op ..." message is stale.
    if (s == Session::State::Running || s == Session::State::Stepping) statusBar()->clearMessage();
    // The recording changes from here: a comparison with it is out of date, and is made again
    // when the run holds still (Note [A live comparison]).
    if (s == Session::State::Running || s == Session::State::Stepping ||
        s == Session::State::Stopping)
      ++liveMoves_;
    if (s == Session::State::Paused && (diffRunning_ ? askedMoves_ : shownMoves_) != liveMoves_)
      startDiff();
    updateActions();
    updateStatus();
    updateDiffCurrency();
  });
  connect(session_, &Session::started, this, [this](const QString& path) {
    headStep_ = followedStep_ = 0;
    followed_.invalidate();
    livePos_ = "before step 1";
    endPending_ = false;
    openRecording(path, /*verify=*/false);
  });
  connect(session_, &Session::stepFinished, this, [this](qint64 step, double) {
    refreshA();
    livePos_ = QString("after step %1").arg(step);
    stepSpin_->setMaximum(int(std::max<qint64>(step, stepSpin_->maximum())));
    // Follow the run: after every step when it is not racing; while it runs, at most once a
    // second, and only while the step shown is the latest (it stayed on step 0; a step the user
    // went back to is left alone).
    const bool running = session_->state() == Session::State::Running;
    headStep_ = step;
    updateDiffCurrency();
    if (!running || (followingRun() && (!followed_.isValid() || followed_.elapsed() >= 1000))) {
      followed_.start();
      followTo(step);  // the Step box follows
    }
  });
  connect(session_, &Session::pausedAt, this, [this](quint64 seq, qint64 step, const QString& why) {
    statusBar()->showMessage(
        QString("Paused after op #%1 (step %2): %3").arg(seq).arg(step).arg(why));
    // Inside a step, or after its last op (a step-level breakpoint: stepFinished came first).
    if (step > headStep_) livePos_ = QString("at op #%1 in step %2").arg(seq).arg(step);
    updateDiffCurrency();
    refreshA();
    pendingSelectA_ = seq;
    stepSpin_->setMaximum(int(std::max<qint64>(step, stepSpin_->maximum())));
    showStep(step);  // the Step box follows
  });
  connect(session_, &Session::failed, this, [this](const QString& msg, quint64 seq) {
    updateActions();
    QString text = msg;
    if (seq) {
      text += QString(
                  "\n\nThe failing op (#%1) is selected: the inspector shows its inputs, "
                  "call stack and the error in its log.")
                  .arg(seq);
      // The session's recording, not one opened before the session started.
      const bool open = sourceA_->isOpen() && sourceA_->path() == session_->recordingPath();
      if (!open && QFileInfo(session_->recordingPath()).isFile()) {
        // It failed while setting up (an op of step 0, building the model): the recording was
        // not open yet. Open it at step 0 with the failing op selected, as a step's failure.
        openRecording(session_->recordingPath(), /*verify=*/false);
        failedSeq_ = seq;
        failedShown_ = true;  // shown through the step's load, not through requestOp
        pendingSelectA_ = seq;
        stepOnOpen_ = 0;
      } else if (open) {
        failedSeq_ = seq;
        failedShown_ = false;
        refreshA();
        busy(1);
        sourceA_->requestLogs();
        busy(1);
        sourceA_->requestOp(seq);  // its step comes with it: see the opLoaded handler
      }
    }
    showError("Session failed", text);
    startDiff();  // the run's end, as its recording now says (Note [A live comparison])
  });
  connect(session_, &Session::finished, this, [this] {
    // Where it ended and the status line wait for the summary read now (sessionEnded): what
    // the recording holds, the step the run stopped in and its first NaN/Inf included.
    if (sourceA_->isOpen()) {
      refreshA();
      endPending_ = true;
      busy(1);
      sourceA_->requestLogs();
    } else {
      statusBar()->showMessage("Session ended: " + session_->recordingPath(), 8000);
    }
    startDiff();  // the finished recording, compared again (Note [A live comparison])
    addRecent(session_->recordingPath());
  });
}

// Note [Where a live session ends]
// A session that ran to its end shows what a replay of its recording opens at: its first NaN/Inf
// op, selected, in its step (a run that went NaN ended on a step of red ops with nothing
// selected, while the same file reopened showed where it went wrong), else its last step. That
// is where the view was following the run to; a step or an op the user picked (or the op a
// breakpoint paused at, selected, where a Stop ended it) stays, with its step. `--step N` asks
// for a step instead. The status line says where the recording ends: "stopped in step 7 of 10
// (6 complete)" for a run stopped inside a step, whose ops the file keeps.
void MainWindow::sessionEnded(const views::SummaryPtr& s) {
  int64_t done = 0;  // the last complete step
  for (const storage::StepRecord& st : s->steps)
    if (st.endNs > 0) done = st.step;
  const int64_t total = session_->totalSteps();
  const QString path = session_->recordingPath();
  if (session_->state() == Session::State::Finished)
    statusBar()->showMessage("Session finished: " + path, 8000);
  else if (s->incompleteStep > 0)
    statusBar()->showMessage(QString("Session stopped in step %1 of %2 (%3 complete): %4")
                                 .arg(s->incompleteStep)
                                 .arg(total)
                                 .arg(done)
                                 .arg(path));
  else if (done > 0)
    statusBar()->showMessage(
        QString("Session stopped after step %1 of %2: %3").arg(done).arg(total).arg(path));
  else
    statusBar()->showMessage(
        QString("Session stopped before step 1 of %1: %2").arg(total).arg(path));
  if (stepWhenEnded_) {
    followTo(*std::exchange(stepWhenEnded_, std::nullopt));
  } else if (!followingRun()) {
    // The user's step or op, or the op the run paused at: left as it is.
  } else if (s->firstNonFinite) {
    followedStep_ = s->firstNonFinite->step;
    selectOpInStep(s->firstNonFinite->seq, s->firstNonFinite->step);
  } else if (headStep_ > shownStep_) {
    followTo(headStep_);  // the last step (the follow throttle may have skipped it)
  }
}

void MainWindow::selectUpdate(Side side, const views::StepPtr& step) {
  std::optional<std::pair<int64_t, QString>>& pending =
      side == Side::A ? pendingUpdateA_ : pendingUpdateB_;
  const QString parameter = pending->second;
  pending.reset();
  for (const storage::OpRecord& op : step->ops)
    if (op.phase == storage::Phase::Optimizer && op.name.ends_with("_step") &&
        QString::fromStdString(op.scope) == parameter) {  // adamw_step, sgd_step
      selection_->select(side, op.seq);
      return;
    }
}

void MainWindow::refreshA() {
  ++refreshesA_;
  busy(1);
  sourceA_->refresh();
}

void MainWindow::followTo(int64_t step) {
  followedStep_ = step;
  showStep(step);
  dropOutsideStep_ = true;
}

// Note [A live comparison]
// A comparison whose run A is a live session follows it: the diff is made again whenever the run
// holds still — paused (Pause, a breakpoint, the end of a Step), finished, stopped or failed — and
// on File > Reload. While it runs, the diff shown is of a state the run has left, and its header
// says so first ("OUT OF DATE: this comparison covers A's live run up to op #41 (step 0); the
// run has moved on (now running step 3) ..."), as does the status bar. It is not redone while the
// run moves, even at the other views' once a second: a diff reads both recordings whole, so its
// cost grows with the run (`keel diff` of two 10-step gpt-mini recordings with MD5s and
// statistics: 0.16 s on a 2-core VM, so about 1.6 s by step 1000, past the period: a core taken
// from the training for good); and a verdict about a run moving under it, its current step half
// written, is stale before it can be read. Where the run holds still the diff is read, and there
// it is current. One diff at a time: one asked for while another is in flight is made when that
// one lands.
void MainWindow::startDiff() {
  if (!summaryA_ || !summaryB_ || !sourceB_->isOpen()) return;
  // The runs as a whole (Note [Comparing whole runs]): the comparison shown while it is of these
  // runs with these options, and one made when it is not.
  const std::optional<views::RunsComparison::Kind> kind = runsKind();
  const bool runsCurrent = kind && runs_ && runsShownKey_ == runsKey(*kind);
  diffView_->setRuns(runsCurrent ? runs_ : nullptr,
                     runFolder_.isEmpty() ? -1 : std::max(0, rankCombo_->currentIndex()));
  if (kind && !runsCurrent) startRuns(*kind);
  if (kind == views::RunsComparison::Kind::ByParameter) {
    // No op-by-op diff: one shown before (of other recordings) goes.
    diff_.reset();
    diffView_->clear();
    inspector_->setDiff(nullptr);
    graphA_->setDiff(nullptr);
    graphB_->setDiff(nullptr);
    return;
  }
  if (diffRunning_) {
    diffAgain_ = true;
    updateDiffCurrency();
    return;
  }
  diffRunning_ = true;
  askedMoves_ = liveMoves_;
  diffPaths_ = {summaryA_->path, summaryB_->path};
  busy(1);
  diffRunner_->start(diffPaths_.first, diffPaths_.second, diffOptions_);
  updateDiffCurrency();
}

std::optional<views::RunsComparison::Kind> MainWindow::runsKind() const {
  if (!summaryA_ || !summaryB_) return std::nullopt;
  const storage::RunInfo &a = summaryA_->run, &b = summaryB_->run;
  const bool folderA = !runFolder_.isEmpty(), folderB = !compareFolder_.isEmpty();
  using Kind = views::RunsComparison::Kind;
  if (folderA && folderB)
    return a.worldSize == b.worldSize && a.layout == b.layout ? Kind::RankByRank
                                                              : Kind::ByParameter;
  // A run folder against one process (a rank's own file against another is op by op).
  if ((folderA && b.worldSize <= 1) || (folderB && a.worldSize <= 1)) return Kind::ByParameter;
  return std::nullopt;
}

QString MainWindow::runsKey(views::RunsComparison::Kind kind) const {
  const QString a = runFolder_.isEmpty() ? summaryA_->path : runFolder_;
  const QString b = compareFolder_.isEmpty() ? summaryB_->path : compareFolder_;
  // A live run A is compared again as it moves (Note [A live comparison]).
  return QString("%1|%2|%3|%4|%5|%6|%7")
      .arg(int(kind))
      .arg(a, b)
      .arg(diffOptions_.atol, 0, 'g', 17)
      .arg(diffOptions_.rtol, 0, 'g', 17)
      .arg(diffOptions_.maxUlps)
      .arg(live_ ? liveMoves_ : 0);
}

void MainWindow::startRuns(views::RunsComparison::Kind kind) {
  const QString key = runsKey(kind);
  if (runsRunning_) {  // made once the one in flight lands, unless that is this one
    runsAgain_ = runsAskedKey_ != key;
    return;
  }
  runsRunning_ = true;
  runsAskedKey_ = key;
  busy(1);
  runsRunner_->start(kind, runFolder_.isEmpty() ? summaryA_->path : runFolder_,
                     compareFolder_.isEmpty() ? summaryB_->path : compareFolder_, diffOptions_);
}

void MainWindow::setDiffTolerance(double atol, double rtol, uint64_t ulps) {
  diffOptions_.atol = atol;
  diffOptions_.rtol = rtol;
  diffOptions_.maxUlps = ulps;
  diffView_->setTolerance(atol, rtol, ulps);
  startDiff();  // the runs open, compared again with these
}

bool MainWindow::comparisonOutOfDate() const {
  if (!diff_ || !live_) return false;
  const Session::State st = session_->state();
  const bool moving = st == Session::State::Running || st == Session::State::Stepping ||
                      st == Session::State::Stopping;
  return moving || shownMoves_ != liveMoves_;
}

void MainWindow::updateDiffCurrency() {
  QString note;
  if (comparisonOutOfDate()) {
    const Session::State st = session_->state();
    const bool moving = st == Session::State::Running || st == Session::State::Stepping ||
                        st == Session::State::Stopping;
    // What the diff covers of A: up to its last op of A (the run wrote on while it read).
    const storage::OpPair* last = nullptr;
    for (const storage::OpPair& p : diff_->pairs)
      if (p.inA && (!last || p.seqA > last->seqA)) last = &p;
    note = last ? QString("this comparison covers A's live run up to op #%1 (step %2)")
                      .arg(last->seqA)
                      .arg(last->step)
                : QString("this comparison was made before A's live run recorded an op");
    const QString now =
        st == Session::State::Stopping ? QString("stopping")
        : moving ? QString("running step %1").arg(std::min(headStep_ + 1, session_->totalSteps()))
                 : livePos_;
    note += QString("; the run has moved on (now %1)").arg(now.isEmpty() ? "later" : now);
    note += moving ? " and is compared again when it pauses or finishes."
                   : " and is being compared again…";
  }
  diffView_->setOutOfDate(note);
  updateStatus();
}

void MainWindow::openRecording(const QString& path, bool verify) {
  if (storage::isRunFolder(path.toStdString())) {
    openRunFolder(path);
    return;
  }
  // A PyTorch memory snapshot: the studio imports it itself (the reader's hint names keel's
  // command line).
  if (storage::looksLikePickle(path.toStdString())) {
    showError("Open recording",
              path +
                  " is not a Keel recording (it is a Python pickle: a PyTorch memory snapshot "
                  "is opened after File > Import > PyTorch memory snapshot… turns it into a "
                  "recording)");
    return;
  }
  if (QFileInfo(path).isDir()) {  // "is a directory, not a regular file" said too little
    showError("Open recording", QString::fromStdString(storage::notARunFolder(path.toStdString())));
    return;
  }
  // A file outside the open run folder leaves it.
  if (!runFolder_.isEmpty() &&
      QFileInfo(path).absolutePath() != QFileInfo(runFolder_).absoluteFilePath())
    leaveRunFolder();
  openFile(path, verify);
}

void MainWindow::openRunFolder(const QString& folder) {
  storage::RunManifest m;
  try {
    m = storage::readManifest(folder.toStdString());
  } catch (const std::exception& e) {
    showError("Open run folder", QString::fromStdString(e.what()));
    return;
  }
  runFolder_ = folder;
  rankChosen_ = std::exchange(rankAsked_, false);
  rankFiles_.clear();
  rankCombo_->clear();
  compareRankCombo_->clear();
  compareRankCombo_->addItem("—");
  for (const storage::RankEntry& r : m.ranks) {
    rankFiles_ << QString::fromStdString(storage::rankPath(folder.toStdString(), m, r.rank));
    const QString label = QString("%1 (dp %2, tp %3)").arg(r.rank).arg(r.dpRank).arg(r.tpRank);
    rankCombo_->addItem(label);
    compareRankCombo_->addItem(label);
  }
  for (QAction* a : rankActs_) a->setVisible(true);
  ranksDock_->show();
  load_.ranksBegun();
  showBusy();
  ranksView_->load(folder);
  ranksFirst_ = true;
  addRecent(folder);
  showRank(std::clamp(std::exchange(rankOnOpen_, 0), 0, int(rankFiles_.size()) - 1));
}

void MainWindow::leaveRunFolder() {
  runFolder_.clear();
  pendingCompare_.clear();
  rankFiles_.clear();
  for (QAction* a : rankActs_) a->setVisible(false);
  ranksView_->clear();
  if (shownView_ != ranksDock_) ranksDock_->hide();
}

QString MainWindow::rankFile(int rank) const {
  return rank >= 0 && rank < rankFiles_.size() ? rankFiles_[rank] : QString();
}

void MainWindow::showRank(int rank) {
  const QString f = rankFile(rank);
  if (f.isEmpty()) return;
  if (rankCombo_->currentIndex() != rank) rankCombo_->setCurrentIndex(rank);
  ranksView_->setShownRank(rank);
  // A comparison open (another rank, or any recording) is opened again once the new rank is:
  // its diff is against A, which changes.
  // Note [Switching ranks]: ranks are compared by looking at the same place on each, so a switch
  // from a rank of this folder keeps the step shown (the new rank's last when it has fewer), the
  // bottom view raised, and the selected op where the new rank has an op of that name in its
  // place in the step (a dp replica runs the same program; a tp rank mostly does).
  if (summaryA_ && rankFiles_.contains(summaryA_->path)) {
    if (!stepOnOpen_ && shownStep_ >= 0) stepOnOpen_ = shownStep_;
    keepBottomView_ = true;
    if (const auto a = selection_->current(Side::A); a && stepA_)
      if (const int64_t i = stepA_->indexOf(*a); i >= 0)
        selectAtOnOpen_ = {stepA_->step, i, QString::fromStdString(stepA_->ops[size_t(i)].name)};
  }
  // A run folder compared is compared again at the new rank.
  if (sourceB_->isOpen())
    pendingCompare_ = compareFolder_.isEmpty() ? sourceB_->path() : compareFolder_;
  openFile(f, /*verify=*/true);
}

void MainWindow::openFile(const QString& path, bool verify) {
  // The views are cleared when the file has opened (clearForOpened): one that cannot be opened
  // leaves the recording shown as it was, selection, inspector and banners included.
  pendingLive_ = !verify;
  pendingRecent_ = verify && runFolder_.isEmpty() ? path : QString();
  failedSeq_.reset();
  busy(1);
  sourceA_->open(path, verify);
}

void MainWindow::clearForOpened() {
  live_ = pendingLive_;
  summaryA_.reset();
  stepA_.reset();
  shownStep_ = -1;
  diff_.reset();
  statusBanner_->setSummary(nullptr);
  inspectorBanner_->setSummary(nullptr);
  diffView_->clear();
  diffView_->setOutOfDate({});
  inspector_->clear();
  selection_->clear();
  memoryView_->clear();
  memoryView_->showMessage("Loading the allocator events…");
  load_.recordingReplaced();
  if (!pendingRecent_.isEmpty()) addRecent(std::exchange(pendingRecent_, QString()));
}

void MainWindow::compareWith(const QString& folderOrFile) {
  // A run folder compared: its recording of the rank shown (rank 0 beside a single recording).
  QString path = folderOrFile;
  if (storage::isRunFolder(path.toStdString())) {
    const int rank = runFolder_.isEmpty() ? 0 : std::max(0, rankCombo_->currentIndex());
    try {
      const storage::RunManifest m = storage::readManifest(path.toStdString());
      path.clear();
      for (const storage::RankEntry& r : m.ranks)
        if (r.rank == rank)
          path = QString::fromStdString(storage::rankPath(folderOrFile.toStdString(), m, r.rank));
      if (path.isEmpty())
        throw keel::Error("run folder " + folderOrFile.toStdString() + " has no rank " +
                          std::to_string(rank));
    } catch (const std::exception& e) {
      showError("Cannot compare", QString::fromStdString(e.what()));
      return;
    }
  }
  compareFolder_ = path == folderOrFile ? QString() : folderOrFile;
  // The "vs" selector names the compared rank when it is one of the open run folder's.
  compareRankCombo_->setCurrentIndex(int(rankFiles_.indexOf(path)) + 1);
  summaryB_.reset();
  stepB_.reset();
  busy(1);
  sourceB_->open(path);
  pendingRecentB_ = path;  // added once it opens: a file that failed was listed
}

// Note [Studio exports]
// File > Export writes what `keel export` writes — a Chrome trace (of the step shown or the whole
// run), the step's graph as SVG, the op calls as CSV — of the recording shown (a run folder's rank
// shown), by running the `keel` installed beside keel-studio: one implementation of the exports,
// their output rules (a file that is not an earlier export of the same kind is never replaced;
// the input never is) and their streaming, not a second one in the studio. It runs as its own
// process, so the window stays responsive; its one-line error is the dialog's.
void MainWindow::exportRecording(const QString& kind, const QString& path) {
  const QString recording = sourceA_->path();
  const QString keel =
      keelProgram_.isEmpty() ? QCoreApplication::applicationDirPath() + "/keel" : keelProgram_;
  const QString step = QString::number(std::max<int64_t>(0, shownStep_));
  QStringList args = {"export"};
  if (kind == "trace-step")
    args << "trace" << recording << "--steps" << step + ":" + step;
  else if (kind == "trace")
    args << "trace" << recording;
  else if (kind == "graph")
    args << "graph" << recording << "--step" << step << "--phase"
         << "both"
         << "--format"
         << "svg";
  else
    args << "csv" << recording;
  args << "-o" << path;
  if (!QFileInfo(keel).isExecutable()) {
    showError("Export", "keel is not installed beside keel-studio (" + keel + ")");
    emit exportFinished(lastError_);
    return;
  }
  auto* p = new QProcess(this);
  p->setProgram(keel);
  p->setArguments(args);
  busy(1);
  statusBar()->showMessage("Exporting " + path + "…");
  connect(p, &QProcess::finished, this, [this, p, path](int code, QProcess::ExitStatus st) {
    p->deleteLater();
    busy(-1);
    QString error;
    if (st != QProcess::NormalExit || code != 0) {
      error = QString::fromLocal8Bit(p->readAllStandardError()).trimmed().section('\n', 0, 0);
      if (error.startsWith("keel: error: ")) error = error.mid(13);
      if (error.isEmpty()) error = "keel export failed (exit " + QString::number(code) + ")";
      showError("Export", error);
    } else {
      statusBar()->showMessage("Exported " + path, 8000);
    }
    emit exportFinished(error);
  });
  connect(p, &QProcess::errorOccurred, this, [this, p, keel](QProcess::ProcessError e) {
    if (e != QProcess::FailedToStart) return;
    p->deleteLater();
    busy(-1);
    showError("Export", "cannot run " + keel);
    emit exportFinished(lastError_);
  });
  p->start();
}

bool MainWindow::saveScreenshotAs(const QString& path) {
  // Never over the open recordings or a device, and only over a picture (Note [Outputs never
  // destroy inputs]).
  if (const QString why =
          screenshotRefusal("screenshot", path,
                            {{"the open recording", sourceA_->path().toStdString()},
                             {"the compared recording", sourceB_->path().toStdString()},
                             {"the run folder", runFolder_.toStdString()}});
      !why.isEmpty()) {
    showError("Screenshot", why);
    return false;
  }
  if (!saveScreenshots(path).isEmpty()) {
    showError("Screenshot", "Cannot write " + path);
    return false;
  }
  statusBar()->showMessage("Saved " + path, 5000);
  return true;
}

QString MainWindow::runStatusText() const {
  return statusRun_->text();
}

bool MainWindow::followingRun() const {
  // At the head: the step the view last followed to (or none yet); a step the user went to is
  // left alone.
  // An op selected holds the view on its step too: following the run would leave the inspector
  // describing an op of a step the graph no longer shows.
  return (shownStep_ <= 0 || shownStep_ == followedStep_) && !selection_->current(Side::A) &&
         !selection_->current(Side::B);
}

void MainWindow::reload() {
  if (sourceA_->isOpen()) refreshA();  // -> summaryUpdated: the steps and losses written since
  if (sourceB_->isOpen()) {
    busy(1);
    sourceB_->refresh();
  }
  if (sourceA_->isOpen() && shownStep_ >= 0) showStep(shownStep_);
  startDiff();  // the comparison, of what the files hold now
}

void MainWindow::startSession(const SessionConfig& config) {
  lastSession_ = config;  // the New session dialog shows it again
  session_->start(config);
}

void MainWindow::showStep(int64_t step) {
  if (!sourceA_->isOpen()) return;
  shownStep_ = step;
  dropOutsideStep_ = false;
  ++stepsShown_;
  memoryView_->showStep(step);  // the memory cursor follows the step shown
  if (stepSpin_->value() != step) {
    stepSpin_->blockSignals(true);
    stepSpin_->setValue(int(step));
    stepSpin_->blockSignals(false);
  }
  busy(1);
  sourceA_->requestStep(step);
  if (sourceB_->isOpen() && summaryB_) {
    busy(1);
    sourceB_->requestStep(step);
  }
}

void MainWindow::updateActions() {
  const Session::State s = session_->state();
  const bool active = s == Session::State::Paused || s == Session::State::Running ||
                      s == Session::State::Stepping || s == Session::State::Starting;
  runAct_->setEnabled(s == Session::State::Paused);
  stepAct_->setEnabled(s == Session::State::Paused);
  pauseAct_->setEnabled(s == Session::State::Running || s == Session::State::Stepping);
  stopAct_->setEnabled(active);
  newSessionAct_->setEnabled(!active);
  openAct_->setEnabled(!active);
}

void MainWindow::updateStatus() {
  QString text;
  if (summaryA_) {
    const auto& r = summaryA_->run;
    const size_t steps = summaryA_->steps.size();
    // A step whose row has no end yet (a stopped or failed run's last, or a live one's) is said
    // apart: "7 steps" read as seven complete.
    const bool lastOpen = steps > 0 && summaryA_->steps.back().endNs <= 0;
    text = QString("%1 — %2 on %3, %4 step%5%6, %7 op%8")
               .arg(views::recordingName(summaryA_->path), QString::fromStdString(r.backend),
                    QString::fromStdString(r.host))
               .arg(steps)
               .arg(steps == 1 ? "" : "s")
               .arg(lastOpen ? QString(" (the last incomplete)") : QString())
               .arg(summaryA_->opCount)
               .arg(summaryA_->opCount == 1 ? "" : "s")
               .toHtmlEscaped();
    // A recording of allocator events alone (an imported PyTorch snapshot) has no steps or ops
    // to count: "torch on (imported), 0 steps, 0 ops" said nothing.
    if (summaryA_->opCount == 0 && steps == 0)
      text = QString("%1 — allocator events only (%2): see the Memory view")
                 .arg(views::recordingName(summaryA_->path),
                      r.allocator.empty() ? QString::fromStdString(r.backend)
                                          : QString::fromStdString(r.allocator))
                 .toHtmlEscaped();
    // A run that did not finish says so (a failed or killed recording looked like any other).
    const Session::State st = session_->state();
    const bool sessionActive = st != Session::State::Idle && st != Session::State::Finished &&
                               st != Session::State::Failed;
    if (!r.status.empty() && r.status != "finished" && !(live_ && sessionActive))
      text += "  ·  <span style='color:#c62828'>" +
              QString::fromStdString(r.status == "running"
                                         ? "running: killed, crashed or still being written"
                                         : r.status)
                  .toHtmlEscaped() +
              "</span>";
    if (summaryB_)
      text += QString("   vs   %1 (%2)")
                  .arg(views::recordingName(summaryB_->path),
                       QString::fromStdString(summaryB_->run.backend))
                  .toHtmlEscaped();
    if (summaryB_ && comparisonOutOfDate())  // Note [A live comparison]
      text += "  ·  <span style='color:#c62828'>comparison out of date</span>";
  }
  if (!text.isEmpty()) statusRun_->setText(text);
  const Session::State s = session_->state();
  statusState_->setText(s == Session::State::Idle ? QString() : "session: " + stateName(s) + "  ");
  setWindowTitle(summaryA_ ? "Keel Studio — " + QFileInfo(summaryA_->path).fileName()
                           : QString("Keel Studio"));
}

void MainWindow::showError(const QString& title, const QString& fullMessage) {
  // A parser's message can quote megabytes of a damaged file: a readable excerpt (keel::clipText).
  const QString message = QString::fromStdString(keel::clipText(fullMessage.toStdString(), 2000));
  lastError_ = message;
  statusBar()->showMessage(title + ": " + message.section('\n', 0, 0), 10000);
  auto* box = new QMessageBox(QMessageBox::Critical, title, message, QMessageBox::Ok, this);
  box->setAttribute(Qt::WA_DeleteOnClose);
  box->setObjectName("errorDialog");
  box->open();  // window-modal, never blocks the event loop
  emit errorShown(message);
  checkIdle();
}

void MainWindow::addRecent(const QString& path) {
  QSettings settings;
  QStringList recent = settings.value("recentFiles").toStringList();
  const QString abs = QFileInfo(path).absoluteFilePath();
  recent.removeAll(abs);
  recent.prepend(abs);
  while (recent.size() > kMaxRecent) recent.removeLast();
  settings.setValue("recentFiles", recent);
  rebuildRecentMenu();
}

void MainWindow::rebuildRecentMenu() {
  recentMenu_->clear();
  const QStringList recent = QSettings().value("recentFiles").toStringList();
  for (const QString& p : recent)
    recentMenu_->addAction(p, this, [this, p] {
      // Gone since (moved, deleted): said, and dropped from the list.
      if (!QFileInfo::exists(p)) {
        QSettings settings;
        QStringList list = settings.value("recentFiles").toStringList();
        list.removeAll(p);
        settings.setValue("recentFiles", list);
        rebuildRecentMenu();
        showError("Open recent", p + " no longer exists; it is removed from Open recent.");
        return;
      }
      openRecording(p);
    });
  recentMenu_->setEnabled(!recent.isEmpty());
}

void MainWindow::openDialog() {
  QString p = QFileDialog::getOpenFileName(this, "Open recording", QString(),
                                           "Keel recordings (*.db);;All files (*)");
  if (!p.isEmpty()) openRecording(p);
}

void MainWindow::importTorchMemoryDialog() {
  const QString snap =
      QFileDialog::getOpenFileName(this, "Import PyTorch memory snapshot", QString(),
                                   "PyTorch memory snapshots (*.pickle *.pkl);;All files (*)");
  if (snap.isEmpty()) return;
  const QFileInfo fi(snap);
  const QString out = QFileDialog::getSaveFileName(this, "Save the imported recording as",
                                                   fi.dir().filePath(fi.completeBaseName() + ".db"),
                                                   "Keel recordings (*.db)");
  if (!out.isEmpty()) importTorchMemory(snap, out);
}

void MainWindow::importTorchMemory(const QString& snapshot, const QString& output) {
  // Checked here too, before the worker starts: a refused output is a dialog at once.
  const std::vector<keel::NamedInput> inputs = {
      {"the open recording", sourceA_->path().toStdString()},
      {"the compared recording", sourceB_->path().toStdString()}};
  try {
    keel::checkOutputPath("the imported recording", output.toStdString(),
                          {inputs[0], inputs[1], {"the snapshot", snapshot.toStdString()}});
  } catch (const keel::Error& e) {
    showError("Import PyTorch memory snapshot", QString::fromUtf8(e.what()));
    return;
  }
  statusBar()->showMessage("Importing " + snapshot + " (about 25 s per GB)…");
  busy(1);
  auto* watcher = new QFutureWatcher<QString>(this);
  connect(watcher, &QFutureWatcher<QString>::finished, this, [this, watcher, output] {
    const QString error = watcher->result();
    watcher->deleteLater();
    busy(-1);
    statusBar()->clearMessage();  // "Importing ..." said the import went on after it had ended
    if (!error.isEmpty()) {
      showError("Import PyTorch memory snapshot", error);
      return;
    }
    showView("memory");
    openRecording(output);
  });
  storage::TorchMemoryImportOptions o;
  o.engineVersion = std::string("torch memory snapshot, keel studio ") + KEEL_VERSION;
  o.outputOption = "the imported recording";
  o.otherInputs = inputs;
  watcher->setFuture(
      QtConcurrent::run([in = snapshot.toStdString(), out = output.toStdString(), o]() -> QString {
        try {
          storage::importTorchMemorySnapshot(in, out, o);
          return {};
        } catch (const std::exception& e) {
          return QString::fromUtf8(e.what());
        }
      }));
}

void MainWindow::compareDialog() {
  if (!summaryA_) {
    showError("Compare", "Open a recording first; then choose the one to compare it with.");
    return;
  }
  QString p = QFileDialog::getOpenFileName(this, "Compare with recording", QString(),
                                           "Keel recordings (*.db);;All files (*)");
  if (!p.isEmpty()) compareWith(p);
}

void MainWindow::newSessionDialog() {
  NewSessionDialog dlg(lastSession_ ? &*lastSession_ : nullptr, this);
  if (dlg.exec() == QDialog::Accepted) startSession(dlg.config());
}

void MainWindow::breakpointsDialog() {
  BreakpointsDialog dlg(session_->breakpoints(), this);
  if (session_->state() != Session::State::Idle)
    dlg.setSession(session_->seed(), session_->totalSteps());
  if (dlg.exec() == QDialog::Accepted) session_->setBreakpoints(dlg.breakpoints());
}

void MainWindow::breakHere(uint64_t seq) {
  const int64_t i = stepA_ ? stepA_->indexOf(seq) : -1;
  if (i < 0) return;
  const storage::OpRecord& op = stepA_->ops[size_t(i)];
  QString item = "op:" + QString::fromStdString(op.name);
  if (!op.scope.empty()) item += " in " + QString::fromStdString(op.scope);
  Breakpoints b = session_->breakpoints();
  for (const Breakpoint& p : b.list)
    if (p.item == item) {
      statusBar()->showMessage("Breakpoint already set: " + item, 6000);
      return;
    }
  b.add(item);
  session_->setBreakpoints(b);
  statusBar()->showMessage("Breakpoint added: " + item, 6000);
}

void MainWindow::selectOpInStep(uint64_t seq, int64_t step) {
  if (!sourceA_->isOpen()) return;
  if (stepA_ && stepA_->step == step && shownStep_ == step) {
    selection_->select(Side::A, seq, true);
    return;
  }
  pendingSelectA_ = seq;
  showStep(step);
}

void MainWindow::loadMemory() {
  if (!load_.requestMemory()) return;  // one at a time; the next starts when this one lands
  busy(1);
  sourceA_->requestMemory();
}

void MainWindow::busy(int delta) {
  load_.add(delta);
  showBusy();
}

void MainWindow::showBusy() {
  progress_->setVisible(!load_.idle());
  if (load_.idle()) QTimer::singleShot(0, this, [this] { checkIdle(); });
}

bool MainWindow::isIdle() const {
  return load_.idle() && !graphA_->isLayingOut() && !graphB_->isLayingOut();
}

void MainWindow::whenIdle(std::function<void()> fn) {
  idleWaiters_.push_back(std::move(fn));
  QTimer::singleShot(0, this, [this] { checkIdle(); });
}

void MainWindow::checkIdle() {
  if (!isIdle() || idleWaiters_.empty()) return;
  auto waiters = std::move(idleWaiters_);
  idleWaiters_.clear();
  for (auto& fn : waiters) fn();
}

void MainWindow::setMemoryOnly(bool on) {
  if (on == memoryOnly_) return;
  memoryOnly_ = on;
  if (on) {
    // What was shown is hidden, and shown again when a recording with ops opens.
    for (QWidget* w :
         {centralWidget(), static_cast<QWidget*>(inspectorDock_), static_cast<QWidget*>(lossDock_)})
      if (w && w->isVisible()) {
        w->hide();
        hiddenForMemory_.push_back(w);
      }
    memoryDock_->raise();
    resizeDocks({memoryDock_}, {height()}, Qt::Vertical);
  } else {
    for (QWidget* w : std::exchange(hiddenForMemory_, {})) w->show();
  }
}

bool MainWindow::showView(const QString& view) {
  auto* d = findChild<QDockWidget*>("dock." + view);
  if (!d) return false;
  shownView_ = d;
  d->show();
  d->raise();
  return true;
}

void MainWindow::raiseBottom(QDockWidget* byDefault) {
  (shownView_ ? shownView_.data() : byDefault)->raise();
}

QString MainWindow::raisedBottomView() const {
  for (QDockWidget* d : findChildren<QDockWidget*>())
    if (dockWidgetArea(d) == Qt::BottomDockWidgetArea && !d->isFloating() &&
        !d->visibleRegion().isEmpty())
      return d->objectName().section('.', 1);
  return {};
}

QString MainWindow::saveScreenshots(const QString& windowPng, const QString& viewsDir) {
  // Written beside and renamed into place: a failed write leaves what was there.
  auto save = [](const QPixmap& picture, const QString& path) {
    QSaveFile f(path);
    if (!f.open(QIODevice::WriteOnly) || !picture.save(&f, "PNG")) {
      f.cancelWriting();
      return false;
    }
    return f.commit();
  };
  QString failed;  // the first picture that could not be written
  auto keep = [&](const QPixmap& picture, const QString& path) {
    if (!save(picture, path) && failed.isEmpty()) failed = path;
  };
  keep(grab(), windowPng);
  if (!viewsDir.isEmpty()) {
    QDir().mkdir(viewsDir);
    keep(graphs_->grab(), QDir(viewsDir).filePath("graph.png"));
    // Each dock in turn on top of its tab group, so hidden tabs are laid out at full size.
    const QList<QDockWidget*> docks = findChildren<QDockWidget*>();
    QList<QDockWidget*> raised;
    for (QDockWidget* d : docks)
      if (!d->visibleRegion().isEmpty()) raised << d;
    for (QDockWidget* d : docks) {
      d->raise();
      QApplication::processEvents();
      const QString name = d->objectName().section('.', 1);
      keep(d->widget()->grab(), QDir(viewsDir).filePath(name + ".png"));
    }
    for (QDockWidget* d : raised) d->raise();
    QApplication::processEvents();
  }
  return failed;
}

void MainWindow::closeEvent(QCloseEvent* e) {
  session_->stop();
  QSettings settings;
  settings.setValue("window/geometry", saveGeometry());
  settings.setValue("window/state", saveState());
  QMainWindow::closeEvent(e);
}

void MainWindow::dragEnterEvent(QDragEnterEvent* e) {
  if (e->mimeData()->hasUrls()) e->acceptProposedAction();
}

void MainWindow::dropEvent(QDropEvent* e) {
  const auto urls = e->mimeData()->urls();
  if (urls.isEmpty()) return;
  if (summaryA_ && urls.size() == 1 && (e->modifiers() & Qt::ControlModifier))
    compareWith(urls[0].toLocalFile());
  else
    openRecording(urls[0].toLocalFile());
  if (urls.size() > 1) compareWith(urls[1].toLocalFile());
}

}  // namespace keel::studio
