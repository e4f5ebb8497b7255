// Devices are named by string: "cpu" (optimized), "cpu-ref" (plain reference), "cuda:N".
// A Device is a backend plus an index; every tensor lives on exactly one.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace keel {

enum class Backend : uint8_t { Cpu, CpuRef, Cuda };
inline constexpr int kNumBackends = 3;

struct Device {
  Backend backend = Backend::Cpu;
  int index = 0;

  Device() = default;
  Device(Backend b, int i = 0) : backend(b), index(i) {}     // NOLINT
  Device(const char* name);                                  // NOLINT: parse, throws keel::Error
  Device(const std::string& name) : Device(name.c_str()) {}  // NOLINT

  bool isHost() const { return backend != Backend::Cuda; }
  std::string name() const;
  bool operator==(const Device&) const = default;
};

std::string_view backendName(Backend b);

// The CUDA backend is a plugin the engine loads when a cuda:N device is first used (Note [CUDA
// backend plugin]). loadCudaBackend() loads it now and returns why it could not be loaded (empty
// when it is loaded: its kernels are in the registry); cudaDevices() is the number of CUDA devices
// (0 without the backend, a driver or a device).
std::string loadCudaBackend();
int cudaDevices();

// The device a training run (keel train, keel record, a studio session) runs on, by backend name:
// "cpu", "cpu-ref", "cuda" (cuda:0) or "cuda:N". Throws keel::Error "backend 'NAME' is not
// available for training (expected cpu, cpu-ref or cuda[:N])" for anything else, and "device
// 'cuda:N' is not available: WHY" for a CUDA device this machine cannot run.
Device trainingDevice(std::string_view name);

}  // namespace keel
