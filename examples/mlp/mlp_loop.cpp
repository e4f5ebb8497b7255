// A training loop of your own, recorded: `mlp_loop [epochs] [out.db]` fits y = sin(3x) with a
// two-layer network in mini-batches (4 per epoch, default 3 epochs) and marks each step with a
// keel::Step, numbered across the epochs, so the recording (default loop.db) has one step per
// mini-batch with its loss and learning rate. Open it with `keel inspect` or `keel-studio`.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "keel/capture/recorder.h"
#include "keel/nn.h"
#include "keel/ops.h"
#include "keel/optim.h"
#include "keel/step.h"

namespace {

using keel::Tensor;
namespace ops = keel::ops;

class Net : public keel::nn::UnaryModule {
 public:
  Net(keel::Generator& gen, keel::Device dev)
      : hidden_(registerModule("hidden",
                               std::make_shared<keel::nn::Linear>(1, 32, true, gen, dev, 1.0))),
        out_(registerModule("out",
                            std::make_shared<keel::nn::Linear>(32, 1, true, gen, dev, 0.2))) {}

 protected:
  Tensor forwardImpl(const Tensor& x) override { return (*out_)(ops::tanh((*hidden_)(x))); }

 private:
  std::shared_ptr<keel::nn::Linear> hidden_, out_;
};

}  // namespace

int main(int argc, char** argv) try {
  const int64_t epochs = argc > 1 ? std::atoll(argv[1]) : 3;
  const std::string out = argc > 2 ? argv[2] : "loop.db";
  constexpr int64_t kBatches = 4, kBatch = 32;
  keel::capture::CaptureOptions options;
  options.md5 = true;
  keel::storage::RunInfo run;
  run.backend = run.device = "cpu";
  keel::capture::Recorder recorder(out, run, options);  // before the model: step 0 builds it

  const keel::Device cpu("cpu");
  keel::Generator gen(7);
  Net net(gen, cpu);
  const double lr = 0.02;
  keel::optim::AdamW optimizer(net.parameters(), keel::optim::AdamWOptions{.lr = lr});
  std::vector<float> xs, ys;
  for (int64_t i = 0; i < kBatches * kBatch; ++i) {
    xs.push_back(float(i) / float(kBatches * kBatch) * 2.0f - 1.0f);
    ys.push_back(std::sin(3.0f * xs.back()));
  }
  const Tensor x = Tensor::fromVector(xs, {kBatches * kBatch, 1}, keel::DType::Float32, cpu);
  const Tensor y = Tensor::fromVector(ys, {kBatches * kBatch, 1}, keel::DType::Float32, cpu);

  for (int64_t epoch = 0; epoch < epochs; ++epoch)
    for (int64_t b = 0; b < kBatches; ++b) {
      keel::Step step(epoch * kBatches + b + 1);  // numbered across epochs
      const Tensor xb = ops::slice(x, 0, b * kBatch, (b + 1) * kBatch);
      const Tensor yb = ops::slice(y, 0, b * kBatch, (b + 1) * kBatch);
      optimizer.zeroGrad();
      Tensor err = net(xb) - yb;
      Tensor loss = ops::mean(err * err);
      loss.backward();
      const double gradNorm = keel::optim::clipGradNorm(optimizer.params(), 1.0);
      optimizer.step();
      step.end({.loss = loss.item(), .lr = lr, .gradNorm = gradNorm});
      std::printf("step %lld  loss %.4f\n", static_cast<long long>(step.number()), loss.item());
    }
  recorder.finish();
  std::printf("recorded %s\n", out.c_str());
  return recorder.failed() ? 1 : 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "mlp_loop: error: %s\n", e.what());
  return 2;
}
