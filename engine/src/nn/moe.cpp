// Mixture-of-experts layer: softmax router, top-k routing with per-expert capacity, SwiGLU experts
// run on dynamically gathered token sets, and the load-balancing aux loss; under data and expert
// parallelism, routing over the dp group's batch and experts split across ranks (Note
// [Expert-parallel MoE] in keel/nn.h).
// Invariant: routing decisions depend only on the router probabilities (read back to the host), so
// two backends that agree on the probabilities route identically.
#include <algorithm>
#include <cmath>

#include "keel/error.h"
#include "keel/nn.h"
#include "keel/ops.h"

#include "graph_tie.h"

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

namespace {

// f_e: each expert's share of the k · N assignments in `choice` (no gradient), as a tensor like
// probs. keel::Error for an expert index outside [0, e).
Tensor assignmentShares(const std::vector<int64_t>& choice, int64_t e, const Tensor& probs) {
  std::vector<float> frac(size_t(e), 0.0f);
  for (int64_t i : choice) {
    KEEL_CHECK(i >= 0 && i < e, "loadBalancingLoss: expert index ", i, " out of range [0, ", e,
               ")");
    frac[size_t(i)] += 1.0f;
  }
  const float total = float(choice.size());
  if (total > 0)
    for (auto& f : frac) f /= total;
  return tensorFromHost(frac, {e}, probs.dtype(), probs.device());
}

// E · Σ_e f_e · P_e.
Tensor balance(const Tensor& p, const Tensor& f, int64_t e) {
  return ops::mulScalar(ops::sum(ops::mul(p, f)), double(e));
}

}  // namespace

Tensor loadBalancingLoss(const Tensor& probs, const Tensor& topIdx) {
  KEEL_CHECK(probs.dim() == 2 && topIdx.dim() == 2 && topIdx.size(0) == probs.size(0),
             "loadBalancingLoss: expected probs [N, E] and topIdx [N, k], got ",
             shapeStr(probs.shape()), " and ", shapeStr(topIdx.shape()));
  const int64_t e = probs.size(1);
  const Tensor f = assignmentShares(hostInts(topIdx), e, probs);
  return balance(ops::mean(probs, {0}), f, e);  // P_e: [E]
}

namespace {

// The load-balancing loss of a batch spread over the dp group (Note [Expert-parallel MoE]): f_e
// from every rank's choices (`choice`, the scope's k · N assignments), P_e the mean probability
// over the scope's N tokens — this rank's sum all-reduced, then copy_to_group so that backward
// hands every rank the whole gradient for its tokens, as one process would.
Tensor scopeBalancingLoss(const Tensor& probs, const std::vector<int64_t>& choice,
                          int64_t scopeTokens) {
  const int64_t e = probs.size(1);
  const Tensor f = assignmentShares(choice, e, probs);
  const Tensor mine = ops::mulScalar(ops::sum(probs, {0}), 1.0 / double(scopeTokens));
  return balance(ops::copyToGroup(ops::allReduce(mine, "sum", "dp"), "dp"), f, e);
}

Tensor indexTensor(const std::vector<int64_t>& v, Device device) {
  return tensorFromHost(v, {int64_t(v.size())}, DType::Int64, device);
}

}  // namespace

MoE::MoE(const GptConfig& cfg, Generator& gen, Device device, ExpertParallel ep)
    : nExpert_(cfg.n_expert),
      topK_(cfg.top_k),
      capacityFactor_(cfg.capacity_factor),
      device_(device),
      ep_(ep) {
  KEEL_CHECK(nExpert_ > 0 && topK_ >= 1 && topK_ <= nExpert_,
             "MoE: need 1 <= top_k <= n_expert, got top_k=", topK_, " n_expert=", nExpert_);
  KEEL_CHECK(capacityFactor_ > 0, "MoE: capacity_factor must be > 0, got ", capacityFactor_);
  KEEL_CHECK(ep_.size >= 1 && ep_.rank >= 0 && ep_.rank < ep_.size && nExpert_ % ep_.size == 0 &&
                 ep_.routeRanks >= 1 && ep_.routeRank >= 0 && ep_.routeRank < ep_.routeRanks,
             "MoE: expert parallelism ", ep_.rank, " of ", ep_.size, " (routing ", ep_.routeRank,
             " of ", ep_.routeRanks, ") does not fit ", nExpert_, " experts");
  const int64_t local = nExpert_ / ep_.size;
  firstExpert_ = ep_.rank * local;
  double residStd = 0.02 / std::sqrt(2.0 * double(cfg.n_layer));
  router_ = buildModule("router", [&] {
    return std::make_shared<Linear>(cfg.d_model, nExpert_, false, gen, device);
  });
  expertList_ = registerModule("experts", std::make_shared<ModuleList>());
  ScopeGuard scope("experts");
  // Every rank draws every expert (the same stream as one process) and keeps its own.
  for (int64_t i = 0; i < nExpert_; ++i) {
    auto make = [&] {
      return std::make_shared<SwiGLU>(cfg.d_model, cfg.d_ff, gen, device, residStd);
    };
    if (i >= firstExpert_ && i < firstExpert_ + local)
      experts_.push_back(expertList_->build(make));
    else
      expertList_->buildElsewhere(make);
  }
}

int64_t MoE::capacity(int64_t tokens) const {
  return int64_t(std::ceil(capacityFactor_ * double(tokens) * double(topK_) / double(nExpert_)));
}

MoE::Routing MoE::route(const std::vector<int64_t>& choice, int64_t firstToken,
                        int64_t scopeTokens) {
  const int64_t k = topK_, cap = capacity(scopeTokens);
  Routing r;
  r.firstToken = firstToken;
  r.tokens.resize(size_t(nExpert_));
  r.slots.resize(size_t(nExpert_));
  lastDropped_ = 0;
  for (int64_t t = 0; t < scopeTokens; ++t)
    for (int64_t s = 0; s < k; ++s) {
      const int64_t e = choice[size_t(t * k + s)];
      auto& list = r.tokens[size_t(e)];
      if (int64_t(list.size()) < cap) {
        list.push_back(t);
        r.slots[size_t(e)].push_back(t * k + s);
      } else {
        ++lastDropped_;
      }
    }
  lastCounts_.assign(size_t(nExpert_), 0);
  for (int64_t e = 0; e < nExpert_; ++e)
    lastCounts_[size_t(e)] = int64_t(r.tokens[size_t(e)].size());
  return r;
}

namespace {

// Expert e's kept assignments among this rank's tokens [first, first + n), renumbered locally:
// (token ids, slot ids into this rank's [n · k] gates).
std::pair<std::vector<int64_t>, std::vector<int64_t>> localAssignments(
    const std::vector<int64_t>& tokens, const std::vector<int64_t>& slots, int64_t first, int64_t n,
    int64_t k) {
  const auto lo = std::lower_bound(tokens.begin(), tokens.end(), first);
  const auto hi = std::lower_bound(tokens.begin(), tokens.end(), first + n);
  std::pair<std::vector<int64_t>, std::vector<int64_t>> out;
  for (auto it = lo; it != hi; ++it) {
    const size_t at = size_t(it - tokens.begin());
    out.first.push_back(*it - first);
    out.second.push_back(slots[at] - first * k);
  }
  return out;
}

}  // namespace

Tensor MoE::runExperts(const Tensor& x2, const Tensor& gatesFlat, const Routing& r) {
  const int64_t n = x2.size(0), c = x2.size(1);
  Tensor out = Tensor::zeros({n, c}, x2.dtype(), x2.device());
  for (int64_t e = 0; e < nExpert_; ++e) {
    const auto [tokens, slots] =
        localAssignments(r.tokens[size_t(e)], r.slots[size_t(e)], r.firstToken, n, topK_);
    const int64_t m = int64_t(tokens.size());
    if (m == 0) continue;
    Tensor idx = indexTensor(tokens, x2.device());
    Tensor gidx = indexTensor(slots, x2.device());
    Tensor ye = experts_[size_t(e)]->forward(ops::indexSelect(x2, 0, idx));  // [m, C]
    Tensor g = ops::reshape(ops::indexSelect(gatesFlat, 0, gidx), {m, 1});
    out = ops::indexAdd(out, 0, idx, ops::mul(ye, g));
  }
  return out;
}

Tensor MoE::exchangeWithExperts(const Tensor& x2, const Tensor& gatesFlat, const Routing& r) {
  const int64_t n = x2.size(0), c = x2.size(1), local = localExperts(), ep = ep_.size;
  const Device dev = x2.device();
  Tensor out = Tensor::zeros({n, c}, x2.dtype(), dev);
  // This rank's kept assignments per expert, and every ep rank's counts (a small all_gather).
  const size_t experts = size_t(nExpert_);
  std::vector<std::vector<int64_t>> tokens(experts), slots(experts);
  std::vector<int64_t> mine(experts);
  for (int64_t e = 0; e < nExpert_; ++e) {
    std::tie(tokens[size_t(e)], slots[size_t(e)]) =
        localAssignments(r.tokens[size_t(e)], r.slots[size_t(e)], r.firstToken, n, topK_);
    mine[size_t(e)] = int64_t(tokens[size_t(e)].size());
  }
  const std::vector<int64_t> counts =
      hostInts(ops::allGather(indexTensor(mine, dev), 0, "ep"));  // [ep · E], sender-major
  auto count = [&](int64_t sender, int64_t e) { return counts[size_t(sender * nExpert_ + e)]; };
  // Blocks of the exchange: what a sender sends one ep rank, padded to the largest such block.
  int64_t block = 0;
  for (int64_t s = 0; s < ep; ++s)
    for (int64_t j = 0; j < ep; ++j) {
      int64_t rows = 0;
      for (int64_t e = j * local; e < (j + 1) * local; ++e) rows += count(s, e);
      block = std::max(block, rows);
    }
  if (block == 0) return out;  // nothing kept anywhere in the group: every rank agrees
  // Both exchanges must be in every rank's graph, or backward would run an all_to_all on some
  // ranks only (the autograd engine runs a node only when a gradient reaches it): a rank that
  // sends, computes or receives nothing ties the exchange to its graph with a zero term (Note
  // [Collectives in every rank's backward]).
  const bool sends = std::any_of(mine.begin(), mine.end(), [](int64_t m) { return m > 0; });
  std::vector<Tensor> parts;
  std::vector<int64_t> sentTokens, sentSlots, sentRows;
  for (int64_t j = 0; j < ep; ++j) {
    std::vector<int64_t> rows;
    for (int64_t e = j * local; e < (j + 1) * local; ++e) {
      rows.insert(rows.end(), tokens[size_t(e)].begin(), tokens[size_t(e)].end());
      sentSlots.insert(sentSlots.end(), slots[size_t(e)].begin(), slots[size_t(e)].end());
    }
    for (size_t i = 0; i < rows.size(); ++i) sentRows.push_back(j * block + int64_t(i));
    if (!rows.empty()) parts.push_back(ops::indexSelect(x2, 0, indexTensor(rows, dev)));
    if (int64_t(rows.size()) < block)
      parts.push_back(Tensor::zeros({block - int64_t(rows.size()), c}, x2.dtype(), dev));
    sentTokens.insert(sentTokens.end(), rows.begin(), rows.end());
  }
  Tensor send = ops::concat(parts, 0);
  if (!sends) send = ops::add(send, detail::zeroTie(x2));
  const Tensor received = ops::allToAll(send, "ep");  // [ep · block, C]
  // This rank's experts on what arrived: in sender order, the global token order.
  int64_t arrived = 0;
  for (int64_t s = 0; s < ep; ++s)
    for (int64_t e = firstExpert_; e < firstExpert_ + local; ++e) arrived += count(s, e);
  Tensor results = arrived > 0 ? Tensor::zeros({ep * block, c}, x2.dtype(), dev)
                               : ops::add(Tensor::zeros({ep * block, c}, x2.dtype(), dev),
                                          detail::zeroTie(received));
  for (int64_t li = 0; li < local; ++li) {
    const int64_t e = firstExpert_ + li;
    std::vector<int64_t> at;
    for (int64_t s = 0; s < ep; ++s) {
      int64_t before = 0;
      for (int64_t other = firstExpert_; other < e; ++other) before += count(s, other);
      for (int64_t i = 0; i < count(s, e); ++i) at.push_back(s * block + before + i);
    }
    if (at.empty()) continue;
    const Tensor idx = indexTensor(at, dev);
    const Tensor ye = experts_[size_t(li)]->forward(ops::indexSelect(received, 0, idx));
    results = ops::indexAdd(results, 0, idx, ye);
  }
  const Tensor returned = ops::allToAll(results, "ep");  // block j: j's outputs for what we sent
  if (sentTokens.empty()) return ops::add(out, detail::zeroTie(returned));
  const int64_t m = int64_t(sentTokens.size());
  const Tensor y = ops::indexSelect(returned, 0, indexTensor(sentRows, dev));
  const Tensor g =
      ops::reshape(ops::indexSelect(gatesFlat, 0, indexTensor(sentSlots, dev)), {m, 1});
  return ops::indexAdd(out, 0, indexTensor(sentTokens, dev), ops::mul(y, g));
}

Tensor MoE::forwardImpl(const Tensor& x) {
  KEEL_CHECK(x.dim() >= 2, "MoE '", fullPath(), "': expected input [..., d], got ",
             shapeStr(x.shape()));
  const int64_t c = x.size(-1), n = x.numel() / c, k = topK_;
  Tensor x2 = ops::reshape(x, {n, c});
  Tensor probs = ops::softmax(router_->forward(x2), -1);  // [N, E]
  auto [topv, topi] = ops::topk(probs, k, -1, true);      // [N, k]
  Tensor gates = ops::div(topv, ops::sum(topv, {-1}, true));
  Routing routing;
  if (isTraining() && ep_.routeRanks > 1) {  // the dp group's tokens are one batch
    const Tensor all = ops::allGather(ops::contiguous(topi), 0, "dp");  // [dp · N, k]
    const std::vector<int64_t> choice = hostInts(all);
    aux_ = scopeBalancingLoss(probs, choice, all.size(0));
    routing = route(choice, ep_.routeRank * n, all.size(0));
  } else {
    aux_ = loadBalancingLoss(probs, topi);
    routing = route(hostInts(topi), 0, n);
  }
  Tensor gatesFlat = ops::reshape(gates, {n * k});
  const Tensor out =
      ep_.on() ? exchangeWithExperts(x2, gatesFlat, routing) : runExperts(x2, gatesFlat, routing);
  return ops::reshape(out, x.shape());
}

}  // namespace keel::nn
