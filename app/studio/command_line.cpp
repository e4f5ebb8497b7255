// See command_line.h.
//
// Note [Studio options before Qt]
// QGuiApplication's constructor removes the options it knows from argv, and among them is
// `-session`/`--session` (X11 session management: the id of a session to restore). Keel's
// documented `--session config.json` vanished before Keel's parser saw it, so the window opened
// empty and even a missing config gave no error. keel-studio therefore reads its arguments
// before the application object exists: the options Qt itself documents (-platform, -style,
// -display, ...) are split off and are all that reach QApplication; everything else, `--session`
// included, is Keel's, and anything Keel does not know is an error (one line, exit 2).
// --help and --version are answered without a display.
#include "command_line.h"

#include <QCommandLineParser>
#include <QDir>
#include <QFileInfo>
#include <QSet>
#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "dialogs.h"
#include "keel/base/number_words.h"
#include "keel/base/output_path.h"
#include "keel/base/text.h"
#include "keel/capture/recording_run.h"
#include "keel/device.h"
#include "keel/error.h"
#include "keel/storage/reader.h"
#include "keel/storage/run_folder.h"

namespace keel::studio {

namespace {

// Qt's own command-line options (QGuiApplication, QApplication, the xcb platform), with or
// without a value. `session` is deliberately absent: see the note above.
const QSet<QString> kQtOptionsWithValue = {"platform",        "platformpluginpath",
                                           "platformtheme",   "plugin",
                                           "qwindowgeometry", "qwindowicon",
                                           "qwindowtitle",    "display",
                                           "geometry",        "style",
                                           "stylesheet",      "name",
                                           "title",           "visual"};
const QSet<QString> kQtFlags = {"reverse", "widgetcount", "nograb", "dograb", "sync"};

// The option name of `arg` ("-platform" and "--platform=x" give "platform"), or "" when `arg` is
// not an option.
QString optionName(const QString& arg) {
  if (!arg.startsWith('-') || arg == "-" || arg == "--") return {};
  QString name = arg.mid(arg.startsWith("--") ? 2 : 1);
  return name.section('=', 0, 0);
}

struct Options {
  QCommandLineOption compare{
      "compare", "Recording to compare with (side by side, diffed op by op).", "other.db"};
  QCommandLineOption atol{"atol",
                          "With --compare: absolute tolerance (default 1e-06, as keel diff).", "X"};
  QCommandLineOption rtol{
      "rtol", "With --compare: relative tolerance, against B (default 0.0001, as keel diff).", "X"};
  QCommandLineOption ulps{"ulps", "With --compare: also accept elements within N ULPs (0: off).",
                          "N"};
  QCommandLineOption step{"step", "Training step to show.", "N"};
  QCommandLineOption rank{"rank", "With a run folder (a multi-rank run): the rank to show.", "R"};
  QCommandLineOption firstDiv{"select-first-divergence",
                              "Select the first divergence (with --compare)."};
  QCommandLineOption selectOp{QStringList{"select-op", "select"},
                              "Select the op with this sequence number.", "seq"};
  QCommandLineOption shot{"screenshot",
                          "Save a PNG picture of the window once everything is loaded (a live "
                          "session: once it has finished) and exit.",
                          "out.png"};
  QCommandLineOption viewsDir{"views-dir", "With --screenshot: also save each view here.", "dir"};
  QCommandLineOption size{"size", "Window size for --screenshot (default 1600x1000).", "WxH"};
  QCommandLineOption show{"show",
                          "Raise this view in the bottom dock: ops, diff, logs, memory, "
                          "timeline or ranks (default: ops; comparing: diff; a run folder: "
                          "ranks).",
                          "view"};
  QCommandLineOption session{"session",
                             "Start a live session of this model config: a file, or an installed "
                             "config's name (gpt-mini).",
                             "config.json"};
  QCommandLineOption backend{
      "backend", "Live session backend: cpu | cpu-ref | cuda[:N] (default cpu).", "name", "cpu"};
  QCommandLineOption steps{"steps", "Live session length in steps (default 50).", "N", "50"};
  QCommandLineOption seed{"seed", "Live session seed (default 0, as keel record's).", "S", "0"};
  QCommandLineOption output{"output",
                            "Live session recording file (default: a new file under the user's "
                            "data directory, sessions/).",
                            "run.db"};
  QCommandLineOption run{"run", "Start running the live session at once (else it waits, paused)."};
  QCommandLineOption breakOn{"break-on",
                             "Live session breakpoint, as keel record --break-on: nan, op:NAME, "
                             "scope:S, step:N, grad-norm>X, loss>K*mean, md5-ref:REF.db, each "
                             "optionally @N (the Nth hit); repeatable.",
                             "item"};

  void addTo(QCommandLineParser& p) {
    p.setApplicationDescription(
        "Keel Studio: a debugger for deep-learning training.\n"
        "  keel-studio run.db                         replay a recording\n"
        "  keel-studio a.db --compare b.db            two runs side by side, diffed op by op\n"
        "  keel-studio runA/ --compare runB/          two run folders, rank by rank\n"
        "  keel-studio --session config.json --run    a live session");
    p.setSingleDashWordOptionMode(QCommandLineParser::ParseAsLongOptions);
    p.addHelpOption();
    p.addVersionOption();
    p.addPositionalArgument("recording", "Recording to open (.db).", "[run.db]");
    p.addOptions({compare, atol, rtol, ulps, step, rank, firstDiv, selectOp, shot, viewsDir, size,
                  show, session, backend, steps, seed, output, run, breakOn});
  }
};

// Why `path` cannot be opened as a `what`: missing, or a FIFO (opening it would block), a device
// or a directory (keel::nonRegularKind, the rule every keel input follows).
QString notAFile(const QString& what, const QString& path) {
  const std::string kind = keel::nonRegularKind(path.toStdString());
  if (kind.empty()) return "no such " + what + ": " + path;
  return QString("%1 %2 is %3, not a regular file").arg(what, path, QString::fromStdString(kind));
}

StudioCommandLine error(QString message) {
  StudioCommandLine c;
  c.action = StudioCommandLine::Action::Error;
  c.message = std::move(message);
  return c;
}

}  // namespace

QString screenshotRefusal(const QString& option, const QString& path,
                          const std::vector<keel::NamedInput>& inputs) {
  try {
    keel::checkOutputPath(option.toStdString(), path.toStdString(), inputs);
    if (!path.endsWith(".png", Qt::CaseInsensitive))
      return option + " " + path + ": the studio saves PNG pictures; name the file .png";
    keel::checkReplacesOnly(option.toStdString(), path.toStdString(),
                            std::string_view("\x89PNG\r\n\x1a\n", 8), "a PNG picture");
  } catch (const keel::Error& e) {
    return QString::fromUtf8(e.what());
  }
  return {};
}

StudioCommandLine parseStudioCommandLine(const QStringList& args) {
  StudioCommandLine out;
  // Split Qt's options from Keel's (Note [Studio options before Qt]).
  QStringList keelArgs;
  out.qtArguments << (args.isEmpty() ? QString("keel-studio") : args[0]);
  keelArgs << out.qtArguments[0];
  for (int i = 1; i < args.size(); ++i) {
    const QString& a = args[i];
    if (a == "--") {  // everything after is positional
      keelArgs << args.mid(i);
      break;
    }
    const QString name = optionName(a);
    if (kQtFlags.contains(name)) {
      out.qtArguments << a;
    } else if (kQtOptionsWithValue.contains(name)) {
      out.qtArguments << a;
      if (!a.contains('=')) {
        if (i + 1 >= args.size()) return error(QString("option '%1' needs a value").arg(a));
        out.qtArguments << args[++i];
      }
    } else {
      keelArgs << a;
    }
  }

  QCommandLineParser cli;
  Options o;
  o.addTo(cli);
  if (!cli.parse(keelArgs)) {
    QString msg = cli.errorText();
    if (msg.endsWith('.')) msg.chop(1);
    if (!msg.isEmpty()) msg[0] = msg[0].toLower();
    return error(msg + " (keel-studio --help lists the options)");
  }
  if (cli.isSet("help")) {
    out.action = StudioCommandLine::Action::Help;
    return out;
  }
  if (cli.isSet("version")) {
    out.action = StudioCommandLine::Action::Version;
    out.message = QString("keel-studio %1").arg(KEEL_VERSION);
    return out;
  }

  const QStringList files = cli.positionalArguments();
  if (files.size() > 1) return error("expected at most one recording, got " + files.join(' '));
  if (!files.isEmpty()) out.recording = files[0];
  if (cli.isSet(o.compare)) {
    if (cli.isSet(o.session))  // it said "--compare needs a recording", which was given
      return error(
          "--compare cannot be used with --session (compare the session's recording once it is "
          "written: keel-studio RUN.db --compare OTHER.db)");
    if (files.isEmpty()) return error("--compare needs a recording to compare with");
    out.compare = cli.value(o.compare);
  }
  for (const QString& f : {out.recording, out.compare})
    if (!f.isEmpty() && !QFileInfo(f).isFile() && !storage::isRunFolder(f.toStdString()))
      return error(QFileInfo(f).isDir()
                       ? QString::fromStdString(storage::notARunFolder(f.toStdString()))
                       : notAFile("recording", f));
  bool ok = true;
  // The tolerances, read as keel diff reads them (a finite number >= 0; ULPs a whole one).
  for (auto [option, value] : {std::pair{&o.atol, &out.atol}, std::pair{&o.rtol, &out.rtol}}) {
    if (!cli.isSet(*option)) continue;
    const QString name = "--" + option->names().first();
    if (out.compare.isEmpty()) return error(name + " needs --compare");
    *value = cli.value(*option).toDouble(&ok);
    if (!ok || !std::isfinite(*value) || *value < 0)
      return error(name + ": expected a number >= 0, got '" + cli.value(*option) + "'");
  }
  if (cli.isSet(o.ulps)) {
    if (out.compare.isEmpty()) return error("--ulps needs --compare");
    out.ulps = cli.value(o.ulps).toULongLong(&ok);
    if (!ok) return error("--ulps: expected a whole number >= 0, got '" + cli.value(o.ulps) + "'");
  }
  if (cli.isSet(o.step)) {
    out.step = cli.value(o.step).toLongLong(&ok);
    if (!ok || out.step < 0)
      return error("--step: expected a step number, got '" + cli.value(o.step) + "'");
  }
  if (cli.isSet(o.rank)) {
    const int r = cli.value(o.rank).toInt(&ok);
    if (!ok || r < 0)
      return error("--rank: expected a rank number, got '" + cli.value(o.rank) + "'");
    if (out.recording.isEmpty() || !keel::storage::isRunFolder(out.recording.toStdString()))
      return error("--rank needs a run folder (a multi-rank recording)");
    try {
      const keel::storage::RunManifest m = keel::storage::readManifest(out.recording.toStdString());
      if (r >= m.worldSize)
        return error(QString("--rank: %1 has ranks 0..%2, not %3")
                         .arg(out.recording)
                         .arg(m.worldSize - 1)
                         .arg(r));
    } catch (const std::exception& e) {
      return error(QString::fromStdString(e.what()));
    }
    out.rank = r;
  }
  out.selectFirstDivergence = cli.isSet(o.firstDiv);
  if (out.selectFirstDivergence && out.compare.isEmpty())
    return error("--select-first-divergence needs --compare");
  if (cli.isSet(o.selectOp)) {
    out.selectOp = cli.value(o.selectOp).toULongLong(&ok);
    if (!ok)
      return error("--select-op: expected an op sequence number, got '" + cli.value(o.selectOp) +
                   "'");
  }
  if (cli.isSet(o.shot)) {
    out.screenshot = cli.value(o.shot);
    if (out.screenshot.isEmpty()) return error("--screenshot: expected a file name");
  }
  if (cli.isSet(o.viewsDir)) {
    if (out.screenshot.isEmpty()) return error("--views-dir needs --screenshot");
    out.viewsDir = cli.value(o.viewsDir);
  }
  if (cli.isSet(o.show)) {
    out.show = cli.value(o.show);
    if (!kStudioViews.contains(out.show))
      return error("--show: expected one of " + kStudioViews.join(", ") + ", got '" + out.show +
                   "'");
    if (out.show == "diff" && out.compare.isEmpty()) return error("--show diff needs --compare");
  }
  if (cli.isSet(o.size)) {
    const QStringList wh = cli.value(o.size).split('x');
    const int w = wh.size() == 2 ? wh[0].toInt(&ok) : 0;
    const int h = wh.size() == 2 && ok ? wh[1].toInt(&ok) : 0;
    if (!ok || w < 200 || h < 200 || w > 16384 || h > 16384)
      return error("--size: expected WxH between 200x200 and 16384x16384, e.g. 1600x1000, got '" +
                   cli.value(o.size) + "'");
    out.size = QSize(w, h);
  }

  // The picture never replaces an input or a device (Note [Outputs never destroy inputs]).
  // It replaces only a picture or an empty file (`--screenshot notes.md` replaced the notes), and
  // is named .png: it is a PNG whatever the name says.
  auto shotRefused = [&](const QString& config, const QString& output) -> std::optional<QString> {
    if (out.screenshot.isEmpty()) return std::nullopt;
    if (const QString why =
            screenshotRefusal("--screenshot", out.screenshot,
                              {{"the recording", out.recording.toStdString()},
                               {"the compared recording", out.compare.toStdString()},
                               {"the session's config", config.toStdString()},
                               {"the session's recording", output.toStdString()}});
        !why.isEmpty())
      return why;
    // Its folder must exist: found after a whole session had run, the picture was lost.
    if (const QFileInfo si(out.screenshot); !QFileInfo(si.absolutePath()).isDir())
      return "--screenshot " + out.screenshot + ": the folder " + si.absolutePath() +
             " does not exist";
    // The views' folder: an existing folder, or a new one in an existing folder (it made any
    // path, and a file given as the folder failed after the window was drawn).
    if (!out.viewsDir.isEmpty()) {
      const QFileInfo vi(QDir::cleanPath(out.viewsDir));  // "views/" names views
      if (vi.exists() && !vi.isDir())
        return "--views-dir " + out.viewsDir + " exists and is not a folder";
      if (!vi.exists() && !QFileInfo(vi.absolutePath()).isDir())
        return "--views-dir " + out.viewsDir + ": its parent folder " + vi.absolutePath() +
               " does not exist";
    }
    return std::nullopt;
  };
  const bool sessionOnly[] = {cli.isSet(o.backend), cli.isSet(o.steps), cli.isSet(o.seed),
                              cli.isSet(o.output),  cli.isSet(o.run),   cli.isSet(o.breakOn)};
  if (!cli.isSet(o.session)) {
    for (bool set : sessionOnly)
      if (set)
        return error(
            "--backend, --steps, --seed, --output, --run and --break-on belong to a live "
            "session: add --session config.json");
    if (auto why = shotRefused({}, {})) return error(*why);
    return out;
  }
  if (!out.recording.isEmpty()) return error("--session and a recording to open are exclusive");
  SessionConfig s;
  s.configPath = cli.value(o.session);
  if (!QFileInfo(s.configPath).isFile()) {
    // A config's name as the New session dialog lists it ("gpt-mini"): the installed configs'.
    const QString named = namedConfig(s.configPath);
    if (named.isEmpty()) {
      QStringList names;
      for (const QString& dir : configDirectories())
        for (const QFileInfo& f : QDir(dir).entryInfoList({"*.json"}, QDir::Files, QDir::Name))
          if (!names.contains(f.completeBaseName())) names << f.completeBaseName();
      QString message = notAFile("config", s.configPath);
      if (!s.configPath.contains('/') && !names.isEmpty())
        message += " (a config file, or one of " + names.join(", ") + ")";
      return error(message);
    }
    s.configPath = named;
  }
  s.backend = cli.value(o.backend);
  try {
    (void)keel::trainingDevice(s.backend.toStdString());
  } catch (const keel::Error& e) {
    return error("--backend: " + QString::fromUtf8(e.what()));
  }
  // The same ranges and words as keel record's (keel/base/number_words.h).
  s.steps = cli.value(o.steps).toLongLong(&ok);
  if (!ok || s.steps < 1 || s.steps > keel::capture::kMaxRunSteps)
    return error("--steps: " +
                 QString::fromStdString(keel::notAWholeNumberIn(1, keel::capture::kMaxRunSteps,
                                                                cli.value(o.steps).toStdString())));
  s.seed = cli.value(o.seed).toULongLong(&ok);
  if (!ok || cli.value(o.seed).startsWith('+'))
    return error("--seed: " +
                 QString::fromStdString(keel::notASeed(cli.value(o.seed).toStdString())));
  // Breakpoints, checked as the Breakpoints dialog checks them (an md5-ref reference opens and
  // holds MD5s; a step past the session could never pause it).
  for (const QString& item : cli.values(o.breakOn)) {
    Breakpoints one;
    one.add(item);
    if (const QString why = one.error(); !why.isEmpty()) return error("--break-on: " + why);
    const keel::capture::BreakCondition c =
        keel::capture::BreakCondition::parse(item.trimmed().toStdString());
    if (c.kind == keel::capture::BreakCondition::Kind::Step && c.value > double(s.steps))
      return error(QString("--break-on %1 lies past the session's %2 step%3 (--steps)")
                       .arg(item)
                       .arg(s.steps)
                       .arg(s.steps == 1 ? "" : "s"));
    out.breaks.add(item);
  }
  // --step and --select-op name what a run shows: a session shows them only once it has run.
  if (out.step >= 0 && !cli.isSet(o.run))
    return error("--step with --session needs --run (the session pauses before step 1)");
  if (out.step > s.steps)
    return error(QString("--step %1: the session runs %2 step%3 (--steps)")
                     .arg(out.step)
                     .arg(s.steps)
                     .arg(s.steps == 1 ? "" : "s"));
  if (out.selectOp)
    return error(
        "--select-op cannot be used with --session (the session selects the op it "
        "pauses or fails at; open its recording to select another)");
  if (cli.isSet(o.output)) {
    s.output = cli.value(o.output);
    const QFileInfo fi(s.output);
    if (s.output.isEmpty()) return error("--output: expected a recording file name");
    if (fi.isDir())
      return error("--output: " + s.output + " is a directory; expected a recording file name");
    if (fi.exists() && !fi.isFile())
      return error("--output: " + s.output + " exists and is not a regular file");
    try {  // the recording never replaces the config (Note [Outputs never destroy inputs])
      keel::checkOutputPath("--output", s.output.toStdString(),
                            {{"the session's config", s.configPath.toStdString()}});
      keel::checkReplacesOnlyARecording("--output", s.output.toStdString());
    } catch (const keel::Error& e) {
      return error(QString::fromUtf8(e.what()));
    }
    // Note [A session never replaces a recording]: the views read the session's recording as
    // it is written, so it is written in place from the first op; an existing recording would
    // be gone even if the session failed to start or was never run.
    if (fi.exists())
      return error("--output " + s.output +
                   " exists: a live session writes its recording in place as it runs and would "
                   "replace it (remove it, or choose another name)");
  }
  s.capture.stacks = s.capture.md5 = s.capture.stats = true;
  s.capture.allocator = true;
  out.session = s;
  out.run = cli.isSet(o.run);
  if (auto why = shotRefused(s.configPath, s.output)) return error(*why);
  return out;
}

QString studioHelpText() {
  QCommandLineParser cli;
  Options o;
  o.addTo(cli);
  return cli.helpText() +
         "\nQt's own options (-platform NAME, -style NAME, -display HOST:N, ...) are passed to "
         "Qt.\n";
}

QString checkRecordingRequests(const StudioCommandLine& cli) {
  if (cli.recording.isEmpty() || (cli.step < 0 && !cli.selectOp)) return {};
  if (!QFileInfo(cli.recording).isFile()) return {};  // a run folder: its rank's file decides
  const QString name = QFileInfo(cli.recording).fileName();
  try {
    const storage::Recording rec = storage::Recording::open(cli.recording.toStdString(), false);
    if (cli.step > 0) {
      const auto steps = rec.steps();
      const bool found = std::any_of(steps.begin(), steps.end(), [&](const storage::StepRecord& s) {
        return s.step == cli.step;
      });
      if (!found)
        return steps.empty()
                   ? QStringLiteral("--step %1: %2 has only step 0 (initialisation)")
                         .arg(cli.step)
                         .arg(name)
                   : QStringLiteral("--step %1: %2 has training steps %3 to %4%5")
                         .arg(cli.step)
                         .arg(name)
                         .arg(steps.front().step)
                         .arg(steps.back().step)
                         .arg(steps.back().step - steps.front().step + 1 == int64_t(steps.size())
                                  ? QString()
                                  : QStringLiteral(" (%1 of them)").arg(steps.size()));
    }
    if (cli.selectOp && !rec.op(*cli.selectOp))
      return QStringLiteral("--select-op %1: %2 has no op #%1 (it has %3 ops)")
          .arg(*cli.selectOp)
          .arg(name)
          .arg(rec.opCount());
  } catch (const std::exception&) {  // damaged or unreadable: the window says so
  }
  return {};
}

QString missingDisplayReason(const QStringList& qtArguments,
                             const std::function<QString(const char*)>& env) {
  for (const QString& a : qtArguments.mid(1))
    if (const QString n = optionName(a); n == "platform" || n == "display") return {};
  for (const char* var : {"QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY"})
    if (!env(var).isEmpty()) return {};
  return QStringLiteral(
      "no display (DISPLAY and WAYLAND_DISPLAY are not set): run it in a desktop session, under "
      "xvfb-run, or with -platform offscreen for --screenshot");
}

}  // namespace keel::studio
