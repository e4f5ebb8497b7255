// `keel import torch-memory SNAPSHOT -o OUT.db [--device N]`: a PyTorch CUDA memory snapshot
// (torch.cuda.memory._dump_snapshot()'s pickle) as a Keel recording, read with the restricted
// unpickler (Note [Restricted unpickler], Note [Torch memory snapshots] in storage/).
#include <chrono>
#include <cstdio>
#include <memory>

#include "cli_common.h"
#include "keel/base/output_path.h"
#include "keel/base/text.h"
#include "keel/storage/torch_memory.h"

namespace keel::cli {

namespace {

struct ImportArgs {
  std::string snapshot, output;
  int64_t device = 0;
};

int runTorchMemory(const ImportArgs& a) {
  checkOutputPath("-o", a.output, {{"the snapshot", a.snapshot}});
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  storage::TorchMemoryReadOptions o;
  o.device = int(a.device);
  const storage::TorchMemorySnapshot snap = storage::readTorchMemorySnapshot(a.snapshot, o);
  const auto t1 = Clock::now();
  OutputLock lock(a.output);
  ReplaceOnCommit file(a.output);
  const storage::TorchMemoryWritten w = storage::writeTorchMemoryRecording(
      snap, file.path(), std::string("torch memory snapshot, keel ") + KEEL_VERSION, a.snapshot);
  file.commit();
  const auto t2 = Clock::now();
  auto secs = [](auto d) { return std::chrono::duration<double>(d).count(); };
  size_t startSegments = 0;
  for (const auto& e : snap.initial) startSegments += e.kind == MemEventKind::Reserve;
  std::printf(
      "imported %s: device cuda:%d; when its trace starts, %zu segments and %zu live blocks; %llu "
      "trace entries (%zu change memory); %zu distinct stacks\n",
      a.snapshot.c_str(), snap.device, startSegments, snap.initial.size() - startSegments,
      static_cast<unsigned long long>(snap.traceEntries), snap.trace.size(), snap.stacks.size());
  std::printf(
      "wrote %s: %llu allocator events; peak allocated %s, peak reserved %s (read %.2f s, "
      "write %.2f s)\n",
      a.output.c_str(), static_cast<unsigned long long>(w.events),
      formatBytes(w.peakAllocated).c_str(), formatBytes(w.peakReserved).c_str(), secs(t1 - t0),
      secs(t2 - t1));
  return 0;
}

}  // namespace

Command addImportCommand(CLI::App& root) {
  auto a = std::make_shared<ImportArgs>();
  CLI::App* c = root.add_subcommand("import", "turn another tool's file into a Keel recording");
  c->require_subcommand(1);
  CLI::App* tm = c->add_subcommand(
      "torch-memory",
      "a PyTorch CUDA memory snapshot (torch.cuda.memory._dump_snapshot) as a recording of its "
      "allocator events, for `keel memory` and the studio's memory view");
  tm->add_option("snapshot", a->snapshot, "the snapshot (a pickle; read without running any of it)")
      ->required();
  tm->add_option("-o,--output", a->output, "the recording to write (.db)")->required();
  tm->add_option("--device", a->device, "the CUDA device whose memory to import")
      ->check(wholeNumber(0, 65535))
      ->capture_default_str();
  Command cmd{c, nullptr};
  cmd.run = [a, tm] {
    return tm->parsed() ? runTorchMemory(*a) : fail("import: choose torch-memory");
  };
  return cmd;
}

}  // namespace keel::cli
