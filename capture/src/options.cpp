// CaptureOptions <-> JSON (nlohmann-json). Every field is written; reading accepts any subset and
// rejects unknown keys and wrong types with keel::Error, so a typo never silently records less.
#include "keel/capture/options.h"

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <utility>

#include "keel/base/text.h"
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

// A JSON integer that fits int64_t, else keel::Error naming the key: nlohmann's get<int64_t>()
// converts 1e300 or -1e30 with a cast C++ leaves undefined, and 2^64 - 1 to -1 (fuzz_config).
int64_t wholeNumber(const json& v, const std::string& key) {
  if (v.is_number_integer() && (!v.is_number_unsigned() || v.get<uint64_t>() <= INT64_MAX))
    return v.get<int64_t>();
  throw Error("capture options: '" + key + "' must be a whole number below 2^63, got " +
              (v.is_number() ? v.dump() : std::string("a ") + v.type_name()));
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
      f.stepMin = wholeNumber(v, where + "." + k);
    else if (k == "step_max")
      f.stepMax = wholeNumber(v, where + "." + k);
    else
      throw Error("capture options: unknown key '" + where + "." + k + "'");
  }
  return f;
}

// The options stored as plain JSON booleans and integers, by key: toJson writes them and fromJson
// reads them from these tables (the rest are spelled out in both).
using Opt = CaptureOptions;
constexpr std::pair<const char*, bool Opt::*> kBoolKeys[] = {
    {"graph", &Opt::graph},         {"stacks", &Opt::stacks},         {"md5", &Opt::md5},
    {"stats", &Opt::stats},         {"dumps", &Opt::dumps},           {"logs", &Opt::logs},
    {"allocator", &Opt::allocator}, {"hash_thread", &Opt::hashThread}};
constexpr std::pair<const char*, int64_t Opt::*> kIntKeys[] = {
    {"queue_capacity", &Opt::queueCapacity},
    {"commit_every", &Opt::commitEvery},
    {"commit_interval_ms", &Opt::commitIntervalMs},
    {"hash_backlog_bytes", &Opt::hashBacklogBytes},
    {"hash_lanes", &Opt::hashLanes}};

// Reads key k into o's member from the table, if the table has k.
template <typename T, size_t N>
bool readKey(const std::pair<const char*, T Opt::*> (&table)[N], const std::string& k,
             const json& v, Opt& o) {
  for (const auto& [key, member] : table)
    if (k == key) {
      if constexpr (std::is_same_v<T, bool>)
        o.*member = v.get<bool>();
      else
        o.*member = wholeNumber(v, k);
      return true;
    }
  return false;
}

}  // namespace

std::string CaptureOptions::toJson() const {
  json j{{"rounded_md5", roundedMd5},
         {"dump_filter", filterToJson(dumpFilter)},
         {"filter", filterToJson(filter)},
         {"drop_policy", dropPolicyName(dropPolicy)},
         {"on_error", errorPolicyName(onError)}};
  for (const auto& [key, member] : kBoolKeys) j[key] = this->*member;
  for (const auto& [key, member] : kIntKeys) j[key] = this->*member;
  return j.dump();
}

CaptureOptions CaptureOptions::fromJson(const std::string& text) {
  CaptureOptions o;
  json j;
  try {
    checkJsonDepth(text, "capture options");  // Note [Bounded JSON]
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error("capture options: invalid JSON: " + jsonErrorText(e.what()));
  }
  KEEL_CHECK(j.is_object(), "capture options: expected a JSON object");
  try {
    for (auto& [k, v] : j.items()) {
      if (readKey(kBoolKeys, k, v, o) || readKey(kIntKeys, k, v, o))
        continue;
      else if (k == "rounded_md5")
        o.roundedMd5 = int(std::clamp<int64_t>(wholeNumber(v, k), -1, 18));  // checked below
      else if (k == "dump_filter")
        o.dumpFilter = filterFromJson(v, k);
      else if (k == "filter")
        o.filter = filterFromJson(v, k);
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
      } else
        throw Error("capture options: unknown key '" + k + "'");
    }
  } catch (const json::exception& e) {
    throw Error(std::string("capture options: ") + e.what());
  }
  KEEL_CHECK(o.roundedMd5 >= 0 && o.roundedMd5 <= 17, "capture options: rounded_md5 must be 0..17");
  KEEL_CHECK(o.queueCapacity >= 1, "capture options: queue_capacity must be >= 1");
  KEEL_CHECK(o.commitEvery >= 1, "capture options: commit_every must be >= 1");
  KEEL_CHECK(o.hashBacklogBytes >= 1, "capture options: hash_backlog_bytes must be >= 1");
  KEEL_CHECK(o.hashLanes == 0 || o.hashLanes == 1 || o.hashLanes == 8 || o.hashLanes == 16 ||
                 o.hashLanes == 32 || o.hashLanes == 48,
             "capture options: hash_lanes must be 0, 1, 8, 16, 32 or 48");
  return o;
}

}  // namespace keel::capture
