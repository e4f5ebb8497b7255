// Shared helpers for the engine tests: seeded random tensors, device copies, tolerance-based
// comparison that reports the worst element, and a float64 finite-difference gradient checker.
// Every helper is deterministic: the same arguments give the same bits on every run and device.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>
#include <filesystem>

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "keel/base/non_copyable.h"
#include "keel/dispatch.h"
#include "keel/ops.h"
#include "keel/tensor.h"

namespace keel {
// GoogleTest printers, so parameterized test names and failure messages show "cpu", "float16".
inline void PrintTo(const Device& d, std::ostream* os) {
  *os << d.name();
}
inline void PrintTo(DType t, std::ostream* os) {
  *os << dtypeName(t);
}
}  // namespace keel

namespace keel::test {

// The keel::Error message fn raises, or "(no error)" (a segfault ends the test binary).
inline std::string errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

inline const Device kCpu{Backend::Cpu};
inline const Device kCpuRef{Backend::CpuRef};
// Test names for suites parameterized over {kCpuRef, kCpu}: "cpu_ref", "cpu".
inline std::string backendParamName(const ::testing::TestParamInfo<Device>& i) {
  return i.param == kCpu ? "cpu" : "cpu_ref";
}

// Uniform values in [low, high) from std::mt19937_64(seed), converted to dtype (rounded to nearest
// even for 16-bit floats, truncated toward zero for ints, x != 0 for bool).
Tensor randUniform(const Shape& shape, double low, double high, DType dtype, Device device,
                   uint64_t seed);
// Standard normal values (mean 0, std 1) from std::mt19937_64(seed).
Tensor randNormal(const Shape& shape, DType dtype, Device device, uint64_t seed);
// Integers uniform in [low, high] (inclusive), stored as dtype (any dtype).
Tensor randInt(const Shape& shape, int64_t low, int64_t high, DType dtype, Device device,
               uint64_t seed);
// Distinct values (k - floor(n/2) + 1/2) * gap for k = 0..n-1, shuffled: no ties for
// max/argmax/topk/sort, no value at 0, and finite differences smaller than gap/2 cross no kink.
Tensor randDistinct(const Shape& shape, double gap, DType dtype, Device device, uint64_t seed);
// Host values converted to dtype on device (the one way tests write literal tensors).
Tensor fromDoubles(const std::vector<double>& values, const Shape& shape,
                   DType dtype = DType::Float64, Device device = Device(Backend::CpuRef));
Tensor fromInts(const std::vector<int64_t>& values, const Shape& shape, DType dtype = DType::Int64,
                Device device = Device(Backend::CpuRef));

// Copies t to device (Tensor::to; a no-op when already there).
Tensor toDevice(const Tensor& t, Device device);
// Row-major host values as doubles.
std::vector<double> values(const Tensor& t);

struct Tolerance {
  double atol = 0;
  double rtol = 0;
};
// Default tolerances for comparing two backends on one op, by dtype (see ops_parity_test.cpp).
Tolerance defaultTolerance(DType t);

// Same shape and dtype, and |a - b| <= atol + rtol * |b| elementwise (b is the reference). NaN
// matches NaN and infinities match themselves. On failure the message names the worst element
// (row-major index and multi-index), both values, and how many elements failed.
::testing::AssertionResult allClose(const Tensor& actual, const Tensor& expected, double atol,
                                    double rtol);
inline ::testing::AssertionResult allClose(const Tensor& actual, const Tensor& expected,
                                           Tolerance tol) {
  return allClose(actual, expected, tol.atol, tol.rtol);
}
// Bit-for-bit equality of the row-major element bytes (same shape and dtype).
::testing::AssertionResult bitEqual(const Tensor& actual, const Tensor& expected);

// Restores the cpu thread count (keel::setCpuThreads) a test changes, when it goes out of scope.
class ThreadsScope : NonCopyable {
 public:
  ThreadsScope();
  ~ThreadsScope();
  int saved() const { return saved_; }  // the count it restores

 private:
  int saved_;
};

using GradFn = std::function<Tensor(const std::vector<Tensor>&)>;
struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-4;
  uint64_t seed = 1234;  // seed of the fixed random upstream weights w
};
// Compares the autograd gradient of L(x) = sum(fn(x) * w) with respect to every input that
// requires grad (float64 leaves) against central differences (L(x+eps) - L(x-eps)) / (2 eps).
// w is a fixed random float64 tensor shaped like fn's output, so the upstream gradient is not
// uniform. Inputs that do not require grad (indices, masks) are passed through unchanged.
::testing::AssertionResult gradcheck(const GradFn& fn, const std::vector<Tensor>& inputs,
                                     GradcheckOptions opt = {});

// ---- the keel command-line tool, run as a child process (tests with a KEEL_CLI_PATH)
// A test with a fresh directory of its own, dir_ (under the test temp dir, named after the test
// and the process), removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("keel_test_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" +
            info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

struct CliResult {
  int status = -1;  // exit status (128 + signal when killed)
  std::string out, err;
};
// Runs `keel <args>` from the source tree (so relative config paths work), with OpenBLAS left at
// its own kernels; stdout and stderr are captured through files in workDir.
// env: extra VAR=value words placed before the command (e.g. "KEEL_TEST_PERTURB=matmul:5").
CliResult runKeelCli(const std::string& args, const std::string& workDir,
                     const std::string& env = "");
// A bad-input failure: exit status 2 and exactly one "keel: error: ..." line containing fragment.
void expectOneLineError(const CliResult& r, const std::string& fragment);

// A test of the keel tool in its own temporary directory: keel(args) runs it there (runKeelCli).
class KeelCliTest : public TempDirTest {
 protected:
  CliResult keel(const std::string& args, const std::string& env = "") const {
    return runKeelCli(args, dir_.string(), env);
  }
};

}  // namespace keel::test
