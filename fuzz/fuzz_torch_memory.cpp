// libFuzzer target: PyTorch memory snapshots (pickles) through the restricted unpickler and the
// importer (storage/torch_memory.h, Note [Restricted unpickler]). A snapshot that reads has events
// whose stacks exist and a device that is in it; anything else must be a StorageError.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "keel/storage/errors.h"
#include "keel/storage/torch_memory.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  if (bytes.empty()) bytes.push_back('\0');  // fmemopen refuses a zero-length buffer
  std::FILE* f = fmemopen(bytes.data(), bytes.size(), "rb");
  if (!f) return 0;
  try {
    keel::storage::TorchMemoryReadOptions o;
    o.maxBytes = 64 << 20;
    const keel::storage::TorchMemorySnapshot s =
        keel::storage::readTorchMemorySnapshot(f, size, "fuzz.pickle", o);
    for (const auto* events : {&s.initial, &s.trace})
      for (const auto& e : *events)
        if (e.stackId == 0 || e.stackId > int64_t(s.stacks.size())) __builtin_trap();
    for (size_t k = 0; k < s.stacks.size(); ++k)
      if (s.stacks[k].id != int64_t(k) + 1) __builtin_trap();
  } catch (const keel::storage::StorageError&) {
  }
  std::fclose(f);
  return 0;
}
