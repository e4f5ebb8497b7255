// `keel ops`: without a file, lists every registered op with its inputs, whether it is
// differentiable, and the backends that have kernels for it (--markdown: docs/ops.md's tables;
// --kernels: each backend's kernel variant); with a recording, a table of the op calls it holds
// (--kernels: with the kernel that ran each),
// filtered by step, phase, op name and scope.
#include <cstdio>
#include <memory>
#include <set>
#include <string>

#include "cli_common.h"
#include "keel/base/text.h"
#include "keel/registry.h"
#include "keel/storage/export.h"
#include "keel/storage/reader.h"

namespace keel::cli {
namespace {

// Backends whose kernels a listing shows: all, or one (--backend).
bool shown(int b, int only) {
  return only < 0 || b == only;
}

int runOps(int only) {
  const keel::Registry& reg = keel::Registry::get();
  std::printf("%-24s %-7s %-5s %s\n", "OP", "INPUTS", "GRAD", "KERNELS");
  for (int i = 0; i < reg.size(); ++i) {
    const keel::OpDef& op = reg.op(i);
    std::string inputs = op.numInputs < 0 ? "1+" : std::to_string(op.numInputs);
    std::string kernels;
    if (op.view) {
      kernels = "view (all backends)";
    } else {
      for (int b = 0; b < keel::kNumBackends; ++b)
        if (op.kernels[b].fn && shown(b, only)) {
          if (!kernels.empty()) kernels += ' ';
          kernels += keel::backendName(keel::Backend(b));
        }
      if (kernels.empty()) kernels = "-";
    }
    if (op.mutatesInputs) kernels += "  (in place)";
    std::printf("%-24s %-7s %-5s %s\n", op.name.c_str(), inputs.c_str(), op.backward ? "yes" : "no",
                kernels.c_str());
  }
  std::printf("%d ops\n", reg.size());
  return 0;
}

// One line per op and backend with a kernel: the kernel's variant (Note [Kernel identity]), what
// `keel diff` compares when two runs' kernels differ. Views run no kernel: one line, "view".
int runKernels(int only) {
  const keel::Registry& reg = keel::Registry::get();
  std::printf("%-28s %-8s %s\n", "OP", "BACKEND", "VARIANT");
  int kernels = 0, views = 0;
  for (int i = 0; i < reg.size(); ++i) {
    const keel::OpDef& op = reg.op(i);
    if (op.view) {
      std::printf("%-28s %-8s %s\n", op.name.c_str(), "all", "view (no kernel)");
      ++views;
      continue;
    }
    for (int b = 0; b < keel::kNumBackends; ++b) {
      const keel::KernelEntry& k = op.kernels[b];
      if (!k.fn || !shown(b, only)) continue;
      const std::string backend(keel::backendName(keel::Backend(b)));
      std::printf("%-28s %-8s %s\n", op.name.c_str(), backend.c_str(),
                  k.variant.empty() ? "(not described)" : k.variant.c_str());
      ++kernels;
    }
  }
  std::printf("%d kernels, %d views\n", kernels, views);
  return 0;
}

struct OpsArgs {
  std::string recording, phase, name, scope;
  int64_t step = -1;
  int64_t limit = -1;
  int64_t rank = -1;
  std::string backend;
  bool markdown = false;
  bool kernels = false;
};

// The backend a registry listing shows (-1: all), or fails. The CUDA backend's kernels are loaded
// (Note [CUDA backend plugin]) only for a listing that shows them: all backends, where it can be
// loaded, or --backend cuda, which insists on it.
int chooseBackend(const std::string& name, int* only) {
  *only = -1;
  if (name.empty()) {
    (void)keel::loadCudaBackend();
    return 0;
  }
  keel::Device d;
  try {
    d = keel::Device(name);
  } catch (const keel::Error& e) {
    return fail(std::string("--backend: ") + e.what());
  }
  if (d.backend == keel::Backend::Cuda)
    if (const std::string why = keel::loadCudaBackend(); !why.empty())
      return fail("the cuda backend is not available: " + why);
  *only = int(d.backend);
  return 0;
}

int runRecordedOps(const OpsArgs& a) {
  storage::Recording rec = storage::Recording::open(recordingOfRank(a.recording, a.rank));
  storage::OpQuery q;
  if (a.step >= 0) q.step = a.step;
  // A step the recording does not have is an error, as in keel export graph (an empty table
  // looked like a step without ops); a filter that matches nothing in a real step is not.
  if (a.step >= 0) {
    storage::OpQuery any;
    any.step = a.step;
    any.limit = 1;
    any.withTensors = false;
    if (rec.ops(any).empty()) {
      // A step the capture left out (--step-range, --no-graph) says so: it read like a damaged
      // recording.
      const std::string why = whyNoOps(rec.run(), a.step);
      if (!why.empty()) return fail("recording " + a.recording + ": " + why);
      // The steps it has, so the next try is a right one.
      const auto steps = rec.steps();
      std::string has = " (it has no steps)";
      if (steps.size() == 1) has = " (it has step " + std::to_string(steps.front().step) + ")";
      if (steps.size() > 1)
        has = " (it has steps " + std::to_string(steps.front().step) + " to " +
              std::to_string(steps.back().step) + ")";
      return fail("recording " + a.recording + " has no ops in step " + std::to_string(a.step) +
                  has);
    }
  }
  if (!a.phase.empty()) {
    q.phase = parsePhase(a.phase);
    if (!q.phase)
      return fail("--phase: expected forward, backward or optimizer, got '" + a.phase + "'");
  }
  if (!a.name.empty()) q.name = a.name;
  if (!a.scope.empty()) q.scopePrefix = a.scope;
  q.limit = a.limit;
  auto ops = rec.ops(q);
  // --kernels: the kernel that ran each call (Note [Kernel identity]) instead of its tensors.
  std::printf("%8s %5s %-9s %-28s %-28s %9s  %-16s %s\n", "SEQ", "STEP", "PHASE", "OP", "SCOPE",
              "TIME(us)", "MD5(out0)",
              a.kernels ? "KERNEL (variant; run-time parameters)" : "INPUTS -> OUTPUTS");
  for (const auto& op : ops) {
    std::string md5 = "-";
    for (const auto& t : op.tensors)
      if (t.role == storage::Role::Output && !t.md5.empty()) {
        md5 = t.md5.substr(0, 16);
        break;
      }
    if (a.kernels) {
      const storage::KernelRecord& k = op.kernel;
      const std::string kernel =
          k.empty() ? std::string("- (no kernel recorded)")
                    : k.backend + " " + k.variant + (k.params.empty() ? "" : "; " + k.params);
      std::printf("%8llu %5lld %-9s %-28s %-28s %9.1f  %-16s %s\n",
                  static_cast<unsigned long long>(op.seq), static_cast<long long>(op.step),
                  phaseName(op.phase).data(), op.name.c_str(),
                  op.scope.empty() ? "-" : op.scope.c_str(), double(op.endNs - op.beginNs) / 1e3,
                  md5.c_str(), kernel.c_str());
      continue;
    }
    std::printf("%8llu %5lld %-9s %-28s %-28s %9.1f  %-16s %s -> %s\n",
                static_cast<unsigned long long>(op.seq), static_cast<long long>(op.step),
                phaseName(op.phase).data(), op.name.c_str(),
                op.scope.empty() ? "-" : op.scope.c_str(), double(op.endNs - op.beginNs) / 1e3,
                md5.c_str(), storage::tensorList(op, storage::Role::Input).c_str(),
                storage::tensorList(op, storage::Role::Output).c_str());
  }
  std::printf("%zu op calls\n", ops.size());
  // "0 op calls" of a --no-graph recording: why, on stderr (the table itself is right).
  if (ops.empty())
    if (const std::string why = whyNoOps(rec.run(), -1); !why.empty()) {
      warn("recording " + a.recording + ": " + why);
      return 0;
    }
  // A --scope that names no module of the run (mistyped): the modules it has, on stderr.
  if (ops.empty() && !a.scope.empty()) {
    storage::OpQuery all;
    if (a.step >= 0) all.step = a.step;
    all.withTensors = false;
    std::set<std::string> top;
    bool within = false;
    for (const storage::OpRecord& op : rec.ops(all)) {
      within = within || scopeWithin(op.scope, a.scope);
      if (!op.scope.empty()) top.insert(op.scope.substr(0, op.scope.find('.')));
    }
    if (!within) {
      std::string names;
      for (const std::string& t : top) names += (names.empty() ? "" : ", ") + t;
      warn("no op ran in scope '" + a.scope + "'" +
           (a.step >= 0 ? " in step " + std::to_string(a.step) : std::string()) +
           (names.empty() ? std::string() : " (its top-level scopes: " + names + ")"));
    }
  }
  return 0;
}

}  // namespace

Command addOpsCommand(CLI::App& root) {
  auto a = std::make_shared<OpsArgs>();
  CLI::App* ops = root.add_subcommand(
      "ops", "list the registered ops, or the op calls of a recording (keel ops run.db --step 2)");
  ops->add_option("recording", a->recording, "recording file (.db); omit to list the registry")
      ->check(nonEmptyName());
  ops->add_option("--step", a->step, "only this step (0: initialisation)")->check(wholeNumber(0));
  ops->add_option("--phase", a->phase, "forward | backward | optimizer")->check(nonEmptyValue());
  ops->add_option("--name", a->name, "only this op name")->check(nonEmptyValue());
  ops->add_option("--scope", a->scope, "only ops under this module scope (e.g. blocks.1)")
      ->check(nonEmptyValue());
  ops->add_option("--limit", a->limit, "at most N rows")->check(wholeNumber(0));
  addRankOption(ops, a->rank);
  ops->add_flag("--markdown", a->markdown,
                "print the registry as docs/ops.md's tables (between its generated markers)");
  ops->add_option("--backend", a->backend,
                  "only this backend's kernels (cpu, cpu-ref, cuda) in the registry listings");
  ops->add_flag("--kernels", a->kernels,
                "print each op's kernel variant per backend (what decides its numerics); with a "
                "recording, the kernel that ran each call");
  return {
      ops, [a] {
        // The filters pick op calls of a recording: without one they would be ignored.
        if (a->recording.empty()) {
          const char* given = a->step >= 0        ? "--step"
                              : !a->phase.empty() ? "--phase"
                              : !a->name.empty()  ? "--name"
                              : !a->scope.empty() ? "--scope"
                              : a->limit >= 0     ? "--limit"
                                                  : nullptr;
          if (given)
            return fail(std::string(given) +
                        " filters a recording's op calls: name the recording (keel ops RUN.db " +
                        given + " ...)");
        }
        if ((!a->recording.empty() || a->markdown) && !a->backend.empty())
          return fail("--backend filters the registry listings (keel ops, keel ops --kernels)");
        // --markdown documents the dtypes every backend shares: nothing to load for it.
        int only = -1;
        if (a->recording.empty() && !a->markdown)
          if (int rc = chooseBackend(a->backend, &only)) return rc;
        if (a->kernels) {
          if (a->markdown) return fail("--kernels and --markdown are two different lists");
          if (a->recording.empty()) return runKernels(only);
        }
        if (a->markdown) {
          if (!a->recording.empty()) return fail("--markdown lists the registry, not a file");
          std::fputs(keel::opsMarkdown(keel::Registry::get()).c_str(), stdout);
          return 0;
        }
        if (a->recording.empty() && a->rank >= 0)
          return fail("--rank needs a recording (a run folder)");
        return a->recording.empty() ? runOps(only) : runRecordedOps(*a);
      }};
}

}  // namespace keel::cli
