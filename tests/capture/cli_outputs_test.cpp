// Outputs never destroy inputs (Note [Outputs never destroy inputs], keel/base/output_path.h),
// through the real keel binary: an output that is an input, a device, a FIFO or a directory is
// refused before anything is written; an existing recording or export is replaced only once the
// new one is complete (a run whose setup fails keeps it byte for byte); write errors on stdout
// are one line and exit 2.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "keel/base/output_path.h"
#include "keel/base/text.h"
#include "keel/data.h"
#include "keel/storage/export.h"
#include "keel/storage/reader.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;

using keel::test::CliResult;
using keel::test::expectOneLineError;

std::string slurp(const fs::path& p) {
  return keel::readFile(p.string());
}

class KeelOutputs : public keel::test::KeelCliTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    fs::copy_file(fs::path(KEEL_SOURCE_DIR) / "tests/fixtures/gpt-tiny.json", dir_ / "c.json");
  }

  CliResult record(const std::string& out, const std::string& extra = "",
                   const std::string& env = "") {
    return keel(
        "record --config '" + path("c.json") + "' --steps 1 --seed 2 -o '" + out + "' " + extra,
        env);
  }
  // Nothing but the named files is left in the directory (no partial replacement; the
  // cli_out/cli_err captures of runKeelCli aside).
  void expectOnly(std::initializer_list<std::string> names) {
    std::set<std::string> want(names), got;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename().string().rfind("cli_", 0) != 0)
        got.insert(e.path().filename().string());
    EXPECT_EQ(got, want);
  }
  // keel with stdout on /dev/full; stderr captured.
  CliResult keelToFullDevice(const std::string& args) {
    const std::string err = path("cli_full_err.txt");
    const std::string cmd = "cd '" + std::string(KEEL_SOURCE_DIR) + "' && KEEL_BLAS_TUNE=0 '" +
                            std::string(KEEL_CLI_PATH) + "' " + args + " >/dev/full 2>'" + err +
                            "'";
    const int raw = std::system(cmd.c_str());
    CliResult r;
    r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + (WIFSIGNALED(raw) ? WTERMSIG(raw) : 0);
    r.err = slurp(err);
    return r;
  }
};

TEST_F(KeelOutputs, AnOutputThatIsAnInputIsRefusedAndKept) {
  const std::string config = slurp(dir_ / "c.json");
  expectOneLineError(record(path("c.json")), "is the config");
  EXPECT_EQ(slurp(dir_ / "c.json"), config);
  // The same file by another name: a hard link, and ./ in the path.
  fs::create_hard_link(dir_ / "c.json", dir_ / "link.json");
  expectOneLineError(record(path("link.json")), "refusing to overwrite an input");
  expectOneLineError(record(dir_.string() + "/./c.json"), "is the config");
  EXPECT_EQ(slurp(dir_ / "c.json"), config);
  // The corpus.
  std::ofstream(path("corpus.txt")) << std::string(4000, 'x');
  expectOneLineError(record(path("corpus.txt"), "--data '" + path("corpus.txt") + "'"),
                     "is the training data");
  EXPECT_EQ(slurp(dir_ / "corpus.txt"), std::string(4000, 'x'));
  // An export over its own recording.
  ASSERT_EQ(record(path("r.db")).status, 0);
  const std::string rec = slurp(dir_ / "r.db");
  for (const char* kind : {"csv", "trace", "graph"})
    expectOneLineError(
        keel(std::string("export ") + kind + " '" + path("r.db") + "' -o '" + path("r.db") + "'"),
        "is the recording");
  EXPECT_EQ(slurp(dir_ / "r.db"), rec);
  EXPECT_EQ(keel::storage::Recording::open(path("r.db")).steps().size(), 1u);
  fs::remove(dir_ / "link.json");
  expectOnly({"c.json", "corpus.txt", "r.db"});
}

// A corpus given as a directory holds every file below it: an output there (an existing document
// or a new file the next run would train on) is refused, as is one in the default corpus.
TEST_F(KeelOutputs, AnOutputInsideTheDataDirectoryIsRefused) {
  fs::create_directories(dir_ / "corpus/sub");
  std::ofstream(path("corpus/a.txt")) << std::string(3000, 'a');
  std::ofstream(path("corpus/sub/b.txt")) << std::string(3000, 'b');
  for (const char* out :
       {"corpus/a.txt", "corpus/sub/b.txt", "corpus/new.db", "corpus/sub/../x.db"})
    expectOneLineError(record(path(out), "--data '" + path("corpus") + "'"),
                       "is inside the training data (the directory " + path("corpus") + ")");
  expectOneLineError(record(std::string(keel::data::kDefaultCorpusDir) + "/GPL-3"),
                     "is inside the default training data");
  EXPECT_EQ(slurp(dir_ / "corpus/a.txt"), std::string(3000, 'a'));
  EXPECT_EQ(slurp(dir_ / "corpus/sub/b.txt"), std::string(3000, 'b'));
  EXPECT_FALSE(fs::exists(dir_ / "corpus/new.db"));
  EXPECT_FALSE(fs::exists(dir_ / "corpus/x.db"));
  // Beside the corpus is fine.
  EXPECT_EQ(record(path("corpus.db"), "--data '" + path("corpus") + "'").status, 0);
}

// A checkpoint that cannot be written (a file-size limit) leaves nothing: no step-N.tmp of a
// training run, no half-written DST of a conversion (the same command can run again); a
// --ckpt-dir that is a file is refused before the first step.
TEST_F(KeelOutputs, AFailedCheckpointWriteLeavesNothingBehind) {
  const std::string train = "train --config '" + path("c.json") + "' --steps 2 --alloc caching ";
  ASSERT_EQ(keel(train + "--ckpt-dir '" + path("ck") + "'").status, 0);
  const std::string limited = "prlimit --fsize=4096 ";
  expectOneLineError(keel(train + "--ckpt-dir '" + path("small") + "'", limited), "small");
  EXPECT_TRUE(!fs::exists(dir_ / "small") || fs::is_empty(dir_ / "small"));
  expectOneLineError(
      keel("ckpt convert '" + path("ck") + "' '" + path("dst") + "' --target-tp 2", limited), "");
  EXPECT_FALSE(fs::exists(dir_ / "dst"));
  EXPECT_EQ(keel("ckpt convert '" + path("ck") + "' '" + path("dst") + "' --target-tp 2").status,
            0);
  // A DST that is refused (not empty) is never cleaned: what the user had there stays.
  fs::create_directory(dir_ / "full");
  std::ofstream(path("full/keep.txt")) << "mine";
  expectOneLineError(keel("ckpt convert '" + path("ck") + "' '" + path("full") + "' --target-tp 2"),
                     "is not empty (refusing to overwrite)");
  EXPECT_EQ(slurp(dir_ / "full/keep.txt"), "mine");
  const std::string config = slurp(dir_ / "c.json");
  expectOneLineError(keel(train + "--ckpt-dir '" + path("c.json") + "'"),
                     "--ckpt-dir " + path("c.json") + " exists and is not a directory");
  EXPECT_EQ(slurp(dir_ / "c.json"), config);
}

// keel train --ckpt-dir replaced a step-NNNNNN folder it was about to save into whole, notes and
// all, whatever it held; wrote checkpoints among the documents of the corpus and inside the
// checkpoint it resumed from; and found an unwritable folder only at the first save, after every
// step. Each is one line before the first step now.
TEST_F(KeelOutputs, ACheckpointFolderNeverReplacesWhatKeelDidNotWrite) {
  const std::string train = "train --config '" + path("c.json") + "' --eval-batches 0 ";
  fs::create_directories(dir_ / "ck/step-000002");
  std::ofstream(path("ck/step-000002/notes.txt")) << "mine";
  expectOneLineError(keel(train + "--steps 2 --ckpt-dir '" + path("ck") + "'"),
                     "--ckpt-dir " + path("ck") +
                         " holds step-000002, which is not a checkpoint (no keel-checkpoint.json): "
                         "this run's save at step 2 would replace it");
  EXPECT_EQ(slurp(dir_ / "ck/step-000002/notes.txt"), "mine");
  // A folder at a step this run does not save into is left alone (and the run saves beside it).
  ASSERT_EQ(keel(train + "--steps 3 --ckpt-dir '" + path("ck") + "'").status, 0);
  EXPECT_EQ(slurp(dir_ / "ck/step-000002/notes.txt"), "mine");
  EXPECT_TRUE(fs::exists(dir_ / "ck/step-000003/keel-checkpoint.json"));
  // A checkpoint whose metadata went missing: --resume DIR takes the step before it, and saving
  // would have replaced it.
  ASSERT_EQ(keel(train + "--steps 4 --save-every 2 --ckpt-dir '" + path("run") + "'").status, 0);
  fs::remove(dir_ / "run/step-000004/keel-checkpoint.json");
  expectOneLineError(keel(train + "--steps 6 --save-every 2 --resume '" + path("run") +
                          "' --ckpt-dir '" + path("run") + "'"),
                     "holds step-000004, which is not a checkpoint");
  EXPECT_FALSE(fs::is_empty(dir_ / "run/step-000004"));
  // Among the inputs: the corpus folder, the checkpoint resumed from.
  fs::create_directories(dir_ / "corpus");
  std::ofstream(path("corpus/a.txt")) << std::string(3000, 'a');
  expectOneLineError(keel(train + "--steps 1 --data '" + path("corpus") + "' --ckpt-dir '" +
                          path("corpus/ck") + "'"),
                     "--ckpt-dir " + path("corpus/ck") + " is inside the training data");
  expectOneLineError(
      keel(train + "--steps 1 --ckpt-dir '" + std::string(keel::data::kDefaultCorpusDir) + "/ck'"),
      "is inside the training data");
  expectOneLineError(keel(train + "--steps 6 --resume '" + path("run/step-000002") +
                          "' --ckpt-dir '" + path("run/step-000002/more") + "'"),
                     "is inside the checkpoint --resume reads");
  EXPECT_FALSE(fs::exists(dir_ / "corpus/ck"));
  EXPECT_FALSE(fs::exists(dir_ / "run/step-000002/more"));
}

// Two conversions into one empty DST: both said "converted" over a mix of their files, or one
// removed what the other wrote. A second writer is refused while the first holds DST's lock;
// a failed conversion into new/a/b removes the folders it made, not just b.
TEST_F(KeelOutputs, ASecondConversionIntoTheSameFolderIsRefused) {
  const std::string train = "train --config '" + path("c.json") + "' --steps 1 ";
  ASSERT_EQ(keel(train + "--ckpt-dir '" + path("ck") + "'").status, 0);
  fs::create_directory(dir_ / "dst");
  {
    const keel::OutputLock held(path("dst"));  // as a conversion writing dst holds it
    expectOneLineError(
        keel("ckpt convert '" + path("ck") + "' '" + path("dst") + "/' --target-tp 2"),
        "output " + path("dst") + " is being written by another process (pid ");
    EXPECT_TRUE(fs::is_empty(dir_ / "dst"));
  }
  ASSERT_EQ(keel("ckpt convert '" + path("ck") + "' '" + path("dst") + "' --target-tp 2").status,
            0);
  EXPECT_FALSE(fs::exists(dir_ / ".dst.lock"));
  expectOneLineError(
      keel("ckpt convert '" + path("ck") + "' '" + path("new/a/b") + "' --target-tp 2",
           "prlimit --fsize=4096 "),
      "File too large");
  EXPECT_FALSE(fs::exists(dir_ / "new"));
}

// An unwritable --ckpt-dir is found before the first step (it was found at the first save,
// after every step, and named its step-N.tmp). As root, the run drops to nobody with setpriv.
TEST_F(KeelOutputs, AnUnwritableCheckpointFolderIsRefusedBeforeTheFirstStep) {
  std::string as;
  if (::geteuid() == 0) {
    if (std::system("command -v setpriv >/dev/null 2>&1") != 0) GTEST_SKIP() << "no setpriv";
    as = "setpriv --reuid=65534 --regid=65534 --clear-groups";
  }
  fs::create_directory(dir_ / "ro");
  fs::permissions(dir_ / "ro", fs::perms::owner_read | fs::perms::owner_exec |
                                   fs::perms::group_read | fs::perms::group_exec |
                                   fs::perms::others_read | fs::perms::others_exec);
  const CliResult r = keel(
      "train --config tests/fixtures/gpt-tiny.json --steps 50 --ckpt-dir '" + path("ro/ck") + "'",
      as);
  expectOneLineError(r, "--ckpt-dir " + path("ro/ck") + ": cannot create it in ");
  EXPECT_NE(r.err.find("(Permission denied)"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("step 1/"), std::string::npos) << r.out;  // refused before training
  fs::permissions(dir_ / "ro", fs::perms::owner_all);
}

// An output in a folder that does not exist names the folder (it named the lock file beside it).
TEST_F(KeelOutputs, AnOutputInAMissingFolderNamesTheFolder) {
  expectOneLineError(
      record(path("no/such/r.db")),
      "output " + path("no/such/r.db") + ": the directory " + path("no/such") + " does not exist");
  EXPECT_FALSE(fs::exists(dir_ / "no"));
}

TEST_F(KeelOutputs, NonRegularOutputsAreRefusedUntouched) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  fs::create_directory(dir_ / "sub");
  expectOneLineError(record(path("fifo")), "is a FIFO, not a regular file");
  expectOneLineError(record(path("sub")), "is a directory");
  expectOneLineError(record("/dev/null"), "/dev/null is a character device");
  ASSERT_EQ(record(path("r.db")).status, 0);
  expectOneLineError(keel("export csv '" + path("r.db") + "' -o '" + path("fifo") + "'"),
                     "is a FIFO");
  expectOneLineError(keel("memory trace '" + path("fifo") + "' --generate-moe"), "is a FIFO");
  EXPECT_TRUE(fs::is_fifo(dir_ / "fifo"));
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  expectOnly({"c.json", "fifo", "sub", "r.db"});
}

// A recording replaces only a recording (or an empty file): `keel record -o train.py` replaced
// the user's script with SQLite. Exports still replace their own kind of file.
TEST_F(KeelOutputs, ARecordingReplacesOnlyARecording) {
  {
    std::ofstream notes(path("notes.txt"));
    notes << "my notes\n";
  }
  expectOneLineError(
      record(path("notes.txt")),
      "output " + path("notes.txt") + " exists and is not a recording; refusing to replace it");
  EXPECT_EQ(keel::readFile(path("notes.txt")), "my notes\n");
  std::ofstream(path("empty.db")).close();
  ASSERT_EQ(record(path("empty.db")).status, 0);  // an empty file: nothing to lose
  ASSERT_EQ(record(path("empty.db")).status, 0);  // a recording: replaced
  // Exports replace their own kind of file only: an earlier export, not the notes.
  expectOneLineError(keel("export csv '" + path("empty.db") + "' -o '" + path("notes.txt") + "'"),
                     "-o " + path("notes.txt") + " exists and is not a CSV export");
  EXPECT_EQ(keel::readFile(path("notes.txt")), "my notes\n");
  for (int i = 0; i < 2; ++i)
    ASSERT_EQ(keel("export csv '" + path("empty.db") + "' -o '" + path("out.csv") + "'").status, 0);
}

TEST_F(KeelOutputs, AnExistingRecordingIsKeptUntilTheNewOneIsComplete) {
  ASSERT_EQ(record(path("r.db")).status, 0);
  const std::string before = slurp(dir_ / "r.db");
  // A bad data path is found after the run is set up: the old recording is untouched.
  expectOneLineError(record(path("r.db"), "--data '" + path("nope.txt") + "'"), "nope.txt");
  EXPECT_EQ(slurp(dir_ / "r.db"), before);
  expectOnly({"c.json", "r.db"});
  // A complete run replaces it: 2 steps now, and nothing left beside it.
  CliResult ok =
      keel("record --config '" + path("c.json") + "' --steps 2 -o '" + path("r.db") + "'");
  ASSERT_EQ(ok.status, 0) << ok.err;
  EXPECT_EQ(keel::storage::Recording::open(path("r.db")).steps().size(), 2u);
  expectOnly({"c.json", "r.db"});
  // A run that fails in a step replaces it too: its recording says where it failed.
  CliResult failed = record(path("r.db"), "", "KEEL_TEST_PERTURB=matmul:30:fail");
  EXPECT_EQ(failed.status, 2) << failed.err;
  const auto run = keel::storage::Recording::open(path("r.db")).run();
  EXPECT_EQ(run.status.rfind("failed: ", 0), 0u) << run.status;
  expectOnly({"c.json", "r.db"});
}

// Two keel record processes, one -o: the second is refused in one line while the first writes,
// and the first's recording is whole.
TEST_F(KeelOutputs, ASecondWriterOfTheSameOutputIsRefused) {
  const std::string out = path("r.db"), lock = path(".r.db.lock");
  const std::string cmd = "cd '" + std::string(KEEL_SOURCE_DIR) + "' && KEEL_BLAS_TUNE=0 '" +
                          std::string(KEEL_CLI_PATH) + "' record --config '" + path("c.json") +
                          "' --steps 60 --all -o '" + out + "' >'" + path("cli_a.txt") +
                          "' 2>&1 & echo $! >'" + path("cli_a.pid") + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  bool locked = false;  // the first writer holds the lock once its run has started
  for (int i = 0; i < 600 && !locked; ++i) {
    locked = fs::exists(lock);
    if (!locked) ::usleep(10000);
  }
  ASSERT_TRUE(locked) << slurp(dir_ / "cli_a.txt");
  CliResult second = record(out);
  expectOneLineError(second, "is being written by another process (pid ");
  // Wait for the first to finish; its recording has all 60 steps and the lock is gone.
  const std::string pid = slurp(dir_ / "cli_a.pid");
  for (int i = 0; i < 6000 && ::kill(std::stoi(pid), 0) == 0; ++i) ::usleep(10000);
  EXPECT_EQ(keel::storage::Recording::open(out).steps().size(), 60u) << slurp(dir_ / "cli_a.txt");
  EXPECT_FALSE(fs::exists(lock));
}

// An output that is a symlink writes the file the link names and keeps the link (renaming the
// finished file over the link used to replace the user's link with a regular file): an export, a
// recording that replaces one, a new recording through a dangling link, and `-o /dev/stdout` with
// stdout redirected to a file. `memory trace -` writes the trace to stdout, not to a file "-".
TEST_F(KeelOutputs, ASymlinkOutputWritesTheFileItNames) {
  ASSERT_EQ(record(path("r.db")).status, 0);
  std::ofstream(path("target.csv")) << keel::storage::kOpCsvHeader;  // an earlier export
  fs::create_symlink("target.csv", dir_ / "link.csv");
  CliResult r = keel("export csv '" + path("r.db") + "' -o '" + path("link.csv") + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(dir_ / "link.csv"));
  EXPECT_EQ(slurp(dir_ / "target.csv").rfind("seq,", 0), 0u);
  // A recording replaced through a link, and a new one through a dangling link.
  fs::copy_file(dir_ / "r.db", dir_ / "old.db");
  fs::create_symlink("old.db", dir_ / "link.db");
  fs::create_symlink("new.db", dir_ / "dangling.db");
  for (const char* out : {"link.db", "dangling.db"}) {
    CliResult rec =
        keel("record --config '" + path("c.json") + "' --steps 2 --seed 5 -o '" + path(out) + "'");
    ASSERT_EQ(rec.status, 0) << out << rec.err;
    EXPECT_TRUE(fs::is_symlink(dir_ / out)) << out;
  }
  EXPECT_EQ(keel::storage::Recording::open(path("old.db")).steps().size(), 2u);
  EXPECT_EQ(keel::storage::Recording::open(path("new.db")).steps().size(), 2u);
  // -o /dev/stdout with stdout on a file: the file gets the export.
  const std::string cmd = "cd '" + dir_.string() + "' && KEEL_BLAS_TUNE=0 '" +
                          std::string(KEEL_CLI_PATH) + "' export csv r.db -o /dev/stdout" +
                          " > viastdout.csv 2>cli_stdout_err.txt";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(dir_ / "cli_stdout_err.txt");
  EXPECT_EQ(slurp(dir_ / "viastdout.csv"), slurp(dir_ / "target.csv"));
  // memory trace -: the trace on stdout, its summary on stderr, no file named "-".
  CliResult trace = keel("memory trace --config '" + path("c.json") + "' --steps 1 -");
  ASSERT_EQ(trace.status, 0) << trace.err;
  EXPECT_EQ(trace.out.rfind("# keel allocation trace: a ID BYTES | f ID | s STEP\n", 0), 0u);
  EXPECT_NE(trace.err.find("trace -: "), std::string::npos) << trace.err;
  EXPECT_FALSE(fs::exists(fs::path(KEEL_SOURCE_DIR) / "-"));  // (runKeelCli runs there)
  // ... and memory replay - reads one from stdin (it said "cannot open allocation trace '-'").
  std::ofstream(path("piped.trace")) << trace.out;
  const std::string replay = "cd '" + std::string(KEEL_SOURCE_DIR) + "' && KEEL_BLAS_TUNE=0 '" +
                             std::string(KEEL_CLI_PATH) + "' memory replay - < '" +
                             path("piped.trace") + "' > '" + path("replay.txt") + "' 2>&1";
  ASSERT_EQ(std::system(replay.c_str()), 0) << slurp(dir_ / "replay.txt");
  EXPECT_EQ(slurp(dir_ / "replay.txt").rfind("trace -: ", 0), 0u) << slurp(dir_ / "replay.txt");
  fs::remove(dir_ / "piped.trace");
  fs::remove(dir_ / "replay.txt");
  expectOnly({"c.json", "r.db", "target.csv", "link.csv", "old.db", "link.db", "new.db",
              "dangling.db", "viastdout.csv"});
}

TEST_F(KeelOutputs, ExportsReplaceOnlyWhenCompleteAndReportWriteErrors) {
  ASSERT_EQ(record(path("r.db")).status, 0);
  std::ofstream(path("out.csv")) << keel::storage::kOpCsvHeader;  // an earlier export
  CliResult r = keel("export csv '" + path("r.db") + "' -o '" + path("out.csv") + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(slurp(dir_ / "out.csv").rfind("seq,", 0), 0u);
  // Anything else is not replaced: another recording, a config, notes (export csv -o other.db
  // replaced a recording); nor by an allocation trace. An empty -o is no file name.
  fs::copy_file(dir_ / "r.db", dir_ / "other.db");
  std::ofstream(path("notes.txt")) << "my notes\n";
  const std::string other = slurp(dir_ / "other.db");
  for (const std::string& cmd :
       {"export csv '" + path("r.db") + "' -o '" + path("other.db") + "'",
        "export trace '" + path("r.db") + "' -o '" + path("notes.txt") + "'",
        "export graph '" + path("r.db") + "' -o '" + path("out.csv") + "'",
        "memory trace '" + path("other.db") + "' --config '" + path("c.json") + "' --steps 1"})
    expectOneLineError(keel(cmd), "exists and is not ");
  EXPECT_EQ(slurp(dir_ / "other.db"), other);
  EXPECT_EQ(slurp(dir_ / "notes.txt"), "my notes\n");
  expectOneLineError(keel("export csv '" + path("r.db") + "' -o ''"),
                     "--output: must not be empty");
  // An earlier trace is replaced (its magic is longer than the 16 bytes first read).
  for (int i = 0; i < 2; ++i)
    ASSERT_EQ(
        keel("memory trace '" + path("t.trace") + "' --config '" + path("c.json") + "' --steps 1")
            .status,
        0);
  fs::remove(dir_ / "t.trace");
  expectOneLineError(keel("memory trace '" + path("t.trace") + "' --steps 1"),
                     "--config is required: the model config to train (or --generate-moe)");
  fs::remove(dir_ / "other.db");
  fs::remove(dir_ / "notes.txt");
  expectOnly({"c.json", "r.db", "out.csv"});
  // stdout on a full device: one line, exit 2 (it used to exit 0 with nothing written).
  for (const char* kind : {"csv", "trace"}) {
    CliResult full = keelToFullDevice(std::string("export ") + kind + " '" + path("r.db") + "'");
    EXPECT_EQ(full.status, 2) << kind;
    EXPECT_NE(full.err.find("cannot write to stdout"), std::string::npos) << full.err;
  }
  CliResult inspect = keelToFullDevice("inspect '" + path("r.db") + "'");
  EXPECT_EQ(inspect.status, 2);
  EXPECT_NE(inspect.err.find("cannot write to stdout: No space left on device"), std::string::npos)
      << inspect.err;
}

// A reader that closed the pipe (`keel ops | head -1`, `| grep -q`) is not an error: keel ends
// quietly with the status of a process killed by SIGPIPE. The pipe's read end is closed before
// keel starts, so its first write meets EPIPE every time.
TEST_F(KeelOutputs, AClosedPipeEndsQuietly) {
  ASSERT_EQ(record(path("r.db")).status, 0);
  const std::string rec = path("r.db"), copy = path("copy.db");
  std::filesystem::copy_file(rec, copy);  // diffed with r.db: one file twice is warned about
  // `keel ops` prints through stdio; the exports write their text at once (they said "cannot
  // write to stdout: Broken pipe", exit 2); `keel diff` prints pages through stdio and then more
  // work follows, so the EPIPE of its first write is long gone from errno when keel ends (it
  // said "cannot write to stdout: write error").
  for (std::vector<std::string> args : {std::vector<std::string>{"ops"},
                                        {"export", "csv", rec},
                                        {"export", "trace", rec},
                                        {"export", "graph", rec, "-o", "-"},
                                        {"diff", rec, copy}}) {
    SCOPED_TRACE(args.at(0) + (args.size() > 1 ? " " + args[1] : ""));
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    ::close(fds[0]);
    const std::string err = path("cli_pipe_err.txt");
    std::vector<char*> argv{const_cast<char*>(KEEL_CLI_PATH)};
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      if (std::freopen(err.c_str(), "w", stderr) == nullptr) ::_exit(99);
      ::setenv("KEEL_BLAS_TUNE", "0", 1);
      ::execv(KEEL_CLI_PATH, argv.data());
      ::_exit(98);
    }
    ::close(fds[1]);
    int raw = 0;
    ASSERT_EQ(::waitpid(pid, &raw, 0), pid);
    ASSERT_TRUE(WIFEXITED(raw));
    EXPECT_EQ(WEXITSTATUS(raw), 128 + SIGPIPE);
    EXPECT_EQ(slurp(err), "");
  }
}

// Ctrl-C of a keel record that replaces an existing recording: the run stops after the op it is
// in (or between two steps, where it lands there), the new recording (status "stopped: interrupted
// (SIGINT)", every step so far) takes the old one's place, and no hidden replacement file or lock
// is left; exit 130 as for SIGINT.
TEST_F(KeelOutputs, AnInterruptedRecordingIsFinishedAndPutInPlace) {
  ASSERT_EQ(record(path("r.db")).status, 0);
  const std::string out = path("cli_int_out.txt"), err = path("cli_int_err.txt");
  const std::string cmd = "cd '" + std::string(KEEL_SOURCE_DIR) + "' && (KEEL_BLAS_TUNE=0 '" +
                          std::string(KEEL_CLI_PATH) + "' record --config '" + path("c.json") +
                          "' --steps 1000000 --md5 -o '" + path("r.db") + "' >'" + out + "' 2>'" +
                          err + "' & pid=$!; for i in $(seq 600); do grep -q '^step 2/' '" + out +
                          "' 2>/dev/null && break; sleep 0.1; done; kill -INT $pid; wait $pid; "
                          "exit $?)";
  const std::string script = path("cli_int.sh");
  std::ofstream(script) << cmd << "\n";
  const int raw = std::system(("bash '" + script + "'").c_str());
  fs::remove(script);
  ASSERT_TRUE(WIFEXITED(raw));
  EXPECT_EQ(WEXITSTATUS(raw), 130) << slurp(out) << slurp(err);
  // "stopped at op #N (step K): ..." or, where the signal lands between two steps, "stopped
  // after step K: ...".
  const std::string said = slurp(out);
  EXPECT_TRUE(said.find("keel record: stopped at op #") != std::string::npos ||
              said.find("keel record: stopped after step ") != std::string::npos)
      << said;
  EXPECT_NE(said.find(": interrupted (SIGINT)\n"), std::string::npos) << said;
  keel::storage::Recording rec = keel::storage::Recording::open(path("r.db"));
  EXPECT_EQ(rec.run().status, "stopped: interrupted (SIGINT)");
  EXPECT_GE(rec.steps().size(), 2u);
  expectOnly({"c.json", "r.db"});
}

// A file-size limit (SIGXFSZ ignored, EFBIG reported): keel record stops in one line keeping every
// committed step; an export over the limit is one line and leaves no partial file.
TEST_F(KeelOutputs, AFileSizeLimitIsAWriteErrorNotASignal) {
  const std::string limited = "prlimit --fsize=2097152 ";
  const CliResult r = keel("record --config '" + path("c.json") +
                               "' --steps 300 --md5 --alloc caching -o '" + path("r.db") + "'",
                           limited);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("the disk is full or a size limit was reached"), std::string::npos) << r.err;
  keel::storage::Recording rec = keel::storage::Recording::open(path("r.db"));
  EXPECT_GE(rec.steps().size(), 1u);
  EXPECT_EQ(rec.run().status.rfind("failed: ", 0), 0u) << rec.run().status;
  const CliResult e = keel("export csv --tensors '" + path("r.db") + "' -o '" + path("t.csv") + "'",
                           "prlimit --fsize=4096 ");
  expectOneLineError(e, "t.csv");
  EXPECT_FALSE(fs::exists(dir_ / "t.csv"));
}

// Readers while a recording is written, as separate processes: every keel inspect and keel ops
// of the growing file succeeds (WAL readers see the committed steps, never a half-written row).
TEST_F(KeelOutputs, ReadersOfARecordingBeingWrittenSeeCommittedSteps) {
  const std::string out = path("cli_live_out.txt"), err = path("cli_live_err.txt");
  const std::string k = "KEEL_BLAS_TUNE=0 '" + std::string(KEEL_CLI_PATH) + "'";
  const std::string script = path("cli_live.sh");
  std::ofstream(script) << "cd '" << KEEL_SOURCE_DIR << "'\n"
                        << k << " record --config '" << path("c.json") << "' --steps 60 --md5 -o '"
                        << path("r.db") << "' >/dev/null 2>&1 &\n"
                        << "pid=$!; n=0; bad=0\n"
                        << "while kill -0 $pid 2>/dev/null; do\n"
                        << "  if [ -e '" << path("r.db") << "' ]; then\n"
                        << "    " << k << " inspect '" << path("r.db") << "' >/dev/null 2>>'" << err
                        << "' || bad=$((bad+1))\n"
                        << "    " << k << " ops '" << path("r.db") << "' --limit 5 >/dev/null 2>>'"
                        << err << "' || bad=$((bad+1))\n"
                        << "    n=$((n+1))\n"
                        << "  fi\n"
                        << "done\n"
                        << "wait $pid; echo \"$? $n $bad\" >'" << out << "'\n";
  ASSERT_EQ(std::system(("bash '" + script + "'").c_str()), 0);
  std::istringstream result(slurp(out));
  int recordStatus = -1, reads = 0, failures = -1;
  result >> recordStatus >> reads >> failures;
  EXPECT_EQ(recordStatus, 0);
  EXPECT_GE(reads, 1);
  EXPECT_EQ(failures, 0) << slurp(err);
}

}  // namespace
