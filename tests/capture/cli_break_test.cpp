// `keel record --break-on` through the real binary, and capture::BreakSpec / RecordingRun in
// process: a headless "stop at the first NaN" — the run stops after the op that meets the
// condition, keeps everything recorded up to it (status "stopped: ..."), prints where in one line
// and exits 1; bad conditions are one error line and exit 2 before any file is made.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include "keel/capture/recording_run.h"
#include "keel/error.h"
#include "keel/log.h"
#include "keel/storage/diff.h"
#include "keel/storage/reader.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using keel::test::CliResult;
using keel::test::expectOneLineError;

class BreakOn : public keel::test::KeelCliTest {
 protected:
  CliResult record(const std::string& out, const std::string& extra, const std::string& env = "") {
    return keel(
        "record --config tests/fixtures/gpt-tiny.json --steps 2 --seed 4 --md5 --stats -o '" +
            path(out) + "' " + extra,
        env);
  }
  // The "keel record: stopped at op #N (step S): reason" line.
  static std::string stopLine(const CliResult& r) {
    const size_t at = r.out.find("keel record: stopped at op #");
    return at == std::string::npos ? std::string() : r.out.substr(at, r.out.find('\n', at) - at);
  }
  static uint64_t lastSeq(const keel::storage::Recording& rec) {
    uint64_t last = 0;
    for (const auto& o : rec.allOps()) last = std::max(last, o.seq);
    return last;
  }
};

TEST(BreakSpec, ParsesEachConditionAndRejectsTheRest) {
  using Kind = keel::capture::BreakCondition::Kind;
  keel::capture::BreakSpec s;
  EXPECT_FALSE(s.any());
  for (const char* item :
       {"nan", "op:matmul", "scope:blocks.1", "md5-ref:ref.db", "step:3", "grad-norm>2.5",
        "loss>1.5*mean", "op:matmul@3", "md5-ref:a@b.db", "op:matmul in blocks.0.mlp.w2@2"})
    s.add(item);
  ASSERT_EQ(s.conditions.size(), 10u);
  EXPECT_EQ(s.conditions[9].text, "matmul");
  EXPECT_EQ(s.conditions[9].scope, "blocks.0.mlp.w2");
  EXPECT_EQ(s.conditions[9].hitCount, 2);
  EXPECT_TRUE(s.any());
  const Kind kinds[] = {Kind::NonFinite, Kind::Op,        Kind::Scope, Kind::Md5Ref, Kind::Step,
                        Kind::GradNorm,  Kind::LossSpike, Kind::Op,    Kind::Md5Ref};
  for (size_t i = 0; i < 9; ++i) EXPECT_EQ(s.conditions[i].kind, kinds[i]) << i;
  EXPECT_EQ(s.conditions[1].text, "matmul");
  EXPECT_EQ(s.conditions[2].text, "blocks.1");
  EXPECT_EQ(s.conditions[3].text, "ref.db");
  EXPECT_EQ(s.conditions[4].value, 3);
  EXPECT_EQ(s.conditions[5].value, 2.5);
  EXPECT_EQ(s.conditions[6].value, 1.5);
  EXPECT_EQ(s.conditions[7].hitCount, 3);
  EXPECT_EQ(s.conditions[8].text, "a@b.db");
  // item() writes what parse() reads.
  for (const auto& c : s.conditions)
    EXPECT_EQ(keel::capture::BreakCondition::parse(c.item()), c) << c.item();
  // Disabled conditions do not count.
  keel::capture::BreakSpec off;
  off.add("nan");
  off.conditions[0].enabled = false;
  EXPECT_FALSE(off.any());
  for (const char* bad : {"", "nope", "op:", "op:no_such_op", "scope:", "md5-ref:", "NaN",
                          "step:", "step:0", "step:1.5", "step:x", "grad-norm>", "grad-norm>-1",
                          "loss>2", "loss>*mean", "loss>0*mean", "op:matmul@0", "op:matmul in "}) {
    keel::capture::BreakSpec b;
    EXPECT_THROW(b.add(bad), keel::Error) << bad;
  }
}

// step:N stops at the end of step N: the step is complete, the next never starts.
TEST_F(BreakOn, StepStopsAtTheEndOfThatStep) {
  CliResult r = record("step.db", "--steps 3 --break-on step:2");
  ASSERT_EQ(r.status, 1) << r.out << r.err;
  keel::storage::Recording rec = keel::storage::Recording::open(path("step.db"));
  ASSERT_EQ(rec.steps().size(), 2u);
  EXPECT_GT(rec.steps()[1].endNs, 0);
  const auto ops = rec.stepOps(2);
  ASSERT_FALSE(ops.empty());
  EXPECT_EQ(lastSeq(rec), ops.back().seq);
  EXPECT_NE(stopLine(r).find("(step 2): breakpoint: step 2"), std::string::npos) << r.out;
  EXPECT_EQ(rec.run().status, "stopped: breakpoint: step 2");
}

// grad-norm>X and loss>K*mean read the step's metrics at its end; a hit count skips hits.
TEST_F(BreakOn, GradNormLossSpikeAndHitCountUseTheStepsMetrics) {
  ASSERT_EQ(record("clean.db", "--steps 3").status, 0);
  keel::storage::Recording clean = keel::storage::Recording::open(path("clean.db"));
  ASSERT_EQ(clean.steps().size(), 3u);
  const double g1 = clean.steps()[0].gradNorm, g2 = clean.steps()[1].gradNorm;
  ASSERT_TRUE(std::isfinite(g1) && std::isfinite(g2));
  // A threshold below step 1's norm stops at step 1.
  CliResult r = record("g.db", "--steps 3 --break-on 'grad-norm>" + std::to_string(g1 / 2) + "'");
  ASSERT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(stopLine(r).find("(step 1): breakpoint: gradient norm "), std::string::npos) << r.out;
  EXPECT_EQ(keel::storage::Recording::open(path("g.db")).steps().size(), 1u);
  // ... and with @2 at the second step above it.
  r = record("g2.db",
             "--steps 3 --break-on 'grad-norm>" + std::to_string(std::min(g1, g2) / 2) + "@2'");
  ASSERT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(stopLine(r).find("(step 2): breakpoint: gradient norm "), std::string::npos) << r.out;
  EXPECT_NE(stopLine(r).find("(hit 2)"), std::string::npos) << r.out;
  // A threshold above every norm never stops.
  r = record("g3.db", "--steps 3 --break-on 'grad-norm>1e9'");
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  // The loss of step 2 is above a tiny multiple of step 1's: the first step with a mean.
  r = record("l.db", "--steps 3 --break-on 'loss>0.001*mean'");
  ASSERT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(stopLine(r).find("(step 2): breakpoint: loss "), std::string::npos) << r.out;
  r = record("l2.db", "--steps 3 --break-on 'loss>100*mean'");
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  // op:cross_entropy@2: the second call (step 2's), not the first.
  r = record("ce.db", "--break-on op:cross_entropy@2");
  ASSERT_EQ(r.status, 1) << r.out << r.err;
  keel::storage::Recording ce = keel::storage::Recording::open(path("ce.db"));
  uint64_t second = 0;
  int n = 0;
  for (const auto& o : ce.allOps())
    if (o.name == "cross_entropy" && ++n == 2) second = o.seq;
  ASSERT_NE(second, 0u);
  EXPECT_EQ(lastSeq(ce), second);
  EXPECT_NE(stopLine(r).find("(step 2): breakpoint: op cross_entropy (hit 2)"), std::string::npos)
      << r.out;
}

// A NaN is past any bound: guards on the gradient norm and the loss stop on it (they let a run
// that was NaN from step 1 finish with status 0). The 20th matmul is in step 1's backward: the
// norm is NaN at step 1, the loss from step 2 on.
TEST_F(BreakOn, GradNormAndLossGuardsStopOnNaN) {
  CliResult r =
      record("g.db", "--steps 3 --break-on 'grad-norm>100'", "KEEL_TEST_PERTURB=matmul:20:nan");
  ASSERT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(stopLine(r).find("(step 1): breakpoint: gradient norm NaN (bound 100) at step 1"),
            std::string::npos)
      << r.out;
  r = record("l.db", "--steps 3 --break-on 'loss>2*mean'", "KEEL_TEST_PERTURB=matmul:20:nan");
  ASSERT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(stopLine(r).find("(step 2): breakpoint: loss NaN (not finite) at step 2"),
            std::string::npos)
      << r.out;
  keel::storage::Recording rec = keel::storage::Recording::open(path("l.db"));
  ASSERT_EQ(rec.steps().size(), 2u);
  EXPECT_TRUE(std::isnan(rec.steps()[1].loss));
  // keel inspect prints the ended NaN step's loss as NaN, not as an incomplete step.
  const CliResult inspect = keel("inspect '" + path("l.db") + "'");
  ASSERT_EQ(inspect.status, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("  step 2    loss NaN  "), std::string::npos) << inspect.out;
  EXPECT_EQ(inspect.out.find("(incomplete)"), std::string::npos) << inspect.out;
  // Each step's line is a warning once its gradient norm or loss is NaN (it was info: the log
  // view showed "loss nan, grad norm nan" as an ordinary line).
  std::vector<std::string> levels;
  for (const auto& l : rec.logs({}))
    if (l.scope == "train") levels.push_back(std::string(keel::logLevelName(l.level)));
  EXPECT_EQ(levels, (std::vector<std::string>{"warn", "warn"}));
}

// The CI use: stop at the first NaN, keep everything, say where, exit 1.
TEST_F(BreakOn, NanStopsAfterTheFirstNonFiniteOpAndKeepsTheRecording) {
  CliResult r = record("nan.db", "--break-on nan", "KEEL_TEST_PERTURB=matmul:20:nan");
  ASSERT_EQ(r.status, 1) << r.out << r.err;
  keel::storage::Recording rec = keel::storage::Recording::open(path("nan.db"));
  const auto first = rec.firstNonFinite();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->name, "matmul");
  // Stopped right after it: it is the last op recorded, and the line names it.
  EXPECT_EQ(lastSeq(rec), first->seq);
  const std::string line = stopLine(r);
  EXPECT_EQ(line.rfind("keel record: stopped at op #" + std::to_string(first->seq) +
                           " (step 1): " + "breakpoint: first NaN/Inf (output 0 of matmul: ",
                       0),
            0u)
      << r.out;
  EXPECT_EQ(rec.run().status.rfind("stopped: breakpoint: first NaN/Inf", 0), 0u)
      << rec.run().status;
  EXPECT_TRUE(r.err.empty()) << r.err;

  // @2: the second op that writes a NaN, not "the first" (hit 2).
  r = record("nan2.db", "--break-on nan@2", "KEEL_TEST_PERTURB=matmul:20:nan");
  ASSERT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(stopLine(r).find("(step 1): breakpoint: NaN/Inf (output 0 of "), std::string::npos)
      << r.out;
  EXPECT_NE(stopLine(r).find(") (hit 2)"), std::string::npos) << r.out;
  EXPECT_GT(lastSeq(keel::storage::Recording::open(path("nan2.db"))), first->seq);
}

// An optimizer step that writes a NaN into a parameter (adamw_step has no outputs: it writes its
// inputs): --break-on nan stops there, at the op inspect names, not a step later.
TEST_F(BreakOn, NanWrittenByTheOptimizerStopsAtThatUpdate) {
  CliResult r = record("opt.db", "--break-on nan", "KEEL_TEST_PERTURB=adamw_step:3:nan");
  ASSERT_EQ(r.status, 1) << r.out << r.err;
  keel::storage::Recording rec = keel::storage::Recording::open(path("opt.db"));
  const auto first = rec.firstNonFinite();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->name, "adamw_step");
  EXPECT_EQ(lastSeq(rec), first->seq);
  EXPECT_EQ(stopLine(r).rfind("keel record: stopped at op #" + std::to_string(first->seq) +
                                  " (step 1): breakpoint: first NaN/Inf (input 0 (written) of "
                                  "adamw_step: 1 NaN, 0 Inf)",
                              0),
            0u)
      << r.out;
}

TEST_F(BreakOn, OpAndScopeStopAtTheirFirstMatch) {
  CliResult r = record("op.db", "--break-on op:cross_entropy");
  ASSERT_EQ(r.status, 1) << r.out << r.err;
  keel::storage::Recording rec = keel::storage::Recording::open(path("op.db"));
  uint64_t firstCe = 0;
  for (const auto& o : rec.allOps())
    if (o.name == "cross_entropy" && !firstCe) firstCe = o.seq;
  ASSERT_NE(firstCe, 0u);
  EXPECT_EQ(lastSeq(rec), firstCe);
  EXPECT_NE(stopLine(r).find("(step 1): breakpoint: op cross_entropy"), std::string::npos) << r.out;

  r = record("scope.db", "--break-on scope:blocks.1");
  ASSERT_EQ(r.status, 1) << r.out << r.err;
  keel::storage::Recording rec2 = keel::storage::Recording::open(path("scope.db"));
  const auto ops = rec2.allOps();
  ASSERT_FALSE(ops.empty());
  uint64_t firstInScope = 0;
  for (const auto& o : ops)
    if (o.step == 1 && keel::scopeWithin(o.scope, "blocks.1") && !firstInScope)
      firstInScope = o.seq;
  EXPECT_EQ(lastSeq(rec2), firstInScope);
  EXPECT_NE(stopLine(r).find("breakpoint: scope blocks.1"), std::string::npos) << r.out;

  // "op:NAME in SCOPE" (the studio's Break here): that op in exactly that scope.
  r = record("here.db", "--break-on 'op:matmul in blocks.0.mlp.w2'");
  ASSERT_EQ(r.status, 1) << r.out << r.err;
  keel::storage::Recording rec3 = keel::storage::Recording::open(path("here.db"));
  uint64_t here = 0;
  for (const auto& o : rec3.allOps())
    if (o.step == 1 && o.name == "matmul" && o.scope == "blocks.0.mlp.w2" && !here) here = o.seq;
  ASSERT_NE(here, 0u);
  EXPECT_EQ(lastSeq(rec3), here);
  EXPECT_NE(stopLine(r).find("breakpoint: op matmul in blocks.0.mlp.w2"), std::string::npos)
      << r.out;
}

// Against a clean reference, a perturbed run stops at the op the diff calls the first divergence.
TEST_F(BreakOn, Md5RefStopsAtTheFirstDivergence) {
  ASSERT_EQ(record("clean.db", "").status, 0);
  CliResult r = record("pert.db", "--break-on md5-ref:'" + path("clean.db") + "'",
                       "KEEL_TEST_PERTURB=matmul:5");
  ASSERT_EQ(r.status, 1) << r.out << r.err;
  keel::storage::Recording clean = keel::storage::Recording::open(path("clean.db"));
  keel::storage::Recording pert = keel::storage::Recording::open(path("pert.db"));
  const auto report = keel::storage::diffRuns(clean.allOps(), pert.allOps());
  ASSERT_TRUE(report.first && report.first->pair.inB);
  EXPECT_EQ(lastSeq(pert), report.first->pair.seqB);
  EXPECT_NE(stopLine(r).find("breakpoint: first MD5 difference from the reference: output 0 of "
                             "matmul"),
            std::string::npos)
      << r.out;
}

// A run longer than its reference stops where the reference ends, saying so (it said "op #N
// (arange) is not in the reference recording").
TEST_F(BreakOn, Md5RefPastTheReferencesEndSaysTheReferenceEnds) {
  ASSERT_EQ(keel("record --config tests/fixtures/gpt-tiny.json --steps 1 --seed 4 --md5 -o '" +
                 path("short.db") + "'")
                .status,
            0);
  keel::storage::Recording shortRef = keel::storage::Recording::open(path("short.db"));
  const uint64_t ops = uint64_t(shortRef.opCount());
  CliResult r = record("long.db", "--break-on md5-ref:'" + path("short.db") + "'");
  ASSERT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(stopLine(r).find("breakpoint: the reference recording ends before op #" +
                             std::to_string(ops + 1) + " ("),
            std::string::npos)
      << r.out;
  EXPECT_NE(stopLine(r).find("): it holds " + std::to_string(ops) +
                             " ops, to the end of step 1 (record a longer reference to compare "
                             "further)"),
            std::string::npos)
      << r.out;
}

// A reference recorded with another seed differs at the first random op of initialisation:
// a warning says so up front, and the stop there is a stop like any other (exit 1, the recording
// kept, the line naming step 0) -- it was a one-line error that still replaced the output.
TEST_F(BreakOn, Md5RefWithAnotherSeedWarnsAndStopsInInitialisation) {
  ASSERT_EQ(record("ref.db", "").status, 0);
  CliResult r = keel("record --config tests/fixtures/gpt-tiny.json --steps 2 --seed 5 -o '" +
                     path("other.db") + "' --break-on md5-ref:'" + path("ref.db") + "'");
  ASSERT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("was recorded with seed 4 and this run uses seed 5: their MD5s differ from "
                       "the first random op (--seed 4 to follow it)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("error"), std::string::npos) << r.err;
  EXPECT_NE(stopLine(r).find(" (step 0): breakpoint: first MD5 difference from the reference: "),
            std::string::npos)
      << r.out;
  keel::storage::Recording rec = keel::storage::Recording::open(path("other.db"));
  EXPECT_EQ(rec.run().status.rfind("stopped: breakpoint: first MD5 difference", 0), 0u)
      << rec.run().status;
  ASSERT_FALSE(rec.allOps().empty());
  EXPECT_EQ(rec.allOps().back().step, 0);
}

// A reference without MD5s can never differ: refused before anything runs, the output untouched.
TEST_F(BreakOn, Md5RefWithoutMd5sIsRefused) {
  ASSERT_EQ(keel("record --config tests/fixtures/gpt-tiny.json --steps 1 --seed 4 -o '" +
                 path("plain.db") + "'")
                .status,
            0);
  CliResult r = record("out.db", "--break-on md5-ref:'" + path("plain.db") + "'");
  expectOneLineError(r, ": the reference holds no MD5s (record it with --md5 or --all)");
  EXPECT_FALSE(fs::exists(path("out.db")));
}

// A run whose condition never holds finishes normally (exit 0, status finished).
TEST_F(BreakOn, ConditionThatNeverHoldsFinishes) {
  CliResult r = record("ok.db", "--break-on nan");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(stopLine(r), "");
  EXPECT_EQ(keel::storage::Recording::open(path("ok.db")).run().status, "finished");
}

// Bad conditions: one line, exit 2, and no recording made (validated before the output).
TEST_F(BreakOn, BadConditionsAreOneLineErrorsBeforeAnyFile) {
  for (const std::string& bad :
       {std::string("--break-on bogus"), std::string("--break-on op:no_such_op"),
        std::string("--break-on md5-ref:'") + path("missing.db") + "'"}) {
    CliResult r = record("bad.db", bad);
    expectOneLineError(r, "");
    EXPECT_FALSE(fs::exists(path("bad.db"))) << bad;
  }
}

}  // namespace
