// Neural-network modules: a Module tree with hierarchical parameter names
// ("blocks.3.attn.qkv.weight") and the layers of a GPT, dense or mixture-of-experts.
// Invariants: parameters are listed in registration order (depth first); every forward runs inside
// ScopeGuard(fullPath(), /*absolute=*/true) so the dispatcher reports each op's module scope path.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "keel/dispatch.h"
#include "keel/flashmask.h"
#include "keel/gpt_config.h"
#include "keel/ops.h"
#include "keel/random.h"
#include "keel/tensor.h"

namespace keel::nn {

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Dotted path from the root module ("" for the root itself).
  const std::string& fullPath() const { return path_; }

  // Adds a parameter under a local name (no dots): marks it as requiring grad, names the tensor
  // with its full path and returns it. Throws keel::Error on a duplicate or malformed name.
  Tensor registerParameter(const std::string& name, Tensor t);
  // The same with the tensor made by `make` inside the scope `name`, so the ops that initialise
  // it carry the parameter's name: see Note [Initialisation scopes].
  Tensor registerParameter(const std::string& name, const std::function<Tensor()>& make);
  // Adds a child module; the child (and its subtree) takes the path "<this path>.<name>".
  template <typename M>
  std::shared_ptr<M> registerModule(const std::string& name, std::shared_ptr<M> m) {
    addChild(name, m);
    return m;
  }
  // Builds a child with `make` (returning a std::shared_ptr) inside the scope `name`, then
  // registers it: the child's initialisation ops carry its path (Note [Initialisation scopes]).
  template <typename F>
  auto buildModule(const std::string& name, F&& make) {
    auto m = [&] {
      ScopeGuard scope(name);
      return make();
    }();
    return registerModule(name, std::move(m));
  }

  // (full name, tensor) for every parameter of this subtree: own parameters first, then each child
  // in registration order. Names are relative to the root of the tree this module belongs to.
  std::vector<std::pair<std::string, Tensor>> namedParameters() const;
  std::vector<Tensor> parameters() const;
  int64_t numParameters() const;  // total element count
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const {
    return children_;
  }

  void zeroGrad();             // drops every parameter's gradient
  void train(bool on = true);  // sets the training flag on the whole subtree
  void eval() { train(false); }
  bool isTraining() const { return training_; }

 private:
  void addChild(const std::string& name, std::shared_ptr<Module> m);
  void setPath(std::string path);
  void collect(std::vector<std::pair<std::string, Tensor>>& out) const;

  std::string path_;
  std::vector<std::pair<std::string, Tensor>> params_;  // local names
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// A module with one tensor in and one out. forward() opens the module's scope, then calls
// forwardImpl().
class UnaryModule : public Module {
 public:
  Tensor forward(const Tensor& x) {
    ScopeGuard scope(fullPath(), /*absolute=*/true);
    return forwardImpl(x);
  }
  Tensor operator()(const Tensor& x) { return forward(x); }

 protected:
  virtual Tensor forwardImpl(const Tensor& x) = 0;
};

// Children named "0", "1", ...
class ModuleList : public Module {
 public:
  template <typename M>
  std::shared_ptr<M> append(std::shared_ptr<M> m) {
    registerModule(std::to_string(size_), m);
    ++size_;
    return m;
  }
  // append(make()), with make() run inside the scope of the next index (see Module::buildModule).
  template <typename F>
  auto build(F&& make) {
    auto m = [&] {
      ScopeGuard scope(std::to_string(size_));
      return make();
    }();
    return append(std::move(m));
  }
  int64_t size() const { return size_; }
  // Runs make() in the scope of the next index as build() does (the same initialisation draws)
  // but keeps nothing there: the index is another rank's (an expert of another ep rank). The
  // next module built gets the index after it.
  template <typename F>
  void buildElsewhere(F&& make) {
    {
      ScopeGuard scope(std::to_string(size_));
      (void)make();
    }
    ++size_;
  }

 private:
  int64_t size_ = 0;
};

// Note [Tensor-parallel layers]: Megatron's split. The ranks of a tensor-parallel group each hold
// a shard of a layer's weight: column-parallel layers (attention's qkv, the MLP's w1 and w3) the
// rows of their output features, row-parallel layers (attention's proj, the MLP's w2) the columns
// of their input features; everything else is replicated. A shard is cut from the full weight the
// single-process model would draw (the same generator calls, then this rank's part), so a run at
// any tp starts from the single-process weights. Attention splits by heads, so its fused qkv
// weight is three blocks (q, k, v) each cut. Forward: copy_to_group before the column-parallel
// layer (its backward sums the ranks' input gradients), all_reduce after the row-parallel one.
//
// Note [Vocabulary-parallel embedding and loss] (keel train --vocab-parallel): the token
// embedding and lm_head split by vocabulary rows as well, rank r holding tokens
// [r·V/tp, (r+1)·V/tp). The embedding looks up the tokens in its rows (zero for the others) and
// all-reduces the sum; lm_head is column-parallel (copy_to_group before it), so each rank has its
// V/tp logits of every position, and the cross entropy is computed from them without gathering
// the [N, V] logits: the row maxima all-reduced (max), the sums of exp(z - max) all-reduced
// (sum), the target's logit taken by the rank holding it and all-reduced (sum). The all_reduce
// sums' backward passes the gradient as is (each rank computes the same loss from the reduced
// values), so each rank's logits get softmax - one-hot of their own columns.
struct TensorParallel {
  int size = 1;  // ranks of the group (1: no tensor parallelism)
  int rank = 0;
  std::string group = "tp";
  bool vocab = false;  // Note [Vocabulary-parallel embedding and loss]
  bool on() const { return size > 1; }
};

// This rank's place in a context-parallel group (keel train --cp; Note [Context-parallel
// attention] in keel/context_parallel.h): the model sees this rank's tokens of each row (the
// zig-zag split), positions and masks are those of the whole row, and attention runs round the
// group's ring.
struct ContextParallel {
  int size = 1;
  int rank = 0;
  std::string group = "cp";
  bool on() const { return size > 1; }
};

// Which part of a weight a rank holds (Note [Tensor-parallel layers]): along axis 0 (rows) or 1
// (columns) of [out, in], the axis made of `blocks` equal blocks each cut into `parts`, part
// `part` of each; axis -1: the whole weight.
struct Shard {
  int axis = -1;
  int parts = 1;
  int part = 0;
  int blocks = 1;
  bool on() const { return axis >= 0; }
};
// This rank's part of a full weight under s (the whole weight when s is off).
Tensor cutShard(const Tensor& full, const Shard& s);
// The full weight from every rank's part: an all_gather over `group` (every rank of it calls
// this), the blocks put back in order. The inverse of cutShard.
Tensor joinShards(const Tensor& part, const Shard& s, const std::string& group);

// y = x · Wᵀ + b; weight [out, in] ~ normal(0, initStd), bias [out] zeros. x is [..., in]. With
// a shard, the weight is that part of the full [out, in] weight (in and out are then the local
// sizes); a sharded layer has no bias.
class Linear : public UnaryModule {
 public:
  Linear(int64_t in, int64_t out, bool bias, Generator& gen, Device device, double initStd = 0.02,
         Shard shard = {});
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }  // undefined without bias
  bool sharded() const { return shard_.axis >= 0 && shard_.parts > 1; }

 protected:
  Tensor forwardImpl(const Tensor& x) override;

 private:
  int64_t in_, out_;
  Tensor weight_, bias_;
  Shard shard_;
};

// weight [num, dim] ~ normal(0, initStd); indices of any shape -> [..., dim].
// With tp.vocab, rows [rank·num/tp, (rank+1)·num/tp) of the full weight (Note
// [Vocabulary-parallel embedding and loss]): other indices look up zeros, and the ranks' lookups
// are summed over tp.group.
class Embedding : public UnaryModule {
 public:
  Embedding(int64_t num, int64_t dim, Generator& gen, Device device, double initStd = 0.02,
            const TensorParallel& tp = {});
  const Tensor& weight() const { return weight_; }

 protected:
  Tensor forwardImpl(const Tensor& idx) override;

 private:
  Tensor weight_;
  TensorParallel tp_;
  int64_t rows_ = 0;  // rows held (num, or num / tp under tp.vocab)
};

// Mean cross entropy of [N, V] logits held as column blocks across `group` (Note
// [Vocabulary-parallel embedding and loss]): `logits` [N, V/size] is this rank's block, its
// first column vocabulary entry `first`; targets int64 [N] index the whole vocabulary, and those
// equal to ignoreIndex are left out of the mean (as ops::crossEntropy). Alone (a group of one,
// first 0) it is ops::crossEntropy's value up to rounding.
Tensor vocabParallelCrossEntropy(const Tensor& logits, const Tensor& targets, int64_t first,
                                 const std::string& group, int64_t ignoreIndex = -100);

class LayerNorm : public UnaryModule {
 public:
  LayerNorm(int64_t dim, Device device, double eps = 1e-5);

 protected:
  Tensor forwardImpl(const Tensor& x) override;

 private:
  Tensor weight_, bias_;
  double eps_;
};

class RMSNorm : public UnaryModule {
 public:
  RMSNorm(int64_t dim, Device device, double eps = 1e-6);

 protected:
  Tensor forwardImpl(const Tensor& x) override;

 private:
  Tensor weight_;
  double eps_;
};

// "layernorm" or "rmsnorm".
std::shared_ptr<UnaryModule> makeNorm(const std::string& kind, int64_t dim, Device device);

// Multi-head self-attention over x [B, T, C] with a fused qkv projection: q, k, v [B, T, H, hd]
// (q and k rotated by the rope op when the config's position is "rope") go through
// flashmask_attention with the mask the config chooses (attention_mask: causal, sliding_window,
// global_sliding_window or causal_document; attention dropout inside the op), then the output
// projection. Every mask is causal: no query sees a later key.
class CausalSelfAttention : public UnaryModule {
 public:
  CausalSelfAttention(const GptConfig& cfg, Generator& gen, Device device,
                      std::shared_ptr<Generator> dropoutGen, TensorParallel tp = {},
                      ContextParallel cp = {});
  // causal_document only: the document mask of the batch about to run ([B, 1, T, 1], built from
  // its tokens by data::documentMask; GPT::forward sets it and clears it after the blocks). Without
  // one, each row is one document.
  void setDocumentMask(flashmask::Mask mask) { docMask_ = std::move(mask); }
  void clearDocumentMask() { docMask_ = {}; }

 protected:
  Tensor forwardImpl(const Tensor& x) override;

 private:
  const flashmask::Mask& maskFor(int64_t b, int64_t t);  // the config's mask for [B, T]
  int64_t nHead_, dModel_;
  TensorParallel tp_;
  ContextParallel cp_;
  double dropout_;
  bool rope_;  // config position "rope": q and k through the rope op
  std::string maskKind_;
  int64_t window_, global_;
  Device device_;
  std::shared_ptr<Generator> dropoutGen_;
  std::shared_ptr<Linear> qkv_, proj_;
  flashmask::Mask mask_;  // cached for (maskB_, maskT_)
  int64_t maskB_ = -1, maskT_ = -1;
  flashmask::Mask docMask_;
};

// w2(silu(w1 x) * w3 x): w1, w3 [d_ff, d] (gate, up), w2 [d, d_ff] (down, init std residStd).
class SwiGLU : public UnaryModule {
 public:
  SwiGLU(int64_t dModel, int64_t dFF, Generator& gen, Device device, double residStd,
         TensorParallel tp = {});

 protected:
  Tensor forwardImpl(const Tensor& x) override;

 private:
  TensorParallel tp_;
  std::shared_ptr<Linear> w1_, w3_, w2_;
};

// Load-balancing loss E · Σ_e f_e · P_e: probs [N, E] router probabilities (P_e = mean over tokens,
// differentiable), topIdx [N, k] chosen experts (f_e = share of the N·k assignments, no grad).
Tensor loadBalancingLoss(const Tensor& probs, const Tensor& topIdx);

// Note [Expert-parallel MoE]
// Under data parallelism a MoE layer routes the dp group's tokens as one batch while training:
// the ranks all-gather their top-k choices, and every rank runs the single-process assignment
// (capacity ceil(capacity_factor · N · k / E) over all N tokens, token order = global batch order)
// so the same assignments are kept and dropped as in one process; the aux loss uses the global
// f_e and P_e (the ranks' probability sums all-reduced; its gradient reaches every rank's tokens
// whole, as in one process). With ep > 1 the experts are split across the ep group (ep consecutive
// dp ranks; expert e on ep rank e / (E / ep)): each rank sends its kept tokens to the experts'
// ranks with one all_to_all (blocks padded to the largest), runs its experts on what it received
// (in sender order, which is the global token order), and a second all_to_all returns the outputs,
// which the sender gates and adds. Expert gradients are averaged over the ranks holding the same
// experts (group edp) and scaled by 1 / ep, the rest over dp. In eval mode each rank routes its
// own tokens (evaluation batches are not split), exchanging them the same way under ep.
struct ExpertParallel {
  int size = 1;        // ep: ranks the experts are split across
  int rank = 0;        // this rank's place in the ep group
  int routeRanks = 1;  // dp: ranks whose tokens are one batch while training (group "dp")
  int routeRank = 0;   // this rank's place among them (its tokens' place in the batch)
  bool on() const { return size > 1; }
};

// Mixture of SwiGLU experts with a softmax router and top-k routing. Capacity per expert is
// ceil(capacity_factor · N · k / E); assignments are taken token by token (slot order within a
// token) and those past an expert's capacity are dropped (the token keeps only its residual).
// Each expert's tokens are gathered with index_select, so expert shapes change from step to step.
// See Note [MoE routing].
class MoE : public UnaryModule {
 public:
  MoE(const GptConfig& cfg, Generator& gen, Device device, ExpertParallel ep = {});

  int64_t numExperts() const { return nExpert_; }
  // The experts this rank holds: [firstExpert, firstExpert + localExperts).
  int64_t firstExpert() const { return firstExpert_; }
  int64_t localExperts() const { return int64_t(experts_.size()); }
  int64_t capacity(int64_t tokens) const;
  // From the last forward: the aux loss (scalar, differentiable through the router), the tokens
  // each expert processed, and how many (token, slot) assignments were dropped.
  const Tensor& auxLoss() const { return aux_; }
  const std::vector<int64_t>& lastExpertTokens() const { return lastCounts_; }
  int64_t lastDropped() const { return lastDropped_; }

 protected:
  Tensor forwardImpl(const Tensor& x) override;

 private:
  // The (token, slot) assignments kept per expert, tokens numbered over the routing scope.
  struct Routing {
    std::vector<std::vector<int64_t>> tokens, slots;  // by expert
    int64_t firstToken = 0;                           // this rank's first token in the scope
  };
  Routing route(const std::vector<int64_t>& choice, int64_t firstToken, int64_t scopeTokens);
  Tensor runExperts(const Tensor& x2, const Tensor& gatesFlat, const Routing& r);
  Tensor exchangeWithExperts(const Tensor& x2, const Tensor& gatesFlat, const Routing& r);

  int64_t nExpert_, topK_;
  double capacityFactor_;
  Device device_;
  ExpertParallel ep_;
  int64_t firstExpert_ = 0;
  std::shared_ptr<Linear> router_;
  std::shared_ptr<ModuleList> expertList_;
  std::vector<std::shared_ptr<SwiGLU>> experts_;
  Tensor aux_;
  std::vector<int64_t> lastCounts_;
  int64_t lastDropped_ = 0;
};

// Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x)) (mlp dense or MoE).
class Block : public UnaryModule {
 public:
  Block(const GptConfig& cfg, Generator& gen, Device device, std::shared_ptr<Generator> dropoutGen,
        TensorParallel tp = {}, ExpertParallel ep = {}, ContextParallel cp = {});
  const std::shared_ptr<MoE>& moe() const { return moe_; }  // null for a dense block
  const std::shared_ptr<CausalSelfAttention>& attn() const { return attn_; }

 protected:
  Tensor forwardImpl(const Tensor& x) override;

 private:
  double dropout_;
  std::shared_ptr<Generator> dropoutGen_;
  std::shared_ptr<UnaryModule> norm1_, norm2_, mlp_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<MoE> moe_;
};

struct GptOutput {
  Tensor logits;   // [B, T, V]; under --vocab-parallel this rank's [B, T, V/tp] block
  Tensor loss;     // lmLoss + aux_loss_coef · auxLoss (undefined without targets)
  Tensor lmLoss;   // cross entropy over [B·T, V]
  Tensor auxLoss;  // sum of the MoE layers' aux losses (undefined for a dense model)
};

// Token embedding + learned position embedding (or, with position "rope", rotary embedding in
// every attention and no wpe), blocks, final norm, lm_head (no weight tying).
// Parameters: wte.weight, wpe.weight (learned only), blocks.<i>.{norm1,attn.qkv,attn.proj,norm2,
// mlp|moe}..., norm_f, lm_head.weight. Initialisation draws from Generator(seed): normal(0, 0.02),
// residual projections (attn.proj, mlp.w2, experts' w2) normal(0, 0.02 / sqrt(2 · n_layer)).
class GPT : public Module {
 public:
  // tp: this rank's place in a tensor-parallel group (Note [Tensor-parallel layers]); keel::Error
  // when it does not divide n_head and d_ff, or for a mixture-of-experts model. ep: the MoE
  // layers' expert parallelism (Note [Expert-parallel MoE]); keel::Error for a dense model or
  // an ep that does not divide n_expert.
  GPT(const GptConfig& cfg, Device device, uint64_t seed, TensorParallel tp = {},
      ExpertParallel ep = {}, ContextParallel cp = {});
  // idx int64 [B, T] with T <= seq_len; targets int64 [B, T] (optional). Under context
  // parallelism idx and targets are this rank's zig-zag part of rows of cp · T tokens.
  GptOutput forward(const Tensor& idx, const Tensor& targets = {});
  const GptConfig& config() const { return cfg_; }
  Device device() const { return device_; }
  const std::vector<std::shared_ptr<Block>>& blocks() const { return blocks_; }
  Generator& dropoutGenerator() { return *dropoutGen_; }  // saved in training checkpoints
  const TensorParallel& tensorParallel() const { return tp_; }
  // Whether the named parameter is a tensor-parallel shard (its gradient norm sums over the group).
  bool isShardedParameter(const std::string& name) const { return parameterShard(name).on(); }
  // Which part of the named parameter this rank holds (off: all of it).
  Shard parameterShard(const std::string& name) const;
  const ExpertParallel& expertParallel() const { return ep_; }
  const ContextParallel& contextParallel() const { return cp_; }
  // Whether the named parameter belongs to an expert of a MoE layer (".moe.experts.").
  static bool isExpertParameter(const std::string& name);

 private:
  GptConfig cfg_;
  Device device_;
  TensorParallel tp_;
  ExpertParallel ep_;
  ContextParallel cp_;
  std::shared_ptr<Generator> dropoutGen_;
  std::shared_ptr<Embedding> wte_, wpe_;
  std::shared_ptr<ModuleList> blockList_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::shared_ptr<UnaryModule> normF_;
  std::shared_ptr<Linear> lmHead_;
};

// The attention mask of one row of t tokens: kind, window and global are the config's
// attention_mask, attention_window and attention_global (a causal_document row as one
// document). What every GPT layer applies to each row.
flashmask::Mask rowMask(const std::string& kind, int64_t t, int64_t window, int64_t global,
                        Device device);

// Host helpers shared by nn, data and train: int64 values of a tensor on any device, and a tensor
// on `device` holding host values.
std::vector<int64_t> hostInts(const Tensor& t);
Tensor tensorFromHost(const std::vector<int64_t>& values, const Shape& shape, DType dtype,
                      Device device);
Tensor tensorFromHost(const std::vector<float>& values, const Shape& shape, DType dtype,
                      Device device);

}  // namespace keel::nn
