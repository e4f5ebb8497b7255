// The training loop behind `keel train`, the tests and the studio: one step = batch, forward,
// backward, clip, schedule, optimizer update. Invariant: all randomness comes from generators
// seeded by the run's seed (weights: seed; batches and dropout: seeds derived from it).
#include "keel/train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "keel/base/text.h"
#include "keel/dist.h"
#include "keel/error.h"
#include "keel/log.h"
#include "keel/observer.h"
#include "keel/step.h"
#include "parallel.h"

namespace keel {
namespace {

double hostScalar(const Tensor& t) {
  return t.item();  // a device scalar is read back outside the op stream
}

constexpr uint64_t kBatchSeedSalt = 0x6261746368657321ull;  // "batches!"
constexpr uint64_t kEvalSeedSalt = 0x6576616c75617465ull;   // "evaluate"

}  // namespace

void setCpuThreads(int n) {
  if (n > 0) setNumThreads(n);
}
int cpuThreads() {
  return numThreads();
}

Trainer::Trainer(const GptConfig& cfg, Device device, uint64_t seed,
                 std::shared_ptr<const data::TextDataset> dataset, int64_t totalSteps)
    : cfg_(cfg),
      device_(device),
      seed_(seed),
      data_(std::move(dataset)),
      batchGen_(seed ^ kBatchSeedSalt) {
  validateGptConfig(cfg_);
  KEEL_CHECK(data_ != nullptr, "Trainer: no dataset");
  KEEL_CHECK(cfg_.vocab_size >= data::ByteTokenizer::kVocabSize,
             "config field 'vocab_size': ", cfg_.vocab_size,
             " is smaller than the byte tokenizer's vocabulary (", data::ByteTokenizer::kVocabSize,
             ")");
  KEEL_CHECK(totalSteps > 0, "Trainer: the number of steps must be positive, got ", totalSteps);
  KEEL_CHECK(data_->splitTokens(data::Split::Train) >= cfg_.seq_len + 1, data_->source(),
             ": the train split has ", data_->splitTokens(data::Split::Train),
             " tokens, fewer than seq_len + 1 = ", cfg_.seq_len + 1);
  KEEL_CHECK(cfg_.eval_every == 0 || data_->splitTokens(data::Split::Val) >= cfg_.seq_len + 1,
             "config field 'eval_every': ", data_->source(), "'s validation split has ",
             data_->splitTokens(data::Split::Val),
             " tokens, fewer than seq_len + 1 = ", cfg_.seq_len + 1);
  // The parallel layout (keel/dist.h; {1, 1} for a process alone).
  const dist::Layout layout = dist::layout();
  dpSize_ = layout.dp;
  dpRank_ = dist::group("dp").rank;
  // Under --cp, cp consecutive dp ranks share rows and split their sequence (Note
  // [Context-parallel attention]): the batch is split dp / cp ways.
  cpSize_ = layout.cp;
  cpRank_ = dist::group("cp").rank;
  checkGptLayout(cfg_, layout.dp, layout.tp, layout.ep, layout.cp);  // as keel launch checks it
  nn::TensorParallel tp{layout.tp, dist::group("tp").rank, "tp", layout.vocab};
  // Note [Expert-parallel MoE]: a MoE model routes the dp group's tokens as one batch.
  const nn::ExpertParallel ep{layout.ep, dist::group("ep").rank, dpSize_, dpRank_};
  expertRanks_ = layout.ep;
  KEEL_CHECK(!layout.zero || layout.ep == 1,
             "--zero with --ep: sharding the optimizer state of expert-parallel runs is not built "
             "yet");
  {
    MemTagScope tag(MemTag::Parameter);
    model_ = std::make_unique<nn::GPT>(cfg_, device_, seed_, tp, ep,
                                       nn::ContextParallel{cpSize_, cpRank_, "cp"});
  }
  if (tp.on())
    for (const auto& [name, p] : model_->namedParameters())
      shards_.sharded.push_back(model_->isShardedParameter(name));
  if (ep.on()) {  // the experts are split over the ep group: their norms sum over it
    shards_.group = "ep";
    for (const auto& [name, p] : model_->namedParameters())
      shards_.sharded.push_back(nn::GPT::isExpertParameter(name));
  }
  optim::AdamWOptions adamw;
  adamw.lr = cfg_.lr;
  adamw.beta1 = cfg_.beta1;
  adamw.beta2 = cfg_.beta2;
  adamw.eps = cfg_.eps;
  adamw.weightDecay = cfg_.weight_decay;
  if (layout.zero) {  // Note [Sharded optimizer state]
    KEEL_CHECK(cfg_.optimizer == "adamw",
               "--zero shards AdamW's state; config field 'optimizer' is '", cfg_.optimizer, "'");
    auto sharded =
        std::make_unique<optim::ShardedAdamW>(model_->parameters(), adamw, "dp", shards_);
    zero_ = sharded.get();
    optimizer_ = std::move(sharded);
  } else if (cfg_.optimizer == "sgd") {
    optimizer_ = std::make_unique<optim::SGD>(
        model_->parameters(),
        optim::SgdOptions{cfg_.lr, cfg_.momentum, cfg_.weight_decay, cfg_.nesterov});
  } else {
    optimizer_ = std::make_unique<optim::AdamW>(model_->parameters(), adamw);
  }
  schedule_ = optim::LrSchedule{cfg_.lr, cfg_.min_lr, cfg_.warmup_steps, totalSteps};
}

void Trainer::restoreProgress(int64_t stepsDone, uint64_t seed) {
  KEEL_CHECK(stepsDone >= 0, "Trainer: cannot resume at step ", stepsDone);
  stepsDone_ = stepsDone;
  seed_ = seed;
}

StepStats Trainer::step() {
  auto t0 = std::chrono::steady_clock::now();
  const int64_t paused0 = detail::pausedNs();  // Note [Paused time]
  StepStats s;
  s.step = stepsDone_ + 1;
  s.lr = schedule_.at(stepsDone_);
  optimizer_->setLr(s.lr);
  detail::notifyStep({s.step, true, 0.0, 0});

  auto [x, y] = [&] {
    MemTagScope tag(MemTag::Data);
    auto batch =
        data_->getBatch(cfg_.batch_size, cfg_.seq_len, batchGen_, data::Split::Train, device_);
    if (dpSize_ > 1) {  // this replica's rows of the global batch (Note [Data-parallel steps])
      NoGradGuard ng;
      const int64_t rows = cfg_.batch_size / (dpSize_ / cpSize_), slice = dpRank_ / cpSize_;
      for (Tensor* t : {&batch.first, &batch.second})
        *t = ops::contiguous(ops::slice(*t, 0, slice * rows, (slice + 1) * rows));
    }
    if (cpSize_ > 1) shardSequence(batch);
    return batch;
  }();
  model_->train();
  optimizer_->zeroGrad();
  nn::GptOutput out = model_->forward(x, y);
  out.loss.backward();
  if (zero_) {
    zero_->reduceGradients();
    s.gradNorm = zero_->clipGradNorm(cfg_.grad_clip);
  } else {
    if (dpSize_ > 1) syncGradients();
    s.gradNorm = optim::clipGradNorm(optimizer_->params(), cfg_.grad_clip, shards_);
  }
  optimizer_->step();

  s.loss = dpMean(out.loss);
  s.lmLoss = dpMean(out.lmLoss);
  s.auxLoss = out.auxLoss.defined() ? dpMean(out.auxLoss) : 0.0;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() -
              double(detail::pausedNs() - paused0) / 1e9;  // not the time a debugger held it
  s.tokensPerSec = s.seconds > 0 ? double(cfg_.batch_size * cfg_.seq_len) / s.seconds : 0.0;
  ++stepsDone_;
  // The validation loss, after the update and outside the step's time (its ops are recorded in
  // the step, after the optimizer's, in phase forward). evaluate() draws from its own generator
  // and dropout is off in eval mode, so training is bitwise the same with or without it.
  if (cfg_.eval_every > 0 && s.step % cfg_.eval_every == 0) s.valLoss = evaluate(cfg_.eval_batches);
  // One line per step in the run's logs (the studio's log view, `keel record`'s recording).
  StepMetrics m{s.loss, s.lr, s.gradNorm, {}, s.tokensPerSec, {}};
  if (out.auxLoss.defined()) m.auxLoss = s.auxLoss;  // a dense model has none (NULL, not 0)
  if (cfg_.eval_every > 0 && s.step % cfg_.eval_every == 0) m.valLoss = s.valLoss;  // NaN too
  detail::endStep(s.step, m);
  return s;
}

void Trainer::syncGradients() {
  NoGradGuard ng;
  PhaseGuard phase(Phase::Backward);
  ScopeGuard scope("dp_grad_sync", /*absolute=*/true);
  // Under expert parallelism an expert's gradient is the sum over the tokens of its ep group: it
  // is averaged over the ranks holding the same expert (edp) and divided by ep (Note
  // [Expert-parallel MoE]); everything else is averaged over dp.
  if (expertRanks_ > 1) {
    syncGradientBuckets([](const std::string& n) { return !nn::GPT::isExpertParameter(n); }, "dp",
                        1.0);
    syncGradientBuckets(nn::GPT::isExpertParameter, "edp", 1.0 / double(expertRanks_));
  } else {
    syncGradientBuckets({}, "dp", 1.0);
  }
}

void Trainer::syncGradientBuckets(const std::function<bool(const std::string&)>& which,
                                  const std::string& group, double scale) {
  const std::vector<Tensor>& params = optimizer_->params();
  const bool alone = dist::group(group).size == 1;
  // A MoE expert may have a gradient on some ranks only (no tokens reached it on the others).
  if (cfg_.isMoe() && !alone)
    optim::agreeOnGradients(
        params, [&](const Tensor& p) { return !which || which(p.name()); }, group);
  // Buckets of consecutive parameters with gradients, each at most kGradBucketBytes (a larger
  // gradient is a bucket of its own): one all_reduce per bucket.
  std::vector<size_t> bucket;
  int64_t bytes = 0;
  auto flush = [&] {
    if (bucket.empty()) return;
    std::vector<Tensor> flat;
    std::vector<int64_t> sizes;
    for (size_t i : bucket) {
      const Tensor g = params[i].grad();
      flat.push_back(ops::reshape(g, {g.numel()}));
      sizes.push_back(g.numel());
    }
    Tensor mean = flat.size() == 1 ? ops::contiguous(flat[0]) : ops::concat(flat, 0);
    if (!alone) mean = ops::allReduce(mean, "mean", group);
    if (scale != 1.0) mean = ops::mulScalar(mean, scale);
    const std::vector<Tensor> parts = ops::split(mean, sizes, 0);
    for (size_t k = 0; k < bucket.size(); ++k)
      params[bucket[k]].setGrad(ops::reshape(parts[k], params[bucket[k]].shape()));
    bucket.clear();
    bytes = 0;
  };
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].grad().defined() || (which && !which(params[i].name()))) continue;
    const int64_t b = int64_t(params[i].grad().nbytes());
    if (!bucket.empty() && bytes + b > kGradBucketBytes) flush();
    bucket.push_back(i);
    bytes += b;
  }
  flush();
}

double Trainer::dpMean(const Tensor& scalar) {
  if (dpSize_ == 1) return hostScalar(scalar);
  NoGradGuard ng;
  ScopeGuard scope("dp_loss", /*absolute=*/true);
  return hostScalar(ops::allReduce(scalar, "mean", "dp"));
}

std::vector<StepStats> Trainer::run(int64_t steps, const StepCallback& cb) {
  std::vector<StepStats> all;
  all.reserve(size_t(std::clamp<int64_t>(steps, 0, 1 << 16)));  // grows past that (a long run)
  for (int64_t i = 0; i < steps; ++i) {
    all.push_back(step());
    if (cb) cb(all.back());
  }
  return all;
}

void Trainer::shardSequence(std::pair<Tensor, Tensor>& batch) const {
  NoGradGuard ng;
  for (Tensor* t : {&batch.first, &batch.second})
    *t = cp::shard(*t, 1, cpSize_, cpRank_, cp::Split::ZigZag);
}

std::vector<double> Trainer::contextWorkShares(cp::Split split) const {
  const flashmask::Mask mask = nn::rowMask(cfg_.attention_mask, cfg_.seq_len, cfg_.attention_window,
                                           cfg_.attention_global, Device(Backend::Cpu));
  return cp::workShares(mask, cfg_.seq_len, cpSize_, split);
}

double Trainer::evaluate(int64_t batches) {
  KEEL_CHECK(batches > 0, "evaluate: the number of batches must be positive, got ", batches);
  NoGradGuard ng;
  Generator gen(seed_ ^ kEvalSeedSalt);
  model_->eval();
  double total = 0;
  for (int64_t i = 0; i < batches; ++i) {
    auto batch = data_->getBatch(cfg_.batch_size, cfg_.seq_len, gen, data::Split::Val, device_);
    if (cpSize_ == 1) {
      total += hostScalar(model_->forward(batch.first, batch.second).lmLoss);
      continue;
    }
    // Every rank of a cp group evaluates its part of the rows; the mean of the parts (equal
    // sizes) is the rows' loss.
    shardSequence(batch);
    const Tensor part = model_->forward(batch.first, batch.second).lmLoss;
    ScopeGuard scope("cp_val_loss", /*absolute=*/true);
    total += hostScalar(ops::allReduce(part, "mean", "cp"));
  }
  model_->train();
  return total / double(batches);
}

}  // namespace keel
