// The tile plan of the cuda FlashMask kernels (flashmask.cu, Note [cuda FlashMask]): tile sizes
// from the head dim and the compute type, grid dims and shared-memory bytes, and the tile
// classification the kernels run on the device. Plain arithmetic, no CUDA headers, so host tests
// check it without a GPU. Invariant: every plan for a head dim <= kMaxHeadDim fits kMaxSmem.
#pragma once
#include <cstdint>

#include "flashmask/tile_class.h"
#include "keel/flashmask.h"

#ifdef __CUDACC__
#define KEEL_FM_HD __host__ __device__
#else
#define KEEL_FM_HD
#endif

namespace keel::cuda::fmplan {

// Threads of every FlashMask block: a 16 x 16 grid (ty = tid / 16 picks rows, tx = tid % 16
// columns), so the 16 threads sharing a tile row are one half-warp.
inline constexpr int kSide = 16;
inline constexpr int kThreads = kSide * kSide;
inline constexpr int64_t kMaxHeadDim = 256;
inline constexpr int64_t kMaxSmem = 232448;  // sm_90 opt-in dynamic shared memory per block

// The compiled head-dim bucket for d (32, 64, 128 or 256), 0 when d is out of [1, kMaxHeadDim].
constexpr int headDimBucket(int64_t d) {
  return d < 1 ? 0 : d <= 32 ? 32 : d <= 64 ? 64 : d <= 128 ? 128 : d <= kMaxHeadDim ? 256 : 0;
}

// Rows (rm) and columns (rn) of the score tile per thread: a tile is 16*rm query rows by 16*rn
// key columns. computeBytes is 4 (float32, float16, bfloat16) or 8 (float64).
struct TileConfig {
  int rm, rn;
};
constexpr TileConfig forwardConfig(int computeBytes, int dmax) {
  if (computeBytes == 8) return {2, 2};
  return dmax >= 256 ? TileConfig{4, 2} : TileConfig{4, 4};
}
constexpr TileConfig backwardConfig(int computeBytes, int dmax) {
  if (computeBytes == 8) return dmax >= 256 ? TileConfig{1, 2} : TileConfig{2, 2};
  return dmax >= 256 ? TileConfig{4, 2} : TileConfig{4, 4};
}

// Row stride (elements) of a [rows][d] shared-memory tile: odd, so the 16 threads of a half-warp
// reading 16 different rows at one column hit 16 different banks.
constexpr int64_t sharedLd(int64_t d) {
  return d | 1;
}

// A launch grid's blocks along x, y and z.
struct Grid {
  unsigned x = 0, y = 0, z = 0;
};

// The tiles of a sq x sk score matrix under a tile config: their shape and how many cover it.
struct TileGrid {
  int64_t br = 0, bc = 0;    // query tile rows, key tile columns
  int64_t nqt = 0, nkt = 0;  // query tiles, key tiles
  constexpr void cover(TileConfig t, int64_t sq, int64_t sk) {
    br = kSide * t.rm;
    bc = kSide * t.rn;
    nqt = (sq + br - 1) / br;
    nkt = (sk + bc - 1) / bc;
  }
};

struct ForwardPlan : TileGrid {
  Grid grid;  // (query tile, head, batch)
  unsigned threads = kThreads;
  int64_t smemBytes = 0;  // Q tile, K-or-V tile, P tile
};

struct BackwardPlan : TileGrid {
  Grid dkvGrid;  // (key tile, kv head, batch)
  Grid dqGrid;   // (query tile, head, batch)
  unsigned threads = kThreads;
  int64_t dkvSmemBytes = 0;  // K, V, Q, dO tiles, P^T and dS^T
  int64_t dqSmemBytes = 0;   // Q, dO, K, V tiles, dS
};

// q [b, sq, h, d], k and v [b, sk, hk, d]; d must be in [1, kMaxHeadDim].
constexpr ForwardPlan forwardPlan(int64_t b, int64_t sq, int64_t sk, int64_t h, int64_t d,
                                  int computeBytes) {
  const TileConfig t = forwardConfig(computeBytes, headDimBucket(d));
  ForwardPlan p;
  p.cover(t, sq, sk);
  p.grid = {unsigned(p.nqt), unsigned(h), unsigned(b)};
  const int64_t ld = sharedLd(d);
  p.smemBytes = (p.br * ld + p.bc * ld + p.br * (p.bc + 1)) * computeBytes;
  return p;
}

constexpr BackwardPlan backwardPlan(int64_t b, int64_t sq, int64_t sk, int64_t h, int64_t hk,
                                    int64_t d, int computeBytes) {
  const TileConfig t = backwardConfig(computeBytes, headDimBucket(d));
  BackwardPlan p;
  p.cover(t, sq, sk);
  p.dkvGrid = {unsigned(p.nkt), unsigned(hk), unsigned(b)};
  p.dqGrid = {unsigned(p.nqt), unsigned(h), unsigned(b)};
  const int64_t ld = sharedLd(d);
  p.dkvSmemBytes = (2 * p.bc * ld + 2 * p.br * ld + 2 * p.bc * (p.br + 1)) * computeBytes;
  p.dqSmemBytes = (2 * p.br * ld + 2 * p.bc * ld + p.br * (p.bc + 1)) * computeBytes;
  return p;
}

// The tile shape (query rows x key columns) the cuda kernels classify with, for a head dim and
// dtype: the forward's, or the backward's (both backward kernels share one).
inline keel::flashmask::TileShape tileShape(int64_t d, DType dtype, bool backward = false) {
  const int cb = dtype == DType::Float64 ? 8 : 4;
  const TileConfig t =
      backward ? backwardConfig(cb, headDimBucket(d)) : forwardConfig(cb, headDimBucket(d));
  return {int64_t(kSide) * t.rm, int64_t(kSide) * t.rn};
}

// (query tile x key tile) pairs the cuda kernel skips, partially masks or runs unmasked, summed
// over batch and mask heads (every query head of a kv head sees its mask head's classes), for a
// host int32 index tensor [B, Hm, Sk, C] (undefined: no index tensor) and q's head dim and dtype.
// The classification is keel::flashmask::countTiles's, the one the device runs (classifyTile).
inline keel::flashmask::TileCounts countTiles(const Tensor& startendRowIndices, bool causal,
                                              int64_t sq, int64_t sk, int64_t windowSize, int64_t d,
                                              DType dtype, bool backward = false) {
  return keel::flashmask::countTiles(startendRowIndices, causal, sq, sk, windowSize,
                                     tileShape(d, dtype, backward));
}

// The column bounds of one key tile and the class of a tile pair: the host's rule itself
// (flashmask/tile_class.h), as an int for the kernels (kSkip, kPartial, kUnmasked).
using TileMinMax = keel::detail::flashmask::TileBounds;
enum TileKind : int { kSkip = 0, kPartial = 1, kUnmasked = 2 };
static_assert(int(keel::detail::flashmask::TileClass::Skip) == kSkip &&
              int(keel::detail::flashmask::TileClass::Partial) == kPartial &&
              int(keel::detail::flashmask::TileClass::Unmasked) == kUnmasked);

KEEL_FM_HD inline int classifyTile(const TileMinMax& t, bool causal, int64_t window, int64_t diag,
                                   int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  return int(keel::detail::flashmask::classifyTile(t, causal, window, diag, m0, m1, n0, n1));
}

}  // namespace keel::cuda::fmplan
