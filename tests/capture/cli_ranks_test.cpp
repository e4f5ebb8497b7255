// Multi-rank runs through the real keel binary under mpirun (2 and 4 processes, oversubscribed):
// data- and tensor-parallel training gives the single-process losses, a recorded run is a run
// folder that inspect, ops, diff and the replica check read, an injected desync is found at its
// op, a rank that skips a collective is named by the hang report and the descriptor check, and
// bad layouts are one line and exit 2 on every rank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>

#include <sqlite3.h>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "keel/base/text.h"
#include "keel/storage/reader.h"
#include "keel/storage/run_folder.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using keel::test::CliResult;

constexpr const char* kTiny = "tests/fixtures/gpt-tiny.json";
// mpirun as root on a small machine; under the sanitizers without Open MPI's memory hooks and
// leak checks (see KEEL_MPIRUN_ENV in tests/CMakeLists.txt).
constexpr const char* kMpiEnv =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
    "OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "
    "OMPI_MCA_memory=^patcher ASAN_OPTIONS=detect_leaks=0";

// The losses "step N/M  loss X" that keel train prints (defined below).
std::vector<double> losses(const std::string& out);
// The gradient norms "step N/M ... gnorm X" that keel train prints.
std::vector<double> gradNorms(const std::string& out);

class KeelRanks : public keel::test::KeelCliTest {
 protected:
  // kMpiEnv with Open MPI's session directory under the test's own folder: mpiruns that start at
  // the same moment (ctest runs tests side by side) raced to create /tmp/ompi.<host>.<uid> and
  // one failed "File exists".
  std::string mpiEnv() const {
    return std::string(kMpiEnv) + " OMPI_MCA_orte_tmpdir_base='" + dir_.string() + "'";
  }
  // keel with `args` in `np` processes under mpirun (bounded: a hang fails the test, not CI).
  // env: VAR=value words passed to every rank.
  CliResult mpi(int np, const std::string& args, const std::string& env = "") {
    std::string exports;
    std::istringstream words(env);
    for (std::string w; words >> w;) exports += " -x " + w.substr(0, w.find('='));
    return keel::test::runKeelCli(args, dir_.string(),
                                  mpiEnv() + " " + env + " timeout 120 mpirun -np " +
                                      std::to_string(np) + " -x KEEL_BLAS_TUNE" + exports);
  }
  // A copy of the config `base` (a path in the source tree) with `from` replaced by `to`, as
  // `name` in the test's directory.
  std::string variantConfig(const std::string& base, const std::string& name,
                            const std::string& from, const std::string& to) {
    std::string cfg = keel::readFile(std::string(KEEL_SOURCE_DIR) + "/" + base);
    cfg.replace(cfg.find(from), from.size(), to);
    std::ofstream(path(name)) << cfg;
    return path(name);
  }
  // `train` resumed from checkpoint `ckpt` (saved at step 2) on each (ranks, layout): its steps
  // 3 and 4 follow `want`, the uninterrupted run's four losses, within 2e-4.
  void expectResumedCurve(const std::string& train, const std::string& ckpt,
                          const std::vector<std::pair<int, std::string>>& layouts,
                          const std::vector<double>& want) {
    for (const auto& [np, layout] : layouts) {
      const std::string args = train + " " + layout + " --resume '" + path(ckpt) + "'";
      const CliResult r = np == 1 ? keel(args) : mpi(np, args);
      ASSERT_EQ(r.status, 0) << layout << "\n" << r.err;
      const std::vector<double> got = losses(r.out);
      ASSERT_EQ(got.size(), 2u) << r.out;
      for (size_t i = 0; i < 2; ++i)
        EXPECT_NEAR(got[i], want[i + 2], 2e-4) << layout << " step " << i + 3;
    }
  }
  // The recorded run folder `name`: dp x tp ranks, `steps` steps with MD5s.
  CliResult record(const std::string& name, int dp, int tp, int steps, const std::string& env = "",
                   const std::string& extra = "") {
    return mpi(dp * tp,
               "record --config " + std::string(kTiny) + " --steps " + std::to_string(steps) +
                   " --dp " + std::to_string(dp) + " --tp " + std::to_string(tp) + " --md5 -o '" +
                   path(name) + "' " + extra,
               env);
  }
};

// The losses "step N/M  loss X" that keel train prints.
std::vector<double> gradNorms(const std::string& out) {
  std::vector<double> v;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);) {
    const size_t at = l.find("  gnorm ");
    if (l.rfind("step ", 0) == 0 && at != std::string::npos)
      v.push_back(std::stod(l.substr(at + 8)));
  }
  return v;
}

std::vector<double> losses(const std::string& out) {
  std::vector<double> v;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);) {
    const size_t at = l.find("  loss ");
    if (l.rfind("step ", 0) == 0 && l.find('/') < at && at != std::string::npos)
      v.push_back(std::stod(l.substr(at + 7)));
  }
  return v;
}

// Every "keel: error:" line of a multi-rank failure is `fragment`'s; at least one was printed
// (mpirun may end the other ranks before they print theirs).
void expectErrorOnRanks(const CliResult& r, const std::string& fragment) {
  EXPECT_EQ(r.status, 2) << r.out << r.err;
  int lines = 0;
  std::istringstream in(r.err);
  for (std::string l; std::getline(in, l);) {
    if (l.rfind("keel: error: ", 0) != 0) continue;
    ++lines;
    EXPECT_NE(l.find(fragment), std::string::npos) << l;
  }
  EXPECT_GE(lines, 1) << r.err;
}

TEST_F(KeelRanks, DataAndTensorParallelTrainingGiveTheSingleProcessLosses) {
  const std::string train = "train --config " + std::string(kTiny) + " --steps 4";
  const CliResult one = keel(train);
  ASSERT_EQ(one.status, 0) << one.err;
  const std::vector<double> want = losses(one.out);
  ASSERT_EQ(want.size(), 4u) << one.out;
  struct Layout {
    int np;
    std::string args;
  };
  // keel launch runs mpirun itself (as root, oversubscribed).
  const CliResult launched =
      keel::test::runKeelCli("launch -n 2 " + train + " --dp 2", dir_.string(), mpiEnv());
  for (const auto& [np, args] :
       std::vector<Layout>{{2, "--dp 2"}, {2, "--tp 2"}, {4, "--dp 2 --tp 2"}}) {
    const CliResult r = mpi(np, train + " " + args);
    ASSERT_EQ(r.status, 0) << args << "\n" << r.err;
    const std::vector<double> got = losses(r.out);
    ASSERT_EQ(got.size(), want.size()) << args << "\n"
                                       << r.out;  // rank 0 prints; the rest are quiet
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 2e-4) << args << ", step " << i + 1;
  }
  ASSERT_EQ(launched.status, 0) << launched.err;
  const std::vector<double> got = losses(launched.out);
  ASSERT_EQ(got.size(), want.size()) << launched.out;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 2e-4);
}

TEST_F(KeelRanks, ARecordedRunIsAFolderThatEveryCommandReads) {
  ASSERT_EQ(record("run", 2, 2, 2).status, 0);
  const keel::storage::RunManifest m = keel::storage::readManifest(path("run"));
  EXPECT_EQ(m.worldSize, 4);
  EXPECT_EQ(m.dp, 2);
  EXPECT_EQ(m.tp, 2);
  for (int64_t r = 0; r < 4; ++r) {
    keel::storage::Recording rec =
        keel::storage::Recording::open(path("run/rank-") + std::to_string(r) + ".db");
    EXPECT_EQ(rec.run().rank, r);
    EXPECT_EQ(rec.run().worldSize, 4);
    EXPECT_EQ(rec.run().layout, "dp 2 x tp 2");
    EXPECT_EQ(rec.run().status, "finished");
    EXPECT_EQ(rec.steps().size(), 2u);
  }
  const CliResult inspect = keel("inspect '" + path("run") + "'");
  ASSERT_EQ(inspect.status, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("4 ranks: dp 2 x tp 2, model gpt-tiny"), std::string::npos)
      << inspect.out;
  EXPECT_NE(inspect.out.find("dp     2 groups of 2 ranks, 6 collectives each"), std::string::npos)
      << inspect.out;  // per step: one gradient bucket and two loss means
  EXPECT_NE(inspect.out.find("tp     2 groups of 2 ranks"), std::string::npos) << inspect.out;
  EXPECT_EQ(inspect.out.find("hang"), std::string::npos) << inspect.out;
  // Two groups of a name: each line of the longest waits says which ("of dp" twice did not).
  EXPECT_TRUE(inspect.out.find(" of dp (ranks 0, 2) (step ") != std::string::npos ||
              inspect.out.find(" of dp (ranks 1, 3) (step ") != std::string::npos ||
              inspect.out.find(" of tp (ranks 0, 1) (step ") != std::string::npos ||
              inspect.out.find(" of tp (ranks 2, 3) (step ") != std::string::npos)
      << inspect.out;
  const CliResult rank3 = keel("inspect '" + path("run") + "' --rank 3");
  ASSERT_EQ(rank3.status, 0) << rank3.err;
  EXPECT_NE(rank3.out.find("rank-3.db"), std::string::npos);

  const CliResult ops = keel("ops '" + path("run") + "' --rank 1 --name all_reduce --step 1");
  ASSERT_EQ(ops.status, 0) << ops.err;
  EXPECT_NE(ops.out.find("dp_grad_sync"), std::string::npos) << ops.out;
  EXPECT_NE(ops.out.find("dp_loss"), std::string::npos) << ops.out;
  keel::test::expectOneLineError(keel("ops '" + path("run") + "'"),
                                 "is a run folder of 4 ranks: choose one with --rank 0..3");
  keel::test::expectOneLineError(keel("ops '" + path("run") + "' --rank 4"),
                                 "has ranks 0..3, not 4");
  keel::test::expectOneLineError(keel("ops '" + path("run/rank-0.db") + "' --rank 0"),
                                 "--rank needs a run folder");
  // keel export takes the folder with --rank too (it said "arguments were not expected"), and
  // each rank's trace is a process of its own, named: two ranks' traces load side by side in
  // Perfetto (every event had pid 1).
  std::map<int64_t, std::string> processes;
  for (int rank : {1, 3}) {
    const std::string out = path("rank" + std::to_string(rank) + ".json");
    const CliResult tr = keel("export trace '" + path("run") + "' --rank " + std::to_string(rank) +
                              " -o '" + out + "'");
    ASSERT_EQ(tr.status, 0) << tr.err;
    const nlohmann::json trace = nlohmann::json::parse(keel::readFile(out));
    std::set<int64_t> pids;
    for (const auto& e : trace["traceEvents"]) {
      pids.insert(e["pid"].get<int64_t>());
      if (e["name"] == "process_name") processes[e["pid"]] = e["args"]["name"];
    }
    EXPECT_EQ(pids, std::set<int64_t>{rank + 1});
  }
  EXPECT_EQ(processes, (std::map<int64_t, std::string>{{2, "keel rank-1.db (rank 1 of 4)"},
                                                       {4, "keel rank-3.db (rank 3 of 4)"}}));
  const CliResult csv = keel("export csv '" + path("run") + "' --rank 2");
  ASSERT_EQ(csv.status, 0) << csv.err;
  EXPECT_NE(csv.out.find("dp_grad_sync"), std::string::npos);
  keel::test::expectOneLineError(keel("export graph '" + path("run") + "'"),
                                 "is a run folder of 4 ranks: choose one with --rank 0..3");

  const CliResult replicas = keel("diff '" + path("run") + "' --replicas");
  EXPECT_EQ(replicas.status, 0) << replicas.out << replicas.err;
  EXPECT_NE(replicas.out.find("replicas identical"), std::string::npos) << replicas.out;

  // The same run twice, rank by rank: equal.
  ASSERT_EQ(record("again", 2, 2, 2).status, 0);
  const CliResult same = keel("diff '" + path("run") + "' '" + path("again") + "'");
  EXPECT_EQ(same.status, 0) << same.out << same.err;
  for (int r = 0; r < 4; ++r)
    EXPECT_NE(same.out.find("rank " + std::to_string(r) + ": equal within tolerance"),
              std::string::npos)
        << same.out;
  // A run folder against one recording is compared by parameter name, which needs statistics.
  keel::test::expectOneLineError(keel("diff '" + path("run") + "' '" + path("run/rank-0.db") + "'"),
                                 "has no tensor statistics; record with --stats or --all");
  // One rank's file against one process: DIVERGED for the layout alone, and the diff says so.
  ASSERT_EQ(
      keel("record --config " + std::string(kTiny) + " --steps 1 --md5 -o '" + path("one.db") + "'")
          .status,
      0);
  const CliResult rankVsOne = keel("diff '" + path("run/rank-3.db") + "' '" + path("one.db") + "'");
  EXPECT_NE(rankVsOne.out.find("note: A is rank 3 of a 4-rank run (dp 2 x tp 2), the other one "
                               "process: its ops see its own share of the batch or weights"),
            std::string::npos)
      << rankVsOne.out;
  EXPECT_NE(rankVsOne.out.find("compare the run folder instead (keel diff " + path("run") + " " +
                               path("one.db") + ": by parameter)"),
            std::string::npos)
      << rankVsOne.out;
}

// A run into an existing folder whose setup fails leaves the folder as it was: it rewrote the
// manifest first, and the old dp 2 recordings then read as tp 2 (the replica check passed with
// "nothing to compare"). A manifest that disagrees with the recordings' own layout is refused,
// and one whose dp x tp wraps 64 bits is damaged, not a crash.
TEST_F(KeelRanks, AFailedRunLeavesTheFolderAsItWasAndAForeignManifestIsRefused) {
  ASSERT_EQ(record("run", 2, 1, 1).status, 0);
  const std::string manifest = path("run/manifest.json");
  const std::string before = keel::readFile(manifest);
  const CliResult failed = mpi(2, "record --config " + std::string(kTiny) +
                                      " --steps 1 --dp 1 --tp 2 --md5 --data /nonexistent/corpus "
                                      "-o '" +
                                      path("run") + "'");
  expectErrorOnRanks(failed, "/nonexistent/corpus");
  EXPECT_EQ(keel::readFile(manifest), before);
  // A new folder whose setup fails still has its manifest: the folder can be inspected.
  expectErrorOnRanks(
      mpi(2, "record --config " + std::string(kTiny) +
                 " --steps 1 --dp 2 --data /nonexistent/corpus -o '" + path("fresh") + "'"),
      "/nonexistent/corpus");
  EXPECT_EQ(keel::storage::readManifest(path("fresh")).dp, 2);
  const CliResult inspect = keel("inspect '" + path("run") + "'");
  ASSERT_EQ(inspect.status, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("2 ranks: dp 2 x tp 1"), std::string::npos) << inspect.out;

  keel::storage::writeManifest(path("run"), keel::storage::makeManifest(1, 2));
  const std::string foreign =
      "rank-0.db was recorded as dp 2 x tp 1, the manifest says dp 1 x tp 2";
  keel::test::expectOneLineError(keel("inspect '" + path("run") + "'"), foreign);
  keel::test::expectOneLineError(keel("diff '" + path("run") + "' --replicas"), foreign);
  keel::test::expectOneLineError(keel("ops '" + path("run") + "' --rank 1"),
                                 "rank-1.db was recorded as dp 2 x tp 1, the manifest says");

  std::ofstream(manifest) << R"({"world_size": 4, "dp": 4611686018427387905, "tp": 4, "ranks": [
      {"rank": 0, "dp_rank": 0, "tp_rank": 0, "file": "rank-0.db"},
      {"rank": 1, "dp_rank": 0, "tp_rank": 1, "file": "rank-1.db"},
      {"rank": 2, "dp_rank": 0, "tp_rank": 2, "file": "rank-0.db"},
      {"rank": 3, "dp_rank": 0, "tp_rank": 3, "file": "rank-1.db"}]})";
  const std::string wraps =
      "damaged manifest.json: world size 4 is not dp 4611686018427387905 x tp 4";
  keel::test::expectOneLineError(keel("diff '" + path("run") + "' --replicas"), wraps);
  keel::test::expectOneLineError(keel("inspect '" + path("run") + "'"), wraps);
}

// A rank killed mid-run (kill -9, an OOM kill) left both recordings saying "running", and inspect
// had nothing to say: a recording whose status says running while no process holds its output
// lock ended without closing, and the folder's summary says which ranks ended so. While the run
// is alive, its recordings read as running.
TEST_F(KeelRanks, ARankKilledMidRunIsNamedAsEndedWithoutAStatus) {
  const std::string run = path("killed"), done = path("killed.done");
  const std::string cmd = "cd '" + std::string(KEEL_SOURCE_DIR) + "' && (" + mpiEnv() +
                          " KEEL_BLAS_TUNE=0 timeout 120 mpirun -np 2 '" + KEEL_CLI_PATH +
                          "' record --config " + kTiny + " --steps 100000 --dp 2 -o '" + run +
                          "' >/dev/null 2>&1; touch '" + done + "') &";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  // Both ranks have committed a step (bounded: 60 s).
  auto stepsOf = [&](int r) -> size_t {
    try {
      return keel::storage::Recording::open(run + "/rank-" + std::to_string(r) + ".db")
          .steps()
          .size();
    } catch (const std::exception&) {
      return 0;
    }
  };
  for (int i = 0; i < 600 && (stepsOf(0) < 2 || stepsOf(1) < 2); ++i) usleep(100000);
  ASSERT_GE(stepsOf(1), 2u);
  const CliResult alive = keel("inspect '" + run + "/rank-1.db'");
  ASSERT_EQ(alive.status, 0) << alive.err;
  EXPECT_NE(alive.out.find("; status running\n"), std::string::npos) << alive.out;
  // Rank 1's pid is in its output lock; mpirun then ends rank 0.
  const pid_t pid = pid_t(std::atoll(keel::readFile(run + "/.rank-1.db.lock").c_str()));
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  for (int i = 0; i < 600 && !fs::exists(done); ++i) usleep(100000);
  ASSERT_TRUE(fs::exists(done));
  const CliResult one = keel("inspect '" + run + "/rank-1.db'");
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_NE(one.out.find("; status running, but no process is writing it: the run was killed or "
                         "crashed (its committed steps are below)"),
            std::string::npos)
      << one.out;
  const CliResult folder = keel("inspect '" + run + "'");
  ASSERT_EQ(folder.status, 0) << folder.err;
  // Rank 0, ended by mpirun, may have stopped in time to close its recording (SIGTERM between
  // ops) or not (SIGKILL in a collective): rank 1 is named either way.
  EXPECT_TRUE(folder.out.find("\nended without a status\n  ranks 0, 1: the recordings end "
                              "without a status, so no process closed them") != std::string::npos ||
              folder.out.find("\nended without a status\n  rank 1: the recording ends without a "
                              "status, so no process closed it") != std::string::npos)
      << folder.out;
  std::istringstream rows(folder.out);
  bool row = false;
  for (std::string l; std::getline(rows, l);)
    row = row || (l.rfind("  1     1   0   rank-1.db", 0) == 0 &&
                  l.find("ended without a status (killed or crashed)") != std::string::npos);
  EXPECT_TRUE(row) << folder.out;
}

// A replica whose averaged gradient is changed (KEEL_TEST_PERTURB on rank 1's fourth all_reduce:
// step 2's gradient bucket; steps hold one bucket and two loss means) drifts from its twin; the
// replica check names that op, and a rank-by-rank diff against a clean run finds rank 1 there.
TEST_F(KeelRanks, TheReplicaCheckFindsAnInjectedDesyncAtItsOp) {
  ASSERT_EQ(
      record("bad", 2, 1, 3, "KEEL_TEST_PERTURB=all_reduce:4 KEEL_TEST_PERTURB_RANK=1").status, 0);
  const CliResult r = keel("diff '" + path("bad") + "' --replicas");
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("replicas differ: step 2, op all_reduce (backward, scope dp_grad_sync), "
                       "tp rank 0: rank 0 op #"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("output 0 differs"), std::string::npos) << r.out;
  const CliResult j = keel("diff '" + path("bad") + "' --replicas --json");
  EXPECT_EQ(j.status, 1);
  EXPECT_NE(j.out.find("\"rank_b\": 1"), std::string::npos) << j.out;
  EXPECT_NE(j.out.find("\"step\": 2"), std::string::npos) << j.out;

  ASSERT_EQ(record("good", 2, 1, 3).status, 0);
  const CliResult d = keel("diff '" + path("good") + "' '" + path("bad") + "'");
  EXPECT_EQ(d.status, 1) << d.out << d.err;
  EXPECT_NE(d.out.find("rank 1 (the first to diverge)"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("rank 1: diverged: first at step 2"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("all_reduce (dp_grad_sync)"), std::string::npos) << d.out;
}

// Rank 1 skips the run's last all_reduce (step 3's second loss mean): rank 0 waits there until
// the timeout, its watchdog writes the report into its recording and ends the job; the recordings
// then say which rank never joined which collective.
TEST_F(KeelRanks, AHangIsReportedNamingTheRankThatNeverJoined) {
  const CliResult r =
      record("hang", 2, 1, 3, "KEEL_TEST_PERTURB=all_reduce:9:skip KEEL_TEST_PERTURB_RANK=1",
             "--collective-timeout 6");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("keel: error: rank 0 (dp rank 0, tp rank 0) waited 6 s in all_reduce #9 "
                       "of group dp (2 ranks), called by op all_reduce in dp_loss"),
            std::string::npos)
      << r.err;
  // One line on the terminal for the hung rank: the ring of its last collectives (up to 64 lines,
  // each with an "(op N)" suffix, and the report's first line again) goes to the recording only.
  EXPECT_EQ(r.err.find("[keel error]"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("keel: error: "), r.err.rfind("keel: error: ")) << r.err;
  keel::storage::Recording rank0 = keel::storage::Recording::open(path("hang/rank-0.db"));
  EXPECT_EQ(rank0.run().status.rfind("failed: hang: rank 0", 0), 0u) << rank0.run().status;
  keel::storage::LogQuery errors;
  errors.maxLevel = keel::LogLevel::Error;
  size_t ring = 0;
  for (const keel::storage::LogRecord& l : rank0.logs(errors))
    ring += l.scope == "collectives" && l.message.find("still waiting") != std::string::npos;
  EXPECT_EQ(ring, 1u);
  const CliResult inspect = keel("inspect '" + path("hang") + "'");
  ASSERT_EQ(inspect.status, 0) << inspect.err;
  // The rank that never came is named first: the waiting rank's report is the symptom.
  EXPECT_NE(inspect.out.find("\nhang\n  rank 1 never joined all_reduce #9 of group dp, where rank "
                             "0 waited (its last dp collective is all_reduce #8 in step 3, scope "
                             "dp_loss; its run finished)"),
            std::string::npos)
      << inspect.out;
  // The collective it hung in is lined up too (from the report: it ended as no op).
  EXPECT_NE(inspect.out.find("all_reduce #9 of dp (step 3, dp_loss): rank 0 6.00 s, still "
                             "waiting, rank 1 never; last: -"),
            std::string::npos)
      << inspect.out;

  // Rank by rank against a clean run: the hung rank's line says its run did not finish, and the
  // rank that skipped the collective has it only in A — not "equal within tolerance", exit 0.
  ASSERT_EQ(record("clean", 2, 1, 3).status, 0);
  const CliResult d = keel("diff '" + path("clean") + "' '" + path("hang") + "'");
  EXPECT_EQ(d.status, 1) << d.out << d.err;
  EXPECT_NE(d.out.find("  rank 0: equal within tolerance; A has 3 steps, B 2"), std::string::npos)
      << d.out;
  EXPECT_NE(d.out.find("; B's run did not finish (failed: hang: rank 0 (dp rank 0, tp rank 0) "
                       "waited 6 s"),
            std::string::npos)
      << d.out;
  EXPECT_NE(d.out.find("  rank 1: collectives differ: 1 collective only in A, the first at step "
                       "3, op #"),
            std::string::npos)
      << d.out;
  const CliResult j = keel("diff '" + path("clean") + "' '" + path("hang") + "' --json");
  EXPECT_EQ(j.status, 1) << j.err;
  const nlohmann::json doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc.at("verdict"), "diverged");
  EXPECT_EQ(doc.at("exit_code"), 1);
  ASSERT_EQ(doc.at("ranks").size(), 2u);
  EXPECT_EQ(doc["ranks"][0].at("verdict"), "equal");
  EXPECT_EQ(doc["ranks"][1].at("verdict"), "diverged");
  EXPECT_EQ(doc["ranks"][1].at("collectives_only_in_a"), 1);
  EXPECT_EQ(doc["ranks"][0].at("report").at("verdict"), "equal");

  // Rank 1 killed instead (its recording left "running", no process holding it): the hang line
  // says its recording ended without a status (it said "its run running", as if alive), and the
  // hang report — the symptom — is not the error to read first: rank 1 stopped first.
  fs::copy(path("hang"), path("killed"));
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path("killed/rank-1.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE run SET status = 'running'", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  const CliResult killed = keel("inspect '" + path("killed") + "'");
  ASSERT_EQ(killed.status, 0) << killed.err;
  EXPECT_NE(killed.out.find("\nhang\n  rank 1 never joined all_reduce #9 of group dp, where rank 0 "
                            "waited (its last dp collective is all_reduce #8 in step 3, scope "
                            "dp_loss; its recording ended without a status (killed, or frozen "
                            "until the job ended))"),
            std::string::npos)
      << killed.out;
  EXPECT_NE(killed.out.find("\n  rank 1 stopped first: its recording holds 8 collectives"),
            std::string::npos)
      << killed.out;
  EXPECT_EQ(killed.out.find("failed with an error"), std::string::npos) << killed.out;
  // Rank 0's time waited counts the hang (it said a few ms beside "waited 6 s"), and rank 0 is
  // no one's straggler at a collective rank 1 never reached.
  const size_t row0 = inspect.out.find("\n  0     0   0   rank-0.db");
  ASSERT_NE(row0, std::string::npos) << inspect.out;
  const std::string line0 = inspect.out.substr(row0 + 1, inspect.out.find('\n', row0 + 1) - row0);
  // The 6 s hang plus the few ms of the run's other waits (more under a sanitizer): between 6
  // and 8 s, printed in seconds.
  const size_t unit = line0.find(" s ");
  ASSERT_NE(unit, std::string::npos) << line0;
  const size_t start = line0.rfind(' ', unit - 1) + 1;
  const double waited = std::stod(line0.substr(start, unit - start));
  EXPECT_GE(waited, 6.0) << line0;
  EXPECT_LT(waited, 8.0) << line0;
}

// Note [A failed collective ends the job]: rank 1 skips a loss all_reduce, so rank 0's third
// all_reduce receives step 2's gradient bucket: MPI_ERR_TRUNCATE on rank 0. Rank 0 leaves
// without waiting in MPI_Finalize and the launcher ends rank 1 (the job hung, rank 1 spinning
// in its collective until the 120 s bound), and the run folder names rank 0's error as the
// place to look (it said rank 1, the shortest recording, 'stopped first').
TEST_F(KeelRanks, AFailedCollectiveEndsTheJobAndItsErrorIsNamed) {
  const CliResult r =
      record("trunc", 2, 1, 2, "KEEL_TEST_PERTURB=all_reduce:3:skip KEEL_TEST_PERTURB_RANK=1");
  EXPECT_EQ(r.status, 2) << r.err;  // 124: the 120 s bound ended a hung job
  EXPECT_NE(r.err.find("all_reduce #3 of group dp (2 ranks) failed: MPI_ERR_TRUNCATE"),
            std::string::npos)
      << r.err;
  const CliResult inspect = keel("inspect '" + path("trunc") + "'");
  ASSERT_EQ(inspect.status, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("  rank 0 failed with an error (workload 'gpt' failed in step 1: "
                             "all_reduce #3 of group dp (2 ranks) failed: MPI_ERR_TRUNCATE"),
            std::string::npos)
      << inspect.out;
  EXPECT_NE(inspect.out.find("read its error first"), std::string::npos) << inspect.out;
  EXPECT_EQ(inspect.out.find("stopped first"), std::string::npos) << inspect.out;
}

// Note [A failed rank ends the job]: a rank that fails with an ordinary error (an op that threw)
// or stops at a --break-on condition left its peers waiting in their next collective for the
// whole --collective-timeout (600 s by default) while it sat in MPI_Finalize: the job ended with
// the waiting rank's hang report, exit 2 after a breakpoint, and the stopped rank's "stopped at"
// line never reached the terminal. Now the job ends within seconds, with the rank's own words.
TEST_F(KeelRanks, ARankThatFailsOrStopsEndsTheJobAtOnce) {
  auto timed = [&](const std::string& name, const std::string& env, const std::string& extra) {
    const auto t0 = std::chrono::steady_clock::now();
    const CliResult r = record(name, 2, 1, 3, env, "--collective-timeout 60 " + extra);
    return std::pair{r,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
  };
  const auto [failed, failedSeconds] =
      timed("failed", "KEEL_TEST_PERTURB=matmul:20:fail KEEL_TEST_PERTURB_RANK=1", "");
  EXPECT_EQ(failed.status, 2) << failed.err;
  EXPECT_LT(failedSeconds, 30) << failed.err;  // not the 60 s timeout
  EXPECT_NE(failed.err.find("keel: error: rank 1: workload 'gpt' failed in step 1: op 'matmul': "
                            "injected failure"),
            std::string::npos)
      << failed.err;
  EXPECT_EQ(failed.err.find("waited"), std::string::npos) << failed.err;  // no hang report
  EXPECT_EQ(
      keel::storage::Recording::open(path("failed/rank-1.db")).run().status.rfind("failed: ", 0),
      0u);
  const CliResult inspect = keel("inspect '" + path("failed") + "'");
  ASSERT_EQ(inspect.status, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("  rank 1 failed with an error (workload 'gpt' failed in step 1"),
            std::string::npos)
      << inspect.out;

  const auto [stopped, stoppedSeconds] = timed(
      "stopped", "KEEL_TEST_PERTURB=matmul:20:nan KEEL_TEST_PERTURB_RANK=1", "--break-on nan");
  EXPECT_EQ(stopped.status, 1) << stopped.out << stopped.err;
  EXPECT_LT(stoppedSeconds, 30) << stopped.err;
  EXPECT_NE(stopped.out.find("keel record: rank 1 stopped at op #"), std::string::npos)
      << stopped.out;
  EXPECT_NE(stopped.out.find("breakpoint: first NaN/Inf (output 0 of matmul"), std::string::npos)
      << stopped.out;
  const CliResult why = keel("inspect '" + path("stopped") + "'");
  ASSERT_EQ(why.status, 0) << why.err;
  EXPECT_NE(why.out.find("  rank 1 stopped (breakpoint: first NaN/Inf"), std::string::npos)
      << why.out;

  // Every rank stopping at one step leaves together, its recording finished: exit 1, both lines.
  const CliResult both = record("both", 2, 1, 3, "", "--break-on step:2");
  EXPECT_EQ(both.status, 1) << both.err;
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(both.out.find("keel record: rank " + std::to_string(r) + " stopped at op #"),
              std::string::npos)
        << both.out;
    EXPECT_EQ(
        keel::storage::Recording::open(path("both/rank-") + std::to_string(r) + ".db").run().status,
        "stopped: breakpoint: step 2");
  }
}

// A re-record into an existing run folder rewrote manifest.json at setup; killed mid-run, the
// folder held the new manifest beside the old rank files (its own still hidden replacements)
// and no tool opened it ("rank-0.db was recorded as dp 2 x tp 1, the manifest says dp 1 x tp 2").
// The manifest is replaced with rank 0's file now: a killed re-record leaves the folder as it was.
TEST_F(KeelRanks, AKilledReRecordLeavesTheOldFolderAsItWas) {
  ASSERT_EQ(record("run", 2, 1, 1).status, 0);
  const std::string run = path("run"), done = path("rerun.done");
  std::map<std::string, std::string> before;
  for (const char* f : {"manifest.json", "rank-0.db", "rank-1.db"})
    before[f] = keel::readFile(run + "/" + f);
  const std::string cmd = "cd '" + std::string(KEEL_SOURCE_DIR) + "' && (" + mpiEnv() +
                          " KEEL_BLAS_TUNE=0 timeout 120 mpirun -np 2 '" + KEEL_CLI_PATH +
                          "' record --config " + kTiny + " --steps 100000 --tp 2 -o '" + run +
                          "' >/dev/null 2>&1; touch '" + done + "') &";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  // Rank 1 has committed steps into its hidden replacement (bounded: 60 s): setup is over.
  auto partialSteps = [&]() -> size_t {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(run, ec))
      if (e.path().filename().string().rfind(".rank-1.db.partial-", 0) == 0) try {
          return keel::storage::Recording::open(e.path().string()).steps().size();
        } catch (const std::exception&) {
        }
    return 0;
  };
  for (int i = 0; i < 600 && partialSteps() < 2; ++i) usleep(100000);
  ASSERT_GE(partialSteps(), 2u);
  const pid_t pid = pid_t(std::atoll(keel::readFile(run + "/.rank-1.db.lock").c_str()));
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  for (int i = 0; i < 600 && !fs::exists(done); ++i) usleep(100000);
  ASSERT_TRUE(fs::exists(done));
  for (const auto& [f, bytes] : before) EXPECT_TRUE(keel::readFile(run + "/" + f) == bytes) << f;
  const CliResult inspect = keel("inspect '" + run + "'");
  ASSERT_EQ(inspect.status, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("2 ranks: dp 2 x tp 1"), std::string::npos) << inspect.out;
}

// A perturbed matmul on rank 1 reaches rank 0 through the gradients' all_reduce in the same step:
// rank 0's first divergence is that all_reduce (its own inputs all equal), rank 1's the matmul.
// The folder diff named rank 0, by rank number, as "the first to diverge" and its all_reduce as
// the root (Note [The rank that diverged first]).
TEST_F(KeelRanks, AFolderDiffNamesTheRankWhoseOwnOpDivergedFirst) {
  ASSERT_EQ(record("clean", 2, 1, 2).status, 0);
  ASSERT_EQ(
      record("perturbed", 2, 1, 2, "KEEL_TEST_PERTURB=matmul:5 KEEL_TEST_PERTURB_RANK=1").status,
      0);
  const CliResult d = keel("diff '" + path("clean") + "' '" + path("perturbed") + "'");
  EXPECT_EQ(d.status, 1) << d.out << d.err;
  EXPECT_NE(d.out.find("rank 1 (the first to diverge)"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("  rank 1: diverged: first at step 1, op #"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find(" matmul ("), d.out.find("  rank 1: ")) << d.out;
  EXPECT_NE(d.out.find(" all_reduce (dp_grad_sync), a collective: the difference came through "
                       "it from another rank (rank 1 diverged first)"),
            std::string::npos)
      << d.out;
  const nlohmann::json j = nlohmann::json::parse(
      keel("diff '" + path("clean") + "' '" + path("perturbed") + "' --json").out);
  EXPECT_EQ(j.at("first_rank"), 1);
}

// A rank file lost or truncated (a node gone with its disk) blanked the whole folder: inspect
// failed on it. The other ranks are summarised, and the broken file named in one line.
TEST_F(KeelRanks, AnUnreadableRankFileLeavesTheOthersReadable) {
  ASSERT_EQ(record("run", 2, 1, 1).status, 0);
  fs::copy(path("run"), path("lost"));
  fs::remove(path("lost/rank-1.db"));
  fs::copy(path("run"), path("cut"));
  fs::resize_file(path("cut/rank-1.db"), 4096);
  for (const char* name : {"lost", "cut"}) {
    const CliResult inspect = keel("inspect '" + path(name) + "'");
    ASSERT_EQ(inspect.status, 0) << inspect.err;
    EXPECT_NE(inspect.out.find("\n  0     0   0   rank-0.db     1 "), std::string::npos)
        << inspect.out;
    EXPECT_NE(inspect.out.find("\n  1     1   0   rank-1.db     cannot be read\n"),
              std::string::npos)
        << inspect.out;
    EXPECT_NE(inspect.out.find("\nunreadable rank files\n  rank 1: rank-1.db cannot be read ("),
              std::string::npos)
        << inspect.out;
  }
  // Both unreadable: the folder's error, one line.
  fs::remove(path("lost/rank-0.db"));
  keel::test::expectOneLineError(keel("inspect '" + path("lost") + "'"), "rank-0.db");
}

// A damaged manifest said the wrong reason ("world size 1000000000000 is not dp 1000000 x tp
// 1000000", which it is), read "dp": 2.5 as 2, took any "keel_run" version, and quoted the JSON
// library's own text for a manifest that does not parse.
TEST_F(KeelRanks, ADamagedManifestIsSaidInWords) {
  ASSERT_EQ(record("run", 2, 1, 1).status, 0);
  const std::string manifest = path("run/manifest.json");
  const nlohmann::json good = nlohmann::json::parse(keel::readFile(manifest));
  auto expectRefused = [&](const std::function<void(nlohmann::json&)>& edit,
                           const std::string& fragment) {
    nlohmann::json m = good;
    edit(m);
    std::ofstream(manifest) << m.dump();
    keel::test::expectOneLineError(keel("inspect '" + path("run") + "'"), fragment);
  };
  expectRefused(
      [](nlohmann::json& m) {
        m["world_size"] = int64_t(1000000000000);
        m["dp"] = 1000000;
        m["tp"] = 1000000;
      },
      "damaged manifest.json: world size 1000000000000 is more than the 1048576 ranks a run "
      "folder holds");
  expectRefused(
      [](nlohmann::json& m) {
        m["world_size"] = 0;
        m["dp"] = 0;
      },
      "damaged manifest.json: world size 0 (a run has at least one rank)");
  expectRefused([](nlohmann::json& m) { m["keel_run"] = 99; },
                "manifest.json is run folder format 99, and this keel reads format 1 (a newer "
                "keel wrote it: update keel)");
  expectRefused([](nlohmann::json& m) { m["dp"] = 2.5; },
                "damaged manifest.json: dp 2.5 is not a whole number");
  std::ofstream(manifest) << "{nonsense";
  const CliResult garbled = keel("inspect '" + path("run") + "'");
  keel::test::expectOneLineError(garbled,
                                 "damaged manifest.json: not JSON (line 1, column 3: syntax error");
  EXPECT_EQ(garbled.err.find("[json.exception"), std::string::npos) << garbled.err;
}

// keel launch checked the layout against -n but not against the config: a batch dp does not
// divide started every rank to print the same error once each, and left a run folder of failed
// recordings; and nothing bounded -n on one machine.
TEST_F(KeelRanks, LaunchChecksTheConfigAndTheRanksBeforeStartingThem) {
  // No mpirun on the PATH: a launcher that went on to start the ranks fails to ("cannot run
  // mpirun") instead of starting 100000 processes.
  const std::string noMpirun = "PATH=/nonexistent";
  keel::test::expectOneLineError(
      keel("launch -n 3 record --config " + std::string(kTiny) + " --steps 1 -o '" + path("b3") +
               "'",
           noMpirun),
      "keel launch -n 3: data parallelism: dp 3 does not divide config field 'batch_size' 4");
  EXPECT_FALSE(fs::exists(path("b3")));
  keel::test::expectOneLineError(
      keel("launch -n 3 train --config " + std::string(kTiny) + " --steps 1 --tp 3", noMpirun),
      "keel launch -n 3: tensor parallelism: tp 3 does not divide n_head 2");
  keel::test::expectOneLineError(
      keel("launch -n 100000 train --config " + std::string(kTiny) + " --steps 1", noMpirun),
      "keel launch -n 100000: more ranks than this machine runs (");
}

// A checkpoint option every rank would refuse (--ckpt-tp, a --resume that is not there, a
// --ckpt-dir holding another run's checkpoints) printed one error per rank and mpirun's banner;
// keel launch says it in one line before it starts them.
TEST_F(KeelRanks, LaunchChecksTheCheckpointOptionsBeforeStartingTheRanks) {
  const std::string noMpirun = "PATH=/nonexistent";
  const std::string train = "launch -n 2 train --config " + std::string(kTiny) + " --tp 2 ";
  keel::test::expectOneLineError(
      keel(train + "--steps 2 --ckpt-dir '" + path("ck") + "' --ckpt-tp 4", noMpirun),
      "keel launch -n 2: --ckpt-tp: a multi-rank run saves one file per rank");
  keel::test::expectOneLineError(
      keel(train + "--steps 2 --resume '" + path("none") + "'", noMpirun),
      "keel launch -n 2: " + path("none") + ": no such checkpoint directory");
  ASSERT_EQ(
      keel("train --config " + std::string(kTiny) + " --steps 1 --ckpt-dir '" + path("ck") + "'")
          .status,
      0);
  keel::test::expectOneLineError(
      keel(train + "--steps 2 --ckpt-dir '" + path("ck") + "'", noMpirun),
      "keel launch -n 2: --ckpt-dir " + path("ck") +
          " already holds another run's checkpoints (step-000001)");
}

// The descriptor check finds the skipped collective where it happens, naming both ranks.
TEST_F(KeelRanks, TheDescriptorCheckNamesTheRanksThatCallDifferentCollectives) {
  const CliResult r =
      record("mismatch", 2, 1, 3, "KEEL_TEST_PERTURB=all_reduce:2:skip KEEL_TEST_PERTURB_RANK=1",
             "--check-collectives");
  expectErrorOnRanks(r, "collective mismatch in group dp: rank ");
  EXPECT_NE(r.err.find("all_reduce #3 (float32 x 1)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("all_reduce #3 (float32 x 37696)"), std::string::npos) << r.err;
  // The two calls under #3 are not lined up as one collective, and each rank's bytes are its
  // own (the figure was the first rank's, for every rank).
  const CliResult inspect = keel("inspect '" + path("mismatch") + "'");
  ASSERT_EQ(inspect.status, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("\ncollectives the ranks called differently"), std::string::npos)
      << inspect.out;
  EXPECT_NE(inspect.out.find("  all_reduce #3 of dp (step 1): rank 0 all_reduce in dp_loss, 4 "
                             "bytes; rank 1 all_reduce in dp_grad_sync, 150784 bytes"),
            std::string::npos)
      << inspect.out;
  EXPECT_NE(inspect.out.find("bytes sent: rank 0 150792, rank 1 301572"), std::string::npos)
      << inspect.out;
}

// Note [Vocabulary-parallel embedding and loss]: with --vocab-parallel the token embedding and
// lm_head hold V/tp rows each and the loss is computed from the ranks' logit blocks; the curve is
// one process's, at tp 2 and dp 2 x tp 2, and a checkpoint of the vocab-split run resumes on one
// process, at tp 2 without the split and with it (the split parameters are saved as shards).
TEST_F(KeelRanks, VocabularyParallelTrainingGivesTheSingleProcessLossesAndReshards) {
  const std::string train = "train --config " + std::string(kTiny) + " --steps 4";
  const CliResult one = keel(train);
  ASSERT_EQ(one.status, 0) << one.err;
  const std::vector<double> want = losses(one.out), norms = gradNorms(one.out);
  ASSERT_EQ(want.size(), 4u) << one.out;
  ASSERT_EQ(norms.size(), 4u) << one.out;
  for (const auto& [np, args] : std::vector<std::pair<int, std::string>>{
           {2, "--tp 2 --vocab-parallel"},
           {4, "--dp 2 --tp 2 --vocab-parallel --save-every 2 --ckpt-dir '" + path("vp") + "'"}}) {
    const CliResult r = mpi(np, train + " " + args);
    ASSERT_EQ(r.status, 0) << args << "\n" << r.err;
    const std::vector<double> got = losses(r.out);
    ASSERT_EQ(got.size(), want.size()) << args << "\n" << r.out;
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 2e-4) << args << ", step " << i + 1;
    // The gradients' scale too (a gradient counted tp times would show here first).
    const std::vector<double> gn = gradNorms(r.out);
    ASSERT_EQ(gn.size(), norms.size()) << r.out;
    for (size_t i = 0; i < norms.size(); ++i)
      EXPECT_NEAR(gn[i], norms[i], 2e-3) << args << ", step " << i + 1;
  }
  // Each tp rank saved its half of the vocabulary rows (and of their AdamW moments).
  const CliResult meta = keel("ckpt inspect '" + path("vp/step-000002") + "'");
  ASSERT_EQ(meta.status, 0) << meta.err;
  for (const char* key : {"wte.weight ", "lm_head.weight ", "wte.weight::exp_avg "}) {
    const size_t at = meta.out.find(std::string("  ") + key);
    ASSERT_NE(at, std::string::npos) << key << "\n" << meta.out;
    const std::string line = meta.out.substr(at, meta.out.find('\n', at) - at);
    EXPECT_NE(line.find("[256, 32]"), std::string::npos) << line;
    EXPECT_NE(line.find("2 shards"), std::string::npos) << line;
  }
  expectResumedCurve(train, "vp/step-000002",
                     {{1, ""}, {2, "--tp 2"}, {2, "--tp 2 --vocab-parallel"}}, want);
  // The recording says so, and the embedding's weight is half the vocabulary.
  ASSERT_EQ(record("vocab", 1, 2, 1, "", "--vocab-parallel").status, 0);
  const CliResult ops = keel("ops '" + path("vocab") + "' --rank 1 --step 1 --name embedding");
  ASSERT_EQ(ops.status, 0) << ops.err;
  EXPECT_NE(ops.out.find("[128,32] float32, [4,16] int64 -> [4,16,32] float32"), std::string::npos)
      << ops.out;
  const CliResult inspect = keel("inspect '" + path("vocab") + "'");
  EXPECT_NE(inspect.out.find("run        2 ranks: dp 1 x tp 2 (vocabulary split over tp)"),
            std::string::npos)
      << inspect.out;
  // By parameter name against one process, at tp 4: each rank's vocabulary rows are its own
  // piece, even where two ranks' gradients are alike (tokens no batch used).
  const std::string cfg4 = variantConfig(kTiny, "tiny4.json", "\"n_head\": 2", "\"n_head\": 4");
  ASSERT_EQ(mpi(4, "record --config '" + cfg4 + "' --steps 1 --tp 4 --vocab-parallel --stats -o '" +
                       path("vp4") + "'")
                .status,
            0);
  ASSERT_EQ(
      keel("record --config '" + cfg4 + "' --steps 1 --stats -o '" + path("one4.db") + "'").status,
      0);
  const CliResult byName = keel("diff '" + path("vp4") + "' '" + path("one4.db") + "'");
  EXPECT_EQ(byName.status, 0) << byName.out << byName.err;
  EXPECT_NE(byName.out.find("A is dp 1 x tp 4, vocab-parallel (4 ranks)"), std::string::npos)
      << byName.out;
  EXPECT_NE(byName.out.find("equal within tolerance"), std::string::npos) << byName.out;
  // Bad layouts: one line.
  keel::test::expectOneLineError(keel(train + " --vocab-parallel"),
                                 "--vocab-parallel splits the vocabulary across tensor-parallel "
                                 "ranks, and this run has tp 1 (add --tp 2 or more)");
}

TEST_F(KeelRanks, BadLayoutsAreOneLineOnEveryRank) {
  const std::string train = "train --config " + std::string(kTiny) + " --steps 1 ";
  expectErrorOnRanks(mpi(4, train + "--dp 3 --tp 2"),
                     "parallel layout: dp 3 x tp 2 = 6 ranks, but 4 were started (mpirun -np)");
  expectErrorOnRanks(mpi(3, train + "--tp 3"), "tensor parallelism: tp 3 does not divide n_head 2");
  expectErrorOnRanks(mpi(3, train + "--dp 3"),
                     "data parallelism: dp 3 does not divide config field 'batch_size' 4");
  keel::test::expectOneLineError(keel(train + "--dp 2"),
                                 "dp 2 x tp 1 = 2 ranks, but 1 process was started");
}

// Note [Multi-rank checkpoints]: a dp 2 x tp 2 run saves one checkpoint (the first replica's two
// ranks write a file each; the other replica's have nothing of their own); resuming it on the
// same 4 ranks gives the uninterrupted run's next checkpoint byte for byte, and on 2 ranks at
// tp 2 and on 1 rank the same loss curve.
TEST_F(KeelRanks, ACheckpointOfFourRanksResumesOnFourTwoAndOne) {
  const std::string train = "train --config " + std::string(kTiny) + " ";
  const CliResult whole =
      mpi(4, train + "--steps 4 --dp 2 --tp 2 --save-every 2 --ckpt-dir '" + path("whole") + "'");
  ASSERT_EQ(whole.status, 0) << whole.err;
  const std::vector<double> want = losses(whole.out);
  ASSERT_EQ(want.size(), 4u) << whole.out;
  EXPECT_NE(whole.out.find("saved " + path("whole") +
                           "/step-000002 (2 files from 4 ranks: each rank holding a part of its "
                           "own writes one)"),
            std::string::npos)
      << whole.out;
  const CliResult files = keel("ckpt inspect '" + path("whole/step-000002") + "'");
  ASSERT_EQ(files.status, 0) << files.err;
  EXPECT_NE(files.out.find("2 files"), std::string::npos) << files.out;
  EXPECT_NE(files.out.find("model-00001-of-00004.safetensors"), std::string::npos) << files.out;
  EXPECT_EQ(files.out.find("model-00002-of-00004.safetensors"), std::string::npos) << files.out;

  // The same layout: byte for byte.
  const CliResult again =
      mpi(4, train + "--steps 4 --dp 2 --tp 2 --save-every 2 --ckpt-dir '" + path("again") +
                 "' --resume '" + path("whole/step-000002") + "'");
  ASSERT_EQ(again.status, 0) << again.err;
  for (const char* f : {"model-00000-of-00004.safetensors", "model-00001-of-00004.safetensors"})
    EXPECT_EQ(keel::readFile(path(std::string("again/step-000004/") + f)),
              keel::readFile(path(std::string("whole/step-000004/") + f)))
        << f;
  // Other layouts: the same curve.
  for (const auto& [np, layout] :
       std::vector<std::pair<int, std::string>>{{2, "--tp 2"}, {1, ""}}) {
    const std::string args =
        train + "--steps 4 " + layout + " --resume '" + path("whole/step-000002") + "'";
    const CliResult r = np == 1 ? keel(args) : mpi(np, args);
    ASSERT_EQ(r.status, 0) << layout << "\n" << r.err;
    EXPECT_NE(r.out.find("resumed from " + path("whole") + "/step-000002 at step 2"),
              std::string::npos)
        << r.out;
    const std::vector<double> got = losses(r.out);
    ASSERT_EQ(got.size(), 2u) << r.out;
    for (size_t i = 0; i < 2; ++i)
      EXPECT_NEAR(got[i], want[i + 2], 2e-4) << layout << " step " << i + 3;
  }
}

// Note [Sharded optimizer state]: --zero keeps each dp rank's rows of AdamW's moments only, and
// follows the replicated run's curve. Its checkpoints are written by every rank (the moments'
// rows as boxes, a fused q/k/v part as three), resume byte for byte on the same layout and on
// others (2 ranks at dp 2 --zero, 4 without it, 1 process) with the same curve.
TEST_F(KeelRanks, ShardedOptimizerStateFollowsTheReplicatedRunAndReshards) {
  const std::string train = "train --config " + std::string(kTiny) + " --steps 4 ";
  const CliResult zero =
      mpi(4, train + "--dp 2 --tp 2 --zero --save-every 2 --ckpt-dir '" + path("z") + "'");
  ASSERT_EQ(zero.status, 0) << zero.err;
  EXPECT_NE(zero.out.find("ranks: 4 (dp 2 x tp 2, optimizer state sharded over dp)"),
            std::string::npos)
      << zero.out;
  EXPECT_NE(zero.out.find("saved " + path("z") +
                          "/step-000002 (4 files from 4 ranks: each rank holding a part of its "
                          "own writes one)"),
            std::string::npos)
      << zero.out;
  const std::vector<double> want = losses(zero.out);
  ASSERT_EQ(want.size(), 4u) << zero.out;
  const CliResult plain = mpi(4, train + "--dp 2 --tp 2");
  ASSERT_EQ(plain.status, 0) << plain.err;
  const std::vector<double> replicated = losses(plain.out);
  ASSERT_EQ(replicated.size(), 4u) << plain.out;
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(want[i], replicated[i], 1e-5) << "step " << i + 1;

  // Who wrote what: the q/k/v weight's two tp parts are three boxes each (6 shards, by ranks 0
  // and 1); its moments' rows come from all four ranks (each rank's 48 local rows split in two
  // at row 24, across block boundaries at 16 and 32: 8 shards).
  const nlohmann::json meta =
      nlohmann::json::parse(keel::readFile(path("z/step-000002/keel-checkpoint.json")));
  ASSERT_EQ(meta.at("files").size(), 4u) << meta.dump();
  auto filesOf = [&](const std::string& key) {
    std::set<int> files;
    for (const auto& shard : meta.at("keys").at(key).at("shards"))
      files.insert(shard.at("file").get<int>());
    return files;
  };
  EXPECT_EQ(meta.at("keys").at("blocks.0.attn.qkv.weight").at("shards").size(), 6u);
  EXPECT_EQ(filesOf("blocks.0.attn.qkv.weight"), (std::set<int>{0, 1}));
  EXPECT_EQ(meta.at("keys").at("blocks.0.attn.qkv.weight::exp_avg").at("shards").size(), 8u);
  EXPECT_EQ(filesOf("blocks.0.attn.qkv.weight::exp_avg"), (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(filesOf("wte.weight::exp_avg_sq"), (std::set<int>{0, 2}));  // tp rank 0 of each dp rank
  EXPECT_EQ(filesOf("wte.weight::step"), (std::set<int>{0}));

  const CliResult again = mpi(4, train + "--dp 2 --tp 2 --zero --save-every 2 --ckpt-dir '" +
                                     path("again") + "' --resume '" + path("z/step-000002") + "'");
  ASSERT_EQ(again.status, 0) << again.err;
  for (int r = 0; r < 4; ++r) {
    const std::string f = "/step-000004/model-0000" + std::to_string(r) + "-of-00004.safetensors";
    EXPECT_EQ(keel::readFile(path("again" + f)), keel::readFile(path("z" + f))) << f;
  }
  expectResumedCurve(train, "z/step-000002", {{2, "--dp 2 --zero"}, {4, "--dp 2 --tp 2"}, {1, ""}},
                     want);
}

// The replica check of a --zero run pairs the all_gather of the updated parameters (the
// optimizer's own ops are each rank's rows), and finds a desync injected into it.
TEST_F(KeelRanks, TheReplicaCheckOfAZeroRunComparesTheGatheredParameters) {
  ASSERT_EQ(record("good", 2, 1, 2, "", "--zero").status, 0);
  const CliResult good = keel("diff '" + path("good") + "' --replicas");
  EXPECT_EQ(good.status, 0) << good.out << good.err;
  EXPECT_NE(good.out.find("replica check: dp 2 x tp 1, zero, 2 steps"), std::string::npos)
      << good.out;
  EXPECT_NE(good.out.find("replicas identical: every averaged gradient and every all-gathered "
                          "parameter the same"),
            std::string::npos)
      << good.out;
  const CliResult inspect = keel("inspect '" + path("good") + "'");
  EXPECT_NE(inspect.out.find("dp 2 x tp 1 (optimizer state sharded over dp)"), std::string::npos)
      << inspect.out;

  ASSERT_EQ(
      record("bad", 2, 1, 2, "KEEL_TEST_PERTURB=all_gather:2 KEEL_TEST_PERTURB_RANK=1", "--zero")
          .status,
      0);
  const CliResult bad = keel("diff '" + path("bad") + "' --replicas");
  EXPECT_EQ(bad.status, 1) << bad.out << bad.err;
  EXPECT_NE(bad.out.find("op all_gather (optimizer, scope dp_param_gather)"), std::string::npos)
      << bad.out;
}

// --zero needs replicas to shard over and AdamW's state to shard: one line otherwise.
TEST_F(KeelRanks, ZeroWithoutReplicasOrWithSgdIsOneLine) {
  const CliResult alone = keel("train --config " + std::string(kTiny) + " --steps 1 --zero");
  expectErrorOnRanks(alone,
                     "--zero shards the optimizer state across data-parallel ranks, and "
                     "this run has dp 1");
  const std::string sgd = variantConfig(kTiny, "sgd.json", "\"adamw\"", "\"sgd\"");
  expectErrorOnRanks(mpi(2, "train --config '" + sgd + "' --steps 1 --dp 2 --zero"),
                     "--zero shards AdamW's state; config field 'optimizer' is 'sgd'");
}

// Note [Expert-parallel MoE]: a MoE model at dp 2 routes the two ranks' tokens as one batch, and
// with --ep its experts are split across ranks (tokens exchanged with all_to_all): the same
// assignments, drops and aux loss as one process, so the same losses. Checkpoints of an ep run
// hold every expert once (from the first rank holding it) and resume on other layouts.
TEST_F(KeelRanks, ExpertParallelMoeGivesTheSingleProcessLosses) {
  const std::string train = "train --config tests/fixtures/moe-tiny.json --steps 4 ";
  const CliResult one = keel(train);
  ASSERT_EQ(one.status, 0) << one.err;
  const std::vector<double> want = losses(one.out);
  ASSERT_EQ(want.size(), 4u) << one.out;
  for (const auto& [np, layout] : std::vector<std::pair<int, std::string>>{
           {2, "--dp 2"}, {2, "--dp 2 --ep 2"}, {4, "--dp 4 --ep 2"}}) {
    const std::string ckpt = np == 4 ? " --save-every 2 --ckpt-dir '" + path("e") + "'" : "";
    const CliResult r = mpi(np, train + layout + ckpt);
    ASSERT_EQ(r.status, 0) << layout << "\n" << r.err;
    const std::vector<double> got = losses(r.out);
    ASSERT_EQ(got.size(), 4u) << r.out;
    for (size_t i = 0; i < 4; ++i)
      EXPECT_NEAR(got[i], want[i], 2e-4) << layout << " step " << i + 1;
    // Evaluation: every rank routes the whole validation batch itself (exchanging under ep).
    auto valLoss = [](const std::string& out) {
      const size_t at = out.find("val loss ");
      return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 9));
    };
    EXPECT_NEAR(valLoss(r.out), valLoss(one.out), 2e-4) << layout << "\n" << r.out;
    EXPECT_GT(valLoss(one.out), 0.0) << one.out;
    if (np == 4) {
      EXPECT_NE(r.out.find("ranks: 4 (dp 4 x tp 1, experts over ep 2)"), std::string::npos)
          << r.out;
    }
  }
  // dp 4 x ep 2: ranks 0 and 1 hold experts 0-1 and 2-3 first; ranks 2 and 3 write nothing.
  const nlohmann::json meta =
      nlohmann::json::parse(keel::readFile(path("e/step-000002/keel-checkpoint.json")));
  EXPECT_EQ(meta.at("files"), nlohmann::json({"model-00000-of-00004.safetensors",
                                              "model-00001-of-00004.safetensors"}));
  const auto& expert3 = meta.at("keys").at("blocks.0.moe.experts.3.w1.weight::exp_avg");
  ASSERT_EQ(expert3.at("shards").size(), 1u);
  EXPECT_EQ(expert3.at("shards")[0].at("file"), 1);
  expectResumedCurve(train, "e/step-000002", {{2, "--dp 2 --ep 2"}, {1, ""}}, want);
}

// The replica check of an expert-parallel run: ranks holding other experts agree on everything
// but those experts; ranks holding the same experts (dp ranks 0 and 2 at ep 2) also on the
// experts' averaged gradients, where a change on one of them is found.
TEST_F(KeelRanks, TheReplicaCheckOfAnExpertParallelRunPairsTheRanksHoldingTheSameExperts) {
  const std::string rec =
      "record --config tests/fixtures/moe-tiny.json --steps 2 --dp 4 --ep 2 "
      "--md5 -o '";
  ASSERT_EQ(mpi(4, rec + path("good") + "'").status, 0);
  const CliResult good = keel("diff '" + path("good") + "' --replicas");
  EXPECT_EQ(good.status, 0) << good.out << good.err;
  EXPECT_NE(good.out.find("replica check: dp 4 x tp 1, ep 2, 2 steps"), std::string::npos)
      << good.out;
  EXPECT_NE(good.out.find("replicas identical"), std::string::npos) << good.out;
  // Rank 2's 8th all_reduce of step 1 is the edp average of its experts' gradients.
  ASSERT_EQ(
      mpi(4, rec + path("bad") + "'", "KEEL_TEST_PERTURB=all_reduce:8 KEEL_TEST_PERTURB_RANK=2")
          .status,
      0);
  const CliResult bad = keel("diff '" + path("bad") + "' --replicas");
  EXPECT_EQ(bad.status, 1) << bad.out << bad.err;
  EXPECT_NE(bad.out.find("replicas differ: step 1, op all_reduce (backward, scope dp_grad_sync), "
                         "tp rank 0: rank 0 op #"),
            std::string::npos)
      << bad.out;
  EXPECT_NE(bad.out.find("vs rank 2 op #"), std::string::npos) << bad.out;
}

// --ep needs a MoE model whose experts it divides, and divides dp: one line otherwise.
TEST_F(KeelRanks, BadExpertLayoutsAreOneLine) {
  expectErrorOnRanks(mpi(2, "train --config " + std::string(kTiny) + " --steps 1 --dp 2 --ep 2"),
                     "--ep 2 needs a mixture-of-experts model; this config is dense");
  expectErrorOnRanks(mpi(2, "train --config tests/fixtures/moe-tiny.json --steps 1 --tp 2 --ep 2"),
                     "parallel layout: --ep 2 does not divide dp 1");
  expectErrorOnRanks(
      mpi(4, "train --config tests/fixtures/moe-tiny.json --steps 1 --dp 4 --ep 4 --zero"),
      "--zero with --ep: sharding the optimizer state of expert-parallel runs is not built yet");
  const std::string three = variantConfig("tests/fixtures/moe-tiny.json", "moe3.json",
                                          "\"n_expert\": 4", "\"n_expert\": 3");
  expectErrorOnRanks(mpi(2, "train --config '" + three + "' --steps 1 --dp 2 --ep 2"),
                     "--ep 2 does not divide config field 'n_expert' 3");
}

// Note [Context-parallel attention]: --cp splits each row's sequence zig-zag across cp of the dp
// ranks and runs attention round a ring: the single-process losses (validation included) for a
// causal and a sliding-window model, alone, beside dp and beside tp; rank 0 reports how the
// mask's work splits.
TEST_F(KeelRanks, ContextParallelTrainingGivesTheSingleProcessLosses) {
  for (const std::string& config :
       {std::string(kTiny), std::string("tests/fixtures/gpt-tiny-window.json")}) {
    const std::string train = "train --config " + config + " --steps 3 ";
    const CliResult one = keel(train);
    ASSERT_EQ(one.status, 0) << one.err;
    const std::vector<double> want = losses(one.out);
    ASSERT_EQ(want.size(), 3u) << one.out;
    for (const auto& [np, layout] : std::vector<std::pair<int, std::string>>{
             {2, "--dp 2 --cp 2"}, {4, "--dp 4 --cp 2"}, {4, "--dp 2 --tp 2 --cp 2"}}) {
      const CliResult r = mpi(np, train + layout);
      ASSERT_EQ(r.status, 0) << config << " " << layout << "\n" << r.err;
      const std::vector<double> got = losses(r.out);
      ASSERT_EQ(got.size(), 3u) << r.out;
      for (size_t i = 0; i < 3; ++i)
        EXPECT_NEAR(got[i], want[i], 2e-4) << config << " " << layout << " step " << i + 1;
      const size_t at = one.out.find("val loss "), got_at = r.out.find("val loss ");
      ASSERT_NE(got_at, std::string::npos) << r.out;
      EXPECT_NEAR(std::stod(r.out.substr(got_at + 9)), std::stod(one.out.substr(at + 9)), 2e-4);
    }
  }
  // The causal mask's work: even under the zig-zag split, 26.5% / 73.5% under a contiguous one
  // (16 tokens: rank 0's 8 rows see 36 of the 136 visible pairs).
  const CliResult r = mpi(2, "train --config " + std::string(kTiny) + " --steps 1 --dp 2 --cp 2");
  EXPECT_NE(r.out.find("context parallel: each row's 16 tokens split zig-zag over 2 ranks; the "
                       "causal mask's work by rank: 50.0% 50.0% (a contiguous split: 26.5% "
                       "73.5%)"),
            std::string::npos)
      << r.out;
}

// --cp needs a cp that divides dp, learned positions, no dropout, a dense model and a seq_len
// the zig-zag chunks divide: one line otherwise.
TEST_F(KeelRanks, BadContextParallelLayoutsAreOneLine) {
  expectErrorOnRanks(mpi(2, "train --config " + std::string(kTiny) + " --steps 1 --tp 2 --cp 2"),
                     "parallel layout: --cp 2 does not divide dp 1");
  expectErrorOnRanks(
      mpi(2, "train --config tests/fixtures/gpt-tiny-rope.json --steps 1 --dp 2 --cp 2"),
      "context parallelism: --cp with config field 'position' \"rope\" is not built yet");
  expectErrorOnRanks(mpi(2, "train --config tests/fixtures/moe-tiny.json --steps 1 --dp 2 --cp 2"),
                     "context parallelism: --cp with a mixture-of-experts model is not built yet");
  const std::string odd = variantConfig(kTiny, "odd.json", "\"seq_len\": 16", "\"seq_len\": 18");
  expectErrorOnRanks(mpi(2, "train --config '" + odd + "' --steps 1 --dp 2 --cp 2"),
                     "--cp 2 needs config field 'seq_len' a multiple of 4");
}

// Note [Parameters across layouts]: a run folder against a run of another layout — one process,
// or another folder — is compared by parameter name, each parameter's shards, --zero rows and
// experts joined: equal for tp 2 and dp 2 x tp 2 --zero against one process, and a change in
// one rank's forward found at the first step's gradients.
TEST_F(KeelRanks, ARunDiffsAgainstAnotherLayoutByParameterName) {
  const std::string rec = "record --config " + std::string(kTiny) + " --steps 3 --stats ";
  ASSERT_EQ(keel(rec + "-o '" + path("one.db") + "'").status, 0);
  ASSERT_EQ(mpi(2, rec + "--tp 2 -o '" + path("tp") + "'").status, 0);
  ASSERT_EQ(mpi(4, rec + "--dp 2 --tp 2 --zero -o '" + path("zero") + "'").status, 0);
  const CliResult tp = keel("diff '" + path("tp") + "' '" + path("one.db") + "'");
  EXPECT_EQ(tp.status, 0) << tp.out << tp.err;
  EXPECT_NE(tp.out.find("keel diff by parameter: A is dp 1 x tp 2 (2 ranks), B is one process; 3 "
                        "steps, 23 parameters"),
            std::string::npos)
      << tp.out;
  EXPECT_NE(tp.out.find("equal within tolerance (atol 1e-06, rtol 0.0001): 138 values and "
                        "gradients compared"),
            std::string::npos)
      << tp.out;
  const CliResult zero = keel("diff '" + path("zero") + "' '" + path("tp") + "' --json");
  EXPECT_EQ(zero.status, 0) << zero.out << zero.err;
  EXPECT_NE(zero.out.find("\"equal\": true"), std::string::npos) << zero.out;
  // The verdict and exit code every keel diff --json gives (this one had neither).
  EXPECT_NE(zero.out.find("\"verdict\": \"equal\""), std::string::npos) << zero.out;
  EXPECT_NE(zero.out.find("\"exit_code\": 0"), std::string::npos) << zero.out;

  ASSERT_EQ(mpi(2, rec + "--tp 2 -o '" + path("bad") + "'",
                "KEEL_TEST_PERTURB=matmul:30 KEEL_TEST_PERTURB_RANK=1")
                .status,
            0);
  const CliResult bad = keel("diff '" + path("bad") + "' '" + path("one.db") + "'");
  EXPECT_EQ(bad.status, 1) << bad.out << bad.err;
  EXPECT_NE(bad.out.find("first difference: step 1, parameter wte.weight, gradient: "),
            std::string::npos)
      << bad.out;

  ASSERT_EQ(
      keel("record --config " + std::string(kTiny) + " --steps 1 -o '" + path("plain.db") + "'")
          .status,
      0);
  keel::test::expectOneLineError(keel("diff '" + path("tp") + "' '" + path("plain.db") + "'"),
                                 "has no tensor statistics; record with --stats or --all");
}

}  // namespace
