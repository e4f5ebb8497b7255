// A test workload built for a workload API version this Keel does not know (999): the loader must
// refuse it before touching anything but the version field. Its entry points abort if called.
#include <cstdlib>

#include "keel/workload.h"

namespace {

// Future versions may lay the struct out differently; only api_version (first) is fixed.
struct FutureWorkload {
  uint32_t api_version;
  uint32_t flags;
  const char* something_new;
};
const FutureWorkload kFuture{999u, 0u, "a field version 1 does not have"};

}  // namespace

extern "C" __attribute__((visibility("default"))) const KeelWorkloadV1* keel_workload(void) {
  return reinterpret_cast<const KeelWorkloadV1*>(&kFuture);
}
