// Shared engine-test helpers (see test_util.h). Random values come from std::mt19937_64 turned
// into doubles by hand (not std::*_distribution, whose output differs between standard libraries),
// so a seed gives the same tensor everywhere.
#include "test_util.h"

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

#include "keel/base/text.h"
#include "keel/train.h"

namespace keel::test {
namespace {

double unit(std::mt19937_64& rng) {
  return double(rng() >> 11) * (1.0 / 9007199254740992.0);
}

std::string multiIndex(int64_t i, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) {
    int64_t s = std::max<int64_t>(shape[size_t(d)], 1);
    idx[size_t(d)] = i % s;
    i /= s;
  }
  return shapeStr(idx);
}

bool sameSpecial(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return false;
}

}  // namespace

Tensor fromDoubles(const std::vector<double>& v, const Shape& shape, DType dtype, Device device) {
  return Tensor::fromVector<double>(v, shape, dtype, device);
}

Tensor fromInts(const std::vector<int64_t>& v, const Shape& shape, DType dtype, Device device) {
  return Tensor::fromVector<int64_t>(v, shape, dtype, device);
}

Tensor randUniform(const Shape& shape, double low, double high, DType dtype, Device device,
                   uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> v(size_t(shapeNumel(shape)));
  for (auto& x : v) x = low + (high - low) * unit(rng);
  return fromDoubles(v, shape, dtype, device);
}

Tensor randNormal(const Shape& shape, DType dtype, Device device, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> v(size_t(shapeNumel(shape)));
  for (auto& x : v) {
    double u1 = 1.0 - unit(rng);  // (0, 1]
    double u2 = unit(rng);
    x = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  return fromDoubles(v, shape, dtype, device);
}

Tensor randInt(const Shape& shape, int64_t low, int64_t high, DType dtype, Device device,
               uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> v(size_t(shapeNumel(shape)));
  uint64_t span = uint64_t(high - low) + 1;
  for (auto& x : v) x = double(low + int64_t(rng() % span));
  return fromDoubles(v, shape, dtype, device);
}

Tensor randDistinct(const Shape& shape, double gap, DType dtype, Device device, uint64_t seed) {
  std::mt19937_64 rng(seed);
  int64_t n = shapeNumel(shape);
  std::vector<double> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0.0);
  for (int64_t i = n - 1; i > 0; --i) std::swap(v[size_t(i)], v[size_t(rng() % uint64_t(i + 1))]);
  // Centred on zero at half-integer multiples of gap: no value is 0 and no two are equal.
  for (auto& x : v) x = (x - double(n / 2) + 0.5) * gap;
  return fromDoubles(v, shape, dtype, device);
}

Tensor toDevice(const Tensor& t, Device device) {
  return t.to(device);
}

std::vector<double> values(const Tensor& t) {
  return t.toVector<double>();
}

Tolerance defaultTolerance(DType t) {
  switch (t) {
    case DType::Float32:
      return {1e-5, 1e-4};
    case DType::Float64:
      return {1e-10, 1e-10};
    case DType::Float16:
      return {1e-3, 1e-2};
    case DType::BFloat16:
      return {1e-2, 2e-2};
    case DType::Int32:
    case DType::Int64:
    case DType::Bool:
      return {0, 0};
  }
  return {0, 0};
}

::testing::AssertionResult allClose(const Tensor& actual, const Tensor& expected, double atol,
                                    double rtol) {
  if (!actual.defined() || !expected.defined())
    return ::testing::AssertionFailure()
           << "undefined tensor (actual " << (actual.defined() ? "defined" : "undefined")
           << ", expected " << (expected.defined() ? "defined" : "undefined") << ")";
  if (actual.shape() != expected.shape() || actual.dtype() != expected.dtype())
    return ::testing::AssertionFailure()
           << "shape/dtype differ: actual " << shapeStr(actual.shape()) << " "
           << dtypeName(actual.dtype()) << ", expected " << shapeStr(expected.shape()) << " "
           << dtypeName(expected.dtype());
  std::vector<double> a = values(actual), e = values(expected);
  int64_t bad = 0, worst = -1;
  double worstExcess = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == e[i] || sameSpecial(a[i], e[i])) continue;
    double diff = std::fabs(a[i] - e[i]);
    double allowed = atol + rtol * std::fabs(e[i]);
    if (std::isnan(diff) || diff > allowed) {
      ++bad;
      double excess = std::isnan(diff) ? INFINITY : diff / std::max(allowed, 1e-300);
      if (excess > worstExcess) {
        worstExcess = excess;
        worst = int64_t(i);
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(17);
  os << bad << " of " << a.size() << " elements differ beyond atol " << atol << " rtol " << rtol
     << " (shape " << shapeStr(expected.shape()) << ", " << dtypeName(expected.dtype())
     << "); worst at flat index " << worst << " " << multiIndex(worst, expected.shape())
     << ": actual " << a[size_t(worst)] << ", expected " << e[size_t(worst)] << ", |diff| "
     << std::fabs(a[size_t(worst)] - e[size_t(worst)]);
  return ::testing::AssertionFailure() << os.str();
}

ThreadsScope::ThreadsScope() : saved_(cpuThreads()) {}
ThreadsScope::~ThreadsScope() {
  setCpuThreads(saved_);
}

::testing::AssertionResult bitEqual(const Tensor& actual, const Tensor& expected) {
  if (actual.shape() != expected.shape() || actual.dtype() != expected.dtype())
    return ::testing::AssertionFailure()
           << "shape/dtype differ: actual " << shapeStr(actual.shape()) << " "
           << dtypeName(actual.dtype()) << ", expected " << shapeStr(expected.shape()) << " "
           << dtypeName(expected.dtype());
  // Bytes compared on the host (a cuda tensor is copied back first).
  auto host = [](const Tensor& t) { return t.device().isHost() ? t.contiguous() : t.to(kCpu); };
  Tensor a = host(actual), e = host(expected);
  size_t es = dtypeSize(a.dtype());
  const auto* pa = static_cast<const unsigned char*>(a.data());
  const auto* pe = static_cast<const unsigned char*>(e.data());
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::memcmp(pa + size_t(i) * es, pe + size_t(i) * es, es) != 0) {
      if (first < 0) first = i;
      ++bad;
    }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::vector<double> va = values(a), ve = values(e);
  std::ostringstream os;
  os.precision(17);
  os << bad << " of " << a.numel() << " elements differ in their bits (" << dtypeName(a.dtype())
     << "); first at flat index " << first << " " << multiIndex(first, a.shape()) << ": actual "
     << va[size_t(first)] << ", expected " << ve[size_t(first)];
  return ::testing::AssertionFailure() << os.str();
}

::testing::AssertionResult gradcheck(const GradFn& fn, const std::vector<Tensor>& inputs,
                                     GradcheckOptions opt) {
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].requiresGrad() && (inputs[i].dtype() != DType::Float64 || !inputs[i].isLeaf()))
      return ::testing::AssertionFailure()
             << "gradcheck: input " << i << " must be a float64 leaf, got "
             << dtypeName(inputs[i].dtype()) << (inputs[i].isLeaf() ? " leaf" : " non-leaf");
  for (auto& t : inputs)
    if (t.requiresGrad()) t.setGrad(Tensor());

  Tensor y = fn(inputs);
  if (y.dtype() != DType::Float64)
    return ::testing::AssertionFailure() << "gradcheck: fn returned " << dtypeName(y.dtype());
  if (!y.requiresGrad())
    return ::testing::AssertionFailure()
           << "gradcheck: fn's output does not require grad (no backward rule recorded)";
  Tensor w = randUniform(y.shape(), -1.0, 1.0, DType::Float64, y.device(), opt.seed);
  ops::sum(ops::mul(y, w)).backward();

  auto lossAt = [&](size_t which, const std::vector<double>& v) {
    NoGradGuard ng;
    std::vector<Tensor> in = inputs;
    in[which] = fromDoubles(v, inputs[which].shape(), DType::Float64, inputs[which].device());
    return ops::sum(ops::mul(fn(in), w)).item();
  };

  std::ostringstream report;
  report.precision(12);
  int64_t bad = 0, checked = 0;
  double worstExcess = -1;
  std::string worstDesc;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requiresGrad()) continue;
    std::vector<double> base = values(inputs[i]);
    Tensor g = inputs[i].grad();
    std::vector<double> analytic(base.size(), 0.0);
    if (g.defined()) {
      if (g.shape() != inputs[i].shape())
        return ::testing::AssertionFailure()
               << "gradcheck: grad of input " << i << " has shape " << shapeStr(g.shape())
               << ", input has " << shapeStr(inputs[i].shape());
      analytic = values(g);
    }
    for (size_t j = 0; j < base.size(); ++j) {
      std::vector<double> v = base;
      v[j] = base[j] + opt.eps;
      double lp = lossAt(i, v);
      v[j] = base[j] - opt.eps;
      double lm = lossAt(i, v);
      double numeric = (lp - lm) / (2 * opt.eps);
      double diff = std::fabs(analytic[j] - numeric);
      double allowed = opt.atol + opt.rtol * std::fabs(numeric);
      ++checked;
      if (!(diff <= allowed)) {
        ++bad;
        double excess = diff / allowed;
        if (!(excess <= worstExcess)) {
          worstExcess = excess;
          std::ostringstream d;
          d.precision(12);
          d << "input " << i << " " << shapeStr(inputs[i].shape()) << " element " << j << " "
            << multiIndex(int64_t(j), inputs[i].shape()) << ": autograd " << analytic[j]
            << ", finite difference " << numeric;
          worstDesc = d.str();
        }
      }
    }
  }
  if (checked == 0) return ::testing::AssertionFailure() << "gradcheck: no input requires grad";
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << checked << " gradient elements differ beyond atol " << opt.atol
         << " rtol " << opt.rtol << "; worst: " << worstDesc;
}

CliResult runKeelCli(const std::string& args, const std::string& workDir, const std::string& env) {
#ifdef KEEL_CLI_PATH
  static int calls = 0;
  const std::string n = std::to_string(calls++);
  const std::string out = workDir + "/cli_out" + n + ".txt",
                    err = workDir + "/cli_err" + n + ".txt";
  std::string cmd = "cd '" + std::string(KEEL_SOURCE_DIR) + "' && KEEL_BLAS_TUNE=0 " + env + " '" +
                    std::string(KEEL_CLI_PATH) + "' " + args + " >'" + out + "' 2>'" + err + "'";
  int raw = std::system(cmd.c_str());
  CliResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + (WIFSIGNALED(raw) ? WTERMSIG(raw) : 0);
  r.out = readFile(out, "keel's stdout");
  r.err = readFile(err, "keel's stderr");
  return r;
#else
  ADD_FAILURE() << "this test binary was built without the keel tool (KEEL_CLI_PATH)";
  (void)args;
  (void)workDir;
  (void)env;
  return {};
#endif
}

void expectOneLineError(const CliResult& r, const std::string& fragment) {
  EXPECT_EQ(r.status, 2) << r.out << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.rfind("keel: error: ", 0), 0u) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "exactly one line: " << r.err;
  EXPECT_NE(r.err.find(fragment), std::string::npos) << r.err;
}

}  // namespace keel::test
