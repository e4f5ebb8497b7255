// Context parallelism for FlashMask attention: a sequence split across the ranks of a group, each
// rank attending with its own queries to every rank's keys and values, which travel round a ring.
// Invariant: the result is the single-process attention of the whole sequence under the same
// mask (within float rounding of the merge), and every rank calls the same collectives in the
// same order whatever its mask skips. See Note [Context-parallel attention].
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "keel/flashmask.h"
#include "keel/tensor.h"

namespace keel::cp {

// Note [Context-parallel attention]
// Split: n ranks, a sequence of S tokens. Contiguous gives rank r the tokens [r·S/n, (r+1)·S/n).
// Under a causal mask that leaves rank n-1 most of the work (its queries see every key) and rank
// 0 almost none; ZigZag cuts the sequence into 2n chunks and gives rank r chunks r and 2n-1-r, so
// every rank holds one early and one late chunk and the unmasked (query, key) pairs even out.
// A rank's local order is its chunks in sequence order.
// Ring: each rank starts with its own keys and values; at each of n steps it attends its queries
// to the keys and values it holds, chunk pair by chunk pair, then passes them to the next rank
// (rank r sends to r+1 and receives from r-1: an all_to_all whose only non-empty block is the
// next rank's). A (query chunk, key chunk) pair is one flashmask_attention call under that pair's
// part of the global mask (its column bounds shifted to the chunk's rows, the causal diagonal and
// any window folded into them), and is not computed at all when the mask hides all of it; inside
// a call the kernel skips the tiles the mask empties. The partial outputs of a query chunk are
// merged by their log-sum-exps (lse = log Σ exp(lse_i); out = Σ exp(lse_i - lse) · out_i), all
// differentiable ops — flashmask_attention's backward takes the lse gradient — so the gradients
// of q, k and v (the last by the ring's all_to_all in reverse) are those of one process.
enum class Split { Contiguous, ZigZag };
const char* splitName(Split s);  // "contiguous", "zigzag"

// The global positions of the tokens rank `rank` of `ranks` holds, in its local order. keel::Error
// when S does not divide into the split's chunks (n for Contiguous, 2n for ZigZag).
std::vector<int64_t> localPositions(int64_t s, int ranks, int rank, Split split);
// This rank's tokens of x along dim (a [B, S, ...] tensor: dim 1), in its local order.
Tensor shard(const Tensor& x, int64_t dim, int ranks, int rank, Split split);
// The whole sequence back from every rank's part (an all_gather over `group`, then reordered):
// the inverse of shard.
Tensor unshard(const Tensor& local, int64_t dim, Split split, const std::string& group);

// The share of the mask's unmasked (query, key) pairs each rank's queries hold (batch 0, mask
// head 0), one entry per rank, summing to 1: the work each rank does under the split.
std::vector<double> workShares(const flashmask::Mask& mask, int64_t s, int ranks, Split split,
                               int64_t windowSize = -1);

// What one rank did in the last ringAttention call: chunk pairs computed and skipped (fully
// masked), and the (query, key) pairs its computed calls covered.
struct RingStats {
  int64_t pairsComputed = 0, pairsSkipped = 0;
  int64_t visiblePairs = 0;  // unmasked (query, key) pairs of this rank's queries (batch 0, head 0)
};

// Attention of this rank's queries to the whole sequence. q [B, S/n, H, D], k and v
// [B, S/n, Hk, D] are this rank's tokens under `split`; mask is the global mask of the S tokens
// (the same on every rank: indices [B or 1, Hm, S, C], or none); windowSize as the op's (-1 off).
// Returns this rank's {out [B, S/n, H, D], lse [B, H, S/n]}, differentiable. Every rank of
// `group` calls it together. No attention dropout.
std::pair<Tensor, Tensor> ringAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const flashmask::Mask& mask, int64_t windowSize,
                                        double scale, Split split, const std::string& group,
                                        RingStats* stats = nullptr);

}  // namespace keel::cp
