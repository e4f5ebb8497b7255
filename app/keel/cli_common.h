// Shared plumbing of the keel tool's commands: the one-line error convention and the command
// table. Invariant: every failure prints exactly one line "keel: error: ..." to stderr and the
// process exits with status 2.
#pragma once
#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "keel/capture/recording_run.h"
#include "keel/storage/records.h"

namespace keel::cli {

inline constexpr int kExitError = 2;

// Prints "keel: error: <msg>" (newlines folded) to stderr; returns kExitError.
int fail(const std::string& msg);
// A reader that closed the pipe (`keel ops | head`, `| grep -q`) took what it wanted: keel exits
// as a process killed by SIGPIPE would, quietly.
inline constexpr int kExitClosedPipe = 128 + 13;  // SIGPIPE
// Flushes stdout: 0, or kExitClosedPipe when the reader closed the pipe; throws keel::Error
// "cannot write to stdout: ..." on any other write error (a full disk). Clear errno before the
// writes it checks.
int flushStdout();
// Writes `text` to stdout and flushes it (flushStdout's result).
int writeToStdout(const std::string& text);
// Prints "keel: warning: <msg>" (newlines folded) to stderr; the run goes on.
void warn(const std::string& msg);
// Note [Interrupts]: Ctrl-C (SIGINT) or SIGTERM sets a flag the command polls at points where
// it can stop cleanly (keel record between ops or steps, keel ckpt convert between shards, an
// export between the pieces of its file), so
// what it writes is finished or removed instead of cut short; the command then exits 128 +
// signal. With `secondEndsAtOnce`, a second signal ends the process at once (128 + signal).
void catchInterrupts(bool secondEndsAtOnce);
// The signal caught (SIGINT or SIGTERM), 0 when none.
int interruptSignal();
// "interrupted (SIGINT)" / "interrupted (SIGTERM)", "" when no signal was caught.
std::string interruptReason();
// --threads N (0: the default): sets the cpu backend's threads, warning where fewer cores can run.
void useCpuThreads(int n);
// First thing in a command that runs the engine (train, record, bench): throws keel::Error when
// an address-space limit leaves no room for OpenBLAS's work buffer, and warns when that limit cut
// OpenBLAS's threads. See Note [OpenBLAS under an address-space limit]
// (engine/src/core/runtime.cpp).
void prepareEngineRun();

// Why a recording holds no op calls of `step` (step < 0: none at all), from the capture options
// it was recorded with: "recorded with --no-graph: it holds no op calls", "step 1's ops were not
// recorded (only steps 2:3): try --step 2"; "" where they do not explain it. keel inspect's
// "capture" line words the same options.
std::string whyNoOps(const storage::RunInfo& run, int64_t step);

// Numeric option checks whose errors say the option, the value and the range in words
// ("--steps: must be a whole number ≥ 1, got -1"), instead of CLI11's 300-digit bounds; each is a
// documented range in --help ("INT in [1, 4096]").
// A whole number in [lo, hi] (written in decimal; "1e3" and "2.5" are not whole numbers).
CLI::Validator wholeNumber(int64_t lo, int64_t hi = INT64_MAX);
// The keel binary this process runs (/proc/self/exe): what keel launch's ranks run, and where
// the installed data (<prefix>/share/keel) is found from.
std::string selfPath();
// A --config that names no file here but one of the configs installed with keel
// (<prefix>/share/keel/configs: the README's `--config configs/gpt-mini.json` run outside the
// source tree) throws keel::Error naming the installed one; anything else is left to the reader.
void checkConfigFound(const std::string& path);
// The longest run `keel train` / `keel record` take, the studio's too (a billion steps; 2^63 used
// to fail in vector::reserve, 10^10 in bad_alloc).
inline constexpr int64_t kMaxSteps = capture::kMaxRunSteps;
// A seed: a whole number in [0, 2^64 - 1] (-1 used to wrap silently to 2^64 - 1).
CLI::Validator seedNumber();
// A finite real number ≥ lo (nan and inf refused).
CLI::Validator finiteAtLeast(double lo);
// A finite real number in [lo, hi].
CLI::Validator finiteIn(double lo, double hi);
// A file or directory name that is not "" (an empty --data used to mean "not given").
CLI::Validator nonEmptyName();
// The same for a filter's value (an empty --scope or --ops would filter nothing, silently).
CLI::Validator nonEmptyValue();

// --alloc host|caching|vmm: the allocator for host tensors (default: KEEL_ALLOCATOR, else vmm).
void addAllocOption(CLI::App* c, std::string& kind);

// Multi-rank runs (keel/dist.h): --dp, --tp, --collective-timeout, --check-collectives.
struct ParallelArgs {
  int dp = 0;  // 0: what the launcher's world leaves after tp
  int tp = 1;
  double collectiveTimeout = 600;
  bool checkCollectives = false;
  bool zero = false;   // --zero: Note [Sharded optimizer state]
  int ep = 1;          // --ep: Note [Expert-parallel MoE]
  int cp = 1;          // --cp: Note [Context-parallel attention]
  bool vocab = false;  // --vocab-parallel: Note [Vocabulary-parallel embedding and loss]
};
void addParallelOptions(CLI::App* c, ParallelArgs& a);
// Starts the process group for the options and the launcher's world (alone: world size 1).
// Throws keel::Error for a layout that does not fit.
void startProcessGroup(const ParallelArgs& a);

// A recording argument that may be a run folder (Note [Run folders]): --rank N picks a rank's
// file; a folder without --rank, or --rank with a single recording, is a one-line error.
void addRankOption(CLI::App* c, int64_t& rank);
std::string recordingOfRank(const std::string& path, int64_t rank);  // rank < 0: not given

// keel train's check of its --ckpt-dir before the first step (cmd_train.cpp): a folder holding
// another run's checkpoints, or a step-N this run would save over, is refused in one line.
// keel launch runs it too, before it starts the ranks.
void checkCkptDirIsThisRuns(const std::string& dir, const std::string& resumedFrom,
                            int64_t firstStep, int64_t lastStep, int64_t saveEvery);

// One subcommand: its CLI11 node and what runs when it was chosen (returns the exit status).
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command addTrainCommand(CLI::App& root);
Command addOpsCommand(CLI::App& root);
Command addRecordCommand(CLI::App& root);
Command addInspectCommand(CLI::App& root);
Command addDiffCommand(CLI::App& root);
Command addExportCommand(CLI::App& root);
Command addCkptCommand(CLI::App& root);
Command addMemoryCommand(CLI::App& root);
Command addBenchCommand(CLI::App& root);
Command addLaunchCommand(CLI::App& root);
Command addImportCommand(CLI::App& root);

}  // namespace keel::cli
