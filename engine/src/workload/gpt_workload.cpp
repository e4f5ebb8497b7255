// The built-in GPT/MoE trainer as a workload (keel::gptWorkload()): the same C entry-point struct a
// workload library exports, so `keel record` runs built-in and user models through one path.
// The Trainer marks its own step boundaries (KEEL_WORKLOAD_MARKS_STEPS).
#include <memory>

#include "keel/data.h"
#include "keel/error.h"
#include "keel/gpt_config.h"
#include "keel/train.h"
#include "keel/workload.h"

namespace keel {
namespace {

class GptWorkload : public Workload {
 public:
  explicit GptWorkload(const WorkloadParams& p)
      : trainer_(config(p), p.device, p.seed, dataset(p), p.totalSteps) {}

  WorkloadMetrics step() override {
    StepStats s = trainer_.step();
    WorkloadMetrics m;
    m.loss = s.loss;
    m.lr = s.lr;
    m.gradNorm = s.gradNorm;
    m.tokensPerSec = s.tokensPerSec;
    return m;
  }

 private:
  static GptConfig config(const WorkloadParams& p) {
    KEEL_CHECK(!p.configJson.empty(), "the gpt workload needs a model config (--config FILE)");
    return parseGptConfig(p.configJson, p.configPath.empty() ? "<string>" : p.configPath);
  }
  static std::shared_ptr<const data::TextDataset> dataset(const WorkloadParams& p) {
    return std::make_shared<const data::TextDataset>(p.dataPath.empty()
                                                         ? data::TextDataset::defaultCorpus()
                                                         : data::TextDataset::load(p.dataPath));
  }
  Trainer trainer_;
};

constexpr KeelWorkloadV1 kGptWorkload = detail::makeWorkloadV1<GptWorkload>(
    "gpt", "the built-in GPT / MoE trainer (configs/*.json)", KEEL_WORKLOAD_MARKS_STEPS);

}  // namespace

WorkloadInfo gptWorkload() {
  return WorkloadInfo{&kGptWorkload, kGptWorkload.name, kGptWorkload.description, "built-in"};
}

}  // namespace keel
