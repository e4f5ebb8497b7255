// Plain value structs for everything a recording holds. capture/ fills them and hands them to the
// Writer; the Reader returns them. No engine types here: storage depends on nothing but SQLite.
// Times are integer nanoseconds; sequence numbers are the engine's op sequence numbers.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "keel/base/vocabulary.h"

namespace keel::storage {

inline constexpr double kNoValue = std::numeric_limits<double>::quiet_NaN();
// The most bytes one allocator event may claim (16 TiB, as keel/alloc_trace.h's kMaxTraceBlock):
// the reader calls a recording with more damaged, and importers refuse files that claim more.
inline constexpr uint64_t kMaxMemEventBytes = uint64_t(1) << 44;

struct RunInfo {
  std::string backend;     // "cpu", "cpu-ref", "cuda"
  std::string device;      // "cpu", "cuda:0"
  std::string host;        // hostname
  std::string configJson;  // the model/training config, verbatim
  uint64_t seed = 0;
  std::string engineVersion;       // e.g. "0.1.0"
  int64_t startTimeUnixNs = 0;     // wall clock at start
  std::string captureOptionsJson;  // what was recorded (CaptureOptions as JSON)
  std::string status = "running";  // running | finished | stopped: <reason> | failed: <reason>
  std::string allocator;           // host allocator the run used: host | caching | vmm ("" unknown)
  // A multi-rank run (keel/dist.h): this process's rank, the ranks, and the layout ("dp 2 x tp
  // 2"); 0, 1 and "" for a process alone (and before schema v8).
  int64_t rank = 0;
  int64_t worldSize = 1;
  std::string layout;
};

// Note [Reported NaN]: a step's metric is NaN when it is unknown (not reported, or the step did
// not end) and when the trainer reported a NaN (a loss gone NaN) — SQLite stores NaN as NULL, so
// the file cannot tell them apart by the value. StepRecord::nanMetrics (the steps table's
// nan_metrics, schema v9) holds one bit per metric that is a reported NaN.
enum class StepMetric : uint8_t { Loss, Lr, GradNorm, TokensPerSec, AuxLoss, ValLoss };
constexpr uint8_t stepMetricBit(StepMetric m) {
  return uint8_t(1u << unsigned(m));
}

struct StepRecord {
  int64_t step = 0;  // 1-based training step
  int64_t beginNs = 0, endNs = 0;
  double loss = kNoValue;
  // What the trainer reported at the step's end (kNoValue where it did not, or before schema v5).
  double lr = kNoValue, gradNorm = kNoValue, tokensPerSec = kNoValue, auxLoss = kNoValue;
  double valLoss = kNoValue;  // validation loss, on steps that evaluated one (schema v6)
  uint8_t nanMetrics = 0;     // stepMetricBit()s of the metrics that are reported NaNs
  double value(StepMetric m) const;
  // The metric was reported: a value, or a NaN the trainer gave (not unknown).
  bool reported(StepMetric m) const {
    return !std::isnan(value(m)) || (nanMetrics & stepMetricBit(m)) != 0;
  }
};

inline double StepRecord::value(StepMetric m) const {
  switch (m) {
    case StepMetric::Loss:
      return loss;
    case StepMetric::Lr:
      return lr;
    case StepMetric::GradNorm:
      return gradNorm;
    case StepMetric::TokensPerSec:
      return tokensPerSec;
    case StepMetric::AuxLoss:
      return auxLoss;
    case StepMetric::ValLoss:
      return valLoss;
  }
  return kNoValue;
}

enum class Role : uint8_t { Input = 0, Output = 1 };

struct TensorStats {
  double min = kNoValue, max = kNoValue, mean = kNoValue, std = kNoValue, absMax = kNoValue;
  int64_t nanCount = 0, infCount = 0, zeroCount = 0;
};

struct TensorRecord {
  Role role = Role::Input;
  int32_t index = 0;      // position among the op's inputs or outputs
  uint64_t tensorId = 0;  // engine tensor id: stable for the tensor's lifetime
  uint64_t version = 0;   // buffer version when seen (in-place writes bump it)
  uint64_t bufferId = 0;  // identity of the underlying buffer (views share it)
  std::vector<int64_t> shape, strides;
  int64_t offset = 0;
  // "float32", ... Text, not keel::DType: a recording may hold tensors of other frameworks (a
  // PyTorch run's uint8 or float8) that the engine has no dtype for, and storage keeps them.
  std::string dtype;
  std::string device;      // "cpu", ...
  int64_t bytes = 0;       // numel * element size
  std::string md5;         // 32 hex chars, empty when not hashed (see docs/capture.md)
  std::string md5Rounded;  // hash of values rounded to N significant digits, empty when off
  bool hasStats = false;
  TensorStats stats;
};

// Which kernel ran an op call (Note [Kernel identity] in the engine's keel/registry.h): its
// backend, its variant — what decides its numerics: algorithm, accumulation dtype, reduction order
// — and the call's run-time parameters (ISA, BLAS core, threads, tiles). Two calls ran the same
// kernel variant when their variants are equal, whatever the backend. An empty backend: none
// recorded (a view, a recording older than schema v7, another framework's op).
struct KernelRecord {
  std::string backend, variant, params;
  bool empty() const { return backend.empty(); }
  bool operator==(const KernelRecord&) const = default;
};

struct OpRecord {
  uint64_t seq = 0;  // engine op sequence number (unique in a run, increasing)
  int64_t step = 0;  // 0 before the first step (initialisation)
  Phase phase = Phase::Forward;
  std::string name;  // op name
  std::string attrsJson;
  std::string scope;   // module scope path
  int64_t thread = 0;  // small integer id of the engine thread
  int64_t beginNs = 0, endNs = 0;
  uint64_t forwardSeq = 0;  // backward ops: the forward op's seq; else 0
  int64_t stackId = -1;     // -1: no stack captured
  KernelRecord kernel;      // the kernel that ran it (schema v7)
  std::vector<TensorRecord> tensors;
};

// Note [Where non-finite values appear]
// "First NaN/Inf" (keel inspect, the studio's banner, --break-on nan's report, the nonfinite_ops
// index) names the op where non-finite values appear, not every op that holds them (needs
// statistics). An op is such a place when an output holds a NaN, or holds more infinities than
// its inputs could have carried into it (`scores + mask` carries the mask's -inf along, counted
// once per broadcast copy; an overflow to +inf of the unmasked entries adds more) — unless it is
// a masking fill (masked_fill, fill, full, where, ...: ops that only place values they are
// given, as -inf before a softmax; a PyTorch causal mask read as the run's first NaN/Inf, hiding
// a real one behind it). A NaN is always such a place. The graph's colouring (Note [Non-finite
// colouring]) follows the values from there: an op holding a fault's NaN or Inf is red, an
// op holding only a mask's infinities is not.
bool isMaskingFill(const std::string& opName);
bool holdsNonFinite(const OpRecord& op);  // an output's statistics count a NaN or an Inf
bool nonFiniteAppearsAt(const OpRecord& op);

struct StackFrame {
  uint64_t address = 0;
  std::string function;  // demangled, "" if unknown
  std::string file;      // "" if unknown
  int32_t line = 0;
};

struct StackRecord {
  int64_t id = -1;                 // assigned by capture (dedup key), stable within a recording
  std::vector<StackFrame> frames;  // innermost first
};

// The shared vocabulary's enums (keel/base/vocabulary.h): records carry them, not their names.
using keel::LogLevel;
using keel::MemEventKind;
using keel::MemTag;
using keel::Phase;

struct LogRecord {
  uint64_t opSeq = 0;  // op being dispatched (or the last one) when the line was logged
  int64_t step = 0;
  LogLevel level = LogLevel::Info;
  std::string scope;  // module scope path or named log scope
  std::string message;
  int64_t timeNs = 0;
};

struct MemRecord {
  MemEventKind kind = MemEventKind::Alloc;
  std::string device;
  uint64_t address = 0, bytes = 0, toAddress = 0;
  uint64_t opSeq = 0;  // 0 outside ops
  int64_t step = 0;
  int64_t stackId = -1;
  int64_t timeNs = 0;
  uint64_t allocatedAfter = 0, reservedAfter = 0;
  uint64_t bufferId = 0;      // alloc/free/compact of an engine Buffer (tensors' bufferId); else 0
  MemTag tag = MemTag::None;  // alloc: what the block holds (None: an op's output or temporary)
  std::string label;          // track_begin/track_end: the section's name; alloc: kLiveBefore
};

// The label of the alloc (and reserve/map/unmap) events a capture that starts mid-run (at a step
// range's first step) writes for what was already live then (Note [A step range's first step]).
inline constexpr std::string_view kLiveBefore = "live before the recording";

struct DumpRecord {
  uint64_t opSeq = 0;
  Role role = Role::Output;
  int32_t index = 0;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string codec = "zstd";  // compression of data
  int64_t rawBytes = 0;        // uncompressed size (contiguous row-major elements)
  std::vector<uint8_t> data;   // compressed bytes
};

}  // namespace keel::storage
