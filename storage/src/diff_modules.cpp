// Run diff across frameworks (see diff.h, docs/diff.md): the table of op kinds, the module
// alignment of one step, and the recordings' entry point that chooses the alignment. See
// Note [Diff across frameworks].
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "diff_util.h"
#include "keel/base/text.h"
#include "keel/storage/diff.h"
#include "keel/storage/producers.h"
#include "keel/storage/reader.h"

namespace keel::storage {

// Note [Diff across frameworks]
// A PyTorch run and a Keel run of one model (tests/python/keel_gpt.py against configs/*.json)
// execute different ops: ATen's `mm`/`bmm` where Keel has `matmul`, `native_layer_norm` for
// `layer_norm`, `_log_softmax` + `nll_loss_forward` for `cross_entropy`, attention as bmm +
// softmax where Keel runs one flashmask_attention, and views (`t`, `view`, `_unsafe_view`,
// `transpose`) Keel does not record as the same ops, if at all. Op signatures never match, so
// the signature LCS would pair nothing. The module alignment pairs the way msprobe or torchtitan's
// numerics comparisons do, narrowing three times:
//  1. by module scope (and phase): both recorders name a scope by the module path
//     (`blocks.1.mlp.w1`), so a model written with the same module names lines up module by
//     module whatever runs inside;
//  2. by op kind, through kKinds below, the one declared table of names that differ; a name not
//     in it is its own kind (`silu`, `add`, `embedding` are spelled alike);
//  3. by position and output size within a (phase, scope, kind) group: the k-th op of a
//     first-output element count and dtype meets the k-th of the same size on the other side
//     (whatever lies between: PyTorch computes a matmul's weight gradient before its input
//     gradient, Keel after), unless one of the next few reads more of the values it reads (the
//     two gradients of `x * y` have one size; the one by x reads y on both sides); an op with no
//     same-sized partner stays one-sided.
// Views and copies (kind "") are left out of the pairing and counted per step: they move no
// value, and a reshape in one framework is a stride change in the other.
// A pair is compared on its first output, the value the model goes on with (the other outputs
// are framework-specific: saved means, indices, workspaces); shapes may differ where the element
// count and dtype agree (`[B*T, C]` against `[B, T, C]`): dumped values and statistics are of
// the elements in row-major order, MD5s are not used then (Keel's digest ends with the shape).
// Two frameworks seldom agree to the bit, so statistics within tolerance are the usual verdict.
// The root divergence (diff.cpp, rootAcross) walks back from a diverged pair through views to
// the ops that fed it: when every one of them is a pair that passed, the pair itself is the root;
// when one is one-sided and everything feeding it passed, that op is (an op on one side only
// that changed a value the other side did not: the injected `add` of a forward hook); when both
// sides have one, the pair is, with a note naming both (two decompositions that disagree).

namespace {

struct KindEntry {
  std::string_view name, kind;
};

// Names that differ between Keel's ops (docs/ops.md) and ATen's (native_functions.yaml), by the
// kind they are paired on; kind "" is a view or a copy. Sorted by name for the lookup. Not here
// on purpose: addmm and baddbmm (x·Wᵀ + b in one op, where Keel runs matmul then add: pairing
// either with the matmul would compare values that differ by the bias).
constexpr std::array kKinds = std::to_array<KindEntry>({
    {"_log_softmax", "log_softmax"},
    {"_log_softmax_backward_data", "cross_entropy_backward"},
    {"_reshape_alias", ""},
    {"_softmax", "softmax"},
    {"_softmax_backward_data", "softmax_backward"},
    {"_to_copy", "cast"},
    {"_unsafe_view", ""},
    {"add_scalar", "add"},
    {"alias", ""},
    {"as_strided", ""},
    {"bmm", "matmul"},
    {"cat", "concat"},
    {"clone", ""},
    {"contiguous", ""},
    {"detach", ""},
    {"embedding_dense_backward", "embedding_backward"},
    {"expand", ""},
    {"flatten", ""},
    {"full", "fill"},
    {"full_like", "fill"},
    {"lift_fresh", ""},
    {"linear", "matmul"},
    {"matmul", "matmul"},
    {"mm", "matmul"},
    {"mul_scalar", "mul"},
    {"narrow", ""},
    {"native_layer_norm", "layer_norm"},
    {"native_layer_norm_backward", "layer_norm_backward"},
    {"new_ones", "fill"},
    {"new_zeros", "fill"},
    {"nll_loss_forward", "cross_entropy"},
    {"ones", "fill"},
    {"ones_like", "fill"},
    {"permute", ""},
    {"pow_scalar", "pow"},
    {"reshape", ""},
    {"select", ""},
    {"slice", ""},
    {"split", ""},
    {"split_with_sizes", ""},
    {"squeeze", ""},
    {"t", ""},
    {"transpose", ""},
    {"unsqueeze", ""},
    {"view", ""},
    {"zero", "fill"},
    {"zeros", "fill"},
    {"zeros_like", "fill"},
});

constexpr bool sortedByName() {
  for (size_t i = 1; i < kKinds.size(); ++i)
    if (!(kKinds[i - 1].name < kKinds[i].name)) return false;
  return true;
}
static_assert(sortedByName(), "kKinds must be sorted by name");

// What ops of one (phase, scope, kind) group are paired on: the first output's element count and
// dtype.
uint64_t sizeKey(const OpRecord& op) {
  const TensorRecord* t = detail::firstOutput(op);
  if (!t) return 0x9e3779b97f4a7c15ull;
  uint64_t h = static_cast<uint64_t>(detail::elementCount(t->shape)) * 0x100000001b3ull;
  for (char c : t->dtype) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

}  // namespace

std::vector<size_t> detail::feedersThroughViews(std::span<const OpRecord* const> ops,
                                                const ProducerIndex& index, size_t pos,
                                                int budget) {
  std::vector<size_t> out, todo{pos};
  std::unordered_set<size_t> seen;
  for (; !todo.empty() && budget > 0; --budget) {
    const OpRecord& op = *ops[todo.back()];
    todo.pop_back();
    for (const TensorRecord& t : op.tensors) {
      if (t.role != Role::Input) continue;
      const std::optional<size_t> p = index.find(t, op.seq);
      if (!p || !seen.insert(*p).second) continue;
      (opKind(ops[*p]->name).empty() ? todo : out).push_back(*p);
    }
  }
  return out;
}

std::string opKind(const std::string& name) {
  auto it = std::lower_bound(kKinds.begin(), kKinds.end(), name,
                             [](const KindEntry& e, const std::string& n) { return e.name < n; });
  if (it != kKinds.end() && it->name == name) return std::string(it->kind);
  // In-place ATen variants (add_, mul_) are their op's kind.
  if (name.size() > 1 && name.back() == '_' && name[name.size() - 2] != '_')
    return opKind(name.substr(0, name.size() - 1));
  return name;
}

Alignment alignModules(std::span<const OpRecord* const> a, std::span<const OpRecord* const> b,
                       const DiffOptions&) {
  // B's ops by (phase, scope, kind, first-output size), in order; views and copies left out.
  auto key = [](const OpRecord& op, const std::string& kind) {
    std::string k(phaseName(op.phase));
    k += '\0';
    k += op.scope;
    k += '\0';
    k += kind;
    k += '\0';
    k += std::to_string(sizeKey(op));
    return k;
  };
  std::vector<std::string> kindA(a.size()), kindB(b.size());
  for (size_t i = 0; i < a.size(); ++i) kindA[i] = opKind(a[i]->name);
  std::unordered_map<std::string, std::vector<size_t>> bucketsB;
  for (size_t j = 0; j < b.size(); ++j)
    if (!(kindB[j] = opKind(b[j]->name)).empty()) bucketsB[key(*b[j], kindB[j])].push_back(j);

  const ProducerIndex prodA(a), prodB(b);  // the step's ops: Note [Producer]
  constexpr int64_t kNone = -1;
  std::vector<int64_t> partnerOfA(a.size(), kNone), partnerOfB(b.size(), kNone);
  // How many of the values op i of A reads come from ops paired with the producers of what op j
  // of B reads.
  // `mine`: op i's feeders (computed once per op of A, by the caller).
  auto scoreOf = [&](const std::vector<size_t>& mine, size_t j) {
    const std::vector<size_t> theirs = detail::feedersThroughViews(b, prodB, j, 64);
    const std::unordered_set<size_t> theirSet(theirs.begin(), theirs.end());
    int score = 0;
    for (size_t f : mine)
      if (partnerOfA[f] != kNone && theirSet.count(static_cast<size_t>(partnerOfA[f]))) ++score;
    return score;
  };
  std::unordered_map<std::string, size_t> firstFree;  // per bucket: where its unpaired ops begin
  for (size_t i = 0; i < a.size(); ++i) {
    if (kindA[i].empty()) continue;
    const std::string k = key(*a[i], kindA[i]);
    auto it = bucketsB.find(k);
    if (it == bucketsB.end()) continue;
    const std::vector<size_t>& bucket = it->second;
    size_t& from = firstFree[k];
    while (from < bucket.size() && partnerOfB[bucket[from]] != kNone) ++from;
    if (from == bucket.size()) continue;
    // The first unpaired op of the bucket, unless a later one (of the next few) reads more of
    // the values this op reads: a gradient of `x * y` by x meets the one by x, although the two
    // frameworks compute them in the other order (same size, same kind, same module).
    // At most 8 candidates, looked for among at most 64 entries (entries paired out of order
    // pile up behind one nobody took; the walk stays bounded).
    size_t best = bucket[from];
    int bestScore = -1;
    std::vector<size_t> mine;
    bool haveMine = false;
    for (size_t c = from, seen = 0; c < bucket.size() && seen < 8 && c < from + 64; ++c) {
      const size_t j = bucket[c];
      if (partnerOfB[j] != kNone) continue;
      ++seen;
      if (c + 1 == bucket.size() && seen == 1) break;  // the only candidate
      if (!haveMine) mine = detail::feedersThroughViews(a, prodA, i, 64), haveMine = true;
      if (const int sc = scoreOf(mine, j); sc > bestScore) best = j, bestScore = sc;
    }
    partnerOfA[i] = static_cast<int64_t>(best);
    partnerOfB[best] = static_cast<int64_t>(i);
  }
  // Ops one framework runs outside every module (Keel's gradient accumulation into a tensor
  // read twice, scope "") meet their counterpart in any module when they read the same values.
  auto looseKey = [](const OpRecord& op, const std::string& kind) {
    return std::string(phaseName(op.phase)) + '\0' + kind + '\0' + std::to_string(sizeKey(op));
  };
  // Unpaired B ops by (phase, kind, size): [0] those outside every module, [1] the others (an A
  // op in a module meets only the first kind, so a run whose module names all differ does not
  // make every A op try every B op).
  std::unordered_map<std::string, std::vector<size_t>> looseB[2];
  for (size_t j = 0; j < b.size(); ++j)
    if (!kindB[j].empty() && partnerOfB[j] == kNone)
      looseB[b[j]->scope.empty() ? 0 : 1][looseKey(*b[j], kindB[j])].push_back(j);
  for (size_t i = 0; i < a.size(); ++i) {
    // Not the optimizer's ops: frameworks split its work differently (Keel squares gradients
    // with `mul` to clip them, PyTorch scales them with `mul_`), which reads the same values.
    if (kindA[i].empty() || partnerOfA[i] != kNone || a[i]->phase == Phase::Optimizer) continue;
    const std::string k = looseKey(*a[i], kindA[i]);
    int bestScore = 0;
    int64_t best = kNone;
    int tried = 0;
    std::vector<size_t> mine;
    for (int group = 0; group < (a[i]->scope.empty() ? 2 : 1); ++group) {
      auto it = looseB[group].find(k);
      if (it == looseB[group].end()) continue;
      for (size_t j : it->second) {
        if (++tried > 16) break;  // paired entries count too: the walk stays bounded
        if (partnerOfB[j] != kNone) continue;
        if (mine.empty()) mine = detail::feedersThroughViews(a, prodA, i, 64);
        if (const int sc = scoreOf(mine, j); sc > bestScore)
          bestScore = sc, best = static_cast<int64_t>(j);
      }
    }
    if (best == kNone) continue;
    partnerOfA[i] = best;
    partnerOfB[static_cast<size_t>(best)] = static_cast<int64_t>(i);
  }
  std::vector<bool> inRows(a.size()), inRowsB(b.size());
  for (size_t i = 0; i < a.size(); ++i) inRows[i] = !kindA[i].empty();
  for (size_t j = 0; j < b.size(); ++j) inRowsB[j] = !kindB[j].empty();
  // Rows in side A's order; an op only in B goes after the row of the last B op paired before
  // it (before every row when none was).
  struct Placed {
    int64_t anchor;  // side A position the row sorts by (-1: before all)
    int64_t sub;     // 0 for a row with A, 1 + B position for a B-only row
    int64_t i, j;
  };
  std::vector<Placed> placed;
  for (size_t i = 0; i < a.size(); ++i)
    if (inRows[i])
      placed.push_back({static_cast<int64_t>(i), 0, static_cast<int64_t>(i), partnerOfA[i]});
  int64_t lastAnchor = -1;
  for (size_t j = 0; j < b.size(); ++j) {
    if (partnerOfB[j] != kNone) {
      lastAnchor = partnerOfB[j];
    } else if (inRowsB[j]) {
      placed.push_back({lastAnchor, 1 + static_cast<int64_t>(j), kNone, static_cast<int64_t>(j)});
    }
  }
  std::sort(placed.begin(), placed.end(), [](const Placed& x, const Placed& y) {
    return x.anchor != y.anchor ? x.anchor < y.anchor : x.sub < y.sub;
  });
  Alignment al;
  al.method = "module";
  for (const Placed& p : placed) {
    al.rows.emplace_back(p.i, p.j);
    al.exact.push_back(true);
  }
  return al;
}

namespace {
// A recording's capture options as JSON; null when there are none or they cannot be read (they
// then say nothing, and each reader keeps its default).
nlohmann::json captureOptions(const RunInfo& run) {
  if (run.captureOptionsJson.empty()) return nullptr;
  try {
    checkJsonDepth(run.captureOptionsJson, "capture options");  // Note [Bounded JSON]
    nlohmann::json j = nlohmann::json::parse(run.captureOptionsJson);
    return j.is_object() ? j : nlohmann::json(nullptr);
  } catch (const std::exception&) {
    return nullptr;
  }
}
}  // namespace

std::string recordingFramework(const RunInfo& run) {
  const nlohmann::json j = captureOptions(run);
  return j.contains("framework") && j["framework"].is_string() ? j["framework"].get<std::string>()
                                                               : "keel";
}

bool recordedStatistics(const RunInfo& run) {
  const nlohmann::json j = captureOptions(run);
  return !j.contains("stats") || !j["stats"].is_boolean() || j["stats"].get<bool>();
}

namespace {

// The op filter a recording was made with (capture options "filter": --step-range, --scope,
// --ops); nullopt when it recorded every op.
struct RecordedFilter {
  std::vector<std::string> ops;
  std::string scope;
  int64_t stepMin = 0, stepMax = std::numeric_limits<int64_t>::max();
  bool matches(const OpRecord& op) const {
    if (op.step < stepMin || op.step > stepMax) return false;
    if (!ops.empty() && std::find(ops.begin(), ops.end(), op.name) == ops.end()) return false;
    return scopeWithin(op.scope, scope);
  }
  std::string text() const {
    std::vector<std::string> parts;
    if (stepMin > 0 || stepMax < std::numeric_limits<int64_t>::max())
      parts.push_back("--step-range " + std::to_string(stepMin) + ":" +
                      (stepMax == std::numeric_limits<int64_t>::max() ? std::string()
                                                                      : std::to_string(stepMax)));
    if (!scope.empty()) parts.push_back("--scope " + scope);
    if (!ops.empty()) parts.push_back("--ops " + joinText(ops, ","));
    return joinText(parts, " ");
  }
};

std::optional<RecordedFilter> recordedFilter(const RunInfo& run) {
  const nlohmann::json j = captureOptions(run);
  if (!j.is_object() || !j.contains("filter") || !j["filter"].is_object()) return std::nullopt;
  const nlohmann::json& f = j["filter"];
  RecordedFilter r;
  try {
    if (f.contains("ops") && f["ops"].is_array())
      for (const auto& o : f["ops"])
        if (o.is_string()) r.ops.push_back(o.get<std::string>());
    if (f.contains("scope") && f["scope"].is_string()) r.scope = f["scope"].get<std::string>();
    if (f.contains("step_min") && f["step_min"].is_number_integer())
      r.stepMin = f["step_min"].get<int64_t>();
    if (f.contains("step_max") && f["step_max"].is_number_integer())
      r.stepMax = f["step_max"].get<int64_t>();
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
  if (r.text().empty()) return std::nullopt;
  return r;
}

// Drops the ops `filter` would not have recorded; returns how many.
int64_t dropOutside(std::vector<OpRecord>& ops, const RecordedFilter& filter) {
  const size_t before = ops.size();
  std::erase_if(ops, [&](const OpRecord& op) { return !filter.matches(op); });
  return int64_t(before - ops.size());
}

std::string runEnding(const RunInfo& run) {
  if (run.status == "finished") return {};
  if (run.status.rfind("running", 0) == 0)
    return "did not finish (status running: killed, crashed or still being written)";
  return "did not finish (" + run.status + ")";
}

// What set the two runs apart before any op ran (Note [Setup differences]): said beside the
// verdict, so "EQUAL" over the steps both have, or a divergence from the first random op, is
// read with it.
std::vector<std::string> setupDifferences(const Recording& a, const Recording& b,
                                          const std::vector<StepRecord>& stepsA,
                                          const std::vector<StepRecord>& stepsB) {
  std::vector<std::string> out;
  const RunInfo &ra = a.run(), &rb = b.run();
  if (ra.backend != rb.backend) out.push_back("backend " + ra.backend + " vs " + rb.backend);
  // Across frameworks the seeds drive different generators (a PyTorch run compared with Keel's
  // starts from Keel's saved weights and batches), and a config names only what its own side
  // reads: the seed, and keys one side lacks, are no setup difference there.
  const bool sameFramework = recordingFramework(ra) == recordingFramework(rb);
  if (ra.seed != rb.seed && sameFramework)
    out.push_back("seed " + std::to_string(ra.seed) + " vs " + std::to_string(rb.seed) +
                  ": every random op differs from the first (initialisation, data, dropout)");
  try {
    const nlohmann::json ca = nlohmann::json::parse(ra.configJson.empty() ? "{}" : ra.configJson);
    const nlohmann::json cb = nlohmann::json::parse(rb.configJson.empty() ? "{}" : rb.configJson);
    if (ca.is_object() && cb.is_object() && ca != cb) {
      std::vector<std::string> keys;
      for (const auto& [k, v] : ca.items())
        if (cb.contains(k) ? cb[k] != v : sameFramework) keys.push_back(k);
      for (const auto& [k, v] : cb.items())
        if (!ca.contains(k) && sameFramework) keys.push_back(k);
      std::vector<std::string> shown;
      for (size_t i = 0; i < keys.size() && i < 5; ++i) {
        const std::string& k = keys[i];
        shown.push_back(k + " " + (ca.contains(k) ? ca[k].dump() : std::string("-")) + " vs " +
                        (cb.contains(k) ? cb[k].dump() : std::string("-")));
      }
      if (keys.size() > shown.size())
        shown.push_back("and " + std::to_string(keys.size() - shown.size()) + " more");
      if (!shown.empty()) out.push_back("config: " + joinText(shown, ", "));
    }
  } catch (const nlohmann::json::exception&) {
    if (ra.configJson != rb.configJson) out.push_back("config: the two configs differ");
  }
  if (ra.worldSize != rb.worldSize || ra.layout != rb.layout)
    out.push_back("layout " + (ra.layout.empty() ? std::string("one process") : ra.layout) +
                  " vs " + (rb.layout.empty() ? std::string("one process") : rb.layout));
  auto ended = [](const std::vector<StepRecord>& s) {
    return int64_t(std::count_if(s.begin(), s.end(), [](const auto& x) { return x.endNs > 0; }));
  };
  if (const int64_t ea = ended(stepsA), eb = ended(stepsB); ea != eb)
    out.push_back("A has " + countText(uint64_t(ea), "step", "steps") + ", B " +
                  std::to_string(eb) + ": the ops of steps one run lacks are only in the other");
  for (const auto& [side, run] : {std::pair{"A", &ra}, std::pair{"B", &rb}})
    if (std::string e = runEnding(*run); !e.empty())
      out.push_back(std::string(side) + "'s run " + e);
  return out;
}

}  // namespace

DiffReport diffRecordings(const Recording& a, const Recording& b, DiffOptions opt) {
  const std::string fa = recordingFramework(a.run()), fb = recordingFramework(b.run());
  if (opt.align == DiffAlign::Auto) opt.align = fa == fb ? DiffAlign::Signature : DiffAlign::Module;
  DumpValues values = [&](uint64_t seq, int role, int index, bool sideA) {
    return (sideA ? a : b).dumpValues(seq, static_cast<Role>(role), index);
  };
  // Ops one side's capture filter did not record are not compared (they were "only in B").
  std::vector<OpRecord> opsA = a.allOps(), opsB = b.allOps();
  auto filterA = recordedFilter(a.run()), filterB = recordedFilter(b.run());
  if (fa != fb)  // op names and scopes are each framework's own: only the step range carries over
    for (auto* f : {&filterA, &filterB})
      if (*f) {
        (*f)->ops.clear();
        (*f)->scope.clear();
        if ((*f)->text().empty()) f->reset();
      }
  int64_t leftOutA = 0, leftOutB = 0;  // ops of A that B's filter left out, and of B by A's
  if (filterB) leftOutA = dropOutside(opsA, *filterB);
  if (filterA) leftOutB = dropOutside(opsB, *filterA);
  DiffReport r = diffRuns(opsA, opsB, opt, values);
  const std::vector<StepRecord> stepsA = a.steps(), stepsB = b.steps();
  r.losses = compareLosses(stepsA, stepsB, r.options);
  r.setup = setupDifferences(a, b, stepsA, stepsB);
  if (leftOutB > 0)
    r.setup.push_back(countText(uint64_t(leftOutB), "op", "ops") +
                      " of B not compared: A recorded only " + filterA->text());
  if (leftOutA > 0)
    r.setup.push_back(countText(uint64_t(leftOutA), "op", "ops") +
                      " of A not compared: B recorded only " + filterB->text());
  // A difference that enters from outside the recorded ops may come from an op a capture filter
  // left out, not from the parameters or data (it said only "different parameters or data").
  if (r.noRoot.find("no recorded op produced it") != std::string::npos ||
      r.noRoot.find("no aligned op produced") != std::string::npos) {
    std::string filters;
    if (filterA) filters += "A recorded only " + filterA->text();
    if (filterB) filters += (filters.empty() ? "" : ", ") + ("B recorded only " + filterB->text());
    if (!filters.empty())
      r.noRoot += "; or the difference comes from an op outside what was recorded (" + filters +
                  ": record both without it to see)";
    // A tensor made from the config (a FlashMask mask's bounds) differs where the configs do.
    for (const std::string& line : r.setup)
      if (line.rfind("config: ", 0) == 0) {
        r.noRoot += "; the configs differ (" + line.substr(8) + "), and what is made from them";
        break;
      }
  }
  r.frameworkA = fa;
  r.frameworkB = fb;
  return r;
}

}  // namespace keel::storage
