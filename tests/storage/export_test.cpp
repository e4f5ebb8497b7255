// Exports as text: Chrome trace JSON events; CSV rows and quoting. (The graph's DOT is analysis/'s:
// tests/analysis/graph_dot_test.cpp.)
#include <gtest/gtest.h>

#include <algorithm>

#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "keel/storage/export.h"
#include "storage_test_util.h"

namespace keel::storage {
namespace {

// Two-by-three float32 tensors: the exports print shapes and dtypes.
TensorRecord tensor(Role role, int index, uint64_t id, uint64_t version) {
  TensorRecord t = testing::tensorRef(role, index, id, version);
  t.shape = {2, 3};
  t.dtype = "float32";
  return t;
}

OpRecord op(uint64_t seq, const std::string& name, const std::string& scope, Phase phase,
            std::vector<TensorRecord> tensors, uint64_t fwd = 0) {
  OpRecord o;
  o.seq = seq;
  o.step = 1;
  o.name = name;
  o.scope = scope;
  o.phase = phase;
  o.tensors = std::move(tensors);
  o.forwardSeq = fwd;
  o.beginNs = int64_t(seq) * 1000;
  o.endNs = o.beginNs + 500;
  return o;
}

std::vector<OpRecord> smallGraph() {
  return {op(1, "matmul", "blocks.0.attn", Phase::Forward,
             {tensor(Role::Input, 0, 10, 0), tensor(Role::Input, 1, 11, 0),
              tensor(Role::Output, 0, 12, 0)}),
          op(2, "relu", "blocks.0", Phase::Forward,
             {tensor(Role::Input, 0, 12, 0), tensor(Role::Output, 0, 13, 0)}),
          op(3, "relu_grad", "blocks.0", Phase::Backward,
             {tensor(Role::Input, 0, 13, 0), tensor(Role::Output, 0, 14, 0)}, 2),
          op(4, "add", "", Phase::Forward,
             {tensor(Role::Input, 0, 12, 5), tensor(Role::Output, 0, 15, 0)})};
}

// A recorded string need not be UTF-8: the trace replaces the bad bytes (U+FFFD) instead of
// failing with nlohmann's bare type_error 316.
TEST(ExportTrace, InvalidUtf8InRecordedStringsIsReplaced) {
  std::vector<OpRecord> ops = smallGraph();
  ops[0].scope = std::string("blocks.\xff\xfe.attn");
  const std::string text = toChromeTrace(ops, {});
  auto j = nlohmann::json::parse(text);
  bool found = false;
  for (const auto& e : j["traceEvents"])
    if (e.dump().find("blocks.\xef\xbf\xbd\xef\xbf\xbd.attn") != std::string::npos) found = true;
  EXPECT_TRUE(found) << text.substr(0, 400);
}

TEST(ExportTrace, OneCompleteEventPerOpAndStep) {
  StepRecord s;
  s.step = 1;
  s.beginNs = 0;
  s.endNs = 9000;
  s.loss = 2.5;
  auto j = nlohmann::json::parse(toChromeTrace(smallGraph(), {s}));
  const auto& ev = j["traceEvents"];
  int complete = 0;
  for (const auto& e : ev)
    if (e["ph"] == "X") ++complete;
  EXPECT_EQ(complete, 5);
  EXPECT_EQ(ev[0]["name"], "step 1");
  EXPECT_DOUBLE_EQ(ev[0]["args"]["loss"].get<double>(), 2.5);
  EXPECT_EQ(ev[1]["name"], "matmul");
  EXPECT_DOUBLE_EQ(ev[1]["ts"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(ev[1]["dur"].get<double>(), 0.5);
  EXPECT_EQ(ev[1]["args"]["scope"], "blocks.0.attn");
  // Every track is named: the steps', and each engine thread's ops (Perfetto said "Thread 2").
  std::map<int64_t, std::string> names;
  for (const auto& e : ev)
    if (e["ph"] == "M" && e["name"] == "thread_name")
      names[e["tid"].get<int64_t>()] = e["args"]["name"].get<std::string>();
  for (const auto& e : ev) {
    if (e["ph"] == "X") {
      EXPECT_TRUE(names.count(e["tid"].get<int64_t>())) << e.dump();
    }
  }
  EXPECT_EQ(names[0], "steps");
  EXPECT_EQ(names[ev[1]["tid"].get<int64_t>()],
            "ops (engine thread " + std::to_string(ev[1]["tid"].get<int64_t>() - 1) + ")");
}

// Log lines are instant events on a "logs" track; each device's allocator totals a counter with a
// sample only where they change.
TEST(ExportTrace, LogLinesAndMemoryCounters) {
  std::vector<LogRecord> logs(2);
  logs[0].message = "step 1: loss 2.5";
  logs[0].scope = "train";
  logs[0].timeNs = 3000;
  logs[0].opSeq = 2;
  logs[1].message = std::string(200, 'x');
  logs[1].level = LogLevel::Warn;
  logs[1].timeNs = 4000;
  std::vector<MemRecord> mems;
  auto mem = [&](const std::string& device, int64_t t, uint64_t allocated, uint64_t reserved) {
    MemRecord m;
    m.device = device;
    m.timeNs = t;
    m.allocatedAfter = allocated;
    m.reservedAfter = reserved;
    mems.push_back(m);
  };
  mem("cpu", 1000, 64, 1024);
  mem("cpu", 1500, 64, 1024);  // no change: no sample
  mem("cuda:0", 1600, 8, 512);
  mem("cpu", 1700, 0, 0);  // a tracked section's mark: no totals, no sample (it drew a 0)
  mems.back().kind = MemEventKind::TrackBegin;
  mem("cpu", 2000, 0, 1024);
  auto j = nlohmann::json::parse(toChromeTrace(smallGraph(), {}, logs, mems));
  std::vector<nlohmann::json> instants, counters;
  std::map<int64_t, std::string> names;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "i") instants.push_back(e);
    if (e["ph"] == "C") counters.push_back(e);
    if (e["ph"] == "M") names[e["tid"].get<int64_t>()] = e["args"]["name"].get<std::string>();
  }
  ASSERT_EQ(instants.size(), 2u);
  EXPECT_EQ(instants[0]["name"], "step 1: loss 2.5");
  EXPECT_DOUBLE_EQ(instants[0]["ts"].get<double>(), 3.0);
  EXPECT_EQ(instants[0]["args"]["level"], "info");
  EXPECT_EQ(instants[0]["args"]["scope"], "train");
  EXPECT_EQ(instants[0]["args"]["op_seq"], 2);
  EXPECT_EQ(instants[1]["name"], std::string(80, 'x') + "...");
  EXPECT_EQ(instants[1]["args"]["message"], std::string(200, 'x'));
  EXPECT_EQ(instants[1]["args"]["level"], "warn");
  EXPECT_EQ(names[instants[0]["tid"].get<int64_t>()], "logs");
  ASSERT_EQ(counters.size(), 3u);
  EXPECT_EQ(counters[0]["name"], "memory cpu");
  EXPECT_DOUBLE_EQ(counters[0]["ts"].get<double>(), 1.0);
  EXPECT_EQ(counters[0]["args"]["allocated"], 64);
  EXPECT_EQ(counters[0]["args"]["reserved"], 1024);
  EXPECT_EQ(counters[1]["name"], "memory cuda:0");
  EXPECT_EQ(counters[2]["name"], "memory cpu");
  EXPECT_EQ(counters[2]["args"]["allocated"], 0);
}

TEST(ExportCsv, HeaderRowsAndQuoting) {
  auto ops = smallGraph();
  ops[0].scope = "has,comma";
  std::string csv = toCsv(ops);
  std::istringstream in(csv);
  std::string line;
  int rows = 0;
  while (std::getline(in, line)) ++rows;
  EXPECT_EQ(rows, 5);
  EXPECT_EQ(csv.rfind("seq,step,phase,op,scope,", 0), 0u);
  EXPECT_NE(csv.find("1,1,forward,matmul,\"has,comma\","), std::string::npos) << csv;
  ops[0].scope = "blocks.0\rEVIL";  // a lone CR is quoted too (readers split records at it)
  EXPECT_NE(toCsv(ops).find(",\"blocks.0\rEVIL\","), std::string::npos);
}

TEST(ExportCsv, TensorRowsCarryChecksumsAndExactStatistics) {
  auto ops = smallGraph();
  size_t tensors = 0;
  for (const auto& o : ops) tensors += o.tensors.size();
  ops[0].tensors[0].md5 = "00112233445566778899aabbccddeeff";
  ops[0].tensors[0].hasStats = true;
  ops[0].tensors[0].stats = {-1.5, 0.1, 1.0 / 3.0, 2, 1.5, 1, 2, 3};
  std::string csv = toTensorCsv(ops);
  std::istringstream in(csv);
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  ASSERT_EQ(lines.size(), tensors + 1);
  EXPECT_EQ(lines[0].rfind("seq,step,phase,op,scope,role,idx,tensor_id,", 0), 0u);
  EXPECT_NE(lines[1].find(",00112233445566778899aabbccddeeff,"), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find(",-1.5,0.10000000000000001,0.33333333333333331,2,1.5,1,2,3"),
            std::string::npos)
      << lines[1];
  // 26 columns on every row, statistics empty when not captured.
  for (const auto& l : lines) EXPECT_EQ(std::count(l.begin(), l.end(), ','), 25) << l;
}

}  // namespace
}  // namespace keel::storage
