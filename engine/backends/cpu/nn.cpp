// Fused neural-network kernels of the cpu backend: softmax / log_softmax and their backward ops,
// layer_norm / rms_norm (+ backward), cross_entropy (+ backward), embedding (+ backward), rope.
// Parallel over output rows only; dweight/dbias and embedding gradients use fixed row chunks added
// in chunk order (Note [cpu determinism]). Row statistics accumulate in double across blocks.
#include "cpu_util.h"
#include "kernels.h"

namespace keel::cpu {
namespace {

inline float expC(float x) {
  return math::expF(x);
}
inline double expC(double x) {
  return std::exp(x);
}

// Rows of D elements handled per parallel chunk, aiming at ~kGrain elements.
inline int64_t rowGrain(int64_t d) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(d, 1));
}

// Runs rowFn(const T* in0, ..., T* out, n) over every row along `dim` of same-shaped inputs.
// Rows along the last dim are used in place (inputs made contiguous); for other dims each input
// is copied once into a buffer with `dim` moved last, and the output is copied back.
template <typename T, size_t N, typename F>
void alongDim(const std::array<Tensor, N>& ins, const Tensor& out, int64_t dim, F rowFn) {
  const Shape& shape = out.shape();
  const int64_t n = shape[size_t(dim)], rows = n ? out.numel() / n : 0;
  if (out.numel() == 0) return;
  const bool last = dim == out.dim() - 1;
  // Strides (in out's dim order) of a contiguous buffer whose last dim is `dim`.
  Shape moved(shape.size());
  {
    int64_t st = n;
    moved[size_t(dim)] = 1;
    for (int64_t d = out.dim() - 1; d >= 0; --d) {
      if (d == dim) continue;
      moved[size_t(d)] = st;
      st *= shape[size_t(d)];
    }
  }
  std::array<Tensor, N> cs;
  std::array<const T*, N> p;
  std::array<std::vector<T>, N> bufs;
  for (size_t k = 0; k < N; ++k) {
    if (last) {
      cs[k] = contig(ins[k]);
      p[k] = cs[k].template data<T>();
    } else {
      bufs[k].resize(size_t(out.numel()));
      copyStrided(bufs[k].data(), moved, ins[k].data(), ins[k].strides(), shape, sizeof(T));
      p[k] = bufs[k].data();
    }
  }
  std::vector<T> obuf(last ? 0 : size_t(out.numel()));
  T* o = last ? out.data<T>() : obuf.data();
  parallelFor(rows, rowGrain(n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      std::array<const T*, N> rp;
      for (size_t k = 0; k < N; ++k) rp[k] = p[k] + r * n;
      std::apply([&](auto... q) { rowFn(q..., o + r * n, n); }, rp);
    }
  });
  if (!last) copyStrided(out.data(), out.strides(), obuf.data(), moved, shape, sizeof(T));
}

// A per-thread scratch row of the compute type.
template <typename C>
C* scratch(int64_t n) {
  thread_local std::vector<C> buf;
  if (buf.size() < size_t(n)) buf.resize(size_t(n));
  return buf.data();
}

// e[j] = exp(x[j] - shift) in the compute type (float32 rows use the vectorized array loop).
template <typename T>
void expShift(const T* x, CompT<T> shift, CompT<T>* e, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    expShiftArray(x, shift, e, n);
  } else {
    for (int64_t j = 0; j < n; ++j) e[j] = expC(load(x[j]) - shift);
  }
}

// Sum of exp(x[j] - shift), fixed order (blockSum over the exponentials).
template <typename T>
double sumExpShift(const T* x, CompT<T> shift, int64_t n) {
  using C = CompT<T>;
  C* e = scratch<C>(n);
  expShift(x, shift, e, n);
  return blockSum(e, n);
}

template <typename T>
void softmaxRow(const T* x, T* y, int64_t n) {
  using C = CompT<T>;
  const C mx = rowMax(x, n);
  C* e = scratch<C>(n);
  expShift(x, mx, e, n);
  const double s = blockSum(e, n);
  if constexpr (std::is_same_v<C, double>) {
    for (int64_t j = 0; j < n; ++j) y[j] = e[j] / s;
  } else {
    const float inv = float(1.0 / s);
    for (int64_t j = 0; j < n; ++j) y[j] = store<T>(e[j] * inv);
  }
}

template <typename T>
void logSoftmaxRow(const T* x, T* y, int64_t n) {
  using C = CompT<T>;
  const C mx = rowMax(x, n);
  const double lse = double(mx) + std::log(sumExpShift(x, mx, n));
  if constexpr (std::is_same_v<C, double>) {
    for (int64_t j = 0; j < n; ++j) y[j] = x[j] - lse;
  } else {
    // x - lse in double, rounded once: a log-sum-exp rounded to float32 first would move every
    // output by up to half an ulp of the logits (1.5e-5 at |x| ~ 270), not of the result.
    for (int64_t j = 0; j < n; ++j) y[j] = store<T>(C(double(load(x[j])) - lse));
  }
}

template <typename T>
void softmaxBackwardRow(const T* g, const T* y, T* dx, int64_t n) {
  using C = CompT<T>;
  const C dot = C(blockSum2(g, y, n, [](C a, C b) { return a * b; }));
  for (int64_t j = 0; j < n; ++j) dx[j] = store<T>(load(y[j]) * (load(g[j]) - dot));
}

template <typename T>
void logSoftmaxBackwardRow(const T* g, const T* y, T* dx, int64_t n) {
  using C = CompT<T>;
  const C s = C(blockSum(g, n));
  C* e = scratch<C>(n);
  expShift(y, C(0), e, n);
  for (int64_t j = 0; j < n; ++j) dx[j] = store<T>(load(g[j]) - e[j] * s);
}

enum class SoftKind { Softmax, LogSoftmax, SoftmaxBackward, LogSoftmaxBackward };

template <SoftKind kKind>
void softmaxFamily(const KernelCtx& c) {
  const Tensor& out = c.outputs[0];
  const int64_t dim = normDim(c.attrs.getInt("dim"), out.dim(), c.op.name);
  visitDType(c.inputs[0].dtype(), [&]<typename T>() {
    if constexpr (kIsFloat<T>) {
      if constexpr (kKind == SoftKind::Softmax)
        alongDim<T, 1>({c.inputs[0]}, out, dim, softmaxRow<T>);
      else if constexpr (kKind == SoftKind::LogSoftmax)
        alongDim<T, 1>({c.inputs[0]}, out, dim, logSoftmaxRow<T>);
      else if constexpr (kKind == SoftKind::SoftmaxBackward)
        alongDim<T, 2>({c.inputs[0], c.inputs[1]}, out, dim, softmaxBackwardRow<T>);
      else
        alongDim<T, 2>({c.inputs[0], c.inputs[1]}, out, dim, logSoftmaxBackwardRow<T>);
    } else {
      unsupported(c, c.inputs[0].dtype());
    }
  });
}

// ---------------------------------------------------------------- norms

template <typename T>
std::vector<CompT<T>> loadVector(const Tensor& t) {
  Tensor cc = contig(t);
  const T* p = cc.data<T>();
  std::vector<CompT<T>> v(size_t(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = load(p[i]);
  return v;
}

struct RowStats {
  double mean = 0, rstd = 0;
};

template <typename T>
RowStats layerStats(const T* x, int64_t d, double eps) {
  using C = CompT<T>;
  const double mean = blockSum(x, d) / double(d);
  const C m = C(mean);
  const double var = blockSum(x, d, [m](C v) { return (v - m) * (v - m); }) / double(d);
  return {mean, 1.0 / std::sqrt(var + eps)};
}

template <typename T>
double rmsScale(const T* x, int64_t d, double eps) {
  using C = CompT<T>;
  const double ms = blockSum(x, d, [](C v) { return v * v; }) / double(d);
  return 1.0 / std::sqrt(ms + eps);
}

// Rows per chunk for the weight-gradient partial sums: at most kParamChunks chunks, a count
// that depends only on the number of rows.
constexpr int64_t kParamChunks = 64;

template <typename T>
void layerNormForward(const KernelCtx& c, bool rms) {
  using C = CompT<T>;
  const Tensor& out = c.outputs[0];
  const double eps = c.attrs.getDouble("eps");
  Tensor x = contig(c.inputs[0]);
  const int64_t d = x.dim() ? x.size(-1) : 1;
  const int64_t rows = d ? x.numel() / d : 0;
  const std::vector<C> w = loadVector<T>(c.inputs[1]);
  const std::vector<C> bias = rms ? std::vector<C>() : loadVector<T>(c.inputs[2]);
  const T* px = x.data<T>();
  T* po = out.data<T>();
  parallelFor(rows, rowGrain(d), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* xr = px + r * d;
      T* yr = po + r * d;
      if (rms) {
        const C rr = C(rmsScale(xr, d, eps));
        for (int64_t j = 0; j < d; ++j) yr[j] = store<T>(load(xr[j]) * rr * w[size_t(j)]);
      } else {
        const RowStats st = layerStats(xr, d, eps);
        const C m = C(st.mean), rs = C(st.rstd);
        for (int64_t j = 0; j < d; ++j)
          yr[j] = store<T>((load(xr[j]) - m) * rs * w[size_t(j)] + bias[size_t(j)]);
      }
    }
  });
}

template <typename T>
void layerNormBackward(const KernelCtx& c, bool rms) {
  using C = CompT<T>;
  const double eps = c.attrs.getDouble("eps");
  Tensor g = contig(c.inputs[0]), x = contig(c.inputs[1]);
  const std::vector<C> w = loadVector<T>(c.inputs[2]);
  const int64_t d = int64_t(w.size());
  const int64_t rows = d ? x.numel() / d : 0;
  const T* pg = g.data<T>();
  const T* px = x.data<T>();
  T* pdx = c.outputs[0].data<T>();
  T* pdw = c.outputs[1].data<T>();
  T* pdb = rms ? nullptr : c.outputs[2].data<T>();
  const int64_t chunkRows = std::max<int64_t>(1, (rows + kParamChunks - 1) / kParamChunks);
  const int64_t chunks = rows ? (rows + chunkRows - 1) / chunkRows : 0;
  const int64_t parts = rms ? 1 : 2;
  std::vector<double> partial(size_t(chunks * parts * d), 0.0);
  parallelFor(chunks, 1, [&](int64_t cb, int64_t ce) {
    std::vector<C> xhat(static_cast<size_t>(d)), gw(static_cast<size_t>(d));
    for (int64_t ch = cb; ch < ce; ++ch) {
      double* dw = partial.data() + ch * parts * d;
      double* db = dw + d;
      const int64_t r1 = std::min(rows, (ch + 1) * chunkRows);
      for (int64_t r = ch * chunkRows; r < r1; ++r) {
        const T* xr = px + r * d;
        const T* gr = pg + r * d;
        T* dxr = pdx + r * d;
        if (rms) {
          const double rrD = rmsScale(xr, d, eps);
          const C rr = C(rrD);
          for (int64_t j = 0; j < d; ++j) gw[size_t(j)] = load(gr[j]) * w[size_t(j)];
          const C dot = C(blockSum2(gw.data(), xr, d, [](C a, C b) { return a * b; }) / double(d));
          const C k3 = C(rrD * rrD * rrD) * dot;
          for (int64_t j = 0; j < d; ++j) {
            const C xv = load(xr[j]);
            dxr[j] = store<T>(rr * gw[size_t(j)] - xv * k3);
            dw[j] += double(load(gr[j]) * xv * rr);
          }
        } else {
          const RowStats st = layerStats(xr, d, eps);
          const C m = C(st.mean), rs = C(st.rstd);
          for (int64_t j = 0; j < d; ++j) {
            xhat[size_t(j)] = (load(xr[j]) - m) * rs;
            gw[size_t(j)] = load(gr[j]) * w[size_t(j)];
          }
          const C mg = C(blockSum(gw.data(), d) / double(d));
          const C mgx =
              C(blockSum2(gw.data(), xhat.data(), d, [](C a, C b) { return a * b; }) / double(d));
          for (int64_t j = 0; j < d; ++j) {
            dxr[j] = store<T>(rs * (gw[size_t(j)] - mg - xhat[size_t(j)] * mgx));
            const C gv = load(gr[j]);
            dw[j] += double(gv * xhat[size_t(j)]);
            db[j] += double(gv);
          }
        }
      }
    }
  });
  parallelFor(d, kGrain / 16, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      double sw = 0, sb = 0;
      for (int64_t ch = 0; ch < chunks; ++ch) {
        sw += partial[size_t(ch * parts * d + j)];
        if (!rms) sb += partial[size_t(ch * parts * d + d + j)];
      }
      pdw[j] = fromDouble<T>(sw);
      if (!rms) pdb[j] = fromDouble<T>(sb);
    }
  });
}

template <bool kBackward>
void normKernel(const KernelCtx& c, bool rms) {
  visitDType(c.inputs[0].dtype(), [&]<typename T>() {
    if constexpr (kIsFloat<T>) {
      if constexpr (kBackward)
        layerNormBackward<T>(c, rms);
      else
        layerNormForward<T>(c, rms);
    } else {
      unsupported(c, c.inputs[0].dtype());
    }
  });
}

// ---------------------------------------------------------------- rope

// Rows of D elements, one per (b, t, h) of x [B, T, H, D]. The cos and sin of each (t, i) are
// computed once, in double, and rounded to the compute type; each output element is one fixed
// expression, so results do not depend on threads (docs/ops.md, "Rotary position embedding").
template <typename T>
void ropeRows(const KernelCtx& c) {
  using C = CompT<T>;
  const Tensor x = contig(c.inputs[0]);
  const Tensor& out = c.outputs[0];
  const int64_t t = x.size(1), h = x.size(2), d = x.size(3), half = d / 2;
  if (out.numel() == 0) return;
  const double base = c.attrs.getDouble("base", 10000.0);
  const double sign = c.attrs.getBool("inverse", false) ? -1.0 : 1.0;
  std::vector<C> cosv(size_t(t * half)), sinv(size_t(t * half));
  for (int64_t p = 0; p < t; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double a = sign * double(p) * std::pow(base, -2.0 * double(i) / double(d));
      cosv[size_t(p * half + i)] = C(std::cos(a));
      sinv[size_t(p * half + i)] = C(std::sin(a));
    }
  const T* px = x.data<T>();
  T* po = out.data<T>();
  parallelFor(out.numel() / d, rowGrain(d), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* in = px + r * d;
      T* o = po + r * d;
      const C* cs = &cosv[size_t((r / h) % t * half)];
      const C* sn = &sinv[size_t((r / h) % t * half)];
      for (int64_t i = 0; i < half; ++i) {
        const C x1 = C(in[i]), x2 = C(in[i + half]);
        o[i] = store<T>(x1 * cs[i] - x2 * sn[i]);
        o[i + half] = store<T>(x2 * cs[i] + x1 * sn[i]);
      }
    }
  });
}

// ---------------------------------------------------------------- cross entropy

// log(sum(exp(row))) in double, max-subtracted.
template <typename T>
double rowLse(const T* row, int64_t n) {
  using C = CompT<T>;
  const C mx = rowMax(row, n);
  return double(mx) + std::log(sumExpShift(row, mx, n));
}

struct Targets {
  std::vector<int64_t> t;
  int64_t count = 0;
};

Targets loadTargets(const KernelCtx& c, const Tensor& targets, int64_t classes) {
  Targets r;
  r.t = readIndices(c.op.name, targets);
  const int64_t ignore = c.attrs.getInt("ignore_index", -100);
  for (int64_t v : r.t) {
    if (v == ignore) continue;
    checkIndex(c.op.name, v, classes);
    ++r.count;
  }
  return r;
}

}  // namespace

// The cross-entropy and embedding kernels are defined under their table names (kernels.h).
void kCrossEntropy(const KernelCtx& c) {
  const Tensor& logits = c.inputs[0];
  const int64_t n = logits.size(0), classes = logits.size(1);
  const int64_t ignore = c.attrs.getInt("ignore_index", -100);
  const Targets tg = loadTargets(c, c.inputs[1], classes);
  visitDType(logits.dtype(), [&]<typename T>() {
    if constexpr (kIsFloat<T>) {
      Tensor x = contig(logits);
      const T* px = x.data<T>();
      std::vector<double> loss(size_t(n), 0.0);
      parallelFor(n, rowGrain(classes), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const int64_t t = tg.t[size_t(i)];
          if (t == ignore) continue;
          const T* row = px + i * classes;
          loss[size_t(i)] = rowLse(row, classes) - double(load(row[t]));
        }
      });
      double total = 0.0;
      for (double l : loss) total += l;
      c.outputs[0].data<T>()[0] = fromDouble<T>(tg.count ? total / double(tg.count) : 0.0);
    } else {
      unsupported(c, logits.dtype());
    }
  });
}

// Note [cross_entropy backward precision]
// The gradient is (softmax(x) - onehot) * g / count. softmax is formed as exp(x - max) (compute
// type: x - max is exact for float32 logits within a factor 2 of the max) times 1 / sum(exp) in
// double, so the row's log-sum-exp is never rounded to the compute type. An earlier version
// computed exp(x - lse) with lse rounded to float32: at logits near 270 (ulp 3e-5) that moved every
// probability by up to 1.5e-5 relative (an outside check measured 9.7e-6 where PyTorch's float32
// errs by 1.9e-7). The parity table's cross_entropy_backward large_logits line holds the kernel to
// a tolerance that rounding fails.
void kCrossEntropyBackward(const KernelCtx& c) {
  const Tensor &grad = c.inputs[0], &logits = c.inputs[1], &out = c.outputs[0];
  const int64_t n = logits.size(0), classes = logits.size(1);
  const int64_t ignore = c.attrs.getInt("ignore_index", -100);
  const Targets tg = loadTargets(c, c.inputs[2], classes);
  visitDType(logits.dtype(), [&]<typename T>() {
    if constexpr (kIsFloat<T>) {
      using C = CompT<T>;
      const double g = double(load(grad.data<T>()[0]));
      const double scale = tg.count ? g / double(tg.count) : 0.0;
      Tensor x = contig(logits);
      const T* px = x.data<T>();
      T* po = out.data<T>();
      parallelFor(n, rowGrain(classes), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          T* dr = po + i * classes;
          const int64_t t = tg.t[size_t(i)];
          if (t == ignore || tg.count == 0) {
            std::fill(dr, dr + classes, T(C(0)));
            continue;
          }
          // softmax = exp(x - max) / sum in double: See Note [cross_entropy backward precision].
          const T* row = px + i * classes;
          const C mx = rowMax(row, classes);
          C* e = scratch<C>(classes);
          expShift(row, mx, e, classes);
          const double inv = 1.0 / blockSum(e, classes), f = scale * inv;
          for (int64_t j = 0; j < classes; ++j) dr[j] = store<T>(C(double(e[j]) * f));
          dr[t] = store<T>(C((double(e[t]) * inv - 1.0) * scale));
        }
      });
    } else {
      unsupported(c, logits.dtype());
    }
  });
}

// ---------------------------------------------------------------- embedding

void kEmbedding(const KernelCtx& c) {
  const Tensor &w = c.inputs[0], &out = c.outputs[0];
  const int64_t v = w.size(0), d = w.size(1);
  const std::vector<int64_t> idx = loadIndices(c.op.name, c.inputs[1], v);
  const size_t elem = dtypeSize(w.dtype());
  const char* pw = static_cast<const char*>(w.data());
  char* po = static_cast<char*>(out.data());
  const int64_t s0 = w.strides()[0], s1 = w.strides()[1];
  const Shape rowShape{d}, rowDst{1}, rowSrc{s1};
  parallelFor(int64_t(idx.size()), rowGrain(d), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const char* src = pw + size_t(idx[size_t(i)] * s0) * elem;
      char* dst = po + size_t(i * d) * elem;
      if (s1 == 1)
        std::memcpy(dst, src, size_t(d) * elem);
      else
        copyStrided(dst, rowDst, src, rowSrc, rowShape, elem);
    }
  });
}

// Rows of the [V, D] gradient are independent: each is the sum, in index order, of the grad rows
// whose index names it. A counting sort groups them; rows are then summed in parallel.
void kEmbeddingBackward(const KernelCtx& c) {
  const Tensor& out = c.outputs[0];
  const int64_t v = out.size(0), d = out.size(1);
  const std::vector<int64_t> idx = loadIndices(c.op.name, c.inputs[1], v);
  std::vector<int64_t> start(size_t(v) + 1, 0), order(idx.size());
  for (int64_t i : idx) ++start[size_t(i) + 1];
  for (int64_t r = 0; r < v; ++r) start[size_t(r) + 1] += start[size_t(r)];
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (size_t i = 0; i < idx.size(); ++i) order[size_t(fill[size_t(idx[i])]++)] = int64_t(i);
  }
  visitDType(out.dtype(), [&]<typename T>() {
    if constexpr (kIsFloat<T>) {
      Tensor g = contig(c.inputs[0]);
      const T* pg = g.data<T>();
      T* po = out.data<T>();
      parallelFor(v, rowGrain(d), [&](int64_t b, int64_t e) {
        std::vector<double> acc(static_cast<size_t>(d));
        for (int64_t r = b; r < e; ++r) {
          T* orow = po + r * d;
          const int64_t k0 = start[size_t(r)], k1 = start[size_t(r) + 1];
          if (k0 == k1) {
            std::fill(orow, orow + d, T(CompT<T>(0)));
            continue;
          }
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t k = k0; k < k1; ++k) {
            const T* grow = pg + order[size_t(k)] * d;
            for (int64_t j = 0; j < d; ++j) acc[size_t(j)] += double(load(grow[j]));
          }
          for (int64_t j = 0; j < d; ++j) orow[j] = fromDouble<T>(acc[size_t(j)]);
        }
      });
    } else {
      unsupported(c, out.dtype());
    }
  });
}

void kSoftmax(const KernelCtx& c) {
  softmaxFamily<SoftKind::Softmax>(c);
}
void kLogSoftmax(const KernelCtx& c) {
  softmaxFamily<SoftKind::LogSoftmax>(c);
}
void kSoftmaxBackward(const KernelCtx& c) {
  softmaxFamily<SoftKind::SoftmaxBackward>(c);
}
void kLogSoftmaxBackward(const KernelCtx& c) {
  softmaxFamily<SoftKind::LogSoftmaxBackward>(c);
}
void kLayerNorm(const KernelCtx& c) {
  normKernel<false>(c, false);
}
void kLayerNormBackward(const KernelCtx& c) {
  normKernel<true>(c, false);
}
void kRmsNorm(const KernelCtx& c) {
  normKernel<false>(c, true);
}
void kRmsNormBackward(const KernelCtx& c) {
  normKernel<true>(c, true);
}
void kRope(const KernelCtx& c) {
  visitFloatInput(c, [&]<typename T>() { ropeRows<T>(c); });
}

}  // namespace keel::cpu
