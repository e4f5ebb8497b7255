// The cpu-ref backend: plain, obviously-correct kernels, the oracle for every other backend.
// Every kernel loads its inputs into row-major std::vector<double>, computes with simple loops in
// a fixed order (float64 accumulation), and stores with one rounding to the output dtype.
// Integers pass through double too (exact below 2^53). Not fast, on purpose.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "dist/collective_kernels.h"
#include "keel/random.h"
#include "kernel_table.h"
#include "kernel_util.h"
#include "shape_util.h"

namespace keel::detail {
namespace {

using Vec = std::vector<double>;

// Row-major values of t seen at `shape` (broadcast where t has size-1 or missing dims).
Vec loadAs(const Tensor& t, const Shape& shape) {
  Shape st = broadcastStrides(t, shape);
  Vec v(size_t(shapeNumel(shape)));
  visitDType(t.dtype(), [&]<typename T>() {
    const T* p = t.data<T>();
    for (size_t i = 0; i < v.size(); ++i) {
      T x = p[stridedOffset(int64_t(i), shape, st)];
      if constexpr (kIsFloat<T>)
        v[i] = double(x);
      else
        v[i] = double(x);
    }
  });
  return v;
}
Vec load(const Tensor& t) {
  return loadAs(t, t.shape());
}

template <typename T>
T fromDouble(double x) {
  if constexpr (std::is_same_v<T, bool>) {
    return x != 0.0;
  } else if constexpr (std::is_same_v<T, double>) {
    return x;
  } else if constexpr (kIsFloat<T>) {
    return T(float(x));
  } else {
    return saturatingInt<T>(x);
  }
}

// Writes v (row-major) into t, which may be a strided view (in-place updates) or contiguous.
void store(const Tensor& t, const Vec& v) {
  visitDType(t.dtype(), [&]<typename T>() {
    T* p = t.data<T>();
    for (size_t i = 0; i < v.size(); ++i)
      p[stridedOffset(int64_t(i), t.shape(), t.strides())] = fromDouble<T>(v[i]);
  });
}

void checkIndex(const KernelCtx& c, double idx, int64_t extent) {
  KEEL_CHECK(idx >= 0 && idx < double(extent), "op '", c.op.name, "': index ", int64_t(idx),
             " is out of range for extent ", extent);
}

// ---------------------------------------------------------------- elementwise
template <typename F>
void binary(const KernelCtx& c, F f) {
  const Shape& s = c.outputs[0].shape();
  Vec a = loadAs(c.inputs[0], s), b = loadAs(c.inputs[1], s), r(a.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = f(a[i], b[i]);
  store(c.outputs[0], r);
}
template <typename F>
void unary(const KernelCtx& c, F f) {
  Vec x = load(c.inputs[0]);
  for (double& v : x) v = f(v);
  store(c.outputs[0], x);
}
template <typename F>
void gradUnary(const KernelCtx& c, F f) {  // (grad, x) -> grad * f'(x)
  Vec g = load(c.inputs[0]), x = load(c.inputs[1]);
  for (size_t i = 0; i < g.size(); ++i) g[i] = f(g[i], x[i]);
  store(c.outputs[0], g);
}

double sigmoidD(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}
double truncIfInt(const KernelCtx& c, double s) {
  return isFloating(c.inputs[0].dtype()) ? s : std::trunc(s);
}

void kAdd(const KernelCtx& c) {
  binary(c, [](double a, double b) { return a + b; });
}
void kSub(const KernelCtx& c) {
  binary(c, [](double a, double b) { return a - b; });
}
void kMul(const KernelCtx& c) {
  binary(c, [](double a, double b) { return a * b; });
}
void kDiv(const KernelCtx& c) {
  binary(c, [](double a, double b) { return a / b; });
}
void kPow(const KernelCtx& c) {
  binary(c, [](double a, double b) { return std::pow(a, b); });
}
void kMaximum(const KernelCtx& c) {
  binary(c, [](double a, double b) { return std::isnan(a) || a >= b ? a : b; });
}
void kMinimum(const KernelCtx& c) {
  binary(c, [](double a, double b) { return std::isnan(a) || a <= b ? a : b; });
}
void kEq(const KernelCtx& c) {
  binary(c, [](double a, double b) { return double(a == b); });
}
void kLt(const KernelCtx& c) {
  binary(c, [](double a, double b) { return double(a < b); });
}
void kGt(const KernelCtx& c) {
  binary(c, [](double a, double b) { return double(a > b); });
}

void kNeg(const KernelCtx& c) {
  unary(c, [](double x) { return -x; });
}
void kExp(const KernelCtx& c) {
  unary(c, [](double x) { return std::exp(x); });
}
void kLog(const KernelCtx& c) {
  unary(c, [](double x) { return std::log(x); });
}
void kSqrt(const KernelCtx& c) {
  unary(c, [](double x) { return std::sqrt(x); });
}
void kRsqrt(const KernelCtx& c) {
  unary(c, [](double x) { return 1.0 / std::sqrt(x); });
}
void kTanh(const KernelCtx& c) {
  unary(c, [](double x) { return std::tanh(x); });
}
void kSigmoid(const KernelCtx& c) {
  unary(c, sigmoidD);
}
void kRelu(const KernelCtx& c) {
  unary(c, [](double x) { return x > 0 ? x : 0.0; });
}
void kGelu(const KernelCtx& c) {
  unary(c, [](double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); });
}
void kSilu(const KernelCtx& c) {
  unary(c, [](double x) { return x * sigmoidD(x); });
}
void kAbs(const KernelCtx& c) {
  unary(c, [](double x) { return std::abs(x); });
}
void kGeluBackward(const KernelCtx& c) {
  gradUnary(c, [](double g, double x) {
    double cdf = 0.5 * (1.0 + std::erf(x / std::sqrt(2.0)));
    double pdf = std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
    return g * (cdf + x * pdf);
  });
}
void kSiluBackward(const KernelCtx& c) {
  gradUnary(c, [](double g, double x) {
    double s = sigmoidD(x);
    return g * s * (1.0 + x * (1.0 - s));
  });
}
void kAddScalar(const KernelCtx& c) {
  double s = truncIfInt(c, c.attrs.getDouble("scalar"));
  unary(c, [s](double x) { return x + s; });
}
void kMulScalar(const KernelCtx& c) {
  double s = truncIfInt(c, c.attrs.getDouble("scalar"));
  unary(c, [s](double x) { return x * s; });
}
void kPowScalar(const KernelCtx& c) {
  double e = c.attrs.getDouble("exponent");
  unary(c, [e](double x) { return std::pow(x, e); });
}

// ---------------------------------------------------------------- reductions
std::vector<bool> reducedDims(const Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<bool> red(size_t(x.dim()), dims.empty());
  for (int64_t d : dims) red[size_t(normDim(d, x.dim(), "reduce"))] = true;
  return red;
}

// Output slot of each input element (row-major), for reductions over a dim set.
std::vector<int64_t> reduceSlots(const Tensor& x, const std::vector<bool>& red) {
  Shape outShape, outStrides;
  for (size_t d = 0; d < red.size(); ++d) outShape.push_back(red[d] ? 1 : x.shape()[d]);
  outStrides = contiguousStrides(outShape);
  for (size_t d = 0; d < red.size(); ++d)
    if (red[d]) outStrides[d] = 0;
  std::vector<int64_t> slot(size_t(x.numel()));
  for (size_t i = 0; i < slot.size(); ++i)
    slot[i] = stridedOffset(int64_t(i), x.shape(), outStrides);
  return slot;
}

void sumOrMean(const KernelCtx& c, bool mean) {
  const Tensor& x = c.inputs[0];
  auto red = reducedDims(x, c.attrs.getInts("dims"));
  auto slot = reduceSlots(x, red);
  Vec v = load(x), r(size_t(c.outputs[0].numel()), 0.0);
  for (size_t i = 0; i < v.size(); ++i) r[size_t(slot[i])] += v[i];
  if (mean) {
    double count = double(x.numel()) / double(std::max<int64_t>(1, c.outputs[0].numel()));
    for (double& e : r) e = count > 0 ? e / count : std::nan("");
  }
  store(c.outputs[0], r);
}
void kSum(const KernelCtx& c) {
  sumOrMean(c, false);
}
void kMean(const KernelCtx& c) {
  sumOrMean(c, true);
}

// NaN counts as the largest value; the first maximum wins.
void maxAlong(const KernelCtx& c, bool wantIndex) {
  const Tensor& x = c.inputs[0];
  int64_t dim = normDim(c.attrs.getInt("dim"), x.dim(), c.op.name);
  DimSplit sp = splitAt(x.shape(), dim);
  Vec v = load(x), r(size_t(sp.outer * sp.inner));
  for (int64_t o = 0; o < sp.outer; ++o)
    for (int64_t in = 0; in < sp.inner; ++in) {
      int64_t best = 0;
      double bv = v[size_t(o * sp.n * sp.inner + in)];
      for (int64_t j = 1; j < sp.n; ++j) {
        double e = v[size_t((o * sp.n + j) * sp.inner + in)];
        if (!std::isnan(bv) && (e > bv || std::isnan(e))) {
          bv = e;
          best = j;
        }
      }
      r[size_t(o * sp.inner + in)] = wantIndex ? double(best) : bv;
    }
  store(c.outputs[0], r);
}
void kMax(const KernelCtx& c) {
  maxAlong(c, false);
}
void kArgmax(const KernelCtx& c) {
  maxAlong(c, true);
}

// ---------------------------------------------------------------- matmul
void kMatmul(const KernelCtx& c) {
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  bool ta = c.attrs.getBool("trans_a"), tb = c.attrs.getBool("trans_b");
  const Shape& os = c.outputs[0].shape();
  Shape batch(os.begin(), os.end() - 2);
  int64_t m = os[os.size() - 2], n = os.back();
  int64_t k = ta ? a.size(-2) : a.size(-1);
  Shape as = batch, bs = batch;
  as.push_back(a.size(-2));
  as.push_back(a.size(-1));
  bs.push_back(b.size(-2));
  bs.push_back(b.size(-1));
  Vec av = loadAs(a, as), bv = loadAs(b, bs), r(size_t(shapeNumel(os)), 0.0);
  int64_t nb = shapeNumel(batch);
  for (int64_t p = 0; p < nb; ++p) {
    const double* A = av.data() + p * m * k;
    const double* B = bv.data() + p * k * n;
    double* C = r.data() + p * m * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (int64_t q = 0; q < k; ++q)
          acc += (ta ? A[q * m + i] : A[i * k + q]) * (tb ? B[j * k + q] : B[q * n + j]);
        C[i * n + j] = acc;
      }
  }
  store(c.outputs[0], r);
}

// ---------------------------------------------------------------- softmax family
template <typename F>
void alongDim(const KernelCtx& c, const Tensor& shapeOf, F rowFn) {
  int64_t dim = normDim(c.attrs.getInt("dim"), shapeOf.dim(), c.op.name);
  DimSplit sp = splitAt(shapeOf.shape(), dim);
  for (int64_t o = 0; o < sp.outer; ++o)
    for (int64_t in = 0; in < sp.inner; ++in) {
      auto at = [&](int64_t j) { return size_t((o * sp.n + j) * sp.inner + in); };
      rowFn(sp.n, at);
    }
}

void kSoftmax(const KernelCtx& c) {
  Vec x = load(c.inputs[0]), r(x.size());
  alongDim(c, c.inputs[0], [&](int64_t n, auto at) {
    double mx = -INFINITY, s = 0.0;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, x[at(j)]);
    for (int64_t j = 0; j < n; ++j) s += std::exp(x[at(j)] - mx);
    for (int64_t j = 0; j < n; ++j) r[at(j)] = std::exp(x[at(j)] - mx) / s;
  });
  store(c.outputs[0], r);
}
void kLogSoftmax(const KernelCtx& c) {
  Vec x = load(c.inputs[0]), r(x.size());
  alongDim(c, c.inputs[0], [&](int64_t n, auto at) {
    double mx = -INFINITY, s = 0.0;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, x[at(j)]);
    for (int64_t j = 0; j < n; ++j) s += std::exp(x[at(j)] - mx);
    double lse = mx + std::log(s);
    for (int64_t j = 0; j < n; ++j) r[at(j)] = x[at(j)] - lse;
  });
  store(c.outputs[0], r);
}
void kSoftmaxBackward(const KernelCtx& c) {
  Vec g = load(c.inputs[0]), y = load(c.inputs[1]), r(g.size());
  alongDim(c, c.inputs[1], [&](int64_t n, auto at) {
    double dot = 0.0;
    for (int64_t j = 0; j < n; ++j) dot += g[at(j)] * y[at(j)];
    for (int64_t j = 0; j < n; ++j) r[at(j)] = y[at(j)] * (g[at(j)] - dot);
  });
  store(c.outputs[0], r);
}
void kLogSoftmaxBackward(const KernelCtx& c) {
  Vec g = load(c.inputs[0]), y = load(c.inputs[1]), r(g.size());
  alongDim(c, c.inputs[1], [&](int64_t n, auto at) {
    double s = 0.0;
    for (int64_t j = 0; j < n; ++j) s += g[at(j)];
    for (int64_t j = 0; j < n; ++j) r[at(j)] = g[at(j)] - std::exp(y[at(j)]) * s;
  });
  store(c.outputs[0], r);
}

// ---------------------------------------------------------------- norms
void kLayerNorm(const KernelCtx& c) {
  Vec x = load(c.inputs[0]), w = load(c.inputs[1]), b = load(c.inputs[2]), r(x.size());
  double eps = c.attrs.getDouble("eps");
  size_t d = w.size(), rows = d ? x.size() / d : 0;
  for (size_t i = 0; i < rows; ++i) {
    const double* xr = &x[i * d];
    double mean = 0.0, var = 0.0;
    for (size_t j = 0; j < d; ++j) mean += xr[j];
    mean /= double(d);
    for (size_t j = 0; j < d; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    double rstd = 1.0 / std::sqrt(var / double(d) + eps);
    for (size_t j = 0; j < d; ++j) r[i * d + j] = (xr[j] - mean) * rstd * w[j] + b[j];
  }
  store(c.outputs[0], r);
}
void kLayerNormBackward(const KernelCtx& c) {
  Vec g = load(c.inputs[0]), x = load(c.inputs[1]), w = load(c.inputs[2]);
  double eps = c.attrs.getDouble("eps");
  size_t d = w.size(), rows = d ? x.size() / d : 0;
  Vec dx(x.size()), dw(d, 0.0), db(d, 0.0), xhat(d), gw(d);
  for (size_t i = 0; i < rows; ++i) {
    const double* xr = &x[i * d];
    const double* gr = &g[i * d];
    double mean = 0.0, var = 0.0;
    for (size_t j = 0; j < d; ++j) mean += xr[j];
    mean /= double(d);
    for (size_t j = 0; j < d; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    double rstd = 1.0 / std::sqrt(var / double(d) + eps);
    double mg = 0.0, mgx = 0.0;
    for (size_t j = 0; j < d; ++j) {
      xhat[j] = (xr[j] - mean) * rstd;
      gw[j] = gr[j] * w[j];
      mg += gw[j];
      mgx += gw[j] * xhat[j];
      dw[j] += gr[j] * xhat[j];
      db[j] += gr[j];
    }
    mg /= double(d);
    mgx /= double(d);
    for (size_t j = 0; j < d; ++j) dx[i * d + j] = rstd * (gw[j] - mg - xhat[j] * mgx);
  }
  store(c.outputs[0], dx);
  store(c.outputs[1], dw);
  store(c.outputs[2], db);
}
void kRmsNorm(const KernelCtx& c) {
  Vec x = load(c.inputs[0]), w = load(c.inputs[1]), r(x.size());
  double eps = c.attrs.getDouble("eps");
  size_t d = w.size(), rows = d ? x.size() / d : 0;
  for (size_t i = 0; i < rows; ++i) {
    double ms = 0.0;
    for (size_t j = 0; j < d; ++j) ms += x[i * d + j] * x[i * d + j];
    double rr = 1.0 / std::sqrt(ms / double(d) + eps);
    for (size_t j = 0; j < d; ++j) r[i * d + j] = x[i * d + j] * rr * w[j];
  }
  store(c.outputs[0], r);
}
void kRmsNormBackward(const KernelCtx& c) {
  Vec g = load(c.inputs[0]), x = load(c.inputs[1]), w = load(c.inputs[2]);
  double eps = c.attrs.getDouble("eps");
  size_t d = w.size(), rows = d ? x.size() / d : 0;
  Vec dx(x.size()), dw(d, 0.0);
  for (size_t i = 0; i < rows; ++i) {
    const double* xr = &x[i * d];
    const double* gr = &g[i * d];
    double ms = 0.0;
    for (size_t j = 0; j < d; ++j) ms += xr[j] * xr[j];
    double rr = 1.0 / std::sqrt(ms / double(d) + eps);
    double dot = 0.0;
    for (size_t j = 0; j < d; ++j) {
      dot += gr[j] * w[j] * xr[j];
      dw[j] += gr[j] * xr[j] * rr;
    }
    dot /= double(d);
    for (size_t j = 0; j < d; ++j) dx[i * d + j] = rr * gr[j] * w[j] - xr[j] * rr * rr * rr * dot;
  }
  store(c.outputs[0], dx);
  store(c.outputs[1], dw);
}

// ---------------------------------------------------------------- embedding, loss, dropout
void kEmbedding(const KernelCtx& c) {
  const Tensor& w = c.inputs[0];
  Vec wv = load(w), idx = load(c.inputs[1]);
  int64_t v = w.size(0), d = w.size(1);
  for (double i : idx) checkIndex(c, i, v);
  Vec r(idx.size() * size_t(d));
  for (size_t i = 0; i < idx.size(); ++i)
    for (int64_t j = 0; j < d; ++j)
      r[i * size_t(d) + size_t(j)] = wv[size_t(int64_t(idx[i]) * d + j)];
  store(c.outputs[0], r);
}
void kEmbeddingBackward(const KernelCtx& c) {
  Vec g = load(c.inputs[0]), idx = load(c.inputs[1]);
  int64_t v = c.outputs[0].size(0), d = c.outputs[0].size(1);
  for (double i : idx) checkIndex(c, i, v);
  Vec r(size_t(v * d), 0.0);
  for (size_t i = 0; i < idx.size(); ++i)
    for (int64_t j = 0; j < d; ++j)
      r[size_t(int64_t(idx[i]) * d + j)] += g[i * size_t(d) + size_t(j)];
  store(c.outputs[0], r);
}

// Row log-sum-exp of logits [N, C].
double rowLse(const double* row, int64_t n) {
  double mx = -INFINITY, s = 0.0;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, row[j]);
  for (int64_t j = 0; j < n; ++j) s += std::exp(row[j] - mx);
  return mx + std::log(s);
}
void kCrossEntropy(const KernelCtx& c) {
  Vec x = load(c.inputs[0]), t = load(c.inputs[1]);
  int64_t n = c.inputs[0].size(0), cls = c.inputs[0].size(1);
  double ignore = double(c.attrs.getInt("ignore_index", -100));
  for (double ti : t)
    if (ti != ignore) checkIndex(c, ti, cls);
  double total = 0.0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (t[size_t(i)] == ignore) continue;
    const double* row = &x[size_t(i * cls)];
    total += rowLse(row, cls) - row[int64_t(t[size_t(i)])];
    ++count;
  }
  store(c.outputs[0], {count ? total / double(count) : 0.0});
}
void kCrossEntropyBackward(const KernelCtx& c) {
  double g = load(c.inputs[0])[0];
  Vec x = load(c.inputs[1]), t = load(c.inputs[2]), r(x.size(), 0.0);
  int64_t n = c.inputs[1].size(0), cls = c.inputs[1].size(1);
  double ignore = double(c.attrs.getInt("ignore_index", -100));
  int64_t count = 0;
  for (double ti : t)
    if (ti != ignore) {
      checkIndex(c, ti, cls);
      ++count;
    }
  for (int64_t i = 0; i < n && count > 0; ++i) {
    if (t[size_t(i)] == ignore) continue;
    const double* row = &x[size_t(i * cls)];
    double lse = rowLse(row, cls);
    for (int64_t j = 0; j < cls; ++j) {
      double p = std::exp(row[j] - lse) - (j == int64_t(t[size_t(i)]) ? 1.0 : 0.0);
      r[size_t(i * cls + j)] = p * g / double(count);
    }
  }
  store(c.outputs[0], r);
}
void kDropout(const KernelCtx& c) {
  double p = c.attrs.getDouble("p");
  uint64_t seed = uint64_t(c.attrs.getInt("seed")), off = uint64_t(c.attrs.getInt("offset"));
  Vec x = load(c.inputs[0]);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = double(philoxUniform(seed, off, i)) >= p ? x[i] / (1.0 - p) : 0.0;
  store(c.outputs[0], x);
}
// Each row (b, t, h) of x [B, T, H, D]: the pair (i, i + D/2) turned by t·base^(-2i/D), negated
// when inverse (docs/ops.md, "Rotary position embedding").
void kRope(const KernelCtx& c) {
  const Tensor& x = c.inputs[0];
  const int64_t t = x.size(1), h = x.size(2), d = x.size(3), half = d / 2;
  const double base = c.attrs.getDouble("base", 10000.0);
  const double sign = c.attrs.getBool("inverse", false) ? -1.0 : 1.0;
  Vec v = load(x), out(v.size());
  for (size_t row = 0; row * size_t(d) < v.size(); ++row) {
    const double pos = double((int64_t(row) / h) % t);
    const double* in = &v[row * size_t(d)];
    double* o = &out[row * size_t(d)];
    for (int64_t i = 0; i < half; ++i) {
      const double a = sign * pos * std::pow(base, -2.0 * double(i) / double(d));
      const double x1 = in[i], x2 = in[i + half];
      o[i] = x1 * std::cos(a) - x2 * std::sin(a);
      o[i + half] = x2 * std::cos(a) + x1 * std::sin(a);
    }
  }
  store(c.outputs[0], out);
}

// ---------------------------------------------------------------- flashmask attention
// The oracle: materialise the [Sq, Sk] visibility of each (batch, head) from the column bounds
// (Note [FlashMask geometry]), then a dense softmax and products in float64.
struct AttnShape {
  int64_t b, sq, h, d, sk, hk, grp;
  bool causal;
  int64_t window;
  double scale, p;
  uint64_t seed, offset;
};

AttnShape attnShape(const KernelCtx& c, const Tensor& q, const Tensor& k) {
  AttnShape s{q.size(0), q.size(1), q.size(2), q.size(3), k.size(1), k.size(2), 0,
              false,     -1,        0.0,       0.0,       0,         0};
  s.grp = s.h / s.hk;
  s.causal = c.attrs.getBool("causal", false);
  s.window = c.attrs.getInt("window_size", -1);
  s.scale = c.attrs.getDouble("scale", 0.0);
  if (s.scale == 0.0) s.scale = 1.0 / std::sqrt(double(s.d));
  s.p = c.attrs.getDouble("dropout", 0.0);
  s.seed = uint64_t(c.attrs.getInt("seed", 0));
  s.offset = uint64_t(c.attrs.getInt("offset", 0));
  return s;
}

// visible[i * Sk + j] for batch b, kv head kh.
std::vector<bool> attnVisible(const AttnShape& s, const Tensor* idx, int64_t b, int64_t kh) {
  const int64_t n = s.sk;
  std::vector<int64_t> lts(size_t(n), s.sq), lte(size_t(n), s.sq), uts(size_t(n), 0),
      ute(size_t(n), 0);
  if (idx) {
    const int64_t mh = idx->size(1) == 1 ? 0 : kh, c = idx->size(3);
    Vec all = load(*idx);
    for (int64_t j = 0; j < n; ++j) {
      const double* e = all.data() + ((b * idx->size(1) + mh) * n + j) * c;
      lts[size_t(j)] = int64_t(e[0]);
      if (s.causal && c == 2) lte[size_t(j)] = int64_t(e[1]);
      if (!s.causal && c == 2) ute[size_t(j)] = int64_t(e[1]);
      if (!s.causal && c == 4) {
        lte[size_t(j)] = int64_t(e[1]);
        uts[size_t(j)] = int64_t(e[2]);
        ute[size_t(j)] = int64_t(e[3]);
      }
    }
  }
  std::vector<bool> vis(size_t(s.sq * n));
  for (int64_t i = 0; i < s.sq; ++i) {
    const int64_t ip = i + s.sk - s.sq;
    for (int64_t j = 0; j < n; ++j) {
      const auto jj = size_t(j);
      bool m = (i >= lts[jj] && i < lte[jj]) || (i >= uts[jj] && i < ute[jj]);
      m = m || (s.causal && j > ip);
      m = m || (s.window > 0 && (ip - j >= s.window || (!s.causal && j - ip >= s.window)));
      vis[size_t(i * n + j)] = !m;
    }
  }
  return vis;
}

// Kept-value factor of the attention dropout: 0 or 1/(1-p) (1 without dropout).
double attnDropout(const AttnShape& s, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (s.p == 0.0) return 1.0;
  uint64_t e = uint64_t(((b * s.h + h) * s.sq + i) * s.sk + j);
  return double(philoxUniform(s.seed, s.offset, e)) >= s.p ? 1.0 / (1.0 - s.p) : 0.0;
}

// Softmax probabilities of row i (0 where not visible); returns the log-sum-exp (-inf: no key).
double attnRow(const AttnShape& s, const Vec& q, const Vec& k, const std::vector<bool>& vis,
               int64_t b, int64_t h, int64_t i, Vec& prob) {
  const int64_t kh = h / s.grp;
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < s.sk; ++j) {
    prob[size_t(j)] = -std::numeric_limits<double>::infinity();
    if (!vis[size_t(i * s.sk + j)]) continue;
    double dot = 0;
    for (int64_t x = 0; x < s.d; ++x)
      dot += q[size_t(((b * s.sq + i) * s.h + h) * s.d + x)] *
             k[size_t(((b * s.sk + j) * s.hk + kh) * s.d + x)];
    prob[size_t(j)] = s.scale * dot;
    mx = std::max(mx, prob[size_t(j)]);
  }
  if (mx == -std::numeric_limits<double>::infinity()) {
    std::fill(prob.begin(), prob.end(), 0.0);
    return mx;
  }
  double sum = 0;
  for (int64_t j = 0; j < s.sk; ++j) sum += std::exp(prob[size_t(j)] - mx);
  const double lse = mx + std::log(sum);
  for (int64_t j = 0; j < s.sk; ++j) prob[size_t(j)] = std::exp(prob[size_t(j)] - lse);
  return lse;
}

void kFlashmaskAttention(const KernelCtx& c) {
  const Tensor &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2];
  const Tensor* idx = c.inputs.size() == 4 ? &c.inputs[3] : nullptr;
  const AttnShape s = attnShape(c, q, k);
  Vec Q = load(q), K = load(k), V = load(v), O(Q.size(), 0.0), L(size_t(s.b * s.h * s.sq));
  Vec prob(size_t(s.sk));
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.h; ++h) {
      const int64_t kh = h / s.grp;
      std::vector<bool> vis = attnVisible(s, idx, b, kh);
      for (int64_t i = 0; i < s.sq; ++i) {
        L[size_t((b * s.h + h) * s.sq + i)] = attnRow(s, Q, K, vis, b, h, i, prob);
        double* o = O.data() + ((b * s.sq + i) * s.h + h) * s.d;
        for (int64_t j = 0; j < s.sk; ++j) {
          const double pj = prob[size_t(j)] * attnDropout(s, b, h, i, j);
          if (pj == 0.0) continue;
          const double* vj = V.data() + ((b * s.sk + j) * s.hk + kh) * s.d;
          for (int64_t x = 0; x < s.d; ++x) o[x] += pj * vj[x];
        }
      }
    }
  store(c.outputs[0], O);
  store(c.outputs[1], L);
}

// Recomputes the probabilities (out and lse inputs are not used: the oracle trusts nothing).
void kFlashmaskAttentionBackward(const KernelCtx& c) {
  const Tensor &q = c.inputs[1], &k = c.inputs[2];
  const Tensor* idx = c.inputs.size() == 8 ? &c.inputs[7] : nullptr;
  const AttnShape s = attnShape(c, q, k);
  Vec G = load(c.inputs[0]), Q = load(q), K = load(k), V = load(c.inputs[3]),
      GL = load(c.inputs[6]);
  Vec dQ(Q.size(), 0.0), dK(K.size(), 0.0), dV(V.size(), 0.0);
  Vec prob(size_t(s.sk)), dp(size_t(s.sk));
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.h; ++h) {
      const int64_t kh = h / s.grp;
      std::vector<bool> vis = attnVisible(s, idx, b, kh);
      for (int64_t i = 0; i < s.sq; ++i) {
        const double lse = attnRow(s, Q, K, vis, b, h, i, prob);
        if (lse == -std::numeric_limits<double>::infinity()) continue;
        const size_t qi = size_t(((b * s.sq + i) * s.h + h) * s.d);
        double delta = 0;
        for (int64_t j = 0; j < s.sk; ++j) {
          dp[size_t(j)] = 0;
          if (prob[size_t(j)] == 0.0) continue;
          const double z = attnDropout(s, b, h, i, j);
          const size_t kj = size_t(((b * s.sk + j) * s.hk + kh) * s.d);
          double dot = 0;
          for (int64_t x = 0; x < s.d; ++x) {
            dot += G[qi + size_t(x)] * V[kj + size_t(x)];
            dV[kj + size_t(x)] += prob[size_t(j)] * z * G[qi + size_t(x)];
          }
          dp[size_t(j)] = dot * z;
          delta += prob[size_t(j)] * dp[size_t(j)];
        }
        const double gl = GL[size_t((b * s.h + h) * s.sq + i)];
        for (int64_t j = 0; j < s.sk; ++j) {
          if (prob[size_t(j)] == 0.0) continue;
          const double ds = s.scale * prob[size_t(j)] * (dp[size_t(j)] - delta + gl);
          const size_t kj = size_t(((b * s.sk + j) * s.hk + kh) * s.d);
          for (int64_t x = 0; x < s.d; ++x) {
            dQ[qi + size_t(x)] += ds * K[kj + size_t(x)];
            dK[kj + size_t(x)] += ds * Q[qi + size_t(x)];
          }
        }
      }
    }
  store(c.outputs[0], dQ);
  store(c.outputs[1], dK);
  store(c.outputs[2], dV);
}

// ---------------------------------------------------------------- copies
void kCopy(const KernelCtx& c) {
  store(c.outputs[0], load(c.inputs[0]));
}
void kSliceBackward(const KernelCtx& c) {
  const Tensor& out = c.outputs[0];
  const auto [d, s0, len, step] = slicePlace(c);
  DimSplit sp = splitAt(out.shape(), d);
  Vec g = load(c.inputs[0]), r(size_t(out.numel()), 0.0);
  for (int64_t o = 0; o < sp.outer; ++o)
    for (int64_t j = 0; j < len; ++j)
      for (int64_t in = 0; in < sp.inner; ++in)
        r[size_t((o * sp.n + s0 + j * step) * sp.inner + in)] =
            g[size_t((o * len + j) * sp.inner + in)];
  store(out, r);
}
void kConcat(const KernelCtx& c) {
  const Tensor& out = c.outputs[0];
  int64_t d = normDim(c.attrs.getInt("dim"), out.dim(), c.op.name);
  DimSplit sp = splitAt(out.shape(), d);
  Vec r(size_t(out.numel()));
  int64_t base = 0;
  for (const Tensor& t : c.inputs) {
    Vec v = load(t);
    int64_t n = t.size(d);
    for (int64_t o = 0; o < sp.outer; ++o)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t in = 0; in < sp.inner; ++in)
          r[size_t((o * sp.n + base + j) * sp.inner + in)] = v[size_t((o * n + j) * sp.inner + in)];
    base += n;
  }
  store(out, r);
}

// ---------------------------------------------------------------- indexing
void kIndexSelect(const KernelCtx& c) {
  const Tensor& x = c.inputs[0];
  int64_t d = normDim(c.attrs.getInt("dim"), x.dim(), c.op.name);
  DimSplit sp = splitAt(x.shape(), d);
  Vec v = load(x), idx = load(c.inputs[1]);
  for (double i : idx) checkIndex(c, i, sp.n);
  int64_t m = int64_t(idx.size());
  Vec r(size_t(sp.outer * m * sp.inner));
  for (int64_t o = 0; o < sp.outer; ++o)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t in = 0; in < sp.inner; ++in)
        r[size_t((o * m + j) * sp.inner + in)] =
            v[size_t((o * sp.n + int64_t(idx[size_t(j)])) * sp.inner + in)];
  store(c.outputs[0], r);
}
void kIndexAdd(const KernelCtx& c) {
  const Tensor& x = c.inputs[0];
  int64_t d = normDim(c.attrs.getInt("dim"), x.dim(), c.op.name);
  DimSplit sp = splitAt(x.shape(), d);
  Vec r = load(x), idx = load(c.inputs[1]), src = load(c.inputs[2]);
  for (double i : idx) checkIndex(c, i, sp.n);
  int64_t m = int64_t(idx.size());
  for (int64_t o = 0; o < sp.outer; ++o)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t in = 0; in < sp.inner; ++in)
        r[size_t((o * sp.n + int64_t(idx[size_t(j)])) * sp.inner + in)] +=
            src[size_t((o * m + j) * sp.inner + in)];
  store(c.outputs[0], r);
}

// Linear index into x (row-major) of index-tensor position i with dim replaced by value v.
int64_t scatterTarget(const Shape& idxShape, const Shape& xShape, int64_t dim, int64_t i,
                      int64_t v) {
  int64_t lin = 0, mul = 1;
  for (int64_t d = int64_t(idxShape.size()) - 1; d >= 0; --d) {
    int64_t coord = i % idxShape[size_t(d)];
    i /= idxShape[size_t(d)];
    lin += (d == dim ? v : coord) * mul;
    mul *= xShape[size_t(d)];
  }
  return lin;
}

void kGather(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &index = c.inputs[1];
  int64_t d = normDim(c.attrs.getInt("dim"), x.dim(), c.op.name);
  Vec v = load(x), idx = load(index), r(idx.size());
  for (double i : idx) checkIndex(c, i, x.size(d));
  for (size_t i = 0; i < idx.size(); ++i)
    r[i] = v[size_t(scatterTarget(index.shape(), x.shape(), d, int64_t(i), int64_t(idx[i])))];
  store(c.outputs[0], r);
}
void kScatterAdd(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &index = c.inputs[1];
  int64_t d = normDim(c.attrs.getInt("dim"), x.dim(), c.op.name);
  Vec r = load(x), idx = load(index), src = load(c.inputs[2]);
  for (double i : idx) checkIndex(c, i, x.size(d));
  for (size_t i = 0; i < idx.size(); ++i)
    r[size_t(scatterTarget(index.shape(), x.shape(), d, int64_t(i), int64_t(idx[i])))] += src[i];
  store(c.outputs[0], r);
}

// Stable order of one row: descending puts larger first; NaN counts as the largest.
std::vector<int64_t> sortedRow(const std::vector<double>& row, bool descending) {
  std::vector<int64_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  auto key = [&](int64_t i) { return std::isnan(row[size_t(i)]) ? INFINITY : row[size_t(i)]; };
  auto nanRank = [&](int64_t i) { return std::isnan(row[size_t(i)]) ? 1 : 0; };
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    if (key(a) != key(b)) return descending ? key(a) > key(b) : key(a) < key(b);
    return descending ? nanRank(a) > nanRank(b) : nanRank(a) < nanRank(b);
  });
  return order;
}

void sortAlong(const KernelCtx& c, int64_t k, bool descending, bool withValues) {
  const Tensor& x = c.inputs[0];
  int64_t d = normDim(c.attrs.getInt("dim"), x.dim(), c.op.name);
  DimSplit sp = splitAt(x.shape(), d);
  Vec v = load(x), vals(size_t(sp.outer * k * sp.inner)), ids(vals.size());
  std::vector<double> row(size_t(sp.n));
  for (int64_t o = 0; o < sp.outer; ++o)
    for (int64_t in = 0; in < sp.inner; ++in) {
      for (int64_t j = 0; j < sp.n; ++j) row[size_t(j)] = v[size_t((o * sp.n + j) * sp.inner + in)];
      auto order = sortedRow(row, descending);
      for (int64_t j = 0; j < k; ++j) {
        size_t at = size_t((o * k + j) * sp.inner + in);
        ids[at] = double(order[size_t(j)]);
        vals[at] = row[size_t(order[size_t(j)])];
      }
    }
  if (withValues) {
    store(c.outputs[0], vals);
    store(c.outputs[1], ids);
  } else {
    store(c.outputs[0], ids);
  }
}
void kTopk(const KernelCtx& c) {
  sortAlong(c, c.attrs.getInt("k"), c.attrs.getBool("largest", true), true);
}
void kArgsort(const KernelCtx& c) {
  const Tensor& x = c.inputs[0];
  sortAlong(c, x.size(c.attrs.getInt("dim")), c.attrs.getBool("descending", false), false);
}

void kWhere(const KernelCtx& c) {
  const Shape& s = c.outputs[0].shape();
  Vec m = loadAs(c.inputs[0], s), a = loadAs(c.inputs[1], s), b = loadAs(c.inputs[2], s);
  for (size_t i = 0; i < a.size(); ++i) a[i] = m[i] != 0.0 ? a[i] : b[i];
  store(c.outputs[0], a);
}
void kMaskedFill(const KernelCtx& c) {
  const Shape& s = c.outputs[0].shape();
  Vec x = load(c.inputs[0]), m = loadAs(c.inputs[1], s);
  double value = c.attrs.getDouble("value");
  for (size_t i = 0; i < x.size(); ++i)
    if (m[i] != 0.0) x[i] = value;
  store(c.outputs[0], x);
}

// ---------------------------------------------------------------- factories
void kFill(const KernelCtx& c) {
  store(c.outputs[0], Vec(size_t(c.outputs[0].numel()), c.attrs.getDouble("value")));
}
void kUniform(const KernelCtx& c) {
  double lo = c.attrs.getDouble("low"), hi = c.attrs.getDouble("high");
  uint64_t seed = uint64_t(c.attrs.getInt("seed")), off = uint64_t(c.attrs.getInt("offset"));
  Vec r(size_t(c.outputs[0].numel()));
  for (size_t i = 0; i < r.size(); ++i) r[i] = lo + (hi - lo) * double(philoxUniform(seed, off, i));
  store(c.outputs[0], r);
}
void kNormal(const KernelCtx& c) {
  double mean = c.attrs.getDouble("mean"), sd = c.attrs.getDouble("std");
  uint64_t seed = uint64_t(c.attrs.getInt("seed")), off = uint64_t(c.attrs.getInt("offset"));
  Vec r(size_t(c.outputs[0].numel()));
  for (size_t i = 0; i < r.size(); ++i) r[i] = mean + sd * philoxNormal(seed, off, i);
  store(c.outputs[0], r);
}
void kArange(const KernelCtx& c) {
  Vec r(size_t(c.outputs[0].numel()));
  std::iota(r.begin(), r.end(), 0.0);
  store(c.outputs[0], r);
}

// ---------------------------------------------------------------- optimizers
void kSgdStep(const KernelCtx& c) {
  Vec p = load(c.inputs[0]), g = load(c.inputs[1]), b = load(c.inputs[2]);
  double lr = c.attrs.getDouble("lr"), mom = c.attrs.getDouble("momentum");
  double wd = c.attrs.getDouble("weight_decay");
  bool nesterov = c.attrs.getBool("nesterov");
  for (size_t i = 0; i < p.size(); ++i) {
    double gi = g[i] + wd * p[i], step = gi;
    if (mom != 0.0) {
      b[i] = mom * b[i] + gi;
      step = nesterov ? gi + mom * b[i] : b[i];
    }
    p[i] -= lr * step;
  }
  store(c.inputs[0], p);
  if (mom != 0.0) store(c.inputs[2], b);
}
void kAdamwStep(const KernelCtx& c) {
  Vec p = load(c.inputs[0]), g = load(c.inputs[1]), m = load(c.inputs[2]), v = load(c.inputs[3]);
  double lr = c.attrs.getDouble("lr"), b1 = c.attrs.getDouble("beta1");
  double b2 = c.attrs.getDouble("beta2"), eps = c.attrs.getDouble("eps");
  double wd = c.attrs.getDouble("weight_decay");
  double t = double(c.attrs.getInt("step"));
  KEEL_CHECK(t >= 1, "op '", c.op.name, "': step must be >= 1");
  double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] -= lr * wd * p[i];
    m[i] = b1 * m[i] + (1.0 - b1) * g[i];
    v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
    p[i] -= lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps);
  }
  store(c.inputs[0], p);
  store(c.inputs[2], m);
  store(c.inputs[3], v);
}

constexpr DTypeMask kF = kFloatTypes, kFI = kFloatTypes | kIntTypes, kAll = kAllTypes;
constexpr DTypeMask kFIB = kFloatTypes | kIntTypes | dtypeBit(DType::Bool);

// Collectives: the shared implementation, reducing in rank order in float64 (Note [Reference
// all-reduce] in dist/collective_kernels.cpp).
void kAllReduce(const KernelCtx& c) {
  collectiveKernel(OpId::AllReduce, c, true);
}
void kCopyToGroup(const KernelCtx& c) {
  collectiveKernel(OpId::CopyToGroup, c, true);
}
void kAllGather(const KernelCtx& c) {
  collectiveKernel(OpId::AllGather, c, true);
}
void kReduceScatter(const KernelCtx& c) {
  collectiveKernel(OpId::ReduceScatter, c, true);
}
void kBroadcast(const KernelCtx& c) {
  collectiveKernel(OpId::Broadcast, c, true);
}
void kAllToAll(const KernelCtx& c) {
  collectiveKernel(OpId::AllToAll, c, true);
}

// One row per kernel, in op_ids.h order, with its variant (Note [Kernel variant vocabulary] in
// kernel_table.h; variant::k* are the strings the cpu backend shares). No run-time parameters.
constexpr KernelRow kTable[] = {
    {OpId::Add, kAdd, kFI, variant::kCorrectlyRounded},
    {OpId::Sub, kSub, kFI, variant::kCorrectlyRounded},
    {OpId::Mul, kMul, kFI, variant::kCorrectlyRounded},
    {OpId::Div, kDiv, kF, variant::kCorrectlyRounded},
    {OpId::Pow, kPow, kF, "libm pow in float64, rounded once"},
    {OpId::Maximum, kMaximum, kFI, variant::kSelect},
    {OpId::Minimum, kMinimum, kFI, variant::kSelect},
    {OpId::Eq, kEq, kFIB, variant::kCompare},
    {OpId::Lt, kLt, kFI, variant::kCompare},
    {OpId::Gt, kGt, kFI, variant::kCompare},
    {OpId::Neg, kNeg, kFI, variant::kExactElementwise},
    {OpId::Exp, kExp, kF, "libm exp in float64, rounded once"},
    {OpId::Log, kLog, kF, "libm log in float64, rounded once"},
    {OpId::Sqrt, kSqrt, kF, variant::kCorrectlyRounded},
    {OpId::Rsqrt, kRsqrt, kF, "1/sqrt in float64, rounded once"},
    {OpId::Tanh, kTanh, kF, "libm tanh in float64, rounded once"},
    {OpId::Sigmoid, kSigmoid, kF, "1/(1+exp(-x)), libm in float64, rounded once"},
    {OpId::Relu, kRelu, kFI, variant::kSelect},
    {OpId::Gelu, kGelu, kF, "libm erf in float64, rounded once"},
    {OpId::Silu, kSilu, kF, "x*sigmoid(x), libm in float64, rounded once"},
    {OpId::Abs, kAbs, kFI, variant::kExactElementwise},
    {OpId::GeluBackward, kGeluBackward, kF, "libm erf and exp in float64, rounded once"},
    {OpId::SiluBackward, kSiluBackward, kF, "libm exp in float64, rounded once"},
    {OpId::AddScalar, kAddScalar, kFI, variant::kFloat64Once},
    {OpId::MulScalar, kMulScalar, kFI, variant::kFloat64Once},
    {OpId::PowScalar, kPowScalar, kF, "libm pow in float64, rounded once"},
    {OpId::Sum, kSum, kFI, "float64, sequential"},
    {OpId::Mean, kMean, kF, "float64, sequential, / n"},
    {OpId::Max, kMax, kFI, variant::kFirstMax},
    {OpId::Argmax, kArgmax, kFI, variant::kFirstMax},
    {OpId::Matmul, kMatmul, kF, "naive, float64 accumulation, k in order"},
    {OpId::Softmax, kSoftmax, kF, "libm exp in float64, sequential sum, divided, rounded once"},
    {OpId::SoftmaxBackward, kSoftmaxBackward, kF, "float64, sequential dot, rounded once"},
    {OpId::LogSoftmax, kLogSoftmax, kF,
     "libm exp and log in float64, sequential sum, rounded once"},
    {OpId::LogSoftmaxBackward, kLogSoftmaxBackward, kF,
     "libm exp in float64, sequential sum, rounded once"},
    {OpId::LayerNorm, kLayerNorm, kF, "float64, sequential mean and variance, rounded once"},
    {OpId::LayerNormBackward, kLayerNormBackward, kF, "float64, sequential, rounded once"},
    {OpId::RmsNorm, kRmsNorm, kF, "float64, sequential mean square, rounded once"},
    {OpId::RmsNormBackward, kRmsNormBackward, kF, "float64, sequential, rounded once"},
    {OpId::Embedding, kEmbedding, kF, variant::kGather},
    {OpId::EmbeddingBackward, kEmbeddingBackward, kF, variant::kIndexOrderSum},
    {OpId::CrossEntropy, kCrossEntropy, kF,
     "libm exp and log in float64, sequential, rounded once"},
    {OpId::CrossEntropyBackward, kCrossEntropyBackward, kF,
     "libm exp and log in float64, sequential, rounded once"},
    {OpId::Dropout, kDropout, kF, variant::kDropout},
    {OpId::Rope, kRope, kF, "float64, rounded once"},
    {OpId::FlashmaskAttention, kFlashmaskAttention, kF,
     "dense masked softmax in float64, sequential, rounded once"},
    {OpId::FlashmaskAttentionBackward, kFlashmaskAttentionBackward, kF,
     "dense recompute in float64, sequential, rounded once"},
    {OpId::SliceBackward, kSliceBackward, kAll, variant::kCopy},
    {OpId::Concat, kConcat, kAll, variant::kCopy},
    {OpId::Contiguous, kCopy, kAll, variant::kCopy},
    {OpId::CopyTo, kCopy, kAll, variant::kCopy},
    {OpId::IndexSelect, kIndexSelect, kAll, variant::kGather},
    {OpId::IndexAdd, kIndexAdd, kFI, "float64 accumulation in index order, rounded once"},
    {OpId::Gather, kGather, kAll, variant::kGather},
    {OpId::ScatterAdd, kScatterAdd, kFI, "float64 accumulation in index order, rounded once"},
    {OpId::Topk, kTopk, kFI, variant::kStableSort},
    {OpId::Argsort, kArgsort, kFI, variant::kStableSort},
    {OpId::Where, kWhere, kAll, variant::kSelect},
    {OpId::MaskedFill, kMaskedFill, kAll, variant::kSelect},
    {OpId::Cast, kCopy, kAll, variant::kCast},
    {OpId::Fill, kFill, kAll, variant::kFill},
    {OpId::Uniform, kUniform, kF, variant::kUniform},
    {OpId::Normal, kNormal, kF, variant::kNormal},
    {OpId::Arange, kArange, kFI, variant::kArange},
    {OpId::SgdStep, kSgdStep, kF, "float64, rounded once"},
    {OpId::AdamwStep, kAdamwStep, kF, "float64, rounded once"},
    {OpId::AllReduce, kAllReduce, kAll, variant::kRankOrderReduce},
    {OpId::CopyToGroup, kCopyToGroup, kAll, variant::kCopy},
    {OpId::AllGather, kAllGather, kAll, variant::kGatherRanks},
    {OpId::ReduceScatter, kReduceScatter, kAll, variant::kRankOrderReduce},
    {OpId::Broadcast, kBroadcast, kAll, variant::kBroadcast},
    {OpId::AllToAll, kAllToAll, kAll, variant::kAllToAll},
};
static_assert(KernelTableCovers<firstBadRow(kTable)>::ok);

}  // namespace

void registerCpuRefKernels(Registry& r) {
  registerKernelTable(r, Backend::CpuRef, kTable);
}

}  // namespace keel::detail
