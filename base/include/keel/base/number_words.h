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
// A whole number past int64 under no upper bound ("99999999999999999999") says the bound it
// passed: "must be a whole number ≥ 0, at most 9223372036854775807, got '...'".
inline std::string notAWholeNumberIn(int64_t lo, int64_t hi, std::string_view got) {
  std::string_view digits = got;
  if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
  bool whole = !digits.empty();
  for (char c : digits) whole = whole && c >= '0' && c <= '9';
  while (digits.size() > 1 && digits.front() == '0') digits.remove_prefix(1);
  const std::string max = std::to_string(INT64_MAX);
  const bool past = whole && (digits.size() > max.size() ||
                              (digits.size() == max.size() && digits > std::string_view(max)));
  const std::string cap = hi == INT64_MAX && past ? ", at most " + max : "";
  return "must be a whole number " + wholeNumberRange(lo, hi) + cap + ", got '" + std::string(got) +
         "'";
}

// "must be a whole number in [0, 18446744073709551615], got 'TEXT'" (a seed: any uint64).
inline std::string notASeed(std::string_view got) {
  return "must be a whole number in [0, 18446744073709551615], got '" + std::string(got) + "'";
}

}  // namespace keel
