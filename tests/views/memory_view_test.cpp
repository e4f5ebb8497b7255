// The memory view on recordings made by the real keel binary (vmm and caching allocators with
// allocator events, the host allocator, and no allocator events): it shows the recorded event
// count, scrubbing (API, slider, keys, a click on the timeline) shows the block map of that moment
// (checked against a replay written here, and against the allocator's own allocatedAfter), block
// tooltips say why a block is alive, and a click on a block selects its op and back; the figures
// equal `keel memory stats` on the same recording; the active-memory bands, the cursor following
// the step shown, step labels that never overlap, free and unmapped in different colours; and the
// section table over a hand-made model (analysis::MemoryModel itself: tests/analysis/).
#include <QAbstractItemModelTester>
#include <QLabel>
#include <QSignalSpy>
#include <QSlider>
#include <QTabWidget>
#include <QTableWidget>
#include <QTextDocument>
#include <QtTest>
#include <cstring>
#include <map>
#include <tuple>

#include "keel/storage/reader.h"
#include "keel/views/memory_view.h"
#include "keel/views/run_source.h"
#include "keel/views/selection.h"
#include "memory_view_impl.h"  // the block map widget, to find where a piece is drawn
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
  return test::loadThroughRunSource(path, &RunSource::memoryLoaded,
                                    [](RunSource& src) { src.requestMemory(); });
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

// The rows of `keel memory stats`: label -> its values (one per column: peak, end, --event ...).
std::map<QString, QStringList> statsRows(const std::string& out) {
  std::map<QString, QStringList> rows;
  for (const QString& line : QString::fromStdString(out).split('\n')) {
    for (const char* label :
         {"allocated (bytes)", "reserved (bytes)", "cached free (bytes)", "cached free / reserved",
          "largest free block (bytes)", "free blocks", "fragmentation"}) {
      if (!line.startsWith(QLatin1String(label) + "  ")) continue;
      rows[label] = line.mid(int(std::strlen(label))).split(' ', Qt::SkipEmptyParts);
    }
  }
  return rows;
}

QString pct(double x) {
  return QString::number(100.0 * x, 'f', 1) + "%";
}

// A hand-made run of `steps` steps after an initialisation, `per` events each: every step
// allocates a growing block and frees it, and keeps one small block (a leak).
MemoryPtr stepsModel(int steps, int per) {
  std::vector<MemRecord> events;
  uint64_t allocated = 0, addr = 0x1000;
  std::vector<std::pair<uint64_t, uint64_t>> live;
  for (int st = 0; st <= steps; ++st)
    for (int i = 0; i < per; ++i) {
      MemRecord r;
      r.step = st;
      r.timeNs = int64_t(events.size() + 1);
      if (i % 2 == 0 || live.empty()) {
        r.kind = MemEventKind::Alloc;
        r.address = addr;
        r.bytes = 1024 * uint64_t(1 + i);
        addr += 0x100000;
        live.emplace_back(r.address, r.bytes);
        allocated += r.bytes;
      } else {
        r.kind = MemEventKind::Free;
        std::tie(r.address, r.bytes) = live.back();
        live.pop_back();
        allocated -= r.bytes;
      }
      r.allocatedAfter = r.reservedAfter = allocated;
      events.push_back(r);
    }
  auto m = std::make_shared<MemoryModel>();
  m->setEvents(std::move(events));
  return m;
}

// Appends an event of step `step` at the next time; with `allocated`, keeps that running total
// (alloc adds, free subtracts) as the event's allocated and reserved figures.
void addEvent(std::vector<MemRecord>& ev, MemEventKind k, uint64_t address, uint64_t bytes,
              uint64_t* allocated = nullptr, int64_t step = 1) {
  MemRecord r;
  r.kind = k;
  r.address = address;
  r.bytes = bytes;
  r.step = step;
  r.timeNs = int64_t(ev.size() + 1);
  if (allocated) {
    if (k == MemEventKind::Alloc) *allocated += bytes;
    if (k == MemEventKind::Free) *allocated -= bytes;
    r.allocatedAfter = r.reservedAfter = *allocated;
  }
  ev.push_back(r);
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

  void showsTheRecordedEventCount_data() { bothAllocators(); }
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
    // "allocated" and "reserved" in their timeline lines' colours: the key when the plot's legend
    // row gives way (a short dock).
    QVERIFY2(
        view.headerText().contains(
            "<a href='peak'>peak</a> <span style='color:#4c78a8'><b>allocated</b></span> ") &&
            view.headerText().contains("peak <span style='color:#e06c00'><b>reserved</b></span> "),
        qPrintable(view.headerText()));
    QVERIFY(memory->allocatorKind());
    QCOMPARE(QString::fromUtf8(keel::allocatorKindName(*memory->allocatorKind()).data()), kind);
    QVERIFY(view.hostNote().isEmpty());
    // Opens at the peak of allocated memory.
    uint64_t peak = 0;
    for (const MemRecord& e : events) peak = std::max(peak, e.allocatedAfter);
    QCOMPARE(memory->event(size_t(view.cursor())).allocatedAfter, peak);
    QAbstractItemModelTester tester(view.sectionModel(),
                                    QAbstractItemModelTester::FailureReportingMode::QtTest);
  }

  // Who holds the memory: the "Live by site" tab sums the blocks at the cursor by the op (or
  // stack frame) that allocated them, the most first, and follows the cursor; P and the header's
  // "peak" link go to the peak of allocated memory.
  void liveBySiteAndThePeakAreOneStepAway() {
    MemoryPtr memory = loadMemory(caching_);
    QVERIFY(memory);
    Selection sel;
    MemoryView view(&sel, Side::A);
    view.resize(1200, 700);
    view.show();
    view.setMemory(memory);
    auto* tabs = view.findChild<QTabWidget*>("memoryTabs");
    auto* sites = view.findChild<QTableWidget*>("memorySites");
    QVERIFY(tabs && sites);
    QCOMPARE(tabs->currentWidget(), sites);  // the first tab
    QCOMPARE(tabs->tabText(1), QString("Sizes"));
    QVERIFY(tabs->tabText(2).startsWith("Tracked sections"));
    tabs->setCurrentIndex(1);  // Sizes: the table waits
    QTest::keyClick(&view, Qt::Key_Home);
    tabs->setCurrentWidget(sites);
    QTest::keyClick(&view, Qt::Key_P);
    const int64_t peak = memory->peakEvent();
    QCOMPARE(view.cursor(), peak);  // it opens at the peak
    const auto by = memory->aliveBySite(memory->stateAt(peak));
    QVERIFY(by.size() >= 3);
    QCOMPARE(sites->rowCount(), int(by.size()));
    QCOMPARE(sites->item(0, 0)->text(), QString::fromStdString(by[0].site));
    QCOMPARE(sites->item(0, 2)->text(), QString::number(by[0].blocks));
    uint64_t sum = 0;
    for (const auto& b : by) sum += b.bytes;
    QCOMPARE(sum, memory->stateAt(peak).liveBytes);
    view.setFocus();
    QTest::keyClick(&view, Qt::Key_Home);
    QCOMPARE(view.cursor(), int64_t(0));
    QCOMPARE(sites->rowCount(), int(memory->aliveBySite(memory->stateAt(0)).size()));
    QTest::keyClick(&view, Qt::Key_P);
    QCOMPARE(view.cursor(), peak);
    QCOMPARE(sites->item(0, 0)->text(), QString::fromStdString(by[0].site));
    QTest::keyClick(&view, Qt::Key_End);
    auto* header = view.findChild<QLabel*>("memoryHeader");
    QVERIFY(header->text().contains("<a href='peak'>peak</a>"));
    emit header->linkActivated("peak");
    QCOMPARE(view.cursor(), peak);
  }

  void scrubbingShowsTheBlockMapOfThatMoment_data() { bothAllocators(); }
  void scrubbingShowsTheBlockMapOfThatMoment() {
    QFETCH(QString, path);
    const Recording rec = Recording::open(path.toStdString());
    const std::vector<MemRecord> events = rec.memEvents({});
    const size_t n = events.size();
    Selection sel;
    MemoryView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {1200, 700}));
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
    // With more events than pixels, a pixel stands for a couple of events: the one under it.
    QVERIFY2(std::abs(view.cursor() - int64_t(n / 2)) <= 2,
             qPrintable(QString::number(view.cursor())));
    check(size_t(view.cursor()));
    QCOMPARE(moved.count(), 1);
  }

  // `keel memory stats` on a recording prints the figures the studio shows for it: cached free
  // and fragmentation, at the peak and at any event, the same numbers through the real binary.
  void figuresEqualTheCliForTheSameRecording_data() { bothAllocators(); }
  void figuresEqualTheCliForTheSameRecording() {
    QFETCH(QString, path);
    MemoryPtr memory = loadMemory(path);
    QVERIFY(memory);
    const int64_t k = int64_t(memory->eventCount() * 2 / 3);
    std::string out;
    QCOMPARE(test::runKeel("memory stats '" + path.toStdString() + "' --event " + std::to_string(k),
                           &out),
             0);
    auto rows = statsRows(out);
    QCOMPARE(rows.size(), size_t(7));
    Selection sel;
    MemoryView view(&sel, Side::A);
    view.resize(1200, 700);
    view.setMemory(memory);
    view.setCursor(k);
    const MemFigures peak = view.peakFigures(), at = view.figures();
    QCOMPARE(peak.event, memory->peakEvent());
    QCOMPARE(at.event, k);
    // Columns: peak, end, event k.
    for (int c : {0, 2}) {
      const MemFigures& f = c == 0 ? peak : at;
      QCOMPARE(rows["allocated (bytes)"][c], QString::number(f.allocated));
      QCOMPARE(rows["reserved (bytes)"][c], QString::number(f.reserved));
      QCOMPARE(rows["cached free (bytes)"][c], QString::number(f.cachedFree));
      QCOMPARE(rows["cached free / reserved"][c], pct(f.cachedShare()));
      QCOMPARE(rows["largest free block (bytes)"][c], QString::number(f.largestFree));
      QCOMPARE(rows["free blocks"][c], QString::number(f.freeBlocks));
      QCOMPARE(rows["fragmentation"][c], pct(f.fragmentation()));
    }
    // The allocator's figures, and the replayed free blocks add up to reserved - allocated.
    QCOMPARE(at.allocated, memory->event(size_t(k)).allocatedAfter);
    QCOMPARE(at.reserved, memory->event(size_t(k)).reservedAfter);
    uint64_t freeBytes = 0;
    for (const MemPiece& p : view.layout().pieces)
      if (p.kind == MemPiece::Kind::Free) freeBytes += p.bytes;
    QCOMPARE(freeBytes, at.cachedFree);
    QVERIFY(peak.largestFree > 0 && peak.largestFree <= peak.cachedFree);
    // Both figures are shown, named for what they are, with these numbers.
    auto bytes = [](uint64_t b) { return QString::fromStdString(keel::formatBytes(b)); };
    const QString h = view.headerText();
    QVERIFY2(h.contains(QString("cached free %1 (%2 of reserved)")
                            .arg(bytes(peak.cachedFree), pct(peak.cachedShare()))),
             qPrintable(h));
    QVERIFY2(h.contains(QString("largest free block %1").arg(bytes(peak.largestFree))),
             qPrintable(h));
    QVERIFY2(h.contains(QString("fragmentation %1").arg(pct(peak.fragmentation()))), qPrintable(h));
    const QString c = view.mapCaption();
    QVERIFY2(c.contains(QString("cached free %1 (%2 of reserved)")
                            .arg(bytes(at.cachedFree), pct(at.cachedShare()))),
             qPrintable(c));
    QVERIFY2(c.contains(QString("largest free block %1").arg(bytes(at.largestFree))),
             qPrintable(c));
    QVERIFY2(c.contains(QString("fragmentation %1").arg(pct(at.fragmentation()))), qPrintable(c));
  }

  // The active-memory timeline draws a band for every live allocation (its stack's top is the
  // live bytes), and a band's tooltip names the allocation's op.
  void activeMemoryDrawsABandPerLiveAllocation() {
    MemoryPtr memory = loadMemory(caching_);
    QVERIFY(memory);
    Selection sel;
    MemoryView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {1200, 700}));
    view.setMemory(memory);
    view.layoutActive();
    const MemBands& b = view.activeBands();
    QVERIFY(!b.columns.empty());
    QCOMPARE(b.first, int64_t(0));
    QCOMPARE(b.last, view.eventCount() - 1);
    QVERIFY(b.columns.size() <= size_t(view.activeMemory()->width()));
    for (const MemBandColumn& c : b.columns) {
      const MemState st = memory->stateAt(c.event);
      QCOMPARE(c.total, st.liveBytes);
      uint64_t blocks = 0;
      for (const MemBandSlice& s : c.slices) blocks += s.blocks;
      QCOMPARE(blocks, uint64_t(st.blocks.size()));
    }
    // The peak's column: its largest band, hovered, is that block's allocation.
    auto col = std::find_if(b.columns.begin(), b.columns.end(), [&](const MemBandColumn& c) {
      return c.firstEvent <= memory->peakEvent() && memory->peakEvent() <= c.lastEvent;
    });
    QVERIFY(col != b.columns.end());
    QCOMPARE(col->event, memory->peakEvent());
    const MemBandSlice big = *std::max_element(
        col->slices.begin(), col->slices.end(),
        [](const MemBandSlice& x, const MemBandSlice& y) { return x.bytes < y.bytes; });
    QVERIFY(big.allocEvent != kMergedBands);
    const QPoint at = view.activePoint(col->event, big.base + big.bytes / 2);
    const QImage img = view.activeMemory()->grab().toImage();
    QVERIFY(img.pixelColor(at) != view.activeMemory()->palette().base().color());
    const QString tip = view.activeToolTip(at);
    QVERIFY2(tip.contains(QString("allocated at event %1").arg(big.allocEvent)), qPrintable(tip));
    QVERIFY2(tip.contains("<b>op</b>"), qPrintable(tip));
    QVERIFY2(tip.contains("<b>stack</b>"), qPrintable(tip));  // recorded with --stacks
    // A range selection replays only that range.
    const int64_t lo = memory->peakEvent() - 20, hi = memory->peakEvent() + 20;
    view.setRange(lo, hi);
    view.layoutActive();
    QCOMPARE(view.range(), std::make_pair(lo, hi));
    QCOMPARE(view.activeBands().first, lo);
    QCOMPARE(view.activeBands().last, hi);
    QCOMPARE(view.activeBands().columns.size(), size_t(41));
  }

  // The cursor follows the step the studio shows: to that step's peak, unless it is there already;
  // a step asked for before the model came applies when it comes.
  void cursorFollowsShowStep() {
    MemoryPtr memory = loadMemory(caching_);
    QVERIFY(memory);
    auto peakOf = [&](int64_t step) {
      int64_t best = -1;
      for (size_t i = 0; i < memory->eventCount(); ++i)
        if (memory->event(i).step == step &&
            (best < 0 || memory->allocatedAfter(i) > memory->allocatedAfter(size_t(best))))
          best = int64_t(i);
      return best;
    };
    Selection sel;
    MemoryView view(&sel, Side::A);
    view.resize(1200, 700);
    view.showStep(1);
    view.setMemory(memory);
    QCOMPARE(view.cursor(), peakOf(1));
    view.showStep(2);
    QCOMPARE(view.cursor(), peakOf(2));
    QVERIFY(peakOf(2) != peakOf(1));
    view.showStep(0);
    QCOMPARE(view.cursor(), peakOf(0));
    // Already in the step: the cursor stays.
    const int64_t inStep2 = peakOf(2) + 1;
    QCOMPARE(memory->event(size_t(inStep2)).step, int64_t(2));
    view.setCursor(inStep2);
    view.showStep(2);
    QCOMPARE(view.cursor(), inStep2);
  }

  // Step labels on the timeline never overlap, at 25 steps in a narrow and a wide window, and
  // zooming in shows the labels that did not fit.
  void stepLabelsDoNotOverlapAt25Steps() {
    MemoryPtr memory = stepsModel(25, 40);
    QCOMPARE(memory->stepStarts().size(), size_t(26));
    Selection sel;
    MemoryView view(&sel, Side::A);
    view.show();
    QVERIFY(QTest::qWaitForWindowExposed(&view));
    view.setMemory(memory);
    for (QSize size : {QSize(700, 600), QSize(1366, 500), QSize(1900, 700)}) {
      view.resize(size);
      QCoreApplication::processEvents();
      view.setRange(0, view.eventCount() - 1);
      const QVector<QRect> rects = view.stepLabelRects();
      QVERIFY2(rects.size() >= 4, qPrintable(QString::number(rects.size())));
      const QRect plot = view.timeline()->rect();
      for (int i = 0; i < rects.size(); ++i) {
        QVERIFY(plot.contains(rects[i]));
        for (int j = i + 1; j < rects.size(); ++j)
          QVERIFY2(!rects[i].intersects(rects[j]),
                   qPrintable(QString("labels %1 and %2 overlap at %3x%4")
                                  .arg(view.stepLabelTexts()[i], view.stepLabelTexts()[j])
                                  .arg(size.width())
                                  .arg(size.height())));
      }
    }
    // Zoomed to three steps, each of them is labelled.
    view.setRange(40 * 10, 40 * 13 - 1);
    const QStringList shown = view.stepLabelTexts();
    for (const char* label : {"step 10", "step 11", "step 12"})
      QVERIFY2(shown.contains(label), qPrintable(shown.join(", ")));
  }

  // The state after the last event is drawn (it had no width: a 3-event PyTorch snapshot's
  // 16 MiB peak, named in the header, never showed), and the event axis has no tick between two
  // events (it read 0, 0.5, 1, 1.5, 2).
  void theLastEventsStateIsDrawnAndTicksAreWholeEvents() {
    constexpr uint64_t MiB = 1 << 20;
    std::vector<MemRecord> ev;
    uint64_t allocated = 0;
    addEvent(ev, MemEventKind::Map, 0, 20 * MiB);
    addEvent(ev, MemEventKind::Alloc, 0, 8 * MiB, &allocated);
    addEvent(ev, MemEventKind::Alloc, 8 * MiB, 8 * MiB, &allocated);
    auto m = std::make_shared<MemoryModel>();
    m->setEvents(std::move(ev));
    Selection sel;
    MemoryView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {1200, 700}));
    view.setMemory(m);
    auto* plot = static_cast<QCustomPlot*>(view.timeline());
    plot->replot();
    QCPGraph* allocatedLine = nullptr;
    for (int i = 0; i < plot->graphCount(); ++i)
      if (plot->graph(i)->name() == "allocated") allocatedLine = plot->graph(i);
    QVERIFY(allocatedLine);
    const auto last = allocatedLine->data()->constEnd() - 1;
    QCOMPARE(last->key, 3.0);  // past the last event (2), to the plot's edge
    QCOMPARE(last->value, 16.0);
    QVERIFY(plot->xAxis->range().contains(2.25));  // drawn where the plot shows it
    const QVector<double> ticks = plot->xAxis->tickVector();
    QVERIFY(!ticks.isEmpty());
    for (double t : ticks) QCOMPARE(t, std::round(t));
  }

  // A block outside ops with the stack that allocated it (every block of an imported PyTorch
  // snapshot) is coloured by that stack, so two call sites differ (all were one grey); one with
  // neither op nor stack keeps the outside-ops grey.
  void blocksOutsideOpsAreColouredByTheirStack() {
    std::vector<MemRecord> ev;
    for (int64_t stack : {0, 1, -1}) {
      addEvent(ev, MemEventKind::Alloc, uint64_t(stack + 2) << 20, 1 << 20);
      ev.back().stackId = stack;
    }
    auto m = std::make_shared<MemoryModel>();
    m->setEvents(std::move(ev));
    auto colour = [&](uint32_t k) {
      return memory_detail::ownerColor(*m, MemBlock{m->event(k).address, m->event(k).bytes, k}, {});
    };
    QVERIFY(colour(0) != colour(1));
    QVERIFY(colour(0) != memory_detail::kOutsideOps);
    QVERIFY(colour(1) != memory_detail::kOutsideOps);
    QCOMPARE(colour(2), memory_detail::kOutsideOps);
  }

  // In a short dock (a 1366x768 screen's: about 265 pixels) no caption loses a line, however
  // narrow the pane: the block map's caption and the cursor line are as tall as their wrapped text
  // (they were fixed at three and two lines, and the rest was cut off); and the timeline's axis
  // labels are short enough for its height, full again in a tall one.
  void shortDockKeepsEveryCaptionLineAndShortAxisLabels() {
    MemoryPtr memory = stepsModel(25, 40);
    Selection sel;
    MemoryView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {1366, 265}));
    view.setMemory(memory);
    view.setCursor(view.eventCount() / 2);
    auto* plot = static_cast<QCustomPlot*>(view.timeline());
    for (QSize size : {QSize(1366, 265), QSize(900, 265), QSize(1920, 420)}) {
      view.resize(size);
      QCoreApplication::processEvents();
      for (const char* name : {"memoryMapCaption", "memoryCursor"}) {
        auto* label = view.findChild<QLabel*>(name);
        QVERIFY(label && label->isVisible());
        QTextDocument doc;
        doc.setHtml(label->text());
        const QRect need =
            label->fontMetrics().boundingRect(QRect(0, 0, label->contentsRect().width(), 100000),
                                              Qt::TextWordWrap, doc.toPlainText());
        QVERIFY2(label->contentsRect().height() >= need.height(),
                 qPrintable(QString("%1 at %2x%3: %4 px for %5 px of text")
                                .arg(name)
                                .arg(size.width())
                                .arg(size.height())
                                .arg(label->contentsRect().height())
                                .arg(need.height())));
      }
      const bool tall = size.height() >= 400;
      QCOMPARE(plot->yAxis->label().startsWith("bytes ("), tall);
      QCOMPARE(plot->yAxis2->label(), tall ? QString("cached free %") : QString("free %"));
    }
  }

  // Free space and unmapped chunks are drawn in clearly different colours (they mean opposite
  // things: reusable memory, and address space with no memory behind it).
  void freeAndUnmappedLookDifferent() {
    constexpr uint64_t MiB = 1 << 20;
    std::vector<MemRecord> ev;
    auto add = [&](MemEventKind k, uint64_t a, uint64_t b) { addEvent(ev, k, a, b); };
    add(MemEventKind::Map, 0, 2 * MiB);
    add(MemEventKind::Map, 2 * MiB, 2 * MiB);
    add(MemEventKind::Map, 4 * MiB, 2 * MiB);
    add(MemEventKind::Alloc, 0, MiB);
    add(MemEventKind::Unmap, 2 * MiB, 2 * MiB);
    auto m = std::make_shared<MemoryModel>();
    m->setEvents(std::move(ev));
    Selection sel;
    MemoryView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {1200, 700}));
    view.setMemory(m);
    view.setCursor(4);
    auto* map = dynamic_cast<memory_detail::BlockMap*>(view.blockMap());
    QVERIFY(map);
    const QImage img = map->grab().toImage();
    auto colourOf = [&](MemPiece::Kind kind) {
      for (const MemPiece& p : view.layout().pieces) {
        if (p.kind != kind) continue;
        QColor c;
        map->forEachRect(map->geo(), p, [&](const QRectF& r, bool first) {
          if (first) c = img.pixelColor(r.center().toPoint() + QPoint(1, 0));
        });
        return c;
      }
      return QColor();
    };
    const QColor free = colourOf(MemPiece::Kind::Free),
                 unmapped = colourOf(MemPiece::Kind::Unmapped);
    QVERIFY(free.isValid() && unmapped.isValid());
    const int distance = std::abs(free.red() - unmapped.red()) +
                         std::abs(free.green() - unmapped.green()) +
                         std::abs(free.blue() - unmapped.blue());
    QVERIFY2(distance > 200, qPrintable(free.name() + " vs " + unmapped.name()));
    QVERIFY(free.green() > free.red());  // free is green
  }

  // A run that ran out of memory opens where the allocator refused the request: the header
  // says so first, the cursor is on it, and its event reads as a refused request (not "oom 4 MiB
  // at 0x0"); the first refusal when there are several.
  void aRefusedRequestIsWhereTheViewOpens() {
    constexpr uint64_t MiB = 1 << 20;
    std::vector<MemRecord> ev;
    uint64_t allocated = 0;
    auto add = [&](MemEventKind k, uint64_t a, uint64_t b, int64_t step) {
      addEvent(ev, k, a, b, &allocated, step);
    };
    add(MemEventKind::Alloc, 0x100000, 3 * MiB, 1);
    add(MemEventKind::Alloc, 0x800000, 2 * MiB, 1);  // the peak
    add(MemEventKind::Free, 0x800000, 2 * MiB, 1);
    add(MemEventKind::Oom, 0, 4 * MiB, 1);
    add(MemEventKind::Oom, 0, 8 * MiB, 1);
    auto m = std::make_shared<MemoryModel>();
    m->setEvents(std::move(ev));
    Selection sel;
    MemoryView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {1200, 700}));
    view.setMemory(m);
    QCOMPARE(view.cursor(), qint64(3));
    QVERIFY2(view.headerText().startsWith("<span style='color:#8b0000'><b>Out of memory at event "
                                          "3: 4.00 MiB requested in step 1 and refused</b>"),
             qPrintable(view.headerText()));
    QVERIFY2(view.cursorText().startsWith("Event 3 of 5: out of memory: 4.00 MiB requested and "
                                          "refused · outside ops · step 1"),
             qPrintable(view.cursorText()));
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
    // The caption names the largest live block and why it is alive.
    const auto largest =
        std::max_element(view.state().blocks.begin(), view.state().blocks.end(),
                         [](const MemBlock& x, const MemBlock& y) { return x.bytes < y.bytes; });
    const QString why =
        QString::fromStdString(memory->whyAlive(*largest, view.cursor()).text).toHtmlEscaped();
    QVERIFY2(view.mapCaption().contains("<br>largest live block " +
                                        QString::fromStdString(keel::formatBytes(largest->bytes)) +
                                        " (") &&
                 view.mapCaption().contains("; " + why + ")"),
             qPrintable(view.mapCaption()));
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

  // A recording from --step-range's first step opens with what was live then (Note [A step
  // range's first step]): its parameters are blocks from the start, which say where they came
  // from, and the timeline's first event says so too.
  void aStepRangeRecordingShowsWhatWasLiveAtItsStart() {
    const QString sr = test::tempDir() + "/step-range.db";
    QVERIFY(test::recordFixture(sr, "--steps 2 --seed 4 --allocator --step-range 2:2",
                                "KEEL_ALLOCATOR=vmm"));
    MemoryPtr memory = loadMemory(sr);
    QVERIFY(memory);
    Selection sel;
    MemoryView view(&sel, Side::A);
    view.resize(1200, 700);
    view.setMemory(memory);
    view.setCursor(0);
    QVERIFY2(view.cursorText().contains("live before the recording began"),
             qPrintable(view.cursorText()));
    view.setCursor(view.eventCount() - 1);
    int parameters = 0;
    for (size_t i = 0; i < view.state().blocks.size(); ++i) {
      const MemRecord& a = memory->allocOf(view.state().blocks[i]);
      if (a.tag != MemTag::Parameter) continue;
      ++parameters;
      const QString tip = view.blockToolTip(i);
      QVERIFY2(tip.contains("allocated before the recording began (live at step 2, its first)"),
               qPrintable(tip));
      QVERIFY2(tip.contains("<b>alive because</b>: parameter"), qPrintable(tip));
    }
    QVERIFY(parameters > 0);
  }

  void selectingABlockSelectsItsOpAndBack() {
    MemoryPtr memory = loadMemory(caching_);
    Selection sel;
    MemoryView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {1200, 700}));
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
    // The leak's columns come right after the name (they were past a horizontal scroll bar).
    QCOMPARE(table.headerData(MemSectionModel::Alive, Qt::Horizontal).toString(),
             QString("Alive at end"));
    QCOMPARE(int(MemSectionModel::Alive), 1);
    QCOMPARE(table.headerData(MemSectionModel::AliveOps, Qt::Horizontal).toString(),
             QString("Allocated by"));
    {  // the tab names its count (the third tab since "Live by site" came first)
      Selection sel;
      MemoryView view(&sel, Side::A);
      view.setMemory(memory);
      QCOMPARE(view.findChild<QTabWidget*>("memoryTabs")->tabText(2),
               QString("Tracked sections (3)"));
    }
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
  // Data rows: the recording of each allocator (column "path") and its name ("kind").
  void bothAllocators() {
    QTest::addColumn<QString>("path");
    QTest::addColumn<QString>("kind");
    QTest::newRow("vmm") << vmm_ << "vmm";
    QTest::newRow("caching") << caching_ << "caching";
  }

  QString vmm_, caching_, host_, none_;
};

QTEST_MAIN(MemoryViewTest)
#include "memory_view_test.moc"
