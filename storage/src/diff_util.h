// Private helpers of the run diff (diff*.cpp): the one number format its verdicts and reports
// use, an op's first output and a shape's element count, and the walk back through views of the
// module alignment. Nothing outside storage/src
// includes this.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "keel/storage/producers.h"
#include "keel/storage/records.h"

namespace keel::storage {
struct DiffReport;
}

namespace keel::storage::detail {

// The ops whose outputs reach the inputs of ops[pos], walking back through views and copies
// (opKind ""): positions in ops, each once, at most `budget` ops walked (Note [Diff across
// frameworks], diff_modules.cpp). `index` indexes `ops`.
std::vector<size_t> feedersThroughViews(std::span<const OpRecord* const> ops,
                                        const ProducerIndex& index, size_t pos, int budget = 256);

// An op's first output (the lowest output index), or null.
inline const TensorRecord* firstOutput(const OpRecord& op) {
  const TensorRecord* best = nullptr;
  for (const TensorRecord& t : op.tensors)
    if (t.role == Role::Output && (!best || t.index < best->index)) best = &t;
  return best;
}

// The element count of a shape; -1 for a negative dimension or a count past int64 (a damaged
// recording).
inline int64_t elementCount(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > INT64_MAX / d)) return -1;
    n *= d;
  }
  return n;
}

// "%.6g", with nan, inf and -inf spelled out.
inline std::string fmtNum(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// "record both with --all" (or keel_torch.record's arguments for a PyTorch side; A and B
// named apart when their tools differ): what a diff that lacked tensor values says to do.
// `alternatives`: also "--md5 / --stats" for a Keel side.
std::string recordBothHint(const DiffReport& r, bool alternatives);
std::string recordHint(const std::string& framework, bool alternatives);

}  // namespace keel::storage::detail
