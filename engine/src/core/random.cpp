// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11):
// ten rounds of multiply-xor with a Weyl-sequence key schedule.
#include "keel/random.h"

#include <cmath>

namespace keel {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(kM0) * c[0];
    uint64_t p1 = uint64_t(kM1) * c[2];
    c = {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k[1],
         uint32_t(p0)};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

double philoxNormal(uint64_t seed, uint64_t offset, uint64_t i) {
  uint64_t c = offset + i;
  auto r = philox4x32({uint32_t(c), uint32_t(c >> 32), 0x4e4f524du, 0},
                      {uint32_t(seed), uint32_t(seed >> 32)});
  // Two 32-bit uniforms in (0, 1]; Box-Muller, cosine branch.
  double u1 = (double(r[0]) + 1.0) / 4294967296.0;
  double u2 = double(r[1]) / 4294967296.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace keel
