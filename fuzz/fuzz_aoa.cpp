// libFuzzer target: the AOA parser and evaluator on arbitrary rule text, against a small
// GPT-like key space with optimizer state. Any input must end in a result or a keel::Error.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "keel/aoa.h"
#include "keel/error.h"

namespace {

std::vector<keel::aoa::SourceKey> keys() {
  using keel::st::DType;
  std::vector<keel::aoa::SourceKey> k;
  for (int l = 0; l < 3; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    k.push_back({b + "attn.qkv.weight", DType::F32, {24, 8}});
    k.push_back({b + "attn.qkv.weight::exp_avg", DType::F32, {24, 8}});
    k.push_back({b + "attn.qkv.weight::step", DType::I64, {}});
    k.push_back({b + "attn.proj.weight", DType::F32, {8, 8}});
    for (int e = 0; e < 2; ++e)
      k.push_back({b + "experts." + std::to_string(e) + ".w1", DType::BF16, {16, 8}});
    k.push_back({b + "norm.weight", DType::F32, {8}});
  }
  k.push_back({"wte.weight", DType::F32, {32, 8}});
  k.push_back({"x3", DType::F16, {2, 3, 4}});
  return k;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto sources = keys();
  try {
    keel::aoa::Program p =
        keel::aoa::parse(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.aoa");
    keel::aoa::Result r = keel::aoa::apply(&p, sources);
    // Pieces stay inside their source keys.
    for (const auto& k : r.keys)
      for (const auto& pc : k.pieces)
        for (size_t d = 0; d < pc.shape.size(); ++d) {
          const auto& s = sources[pc.src].shape;
          const size_t a = size_t(pc.perm[d]);
          if (pc.srcOff[a] < 0 || pc.srcOff[a] + pc.shape[d] > s[a]) __builtin_trap();
          if (pc.dstOff[d] < 0 || pc.dstOff[d] + pc.shape[d] > k.shape[d]) __builtin_trap();
        }
  } catch (const keel::Error&) {
  }
  return 0;
}
