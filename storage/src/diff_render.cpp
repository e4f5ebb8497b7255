// Run diff, rendering (see diff.h): the names of verdicts and bases, the JSON report (`keel diff
// --json`, ordered keys, non-finite numbers as null) and the human text report.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "diff_util.h"
#include "keel/base/vocabulary.h"
#include "keel/storage/diff.h"

namespace keel::storage {

using detail::fmtNum;

constexpr std::array<std::string_view, 4> kDiffStatusNames = {"equal", "within-tolerance",
                                                              "diverged", "unmatched"};
static_assert(kDiffStatusNames.size() == size_t(DiffStatus::Unmatched) + 1);
constexpr std::array<std::string_view, 8> kDiffBasisNames = {
    "none", "md5", "rounded-md5", "values", "stats", "md5-only", "shape", "missing"};
static_assert(kDiffBasisNames.size() == size_t(DiffBasis::Missing) + 1);

constexpr std::array<std::string_view, 3> kDiffAlignNames = {"auto", "signature", "module"};
static_assert(kDiffAlignNames.size() == size_t(DiffAlign::Module) + 1);
constexpr std::array<std::string_view, 3> kDiffVerdictNames = {"equal", "diverged",
                                                               "values-not-compared"};
static_assert(kDiffVerdictNames.size() == size_t(DiffVerdict::ValuesNotCompared) + 1);

// The names are literals, so each view's data is terminated.
const char* toString(DiffStatus s) {
  return keel::detail::enumName(kDiffStatusNames, s).data();
}
const char* toString(DiffBasis b) {
  return keel::detail::enumName(kDiffBasisNames, b).data();
}
const char* toString(DiffAlign a) {
  return keel::detail::enumName(kDiffAlignNames, a).data();
}

// ---- JSON ------------------------------------------------------------------------------------

namespace {

using Json = nlohmann::ordered_json;

Json numOrNull(double v) {
  return std::isfinite(v) ? Json(v) : Json(nullptr);
}

Json tensorJson(const TensorDiff& t) {
  Json j{{"role", t.role == Role::Input ? "input" : "output"},
         {"index", t.index},
         {"status", toString(t.status)},
         {"basis", toString(t.basis)}};
  if (t.basis == DiffBasis::Values) {
    j["maxAbs"] = numOrNull(t.maxAbs);  // null: infinite (a NaN or Inf met a number)
    j["maxRel"] = numOrNull(t.maxRel);
    j["maxUlps"] = t.maxUlps;
    j["badElements"] = t.badElements;
  }
  if (t.atolScale) j["atolScale"] = true;
  if (!t.detail.empty()) j["detail"] = t.detail;
  return j;
}

Json kernelJson(const KernelRecord& k) {
  if (k.empty()) return nullptr;
  return Json{{"backend", k.backend}, {"variant", k.variant}, {"params", k.params}};
}

Json pairJson(const OpPair& p) {
  Json j{{"step", p.step},   {"status", toString(p.status)},
         {"name", p.name},   {"phase", phaseName(p.phase)},
         {"scope", p.scope}, {"exactSignature", p.exactSignature}};
  if (!p.nameB.empty()) j["nameB"] = p.nameB;
  if (!p.kind.empty()) j["kind"] = p.kind;
  j["a"] = p.inA ? Json{{"seq", p.seqA}, {"stackId", p.stackIdA}, {"kernel", kernelJson(p.kernelA)}}
                 : Json(nullptr);
  j["b"] = p.inB ? Json{{"seq", p.seqB}, {"stackId", p.stackIdB}, {"kernel", kernelJson(p.kernelB)}}
                 : Json(nullptr);
  const KernelMatch km = kernelMatch(p);
  j["sameKernelVariant"] =
      km == KernelMatch::Unknown ? Json(nullptr) : Json(km == KernelMatch::Same);
  if (!p.outputs.empty()) {
    Json outs = Json::array();
    for (const TensorDiff& t : p.outputs) outs.push_back(tensorJson(t));
    j["outputs"] = std::move(outs);
  }
  return j;
}

Json chainJson(const std::vector<ChainLink>& chain) {
  Json arr = Json::array();
  for (const ChainLink& l : chain)
    arr.push_back(Json{{"depth", l.depth},
                       {"seq", l.seq},
                       {"name", l.name},
                       {"phase", phaseName(l.phase)},
                       {"scope", l.scope},
                       {"stackId", l.stackId},
                       {"status", toString(l.status)},
                       {"consumerSeq", l.consumerSeq},
                       {"consumerInput", l.consumerInput}});
  return arr;
}

Json divergenceJson(const std::optional<Divergence>& d) {
  if (!d) return nullptr;
  Json inputs = Json::array();
  for (const TensorDiff& t : d->inputs) inputs.push_back(tensorJson(t));
  Json j{{"pair", pairJson(d->pair)},
         {"inputs", std::move(inputs)},
         {"chainA", chainJson(d->chainA)},
         {"chainB", chainJson(d->chainB)}};
  if (!d->note.empty()) j["note"] = d->note;
  return j;
}

Json stepJson(const StepDiff& s) {
  Json j;
  if (s.step >= 0) j["step"] = s.step;
  j["opsA"] = s.opsA;
  j["opsB"] = s.opsB;
  j["equal"] = s.equal;
  j["notCompared"] = s.notCompared;
  j["withinTolerance"] = s.withinTolerance;
  j["diverged"] = s.diverged;
  j["onlyInA"] = s.onlyInA;
  j["onlyInB"] = s.onlyInB;
  if (!s.alignment.empty()) j["alignment"] = s.alignment;
  if (s.viewsA > 0 || s.viewsB > 0) {
    j["viewsA"] = s.viewsA;
    j["viewsB"] = s.viewsB;
  }
  return j;
}

}  // namespace

std::string toJson(const DiffReport& r) {
  const DiffOptions& o = r.options;
  Json j;
  j["verdict"] = keel::detail::enumName(kDiffVerdictNames, diffVerdict(r));
  j["exitCode"] = diffExitCode(r);
  j["options"] = Json{{"atol", o.atol},
                      {"rtol", o.rtol},
                      {"maxUlps", o.maxUlps},
                      {"useMd5", o.useMd5},
                      {"useRoundedMd5", o.useRoundedMd5},
                      {"useDumps", o.useDumps},
                      {"useStats", o.useStats},
                      {"mismatchesOnly", o.mismatchesOnly},
                      {"unmatchedIsDivergent", o.unmatchedIsDivergent},
                      {"align", toString(o.align)}};
  if (!r.frameworkA.empty()) j["frameworks"] = Json{{"a", r.frameworkA}, {"b", r.frameworkB}};
  j["total"] = stepJson(r.total);
  j["comparedTensors"] = r.comparedTensors;
  j["uncomparedTensors"] = r.uncomparedTensors;
  Json losses = Json::array();
  for (const LossDiff& l : r.losses)
    losses.push_back(Json{{"step", l.step},
                          {"a", numOrNull(l.a)},
                          {"b", numOrNull(l.b)},
                          {"status", toString(l.status)}});
  j["losses"] = std::move(losses);
  j["setupDifferences"] = r.setup;
  const LossDiff* firstLoss = firstLossDivergence(r);
  j["firstLossDivergence"] = firstLoss ? Json(firstLoss->step) : Json(nullptr);
  Json steps = Json::array();
  for (const StepDiff& s : r.steps) steps.push_back(stepJson(s));
  j["steps"] = std::move(steps);
  j["firstDivergence"] = divergenceJson(r.first);
  j["rootDivergence"] = divergenceJson(r.root);
  if (!r.root && r.rootSearched) j["noRootReason"] = r.noRoot;
  Json pairs = Json::array();
  for (const OpPair& p : r.pairs) pairs.push_back(pairJson(p));
  j["pairs"] = std::move(pairs);
  // Recorded strings need not be UTF-8 (a workload's op names, a damaged file): invalid bytes
  // become U+FFFD instead of a bare type_error 316.
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

// ---- text --------------------------------------------------------------------------------------

namespace {

std::string opLabel(const OpPair& p) {
  std::string s;
  s += p.inA ? "A #" + std::to_string(p.seqA) : std::string("A -");
  s += p.inB ? "  B #" + std::to_string(p.seqB) : std::string("  B -");
  s += "  " + p.name;
  if (!p.nameB.empty()) s += " / " + p.nameB;
  s += " [" + std::string(phaseName(p.phase)) + "]";
  if (!p.scope.empty()) s += " " + p.scope;
  return s;
}

std::string tensorLine(const TensorDiff& t) {
  std::string s =
      std::string(t.role == Role::Input ? "input " : "output ") + std::to_string(t.index) + ": ";
  if (t.basis == DiffBasis::None)  // counted Equal, but nothing says it is: not "equal (none)"
    return s + (t.detail.empty() ? "not compared" : t.detail);
  const bool dtypeOnly = t.basis == DiffBasis::Shape && t.detail.rfind("dtype ", 0) == 0;
  s += std::string(toString(t.status)) + " (" + (dtypeOnly ? "dtype" : toString(t.basis)) + ")";
  if (t.basis == DiffBasis::Values)
    s += "  max abs " + fmtNum(t.maxAbs) + "  max rel " + fmtNum(t.maxRel) + "  max ulps " +
         (t.maxUlps == std::numeric_limits<uint64_t>::max() ? std::string("inf")
                                                            : std::to_string(t.maxUlps));
  if (!t.detail.empty()) s += "  " + t.detail;
  return s;
}

std::string lossText(double v) {
  return std::isnan(v) ? "NaN" : fmtNum(v);
}

// "A x vs B y", at the digits that tell the two losses apart.
std::string lossPair(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return "A " + lossText(a) + " vs B " + lossText(b);
  return "A " + numberPair(a, b, " vs B ");
}

void divergenceText(std::string& out, const char* title, const Divergence& d) {
  const OpPair& p = d.pair;
  out += std::string(title) + ": step " + std::to_string(p.step) + "  " + opLabel(p) + "\n";
  out += "  stacks: A " + (p.stackIdA >= 0 ? "stack #" + std::to_string(p.stackIdA) : "none") +
         ", B " + (p.stackIdB >= 0 ? "stack #" + std::to_string(p.stackIdB) : "none") + "\n";
  const bool inputsEqual = std::all_of(d.inputs.begin(), d.inputs.end(), [](const TensorDiff& t) {
    return t.status == DiffStatus::Equal && t.basis != DiffBasis::None;
  });
  if (std::string k = kernelPhrase(p, inputsEqual, true); !k.empty()) out += "  " + k + "\n";
  // What that means, said where it is the diagnosis (README: "same inputs and the same kernel
  // variant point at nondeterminism or a bug, not at arithmetic"); an op without inputs makes
  // its values from its attributes or the random stream.
  if (p.inA && p.inB && d.inputs.empty())
    out +=
        "  no inputs: its values come from its attributes or the random stream (a different "
        "seed, or another number of random draws before it)\n";
  else if (inputsEqual && kernelMatch(p) == KernelMatch::Same)
    out +=
        "  same inputs and the same kernel: not arithmetic, but nondeterminism or a bug in the "
        "op (or a perturbation)\n";
  if (p.inA != p.inB)
    out += std::string("  only in ") + (p.inA ? "A" : "B") +
           ": an op with no counterpart in the other run changed the value\n";
  if (!d.note.empty()) out += "  " + d.note + "\n";
  for (const TensorDiff& t : p.outputs) out += "  " + tensorLine(t) + "\n";
  for (const TensorDiff& t : d.inputs) out += "  " + tensorLine(t) + "\n";
  for (auto [side, chain] : {std::pair{"A", &d.chainA}, std::pair{"B", &d.chainB}}) {
    if (chain->empty()) continue;
    out += std::string("  fed by (run ") + side + "):\n";
    for (const ChainLink& l : *chain) {
      out += std::string(static_cast<size_t>(2 + 2 * l.depth), ' ') + "<- #" +
             std::to_string(l.seq) + " " + l.name + " [" + std::string(phaseName(l.phase)) + "]";
      if (!l.scope.empty()) out += " " + l.scope;
      out += "  " + std::string(toString(l.status)) + "  -> input " +
             std::to_string(l.consumerInput) + " of #" + std::to_string(l.consumerSeq);
      if (l.stackId >= 0) out += "  stack #" + std::to_string(l.stackId);
      out += "\n";
    }
  }
}

}  // namespace

KernelMatch kernelMatch(const OpPair& p) {
  if (!p.inA || !p.inB || p.kernelA.empty() || p.kernelB.empty()) return KernelMatch::Unknown;
  return p.kernelA.variant == p.kernelB.variant ? KernelMatch::Same : KernelMatch::Different;
}

std::string kernelPhrase(const OpPair& p, bool inputsEqual, bool withParams) {
  const KernelRecord &a = p.kernelA, &b = p.kernelB;
  auto side = [&](const KernelRecord& k) {
    return k.backend + " " + k.variant +
           (withParams && !k.params.empty() ? " (" + k.params + ")" : "");
  };
  switch (kernelMatch(p)) {
    case KernelMatch::Unknown:
      return "";
    case KernelMatch::Same:
      return "same kernel variant: " + a.variant +
             (withParams && a.params != b.params ? " (A " + a.params + ", B " + b.params + ")"
                                                 : "");
    case KernelMatch::Different:
      return std::string(inputsEqual ? "same inputs, different kernel: " : "different kernels: ") +
             side(a) + " vs " + side(b);
  }
  return "";
}

std::string toText(const DiffReport& r, bool mismatchesOnly) {
  std::string out;
  const DiffVerdict verdict = diffVerdict(r);
  const StepDiff& t = r.total;
  out += verdict == DiffVerdict::Diverged            ? "DIVERGED"
         : verdict == DiffVerdict::ValuesNotCompared ? "NO VALUES COMPARED"
                                                     : "EQUAL within tolerance";
  out += " (atol " + fmtNum(r.options.atol) + ", rtol " + fmtNum(r.options.rtol);
  if (r.options.maxUlps > 0) out += ", max ulps " + std::to_string(r.options.maxUlps);
  out += ")\n";
  if (verdict == DiffVerdict::ValuesNotCompared) out += valuesNotComparedText(r) + "\n";
  out += "summary: " + std::to_string(t.equal) + " equal, " +
         (t.notCompared > 0 ? std::to_string(t.notCompared) + " not compared, " : "") +
         std::to_string(t.withinTolerance) + " within tolerance, " + std::to_string(t.diverged) +
         " diverged, " + std::to_string(t.onlyInA) + " only in A, " + std::to_string(t.onlyInB) +
         " only in B";
  if (r.uncomparedTensors > 0)
    out += " (" + std::to_string(r.uncomparedTensors) + " output tensors had nothing to compare)";
  out += "\n";
  if (!r.losses.empty()) {
    const LossDiff* l = firstLossDivergence(r);
    out += "losses: " + std::to_string(r.losses.size()) +
           (r.losses.size() == 1 ? " step compared, " : " steps compared, ");
    if (l)
      out +=
          "first diverged at step " + std::to_string(l->step) + ": " + lossPair(l->a, l->b) + "\n";
    else
      out += std::all_of(r.losses.begin(), r.losses.end(),
                         [](const LossDiff& d) { return d.status == DiffStatus::Equal; })
                 ? "all equal\n"
                 : "all within tolerance\n";
  }
  for (const std::string& s : r.setup) out += "setup differs: " + s + "\n";
  // One side with MD5s alone: no tolerance applies to a differing MD5 (a cpu run with --md5
  // against a cpu-ref run with --all was DIVERGED at --atol 1, without a word why).
  if (const bool aOnly = r.heldA == "MD5s", bOnly = r.heldB == "MD5s"; aOnly || bOnly) {
    const auto md5Only = std::count_if(r.pairs.begin(), r.pairs.end(), [](const OpPair& p) {
      return p.status == DiffStatus::Diverged &&
             std::any_of(p.outputs.begin(), p.outputs.end(),
                         [](const TensorDiff& t) { return t.basis == DiffBasis::Md5Only; });
    });
    if (md5Only > 0)
      out += std::to_string(md5Only) + (md5Only == 1 ? " pair diverged" : " pairs diverged") +
             " by MD5 alone: " +
             (aOnly && bOnly ? std::string("both recordings hold")
              : aOnly        ? std::string("A holds")
                             : std::string("B holds")) +
             " only MD5s, so a last-bit difference diverges whatever --atol and --rtol (record " +
             (aOnly && bOnly ? "them"
              : aOnly        ? "A"
                             : "B") +
             " with --stats or --all for the tolerances to apply)\n";
  }
  if (r.options.align == DiffAlign::Module)
    out += "paired by module, op kind and position (A " +
           (r.frameworkA.empty() ? std::string("?") : r.frameworkA) + ", B " +
           (r.frameworkB.empty() ? std::string("?") : r.frameworkB) +
           "): first outputs compared; " + std::to_string(t.viewsA) + " views/copies in A and " +
           std::to_string(t.viewsB) + " in B left out\n";
  out += "\n";
  // The "not cmp" column only when some pair had nothing to compare (recordings without values).
  const bool notComparedColumn = t.notCompared > 0;
  char line[160];
  std::snprintf(line, sizeof line, "%6s %8s %8s %8s", "step", "ops A", "ops B", "equal");
  out += line;
  if (notComparedColumn) out += "  not cmp";
  std::snprintf(line, sizeof line, " %8s %8s %8s %8s  %s\n", "within", "diverged", "only A",
                "only B", "alignment");
  out += line;
  for (const StepDiff& s : r.steps) {
    std::snprintf(line, sizeof line, "%6lld %8lld %8lld %8lld", static_cast<long long>(s.step),
                  static_cast<long long>(s.opsA), static_cast<long long>(s.opsB),
                  static_cast<long long>(s.equal));
    out += line;
    if (notComparedColumn) {
      std::snprintf(line, sizeof line, " %8lld", static_cast<long long>(s.notCompared));
      out += line;
    }
    std::snprintf(line, sizeof line, " %8lld %8lld %8lld %8lld  %s\n",
                  static_cast<long long>(s.withinTolerance), static_cast<long long>(s.diverged),
                  static_cast<long long>(s.onlyInA), static_cast<long long>(s.onlyInB),
                  s.alignment.c_str());
    out += line;
  }
  out += "\n";
  if (const LossDiff* l = firstLossDivergence(r); l && !r.first)
    out += "first divergence: step " + std::to_string(l->step) + " loss (" + lossPair(l->a, l->b) +
           "); " +
           (r.comparedTensors == 0 ? "no op can be named: the recordings hold no tensor values (" +
                                         detail::recordBothHint(r, false) + " to find the op)"
                                   : "no recorded op output diverged") +
           "\n\n";
  if (r.first && !r.rootSearched) {  // --strict: an op on one side only (Diverged by none)
    const OpPair& p = r.first->pair;
    out += "first divergence: step " + std::to_string(p.step) + "  " + opLabel(p) +
           (p.inA ? " (only in A" : " (only in B") + "; --strict counts it)\n\n";
  } else if (r.first) {
    divergenceText(out, "first divergence", *r.first);
    out += "\n";
    if (r.root && r.root->pair.inA && r.root->pair.seqA == r.first->pair.seqA) {
      // An op without inputs (an initialiser) matches no inputs: said, not "they all match".
      std::string why = r.root->inputs.empty() ? "it has no inputs" : "its inputs all match";
      for (const TensorDiff& t : r.root->inputs)
        if (t.atolScale) {  // a tiny input: the difference may have come through it unseen
          why = "its inputs all pass, but input " + std::to_string(t.index) +
                " only on atol: its values are at atol's scale, and a difference there is not "
                "seen (diff with a smaller --atol)";
          break;
        }
      if (r.options.align == DiffAlign::Module)  // judged by what fed it, not input by input
        why = r.root->note.empty() ? "the ops feeding it match" : r.root->note;
      out += "root divergence: the first divergence (" + why + ")\n\n";
    } else if (r.root) {
      divergenceText(out, "root divergence", *r.root);
      out += "\n";
    } else {
      out += "root divergence: none found (" +
             (r.noRoot.empty() ? std::string("every diverged op has a diverged input") : r.noRoot) +
             ")\n\n";
    }
  }
  bool header = false;
  // A step one run does not have (it stopped, failed or was cut short there) is one line, not
  // one per op: hundreds of "<" lines buried the pairs that differ.
  std::map<int64_t, const StepDiff*> oneSided;
  for (const StepDiff& s : r.steps)
    if (s.alignment == "only-a" || s.alignment == "only-b") oneSided[s.step] = &s;
  std::set<int64_t> said;
  for (const OpPair& p : r.pairs) {
    if (mismatchesOnly && !isMismatch(p.status)) continue;
    if (!header) out += mismatchesOnly ? "mismatches:\n" : "pairs:\n", header = true;
    if (const auto it = oneSided.find(p.step); it != oneSided.end()) {
      if (said.insert(p.step).second) {
        const bool inA = it->second->alignment == "only-a";
        const int64_t n = inA ? it->second->opsA : it->second->opsB;
        out += std::string("  ") + (inA ? "<" : ">") + " step " + std::to_string(p.step) + ": " +
               std::to_string(n) + (n == 1 ? " op" : " ops") + " only in " + (inA ? "A" : "B") +
               " (" + (inA ? "B" : "A") + " has no step " + std::to_string(p.step) + ")\n";
      }
      continue;
    }
    const char* mark = p.status == DiffStatus::Equal             ? (valuesCompared(p) ? "=" : "?")
                       : p.status == DiffStatus::WithinTolerance ? "~"
                       : p.status == DiffStatus::Diverged        ? "!"
                       : p.inA                                   ? "<"
                                                                 : ">";
    out += std::string("  ") + mark + " step " + std::to_string(p.step) + "  " + opLabel(p);
    if (!p.kind.empty() && !p.nameB.empty()) out += "  (kind " + p.kind + ")";
    if (!p.exactSignature && p.inA && p.inB) out += "  (signature differs)";
    out += "\n";
    if (p.status != DiffStatus::Equal) {
      for (const TensorDiff& td : p.outputs)
        if (td.status != DiffStatus::Equal) out += "      " + tensorLine(td) + "\n";
      if (std::string k = kernelPhrase(p, false, false); !k.empty()) out += "      " + k + "\n";
    }
  }
  return out;
}

}  // namespace keel::storage
