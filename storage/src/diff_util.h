// Private helpers of the run diff (diff*.cpp): the one number format its verdicts and reports
// use. Nothing outside storage/src includes this.
#pragma once
#include <cmath>
#include <cstdio>
#include <string>

namespace keel::storage::detail {

// "%.6g", with nan, inf and -inf spelled out.
inline std::string fmtNum(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace keel::storage::detail
