// The GPT model: pre-norm transformer blocks (dense SwiGLU or MoE) over token (+ learned
// position) embeddings, final norm and lm_head, with the language-model loss (plus aux_loss_coef ·
// MoE aux loss). Invariant: construction order fixes the initialisation stream, so a seed gives the
// same weights on every backend.
#include <cmath>

#include "keel/context_parallel.h"
#include "keel/data.h"
#include "keel/error.h"
#include "keel/nn.h"

namespace keel::nn {

Block::Block(const GptConfig& cfg, Generator& gen, Device device,
             std::shared_ptr<Generator> dropoutGen, TensorParallel tp, ExpertParallel ep,
             ContextParallel cp)
    : dropout_(cfg.dropout), dropoutGen_(dropoutGen) {
  norm1_ = buildModule("norm1", [&] { return makeNorm(cfg.norm, cfg.d_model, device); });
  attn_ = buildModule("attn", [&] {
    return std::make_shared<CausalSelfAttention>(cfg, gen, device, dropoutGen, tp, cp);
  });
  norm2_ = buildModule("norm2", [&] { return makeNorm(cfg.norm, cfg.d_model, device); });
  if (cfg.isMoe()) {
    moe_ = buildModule("moe", [&] { return std::make_shared<MoE>(cfg, gen, device, ep); });
    mlp_ = moe_;
  } else {
    double residStd = 0.02 / std::sqrt(2.0 * double(cfg.n_layer));
    mlp_ = buildModule("mlp", [&] {
      return std::make_shared<SwiGLU>(cfg.d_model, cfg.d_ff, gen, device, residStd, tp);
    });
  }
}

Tensor Block::forwardImpl(const Tensor& x) {
  Tensor h = ops::add(x, attn_->forward(norm1_->forward(x)));
  Tensor m = mlp_->forward(norm2_->forward(h));
  if (isTraining() && dropout_ > 0.0 && dropoutGen_)
    m = ops::dropout(m, dropout_, *dropoutGen_, true);
  return ops::add(h, m);
}

GPT::GPT(const GptConfig& cfg, Device device, uint64_t seed, TensorParallel tp, ExpertParallel ep,
         ContextParallel cp)
    : cfg_(cfg),
      device_(device),
      tp_(std::move(tp)),
      ep_(ep),
      cp_(std::move(cp)),
      dropoutGen_(std::make_shared<Generator>(seed ^ 0x64726f706f757400ull)) {  // "dropout\0"
  validateGptConfig(cfg_);
  KEEL_CHECK(tp_.size >= 1 && tp_.rank >= 0 && tp_.rank < tp_.size, "tensor parallelism: rank ",
             tp_.rank, " of ", tp_.size);
  KEEL_CHECK(!tp_.on() || !cfg_.isMoe(), "tensor parallelism: tp ", tp_.size,
             " needs a dense model; this config has ", cfg_.n_expert,
             " experts (split the experts with --ep instead)");
  KEEL_CHECK(!ep_.on() || cfg_.isMoe(), "expert parallelism: --ep ", ep_.size,
             " needs a mixture-of-experts model; this config is dense (n_expert 0)");
  if (cp_.on()) {  // Note [Context-parallel attention]
    KEEL_CHECK(cfg_.position == "learned",
               "context parallelism: --cp with config field "
               "'position' \"",
               cfg_.position, "\" is not built yet (learned positions only)");
    KEEL_CHECK(cfg_.dropout == 0.0,
               "context parallelism: --cp needs config field 'dropout' 0 "
               "(attention dropout round the ring is not built), got ",
               cfg_.dropout);
    KEEL_CHECK(!cfg_.isMoe(),
               "context parallelism: --cp with a mixture-of-experts model is not "
               "built yet");
    KEEL_CHECK(cfg_.seq_len % (2 * cp_.size) == 0, "context parallelism: --cp ", cp_.size,
               " needs config field 'seq_len' a multiple of ", 2 * cp_.size,
               " (the zig-zag split's chunks), got ", cfg_.seq_len);
  }
  KEEL_CHECK(!ep_.on() || cfg_.n_expert % ep_.size == 0, "expert parallelism: --ep ", ep_.size,
             " does not divide config field 'n_expert' ", cfg_.n_expert);
  Generator gen(seed);
  // The root: initialisation scopes are parameter paths (Note [Initialisation scopes]).
  ScopeGuard root("", /*absolute=*/true);
  KEEL_CHECK(!tp_.vocab || tp_.on(),
             "--vocab-parallel splits the vocabulary across tensor-parallel ranks, and this run "
             "has tp 1 (add --tp 2 or more)");
  // (tp dividing vocab_size: the Embedding checks it.)
  wte_ = buildModule("wte", [&] {
    return std::make_shared<Embedding>(cfg.vocab_size, cfg.d_model, gen, device, 0.02, tp_);
  });
  if (cfg.position == "learned")
    wpe_ = buildModule(
        "wpe", [&] { return std::make_shared<Embedding>(cfg.seq_len, cfg.d_model, gen, device); });
  blockList_ = registerModule("blocks", std::make_shared<ModuleList>());
  {
    ScopeGuard scope("blocks");
    for (int64_t i = 0; i < cfg.n_layer; ++i)
      blocks_.push_back(blockList_->build(
          [&] { return std::make_shared<Block>(cfg, gen, device, dropoutGen_, tp_, ep_, cp_); }));
  }
  normF_ = buildModule("norm_f", [&] { return makeNorm(cfg.norm, cfg.d_model, device); });
  // Note [Vocabulary-parallel embedding and loss]: lm_head column-parallel over the vocabulary.
  const Shard vocabRows{tp_.vocab ? 0 : -1, tp_.size, tp_.rank, 1};
  lmHead_ = buildModule("lm_head", [&] {
    return std::make_shared<Linear>(cfg.d_model, cfg.vocab_size, false, gen, device, 0.02,
                                    vocabRows);
  });
}

GptOutput GPT::forward(const Tensor& idx, const Tensor& targets) {
  ScopeGuard scope(fullPath(), /*absolute=*/true);
  KEEL_CHECK(idx.defined() && idx.dim() == 2 && idx.dtype() == DType::Int64,
             "GPT: expected idx int64 [B, T], got ",
             idx.defined() ? shapeStr(idx.shape()) + " " + std::string(dtypeName(idx.dtype()))
                           : std::string("undefined"));
  const int64_t b = idx.size(0), t = idx.size(1), v = cfg_.vocab_size;
  const int64_t row = t * cp_.size;  // the whole row (this rank's part of it under --cp)
  KEEL_CHECK(t >= 1 && row <= cfg_.seq_len, "GPT: sequence length ", row,
             " not in [1, seq_len=", cfg_.seq_len, "]");
  KEEL_CHECK(idx.device() == device_, "GPT: idx is on ", idx.device().name(), ", the model on ",
             device_.name());
  if (targets.defined())
    KEEL_CHECK(targets.shape() == idx.shape() && targets.dtype() == DType::Int64,
               "GPT: targets must be int64 ", shapeStr(idx.shape()), ", got ",
               shapeStr(targets.shape()), " ", dtypeName(targets.dtype()));

  Tensor x;
  if (wpe_) {
    Tensor pos =
        cp_.on() ? tensorFromHost(cp::localPositions(row, cp_.size, cp_.rank, cp::Split::ZigZag),
                                  {t}, DType::Int64, device_)
                 : ops::arange(t, DType::Int64, device_);
    x = ops::add(wte_->forward(idx), wpe_->forward(pos));  // [B, T, C] + [T, C]
  } else {
    x = wte_->forward(idx);  // positions enter the attention (rope)
  }
  if (isTraining() && cfg_.dropout > 0.0) x = ops::dropout(x, cfg_.dropout, *dropoutGen_, true);
  if (cfg_.attention_mask == "causal_document") {
    // The batch's document boundaries, from its separator tokens (Note [Packed documents]).
    struct Clear {
      const std::vector<std::shared_ptr<Block>>& blocks;
      ~Clear() {
        for (auto& blk : blocks) blk->attn()->clearDocumentMask();
      }
    } clear{blocks_};
    // Under --cp the boundaries are the whole rows' (every rank of the group gathers them).
    flashmask::Mask docs = data::documentMask(
        cp_.on() ? cp::unshard(idx, 1, cp::Split::ZigZag, cp_.group) : idx, device_);
    for (auto& blk : blocks_) blk->attn()->setDocumentMask(docs);
    for (auto& blk : blocks_) x = blk->forward(x);
  } else {
    for (auto& blk : blocks_) x = blk->forward(x);
  }
  x = normF_->forward(x);

  GptOutput out;
  const bool vocab = tp_.vocab && tp_.on();
  // [B, T, V]; under --vocab-parallel this rank's [B, T, V/tp] (Note [Vocabulary-parallel
  // embedding and loss]).
  out.logits = lmHead_->forward(vocab ? ops::copyToGroup(x, tp_.group) : x);
  if (cfg_.isMoe()) {
    for (auto& blk : blocks_)
      out.auxLoss = out.auxLoss.defined() ? ops::add(out.auxLoss, blk->moe()->auxLoss())
                                          : blk->moe()->auxLoss();
  }
  if (targets.defined()) {
    const int64_t cols = vocab ? v / tp_.size : v;
    out.lmLoss = vocab ? vocabParallelCrossEntropy(ops::reshape(out.logits, {b * t, cols}),
                                                   ops::reshape(targets, {b * t}), cols * tp_.rank,
                                                   tp_.group)
                       : ops::crossEntropy(ops::reshape(out.logits, {b * t, v}),
                                           ops::reshape(targets, {b * t}));
    out.loss = out.lmLoss;
    if (out.auxLoss.defined() && cfg_.aux_loss_coef > 0.0)
      out.loss = ops::add(out.loss, ops::mulScalar(out.auxLoss, cfg_.aux_loss_coef));
  }
  return out;
}

bool GPT::isExpertParameter(const std::string& name) {
  return name.find(".moe.experts.") != std::string::npos;
}

Shard GPT::parameterShard(const std::string& name) const {
  if (!tp_.on()) return {};
  auto ends = [&](std::string_view suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  // As the layers cut them (Note [Tensor-parallel layers]).
  if (ends("attn.qkv.weight")) return {0, tp_.size, tp_.rank, 3};
  if (ends("mlp.w1.weight") || ends("mlp.w3.weight")) return {0, tp_.size, tp_.rank, 1};
  if (ends("attn.proj.weight") || ends("mlp.w2.weight")) return {1, tp_.size, tp_.rank, 1};
  // Note [Vocabulary-parallel embedding and loss]
  if (tp_.vocab && (name == "wte.weight" || name == "lm_head.weight"))
    return {0, tp_.size, tp_.rank, 1};
  return {};
}

}  // namespace keel::nn
