// Elementwise kernels of the cpu backend: broadcasting binary ops, unary and scalar ops, where,
// masked_fill, cast, dropout and the factories. Each output element is computed independently
// (so any partition gives the same bits); 16-bit floats compute in float and round on store.
#include "cpu_util.h"
#include "keel/random.h"
#include "kernels.h"

#if defined(__SSE4_1__)
#include <immintrin.h>
#endif

namespace keel::cpu {
namespace {

// No contiguous fast path: the maps below then use their element loops everywhere.
struct NoArray {};

// out[i] = f(a[i], b[i]) over out's shape, a and b broadcast to it. `arr(o, x, y, n)`, when
// given, handles runs where both inputs are contiguous.
template <typename A, typename B, typename R, typename F, typename Arr = NoArray>
void binaryMap(const Tensor& a, const Tensor& b, const Tensor& out, int64_t grain, F f,
               Arr arr = {}) {
  const Shape& s = out.shape();
  Layout<3> l = makeLayout<3>(s, {out.strides(), broadcastStrides(a, s), broadcastStrides(b, s)});
  R* po = out.data<R>();
  const A* pa = a.data<A>();
  const B* pb = b.data<B>();
  const int64_t sa = l.innerStride(1), sb = l.innerStride(2);
  parallelLayout(l, grain, [&](const std::array<int64_t, 3>& off, int64_t n) {
    R* o = po + off[0];
    const A* x = pa + off[1];
    const B* y = pb + off[2];
    if (sa == 1 && sb == 1) {
      if constexpr (std::is_same_v<Arr, NoArray>) {
        for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
      } else {
        arr(o, x, y, n);
      }
    } else if (sa == 1 && sb == 0) {
      const B yv = y[0];
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], yv);
    } else if (sa == 0 && sb == 1) {
      const A xv = x[0];
      for (int64_t i = 0; i < n; ++i) o[i] = f(xv, y[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i * sa], y[i * sb]);
    }
  });
}

// out[i] = f(x[i]) over out's shape (x has the same shape, any layout); `arr(o, in, n)`, when
// given, handles contiguous runs.
template <typename X, typename R, typename F, typename Arr = NoArray>
void unaryMap(const Tensor& x, const Tensor& out, int64_t grain, F f, Arr arr = {}) {
  Layout<2> l = makeLayout<2>(out.shape(), {out.strides(), x.strides()});
  R* po = out.data<R>();
  const X* px = x.data<X>();
  const int64_t sx = l.innerStride(1);
  parallelLayout(l, grain, [&](const std::array<int64_t, 2>& off, int64_t n) {
    R* o = po + off[0];
    const X* in = px + off[1];
    if (sx == 1) {
      if constexpr (std::is_same_v<Arr, NoArray>) {
        for (int64_t i = 0; i < n; ++i) o[i] = f(in[i]);
      } else {
        arr(o, in, n);
      }
    } else {
      for (int64_t i = 0; i < n; ++i) o[i] = f(in[i * sx]);
    }
  });
}

// ---------------------------------------------------------------- binary arithmetic
// Each op: `ok<T>` (dtypes it is instantiated for) and apply on the compute type.
struct AddOp {
  template <typename T>
  static constexpr bool ok = kIsFloat<T> || kIsInt<T>;
  template <typename C>
  static C apply(C a, C b) {
    if constexpr (std::is_integral_v<C>)
      return wrapAdd(a, b);
    else
      return a + b;
  }
};
struct SubOp {
  template <typename T>
  static constexpr bool ok = kIsFloat<T> || kIsInt<T>;
  template <typename C>
  static C apply(C a, C b) {
    if constexpr (std::is_integral_v<C>)
      return wrapSub(a, b);
    else
      return a - b;
  }
};
struct MulOp {
  template <typename T>
  static constexpr bool ok = kIsFloat<T> || kIsInt<T>;
  template <typename C>
  static C apply(C a, C b) {
    if constexpr (std::is_integral_v<C>)
      return wrapMul(a, b);
    else
      return a * b;
  }
};
struct DivOp {
  template <typename T>
  static constexpr bool ok = kIsFloat<T>;
  template <typename C>
  static C apply(C a, C b) {
    return a / b;
  }
};
struct PowOp {
  template <typename T>
  static constexpr bool ok = kIsFloat<T>;
  template <typename C>
  static C apply(C a, C b) {
    return std::pow(a, b);
  }
};
// NaN in either operand wins; ties keep a (as the reference does).
struct MaximumOp {
  template <typename T>
  static constexpr bool ok = kIsFloat<T> || kIsInt<T>;
  template <typename C>
  static C apply(C a, C b) {
    if constexpr (std::is_integral_v<C>)
      return a >= b ? a : b;
    else
      return (a != a || a >= b) ? a : b;
  }
};
struct MinimumOp {
  template <typename T>
  static constexpr bool ok = kIsFloat<T> || kIsInt<T>;
  template <typename C>
  static C apply(C a, C b) {
    if constexpr (std::is_integral_v<C>)
      return a <= b ? a : b;
    else
      return (a != a || a <= b) ? a : b;
  }
};

template <typename Op>
void arith(const KernelCtx& c) {
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  visitDType(a.dtype(), [&]<typename T>() {
    if constexpr (Op::template ok<T>) {
      binaryMap<T, T, T>(a, b, c.outputs[0], kGrain,
                         [](T x, T y) { return store<T>(Op::apply(load(x), load(y))); });
    } else {
      unsupported(c, a.dtype());
    }
  });
}

enum class Cmp { Eq, Lt, Gt };
template <Cmp kOp>
void compare(const KernelCtx& c) {
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  visitDType(a.dtype(), [&]<typename T>() {
    binaryMap<T, T, bool>(a, b, c.outputs[0], kGrain, [](T x, T y) {
      if constexpr (kOp == Cmp::Eq)
        return load(x) == load(y);
      else if constexpr (kOp == Cmp::Lt)
        return load(x) < load(y);
      else
        return load(x) > load(y);
    });
  });
}

// ---------------------------------------------------------------- unary
// `fl` computes in float (vectorizable approximations), `db` in double (the reference's formula).
// Contiguous float32 runs go through floatUnaryArray(kArray), which applies the same math.
template <typename T, typename FF, typename FD>
void floatUnary(const KernelCtx& c, int64_t grain, const FloatUnary* array, FF fl, FD db) {
  if constexpr (std::is_same_v<T, double>) {
    unaryMap<T, T>(c.inputs[0], c.outputs[0], grain, [&](double x) { return db(x); });
  } else if constexpr (std::is_same_v<T, float>) {
    auto elem = [&](float x) { return fl(x); };
    if (array) {
      const FloatUnary op = *array;
      unaryMap<T, T>(c.inputs[0], c.outputs[0], grain, elem,
                     [op](float* o, const float* in, int64_t n) { floatUnaryArray(op, in, o, n); });
    } else {
      unaryMap<T, T>(c.inputs[0], c.outputs[0], grain, elem);
    }
  } else {
    unaryMap<T, T>(c.inputs[0], c.outputs[0], grain, [&](T x) { return store<T>(fl(load(x))); });
  }
}

template <typename FF, typename FD>
void floatUnaryKernel(const KernelCtx& c, int64_t grain, const FloatUnary* array, FF fl, FD db) {
  visitFloatInput(c, [&]<typename T>() { floatUnary<T>(c, grain, array, fl, db); });
}

double sigmoidD(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// sqrt / rsqrt: contiguous float32 and float64 go through the SSE array helper.
void sqrtKernel(const KernelCtx& c, bool reciprocal) {
  const Tensor &x = c.inputs[0], &out = c.outputs[0];
  visitDType(x.dtype(), [&]<typename T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      if (x.isContiguous()) {
        const T* in = x.data<T>();
        T* o = out.data<T>();
        parallelFor(x.numel(), kGrain, [&](int64_t b, int64_t e) {
          sqrtArray(in + b, o + b, e - b);
          if (reciprocal)
            for (int64_t i = b; i < e; ++i) o[i] = T(1) / o[i];
        });
        return;
      }
    }
    if constexpr (kIsFloat<T>) {
      using C = CompT<T>;
      unaryMap<T, T>(x, out, kGrain, [&](T v) {
        C r = std::sqrt(load(v));
        return store<T>(reciprocal ? C(1) / r : r);
      });
    } else {
      unsupported(c, x.dtype());
    }
  });
}

// ---------------------------------------------------------------- scalar attribute helpers
double scalarAttr(const KernelCtx& c, const char* name) {
  double s = c.attrs.getDouble(name);
  return isFloating(c.inputs[0].dtype()) ? s : std::trunc(s);
}

}  // namespace

void kAdd(const KernelCtx& c) {
  arith<AddOp>(c);
}
void kSub(const KernelCtx& c) {
  arith<SubOp>(c);
}
void kMul(const KernelCtx& c) {
  arith<MulOp>(c);
}
void kDiv(const KernelCtx& c) {
  arith<DivOp>(c);
}
void kPow(const KernelCtx& c) {
  arith<PowOp>(c);
}
void kMaximum(const KernelCtx& c) {
  arith<MaximumOp>(c);
}
void kMinimum(const KernelCtx& c) {
  arith<MinimumOp>(c);
}
void kEq(const KernelCtx& c) {
  compare<Cmp::Eq>(c);
}
void kLt(const KernelCtx& c) {
  compare<Cmp::Lt>(c);
}
void kGt(const KernelCtx& c) {
  compare<Cmp::Gt>(c);
}

void kNeg(const KernelCtx& c) {
  visitDType(c.inputs[0].dtype(), [&]<typename T>() {
    if constexpr (kIsInt<T>) {
      unaryMap<T, T>(c.inputs[0], c.outputs[0], kGrain, [](T x) { return wrapSub(T(0), x); });
    } else if constexpr (kIsFloat<T>) {
      unaryMap<T, T>(c.inputs[0], c.outputs[0], kGrain, [](T x) { return store<T>(-load(x)); });
    } else {
      unsupported(c, c.inputs[0].dtype());
    }
  });
}

void kAbs(const KernelCtx& c) {
  visitDType(c.inputs[0].dtype(), [&]<typename T>() {
    if constexpr (kIsInt<T>) {
      unaryMap<T, T>(c.inputs[0], c.outputs[0], kGrain,
                     [](T x) { return x < 0 ? wrapSub(T(0), x) : x; });
    } else if constexpr (kIsFloat<T>) {
      unaryMap<T, T>(c.inputs[0], c.outputs[0], kGrain,
                     [](T x) { return store<T>(std::abs(load(x))); });
    } else {
      unsupported(c, c.inputs[0].dtype());
    }
  });
}

// relu(NaN) = 0, as the reference's x > 0 ? x : 0.
void kRelu(const KernelCtx& c) {
  visitDType(c.inputs[0].dtype(), [&]<typename T>() {
    if constexpr (kIsInt<T> || kIsFloat<T>) {
      using C = CompT<T>;
      unaryMap<T, T>(c.inputs[0], c.outputs[0], kGrain, [](T x) {
        C v = load(x);
        return store<T>(v > C(0) ? v : C(0));
      });
    } else {
      unsupported(c, c.inputs[0].dtype());
    }
  });
}

constexpr FloatUnary kExpOp = FloatUnary::Exp, kTanhOp = FloatUnary::Tanh,
                     kSigmoidOp = FloatUnary::Sigmoid, kGeluOp = FloatUnary::Gelu,
                     kSiluOp = FloatUnary::Silu;

void kExp(const KernelCtx& c) {
  floatUnaryKernel(
      c, kGrainHeavy, &kExpOp, [](float x) { return math::expF(x); },
      [](double x) { return std::exp(x); });
}
void kLog(const KernelCtx& c) {
  floatUnaryKernel(
      c, kGrainHeavy, nullptr, [](float x) { return std::log(x); },
      [](double x) { return std::log(x); });
}
void kSqrt(const KernelCtx& c) {
  sqrtKernel(c, false);
}
void kRsqrt(const KernelCtx& c) {
  sqrtKernel(c, true);
}
void kTanh(const KernelCtx& c) {
  floatUnaryKernel(
      c, kGrainHeavy, &kTanhOp, [](float x) { return math::tanhF(x); },
      [](double x) { return std::tanh(x); });
}
void kSigmoid(const KernelCtx& c) {
  floatUnaryKernel(
      c, kGrainHeavy, &kSigmoidOp, [](float x) { return math::sigmoidF(x); }, sigmoidD);
}
void kGelu(const KernelCtx& c) {
  floatUnaryKernel(
      c, kGrainHeavy, &kGeluOp, [](float x) { return math::geluF(x); },
      [](double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); });
}
void kSilu(const KernelCtx& c) {
  floatUnaryKernel(
      c, kGrainHeavy, &kSiluOp, [](float x) { return math::siluF(x); },
      [](double x) { return x * sigmoidD(x); });
}

// (grad, x) -> grad * op'(x); float32 contiguous runs use floatGradArray (same math).
template <typename FD>
void gradKernel(const KernelCtx& c, FloatGrad op, float (*fl)(float), FD db) {
  visitDType(c.inputs[0].dtype(), [&]<typename T>() {
    if constexpr (std::is_same_v<T, double>) {
      binaryMap<T, T, T>(c.inputs[0], c.inputs[1], c.outputs[0], kGrainHeavy, db);
    } else if constexpr (std::is_same_v<T, float>) {
      binaryMap<T, T, T>(
          c.inputs[0], c.inputs[1], c.outputs[0], kGrainHeavy,
          [fl](float g, float x) { return g * fl(x); },
          [op](float* o, const float* g, const float* x, int64_t n) {
            floatGradArray(op, g, x, o, n);
          });
    } else if constexpr (kIsFloat<T>) {
      binaryMap<T, T, T>(c.inputs[0], c.inputs[1], c.outputs[0], kGrainHeavy,
                         [fl](T g, T x) { return store<T>(load(g) * fl(load(x))); });
    } else {
      unsupported(c, c.inputs[0].dtype());
    }
  });
}

void kGeluBackward(const KernelCtx& c) {
  gradKernel(c, FloatGrad::Gelu, math::geluGradF, [](double g, double x) {
    double cdf = 0.5 * (1.0 + std::erf(x / std::sqrt(2.0)));
    double pdf = std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
    return g * (cdf + x * pdf);
  });
}

void kSiluBackward(const KernelCtx& c) {
  gradKernel(c, FloatGrad::Silu, math::siluGradF, [](double g, double x) {
    double s = sigmoidD(x);
    return g * s * (1.0 + x * (1.0 - s));
  });
}

// Scalar ops on floats go through double (one rounding, as the reference); integers use the
// scalar truncated toward zero.
void kAddScalar(const KernelCtx& c) {
  const double s = scalarAttr(c, "scalar");
  visitDType(c.inputs[0].dtype(), [&]<typename T>() {
    if constexpr (kIsFloat<T>) {
      unaryMap<T, T>(c.inputs[0], c.outputs[0], kGrain,
                     [s](T x) { return fromDouble<T>(double(load(x)) + s); });
    } else if constexpr (kIsInt<T>) {
      const T si = T(fromDouble<int64_t>(s));
      unaryMap<T, T>(c.inputs[0], c.outputs[0], kGrain, [si](T x) { return wrapAdd(x, si); });
    } else {
      unsupported(c, c.inputs[0].dtype());
    }
  });
}

void kMulScalar(const KernelCtx& c) {
  const double s = scalarAttr(c, "scalar");
  visitDType(c.inputs[0].dtype(), [&]<typename T>() {
    if constexpr (kIsFloat<T>) {
      unaryMap<T, T>(c.inputs[0], c.outputs[0], kGrain,
                     [s](T x) { return fromDouble<T>(double(load(x)) * s); });
    } else if constexpr (kIsInt<T>) {
      const T si = T(fromDouble<int64_t>(s));
      unaryMap<T, T>(c.inputs[0], c.outputs[0], kGrain, [si](T x) { return wrapMul(x, si); });
    } else {
      unsupported(c, c.inputs[0].dtype());
    }
  });
}

void kPowScalar(const KernelCtx& c) {
  const double e = c.attrs.getDouble("exponent");
  visitDType(c.inputs[0].dtype(), [&]<typename T>() {
    if constexpr (kIsFloat<T>) {
      auto run = [&](auto f) {
        unaryMap<T, T>(c.inputs[0], c.outputs[0], kGrain,
                       [f](T x) { return fromDouble<T>(f(double(load(x)))); });
      };
      if (e == 1.0)
        run([](double x) { return x; });
      else if (e == 2.0)
        run([](double x) { return x * x; });
      else if (e == 3.0)
        run([](double x) { return x * x * x; });
      else if (e == 0.5)
        run([](double x) { return std::sqrt(x); });
      else if (e == -1.0)
        run([](double x) { return 1.0 / x; });
      else if (e == 0.0)
        run([](double) { return 1.0; });
      else
        run([e](double x) { return std::pow(x, e); });
    } else {
      unsupported(c, c.inputs[0].dtype());
    }
  });
}

// ---------------------------------------------------------------- where, masked_fill, cast
void kWhere(const KernelCtx& c) {
  const Tensor &cond = c.inputs[0], &a = c.inputs[1], &b = c.inputs[2], &out = c.outputs[0];
  KEEL_CHECK(cond.dtype() == DType::Bool, "op '", c.op.name, "': condition must be bool");
  const Shape& s = out.shape();
  Layout<4> l = makeLayout<4>(s, {out.strides(), broadcastStrides(cond, s), broadcastStrides(a, s),
                                  broadcastStrides(b, s)});
  const int64_t sc = l.innerStride(1), sa = l.innerStride(2), sb = l.innerStride(3);
  visitDType(a.dtype(), [&]<typename T>() {
    T* po = out.data<T>();
    const bool* pc = cond.data<bool>();
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    parallelLayout(l, kGrain, [&](const std::array<int64_t, 4>& off, int64_t n) {
      T* o = po + off[0];
      const bool* m = pc + off[1];
      const T* x = pa + off[2];
      const T* y = pb + off[3];
      if (sc == 1 && sa == 1 && sb == 1) {
        for (int64_t i = 0; i < n; ++i) o[i] = m[i] ? x[i] : y[i];
      } else {
        for (int64_t i = 0; i < n; ++i) o[i] = m[i * sc] ? x[i * sa] : y[i * sb];
      }
    });
  });
}

void kMaskedFill(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &mask = c.inputs[1];
  KEEL_CHECK(mask.dtype() == DType::Bool, "op '", c.op.name, "': mask must be bool");
  const double value = c.attrs.getDouble("value");
  visitDType(x.dtype(), [&]<typename T>() {
    const T v = fromDouble<T>(value);
    binaryMap<T, bool, T>(x, mask, c.outputs[0], kGrain, [v](T xv, bool m) { return m ? v : xv; });
  });
}

// One element converted as the reference converts through double: 16-bit floats via float,
// float -> int truncated and saturated (NaN -> 0), -> bool as x != 0.
template <typename D, typename S>
inline D convertValue(S s) {
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else if constexpr (std::is_same_v<D, bool>) {
    return load(s) != CompT<S>(0);
  } else if constexpr (std::is_same_v<D, double>) {
    return double(load(s));
  } else if constexpr (kIsFloat<D>) {  // float32 / float16 / bfloat16
    if constexpr (kIsFloat<S>)
      return store<D>(float(load(s)));
    else
      return store<D>(float(double(s)));
  } else if constexpr (kIsFloat<S>) {
    return fromDouble<D>(double(load(s)));
  } else {  // integer or bool -> integer, saturating
    using W = int64_t;
    W v = W(s);
    if constexpr (sizeof(D) < sizeof(W)) {
      v = std::min<W>(std::max<W>(v, std::numeric_limits<D>::min()), std::numeric_limits<D>::max());
    }
    return D(v);
  }
}

void kCast(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &out = c.outputs[0];
  if (x.dtype() == out.dtype()) {
    copyToContiguous(x, out.data());
    return;
  }
  visitDType(x.dtype(), [&]<typename S>() {
    visitDType(out.dtype(), [&]<typename D>() {
      unaryMap<S, D>(x, out, kGrain, [](S v) { return convertValue<D>(v); });
    });
  });
}

// ---------------------------------------------------------------- random and factories

// Philox4x32-10 as in core/random.cpp, four counters at a time (only word 0 is used by
// philoxUniform). The 32x32->64 products come from pmuludq on even and odd lanes.
void philoxUniformBlock(uint64_t seed, uint64_t offset, uint64_t first, int64_t n, float* out) {
  int64_t j = 0;
#if defined(__SSE4_1__)
  const __m128i m0 = _mm_set1_epi32(int(0xD2511F53u)), m1 = _mm_set1_epi32(int(0xCD9E8D57u));
  const __m128 scale = _mm_set1_ps(1.0f / 16777216.0f);
  for (; j + 4 <= n; j += 4) {
    alignas(16) uint32_t lo[4], hi[4];
    for (int l = 0; l < 4; ++l) {
      const uint64_t c = offset + first + uint64_t(j + l);
      lo[l] = uint32_t(c);
      hi[l] = uint32_t(c >> 32);
    }
    __m128i c0 = _mm_load_si128(reinterpret_cast<const __m128i*>(lo));
    __m128i c1 = _mm_load_si128(reinterpret_cast<const __m128i*>(hi));
    __m128i c2 = _mm_set1_epi32(0x4b45454c), c3 = _mm_setzero_si128();
    uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
    for (int r = 0; r < 10; ++r) {
      const __m128i e0 = _mm_mul_epu32(c0, m0), o0 = _mm_mul_epu32(_mm_srli_epi64(c0, 32), m0);
      const __m128i e1 = _mm_mul_epu32(c2, m1), o1 = _mm_mul_epu32(_mm_srli_epi64(c2, 32), m1);
      const __m128i hi0 = _mm_blend_epi16(_mm_srli_epi64(e0, 32), o0, 0xCC);
      const __m128i lo0 = _mm_blend_epi16(e0, _mm_slli_epi64(o0, 32), 0xCC);
      const __m128i hi1 = _mm_blend_epi16(_mm_srli_epi64(e1, 32), o1, 0xCC);
      const __m128i lo1 = _mm_blend_epi16(e1, _mm_slli_epi64(o1, 32), 0xCC);
      c0 = _mm_xor_si128(_mm_xor_si128(hi1, c1), _mm_set1_epi32(int(k0)));
      c2 = _mm_xor_si128(_mm_xor_si128(hi0, c3), _mm_set1_epi32(int(k1)));
      c1 = lo1;
      c3 = lo0;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    _mm_storeu_ps(out + j, _mm_mul_ps(_mm_cvtepi32_ps(_mm_srli_epi32(c0, 8)), scale));
  }
#endif
  for (; j < n; ++j) out[j] = philoxUniform(seed, offset, first + uint64_t(j));
}

void kDropout(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &out = c.outputs[0];
  const double p = c.attrs.getDouble("p");
  const uint64_t seed = uint64_t(c.attrs.getInt("seed"));
  const uint64_t offset = uint64_t(c.attrs.getInt("offset"));
  const double keepScale = 1.0 - p;
  Layout<2> l = makeLayout<2>(out.shape(), {out.strides(), x.strides()});
  const int64_t sx = l.innerStride(1);
  visitDType(x.dtype(), [&]<typename T>() {
    if constexpr (kIsFloat<T>) {
      T* po = out.data<T>();
      const T* px = x.data<T>();
      parallelLayout(l, kGrainHeavy, [&](const std::array<int64_t, 2>& off, int64_t n) {
        // out is contiguous: its offset is the row-major element index.
        float u[256];
        for (int64_t s = 0; s < n; s += 256) {
          const int64_t w = std::min<int64_t>(256, n - s);
          philoxUniformBlock(seed, offset, uint64_t(off[0] + s), w, u);
          T* o = po + off[0] + s;
          const T* in = px + off[1] + s * sx;
          for (int64_t i = 0; i < w; ++i)
            o[i] = double(u[i]) >= p ? fromDouble<T>(double(CompT<T>(in[i * sx])) / keepScale)
                                     : T(0.0f);
        }
      });
    } else {
      unsupported(c, x.dtype());
    }
  });
}

// Writes f(i) (a double) for every element index i of the contiguous output.
template <typename F>
void generate(const KernelCtx& c, int64_t grain, bool floatOnly, F f) {
  const Tensor& out = c.outputs[0];
  visitDType(out.dtype(), [&]<typename T>() {
    if (floatOnly && !kIsFloat<T>) unsupported(c, out.dtype());
    T* o = out.data<T>();
    parallelFor(out.numel(), grain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = fromDouble<T>(f(i));
    });
  });
}

void kFill(const KernelCtx& c) {
  const Tensor& out = c.outputs[0];
  const double value = c.attrs.getDouble("value");
  visitDType(out.dtype(), [&]<typename T>() {
    const T v = fromDouble<T>(value);
    T* o = out.data<T>();
    parallelFor(out.numel(), kGrain, [&](int64_t b, int64_t e) { std::fill(o + b, o + e, v); });
  });
}

void kUniform(const KernelCtx& c) {
  const Tensor& out = c.outputs[0];
  const double lo = c.attrs.getDouble("low"), hi = c.attrs.getDouble("high");
  const uint64_t seed = uint64_t(c.attrs.getInt("seed"));
  const uint64_t offset = uint64_t(c.attrs.getInt("offset"));
  visitDType(out.dtype(), [&]<typename T>() {
    if constexpr (kIsFloat<T>) {
      T* o = out.data<T>();
      parallelFor(out.numel(), kGrainHeavy, [&](int64_t b, int64_t e) {
        float u[256];
        for (int64_t s = b; s < e; s += 256) {
          const int64_t w = std::min<int64_t>(256, e - s);
          philoxUniformBlock(seed, offset, uint64_t(s), w, u);
          for (int64_t i = 0; i < w; ++i) o[s + i] = fromDouble<T>(lo + (hi - lo) * double(u[i]));
        }
      });
    } else {
      unsupported(c, out.dtype());
    }
  });
}

void kNormal(const KernelCtx& c) {
  const double mean = c.attrs.getDouble("mean"), sd = c.attrs.getDouble("std");
  const uint64_t seed = uint64_t(c.attrs.getInt("seed"));
  const uint64_t offset = uint64_t(c.attrs.getInt("offset"));
  generate(c, kGrainHeavy, true,
           [&](int64_t i) { return mean + sd * philoxNormal(seed, offset, uint64_t(i)); });
}

void kArange(const KernelCtx& c) {
  generate(c, kGrain, false, [](int64_t i) { return double(i); });
}

}  // namespace keel::cpu
