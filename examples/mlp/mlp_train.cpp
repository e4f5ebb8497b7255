// The MLP as a standalone program that records itself: `mlp_train [steps] [out.db]` trains for
// `steps` steps (default 20) with a Keel capture Recorder writing every op, with MD5s and
// stacks, into out.db (default mlp.db). Open it with `keel-studio mlp.db`.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "keel/capture/recorder.h"
#include "keel/workload.h"

extern "C" const KeelWorkloadV1* keel_workload(void);  // mlp.cpp (KEEL_WORKLOAD)

int main(int argc, char** argv) try {
  int64_t steps = argc > 1 ? std::atoll(argv[1]) : 20;
  std::string out = argc > 2 ? argv[2] : "mlp.db";
  keel::capture::CaptureOptions options;
  options.md5 = true;
  options.stacks = true;
  keel::storage::RunInfo run;
  run.backend = run.device = "cpu";
  run.engineVersion = KEEL_VERSION_STRING;
  keel::capture::Recorder recorder(out, run, options);  // before the model: step 0 is recorded
  keel::WorkloadRun job({keel_workload(), "mlp", "", "linked"},
                        {.device = keel::Device("cpu"), .totalSteps = steps});
  for (int64_t i = 0; i < steps; ++i)
    std::printf("step %lld  loss %.4f\n", static_cast<long long>(i + 1), job.step().loss);
  recorder.finish();
  std::printf("recorded %s\n", out.c_str());
  return recorder.failed() ? 1 : 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "mlp_train: error: %s\n", e.what());
  return 2;
}
