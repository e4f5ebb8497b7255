// Tests for allocation traces and the `keel memory` / `keel bench allocator` commands: the text
// format and its errors (file:line), the MoE generator (well formed, deterministic, skewed),
// replay statistics against hand-computed values, recording a trace from training, and the CLI
// (a replay of a recording, errors as one line with status 2).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "keel/alloc_trace.h"
#include "keel/data.h"
#include "keel/gpt_config.h"
#include "keel/train.h"
#include "test_util.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
constexpr size_t kMiB = size_t(1) << 20;

AllocTrace parse(const std::string& text) {
  std::istringstream in(text);
  return parseAllocTrace(in, "t.trace");
}

std::string parseError(const std::string& text) {
  try {
    parse(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(AllocTraceTest, ParsesAndWritesTheTextFormat) {
  AllocTrace t = parse("# comment\ns 1\na 7 4096\na 8 100  # trailing\n\nf 7\nf 8\n");
  ASSERT_EQ(t.events.size(), 5u);
  EXPECT_EQ(t.allocs(), 2u);
  EXPECT_EQ(t.steps(), 1u);
  EXPECT_EQ(t.events[1].kind, TraceEvent::Alloc);
  EXPECT_EQ(t.events[1].id, 7u);
  EXPECT_EQ(t.events[1].bytes, 4096u);
  EXPECT_EQ(t.events[3].kind, TraceEvent::Free);
  std::ostringstream out;
  writeAllocTrace(t, out);
  AllocTrace back = parse(out.str());
  ASSERT_EQ(back.events.size(), t.events.size());
  for (size_t i = 0; i < t.events.size(); ++i) {
    EXPECT_EQ(back.events[i].kind, t.events[i].kind);
    EXPECT_EQ(back.events[i].id, t.events[i].id);
    EXPECT_EQ(back.events[i].bytes, t.events[i].bytes);
  }
}

TEST(AllocTraceTest, BadLinesNameFileAndLine) {
  const std::pair<const char*, const char*> cases[] = {
      {"a 1 10\nx 2\n", "t.trace:2: unknown event 'x' (expected a, f or s)"},
      {"f 3\n", "t.trace:1: free of block 3, which is not live"},
      {"a 1 10\na 1 20\n", "t.trace:2: block 1 is already live"},
      {"a 1 0\n", "t.trace:1: block size 0 is out of range (1 .. 2^44)"},
      {"a 1\n", "t.trace:1: expected 'a ID BYTES'"},
      {"a 1 10 9\n", "t.trace:1: unexpected '9' after the event"},
      {"a -1 10\n", "t.trace:1: expected 'a ID BYTES'"},
      // Binary input says what it is not (a pickle's bytes were echoed, cut at their NUL; an ESC
      // drove the terminal).
      {"\x80\x04\x95\x7f",
       "t.trace:1: binary data (byte \\x04): not an allocation trace (lines "
       "like 'a ID BYTES') nor a Keel recording"},
      {"a 1 10\na\x1b[2J 1 2\n",
       "t.trace:2: binary data (byte \\x1b): not an allocation trace "
       "(lines like 'a ID BYTES') nor a Keel recording"},
      {"a 1 10\n\xff 2\n", "t.trace:2: unknown event '\xff' (expected a, f or s)"},
  };
  for (const auto& [text, error] : cases) EXPECT_EQ(parseError(text), error) << text;
  // A UTF-8 byte order mark and CRLF line ends (an editor's) are text: accepted.
  std::istringstream bom(
      "\xEF\xBB\xBF"
      "a 1 10\r\nf 1\r\n");
  EXPECT_EQ(parseAllocTrace(bom, "bom.trace").events.size(), 2u);
  EXPECT_THROW(readAllocTrace("/no/such/trace"), Error);
}

TEST(AllocTraceTest, GeneratedMoeTraceIsWellFormedDeterministicAndSkewed) {
  MoeTraceOptions o;
  o.layers = 2;
  o.experts = 16;
  o.tokens = 512;
  o.dModel = 64;
  o.dFf = 128;
  o.steps = 3;
  AllocTrace a = generateMoeTrace(o), b = generateMoeTrace(o);
  ASSERT_EQ(a.events.size(), b.events.size());
  for (size_t i = 0; i < a.events.size(); ++i) ASSERT_EQ(a.events[i].bytes, b.events[i].bytes);
  EXPECT_EQ(a.steps(), 3u);
  std::set<uint64_t> live;
  std::set<uint64_t> sizes;
  for (auto& e : a.events) {
    if (e.kind == TraceEvent::Alloc) {
      EXPECT_TRUE(live.insert(e.id).second);
      sizes.insert(e.bytes);
    } else if (e.kind == TraceEvent::Free) {
      EXPECT_EQ(live.erase(e.id), 1u);
    }
  }
  EXPECT_GT(sizes.size(), 40u);  // routing makes many distinct sizes
  std::ostringstream out;
  writeAllocTrace(a, out);
  EXPECT_EQ(parse(out.str()).events.size(), a.events.size());  // the parser accepts it
  o.seed = 2;
  AllocTrace c = generateMoeTrace(o);
  bool differs = c.events.size() != a.events.size();
  for (size_t i = 0; !differs && i < a.events.size(); ++i)
    differs = a.events[i].bytes != c.events[i].bytes;
  EXPECT_TRUE(differs) << "the seed does not change the routing";
  o.topK = 17;
  EXPECT_THROW(generateMoeTrace(o), Error);
}

// Three 4 MiB blocks, free the middle one, then 8 MiB: caching (20 MiB segments for requests
// under 10 MiB) serves everything from one segment; vmm maps exactly what is needed.
TEST(AllocTraceTest, ReplayReportsPeaksAndFragmentation) {
  AllocTrace t = parse("a 1 4194304\na 2 4194304\na 3 4194304\nf 2\na 4 8388608\nf 1\n");
  CachingAllocator caching;
  ReplayResult rc = replayAllocTrace(t, caching);
  EXPECT_EQ(rc.calls, 6u);
  EXPECT_EQ(rc.stats.peakAllocated, 16 * kMiB);
  EXPECT_EQ(rc.stats.peakReserved, 20 * kMiB);
  EXPECT_DOUBLE_EQ(rc.stats.peakFragmentation(), 0.2);
  EXPECT_EQ(caching.stats().allocated, 0u);  // live blocks freed after the statistics
  VmmAllocatorOptions o;
  o.reserve = 256 * kMiB;
  VmmAllocator vmm(o);
  ReplayResult rv = replayAllocTrace(t, vmm);
  EXPECT_EQ(rv.stats.peakAllocated, 16 * kMiB);
  EXPECT_EQ(rv.stats.peakReserved, 16 * kMiB);  // the freed middle chunks were remapped
  EXPECT_EQ(rv.stats.chunksRemapped, 2u);
  EXPECT_DOUBLE_EQ(rv.stats.peakFragmentation(), 0.0);
  EXPECT_GT(rv.nsPerCall, 0.0);
}

TEST(AllocTraceTest, RecordsTheAllocationsOfTraining) {
  auto corpus = std::make_shared<const data::TextDataset>(data::TextDataset::defaultCorpus());
  GptConfig cfg = loadGptConfig(std::string(KEEL_SOURCE_DIR) + "/tests/fixtures/moe-tiny.json");
  AllocTrace t;
  {
    AllocTraceRecorder rec;
    Trainer tr(cfg, test::kCpu, 3, corpus, 2);
    rec.markStep(1);
    tr.step();
    rec.markStep(2);
    tr.step();
    t = rec.finish();
  }
  EXPECT_EQ(t.steps(), 2u);
  EXPECT_GT(t.allocs(), 100u);
  std::set<uint64_t> live;
  for (auto& e : t.events) {
    if (e.kind == TraceEvent::Alloc) {
      EXPECT_TRUE(live.insert(e.id).second);
    } else if (e.kind == TraceEvent::Free) {
      EXPECT_EQ(live.erase(e.id), 1u);
    }
  }
  CachingAllocator caching;
  ReplayResult r = replayAllocTrace(t, caching);
  EXPECT_EQ(r.calls, t.events.size() - 2);
}

// ---- the command line ----------------------------------------------------------------------

test::CliResult runKeel(const std::string& args) {
  const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  fs::path dir = fs::path(::testing::TempDir()) /
                 ("keel_trace_test_" + std::to_string(::getpid()) + "_" + name);
  fs::create_directories(dir);
  return test::runKeelCli(args, dir.string());
}

TEST(MemoryCliTest, ReplaysATraceFileAndARecording) {
  fs::path dir = fs::path(::testing::TempDir()) / ("keel_mem_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string trace = (dir / "t.trace").string();
  std::ofstream(trace) << "a 1 4194304\na 2 4194304\na 3 4194304\nf 2\na 4 8388608\n";
  auto r = runKeel("memory replay '" + trace + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("trace " + trace + ": 4 allocations, 5 events, 0 steps"), std::string::npos)
      << r.out;
  // At the end 16 of 20 MiB are live: 4 MiB (20%) cached, in one free block, so `keel memory
  // stats` would call it 0% fragmented: the column says cached, not frag.
  EXPECT_NE(r.out.find("peak resv frag@peak cached@end  defrags"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("caching        16.0 MiB     20.0 MiB    20.00%     20.00%"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("vmm            16.0 MiB     16.0 MiB     0.00%"), std::string::npos)
      << r.out;
  std::string db = (dir / "run.db").string();
  auto rec =
      runKeel("record --config tests/fixtures/gpt-tiny.json --steps 1 --allocator -o '" + db + "'");
  ASSERT_EQ(rec.status, 0) << rec.err;
  auto r2 = runKeel("memory replay '" + db + "' --allocator vmm");
  ASSERT_EQ(r2.status, 0) << r2.err;
  EXPECT_NE(r2.out.find("vmm  "), std::string::npos) << r2.out;
  EXPECT_EQ(r2.out.find("caching  "), std::string::npos) << r2.out;
  fs::remove_all(dir);
}

TEST(MemoryCliTest, ErrorsAreOneLine) {
  test::expectOneLineError(runKeel("memory replay /no/such/file"), "/no/such/file");
  fs::path bad = fs::path(::testing::TempDir()) / ("keel_bad_" + std::to_string(::getpid()));
  std::ofstream(bad) << "a 1 10\nf 2\n";
  test::expectOneLineError(runKeel("memory replay '" + bad.string() + "'"),
                           bad.string() + ":2: free of block 2, which is not live");
  test::expectOneLineError(runKeel("memory replay '" + bad.string() + "' --allocator buddy"),
                           "buddy");
  test::expectOneLineError(runKeel("memory trace out.trace --generate-moe --experts 0"), "experts");
  // Too large to hold is refused after its first step (100,000 steps took ~36 GB before).
  test::expectOneLineError(runKeel("memory trace out.trace --generate-moe --moe-steps 100000"),
                           "events, more than the 20000000 a generated trace may (about 916 MiB "
                           "of memory): fewer --moe-steps, --layers or --experts");
  fs::remove(bad);
}

}  // namespace
}  // namespace keel
