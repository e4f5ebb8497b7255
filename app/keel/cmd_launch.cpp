// `keel launch -n N COMMAND ...`: runs `keel COMMAND ...` on N ranks through mpirun, adding what
// running as root and more ranks than cores need, so one machine and a cluster (--hostfile) use
// the same commands; and the multi-rank options every training command shares (--dp, --tp, ...).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli_common.h"
#include "keel/base/output_path.h"
#include "keel/base/text.h"
#include "keel/checkpoint.h"
#include "keel/dist.h"
#include "keel/error.h"
#include "keel/gpt_config.h"

namespace keel::cli {

void addParallelOptions(CLI::App* c, ParallelArgs& a) {
  c->add_option("--dp", a.dp,
                "data-parallel replicas (default: the launcher's ranks / --tp; keel/dist.h)")
      ->check(wholeNumber(1, 1 << 20));
  c->add_option("--tp", a.tp, "tensor-parallel ranks per replica (divides n_head and d_ff)")
      ->check(wholeNumber(1, 4096))
      ->capture_default_str();
  c->add_option("--collective-timeout", a.collectiveTimeout,
                "seconds a rank waits in a collective before the run is reported hung")
      ->check(finiteAtLeast(0.001))
      ->capture_default_str();
  c->add_flag("--check-collectives", a.checkCollectives,
              "before each collective, check every rank calls the same one (names a rank that "
              "skipped one or called it with another shape)");
  c->add_option("--ep", a.ep,
                "expert-parallel ranks: a MoE model's experts split across this many of the dp "
                "ranks (divides dp and n_expert)")
      ->check(wholeNumber(1, 4096))
      ->capture_default_str();
  c->add_option("--cp", a.cp,
                "context-parallel ranks: each row's sequence split across this many of the dp "
                "ranks, attention by a ring of keys and values (divides dp; zig-zag split)")
      ->check(wholeNumber(1, 4096))
      ->capture_default_str();
  c->add_flag("--vocab-parallel", a.vocab,
              "split the token embedding, lm_head and the cross entropy by vocabulary across "
              "the tensor-parallel ranks too (needs --tp; tp divides vocab_size)");
  c->add_flag("--zero", a.zero,
              "shard AdamW's state across the data-parallel ranks (gradients reduce-scattered, "
              "parameters all-gathered; checkpoints stay reshardable)");
}

namespace {

// The layout `a` asks for on `world` ranks, checked (throws keel::Error naming the option).
dist::Layout resolveParallel(const ParallelArgs& a, int world) {
  dist::Layout layout = dist::resolveLayout(a.dp, a.tp, world);
  KEEL_CHECK(!a.zero || layout.dp > 1,
             "--zero shards the optimizer state across data-parallel "
             "ranks, and this run has dp 1 (start more ranks: keel launch -n ",
             2 * layout.tp, " ... --dp 2)");
  layout.zero = a.zero;
  KEEL_CHECK(layout.dp % a.ep == 0, "parallel layout: --ep ", a.ep, " does not divide dp ",
             layout.dp, " (experts are split across data-parallel ranks: ep must divide dp)");
  layout.ep = a.ep;
  KEEL_CHECK(layout.dp % a.cp == 0, "parallel layout: --cp ", a.cp, " does not divide dp ",
             layout.dp,
             " (a row's sequence is split across data-parallel ranks: cp must divide dp)");
  layout.cp = a.cp;
  KEEL_CHECK(!a.vocab || layout.tp > 1,
             "--vocab-parallel splits the vocabulary across tensor-parallel ranks, and this run "
             "has tp 1 (add --tp 2 or more)");
  layout.vocab = a.vocab;
  return layout;
}

}  // namespace

void startProcessGroup(const ParallelArgs& a) {
  const dist::Layout layout = resolveParallel(a, dist::launcherWorldSize());
  dist::setOptions({a.collectiveTimeout, a.checkCollectives});
  if (layout.world() > 1 || dist::launchedByMpi()) dist::init(layout);
}

std::string selfPath() {
  std::vector<char> buf(4096);
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) throw Error("keel: cannot find its own binary (/proc/self/exe)");
  return std::string(buf.data(), size_t(n));
}

void checkConfigFound(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.empty() || fs::exists(fs::symlink_status(path, ec))) return;  // read, and named, later
  const fs::path installed =
      (fs::path(selfPath()).parent_path() / "../share/keel/configs" / fs::path(path).filename())
          .lexically_normal();
  if (fs::path(path).is_relative() && fs::is_regular_file(installed, ec))
    throw Error("--config " + path + ": no such file in " + fs::current_path(ec).string() +
                "; the installed one is " + installed.string() + " (--config " +
                installed.string() + ")");
}

namespace {

// The layout options among the command's words ("--dp 4", "--tp=2", "--zero"), or nullopt where
// one does not parse (the ranks then say what is wrong with it).
std::optional<ParallelArgs> parallelWords(const std::vector<std::string>& words) {
  ParallelArgs a;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    if (w == "--zero") a.zero = true;
    if (w == "--vocab-parallel") a.vocab = true;
    for (auto [name, field] :
         {std::pair{"--dp", &a.dp}, {"--tp", &a.tp}, {"--ep", &a.ep}, {"--cp", &a.cp}}) {
      std::string value;
      if (w == name && i + 1 < words.size())
        value = words[i + 1];
      else if (w.rfind(std::string(name) + "=", 0) == 0)
        value = w.substr(std::strlen(name) + 1);
      else
        continue;
      char* end = nullptr;
      const long v = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || v < 1 || v > (1 << 20)) return std::nullopt;
      *field = int(v);
    }
  }
  return a;
}

// The value of option `names` among the command's words ("--config x", "--config=x"); "" when
// absent.
std::string wordValue(const std::vector<std::string>& words,
                      std::initializer_list<const char*> names) {
  for (size_t i = 0; i < words.size(); ++i)
    for (const char* name : names) {
      if (words[i] == name && i + 1 < words.size()) return words[i + 1];
      if (words[i].rfind(std::string(name) + "=", 0) == 0)
        return words[i].substr(std::strlen(name) + 1);
    }
  return {};
}

// The mistakes in a multi-rank `train`'s checkpoint options that every rank would report (one
// line each, then mpirun's banner): --ckpt-tp, a --resume that is no checkpoint, a --ckpt-dir
// that holds another run's checkpoints or another run writes. Throws keel::Error in the ranks'
// words; a value that does not parse is left to the ranks.
void checkTrainCheckpointWords(const std::vector<std::string>& words) {
  KEEL_CHECK(wordValue(words, {"--ckpt-tp"}).empty(),
             "--ckpt-tp: a multi-rank run saves one file per rank; reshard its checkpoints with "
             "keel ckpt convert --target-tp N");
  const std::string resume = wordValue(words, {"--resume"});
  if (!resume.empty()) ckpt::resolveCheckpoint(resume);  // throws what the ranks would say
  const std::string dir = wordValue(words, {"--ckpt-dir"});
  if (dir.empty()) return;
  KEEL_CHECK(!folderLockHeld(dir), "--ckpt-dir ", dir,
             " is being written by another process; refusing to write it at the same time");
  if (!resume.empty()) return;  // the steps it resumes from are the ranks' to check
  auto number = [&](const char* name, int64_t fallback) {
    const std::string v = wordValue(words, {name});
    char* end = nullptr;
    const long long n = v.empty() ? fallback : std::strtoll(v.c_str(), &end, 10);
    return v.empty() || (*end == '\0' && n >= 0) ? int64_t(n) : int64_t(-1);
  };
  const int64_t steps = number("--steps", 200), every = number("--save-every", 0);
  if (steps >= 1 && every >= 0) checkCkptDirIsThisRuns(dir, "", 1, steps, every);
}

// The ranks one machine may start (more only waste it: each rank is a whole process with the
// model): 8 a core, at least 16; a cluster names its hosts (--hostfile).
int maxLocalRanks() {
  return std::max(16, 8 * int(std::max(1u, std::thread::hardware_concurrency())));
}

}  // namespace

Command addLaunchCommand(CLI::App& root) {
  struct Args {
    int ranks = 0;  // -n: required (checked in the callback: the command's words are extras)
    std::string hostfile;
    std::vector<std::string> command;
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = root.add_subcommand(
      "launch", "run a keel command on N ranks through mpirun (keel launch -n 4 train ...)");
  c->add_option("-n,--ranks", a->ranks, "number of ranks (required)")
      ->check(wholeNumber(1, 1 << 20));
  c->add_option("--hostfile", a->hostfile, "MPI hostfile (a cluster); default: this machine")
      ->check(nonEmptyName());
  // Everything from the first word that is not launch's own is the command, kept in order.
  c->prefix_command();
  c->footer("Then the keel command and its options: train ... or record ...");
  return {c, [a, c] {
            a->command = c->remaining();
            if (a->ranks == 0)
              return fail("keel launch: -n N, the number of ranks, is required (keel launch -n 4 " +
                          std::string(a->command.empty() ? "train" : a->command.front()) + " ...)");
            // mpirun's own error for a hostfile it cannot open is a banner and status 0.
            if (!a->hostfile.empty()) {
              std::error_code ec;
              if (!std::filesystem::exists(a->hostfile, ec))
                return fail("keel launch: --hostfile " + a->hostfile + ": no such file");
              requireRegularFile(a->hostfile, "the hostfile");
              if (::access(a->hostfile.c_str(), R_OK) != 0)
                return fail("keel launch: --hostfile " + a->hostfile + ": cannot read it (" +
                            std::strerror(errno) + ")");
            }
            if (a->command.empty())
              return fail("keel launch: which command? (keel launch -n 4 train --config ...)");
            const std::string& sub = a->command.front();
            if (sub != "train" && sub != "record")
              return fail("keel launch: runs train or record on many ranks, not '" + sub + "'");
            if (a->hostfile.empty() && a->ranks > maxLocalRanks())
              return fail("keel launch -n " + std::to_string(a->ranks) + ": more ranks than " +
                          "this machine runs (" + std::to_string(maxLocalRanks()) + " at most, " +
                          "8 a core; a cluster: --hostfile)");
            // A layout that does not fit the ranks, or the config (the built-in model's batch,
            // heads and experts), is one line here, not one per rank followed by mpirun's
            // report of a failed job and a run folder of failed recordings.
            if (const auto p = parallelWords(a->command)) {
              try {
                const dist::Layout l = resolveParallel(*p, a->ranks);
                const std::string config = wordValue(a->command, {"--config", "--workload-config"});
                if (!config.empty() && wordValue(a->command, {"--workload"}).empty()) {
                  std::optional<GptConfig> cfg;
                  try {
                    cfg = loadGptConfig(config);
                  } catch (const Error&) {  // the ranks say what is wrong with the config
                  }
                  if (cfg) checkGptLayout(*cfg, l.dp, l.tp, l.ep, l.cp);
                }
              } catch (const Error& e) {
                std::string why = e.what();
                auto replace = [&why](const std::string& from, const std::string& to) {
                  if (const size_t at = why.find(from); at != std::string::npos)
                    why.replace(at, from.size(), to);
                };
                replace(" were started (mpirun -np)", " are asked for (-n)");
                replace(" process was started (start it under mpirun -np N, or keel launch -n N)",
                        " is asked for (-n)");
                return fail("keel launch -n " + std::to_string(a->ranks) + ": " + why);
              }
            }
            if (sub == "train" && a->ranks > 1) try {
                checkTrainCheckpointWords(a->command);
              } catch (const Error& e) {
                return fail("keel launch -n " + std::to_string(a->ranks) + ": " + e.what());
              }
            std::vector<std::string> args = {"mpirun", "-np", std::to_string(a->ranks)};
            if (::geteuid() == 0) args.push_back("--allow-run-as-root");
            if (a->hostfile.empty() && a->ranks > int(std::thread::hardware_concurrency()))
              args.push_back("--oversubscribe");  // more ranks than cores on one machine
            if (!a->hostfile.empty()) {
              args.push_back("--hostfile");
              args.push_back(a->hostfile);
            }
            args.push_back(selfPath());
            args.insert(args.end(), a->command.begin(), a->command.end());
            std::vector<char*> argv;
            for (auto& s : args) argv.push_back(s.data());
            argv.push_back(nullptr);
            std::fflush(stdout);
            ::execvp("mpirun", argv.data());
            return fail("keel launch: cannot run mpirun (" + std::string(std::strerror(errno)) +
                        "): install Open MPI (openmpi-bin)");
          }};
}

}  // namespace keel::cli
