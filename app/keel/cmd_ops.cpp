// `keel ops`: lists every registered op with its inputs, whether it is differentiable, and the
// backends that have kernels for it.
#include <cstdio>
#include <string>

#include "cli_common.h"
#include "keel/registry.h"

namespace keel::cli {
namespace {

int runOps() {
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
        if (op.kernels[b].fn) {
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

}  // namespace

Command addOpsCommand(CLI::App& root) {
  CLI::App* ops = root.add_subcommand("ops", "list the registered ops and their kernels");
  return {ops, [] { return runOps(); }};
}

}  // namespace keel::cli
