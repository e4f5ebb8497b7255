// FlashMask geometry shared by the op definition (validation), both backends' kernels and the
// public tile statistics: the column bounds of one (batch, mask head), their per-key-tile min/max,
// and the classification of a (query tile, key tile) pair. Invariant: after readBounds every bound
// lies in [0, Sq] and an empty range is stored canonically ([Sq, Sq) lower, [0, 0) upper).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

#include "flashmask/tile_class.h"
#include "keel/attrs.h"
#include "keel/tensor.h"

namespace keel::detail::flashmask {

// Note [FlashMask geometry]: query row i cannot see key column j when
//   i ∈ [LTS_j, LTE_j) ∪ [UTS_j, UTE_j)                      (the column bounds), or
//   causal and j > i + (Sk − Sq)                              (bottom-right aligned diagonal), or
//   window w > 0 and (i' − j ≥ w, or, when not causal, j − i' ≥ w), with i' = i + (Sk − Sq).
// The index tensor's last dim C carries: causal C=1 LTS (LTE = Sq); causal C=2 LTS, LTE;
// non-causal C=2 LTS, UTE (LTE = Sq, UTS = 0); non-causal C=4 LTS, LTE, UTS, UTE. No index tensor
// means no column bounds. A row that sees no key outputs zeros and has log-sum-exp −inf.
struct Geometry {
  int64_t sq = 0, sk = 0;
  bool causal = false;
  int64_t window = -1;  // -1: off; otherwise >= 1
  int64_t diag() const { return sk - sq; }
};

// Per key column j: rows [lts, lte) and [uts, ute) are masked.
struct ColumnBounds {
  std::vector<int32_t> lts, lte, uts, ute;
};

// Bounds of (b, mask head mh) from an int32 [B, Hm, Sk, C] tensor of any layout; idx may be
// undefined (no bounds).
inline ColumnBounds readBounds(const Tensor& idx, int64_t b, int64_t mh, const Geometry& g) {
  const auto sk = size_t(g.sk);
  const int32_t sq = int32_t(g.sq);
  ColumnBounds cb{std::vector<int32_t>(sk, sq), std::vector<int32_t>(sk, sq),
                  std::vector<int32_t>(sk, 0), std::vector<int32_t>(sk, 0)};
  if (!idx.defined()) return cb;
  const int32_t* p = idx.data<int32_t>();
  const Shape& st = idx.strides();
  const int64_t c = idx.size(3);
  for (size_t j = 0; j < sk; ++j) {
    const int32_t* e = p + b * st[0] + mh * st[1] + int64_t(j) * st[2];
    auto at = [&](int64_t k) { return e[k * st[3]]; };
    int32_t lts = at(0), lte = sq, uts = 0, ute = 0;
    if (g.causal) {
      if (c == 2) lte = at(1);
    } else if (c == 2) {
      ute = at(1);
    } else {
      lte = at(1);
      uts = at(2);
      ute = at(3);
    }
    if (lts >= lte) lts = lte = sq;
    if (uts >= ute) uts = ute = 0;
    cb.lts[j] = lts;
    cb.lte[j] = lte;
    cb.uts[j] = uts;
    cb.ute[j] = ute;
  }
  return cb;
}

inline bool masked(const ColumnBounds& cb, const Geometry& g, int64_t i, int64_t j) {
  const auto jj = size_t(j);
  if (i >= cb.lts[jj] && i < cb.lte[jj]) return true;
  if (i >= cb.uts[jj] && i < cb.ute[jj]) return true;
  const int64_t ip = i + g.diag();
  if (g.causal && j > ip) return true;
  if (g.window > 0 && (ip - j >= g.window || (!g.causal && j - ip >= g.window))) return true;
  return false;
}

inline std::vector<TileBounds> tileBounds(const ColumnBounds& cb, int64_t sk, int64_t bc) {
  std::vector<TileBounds> t;
  for (int64_t n0 = 0; n0 < sk; n0 += bc) {
    const int64_t n1 = std::min(sk, n0 + bc);
    TileBounds tb{INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN,
                  INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN};
    for (int64_t j = n0; j < n1; ++j) {
      const auto jj = size_t(j);
      tb.ltsMin = std::min(tb.ltsMin, cb.lts[jj]);
      tb.ltsMax = std::max(tb.ltsMax, cb.lts[jj]);
      tb.lteMin = std::min(tb.lteMin, cb.lte[jj]);
      tb.lteMax = std::max(tb.lteMax, cb.lte[jj]);
      tb.utsMin = std::min(tb.utsMin, cb.uts[jj]);
      tb.utsMax = std::max(tb.utsMax, cb.uts[jj]);
      tb.uteMin = std::min(tb.uteMin, cb.ute[jj]);
      tb.uteMax = std::max(tb.uteMax, cb.ute[jj]);
    }
    t.push_back(tb);
  }
  return t;
}

// TileBounds, TileClass and the rule itself: flashmask/tile_class.h (shared with the cuda kernels).
inline TileClass classify(const TileBounds& t, const Geometry& g, int64_t m0, int64_t m1,
                          int64_t n0, int64_t n1) {
  return classifyTile(t, g.causal, g.window, g.diag(), m0, m1, n0, n1);
}

// Note [FlashMask op attributes]: a recording of flashmask_attention (and of its backward op)
// shows, besides the attributes the kernels read, what the mask is: "mask" (the builder's kind
// name, which ops::flashmaskAttention sets when it was given a flashmask::Mask; otherwise, without
// an index tensor, "causal", "sliding_window" or "full", and "custom" for an index tensor of
// unknown origin), "block_sparsity" (the fraction of (query tile × key tile) pairs the cpu kernel
// skips, over every batch and mask head, at tileShape(D)), "tile_shape" ([rows, cols] of a tile)
// and "tile_map" (flashmask::tileMap of batch 0, mask head 0, at most 64 × 64 cells). No kernel
// reads them: they are for the recording and the studio's picture of the mask. All but the kind
// are the ops' describe rule (Note [Op descriptions] in keel/observer.h), so they cost nothing
// unless an observer wants them, and they are computed from the same indices on every backend, so
// they never differ between backends. The backward op describes itself from its own q, k and
// indices, giving the forward op's values.
//
// describeMask adds them to a, reading "causal" and "window_size" from a. q [B, Sq, H, D], k and
// idx (undefined: no index tensor) must have passed the op's shape inference; an index tensor
// off the host is not described.
void describeMask(Attrs& a, const Tensor& q, const Tensor& k, const Tensor& idx);

// Checks the index tensor against q [B, Sq, H, D], k [B, Sk, Hk, D] and the causal flag: dtype
// int32, shape [B, Hk or 1, Sk, C] with C allowed for the flag, every bound in [0, Sq], LTS <= LTE
// and UTS <= UTE where both are given. Throws keel::Error naming the problem.
void validateIndices(std::string_view op, const Tensor& idx, const Shape& q, const Shape& k,
                     bool causal);

}  // namespace keel::detail::flashmask
