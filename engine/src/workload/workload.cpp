// The workload loader and runner: dlopen a workload library, check its API and Keel versions
// (Note [Workload ABI] in keel/workload.h), and drive create/step/destroy, turning every error a
// workload returns into a keel::Error that names the workload and the step.
#include "keel/workload.h"

#include <dlfcn.h>

#include <array>
#include <cmath>
#include <cstdio>

#include "keel/base/text.h"
#include "keel/error.h"
#include "keel/log.h"
#include "keel/observer.h"
#include "keel/step.h"

namespace keel {
namespace {

constexpr size_t kErrorSize = 4096;

// "0.1.0" -> "0.1": workloads must match the host's major.minor.
std::string majorMinor(const std::string& v) {
  auto dot = v.find('.');
  if (dot == std::string::npos) return v;
  auto dot2 = v.find('.', dot + 1);
  return v.substr(0, dot2);
}

std::string orEmpty(const char* s) {
  return s == nullptr ? std::string() : std::string(s);
}

}  // namespace

WorkloadInfo loadWorkload(const std::string& path) {
  // A path without a slash would make dlopen search the library path; the user means a file.
  std::string file = path.find('/') == std::string::npos ? "./" + path : path;
  requireRegularFile(file, "the workload library");  // dlopen of a FIFO blocks forever
  dlerror();
  void* lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    throw Error("cannot load workload '" + path + "': " + (why ? why : "dlopen failed"));
  }
  auto entry = reinterpret_cast<KeelWorkloadEntryFn>(dlsym(lib, KEEL_WORKLOAD_ENTRY_SYMBOL));
  if (entry == nullptr)
    throw Error("'" + path + "' is not a Keel workload: it exports no " +
                KEEL_WORKLOAD_ENTRY_SYMBOL +
                "() entry point (see KEEL_WORKLOAD in keel/workload.h)");
  const KeelWorkloadV1* api = entry();
  KEEL_CHECK(api != nullptr, "workload '", path, "': keel_workload() returned NULL");
  // Only the first field is read before the version is known to match.
  uint32_t version = *reinterpret_cast<const uint32_t*>(api);
  KEEL_CHECK(version == KEEL_WORKLOAD_API_VERSION, "workload '", path,
             "' was built for workload API version ", version, ", this Keel ", KEEL_VERSION_STRING,
             " loads version ", KEEL_WORKLOAD_API_VERSION, " (rebuild it against this Keel)");
  std::string built = orEmpty(api->keel_version);
  KEEL_CHECK(majorMinor(built) == majorMinor(KEEL_VERSION_STRING), "workload '", path,
             "' was built against Keel ", built.empty() ? "(unknown)" : built, ", this is Keel ",
             KEEL_VERSION_STRING, " (rebuild it against this Keel)");
  KEEL_CHECK(api->create && api->step && api->destroy, "workload '", path,
             "': create, step and destroy must all be set");
  // The library stays loaded for the life of the process (Note [Workload ABI]).
  return WorkloadInfo{api, orEmpty(api->name).empty() ? path : orEmpty(api->name),
                      orEmpty(api->description), path};
}

WorkloadRun::WorkloadRun(WorkloadInfo info, const WorkloadParams& params) : info_(std::move(info)) {
  KEEL_CHECK(info_.api != nullptr, "WorkloadRun: no workload");
  std::string device = params.device.name();
  KeelWorkloadParams p{sizeof(KeelWorkloadParams),
                       params.configJson.c_str(),
                       params.configPath.c_str(),
                       params.dataPath.c_str(),
                       device.c_str(),
                       params.seed,
                       params.totalSteps};
  std::array<char, kErrorSize> err{};
  handle_ = info_.api->create(&p, err.data(), err.size());
  if (handle_ == nullptr)
    throw Error("workload '" + info_.name + "': " + (err[0] ? err.data() : "create failed"));
}

WorkloadRun::WorkloadRun(WorkloadInfo info, const std::function<void*()>& create)
    : info_(std::move(info)) {
  KEEL_CHECK(info_.api != nullptr, "WorkloadRun: no workload");
  try {
    handle_ = create();
  } catch (const std::exception& e) {  // as the trampolines' create() reports it
    throw Error("workload '" + info_.name + "': " + exceptionText(e));
  } catch (...) {
    throw Error("workload '" + info_.name + "': unknown exception");
  }
  if (handle_ == nullptr) throw Error("workload '" + info_.name + "': create failed");
}

WorkloadRun::~WorkloadRun() {
  if (handle_ != nullptr) info_.api->destroy(handle_);
}

WorkloadMetrics WorkloadRun::step() {
  int64_t n = steps_ + 1;
  bool mark = (info_.api->flags & KEEL_WORKLOAD_MARKS_STEPS) == 0;
  if (mark) detail::notifyStep({n, true, 0.0, 0});
  KeelStepMetrics m{
      std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::quiet_NaN(),
      std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::quiet_NaN()};
  std::array<char, kErrorSize> err{};
  if (info_.api->step(handle_, &m, err.data(), err.size()) != 0)
    throw Error("workload '" + info_.name + "' failed in step " + std::to_string(n) + ": " +
                (err[0] ? err.data() : "step failed"));
  steps_ = n;
  const bool reports = (info_.api->flags & KEEL_WORKLOAD_REPORTS_METRICS) != 0;
  if (mark) {  // the step's end and log line, as the built-in trainer writes them
    auto known = [](double v, bool reported) -> std::optional<double> {
      if (reported || !std::isnan(v)) return v;
      return std::nullopt;
    };
    detail::endStep(n,
                    StepMetrics{known(m.loss, true),  // required of every workload: a NaN is a NaN
                                known(m.lr, false),
                                known(m.grad_norm, reports),
                                {},
                                known(m.tokens_per_sec, false),
                                {}});
  }
  return WorkloadMetrics{m.loss, m.lr, m.grad_norm, m.tokens_per_sec, reports};
}

}  // namespace keel
