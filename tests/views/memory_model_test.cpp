// MemoryModel on hand-made allocator events: replay (caching segments, vmm chunks with remap and
// compaction, host blocks), checkpoints equal a plain replay at every event, the block map
// layout, why-alive rules, tracked sections, histograms and the section table model. Exact values.
#include <QAbstractItemModelTester>
#include <QtTest>
#include <random>

#include "keel/views/memory_model.h"
#include "keel/views/memory_view.h"

using namespace keel::views;
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
    r.kind = e.kind;
    r.address = e.address;
    r.bytes = e.bytes;
    r.toAddress = e.toAddress;
    r.opSeq = e.opSeq;
    r.timeNs = e.timeNs ? e.timeNs : int64_t(i + 1);
    r.bufferId = e.bufferId;
    r.tag = e.tag;
    r.step = e.step;
    if (e.kind == "alloc") allocated += e.bytes;
    if (e.kind == "free") allocated -= e.bytes;
    const bool mark = e.kind == "track_begin" || e.kind == "track_end";
    if (mark) r.label = e.tag;
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
  o.phase = phase;
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

class MemoryModelTest : public QObject {
  Q_OBJECT
 private slots:
  void cachingReplayEveryEvent() {
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
    QCOMPARE(m.eventCount(), size_t(9));
    QVERIFY(m.hasSegments());
    QCOMPARE(m.allocatorKind(), std::string("caching"));
    QCOMPARE(m.stateAt(-1).blocks.size(), size_t(0));
    QCOMPARE(blocksOf(m.stateAt(0)), Blocks{});
    QCOMPARE(m.stateAt(0).segments, (std::vector<MemSegment>{{0x10000, 4096, true}}));
    QCOMPARE(blocksOf(m.stateAt(2)), (Blocks{{0x10000, 512}, {0x10200, 1024}}));
    QCOMPARE(m.stateAt(2).liveBytes, uint64_t(1536));
    QCOMPARE(blocksOf(m.stateAt(3)), (Blocks{{0x10200, 1024}}));
    QCOMPARE(blocksOf(m.stateAt(4)), (Blocks{{0x10000, 256}, {0x10200, 1024}}));
    QCOMPARE(m.stateAt(4).blocks[0].allocEvent, 4u);
    QCOMPARE(m.stateAt(6).segments.size(), size_t(2));
    QCOMPARE(m.stateAt(6).liveBytes, uint64_t(256 + 1024 + 2048));
    const MemState end = m.stateAt(8);
    QCOMPARE(end.cursor, int64_t(8));
    QCOMPARE(end.segments, (std::vector<MemSegment>{{0x10000, 4096, true}}));
    QCOMPARE(end.liveBytes, uint64_t(1280));
    QCOMPARE(m.stateAt(100).cursor, int64_t(8));  // clamped to the last event

    // The block map of the end: the one segment cut into blocks and free space.
    const MemLayout L = layoutMemory(end);
    QCOMPARE(L.pieces.size(), size_t(4));
    QCOMPARE(L.spans, size_t(1));
    QCOMPARE(L.total, uint64_t(4096));
    QCOMPARE(L.blocksOutside, size_t(0));
    QCOMPARE(int(L.pieces[0].kind), int(MemPiece::Kind::Block));
    QCOMPARE(L.pieces[0].address, uint64_t(0x10000));
    QCOMPARE(L.pieces[0].length, uint64_t(256));
    QCOMPARE(int(L.pieces[1].kind), int(MemPiece::Kind::Free));
    QCOMPARE(L.pieces[1].address, uint64_t(0x10100));
    QCOMPARE(L.pieces[1].bytes, uint64_t(256));
    QCOMPARE(L.pieces[2].offset, uint64_t(512));
    QCOMPARE(L.pieces[2].block, int64_t(1));
    QCOMPARE(int(L.pieces[3].kind), int(MemPiece::Kind::Free));
    QCOMPARE(L.pieces[3].bytes, uint64_t(4096 - 1536));
    QVERIFY(!L.pieces[0].gapBefore);

    // Two segments apart: two spans, the second marked as a gap.
    const MemLayout L6 = layoutMemory(m.stateAt(6));
    QCOMPARE(L6.spans, size_t(2));
    QCOMPARE(L6.total, uint64_t(4096 + 2048));
    QVERIFY(L6.pieces.back().gapBefore);
    QCOMPARE(L6.pieces.back().address, uint64_t(0x20000));
    // Log scale: 16 units per doubling above 256 bytes.
    const MemLayout log = layoutMemory(end, MemScale::Log);
    QCOMPARE(log.pieces[0].length, uint64_t(16));  // 256 B
    QCOMPARE(log.pieces[2].length, uint64_t(48));  // 1 KiB
  }

  void vmmRemapAndCompaction() {
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
    QCOMPARE(m.allocatorKind(), std::string("vmm"));
    // The move itself changes nothing: unmap and map carry the remap.
    QCOMPARE(m.stateAt(6).segments, m.stateAt(5).segments);
    QCOMPARE(m.stateAt(5).segments,
             (std::vector<MemSegment>{{c0, 2 * MiB, false}, {c1, 2 * MiB, true}}));
    const MemState s = m.stateAt(8);
    QCOMPARE(blocksOf(s), (Blocks{{c2, 2 * MiB}}));
    QCOMPARE(s.blocks[0].allocEvent, 3u);  // the compacted block keeps its alloc event
    QCOMPARE(m.allocOf(s.blocks[0]).bufferId, uint64_t(21));
    const MemLayout L = layoutMemory(s);
    QCOMPARE(L.pieces.size(), size_t(3));
    QCOMPARE(L.spans, size_t(1));  // three touching chunks
    QCOMPARE(int(L.pieces[0].kind), int(MemPiece::Kind::Unmapped));
    QCOMPARE(L.pieces[0].bytes, 2 * MiB);
    QCOMPARE(int(L.pieces[1].kind), int(MemPiece::Kind::Free));
    QCOMPARE(L.pieces[1].address, c1);
    QCOMPARE(L.pieces[1].bytes, 2 * MiB);  // the two mapped chunks are one free run + a block
    QCOMPARE(int(L.pieces[2].kind), int(MemPiece::Kind::Block));
    QCOMPARE(blocksOf(m.stateAt(9)), (Blocks{{c1, 512}, {c2, 2 * MiB}}));
  }

  void hostBlocksLaidOutCompactly() {
    const MemoryModel m = model({
        {"alloc", 0x9000, 64, 1},
        {"alloc", 0x1000, 128, 1},
        {"alloc", 0x1080, 64, 1},
        {"alloc", 0x5000, 256, 2},
        {"free", 0x5000, 256},
    });
    QVERIFY(!m.hasSegments());
    QCOMPARE(m.allocatorKind(), std::string("host"));
    const MemState s = m.stateAt(4);
    QCOMPARE(blocksOf(s), (Blocks{{0x1000, 128}, {0x1080, 64}, {0x9000, 64}}));
    const MemLayout L = layoutMemory(s);
    QCOMPARE(L.pieces.size(), size_t(3));
    QCOMPARE(L.blocksOutside, size_t(3));
    QCOMPARE(L.total, uint64_t(256));
    QCOMPARE(L.spans, size_t(2));  // 0x1000..0x10c0 touch; 0x9000 after a gap
    QVERIFY(!L.pieces[0].gapBefore);
    QVERIFY(!L.pieces[1].gapBefore);
    QVERIFY(L.pieces[2].gapBefore);
    QCOMPARE(L.pieces[2].offset, uint64_t(192));
  }

  void checkpointsEqualAPlainReplay() {
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
    QCOMPARE(fast.checkpointEvery(), size_t(64));
    for (int64_t k = -1; k < int64_t(ev.size()); ++k) {
      const MemState a = fast.stateAt(k), b = plain.stateAt(k);
      QVERIFY2(a.blocks == b.blocks && a.segments == b.segments && a.liveBytes == b.liveBytes,
               qPrintable(QString("event %1").arg(k)));
    }
    // The default spacing keeps at most ~256 checkpoints, at least 256 events apart.
    QCOMPARE(model(ev).checkpointEvery(), size_t(256));
  }

  void whyAliveRules() {
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
    QCOMPARE(why(9, 0x1000).text, std::string("parameter"));
    QCOMPARE(why(9, 0x2000).text, std::string("optimizer state"));
    QCOMPARE(why(9, 0x3000).text, std::string("input batch"));
    // matmul's output before (and while) its backward runs: saved for backward.
    QCOMPARE(int(why(7, 0x4000).reason), int(AliveReason::SavedForBackward));
    QCOMPARE(why(7, 0x4000).text, std::string("saved for backward (op #1 matmul)"));
    QCOMPARE(why(8, 0x4000).opSeq, uint64_t(1));
    // After the backward: its buffer is viewed by reshape (op 2), which ran.
    QCOMPARE(why(9, 0x4000).text, std::string("base of a view (op #2 reshape)"));
    QCOMPARE(why(9, 0x4000).opSeq, uint64_t(2));
    // add's output (no backward recorded): a plain reference until transpose views it.
    QCOMPARE(why(5, 0x5000).text, std::string("held by a user reference"));
    QCOMPARE(why(7, 0x5000).text, std::string("base of a view (op #5 transpose)"));
    QCOMPARE(why(9, 0x6000).text, std::string("held by a user reference"));

    // Op lookups.
    QCOMPARE(m.op(7)->forwardSeq, uint64_t(1));
    QCOMPARE(m.op(1)->backwardSeq, uint64_t(7));
    QCOMPARE(m.op(1)->backwardEndNs, int64_t(210));
    QVERIFY(m.op(3) == nullptr);
    QCOMPARE(m.buffer(10)->tensor->opSeq, uint64_t(1));
    QCOMPARE(m.buffer(10)->viewOpSeq, uint64_t(2));
    QCOMPARE(m.buffer(10)->tensor->shape, (std::vector<int64_t>{4, 8}));
    QCOMPARE(m.opEvents(1), (std::optional<std::pair<size_t, size_t>>{{3, 3}}));
    QVERIFY(!m.opEvents(2));
    QCOMPARE(m.lastEventBeforeOp(2), int64_t(3));  // the last event at or before t=120
    QCOMPARE(m.lastEventBeforeOp(3), int64_t(-1));
    // Blocks of an op: allocated by it, or holding one of its outputs (reshape -> buffer 10).
    const MemState s = m.stateAt(9);
    auto addresses = [&](const std::vector<size_t>& idx) {
      std::vector<uint64_t> out;
      for (size_t i : idx) out.push_back(s.blocks[i].address);
      return out;
    };
    QCOMPARE(addresses(m.blocksOfOp(s, 1)), std::vector<uint64_t>{0x4000});
    QCOMPARE(addresses(m.blocksOfOp(s, 2)), std::vector<uint64_t>{0x4000});
    QCOMPARE(addresses(m.blocksOfOp(s, 7)), std::vector<uint64_t>{0x9000});
    QVERIFY(m.blocksOfOp(s, 42).empty());
  }

  void trackedSections() {
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
    QCOMPARE(m.sections().size(), size_t(3));
    // A mark has no figures of its own: the previous event's carry over.
    QCOMPARE(m.event(1).allocatedAfter, uint64_t(0));
    QCOMPARE(m.allocatedAfter(1), uint64_t(64));
    QCOMPARE(m.reservedAfter(1), uint64_t(64 + 1024));
    QCOMPARE(m.fragmentationAfter(1), 1024.0 / (64 + 1024));
    QCOMPARE(m.allocatedAfter(3), uint64_t(164));
    QCOMPARE(m.peakAllocated(), uint64_t(364));
    const MemSection& outer = m.sections()[0];
    QCOMPARE(outer.name, std::string("outer"));
    QCOMPARE(outer.beginEvent, size_t(1));
    QCOMPARE(outer.endEvent, std::optional<size_t>(10));
    QCOMPARE(outer.allocs, uint64_t(3));
    QCOMPARE(outer.frees, uint64_t(3));
    QCOMPARE(outer.bytesAllocated, uint64_t(350));
    QCOMPARE(outer.bytesFreed, uint64_t(364));
    QCOMPARE(outer.peakBytes, uint64_t(300));
    QCOMPARE(outer.aliveBytes, uint64_t(50));
    QCOMPARE(outer.alive.size(), size_t(1));
    QCOMPARE(outer.alive[0].address, uint64_t(0x400));
    const MemSection& inner = m.sections()[1];
    QCOMPARE(inner.name, std::string("inner"));
    QCOMPARE(inner.endEvent, std::optional<size_t>(8));
    QCOMPARE(inner.allocs, uint64_t(2));
    QCOMPARE(inner.frees, uint64_t(2));
    QCOMPARE(inner.peakBytes, uint64_t(250));
    QCOMPARE(inner.aliveBytes, uint64_t(250));
    QCOMPARE(inner.alive.size(), size_t(2));
    QCOMPARE(inner.alive[0].bytes, uint64_t(200));  // largest first
    QCOMPARE(m.allocOf(inner.alive[0]).opSeq, uint64_t(4));
    const MemSection& open = m.sections()[2];
    QVERIFY(!open.endEvent);
    QCOMPARE(open.aliveBytes, uint64_t(10));

    // The table: one row per section, under the model tester.
    auto shared = std::make_shared<const MemoryModel>(m);
    MemSectionModel table;
    QAbstractItemModelTester tester(&table, QAbstractItemModelTester::FailureReportingMode::QtTest);
    table.setMemory(shared);
    QCOMPARE(table.rowCount(), 3);
    QCOMPARE(table.data(table.index(0, MemSectionModel::Name)).toString(), QString("outer"));
    QCOMPARE(table.data(table.index(0, MemSectionModel::Events)).toString(), QString("1–10"));
    QCOMPARE(table.data(table.index(0, MemSectionModel::Allocs)).toULongLong(), 3ULL);
    QCOMPARE(table.data(table.index(0, MemSectionModel::Peak)).toString(), QString("300 B"));
    QCOMPARE(table.data(table.index(1, MemSectionModel::Alive)).toString(),
             QString("2 blocks, 250 B"));
    QCOMPARE(table.data(table.index(1, MemSectionModel::AliveOps)).toString(),
             QString("op #4, op #5"));
    QCOMPARE(table.data(table.index(2, MemSectionModel::Name)).toString(),
             QString("open (not ended)"));
    QCOMPARE(table.data(table.index(2, 0), MemSectionModel::EndEventRole).toLongLong(), 13LL);
    table.setMemory(nullptr);
    QCOMPARE(table.rowCount(), 0);
  }

  void histogramAndSteps() {
    const MemoryModel m = model({
        {"alloc", 0x1000, 512, 1, 0, 0, {}, 0, 0},
        {"alloc", 0x2000, 700, 1, 0, 0, {}, 0, 1},
        {"alloc", 0x3000, 1024, 1, 0, 0, {}, 0, 1},
        {"alloc", 0x4000, 4096, 1, 0, 0, {}, 0, 2},
    });
    const std::vector<MemBucket> h = MemoryModel::histogram(m.stateAt(3));
    QCOMPARE(h.size(), size_t(4));
    QCOMPARE(h[0].log2, 9);
    QCOMPARE(h[0].count, uint64_t(2));
    QCOMPARE(h[0].bytes, uint64_t(1212));
    QCOMPARE(h[1].log2, 10);
    QCOMPARE(h[1].count, uint64_t(1));
    QCOMPARE(h[2].count, uint64_t(0));  // 2 KiB class: empty but shown
    QCOMPARE(h[3].log2, 12);
    QVERIFY(MemoryModel::histogram(m.stateAt(-1)).empty());
    QCOMPARE(m.stepStarts(), (std::vector<std::pair<size_t, int64_t>>{{0, 0}, {1, 1}, {3, 2}}));
    QCOMPARE(m.peakAllocated(), uint64_t(512 + 700 + 1024 + 4096));
  }

  void formatsBytes() {
    QCOMPARE(formatBytes(0), std::string("0 B"));
    QCOMPARE(formatBytes(512), std::string("512 B"));
    QCOMPARE(formatBytes(1536), std::string("1.50 KiB"));
    QCOMPARE(formatBytes(20 * MiB), std::string("20.0 MiB"));
    QCOMPARE(formatBytes(300 * MiB), std::string("300 MiB"));
  }

  void emptyModel() {
    const MemoryModel m = model({});
    QCOMPARE(m.eventCount(), size_t(0));
    QCOMPARE(m.allocatorKind(), std::string());
    QCOMPARE(m.stateAt(5).cursor, int64_t(-1));
    QVERIFY(layoutMemory(m.stateAt(0)).pieces.empty());
  }
};

QTEST_MAIN(MemoryModelTest)
#include "memory_model_test.moc"
