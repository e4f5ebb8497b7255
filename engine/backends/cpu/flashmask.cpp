// flashmask_attention on the cpu backend: tiled FlashAttention-2 (online softmax) over (query tile
// × key tile) pairs that are classified, from per-key-tile min/max of the column bounds, as
// skipped, partially masked (element mask) or unmasked (no mask work). Forward is row-parallel (a
// task is one batch, head and query tile); backward column-parallel (a task is one batch, kv head
// and group of key tiles). Invariant: every output element is produced by one task in a fixed
// order, so the bits do not depend on the thread count or on tile skipping (Note [FlashMask
// determinism]).
#include <cblas.h>

#include <atomic>
#include <numeric>

#include "cpu_util.h"
#include "flashmask/flashmask_geometry.h"
#include "keel/flashmask.h"
#include "keel/random.h"
#include "keel/runtime.h"
#include "kernels.h"

namespace keel::cpu {
namespace {

namespace fm = keel::detail::flashmask;

// Note [FlashMask tile shape]: a query tile has 64 rows; a key tile has as many columns (at most
// 64, a multiple of 16) as keep every tile product at or under 262144 multiply-adds, the size below
// which OpenBLAS runs a gemm on the calling thread. Our own tasks are the parallelism: a larger
// product would make OpenBLAS start its threads from inside every worker.
// keel::flashmask::tileShape is the one definition.
//
// Note [FlashMask determinism]: the forward task for (b, h, query tile) walks key tiles in order
// and owns its output rows and log-sum-exp. The backward task for (b, kv head, key group) walks its
// key tiles in order, and for each the query heads of the group and the query tiles in order; it
// owns dK and dV of its key tiles and a private dQ partial sum for its group. dQ is the sum of the
// group partials in group order, times the scale. The number of groups depends only on the problem
// size. So no floating-point sum depends on scheduling: no atomics on floats, any thread count
// gives the same bits. A skipped tile contributes exact zeros when it is not skipped (probabilities
// 0, row maxima and sums unchanged, rescale factor exactly 1), so skip_tiles = false gives the same
// bits.
constexpr int64_t kMaxKeyGroups = 8;

inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              blasint(m), blasint(n), blasint(k), 1.0f, a, blasint(lda), b, blasint(ldb), beta, c,
              blasint(ldc));
}
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
                 const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              blasint(m), blasint(n), blasint(k), 1.0, a, blasint(lda), b, blasint(ldb), beta, c,
              blasint(ldc));
}

// y[i] = exp(x[i] - shift).
inline void expShift(const float* x, float shift, float* y, int64_t n) {
  expShiftArray(x, shift, y, n);
}
inline void expShift(const double* x, double shift, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i] - shift);
}

// Fixed-order sum: 8 lanes, combined pairwise.
template <typename C>
C rowSum(const C* x, int64_t n) {
  C lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) lane[k] += x[i + k];
  for (int k = 0; i < n; ++i, ++k) lane[k] += x[i];
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}
template <typename C>
C rowMax(const C* x, int64_t n) {
  C m = -std::numeric_limits<C>::infinity();
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// A contiguous compute-type copy of t (times mul), or t's own data when that is already one.
template <typename T, typename C>
struct Operand {
  const C* p = nullptr;
  std::vector<C> own;
};
template <typename T, typename C>
Operand<T, C> asCompute(const Tensor& t, C mul = C(1)) {
  Operand<T, C> o;
  if constexpr (std::is_same_v<T, C>) {
    if (mul == C(1) && t.isContiguous()) {
      o.p = t.data<C>();
      return o;
    }
  }
  Tensor ct = contig(t);
  const T* s = ct.data<T>();
  o.own.resize(size_t(t.numel()));
  C* d = o.own.data();
  parallelFor(t.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) d[i] = load(s[i]) * mul;
  });
  o.p = d;
  return o;
}

struct Problem {
  int64_t b, sq, h, d, sk, hk, grp, hm;
  fm::Geometry g;
  double scale, p;
  uint64_t seed, offset;
  int64_t br, bc, nqt, nkt;
  std::vector<fm::ColumnBounds> bounds;         // per (b, mask head)
  std::vector<std::vector<fm::TileClass>> cls;  // per (b, mask head): [nqt * nkt]

  int64_t maskHead(int64_t kh) const { return hm == 1 ? 0 : kh; }
  const fm::ColumnBounds& cb(int64_t bi, int64_t kh) const {
    return bounds[size_t(bi * hm + maskHead(kh))];
  }
  fm::TileClass tile(int64_t bi, int64_t kh, int64_t qt, int64_t kt) const {
    return cls[size_t(bi * hm + maskHead(kh))][size_t(qt * nkt + kt)];
  }
};

Problem makeProblem(const KernelCtx& c, const Tensor& q, const Tensor& k, const Tensor* idx) {
  Problem P;
  P.b = q.size(0), P.sq = q.size(1), P.h = q.size(2), P.d = q.size(3);
  P.sk = k.size(1), P.hk = k.size(2), P.grp = P.h / P.hk;
  P.hm = idx ? idx->size(1) : 1;
  P.g =
      fm::Geometry{P.sq, P.sk, c.attrs.getBool("causal", false), c.attrs.getInt("window_size", -1)};
  P.scale = c.attrs.getDouble("scale", 0.0);
  if (P.scale == 0.0) P.scale = 1.0 / std::sqrt(double(P.d));
  P.p = c.attrs.getDouble("dropout", 0.0);
  P.seed = uint64_t(c.attrs.getInt("seed", 0));
  P.offset = uint64_t(c.attrs.getInt("offset", 0));
  const bool skip = c.attrs.getBool("skip_tiles", true);
  const flashmask::TileShape ts = flashmask::tileShape(P.d);
  P.br = ts.rows, P.bc = ts.cols;
  P.nqt = (P.sq + P.br - 1) / P.br, P.nkt = (P.sk + P.bc - 1) / P.bc;
  Tensor none;
  for (int64_t bi = 0; bi < P.b; ++bi)
    for (int64_t m = 0; m < P.hm; ++m) {
      P.bounds.push_back(fm::readBounds(idx ? *idx : none, bi, m, P.g));
      std::vector<fm::TileBounds> tb = fm::tileBounds(P.bounds.back(), P.sk, P.bc);
      std::vector<fm::TileClass> cl(size_t(P.nqt * P.nkt), fm::TileClass::Partial);
      if (skip)
        for (int64_t qt = 0; qt < P.nqt; ++qt)
          for (int64_t kt = 0; kt < P.nkt; ++kt)
            cl[size_t(qt * P.nkt + kt)] =
                fm::classify(tb[size_t(kt)], P.g, qt * P.br, std::min(P.sq, (qt + 1) * P.br),
                             kt * P.bc, std::min(P.sk, (kt + 1) * P.bc));
      P.cls.push_back(std::move(cl));
    }
  return P;
}

// Cost of a tile pair for the heaviest-first order.
inline int64_t tileCost(fm::TileClass c) {
  return c == fm::TileClass::Skip ? 0 : c == fm::TileClass::Partial ? 3 : 2;
}

// Runs fn(task, scratch) for every task, heaviest first, pulled from a shared counter by one loop
// per thread. Task results must not depend on which thread runs them.
template <typename Scratch, typename F>
void runTasks(const std::vector<int64_t>& cost, F&& fn) {
  std::vector<int64_t> order(cost.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return cost[size_t(a)] > cost[size_t(b)]; });
  const auto n = int64_t(order.size());
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(numThreads(), n));
  parallelFor(workers, 1, [&](int64_t, int64_t) {
    Scratch s;
    for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < n;)
      fn(order[size_t(t)], s);
  });
}

// Sets masked scores of a partial tile (rows [m0, m0+rows), columns [n0, n0+cols)) to -inf.
template <typename C>
void applyMask(const Problem& P, const fm::ColumnBounds& cb, int64_t m0, int64_t rows, int64_t n0,
               int64_t cols, C* s, int64_t lds) {
  const int32_t *lts = cb.lts.data() + n0, *lte = cb.lte.data() + n0;
  const int32_t *uts = cb.uts.data() + n0, *ute = cb.ute.data() + n0;
  const bool causal = P.g.causal;
  const bool win = P.g.window > 0;
  const auto w = int32_t(win ? P.g.window : 0);
  const C ninf = -std::numeric_limits<C>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    const auto i = int32_t(m0 + r);
    const auto ip = int32_t(m0 + r + P.g.diag());
    C* row = s + r * lds;
    for (int64_t cc = 0; cc < cols; ++cc) {
      const auto j = int32_t(n0 + cc);
      const bool m = ((i >= lts[cc]) & (i < lte[cc])) | ((i >= uts[cc]) & (i < ute[cc])) |
                     (causal & (j > ip)) | (win & ((ip - j >= w) | (!causal & (j - ip >= w))));
      row[cc] = m ? ninf : row[cc];
    }
  }
}

// Multiplies p[0..cols) by the dropout factor (0 or 1/(1-p)) of row (b, h, i), columns n0...
template <typename C>
void applyDropout(const Problem& P, int64_t bi, int64_t h, int64_t i, int64_t n0, int64_t cols,
                  C* p, float* u) {
  const uint64_t first = uint64_t(((bi * P.h + h) * P.sq + i) * P.sk + n0);
  philoxUniformBlock(P.seed, P.offset, first, cols, u);
  const C keep = C(1.0 / (1.0 - P.p));
  for (int64_t c = 0; c < cols; ++c) p[c] = double(u[c]) >= P.p ? p[c] * keep : C(0);
}

template <typename C>
struct FwdScratch {
  std::vector<C> s, pr, acc, m, l;
  std::vector<float> u;
};

template <typename T>
void forward(const KernelCtx& c) {
  using C = CompT<T>;
  using L = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const Tensor &q = c.inputs[0], &k = c.inputs[1], &v = c.inputs[2];
  const Tensor* idx = c.inputs.size() == 4 ? &c.inputs[3] : nullptr;
  const Problem P = makeProblem(c, q, k, idx);
  T* out = c.outputs[0].data<T>();
  L* lse = c.outputs[1].data<L>();
  if (q.numel() == 0) return;
  Operand<T, C> Q = asCompute<T, C>(q, C(P.scale)), K = asCompute<T, C>(k), V = asCompute<T, C>(v);
  const int64_t ldq = P.h * P.d, ldk = P.hk * P.d, D = P.d;

  std::vector<int64_t> cost(size_t(P.b * P.h * P.nqt));
  for (int64_t t = 0; t < int64_t(cost.size()); ++t) {
    const int64_t qt = t % P.nqt, h = (t / P.nqt) % P.h, bi = t / (P.nqt * P.h);
    int64_t w = 1;
    for (int64_t kt = 0; kt < P.nkt; ++kt) w += tileCost(P.tile(bi, h / P.grp, qt, kt));
    cost[size_t(t)] = w;
  }
  runTasks<FwdScratch<C>>(cost, [&](int64_t t, FwdScratch<C>& s) {
    const int64_t qt = t % P.nqt, h = (t / P.nqt) % P.h, bi = t / (P.nqt * P.h);
    const int64_t kh = h / P.grp, m0 = qt * P.br, rows = std::min(P.sq, m0 + P.br) - m0;
    const fm::ColumnBounds& cb = P.cb(bi, kh);
    s.s.resize(size_t(P.br * P.bc));
    s.pr.resize(size_t(P.br * P.bc));
    s.u.resize(size_t(P.bc));
    s.acc.assign(size_t(P.br * D), C(0));
    s.m.assign(size_t(P.br), -std::numeric_limits<C>::infinity());
    s.l.assign(size_t(P.br), C(0));
    const C* qp = Q.p + ((bi * P.sq + m0) * P.h + h) * D;
    for (int64_t kt = 0; kt < P.nkt; ++kt) {
      const fm::TileClass cl = P.tile(bi, kh, qt, kt);
      if (cl == fm::TileClass::Skip) continue;
      const int64_t n0 = kt * P.bc, cols = std::min(P.sk, n0 + P.bc) - n0;
      const C* kp = K.p + ((bi * P.sk + n0) * P.hk + kh) * D;
      const C* vp = V.p + ((bi * P.sk + n0) * P.hk + kh) * D;
      C* S = s.s.data();
      C* Pr = s.pr.data();
      gemm(false, true, rows, cols, D, qp, ldq, kp, ldk, C(0), S, P.bc);
      const bool partial = cl == fm::TileClass::Partial;
      if (partial) applyMask(P, cb, m0, rows, n0, cols, S, P.bc);
      for (int64_t r = 0; r < rows; ++r) {
        const C* srow = S + r * P.bc;
        C* prow = Pr + r * P.bc;
        const C mnew = std::max(s.m[size_t(r)], rowMax(srow, cols));
        if (mnew == -std::numeric_limits<C>::infinity()) {  // nothing visible yet
          std::fill(prow, prow + cols, C(0));
          continue;
        }
        const C mold = s.m[size_t(r)];
        const C alpha = mold == -std::numeric_limits<C>::infinity() ? C(0) : std::exp(mold - mnew);
        expShift(srow, mnew, prow, cols);
        if (partial)
          for (int64_t cc = 0; cc < cols; ++cc)
            prow[cc] = srow[cc] == -std::numeric_limits<C>::infinity() ? C(0) : prow[cc];
        s.l[size_t(r)] = alpha * s.l[size_t(r)] + rowSum(prow, cols);
        s.m[size_t(r)] = mnew;
        if (alpha != C(1)) {
          C* a = s.acc.data() + r * D;
          for (int64_t x = 0; x < D; ++x) a[x] *= alpha;
        }
        if (P.p > 0.0) applyDropout(P, bi, h, m0 + r, n0, cols, prow, s.u.data());
      }
      gemm(false, false, rows, D, cols, Pr, P.bc, vp, ldk, C(1), s.acc.data(), D);
    }
    for (int64_t r = 0; r < rows; ++r) {
      T* o = out + ((bi * P.sq + m0 + r) * P.h + h) * D;
      const C l = s.l[size_t(r)];
      L& ls = lse[(bi * P.h + h) * P.sq + m0 + r];
      if (l == C(0)) {
        for (int64_t x = 0; x < D; ++x) o[x] = store<T>(C(0));
        ls = -std::numeric_limits<L>::infinity();
        continue;
      }
      const C inv = C(1) / l;
      const C* a = s.acc.data() + r * D;
      for (int64_t x = 0; x < D; ++x) o[x] = store<T>(a[x] * inv);
      ls = L(s.m[size_t(r)] + std::log(l));
    }
  });
}

template <typename C>
struct BwdScratch {
  std::vector<C> s, pr, pd, dp, dk, dv;
  std::vector<float> u;
};

template <typename T>
void backward(const KernelCtx& c) {
  using C = CompT<T>;
  using L = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const Tensor &q = c.inputs[1], &k = c.inputs[2], &v = c.inputs[3];
  const Tensor* idx = c.inputs.size() == 8 ? &c.inputs[7] : nullptr;
  const Problem P = makeProblem(c, q, k, idx);
  T* dq = c.outputs[0].data<T>();
  T* dk = c.outputs[1].data<T>();
  T* dv = c.outputs[2].data<T>();
  const int64_t D = P.d, ldq = P.h * P.d, ldk = P.hk * P.d;
  if (c.outputs[1].numel() > 0 && q.numel() == 0) {
    std::fill(dk, dk + c.outputs[1].numel(), store<T>(C(0)));
    std::fill(dv, dv + c.outputs[2].numel(), store<T>(C(0)));
  }
  if (q.numel() == 0 || k.numel() == 0) {
    std::fill(dq, dq + c.outputs[0].numel(), store<T>(C(0)));
    return;
  }
  Operand<T, C> Q = asCompute<T, C>(q, C(P.scale)), K = asCompute<T, C>(k), V = asCompute<T, C>(v);
  Operand<T, C> dO = asCompute<T, C>(c.inputs[0]);
  // lse and Delta_i = rowsum(dO ∘ O) - grad_lse_i, per (b, h, i).
  const int64_t nrow = P.b * P.h * P.sq;
  std::vector<C> lse(static_cast<size_t>(nrow)), delta(static_cast<size_t>(nrow));
  {
    Tensor o = contig(c.inputs[4]), l = contig(c.inputs[5]), gl = contig(c.inputs[6]);
    const T* op = o.data<T>();
    const L* lp = l.data<L>();
    const L* glp = gl.data<L>();
    parallelFor(nrow, 256, [&](int64_t b0, int64_t e0) {
      for (int64_t r = b0; r < e0; ++r) {
        const int64_t i = r % P.sq, h = (r / P.sq) % P.h, bi = r / (P.sq * P.h);
        const int64_t e = ((bi * P.sq + i) * P.h + h) * D;
        double acc = 0;
        for (int64_t x = 0; x < D; ++x) acc += double(dO.p[e + x]) * double(load(op[e + x]));
        lse[size_t(r)] = C(lp[r]);
        delta[size_t(r)] = C(acc - double(glp[r]));
      }
    });
  }
  const int64_t tpg = (P.nkt + kMaxKeyGroups - 1) / kMaxKeyGroups;
  const int64_t groups = (P.nkt + tpg - 1) / tpg;
  const int64_t qn = q.numel();
  std::vector<C> dqPart(size_t(groups * qn), C(0));

  std::vector<int64_t> cost(size_t(P.b * P.hk * groups));
  for (int64_t t = 0; t < int64_t(cost.size()); ++t) {
    const int64_t g = t % groups, kh = (t / groups) % P.hk, bi = t / (groups * P.hk);
    int64_t w = 1;
    for (int64_t kt = g * tpg; kt < std::min(P.nkt, (g + 1) * tpg); ++kt)
      for (int64_t qt = 0; qt < P.nqt; ++qt) w += tileCost(P.tile(bi, kh, qt, kt));
    cost[size_t(t)] = w;
  }
  runTasks<BwdScratch<C>>(cost, [&](int64_t t, BwdScratch<C>& s) {
    const int64_t g = t % groups, kh = (t / groups) % P.hk, bi = t / (groups * P.hk);
    const fm::ColumnBounds& cb = P.cb(bi, kh);
    C* dqp = dqPart.data() + g * qn;
    s.s.resize(size_t(P.br * P.bc));
    s.pr.resize(size_t(P.br * P.bc));
    s.pd.resize(size_t(P.br * P.bc));
    s.dp.resize(size_t(P.br * P.bc));
    s.u.resize(size_t(P.bc));
    for (int64_t kt = g * tpg; kt < std::min(P.nkt, (g + 1) * tpg); ++kt) {
      const int64_t n0 = kt * P.bc, cols = std::min(P.sk, n0 + P.bc) - n0;
      const C* kp = K.p + ((bi * P.sk + n0) * P.hk + kh) * D;
      const C* vp = V.p + ((bi * P.sk + n0) * P.hk + kh) * D;
      s.dk.assign(size_t(P.bc * D), C(0));
      s.dv.assign(size_t(P.bc * D), C(0));
      for (int64_t hh = 0; hh < P.grp; ++hh) {
        const int64_t h = kh * P.grp + hh;
        for (int64_t qt = 0; qt < P.nqt; ++qt) {
          const fm::TileClass cl = P.tile(bi, kh, qt, kt);
          if (cl == fm::TileClass::Skip) continue;
          const int64_t m0 = qt * P.br, rows = std::min(P.sq, m0 + P.br) - m0;
          const int64_t qoff = ((bi * P.sq + m0) * P.h + h) * D;
          const C* qp = Q.p + qoff;
          const C* gp = dO.p + qoff;
          C *S = s.s.data(), *Pr = s.pr.data(), *dP = s.dp.data();
          const bool drop = P.p > 0.0;
          C* Pd = drop ? s.pd.data() : Pr;
          gemm(false, true, rows, cols, D, qp, ldq, kp, ldk, C(0), S, P.bc);
          const bool partial = cl == fm::TileClass::Partial;
          if (partial) applyMask(P, cb, m0, rows, n0, cols, S, P.bc);
          const C* ls = lse.data() + (bi * P.h + h) * P.sq + m0;
          for (int64_t r = 0; r < rows; ++r) {
            C* prow = Pr + r * P.bc;
            const C* srow = S + r * P.bc;
            if (ls[r] == -std::numeric_limits<C>::infinity()) {
              std::fill(prow, prow + cols, C(0));
            } else {
              expShift(srow, ls[r], prow, cols);
              if (partial)
                for (int64_t cc = 0; cc < cols; ++cc)
                  prow[cc] = srow[cc] == -std::numeric_limits<C>::infinity() ? C(0) : prow[cc];
            }
            if (drop) {
              std::copy(prow, prow + cols, Pd + r * P.bc);
              applyDropout(P, bi, h, m0 + r, n0, cols, Pd + r * P.bc, s.u.data());
            }
          }
          gemm(true, false, cols, D, rows, Pd, P.bc, gp, ldq, C(1), s.dv.data(), D);
          gemm(false, true, rows, cols, D, gp, ldq, vp, ldk, C(0), dP, P.bc);
          const C* dl = delta.data() + (bi * P.h + h) * P.sq + m0;
          for (int64_t r = 0; r < rows; ++r) {
            C* dprow = dP + r * P.bc;
            const C* prow = Pr + r * P.bc;
            if (drop) {
              // dP of the undropped probabilities: the factor is Pd / P where P > 0.
              const C* pdrow = Pd + r * P.bc;
              const C keep = C(1.0 / (1.0 - P.p));
              for (int64_t cc = 0; cc < cols; ++cc)
                dprow[cc] = pdrow[cc] != C(0) ? dprow[cc] * keep : C(0);
            }
            const C dr = dl[r];
            for (int64_t cc = 0; cc < cols; ++cc) dprow[cc] = prow[cc] * (dprow[cc] - dr);
          }
          gemm(true, false, cols, D, rows, dP, P.bc, qp, ldq, C(1), s.dk.data(), D);
          gemm(false, false, rows, D, cols, dP, P.bc, kp, ldk, C(1), dqp + qoff, ldq);
        }
      }
      for (int64_t cc = 0; cc < cols; ++cc) {
        const int64_t e = ((bi * P.sk + n0 + cc) * P.hk + kh) * D;
        for (int64_t x = 0; x < D; ++x) {
          dk[e + x] = store<T>(s.dk[size_t(cc * D + x)]);
          dv[e + x] = store<T>(s.dv[size_t(cc * D + x)]);
        }
      }
    }
  });
  const C sc = C(P.scale);
  parallelFor(qn, kGrain, [&](int64_t b0, int64_t e0) {
    for (int64_t e = b0; e < e0; ++e) {
      C acc = dqPart[size_t(e)];
      for (int64_t g = 1; g < groups; ++g) acc += dqPart[size_t(g * qn + e)];
      dq[e] = store<T>(acc * sc);
    }
  });
}

}  // namespace

void kFlashmaskAttention(const KernelCtx& c) {
  ensureBlasBuffer();  // Note [OpenBLAS under an address-space limit]
  visitFloatInput(c, [&]<typename T>() { forward<T>(c); });
}

void kFlashmaskAttentionBackward(const KernelCtx& c) {
  ensureBlasBuffer();
  visitFloatInput(c, [&]<typename T>() { backward<T>(c); });
}

}  // namespace keel::cpu
