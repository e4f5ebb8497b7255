// Context-parallel FlashMask attention across real ranks (run by ctest under mpirun at 2 and 4
// ranks; the world is the context-parallel group): the zig-zag split and its work shares, and the
// ring's outputs, log-sum-exps and gradients against one process's attention of the whole
// sequence for causal, sliding-window and causal-document masks, under both splits.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dist_test_util.h"
#include "keel/autograd.h"
#include "keel/context_parallel.h"
#include "keel/dist.h"
#include "keel/ops.h"
#include "test_util.h"

namespace keel {
namespace {

using test::rank;
using test::world;

TEST(ContextParallelSplit, ZigZagGivesEachRankAnEarlyAndALateChunk) {
  // 16 tokens over n ranks: 2n chunks; rank r holds chunks r and 2n-1-r.
  const int64_t len = 16 / (2 * world());
  const std::vector<int64_t> pos = cp::localPositions(16, world(), rank(), cp::Split::ZigZag);
  ASSERT_EQ(pos.size(), size_t(2 * len));
  EXPECT_EQ(pos.front(), rank() * len);
  EXPECT_EQ(pos[size_t(len)], (2 * world() - 1 - rank()) * len);
  EXPECT_EQ(cp::localPositions(16, world(), rank(), cp::Split::Contiguous).front(),
            rank() * 16 / world());
  EXPECT_THROW(cp::localPositions(18, 4, 0, cp::Split::ZigZag), Error);
}

// Under a causal mask a contiguous split gives the last rank most of the work; the zig-zag split
// gives every rank the same share (exactly: its two chunks' rows sum to the same).
TEST(ContextParallelSplit, ZigZagBalancesTheCausalWork) {
  const flashmask::Mask causal = flashmask::causal(256);
  const std::vector<double> even = cp::workShares(causal, 256, world(), cp::Split::ZigZag);
  const std::vector<double> cont = cp::workShares(causal, 256, world(), cp::Split::Contiguous);
  ASSERT_EQ(even.size(), size_t(world()));
  for (double s : even) EXPECT_NEAR(s, 1.0 / world(), 1e-12);
  // Contiguous at 2 ranks: rank 0's 128 rows see 8,256 of the 32,896 visible pairs.
  if (world() == 2) {
    EXPECT_NEAR(cont[0], 8256.0 / 32896.0, 1e-12);
  }
  EXPECT_GT(cont.back() / cont.front(), 2.9);
}

struct MaskCase {
  std::string name;
  flashmask::Mask mask;
  int64_t window = -1;
};

std::vector<MaskCase> masks(int64_t s, int64_t batch) {
  std::vector<MaskCase> out;
  auto rows = [batch](flashmask::Mask m) {  // the op wants one mask row per batch row
    m.startendRowIndices = flashmask::repeatMask(m.startendRowIndices, batch, 1);
    return m;
  };
  out.push_back({"causal", rows(flashmask::causal(s))});
  out.push_back({"sliding_window", rows(flashmask::slidingWindow(s, 9))});
  flashmask::Mask diagonal;  // no indices: the causal diagonal alone (GPT's causal layers)
  diagonal.causal = true;
  diagonal.kind = flashmask::MaskKind::Causal;
  out.push_back({"causal diagonal", diagonal});
  // Bidirectional documents under a window of 5 on the op (folded into each pair's bounds).
  out.push_back({"document + window", rows(flashmask::document({20, 12, 32})), 5});
  // Two rows of packed documents, different boundaries per row.
  out.push_back({"causal_document", flashmask::causalDocumentRows({{20, 12, 32}, {7, 41, 16}})});
  return out;
}

// The ring against one process: out and lse equal within float rounding, gradients of q, k and v
// (k and v's travelling back round the ring) too.
TEST(ContextParallelAttention, RingEqualsOneProcessForEveryMaskAndSplit) {
  const int64_t b = 2, s = 64, h = 2, d = 16;
  const Device dev(Backend::Cpu);
  for (const cp::Split split : {cp::Split::ZigZag, cp::Split::Contiguous})
    for (const MaskCase& mc : masks(s, b)) {
      SCOPED_TRACE(mc.name + " " + cp::splitName(split));
      // The same inputs on every rank (same seeds).
      Tensor q = test::randNormal({b, s, h, d}, DType::Float32, dev, 11);
      Tensor k = test::randNormal({b, s, h, d}, DType::Float32, dev, 12);
      Tensor v = test::randNormal({b, s, h, d}, DType::Float32, dev, 13);
      const Tensor w = test::randNormal({b, s, h, d}, DType::Float32, dev, 14);
      for (Tensor* t : {&q, &k, &v}) t->setRequiresGrad(true);
      auto [ref, refLse] = ops::flashmaskAttention(q, k, v, mc.mask, mc.window);
      ops::sum(ops::mul(ref, w)).backward();

      auto part = [&](const Tensor& x, int64_t dim = 1) {
        return cp::shard(x.detach(), dim, world(), rank(), split);
      };
      Tensor ql = part(q), kl = part(k), vl = part(v);
      for (Tensor* t : {&ql, &kl, &vl}) t->setRequiresGrad(true);
      cp::RingStats stats;
      auto [out, lse] =
          cp::ringAttention(ql, kl, vl, mc.mask, mc.window, 0.0, split, "world", &stats);
      ops::sum(ops::mul(out, part(w))).backward();

      EXPECT_TRUE(test::allClose(out, part(ref), 2e-6, 1e-5));
      EXPECT_TRUE(test::allClose(lse, part(refLse, 2), 2e-6, 1e-5));
      EXPECT_TRUE(test::allClose(ql.grad(), part(q.grad()), 1e-5, 1e-4));
      EXPECT_TRUE(test::allClose(kl.grad(), part(k.grad()), 1e-5, 1e-4));
      EXPECT_TRUE(test::allClose(vl.grad(), part(v.grad()), 1e-5, 1e-4));
      // The whole output gathered back in sequence order is one process's.
      EXPECT_TRUE(
          test::allClose(cp::unshard(out.detach(), 1, split, "world"), ref.detach(), 2e-6, 1e-5));
      // Chunk pairs: n steps × (chunks per rank)²; every mask here is causal, so a query chunk
      // never computes with a later key chunk: every zig-zag rank skips its early chunk against
      // its own late one, and contiguous rank 0 every other rank's keys.
      const int64_t chunks = split == cp::Split::ZigZag ? 2 : 1;
      EXPECT_EQ(stats.pairsComputed + stats.pairsSkipped, world() * chunks * chunks);
      if (mc.mask.causal && (split == cp::Split::ZigZag || rank() == 0)) {
        EXPECT_GE(stats.pairsSkipped, split == cp::Split::ZigZag ? 1 : world() - 1);
      }
    }
}

}  // namespace
}  // namespace keel

// Every rank runs every test; the world (dp = world) is the context-parallel group.
int main(int argc, char** argv) {
  return keel::test::runAllRanks(argc, argv, [](int n) { return keel::dist::Layout{n, 1}; });
}
