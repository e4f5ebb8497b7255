// Run diff engine (see diff.h, docs/diff.md): groups both runs' ops by step, aligns each step
// (diff_align.cpp), compares every aligned pair (diff_compare.cpp), and finds the first and root
// divergence with their producer chains. Never reads SQLite or engine state; rendering is
// diff_render.cpp. Cost is linear when the runs are identical.
#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "diff_util.h"
#include "keel/storage/diff.h"
#include "keel/storage/export.h"
#include "keel/storage/producers.h"

namespace keel::storage {
namespace {

DiffStatus worse(DiffStatus a, DiffStatus b) {
  return static_cast<uint8_t>(a) >= static_cast<uint8_t>(b) ? a : b;
}

bool passes(DiffStatus s) {
  return s == DiffStatus::Equal || s == DiffStatus::WithinTolerance;
}

struct Row {
  int64_t step = 0;
  const OpRecord* a = nullptr;
  const OpRecord* b = nullptr;
  bool exact = true;
  DiffStatus status = DiffStatus::Equal;
  std::vector<TensorDiff> outputs;
  std::string kind;  // module alignment
};

// The producer of an input on one side, as a record: See Note [Producer] (producers.h).
class Producers {
 public:
  explicit Producers(const std::vector<const OpRecord*>& ops) : ops_(ops), index_(ops) {}
  const OpRecord* find(const TensorRecord& input, uint64_t consumerSeq) const {
    const std::optional<size_t> p = index_.find(input, consumerSeq);
    return p ? ops_[*p] : nullptr;
  }
  const ProducerIndex& index() const { return index_; }

 private:
  const std::vector<const OpRecord*>& ops_;
  ProducerIndex index_;
};

const TensorRecord* findTensor(const OpRecord& op, Role role, int32_t index) {
  for (const TensorRecord& t : op.tensors)
    if (t.role == role && t.index == index) return &t;
  return nullptr;
}

// A tensor on one side only: Diverged, basis Missing.
TensorDiff missingTensor(Role role, int32_t index, bool inA) {
  TensorDiff d;
  d.role = role;
  d.index = index;
  d.status = DiffStatus::Diverged;
  d.basis = DiffBasis::Missing;
  d.detail = inA ? "only in A" : "only in B";
  return d;
}

// Compares all tensors of one role, by index (a tensor on one side only is Diverged/Missing).
std::vector<TensorDiff> compareRole(const OpRecord& a, const OpRecord& b, Role role,
                                    const DiffOptions& opt, const DumpValues& values) {
  std::vector<int32_t> indices;
  for (const OpRecord* op : {&a, &b})
    for (const TensorRecord& t : op->tensors)
      if (t.role == role) indices.push_back(t.index);
  std::sort(indices.begin(), indices.end());
  indices.erase(std::unique(indices.begin(), indices.end()), indices.end());
  std::vector<TensorDiff> out;
  out.reserve(indices.size());
  for (int32_t idx : indices) {
    const TensorRecord* ta = findTensor(a, role, idx);
    const TensorRecord* tb = findTensor(b, role, idx);
    if (ta && tb) {
      out.push_back(compareTensors(*ta, *tb, a.seq, b.seq, opt, values));
    } else {
      out.push_back(missingTensor(role, idx, ta != nullptr));
    }
  }
  return out;
}

using detail::elementCount;
using detail::firstOutput;

// Module alignment (Note [Diff across frameworks]): one tensor of each side compared, their
// elements in row-major order whatever the two shapes, when the counts and dtypes agree.
TensorDiff compareAcross(const TensorRecord& ta, const TensorRecord& tb, uint64_t seqA,
                         uint64_t seqB, const DiffOptions& opt, const DumpValues& values) {
  TensorRecord sameA = ta, sameB = tb;
  const bool reshaped = ta.shape != tb.shape && ta.dtype == tb.dtype &&
                        elementCount(ta.shape) == elementCount(tb.shape) &&
                        elementCount(ta.shape) >= 0;
  if (reshaped) {
    // Keel's MD5s end with the shape (docs/capture.md): equal elements in two shapes hash
    // differently, so only values and statistics can say they are equal.
    sameB.shape = ta.shape;
    for (TensorRecord* t : {&sameA, &sameB}) t->md5.clear(), t->md5Rounded.clear();
  }
  TensorDiff d = compareTensors(sameA, sameB, seqA, seqB, opt, values);
  if (reshaped)
    d.detail += std::string(d.detail.empty() ? "" : "; ") + "shapes " + shapeText(ta.shape) +
                " vs " + shapeText(tb.shape);
  return d;
}

// A pair's first outputs.
std::vector<TensorDiff> compareFirstOutputs(const OpRecord& a, const OpRecord& b,
                                            const DiffOptions& opt, const DumpValues& values) {
  const TensorRecord* ta = firstOutput(a);
  const TensorRecord* tb = firstOutput(b);
  if (!ta && !tb) return {};
  if (!ta || !tb) return {missingTensor(Role::Output, 0, ta != nullptr)};
  return {compareAcross(*ta, *tb, a.seq, b.seq, opt, values)};
}

OpPair toPair(const Row& r) {
  OpPair p;
  p.step = r.step;
  p.inA = r.a != nullptr;
  p.inB = r.b != nullptr;
  const OpRecord* main = r.a ? r.a : r.b;
  p.name = main->name;
  p.phase = main->phase;
  p.scope = main->scope;
  if (r.a) p.seqA = r.a->seq, p.stackIdA = r.a->stackId, p.kernelA = r.a->kernel;
  if (r.b) p.seqB = r.b->seq, p.stackIdB = r.b->stackId, p.kernelB = r.b->kernel;
  if (r.a && r.b && r.a->name != r.b->name) p.nameB = r.b->name;
  p.kind = r.kind;
  p.exactSignature = r.exact;
  p.status = r.status;
  p.outputs = r.outputs;
  return p;
}

bool anyCompared(const std::vector<TensorDiff>& outputs) {
  return outputs.empty() || std::any_of(outputs.begin(), outputs.end(), [](const TensorDiff& t) {
           return t.basis != DiffBasis::None;
         });
}

void count(StepDiff& s, const Row& r) {
  if (!r.a) {
    ++s.onlyInB;
    return;
  }
  if (!r.b) {
    ++s.onlyInA;
    return;
  }
  switch (r.status) {
    case DiffStatus::Equal:
      ++(anyCompared(r.outputs) ? s.equal : s.notCompared);
      break;
    case DiffStatus::WithinTolerance:
      ++s.withinTolerance;
      break;
    default:
      ++s.diverged;
      break;
  }
}

std::vector<ChainLink> buildChain(const OpRecord& start, const Producers& producers,
                                  const std::unordered_map<uint64_t, const Row*>& rowBySeq,
                                  const DiffOptions& opt) {
  std::vector<ChainLink> chain;
  std::unordered_set<uint64_t> seen{start.seq};
  std::deque<std::pair<const OpRecord*, int>> queue{{&start, 0}};
  while (!queue.empty() && static_cast<int>(chain.size()) < opt.chainMaxOps) {
    auto [op, depth] = queue.front();
    queue.pop_front();
    if (depth >= opt.chainDepth) continue;
    for (const TensorRecord& t : op->tensors) {
      if (t.role != Role::Input) continue;
      const OpRecord* prod = producers.find(t, op->seq);
      if (!prod || !seen.insert(prod->seq).second) continue;
      if (static_cast<int>(chain.size()) >= opt.chainMaxOps) break;
      ChainLink l;
      l.depth = depth + 1;
      l.seq = prod->seq;
      l.consumerSeq = op->seq;
      l.consumerInput = t.index;
      l.name = prod->name;
      l.phase = prod->phase;
      l.scope = prod->scope;
      l.stackId = prod->stackId;
      auto it = rowBySeq.find(prod->seq);
      l.status = (it != rowBySeq.end() && it->second->a && it->second->b) ? it->second->status
                                                                          : DiffStatus::Unmatched;
      chain.push_back(std::move(l));
      queue.emplace_back(prod, depth + 1);
    }
  }
  return chain;
}

// Groups ops by step (ascending), each step ordered by seq; rejects duplicate seqs.
std::map<int64_t, std::vector<const OpRecord*>> byStep(const std::vector<OpRecord>& ops,
                                                       const char* side) {
  std::vector<const OpRecord*> sorted;
  sorted.reserve(ops.size());
  for (const OpRecord& op : ops) sorted.push_back(&op);
  bool inOrder = std::is_sorted(sorted.begin(), sorted.end(),
                                [](auto* x, auto* y) { return x->seq < y->seq; });
  if (!inOrder)
    std::sort(sorted.begin(), sorted.end(), [](auto* x, auto* y) { return x->seq < y->seq; });
  std::map<int64_t, std::vector<const OpRecord*>> steps;
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (i > 0 && sorted[i]->seq == sorted[i - 1]->seq)
      throw StorageError(std::string("diff: duplicate op seq ") + std::to_string(sorted[i]->seq) +
                         " in run " + side);
    steps[sorted[i]->step].push_back(sorted[i]);
  }
  return steps;
}

// The diverged pairs, by side A's seq: the first divergence and the root candidates in order.
std::vector<const Row*> divergedRows(const std::vector<Row>& rows) {
  std::vector<const Row*> diverged;
  for (const Row& r : rows)
    if (r.a && r.b && r.status == DiffStatus::Diverged) diverged.push_back(&r);
  std::sort(diverged.begin(), diverged.end(),
            [](const Row* x, const Row* y) { return x->a->seq < y->a->seq; });
  return diverged;
}

// What the first and root search of either alignment works over: each side's ops (whose
// producers it finds), the row of every aligned op, and the divergence at a row.
struct Sides {
  Sides(std::vector<const OpRecord*> a, std::vector<const OpRecord*> b,
        const std::vector<Row>& rows)
      : allA(std::move(a)), allB(std::move(b)), prodA(allA), prodB(allB) {
    for (const Row& r : rows) {
      if (r.a) rowByA.emplace(r.a->seq, &r);
      if (r.b) rowByB.emplace(r.b->seq, &r);
    }
  }
  Sides(const Sides&) = delete;  // the producers point into allA and allB
  Sides& operator=(const Sides&) = delete;

  // The pair (or one-sided op) at r with its input verdicts and each side's feeding chain.
  Divergence divergence(const Row& r, std::vector<TensorDiff> inputs,
                        const DiffOptions& opt) const {
    Divergence dv;
    dv.pair = toPair(r);
    dv.inputs = std::move(inputs);
    if (r.a) dv.chainA = buildChain(*r.a, prodA, rowByA, opt);
    if (r.b) dv.chainB = buildChain(*r.b, prodB, rowByB, opt);
    return dv;
  }

  std::vector<const OpRecord*> allA, allB;
  Producers prodA, prodB;
  std::unordered_map<uint64_t, const Row*> rowByA, rowByB;
};

// Each side's ops in the rows, in seq order (what Sides finds producers among).
std::pair<std::vector<const OpRecord*>, std::vector<const OpRecord*>> alignedOps(
    const std::vector<Row>& rows) {
  std::vector<const OpRecord*> a, b;
  for (const Row& r : rows) {
    if (r.a) a.push_back(r.a);
    if (r.b) b.push_back(r.b);
  }
  for (auto* ops : {&a, &b})
    std::sort(ops->begin(), ops->end(), [](auto* x, auto* y) { return x->seq < y->seq; });
  return {std::move(a), std::move(b)};
}

// Module alignment's first and root divergence (Note [Diff across frameworks]): inputs do not
// correspond one to one across frameworks, so a pair is judged by the ops that fed it, found
// through views.
void divergenceAcross(DiffReport& rep, const std::vector<const Row*>& diverged, const Sides& sides,
                      const DiffOptions& opt) {
  const auto &allA = sides.allA, &allB = sides.allB;
  const Producers &prodA = sides.prodA, &prodB = sides.prodB;
  const auto &rowByA = sides.rowByA, &rowByB = sides.rowByB;
  // The ops whose outputs reach op's inputs, walking back through views and copies.
  std::unordered_map<uint64_t, size_t> posA, posB;
  for (size_t i = 0; i < allA.size(); ++i) posA.emplace(allA[i]->seq, i);
  for (size_t i = 0; i < allB.size(); ++i) posB.emplace(allB[i]->seq, i);
  auto feeders = [&](const OpRecord& op, bool sideA) {
    const std::vector<const OpRecord*>& all = sideA ? allA : allB;
    std::vector<const OpRecord*> out;
    for (size_t p : detail::feedersThroughViews(all, (sideA ? prodA : prodB).index(),
                                                (sideA ? posA : posB).at(op.seq)))
      out.push_back(all[p]);
    return out;
  };
  // A feeder passes when it is a pair that passed, or when it has no counterpart and is state
  // the step starts from (an op of an earlier step, or the optimizer's: Keel's fused adamw_step
  // against ATen's pieces), which across frameworks is compared where it is read. A pair of an
  // earlier step is judged by its verdict like any pair.
  enum class Feed { Passed, Failed, OneSided };
  auto judge = [&](const OpRecord& f, bool sideA, const OpRecord& consumer) {
    const auto& rowBy = sideA ? rowByA : rowByB;
    auto it = rowBy.find(f.seq);
    if (it == rowBy.end()) return Feed::Passed;
    const Row& r = *it->second;
    if (r.a && r.b) return passes(r.status) ? Feed::Passed : Feed::Failed;
    if (f.step != consumer.step || f.phase == Phase::Optimizer) return Feed::Passed;
    return Feed::OneSided;
  };
  // A one-sided op is clean when everything feeding it passed, through other one-sided ops
  // (a decomposition with no counterpart: bmm <- softmax <- masked_fill <- bmm).
  std::unordered_map<uint64_t, bool> cleanMemo[2];
  std::function<bool(const OpRecord&, bool, int)> clean = [&](const OpRecord& op, bool sideA,
                                                              int depth) {
    if (depth >= 32) return false;  // too far back to tell (not remembered: depends on depth)
    auto& memo = cleanMemo[sideA ? 0 : 1];
    if (auto it = memo.find(op.seq); it != memo.end()) return it->second;
    bool ok = true;
    for (const OpRecord* f : feeders(op, sideA)) {
      Feed v = judge(*f, sideA, op);
      if (v == Feed::Failed || (v == Feed::OneSided && !clean(*f, sideA, depth + 1))) {
        ok = false;
        break;
      }
    }
    return memo[op.seq] = ok;
  };
  auto label = [](const OpRecord& op) {
    return "#" + std::to_string(op.seq) + " " + op.name + (op.scope.empty() ? "" : " " + op.scope);
  };
  // What fed one input of a pair's op, through views: "#92 matmul blocks.1.mlp.w1 (paired)".
  auto source = [&](const OpRecord& op, const TensorRecord& input, bool sideA) -> std::string {
    const Producers& prod = sideA ? prodA : prodB;
    const OpRecord* p = prod.find(input, op.seq);
    for (int hops = 0; p && opKind(p->name).empty() && hops < 32; ++hops) {
      const TensorRecord* in = nullptr;  // a view's source: its first input
      for (const TensorRecord& t : p->tensors)
        if (t.role == Role::Input && (!in || t.index < in->index)) in = &t;
      p = in ? prod.find(*in, p->seq) : nullptr;
    }
    if (!p) return "no recorded op (a parameter or data)";
    const auto& rowBy = sideA ? rowByA : rowByB;
    auto it = rowBy.find(p->seq);
    const bool paired = it != rowBy.end() && it->second->a && it->second->b;
    const char* how = paired                                 ? " (paired)"
                      : judge(*p, sideA, op) == Feed::Passed ? " (from before the step)"
                      : sideA                                ? " (only in A)"
                                                             : " (only in B)";
    return label(*p) + how;
  };
  // The first divergence's inputs, index by index where both sides have one of the same size
  // (elementwise ops agree; a matmul's operands may come in another order), each naming what
  // fed it on either side.
  auto inputsAcross = [&](const Row& r) {
    std::vector<TensorDiff> in;
    std::vector<int32_t> indices;
    for (const OpRecord* op : {r.a, r.b})
      for (const TensorRecord& t : op->tensors)
        if (t.role == Role::Input) indices.push_back(t.index);
    std::sort(indices.begin(), indices.end());
    indices.erase(std::unique(indices.begin(), indices.end()), indices.end());
    for (int32_t index : indices) {
      const TensorRecord* ta = findTensor(*r.a, Role::Input, index);
      const TensorRecord* tb = findTensor(*r.b, Role::Input, index);
      TensorDiff t;
      if (ta && tb && ta->dtype == tb->dtype &&
          elementCount(ta->shape) == elementCount(tb->shape)) {
        t = compareAcross(*ta, *tb, r.a->seq, r.b->seq, opt, {});
      } else {
        t.status = DiffStatus::Unmatched;
        t.detail = !tb   ? "only in A"
                   : !ta ? "only in B"
                         : "not compared: " + ta->dtype + shapeText(ta->shape) + " vs " +
                               tb->dtype + shapeText(tb->shape);
      }
      t.role = Role::Input;
      t.index = index;
      std::string fed = (ta ? "A " + source(*r.a, *ta, true) : std::string()) +
                        (ta && tb ? ", " : "") + (tb ? "B " + source(*r.b, *tb, false) : "");
      t.detail += (t.detail.empty() ? "" : "; ") + std::string("fed by ") + fed;
      in.push_back(std::move(t));
    }
    return in;
  };
  auto divergence = [&](const Row& r, std::vector<TensorDiff> inputs) {
    return sides.divergence(r, std::move(inputs), opt);
  };
  rep.first = divergence(*diverged.front(), inputsAcross(*diverged.front()));
  for (const Row* r : diverged) {
    bool allPassed = true;
    const OpRecord* culprits[2] = {nullptr, nullptr};  // a clean one-sided feeder, A and B
    for (bool sideA : {true, false}) {
      const OpRecord& op = sideA ? *r->a : *r->b;
      for (const OpRecord* f : feeders(op, sideA)) {
        Feed v = judge(*f, sideA, op);
        if (v == Feed::Passed) continue;
        allPassed = false;
        const OpRecord*& c = culprits[sideA ? 0 : 1];
        if (v == Feed::OneSided && !c && clean(*f, sideA, 0)) c = f;
      }
    }
    if (allPassed) {
      rep.root = r == diverged.front() ? *rep.first : divergence(*r, inputsAcross(*r));
      break;
    }
    if (culprits[0] && culprits[1]) {
      // Both sides reach it through ops with no counterpart (Keel's flashmask_attention, ATen's
      // bmm + softmax): the two decompositions differ here, and neither side's op can be
      // compared alone. The pair they feed is where the difference shows.
      rep.root = r == diverged.front() ? *rep.first : divergence(*r, inputsAcross(*r));
      rep.root->note = "fed on both sides by ops with no counterpart (A " + label(*culprits[0]) +
                       ", B " + label(*culprits[1]) +
                       ") whose own inputs match: the difference is in those ops";
      break;
    }
    if (const OpRecord* culprit = culprits[0] ? culprits[0] : culprits[1]) {
      const bool culpritA = culprits[0] != nullptr;
      rep.root = divergence(*(culpritA ? rowByA : rowByB).at(culprit->seq), {});
      rep.root->note = "feeds " + std::string(culpritA ? "A " : "B ") +
                       label(culpritA ? *r->a : *r->b) +
                       ", which diverged; everything feeding it matches";
      break;
    }
  }
}

}  // namespace

constexpr const char* kNoRootInGeneral =
    "every diverged op has a diverged input, or one fed by an earlier divergence: the difference "
    "enters through tensors no aligned op produced, e.g. parameters or data";

// Why no diverged pair qualified as the root, from the first divergence's inputs: one nothing
// was recorded of, one no recorded op produced (parameters or data), or the general case.
std::string noRootReason(const Row& first, const std::vector<TensorDiff>& inputs,
                         const Sides& sides) {
  const Producers& prodA = sides.prodA;
  const std::string op = "#" + std::to_string(first.a->seq) + " " + first.a->name;
  // An input made on either side by an op the other run does not have (relu in A, gelu in B):
  // the two programs differ there.
  for (const TensorDiff& t : inputs) {
    if (passes(t.status)) continue;
    const TensorRecord* ta = findTensor(*first.a, Role::Input, t.index);
    const TensorRecord* tb = findTensor(*first.b, Role::Input, t.index);
    const OpRecord* pa = ta ? prodA.find(*ta, first.a->seq) : nullptr;
    const OpRecord* pb = tb ? sides.prodB.find(*tb, first.b->seq) : nullptr;
    auto oneSided = [](const std::unordered_map<uint64_t, const Row*>& rows, const OpRecord* p) {
      auto it = p ? rows.find(p->seq) : rows.end();
      return it != rows.end() && !(it->second->a && it->second->b);
    };
    const bool aOnly = oneSided(sides.rowByA, pa), bOnly = oneSided(sides.rowByB, pb);
    if (!aOnly && !bOnly) continue;
    std::string made;
    if (aOnly) made += "A #" + std::to_string(pa->seq) + " " + pa->name + " (only in A)";
    if (bOnly)
      made += std::string(aOnly ? ", " : "") + "B #" + std::to_string(pb->seq) + " " + pb->name +
              " (only in B)";
    return "input " + std::to_string(t.index) + " of the first divergence (" + op +
           ") is made by an op the other run does not have: " + made +
           "; the two programs differ there";
  }
  for (const TensorDiff& t : inputs)
    if (t.basis == DiffBasis::None) {
      const TensorRecord* ta = findTensor(*first.a, Role::Input, t.index);
      return "input " + std::to_string(t.index) + " of the first divergence (" + op + ", " +
             (ta ? ta->dtype : std::string("?")) +
             ") was not compared: nothing was recorded of it (statistics cover floating-point "
             "tensors; record with --md5 or --all), and the difference may enter through it";
    }
  for (const TensorDiff& t : inputs) {
    if (passes(t.status)) continue;
    const TensorRecord* ta = findTensor(*first.a, Role::Input, t.index);
    if (ta && !prodA.find(*ta, first.a->seq))
      return "input " + std::to_string(t.index) + " of the first divergence (" + op +
             ") differs and no recorded op produced it: the runs start from different "
             "parameters or data";
  }
  return kNoRootInGeneral;
}

DiffReport diffRuns(const std::vector<OpRecord>& a, const std::vector<OpRecord>& b,
                    const DiffOptions& opt, const DumpValues& values) {
  DiffReport rep;
  rep.options = opt;
  if (rep.options.align == DiffAlign::Auto) rep.options.align = DiffAlign::Signature;
  const bool modules = rep.options.align == DiffAlign::Module;
  rep.total.step = -1;
  auto stepsA = byStep(a, "A");
  auto stepsB = byStep(b, "B");
  std::vector<int64_t> stepIds;
  for (auto& [s, _] : stepsA) stepIds.push_back(s);
  for (auto& [s, _] : stepsB) stepIds.push_back(s);
  std::sort(stepIds.begin(), stepIds.end());
  stepIds.erase(std::unique(stepIds.begin(), stepIds.end()), stepIds.end());

  auto held = [](const std::vector<OpRecord>& ops) {
    bool md5 = false, rounded = false, stats = false;
    for (const OpRecord& op : ops) {
      for (const TensorRecord& t : op.tensors) {
        md5 = md5 || !t.md5.empty();
        rounded = rounded || !t.md5Rounded.empty();
        stats = stats || t.hasStats;
      }
      if (md5 && rounded && stats) break;
    }
    std::vector<std::string> kinds;
    if (md5) kinds.push_back("MD5s");
    if (rounded) kinds.push_back("rounded MD5s");
    if (stats) kinds.push_back("statistics");
    std::string text;
    for (size_t i = 0; i < kinds.size(); ++i)
      text += (i == 0 ? "" : i + 1 == kinds.size() ? " and " : ", ") + kinds[i];
    return text;
  };
  rep.heldA = held(a);
  rep.heldB = held(b);
  const std::vector<const OpRecord*> empty;
  std::vector<Row> rows;
  rows.reserve(std::max(a.size(), b.size()));
  for (int64_t step : stepIds) {
    auto ia = stepsA.find(step);
    auto ib = stepsB.find(step);
    const auto& opsA = ia != stepsA.end() ? ia->second : empty;
    const auto& opsB = ib != stepsB.end() ? ib->second : empty;
    StepDiff sd;
    sd.step = step;
    sd.opsA = static_cast<int64_t>(opsA.size());
    sd.opsB = static_cast<int64_t>(opsB.size());
    Alignment al = modules ? alignModules(opsA, opsB, opt) : alignOps(opsA, opsB, opt);
    sd.alignment = opsA.empty() ? "only-b" : opsB.empty() ? "only-a" : al.method;
    if (modules) {
      for (const OpRecord* op : opsA) sd.viewsA += opKind(op->name).empty();
      for (const OpRecord* op : opsB) sd.viewsB += opKind(op->name).empty();
    }
    for (size_t r = 0; r < al.rows.size(); ++r) {
      auto [i, j] = al.rows[r];
      Row row;
      row.step = step;
      row.a = i >= 0 ? opsA[static_cast<size_t>(i)] : nullptr;
      row.b = j >= 0 ? opsB[static_cast<size_t>(j)] : nullptr;
      row.exact = al.exact[r];
      if (modules) row.kind = opKind((row.a ? row.a : row.b)->name);
      if (row.a && row.b) {
        row.outputs = modules ? compareFirstOutputs(*row.a, *row.b, opt, values)
                              : compareRole(*row.a, *row.b, Role::Output, opt, values);
        row.status = DiffStatus::Equal;
        for (const TensorDiff& t : row.outputs) {
          row.status = worse(row.status, t.status);
          ++(t.basis == DiffBasis::None ? rep.uncomparedTensors : rep.comparedTensors);
        }
        // A pair matched on name/phase/scope only has different input shapes or dtypes.
        if (!row.exact) row.status = DiffStatus::Diverged;
      } else {
        row.status = DiffStatus::Unmatched;
      }
      count(sd, row);
      rows.push_back(std::move(row));
    }
    for (StepDiff* s : {&rep.total}) {
      s->opsA += sd.opsA, s->opsB += sd.opsB, s->equal += sd.equal;
      s->notCompared += sd.notCompared;
      s->withinTolerance += sd.withinTolerance, s->diverged += sd.diverged;
      s->onlyInA += sd.onlyInA, s->onlyInB += sd.onlyInB;
      s->viewsA += sd.viewsA, s->viewsB += sd.viewsB;
    }
    rep.steps.push_back(std::move(sd));
  }

  // First and root divergence (see docs/diff.md "Root divergence").
  const std::vector<const Row*> diverged = divergedRows(rows);
  rep.rootSearched = !diverged.empty();
  if (!diverged.empty() && modules) {
    // Views are not in the rows, and the walk back crosses them: every op of each side.
    std::vector<const OpRecord*> allA, allB;
    for (const auto& [_, ops] : stepsA) allA.insert(allA.end(), ops.begin(), ops.end());
    for (const auto& [_, ops] : stepsB) allB.insert(allB.end(), ops.begin(), ops.end());
    const Sides sides(std::move(allA), std::move(allB), rows);
    divergenceAcross(rep, diverged, sides, opt);
  } else if (!diverged.empty()) {
    auto [allA, allB] = alignedOps(rows);
    const Sides sides(std::move(allA), std::move(allB), rows);
    const Producers &prodA = sides.prodA, &prodB = sides.prodB;
    const auto& rowByA = sides.rowByA;
    auto makeDivergence = [&](const Row& r, std::vector<TensorDiff> inputs) {
      return sides.divergence(r, std::move(inputs), opt);
    };
    // An input's verdict is its producer pair's verdict on that tensor when both runs read it
    // from the aligned producer (that verdict may rest on dumps); else a direct comparison.
    auto inputsOf = [&](const Row& r) {
      std::vector<TensorDiff> in = compareRole(*r.a, *r.b, Role::Input, opt, {});
      for (TensorDiff& t : in) {
        const TensorRecord* ta = findTensor(*r.a, Role::Input, t.index);
        const TensorRecord* tb = findTensor(*r.b, Role::Input, t.index);
        if (!ta || !tb || t.basis == DiffBasis::Shape) continue;
        const OpRecord* pa = prodA.find(*ta, r.a->seq);
        const OpRecord* pb = prodB.find(*tb, r.b->seq);
        auto it = pa ? rowByA.find(pa->seq) : rowByA.end();
        if (it == rowByA.end() || it->second->b != pb || !pb) {
          if (t.basis == DiffBasis::None || t.basis == DiffBasis::Md5Only)
            t = compareTensors(*ta, *tb, r.a->seq, r.b->seq, opt, values);  // dumps, if any
          continue;
        }
        for (const TensorRecord& out : pa->tensors) {
          if (out.role != Role::Output || out.tensorId != ta->tensorId ||
              out.version != ta->version)
            continue;
          for (const TensorDiff& od : it->second->outputs) {
            if (od.index != out.index) continue;
            int32_t index = t.index;
            t = od;
            t.role = Role::Input;
            t.index = index;
            t.detail = "output " + std::to_string(out.index) + " of #" + std::to_string(pa->seq) +
                       (od.detail.empty() ? "" : ": " + od.detail);
          }
        }
      }
      return in;
    };
    // Note [Root candidates]: a root's inputs all pass, each was compared (an input nothing was
    // recorded of — an integer tensor under --stats — may carry the difference unseen), and none
    // descends from an earlier diverged pair: a difference that passed one op within tolerance
    // (at atol's scale, say) is still that pair's difference, not a new one. After the first
    // divergence, an input that passed only on atol (atolScale) does not pass either: the first
    // divergence was not a root, so a difference entered that the recorded data flow may not
    // carry (an optimizer's state updated in place, gradients accumulated outside the ops), and
    // at atol's scale it is not seen. (A PyTorch run from other initial weights named AdamW's
    // sqrt of its second moment, at 1e-6, as the root.)
    std::unordered_set<uint64_t> downstream;  // A's ops fed, directly or not, by a diverged pair
    for (const OpRecord* op : sides.allA) {
      auto it = rowByA.find(op->seq);
      bool fed = it != rowByA.end() && it->second->b && it->second->status == DiffStatus::Diverged;
      for (const TensorRecord& t : op->tensors) {
        if (fed) break;
        if (t.role != Role::Input) continue;
        const OpRecord* p = prodA.find(t, op->seq);
        fed = p && downstream.count(p->seq);
      }
      if (fed) downstream.insert(op->seq);
    }
    auto clean = [&](const Row& r, const TensorDiff& t) {
      if (!passes(t.status) || t.basis == DiffBasis::None) return false;
      const TensorRecord* ta = findTensor(*r.a, Role::Input, t.index);
      const OpRecord* p = ta ? prodA.find(*ta, r.a->seq) : nullptr;
      return !p || !downstream.count(p->seq);
    };
    std::vector<TensorDiff> firstInputs = inputsOf(*diverged.front());
    rep.first = makeDivergence(*diverged.front(), firstInputs);
    for (const Row* r : diverged) {
      const bool first = r == diverged.front();
      std::vector<TensorDiff> in = first ? firstInputs : inputsOf(*r);
      if (std::all_of(in.begin(), in.end(), [&](const TensorDiff& t) {
            return clean(*r, t) && (first || !t.atolScale);
          })) {
        rep.root = r == diverged.front() ? *rep.first : makeDivergence(*r, std::move(in));
        break;
      }
    }
    if (!rep.root) rep.noRoot = noRootReason(*diverged.front(), firstInputs, sides);
  }

  if (rep.rootSearched && !rep.root && rep.noRoot.empty()) rep.noRoot = kNoRootInGeneral;

  // --strict with nothing diverged: the first op on one side only is where the runs part (the
  // text named it and the JSON had no first divergence). No root is searched for.
  if (!rep.first && opt.unmatchedIsDivergent)
    for (const Row& r : rows) {
      if (r.a && r.b) continue;
      auto [allA, allB] = alignedOps(rows);
      const Sides sides(std::move(allA), std::move(allB), rows);
      rep.first = sides.divergence(r, {}, opt);
      break;
    }

  rep.pairs.reserve(opt.mismatchesOnly ? 0 : rows.size());
  for (const Row& r : rows)
    if (!opt.mismatchesOnly || isMismatch(r.status)) rep.pairs.push_back(toPair(r));
  return rep;
}

bool valuesCompared(const OpPair& p) {
  return p.status != DiffStatus::Equal || anyCompared(p.outputs);
}

const LossDiff* firstLossDivergence(const DiffReport& r) {
  for (const LossDiff& l : r.losses)
    if (l.status == DiffStatus::Diverged) return &l;
  return nullptr;
}

// How to record what a diff needs, in the words of the tool that recorded the side: keel
// record's flags, or keel_torch.record's arguments (a PyTorch user was told to use --all).
std::string detail::recordHint(const std::string& framework, bool alternatives) {
  if (framework == "torch") return "keel_torch.record(..., md5=True, stats=True)";
  return alternatives ? "--all, or --md5 / --stats" : "--all";
}

std::string detail::recordBothHint(const DiffReport& r, bool alternatives) {
  const std::string a = recordHint(r.frameworkA, alternatives),
                    b = recordHint(r.frameworkB, alternatives);
  return a == b ? "record both with " + a : "record A with " + a + " and B with " + b;
}

std::string valuesNotComparedText(const DiffReport& r) {
  const std::string what =
      std::string("only the op sequences") + (r.losses.empty() ? "" : " and the step losses");
  if (r.heldA.empty() && r.heldB.empty())
    return "the recordings hold no MD5s, statistics or dumps of their tensors: " + what +
           " were compared (" + detail::recordBothHint(r, true) + ")";
  if (r.heldA.empty() || r.heldB.empty()) {
    const bool aLacks = r.heldA.empty();
    const char* lacks = aLacks ? "A" : "B";
    return std::string("recording ") + lacks +
           " holds no MD5s, statistics or dumps of its tensors (" + (aLacks ? "B" : "A") +
           " holds " + (aLacks ? r.heldB : r.heldA) + "): " + what + " were compared (record " +
           lacks + " with " + detail::recordHint(aLacks ? r.frameworkA : r.frameworkB, true) + ")";
  }
  return "A holds " + r.heldA + " and B " + r.heldB +
         " of their tensors, no kind both hold: " + what + " were compared (" +
         detail::recordBothHint(r, false) + ")";
}

DiffVerdict diffVerdict(const DiffReport& r) {
  if (r.total.diverged > 0 || firstLossDivergence(r)) return DiffVerdict::Diverged;
  if (r.options.unmatchedIsDivergent && (r.total.onlyInA > 0 || r.total.onlyInB > 0))
    return DiffVerdict::Diverged;
  if (r.comparedTensors == 0 && (r.uncomparedTensors > 0 || r.losses.empty()))
    return DiffVerdict::ValuesNotCompared;
  return DiffVerdict::Equal;
}

int diffExitCode(const DiffReport& r) {
  return diffVerdict(r) == DiffVerdict::Diverged ? 1 : 0;
}

}  // namespace keel::storage
