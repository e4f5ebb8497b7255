// Bad input raises keel::Error — never a crash, abort or silent garbage — and the message names
// the op and the offending shapes, dtypes, devices or indices. Index checks run on both backends
// (each kernel checks before writing).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "keel/registry.h"
#include "test_util.h"

namespace keel::test {
namespace {

constexpr DType F32 = DType::Float32, F64 = DType::Float64, I64 = DType::Int64;

// Passes when f throws keel::Error whose message contains every needle.
template <typename F>
::testing::AssertionResult throwsWith(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
  } catch (const Error& e) {
    std::string m = e.what();
    for (const auto& n : needles)
      if (m.find(n) == std::string::npos)
        return ::testing::AssertionFailure() << "message lacks \"" << n << "\": " << m;
    return ::testing::AssertionSuccess() << m;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-keel exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

Tensor f32(const Shape& s, Device d = kCpuRef) {
  return randUniform(s, -1, 1, F32, d, 1);
}

// ---------------------------------------------------------------- shapes, dtypes, devices
// Element and byte counts are overflow-checked: a shape whose count wraps past 2^63 used to
// allocate a small buffer and crash on the first write.
TEST(Errors, TensorSizesThatOverflowAreRefused) {
  EXPECT_TRUE(throwsWith(
      [] {
        Tensor::empty({int64_t(1) << 40, int64_t(1) << 40});
      },
      {"[1099511627776, 1099511627776]", "more than 2^63 elements"}));
  EXPECT_TRUE(throwsWith([] { Tensor::empty({int64_t(1) << 62}, F32); },
                         {"float32", "more than 2^63 bytes"}));
}

TEST(Errors, AddWithUnbroadcastableShapesNamesOpAndShapes) {
  EXPECT_TRUE(throwsWith([] { ops::add(f32({2, 3}), f32({4})); }, {"add", "[2, 3]", "[4]"}));
  EXPECT_TRUE(throwsWith(
      [] {
        ops::mul(f32({5, 1, 3}), f32({2, 2}));
      },
      {"mul", "[5, 1, 3]", "[2, 2]"}));
}

TEST(Errors, AddFloat32PlusFloat64IsADtypeMismatch) {
  Tensor a = f32({3}), b = randUniform({3}, -1, 1, F64, kCpuRef, 2);
  EXPECT_TRUE(throwsWith([&] { ops::add(a, b); }, {"add", "float32", "float64"}));
}

TEST(Errors, AddAcrossCpuAndCpuRefIsADeviceMismatch) {
  Tensor a = f32({3}, kCpu), b = f32({3}, kCpuRef);
  EXPECT_TRUE(throwsWith([&] { ops::add(a, b); }, {"add", "cpu", "cpu-ref", "[3]"}));
}

TEST(Errors, MatmulInnerDimMismatchNamesBothShapes) {
  EXPECT_TRUE(throwsWith(
      [] {
        ops::matmul(f32({2, 3}), f32({4, 5}));
      },
      {"matmul", "[2, 3]", "[4, 5]"}));
  EXPECT_TRUE(throwsWith(
      [] {
        ops::matmul(f32({2, 3}), f32({2, 5}), false, true);
      },
      {"matmul", "[2, 3]", "[2, 5]"}));
  EXPECT_TRUE(throwsWith([] { ops::matmul(f32({3}), f32({3, 2})); }, {"matmul", "[3]"}));
  EXPECT_TRUE(throwsWith([] { ops::matmul(f32({2, 2, 3}), f32({3, 3, 4})); }, {"matmul"}));
}

TEST(Errors, CrossEntropyWithBadTargetShapeNamesLogitsAndTargets) {
  Tensor logits = f32({4, 5});
  EXPECT_TRUE(throwsWith(
      [&] {
        ops::crossEntropy(logits, fromInts({0, 1, 2}, {3}, I64));
      },
      {"cross_entropy", "[4, 5]", "[3]"}));
  EXPECT_TRUE(throwsWith(
      [&] {
        ops::crossEntropy(logits, fromInts({0, 1, 2, 3}, {2, 2}, I64));
      },
      {"cross_entropy", "[2, 2]"}));
  EXPECT_TRUE(
      throwsWith([&] { ops::crossEntropy(logits, f32({4})); }, {"cross_entropy", "float32"}));
}

TEST(Errors, ReshapeToAWrongElementCount) {
  EXPECT_TRUE(throwsWith([] { ops::reshape(f32({2, 3}), {4}); }, {"reshape", "[2, 3]", "[4]"}));
  EXPECT_TRUE(throwsWith([] { ops::reshape(f32({2, 3}), {-1, 4}); }, {"reshape", "[2, 3]"}));
  EXPECT_TRUE(throwsWith([] { ops::reshape(f32({2, 3}), {-1, -1}); }, {"reshape"}));
}

TEST(Errors, ViewOfANonViewableLayoutSuggestsReshape) {
  Tensor t = ops::transpose(f32({2, 3}), 0, 1);
  EXPECT_TRUE(throwsWith([&] { ops::view(t, {6}); }, {"view", "[3, 2]", "reshape"}));
}

TEST(Errors, TransposeDimOutOfRange) {
  EXPECT_TRUE(throwsWith([] { ops::transpose(f32({2, 3}), 0, 5); }, {"transpose", "5"}));
  EXPECT_TRUE(throwsWith([] { ops::transpose(f32({2, 3}), -3, 0); }, {"transpose", "-3"}));
}

TEST(Errors, OtherDimAndShapeChecks) {
  EXPECT_TRUE(throwsWith([] { ops::softmax(f32({2, 3}), 2); }, {"softmax", "2"}));
  EXPECT_TRUE(throwsWith([] { ops::sum(f32({2, 3}), {0, 0}); }, {"sum"}));
  EXPECT_TRUE(throwsWith([] { ops::slice(f32({4}), 0, 0, 4, 0); }, {"slice", "step"}));
  EXPECT_TRUE(throwsWith([] { ops::expand(f32({2, 3}), {4, 3}); }, {"expand", "[2, 3]"}));
  EXPECT_TRUE(throwsWith([] { ops::split(f32({5}), {2, 2}, 0); }, {"split", "[5]"}));
  EXPECT_TRUE(throwsWith([] { ops::concat({f32({2, 3}), f32({3, 3})}, 1); }, {"concat", "[3, 3]"}));
  EXPECT_TRUE(throwsWith(
      [] {
        ops::layerNorm(f32({2, 4}), f32({3}), f32({4}));
      },
      {"layer_norm", "[3]", "[2, 4]"}));
  EXPECT_TRUE(throwsWith([] { ops::topk(f32({2, 3}), 4); }, {"topk", "4"}));
  EXPECT_TRUE(throwsWith([] { ops::where(f32({3}), f32({3}), f32({3})); }, {"where", "bool"}));
  EXPECT_TRUE(throwsWith([] { ops::dropout(f32({3}), 1.0, 0, 0); }, {"dropout"}));
}

TEST(Errors, UnsupportedDtypeNamesOpBackendAndDtype) {
  Tensor a = fromInts({1, 2}, {2}, I64), b = fromInts({1, 1}, {2}, I64);
  EXPECT_TRUE(throwsWith([&] { ops::div(a, b); }, {"div", "int64"}));
  EXPECT_TRUE(throwsWith([&] { ops::exp(a); }, {"exp", "int64"}));
  EXPECT_TRUE(throwsWith([&] { ops::uniform({2}, 0, 1, 0, 0, I64); }, {"uniform", "int64"}));
}

TEST(Errors, DispatchChecksArityAndAttributes) {
  EXPECT_TRUE(throwsWith([] { dispatch(OpId::Add, {f32({2})}); }, {"add", "2", "1"}));
  EXPECT_TRUE(throwsWith([] { dispatch(OpId::Concat, {}); }, {"concat"}));
  EXPECT_TRUE(throwsWith([] { dispatch(OpId::Softmax, {f32({2})}); }, {"dim"}));
  EXPECT_TRUE(throwsWith([] { dispatch(OpId::Add, {f32({2}), Tensor()}); }, {"add", "undefined"}));
}

TEST(Errors, AutogradMisuse) {
  Tensor i = fromInts({1}, {1}, I64);
  EXPECT_TRUE(throwsWith([&] { i.setRequiresGrad(true); }, {"int64"}));
  Tensor x = f32({2});
  EXPECT_TRUE(throwsWith([&] { x.registerHook([](const Tensor& g) { return g; }); }, {"grad"}));
  EXPECT_TRUE(throwsWith([&] { x.setGrad(f32({3})); }, {"[3]", "[2]"}));
  EXPECT_TRUE(throwsWith([&] { x.item(); }, {"[2]"}));
}

// ---------------------------------------------------------------- names
TEST(Errors, UnknownDtypeName) {
  EXPECT_TRUE(throwsWith([] { parseDType("float8"); }, {"float8"}));
  EXPECT_TRUE(throwsWith([] { parseDType(""); }, {"dtype"}));
  EXPECT_TRUE(throwsWith(
      [] { dispatch(OpId::Cast, {f32({2})}, Attrs().set("dtype", "complex64")); }, {"complex64"}));
}

TEST(Errors, UnknownBackend) {
  EXPECT_TRUE(throwsWith([] { Device d("tpu"); }, {"tpu"}));
  EXPECT_TRUE(throwsWith([] { Device d("cuda:x"); }, {"cuda:x"}));
  EXPECT_TRUE(throwsWith([] { Device d("cpu_ref"); }, {"cpu_ref"}));
  EXPECT_TRUE(throwsWith([] { ops::copyTo(f32({2}), Device("gpu")); }, {"gpu"}));
}

TEST(Errors, CudaTensorsAreNotAvailableInThisBuild) {
  Device cuda("cuda:0");
  EXPECT_EQ(cuda.backend, Backend::Cuda);
  EXPECT_TRUE(throwsWith([&] { Tensor::zeros({2}, F32, cuda); }, {"cuda"}));
  EXPECT_TRUE(throwsWith([&] { Tensor::empty({2}, F32, cuda); }, {"cuda:0"}));
  EXPECT_TRUE(throwsWith([&] { Tensor::fromVector<float>({1, 2}, {2}, F32, cuda); }, {"cuda"}));
  EXPECT_TRUE(throwsWith([&] { ops::uniform({2}, 0, 1, 0, 0, F32, cuda); }, {"cuda"}));
  EXPECT_TRUE(throwsWith([&] { ops::copyTo(f32({2}), cuda); }, {"cuda"}));
}

// ---------------------------------------------------------------- out-of-range indices, per
// backend
class IndexErrors : public ::testing::TestWithParam<Device> {};

TEST_P(IndexErrors, EmbeddingIndexOutOfRangeNamesIndexAndExtent) {
  Device d = GetParam();
  Tensor w = f32({5, 3}, d);
  EXPECT_TRUE(throwsWith(
      [&] {
        ops::embedding(w, fromInts({1, 17}, {2}, I64, d));
      },
      {"embedding", "17", "5"}));
  EXPECT_TRUE(throwsWith([&] { ops::embedding(w, fromInts({-1}, {1}, DType::Int32, d)); },
                         {"embedding", "-1", "5"}));
}

TEST_P(IndexErrors, EmbeddingBackwardIndexOutOfRange) {
  Device d = GetParam();
  EXPECT_TRUE(throwsWith(
      [&] {
        dispatch(OpId::EmbeddingBackward, {f32({2, 3}, d), fromInts({0, 9}, {2}, I64, d)},
                 Attrs().set("num_weights", int64_t(4)));
      },
      {"embedding_backward", "9", "4"}));
}

TEST_P(IndexErrors, IndexSelectIndexOutOfRange) {
  Device d = GetParam();
  EXPECT_TRUE(throwsWith(
      [&] {
        ops::indexSelect(f32({4, 3}, d), 0, fromInts({0, 19}, {2}, I64, d));
      },
      {"index_select", "19", "4"}));
  EXPECT_TRUE(throwsWith(
      [&] {
        ops::indexSelect(f32({4, 3}, d), 1, fromInts({-4}, {1}, I64, d));
      },
      {"index_select", "-4", "3"}));
}

TEST_P(IndexErrors, GatherIndexOutOfRange) {
  Device d = GetParam();
  EXPECT_TRUE(throwsWith(
      [&] {
        ops::gather(f32({2, 3}, d), 1, fromInts({0, 11, 1, 1}, {2, 2}, I64, d));
      },
      {"gather", "11", "3"}));
  EXPECT_TRUE(throwsWith(
      [&] {
        ops::gather(f32({2, 3}, d), 0, fromInts({0, 1, 7}, {1, 3}, DType::Int32, d));
      },
      {"gather", "7", "2"}));
}

TEST_P(IndexErrors, IndexAddAndScatterAddIndexOutOfRange) {
  Device d = GetParam();
  EXPECT_TRUE(throwsWith(
      [&] {
        ops::indexAdd(f32({4, 3}, d), 0, fromInts({13}, {1}, I64, d), f32({1, 3}, d));
      },
      {"index_add", "13", "4"}));
  EXPECT_TRUE(throwsWith(
      [&] {
        ops::scatterAdd(f32({2, 3}, d), 1, fromInts({0, 23}, {1, 2}, I64, d), f32({1, 2}, d));
      },
      {"scatter_add", "23", "3"}));
}

TEST_P(IndexErrors, CrossEntropyTargetOutOfRange) {
  Device d = GetParam();
  EXPECT_TRUE(throwsWith(
      [&] {
        ops::crossEntropy(f32({2, 5}, d), fromInts({1, 15}, {2}, I64, d));
      },
      {"cross_entropy", "15", "5"}));
}

INSTANTIATE_TEST_SUITE_P(Backends, IndexErrors, ::testing::Values(kCpuRef, kCpu), backendParamName);

}  // namespace
}  // namespace keel::test
