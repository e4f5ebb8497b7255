// End-to-end tests of `keel record`, `keel inspect` and `keel diff` through the built binary:
// real recordings of the tiny configs on both backends, exit statuses 0 / 1 / 2, one-line errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "keel/base/text.h"
#include "keel/storage/reader.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;

using keel::test::CliResult;
using keel::test::expectOneLineError;

class KeelCli : public keel::test::KeelCliTest {
 protected:
  CliResult record(const std::string& name, const std::string& extra, const std::string& env = "") {
    return keel(
        "record --config tests/fixtures/gpt-tiny.json --steps 2 -o '" + path(name) + "' " + extra,
        env);
  }
  // ref.db on cpu-ref and cpu.db on cpu, both with `options`; "" or the first failure's output.
  std::string recordOnBothBackends(const std::string& options) {
    for (const auto& [name, backend] :
         {std::pair{"ref.db", "cpu-ref"}, std::pair{"cpu.db", "cpu"}}) {
      const CliResult r = record(name, options + " --backend " + backend);
      if (r.status != 0) return r.out + r.err;
    }
    return "";
  }
};

TEST_F(KeelCli, InspectShowsTheRecordedAttentionMask) {
  // Sliding window 128 over 256 tokens in 64 × 64 tiles: 7 of 16 tiles skipped.
  CliResult r = keel("record --config tests/fixtures/gpt-tiny-window.json --steps 1 --seed 1 -o '" +
                     path("w.db") + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  CliResult i = keel("inspect '" + path("w.db") + "'");
  ASSERT_EQ(i.status, 0) << i.err;
  EXPECT_NE(i.out.find("attention  step 1; tile map of batch 0"), std::string::npos) << i.out;
  EXPECT_NE(i.out.find("  blocks.0.attn        sliding_window         block sparsity 0.438  "
                       "psss/fpss/pfps/spfp\n"),
            std::string::npos)
      << i.out;
  // A causal gpt-tiny (16 tokens, one tile) shows its one partial tile.
  ASSERT_EQ(record("c.db", "--seed 1").status, 0);
  CliResult c = keel("inspect '" + path("c.db") + "'");
  EXPECT_NE(c.out.find("  blocks.1.attn        causal                 block sparsity 0.000  p\n"),
            std::string::npos)
      << c.out;
}

TEST_F(KeelCli, RecordThenInspectShowsStepsAndOpCounts) {
  CliResult r = record("a.db", "--seed 1 --md5 --stats --stacks");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("recorded 2 steps"), std::string::npos) << r.out;
  CliResult i = keel("inspect '" + path("a.db") + "'");
  ASSERT_EQ(i.status, 0) << i.err;
  EXPECT_NE(i.out.find("status finished"), std::string::npos) << i.out;
  // What was captured, in words (it printed the options' JSON).
  EXPECT_NE(i.out.find("\ncapture    op graph, stacks, MD5, statistics, logs\n"), std::string::npos)
      << i.out;
  EXPECT_NE(i.out.find("steps      2"), std::string::npos) << i.out;
  EXPECT_NE(i.out.find("matmul"), std::string::npos) << i.out;
  EXPECT_NE(i.out.find("adamw_step"), std::string::npos) << i.out;
  {  // the op-count table's columns line up, the longest name included
    const size_t head = i.out.find("\n  op ");
    ASSERT_NE(head, std::string::npos) << i.out;
    const size_t width = i.out.find('\n', head + 1) - head;
    const size_t fm = i.out.find("\n  flashmask_attention_backward ");
    ASSERT_NE(fm, std::string::npos) << i.out;
    EXPECT_EQ(i.out.find('\n', fm + 1) - fm, width) << i.out;
  }

  CliResult o = keel("ops '" + path("a.db") + "' --step 1 --phase backward --name matmul");
  ASSERT_EQ(o.status, 0) << o.err;
  EXPECT_NE(o.out.find(" backward  matmul"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("forward "), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("op calls"), std::string::npos) << o.out;
  expectOneLineError(keel("ops '" + path("a.db") + "' --phase sideways"), "sideways");
  // A step the recording does not have is an error (it printed "0 op calls"); a filter that
  // matches nothing in a real step is an empty table.
  expectOneLineError(keel("ops '" + path("a.db") + "' --step 99"),
                     "recording " + path("a.db") + " has no ops in step 99 (it has steps 1 to 2)");
  const CliResult none = keel("ops '" + path("a.db") + "' --step 1 --name no_such_op");
  EXPECT_EQ(none.status, 0) << none.err;
  EXPECT_NE(none.out.find("0 op calls"), std::string::npos) << none.out;
  EXPECT_EQ(none.err, "");
  // A scope no op ran in (mistyped) names the run's top-level scopes (it printed 0 op calls).
  const CliResult typo = keel("ops '" + path("a.db") + "' --scope blocks.9");
  EXPECT_EQ(typo.status, 0) << typo.err;
  EXPECT_EQ(typo.err.rfind("keel: warning: no op ran in scope 'blocks.9' (its top-level scopes: "
                           "blocks, ",
                           0),
            0u)
      << typo.err;
  // Without a recording the filters had nothing to filter and were ignored without a word.
  expectOneLineError(keel("ops --step 1"), "--step filters a recording's op calls");
  expectOneLineError(keel("ops --name matmul"), "--name filters a recording's op calls");

  // The studio's graph (tests/views/graph_test.cpp compares the two): module clusters, labelled
  // nodes, backward ops filled.
  CliResult g = keel("export graph '" + path("a.db") + "' --step 1 --phase both");
  ASSERT_EQ(g.status, 0) << g.err;
  EXPECT_EQ(g.out.rfind("digraph", 0), 0u) << g.out.substr(0, 200);
  EXPECT_NE(g.out.find("subgraph \"cluster_f:blocks.0.attn\""), std::string::npos);
  EXPECT_NE(g.out.find("<B>blocks.0.attn</B>"), std::string::npos);
  EXPECT_NE(g.out.find("[label=\"matmul\\n"), std::string::npos);
  EXPECT_NE(g.out.find("fillcolor=\"#fde2c8\""), std::string::npos) << "backward ops";
  CliResult collapsed = keel("export graph '" + path("a.db") + "' --step 1 --collapse");
  ASSERT_EQ(collapsed.status, 0) << collapsed.err;
  EXPECT_NE(collapsed.out.find("\"m:f:blocks\" [label=\"blocks\\n"), std::string::npos);
  EXPECT_LT(collapsed.out.size(), g.out.size());
  CliResult svg = keel("export graph '" + path("a.db") + "' --step 1 --phase forward --format svg");
  ASSERT_EQ(svg.status, 0) << svg.err;
  EXPECT_NE(svg.out.find("<svg"), std::string::npos) << svg.out.substr(0, 300);
  EXPECT_NE(svg.out.find("matmul"), std::string::npos);
  EXPECT_NE(svg.out.find("</svg>"), std::string::npos);
  CliResult one = keel("export graph '" + path("a.db") + "' --step 1 --expand blocks.0.attn");
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_NE(one.out.find("subgraph \"cluster_f:blocks.0.attn\""), std::string::npos);
  EXPECT_EQ(one.out.find("subgraph \"cluster_f:blocks.1.attn\""), std::string::npos);
  // A module the step does not have (or half a module's name) is an error, not the default picture.
  for (const char* bad : {"nosuch", "blocks.0.at"})
    expectOneLineError(keel("export graph '" + path("a.db") + "' --step 1 --expand " + bad),
                       "--expand: step 1 has no module '" + std::string(bad) +
                           "' (its top-level modules: blocks, ");
  expectOneLineError(keel("export graph '" + path("a.db") + "' --format png"), "png");
  expectOneLineError(keel("export graph '" + path("a.db") + "' --phase sideways"), "sideways");
  CliResult tr = keel("export trace '" + path("a.db") + "'");
  ASSERT_EQ(tr.status, 0) << tr.err;
  EXPECT_GT(nlohmann::json::parse(tr.out)["traceEvents"].size(), 100u);
  // The trainer's log line of each step is on the logs track.
  const nlohmann::json trace = nlohmann::json::parse(tr.out);
  bool stepLine = false;
  for (const auto& e : trace["traceEvents"])
    stepLine =
        stepLine || (e["ph"] == "i" && e["name"].get<std::string>().rfind("step 1: loss", 0) == 0);
  EXPECT_TRUE(stepLine);
  CliResult csv = keel("export csv '" + path("a.db") + "'");
  ASSERT_EQ(csv.status, 0) << csv.err;
  EXPECT_EQ(csv.out.rfind("seq,step,phase,op,", 0), 0u);
  CliResult tcsv = keel("export csv --tensors '" + path("a.db") + "'");
  ASSERT_EQ(tcsv.status, 0) << tcsv.err;
  EXPECT_EQ(tcsv.out.rfind("seq,step,phase,op,scope,role,idx,", 0), 0u);
  EXPECT_NE(tcsv.out.find(",output,0,"), std::string::npos);
  expectOneLineError(keel("export graph '" + path("a.db") + "' --step 99"), "step 99");
}

TEST_F(KeelCli, SameConfigOnTwoBackendsDiffsEqualWithinTolerance) {
  ASSERT_EQ(recordOnBothBackends("--seed 3 --md5 --stats"), "");
  CliResult d = keel("diff '" + path("ref.db") + "' '" + path("cpu.db") + "' --mismatches-only");
  EXPECT_EQ(d.status, 0) << d.out << d.err;
  EXPECT_NE(d.out.find("0 diverged"), std::string::npos) << d.out;
}

// Every pair names both sides' kernels (Note [Kernel identity]): cpu and cpu-ref run different
// sum kernels and the same copy; under zero tolerance the root divergence is an op whose inputs
// match and whose kernels differ, and the text says so in those words.
TEST_F(KeelCli, DiffNamesTheKernelsOfEachPair) {
  ASSERT_EQ(recordOnBothBackends("--seed 3 --md5 --stats"), "");
  CliResult d = keel("diff '" + path("cpu.db") + "' '" + path("ref.db") + "' --json");
  ASSERT_EQ(d.status, 0) << d.err;
  nlohmann::json j = nlohmann::json::parse(d.out);
  int sums = 0, concats = 0;
  for (const auto& p : j["pairs"]) {
    if (p["name"] == "sum") {
      ++sums;
      EXPECT_EQ(p["sameKernelVariant"], false) << p.dump();
      EXPECT_EQ(p["a"]["kernel"]["backend"], "cpu");
      EXPECT_EQ(p["b"]["kernel"]["backend"], "cpu-ref");
      EXPECT_EQ(p["b"]["kernel"]["variant"], "float64, sequential") << p.dump();
    }
    if (p["name"] == "concat") {
      ++concats;
      EXPECT_EQ(p["sameKernelVariant"], true) << p.dump();
      EXPECT_EQ(p["a"]["kernel"]["variant"], "copy (exact)") << p.dump();
    }
    if (p["name"] == "reshape") {
      EXPECT_TRUE(p["sameKernelVariant"].is_null()) << p.dump();  // a view runs no kernel
    }
  }
  EXPECT_GT(sums, 0);
  EXPECT_GT(concats, 0);
  // keel ops shows the kernel that ran each recorded call.
  CliResult ops = keel("ops '" + path("ref.db") + "' --kernels --name sum --limit 1");
  ASSERT_EQ(ops.status, 0) << ops.err;
  EXPECT_NE(ops.out.find("KERNEL (variant; run-time parameters)"), std::string::npos) << ops.out;
  EXPECT_NE(ops.out.find(" cpu-ref float64, sequential\n"), std::string::npos) << ops.out;

  CliResult z = keel("diff '" + path("cpu.db") + "' '" + path("ref.db") + "' --atol 0 --rtol 0");
  EXPECT_EQ(z.status, 1) << z.err;
  // The first divergence is the root here (a layer_norm whose inputs all match).
  const size_t first = z.out.find("first divergence: step 1");
  ASSERT_NE(first, std::string::npos) << z.out;
  EXPECT_NE(z.out.find("root divergence: the first divergence (its inputs all match)"),
            std::string::npos)
      << z.out;
  const size_t phrase = z.out.find("same inputs, different kernel: cpu ", first);
  ASSERT_NE(phrase, std::string::npos) << z.out;
  EXPECT_LT(phrase, z.out.find("fed by", first)) << z.out;
  EXPECT_NE(z.out.find(" vs cpu-ref ", phrase), std::string::npos) << z.out;
}

// With --dumps the diff compares matmul outputs element by element (basis "values", with the
// measured max abs error), not only by statistics; and a one-element perturbation is located with
// its exact size.
TEST_F(KeelCli, DumpedValuesAreComparedElementByElement) {
  const std::string opts = "--seed 3 --md5 --stats --dumps --dump-ops matmul";
  ASSERT_EQ(recordOnBothBackends(opts), "");
  CliResult d = keel("diff '" + path("ref.db") + "' '" + path("cpu.db") + "' --json");
  EXPECT_EQ(d.status, 0) << d.err;
  nlohmann::json j = nlohmann::json::parse(d.out);
  int valuePairs = 0;
  for (const auto& p : j["pairs"]) {
    if (!p.contains("outputs")) continue;
    for (const auto& o : p["outputs"])
      if (o["basis"] == "values") {
        ++valuePairs;
        EXPECT_EQ(p["name"], "matmul");
        EXPECT_LE(o["maxAbs"].get<double>(), 1e-4);
      }
  }
  EXPECT_GT(valuePairs, 10);

  ASSERT_EQ(record("bad.db", opts + " --backend cpu", "KEEL_TEST_PERTURB=matmul:5").status, 0);
  CliResult p = keel("diff '" + path("cpu.db") + "' '" + path("bad.db") + "' --json");
  EXPECT_EQ(p.status, 1) << p.err;
  nlohmann::json pj = nlohmann::json::parse(p.out);
  const auto& out0 = pj["rootDivergence"]["pair"]["outputs"][0];
  EXPECT_EQ(out0["basis"], "values");
  EXPECT_NEAR(out0["maxAbs"].get<double>(), 1000.0, 1e-3);
  EXPECT_EQ(out0["badElements"], 1);
}

TEST_F(KeelCli, DifferentSeedsDivergeAtTheFirstInitialisationOp) {
  ASSERT_EQ(record("s1.db", "--seed 1 --md5 --stats").status, 0);
  ASSERT_EQ(record("s2.db", "--seed 2 --md5 --stats --steps 3").status, 0);
  CliResult d = keel("diff '" + path("s1.db") + "' '" + path("s2.db") + "' --json");
  EXPECT_EQ(d.status, 1) << d.out << d.err;
  EXPECT_NE(d.out.find("\"firstDivergence\""), std::string::npos) << d.out;
  // Note [Setup differences]: the report says how the runs were set up apart (it named the
  // first random op and nothing else; a shorter run compared EQUAL without a word).
  const auto j = nlohmann::json::parse(d.out);
  EXPECT_EQ(j["setupDifferences"],
            nlohmann::json({"seed 1 vs 2: every random op differs from the first (initialisation, "
                            "data, dropout)",
                            "A has 2 steps, B 3: the ops of steps one run lacks are only in the "
                            "other"}));
  d = keel("diff '" + path("s1.db") + "' '" + path("s2.db") + "'");
  EXPECT_NE(d.out.find("\nsetup differs: seed 1 vs 2: "), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("\nsetup differs: A has 2 steps, B 3: "), std::string::npos) << d.out;
}

// A recording made with --step-range holds no ops outside it: the other run's ops there are
// not compared, and the report says so (they were "only in B", and --strict failed on them).
TEST_F(KeelCli, OpsOutsideTheOtherRunsStepRangeAreNotCompared) {
  ASSERT_EQ(record("all.db", "--seed 3 --md5 --steps 3").status, 0);
  ASSERT_EQ(record("range.db", "--seed 3 --md5 --steps 3 --step-range 2:3").status, 0);
  CliResult d = keel("diff '" + path("range.db") + "' '" + path("all.db") + "' --strict --json");
  EXPECT_EQ(d.status, 0) << d.out << d.err;
  const auto j = nlohmann::json::parse(d.out);
  EXPECT_EQ(j["verdict"], "equal");
  EXPECT_EQ(j["total"]["onlyInB"], 0);
  const keel::storage::Recording all = keel::storage::Recording::open(path("all.db"));
  const int64_t outside = int64_t(all.stepOps(0).size() + all.stepOps(1).size());
  EXPECT_EQ(j["setupDifferences"],
            nlohmann::json({std::to_string(outside) + " ops of B not compared: A recorded only "
                                                      "--step-range 2:3"}));
}

// KEEL_TEST_PERTURB (Note [Test perturbation]) changes one element of the 5th matmul's output in
// run B only; the diff must put the root divergence exactly there.
TEST_F(KeelCli, DiffFindsAnInjectedDivergenceAtThePerturbedOp) {
  ASSERT_EQ(record("clean.db", "--seed 4 --md5 --stats --stacks").status, 0);
  ASSERT_EQ(
      record("bad.db", "--seed 4 --md5 --stats --stacks", "KEEL_TEST_PERTURB=matmul:5").status, 0);
  CliResult j = keel("diff '" + path("clean.db") + "' '" + path("bad.db") + "' --json");
  EXPECT_EQ(j.status, 1) << j.out << j.err;
  auto doc = nlohmann::json::parse(j.out);
  ASSERT_TRUE(doc.contains("rootDivergence")) << j.out;
  const auto& root = doc["rootDivergence"];
  ASSERT_FALSE(root.is_null()) << j.out;
  // The 5th matmul call of the run, counted in B's own recording.
  CliResult ops = keel("ops '" + path("bad.db") + "' --name matmul --limit 5");
  ASSERT_EQ(ops.status, 0) << ops.err;
  std::istringstream lines(ops.out);
  std::string line, fifth;
  for (int i = 0; i <= 5 && std::getline(lines, line);) {  // header + 5 rows
    if (i == 5) fifth = line;
    ++i;
  }
  ASSERT_FALSE(fifth.empty()) << ops.out;
  const uint64_t fifthSeq = std::stoull(fifth);
  EXPECT_EQ(root["pair"]["name"], "matmul") << root.dump();
  EXPECT_EQ(root["pair"]["b"]["seq"].get<uint64_t>(), fifthSeq) << root.dump();
  EXPECT_EQ(root["pair"]["status"], "diverged") << root.dump();
  // Text mode names the op and prints both stacks.
  CliResult t = keel("diff '" + path("clean.db") + "' '" + path("bad.db") + "' --mismatches-only");
  EXPECT_EQ(t.status, 1);
  EXPECT_NE(t.out.find("root divergence stacks"), std::string::npos) << t.out;
}

// Recordings made without --md5/--stats/--all hold no tensor values: `keel diff` must not call
// them equal (it did: "EQUAL within tolerance" for a perturbed run), and their step losses still
// say whether and where the runs part.
TEST_F(KeelCli, GraphOnlyRecordingsAreNotCalledEqualAndTheirLossesAreCompared) {
  ASSERT_EQ(record("clean.db", "--seed 4").status, 0);
  ASSERT_EQ(record("again.db", "--seed 4").status, 0);
  ASSERT_EQ(record("bad.db", "--seed 4", "KEEL_TEST_PERTURB=matmul:5").status, 0);
  const CliResult same = keel("diff '" + path("clean.db") + "' '" + path("again.db") + "'");
  EXPECT_EQ(same.status, 0) << same.out << same.err;
  EXPECT_NE(same.out.find("\nNO VALUES COMPARED (atol"), std::string::npos) << same.out;
  EXPECT_NE(same.out.find("only the op sequences and the step losses were compared (record both "
                          "with --all"),
            std::string::npos)
      << same.out;
  EXPECT_NE(same.out.find("losses: 2 steps compared, all equal\n"), std::string::npos) << same.out;
  EXPECT_EQ(same.out.find(" equal, 0 not compared"), std::string::npos) << same.out;

  const CliResult bad = keel("diff '" + path("clean.db") + "' '" + path("bad.db") + "'");
  EXPECT_EQ(bad.status, 1) << bad.out << bad.err;
  EXPECT_NE(bad.out.find("\nDIVERGED (atol"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("losses: 2 steps compared, first diverged at step 1: A "),
            std::string::npos)
      << bad.out;
  EXPECT_NE(bad.out.find("first divergence: step 1 loss (A "), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("no op can be named: the recordings hold no tensor values"),
            std::string::npos)
      << bad.out;
  const auto doc = nlohmann::json::parse(
      keel("diff --json '" + path("clean.db") + "' '" + path("bad.db") + "'").out);
  EXPECT_EQ(doc["verdict"], "diverged");
  EXPECT_EQ(doc["firstLossDivergence"], 1);
  EXPECT_EQ(doc["total"]["equal"], 0);
  EXPECT_GT(doc["total"]["notCompared"].get<int64_t>(), 100);

  // A run whose loss went NaN (at step 2: the 20th matmul is in step 1's backward) diverges from
  // the clean one there, by its loss alone; inspect cannot name a first NaN without statistics.
  ASSERT_EQ(record("nan.db", "--seed 4", "KEEL_TEST_PERTURB=matmul:20:nan").status, 0);
  const CliResult nan = keel("diff '" + path("clean.db") + "' '" + path("nan.db") + "'");
  EXPECT_EQ(nan.status, 1) << nan.out << nan.err;
  EXPECT_NE(nan.out.find("first divergence: step 2 loss (A "), std::string::npos) << nan.out;
  EXPECT_NE(nan.out.find(" vs B NaN); no op can be named"), std::string::npos) << nan.out;
  const CliResult inspect = keel("inspect '" + path("nan.db") + "'");
  EXPECT_NE(inspect.out.find("\nfirst NaN/Inf: unknown (recorded without --stats"),
            std::string::npos)
      << inspect.out;
}

// Stacks name each frame's own function and line, inlined calls included: an op called from
// SwiGLU::forwardImpl through the inlined UnaryModule::forward read as "SwiGLU::forwardImpl at
// nn.h:86" (the inlined callee's line under the caller's name), main as "std_function.h:591",
// and keel's run() (inlined into main) was missing.
TEST_F(KeelCli, StacksGiveEachInlinedCallItsOwnFrame) {
  ASSERT_EQ(record("st.db", "--steps 1 --stacks").status, 0);
  keel::storage::Recording rec = keel::storage::Recording::open(path("st.db"));
  std::optional<keel::storage::StackRecord> stack;
  for (const auto& op : rec.stepOps(1))
    if (op.name == "matmul" && op.scope == "blocks.0.mlp.w2" && op.stackId >= 0) {
      stack = rec.stack(op.stackId);
      break;
    }
  ASSERT_TRUE(stack);
  auto endsWith = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  std::string text;
  for (const auto& f : stack->frames) text += f.function + "  " + f.file + "\n";
  bool swiglu = false, mainFrame = false, runFrame = false;
  for (const auto& f : stack->frames) {
    if (f.function.find("forwardImpl") != std::string::npos ||
        f.function.find("GPT::forward(") != std::string::npos) {
      EXPECT_FALSE(endsWith(f.file, "keel/nn.h")) << text;
    }
    if (f.function.find("SwiGLU::forwardImpl") != std::string::npos) {
      swiglu = true;
      EXPECT_TRUE(endsWith(f.file, "engine/src/nn/layers.cpp")) << text;
    }
    // keel's run(), inlined into main in a release build: a frame of its own between main and
    // the command it calls (a chain of two inlined calls kept only the innermost).
    if ((f.function == "run" || f.function.find("::run(int, char**)") != std::string::npos) &&
        endsWith(f.file, "app/keel/main.cpp"))
      runFrame = true;
    if (f.function == "main") {
      mainFrame = true;
      EXPECT_TRUE(endsWith(f.file, "app/keel/main.cpp")) << text;
    }
  }
  EXPECT_TRUE(swiglu) << text;
  EXPECT_TRUE(mainFrame) << text;
  EXPECT_TRUE(runFrame) << text;
}

TEST_F(KeelCli, BadInputsGiveOneLineAndStatus2) {
  expectOneLineError(keel("inspect '" + path("missing.db") + "'"), "missing.db");
  {
    std::ofstream junk(path("junk.db"), std::ios::binary);
    for (int i = 0; i < 4096; ++i) junk.put(char((i * 131) & 0xff));
  }
  expectOneLineError(keel("inspect '" + path("junk.db") + "'"), "junk.db");
  expectOneLineError(record("x.db", "--ops matmull"), "matmull");
  expectOneLineError(record("y.db", "--step-range 5:2"), "step range");
  // Ranges and stops past the run's steps would record, dump or stop nothing, silently.
  expectOneLineError(record("y.db", "--step-range 3:9"),
                     "--step-range '3:9' lies past the run's 2 steps (--steps)");
  expectOneLineError(record("y.db", "--dumps --dump-steps 4"),
                     "--dump-steps '4' lies past the run's 2 steps (--steps)");
  expectOneLineError(record("y.db", "--break-on step:3"),
                     "--break-on step:3 lies past the run's 2 steps (--steps)");
  // An empty filter filtered nothing, silently.
  expectOneLineError(record("y.db", "--scope ''"), "--scope: must not be empty");
  expectOneLineError(record("y.db", "--dump-ops ''"), "--dump-ops: must not be empty");
  expectOneLineError(keel("ops --name ''"), "--name: must not be empty");
  expectOneLineError(keel("export graph '" + path("plain.db") + "' --expand ''"),
                     "--expand: must not be empty");
  expectOneLineError(keel("memory stats ''"), "RECORDING: must not be empty");
  expectOneLineError(keel("export csv ''"), "recording: must not be empty");
  EXPECT_FALSE(fs::exists(path("y.db")));
  expectOneLineError(keel("record --config tests/fixtures/gpt-tiny.json -o /proc/no/such/dir.db"),
                     "/proc/no/such/dir.db");
  expectOneLineError(keel("diff '" + path("missing.db") + "' '" + path("junk.db") + "'"),
                     "missing.db");
  // Memory figures of a recording without allocator events: an error, as replay says it (stats
  // printed it on stdout and exited 0).
  ASSERT_EQ(record("plain.db", "--steps 1").status, 0);
  for (const char* cmd : {"memory stats", "memory replay"})
    expectOneLineError(keel(std::string(cmd) + " '" + path("plain.db") + "'"),
                       "has no allocator events (record with `keel record --allocator` or --all)");
  // A file of another kind where a checkpoint or a recording is expected says what it is (a
  // recording's first bytes were read as a safetensors header length of 7358993341780611411).
  expectOneLineError(keel("ckpt inspect '" + path("plain.db") + "'"),
                     path("plain.db") + " is a Keel recording (SQLite), not a checkpoint file");
  expectOneLineError(keel("train --config tests/fixtures/gpt-tiny.json --steps 1 --resume '" +
                          path("plain.db") + "'"),
                     path("plain.db") + " is a file, not a checkpoint");
  fs::create_directories(path("run"));
  std::ofstream(path("run/manifest.json")) << "{}";
  expectOneLineError(keel("memory stats '" + path("run") + "'"),
                     "is a run folder (a multi-rank run): name one rank's recording, e.g. " +
                         path("run") + "/rank-0.db");
  // --track-memory records the allocator's events its sections stand on.
  ASSERT_EQ(record("tm.db", "--steps 1 --track-memory").status, 0);
  EXPECT_EQ(keel("memory stats '" + path("tm.db") + "'").status, 0);
  // A mistyped option is named even when a required one is missing too (CLI11 said only
  // "--output is required").
  expectOneLineError(keel("record --steps 2 --bogus"),
                     "The following argument was not expected: --bogus");
  expectOneLineError(keel("record --steps 2"), "--output is required");
  expectOneLineError(keel("diff"), "diff needs two recordings");
  // A folder that is not a run folder is named as one (it said "recording X is a directory").
  std::filesystem::create_directories(path("plain-folder"));
  expectOneLineError(keel("diff '" + path("tm.db") + "' '" + path("plain-folder") + "'"),
                     path("plain-folder") +
                         " is a folder but not a run folder (it has no "
                         "manifest.json");
}

// A scope filter that matches nothing (mistyped) records a run without ops: a warning says so.
TEST_F(KeelCli, AFilterThatMatchesNothingIsNamed) {
  const CliResult r = record("s.db", "--steps 1 --scope blocks.9");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("--scope 'blocks.9' matched no op the run called: the recording holds no op "
                       "calls"),
            std::string::npos)
      << r.err;
  const CliResult ok =
      record("t.db", "--steps 1 --scope blocks.1 --dump-ops matmul --step-range 1");
  ASSERT_EQ(ok.status, 0) << ok.err;
  EXPECT_EQ(ok.err.find("matched no op"), std::string::npos) << ok.err;
  const CliResult i = keel("inspect '" + path("t.db") + "'");
  EXPECT_NE(
      i.out.find("\ncapture    op graph, logs, dumps (ops matmul); only scope blocks.1, steps "
                 "1:1\n"),
      std::string::npos)
      << i.out;
}

// More threads than the cores the process may use: the run says how many it runs (it clamped
// without a word); the kernels of one thread say "1 BLAS thread", not "1 BLAS threads".
TEST_F(KeelCli, ThreadsPastTheCoresAreNamed) {
  for (const std::string& cmd :
       {std::string("train --config tests/fixtures/gpt-tiny.json --steps 1 --threads 4096"),
        "record --config tests/fixtures/gpt-tiny.json --steps 1 --threads 4096 -o '" +
            path("r.db") + "'"}) {
    const CliResult r = keel(cmd);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("keel: warning: --threads 4096: the cpu backend runs "), std::string::npos)
        << cmd << ": " << r.err;
  }
  const CliResult one = keel("train --config tests/fixtures/gpt-tiny.json --steps 1 --threads 1");
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_EQ(one.err.find("--threads"), std::string::npos) << one.err;
  // OpenBLAS's threads are OPENBLAS_NUM_THREADS (its bits depend on them), named per matmul.
  ASSERT_EQ(keel("record --config tests/fixtures/gpt-tiny.json --steps 1 --threads 1 -o '" +
                     path("one.db") + "'",
                 "OPENBLAS_NUM_THREADS=1")
                .status,
            0);
  const CliResult ops = keel("ops '" + path("one.db") + "' --kernels --name matmul --limit 1");
  ASSERT_EQ(ops.status, 0) << ops.err;
  EXPECT_NE(ops.out.find(", 1 BLAS thread, "), std::string::npos) << ops.out;
  EXPECT_NE(ops.out.find(", up to 1 thread\n"), std::string::npos) << ops.out;
}

// A run that ran out of memory: the refused request is an event of the recording (oom, with the
// bytes asked for and the op asking), and keel memory stats names it first, gives its figures a
// column and says what held the memory then. The message names the pool a caching allocator
// needed, and uses the words memory stats uses.
TEST_F(KeelCli, MemoryStatsOfARunThatRanOutOfMemoryNamesTheRefusedRequest) {
  for (const std::string alloc : {"vmm", "caching"}) {
    SCOPED_TRACE(alloc);
    const std::string db = alloc + "-oom.db";
    const CliResult r =
        keel("record --config configs/gpt-mini.json --steps 2 --allocator --alloc " + alloc +
                 " -o '" + path(db) + "'",
             "KEEL_MEMORY_LIMIT=16M");
    expectOneLineError(r, "out of memory in the " + alloc + " allocator: requested ");
    EXPECT_NE(r.err.find("% of reserved, fragmentation "), std::string::npos) << r.err;
    EXPECT_EQ(alloc == "caching", r.err.find("-pool request (") != std::string::npos) << r.err;
    keel::storage::Recording rec = keel::storage::Recording::open(path(db));
    std::vector<keel::storage::MemRecord> ooms;
    for (const auto& e : rec.memEvents({}))
      if (e.kind == keel::MemEventKind::Oom) ooms.push_back(e);
    ASSERT_EQ(ooms.size(), 1u);
    const std::string asked = "requested " + std::to_string(ooms[0].bytes) + " bytes by op #" +
                              std::to_string(ooms[0].opSeq) + " ";
    EXPECT_NE(r.err.find(asked), std::string::npos) << asked << "\n" << r.err;
    const CliResult s = keel("memory stats '" + path(db) + "'");
    ASSERT_EQ(s.status, 0) << s.err;
    const std::string line = "\nout of memory at event ";
    ASSERT_NE(s.out.find(line), std::string::npos) << s.out;
    EXPECT_NE(s.out.find(" (" + std::to_string(ooms[0].bytes) + " bytes) requested by op #" +
                         std::to_string(ooms[0].opSeq) + " "),
              std::string::npos)
        << s.out;
    EXPECT_NE(s.out.find(" in step 1 and refused\n"), std::string::npos) << s.out;
    EXPECT_NE(s.out.find("out of memory (event "), std::string::npos) << s.out;  // its column
    EXPECT_NE(s.out.find("\nlive at the out of memory: "), std::string::npos) << s.out;
    EXPECT_NE(s.out.find("parameters "), std::string::npos) << s.out;
  }
}

// --track-memory prints the section of a step that failed or stopped (it printed nothing for it,
// the one section a user asked for), and a step that ended before a step-level stop once.
TEST_F(KeelCli, TrackMemoryPrintsTheSectionOfAStepThatFailedOrStopped) {
  auto sections = [](const std::string& out, const std::string& step) {
    size_t n = 0;
    for (size_t at = out.find("memory section '" + step + "': "); at != std::string::npos;
         at = out.find("memory section '" + step + "': ", at + 1))
      ++n;
    return n;
  };
  const CliResult oom = keel(
      "record --config configs/gpt-mini.json --steps 2 --alloc vmm "
      "--track-memory -o '" +
          path("oom.db") + "'",
      "KEEL_MEMORY_LIMIT=16M");
  expectOneLineError(oom, "out of memory in the vmm allocator: requested ");
  EXPECT_EQ(sections(oom.out, "step 1"), 1u) << oom.out;
  EXPECT_NE(oom.out.find(" blocks still alive ("), std::string::npos) << oom.out;
  // Stopped at an op in step 1: its section, once.
  const CliResult op = record("op.db", "--track-memory --break-on op:matmul");
  ASSERT_EQ(op.status, 1) << op.err;
  EXPECT_EQ(sections(op.out, "step 1"), 1u) << op.out;
  EXPECT_EQ(sections(op.out, "step 2"), 0u) << op.out;
  // Stopped after step 1 (a step-level condition): its section once.
  const CliResult step = record("step.db", "--track-memory --break-on step:1");
  ASSERT_EQ(step.status, 1) << step.err;
  EXPECT_EQ(sections(step.out, "step 1"), 1u) << step.out;
  EXPECT_EQ(sections(step.out, "step 2"), 0u) << step.out;
}

// KEEL_MEMORY_LIMIT takes a byte count with an optional K/M/G suffix (and B or iB after it);
// anything else is refused in one line ("16Mx" was 16 MiB). A limit the host allocator cannot
// keep is said in a warning, not silently ignored.
TEST_F(KeelCli, KeelMemoryLimitIsReadStrictlyAndNamedWhereItDoesNotApply) {
  for (const std::string bad : {"16Mx", "16 M", "lots"})
    expectOneLineError(record("bad.db", "--alloc vmm", "KEEL_MEMORY_LIMIT='" + bad + "'"),
                       "KEEL_MEMORY_LIMIT='" + bad + "' is not a byte count");
  const CliResult mib = record("mib.db", "--alloc vmm", "KEEL_MEMORY_LIMIT=1MiB");
  expectOneLineError(mib, "out of memory in the vmm allocator: requested ");
  EXPECT_NE(mib.err.find(" with a limit of 1048576 bytes"), std::string::npos) << mib.err;
  const CliResult host = record("host.db", "--alloc host --steps 1", "KEEL_MEMORY_LIMIT=1M");
  ASSERT_EQ(host.status, 0) << host.err;
  EXPECT_EQ(host.err,
            "keel: warning: KEEL_MEMORY_LIMIT=1M does not limit the host allocator (only caching "
            "and vmm have a limit)\n");
}

// keel inspect of a NaN that first appears in backward names the forward op the backward op
// differentiates, with that op's stack: the backward op's own stack is the autograd engine's
// (loss.backward() in a PyTorch run), and the user's line is the forward op's.
TEST_F(KeelCli, InspectOfABackwardNanNamesTheForwardOpAndItsStack) {
  ASSERT_EQ(
      record("b.db", "--steps 1 --stats --stacks", "KEEL_TEST_PERTURB=silu_backward:1:nan").status,
      0);
  keel::storage::Recording rec = keel::storage::Recording::open(path("b.db"));
  const auto bad = rec.firstNonFinite();
  ASSERT_TRUE(bad.has_value());
  ASSERT_EQ(bad->name, "silu_backward");
  ASSERT_NE(bad->forwardSeq, 0u);
  const auto fwd = rec.op(bad->forwardSeq);
  ASSERT_TRUE(fwd.has_value());
  ASSERT_GE(fwd->stackId, 0);
  const CliResult r = keel("inspect '" + path("b.db") + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string line = "\n  gradient of forward op #" + std::to_string(fwd->seq) +
                           " silu in step 1, scope '" + fwd->scope + "'\n  its stack:\n    ";
  EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  EXPECT_NE(r.out.find("keel::ops::silu(keel::Tensor const&)", r.out.find(line)), std::string::npos)
      << r.out;
}

// keel diff says what its root means where that is the diagnosis: same inputs and the same kernel
// (not arithmetic: nondeterminism or a bug), an op without inputs (its values come from its
// attributes or the random stream: "its inputs all match" was vacuous), and one file given twice.
TEST_F(KeelCli, DiffSaysWhatItsRootMeans) {
  ASSERT_EQ(record("a.db", "--seed 1 --md5 --stats").status, 0);
  ASSERT_EQ(record("p.db", "--seed 1 --md5 --stats", "KEEL_TEST_PERTURB=matmul:5").status, 0);
  ASSERT_EQ(record("s.db", "--seed 2 --md5 --stats").status, 0);
  const CliResult perturbed = keel("diff '" + path("a.db") + "' '" + path("p.db") + "'");
  EXPECT_EQ(perturbed.status, 1) << perturbed.err;
  EXPECT_NE(perturbed.out.find("\n  same kernel variant: "), std::string::npos) << perturbed.out;
  EXPECT_NE(perturbed.out.find("\n  same inputs and the same kernel: not arithmetic, but "
                               "nondeterminism or a bug in the op (or a perturbation)\n"),
            std::string::npos)
      << perturbed.out;
  const CliResult seeds = keel("diff '" + path("a.db") + "' '" + path("s.db") + "'");
  EXPECT_EQ(seeds.status, 1) << seeds.err;
  EXPECT_NE(seeds.out.find("\n  no inputs: its values come from its attributes or the random "
                           "stream (a different seed, or another number of random draws before "
                           "it)\n"),
            std::string::npos)
      << seeds.out;
  EXPECT_NE(seeds.out.find("\nroot divergence: the first divergence (it has no inputs)\n"),
            std::string::npos)
      << seeds.out;
  // A backward root: one stack where both runs have the same frames, and the forward op it
  // differentiates with that op's stack (where the user's code is).
  ASSERT_EQ(record("k.db", "--seed 1 --md5 --stats --stacks").status, 0);
  ASSERT_EQ(
      record("kb.db", "--seed 1 --md5 --stats --stacks", "KEEL_TEST_PERTURB=layer_norm_backward:1")
          .status,
      0);
  const CliResult backward = keel("diff '" + path("k.db") + "' '" + path("kb.db") + "'");
  EXPECT_EQ(backward.status, 1) << backward.err;
  EXPECT_NE(backward.out.find("\n  A and B stack:\n"), std::string::npos) << backward.out;
  EXPECT_EQ(backward.out.find("\n  A stack:\n"), std::string::npos) << backward.out;
  const size_t forward = backward.out.find("\n  gradient of forward op #");
  ASSERT_NE(forward, std::string::npos) << backward.out;
  EXPECT_NE(backward.out.find(" layer_norm (", forward), std::string::npos) << backward.out;
  EXPECT_NE(backward.out.find(") in A:\n  its stack:\n    ", forward), std::string::npos)
      << backward.out;
  // A difference entering from outside what one side recorded (--scope) may come from an op
  // its filter left out: said beside "different parameters or data".
  ASSERT_EQ(record("sc.db", "--seed 1 --md5 --stats --scope blocks.1", "KEEL_TEST_PERTURB=matmul:5")
                .status,
            0);
  const CliResult scoped = keel("diff '" + path("a.db") + "' '" + path("sc.db") + "'");
  EXPECT_NE(scoped.out.find("the runs start from different parameters or data; or the difference "
                            "comes from an op outside what was recorded (B recorded only --scope "
                            "blocks.1: record both without it to see))\n"),
            std::string::npos)
      << scoped.out;
  // A mask made from the config: the no-root reason names the configs' difference.
  std::string config =
      keel::readFile(std::string(KEEL_SOURCE_DIR) + "/tests/fixtures/gpt-tiny.json");
  config.insert(config.find('{') + 1,
                "\"attention_mask\": \"sliding_window\", \"attention_window\": 4,");
  std::ofstream(path("sw.json")) << config;
  ASSERT_EQ(keel("record --config '" + path("sw.json") + "' --steps 1 --seed 1 --md5 --stats -o '" +
                 path("sw.db") + "'")
                .status,
            0);
  const CliResult masked = keel("diff '" + path("a.db") + "' '" + path("sw.db") + "'");
  EXPECT_NE(masked.out.find("; the configs differ (attention_mask - vs \"sliding_window\", "
                            "attention_window - vs 4), and what is made from them)\n"),
            std::string::npos)
      << masked.out;
  const CliResult self = keel("diff '" + path("a.db") + "' '" + dir_.string() + "/./a.db'");
  EXPECT_EQ(self.status, 0) << self.err;
  EXPECT_EQ(self.err, "keel: warning: A and B are the same file (" + dir_.string() +
                          "/./a.db): the recording is compared with itself\n");
}

// keel memory stats of a recording that starts at --step-range's first step names the allocator
// the run used and says what was live then; an event asked twice is one column. Its figures at
// the end are the whole run's (Note [A step range's first step]: the allocator's state at the
// range's start opens the recording): they counted only what came after (largest free block 0,
// fragmentation 100%), for the caching allocator as for the VMM.
TEST_F(KeelCli, MemoryStatsOfAStepRangeAreTheWholeRunsFigures) {
  for (const std::string alloc : {"vmm", "caching"}) {
    SCOPED_TRACE(alloc);
    const std::string sr = alloc + "-sr.db", all = alloc + "-all.db";
    ASSERT_EQ(record(sr, "--steps 3 --allocator --step-range 2:3 --alloc " + alloc).status, 0);
    ASSERT_EQ(record(all, "--steps 3 --allocator --alloc " + alloc).status, 0);
    const CliResult r = keel("memory stats '" + path(sr) + "' --event 0 --event 0");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find(" allocator events, " + alloc + " allocator\n"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("\nnote: recorded from step 2 (--step-range): the "), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find(" live blocks ("), std::string::npos) << r.out;
    const size_t first = r.out.find("after (event 0)");
    ASSERT_NE(first, std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("after (event 0)", first + 1), std::string::npos) << r.out;
    // The end column of each figure, as the whole run's.
    const CliResult a = keel("memory stats '" + path(sr) + "'");
    const CliResult b = keel("memory stats '" + path(all) + "'");
    ASSERT_EQ(a.status, 0) << a.err;
    ASSERT_EQ(b.status, 0) << b.err;
    auto endColumn = [](const std::string& out) {
      std::vector<std::string> rows;
      std::istringstream in(out);
      for (std::string line; std::getline(in, line);)
        if (line.find("  ") != std::string::npos && line.rfind("note", 0) != 0 &&
            line.find("event") == std::string::npos)
          rows.push_back(line.substr(line.find_last_of(' ') + 1) + " " + line.substr(0, 26));
      return rows;
    };
    const std::vector<std::string> ra = endColumn(a.out), rb = endColumn(b.out);
    ASSERT_EQ(ra.size(), 7u) << a.out;
    EXPECT_EQ(ra, rb) << a.out << b.out;
    // It opens with the allocator's state at step 2, the parameters among it.
    keel::storage::Recording rec = keel::storage::Recording::open(path(sr));
    const std::vector<keel::storage::MemRecord> ev = rec.memEvents({});
    ASSERT_FALSE(ev.empty());
    EXPECT_EQ(ev.front().label, keel::storage::kLiveBefore);
    EXPECT_EQ(ev.front().step, 2);
    int parameters = 0;
    for (const auto& e : ev)
      if (e.label == keel::storage::kLiveBefore && e.tag == keel::MemTag::Parameter) ++parameters;
    EXPECT_GT(parameters, 0);
  }
  // The plain host allocator has no block list to write: the note says what that leaves out.
  ASSERT_EQ(record("host.db", "--steps 3 --allocator --step-range 2:3 --alloc host").status, 0);
  const CliResult h = keel("memory stats '" + path("host.db") + "'");
  ASSERT_EQ(h.status, 0) << h.err;
  EXPECT_NE(h.out.find("\nnote: recorded from step 2 (--step-range): the host allocator keeps no "
                       "list of its blocks"),
            std::string::npos)
      << h.out;
}

// keel memory trace of a config is the allocation trace of the run keel record records with the
// same options: its seed defaulted to 1 where record's is 0, so a MoE's routing, and the trace's
// sizes, differed (frag@peak 39.09% against the recording's 38.57% on moe-tiny).
TEST_F(KeelCli, MemoryTraceTracesTheRunKeelRecordRecords) {
  const std::string cfg = "--config tests/fixtures/moe-tiny.json --steps 2";
  ASSERT_EQ(keel("memory trace '" + path("t.txt") + "' " + cfg).status, 0);
  ASSERT_EQ(keel("record " + cfg + " --allocator -o '" + path("r.db") + "'").status, 0);
  auto figures = [&](const std::string& file) {  // the caching row less its ns/call
    const CliResult r = keel("memory replay '" + path(file) + "' --allocator caching");
    EXPECT_EQ(r.status, 0) << r.err;
    const size_t row = r.out.find("\ncaching ");
    const std::string line = r.out.substr(row + 1, r.out.find('\n', row + 1) - row - 1);
    return line.substr(0, line.find_last_not_of("0123456789. ") + 1);
  };
  const std::string trace = figures("t.txt");
  EXPECT_EQ(trace.rfind("caching ", 0), 0u) << trace;
  EXPECT_EQ(trace, figures("r.db"));
  // The installed keel's bench finds its config beside it; the build tree's names what is missing.
  const CliResult bench = keel("bench allocator --steps 1", "env -C /");
  EXPECT_EQ(bench.status, 2);
  EXPECT_NE(
      bench.err.find("keel bench allocator: no configs/moe-mini.json here, nor installed at "),
      std::string::npos)
      << bench.err;
}

// keel memory replay --limit answers "would this run fit, on which allocator?" (Note [Replay under
// a limit]): moe-mini's step under 80 MiB runs the caching allocator out of memory (it reserves
// 90 MiB) and fits the VMM's 74 MiB, and the line names the event refused, its step and bytes.
// A trace without allocations, and a limit that is not a positive byte count, are errors.
TEST_F(KeelCli, MemoryReplayUnderALimitSaysWhereEachAllocatorRunsOut) {
  ASSERT_EQ(
      keel("memory trace '" + path("m.txt") + "' --config configs/moe-mini.json --steps 1").status,
      0);
  const CliResult r = keel("memory replay '" + path("m.txt") + "' --limit 80M");
  ASSERT_EQ(r.status, 0) << r.err;
  // The row of an allocator that ran out has its peaks up to there and "-" for its end and cost.
  const size_t row = r.out.find("\ncaching ");
  ASSERT_NE(row, std::string::npos) << r.out;
  const std::string caching = r.out.substr(row + 1, r.out.find('\n', row + 1) - row - 1);
  EXPECT_NE(caching.find(" 80.0 MiB    18.76%          - "), std::string::npos) << caching;
  EXPECT_EQ(caching.substr(caching.size() - 2), " -") << caching;
  EXPECT_NE(r.out.find("\nvmm            73.1 MiB     74.0 MiB     1.22%     68.68% "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\nunder a limit of 80.0 MiB (83886080 bytes):\n  caching: out of memory "
                       "at event "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\n  vmm: fits (peak reserved 74.0 MiB)\n"), std::string::npos) << r.out;
  // The event named is the trace's: its line is an allocation of the bytes named, in step 1.
  const std::string at = "caching: out of memory at event ";
  const size_t k = std::stoul(r.out.substr(r.out.find(at) + at.size()));
  const std::string bytes = r.out.substr(r.out.find(" (", r.out.find(at) + at.size() + 12) + 2);
  std::ifstream trace(path("m.txt"));
  std::vector<std::string> events;
  for (std::string line; std::getline(trace, line);)
    if (!line.empty() && line[0] != '#') events.push_back(line);
  ASSERT_LT(k, events.size());
  EXPECT_EQ(events[k].substr(0, 2), "a ") << events[k];
  EXPECT_EQ(events[k].substr(events[k].rfind(' ') + 1), bytes.substr(0, bytes.find(' ')))
      << events[k] << " / " << bytes;
  EXPECT_NE(r.out.find("at event " + std::to_string(k) + " of " + std::to_string(events.size()) +
                       " (step 1): "),
            std::string::npos)
      << r.out;
  expectOneLineError(keel("memory replay '" + path("m.txt") + "' --limit 0"),
                     "--limit: must be a whole number ≥ 1, got '0'");
  std::ofstream(path("empty.txt")) << "# keel allocation trace\ns 1\n";
  expectOneLineError(keel("memory replay '" + path("empty.txt") + "'"),
                     path("empty.txt") + " has no allocations to replay");
}

// keel record's summary says which steps' ops a --step-range kept (it said "recorded 3 steps" of
// a recording holding the ops of 2), in the singular where it is one.
TEST_F(KeelCli, TheSummaryOfAStepRangeSaysWhichStepsOpsItHolds) {
  const CliResult r = record("r.db", "--steps 3 --step-range 2:2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("recorded 3 steps (ops of steps 2 to 2: --step-range), "), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(", 1 log line, 0 memory events, 0 dumps"), std::string::npos) << r.out;
}

// --track-memory's section of a step starts in that step: the first step of a --step-range had
// an end but no begin (the paused recorder dropped it), and every other begin was tagged with the
// step before.
TEST_F(KeelCli, TrackedStepsOfAStepRangeAreWhole) {
  ASSERT_EQ(record("t.db", "--steps 3 --allocator --step-range 2:3 --track-memory").status, 0);
  keel::storage::Recording rec = keel::storage::Recording::open(path("t.db"));
  std::vector<std::string> marks;
  for (const auto& e : rec.memEvents({}))
    if (e.kind == keel::MemEventKind::TrackBegin || e.kind == keel::MemEventKind::TrackEnd)
      marks.push_back(std::string(keel::memEventName(e.kind)) + " " + e.label + " @" +
                      std::to_string(e.step));
  EXPECT_EQ(marks, (std::vector<std::string>{"track_begin step 2 @2", "track_end step 2 @2",
                                             "track_begin step 3 @3", "track_end step 3 @3"}));
}

// Choosing what to dump asks for dumps: --dump-ops without --dumps stored nothing.
TEST_F(KeelCli, ADumpChoiceImpliesDumps) {
  ASSERT_EQ(record("d.db", "--steps 1 --dump-ops matmul").status, 0);
  keel::storage::Recording rec = keel::storage::Recording::open(path("d.db"));
  int matmuls = 0, dumped = 0, others = 0;
  for (const auto& o : rec.allOps()) {
    const bool has = !rec.dumps(o.seq).empty();
    if (o.name == "matmul") {
      ++matmuls;
      dumped += has;
    } else {
      others += has;
    }
  }
  EXPECT_GT(matmuls, 0);
  EXPECT_EQ(dumped, matmuls);
  EXPECT_EQ(others, 0);
}

// `keel train --save-inputs DIR` (Note [Training inputs]): the initial weights as a resumable
// checkpoint and every step's batch, which are the batches the run then trains on; an existing
// non-empty DIR, a multi-step check, and `keel diff --align` with a bad value are one line.
TEST_F(KeelCli, SaveInputsWritesTheWeightsAndTheBatchesTheRunTrainsOn) {
  const std::string in = path("inputs");
  CliResult r = keel(
      "train --config tests/fixtures/gpt-tiny.json --steps 3 --seed 5 "
      "--eval-batches 0 --save-inputs '" +
      in + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("/batches.safetensors (3 steps' batches)"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::is_regular_file(fs::path(in) / "init" / "keel-checkpoint.json"));
  // Resuming from the saved weights trains the same three steps: same losses.
  CliResult resumed = keel(
      "train --config tests/fixtures/gpt-tiny.json --steps 3 --seed 5 "
      "--eval-batches 0 --resume '" +
      in + "/init'");
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  auto losses = [](const std::string& out) {
    std::vector<std::string> v;
    for (size_t at = out.find("loss "); at != std::string::npos; at = out.find("loss ", at + 1))
      v.push_back(out.substr(at, 11));
    return v;
  };
  ASSERT_EQ(losses(r.out).size(), 4u) << r.out;  // three steps and the summary
  EXPECT_EQ(losses(resumed.out), losses(r.out));
  // The batches: int64 [3, batch, seq] idx and targets, the targets one token ahead.
  std::ifstream f(in + "/batches.safetensors", std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), static_cast<std::streamsize>(n));
  auto h = nlohmann::json::parse(header);
  EXPECT_EQ(h["idx"]["dtype"], "I64");
  const std::vector<int64_t> shape = h["idx"]["shape"];
  ASSERT_EQ(shape.size(), 3u);
  EXPECT_EQ(shape[0], 3);
  EXPECT_EQ(h["targets"]["shape"], h["idx"]["shape"]);
  std::vector<int64_t> idx(size_t(shape[0] * shape[1] * shape[2])), tgt(idx.size());
  f.seekg(static_cast<std::streamoff>(8 + n + h["idx"]["data_offsets"][0].get<uint64_t>()));
  f.read(reinterpret_cast<char*>(idx.data()), static_cast<std::streamsize>(idx.size() * 8));
  f.seekg(static_cast<std::streamoff>(8 + n + h["targets"]["data_offsets"][0].get<uint64_t>()));
  f.read(reinterpret_cast<char*>(tgt.data()), static_cast<std::streamsize>(tgt.size() * 8));
  for (size_t i = 0; i + 1 < idx.size(); ++i)
    if ((i + 1) % size_t(shape[2]) != 0) {
      ASSERT_EQ(idx[i + 1], tgt[i]) << i;
    }

  // An existing non-empty directory is refused and kept.
  expectOneLineError(
      keel("train --config tests/fixtures/gpt-tiny.json --steps 1 --save-inputs '" + in + "'"),
      "not an empty directory");
  EXPECT_TRUE(fs::is_regular_file(fs::path(in) / "batches.safetensors"));
  // The whole choice list, in words (CLI11's enum transformer printed the enum's raw bytes, a
  // NUL among them, which cut the line short).
  expectOneLineError(keel("diff '" + path("a.db") + "' '" + path("b.db") + "' --align bogus"),
                     "--align: bogus not in {auto,signature,module}");
  const CliResult help = keel("diff --help");
  EXPECT_NE(help.out.find("--align TEXT:{auto,signature,module}=auto"), std::string::npos)
      << help.out;
  EXPECT_EQ(help.out.find('\0'), std::string::npos);
}

// Each step of a recording carries what the trainer printed (lr, gradient norm, tokens/s, MoE aux
// loss) and one log line, so the studio's metrics plot and log view have them for any run.
TEST_F(KeelCli, StepsCarryTheTrainersMetricsAndALogLine) {
  CliResult train = keel("train --config tests/fixtures/gpt-tiny.json --steps 2 --seed 3");
  ASSERT_EQ(train.status, 0) << train.err;
  ASSERT_EQ(record("dense.db", "--seed 3").status, 0);
  keel::storage::Recording rec = keel::storage::Recording::open(path("dense.db"));
  const auto steps = rec.steps();
  ASSERT_EQ(steps.size(), 2u);
  // gpt-tiny: lr 1e-2 warmed up over 5 steps.
  EXPECT_DOUBLE_EQ(steps[0].lr, 1e-2 * 1 / 5);
  EXPECT_DOUBLE_EQ(steps[1].lr, 1e-2 * 2 / 5);
  const auto logs = rec.logs({});
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& s = steps[i];
    SCOPED_TRACE(s.step);
    EXPECT_TRUE(std::isnan(s.auxLoss));  // dense: no aux loss (NULL, not 0)
    EXPECT_GT(s.tokensPerSec, 0.0);
    // The same gradient norm and loss keel train printed for the same seed.
    char want[96];
    std::snprintf(want, sizeof want, "step %lld/2  loss %.4f  lr %.3e  gnorm %.3f",
                  static_cast<long long>(s.step), s.loss, s.lr, s.gradNorm);
    EXPECT_NE(train.out.find(want), std::string::npos) << want << "\n" << train.out;
    std::snprintf(want, sizeof want, "step %lld: loss %.4f, lr %.3g, grad norm %.4g, ",
                  static_cast<long long>(s.step), s.loss, s.lr, s.gradNorm);
    int found = 0;
    for (const auto& l : logs)
      if (l.scope == "train" && l.message.rfind(want, 0) == 0 && l.step == s.step) ++found;
    EXPECT_EQ(found, 1) << want;
  }
  CliResult moe =
      keel("record --config tests/fixtures/moe-tiny.json --steps 1 -o '" + path("moe.db") + "'");
  ASSERT_EQ(moe.status, 0) << moe.err;
  const auto moeSteps = keel::storage::Recording::open(path("moe.db")).steps();
  ASSERT_EQ(moeSteps.size(), 1u);
  EXPECT_GT(moeSteps[0].auxLoss, 0.0);
}

// A config with eval_every: keel train prints the validation loss on those steps, and the
// recording keeps the same value per step (NULL on the others), for the studio's metrics plot.
TEST_F(KeelCli, EvalEveryRecordsTheValidationLossPerStep) {
  nlohmann::json cfg = nlohmann::json::parse(
      std::ifstream(std::string(KEEL_SOURCE_DIR) + "/tests/fixtures/gpt-tiny.json"));
  cfg["eval_every"] = 2;
  cfg["eval_batches"] = 2;
  const std::string config = path("eval.json");
  std::ofstream(config) << cfg.dump();
  CliResult train = keel("train --config '" + config + "' --steps 4 --seed 3");
  ASSERT_EQ(train.status, 0) << train.err;
  CliResult rec =
      keel("record --config '" + config + "' --steps 4 --seed 3 -o '" + path("e.db") + "'");
  ASSERT_EQ(rec.status, 0) << rec.err;
  const auto steps = keel::storage::Recording::open(path("e.db")).steps();
  ASSERT_EQ(steps.size(), 4u);
  for (const auto& s : steps) {
    SCOPED_TRACE(s.step);
    EXPECT_EQ(std::isnan(s.valLoss), s.step % 2 != 0);
    if (std::isnan(s.valLoss)) continue;
    char want[64];
    std::snprintf(want, sizeof want, "tok/s  val %.4f\n", s.valLoss);
    EXPECT_NE(train.out.find(want), std::string::npos) << want << "\n" << train.out;
  }
  int printed = 0;  // steps 2 and 4 only
  for (size_t at = train.out.find("  val "); at != std::string::npos;
       at = train.out.find("  val ", at + 1))
    ++printed;
  EXPECT_EQ(printed, 2) << train.out;
}

}  // namespace
