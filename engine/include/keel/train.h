// Trainer: builds a GPT from a config on a device with a seed, and runs training steps (forward,
// backward, grad clipping, LR schedule, optimizer step), reporting per-step statistics. Shared by
// the `keel` CLI, tests, benchmarks and the studio. Invariant: a run is a pure function of
// (config, device, seed, dataset, totalSteps): the same inputs give the same bits.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "keel/context_parallel.h"
#include "keel/data.h"
#include "keel/gpt_config.h"
#include "keel/nn.h"
#include "keel/optim.h"

namespace keel {

struct StepStats {
  int64_t step = 0;     // 1-based
  double loss = 0;      // total loss (lm + aux_loss_coef · aux)
  double lmLoss = 0;    // cross entropy
  double auxLoss = 0;   // MoE aux loss (0 for a dense model)
  double lr = 0;        // learning rate used by this step
  double gradNorm = 0;  // before clipping
  double seconds = 0;   // wall time of the step
  double tokensPerSec = 0;
  // Validation loss (GptConfig::eval_every): NaN on steps without one.
  double valLoss = std::numeric_limits<double>::quiet_NaN();
};
using StepCallback = std::function<void(const StepStats&)>;

// Note [Data-parallel steps]: under a dp × tp layout (keel/dist.h, started before the Trainer is
// made) every rank draws the same global batch of batch_size rows and trains on its dp rank's
// batch_size / dp rows; after backward the gradients are averaged over the dp group (all_reduce
// mean, in buckets of up to kGradBucketBytes, parameters in order), so every replica takes the
// same update and the run follows the single-process loss curve of the same global batch (summed
// in another order: equal within tolerance, not bit for bit). The reported loss is the dp mean.
// Tensor parallelism is the model's (Note [Tensor-parallel layers]); the gradient norm sums the
// shards' squares over the tp group.
inline constexpr int64_t kGradBucketBytes = int64_t(16) << 20;

class Trainer {
 public:
  // totalSteps sets the length of the cosine schedule. Throws keel::Error on a bad config or a
  // vocabulary smaller than the tokenizer's, or a layout that does not divide the batch (dp) or
  // the heads and d_ff (tp).
  Trainer(const GptConfig& cfg, Device device, uint64_t seed,
          std::shared_ptr<const data::TextDataset> dataset, int64_t totalSteps);

  StepStats step();
  // Runs `steps` steps, calling cb after each; returns their statistics.
  std::vector<StepStats> run(int64_t steps, const StepCallback& cb = {});
  // Mean lm loss over `batches` validation batches (eval mode, no grad; own fixed generator).
  double evaluate(int64_t batches);

  nn::GPT& model() { return *model_; }
  optim::Optimizer& optimizer() { return *optimizer_; }
  const GptConfig& config() const { return cfg_; }
  const optim::LrSchedule& schedule() const { return schedule_; }
  int64_t stepsDone() const { return stepsDone_; }
  uint64_t seed() const { return seed_; }
  const data::TextDataset& dataset() const { return *data_; }
  // Checkpoint support (engine/src/ckpt/train_ckpt.cpp): the batch generator and the progress
  // counters. Restoring them with the weights, the optimizer state and the model's dropout
  // generator resumes a run bit for bit (Note [Resume bit for bit]).
  Generator& batchGenerator() { return batchGen_; }
  void restoreProgress(int64_t stepsDone, uint64_t seed);
  int dataParallelSize() const { return dpSize_; }
  // Under --cp: the share of the config's attention mask each rank of a cp group computes, under
  // `split` (one row of seq_len tokens; a causal_document row as one document).
  std::vector<double> contextWorkShares(cp::Split split) const;
  int dataParallelRank() const { return dpRank_; }

 private:
  void syncGradients();  // Note [Data-parallel steps]
  // This rank's zig-zag part of each row of (inputs, targets) (Note [Context-parallel attention]).
  void shardSequence(std::pair<Tensor, Tensor>& batch) const;
  // The gradients of the parameters `which` accepts (all when empty), averaged over `group` in
  // buckets and multiplied by `scale`.
  void syncGradientBuckets(const std::function<bool(const std::string&)>& which,
                           const std::string& group, double scale);
  double dpMean(const Tensor& scalar);  // a scalar averaged over the dp group, on the host

  GptConfig cfg_;
  Device device_;
  uint64_t seed_;
  std::shared_ptr<const data::TextDataset> data_;
  std::unique_ptr<nn::GPT> model_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  optim::LrSchedule schedule_;
  Generator batchGen_;
  int64_t stepsDone_ = 0;
  int dpSize_ = 1, dpRank_ = 0;
  int expertRanks_ = 1;                  // ep (Note [Expert-parallel MoE])
  int cpSize_ = 1, cpRank_ = 0;          // Note [Context-parallel attention]
  optim::ShardedGrads shards_;           // which parameters are tensor-parallel shards
  optim::ShardedAdamW* zero_ = nullptr;  // optimizer_ under --zero (Note [Sharded optimizer state])
};

// Worker threads of the cpu backend (n <= 0: the default, KEEL_NUM_THREADS or the core count).
void setCpuThreads(int n);
int cpuThreads();

}  // namespace keel
