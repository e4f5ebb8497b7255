// libFuzzer target: the safetensors reader's header validation on arbitrary file images.
// Any input must end in a parsed header or a keel::Error — never a crash, a leak or an
// out-of-bounds read (built with -fsanitize=fuzzer,address,undefined; see fuzz/run.sh).
#include <cstddef>
#include <cstdint>

#include "keel/error.h"
#include "keel/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    keel::st::Header h = keel::st::parseFile(data, size, "fuzz.safetensors");
    // Every validated entry lies inside the image.
    for (const auto& t : h.tensors)
      if (h.dataStart + t.end > size) __builtin_trap();
  } catch (const keel::Error&) {
  }
  return 0;
}
