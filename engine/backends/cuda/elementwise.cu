// Elementwise kernels of the cuda backend: broadcasting binary ops and comparisons, unary ops and
// their fused gelu/silu backward, the ops with a scalar attribute, where and masked_fill. Every
// output element is computed by one thread from its own inputs, so the bits never depend on the
// launch; numerics follow the cpu backend (Note [cuda elementwise numerics]).
#include <cmath>

#include "cuda_util.cuh"
#include "kernel_util.h"
#include "kernels.h"

namespace keel::cuda {
namespace {

// Note [cuda elementwise numerics]: as the optimized cpu backend (backends/cpu/elementwise.cpp).
// Floats compute in Compute<T> (float for float32 and the 16-bit floats, double for float64) and
// round once on store; integer add, sub, mul, neg and abs wrap in the element type (two's
// complement, no UB: through the unsigned type); maximum/minimum keep a NaN in either operand and
// a on ties; relu(NaN) and relu(-0) are +0; abs clears the sign (NaN included). Scalar ops go
// through double (integers: the scalar truncated toward zero, then wrapping in the element type).
// The float32 transcendental functions are CUDA's (expf, logf, tanhf, erfcf, powf) where the cpu
// has its own polynomials: a few ulp apart, within the parity tolerance. IEEE operations (+ - * /
// sqrt) are correctly rounded on both; nvcc may fuse a multiply and an add in the formulas with
// transcendentals (within tolerance), never in the exact ops.

// ---------------------------------------------------------------- grid-stride maps
// out[i] = f(a[ga.offset(i)], b[gb.offset(i)]) over the output's n elements (row-major).
// kContig: both inputs are contiguous at the output's shape (offset(i) == i).
template <bool kContig, typename R, typename A, typename B, typename F>
__global__ void binaryKernel(R* __restrict__ out, const A* __restrict__ a, Geom ga,
                             const B* __restrict__ b, Geom gb, int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (kContig)
      out[i] = f(a[i], b[i]);
    else
      out[i] = f(a[ga.offset(i)], b[gb.offset(i)]);
  }
}

template <bool kContig, typename R, typename X, typename F>
__global__ void unaryKernel(R* __restrict__ out, const X* __restrict__ x, Geom gx, int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (kContig)
      out[i] = f(x[i]);
    else
      out[i] = f(x[gx.offset(i)]);
  }
}

// Launches binaryKernel over c.outputs[0] (contiguous), inputs a and b seen at its shape.
template <typename R, typename A, typename B, typename F>
void binaryMap(const KernelCtx& c, const Tensor& a, const Tensor& b, F f) {
  const Tensor& out = c.outputs[0];
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceCtx& d = deviceCtx(c);
  const Geom ga = geomAs(a, out.shape()), gb = geomAs(b, out.shape());
  const Launch1D l = launch1D(n);
  if (ga.contiguous && gb.contiguous)
    launch(binaryKernel<true, R, A, B, F>, l.blocks, l.threads, 0, d.stream, ptr<R>(out),
           ptr<const A>(a), ga, ptr<const B>(b), gb, n, f);
  else
    launch(binaryKernel<false, R, A, B, F>, l.blocks, l.threads, 0, d.stream, ptr<R>(out),
           ptr<const A>(a), ga, ptr<const B>(b), gb, n, f);
  checkLaunch(c, "binaryKernel");
}

// Launches unaryKernel over c.outputs[0], input x (same shape, any layout).
template <typename R, typename X, typename F>
void unaryMap(const KernelCtx& c, const Tensor& x, F f) {
  const Tensor& out = c.outputs[0];
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceCtx& d = deviceCtx(c);
  const Geom gx = geomAs(x, out.shape());
  const Launch1D l = launch1D(n);
  if (gx.contiguous)
    launch(unaryKernel<true, R, X, F>, l.blocks, l.threads, 0, d.stream, ptr<R>(out),
           ptr<const X>(x), gx, n, f);
  else
    launch(unaryKernel<false, R, X, F>, l.blocks, l.threads, 0, d.stream, ptr<R>(out),
           ptr<const X>(x), gx, n, f);
  checkLaunch(c, "unaryKernel");
}

template <typename T>
inline constexpr bool kIsIntD = std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>;

[[noreturn]] void unsupported(const KernelCtx& c, DType t) {
  throw Error(detail::concat("op '", c.op.name, "': no cuda kernel for dtype ", dtypeName(t)));
}

// Two's-complement wrapping integer arithmetic (no signed overflow).
template <typename T>
__device__ __forceinline__ T wrapAdd(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return T(U(a) + U(b));
}
template <typename T>
__device__ __forceinline__ T wrapSub(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return T(U(a) - U(b));
}
template <typename T>
__device__ __forceinline__ T wrapMul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return T(U(a) * U(b));
}

// ---------------------------------------------------------------- binary arithmetic
// Each op: apply(a, b) on the compute type (floats) or on the element type itself (integers).
struct AddOp {
  template <typename C>
  __device__ static C apply(C a, C b) {
    if constexpr (std::is_integral_v<C>)
      return wrapAdd(a, b);
    else
      return a + b;
  }
};
struct SubOp {
  template <typename C>
  __device__ static C apply(C a, C b) {
    if constexpr (std::is_integral_v<C>)
      return wrapSub(a, b);
    else
      return a - b;
  }
};
struct MulOp {
  template <typename C>
  __device__ static C apply(C a, C b) {
    if constexpr (std::is_integral_v<C>)
      return wrapMul(a, b);
    else
      return a * b;
  }
};
struct DivOp {
  template <typename C>
  __device__ static C apply(C a, C b) {
    return a / b;
  }
};
struct PowOp {
  template <typename C>
  __device__ static C apply(C a, C b) {
    if constexpr (std::is_same_v<C, float>)
      return powf(a, b);
    else
      return pow(a, b);
  }
};
// NaN in either operand wins (a's when a is NaN); ties keep a.
struct MaximumOp {
  template <typename C>
  __device__ static C apply(C a, C b) {
    if constexpr (std::is_integral_v<C>)
      return a >= b ? a : b;
    else
      return (a != a || a >= b) ? a : b;
  }
};
struct MinimumOp {
  template <typename C>
  __device__ static C apply(C a, C b) {
    if constexpr (std::is_integral_v<C>)
      return a <= b ? a : b;
    else
      return (a != a || a <= b) ? a : b;
  }
};

template <typename T, typename Op>
struct Arith {
  __device__ T operator()(T x, T y) const {
    if constexpr (kIsIntD<T>) {
      return Op::apply(x, y);
    } else {
      using C = Compute<T>;
      return storeAs<T>(Op::apply(readAs<C>(x), readAs<C>(y)));
    }
  }
};

// kInts: the op is defined for int32/int64 too (add, sub, mul, maximum, minimum).
template <typename Op, bool kInts>
void arith(const KernelCtx& c) {
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  visit(a.dtype(), [&]<typename T>() {
    if constexpr (kIsFloatD<T> || (kInts && kIsIntD<T>))
      binaryMap<T, T, T>(c, a, b, Arith<T, Op>{});
    else
      unsupported(c, a.dtype());
  });
}

enum class Cmp { Eq, Lt, Gt };
template <typename T, Cmp kOp>
struct Compare {
  __device__ bool operator()(T x, T y) const {
    using C = Compute<T>;
    const C a = readAs<C>(x), b = readAs<C>(y);
    if constexpr (kOp == Cmp::Eq)
      return a == b;
    else if constexpr (kOp == Cmp::Lt)
      return a < b;
    else
      return a > b;
  }
};
template <Cmp kOp>
void compare(const KernelCtx& c) {
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  visit(a.dtype(), [&]<typename T>() { binaryMap<bool, T, T>(c, a, b, Compare<T, kOp>{}); });
}

// ---------------------------------------------------------------- unary on floats
// Each op: f (float, for float32 and the 16-bit floats) and d (double, for float64), the cpu
// backend's two formulas.
constexpr float kInvSqrt2F = 0.70710678118654752f;
constexpr float kInvSqrt2PiF = 0.39894228040143268f;
constexpr double kPi = 3.14159265358979323846;

__device__ __forceinline__ double sigmoidD(double x) {
  return 1.0 / (1.0 + exp(-x));
}
__device__ __forceinline__ float sigmoidF(float x) {
  return 1.0f / (1.0f + expf(-x));
}

struct ExpOp {
  __device__ static float f(float x) { return expf(x); }
  __device__ static double d(double x) { return exp(x); }
};
struct LogOp {
  __device__ static float f(float x) { return logf(x); }
  __device__ static double d(double x) { return log(x); }
};
struct SqrtOp {
  __device__ static float f(float x) { return sqrtf(x); }
  __device__ static double d(double x) { return sqrt(x); }
};
// 1/sqrt(x): two correctly rounded steps, as the cpu (not rsqrtf).
struct RsqrtOp {
  __device__ static float f(float x) { return 1.0f / sqrtf(x); }
  __device__ static double d(double x) { return 1.0 / sqrt(x); }
};
struct TanhOp {
  __device__ static float f(float x) { return tanhf(x); }
  __device__ static double d(double x) { return tanh(x); }
};
struct SigmoidOp {
  __device__ static float f(float x) { return sigmoidF(x); }
  __device__ static double d(double x) { return sigmoidD(x); }
};
// The exact erf form; float through erfc so the negative tail does not cancel.
struct GeluOp {
  __device__ static float f(float x) { return 0.5f * x * erfcf(-x * kInvSqrt2F); }
  __device__ static double d(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
};
struct SiluOp {
  __device__ static float f(float x) { return x / (1.0f + expf(-x)); }
  __device__ static double d(double x) { return x * sigmoidD(x); }
};

template <typename T, typename Op>
struct FloatUnary {
  __device__ T operator()(T x) const {
    if constexpr (std::is_same_v<T, double>)
      return Op::d(x);
    else
      return storeAs<T>(Op::f(readAs<float>(x)));
  }
};

template <typename Op>
void floatUnary(const KernelCtx& c) {
  const Tensor& x = c.inputs[0];
  visitFloat(x.dtype(), [&]<typename T>() { unaryMap<T, T>(c, x, FloatUnary<T, Op>{}); });
}

// (grad, x) -> grad * op'(x): float as g * f(x), double as the cpu's d(g, x).
struct GeluGradOp {
  __device__ static float f(float x) {
    return 0.5f * erfcf(-x * kInvSqrt2F) + x * expf(-0.5f * x * x) * kInvSqrt2PiF;
  }
  __device__ static double d(double g, double x) {
    const double cdf = 0.5 * (1.0 + erf(x / sqrt(2.0)));
    const double pdf = exp(-0.5 * x * x) / sqrt(2.0 * kPi);
    return g * (cdf + x * pdf);
  }
};
struct SiluGradOp {
  __device__ static float f(float x) {
    const float s = sigmoidF(x);
    return s * (1.0f + x * (1.0f - s));
  }
  __device__ static double d(double g, double x) {
    const double s = sigmoidD(x);
    return g * s * (1.0 + x * (1.0 - s));
  }
};

template <typename T, typename Op>
struct FloatGrad {
  __device__ T operator()(T g, T x) const {
    if constexpr (std::is_same_v<T, double>)
      return Op::d(g, x);
    else
      return storeAs<T>(readAs<float>(g) * Op::f(readAs<float>(x)));
  }
};

template <typename Op>
void floatGrad(const KernelCtx& c) {
  const Tensor &g = c.inputs[0], &x = c.inputs[1];
  visitFloat(g.dtype(), [&]<typename T>() { binaryMap<T, T, T>(c, g, x, FloatGrad<T, Op>{}); });
}

// ---------------------------------------------------------------- unary on floats and ints
template <typename T>
struct NegF {
  __device__ T operator()(T x) const {
    if constexpr (kIsIntD<T>)
      return wrapSub(T(0), x);
    else
      return storeAs<T>(-readAs<Compute<T>>(x));
  }
};
template <typename T>
struct AbsF {
  __device__ T operator()(T x) const {
    if constexpr (kIsIntD<T>)
      return x < T(0) ? wrapSub(T(0), x) : x;
    else if constexpr (std::is_same_v<T, double>)
      return fabs(x);
    else
      return storeAs<T>(fabsf(readAs<float>(x)));
  }
};
// relu(NaN) = relu(-0) = +0, as the reference's x > 0 ? x : 0.
template <typename T>
struct ReluF {
  __device__ T operator()(T x) const {
    using C = Compute<T>;
    const C v = readAs<C>(x);
    return storeAs<T>(v > C(0) ? v : C(0));
  }
};

template <template <typename> class F>
void numericUnary(const KernelCtx& c) {
  const Tensor& x = c.inputs[0];
  visit(x.dtype(), [&]<typename T>() {
    if constexpr (kIsFloatD<T> || kIsIntD<T>)
      unaryMap<T, T>(c, x, F<T>{});
    else
      unsupported(c, x.dtype());
  });
}

// ---------------------------------------------------------------- scalar attribute
// Floats: x + s / x * s in double, rounded once. Integers: wrapping, with si the scalar truncated
// toward zero (saturated to int64, then converted to the element type, as the cpu).
template <typename T, bool kMul>
struct ScalarF {
  double s;
  T si;
  __device__ T operator()(T x) const {
    if constexpr (kIsIntD<T>)
      return kMul ? wrapMul(x, si) : wrapAdd(x, si);
    else
      return storeAs<T>(kMul ? readAs<double>(x) * s : readAs<double>(x) + s);
  }
};

template <bool kMul>
void scalarOp(const KernelCtx& c) {
  const Tensor& x = c.inputs[0];
  const double s = c.attrs.getDouble("scalar");
  visit(x.dtype(), [&]<typename T>() {
    if constexpr (kIsFloatD<T>) {
      unaryMap<T, T>(c, x, ScalarF<T, kMul>{s, T{}});
    } else if constexpr (kIsIntD<T>) {
      const T si = T(saturatingInt<int64_t>(std::trunc(s)));
      unaryMap<T, T>(c, x, ScalarF<T, kMul>{s, si});
    } else {
      unsupported(c, x.dtype());
    }
  });
}

// x^e in double, rounded once; the exponents the cpu special-cases computed as it does.
enum class PowMode { One, Two, Three, Half, MinusOne, Zero, General };
template <typename T>
struct PowScalarF {
  PowMode mode;
  double e;
  __device__ T operator()(T xv) const {
    const double x = readAs<double>(xv);
    double r;
    switch (mode) {
      case PowMode::One:
        r = x;
        break;
      case PowMode::Two:
        r = x * x;
        break;
      case PowMode::Three:
        r = x * x * x;
        break;
      case PowMode::Half:
        r = sqrt(x);
        break;
      case PowMode::MinusOne:
        r = 1.0 / x;
        break;
      case PowMode::Zero:
        r = 1.0;
        break;
      default:
        r = pow(x, e);
        break;
    }
    return storeAs<T>(r);
  }
};

// ---------------------------------------------------------------- where, masked_fill
// Values only move, so where runs on unsigned words of the element's width.
template <typename E>
__global__ void whereKernel(E* __restrict__ out, const bool* __restrict__ cond, Geom gc,
                            const E* __restrict__ a, Geom ga, const E* __restrict__ b, Geom gb,
                            int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = cond[gc.offset(i)] ? a[ga.offset(i)] : b[gb.offset(i)];
}

template <typename T>
struct MaskedFillF {
  double value;
  __device__ T operator()(T x, bool m) const { return m ? storeAs<T>(value) : x; }
};

}  // namespace

void kAdd(const KernelCtx& c) {
  arith<AddOp, true>(c);
}
void kSub(const KernelCtx& c) {
  arith<SubOp, true>(c);
}
void kMul(const KernelCtx& c) {
  arith<MulOp, true>(c);
}
void kDiv(const KernelCtx& c) {
  arith<DivOp, false>(c);
}
void kPow(const KernelCtx& c) {
  arith<PowOp, false>(c);
}
void kMaximum(const KernelCtx& c) {
  arith<MaximumOp, true>(c);
}
void kMinimum(const KernelCtx& c) {
  arith<MinimumOp, true>(c);
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
  numericUnary<NegF>(c);
}
void kAbs(const KernelCtx& c) {
  numericUnary<AbsF>(c);
}
void kRelu(const KernelCtx& c) {
  numericUnary<ReluF>(c);
}
void kExp(const KernelCtx& c) {
  floatUnary<ExpOp>(c);
}
void kLog(const KernelCtx& c) {
  floatUnary<LogOp>(c);
}
void kSqrt(const KernelCtx& c) {
  floatUnary<SqrtOp>(c);
}
void kRsqrt(const KernelCtx& c) {
  floatUnary<RsqrtOp>(c);
}
void kTanh(const KernelCtx& c) {
  floatUnary<TanhOp>(c);
}
void kSigmoid(const KernelCtx& c) {
  floatUnary<SigmoidOp>(c);
}
void kGelu(const KernelCtx& c) {
  floatUnary<GeluOp>(c);
}
void kSilu(const KernelCtx& c) {
  floatUnary<SiluOp>(c);
}
void kGeluBackward(const KernelCtx& c) {
  floatGrad<GeluGradOp>(c);
}
void kSiluBackward(const KernelCtx& c) {
  floatGrad<SiluGradOp>(c);
}

void kAddScalar(const KernelCtx& c) {
  scalarOp<false>(c);
}
void kMulScalar(const KernelCtx& c) {
  scalarOp<true>(c);
}

void kPowScalar(const KernelCtx& c) {
  const Tensor& x = c.inputs[0];
  const double e = c.attrs.getDouble("exponent");
  const PowMode mode = e == 1.0    ? PowMode::One
                       : e == 2.0  ? PowMode::Two
                       : e == 3.0  ? PowMode::Three
                       : e == 0.5  ? PowMode::Half
                       : e == -1.0 ? PowMode::MinusOne
                       : e == 0.0  ? PowMode::Zero
                                   : PowMode::General;
  visitFloat(x.dtype(), [&]<typename T>() { unaryMap<T, T>(c, x, PowScalarF<T>{mode, e}); });
}

// inputs: cond (bool), a, b; the output has a's dtype at the broadcast shape of all three.
void kWhere(const KernelCtx& c) {
  const Tensor &cond = c.inputs[0], &a = c.inputs[1], &b = c.inputs[2], &out = c.outputs[0];
  KEEL_CHECK(cond.dtype() == DType::Bool, "op '", c.op.name, "': condition must be bool");
  KEEL_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype(), "op '", c.op.name,
             "': dtype mismatch");
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceCtx& d = deviceCtx(c);
  const Shape& s = out.shape();
  const Geom gc = geomAs(cond, s), ga = geomAs(a, s), gb = geomAs(b, s);
  const Launch1D l = launch1D(n);
  auto go = [&]<typename E>() {
    launch(whereKernel<E>, l.blocks, l.threads, 0, d.stream, ptr<E>(out), ptr<const bool>(cond), gc,
           ptr<const E>(a), ga, ptr<const E>(b), gb, n);
  };
  visitWidth(dtypeSize(out.dtype()), go);
  checkLaunch(c, "whereKernel");
}

// inputs: x, mask (bool, broadcast to x); value converted as every store converts a double.
void kMaskedFill(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &mask = c.inputs[1];
  KEEL_CHECK(mask.dtype() == DType::Bool, "op '", c.op.name, "': mask must be bool");
  const double value = c.attrs.getDouble("value");
  visit(x.dtype(), [&]<typename T>() { binaryMap<T, T, bool>(c, x, mask, MaskedFillF<T>{value}); });
}

}  // namespace keel::cuda
