// Module summaries and the non-finite marks of one step (see module_summary.h): sums over the ops
// each module holds, as drawn (adopted scopes included), and a one-hop walk of the dataflow.
#include "keel/analysis/module_summary.h"

#include <algorithm>
#include <cstdio>

#include "keel/analysis/dataflow.h"
#include "keel/base/text.h"

namespace keel::analysis {

// Note [Module summary]
// A module's summary is what its collapsed node and its zoomed-out block show: the ops it holds
// (under it, at any depth, in one phase), their summed wall time, the bytes of their outputs (the
// memory the module's ops were handed; in-place writes count again), how many produced a NaN or
// an Inf, and, with a comparison, the worst verdict inside (Diverged > WithinTolerance >
// Unmatched > Equal) and whether the run's first divergence is there.
//
// Note [Non-finite colouring]
// A run that went bad should look bad at first sight: an op whose output holds a NaN or an Inf is
// NonFinite (red), an op that reads such an output while its own are finite is Fed (marked, for
// the check or reduction that swallowed the NaN). One hop only: an op downstream that went NaN too
// is NonFinite in its own right. Except a mask's infinities (Note [Where non-finite values
// appear]): a masking fill's -inf, and ops that only carry such infinities on (no NaN, no new
// infinity, every producer holding infinities being such a mask), are not marked — a healthy
// attention model's causal mask is not a fault — while the ops that carry a fault's Inf on are.
// Modules count their NonFinite ops.

namespace {

const storage::OpRecord* findOp(std::span<const storage::OpRecord> ops, uint64_t seq) {
  auto it = std::lower_bound(ops.begin(), ops.end(), seq,
                             [](const storage::OpRecord& o, uint64_t s) { return o.seq < s; });
  if (it != ops.end() && it->seq == seq) return &*it;
  for (const auto& o : ops)  // not sorted by seq
    if (o.seq == seq) return &o;
  return nullptr;
}

void add(ModuleSummary& s, const storage::OpRecord& op, bool nonFinite, const OpVerdicts* v) {
  ++s.ops;
  s.timeNs += std::max<int64_t>(0, op.endNs - op.beginNs);
  for (const auto& t : op.tensors)
    if (t.role == storage::Role::Output) s.bytes += t.bytes;
  if (nonFinite) ++s.nonFiniteOps;
  if (!v) return;
  std::optional<storage::DiffStatus> status;
  if (auto it = v->status.find(op.seq); it != v->status.end())
    status = it->second;
  else if (v->missingAreEqual)
    status = storage::DiffStatus::Equal;
  if (status && (!s.worst || verdictRank(*status) > verdictRank(*s.worst))) s.worst = status;
  if (v->first && *v->first == op.seq) s.firstDivergence = true;
}

}  // namespace

ModuleSummary summarizeOps(std::span<const storage::OpRecord> ops, std::span<const uint64_t> seqs,
                           const OpVerdicts* verdicts, const std::vector<NonFiniteMark>* marks) {
  ModuleSummary s;
  for (uint64_t seq : seqs)
    if (const auto* op = findOp(ops, seq)) {
      const size_t i = size_t(op - ops.data());
      const bool bad =
          marks ? (*marks)[i] == NonFiniteMark::NonFinite : storage::nonFiniteAppearsAt(*op);
      add(s, *op, bad, verdicts);
    }
  return s;
}

std::string moduleKey(Phase phase, std::string_view scope) {
  std::string key(1, phase == Phase::Forward ? 'f' : phase == Phase::Backward ? 'b' : 'o');
  key += ':';
  key += scope;
  return key;
}

std::unordered_map<std::string, ModuleSummary> summarizeModules(
    std::span<const storage::OpRecord> ops, const GraphDot& graph, const OpVerdicts* verdicts) {
  std::unordered_map<std::string, ModuleSummary> out;
  const std::vector<NonFiniteMark> marks = nonFiniteMarks(ops);
  for (size_t i = 0; i < ops.size(); ++i) {
    const storage::OpRecord& op = ops[i];
    if (!graph.nodeOfOp.count(op.seq)) continue;
    for (const auto& prefix : scopePrefixes(drawnScope(graph, op)))
      add(out[moduleKey(op.phase, prefix)], op, marks[i] == NonFiniteMark::NonFinite, verdicts);
  }
  return out;
}

std::string opCountText(int64_t ops) {
  return std::to_string(ops) + (ops == 1 ? " op" : " ops");
}

int verdictRank(storage::DiffStatus s) {
  switch (s) {
    case storage::DiffStatus::Equal:
      return 0;
    case storage::DiffStatus::Unmatched:
      return 1;
    case storage::DiffStatus::WithinTolerance:
      return 2;
    case storage::DiffStatus::Diverged:
      return 3;
  }
  return 0;
}

std::string durationText(int64_t ns) {
  char buf[32];
  if (ns < 1000)
    std::snprintf(buf, sizeof buf, "%lld ns", static_cast<long long>(ns));
  else if (ns < 1'000'000)
    std::snprintf(buf, sizeof buf, "%.1f \u00b5s",
                  double(ns) / 1e3);  // µs, as the studio spells it
  else if (ns < 1'000'000'000)
    std::snprintf(buf, sizeof buf, "%.2f ms", double(ns) / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.2f s", double(ns) / 1e9);
  return buf;
}

std::vector<std::string> summaryLines(const ModuleSummary& s) {
  std::vector<std::string> lines{opCountText(s.ops) + ", " + durationText(s.timeNs) + ", " +
                                 formatBytes(uint64_t(std::max<int64_t>(0, s.bytes)))};
  std::string bad;
  if (s.nonFiniteOps > 0)
    bad = (s.nonFiniteOps == 1 ? std::string("1 op") : std::to_string(s.nonFiniteOps) + " ops") +
          " non-finite";
  if (s.firstDivergence)
    bad += std::string(bad.empty() ? "" : ", ") + "first divergence";
  else if (s.worst == storage::DiffStatus::Diverged)
    bad += std::string(bad.empty() ? "" : ", ") + "diverged";
  else if (s.worst == storage::DiffStatus::WithinTolerance)
    bad += std::string(bad.empty() ? "" : ", ") + "within tolerance";
  else if (s.worst == storage::DiffStatus::Equal)
    bad += std::string(bad.empty() ? "" : ", ") + "equal";
  if (!bad.empty()) lines.push_back(std::move(bad));
  return lines;
}

std::vector<NonFiniteMark> nonFiniteMarks(std::span<const storage::OpRecord> ops) {
  std::vector<NonFiniteMark> marks(ops.size(), NonFiniteMark::None);
  if (std::none_of(ops.begin(), ops.end(),
                   [](const storage::OpRecord& o) { return storage::holdsNonFinite(o); }))
    return marks;
  const Dataflow d = buildDataflow(ops);
  // Ops holding only a mask's infinities (Note [Non-finite colouring]).
  std::vector<char> maskOnly(ops.size(), 0);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!storage::holdsNonFinite(ops[i])) continue;
    if (storage::nonFiniteAppearsAt(ops[i])) {
      marks[i] = NonFiniteMark::NonFinite;
      continue;
    }
    // No NaN and no new infinity: a masking fill's own, or carried from its producers.
    bool fault = false;
    for (uint32_t p : d.producers[i])
      fault = fault || (storage::holdsNonFinite(ops[p]) && !maskOnly[p]);
    if (fault)
      marks[i] = NonFiniteMark::NonFinite;
    else
      maskOnly[i] = 1;
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    if (marks[i] != NonFiniteMark::None || maskOnly[i]) continue;
    for (uint32_t p : d.producers[i])
      if (marks[p] == NonFiniteMark::NonFinite) {
        marks[i] = NonFiniteMark::Fed;
        break;
      }
  }
  return marks;
}

}  // namespace keel::analysis
