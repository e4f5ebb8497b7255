// Multi-buffer MD5 (keel/capture/md5_multi.h) against OpenSSL's EVP MD5, bit for bit, at every
// lane count this CPU runs (1 = OpenSSL itself, 8 and 16 = AVX2, 16, 32 and 48 = AVX-512F; those
// the CPU lacks are skipped): padding edges, random lengths, unaligned starts, parts split at odd
// boundaries, batches around the lane count, one huge message among many tiny ones, a stream fed
// in arrival order (the busy lanes high and low), and tensor hashes.
#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "keel/capture/hash.h"
#include "keel/capture/md5_multi.h"
#include "keel/error.h"
#include "keel/ops.h"
#include "test_util.h"

namespace keel::capture {
namespace {

Md5Digest opensslMd5(const uint8_t* p, size_t n) {
  Md5Digest d{};
  unsigned int len = 0;
  EXPECT_EQ(EVP_Digest(p, n, d.data(), &len, EVP_md5(), nullptr), 1);
  EXPECT_EQ(len, 16u);
  return d;
}

std::string hex(const Md5Digest& d) {
  return toHex(d.data(), d.size());
}

std::vector<uint8_t> randomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = uint8_t(rng());
  return v;
}

// A batch of messages over owned byte strings, each message split into parts by the caller.
struct Batch {
  std::vector<std::vector<uint8_t>> bytes;  // message i's full byte stream (the reference)
  std::vector<Md5Message> msgs;
};

Md5Message whole(const std::vector<uint8_t>& b) {
  return {{std::span<const uint8_t>(b)}};
}

// md5ManyWithLanes over b equals OpenSSL's MD5 of every message's concatenated bytes.
void expectMatchesOpenSsl(const Batch& b, int lanes) {
  ASSERT_EQ(b.bytes.size(), b.msgs.size());
  std::vector<Md5Digest> got(b.msgs.size());
  md5ManyWithLanes(b.msgs, got, lanes);
  for (size_t i = 0; i < b.msgs.size(); ++i)
    ASSERT_EQ(hex(got[i]), hex(opensslMd5(b.bytes[i].data(), b.bytes[i].size())))
        << "message " << i << " of " << b.msgs.size() << ", " << b.bytes[i].size() << " bytes, "
        << b.msgs[i].parts.size() << " parts, lanes " << lanes;
}

Batch wholeMessages(const std::vector<size_t>& lengths, uint64_t seed) {
  Batch b;
  for (size_t i = 0; i < lengths.size(); ++i) b.bytes.push_back(randomBytes(lengths[i], seed + i));
  for (const auto& v : b.bytes) b.msgs.push_back(whole(v));
  return b;
}

class Md5Multi : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!md5LanesSupported(GetParam()))
      GTEST_SKIP() << GetParam() << " lanes need an ISA this CPU lacks";
  }
  int lanes() const { return GetParam(); }
};

TEST_P(Md5Multi, Rfc1321TestSuiteDigests) {
  std::vector<std::pair<std::string, std::string>> cases = {
      {"", "d41d8cd98f00b204e9800998ecf8427e"},
      {"a", "0cc175b9c0f1b6a831c399e269772661"},
      {"abc", "900150983cd24fb0d6963f7d28e17f72"},
      {"message digest", "f96b697d7cb7938d525a2f31aaf161d0"},
      {"abcdefghijklmnopqrstuvwxyz", "c3fcd3d76192e4007dfb496cca67e13b"},
      {"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
       "d174ab98d277d9f5a5611c2c9f419d9f"},
      {std::string(80, '0'), "57edf4a22be3c955ac49da2e2107b67a"}};
  for (size_t k = 0; k < 80; ++k)
    cases.back().first[k] = char('0' + (k + 1) % 10);  // 8 x "1234567890"
  std::vector<Md5Message> msgs;
  for (const auto& c : cases)
    msgs.push_back({{std::span(reinterpret_cast<const uint8_t*>(c.first.data()), c.first.size())}});
  std::vector<Md5Digest> got(msgs.size());
  md5ManyWithLanes(msgs, got, lanes());
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(hex(got[i]), cases[i].second) << i;
}

TEST_P(Md5Multi, PaddingEdgeLengthsMatchOpenSsl) {
  // One tail block up to 55 bytes, two from 56; block multiples and one either side.
  const std::vector<size_t> lengths = {0,   1,   2,   55,  56,  57,  63,  64,  65,  119,
                                       120, 121, 127, 128, 129, 183, 184, 191, 192, 193};
  expectMatchesOpenSsl(wholeMessages(lengths, 11), lanes());
  for (size_t n : lengths) expectMatchesOpenSsl(wholeMessages({n}, 100 + n), lanes());  // alone
}

TEST_P(Md5Multi, RandomLengthsUpTo1MiBMatchOpenSsl) {
  std::mt19937_64 rng(42);
  std::vector<size_t> lengths;
  for (int i = 0; i < 40; ++i) lengths.push_back(size_t(rng() % ((1 << 20) + 1)));
  lengths.push_back(1 << 20);
  expectMatchesOpenSsl(wholeMessages(lengths, 1000), lanes());
}

TEST_P(Md5Multi, UnalignedStartsMatchOpenSsl) {
  // Messages starting at every offset 0..63 of one buffer, so no block load is aligned.
  const std::vector<uint8_t> buf = randomBytes(64 + 5000, 7);
  Batch b;
  for (size_t off = 0; off < 64; ++off) {
    const size_t n = 1 + off * 77;  // 1 .. 4852 bytes
    b.bytes.emplace_back(buf.begin() + long(off), buf.begin() + long(off + n));
    b.msgs.push_back({{std::span(buf.data() + off, n)}});
  }
  expectMatchesOpenSsl(b, lanes());
}

TEST_P(Md5Multi, PartsSplitAtOddBoundariesHashAsOneStream) {
  std::mt19937_64 rng(5);
  std::vector<std::vector<uint8_t>> storage;
  Batch b;
  // Fixed splits: empty parts, parts shorter than a block, a block straddling parts, a tail split.
  const std::vector<std::vector<size_t>> splits = {
      {0},          {0, 0, 0},       {1, 63},         {63, 1, 64},  {3, 0, 61, 0, 1},
      {55},         {50, 5},         {54, 2},         {56, 0},      {64, 0, 64, 0},
      {1, 1, 1, 1}, {7, 100, 13, 3}, {4096, 1, 4095}, {65, 65, 65}, {100000, 33, 1, 0, 64, 70000}};
  // And random ones: up to 12 parts of 0..9000 bytes, many not multiples of 64.
  std::vector<std::vector<size_t>> all = splits;
  for (int i = 0; i < 60; ++i) {
    std::vector<size_t> s(1 + rng() % 12);
    for (auto& n : s) n = rng() % 4 == 0 ? rng() % 70 : rng() % 9001;
    all.push_back(s);
  }
  for (size_t m = 0; m < all.size(); ++m) {
    size_t total = 0;
    for (size_t n : all[m]) total += n;
    b.bytes.push_back(randomBytes(total, 300 + m));
    // Each part in its own allocation one byte past an odd offset, as a tensor's rows would be.
    Md5Message msg;
    size_t at = 0;
    for (size_t n : all[m]) {
      storage.emplace_back(n + 1);
      std::copy_n(b.bytes.back().begin() + long(at), n, storage.back().begin() + 1);
      msg.parts.emplace_back(storage.back().data() + 1, n);
      at += n;
    }
    b.msgs.push_back(std::move(msg));
  }
  expectMatchesOpenSsl(b, lanes());
}

TEST_P(Md5Multi, BatchesSmallerEqualAndLargerThanTheLaneCount) {
  const size_t L = size_t(lanes());
  std::mt19937_64 rng(9);
  for (size_t count : {size_t(1), L > 1 ? L - 1 : 1, L, L + 1, 2 * L + 3, 10 * L + 7}) {
    std::vector<size_t> lengths(count);
    for (auto& n : lengths) n = rng() % 20000;
    expectMatchesOpenSsl(wholeMessages(lengths, 2000 + count), lanes());
  }
  std::vector<Md5Digest> none;
  md5ManyWithLanes({}, none, lanes());  // an empty batch is fine
}

TEST_P(Md5Multi, OneHugeAndManyTinyMessages) {
  std::vector<size_t> lengths = {3 << 20};
  for (size_t i = 0; i < 300; ++i) lengths.push_back(i % 131);
  lengths.push_back(200000);
  expectMatchesOpenSsl(wholeMessages(lengths, 5000), lanes());
}

TEST_P(Md5Multi, TensorElementsAndTrailerEqualTensorMd5) {
  // A contiguous tensor: one part, then the trailer (docs/capture.md).
  Tensor x = test::randNormal({7, 50}, DType::Float32, Device(Backend::Cpu), 3);
  const std::string tx = hashTrailer(x.dtype(), x.shape());
  const auto* xb = static_cast<const uint8_t*>(x.data());
  // A view whose rows are contiguous but not adjacent: one part per row, as capture walks it.
  Tensor v = ops::slice(x, 1, 3, 40, 1);
  ASSERT_FALSE(v.isContiguous());
  const std::string tv = hashTrailer(v.dtype(), v.shape());
  Md5Message mv;
  const auto* vb = static_cast<const uint8_t*>(v.data());
  for (int64_t r = 0; r < v.shape()[0]; ++r)
    mv.parts.emplace_back(vb + r * v.strides()[0] * 4, size_t(v.shape()[1]) * 4);
  mv.parts.emplace_back(reinterpret_cast<const uint8_t*>(tv.data()), tv.size());
  std::vector<Md5Message> msgs = {
      {{std::span(xb, x.nbytes()),
        std::span(reinterpret_cast<const uint8_t*>(tx.data()), tx.size())}},
      mv};
  std::vector<Md5Digest> got(msgs.size());
  md5ManyWithLanes(msgs, got, lanes());
  EXPECT_EQ(hex(got[0]), tensorMd5(x));
  EXPECT_EQ(hex(got[1]), tensorMd5(v));
}

// Midstates: the state after each message's whole blocks, finished with a trailer, is OpenSSL's
// MD5 of message + trailer (lanes = 1 is the scalar compression here, not OpenSSL).
TEST_P(Md5Multi, MidstatesFinishedWithATrailerMatchOpenSsl) {
  std::vector<size_t> lengths = {0, 1, 55, 56, 63, 64, 65, 127, 128, 129, 4096, 70001};
  std::mt19937_64 rng(9);
  for (int i = 0; i < 40; ++i) lengths.push_back(size_t(rng() % 300000));
  Batch b = wholeMessages(lengths, 900);
  std::vector<Md5Midstate> mids(b.msgs.size());
  md5ManyMidstates(b.msgs, mids, lanes());
  for (size_t i = 0; i < b.msgs.size(); ++i) {
    EXPECT_EQ(mids[i].bytes, b.bytes[i].size());
    EXPECT_EQ(mids[i].tailLen, b.bytes[i].size() % 64);
    for (size_t trailerLen :
         {size_t(0), size_t(7), size_t(29), size_t(56), size_t(64), size_t(150)}) {
      std::vector<uint8_t> trailer = randomBytes(trailerLen, 77 + i);
      std::vector<uint8_t> all = b.bytes[i];
      all.insert(all.end(), trailer.begin(), trailer.end());
      ASSERT_EQ(hex(mids[i].finish(trailer)), hex(opensslMd5(all.data(), all.size())))
          << "message " << i << " of " << b.bytes[i].size() << " bytes, trailer " << trailerLen
          << ", lanes " << lanes();
    }
  }
  EXPECT_EQ(hex(md5Start().finish()), hex(opensslMd5(nullptr, 0)));
}

// The byte sink sees each message's bytes once, in order, in ranges that begin and end on a part
// boundary or a multiple of 64 bytes into the message (whole elements).
TEST_P(Md5Multi, ByteSinkSeesEveryByteOnceInOrderInWholeElements) {
  struct Collect final : Md5ByteSink {
    std::vector<std::vector<uint8_t>> got;
    std::vector<std::vector<size_t>> cuts;  // message offsets where a range ended
    void bytes(size_t m, const uint8_t* p, size_t n) override {
      got[m].insert(got[m].end(), p, p + n);
      cuts[m].push_back(got[m].size());
    }
  };
  Batch b;
  std::mt19937_64 rng(31);
  for (int i = 0; i < 37; ++i) b.bytes.push_back(randomBytes(size_t(rng() % 20000) * 4, 300 + i));
  std::vector<std::vector<size_t>> partEnds(b.bytes.size());
  for (size_t i = 0; i < b.bytes.size(); ++i) {
    Md5Message m;
    size_t at = 0;
    while (at < b.bytes[i].size()) {
      const size_t n = std::min(b.bytes[i].size() - at, size_t(rng() % 700 + 1) * 4);
      m.parts.emplace_back(b.bytes[i].data() + at, n);
      at += n;
      partEnds[i].push_back(at);
    }
    b.msgs.push_back(m);
  }
  Collect sink;
  sink.got.resize(b.msgs.size());
  sink.cuts.resize(b.msgs.size());
  std::vector<Md5Midstate> mids(b.msgs.size());
  md5ManyMidstates(b.msgs, mids, lanes(), &sink);
  for (size_t i = 0; i < b.msgs.size(); ++i) {
    ASSERT_EQ(sink.got[i], b.bytes[i]) << "message " << i;
    for (size_t cut : sink.cuts[i]) {
      const bool onPart =
          std::find(partEnds[i].begin(), partEnds[i].end(), cut) != partEnds[i].end();
      EXPECT_TRUE(cut % 64 == 0 || onPart) << "message " << i << " range ends at " << cut;
      EXPECT_EQ(cut % 4, 0u);
    }
    ASSERT_EQ(hex(mids[i].finish()), hex(opensslMd5(b.bytes[i].data(), b.bytes[i].size())));
  }
}

// A stream fed as the hashing thread feeds it: messages in arrival order, a few at a time, so
// the busy lanes come and go anywhere in the set (a long message high with the low lanes idle;
// Note [MD5 lane widths]: each round runs the narrowest kernel covering the busy lanes).
TEST_P(Md5Multi, AStreamFedInArrivalOrderGivesEveryMidstate) {
  const size_t L = size_t(lanes());
  std::mt19937_64 rng(57);
  std::vector<size_t> lengths;
  for (size_t i = 0; i < 6 * L + 5; ++i)
    lengths.push_back(i % (L + 3) == L - 1 ? 200000 + rng() % 5000 : rng() % 3000);
  Batch b = wholeMessages(lengths, 4000);
  Md5LaneStream stream(lanes());
  std::vector<Md5Midstate> got(b.msgs.size());
  std::vector<bool> seen(b.msgs.size(), false);
  std::vector<Md5LaneStream::Finished> done;
  size_t next = 0, finished = 0;
  while (finished < b.msgs.size()) {
    // 1 to 3 arrivals per round, when a lane is free.
    for (size_t k = 1 + rng() % 3; k > 0 && next < b.msgs.size() && stream.hasFreeLane(); --k)
      stream.add(b.msgs[next], next), ++next;
    ASSERT_TRUE(stream.busy());
    stream.step(done);
    for (const auto& f : done) {
      ASSERT_FALSE(seen[f.id]) << "message " << f.id << " finished twice";
      seen[f.id] = true;
      got[f.id] = f.midstate;
      ++finished;
    }
    done.clear();
  }
  EXPECT_FALSE(stream.busy());
  for (size_t i = 0; i < b.msgs.size(); ++i)
    ASSERT_EQ(hex(got[i].finish()), hex(opensslMd5(b.bytes[i].data(), b.bytes[i].size())))
        << "message " << i << " of " << b.bytes[i].size() << " bytes, lanes " << L;
}

INSTANTIATE_TEST_SUITE_P(Lanes, Md5Multi, ::testing::Values(1, 8, 16, 32, 48),
                         [](const auto& info) { return "x" + std::to_string(info.param); });

TEST(Md5MultiDispatch, DefaultWidthIsTheWidestTheCpuRuns) {
  const int w = md5LaneWidth();
#if defined(__x86_64__)
  // Note [MD5 lane widths]
  EXPECT_EQ(w, __builtin_cpu_supports("avx512f") ? 48 : __builtin_cpu_supports("avx2") ? 16 : 1);
  EXPECT_EQ(md5LanesSupported(32), bool(__builtin_cpu_supports("avx512f")));
  EXPECT_EQ(md5LanesSupported(48), bool(__builtin_cpu_supports("avx512f")));
#else
  EXPECT_EQ(w, 1);
#endif
  EXPECT_TRUE(md5LanesSupported(1));
  EXPECT_TRUE(md5LanesSupported(w));
  Batch b = wholeMessages({0, 64, 1000, 70000}, 77);
  std::vector<Md5Digest> got(b.msgs.size()), ref(b.msgs.size());
  md5Many(b.msgs, got);
  md5ManyWithLanes(b.msgs, ref, 1);
  EXPECT_EQ(got, ref);
}

TEST(Md5MultiDispatch, RejectsUnknownLaneCountsAndMismatchedOutput) {
  for (int lanes : {0, 2, 4, 12, 24, 64, -1}) EXPECT_FALSE(md5LanesSupported(lanes)) << lanes;
  Batch b = wholeMessages({10, 20}, 1);
  std::vector<Md5Digest> out(2), shortOut(1);
  EXPECT_THROW(md5ManyWithLanes(b.msgs, out, 4), Error);
  EXPECT_THROW(md5Many(b.msgs, shortOut), Error);
}

}  // namespace
}  // namespace keel::capture
