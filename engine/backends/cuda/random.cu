// Random kernels of the cuda backend (dropout, uniform, normal): Philox4x32-10 exactly as the host
// computes it (keel/random.h, core/random.cpp), one counter per output element: dropout and
// uniform values are the host's bit for bit, normals as Note [Bit-identical Box-Muller] says.
#include <cmath>

#include "cuda_util.cuh"
#include "dd_math.h"
#include "kernel_util.h"
#include "kernels.h"

namespace keel::cuda {
namespace {

// ---------------------------------------------------------------- Philox4x32-10
// The host's philox4x32: ten rounds of two 32x32->64 products, xors with the key, Weyl key steps.
struct Philox4 {
  uint32_t v[4];
};
__device__ __forceinline__ Philox4 philox4x32(Philox4 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(kM0, c.v[0]), lo0 = kM0 * c.v[0];
    const uint32_t hi1 = __umulhi(kM1, c.v[2]), lo1 = kM1 * c.v[2];
    c = {{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// keel::philoxUniform: 24 random bits of word 0, times 2^-24 (both steps exact).
__device__ __forceinline__ float philoxUniform(uint64_t seed, uint64_t offset, uint64_t i) {
  const uint64_t c = offset + i;
  const Philox4 r = philox4x32({{uint32_t(c), uint32_t(c >> 32), 0x4b45454cu, 0u}}, uint32_t(seed),
                               uint32_t(seed >> 32));
  return float(r.v[0] >> 8) * (1.0f / 16777216.0f);
}

// ---------------------------------------------------------------- correctly rounded log, cos
// Note [Bit-identical Box-Muller]: the host's philoxNormal is
//   sqrt(-2 log u1) * cos(6.283185307179586 * u2)
// in double with glibc's log and cos. Every step but log and cos (the uniforms, -2·L, sqrt, the
// products) is an exact or correctly rounded IEEE operation on both sides; the device code uses
// the _rn intrinsics so nvcc cannot fuse a multiply and an add that the host rounds separately.
// CUDA's log (1 ulp) and cos (2 ulp) differ from glibc's in the last bit for some inputs, so the
// device computes log and cos in double-double (about 100 good bits) and rounds once: correctly
// rounded results (checked against mpmath). glibc's are not always: on glibc 2.36 (x86-64) they
// miss for ~0.08% (log) and ~0.13% (cos) of these inputs, so ~0.18% of float64 normals differ from
// the host's in the last bit (float32 and 16-bit outputs: none in 500,000 draws). Bit identity
// for float64 needs the host to call these same functions (they are __host__ __device__ and use
// only IEEE +, -, *, / and fma for that reason), which also frees it from glibc's version and its
// FMA/non-FMA code paths.
// The functions: dd_math.h (host-checkable).

// keel::philoxNormal: Box-Muller (cosine branch) over words 0 and 1 of the counter's block.
__device__ __forceinline__ double philoxNormal(uint64_t seed, uint64_t offset, uint64_t i) {
  const uint64_t c = offset + i;
  const Philox4 r = philox4x32({{uint32_t(c), uint32_t(c >> 32), 0x4e4f524du, 0u}}, uint32_t(seed),
                               uint32_t(seed >> 32));
  const double u1 = (double(r.v[0]) + 1.0) / 4294967296.0;  // exact: 33 bits
  const double u2 = double(r.v[1]) / 4294967296.0;          // exact
  const double radius = __dsqrt_rn(__dmul_rn(-2.0, dd::logCr(u1)));
  return __dmul_rn(radius, dd::cosCr(__dmul_rn(6.283185307179586, u2)));
}

// ---------------------------------------------------------------- kernels
// Dropout: element i (row-major, the contiguous output's offset) is kept iff its uniform is at
// least p (compared in double, as the reference), and then x / (1 - p) in double, rounded once.
template <bool kContig, typename T>
__global__ void dropoutKernel(T* __restrict__ out, const T* __restrict__ x, Geom gx, int64_t n,
                              uint64_t seed, uint64_t offset, double p, double keep) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float u = philoxUniform(seed, offset, uint64_t(i));
    const T v = x[kContig ? i : gx.offset(i)];
    out[i] = double(u) >= p ? storeAs<T>(__ddiv_rn(readAs<double>(v), keep)) : storeAs<T>(0.0);
  }
}

// base + scale * r in double, r = philoxNormal(i) when kIsNormal, else philoxUniform(i); no fused
// multiply-add (the host rounds the product), rounded once. uniform(low, high) is base low, scale
// high - low; normal(mean, std) is base mean, scale std.
template <bool kIsNormal, typename T>
__global__ void philoxFillKernel(T* __restrict__ out, int64_t n, uint64_t seed, uint64_t offset,
                                 double base, double scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    double r;
    if constexpr (kIsNormal)
      r = double(philoxNormal(seed, offset, uint64_t(i)));
    else
      r = double(philoxUniform(seed, offset, uint64_t(i)));
    out[i] = storeAs<T>(__dadd_rn(base, __dmul_rn(scale, r)));
  }
}

// The factories uniform and normal: out from the attributes seed and offset.
template <bool kIsNormal>
void philoxFill(const KernelCtx& c, double base, double scale) {
  const Tensor& out = c.outputs[0];
  const uint64_t seed = uint64_t(c.attrs.getInt("seed"));
  const uint64_t offset = uint64_t(c.attrs.getInt("offset"));
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceCtx& d = deviceCtx(c);
  const Launch1D l = launch1D(n);
  visitFloat(out.dtype(), [&]<typename T>() {
    launch(philoxFillKernel<kIsNormal, T>, l.blocks, l.threads, 0, d.stream, ptr<T>(out), n, seed,
           offset, base, scale);
  });
  checkLaunch(c, kIsNormal ? "normal" : "uniform");
}

}  // namespace

void kDropout(const KernelCtx& c) {
  const Tensor &x = c.inputs[0], &out = c.outputs[0];
  const double p = c.attrs.getDouble("p");
  const uint64_t seed = uint64_t(c.attrs.getInt("seed"));
  const uint64_t offset = uint64_t(c.attrs.getInt("offset"));
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceCtx& d = deviceCtx(c);
  const Geom gx = geomAs(x, out.shape());
  const Launch1D l = launch1D(n);
  visitFloat(x.dtype(), [&]<typename T>() {
    if (gx.contiguous)
      launch(dropoutKernel<true, T>, l.blocks, l.threads, 0, d.stream, ptr<T>(out), ptr<const T>(x),
             gx, n, seed, offset, p, 1.0 - p);
    else
      launch(dropoutKernel<false, T>, l.blocks, l.threads, 0, d.stream, ptr<T>(out),
             ptr<const T>(x), gx, n, seed, offset, p, 1.0 - p);
  });
  checkLaunch(c, "dropoutKernel");
}

void kUniform(const KernelCtx& c) {
  const double lo = c.attrs.getDouble("low"), hi = c.attrs.getDouble("high");
  philoxFill<false>(c, lo, hi - lo);
}

void kNormal(const KernelCtx& c) {
  philoxFill<true>(c, c.attrs.getDouble("mean"), c.attrs.getDouble("std"));
}

}  // namespace keel::cuda
