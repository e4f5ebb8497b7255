// `keel import torch-memory SNAPSHOT -o OUT.db [--device N]`: a PyTorch CUDA memory snapshot
// (torch.cuda.memory._dump_snapshot()'s pickle) as a Keel recording, read with the restricted
// unpickler (Note [Restricted unpickler], Note [Torch memory snapshots] in storage/).
#include <cstdio>
#include <memory>

#include "cli_common.h"
#include "keel/base/text.h"
#include "keel/storage/torch_memory.h"

namespace keel::cli {

namespace {

struct ImportArgs {
  std::string snapshot, output;
  int64_t device = 0;
};

int runTorchMemory(const ImportArgs& a) {
  storage::TorchMemoryImportOptions o;
  o.read.device = int(a.device);
  o.engineVersion = std::string("torch memory snapshot, keel ") + KEEL_VERSION;
  const storage::TorchMemoryImported r =
      storage::importTorchMemorySnapshot(a.snapshot, a.output, o);
  auto n = [](uint64_t v, const char* one, const char* many) { return countText(v, one, many); };
  if (r.traceEntries == 0)  // PyTorch 1.13's snapshot, or one taken without a history: no trace
    std::printf("imported %s: device cuda:%d; at the snapshot, %s and %s (no trace); %s\n",
                a.snapshot.c_str(), r.device, n(r.segmentsAtStart, "segment", "segments").c_str(),
                n(r.blocksAtStart, "live block", "live blocks").c_str(),
                n(r.stacks, "distinct stack", "distinct stacks").c_str());
  else
    std::printf(
        "imported %s: device cuda:%d; when its trace starts, %s and %s; %s (%llu change memory); "
        "%s\n",
        a.snapshot.c_str(), r.device, n(r.segmentsAtStart, "segment", "segments").c_str(),
        n(r.blocksAtStart, "live block", "live blocks").c_str(),
        n(r.traceEntries, "trace entry", "trace entries").c_str(),
        static_cast<unsigned long long>(r.traceEvents),
        n(r.stacks, "distinct stack", "distinct stacks").c_str());
  if (r.ooms > 0)  // what the snapshot was most likely taken for
    std::printf("%s refused (out of memory): keel memory stats names the first\n",
                n(r.ooms, "request", "requests").c_str());
  std::printf("wrote %s: %s; peak allocated %s, peak reserved %s (read %.2f s, write %.2f s)\n",
              a.output.c_str(), n(r.written.events, "allocator event", "allocator events").c_str(),
              formatBytes(r.written.peakAllocated).c_str(),
              formatBytes(r.written.peakReserved).c_str(), r.readSeconds, r.writeSeconds);
  return 0;
}

}  // namespace

Command addImportCommand(CLI::App& root) {
  auto a = std::make_shared<ImportArgs>();
  CLI::App* c = root.add_subcommand("import", "turn another tool's file into a Keel recording");
  c->require_subcommand(1);
  CLI::App* tm = c->add_subcommand(
      "torch-memory",
      "a PyTorch CUDA memory snapshot (torch.cuda.memory._dump_snapshot, or 1.13's _snapshot() "
      "pickled) as a recording of its "
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
