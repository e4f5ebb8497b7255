// Element values read from raw bytes as doubles: what capture's tensor statistics and storage's
// dump decoding both read. Bytes are row-major and may be unaligned; 16-bit floats widen through
// float; a bool byte is 1 when nonzero (any nonzero byte, not only 1).
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "keel/base/dtype.h"

namespace keel {

namespace detail {
template <typename T, typename Fn>
void forEachValueAs(const uint8_t* p, int64_t n, Fn& fn) {
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, bool>) {
      fn(p[i] ? 1.0 : 0.0);
    } else {
      T v;
      std::memcpy(&v, p + i * int64_t(sizeof(T)), sizeof(T));
      fn(double(v));
    }
  }
}
}  // namespace detail

// Calls fn(double) for each of the n values of dtype dt at p (the element type is dt's place in
// detail::DTypeElements).
template <typename Fn>
void forEachValue(DType dt, const uint8_t* p, int64_t n, Fn&& fn) {
  [&]<typename... Ts>(detail::ElementTypes<Ts...>) {
    int i = 0;
    ((i++ == int(dt) ? detail::forEachValueAs<Ts>(p, n, fn) : void()), ...);
  }(detail::DTypeElements{});
}

}  // namespace keel
