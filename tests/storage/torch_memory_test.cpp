// PyTorch memory snapshots imported through the restricted unpickler (storage/torch_memory.h):
// exact figures on snapshots Python's pickle wrote (tests/fixtures/torch, from
// tests/python/torch_snapshot_gen.py, with the figures it computed; 2.x dicts and 1.13 lists),
// hostile pickles refused in
// one line, every truncation and random damage of a real one refused or read without a crash,
// and `keel import torch-memory` through the real binary.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <tuple>

#include "keel/storage/errors.h"
#include "keel/storage/reader.h"
#include "keel/storage/torch_memory.h"
#include "test_util.h"

namespace keel::storage {
namespace {

const std::string kFixtures = std::string(KEEL_SOURCE_DIR) + "/tests/fixtures/torch/";

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Reads `bytes` as a snapshot (from memory, through fmemopen).
TorchMemorySnapshot readBytes(const std::string& bytes, TorchMemoryReadOptions o = {}) {
  std::string copy = bytes.empty() ? std::string(1, '\0') : bytes;
  std::FILE* f = fmemopen(copy.data(), copy.size(), "rb");
  EXPECT_NE(f, nullptr);
  try {
    TorchMemorySnapshot s = readTorchMemorySnapshot(f, bytes.size(), "test.pickle", o);
    std::fclose(f);
    return s;
  } catch (...) {
    std::fclose(f);
    throw;
  }
}

// The one-line error reading `bytes` gives (fails the test if it reads).
std::string errorOf(const std::string& bytes, TorchMemoryReadOptions o = {}) {
  try {
    readBytes(bytes, o);
  } catch (const StorageError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return msg;
  }
  ADD_FAILURE() << "read without an error";
  return "";
}

// A few pickle opcodes, to write hostile files by hand.
struct P {
  std::string b = "\x80\x04";
  P& op(char c) {
    b += c;
    return *this;
  }
  P& op(int c) { return op(char(c)); }
  P& str(const std::string& s) {
    b += char(0x8c);
    b += char(s.size());
    b += s;
    return *this;
  }
  P& int1(int v) {
    b += 'K';
    b += char(v);
    return *this;
  }
  P& stop() { return op('.'); }
};

// {"segments": [], "device_traces": [[entry]]} with the entry given as its key/value opcodes.
std::string withTraceEntry(const std::function<void(P&)>& entry) {
  P p;
  p.op('}').op('(').str("segments").op(']').str("device_traces").op(']').op(']').op('}').op('(');
  entry(p);
  p.op('u').op('a').op('a').op('u').stop();
  return p.b;
}

// What a written recording's figures must be: the generator's (events, peaks, ends).
void expectFigures(const TorchMemoryWritten& w, const nlohmann::json& fig) {
  EXPECT_EQ(w.events, fig["events"].get<uint64_t>());
  EXPECT_EQ(w.peakAllocated, fig["peak_allocated"].get<uint64_t>());
  EXPECT_EQ(w.endAllocated, fig["end_allocated"].get<uint64_t>());
  EXPECT_EQ(w.peakReserved, fig["peak_reserved"].get<uint64_t>());
  EXPECT_EQ(w.endReserved, fig["end_reserved"].get<uint64_t>());
}

TEST(TorchMemoryTest, FixturesGiveTheFiguresTheGeneratorComputed) {
  for (const char* name : {"snapshot-p4", "snapshot-p2"}) {
    const nlohmann::json want = nlohmann::json::parse(readFile(kFixtures + name + ".json"));
    for (const auto& [dev, fig] : want.items()) {
      SCOPED_TRACE(std::string(name) + " device " + dev);
      TorchMemoryReadOptions o;
      o.device = std::stoi(dev);
      const TorchMemorySnapshot s = readTorchMemorySnapshot(kFixtures + name + ".pickle", o);
      EXPECT_EQ(s.traceEntries, fig["trace_entries"].get<uint64_t>());
      EXPECT_EQ(s.initial.size() + s.trace.size(), fig["events"].get<uint64_t>());
      const std::filesystem::path out =
          std::filesystem::path(::testing::TempDir()) / (std::string(name) + dev + ".db");
      std::filesystem::remove(out);
      const TorchMemoryWritten w = writeTorchMemoryRecording(s, out, "test", name);
      expectFigures(w, fig);
      // What was written reads back: every event, in order, with its stack.
      Recording rec = Recording::open(out);
      const std::vector<MemRecord> mem = rec.memEvents({});
      ASSERT_EQ(mem.size(), w.events);
      EXPECT_EQ(mem.back().allocatedAfter, w.endAllocated);
      EXPECT_EQ(rec.run().device, "cuda:" + dev);
      EXPECT_EQ(rec.run().backend, "torch");
      // Every event has its stack but the reserves of the segments live when the trace starts
      // (the generator gives every trace entry and live block frames).
      size_t withStack = 0, startReserves = 0;
      for (const MemRecord& m : mem) withStack += m.stackId >= 0;
      for (const auto& e : s.initial) startReserves += e.kind == MemEventKind::Reserve;
      EXPECT_EQ(withStack, mem.size() - startReserves);
      const std::optional<StackRecord> st = rec.stack(mem.back().stackId);
      ASSERT_TRUE(st.has_value());
      EXPECT_GE(st->frames.size(), 4u);
      EXPECT_FALSE(st->frames.front().file.empty());
      std::filesystem::remove(out);
    }
  }
}

TEST(TorchMemoryTest, TheTraceIsUndoneToFindWhereItStarts) {
  // Python's test snapshot (tests/python/keel_torch_test.py), by hand: at the end an 8 MiB
  // segment with a 2 MiB block and a 4 MiB segment (made by the trace) with 3 MiB; the trace
  // allocated and freed 1 MiB, made the second segment and allocated in it, and freed a 2 MiB
  // block that was live before it began.
  const int MB = 1 << 20;
  P p;
  auto i4 = [&](uint32_t v) {
    p.b += 'J';
    for (int k = 0; k < 4; ++k) p.b += char((v >> (8 * k)) & 0xff);
  };
  auto entry = [&](const char* action, uint32_t addr, uint32_t size) {
    p.op('}').op('(').str("action").str(action).str("addr");
    i4(addr);
    p.str("size");
    i4(size);
    p.op('u');
  };
  auto block = [&](uint32_t size, const char* state) {
    p.op('}').op('(').str("size");
    i4(size);
    p.str("state").str(state).op('u');
  };
  // A segment of two blocks: `used` bytes active, `idle` inactive.
  auto segment = [&](uint32_t addr, uint32_t used, uint32_t idle) {
    p.op('}').op('(').str("device").int1(0).str("address");
    i4(addr);
    p.str("total_size");
    i4(used + idle);
    p.str("blocks").op(']').op('(');
    block(used, "active_allocated");
    block(idle, "inactive");
    p.op('e').op('u');
  };
  p.op('}').op('(').str("segments").op(']').op('(');
  segment(0x10000000, 2 * MB, 6 * MB);
  segment(0x20000000, 3 * MB, 1 * MB);
  p.op('e');
  p.str("device_traces").op(']').op(']').op('(');
  entry("alloc", 0x10200000, MB);
  entry("free_requested", 0x10200000, MB);
  entry("free_completed", 0x10200000, MB);
  entry("segment_alloc", 0x20000000, 4 * MB);
  entry("alloc", 0x20000000, 3 * MB);
  entry("free_completed", 0x10400000, 2 * MB);
  entry("oom", 5 * MB, 64 * MB);  // an oom's addr is the device's free memory
  p.op('e').op('a').op('u').stop();
  const TorchMemorySnapshot s = readBytes(p.b);
  // Start: the 8 MiB segment, and its 2 MiB blocks at +0 and +4 MiB.
  ASSERT_EQ(s.initial.size(), 3u);
  EXPECT_EQ(s.initial[0].kind, MemEventKind::Reserve);
  EXPECT_EQ(s.initial[0].bytes, uint64_t(8 * MB));
  EXPECT_EQ(s.initial[1].address, 0x10000000u);
  EXPECT_EQ(s.initial[2].address, 0x10400000u);
  ASSERT_EQ(s.trace.size(), 6u);  // free_requested changes nothing; the oom is kept
  EXPECT_EQ(s.traceEntries, 7u);
  EXPECT_EQ(s.trace[2].kind, MemEventKind::Reserve);
  EXPECT_EQ(s.trace[5].kind, MemEventKind::Oom);
  EXPECT_EQ(s.trace[5].bytes, uint64_t(64 * MB));
  EXPECT_EQ(s.trace[5].deviceFree, uint64_t(5 * MB));
  EXPECT_EQ(s.trace[5].address, 0u);
  EXPECT_EQ(s.segments, 2u);
  EXPECT_EQ(s.devices, std::vector<int>{0});
}

// PyTorch 1.13's torch.cuda.memory._snapshot(), pickled: the list of segments alone, blocks
// without addresses, stacks in each block's "history" (its own allocation first, at its
// address; older ones in the rest of the block after), no trace. It reads as the state when it
// was taken.
TEST(TorchMemoryTest, APyTorch113ListOfSegmentsIsTheStateItWasTakenIn) {
  const int MB = 1 << 20;
  P p;
  auto i4 = [&](uint32_t v) {
    p.b += 'J';
    for (int k = 0; k < 4; ++k) p.b += char((v >> (8 * k)) & 0xff);
  };
  auto frames = [&](const char* function, int line) {
    p.str("frames").op(']').op('}').op('(').str("filename").str("train.py").str("line").int1(line);
    p.str("name").str(function).op('u').op('a');
  };
  auto entry = [&](uint32_t addr, uint32_t realSize, const char* function, int line) {
    p.op('}').op('(').str("addr");
    i4(addr);
    p.str("real_size");
    i4(realSize);
    frames(function, line);
    p.op('u');
  };
  // A block: its size and state, then `history` adds its entries, if any.
  auto block = [&](uint32_t size, const char* state, const std::function<void()>& history) {
    p.op('}').op('(').str("size");
    i4(size);
    p.str("state").str(state);
    if (history) {
      p.str("history").op(']').op('(');
      history();
      p.op('e');
    }
    p.op('u');
  };
  auto segment = [&](int device, uint32_t addr, uint32_t total,
                     const std::function<void()>& blocks) {
    p.op('}').op('(').str("device").int1(device).str("address");
    i4(addr);
    p.str("total_size");
    i4(total);
    p.str("stream").int1(0).str("segment_type").str("large").str("blocks").op(']').op('(');
    blocks();
    p.op('e').op('u');
  };
  p.op(']').op('(');
  segment(0, 0x10000000, 8 * MB, [&] {
    // 3 MiB taken whole by a 2 MiB request; a freed 512 KiB allocation is still recorded at
    // +2.5 MiB, after the block's own.
    block(3 * MB, "active_allocated", [&] {
      entry(0x10000000, 2 * MB, "forward", 12);
      entry(0x10280000, MB / 2, "old_forward", 7);
    });
    block(1 * MB, "inactive", [&] { entry(0x10300000, MB, "freed_temp", 40); });
    block(2 * MB, "active_pending_free", nullptr);
    block(2 * MB, "inactive", nullptr);
  });
  segment(1, 0x20000000, 2 * MB, [&] {
    block(2 * MB, "active_allocated", [&] { entry(0x20000000, 2 * MB, "step", 99); });
  });
  p.op('e').stop();

  const TorchMemorySnapshot s = readBytes(p.b);
  using E = TorchMemorySnapshot::Event;
  auto fields = [](const E& e) { return std::tuple(e.kind, e.address, e.bytes, e.stackId); };
  ASSERT_EQ(s.initial.size(), 3u);
  EXPECT_EQ(fields(s.initial[0]),
            std::tuple(MemEventKind::Reserve, uint64_t(0x10000000), uint64_t(8 * MB), int64_t(-1)));
  EXPECT_EQ(fields(s.initial[1]),
            std::tuple(MemEventKind::Alloc, uint64_t(0x10000000), uint64_t(3 * MB), int64_t(1)));
  EXPECT_EQ(fields(s.initial[2]),
            std::tuple(MemEventKind::Alloc, uint64_t(0x10400000), uint64_t(2 * MB), int64_t(-1)));
  EXPECT_TRUE(s.trace.empty());
  EXPECT_EQ(s.traceEntries, 0u);
  EXPECT_EQ(s.segments, 1u);
  EXPECT_EQ(s.devices, (std::vector<int>{0, 1}));
  // The live block's stack is its own allocation's, not the freed one recorded after it.
  ASSERT_EQ(s.stacks.size(), 1u);
  ASSERT_EQ(s.stacks[0].frames.size(), 1u);
  EXPECT_EQ(s.stacks[0].frames[0].function, "forward");
  EXPECT_EQ(s.stacks[0].frames[0].file, "train.py");
  EXPECT_EQ(s.stacks[0].frames[0].line, 12);

  TorchMemoryReadOptions dev1;
  dev1.device = 1;
  const TorchMemorySnapshot s1 = readBytes(p.b, dev1);
  ASSERT_EQ(s1.initial.size(), 2u);
  EXPECT_EQ(fields(s1.initial[0]),
            std::tuple(MemEventKind::Reserve, uint64_t(0x20000000), uint64_t(2 * MB), int64_t(-1)));
  EXPECT_EQ(fields(s1.initial[1]),
            std::tuple(MemEventKind::Alloc, uint64_t(0x20000000), uint64_t(2 * MB), int64_t(1)));
  ASSERT_EQ(s1.stacks.size(), 1u);
  EXPECT_EQ(s1.stacks[0].frames[0].function, "step");

  TorchMemoryReadOptions dev3;
  dev3.device = 3;
  EXPECT_EQ(errorOf(p.b, dev3),
            "test.pickle: the snapshot has no memory of device 3 (devices in it: 0, 1)");
  // An empty list: PyTorch 1.13's snapshot of a process that holds no CUDA memory.
  EXPECT_EQ(errorOf(P().op(']').stop().b),
            "test.pickle: the snapshot has no memory of device 0 (it is empty)");
}

// tests/fixtures/torch/snapshot-113-p2.pickle: torch_snapshot_gen.py --format 1.13 --protocol 2
// (two devices), and every event the generator says the import must write, with the innermost
// frame of its stack.
TEST(TorchMemoryTest, APyTorch113FixtureGivesEveryEventTheGeneratorComputed) {
  const nlohmann::json want = nlohmann::json::parse(readFile(kFixtures + "snapshot-113-p2.json"));
  ASSERT_EQ(want.size(), 2u);
  for (const auto& [dev, fig] : want.items()) {
    SCOPED_TRACE("device " + dev);
    TorchMemoryReadOptions o;
    o.device = std::stoi(dev);
    const TorchMemorySnapshot s = readTorchMemorySnapshot(kFixtures + "snapshot-113-p2.pickle", o);
    EXPECT_EQ(s.traceEntries, 0u);
    EXPECT_TRUE(s.trace.empty());
    EXPECT_EQ(s.devices, (std::vector<int>{0, 1}));
    const std::filesystem::path out =
        std::filesystem::path(::testing::TempDir()) / ("snapshot-113-" + dev + ".db");
    std::filesystem::remove(out);
    const TorchMemoryWritten w = writeTorchMemoryRecording(s, out, "test", "snapshot-113-p2");
    expectFigures(w, fig);
    Recording rec = Recording::open(out);
    const std::vector<MemRecord> mem = rec.memEvents({});
    const nlohmann::json& events = fig["mem_events"];
    ASSERT_EQ(mem.size(), events.size());
    for (size_t k = 0; k < mem.size(); ++k) {
      SCOPED_TRACE("event " + std::to_string(k));
      const nlohmann::json& e = events[k];
      EXPECT_EQ(memEventName(mem[k].kind), e[0].get<std::string>());
      EXPECT_EQ(mem[k].address, e[1].get<uint64_t>());
      EXPECT_EQ(mem[k].bytes, e[2].get<uint64_t>());
      if (e[3].is_null()) {
        EXPECT_LT(mem[k].stackId, 0);
        continue;
      }
      const std::optional<StackRecord> st = rec.stack(mem[k].stackId);
      ASSERT_TRUE(st.has_value() && !st->frames.empty());
      EXPECT_EQ(st->frames[0].file, e[3][0].get<std::string>());
      EXPECT_EQ(st->frames[0].line, e[3][1].get<int>());
      EXPECT_EQ(st->frames[0].function, e[3][2].get<std::string>());
    }
    std::filesystem::remove(out);
  }
}

TEST(TorchMemoryTest, PicklesThatRunCodeAreRefusedByName) {
  // pickle.dumps(os.system) with a REDUCE: what `pickle.load` would run.
  using namespace std::string_literals;
  const std::string global =
      "\x80\x02"s + "cposix\nsystem\nq\x00X\x04\x00\x00\x00"s + "true\x85R."s;
  EXPECT_NE(errorOf(global).find("opcode GLOBAL (0x63), which would run code"), std::string::npos);
  P sg;
  sg.str("os").str("system").op(0x93).stop();
  EXPECT_NE(errorOf(sg.b).find("opcode STACK_GLOBAL"), std::string::npos);
  for (int code : {int('R'), int('b'), int('i'), int('o'), 0x81, 0x92, int('P'), int('Q'), 0x82}) {
    P p;
    p.op('N').op(code).stop();
    EXPECT_NE(errorOf(p.b).find("would run code"), std::string::npos) << code;
  }
  P set;
  set.op(0x8f).stop();
  EXPECT_NE(errorOf(set.b).find("EMPTY_SET (0x8f), which a memory snapshot never uses"),
            std::string::npos);
  P unknown;
  unknown.op(0xff).stop();
  EXPECT_NE(errorOf(unknown.b).find("unknown opcode 0xff"), std::string::npos);
}

TEST(TorchMemoryTest, HostileStructureIsRefusedInOneLine) {
  auto has = [](const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind("test.pickle: ", 0), 0u) << msg;
  };
  has(errorOf(""), "the file is empty");
  has(errorOf("not a pickle"), "no PROTO opcode");
  has(errorOf("\x80\x06N."), "pickle protocol 6");
  // A length far past the file's end, in every width.
  has(errorOf(std::string("\x80\x04\x8d") + std::string(7, '\xff') + "\x3f."),
      "runs past the file's end");
  has(errorOf(std::string("\x80\x04X\xff\xff\xff\x7f") + "abc."), "runs past the file's end");
  has(errorOf(std::string("\x80\x04\x95") + std::string(8, '\x7f')), "a frame runs past");
  // A list that contains itself (pickle's recursive structures): refused, not leaked.
  P cyc;
  cyc.op(']').op(0x94).op('h').op(0).op('a').stop();
  has(errorOf(cyc.b), "changes a container that is already shared");
  // 100,000 nested lists.
  P deep;
  for (int k = 0; k < 100000; ++k) deep.op(']');
  for (int k = 0; k < 99999; ++k) deep.op('a');
  has(errorOf(deep.b.append(".")), "nested more than 64 deep");
  P get;
  get.op('h').op(5).stop();
  has(errorOf(get.b), "entry 5, which was never stored");
  P put;
  put.op('N').op('r').op(0xff).op(0xff).op(0xff).op(0xff).stop();
  has(errorOf(put.b), "out of order");
  P big;
  big.op(0x8a).op(9);
  big.b += std::string(9, '\x01');
  has(errorOf(big.stop().b), "an integer of 9 bytes");
  has(errorOf(P().op('a').stop().b), "the stack is empty");
  has(errorOf(P().op('N').op('N').stop().b), "stops with 2 values on its stack");
  has(errorOf(P().op('e').stop().b), "a MARK is missing");
  has(errorOf(P().op('N').op('(').op('N').op('N').op('u').stop().b), "SETITEMS without a dict");
  has(errorOf(P().op('}').op('(').op('N').op('u').stop().b), "SETITEMS with a key and no value");
  has(errorOf(P().op('}').op(']').op('N').op('s').stop().b), "a dict key that is a list");
  has(errorOf(P().op(']').op(0x94).op('N').b), "ends in the middle");
  // Values past the memory bound: a million Nones in a list, with a 16 MiB bound.
  P many;
  many.op(']').op('(');
  many.b += std::string(1000000, 'N');
  many.op('e').stop();
  TorchMemoryReadOptions small;
  small.maxBytes = 16 << 20;
  has(errorOf(many.b, small), "more than 16 MiB of values");
  // Data, but not a snapshot.
  has(errorOf(P().int1(3).stop().b), "the pickle holds neither a dict nor a list of segments");
  has(errorOf(P().op(']').int1(3).op('a').stop().b),
      "the pickle holds a list, but not of segments (dicts)");
  has(errorOf(P().op('}').stop().b), "it has no 'segments'");
  has(errorOf(P().op('}').op('(').str("segments").int1(3).op('u').stop().b),
      "'segments' is not a list");
  has(errorOf(withTraceEntry([](P& p) { p.str("action").str("alloc").str("size").int1(8); })),
      "trace entry 0 (alloc) has no addr");
  has(errorOf(withTraceEntry(
          [](P& p) { p.str("action").str("alloc").str("addr").str("0x10").str("size").int1(8); })),
      "trace entry 0 (alloc): its addr is not an integer");
  has(errorOf(withTraceEntry([](P& p) { p.str("addr").int1(8); })), "trace entry 0 has no action");
  // Sizes past what the reader accepts in a recording (16 TiB an event): refused here, not
  // written into a recording that `keel memory` then calls damaged, with peaks that wrapped.
  auto long8 = [](P& p, uint64_t v) {
    p.op(0x8a).op(8);
    for (int k = 0; k < 8; ++k) p.op(int((v >> (8 * k)) & 0xff));
  };
  has(errorOf(withTraceEntry([&](P& p) {
        p.str("action").str("alloc").str("addr").int1(0).str("size");
        long8(p, (uint64_t(1) << 63) - 1);
      })),
      "trace entry 0 (alloc) claims 9223372036854775807 bytes, more than 16 TiB");
  {  // 65 live blocks of 16 TiB each: over 1 PiB live
    P p;
    p.op('}').op('(').str("segments").op(']').str("device_traces").op(']').op(']');
    for (int k = 0; k < 65; ++k) {
      p.op('}').op('(').str("action").str("alloc").str("addr").int1(k).str("size");
      long8(p, uint64_t(1) << 44);
      p.op('u').op('a');
    }
    p.op('a').op('u').stop();
    has(errorOf(p.b), "its live blocks or segments add up to more than 1 PiB");
  }
  TorchMemoryReadOptions dev3;
  dev3.device = 3;
  has(errorOf(withTraceEntry([](P& p) {
                p.str("action").str("alloc").str("addr").int1(0).str("size").int1(8);
              }),
              dev3),
      "has no memory of device 3 (devices in it: 0)");
}

TEST(TorchMemoryTest, EveryTruncationAndRandomDamageIsRefusedOrRead) {
  const std::string good = readFile(kFixtures + "snapshot-p4.pickle");
  ASSERT_GT(good.size(), 1000u);
  // Every cut of the file's head and tail, and every 97th cut in between.
  for (size_t n = 0; n < good.size(); n += (n < 600 || n + 600 > good.size()) ? 1 : 97)
    EXPECT_THROW(readBytes(good.substr(0, n)), StorageError) << n;
  std::mt19937 rng(7);
  int read = 0, refused = 0;
  for (int k = 0; k < 400; ++k) {
    std::string bad = good;
    for (int e = 0; e < 1 + k % 4; ++e) bad[rng() % bad.size()] = char(rng());
    try {
      readBytes(bad);
      ++read;
    } catch (const StorageError&) {
      ++refused;
    }
  }
  EXPECT_EQ(read + refused, 400);
  EXPECT_GT(refused, 0);
}

class TorchMemoryCliTest : public test::TempDirTest {};

TEST_F(TorchMemoryCliTest, ImportsThroughTheRealBinaryAndKeepsExistingFiles) {
  const std::string out = (dir_ / "mem.db").string();
  const nlohmann::json want = nlohmann::json::parse(readFile(kFixtures + "snapshot-p4.json"));
  test::CliResult r = test::runKeelCli(
      "import torch-memory " + kFixtures + "snapshot-p4.pickle -o " + out + " --device 1", dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("wrote " + out + ": " + std::to_string(want["1"]["events"].get<int>()) +
                       " allocator events"),
            std::string::npos)
      << r.out;
  r = test::runKeelCli("memory stats " + out, dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(std::to_string(want["1"]["peak_allocated"].get<uint64_t>())),
            std::string::npos)
      << r.out;
  // Whose allocator it was, in both commands (inspect said "unknown", stats guessed "caching").
  EXPECT_NE(r.out.find(" allocator events, PyTorch CUDA caching allocator\n"), std::string::npos)
      << r.out;
  r = test::runKeelCli("inspect " + out, dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("PyTorch CUDA caching"), std::string::npos) << r.out;
  // A snapshot that changes no memory imports as a recording without events, which memory stats
  // and replay call that (they said to record with keel record --allocator).
  const std::string none = (dir_ / "none.pickle").string(), noneDb = (dir_ / "none.db").string();
  // {'segments': [], 'device_traces': [[{'action': 'snapshot', 'addr': 0, 'size': 0}]]}
  auto text = [](const std::string& v) {  // BINUNICODE: 'X', a 4-byte little-endian length
    const uint32_t n = uint32_t(v.size());
    return "X" + std::string(reinterpret_cast<const char*>(&n), 4) + v;
  };
  const std::string zero("K\0", 2);  // BININT1 0
  std::ofstream(none, std::ios::binary)
      << "\x80\x02}(" + text("segments") + "]" + text("device_traces") + "]]}(" + text("action") +
             text("snapshot") + text("addr") + zero + text("size") + zero + "uaau.";
  ASSERT_EQ(test::runKeelCli("import torch-memory " + none + " -o " + noneDb, dir_).status, 0);
  for (const char* cmd : {"memory stats ", "memory replay "})
    test::expectOneLineError(test::runKeelCli(cmd + noneDb, dir_),
                             "has no allocator events: the PyTorch snapshot it was imported from "
                             "holds no memory and no trace entry that changes memory");
  // A trace with a refused request (what snapshots are taken for): the import counts it, and
  // memory stats names it with the device's free memory then. It was dropped.
  {
    auto i4 = [](uint32_t v) { return "J" + std::string(reinterpret_cast<const char*>(&v), 4); };
    auto entry = [&](const char* action, uint32_t addr, uint32_t size) {
      return "}(" + text("action") + text(action) + text("addr") + i4(addr) + text("size") +
             i4(size) + "ua";
    };
    const std::string oomSnap = (dir_ / "oom.pickle").string(), oomDb = (dir_ / "oom.db").string();
    std::ofstream(oomSnap, std::ios::binary)
        << "\x80\x02}(" + text("segments") + "]" + text("device_traces") + "]]" +
               entry("segment_alloc", 0x200000, 0x200000) + entry("alloc", 0x200000, 1024) +
               entry("oom", 5000, 0x400000) + entry("free_completed", 0x200000, 1024) +
               entry("segment_free", 0x200000, 0x200000) + "au.";
    r = test::runKeelCli("import torch-memory " + oomSnap + " -o " + oomDb, dir_);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(
        r.out.find("\n1 request refused (out of memory): keel memory stats names the first\n"),
        std::string::npos)
        << r.out;
    r = test::runKeelCli("memory stats " + oomDb, dir_);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("\nout of memory at event 2: 4.00 MiB (4194304 bytes) requested and "
                         "refused (device free 5000 bytes)\n"),
              std::string::npos)
        << r.out;
    EXPECT_NE(
        r.out.find("\nlive at the out of memory: held by a user reference 1.00 KiB (1 block)"),
        std::string::npos)
        << r.out;
  }
  // A hostile pickle: one line, status 2, and the recording already there is untouched.
  const std::string evil = (dir_ / "evil.pickle").string();
  std::ofstream(evil, std::ios::binary)
      << "\x80\x02"
      << "cposix\nsystem\nX\x05" << std::string(3, '\0') << "touch"
      << "\x85R.";
  const std::string before = readFile(out);
  r = test::runKeelCli("import torch-memory " + evil + " -o " + out, dir_);
  test::expectOneLineError(r, "opcode GLOBAL (0x63), which would run code");
  EXPECT_EQ(readFile(out), before);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "touch"));
  // The output is the snapshot itself; a device that is not there; bad arguments.
  test::expectOneLineError(test::runKeelCli("import torch-memory " + evil + " -o " + evil, dir_),
                           "is the snapshot");
  test::expectOneLineError(
      test::runKeelCli("import torch-memory " + kFixtures + "snapshot-p2.pickle -o x.db --device 2",
                       dir_),
      "has no memory of device 2 (devices in it: 0)");
  test::expectOneLineError(test::runKeelCli("import torch-memory nope.pickle -o x.db", dir_),
                           "nope.pickle: cannot open: No such file or directory");
  test::expectOneLineError(
      test::runKeelCli("import torch-memory " + evil + " -o x.db --device -1", dir_), "--device");
  test::expectOneLineError(test::runKeelCli("import torch-memory " + evil + " -o /dev/null", dir_),
                           "not a regular file");
  test::expectOneLineError(test::runKeelCli("import", dir_), "");
  EXPECT_FALSE(std::filesystem::exists(dir_ / "x.db"));
}

// `keel import torch-memory` of a pickled PyTorch 1.13 snapshot (a list): it said "not a PyTorch
// memory snapshot: the pickle holds no dict".
TEST_F(TorchMemoryCliTest, ImportsAPyTorch113SnapshotThroughTheRealBinary) {
  const nlohmann::json want = nlohmann::json::parse(readFile(kFixtures + "snapshot-113-p2.json"));
  const std::string in = kFixtures + "snapshot-113-p2.pickle", out = (dir_ / "113.db").string();
  test::CliResult r =
      test::runKeelCli("import torch-memory " + in + " -o " + out + " --device 1", dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("wrote " + out + ": " + std::to_string(want["1"]["events"].get<int>()) +
                       " allocator events"),
            std::string::npos)
      << r.out;
  // No trace: the state at the snapshot (it said "when its trace starts ...; 0 trace entries").
  EXPECT_NE(r.out.find("imported " + in + ": device cuda:1; at the snapshot, "), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(" live blocks (no trace); "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("trace entries"), std::string::npos) << r.out;
  r = test::runKeelCli("memory stats " + out, dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(std::to_string(want["1"]["peak_allocated"].get<uint64_t>())),
            std::string::npos)
      << r.out;
  test::expectOneLineError(
      test::runKeelCli("import torch-memory " + in + " -o x.db --device 3", dir_),
      "has no memory of device 3 (devices in it: 0, 1)");
  EXPECT_FALSE(std::filesystem::exists(dir_ / "x.db"));
}

// A frame whose file name is longer than a recording's strings may be (64 KiB) is stored cut,
// saying how much was left out: the recording it wrote was called damaged by every reader.
TEST_F(TorchMemoryCliTest, AFrameLongerThanARecordingsStringsIsStoredCut) {
  const std::string longName(70000, 'f');
  const std::string bytes = withTraceEntry([&](P& p) {
    p.str("action").str("alloc").str("addr").int1(0).str("size").int1(8).str("frames");
    p.op(']').op('}').op('(').str("filename").op('X');
    for (int k = 0; k < 4; ++k) p.op(int((longName.size() >> (8 * k)) & 0xff));
    p.b += longName;
    p.str("line").int1(3).str("name").str("step").op('u').op('a');
  });
  const std::string in = (dir_ / "long.pickle").string(), out = (dir_ / "long.db").string();
  std::ofstream(in, std::ios::binary) << bytes;
  test::CliResult r = test::runKeelCli("import torch-memory " + in + " -o " + out, dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  r = test::runKeelCli("memory stats " + out, dir_);
  EXPECT_EQ(r.status, 0) << r.err;
  const Recording rec = Recording::open(out);
  const auto events = rec.memEvents({});
  ASSERT_EQ(events.size(), 1u);
  const auto stack = rec.stack(events[0].stackId);
  ASSERT_TRUE(stack && stack->frames.size() == 1);
  const std::string& file = stack->frames[0].file;
  EXPECT_LE(file.size(), size_t(64 << 10));
  EXPECT_EQ(file.substr(0, 16), std::string(16, 'f'));
  const std::string note = "... (" + std::to_string(70000 - (65536 - 48)) + " more bytes)";
  EXPECT_EQ(file.substr(file.size() - note.size()), note) << file.substr(file.size() - 40);
  EXPECT_EQ(stack->frames[0].function, "step");
  EXPECT_EQ(stack->frames[0].line, 3);
}

}  // namespace
}  // namespace keel::storage
