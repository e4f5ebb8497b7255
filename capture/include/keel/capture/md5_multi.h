// Multi-buffer MD5: many independent messages hashed at once, one message per 32-bit SIMD lane
// (groups of 8 lanes with AVX2, of 16 with AVX-512F), each digest bit for bit OpenSSL's MD5 of
// that message.
// Written here because no Debian library hashes several MD5 messages in parallel lanes.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace keel::capture {

// One message: its parts hashed as one concatenated byte stream (a tensor's contiguous chunks,
// then its trailer). The bytes must stay valid and unchanged during the md5Many call.
struct Md5Message {
  std::vector<std::span<const uint8_t>> parts;
};

using Md5Digest = std::array<uint8_t, 16>;

// The lane count md5Many uses on this CPU, chosen once when the library loads: 48 where the CPU
// has AVX-512F (three interleaved groups of 16), 16 where it has AVX2 alone (two interleaved
// groups of 8), else 1 (OpenSSL EVP, one message after another). See Note [MD5 lane widths].
int md5LaneWidth();

// Whether md5ManyWithLanes can run with this lane count here (1 always; 8 and 16 with AVX2; 32
// and 48, two and three groups of 16, with AVX-512F; anything else never).
bool md5LanesSupported(int lanes);

// out[i] = MD5(concatenation of msgs[i].parts). out.size() must equal msgs.size(). Runs on the
// calling thread.
void md5Many(std::span<const Md5Message> msgs, std::span<Md5Digest> out);

// md5Many with a forced lane count (1, 8, 16, 32 or 48), for tests and benchmarks. Throws
// keel::Error for a lane count this CPU cannot run (see md5LanesSupported).
void md5ManyWithLanes(std::span<const Md5Message> msgs, std::span<Md5Digest> out, int lanes);

// The MD5 state after a message's whole 64-byte blocks, and the bytes after them: finishing it
// with more bytes (a tensor's trailer) costs one or two scalar compressions, so tensors whose
// element bytes are the same (a reshape and its input) share one pass over the elements.
struct Md5Midstate {
  std::array<uint32_t, 4> abcd{};  // the chaining value after `bytes - tailLen` bytes
  uint64_t bytes = 0;              // message bytes so far, tail included
  std::array<uint8_t, 64> tail{};  // the last bytes % 64 bytes of the message
  uint8_t tailLen = 0;
  // MD5(message + more), bit for bit OpenSSL's.
  Md5Digest finish(std::span<const uint8_t> more = {}) const;
};

// MD5's state before any byte.
Md5Midstate md5Start();

// Sees every byte of every message once, as the hash reads it: for each message its bytes in
// order, in consecutive ranges that start and end on a part boundary or a multiple of 64 bytes
// into the message (so ranges hold whole elements of any dtype up to 8 bytes, given parts that
// do). Ranges of different messages interleave. Runs on md5ManyMidstates' thread, just before the
// bytes are hashed (still in cache): statistics fused into the hashing pass use it.
class Md5ByteSink {
 public:
  virtual ~Md5ByteSink() = default;
  virtual void bytes(size_t message, const uint8_t* p, size_t n) = 0;
};

// out[i] = the midstate after msgs[i]'s bytes, lanes as in md5ManyWithLanes (0: md5LaneWidth();
// 1: a scalar MD5 here, the path of CPUs without AVX2). sink (optional) sees every byte.
void md5ManyMidstates(std::span<const Md5Message> msgs, std::span<Md5Midstate> out, int lanes = 0,
                      Md5ByteSink* sink = nullptr);

}  // namespace keel::capture

namespace keel::capture {

// Messages hashed as they come (Note [Lane streams] in md5_multi.cpp): each joins a free lane and
// leaves it when its midstate is ready, so a stream fed continuously keeps every lane busy. The
// message's bytes must stay valid and unchanged until it is reported finished. Not thread-safe.
class Md5LaneStream {
 public:
  struct Finished {
    size_t id = 0;         // as given to add()
    Md5Midstate midstate;  // the message's midstate (a stream's result)
    Md5Digest digest{};    // batch calls' full digests (internal)
  };
  // lanes: 0 md5LaneWidth(), or 1, 8, 16, 32, 48 (keel::Error if the CPU cannot). sink: sees
  // every byte as in md5ManyMidstates.
  explicit Md5LaneStream(int lanes = 0, Md5ByteSink* sink = nullptr);
  ~Md5LaneStream();
  Md5LaneStream(const Md5LaneStream&) = delete;
  Md5LaneStream& operator=(const Md5LaneStream&) = delete;

  bool hasFreeLane() const;
  bool busy() const;  // some lane holds a message not finished yet
  // Puts msg on a free lane (hasFreeLane() must be true).
  void add(Md5Message msg, size_t id);
  // Runs the busy lanes a little (at most 4 KiB each); appends the messages that finished.
  void step(std::vector<Finished>& finished);

  class Impl;

 private:
  friend void md5ManyMidstates(std::span<const Md5Message>, std::span<Md5Midstate>, int,
                               Md5ByteSink*);
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel::capture
