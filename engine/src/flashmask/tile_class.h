// FlashMask's tile classification: whether a (query tile x key tile) pair is wholly masked (skip
// it), partly (apply the element mask) or not at all, from the min and max of each column bound
// over the key tile. One rule for every backend: the cpu kernel, countTiles and the recorded tile
// maps call it on the host, the cuda kernels on the device (KEEL_HD). See Note [FlashMask
// geometry] in flashmask_geometry.h.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define KEEL_HD __host__ __device__
#else
#define KEEL_HD
#endif

namespace keel::detail::flashmask {

// Min and max of each bound vector over one key tile.
struct TileBounds {
  int32_t ltsMin, ltsMax, lteMin, lteMax, utsMin, utsMax, uteMin, uteMax;
};

// Skip: every (row, column) pair is masked; Partial: some may be (apply the element mask);
// Unmasked: none is (no mask work). Conservative: Partial whenever in doubt.
enum class TileClass : uint8_t { Skip, Partial, Unmasked };

// Rows [m0, m1) x columns [n0, n1) (non-empty, clipped to Sq and Sk); diag = Sk - Sq; window -1
// (off) or >= 1.
KEEL_HD inline TileClass classifyTile(const TileBounds& t, bool causal, int64_t window,
                                      int64_t diag, int64_t m0, int64_t m1, int64_t n0,
                                      int64_t n1) {
  const int64_t w = window;
  if ((m0 >= t.ltsMax && m1 <= t.lteMin) || (m0 >= t.utsMax && m1 <= t.uteMin))
    return TileClass::Skip;
  if (causal && n0 > m1 - 1 + diag) return TileClass::Skip;
  if (w > 0 && (m0 + diag - (n1 - 1) >= w || (!causal && n0 - (m1 - 1 + diag) >= w)))
    return TileClass::Skip;
  const bool lower = t.ltsMin < m1 && t.lteMax > m0;
  const bool upper = t.utsMin < m1 && t.uteMax > m0;
  const bool dg = causal && n1 - 1 > m0 + diag;
  const bool win = w > 0 && ((m1 - 1 + diag) - n0 >= w || (!causal && (n1 - 1) - (m0 + diag) >= w));
  return lower || upper || dg || win ? TileClass::Partial : TileClass::Unmasked;
}

}  // namespace keel::detail::flashmask
