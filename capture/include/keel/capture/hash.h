// Tensor checksums and statistics, exactly as docs/capture.md specifies them: MD5 (OpenSSL EVP)
// over a header (dtype name, NUL, rank, dims) and the elements in contiguous row-major order, so a
// view and a copy with the same values hash equal. Host tensors only; read on the calling thread.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "keel/storage/records.h"
#include "keel/tensor.h"

namespace keel::capture {

// The header bytes every tensor hash starts with: dtypeName(dtype), one NUL byte, the rank as a
// little-endian int64, then each dimension as a little-endian int64.
std::string hashHeader(DType dtype, const Shape& shape);

// 32 lowercase hex chars: MD5(hashHeader + elements in row-major order as little-endian bytes of
// the dtype; bool is one byte 0/1, float16/bfloat16 their 2-byte bit patterns). Throws keel::Error
// for a tensor not on a host device.
std::string tensorMd5(const Tensor& t);

// MD5(hashHeader + for each element in row-major order: the value converted to double, printed
// with "%.<digits>g" — "nan" for NaN, "inf"/"-inf" for infinities, "0" for -0 — and a '\n').
// digits in 1..17.
std::string tensorMd5Rounded(const Tensor& t, int digits);

// Statistics of a floating-point tensor, in double: min, max, mean, std (population) and absMax
// over the finite elements (NaN when there are none); counts of NaN, ±Inf and zero (±0) elements.
storage::TensorStats tensorStats(const Tensor& t);

// The elements in contiguous row-major order (raw little-endian bytes of the dtype).
std::vector<uint8_t> contiguousBytes(const Tensor& t);

// Lowercase hex of a byte string (for digests).
std::string toHex(const unsigned char* data, size_t n);

}  // namespace keel::capture
