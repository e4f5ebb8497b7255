// How a number outside its documented range is reported, in the same words by the keel tool's
// options (app/keel/main.cpp: wholeNumber, seedNumber) and keel-studio's command line:
// "must be a whole number in [1, 1000000000], got '0'".
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace keel {

// "in [lo, hi]", or "≥ lo" when there is no upper bound (hi = INT64_MAX).
inline std::string wholeNumberRange(int64_t lo, int64_t hi) {
  if (hi == INT64_MAX) return "≥ " + std::to_string(lo);
  return "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

// "must be a whole number in [lo, hi], got 'TEXT'".
inline std::string notAWholeNumberIn(int64_t lo, int64_t hi, std::string_view got) {
  return "must be a whole number " + wholeNumberRange(lo, hi) + ", got '" + std::string(got) + "'";
}

// "must be a whole number in [0, 18446744073709551615], got 'TEXT'" (a seed: any uint64).
inline std::string notASeed(std::string_view got) {
  return "must be a whole number in [0, 18446744073709551615], got '" + std::string(got) + "'";
}

}  // namespace keel
