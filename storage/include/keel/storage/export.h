// Exports of recorded op calls as text: Chrome trace events (JSON, opens in Perfetto) and CSV.
// Pure functions over records, tested as text. The dataflow graph's DOT is analysis/'s
// (keel/analysis/graph_dot.h), the one the studio lays out.
#pragma once
#include <string>
#include <vector>

#include "keel/storage/records.h"

namespace keel::storage {

// "[2,3]" ("[]" for a scalar). Inline: the reader's messages use it too, and the fuzz build of
// the reader (fuzz/CMakeLists.txt) does not compile the exports.
inline std::string shapeText(const std::vector<int64_t>& shape) {
  std::string r = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) r += ',';
    r += std::to_string(shape[i]);
  }
  return r + "]";
}
// The op's inputs or outputs as "[2,3] float32, [3] int64".
std::string tensorList(const OpRecord& op, Role role);

// Chrome trace event format: one complete event ("ph":"X") per op on its thread, one per step on
// a "steps" track, one instant event per log line on a "logs" track, and each device's allocated
// and reserved bytes as a counter ("ph":"C", a value each time it changes); times in microseconds.
std::string toChromeTrace(const std::vector<OpRecord>& ops, const std::vector<StepRecord>& steps,
                          const std::vector<LogRecord>& logs = {},
                          const std::vector<MemRecord>& mems = {});

// One row per op: seq, step, phase, op, scope, thread, begin_ns, end_ns, forward_seq, inputs,
// outputs, md5 of output 0 (RFC 4180 quoting).
std::string toCsv(const std::vector<OpRecord>& ops);

// One row per tensor an op saw: seq, step, phase, op, scope, role, idx, tensor_id, version,
// buffer_id, shape, strides, offset, dtype, device, bytes, md5, md5_rounded, min, max, mean, std,
// abs_max, nan_count, inf_count, zero_count (statistics empty when not captured; shapes as
// "4x16x64"). Doubles are written with 17 significant digits, so they read back exactly.
std::string toTensorCsv(const std::vector<OpRecord>& ops);

}  // namespace keel::storage
