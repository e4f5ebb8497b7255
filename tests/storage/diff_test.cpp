// Tests for the run diff engine (storage/src/diff*.cpp): alignment with extra, missing and fused
// ops, tensor verdicts (MD5, rounded MD5, values, stats), first/root divergence and its chain,
// ULP/abs/rel figures on hand-made values, JSON/text output, and the cost on 100,000-op steps.
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "keel/storage/diff.h"
#include "keel/storage/reader.h"
#include "keel/storage/writer.h"
#include "storage_test_util.h"

namespace ks = keel::storage;
using ks::DiffBasis;
using ks::DiffStatus;
using ks::OpRecord;
using ks::Role;
using ks::TensorRecord;

namespace {

const char* const kNames[] = {"matmul", "add", "gelu", "softmax", "layer_norm", "mul"};

TensorRecord tensor(Role role, int32_t index, uint64_t id, uint64_t version, std::string md5,
                    std::vector<int64_t> shape = {4, 8}, std::string dtype = "float32") {
  TensorRecord t;
  t.role = role;
  t.index = index;
  t.tensorId = id;
  t.version = version;
  t.shape = std::move(shape);
  t.dtype = std::move(dtype);
  t.md5 = std::move(md5);
  return t;
}

OpRecord op(uint64_t seq, int64_t step, std::string name, std::vector<TensorRecord> tensors,
            std::string scope = "blocks.0", int64_t stackId = -1) {
  OpRecord o;
  o.seq = seq;
  o.step = step;
  o.phase = keel::Phase::Forward;
  o.name = std::move(name);
  o.scope = std::move(scope);
  o.stackId = stackId;
  o.tensors = std::move(tensors);
  return o;
}

// A linear chain: op i (seq base+i) reads the previous op's output (tensor id 1000+i-1) and a
// parameter (id 5000+i), and writes tensor 1000+i. md5 of output i is "<tag>i" from `changedFrom`
// on (so B can differ from some op onwards), else "m<i>".
std::vector<OpRecord> chain(int n, int64_t step = 1, uint64_t base = 1, int changedFrom = -1,
                            const std::string& tag = "x") {
  std::vector<OpRecord> ops;
  ops.reserve(static_cast<size_t>(n));
  auto md5Of = [&](int i) {
    return (changedFrom >= 0 && i >= changedFrom ? tag : std::string("m")) + std::to_string(i);
  };
  const uint64_t idBase = 1000 + static_cast<uint64_t>(step) * 10'000'000;
  for (int i = 0; i < n; ++i) {
    std::vector<TensorRecord> ts;
    if (i > 0) ts.push_back(tensor(Role::Input, 0, idBase + i - 1, 1, md5Of(i - 1)));
    ts.push_back(tensor(Role::Input, 1, 5000 + i, 1, std::string("p").append(std::to_string(i))));
    ts.push_back(tensor(Role::Output, 0, idBase + i, 1, md5Of(i)));
    ops.push_back(op(base + static_cast<uint64_t>(i), step, kNames[i % 6], std::move(ts),
                     std::string("blocks.").append(std::to_string(i / 60)), 100 + i));
  }
  return ops;
}

const ks::OpPair* pairByA(const ks::DiffReport& r, uint64_t seqA) {
  for (const auto& p : r.pairs)
    if (p.inA && p.seqA == seqA) return &p;
  return nullptr;
}

}  // namespace

TEST(DiffTest, IdenticalRunsAreAllEqualAndExitZero) {
  auto a = chain(50), b = chain(50);
  ks::DiffReport r = ks::diffRuns(a, b);
  EXPECT_EQ(r.total.equal, 50);
  EXPECT_EQ(r.total.diverged + r.total.withinTolerance + r.total.onlyInA + r.total.onlyInB, 0);
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(r.steps[0].alignment, "identical");
  EXPECT_EQ(r.pairs.size(), 50u);
  EXPECT_FALSE(r.first.has_value());
  EXPECT_FALSE(r.root.has_value());
  EXPECT_EQ(ks::diffExitCode(r), 0);
  EXPECT_EQ(r.uncomparedTensors, 0);
}

TEST(DiffTest, PerturbedOutputIsFirstAndRootDivergenceWithChain) {
  const int k = 20;
  auto a = chain(40), b = chain(40, 1, 1, k);
  ks::DiffReport r = ks::diffRuns(a, b);
  EXPECT_EQ(r.total.equal, k);
  EXPECT_EQ(r.total.diverged, 40 - k);
  EXPECT_EQ(ks::diffExitCode(r), 1);
  ASSERT_TRUE(r.first && r.root);
  EXPECT_EQ(r.first->pair.seqA, 1u + k);
  EXPECT_EQ(r.first->pair.seqB, 1u + k);
  EXPECT_EQ(r.root->pair.seqA, 1u + k);
  EXPECT_EQ(r.first->pair.stackIdA, 100 + k);
  ASSERT_EQ(r.first->pair.outputs.size(), 1u);
  EXPECT_EQ(r.first->pair.outputs[0].basis, DiffBasis::Md5Only);
  // Inputs of the root all match (by MD5).
  ASSERT_EQ(r.root->inputs.size(), 2u);
  for (const auto& t : r.root->inputs) EXPECT_EQ(t.status, DiffStatus::Equal);
  // The chain walks producers k-1, k-2, ... (seq k, k-1, ...) up to chainDepth levels.
  ASSERT_EQ(static_cast<int>(r.root->chainA.size()), r.options.chainDepth);
  for (int d = 0; d < r.options.chainDepth; ++d) {
    const ks::ChainLink& l = r.root->chainA[static_cast<size_t>(d)];
    EXPECT_EQ(l.depth, d + 1);
    EXPECT_EQ(l.seq, static_cast<uint64_t>(k - d));
    EXPECT_EQ(l.consumerSeq, static_cast<uint64_t>(k - d + 1));
    EXPECT_EQ(l.consumerInput, 0);
    EXPECT_EQ(l.status, DiffStatus::Equal);
    EXPECT_EQ(l.name, kNames[(k - 1 - d) % 6]);
  }
  EXPECT_EQ(r.root->chainB.size(), r.root->chainA.size());
  // A downstream op has a diverged input: not a root.
  const ks::OpPair* later = pairByA(r, 1 + k + 1);
  ASSERT_NE(later, nullptr);
  EXPECT_EQ(later->status, DiffStatus::Diverged);
}

TEST(DiffTest, RootDivergenceSkipsInheritedDivergence) {
  // op1 reads a parameter that differs between the runs (not produced by any op): it diverges,
  // but not at its own hand. op2 reads equal inputs and diverges: it is the root.
  auto mk = [](const std::string& paramMd5, const std::string& out1, const std::string& out2) {
    std::vector<OpRecord> ops;
    ops.push_back(op(1, 1, "matmul",
                     {tensor(Role::Input, 0, 1, 1, "x"), tensor(Role::Input, 1, 2, 1, paramMd5),
                      tensor(Role::Output, 0, 3, 1, out1)}));
    ops.push_back(
        op(2, 1, "gelu", {tensor(Role::Input, 0, 1, 1, "x"), tensor(Role::Output, 0, 4, 1, out2)}));
    return ops;
  };
  ks::DiffReport r = ks::diffRuns(mk("w", "y", "g"), mk("w'", "y'", "g'"));
  ASSERT_TRUE(r.first && r.root);
  EXPECT_EQ(r.first->pair.seqA, 1u);
  EXPECT_EQ(r.first->inputs[1].status, DiffStatus::Diverged);
  EXPECT_EQ(r.root->pair.seqA, 2u);
  EXPECT_EQ(r.root->pair.name, "gelu");

  // Only the parameter-fed divergence: no root among the ops.
  ks::DiffReport r2 = ks::diffRuns(mk("w", "y", "g"), mk("w'", "y'", "g"));
  ASSERT_TRUE(r2.first);
  EXPECT_TRUE(r2.rootSearched);
  EXPECT_FALSE(r2.root.has_value());
  EXPECT_NE(ks::toText(r2, true).find("root divergence: none found"), std::string::npos);
}

TEST(DiffTest, InputWithoutChecksumsInheritsProducerVerdict) {
  // No MD5 on inputs: op2's input verdict comes from its producer op1 (diverged), so op2 is
  // not a root; op1 is.
  auto mk = [](const std::string& in, const std::string& o1, const std::string& o2) {
    std::vector<OpRecord> ops;
    ops.push_back(
        op(1, 1, "exp", {tensor(Role::Input, 0, 1, 1, in), tensor(Role::Output, 0, 2, 1, o1)}));
    ops.push_back(
        op(2, 1, "log", {tensor(Role::Input, 0, 2, 1, ""), tensor(Role::Output, 0, 3, 1, o2)}));
    return ops;
  };
  ks::DiffReport r = ks::diffRuns(mk("x", "a", "b"), mk("x", "a'", "b'"));
  ASSERT_TRUE(r.root);
  EXPECT_EQ(r.root->pair.seqA, 1u);
  EXPECT_EQ(r.root->inputs[0].basis, DiffBasis::Md5);
  // Note [Root candidates]: an input nothing was recorded of (an integer tensor under --stats)
  // may carry the difference: its op is no root, and the report says which input.
  r = ks::diffRuns(mk("", "a", "b"), mk("", "a'", "b'"));
  ASSERT_TRUE(r.first);
  EXPECT_FALSE(r.root);
  EXPECT_EQ(r.noRoot,
            "input 0 of the first divergence (#1 exp, float32) was not compared: nothing was "
            "recorded of it (statistics cover floating-point tensors; record with --md5 or "
            "--all), and the difference may enter through it");
  const std::string text = ks::toText(r, true);
  EXPECT_NE(text.find("  input 0: not compared (nothing recorded)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("root divergence: none found (input 0 of the first divergence (#1 exp, "),
            std::string::npos)
      << text;
  EXPECT_EQ(nlohmann::json::parse(ks::toJson(r))["noRootReason"], r.noRoot);
}

// Note [Root candidates]: different data enters at op 1; op 2 passes within tolerance (its rounded
// MD5s agree) and op 3 diverges again. Op 3's input passed, but only as what op 1's difference
// became: op 3 is no root, and none is named — the runs start from different data.
TEST(DiffTest, ADifferenceThatPassedAnOpWithinToleranceMakesNoNewRoot) {
  auto mk = [](const std::string& data, const std::string& side) {
    std::vector<OpRecord> ops;
    ops.push_back(
        op(1, 1, "embedding",
           {tensor(Role::Input, 0, 1, 1, data), tensor(Role::Output, 0, 2, 1, "e" + side)}));
    ops.push_back(
        op(2, 1, "exp",
           {tensor(Role::Input, 0, 2, 1, "e" + side), tensor(Role::Output, 0, 3, 1, "x" + side)}));
    ops.back().tensors[1].md5Rounded = "rounded";
    ops.push_back(
        op(3, 1, "log",
           {tensor(Role::Input, 0, 3, 1, "x" + side), tensor(Role::Output, 0, 4, 1, "l" + side)}));
    return ops;
  };
  ks::DiffReport r = ks::diffRuns(mk("tokens", "A"), mk("other tokens", "B"));
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->pair.seqA, 1u);
  EXPECT_EQ(pairByA(r, 2)->status, DiffStatus::WithinTolerance);
  EXPECT_EQ(pairByA(r, 3)->status, DiffStatus::Diverged);
  EXPECT_FALSE(r.root);  // op 3 was the root before
  EXPECT_EQ(r.noRoot,
            "input 0 of the first divergence (#1 embedding) differs and no recorded op produced "
            "it: the runs start from different parameters or data");
  // The same runs from the same data: op 1 is the root, and op 3 still is not a second one.
  r = ks::diffRuns(mk("tokens", "A"), mk("tokens", "B"));
  ASSERT_TRUE(r.root);
  EXPECT_EQ(r.root->pair.seqA, 1u);
}

TEST(DiffTest, ExtraOpInBIsOneUnmatchedRestEqual) {
  const int n = 30, k = 12;
  auto a = chain(n);
  auto b = chain(n);
  // B inserts a `contiguous` after op k: same values, a fresh tensor id the next op reads.
  OpRecord extra = op(0, 1, "contiguous",
                      {tensor(Role::Input, 0, b[k].tensors.back().tensorId, 1, "m12"),
                       tensor(Role::Output, 0, 777777, 1, "m12")});
  b[k + 1].tensors[0].tensorId = 777777;
  b.insert(b.begin() + k + 1, extra);
  for (size_t i = 0; i < b.size(); ++i) b[i].seq = 1 + i;  // renumber B
  ks::DiffReport r = ks::diffRuns(a, b);
  EXPECT_EQ(r.total.equal, n);
  EXPECT_EQ(r.total.onlyInB, 1);
  EXPECT_EQ(r.total.onlyInA + r.total.diverged, 0);
  EXPECT_EQ(ks::diffExitCode(r), 0);
  EXPECT_EQ(r.steps[0].alignment, "lcs");
  const auto& row = r.pairs[static_cast<size_t>(k + 1)];
  EXPECT_FALSE(row.inA);
  EXPECT_EQ(row.name, "contiguous");
  EXPECT_EQ(row.status, DiffStatus::Unmatched);
  // Ops after the insertion pair with B's shifted seqs.
  EXPECT_EQ(pairByA(r, k + 2)->seqB, static_cast<uint64_t>(k + 3));

  ks::DiffOptions strict;
  strict.unmatchedIsDivergent = true;
  const ks::DiffReport sr = ks::diffRuns(a, b, strict);
  EXPECT_EQ(ks::diffExitCode(sr), 1);
  // DIVERGED says where: the first op only one run has (there was no first-divergence line).
  const std::string text = ks::toText(sr, true);
  EXPECT_NE(text.find("\nfirst divergence: step 1  A -  B #" + std::to_string(k + 2) +
                      "  contiguous [forward] blocks.0 (only in B; --strict counts it)\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("root divergence"), std::string::npos) << text;  // none searched
  EXPECT_EQ(ks::toText(r, true).find("first divergence"), std::string::npos);
  // The JSON names it too (its firstDivergence was null).
  const auto j = nlohmann::json::parse(ks::toJson(sr));
  EXPECT_TRUE(j["firstDivergence"]["pair"]["a"].is_null());
  EXPECT_EQ(j["firstDivergence"]["pair"]["b"]["seq"], k + 2);
  EXPECT_EQ(j["firstDivergence"]["pair"]["name"], "contiguous");
  EXPECT_TRUE(j["rootDivergence"].is_null());
  EXPECT_FALSE(j.contains("noRootReason"));
}

TEST(DiffTest, FusedOpsAlignTheRest) {
  const int n = 30, k = 10;
  auto a = chain(n);
  auto b = chain(n);
  // B fuses ops k and k+1 of A into one `fused_linear` with A's final output.
  OpRecord fused = op(0, 1, "fused_linear",
                      {b[k].tensors[0], b[k].tensors[1], b[k + 1].tensors[1],
                       tensor(Role::Output, 0, b[k + 1].tensors.back().tensorId, 1, "m11")});
  fused.tensors[2].index = 2;
  b.erase(b.begin() + k, b.begin() + k + 2);
  b.insert(b.begin() + k, fused);
  for (size_t i = 0; i < b.size(); ++i) b[i].seq = 1 + i;
  ks::DiffReport r = ks::diffRuns(a, b);
  EXPECT_EQ(r.total.equal, n - 2);
  EXPECT_EQ(r.total.onlyInA, 2);
  EXPECT_EQ(r.total.onlyInB, 1);
  EXPECT_EQ(r.total.diverged, 0);
  EXPECT_EQ(ks::diffExitCode(r), 0);
}

TEST(DiffTest, DifferentStepLengthsAndStepsOnOneSide) {
  auto a = chain(20, 1, 1);
  auto a2 = chain(20, 2, 101);
  a.insert(a.end(), a2.begin(), a2.end());
  auto b = chain(20, 1, 1);
  auto b2 = chain(15, 2, 101);  // step 2 is shorter in B
  auto b3 = chain(5, 3, 201);   // step 3 only in B
  b.insert(b.end(), b2.begin(), b2.end());
  b.insert(b.end(), b3.begin(), b3.end());
  ks::DiffReport r = ks::diffRuns(a, b);
  ASSERT_EQ(r.steps.size(), 3u);
  EXPECT_EQ(r.steps[0].equal, 20);
  EXPECT_EQ(r.steps[1].opsA, 20);
  EXPECT_EQ(r.steps[1].opsB, 15);
  EXPECT_EQ(r.steps[1].equal, 15);
  EXPECT_EQ(r.steps[1].onlyInA, 5);
  EXPECT_EQ(r.steps[2].onlyInB, 5);
  EXPECT_EQ(r.steps[2].alignment, "only-b");
  EXPECT_EQ(r.total.equal, 35);
  EXPECT_EQ(ks::diffExitCode(r), 0);
}

TEST(DiffTest, ChangedShapePairsOnNameAndDiverges) {
  auto a = chain(10), b = chain(10);
  b[4].tensors.back().shape = {4, 9};  // op 4 writes a different shape
  ks::DiffReport r = ks::diffRuns(a, b);
  EXPECT_EQ(r.total.onlyInA + r.total.onlyInB, 0);
  const ks::OpPair* p = pairByA(r, 5);
  ASSERT_NE(p, nullptr);
  EXPECT_FALSE(p->exactSignature);
  EXPECT_EQ(p->status, DiffStatus::Diverged);
  EXPECT_EQ(p->outputs[0].basis, DiffBasis::Shape);
  EXPECT_EQ(p->outputs[0].detail, "float32[4,8] vs float32[4,9]");
  ASSERT_TRUE(r.root);
  EXPECT_EQ(r.root->pair.seqA, 5u);
  // Only the dtype differs (a float32 run against a float64 one): the text says dtype (it said
  // "diverged (shape)" of two equal shapes).
  b = chain(10);
  b[4].tensors.back().dtype = "float64";
  r = ks::diffRuns(a, b);
  p = pairByA(r, 5);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->outputs[0].detail, "dtype float32 vs float64, shape [4,8]");
  EXPECT_NE(ks::toText(r, true).find("  output 0: diverged (dtype)  dtype float32 vs float64, "
                                     "shape [4,8]\n"),
            std::string::npos)
      << ks::toText(r, true);
}

TEST(DiffTest, RoundedMd5EqualIsWithinTolerance) {
  auto a = chain(10), b = chain(10, 1, 1, 3);
  for (auto* run : {&a, &b})
    for (auto& o : *run)
      for (auto& t : o.tensors) t.md5Rounded = std::string("r").append(std::to_string(t.tensorId));
  ks::DiffReport r = ks::diffRuns(a, b);
  EXPECT_EQ(r.total.equal, 3);
  EXPECT_EQ(r.total.withinTolerance, 7);
  EXPECT_EQ(pairByA(r, 4)->outputs[0].basis, DiffBasis::RoundedMd5);
  EXPECT_EQ(ks::diffExitCode(r), 0);
  ks::DiffOptions noRounded;
  noRounded.useRoundedMd5 = false;
  EXPECT_EQ(ks::diffExitCode(ks::diffRuns(a, b, noRounded)), 1);
}

// Recordings holding MD5s alone: a differing MD5 diverges whatever the tolerances, and the text
// says so (DIVERGED at --atol 1 came without a word why).
TEST(DiffTest, DivergencesByMd5AloneSayNoToleranceApplies) {
  ks::DiffOptions loose;
  loose.atol = 1;
  const ks::DiffReport r = ks::diffRuns(chain(10), chain(10, 1, 1, 3), loose);
  EXPECT_EQ(r.total.diverged, 7);
  const std::string text = ks::toText(r, true);
  EXPECT_NE(text.find("\n7 pairs diverged by MD5 alone: both recordings hold only MD5s, so a "
                      "last-bit difference diverges whatever --atol and --rtol (record them with "
                      "--stats or --all for the tolerances to apply)\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(ks::toText(ks::diffRuns(chain(10), chain(10)), true).find("by MD5 alone"),
            std::string::npos);
}

// An op swapped for another (relu in A, gelu in B): the pair they feed diverges, and the report
// names the two one-sided ops as where the programs differ (it named an optimizer sqrt as root).
TEST(DiffTest, AnInputMadeByOpsWithNoCounterpartNamesThem) {
  auto mk = [](const std::string& act) {
    std::vector<OpRecord> ops;
    ops.push_back(
        op(1, 1, "exp", {tensor(Role::Input, 0, 1, 1, "x"), tensor(Role::Output, 0, 2, 1, "e")}));
    ops.push_back(
        op(2, 1, act, {tensor(Role::Input, 0, 2, 1, "e"), tensor(Role::Output, 0, 3, 1, act)}));
    ops.push_back(op(3, 1, "add",
                     {tensor(Role::Input, 0, 2, 1, "e"), tensor(Role::Input, 1, 3, 1, act),
                      tensor(Role::Output, 0, 4, 1, "sum-" + act)}));
    return ops;
  };
  const ks::DiffReport r = ks::diffRuns(mk("relu"), mk("gelu"));
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->pair.name, "add");
  EXPECT_FALSE(r.root);
  EXPECT_EQ(r.noRoot,
            "input 1 of the first divergence (#3 add) is made by an op the other run does not "
            "have: A #2 relu (only in A), B #2 gelu (only in B); the two programs differ there");
}

// A recording made with --ops holds those ops only: the other run's other ops are not compared,
// and a line says so. Across frameworks op names differ (matmul against aten::mm): only a step
// range carries over, and nothing is dropped by name.
TEST(DiffTest, ACaptureFiltersOpsApplyWithinOneFramework) {
  keel::storage::testing::TempDir dir;
  auto write = [&](const std::string& name, const std::string& options,
                   const std::vector<std::string>& ops) {
    ks::RunInfo run = keel::storage::testing::sampleRun();
    run.captureOptionsJson = options;
    const std::string path = dir.file(name);
    auto w = ks::Writer::create(path, run);
    w->writeStep({1, 0, 1, 0.5});
    uint64_t seq = 1;
    for (const std::string& op : ops)
      w->writeOp(keel::storage::testing::sampleOp(seq++, 1, keel::Phase::Forward, op));
    w->close();
    return ks::Recording::open(path);
  };
  const ks::Recording a = write(
      "a.db", R"({"md5":true,"filter":{"ops":["matmul"],"scope":"","step_min":0,"step_max":9}})",
      {"matmul"});
  const ks::Recording b = write("b.db", R"({"md5":true})", {"matmul", "add"});
  ks::DiffReport r = ks::diffRecordings(a, b, {});
  EXPECT_EQ(r.total.onlyInB, 0);
  EXPECT_EQ(r.setup.back(),
            "1 op of B not compared: A recorded only --step-range 0:9 --ops matmul");
  const ks::Recording torch =
      write("t.db", R"({"md5":true,"framework":"torch"})", {"aten::mm", "aten::add"});
  r = ks::diffRecordings(a, torch, {});
  for (const std::string& line : r.setup)  // step 1 is inside 0:9: nothing is left out
    EXPECT_EQ(line.find("not compared"), std::string::npos) << line;
}

// Note [The tolerance of a mean]: a mean that cancels (elements near 1e-2, mean near 1e-9) is held
// to rtol of the elements' scale, not of itself: under --atol 0 two runs whose elements agree to
// 1e-7 were called diverged on "mean 1.2e-09 vs -3e-09". A mean off by more than elements within
// tolerance could make still diverges.
TEST(DiffTest, AMeanThatCancelsIsHeldToTheElementsScale) {
  TensorRecord ta = tensor(Role::Output, 0, 1, 1, "aa"), tb = tensor(Role::Output, 0, 1, 1, "bb");
  ta.hasStats = tb.hasStats = true;
  ta.stats = {-0.02, 0.02, 1.2e-9, 0.01, 0.02, 0, 0, 0};
  tb.stats = {-0.02, 0.02, -3e-9, 0.01, 0.02, 0, 0, 0};
  ks::DiffOptions opt;
  opt.atol = 0;
  opt.rtol = 1e-4;
  ks::TensorDiff d = ks::compareTensors(ta, tb, 1, 1, opt, {});
  EXPECT_EQ(d.status, DiffStatus::WithinTolerance) << d.detail;
  tb.stats.mean = 3e-6;  // 1.5e-4 of absMax: past what elements within 1e-4 can make
  d = ks::compareTensors(ta, tb, 1, 1, opt, {});
  EXPECT_EQ(d.status, DiffStatus::Diverged);
  EXPECT_EQ(d.detail.rfind("mean ", 0), 0u) << d.detail;
  tb.stats.mean = ta.stats.mean;
  tb.stats.std = 0.01 + 3e-6;  // the std is held to the same bound
  d = ks::compareTensors(ta, tb, 1, 1, opt, {});
  EXPECT_EQ(d.status, DiffStatus::Diverged);
  EXPECT_EQ(d.detail.rfind("std ", 0), 0u) << d.detail;
  tb.stats.std = 0.01 + 1e-6;
  d = ks::compareTensors(ta, tb, 1, 1, opt, {});
  EXPECT_EQ(d.status, DiffStatus::WithinTolerance) << d.detail;
}

TEST(DiffTest, StatisticsDecideWhenNoDumps) {
  TensorRecord ta = tensor(Role::Output, 0, 1, 1, "aa"), tb = tensor(Role::Output, 0, 1, 1, "bb");
  ta.hasStats = tb.hasStats = true;
  ta.stats = {-1.0, 2.0, 0.5, 0.7, 2.0, 0, 0, 3};
  tb.stats = ta.stats;
  tb.stats.mean = 0.50000001;
  ks::DiffOptions opt;
  ks::TensorDiff d = ks::compareTensors(ta, tb, 1, 1, opt, {});
  EXPECT_EQ(d.status, DiffStatus::WithinTolerance);
  EXPECT_EQ(d.basis, DiffBasis::Stats);
  tb.stats.mean = 0.6;
  d = ks::compareTensors(ta, tb, 1, 1, opt, {});
  EXPECT_EQ(d.status, DiffStatus::Diverged);
  EXPECT_EQ(d.detail, "mean 0.5 vs 0.6");
  tb.stats = ta.stats;
  tb.stats.nanCount = 1;
  d = ks::compareTensors(ta, tb, 1, 1, opt, {});
  EXPECT_EQ(d.status, DiffStatus::Diverged);
  EXPECT_EQ(d.detail, "NaN count 0 vs 1");
  opt.useStats = false;
  d = ks::compareTensors(ta, tb, 1, 1, opt, {});
  EXPECT_EQ(d.basis, DiffBasis::Md5Only);

  // Values that differ print with the digits that tell them apart (six made them look equal),
  // and --ulps applies to statistics as to values: one float32 ULP apart passes at maxUlps 1.
  ks::DiffOptions exact;
  exact.atol = exact.rtol = 0;
  tb.stats = ta.stats;
  tb.stats.min = std::nextafter(-1.0f, 0.0f);
  d = ks::compareTensors(ta, tb, 1, 1, exact, {});
  EXPECT_EQ(d.status, DiffStatus::Diverged);
  EXPECT_EQ(d.detail, "min -1 vs -0.9999999");
  exact.maxUlps = 1;
  d = ks::compareTensors(ta, tb, 1, 1, exact, {});
  EXPECT_EQ(d.status, DiffStatus::WithinTolerance) << d.detail;
  tb.stats.min = -0.99999982;  // 3 ULPs of float32 from -1
  EXPECT_EQ(ks::compareTensors(ta, tb, 1, 1, exact, {}).status, DiffStatus::Diverged);
  // Not for the mean and std: an integer tensor's mean 5 vs 5.9 is 1 ULP apart after rounding.
  TensorRecord ia = tensor(Role::Output, 0, 1, 1, "ia", {4}, "int32"),
               ib = tensor(Role::Output, 0, 1, 1, "ib", {4}, "int32");
  ia.hasStats = ib.hasStats = true;
  ia.stats = {0, 10, 5.0, 1.0, 10, 0, 0, 0};
  ib.stats = ia.stats;
  ib.stats.mean = 5.9;
  EXPECT_EQ(ks::compareTensors(ia, ib, 1, 1, exact, {}).status, DiffStatus::Diverged);
  EXPECT_EQ(ks::numberPair(0.4648761, 0.46487612), "0.4648761 vs 0.46487612");
  EXPECT_EQ(ks::numberPair(2.5, 2.5), "2.5 vs 2.5");
  EXPECT_EQ(ks::numberPair(1, std::nan(""), " / "), "1 / nan");
}

// A tensor whose values are all at atol's scale passes whatever its relative difference: the
// verdict says so, and a root divergence fed by it does not claim its inputs all match.
TEST(DiffTest, ATensorAtAtolsScalePassesSayingSo) {
  TensorRecord ta = tensor(Role::Output, 0, 1, 1, "aa"), tb = tensor(Role::Output, 0, 1, 1, "bb");
  ta.hasStats = tb.hasStats = true;
  ta.stats = {-1e-7, 2e-7, 0, 1e-7, 2e-7, 0, 0, 0};
  tb.stats = {-1e-7, 6e-7, 0, 1e-7, 6e-7, 0, 0, 0};
  ks::TensorDiff d = ks::compareTensors(ta, tb, 1, 1, {}, {});
  EXPECT_EQ(d.status, DiffStatus::WithinTolerance);
  EXPECT_TRUE(d.atolScale);
  EXPECT_EQ(d.detail,
            "statistics within tolerance only on atol (largest magnitude 2e-07 vs 6e-07)");
  // At the tensor's own scale the same absolute difference is noise: not flagged.
  ta.stats = {-1.0, 2.0, 0.5, 0.7, 2.0, 0, 0, 3};
  tb.stats = {-1.0, 2.0000004, 0.5, 0.7, 2.0000004, 0, 0, 3};
  d = ks::compareTensors(ta, tb, 1, 1, {}, {});
  EXPECT_EQ(d.status, DiffStatus::WithinTolerance);
  EXPECT_FALSE(d.atolScale);
  // Values: the same rule over the elements.
  d = ks::compareValues({1e-8, 2e-7}, {3e-8, 5e-7}, "float32", {});
  EXPECT_EQ(d.status, DiffStatus::WithinTolerance);
  EXPECT_TRUE(d.atolScale);
  EXPECT_FALSE(ks::compareValues({1.0, 2.0}, {1.0000001, 2.0000002}, "float32", {}).atolScale);

  // Op 2's output differs only at atol's scale; op 3 diverges: its inputs pass, one on atol.
  auto a = chain(6), b = chain(6, 1, 1, 2);
  for (auto* run : {&a, &b}) {
    const bool isA = run == &a;
    for (auto& t : (*run)[2].tensors)
      if (t.role == Role::Output) {
        t.hasStats = true;
        t.stats = isA ? ks::TensorStats{-1e-7, 2e-7, 0, 1e-7, 2e-7, 0, 0, 0}
                      : ks::TensorStats{-1e-7, 6e-7, 0, 1e-7, 6e-7, 0, 0, 0};
      }
  }
  ks::DiffReport r = ks::diffRuns(a, b);
  ASSERT_TRUE(r.first && r.root);
  EXPECT_EQ(r.first->pair.seqA, 4u);
  EXPECT_EQ(r.root->pair.seqA, 4u);
  const std::string text = ks::toText(r, true);
  EXPECT_NE(text.find("root divergence: the first divergence (its inputs all pass, but input 0 "
                      "only on atol: its values are at atol's scale, and a difference there is not "
                      "seen (diff with a smaller --atol))"),
            std::string::npos)
      << text;
  const auto j = nlohmann::json::parse(ks::toJson(r));
  EXPECT_EQ(j["rootDivergence"]["inputs"][0]["atolScale"], true) << j["rootDivergence"].dump();
}

// Note [Root candidates]: after a first divergence fed from outside the recording (a parameter
// that differs), a later pair whose input passed only on atol is no root: op 3's input, made by
// op 2 at 1e-7, passed on atol alone. It was named the root (AdamW's sqrt of its second moment,
// in two PyTorch runs from different initial weights); the report now says the runs start apart.
TEST(DiffTest, AfterAnOutsideDifferenceAnInputPassingOnlyOnAtolMakesNoRoot) {
  auto mk = [](const std::string& param, const std::string& side, double tiny) {
    std::vector<OpRecord> ops;
    ops.push_back(op(1, 1, "matmul",
                     {tensor(Role::Input, 0, 1, 1, "x"), tensor(Role::Input, 1, 2, 1, param),
                      tensor(Role::Output, 0, 3, 1, "y" + side)}));
    ops.push_back(
        op(2, 1, "mul", {tensor(Role::Input, 0, 4, 1, "z"), tensor(Role::Output, 0, 5, 1, "")}));
    ops.back().tensors[1].hasStats = true;
    ops.back().tensors[1].stats = {-1e-7, tiny, 0, 1e-7, tiny, 0, 0, 0};
    ops.push_back(
        op(3, 1, "sqrt",
           {tensor(Role::Input, 0, 5, 1, ""), tensor(Role::Output, 0, 6, 1, "s" + side)}));
    return ops;
  };
  ks::DiffReport r = ks::diffRuns(mk("w", "A", 2e-7), mk("w'", "B", 6e-7));
  ASSERT_TRUE(r.first);
  EXPECT_EQ(r.first->pair.seqA, 1u);
  EXPECT_EQ(pairByA(r, 2)->status, DiffStatus::WithinTolerance);
  EXPECT_EQ(pairByA(r, 3)->status, DiffStatus::Diverged);
  EXPECT_FALSE(r.root);  // op 3 was the root before
  EXPECT_EQ(r.noRoot,
            "input 1 of the first divergence (#1 matmul) differs and no recorded op produced "
            "it: the runs start from different parameters or data");
  // Op 3's input equal on both sides (an MD5): op 3 diverges at its own hand, and is the root.
  auto a = mk("w", "A", 2e-7), b = mk("w'", "B", 2e-7);
  a[1].tensors[1].md5 = b[1].tensors[1].md5 = a[2].tensors[0].md5 = b[2].tensors[0].md5 = "m";
  r = ks::diffRuns(a, b);
  ASSERT_TRUE(r.root);
  EXPECT_EQ(r.root->pair.seqA, 3u);
}

TEST(DiffTest, UlpDistanceInEachDtype) {
  EXPECT_EQ(ks::ulpDistance(1.0, 1.0, "float32"), 0u);
  EXPECT_EQ(ks::ulpDistance(1.0, 1.0 + std::ldexp(1.0, -23), "float32"), 1u);
  EXPECT_EQ(ks::ulpDistance(1.0, 1.5, "float32"), 0x400000u);
  EXPECT_EQ(ks::ulpDistance(-0.0, 0.0, "float32"), 0u);
  EXPECT_EQ(ks::ulpDistance(-std::ldexp(1.0, -149), std::ldexp(1.0, -149), "float32"), 2u);
  // float16: 1.0 = 0x3c00, 1.001953125 = 0x3c02; subnormals step 2^-24; 65504 is 0x7bff.
  EXPECT_EQ(ks::ulpDistance(1.0, 1.001953125, "float16"), 2u);
  EXPECT_EQ(ks::ulpDistance(-std::ldexp(1.0, -24), std::ldexp(1.0, -24), "float16"), 2u);
  EXPECT_EQ(ks::ulpDistance(65504.0, std::numeric_limits<double>::infinity(), "float16"), 1u);
  EXPECT_EQ(ks::ulpDistance(1.0, 2.0, "float16"), 1024u);
  EXPECT_EQ(ks::ulpDistance(1.0, 1.0 + std::ldexp(1.0, -11), "float16"), 0u);  // ties to even
  // bfloat16: 7 mantissa bits.
  EXPECT_EQ(ks::ulpDistance(1.0, 1.0078125, "bfloat16"), 1u);
  EXPECT_EQ(ks::ulpDistance(1.0, 2.0, "bfloat16"), 128u);
  EXPECT_EQ(ks::ulpDistance(1.0, std::nextafter(1.0, 2.0), "float64"), 1u);
  EXPECT_EQ(ks::ulpDistance(3.0, 7.0, "int64"), 4u);
  EXPECT_EQ(ks::ulpDistance(0.0, 1.0, "bool"), 1u);
  // Dtypes the engine has none for, as a foreign recording may hold: integers by their name,
  // anything else as float64.
  EXPECT_EQ(ks::ulpDistance(3.0, 7.0, "uint8"), 4u);
  EXPECT_EQ(ks::ulpDistance(-2.0, 2.0, "int16"), 4u);
  EXPECT_EQ(ks::ulpDistance(1.0, std::nextafter(1.0, 2.0), "float8_e4m3"), 1u);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(ks::ulpDistance(nan, 1.0, "float32"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(ks::ulpDistance(nan, nan, "float32"), 0u);
}

TEST(DiffTest, ValueComparisonFigures) {
  ks::DiffOptions opt;
  const double next2 = 2.0 + std::ldexp(1.0, -22);  // one float32 ulp above 2
  ks::TensorDiff d = ks::compareValues({1.0, 2.0, -0.5}, {1.0, next2, -0.5}, "float32", opt);
  EXPECT_EQ(d.status, DiffStatus::WithinTolerance);
  EXPECT_EQ(d.maxUlps, 1u);
  EXPECT_DOUBLE_EQ(d.maxAbs, std::ldexp(1.0, -22));
  EXPECT_DOUBLE_EQ(d.maxRel, std::ldexp(1.0, -22) / next2);
  EXPECT_EQ(d.badElements, 0);

  d = ks::compareValues({0.0, 1.0, 4.0}, {0.0, 1.5, 4.0}, "float32", opt);
  EXPECT_EQ(d.status, DiffStatus::Diverged);
  EXPECT_DOUBLE_EQ(d.maxAbs, 0.5);
  EXPECT_DOUBLE_EQ(d.maxRel, 0.5 / 1.5);
  EXPECT_EQ(d.maxUlps, 0x400000u);
  EXPECT_EQ(d.badElements, 1);
  EXPECT_EQ(d.detail, "1 of 3 elements outside tolerance; first at 1: 1 vs 1.5");

  // float16 values three ulps apart pass with maxUlps = 3 and no abs/rel tolerance.
  opt.atol = opt.rtol = 0;
  opt.maxUlps = 3;
  d = ks::compareValues({1.0, -2.0}, {1.0 + 3 * std::ldexp(1.0, -10), -2.0}, "float16", opt);
  EXPECT_EQ(d.status, DiffStatus::WithinTolerance);
  EXPECT_EQ(d.maxUlps, 3u);
  opt.maxUlps = 2;
  d = ks::compareValues({1.0, -2.0}, {1.0 + 3 * std::ldexp(1.0, -10), -2.0}, "float16", opt);
  EXPECT_EQ(d.status, DiffStatus::Diverged);

  // Equal values (NaNs in the same place) are Equal; NaN vs a number or Inf vs finite is not.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(ks::compareValues({nan, inf}, {nan, inf}, "float32", {}).status, DiffStatus::Equal);
  d = ks::compareValues({nan, 1.0}, {0.0, 1.0}, "float32", {});
  EXPECT_EQ(d.status, DiffStatus::Diverged);
  EXPECT_TRUE(std::isinf(d.maxAbs));
  EXPECT_EQ(ks::compareValues({1e30}, {inf}, "float32", {}).status, DiffStatus::Diverged);
  EXPECT_EQ(ks::compareValues({1.0}, {1.0, 2.0}, "float32", {}).status, DiffStatus::Diverged);
}

TEST(DiffTest, DumpCallbackSuppliesValues) {
  auto a = chain(5), b = chain(5, 1, 1, 2);  // ops 2.. differ by MD5
  std::vector<std::tuple<uint64_t, int, int, bool>> calls;
  ks::DumpValues values = [&](uint64_t seq, int role, int index,
                              bool sideA) -> std::optional<std::vector<double>> {
    calls.emplace_back(seq, role, index, sideA);
    if (seq != 3 || role != static_cast<int>(Role::Output)) return std::nullopt;
    if (sideA) return std::vector<double>{1.0, 2.0};
    return std::vector<double>{1.0, 2.0 + std::ldexp(1.0, -21)};
  };
  ks::DiffReport r = ks::diffRuns(a, b, {}, values);
  const ks::OpPair* p = pairByA(r, 3);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->status, DiffStatus::WithinTolerance);
  EXPECT_EQ(p->outputs[0].basis, DiffBasis::Values);
  EXPECT_EQ(p->outputs[0].maxUlps, 2u);
  EXPECT_DOUBLE_EQ(p->outputs[0].maxAbs, std::ldexp(1.0, -21));
  // Equal MD5s never reach the callback.
  for (auto& [seq, role, index, sideA] : calls) EXPECT_GE(seq, 3u);
  // Op 4 has no dumps: its MD5 differs, so it diverges. Its input 0 is op 3's output, whose
  // verdict (within tolerance, from the dumps) it inherits: op 4 is the first and root divergence.
  ASSERT_TRUE(r.first && r.root);
  EXPECT_EQ(r.first->pair.seqA, 4u);
  EXPECT_EQ(r.root->pair.seqA, 4u);
  EXPECT_EQ(r.root->inputs[0].status, DiffStatus::WithinTolerance);
  EXPECT_EQ(r.root->inputs[0].basis, DiffBasis::Values);
  EXPECT_EQ(r.root->inputs[0].detail, "output 0 of #3: dumped values within tolerance");
}

TEST(DiffTest, MismatchesOnlyKeepsNonEqualPairs) {
  auto a = chain(30), b = chain(30, 1, 1, 25);
  ks::DiffOptions opt;
  opt.mismatchesOnly = true;
  ks::DiffReport r = ks::diffRuns(a, b, opt);
  EXPECT_EQ(r.pairs.size(), 5u);
  EXPECT_EQ(r.total.equal, 25);
  for (const auto& p : r.pairs) EXPECT_NE(p.status, DiffStatus::Equal);
}

// "Mismatches" are what the studio's "Mismatches only" keeps: pairs outside tolerance and ops on
// one side only. --mismatches-only kept the pairs within tolerance too (a cpu against cpu-ref
// diff listed nearly every op), and each op of a step one run lacks got a line of its own.
TEST(DiffTest, MismatchesAreDivergedOrOneSidedAndAMissingStepIsOneLine) {
  auto a = chain(10);
  auto b = chain(10);
  b[3].tensors.back().md5 = "other";  // #4's output: by MD5 alone, diverged
  // #7's output within tolerance: its statistics close, its MD5 not the same.
  for (auto* run : {&a, &b}) {
    auto& t = (*run)[6].tensors.back();
    t.stats.mean = run == &a ? 1.0 : 1.0 + 1e-9;
    t.stats.min = t.stats.max = t.stats.absMax = t.stats.mean;
    t.stats.std = 0;
    t.hasStats = true;
  }
  b[6].tensors.back().md5 = "near";
  auto extra = chain(5, 2, 11);  // step 2: A only
  a.insert(a.end(), extra.begin(), extra.end());
  ks::DiffOptions opt;
  ks::DiffReport all = ks::diffRuns(a, b, opt);
  ASSERT_EQ(all.total.withinTolerance, 1) << ks::toText(all, false);
  ASSERT_EQ(all.total.onlyInA, 5);
  EXPECT_TRUE(ks::isMismatch(DiffStatus::Diverged));
  EXPECT_TRUE(ks::isMismatch(DiffStatus::Unmatched));
  EXPECT_FALSE(ks::isMismatch(DiffStatus::WithinTolerance));
  EXPECT_FALSE(ks::isMismatch(DiffStatus::Equal));
  opt.mismatchesOnly = true;
  ks::DiffReport r = ks::diffRuns(a, b, opt);
  for (const auto& p : r.pairs) EXPECT_TRUE(ks::isMismatch(p.status)) << p.seqA;
  const std::string text = ks::toText(r, true);
  EXPECT_NE(text.find("  < step 2: 5 ops only in A (B has no step 2)\n"), std::string::npos)
      << text;
  EXPECT_EQ(text.find(" step 2  A #"), std::string::npos) << text;  // no line per op
  EXPECT_EQ(text.find("\n  ~ "), std::string::npos) << text;        // none within tolerance
  EXPECT_NE(text.find("\n  ! step 1  A #4  B #4 "), std::string::npos) << text;
  // The whole list (no --mismatches-only) says the missing step once too.
  const std::string whole = ks::toText(all, false);
  EXPECT_NE(whole.find("  < step 2: 5 ops only in A (B has no step 2)\n"), std::string::npos);
  EXPECT_NE(whole.find("\n  ~ step 1  A #7  B #7 "), std::string::npos) << whole;
}

// Recordings without MD5s or statistics: nothing said two ops were equal, so none is counted
// equal and the verdict says so instead of "EQUAL" (a graph-only recording diffed by mistake).
TEST(DiffTest, RunsWithoutValuesAreNotComparedNotEqual) {
  auto a = chain(6), b = chain(6, 1, 1, 3);
  for (auto* run : {&a, &b})
    for (auto& o : *run)
      for (auto& t : o.tensors) t.md5.clear();
  ks::DiffReport r = ks::diffRuns(a, b);
  EXPECT_EQ(r.total.equal, 0);
  EXPECT_EQ(r.total.notCompared, 6);
  EXPECT_EQ(r.comparedTensors, 0);
  EXPECT_EQ(r.uncomparedTensors, 6);
  EXPECT_EQ(ks::diffVerdict(r), ks::DiffVerdict::ValuesNotCompared);
  EXPECT_EQ(ks::diffExitCode(r), 0);
  for (const auto& p : r.pairs) EXPECT_FALSE(ks::valuesCompared(p));
  const std::string text = ks::toText(r, false);
  EXPECT_EQ(text.rfind("NO VALUES COMPARED (atol 1e-06, rtol 0.0001)\n", 0), 0u) << text;
  EXPECT_NE(text.find("summary: 0 equal, 6 not compared, 0 within tolerance"), std::string::npos);
  EXPECT_NE(text.find("equal  not cmp   within"), std::string::npos) << text;
  EXPECT_NE(text.find("  ? step 1  A #1"), std::string::npos) << text;
  const auto j = nlohmann::json::parse(ks::toJson(r));
  EXPECT_EQ(j["verdict"], "values-not-compared");
  EXPECT_EQ(j["total"]["notCompared"], 6);
  EXPECT_EQ(j["comparedTensors"], 0);
  EXPECT_NE(text.find("\nthe recordings hold no MD5s, statistics or dumps of their tensors: only "
                      "the op sequences were compared (record both with --all, or --md5 / "
                      "--stats)\n"),
            std::string::npos)
      << text;

  // Only one side without values: the line names it, and what the other holds.
  auto withMd5 = chain(6);
  r = ks::diffRuns(withMd5, b);
  EXPECT_EQ(r.heldA, "MD5s");
  EXPECT_EQ(r.heldB, "");
  EXPECT_EQ(ks::diffVerdict(r), ks::DiffVerdict::ValuesNotCompared);
  EXPECT_EQ(ks::valuesNotComparedText(r),
            "recording B holds no MD5s, statistics or dumps of its tensors (A holds MD5s): only "
            "the op sequences were compared (record B with --all, or --md5 / --stats)");
  // Each side holds a kind the other lacks: still nothing compared, and it says so.
  for (auto& o : b)
    for (auto& t : o.tensors) t.hasStats = true;
  r = ks::diffRuns(withMd5, b);
  EXPECT_EQ(r.heldB, "statistics");
  EXPECT_EQ(ks::diffVerdict(r), ks::DiffVerdict::ValuesNotCompared);
  EXPECT_EQ(ks::valuesNotComparedText(r),
            "A holds MD5s and B statistics of their tensors, no kind both hold: only the op "
            "sequences were compared (record both with --all)");
  // Rounded MD5s are a kind of their own ("MD5s and MD5s" before).
  for (auto& o : b)
    for (auto& t : o.tensors) {
      t.hasStats = false;
      t.md5Rounded = std::to_string(t.tensorId);  // any text: the kind is what counts
    }
  r = ks::diffRuns(withMd5, b);
  EXPECT_EQ(r.heldB, "rounded MD5s");
  EXPECT_NE(ks::valuesNotComparedText(r).find("A holds MD5s and B rounded MD5s"), std::string::npos)
      << ks::valuesNotComparedText(r);

  // One output with an MD5 on both sides is a comparison: the verdict is EQUAL again and that
  // pair alone counts as equal; the others stay not compared.
  a[0].tensors.back().md5 = b[0].tensors.back().md5 = "same";
  r = ks::diffRuns(a, b);
  EXPECT_EQ(ks::diffVerdict(r), ks::DiffVerdict::Equal);
  EXPECT_EQ(r.total.equal, 1);
  EXPECT_EQ(r.total.notCompared, 5);
  EXPECT_TRUE(ks::valuesCompared(r.pairs[0]));
  EXPECT_FALSE(ks::valuesCompared(r.pairs[1]));
}

TEST(DiffTest, StepLossesCompareWithTheTolerances) {
  // Each NaN given is a reported NaN loss (Note [Reported NaN]); `unknown` steps report none.
  auto steps = [](std::vector<double> losses, std::vector<size_t> unknown = {}) {
    std::vector<ks::StepRecord> s;
    for (size_t i = 0; i < losses.size(); ++i) {
      s.emplace_back();
      s.back().step = static_cast<int64_t>(i) + 1;
      s.back().endNs = 100 + static_cast<int64_t>(i);  // ended
      s.back().loss = losses[i];
      const bool reported = std::find(unknown.begin(), unknown.end(), i) == unknown.end();
      if (std::isnan(losses[i]) && reported)
        s.back().nanMetrics = ks::stepMetricBit(ks::StepMetric::Loss);
    }
    return s;
  };
  const double nan = ks::kNoValue;
  auto unended = steps({5.5, 5.4, 5.3, nan, nan, 7.0});
  unended[5].endNs = 0;  // a step that never ended (stopped run) has no loss to compare
  auto l = ks::compareLosses(unended, steps({5.5, 5.4002, 5.31, 2.0, nan, 1.0, 3.0}), {});
  ASSERT_EQ(l.size(), 5u);  // step 6 did not end in A, step 7 is only in B
  EXPECT_EQ(l[0].status, DiffStatus::Equal);
  EXPECT_EQ(l[1].status, DiffStatus::WithinTolerance);  // 2e-4 <= 1e-6 + 1e-4 * 5.4002
  EXPECT_EQ(l[2].status, DiffStatus::Diverged);         // 1e-2 > 5.3e-4
  EXPECT_EQ(l[3].status, DiffStatus::Diverged);         // a NaN loss against a number
  EXPECT_EQ(l[4].status, DiffStatus::Equal);            // NaN on both sides
  EXPECT_DOUBLE_EQ(l[2].a, 5.3);
  EXPECT_DOUBLE_EQ(l[2].b, 5.31);
  // A step that ended without reporting a loss (a keel_torch eval step) is left out; a side with
  // no loss at all compares nothing. A reported NaN against a number is diverged, on either side.
  l = ks::compareLosses(steps({5.5, nan, 5.3}, {1}), steps({5.5, 5.4, 5.3}), {});
  ASSERT_EQ(l.size(), 2u);  // step 2 left out
  EXPECT_EQ(l[0].step, 1);
  EXPECT_EQ(l[1].step, 3);
  EXPECT_TRUE(ks::compareLosses(steps({nan, nan}, {0, 1}), steps({1.0, 2.0}), {}).empty());
  l = ks::compareLosses(steps({1.0, 2.0}), steps({1.0, nan}), {});
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[1].status, DiffStatus::Diverged);
  // Two runs without ops or losses (imported memory snapshots) compared nothing at all.
  ks::DiffReport none = ks::diffRuns({}, {});
  EXPECT_EQ(ks::diffVerdict(none), ks::DiffVerdict::ValuesNotCompared);

  // A diverged loss makes the report diverge even when every op pair is equal.
  auto a = chain(4), b = chain(4);
  ks::DiffReport r = ks::diffRuns(a, b);
  r.losses = ks::compareLosses(steps({5.5}), steps({5.6}), r.options);
  ASSERT_NE(ks::firstLossDivergence(r), nullptr);
  EXPECT_EQ(ks::firstLossDivergence(r)->step, 1);
  EXPECT_EQ(ks::diffVerdict(r), ks::DiffVerdict::Diverged);
  EXPECT_EQ(ks::diffExitCode(r), 1);
  const std::string text = ks::toText(r, false);
  EXPECT_EQ(text.rfind("DIVERGED", 0), 0u) << text;
  EXPECT_NE(text.find("losses: 1 step compared, first diverged at step 1: A 5.5 vs B 5.6\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("first divergence: step 1 loss (A 5.5 vs B 5.6); no recorded op output "
                      "diverged"),
            std::string::npos)
      << text;
  const auto j = nlohmann::json::parse(ks::toJson(r));
  EXPECT_EQ(j["firstLossDivergence"], 1);
  EXPECT_EQ(j["losses"][0]["status"], "diverged");
  EXPECT_DOUBLE_EQ(j["losses"][0]["b"].get<double>(), 5.6);
}

TEST(DiffTest, DuplicateSeqIsAnError) {
  auto a = chain(3), b = chain(3);
  a[1].seq = a[0].seq;
  EXPECT_THROW(ks::diffRuns(a, b), ks::StorageError);
}

TEST(DiffTest, GreedyFallbackStillAlignsInsertions) {
  auto a = chain(200), b = chain(200);
  // Two insertions far apart; a tiny LCS budget forces the greedy resync.
  for (int at : {150, 50}) {
    OpRecord extra = op(0, 1, "contiguous", {tensor(Role::Output, 0, 999000 + at, 1, "c")});
    b.insert(b.begin() + at, extra);
  }
  for (size_t i = 0; i < b.size(); ++i) b[i].seq = 1 + i;
  ks::DiffOptions opt;
  opt.lcsBudget = 10;
  ks::DiffReport r = ks::diffRuns(a, b, opt);
  EXPECT_EQ(r.steps[0].alignment, "greedy");
  EXPECT_EQ(r.total.equal, 200);
  EXPECT_EQ(r.total.onlyInB, 2);
}

TEST(DiffTest, AlignOpsRowsInOrder) {
  auto mk = [](std::initializer_list<const char*> names) {
    std::vector<OpRecord> ops;
    uint64_t s = 1;
    for (const char* n : names) ops.push_back(op(s++, 1, n, {}));
    return ops;
  };
  auto a = mk({"a", "b", "c", "d", "e"}), b = mk({"a", "x", "c", "d", "y", "e"});
  std::vector<const OpRecord*> pa, pb;
  for (auto& o : a) pa.push_back(&o);
  for (auto& o : b) pb.push_back(&o);
  ks::Alignment al = ks::alignOps(pa, pb);
  std::vector<std::pair<int64_t, int64_t>> want = {{0, 0}, {1, -1}, {-1, 1}, {2, 2},
                                                   {3, 3}, {-1, 4}, {4, 5}};
  EXPECT_EQ(al.rows, want);
  EXPECT_EQ(al.method, "lcs");
}

TEST(DiffTest, JsonReplacesInvalidUtf8) {
  auto a = chain(3), b = chain(3, 1, 1, 2);
  a[1].scope = b[1].scope = std::string("bad\xc3(");
  const auto j = nlohmann::json::parse(ks::toJson(ks::diffRuns(a, b)));
  EXPECT_NE(j.dump().find("bad\xef\xbf\xbd("), std::string::npos);
}

TEST(DiffTest, JsonAndTextCarryTheReport) {
  auto a = chain(12), b = chain(12, 1, 1, 7);
  ks::DiffReport r = ks::diffRuns(a, b);
  auto j = nlohmann::json::parse(ks::toJson(r));
  EXPECT_EQ(j["verdict"], "diverged");
  EXPECT_EQ(j["exitCode"], 1);
  EXPECT_EQ(j["total"]["diverged"], 5);
  EXPECT_EQ(j["steps"][0]["equal"], 7);
  EXPECT_EQ(j["firstDivergence"]["pair"]["a"]["seq"], 8);
  EXPECT_EQ(j["firstDivergence"]["pair"]["a"]["stackId"], 107);
  EXPECT_EQ(j["rootDivergence"]["pair"]["b"]["seq"], 8);
  EXPECT_EQ(j["rootDivergence"]["chainA"][0]["seq"], 7);
  EXPECT_EQ(j["rootDivergence"]["chainA"][0]["status"], "equal");
  EXPECT_EQ(j["firstDivergence"]["pair"]["outputs"][0]["basis"], "md5-only");
  EXPECT_EQ(j["pairs"].size(), 12u);

  std::string text = ks::toText(r, true);
  EXPECT_NE(text.find("DIVERGED"), std::string::npos);
  EXPECT_NE(text.find("first divergence: step 1  A #8  B #8  add [forward] blocks.0"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("root divergence: the first divergence"), std::string::npos);
  EXPECT_NE(text.find("<- #7 matmul [forward] blocks.0  equal  -> input 0 of #8  stack #106"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("= step"), std::string::npos);  // mismatches only
  EXPECT_NE(ks::toText(ks::diffRuns(a, a), false).find("EQUAL within tolerance"),
            std::string::npos);
}

// diffRuns(a, b, opt), timed: prints "100,000-op diff, <what> (<alignment>): S s" and returns the
// report and the seconds it took.
std::pair<ks::DiffReport, double> timedDiff(const std::vector<OpRecord>& a,
                                            const std::vector<OpRecord>& b,
                                            const ks::DiffOptions& opt, const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  ks::DiffReport r = ks::diffRuns(a, b, opt);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("100,000-op diff, %s (%s): %.3f s\n", what, r.steps[0].alignment.c_str(), secs);
  return {std::move(r), secs};
}

TEST(DiffTest, HundredThousandOpStepsDiffQuickly) {
  const int n = 100'000;
  auto a = chain(n), b = chain(n, 1, 1, n / 2);
  auto t0 = std::chrono::steady_clock::now();
  ks::DiffOptions opt;
  opt.mismatchesOnly = true;
  ks::DiffReport r = ks::diffRuns(a, b, opt);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.total.equal, n / 2);
  ASSERT_TRUE(r.root);
  EXPECT_EQ(r.root->pair.seqA, 1u + n / 2);
  RecordProperty("seconds", std::to_string(secs));
  std::printf("100,000-op diff, one divergence: %.3f s\n", secs);
  EXPECT_LT(secs, 10.0);  // generous: Debug builds and shared cores; bench/bench_diff measures

  // 200 scattered insertions in B: the aligner leaves the identical fast path.
  auto c = chain(n);
  for (int i = 0; i < 200; ++i) {
    OpRecord extra = op(0, 1, "contiguous", {tensor(Role::Output, 0, 900000000 + i, 1, "c")});
    c.insert(c.begin() + (n - 1000 - i * 450), extra);
  }
  for (size_t i = 0; i < c.size(); ++i) c[i].seq = 1 + i;
  auto [r2, secs2] = timedDiff(a, c, opt, "200 insertions");
  EXPECT_EQ(r2.total.equal, n);
  EXPECT_EQ(r2.total.onlyInB, 200);
  EXPECT_LT(secs2, 10.0);

  // Every 50th op missing in B (2,000 deletions): still aligned op for op.
  std::vector<OpRecord> d;
  for (int i = 0; i < n; ++i)
    if (i % 50 != 25) d.push_back(a[static_cast<size_t>(i)]);
  for (size_t i = 0; i < d.size(); ++i) d[i].seq = 1 + i;
  auto [r3, secs3] = timedDiff(a, d, opt, "2,000 deletions");
  EXPECT_EQ(r3.total.equal, n - 2000);
  EXPECT_EQ(r3.total.onlyInA, 2000);
  EXPECT_EQ(r3.total.onlyInB + r3.total.diverged, 0);
  EXPECT_LT(secs3, 10.0);
}

// ---- module alignment across frameworks (Note [Diff across frameworks]) -----------------------

namespace {

TensorRecord withStats(TensorRecord t, double mean, double max) {
  t.hasStats = true;
  t.stats.min = -max;
  t.stats.max = max;
  t.stats.mean = mean;
  t.stats.std = 1.0;
  t.stats.absMax = max;
  return t;
}

// A Keel-like step: matmul in scope w1 ([8,4] out), a reshape, silu in scope mlp reading it.
std::vector<OpRecord> keelSide() {
  std::vector<OpRecord> ops;
  ops.push_back(op(1, 1, "matmul",
                   {tensor(Role::Input, 0, 1, 1, "x"), tensor(Role::Input, 1, 2, 1, "w"),
                    withStats(tensor(Role::Output, 0, 10, 1, "k-mm", {8, 4}), 0.1, 2.0)},
                   "mlp.w1", 11));
  ops.push_back(op(2, 1, "reshape",
                   {tensor(Role::Input, 0, 10, 1, "k-mm", {8, 4}),
                    tensor(Role::Output, 0, 11, 1, "k-mm", {2, 4, 4})},
                   "mlp.w1"));
  ops.push_back(op(3, 1, "silu",
                   {tensor(Role::Input, 0, 11, 1, "k-mm", {2, 4, 4}),
                    withStats(tensor(Role::Output, 0, 12, 1, "k-silu", {2, 4, 4}), 0.2, 1.5)},
                   "mlp", 13));
  return ops;
}

// The PyTorch-like side: t (view), mm, _unsafe_view, optionally a hook's add of `bump`, silu.
std::vector<OpRecord> torchSide(bool perturbed) {
  std::vector<OpRecord> ops;
  ops.push_back(op(1, 1, "t",
                   {tensor(Role::Input, 0, 2, 1, "w"), tensor(Role::Output, 0, 3, 1, "wt")},
                   "mlp.w1"));
  ops.push_back(op(2, 1, "mm",
                   {tensor(Role::Input, 0, 1, 1, "x"), tensor(Role::Input, 1, 3, 1, "wt"),
                    withStats(tensor(Role::Output, 0, 20, 1, "t-mm", {8, 4}), 0.1000001, 2.0)},
                   "mlp.w1", 21));
  ops.push_back(op(3, 1, "_unsafe_view",
                   {tensor(Role::Input, 0, 20, 1, "t-mm", {8, 4}),
                    tensor(Role::Output, 0, 21, 1, "t-mm", {2, 4, 4})},
                   "mlp.w1"));
  uint64_t siluIn = 21;
  if (perturbed) {
    ops.push_back(op(4, 1, "add",
                     {tensor(Role::Input, 0, 21, 1, "t-mm", {2, 4, 4}),
                      tensor(Role::Input, 1, 99, 1, "bump", {2, 4, 4}),
                      withStats(tensor(Role::Output, 0, 22, 1, "t-add", {2, 4, 4}), 0.4, 12.0)},
                     "mlp.w1", 24));
    siluIn = 22;
  }
  ops.push_back(op(5, 1, "silu",
                   {tensor(Role::Input, 0, siluIn, 1, "in", {2, 4, 4}),
                    withStats(tensor(Role::Output, 0, 23, 1, "t-silu", {2, 4, 4}),
                              perturbed ? 0.5 : 0.2000001, perturbed ? 12.0 : 1.5)},
                   "mlp", 25));
  return ops;
}

}  // namespace

TEST(DiffModules, OpKindsComeFromOneTable) {
  EXPECT_EQ(ks::opKind("mm"), "matmul");
  EXPECT_EQ(ks::opKind("addmm"), "addmm");  // x·Wᵀ + b: not a matmul's value
  EXPECT_EQ(ks::opKind("mul_scalar"), "mul");
  EXPECT_EQ(ks::opKind("_to_copy"), "cast");
  EXPECT_EQ(ks::opKind("bmm"), "matmul");
  EXPECT_EQ(ks::opKind("matmul"), "matmul");
  EXPECT_EQ(ks::opKind("native_layer_norm"), "layer_norm");
  EXPECT_EQ(ks::opKind("nll_loss_forward"), "cross_entropy");
  EXPECT_EQ(ks::opKind("add_"), "add");   // in place: its op's kind
  EXPECT_EQ(ks::opKind("silu"), "silu");  // spelled alike: its own kind
  EXPECT_EQ(ks::opKind("__and__"), "__and__");
  for (const char* view : {"view", "_unsafe_view", "t", "transpose", "reshape", "clone", "split"})
    EXPECT_EQ(ks::opKind(view), "") << view;
}

TEST(DiffModules, PairsByModuleKindAndSizeLeavingViewsOut) {
  auto a = keelSide();
  auto b = torchSide(true);
  std::vector<const OpRecord*> pa, pb;
  for (auto& o : a) pa.push_back(&o);
  for (auto& o : b) pb.push_back(&o);
  ks::Alignment al = ks::alignModules(pa, pb);
  EXPECT_EQ(al.method, "module");
  // matmul/mm paired, the hook's add after it (B only), silu paired; no view in any row.
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 1}, {-1, 3}, {2, 4}};
  EXPECT_EQ(al.rows, want);
}

TEST(DiffModules, EqualRunsAreWithinToleranceModuleByModule) {
  ks::DiffOptions opt;
  opt.align = ks::DiffAlign::Module;
  ks::DiffReport r = ks::diffRuns(keelSide(), torchSide(false), opt);
  EXPECT_EQ(ks::diffExitCode(r), 0);
  EXPECT_EQ(r.total.withinTolerance, 2);
  EXPECT_EQ(r.total.diverged + r.total.onlyInA + r.total.onlyInB, 0);
  EXPECT_EQ(r.total.viewsA, 1);
  EXPECT_EQ(r.total.viewsB, 2);
  EXPECT_EQ(r.steps.at(0).alignment, "module");
  ASSERT_EQ(r.pairs.size(), 2u);
  EXPECT_EQ(r.pairs[0].kind, "matmul");
  EXPECT_EQ(r.pairs[0].nameB, "mm");
  EXPECT_EQ(r.pairs[1].outputs.at(0).basis, DiffBasis::Stats);
  // The same runs by signature pair nothing but what is spelled alike (silu).
  opt.align = ks::DiffAlign::Signature;
  ks::DiffReport sig = ks::diffRuns(keelSide(), torchSide(false), opt);
  EXPECT_EQ(sig.total.withinTolerance + sig.total.equal, 1);
  EXPECT_EQ(sig.total.onlyInA + sig.total.onlyInB, 5);
}

TEST(DiffModules, AnOpOnOneSideThatChangedAValueIsTheRoot) {
  ks::DiffOptions opt;
  opt.align = ks::DiffAlign::Module;
  ks::DiffReport r = ks::diffRuns(keelSide(), torchSide(true), opt);
  EXPECT_EQ(ks::diffExitCode(r), 1);
  ASSERT_TRUE(r.first.has_value());
  EXPECT_EQ(r.first->pair.name, "silu");
  EXPECT_EQ(r.first->pair.scope, "mlp");
  ASSERT_TRUE(r.root.has_value());
  EXPECT_FALSE(r.root->pair.inA);
  EXPECT_TRUE(r.root->pair.inB);
  EXPECT_EQ(r.root->pair.seqB, 4u);
  EXPECT_EQ(r.root->pair.name, "add");
  EXPECT_EQ(r.root->pair.scope, "mlp.w1");
  EXPECT_EQ(r.root->pair.stackIdB, 24);
  // The first divergence's input, compared index by index, names what fed it on each side:
  // the matmul pair (through A's reshape), and B's add.
  ASSERT_EQ(r.first->inputs.size(), 1u);
  EXPECT_EQ(r.first->inputs[0].status, DiffStatus::Diverged);
  EXPECT_NE(r.first->inputs[0].detail.find(
                "fed by A #1 matmul mlp.w1 (paired), B #4 add mlp.w1 (only in B)"),
            std::string::npos)
      << r.first->inputs[0].detail;
  const std::string text = ks::toText(r, true);
  EXPECT_NE(text.find("root divergence: step 1  A -  B #4  add [forward] mlp.w1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("only in B: an op with no counterpart"), std::string::npos) << text;
  auto j = nlohmann::json::parse(ks::toJson(r));
  EXPECT_EQ(j["options"]["align"], "module");
  EXPECT_TRUE(j["rootDivergence"]["pair"]["a"].is_null());
}

TEST(DiffModules, AMatchedPairThatDivergedOnItsOwnIsTheRoot) {
  auto b = torchSide(false);
  b[1].tensors.back().stats.max = 7.0;  // mm itself differs; what feeds it is state (leaves)
  ks::DiffOptions opt;
  opt.align = ks::DiffAlign::Module;
  ks::DiffReport r = ks::diffRuns(keelSide(), b, opt);
  ASSERT_TRUE(r.root.has_value());
  EXPECT_TRUE(r.root->pair.inA && r.root->pair.inB);
  EXPECT_EQ(r.root->pair.name, "matmul");
  EXPECT_EQ(r.root->pair.nameB, "mm");
}

TEST(DiffModules, ReshapedOutputsCompareByValuesAndStatisticsNotMd5s) {
  auto a = keelSide();
  auto b = torchSide(false);
  // Keel's digest ends with the shape: equal elements as [8,4] and as [2,4,4] hash differently,
  // so a reshaped pair is judged on statistics (or dumped values), never on its MD5s.
  a[0].tensors.back().md5 = "md5-of-[8,4]";
  b[1].tensors.back().md5 = "md5-of-[2,4,4]";
  b[1].tensors.back().shape = {2, 4, 4};
  ks::DiffOptions opt;
  opt.align = ks::DiffAlign::Module;
  ks::DiffReport r = ks::diffRuns(a, b, opt);
  ASSERT_FALSE(r.pairs.empty());
  EXPECT_EQ(r.pairs[0].status, DiffStatus::WithinTolerance);
  EXPECT_EQ(r.pairs[0].outputs.at(0).basis, DiffBasis::Stats);
  EXPECT_NE(r.pairs[0].outputs.at(0).detail.find("shapes [8,4] vs [2,4,4]"), std::string::npos)
      << r.pairs[0].outputs.at(0).detail;
  // Dumped on both sides: element by element, whatever the shapes.
  ks::DumpValues values = [](uint64_t seq, int role, int index,
                             bool sideA) -> std::optional<std::vector<double>> {
    if (role != static_cast<int>(Role::Output) || index != 0 || seq != (sideA ? 1u : 2u))
      return std::nullopt;
    return std::vector<double>(32, 0.5);
  };
  ks::DiffReport byValues = ks::diffRuns(a, b, opt, values);
  EXPECT_EQ(byValues.pairs.at(0).status, DiffStatus::Equal);
  EXPECT_EQ(byValues.pairs.at(0).outputs.at(0).basis, DiffBasis::Values);
  // Equal MD5s of one shape still settle it.
  b[1].tensors.back().shape = {8, 4};
  b[1].tensors.back().md5 = "md5-of-[8,4]";
  ks::DiffReport byMd5 = ks::diffRuns(a, b, opt);
  EXPECT_EQ(byMd5.pairs.at(0).status, DiffStatus::Equal);
  EXPECT_EQ(byMd5.pairs.at(0).outputs.at(0).basis, DiffBasis::Md5);
}

// Keel's flashmask_attention against ATen's bmm: each side reaches the diverged pair through an
// op the other has none of, so neither op alone is blamed; the pair is the root, naming both.
TEST(DiffModules, OneSidedOpsOnBothSidesMakeThePairTheRoot) {
  auto a = keelSide();
  auto b = torchSide(false);
  // A: matmul -> fused (only in A) -> reshape -> silu; B: mm -> _unsafe_view -> bmm (only in B,
  // as a decomposition) -> silu.
  a.insert(a.begin() + 1, op(100, 1, "flashmask_attention",
                             {tensor(Role::Input, 0, 10, 1, "k-mm", {8, 4}),
                              withStats(tensor(Role::Output, 0, 30, 1, "k-att", {8, 4}), 0.3, 1.0)},
                             "mlp.w1"));
  a[2].seq = 101;
  a[2].tensors[0].tensorId = 30;
  a[2].tensors[0].md5 = "k-att";
  for (auto& o : a) o.seq = o.seq == 100 ? 2 : o.seq == 101 ? 3 : o.seq == 3 ? 4 : o.seq;
  b.insert(b.begin() + 3,
           op(4, 1, "bmm",
              {tensor(Role::Input, 0, 21, 1, "t-mm", {2, 4, 4}),
               withStats(tensor(Role::Output, 0, 31, 1, "t-att", {2, 4, 4}), 0.3, 1.0)},
              "mlp"));
  b.back().tensors[0].tensorId = 31;
  b.back().tensors.back().stats.max = 9.0;  // silu diverges
  ks::DiffOptions opt;
  opt.align = ks::DiffAlign::Module;
  ks::DiffReport r = ks::diffRuns(a, b, opt);
  ASSERT_TRUE(r.root.has_value());
  EXPECT_TRUE(r.root->pair.inA && r.root->pair.inB);
  EXPECT_EQ(r.root->pair.name, "silu");
  const std::string text = ks::toText(r, true);
  EXPECT_NE(text.find("fed on both sides by ops with no counterpart (A #2 flashmask_attention "
                      "mlp.w1, B #4 bmm mlp)"),
            std::string::npos)
      << text;
}
