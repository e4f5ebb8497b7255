// flashmask_attention: the tiled cpu (or cuda) kernel against the dense float64 cpu-ref oracle for
// every mask builder (forward, log-sum-exp and all three gradients), bfloat16 against a plain
// bfloat16 attention, the geometry corner cases (Sq != Sk, GQA, per-head masks, windows, rows that
// see nothing), dropout, bitwise determinism (tile skipping, thread counts), gradchecks,
// validation.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "keel/flashmask.h"
#include "keel/observer.h"
#include "keel/registry.h"
#include "keel/train.h"
#include "test_util.h"

namespace keel::test {
namespace {

namespace fmk = keel::flashmask;

// The backend under test against cpu-ref: cpu, or cuda:0 where this file is built as
// cuda_flashmask_test (tests/engine/cuda_flashmask_test.cpp: label gpu, skipped without a device,
// and cudasim_cuda_flashmask_test on the CUDA simulator).
#if defined(KEEL_FLASHMASK_CUDA)
const Device kTested{Backend::Cuda, 0};
#define KEEL_NEEDS_TESTED_DEVICE() \
  if (cudaDevices() == 0) GTEST_SKIP() << "no CUDA device"
#else
const Device kTested = kCpu;
#define KEEL_NEEDS_TESTED_DEVICE() (void)0
#endif
constexpr DType F32 = DType::Float32, F64 = DType::Float64, BF16 = DType::BFloat16;

struct Params {
  bool causal = false;
  int64_t window = -1;
  double dropout = 0.0;
  double scale = 0.0;
  uint64_t seed = 0;
  bool skip = true;
};

Attrs attrsOf(const Params& p) {
  Attrs a;
  a.set("causal", p.causal)
      .set("window_size", p.window)
      .set("dropout", p.dropout)
      .set("scale", p.scale)
      .set("seed", int64_t(p.seed))
      .set("offset", int64_t(0))
      .set("skip_tiles", p.skip);
  return a;
}

struct Inputs {
  Tensor q, k, v, idx, w;  // w: upstream gradient weights (like out)
};

Inputs makeInputs(int64_t b, int64_t sq, int64_t sk, int64_t h, int64_t hk, int64_t d,
                  const Tensor& idx, DType t, uint64_t seed) {
  Inputs in;
  in.q = randUniform({b, sq, h, d}, -1.5, 1.5, t, kCpuRef, seed);
  in.k = randUniform({b, sk, hk, d}, -1.5, 1.5, t, kCpuRef, seed + 1);
  in.v = randUniform({b, sk, hk, d}, -1, 1, t, kCpuRef, seed + 2);
  in.w = randUniform({b, sq, h, d}, -1, 1, t, kCpuRef, seed + 3);
  in.idx = idx;
  return in;
}

struct Result {
  Tensor out, lse, dq, dk, dv;
};

// Runs the op on device (inputs cast to dtype t) and backpropagates sum(out * w).
Result run(const Inputs& in, Device dev, DType t, const Params& p, bool grads = true) {
  auto leaf = [&](const Tensor& x) {
    Tensor y = toDevice(ops::cast(x, t), dev).detach();
    if (grads) y.setRequiresGrad(true);
    return y;
  };
  Tensor q = leaf(in.q), k = leaf(in.k), v = leaf(in.v);
  std::vector<Tensor> args{q, k, v};
  if (in.idx.defined()) args.push_back(toDevice(in.idx, dev));
  std::vector<Tensor> o = dispatch(OpId::FlashmaskAttention, args, attrsOf(p));
  Result r{o[0], o[1], {}, {}, {}};
  if (grads) {
    ops::sum(ops::mul(o[0], toDevice(ops::cast(in.w, t), dev))).backward();
    r.dq = q.grad();
    r.dk = k.grad();
    r.dv = v.grad();
  }
  return r;
}

// max |a - ref| / max |ref| over finite reference entries; infinities must match exactly.
double relErr(const Tensor& a, const Tensor& ref) {
  std::vector<double> x = values(a), y = values(ref);
  EXPECT_EQ(x.size(), y.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    if (std::isinf(y[i])) {
      EXPECT_EQ(x[i], y[i]) << "at " << i;
      continue;
    }
    EXPECT_FALSE(std::isnan(x[i])) << "NaN at " << i;
    num = std::max(num, std::abs(x[i] - y[i]));
    den = std::max(den, std::abs(y[i]));
  }
  return den > 0 ? num / den : num;
}

void expectNoNan(const Tensor& t, const char* what) {
  for (double x : values(t)) ASSERT_FALSE(std::isnan(x)) << what;
}

void expectClose(const Result& a, const Result& ref, double tol, bool grads = true) {
  EXPECT_LE(relErr(a.out, ref.out), tol) << "out";
  EXPECT_LE(relErr(a.lse, ref.lse), tol) << "lse";
  if (!grads) return;
  EXPECT_LE(relErr(a.dq, ref.dq), tol) << "dq";
  EXPECT_LE(relErr(a.dk, ref.dk), tol) << "dk";
  EXPECT_LE(relErr(a.dv, ref.dv), tol) << "dv";
}

void expectBitEqual(const Result& a, const Result& b) {
  EXPECT_TRUE(bitEqual(a.out, b.out)) << "out";
  EXPECT_TRUE(bitEqual(a.lse, b.lse)) << "lse";
  EXPECT_TRUE(bitEqual(a.dq, b.dq)) << "dq";
  EXPECT_TRUE(bitEqual(a.dk, b.dk)) << "dk";
  EXPECT_TRUE(bitEqual(a.dv, b.dv)) << "dv";
}

// ---------------------------------------------------------------- the twelve mask kinds
constexpr int64_t kS = 257;  // odd, five 64-row tiles

fmk::Mask maskOf(fmk::MaskKind kind, int64_t s = kS) {
  using K = fmk::MaskKind;
  const int64_t a = s * 2 / 5, b = s / 5, c = s - a - b;
  switch (kind) {
    case K::Full:
      return fmk::full(s);
    case K::Causal:
      return fmk::causal(s);
    case K::SlidingWindow:
      return fmk::slidingWindow(s, 50);
    case K::CausalDocument:
      return fmk::causalDocument({a, b, c});
    case K::Document:
      return fmk::document({a, b, c});
    case K::SharedQuestion:
      return fmk::sharedQuestion(b, {a, c});
    case K::GlobalSlidingWindow:
      return fmk::globalSlidingWindow(s, 8, 40);
    case K::CausalBlockwise:
      return fmk::causalBlockwise({b, a, c});
    case K::PrefixLmDocument:
      return fmk::prefixLmDocument({a, b + c}, {a / 3, b / 2});
    case K::PrefixLmCausal:
      return fmk::prefixLmCausal(s, s / 4);
    case K::QkSparse:
      return fmk::qkSparse(s,
                           {{s / 10, s / 3, s / 2, s * 4 / 5}, {s / 2, s * 3 / 5, s * 3 / 5, s}});
    case K::RandomEviction:
      return fmk::randomEviction(s, 7, 4);
  }
  return {};
}

const std::vector<fmk::MaskKind> kKinds{fmk::MaskKind::Full,
                                        fmk::MaskKind::Causal,
                                        fmk::MaskKind::SlidingWindow,
                                        fmk::MaskKind::CausalDocument,
                                        fmk::MaskKind::Document,
                                        fmk::MaskKind::SharedQuestion,
                                        fmk::MaskKind::GlobalSlidingWindow,
                                        fmk::MaskKind::CausalBlockwise,
                                        fmk::MaskKind::PrefixLmDocument,
                                        fmk::MaskKind::PrefixLmCausal,
                                        fmk::MaskKind::QkSparse,
                                        fmk::MaskKind::RandomEviction};

class MaskKinds : public ::testing::TestWithParam<fmk::MaskKind> {};

TEST_P(MaskKinds, Float32CpuMatchesCpuRefForwardAndGradients) {
  KEEL_NEEDS_TESTED_DEVICE();
  fmk::Mask m = maskOf(GetParam());
  Inputs in = makeInputs(2, kS, kS, 4, 2, 16, fmk::repeatMask(m.startendRowIndices, 2, 1), F32, 11);
  Params p;
  p.causal = m.causal;
  Result ref = run(in, kCpuRef, F32, p), got = run(in, kTested, F32, p);
  expectClose(got, ref, 1e-5);
}

// bfloat16 storage: the tiled kernel's error against the float64 oracle (same rounded inputs) is
// at most twice that of a plain bfloat16 attention built from engine ops, plus a floor of one
// bfloat16 rounding step (2^-8) of the largest value.
Result plainAttention(const Inputs& in, const fmk::Mask& m, DType t) {
  const int64_t b = in.q.size(0), sq = in.q.size(1), h = in.q.size(2), d = in.q.size(3);
  const int64_t sk = in.k.size(1), hk = in.k.size(2);
  auto leaf = [&](const Tensor& x) {
    Tensor y = toDevice(ops::cast(x, t), kCpu).detach();
    y.setRequiresGrad(true);
    return y;
  };
  Tensor q = leaf(in.q), k = leaf(in.k), v = leaf(in.v);
  auto heads = [&](const Tensor& x) {  // [B, S, Hk, D] -> [B, H, S, D]
    Tensor y = ops::permute(x, {0, 2, 1, 3});
    Tensor e = ops::expand(ops::unsqueeze(y, 2), {b, hk, h / hk, sk, d});
    return ops::reshape(e, {b, h, sk, d});
  };
  std::vector<uint8_t> vis = fmk::denseVisibility(m.startendRowIndices, m.causal, sq, sk, -1, 0, 0);
  std::vector<double> masked(vis.size()), rowHas(size_t(sq), 0.0);
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t j = 0; j < sk; ++j) {
      masked[size_t(i * sk + j)] = vis[size_t(i * sk + j)] ? 0 : 1;
      if (vis[size_t(i * sk + j)]) rowHas[size_t(i)] = 1;
    }
  Tensor mask = fromDoubles(masked, {1, 1, sq, sk}, DType::Bool, kCpu);
  Tensor keep = fromDoubles(rowHas, {1, 1, sq, 1}, t, kCpu);
  Tensor s = ops::mulScalar(ops::matmul(ops::permute(q, {0, 2, 1, 3}), heads(k), false, true),
                            1.0 / std::sqrt(double(d)));
  Tensor pr = ops::mul(ops::softmax(ops::maskedFill(s, mask, -1e30), -1), keep);
  Tensor o = ops::permute(ops::matmul(pr, heads(v)), {0, 2, 1, 3});
  ops::sum(ops::mul(o, toDevice(ops::cast(in.w, t), kCpu))).backward();
  return {ops::contiguous(o), {}, q.grad(), k.grad(), v.grad()};
}

TEST_P(MaskKinds, Bfloat16ErrorAtMostTwicePlainBfloat16) {
  KEEL_NEEDS_TESTED_DEVICE();
  fmk::Mask m = maskOf(GetParam(), 129);
  Inputs in = makeInputs(1, 129, 129, 4, 2, 16, m.startendRowIndices, BF16, 21);
  Params p;
  p.causal = m.causal;
  Result ref = run(in, kCpuRef, F64, p);  // the bfloat16 values, computed in float64
  Result got = run(in, kTested, BF16, p);
  Result plain = plainAttention(in, m, BF16);
  const double floor = 1.0 / 256;
  EXPECT_LE(relErr(got.out, ref.out), 2 * relErr(plain.out, ref.out) + floor) << "out";
  EXPECT_LE(relErr(got.dq, ref.dq), 2 * relErr(plain.dq, ref.dq) + floor) << "dq";
  EXPECT_LE(relErr(got.dk, ref.dk), 2 * relErr(plain.dk, ref.dk) + floor) << "dk";
  EXPECT_LE(relErr(got.dv, ref.dv), 2 * relErr(plain.dv, ref.dv) + floor) << "dv";
}

TEST_P(MaskKinds, TileSkippingOnAndOffGiveTheSameBits) {
  KEEL_NEEDS_TESTED_DEVICE();
  fmk::Mask m = maskOf(GetParam());
  Inputs in = makeInputs(1, kS, kS, 2, 1, 32, m.startendRowIndices, F32, 31);
  Params on, off;
  on.causal = off.causal = m.causal;
  off.skip = false;
  expectBitEqual(run(in, kTested, F32, on), run(in, kTested, F32, off));
}

INSTANTIATE_TEST_SUITE_P(Builders, MaskKinds, ::testing::ValuesIn(kKinds),
                         [](const ::testing::TestParamInfo<fmk::MaskKind>& info) {
                           return std::string(fmk::maskKindName(info.param));
                         });

// ---------------------------------------------------------------- geometry corner cases
// Random valid column bounds [B, hm, Sk, C] for the causal flag.
Tensor randomIndices(int64_t b, int64_t hm, int64_t sq, int64_t sk, int64_t c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto below = [&](int64_t n) { return int64_t(rng() % uint64_t(n + 1)); };  // [0, n]
  std::vector<int64_t> v;
  for (int64_t i = 0; i < b * hm * sk; ++i) {
    int64_t x0 = below(sq), x1 = x0 + below(sq - x0);
    if (c == 1) v.push_back(x0);
    if (c == 2) {
      v.push_back(x0);
      v.push_back(seed % 2 ? x1 : below(sq));  // causal: LTE; non-causal: any UTE
    }
    if (c == 4) {
      int64_t u0 = below(sq / 2), u1 = u0 + below(sq / 2 - u0);
      v.insert(v.end(), {x0, x1, u0, u1});
    }
  }
  return fromInts(v, {b, hm, sk, c}, DType::Int32, kCpuRef);
}

struct Geo {
  const char* name;
  int64_t sq, sk, h, hk, hm, c;
  bool causal;
  int64_t window;
};

class Geometry : public ::testing::TestWithParam<Geo> {};

TEST_P(Geometry, CpuMatchesCpuRefAndSkippingIsBitwiseNeutral) {
  KEEL_NEEDS_TESTED_DEVICE();
  const Geo& g = GetParam();
  Tensor idx = g.c ? randomIndices(2, g.hm, g.sq, g.sk, g.c, g.causal ? 5 : 6) : Tensor();
  Inputs in = makeInputs(2, g.sq, g.sk, g.h, g.hk, 24, idx, F32, 41);
  Params p;
  p.causal = g.causal;
  p.window = g.window;
  Result ref = run(in, kCpuRef, F32, p), got = run(in, kTested, F32, p);
  expectClose(got, ref, 1e-5);
  for (const Tensor& t : {got.out, got.dq, got.dk, got.dv}) expectNoNan(t, g.name);
  Params off = p;
  off.skip = false;
  expectBitEqual(got, run(in, kTested, F32, off));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Geometry,
    ::testing::Values(Geo{"causal_sq_lt_sk", 70, 131, 2, 1, 1, 2, true, -1},
                      Geo{"causal_sq_gt_sk_empty_top_rows", 131, 70, 2, 2, 2, 1, true, -1},
                      Geo{"noncausal_c2_sq_ne_sk", 97, 150, 4, 2, 1, 2, false, -1},
                      Geo{"noncausal_c4_mask_per_kv_head", 129, 129, 4, 2, 2, 4, false, -1},
                      Geo{"causal_c2_gqa_4_to_1", 127, 127, 4, 1, 1, 2, true, -1},
                      Geo{"no_index_tensor_causal", 100, 100, 2, 2, 1, 0, true, -1},
                      Geo{"no_index_tensor_full", 65, 200, 2, 1, 1, 0, false, -1},
                      Geo{"causal_window_33", 200, 200, 2, 1, 1, 1, true, 33},
                      Geo{"noncausal_window_20_c4", 150, 190, 2, 2, 2, 4, false, 20}),
    [](const ::testing::TestParamInfo<Geo>& info) { return std::string(info.param.name); });

TEST(FlashmaskAttention, RowsThatSeeNoKeyGiveZerosAndNoNan) {
  KEEL_NEEDS_TESTED_DEVICE();
  // Non-causal C=4: every column masks rows [10, 20) (LT) and [40, 45) (UT).
  const int64_t s = 90;
  std::vector<int64_t> v;
  for (int64_t j = 0; j < s; ++j) v.insert(v.end(), {10, 20, 40, 45});
  Tensor idx = fromInts(v, {1, 1, s, 4}, DType::Int32, kCpuRef);
  Inputs in = makeInputs(1, s, s, 2, 2, 8, idx, F32, 51);
  for (Device d : {kCpuRef, kTested}) {
    Result r = run(in, d, F32, Params{});
    std::vector<double> out = values(r.out), lse = values(r.lse), dq = values(r.dq);
    for (int64_t i = 0; i < s; ++i) {
      const bool empty = (i >= 10 && i < 20) || (i >= 40 && i < 45);
      for (int64_t h = 0; h < 2; ++h) {
        EXPECT_EQ(std::isinf(lse[size_t(h * s + i)]) && lse[size_t(h * s + i)] < 0, empty) << i;
        for (int64_t x = 0; x < 8; ++x) {
          if (empty) {
            EXPECT_EQ(out[size_t((i * 2 + h) * 8 + x)], 0.0) << "row " << i;
            EXPECT_EQ(dq[size_t((i * 2 + h) * 8 + x)], 0.0) << "row " << i;
          }
        }
      }
    }
    for (const Tensor& t : {r.out, r.dq, r.dk, r.dv}) expectNoNan(t, d.name().c_str());
  }
  expectClose(run(in, kTested, F32, Params{}), run(in, kCpuRef, F32, Params{}), 1e-5);
}

TEST(FlashmaskAttention, DropoutMasksAgreeBetweenBackends) {
  KEEL_NEEDS_TESTED_DEVICE();
  fmk::Mask m = fmk::causalDocument({60, 70, 67});
  Inputs in =
      makeInputs(2, 197, 197, 4, 2, 16, fmk::repeatMask(m.startendRowIndices, 2, 1), F32, 61);
  Params p;
  p.causal = true;
  p.dropout = 0.25;
  p.seed = 99;
  Result ref = run(in, kCpuRef, F32, p), got = run(in, kTested, F32, p);
  expectClose(got, ref, 1e-5);
  // The same elements were dropped: dropped probabilities contribute exactly nothing to dv.
  Params none = p;
  none.dropout = 0.0;
  Result nd = run(in, kTested, F32, none);
  EXPECT_TRUE(bitEqual(nd.lse, got.lse)) << "dropout must not change the log-sum-exp";
  EXPECT_GT(relErr(nd.out, got.out), 1e-3) << "dropout 0.25 changed nothing";
  Params off = p;
  off.skip = false;
  expectBitEqual(got, run(in, kTested, F32, off));
}

TEST(FlashmaskAttention, DropoutZeroIsExactlyNoDropout) {
  KEEL_NEEDS_TESTED_DEVICE();
  fmk::Mask m = fmk::document({50, 80});
  Inputs in = makeInputs(1, 130, 130, 2, 1, 16, m.startendRowIndices, F32, 71);
  Params p;
  p.seed = 5;
  Result a = run(in, kTested, F32, p);
  auto outs = ops::flashmaskAttention(toDevice(in.q, kTested), toDevice(in.k, kTested),
                                      toDevice(in.v, kTested), toDevice(in.idx, kTested));
  EXPECT_TRUE(bitEqual(outs.first, a.out));
  EXPECT_TRUE(bitEqual(outs.second, a.lse));
}

TEST(FlashmaskAttention, SameBitsForEveryThreadCountAndRun) {
  KEEL_NEEDS_TESTED_DEVICE();
  fmk::Mask m = fmk::causalDocument({300, 40, 100, 72});
  Inputs in = makeInputs(1, 512, 512, 4, 2, 32, m.startendRowIndices, F32, 81);
  Params p;
  p.causal = true;
  test::ThreadsScope restore;
  setCpuThreads(1);
  Result one = run(in, kTested, F32, p);
  setCpuThreads(2);
  Result two = run(in, kTested, F32, p), again = run(in, kTested, F32, p);
  expectBitEqual(one, two);
  expectBitEqual(two, again);
}

TEST(FlashmaskAttention, ScaleAttributeAndDefault) {
  KEEL_NEEDS_TESTED_DEVICE();
  Inputs in = makeInputs(1, 40, 40, 1, 1, 16, Tensor(), F32, 91);
  Params p;
  p.scale = 0.25;  // = 1/sqrt(16), the default
  EXPECT_TRUE(
      bitEqual(run(in, kTested, F32, p, false).out, run(in, kTested, F32, Params{}, false).out));
  p.scale = 0.7;
  expectClose(run(in, kTested, F32, p), run(in, kCpuRef, F32, p), 1e-5);
}

// ---------------------------------------------------------------- float64 gradchecks
struct GradCase {
  const char* name;
  Tensor idx;
  Params p;
  int64_t sq, sk, h, hk;
};

TEST(FlashmaskAttention, Float64GradcheckOnBothBackends) {
  KEEL_NEEDS_TESTED_DEVICE();
  std::vector<GradCase> cases{
      {"causal_document", fmk::causalDocument({3, 4}).startendRowIndices, {true}, 7, 7, 2, 1},
      {"document", fmk::document({4, 3}).startendRowIndices, {false}, 7, 7, 2, 2},
      {"c4_sq_ne_sk", randomIndices(1, 1, 5, 7, 4, 6), {false}, 5, 7, 2, 1},
      {"causal_sq_gt_sk", randomIndices(1, 1, 7, 5, 1, 5), {true}, 7, 5, 2, 1},
      {"window_dropout", fmk::full(7).startendRowIndices, {false, 2, 0.3, 0.0, 3}, 7, 7, 2, 1},
  };
  for (const GradCase& gc : cases)
    for (Device d : {kCpuRef, kTested}) {
      SCOPED_TRACE(std::string(gc.name) + " on " + d.name());
      std::vector<Tensor> x{randUniform({1, gc.sq, gc.h, 3}, -1, 1, F64, d, 1),
                            randUniform({1, gc.sk, gc.hk, 3}, -1, 1, F64, d, 2),
                            randUniform({1, gc.sk, gc.hk, 3}, -1, 1, F64, d, 3),
                            toDevice(gc.idx, d)};
      for (int i = 0; i < 3; ++i) x[size_t(i)].setRequiresGrad(true);
      Attrs a = attrsOf(gc.p);
      EXPECT_TRUE(gradcheck(
          [&](const std::vector<Tensor>& v) { return dispatch(OpId::FlashmaskAttention, v, a)[0]; },
          x));
      // The log-sum-exp output is differentiable too (rows that see nothing excluded by w·0).
      EXPECT_TRUE(gradcheck(
          [&](const std::vector<Tensor>& v) {
            Tensor l = dispatch(OpId::FlashmaskAttention, v, a)[1];
            return ops::where(ops::gt(l, ops::fill({}, -1e300, F64, d)), l,
                              ops::fill({}, 0.0, F64, d));
          },
          x));
    }
}

#if !defined(KEEL_FLASHMASK_CUDA)  // the rest runs on the host only: once, in flashmask_test
// ---------------------------------------------------------------- validation
void expectError(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(FlashmaskAttention, InvalidInputsRaiseErrorsNamingTheProblem) {
  Tensor q = randUniform({1, 8, 2, 4}, -1, 1, F32, kCpu, 1);
  Tensor k = randUniform({1, 8, 1, 4}, -1, 1, F32, kCpu, 2);
  auto call = [&](const Tensor& idx, bool causal, Tensor qq = {}, Tensor kk = {}) {
    return [=] {
      Tensor a = qq.defined() ? qq : q, b = kk.defined() ? kk : k;
      ops::flashmaskAttention(a, b, b, idx, causal);
    };
  };
  auto idx = [](std::vector<int64_t> v, Shape s, DType t = DType::Int32) {
    return fromInts(v, s, t, kCpu);
  };
  std::vector<int64_t> ok(8, 8);
  expectError(call(idx(ok, {1, 1, 8, 1}, DType::Int64), true), "must be int32");
  expectError(call(idx(ok, {1, 8, 1}), true), "must be [B, Hk or 1, Sk, C]");
  expectError(call(idx(ok, {1, 1, 4, 2}), true), "does not match");
  expectError(call(fromInts(std::vector<int64_t>(24, 8), {1, 3, 8, 1}, DType::Int32, kCpu), true),
              "does not match");
  expectError(call(fromInts(std::vector<int64_t>(24, 8), {1, 1, 8, 3}, DType::Int32, kCpu), true),
              "C = 1 (LTS) or 2");
  expectError(call(idx(ok, {1, 1, 8, 1}), false), "with causal=false");
  std::vector<int64_t> bad = ok;
  bad[3] = 9;
  expectError(call(idx(bad, {1, 1, 8, 1}), true),
              "LTS at [0, 0, 3] is 9, out of range [0, Sq = 8]");
  bad[3] = -1;
  expectError(call(idx(bad, {1, 1, 8, 1}), true), "is -1, out of range");
  std::vector<int64_t> c2(16, 8);
  c2[4] = 6;
  c2[5] = 2;  // column 2: LTS 6 > LTE 2
  expectError(call(idx(c2, {1, 1, 8, 2}), true), "LTS > LTE at [0, 0, 2] (6 > 2)");
  std::vector<int64_t> c4(32, 0);
  c4[4 * 5 + 2] = 5;
  c4[4 * 5 + 3] = 1;
  expectError(call(idx(c4, {1, 1, 8, 4}), false), "UTS > UTE at [0, 0, 5] (5 > 1)");
  // q, k, v and attributes.
  expectError(call(Tensor(), true, randUniform({1, 8, 3, 4}, -1, 1, F32, kCpu, 3),
                   randUniform({1, 8, 2, 4}, -1, 1, F32, kCpu, 4)),
              "must be a multiple of k/v heads");
  expectError(call(Tensor(), true, q, randUniform({1, 8, 1, 5}, -1, 1, F32, kCpu, 4)),
              "differ in batch or head dim");
  expectError([&] { ops::flashmaskAttention(q, k, ops::cast(k, F64), Tensor()); },
              "must share a dtype");
  expectError([&] { ops::flashmaskAttention(q, k, k, Tensor(), true, 0); }, "window_size");
  expectError([&] { ops::flashmaskAttention(q, k, k, Tensor(), true, -1, 1.0); }, "dropout");
  expectError([&] { ops::flashmaskAttention(q, k, k, Tensor(), true, -1, 0.0, -1.0); }, "scale");
  expectError(
      [&] {
        ops::flashmaskAttention(ops::cast(q, DType::Int32), ops::cast(k, DType::Int32),
                                ops::cast(k, DType::Int32), Tensor());
      },
      "must be a floating-point tensor");
}

// ---------------------------------------------------------------- builders and tile counts
std::vector<int64_t> column(const fmk::Mask& m, int64_t c) {
  std::vector<int32_t> v = m.startendRowIndices.toVector<int32_t>();
  const int64_t cc = m.startendRowIndices.size(3);
  std::vector<int64_t> r;
  for (size_t i = size_t(c); i < v.size(); i += size_t(cc)) r.push_back(v[i]);
  return r;
}

TEST(FlashmaskBuilders, MatchTheReferenceExamples) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(column(fmk::causalDocument({4, 3, 3}), 0), (V{4, 4, 4, 4, 7, 7, 7, 10, 10, 10}));
  EXPECT_EQ(column(fmk::slidingWindow(10, 3), 0), (V{3, 4, 5, 6, 7, 8, 9, 10, 10, 10}));
  fmk::Mask doc = fmk::document({4, 3, 3});
  EXPECT_FALSE(doc.causal);
  EXPECT_EQ(column(doc, 0), (V{4, 4, 4, 4, 7, 7, 7, 10, 10, 10}));
  EXPECT_EQ(column(doc, 1), (V{0, 0, 0, 0, 4, 4, 4, 7, 7, 7}));
  EXPECT_EQ(column(fmk::sharedQuestion(4, {3, 3}), 0), (V{10, 10, 10, 10, 7, 7, 7, 10, 10, 10}));
  fmk::Mask plm = fmk::prefixLmCausal(6, 2);
  EXPECT_EQ(column(plm, 0), (V{6, 6, 6, 6, 6, 6}));
  EXPECT_EQ(column(plm, 1), (V{0, 0, 2, 3, 4, 5}));
  fmk::Mask blk = fmk::causalBlockwise({2, 2, 3});
  EXPECT_EQ(column(blk, 0), (V{2, 2, 4, 4, 7, 7, 7}));
  EXPECT_EQ(column(blk, 1), (V{4, 4, 4, 4, 7, 7, 7}));
  EXPECT_EQ(column(fmk::globalSlidingWindow(6, 1, 2), 0), (V{6, 3, 4, 5, 6, 6}));
  fmk::Mask ev = fmk::randomEviction(50, 3, 2);
  V lts = column(ev, 0);
  EXPECT_EQ(lts[0], 50);
  EXPECT_EQ(lts[1], 50);
  for (int64_t j = 2; j < 50; ++j) EXPECT_TRUE(lts[size_t(j)] > j && lts[size_t(j)] <= 50);
  EXPECT_EQ(fmk::maskKindName(fmk::MaskKind::QkSparse), std::string("qk_sparse"));
}

TEST(FlashmaskBuilders, RejectBadArguments) {
  expectError([] { fmk::causalDocument({}); }, "at least one length");
  expectError([] { fmk::document({3, 0}); }, "lengths must be positive");
  expectError([] { fmk::slidingWindow(10, 0); }, "window must be >= 1");
  expectError([] { fmk::prefixLmDocument({4, 4}, {5, 1}); }, "prefix 5 of document 0");
  expectError([] { fmk::qkSparse(10, {{0, 5, 0, 3}, {4, 6, 0, 3}}); }, "key spans overlap");
  expectError([] { fmk::repeatMask(fmk::causal(4).startendRowIndices, 2, 0); }, "cannot repeat");
}

TEST(FlashmaskBuilders, TileCountsOfCausalAndDocumentMasks) {
  // 256 = 4 tiles of 64 each way: causal skips the 6 tiles above the diagonal and masks the 4 on
  // it.
  fmk::TileCounts c =
      fmk::countTiles(fmk::causal(256).startendRowIndices, true, 256, 256, -1, {64, 64});
  EXPECT_EQ(c.skipped, 6);
  EXPECT_EQ(c.partial, 4);
  EXPECT_EQ(c.unmasked, 6);
  fmk::TileCounts d =
      fmk::countTiles(fmk::document({128, 128}).startendRowIndices, false, 256, 256, -1, {64, 64});
  EXPECT_EQ(d.skipped, 8);
  EXPECT_EQ(d.partial, 0);
  EXPECT_EQ(d.unmasked, 8);
  EXPECT_DOUBLE_EQ(d.skippedFraction(), 0.5);
  EXPECT_EQ(fmk::tileShape(64).cols, 64);
  EXPECT_EQ(fmk::tileShape(128).cols, 32);
}

TEST(FlashmaskBuilders, CausalDocumentRowsGivePerRowDocuments) {
  using V = std::vector<int64_t>;
  fmk::Mask m = fmk::causalDocumentRows({{4, 3, 3}, {10}, {1, 9}});
  EXPECT_TRUE(m.causal);
  EXPECT_EQ(m.kind, fmk::MaskKind::CausalDocument);
  ASSERT_EQ(m.startendRowIndices.shape(), (Shape{3, 1, 10, 1}));
  EXPECT_EQ(m.startendRowIndices.toVector<int32_t>(),
            (std::vector<int32_t>{4,  4,  4,  4,  7,  7,  7,  10, 10, 10,  // row 0
                                  10, 10, 10, 10, 10, 10, 10, 10, 10, 10,  // row 1
                                  1,  10, 10, 10, 10, 10, 10, 10, 10, 10}));
  // Row 0 is the single-row builder's mask.
  EXPECT_EQ(column(fmk::causalDocument({4, 3, 3}), 0), (V{4, 4, 4, 4, 7, 7, 7, 10, 10, 10}));
  expectError([] { fmk::causalDocumentRows({}); }, "at least one row");
  expectError([] { fmk::causalDocumentRows({{4, 3}, {6}}); }, "row 1 has 6 tokens, row 0 has 7");
  expectError([] { fmk::causalDocumentRows({{4, 0}}); }, "lengths must be positive");
}

TEST(FlashmaskBuilders, TileMapOfACausalMask) {
  // 256 = 4 × 4 tiles of 64: skipped above the diagonal, partial on it, full below.
  EXPECT_EQ(fmk::tileMap(fmk::causal(256).startendRowIndices, true, 256, 256, -1, {64, 64}),
            "psss/fpss/ffps/fffp");
  EXPECT_EQ(fmk::tileMap(Tensor(), true, 256, 256, -1, {64, 64}), "psss/fpss/ffps/fffp");
  // Two documents of 128: the off-diagonal blocks are skipped, per batch row.
  Tensor docs = fmk::causalDocumentRows({{128, 128}, {256}}).startendRowIndices;
  EXPECT_EQ(fmk::tileMap(docs, true, 256, 256, -1, {64, 64}, 0), "psss/fpss/ssps/ssfp");
  EXPECT_EQ(fmk::tileMap(docs, true, 256, 256, -1, {64, 64}, 1), "psss/fpss/ffps/fffp");
  // Non-square grid (Sq 100 → 2 row tiles, Sk 200 → 4 column tiles), no mask.
  EXPECT_EQ(fmk::tileMap(Tensor(), false, 100, 200, -1, {64, 64}), "ffff/ffff");
}

TEST(FlashmaskBuilders, TileMapIsCoarsenedToAtMost64Cells) {
  // 130 × 130 tiles of one element, causal: each tile is either skipped (above the diagonal) or
  // full; a 64 × 64 cell covers a block of tiles and is 's' or 'f' only when all of them are.
  const int64_t n = 130, cells = 64;
  std::string map = fmk::tileMap(Tensor(), true, n, n, -1, {1, 1});
  std::vector<std::string> rows;
  for (size_t a = 0, b; a <= map.size(); a = b + 1) {
    b = map.find('/', a);
    if (b == std::string::npos) b = map.size();
    rows.push_back(map.substr(a, b - a));
  }
  ASSERT_EQ(int64_t(rows.size()), cells);
  for (int64_t r = 0; r < cells; ++r) {
    ASSERT_EQ(int64_t(rows[size_t(r)].size()), cells);
    for (int64_t c = 0; c < cells; ++c) {
      bool skipped = false, full = false;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j)
          if (i * cells / n == r && j * cells / n == c) (j > i ? skipped : full) = true;
      const char want = skipped && full ? 'p' : skipped ? 's' : 'f';
      EXPECT_EQ(rows[size_t(r)][size_t(c)], want) << "cell " << r << ", " << c;
    }
  }
}

// Keeps the attributes of every flashmask op call.
class AttrRecorder : public Observer {
 public:
  void onOpEnd(const OpEvent& e) override {
    if (e.op->name.rfind("flashmask_attention", 0) == 0) calls.push_back({e.op->name, *e.attrs});
  }
  std::vector<std::pair<std::string, Attrs>> calls;
};

TEST(FlashmaskAttention, RecordsMaskKindBlockSparsityAndTileMap) {
  auto rec = std::make_shared<AttrRecorder>();
  addObserver(rec);
  const int64_t s = 256;
  Tensor q = randUniform({2, s, 2, 64}, -1, 1, F32, kCpu, 1).detach();
  q.setRequiresGrad(true);
  Tensor k = randUniform({2, s, 2, 64}, -1, 1, F32, kCpu, 2);
  fmk::Mask docs = fmk::causalDocumentRows({{128, 128}, {256}}, kCpu);
  auto [out, lse] = ops::flashmaskAttention(q, k, k, docs);
  ops::sum(out).backward();
  ops::flashmaskAttention(q, k, k, fmk::repeatMask(fmk::causal(s, kCpu).startendRowIndices, 2, 1),
                          true);  // an index tensor alone: "custom"
  ops::flashmaskAttention(q, k, k, Tensor(), false, 32);
  ops::flashmaskAttention(q, k, k, Tensor(), false);
  removeObserver(rec);
  ASSERT_EQ(rec->calls.size(), 5u);
  const Attrs& f = rec->calls[0].second;
  EXPECT_EQ(f.getString("mask"), "causal_document");
  // Batch 0 skips 6 + 4 of 16 tiles, batch 1 (one document) 6 of 16.
  EXPECT_DOUBLE_EQ(f.getDouble("block_sparsity"), 16.0 / 32.0);
  EXPECT_EQ(f.getInts("tile_shape"), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(f.getString("tile_map"), "psss/fpss/ssps/ssfp");
  // The backward op carries the forward op's attributes.
  EXPECT_EQ(rec->calls[1].first, "flashmask_attention_backward");
  EXPECT_EQ(rec->calls[1].second.toString(), f.toString());
  EXPECT_EQ(rec->calls[2].second.getString("mask"), "custom");
  EXPECT_DOUBLE_EQ(rec->calls[2].second.getDouble("block_sparsity"), 6.0 / 16.0);
  EXPECT_EQ(rec->calls[3].second.getString("mask"), "sliding_window");
  EXPECT_EQ(rec->calls[4].second.getString("mask"), "full");
  EXPECT_DOUBLE_EQ(rec->calls[4].second.getDouble("block_sparsity"), 0.0);
  EXPECT_EQ(rec->calls[4].second.getString("tile_map"), "ffff/ffff/ffff/ffff");
}

// Sees the flashmask calls like AttrRecorder but declines op descriptions.
class PlainAttrRecorder : public AttrRecorder {
 public:
  bool wantsOpDescriptions() const override { return false; }
};

TEST(FlashmaskAttention, DescribesTheMaskOnlyWhileAnObserverWantsIt) {
  Tensor q = randUniform({1, 128, 1, 64}, -1, 1, F32, kCpu, 1);
  fmk::Mask docs = fmk::causalDocument({64, 64}, kCpu);
  auto plain = std::make_shared<PlainAttrRecorder>();
  addObserver(plain);
  ops::flashmaskAttention(q, q, q, docs);
  // Only the builder's kind, which no input carries; no tile work for this observer.
  ASSERT_EQ(plain->calls.size(), 1u);
  EXPECT_EQ(plain->calls[0].second.toString(),
            "{\"causal\":true,\"window_size\":-1,\"dropout\":0,\"scale\":0,\"seed\":0,"
            "\"offset\":0,\"mask\":\"causal_document\"}");
  // Once another observer wants descriptions, every observer sees them.
  auto rec = std::make_shared<AttrRecorder>();
  addObserver(rec);
  ops::flashmaskAttention(q, q, q, docs);
  removeObserver(rec);
  ops::flashmaskAttention(q, q, q, docs);
  removeObserver(plain);
  ASSERT_EQ(rec->calls.size(), 1u);
  ASSERT_EQ(plain->calls.size(), 3u);
  EXPECT_EQ(rec->calls[0].second.getString("tile_map"), "ps/sp");
  EXPECT_EQ(plain->calls[1].second.toString(), rec->calls[0].second.toString());
  EXPECT_FALSE(plain->calls[2].second.has("tile_map"));
}

TEST(FlashmaskAttention, MaskOverloadGivesTheSameBitsAsTheIndexOverload) {
  Tensor q = randUniform({2, 100, 2, 16}, -1, 1, F32, kCpu, 3);
  Tensor k = randUniform({2, 100, 1, 16}, -1, 1, F32, kCpu, 4);
  fmk::Mask m = fmk::causalDocumentRows({{30, 70}, {100}}, kCpu);
  Tensor a = ops::flashmaskAttention(q, k, k, m).first;
  Tensor b = ops::flashmaskAttention(q, k, k, m.startendRowIndices, true).first;
  EXPECT_TRUE(bitEqual(a, b));
  Generator g1(5), g2(5);
  Tensor c = ops::flashmaskAttention(q, k, k, m, -1, 0.25, 0.0, &g1, true).first;
  Tensor d = ops::flashmaskAttention(q, k, k, m.startendRowIndices, true, -1, 0.25, 0.0, g2).first;
  EXPECT_TRUE(bitEqual(c, d));
  EXPECT_EQ(g1.offset(), g2.offset());
  expectError([&] { ops::flashmaskAttention(q, k, k, m, -1, 0.25, 0.0, nullptr, true); },
              "needs a generator");
}

#endif  // !KEEL_FLASHMASK_CUDA

}  // namespace
}  // namespace keel::test
