// `keel train`: runs a GPT training job on a CPU backend and prints one line per step and a
// summary with the validation loss; optionally saves sharded checkpoints (--save-every,
// --ckpt-dir, --ckpt-tp) and resumes from one (--resume) with the same loss curve. Under mpirun
// (or keel launch) with --dp/--tp it is one rank of a multi-rank run; rank 0 prints. --save-inputs
// writes the initial weights and the batches for replaying the run elsewhere (docs/torch.md).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_common.h"
#include "keel/allocator.h"
#include "keel/base/output_path.h"
#include "keel/base/text.h"
#include "keel/checkpoint.h"
#include "keel/data.h"
#include "keel/dist.h"
#include "keel/error.h"
#include "keel/gpt_config.h"
#include "keel/train.h"

namespace keel::cli {
namespace {

struct TrainArgs {
  std::string config;
  std::string backend = "cpu";
  int64_t steps = 200;
  uint64_t seed = 0;
  std::string data;
  int threads = 0;
  std::string alloc;  // --alloc
  int64_t evalBatches = 8;
  int64_t saveEvery = 0;
  std::string ckptDir;
  int ckptTp = 0;  // files of a saved checkpoint (0: 1)
  std::string resume;
  std::string saveInputs;  // --save-inputs: Note [Training inputs]
  ParallelArgs parallel;   // --dp, --tp: the run's own layout (keel/dist.h)
};

}  // namespace

// A --ckpt-dir that already holds checkpoints (step-* folders) is another run's unless this run
// continues from one of them: saving there replaced some of them silently, and a later
// --resume DIR then took the other run's latest step. Refused before the first step.
// A step-NNNNNN folder this run would save into (a save never replaces one: Note [A save
// replaces nothing]) that is not a finished checkpoint (no keel-checkpoint.json: the user's
// folder, or a checkpoint whose metadata went missing, which --resume DIR skips for an earlier
// step) is refused too, before the first step rather than at that save.
void checkCkptDirIsThisRuns(const std::string& dir, const std::string& resumedFrom,
                            int64_t firstStep, int64_t lastStep, int64_t saveEvery) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const int64_t step = keel::ckpt::stepOfDirName(name);
    if (step < firstStep || step > lastStep) continue;
    if (step != lastStep && (saveEvery <= 0 || step % saveEvery != 0)) continue;
    if (fs::exists(e.path() / keel::ckpt::kMetadataFile, ec)) continue;  // a checkpoint: below
    throw Error("--ckpt-dir " + dir + " holds " + name + ", which is not a checkpoint (no " +
                keel::ckpt::kMetadataFile + "): this run's save at step " + std::to_string(step) +
                " would replace it; move it away or choose another --ckpt-dir");
  }
  // Only finished checkpoints count (a save cut short leaves step-000006.tmp), in step order.
  const std::vector<std::pair<int64_t, std::string>> found = keel::ckpt::stepCheckpoints(dir);
  if (found.empty()) return;
  // Resuming from one of them (however spelled: `ck/step-000002/`, `step-000002` from inside):
  // this run's own, unless it holds steps after the one resumed from, which saving would replace
  // (a retry from an earlier step replaced the first run's later checkpoints without a word).
  if (!resumedFrom.empty() && isInsideDirectory(resumedFrom, dir)) {
    fs::path p = fs::path(resumedFrom).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();  // "ck/step-000002/"
    const std::string from = p.filename().string();
    const int64_t step = keel::ckpt::stepOfDirName(from);
    const int64_t fromStep = step >= 0 ? step : INT64_MAX;
    std::vector<std::string> later;
    for (const auto& [n, name] : found)
      if (n > fromStep) later.push_back(name);
    if (later.empty()) return;
    throw Error("--ckpt-dir " + dir + " holds " + later.front() +
                (later.size() > 1 ? " .. " + later.back() : std::string()) + ", after the " + from +
                " this run resumes from: saving there would replace " +
                (later.size() > 1 ? "them" : "it") +
                "; choose another --ckpt-dir (or remove them first)");
  }
  throw Error("--ckpt-dir " + dir + " already holds another run's checkpoints (" +
              found.front().second +
              (found.size() > 1 ? " .. " + found.back().second : std::string()) +
              "); choose an empty folder, or continue that run with --resume " + dir);
}

namespace {

// Note [One run per --ckpt-dir]
// A training run holds its --ckpt-dir for its whole life. Two runs given one folder both saved
// into it, each replacing the other's step-N, and --resume DIR then continued a mix of the two;
// the check of the folder's contents ran once, before the first step, when both were still
// empty. Before the first step the run now makes the folder (which proves it can: /proc/x passed
// every check of its path and failed at the first save, after the whole run) and takes an
// OutputLock inside it (`DIR/.keel.lock`, holding the pid), so a second run is refused in one
// line naming the first. In a multi-rank run the ranks write one folder together (Note
// [Multi-rank checkpoints]): rank 0 takes the lock, and every rank learns whether it got it.
// Holding the lock, rank 0 removes the step-N.tmp folders of saves cut short (a killed run's:
// their writer is gone; a folder some other writer holds open is refused). A folder the run made
// and left empty (it stopped before its first save) is removed when the run ends.
class CkptDirHold {
 public:
  CkptDirHold(const std::string& dir, bool lockHere) {
    if (!lockHere) return;
    namespace fs = std::filesystem;
    std::error_code ec;
    for (fs::path p = fs::absolute(dir, ec).lexically_normal();
         !p.empty() && p != p.parent_path() && !fs::exists(fs::symlink_status(p, ec));
         p = p.parent_path())
      made_.push_back(p.string());  // deepest first
    if (!fs::is_directory(dir, ec) && !fs::create_directories(dir, ec) && !fs::is_directory(dir))
      throw Error("--ckpt-dir " + dir + ": cannot create the folder (" +
                  (ec ? ec.message() : std::string("unknown error")) + ")");
    try {
      lock_.emplace(keel::OutputLock::insideFolder(dir, "--ckpt-dir " + dir));
      for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.size() < 5 || name.compare(name.size() - 4, 4, ".tmp") != 0 ||
            keel::ckpt::stepOfDirName(name.substr(0, name.size() - 4)) < 0)
          continue;
        KEEL_CHECK(!keel::outputLockHeld(e.path().string()), "--ckpt-dir ", dir, ": ", name,
                   " is being written by another process; refusing to save into the same folder");
        fs::remove_all(e.path(), ec);  // a save cut short (Note [A save replaces nothing])
        fs::remove(keel::lockPath(e.path().string()), ec);
      }
    } catch (...) {
      release();
      throw;
    }
  }
  ~CkptDirHold() { release(); }

 private:
  void release() {
    lock_.reset();
    std::error_code ec;
    for (const std::string& p : made_)
      if (!std::filesystem::remove(p, ec)) break;  // not empty: this run saved there
    made_.clear();
  }
  std::vector<std::string> made_;  // the folders this run made, deepest first
  std::optional<keel::OutputLock> lock_;
};

// Whether every rank's `ok` is true (a process alone: `ok`).
bool everyRank(bool ok) {
  if (keel::dist::worldSize() == 1) return ok;
  int32_t bad = ok ? 0 : 1, any = 0;
  keel::dist::allReduce({"all_reduce", "world", keel::DType::Int32, 1, 0}, &bad, &any,
                        keel::dist::ReduceOp::Max);
  return any == 0;
}

// The signal every rank saw (Note [Interrupts]): a process alone polls its own flag; the ranks of
// a multi-rank run agree on it after each step (the launcher forwards a signal to every rank, but
// one may see it a step later than another, and it would then wait in a collective for peers that
// stopped), so they stop between the same two steps.
int agreedInterrupt() {
  if (keel::dist::worldSize() == 1) return interruptSignal();
  int32_t mine = interruptSignal(), any = 0;
  keel::dist::allReduce({"all_reduce", "world", keel::DType::Int32, 1, 0}, &mine, &any,
                        keel::dist::ReduceOp::Max);
  return any;
}

int runTrain(const TrainArgs& a) {
  prepareEngineRun();
  checkConfigFound(a.config);
  keel::GptConfig cfg = keel::loadGptConfig(a.config);
  startProcessGroup(a.parallel);
  const keel::dist::Layout layout = keel::dist::layout();
  // Ctrl-C or SIGTERM stops the run between two steps (Note [Interrupts]); a second one ends a
  // process alone at once.
  catchInterrupts(layout.world() == 1);
  // A multi-rank run writes one file per rank (Note [Multi-rank checkpoints]).
  KEEL_CHECK(a.ckptTp == 0 || layout.world() == 1,
             "--ckpt-tp: a multi-rank run saves one file per rank; reshard its checkpoints with "
             "keel ckpt convert --target-tp N");
  const int ckptTp = a.ckptTp > 0 ? a.ckptTp : 1;
  // Rank 0 speaks for the run; the others print only their errors.
  const bool speak = keel::dist::worldRank() == 0;
  // --alloc, else the config's, else KEEL_ALLOCATOR (the same resolution as keel record's), and
  // the caching allocator where the VMM allocator cannot be created (Note [VMM fallback]).
  std::string why;
  keel::setDefaultAllocatorKind(keel::usableAllocatorKind(
      keel::resolveAllocatorKind(a.alloc, cfg.allocator, "--alloc"), &why));
  if (!why.empty()) warn(why);
  keel::Device device = keel::trainingDevice(a.backend);
  useCpuThreads(a.threads);
  auto dataset = std::make_shared<const keel::data::TextDataset>(
      a.data.empty() ? keel::data::TextDataset::defaultCorpus()
                     : keel::data::TextDataset::load(a.data));
  KEEL_CHECK(a.saveEvery == 0 || !a.ckptDir.empty(), "--save-every needs --ckpt-dir");
  KEEL_CHECK(a.ckptTp == 0 || !a.ckptDir.empty(), "--ckpt-tp needs --ckpt-dir");
  // Not among the inputs: the corpus folder (a checkpoint there would be read as documents by
  // the next run; Note [Outputs never destroy inputs]).
  const std::string corpus = a.data.empty() ? keel::data::kDefaultCorpusDir : a.data;
  KEEL_CHECK(a.ckptDir.empty() || !isInsideDirectory(a.ckptDir, corpus), "--ckpt-dir ", a.ckptDir,
             " is inside the training data (the directory ", corpus,
             "); refusing to write among the inputs");
  std::optional<CkptDirHold> hold;
  if (!a.ckptDir.empty()) {  // before any step: a folder that cannot hold checkpoints fails now,
    namespace fs = std::filesystem;  // not at the first save after the whole run
    std::error_code ec;
    KEEL_CHECK(!fs::exists(a.ckptDir, ec) || fs::is_directory(a.ckptDir, ec), "--ckpt-dir ",
               a.ckptDir, " exists and is not a directory");
    // A new folder is made in its nearest existing ancestor, which must be a folder.
    fs::path up = fs::absolute(a.ckptDir, ec).lexically_normal();
    while (!up.empty() && !fs::exists(up, ec) && up != up.parent_path()) up = up.parent_path();
    KEEL_CHECK(fs::is_directory(up, ec), "--ckpt-dir ", a.ckptDir, ": ", up.string(),
               " is not a directory");
    // Nor one this user cannot write (found at the first save, after every step had run).
    KEEL_CHECK(::access(up.c_str(), W_OK | X_OK) == 0, "--ckpt-dir ", a.ckptDir, ": ",
               up == fs::absolute(a.ckptDir, ec).lexically_normal()
                   ? std::string("cannot write there")
                   : "cannot create it in " + up.string(),
               " (", std::strerror(errno), ")");
    // Made and locked for the whole run (Note [One run per --ckpt-dir]).
    std::string error;
    try {
      hold.emplace(a.ckptDir, keel::dist::worldRank() == 0);
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (!everyRank(error.empty()))
      throw Error(error.empty() ? "--ckpt-dir " + a.ckptDir + ": rank 0 could not take it" : error);
  }
  keel::Trainer trainer(cfg, device, a.seed, dataset, a.steps);
  std::string resumedFrom;
  // Warnings wait until every check has passed: a refused run prints its one line alone.
  std::vector<std::string> warnings;
  if (!a.resume.empty()) {
    std::string otherSettings;  // Note [Resumed settings]: warned, not refused
    std::string skipped;        // a newer step-N without metadata: said, not silently passed over
    const std::string from = keel::ckpt::resolveCheckpoint(a.resume, &skipped);
    if (!skipped.empty())
      warnings.push_back(skipped + " has no " + keel::ckpt::kMetadataFile +
                         " (incomplete?); resuming from " +
                         std::filesystem::path(from).filename().string());
    resumedFrom = keel::ckpt::loadTrainingCheckpoint(trainer, from, nullptr, &otherSettings);
    KEEL_CHECK(trainer.stepsDone() < a.steps, resumedFrom, " is at step ", trainer.stepsDone(),
               ", not before --steps ", a.steps, ": nothing left to train");
    if (!otherSettings.empty()) warnings.push_back(otherSettings);
  }
  if (!a.ckptDir.empty()) {
    checkCkptDirIsThisRuns(a.ckptDir, resumedFrom, trainer.stepsDone() + 1, a.steps, a.saveEvery);
    // Nor inside the checkpoint resumed from (Note [Outputs never destroy inputs]).
    KEEL_CHECK(resumedFrom.empty() || !isInsideDirectory(a.ckptDir, resumedFrom), "--ckpt-dir ",
               a.ckptDir, " is inside the checkpoint --resume reads (", resumedFrom,
               "); refusing to write among the inputs");
  }
  if (speak)
    for (const std::string& w : warnings) warn(w);

  if (!a.saveInputs.empty()) {
    keel::ckpt::saveTrainingInputs(trainer, a.saveInputs, a.steps - trainer.stepsDone());
    std::printf(
        "saved %s/init (the weights before step %lld) and %s/batches.safetensors (%lld "
        "steps' batches)\n",
        a.saveInputs.c_str(), static_cast<long long>(trainer.stepsDone() + 1), a.saveInputs.c_str(),
        static_cast<long long>(a.steps - trainer.stepsDone()));
  }
  if (!speak) std::freopen("/dev/null", "w", stdout);  // the others would repeat rank 0
  std::printf("keel train: %s (%s), %s, backend %s, %d thread%s, seed %llu\n",
              cfg.name.empty() ? "gpt" : cfg.name.c_str(), a.config.c_str(),
              cfg.isMoe() ? "moe" : "dense", a.backend.c_str(), keel::cpuThreads(),
              keel::cpuThreads() == 1 ? "" : "s",
              static_cast<unsigned long long>(trainer.seed()));  // a resumed run's own
  if (layout.world() > 1)
    std::printf(
        "ranks: %d (dp %d x tp %d%s%s%s%s); each rank trains on %lld of the batch's rows%s\n",
        layout.world(), layout.dp, layout.tp, layout.vocab ? ", vocabulary over tp" : "",
        layout.ep > 1 ? (", experts over ep " + std::to_string(layout.ep)).c_str() : "",
        layout.cp > 1 ? (", sequence over cp " + std::to_string(layout.cp)).c_str() : "",
        layout.zero ? ", optimizer state sharded over dp" : "",
        static_cast<long long>(cfg.batch_size / (layout.dp / layout.cp)),
        layout.cp > 1 ? (", 1/" + std::to_string(layout.cp) + " of each row's tokens").c_str()
                      : "");
  if (layout.cp > 1) {  // Note [Context-parallel attention]: how evenly the mask's work splits
    auto percents = [](const std::vector<double>& shares) {
      std::string s;
      for (double x : shares) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%s%.1f%%", s.empty() ? "" : " ", 100.0 * x);
        s += buf;
      }
      return s;
    };
    std::printf(
        "context parallel: each row's %lld tokens split zig-zag over %d ranks; the %s "
        "mask's work by rank: %s (a contiguous split: %s)\n",
        static_cast<long long>(cfg.seq_len), layout.cp, cfg.attention_mask.c_str(),
        percents(trainer.contextWorkShares(keel::cp::Split::ZigZag)).c_str(),
        percents(trainer.contextWorkShares(keel::cp::Split::Contiguous)).c_str());
  }
  std::printf(
      "model: %lld parameters, %lld layers, d_model %lld, %lld heads, seq %lld, batch %lld\n",
      static_cast<long long>(trainer.model().numParameters()), static_cast<long long>(cfg.n_layer),
      static_cast<long long>(cfg.d_model), static_cast<long long>(cfg.n_head),
      static_cast<long long>(cfg.seq_len), static_cast<long long>(cfg.batch_size));
  std::printf("data: %s (%lld bytes: %lld train, %lld validation)\n", dataset->source().c_str(),
              static_cast<long long>(dataset->numTokens()),
              static_cast<long long>(dataset->splitTokens(keel::data::Split::Train)),
              static_cast<long long>(dataset->splitTokens(keel::data::Split::Val)));
  if (!resumedFrom.empty())
    std::printf("resumed from %s at step %lld (seed %llu)\n", resumedFrom.c_str(),
                static_cast<long long>(trainer.stepsDone()),
                static_cast<unsigned long long>(trainer.seed()));
  std::fflush(stdout);
  std::string lastSaved;  // the newest checkpoint this run wrote
  auto save = [&] {
    const std::string dir = a.ckptDir + "/" + keel::ckpt::stepDirName(trainer.stepsDone());
    const size_t files = keel::ckpt::saveTrainingCheckpoint(trainer, dir, ckptTp);
    lastSaved = dir;
    if (layout.world() > 1)  // Note [Multi-rank checkpoints]: a rank with no part writes no file
      std::printf(
          "saved %s (%zu file%s from %d ranks: each rank holding a part of its own writes "
          "one)\n",
          dir.c_str(), files, files == 1 ? "" : "s", layout.world());
    else
      std::printf("saved %s (tp=%d)\n", dir.c_str(), ckptTp);
    std::fflush(stdout);
  };

  const int width = int(std::to_string(a.steps).size());
  double totalSeconds = 0;
  const int64_t remaining = a.steps - trainer.stepsDone();
  auto onStep = [&](const keel::StepStats& s) {
    // "loss" is what the optimizer minimises, the loss `keel record`, the recording and the
    // studio show: for a MoE model the cross entropy ("lm") plus aux_loss_coef times "aux", the
    // MoE layers' aux losses summed (train printed the cross entropy as "loss", record the sum).
    totalSeconds += s.seconds;
    if (cfg.isMoe())
      std::printf("step %*lld/%lld  loss %.4f  lm %.4f  aux %.4f  lr %.3e  gnorm %.3f  %.0f tok/s",
                  width, static_cast<long long>(s.step), static_cast<long long>(a.steps),
                  unsignedNaN(s.loss), unsignedNaN(s.lmLoss), unsignedNaN(s.auxLoss), s.lr,
                  unsignedNaN(s.gradNorm), s.tokensPerSec);
    else
      std::printf("step %*lld/%lld  loss %.4f  lr %.3e  gnorm %.3f  %.0f tok/s", width,
                  static_cast<long long>(s.step), static_cast<long long>(a.steps),
                  unsignedNaN(s.loss), s.lr, unsignedNaN(s.gradNorm), s.tokensPerSec);
    if (cfg.eval_every > 0 && s.step % cfg.eval_every == 0)
      std::printf("  val %.4f", unsignedNaN(s.valLoss));
    std::printf("\n");
    std::fflush(stdout);
    // Every --save-every steps, and at the end when a checkpoint directory is given.
    if (!a.ckptDir.empty() && ((a.saveEvery > 0 && s.step % a.saveEvery == 0) || s.step == a.steps))
      save();
  };
  std::vector<keel::StepStats> stats;
  stats.reserve(size_t(std::clamp<int64_t>(remaining, 0, 1 << 16)));
  for (int64_t i = 0; i < remaining; ++i) {
    // Stopped between two steps (a save in progress finishes first): every checkpoint written is
    // complete, and no step-N.tmp is left.
    if (const int sig = agreedInterrupt(); sig != 0) {
      if (speak) {
        std::fflush(stdout);
        std::fprintf(stderr, "keel: train interrupted (%s) after step %lld of %lld; %s\n",
                     sig == SIGINT ? "SIGINT" : "SIGTERM",
                     static_cast<long long>(trainer.stepsDone()), static_cast<long long>(a.steps),
                     !lastSaved.empty()  ? ("the latest checkpoint is " + lastSaved).c_str()
                     : a.ckptDir.empty() ? "nothing was saved (no --ckpt-dir)"
                                         : "no checkpoint was saved yet");
      }
      return 128 + sig;
    }
    stats.push_back(trainer.step());
    onStep(stats.back());
  }

  const size_t tail = std::min<size_t>(10, stats.size());
  double lastMean = 0;
  for (size_t i = stats.size() - tail; i < stats.size(); ++i) lastMean += stats[i].loss;
  lastMean /= double(tail);
  const double tokens = double(remaining * cfg.batch_size * cfg.seq_len);
  std::printf(
      "done: %lld step%s in %.1f s (%.0f tok/s); loss %.4f -> %.4f (mean of last %zu: %.4f)",
      static_cast<long long>(remaining), remaining == 1 ? "" : "s", totalSeconds,
      totalSeconds > 0 ? tokens / totalSeconds : 0.0, unsignedNaN(stats.front().loss),
      unsignedNaN(stats.back().loss), tail, unsignedNaN(lastMean));
  if (a.evalBatches > 0) {
    if (dataset->splitTokens(keel::data::Split::Val) > cfg.seq_len)
      std::printf("; val loss %.4f", unsignedNaN(trainer.evaluate(a.evalBatches)));
    else
      std::printf("; no val loss (validation split shorter than seq_len + 1)");
  }
  std::printf("\n");
  return 0;
}

}  // namespace

Command addTrainCommand(CLI::App& root) {
  auto ta = std::make_shared<TrainArgs>();
  CLI::App* train = root.add_subcommand("train", "train a GPT on a text corpus");
  // A repeated option takes its last value (scripts/run passes defaults, the user overrides).
  train->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  train->add_option("--config", ta->config, "model + training config (JSON)")->required();
  train->add_option("--backend", ta->backend, "cpu | cpu-ref | cuda[:N]")->capture_default_str();
  train->add_option("--steps", ta->steps, "number of training steps")
      ->check(wholeNumber(1, kMaxSteps))
      ->capture_default_str();
  train->add_option("--seed", ta->seed, "random seed (weights, batches, dropout)")
      ->check(seedNumber())
      ->capture_default_str();
  train
      ->add_option(
          "--data", ta->data,
          std::string("text file or directory (default: ") + keel::data::kDefaultCorpusDir + ")")
      ->check(nonEmptyName());
  addAllocOption(train, ta->alloc);
  train
      ->add_option("--threads", ta->threads,
                   "Keel's cpu threads (default: all cores; OpenBLAS's: OPENBLAS_NUM_THREADS)")
      ->check(wholeNumber(1));
  train
      ->add_option("--eval-batches", ta->evalBatches,
                   "validation batches for the final val loss (0: skip)")
      ->check(wholeNumber(0))
      ->capture_default_str();
  train
      ->add_option("--save-every", ta->saveEvery,
                   "save a checkpoint every K steps (and at the end) into --ckpt-dir/step-NNNNNN")
      ->check(wholeNumber(1));
  train->add_option("--ckpt-dir", ta->ckptDir, "checkpoint directory (alone: save at the end)")
      ->check(nonEmptyName());
  train
      ->add_option("--ckpt-tp", ta->ckptTp,
                   "files of each saved checkpoint, as tensor-parallel parts (default 1; a "
                   "process alone: a multi-rank run writes one file per rank)")
      ->check(wholeNumber(1, 4096));
  addParallelOptions(train, ta->parallel);
  train
      ->add_option("--resume", ta->resume,
                   "continue from a checkpoint (a step-* directory, or a --ckpt-dir: its latest)")
      ->check(nonEmptyName());
  train
      ->add_option("--save-inputs", ta->saveInputs,
                   "write DIR/init (the initial weights, a checkpoint) and DIR/batches.safetensors "
                   "(every step's tokens) for replaying the run in another framework")
      ->check(nonEmptyName());
  return {train, [ta] { return runTrain(*ta); }};
}

}  // namespace keel::cli
