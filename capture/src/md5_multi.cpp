// Multi-buffer MD5 (see keel/capture/md5_multi.h), written here: no Debian library hashes several
// MD5 messages in parallel SIMD lanes. Lane j of a 32-bit vector carries one message's state; a
// lane that finishes takes the next message. Digests equal OpenSSL's MD5, the fallback for lanes=1.
#include "keel/capture/md5_multi.h"

#include <openssl/evp.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>

#include "keel/error.h"

namespace keel::capture {

// Note [Multi-buffer MD5]: MD5 is one long dependency chain per message, so a single stream cannot
// use SIMD; independent messages can. md5Many keeps L messages in flight, message j's state in
// lane j of four L x 32-bit vectors. Each round every lane supplies one 64-byte block: straight
// from its current part when 64 bytes are contiguous there, otherwise copied into the lane's own
// buffer (a block that straddles parts, or the padded tail: 0x80, zeros, the bit length as a
// little-endian uint64, one or two blocks). A kernel call runs as many blocks as every busy lane
// can read contiguously, transposing the L blocks so that vector t holds word t of each lane. A
// finished lane's state is the digest; the lane is reset to MD5's initial state and takes the next
// message, longest first so that a long message does not start last and run alone. Idle lanes
// (fewer messages than lanes, or the end of a batch) hash a zero block whose result is dropped.

namespace {

constexpr uint32_t kInit[4] = {0x67452301u, 0xefcdab89u, 0x98badcfeu, 0x10325476u};

// RFC 1321's sine table: kK[i] = floor(2^32 * |sin(i + 1)|).
[[maybe_unused]] constexpr uint32_t kK[64] = {
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
    0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
    0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
    0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
    0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
    0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
    0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
    0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391};

// Runs `blocks` MD5 compressions on every lane. state: 4 x L words (a of every lane, then b, c, d);
// ptr[j]: lane j's first block, each next one step[j] bytes further (0: the same block again).
using Kernel = void (*)(uint32_t* state, const uint8_t* const* ptr, const size_t* step,
                        size_t blocks);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KEEL_HAVE_MD5_LANES 1

// One MD5 step on every lane: a = b + rotl(a + f(b, c, d) + w[g] + K[i], s). The helpers are
// overloaded on the vector type, so the same 64 steps expand in the AVX2 and the AVX-512 kernel.
#define KEEL_MD5_STEP(f, a, b, c, d, g, i, s) \
  a = add(b, rotl<s>(add(add(a, f(b, c, d)), add(w[g], splat(a, kK[i])))))
#define KEEL_MD5_4(f, i, g0, g1, g2, g3, s0, s1, s2, s3) \
  KEEL_MD5_STEP(f, a, b, c, d, g0, i, s0);               \
  KEEL_MD5_STEP(f, d, a, b, c, g1, i + 1, s1);           \
  KEEL_MD5_STEP(f, c, d, a, b, g2, i + 2, s2);           \
  KEEL_MD5_STEP(f, b, c, d, a, g3, i + 3, s3)
#define KEEL_MD5_64_STEPS                            \
  KEEL_MD5_4(fF, 0, 0, 1, 2, 3, 7, 12, 17, 22);      \
  KEEL_MD5_4(fF, 4, 4, 5, 6, 7, 7, 12, 17, 22);      \
  KEEL_MD5_4(fF, 8, 8, 9, 10, 11, 7, 12, 17, 22);    \
  KEEL_MD5_4(fF, 12, 12, 13, 14, 15, 7, 12, 17, 22); \
  KEEL_MD5_4(fG, 16, 1, 6, 11, 0, 5, 9, 14, 20);     \
  KEEL_MD5_4(fG, 20, 5, 10, 15, 4, 5, 9, 14, 20);    \
  KEEL_MD5_4(fG, 24, 9, 14, 3, 8, 5, 9, 14, 20);     \
  KEEL_MD5_4(fG, 28, 13, 2, 7, 12, 5, 9, 14, 20);    \
  KEEL_MD5_4(fH, 32, 5, 8, 11, 14, 4, 11, 16, 23);   \
  KEEL_MD5_4(fH, 36, 1, 4, 7, 10, 4, 11, 16, 23);    \
  KEEL_MD5_4(fH, 40, 13, 0, 3, 6, 4, 11, 16, 23);    \
  KEEL_MD5_4(fH, 44, 9, 12, 15, 2, 4, 11, 16, 23);   \
  KEEL_MD5_4(fI, 48, 0, 7, 14, 5, 6, 10, 15, 21);    \
  KEEL_MD5_4(fI, 52, 12, 3, 10, 1, 6, 10, 15, 21);   \
  KEEL_MD5_4(fI, 56, 8, 15, 6, 13, 6, 10, 15, 21);   \
  KEEL_MD5_4(fI, 60, 4, 11, 2, 9, 6, 10, 15, 21)

// How far ahead of each lane's block the kernels prefetch: every lane is its own stream, more
// streams than the hardware prefetcher follows well (a prefetch past a buffer's end is harmless).
// The address is formed as an integer: it may lie past the end of the lane's buffer.
constexpr uintptr_t kPrefetchBytes = 512;
inline void prefetchAhead(const uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + kPrefetchBytes),
               _MM_HINT_T0);
}

// ---- AVX2: 8 lanes ----
#define KEEL_AVX2_INLINE __attribute__((target("avx2"), always_inline)) inline

KEEL_AVX2_INLINE __m256i add(__m256i x, __m256i y) {
  return _mm256_add_epi32(x, y);
}
KEEL_AVX2_INLINE __m256i splat(__m256i, uint32_t k) {
  return _mm256_set1_epi32(int(k));
}
template <int S>
KEEL_AVX2_INLINE __m256i rotl(__m256i x) {
  return _mm256_or_si256(_mm256_slli_epi32(x, S), _mm256_srli_epi32(x, 32 - S));
}
KEEL_AVX2_INLINE __m256i fF(__m256i b, __m256i c, __m256i d) {
  return _mm256_xor_si256(d, _mm256_and_si256(b, _mm256_xor_si256(c, d)));
}
KEEL_AVX2_INLINE __m256i fG(__m256i b, __m256i c, __m256i d) {
  return _mm256_xor_si256(c, _mm256_and_si256(d, _mm256_xor_si256(b, c)));
}
KEEL_AVX2_INLINE __m256i fH(__m256i b, __m256i c, __m256i d) {
  return _mm256_xor_si256(_mm256_xor_si256(b, c), d);
}
KEEL_AVX2_INLINE __m256i fI(__m256i b, __m256i c, __m256i d) {
  const __m256i notD = _mm256_xor_si256(d, _mm256_set1_epi32(-1));
  return _mm256_xor_si256(c, _mm256_or_si256(b, notD));
}

// r[i] word j -> r[j] word i, for an 8 x 8 block of 32-bit words.
KEEL_AVX2_INLINE void transpose8(__m256i r[8]) {
  __m256i t[8], u[8];
  for (int k = 0; k < 4; ++k) {  // per 128-bit half: pairs of rows interleaved
    t[2 * k] = _mm256_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm256_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
  }
  for (int g = 0; g < 2; ++g) {  // u[4g + e], half h: word 4h + e of rows 4g..4g+3
    u[4 * g + 0] = _mm256_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm256_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm256_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm256_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int e = 0; e < 4; ++e) {
    r[e] = _mm256_permute2x128_si256(u[e], u[4 + e], 0x20);
    r[4 + e] = _mm256_permute2x128_si256(u[e], u[4 + e], 0x31);
  }
}

__attribute__((target("avx2"))) void md5Avx2(uint32_t* state, const uint8_t* const* ptr,
                                             const size_t* step, size_t blocks) {
  constexpr int L = 8;
  const uint8_t* p[L];
  for (int j = 0; j < L; ++j) p[j] = ptr[j];
  __m256i s[4];
  for (int r = 0; r < 4; ++r)
    s[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(state + r * L));
  for (size_t blk = 0; blk < blocks; ++blk) {
    __m256i w[16];
    for (int j = 0; j < L; ++j) {
      w[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[j]));
      w[8 + j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[j] + 32));
      prefetchAhead(p[j]);
      p[j] += step[j];
    }
    transpose8(w);
    transpose8(w + 8);
    __m256i a = s[0], b = s[1], c = s[2], d = s[3];
    KEEL_MD5_64_STEPS;
    s[0] = add(s[0], a);
    s[1] = add(s[1], b);
    s[2] = add(s[2], c);
    s[3] = add(s[3], d);
  }
  for (int r = 0; r < 4; ++r) _mm256_storeu_si256(reinterpret_cast<__m256i*>(state + r * L), s[r]);
}

// ---- AVX-512F: 16 lanes ----
// GCC 12's unmasked AVX-512 intrinsics pass _mm512_undefined_epi32() as the merge source, which
// -Wmaybe-uninitialized reports once inlined (GCC bug 105593); the kernel uses the masked forms
// with every lane selected (the same instructions) and a defined merge source.
#define KEEL_AVX512_INLINE __attribute__((target("avx512f"), always_inline)) inline
constexpr __mmask16 kAll16 = 0xffff;
constexpr __mmask8 kAll8 = 0xff;

KEEL_AVX512_INLINE __m512i add(__m512i x, __m512i y) {
  return _mm512_add_epi32(x, y);
}
KEEL_AVX512_INLINE __m512i splat(__m512i, uint32_t k) {
  return _mm512_set1_epi32(int(k));
}
template <int S>
KEEL_AVX512_INLINE __m512i rotl(__m512i x) {
  return _mm512_mask_rol_epi32(x, kAll16, x, S);
}
// Ternary-logic truth tables over (b, c, d) = (0xf0, 0xcc, 0xaa).
KEEL_AVX512_INLINE __m512i fF(__m512i b, __m512i c, __m512i d) {
  return _mm512_ternarylogic_epi32(b, c, d, 0xca);  // (b & c) | (~b & d)
}
KEEL_AVX512_INLINE __m512i fG(__m512i b, __m512i c, __m512i d) {
  return _mm512_ternarylogic_epi32(b, c, d, 0xe4);  // (b & d) | (c & ~d)
}
KEEL_AVX512_INLINE __m512i fH(__m512i b, __m512i c, __m512i d) {
  return _mm512_ternarylogic_epi32(b, c, d, 0x96);  // b ^ c ^ d
}
KEEL_AVX512_INLINE __m512i fI(__m512i b, __m512i c, __m512i d) {
  return _mm512_ternarylogic_epi32(b, c, d, 0x39);  // c ^ (b | ~d)
}

// r[i] word j -> r[j] word i, for a 16 x 16 block of 32-bit words.
KEEL_AVX512_INLINE void transpose16(__m512i r[16]) {
  const __m512i z = _mm512_setzero_si512();  // the merge source no lane takes
  __m512i t[16], u[16];
  for (int k = 0; k < 8; ++k) {  // per 128-bit quarter: pairs of rows interleaved
    t[2 * k] = _mm512_mask_unpacklo_epi32(z, kAll16, r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_mask_unpackhi_epi32(z, kAll16, r[2 * k], r[2 * k + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // u[4g + e], quarter q: word 4q + e of rows 4g..4g+3
    u[4 * g + 0] = _mm512_mask_unpacklo_epi64(z, kAll8, t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_mask_unpackhi_epi64(z, kAll8, t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_mask_unpacklo_epi64(z, kAll8, t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_mask_unpackhi_epi64(z, kAll8, t[4 * g + 1], t[4 * g + 3]);
  }
  for (int e = 0; e < 4; ++e) {  // a 4 x 4 transpose of quarters across u[e], u[4+e], ...
    const __m512i v0 = _mm512_mask_shuffle_i32x4(z, kAll16, u[e], u[4 + e], 0x44);
    const __m512i v1 = _mm512_mask_shuffle_i32x4(z, kAll16, u[e], u[4 + e], 0xee);
    const __m512i v2 = _mm512_mask_shuffle_i32x4(z, kAll16, u[8 + e], u[12 + e], 0x44);
    const __m512i v3 = _mm512_mask_shuffle_i32x4(z, kAll16, u[8 + e], u[12 + e], 0xee);
    r[e] = _mm512_mask_shuffle_i32x4(z, kAll16, v0, v2, 0x88);
    r[4 + e] = _mm512_mask_shuffle_i32x4(z, kAll16, v0, v2, 0xdd);
    r[8 + e] = _mm512_mask_shuffle_i32x4(z, kAll16, v1, v3, 0x88);
    r[12 + e] = _mm512_mask_shuffle_i32x4(z, kAll16, v1, v3, 0xdd);
  }
}

__attribute__((target("avx512f"))) void md5Avx512(uint32_t* state, const uint8_t* const* ptr,
                                                  const size_t* step, size_t blocks) {
  constexpr int L = 16;
  const uint8_t* p[L];
  for (int j = 0; j < L; ++j) p[j] = ptr[j];
  __m512i s[4];
  for (int r = 0; r < 4; ++r) s[r] = _mm512_loadu_si512(state + r * L);
  for (size_t blk = 0; blk < blocks; ++blk) {
    __m512i w[16];
    for (int j = 0; j < L; ++j) {
      w[j] = _mm512_loadu_si512(p[j]);
      prefetchAhead(p[j]);
      p[j] += step[j];
    }
    transpose16(w);
    __m512i a = s[0], b = s[1], c = s[2], d = s[3];
    KEEL_MD5_64_STEPS;
    s[0] = add(s[0], a);
    s[1] = add(s[1], b);
    s[2] = add(s[2], c);
    s[3] = add(s[3], d);
  }
  for (int r = 0; r < 4; ++r) _mm512_storeu_si512(state + r * L, s[r]);
}

#undef KEEL_MD5_64_STEPS
#undef KEEL_MD5_4
#undef KEEL_MD5_STEP
#endif  // x86-64

int detectLaneWidth() {
#ifdef KEEL_HAVE_MD5_LANES
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return 16;
  if (__builtin_cpu_supports("avx2")) return 8;
#endif
  return 1;
}

int laneWidth() {
  static const int width = detectLaneWidth();
  return width;
}
[[maybe_unused]] const int kLaneWidthAtLoad = laneWidth();  // decided when the library loads

// One lane's read position in its message (see Note [Multi-buffer MD5]).
struct Lane {
  const Md5Message* msg = nullptr;  // null: idle
  size_t index = 0;                 // the message's index in the batch
  size_t part = 0, off = 0;         // next byte: msg->parts[part][off]
  uint64_t left = 0;                // message bytes not yet fed
  uint64_t bits = 0;                // message length in bits, mod 2^64
  int tailBlocks = 0;               // 0 while feeding data; 1 or 2 once the padded tail is built
  int tailNext = 0;                 // the next tail block to feed
  bool direct = false;              // this round's blocks are read straight from a part
  alignas(64) uint8_t buf[128];
};

// Copies the next n bytes of lane's message to dst (n <= lane.left).
void take(Lane& lane, uint8_t* dst, size_t n) {
  lane.left -= n;
  while (n > 0) {
    const std::span<const uint8_t> part = lane.msg->parts[lane.part];
    const size_t m = std::min(n, part.size() - lane.off);
    if (m > 0) std::memcpy(dst, part.data() + lane.off, m);
    dst += m;
    n -= m;
    lane.off += m;
    if (lane.off == part.size()) {
      ++lane.part;
      lane.off = 0;
    }
  }
}

uint64_t messageBytes(const Md5Message& m) {
  uint64_t n = 0;
  for (const auto& p : m.parts) n += p.size();
  return n;
}

template <int L>
void md5Lanes(std::span<const Md5Message> msgs, std::span<Md5Digest> out, Kernel kernel) {
  static const uint8_t kZeroBlock[64] = {};
  std::vector<uint64_t> bytes(msgs.size());
  for (size_t i = 0; i < msgs.size(); ++i) bytes[i] = messageBytes(msgs[i]);
  std::vector<size_t> order(msgs.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return bytes[x] > bytes[y]; });
  size_t next = 0;

  alignas(64) uint32_t state[4 * L];
  Lane lanes[L];
  const uint8_t* ptr[L];
  size_t step[L];
  auto start = [&](int j) {
    Lane& lane = lanes[j];
    lane.msg = nullptr;
    if (next == order.size()) return;
    lane.index = order[next++];
    lane.msg = &msgs[lane.index];
    lane.part = lane.off = 0;
    lane.left = bytes[lane.index];
    lane.bits = lane.left * 8;
    lane.tailBlocks = lane.tailNext = 0;
    for (int r = 0; r < 4; ++r) state[r * L + j] = kInit[r];
  };
  for (int j = 0; j < L; ++j) start(j);

  for (;;) {
    // Each busy lane's next block(s); blocks = how many every busy lane can supply.
    size_t blocks = std::numeric_limits<size_t>::max();
    bool busy = false;
    for (int j = 0; j < L; ++j) {
      Lane& lane = lanes[j];
      lane.direct = false;
      step[j] = 0;
      if (lane.msg == nullptr) {
        ptr[j] = kZeroBlock;
        continue;
      }
      busy = true;
      if (lane.tailBlocks == 0 && lane.left >= 64) {
        while (lane.off == lane.msg->parts[lane.part].size()) {  // past the end of a part
          ++lane.part;
          lane.off = 0;
        }
        const std::span<const uint8_t> part = lane.msg->parts[lane.part];
        const size_t avail = part.size() - lane.off;
        if (avail >= 64) {
          lane.direct = true;
          ptr[j] = part.data() + lane.off;
          step[j] = 64;
          blocks = std::min(blocks, avail / 64);
          continue;
        }
        take(lane, lane.buf, 64);  // a block across a part boundary
      } else if (lane.tailBlocks == 0) {
        // The padded tail: the last left (< 64) bytes, 0x80, zeros, the bit length.
        const size_t r = size_t(lane.left);
        lane.tailBlocks = r <= 55 ? 1 : 2;
        std::memset(lane.buf, 0, sizeof lane.buf);
        take(lane, lane.buf, r);
        lane.buf[r] = 0x80;
        uint8_t* len = lane.buf + 64 * lane.tailBlocks - 8;
        for (int k = 0; k < 8; ++k) len[k] = uint8_t(lane.bits >> (8 * k));
      }
      ptr[j] = lane.tailBlocks == 0 ? lane.buf : lane.buf + 64 * lane.tailNext;
      blocks = 1;
    }
    if (!busy) break;
    kernel(state, ptr, step, blocks);
    for (int j = 0; j < L; ++j) {
      Lane& lane = lanes[j];
      if (lane.msg == nullptr) continue;
      if (lane.direct) {
        lane.off += 64 * blocks;
        lane.left -= 64 * blocks;
      } else if (lane.tailBlocks != 0 && ++lane.tailNext == lane.tailBlocks) {
        Md5Digest& d = out[lane.index];
        for (int r = 0; r < 4; ++r)
          for (int k = 0; k < 4; ++k) d[size_t(4 * r + k)] = uint8_t(state[r * L + j] >> (8 * k));
        start(j);
      }
    }
  }
}

struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

// lanes = 1: OpenSSL's EVP MD5, one message after another.
void md5OpenSsl(std::span<const Md5Message> msgs, std::span<Md5Digest> out) {
  static EVP_MD* md = EVP_MD_fetch(nullptr, "MD5", nullptr);
  KEEL_CHECK(md != nullptr, "capture: OpenSSL has no MD5 implementation");
  std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> ctx(EVP_MD_CTX_new());
  KEEL_CHECK(ctx != nullptr, "capture: EVP_MD_CTX_new failed");
  for (size_t i = 0; i < msgs.size(); ++i) {
    KEEL_CHECK(EVP_DigestInit_ex(ctx.get(), md, nullptr) == 1, "capture: MD5 init failed");
    for (const auto& p : msgs[i].parts)
      if (!p.empty())
        KEEL_CHECK(EVP_DigestUpdate(ctx.get(), p.data(), p.size()) == 1,
                   "capture: MD5 update failed");
    unsigned int len = 0;
    KEEL_CHECK(EVP_DigestFinal_ex(ctx.get(), out[i].data(), &len) == 1 && len == 16,
               "capture: MD5 final failed");
  }
}

}  // namespace

int md5LaneWidth() {
  return laneWidth();
}

bool md5LanesSupported(int lanes) {
  if (lanes == 1) return true;
#ifdef KEEL_HAVE_MD5_LANES
  if (lanes == 8) return laneWidth() >= 8;
  if (lanes == 16) return laneWidth() >= 16;
#endif
  return false;
}

void md5ManyWithLanes(std::span<const Md5Message> msgs, std::span<Md5Digest> out, int lanes) {
  KEEL_CHECK(out.size() == msgs.size(), "capture: md5Many got ", msgs.size(), " messages but ",
             out.size(), " digest slots");
  KEEL_CHECK(md5LanesSupported(lanes), "capture: md5Many cannot run ", lanes,
             " lanes on this CPU (lane width here: ", laneWidth(), ")");
  if (msgs.empty()) return;
#ifdef KEEL_HAVE_MD5_LANES
  if (lanes == 16) return md5Lanes<16>(msgs, out, md5Avx512);
  if (lanes == 8) return md5Lanes<8>(msgs, out, md5Avx2);
#endif
  md5OpenSsl(msgs, out);
}

void md5Many(std::span<const Md5Message> msgs, std::span<Md5Digest> out) {
  md5ManyWithLanes(msgs, out, laneWidth());
}

}  // namespace keel::capture
