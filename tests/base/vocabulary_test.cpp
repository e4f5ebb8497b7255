// The shared vocabulary (keel/base): every enum's one spelling round-trips, parsing accepts exactly
// those spellings, scope matching is on dot boundaries, byte counts and file reading behave as
// documented. These are the definitions every layer uses.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "keel/base/dtype.h"
#include "keel/base/error.h"
#include "keel/base/text.h"
#include "keel/base/vocabulary.h"

namespace keel {
namespace {

template <typename E, size_t N>
void expectRoundTrip(const std::array<std::string_view, N>& names,
                     std::optional<E> (*parse)(std::string_view), std::string_view (*name)(E)) {
  for (size_t i = 0; i < N; ++i) {
    const E e = E(i);
    EXPECT_EQ(name(e), names[i]);
    ASSERT_TRUE(parse(names[i]).has_value()) << names[i];
    EXPECT_EQ(*parse(names[i]), e);
  }
  EXPECT_FALSE(parse("no-such-name").has_value());
  EXPECT_EQ(name(E(N)), "?");  // out of range: never a crash
}

TEST(Vocabulary, EveryEnumRoundTripsThroughItsOneSpelling) {
  expectRoundTrip<Phase>(kPhaseNames, parsePhase, phaseName);
  expectRoundTrip<MemEventKind>(kMemEventNames, parseMemEventKind, memEventName);
  expectRoundTrip<MemTag>(kMemTagNames, parseMemTag, memTagName);
  expectRoundTrip<AllocatorKind>(kAllocatorKindNames, parseAllocatorKind, allocatorKindName);
  expectRoundTrip<LogLevel>(kLogLevelNames, parseLogLevel, logLevelName);
  EXPECT_EQ(phaseName(Phase::Optimizer), "optimizer");
  EXPECT_EQ(memEventName(MemEventKind::TrackEnd), "track_end");
  EXPECT_EQ(memEventName(MemEventKind::Oom), "oom");
  EXPECT_EQ(memTagName(MemTag::None), "");
  EXPECT_EQ(logLevelName(LogLevel::Verbose), "verbose");
  EXPECT_EQ(allocatorKindName(AllocatorKind::Vmm), "vmm");
  EXPECT_FALSE(parsePhase("Forward").has_value());  // case matters: one spelling
}

TEST(Vocabulary, DTypeNamesAndAliases) {
  for (int i = 0; i < kNumDTypes; ++i) {
    EXPECT_EQ(parseDType(dtypeName(DType(i))), DType(i));
  }
  for (int i = 0; i < kNumDTypes; ++i) {  // short names are aliases too
    EXPECT_EQ(tryParseDType(dtypeShortName(DType(i))), DType(i));
  }
  EXPECT_EQ(dtypeShortName(DType::BFloat16), "bf16");
  EXPECT_EQ(dtypeShortName(DType::Bool), "bool");
  EXPECT_EQ(parseDType("bf16"), DType::BFloat16);
  EXPECT_EQ(parseDType("half"), DType::Float16);
  EXPECT_FALSE(tryParseDType("float8").has_value());
  EXPECT_THROW(parseDType("float8"), Error);
  // The conversions storage decodes dumps with: exact for representable values.
  EXPECT_EQ(Half::toFloat(Half::fromFloat(1.5f)), 1.5f);
  EXPECT_EQ(float(BFloat16(-2.0f)), -2.0f);
}

TEST(Vocabulary, ScopeWithinMatchesOnDotBoundaries) {
  EXPECT_TRUE(scopeWithin("blocks.1", "blocks.1"));
  EXPECT_TRUE(scopeWithin("blocks.1.attn", "blocks.1"));
  EXPECT_FALSE(scopeWithin("blocks.10", "blocks.1"));
  EXPECT_FALSE(scopeWithin("blocks", "blocks.1"));
  EXPECT_TRUE(scopeWithin("anything", ""));
  EXPECT_TRUE(scopeWithin("", ""));
  static_assert(scopeWithin("a.b", "a"));
}

TEST(Vocabulary, ParsesWholeFiniteNumbers) {
  EXPECT_EQ(parseFiniteNumber("0.5"), 0.5);
  EXPECT_EQ(parseFiniteNumber("1e-3"), 1e-3);
  EXPECT_EQ(parseFiniteNumber("-2"), -2.0);
  EXPECT_EQ(parseFiniteNumber(" 2"), 2.0);
  for (const char* bad : {"", " ", "2x", "2 ", "x", "inf", "-inf", "nan", "1e999", "0x"})
    EXPECT_FALSE(parseFiniteNumber(bad).has_value()) << "'" << bad << "'";
}

TEST(Vocabulary, FormatsBytes) {
  constexpr uint64_t MiB = uint64_t(1) << 20;
  EXPECT_EQ(formatBytes(0), "0 B");
  EXPECT_EQ(formatBytes(512), "512 B");
  EXPECT_EQ(formatBytes(1536), "1.50 KiB");
  EXPECT_EQ(formatBytes(20 * MiB), "20.0 MiB");
  EXPECT_EQ(formatBytes(300 * MiB), "300 MiB");
  EXPECT_EQ(formatBytes(3 * 1024 * MiB), "3.00 GiB");
  EXPECT_EQ(formatMiB(3 * MiB + MiB / 2), "3.5 MiB");
  EXPECT_EQ(formatMiB(0), "0.0 MiB");
}

TEST(Vocabulary, ReadsWholeFilesAndNamesWhatCouldNotBeRead) {
  const std::string path = ::testing::TempDir() + "/vocabulary_test_" + std::to_string(getpid());
  {
    std::ofstream f(path, std::ios::binary);
    f << std::string("a\0b\nc", 5);
  }
  EXPECT_EQ(readFile(path), std::string("a\0b\nc", 5));
  std::remove(path.c_str());
  try {
    readFile(path, "config file");
    FAIL() << "read a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ": cannot open config file (missing or unreadable)");
  }
}

}  // namespace
}  // namespace keel
