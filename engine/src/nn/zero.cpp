// ShardedAdamW: AdamW with its state split across a data-parallel group (ZeRO stage 2). See
// Note [Sharded optimizer state] in keel/optim.h. Invariant: every rank of the group calls
// reduceGradients, clipGradNorm and step in the same order with the same parameters holding
// gradients, so the collectives pair up.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "keel/dispatch.h"
#include "keel/dist.h"
#include "keel/error.h"
#include "keel/observer.h"
#include "keel/ops.h"
#include "keel/optim.h"
#include "keel/train.h"

namespace keel::optim {

ShardedAdamW::ShardedAdamW(std::vector<Tensor> params, AdamWOptions opt, std::string group,
                           ShardedGrads shards)
    : Optimizer(std::move(params), opt.lr),
      opt_(opt),
      group_(std::move(group)),
      shards_(std::move(shards)) {
  KEEL_CHECK(opt.beta1 >= 0.0 && opt.beta1 < 1.0 && opt.beta2 >= 0.0 && opt.beta2 < 1.0,
             "AdamW: betas must be in [0, 1), got ", opt.beta1, ", ", opt.beta2);
  KEEL_CHECK(opt.eps > 0.0 && opt.weightDecay >= 0.0,
             "AdamW: eps must be > 0 and weight decay >= 0");
  const dist::GroupInfo g = dist::group(group_);
  rank_ = g.rank;
  size_ = g.size;
  for (const Tensor& p : params_) {
    KEEL_CHECK(p.dim() >= 1 && p.isContiguous(), "sharded optimizer: parameter '", p.name(),
               "' must be a contiguous tensor of rank >= 1");
    // The gathered rows are written with memcpy (step()); checked here, before any update.
    KEEL_CHECK(p.device().isHost(), "--zero: sharding the optimizer state of parameters on ",
               p.device().name(), " is not built yet (host parameters only)");
  }
  grads_.resize(params_.size());
  hasGrad_.assign(params_.size(), false);
  m_.resize(params_.size());
  v_.resize(params_.size());
  steps_.assign(params_.size(), 0);
}

namespace {

// Part `part` of `parts` of `rows` rows: [first, count), larger parts first.
std::pair<int64_t, int64_t> rowPart(int64_t rows, int parts, int part) {
  const int64_t base = rows / parts, extra = rows % parts;
  return {part * base + std::min<int64_t>(part, extra), base + (part < extra ? 1 : 0)};
}

int64_t rowElems(const Tensor& t) {
  return t.size(0) == 0 ? 0 : t.numel() / t.size(0);
}

// Rows [first, first + count) of t, flattened (a view of contiguous t).
Tensor flatRows(const Tensor& t, std::pair<int64_t, int64_t> rows) {
  return ops::reshape(ops::slice(t, 0, rows.first, rows.first + rows.second), {-1});
}

// A bucket's layout in the collectives: block j holds part j's rows of every parameter of the
// bucket, one after another, padded with zeros to the longest block (at least one element), so
// the blocks are equal.
struct Blocks {
  std::vector<int64_t> len;  // elements of each block before padding
  int64_t longest = 1;
};

Blocks bucketBlocks(const std::vector<Tensor>& params, const std::vector<size_t>& bucket,
                    int parts) {
  Blocks b;
  b.len.assign(size_t(parts), 0);
  for (int j = 0; j < parts; ++j)
    for (size_t i : bucket)
      b.len[size_t(j)] += rowPart(params[i].size(0), parts, j).second * rowElems(params[i]);
  b.longest = std::max<int64_t>(1, *std::max_element(b.len.begin(), b.len.end()));
  return b;
}

// Appends block j: part j's rows of each parameter's value (or gradient), then its padding.
void appendBlock(std::vector<Tensor>& out, const std::vector<Tensor>& params,
                 const std::vector<size_t>& bucket, int parts, int j, const Blocks& b,
                 bool gradients) {
  for (size_t i : bucket) {
    const auto rows = rowPart(params[i].size(0), parts, j);
    if (rows.second > 0) out.push_back(flatRows(gradients ? params[i].grad() : params[i], rows));
  }
  const Tensor& first = params[bucket.front()];
  if (b.len[size_t(j)] < b.longest)
    out.push_back(Tensor::zeros({b.longest - b.len[size_t(j)]}, first.dtype(), first.device()));
}

}  // namespace

std::pair<int64_t, int64_t> ShardedAdamW::rowsOf(size_t i, int part) const {
  return rowPart(params_.at(i).size(0), size_, part);
}

std::pair<int64_t, int64_t> ShardedAdamW::ownedRows(size_t i) const {
  return rowsOf(i, rank_);
}

std::vector<std::vector<size_t>> ShardedAdamW::buckets() const {
  std::vector<std::vector<size_t>> out;
  int64_t bytes = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!hasGrad_[i]) continue;
    const int64_t b = int64_t(params_[i].nbytes());
    if (out.empty() || (!out.back().empty() && bytes + b > kGradBucketBytes)) {
      out.emplace_back();
      bytes = 0;
    }
    out.back().push_back(i);
    bytes += b;
  }
  return out;
}

// Per bucket, one reduce_scatter of the blocks (Blocks): this rank keeps its rows' mean gradient.
void ShardedAdamW::reduceGradients() {
  NoGradGuard ng;
  PhaseGuard phase(Phase::Backward);
  ScopeGuard scope("dp_grad_sync", /*absolute=*/true);
  agreeOnGradients(params_, {}, group_);  // the buckets must be the same on every rank
  for (size_t i = 0; i < params_.size(); ++i) {
    hasGrad_[i] = params_[i].grad().defined();
    grads_[i] = Tensor();
  }
  for (const std::vector<size_t>& bucket : buckets()) {
    const Blocks blocks = bucketBlocks(params_, bucket, size_);
    std::vector<Tensor> pieces;
    for (int j = 0; j < size_; ++j)
      appendBlock(pieces, params_, bucket, size_, j, blocks, /*gradients=*/true);
    const Tensor mine = ops::reduceScatter(ops::concat(pieces, 0), 0, "mean", group_);
    int64_t at = 0;
    for (size_t i : bucket) {
      const auto [row, rows] = ownedRows(i);
      Shape shape = params_[i].shape();
      shape[0] = rows;
      const int64_t n = rows * rowElems(params_[i]);
      if (rows > 0) grads_[i] = ops::reshape(ops::slice(mine, 0, at, at + n), shape);
      at += n;
    }
  }
  for (Tensor& p : params_) p.setGrad(Tensor());  // ZeRO-2: only the owned rows' gradients stay
}

double ShardedAdamW::clipGradNorm(double maxNorm) {
  NoGradGuard ng;
  PhaseGuard phase(Phase::Optimizer);
  ScopeGuard scope("clip_grad_norm", /*absolute=*/true);
  const Device dev = params_.at(0).device();
  // [sum of squares of tensor-parallel shards, of replicated parameters], over this rank's rows.
  Tensor parts[2];
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!grads_[i].defined()) continue;
    const Tensor sq = ops::sum(ops::mul(grads_[i], grads_[i]));
    Tensor& into = parts[i < shards_.sharded.size() && shards_.sharded[i] ? 0 : 1];
    into = into.defined() ? ops::add(into, sq) : sq;
  }
  for (Tensor& t : parts) {
    if (!t.defined()) t = Tensor::zeros({}, DType::Float32, dev);
    if (t.dtype() != DType::Float32) t = ops::cast(t, DType::Float32);
    t = ops::reshape(t, {1});
  }
  const Tensor both = ops::allReduce(ops::concat({parts[0], parts[1]}, 0), "sum", group_);
  Tensor sharded = ops::slice(both, 0, 0, 1);
  if (!shards_.sharded.empty())
    sharded = ops::allReduce(ops::contiguous(sharded), "sum", shards_.group);
  const Tensor total = ops::sum(ops::add(sharded, ops::slice(both, 0, 1, 2)));
  const double norm = std::sqrt(total.item());
  if (maxNorm > 0.0 && norm > maxNorm) {
    const double coef = maxNorm / (norm + 1e-6);
    for (Tensor& g : grads_)
      if (g.defined()) g = ops::mulScalar(g, coef);
  }
  return norm;
}

void ShardedAdamW::step() {
  NoGradGuard ng;
  PhaseGuard phase(Phase::Optimizer);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!hasGrad_[i]) continue;
    ++steps_[i];  // every rank counts, owner of rows or not: the bias correction agrees
    const Tensor& p = params_[i];
    const auto [row, rows] = ownedRows(i);
    if (rows == 0) continue;
    ScopeGuard scope(p.name(), /*absolute=*/true);
    if (!m_[i].defined()) {
      MemTagScope tag(MemTag::OptimizerState);
      m_[i] = Tensor::zeros(grads_[i].shape(), p.dtype(), p.device());
      v_[i] = Tensor::zeros(grads_[i].shape(), p.dtype(), p.device());
    }
    const double wd = (opt_.decayMatricesOnly && p.dim() < 2) ? 0.0 : opt_.weightDecay;
    ops::adamwStep(ops::slice(p, 0, row, row + rows), grads_[i], m_[i], v_[i], lr_, opt_.beta1,
                   opt_.beta2, opt_.eps, wd, steps_[i]);
  }
  // Every rank's updated rows to every rank, bucket by bucket, in the reduce-scatter's layout.
  ScopeGuard scope("dp_param_gather", /*absolute=*/true);
  for (const std::vector<size_t>& bucket : buckets()) {
    const Blocks blocks = bucketBlocks(params_, bucket, size_);
    std::vector<Tensor> mine;
    appendBlock(mine, params_, bucket, size_, rank_, blocks, /*gradients=*/false);
    Tensor all = ops::allGather(ops::concat(mine, 0), 0, group_);
    if (!all.device().isHost()) all = all.to(Device(Backend::Cpu));
    for (size_t i : bucket) beforeBufferWrite(params_[i]);
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      const char* src = static_cast<const char*>(all.data()) +
                        size_t(j) * size_t(blocks.longest) * dtypeSize(all.dtype());
      for (size_t i : bucket) {
        const auto [row, rows] = rowsOf(i, j);
        const size_t bytes = size_t(rows * rowElems(params_[i])) * dtypeSize(all.dtype());
        std::memcpy(static_cast<char*>(params_[i].data()) +
                        size_t(row * rowElems(params_[i])) * dtypeSize(all.dtype()),
                    src, bytes);
        src += bytes;
      }
    }
    for (size_t i : bucket) params_[i].bumpVersion();
  }
  for (Tensor& g : grads_) g = Tensor();
}

std::vector<std::pair<std::string, Tensor>> ShardedAdamW::paramState(size_t i) const {
  if (steps_.at(i) == 0) return {};
  std::vector<std::pair<std::string, Tensor>> out;
  if (m_[i].defined()) out = {{"exp_avg", m_[i]}, {"exp_avg_sq", v_[i]}};
  out.emplace_back("step", Tensor::scalar(double(steps_[i]), DType::Int64, Device(Backend::Cpu)));
  return out;
}

std::vector<std::string> ShardedAdamW::stateNames() const {
  return adamWStateNames();
}

void ShardedAdamW::setParamState(size_t i, const std::string& name, const Tensor& value) {
  KEEL_CHECK(i < params_.size(), "AdamW: no parameter ", i);
  const Tensor& p = params_[i];
  if (name == "step") {
    KEEL_CHECK(value.defined() && value.numel() == 1, "optimizer state 'step' of '", p.name(),
               "' must be a scalar");
    steps_[i] = int64_t(value.item());
    return;
  }
  KEEL_CHECK(name == "exp_avg" || name == "exp_avg_sq", "optimizer has no state '", name,
             "' for parameter ", i);
  const auto [row, rows] = ownedRows(i);
  Shape piece = p.shape();
  piece[0] = rows;
  KEEL_CHECK(value.defined() && (value.shape() == p.shape() || value.shape() == piece),
             "optimizer state '", name, "' of '", p.name(), "': expected shape ",
             shapeStr(p.shape()), " or this rank's rows ", shapeStr(piece), ", got ",
             value.defined() ? shapeStr(value.shape()) : std::string("undefined"));
  NoGradGuard ng;
  Tensor t = value.shape() == piece ? value : ops::slice(value, 0, row, row + rows);
  t = t.to(p.device());
  if (t.dtype() != p.dtype()) t = ops::cast(t, p.dtype());
  t = ops::contiguous(t);
  if (rows == 0) return;  // this rank keeps no rows of it
  (name == "exp_avg" ? m_ : v_)[i] = t;
}

}  // namespace keel::optim
