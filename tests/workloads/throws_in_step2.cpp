// A test workload (tests/capture/workload_test.cpp): a one-layer regression whose first step runs
// normally and whose second step throws after its forward pass, as a buggy user model would. A
// config containing "fail_in_create" makes its constructor throw instead.
#include "keel/error.h"
#include "keel/ops.h"
#include "keel/workload.h"

namespace {

class ThrowsInStep2 : public keel::Workload {
 public:
  explicit ThrowsInStep2(const keel::WorkloadParams& p) : device_(p.device) {
    KEEL_CHECK(p.configJson.find("fail_in_create") == std::string::npos, "fail_in_create was set");
    keel::Generator gen(p.seed);
    w_ = keel::ops::normal({4, 1}, 0.0, 0.5, gen, keel::DType::Float32, device_);
    w_.setRequiresGrad();
    x_ = keel::ops::uniform({8, 4}, -1.0, 1.0, gen, keel::DType::Float32, device_);
  }

  keel::WorkloadMetrics step() override {
    ++steps_;
    keel::Tensor y = keel::ops::matmul(x_, w_);
    keel::Tensor loss = keel::ops::mean(y * y);
    KEEL_CHECK(steps_ < 2, "injected failure in step ", steps_);
    loss.backward();
    keel::WorkloadMetrics m;
    m.loss = loss.item();
    return m;
  }

 private:
  keel::Device device_;
  keel::Tensor w_, x_;
  int steps_ = 0;
};

}  // namespace

KEEL_WORKLOAD(ThrowsInStep2, "throws-in-step-2", "fails its second step (a loader test)")
