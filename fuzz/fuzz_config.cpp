// libFuzzer target: configs. The same text is read as a model config (parseGptConfig: the JSON of
// --config) and as capture options (CaptureOptions::fromJson, stored in every recording); options
// that parse must survive toJson and fromJson unchanged. Anything else must be a keel::Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "keel/capture/options.h"
#include "keel/error.h"
#include "keel/gpt_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    keel::parseGptConfig(text, "fuzz.json");
  } catch (const keel::Error&) {
  }
  try {
    const keel::capture::CaptureOptions o = keel::capture::CaptureOptions::fromJson(text);
    if (!(keel::capture::CaptureOptions::fromJson(o.toJson()) == o)) __builtin_trap();
  } catch (const keel::Error&) {
  }
  return 0;
}
