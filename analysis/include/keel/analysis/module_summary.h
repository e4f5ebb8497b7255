// Module summaries: what a module of one step holds at a glance (op count, total op time, bytes its
// ops' outputs take, non-finite outputs, the worst divergence inside), for the graph's collapsed
// module nodes and its zoomed-out cluster blocks. Plain values, no Qt; see Note [Module summary].
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "keel/analysis/graph_dot.h"
#include "keel/storage/diff.h"
#include "keel/storage/records.h"

namespace keel::analysis {

struct ModuleSummary {
  int64_t ops = 0;
  int64_t timeNs = 0;        // summed (end - begin) of its ops
  int64_t bytes = 0;         // summed bytes of its ops' outputs (what the step allocated for them)
  int64_t nonFiniteOps = 0;  // ops where NaN/Inf values appear (needs --stats)
  std::optional<storage::DiffStatus> worst;  // worst verdict of its ops (with verdicts given)
  bool firstDivergence = false;              // holds the run's first divergence
};

// Verdicts of one side's ops, by seq, and that side's first divergence.
struct OpVerdicts {
  std::unordered_map<uint64_t, storage::DiffStatus> status;
  std::optional<uint64_t> first;
  bool missingAreEqual = false;  // the diff kept mismatches only: an op not listed was equal
};

// What marks an op in the graph's non-finite colouring: See Note [Non-finite colouring].
enum class NonFiniteMark { None, Fed, NonFinite };
// The summary of the ops `seqs` among `ops` (one step, by seq); seqs not in `ops` are skipped.
// `marks`: nonFiniteMarks(ops), computed once by a caller summarizing many modules (without it,
// an op counts as non-finite where NaN/Inf values appear in it).
ModuleSummary summarizeOps(std::span<const storage::OpRecord> ops, std::span<const uint64_t> seqs,
                           const OpVerdicts* verdicts = nullptr,
                           const std::vector<NonFiniteMark>* marks = nullptr);

// "f:<scope>", "b:<scope>", "o:<scope>": the key of a module of one phase.
std::string moduleKey(Phase phase, std::string_view scope);

// Every module of `graph` (each scope prefix of each op drawn, in its phase; adopted scopes as
// drawn), keyed by moduleKey. An op counts in its module and in every module above it.
std::unordered_map<std::string, ModuleSummary> summarizeModules(
    std::span<const storage::OpRecord> ops, const GraphDot& graph,
    const OpVerdicts* verdicts = nullptr);

// "1 op", "12 ops"; "850 ns", "12.5 us", "3.20 ms", "1.25 s".
std::string opCountText(int64_t ops);
std::string durationText(int64_t ns);
// The summary's lines: {"12 ops, 3.20 ms, 1.50 MiB"} then, when there is one, a line for what is
// wrong inside: "3 ops non-finite", "diverged (first divergence)", "within tolerance", ...
std::vector<std::string> summaryLines(const ModuleSummary& s);
// How bad a pair's verdict is, for "the worst inside": Equal 0 < Unmatched 1 < WithinTolerance 2
// < Diverged 3.
int verdictRank(storage::DiffStatus s);

// For each of `ops`: NonFinite when it holds a fault's NaN or Inf (where they appear, or
// carried on: Note [Non-finite colouring]), Fed when it reads an output of such an op (by the one
// producer definition, buildDataflow) and is not one itself; a mask's infinities mark nothing.
std::vector<NonFiniteMark> nonFiniteMarks(std::span<const storage::OpRecord> ops);

}  // namespace keel::analysis
