// keel: the command-line tool. Wiring only: each command lives in its own cmd_*.cpp.
// Invariant: every failure prints exactly one line "keel: error: ..." to stderr and exits with
// status 2 (help exits 0).
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include "cli_common.h"
#include "keel/base/number_words.h"
#include "keel/base/text.h"
#include "keel/dist.h"
#include "keel/error.h"
#include "keel/runtime.h"
#include "keel/storage/errors.h"
#include "keel/storage/reader.h"
#include "keel/storage/run_folder.h"
#include "keel/train.h"

namespace keel::cli {

namespace {

// msg on one readable line: newlines folded, trailing blanks dropped, at most about 1,000 bytes
// (keel::clipText: a 5 MB token quoted by a parser shows its start and end).
std::string oneLine(const std::string& msg) {
  std::string line = clipText(msg);
  for (char& c : line)
    if (c == '\n' || c == '\r') c = ' ';
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line;
}

}  // namespace

int fail(const std::string& msg) {
  std::fflush(stdout);
  // A rank of a multi-rank run names itself (its peers print theirs, or are ended by the
  // launcher): "keel: error: rank 1: ...". A message that names the rank already is kept.
  std::string line = oneLine(msg);
  if (dist::initialized() && dist::worldSize() > 1) {
    const std::string rank = "rank " + std::to_string(dist::worldRank());
    if (line.rfind(rank + " ", 0) != 0 && line.rfind(rank + ":", 0) != 0) line = rank + ": " + line;
  }
  std::fprintf(stderr, "keel: error: %s\n", line.c_str());
  return kExitError;
}

static_assert(kExitClosedPipe == 128 + SIGPIPE);

namespace {
// Whether stdout is a pipe whose reader has closed it (poll reports POLLERR on a write end without
// readers): the EPIPE of a write made mid-command is long gone from errno at the final flush.
bool stdoutReaderGone() {
  struct stat st {};
  if (::fstat(STDOUT_FILENO, &st) != 0 || !S_ISFIFO(st.st_mode)) return false;
  pollfd p{STDOUT_FILENO, POLLOUT, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLERR) != 0;
}
}  // namespace

int flushStdout() {
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return 0;
  if (errno == EPIPE || stdoutReaderGone()) return kExitClosedPipe;
  throw Error(std::string("cannot write to stdout: ") +
              (errno ? std::strerror(errno) : "write error"));
}

int writeToStdout(const std::string& text) {
  errno = 0;
  if (!text.empty()) std::fwrite(text.data(), 1, text.size(), stdout);  // flushStdout sees errors
  return flushStdout();
}

void warn(const std::string& msg) {
  std::fflush(stdout);
  std::fprintf(stderr, "keel: warning: %s\n", oneLine(msg).c_str());
}

// Note [Interrupts] (cli_common.h). A rank of a multi-rank run ignores a second signal (the
// launcher's, which would cut its recording short): keel record passes secondEndsAtOnce only to
// a process alone.
namespace {
std::atomic<int> g_interrupt{0};
std::atomic<bool> g_secondEndsAtOnce{true};
extern "C" void onInterrupt(int sig) {
  if (g_interrupt.exchange(sig) != 0 && g_secondEndsAtOnce.load()) std::_Exit(128 + sig);
}
}  // namespace

void catchInterrupts(bool secondEndsAtOnce) {
  g_secondEndsAtOnce.store(secondEndsAtOnce);
  std::signal(SIGINT, onInterrupt);
  std::signal(SIGTERM, onInterrupt);
}

int interruptSignal() {
  return g_interrupt.load();
}

std::string interruptReason() {
  const int sig = g_interrupt.load();
  return sig == 0        ? std::string()
         : sig == SIGINT ? "interrupted (SIGINT)"
                         : "interrupted (SIGTERM)";
}

void useCpuThreads(int n) {
  if (n <= 0) return;  // the default: every core this process may use
  keel::setCpuThreads(n);
  if (keel::cpuThreads() < n)
    warn("--threads " + std::to_string(n) + ": the cpu backend runs " +
         std::to_string(keel::cpuThreads()) + " (the cores this process may use)");
}

void prepareEngineRun() {
  keel::ensureBlasBuffer();  // before the warning: a refusal is the one line printed
  if (std::string w = keel::addressLimitWarning(); !w.empty()) warn(w);
}

namespace {

// Parses `s` as a whole decimal number; false if it is not one (or out of int64/uint64 range).
template <typename T>
bool parseWhole(const std::string& s, T& out) {
  if (s.empty()) return false;
  size_t used = 0;
  try {
    if constexpr (std::is_signed_v<T>) {
      out = std::stoll(s, &used, 10);
    } else {
      if (s.find('-') != std::string::npos) return false;
      out = std::stoull(s, &used, 10);
    }
  } catch (const std::exception&) {
    return false;
  }
  return used == s.size();
}

}  // namespace

namespace {
// A bound as --help shows it: in ASCII, since CLI11 pads the option column by bytes and a
// three-byte "≥" pushed that option's description two columns right of the others.
std::string helpRange(std::string range) {
  if (range.rfind("≥", 0) == 0) range.replace(0, std::string("≥").size(), ">=");
  return range;
}
}  // namespace

CLI::Validator wholeNumber(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        int64_t v = 0;
        if (!parseWhole(s, v) || v < lo || v > hi) return notAWholeNumberIn(lo, hi, s);
        return {};
      },
      "INT " + helpRange(wholeNumberRange(lo, hi)));
}

CLI::Validator seedNumber() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        uint64_t v = 0;
        if (!parseWhole(s, v)) return notASeed(s);
        return {};
      },
      "SEED in [0, 2^64-1]");
}

CLI::Validator finiteIn(double lo, double hi) {
  std::ostringstream os;
  os << "[" << lo << ", " << hi << "]";
  const std::string range = os.str();
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        const std::optional<double> v = parseFiniteNumber(s);
        if (!v || *v < lo || *v > hi)
          return "must be a finite number in " + range + ", got '" + s + "'";
        return {};
      },
      "REAL in " + range);
}

CLI::Validator finiteAtLeast(double lo) {
  std::ostringstream os;
  os << lo;
  const std::string bound = os.str();
  return CLI::Validator(
      [lo, bound](std::string& s) -> std::string {
        const std::optional<double> v = parseFiniteNumber(s);
        if (!v || *v < lo) return "must be a finite number ≥ " + bound + ", got '" + s + "'";
        return {};
      },
      "REAL " + helpRange("≥ " + bound));
}

CLI::Validator nonEmptyName() {
  return CLI::Validator(
      [](std::string& s) -> std::string { return s.empty() ? "must not be empty" : ""; }, "PATH");
}

CLI::Validator nonEmptyValue() {
  return CLI::Validator(
      [](std::string& s) -> std::string { return s.empty() ? "must not be empty" : ""; }, "");
}

void addRankOption(CLI::App* c, int64_t& rank) {
  c->add_option("--rank", rank,
                "with a run folder (multi-rank run): the rank whose recording to read")
      ->check(wholeNumber(0, 1 << 20));
}

std::string recordingOfRank(const std::string& path, int64_t rank) {
  if (!storage::isRunFolder(path)) {
    if (rank >= 0)
      throw Error("--rank needs a run folder (a multi-rank recording); " + path + " is not one");
    return path;
  }
  const storage::RunManifest m = storage::readManifest(path);
  if (rank < 0)
    throw Error(path + " is a run folder of " + std::to_string(m.worldSize) +
                " ranks: choose one with --rank 0.." + std::to_string(m.worldSize - 1));
  const std::string file = storage::rankPath(path, m, rank);
  storage::checkRankRun(path, m, rank, storage::Recording::open(file).run());
  return file;
}

namespace {

int run(int argc, char** argv) {
  CLI::App app{"keel: train, record and inspect models with the Keel engine"};
  app.require_subcommand(1);
  std::vector<Command> commands = {
      addTrainCommand(app),  addRecordCommand(app), addInspectCommand(app), addDiffCommand(app),
      addExportCommand(app), addOpsCommand(app),    addMemoryCommand(app),  addBenchCommand(app),
      addCkptCommand(app),   addLaunchCommand(app), addImportCommand(app)};

  if (argc > 1 && argv[1][0] != '-') {
    const std::string cmd = argv[1];
    bool known = false;
    std::string names;
    for (auto& c : commands) {
      known = known || c.app->get_name() == cmd;
      names += (names.empty() ? "" : ", ") + c.app->get_name();
    }
    if (!known) return fail("unknown command '" + cmd + "' (expected " + names + "; see --help)");
    // `keel export jsonl r.db`: CLI11 said "The following arguments were not expected: r.db
    // jsonl". A command made of subcommands names them.
    for (auto& c : commands) {
      if (c.app->get_name() != cmd || c.app->get_require_subcommand_min() == 0 || argc < 3 ||
          argv[2][0] == '-')
        continue;
      const std::string sub = argv[2];
      std::string subs;
      bool found = false;
      for (const CLI::App* s : c.app->get_subcommands({})) {
        found = found || s->get_name() == sub;
        subs += (subs.empty() ? "" : ", ") + s->get_name();
      }
      if (!found)
        return fail("keel " + cmd + ": unknown " + (cmd == "export" ? "format" : "subcommand") +
                    " '" + sub + "' (expected " + subs + "; see keel " + cmd + " --help)");
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::RequiredError& e) {
    // CLI11 checks required options before unknown ones: `keel record --steps 2 --bogus` said
    // "--output is required". A mistyped option is the error to name first.
    for (auto& c : commands)  // remaining(true): a nested subcommand's too (keel memory trace)
      if (!c.app->remaining(true).empty())
        return fail(CLI::ExtrasError(c.app->get_name(), c.app->remaining(true)).what());
    return fail(e.what());
  } catch (const CLI::ParseError& e) {
    return fail(e.what());
  }
  for (auto& c : commands)
    if (c.app->parsed()) return c.run();
  return fail("no command given (try --help)");
}

}  // namespace
}  // namespace keel::cli

KEEL_THREADS_PREINIT;  // See Note [OpenBLAS under an address-space limit]

namespace {
int runMain(int argc, char** argv);
}  // namespace

// The command's exit status is told to the process group before the process leaves: a rank that
// fails or stops does not wait for its peers at exit (Note [A failed rank ends the job]).
int main(int argc, char** argv) {
  const int rc = runMain(argc, argv);
  keel::dist::setExitStatus(rc);
  return rc;
}

namespace {
int runMain(int argc, char** argv) {
  keel::tuneBlasForThisCpu(argv);  // See Note [OpenBLAS core type]
  // A file-size limit (EFBIG) is a write error reported in one line, not a signal that kills the
  // process mid-write; a closed pipe (EPIPE) ends it quietly after the command returns.
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    const int rc = keel::cli::run(argc, argv);
    if (rc == keel::cli::kExitClosedPipe) return rc;  // stdout is broken for good: say nothing
    // What was printed must have reached stdout (`keel export csv r.db > /dev/full`); a reader
    // that closed the pipe (`keel ops | head`) ends it quietly (kExitClosedPipe).
    errno = 0;
    if (const int status = keel::cli::flushStdout(); status != 0) return status;
    return rc;
  } catch (const keel::Error& e) {
    return keel::cli::fail(e.what());
  } catch (const keel::storage::StorageError& e) {
    return keel::cli::fail(e.what());
  } catch (const std::bad_alloc&) {
    return keel::cli::fail(keel::outOfMemoryText());
  } catch (const std::system_error& e) {
    // std::thread's EAGAIN: no room for a thread's stack (an address-space limit) or too many.
    if (e.code() == std::errc::resource_unavailable_try_again)
      return keel::cli::fail("cannot start a thread (" + std::string(e.what()) + ")" +
                             keel::underAddressLimit());
    return keel::cli::fail(e.what());
  } catch (const std::exception& e) {
    return keel::cli::fail(e.what());
  } catch (...) {
    return keel::cli::fail("unknown exception");
  }
}
}  // namespace
