// Optimizer updates of the cuda backend (sgd_step, adamw_step): in place on the parameter and its
// state, one thread per element, so any launch gives the same bits. The formulas are the cpu
// backend's (backends/cpu/optim.cpp) operation for operation, in its compute type.
#include <cmath>

#include "cuda_util.cuh"
#include "kernel_util.h"
#include "kernels.h"

namespace keel::cuda {
namespace {

// Note [cuda optimizer rounding]: every multiply and add below is a separately rounded IEEE
// operation (__fmul_rn and friends: nvcc may not fuse them into an FMA), in the cpu's order, and
// the constants (lr·wd, 1-β, the reciprocal bias corrections 1/(1-β^t)) are computed in double on
// the host and rounded to the compute type as the cpu does. sqrt and / are correctly rounded on
// both, so for float32 and float64 the results are the cpu's bit for bit; 16-bit floats load to
// float and round once on store, as on the cpu.
__device__ __forceinline__ float addRn(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ double addRn(double a, double b) {
  return __dadd_rn(a, b);
}
__device__ __forceinline__ float subRn(float a, float b) {
  return __fsub_rn(a, b);
}
__device__ __forceinline__ double subRn(double a, double b) {
  return __dsub_rn(a, b);
}
__device__ __forceinline__ float mulRn(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ double mulRn(double a, double b) {
  return __dmul_rn(a, b);
}
__device__ __forceinline__ float divRn(float a, float b) {
  return __fdiv_rn(a, b);
}
__device__ __forceinline__ double divRn(double a, double b) {
  return __ddiv_rn(a, b);
}
__device__ __forceinline__ float sqrtRn(float a) {
  return __fsqrt_rn(a);
}
__device__ __forceinline__ double sqrtRn(double a) {
  return __dsqrt_rn(a);
}

template <typename C>
struct SgdParams {
  C lr, mom, wd;
  bool useBuf, nesterov;
};

// p, g, b: param, gradient, momentum buffer (b untouched when momentum is 0).
template <bool kContig, typename T>
__global__ void sgdKernel(T* p, Geom gp, const T* g, Geom gg, T* b, Geom gb, int64_t n,
                          SgdParams<Compute<T>> k) {
  using C = Compute<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t op = kContig ? i : gp.offset(i), og = kContig ? i : gg.offset(i);
    C pv = readAs<C>(p[op]);
    const C gv = readAs<C>(g[og]);
    if (k.useBuf) {
      const int64_t ob = kContig ? i : gb.offset(i);
      const C gi = addRn(gv, mulRn(k.wd, pv));
      const C bv = addRn(mulRn(k.mom, readAs<C>(b[ob])), gi);
      pv = subRn(pv, mulRn(k.lr, k.nesterov ? addRn(gi, mulRn(k.mom, bv)) : bv));
      b[ob] = storeAs<T>(bv);
    } else {
      pv = subRn(pv, mulRn(k.lr, addRn(gv, mulRn(k.wd, pv))));
    }
    p[op] = storeAs<T>(pv);
  }
}

template <typename C>
struct AdamwParams {
  C lr, lrwd, b1, b2, eps, ob1, ob2, ibc1, ibc2;
};

// p, g, m, v: param, gradient, first and second moments.
template <bool kContig, typename T>
__global__ void adamwKernel(T* p, Geom gp, const T* g, Geom gg, T* m, Geom gm, T* v, Geom gv,
                            int64_t n, AdamwParams<Compute<T>> k) {
  using C = Compute<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t op = kContig ? i : gp.offset(i), og = kContig ? i : gg.offset(i);
    const int64_t om = kContig ? i : gm.offset(i), ov = kContig ? i : gv.offset(i);
    C pv = readAs<C>(p[op]);
    const C gr = readAs<C>(g[og]);
    pv = subRn(pv, mulRn(k.lrwd, pv));
    const C mv = addRn(mulRn(k.b1, readAs<C>(m[om])), mulRn(k.ob1, gr));
    const C vv = addRn(mulRn(k.b2, readAs<C>(v[ov])), mulRn(mulRn(k.ob2, gr), gr));
    const C den = sqrtRn(mulRn(vv, k.ibc2));
    pv = subRn(pv, divRn(mulRn(k.lr, mulRn(mv, k.ibc1)), addRn(den, k.eps)));
    p[op] = storeAs<T>(pv);
    m[om] = storeAs<T>(mv);
    v[ov] = storeAs<T>(vv);
  }
}

// Every input has the param's shape and dtype (the op's inference checks it; so does the cpu).
void checkInputs(const KernelCtx& c, size_t count) {
  KEEL_CHECK(c.inputs.size() == count, "op '", c.op.name, "': expected ", count, " inputs");
  const Tensor& p = c.inputs[0];
  for (size_t k = 1; k < count; ++k)
    KEEL_CHECK(c.inputs[k].shape() == p.shape() && c.inputs[k].dtype() == p.dtype(), "op '",
               c.op.name, "': input ", k, " does not match param ", shapeStr(p.shape()), " ",
               dtypeName(p.dtype()));
}

}  // namespace

void kSgdStep(const KernelCtx& c) {
  checkInputs(c, 3);
  const Tensor &p = c.inputs[0], &g = c.inputs[1], &b = c.inputs[2];
  const int64_t n = p.numel();
  if (n == 0) return;
  DeviceCtx& d = deviceCtx(c);
  const double momD = c.attrs.getDouble("momentum");
  const double lrD = c.attrs.getDouble("lr"), wdD = c.attrs.getDouble("weight_decay");
  const bool nesterov = c.attrs.getBool("nesterov");
  const Geom gp = geomOf(p), gg = geomOf(g), gb = geomOf(b);
  const bool contig = gp.contiguous && gg.contiguous && gb.contiguous;
  const Launch1D l = launch1D(n);
  visitFloat(p.dtype(), [&]<typename T>() {
    using C = Compute<T>;
    const SgdParams<C> k{C(lrD), C(momD), C(wdD), momD != 0.0, nesterov};
    if (contig)
      launch(sgdKernel<true, T>, l.blocks, l.threads, 0, d.stream, ptr<T>(p), gp, ptr<const T>(g),
             gg, ptr<T>(b), gb, n, k);
    else
      launch(sgdKernel<false, T>, l.blocks, l.threads, 0, d.stream, ptr<T>(p), gp, ptr<const T>(g),
             gg, ptr<T>(b), gb, n, k);
  });
  checkLaunch(c, "sgdKernel");
}

void kAdamwStep(const KernelCtx& c) {
  checkInputs(c, 4);
  const Tensor &p = c.inputs[0], &g = c.inputs[1], &m = c.inputs[2], &v = c.inputs[3];
  const double lrD = c.attrs.getDouble("lr"), b1D = c.attrs.getDouble("beta1");
  const double b2D = c.attrs.getDouble("beta2"), epsD = c.attrs.getDouble("eps");
  const double wdD = c.attrs.getDouble("weight_decay");
  const int64_t step = c.attrs.getInt("step");
  KEEL_CHECK(step >= 1, "op '", c.op.name, "': step must be >= 1");
  const int64_t n = p.numel();
  if (n == 0) return;
  DeviceCtx& d = deviceCtx(c);
  const double ibc1 = 1.0 / (1.0 - std::pow(b1D, double(step)));
  const double ibc2 = 1.0 / (1.0 - std::pow(b2D, double(step)));
  const Geom gp = geomOf(p), gg = geomOf(g), gm = geomOf(m), gv = geomOf(v);
  const bool contig = gp.contiguous && gg.contiguous && gm.contiguous && gv.contiguous;
  const Launch1D l = launch1D(n);
  visitFloat(p.dtype(), [&]<typename T>() {
    using C = Compute<T>;
    const AdamwParams<C> k{C(lrD),       C(lrD * wdD), C(b1D),  C(b2D), C(epsD),
                           C(1.0 - b1D), C(1.0 - b2D), C(ibc1), C(ibc2)};
    if (contig)
      launch(adamwKernel<true, T>, l.blocks, l.threads, 0, d.stream, ptr<T>(p), gp, ptr<const T>(g),
             gg, ptr<T>(m), gm, ptr<T>(v), gv, n, k);
    else
      launch(adamwKernel<false, T>, l.blocks, l.threads, 0, d.stream, ptr<T>(p), gp,
             ptr<const T>(g), gg, ptr<T>(m), gm, ptr<T>(v), gv, n, k);
  });
  checkLaunch(c, "adamwKernel");
}

}  // namespace keel::cuda
