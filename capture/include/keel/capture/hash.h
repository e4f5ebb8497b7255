// Tensor checksums and statistics, exactly as docs/capture.md specifies them: MD5 (OpenSSL EVP)
// over the elements in contiguous row-major order and a trailer (dtype name, NUL, rank, dims), so
// a view and a copy with the same values hash equal. Host tensors only; read on the calling thread.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "keel/storage/records.h"
#include "keel/tensor.h"

struct evp_md_ctx_st;  // OpenSSL EVP_MD_CTX

namespace keel::capture {

// The trailer every tensor hash ends with: dtypeName(dtype), one NUL byte, the rank as a
// little-endian int64, then each dimension as a little-endian int64. It comes after the elements
// so that tensors with the same element bytes (a reshape of a contiguous tensor) share the MD5
// state over the elements and differ only in the trailer.
std::string hashTrailer(DType dtype, const Shape& shape);

// MD5 state after a tensor's element bytes; finish() appends a trailer and returns the hex
// digest. Copyable and cheap to keep (the capture cache holds one per distinct element stream).
class Md5Stream {
 public:
  std::string finish(std::string_view trailer) const;
  bool valid() const { return ctx_ != nullptr; }

 private:
  friend Md5Stream md5Elements(const Tensor& t);
  friend Md5Stream md5RoundedElements(const Tensor& t, int digits);
  std::shared_ptr<evp_md_ctx_st> ctx_;
};

// The MD5 state over the elements in row-major order as little-endian bytes of the dtype (bool
// one byte 0/1, float16/bfloat16 their 2-byte bit patterns). Host tensors only.
Md5Stream md5Elements(const Tensor& t);
// The MD5 state over the rounded codes of the elements (12 bytes each, see docs/capture.md).
// digits in 1..17.
Md5Stream md5RoundedElements(const Tensor& t, int digits);

// In a rounded code, the exponent that marks NaN (m = 0) and +-Inf (m = +-1).
constexpr int32_t kRoundedSpecial = 0x7fffffff;

// 32 lowercase hex chars: MD5(elements + hashTrailer). Throws keel::Error for a tensor not on a
// host device.
std::string tensorMd5(const Tensor& t);

// MD5(rounded codes of the elements + hashTrailer), digits significant decimal digits in 1..17.
std::string tensorMd5Rounded(const Tensor& t, int digits);

// Running statistics over a tensor's elements fed in row-major order, in pieces of whole elements
// (the capture's hashing pass feeds them as it reads the bytes). shift is statsShift(t) of the
// tensor: every sum is of (v - shift). finish() gives exactly tensorStats(t).
class StatsStream {
 public:
  StatsStream(DType dtype, double shift);
  ~StatsStream();
  StatsStream(StatsStream&&) noexcept;
  StatsStream& operator=(StatsStream&&) noexcept;
  // n elements of the stream's dtype at p (raw little-endian bytes).
  void add(const uint8_t* p, int64_t n);
  storage::TensorStats finish() const;

  struct Acc;  // hash.cpp

 private:
  std::unique_ptr<Acc> acc_;
  DType dtype_;
  double shift_;
  int lane_ = 0;
};

// The first finite element of t in row-major order (0 when there is none): the shift of its
// statistics' sums, which keeps the one-pass variance accurate.
double statsShift(const Tensor& t);
// The same over n contiguous elements of dtype at p (raw little-endian bytes).
double statsShift(DType dtype, const uint8_t* p, int64_t n);

// Statistics of a floating-point tensor, in double: min, max, mean, std (population) and absMax
// over the finite elements (NaN when there are none); counts of NaN, ±Inf and zero (±0) elements.
storage::TensorStats tensorStats(const Tensor& t);

// The elements in contiguous row-major order (raw little-endian bytes of the dtype).
std::vector<uint8_t> contiguousBytes(const Tensor& t);

// Lowercase hex of a byte string (for digests).
std::string toHex(const unsigned char* data, size_t n);

}  // namespace keel::capture
