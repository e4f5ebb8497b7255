// Element types and tensor storage: Half/BFloat16 conversion (round to nearest even, overflow,
// subnormals, NaN), casts between every pair of dtypes on both backends, strided views over shared
// storage, contiguous(), version counters, and attribute values keeping their types.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/cpu_util.h"  // the cpu backend's branch-free 16-bit conversions
#include "test_util.h"

namespace keel::test {
namespace {

constexpr DType F32 = DType::Float32, F64 = DType::Float64, F16 = DType::Float16,
                BF16 = DType::BFloat16, I32 = DType::Int32, I64 = DType::Int64, Bool = DType::Bool;
const DType kAll[] = {F32, F64, F16, BF16, I32, I64, Bool};

uint16_t halfBits(float f) {
  return Half::fromFloat(f);
}
uint16_t bf16Bits(float f) {
  return BFloat16::fromFloat(f);
}
float bf16Value(uint16_t b) {
  BFloat16 h;
  h.bits = b;
  return float(h);
}

// ---------------------------------------------------------------- Half
TEST(Half, EveryNonNanBitPatternRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    uint16_t h = uint16_t(b);
    float f = Half::toFloat(h);
    bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0;
    if (nan) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      ASSERT_TRUE(std::isnan(Half::toFloat(Half::fromFloat(f)))) << std::hex << b;
    } else {
      ASSERT_EQ(Half::fromFloat(f), h) << std::hex << b;
    }
  }
}

TEST(Half, RoundsToNearestEven) {
  EXPECT_EQ(halfBits(1.0f + 0x1p-11f), 0x3c00);             // tie: down to even 1
  EXPECT_EQ(halfBits(1.0f + 3 * 0x1p-11f), 0x3c02);         // tie: up to even 1 + 2^-9
  EXPECT_EQ(halfBits(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);  // above the tie: up
  EXPECT_EQ(halfBits(-1.0f - 0x1p-11f), 0xbc00);
  EXPECT_EQ(halfBits(0.1f), 0x2e66);
  EXPECT_EQ(halfBits(1.0f / 3), 0x3555);
  EXPECT_EQ(Half::toFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(halfBits(-2.0f), 0xc000);
}

TEST(Half, OverflowsToInfinityFrom65520) {
  EXPECT_EQ(halfBits(65504.0f), 0x7bff);
  EXPECT_EQ(halfBits(65519.0f), 0x7bff);
  EXPECT_EQ(halfBits(65520.0f), 0x7c00);
  EXPECT_EQ(halfBits(-65520.0f), 0xfc00);
  EXPECT_EQ(halfBits(1e10f), 0x7c00);
  EXPECT_EQ(halfBits(INFINITY), 0x7c00);
  EXPECT_EQ(Half::toFloat(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isinf(Half::toFloat(0xfc00)));
}

TEST(Half, SubnormalsRoundToNearestEven) {
  EXPECT_EQ(halfBits(0x1p-24f), 0x0001);             // smallest subnormal
  EXPECT_EQ(halfBits(0x1p-25f), 0x0000);             // tie: to even zero
  EXPECT_EQ(halfBits(1.5f * 0x1p-25f), 0x0001);      // above the tie
  EXPECT_EQ(halfBits(3 * 0x1p-25f), 0x0002);         // tie between 1 and 2 ulps: even 2
  EXPECT_EQ(halfBits(1023 * 0x1p-24f), 0x03ff);      // largest subnormal
  EXPECT_EQ(halfBits(0x1p-14f - 0x1p-25f), 0x0400);  // tie rounds up into the normal range
  EXPECT_EQ(halfBits(0x1p-14f), 0x0400);             // smallest normal
  EXPECT_EQ(halfBits(0x1p-30f), 0x0000);
  EXPECT_EQ(halfBits(-0x1p-24f), 0x8001);
  EXPECT_EQ(halfBits(-0.0f), 0x8000);
  EXPECT_EQ(Half::toFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(Half::toFloat(0x03ff), 1023 * 0x1p-24f);
}

TEST(Half, NanStaysNan) {
  EXPECT_TRUE(std::isnan(Half::toFloat(halfBits(NAN))));
  EXPECT_TRUE(std::isnan(Half::toFloat(halfBits(-NAN))));
}

// ---------------------------------------------------------------- BFloat16
TEST(BFloat16, EveryNonNanBitPatternRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    uint16_t h = uint16_t(b);
    float f = bf16Value(h);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(bf16Value(bf16Bits(f)))) << std::hex << b;
    } else {
      ASSERT_EQ(bf16Bits(f), h) << std::hex << b;
    }
  }
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(bf16Bits(1.0f + 0x1p-8f), 0x3f80);             // tie: down to even 1
  EXPECT_EQ(bf16Bits(1.0f + 3 * 0x1p-8f), 0x3f82);         // tie: up to even 1 + 2^-6
  EXPECT_EQ(bf16Bits(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // above the tie
  EXPECT_EQ(bf16Bits(FLT_MAX), 0x7f80);                    // rounds up to infinity
  EXPECT_EQ(bf16Bits(0x1p-133f), 0x0001);                  // subnormals keep their top bits
  EXPECT_EQ(bf16Value(0x3f81), 1.0f + 0x1p-7f);
  EXPECT_TRUE(std::isnan(bf16Value(bf16Bits(NAN))));
}

// ---------------------------------------------------------------- the cpu backend's conversions
// engine/backends/cpu/cpu_util.h converts with branch-free copies of Half / BFloat16 (they
// vectorize); these tests pin them to the vocabulary's conversions bit for bit.
uint32_t floatBits(float f) {
  return std::bit_cast<uint32_t>(f);
}

TEST(CpuConversions, EveryHalfBitPatternWidensLikeHalfToFloat) {
  for (uint32_t b = 0; b < 0x10000; ++b)
    ASSERT_EQ(floatBits(cpu::math::halfToFloat(uint16_t(b))), floatBits(Half::toFloat(uint16_t(b))))
        << std::hex << b;
}

// The floats a 16-bit rounding can go wrong on: every 16-bit value itself, the tie halfway to its
// neighbour and one bit either side of the tie, for both signs; plus zeros, infinities, NaNs with
// and without payloads, float subnormals and the float range's ends.
std::vector<uint32_t> trickyFloatBits() {
  std::vector<uint32_t> out;
  const auto addAround = [&](float f) {
    const uint32_t u = floatBits(f) & 0x7fffffffu;
    for (uint32_t sign : {0u, 0x80000000u})
      for (uint32_t v : {u - 1, u, u + 1}) out.push_back(sign | v);
  };
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite half and the tie above it
    const double lo = Half::toFloat(uint16_t(h));
    const double hi = h + 1 == 0x7c00 ? 65536.0 : double(Half::toFloat(uint16_t(h + 1)));
    addAround(float(lo));
    addAround(float((lo + hi) / 2));  // exact: a half has 11 significant bits
  }
  for (uint32_t b = 0; b < 0x7f80; ++b) {  // every finite bfloat16 and the tie above it
    addAround(std::bit_cast<float>(b << 16));
    addAround(std::bit_cast<float>((b << 16) | 0x8000u));
  }
  for (uint32_t u : {0x00000000u, 0x00000001u, 0x00000002u, 0x00400000u, 0x007fffffu, 0x00800000u,
                     0x7f7fffffu, 0x7f800000u, 0x7f800001u, 0x7fbfffffu, 0x7fc00000u, 0x7fc00001u,
                     0x7fffffffu, 0x7fffe000u, 0x7f80e000u})
    for (uint32_t sign : {0u, 0x80000000u}) out.push_back(sign | u);
  for (uint32_t u = 0; u < 0x00800000u; u += 997) out.push_back(u);  // float subnormals
  return out;
}

TEST(CpuConversions, FloatsNarrowToHalfAndBFloat16LikeTheVocabulary) {
  std::vector<uint32_t> patterns = trickyFloatBits();
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4093) patterns.push_back(uint32_t(u));
  ASSERT_GT(patterns.size(), 1'500'000u);
  for (uint32_t u : patterns) {
    const float f = std::bit_cast<float>(u);
    ASSERT_EQ(cpu::math::halfFromFloat(f), Half::fromFloat(f)) << std::hex << u;
    ASSERT_EQ(cpu::math::bf16FromFloat(f), BFloat16::fromFloat(f)) << std::hex << u;
  }
}

// ---------------------------------------------------------------- tensors of 16-bit floats
TEST(DTypeTensors, SixteenBitTensorsStoreRoundedValues) {
  Tensor h = fromDoubles({1.0 + std::ldexp(1, -11), 65520, 0.1}, {3}, F16);
  std::vector<double> hv = h.toVector<double>();
  EXPECT_EQ(hv[0], 1.0);
  EXPECT_TRUE(std::isinf(hv[1]));
  EXPECT_EQ(hv[2], double(Half::toFloat(0x2e66)));
  EXPECT_EQ(h.nbytes(), 6u);
  Tensor b = fromDoubles({1.0 + 3 * std::ldexp(1, -8)}, {1}, BF16);
  EXPECT_EQ(b.item(), 1.0 + std::ldexp(1, -6));
}

// Tensor::fromVector / copyFromHost must not pass float64 values through float32.
TEST(DTypeTensors, Float64FromHostKeepsDoublePrecision) {
  const double v = 0.1, w = 1.0 + 1e-12;
  Tensor t = Tensor::fromVector<double>({v, w}, {2}, F64, kCpuRef);
  EXPECT_EQ(t.toVector<double>(), (std::vector<double>{v, w}));
  Tensor f = Tensor::fromVector<float>({0.1f}, {1}, F64, kCpuRef);
  EXPECT_EQ(f.item(), double(0.1f));
}

TEST(DTypeTensors, Int64FromHostKeepsAll64Bits) {
  const int64_t big = (int64_t(1) << 62) + 1;
  Tensor t = Tensor::fromVector<int64_t>({big, -big}, {2}, I64, kCpuRef);
  EXPECT_EQ(t.toVector<int64_t>(), (std::vector<int64_t>{big, -big}));
}

TEST(DTypeNames, ParseAndPrintRoundTrip) {
  for (DType t : kAll) EXPECT_EQ(parseDType(dtypeName(t)), t);
  EXPECT_EQ(parseDType("half"), F16);
  EXPECT_EQ(parseDType("bf16"), BF16);
  EXPECT_EQ(parseDType("double"), F64);
  EXPECT_EQ(parseDType("long"), I64);
  EXPECT_EQ(dtypeSize(BF16), 2u);
  EXPECT_EQ(dtypeSize(Bool), 1u);
}

// ---------------------------------------------------------------- casts, both backends
class Casts : public ::testing::TestWithParam<Device> {};

TEST_P(Casts, EveryPairOfDtypesConvertsExactlyRepresentableValues) {
  Device d = GetParam();
  const std::vector<double> vals{0, 1, -2, 3, 100, -64};
  const std::vector<double> bools{0, 1, 1, 0, 1, 0};
  for (DType from : kAll) {
    const std::vector<double>& src = from == Bool ? bools : vals;
    Tensor x = fromDoubles(src, {2, 3}, from, d);
    for (DType to : kAll) {
      SCOPED_TRACE(std::string(dtypeName(from)) + " -> " + std::string(dtypeName(to)));
      Tensor y = ops::cast(x, to);
      EXPECT_EQ(y.dtype(), to);
      EXPECT_EQ(y.shape(), (Shape{2, 3}));
      EXPECT_EQ(y.device(), d);
      std::vector<double> expect = src;
      if (to == Bool)
        for (double& v : expect) v = v != 0 ? 1 : 0;
      EXPECT_EQ(y.toVector<double>(), expect);
    }
  }
}

TEST_P(Casts, NarrowingFloatCastsRoundToNearestEven) {
  Device d = GetParam();
  Tensor x =
      fromDoubles({1.0 + std::ldexp(1, -11), 1.0 + 3 * std::ldexp(1, -11), 0.1}, {3}, F32, d);
  std::vector<double> h = ops::cast(x, F16).toVector<double>();
  EXPECT_EQ(h, (std::vector<double>{1.0, 1.0 + std::ldexp(1, -9), double(Half::toFloat(0x2e66))}));
  Tensor y = fromDoubles({1.0 + std::ldexp(1, -8), 1.0 + 3 * std::ldexp(1, -8)}, {2}, F32, d);
  EXPECT_EQ(ops::cast(y, BF16).toVector<double>(),
            (std::vector<double>{1.0, 1.0 + std::ldexp(1, -6)}));
  Tensor z = fromDoubles({0.1}, {1}, F64, d);
  EXPECT_EQ(ops::cast(z, F32).item(), double(0.1f));
}

TEST_P(Casts, StridedSourceCastsInRowMajorOrder) {
  Device d = GetParam();
  Tensor x = ops::transpose(fromDoubles({1, 2, 3, 4, 5, 6}, {2, 3}, F64, d), 0, 1);
  EXPECT_EQ(ops::cast(x, I32).toVector<int32_t>(), (std::vector<int32_t>{1, 4, 2, 5, 3, 6}));
}

INSTANTIATE_TEST_SUITE_P(Backends, Casts, ::testing::Values(kCpuRef, kCpu), backendParamName);

// ---------------------------------------------------------------- views and storage
TEST(Views, TransposeSharesStorageAndIsNotContiguous) {
  Tensor x = fromDoubles({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor t = ops::transpose(x, 0, 1);
  EXPECT_EQ(t.buffer(), x.buffer());
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(t.strides(), (Shape{1, 3}));
  EXPECT_FALSE(t.isContiguous());
  EXPECT_EQ(t.toVector<double>(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
}

TEST(Views, ContiguousCopiesOnlyWhenNeeded) {
  Tensor x = fromDoubles({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(x.contiguous().impl(), x.impl());
  Tensor t = ops::transpose(x, 0, 1);
  Tensor c = t.contiguous();
  EXPECT_NE(c.buffer(), x.buffer());
  EXPECT_TRUE(c.isContiguous());
  EXPECT_EQ(c.strides(), (Shape{2, 1}));
  EXPECT_EQ(c.toVector<double>(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
  EXPECT_NE(ops::contiguous(x).buffer(), x.buffer());  // the op always copies
}

TEST(Views, SliceHasAnOffsetAndStepStride) {
  Tensor x = fromDoubles({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {10});
  Tensor s = ops::slice(x, 0, 1, 8, 3);  // 1, 4, 7
  EXPECT_EQ(s.buffer(), x.buffer());
  EXPECT_EQ(s.offset(), 1);
  EXPECT_EQ(s.strides(), (Shape{3}));
  EXPECT_EQ(s.toVector<double>(), (std::vector<double>{1, 4, 7}));
  EXPECT_EQ(ops::slice(x, 0, -3, 100).toVector<double>(), (std::vector<double>{7, 8, 9}));
  EXPECT_EQ(ops::slice(x, 0, 5, 2).numel(), 0);  // clamped like Python
}

TEST(Views, ExpandUsesStrideZero) {
  Tensor x = fromDoubles({1, 2}, {2, 1});
  Tensor e = ops::expand(x, {3, 2, 4});
  EXPECT_EQ(e.strides(), (Shape{0, 1, 0}));
  EXPECT_EQ(e.buffer(), x.buffer());
  EXPECT_EQ(ops::sum(e).item(), 36.0);
  EXPECT_EQ(ops::expand(x, {-1, 3}).shape(), (Shape{2, 3}));
}

TEST(Views, ViewNeverCopiesAndReshapeCopiesOnlyWhenItMust) {
  Tensor x = fromDoubles({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(ops::view(x, {3, 2}).buffer(), x.buffer());
  EXPECT_EQ(ops::reshape(x, {6}).buffer(), x.buffer());
  Tensor t = ops::transpose(x, 0, 1);
  EXPECT_THROW(ops::view(t, {6}), Error);
  Tensor r = ops::reshape(t, {6});
  EXPECT_NE(r.buffer(), x.buffer());
  EXPECT_EQ(r.toVector<double>(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
  // A view of a transposed tensor that keeps the strides compatible is still a view.
  Tensor u = ops::reshape(ops::transpose(fromDoubles({1, 2, 3, 4, 5, 6}, {1, 6}), 0, 1), {2, 3});
  EXPECT_EQ(u.toVector<double>(), (std::vector<double>{1, 2, 3, 4, 5, 6}));
}

TEST(Views, SplitPartsAreViews) {
  Tensor x = fromDoubles({0, 1, 2, 3, 4, 5}, {6});
  auto parts = ops::split(x, {2, 4}, 0);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[1].buffer(), x.buffer());
  EXPECT_EQ(parts[1].offset(), 2);
  EXPECT_EQ(parts[1].toVector<double>(), (std::vector<double>{2, 3, 4, 5}));
}

TEST(Views, VersionCounterIsSharedByAllViewsAndBumpedByInPlaceWrites) {
  Tensor x = fromDoubles({1, 2, 3, 4}, {4});
  Tensor v = ops::slice(x, 0, 0, 2);
  Tensor d = x.detach();
  uint64_t v0 = x.version();
  EXPECT_EQ(v.version(), v0);
  Tensor g = fromDoubles({1, 1}, {2}), buf = fromDoubles({0, 0}, {2});
  ops::sgdStep(ops::contiguous(v), g, buf, 1.0, 0.0, 0.0, false);  // a copy: x untouched
  EXPECT_EQ(x.version(), v0);
  Tensor head = ops::view(x, {2, 2});
  ops::sgdStep(head, fromDoubles({1, 1, 1, 1}, {2, 2}), fromDoubles({0, 0, 0, 0}, {2, 2}), 1.0, 0.0,
               0.0, false);
  EXPECT_GT(x.version(), v0);
  EXPECT_EQ(v.version(), x.version());
  EXPECT_EQ(d.version(), x.version());
  EXPECT_EQ(x.toVector<double>(), (std::vector<double>{0, 1, 2, 3}));  // written through the view
  Tensor c = x.contiguous();
  EXPECT_EQ(c.version(), x.version());  // same tensor (already contiguous)
  Tensor fresh = ops::contiguous(x);
  uint64_t fv = fresh.version();
  x.bumpVersion();
  EXPECT_EQ(fresh.version(), fv);  // a copy has its own counter
}

TEST(Views, TensorIdsAreUniquePerHandle) {
  Tensor x = fromDoubles({1}, {1});
  Tensor v = ops::view(x, {1});
  EXPECT_NE(x.id(), v.id());
  Tensor copy = x;
  EXPECT_EQ(copy.id(), x.id());
}

// ---------------------------------------------------------------- devices and attributes
TEST(DeviceNames, ParseAndPrint) {
  EXPECT_EQ(Device("cpu").backend, Backend::Cpu);
  EXPECT_EQ(Device("cpu-ref").backend, Backend::CpuRef);
  EXPECT_EQ(Device("cuda:3").index, 3);
  EXPECT_EQ(Device("cuda:3").name(), "cuda:3");
  EXPECT_EQ(Device("cpu-ref").name(), "cpu-ref");
  EXPECT_EQ(Device(), Device("cpu"));
}

// The one backend rule of keel train, keel record and a studio session.
TEST(DeviceNames, TrainingRunsOnTheHostBackendsAndCuda) {
  EXPECT_EQ(trainingDevice("cpu"), Device(Backend::Cpu));
  EXPECT_EQ(trainingDevice("cpu-ref"), Device(Backend::CpuRef));
  for (const char* bad : {"gpu", "", "CPU", "cuda0"}) {
    try {
      trainingDevice(bad);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), std::string("backend '") + bad +
                                           "' is not available for training (expected cpu, "
                                           "cpu-ref or cuda[:N])");
    }
  }
  // cuda names a device; where it cannot run, the reason comes with the device's name.
  if (cudaDevices() > 0) {
    EXPECT_EQ(trainingDevice("cuda"), Device(Backend::Cuda, 0));
    return;
  }
  for (const char* name : {"cuda", "cuda:0"}) {
    try {
      trainingDevice(name);
      ADD_FAILURE() << name;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("device 'cuda:0' is not available: ", 0), 0u)
          << e.what();
    }
  }
}

TEST(AttrsValues, KeepTheTypeTheyWereSetWith) {
  Attrs a;
  a.set("lr", 0.5).set("p", 2.5).set("flag", true).set("n", 3).set("name", "x");
  EXPECT_EQ(a.getDouble("lr"), 0.5);
  EXPECT_EQ(a.getDouble("p"), 2.5);
  EXPECT_TRUE(a.getBool("flag"));
  EXPECT_EQ(a.getInt("n"), 3);
  EXPECT_EQ(a.getString("name"), "x");
  EXPECT_EQ(a.toString(), R"({"lr":0.5,"p":2.5,"flag":true,"n":3,"name":"x"})");
}

TEST(AttrsValues, IntsAreAcceptedWhereDoublesAreRead) {
  Attrs a;
  a.set("x", int64_t(4)).set("v", std::vector<int64_t>{1, -1});
  EXPECT_EQ(a.getDouble("x"), 4.0);
  EXPECT_EQ(a.getInts("v"), (std::vector<int64_t>{1, -1}));
  EXPECT_EQ(a.getInt("missing", 7), 7);
  EXPECT_THROW(a.getString("x"), Error);
  EXPECT_THROW(a.getInt("missing"), Error);
}

}  // namespace
}  // namespace keel::test
