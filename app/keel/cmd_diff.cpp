// `keel diff a.db b.db`: aligns two recordings step by step and reports the first (and root)
// divergence with both call stacks. `keel diff RUN_A/ RUN_B/` does it rank by rank for two run
// folders of one layout; `keel diff RUN/ --replicas` checks a run's dp replicas against each
// other (Note [Replica check]). Exit status: 0 equal within tolerance, 1 divergent, 2 error.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_common.h"
#include "keel/analysis/folder_diff.h"
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

// Two run folders of one layout, rank by rank: a verdict line per rank (the setup differences
// every rank shares said once above), then the whole report of the rank that diverged first
// (Note [The rank that diverged first]); --json: analysis::folderDiffJson (docs/diff.md).
int runDiffFolders(const DiffArgs& a) {
  if (!analysis::sameLayout(storage::readManifest(a.a), storage::readManifest(a.b)))
    return runByParameter(a);  // other layouts: by parameter name
  const analysis::FolderDiff fd = analysis::diffRunFolders(a.a, a.b, diffOptions(a));
  if (a.json) {
    std::printf("%s\n", analysis::folderDiffJson(fd).c_str());
    return fd.exitCode;
  }
  const storage::RunManifest& ma = fd.manifestA;
  std::printf("keel diff: A = %s, B = %s, %lld ranks (dp %lld x tp %lld), rank by rank\n",
              a.a.c_str(), a.b.c_str(), static_cast<long long>(ma.worldSize),
              static_cast<long long>(ma.dp), static_cast<long long>(ma.tp));
  for (const std::string& s : fd.commonSetup) std::printf("  setup differs: %s\n", s.c_str());
  for (size_t r = 0; r < fd.ranks.size(); ++r)
    std::printf("  rank %zu: %s\n", r, fd.rankLine(r).c_str());
  if (fd.earliest) {
    std::printf("\nrank %zu (the first to diverge):\n", *fd.earliest);
    const analysis::RankDiff& d = fd.ranks[*fd.earliest];
    printReport(d.ra, d.rb, d.report, a.mismatchesOnly);
  }
  return fd.exitCode;
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
  c->add_flag("--mismatches-only", a->mismatchesOnly,
              "list only mismatches: pairs outside tolerance, ops on one side only");
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
