// Tensor MD5, rounded MD5, statistics and contiguous copies (see keel/capture/hash.h and
// docs/capture.md). Elements are walked in row-major order in contiguous chunks: a contiguous
// tensor is one chunk fed straight from its buffer; a strided view is gathered into a scratch page.
#include "keel/capture/hash.h"

#include <openssl/evp.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>

#include "keel/base/values.h"
#include "keel/error.h"

namespace keel::capture {

static_assert(std::endian::native == std::endian::little,
              "the hash byte layout assumes a little-endian host");

namespace {

constexpr int64_t kScratchBytes = 64 * 1024;

// Calls fn(const uint8_t* data, int64_t elements) for consecutive row-major runs of t's elements.
template <typename Fn>
void forEachChunk(const Tensor& t, Fn&& fn) {
  KEEL_CHECK(t.defined(), "capture: cannot read an undefined tensor");
  KEEL_CHECK(t.device().isHost(), "capture: tensor on ", t.device().name(), " is not host memory");
  const int64_t n = t.numel();
  if (n == 0) return;
  const int64_t es = int64_t(dtypeSize(t.dtype()));
  const auto* base = static_cast<const uint8_t*>(t.data());
  if (t.isContiguous()) {
    fn(base, n);
    return;
  }
  const Shape& shape = t.shape();
  const Shape& strides = t.strides();
  const int rank = int(shape.size());
  const int64_t inner = shape[rank - 1];
  const int64_t innerStride = strides[rank - 1];
  std::vector<int64_t> idx(rank, 0);
  std::vector<uint8_t> scratch;
  const int64_t perPage = std::max<int64_t>(1, kScratchBytes / es);
  if (innerStride != 1) scratch.resize(size_t(std::min(inner, perPage) * es));
  for (;;) {
    int64_t off = 0;
    for (int d = 0; d < rank - 1; ++d) off += idx[d] * strides[d];
    const uint8_t* row = base + off * es;
    if (innerStride == 1) {
      fn(row, inner);
    } else {
      for (int64_t i = 0; i < inner; i += perPage) {
        int64_t m = std::min(perPage, inner - i);
        for (int64_t k = 0; k < m; ++k)
          std::memcpy(scratch.data() + k * es, row + (i + k) * innerStride * es, size_t(es));
        fn(scratch.data(), m);
      }
    }
    int d = rank - 2;
    for (; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

const EVP_MD* md5Algorithm() {
  static EVP_MD* md = EVP_MD_fetch(nullptr, "MD5", nullptr);
  KEEL_CHECK(md != nullptr, "capture: OpenSSL has no MD5 implementation");
  return md;
}

std::shared_ptr<EVP_MD_CTX> newMd5Ctx() {
  std::shared_ptr<EVP_MD_CTX> ctx(EVP_MD_CTX_new(), MdCtxDeleter());
  KEEL_CHECK(ctx != nullptr, "capture: EVP_MD_CTX_new failed");
  KEEL_CHECK(EVP_DigestInit_ex(ctx.get(), md5Algorithm(), nullptr) == 1,
             "capture: MD5 init failed");
  return ctx;
}

void md5Update(EVP_MD_CTX* ctx, const void* p, size_t n) {
  if (n) KEEL_CHECK(EVP_DigestUpdate(ctx, p, n) == 1, "capture: MD5 update failed");
}

void putLe64(std::string& s, int64_t v) {
  uint64_t u = uint64_t(v);
  for (int i = 0; i < 8; ++i) s.push_back(char((u >> (8 * i)) & 0xff));
}

void putLe(uint8_t* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = uint8_t((v >> (8 * i)) & 0xff);
}

// P[k + kPow10Bias] = the double nearest to 10^k (strtod is correctly rounded), k in
// [-kPow10Bias, kPow10Max]; 10^k past the double range is +inf or 0.
constexpr int kPow10Bias = 350, kPow10Max = 310;
const double* pow10Table() {
  static const std::vector<double> table = [] {
    std::vector<double> t(size_t(kPow10Bias + kPow10Max + 1));
    for (int k = -kPow10Bias; k <= kPow10Max; ++k) {
      std::string text = "1e" + std::to_string(k);
      t[size_t(k + kPow10Bias)] = std::strtod(text.c_str(), nullptr);
    }
    return t;
  }();
  return table.data();
}

// The rounded form of one value (see docs/capture.md): writes 12 bytes, m (int64) and e (int32).
void roundedCode(double v, int digits, const double* P, uint8_t out[12]) {
  int64_t m = 0;
  int32_t e = 0;
  if (std::isnan(v)) {
    e = kRoundedSpecial;
  } else if (std::isinf(v)) {
    m = v > 0 ? 1 : -1;
    e = kRoundedSpecial;
  } else if (v != 0) {
    const double a = std::fabs(v);
    int b = 0;
    std::frexp(a, &b);
    int k = int(std::floor(double(b - 1) * 0.30102999566398120));  // floor(log10 a) or one off
    k = std::clamp(k, -kPow10Bias + 1, kPow10Max - 1);
    while (k + 1 <= kPow10Max - 1 && a >= P[k + 1 + kPow10Bias]) ++k;
    while (k > -kPow10Bias + 1 && a < P[k + kPow10Bias]) --k;
    const int s = k - digits + 1;  // m = v / 10^s, rounded half to even
    double q;
    if (s >= 0) {
      q = v / P[s + kPow10Bias];
    } else if (-s <= 300) {
      q = v * P[-s + kPow10Bias];
    } else {
      q = v * P[300 + kPow10Bias] * P[-s - 300 + kPow10Bias];
    }
    q = std::nearbyint(q);
    e = k;
    if (std::fabs(q) >= P[digits + kPow10Bias]) {  // 9.99..5 rounded up to 10^digits
      q = std::nearbyint(q / 10);
      e = k + 1;
    }
    m = int64_t(q);
  }
  putLe(out, uint64_t(m), 8);
  putLe(out + 8, uint64_t(uint32_t(e)), 4);
}

// Running statistics. Sums are of (v - shift), shift being the first finite value of the tensor,
// so the variance stays accurate in one pass. Element number i (row-major over the whole tensor)
// always goes to lane i % kLanes, however the elements arrive in chunks, and the lanes are combined
// in lane order at the end: a view and its contiguous copy give the same bits, and so do the AVX2
// and the scalar float32 loops below (same operations per lane, no FMA).
constexpr int kLanes = 8;
}  // namespace

struct StatsStream::Acc {
  double s1[kLanes] = {}, s2[kLanes] = {};
  double mn[kLanes], mx[kLanes], amax[kLanes] = {};
  int64_t finite[kLanes] = {}, nan[kLanes] = {}, inf[kLanes] = {}, zero[kLanes] = {};
  Acc() {
    for (int j = 0; j < kLanes; ++j) {
      mn[j] = std::numeric_limits<double>::infinity();
      mx[j] = -std::numeric_limits<double>::infinity();
    }
  }
  void add(int j, double v, double shift) {
    const bool isNan = v != v;
    const bool isInf = std::fabs(v) == std::numeric_limits<double>::infinity();
    const bool fin = !isNan && !isInf;
    nan[j] += isNan;
    inf[j] += isInf;
    zero[j] += v == 0;
    finite[j] += fin;
    const double d = fin ? v - shift : 0.0;
    s1[j] += d;
    s2[j] += d * d;
    mn[j] = fin && v < mn[j] ? v : mn[j];
    mx[j] = fin && v > mx[j] ? v : mx[j];
    const double a = fin ? std::fabs(v) : 0.0;
    amax[j] = a > amax[j] ? a : amax[j];
  }
};

using StatsAcc = StatsStream::Acc;

namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KEEL_HAVE_AVX2_STATS 1
// Whole groups of kLanes float32 values; returns how many elements it consumed.
__attribute__((target("avx2"))) int64_t statsFloat32Avx2(const float* p, int64_t n, double shift,
                                                         StatsAcc& acc) {
  const __m256 signMask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 infF = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  const __m256d signMaskD = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
  const __m256d shiftD = _mm256_set1_pd(shift);
  const __m256d posInf = _mm256_set1_pd(std::numeric_limits<double>::infinity());
  const __m256d negInf = _mm256_set1_pd(-std::numeric_limits<double>::infinity());
  __m256d s1[2], s2[2], mn[2], mx[2], am[2];
  for (int h = 0; h < 2; ++h) {
    s1[h] = _mm256_loadu_pd(acc.s1 + 4 * h);
    s2[h] = _mm256_loadu_pd(acc.s2 + 4 * h);
    mn[h] = _mm256_loadu_pd(acc.mn + 4 * h);
    mx[h] = _mm256_loadu_pd(acc.mx + 4 * h);
    am[h] = _mm256_loadu_pd(acc.amax + 4 * h);
  }
  __m256i cNan = _mm256_setzero_si256(), cInf = cNan, cZero = cNan, cFin = cNan;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m256 x = _mm256_loadu_ps(p + i);
    const __m256 ax = _mm256_and_ps(x, signMask);
    const __m256 nanM = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256 infM = _mm256_cmp_ps(ax, infF, _CMP_EQ_OQ);
    const __m256 finM = _mm256_cmp_ps(ax, infF, _CMP_LT_OQ);
    const __m256 zeroM = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_EQ_OQ);
    cNan = _mm256_sub_epi32(cNan, _mm256_castps_si256(nanM));
    cInf = _mm256_sub_epi32(cInf, _mm256_castps_si256(infM));
    cZero = _mm256_sub_epi32(cZero, _mm256_castps_si256(zeroM));
    cFin = _mm256_sub_epi32(cFin, _mm256_castps_si256(finM));
    const __m256 xf = _mm256_and_ps(x, finM);  // non-finite -> 0 before widening
    for (int h = 0; h < 2; ++h) {
      const __m128 part = h == 0 ? _mm256_castps256_ps128(xf) : _mm256_extractf128_ps(xf, 1);
      const __m128i fm32 =
          _mm_castps_si128(h == 0 ? _mm256_castps256_ps128(finM) : _mm256_extractf128_ps(finM, 1));
      const __m256d fm = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(fm32));
      const __m256d v = _mm256_cvtps_pd(part);
      const __m256d d = _mm256_and_pd(_mm256_sub_pd(v, shiftD), fm);
      s1[h] = _mm256_add_pd(s1[h], d);
      s2[h] = _mm256_add_pd(s2[h], _mm256_mul_pd(d, d));
      mn[h] = _mm256_min_pd(_mm256_blendv_pd(posInf, v, fm), mn[h]);  // (v < mn) ? v : mn
      mx[h] = _mm256_max_pd(_mm256_blendv_pd(negInf, v, fm), mx[h]);  // (v > mx) ? v : mx
      am[h] = _mm256_max_pd(_mm256_and_pd(_mm256_and_pd(v, signMaskD), fm), am[h]);
    }
  }
  for (int h = 0; h < 2; ++h) {
    _mm256_storeu_pd(acc.s1 + 4 * h, s1[h]);
    _mm256_storeu_pd(acc.s2 + 4 * h, s2[h]);
    _mm256_storeu_pd(acc.mn + 4 * h, mn[h]);
    _mm256_storeu_pd(acc.mx + 4 * h, mx[h]);
    _mm256_storeu_pd(acc.amax + 4 * h, am[h]);
  }
  int32_t c[4][kLanes];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(c[0]), cNan);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(c[1]), cInf);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(c[2]), cZero);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(c[3]), cFin);
  for (int j = 0; j < kLanes; ++j) {
    acc.nan[j] += c[0][j];
    acc.inf[j] += c[1][j];
    acc.zero[j] += c[2][j];
    acc.finite[j] += c[3][j];
  }
  return i;
}

// AVX-512F: 16 float32 values per iteration. The sums go to lanes 0..7 as two groups of 8
// doubles one after the other, exactly as the AVX2 and scalar loops add them (same operations per
// lane, no FMA: the GCC target contracts mul+add unless told not to). Minimum, maximum and
// largest magnitude are exact whatever the order, so they run on 16 floats and fold into lane 0
// (StatsStream::finish reports a zero extreme as +0 whichever zero came first). NaN/Inf/zero/finite
// counts are integers, summed in lane 0.
constexpr __mmask8 kAll8 = 0xff;  // (the masked extract: the plain one warns of undefined lanes)
// Eight floats' finite values (fm), shifted, into the running sum and sum of squares.
__attribute__((target("avx512f"), optimize("fp-contract=off"), always_inline)) inline void
addHalfAvx512(__m256 part, __mmask8 fm, __m512d zeroD, __m512d shiftD, __m512d& s1, __m512d& s2) {
  const __m512d v = _mm512_mask_cvtps_pd(zeroD, fm, part);  // non-finite -> 0
  const __m512d d = _mm512_maskz_sub_pd(fm, v, shiftD);
  s1 = _mm512_add_pd(s1, d);
  s2 = _mm512_add_pd(s2, _mm512_mul_pd(d, d));
}
__attribute__((target("avx512f"), optimize("fp-contract=off"))) int64_t statsFloat32Avx512(
    const float* p, int64_t n, double shift, StatsAcc& acc) {
  const __m512d shiftD = _mm512_set1_pd(shift);
  const __m512 infF = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  const __m512d zeroD = _mm512_setzero_pd();
  __m512d s1 = _mm512_loadu_pd(acc.s1), s2 = _mm512_loadu_pd(acc.s2);
  __m512 mn = infF, mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 am = _mm512_setzero_ps();
  int64_t cNan = 0, cInf = 0, cZero = 0, cFin = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(p + i);
    const __m512 ax = _mm512_abs_ps(x);
    const __mmask16 nanM = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __mmask16 infM = _mm512_cmp_ps_mask(ax, infF, _CMP_EQ_OQ);
    const __mmask16 finM = _mm512_cmp_ps_mask(ax, infF, _CMP_LT_OQ);
    const __mmask16 zeroM = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_EQ_OQ);
    cNan += __builtin_popcount(nanM);
    cInf += __builtin_popcount(infM);
    cZero += __builtin_popcount(zeroM);
    cFin += __builtin_popcount(finM);
    mn = _mm512_mask_min_ps(mn, finM, x, mn);
    mx = _mm512_mask_max_ps(mx, finM, x, mx);
    am = _mm512_mask_max_ps(am, finM, ax, am);
    // Each half of x as float64 (the extract's index must be a literal: a loop over it compiles
    // only where the optimiser unrolls it).
    addHalfAvx512(_mm256_castpd_ps(_mm512_mask_extractf64x4_pd(_mm256_setzero_pd(), kAll8,
                                                               _mm512_castps_pd(x), 0)),
                  __mmask8(finM), zeroD, shiftD, s1, s2);
    addHalfAvx512(_mm256_castpd_ps(_mm512_mask_extractf64x4_pd(_mm256_setzero_pd(), kAll8,
                                                               _mm512_castps_pd(x), 1)),
                  __mmask8(finM >> 8), zeroD, shiftD, s1, s2);
  }
  _mm512_storeu_pd(acc.s1, s1);
  _mm512_storeu_pd(acc.s2, s2);
  // Folded by hand: GCC 12's _mm512_reduce_*_ps trip -Wuninitialized (bug 105593).
  float vmn[16], vmx[16], vam[16];
  _mm512_storeu_ps(vmn, mn);
  _mm512_storeu_ps(vmx, mx);
  _mm512_storeu_ps(vam, am);
  for (int k = 0; k < 16; ++k) {
    acc.mn[0] = std::min(acc.mn[0], double(vmn[k]));
    acc.mx[0] = std::max(acc.mx[0], double(vmx[k]));
    acc.amax[0] = std::max(acc.amax[0], double(vam[k]));
  }
  acc.nan[0] += cNan;
  acc.inf[0] += cInf;
  acc.zero[0] += cZero;
  acc.finite[0] += cFin;
  return i;
}
#endif

void statsFloat32(const float* p, int64_t n, double shift, StatsAcc& acc, int& lane) {
  int64_t i = 0;
  for (; i < n && lane != 0; ++i, lane = (lane + 1) % kLanes) acc.add(lane, double(p[i]), shift);
#ifdef KEEL_HAVE_AVX2_STATS
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx512) i += statsFloat32Avx512(p + i, n - i, shift, acc);
  // int32 lane counters: at most 2^31 - 1 groups per call.
  constexpr int64_t kMaxPerCall = (int64_t(1) << 30) * kLanes;
  while (avx2 && n - i >= kLanes)
    i += statsFloat32Avx2(p + i, std::min(n - i, kMaxPerCall), shift, acc);
#endif
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc.add(j, double(p[i + j]), shift);
  for (; i < n; ++i, lane = (lane + 1) % kLanes) acc.add(lane, double(p[i]), shift);
}

}  // namespace

std::string toHex(const unsigned char* data, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(n * 2, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = kDigits[data[i] >> 4];
    s[2 * i + 1] = kDigits[data[i] & 15];
  }
  return s;
}

std::string hashTrailer(DType dtype, const Shape& shape) {
  std::string h(dtypeName(dtype));
  h.push_back('\0');
  putLe64(h, int64_t(shape.size()));
  for (int64_t d : shape) putLe64(h, d);
  return h;
}

std::string Md5Stream::finish(std::string_view trailer) const {
  KEEL_CHECK(ctx_ != nullptr, "capture: empty MD5 stream");
  thread_local std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> scratch(EVP_MD_CTX_new());
  KEEL_CHECK(scratch != nullptr, "capture: EVP_MD_CTX_new failed");
  KEEL_CHECK(EVP_MD_CTX_copy_ex(scratch.get(), ctx_.get()) == 1, "capture: MD5 copy failed");
  md5Update(scratch.get(), trailer.data(), trailer.size());
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  KEEL_CHECK(EVP_DigestFinal_ex(scratch.get(), out, &len) == 1, "capture: MD5 final failed");
  return toHex(out, len);
}

Md5Stream md5Elements(const Tensor& t) {
  KEEL_CHECK(t.defined(), "capture: cannot hash an undefined tensor");
  Md5Stream s;
  s.ctx_ = newMd5Ctx();
  EVP_MD_CTX* ctx = s.ctx_.get();
  const size_t es = dtypeSize(t.dtype());
  if (t.dtype() == DType::Bool) {
    // Normalise to 0/1 so that any non-zero byte the kernel wrote hashes as true.
    uint8_t page[4096];
    forEachChunk(t, [&](const uint8_t* p, int64_t n) {
      for (int64_t i = 0; i < n; i += int64_t(sizeof page)) {
        int64_t m = std::min<int64_t>(int64_t(sizeof page), n - i);
        for (int64_t k = 0; k < m; ++k) page[k] = p[i + k] ? 1 : 0;
        md5Update(ctx, page, size_t(m));
      }
    });
  } else {
    forEachChunk(t, [&](const uint8_t* p, int64_t n) { md5Update(ctx, p, size_t(n) * es); });
  }
  return s;
}

Md5Stream md5RoundedElements(const Tensor& t, int digits) {
  KEEL_CHECK(t.defined(), "capture: cannot hash an undefined tensor");
  KEEL_CHECK(digits >= 1 && digits <= 17, "capture: rounded MD5 digits must be 1..17, got ",
             digits);
  Md5Stream s;
  s.ctx_ = newMd5Ctx();
  EVP_MD_CTX* ctx = s.ctx_.get();
  const double* P = pow10Table();
  constexpr int64_t kPer = 4096;
  std::vector<uint8_t> page(size_t(kPer) * 12);
  int64_t used = 0;
  forEachChunk(t, [&](const uint8_t* p, int64_t n) {
    forEachValue(t.dtype(), p, n, [&](double v) {
      roundedCode(v, digits, P, page.data() + used * 12);
      if (++used == kPer) {
        md5Update(ctx, page.data(), page.size());
        used = 0;
      }
    });
  });
  md5Update(ctx, page.data(), size_t(used) * 12);
  return s;
}

std::string tensorMd5(const Tensor& t) {
  return md5Elements(t).finish(hashTrailer(t.dtype(), t.shape()));
}

std::string tensorMd5Rounded(const Tensor& t, int digits) {
  return md5RoundedElements(t, digits).finish(hashTrailer(t.dtype(), t.shape()));
}

StatsStream::StatsStream(DType dtype, double shift)
    : acc_(std::make_unique<Acc>()), dtype_(dtype), shift_(shift) {}
StatsStream::~StatsStream() = default;
StatsStream::StatsStream(StatsStream&&) noexcept = default;
StatsStream& StatsStream::operator=(StatsStream&&) noexcept = default;

void StatsStream::add(const uint8_t* p, int64_t n) {
  if (dtype_ == DType::Float32) {
    statsFloat32(reinterpret_cast<const float*>(p), n, shift_, *acc_, lane_);
    return;
  }
  forEachValue(dtype_, p, n, [&](double v) {
    acc_->add(lane_, v, shift_);
    lane_ = (lane_ + 1) % kLanes;
  });
}

storage::TensorStats StatsStream::finish() const {
  storage::TensorStats s;
  const Acc& acc = *acc_;
  double s1 = 0, s2 = 0, mn = acc.mn[0], mx = acc.mx[0], amax = 0;
  int64_t n = 0;
  for (int j = 0; j < kLanes; ++j) {
    s1 += acc.s1[j];
    s2 += acc.s2[j];
    mn = std::min(mn, acc.mn[j]);
    mx = std::max(mx, acc.mx[j]);
    amax = std::max(amax, acc.amax[j]);
    n += acc.finite[j];
    s.nanCount += acc.nan[j];
    s.infCount += acc.inf[j];
    s.zeroCount += acc.zero[j];
  }
  if (n > 0) {
    // +0 for a zero extreme: which zero comes first depends on the order the lanes saw them.
    s.min = mn == 0 ? 0.0 : mn;
    s.max = mx == 0 ? 0.0 : mx;
    s.absMax = amax;
    s.mean = shift_ + s1 / double(n);
    double var = (s2 - s1 * s1 / double(n)) / double(n);
    s.std = std::sqrt(var > 0 ? var : 0.0);
  }
  return s;
}

double statsShift(const Tensor& t) {
  bool found = false;
  double shift = 0;
  forEachChunk(t, [&](const uint8_t* p, int64_t cnt) {
    if (found) return;
    forEachValue(t.dtype(), p, cnt, [&](double v) {
      if (!found && std::isfinite(v)) {
        found = true;
        shift = v;
      }
    });
  });
  return shift;
}

double statsShift(DType dtype, const uint8_t* p, int64_t n) {
  bool found = false;
  double shift = 0;
  forEachValue(dtype, p, n, [&](double v) {
    if (!found && std::isfinite(v)) {
      found = true;
      shift = v;
    }
  });
  return shift;
}

storage::TensorStats tensorStats(const Tensor& t) {
  StatsStream stream(t.dtype(), statsShift(t));
  forEachChunk(t, [&](const uint8_t* p, int64_t cnt) { stream.add(p, cnt); });
  return stream.finish();
}

std::vector<uint8_t> contiguousBytes(const Tensor& t) {
  std::vector<uint8_t> out;
  out.reserve(t.nbytes());
  forEachChunk(t, [&](const uint8_t* p, int64_t n) {
    out.insert(out.end(), p, p + size_t(n) * dtypeSize(t.dtype()));
  });
  return out;
}

}  // namespace keel::capture
