// Optimizers (SGD with momentum/Nesterov, AdamW), gradient-norm clipping and the learning-rate
// schedule. Updates run through ops::sgdStep / ops::adamwStep in Phase::Optimizer, each under the
// parameter's name as scope; parameters without a gradient are skipped (their state is untouched).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "keel/tensor.h"

namespace keel::optim {

class Optimizer {
 public:
  Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual void step() = 0;
  void zeroGrad();  // drops every parameter's gradient
  double lr() const { return lr_; }
  void setLr(double lr) { lr_ = lr; }
  const std::vector<Tensor>& params() const { return params_; }
  // Checkpoint access (engine/src/ckpt): the named state of parameter i — tensors shaped like
  // the parameter and int64 scalars (step counters); empty before the parameter's first update.
  virtual std::vector<std::pair<std::string, Tensor>> paramState(size_t i) const { return {}; }
  // Restores one state returned by paramState; the optimizer takes `value` (moved to the
  // parameter's device and dtype), so pass a tensor nobody else writes. Throws keel::Error on an
  // unknown name or a shape that does not match the parameter.
  virtual void setParamState(size_t i, const std::string& name, const Tensor& value);

 protected:
  // Calls fn(index, param, grad) for every parameter that has a gradient, with grad mode off,
  // phase Optimizer and the parameter's name as the scope (what observers see for the update).
  void forEachParamWithGrad(
      const std::function<void(size_t, const Tensor&, const Tensor&)>& fn) const;

  std::vector<Tensor> params_;
  double lr_;
};

struct SgdOptions {
  double lr = 1e-2;
  double momentum = 0.0;
  double weightDecay = 0.0;  // L2 added to the gradient (classic SGD), see docs/ops.md sgd_step
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SgdOptions opt);
  void step() override;
  std::vector<std::pair<std::string, Tensor>> paramState(size_t i) const override;
  void setParamState(size_t i, const std::string& name, const Tensor& value) override;

 private:
  SgdOptions opt_;
  std::vector<Tensor> momentum_;  // created (zeros, on the parameter's device) at the first step
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weightDecay = 0.0;  // decoupled
  // Decay only parameters of rank >= 2 (matrices, embeddings), not norms or biases.
  bool decayMatricesOnly = true;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions opt);
  void step() override;
  int64_t stepCount(size_t param) const { return steps_.at(param); }
  // "exp_avg", "exp_avg_sq" (float, like the parameter) and "step" (int64 scalar).
  std::vector<std::pair<std::string, Tensor>> paramState(size_t i) const override;
  void setParamState(size_t i, const std::string& name, const Tensor& value) override;

 private:
  AdamWOptions opt_;
  std::vector<Tensor> m_, v_;   // created (zeros) at a parameter's first step
  std::vector<int64_t> steps_;  // per parameter, 1-based after its first update
};

// Total L2 norm of all gradients (parameters without one are skipped). When maxNorm > 0 and the
// norm exceeds it, every gradient is scaled by maxNorm / (norm + 1e-6). Returns the norm before
// clipping. Runs under NoGradGuard in Phase::Optimizer.
// Under tensor parallelism (Note [Tensor-parallel layers]) the parameters marked in `sharded` are
// shards: their squared norms are summed over the ranks of `group` (an all_reduce) before the
// replicated ones are added, so every rank computes the norm of the whole model.
struct ShardedGrads {
  std::vector<bool> sharded;  // by parameter index; empty: nothing is sharded
  std::string group = "tp";
};
double clipGradNorm(const std::vector<Tensor>& params, double maxNorm,
                    const ShardedGrads& shards = {});

// Linear warmup from maxLr/warmupSteps to maxLr over steps [0, warmupSteps), then cosine decay to
// minLr at totalSteps - 1 (and minLr after). step is 0-based.
struct LrSchedule {
  double maxLr = 1e-3;
  double minLr = 1e-4;
  int64_t warmupSteps = 0;
  int64_t totalSteps = 1;
  double at(int64_t step) const;
};

}  // namespace keel::optim
