// Helpers shared by the optimized cpu backend: coalesced strided iteration, 16-bit float compute
// types, vectorizable float math (exp, tanh, erfc), fixed-order blocked sums, index checks.
// Invariant: no result depends on the thread count or timing (see Note [cpu determinism]).
#pragma once
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kernel_util.h"
#include "parallel.h"
#include "shape_util.h"

// Note [cpu determinism]: parallelFor partitions statically, and every kernel in this backend
// computes each output element in exactly one chunk with a fixed operation order. Reductions are
// never split across threads by thread count; where a long reduction is split, the split points
// depend only on the problem size (fixed-size blocks) and partials are combined in block order.
// So results are bitwise identical from run to run and for any KEEL_NUM_THREADS. matmul inherits
// OpenBLAS's behaviour, which splits a product over M and N (never K) between its threads.

namespace keel::cpu {

// Elements per parallel chunk for cheap (memory-bound) and for transcendental element ops.
inline constexpr int64_t kGrain = 32768;
inline constexpr int64_t kGrainHeavy = 4096;

// The type a kernel computes in: float for float32/float16/bfloat16, double for float64, the
// type itself for integers and bool.
template <typename T>
using CompT = std::conditional_t<std::is_same_v<T, double>, double,
                                 std::conditional_t<kIsFloat<T>, float, T>>;

template <typename T>
inline constexpr bool kIsInt = std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>;
template <typename T>
inline constexpr bool k16Bit = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// Integer arithmetic that wraps instead of overflowing (no UB).
template <typename T>
inline T wrapAdd(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return T(U(a) + U(b));
}
template <typename T>
inline T wrapSub(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return T(U(a) - U(b));
}
template <typename T>
inline T wrapMul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return T(U(a) * U(b));
}

// Stores a compute-type value as T (16-bit floats round to nearest even); defined below.
template <typename T>
T store(CompT<T> c);

// Converts a double to T as the reference backend stores values: 16-bit floats through float,
// integers truncated and saturated (NaN -> 0), bool as x != 0.
template <typename T>
inline T fromDouble(double x) {
  if constexpr (std::is_same_v<T, bool>) {
    return x != 0.0;
  } else if constexpr (std::is_same_v<T, double>) {
    return x;
  } else if constexpr (kIsFloat<T>) {
    return store<T>(float(x));
  } else {
    return saturatingInt<T>(x);
  }
}

// ---------------------------------------------------------------- strided iteration

// A set of N operands over one shape, with size-1 dims dropped and mergeable dims coalesced.
// The last dim is the "inner" dim; everything before it is iterated as rows.
template <size_t N>
struct Layout {
  Shape shape;                   // rank >= 1
  std::array<Shape, N> strides;  // per operand, in elements
  int64_t rows = 1, inner = 1;
  int64_t innerStride(size_t k) const { return strides[k].back(); }
};

template <size_t N>
Layout<N> makeLayout(const Shape& shape, const std::array<Shape, N>& strides) {
  Layout<N> l;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !l.shape.empty();
    for (size_t k = 0; k < N && merge; ++k) merge = l.strides[k].back() == strides[k][d] * shape[d];
    if (merge) {
      l.shape.back() *= shape[d];
      for (size_t k = 0; k < N; ++k) l.strides[k].back() = strides[k][d];
    } else {
      l.shape.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) l.strides[k].push_back(strides[k][d]);
    }
  }
  if (l.shape.empty()) {
    l.shape.push_back(1);
    for (size_t k = 0; k < N; ++k) l.strides[k].push_back(0);
  }
  for (size_t d = 0; d + 1 < l.shape.size(); ++d) l.rows *= l.shape[d];
  l.inner = l.shape.back();
  for (int64_t s : shape)
    if (s == 0) l.rows = 0;
  return l;
}

// Calls fn(offsets, len) over units [ub, ue): unit u is segment (u % segs) of row (u / segs);
// a row of `inner` elements is cut into `segs` segments of segLen (the last may be shorter).
// offsets[k] is operand k's element offset of the segment's first element.
template <size_t N, typename F>
void forUnits(const Layout<N>& l, int64_t segs, int64_t segLen, int64_t ub, int64_t ue, F&& fn) {
  const size_t outer = l.shape.size() - 1;
  std::vector<int64_t> idx(outer, 0);
  int64_t row = ub / segs, seg = ub % segs;
  std::array<int64_t, N> base{};
  int64_t r = row;
  for (size_t d = outer; d-- > 0;) {
    idx[d] = r % l.shape[d];
    r /= l.shape[d];
    for (size_t k = 0; k < N; ++k) base[k] += idx[d] * l.strides[k][d];
  }
  for (int64_t u = ub; u < ue;) {
    int64_t start = seg * segLen, len = std::min(segLen, l.inner - start);
    std::array<int64_t, N> off;
    for (size_t k = 0; k < N; ++k) off[k] = base[k] + start * l.strides[k].back();
    fn(off, len);
    ++u;
    if (++seg == segs && u < ue) {
      seg = 0;
      for (size_t d = outer; d-- > 0;) {
        for (size_t k = 0; k < N; ++k) base[k] += l.strides[k][d];
        if (++idx[d] < l.shape[d]) break;
        for (size_t k = 0; k < N; ++k) base[k] -= l.strides[k][d] * l.shape[d];
        idx[d] = 0;
      }
    }
  }
}

// Runs fn(offsets, len) over the whole layout in parallel, about `grain` elements per chunk;
// long rows are cut into segments so a single contiguous row still uses every thread.
template <size_t N, typename F>
void parallelLayout(const Layout<N>& l, int64_t grain, F&& fn) {
  if (l.rows == 0 || l.inner == 0) return;
  int64_t segs = 1, segLen = l.inner;
  if (l.inner > grain) {
    segs = (l.inner + grain - 1) / grain;
    segLen = (l.inner + segs - 1) / segs;
    segs = (l.inner + segLen - 1) / segLen;
  }
  int64_t units = l.rows * segs;
  int64_t unitGrain = segs > 1 ? 1 : std::max<int64_t>(1, grain / l.inner);
  parallelFor(units, unitGrain, [&](int64_t b, int64_t e) { forUnits(l, segs, segLen, b, e, fn); });
}

// Copies (same dtype) src's elements into dst's geometry; both strided, shapes equal.
void copyStrided(void* dst, const Shape& dstStrides, const void* src, const Shape& srcStrides,
                 const Shape& shape, size_t elemSize);
// A contiguous tensor with t's values: t itself when already contiguous.
Tensor contig(const Tensor& t);
// Copies t (any layout) into contiguous memory at dst.
void copyToContiguous(const Tensor& t, void* dst);

// Throws keel::Error: the op has no cpu kernel for dtype t (the registry's masks normally stop
// such calls before they get here).
[[noreturn]] void unsupported(const KernelCtx& c, DType t);

// Calls f.template operator()<T>() with the C++ type of the first input's dtype when it is a
// float type; any other dtype is unsupported.
template <typename F>
void visitFloatInput(const KernelCtx& c, F&& f) {
  const DType t = c.inputs[0].dtype();
  visitDType(t, [&]<typename T>() {
    if constexpr (kIsFloat<T>)
      f.template operator()<T>();
    else
      unsupported(c, t);
  });
}

// Throws the backend's out-of-range message unless 0 <= idx < extent.
[[noreturn]] void throwIndex(std::string_view op, int64_t idx, int64_t extent);
inline void checkIndex(std::string_view op, int64_t idx, int64_t extent) {
  if (idx < 0 || idx >= extent) throwIndex(op, idx, extent);
}
// Reads every element of an int32/int64 index tensor (any layout, row-major order) as int64.
std::vector<int64_t> readIndices(std::string_view op, const Tensor& idx);
// readIndices, then checks each value against extent (before the kernel writes anything).
std::vector<int64_t> loadIndices(std::string_view op, const Tensor& idx, int64_t extent);

// ---------------------------------------------------------------- vectorizable float math
// Written without data-dependent branches on floats (selects go through integer masks) so that
// GCC vectorizes loops calling them at -O3 without -ffast-math. Accuracy: a few ulp.

namespace math {

constexpr int32_t orderKey(float f) {
  int32_t b = std::bit_cast<int32_t>(f);
  return b ^ ((b >> 31) & 0x7fffffff);
}
// a if cond else b, by bit masks.
inline float select(bool cond, float a, float b) {
  uint32_t m = 0u - uint32_t(cond);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
}
inline uint32_t selectBits(bool cond, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - uint32_t(cond);
  return (a & m) | (b & ~m);
}
inline bool isNan(float x) {
  return (std::bit_cast<uint32_t>(x) & 0x7fffffffu) > 0x7f800000u;
}
inline float absF(float x) {
  return std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0x7fffffffu);
}

// e^x (Cephes expf polynomial; Cody-Waite reduction; correct overflow, underflow to subnormals,
// NaN propagation). Max relative error ~1e-7.
inline float expF(float x) {
  int32_t b = std::bit_cast<int32_t>(x);
  int32_t key =
      std::min(std::max(b ^ ((b >> 31) & 0x7fffffff), orderKey(-104.0f)), orderKey(89.0f));
  float xc = std::bit_cast<float>(key ^ ((key >> 31) & 0x7fffffff));
  float fnb = xc * 1.44269504088896341f + 12582912.0f;  // round(x / ln 2) in the low bits
  float fn = fnb - 12582912.0f;
  float r = xc - fn * 0.693359375f;
  r = r - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  int32_t n = std::bit_cast<int32_t>(fnb) - 0x4b400000;  // in [-150, 129]
  int32_t n1 = std::min(std::max(n, -120), 127);
  int32_t n2 = n - n1;  // two normal scale factors so results may round into subnormals
  y = y * std::bit_cast<float>((n1 + 127) << 23) * std::bit_cast<float>((n2 + 127) << 23);
  uint32_t nanMask = 0u - uint32_t(isNan(x));
  return std::bit_cast<float>(std::bit_cast<uint32_t>(y) | nanMask);
}

// tanh: odd polynomial below 0.625 (Cephes tanhf), 1 - 2/(e^{2|x|} + 1) above.
inline float tanhF(float x) {
  float ax = absF(x);
  float s = x * x;
  float small = ((((-5.70498872745e-3f * s + 2.06390887954e-2f) * s - 5.37397155531e-2f) * s +
                  1.33314422036e-1f) *
                     s -
                 3.33332819422e-1f) *
                    s * x +
                x;
  float big = 1.0f - 2.0f / (expF(2.0f * ax) + 1.0f);
  big = std::bit_cast<float>(std::bit_cast<uint32_t>(big) |
                             (std::bit_cast<uint32_t>(x) & 0x80000000u));  // copysign
  return select(std::bit_cast<uint32_t>(ax) < std::bit_cast<uint32_t>(0.625f), small, big);
}

inline float sigmoidF(float x) {
  return 1.0f / (1.0f + expF(-x));
}

// erfc(z), Numerical Recipes' erfcc (relative error < 1.2e-7 in exact arithmetic), accurate in
// the tail where 1 + erf(-z) would cancel.
inline float erfcF(float z) {
  float az = absF(z);
  float t = 1.0f / (1.0f + 0.5f * az);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  float ans = t * expF(-az * az + p);
  return select((std::bit_cast<uint32_t>(z) & 0x80000000u) != 0, 2.0f - ans, ans);
}

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

inline float geluF(float x) {
  return 0.5f * x * erfcF(-x * kInvSqrt2);
}
inline float geluGradF(float x) {
  return 0.5f * erfcF(-x * kInvSqrt2) + x * expF(-0.5f * x * x) * kInvSqrt2Pi;
}
// float16 <-> float32 without branches (F. Giesen's conversions; round to nearest even, NaN ->
// quiet NaN with the sign kept). Bit-identical to Half::fromFloat / Half::toFloat, and so is
// bf16FromFloat to BFloat16::fromFloat: kept beside keel/base/dtype.h's conversions because these
// vectorize. tests/engine/dtype_test.cpp (CpuConversions) pins them: all 65,536 halves widened,
// and every 4093rd float bit pattern plus every tie, special and subnormal narrowed.
inline uint16_t halfFromFloat(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t sign = u & 0x80000000u, a = u ^ sign;
  // Inf or NaN (or too large): 0x7c00, or 0x7e00 for NaN.
  const uint32_t special = 0x7c00u | (uint32_t(a > 0x7f800000u) << 9);
  // Subnormal or zero: add a magic float so the FPU's rounding aligns the 10 mantissa bits.
  const float magic = std::bit_cast<float>(uint32_t((127 - 15 + 23 - 10 + 1) << 23));
  const uint32_t sub =
      std::bit_cast<uint32_t>(std::bit_cast<float>(a) + magic) - std::bit_cast<uint32_t>(magic);
  // Normal: rebias the exponent and round the 13 dropped bits to nearest even.
  const uint32_t norm = (a + (uint32_t(15 - 127) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
  const uint32_t o =
      selectBits(a >= (uint32_t(127 + 16) << 23), special, selectBits(a < (113u << 23), sub, norm));
  return uint16_t(o | (sign >> 16));
}
// float32 -> bfloat16, round to nearest even, NaN -> quiet NaN (as BFloat16::fromFloat).
inline uint16_t bf16FromFloat(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet = (u >> 16) | 0x40u;
  return uint16_t(selectBits((u & 0x7fffffffu) > 0x7f800000u, quiet, rounded));
}
inline float halfToFloat(uint16_t h) {
  const uint32_t e = uint32_t(h & 0x7fffu) << 13;
  const uint32_t exp = e & (0x7c00u << 13);
  const uint32_t base = e + (uint32_t(127 - 15) << 23);
  const uint32_t inf = base + (uint32_t(128 - 16) << 23);
  const float magic = std::bit_cast<float>(113u << 23);
  const uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>(base + (1u << 23)) - magic);
  const uint32_t o = selectBits(exp == (0x7c00u << 13), inf, selectBits(exp == 0, sub, base));
  return std::bit_cast<float>(o | (uint32_t(h & 0x8000u) << 16));
}

inline float siluF(float x) {
  return x / (1.0f + expF(-x));
}
inline float siluGradF(float x) {
  const float s = sigmoidF(x);
  return s * (1.0f + x * (1.0f - s));
}

}  // namespace math

// Loads an element into its compute type, and stores one back. 16-bit floats use the branch-free
// conversions above, which give the same bits as the Half / BFloat16 constructors but vectorize.
template <typename T>
inline CompT<T> load(T v) {
  if constexpr (std::is_same_v<T, Half>)
    return math::halfToFloat(v.bits);
  else if constexpr (std::is_same_v<T, BFloat16>)
    return std::bit_cast<float>(uint32_t(v.bits) << 16);
  else
    return CompT<T>(v);
}
template <typename T>
T store(CompT<T> c) {
  if constexpr (std::is_same_v<T, Half>) {
    Half h;
    h.bits = math::halfFromFloat(c);
    return h;
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    BFloat16 b;
    b.bits = math::bf16FromFloat(c);
    return b;
  } else {
    return T(c);
  }
}

// Contiguous float32 loops over the math above (vec_math.cpp: AVX2 where the CPU has it, same
// bits either way). Strided and 16-bit paths call the same math:: functions element by element.
enum class FloatUnary { Exp, Tanh, Sigmoid, Gelu, Silu };
enum class FloatGrad { Gelu, Silu };  // y = g * d/dx op(x)
void floatUnaryArray(FloatUnary op, const float* x, float* y, int64_t n);
// Which clone of those loops this CPU runs: "avx2" or "baseline" (kernel parameters).
const char* vecMathClone();
void floatGradArray(FloatGrad op, const float* g, const float* x, float* y, int64_t n);
// y[i] = e^(x[i] - shift)
void expShiftArray(const float* x, float shift, float* y, int64_t n);

// out[j] = philoxUniform(seed, offset, first + j) for j < n, bit-identical to random.h's
// definition (four counters per SSE4.1 step where available).
void philoxUniformBlock(uint64_t seed, uint64_t offset, uint64_t first, int64_t n, float* out);

// sqrt over a contiguous array (SSE where available: std::sqrt does not vectorize with errno).
void sqrtArray(const float* in, float* out, int64_t n);
void sqrtArray(const double* in, double* out, int64_t n);

// ---------------------------------------------------------------- fixed-order sums

// Accumulator of the fixed-order sums: double for every float type (f is evaluated in the compute
// type, each term is widened before it is added), int64 for integers.
template <typename C>
using SumT = std::conditional_t<std::is_floating_point_v<C>, double, int64_t>;

// Sum of f(x[i], y[i]) over two contiguous arrays (y converted to x's compute type) in a fixed
// order: 8 lanes within blocks of 1024 elements, lanes combined pairwise, blocks added in order.
// Independent of threads.
template <typename T, typename U, typename F>
double blockSum2(const T* x, const U* y, int64_t n, F f) {
  using C = CompT<T>;
  using S = SumT<C>;
  constexpr int kLanes = 8;
  double total = 0.0;
  for (int64_t b = 0; b < n; b += 1024) {
    const int64_t e = std::min(n, b + 1024);
    S acc[kLanes] = {};
    int64_t i = b;
    for (; i + kLanes <= e; i += kLanes)
      for (int l = 0; l < kLanes; ++l) acc[l] += S(f(load(x[i + l]), load(y[i + l])));
    S tail = 0;
    for (; i < e; ++i) tail += S(f(load(x[i]), load(y[i])));
    for (int w = kLanes / 2; w > 0; w /= 2)
      for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
    total += double(acc[0] + tail);
  }
  return total;
}

// Sum of f(x[i]) over n contiguous values, in blockSum2's order.
template <typename T, typename F>
double blockSum(const T* x, int64_t n, F f) {
  return blockSum2(x, x, n, [&](CompT<T> v, CompT<T>) { return f(v); });
}
template <typename T>
double blockSum(const T* x, int64_t n) {
  return blockSum(x, n, [](CompT<T> v) { return v; });
}

// Max of a contiguous row in the compute type, ignoring NaN like std::max(acc, x) does (a NaN
// still poisons what is computed from the row afterwards). Empty rows give -inf.
template <typename T>
CompT<T> rowMax(const T* x, int64_t n) {
  using C = CompT<T>;
  constexpr int kLanes = 8;
  C m[kLanes];
  for (int l = 0; l < kLanes; ++l) m[l] = -std::numeric_limits<C>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      C v = load(x[i + l]);
      m[l] = v > m[l] ? v : m[l];
    }
  C r = -std::numeric_limits<C>::infinity();
  for (; i < n; ++i) {
    C v = load(x[i]);
    r = v > r ? v : r;
  }
  for (int l = 0; l < kLanes; ++l) r = m[l] > r ? m[l] : r;
  return r;
}

}  // namespace keel::cpu
