// FlashMask mask builders: each returns the int32 startend_row_indices tensor [1, 1, S, C] of a
// standard attention mask (Sq = Sk = S) and the causal flag to pass to ops::flashmaskAttention.
// Invariant: every builder validates its arguments (keel::Error) and its output passes the op's
// own index validation. Pictures of every mask are in docs/flashmask.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "keel/tensor.h"

namespace keel::flashmask {

enum class MaskKind {
  Full,
  Causal,
  SlidingWindow,
  CausalDocument,
  Document,
  SharedQuestion,
  GlobalSlidingWindow,
  CausalBlockwise,
  PrefixLmDocument,
  PrefixLmCausal,
  QkSparse,
  RandomEviction,
};
const char* maskKindName(MaskKind k);  // "causal_document", ...

struct Mask {
  Tensor startendRowIndices;  // int32 [1, 1, S, C]
  bool causal = false;
  MaskKind kind = MaskKind::Full;
};

// Nothing masked (non-causal, C=2: LTS = S, UTE = 0).
Mask full(int64_t s, Device device = {});
// Lower triangle (causal, C=1: LTS = S).
Mask causal(int64_t s, Device device = {});
// Causal, each query sees itself and the window-1 keys before it (C=1: LTS_j = min(j + w, S)).
Mask slidingWindow(int64_t s, int64_t window, Device device = {});
// Packed documents of the given lengths, causal inside each (C=1: LTS_j = end of j's document).
Mask causalDocument(const std::vector<int64_t>& docLens, Device device = {});
// Per-row packed documents (a batch of packed sequences): docLens[b] are the document lengths of
// row b, every row summing to the same S. int32 [B, 1, S, 1], causal C=1, kind CausalDocument.
Mask causalDocumentRows(const std::vector<std::vector<int64_t>>& docLens, Device device = {});
// Packed documents, bidirectional inside each (non-causal C=2: LTS_j = doc end, UTE_j = doc start).
Mask document(const std::vector<int64_t>& docLens, Device device = {});
// A shared question followed by answers: every answer sees the question and itself, causally,
// never another answer (causal C=1).
Mask sharedQuestion(int64_t questionLen, const std::vector<int64_t>& answerLens,
                    Device device = {});
// The first `global` tokens are seen by every later query; the rest by a causal sliding window
// (causal C=1).
Mask globalSlidingWindow(int64_t s, int64_t global, int64_t window, Device device = {});
// Causal blocks that see only themselves, except the last block, which sees everything before
// it (in-context examples followed by the query; causal C=2: LTS_j = block end, LTE_j = start of
// the last block).
Mask causalBlockwise(const std::vector<int64_t>& blockLens, Device device = {});
// Packed documents, each a bidirectional prefix of prefixLens[d] tokens followed by a causal part
// (non-causal C=2).
Mask prefixLmDocument(const std::vector<int64_t>& docLens, const std::vector<int64_t>& prefixLens,
                      Device device = {});
// One bidirectional prefix, then causal (non-causal C=2: LTS = S, UTE_j = 0 in the prefix, j
// after).
Mask prefixLmCausal(int64_t s, int64_t prefix, Device device = {});
// Causal, with spans cut out: query rows [rowBegin, rowEnd) do not see keys [keyBegin, keyEnd)
// (causal C=2: LTS, LTE on those columns). Key spans must not overlap.
struct QkSpan {
  int64_t keyBegin, keyEnd, rowBegin, rowEnd;
};
Mask qkSparse(int64_t s, const std::vector<QkSpan>& spans, Device device = {});
// Causal, and each key j is evicted from the cache at a random row in (j, S] (Philox(seed)):
// rows from there on do not see it (causal C=1). The first `sinks` keys are never evicted.
Mask randomEviction(int64_t s, uint64_t seed, int64_t sinks = 1, Device device = {});

// Copies a [1, Hm, S, C] mask to [batch, heads, S, C] (heads = Hm or a multiple when Hm = 1).
Tensor repeatMask(const Tensor& startendRowIndices, int64_t batch, int64_t heads);

// The cpu kernel's tile shape for a head dim (rows of a query tile, columns of a key tile).
struct TileShape {
  int64_t rows, cols;
};
TileShape tileShape(int64_t headDim);

// (query tile × key tile) pairs by class, summed over batch and mask heads, as the cpu kernel
// classifies them (window_size -1 = off). ρ = skipped / total.
struct TileCounts {
  int64_t skipped = 0, partial = 0, unmasked = 0;
  int64_t total() const { return skipped + partial + unmasked; }
  double skippedFraction() const { return total() ? double(skipped) / double(total()) : 0.0; }
};
TileCounts countTiles(const Tensor& startendRowIndices, bool causal, int64_t sq, int64_t sk,
                      int64_t windowSize, TileShape tile);

// The tile classes of batch b, mask head h as text: one row per query tile (top first), one
// character per key tile: 's' skipped, 'p' partial, 'f' full (unmasked: no mask work), rows joined
// by '/'. A grid larger than maxCells in either direction is coarsened to at most maxCells ×
// maxCells cells, each covering a block of tiles: 's' or 'f' when all its tiles are, else 'p'.
std::string tileMap(const Tensor& startendRowIndices, bool causal, int64_t sq, int64_t sk,
                    int64_t windowSize, TileShape tile, int64_t b = 0, int64_t h = 0,
                    int64_t maxCells = 64);

// The dense [Sq, Sk] visibility (1 = query i sees key j) of batch b, mask head h: the oracle's view
// of a mask, for tests, pictures and the dense baseline.
std::vector<uint8_t> denseVisibility(const Tensor& startendRowIndices, bool causal, int64_t sq,
                                     int64_t sk, int64_t windowSize, int64_t b = 0, int64_t h = 0);

}  // namespace keel::flashmask
