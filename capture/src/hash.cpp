// Tensor MD5, rounded MD5, statistics and contiguous copies (see keel/capture/hash.h and
// docs/capture.md). Elements are walked in row-major order in contiguous chunks: a contiguous
// tensor is one chunk fed straight from its buffer; a strided view is gathered into a scratch page.
#include "keel/capture/hash.h"

#include <openssl/evp.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

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

// Calls fn(double) for each element of a chunk, converting from dtype.
template <typename Fn>
void forEachValue(DType dt, const uint8_t* p, int64_t n, Fn&& fn) {
  switch (dt) {
    case DType::Float32: {
      for (int64_t i = 0; i < n; ++i) {
        float v;
        std::memcpy(&v, p + i * 4, 4);
        fn(double(v));
      }
      return;
    }
    case DType::Float64: {
      for (int64_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, p + i * 8, 8);
        fn(v);
      }
      return;
    }
    case DType::Float16: {
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, p + i * 2, 2);
        fn(double(Half::toFloat(b)));
      }
      return;
    }
    case DType::BFloat16: {
      for (int64_t i = 0; i < n; ++i) {
        BFloat16 b;
        std::memcpy(&b.bits, p + i * 2, 2);
        fn(double(float(b)));
      }
      return;
    }
    case DType::Int32: {
      for (int64_t i = 0; i < n; ++i) {
        int32_t v;
        std::memcpy(&v, p + i * 4, 4);
        fn(double(v));
      }
      return;
    }
    case DType::Int64: {
      for (int64_t i = 0; i < n; ++i) {
        int64_t v;
        std::memcpy(&v, p + i * 8, 8);
        fn(double(v));
      }
      return;
    }
    case DType::Bool: {
      for (int64_t i = 0; i < n; ++i) fn(p[i] ? 1.0 : 0.0);
      return;
    }
  }
}

struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

// One fetched MD5 implementation and one context per thread: EVP_DigestInit_ex on a reused
// context is cheap, an implicit fetch per call is not.
class Md5 {
 public:
  Md5() {
    static EVP_MD* md = EVP_MD_fetch(nullptr, "MD5", nullptr);
    KEEL_CHECK(md != nullptr, "capture: OpenSSL has no MD5 implementation");
    thread_local std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> ctx(EVP_MD_CTX_new());
    KEEL_CHECK(ctx != nullptr, "capture: EVP_MD_CTX_new failed");
    ctx_ = ctx.get();
    KEEL_CHECK(EVP_DigestInit_ex(ctx_, md, nullptr) == 1, "capture: MD5 init failed");
  }
  void update(const void* p, size_t n) {
    if (n) KEEL_CHECK(EVP_DigestUpdate(ctx_, p, n) == 1, "capture: MD5 update failed");
  }
  std::string hex() {
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    KEEL_CHECK(EVP_DigestFinal_ex(ctx_, out, &len) == 1, "capture: MD5 final failed");
    return toHex(out, len);
  }

 private:
  EVP_MD_CTX* ctx_;
};

void putLe64(std::string& s, int64_t v) {
  uint64_t u = uint64_t(v);
  for (int i = 0; i < 8; ++i) s.push_back(char((u >> (8 * i)) & 0xff));
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

std::string hashHeader(DType dtype, const Shape& shape) {
  std::string h(dtypeName(dtype));
  h.push_back('\0');
  putLe64(h, int64_t(shape.size()));
  for (int64_t d : shape) putLe64(h, d);
  return h;
}

std::string tensorMd5(const Tensor& t) {
  KEEL_CHECK(t.defined(), "capture: cannot hash an undefined tensor");
  Md5 md;
  std::string header = hashHeader(t.dtype(), t.shape());
  md.update(header.data(), header.size());
  const size_t es = dtypeSize(t.dtype());
  if (t.dtype() == DType::Bool) {
    // Normalise to 0/1 so that any non-zero byte the kernel wrote hashes as true.
    uint8_t page[4096];
    forEachChunk(t, [&](const uint8_t* p, int64_t n) {
      for (int64_t i = 0; i < n; i += int64_t(sizeof page)) {
        int64_t m = std::min<int64_t>(int64_t(sizeof page), n - i);
        for (int64_t k = 0; k < m; ++k) page[k] = p[i + k] ? 1 : 0;
        md.update(page, size_t(m));
      }
    });
  } else {
    forEachChunk(t, [&](const uint8_t* p, int64_t n) { md.update(p, size_t(n) * es); });
  }
  return md.hex();
}

std::string tensorMd5Rounded(const Tensor& t, int digits) {
  KEEL_CHECK(t.defined(), "capture: cannot hash an undefined tensor");
  KEEL_CHECK(digits >= 1 && digits <= 17, "capture: rounded MD5 digits must be 1..17, got ",
             digits);
  Md5 md;
  std::string header = hashHeader(t.dtype(), t.shape());
  md.update(header.data(), header.size());
  char fmt[16];
  std::snprintf(fmt, sizeof fmt, "%%.%dg\n", digits);
  std::string text;
  text.reserve(kScratchBytes + 64);
  char buf[64];
  forEachChunk(t, [&](const uint8_t* p, int64_t n) {
    forEachValue(t.dtype(), p, n, [&](double v) {
      if (std::isnan(v)) {
        text += "nan\n";
      } else if (std::isinf(v)) {
        text += v > 0 ? "inf\n" : "-inf\n";
      } else {
        if (v == 0) v = 0;  // -0 prints as 0
        int len = std::snprintf(buf, sizeof buf, fmt, v);
        text.append(buf, size_t(len));
      }
      if (int64_t(text.size()) >= kScratchBytes) {
        md.update(text.data(), text.size());
        text.clear();
      }
    });
  });
  md.update(text.data(), text.size());
  return md.hex();
}

storage::TensorStats tensorStats(const Tensor& t) {
  storage::TensorStats s;
  // Shifted sums (shift = the first finite value) keep the variance accurate in one pass.
  bool haveShift = false;
  double shift = 0, s1 = 0, s2 = 0, mn = 0, mx = 0, amax = 0;
  int64_t n = 0;
  forEachChunk(t, [&](const uint8_t* p, int64_t cnt) {
    forEachValue(t.dtype(), p, cnt, [&](double v) {
      if (std::isnan(v)) {
        ++s.nanCount;
        return;
      }
      if (std::isinf(v)) {
        ++s.infCount;
        return;
      }
      if (v == 0) ++s.zeroCount;
      if (!haveShift) {
        haveShift = true;
        shift = v;
        mn = mx = v;
      }
      mn = v < mn ? v : mn;
      mx = v > mx ? v : mx;
      double a = std::fabs(v);
      amax = a > amax ? a : amax;
      double d = v - shift;
      s1 += d;
      s2 += d * d;
      ++n;
    });
  });
  if (n > 0) {
    s.min = mn;
    s.max = mx;
    s.absMax = amax;
    s.mean = shift + s1 / double(n);
    double var = (s2 - s1 * s1 / double(n)) / double(n);
    s.std = std::sqrt(var > 0 ? var : 0.0);
  }
  return s;
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
