// Helpers for the Qt tests: fixture recordings made by the real `keel` binary (so they are what a
// user records), and waiting for a RunSource signal.
#pragma once
#include <QString>
#include <string>

namespace keel::views::test {

// A fresh temporary directory for this test binary (removed at exit).
QString tempDir();

// Runs `keel record --config tests/fixtures/<config> -o <out> <extra>` with `env` (e.g.
// "KEEL_TEST_PERTURB=matmul:5"); fails the test (QFAIL-style message, returns false) on error.
bool recordFixture(const QString& out, const std::string& extra, const std::string& env = "",
                   const std::string& config = "gpt-tiny.json");

// Runs the keel binary with `args`; returns its exit status (stdout/stderr go to `output`).
int runKeel(const std::string& args, std::string* output = nullptr, const std::string& env = "");

}  // namespace keel::views::test
