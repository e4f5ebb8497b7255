// The collective ops across real ranks (run by ctest under mpirun at 2 and 4 ranks): values of
// every collective on both host backends, the groups of a dp × tp layout, identical bits on every
// rank for cpu-ref's rank-order all_reduce, Megatron's gradient rules, and the descriptor check
// naming the ranks that call different collectives.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "dist_test_util.h"
#include "keel/autograd.h"
#include "keel/dist.h"
#include "keel/ops.h"
#include "test_util.h"

namespace keel {
namespace {

using test::rank;
using test::world;

Tensor f32(const std::vector<double>& v, Device d) {
  return test::fromDoubles(v, {int64_t(v.size())}, DType::Float32, d);
}

class Backends : public ::testing::TestWithParam<const char*> {
 protected:
  Device dev() const { return Device(GetParam()); }
};

TEST(DistLayout, GroupsFollowTheLayout) {
  const dist::Layout l = dist::layout();
  EXPECT_EQ(l.world(), world());
  EXPECT_EQ(dist::group("world").rank, rank());
  EXPECT_EQ(dist::group("world").size, world());
  EXPECT_EQ(dist::group("tp").size, l.tp);
  EXPECT_EQ(dist::group("tp").rank, rank() % l.tp);
  EXPECT_EQ(dist::group("dp").size, l.dp);
  EXPECT_EQ(dist::group("dp").rank, rank() / l.tp);
  EXPECT_THROW(dist::group("pp"), Error);
  // Asking again for another layout is an error naming both.
  try {
    dist::init({l.dp * 2, l.tp});
    FAIL() << "a second layout was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already started as dp " + std::to_string(l.dp)),
              std::string::npos)
        << e.what();
  }
}

TEST_P(Backends, AllReduceSumMeanAndMaxAcrossTheWorld) {
  const double n = world(), r = rank();
  const Tensor x = f32({1 * (r + 1), 2 * (r + 1), -3 * (r + 1), 0.5}, dev());
  const double tri = n * (n + 1) / 2;  // sum of (r + 1) over the ranks
  EXPECT_EQ(ops::allReduce(x, "sum", "world").toVector<float>(),
            (std::vector<float>{float(tri), float(2 * tri), float(-3 * tri), float(0.5 * n)}));
  EXPECT_EQ(ops::allReduce(x, "mean", "world").toVector<float>(),
            (std::vector<float>{float(tri / n), float(2 * tri / n), float(-3 * tri / n), 0.5f}));
  EXPECT_EQ(ops::allReduce(x, "max", "world").toVector<float>(),
            (std::vector<float>{float(n), float(2 * n), -3.0f, 0.5f}));
  const Tensor i =
      Tensor::fromVector(std::vector<int64_t>{rank() + 1, 7}, {2}, DType::Int64, dev());
  EXPECT_EQ(ops::allReduce(i, "sum", "world").toVector<int64_t>(),
            (std::vector<int64_t>{int64_t(tri), 7 * world()}));
}

// Every rank must end with the same bits: the replicas of data parallelism rely on it.
TEST_P(Backends, AllReduceGivesEveryRankTheSameBits) {
  const Tensor x = test::randNormal({1000}, DType::Float32, dev(), 100 + uint64_t(rank()));
  const Tensor y = ops::allReduce(x, "sum", "world");
  const Tensor all = ops::allGather(y, 0, "world");  // every rank's result, side by side
  const std::vector<float> v = all.toVector<float>();
  for (int k = 1; k < world(); ++k)
    for (size_t i = 0; i < 1000; ++i)
      ASSERT_EQ(v[i], v[size_t(k) * 1000 + i]) << "rank " << k << " element " << i;
}

TEST_P(Backends, GatherScatterBroadcastAndAllToAll) {
  const int n = world(), r = rank();
  // all_gather along dim 1 of [2, 2]: columns of every rank in rank order.
  const Tensor x = test::fromDoubles(
      {double(10 * r), double(10 * r + 1), double(10 * r + 2), double(10 * r + 3)}, {2, 2},
      DType::Float32, dev());
  const Tensor g = ops::allGather(x, 1, "world");
  ASSERT_EQ(g.shape(), (Shape{2, 2 * n}));
  const std::vector<float> gv = g.toVector<float>();
  for (int k = 0; k < n; ++k) {
    EXPECT_EQ(gv[size_t(2 * k)], float(10 * k));
    EXPECT_EQ(gv[size_t(2 * k + 1)], float(10 * k + 1));
    EXPECT_EQ(gv[size_t(2 * n + 2 * k)], float(10 * k + 2));
  }
  // reduce_scatter along dim 0 of [n, 3] filled with rank + 1: every rank gets its row, summed.
  std::vector<double> rows;
  for (int k = 0; k < n; ++k)
    for (int j = 0; j < 3; ++j) rows.push_back(double((r + 1) * (k * 3 + j)));
  const Tensor rs =
      ops::reduceScatter(test::fromDoubles(rows, {n, 3}, DType::Float32, dev()), 0, "sum", "world");
  ASSERT_EQ(rs.shape(), (Shape{1, 3}));
  const double tri = double(n) * (n + 1) / 2;
  EXPECT_EQ(rs.toVector<float>(),
            (std::vector<float>{float(tri * (r * 3)), float(tri * (r * 3 + 1)),
                                float(tri * (r * 3 + 2))}));
  // reduce_scatter along dim 1 (the inner dim): [2, n] -> [2, 1].
  std::vector<double> cols;
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < n; ++k) cols.push_back(double(100 * i + k));
  const Tensor rc =
      ops::reduceScatter(test::fromDoubles(cols, {2, n}, DType::Float32, dev()), 1, "sum", "world");
  EXPECT_EQ(rc.toVector<float>(), (std::vector<float>{float(n * r), float(n * (100 + r))}));
  // broadcast from the last rank.
  const Tensor b = ops::broadcast(f32({double(r), 1.5}, dev()), n - 1, "world");
  EXPECT_EQ(b.toVector<float>(), (std::vector<float>{float(n - 1), 1.5f}));
  // all_to_all: rank r sends 100·r + j to rank j; receives 100·k + r from every k.
  std::vector<double> send;
  for (int j = 0; j < n; ++j) send.push_back(100.0 * r + j);
  const Tensor a = ops::allToAll(f32(send, dev()), "world");
  std::vector<float> want;
  for (int k = 0; k < n; ++k) want.push_back(float(100 * k + r));
  EXPECT_EQ(a.toVector<float>(), want);
}

// Megatron's rules: copy_to_group's gradient is the sum of the ranks' gradients; all_reduce's is
// the gradient itself; all_gather's is this rank's block.
TEST_P(Backends, GradientsFollowMegatronsRules) {
  const int n = world(), r = rank();
  Tensor x = f32({1.0, 2.0}, dev());
  x.setRequiresGrad();
  // Each rank weighs the copy differently: the sum of the weights reaches every rank's x.
  Tensor y = ops::mulScalar(ops::copyToGroup(x, "world"), double(r + 1));
  ops::sum(y).backward();
  const double tri = double(n) * (n + 1) / 2;
  EXPECT_EQ(x.grad().toVector<float>(), (std::vector<float>{float(tri), float(tri)}));

  Tensor u = f32({3.0, 4.0}, dev());
  u.setRequiresGrad();
  Tensor g = ops::allGather(u, 0, "world");  // [2n]
  std::vector<double> w;
  for (int i = 0; i < 2 * n; ++i) w.push_back(double(i));
  ops::sum(ops::mul(g, f32(w, dev()))).backward();
  EXPECT_EQ(u.grad().toVector<float>(), (std::vector<float>{float(2 * r), float(2 * r + 1)}));
}

INSTANTIATE_TEST_SUITE_P(Host, Backends, ::testing::Values("cpu", "cpu-ref"), [](const auto& info) {
  return std::string(info.param) == "cpu" ? "cpu" : "cpu_ref";
});

// --check-collectives: ranks that call different collectives learn it at once, naming both.
TEST(DistDescriptors, AMismatchIsAnErrorOnEveryRankNamingTheRanks) {
  dist::Options o = dist::options();
  dist::setOptions({o.timeoutSeconds, true});
  const int64_t len = rank() == 1 ? 5 : 4;  // rank 1 calls it with another length
  std::string message;
  try {
    ops::allReduce(Tensor::zeros({len}, DType::Float32, Device("cpu")), "sum", "world");
  } catch (const dist::CollectiveError& e) {
    message = e.what();
  }
  dist::setOptions(o);
  ASSERT_FALSE(message.empty()) << "rank " << rank() << ": no mismatch reported";
  EXPECT_NE(message.find("collective mismatch in group world"), std::string::npos) << message;
  EXPECT_NE(message.find(rank() == 1 ? "(float32 x 5)" : "(float32 x 4)"), std::string::npos)
      << message;
  EXPECT_NE(message.find("where rank " + std::to_string(rank() == 1 ? 0 : 1)), std::string::npos)
      << message;
  // The ring remembers the collective that failed.
  const auto ring = dist::recentCollectives();
  ASSERT_FALSE(ring.empty());
  EXPECT_EQ(ring.back().kind, "all_reduce");
  EXPECT_EQ(ring.back().group, "world");
}

}  // namespace
}  // namespace keel

// Every rank runs every test; the layout is dp = world / 2, tp = 2 when the world is even (the
// dp and tp groups then differ from the world), else dp = world.
int main(int argc, char** argv) {
  return keel::test::runAllRanks(argc, argv, [](int n) {
    return n % 2 == 0 ? keel::dist::Layout{n / 2, 2} : keel::dist::Layout{n, 1};
  });
}
