// keel-studio [run.db] [--compare other.db] [--step N] [--select-first-divergence]
//             [--screenshot out.png [--views-dir DIR]]
// keel-studio --session configs/gpt-mini.json [--backend cpu] [--steps N] [--seed S] [--run]
// Opens recordings (or nothing) in Keel Studio. --screenshot renders the window once everything
// is loaded, saves it (and each view into DIR) and exits: for docs, tests and bug reports.
#include <QApplication>
#include <QCommandLineParser>
#include <QFileInfo>
#include <QStandardPaths>
#include <QTimer>
#include <cstdio>

#include "dialogs.h"
#include "keel/views/selection.h"
#include "main_window.h"

int main(int argc, char** argv) {
  QApplication app(argc, argv);
  QApplication::setOrganizationName("Keel");
  QApplication::setApplicationName("Keel Studio");
  QApplication::setApplicationVersion(KEEL_VERSION);

  QCommandLineParser cli;
  cli.setApplicationDescription("Keel Studio: a debugger for deep-learning training");
  cli.addHelpOption();
  cli.addVersionOption();
  cli.addPositionalArgument("recording", "recording to open (.db)", "[run.db]");
  QCommandLineOption compare("compare", "recording to compare with (side by side + diff)",
                             "other.db");
  QCommandLineOption step("step", "training step to show", "N");
  QCommandLineOption firstDiv("select-first-divergence",
                              "select the first divergence (with --compare)");
  QCommandLineOption selectOp("select", "select the op with this sequence number", "seq");
  QCommandLineOption shot("screenshot", "save a picture of the window and exit", "out.png");
  QCommandLineOption viewsDir("views-dir", "with --screenshot: also save each view here", "dir");
  QCommandLineOption size("size", "window size for --screenshot", "WxH", "1600x1000");
  QCommandLineOption sessionOpt("session", "start a live session of this model config",
                                "config.json");
  QCommandLineOption backendOpt("backend", "live session backend: cpu | cpu-ref", "name", "cpu");
  QCommandLineOption stepsOpt("steps", "live session length in steps", "N", "50");
  QCommandLineOption seedOpt("seed", "live session seed", "S", "1");
  QCommandLineOption runOpt("run",
                            "start running the live session at once (else it waits, paused)");
  cli.addOptions({compare, step, firstDiv, selectOp, shot, viewsDir, size, sessionOpt, backendOpt,
                  stepsOpt, seedOpt, runOpt});
  cli.process(app);

  auto fail = [](const QString& msg) {
    std::fprintf(stderr, "keel-studio: %s\n", qPrintable(msg));
    return 2;
  };
  const QStringList files = cli.positionalArguments();
  if (files.size() > 1) return fail("expected at most one recording, got " + files.join(' '));
  if (cli.isSet(compare) && files.isEmpty()) return fail("--compare needs a recording to compare");
  for (const QString& f :
       files + (cli.isSet(compare) ? QStringList{cli.value(compare)} : QStringList{}))
    if (!QFileInfo::exists(f)) return fail("no such file: " + f);
  bool ok = true;
  const int stepNo = cli.isSet(step) ? cli.value(step).toInt(&ok) : -1;
  if (!ok || (cli.isSet(step) && stepNo < 0)) return fail("--step: expected a step number");
  const qulonglong seq = cli.isSet(selectOp) ? cli.value(selectOp).toULongLong(&ok) : 0;
  if (!ok) return fail("--select: expected an op sequence number");
  int w = 1600, h = 1000;
  if (cli.isSet(size)) {
    const QStringList wh = cli.value(size).split('x');
    if (wh.size() != 2 || wh[0].toInt() < 200 || wh[1].toInt() < 200)
      return fail("--size: expected WxH, e.g. 1600x1000");
    w = wh[0].toInt();
    h = wh[1].toInt();
  }

  keel::studio::SessionConfig session;
  if (cli.isSet(sessionOpt)) {
    if (!files.isEmpty()) return fail("--session and a recording to open are exclusive");
    session.configPath = cli.value(sessionOpt);
    if (!QFileInfo::exists(session.configPath)) return fail("no such file: " + session.configPath);
    session.backend = cli.value(backendOpt);
    if (session.backend != "cpu" && session.backend != "cpu-ref")
      return fail("--backend: expected cpu or cpu-ref, got '" + session.backend + "'");
    session.steps = cli.value(stepsOpt).toLongLong(&ok);
    if (!ok || session.steps < 1) return fail("--steps: expected a positive number");
    session.seed = cli.value(seedOpt).toULongLong(&ok);
    if (!ok) return fail("--seed: expected a number");
    session.output = keel::studio::defaultSessionPath(session.configPath);
    session.capture.stacks = session.capture.md5 = session.capture.stats = true;
    session.capture.allocator = true;
  }

  const bool screenshot = cli.isSet(shot);
  // Screenshots use the default layout and leave the user's settings (recent files, window
  // layout) alone.
  if (screenshot) QStandardPaths::setTestModeEnabled(true);
  keel::studio::MainWindow win;
  if (screenshot) win.resize(w, h);
  win.show();
  int exitCode = 0;
  if (!session.configPath.isEmpty()) {
    if (cli.isSet(runOpt))
      QObject::connect(win.session(), &keel::studio::Session::stateChanged, &win,
                       [&win, started = false](keel::studio::Session::State s) mutable {
                         if (!started && s == keel::studio::Session::State::Paused) {
                           started = true;
                           win.session()->run();
                         }
                       });
    win.startSession(session);
  }
  if (!files.isEmpty()) {
    win.openRecording(files[0]);
    if (cli.isSet(compare)) {
      QObject::connect(&win, &keel::studio::MainWindow::recordingOpened, &win,
                       [&](keel::views::Side side) {
                         if (side == keel::views::Side::A) win.compareWith(cli.value(compare));
                       });
    }
    if (stepNo >= 0)
      QObject::connect(&win, &keel::studio::MainWindow::recordingOpened, &win,
                       [&](keel::views::Side side) {
                         if (side == keel::views::Side::A) win.showStep(stepNo);
                       });
  }
  if (screenshot) {
    // Wait until everything requested has landed (including the diff), apply the selection,
    // wait again, then save and quit.
    auto finish = [&] {
      win.whenIdle([&] {
        if (!win.saveScreenshots(cli.value(shot), cli.value(viewsDir))) {
          std::fprintf(stderr, "keel-studio: cannot write %s\n", qPrintable(cli.value(shot)));
          exitCode = 2;
        }
        if (!win.lastError().isEmpty()) exitCode = 2;
        app.quit();
      });
    };
    auto selectRequested = [&] {
      if (cli.isSet(firstDiv) && win.diffReport() && win.diffReport()->first) {
        const auto& p = win.diffReport()->first->pair;
        win.selection()->selectPair(p.inA ? std::optional<uint64_t>(p.seqA) : std::nullopt,
                                    p.inB ? std::optional<uint64_t>(p.seqB) : std::nullopt);
      } else if (seq) {
        win.selection()->select(keel::views::Side::A, seq);
      }
    };
    QTimer::singleShot(200, &win, [&] {
      win.whenIdle([&] {
        if (cli.isSet(compare) && !win.diffReport() && win.lastError().isEmpty()) {
          // The diff starts once B has opened: wait for it.
          QObject::connect(&win, &keel::studio::MainWindow::diffShown, &win, [&] {
            selectRequested();
            finish();
          });
          return;
        }
        selectRequested();
        finish();
      });
    });
  }
  int rc = app.exec();
  return screenshot ? exitCode : rc;
}
