// Counter-based random numbers (Philox4x32-10). A value depends only on (seed, counter), so every
// backend draws the same stream for the same call: dropout masks and initialisation agree.
#pragma once
#include <array>
#include <cstdint>

namespace keel {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// Uniform float in [0, 1) for element i of the stream (seed, offset): 24 random bits.
inline float philoxUniform(uint64_t seed, uint64_t offset, uint64_t i) {
  uint64_t c = offset + i;
  auto r = philox4x32({uint32_t(c), uint32_t(c >> 32), 0x4b45454cu, 0},
                      {uint32_t(seed), uint32_t(seed >> 32)});
  return float(r[0] >> 8) * (1.0f / 16777216.0f);
}

// Standard normal for element i (Box–Muller over two words of the same counter).
double philoxNormal(uint64_t seed, uint64_t offset, uint64_t i);

// A generator: a seed plus a running offset; each call reserves a block of counters.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  // Reserves n counters and returns the first.
  uint64_t take(uint64_t n) {
    uint64_t o = offset_;
    offset_ += n;
    return o;
  }
  void setState(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }

 private:
  uint64_t seed_ = 0;
  uint64_t offset_ = 0;
};

}  // namespace keel
