// keel-studio through its real main(): every documented option, run as a user runs it (QProcess,
// offscreen platform). The live session form `--session CONFIG --run` records a run and shows its
// ops (it once opened an empty window: Qt took --session as its own, Note [Studio options before
// Qt]); --help works without a display; bad options give one line and exit 2.
#include <signal.h>

#include <QImage>
#include <QProcess>
#include <QRegularExpression>
#include <QtTest>

#include "keel/device.h"
#include "keel/storage/diff.h"
#include "keel/storage/reader.h"
#include "view_test_util.h"

using namespace keel;

namespace {

struct Result {
  int code = -1;
  QString out, err;
};

const QString kTiny = KEEL_SOURCE_DIR "/tests/fixtures/gpt-tiny.json";

// Runs keel-studio with `args`. `env` entries are added to (or, "NAME=" with no value, removed
// from) this process's environment; the platform is offscreen unless the test says otherwise.
Result studio(const QStringList& args, const QStringList& env = {}, int timeoutMs = 240000) {
  QProcess p;
  QProcessEnvironment e = QProcessEnvironment::systemEnvironment();
  e.insert("QT_QPA_PLATFORM", "offscreen");
  e.insert("KEEL_BLAS_TUNE", "0");
  for (const QString& kv : env) {
    const QString k = kv.section('=', 0, 0), v = kv.section('=', 1);
    if (v.isEmpty())
      e.remove(k);
    else
      e.insert(k, v);
  }
  p.setProcessEnvironment(e);
  p.start(KEEL_STUDIO_PATH, args);
  Result r;
  if (!p.waitForFinished(timeoutMs)) {
    p.kill();
    p.waitForFinished();
    r.err = "timed out";
    return r;
  }
  r.code = p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1;
  r.out = QString::fromLocal8Bit(p.readAllStandardOutput());
  r.err = QString::fromLocal8Bit(p.readAllStandardError());
  return r;
}

QString diag(const Result& r) {
  return "exit " + QString::number(r.code) + "\n" + r.out + r.err;
}

// The "keel-studio: saved ... — ..." line of a --screenshot run.
QString savedLine(const Result& r) {
  for (const QString& l : r.out.split('\n'))
    if (l.startsWith("keel-studio: saved ")) return l;
  return {};
}

}  // namespace

class StudioCliTest : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    dir_ = views::test::tempDir();
    QVERIFY(
        views::test::recordFixture(dir_ + "/a.db", "--steps 2 --seed 7 --md5 --stats --stacks"));
    QVERIFY(views::test::recordFixture(dir_ + "/b.db", "--steps 2 --seed 7 --md5 --stats --stacks",
                                       "KEEL_TEST_PERTURB=matmul:5"));
  }

  // The main job: the documented command records a live session of N steps and shows its ops.
  void sessionRunRecordsTheStepsAndShowsTheirOps() {
    const QString out = dir_ + "/live.db", shot = dir_ + "/live.png", views = dir_ + "/live-views";
    Result r = studio({"--session", kTiny, "--run", "--steps", "2", "--seed", "3", "--output", out,
                       "--screenshot", shot, "--views-dir", views, "--size", "1920x1080"});
    QVERIFY2(r.code == 0, qPrintable(diag(r)));
    // One self-contained file (storage::settleRecording): the views read it while it was written,
    // and it was left in WAL mode, most of the run in live.db-wal (a copy of the .db had 0 ops).
    QVERIFY(!QFileInfo::exists(out + "-wal"));
    QVERIFY(!QFileInfo::exists(out + "-shm"));
    storage::Recording rec = storage::Recording::open(out.toStdString());
    const auto steps = rec.steps();
    QCOMPARE(int(steps.size()), 2);
    QCOMPARE(steps.back().step, int64_t(2));
    QCOMPARE(rec.run().seed, uint64_t(3));
    QCOMPARE(QString::fromStdString(rec.run().backend), QString("cpu"));
    QCOMPARE(QString::fromStdString(rec.run().status), QString("finished"));
    const int step2Ops = int(rec.stepOps(2).size());
    QVERIFY(step2Ops > 50);
    // The picture was taken after the run finished, of the last step, with its ops on show.
    const QString line = savedLine(r);
    QVERIFY2(line.contains(QString("step 2 shown: %1 ops in the table").arg(step2Ops)),
             qPrintable(diag(r)));
    QVERIFY2(line.contains("session finished after 2 of 2 steps"), qPrintable(line));
    const QRegularExpression nodes("(\\d+) op nodes in the graph");
    const auto m = nodes.match(line);
    QVERIFY2(m.hasMatch() && m.captured(1).toInt() > 0, qPrintable(line));
    QImage img(shot);
    QCOMPARE(img.size(), QSize(1920, 1080));
    for (const char* v : {"graph", "ops", "inspector", "loss", "memory"})
      QVERIFY2(QFileInfo(views + "/" + v + ".png").size() > 2000, v);
  }

  // The README's exact form, with no --output: the recording goes under the user's data
  // directory and its path is printed.
  void sessionWithoutOutputRecordsUnderTheDataDirectory() {
    const QString data = dir_ + "/xdg-data";
    Result r =
        studio({"--session", kTiny, "--run", "--steps", "1", "--screenshot", dir_ + "/default.png"},
               {"XDG_DATA_HOME=" + data});
    QVERIFY2(r.code == 0, qPrintable(diag(r)));
    const QRegularExpression re("^keel-studio: recording the session to (.+\\.db)$",
                                QRegularExpression::MultilineOption);
    const auto m = re.match(r.out);
    QVERIFY2(m.hasMatch(), qPrintable(r.out));
    const QString path = m.captured(1);
    QVERIFY2(path.startsWith(data + "/Keel/Keel Studio/sessions/gpt-tiny-"), qPrintable(path));
    QCOMPARE(int(storage::Recording::open(path.toStdString()).steps().size()), 1);
  }

  // Without --run the session waits, paused before step 1, with step 0 (initialisation) recorded.
  void sessionWithoutRunWaitsPaused() {
    const QString out = dir_ + "/paused.db";
    Result r = studio({"--session", kTiny, "--steps", "3", "--backend", "cpu-ref", "--output", out,
                       "--screenshot", dir_ + "/paused.png"});
    QVERIFY2(r.code == 0, qPrintable(diag(r)));
    QVERIFY2(savedLine(r).contains("session paused after 0 of 3 steps"), qPrintable(diag(r)));
    storage::Recording rec = storage::Recording::open(out.toStdString(), false);
    QCOMPARE(QString::fromStdString(rec.run().backend), QString("cpu-ref"));
    QCOMPARE(int(rec.steps().size()), 0);
    QVERIFY(!rec.stepOps(0).empty());
  }

  void sessionStepPicksTheStepShownAtTheEnd() {
    Result r = studio({"--session", kTiny, "--run", "--steps", "2", "--step", "1", "--output",
                       dir_ + "/step1.db", "--screenshot", dir_ + "/step1.png"});
    QVERIFY2(r.code == 0, qPrintable(diag(r)));
    QVERIFY2(savedLine(r).contains("step 1 shown"), qPrintable(diag(r)));
  }

  // Note [Where a live session ends]: a session that went NaN ends where a replay of its
  // recording opens, its first NaN/Inf op selected in its step (it showed its last step, all red,
  // nothing selected); --step still picks the step.
  void aSessionThatWentNaNEndsAtItsFirstNaNSelected() {
    const QString out = dir_ + "/nan-live.db";
    const QStringList nan = {"KEEL_TEST_PERTURB=matmul:20:nan"};  // a backward matmul of step 1
    Result r = studio({"--session", kTiny, "--run", "--steps", "2", "--output", out, "--screenshot",
                       dir_ + "/nan-live.png"},
                      nan);
    QVERIFY2(r.code == 0, qPrintable(diag(r)));
    storage::Recording rec = storage::Recording::open(out.toStdString());
    const auto bad = rec.firstNonFinite();
    QVERIFY(bad);
    QCOMPARE(bad->step, int64_t(1));
    const QString line = savedLine(r);
    QVERIFY2(line.contains(QString("step %1 shown").arg(bad->step)) &&
                 line.contains(QString("selected #%1").arg(bad->seq)),
             qPrintable(diag(r)));
    // The same file reopened: the same step and op.
    const Result again = studio({out, "--screenshot", dir_ + "/nan-reopened.png"});
    QVERIFY2(again.code == 0, qPrintable(diag(again)));
    QVERIFY2(savedLine(again).contains(QString("step %1 shown").arg(bad->step)) &&
                 savedLine(again).contains(QString("selected #%1").arg(bad->seq)),
             qPrintable(diag(again)));
    // --step 2: step 2, and no op of step 1 selected with it.
    r = studio({"--session", kTiny, "--run", "--steps", "2", "--step", "2", "--output",
                dir_ + "/nan-step2.db", "--screenshot", dir_ + "/nan-step2.png"},
               nan);
    QVERIFY2(r.code == 0, qPrintable(diag(r)));
    QVERIFY2(savedLine(r).contains("step 2 shown") && !savedLine(r).contains("selected #"),
             qPrintable(diag(r)));
  }

  // A --step-range recording opens at the range's first step: it opened on step 1, which it
  // has the loss of but no ops ("nothing to draw", as if it held allocator events only).
  void aStepRangeRecordingOpensAtItsFirstRecordedStep() {
    const QString rec = dir_ + "/range.db";
    QVERIFY(views::test::recordFixture(rec, "--steps 3 --seed 7 --step-range 2:3"));
    const int step2Ops = int(storage::Recording::open(rec.toStdString()).stepOps(2).size());
    QVERIFY(step2Ops > 50);
    Result r = studio({rec, "--screenshot", dir_ + "/range.png"});
    QVERIFY2(r.code == 0, qPrintable(diag(r)));
    QVERIFY2(savedLine(r).contains(QString("step 2 shown: %1 ops in the table").arg(step2Ops)),
             qPrintable(diag(r)));
  }

  void replayShowsTheStepAndSelectsTheOp() {
    storage::Recording rec = storage::Recording::open((dir_ + "/a.db").toStdString());
    const auto ops = rec.stepOps(2);
    QVERIFY(ops.size() > 10);
    const uint64_t seq = ops[10].seq;
    for (const char* opt : {"--select-op", "--select"}) {
      Result r = studio({dir_ + "/a.db", "--step", "2", opt, QString::number(seq), "--screenshot",
                         dir_ + "/replay.png"});
      QVERIFY2(r.code == 0, qPrintable(diag(r)));
      const QString line = savedLine(r);
      QVERIFY2(line.contains(QString("step 2 shown: %1 ops in the table").arg(ops.size())),
               qPrintable(line));
      QVERIFY2(line.contains(QString("selected #%1").arg(seq)), qPrintable(line));
      QVERIFY2(line.contains("bottom dock: ops"), qPrintable(line));  // the default
    }
    // An op of another step than the one shown: its step is shown (the inspector showed it with
    // the graph and the table on step 1, nothing selected).
    {
      Result r = studio({dir_ + "/a.db", "--select-op", QString::number(seq), "--screenshot",
                         dir_ + "/other.png"});
      QVERIFY2(r.code == 0, qPrintable(diag(r)));
      const QString line = savedLine(r);
      QVERIFY2(line.contains(QString("step 2 shown: %1 ops in the table").arg(ops.size())),
               qPrintable(line));
      QVERIFY2(line.contains(QString("selected #%1").arg(seq)), qPrintable(line));
    }
    // --views-dir with a trailing slash names the folder itself (it was refused as 'its parent
    // folder .../v2 does not exist').
    {
      Result r =
          studio({dir_ + "/a.db", "--screenshot", dir_ + "/v.png", "--views-dir", dir_ + "/v2/"});
      QVERIFY2(r.code == 0, qPrintable(diag(r)));
      QVERIFY(QFileInfo(dir_ + "/v2/graph.png").size() > 2000);
    }
    // --show raises another view of the bottom dock.
    for (const char* view : {"memory", "timeline", "logs"}) {
      Result r = studio({dir_ + "/a.db", "--show", view, "--screenshot", dir_ + "/show.png"});
      QVERIFY2(r.code == 0, qPrintable(diag(r)));
      QVERIFY2(savedLine(r).contains(QString("bottom dock: ") + view), qPrintable(diag(r)));
    }
  }

  void compareSelectsTheFirstDivergence() {
    storage::Recording a = storage::Recording::open((dir_ + "/a.db").toStdString());
    storage::Recording b = storage::Recording::open((dir_ + "/b.db").toStdString());
    const storage::DiffReport report = storage::diffRuns(a.allOps(), b.allOps(), {});
    QVERIFY(report.first && report.first->pair.inA);
    const uint64_t seqA = report.first->pair.seqA;
    // Qt's own options still reach Qt (-platform here instead of the environment).
    Result r =
        studio({dir_ + "/a.db", "--compare", dir_ + "/b.db", "--select-first-divergence",
                "-platform", "offscreen", "--show", "diff", "--screenshot", dir_ + "/compare.png"},
               {"QT_QPA_PLATFORM="});
    QVERIFY2(r.code == 0, qPrintable(diag(r)));
    const QString line = savedLine(r);
    QVERIFY2(line.contains("compared with " + dir_ + "/b.db"), qPrintable(line));
    QVERIFY2(line.contains(QString("first divergence: A #%1").arg(seqA)), qPrintable(line));
    QVERIFY2(line.contains(QString("selected #%1").arg(seqA)), qPrintable(line));
    QVERIFY2(line.contains("bottom dock: diff"), qPrintable(line));
    // Nothing diverges: the line says so (it said nothing, and nothing was selected).
    r = studio({dir_ + "/a.db", "--compare", dir_ + "/a.db", "--select-first-divergence",
                "--screenshot", dir_ + "/same.png"});
    QVERIFY2(r.code == 0, qPrintable(diag(r)));
    QVERIFY2(savedLine(r).contains("; no divergence"), qPrintable(diag(r)));
  }

  // Graph-only recordings (no --md5/--stats): the studio must not call them identical. Their
  // losses still show a perturbed run diverging; two equal runs say nothing was compared.
  void graphOnlyRecordingsAreNotCalledIdentical() {
    QVERIFY(views::test::recordFixture(dir_ + "/g1.db", "--steps 2 --seed 7"));
    QVERIFY(views::test::recordFixture(dir_ + "/g2.db", "--steps 2 --seed 7"));
    QVERIFY(views::test::recordFixture(dir_ + "/g3.db", "--steps 2 --seed 7",
                                       "KEEL_TEST_PERTURB=matmul:5"));
    const QString views = dir_ + "/graph-only-views";
    Result r = studio({dir_ + "/g1.db", "--compare", dir_ + "/g2.db", "--views-dir", views,
                       "--screenshot", dir_ + "/g12.png"});
    QVERIFY2(r.code == 0, qPrintable(diag(r)));
    QVERIFY2(savedLine(r).endsWith("bottom dock: diff; no values compared"), qPrintable(diag(r)));
    r = studio({dir_ + "/g1.db", "--compare", dir_ + "/g3.db", "--screenshot", dir_ + "/g13.png"});
    QVERIFY2(r.code == 0, qPrintable(diag(r)));
    QVERIFY2(savedLine(r).endsWith("bottom dock: diff; losses diverge at step 1"),
             qPrintable(diag(r)));
  }

  // Without a display (no DISPLAY, WAYLAND_DISPLAY or platform) the window cannot open: one line
  // and exit 2, not Qt's platform-plugin text and an abort.
  void noDisplayIsOneLineAndStatus2() {
    const QStringList noDisplay{"QT_QPA_PLATFORM=", "DISPLAY=", "WAYLAND_DISPLAY="};
    Result r = studio({dir_ + "/a.db", "--screenshot", dir_ + "/nodisplay.png"}, noDisplay);
    QCOMPARE(r.code, 2);
    QCOMPARE(r.err, QString("keel-studio: error: no display (DISPLAY and WAYLAND_DISPLAY are not "
                            "set): run it in a desktop session, under xvfb-run, or with -platform "
                            "offscreen for --screenshot\n"));
    QVERIFY(!QFileInfo::exists(dir_ + "/nodisplay.png"));
    // -platform offscreen is a display of its own.
    r = studio({dir_ + "/a.db", "-platform", "offscreen", "--screenshot", dir_ + "/nodisplay.png"},
               noDisplay);
    QVERIFY2(r.code == 0, qPrintable(diag(r)));
  }

  // --help and --version need no display: no platform plugin, no DISPLAY.
  void helpAndVersionWorkWithoutADisplay() {
    const QStringList noDisplay{"QT_QPA_PLATFORM=", "DISPLAY=", "WAYLAND_DISPLAY="};
    Result r = studio({"--help"}, noDisplay);
    QCOMPARE(r.code, 0);
    for (const char* opt : {"--session", "--compare", "--select-first-divergence", "--screenshot",
                            "--views-dir", "--size", "--show", "--step", "--select-op", "--backend",
                            "--steps", "--seed", "--output", "--run"})
      QVERIFY2(r.out.contains(opt), opt);
    r = studio({"-h"}, noDisplay);
    QCOMPARE(r.code, 0);
    r = studio({"--version"}, noDisplay);
    QCOMPARE(r.code, 0);
    QVERIFY2(r.out.startsWith("keel-studio " KEEL_VERSION), qPrintable(r.out));
  }

  // Every bad command line: one line on stderr, exit 2, no window (so no display is needed).
  void badOptionsGiveOneLineAndExit2() {
    const QString a = dir_ + "/a.db";
    QList<QPair<QStringList, QString>> cases = {
        {{"--bogus"}, "unknown option 'bogus'"},
        {{"--session", dir_ + "/nope.json"}, "no such config"},
        {{"--session"}, "missing value"},
        {{"--session", kTiny, "--backend", "gpu"},
         "--backend: backend 'gpu' is not available for training (expected cpu, cpu-ref or "
         "cuda[:N])"},
        {{"--session", kTiny, "--steps", "0"},
         "--steps: must be a whole number in [1, 1000000000], got '0'"},
        {{"--session", kTiny, "--steps", "10000000000"},
         "--steps: must be a whole number in [1, 1000000000], got '10000000000'"},
        {{"--session", kTiny, "--steps", "1e3"}, "--steps: must be a whole number"},
        {{"--session", kTiny, "--seed", "x"},
         "--seed: must be a whole number in [0, 18446744073709551615], got 'x'"},
        {{"--session", kTiny, "--seed", "-1"}, "--seed: must be a whole number in [0, "},
        {{"--session", kTiny, "--seed", "18446744073709551616"}, "--seed: must be a whole number"},
        // The session's recording never replaces its config: refused before any window opens.
        {{"--session", kTiny, "--output", kTiny}, "--output " + kTiny + " is the session's config"},
        {{"--session", kTiny, "--output", dir_},
         "--output: " + dir_ + " is a directory; expected a recording file name"},
        {{"--session", kTiny, "--output", ""}, "--output: expected a recording file name"},
        {{"--session", kTiny, "--steps", "2", "--break-on", "step:9"},
         "--break-on step:9 lies past the session's 2 steps (--steps)"},
        {{"--session", kTiny, "--break-on", "bogus"}, "--break-on: "},
        {{a, "--break-on", "nan"}, "--break-on belong to a live session"},
        {{"--session", kTiny, "--output", "/dev/null"}, "not a regular file"},
        // A recording replaces only a recording.
        {{"--session", kTiny, "--output", dir_ + "/notes.txt"},
         "--output " + dir_ + "/notes.txt exists and is not a recording"},
        {{"--session", kTiny, a}, "exclusive"},
        {{"--steps", "3"}, "belong to a live session"},
        {{"--run"}, "belong to a live session"},
        {{dir_ + "/nope.db"}, "no such recording"},
        {{"/dev/zero"}, "recording /dev/zero is a character device, not a regular file"},
        {{"--session", "/dev/zero"}, "config /dev/zero is a character device"},
        {{a, "b.db", "c.db"}, "at most one recording"},
        {{"--compare", a}, "--compare needs a recording"},
        {{a, "--compare", dir_ + "/nope.db"}, "no such recording"},
        {{a, "--select-first-divergence"}, "needs --compare"},
        {{a, "--step", "-1"}, "--step: expected a step number"},
        {{a, "--select-op", "x"}, "--select-op: expected an op sequence number"},
        // Checked against the recording (a 2-step run): nothing shown that it does not have.
        {{a, "--step", "99"}, "--step 99: a.db has training steps 1 to 2"},
        {{a, "--step", "3", "--screenshot", dir_ + "/s3.png"},
         "--step 3: a.db has training steps 1 to 2"},
        {{a, "--select-op", "999999"}, "--select-op 999999: a.db has no op #999999 (it has "},
        {{a, "--views-dir", dir_}, "--views-dir needs --screenshot"},
        {{a, "--screenshot", "s.png", "--size", "10x10"}, "--size: expected WxH"},
        {{a, "--screenshot", "s.png", "--size", "big"}, "--size: expected WxH"},
        {{a, "-platform"}, "needs a value"},
        {{a, "--show", "graph"}, "--show: expected one of ops, diff, logs, memory, timeline"},
        {{a, "--show", "diff"}, "--show diff needs --compare"},
        // The picture never replaces an input or a device.
        {{a, "--screenshot", a}, "--screenshot " + a + " is the recording"},
        {{"--session", kTiny, "--screenshot", kTiny}, "is the session's config"},
        {{a, "--screenshot", "/dev/null"}, "/dev/null is a character device, not a regular file"},
        // It replaces only a picture, and is named .png (`--screenshot notes.md` replaced them).
        {{a, "--screenshot", dir_ + "/notes.txt"},
         "--screenshot " + dir_ + "/notes.txt: the studio saves PNG pictures; name the file .png"},
        {{a, "--screenshot", dir_ + "/notes.png"},
         "--screenshot " + dir_ + "/notes.png exists and is not a PNG picture; refusing"},
        {{a, "--screenshot", "s.png", "--views-dir", dir_ + "/notes.txt"},
         "--views-dir " + dir_ + "/notes.txt exists and is not a folder"},
        {{a, "--screenshot", "s.png", "--views-dir", dir_ + "/no/such/views"},
         "--views-dir " + dir_ + "/no/such/views: its parent folder " + dir_ +
             "/no/such does not exist"},
        // Note [A session never replaces a recording]: written in place from the first op, it
        // replaced the recording even when the session failed to start or never ran.
        {{"--session", kTiny, "--output", a},
         "--output " + a +
             " exists: a live session writes its recording in place as it runs and would replace "
             "it (remove it, or choose another name)"},
        {{"--session", kTiny, "--compare", a},
         "--compare cannot be used with --session (compare the session's recording once it is "
         "written"},
        {{"--session", kTiny, "--step", "1"},
         "--step with --session needs --run (the session pauses before step 1)"},
        {{"--session", kTiny, "--run", "--steps", "2", "--step", "5"},
         "--step 5: the session runs 2 steps (--steps)"},
        {{"--session", kTiny, "--select-op", "5"}, "--select-op cannot be used with --session"},
        // A config's name as the New session dialog lists it; a wrong one lists the names.
        {{"--session", "gpt-mni"}, "no such config: gpt-mni (a config file, or one of "},
        // The picture's folder, checked before anything runs (it was found after a session).
        {{a, "--screenshot", dir_ + "/no/such/x.png"},
         "--screenshot " + dir_ + "/no/such/x.png: the folder " + dir_ + "/no/such does not exist"},
        // A folder that is not a run folder is named as one.
        {{dir_}, dir_ + " is a folder but not a run folder (it has no manifest.json"},
        {{a, "--compare", dir_}, dir_ + " is a folder but not a run folder"},
    };
    QFile check(a);
    QVERIFY(check.open(QIODevice::ReadOnly));
    const QByteArray before = check.readAll();
    check.close();
    for (const char* name : {"/notes.txt", "/notes.png"}) {
      QFile notes(dir_ + name);
      QVERIFY(notes.open(QIODevice::WriteOnly));
      notes.write("my notes\n");
    }
    // A cuda session where the machine has no CUDA device (a GPU machine starts it instead).
    if (keel::cudaDevices() == 0)
      cases.append({{"--session", kTiny, "--backend", "cuda"},
                    "--backend: device 'cuda:0' is not available: "});
    for (const auto& [args, expect] : cases) {
      Result r = studio(args, {"QT_QPA_PLATFORM=", "DISPLAY=", "WAYLAND_DISPLAY="});
      const QString what = args.join(' ') + "\n" + diag(r);
      QVERIFY2(r.code == 2, qPrintable(what));
      QVERIFY2(r.err.startsWith("keel-studio: error: "), qPrintable(what));
      QVERIFY2(r.err.count('\n') == 1, qPrintable(what));
      QVERIFY2(r.err.contains(expect), qPrintable(what));
      QVERIFY2(r.out.isEmpty(), qPrintable(what));
    }
    QVERIFY(check.open(QIODevice::ReadOnly));
    QCOMPARE(check.readAll(), before);  // the recording refused as a picture is untouched
    for (const char* name : {"/notes.txt", "/notes.png"}) {
      QFile notes(dir_ + name);
      QVERIFY(notes.open(QIODevice::ReadOnly));
      QCOMPARE(notes.readAll(), QByteArray("my notes\n"));
    }
  }

  // A session that fails before it records anything (a malformed config, an output folder that
  // does not exist): the error alone, exit 2, no picture — it printed "recording the session
  // to ..." and saved a picture of an empty window.
  void aSessionThatCannotStartIsOneLineAndNoPicture() {
    const QString bad = dir_ + "/malformed.json", shot = dir_ + "/never.png";
    {
      QFile f(bad);
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write("{ not json");
    }
    const QList<QPair<QStringList, QString>> cases = {
        {{"--session", bad, "--run", "--steps", "1", "--output", dir_ + "/m.db"}, "invalid JSON"},
        {{"--session", kTiny, "--run", "--steps", "1", "--output", dir_ + "/no/such/dir/x.db"},
         "no/such/dir/x.db"},
        // A folder that exists but takes no file (it said "the directory /proc does not exist").
        {{"--session", kTiny, "--run", "--steps", "1", "--output", "/proc/x.db"},
         "cannot write /proc/x.db: the directory /proc takes no new files"},
    };
    for (const auto& [args, expect] : cases) {
      const Result r = studio(args + QStringList{"--screenshot", shot, "--size", "800x600"});
      const QString what = args.join(' ') + "\n" + diag(r);
      QVERIFY2(r.code == 2, qPrintable(what));
      // One error line (Qt's own warnings about the offscreen platform aside).
      QVERIFY2(r.err.count("keel-studio: error: ") == 1, qPrintable(what));
      QVERIFY2(r.err.contains(expect), qPrintable(what));
      QVERIFY2(!r.out.contains("recording the session") && !r.out.contains("saved "),
               qPrintable(what));
      QVERIFY(!QFileInfo::exists(shot));
    }
  }

  // A session whose model fails to build (an op of step 0 throws): the recording holds the ops
  // up to the failing one, and the studio opens it at step 0 with that op selected and saves the
  // picture, then reports the error (it printed the error alone and saved nothing). A config's
  // name ("gpt-tiny" is not one: the installed names) resolves like the dialog's list.
  void aSessionFailingWhileSettingUpShowsTheFailingOp() {
    const QString out = dir_ + "/setup-fail.db", shot = dir_ + "/setup-fail.png";
    const Result r = studio({"--session", kTiny, "--run", "--steps", "2", "--output", out,
                             "--screenshot", shot, "--size", "1000x700"},
                            {"KEEL_TEST_PERTURB=normal:2:fail"});
    const QString what = diag(r);
    QVERIFY2(r.code == 2, qPrintable(what));
    QVERIFY2(r.err.count("keel-studio: error: ") == 1, qPrintable(what));
    QVERIFY2(r.err.contains("op 'normal': injected failure"), qPrintable(what));
    QVERIFY2(QFileInfo::exists(shot), qPrintable(what));
    storage::Recording rec = storage::Recording::open(out.toStdString());
    const auto ops = rec.stepOps(0);
    QVERIFY(!ops.empty());
    const uint64_t failing = ops.back().seq;
    QCOMPARE(QString::fromStdString(ops.back().name), QString("normal"));
    QVERIFY2(r.out.contains(QString("selected #%1").arg(failing)), qPrintable(what));
  }

  // Note [Studio signals]: SIGINT or SIGTERM stop a live session as File > Quit does: the
  // recording is finished ("stopped: interrupted (SIGINT)", no lock left) and the exit status is
  // 128 + the signal. They killed the process at once, leaving "killed or crashed".
  void aSignalStopsALiveSessionAndFinishesItsRecording() {
    for (const int sig : {SIGINT, SIGTERM}) {
      const QString out = dir_ + QString("/signal-%1.db").arg(sig);
      QProcess p;
      QProcessEnvironment e = QProcessEnvironment::systemEnvironment();
      e.insert("QT_QPA_PLATFORM", "offscreen");
      p.setProcessEnvironment(e);
      p.start(KEEL_STUDIO_PATH,
              {"--session", kTiny, "--run", "--steps", "100000", "--output", out});
      QByteArray printed;
      QVERIFY(QTest::qWaitFor(
          [&] {
            printed += p.readAllStandardOutput();
            return printed.contains("recording the session to");
          },
          60000));
      storage::Recording before = storage::Recording::open(out.toStdString());
      QVERIFY(QTest::qWaitFor([&] { return !before.steps().empty(); }, 60000));  // it runs
      ::kill(pid_t(p.processId()), sig);
      QVERIFY(p.waitForFinished(60000));
      QCOMPARE(p.exitStatus(), QProcess::NormalExit);
      QCOMPARE(p.exitCode(), 128 + sig);
      storage::Recording rec = storage::Recording::open(out.toStdString());
      QCOMPARE(QString::fromStdString(rec.run().status),
               QString("stopped: interrupted (%1)").arg(sig == SIGINT ? "SIGINT" : "SIGTERM"));
      QVERIFY(!QFileInfo::exists(dir_ + QString("/.signal-%1.db.lock").arg(sig)));
    }
  }

  // --break-on gives a session its breakpoints from the start (a studio session could not pause
  // on a NaN without the dialog): the pause is said in a line, and a --screenshot pictures it
  // with the op selected.
  void breakOnPausesTheSessionAndSaysWhere() {
    const QString out = dir_ + "/break-on.db", shot = dir_ + "/break-on.png";
    const Result r = studio({"--session", kTiny, "--run", "--steps", "3", "--break-on", "nan",
                             "--output", out, "--screenshot", shot, "--size", "1000x700"},
                            {"KEEL_TEST_PERTURB=matmul:20:nan"});
    QVERIFY2(r.code == 0, qPrintable(diag(r)));
    storage::Recording rec = storage::Recording::open(out.toStdString());
    const auto bad = rec.firstNonFinite();
    QVERIFY(bad.has_value());
    QVERIFY2(r.out.contains(QString("keel-studio: paused at op #%1 (step %2): breakpoint: first "
                                    "NaN/Inf")
                                .arg(bad->seq)
                                .arg(bad->step)),
             qPrintable(diag(r)));
    QVERIFY2(savedLine(r).contains(QString("selected #%1").arg(bad->seq)), qPrintable(diag(r)));
    QVERIFY(QFileInfo(shot).size() > 0);
  }

  // A recording being written by another process (keel record): the studio opens the steps
  // committed so far (SQLite WAL readers), never an error about a half-written row.
  void aRecordingBeingWrittenOpensWithItsCommittedSteps() {
    const QString live = dir_ + "/live.db";
    QProcess rec;
    QByteArray printed;
    QVERIFY(views::test::startLongRecord(rec, live, printed, 3, {"--md5"}));
    for (int i = 0; i < 2; ++i) {
      const Result r = studio({live, "--screenshot", dir_ + "/live.png"});
      QVERIFY2(r.code == 0, qPrintable(diag(r)));
      QVERIFY2(savedLine(r).contains(live + ": ") && savedLine(r).contains(" steps, "),
               qPrintable(diag(r)));
    }
    rec.terminate();  // SIGTERM: the run stops after its op and finishes the recording
    QVERIFY(rec.waitForFinished(60000));
    QCOMPARE(rec.exitCode(), 128 + 15);
  }

  // A recording that cannot be opened: the error alone, exit 2, and no picture (a picture of an
  // empty window was saved, over the file already at that path).
  void unreadableRecordingIsOneLineAndNoPicture() {
    const QString bad = dir_ + "/garbage.db";
    QFile f(bad);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(QByteArray(4096, 'x'));
    f.close();
    QImage mine(4, 4, QImage::Format_RGB32);  // the user's own picture, at the path given
    mine.fill(Qt::red);
    QVERIFY(mine.save(dir_ + "/garbage.png"));
    QFile old(dir_ + "/garbage.png");
    QVERIFY(old.open(QIODevice::ReadOnly));
    const QByteArray before = old.readAll();
    old.close();
    Result r = studio({bad, "--screenshot", dir_ + "/garbage.png"});
    QCOMPARE(r.code, 2);
    // (Qt may print its own warnings first.)
    QVERIFY2(r.err.contains(QRegularExpression("^keel-studio: error: recording .*garbage.db is not "
                                               "an SQLite file$",
                                               QRegularExpression::MultilineOption)),
             qPrintable(diag(r)));
    QVERIFY2(r.err.count("keel-studio: error: ") == 1, qPrintable(diag(r)));
    QVERIFY2(!r.out.contains("saved "), qPrintable(diag(r)));
    QVERIFY(old.open(QIODevice::ReadOnly));
    QCOMPARE(old.readAll(), before);
  }

 private:
  QString dir_;
};

QTEST_GUILESS_MAIN(StudioCliTest)
#include "studio_cli_test.moc"
