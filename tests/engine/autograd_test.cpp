// Autograd engine and observer seam: gradient accumulation, retainGraph, no-grad mode, hooks,
// saved tensors (their ids, in-place modification), and what observers see (phases, the backward ->
// forward op link, scope paths). Runs on cpu-ref; the backends' arithmetic is checked elsewhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "keel/autograd.h"
#include "keel/dispatch.h"
#include "keel/log.h"
#include "keel/observer.h"
#include "keel/registry.h"
#include "keel/step.h"
#include "test_util.h"

namespace keel::test {
namespace {

constexpr DType F64 = DType::Float64;

Tensor leaf(std::vector<double> v) {
  Tensor t = fromDoubles(v, {int64_t(v.size())}, F64, kCpuRef);
  t.setRequiresGrad(true);
  return t;
}

// ---------------------------------------------------------------- undefined tensors

// Every accessor of an undefined Tensor (default-constructed, moved from, a grad() before
// backward) throws keel::Error: they dereferenced null (a segfault), printing a gradient before
// backward included.
TEST(Autograd, AnUndefinedTensorThrowsInsteadOfCrashing) {
  Tensor w = leaf({1, 2});
  const Tensor g = w.grad();
  ASSERT_FALSE(g.defined());
  EXPECT_EQ(g.toString(), "Tensor(undefined)");
  const std::string why =
      "use of an undefined Tensor (default-constructed, moved from, or a grad() before "
      "backward): check defined() first";
  EXPECT_EQ(errorOf([&] { (void)g.dim(); }), why);
  EXPECT_EQ(errorOf([&] { (void)g.numel(); }), why);
  EXPECT_EQ(errorOf([&] { (void)g.dtype(); }), why);
  EXPECT_EQ(errorOf([&] { (void)g.device(); }), why);
  EXPECT_EQ(errorOf([&] { (void)g.size(0); }), why);
  EXPECT_EQ(errorOf([&] { (void)g.isContiguous(); }), why);
  EXPECT_EQ(errorOf([&] { (void)g.grad(); }), why);
  EXPECT_EQ(errorOf([&] { (void)g.toVector<float>(); }), why);
  EXPECT_EQ(errorOf([&] { (void)g.item(); }), why);
  EXPECT_EQ(errorOf([&] { (void)g.id(); }), why);
  EXPECT_EQ(errorOf([&] { (void)g.isLeaf(); }), why);
  EXPECT_EQ(errorOf([&] { (void)g.detach(); }), why);
  EXPECT_EQ(errorOf([&] { (void)g.contiguous(); }), why);
  EXPECT_EQ(errorOf([&] { (void)hostCopy(g); }), why);
  Tensor u;
  EXPECT_EQ(errorOf([&] { u.setRequiresGrad(); }), why);
  EXPECT_EQ(errorOf([&] { u.backward(); }), "backward() of an undefined Tensor");
  EXPECT_FALSE(u.requiresGrad());
}

// Integers print exactly (2147483647 printed as 2.14748e+09).
TEST(Autograd, IntegerTensorsPrintExactly) {
  const Tensor t = Tensor::fromVector(std::vector<int64_t>{1234567, 2147483647}, {2});
  EXPECT_EQ(t.toString(), "Tensor([2], int64, cpu, [1234567, 2147483647])");
}

// A backward rule must return one gradient per input (undefined where there is none): a rule
// returning another count was padded or cut without a word.
TEST(Autograd, ABackwardRuleReturningTheWrongNumberOfGradientsIsAnError) {
  OpDef d;
  d.name = "test_identity_no_grads";
  d.numInputs = 1;
  d.infer = [](const OpDef&, std::span<const Tensor> in, const Attrs&) {
    return std::vector<TensorMeta>{{in[0].shape(), in[0].dtype()}};
  };
  d.backward = [](const BackwardCtx&) { return std::vector<Tensor>{}; };
  Registry& r = Registry::get();
  const int id = r.add(std::move(d));
  r.setKernel(
      id, Backend::CpuRef,
      [](const KernelCtx& c) {
        std::memcpy(c.outputs[0].data(), c.inputs[0].data(), c.inputs[0].nbytes());
      },
      kFloatTypes);
  Tensor w = leaf({1, 2, 3});
  Tensor y = dispatch(id, {w})[0];
  EXPECT_EQ(errorOf([&] { ops::sum(y).backward(); }),
            "backward of op 'test_identity_no_grads' returned 0 gradients for 1 input (one per "
            "input, undefined where there is none)");
}

// Note [No backward rule]: a gradient reaching an op that has no backward rule fails the backward
// pass, naming the op (it stopped there in silence, and the weights before it never trained).
// Without a gradient through it — under NoGradGuard, or beside the loss's path — nothing fails.
TEST(Autograd, AGradientReachingAnOpWithoutABackwardRuleIsAnError) {
  OpDef d;
  d.name = "test_double_no_backward";
  d.numInputs = 1;
  d.infer = [](const OpDef&, std::span<const Tensor> in, const Attrs&) {
    return std::vector<TensorMeta>{{in[0].shape(), in[0].dtype()}};
  };
  Registry& r = Registry::get();
  const int id = r.add(std::move(d));
  r.setKernel(
      id, Backend::CpuRef,
      [](const KernelCtx& c) {
        const double* in = static_cast<const double*>(c.inputs[0].data());
        double* out = static_cast<double*>(c.outputs[0].data());
        for (int64_t i = 0; i < c.inputs[0].numel(); ++i) out[i] = 2 * in[i];
      },
      dtypeBit(DType::Float64));
  Tensor w = leaf({1, 2, 3});
  Tensor y = dispatch(id, {w})[0];
  EXPECT_TRUE(y.requiresGrad());
  const std::string want = "backward through op 'test_double_no_backward' (#";
  const std::string why = errorOf([&] { ops::sum(y).backward(); });
  EXPECT_EQ(why.rfind(want, 0), 0u) << why;
  EXPECT_NE(why.find("): it has no backward rule, and a gradient reached its output; register one "
                     "(OpDef::backward), or call it under keel::NoGradGuard, or on detached "
                     "inputs, if no gradient should pass"),
            std::string::npos)
      << why;
  EXPECT_FALSE(w.grad().defined());
  {
    NoGradGuard ng;
    EXPECT_FALSE(dispatch(id, {w})[0].requiresGrad());
  }
  // Beside the loss's path: the gradient of w through the other branch is computed.
  Tensor side = dispatch(id, {w})[0];
  ops::sum(ops::mul(w, w)).backward();
  EXPECT_EQ(w.grad().toVector<double>(), (std::vector<double>{2, 4, 6}));
  EXPECT_TRUE(side.requiresGrad());
  // Comparisons have no backward rule and boolean outputs: no gradient can reach them.
  EXPECT_FALSE(ops::gt(w, w).requiresGrad());
}

// ---------------------------------------------------------------- gradients
TEST(Autograd, GradientsAccumulateAcrossTwoBackwardCalls) {
  Tensor x = leaf({1, 2, 3});
  Tensor c = fromDoubles({0.5, -1, 4}, {3});
  ops::sum(ops::mul(x, c)).backward();
  EXPECT_EQ(x.grad().toVector<double>(), (std::vector<double>{0.5, -1, 4}));
  ops::sum(ops::mul(x, c)).backward();  // a fresh graph: adds to .grad
  EXPECT_EQ(x.grad().toVector<double>(), (std::vector<double>{1, -2, 8}));
  x.setGrad(Tensor());
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, ScalarRootSeedsWithOneAndNonScalarRootNeedsAGradient) {
  Tensor x = leaf({1, 2});
  Tensor y = ops::mul(x, x);
  EXPECT_THROW(y.backward(), Error);
  y.backward(fromDoubles({1, 10}, {2}));
  EXPECT_EQ(x.grad().toVector<double>(), (std::vector<double>{2, 40}));
}

TEST(Autograd, SecondBackwardWithoutRetainGraphThrows) {
  Tensor x = leaf({0.5, 1.5});
  Tensor y = ops::sum(ops::exp(x));
  y.backward();
  try {
    y.backward();
    FAIL() << "second backward through a freed graph did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("retainGraph"), std::string::npos) << e.what();
  }
}

TEST(Autograd, RetainGraphAllowsASecondBackwardThatDoublesTheGrads) {
  Tensor x = leaf({0.5, 1.5, -2});
  Tensor y = ops::sum(ops::mul(ops::exp(x), x));  // d/dx = e^x (1 + x)
  y.backward({}, true);
  std::vector<double> g1 = x.grad().toVector<double>();
  for (size_t i = 0; i < 3; ++i) {
    double xi = std::vector<double>{0.5, 1.5, -2}[i];
    EXPECT_NEAR(g1[i], std::exp(xi) * (1 + xi), 1e-14);
  }
  y.backward({}, true);
  std::vector<double> g2 = x.grad().toVector<double>();
  // Two paths reach x, so the sums associate differently: equal up to rounding.
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(g2[i], 2 * g1[i], 1e-14 * std::fabs(g1[i]));
  y.backward();  // the last one may free the graph
  EXPECT_THROW(y.backward(), Error);
}

TEST(Autograd, DiamondGraphSumsBothPaths) {
  Tensor x = leaf({3});
  Tensor a = ops::mul(x, x);  // 2x
  Tensor b = ops::exp(x);     // e^x
  ops::sum(ops::add(a, b)).backward();
  EXPECT_NEAR(x.grad().item(), 6 + std::exp(3.0), 1e-12);
}

TEST(Autograd, NoGradGuardRecordsNoNode) {
  Tensor x = leaf({1, 2});
  {
    NoGradGuard ng;
    EXPECT_FALSE(gradEnabled());
    Tensor y = ops::exp(x);
    EXPECT_FALSE(y.requiresGrad());
    EXPECT_EQ(y.gradFn(), nullptr);
    {
      NoGradGuard nested;
      EXPECT_FALSE(gradEnabled());
    }
    EXPECT_FALSE(gradEnabled());
  }
  EXPECT_TRUE(gradEnabled());
  Tensor z = ops::exp(x);
  EXPECT_TRUE(z.requiresGrad());
  ASSERT_NE(z.gradFn(), nullptr);
  EXPECT_EQ(z.gradFn()->name(), "exp");
}

TEST(Autograd, OpsOnTensorsThatNeedNoGradRecordNothing) {
  Tensor a = fromDoubles({1, 2}, {2});
  Tensor y = ops::exp(a);
  EXPECT_FALSE(y.requiresGrad());
  EXPECT_EQ(y.gradFn(), nullptr);
  EXPECT_THROW(ops::sum(y).backward(), Error);
}

TEST(Autograd, IntegerOutputsOfADifferentiableOpDoNotRequireGrad) {
  Tensor x = leaf({3, 1, 2});
  auto [v, i] = ops::topk(x, 2);
  EXPECT_TRUE(v.requiresGrad());
  EXPECT_FALSE(i.requiresGrad());
  ops::sum(v).backward();
  EXPECT_EQ(x.grad().toVector<double>(), (std::vector<double>{1, 0, 1}));
}

TEST(Autograd, LeafHookReplacesTheGradient) {
  Tensor x = leaf({1, 2});
  std::vector<double> seen;
  x.registerHook([&](const Tensor& g) {
    seen = g.toVector<double>();
    return ops::mul(g, fromDoubles({10, 100}, {2}));
  });
  ops::sum(ops::mul(x, fromDoubles({3, -1}, {2}))).backward();
  EXPECT_EQ(seen, (std::vector<double>{3, -1}));
  EXPECT_EQ(x.grad().toVector<double>(), (std::vector<double>{30, -100}));
}

// A hook sees "this tensor's gradient" (tensor.h): the sum over every use of the leaf, once.
TEST(Autograd, LeafHookRunsOnceWithTheSummedGradient) {
  Tensor x = leaf({1, 2});
  std::vector<std::vector<double>> seen;
  x.registerHook([&](const Tensor& g) {
    seen.push_back(g.toVector<double>());
    return Tensor();
  });
  ops::sum(ops::mul(x, x)).backward();  // two uses of x: contributions [1, 2] + [1, 2]
  EXPECT_EQ(seen, (std::vector<std::vector<double>>{{2, 4}}));
  EXPECT_EQ(x.grad().toVector<double>(), (std::vector<double>{2, 4}));
}

TEST(Autograd, NonLeafHookReplacesTheGradientFlowingUpstream) {
  Tensor x = leaf({1, 2});
  Tensor h = ops::mul(x, fromDoubles({3, 3}, {2}));  // dh/dx = 3
  std::vector<double> seen;
  h.registerHook([&](const Tensor& g) {
    seen = g.toVector<double>();
    return fromDoubles({1, -1}, {2});
  });
  ops::sum(ops::mul(h, h)).backward();  // dL/dh = 2h = [6, 12]
  EXPECT_EQ(seen, (std::vector<double>{6, 12}));
  EXPECT_EQ(x.grad().toVector<double>(), (std::vector<double>{3, -3}));
}

TEST(Autograd, HookReturningUndefinedKeepsTheGradient) {
  Tensor x = leaf({1, 2});
  int calls = 0;
  x.registerHook([&](const Tensor&) {
    ++calls;
    return Tensor();
  });
  ops::sum(ops::mul(x, fromDoubles({5, 6}, {2}))).backward();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(x.grad().toVector<double>(), (std::vector<double>{5, 6}));
}

TEST(Autograd, SavedTensorModifiedInPlaceRaisesOnBackward) {
  Tensor x = leaf({1, 2, 3});
  Tensor y = ops::sum(ops::mul(x, x));  // mul saves x
  uint64_t v0 = x.version();
  {
    NoGradGuard ng;
    PhaseGuard pg(Phase::Optimizer);
    ops::sgdStep(x, fromDoubles({1, 1, 1}, {3}), fromDoubles({0, 0, 0}, {3}), 0.1, 0.0, 0.0, false);
  }
  EXPECT_GT(x.version(), v0);
  try {
    y.backward();
    FAIL() << "backward through a saved tensor modified in place did not throw";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("mul"), std::string::npos) << m;
    EXPECT_NE(m.find("in place"), std::string::npos) << m;
  }
}

TEST(Autograd, DetachSharesStorageButLeavesTheGraph) {
  Tensor x = leaf({1, 2});
  Tensor y = ops::exp(x);
  Tensor d = y.detach();
  EXPECT_FALSE(d.requiresGrad());
  EXPECT_EQ(d.buffer(), y.buffer());
  EXPECT_NE(d.id(), y.id());
}

// A grad node's saved tensors are the forward tensors under their own ids (so a recording links a
// backward op's read to the forward op that wrote it), without their autograd state.
TEST(Autograd, SavedTensorsKeepTheForwardIdsOutsideTheGraph) {
  Tensor x = leaf({1, 2});
  Tensor y = ops::exp(x);
  const Node& n = *y.gradFn();
  ASSERT_EQ(n.inputs.size(), 1u);
  ASSERT_EQ(n.outputs.size(), 1u);
  EXPECT_EQ(n.inputs[0].id(), x.id());
  EXPECT_EQ(n.outputs[0].id(), y.id());
  EXPECT_EQ(n.inputs[0].buffer(), x.buffer());
  EXPECT_EQ(n.outputs[0].buffer(), y.buffer());
  EXPECT_FALSE(n.inputs[0].requiresGrad());
  EXPECT_FALSE(n.outputs[0].requiresGrad());
  EXPECT_TRUE(n.outputs[0].isLeaf());
}

TEST(Autograd, GradientOfAViewReachesTheBase) {
  Tensor x = leaf({1, 2, 3, 4, 5, 6});
  Tensor v = ops::slice(ops::reshape(x, {2, 3}), 1, 1, 3);  // [[2,3],[5,6]]
  ops::sum(ops::mul(v, v)).backward();
  EXPECT_EQ(x.grad().toVector<double>(), (std::vector<double>{0, 4, 6, 0, 10, 12}));
}

// ---------------------------------------------------------------- observers
struct Seen {
  uint64_t seq, forwardSeq;
  std::string op;
  Phase phase;
  std::string scope;
  size_t inputs, outputs;
  int64_t beginNs, endNs;
};

class Recorder : public Observer {
 public:
  std::vector<Seen> begins, ends;
  std::vector<MemEvent> mem;
  void onOpBegin(const OpEvent& e) override { begins.push_back(toSeen(e)); }
  void onOpEnd(const OpEvent& e) override { ends.push_back(toSeen(e)); }
  void onMemory(const MemEvent& e) override { mem.push_back(e); }
  std::vector<Seen> phase(Phase p) const {
    std::vector<Seen> r;
    for (auto& s : ends)
      if (s.phase == p) r.push_back(s);
    return r;
  }
  const Seen* find(const std::string& op) const {
    for (auto& s : ends)
      if (s.op == op) return &s;
    return nullptr;
  }

 private:
  static Seen toSeen(const OpEvent& e) {
    return Seen{e.seq,           e.forwardSeq,     e.op->name, e.phase, std::string(e.scope),
                e.inputs.size(), e.outputs.size(), e.beginNs,  e.endNs};
  }
};

// Installs an observer for the scope of a test.
struct ObserverScope {
  std::shared_ptr<Recorder> rec = std::make_shared<Recorder>();
  ObserverScope() { addObserver(rec); }
  ~ObserverScope() { removeObserver(rec); }
};

TEST(Observer, ForwardOpsReportPhaseForwardInIssueOrder) {
  Tensor x = leaf({1, 2});
  ObserverScope obs;
  Tensor y = ops::exp(x);
  Tensor z = ops::add(y, x);
  ASSERT_EQ(obs.rec->ends.size(), 2u);
  EXPECT_EQ(obs.rec->ends[0].op, "exp");
  EXPECT_EQ(obs.rec->ends[1].op, "add");
  EXPECT_LT(obs.rec->ends[0].seq, obs.rec->ends[1].seq);
  for (auto& s : obs.rec->ends) {
    EXPECT_EQ(s.phase, Phase::Forward);
    EXPECT_EQ(s.forwardSeq, 0u);
    EXPECT_EQ(s.outputs, 1u);
    EXPECT_LE(s.beginNs, s.endNs);
  }
  EXPECT_EQ(obs.rec->ends[1].inputs, 2u);
}

TEST(Observer, BeginPrecedesEndWithTheSameSeqAndNoOutputsYet) {
  Tensor x = leaf({1});
  ObserverScope obs;
  ops::exp(x);
  ASSERT_EQ(obs.rec->begins.size(), 1u);
  ASSERT_EQ(obs.rec->ends.size(), 1u);
  EXPECT_EQ(obs.rec->begins[0].seq, obs.rec->ends[0].seq);
  EXPECT_EQ(obs.rec->begins[0].outputs, 0u);
  EXPECT_EQ(obs.rec->begins[0].endNs, 0);
  EXPECT_EQ(obs.rec->ends[0].outputs, 1u);
}

TEST(Observer, BackwardOpsOfExpReportExpsSeqAsForwardSeq) {
  Tensor x = leaf({0.5, -1});
  ObserverScope obs;
  Tensor y = ops::exp(x);
  const Seen* e = obs.rec->find("exp");
  ASSERT_NE(e, nullptr);
  uint64_t expSeq = e->seq;
  y.backward(fromDoubles({1, 2}, {2}));
  std::vector<Seen> back = obs.rec->phase(Phase::Backward);
  ASSERT_FALSE(back.empty()) << "exp's backward rule ran no op";
  for (auto& s : back) {
    EXPECT_EQ(s.forwardSeq, expSeq) << "backward op '" << s.op << "'";
    EXPECT_GT(s.seq, expSeq);
  }
}

TEST(Observer, EachBackwardOpLinksToTheForwardOpItDifferentiates) {
  Tensor x = leaf({0.5, -1, 2});
  ObserverScope obs;
  Tensor y = ops::exp(x);
  Tensor l = ops::sum(ops::mul(y, y));
  uint64_t expSeq = obs.rec->find("exp")->seq, mulSeq = obs.rec->find("mul")->seq,
           sumSeq = obs.rec->find("sum")->seq;
  size_t nForward = obs.rec->ends.size();
  l.backward();
  std::map<uint64_t, int> perForward;
  uint64_t lastLinked = UINT64_MAX;
  for (size_t i = nForward; i < obs.rec->ends.size(); ++i) {
    const Seen& s = obs.rec->ends[i];
    EXPECT_EQ(s.phase, Phase::Backward) << s.op;
    EXPECT_TRUE(s.forwardSeq == 0 || s.forwardSeq == expSeq || s.forwardSeq == mulSeq ||
                s.forwardSeq == sumSeq)
        << "backward op '" << s.op << "' links to seq " << s.forwardSeq;
    ++perForward[s.forwardSeq];
    if (s.forwardSeq != 0) {  // nodes run latest forward op first
      EXPECT_LE(s.forwardSeq, lastLinked);
      lastLinked = s.forwardSeq;
    }
  }
  EXPECT_GT(perForward[sumSeq], 0);
  EXPECT_GT(perForward[mulSeq], 0);
  EXPECT_GT(perForward[expSeq], 0);
}

TEST(Observer, OptimizerOpsReportPhaseOptimizer) {
  Tensor p = fromDoubles({1, 2}, {2}), g = fromDoubles({1, 1}, {2}), b = fromDoubles({0, 0}, {2});
  ObserverScope obs;
  {
    PhaseGuard pg(Phase::Optimizer);
    ops::sgdStep(p, g, b, 0.5, 0.0, 0.0, false);
  }
  ops::exp(p);
  ASSERT_EQ(obs.rec->ends.size(), 2u);
  EXPECT_EQ(obs.rec->ends[0].op, "sgd_step");
  EXPECT_EQ(obs.rec->ends[0].phase, Phase::Optimizer);
  EXPECT_EQ(obs.rec->ends[0].outputs, 0u);
  EXPECT_EQ(obs.rec->ends[1].phase, Phase::Forward);
}

TEST(Observer, ScopePathsNestAndBackwardOpsKeepTheirForwardScope) {
  Tensor x = leaf({1, 2});
  ObserverScope obs;
  Tensor y;
  {
    ScopeGuard a("blocks.3");
    {
      ScopeGuard b("attn");
      EXPECT_EQ(currentScope(), "blocks.3.attn");
      y = ops::exp(x);
    }
    {
      ScopeGuard c("head", true);
      EXPECT_EQ(currentScope(), "head");
      y = ops::mul(y, y);
    }
    EXPECT_EQ(currentScope(), "blocks.3");
  }
  EXPECT_EQ(currentScope(), "");
  ops::sum(y).backward();
  EXPECT_EQ(obs.rec->find("exp")->scope, "blocks.3.attn");
  EXPECT_EQ(obs.rec->find("mul")->scope, "head");
  EXPECT_EQ(obs.rec->find("sum")->scope, "");
  uint64_t expSeq = obs.rec->find("exp")->seq, mulSeq = obs.rec->find("mul")->seq;
  int expBack = 0, mulBack = 0;
  for (auto& s : obs.rec->phase(Phase::Backward)) {
    if (s.forwardSeq == expSeq) {
      EXPECT_EQ(s.scope, "blocks.3.attn") << s.op;
      ++expBack;
    }
    if (s.forwardSeq == mulSeq) {
      EXPECT_EQ(s.scope, "head") << s.op;
      ++mulBack;
    }
  }
  EXPECT_GT(expBack, 0);
  EXPECT_GT(mulBack, 0);
}

TEST(Observer, MemoryEventsCarryTheOpThatAllocated) {
  Tensor x = fromDoubles({1, 2, 3}, {3});
  ObserverScope obs;
  ops::exp(x);
  ASSERT_EQ(obs.rec->ends.size(), 1u);
  bool found = false;
  for (auto& m : obs.rec->mem)
    if (m.kind == MemEventKind::Alloc && m.opSeq == obs.rec->ends[0].seq) found = m.bytes >= 24;
  EXPECT_TRUE(found) << "no alloc event of >= 24 bytes attributed to exp";
}

TEST(Observer, NothingIsCalledWithoutAnInstalledObserver) {
  auto rec = std::make_shared<Recorder>();
  addObserver(rec);
  EXPECT_TRUE(detail::hasObservers());
  removeObserver(rec);
  EXPECT_FALSE(detail::hasObservers());
  Tensor x = leaf({1, 2});
  ops::sum(ops::exp(x)).backward();
  EXPECT_TRUE(rec->begins.empty());
  EXPECT_TRUE(rec->ends.empty());
  EXPECT_TRUE(rec->mem.empty());
}

// Note [One load per op]: observers and verbose rules share one word, each readable on its own,
// and the word is zero when neither is active (the dispatcher's one-load fast path).
TEST(Observer, ObserversAndVerboseRulesShareOneWordReadApart) {
  ASSERT_EQ(detail::instrumentation(), 0u);
  auto rec = std::make_shared<Recorder>();
  {
    VerboseGuard verbose("blocks.1");
    EXPECT_TRUE(detail::verboseActive());
    EXPECT_FALSE(detail::hasObservers());
    addObserver(rec);
    EXPECT_TRUE(detail::verboseActive());
    EXPECT_TRUE(detail::hasObservers());
    {
      VerboseGuard nested;
      EXPECT_TRUE(detail::verboseActive());
    }
    EXPECT_TRUE(detail::verboseActive());
  }
  EXPECT_FALSE(detail::verboseActive());
  EXPECT_TRUE(detail::hasObservers());
  removeObserver(rec);
  EXPECT_FALSE(detail::hasObservers());
  EXPECT_EQ(detail::instrumentation(), 0u);
  // With only a verbose rule an op is logged but no observer hears of it.
  VerboseGuard verbose;
  Tensor x = leaf({1, 2});
  ops::exp(x);
  EXPECT_TRUE(rec->begins.empty());
}

// Note [Paused observers]: a paused observer hears steps only, and while every observer is paused
// the dispatcher sees none; another observer installed meanwhile still hears everything.
TEST(Observer, APausedObserverHearsStepsOnly) {
  struct Steps : Recorder {
    std::vector<int64_t> steps;
    void onStep(const StepEvent& e) override { steps.push_back(e.step); }
  };
  auto rec = std::make_shared<Steps>();
  addObserver(rec);
  Tensor x = leaf({1, 2});
  ops::exp(x);
  EXPECT_EQ(rec->ends.size(), 1u);
  setObserverPaused(rec, true);
  EXPECT_FALSE(detail::hasObservers());
  EXPECT_EQ(detail::instrumentation(), 0u);
  ops::exp(x);
  detail::notifyStep(StepEvent{7, true});
  EXPECT_EQ(rec->ends.size(), 1u);  // the op passed unheard
  EXPECT_EQ(rec->steps, std::vector<int64_t>{7});
  {
    ObserverScope other;  // not paused: hears the op, and the paused one still does not
    ops::exp(x);
    EXPECT_EQ(other.rec->ends.size(), 1u);
    EXPECT_EQ(rec->ends.size(), 1u);
  }
  setObserverPaused(rec, true);  // already paused: nothing changes
  setObserverPaused(rec, false);
  EXPECT_TRUE(detail::hasObservers());
  ops::exp(x);
  EXPECT_EQ(rec->ends.size(), 2u);
  removeObserver(rec);
  setObserverPaused(rec, true);  // not installed: a no-op
  EXPECT_EQ(detail::instrumentation(), 0u);
}

// keel::Step (keel/step.h): a loop of one's own marks its steps; each installed observer restarts
// the numbering.
struct StepsAndLogs : Observer {
  std::vector<StepEvent> steps;
  std::vector<std::pair<LogLevel, std::string>> logs;
  void onStep(const StepEvent& e) override { steps.push_back(e); }
  void onLog(const LogEvent& e) override {
    if (e.scope == "train") logs.emplace_back(e.level, std::string(e.message));
  }
};
struct StepsScope {
  std::shared_ptr<StepsAndLogs> rec = std::make_shared<StepsAndLogs>();
  StepsScope() { addObserver(rec); }
  ~StepsScope() { removeObserver(rec); }
};

TEST(Step, MarksBeginAndEndWithTheMetricsAndALogLine) {
  StepsScope obs;
  {
    Step step(1);
    ops::exp(leaf({1, 2}));
    step.end({.loss = 0.5, .lr = 1e-3});
  }
  Step(2).end({.loss = std::nan(""), .gradNorm = 2.5, .valLoss = 0.25});
  const auto& s = obs.rec->steps;
  ASSERT_EQ(s.size(), 4u);
  EXPECT_TRUE(s[0].begin);
  EXPECT_EQ(s[0].step, 1);
  EXPECT_FALSE(s[1].begin);
  EXPECT_EQ(s[1].step, 1);
  EXPECT_EQ(s[1].loss, 0.5);
  EXPECT_EQ(s[1].lr, 1e-3);
  EXPECT_TRUE(std::isnan(s[1].gradNorm));  // not given: unknown
  EXPECT_TRUE(std::isnan(s[1].auxLoss));
  EXPECT_GE(s[1].timeNs, s[0].timeNs);
  EXPECT_EQ(s[1].nanMetrics, 0);
  EXPECT_EQ(s[3].step, 2);
  EXPECT_TRUE(std::isnan(s[3].loss));
  EXPECT_EQ(s[3].nanMetrics, 1);  // the loss is a reported NaN, the others are unknown
  EXPECT_EQ(s[3].gradNorm, 2.5);
  EXPECT_EQ(s[3].valLoss, 0.25);
  using Line = std::pair<LogLevel, std::string>;
  EXPECT_EQ(obs.rec->logs, (std::vector<Line>{
                               {LogLevel::Info, "step 1: loss 0.5000, lr 0.001"},
                               {LogLevel::Warn, "step 2: loss nan, grad norm 2.5, val loss 0.2500"},
                           }));
  EXPECT_EQ(detail::stepLogLine(9, {}), "step 9");
  EXPECT_EQ(detail::stepLogLine(9, {.loss = -INFINITY, .auxLoss = 0.01, .tokensPerSec = 1234.4}),
            "step 9: loss -inf, aux loss 0.0100, 1234 tokens/s");
}

TEST(Step, RefusesMisnumberedAndOverlappingSteps) {
  StepsScope obs;
  EXPECT_EQ(errorOf([] { Step s(0); }), "keel::Step(0): steps are numbered from 1");
  {
    Step three(3);
    EXPECT_EQ(errorOf([] { Step s(4); }),
              "keel::Step(4): step 3 has not ended (one step at a time: end it, or let its "
              "keel::Step go out of scope, first)");
    three.end();
    EXPECT_EQ(errorOf([&] { three.end(); }), "keel::Step(3): end() called twice");
  }
  // An epoch loop that numbers its steps within each epoch: step 1 again would overwrite the
  // recording's step 1.
  EXPECT_EQ(errorOf([] { Step s(1); }),
            "keel::Step(1): step 1 comes after step 3; number the steps upward through the whole "
            "run, across epochs too");
  EXPECT_EQ(errorOf([] { Step s(3); }).substr(0, 42), "keel::Step(3): step 3 comes after step 3; ");
  Step(5).end();                         // gaps are allowed
  ASSERT_EQ(obs.rec->steps.size(), 4u);  // 3 and 5, begun and ended; nothing of the refused
  EXPECT_EQ(obs.rec->steps[2].step, 5);
  {
    StepsScope second;  // a new recorder: its run starts again at step 1
    Step(1).end();
    EXPECT_EQ(second.rec->steps.size(), 2u);
  }
}

// Without a recorder, a program may train twice from step 1 (a sweep, a test); one at a time
// still holds. An observer that refuses a step leaves no step running.
TEST(Step, UnrecordedRunsMayStartAgainAndARefusedStepDoesNotRun) {
  ASSERT_FALSE(detail::anyObserverInstalled());
  Step(1).end();
  Step(2).end();
  Step(1).end();  // a second unrecorded run
  {
    Step one(1);
    EXPECT_NE(errorOf([] { Step s(2); }).find("step 1 has not ended"), std::string::npos);
  }
  struct Refuses : Observer {
    void onStep(const StepEvent& e) override {
      if (e.begin) throw Error("recording failed");
    }
  };
  auto refuses = std::make_shared<Refuses>();
  addObserver(refuses);
  EXPECT_EQ(errorOf([] { Step s(1); }), "recording failed");
  removeObserver(refuses);
  Step(1).end();  // not "step 1 has not ended"
}

TEST(Step, WithoutEndItEndsUnknownAndUnwoundByAnExceptionItStaysOpen) {
  StepsScope obs;
  { Step s(1); }
  try {
    Step s(2);
    throw std::runtime_error("out of memory");
  } catch (const std::runtime_error&) {
  }
  Step(3).end({.loss = 1.0});  // the next step may begin: the failed one no longer runs
  std::vector<std::pair<int64_t, bool>> seen;
  for (const auto& e : obs.rec->steps) seen.emplace_back(e.step, e.begin);
  EXPECT_EQ(seen, (std::vector<std::pair<int64_t, bool>>{
                      {1, true}, {1, false}, {2, true}, {3, true}, {3, false}}));
  EXPECT_TRUE(std::isnan(obs.rec->steps[1].loss));
  using Line = std::pair<LogLevel, std::string>;
  EXPECT_EQ(obs.rec->logs, (std::vector<Line>{{LogLevel::Info, "step 1"},
                                              {LogLevel::Info, "step 3: loss 1.0000"}}));
}

TEST(Observer, TwoObserversBothSeeEveryOp) {
  ObserverScope a, b;
  ops::exp(fromDoubles({1}, {1}));
  EXPECT_EQ(a.rec->ends.size(), 1u);
  EXPECT_EQ(b.rec->ends.size(), 1u);
  EXPECT_EQ(a.rec->ends[0].seq, b.rec->ends[0].seq);
}

}  // namespace
}  // namespace keel::test
