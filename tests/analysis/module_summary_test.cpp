// Module summaries and non-finite marks on the hand-made step, as values: what a module's node and
// its zoomed-out block show (ops, time, bytes, non-finite ops, worst verdict), and which ops the
// non-finite colouring paints. See Notes [Module summary] and [Non-finite colouring].
#include "keel/analysis/module_summary.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <string>
#include <vector>

#include "small_step.h"

namespace keel::analysis {
namespace {

using storage::DiffStatus;
using storage::OpRecord;
using test::smallStep;

TEST(ModuleSummary, SumsTheOpsUnderEachModuleInItsPhase) {
  const auto ops = smallStep();
  const GraphDot g = buildGraphDot(ops, GraphDotOptions{});
  const auto m = summarizeModules(ops, g);
  // blocks (forward): norm, matmul, softmax, add: 4 ops of 500 ns, one 128-byte output each.
  const ModuleSummary& blocks = m.at("f:blocks");
  EXPECT_EQ(blocks.ops, 4);
  EXPECT_EQ(blocks.timeNs, 2000);
  EXPECT_EQ(blocks.bytes, 512);
  EXPECT_EQ(blocks.nonFiniteOps, 0);
  EXPECT_FALSE(blocks.worst.has_value());
  EXPECT_EQ(m.at("f:blocks.0.attn").ops, 2);
  // The backward side of blocks.0: add, softmax_backward and the accumulation it adopts (Note
  // [Adopted scopes]): summaries count ops where they are drawn.
  EXPECT_EQ(m.at("b:blocks.0").ops, 3);
  EXPECT_EQ(m.at("b:blocks.0.attn").ops, 1);
  EXPECT_FALSE(m.count("f:"));  // ops outside any module count in none
  EXPECT_EQ(summaryLines(blocks), std::vector<std::string>{"4 ops, 2.0 µs, 512 B"});
}

TEST(ModuleSummary, WorstVerdictAndNonFiniteOpsInside) {
  auto ops = smallStep();
  ops[2].tensors[1].hasStats = true;  // matmul's output: two NaNs
  ops[2].tensors[1].stats.nanCount = 2;
  OpVerdicts v;
  v.status = {{2, DiffStatus::Equal}, {3, DiffStatus::WithinTolerance}, {4, DiffStatus::Diverged}};
  v.first = 4;
  const GraphDot g = buildGraphDot(ops, GraphDotOptions{});
  const auto m = summarizeModules(ops, g, &v);
  const ModuleSummary& attn = m.at("f:blocks.0.attn");
  EXPECT_EQ(attn.nonFiniteOps, 1);
  EXPECT_EQ(attn.worst, DiffStatus::Diverged);
  EXPECT_TRUE(attn.firstDivergence);
  EXPECT_EQ(summaryLines(attn), (std::vector<std::string>{"2 ops, 1.0 µs, 256 B",
                                                          "1 op non-finite, first divergence"}));
  const ModuleSummary& norm = m.at("f:blocks.0.norm1");
  EXPECT_EQ(norm.worst, DiffStatus::Equal);
  EXPECT_FALSE(norm.firstDivergence);
  EXPECT_EQ(m.at("f:blocks").nonFiniteOps, 1);
  // The collapsed module node carries the summary's first line as its subtitle.
  GraphDotOptions collapsed;
  collapsed.expandAll = false;
  const GraphDot c = buildGraphDot(ops, collapsed);
  EXPECT_EQ(c.nodes[size_t(c.nodeOfId.at("m:f:blocks"))].subtitle, "4 ops, 2.0 µs, 512 B");
}

TEST(ModuleSummary, DurationsForPeople) {
  EXPECT_EQ(durationText(850), "850 ns");
  EXPECT_EQ(durationText(12'500), "12.5 \u00b5s");
  EXPECT_EQ(durationText(3'200'000), "3.20 ms");
  EXPECT_EQ(durationText(1'250'000'000), "1.25 s");
  EXPECT_EQ(opCountText(1), "1 op");
}

TEST(NonFiniteMarks, OpsWithANanOutputAndTheOpsTheyFeed) {
  auto ops = smallStep();
  EXPECT_EQ(nonFiniteMarks(ops), std::vector<NonFiniteMark>(ops.size(), NonFiniteMark::None));
  ops[2].tensors[1].hasStats = true;  // matmul (#3) writes tensor 12 with an Inf
  ops[2].tensors[1].stats.infCount = 1;
  ops[3].tensors[1].hasStats = true;  // softmax (#4) reads it and writes NaNs
  ops[3].tensors[1].stats.nanCount = 32;
  const auto marks = nonFiniteMarks(ops);
  EXPECT_TRUE(storage::nonFiniteAppearsAt(ops[2]));
  EXPECT_EQ(marks[2], NonFiniteMark::NonFinite);
  EXPECT_EQ(marks[3], NonFiniteMark::NonFinite);
  EXPECT_EQ(marks[4], NonFiniteMark::Fed);  // the residual add reads softmax's output (#13)
  EXPECT_EQ(marks[9], NonFiniteMark::Fed);  // softmax_backward reads it too
  EXPECT_EQ(marks[0], NonFiniteMark::None);
  EXPECT_EQ(marks[5], NonFiniteMark::None);  // two hops away: not marked
}

// Note [Where non-finite values appear]: a NaN always; an infinity unless an input held one
// (carried along) or the op is a masking fill (a causal mask's masked_fill(-inf)).
TEST(NonFiniteMarks, InfinitiesCarriedInOrPlacedByAMaskAreNotWhereTheyAppear) {
  auto tensor = [](storage::Role role, int64_t nan, int64_t inf) {
    storage::TensorRecord t;
    t.role = role;
    t.hasStats = true;
    t.stats.nanCount = nan;
    t.stats.infCount = inf;
    return t;
  };
  using storage::Role;
  storage::OpRecord fill;
  fill.name = "masked_fill";
  fill.tensors = {tensor(Role::Input, 0, 0), tensor(Role::Output, 0, 2016)};
  EXPECT_FALSE(storage::nonFiniteAppearsAt(fill));
  fill.name = "masked_fill_";  // PyTorch's in-place spelling
  EXPECT_FALSE(storage::nonFiniteAppearsAt(fill));
  fill.tensors[1].stats.nanCount = 1;  // a NaN is always a fault
  EXPECT_TRUE(storage::nonFiniteAppearsAt(fill));
  storage::OpRecord add;
  add.name = "add";
  add.tensors = {tensor(Role::Input, 0, 0), tensor(Role::Input, 0, 2016),
                 tensor(Role::Output, 0, 2016)};
  EXPECT_FALSE(storage::nonFiniteAppearsAt(add));  // scores + mask: the mask's -inf carried
  add.tensors[1].stats.infCount = 0;               // an overflow of its own
  EXPECT_TRUE(storage::nonFiniteAppearsAt(add));
  storage::OpRecord log;
  log.name = "log";
  log.tensors = {tensor(Role::Input, 0, 0), tensor(Role::Output, 0, 1)};  // log(0) = -inf
  EXPECT_TRUE(storage::nonFiniteAppearsAt(log));
  log.tensors[1].hasStats = false;  // without statistics nothing is known
  EXPECT_FALSE(storage::nonFiniteAppearsAt(log));
  // A mask broadcast over the batch: its -inf once per copy is carried; one more is new.
  storage::OpRecord scaled;
  scaled.name = "add";
  scaled.tensors = {tensor(Role::Input, 0, 0), tensor(Role::Input, 0, 6),
                    tensor(Role::Output, 0, 12)};
  scaled.tensors[0].shape = {2, 4, 4};
  scaled.tensors[1].shape = {4, 4};
  scaled.tensors[2].shape = {2, 4, 4};
  EXPECT_FALSE(storage::nonFiniteAppearsAt(scaled));
  scaled.tensors[2].stats.infCount = 13;  // an overflow beside the mask
  EXPECT_TRUE(storage::nonFiniteAppearsAt(scaled));
  EXPECT_TRUE(storage::isMaskingFill("fill"));
  EXPECT_TRUE(storage::isMaskingFill("where"));
  EXPECT_FALSE(storage::isMaskingFill("softmax"));
}

// Note [Non-finite colouring]: a mask's infinities carried on mark nothing; a fault's Inf carried
// on is red all the way (only where it appeared was red, and the ops holding it after were grey).
TEST(NonFiniteMarks, AMasksInfinitiesMarkNothingAFaultsAreRedWhereverTheyGo) {
  auto ops = smallStep();
  EXPECT_EQ(ops[2].name, "matmul");
  ops[2].tensors[1].hasStats = true;  // matmul (#3) writes tensor 12 with an Inf of its own
  ops[2].tensors[1].stats.infCount = 1;
  ops[3].tensors[0].hasStats = true;  // the next op reads it and carries it on
  ops[3].tensors[0].stats.infCount = 1;
  ops[3].tensors[1].hasStats = true;
  ops[3].tensors[1].stats.infCount = 1;
  auto marks = nonFiniteMarks(ops);
  EXPECT_EQ(marks[2], NonFiniteMark::NonFinite);
  EXPECT_EQ(marks[3], NonFiniteMark::NonFinite);  // carries the fault on
  EXPECT_FALSE(storage::nonFiniteAppearsAt(ops[3]));
  // The same chain from a masking fill: nothing marked, and the consumers are not Fed.
  ops[2].name = "masked_fill";
  marks = nonFiniteMarks(ops);
  EXPECT_EQ(marks[2], NonFiniteMark::None);
  EXPECT_EQ(marks[3], NonFiniteMark::None);
  EXPECT_EQ(std::count(marks.begin(), marks.end(), NonFiniteMark::None), long(ops.size()));
}

}  // namespace
}  // namespace keel::analysis
