// Correctly rounded log and cos in double-double arithmetic (Note [Bit-identical Box-Muller] in
// random.cu): the device's float64 normals. Only IEEE +, -, *, / and fma, each rounded to nearest
// (the _rn intrinsics on the device, so nvcc cannot fuse what must round twice), so the same code
// runs on the host, where tests/engine/gpu_backend_test.cpp checks it against long double.
#pragma once
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define KEEL_DD_HD __host__ __device__
#define KEEL_DD_INLINE __forceinline__
#else
#define KEEL_DD_HD
#define KEEL_DD_INLINE inline
#endif

namespace keel::cuda::dd {

#ifdef __CUDA_ARCH__
#define KEEL_DD_UNROLL _Pragma("unroll")
#else
#define KEEL_DD_UNROLL
#endif
KEEL_DD_HD KEEL_DD_INLINE double ddAddRn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
KEEL_DD_HD KEEL_DD_INLINE double ddSubRn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
KEEL_DD_HD KEEL_DD_INLINE double ddMulRn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
KEEL_DD_HD KEEL_DD_INLINE double ddDivRn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

// hi + lo with |lo| <= ulp(hi)/2 (normalized: hi is hi + lo rounded to double).
struct DD {
  double hi, lo;
};
// Exact sum and product (Knuth's TwoSum; FMA's exact residual).
KEEL_DD_HD KEEL_DD_INLINE DD twoSum(double a, double b) {
  const double s = ddAddRn(a, b);
  const double bb = ddSubRn(s, a);
  return {s, ddAddRn(ddSubRn(a, ddSubRn(s, bb)), ddSubRn(b, bb))};
}
KEEL_DD_HD KEEL_DD_INLINE DD quickTwoSum(double a, double b) {  // |a| >= |b|
  const double s = ddAddRn(a, b);
  return {s, ddSubRn(b, ddSubRn(s, a))};
}
KEEL_DD_HD KEEL_DD_INLINE DD twoProd(double a, double b) {
  const double p = ddMulRn(a, b);
  return {p, fma(a, b, -p)};
}
KEEL_DD_HD KEEL_DD_INLINE DD ddNeg(DD a) {
  return {-a.hi, -a.lo};
}
// Accurate addition (both pairs' errors kept: no loss when a and b cancel).
KEEL_DD_HD KEEL_DD_INLINE DD ddAdd(DD a, DD b) {
  DD s = twoSum(a.hi, b.hi);
  const DD t = twoSum(a.lo, b.lo);
  s.lo = ddAddRn(s.lo, t.hi);
  s = quickTwoSum(s.hi, s.lo);
  s.lo = ddAddRn(s.lo, t.lo);
  return quickTwoSum(s.hi, s.lo);
}
KEEL_DD_HD KEEL_DD_INLINE DD ddMul(DD a, DD b) {
  DD p = twoProd(a.hi, b.hi);
  p.lo = ddAddRn(p.lo, ddAddRn(ddMulRn(a.hi, b.lo), ddMulRn(a.lo, b.hi)));
  return quickTwoSum(p.hi, p.lo);
}
// a / b for doubles a and b given as a double-double (b.hi + b.lo).
KEEL_DD_HD KEEL_DD_INLINE DD ddDiv(double a, DD b) {
  const double q1 = ddDivRn(a, b.hi);
  // r = a - q1 * (b.hi + b.lo), the residual to well below ulp(a)
  const DD p = twoProd(q1, b.hi);
  const double r = ddSubRn(ddSubRn(ddSubRn(a, p.hi), p.lo), ddMulRn(q1, b.lo));
  return quickTwoSum(q1, ddDivRn(r, b.hi));
}

// ln 2 and pi/2 in three doubles (each the rounded remainder of the previous).
constexpr double kLn2A = 0x1.62e42fefa39efp-1, kLn2B = 0x1.abc9e3b39803fp-56,
                 kLn2C = 0x1.7b57a079a1934p-111;
constexpr double kPio2A = 0x1.921fb54442d18p+0, kPio2B = 0x1.1a62633145c07p-54,
                 kPio2C = -0x1.f1976b7ed8fbcp-110;

// log(x) for a finite x > 0, correctly rounded but in the rarest cases: x = m·2^e with m in
// [√½, √2), s = (m-1)/(m+1), log m = 2s·(1 + s²/3 + s⁴/5 + ...), |s| <= 0.172, 23 terms (the next
// is below 2^-112 relative), all in double-double; the coefficients 1/(2j+1) to 106 bits.
KEEL_DD_HD inline double logCr(double x) {
  constexpr DD kInvOdd[23] = {{0x1.0000000000000p+0, 0x0.0p+0},
                              {0x1.5555555555555p-2, 0x1.5555555555555p-56},
                              {0x1.999999999999ap-3, -0x1.999999999999ap-57},
                              {0x1.2492492492492p-3, 0x1.2492492492492p-57},
                              {0x1.c71c71c71c71cp-4, 0x1.c71c71c71c71cp-58},
                              {0x1.745d1745d1746p-4, -0x1.745d1745d1746p-59},
                              {0x1.3b13b13b13b14p-4, -0x1.3b13b13b13b14p-58},
                              {0x1.1111111111111p-4, 0x1.1111111111111p-60},
                              {0x1.e1e1e1e1e1e1ep-5, 0x1.e1e1e1e1e1e1ep-61},
                              {0x1.af286bca1af28p-5, 0x1.af286bca1af28p-59},
                              {0x1.8618618618618p-5, 0x1.8618618618618p-59},
                              {0x1.642c8590b2164p-5, 0x1.642c8590b2164p-60},
                              {0x1.47ae147ae147bp-5, -0x1.eb851eb851eb8p-61},
                              {0x1.2f684bda12f68p-5, 0x1.2f684bda12f68p-59},
                              {0x1.1a7b9611a7b96p-5, 0x1.1a7b9611a7b96p-61},
                              {0x1.0842108421084p-5, 0x1.0842108421084p-60},
                              {0x1.f07c1f07c1f08p-6, -0x1.f07c1f07c1f08p-61},
                              {0x1.d41d41d41d41dp-6, 0x1.0750750750750p-60},
                              {0x1.bacf914c1bad0p-6, -0x1.bacf914c1bad0p-60},
                              {0x1.a41a41a41a41ap-6, 0x1.0690690690690p-60},
                              {0x1.8f9c18f9c18fap-6, -0x1.f3831f3831f38p-61},
                              {0x1.7d05f417d05f4p-6, 0x1.7d05f417d05f4p-62},
                              {0x1.6c16c16c16c17p-6, -0x1.f49f49f49f49fp-61}};
  int e = 0;
  double m = frexp(x, &e);  // m in [0.5, 1)
  if (m < 0.70710678118654752) {
    m = ddMulRn(m, 2.0);
    --e;
  }
  const double a = ddSubRn(m, 1.0);  // exact (Sterbenz)
  const DD s = ddDiv(a, twoSum(m, 1.0));
  const DD t = ddMul(s, s);
  DD p = kInvOdd[22];
  KEEL_DD_UNROLL
  for (int j = 21; j >= 0; --j) p = ddAdd(ddMul(p, t), kInvOdd[j]);
  DD r = ddMul(ddMul(s, p), {2.0, 0.0});
  if (e != 0) {
    const double ed = double(e);
    DD l = twoProd(ed, kLn2A);
    l = ddAdd(l, twoProd(ed, kLn2B));
    l = ddAdd(l, {ddMulRn(ed, kLn2C), 0.0});
    r = ddAdd(l, r);
  }
  return ddAddRn(r.hi, r.lo);
}

// cos(r) and sin(r) for a double-double |r| <= ~π/4 + 0.01: Taylor series in -r² to the 30th and
// 31st powers (the next term is below 2^-110), the coefficients 1/k! to 106 bits.
KEEL_DD_HD inline DD cosSeries(DD r) {
  constexpr DD kInvEvenFact[16] = {{0x1.0000000000000p+0, 0x0.0p+0},
                                   {0x1.0000000000000p-1, 0x0.0p+0},
                                   {0x1.5555555555555p-5, 0x1.5555555555555p-59},
                                   {0x1.6c16c16c16c17p-10, -0x1.f49f49f49f49fp-65},
                                   {0x1.a01a01a01a01ap-16, 0x1.a01a01a01a01ap-76},
                                   {0x1.27e4fb7789f5cp-22, 0x1.cbbc05b4fa99ap-76},
                                   {0x1.1eed8eff8d898p-29, -0x1.2aec959e14c06p-83},
                                   {0x1.93974a8c07c9dp-37, 0x1.05d6f8a2efd1fp-92},
                                   {0x1.ae7f3e733b81fp-45, 0x1.1d8656b0ee8cbp-101},
                                   {0x1.6827863b97d97p-53, 0x1.eec01221a8b0bp-107},
                                   {0x1.e542ba4020225p-62, 0x1.ea72b4afe3c2fp-120},
                                   {0x1.0ce396db7f853p-70, -0x1.aebcdbd20331cp-124},
                                   {0x1.f2cf01972f578p-80, -0x1.9ada5fcc1ab14p-135},
                                   {0x1.88e85fc6a4e5ap-89, -0x1.71c37ebd16540p-143},
                                   {0x1.0a18a2635085dp-98, 0x1.b9e2e28e1aa54p-153},
                                   {0x1.3932c5047d60ep-108, 0x1.832b7b530a627p-162}};
  const DD u = ddNeg(ddMul(r, r));
  DD p = kInvEvenFact[15];
  KEEL_DD_UNROLL
  for (int j = 14; j >= 0; --j) p = ddAdd(ddMul(p, u), kInvEvenFact[j]);
  return p;
}
KEEL_DD_HD inline DD sinSeries(DD r) {
  constexpr DD kInvOddFact[16] = {{0x1.0000000000000p+0, 0x0.0p+0},
                                  {0x1.5555555555555p-3, 0x1.5555555555555p-57},
                                  {0x1.1111111111111p-7, 0x1.1111111111111p-63},
                                  {0x1.a01a01a01a01ap-13, 0x1.a01a01a01a01ap-73},
                                  {0x1.71de3a556c734p-19, -0x1.c154f8ddc6c00p-73},
                                  {0x1.ae64567f544e4p-26, -0x1.c062e06d1f209p-80},
                                  {0x1.6124613a86d09p-33, 0x1.f28e0cc748ebep-87},
                                  {0x1.ae7f3e733b81fp-41, 0x1.1d8656b0ee8cbp-97},
                                  {0x1.952c77030ad4ap-49, 0x1.ac981465ddc6cp-103},
                                  {0x1.2f49b46814157p-57, 0x1.2650f61dbdcb4p-112},
                                  {0x1.71b8ef6dcf572p-66, -0x1.d043ae40c4647p-120},
                                  {0x1.761b41316381ap-75, -0x1.3423c7d91404fp-130},
                                  {0x1.3f3ccdd165fa9p-84, -0x1.58ddadf344487p-139},
                                  {0x1.d1ab1c2dccea3p-94, 0x1.054d0c78aea14p-149},
                                  {0x1.259f98b4358adp-103, 0x1.eaf8c39dd9bc5p-157},
                                  {0x1.434d2e783f5bcp-113, 0x1.0b87b91be9affp-167}};
  const DD u = ddNeg(ddMul(r, r));
  DD p = kInvOddFact[15];
  KEEL_DD_UNROLL
  for (int j = 14; j >= 0; --j) p = ddAdd(ddMul(p, u), kInvOddFact[j]);
  return ddMul(p, r);
}

// cos(a) for 0 <= a < 8, correctly rounded but in the rarest cases: a = n·π/2 + r with π/2 in
// three doubles (r keeps ~100 bits even next to a zero of cos), then ±cos r or ±sin r.
KEEL_DD_HD inline double cosCr(double a) {
  const double n = rint(ddMulRn(a, 0.63661977236758134));  // a / (π/2), n in 0..5 (0..4 for a < 2π)
  const DD pa = twoProd(n, kPio2A);
  DD r = twoSum(a, -pa.hi);  // exact
  r = ddAdd(r, {-pa.lo, 0.0});
  r = ddAdd(r, ddNeg(twoProd(n, kPio2B)));
  r = ddAdd(r, {-ddMulRn(n, kPio2C), 0.0});
  const int q = int(n) & 3;
  DD v = (q & 1) ? sinSeries(r) : cosSeries(r);
  if (q == 1 || q == 2) v = ddNeg(v);
  return ddAddRn(v.hi, v.lo);
}
#undef KEEL_DD_UNROLL

}  // namespace keel::cuda::dd

#undef KEEL_DD_HD
#undef KEEL_DD_INLINE
