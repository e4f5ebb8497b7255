// The functional op API. Every function builds attributes and calls dispatch(); nothing here
// computes. Shapes follow NumPy broadcasting; dims may be negative (counted from the end).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "keel/dispatch.h"
#include "keel/flashmask.h"
#include "keel/random.h"
#include "keel/tensor.h"

namespace keel::ops {

// Elementwise with broadcasting (operands must share dtype and device).
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);  // bool result
Tensor lt(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // exact (erf) form
Tensor silu(const Tensor& x);
Tensor abs(const Tensor& x);

Tensor addScalar(const Tensor& x, double s);
Tensor mulScalar(const Tensor& x, double s);
Tensor powScalar(const Tensor& x, double e);

// Reductions; empty dims means all dims.
Tensor sum(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);  // int64

// a [..., M, K] (or [..., K, M] with transA) times b [..., K, N] (or [..., N, K] with transB);
// batch dims broadcast. 1-D operands are not accepted: reshape first.
Tensor matmul(const Tensor& a, const Tensor& b, bool transA = false, bool transB = false);

Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor logSoftmax(const Tensor& x, int64_t dim = -1);
// Normalises over the last dim; weight and bias have shape [last dim].
Tensor layerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
Tensor rmsNorm(const Tensor& x, const Tensor& weight, double eps = 1e-6);
// weight [V, D], indices int32/int64 of any shape -> [..., D].
Tensor embedding(const Tensor& weight, const Tensor& indices);
// logits [N, C], targets int64 [N]; mean over targets != ignoreIndex.
Tensor crossEntropy(const Tensor& logits, const Tensor& targets, int64_t ignoreIndex = -100);
// Zeroes each element with probability p and scales the rest by 1/(1-p); the mask is a function
// of (seed, offset, element index) only.
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset);
Tensor dropout(const Tensor& x, double p, Generator& gen, bool training = true);
// Rotary position embedding of x [B, T, H, D] (D even), rotate-half convention: the pair
// (i, i + D/2) of the row at position t turns by t·base^(-2i/D); inverse turns back. See
// docs/ops.md, "Rotary position embedding".
Tensor rope(const Tensor& x, double base = 10000.0, bool inverse = false);

// FlashMask attention (docs/flashmask.md). q [B, Sq, H, D], k and v [B, Sk, Hk, D] with H a
// multiple of Hk; startendRowIndices int32 [B, Hk or 1, Sk, C] (or undefined: no column mask).
// Query row i cannot see key j when i is in [LTS_j, LTE_j) or [UTS_j, UTE_j); causal adds the
// bottom-right aligned diagonal; windowSize w >= 1 keeps only keys with |i + Sk - Sq - j| < w (and
// j <= i + Sk - Sq when causal), -1 = off. scale 0 means 1/sqrt(D). Dropout draws
// philoxUniform(seed, offset, ((b*H + h)*Sq + i)*Sk + j). Returns {out [B, Sq, H, D],
// log-sum-exp [B, H, Sq] (float32; float64 for float64 inputs)}; rows that see no key give 0 and
// log-sum-exp -inf.
std::pair<Tensor, Tensor> flashmaskAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& startendRowIndices, bool causal = false,
                                             int64_t windowSize = -1, double dropout = 0.0,
                                             double scale = 0.0, uint64_t seed = 0,
                                             uint64_t offset = 0);
// The same, drawing dropout counters (B*H*Sq*Sk of them) from gen; no dropout unless training.
std::pair<Tensor, Tensor> flashmaskAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& startendRowIndices, bool causal,
                                             int64_t windowSize, double dropout, double scale,
                                             Generator& gen, bool training = true);
// The same with a built mask (keel/flashmask.h: indices, which may be undefined, causal flag and
// kind); gen may be null when there is no dropout. Observers (a recording) see every overload's
// mask kind, block sparsity and tile map as attributes "mask", "block_sparsity", "tile_shape" and
// "tile_map" (an index tensor not from a builder is "custom"), computed only while one wants
// them; see Note [FlashMask op attributes].
std::pair<Tensor, Tensor> flashmaskAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const flashmask::Mask& mask, int64_t windowSize = -1,
                                             double dropout = 0.0, double scale = 0.0,
                                             Generator* gen = nullptr, bool training = true);

// Shapes and views. reshape copies when a view is impossible; view never copies.
Tensor reshape(const Tensor& x, const Shape& shape);  // one -1 allowed
Tensor view(const Tensor& x, const Shape& shape);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
Tensor contiguous(const Tensor& x);
Tensor copyTo(const Tensor& x, Device device);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor flatten(const Tensor& x, int64_t startDim = 0, int64_t endDim = -1);

// Indexing (indices int32 or int64, checked against the indexed extent).
Tensor indexSelect(const Tensor& x, int64_t dim, const Tensor& index);
Tensor indexAdd(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor scatterAdd(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
// Values and int64 indices of the k largest (or smallest) along dim, sorted; ties by index.
std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true);
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false);  // stable

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor maskedFill(const Tensor& x, const Tensor& mask, double value);
Tensor cast(const Tensor& x, DType dtype);

Tensor fill(const Shape& shape, double value, DType dtype = DType::Float32, Device device = {});
Tensor uniform(const Shape& shape, double low, double high, uint64_t seed, uint64_t offset,
               DType dtype = DType::Float32, Device device = {});
Tensor uniform(const Shape& shape, double low, double high, Generator& gen,
               DType dtype = DType::Float32, Device device = {});
Tensor normal(const Shape& shape, double mean, double stddev, uint64_t seed, uint64_t offset,
              DType dtype = DType::Float32, Device device = {});
Tensor normal(const Shape& shape, double mean, double stddev, Generator& gen,
              DType dtype = DType::Float32, Device device = {});
Tensor arange(int64_t n, DType dtype = DType::Int64, Device device = {});

// Optimizer updates, in place on param (and state), phase Optimizer.
void sgdStep(const Tensor& param, const Tensor& grad, const Tensor& momentumBuf, double lr,
             double momentum, double weightDecay, bool nesterov);
void adamwStep(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, double lr,
               double beta1, double beta2, double eps, double weightDecay, int64_t step);

// Collectives across the ranks of a process group ("world", "dp", "tp"; keel/dist.h), recorded
// like every op. Alone (one rank) each returns a copy of x. See docs/ops.md, "Collectives".
// all_reduce: the reduction (sum, mean, max) of every rank's x; backward: the gradient as is
// (sum; divided by the group size for mean), for a replicated consumer (Megatron's g).
Tensor allReduce(const Tensor& x, const std::string& op, const std::string& group);
// copy_to_group: x itself; backward: the all_reduce sum of the gradients (Megatron's f).
Tensor copyToGroup(const Tensor& x, const std::string& group);
// all_gather: the ranks' x concatenated along dim, in group rank order; backward: this rank's
// block of the gradient.
Tensor allGather(const Tensor& x, int64_t dim, const std::string& group);
// reduce_scatter: the reduction of every rank's x, split along dim, this rank's block; backward:
// all_gather of the gradient.
Tensor reduceScatter(const Tensor& x, int64_t dim, const std::string& op, const std::string& group);
// broadcast: rank root's x on every rank (not differentiable).
Tensor broadcast(const Tensor& x, int64_t root, const std::string& group);
// all_to_all: x split along dim 0 into one block per rank; block j goes to rank j; the result is
// the blocks received, in sender order; backward: all_to_all of the gradient.
Tensor allToAll(const Tensor& x, const std::string& group);

}  // namespace keel::ops

namespace keel {
inline Tensor operator+(const Tensor& a, const Tensor& b) {
  return ops::add(a, b);
}
inline Tensor operator-(const Tensor& a, const Tensor& b) {
  return ops::sub(a, b);
}
inline Tensor operator*(const Tensor& a, const Tensor& b) {
  return ops::mul(a, b);
}
inline Tensor operator/(const Tensor& a, const Tensor& b) {
  return ops::div(a, b);
}
inline Tensor operator-(const Tensor& a) {
  return ops::neg(a);
}
inline Tensor operator+(const Tensor& a, double s) {
  return ops::addScalar(a, s);
}
inline Tensor operator-(const Tensor& a, double s) {
  return ops::addScalar(a, -s);
}
inline Tensor operator*(const Tensor& a, double s) {
  return ops::mulScalar(a, s);
}
inline Tensor operator/(const Tensor& a, double s) {
  return ops::mulScalar(a, 1.0 / s);
}
}  // namespace keel
