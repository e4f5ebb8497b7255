// Scoped logging: keel::log(level, scope, message) delivers a line to every observer (capture
// stores it with the op sequence number it belongs to) and echoes it to stderr at or above a
// threshold (KEEL_LOG_LEVEL, default warn). Verbose lines are emitted only where a verbose rule
// matches the current module scope and phase (VerboseGuard, or KEEL_VERBOSE="blocks.3.attn,
// blocks.1:backward"). With no rule active, verboseActive() is one relaxed atomic load.
#pragma once
#include <atomic>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "keel/base/non_copyable.h"
#include "keel/base/text.h"
#include "keel/observer.h"

namespace keel {

// Writes one log line. Verbose lines are dropped unless verboseEnabled() holds here.
void log(LogLevel level, std::string_view scope, std::string_view message);
// Same, with the current module scope (currentScope()).
void log(LogLevel level, std::string_view message);
// Delivers the line to the observers (a recording keeps it) without echoing it to stderr: what
// the caller says on the terminal in its own words, or at length only in the recording (a hang
// report's ring of collectives).
void logWithoutEcho(LogLevel level, std::string_view scope, std::string_view message);

// Lines at or above this level (Error is highest) are echoed to stderr; default Warn, or
// KEEL_LOG_LEVEL=error|warn|info|debug|verbose (or 0..4) at start-up.
void setLogEchoLevel(LogLevel level);
LogLevel logEchoLevel();
// A level as a person sets it (KEEL_LOG_LEVEL): a name of keel::parseLogLevel, "warning", or a
// digit 0..4, blanks around ignored; throws keel::Error otherwise.
LogLevel parseLogLevelSetting(std::string_view text);

// A verbose rule: ops (and log lines) whose module scope starts with `scopePrefix` on a dot
// boundary ("blocks.1" matches "blocks.1" and "blocks.1.attn", not "blocks.10"); an empty prefix
// matches every scope. With `phase` set, only that phase matches.
struct VerboseRule {
  std::string scopePrefix;
  std::optional<Phase> phase;
  bool operator==(const VerboseRule&) const = default;
};
bool ruleMatches(const VerboseRule& rule, std::string_view scope, Phase phase);

// Parses "blocks.3.attn,blocks.1:backward,:forward,*" — comma-separated rules, each a scope
// prefix ("*" or empty: any scope) with an optional ":forward|backward|optimizer". Throws
// keel::Error on an unknown phase.
std::vector<VerboseRule> parseVerboseRules(std::string_view text);

// Global rules (all threads). Initialised from KEEL_VERBOSE at start-up; replaced here.
void setGlobalVerboseRules(std::vector<VerboseRule> rules);
std::vector<VerboseRule> globalVerboseRules();

// Turns verbose on for the code section it lives in (this thread), for the given rules only.
// VerboseGuard g;                      // everything inside this section
// VerboseGuard g("blocks.3.attn");      // only ops inside blocks.3.attn
// VerboseGuard g("blocks.1:backward");  // only the backward ops of blocks.1
// VerboseGuard g(std::vector<VerboseRule>{{"blocks.1", Phase::Backward}});  // the same
class VerboseGuard : NonCopyable {
 public:
  VerboseGuard();
  explicit VerboseGuard(std::vector<VerboseRule> rules);
  explicit VerboseGuard(std::string_view rules);  // parseVerboseRules syntax
  ~VerboseGuard();

 private:
  size_t prevSize_;
};

// Re-reads KEEL_LOG_LEVEL and KEEL_VERBOSE (done once at start-up); a malformed value is
// reported on stderr and ignored. Returns false if either was malformed.
bool readLogEnv();

// Whether a verbose rule matches the current scope and phase on this thread.
bool verboseEnabled();
bool verboseEnabled(std::string_view scope, Phase phase);

namespace detail {
// Any live guard or global rule: the count in the instrumentation word (Note [One load per op]).
inline bool verboseActive() {
  return verboseIn(instrumentation());
}
}  // namespace detail

}  // namespace keel
