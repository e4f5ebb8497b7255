// Basic layers: Linear, Embedding, LayerNorm, RMSNorm, self-attention (flashmask_attention),
// SwiGLU MLP, and the host-transfer helpers. Every value comes from ops (initialisation included:
// counter-based normal/uniform), so `cpu` and `cpu-ref` build bit-identical initial weights from
// one seed.
#include <algorithm>
#include <cmath>

#include "keel/context_parallel.h"
#include "keel/error.h"
#include "keel/nn.h"

namespace keel::nn {

std::vector<int64_t> hostInts(const Tensor& t) {
  return t.toVector<int64_t>();  // a device tensor is read back outside the op stream
}

namespace {
template <typename T>
Tensor fromHostImpl(const std::vector<T>& values, const Shape& shape, DType dtype, Device device) {
  // On a device the values are staged through the host outside the op stream, as host reads are
  // (no copy_to op: a cuda run's recording lines up with a cpu run's).
  return Tensor::fromVector(values, shape, dtype, device);
}
}  // namespace

Tensor tensorFromHost(const std::vector<int64_t>& values, const Shape& shape, DType dtype,
                      Device device) {
  return fromHostImpl(values, shape, dtype, device);
}
Tensor tensorFromHost(const std::vector<float>& values, const Shape& shape, DType dtype,
                      Device device) {
  return fromHostImpl(values, shape, dtype, device);
}

// ---- Linear -------------------------------------------------------------------------------

// This rank's part of a full weight (Note [Tensor-parallel layers]).
Tensor cutShard(const Tensor& full, const Shard& s) {
  if (!s.on()) return full;
  NoGradGuard ng;
  const int64_t size = full.size(s.axis);
  KEEL_CHECK(size % (int64_t(s.blocks) * s.parts) == 0, "Linear: axis ", s.axis, " of ",
             shapeStr(full.shape()), " does not split into ", s.blocks, " x ", s.parts, " parts");
  const int64_t block = size / s.blocks, piece = block / s.parts;
  std::vector<Tensor> pieces;
  for (int b = 0; b < s.blocks; ++b)
    pieces.push_back(
        ops::slice(full, s.axis, b * block + s.part * piece, b * block + (s.part + 1) * piece));
  return pieces.size() == 1 ? ops::contiguous(pieces[0]) : ops::concat(pieces, s.axis);
}

Tensor joinShards(const Tensor& part, const Shard& s, const std::string& group) {
  if (!s.on()) return part;
  NoGradGuard ng;
  // Gathered: rank 0's blocks, then rank 1's, ...; the full weight is block 0 of every rank, then
  // block 1 of every rank, ...
  const Tensor all = ops::allGather(ops::contiguous(part), s.axis, group);
  if (s.blocks == 1) return all;
  const int64_t local = part.size(s.axis), piece = local / s.blocks;
  std::vector<Tensor> pieces;
  for (int b = 0; b < s.blocks; ++b)
    for (int r = 0; r < s.parts; ++r)
      pieces.push_back(ops::slice(all, s.axis, r * local + b * piece, r * local + (b + 1) * piece));
  return ops::concat(pieces, s.axis);
}

Linear::Linear(int64_t in, int64_t out, bool bias, Generator& gen, Device device, double initStd,
               Shard shard)
    : in_(in), out_(out), shard_(shard) {
  KEEL_CHECK(in > 0 && out > 0, "Linear: sizes must be positive, got in=", in, " out=", out);
  KEEL_CHECK(!sharded() || !bias, "Linear: a tensor-parallel shard has no bias");
  weight_ = registerParameter("weight", [&] {
    Tensor full = ops::normal({out, in}, 0.0, initStd, gen, DType::Float32, device);
    return sharded() ? cutShard(full, shard_) : full;
  });
  if (sharded()) (shard_.axis == 0 ? out_ : in_) /= shard_.parts;
  if (bias)
    bias_ = registerParameter("bias", [&] { return Tensor::zeros({out}, DType::Float32, device); });
}

Tensor Linear::forwardImpl(const Tensor& x) {
  KEEL_CHECK(x.dim() >= 1 && x.size(-1) == in_, "Linear ",
             fullPath().empty() ? std::string("(the root module)") : "'" + fullPath() + "'",
             ": input of shape ", shapeStr(x.shape()), " does not end in ", in_);
  Shape outShape = x.shape();
  outShape.back() = out_;
  Tensor x2 = x.dim() == 2 ? x : ops::reshape(x, {x.numel() / in_, in_});
  Tensor y = ops::matmul(x2, weight_, false, true);
  if (bias_.defined()) y = ops::add(y, bias_);
  return x.dim() == 2 ? y : ops::reshape(y, outShape);
}

// ---- Embedding ----------------------------------------------------------------------------

Embedding::Embedding(int64_t num, int64_t dim, Generator& gen, Device device, double initStd,
                     const TensorParallel& tp)
    : tp_(tp), rows_(num) {
  KEEL_CHECK(num > 0 && dim > 0, "Embedding: sizes must be positive, got num=", num, " dim=", dim);
  const bool split = tp_.vocab && tp_.on();
  KEEL_CHECK(!split || num % tp_.size == 0, "tensor parallelism: tp ", tp_.size,
             " does not divide the embedding's ", num,
             " rows (--vocab-parallel splits them; config field 'vocab_size')");
  weight_ = registerParameter("weight", [&] {
    Tensor full = ops::normal({num, dim}, 0.0, initStd, gen, DType::Float32, device);
    return split ? cutShard(full, {0, tp_.size, tp_.rank, 1}) : full;
  });
  if (split) rows_ = num / tp_.size;
}

namespace {

// Note [Vocabulary-parallel embedding and loss]: indices into a block [first, first + count) of
// a vocabulary split across ranks: each index's place in the block (0 for one outside it) and
// whether the block holds it (1 or 0 in `dtype`).
struct BlockIndex {
  Tensor local, held;
};
BlockIndex blockIndex(const Tensor& idx, int64_t first, int64_t count, DType dtype) {
  const Device dev = idx.device();
  auto scalar = [&](double v, DType t) { return Tensor::scalar(v, t, dev); };
  const Tensor local = ops::sub(idx, scalar(double(first), idx.dtype()));
  const Tensor outside =
      ops::where(ops::lt(local, scalar(0.0, idx.dtype())), scalar(1.0, DType::Bool),
                 ops::gt(local, scalar(double(count - 1), idx.dtype())));
  return {ops::where(outside, scalar(0.0, idx.dtype()), local),
          ops::cast(ops::eq(outside, scalar(0.0, DType::Bool)), dtype)};
}

}  // namespace

Tensor Embedding::forwardImpl(const Tensor& idx) {
  if (!tp_.vocab || !tp_.on()) return ops::embedding(weight_, idx);
  // Note [Vocabulary-parallel embedding and loss]: this rank's rows; zeros for the others.
  const BlockIndex b = blockIndex(idx, rows_ * tp_.rank, rows_, weight_.dtype());
  return ops::allReduce(ops::mul(ops::embedding(weight_, b.local), ops::unsqueeze(b.held, -1)),
                        "sum", tp_.group);
}

Tensor vocabParallelCrossEntropy(const Tensor& logits, const Tensor& targets, int64_t first,
                                 const std::string& group, int64_t ignoreIndex) {
  KEEL_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0) &&
                 targets.dtype() == DType::Int64,
             "vocab-parallel cross entropy: expected logits [N, V] and int64 targets [N], got ",
             shapeStr(logits.shape()), " and ", shapeStr(targets.shape()), " ",
             dtypeName(targets.dtype()));
  const int64_t cols = logits.size(1);
  const Device dev = logits.device();
  // Note [Vocabulary-parallel embedding and loss]. The maxima only shift the exponentials.
  const Tensor m = ops::allReduce(ops::max(logits.detach(), 1, true), "max", group);  // [N, 1]
  const Tensor z = ops::sub(logits, m);
  const Tensor sumExp = ops::allReduce(ops::sum(ops::exp(z), {1}, true), "sum", group);
  const BlockIndex block = blockIndex(targets, first, cols, logits.dtype());
  const Tensor column = ops::unsqueeze(block.local, 1), held = ops::unsqueeze(block.held, 1);
  const Tensor target = ops::allReduce(ops::mul(ops::gather(z, 1, column), held), "sum", group);
  // The mean over the targets that count (not ignoreIndex).
  const Tensor counted = ops::cast(
      ops::unsqueeze(
          ops::eq(ops::eq(targets, Tensor::scalar(double(ignoreIndex), DType::Int64, dev)),
                  Tensor::scalar(0.0, DType::Bool, dev)),
          1),
      logits.dtype());
  return ops::div(ops::sum(ops::mul(ops::sub(ops::log(sumExp), target), counted)),
                  ops::sum(counted));
}

// ---- Norms --------------------------------------------------------------------------------

LayerNorm::LayerNorm(int64_t dim, Device device, double eps) : eps_(eps) {
  weight_ =
      registerParameter("weight", [&] { return Tensor::ones({dim}, DType::Float32, device); });
  bias_ = registerParameter("bias", [&] { return Tensor::zeros({dim}, DType::Float32, device); });
}
Tensor LayerNorm::forwardImpl(const Tensor& x) {
  return ops::layerNorm(x, weight_, bias_, eps_);
}

RMSNorm::RMSNorm(int64_t dim, Device device, double eps) : eps_(eps) {
  weight_ =
      registerParameter("weight", [&] { return Tensor::ones({dim}, DType::Float32, device); });
}
Tensor RMSNorm::forwardImpl(const Tensor& x) {
  return ops::rmsNorm(x, weight_, eps_);
}

std::shared_ptr<UnaryModule> makeNorm(const std::string& kind, int64_t dim, Device device) {
  if (kind == "layernorm") return std::make_shared<LayerNorm>(dim, device);
  if (kind == "rmsnorm") return std::make_shared<RMSNorm>(dim, device);
  throw Error("unknown norm '" + kind + "' (expected layernorm or rmsnorm)");
}

// ---- Attention ----------------------------------------------------------------------------

CausalSelfAttention::CausalSelfAttention(const GptConfig& cfg, Generator& gen, Device device,
                                         std::shared_ptr<Generator> dropoutGen, TensorParallel tp,
                                         ContextParallel cp)
    : nHead_(cfg.n_head),
      dModel_(cfg.d_model),
      tp_(std::move(tp)),
      cp_(std::move(cp)),
      dropout_(cfg.dropout),
      rope_(cfg.position == "rope"),
      maskKind_(cfg.attention_mask),
      window_(cfg.attention_window),
      global_(cfg.attention_global),
      device_(device),
      dropoutGen_(std::move(dropoutGen)) {
  KEEL_CHECK(dModel_ % nHead_ == 0, "CausalSelfAttention: d_model ", dModel_,
             " is not divisible by n_head ", nHead_);
  KEEL_CHECK(maskKind_ == "causal" || maskKind_ == "sliding_window" ||
                 maskKind_ == "global_sliding_window" || maskKind_ == "causal_document",
             "CausalSelfAttention: unknown attention_mask '", maskKind_, "'");
  KEEL_CHECK(nHead_ % tp_.size == 0, "tensor parallelism: tp ", tp_.size,
             " does not divide n_head ", nHead_, " (attention splits by heads)");
  double residStd = 0.02 / std::sqrt(2.0 * double(cfg.n_layer));
  // Note [Tensor-parallel layers]: qkv column-parallel by heads (three blocks), proj row-parallel.
  qkv_ = buildModule("qkv", [&] {
    return std::make_shared<Linear>(dModel_, 3 * dModel_, false, gen, device, 0.02,
                                    Shard{tp_.on() ? 0 : -1, tp_.size, tp_.rank, 3});
  });
  proj_ = buildModule("proj", [&] {
    return std::make_shared<Linear>(dModel_, dModel_, false, gen, device, residStd,
                                    Shard{tp_.on() ? 1 : -1, tp_.size, tp_.rank, 1});
  });
}

flashmask::Mask rowMask(const std::string& kind, int64_t t, int64_t window, int64_t global,
                        Device device) {
  if (kind == "causal") {
    flashmask::Mask m;
    m.causal = true;  // no index tensor: the diagonal alone
    m.kind = flashmask::MaskKind::Causal;
    return m;
  }
  if (kind == "causal_document") return flashmask::causalDocumentRows({{t}}, device);
  return kind == "sliding_window"
             ? flashmask::slidingWindow(t, window, device)
             : flashmask::globalSlidingWindow(t, std::min(global, t), window, device);
}

const flashmask::Mask& CausalSelfAttention::maskFor(int64_t b, int64_t t) {
  if (maskKind_ == "causal_document" && docMask_.startendRowIndices.defined()) {
    const Shape want{b, 1, t, 1};
    KEEL_CHECK(docMask_.startendRowIndices.shape() == want, "CausalSelfAttention '", fullPath(),
               "': document mask ", shapeStr(docMask_.startendRowIndices.shape()),
               " does not match the input's ", shapeStr(want));
    return docMask_;
  }
  if (b == maskB_ && t == maskT_) return mask_;
  NoGradGuard ng;
  flashmask::Mask m = rowMask(maskKind_, t, window_, global_, device_);
  if (m.startendRowIndices.defined())  // one mask row per batch row
    m.startendRowIndices = flashmask::repeatMask(m.startendRowIndices, b, 1);
  mask_ = std::move(m);
  maskB_ = b;
  maskT_ = t;
  return mask_;
}

Tensor CausalSelfAttention::forwardImpl(const Tensor& x) {
  KEEL_CHECK(x.dim() == 3 && x.size(2) == dModel_, "CausalSelfAttention '", fullPath(),
             "': expected input [B, T, ", dModel_, "], got ", shapeStr(x.shape()));
  // This rank's heads (all of them without tensor parallelism).
  const int64_t b = x.size(0), t = x.size(1), hd = dModel_ / nHead_, h = nHead_ / tp_.size,
                c = h * hd;
  const bool drop = isTraining() && dropout_ > 0.0 && dropoutGen_;
  const Tensor in = tp_.on() ? ops::copyToGroup(x, tp_.group) : x;
  auto parts = ops::split(qkv_->forward(in), {c, c, c}, -1);
  auto heads = [&](const Tensor& p) { return ops::reshape(p, {b, t, h, hd}); };  // [B, T, H, hd]
  Tensor q = heads(parts[0]), k = heads(parts[1]);
  if (rope_) {  // position t of the row, base 10000
    q = ops::rope(q);
    k = ops::rope(k);
  }
  // Scale 0: 1/sqrt(hd). Attention dropout draws B·H·T·T counters, one per probability. Under
  // context parallelism this rank's queries attend to the whole row round the ring, under the
  // whole row's mask.
  Tensor y = cp_.on() ? cp::ringAttention(q, k, heads(parts[2]), maskFor(b, t * cp_.size), -1, 0.0,
                                          cp::Split::ZigZag, cp_.group)
                            .first
                      : ops::flashmaskAttention(q, k, heads(parts[2]), maskFor(b, t), -1,
                                                drop ? dropout_ : 0.0, 0.0, dropoutGen_.get(),
                                                drop)
                            .first;  // [B, T, H, hd]
  y = proj_->forward(ops::reshape(y, {b, t, c}));
  if (tp_.on()) y = ops::allReduce(y, "sum", tp_.group);  // the heads' shares of the projection
  if (drop) y = ops::dropout(y, dropout_, *dropoutGen_, true);
  return y;
}

// ---- SwiGLU -------------------------------------------------------------------------------

SwiGLU::SwiGLU(int64_t dModel, int64_t dFF, Generator& gen, Device device, double residStd,
               TensorParallel tp)
    : tp_(std::move(tp)) {
  KEEL_CHECK(dFF % tp_.size == 0, "tensor parallelism: tp ", tp_.size, " does not divide d_ff ",
             dFF);
  // Note [Tensor-parallel layers]: w1 and w3 column-parallel, w2 row-parallel.
  const Shard rows{tp_.on() ? 0 : -1, tp_.size, tp_.rank, 1};
  const Shard cols{tp_.on() ? 1 : -1, tp_.size, tp_.rank, 1};
  w1_ = buildModule(
      "w1", [&] { return std::make_shared<Linear>(dModel, dFF, false, gen, device, 0.02, rows); });
  w3_ = buildModule(
      "w3", [&] { return std::make_shared<Linear>(dModel, dFF, false, gen, device, 0.02, rows); });
  w2_ = buildModule("w2", [&] {
    return std::make_shared<Linear>(dFF, dModel, false, gen, device, residStd, cols);
  });
}

Tensor SwiGLU::forwardImpl(const Tensor& x) {
  const Tensor in = tp_.on() ? ops::copyToGroup(x, tp_.group) : x;
  Tensor y = w2_->forward(ops::mul(ops::silu(w1_->forward(in)), w3_->forward(in)));
  return tp_.on() ? ops::allReduce(y, "sum", tp_.group) : y;
}

}  // namespace keel::nn
