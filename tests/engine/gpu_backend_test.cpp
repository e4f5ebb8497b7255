// The CUDA backend's host side, tested on every machine (no GPU needed): the launch and FlashMask
// tile plans (engine/backends/cuda/launch.h, flashmask_plan.h), loading the backend plugin (Note
// [CUDA backend plugin]) and the one-line errors a cuda:N device gives where it cannot run. The
// kernels themselves are tested on a GPU (cuda_ops_parity_test, label gpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "cuda/dd_math.h"
#include "cuda/flashmask_plan.h"
#include "cuda/launch.h"
#include "flashmask/flashmask_geometry.h"
#include "keel/ops.h"
#include "keel/registry.h"
#include "test_util.h"

namespace keel::test {
namespace {

using cuda::kMaxBlocks;
using cuda::kThreads;

TEST(CudaLaunchPlan, ElementwiseGridCoversEveryElementOnce) {
  EXPECT_EQ(cuda::launch1D(0).blocks, 1u);  // never an empty grid
  EXPECT_EQ(cuda::launch1D(1).blocks, 1u);
  EXPECT_EQ(cuda::launch1D(256).blocks, 1u);
  EXPECT_EQ(cuda::launch1D(257).blocks, 2u);
  EXPECT_EQ(cuda::launch1D(1000).threads, unsigned(kThreads));
  // Past kMaxBlocks the grid stays at kMaxBlocks and threads loop (grid-stride).
  EXPECT_EQ(cuda::launch1D(int64_t(1) << 40).blocks, unsigned(kMaxBlocks));
  for (int64_t n : {1, 255, 256, 257, 100000, 1234567}) {
    const cuda::Launch1D l = cuda::launch1D(n);
    EXPECT_GE(int64_t(l.blocks) * l.threads, std::min<int64_t>(n, kMaxBlocks * kThreads)) << n;
  }
}

TEST(CudaLaunchPlan, RowKernelsUseAWarpMultipleUpTo1024Threads) {
  EXPECT_EQ(cuda::rowLaunch(10, 1).threads, 32u);
  EXPECT_EQ(cuda::rowLaunch(10, 100).threads, 128u);
  EXPECT_EQ(cuda::rowLaunch(10, 100).blocks, 10u);
  EXPECT_EQ(cuda::rowLaunch(1, 5000).threads, 1024u);
  EXPECT_EQ(cuda::rowLaunch(1000000, 64).blocks, 65535u);  // rows loop past the grid
  EXPECT_EQ(cuda::rowLaunch(0, 64).blocks, 1u);
}

TEST(CudaLaunchPlan, ReductionPlanDependsOnTheShapeOnly) {
  // Long rows reduced over the last dim: a block per output.
  const cuda::ReducePlan rows = cuda::reducePlan(8, 4096, 1);
  EXPECT_TRUE(rows.blockPerOutput);
  EXPECT_EQ(rows.blocks, 8u);
  EXPECT_EQ(rows.threads, 1024u);
  // Columns (inner > 1) or short rows: a thread per output.
  EXPECT_FALSE(cuda::reducePlan(4, 4096, 16).blockPerOutput);
  EXPECT_FALSE(cuda::reducePlan(4, 10, 1).blockPerOutput);
  EXPECT_EQ(cuda::reducePlan(4, 4096, 16).blocks, 1u);
}

// The cuda FlashMask kernels' plan (engine/backends/cuda/flashmask_plan.h): every supported head
// dim fits the opt-in shared memory and the tiles cover the sequence.
TEST(CudaFlashMaskPlan, EveryHeadDimFitsSharedMemoryAndTilesCoverTheSequence) {
  namespace fp = cuda::fmplan;
  for (int cb : {4, 8})
    for (int64_t d = 1; d <= fp::kMaxHeadDim; ++d) {
      SCOPED_TRACE("head dim " + std::to_string(d) + ", compute bytes " + std::to_string(cb));
      const fp::ForwardPlan f = fp::forwardPlan(2, 1000, 777, 3, d, cb);
      EXPECT_LE(f.smemBytes, fp::kMaxSmem);
      EXPECT_EQ(f.br % 16, 0);
      EXPECT_GE(f.nqt * f.br, 1000);
      EXPECT_LT((f.nqt - 1) * f.br, 1000);
      EXPECT_GE(f.nkt * f.bc, 777);
      EXPECT_EQ(f.grid.x, unsigned(f.nqt));
      const fp::BackwardPlan b = fp::backwardPlan(2, 1000, 777, 4, 2, d, cb);
      EXPECT_LE(b.dkvSmemBytes, fp::kMaxSmem);
      EXPECT_LE(b.dqSmemBytes, fp::kMaxSmem);
      EXPECT_EQ(b.dkvGrid.y, 2u);  // one block per kv head: no two blocks write one dK row
      EXPECT_EQ(b.dqGrid.y, 4u);
    }
  EXPECT_EQ(fp::headDimBucket(0), 0);
  EXPECT_EQ(fp::headDimBucket(fp::kMaxHeadDim + 1), 0);
}

// The tile classes the cuda kernels compute (fmplan::classifyTile, the host's rule run on the
// device) against the dense masks: a skipped tile has no visible pair, an unmasked one no masked
// pair, for every mask kind and both tile shapes.
TEST(CudaFlashMaskPlan, TileClassesAgreeWithTheDenseMask) {
  namespace fm = keel::flashmask;
  namespace geo = keel::detail::flashmask;
  struct Case {
    const char* name;
    fm::Mask mask;
    int64_t window;
  };
  const int64_t s = 300;
  const std::vector<Case> cases{{"causal_document", fm::causalDocument({70, 130, 100}), -1},
                                {"document", fm::document({100, 64, 136}), -1},
                                {"sliding_window", fm::slidingWindow(s, 40), -1},
                                {"shared_question", fm::sharedQuestion(60, {90, 80, 70}), -1},
                                {"global_sliding_window", fm::globalSlidingWindow(s, 8, 50), -1},
                                {"random_eviction", fm::randomEviction(s, 7), -1},
                                {"prefix_lm_causal", fm::prefixLmCausal(s, 90), -1},
                                {"causal_window_33", fm::causal(s), 33}};
  for (const Case& c : cases)
    for (DType dt : {DType::BFloat16, DType::Float64})
      for (bool backward : {false, true}) {
        SCOPED_TRACE(std::string(c.name) + " " + std::string(dtypeName(dt)) +
                     (backward ? " backward" : " forward"));
        const fm::TileShape ts = cuda::fmplan::tileShape(64, dt, backward);
        const Tensor& idx = c.mask.startendRowIndices;
        const geo::Geometry g{s, s, c.mask.causal, c.window};
        const geo::ColumnBounds cb = geo::readBounds(idx, 0, 0, g);
        const std::vector<geo::TileBounds> tiles = geo::tileBounds(cb, s, ts.cols);
        const std::vector<uint8_t> dense = fm::denseVisibility(idx, c.mask.causal, s, s, c.window);
        int64_t skipped = 0;
        for (int64_t m0 = 0; m0 < s; m0 += ts.rows)
          for (int64_t n0 = 0, kt = 0; n0 < s; n0 += ts.cols, ++kt) {
            const int64_t m1 = std::min(s, m0 + ts.rows), n1 = std::min(s, n0 + ts.cols);
            const int cls = cuda::fmplan::classifyTile(tiles[size_t(kt)], c.mask.causal, c.window,
                                                       0, m0, m1, n0, n1);
            int64_t visible = 0;
            for (int64_t i = m0; i < m1; ++i)
              for (int64_t j = n0; j < n1; ++j) visible += dense[size_t(i * s + j)];
            if (cls == cuda::fmplan::kSkip) {
              EXPECT_EQ(visible, 0) << "tile " << m0 << "," << n0;
              ++skipped;
            }
            if (cls == cuda::fmplan::kUnmasked) {
              EXPECT_EQ(visible, (m1 - m0) * (n1 - n0)) << "tile " << m0 << "," << n0;
            }
          }
        EXPECT_GT(skipped, 0) << "every one of these masks has wholly masked tiles";
      }
}

// The device's float64 normals use double-double log and cos (engine/backends/cuda/dd_math.h), the
// same code on the host: correctly rounded against long double (64-bit mantissa, 11 bits more)
// wherever long double's value is not within 1/128 ulp of a rounding midpoint, over the inputs
// Box-Muller gives them (u1 in (0, 1], 2πu2 in [0, 2π)) and near the zeros of cos.
TEST(CudaDeviceMath, DoubleDoubleLogAndCosAreCorrectlyRounded) {
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&] {  // splitmix64
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  // r rounded to double unless it lies too near a midpoint between two doubles to tell.
  auto clearRounding = [](long double r, double* out) {
    const double d = double(r);
    const long double ulp = std::fabs(std::nextafter(d, 2.0 * d + 1.0) - d);
    const long double frac = std::fabs(r - (long double)d) / ulp;  // in [0, 0.5]
    *out = d;
    return std::fabs(frac - 0.5L) > 0x1p-7L && ulp > 0;
  };
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    const uint64_t w = next();
    const double u1 = (double(uint32_t(w)) + 1.0) / 4294967296.0;
    const double a = 6.283185307179586 * (double(uint32_t(w >> 32)) / 4294967296.0);
    double want;
    if (u1 != 1.0 && clearRounding(logl((long double)u1), &want)) {
      ASSERT_EQ(cuda::dd::logCr(u1), want) << "log(" << u1 << ")";
      ++checked;
    }
    if (clearRounding(cosl((long double)a), &want)) {
      ASSERT_EQ(cuda::dd::cosCr(a), want) << "cos(" << a << ")";
      ++checked;
    }
  }
  EXPECT_EQ(cuda::dd::logCr(1.0), 0.0);
  for (double z : {1.5707963267948966, 4.71238898038469}) {  // next to the zeros of cos
    double a = std::nextafter(z, 0.0), want;
    for (int k = 0; k < 4; ++k, a = std::nextafter(a, 8.0)) {
      if (clearRounding(cosl((long double)a), &want)) {
        EXPECT_EQ(cuda::dd::cosCr(a), want) << a;
      }
    }
  }
  EXPECT_GT(checked, 390000);
}

// These tests describe a machine without a usable CUDA device (this one, and CI); on a GPU machine
// the gpu suite covers the same calls.
class NoCudaDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cudaDevices() > 0) GTEST_SKIP() << "a CUDA device is present";
  }
  static std::string expectedReason() {
    const std::string why = loadCudaBackend();
    return why.empty() ? "no CUDA device (" : why;
  }
};

TEST_F(NoCudaDevice, TensorsOnCudaAreRefusedWithTheReason) {
  try {
    Tensor::zeros({2, 3}, DType::Float32, Device("cuda:0"));
    FAIL() << "expected keel::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("device 'cuda:0' is not available: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(expectedReason()), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST_F(NoCudaDevice, CopiesToCudaAreRefusedBeforeAnyWork) {
  Tensor x = fromDoubles({1, 2, 3}, {3}, DType::Float32, kCpu);
  try {
    x.to(Device("cuda:0"));
    FAIL() << "expected keel::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device 'cuda:0' is not available"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(x.toVector<double>(), (std::vector<double>{1, 2, 3}));  // the host tensor is intact
}

// Through the real binary: training on cuda where there is none is one line and exit code 2, before
// anything is written (a file already there stays as it was).
TEST_F(NoCudaDevice, KeelTrainAndRecordOnCudaSayWhyInOneLine) {
  const std::string dir = ::testing::TempDir() + "/keel_no_cuda";
  std::filesystem::create_directories(dir);
  const std::string kept = dir + "/kept.db";  // a recording the user already had
  ASSERT_EQ(
      runKeelCli("record --config tests/fixtures/gpt-tiny.json --steps 1 -o " + kept, dir).status,
      0);
  std::string before;
  {
    std::ifstream in(kept, std::ios::binary);
    before.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  for (const std::string& args :
       {"record --config configs/gpt-mini.json --steps 1 --backend cuda -o " + kept,
        std::string("train --config configs/gpt-mini.json --steps 1 --backend cuda:0")}) {
    SCOPED_TRACE(args);
    expectOneLineError(runKeelCli(args, dir), "device 'cuda:0' is not available: ");
  }
  std::ifstream in(kept, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(text == before) << "the recording was changed";
  std::filesystem::remove_all(dir);
}

TEST(CudaBackendPlugin, LoadsWhereBuiltAndRegistersEveryKernel) {
  const std::string why = loadCudaBackend();
  if (why.find("has no CUDA backend") != std::string::npos) GTEST_SKIP() << why;
  ASSERT_EQ(why, "");
  const Registry& r = Registry::get();
  for (int i = 0; i < kNumBuiltinOps; ++i) {
    const OpDef& op = r.op(i);
    if (isViewOp(OpId(i))) continue;
    EXPECT_NE(op.kernels[int(Backend::Cuda)].fn, nullptr) << op.name;
    EXPECT_EQ(op.kernels[int(Backend::Cuda)].dtypes, op.kernels[int(Backend::Cpu)].dtypes)
        << op.name;
  }
}

// Through the real binary: `keel ops --backend cuda` loads the backend (a fresh process, so
// KEEL_CUDA_BACKEND is read) and lists its kernels, or says in one line why it cannot.
TEST(CudaBackendPlugin, KeelOpsListsTheCudaKernelsOrSaysWhyNot) {
  const std::string dir = ::testing::TempDir();
  CliResult missing = runKeelCli("ops --kernels --backend cuda", dir,
                                 "KEEL_CUDA_BACKEND=/nonexistent/libkeel_cuda.so");
  expectOneLineError(missing, "the CUDA backend could not be loaded (/nonexistent/libkeel_cuda.so");
  expectOneLineError(runKeelCli("ops --backend tpu", dir), "--backend: unknown backend 'tpu'");

  if (loadCudaBackend().find("has no CUDA backend") != std::string::npos)
    GTEST_SKIP() << "this build has no CUDA backend";
  CliResult r = runKeelCli("ops --kernels --backend cuda", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const int kernels = kNumBuiltinOps - int(std::size(kViewOps));
  EXPECT_NE(r.out.find(std::to_string(kernels) + " kernels, " +
                       std::to_string(std::size(kViewOps)) + " views"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("matmul                       cuda     cuBLAS gemm"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find(" cpu-ref "), std::string::npos) << "only the cuda kernels are listed";
}

}  // namespace
}  // namespace keel::test
