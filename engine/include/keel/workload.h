// Workloads: a user's model and training step, built as a shared library with one small, versioned
// C entry point, that `keel record --workload` and Keel Studio load and run in process with every
// capture feature. The built-in GPT/MoE trainer is a workload too (keel::gptWorkload()), so there
// is one path. See docs/api.md and Note [Workload ABI].
//
// Note [Workload ABI]
// A workload library exports `extern "C" const KeelWorkloadV1* keel_workload(void)`. The struct's
// first field is the workload API version it was built against; the loader reads that field first
// and refuses any other version, and then refuses a library built against another Keel
// major.minor (the C++ engine API under the workload has no stable ABI). Nothing crosses the
// boundary as an exception: create and step return an error and write its text into a buffer the
// loader owns; the loader turns that into a keel::Error naming the workload and the step.
// Libraries are never unloaded: a workload may have registered ops whose kernels live in it.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "keel/version.h"

#ifdef __cplusplus
extern "C" {
#endif

// The version of the structs below. Any change to their layout or meaning bumps it.
#define KEEL_WORKLOAD_API_VERSION 1u
// The name of the entry point a workload library exports.
#define KEEL_WORKLOAD_ENTRY_SYMBOL "keel_workload"

// KeelWorkloadV1.flags: the workload reports its own step boundaries (keel::Step, keel/step.h);
// otherwise the host marks each step() call as one training step.
#define KEEL_WORKLOAD_MARKS_STEPS 1u
// KeelWorkloadV1.flags: every step fills loss and grad_norm, so a NaN there is a NaN value, not
// "not reported" (what `--break-on loss>K*mean` and `grad-norm>X` stop on). Hosts that predate
// the bit ignore it.
#define KEEL_WORKLOAD_REPORTS_METRICS 2u

// What the host passes to create(). Strings are never NULL ("" when not given).
typedef struct KeelWorkloadParams {
  uint32_t struct_size;     // sizeof(KeelWorkloadParams) of the host
  const char* config_json;  // the workload's JSON config (--config), "" for its defaults
  const char* config_path;  // where config_json came from (for messages), "" if nowhere
  const char* data_path;    // --data: a data file or directory, "" for the workload's default
  const char* device;       // "cpu" or "cpu-ref"
  uint64_t seed;            // the run's seed: same seed, same bits
  int64_t total_steps;      // the number of steps the host will run (for schedules)
} KeelWorkloadParams;

// What one step reports. Fields a workload does not know stay NaN (loss is required).
typedef struct KeelStepMetrics {
  double loss;
  double lr;
  double grad_norm;
  double tokens_per_sec;
} KeelStepMetrics;

typedef struct KeelWorkloadV1 {
  uint32_t api_version;      // KEEL_WORKLOAD_API_VERSION when built; always the first field
  uint32_t flags;            // KEEL_WORKLOAD_* bits
  const char* keel_version;  // KEEL_VERSION_STRING of the headers it was built with
  const char* name;          // short name, e.g. "mlp"
  const char* description;   // one line
  // Builds the model and its training state. Returns a handle, or NULL after writing a message
  // (NUL-terminated, truncated to error_size) into error.
  void* (*create)(const KeelWorkloadParams* params, char* error, size_t error_size);
  // Runs one training step. Returns 0 on success (metrics filled), non-zero after writing a
  // message into error.
  int (*step)(void* handle, KeelStepMetrics* metrics, char* error, size_t error_size);
  // Frees the handle (never fails).
  void (*destroy)(void* handle);
} KeelWorkloadV1;

typedef const KeelWorkloadV1* (*KeelWorkloadEntryFn)(void);

#ifdef __cplusplus
}  // extern "C"

#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <string>

#include "keel/device.h"
#include "keel/runtime.h"

namespace keel {

// ---------------------------------------------------------------- writing a workload
// Derive from Workload, give it a constructor taking `const WorkloadParams&`, and name it once
// with KEEL_WORKLOAD(Type, "name", "description") in one source file of the library.

struct WorkloadParams {
  std::string configJson;  // "" when no config was given
  std::string configPath;
  std::string dataPath;
  Device device;
  uint64_t seed = 0;
  int64_t totalSteps = 1;
};

struct WorkloadMetrics {
  double loss = std::numeric_limits<double>::quiet_NaN();
  double lr = std::numeric_limits<double>::quiet_NaN();
  double gradNorm = std::numeric_limits<double>::quiet_NaN();
  double tokensPerSec = std::numeric_limits<double>::quiet_NaN();
  // NaN above means "not reported" unless this is set (KEEL_WORKLOAD_REPORTS_METRICS: the
  // built-in trainer): then a NaN loss or gradient norm is a NaN.
  bool reportsAll = false;
};

class Workload {
 public:
  virtual ~Workload() = default;
  // One training step (forward, backward, optimizer). Throw keel::Error (or any std::exception)
  // on failure: the host fails the session with the message.
  virtual WorkloadMetrics step() = 0;
};

namespace detail {
inline void copyError(char* dst, size_t size, const char* msg) {
  if (dst == nullptr || size == 0) return;
  std::strncpy(dst, msg, size - 1);
  dst[size - 1] = '\0';
}
inline WorkloadParams toParams(const KeelWorkloadParams* p) {
  WorkloadParams w;
  w.configJson = p->config_json;
  w.configPath = p->config_path;
  w.dataPath = p->data_path;
  w.device = Device(p->device);
  w.seed = p->seed;
  w.totalSteps = p->total_steps;
  return w;
}
// The C entry points of a C++ workload type: exceptions become error strings here, inside the
// workload, so none crosses the library boundary.
template <typename T>
struct WorkloadTrampolines {
  static void* create(const KeelWorkloadParams* params, char* error, size_t errorSize) {
    try {
      return new T(toParams(params));
    } catch (const std::exception& e) {
      copyError(error, errorSize, exceptionText(e).c_str());
    } catch (...) {
      copyError(error, errorSize, "unknown exception");
    }
    return nullptr;
  }
  static int step(void* handle, KeelStepMetrics* out, char* error, size_t errorSize) {
    try {
      WorkloadMetrics m = static_cast<T*>(handle)->step();
      *out = KeelStepMetrics{m.loss, m.lr, m.gradNorm, m.tokensPerSec};
      return 0;
    } catch (const std::exception& e) {
      copyError(error, errorSize, exceptionText(e).c_str());
    } catch (...) {
      copyError(error, errorSize, "unknown exception");
    }
    return 1;
  }
  static void destroy(void* handle) noexcept { delete static_cast<T*>(handle); }
};
template <typename T>
constexpr KeelWorkloadV1 makeWorkloadV1(const char* name, const char* description,
                                        uint32_t flags = 0) {
  return KeelWorkloadV1{KEEL_WORKLOAD_API_VERSION,
                        flags,
                        KEEL_VERSION_STRING,
                        name,
                        description,
                        &WorkloadTrampolines<T>::create,
                        &WorkloadTrampolines<T>::step,
                        &WorkloadTrampolines<T>::destroy};
}
}  // namespace detail

// ---------------------------------------------------------------- running a workload (the host)

// A workload's entry: a loaded library or a built-in. Cheap to copy.
struct WorkloadInfo {
  const KeelWorkloadV1* api = nullptr;
  std::string name;
  std::string description;
  std::string source;  // the library path, or "built-in"
};

// Loads a workload library (dlopen, RTLD_NOW | RTLD_LOCAL; never unloaded). Throws keel::Error
// when the file cannot be loaded, has no keel_workload entry point, or was built for another
// workload API version or Keel version.
WorkloadInfo loadWorkload(const std::string& path);
// The built-in GPT/MoE trainer as a workload: config_json is a model config (configs/*.json),
// data_path a text file or directory (default: the built-in corpus).
WorkloadInfo gptWorkload();

struct GptConfig;
class WorkloadRun;
// A run of the built-in trainer from a config the host has already parsed and checked:
// params.configJson is not parsed again (see Note [Built-in config parsed once]). Fails, steps
// and marks steps exactly as WorkloadRun(gptWorkload(), params) does.
std::unique_ptr<WorkloadRun> gptWorkloadRun(const GptConfig& config, const WorkloadParams& params);

// One instance of a workload: created from params, stepped, destroyed with this object.
class WorkloadRun {
 public:
  // Calls create(); throws keel::Error "workload 'NAME': <message>" when it fails.
  WorkloadRun(WorkloadInfo info, const WorkloadParams& params);
  ~WorkloadRun();
  WorkloadRun(const WorkloadRun&) = delete;
  WorkloadRun& operator=(const WorkloadRun&) = delete;

  // One training step (1-based number steps()+1), marked as a step for observers unless the
  // workload marks its own. Throws keel::Error "workload 'NAME' failed in step N: <message>".
  WorkloadMetrics step();
  int64_t steps() const { return steps_; }
  const WorkloadInfo& info() const { return info_; }

 private:
  friend std::unique_ptr<WorkloadRun> gptWorkloadRun(const GptConfig&, const WorkloadParams&);
  // A built-in's instance made in process by `create` (what info's create() would return), in
  // place of calling create(); a throw fails like create() does.
  WorkloadRun(WorkloadInfo info, const std::function<void*()>& create);

  WorkloadInfo info_;
  void* handle_ = nullptr;
  int64_t steps_ = 0;
};

}  // namespace keel

// Defines the library's entry point for workload type T (one per library).
#define KEEL_WORKLOAD(T, name, description)                                                     \
  extern "C" __attribute__((visibility("default"))) const KeelWorkloadV1* keel_workload(void) { \
    static const KeelWorkloadV1 w = ::keel::detail::makeWorkloadV1<T>(name, description);       \
    return &w;                                                                                  \
  }

#endif  // __cplusplus
