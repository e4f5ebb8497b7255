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
  // The names paramState returns for a parameter once it was updated (a checkpoint holds all of
  // them for a parameter, or none); empty for an optimizer without state.
  virtual std::vector<std::string> stateNames() const { return {}; }

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
  std::vector<std::string> stateNames() const override;

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

// AdamW's per-parameter state, as paramState names it (AdamW and ShardedAdamW alike).
inline std::vector<std::string> adamWStateNames() {
  return {"exp_avg", "exp_avg_sq", "step"};
}

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions opt);
  void step() override;
  int64_t stepCount(size_t param) const { return steps_.at(param); }
  // "exp_avg", "exp_avg_sq" (float, like the parameter) and "step" (int64 scalar).
  std::vector<std::pair<std::string, Tensor>> paramState(size_t i) const override;
  void setParamState(size_t i, const std::string& name, const Tensor& value) override;
  std::vector<std::string> stateNames() const override;

 private:
  AdamWOptions opt_;
  std::vector<Tensor> m_, v_;   // created (zeros) at a parameter's first step
  std::vector<int64_t> steps_;  // per parameter, 1-based after its first update
};

// Which parameters are tensor-parallel shards (for the gradient norm; see clipGradNorm).
struct ShardedGrads {
  std::vector<bool> sharded;  // by parameter index; empty: nothing is sharded
  std::string group = "tp";
};

// Gives each parameter that has a gradient on some rank of `group` one on this rank too (zeros
// where it has none), for the parameters `which` accepts (all when empty): the ranks' gradient
// collectives then pair up. A MoE expert that no token of this rank reached has no gradient here
// but may have one on another rank; averaged, this rank's share is zero. One all_reduce (max) of
// a flag per parameter.
void agreeOnGradients(const std::vector<Tensor>& params,
                      const std::function<bool(const Tensor&)>& which, const std::string& group);

// Note [Sharded optimizer state]
// ZeRO stage 2 over a data-parallel group of D ranks (keel train --zero). Every parameter's rows
// (dim 0; a 1-D parameter's elements) are split D ways, larger parts first; dp rank r owns part
// r of every parameter and keeps AdamW's moments for those rows only, 1/D of the state.
//  - reduceGradients(), after backward: per bucket of parameters (kGradBucketBytes) one
//    reduce_scatter (mean) of the gradients laid out owner by owner, which leaves each rank the
//    dp-averaged gradient of its own rows; the full gradients are then dropped.
//  - clipGradNorm(): the owned pieces' squared norms summed over the dp group (tensor-parallel
//    shards then over tp, as optim::clipGradNorm), so every rank clips by the whole model's norm.
//  - step(): adamw_step on each owned row range (a view of the parameter, updated in place),
//    then per bucket one all_gather of the updated rows, written into the other ranks' rows of
//    every parameter: the replicas hold the same bits after every step.
// The arithmetic per element is AdamW's, on the same averaged gradient, so a --zero run follows
// the unsharded run's curve (the reduction order of reduce_scatter and all_reduce may differ).
// Optimizer state reads and writes (checkpoints) are the owned pieces: paramState(i) returns
// tensors of ownedRows(i).second rows; setParamState takes those or the whole parameter's state,
// of which it keeps its rows.
class ShardedAdamW : public Optimizer {
 public:
  // `group`: the data-parallel group; `shards`: the tensor-parallel shards (for the norm).
  ShardedAdamW(std::vector<Tensor> params, AdamWOptions opt, std::string group,
               ShardedGrads shards);
  void reduceGradients();
  double clipGradNorm(double maxNorm);
  void step() override;
  // [first row, number of rows) of parameter i this rank owns (number may be 0).
  std::pair<int64_t, int64_t> ownedRows(size_t i) const;
  std::vector<std::pair<std::string, Tensor>> paramState(size_t i) const override;
  void setParamState(size_t i, const std::string& name, const Tensor& value) override;
  std::vector<std::string> stateNames() const override;

 private:
  std::pair<int64_t, int64_t> rowsOf(size_t i, int part) const;
  std::vector<std::vector<size_t>> buckets() const;  // parameters with gradients, in order

  AdamWOptions opt_;
  std::string group_;
  ShardedGrads shards_;
  int rank_ = 0, size_ = 1;
  std::vector<Tensor> grads_;  // per parameter: the averaged gradient of the owned rows
  std::vector<bool> hasGrad_;  // parameters whose gradients were reduced this step
  std::vector<Tensor> m_, v_;  // owned rows, created at a parameter's first step
  std::vector<int64_t> steps_;
};

// Total L2 norm of all gradients (parameters without one are skipped). When maxNorm > 0 and the
// norm exceeds it, every gradient is scaled by maxNorm / (norm + 1e-6). Returns the norm before
// clipping. Runs under NoGradGuard in Phase::Optimizer.
// Under tensor parallelism (Note [Tensor-parallel layers]) the parameters marked in `sharded` are
// shards: their squared norms are summed over the ranks of `group` (an all_reduce) before the
// replicated ones are added, so every rank computes the norm of the whole model.
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
