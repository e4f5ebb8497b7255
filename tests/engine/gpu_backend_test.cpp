// The CUDA backend's host side, tested on every machine (no GPU needed): the launch plans of
// engine/backends/cuda/launch.h, loading the backend plugin (Note [CUDA backend plugin]) and the
// one-line errors a cuda:N device gives where it cannot run. The kernels themselves are tested on
// a GPU (cuda_ops_parity_test, label gpu).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "cuda/launch.h"
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
  const std::string kept = dir + "/kept.db";
  { std::ofstream(kept) << "the user's file"; }
  for (const std::string& args :
       {"record --config configs/gpt-mini.json --steps 1 --backend cuda -o " + kept,
        std::string("train --config configs/gpt-mini.json --steps 1 --backend cuda:0")}) {
    SCOPED_TRACE(args);
    expectOneLineError(runKeelCli(args, dir), "device 'cuda:0' is not available: ");
  }
  std::ifstream in(kept);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "the user's file");
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
