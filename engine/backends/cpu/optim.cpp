// Optimizer updates of the cpu backend (sgd_step, adamw_step): in place on param and state.
// Elementwise, so any partition gives the same bits; values are staged through small blocks of
// the compute type so every dtype and layout shares one vectorizable loop (and SSE sqrt).
#include "cpu_util.h"
#include "kernels.h"

namespace keel::cpu {
namespace {

constexpr int64_t kStage = 256;

template <typename T>
inline void loadBlock(CompT<T>* dst, const T* src, int64_t stride, int64_t n) {
  if (stride == 1)
    for (int64_t i = 0; i < n; ++i) dst[i] = CompT<T>(src[i]);
  else
    for (int64_t i = 0; i < n; ++i) dst[i] = CompT<T>(src[i * stride]);
}
template <typename T>
inline void storeBlock(T* dst, int64_t stride, const CompT<T>* src, int64_t n) {
  if (stride == 1)
    for (int64_t i = 0; i < n; ++i) dst[i] = T(src[i]);
  else
    for (int64_t i = 0; i < n; ++i) dst[i * stride] = T(src[i]);
}

template <size_t N>
Layout<N> optimLayout(const KernelCtx& c) {
  const Tensor& p = c.inputs[0];
  std::array<Shape, N> st;
  for (size_t k = 0; k < N; ++k) {
    KEEL_CHECK(c.inputs[k].shape() == p.shape() && c.inputs[k].dtype() == p.dtype(), "op '",
               c.op.name, "': input ", k, " does not match param ", shapeStr(p.shape()), " ",
               dtypeName(p.dtype()));
    st[k] = c.inputs[k].strides();
  }
  return makeLayout<N>(p.shape(), st);
}

template <typename T>
void sgd(const KernelCtx& c) {
  using C = CompT<T>;
  const C lr = C(c.attrs.getDouble("lr")), mom = C(c.attrs.getDouble("momentum"));
  const C wd = C(c.attrs.getDouble("weight_decay"));
  const bool nesterov = c.attrs.getBool("nesterov");
  const bool useBuf = c.attrs.getDouble("momentum") != 0.0;
  Layout<3> l = optimLayout<3>(c);
  T* pp = c.inputs[0].data<T>();
  const T* pg = c.inputs[1].data<T>();
  T* pb = c.inputs[2].data<T>();
  const int64_t sp = l.innerStride(0), sg = l.innerStride(1), sb = l.innerStride(2);
  parallelLayout(l, kGrain, [&](const std::array<int64_t, 3>& off, int64_t n) {
    C p[kStage], g[kStage], b[kStage];
    for (int64_t s = 0; s < n; s += kStage) {
      const int64_t w = std::min(kStage, n - s);
      T* P = pp + off[0] + s * sp;
      T* B = pb + off[2] + s * sb;
      loadBlock(p, P, sp, w);
      loadBlock(g, pg + off[1] + s * sg, sg, w);
      if (useBuf) {
        loadBlock(b, B, sb, w);
        for (int64_t i = 0; i < w; ++i) {
          const C gi = g[i] + wd * p[i];
          b[i] = mom * b[i] + gi;
          p[i] -= lr * (nesterov ? gi + mom * b[i] : b[i]);
        }
        storeBlock(B, sb, b, w);
      } else {
        for (int64_t i = 0; i < w; ++i) p[i] -= lr * (g[i] + wd * p[i]);
      }
      storeBlock(P, sp, p, w);
    }
  });
}

template <typename T>
void adamw(const KernelCtx& c) {
  using C = CompT<T>;
  const double lrD = c.attrs.getDouble("lr"), b1D = c.attrs.getDouble("beta1");
  const double b2D = c.attrs.getDouble("beta2"), epsD = c.attrs.getDouble("eps");
  const double wdD = c.attrs.getDouble("weight_decay");
  const int64_t step = c.attrs.getInt("step");
  KEEL_CHECK(step >= 1, "op '", c.op.name, "': step must be >= 1");
  const C lr = C(lrD), lrwd = C(lrD * wdD), b1 = C(b1D), b2 = C(b2D), eps = C(epsD);
  const C ob1 = C(1.0 - b1D), ob2 = C(1.0 - b2D);
  // Bias corrections as reciprocals: one multiply instead of a divide (within an ulp of m / bc1).
  const C ibc1 = C(1.0 / (1.0 - std::pow(b1D, double(step))));
  const C ibc2 = C(1.0 / (1.0 - std::pow(b2D, double(step))));
  Layout<4> l = optimLayout<4>(c);
  T* pp = c.inputs[0].data<T>();
  const T* pg = c.inputs[1].data<T>();
  T* pm = c.inputs[2].data<T>();
  T* pv = c.inputs[3].data<T>();
  const int64_t sp = l.innerStride(0), sg = l.innerStride(1), sm = l.innerStride(2),
                sv = l.innerStride(3);
  parallelLayout(l, kGrain, [&](const std::array<int64_t, 4>& off, int64_t n) {
    C p[kStage], g[kStage], m[kStage], v[kStage], den[kStage];
    for (int64_t s = 0; s < n; s += kStage) {
      const int64_t w = std::min(kStage, n - s);
      T* P = pp + off[0] + s * sp;
      T* M = pm + off[2] + s * sm;
      T* V = pv + off[3] + s * sv;
      loadBlock(p, P, sp, w);
      loadBlock(g, pg + off[1] + s * sg, sg, w);
      loadBlock(m, M, sm, w);
      loadBlock(v, V, sv, w);
      for (int64_t i = 0; i < w; ++i) {
        p[i] -= lrwd * p[i];
        m[i] = b1 * m[i] + ob1 * g[i];
        v[i] = b2 * v[i] + ob2 * g[i] * g[i];
        den[i] = v[i] * ibc2;
      }
      sqrtArray(den, den, w);
      for (int64_t i = 0; i < w; ++i) p[i] -= lr * (m[i] * ibc1) / (den[i] + eps);
      storeBlock(P, sp, p, w);
      storeBlock(M, sm, m, w);
      storeBlock(V, sv, v, w);
    }
  });
}

}  // namespace

void kSgdStep(const KernelCtx& c) {
  visitFloatInput(c, [&]<typename T>() { sgd<T>(c); });
}

void kAdamwStep(const KernelCtx& c) {
  visitFloatInput(c, [&]<typename T>() { adamw<T>(c); });
}

}  // namespace keel::cpu
