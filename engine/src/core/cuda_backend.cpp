// Loading the CUDA backend plugin. See Note [CUDA backend plugin].
#include "cuda_backend.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "keel/error.h"
#include "keel/registry.h"

namespace keel {

// Note [CUDA backend plugin]: the CUDA backend (engine/backends/cuda: kernels, the device
// allocators, streams, cuBLAS) is the shared library libkeel_cuda.so, built where the CUDA toolkit
// is, and loaded by libkeel_engine with dlopen the first time a cuda:N device is used (a buffer
// allocated on it, `keel ops` listing the cuda kernels, loadCudaBackend()). Loading registers its
// kernels in the op registry's cuda column and hands the engine the CudaApi table (cuda_api.h):
// allocators, copies, synchronisation. Why a plugin: a CPU-only run, a test or the studio never
// load the CUDA and cuBLAS libraries (hundreds of megabytes), and the same binaries run on
// machines with no CUDA at all, where a cuda device is refused with a one-line reason. The plugin
// is looked for next to libkeel_engine (the build folder and the install's lib folder alike);
// KEEL_CUDA_BACKEND names another file (tests point it at a missing one).

namespace {

struct Loaded {
  const detail::CudaApi* api = nullptr;
  std::string error;  // why api is null
};

std::string pluginPath() {
  if (const char* env = std::getenv("KEEL_CUDA_BACKEND"); env && *env) return env;
#if defined(KEEL_CUDA_BACKEND_FILE)
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&detail::cudaApi), &info) && info.dli_fname) {
    std::string self = info.dli_fname;
    size_t slash = self.rfind('/');
    return (slash == std::string::npos ? std::string() : self.substr(0, slash + 1)) +
           KEEL_CUDA_BACKEND_FILE;
  }
  return KEEL_CUDA_BACKEND_FILE;
#else
  return {};
#endif
}

Loaded load() {
  Loaded r;
  const std::string path = pluginPath();
  if (path.empty()) {
    r.error = "this build of Keel has no CUDA backend (the CUDA toolkit was not found)";
    return r;
  }
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    r.error = "the CUDA backend could not be loaded (" + std::string(e ? e : path) + ")";
    return r;
  }
  using Entry = const detail::CudaApi* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(h, "keelCudaApi"));
  const detail::CudaApi* api = entry ? entry() : nullptr;
  if (!api || api->version != detail::kCudaApiVersion) {
    r.error = "the CUDA backend " + path + " is not this Keel's (rebuild it)";
    return r;  // the handle stays open: nothing of it is called
  }
  api->registerKernels(Registry::get());
  r.api = api;
  return r;
}

const Loaded& loaded() {
  static const Loaded l = load();  // thread-safe once; never unloaded (kernels point into it)
  return l;
}

}  // namespace

namespace detail {

const CudaApi* cudaApi() {
  return loaded().api;
}

const CudaApi& cudaApiFor(Device d) {
  const Loaded& l = loaded();
  auto unavailable = [&](const std::string& why) {
    return Error(concat("device '", d.name(), "' is not available: ", why));
  };
  if (!l.api) throw unavailable(l.error);
  const int n = l.api->deviceCount();
  if (n == 0) throw unavailable(concat("no CUDA device (", l.api->unavailableReason(), ")"));
  if (d.index >= n)
    throw unavailable(n == 1
                          ? std::string("there is 1 CUDA device (cuda:0)")
                          : concat("there are ", n, " CUDA devices (cuda:0 to cuda:", n - 1, ")"));
  return *l.api;
}

}  // namespace detail

std::string loadCudaBackend() {
  return loaded().error;
}

int cudaDevices() {
  const detail::CudaApi* api = detail::cudaApi();
  return api ? api->deviceCount() : 0;
}

}  // namespace keel
