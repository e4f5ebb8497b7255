// Tests for nn modules and optimizers: hierarchical parameter names, module scope paths seen by an
// observer, Linear/attention semantics, MoE routing (dynamic shapes, capacity drops, aux loss),
// grad clipping, optimizer updates and the LR schedule. Values are checked against hand numbers.
#include <gtest/gtest.h>
#include <optional>

#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>
#include <set>

#include "keel/data.h"
#include "keel/nn.h"
#include "keel/observer.h"
#include "keel/optim.h"
#include "keel/registry.h"
#include "test_util.h"

namespace keel {
namespace {

using test::kCpuRef;

GptConfig tinyConfig(bool moe) {
  GptConfig c;
  c.vocab_size = 256;
  c.seq_len = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.d_ff = 32;
  if (moe) {
    c.n_expert = 4;
    c.top_k = 2;
    c.capacity_factor = 1.0;
  }
  return c;
}

// Records every op's name, scope, phase and output shapes.
class Recorder : public Observer {
 public:
  struct Rec {
    std::string op, scope;
    Phase phase;
    std::vector<Shape> outShapes;
  };
  void onOpEnd(const OpEvent& e) override {
    Rec r{e.op->name, std::string(e.scope), e.phase, {}};
    for (auto& t : e.outputs) r.outShapes.push_back(t.shape());
    recs.push_back(std::move(r));
  }
  std::vector<Rec> recs;
};

class ObserverScope {
 public:
  explicit ObserverScope(std::shared_ptr<Observer> o) : o_(std::move(o)) { addObserver(o_); }
  ~ObserverScope() { removeObserver(o_); }

 private:
  std::shared_ptr<Observer> o_;
};

void setValues(const Tensor& t, const std::vector<float>& v) {
  ASSERT_EQ(int64_t(v.size()), t.numel());
  ASSERT_TRUE(t.isContiguous());
  std::copy(v.begin(), v.end(), t.data<float>());
  t.bumpVersion();
}

Tensor tokens(const Shape& shape, uint64_t seed, Device d = kCpuRef) {
  return test::randInt(shape, 0, 255, DType::Int64, d, seed);
}

TEST(ModuleTest, GptParameterNamesAreHierarchicalAndOrdered) {
  nn::GPT model(tinyConfig(false), kCpuRef, 1);
  auto named = model.namedParameters();
  std::vector<std::string> names;
  for (auto& [n, t] : named) {
    names.push_back(n);
    EXPECT_EQ(t.name(), n) << "tensor name follows the full path";
    EXPECT_TRUE(t.requiresGrad()) << n;
  }
  std::vector<std::string> expectBlock1 = {
      "blocks.1.norm1.weight",     "blocks.1.norm1.bias",    "blocks.1.attn.qkv.weight",
      "blocks.1.attn.proj.weight", "blocks.1.norm2.weight",  "blocks.1.norm2.bias",
      "blocks.1.mlp.w1.weight",    "blocks.1.mlp.w3.weight", "blocks.1.mlp.w2.weight"};
  auto it = std::find(names.begin(), names.end(), "blocks.1.norm1.weight");
  ASSERT_NE(it, names.end());
  EXPECT_EQ(std::vector<std::string>(it, it + 9), expectBlock1);
  EXPECT_EQ(names.front(), "wte.weight");
  EXPECT_EQ(names[1], "wpe.weight");
  EXPECT_EQ(names.back(), "lm_head.weight");
  EXPECT_EQ(names.size(), 2u + 2u * 9u + 2u + 1u);
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());

  // Shapes: Linear weight is [out, in].
  std::map<std::string, Tensor> byName(named.begin(), named.end());
  EXPECT_EQ(byName["blocks.0.attn.qkv.weight"].shape(), (Shape{48, 16}));
  EXPECT_EQ(byName["blocks.0.mlp.w2.weight"].shape(), (Shape{16, 32}));
  EXPECT_EQ(byName["wpe.weight"].shape(), (Shape{8, 16}));
  EXPECT_EQ(byName["lm_head.weight"].shape(), (Shape{256, 16}));

  // A second build lists the same names in the same order, with the same initial values.
  nn::GPT again(tinyConfig(false), kCpuRef, 1);
  auto named2 = again.namedParameters();
  ASSERT_EQ(named2.size(), named.size());
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_EQ(named2[i].first, named[i].first);
    EXPECT_TRUE(test::bitEqual(named2[i].second, named[i].second)) << named[i].first;
  }
}

TEST(ModuleTest, MoeParameterNames) {
  nn::GPT model(tinyConfig(true), kCpuRef, 1);
  std::set<std::string> names;
  for (auto& [n, t] : model.namedParameters()) names.insert(n);
  EXPECT_TRUE(names.count("blocks.0.moe.router.weight"));
  EXPECT_TRUE(names.count("blocks.1.moe.experts.3.w2.weight"));
  EXPECT_TRUE(names.count("blocks.1.moe.experts.0.w1.weight"));
  EXPECT_FALSE(names.count("blocks.0.mlp.w1.weight"));
}

TEST(ModuleTest, RegisterModuleRenamesSubtreeAndRejectsDuplicates) {
  Generator gen(0);
  auto lin = std::make_shared<nn::Linear>(3, 2, true, gen, kCpuRef);
  EXPECT_EQ(lin->weight().name(), "weight");
  struct Holder : nn::Module {};
  auto inner = std::make_shared<Holder>();
  inner->registerModule("fc", lin);
  EXPECT_EQ(lin->fullPath(), "fc");
  Holder outer;
  outer.registerModule("head", inner);
  EXPECT_EQ(lin->fullPath(), "head.fc");
  EXPECT_EQ(lin->weight().name(), "head.fc.weight");
  EXPECT_EQ(lin->bias().name(), "head.fc.bias");
  auto named = outer.namedParameters();
  ASSERT_EQ(named.size(), 2u);
  EXPECT_EQ(named[0].first, "head.fc.weight");
  EXPECT_EQ(named[1].first, "head.fc.bias");
  EXPECT_THROW(inner->registerModule("fc", std::make_shared<Holder>()), Error);
  EXPECT_THROW(outer.registerParameter("a.b", Tensor::zeros({1})), Error);
  EXPECT_THROW(outer.registerParameter("head", Tensor::zeros({1})), Error);
  outer.registerParameter("scale", Tensor::ones({1}, DType::Float32, kCpuRef));
  // The root module is named as such ("Module ''" named nothing); others by their path.
  EXPECT_EQ(test::errorOf([&] {
              outer.registerParameter("scale", Tensor::ones({1}, DType::Float32, kCpuRef));
            }),
            "the root module: parameter 'scale' registered twice");
  EXPECT_EQ(test::errorOf([&] { inner->registerModule("fc", std::make_shared<Holder>()); }),
            "Module 'head': child 'fc' registered twice");
  nn::Linear root(3, 2, true, gen, kCpuRef);
  EXPECT_EQ(test::errorOf([&] {
              root.forward(Tensor::ones({2, 4}, DType::Float32, kCpuRef));
            }),
            "Linear (the root module): input of shape [2, 4] does not end in 3");

  // zeroGrad drops gradients; train/eval reach the whole tree.
  lin->weight().setGrad(Tensor::ones({2, 3}, DType::Float32, kCpuRef));
  outer.zeroGrad();
  EXPECT_FALSE(lin->weight().grad().defined());
  outer.eval();
  EXPECT_FALSE(lin->isTraining());
  outer.train();
  EXPECT_TRUE(lin->isTraining());
}

TEST(LayerTest, LinearComputesXWtPlusB) {
  Generator gen(0);
  nn::Linear lin(3, 2, true, gen, kCpuRef);
  setValues(lin.weight(), {1, 2, 3, -1, 0, 1});
  setValues(lin.bias(), {0.5f, -0.5f});
  Tensor x = test::fromDoubles({1, 0, 2, -1, 1, 1, 0, 0, 0, 2, 2, 2}, {2, 2, 3}, DType::Float32);
  Tensor y = lin.forward(x);
  ASSERT_EQ(y.shape(), (Shape{2, 2, 2}));
  // rows: [1,0,2] -> [7, 1] + b; [-1,1,1] -> [4, 2] + b; [0,0,0] -> b; [2,2,2] -> [12, 0] + b
  EXPECT_EQ(test::values(y), (std::vector<double>{7.5, 0.5, 4.5, 1.5, 0.5, -0.5, 12.5, -0.5}));
}

TEST(LayerTest, AttentionIsCausal) {
  GptConfig cfg = tinyConfig(false);
  Generator gen(3);
  nn::CausalSelfAttention attn(cfg, gen, kCpuRef, nullptr);
  Tensor x = test::randNormal({1, 6, 16}, DType::Float32, kCpuRef, 7);
  std::vector<double> xv = test::values(x);
  for (size_t i = 4 * 16; i < xv.size(); ++i) xv[i] += 1.0;  // change positions 4 and 5
  Tensor x2 = test::fromDoubles(xv, {1, 6, 16}, DType::Float32);
  auto y = test::values(attn.forward(x));
  auto y2 = test::values(attn.forward(x2));
  for (size_t i = 0; i < 4 * 16; ++i) ASSERT_EQ(y[i], y2[i]) << "position " << i / 16;
  bool changed = false;
  for (size_t i = 4 * 16; i < y.size(); ++i) changed = changed || y[i] != y2[i];
  EXPECT_TRUE(changed);
}

// ---- attention masks through the whole model -----------------------------------------------

GptConfig maskConfig(const std::string& kind, int64_t window = 0) {
  GptConfig c = tinyConfig(false);
  c.seq_len = 16;
  c.attention_mask = kind;
  c.attention_window = window;
  return c;
}

// Logits of a fresh GPT (seed 1) in eval mode for tokens [rows, 16].
Tensor logitsOf(const GptConfig& cfg, Device d, const std::vector<int64_t>& toks) {
  nn::GPT model(cfg, d, 1);
  model.eval();
  NoGradGuard ng;
  return model.forward(test::fromInts(toks, {int64_t(toks.size()) / 16, 16}, DType::Int64, d))
      .logits;
}

// Logit rows (position t of batch row r) of [B, 16, 256] logits.
std::vector<double> at(const Tensor& logits, int64_t r, int64_t t) {
  return test::values(ops::slice(ops::slice(logits, 0, r, r + 1), 1, t, t + 1));
}

class MaskedGpt : public ::testing::TestWithParam<Device> {};

TEST_P(MaskedGpt, PackedDocumentsNeverAttendAcrossDocuments) {
  // Row 0: document 1 at positions 0-6, the separator at 7 opens document 2 (7-15). Row 1: one
  // document. Perturbing document 1 must leave every output of document 2 bit for bit unchanged.
  const Device d = GetParam();
  std::vector<int64_t> a(32);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 'a' + int64_t(i * 7 % 26);
  a[7] = data::kDocumentSeparator;
  std::vector<int64_t> b = a;
  for (size_t i = 1; i < 7; ++i) b[i] = 'A' + int64_t(i);
  const GptConfig packed = maskConfig("causal_document");
  Tensor la = logitsOf(packed, d, a), lb = logitsOf(packed, d, b);
  for (int64_t t = 7; t < 16; ++t)
    EXPECT_EQ(at(la, 0, t), at(lb, 0, t)) << "document 2, position " << t;
  for (int64_t t = 0; t < 16; ++t) EXPECT_EQ(at(la, 1, t), at(lb, 1, t)) << "row 1, position " << t;
  for (int64_t t = 1; t < 7; ++t)
    EXPECT_NE(at(la, 0, t), at(lb, 0, t)) << "document 1, position " << t;
  // The same perturbation reaches document 2 through a plain causal mask: the test can see a leak.
  const GptConfig causal = maskConfig("causal");
  Tensor ca = logitsOf(causal, d, a), cb = logitsOf(causal, d, b);
  for (int64_t t = 7; t < 16; ++t) EXPECT_NE(at(ca, 0, t), at(cb, 0, t)) << "position " << t;
}

TEST_P(MaskedGpt, RowsWithoutSeparatorsGiveTheCausalModelsBits) {
  const Device d = GetParam();
  std::vector<int64_t> a(32);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 'a' + int64_t(i * 5 % 26);
  EXPECT_TRUE(test::bitEqual(logitsOf(maskConfig("causal_document"), d, a),
                             logitsOf(maskConfig("causal"), d, a)));
  // A window as long as the sequence is the causal mask too.
  EXPECT_TRUE(test::bitEqual(logitsOf(maskConfig("sliding_window", 16), d, a),
                             logitsOf(maskConfig("causal"), d, a)));
}

TEST_P(MaskedGpt, SlidingWindowBoundsTheReceptiveField) {
  // Window 2 over 2 layers: position t sees tokens t-2..t. Changing token 0 changes positions
  // 0-2 only.
  const Device d = GetParam();
  std::vector<int64_t> a(16);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 'a' + int64_t(i * 3 % 26);
  std::vector<int64_t> b = a;
  b[0] = 'Z';
  const GptConfig cfg = maskConfig("sliding_window", 2);
  Tensor la = logitsOf(cfg, d, a), lb = logitsOf(cfg, d, b);
  for (int64_t t = 0; t < 3; ++t) EXPECT_NE(at(la, 0, t), at(lb, 0, t)) << "position " << t;
  for (int64_t t = 3; t < 16; ++t) EXPECT_EQ(at(la, 0, t), at(lb, 0, t)) << "position " << t;
  // Global token 0 over a window of 2: every position sees token 0 again.
  GptConfig global = cfg;
  global.attention_mask = "global_sliding_window";
  global.attention_global = 1;
  Tensor ga = logitsOf(global, d, a), gb = logitsOf(global, d, b);
  for (int64_t t = 0; t < 16; ++t) EXPECT_NE(at(ga, 0, t), at(gb, 0, t)) << "position " << t;
}

INSTANTIATE_TEST_SUITE_P(Backends, MaskedGpt, ::testing::Values(test::kCpu, test::kCpuRef),
                         [](const auto& info) {
                           return info.param == test::kCpu ? std::string("cpu")
                                                           : std::string("cpu_ref");
                         });

// Keeps the name and attributes of each flashmask op call.
class MaskAttrRecorder : public Observer {
 public:
  void onOpEnd(const OpEvent& e) override {
    if (e.op->name.rfind("flashmask_attention", 0) == 0)
      calls.push_back({e.op->name, std::string(e.scope), *e.attrs});
  }
  struct Call {
    std::string op, scope;
    Attrs attrs;
  };
  std::vector<Call> calls;
};

TEST(MaskedGptTest, RecordedAttentionCarriesTheMask) {
  GptConfig cfg = maskConfig("causal_document");
  nn::GPT model(cfg, kCpuRef, 1);
  std::vector<int64_t> a(32, 'x');
  a[5] = data::kDocumentSeparator;
  auto rec = std::make_shared<MaskAttrRecorder>();
  {
    ObserverScope guard(rec);
    Tensor idx = test::fromInts(a, {2, 16}, DType::Int64, kCpuRef);
    model.forward(idx, idx).loss.backward();
  }
  ASSERT_EQ(rec->calls.size(), 4u);  // two layers, forward and backward
  for (const auto& c : rec->calls) {
    SCOPED_TRACE(c.op + " " + c.scope);
    EXPECT_EQ(c.attrs.getString("mask"), "causal_document");
    EXPECT_EQ(c.attrs.getDouble("block_sparsity"), 0.0);  // one 64 × 64 tile
    EXPECT_EQ(c.attrs.getString("tile_map"), "p");
    EXPECT_EQ(c.attrs.getInts("tile_shape"), (std::vector<int64_t>{64, 64}));
  }
  EXPECT_EQ(rec->calls[0].scope, "blocks.0.attn");
  EXPECT_EQ(rec->calls[3].op, "flashmask_attention_backward");
}

TEST(ScopeTest, ObserverSeesModulePathsInEveryPhase) {
  nn::GPT model(tinyConfig(false), kCpuRef, 1);
  optim::AdamW opt(model.parameters(), {});
  auto rec = std::make_shared<Recorder>();
  {
    ObserverScope guard(rec);
    auto out = model.forward(tokens({2, 8}, 1), tokens({2, 8}, 2));
    out.loss.backward();
    opt.step();
  }
  std::set<std::pair<std::string, std::string>> fwd;  // (scope, op) in the forward phase
  std::set<std::string> bwdScopes, optScopes;
  for (auto& r : rec->recs) {
    if (r.phase == Phase::Forward) fwd.insert({r.scope, r.op});
    if (r.phase == Phase::Backward) bwdScopes.insert(r.scope);
    if (r.phase == Phase::Optimizer) optScopes.insert(r.scope);
  }
  EXPECT_TRUE(fwd.count({"blocks.1.attn.qkv", "matmul"}));
  EXPECT_TRUE(fwd.count({"blocks.1.attn", "flashmask_attention"}));
  EXPECT_FALSE(fwd.count({"blocks.1.attn", "softmax"})) << "no dense attention";
  EXPECT_TRUE(fwd.count({"blocks.0.mlp", "silu"}));
  EXPECT_TRUE(fwd.count({"blocks.0.mlp.w2", "matmul"}));
  EXPECT_TRUE(fwd.count({"blocks.0.norm1", "layer_norm"}));
  EXPECT_TRUE(fwd.count({"blocks.0", "add"}));
  EXPECT_TRUE(fwd.count({"wte", "embedding"}));
  EXPECT_TRUE(fwd.count({"", "cross_entropy"}));
  EXPECT_TRUE(bwdScopes.count("blocks.1.attn.qkv"));
  EXPECT_TRUE(bwdScopes.count("blocks.0.mlp"));
  EXPECT_TRUE(optScopes.count("blocks.1.attn.qkv.weight"));
  EXPECT_TRUE(optScopes.count("lm_head.weight"));
  // Scope is restored after the forward pass.
  EXPECT_EQ(currentScope(), "");
}

// Initialisation ops (step 0) carry the name of the parameter they make (Note [Initialisation
// scopes]): the op whose output is a parameter has its full name as scope, every construction op
// sits in some parameter's scope, and the scope is "" again afterwards. Dense and MoE.
TEST(ScopeTest, InitialisationOpsCarryTheirParametersName) {
  for (bool moe : {false, true}) {
    struct Out {
      std::string op, scope;
    };
    class ByOutput : public Observer {
     public:
      void onOpEnd(const OpEvent& e) override {
        scopes.insert(std::string(e.scope));
        for (auto& t : e.outputs) last[t.id()] = {e.op->name, std::string(e.scope)};
      }
      std::map<uint64_t, Out> last;  // tensor id -> the last op that wrote it
      std::set<std::string> scopes;
    };
    auto rec = std::make_shared<ByOutput>();
    std::optional<nn::GPT> model;
    {
      ObserverScope guard(rec);
      model.emplace(tinyConfig(moe), kCpuRef, 1);
    }
    EXPECT_EQ(currentScope(), "");
    std::set<std::string> names;
    for (auto& [name, t] : model->namedParameters()) {
      names.insert(name);
      auto it = rec->last.find(t.id());
      ASSERT_NE(it, rec->last.end()) << name << " was not made by an op";
      EXPECT_EQ(it->second.scope, name) << it->second.op << " making " << name;
    }
    EXPECT_TRUE(names.count(moe ? "blocks.0.moe.experts.1.w2.weight" : "blocks.0.mlp.w2.weight"));
    for (const std::string& sc : rec->scopes)
      EXPECT_TRUE(names.count(sc)) << "construction op outside a parameter's scope: '" << sc << "'";
  }
}

// position "rope": no wpe; every attention layer turns q and k with the rope op (twice per layer
// forward), and its gradients flow back through rope turned back.
TEST(ScopeTest, RopePositionRotatesQAndKInEveryAttentionAndHasNoWpe) {
  GptConfig cfg = tinyConfig(false);
  cfg.position = "rope";
  nn::GPT model(cfg, kCpuRef, 1);
  std::set<std::string> names;
  for (auto& [n, t] : model.namedParameters()) names.insert(n);
  EXPECT_FALSE(names.count("wpe.weight"));
  EXPECT_EQ(names.size(), 1u + 2u * 9u + 2u + 1u);
  auto rec = std::make_shared<Recorder>();
  {
    ObserverScope guard(rec);
    model.forward(tokens({2, 8}, 1), tokens({2, 8}, 2)).loss.backward();
  }
  std::map<std::pair<std::string, Phase>, int> ropes;
  int embeddings = 0;
  for (auto& r : rec->recs) {
    if (r.op == "rope") {
      ++ropes[{r.scope, r.phase}];
      EXPECT_EQ(r.outShapes, (std::vector<Shape>{{2, 8, 2, 8}}));
    }
    if (r.op == "embedding" && r.phase == Phase::Forward) ++embeddings;
  }
  for (const char* attn : {"blocks.0.attn", "blocks.1.attn"}) {
    EXPECT_EQ((ropes[{attn, Phase::Forward}]), 2) << attn;
    EXPECT_EQ((ropes[{attn, Phase::Backward}]), 2) << attn;
  }
  EXPECT_EQ(embeddings, 1) << "only wte";
}

// Note [Vocabulary-parallel embedding and loss]: in a group of one (the whole vocabulary in one
// block) the cross entropy built from all-reduced maxima, exp sums and target logits is
// ops::crossEntropy's, value and gradient (the multi-rank split: KeelRanks in
// cli_ranks_test.cpp).
TEST(LayerTest, VocabParallelCrossEntropyAloneIsCrossEntropy) {
  const std::vector<double> v = {0.5,  -1.0, 2.0,  0.25, 3.0,  -0.5, 1.5,  1.5,
                                 -2.0, 0.0,  0.75, 4.0,  -3.0, 2.5,  0.1,  -0.1,
                                 1.0,  1.25, 0.0,  -4.0, 3.5,  -1.5, 2.25, 0.5};
  const Tensor targets = test::fromInts({0, 5, 2, 3}, {4});
  Tensor a = test::fromDoubles(v, {4, 6}, DType::Float64),
         b = test::fromDoubles(v, {4, 6}, DType::Float64);
  a.setRequiresGrad();
  b.setRequiresGrad();
  const Tensor la = nn::vocabParallelCrossEntropy(a, targets, 0, "tp");
  const Tensor lb = ops::crossEntropy(b, targets);
  EXPECT_NEAR(la.item(), lb.item(), 1e-12);
  la.backward();
  lb.backward();
  const std::vector<double> ga = test::values(a.grad()), gb = test::values(b.grad());
  ASSERT_EQ(ga.size(), gb.size());
  for (size_t i = 0; i < ga.size(); ++i) EXPECT_NEAR(ga[i], gb[i], 1e-12) << i;
  // Bad inputs: one line naming the shapes.
  EXPECT_THROW(nn::vocabParallelCrossEntropy(a, test::fromInts({0, 1, 2}, {3}), 0, "tp"), Error);
}

// One rank's block of a larger vocabulary, alone: columns [10, 16). A target in the block counts
// its logit (at target - 10), one outside contributes none (another rank's block would), one
// equal to the ignore index is left out of the mean: loss = (sum over counted rows of
// logsumexp(row) - the target's logit if held) / counted rows, gradient (softmax - one-hot if
// held) / counted rows, zero for the ignored row.
TEST(LayerTest, VocabParallelCrossEntropyOfOneBlockHoldsOnlyItsTargets) {
  const std::vector<double> v = {0.5,  -1.0, 2.0,  0.25, 3.0,  -0.5, 1.5,  1.5,
                                 -2.0, 0.0,  0.75, 4.0,  -3.0, 2.5,  0.1,  -0.1,
                                 1.0,  1.25, 0.0,  -4.0, 3.5,  -1.5, 2.25, 0.5};
  Tensor a = test::fromDoubles(v, {4, 6}, DType::Float64);
  a.setRequiresGrad();
  // Row 0: target 10 (column 0); row 1: 15 (column 5); row 2: 3, another rank's; row 3 ignored.
  const Tensor loss =
      nn::vocabParallelCrossEntropy(a, test::fromInts({10, 15, 3, -100}, {4}), 10, "tp");
  const int held[4] = {0, 5, -1, -2};
  double want = 0;
  std::vector<double> grad(24, 0.0);
  for (int r = 0; r < 3; ++r) {
    double m = -1e300, s = 0;
    for (int c = 0; c < 6; ++c) m = std::max(m, v[size_t(r * 6 + c)]);
    for (int c = 0; c < 6; ++c) s += std::exp(v[size_t(r * 6 + c)] - m);
    want += std::log(s) + m - (held[r] >= 0 ? v[size_t(r * 6 + held[r])] : m);
    for (int c = 0; c < 6; ++c)
      grad[size_t(r * 6 + c)] =
          (std::exp(v[size_t(r * 6 + c)] - m) / s - (c == held[r] ? 1.0 : 0.0)) / 3.0;
  }
  EXPECT_NEAR(loss.item(), want / 3.0, 1e-12);
  loss.backward();
  const std::vector<double> g = test::values(a.grad());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], grad[i], 1e-12) << i;
}

TEST(MoeTest, AuxLossOnHandMadeRouting) {
  // probs [4, 3]; top-1 choices [0, 1, 2, 0] -> f = [0.5, 0.25, 0.25];
  // P = column means = [0.4, 0.35, 0.25]; aux = 3 * (0.2 + 0.0875 + 0.0625) = 1.05.
  Tensor probs = test::fromDoubles({0.7, 0.2, 0.1, 0.1, 0.6, 0.3, 0.2, 0.3, 0.5, 0.6, 0.3, 0.1},
                                   {4, 3}, DType::Float64);
  probs.setRequiresGrad();
  Tensor idx = test::fromInts({0, 1, 2, 0}, {4, 1});
  Tensor aux = nn::loadBalancingLoss(probs, idx);
  EXPECT_NEAR(aux.item(), 1.05, 1e-6);
  aux.backward();
  // d aux / d probs[n, e] = E * f_e / N.
  auto g = test::values(probs.grad());
  for (int n = 0; n < 4; ++n) {
    EXPECT_NEAR(g[size_t(n * 3 + 0)], 0.375, 1e-12);
    EXPECT_NEAR(g[size_t(n * 3 + 1)], 0.1875, 1e-12);
    EXPECT_NEAR(g[size_t(n * 3 + 2)], 0.1875, 1e-12);
  }
  // Perfectly uniform routing gives 1.
  Tensor uni = test::fromDoubles(std::vector<double>(8, 0.25), {2, 4}, DType::Float64);
  Tensor uidx = test::fromInts({0, 1, 2, 3}, {2, 2});
  EXPECT_NEAR(nn::loadBalancingLoss(uni, uidx).item(), 1.0, 1e-12);
}

TEST(MoeTest, CapacityDropsLateTokens) {
  GptConfig cfg = tinyConfig(true);  // 4 experts, top-2, capacity factor 1
  Generator gen(5);
  nn::MoE moe(cfg, gen, kCpuRef);
  // A zero router gives equal probabilities: every token picks experts 0 and 1 (ties -> lower
  // index). 8 tokens, capacity ceil(1 * 8 * 2 / 4) = 4: tokens 0..3 are kept, 4..7 dropped.
  for (auto& [n, t] : moe.namedParameters())
    if (n == "router.weight") setValues(t, std::vector<float>(size_t(t.numel()), 0.0f));
  EXPECT_EQ(moe.capacity(8), 4);
  Tensor x = test::randNormal({1, 8, 16}, DType::Float32, kCpuRef, 11);
  auto y = test::values(moe.forward(x));
  EXPECT_EQ(moe.lastExpertTokens(), (std::vector<int64_t>{4, 4, 0, 0}));
  EXPECT_EQ(moe.lastDropped(), 8);
  for (int t = 0; t < 8; ++t) {
    double mag = 0;
    for (int c = 0; c < 16; ++c) mag += std::abs(y[size_t(t * 16 + c)]);
    if (t < 4)
      EXPECT_GT(mag, 0.0) << "token " << t << " was routed";
    else
      EXPECT_EQ(mag, 0.0) << "token " << t << " was dropped";
  }
  // f = [0.5, 0.5, 0, 0], P = 0.25 each: aux = 4 * (0.125 + 0.125) = 1.
  EXPECT_NEAR(moe.auxLoss().item(), 1.0, 1e-6);
}

TEST(MoeTest, ExpertShapesChangeFromStepToStep) {
  GptConfig cfg = tinyConfig(true);
  cfg.capacity_factor = 2.0;  // no drops: every assignment is kept
  Generator gen(9);
  nn::MoE moe(cfg, gen, kCpuRef);
  for (auto& [n, t] : moe.namedParameters())  // a decisive router
    if (n == "router.weight") {
      auto v = test::values(test::randNormal(t.shape(), DType::Float32, kCpuRef, 4));
      setValues(t, std::vector<float>(v.begin(), v.end()));
    }
  std::vector<std::vector<int64_t>> counts;
  std::vector<std::vector<Shape>> gathered;
  for (uint64_t step = 0; step < 3; ++step) {
    auto rec = std::make_shared<Recorder>();
    {
      ObserverScope guard(rec);
      Tensor x = test::randNormal({2, 8, 16}, DType::Float32, kCpuRef, 100 + step);
      moe.forward(x);
    }
    std::vector<Shape> shapes;
    for (auto& r : rec->recs)
      if (r.op == "index_select" && r.scope == "" && r.outShapes[0].size() == 2)
        shapes.push_back(r.outShapes[0]);
    int64_t total = 0;
    for (int64_t c : moe.lastExpertTokens()) total += c;
    EXPECT_EQ(total, 16 * 2) << "all assignments kept";
    EXPECT_EQ(moe.lastDropped(), 0);
    counts.push_back(moe.lastExpertTokens());
    gathered.push_back(shapes);
  }
  EXPECT_TRUE(counts[0] != counts[1] || counts[1] != counts[2]) << "routing never changed";
  EXPECT_TRUE(gathered[0] != gathered[1] || gathered[1] != gathered[2]);
}

TEST(MoeTest, BackwardReachesRouterAndExperts) {
  nn::GPT model(tinyConfig(true), kCpuRef, 2);
  auto out = model.forward(tokens({2, 8}, 3), tokens({2, 8}, 4));
  ASSERT_TRUE(out.auxLoss.defined());
  out.loss.backward();
  for (auto& [n, t] : model.namedParameters()) {
    if (n.find("router") != std::string::npos) {
      EXPECT_TRUE(t.grad().defined()) << n;
    }
  }
  EXPECT_NEAR(out.loss.item(), out.lmLoss.item() + 0.01 * out.auxLoss.item(), 1e-5);
}

TEST(OptimTest, ClipGradNormScalesToMaxNorm) {
  Tensor a = test::fromDoubles({3, 0}, {2}, DType::Float32);
  Tensor b = test::fromDoubles({0, 4}, {1, 2}, DType::Float32);
  Tensor c = test::fromDoubles({9}, {1}, DType::Float32);  // no gradient: skipped
  a.setRequiresGrad();
  b.setRequiresGrad();
  c.setRequiresGrad();
  a.setGrad(test::fromDoubles({3, 0}, {2}, DType::Float32));
  b.setGrad(test::fromDoubles({0, 4}, {1, 2}, DType::Float32));
  EXPECT_NEAR(optim::clipGradNorm({a, b, c}, 10.0), 5.0, 1e-6);
  EXPECT_EQ(test::values(a.grad()), (std::vector<double>{3, 0}));  // under the limit: unchanged
  EXPECT_NEAR(optim::clipGradNorm({a, b, c}, 1.0), 5.0, 1e-6);
  EXPECT_NEAR(test::values(a.grad())[0], 0.6, 1e-6);
  EXPECT_NEAR(test::values(b.grad())[1], 0.8, 1e-6);
  EXPECT_FALSE(c.grad().defined());
}

TEST(OptimTest, AdamWFirstStepMovesByLr) {
  Tensor w = test::fromDoubles({1.0, -2.0, 0.5, 0.0}, {2, 2}, DType::Float32);
  Tensor n = test::fromDoubles({1.0, 1.0}, {2}, DType::Float32);
  w.setRequiresGrad();
  n.setRequiresGrad();
  w.setGrad(test::fromDoubles({0.5, -0.25, 2.0, 0.0}, {2, 2}, DType::Float32));
  optim::AdamWOptions o;
  o.lr = 0.1;
  o.weightDecay = 0.0;
  optim::AdamW opt({w, n}, o);
  opt.step();
  // First AdamW step: m̂ = g, v̂ = g², update = lr · g / (|g| + eps) ≈ lr · sign(g).
  auto v = test::values(w);
  EXPECT_NEAR(v[0], 0.9, 1e-6);
  EXPECT_NEAR(v[1], -1.9, 1e-6);
  EXPECT_NEAR(v[2], 0.4, 1e-6);
  EXPECT_NEAR(v[3], 0.0, 1e-6);
  EXPECT_EQ(test::values(n), (std::vector<double>{1.0, 1.0})) << "no grad: untouched";
  EXPECT_EQ(opt.stepCount(0), 1);
  EXPECT_EQ(opt.stepCount(1), 0);
}

TEST(OptimTest, SgdMomentumMatchesHandComputation) {
  Tensor w = test::fromDoubles({1.0}, {1}, DType::Float32);
  w.setRequiresGrad();
  optim::SGD opt({w}, optim::SgdOptions{0.1, 0.9, 0.0, false});
  w.setGrad(test::fromDoubles({1.0}, {1}, DType::Float32));
  opt.step();  // b = 1, w = 1 - 0.1
  EXPECT_NEAR(w.item(), 0.9, 1e-6);
  opt.step();  // b = 0.9 + 1 = 1.9, w = 0.9 - 0.19
  EXPECT_NEAR(w.item(), 0.71, 1e-6);
  opt.zeroGrad();
  EXPECT_FALSE(w.grad().defined());
}

TEST(ScheduleTest, WarmupThenCosine) {
  optim::LrSchedule s{1.0, 0.1, 10, 111};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);           // peak right after warmup
  EXPECT_NEAR(s.at(60), 0.1 + 0.45, 1e-12);  // half-way through the decay
  EXPECT_NEAR(s.at(35), 0.1 + 0.45 * (1 + std::cos(std::numbers::pi * 0.25)), 1e-12);
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);  // last step reaches min_lr
  EXPECT_DOUBLE_EQ(s.at(500), 0.1);  // and stays there
  for (int64_t i = 10; i < 110; ++i) EXPECT_GE(s.at(i), s.at(i + 1)) << "monotone decay at " << i;

  optim::LrSchedule noWarmup{2.0, 0.0, 0, 3};
  EXPECT_DOUBLE_EQ(noWarmup.at(0), 2.0);
  EXPECT_NEAR(noWarmup.at(1), 1.0, 1e-12);
  EXPECT_NEAR(noWarmup.at(2), 0.0, 1e-12);
  optim::LrSchedule single{0.5, 0.05, 0, 1};
  EXPECT_DOUBLE_EQ(single.at(0), 0.5);
}

}  // namespace
}  // namespace keel
