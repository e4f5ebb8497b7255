// Keel Studio responsiveness (issue goal: open a 100,000-op recording and show its first step in
// <= 1 s): a recording of 20 steps x 5,000 ops (a transformer-like op stream with module scopes,
// forward and backward, tensors linked producer -> consumer) is written once; the benchmark opens
// it in a real MainWindow (offscreen) and stops the clock when the summary, the step's ops, the op
// table and the collapsed graph layout are all in.
#include <benchmark/benchmark.h>

#if __has_include("main_window.h")
#include <unistd.h>

#include <QApplication>
#include <QElapsedTimer>
#include <QEventLoop>
#include <QStandardPaths>
#include <QTimer>
#include <filesystem>
#include <memory>
#include <string>

#include "bench_recording.h"
#include "keel/storage/writer.h"
#include "main_window.h"

namespace {

namespace ks = keel::storage;

QApplication& app() {
  static int argc = 1;
  static char name[] = "keel_bench";
  static char* argv[] = {name, nullptr};
  static std::unique_ptr<QApplication> a = [] {
    qputenv("QT_QPA_PLATFORM", "offscreen");
    QStandardPaths::setTestModeEnabled(true);
    return std::make_unique<QApplication>(argc, argv);
  }();
  return *a;
}

// Step `step` of a 4-layer-per-group transformer-like stream: ops read the previous op's output
// and a parameter; backward ops mirror forward ops with forwardSeq set.
void writeStep(ks::Writer& w, int64_t step, int ops, uint64_t& seq) {
  static const char* kNames[] = {"layer_norm", "matmul", "reshape", "softmax", "matmul", "add",
                                 "layer_norm", "matmul", "silu",    "matmul",  "add",    "mul"};
  w.writeStep({step, step * 1000000, 0, 0});
  const int fwd = ops / 2;
  const uint64_t first = seq;
  for (int i = 0; i < ops; ++i) {
    ks::OpRecord o;
    o.seq = seq++;
    o.step = step;
    const bool backward = i >= fwd;
    const int k = backward ? ops - 1 - i : i;
    o.phase = backward ? keel::Phase::Backward : keel::Phase::Forward;
    o.name = std::string(kNames[k % 12]) + (backward ? "_backward" : "");
    o.scope = "blocks." + std::to_string(k / 120) + ((k % 12) < 6 ? ".attn" : ".mlp");
    o.beginNs = int64_t(o.seq) * 1000;
    o.endNs = o.beginNs + 500 + (k % 7) * 100;
    o.forwardSeq = backward ? first + uint64_t(k) : 0;
    ks::TensorRecord in;
    in.role = ks::Role::Input;
    in.tensorId = o.seq - 1;
    in.version = 0;
    in.shape = {8, 64, 128};
    in.dtype = "float32";
    in.device = "cpu";
    in.bytes = 8 * 64 * 128 * 4;
    ks::TensorRecord out = in;
    out.role = ks::Role::Output;
    out.tensorId = o.seq;
    out.md5 = "00112233445566778899aabbccddeeff";
    o.tensors = {in, out};
    w.writeOp(o);
  }
  w.writeStep({step, step * 1000000, step * 1000000 + 900000, 2.0 - 0.01 * double(step)});
  w.commit();
}

void BM_StudioOpenRecording(benchmark::State& state) {
  app();
  const int steps = 20, perStep = int(state.range(0)) / steps;
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("keel_bench_studio_" + std::to_string(::getpid()) + ".db"))
                               .string();
  {
    auto w = ks::Writer::create(path, keel::bench::benchRunInfo());
    uint64_t seq = 1;
    for (int s = 1; s <= steps; ++s) writeStep(*w, s, perStep, seq);
    w->close();
  }
  for (auto _ : state) {
    keel::studio::MainWindow win;
    win.resize(1600, 1000);
    win.show();
    QEventLoop loop;
    QElapsedTimer t;
    t.start();
    win.openRecording(QString::fromStdString(path));
    QTimer::singleShot(0, &win, [&] { win.whenIdle([&] { loop.quit(); }); });
    loop.exec();
    state.SetIterationTime(double(t.nsecsElapsed()) * 1e-9);
    if (!win.currentStep() || win.currentStep()->ops.size() != size_t(perStep))
      state.SkipWithError("the first step did not load");
  }
  for (const char* s : {"", "-wal", "-shm"}) std::filesystem::remove(path + s);
}
BENCHMARK(BM_StudioOpenRecording)
    ->Arg(100000)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(3);

}  // namespace
#endif
