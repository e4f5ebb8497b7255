// matmul on `cpu` over the layouts engine/backends/cpu/matmul.cpp handles — wide and tall
// products, transposed operands, a batch whose shared B is folded into the rows, per-item B, a
// batch of small products spread over the pool, broadcast batch dims — agrees with cpu-ref within
// the float32 parity tolerance and gives the same bits on one Keel thread as on two (Note [cpu
// determinism]).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "keel/ops.h"
#include "keel/train.h"
#include "test_util.h"

namespace keel {
namespace {

struct Case {
  const char* name;
  Shape a, b;
  bool transA = false, transB = false;
};

// Products of >= 262,144 multiply-adds run on OpenBLAS's own threads; "batched small items" is a
// batch of smaller ones, spread over Keel's pool one product per call.
const std::vector<Case> kCases = {
    {"rows (1024x128 @ 128x384)", {1024, 128}, {128, 384}},
    {"rows, uneven last block (1000x96 @ 96x200)", {1000, 96}, {96, 200}},
    {"columns (64x256 @ 256x1000)", {64, 256}, {256, 1000}},
    {"transposed A (rows)", {128, 700}, {128, 64}, true, false},
    {"transposed B (columns)", {96, 160}, {900, 160}, false, true},
    {"both transposed", {300, 600}, {250, 300}, true, true},
    {"batched, shared B folded into rows", {4, 256, 64}, {64, 96}},
    {"batched, per-item B", {3, 256, 64}, {3, 64, 160}},
    {"batched small items", {16, 32, 16}, {16, 16, 32}},
    {"broadcast batch", {2, 1, 64, 48}, {1, 3, 48, 200}},
};

// a @ b on `cpu` on one thread, on two, and on two again: the same bits each time; and within
// `tol` (atol = rtol) of cpu-ref's product of the same operands.
void checkProduct(const Tensor& a, const Tensor& b, bool transA, bool transB, double tol) {
  test::ThreadsScope restore;
  setCpuThreads(1);
  Tensor one = ops::matmul(a, b, transA, transB);
  setCpuThreads(2);
  Tensor two = ops::matmul(a, b, transA, transB), again = ops::matmul(a, b, transA, transB);
  EXPECT_TRUE(test::bitEqual(one, two));
  EXPECT_TRUE(test::bitEqual(two, again));
  Tensor ref = ops::matmul(a.to(test::kCpuRef), b.to(test::kCpuRef), transA, transB);
  EXPECT_TRUE(test::allClose(two.to(test::kCpuRef), ref, tol, tol));
}

TEST(MatmulLayouts, AgreesWithTheReferenceAndGivesTheSameBitsOnOneThreadAsOnTwo) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    // |a|,|b| <= 1 and K <= 900: float32 accumulation differs from the reference's float64 by
    // far less than 1e-4.
    checkProduct(test::randUniform(c.a, -1, 1, DType::Float32, test::kCpu, 11),
                 test::randUniform(c.b, -1, 1, DType::Float32, test::kCpu, 12), c.transA, c.transB,
                 1e-4);
  }
}

TEST(MatmulLayouts, Float64ProductsAgreeWithTheReference) {
  checkProduct(test::randUniform({700, 80}, -1, 1, DType::Float64, test::kCpu, 21),
               test::randUniform({80, 300}, -1, 1, DType::Float64, test::kCpu, 22), false, false,
               1e-12);
}

}  // namespace
}  // namespace keel
