// Run diff, alignment (see diff.h, docs/diff.md): op signatures (FNV-1a over name, phase, scope
// and each tensor's role, index, shape and dtype), then per step an LCS of the signatures with a
// greedy fallback and a looser second pass inside gaps. See Note [Diff alignment].
#include <algorithm>
#include <limits>
#include <unordered_map>

#include "keel/storage/diff.h"

namespace keel::storage {
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
  return fnvStr(fnvStr(fnvStr(kFnvOffset, op.name), std::string(phaseName(op.phase))), op.scope);
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

}  // namespace

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

}  // namespace keel::storage
