// The memory view on 1,000,000 allocator events (issue 14: memory_viz hides events past ~600k):
// building analysis::MemoryModel, opening a real MemoryView (offscreen, 1920x1080) on it, and
// laying out and painting the active-memory timeline for the whole run and for a selected range.
// The events are synthetic: 50 steps of a training-like pattern (activations allocated in forward
// and freed in backward, a small block leaked per step) over long-lived parameters.
#if __has_include("keel/views/memory_view.h")
#include <benchmark/benchmark.h>

#include <QApplication>
#include <QImage>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "keel/analysis/memory_model.h"
#include "keel/storage/reader.h"
#include "keel/views/memory_view.h"
#include "keel/views/selection.h"

namespace {

using keel::MemEventKind;
using keel::storage::MemRecord;

void ensureQt() {
  if (QApplication::instance()) return;
  qputenv("QT_QPA_PLATFORM", "offscreen");
  static int argc = 1;
  static char name[] = "keel_bench";
  static char* argv[] = {name, nullptr};
  new QApplication(argc, argv);  // never destroyed: one per process
}

// `n` events: 2,000 parameters, then steps of 20,000 events each.
std::vector<MemRecord> syntheticEvents(size_t n) {
  std::mt19937_64 rng(7);
  std::vector<MemRecord> ev;
  ev.reserve(n);
  uint64_t allocated = 0, reserved = 0, addr = 0x10000000;
  auto push = [&](MemEventKind kind, uint64_t address, uint64_t bytes, int64_t step) {
    MemRecord r;
    r.kind = kind;
    r.address = address;
    r.bytes = bytes;
    r.step = step;
    r.opSeq = ev.size() / 4 + 1;
    r.timeNs = int64_t(ev.size());
    if (kind == MemEventKind::Alloc) allocated += bytes;
    if (kind == MemEventKind::Free) allocated -= bytes;
    while (reserved < allocated) reserved += 20 << 20;
    r.allocatedAfter = allocated;
    r.reservedAfter = reserved;
    ev.push_back(r);
  };
  auto size = [&] { return uint64_t(512) << (rng() % 14); };  // 512 B .. 4 MiB
  for (int i = 0; i < 2000 && ev.size() < n; ++i, addr += 8 << 20)
    push(MemEventKind::Alloc, addr, size(), 0);
  for (int64_t step = 1; ev.size() < n; ++step) {
    std::vector<std::pair<uint64_t, uint64_t>> acts;
    const size_t stepEnd = std::min(n, ev.size() + 20000);
    while (ev.size() + acts.size() + 1 < stepEnd && acts.size() < 9000) {  // forward
      acts.emplace_back(addr, size());
      push(MemEventKind::Alloc, addr, acts.back().second, step);
      addr += 8 << 20;
    }
    push(MemEventKind::Alloc, addr, 4096, step);  // leaked
    addr += 8 << 20;
    while (!acts.empty() && ev.size() < stepEnd) {  // backward: temporaries and frees
      if (rng() % 4 == 0) {
        push(MemEventKind::Alloc, addr, size(), step);
        push(MemEventKind::Free, addr, ev.back().bytes, step);
        addr += 8 << 20;
      }
      push(MemEventKind::Free, acts.back().first, acts.back().second, step);
      acts.pop_back();
    }
  }
  ev.resize(n);
  return ev;
}

const std::shared_ptr<const keel::analysis::MemoryModel>& model1M() {
  static auto m = [] {
    auto p = std::make_shared<keel::analysis::MemoryModel>();
    p->setEvents(syntheticEvents(1000000));
    return std::shared_ptr<const keel::analysis::MemoryModel>(p);
  }();
  return m;
}

// A MemoryView at 1920x1080, shown (offscreen) and laid out, with no memory yet.
struct ShownMemoryView {
  keel::views::Selection sel;
  keel::views::MemoryView view{&sel, keel::views::Side::A};
  ShownMemoryView() {
    ensureQt();
    view.resize(1920, 1080);
    view.show();
    QApplication::processEvents();
  }
};

using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

// Replaying 1,000,000 events into a MemoryModel (checkpoints, peaks, sections).
void BM_MemoryModelBuild1M(benchmark::State& state) {
  const std::vector<MemRecord> events = syntheticEvents(1000000);
  for (auto _ : state) {
    std::vector<MemRecord> copy = events;
    const auto t = Clock::now();
    keel::analysis::MemoryModel m;
    m.setEvents(std::move(copy));
    state.SetIterationTime(seconds(t));
    benchmark::DoNotOptimize(m.peakAllocated());
  }
}
BENCHMARK(BM_MemoryModelBuild1M)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);

// Opening the memory view on the model (timeline plot of every event, the cursor's state at the
// peak) and painting it, active-memory timeline of the whole run included.
void BM_MemoryViewOpen1M(benchmark::State& state) {
  ensureQt();
  const auto& m = model1M();
  for (auto _ : state) {
    ShownMemoryView shown;
    keel::views::MemoryView& view = shown.view;
    const auto t = Clock::now();
    view.setMemory(m);
    QImage img(view.size(), QImage::Format_RGB32);
    view.render(&img);
    state.SetIterationTime(seconds(t));
    benchmark::DoNotOptimize(view.activeBands().columns.size());
  }
}
BENCHMARK(BM_MemoryViewOpen1M)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);

// The active-memory timeline alone: laying out the bands of range/1 of the run (whole run, then a
// selected tenth and hundredth) and painting the widget.
void BM_MemoryActiveTimeline1M(benchmark::State& state) {
  ensureQt();
  const auto& m = model1M();
  ShownMemoryView shown;
  keel::views::MemoryView& view = shown.view;
  view.setMemory(m);
  const int64_t n = int64_t(m->eventCount());
  const int64_t len = n / state.range(0);
  const int64_t first = (n - len) / 2;
  QWidget* w = view.activeMemory();
  double plotS = 0;
  for (auto _ : state) {
    view.setRange(0, n - 1);  // from elsewhere, so the range below is laid out anew
    const auto t = Clock::now();
    view.setRange(first, first + len - 1);  // replots the allocated/reserved plot too
    plotS += seconds(t);
    view.layoutActive();
    QImage img(w->size(), QImage::Format_RGB32);
    w->render(&img);
    state.SetIterationTime(seconds(t));
    benchmark::DoNotOptimize(view.activeBands().columns.size());
  }
  state.counters["plot_ms"] = 1000.0 * plotS / double(state.iterations());
  state.counters["events"] = double(len);
  state.counters["columns"] = double(view.activeBands().columns.size());
}
BENCHMARK(BM_MemoryActiveTimeline1M)
    ->Arg(1)
    ->Arg(10)
    ->Arg(100)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);

// The band layout alone (analysis::MemoryModel::bands, no Qt): 1,920 columns over range/1 of the
// run, sub-pixel blocks merged as the view merges them.
void BM_MemoryBands1M(benchmark::State& state) {
  const auto& m = model1M();
  const int64_t n = int64_t(m->eventCount());
  const int64_t len = n / state.range(0), first = (n - len) / 2;
  for (auto _ : state) {
    auto b = m->bands(first, first + len - 1, 1920, m->peakAllocated() / 900);
    benchmark::DoNotOptimize(b.columns.size());
  }
  state.counters["events"] = double(len);
}
BENCHMARK(BM_MemoryBands1M)->Arg(1)->Arg(10)->Arg(100)->Unit(benchmark::kMillisecond);

// A recording's memory: KEEL_BENCH_MEMORY_RECORDING names it (bench/torch_snapshot_import.sh sets
// it to the recording imported from a 2 GB, 5,000,000-event PyTorch snapshot). Reading its
// events, building the model, opening the view and painting it; then moving the cursor (the event
// slider and a click in the timeline) and selecting ranges, each with a repaint.
const char* recordingPath() {
  return std::getenv("KEEL_BENCH_MEMORY_RECORDING");
}

void BM_MemoryRecordingOpen(benchmark::State& state) {
  if (!recordingPath()) return state.SkipWithError("set KEEL_BENCH_MEMORY_RECORDING");
  ensureQt();
  for (auto _ : state) {
    const auto t = Clock::now();
    auto events = keel::storage::Recording::open(recordingPath()).memEvents({});
    const double readS = seconds(t);
    auto m = std::make_shared<keel::analysis::MemoryModel>();
    m->setEvents(std::move(events));
    const double modelS = seconds(t) - readS;
    ShownMemoryView shown;
    keel::views::MemoryView& view = shown.view;
    view.setMemory(m);
    QImage img(view.size(), QImage::Format_RGB32);
    view.render(&img);
    state.SetIterationTime(seconds(t));
    state.counters["events"] = double(m->eventCount());
    state.counters["read_ms"] = 1000 * readS;
    state.counters["model_ms"] = 1000 * modelS;
  }
}
BENCHMARK(BM_MemoryRecordingOpen)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);

// arg 0: the cursor moved to 20 places (state at that event: block map, sizes) and painted;
// arg N > 0: a range of 1/N of the run selected (timeline bands and plot) and painted.
void BM_MemoryRecordingInteract(benchmark::State& state) {
  if (!recordingPath()) return state.SkipWithError("set KEEL_BENCH_MEMORY_RECORDING");
  ensureQt();
  static const std::shared_ptr<const keel::analysis::MemoryModel> m = [] {
    auto p = std::make_shared<keel::analysis::MemoryModel>();
    p->setEvents(keel::storage::Recording::open(recordingPath()).memEvents({}));
    return std::shared_ptr<const keel::analysis::MemoryModel>(p);
  }();
  ShownMemoryView shown;
  keel::views::MemoryView& view = shown.view;
  view.setMemory(m);
  const int64_t n = int64_t(m->eventCount());
  std::mt19937_64 rng(3);
  for (auto _ : state) {
    const auto t = Clock::now();
    if (state.range(0) == 0) {
      view.setCursor(int64_t(rng() % uint64_t(n)));
    } else {
      const int64_t len = n / state.range(0), first = int64_t(rng() % uint64_t(n - len + 1));
      view.setRange(first, first + len - 1);
      view.layoutActive();
    }
    QImage img(view.size(), QImage::Format_RGB32);
    view.render(&img);
    state.SetIterationTime(seconds(t));
  }
  state.counters["events"] = double(n);
}
BENCHMARK(BM_MemoryRecordingInteract)
    ->Arg(0)
    ->Arg(1)
    ->Arg(100)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(20);

}  // namespace
#endif
