// CaptureOptions <-> JSON (nlohmann-json). Every field is written; reading accepts any subset and
// rejects unknown keys and wrong types with keel::Error, so a typo never silently records less.
#include "keel/capture/options.h"

#include <nlohmann/json.hpp>

#include "keel/error.h"
#include "keel/log.h"

namespace keel::capture {

using nlohmann::json;

bool OpFilter::matches(const std::string& op, std::string_view scopePath, int64_t step) const {
  if (!matchesStep(step)) return false;
  if (!ops.empty()) {
    bool found = false;
    for (auto& o : ops) found = found || o == op;
    if (!found) return false;
  }
  return scopeWithin(scopePath, scope);
}

std::string dropPolicyName(DropPolicy p) {
  return p == DropPolicy::Block ? "block" : "drop";
}
std::string errorPolicyName(ErrorPolicy p) {
  return p == ErrorPolicy::Stop ? "stop" : "throw";
}

namespace {

json filterToJson(const OpFilter& f) {
  return json{{"ops", f.ops}, {"scope", f.scope}, {"step_min", f.stepMin}, {"step_max", f.stepMax}};
}

OpFilter filterFromJson(const json& j, const std::string& where) {
  KEEL_CHECK(j.is_object(), "capture options: '", where, "' must be an object");
  OpFilter f;
  for (auto& [k, v] : j.items()) {
    if (k == "ops")
      f.ops = v.get<std::vector<std::string>>();
    else if (k == "scope")
      f.scope = v.get<std::string>();
    else if (k == "step_min")
      f.stepMin = v.get<int64_t>();
    else if (k == "step_max")
      f.stepMax = v.get<int64_t>();
    else
      throw Error("capture options: unknown key '" + where + "." + k + "'");
  }
  return f;
}

}  // namespace

std::string CaptureOptions::toJson() const {
  json j{{"graph", graph},
         {"stacks", stacks},
         {"md5", md5},
         {"rounded_md5", roundedMd5},
         {"stats", stats},
         {"dumps", dumps},
         {"dump_filter", filterToJson(dumpFilter)},
         {"logs", logs},
         {"allocator", allocator},
         {"filter", filterToJson(filter)},
         {"queue_capacity", queueCapacity},
         {"drop_policy", dropPolicyName(dropPolicy)},
         {"on_error", errorPolicyName(onError)},
         {"commit_every", commitEvery},
         {"commit_interval_ms", commitIntervalMs}};
  return j.dump();
}

CaptureOptions CaptureOptions::fromJson(const std::string& text) {
  CaptureOptions o;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(std::string("capture options: invalid JSON: ") + e.what());
  }
  KEEL_CHECK(j.is_object(), "capture options: expected a JSON object");
  try {
    for (auto& [k, v] : j.items()) {
      if (k == "graph")
        o.graph = v.get<bool>();
      else if (k == "stacks")
        o.stacks = v.get<bool>();
      else if (k == "md5")
        o.md5 = v.get<bool>();
      else if (k == "rounded_md5")
        o.roundedMd5 = v.get<int>();
      else if (k == "stats")
        o.stats = v.get<bool>();
      else if (k == "dumps")
        o.dumps = v.get<bool>();
      else if (k == "dump_filter")
        o.dumpFilter = filterFromJson(v, k);
      else if (k == "logs")
        o.logs = v.get<bool>();
      else if (k == "allocator")
        o.allocator = v.get<bool>();
      else if (k == "filter")
        o.filter = filterFromJson(v, k);
      else if (k == "queue_capacity")
        o.queueCapacity = v.get<int64_t>();
      else if (k == "drop_policy") {
        auto s = v.get<std::string>();
        KEEL_CHECK(s == "block" || s == "drop", "capture options: drop_policy '", s,
                   "' (expected block or drop)");
        o.dropPolicy = s == "block" ? DropPolicy::Block : DropPolicy::Drop;
      } else if (k == "on_error") {
        auto s = v.get<std::string>();
        KEEL_CHECK(s == "stop" || s == "throw", "capture options: on_error '", s,
                   "' (expected stop or throw)");
        o.onError = s == "stop" ? ErrorPolicy::Stop : ErrorPolicy::Throw;
      } else if (k == "commit_every")
        o.commitEvery = v.get<int64_t>();
      else if (k == "commit_interval_ms")
        o.commitIntervalMs = v.get<int64_t>();
      else
        throw Error("capture options: unknown key '" + k + "'");
    }
  } catch (const json::exception& e) {
    throw Error(std::string("capture options: ") + e.what());
  }
  KEEL_CHECK(o.roundedMd5 >= 0 && o.roundedMd5 <= 17, "capture options: rounded_md5 must be 0..17");
  KEEL_CHECK(o.queueCapacity >= 1, "capture options: queue_capacity must be >= 1");
  KEEL_CHECK(o.commitEvery >= 1, "capture options: commit_every must be >= 1");
  return o;
}

}  // namespace keel::capture
