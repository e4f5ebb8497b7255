// Resource limits a user may run Keel under (issue 20), through the real keel binary, each call
// bounded by `timeout` so a spin or a hang fails instead of stalling the suite. Under an
// address-space limit (prlimit --as) a run too small for OpenBLAS's work buffer is refused in one
// line, and a larger one trains on the threads that fit with a warning (Note [OpenBLAS under an
// address-space limit]); under an address-space or file-size limit (prlimit --fsize) the VMM
// allocator gives way to the caching allocator with a warning, and the recording names the
// allocator that ran (Note [VMM fallback]).
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "keel/base/text.h"
#include "test_util.h"

namespace {

using keel::test::CliResult;
using keel::test::expectOneLineError;

constexpr const char* kTrain = "train --config tests/fixtures/gpt-tiny.json --steps 2";

std::string mib(int n) {
  return std::to_string(int64_t(n) << 20);
}

std::vector<std::string> linesOf(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The CPUs fitThreadsToAddressLimit counts: what OpenBLAS or Keel's pool would start.
long cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const long allowed = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  return std::max<long>({sysconf(_SC_NPROCESSORS_ONLN), allowed, 1});
}

std::string vmmFallback(const std::string& limit) {
  return "keel: warning: vmm allocator: " + limit + ": using the caching allocator";
}

class KeelLimits : public keel::test::TempDirTest {
 protected:
  void SetUp() override {
#if defined(__SANITIZE_ADDRESS__)
    GTEST_SKIP() << "AddressSanitizer reserves terabytes of shadow memory: it cannot run under "
                    "an address-space limit";
#endif
    TempDirTest::SetUp();
  }
  // `keel args` under `prlimit limit`; 124 (timeout's status) if it spun or hung.
  CliResult keel(const std::string& limit, const std::string& args) {
    return keel::test::runKeelCli(args, dir_.string(), "timeout 60 prlimit " + limit);
  }
  std::string q(const std::string& name) {  // (appended: GCC 12's -Wrestrict misfires on + here)
    std::string s(1, '\'');
    s += (dir_ / name).string();
    s += '\'';
    return s;
  }
};

// 72, 80 and 128 MiB cannot hold OpenBLAS's 128 MiB work buffer beside the program: one line,
// exit 2 (at 64 MiB OpenBLAS used to exit with status 130 before main; at 128 MiB the first sgemm
// spun forever retrying its buffer). Below the program's own mappings (about 65 MiB of libraries
// since 2026-12-07) the dynamic loader itself refuses to start it, before any of Keel runs.
TEST_F(KeelLimits, AnAddressSpaceTooSmallForOpenBlasIsRefusedInOneLine) {
  for (int m : {72, 80, 128}) {
    SCOPED_TRACE(std::to_string(m) + " MiB");
    expectOneLineError(keel("--as=" + mib(m), kTrain),
                       "the address-space limit (ulimit -v) of " +
                           keel::formatBytes(uint64_t(m) << 20) +
                           " leaves no room for OpenBLAS's 128 MiB work buffer (");
  }
}

// 256 and 512 MiB train on one thread (Keel's pool and OpenBLAS's), saying so once, and on the
// caching allocator, saying why: the VMM allocator cannot reserve its 64 GiB of addresses. (From
// 96 to 192 MiB OpenBLAS's own worker used to spin at exit; at 384 MiB a pool thread's sgemm.)
TEST_F(KeelLimits, UnderAnAddressSpaceLimitARunTrainsOnTheThreadsThatFit) {
  for (int m : {256, 512}) {
    SCOPED_TRACE(std::to_string(m) + " MiB");
    const std::string limit = keel::formatBytes(uint64_t(m) << 20);
    CliResult r = keel("--as=" + mib(m), kTrain);
    ASSERT_EQ(r.status, 0) << r.err;
    std::vector<std::string> expected;
    if (cpus() > 1)
      expected.push_back("keel: warning: the address-space limit (ulimit -v) of " + limit +
                         " leaves room for fewer compute threads than the " +
                         std::to_string(cpus()) +
                         " CPUs (each maps a 128 MiB OpenBLAS work buffer): running with "
                         "OPENBLAS_NUM_THREADS=1 KEEL_NUM_THREADS=1 (set them to choose)");
    expected.push_back(
        vmmFallback("cannot reserve 64.0 GiB of addresses under the address-space "
                    "limit (ulimit -v) of " +
                    limit));
    EXPECT_EQ(linesOf(r.err), expected);
    EXPECT_NE(r.out.find(", backend cpu, 1 thread, seed 0\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("step 2/2  loss 5.4588"), std::string::npos) << r.out;
  }
}

// A model that does not fit in what the limit leaves (gpt-mini in 256 MiB, beside OpenBLAS's
// buffer) fails in one line naming the limit: the allocator's out-of-memory line, or a C++
// allocation that failed (it used to print a bare "std::bad_alloc"). The thread counts and the
// allocator are chosen here, so no warning is printed.
TEST_F(KeelLimits, AModelThatDoesNotFitTheLimitFailsInOneLineNamingIt) {
  const std::string quiet = "--as=" + mib(256) + " env OPENBLAS_NUM_THREADS=1 KEEL_NUM_THREADS=1";
  const std::string mini = " --config configs/gpt-mini.json --steps 2 --alloc caching";
  for (const std::string& cmd : {"train" + mini, "record" + mini + " -o " + q("r.db")}) {
    SCOPED_TRACE(cmd);
    const CliResult r = keel(quiet, cmd);
    // Which allocation fails first (the caching allocator's or a C++ one) depends on the layout.
    expectOneLineError(r, "out of memory ");
    EXPECT_EQ(r.err.rfind(cmd[0] == 't' ? "keel: error: out of memory "
                                        : "keel: error: workload 'gpt' failed in step 1: out of "
                                          "memory ",
                          0),
              0u)
        << r.err;
    EXPECT_NE(r.err.find(" under the address-space limit (ulimit -v) of 256 MiB"),
              std::string::npos)
        << r.err;
  }
}

// A config that fits the machine but not the address-space limit is refused up front naming the
// limit (it said "more than this machine's 512 MiB of memory", and the machine had 24 GiB).
TEST_F(KeelLimits, AConfigBeyondTheAddressSpaceLimitIsRefusedNamingTheLimit) {
  std::ofstream(dir_ / "wide.json")
      << R"({"name": "wide", "vocab_size": 256, "seq_len": 64, "n_layer": 2, "n_head": 4,
            "d_model": 2048, "d_ff": 8192, "batch_size": 4})";
  const CliResult r = keel("--as=" + mib(512) + " env OPENBLAS_NUM_THREADS=1 KEEL_NUM_THREADS=1",
                           "train --config " + q("wide.json") + " --steps 1");
  expectOneLineError(r, "wide.json: the model needs about ");
  EXPECT_NE(r.err.find(" to train, more than the address-space limit (ulimit -v) of 512 MiB: "
                       "parameters and optimizer state "),
            std::string::npos)
      << r.err;
}

// A failure under a limit ends the process at once: it used to print Keel's error and then hang
// at exit, OpenBLAS's worker retrying its buffer.
TEST_F(KeelLimits, AnErrorUnderAnAddressSpaceLimitDoesNotHangAtExit) {
  for (int m : {96, 128, 192})
    expectOneLineError(keel("--as=" + mib(m), "inspect " + q("missing.db")), "no such file");
}

// keel memory replay under a limit too small for the VMM's reservation: with both allocators
// asked for, the caching allocator's row and a warning (it printed half a table, then failed);
// the VMM asked for alone is one line before any table.
TEST_F(KeelLimits, MemoryReplayLeavesOutAVmmThatCannotReserve) {
  {
    std::ofstream t(dir_ / "t.txt");
    t << "a 1 100\na 2 5000\nf 1\n";
  }
  const CliResult both = keel("--as=" + mib(2048), "memory replay " + q("t.txt"));
  ASSERT_EQ(both.status, 0) << both.err;
  EXPECT_NE(both.out.find("\ncaching "), std::string::npos) << both.out;
  EXPECT_EQ(both.out.find("\nvmm "), std::string::npos) << both.out;
  EXPECT_EQ(both.err.rfind("keel: warning: the vmm allocator is left out: vmm allocator: cannot "
                           "reserve ",
                           0),
            0u)
      << both.err;
  const CliResult vmm =
      keel("--as=" + mib(2048), "memory replay " + q("t.txt") + " --allocator vmm");
  expectOneLineError(vmm, "vmm allocator: cannot reserve ");
  EXPECT_EQ(vmm.out.find("allocator "), std::string::npos) << vmm.out;  // no table header
}

// A file-size limit below the VMM allocator's 64 GiB memfd: `keel train` and `keel record` run on
// the caching allocator with one warning, and the recording says so (it used to fail: "vmm
// allocator: ftruncate failed: File too large"). Asking for vmm explicitly falls back the same way.
TEST_F(KeelLimits, UnderAFileSizeLimitARunUsesTheCachingAllocator) {
  const std::string fsize = "--fsize=" + mib(64);
  const std::string warning = vmmFallback(
      "its memfd cannot grow to 64.0 GiB under the file-size limit (ulimit -f) of 64.0 MiB");
  CliResult t = keel(fsize, kTrain);
  EXPECT_EQ(t.status, 0) << t.err;
  EXPECT_EQ(t.err, warning + "\n");
  EXPECT_NE(t.out.find("step 2/2  loss 5.4588"), std::string::npos) << t.out;
  for (const std::string alloc : {"", " --alloc vmm"}) {
    CliResult r = keel(fsize, "record --config tests/fixtures/gpt-tiny.json --steps 2 --allocator" +
                                  alloc + " -o " + q("r.db"));
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err, warning + "\n");
    CliResult i = keel::test::runKeelCli("inspect " + q("r.db"), dir_.string());
    ASSERT_EQ(i.status, 0) << i.err;
    EXPECT_NE(i.out.find(", seed 0, allocator caching, keel "), std::string::npos) << i.out;
  }
  // keel memory trace traces the requests on the caching allocator; keel bench allocator, whose
  // subject is the VMM allocator, refuses in one line.
  CliResult m = keel(
      fsize, "memory trace " + q("t.trace") + " --config tests/fixtures/gpt-tiny.json --steps 1");
  EXPECT_EQ(m.status, 0) << m.err;
  EXPECT_NE(m.out.find("trace " + dir_.string() + "/t.trace: "), std::string::npos) << m.out;
  CliResult b = keel(fsize, "bench allocator --config tests/fixtures/gpt-tiny.json");
  EXPECT_EQ(b.status, 2);
  EXPECT_NE(b.err.find("keel: error: bench allocator measures the VMM allocator, which cannot run "
                       "here: vmm allocator: its memfd cannot grow to 64.0 GiB under the "
                       "file-size limit (ulimit -f) of 64.0 MiB\n"),
            std::string::npos)
      << b.err;
}

}  // namespace
