// Optimizer implementations: state creation, the per-parameter update ops, grad-norm clipping and
// the warmup + cosine schedule. Invariant: every op issued here runs in Phase::Optimizer without
// autograd recording, so optimizer work never enters a graph.
#include "keel/optim.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "keel/dispatch.h"
#include "keel/error.h"
#include "keel/observer.h"
#include "keel/ops.h"

namespace keel::optim {

Optimizer::Optimizer(std::vector<Tensor> params, double lr) : params_(std::move(params)), lr_(lr) {
  for (size_t i = 0; i < params_.size(); ++i) {
    KEEL_CHECK(params_[i].defined(), "Optimizer: parameter ", i, " is undefined");
    KEEL_CHECK(isFloating(params_[i].dtype()), "Optimizer: parameter ", i, " ('", params_[i].name(),
               "') has non-float dtype ", dtypeName(params_[i].dtype()));
  }
}

void Optimizer::zeroGrad() {
  for (auto& p : params_) p.setGrad(Tensor());
}

SGD::SGD(std::vector<Tensor> params, SgdOptions opt)
    : Optimizer(std::move(params), opt.lr), opt_(opt) {
  KEEL_CHECK(opt.momentum >= 0.0 && opt.weightDecay >= 0.0,
             "SGD: momentum and weight decay must be >= 0");
  KEEL_CHECK(!opt.nesterov || opt.momentum > 0.0, "SGD: nesterov needs momentum > 0");
  momentum_.resize(params_.size());
}

void Optimizer::forEachParamWithGrad(
    const std::function<void(size_t, const Tensor&, const Tensor&)>& fn) const {
  NoGradGuard ng;
  PhaseGuard phase(Phase::Optimizer);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    ScopeGuard scope(p.name(), /*absolute=*/true);
    fn(i, p, g);
  }
}

void SGD::step() {
  forEachParamWithGrad([&](size_t i, const Tensor& p, const Tensor& g) {
    if (!momentum_[i].defined()) {
      MemTagScope tag(MemTag::OptimizerState);
      momentum_[i] = Tensor::zeros(p.shape(), p.dtype(), p.device());
    }
    ops::sgdStep(p, g, momentum_[i], lr_, opt_.momentum, opt_.weightDecay, opt_.nesterov);
  });
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions opt)
    : Optimizer(std::move(params), opt.lr), opt_(opt) {
  KEEL_CHECK(opt.beta1 >= 0.0 && opt.beta1 < 1.0 && opt.beta2 >= 0.0 && opt.beta2 < 1.0,
             "AdamW: betas must be in [0, 1), got ", opt.beta1, ", ", opt.beta2);
  KEEL_CHECK(opt.eps > 0.0 && opt.weightDecay >= 0.0,
             "AdamW: eps must be > 0 and weight decay >= 0");
  m_.resize(params_.size());
  v_.resize(params_.size());
  steps_.assign(params_.size(), 0);
}

void AdamW::step() {
  forEachParamWithGrad([&](size_t i, const Tensor& p, const Tensor& g) {
    if (!m_[i].defined()) {
      MemTagScope tag(MemTag::OptimizerState);
      m_[i] = Tensor::zeros(p.shape(), p.dtype(), p.device());
      v_[i] = Tensor::zeros(p.shape(), p.dtype(), p.device());
    }
    double wd = (opt_.decayMatricesOnly && p.dim() < 2) ? 0.0 : opt_.weightDecay;
    ops::adamwStep(p, g, m_[i], v_[i], lr_, opt_.beta1, opt_.beta2, opt_.eps, wd, ++steps_[i]);
  });
}

namespace {

// value as state of parameter p: same shape, moved to p's device and dtype (the caller hands
// over a tensor nobody else writes).
Tensor stateLike(const Tensor& p, const Tensor& value, const std::string& name) {
  KEEL_CHECK(value.defined() && value.shape() == p.shape(), "optimizer state '", name, "' of '",
             p.name(), "': expected shape ", shapeStr(p.shape()), ", got ",
             value.defined() ? shapeStr(value.shape()) : std::string("undefined"));
  NoGradGuard ng;
  Tensor out = value.to(p.device());
  if (out.dtype() != p.dtype()) out = ops::cast(out, p.dtype());
  return out.contiguous();
}

}  // namespace

void Optimizer::setParamState(size_t i, const std::string& name, const Tensor&) {
  throw Error("optimizer has no state '" + name + "' for parameter " + std::to_string(i));
}

std::vector<std::pair<std::string, Tensor>> SGD::paramState(size_t i) const {
  if (!momentum_.at(i).defined()) return {};
  return {{"momentum", momentum_[i]}};
}

void SGD::setParamState(size_t i, const std::string& name, const Tensor& value) {
  KEEL_CHECK(i < params_.size(), "SGD: no parameter ", i);
  if (name != "momentum") Optimizer::setParamState(i, name, value);
  momentum_[i] = stateLike(params_[i], value, name);
}

std::vector<std::string> SGD::stateNames() const {
  if (opt_.momentum == 0.0) return {};
  return {"momentum"};
}

std::vector<std::string> AdamW::stateNames() const {
  return adamWStateNames();
}

std::vector<std::pair<std::string, Tensor>> AdamW::paramState(size_t i) const {
  if (!m_.at(i).defined()) return {};
  return {{"exp_avg", m_[i]},
          {"exp_avg_sq", v_[i]},
          {"step", Tensor::scalar(double(steps_[i]), DType::Int64, Device(Backend::Cpu))}};
}

void AdamW::setParamState(size_t i, const std::string& name, const Tensor& value) {
  KEEL_CHECK(i < params_.size(), "AdamW: no parameter ", i);
  if (name == "step") {
    KEEL_CHECK(value.defined() && value.numel() == 1, "optimizer state 'step' of '",
               params_[i].name(), "' must be a scalar");
    steps_[i] = int64_t(value.item());
  } else if (name == "exp_avg") {
    m_[i] = stateLike(params_[i], value, name);
  } else if (name == "exp_avg_sq") {
    v_[i] = stateLike(params_[i], value, name);
  } else {
    Optimizer::setParamState(i, name, value);
  }
}

void agreeOnGradients(const std::vector<Tensor>& params,
                      const std::function<bool(const Tensor&)>& which, const std::string& group) {
  if (params.empty()) return;
  NoGradGuard ng;
  std::vector<float> have(params.size(), 0.0f);
  for (size_t i = 0; i < params.size(); ++i)
    have[i] = params[i].grad().defined() && (!which || which(params[i])) ? 1.0f : 0.0f;
  const Device dev = params[0].device();
  Tensor any = ops::allReduce(Tensor::fromVector(have, {int64_t(have.size())}, DType::Float32, dev),
                              "max", group);
  const std::vector<float> anyHas = any.toVector<float>();
  for (size_t i = 0; i < params.size(); ++i)
    if (anyHas[i] > 0.0f && !params[i].grad().defined())
      params[i].setGrad(Tensor::zeros(params[i].shape(), params[i].dtype(), params[i].device()));
}

double clipGradNorm(const std::vector<Tensor>& params, double maxNorm, const ShardedGrads& shards) {
  NoGradGuard ng;
  PhaseGuard phase(Phase::Optimizer);
  ScopeGuard scope("clip_grad_norm", /*absolute=*/true);
  Tensor total, sharded;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor g = params[i].grad();
    if (!g.defined()) continue;
    Tensor sq = ops::sum(ops::mul(g, g));
    Tensor& into = i < shards.sharded.size() && shards.sharded[i] ? sharded : total;
    into = into.defined() ? ops::add(into, sq) : sq;
  }
  if (!shards.sharded.empty()) {  // every rank of the group calls it, with or without shards
    if (!sharded.defined()) sharded = Tensor::zeros({}, DType::Float32, params.at(0).device());
    sharded = ops::allReduce(sharded, "sum", shards.group);
    total = total.defined() ? ops::add(total, sharded) : sharded;
  }
  if (!total.defined()) return 0.0;
  double sumSq = total.item();
  double norm = std::sqrt(sumSq);
  if (maxNorm > 0.0 && norm > maxNorm) {
    double coef = maxNorm / (norm + 1e-6);
    for (const Tensor& p : params) {
      Tensor g = p.grad();
      if (g.defined()) p.setGrad(ops::mulScalar(g, coef));
    }
  }
  return norm;
}

double LrSchedule::at(int64_t step) const {
  if (step < 0) step = 0;
  if (warmupSteps > 0 && step < warmupSteps) return maxLr * double(step + 1) / double(warmupSteps);
  int64_t decaySteps = totalSteps - 1 - warmupSteps;
  if (decaySteps <= 0) return maxLr;  // no room to decay
  double progress = std::min(1.0, double(step - warmupSteps) / double(decaySteps));
  return minLr + 0.5 * (maxLr - minLr) * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace keel::optim
