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

// The device a training run (keel train, keel record, a studio session) runs on, by backend name:
// "cpu" or "cpu-ref". Throws keel::Error "backend 'NAME' is not available for training (expected
// cpu or cpu-ref)" for anything else, a CUDA device included.
Device trainingDevice(std::string_view name);

}  // namespace keel
