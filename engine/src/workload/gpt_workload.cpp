// The built-in GPT/MoE trainer as a workload (keel::gptWorkload()): the same C entry-point struct a
// workload library exports, so `keel record` runs built-in and user models through one path.
// The Trainer marks its own step boundaries (KEEL_WORKLOAD_MARKS_STEPS).
//
// Note [Built-in config parsed once]
// A workload's create() gets its config as JSON text through the C ABI (KeelWorkloadParams), and
// a library parses it itself. The built-in trainer's host (capture's RecordingRun) must parse the
// config before anything is created, to validate it and to read its name and "allocator"; parsing
// it again inside create() would be a second reading of the same text. So the host hands its
// parsed GptConfig to gptWorkloadRun, which builds the workload in process (a C++ call, no C
// boundary: both sides are this library) and adopts the instance into a WorkloadRun stepped and
// destroyed through the same entry points (kGptWorkload) as any library's. The C path,
// WorkloadRun(gptWorkload(), params), still parses params.configJson for callers without a
// parsed config; the ABI is untouched.
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
  explicit GptWorkload(const WorkloadParams& p) : GptWorkload(config(p), p) {}
  GptWorkload(const GptConfig& c, const WorkloadParams& p)
      : trainer_(c, p.device, p.seed, dataset(p), p.totalSteps) {}

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

constexpr KeelWorkloadV1 kGptWorkload =
    detail::makeWorkloadV1<GptWorkload>("gpt", "the built-in GPT / MoE trainer (configs/*.json)",
                                        KEEL_WORKLOAD_MARKS_STEPS | KEEL_WORKLOAD_REPORTS_METRICS);

}  // namespace

WorkloadInfo gptWorkload() {
  return WorkloadInfo{&kGptWorkload, kGptWorkload.name, kGptWorkload.description, "built-in"};
}

std::unique_ptr<WorkloadRun> gptWorkloadRun(const GptConfig& config, const WorkloadParams& params) {
  // Note [Built-in config parsed once]: the instance is what kGptWorkload.create would make.
  return std::unique_ptr<WorkloadRun>(
      new WorkloadRun(gptWorkload(), [&]() -> void* { return new GptWorkload(config, params); }));
}

}  // namespace keel
