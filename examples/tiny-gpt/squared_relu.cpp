// A user op in the five places an op needs (docs/api.md, "Your own op"): the registry entry with
// shape inference, a forward kernel, a backward op with its kernel, the backward rule, and a test
// (check it against central differences, as docs/api.md says). Kernels see contiguous float32
// tensors: the wrapper makes its inputs contiguous and the registry allocates contiguous outputs.
#include "squared_relu.h"

#include "keel/dispatch.h"
#include "keel/error.h"
#include "keel/ops.h"
#include "keel/registry.h"

namespace tiny_gpt {
namespace {

using keel::Tensor;

void requireFloat32(std::string_view op, const Tensor& t) {
  KEEL_CHECK(t.dtype() == keel::DType::Float32, "op '", op, "': expects float32, got ",
             keel::dtypeName(t.dtype()), " ", keel::shapeStr(t.shape()));
}

// y = max(x, 0)²
void forwardKernel(const keel::KernelCtx& c) {
  const float* x = c.inputs[0].data<float>();
  float* y = c.outputs[0].data<float>();
  for (int64_t i = 0, n = c.outputs[0].numel(); i < n; ++i) y[i] = x[i] > 0 ? x[i] * x[i] : 0.0f;
}

// dx = dy · 2·max(x, 0)
void backwardKernel(const keel::KernelCtx& c) {
  const float* dy = c.inputs[0].data<float>();
  const float* x = c.inputs[1].data<float>();
  float* dx = c.outputs[0].data<float>();
  for (int64_t i = 0, n = c.outputs[0].numel(); i < n; ++i)
    dx[i] = x[i] > 0 ? 2.0f * x[i] * dy[i] : 0.0f;
}

struct Ids {
  int forward = -1, backward = -1;
};

const Ids& ids() {
  static const Ids ids = [] {
    keel::Registry& r = keel::Registry::get();
    Ids out;
    keel::OpDef bwd;
    bwd.name = "squared_relu_backward";
    bwd.numInputs = 2;  // grad_out, x
    bwd.infer = [](const keel::OpDef&, std::span<const Tensor> in, const keel::Attrs&) {
      requireFloat32("squared_relu_backward", in[0]);
      requireFloat32("squared_relu_backward", in[1]);
      KEEL_CHECK(in[0].shape() == in[1].shape(), "op 'squared_relu_backward': grad ",
                 keel::shapeStr(in[0].shape()), " does not match input ",
                 keel::shapeStr(in[1].shape()));
      return std::vector<keel::TensorMeta>{{in[1].shape(), keel::DType::Float32}};
    };
    out.backward = r.add(std::move(bwd));

    keel::OpDef fwd;
    fwd.name = "squared_relu";
    fwd.numInputs = 1;
    fwd.infer = [](const keel::OpDef&, std::span<const Tensor> in, const keel::Attrs&) {
      requireFloat32("squared_relu", in[0]);
      return std::vector<keel::TensorMeta>{{in[0].shape(), keel::DType::Float32}};
    };
    int backwardId = out.backward;
    fwd.backward = [backwardId](const keel::BackwardCtx& c) -> std::vector<Tensor> {
      return {keel::dispatch(backwardId, {c.gradOutputs[0].contiguous(), c.inputs[0]})[0]};
    };
    out.forward = r.add(std::move(fwd));

    // The same plain loops serve both host backends.
    for (keel::Backend b : {keel::Backend::Cpu, keel::Backend::CpuRef}) {
      r.setKernel(out.forward, b, forwardKernel, keel::dtypeBit(keel::DType::Float32));
      r.setKernel(out.backward, b, backwardKernel, keel::dtypeBit(keel::DType::Float32));
    }
    return out;
  }();
  return ids;
}

}  // namespace

Tensor squaredRelu(const Tensor& x) {
  return keel::dispatch(ids().forward, {x.contiguous()})[0];
}

}  // namespace tiny_gpt
