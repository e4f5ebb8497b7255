// A small MLP classifier (2 -> hidden -> hidden -> classes, ReLU) trained with AdamW on points
// drawn around `classes` centres on a circle. The whole model and its training step, written
// against Keel's public API only; KEEL_WORKLOAD at the bottom makes it a workload library.
// Config (all optional): {"hidden": 32, "classes": 3, "samples": 256, "lr": 0.01, "spread": 0.35}
#include <cmath>
#include <memory>
#include <numbers>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "keel/error.h"
#include "keel/nn.h"
#include "keel/ops.h"
#include "keel/optim.h"
#include "keel/workload.h"

namespace {

using keel::Tensor;
namespace ops = keel::ops;

struct MlpConfig {
  int64_t hidden = 32, classes = 3, samples = 256;
  double lr = 0.01, spread = 0.35;
};

MlpConfig parseConfig(const std::string& text) {
  MlpConfig c;
  if (text.empty()) return c;
  auto j = nlohmann::json::parse(text);  // its parse_error is a std::exception: fails the session
  c.hidden = j.value("hidden", c.hidden);
  c.classes = j.value("classes", c.classes);
  c.samples = j.value("samples", c.samples);
  c.lr = j.value("lr", c.lr);
  c.spread = j.value("spread", c.spread);
  KEEL_CHECK(c.hidden > 0 && c.classes > 1 && c.samples > 0 && c.lr > 0,
             "mlp: hidden, samples and lr must be positive and classes at least 2");
  return c;
}

// The network: a module tree, so every op is reported under its scope ("fc1", "fc2", "out").
class Mlp : public keel::nn::UnaryModule {
 public:
  Mlp(const MlpConfig& c, keel::Generator& gen, keel::Device dev)
      : fc1_(registerModule("fc1",
                            std::make_shared<keel::nn::Linear>(2, c.hidden, true, gen, dev, 0.5))),
        fc2_(registerModule(
            "fc2", std::make_shared<keel::nn::Linear>(c.hidden, c.hidden, true, gen, dev, 0.2))),
        out_(registerModule(
            "out", std::make_shared<keel::nn::Linear>(c.hidden, c.classes, true, gen, dev, 0.2))) {}

 protected:
  Tensor forwardImpl(const Tensor& x) override {
    return (*out_)(ops::relu((*fc2_)(ops::relu((*fc1_)(x)))));
  }

 private:
  std::shared_ptr<keel::nn::Linear> fc1_, fc2_, out_;
};

}  // namespace

class MlpWorkload : public keel::Workload {
 public:
  explicit MlpWorkload(const keel::WorkloadParams& p) : cfg_(parseConfig(p.configJson)) {
    keel::Generator gen(p.seed);
    model_ = std::make_shared<Mlp>(cfg_, gen, p.device);
    opt_ = std::make_unique<keel::optim::AdamW>(model_->parameters(),
                                                keel::optim::AdamWOptions{.lr = cfg_.lr});
    // The data set: `samples` points, class k around angle 2πk/classes.
    std::mt19937_64 rng(p.seed);
    std::normal_distribution<float> noise(0.0f, float(cfg_.spread));
    std::vector<float> xs;
    std::vector<int64_t> ys;
    for (int64_t i = 0; i < cfg_.samples; ++i) {
      int64_t k = i % cfg_.classes;
      double a = 2 * std::numbers::pi * double(k) / double(cfg_.classes);
      xs.push_back(float(std::cos(a)) + noise(rng));
      xs.push_back(float(std::sin(a)) + noise(rng));
      ys.push_back(k);
    }
    x_ = Tensor::fromVector(xs, {cfg_.samples, 2}, keel::DType::Float32, p.device);
    y_ = Tensor::fromVector(ys, {cfg_.samples}, keel::DType::Int64, p.device);
  }

  keel::WorkloadMetrics step() override {
    opt_->zeroGrad();
    Tensor loss = ops::crossEntropy((*model_)(x_), y_);
    loss.backward();
    opt_->step();
    keel::WorkloadMetrics m;
    m.loss = loss.item();
    m.lr = cfg_.lr;
    return m;
  }

 private:
  MlpConfig cfg_;
  std::shared_ptr<Mlp> model_;
  std::unique_ptr<keel::optim::AdamW> opt_;
  Tensor x_, y_;
};

KEEL_WORKLOAD(MlpWorkload, "mlp", "a small MLP classifier on generated 2-D data")
