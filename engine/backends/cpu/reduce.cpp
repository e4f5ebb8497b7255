// Reductions of the cpu backend: sum, mean (over a dim set), max and argmax (over one dim).
// Deterministic: each output is reduced in a fixed order; long reductions are cut into blocks whose
// size depends only on the shape, and block partials are added in block order (Note [cpu
// determinism]). Float sums accumulate in double across blocks; integer sums wrap in 64 bits.
#include "cpu_util.h"
#include "kernels.h"

namespace keel::cpu {
namespace {

// Elements per partial sum when one reduction is split (fixed: results must not depend on threads).
constexpr int64_t kRedBlock = 1 << 16;
// Columns per unit and rows per partial in column (non-inner) reductions.
constexpr int64_t kColBlock = 256;
constexpr int64_t kRowChunk = 4096;

template <typename T>
using SumAcc = std::conditional_t<kIsFloat<T>, double, int64_t>;

template <typename T>
SumAcc<T> rowSum(const T* x, int64_t n) {
  if constexpr (kIsFloat<T>) {
    return blockSum(x, n);
  } else {
    uint64_t s = 0;
    for (int64_t i = 0; i < n; ++i) s += uint64_t(int64_t(x[i]));
    return int64_t(s);
  }
}

template <typename T>
T storeSum(SumAcc<T> s, double count, bool mean) {
  if constexpr (kIsFloat<T>) {
    return fromDouble<T>(mean ? (count > 0 ? s / count : std::nan("")) : s);
  } else {
    return T(s);  // wraps like the integer ops
  }
}

// out[k] = sum of row k of a contiguous [k, r] matrix.
template <typename T>
void sumRows(const T* x, T* out, int64_t k, int64_t r, double count, bool mean) {
  using A = SumAcc<T>;
  const int64_t nb = std::max<int64_t>(1, (r + kRedBlock - 1) / kRedBlock);
  if (nb == 1) {
    parallelFor(k, std::max<int64_t>(1, kGrain / std::max<int64_t>(r, 1)),
                [&](int64_t b, int64_t e) {
                  for (int64_t i = b; i < e; ++i)
                    out[i] = storeSum<T>(rowSum(x + i * r, r), count, mean);
                });
    return;
  }
  std::vector<A> part(size_t(k * nb));
  parallelFor(k * nb, 1, [&](int64_t b, int64_t e) {
    for (int64_t u = b; u < e; ++u) {
      int64_t row = u / nb, blk = u % nb;
      int64_t s = blk * kRedBlock, len = std::min(kRedBlock, r - s);
      part[size_t(u)] = rowSum(x + row * r + s, len);
    }
  });
  for (int64_t i = 0; i < k; ++i) {
    A s = 0;
    for (int64_t b = 0; b < nb; ++b) {
      if constexpr (kIsFloat<T>)
        s += part[size_t(i * nb + b)];
      else
        s = int64_t(uint64_t(s) + uint64_t(part[size_t(i * nb + b)]));
    }
    out[i] = storeSum<T>(s, count, mean);
  }
}

// out[a, c] = sum over j of x[a, j, c] for a contiguous [k0, r, k1] block.
template <typename T>
void sumMiddle(const T* x, T* out, int64_t k0, int64_t r, int64_t k1, double count, bool mean) {
  using A = SumAcc<T>;
  using U = std::conditional_t<kIsFloat<T>, double, uint64_t>;
  const int64_t cb = (k1 + kColBlock - 1) / kColBlock;
  const int64_t nr = std::max<int64_t>(1, (r + kRowChunk - 1) / kRowChunk);
  std::vector<U> part(size_t(nr > 1 ? k0 * nr * k1 : 0));
  parallelFor(k0 * cb * nr, 1, [&](int64_t b, int64_t e) {
    U acc[kColBlock];
    for (int64_t u = b; u < e; ++u) {
      const int64_t a = u / (cb * nr), rem = u % (cb * nr);
      const int64_t chunk = rem / cb, c0 = (rem % cb) * kColBlock;
      const int64_t w = std::min(kColBlock, k1 - c0);
      const int64_t j0 = chunk * kRowChunk, j1 = std::min(r, j0 + kRowChunk);
      for (int64_t c = 0; c < w; ++c) acc[c] = 0;
      const T* base = x + a * r * k1 + c0;
      for (int64_t j = j0; j < j1; ++j) {
        const T* row = base + j * k1;
        if constexpr (kIsFloat<T>) {
          for (int64_t c = 0; c < w; ++c) acc[c] += double(load(row[c]));
        } else {
          for (int64_t c = 0; c < w; ++c) acc[c] += uint64_t(int64_t(row[c]));
        }
      }
      if (nr == 1) {
        for (int64_t c = 0; c < w; ++c) out[a * k1 + c0 + c] = storeSum<T>(A(acc[c]), count, mean);
      } else {
        U* p = part.data() + (a * nr + chunk) * k1 + c0;
        for (int64_t c = 0; c < w; ++c) p[c] = acc[c];
      }
    }
  });
  if (nr == 1) return;
  parallelFor(k0 * k1, kGrain / 8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t a = i / k1, c = i % k1;
      U s = 0;
      for (int64_t ch = 0; ch < nr; ++ch) s += part[size_t((a * nr + ch) * k1 + c)];
      out[i] = storeSum<T>(A(s), count, mean);
    }
  });
}

void sumOrMean(const KernelCtx& c, bool mean) {
  const Tensor& x = c.inputs[0];
  const Tensor& out = c.outputs[0];
  const auto& dims = c.attrs.getInts("dims");
  std::vector<bool> red(size_t(x.dim()), dims.empty());
  for (int64_t d : dims) red[size_t(normDim(d, x.dim(), c.op.name))] = true;
  const int64_t on = out.numel();
  const double count = double(x.numel()) / double(std::max<int64_t>(1, on));
  if (on == 0) return;

  visitDType(x.dtype(), [&]<typename T>() {
    if constexpr (kIsFloat<T> || kIsInt<T>) {
      if (mean && !kIsFloat<T>) unsupported(c, x.dtype());
      T* o = out.data<T>();
      if (x.numel() == 0) {
        for (int64_t i = 0; i < on; ++i) o[i] = storeSum<T>(SumAcc<T>(0), count, mean);
        return;
      }
      // Group the dims into runs of kept / reduced extents (size-1 dims dropped).
      std::vector<std::pair<int64_t, bool>> groups;
      for (size_t d = 0; d < red.size(); ++d) {
        int64_t s = x.shape()[d];
        if (s == 1) continue;
        if (!groups.empty() && groups.back().second == red[d])
          groups.back().first *= s;
        else
          groups.push_back({s, red[d]});
      }
      const bool simple = groups.size() <= 2 || (groups.size() == 3 && !groups[0].second);
      if (!simple) {
        // Kept dims first, reduced dims last, copied once from x's layout into a buffer.
        Shape ps, pst;
        int64_t keptN = 1, redN = 1;
        for (int pass = 0; pass < 2; ++pass)
          for (size_t d = 0; d < red.size(); ++d)
            if (red[d] == (pass == 1)) {
              ps.push_back(x.shape()[d]);
              pst.push_back(x.strides()[d]);
              (pass == 0 ? keptN : redN) *= x.shape()[d];
            }
        std::vector<T> buf(static_cast<size_t>(x.numel()));
        copyStrided(buf.data(), contiguousStrides(ps), x.data(), pst, ps, sizeof(T));
        sumRows(buf.data(), o, keptN, redN, count, mean);
        return;
      }
      Tensor xc = contig(x);
      const T* px = xc.data<T>();
      if (groups.empty()) {  // a single element
        o[0] = storeSum<T>(rowSum(px, 1), count, mean);
        return;
      }
      if (groups.size() == 1) {
        if (groups[0].second)
          sumRows(px, o, 1, groups[0].first, count, mean);
        else
          sumRows(px, o, groups[0].first, 1, count, mean);
        return;
      }
      if (groups.size() == 2 && !groups[0].second) {  // [K, R]
        sumRows(px, o, groups[0].first, groups[1].first, count, mean);
        return;
      }
      if (groups.size() == 2) {  // [R, K]
        sumMiddle(px, o, 1, groups[0].first, groups[1].first, count, mean);
        return;
      }
      // [K0, R, K1]
      sumMiddle(px, o, groups[0].first, groups[1].first, groups[2].first, count, mean);
    } else {
      unsupported(c, x.dtype());
    }
  });
}

// Max along one dim. NaN counts as the largest value; the first maximum (or first NaN) wins.
template <typename T>
inline bool takes(CompT<T> v, CompT<T> best) {
  if constexpr (std::is_floating_point_v<CompT<T>>)
    return best == best && (v > best || v != v);
  else
    return v > best;
}

// Index of the first maximum of a contiguous run (n >= 1), by `takes`. A vectorizable pass finds
// the maximum (and whether a NaN is present); a second pass finds its first position.
template <typename T>
int64_t runArgmax(const T* x, int64_t n) {
  using C = CompT<T>;
  constexpr int kLanes = 8;
  C m[kLanes];
  int nan[kLanes] = {};
  for (int l = 0; l < kLanes; ++l) m[l] = load(x[0]);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const C v = load(x[i + l]);
      m[l] = v > m[l] ? v : m[l];
      if constexpr (std::is_floating_point_v<C>) nan[l] |= int(v != v);
    }
  C best = m[0];
  bool anyNan = false;
  for (int l = 0; l < kLanes; ++l) {
    best = m[l] > best ? m[l] : best;
    anyNan = anyNan || nan[l] != 0;
  }
  for (; i < n; ++i) {
    const C v = load(x[i]);
    best = v > best ? v : best;
    if constexpr (std::is_floating_point_v<C>) anyNan = anyNan || v != v;
  }
  if (anyNan) {
    for (int64_t j = 0; j < n; ++j)
      if (load(x[j]) != load(x[j])) return j;
  }
  for (int64_t j = 0; j < n; ++j)
    if (load(x[j]) == best) return j;
  return 0;
}

void maxAlong(const KernelCtx& c, bool wantIndex) {
  const Tensor& x = c.inputs[0];
  const Tensor& out = c.outputs[0];
  const int64_t dim = normDim(c.attrs.getInt("dim"), x.dim(), c.op.name);
  const DimSplit sp = splitAt(x.shape(), dim);
  if (out.numel() == 0) return;
  KEEL_CHECK(sp.n > 0, "op '", c.op.name, "': cannot reduce an empty dim of ", shapeStr(x.shape()));
  visitDType(x.dtype(), [&]<typename T>() {
    if constexpr (kIsFloat<T> || kIsInt<T>) {
      using C = CompT<T>;
      Tensor xc = contig(x);
      const T* px = xc.data<T>();
      T* ov = wantIndex ? nullptr : out.data<T>();
      int64_t* oi = wantIndex ? out.data<int64_t>() : nullptr;
      const int64_t n = sp.n, inner = sp.inner;
      if (inner == 1) {
        // Rows longer than kRedBlock are cut into fixed blocks; block winners are combined in
        // block order with the same rule, which keeps "first maximum wins".
        const int64_t nb = (n + kRedBlock - 1) / kRedBlock;
        std::vector<int64_t> win(size_t(sp.outer * nb));
        parallelFor(sp.outer * nb, std::max<int64_t>(1, kGrain / std::min(n, kRedBlock)),
                    [&](int64_t b, int64_t e) {
                      for (int64_t u = b; u < e; ++u) {
                        const int64_t s0 = (u % nb) * kRedBlock;
                        const T* run = px + (u / nb) * n + s0;
                        win[size_t(u)] = s0 + runArgmax(run, std::min(kRedBlock, n - s0));
                      }
                    });
        for (int64_t o = 0; o < sp.outer; ++o) {
          const T* row = px + o * n;
          int64_t bi = win[size_t(o * nb)];
          for (int64_t b = 1; b < nb; ++b) {
            const int64_t cand = win[size_t(o * nb + b)];
            if (takes<T>(load(row[cand]), load(row[bi]))) bi = cand;
          }
          if (wantIndex)
            oi[o] = bi;
          else
            ov[o] = row[bi];
        }
        return;
      }
      const int64_t cb = (inner + kColBlock - 1) / kColBlock;
      parallelFor(sp.outer * cb, 1, [&](int64_t b, int64_t e) {
        C best[kColBlock];
        int64_t bi[kColBlock];
        for (int64_t u = b; u < e; ++u) {
          const int64_t o = u / cb, c0 = (u % cb) * kColBlock;
          const int64_t w = std::min(kColBlock, inner - c0);
          const T* base = px + o * n * inner + c0;
          for (int64_t k = 0; k < w; ++k) {
            best[k] = C(base[k]);
            bi[k] = 0;
          }
          for (int64_t j = 1; j < n; ++j) {
            const T* row = base + j * inner;
            for (int64_t k = 0; k < w; ++k) {
              C v = load(row[k]);
              if (takes<T>(v, best[k])) {
                best[k] = v;
                bi[k] = j;
              }
            }
          }
          for (int64_t k = 0; k < w; ++k) {
            if (wantIndex)
              oi[o * inner + c0 + k] = bi[k];
            else
              ov[o * inner + c0 + k] = store<T>(best[k]);
          }
        }
      });
    } else {
      unsupported(c, x.dtype());
    }
  });
}

}  // namespace

void kSum(const KernelCtx& c) {
  sumOrMean(c, false);
}
void kMean(const KernelCtx& c) {
  sumOrMean(c, true);
}
void kMax(const KernelCtx& c) {
  maxAlong(c, false);
}
void kArgmax(const KernelCtx& c) {
  maxAlong(c, true);
}

}  // namespace keel::cpu
