// The packed form of an op's tensor list (table op_tensors, since schema v3). The byte layout is
// specified beside the schema: see Note [Packed tensors] in schema.cpp. One BLOB per op instead of
// one SQL row per tensor: SQLite spends most of a write on per-row work, and an op has a handful of
// tensors. Integers are LEB128 varints (signed ones zigzag-encoded) and MD5s 16 raw bytes, which
// halves the bytes written.
//
// Strings (dtype, device) are referenced by strings(id): the writer interns them, the reader
// resolves them through its string cache (passed in as a callable).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "keel/storage/errors.h"
#include "keel/storage/records.h"

namespace keel::storage::detail {

// Entry flags. A checksum is stored as 16 raw bytes when it is 32 lowercase hex characters (every
// MD5 capture writes), otherwise as text (u8 length, bytes).
constexpr uint8_t kPackedHasMd5 = 1, kPackedHasRounded = 2, kPackedHasStats = 4, kPackedMd5Raw = 8,
                  kPackedRoundedRaw = 16;

inline bool isMd5Hex(std::string_view s) {
  if (s.size() != 32) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

class PackedWriter {
 public:
  void clear() { buf_.clear(); }
  const std::vector<uint8_t>& bytes() const { return buf_; }

  // Appends one entry; dtypeSid and deviceSid are the strings ids of t.dtype and t.device.
  void add(const TensorRecord& t, int64_t dtypeSid, int64_t deviceSid) {
    if (t.md5.size() > 255 || t.md5Rounded.size() > 255)
      throw StorageError("tensor checksum longer than 255 characters");
    if (t.index < 0) throw StorageError("negative tensor index " + std::to_string(t.index));
    uint8_t flags = 0;
    if (!t.md5.empty()) flags |= isMd5Hex(t.md5) ? kPackedMd5Raw : kPackedHasMd5;
    if (!t.md5Rounded.empty())
      flags |= isMd5Hex(t.md5Rounded) ? kPackedRoundedRaw : kPackedHasRounded;
    if (t.hasStats) flags |= kPackedHasStats;
    buf_.push_back(static_cast<uint8_t>(t.role));
    buf_.push_back(flags);
    uvar(uint64_t(t.index));
    uvar(uint64_t(dtypeSid));
    uvar(uint64_t(deviceSid));
    uvar(t.shape.size());
    uvar(t.strides.size());
    uvar(t.tensorId);
    uvar(t.version);
    uvar(t.bufferId);
    svar(t.offset);
    svar(t.bytes);
    for (int64_t d : t.shape) svar(d);
    for (int64_t d : t.strides) svar(d);
    checksum(t.md5, flags & kPackedMd5Raw, flags & kPackedHasMd5);
    checksum(t.md5Rounded, flags & kPackedRoundedRaw, flags & kPackedHasRounded);
    if (flags & kPackedHasStats) {
      for (double v : {t.stats.min, t.stats.max, t.stats.mean, t.stats.std, t.stats.absMax}) {
        uint8_t b[8];
        std::memcpy(b, &v, 8);  // little-endian host (checked in writer.cpp)
        buf_.insert(buf_.end(), b, b + 8);
      }
      for (int64_t v : {t.stats.nanCount, t.stats.infCount, t.stats.zeroCount}) svar(v);
    }
  }

 private:
  void uvar(uint64_t v) {
    while (v >= 0x80) {
      buf_.push_back(uint8_t(v | 0x80));
      v >>= 7;
    }
    buf_.push_back(uint8_t(v));
  }
  void svar(int64_t v) { uvar((uint64_t(v) << 1) ^ uint64_t(v >> 63)); }
  void checksum(const std::string& s, bool raw, bool text) {
    if (raw) {
      for (size_t i = 0; i < 32; i += 2) buf_.push_back(uint8_t(nib(s[i]) << 4 | nib(s[i + 1])));
    } else if (text) {
      buf_.push_back(static_cast<uint8_t>(s.size()));
      buf_.insert(buf_.end(), s.begin(), s.end());
    }
  }
  static int nib(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }
  std::vector<uint8_t> buf_;
};

// The largest tensor a recording describes: fewer than 2^40 elements and bytes (1 TiB, several
// times the memory of any device a run records). A packed entry claiming more is damage (Note
// [Damaged recordings], reader.cpp): views multiply these numbers.
constexpr int64_t kMaxTensorElements = int64_t(1) << 40;

// Decodes `count` entries; resolve(id) -> string. On a truncated or malformed blob, or an entry
// out of range, throws fail(problem) ("packed tensor data is truncated", ...).
template <class Resolve, class Fail>
void unpackTensors(const uint8_t* p, size_t n, int64_t count, Resolve&& resolve,
                   std::vector<TensorRecord>& out, Fail&& fail) {
  size_t at = 0;
  auto truncated = [&] { return fail("packed tensor data is truncated"); };
  auto byte = [&]() -> uint8_t {
    if (at >= n) throw truncated();
    return p[at++];
  };
  auto uvar = [&]() -> uint64_t {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b = byte();
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    throw fail("packed tensor data has a malformed number");
  };
  auto svar = [&]() -> int64_t {
    uint64_t u = uvar();
    return int64_t(u >> 1) ^ -int64_t(u & 1);
  };
  auto checksum = [&](std::string& s, bool raw, bool text) {
    static const char* kHex = "0123456789abcdef";
    if (raw) {
      if (n - at < 16) throw truncated();
      s.resize(32);
      for (int i = 0; i < 16; ++i) {
        s[2 * i] = kHex[p[at + i] >> 4];
        s[2 * i + 1] = kHex[p[at + i] & 15];
      }
      at += 16;
    } else if (text) {
      size_t len = byte();
      if (n - at < len) throw truncated();
      s.assign(reinterpret_cast<const char*>(p + at), len);
      at += len;
    }
  };
  if (count < 0 || count > int64_t(n)) throw fail("bad packed tensor count");
  out.reserve(out.size() + size_t(count));
  for (int64_t i = 0; i < count; ++i) {
    TensorRecord t;
    const uint8_t role = byte(), flags = byte();
    if (role > 1) throw fail("packed tensor has an invalid role");
    t.role = static_cast<Role>(role);
    const uint64_t index = uvar();
    const std::string name =
        std::string(role ? "output " : "input ") + std::to_string(int64_t(index));
    if (index > uint64_t(INT32_MAX))
      throw fail("packed tensor " + name + " has an index past 2^31 - 1");
    t.index = static_cast<int32_t>(index);
    t.dtype = resolve(int64_t(uvar()));
    t.device = resolve(int64_t(uvar()));
    const uint64_t rank = uvar(), srank = uvar();
    if (rank > n || srank > n) throw fail("packed tensor has a bad rank");
    t.tensorId = uvar();
    t.version = uvar();
    t.bufferId = uvar();
    t.offset = svar();
    t.bytes = svar();
    t.shape.resize(size_t(rank));
    for (auto& d : t.shape) d = svar();
    t.strides.resize(size_t(srank));
    for (auto& d : t.strides) d = svar();
    // Sizes views multiply: no negative size, fewer than 2^40 elements and bytes.
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) throw fail("packed tensor " + name + " has a negative size " + std::to_string(d));
      numel = d == 0 || numel == 0                   ? 0
              : numel > (kMaxTensorElements - 1) / d ? kMaxTensorElements
                                                     : numel * d;
    }
    if (numel >= kMaxTensorElements)
      throw fail("packed tensor " + name + " claims 2^40 or more elements");
    if (t.bytes < 0 || t.bytes >= kMaxTensorElements)
      throw fail("packed tensor " + name + " claims " + std::to_string(t.bytes) +
                 " bytes (out of range 0 .. 2^40 - 1)");
    checksum(t.md5, flags & kPackedMd5Raw, flags & kPackedHasMd5);
    checksum(t.md5Rounded, flags & kPackedRoundedRaw, flags & kPackedHasRounded);
    if (flags & kPackedHasStats) {
      t.hasStats = true;
      if (n - at < 40) throw truncated();
      for (double* v : {&t.stats.min, &t.stats.max, &t.stats.mean, &t.stats.std, &t.stats.absMax}) {
        std::memcpy(v, p + at, 8);
        at += 8;
      }
      t.stats.nanCount = svar();
      t.stats.infCount = svar();
      t.stats.zeroCount = svar();
    }
    out.push_back(std::move(t));
  }
  if (at != n) throw fail("packed tensor data has trailing bytes");
}

}  // namespace keel::storage::detail
