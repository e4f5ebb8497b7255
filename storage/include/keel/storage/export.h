// Exports of recorded op calls as text: Chrome trace events (JSON, opens in Perfetto) and CSV.
// Pure functions over records, tested as text. The dataflow graph's DOT is analysis/'s
// (keel/analysis/graph_dot.h), the one the studio lays out.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
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

// The exact first bytes of each export, by which the keel tool recognises an earlier export of
// the same kind that it may replace (keel::checkReplacesOnly): a trace starts with its keys in
// nlohmann's order, a CSV with its header row.
inline constexpr std::string_view kChromeTraceStart = R"({"displayTimeUnit":"ns","traceEvents":[)";
inline constexpr std::string_view kOpCsvHeader =
    "seq,step,phase,op,scope,thread,begin_ns,end_ns,forward_seq,inputs,outputs,md5_out0\n";
inline constexpr std::string_view kTensorCsvHeader =
    "seq,step,phase,op,scope,role,idx,tensor_id,version,buffer_id,shape,strides,offset,dtype,"
    "device,bytes,md5,md5_rounded,min,max,mean,std,abs_max,nan_count,inf_count,zero_count\n";

// The process a trace's events belong to: traces of a run's ranks loaded together in Perfetto
// fall on one process each (pid = rank + 1: Perfetto treats pid 0 as the kernel's idle process),
// named by a process_name metadata event ("" writes none).
struct TraceProcess {
  int64_t pid = 1;
  std::string name;
};

// Chrome trace event format: one complete event ("ph":"X") per op on its thread, one per step on
// a "steps" track, one instant event per log line on a "logs" track, and each device's allocated
// and reserved bytes as a counter ("ph":"C", a value each time it changes); times in microseconds.
// A step's args hold the metrics the trainer reported (loss, lr, grad_norm, aux_loss; a reported
// NaN as "NaN", one not reported left out). A step that never ended (a stopped, failed or still
// running recording) ends at its last recorded op, log line or memory event, with "incomplete":
// true in its args. Invalid UTF-8 in recorded strings is written as U+FFFD.
std::string toChromeTrace(const std::vector<OpRecord>& ops, const std::vector<StepRecord>& steps,
                          const std::vector<LogRecord>& logs = {},
                          const std::vector<MemRecord>& mems = {},
                          const TraceProcess& process = {});

// One row per op: seq, step, phase, op, scope, thread, begin_ns, end_ns, forward_seq, inputs,
// outputs, md5 of output 0 (RFC 4180 quoting; invalid UTF-8 written as U+FFFD).
std::string toCsv(const std::vector<OpRecord>& ops);

// One row per tensor an op saw: seq, step, phase, op, scope, role, idx, tensor_id, version,
// buffer_id, shape, strides, offset, dtype, device, bytes, md5, md5_rounded, min, max, mean, std,
// abs_max, nan_count, inf_count, zero_count (statistics empty when not captured; shapes as
// "4x16x64", a scalar's shape and strides "[]"). Doubles are written with 17 significant digits,
// so they read back exactly.
std::string toTensorCsv(const std::vector<OpRecord>& ops);

}  // namespace keel::storage
