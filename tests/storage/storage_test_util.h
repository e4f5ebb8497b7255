// Helpers for the storage tests: a per-test temporary directory and small, fully populated
// records. Everything is deterministic; nothing here touches the engine.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "keel/storage/records.h"

namespace keel::storage::testing {

// A fresh directory under the system temp dir, removed when the test ends.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("keel_storage_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" +
            info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

 private:
  std::filesystem::path dir_;
};

// A tensor as an op lists it: role, position and identity (id, version); nothing else is set.
inline TensorRecord tensorRef(Role role, int index, uint64_t id, uint64_t version) {
  TensorRecord t;
  t.role = role;
  t.index = index;
  t.tensorId = id;
  t.version = version;
  return t;
}

inline RunInfo sampleRun() {
  RunInfo r;
  r.backend = "cpu-ref";
  r.device = "cpu";
  r.host = "host-ü";
  r.configJson = R"({"model":"gpt-mini","layers":2})";
  r.seed = 0xFFFF'FFFF'FFFF'FFF0ull;  // above INT64_MAX: stored bit for bit
  r.engineVersion = "0.1.0";
  r.startTimeUnixNs = 1'700'000'000'123'456'789;
  r.captureOptionsJson = R"({"md5":true})";
  return r;
}

// An op with two inputs and one output; `seq` varies everything that identifies it.
inline OpRecord sampleOp(uint64_t seq, int64_t step, Phase phase = Phase::Forward,
                         const std::string& name = "matmul",
                         const std::string& scope = "blocks.1.attn") {
  OpRecord o;
  o.seq = seq;
  o.step = step;
  o.phase = phase;
  o.name = name;
  o.attrsJson = R"({"transpose_b":true})";
  o.scope = scope;
  o.thread = 1;
  o.beginNs = static_cast<int64_t>(seq) * 1000;
  o.endNs = o.beginNs + 500;
  o.forwardSeq = phase == Phase::Backward ? seq / 2 : 0;
  o.stackId = static_cast<int64_t>(seq % 3);
  for (int i = 0; i < 3; ++i) {
    TensorRecord t;
    t.role = i < 2 ? Role::Input : Role::Output;
    t.index = i < 2 ? i : 0;
    t.tensorId = seq * 10 + static_cast<uint64_t>(i);
    t.version = static_cast<uint64_t>(i);
    t.bufferId = seq * 10 + 7;
    t.shape = {4, 16, 64};
    t.strides = {1024, 64, 1};
    t.offset = i * 8;
    t.dtype = "float32";
    t.device = "cpu";
    t.bytes = 4 * 16 * 64 * 4;
    t.md5 = "0123456789abcdef0123456789abcdef";
    t.md5Rounded = "fedcba9876543210fedcba9876543210";
    t.hasStats = true;
    t.stats = {-1.5, 2.25, 0.125, 0.75, 2.25, 0, 0, static_cast<int64_t>(seq % 5)};
    o.tensors.push_back(t);
  }
  return o;
}

}  // namespace keel::storage::testing
