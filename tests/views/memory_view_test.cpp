// The memory view on recordings made by the real keel binary (vmm and caching allocators with
// allocator events, the host allocator, and no allocator events): it shows the recorded event
// count, scrubbing (API, slider, keys, a click on the timeline) shows the block map of that moment
// (checked against a replay written here, and against the allocator's own allocatedAfter), block
// tooltips say why a block is alive, and a click on a block selects its op and back; and the
// section table over a hand-made model (analysis::MemoryModel itself: tests/analysis/).
#include <QAbstractItemModelTester>
#include <QLabel>
#include <QSignalSpy>
#include <QSlider>
#include <QtTest>
#include <map>

#include "keel/storage/reader.h"
#include "keel/views/memory_view.h"
#include "keel/views/run_source.h"
#include "keel/views/selection.h"
#include "view_test_util.h"

using namespace keel::views;
using namespace keel::analysis;
using keel::MemEventKind;
using keel::MemTag;
using keel::Phase;
using keel::storage::MemRecord;
using keel::storage::Recording;

namespace {

const std::string kOptions = "--steps 2 --seed 4 --allocator --stacks";

// Loads the memory model the way the studio does: through RunSource's worker.
MemoryPtr loadMemory(const QString& path) {
  RunSource src;
  QObject receiver;
  bool opened = false;
  QString failed;
  MemoryPtr memory;
  QObject::connect(&src, &RunSource::opened, &receiver, [&](SummaryPtr) { opened = true; });
  QObject::connect(&src, &RunSource::failed, &receiver, [&](QString m) { failed = m; });
  QObject::connect(&src, &RunSource::memoryLoaded, &receiver, [&](MemoryPtr m) { memory = m; });
  QObject::connect(&src, &RunSource::memoryFailed, &receiver, [&](QString m) { failed = m; });
  src.open(path);
  src.requestMemory();
  if (!QTest::qWaitFor([&] { return memory || !failed.isEmpty(); }, 60000))
    qWarning() << "memory did not load";
  if (!failed.isEmpty()) qWarning() << "failed:" << failed;
  return memory;
}

// An independent replay of events 0..k: live blocks by address (alloc adds, free removes,
// compact moves), nothing else.
std::map<uint64_t, uint64_t> replay(const std::vector<MemRecord>& events, size_t k) {
  std::map<uint64_t, uint64_t> live;
  for (size_t i = 0; i <= k; ++i) {
    const MemRecord& e = events[i];
    if (e.kind == MemEventKind::Alloc) {
      live[e.address] = e.bytes;
    } else if (e.kind == MemEventKind::Free) {
      live.erase(e.address);
    } else if (e.kind == MemEventKind::Compact) {
      auto it = live.find(e.address);
      if (it != live.end()) {
        const uint64_t bytes = it->second;
        live.erase(it);
        live[e.toAddress] = bytes;
      }
    }
  }
  return live;
}

std::map<uint64_t, uint64_t> shown(const MemoryView& view) {
  std::map<uint64_t, uint64_t> out;
  for (const MemBlock& b : view.state().blocks) out[b.address] = b.bytes;
  return out;
}

// A model of hand-made events with three tracked sections: outer (holding inner), inner, and one
// never ended (the sections tests/analysis/memory_model_test.cpp checks value by value).
MemoryPtr sectionsModel() {
  struct Ev {
    const char* kind;
    uint64_t address, bytes, opSeq;
    const char* tag;
  };
  const std::vector<Ev> in = {
      {"alloc", 0x100, 64, 0, ""},     {"track_begin", 0, 0, 0, "outer"},
      {"alloc", 0x200, 100, 3, ""},    {"track_begin", 0, 0, 0, "inner"},
      {"alloc", 0x300, 200, 4, ""},    {"free", 0x200, 100, 0, ""},
      {"free", 0x100, 64, 0, ""},      {"alloc", 0x400, 50, 5, ""},
      {"track_end", 0, 0, 0, "inner"}, {"free", 0x300, 200, 0, ""},
      {"track_end", 0, 0, 0, "outer"}, {"track_begin", 0, 0, 0, "open"},
      {"alloc", 0x500, 10, 6, ""},     {"track_end", 0, 0, 0, "never-begun"},
  };
  std::vector<MemRecord> events;
  uint64_t allocated = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    MemRecord r;
    r.kind = *keel::parseMemEventKind(in[i].kind);
    r.address = in[i].address;
    r.bytes = in[i].bytes;
    r.opSeq = in[i].opSeq;
    r.timeNs = int64_t(i + 1);
    r.step = 1;
    if (r.kind == MemEventKind::Alloc) allocated += r.bytes;
    if (r.kind == MemEventKind::Free) allocated -= r.bytes;
    const bool mark = r.kind == MemEventKind::TrackBegin || r.kind == MemEventKind::TrackEnd;
    if (mark)
      r.label = in[i].tag;  // a mark's "tag" is its section label
    else
      r.tag = *keel::parseMemTag(in[i].tag);
    r.allocatedAfter = mark ? 0 : allocated;  // marks carry no figures, as recorded
    r.reservedAfter = mark ? 0 : allocated + 1024;
    events.push_back(r);
  }
  auto m = std::make_shared<MemoryModel>();
  m->setEvents(std::move(events));
  return m;
}

uint64_t sum(const std::map<uint64_t, uint64_t>& blocks) {
  uint64_t s = 0;
  for (auto& [a, b] : blocks) s += b;
  return s;
}

}  // namespace

class MemoryViewTest : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    registerViewTypes();
    vmm_ = test::tempDir() + "/vmm.db";
    caching_ = test::tempDir() + "/caching.db";
    host_ = test::tempDir() + "/host.db";
    none_ = test::tempDir() + "/none.db";
    QVERIFY(test::recordFixture(vmm_, kOptions, "KEEL_ALLOCATOR=vmm"));
    QVERIFY(test::recordFixture(caching_, kOptions, "KEEL_ALLOCATOR=caching"));
    QVERIFY(test::recordFixture(host_, kOptions, "KEEL_ALLOCATOR=host"));
    QVERIFY(test::recordFixture(none_, "--steps 1 --seed 4"));
  }

  void showsTheRecordedEventCount_data() {
    QTest::addColumn<QString>("path");
    QTest::addColumn<QString>("kind");
    QTest::newRow("vmm") << vmm_ << "vmm";
    QTest::newRow("caching") << caching_ << "caching";
  }
  void showsTheRecordedEventCount() {
    QFETCH(QString, path);
    QFETCH(QString, kind);
    const Recording rec = Recording::open(path.toStdString());
    const std::vector<MemRecord> events = rec.memEvents({});
    QVERIFY(events.size() > 100);
    MemoryPtr memory = loadMemory(path);
    QVERIFY(memory);
    Selection sel;
    MemoryView view(&sel, Side::A);
    view.resize(1200, 700);
    view.setMemory(memory);
    QCOMPARE(size_t(view.eventCount()), events.size());
    QVERIFY(view.message().isEmpty());
    QVERIFY2(view.headerText().contains(QString("<b>%1</b> allocator events").arg(events.size())),
             qPrintable(view.headerText()));
    QVERIFY(view.headerText().contains(kind + " allocator"));
    QCOMPARE(QString::fromStdString(memory->allocatorKind()), kind);
    QVERIFY(view.hostNote().isEmpty());
    // Opens at the peak of allocated memory.
    uint64_t peak = 0;
    for (const MemRecord& e : events) peak = std::max(peak, e.allocatedAfter);
    QCOMPARE(memory->event(size_t(view.cursor())).allocatedAfter, peak);
    QAbstractItemModelTester tester(view.sectionModel(),
                                    QAbstractItemModelTester::FailureReportingMode::QtTest);
  }

  void scrubbingShowsTheBlockMapOfThatMoment_data() {
    QTest::addColumn<QString>("path");
    QTest::newRow("vmm") << vmm_;
    QTest::newRow("caching") << caching_;
  }
  void scrubbingShowsTheBlockMapOfThatMoment() {
    QFETCH(QString, path);
    const Recording rec = Recording::open(path.toStdString());
    const std::vector<MemRecord> events = rec.memEvents({});
    const size_t n = events.size();
    Selection sel;
    MemoryView view(&sel, Side::A);
    view.resize(1200, 700);
    view.show();
    QVERIFY(QTest::qWaitForWindowExposed(&view));
    view.setMemory(loadMemory(path));
    QCOMPARE(size_t(view.eventCount()), n);

    auto check = [&](size_t k) {
      QCOMPARE(view.cursor(), int64_t(k));
      const auto expected = replay(events, k);
      QCOMPARE(shown(view), expected);
      QCOMPARE(view.state().liveBytes, sum(expected));
      // The allocator's own figure after event k: the live blocks' rounded sizes.
      QCOMPARE(view.state().liveBytes, events[k].allocatedAfter);
      QVERIFY2(view.cursorText().contains("allocated " + QString::fromStdString(keel::formatBytes(
                                                             events[k].allocatedAfter))),
               qPrintable(view.cursorText()));
      QVERIFY(view.cursorText().startsWith(QString("Event %1 of %2: ").arg(k).arg(n)));
      // Every live block is drawn once, inside a segment.
      size_t drawn = 0;
      for (const MemPiece& p : view.layout().pieces)
        if (p.kind == MemPiece::Kind::Block) {
          ++drawn;
          QVERIFY(p.inSegment);
        }
      QCOMPARE(drawn, view.state().blocks.size());
      QVERIFY(view.mapCaption().contains(QString("at event %1").arg(k)));
    };
    for (size_t k : {size_t(0), n / 7, n / 3, n / 2, (2 * n) / 3, n - 2, n - 1}) {
      view.setCursor(int64_t(k));
      check(k);
    }
    // Keys on the view.
    view.setFocus();
    QTest::keyClick(&view, Qt::Key_Home);
    check(0);
    QTest::keyClick(&view, Qt::Key_Right);
    QTest::keyClick(&view, Qt::Key_Right);
    check(2);
    QTest::keyClick(&view, Qt::Key_PageDown);
    check(2 + std::max<size_t>(1, n / 20));
    QTest::keyClick(&view, Qt::Key_PageUp);
    QTest::keyClick(&view, Qt::Key_Left);
    check(1);
    QTest::keyClick(&view, Qt::Key_End);
    check(n - 1);
    // The slider.
    auto* slider = view.findChild<QSlider*>("memorySlider");
    QVERIFY(slider);
    QCOMPARE(slider->maximum(), int(n - 1));
    slider->setValue(int(n / 4));
    check(n / 4);
    // A click on the timeline.
    QSignalSpy moved(&view, &MemoryView::cursorChanged);
    const QPoint at = view.timelinePoint(int64_t(n / 2));
    QVERIFY(at.x() >= 0);
    QTest::mouseClick(view.timeline(), Qt::LeftButton, {}, at);
    check(n / 2);
    QCOMPARE(moved.count(), 1);
  }

  void blocksSayWhyTheyAreAlive() {
    MemoryPtr memory = loadMemory(vmm_);
    QVERIFY(memory);
    Selection sel;
    MemoryView view(&sel, Side::A);
    view.resize(1200, 700);
    view.setMemory(memory);
    // At the end of the run: parameters and optimizer state are alive, and say so.
    view.setCursor(view.eventCount() - 1);
    std::map<AliveReason, int> reasons;
    for (size_t i = 0; i < view.state().blocks.size(); ++i) {
      const MemBlock& b = view.state().blocks[i];
      const WhyAlive why = memory->whyAlive(b, view.cursor());
      reasons[why.reason]++;
      const MemRecord& a = memory->allocOf(b);
      if (a.tag == MemTag::Parameter) {
        QCOMPARE(why.text, std::string("parameter"));
        QVERIFY(view.blockToolTip(i).contains("<b>alive because</b>: parameter"));
      }
    }
    QVERIFY(reasons[AliveReason::Parameter] > 0);
    QVERIFY(reasons[AliveReason::OptimizerState] > 0);
    // Just before the first backward op of step 1 the forward ops' outputs are saved for it.
    const Recording rec = Recording::open(vmm_.toStdString());
    keel::storage::OpQuery q;
    q.step = 1;
    q.phase = keel::Phase::Backward;
    q.limit = 1;
    q.withTensors = false;
    const auto firstBackward = rec.ops(q);
    QCOMPARE(firstBackward.size(), size_t(1));
    const int64_t k = memory->lastEventBeforeOp(firstBackward[0].seq);
    QVERIFY(k > 0);
    view.setCursor(k);
    int saved = 0;
    for (size_t i = 0; i < view.state().blocks.size(); ++i) {
      const WhyAlive why = memory->whyAlive(view.state().blocks[i], k);
      if (why.reason != AliveReason::SavedForBackward) continue;
      ++saved;
      const MemOp* op = memory->op(why.opSeq);
      QVERIFY(op && op->phase == Phase::Forward && op->backwardSeq > firstBackward[0].seq - 1);
      const QString tip = view.blockToolTip(i);
      QVERIFY2(tip.contains("saved for backward (op #"), qPrintable(tip));
      QVERIFY(tip.contains("<b>tensor</b>: float32 ["));
      QVERIFY(tip.contains("<b>stack</b>:"));
    }
    QVERIFY(saved > 0);
    QVERIFY(view.histogramBuckets() > 0);
  }

  void selectingABlockSelectsItsOpAndBack() {
    MemoryPtr memory = loadMemory(caching_);
    Selection sel;
    MemoryView view(&sel, Side::A);
    view.resize(1200, 700);
    view.show();
    QVERIFY(QTest::qWaitForWindowExposed(&view));
    view.setMemory(memory);
    view.setScale(MemScale::Log);  // every block at least a few pixels wide
    // A block allocated by an op, clicked on the map.
    size_t pick = view.state().blocks.size();
    for (size_t i = 0; i < view.state().blocks.size(); ++i)
      if (memory->allocOf(view.state().blocks[i]).opSeq != 0 && view.blockPoint(i).x() >= 0) {
        pick = i;
        break;
      }
    QVERIFY(pick < view.state().blocks.size());
    const uint64_t seq = memory->allocOf(view.state().blocks[pick]).opSeq;
    const int64_t before = view.cursor();
    QSignalSpy clicked(&view, &MemoryView::blockClicked);
    QTest::mouseClick(view.blockMap(), Qt::LeftButton, {}, view.blockPoint(pick));
    QCOMPARE(sel.current(Side::A), std::optional<uint64_t>(seq));
    QCOMPARE(clicked.count(), 1);
    QCOMPARE(clicked[0][0].toULongLong(), seq);
    QCOMPARE(view.cursor(), before);  // its own selection does not move the cursor
    QVERIFY(!view.highlightedBlocks().empty());

    // An op selected elsewhere: the cursor goes to its last event and its blocks light up.
    uint64_t other = 0;
    for (size_t i = 0; i < memory->eventCount() && !other; ++i) {
      const MemRecord& e = memory->event(i);
      if (e.kind == MemEventKind::Alloc && e.opSeq && e.opSeq != seq && e.step == 2)
        other = e.opSeq;
    }
    QVERIFY(other);
    sel.select(Side::A, other);
    QCOMPARE(view.cursor(), int64_t(memory->opEvents(other)->second));
    QVERIFY(!view.highlightedBlocks().empty());
    for (size_t i : view.highlightedBlocks()) {
      const MemRecord& a = memory->allocOf(view.state().blocks[i]);
      const MemOp* op = memory->op(other);
      const bool holdsOutput = op && std::find(op->outputBuffers.begin(), op->outputBuffers.end(),
                                               a.bufferId) != op->outputBuffers.end();
      QVERIFY(a.opSeq == other || holdsOutput);
    }
    sel.clear();
    QVERIFY(view.highlightedBlocks().empty());
  }

  void sectionTableHasARowPerTrackedSection() {
    MemoryPtr memory = sectionsModel();
    QCOMPARE(memory->sections().size(), size_t(3));
    MemSectionModel table;
    QAbstractItemModelTester tester(&table, QAbstractItemModelTester::FailureReportingMode::QtTest);
    table.setMemory(memory);
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

  void hostAllocatorRecordingSaysItHasNoSegments() {
    MemoryPtr memory = loadMemory(host_);
    QVERIFY(memory);
    QVERIFY(memory->eventCount() > 0);
    QVERIFY(!memory->hasSegments());
    MemoryView view(nullptr, Side::A);
    view.resize(1000, 600);
    view.setMemory(memory);
    QVERIFY(view.message().isEmpty());
    QVERIFY(view.hostNote().contains("no segments"));
    QVERIFY(!view.findChild<QLabel*>("memoryHostNote")->isHidden());
    view.setCursor(view.eventCount() - 1);
    QCOMPARE(view.layout().blocksOutside, view.state().blocks.size());
    QVERIFY(view.mapCaption().contains("laid out by address with gaps elided"));
  }

  void recordingWithoutAllocatorEventsShowsAMessage() {
    MemoryPtr memory = loadMemory(none_);
    QVERIFY(memory);
    QCOMPARE(memory->eventCount(), size_t(0));
    MemoryView view(nullptr, Side::A);
    view.setMemory(memory);
    QVERIFY(view.message().contains("no allocator events"));
    QVERIFY(view.message().contains("--allocator"));
    QVERIFY(view.findChild<QLabel*>("memoryMessage")->isVisibleTo(&view));
    QCOMPARE(view.cursor(), int64_t(-1));
    view.setCursor(5);  // nothing to scrub: stays put, no crash
    QCOMPARE(view.cursor(), int64_t(-1));
    view.clear();
    QVERIFY(view.message().contains("No recording open"));
  }

  void damagedRecordingFailsWithAMessage() {
    const QString bad = test::tempDir() + "/bad.db";
    QFile f(bad);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("this is not a recording");
    f.close();
    RunSource src;
    QObject receiver;
    QString failed;
    bool memory = false;
    QObject::connect(&src, &RunSource::failed, &receiver, [&](QString m) { failed = m; });
    QObject::connect(&src, &RunSource::memoryLoaded, &receiver, [&](MemoryPtr) { memory = true; });
    src.open(bad);
    src.requestMemory();
    QVERIFY(QTest::qWaitFor([&] { return !failed.isEmpty(); }, 30000));
    QTest::qWait(50);
    QVERIFY(!memory);
  }

 private:
  QString vmm_, caching_, host_, none_;
};

QTEST_MAIN(MemoryViewTest)
#include "memory_view_test.moc"
