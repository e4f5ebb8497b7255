// `keel ckpt inspect|plan|convert`: look into a FlexCheckpoint, print the read plan of a
// resharding (with optional AOA rules), and convert a checkpoint to another tensor-parallel
// layout with a progress bar. Wiring only: the work is in engine/src/ckpt.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "cli_common.h"
#include "keel/base/output_path.h"
#include "keel/base/text.h"
#include "keel/checkpoint.h"

namespace keel::cli {
namespace {

struct CkptArgs {
  std::string src, dst, aoa;
  int targetTp = 1;
  // One worker per core by default: conversions are bound by the kernel's page-cache copies,
  // which scale with cores as long as the threads write different files (Note [Threads and files]).
  int threads = int(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  size_t maxReads = 8;
  bool verify = false;  // inspect --verify: read every file against its MD5 (convert: always)
  bool md5 = false;     // convert --md5: record the output files' MD5s
  CLI::App *inspect = nullptr, *plan = nullptr, *convert = nullptr;
};

std::string dims(const ckpt::Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// A checkpoint directory, a .safetensors file, or a --ckpt-dir (its latest step-* checkpoint).
ckpt::Checkpoint openSource(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec) && !fs::exists(fs::path(path) / ckpt::kMetadataFile, ec)) {
    std::string skipped;  // a newer step-N without metadata: said, not silently passed over
    const std::string latest = ckpt::resolveCheckpoint(path, &skipped);
    if (!skipped.empty())
      warn(skipped + " has no " + ckpt::kMetadataFile + " (incomplete?); reading " +
           fs::path(latest).filename().string());
    return ckpt::Checkpoint::open(latest);
  }
  // One file of a checkpoint folder is read as a checkpoint of its own, each tensor in it whole:
  // a rank's part of a multi-rank checkpoint then has the part's shapes (and 'KEY#1' boxes).
  // (The metadata file itself is refused by Checkpoint::open, naming the folder.)
  if (!fs::is_directory(path, ec) && fs::path(path).filename() != ckpt::kMetadataFile) {
    const fs::path dir =
        fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
    size_t files = 0;  // from the metadata alone: opening the folder opened every file in it
    const std::string meta = (dir / ckpt::kMetadataFile).string();
    if (fs::exists(meta, ec)) try {
        files = ckpt::metadataFromJson(
                    readFile(meta, "checkpoint metadata", ckpt::kMaxMetadataBytes), meta)
                    .files.size();
      } catch (const std::exception&) {  // a damaged folder: the file alone is what was asked
      }
    if (files > 1)
      warn(path + " is one of the " + std::to_string(files) + " files of the checkpoint " +
           dir.string() +
           ": read alone, its tensors are that file's parts; give the folder for the whole");
  }
  return ckpt::Checkpoint::open(path);
}

int runInspect(const CkptArgs& a) {
  ckpt::Checkpoint c = openSource(a.src);
  const ckpt::Metadata& m = c.metadata();
  size_t shards = 0;
  for (const auto& k : m.keys) shards += k.shards.size();
  std::printf("checkpoint %s: %zu file%s, %zu key%s, %zu shard%s, %s\n", c.path().c_str(),
              m.files.size(), m.files.size() == 1 ? "" : "s", m.keys.size(),
              m.keys.size() == 1 ? "" : "s", shards, shards == 1 ? "" : "s",
              formatBytes(c.totalBytes()).c_str());
  if (!m.trainState.empty()) std::printf("train state: %s\n", m.trainState.c_str());
  std::map<uint32_t, std::pair<size_t, uint64_t>> perFile;
  for (const auto& k : m.keys)
    for (const auto& s : k.shards) {
      perFile[s.file].first++;
      perFile[s.file].second += s.end - s.begin;
    }
  // Note [Checkpoint file digests]: with --verify, a damaged file fails here, naming it.
  const size_t verified = a.verify ? c.verifyFiles() : 0;
  if (a.verify && !verified)  // exit 0 after checking nothing read as "verified"
    warn("--verify: " + c.path() + " records no MD5s (" +
         (std::filesystem::is_directory(c.path()) ? std::string("a conversion without --md5")
                                                  : std::string("a lone .safetensors file")) +
         "): nothing was checked");
  std::error_code ec;
  std::printf("files:%s\n", verified ? " (each file's MD5 verified against the metadata)"
                            : !m.fileMd5.empty() ? " (MD5s recorded: --verify checks them)"
                            : std::filesystem::is_directory(c.path(), ec) ? " (no MD5s recorded)"
                                                                          : "");
  for (size_t f = 0; f < m.files.size(); ++f)
    std::printf("  %-36s %6zu tensors  %s\n", m.files[f].c_str(), perFile[uint32_t(f)].first,
                formatBytes(perFile[uint32_t(f)].second).c_str());
  std::printf("keys:\n");
  for (const auto& k : m.keys) {
    std::string layout;
    if (k.shards.size() == 1)
      layout = "whole in " + m.files[k.shards[0].file];
    else
      layout = std::to_string(k.shards.size()) + " shards" +
               (k.splitAxis >= 0 ? " along axis " + std::to_string(k.splitAxis) : std::string());
    // visibleText: a newline in a hostile file's key broke the table.
    std::printf("  %-44s %-4s %-16s %s\n", visibleText(k.key).c_str(),
                std::string(st::dtypeName(k.dtype)).c_str(), dims(k.shape).c_str(), layout.c_str());
  }
  return 0;
}

std::unique_ptr<aoa::Program> rules(const CkptArgs& a) {
  if (a.aoa.empty()) return nullptr;
  return std::make_unique<aoa::Program>(aoa::parseFile(a.aoa));
}

int runPlan(const CkptArgs& a) {
  ckpt::Checkpoint c = openSource(a.src);
  auto r = rules(a);
  ckpt::TargetSpec spec;
  spec.tp = a.targetTp;
  ckpt::Plan plan = ckpt::makePlan(c.metadata(), r.get(), spec);
  std::fputs(ckpt::describePlan(plan, c.metadata(), a.maxReads).c_str(), stdout);
  return 0;
}

int runConvert(const CkptArgs& a) {
  // Ctrl-C or SIGTERM stops the conversion between shards; DST is left as it was found (Note
  // [Interrupts], Note [Outputs left as found]). A second signal waits for that too: a shard is
  // quick, and ending at once would leave a half-written DST.
  catchInterrupts(false);
  ckpt::Checkpoint c = openSource(a.src);
  // Note [Checkpoint file digests]: convert() checks the source's MD5s whenever it records them.
  if (a.verify && c.metadata().fileMd5.empty())  // asked for, and nothing to check: say so
    warn("--verify: " + c.path() + " records no MD5s (" +
         (std::filesystem::is_directory(c.path()) ? std::string("a conversion without --md5")
                                                  : std::string("a lone .safetensors file")) +
         "): its files are not checked");
  // A new checkpoint inside the source's folder would sit among the checkpoints it was read from
  // (a later --resume of that folder could take it for one of the run's steps).
  for (const std::string& in : {a.src, c.path()})
    if (isInsideDirectory(a.dst, in))
      return fail("DST " + a.dst + " is inside the source checkpoint's directory " + in +
                  "; refusing to write among the inputs");
  auto r = rules(a);
  ckpt::TargetSpec spec;
  spec.tp = a.targetTp;
  ckpt::ConvertOptions opt;
  opt.threads = a.threads;
  opt.fileDigests = a.md5;
  opt.stop = [] { return interruptSignal() != 0; };
  const bool tty = ::isatty(2) != 0;
  auto t0 = std::chrono::steady_clock::now();
  if (tty)
    opt.progress = [&](uint64_t done, uint64_t total) {
      const double f = total ? double(done) / double(total) : 1.0;
      const int width = 30, fill = int(f * width + 0.5);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "\r[%.*s%*s] %3.0f%%  %s / %s  %.0f MiB/s ", fill,
                   "##############################", width - fill, "", f * 100.0,
                   formatBytes(done).c_str(), formatBytes(total).c_str(),
                   s > 0 ? double(done) / s / double(1 << 20) : 0.0);
      std::fflush(stderr);
    };
  ckpt::ConvertStats st;
  try {
    st = ckpt::convert(c, a.dst, spec, r.get(), opt);
  } catch (const std::exception&) {
    if (interruptSignal() == 0) throw;
    // Stopped by the signal: one line, and the exit status of a process the signal ended.
    std::fflush(stdout);
    std::fprintf(stderr, "%skeel: ckpt convert %s: %s was not converted; %s is left as it was\n",
                 tty ? "\n" : "", interruptReason().c_str(), c.path().c_str(), a.dst.c_str());
    return 128 + interruptSignal();
  }
  if (tty) std::fprintf(stderr, "\n");
  std::printf(
      "converted %s -> %s (tp=%d): %zu shard%s in %zu file%s, %s written, %s read%s%s, %.2f s "
      "(%.0f MiB/s)\n",
      c.path().c_str(), a.dst.c_str(), a.targetTp, st.shards, st.shards == 1 ? "" : "s", st.files,
      st.files == 1 ? "" : "s", formatBytes(st.bytesWritten).c_str(),
      formatBytes(st.bytesRead).c_str(),
      // keel ckpt plan counts the bytes the targets need; nearby pieces are read in one go
      st.bytesRead > st.bytesNeeded ? (" (" + formatBytes(st.bytesNeeded) +
                                       " of it the targets', the rest gaps read in one go)")
                                          .c_str()
                                    : "",
      st.verifiedFiles ? " (the source's MD5s verified first)" : "", st.seconds,
      st.seconds > 0 ? double(st.bytesWritten) / st.seconds / double(1 << 20) : 0.0);
  return 0;
}

}  // namespace

Command addCkptCommand(CLI::App& root) {
  auto a = std::make_shared<CkptArgs>();
  CLI::App* ck = root.add_subcommand(
      "ckpt", "FlexCheckpoint tools: inspect, plan and convert sharded safetensors checkpoints");
  ck->require_subcommand(1);
  a->inspect = ck->add_subcommand("inspect", "files, keys, shapes and shards of a checkpoint");
  a->inspect->add_option("DIR", a->src, "checkpoint directory (or one .safetensors file)")
      ->required()
      ->check(nonEmptyName());
  a->plan = ck->add_subcommand("plan", "print the read plan of a resharding (file ranges, bytes)");
  a->plan->add_option("SRC", a->src, "source checkpoint")->required()->check(nonEmptyName());
  a->convert = ck->add_subcommand("convert", "reshard (and transform) a checkpoint into DST");
  a->convert->add_option("SRC", a->src, "source checkpoint")->required()->check(nonEmptyName());
  a->convert->add_option("DST", a->dst, "new checkpoint directory (must not exist or be empty)")
      ->required()
      ->check(nonEmptyName());
  for (CLI::App* sub : {a->plan, a->convert}) {
    // Required: a resharding names its target (a plan without one used to print tp=1's plan
    // and exit 0, hiding a mistyped option).
    sub->add_option("--target-tp", a->targetTp,
                    "tensor-parallel degree of the target (1: one file)")
        ->check(wholeNumber(1, 4096))
        ->required()
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // as every other option
    sub->add_option("--aoa", a->aoa, "AOA rules file (docs/checkpoint.md)")->check(nonEmptyName());
  }
  a->inspect->add_flag("--verify", a->verify,
                       "read every file and check it against its MD5 in the metadata (training "
                       "checkpoints, and conversions made with --md5, record them)");
  a->convert->add_flag("--verify", a->verify,
                       "warn when SRC records no MD5s (a SRC that records them is always checked "
                       "against them before anything is written)");
  a->convert->add_flag("--md5", a->md5,
                       "record each output file's MD5 in the metadata (one more pass over the "
                       "output), so resuming from it checks the files");
  a->plan->add_option("--max-reads", a->maxReads, "reads listed per target shard")
      ->check(wholeNumber(0))
      ->capture_default_str();
  a->convert
      ->add_option(
          "--threads", a->threads,
          "worker threads (each holds one target shard); default: one per core, at most 16")
      ->check(wholeNumber(1, 256))
      ->capture_default_str();
  return {ck, [a] {
            if (a->inspect->parsed()) return runInspect(*a);
            if (a->plan->parsed()) return runPlan(*a);
            return runConvert(*a);
          }};
}

}  // namespace keel::cli
