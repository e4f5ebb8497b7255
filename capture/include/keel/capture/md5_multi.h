// Multi-buffer MD5: many independent messages hashed at once, one message per 32-bit SIMD lane
// (8 lanes AVX2, 16 lanes AVX-512F), each digest bit for bit OpenSSL's MD5 of that message.
// Written here because no Debian library hashes several MD5 messages in parallel lanes.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace keel::capture {

// One message: its parts hashed as one concatenated byte stream (a tensor's contiguous chunks,
// then its trailer). The bytes must stay valid and unchanged during the md5Many call.
struct Md5Message {
  std::vector<std::span<const uint8_t>> parts;
};

using Md5Digest = std::array<uint8_t, 16>;

// The lane count md5Many uses on this CPU, chosen once when the library loads: 16 (AVX-512F),
// 8 (AVX2) or 1 (OpenSSL EVP, one message after another).
int md5LaneWidth();

// Whether md5ManyWithLanes can run with this lane count here (1 always; 8 with AVX2; 16 with
// AVX-512F; anything else never).
bool md5LanesSupported(int lanes);

// out[i] = MD5(concatenation of msgs[i].parts). out.size() must equal msgs.size(). Runs on the
// calling thread.
void md5Many(std::span<const Md5Message> msgs, std::span<Md5Digest> out);

// md5Many with a forced lane count (1, 8 or 16), for tests and benchmarks. Throws keel::Error for
// a lane count this CPU cannot run (see md5LanesSupported).
void md5ManyWithLanes(std::span<const Md5Message> msgs, std::span<Md5Digest> out, int lanes);

}  // namespace keel::capture
