// Run diff engine (see diff.h, docs/diff.md): signature alignment per step, tensor comparison,
// first and root divergence, producer chains, JSON and text rendering.
// Invariants: never reads SQLite or engine state; cost is linear when the runs are identical.
#include "keel/storage/diff.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "keel/storage/producers.h"

namespace keel::storage {

const char* toString(DiffStatus s) {
  switch (s) {
    case DiffStatus::Equal:
      return "equal";
    case DiffStatus::WithinTolerance:
      return "within-tolerance";
    case DiffStatus::Diverged:
      return "diverged";
    case DiffStatus::Unmatched:
      return "unmatched";
  }
  return "?";
}

const char* toString(DiffBasis b) {
  switch (b) {
    case DiffBasis::None:
      return "none";
    case DiffBasis::Md5:
      return "md5";
    case DiffBasis::RoundedMd5:
      return "rounded-md5";
    case DiffBasis::Values:
      return "values";
    case DiffBasis::Stats:
      return "stats";
    case DiffBasis::Md5Only:
      return "md5-only";
    case DiffBasis::Shape:
      return "shape";
    case DiffBasis::Missing:
      return "missing";
  }
  return "?";
}

namespace {

// ---- hashing ---------------------------------------------------------------------------------

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

uint64_t fnv(uint64_t h, const void* data, size_t n) {
  auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}
uint64_t fnvStr(uint64_t h, const std::string& s) {
  h = fnv(h, s.data(), s.size());
  return (h ^ 0xffu) * kFnvPrime;  // terminator: "ab"+"c" differs from "a"+"bc"
}
uint64_t fnvU64(uint64_t h, uint64_t v) {
  return fnv(h, &v, sizeof v);
}

uint64_t looseSignature(const OpRecord& op) {
  return fnvStr(fnvStr(fnvStr(kFnvOffset, op.name), op.phase), op.scope);
}

// ---- formatting helpers ----------------------------------------------------------------------

std::string fmtNum(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string fmtShape(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(s[i]);
  }
  return out + "]";
}

DiffStatus worse(DiffStatus a, DiffStatus b) {
  return static_cast<uint8_t>(a) >= static_cast<uint8_t>(b) ? a : b;
}

bool passes(DiffStatus s) {
  return s == DiffStatus::Equal || s == DiffStatus::WithinTolerance;
}

// ---- ULPs --------------------------------------------------------------------------------------

uint16_t floatToHalfBits(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x7fffffu;
  int exp = static_cast<int>((x >> 23) & 0xffu);
  if (exp == 255) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  int e = exp - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {  // half subnormal (or zero)
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    int shift = 14 - e;
    uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (static_cast<uint32_t>(e) << 10) | (mant >> 13), rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry may reach inf: correct
  return static_cast<uint16_t>(sign | h);
}

uint16_t floatToBf16Bits(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// Distance of two sign-magnitude floats of `bits` width, on the monotonic integer line.
uint64_t ulpFromBits(uint64_t ba, uint64_t bb, int bits) {
  uint64_t signMask = 1ull << (bits - 1);
  uint64_t ma = ba & (signMask - 1), mb = bb & (signMask - 1);
  if ((ba & signMask) == (bb & signMask)) return ma > mb ? ma - mb : mb - ma;
  return ma + mb;
}

// ---- statistics ------------------------------------------------------------------------------

bool closeEnough(double a, double b, const DiffOptions& opt) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (a == b) return true;
  if (std::isinf(a) || std::isinf(b)) return false;
  return std::fabs(a - b) <= opt.atol + opt.rtol * std::fabs(b);
}

TensorDiff compareStats(const TensorRecord& a, const TensorRecord& b, const DiffOptions& opt) {
  TensorDiff d;
  d.role = a.role;
  d.index = a.index;
  d.basis = DiffBasis::Stats;
  const TensorStats &sa = a.stats, &sb = b.stats;
  if (sa.nanCount != sb.nanCount) {
    d.status = DiffStatus::Diverged;
    d.detail = "NaN count " + std::to_string(sa.nanCount) + " vs " + std::to_string(sb.nanCount);
    return d;
  }
  if (sa.infCount != sb.infCount) {
    d.status = DiffStatus::Diverged;
    d.detail = "Inf count " + std::to_string(sa.infCount) + " vs " + std::to_string(sb.infCount);
    return d;
  }
  const std::pair<const char*, std::pair<double, double>> fields[] = {
      {"min", {sa.min, sb.min}},
      {"max", {sa.max, sb.max}},
      {"mean", {sa.mean, sb.mean}},
      {"std", {sa.std, sb.std}},
      {"absMax", {sa.absMax, sb.absMax}}};
  for (const auto& [field, v] : fields) {
    if (!closeEnough(v.first, v.second, opt)) {
      d.status = DiffStatus::Diverged;
      d.detail = std::string(field) + " " + fmtNum(v.first) + " vs " + fmtNum(v.second);
      return d;
    }
  }
  d.status = DiffStatus::WithinTolerance;
  d.detail = "statistics within tolerance";
  return d;
}

// ---- alignment ---------------------------------------------------------------------------------

using Matches = std::vector<std::pair<int64_t, int64_t>>;

// Note [Diff alignment]
// Two steps of the same program are usually identical or nearly so, so the aligner first strips
// the common prefix and suffix (O(n); identical steps stop here). The differing middle goes to
// Myers' O(ND) greedy LCS, which is fast when the edit distance D is small. Its work (snake steps
// plus diagonal visits) is counted and capped by DiffOptions::lcsBudget, and D by kMaxD (the
// backtracking trace costs D² ints). Past either cap, a windowed greedy resync takes over: walk
// both sides, match equal heads, and on a mismatch jump to the nearest (x + y smallest) pair
// a[i+x] == b[j+y] within kWindow ops, found through a position index of B. Both give ops in
// order; the greedy one may miss the optimum on long rearrangements but is O((n+m)·kWindow·log).
// Inside each gap between matched ops, a second pass aligns on (name, phase, scope) only, so an
// op whose shapes or dtype changed is paired (and reported Diverged) instead of "only in A/B".
constexpr int64_t kMaxD = 3000;
constexpr int64_t kWindow = 64;

bool myers(const uint64_t* a, int64_t n, const uint64_t* b, int64_t m, int64_t budget,
           Matches& out) {
  const int64_t maxD = std::min<int64_t>(n + m, kMaxD);
  const int64_t off = maxD + 1;
  std::vector<int64_t> v(static_cast<size_t>(2 * maxD + 3), 0);
  std::vector<int32_t> trace;  // V after each d, for k in [-d, d]: offset d*d
  int64_t work = 0;
  int64_t dFound = -1;
  for (int64_t d = 0; d <= maxD && dFound < 0; ++d) {
    for (int64_t k = -d; k <= d; k += 2) {
      int64_t x = (k == -d || (k != d && v[off + k - 1] < v[off + k + 1])) ? v[off + k + 1]
                                                                           : v[off + k - 1] + 1;
      int64_t y = x - k;
      int64_t x0 = x;
      while (x < n && y < m && a[x] == b[y]) ++x, ++y;
      work += 1 + (x - x0);
      v[off + k] = x;
      if (x >= n && y >= m) dFound = d;
    }
    for (int64_t k = -d; k <= d; ++k) trace.push_back(static_cast<int32_t>(v[off + k]));
    if (work > budget) return false;
  }
  if (dFound < 0) return false;
  // Backtrack from (n, m).
  Matches rev;
  int64_t x = n, y = m;
  for (int64_t d = dFound; d > 0; --d) {
    auto tv = [&](int64_t dd, int64_t k) { return static_cast<int64_t>(trace[dd * dd + k + dd]); };
    int64_t k = x - y;
    bool down = (k == -d || (k != d && tv(d - 1, k - 1) < tv(d - 1, k + 1)));
    int64_t pk = down ? k + 1 : k - 1;
    int64_t px = tv(d - 1, pk), py = px - pk;
    int64_t sx = down ? px : px + 1;  // start of the snake after the edit
    while (x > sx) rev.emplace_back(--x, --y);
    x = px, y = py;
  }
  while (x > 0 && y > 0) rev.emplace_back(--x, --y);
  out.insert(out.end(), rev.rbegin(), rev.rend());
  return true;
}

void greedy(const uint64_t* a, int64_t n, const uint64_t* b, int64_t m, Matches& out) {
  std::unordered_map<uint64_t, std::vector<int64_t>> posB;
  for (int64_t j = 0; j < m; ++j) posB[b[j]].push_back(j);
  int64_t i = 0, j = 0;
  while (i < n && j < m) {
    if (a[i] == b[j]) {
      out.emplace_back(i++, j++);
      continue;
    }
    int64_t bestX = -1, bestY = -1, bestCost = std::numeric_limits<int64_t>::max();
    for (int64_t x = 0; x < kWindow && i + x < n && x < bestCost; ++x) {
      auto it = posB.find(a[i + x]);
      if (it == posB.end()) continue;
      auto p = std::lower_bound(it->second.begin(), it->second.end(), j);
      if (p == it->second.end()) continue;
      int64_t y = *p - j;
      if (y < kWindow && x + y < bestCost) bestX = x, bestY = y, bestCost = x + y;
    }
    if (bestX < 0) {
      ++i, ++j;  // no resync nearby: both heads stay unmatched
    } else {
      i += bestX, j += bestY;
    }
  }
}

// Matches of two hash sequences; `method` gets "identical", "lcs" or "greedy".
Matches alignHashes(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b, int64_t budget,
                    std::string* method) {
  const int64_t n = static_cast<int64_t>(a.size()), m = static_cast<int64_t>(b.size());
  Matches out;
  int64_t pre = 0;
  while (pre < n && pre < m && a[pre] == b[pre]) ++pre;
  int64_t suf = 0;
  while (suf < n - pre && suf < m - pre && a[n - 1 - suf] == b[m - 1 - suf]) ++suf;
  out.reserve(static_cast<size_t>(std::min(n, m)));
  for (int64_t i = 0; i < pre; ++i) out.emplace_back(i, i);
  const int64_t mn = n - pre - suf, mm = m - pre - suf;
  if (method) *method = "identical";
  if (mn > 0 && mm > 0) {
    Matches mid;
    bool ok = myers(a.data() + pre, mn, b.data() + pre, mm, budget, mid);
    if (!ok) {
      mid.clear();
      greedy(a.data() + pre, mn, b.data() + pre, mm, mid);
    }
    if (method) *method = ok ? "lcs" : "greedy";
    for (auto [i, j] : mid) out.emplace_back(i + pre, j + pre);
  } else if ((mn > 0 || mm > 0) && method) {
    *method = "lcs";
  }
  for (int64_t s = suf; s > 0; --s) out.emplace_back(n - s, m - s);
  return out;
}

// ---- run diff internals ----------------------------------------------------------------------

struct Row {
  int64_t step = 0;
  const OpRecord* a = nullptr;
  const OpRecord* b = nullptr;
  bool exact = true;
  DiffStatus status = DiffStatus::Equal;
  std::vector<TensorDiff> outputs;
};

// The producer of an input on one side, as a record: See Note [Producer] (producers.h).
class Producers {
 public:
  explicit Producers(const std::vector<const OpRecord*>& ops) : ops_(ops), index_(ops) {}
  const OpRecord* find(const TensorRecord& input, uint64_t consumerSeq) const {
    const std::optional<size_t> p = index_.find(input, consumerSeq);
    return p ? ops_[*p] : nullptr;
  }

 private:
  const std::vector<const OpRecord*>& ops_;
  ProducerIndex index_;
};

const TensorRecord* findTensor(const OpRecord& op, Role role, int32_t index) {
  for (const TensorRecord& t : op.tensors)
    if (t.role == role && t.index == index) return &t;
  return nullptr;
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
      TensorDiff d;
      d.role = role;
      d.index = idx;
      d.status = DiffStatus::Diverged;
      d.basis = DiffBasis::Missing;
      d.detail = ta ? "only in A" : "only in B";
      out.push_back(std::move(d));
    }
  }
  return out;
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
  if (r.a) p.seqA = r.a->seq, p.stackIdA = r.a->stackId;
  if (r.b) p.seqB = r.b->seq, p.stackIdB = r.b->stackId;
  if (r.a && r.b && r.a->name != r.b->name) p.nameB = r.b->name;
  p.exactSignature = r.exact;
  p.status = r.status;
  p.outputs = r.outputs;
  return p;
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
      ++s.equal;
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

}  // namespace

// ---- public API ------------------------------------------------------------------------------

uint64_t opSignature(const OpRecord& op) {
  uint64_t h = looseSignature(op);
  for (const TensorRecord& t : op.tensors) {
    h = fnvU64(h, static_cast<uint64_t>(t.role));
    h = fnvU64(h, static_cast<uint64_t>(static_cast<uint32_t>(t.index)));
    h = fnvU64(h, t.shape.size());
    for (int64_t s : t.shape) h = fnvU64(h, static_cast<uint64_t>(s));
    h = fnvStr(h, t.dtype);
  }
  return h;
}

uint64_t ulpDistance(double a, double b, const std::string& dtype) {
  bool na = std::isnan(a), nb = std::isnan(b);
  if (na || nb) return na && nb ? 0 : std::numeric_limits<uint64_t>::max();
  if (dtype == "float32") {
    return ulpFromBits(std::bit_cast<uint32_t>(static_cast<float>(a)),
                       std::bit_cast<uint32_t>(static_cast<float>(b)), 32);
  }
  if (dtype == "float16") {
    return ulpFromBits(floatToHalfBits(static_cast<float>(a)),
                       floatToHalfBits(static_cast<float>(b)), 16);
  }
  if (dtype == "bfloat16") {
    return ulpFromBits(floatToBf16Bits(static_cast<float>(a)),
                       floatToBf16Bits(static_cast<float>(b)), 16);
  }
  if (dtype.rfind("int", 0) == 0 || dtype.rfind("uint", 0) == 0 || dtype == "bool") {
    double d = std::fabs(std::round(a) - std::round(b));
    return d >= 1.8e19 ? std::numeric_limits<uint64_t>::max() : static_cast<uint64_t>(d);
  }
  return ulpFromBits(std::bit_cast<uint64_t>(a), std::bit_cast<uint64_t>(b), 64);  // float64
}

TensorDiff compareValues(const std::vector<double>& a, const std::vector<double>& b,
                         const std::string& dtype, const DiffOptions& opt) {
  TensorDiff d;
  d.basis = DiffBasis::Values;
  if (a.size() != b.size()) {
    d.status = DiffStatus::Diverged;
    d.detail = std::to_string(a.size()) + " vs " + std::to_string(b.size()) + " dumped elements";
    return d;
  }
  const double inf = std::numeric_limits<double>::infinity();
  double maxAbs = 0, maxRel = 0;
  uint64_t maxUlps = 0;
  int64_t bad = 0;
  int64_t firstBad = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    double x = a[i], y = b[i];
    uint64_t ulps = ulpDistance(x, y, dtype);
    double abs = 0, rel = 0;
    bool ok;
    if (std::isnan(x) || std::isnan(y)) {
      ok = std::isnan(x) && std::isnan(y);
      if (!ok) abs = rel = inf;
    } else if (x == y) {
      ok = true;
    } else if (std::isinf(x) || std::isinf(y)) {
      ok = false;
      abs = rel = inf;
    } else {
      abs = std::fabs(x - y);
      rel = y == 0 ? inf : abs / std::fabs(y);
      ok = abs <= opt.atol + opt.rtol * std::fabs(y) || (opt.maxUlps > 0 && ulps <= opt.maxUlps);
    }
    maxAbs = std::max(maxAbs, abs);
    maxRel = std::max(maxRel, rel);
    maxUlps = std::max(maxUlps, ulps);
    if (!ok) {
      if (firstBad < 0) firstBad = static_cast<int64_t>(i);
      ++bad;
    }
  }
  d.maxAbs = maxAbs;
  d.maxRel = maxRel;
  d.maxUlps = maxUlps;
  d.badElements = bad;
  if (bad > 0) {
    d.status = DiffStatus::Diverged;
    size_t i = static_cast<size_t>(firstBad);
    d.detail = std::to_string(bad) + " of " + std::to_string(a.size()) +
               " elements outside tolerance; first at " + std::to_string(i) + ": " + fmtNum(a[i]) +
               " vs " + fmtNum(b[i]);
  } else if (maxUlps == 0) {
    d.status = DiffStatus::Equal;
    d.detail = "dumped values equal";
  } else {
    d.status = DiffStatus::WithinTolerance;
    d.detail = "dumped values within tolerance";
  }
  return d;
}

TensorDiff compareTensors(const TensorRecord& a, const TensorRecord& b, uint64_t seqA,
                          uint64_t seqB, const DiffOptions& opt, const DumpValues& values) {
  TensorDiff d;
  d.role = a.role;
  d.index = a.index;
  if (a.shape != b.shape || a.dtype != b.dtype) {
    d.status = DiffStatus::Diverged;
    d.basis = DiffBasis::Shape;
    d.detail = a.dtype + fmtShape(a.shape) + " vs " + b.dtype + fmtShape(b.shape);
    return d;
  }
  bool haveMd5 = opt.useMd5 && !a.md5.empty() && !b.md5.empty();
  if (haveMd5 && a.md5 == b.md5) {
    d.status = DiffStatus::Equal;
    d.basis = DiffBasis::Md5;
    return d;
  }
  bool haveRounded = opt.useRoundedMd5 && !a.md5Rounded.empty() && !b.md5Rounded.empty();
  if (haveRounded && a.md5Rounded == b.md5Rounded) {
    d.status = DiffStatus::WithinTolerance;
    d.basis = DiffBasis::RoundedMd5;
    d.detail = "MD5 differs, rounded MD5 equal";
    return d;
  }
  if (opt.useDumps && values) {
    int role = static_cast<int>(a.role);
    auto va = values(seqA, role, a.index, true);
    if (va) {
      auto vb = values(seqB, role, b.index, false);
      if (vb) {
        TensorDiff v = compareValues(*va, *vb, a.dtype, opt);
        v.role = a.role;
        v.index = a.index;
        return v;
      }
    }
  }
  if (opt.useStats && a.hasStats && b.hasStats) return compareStats(a, b, opt);
  if (haveMd5 || haveRounded) {
    d.status = DiffStatus::Diverged;
    d.basis = DiffBasis::Md5Only;
    d.detail = haveMd5 ? "MD5 differs (no stats or dumps to compare)"
                       : "rounded MD5 differs (no stats or dumps to compare)";
    return d;
  }
  d.status = DiffStatus::Equal;
  d.basis = DiffBasis::None;
  d.detail = "not compared (nothing recorded)";
  return d;
}

Alignment alignOps(std::span<const OpRecord* const> a, std::span<const OpRecord* const> b,
                   const DiffOptions& opt) {
  std::vector<uint64_t> ha(a.size()), hb(b.size());
  for (size_t i = 0; i < a.size(); ++i) ha[i] = opSignature(*a[i]);
  for (size_t j = 0; j < b.size(); ++j) hb[j] = opSignature(*b[j]);
  Alignment al;
  Matches exact = alignHashes(ha, hb, opt.lcsBudget, &al.method);
  al.rows.reserve(std::max(a.size(), b.size()));
  al.exact.reserve(std::max(a.size(), b.size()));
  auto emitGap = [&](int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    Matches loose;
    if (i1 > i0 && j1 > j0) {
      std::vector<uint64_t> la, lb;
      for (int64_t i = i0; i < i1; ++i) la.push_back(looseSignature(*a[static_cast<size_t>(i)]));
      for (int64_t j = j0; j < j1; ++j) lb.push_back(looseSignature(*b[static_cast<size_t>(j)]));
      loose = alignHashes(la, lb, opt.lcsBudget, nullptr);
    }
    int64_t i = i0, j = j0;
    for (auto [li, lj] : loose) {
      for (; i < i0 + li; ++i) al.rows.emplace_back(i, -1), al.exact.push_back(false);
      for (; j < j0 + lj; ++j) al.rows.emplace_back(-1, j), al.exact.push_back(false);
      al.rows.emplace_back(i++, j++);
      al.exact.push_back(false);
    }
    for (; i < i1; ++i) al.rows.emplace_back(i, -1), al.exact.push_back(false);
    for (; j < j1; ++j) al.rows.emplace_back(-1, j), al.exact.push_back(false);
  };
  int64_t pi = 0, pj = 0;
  for (auto [i, j] : exact) {
    if (i > pi || j > pj) emitGap(pi, i, pj, j);
    al.rows.emplace_back(i, j);
    al.exact.push_back(true);
    pi = i + 1, pj = j + 1;
  }
  emitGap(pi, static_cast<int64_t>(a.size()), pj, static_cast<int64_t>(b.size()));
  return al;
}

DiffReport diffRuns(const std::vector<OpRecord>& a, const std::vector<OpRecord>& b,
                    const DiffOptions& opt, const DumpValues& values) {
  DiffReport rep;
  rep.options = opt;
  rep.total.step = -1;
  auto stepsA = byStep(a, "A");
  auto stepsB = byStep(b, "B");
  std::vector<int64_t> stepIds;
  for (auto& [s, _] : stepsA) stepIds.push_back(s);
  for (auto& [s, _] : stepsB) stepIds.push_back(s);
  std::sort(stepIds.begin(), stepIds.end());
  stepIds.erase(std::unique(stepIds.begin(), stepIds.end()), stepIds.end());

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
    Alignment al = alignOps(opsA, opsB, opt);
    sd.alignment = opsA.empty() ? "only-b" : opsB.empty() ? "only-a" : al.method;
    for (size_t r = 0; r < al.rows.size(); ++r) {
      auto [i, j] = al.rows[r];
      Row row;
      row.step = step;
      row.a = i >= 0 ? opsA[static_cast<size_t>(i)] : nullptr;
      row.b = j >= 0 ? opsB[static_cast<size_t>(j)] : nullptr;
      row.exact = al.exact[r];
      if (row.a && row.b) {
        row.outputs = compareRole(*row.a, *row.b, Role::Output, opt, values);
        row.status = DiffStatus::Equal;
        for (const TensorDiff& t : row.outputs) {
          row.status = worse(row.status, t.status);
          if (t.basis == DiffBasis::None) ++rep.uncomparedTensors;
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
      s->withinTolerance += sd.withinTolerance, s->diverged += sd.diverged;
      s->onlyInA += sd.onlyInA, s->onlyInB += sd.onlyInB;
    }
    rep.steps.push_back(std::move(sd));
  }

  // First and root divergence (see docs/diff.md "Root divergence").
  std::vector<const Row*> diverged;
  for (const Row& r : rows)
    if (r.a && r.b && r.status == DiffStatus::Diverged) diverged.push_back(&r);
  if (!diverged.empty()) {
    rep.rootSearched = true;
    std::sort(diverged.begin(), diverged.end(),
              [](const Row* x, const Row* y) { return x->a->seq < y->a->seq; });
    std::vector<const OpRecord*> allA, allB;
    std::unordered_map<uint64_t, const Row*> rowByA, rowByB;
    for (const Row& r : rows) {
      if (r.a) allA.push_back(r.a), rowByA.emplace(r.a->seq, &r);
      if (r.b) allB.push_back(r.b), rowByB.emplace(r.b->seq, &r);
    }
    std::sort(allA.begin(), allA.end(), [](auto* x, auto* y) { return x->seq < y->seq; });
    std::sort(allB.begin(), allB.end(), [](auto* x, auto* y) { return x->seq < y->seq; });
    Producers prodA(allA), prodB(allB);

    auto makeDivergence = [&](const Row& r, std::vector<TensorDiff> inputs) {
      Divergence dv;
      dv.pair = toPair(r);
      dv.inputs = std::move(inputs);
      dv.chainA = buildChain(*r.a, prodA, rowByA, opt);
      dv.chainB = buildChain(*r.b, prodB, rowByB, opt);
      return dv;
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
    std::vector<TensorDiff> firstInputs = inputsOf(*diverged.front());
    rep.first = makeDivergence(*diverged.front(), firstInputs);
    for (const Row* r : diverged) {
      std::vector<TensorDiff> in = r == diverged.front() ? firstInputs : inputsOf(*r);
      if (std::all_of(in.begin(), in.end(), [](const TensorDiff& t) { return passes(t.status); })) {
        rep.root = r == diverged.front() ? *rep.first : makeDivergence(*r, std::move(in));
        break;
      }
    }
  }

  rep.pairs.reserve(opt.mismatchesOnly ? 0 : rows.size());
  for (const Row& r : rows)
    if (!opt.mismatchesOnly || r.status != DiffStatus::Equal) rep.pairs.push_back(toPair(r));
  return rep;
}

int diffExitCode(const DiffReport& r) {
  if (r.total.diverged > 0) return 1;
  if (r.options.unmatchedIsDivergent && (r.total.onlyInA > 0 || r.total.onlyInB > 0)) return 1;
  return 0;
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
  if (!t.detail.empty()) j["detail"] = t.detail;
  return j;
}

Json pairJson(const OpPair& p) {
  Json j{{"step", p.step},   {"status", toString(p.status)},
         {"name", p.name},   {"phase", p.phase},
         {"scope", p.scope}, {"exactSignature", p.exactSignature}};
  if (!p.nameB.empty()) j["nameB"] = p.nameB;
  j["a"] = p.inA ? Json{{"seq", p.seqA}, {"stackId", p.stackIdA}} : Json(nullptr);
  j["b"] = p.inB ? Json{{"seq", p.seqB}, {"stackId", p.stackIdB}} : Json(nullptr);
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
                       {"phase", l.phase},
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
  return Json{{"pair", pairJson(d->pair)},
              {"inputs", std::move(inputs)},
              {"chainA", chainJson(d->chainA)},
              {"chainB", chainJson(d->chainB)}};
}

Json stepJson(const StepDiff& s) {
  Json j;
  if (s.step >= 0) j["step"] = s.step;
  j["opsA"] = s.opsA;
  j["opsB"] = s.opsB;
  j["equal"] = s.equal;
  j["withinTolerance"] = s.withinTolerance;
  j["diverged"] = s.diverged;
  j["onlyInA"] = s.onlyInA;
  j["onlyInB"] = s.onlyInB;
  if (!s.alignment.empty()) j["alignment"] = s.alignment;
  return j;
}

}  // namespace

std::string toJson(const DiffReport& r) {
  const DiffOptions& o = r.options;
  int code = diffExitCode(r);
  Json j;
  j["verdict"] = code == 0 ? "equal" : "diverged";
  j["exitCode"] = code;
  j["options"] = Json{{"atol", o.atol},
                      {"rtol", o.rtol},
                      {"maxUlps", o.maxUlps},
                      {"useMd5", o.useMd5},
                      {"useRoundedMd5", o.useRoundedMd5},
                      {"useDumps", o.useDumps},
                      {"useStats", o.useStats},
                      {"mismatchesOnly", o.mismatchesOnly},
                      {"unmatchedIsDivergent", o.unmatchedIsDivergent}};
  j["total"] = stepJson(r.total);
  j["uncomparedTensors"] = r.uncomparedTensors;
  Json steps = Json::array();
  for (const StepDiff& s : r.steps) steps.push_back(stepJson(s));
  j["steps"] = std::move(steps);
  j["firstDivergence"] = divergenceJson(r.first);
  j["rootDivergence"] = divergenceJson(r.root);
  Json pairs = Json::array();
  for (const OpPair& p : r.pairs) pairs.push_back(pairJson(p));
  j["pairs"] = std::move(pairs);
  return j.dump(2);
}

// ---- text --------------------------------------------------------------------------------------

namespace {

std::string opLabel(const OpPair& p) {
  std::string s;
  s += p.inA ? "A #" + std::to_string(p.seqA) : std::string("A -");
  s += p.inB ? "  B #" + std::to_string(p.seqB) : std::string("  B -");
  s += "  " + p.name;
  if (!p.nameB.empty()) s += " / " + p.nameB;
  s += " [" + p.phase + "]";
  if (!p.scope.empty()) s += " " + p.scope;
  return s;
}

std::string tensorLine(const TensorDiff& t) {
  std::string s = std::string(t.role == Role::Input ? "input " : "output ") +
                  std::to_string(t.index) + ": " + toString(t.status) + " (" + toString(t.basis) +
                  ")";
  if (t.basis == DiffBasis::Values)
    s += "  max abs " + fmtNum(t.maxAbs) + "  max rel " + fmtNum(t.maxRel) + "  max ulps " +
         (t.maxUlps == std::numeric_limits<uint64_t>::max() ? std::string("inf")
                                                            : std::to_string(t.maxUlps));
  if (!t.detail.empty()) s += "  " + t.detail;
  return s;
}

void divergenceText(std::string& out, const char* title, const Divergence& d) {
  const OpPair& p = d.pair;
  out += std::string(title) + ": step " + std::to_string(p.step) + "  " + opLabel(p) + "\n";
  out += "  stacks: A " + (p.stackIdA >= 0 ? "stack #" + std::to_string(p.stackIdA) : "none") +
         ", B " + (p.stackIdB >= 0 ? "stack #" + std::to_string(p.stackIdB) : "none") + "\n";
  for (const TensorDiff& t : p.outputs) out += "  " + tensorLine(t) + "\n";
  for (const TensorDiff& t : d.inputs) out += "  " + tensorLine(t) + "\n";
  for (auto [side, chain] : {std::pair{"A", &d.chainA}, std::pair{"B", &d.chainB}}) {
    if (chain->empty()) continue;
    out += std::string("  fed by (run ") + side + "):\n";
    for (const ChainLink& l : *chain) {
      out += std::string(static_cast<size_t>(2 + 2 * l.depth), ' ') + "<- #" +
             std::to_string(l.seq) + " " + l.name + " [" + l.phase + "]";
      if (!l.scope.empty()) out += " " + l.scope;
      out += "  " + std::string(toString(l.status)) + "  -> input " +
             std::to_string(l.consumerInput) + " of #" + std::to_string(l.consumerSeq);
      if (l.stackId >= 0) out += "  stack #" + std::to_string(l.stackId);
      out += "\n";
    }
  }
}

}  // namespace

std::string toText(const DiffReport& r, bool mismatchesOnly) {
  std::string out;
  int code = diffExitCode(r);
  const StepDiff& t = r.total;
  out += code == 0 ? "EQUAL within tolerance" : "DIVERGED";
  out += " (atol " + fmtNum(r.options.atol) + ", rtol " + fmtNum(r.options.rtol);
  if (r.options.maxUlps > 0) out += ", max ulps " + std::to_string(r.options.maxUlps);
  out += ")\n";
  out += "summary: " + std::to_string(t.equal) + " equal, " + std::to_string(t.withinTolerance) +
         " within tolerance, " + std::to_string(t.diverged) + " diverged, " +
         std::to_string(t.onlyInA) + " only in A, " + std::to_string(t.onlyInB) + " only in B";
  if (r.uncomparedTensors > 0)
    out += " (" + std::to_string(r.uncomparedTensors) + " output tensors had nothing to compare)";
  out += "\n\n";
  char line[160];
  std::snprintf(line, sizeof line, "%6s %8s %8s %8s %8s %8s %8s %8s  %s\n", "step", "ops A",
                "ops B", "equal", "within", "diverged", "only A", "only B", "alignment");
  out += line;
  for (const StepDiff& s : r.steps) {
    std::snprintf(line, sizeof line, "%6lld %8lld %8lld %8lld %8lld %8lld %8lld %8lld  %s\n",
                  static_cast<long long>(s.step), static_cast<long long>(s.opsA),
                  static_cast<long long>(s.opsB), static_cast<long long>(s.equal),
                  static_cast<long long>(s.withinTolerance), static_cast<long long>(s.diverged),
                  static_cast<long long>(s.onlyInA), static_cast<long long>(s.onlyInB),
                  s.alignment.c_str());
    out += line;
  }
  out += "\n";
  if (r.first) {
    divergenceText(out, "first divergence", *r.first);
    out += "\n";
    if (r.root && r.root->pair.seqA == r.first->pair.seqA) {
      out += "root divergence: the first divergence (its inputs all match)\n\n";
    } else if (r.root) {
      divergenceText(out, "root divergence", *r.root);
      out += "\n";
    } else {
      out +=
          "root divergence: none found (every diverged op has a diverged input: the "
          "difference enters through tensors no aligned op produced, e.g. parameters or "
          "data)\n\n";
    }
  }
  bool header = false;
  for (const OpPair& p : r.pairs) {
    if (mismatchesOnly && p.status == DiffStatus::Equal) continue;
    if (!header) out += mismatchesOnly ? "mismatches:\n" : "pairs:\n", header = true;
    const char* mark = p.status == DiffStatus::Equal             ? "="
                       : p.status == DiffStatus::WithinTolerance ? "~"
                       : p.status == DiffStatus::Diverged        ? "!"
                       : p.inA                                   ? "<"
                                                                 : ">";
    out += std::string("  ") + mark + " step " + std::to_string(p.step) + "  " + opLabel(p);
    if (!p.exactSignature && p.inA && p.inB) out += "  (signature differs)";
    out += "\n";
    if (p.status != DiffStatus::Equal)
      for (const TensorDiff& td : p.outputs)
        if (td.status != DiffStatus::Equal) out += "      " + tensorLine(td) + "\n";
  }
  return out;
}

}  // namespace keel::storage
