// MemoryModel on hand-made allocator events: replay (caching segments, vmm chunks with remap and
// compaction, host blocks), checkpoints equal a plain replay at every event, the block map
// layout, why-alive rules, tracked sections and histograms. Exact values. (The studio's section
// table over it: tests/views/memory_view_test.cpp.)
#include <gtest/gtest.h>

#include <random>

#include "keel/analysis/memory_model.h"

using namespace keel::analysis;
using keel::storage::MemRecord;
using keel::storage::OpRecord;
using keel::storage::Role;
using keel::storage::TensorRecord;

namespace {

constexpr uint64_t MiB = 1 << 20;

struct Ev {
  std::string kind;
  uint64_t address = 0, bytes = 0;
  uint64_t opSeq = 0;
  int64_t timeNs = 0;
  uint64_t bufferId = 0;
  std::string tag = {};
  uint64_t toAddress = 0;
  int64_t step = 1;
};

std::vector<MemRecord> events(const std::vector<Ev>& in) {
  std::vector<MemRecord> out;
  uint64_t allocated = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const Ev& e = in[i];
    MemRecord r;
    r.kind = *keel::parseMemEventKind(e.kind);
    r.address = e.address;
    r.bytes = e.bytes;
    r.toAddress = e.toAddress;
    r.opSeq = e.opSeq;
    r.timeNs = e.timeNs ? e.timeNs : int64_t(i + 1);
    r.bufferId = e.bufferId;
    r.step = e.step;
    if (e.kind == "alloc") allocated += e.bytes;
    if (e.kind == "free") allocated -= e.bytes;
    const bool mark = e.kind == "track_begin" || e.kind == "track_end";
    if (mark)
      r.label = e.tag;  // a mark's "tag" is its section label
    else
      r.tag = *keel::parseMemTag(e.tag);
    r.allocatedAfter = mark ? 0 : allocated;  // marks carry no figures, as recorded
    r.reservedAfter = mark ? 0 : allocated + 1024;
    out.push_back(r);
  }
  return out;
}

MemoryModel model(const std::vector<Ev>& in, const std::vector<OpRecord>& ops = {},
                  size_t every = 0) {
  MemoryModel m(every);
  m.addOps(ops);
  m.setEvents(events(in));
  return m;
}

OpRecord op(uint64_t seq, const std::string& name, const std::string& phase, int64_t begin,
            int64_t end, std::vector<std::pair<uint64_t, uint64_t>> outputs = {},
            uint64_t forwardSeq = 0) {
  OpRecord o;
  o.seq = seq;
  o.step = 1;
  o.name = name;
  o.phase = *keel::parsePhase(phase);
  o.scope = "blocks.0";
  o.beginNs = begin;
  o.endNs = end;
  o.forwardSeq = forwardSeq;
  int idx = 0;
  for (auto [buffer, tensor] : outputs) {
    TensorRecord t;
    t.role = Role::Output;
    t.index = idx++;
    t.bufferId = buffer;
    t.tensorId = tensor;
    t.shape = {4, 8};
    t.dtype = "float32";
    o.tensors.push_back(t);
  }
  return o;
}

using Blocks = std::vector<std::pair<uint64_t, uint64_t>>;  // (address, bytes)
Blocks blocksOf(const MemState& s) {
  Blocks out;
  for (const MemBlock& b : s.blocks) out.emplace_back(b.address, b.bytes);
  return out;
}

}  // namespace

TEST(MemoryModel, CachingReplayEveryEvent) {
  const MemoryModel m = model({
      {"reserve", 0x10000, 4096},
      {"alloc", 0x10000, 512, 1, 0, 10},
      {"alloc", 0x10200, 1024, 2, 0, 11},
      {"free", 0x10000, 512},
      {"alloc", 0x10000, 256, 3, 0, 12},
      {"reserve", 0x20000, 2048},
      {"alloc", 0x20000, 2048, 4, 0, 13},
      {"free", 0x20000, 2048},
      {"release", 0x20000, 2048},
  });
  EXPECT_EQ(m.eventCount(), size_t(9));
  EXPECT_TRUE(m.hasSegments());
  EXPECT_EQ(m.allocatorKind(), keel::AllocatorKind::Caching);
  EXPECT_EQ(m.stateAt(-1).blocks.size(), size_t(0));
  EXPECT_EQ(blocksOf(m.stateAt(0)), Blocks{});
  EXPECT_EQ(m.stateAt(0).segments, (std::vector<MemSegment>{{0x10000, 4096, true}}));
  EXPECT_EQ(blocksOf(m.stateAt(2)), (Blocks{{0x10000, 512}, {0x10200, 1024}}));
  EXPECT_EQ(m.stateAt(2).liveBytes, uint64_t(1536));
  EXPECT_EQ(blocksOf(m.stateAt(3)), (Blocks{{0x10200, 1024}}));
  EXPECT_EQ(blocksOf(m.stateAt(4)), (Blocks{{0x10000, 256}, {0x10200, 1024}}));
  EXPECT_EQ(m.stateAt(4).blocks[0].allocEvent, 4u);
  EXPECT_EQ(m.stateAt(6).segments.size(), size_t(2));
  EXPECT_EQ(m.stateAt(6).liveBytes, uint64_t(256 + 1024 + 2048));
  const MemState end = m.stateAt(8);
  EXPECT_EQ(end.cursor, int64_t(8));
  EXPECT_EQ(end.segments, (std::vector<MemSegment>{{0x10000, 4096, true}}));
  EXPECT_EQ(end.liveBytes, uint64_t(1280));
  EXPECT_EQ(m.stateAt(100).cursor, int64_t(8));  // clamped to the last event

  // The block map of the end: the one segment cut into blocks and free space.
  const MemLayout L = layoutMemory(end);
  EXPECT_EQ(L.pieces.size(), size_t(4));
  EXPECT_EQ(L.spans, size_t(1));
  EXPECT_EQ(L.total, uint64_t(4096));
  EXPECT_EQ(L.blocksOutside, size_t(0));
  EXPECT_EQ(int(L.pieces[0].kind), int(MemPiece::Kind::Block));
  EXPECT_EQ(L.pieces[0].address, uint64_t(0x10000));
  EXPECT_EQ(L.pieces[0].length, uint64_t(256));
  EXPECT_EQ(int(L.pieces[1].kind), int(MemPiece::Kind::Free));
  EXPECT_EQ(L.pieces[1].address, uint64_t(0x10100));
  EXPECT_EQ(L.pieces[1].bytes, uint64_t(256));
  EXPECT_EQ(L.pieces[2].offset, uint64_t(512));
  EXPECT_EQ(L.pieces[2].block, int64_t(1));
  EXPECT_EQ(int(L.pieces[3].kind), int(MemPiece::Kind::Free));
  EXPECT_EQ(L.pieces[3].bytes, uint64_t(4096 - 1536));
  EXPECT_TRUE(!L.pieces[0].gapBefore);

  // Two segments apart: two spans, the second marked as a gap.
  const MemLayout L6 = layoutMemory(m.stateAt(6));
  EXPECT_EQ(L6.spans, size_t(2));
  EXPECT_EQ(L6.total, uint64_t(4096 + 2048));
  EXPECT_TRUE(L6.pieces.back().gapBefore);
  EXPECT_EQ(L6.pieces.back().address, uint64_t(0x20000));
  // Log scale: 16 units per doubling above 256 bytes.
  const MemLayout log = layoutMemory(end, MemScale::Log);
  EXPECT_EQ(log.pieces[0].length, uint64_t(16));  // 256 B
  EXPECT_EQ(log.pieces[2].length, uint64_t(48));  // 1 KiB
}

TEST(MemoryModel, VmmRemapAndCompaction) {
  const uint64_t c0 = 0x200000, c1 = 0x400000, c2 = 0x600000;
  const MemoryModel m = model({
      {"map", c0, 2 * MiB},
      {"map", c1, 2 * MiB},
      {"alloc", c0, MiB, 1, 0, 20},
      {"alloc", c1, 2 * MiB, 2, 0, 21},
      {"free", c0, MiB},
      {"unmap", c0, 2 * MiB},
      {"move", c0, 2 * MiB, 0, 0, 0, {}, c2},
      {"map", c2, 2 * MiB},
      {"compact", c1, 2 * MiB, 0, 0, 21, {}, c2},
      {"alloc", c1, 512, 3, 0, 22},
  });
  EXPECT_EQ(m.allocatorKind(), keel::AllocatorKind::Vmm);
  // The move itself changes nothing: unmap and map carry the remap.
  EXPECT_EQ(m.stateAt(6).segments, m.stateAt(5).segments);
  EXPECT_EQ(m.stateAt(5).segments,
            (std::vector<MemSegment>{{c0, 2 * MiB, false}, {c1, 2 * MiB, true}}));
  const MemState s = m.stateAt(8);
  EXPECT_EQ(blocksOf(s), (Blocks{{c2, 2 * MiB}}));
  EXPECT_EQ(s.blocks[0].allocEvent, 3u);  // the compacted block keeps its alloc event
  EXPECT_EQ(m.allocOf(s.blocks[0]).bufferId, uint64_t(21));
  const MemLayout L = layoutMemory(s);
  EXPECT_EQ(L.pieces.size(), size_t(3));
  EXPECT_EQ(L.spans, size_t(1));  // three touching chunks
  EXPECT_EQ(int(L.pieces[0].kind), int(MemPiece::Kind::Unmapped));
  EXPECT_EQ(L.pieces[0].bytes, 2 * MiB);
  EXPECT_EQ(int(L.pieces[1].kind), int(MemPiece::Kind::Free));
  EXPECT_EQ(L.pieces[1].address, c1);
  EXPECT_EQ(L.pieces[1].bytes, 2 * MiB);  // the two mapped chunks are one free run + a block
  EXPECT_EQ(int(L.pieces[2].kind), int(MemPiece::Kind::Block));
  EXPECT_EQ(blocksOf(m.stateAt(9)), (Blocks{{c1, 512}, {c2, 2 * MiB}}));
}

TEST(MemoryModel, HostBlocksLaidOutCompactly) {
  const MemoryModel m = model({
      {"alloc", 0x9000, 64, 1},
      {"alloc", 0x1000, 128, 1},
      {"alloc", 0x1080, 64, 1},
      {"alloc", 0x5000, 256, 2},
      {"free", 0x5000, 256},
  });
  EXPECT_TRUE(!m.hasSegments());
  EXPECT_EQ(m.allocatorKind(), keel::AllocatorKind::Host);
  const MemState s = m.stateAt(4);
  EXPECT_EQ(blocksOf(s), (Blocks{{0x1000, 128}, {0x1080, 64}, {0x9000, 64}}));
  const MemLayout L = layoutMemory(s);
  EXPECT_EQ(L.pieces.size(), size_t(3));
  EXPECT_EQ(L.blocksOutside, size_t(3));
  EXPECT_EQ(L.total, uint64_t(256));
  EXPECT_EQ(L.spans, size_t(2));  // 0x1000..0x10c0 touch; 0x9000 after a gap
  EXPECT_TRUE(!L.pieces[0].gapBefore);
  EXPECT_TRUE(!L.pieces[1].gapBefore);
  EXPECT_TRUE(L.pieces[2].gapBefore);
  EXPECT_EQ(L.pieces[2].offset, uint64_t(192));
}

TEST(MemoryModel, CheckpointsEqualAPlainReplay) {
  std::mt19937_64 rng(7);
  std::vector<Ev> ev;
  std::vector<uint64_t> live;
  ev.push_back({"reserve", 0x100000, 64 * MiB});
  uint64_t next = 0x100000;
  for (int i = 0; i < 3000; ++i) {
    const bool alloc = live.empty() || rng() % 3 != 0;
    if (alloc) {
      const uint64_t bytes = 512 * (1 + rng() % 64);
      ev.push_back({"alloc", next, bytes, uint64_t(i + 1), 0, uint64_t(i + 1)});
      live.push_back(next);
      next += bytes;
    } else {
      const size_t j = rng() % live.size();
      ev.push_back({"free", live[j], 0});
      live.erase(live.begin() + std::ptrdiff_t(j));
    }
  }
  const MemoryModel fast = model(ev, {}, 64);
  const MemoryModel plain = model(ev, {}, 1 << 30);
  EXPECT_EQ(fast.checkpointEvery(), size_t(64));
  for (int64_t k = -1; k < int64_t(ev.size()); ++k) {
    const MemState a = fast.stateAt(k), b = plain.stateAt(k);
    EXPECT_TRUE(a.blocks == b.blocks && a.segments == b.segments && a.liveBytes == b.liveBytes)
        << "event " << k;
  }
  // The default spacing keeps at most ~256 checkpoints, at least 256 events apart.
  EXPECT_EQ(model(ev).checkpointEvery(), size_t(256));
}

TEST(MemoryModel, WhyAliveRules) {
  const std::vector<OpRecord> ops = {
      op(1, "matmul", "forward", 100, 110, {{10, 100}}),
      op(2, "reshape", "forward", 120, 121, {{10, 101}}),  // views buffer 10
      op(4, "add", "forward", 130, 131, {{12, 102}}),
      op(5, "transpose", "forward", 140, 141, {{12, 103}}),  // views buffer 12
      op(6, "relu", "forward", 142, 143, {{13, 104}}),
      op(7, "matmul_backward", "backward", 200, 210, {}, 1),
  };
  const MemoryModel m = model(
      {
          {"alloc", 0x1000, 512, 0, 50, 1, "parameter"},
          {"alloc", 0x2000, 512, 0, 51, 2, "optimizer_state"},
          {"alloc", 0x3000, 512, 0, 52, 3, "data"},
          {"alloc", 0x4000, 512, 1, 105, 10},
          {"alloc", 0x5000, 512, 4, 130, 12},
          {"alloc", 0x7000, 512, 0, 135, 99},  // between op 4 and op 5
          {"alloc", 0x6000, 512, 6, 142, 13},
          {"alloc", 0x8000, 512, 0, 150, 98},  // before the backward
          {"alloc", 0x9000, 512, 7, 205, 97},  // inside the backward
          {"alloc", 0xa000, 512, 0, 220, 96},  // after it
      },
      ops);
  auto why = [&](int64_t cursor, uint64_t address) {
    const MemState s = m.stateAt(cursor);
    for (const MemBlock& b : s.blocks)
      if (b.address == address) return m.whyAlive(b, cursor);
    return WhyAlive{AliveReason::UserReference, 0, "missing"};
  };
  EXPECT_EQ(why(9, 0x1000).text, std::string("parameter"));
  EXPECT_EQ(why(9, 0x2000).text, std::string("optimizer state"));
  EXPECT_EQ(why(9, 0x3000).text, std::string("input batch"));
  // matmul's output before (and while) its backward runs: saved for backward.
  EXPECT_EQ(int(why(7, 0x4000).reason), int(AliveReason::SavedForBackward));
  EXPECT_EQ(why(7, 0x4000).text, std::string("saved for backward (op #1 matmul)"));
  EXPECT_EQ(why(8, 0x4000).opSeq, uint64_t(1));
  // After the backward: its buffer is viewed by reshape (op 2), which ran.
  EXPECT_EQ(why(9, 0x4000).text, std::string("base of a view (op #2 reshape)"));
  EXPECT_EQ(why(9, 0x4000).opSeq, uint64_t(2));
  // add's output (no backward recorded): a plain reference until transpose views it.
  EXPECT_EQ(why(5, 0x5000).text, std::string("held by a user reference"));
  EXPECT_EQ(why(7, 0x5000).text, std::string("base of a view (op #5 transpose)"));
  EXPECT_EQ(why(9, 0x6000).text, std::string("held by a user reference"));

  // Op lookups.
  EXPECT_EQ(m.op(7)->forwardSeq, uint64_t(1));
  EXPECT_EQ(m.op(1)->backwardSeq, uint64_t(7));
  EXPECT_EQ(m.op(1)->backwardEndNs, int64_t(210));
  EXPECT_TRUE(m.op(3) == nullptr);
  EXPECT_EQ(m.buffer(10)->tensor->opSeq, uint64_t(1));
  EXPECT_EQ(m.buffer(10)->viewOpSeq, uint64_t(2));
  EXPECT_EQ(m.buffer(10)->tensor->shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(m.opEvents(1), (std::optional<std::pair<size_t, size_t>>{{3, 3}}));
  EXPECT_TRUE(!m.opEvents(2));
  EXPECT_EQ(m.lastEventBeforeOp(2), int64_t(3));  // the last event at or before t=120
  EXPECT_EQ(m.lastEventBeforeOp(3), int64_t(-1));
  // Blocks of an op: allocated by it, or holding one of its outputs (reshape -> buffer 10).
  const MemState s = m.stateAt(9);
  auto addresses = [&](const std::vector<size_t>& idx) {
    std::vector<uint64_t> out;
    for (size_t i : idx) out.push_back(s.blocks[i].address);
    return out;
  };
  EXPECT_EQ(addresses(m.blocksOfOp(s, 1)), std::vector<uint64_t>{0x4000});
  EXPECT_EQ(addresses(m.blocksOfOp(s, 2)), std::vector<uint64_t>{0x4000});
  EXPECT_EQ(addresses(m.blocksOfOp(s, 7)), std::vector<uint64_t>{0x9000});
  EXPECT_TRUE(m.blocksOfOp(s, 42).empty());
}

// A refused request (oom) changes nothing; the model lists it, and what was live then sums by
// why it was alive, the most bytes first.
TEST(MemoryModel, RefusedRequestsAndWhatHeldTheMemory) {
  const std::vector<OpRecord> ops = {op(1, "matmul", "forward", 100, 110, {{10, 100}})};
  const MemoryModel m = model(
      {
          {"alloc", 0x1000, 512, 0, 50, 1, "parameter"},
          {"alloc", 0x2000, 256, 0, 51, 2, "parameter"},
          {"alloc", 0x3000, 2048, 1, 105, 10},
          {"oom", 0, 4096, 1, 106},
          {"free", 0x3000, 2048, 0, 120},
          {"oom", 0, 8192, 0, 130},
      },
      ops);
  EXPECT_EQ(m.oomEvents(), (std::vector<size_t>{3, 5}));
  EXPECT_EQ(m.allocatedAfter(3), 2816u);
  EXPECT_EQ(m.stateAt(3).liveBytes, 2816u);
  EXPECT_EQ(m.opEvents(1), (std::optional<std::pair<size_t, size_t>>{{2, 3}}));
  const std::vector<MemAliveShare> live = m.aliveByReason(3);
  ASSERT_EQ(live.size(), 2u);
  EXPECT_EQ(live[0].what, "held by a user reference");
  EXPECT_EQ(live[0].bytes, 2048u);
  EXPECT_EQ(live[0].blocks, 1u);
  EXPECT_EQ(live[1].what, "parameters");
  EXPECT_EQ(live[1].bytes, 768u);
  EXPECT_EQ(live[1].blocks, 2u);
  EXPECT_TRUE(model({}).oomEvents().empty());
}

// Who holds the memory: live blocks summed by allocation site — the op that allocated each, or an
// allocation's innermost frame outside ops (an imported PyTorch snapshot's) — most bytes first.
TEST(MemoryModel, LiveBlocksBySite) {
  std::vector<MemRecord> evs = events({
      {"alloc", 0x1000, 512, 1, 101},
      {"alloc", 0x2000, 256, 1, 102},
      {"alloc", 0x3000, 4096, 0, 103},
      {"alloc", 0x5000, 1024, 0, 104},
      {"alloc", 0x6000, 64, 0, 105},
      {"free", 0x2000, 256, 1, 106},
  });
  evs[2].stackId = 7;
  evs[3].stackId = 7;
  MemoryModel m;
  m.addOps({op(1, "matmul", "forward", 100, 110)});
  keel::storage::StackRecord st;
  st.id = 7;
  st.frames = {{0, "leaky_cache_append", "/home/me/train.py", 77}, {0, "step", "train.py", 12}};
  m.addStack(st);
  m.setEvents(evs);
  const std::vector<MemSiteShare> sites = m.aliveBySite(m.stateAt(4));
  ASSERT_EQ(sites.size(), 3u);
  EXPECT_EQ(sites[0].site, "leaky_cache_append (train.py:77)");
  EXPECT_EQ(sites[0].bytes, 5120u);
  EXPECT_EQ(sites[0].blocks, 2u);
  EXPECT_EQ(sites[0].largestAlloc, 2u);
  EXPECT_EQ(sites[1].site, "matmul (blocks.0)");
  EXPECT_EQ(sites[1].bytes, 768u);
  EXPECT_EQ(sites[1].blocks, 2u);
  EXPECT_EQ(sites[1].largestAlloc, 0u);
  EXPECT_EQ(sites[2].site, "outside ops");
  EXPECT_EQ(sites[2].bytes, 64u);
  EXPECT_EQ(m.aliveBySite(m.stateAt(5))[1].bytes, 512u);  // the 256-byte block freed
  EXPECT_TRUE(m.aliveBySite(m.stateAt(-1)).empty());
}

TEST(MemoryModel, TrackedSections) {
  const MemoryModel m = model({
      {"alloc", 0x100, 64},
      {"track_begin", 0, 0, 0, 0, 0, "outer"},
      {"alloc", 0x200, 100, 3},
      {"track_begin", 0, 0, 0, 0, 0, "inner"},
      {"alloc", 0x300, 200, 4},
      {"free", 0x200, 100},
      {"free", 0x100, 64},  // allocated before both sections
      {"alloc", 0x400, 50, 5},
      {"track_end", 0, 0, 0, 0, 0, "inner"},
      {"free", 0x300, 200},
      {"track_end", 0, 0, 0, 0, 0, "outer"},
      {"track_begin", 0, 0, 0, 0, 0, "open"},
      {"alloc", 0x500, 10, 6},
      {"track_end", 0, 0, 0, 0, 0, "never-begun"},
  });
  EXPECT_EQ(m.sections().size(), size_t(3));
  // A mark has no figures of its own: the previous event's carry over.
  EXPECT_EQ(m.event(1).allocatedAfter, uint64_t(0));
  EXPECT_EQ(m.allocatedAfter(1), uint64_t(64));
  EXPECT_EQ(m.reservedAfter(1), uint64_t(64 + 1024));
  EXPECT_EQ(m.fragmentationAfter(1), 1024.0 / (64 + 1024));
  EXPECT_EQ(m.allocatedAfter(3), uint64_t(164));
  EXPECT_EQ(m.peakAllocated(), uint64_t(364));
  const MemSection& outer = m.sections()[0];
  EXPECT_EQ(outer.name, std::string("outer"));
  EXPECT_EQ(outer.beginEvent, size_t(1));
  EXPECT_EQ(outer.endEvent, std::optional<size_t>(10));
  EXPECT_EQ(outer.allocs, uint64_t(3));
  EXPECT_EQ(outer.frees, uint64_t(3));
  EXPECT_EQ(outer.bytesAllocated, uint64_t(350));
  EXPECT_EQ(outer.bytesFreed, uint64_t(364));
  EXPECT_EQ(outer.peakBytes, uint64_t(300));
  EXPECT_EQ(outer.aliveBytes, uint64_t(50));
  EXPECT_EQ(outer.alive.size(), size_t(1));
  EXPECT_EQ(outer.alive[0].address, uint64_t(0x400));
  const MemSection& inner = m.sections()[1];
  EXPECT_EQ(inner.name, std::string("inner"));
  EXPECT_EQ(inner.endEvent, std::optional<size_t>(8));
  EXPECT_EQ(inner.allocs, uint64_t(2));
  EXPECT_EQ(inner.frees, uint64_t(2));
  EXPECT_EQ(inner.peakBytes, uint64_t(250));
  EXPECT_EQ(inner.aliveBytes, uint64_t(250));
  EXPECT_EQ(inner.alive.size(), size_t(2));
  EXPECT_EQ(inner.alive[0].bytes, uint64_t(200));  // largest first
  EXPECT_EQ(m.allocOf(inner.alive[0]).opSeq, uint64_t(4));
  const MemSection& open = m.sections()[2];
  EXPECT_TRUE(!open.endEvent);
  EXPECT_EQ(open.aliveBytes, uint64_t(10));
}

TEST(MemoryModel, HistogramAndSteps) {
  const MemoryModel m = model({
      {"alloc", 0x1000, 512, 1, 0, 0, {}, 0, 0},
      {"alloc", 0x2000, 700, 1, 0, 0, {}, 0, 1},
      {"alloc", 0x3000, 1024, 1, 0, 0, {}, 0, 1},
      {"alloc", 0x4000, 4096, 1, 0, 0, {}, 0, 2},
  });
  const std::vector<MemBucket> h = MemoryModel::histogram(m.stateAt(3));
  EXPECT_EQ(h.size(), size_t(4));
  EXPECT_EQ(h[0].log2, 9);
  EXPECT_EQ(h[0].count, uint64_t(2));
  EXPECT_EQ(h[0].bytes, uint64_t(1212));
  EXPECT_EQ(h[1].log2, 10);
  EXPECT_EQ(h[1].count, uint64_t(1));
  EXPECT_EQ(h[2].count, uint64_t(0));  // 2 KiB class: empty but shown
  EXPECT_EQ(h[3].log2, 12);
  EXPECT_TRUE(MemoryModel::histogram(m.stateAt(-1)).empty());
  EXPECT_EQ(m.stepStarts(), (std::vector<std::pair<size_t, int64_t>>{{0, 0}, {1, 1}, {3, 2}}));
  EXPECT_EQ(m.peakAllocated(), uint64_t(512 + 700 + 1024 + 4096));
}

TEST(MemoryModel, EmptyModel) {
  const MemoryModel m = model({});
  EXPECT_EQ(m.eventCount(), size_t(0));
  EXPECT_EQ(m.allocatorKind(), std::nullopt);
  EXPECT_EQ(m.stateAt(5).cursor, int64_t(-1));
  EXPECT_TRUE(layoutMemory(m.stateAt(0)).pieces.empty());
}

namespace {

// Events with the allocator's reserved figure as an allocator would report it: reserve / map add
// their bytes, release / unmap take them away.
MemoryModel withReserved(const std::vector<Ev>& in) {
  std::vector<MemRecord> ev = events(in);
  uint64_t reserved = 0;
  for (MemRecord& e : ev) {
    if (e.kind == keel::MemEventKind::Reserve || e.kind == keel::MemEventKind::Map)
      reserved += e.bytes;
    if (e.kind == keel::MemEventKind::Release || e.kind == keel::MemEventKind::Unmap)
      reserved -= e.bytes;
    e.reservedAfter = reserved;
  }
  MemoryModel m;
  m.setEvents(std::move(ev));
  return m;
}

using Slices = std::vector<MemBandSlice>;

}  // namespace

// Cached free is reserved - allocated; fragmentation is 1 - largest free block / cached free, with
// free blocks per caching segment (two touching segments do not make one free block).
TEST(MemoryFigures, CachingFreeBlocksStayInsideTheirSegment) {
  const MemoryModel m = withReserved({
      {"reserve", 0x10000, 4096},
      {"reserve", 0x11000, 2048},  // touches the first
      {"alloc", 0x10000, 512},
      {"alloc", 0x10400, 1024},  // 512 free before it, 2048 after it up to 0x11000
      {"alloc", 0x11200, 512},   // 512 free before it (touching the 2048), 1024 after
  });
  const MemFigures f = m.figuresAt(4);
  EXPECT_EQ(f.event, int64_t(4));
  EXPECT_EQ(f.allocated, uint64_t(2048));
  EXPECT_EQ(f.reserved, uint64_t(6144));
  EXPECT_EQ(f.cachedFree, uint64_t(4096));
  EXPECT_EQ(f.largestFree, uint64_t(2048));
  EXPECT_EQ(f.freeBlocks, uint64_t(4));
  EXPECT_DOUBLE_EQ(f.cachedShare(), 4096.0 / 6144.0);
  EXPECT_DOUBLE_EQ(f.fragmentation(), 0.5);
  // Before any block: each segment is one free block.
  const MemFigures g = m.figuresAt(1);
  EXPECT_EQ(g.largestFree, uint64_t(4096));
  EXPECT_EQ(g.freeBlocks, uint64_t(2));
  EXPECT_DOUBLE_EQ(g.fragmentation(), 1.0 - 4096.0 / 6144.0);
  EXPECT_EQ(m.figuresAt(-1), MemFigures{});
  EXPECT_EQ(m.peakEvent(), int64_t(4));
  EXPECT_EQ(m.figuresAtPeak(), f);
}

// vmm: a free block spans touching mapped chunks; an unmapped chunk holds no free block.
TEST(MemoryFigures, VmmFreeBlocksSpanTouchingChunks) {
  const MemoryModel m = withReserved({
      {"map", 0, 2 * MiB},
      {"map", 2 * MiB, 2 * MiB},
      {"alloc", 0, MiB},
      {"alloc", 3 * MiB, MiB},  // free: [1 MiB, 3 MiB), one block across two chunks
      {"map", 6 * MiB, 2 * MiB},
      {"unmap", 6 * MiB, 2 * MiB},
  });
  EXPECT_EQ(m.allocatorKind(), keel::AllocatorKind::Vmm);
  const MemFigures a = m.figuresAt(3);
  EXPECT_EQ(a.cachedFree, 2 * MiB);
  EXPECT_EQ(a.largestFree, 2 * MiB);
  EXPECT_EQ(a.freeBlocks, uint64_t(1));
  EXPECT_DOUBLE_EQ(a.fragmentation(), 0.0);
  const MemFigures b = m.figuresAt(4);
  EXPECT_EQ(b.reserved, 6 * MiB);
  EXPECT_EQ(b.cachedFree, 4 * MiB);
  EXPECT_EQ(b.largestFree, 2 * MiB);
  EXPECT_EQ(b.freeBlocks, uint64_t(2));
  EXPECT_DOUBLE_EQ(b.fragmentation(), 0.5);
  EXPECT_DOUBLE_EQ(b.cachedShare(), 4.0 / 6.0);
  const MemFigures c = m.figuresAt(5);
  EXPECT_EQ(c.freeBlocks, uint64_t(1));
  EXPECT_EQ(c.largestFree, 2 * MiB);
}

// The host allocator reserves nothing beyond its blocks: no cached memory, no fragmentation.
TEST(MemoryFigures, HostHasNoFreeBlocks) {
  std::vector<MemRecord> ev = events({{"alloc", 0x100, 64}, {"alloc", 0x400, 64}});
  for (MemRecord& e : ev) e.reservedAfter = e.allocatedAfter;
  MemoryModel m;
  m.setEvents(std::move(ev));
  const MemFigures f = m.figuresAt(1);
  EXPECT_EQ(f.cachedFree, uint64_t(0));
  EXPECT_EQ(f.largestFree, uint64_t(0));
  EXPECT_EQ(f.freeBlocks, uint64_t(0));
  EXPECT_DOUBLE_EQ(f.fragmentation(), 0.0);
  EXPECT_DOUBLE_EQ(f.cachedShare(), 0.0);
}

// Active-memory bands: live blocks stacked in allocation order; a block freed under others lets
// them sink; one column per event when there is room.
TEST(MemoryBands, StackedInAllocationOrder) {
  const MemoryModel m = model({
      {"alloc", 0x100, 100},  // A
      {"alloc", 0x200, 50},   // B
      {"alloc", 0x300, 30},   // C
      {"free", 0x100, 100},   // A goes: B and C sink
      {"alloc", 0x100, 10},   // D, on top
  });
  const MemBands b = m.bands(0, 4, 100);
  ASSERT_EQ(b.columns.size(), size_t(5));
  EXPECT_EQ(b.first, int64_t(0));
  EXPECT_EQ(b.last, int64_t(4));
  EXPECT_EQ(b.maxTotal, uint64_t(180));
  EXPECT_EQ(b.columns[0].slices, (Slices{{0, 0, 100, 1}}));
  EXPECT_EQ(b.columns[2].slices, (Slices{{0, 0, 100, 1}, {1, 100, 50, 1}, {2, 150, 30, 1}}));
  EXPECT_EQ(b.columns[3].slices, (Slices{{1, 0, 50, 1}, {2, 50, 30, 1}}));
  EXPECT_EQ(b.columns[4].slices, (Slices{{1, 0, 50, 1}, {2, 50, 30, 1}, {4, 80, 10, 1}}));
  EXPECT_EQ(b.columns[4].total, uint64_t(90));
  EXPECT_EQ(b.columns[4].event, int64_t(4));

  // Level of detail: blocks under 40 bytes merge with their small neighbours.
  const MemBands lod = m.bands(0, 4, 100, 40);
  EXPECT_EQ(lod.columns[4].slices, (Slices{{1, 0, 50, 1}, {kMergedBands, 50, 40, 2, 2}}));
  EXPECT_EQ(lod.columns[0].slices, (Slices{{0, 0, 100, 1}}));

  // Two columns: each drawn at its event of most bytes allocated.
  const MemBands two = m.bands(0, 4, 2);
  ASSERT_EQ(two.columns.size(), size_t(2));
  EXPECT_EQ(two.columns[0].firstEvent, int64_t(0));
  EXPECT_EQ(two.columns[0].lastEvent, int64_t(1));
  EXPECT_EQ(two.columns[0].event, int64_t(1));
  EXPECT_EQ(two.columns[1].firstEvent, int64_t(2));
  EXPECT_EQ(two.columns[1].lastEvent, int64_t(4));
  EXPECT_EQ(two.columns[1].event, int64_t(2));
  EXPECT_EQ(two.columns[1].total, uint64_t(180));

  // A range that starts late reads the blocks live before it from the checkpoints.
  const MemBands late = m.bands(3, 4, 100);
  ASSERT_EQ(late.columns.size(), size_t(2));
  EXPECT_EQ(late.columns[0].slices, (Slices{{1, 0, 50, 1}, {2, 50, 30, 1}}));
  EXPECT_EQ(late.columns[1].slices, b.columns[4].slices);
  EXPECT_TRUE(m.bands(5, 9, 10).columns.empty());
}

// A compacted block keeps its band (and place in the stack) at its new address.
TEST(MemoryBands, CompactionKeepsTheBand) {
  const MemoryModel m = model({
      {"alloc", 0x0, 10},
      {"alloc", 0x10, 20},
      {"free", 0x0, 10},
      {"compact", 0x10, 20, 0, 0, 0, {}, 0x0},
      {"alloc", 0x40, 5},
      {"free", 0x0, 20},  // the compacted block, at its new address
  });
  const MemBands b = m.bands(0, 5, 100);
  ASSERT_EQ(b.columns.size(), size_t(6));
  EXPECT_EQ(b.columns[3].slices, (Slices{{1, 0, 20, 1}}));
  EXPECT_EQ(b.columns[4].slices, (Slices{{1, 0, 20, 1}, {4, 20, 5, 1}}));
  EXPECT_EQ(b.columns[5].slices, (Slices{{4, 0, 5, 1}}));
  const MemBands late = m.bands(4, 5, 100);  // starts after the compaction
  EXPECT_EQ(late.columns[1].slices, (Slices{{4, 0, 5, 1}}));
}

// Many events, few columns: the live list is compacted as it goes and the figures still hold.
TEST(MemoryBands, ManyEventsFewColumns) {
  std::vector<Ev> in;
  for (uint64_t i = 0; i < 2000; ++i) {
    in.push_back({"alloc", 0x1000 + i * 0x100, 16});
    if (i >= 10) in.push_back({"free", 0x1000 + (i - 10) * 0x100, 16});
  }
  const MemoryModel m = model(in);
  const MemBands b = m.bands(0, int64_t(in.size()) - 1, 50);
  ASSERT_EQ(b.columns.size(), size_t(50));
  for (const MemBandColumn& c : b.columns) {
    EXPECT_EQ(c.total, m.stateAt(c.event).liveBytes);
    EXPECT_LE(c.slices.size(), size_t(11));
  }
  // Each column is drawn right after an alloc (11 live, the most its events reach), that alloc on
  // top and the ten before it under it, oldest first.
  const MemBandColumn& last = b.columns.back();
  ASSERT_EQ(last.slices.size(), size_t(11));
  EXPECT_EQ(last.slices.back().allocEvent, uint32_t(last.event));
  for (size_t i = 0; i < 11; ++i) {
    EXPECT_EQ(last.slices[i].base, uint64_t(16 * i));
    if (i) {
      EXPECT_EQ(last.slices[i].allocEvent, last.slices[i - 1].allocEvent + 2);
    }
  }
}
