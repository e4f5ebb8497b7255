// keel-studio [run.db] [--compare other.db] [--step N] [--select-first-divergence]
//             [--select-op SEQ] [--screenshot out.png [--views-dir DIR] [--size WxH]]
// keel-studio --session config.json [--backend cpu|cpu-ref] [--steps N] [--seed S]
//             [--output run.db] [--run]
// Opens recordings (or nothing) in Keel Studio. Keel's options are read before Qt's application
// object exists (See Note [Studio options before Qt]). --screenshot renders the window once
// everything is loaded (a live session: once it has finished), saves it (and each view into DIR),
// prints what it showed in one line, and exits: for docs, tests, scripts and bug reports.
#include <fcntl.h>
#include <unistd.h>
#include <QApplication>
#include <QFileInfo>
#include <QMetaEnum>
#include <QSettings>
#include <QSocketNotifier>
#include <QStandardPaths>
#include <QTimer>

#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "command_line.h"
#include "dialogs.h"
#include "keel/views/graph_view.h"
#include "keel/views/op_table.h"
#include "keel/views/run_data.h"
#include "keel/views/selection.h"
#include "main_window.h"

namespace {

// Note [Studio signals]: SIGINT and SIGTERM stop a live session as File > Quit does (its
// recording finished, status "stopped: interrupted (SIGINT)" as keel record gives it, no lock or
// journal left) and end the process with 128 + the signal; they killed it at once, leaving a
// recording that read "killed or crashed". The handler only writes to a pipe; the event loop
// does the rest. A second signal ends the process at once.
int g_signalPipe[2] = {-1, -1};
void onStopSignal(int sig) {
  const char c = char(sig);
  [[maybe_unused]] const ssize_t n = ::write(g_signalPipe[1], &c, 1);
}

using keel::studio::MainWindow;
using keel::studio::Session;
using keel::studio::StudioCommandLine;

// argv for QApplication: it keeps pointers into this storage for the application's lifetime.
struct QtArgv {
  explicit QtArgv(const QStringList& args) {
    for (const QString& a : args) storage.push_back(a.toLocal8Bit());
    for (QByteArray& a : storage) ptrs.push_back(a.data());
    ptrs.push_back(nullptr);
    argc = int(storage.size());
  }
  std::vector<QByteArray> storage;
  std::vector<char*> ptrs;
  int argc = 0;
};

// One line saying what the window shows: scripts and tests read it after --screenshot.
QString describe(MainWindow& win) {
  QString text;
  if (const auto s = win.summary(keel::views::Side::A)) {
    text += QString("%1: %2 step%3, %4 ops")
                .arg(s->path)
                .arg(s->steps.size())
                .arg(s->steps.size() == 1 ? "" : "s")
                .arg(s->opCount);
  } else {
    text += "no recording";
  }
  if (const auto st = win.currentStep()) {
    text += QString("; step %1 shown: %2 ops in the table, %3 op nodes in the graph")
                .arg(st->step)
                .arg(win.opTable()->model()->rowCount())
                .arg(win.graphView(keel::views::Side::A)->visibleOpNodeCount());
  }
  if (const auto s = win.summary(keel::views::Side::B)) text += "; compared with " + s->path;
  if (const QString v = win.raisedBottomView(); !v.isEmpty()) text += "; bottom dock: " + v;
  // A comparison of whole runs (Note [Comparing whole runs]): its verdict first.
  if (const auto r = win.runsComparison()) {
    using Kind = keel::views::RunsComparison::Kind;
    if (r->kind == Kind::RankByRank)
      text += r->firstRank ? QString("; rank by rank: rank %1 diverged first").arg(*r->firstRank)
                           : QString("; rank by rank: %1").arg(r->diverged ? "diverged" : "equal");
    else if (r->firstStep)
      text += QString("; by parameter: first difference at step %1, %2")
                  .arg(*r->firstStep)
                  .arg(r->firstParameter);
    else
      text += QString("; by parameter: %1").arg(r->diverged ? "diverged" : "equal");
  }
  if (const auto d = win.diffReport(); d && d->first)
    text += QString("; first divergence: A #%1 / B #%2")
                .arg(d->first->pair.inA ? QString::number(d->first->pair.seqA) : "-")
                .arg(d->first->pair.inB ? QString::number(d->first->pair.seqB) : "-");
  else if (const keel::storage::LossDiff* l = d ? keel::storage::firstLossDivergence(*d) : nullptr)
    text += QString("; losses diverge at step %1").arg(l->step);
  else if (d && keel::storage::diffVerdict(*d) == keel::storage::DiffVerdict::Equal)
    text += "; no divergence";  // --select-first-divergence had nothing to select: say so
  if (const auto d = win.diffReport();
      d && keel::storage::diffVerdict(*d) == keel::storage::DiffVerdict::ValuesNotCompared)
    text += "; no values compared";
  if (const auto sel = win.selection()->current(keel::views::Side::A))
    text += QString("; selected #%1").arg(*sel);
  if (win.session()->state() != Session::State::Idle)
    text += QString("; session %1 after %2 of %3 steps")
                .arg(QString(QMetaEnum::fromType<Session::State>().valueToKey(
                                 int(win.session()->state())))
                         .toLower())
                .arg(win.session()->stepsDone())
                .arg(win.session()->totalSteps());
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  QStringList args;
  for (int i = 0; i < argc; ++i) args << QString::fromLocal8Bit(argv[i]);
  const StudioCommandLine cli = keel::studio::parseStudioCommandLine(args);
  switch (cli.action) {
    case StudioCommandLine::Action::Error:
      std::fprintf(stderr, "keel-studio: error: %s\n", qPrintable(cli.message));
      return 2;
    case StudioCommandLine::Action::Version:
      std::printf("%s\n", qPrintable(cli.message));
      return 0;
    case StudioCommandLine::Action::Help: {
      QtArgv qa(cli.qtArguments);
      QCoreApplication core(qa.argc, qa.ptrs.data());  // no display needed
      std::fputs(qPrintable(keel::studio::studioHelpText()), stdout);
      return 0;
    }
    case StudioCommandLine::Action::Open:
      break;
  }

  if (const QString why = keel::studio::checkRecordingRequests(cli); !why.isEmpty()) {
    std::fprintf(stderr, "keel-studio: error: %s\n", qPrintable(why));
    return 2;
  }
  if (const QString why = keel::studio::missingDisplayReason(
          cli.qtArguments, [](const char* v) { return qEnvironmentVariable(v); });
      !why.isEmpty()) {
    std::fprintf(stderr, "keel-studio: error: %s\n", qPrintable(why));
    return 2;
  }
  QtArgv qa(cli.qtArguments);
  QApplication app(qa.argc, qa.ptrs.data());
  QApplication::setOrganizationName("Keel");
  QApplication::setApplicationName("Keel Studio");
  QApplication::setApplicationVersion(KEEL_VERSION);

  std::optional<keel::studio::SessionConfig> session = cli.session;
  if (session && session->output.isEmpty())
    session->output = keel::studio::defaultSessionPath(session->configPath);

  const bool screenshot = !cli.screenshot.isEmpty();
  // Screenshots use the default layout and leave the user's settings (recent files, window
  // layout) alone.
  if (screenshot) QStandardPaths::setTestModeEnabled(true);
  // The tests' windows save their layout into the same test-mode settings: forget it, so every
  // screenshot starts from the default layout at its --size.
  if (screenshot) QSettings().remove("window");
  MainWindow win;
  int signalled = 0;  // See Note [Studio signals].
  if (::pipe2(g_signalPipe, O_CLOEXEC | O_NONBLOCK) == 0) {
    auto* notifier = new QSocketNotifier(g_signalPipe[0], QSocketNotifier::Read, &app);
    QObject::connect(notifier, &QSocketNotifier::activated, &app, [&] {
      char c = 0;
      while (::read(g_signalPipe[0], &c, 1) == 1) {
        if (signalled != 0) std::_Exit(128 + signalled);
        signalled = c;
      }
      win.session()->stop(signalled == SIGINT ? "interrupted (SIGINT)" : "interrupted (SIGTERM)");
      win.close();
      app.quit();
    });
    struct sigaction sa {};
    sa.sa_handler = onStopSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
  }
  if (screenshot) win.resize(cli.size);
  win.show();
  if (!cli.show.isEmpty()) win.showView(cli.show);

  // What to wait for before the picture: a live session's end (finished or failed), or, for a
  // session not asked to run, its pause before step 1; recordings need nothing more.
  bool sessionSettled = !session;
  std::function<void()> onSettled;
  auto settle = [&] {
    if (sessionSettled) return;
    sessionSettled = true;
    if (onSettled) onSettled();
  };
  if (session) {
    // Said once the recording exists: a session that fails to start (a malformed config, an
    // output it cannot write) says only why.
    QObject::connect(win.session(), &Session::started, &win, [](const QString& path) {
      std::printf("keel-studio: recording the session to %s\n", qPrintable(path));
      std::fflush(stdout);
    });
    QObject::connect(win.session(), &Session::stateChanged, &win,
                     [&, started = false](Session::State s) mutable {
                       if (s == Session::State::Paused && !started) {
                         started = true;
                         if (cli.run)
                           win.session()->run();
                         else
                           settle();
                       }
                     });
    // The asked-for step, else where the run ended: its first NaN/Inf op, selected, or its last
    // step (Note [Where a live session ends]); the window shows it once the session has ended.
    if (cli.step >= 0) win.showStepWhenSessionEnds(cli.step);
    QObject::connect(win.session(), &Session::finished, &win, [&] { settle(); });
    QObject::connect(win.session(), &Session::failed, &win, [&] { settle(); });
    // A pause at a breakpoint (--break-on) is said in a line a script can read, and is what a
    // --screenshot pictures (it would wait for the end of a run that waits for the user).
    QObject::connect(win.session(), &Session::pausedAt, &win,
                     [&](quint64 seq, qint64 step, const QString& reason) {
                       if (reason == "paused") return;  // Pause, asked for in the window
                       std::printf("keel-studio: paused at op #%llu (step %lld): %s\n",
                                   static_cast<unsigned long long>(seq),
                                   static_cast<long long>(step), qPrintable(reason));
                       std::fflush(stdout);
                       if (screenshot) settle();
                     });
    if (!cli.breaks.list.empty()) win.session()->setBreakpoints(cli.breaks);
    win.startSession(*session);
  }
  if (!cli.recording.isEmpty()) {
    if (cli.step >= 0) win.showStepOnOpen(cli.step);
    if (cli.rank >= 0) win.showRankOnOpen(cli.rank);
    if (!cli.compare.isEmpty()) win.setDiffTolerance(cli.atol, cli.rtol, cli.ulps);
    win.openRecording(cli.recording);
    if (!cli.compare.isEmpty()) {
      QObject::connect(&win, &MainWindow::recordingOpened, &win, [&](keel::views::Side side) {
        if (side == keel::views::Side::A) win.compareWith(cli.compare);
      });
    }
  }

  // The selection asked for (--select-first-divergence, --select-op), applied once it exists.
  auto selectRequested = [&] {
    if (cli.selectFirstDivergence && win.diffReport() && win.diffReport()->first) {
      const auto& p = win.diffReport()->first->pair;
      win.selection()->selectPair(p.inA ? std::optional<uint64_t>(p.seqA) : std::nullopt,
                                  p.inB ? std::optional<uint64_t>(p.seqB) : std::nullopt);
    } else if (cli.selectOp) {
      win.selection()->select(keel::views::Side::A, *cli.selectOp);
    }
  };
  // Calls `then` once everything requested has loaded, the diff included, and the selection is
  // applied.
  std::function<void()> then;
  auto whenLoaded = [&] {
    win.whenIdle([&] {
      if (!cli.compare.isEmpty() && !win.comparisonShown() && win.lastError().isEmpty()) {
        // The diff starts once B has opened: wait for it.
        QObject::connect(&win, &MainWindow::diffShown, &win, [&] {
          selectRequested();
          if (then) then();
        });
        return;
      }
      selectRequested();
      if (then) then();
    });
  };

  int exitCode = 0;
  if (screenshot) {
    // Once loaded and selected, wait for the selection's details too, then save and quit.
    then = [&] {
      win.whenIdle([&] {
        // A session that failed before it recorded anything, or a recording that cannot be
        // opened, has nothing to picture: the error alone, as `keel record` gives it (a picture
        // of an empty window was saved, over whatever file was there).
        if (!win.summary(keel::views::Side::A) && !win.lastError().isEmpty()) {
          std::fprintf(stderr, "keel-studio: error: %s\n",
                       qPrintable(win.lastError().section('\n', 0, 0)));
          exitCode = 2;
          app.quit();
          return;
        }
        if (const QString failed = win.saveScreenshots(cli.screenshot, cli.viewsDir);
            !failed.isEmpty()) {
          std::fprintf(stderr, "keel-studio: error: cannot write %s\n", qPrintable(failed));
          exitCode = 2;
        } else {
          std::printf("keel-studio: saved %s — %s\n", qPrintable(cli.screenshot),
                      qPrintable(describe(win)));
        }
        if (!win.lastError().isEmpty()) {
          std::fprintf(stderr, "keel-studio: error: %s\n",
                       qPrintable(win.lastError().section('\n', 0, 0)));
          exitCode = 2;
        }
        std::fflush(stdout);
        app.quit();
      });
    };
  }
  onSettled = [&] { QTimer::singleShot(200, &win, whenLoaded); };
  if (sessionSettled) onSettled();
  const int rc = app.exec();
  if (signalled != 0) return 128 + signalled;
  return screenshot ? exitCode : rc;
}
