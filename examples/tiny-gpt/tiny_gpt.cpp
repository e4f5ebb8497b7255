// A tiny decoder-only transformer (token + position embeddings, pre-norm blocks of causal
// self-attention and a squared-ReLU MLP, final norm, LM head) trained with AdamW on generated
// sequences (each row counts up from a random start by a random stride, modulo the vocabulary),
// written against Keel's public API. squared_relu is this project's own op (squared_relu.cpp).
// Config (all optional): {"vocab": 32, "seq_len": 16, "d_model": 32, "n_head": 2, "n_layer": 2,
//                         "batch": 8, "lr": 0.003}
#include <memory>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "keel/error.h"
#include "keel/nn.h"
#include "keel/ops.h"
#include "keel/optim.h"
#include "keel/workload.h"
#include "squared_relu.h"

namespace {

using keel::Tensor;
namespace nn = keel::nn;
namespace ops = keel::ops;

struct Config {
  int64_t vocab = 32, seqLen = 16, dModel = 32, nHead = 2, nLayer = 2, batch = 8;
  double lr = 3e-3;
};

Config parseConfig(const std::string& text) {
  Config c;
  if (text.empty()) return c;
  auto j = nlohmann::json::parse(text);
  c.vocab = j.value("vocab", c.vocab);
  c.seqLen = j.value("seq_len", c.seqLen);
  c.dModel = j.value("d_model", c.dModel);
  c.nHead = j.value("n_head", c.nHead);
  c.nLayer = j.value("n_layer", c.nLayer);
  c.batch = j.value("batch", c.batch);
  c.lr = j.value("lr", c.lr);
  KEEL_CHECK(c.vocab > 1 && c.seqLen > 1 && c.nHead > 0 && c.dModel % c.nHead == 0 &&
                 c.nLayer > 0 && c.batch > 0 && c.lr > 0,
             "tiny-gpt: bad config (d_model must be a multiple of n_head, sizes positive)");
  return c;
}

class Attention : public nn::UnaryModule {
 public:
  Attention(const Config& c, keel::Generator& gen, keel::Device dev)
      : c_(c),
        qkv_(registerModule("qkv",
                            std::make_shared<nn::Linear>(c.dModel, 3 * c.dModel, false, gen, dev))),
        proj_(registerModule("proj",
                             std::make_shared<nn::Linear>(c.dModel, c.dModel, false, gen, dev))) {}

 protected:
  Tensor forwardImpl(const Tensor& x) override {
    int64_t b = x.size(0), t = x.size(1), hd = c_.dModel / c_.nHead;
    auto parts = ops::split((*qkv_)(x), {c_.dModel, c_.dModel, c_.dModel}, -1);
    auto heads = [&](const Tensor& p) { return ops::reshape(p, {b, t, c_.nHead, hd}); };
    auto [y, lse] = ops::flashmaskAttention(heads(parts[0]), heads(parts[1]), heads(parts[2]),
                                            Tensor(), /*causal=*/true);
    return (*proj_)(ops::reshape(y, {b, t, c_.dModel}));
  }

 private:
  Config c_;
  std::shared_ptr<nn::Linear> qkv_, proj_;
};

// w2(squared_relu(w1 x)): the user op sits in every block's MLP.
class Mlp : public nn::UnaryModule {
 public:
  Mlp(const Config& c, keel::Generator& gen, keel::Device dev)
      : up_(registerModule("up",
                           std::make_shared<nn::Linear>(c.dModel, 4 * c.dModel, false, gen, dev))),
        down_(registerModule(
            "down", std::make_shared<nn::Linear>(4 * c.dModel, c.dModel, false, gen, dev))) {}

 protected:
  Tensor forwardImpl(const Tensor& x) override {
    return (*down_)(tiny_gpt::squaredRelu((*up_)(x)));
  }

 private:
  std::shared_ptr<nn::Linear> up_, down_;
};

class Block : public nn::UnaryModule {
 public:
  Block(const Config& c, keel::Generator& gen, keel::Device dev)
      : ln1_(registerModule("ln1", std::make_shared<nn::LayerNorm>(c.dModel, dev))),
        attn_(registerModule("attn", std::make_shared<Attention>(c, gen, dev))),
        ln2_(registerModule("ln2", std::make_shared<nn::LayerNorm>(c.dModel, dev))),
        mlp_(registerModule("mlp", std::make_shared<Mlp>(c, gen, dev))) {}

 protected:
  Tensor forwardImpl(const Tensor& x) override {
    Tensor h = x + (*attn_)((*ln1_)(x));
    return h + (*mlp_)((*ln2_)(h));
  }

 private:
  std::shared_ptr<nn::LayerNorm> ln1_;
  std::shared_ptr<Attention> attn_;
  std::shared_ptr<nn::LayerNorm> ln2_;
  std::shared_ptr<Mlp> mlp_;
};

// Token ids [B, T] -> logits [B, T, vocab].
class TinyGpt : public nn::UnaryModule {
 public:
  TinyGpt(const Config& c, keel::Generator& gen, keel::Device dev)
      : dev_(dev),
        tok_(registerModule("tok", std::make_shared<nn::Embedding>(c.vocab, c.dModel, gen, dev))),
        pos_(registerModule("pos", std::make_shared<nn::Embedding>(c.seqLen, c.dModel, gen, dev))),
        blocks_(registerModule("blocks", std::make_shared<nn::ModuleList>())),
        lnf_(registerModule("ln_f", std::make_shared<nn::LayerNorm>(c.dModel, dev))),
        head_(registerModule("head",
                             std::make_shared<nn::Linear>(c.dModel, c.vocab, false, gen, dev))) {
    for (int64_t i = 0; i < c.nLayer; ++i) blocks_->append(std::make_shared<Block>(c, gen, dev));
  }

 protected:
  Tensor forwardImpl(const Tensor& idx) override {
    Tensor x = (*tok_)(idx) + (*pos_)(ops::arange(idx.size(1), keel::DType::Int64, dev_));
    for (const auto& [name, block] : blocks_->children()) x = static_cast<Block&>(*block)(x);
    return (*head_)((*lnf_)(x));
  }

 private:
  keel::Device dev_;
  std::shared_ptr<nn::Embedding> tok_, pos_;
  std::shared_ptr<nn::ModuleList> blocks_;
  std::shared_ptr<nn::LayerNorm> lnf_;
  std::shared_ptr<nn::Linear> head_;
};

}  // namespace

class TinyGptWorkload : public keel::Workload {
 public:
  explicit TinyGptWorkload(const keel::WorkloadParams& p)
      : c_(parseConfig(p.configJson)), dev_(p.device), rng_(p.seed) {
    keel::Generator gen(p.seed);
    model_ = std::make_shared<TinyGpt>(c_, gen, dev_);
    opt_ = std::make_unique<keel::optim::AdamW>(model_->parameters(),
                                                keel::optim::AdamWOptions{.lr = c_.lr});
  }

  keel::WorkloadMetrics step() override {
    // A batch of counting sequences: x[t+1] = x[t] + stride (mod vocab); predict the next token.
    std::vector<int64_t> x, y;
    std::uniform_int_distribution<int64_t> start(0, c_.vocab - 1), stride(1, 3);
    for (int64_t b = 0; b < c_.batch; ++b) {
      int64_t v = start(rng_), s = stride(rng_);
      for (int64_t t = 0; t < c_.seqLen; ++t) {
        x.push_back(v);
        v = (v + s) % c_.vocab;
        y.push_back(v);
      }
    }
    Tensor idx = Tensor::fromVector(x, {c_.batch, c_.seqLen}, keel::DType::Int64, dev_);
    Tensor targets = Tensor::fromVector(y, {c_.batch * c_.seqLen}, keel::DType::Int64, dev_);

    opt_->zeroGrad();
    Tensor logits = (*model_)(idx);
    Tensor loss =
        ops::crossEntropy(ops::reshape(logits, {c_.batch * c_.seqLen, c_.vocab}), targets);
    loss.backward();
    keel::WorkloadMetrics m;
    m.gradNorm = keel::optim::clipGradNorm(model_->parameters(), 1.0);
    opt_->step();
    m.loss = loss.item();
    m.lr = c_.lr;
    return m;
  }

 private:
  Config c_;
  keel::Device dev_;
  std::mt19937_64 rng_;
  std::shared_ptr<TinyGpt> model_;
  std::unique_ptr<keel::optim::AdamW> opt_;
};

KEEL_WORKLOAD(TinyGptWorkload, "tiny-gpt",
              "a tiny decoder-only transformer with a user op (squared_relu)")
