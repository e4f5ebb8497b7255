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
constexpr uint32_t kK[64] = {
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
    0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
    0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
    0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
    0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
    0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
    0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
    0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391};

uint32_t rotl32(uint32_t x, int c) {
  return (x << c) | (x >> (32 - c));
}

// One MD5 compression of a 64-byte block into s (RFC 1321, plain C): the lanes=1 midstate path
// and the finish of every midstate.
void md5Compress(uint32_t s[4], const uint8_t* block) {
  static constexpr int kShift[4][4] = {
      {7, 12, 17, 22}, {5, 9, 14, 20}, {4, 11, 16, 23}, {6, 10, 15, 21}};
  uint32_t w[16];
  for (int i = 0; i < 16; ++i)
    w[i] = uint32_t(block[4 * i]) | uint32_t(block[4 * i + 1]) << 8 |
           uint32_t(block[4 * i + 2]) << 16 | uint32_t(block[4 * i + 3]) << 24;
  uint32_t a = s[0], b = s[1], c = s[2], d = s[3];
  for (int i = 0; i < 64; ++i) {
    uint32_t f;
    int g;
    if (i < 16) {
      f = d ^ (b & (c ^ d));
      g = i;
    } else if (i < 32) {
      f = c ^ (d & (b ^ c));
      g = (5 * i + 1) & 15;
    } else if (i < 48) {
      f = b ^ c ^ d;
      g = (3 * i + 5) & 15;
    } else {
      f = c ^ (b | ~d);
      g = (7 * i) & 15;
    }
    const uint32_t t = d;
    d = c;
    c = b;
    b = b + rotl32(a + f + kK[i] + w[g], kShift[i / 16][i % 4]);
    a = t;
  }
  s[0] += a;
  s[1] += b;
  s[2] += c;
  s[3] += d;
}

// Runs `blocks` MD5 compressions on the kernel's lanes (the first 8G or 16G of a lane set).
// state: 4 rows of `stride` words (a of every lane of the set, then b, c, d); ptr[j]: lane j's
// first block, each next one step[j] bytes further (0: the same block again).
using Kernel = void (*)(uint32_t* state, size_t stride, const uint8_t* const* ptr,
                        const size_t* step, size_t blocks);

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KEEL_HAVE_MD5_LANES 1

// One MD5 step on every lane of each of G interleaved groups: a = b + rotl(a + f(b, c, d) + w[g] +
// K[i], s). The helpers are overloaded on the vector type, so the same 64 steps expand in the AVX2
// and the AVX-512 kernels. Each step is a chain of dependent instructions; G independent groups
// (more messages in flight) let the CPU overlap one group's chain with the other's.
#define KEEL_MD5_STEP(f, a, b, c, d, g, i, s) \
  for (int q = 0; q < G; ++q)                 \
  a[q] = add(b[q], rotl<s>(add(add(a[q], f(b[q], c[q], d[q])), add(w[q][g], splat(a[q], kK[i])))))
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

// G groups of 8 lanes: lane 8q + j is group q's lane j (state word r of lane l at state[r * L +
// l]).
template <int G>
__attribute__((target("avx2"))) void md5Avx2(uint32_t* state, size_t stride,
                                             const uint8_t* const* ptr, const size_t* step,
                                             size_t blocks) {
  constexpr int L = 8 * G;
  const uint8_t* p[L];
  for (int j = 0; j < L; ++j) p[j] = ptr[j];
  __m256i s[4][G];
  for (int r = 0; r < 4; ++r)
    for (int q = 0; q < G; ++q)
      s[r][q] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(state + r * stride + 8 * q));
  for (size_t blk = 0; blk < blocks; ++blk) {
    __m256i w[G][16];
    for (int q = 0; q < G; ++q) {
      for (int j = 0; j < 8; ++j) {
        const int l = 8 * q + j;
        w[q][j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[l]));
        w[q][8 + j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[l] + 32));
        prefetchAhead(p[l]);
        p[l] += step[l];
      }
      transpose8(w[q]);
      transpose8(w[q] + 8);
    }
    __m256i a[G], b[G], c[G], d[G];
    for (int q = 0; q < G; ++q) {
      a[q] = s[0][q];
      b[q] = s[1][q];
      c[q] = s[2][q];
      d[q] = s[3][q];
    }
    KEEL_MD5_64_STEPS;
    for (int q = 0; q < G; ++q) {
      s[0][q] = add(s[0][q], a[q]);
      s[1][q] = add(s[1][q], b[q]);
      s[2][q] = add(s[2][q], c[q]);
      s[3][q] = add(s[3][q], d[q]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int q = 0; q < G; ++q)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(state + r * stride + 8 * q), s[r][q]);
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

// G groups of 16 lanes, laid out as md5Avx2's.
template <int G>
__attribute__((target("avx512f"))) void md5Avx512(uint32_t* state, size_t stride,
                                                  const uint8_t* const* ptr, const size_t* step,
                                                  size_t blocks) {
  constexpr int L = 16 * G;
  const uint8_t* p[L];
  for (int j = 0; j < L; ++j) p[j] = ptr[j];
  __m512i s[4][G];
  for (int r = 0; r < 4; ++r)
    for (int q = 0; q < G; ++q) s[r][q] = _mm512_loadu_si512(state + r * stride + 16 * q);
  alignas(64) __m512i w[G][16];
  for (size_t blk = 0; blk < blocks; ++blk) {
    for (int q = 0; q < G; ++q) {
      __m512i r[16];
      for (int j = 0; j < 16; ++j) {
        const int l = 16 * q + j;
        r[j] = _mm512_loadu_si512(p[l]);
        prefetchAhead(p[l]);
        p[l] += step[l];
      }
      transpose16(r);
      for (int j = 0; j < 16; ++j) w[q][j] = r[j];
    }
    asm volatile("" : : "r"(&w[0][0]) : "memory");
    __m512i a[G], b[G], c[G], d[G];
    for (int q = 0; q < G; ++q) {
      a[q] = s[0][q];
      b[q] = s[1][q];
      c[q] = s[2][q];
      d[q] = s[3][q];
    }
    KEEL_MD5_64_STEPS;
    for (int q = 0; q < G; ++q) {
      s[0][q] = add(s[0][q], a[q]);
      s[1][q] = add(s[1][q], b[q]);
      s[2][q] = add(s[2][q], c[q]);
      s[3][q] = add(s[3][q], d[q]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int q = 0; q < G; ++q) _mm512_storeu_si512(state + r * stride + 16 * q, s[r][q]);
}

#undef KEEL_MD5_64_STEPS
#undef KEEL_MD5_4
#undef KEEL_MD5_STEP
#endif  // x86-64

// The vector ISA this CPU offers the kernels: 0 none, 1 AVX2, 2 AVX-512F (and AVX2).
int detectIsa() {
#ifdef KEEL_HAVE_MD5_LANES
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2")) return 2;
  if (__builtin_cpu_supports("avx2")) return 1;
#endif
  return 0;
}
int isa() {
  static const int level = detectIsa();
  return level;
}

// Note [MD5 lane widths]: 48 lanes where the CPU has AVX-512F (three interleaved groups of 16),
// 16 where it has AVX2 alone (two interleaved groups of 8), else 1. Each MD5 step is a chain of
// dependent instructions; more groups fill the gaps of one group's chain with another's. The
// kernels read the transposed message words from memory (each step's add takes them as an
// operand) instead of holding 16 per group in registers: that is what lets three groups run
// without spilling their state. Measured on AMD EPYC (Zen 5, 2 cores), 300 mixed tensors
// (bench md5ManyMixed): 16 lanes 7.1x OpenSSL, 32 lanes 10.6x, 48 lanes 11.2x, 64 lanes 10.8x.
// A lane set runs, each round, the narrowest of its kernels that covers its busy lanes (a short
// queue does not pay for 48). md5_multi_test and bench_hash cover every width.
int laneWidth() {
  if (isa() >= 2) return 48;
  return isa() > 0 ? 16 : 1;
}
[[maybe_unused]] const int kLaneWidthAtLoad = laneWidth();  // decided when the library loads

// One lane's read position in its message (see Note [Multi-buffer MD5]).
struct Lane {
  Md5Message msg;  // the message being hashed (its parts); parts empty and !busy: idle
  bool busy = false;
  size_t id = 0;             // the caller's id of the message
  size_t part = 0, off = 0;  // next byte: msg.parts[part][off]
  uint64_t total = 0;        // message length in bytes
  uint64_t left = 0;         // message bytes not yet fed
  int tailBlocks = 0;        // 0 while feeding data; 1 or 2 once the padded tail is built
  int tailNext = 0;          // the next tail block to feed
  bool direct = false;       // this round's blocks are read straight from a part
  alignas(64) uint8_t buf[128];
};

// Copies the next n bytes of lane's message to dst (n <= lane.left), showing them to sink.
void take(Lane& lane, uint8_t* dst, size_t n, Md5ByteSink* sink) {
  lane.left -= n;
  while (n > 0) {
    const std::span<const uint8_t> part = lane.msg.parts[lane.part];
    const size_t m = std::min(n, part.size() - lane.off);
    if (m > 0) {
      std::memcpy(dst, part.data() + lane.off, m);
      if (sink) sink->bytes(lane.id, part.data() + lane.off, m);
    }
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

// Blocks one kernel call runs at most: 32 KiB per lane. With a byte sink (statistics fused into
// the pass) the sink reads a call's bytes just before the kernel does; at 48 lanes that is 1.5 MiB,
// more than L2, yet 64, 128 and 256 blocks measured no faster (bench hashStepPass/2, 2026-12-06)
// and the larger calls pay the lane bookkeeping less often.
constexpr size_t kMaxBlocksPerCall = 512;

// Asks for the lane's next kMaxBlocksPerCall blocks from `from` on (at most to its part's end).
void prefetchSegment(const Lane& lane, const uint8_t* from) {
#ifdef KEEL_HAVE_MD5_LANES
  const std::span<const uint8_t> part = lane.msg.parts[lane.part];
  const uint8_t* end = part.data() + part.size();
  const uint8_t* stop = std::min(end, from + 64 * kMaxBlocksPerCall);
  for (const uint8_t* p = from; p < stop; p += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
#else
  (void)lane;
  (void)from;
#endif
}

// lanes = 1 in midstate mode: the scalar compression on lane 0's state (4 words: a, b, c, d).
void md5Scalar(uint32_t* state, size_t /*stride*/, const uint8_t* const* ptr, const size_t* step,
               size_t blocks) {
  const uint8_t* p = ptr[0];
  for (size_t b = 0; b < blocks; ++b, p += step[0]) md5Compress(state, p);
}

}  // namespace

// Note [Lane streams]: the lanes are a small machine that messages join and leave. add() puts a
// message on a free lane; step() runs one kernel call (at most kMaxBlocksPerCall blocks) over the
// busy lanes and reports the messages that finished. A batch call (md5Many, md5ManyMidstates)
// feeds its messages longest first; the capture's hashing thread feeds jobs as they arrive, so a
// lane freed by a short tensor takes the next queued one instead of idling until the batch ends.
class Md5LaneStream::Impl {
 public:
  virtual ~Impl() = default;
  virtual bool hasFreeLane() const = 0;
  virtual bool busy() const = 0;
  virtual void add(Md5Message msg, size_t id) = 0;
  virtual void step(std::vector<Md5LaneStream::Finished>& out) = 0;
};

namespace {

// A kernel and how many of a lane set's first lanes it runs.
struct KernelSpan {
  int lanes;
  Kernel kernel;
};

template <int L>
class LaneSet final : public Md5LaneStream::Impl {
 public:
  // midstates: results are midstates after each message's whole blocks; else full digests.
  // kernels: the kernels over the set's first lanes, narrowest first, the last covering all L.
  LaneSet(std::vector<KernelSpan> kernels, bool midstates, Md5ByteSink* sink)
      : kernels_(std::move(kernels)), midstates_(midstates), sink_(sink) {
    KEEL_CHECK(!kernels_.empty() && kernels_.back().lanes == L, "capture: bad MD5 lane kernels");
  }

  bool hasFreeLane() const override { return busyCount_ < L; }
  bool busy() const override { return busyCount_ > 0; }

  void add(Md5Message msg, size_t id) override {
    int j = 0;
    while (lanes_[j].busy) ++j;  // the caller checked hasFreeLane()
    Lane& lane = lanes_[j];
    lane.msg = std::move(msg);
    lane.busy = true;
    lane.id = id;
    lane.part = lane.off = 0;
    lane.total = lane.left = messageBytes(lane.msg);
    lane.tailBlocks = lane.tailNext = 0;
    for (int r = 0; r < 4; ++r) state_[r * L + j] = kInit[r];
    ++busyCount_;
  }

  void step(std::vector<Md5LaneStream::Finished>& out) override {
    static const uint8_t kZeroBlock[64] = {};
    // Each busy lane's next block(s); blocks = how many every busy lane can supply.
    size_t blocks = kMaxBlocksPerCall;
    bool any = false;
    for (int j = 0; j < L; ++j) {
      Lane& lane = lanes_[j];
      // A message shorter than a block: all of it is the midstate's tail.
      if (lane.busy && midstates_ && lane.left < 64) finishMidstate(j, out);
      lane.direct = false;
      step_[j] = 0;
      if (!lane.busy) {
        ptr_[j] = kZeroBlock;
        continue;
      }
      any = true;
      if (lane.tailBlocks == 0 && lane.left >= 64) {
        while (lane.off == lane.msg.parts[lane.part].size()) {  // past the end of a part
          ++lane.part;
          lane.off = 0;
        }
        const std::span<const uint8_t> part = lane.msg.parts[lane.part];
        const size_t avail = part.size() - lane.off;
        if (avail >= 64) {
          lane.direct = true;
          ptr_[j] = part.data() + lane.off;
          step_[j] = 64;
          blocks = std::min<size_t>(blocks, std::min<uint64_t>(avail, lane.left) / 64);
          continue;
        }
        take(lane, lane.buf, 64, sink_);  // a block across a part boundary
      } else if (lane.tailBlocks == 0) {
        // The padded tail: the last left (< 64) bytes, 0x80, zeros, the bit length.
        const size_t r = size_t(lane.left);
        lane.tailBlocks = r <= 55 ? 1 : 2;
        std::memset(lane.buf, 0, sizeof lane.buf);
        take(lane, lane.buf, r, sink_);
        lane.buf[r] = 0x80;
        const uint64_t bits = lane.total * 8;
        uint8_t* len = lane.buf + 64 * lane.tailBlocks - 8;
        for (int k = 0; k < 8; ++k) len[k] = uint8_t(bits >> (8 * k));
      }
      ptr_[j] = lane.tailBlocks == 0 ? lane.buf : lane.buf + 64 * lane.tailNext;
      blocks = 1;
    }
    if (!any) return;
    if (sink_) {
      // The sink reads this call's bytes first (and takes the cache misses); the next call's are
      // asked for now, so they arrive while this one is hashed.
      for (int j = 0; j < L; ++j)
        if (lanes_[j].busy && lanes_[j].direct) prefetchSegment(lanes_[j], ptr_[j] + 64 * blocks);
      for (int j = 0; j < L; ++j)
        if (lanes_[j].busy && lanes_[j].direct) sink_->bytes(lanes_[j].id, ptr_[j], 64 * blocks);
    }
    // The narrowest kernel that covers every busy lane (add() fills the lowest free lane, so a
    // short queue keeps the busy lanes low and the upper groups idle).
    int top = L;
    while (top > 0 && !lanes_[top - 1].busy) --top;
    const KernelSpan* k = &kernels_.front();
    while (k->lanes < top) ++k;
    k->kernel(state_, L, ptr_, step_, blocks);
    for (int j = 0; j < L; ++j) {
      Lane& lane = lanes_[j];
      if (!lane.busy) continue;
      if (lane.direct) {
        lane.off += 64 * blocks;
        lane.left -= 64 * blocks;
        if (midstates_ && lane.left < 64) finishMidstate(j, out);  // the lane is free at once
      } else if (midstates_ && lane.left < 64) {
        finishMidstate(j, out);
      } else if (lane.tailBlocks != 0 && ++lane.tailNext == lane.tailBlocks) {
        Md5LaneStream::Finished f;
        f.id = lane.id;
        for (int r = 0; r < 4; ++r)
          for (int k = 0; k < 4; ++k)
            f.digest[size_t(4 * r + k)] = uint8_t(state_[r * L + j] >> (8 * k));
        out.push_back(f);
        release(j);
      }
    }
  }

 private:
  void finishMidstate(int j, std::vector<Md5LaneStream::Finished>& out) {
    Lane& lane = lanes_[j];
    Md5LaneStream::Finished f;
    f.id = lane.id;
    for (int r = 0; r < 4; ++r) f.midstate.abcd[size_t(r)] = state_[r * L + j];
    f.midstate.bytes = lane.total;
    f.midstate.tailLen = uint8_t(lane.left);
    take(lane, f.midstate.tail.data(), size_t(lane.left), sink_);
    out.push_back(f);
    release(j);
  }
  void release(int j) {
    lanes_[j].busy = false;
    lanes_[j].msg.parts.clear();
    --busyCount_;
  }

  std::vector<KernelSpan> kernels_;
  bool midstates_;
  Md5ByteSink* sink_;
  alignas(64) uint32_t state_[4 * L];
  Lane lanes_[L];
  const uint8_t* ptr_[L];
  size_t step_[L];
  int busyCount_ = 0;
};

std::unique_ptr<Md5LaneStream::Impl> makeLanes(int lanes, bool midstates, Md5ByteSink* sink) {
  using std::make_unique;
#ifdef KEEL_HAVE_MD5_LANES
  const KernelSpan x16{16, md5Avx512<1>}, x32{32, md5Avx512<2>}, x48{48, md5Avx512<3>};
  if (lanes == 48) return make_unique<LaneSet<48>>(std::vector{x16, x32, x48}, midstates, sink);
  if (lanes == 32) return make_unique<LaneSet<32>>(std::vector{x16, x32}, midstates, sink);
  if (lanes == 16 && isa() >= 2) return make_unique<LaneSet<16>>(std::vector{x16}, midstates, sink);
  const KernelSpan y8{8, md5Avx2<1>}, y16{16, md5Avx2<2>};
  if (lanes == 16) return make_unique<LaneSet<16>>(std::vector{y8, y16}, midstates, sink);
  if (lanes == 8) return make_unique<LaneSet<8>>(std::vector{y8}, midstates, sink);
#endif
  return make_unique<LaneSet<1>>(std::vector{KernelSpan{1, md5Scalar}}, midstates, sink);
}

// A whole batch through a lane stream, longest message first (a long one must not start last
// and run alone); results by message index.
template <typename Store>
void runBatch(Md5LaneStream::Impl& lanes, std::span<const Md5Message> msgs, Store&& store) {
  std::vector<uint64_t> bytes(msgs.size());
  for (size_t i = 0; i < msgs.size(); ++i) bytes[i] = messageBytes(msgs[i]);
  std::vector<size_t> order(msgs.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return bytes[x] > bytes[y]; });
  size_t next = 0;
  std::vector<Md5LaneStream::Finished> done;
  for (;;) {
    while (next < order.size() && lanes.hasFreeLane()) {
      lanes.add(msgs[order[next]], order[next]);
      ++next;
    }
    if (!lanes.busy()) break;
    lanes.step(done);
    for (const auto& f : done) store(f);
    done.clear();
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
  if (lanes == 8 || lanes == 16) return isa() >= 1;  // AVX2 (16: AVX-512F where it is)
  if (lanes == 32 || lanes == 48) return isa() >= 2;
#endif
  return false;
}

void md5ManyWithLanes(std::span<const Md5Message> msgs, std::span<Md5Digest> out, int lanes) {
  KEEL_CHECK(out.size() == msgs.size(), "capture: md5Many got ", msgs.size(), " messages but ",
             out.size(), " digest slots");
  KEEL_CHECK(md5LanesSupported(lanes), "capture: md5Many cannot run ", lanes,
             " lanes on this CPU (lane width here: ", laneWidth(), ")");
  if (msgs.empty()) return;
  if (lanes == 1) return md5OpenSsl(msgs, out);
  auto set = makeLanes(lanes, false, nullptr);
  runBatch(*set, msgs, [&](const Md5LaneStream::Finished& f) { out[f.id] = f.digest; });
}

Md5Midstate md5Start() {
  Md5Midstate m;
  for (int r = 0; r < 4; ++r) m.abcd[size_t(r)] = kInit[r];
  return m;
}

Md5Digest Md5Midstate::finish(std::span<const uint8_t> more) const {
  uint32_t s[4] = {abcd[0], abcd[1], abcd[2], abcd[3]};
  uint8_t buf[128];
  size_t used = tailLen;
  std::memcpy(buf, tail.data(), used);
  for (size_t i = 0; i < more.size();) {
    const size_t k = std::min(more.size() - i, 64 - used);
    std::memcpy(buf + used, more.data() + i, k);
    used += k;
    i += k;
    if (used == 64) {
      md5Compress(s, buf);
      used = 0;
    }
  }
  const uint64_t bits = (bytes + more.size()) * 8;
  buf[used++] = 0x80;
  const size_t total = used <= 56 ? 64 : 128;
  std::memset(buf + used, 0, total - used);
  for (int k = 0; k < 8; ++k) buf[total - 8 + size_t(k)] = uint8_t(bits >> (8 * k));
  md5Compress(s, buf);
  if (total == 128) md5Compress(s, buf + 64);
  Md5Digest d;
  for (int r = 0; r < 4; ++r)
    for (int k = 0; k < 4; ++k) d[size_t(4 * r + k)] = uint8_t(s[r] >> (8 * k));
  return d;
}

void md5ManyMidstates(std::span<const Md5Message> msgs, std::span<Md5Midstate> out, int lanes,
                      Md5ByteSink* sink) {
  KEEL_CHECK(out.size() == msgs.size(), "capture: md5ManyMidstates got ", msgs.size(),
             " messages but ", out.size(), " midstate slots");
  Md5LaneStream stream(lanes, sink);
  runBatch(*stream.impl_, msgs, [&](const Md5LaneStream::Finished& f) { out[f.id] = f.midstate; });
}

Md5LaneStream::Md5LaneStream(int lanes, Md5ByteSink* sink) {
  if (lanes == 0) lanes = laneWidth();
  KEEL_CHECK(md5LanesSupported(lanes), "capture: md5Many cannot run ", lanes,
             " lanes on this CPU (lane width here: ", laneWidth(), ")");
  impl_ = makeLanes(lanes, true, sink);
}
Md5LaneStream::~Md5LaneStream() = default;
bool Md5LaneStream::hasFreeLane() const {
  return impl_->hasFreeLane();
}
bool Md5LaneStream::busy() const {
  return impl_->busy();
}
void Md5LaneStream::add(Md5Message msg, size_t id) {
  impl_->add(std::move(msg), id);
}
void Md5LaneStream::step(std::vector<Finished>& finished) {
  impl_->step(finished);
}

void md5Many(std::span<const Md5Message> msgs, std::span<Md5Digest> out) {
  md5ManyWithLanes(msgs, out, laneWidth());
}

}  // namespace keel::capture
