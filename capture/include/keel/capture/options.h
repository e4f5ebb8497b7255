// CaptureOptions: what a Recorder records (graph, stacks, hashes, stats, dumps, logs, allocator
// events), which ops (filters by name, scope prefix and step range), and how the queue behaves.
// Round-trips through JSON (stored in RunInfo.captureOptionsJson); unknown keys are an error.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace keel::capture {

enum class DropPolicy : uint8_t { Block, Drop };   // queue full: block the engine | drop and count
enum class ErrorPolicy : uint8_t { Stop, Throw };  // writer failed: stop recording | throw once

// Which op calls a record or dump applies to. Empty lists / prefix match everything; the step
// range is inclusive (step 0 is initialisation, before the first training step).
struct OpFilter {
  std::vector<std::string> ops;  // op names, e.g. {"matmul", "softmax"}
  std::string scope;             // scope prefix on a dot boundary, e.g. "blocks.1"
  int64_t stepMin = 0;
  int64_t stepMax = std::numeric_limits<int64_t>::max();
  bool matches(const std::string& op, std::string_view scopePath, int64_t step) const;
  bool matchesStep(int64_t step) const { return step >= stepMin && step <= stepMax; }
  bool operator==(const OpFilter&) const = default;
};

struct CaptureOptions {
  bool graph = true;       // op records with their tensors (the graph)
  bool stacks = false;     // native call stack per op (and per allocator event)
  bool md5 = false;        // exact MD5 of every host tensor an op reads or writes
  int roundedMd5 = 0;      // significant digits of the rounded MD5; 0 = off
  bool stats = false;      // min/max/mean/std/absMax/NaN/Inf/zero counts of float tensors
  bool dumps = false;      // zstd-compressed output values of ops matching dumpFilter
  OpFilter dumpFilter;     // which ops' outputs are dumped (when dumps is on)
  bool logs = true;        // keel::log lines
  bool allocator = false;  // allocator events
  OpFilter filter;         // which op calls are recorded (steps also bound logs and mem events)
  int64_t queueCapacity = 65536;  // records between the engine thread and the writer thread
  DropPolicy dropPolicy = DropPolicy::Block;
  ErrorPolicy onError = ErrorPolicy::Stop;
  int64_t commitEvery = 4096;  // records per transaction (also every ~100 ms and each step end)
  int64_t commitIntervalMs = 100;
  // MD5s and statistics computed on the capture's hashing thread while the engine goes on (Note
  // [Hashing off the engine thread]); false: on the engine thread inside each op's callback.
  bool hashThread = true;
  // Element bytes waiting to be hashed beyond which the engine waits (dropPolicy block: it hashes
  // queued tensors itself) or records tensors without checksums, counted (drop).
  int64_t hashBacklogBytes = int64_t(64) << 20;
  // MD5 lanes of the hashing thread: 0 md5LaneWidth(), or 1, 8, 16, 32, 48 (md5_multi.h).
  int64_t hashLanes = 0;

  std::string toJson() const;
  // Throws keel::Error on malformed JSON, an unknown key or a bad value.
  static CaptureOptions fromJson(const std::string& json);
  bool operator==(const CaptureOptions&) const = default;
};

std::string dropPolicyName(DropPolicy p);
std::string errorPolicyName(ErrorPolicy p);

}  // namespace keel::capture
