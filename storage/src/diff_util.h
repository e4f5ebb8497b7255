// Private helpers of the run diff (diff*.cpp): the one number format its verdicts and reports
// use, and the walk back through views of the module alignment. Nothing outside storage/src
// includes this.
#pragma once
#include <cmath>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "keel/storage/producers.h"
#include "keel/storage/records.h"

namespace keel::storage::detail {

// The ops whose outputs reach the inputs of ops[pos], walking back through views and copies
// (opKind ""): positions in ops, each once, at most `budget` ops walked (Note [Diff across
// frameworks], diff_modules.cpp). `index` indexes `ops`.
std::vector<size_t> feedersThroughViews(std::span<const OpRecord* const> ops,
                                        const ProducerIndex& index, size_t pos, int budget = 256);

// "%.6g", with nan, inf and -inf spelled out.
inline std::string fmtNum(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace keel::storage::detail
