// Kernel helpers shared by the backends: dtype and element-width visitation, accumulator types.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "keel/dtype.h"
#include "keel/registry.h"

namespace keel {

// Calls f.template operator()<T>() with the type that stores dtype t; Half16 and BF16 are the
// 16-bit float types (a device backend passes its own, the host's are Half and BFloat16).
template <typename Half16, typename BF16, typename F>
decltype(auto) visitDTypeAs(DType t, F&& f) {
  switch (t) {
    case DType::Float32:
      return f.template operator()<float>();
    case DType::Float64:
      return f.template operator()<double>();
    case DType::Float16:
      return f.template operator()<Half16>();
    case DType::BFloat16:
      return f.template operator()<BF16>();
    case DType::Int32:
      return f.template operator()<int32_t>();
    case DType::Int64:
      return f.template operator()<int64_t>();
    case DType::Bool:
      return f.template operator()<bool>();
  }
  throw Error("unknown dtype");
}

template <typename F>
decltype(auto) visitDType(DType t, F&& f) {
  return visitDTypeAs<Half, BFloat16>(t, std::forward<F>(f));
}

// Calls f.template operator()<E>() with the unsigned type of `bytes` bytes (1, 2, 4 or 8), for
// kernels that only move elements; any other width is a keel::Error.
template <typename F>
void visitWidth(size_t bytes, F&& f) {
  switch (bytes) {
    case 1:
      return f.template operator()<uint8_t>();
    case 2:
      return f.template operator()<uint16_t>();
    case 4:
      return f.template operator()<uint32_t>();
    case 8:
      return f.template operator()<uint64_t>();
    default:
      throw Error("no element type of " + std::to_string(bytes) + " bytes");
  }
}

template <typename T>
inline constexpr bool kIsFloat = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                 std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// Accumulator for the optimized backend: float for 16/32-bit floats, double for float64,
// int64 for integers.
template <typename T>
using AccT = std::conditional_t<std::is_same_v<T, double>, double,
                                std::conditional_t<kIsFloat<T>, float, int64_t>>;

// A double as integer T, as every backend stores one: NaN -> 0, out-of-range values saturate
// (no undefined conversion), the rest truncate toward zero.
template <typename T>
inline T saturatingInt(double x) {
  if (std::isnan(x)) return T(0);
  constexpr double lo = double(std::numeric_limits<T>::min());
  constexpr double hi = double(std::numeric_limits<T>::max());
  if (x <= lo) return std::numeric_limits<T>::min();
  if (x >= hi) return std::numeric_limits<T>::max();
  return T(x);
}

// Reads an index element (int32 or int64) as int64.
inline int64_t readIndex(const Tensor& idx, int64_t elemOffset) {
  return idx.dtype() == DType::Int32 ? int64_t(idx.data<int32_t>()[elemOffset])
                                     : idx.data<int64_t>()[elemOffset];
}

}  // namespace keel
