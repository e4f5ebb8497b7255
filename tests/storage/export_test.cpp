// Exports as text: Chrome trace JSON events; CSV rows and quoting. (The graph's DOT is analysis/'s:
// tests/analysis/graph_dot_test.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "keel/base/utf8.h"
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

// The one sanitiser of the CSV and DOT exports (keel::validUtf8) writes what the trace's
// (nlohmann's error_handler_t::replace) does: one U+FFFD per maximal ill-formed subpart, valid
// text unchanged.
TEST(ExportText, InvalidUtf8IsReplacedAsInTheTrace) {
  const std::vector<std::string> cases = {
      "plain",
      "blocks.0.a\xe9ttn",                       // Latin-1 é
      "\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",  // é € 😀: valid
      "\xc0\xaf",                                // overlong '/'
      "\xed\xa0\x80",                            // a surrogate
      "\xe2\x82",                                // cut short at the end
      "\xe2\x82x\xf0\x9f\x98",                   // cut short twice
      "\x80\xbf\xff\xfe\xf5\x80",                // stray continuations, bytes never in UTF-8
      "\xf4\x90\x80\x80",                        // past U+10FFFF
  };
  for (const std::string& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c));
    const std::string viaJson =
        nlohmann::json(c).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    EXPECT_EQ(nlohmann::json(validUtf8(c)).dump(), viaJson);
  }
  EXPECT_EQ(validUtf8("a\xe9"
                      "b"),
            "a\xef\xbf\xbd"
            "b");
  // The CSVs write it too (Python's csv module failed with UnicodeDecodeError).
  std::vector<OpRecord> ops = smallGraph();
  ops[0].scope = "blocks.0.a\xe9ttn";
  for (const std::string& csv : {toCsv(ops), toTensorCsv(ops)}) {
    EXPECT_EQ(validUtf8(csv), csv);
    EXPECT_NE(csv.find("blocks.0.a\xef\xbf\xbdttn"), std::string::npos);
  }
}

// An export starts with the exact bytes the keel tool recognises it by when it may replace an
// earlier one (keel::checkReplacesOnly): the signatures and the writers cannot drift apart.
TEST(ExportText, EachExportStartsWithItsSignature) {
  EXPECT_EQ(toChromeTrace(smallGraph(), {}).rfind(kChromeTraceStart, 0), 0u);
  EXPECT_EQ(toChromeTrace({}, {}).rfind(kChromeTraceStart, 0), 0u);
  EXPECT_EQ(toCsv(smallGraph()).rfind(kOpCsvHeader, 0), 0u);
  EXPECT_EQ(toTensorCsv({}), kTensorCsvHeader);
}

// A step that never ended (a break, Ctrl-C, a failed or still-running run: no end time) ends at
// its last recorded op, log line or memory event, marked incomplete; dur was end 0 - begin, a
// huge negative number, which the Trace Event Format does not allow.
TEST(ExportTrace, AnIncompleteStepEndsAtItsLastRecordedEvent) {
  std::vector<OpRecord> ops = smallGraph();  // step 1: ops from 1000 ns to 4500 ns
  std::vector<StepRecord> steps(3);
  steps[0].step = 1;
  steps[0].beginNs = 500;  // never ended
  steps[1].step = 2;
  steps[1].beginNs = 6000;  // begun, nothing recorded in it
  steps[2].step = 3;
  steps[2].beginNs = 9000;
  steps[2].endNs = 7000;  // a clock that went back: still never negative
  std::vector<LogRecord> logs(1);
  logs[0].step = 1;
  logs[0].timeNs = 5200;  // after the last op
  std::vector<MemRecord> mems(1);
  mems[0].step = 1;
  mems[0].timeNs = 5100;
  mems[0].device = "cpu";
  auto j = nlohmann::json::parse(toChromeTrace(ops, steps, logs, mems));
  std::map<std::string, nlohmann::json> step;
  for (const auto& e : j["traceEvents"]) {
    if (e.contains("dur")) {
      EXPECT_GE(e["dur"].get<double>(), 0) << e.dump();
    }
    if (e.value("cat", "") == "step") step[e["name"]] = e;
  }
  ASSERT_EQ(step.size(), 3u);
  EXPECT_DOUBLE_EQ(step["step 1"]["ts"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(step["step 1"]["dur"].get<double>(), 4.7);  // to the log line at 5.2 us
  EXPECT_EQ(step["step 1"]["args"]["incomplete"], true);
  EXPECT_DOUBLE_EQ(step["step 2"]["dur"].get<double>(), 0);
  EXPECT_EQ(step["step 2"]["args"]["incomplete"], true);
  EXPECT_DOUBLE_EQ(step["step 3"]["dur"].get<double>(), 0);
  EXPECT_FALSE(step["step 3"]["args"].contains("incomplete"));
}

// A step's args tell a NaN loss ("NaN") from one never reported (left out), as keel inspect does
// (Note [Reported NaN]); lr and grad_norm are there when reported. Both used to be "loss": null.
TEST(ExportTrace, StepArgsTellANaNLossFromOneNotReported) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<StepRecord> steps(3);
  for (int i = 0; i < 3; ++i) {
    steps[size_t(i)].step = i + 1;
    steps[size_t(i)].beginNs = 1000 * i;
    steps[size_t(i)].endNs = 1000 * i + 500;
  }
  steps[0].loss = 2.5;
  steps[0].lr = 1e-3;
  steps[0].gradNorm = 0.75;
  steps[1].loss = nan;
  steps[1].nanMetrics = stepMetricBit(StepMetric::Loss);  // the trainer reported NaN
  steps[1].gradNorm = std::numeric_limits<double>::infinity();
  steps[2].loss = nan;  // not reported
  auto j = nlohmann::json::parse(toChromeTrace({}, steps));
  std::vector<nlohmann::json> args;
  for (const auto& e : j["traceEvents"])
    if (e.value("cat", "") == "step") args.push_back(e["args"]);
  ASSERT_EQ(args.size(), 3u);
  EXPECT_EQ(args[0], nlohmann::json::parse(R"({"loss":2.5,"lr":0.001,"grad_norm":0.75})"));
  EXPECT_EQ(args[1], nlohmann::json::parse(R"({"loss":"NaN","grad_norm":"Infinity"})"));
  EXPECT_EQ(args[2], nlohmann::json::object());
}

// A rank's trace is a process of its own (pid rank + 1, named), so two ranks' traces loaded
// together in Perfetto sit side by side; every event carried pid 1.
TEST(ExportTrace, EveryEventBelongsToTheNamedProcess) {
  StepRecord s;
  s.step = 1;
  s.endNs = 9000;
  std::vector<LogRecord> logs(1);
  std::vector<MemRecord> mems(1);
  mems[0].device = "cpu";
  mems[0].allocatedAfter = 1;
  auto j = nlohmann::json::parse(toChromeTrace(smallGraph(), {s}, logs, mems,
                                               TraceProcess{3, "keel rank-2.db (rank 2 of 4)"}));
  std::string name;
  int sortIndex = -1;
  for (const auto& e : j["traceEvents"]) {
    EXPECT_EQ(e["pid"], 3) << e.dump();
    if (e["name"] == "process_name") name = e["args"]["name"];
    if (e["name"] == "process_sort_index") sortIndex = e["args"]["sort_index"];
  }
  EXPECT_EQ(name, "keel rank-2.db (rank 2 of 4)");
  EXPECT_EQ(sortIndex, 3);
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

// A scalar's shape and strides are "[]" (as in the op CSV), not an empty field, which reads as
// "not recorded" (pandas: NaN).
TEST(ExportCsv, AScalarsShapeIsEmptyBrackets) {
  std::vector<OpRecord> ops = {op(1, "cross_entropy", "", Phase::Forward,
                                  {tensor(Role::Input, 0, 10, 0), tensor(Role::Output, 0, 11, 0)})};
  ops[0].tensors[1].shape = {};
  ops[0].tensors[1].strides = {};
  ops[0].tensors[0].strides = {3, 1};
  const std::string csv = toTensorCsv(ops);
  EXPECT_NE(csv.find(",input,0,10,0,0,2x3,3x1,0,float32,"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",output,0,11,0,0,[],[],0,float32,"), std::string::npos) << csv;
  EXPECT_NE(toCsv(ops).find(",\"[2,3] float32\",[] float32,"), std::string::npos) << toCsv(ops);
}

}  // namespace
}  // namespace keel::storage
