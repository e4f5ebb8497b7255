// Scoped logging and the verbose guard (see keel/log.h). Global rules sit behind a mutex and are
// read only when verboseActive() (the count in Note [One load per op]'s word is non-zero); guard
// rules are thread-local, so a guard on one thread never turns verbose on for another.
#include "keel/log.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "keel/dispatch.h"
#include "keel/error.h"

namespace keel {

namespace {
std::mutex g_rulesMu;
std::vector<VerboseRule> g_rules;  // guarded by g_rulesMu
bool g_hasGlobalRules = false;     // guarded by g_rulesMu
std::atomic<int> g_echoLevel{int(LogLevel::Warn)};
thread_local std::vector<VerboseRule> t_rules;

bool anyMatch(const std::vector<VerboseRule>& rules, std::string_view scope, Phase phase) {
  for (auto& r : rules)
    if (ruleMatches(r, scope, phase)) return true;
  return false;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}
}  // namespace

// Read once at start-up (static initialisation of this file, which the dispatcher pulls in). A
// malformed value is reported on stderr and ignored: a library never exits on bad input.
bool readLogEnv() {
  bool ok = true;
  if (const char* lv = std::getenv("KEEL_LOG_LEVEL")) {
    try {
      setLogEchoLevel(parseLogLevelSetting(lv));
    } catch (const Error& e) {
      std::fprintf(stderr, "keel: ignoring KEEL_LOG_LEVEL: %s\n", e.what());
      ok = false;
    }
  }
  const char* v = std::getenv("KEEL_VERBOSE");
  try {
    setGlobalVerboseRules(v ? parseVerboseRules(v) : std::vector<VerboseRule>{});
  } catch (const Error& e) {
    std::fprintf(stderr, "keel: ignoring KEEL_VERBOSE: %s\n", e.what());
    ok = false;
  }
  return ok;
}
static const bool g_envRead = readLogEnv();

LogLevel parseLogLevelSetting(std::string_view text) {
  text = trim(text);
  if (const auto level = parseLogLevel(text)) return *level;
  if (text == "warning") return LogLevel::Warn;
  if (text.size() == 1 && text[0] >= '0' && size_t(text[0] - '0') < kLogLevelNames.size())
    return LogLevel(text[0] - '0');
  throw Error("unknown log level '" + std::string(text) +
              "' (expected error, warn, info, debug, verbose or 0..4)");
}

void setLogEchoLevel(LogLevel level) {
  g_echoLevel.store(int(level), std::memory_order_relaxed);
}
LogLevel logEchoLevel() {
  return LogLevel(g_echoLevel.load(std::memory_order_relaxed));
}

bool ruleMatches(const VerboseRule& rule, std::string_view scope, Phase phase) {
  if (rule.phase && *rule.phase != phase) return false;
  return scopeWithin(scope, rule.scopePrefix);
}

std::vector<VerboseRule> parseVerboseRules(std::string_view text) {
  std::vector<VerboseRule> rules;
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view item = trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (item.empty()) continue;
    VerboseRule r;
    size_t colon = item.find(':');
    std::string_view scope = trim(item.substr(0, colon));
    if (colon != std::string_view::npos) {
      std::string_view ph = trim(item.substr(colon + 1));
      if (const auto phase = parsePhase(ph))
        r.phase = *phase;
      else if (!ph.empty() && ph != "*")
        throw Error("verbose rule '" + std::string(item) + "': unknown phase '" + std::string(ph) +
                    "' (expected forward, backward or optimizer)");
    }
    if (scope != "*") r.scopePrefix = std::string(scope);
    rules.push_back(std::move(r));
  }
  return rules;
}

void setGlobalVerboseRules(std::vector<VerboseRule> rules) {
  std::lock_guard<std::mutex> lk(g_rulesMu);
  bool has = !rules.empty();
  g_rules = std::move(rules);
  if (has != g_hasGlobalRules) {
    if (has)
      detail::g_instrumentation.fetch_add(detail::kVerboseUnit);
    else
      detail::g_instrumentation.fetch_sub(detail::kVerboseUnit);
  }
  g_hasGlobalRules = has;
}

std::vector<VerboseRule> globalVerboseRules() {
  std::lock_guard<std::mutex> lk(g_rulesMu);
  return g_rules;
}

VerboseGuard::VerboseGuard() : VerboseGuard(std::vector<VerboseRule>{VerboseRule{}}) {}
VerboseGuard::VerboseGuard(std::string_view rules) : VerboseGuard(parseVerboseRules(rules)) {}
VerboseGuard::VerboseGuard(std::vector<VerboseRule> rules) : prevSize_(t_rules.size()) {
  for (auto& r : rules) t_rules.push_back(std::move(r));
  detail::g_instrumentation.fetch_add(detail::kVerboseUnit);
}
VerboseGuard::~VerboseGuard() {
  t_rules.resize(prevSize_);
  detail::g_instrumentation.fetch_sub(detail::kVerboseUnit);
}

bool verboseEnabled(std::string_view scope, Phase phase) {
  if (!detail::verboseActive()) return false;
  if (anyMatch(t_rules, scope, phase)) return true;
  std::lock_guard<std::mutex> lk(g_rulesMu);
  return anyMatch(g_rules, scope, phase);
}
bool verboseEnabled() {
  return verboseEnabled(currentScope(), currentPhase());
}

namespace {
void logLine(LogLevel level, std::string_view scope, std::string_view message, bool echo) {
  (void)g_envRead;
  if (level == LogLevel::Verbose && !verboseEnabled(scope, currentPhase()) && !verboseEnabled())
    return;
  LogEvent e;
  e.level = level;
  e.scope = scope;
  e.message = message;
  e.opSeq = currentOpSeq() ? currentOpSeq() : lastOpSeq();
  e.timeNs = detail::nowNs();
  if (echo && int(level) <= g_echoLevel.load(std::memory_order_relaxed)) {
    std::string_view ln = logLevelName(level);
    std::fprintf(stderr, "[keel %.*s] %.*s%s%.*s (op %llu)\n", int(ln.size()), ln.data(),
                 int(scope.size()), scope.data(), scope.empty() ? "" : ": ", int(message.size()),
                 message.data(), static_cast<unsigned long long>(e.opSeq));
  }
  detail::notifyLog(e);
}
}  // namespace

void log(LogLevel level, std::string_view scope, std::string_view message) {
  logLine(level, scope, message, true);
}

void logWithoutEcho(LogLevel level, std::string_view scope, std::string_view message) {
  logLine(level, scope, message, false);
}

void log(LogLevel level, std::string_view message) {
  std::string scope = currentScope();
  log(level, scope, message);
}

}  // namespace keel
