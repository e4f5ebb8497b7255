// Text exports of recordings: Chrome trace JSON, CSV. See export.h.
#include "keel/storage/export.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace keel::storage {
namespace {

std::string csvField(const std::string& s) {
  // A lone CR ends a record for most readers too (Python's csv module split rows at it).
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string r = "\"";
  for (char c : s) {
    if (c == '"') r += '"';
    r += c;
  }
  return r + "\"";
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
                          const std::vector<LogRecord>& logs, const std::vector<MemRecord>& mems) {
  nlohmann::json events = nlohmann::json::array();
  for (const auto& s : steps)
    events.push_back({{"name", "step " + std::to_string(s.step)},
                      {"cat", "step"},
                      {"ph", "X"},
                      {"ts", double(s.beginNs) / 1e3},
                      {"dur", double(s.endNs - s.beginNs) / 1e3},
                      {"pid", 1},
                      {"tid", 0},
                      {"args", {{"loss", s.loss == s.loss ? nlohmann::json(s.loss) : nullptr}}}});
  for (const auto& op : ops)
    events.push_back({{"name", op.name},
                      {"cat", phaseName(op.phase)},
                      {"ph", "X"},
                      {"ts", double(op.beginNs) / 1e3},
                      {"dur", double(op.endNs - op.beginNs) / 1e3},
                      {"pid", 1},
                      {"tid", op.thread + 1},
                      {"args",
                       {{"seq", op.seq},
                        {"step", op.step},
                        {"scope", op.scope},
                        {"inputs", tensorList(op, Role::Input)},
                        {"outputs", tensorList(op, Role::Output)}}}});
  events.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", 1},
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
                      {"pid", 1},
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
                      {"pid", 1},
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
                      {"pid", 1},
                      {"args", {{"allocated", now.first}, {"reserved", now.second}}}});
  }
  // Each op track named for the engine thread it shows (Perfetto said "Thread 2").
  std::set<int64_t> threads;
  for (const auto& op : ops) threads.insert(op.thread);
  for (int64_t t : threads)
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 1},
                      {"tid", t + 1},
                      {"args", {{"name", "ops (engine thread " + std::to_string(t) + ")"}}}});
  return nlohmann::json({{"traceEvents", events}, {"displayTimeUnit", "ns"}})
             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n";  // invalid UTF-8 in recorded strings: U+FFFD, not an exception
}

std::string toCsv(const std::vector<OpRecord>& ops) {
  std::ostringstream os;
  os << "seq,step,phase,op,scope,thread,begin_ns,end_ns,forward_seq,inputs,outputs,md5_out0\n";
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
       << csvField(tensorList(op, Role::Output)) << ',' << md5 << '\n';
  }
  return os.str();
}

std::string toTensorCsv(const std::vector<OpRecord>& ops) {
  std::ostringstream os;
  os << "seq,step,phase,op,scope,role,idx,tensor_id,version,buffer_id,shape,strides,offset,dtype,"
        "device,bytes,md5,md5_rounded,min,max,mean,std,abs_max,nan_count,inf_count,zero_count\n";
  auto dimsX = [](const std::vector<int64_t>& d) {
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
         << dimsX(t.shape) << ',' << dimsX(t.strides) << ',' << t.offset << ',' << t.dtype << ','
         << t.device << ',' << t.bytes << ',' << t.md5 << ',' << t.md5Rounded;
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
