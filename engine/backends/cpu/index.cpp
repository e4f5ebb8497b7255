// Indexing and sorting kernels of the cpu backend: index_select, index_add, gather, scatter_add,
// topk, argsort. Every index is checked before any output is written. Accumulating ops add in
// index order per output element (parallel only across elements that never collide).
#include <numeric>

#include "cpu_util.h"
#include "kernels.h"

namespace keel::cpu {
namespace {

// Accumulation buffer for index_add / scatter_add: the output itself where T is its own compute
// type, else a float copy that is rounded back once at the end.
template <typename T>
struct AccBuffer {
  using C = CompT<T>;
  T* out;
  int64_t n;
  std::vector<C> own;
  C* p;
  AccBuffer(T* o, int64_t count) : out(o), n(count) {
    if constexpr (std::is_same_v<C, T>) {
      p = o;
    } else {
      own.resize(size_t(n));
      for (int64_t i = 0; i < n; ++i) own[size_t(i)] = load(o[i]);
      p = own.data();
    }
  }
  static C add(C a, C b) {
    if constexpr (std::is_integral_v<C>)
      return wrapAdd(a, b);
    else
      return a + b;
  }
  void finish() {
    if constexpr (!std::is_same_v<C, T>) {
      parallelFor(n, kGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) out[i] = store<T>(p[i]);
      });
    }
  }
};

// index_select's and index_add's rows: x's shape split at `dim`, and the m checked indices
// along it.
struct IndexRows {
  DimSplit sp;
  std::vector<int64_t> idx;
  int64_t m;
};
IndexRows indexRows(const KernelCtx& c) {
  const Tensor& x = c.inputs[0];
  const DimSplit sp = splitAt(x.shape(), normDim(c.attrs.getInt("dim"), x.dim(), c.op.name));
  std::vector<int64_t> idx = loadIndices(c.op.name, c.inputs[1], sp.n);
  const int64_t m = int64_t(idx.size());
  return {sp, std::move(idx), m};
}

void indexSelect(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &out = c.outputs[0];
  const auto [sp, idx, m] = indexRows(c);
  if (out.numel() == 0) return;
  Tensor xc = contig(x);
  const size_t elem = dtypeSize(x.dtype());
  const char* px = static_cast<const char*>(xc.data());
  char* po = static_cast<char*>(out.data());
  const size_t rowBytes = size_t(sp.inner) * elem;
  parallelFor(sp.outer * m, std::max<int64_t>(1, kGrain / sp.inner), [&](int64_t b, int64_t e) {
    for (int64_t u = b; u < e; ++u) {
      const int64_t o = u / m, j = u % m;
      std::memcpy(po + size_t(u) * rowBytes, px + size_t(o * sp.n + idx[size_t(j)]) * rowBytes,
                  rowBytes);
    }
  });
}

void indexAdd(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &out = c.outputs[0];
  const auto [sp, idx, m] = indexRows(c);
  copyToContiguous(x, out.data());
  visitDType(x.dtype(), [&]<typename T>() {
    if constexpr (kIsFloat<T> || kIsInt<T>) {
      using C = CompT<T>;
      AccBuffer<T> acc(out.data<T>(), out.numel());
      Tensor src = contig(c.inputs[2]);
      const T* ps = src.data<T>();
      constexpr int64_t kBlock = 1024;
      const int64_t cb = (sp.inner + kBlock - 1) / kBlock;
      // Units (outer row, column block) never share output elements; j runs in index order.
      parallelFor(sp.outer * cb, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, m * kBlock)),
                  [&](int64_t b, int64_t e) {
                    for (int64_t u = b; u < e; ++u) {
                      const int64_t o = u / cb, c0 = (u % cb) * kBlock;
                      const int64_t w = std::min(kBlock, sp.inner - c0);
                      for (int64_t j = 0; j < m; ++j) {
                        C* dst = acc.p + (o * sp.n + idx[size_t(j)]) * sp.inner + c0;
                        const T* s = ps + (o * m + j) * sp.inner + c0;
                        for (int64_t k = 0; k < w; ++k) dst[k] = AccBuffer<T>::add(dst[k], C(s[k]));
                      }
                    }
                  });
      acc.finish();
    } else {
      unsupported(c, x.dtype());
    }
  });
}

// Layout over the index shape with `dim` moved last, so each row is one line along dim:
// operand 0 = output/target offsets with dim's stride zeroed, then the given extra operands.
template <size_t N>
Layout<N + 1> linesAlong(const Shape& idxShape, int64_t dim, const Shape& targetStrides,
                         const std::array<Shape, N>& extra) {
  Shape shape;
  std::array<Shape, N + 1> st;
  for (size_t pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < idxShape.size(); ++i) {
      if ((int64_t(i) == dim) != (pass == 1)) continue;
      shape.push_back(idxShape[i]);
      st[0].push_back(int64_t(i) == dim ? 0 : targetStrides[i]);
      for (size_t k = 0; k < N; ++k) st[k + 1].push_back(extra[k][i]);
    }
  return makeLayout<N + 1>(shape, st);
}

// Runs fn over whole rows (lines) in parallel, never splitting one.
template <size_t N, typename F>
void parallelLines(const Layout<N>& l, F&& fn) {
  if (l.rows == 0 || l.inner == 0) return;
  parallelFor(l.rows, std::max<int64_t>(1, kGrain / l.inner),
              [&](int64_t b, int64_t e) { forUnits(l, 1, l.inner, b, e, fn); });
}

void gather(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &index = c.inputs[1], &out = c.outputs[0];
  const int64_t d = normDim(c.attrs.getInt("dim"), x.dim(), c.op.name);
  const std::vector<int64_t> idx = loadIndices(c.op.name, index, x.size(d));
  if (out.numel() == 0) return;
  // Operand 1: the output (contiguous, so also the position in idx).
  Layout<2> l = linesAlong<1>(index.shape(), d, x.strides(), {contiguousStrides(index.shape())});
  const int64_t sx = x.strides()[size_t(d)], si = l.innerStride(1), sIn = l.innerStride(0);
  visitWidth(dtypeSize(x.dtype()), [&]<typename E>() {
    const E* px = static_cast<const E*>(x.data());
    E* po = static_cast<E*>(out.data());
    parallelLines(l, [&](const std::array<int64_t, 2>& off, int64_t n) {
      for (int64_t t = 0; t < n; ++t) {
        const int64_t at = off[1] + t * si;
        po[at] = px[off[0] + t * sIn + idx[size_t(at)] * sx];
      }
    });
  });
}

void scatterAdd(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &index = c.inputs[1], &out = c.outputs[0];
  const int64_t d = normDim(c.attrs.getInt("dim"), x.dim(), c.op.name);
  const std::vector<int64_t> idx = loadIndices(c.op.name, index, x.size(d));
  copyToContiguous(x, out.data());
  const Tensor& src = c.inputs[2];
  const Shape outStrides = contiguousStrides(x.shape());
  const int64_t so = outStrides[size_t(d)];
  Layout<3> l = linesAlong<2>(index.shape(), d, outStrides,
                              {src.strides(), contiguousStrides(index.shape())});
  const int64_t sIn = l.innerStride(0), ss = l.innerStride(1), si = l.innerStride(2);
  visitDType(x.dtype(), [&]<typename T>() {
    if constexpr (kIsFloat<T> || kIsInt<T>) {
      using C = CompT<T>;
      AccBuffer<T> acc(out.data<T>(), out.numel());
      const T* ps = src.data<T>();
      // Lines differ in some non-dim coordinate, so they never write the same element.
      parallelLines(l, [&](const std::array<int64_t, 3>& off, int64_t n) {
        for (int64_t t = 0; t < n; ++t) {
          C* dst = acc.p + off[0] + t * sIn + idx[size_t(off[2] + t * si)] * so;
          *dst = AccBuffer<T>::add(*dst, C(ps[off[1] + t * ss]));
        }
      });
      acc.finish();
    } else {
      unsupported(c, x.dtype());
    }
  });
}

// Sort order along one line: NaN counts as the largest value; ties keep the lower index first.
template <typename C>
struct LineOrder {
  const C* v;
  bool descending;
  bool operator()(int64_t a, int64_t b) const {
    const C x = v[a], y = v[b];
    if constexpr (std::is_floating_point_v<C>) {
      const bool xn = x != x, yn = y != y;
      if (xn || yn) return descending ? (xn && !yn) : (!xn && yn);
    }
    return descending ? x > y : x < y;
  }
};

// Sorts each line of x along dim (stable) and writes the first k: values (if vals) and indices.
void sortLines(const KernelCtx& c, int64_t k, bool descending, const Tensor* vals,
               const Tensor& ids) {
  const Tensor& x = c.inputs[0];
  const int64_t d = normDim(c.attrs.getInt("dim"), x.dim(), c.op.name);
  const DimSplit sp = splitAt(x.shape(), d);
  KEEL_CHECK(k >= 0 && k <= sp.n, "op '", c.op.name, "': k = ", k, " out of range for extent ",
             sp.n);
  if (k == 0 || sp.outer * sp.inner == 0) return;
  visitDType(x.dtype(), [&]<typename T>() {
    if constexpr (kIsFloat<T> || kIsInt<T>) {
      using C = CompT<T>;
      Tensor xc = contig(x);
      const T* px = xc.data<T>();
      int64_t* pi = ids.data<int64_t>();
      T* pv = vals ? vals->data<T>() : nullptr;
      const int64_t n = sp.n, inner = sp.inner;
      parallelFor(sp.outer * inner, std::max<int64_t>(1, kGrainHeavy / n),
                  [&](int64_t b, int64_t e) {
                    std::vector<C> line(static_cast<size_t>(n));
                    std::vector<int64_t> order(static_cast<size_t>(n));
                    for (int64_t u = b; u < e; ++u) {
                      const int64_t o = u / inner, in = u % inner;
                      const T* src = px + o * n * inner + in;
                      for (int64_t j = 0; j < n; ++j) line[size_t(j)] = C(src[j * inner]);
                      std::iota(order.begin(), order.end(), int64_t(0));
                      LineOrder<C> cmp{line.data(), descending};
                      if (k < n) {
                        // Index as the last key makes partial_sort's result the stable one.
                        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                                          [&](int64_t a, int64_t bb) {
                                            if (cmp(a, bb)) return true;
                                            if (cmp(bb, a)) return false;
                                            return a < bb;
                                          });
                      } else {
                        std::stable_sort(order.begin(), order.end(), cmp);
                      }
                      const int64_t ob = o * k * inner + in;
                      for (int64_t j = 0; j < k; ++j) {
                        const int64_t at = ob + j * inner;
                        pi[at] = order[size_t(j)];
                        if (pv) pv[at] = src[order[size_t(j)] * inner];
                      }
                    }
                  });
    } else {
      unsupported(c, x.dtype());
    }
  });
}

}  // namespace

void kIndexSelect(const KernelCtx& c) {
  indexSelect(c);
}
void kIndexAdd(const KernelCtx& c) {
  indexAdd(c);
}
void kGather(const KernelCtx& c) {
  gather(c);
}
void kScatterAdd(const KernelCtx& c) {
  scatterAdd(c);
}

void kTopk(const KernelCtx& c) {
  sortLines(c, c.attrs.getInt("k"), c.attrs.getBool("largest", true), &c.outputs[0], c.outputs[1]);
}

void kArgsort(const KernelCtx& c) {
  const Tensor& x = c.inputs[0];
  const int64_t d = normDim(c.attrs.getInt("dim"), x.dim(), c.op.name);
  sortLines(c, x.size(d), c.attrs.getBool("descending", false), nullptr, c.outputs[0]);
}

}  // namespace keel::cpu
