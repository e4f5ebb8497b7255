// libFuzzer target: checkpoint metadata JSON (keel-checkpoint.json) validation, then planning a
// tp=3 reshard of whatever it accepted. Any input must end in a plan or a keel::Error.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "keel/checkpoint.h"
#include "keel/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    keel::ckpt::Metadata m = keel::ckpt::metadataFromJson(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
    uint64_t elems = 0;
    for (const auto& k : m.keys) {
      uint64_t n = 1;
      for (auto d : k.shape) n *= uint64_t(d);
      elems += n;
    }
    if (elems > (uint64_t(1) << 24)) return 0;  // plans are linear in shards, not elements
    keel::ckpt::TargetSpec spec;
    spec.tp = 3;
    spec.axis = [](const std::string&, const keel::ckpt::Dims& s) { return int(s.size()) - 1; };
    keel::ckpt::Plan plan = keel::ckpt::makePlan(m, nullptr, spec);
    if (plan.bytesRead != plan.bytesWritten) __builtin_trap();  // shards tile every key
  } catch (const keel::Error&) {
  }
  return 0;
}
