// Mixture-of-experts layer: softmax router, top-k routing with per-expert capacity, SwiGLU experts
// run on dynamically gathered token sets, and the load-balancing aux loss.
// Invariant: routing decisions depend only on the router probabilities (read back to the host), so
// two backends that agree on the probabilities route identically.
#include <cmath>

#include "keel/error.h"
#include "keel/nn.h"

namespace keel::nn {

// Note [MoE routing]
// Per token n the router gives probs[n, :] = softmax(router(x_n)); topk picks k experts (ties go
// to the lower expert index) and their probabilities are renormalised to sum to 1 (the gates).
// Assignments (n, slot) are visited in token order, slot order within a token; expert e accepts
// the first `capacity` of them and drops the rest. A dropped assignment contributes nothing (the
// block's residual carries the token). For each expert with tokens: x_e = index_select(x, 0,
// idx_e), y_e = expert_e(x_e) * gate, out = index_add(out, 0, idx_e, y_e). The gathered sizes
// change with the data every step, which is what the debugger's dynamic-shape views are built to
// show. The aux loss E · Σ_e f_e · P_e uses f_e over all k·N routed assignments (before capacity)
// and P_e = mean_n probs[n, e]; it is 1 for perfectly uniform routing.

Tensor loadBalancingLoss(const Tensor& probs, const Tensor& topIdx) {
  KEEL_CHECK(probs.dim() == 2 && topIdx.dim() == 2 && topIdx.size(0) == probs.size(0),
             "loadBalancingLoss: expected probs [N, E] and topIdx [N, k], got ",
             shapeStr(probs.shape()), " and ", shapeStr(topIdx.shape()));
  const int64_t e = probs.size(1);
  std::vector<int64_t> idx = hostInts(topIdx);
  std::vector<float> frac(size_t(e), 0.0f);
  for (int64_t i : idx) {
    KEEL_CHECK(i >= 0 && i < e, "loadBalancingLoss: expert index ", i, " out of range [0, ", e,
               ")");
    frac[size_t(i)] += 1.0f;
  }
  const float total = float(idx.size());
  if (total > 0)
    for (auto& f : frac) f /= total;
  Tensor f = tensorFromHost(frac, {e}, probs.dtype(), probs.device());
  Tensor p = ops::mean(probs, {0});  // [E]
  return ops::mulScalar(ops::sum(ops::mul(p, f)), double(e));
}

MoE::MoE(const GptConfig& cfg, Generator& gen, Device device)
    : nExpert_(cfg.n_expert),
      topK_(cfg.top_k),
      capacityFactor_(cfg.capacity_factor),
      device_(device) {
  KEEL_CHECK(nExpert_ > 0 && topK_ >= 1 && topK_ <= nExpert_,
             "MoE: need 1 <= top_k <= n_expert, got top_k=", topK_, " n_expert=", nExpert_);
  KEEL_CHECK(capacityFactor_ > 0, "MoE: capacity_factor must be > 0, got ", capacityFactor_);
  double residStd = 0.02 / std::sqrt(2.0 * double(cfg.n_layer));
  router_ = buildModule("router", [&] {
    return std::make_shared<Linear>(cfg.d_model, nExpert_, false, gen, device);
  });
  expertList_ = registerModule("experts", std::make_shared<ModuleList>());
  ScopeGuard scope("experts");
  for (int64_t i = 0; i < nExpert_; ++i)
    experts_.push_back(expertList_->build(
        [&] { return std::make_shared<SwiGLU>(cfg.d_model, cfg.d_ff, gen, device, residStd); }));
}

int64_t MoE::capacity(int64_t tokens) const {
  return int64_t(std::ceil(capacityFactor_ * double(tokens) * double(topK_) / double(nExpert_)));
}

Tensor MoE::forwardImpl(const Tensor& x) {
  KEEL_CHECK(x.dim() >= 2, "MoE '", fullPath(), "': expected input [..., d], got ",
             shapeStr(x.shape()));
  const int64_t c = x.size(-1), n = x.numel() / c, k = topK_;
  Tensor x2 = ops::reshape(x, {n, c});
  Tensor probs = ops::softmax(router_->forward(x2), -1);  // [N, E]
  auto [topv, topi] = ops::topk(probs, k, -1, true);      // [N, k]
  Tensor gates = ops::div(topv, ops::sum(topv, {-1}, true));
  aux_ = loadBalancingLoss(probs, topi);

  const std::vector<int64_t> choice = hostInts(topi);
  const int64_t cap = capacity(n);
  std::vector<std::vector<int64_t>> tokens(static_cast<size_t>(nExpert_));
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(nExpert_));
  lastDropped_ = 0;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t s = 0; s < k; ++s) {
      int64_t e = choice[size_t(t * k + s)];
      auto& list = tokens[size_t(e)];
      if (int64_t(list.size()) < cap) {
        list.push_back(t);
        slots[size_t(e)].push_back(t * k + s);
      } else {
        ++lastDropped_;
      }
    }

  Tensor gatesFlat = ops::reshape(gates, {n * k});
  Tensor out = Tensor::zeros({n, c}, x.dtype(), x.device());
  lastCounts_.assign(size_t(nExpert_), 0);
  for (int64_t e = 0; e < nExpert_; ++e) {
    const auto& list = tokens[size_t(e)];
    const int64_t m = int64_t(list.size());
    lastCounts_[size_t(e)] = m;
    if (m == 0) continue;
    Tensor idx = tensorFromHost(list, {m}, DType::Int64, x.device());
    Tensor gidx = tensorFromHost(slots[size_t(e)], {m}, DType::Int64, x.device());
    Tensor ye = experts_[size_t(e)]->forward(ops::indexSelect(x2, 0, idx));  // [m, C]
    Tensor g = ops::reshape(ops::indexSelect(gatesFlat, 0, gidx), {m, 1});
    out = ops::indexAdd(out, 0, idx, ops::mul(ye, g));
  }
  return ops::reshape(out, x.shape());
}

}  // namespace keel::nn
