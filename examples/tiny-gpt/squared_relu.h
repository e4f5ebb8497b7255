// squared_relu(x) = max(x, 0)², a user op (Primer's MLP activation) registered from outside Keel.
#pragma once
#include "keel/tensor.h"

namespace tiny_gpt {

// Registers "squared_relu" and "squared_relu_backward" on first use; float32, cpu and cpu-ref.
keel::Tensor squaredRelu(const keel::Tensor& x);

}  // namespace tiny_gpt
