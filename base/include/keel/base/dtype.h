// Element types: float32, float16, bfloat16, float64, int32, int64, bool, and the 16-bit float
// storage types. Half and BFloat16 hold bits; arithmetic happens in float (round to nearest even).
// Part of the shared vocabulary (keel/base): the engine computes with these conversions and storage
// decodes dumped values and measures ULPs with the same ones.
#pragma once
#include <cstdint>
#include <cstring>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "keel/base/error.h"

namespace keel {

enum class DType : uint8_t { Float32, Float16, BFloat16, Float64, Int32, Int64, Bool };
inline constexpr int kNumDTypes = 7;

struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(fromFloat(f)) {}  // NOLINT: implicit like a numeric type
  operator float() const { return toFloat(bits); }
  static uint16_t fromFloat(float f);
  static float toFloat(uint16_t h);
};

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(fromFloat(f)) {}  // NOLINT
  operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static uint16_t fromFloat(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    return uint16_t(u >> 16);
  }
};

inline uint16_t Half::fromFloat(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
  if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow to inf (>= 65520)
  if (absx < 0x38800000u) {                                  // subnormal or zero in half
    if (absx < 0x33000000u) return uint16_t(sign);           // < 2^-25 rounds to zero
    uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    int shift =
        126 - int(absx >> 23);  // value = mant * 2^-shift in units of 2^-24; shift in [14, 24]
    uint32_t h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);  // round to nearest even on the bits shifted out
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return uint16_t(sign | h);
  }
  uint32_t e = (absx >> 23) - 112;  // rebias 127 -> 15
  uint32_t m = absx & 0x7fffffu;
  uint32_t h = (e << 10) | (m >> 13);
  uint32_t rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into exponent: correct
  return uint16_t(sign | h);
}

inline float Half::toFloat(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  uint32_t u;
  if (e == 0) {
    if (m == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int shift = 0;
      while (!(m & 0x400u)) {
        m <<= 1;
        ++shift;
      }
      m &= 0x3ffu;
      u = sign | (uint32_t(113 - shift) << 23) | (m << 13);
    }
  } else if (e == 31) {
    u = sign | 0x7f800000u | (m << 13);
  } else {
    u = sign | ((e + 112) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The C++ element type of each DType, in DType's order: the one list dtypeSize and DTypeOf read.
namespace detail {
template <typename... Ts>
struct ElementTypes {
  static constexpr size_t sizes[] = {sizeof(Ts)...};
  // T's place in the list; -1 when it is not there.
  template <typename T>
  static constexpr int indexOf() {
    int i = 0, found = -1;
    ((found = (found < 0 && std::is_same_v<T, Ts>) ? i : found, ++i), ...);
    return found;
  }
};
using DTypeElements = ElementTypes<float, Half, BFloat16, double, int32_t, int64_t, bool>;
static_assert(std::size(DTypeElements::sizes) == size_t(kNumDTypes));
}  // namespace detail

constexpr size_t dtypeSize(DType t) {
  return size_t(t) < size_t(kNumDTypes) ? detail::DTypeElements::sizes[size_t(t)] : 0;
}

constexpr bool isFloating(DType t) {
  return t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16 || t == DType::Float64;
}
constexpr bool isIntegral(DType t) {
  return t == DType::Int32 || t == DType::Int64;
}

inline constexpr std::string_view kDTypeNames[kNumDTypes] = {
    "float32", "float16", "bfloat16", "float64", "int32", "int64", "bool"};
constexpr std::string_view dtypeName(DType t) {
  return size_t(t) < size_t(kNumDTypes) ? kDTypeNames[size_t(t)] : std::string_view("?");
}
// Short names where space is tight (graph labels): "f32", "f16", "bf16", "f64", "i32", "i64",
// "bool".
inline constexpr std::string_view kDTypeShortNames[kNumDTypes] = {"f32", "f16", "bf16", "f64",
                                                                  "i32", "i64", "bool"};
constexpr std::string_view dtypeShortName(DType t) {
  return size_t(t) < size_t(kNumDTypes) ? kDTypeShortNames[size_t(t)] : std::string_view("?");
}
// Parses the names above, the short names, and the aliases "float", "half", "double", "int",
// "long"; nullopt for anything else.
constexpr std::optional<DType> tryParseDType(std::string_view n) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (n == kDTypeNames[i] || n == kDTypeShortNames[i]) return DType(i);
  if (n == "float") return DType::Float32;
  if (n == "half") return DType::Float16;
  if (n == "double") return DType::Float64;
  if (n == "int") return DType::Int32;
  if (n == "long") return DType::Int64;
  return std::nullopt;
}
// tryParseDType, throwing keel::Error for anything else.
inline DType parseDType(std::string_view name) {
  if (auto t = tryParseDType(name)) return *t;
  throw Error(
      detail::concat("unknown dtype '", name,
                     "' (expected float32, float16, bfloat16, float64, int32, int64, bool)"));
}

// Maps a C++ type to its DType (its place in detail::DTypeElements); any other type fails to
// compile.
template <typename T>
struct DTypeOf {
  static constexpr int index = detail::DTypeElements::indexOf<T>();
  static_assert(index >= 0, "no DType for this C++ type");
  static constexpr DType value = DType(index);
};
static_assert(DTypeOf<Half>::value == DType::Float16 && DTypeOf<bool>::value == DType::Bool);

}  // namespace keel
