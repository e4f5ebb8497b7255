// `keel diff a.db b.db`: aligns two recordings step by step and reports the first (and root)
// divergence with both call stacks. Exit status: 0 equal within tolerance, 1 divergent, 2 error.
#include <cstdio>
#include <string>

#include "cli_common.h"
#include "keel/storage/diff.h"
#include "keel/storage/reader.h"

namespace keel::cli {
namespace {

struct DiffArgs {
  std::string a, b;
  double atol = 1e-6, rtol = 1e-4;
  uint64_t ulps = 0;
  bool json = false, mismatchesOnly = false, strict = false;
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

int runDiff(const DiffArgs& a) {
  storage::Recording ra = storage::Recording::open(a.a);
  storage::Recording rb = storage::Recording::open(a.b);
  storage::DiffOptions opt;
  opt.atol = a.atol;
  opt.rtol = a.rtol;
  opt.maxUlps = a.ulps;
  opt.mismatchesOnly = a.mismatchesOnly;
  opt.unmatchedIsDivergent = a.strict;
  // Ops with dumped values (keel record --dumps) are compared element by element.
  storage::DumpValues values = [&](uint64_t seq, int role, int index, bool sideA) {
    return (sideA ? ra : rb).dumpValues(seq, static_cast<storage::Role>(role), index);
  };
  storage::DiffReport report = storage::diffRuns(ra.allOps(), rb.allOps(), opt, values);
  if (a.json) {
    std::printf("%s\n", storage::toJson(report).c_str());
    return storage::diffExitCode(report);
  }
  std::printf("keel diff: A = %s (%s), B = %s (%s)\n", a.a.c_str(), ra.run().backend.c_str(),
              a.b.c_str(), rb.run().backend.c_str());
  std::printf("%s", storage::toText(report, a.mismatchesOnly).c_str());
  if (report.root) {
    std::printf("\nroot divergence stacks (op #%llu in A, #%llu in B):\n",
                static_cast<unsigned long long>(report.root->pair.seqA),
                static_cast<unsigned long long>(report.root->pair.seqB));
    printStack(ra, report.root->pair.stackIdA, "A");
    printStack(rb, report.root->pair.stackIdB, "B");
  }
  return storage::diffExitCode(report);
}

}  // namespace

Command addDiffCommand(CLI::App& root) {
  auto a = std::make_shared<DiffArgs>();
  CLI::App* c = root.add_subcommand("diff", "compare two recordings op by op");
  c->add_option("a", a->a, "recording A (.db)")->required();
  c->add_option("b", a->b, "recording B (.db)")->required();
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
  return {c, [a] { return runDiff(*a); }};
}

}  // namespace keel::cli
