// `keel diff a.db b.db`: aligns two recordings step by step and reports the first (and root)
// divergence with both call stacks. `keel diff RUN_A/ RUN_B/` does it rank by rank for two run
// folders of one layout; `keel diff RUN/ --replicas` checks a run's dp replicas against each
// other (Note [Replica check]). Exit status: 0 equal within tolerance, 1 divergent, 2 error.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cli_common.h"
#include "keel/analysis/ranks.h"
#include "keel/base/output_path.h"
#include "keel/storage/diff.h"
#include "keel/storage/reader.h"
#include "keel/storage/run_folder.h"

namespace keel::cli {
namespace {

struct DiffArgs {
  std::string a, b;
  double atol = 1e-6, rtol = 1e-4;
  uint64_t ulps = 0;
  bool json = false, mismatchesOnly = false, strict = false, replicas = false;
  std::string align = "auto";  // --align: auto | signature | module
};

void printStack(const storage::Recording& r, int64_t id, const char* label) {
  std::printf("  %s stack:\n", label);
  auto st = id >= 0 ? r.stack(id) : std::nullopt;
  if (!st) {
    std::printf("    (not recorded: use keel record --stacks)\n");
    return;
  }
  for (const auto& f : st->frames)
    std::printf("    %s  %s:%d\n", f.function.empty() ? "??" : f.function.c_str(),
                f.file.empty() ? "??" : f.file.c_str(), f.line);
}

storage::DiffOptions diffOptions(const DiffArgs& a) {
  storage::DiffOptions opt;
  opt.atol = a.atol;
  opt.rtol = a.rtol;
  opt.maxUlps = a.ulps;
  opt.mismatchesOnly = a.mismatchesOnly;
  opt.unmatchedIsDivergent = a.strict;
  opt.align = a.align == "module"      ? storage::DiffAlign::Module
              : a.align == "signature" ? storage::DiffAlign::Signature
                                       : storage::DiffAlign::Auto;
  return opt;
}

void printReport(const storage::Recording& ra, const storage::Recording& rb,
                 const storage::DiffReport& report, bool mismatchesOnly) {
  std::printf("%s", storage::toText(report, mismatchesOnly).c_str());
  if (report.root) {
    const storage::OpPair& p = report.root->pair;
    auto side = [](bool in, uint64_t seq) {
      return in ? "#" + std::to_string(seq) : std::string("none");
    };
    std::printf("\nroot divergence stacks (op %s in A, %s in B):\n", side(p.inA, p.seqA).c_str(),
                side(p.inB, p.seqB).c_str());
    // One stack when both runs called it from the same frames (the two copies read as a
    // difference; the ids differ between recordings).
    auto frames = [](const storage::Recording& r, int64_t id) {
      std::vector<std::string> out;
      if (auto st = id >= 0 ? r.stack(id) : std::nullopt)
        for (const auto& f : st->frames)
          out.push_back(f.function + " " + f.file + ":" + std::to_string(f.line));
      return out;
    };
    if (p.inA && p.inB && p.stackIdA >= 0 && p.stackIdB >= 0 &&
        frames(ra, p.stackIdA) == frames(rb, p.stackIdB)) {
      printStack(ra, p.stackIdA, "A and B");
    } else {
      if (p.inA) printStack(ra, p.stackIdA, "A");
      if (p.inB) printStack(rb, p.stackIdB, "B");
    }
    // A backward root's own stack is the autograd engine's: the forward op it differentiates is
    // where the user's code is (as keel inspect and the studio's inspector name it).
    const storage::Recording& r = p.inA ? ra : rb;
    if (auto op = r.op(p.inA ? p.seqA : p.seqB); op && op->forwardSeq != 0)
      if (auto fwd = r.op(op->forwardSeq)) {
        std::printf("  gradient of forward op #%llu %s (%s) in %s:\n",
                    static_cast<unsigned long long>(fwd->seq), fwd->name.c_str(),
                    fwd->scope.empty() ? "no scope" : fwd->scope.c_str(), p.inA ? "A" : "B");
        printStack(r, fwd->stackId, "its");
      }
  }
}

int runDiff(const DiffArgs& a) {
  storage::Recording ra = storage::Recording::open(a.a);
  storage::Recording rb = storage::Recording::open(a.b);
  // One file under two names is EQUAL whatever it holds: said (a mistyped second path read as
  // "the runs agree").
  if (const auto ia = fileIdentity(a.a); ia && ia == fileIdentity(a.b))
    warn("A and B are the same file (" + a.b + "): the recording is compared with itself");
  storage::DiffReport report = storage::diffRecordings(ra, rb, diffOptions(a));
  if (a.json) {
    std::printf("%s\n", storage::toJson(report).c_str());
    return storage::diffExitCode(report);
  }
  // A PyTorch recording's backend is "torch": its device says where it ran ("torch torch").
  auto where = [](const storage::RunInfo& run) {
    return run.backend == "torch" && !run.device.empty() ? run.device : run.backend;
  };
  std::printf("keel diff: A = %s (%s %s), B = %s (%s %s), ops paired by %s\n", a.a.c_str(),
              report.frameworkA.c_str(), where(ra.run()).c_str(), a.b.c_str(),
              report.frameworkB.c_str(), where(rb.run()).c_str(),
              report.options.align == storage::DiffAlign::Module ? "module, op kind and position"
                                                                 : "op signature");
  // One rank's file of a multi-rank run against another layout computes on another share of the
  // batch or of the weights: every op may differ for that alone (a DIVERGED whose root is a
  // shape). Say so, and what to compare instead.
  const storage::RunInfo runA = ra.run(), runB = rb.run();
  if (runA.worldSize != runB.worldSize || runA.layout != runB.layout) {
    // The folder a rank file sits in, when it is one.
    auto folderOf = [](const std::string& file) {
      std::string folder = std::filesystem::path(file).parent_path().string();
      if (folder.empty()) folder = ".";
      return storage::isRunFolder(folder) ? folder : std::string("FOLDER");
    };
    const bool ranksA = runA.worldSize > 1, ranksB = runB.worldSize > 1;
    const std::string command =
        "keel diff " + (ranksA ? folderOf(a.a) : a.a) + " " + (ranksB ? folderOf(a.b) : a.b);
    for (const bool isA : {true, false}) {
      const storage::RunInfo& run = isA ? runA : runB;
      const storage::RunInfo& other = isA ? runB : runA;
      if (run.worldSize <= 1) continue;
      std::printf(
          "note: %s is rank %lld of a %lld-rank run (%s), the other %s: its ops see its own "
          "share of the batch or weights, so they differ for that alone; compare the run "
          "folder%s instead (%s: by parameter)\n",
          isA ? "A" : "B", static_cast<long long>(run.rank), static_cast<long long>(run.worldSize),
          run.layout.c_str(), other.worldSize > 1 ? "a rank of another layout" : "one process",
          ranksA && ranksB ? "s" : "", command.c_str());
      if (ranksA && ranksB) break;  // one note names both
    }
  }
  printReport(ra, rb, report, a.mismatchesOnly);
  return storage::diffExitCode(report);
}

// Two runs of different layouts (a run folder against one process, or two folders): the same
// named parameters, their pieces joined (Note [Parameters across layouts]).
int runByParameter(const DiffArgs& a) {
  const analysis::ParameterReport r = analysis::compareParameters(a.a, a.b, a.atol, a.rtol);
  std::printf("%s", (a.json ? analysis::parameterJson(r) + "\n"
                            : analysis::parameterText(r, a.atol, a.rtol))
                        .c_str());
  return r.first ? 1 : 0;
}

// The step of a report's first divergence: its first diverged op's, else its first diverged
// loss's (recordings without tensor values), else none.
std::optional<int64_t> firstDivergentStep(const storage::DiffReport& r) {
  if (r.first) return r.first->pair.step;
  if (const storage::LossDiff* l = storage::firstLossDivergence(r)) return l->step;
  return std::nullopt;
}

// The ops that talk to other ranks.
bool isCollective(const std::string& name) {
  return name == "all_reduce" || name == "all_gather" || name == "reduce_scatter" ||
         name == "broadcast" || name == "all_to_all";
}

// "step 3, op #1253 all_reduce (dp_loss)", B's seq for an op only in B.
std::string pairText(const storage::OpPair& p) {
  return "step " + std::to_string(p.step) + ", op " +
         (p.inA ? "#" + std::to_string(p.seqA) : "B #" + std::to_string(p.seqB)) + " " + p.name +
         (p.scope.empty() ? "" : " (" + p.scope + ")");
}

// One rank's diff in a folder diff, with what the folder's verdict line says of it.
struct RankDiff {
  storage::Recording ra, rb;
  storage::DiffReport report;
  // Collectives on one side only (a rank that skipped or added one: its peers' waits and sums
  // are no longer the other run's), the first of them.
  int64_t collectivesOnlyInA = 0, collectivesOnlyInB = 0;
  std::optional<storage::OpPair> firstOneSided;
  int64_t opsOnlyInA = 0, opsOnlyInB = 0;  // other ops on one side only
  // Note [The rank that diverged first]: (step, collective, time into the step) of its first
  // divergence; none without one.
  std::optional<std::tuple<int64_t, int, int64_t>> firstKey;
  bool diverged() const {
    return storage::diffVerdict(report) == storage::DiffVerdict::Diverged ||
           collectivesOnlyInA + collectivesOnlyInB > 0;
  }
};

// Note [The rank that diverged first]: in a folder diff the ranks' first divergences are ordered
// by step, then a rank whose first divergence is an op of its own before one whose first is a
// collective — a collective's output differs when any rank's input to it does, so a difference
// made on rank 1 (a matmul) shows on rank 0 first at the all_reduce that brought it over, with
// rank 0's own inputs all equal (its "root") — then by the time into the step the op began (the
// ranks run in lockstep between collectives), then by rank.
std::optional<std::tuple<int64_t, int, int64_t>> firstKey(const RankDiff& d) {
  const std::optional<int64_t> step = firstDivergentStep(d.report);
  if (!step) return std::nullopt;
  if (!d.report.first) return std::tuple{*step, 0, INT64_MAX};  // losses only: no op
  const storage::OpPair& p = d.report.first->pair;
  const storage::Recording& rec = p.inB ? d.rb : d.ra;
  int64_t offset = INT64_MAX;
  if (const std::optional<storage::OpRecord> op = rec.op(p.inB ? p.seqB : p.seqA))
    for (const storage::StepRecord& st : rec.steps())
      if (st.step == p.step && st.beginNs > 0 && op->beginNs >= st.beginNs)
        offset = op->beginNs - st.beginNs;
  return std::tuple{*step, isCollective(p.name) ? 1 : 0, offset};
}

// What differs in one rank's setup alone ("B's run did not finish (failed: hang: ...)"), clipped:
// the whole line is in the rank's own report (keel diff A/rank-R.db B/rank-R.db).
std::string setupPhrase(const std::string& s) {
  return s.size() > 110 ? s.substr(0, 107) + "..." : s;
}

// The verdict line of rank r: its verdict and first divergence, its collectives or ops on one
// side only, where its difference came from, and the setup differences that are its own.
std::string rankLine(const RankDiff& d, const std::vector<std::string>& commonSetup,
                     std::optional<size_t> earliest, size_t r, const std::vector<RankDiff>& diffs) {
  const storage::DiffReport& report = d.report;
  const storage::DiffVerdict v = storage::diffVerdict(report);
  const bool oneSidedOnly = v != storage::DiffVerdict::Diverged && d.diverged();
  std::string line = v == storage::DiffVerdict::Diverged            ? "diverged"
                     : oneSidedOnly                                 ? "collectives differ"
                     : v == storage::DiffVerdict::ValuesNotCompared ? "no values compared"
                                                                    : "equal within tolerance";
  if (report.first) {  // --strict: the first may be an op of B only
    line += ": first at " + pairText(report.first->pair);
    if (isCollective(report.first->pair.name) && earliest && *earliest != r &&
        diffs[*earliest].firstKey && d.firstKey &&
        std::get<0>(*diffs[*earliest].firstKey) <= std::get<0>(*d.firstKey))
      line += ", a collective: the difference came through it from another rank (rank " +
              std::to_string(*earliest) + " diverged first)";
  } else if (const storage::LossDiff* l = storage::firstLossDivergence(report)) {
    line += ": the losses first at step " + std::to_string(l->step) +
            " (no op can be named without tensor values)";
  }
  if (d.collectivesOnlyInA + d.collectivesOnlyInB > 0) {
    auto n = [](int64_t k, const char* side) {
      return k > 0 ? std::to_string(k) + (k == 1 ? " collective" : " collectives") + " only in " +
                         side
                   : std::string();
    };
    std::string which = n(d.collectivesOnlyInA, "A");
    if (d.collectivesOnlyInB > 0)
      which += (which.empty() ? "" : " and ") + n(d.collectivesOnlyInB, "B");
    line += (report.first ? "; " : ": ") + which + ", the first at " + pairText(*d.firstOneSided) +
            " (a rank skipped or added a collective)";
  }
  if (d.opsOnlyInA + d.opsOnlyInB > 0 && v != storage::DiffVerdict::Diverged &&
      !report.options.unmatchedIsDivergent)
    line += "; " + std::to_string(d.opsOnlyInA + d.opsOnlyInB) +
            (d.opsOnlyInA + d.opsOnlyInB == 1 ? " op" : " ops") +
            " on one side only (--strict counts them)";
  for (const std::string& s : report.setup)
    if (std::find(commonSetup.begin(), commonSetup.end(), s) == commonSetup.end())
      line += "; " + setupPhrase(s);
  return line;
}

// Two run folders of one layout, rank by rank: a verdict line per rank (the setup differences
// every rank shares said once above), then the whole report of the rank that diverged first
// (Note [The rank that diverged first]). --json: {"verdict", "exit_code", "first_rank",
// "setup", "ranks": [{"rank", "verdict", "line", "setup", "collectives_only_in_a",
// "collectives_only_in_b", "report"}]} (docs/diff.md).
int runDiffFolders(const DiffArgs& a) {
  const storage::RunManifest ma = storage::readManifest(a.a);
  const storage::RunManifest mb = storage::readManifest(a.b);
  if (ma.dp != mb.dp || ma.tp != mb.tp || ma.ep != mb.ep || ma.cp != mb.cp || ma.zero != mb.zero ||
      ma.vocab != mb.vocab)
    return runByParameter(a);  // other layouts: by parameter name
  const storage::DiffOptions opt = diffOptions(a);
  std::vector<RankDiff> diffs;
  int status = 0;
  for (int64_t r = 0; r < ma.worldSize; ++r) {
    storage::Recording ra = storage::Recording::open(storage::rankPath(a.a, ma, r));
    storage::Recording rb = storage::Recording::open(storage::rankPath(a.b, mb, r));
    storage::checkRankRun(a.a, ma, r, ra.run());
    storage::checkRankRun(a.b, mb, r, rb.run());
    storage::DiffReport report = storage::diffRecordings(ra, rb, opt);
    RankDiff d{std::move(ra), std::move(rb), std::move(report), 0, 0, std::nullopt, 0, 0,
               std::nullopt};
    // Steps one run lacks or did not end (it hung, stopped or was killed there) are a setup
    // difference ("A has 3 steps, B 2"), not ops on one side.
    std::set<int64_t> endedA, endedB;
    for (const storage::StepRecord& st : d.ra.steps())
      if (st.endNs > 0) endedA.insert(st.step);
    for (const storage::StepRecord& st : d.rb.steps())
      if (st.endNs > 0) endedB.insert(st.step);
    auto oneSidedStep = [&](int64_t step) {
      return step > 0 && (!endedA.count(step) || !endedB.count(step));  // 0: initialisation
    };
    for (const storage::OpPair& p : d.report.pairs) {
      if ((p.inA && p.inB) || oneSidedStep(p.step)) continue;
      if (isCollective(p.name)) {
        ++(p.inA ? d.collectivesOnlyInA : d.collectivesOnlyInB);
        if (!d.firstOneSided) d.firstOneSided = p;
      } else {
        ++(p.inA ? d.opsOnlyInA : d.opsOnlyInB);
      }
    }
    d.firstKey = firstKey(d);
    status = std::max(status, d.diverged() ? 1 : storage::diffExitCode(d.report));
    diffs.push_back(std::move(d));
  }
  std::optional<size_t> earliest;  // Note [The rank that diverged first]
  for (size_t r = 0; r < diffs.size(); ++r)
    if (diffs[r].firstKey && (!earliest || *diffs[r].firstKey < *diffs[*earliest].firstKey))
      earliest = r;
  // The setup differences every rank has (seed, config, backend): said once.
  std::vector<std::string> common =
      diffs.empty() ? std::vector<std::string>() : diffs[0].report.setup;
  std::erase_if(common, [&](const std::string& s) {
    return std::any_of(diffs.begin(), diffs.end(), [&](const RankDiff& d) {
      return std::find(d.report.setup.begin(), d.report.setup.end(), s) == d.report.setup.end();
    });
  });
  const bool anyDiverged =
      std::any_of(diffs.begin(), diffs.end(), [](const RankDiff& d) { return d.diverged(); });
  const bool noneCompared =
      !diffs.empty() && std::all_of(diffs.begin(), diffs.end(), [](const RankDiff& d) {
        return storage::diffVerdict(d.report) == storage::DiffVerdict::ValuesNotCompared;
      });
  const std::string verdict = anyDiverged    ? "diverged"
                              : noneCompared ? "values-not-compared"
                                             : "equal";
  if (a.json) {
    nlohmann::json ranks = nlohmann::json::array();
    for (size_t r = 0; r < diffs.size(); ++r) {
      const RankDiff& d = diffs[r];
      const storage::DiffVerdict v = storage::diffVerdict(d.report);
      ranks.push_back(
          {{"rank", r},
           {"verdict", d.diverged()                                   ? "diverged"
                       : v == storage::DiffVerdict::ValuesNotCompared ? "values-not-compared"
                                                                      : "equal"},
           {"line", rankLine(d, common, earliest, r, diffs)},
           {"setup", d.report.setup},
           {"collectives_only_in_a", d.collectivesOnlyInA},
           {"collectives_only_in_b", d.collectivesOnlyInB},
           {"report", nlohmann::json::parse(storage::toJson(d.report))}});
    }
    const nlohmann::json j = {
        {"verdict", verdict},
        {"exit_code", status},
        {"first_rank", earliest ? nlohmann::json(*earliest) : nlohmann::json()},
        {"setup", common},
        {"ranks", ranks}};
    std::printf("%s\n", j.dump(2).c_str());
    return status;
  }
  std::printf("keel diff: A = %s, B = %s, %lld ranks (dp %lld x tp %lld), rank by rank\n",
              a.a.c_str(), a.b.c_str(), static_cast<long long>(ma.worldSize),
              static_cast<long long>(ma.dp), static_cast<long long>(ma.tp));
  for (const std::string& s : common) std::printf("  setup differs: %s\n", s.c_str());
  for (size_t r = 0; r < diffs.size(); ++r)
    std::printf("  rank %zu: %s\n", r, rankLine(diffs[r], common, earliest, r, diffs).c_str());
  if (earliest) {
    std::printf("\nrank %zu (the first to diverge):\n", *earliest);
    const RankDiff& d = diffs[*earliest];
    printReport(d.ra, d.rb, d.report, a.mismatchesOnly);
  }
  return status;
}

int runReplicas(const DiffArgs& a) {
  if (!a.b.empty()) return fail("--replicas checks one run folder; got a second path " + a.b);
  if (!storage::isRunFolder(a.a))
    return fail("--replicas needs a run folder (keel record under mpirun, --dp 2 or more); " + a.a +
                " is not one");
  const analysis::ReplicaReport r = analysis::checkReplicas(a.a);
  std::printf("%s", (a.json ? analysis::replicaJson(r) + "\n" : analysis::replicaText(r)).c_str());
  return r.first ? 1 : 0;
}

int runAnyDiff(const DiffArgs& a) {
  if (a.a.empty())  // CLI11's own words would be "a is required"
    return fail(
        "diff needs two recordings (or one run folder and --replicas): keel diff A.db B.db");
  if (a.replicas) return runReplicas(a);
  if (a.b.empty()) return fail("diff needs two recordings (or one run folder and --replicas)");
  const bool fa = storage::isRunFolder(a.a), fb = storage::isRunFolder(a.b);
  for (const auto& [path, folder] : {std::pair{&a.a, fa}, std::pair{&a.b, fb}}) {
    std::error_code ec;
    if (!folder && std::filesystem::is_directory(*path, ec))  // "recording X is a directory"
      return fail(storage::notARunFolder(*path));
  }
  if (fa && fb) return runDiffFolders(a);
  if (fa || fb) return runByParameter(a);  // a parallel run against one process
  return runDiff(a);
}

}  // namespace

Command addDiffCommand(CLI::App& root) {
  auto a = std::make_shared<DiffArgs>();
  CLI::App* c =
      root.add_subcommand("diff", "compare two recordings (or run folders, rank by rank) op by op");
  c->footer("Exit status: 0 equal within tolerance (or nothing to compare), 1 diverged, 2 error.");
  c->add_option("a", a->a, "recording A (.db) or run folder");
  c->add_option("b", a->b, "recording B (.db) or run folder");
  c->add_option("--atol", a->atol, "absolute tolerance")
      ->check(finiteAtLeast(0))
      ->capture_default_str();
  c->add_option("--rtol", a->rtol, "relative tolerance (against B)")
      ->check(finiteAtLeast(0))
      ->capture_default_str();
  c->add_option("--ulps", a->ulps, "also accept elements within N ULPs (0: off)")
      ->check(wholeNumber(0));
  c->add_flag("--json", a->json, "machine-readable report");
  c->add_flag("--mismatches-only", a->mismatchesOnly, "list only pairs that are not equal");
  c->add_flag("--strict", a->strict, "ops present in only one run count as divergent");
  c->add_option(
       "--align", a->align,
       "how ops are paired: signature (one program twice), module (across frameworks: "
       "a PyTorch run against a Keel run), auto (default: module when the frameworks differ)")
      ->check(CLI::IsMember({"auto", "signature", "module"}))
      ->capture_default_str();
  c->add_flag("--replicas", a->replicas,
              "A is a run folder: check that its dp replicas hold the same parameters, averaged "
              "gradients and updates (MD5s), and name the first difference");
  return {c, [a] { return runAnyDiff(*a); }};
}

}  // namespace keel::cli
