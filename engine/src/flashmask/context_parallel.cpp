// Context-parallel FlashMask attention: the zig-zag split, each chunk pair's part of the global
// mask, the ring of keys and values, and the log-sum-exp merge. See Note [Context-parallel
// attention] in keel/context_parallel.h.
#include "keel/context_parallel.h"

#include <algorithm>
#include <limits>

#include "keel/autograd.h"
#include "keel/dist.h"
#include "keel/error.h"
#include "keel/ops.h"

#include "graph_tie.h"

namespace keel::cp {

namespace {

struct Chunk {
  int64_t start = 0, len = 0;  // global rows [start, start + len)
};

// Rank r's chunks, in sequence order.
std::vector<Chunk> chunksOf(int64_t s, int n, int r, Split split) {
  KEEL_CHECK(n >= 1 && r >= 0 && r < n, "context parallel: rank ", r, " of ", n);
  const int64_t parts = split == Split::ZigZag ? 2 * int64_t(n) : n;
  KEEL_CHECK(s > 0 && s % parts == 0, "context parallel: a sequence of ", s,
             " tokens does not split into ", parts, " equal chunks (", splitName(split), " over ",
             n, " ranks)");
  const int64_t len = s / parts;
  if (split == Split::Contiguous) return {{r * len, len}};
  return {{r * len, len}, {(parts - 1 - r) * len, len}};
}

// The rows of one mask column that are hidden, as two intervals of global rows [lo0, lo1) and
// [up0, up1) (either may be empty), the causal diagonal and the window folded in.
struct Hidden {
  int64_t lo0, lo1, up0, up1;
};

class ColumnMask {
 public:
  ColumnMask(const flashmask::Mask& m, int64_t s, int64_t window) : s_(s), window_(window) {
    causal_ = m.causal;
    if (m.startendRowIndices.defined()) {
      const Tensor& t = m.startendRowIndices;
      KEEL_CHECK(t.dim() == 4 && t.size(2) == s, "context parallel: mask indices ",
                 shapeStr(t.shape()), " do not describe ", s, " keys");
      planes_ = t.size(0) * t.size(1);
      c_ = t.size(3);
      values_ =
          (t.device().isHost() ? t : t.to(Device(Backend::Cpu))).contiguous().toVector<int32_t>();
    }
  }
  int64_t planes() const { return planes_; }
  Hidden at(int64_t plane, int64_t j) const {
    Hidden h{s_, s_, 0, 0};
    if (c_ > 0) {
      const int32_t* v = values_.data() + size_t((plane * s_ + j) * c_);
      if (causal_) {
        h.lo0 = v[0];
        h.lo1 = c_ >= 2 ? v[1] : s_;
      } else if (c_ == 2) {
        h.lo0 = v[0];
        h.up1 = v[1];
      } else {
        h = {v[0], v[1], v[2], v[3]};
      }
    }
    if (causal_) h.up0 = 0, h.up1 = std::max(h.up1, j);  // rows above the diagonal
    if (window_ >= 1) {
      const int64_t below = j + window_;  // rows i >= j + w are out of the window
      if (below < s_) {
        KEEL_CHECK(h.lo0 >= h.lo1 || h.lo1 >= below,
                   "context parallel: a window on a mask whose "
                   "lower bound ends before the window does is not supported");
        h.lo0 = h.lo0 >= h.lo1 ? below : std::min(h.lo0, below);
        h.lo1 = s_;
      }
      const int64_t above = j - window_ + 1;  // rows i <= j - w
      if (!causal_ && above > 0) {
        KEEL_CHECK(h.up0 >= h.up1 || h.up0 == 0,
                   "context parallel: a window on a mask with "
                   "an upper band that does not start at row 0 is not supported");
        h.up1 = h.up0 >= h.up1 ? above : std::max(h.up1, above);  // an empty band: the window's
        h.up0 = 0;
      }
    }
    return h;
  }

 private:
  int64_t s_, window_;
  bool causal_ = false;
  int64_t planes_ = 1, c_ = 0;
  std::vector<int32_t> values_;
};

// An interval clamped to the rows [q0, q0 + lq), made local; empty as [lq, lq) or [0, 0).
std::pair<int64_t, int64_t> local(int64_t a, int64_t b, int64_t q0, int64_t lq) {
  a = std::clamp<int64_t>(a - q0, 0, lq);
  b = std::clamp<int64_t>(b - q0, 0, lq);
  return a < b ? std::make_pair(a, b) : std::make_pair(int64_t(0), int64_t(0));
}

// How many of the rows [0, lq) two local intervals leave visible.
int64_t visibleRows(std::pair<int64_t, int64_t> x, std::pair<int64_t, int64_t> y, int64_t lq) {
  const int64_t lenX = x.second - x.first, lenY = y.second - y.first;
  const int64_t overlap =
      std::max<int64_t>(0, std::min(x.second, y.second) - std::max(x.first, y.first));
  return lq - (lenX + lenY - overlap);
}

// One (query chunk, key chunk) pair's part of the global mask: non-causal C=4 indices [planes
// shaped like the mask's, Lk, 4] over the chunk's local rows, or undefined when nothing is hidden.
struct PairMask {
  bool empty = false;    // the mask hides every (query, key) pair: nothing to compute
  Tensor indices;        // undefined: nothing hidden
  int64_t visible0 = 0;  // visible pairs of plane 0
};

PairMask pairMask(const ColumnMask& cols, const Shape& maskShape, Chunk q, Chunk k) {
  const int64_t planes = cols.planes();
  std::vector<int32_t> out(size_t(planes * k.len * 4));
  bool anyHidden = false, anyVisible = false;
  PairMask pm;
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t j = 0; j < k.len; ++j) {
      const Hidden h = cols.at(p, k.start + j);
      const auto lo = local(h.lo0, h.lo1, q.start, q.len);
      const auto up = local(h.up0, h.up1, q.start, q.len);
      const int64_t vis = visibleRows(lo, up, q.len);
      anyVisible = anyVisible || vis > 0;
      anyHidden = anyHidden || vis < q.len;
      if (p == 0) pm.visible0 += vis;
      int32_t* o = out.data() + size_t((p * k.len + j) * 4);
      // Empty intervals as [Lq, Lq) below and [0, 0) above.
      o[0] = int32_t(lo.first < lo.second ? lo.first : q.len);
      o[1] = int32_t(lo.first < lo.second ? lo.second : q.len);
      o[2] = int32_t(up.first);
      o[3] = int32_t(up.second);
    }
  pm.empty = !anyVisible;
  if (anyHidden && anyVisible) {
    const Shape shape{maskShape.empty() ? 1 : maskShape[0], maskShape.empty() ? 1 : maskShape[1],
                      k.len, 4};
    pm.indices = Tensor::fromVector(out, shape, DType::Int32, Device(Backend::Cpu));
  }
  return pm;
}

// The log-sum-exp merge of one query chunk's partial results, in float32 (or float64) whatever
// the inputs' dtype, rounded once at the end as the kernel rounds its output.
std::pair<Tensor, Tensor> merge(const std::vector<std::pair<Tensor, Tensor>>& parts) {
  if (parts.size() == 1) return parts[0];
  const double inf = std::numeric_limits<double>::infinity();
  const DType outType = parts[0].first.dtype(), wide = parts[0].second.dtype();
  Tensor m = parts[0].second.detach();
  for (size_t i = 1; i < parts.size(); ++i) m = ops::maximum(m, parts[i].second.detach());
  // Rows that see no key anywhere have every lse -inf: shift by 0 there.
  m = ops::maskedFill(m, ops::eq(m, ops::fill(m.shape(), -inf, m.dtype(), m.device())), 0.0);
  std::vector<Tensor> weights;
  Tensor total;
  for (const auto& [o, lse] : parts) {
    weights.push_back(ops::exp(ops::sub(lse, m)));
    total = total.defined() ? ops::add(total, weights.back()) : weights.back();
  }
  // Rows no key reached: total 0, lse -inf (through log(1), so its gradient stays finite).
  const Tensor none = ops::eq(total, ops::fill(total.shape(), 0.0, total.dtype(), total.device()));
  const Tensor safe = ops::maskedFill(total, none, 1.0);
  const Tensor lse = ops::maskedFill(ops::add(m, ops::log(safe)), none, -inf);
  Tensor out;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Tensor w = ops::unsqueeze(ops::transpose(ops::div(weights[i], safe), 1, 2), -1);
    Tensor o = parts[i].first;  // [B, Lq, H, D]; w [B, Lq, H, 1]
    if (o.dtype() != wide) o = ops::cast(o, wide);
    const Tensor term = ops::mul(o, w);
    out = out.defined() ? ops::add(out, term) : term;
  }
  return {outType == wide ? out : ops::cast(out, outType), lse};
}

// Passes kv on round the ring: rank r's kv to rank r+1, rank r-1's back (an all_to_all whose
// only non-empty block goes to the next rank).
Tensor passOn(const Tensor& kv, const std::string& group, int n, int r) {
  std::vector<Tensor> blocks;
  for (int j = 0; j < n; ++j)
    blocks.push_back(j == (r + 1) % n ? kv : Tensor::zeros(kv.shape(), kv.dtype(), kv.device()));
  const Tensor all = ops::allToAll(ops::concat(blocks, 0), group);
  const int64_t b = kv.size(0), from = (r + n - 1) % n;
  return ops::contiguous(ops::slice(all, 0, from * b, (from + 1) * b));
}

}  // namespace

const char* splitName(Split s) {
  return s == Split::ZigZag ? "zigzag" : "contiguous";
}

std::vector<int64_t> localPositions(int64_t s, int ranks, int rank, Split split) {
  std::vector<int64_t> out;
  for (const Chunk& c : chunksOf(s, ranks, rank, split))
    for (int64_t i = 0; i < c.len; ++i) out.push_back(c.start + i);
  return out;
}

Tensor shard(const Tensor& x, int64_t dim, int ranks, int rank, Split split) {
  std::vector<Tensor> parts;
  for (const Chunk& c : chunksOf(x.size(dim), ranks, rank, split))
    parts.push_back(ops::slice(x, dim, c.start, c.start + c.len));
  return parts.size() == 1 ? ops::contiguous(parts[0]) : ops::concat(parts, dim);
}

Tensor unshard(const Tensor& localPart, int64_t dim, Split split, const std::string& group) {
  const int n = dist::group(group).size;
  const int64_t sl = localPart.size(dim), s = sl * n;
  const Tensor all = ops::allGather(ops::contiguous(localPart), dim, group);
  // Where each global chunk sits in the gathered tensor: rank r's block, then its local order.
  std::vector<std::pair<int64_t, Tensor>> byStart;
  for (int r = 0; r < n; ++r) {
    int64_t at = r * sl;
    for (const Chunk& c : chunksOf(s, n, r, split)) {
      byStart.emplace_back(c.start, ops::slice(all, dim, at, at + c.len));
      at += c.len;
    }
  }
  std::sort(byStart.begin(), byStart.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Tensor> parts;
  for (auto& [start, t] : byStart) parts.push_back(t);
  return parts.size() == 1 ? ops::contiguous(parts[0]) : ops::concat(parts, dim);
}

std::vector<double> workShares(const flashmask::Mask& mask, int64_t s, int ranks, Split split,
                               int64_t windowSize) {
  const ColumnMask cols(mask, s, windowSize);
  std::vector<double> shares(size_t(ranks), 0.0);
  double total = 0;
  for (int r = 0; r < ranks; ++r)
    for (const Chunk& q : chunksOf(s, ranks, r, split))
      for (int64_t j = 0; j < s; ++j) {
        const Hidden h = cols.at(0, j);
        const double vis = double(visibleRows(local(h.lo0, h.lo1, q.start, q.len),
                                              local(h.up0, h.up1, q.start, q.len), q.len));
        shares[size_t(r)] += vis;
        total += vis;
      }
  for (double& x : shares) x = total > 0 ? x / total : 0.0;
  return shares;
}

std::pair<Tensor, Tensor> ringAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const flashmask::Mask& mask, int64_t windowSize,
                                        double scale, Split split, const std::string& group,
                                        RingStats* stats) {
  const dist::GroupInfo g = dist::group(group);
  const int n = g.size, r = g.rank;
  KEEL_CHECK(q.dim() == 4 && k.dim() == 4 && v.shape() == k.shape() && k.size(0) == q.size(0) &&
                 k.size(1) == q.size(1),
             "context parallel: q ", shapeStr(q.shape()), ", k ", shapeStr(k.shape()), " and v ",
             shapeStr(v.shape()), " must be [B, S/n, H, D] parts of one sequence");
  const int64_t s = q.size(1) * n;
  const ColumnMask cols(mask, s, windowSize);
  const Shape maskShape =
      mask.startendRowIndices.defined() ? mask.startendRowIndices.shape() : Shape{};
  const std::vector<Chunk> mine = chunksOf(s, n, r, split);
  RingStats st;
  std::vector<std::vector<std::pair<Tensor, Tensor>>> parts(mine.size());
  Tensor kv = ops::concat({k, v}, 0);  // [2B, S/n, Hk, D]: one tensor round the ring
  const int64_t b = k.size(0);
  Tensor anchor;  // ties a received kv no pair used to the output (Note [Collectives in every
                  // rank's backward])
  for (int step = 0; step < n; ++step) {
    if (step > 0) kv = passOn(kv, group, n, r);
    const int owner = (r + n - step) % n;
    const std::vector<Chunk> theirs = chunksOf(s, n, owner, split);
    bool used = false;
    int64_t kAt = 0;
    for (const Chunk& kc : theirs) {
      int64_t qAt = 0;
      for (size_t qi = 0; qi < mine.size(); ++qi) {
        const Chunk& qc = mine[qi];
        const PairMask pm = pairMask(cols, maskShape, qc, kc);
        st.visiblePairs += pm.visible0;
        if (pm.empty) {
          ++st.pairsSkipped;
        } else {
          ++st.pairsComputed;
          used = true;
          const Tensor qs = ops::slice(q, 1, qAt, qAt + qc.len);
          const Tensor ks = ops::slice(ops::slice(kv, 0, 0, b), 1, kAt, kAt + kc.len);
          const Tensor vs = ops::slice(ops::slice(kv, 0, b, 2 * b), 1, kAt, kAt + kc.len);
          Tensor idx = pm.indices;
          if (idx.defined() && idx.size(0) == 1 && q.size(0) > 1)  // the op wants B mask rows
            idx = flashmask::repeatMask(idx, q.size(0), idx.size(1));
          if (idx.defined() && !q.device().isHost()) idx = idx.to(q.device());
          parts[qi].push_back(ops::flashmaskAttention(ops::contiguous(qs), ops::contiguous(ks),
                                                      ops::contiguous(vs), idx, false, -1, 0.0,
                                                      scale));
        }
        qAt += qc.len;
      }
      kAt += kc.len;
    }
    if (!used && step > 0) {
      const Tensor zero = detail::zeroTie(kv);
      anchor = anchor.defined() ? ops::add(anchor, zero) : zero;
    }
  }
  std::vector<Tensor> outs, lses;
  const double inf = std::numeric_limits<double>::infinity();
  for (size_t qi = 0; qi < mine.size(); ++qi) {
    if (parts[qi].empty()) {  // these queries see no key at all
      const int64_t h = q.size(2);
      outs.push_back(Tensor::zeros({q.size(0), mine[qi].len, h, v.size(3)}, q.dtype(), q.device()));
      lses.push_back(ops::fill({q.size(0), h, mine[qi].len}, -inf,
                               q.dtype() == DType::Float64 ? DType::Float64 : DType::Float32,
                               q.device()));
      continue;
    }
    auto [o, l] = merge(parts[qi]);
    outs.push_back(o);
    lses.push_back(l);
  }
  Tensor out = outs.size() == 1 ? outs[0] : ops::concat(outs, 1);
  if (anchor.defined()) out = ops::add(out, ops::cast(anchor, out.dtype()));
  if (stats) *stats = st;
  return {out, lses.size() == 1 ? lses[0] : ops::concat(lses, 2)};
}

}  // namespace keel::cp
