// Shared plumbing of the keel tool's commands: the one-line error convention and the command
// table. Invariant: every failure prints exactly one line "keel: error: ..." to stderr and the
// process exits with status 2.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace keel::cli {

inline constexpr int kExitError = 2;

// Prints "keel: error: <msg>" (newlines folded) to stderr; returns kExitError.
int fail(const std::string& msg);

// --alloc host|caching|vmm: the allocator for host tensors (default: KEEL_ALLOCATOR, else vmm).
void addAllocOption(CLI::App* c, std::string& kind);

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

}  // namespace keel::cli
