// Run diff: aligns two recordings' op sequences step by step on op signatures and compares each
// aligned pair output by output (MD5, rounded MD5, dumped values, statistics). Pure: works on
// plain records, touches neither SQLite nor the engine. See docs/diff.md for the algorithm.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "keel/storage/errors.h"
#include "keel/storage/records.h"

namespace keel::storage {

// Verdict for one tensor or one aligned op pair, in increasing order of badness (Unmatched aside).
enum class DiffStatus : uint8_t { Equal = 0, WithinTolerance = 1, Diverged = 2, Unmatched = 3 };

// What settled a tensor's verdict.
enum class DiffBasis : uint8_t {
  None,        // nothing to compare (no MD5, stats or dumps): counted Equal, reported as uncompared
  Md5,         // exact MD5s equal
  RoundedMd5,  // rounded MD5s equal
  Values,      // dumped element values
  Stats,       // statistics (min, max, mean, std, absMax, NaN/Inf counts)
  Md5Only,     // MD5s differ and nothing finer was available
  Shape,       // shape or dtype differ
  Missing,     // the tensor exists on one side only
};
// An input's verdict is taken from its producer pair's output verdict when both runs read it from
// the aligned producer (TensorDiff::detail then names "output k of #seq").

const char* toString(DiffStatus s);
const char* toString(DiffBasis b);

// How the ops of two runs are paired (docs/diff.md). Signature: on exact op signatures, for one
// program on two backends, machines or commits. Module: across frameworks (a PyTorch run against
// a Keel run of the same model), by module scope, then op kind through one declared table, then
// position and output size within the module; views and copies are left out, and each pair is
// compared on its first output (Note [Diff across frameworks], diff_modules.cpp). Auto: Module
// when the recordings come from different frameworks, else Signature (diffRecordings decides;
// diffRuns takes Auto as Signature).
enum class DiffAlign : uint8_t { Auto, Signature, Module };
const char* toString(DiffAlign a);

struct DiffOptions {
  double atol = 1e-6;    // absolute tolerance
  double rtol = 1e-4;    // relative tolerance, against side B (|a - b| <= atol + rtol * |b|)
  uint64_t maxUlps = 0;  // > 0: an element within maxUlps (in its dtype) also passes
  bool useMd5 = true;
  bool useRoundedMd5 = true;
  bool useDumps = true;  // ask the DumpValues callback (when one is given)
  bool useStats = true;
  bool mismatchesOnly = false;        // DiffReport::pairs keeps only mismatches (isMismatch)
  bool unmatchedIsDivergent = false;  // an op on one side only makes the exit code 1
  int chainDepth = 6;                 // producer levels walked back from a divergence
  int chainMaxOps = 48;               // ops listed in a chain, all levels together
  // Cost budget (compared signatures) of the LCS on the part that differs; beyond it the aligner
  // falls back to a windowed greedy resync (see Note [Diff alignment] in diff_align.cpp).
  int64_t lcsBudget = 60'000'000;
  DiffAlign align = DiffAlign::Auto;
};

// Values of one dumped tensor, contiguous row-major, as doubles; nullopt when not dumped.
// role is static_cast<int>(Role); sideA tells which recording.
using DumpValues = std::function<std::optional<std::vector<double>>(uint64_t seq, int role,
                                                                    int index, bool sideA)>;

struct TensorDiff {
  Role role = Role::Output;
  int32_t index = 0;
  DiffStatus status = DiffStatus::Equal;
  DiffBasis basis = DiffBasis::None;
  double maxAbs = kNoValue;  // Values only
  double maxRel = kNoValue;  // Values only
  uint64_t maxUlps = 0;      // Values only; UINT64_MAX when a NaN meets a number
  int64_t badElements = 0;   // Values only: elements outside tolerance
  // Passed, but only because the tensor's values are at atol's scale: the two sides differ by
  // more than rtol of its largest magnitude (values, or min/max/absMax of statistics). A
  // difference can enter there unseen (a root divergence's input says so).
  bool atolScale = false;
  std::string detail;  // one short human phrase, e.g. "shape [2,3] vs [3,2]"
};

// One row of the alignment: an op pair, or an op on one side only (Unmatched).
struct OpPair {
  int64_t step = 0;
  bool inA = false, inB = false;
  uint64_t seqA = 0, seqB = 0;
  std::string name;  // side A's (side B's for an op only in B), as phase and scope
  Phase phase = Phase::Forward;
  std::string scope;
  std::string nameB;  // side B's name when it differs from A's, else ""
  int64_t stackIdA = -1, stackIdB = -1;
  KernelRecord kernelA, kernelB;  // the kernels that ran it (empty: not recorded, or a view)
  bool exactSignature = true;     // false: paired on (name, phase, scope) only; shapes differ
  std::string kind;               // Module alignment: the op kind both sides were paired on
  DiffStatus status = DiffStatus::Equal;
  std::vector<TensorDiff> outputs;
};

// An op in the chain that feeds a divergence, walked backwards through the producers of inputs
// (the ops of every step of the run: See Note [Producer] in producers.h).
struct ChainLink {
  int depth = 1;             // 1: direct producer of one of the divergent op's inputs
  uint64_t seq = 0;          // on the chain's side
  uint64_t consumerSeq = 0;  // the op it feeds
  int32_t consumerInput = 0;
  std::string name;
  Phase phase = Phase::Forward;
  std::string scope;
  int64_t stackId = -1;
  DiffStatus status = DiffStatus::Unmatched;  // its pair's verdict (Unmatched: not aligned)
};

// False for a pair counted Equal only because none of its outputs had anything to compare (no
// MD5, statistics or dumps on one side): views show it as "not compared", not as equal.
bool valuesCompared(const OpPair& p);
// A mismatch, as --mismatches-only and the studio's "Mismatches only" keep them: a pair outside
// tolerance, or an op on one side only (an equal pair or one within tolerance is none).
inline bool isMismatch(DiffStatus s) {
  return s == DiffStatus::Diverged || s == DiffStatus::Unmatched;
}

// Whether the two sides of a pair ran the same kernel variant (Note [Kernel identity]): Unknown
// when either side recorded none.
enum class KernelMatch : uint8_t { Unknown, Same, Different };
KernelMatch kernelMatch(const OpPair& p);
// The phrase a report puts beside a pair: "same kernel variant: V" or "different kernels: cpu V1 vs
// cpu-ref V2", "" when unknown. inputsEqual: every input of the pair compared equal, so the report
// can say "same inputs, different kernel". withParams: each side's run-time parameters too.
std::string kernelPhrase(const OpPair& p, bool inputsEqual, bool withParams);

struct Divergence {
  OpPair pair;
  std::vector<TensorDiff> inputs;  // input verdicts (A vs B, by input index)
  std::vector<ChainLink> chainA, chainB;
  // Module alignment: why this is the root when its inputs alone do not say (an op on one side
  // only that feeds the first divergence; ops with no counterpart on both sides); "" otherwise.
  std::string note;
};

struct StepDiff {
  int64_t step = 0;
  int64_t opsA = 0, opsB = 0;
  int64_t equal = 0, withinTolerance = 0, diverged = 0, onlyInA = 0, onlyInB = 0;
  int64_t notCompared = 0;  // aligned pairs whose outputs had nothing to compare (not in equal)
  std::string alignment;    // "identical", "lcs", "greedy", "module", "only-a", "only-b"
  int64_t viewsA = 0, viewsB = 0;  // Module alignment: views and copies, not compared
};

// One step's training loss on both sides (diffRecordings). A value the op diff cannot miss even
// when the recordings hold no MD5s or statistics: two runs recorded graph-only still show where
// their losses part.
struct LossDiff {
  int64_t step = 0;
  double a = kNoValue, b = kNoValue;  // kNoValue: a NaN loss, or none reported
  DiffStatus status = DiffStatus::Equal;
};

struct DiffReport {
  std::vector<StepDiff> steps;  // ascending step
  StepDiff total;               // step = -1, sums
  int64_t uncomparedTensors = 0;
  int64_t comparedTensors = 0;  // outputs of aligned pairs compared on some basis
  // What each side recorded of its tensors' values: "MD5s", "rounded MD5s", "statistics" or a
  // list of them ("MD5s and statistics"); "" for none (which side a NO VALUES COMPARED verdict is
  // about).
  std::string heldA, heldB;
  std::vector<LossDiff> losses;     // steps of both runs, when both report losses (diffRecordings)
  std::vector<OpPair> pairs;        // step order, then alignment order
  std::optional<Divergence> first;  // earliest diverged pair by side A's seq
  std::optional<Divergence> root;   // earliest diverged pair whose inputs all match (see docs)
  bool rootSearched = false;        // true when a divergence exists (root may still be empty)
  std::string noRoot;   // rootSearched without a root: why, naming the input the difference
                        // may come through (Note [Root candidates])
  DiffOptions options;  // align: the alignment used (never Auto)
  std::string frameworkA, frameworkB;  // "keel", "torch" (diffRecordings; "" from diffRuns)
  // How the two runs were set up differently, one line each (diffRecordings): seed, config keys,
  // layout, step counts, a run that did not finish, ops a capture filter left uncompared.
  std::vector<std::string> setup;
};

// Aligns two op sequences on their exact signatures (then, inside gaps, on name/phase/scope).
// Returns index pairs in order; -1 marks an op on one side only. Exposed for tests and views.
struct Alignment {
  std::vector<std::pair<int64_t, int64_t>> rows;
  std::vector<bool> exact;  // per row: matched on the full signature
  std::string method;       // "identical", "lcs" or "greedy"
};
Alignment alignOps(std::span<const OpRecord* const> a, std::span<const OpRecord* const> b,
                   const DiffOptions& opt = {});

// 64-bit hash of (name, phase, scope, per tensor: role, index, shape, dtype).
uint64_t opSignature(const OpRecord& op);

// Module alignment (Note [Diff across frameworks]): the kind an op name is paired on, from the
// one table of names that differ between Keel and ATen ("matmul" for Keel's matmul and ATen's
// mm, addmm, bmm; "layer_norm" for native_layer_norm), "" for a view or a copy (reshape, view,
// t, transpose, expand, contiguous, clone, ...), else the name itself.
std::string opKind(const std::string& name);
// Pairs the non-view ops of one step by (phase, scope, kind), then by position and output size
// within each; rows hold ops of both sides in side A's order (an op only in B after the pair
// before it in B). method "module".
Alignment alignModules(std::span<const OpRecord* const> a, std::span<const OpRecord* const> b,
                       const DiffOptions& opt = {});

// Compares one tensor of an aligned pair (same role and index on both sides). seqA/seqB are
// passed to the values callback.
TensorDiff compareTensors(const TensorRecord& a, const TensorRecord& b, uint64_t seqA,
                          uint64_t seqB, const DiffOptions& opt, const DumpValues& values);

// Element-wise value comparison in the given dtype: fills maxAbs, maxRel, maxUlps, badElements,
// status (Equal when bitwise equal in the dtype, else WithinTolerance or Diverged).
TensorDiff compareValues(const std::vector<double>& a, const std::vector<double>& b,
                         const std::string& dtype, const DiffOptions& opt);

// ULP distance of two values after rounding them to dtype (float32, float16, bfloat16, float64;
// integer dtypes: |a - b|). UINT64_MAX when exactly one is NaN; 0 for two NaNs and for ±0.
uint64_t ulpDistance(double a, double b, const std::string& dtype);

// "A vs B" with as many significant digits (6 to 17) as it takes to tell two different values
// apart: at six digits two values a diff calls different can print the same ("-0.464876 vs
// -0.464876"). NaN and infinities print as "nan", "inf", "-inf".
std::string numberPair(double a, double b, const char* sep = " vs ");

// Diffs two whole runs (ops in any order; grouped by step, ordered by seq). Throws StorageError
// on malformed input (e.g. duplicate seq on one side).
DiffReport diffRuns(const std::vector<OpRecord>& a, const std::vector<OpRecord>& b,
                    const DiffOptions& opt = {}, const DumpValues& values = {});

class Recording;
// The framework a recording comes from: "torch" for one written by keel_torch (its capture
// options say so), else "keel".
std::string recordingFramework(const RunInfo& run);
// Whether a recording holds tensor statistics (its capture options' "stats"; a recording whose
// options do not say is taken to have them).
bool recordedStatistics(const RunInfo& run);
// Two recordings diffed: options.align Auto becomes Module when their frameworks differ, else
// Signature; ops with dumped values on both sides are compared element by element. The one
// entry point of `keel diff` and the studio's comparison.
DiffReport diffRecordings(const Recording& a, const Recording& b, DiffOptions opt);

// Compares the losses of the steps both runs ended (endNs > 0): bitwise equal (two NaNs too),
// within tolerance, or diverged — a reported NaN loss against a number is diverged. A step whose
// loss is unknown on either side (not reported: Note [Reported NaN]) is left out.
std::vector<LossDiff> compareLosses(const std::vector<StepRecord>& a,
                                    const std::vector<StepRecord>& b, const DiffOptions& opt);
// The first step whose losses diverged, or nullptr.
const LossDiff* firstLossDivergence(const DiffReport& r);

// Equal: every aligned output that could be compared was, within tolerance. ValuesNotCompared:
// no divergence, but not one output could be compared (recordings made without MD5s, statistics
// or dumps), and neither could losses when no op had an output: only the op sequences (and the
// losses) were compared.
enum class DiffVerdict : uint8_t { Equal, Diverged, ValuesNotCompared };
DiffVerdict diffVerdict(const DiffReport& r);
// Why a ValuesNotCompared verdict: which side recorded what, what was compared instead and how
// to record the runs (one sentence, no newline).
std::string valuesNotComparedText(const DiffReport& r);

// 0: equal within tolerance, or values not compared; 1: divergent (Diverged pairs, diverged
// losses, or Unmatched ops when the options say so). The command-line tool adds 2 for errors.
int diffExitCode(const DiffReport& r);

std::string toJson(const DiffReport& r);
// Human report: verdict, per-step table, first and root divergence with chains, then the pairs
// (only the mismatches when mismatchesOnly). Stack ids are printed as "stack #id"; the
// caller appends symbolized stacks.
std::string toText(const DiffReport& r, bool mismatchesOnly);

}  // namespace keel::storage
