// A test workload (tests/capture/workload_test.cpp) built with full debug information (-g), as a
// user's model often is: its matmul is called through a helper in an anonymous namespace that is
// always inlined, so the helper has no symbol and no linkage name of its own. Stacks must still
// name it with its namespaces, as the demangler names the same function when it is not inlined.
#include "keel/ops.h"
#include "keel/workload.h"

namespace user_model {
namespace {

[[gnu::always_inline]] inline keel::Tensor project(const keel::Tensor& x, const keel::Tensor& w) {
  return keel::ops::matmul(x, w);
}

class InlinedHelper : public keel::Workload {
 public:
  explicit InlinedHelper(const keel::WorkloadParams& p) {
    keel::Generator gen(p.seed);
    w_ = keel::ops::normal({4, 1}, 0.0, 0.5, gen, keel::DType::Float32, p.device);
    w_.setRequiresGrad();
    x_ = keel::ops::uniform({8, 4}, -1.0, 1.0, gen, keel::DType::Float32, p.device);
  }

  keel::WorkloadMetrics step() override {
    keel::Tensor y = project(x_, w_);
    keel::Tensor loss = keel::ops::mean(y * y);
    loss.backward();
    keel::WorkloadMetrics m;
    m.loss = loss.item();
    return m;
  }

 private:
  keel::Tensor w_, x_;
};

}  // namespace
}  // namespace user_model

KEEL_WORKLOAD(user_model::InlinedHelper, "inlined-helper",
              "calls matmul through an inlined anonymous-namespace helper (a stacks test)")
