// Text exports of recordings: Chrome trace JSON, CSV. See export.h.
#include "keel/storage/export.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "keel/base/utf8.h"

namespace keel::storage {
namespace {

std::string csvField(const std::string& text) {
  std::string s = validUtf8(text);  // a recorded name need not be UTF-8: U+FFFD, as in the trace
  // A lone CR ends a record for most readers too (Python's csv module split rows at it).
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string r = "\"";
  for (char c : s) {
    if (c == '"') r += '"';
    r += c;
  }
  return r + "\"";
}

// A step metric for the trace's args: its value, or "NaN" / "Infinity" / "-Infinity" (JSON has
// no such numbers; nlohmann writes them as null, which read as "not reported").
nlohmann::json metricJson(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return v;
}

// A step's slice on the steps track: its begin and duration in microseconds, and its args.
nlohmann::json stepEvent(const StepRecord& s, int64_t lastSeenNs, int64_t pid) {
  nlohmann::json args = nlohmann::json::object();
  // Note [Reported NaN]: a metric the trainer reported as NaN is "NaN"; one it did not report is
  // left out (both read NaN from the file).
  for (const auto& [metric, key] :
       {std::pair{StepMetric::Loss, "loss"}, std::pair{StepMetric::Lr, "lr"},
        std::pair{StepMetric::GradNorm, "grad_norm"}, std::pair{StepMetric::AuxLoss, "aux_loss"}})
    if (s.reported(metric)) args[key] = metricJson(s.value(metric));
  // A step that never ended (a break, Ctrl-C, a failure, a run still recording) has no end time:
  // its slice ends where its last recorded event does (dur 0 without any), never before it began.
  int64_t endNs = s.endNs;
  if (s.endNs <= 0) {
    endNs = lastSeenNs;
    args["incomplete"] = true;
  }
  return {{"name", "step " + std::to_string(s.step)},
          {"cat", "step"},
          {"ph", "X"},
          {"ts", double(s.beginNs) / 1e3},
          {"dur", double(std::max(endNs, s.beginNs) - s.beginNs) / 1e3},
          {"pid", pid},
          {"tid", 0},
          {"args", std::move(args)}};
}

}  // namespace

std::string tensorList(const OpRecord& op, Role role) {
  std::string r;
  for (const auto& t : op.tensors) {
    if (t.role != role) continue;
    if (!r.empty()) r += ", ";
    r += shapeText(t.shape);
    r += ' ';
    r += t.dtype;
  }
  return r;
}

std::string toChromeTrace(const std::vector<OpRecord>& ops, const std::vector<StepRecord>& steps,
                          const std::vector<LogRecord>& logs, const std::vector<MemRecord>& mems,
                          const TraceProcess& process) {
  const int64_t pid = process.pid;
  nlohmann::json events = nlohmann::json::array();
  // The last recorded time in each step: where a step that never ended is drawn to end.
  std::map<int64_t, int64_t> lastSeen;
  if (std::any_of(steps.begin(), steps.end(), [](const StepRecord& s) { return s.endNs <= 0; })) {
    auto seen = [&](int64_t step, int64_t ns) {
      auto [it, added] = lastSeen.emplace(step, ns);
      if (!added) it->second = std::max(it->second, ns);
    };
    for (const auto& op : ops) seen(op.step, std::max(op.beginNs, op.endNs));
    for (const auto& l : logs) seen(l.step, l.timeNs);
    for (const auto& m : mems) seen(m.step, m.timeNs);
  }
  for (const auto& s : steps) {
    const auto it = lastSeen.find(s.step);
    events.push_back(stepEvent(s, it == lastSeen.end() ? s.beginNs : it->second, pid));
  }
  for (const auto& op : ops)
    events.push_back({{"name", op.name},
                      {"cat", phaseName(op.phase)},
                      {"ph", "X"},
                      {"ts", double(op.beginNs) / 1e3},
                      {"dur", double(op.endNs - op.beginNs) / 1e3},
                      {"pid", pid},
                      {"tid", op.thread + 1},
                      {"args",
                       {{"seq", op.seq},
                        {"step", op.step},
                        {"scope", op.scope},
                        {"inputs", tensorList(op, Role::Input)},
                        {"outputs", tensorList(op, Role::Output)}}}});
  events.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", pid},
                    {"tid", 0},
                    {"args", {{"name", "steps"}}}});
  // Log lines on a track of their own, below the engine threads' (Perfetto draws an instant
  // event as a mark; its message, level and scope in the details).
  int64_t logTrack = 1;
  for (const auto& op : ops) logTrack = std::max(logTrack, op.thread + 2);
  for (const auto& l : logs) {
    constexpr size_t kName = 80;
    std::string name = l.message.size() > kName ? l.message.substr(0, kName) + "..." : l.message;
    events.push_back({{"name", std::move(name)},
                      {"cat", "log"},
                      {"ph", "i"},
                      {"s", "t"},
                      {"ts", double(l.timeNs) / 1e3},
                      {"pid", pid},
                      {"tid", logTrack},
                      {"args",
                       {{"level", std::string(logLevelName(l.level))},
                        {"scope", l.scope},
                        {"step", l.step},
                        {"op_seq", l.opSeq},
                        {"message", l.message}}}});
  }
  if (!logs.empty())
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"tid", logTrack},
                      {"args", {{"name", "logs"}}}});
  // The allocator's totals per device, a counter sample where they change (a step's hundreds of
  // events move them far less often than they fire).
  std::map<std::string, std::pair<uint64_t, uint64_t>> last;
  for (const auto& m : mems) {
    // A tracked section's marks carry no totals (0, 0): the counter dropped to zero at each.
    if (m.kind == MemEventKind::TrackBegin || m.kind == MemEventKind::TrackEnd) continue;
    const std::pair<uint64_t, uint64_t> now{m.allocatedAfter, m.reservedAfter};
    auto it = last.find(m.device);
    if (it != last.end() && it->second == now) continue;
    last[m.device] = now;
    events.push_back({{"name", "memory " + m.device},
                      {"cat", "memory"},
                      {"ph", "C"},
                      {"ts", double(m.timeNs) / 1e3},
                      {"pid", pid},
                      {"args", {{"allocated", now.first}, {"reserved", now.second}}}});
  }
  // The process named (a rank's traces side by side) and placed in rank order.
  if (!process.name.empty()) {
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"tid", 0},
                      {"args", {{"name", process.name}}}});
    events.push_back({{"name", "process_sort_index"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"tid", 0},
                      {"args", {{"sort_index", pid}}}});
  }
  // Each op track named for the engine thread it shows (Perfetto said "Thread 2").
  std::set<int64_t> threads;
  for (const auto& op : ops) threads.insert(op.thread);
  for (int64_t t : threads)
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"tid", t + 1},
                      {"args", {{"name", "ops (engine thread " + std::to_string(t) + ")"}}}});
  return nlohmann::json({{"traceEvents", events}, {"displayTimeUnit", "ns"}})
             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n";  // invalid UTF-8 in recorded strings: U+FFFD, not an exception
}

std::string toCsv(const std::vector<OpRecord>& ops) {
  std::ostringstream os;
  os << kOpCsvHeader;
  for (const auto& op : ops) {
    std::string md5;
    for (const auto& t : op.tensors)
      if (t.role == Role::Output) {
        md5 = t.md5;
        break;
      }
    os << op.seq << ',' << op.step << ',' << op.phase << ',' << csvField(op.name) << ','
       << csvField(op.scope) << ',' << op.thread << ',' << op.beginNs << ',' << op.endNs << ','
       << op.forwardSeq << ',' << csvField(tensorList(op, Role::Input)) << ','
       << csvField(tensorList(op, Role::Output)) << ',' << csvField(md5) << '\n';
  }
  return os.str();
}

std::string toTensorCsv(const std::vector<OpRecord>& ops) {
  std::ostringstream os;
  os << kTensorCsvHeader;
  auto dimsX = [](const std::vector<int64_t>& d) {
    if (d.empty()) return std::string("[]");  // a scalar (an empty field read as "not recorded")
    std::string r;
    for (size_t i = 0; i < d.size(); ++i) {
      if (i) r += 'x';
      r += std::to_string(d[i]);
    }
    return r;
  };
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return std::string(buf);
  };
  for (const auto& op : ops)
    for (const auto& t : op.tensors) {
      os << op.seq << ',' << op.step << ',' << op.phase << ',' << csvField(op.name) << ','
         << csvField(op.scope) << ',' << (t.role == Role::Input ? "input" : "output") << ','
         << t.index << ',' << t.tensorId << ',' << t.version << ',' << t.bufferId << ','
         << dimsX(t.shape) << ',' << dimsX(t.strides) << ',' << t.offset << ',' << csvField(t.dtype)
         << ',' << csvField(t.device) << ',' << t.bytes << ',' << csvField(t.md5) << ','
         << csvField(t.md5Rounded);
      if (t.hasStats) {
        for (double v : {t.stats.min, t.stats.max, t.stats.mean, t.stats.std, t.stats.absMax})
          os << ',' << num(v);
        os << ',' << t.stats.nanCount << ',' << t.stats.infCount << ',' << t.stats.zeroCount;
      } else {
        os << ",,,,,,,,";
      }
      os << '\n';
    }
  return os.str();
}

}  // namespace keel::storage
