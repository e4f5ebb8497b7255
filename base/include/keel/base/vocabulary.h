// The shared vocabulary's enums and their one spelling each: phases, memory-event kinds, memory
// tags, log levels and allocator kinds. The engine reports with them, storage stores and hands
// them out, views and the command line show them: nothing re-declares or re-spells them.
// Invariant: each enum's names table is indexed by the enum's value; parse* accepts exactly those.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string_view>

namespace keel {

namespace detail {
template <typename E, size_t N>
constexpr std::string_view enumName(const std::array<std::string_view, N>& names, E e) {
  return size_t(e) < N ? names[size_t(e)] : std::string_view("?");
}
template <typename E, size_t N>
constexpr std::optional<E> enumParse(const std::array<std::string_view, N>& names,
                                     std::string_view s) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == s) return E(i);
  return std::nullopt;
}
}  // namespace detail

enum class Phase : uint8_t { Forward, Backward, Optimizer };
inline constexpr std::array<std::string_view, 3> kPhaseNames = {"forward", "backward", "optimizer"};
constexpr std::string_view phaseName(Phase p) {
  return detail::enumName(kPhaseNames, p);
}
constexpr std::optional<Phase> parsePhase(std::string_view s) {
  return detail::enumParse<Phase>(kPhaseNames, s);
}

// Alloc/Free: a block handed out or given back. Reserve/Release: memory obtained from or returned
// to the system (caching segments; VMM chunks released with a punched hole). Map/Unmap: a VMM chunk
// mapped into or taken out of the address range. Move: a free VMM chunk remapped from `address` to
// `toAddress` (no byte copied). Compact: a live block copied from `address` to `toAddress` (its
// Buffer follows). TrackBegin/TrackEnd: a memory tracking section (`label`) starts or ends.
// Oom: a request the allocator refused (`bytes` requested; allocated and reserved unchanged).
enum class MemEventKind : uint8_t {
  Alloc,
  Free,
  Reserve,
  Release,
  Map,
  Unmap,
  Move,
  Compact,
  TrackBegin,
  TrackEnd,
  Oom
};
inline constexpr std::array<std::string_view, 11> kMemEventNames = {
    "alloc", "free",    "reserve",     "release",   "map", "unmap",
    "move",  "compact", "track_begin", "track_end", "oom"};
constexpr std::string_view memEventName(MemEventKind k) {
  return detail::enumName(kMemEventNames, k);
}
constexpr std::optional<MemEventKind> parseMemEventKind(std::string_view s) {
  return detail::enumParse<MemEventKind>(kMemEventNames, s);
}

// What a block holds, set by the code that allocates it (MemTagScope); the memory view turns it
// into "why is this still alive". None: an op's output or temporary (its phase says more).
enum class MemTag : uint8_t { None, Parameter, OptimizerState, Data };
inline constexpr std::array<std::string_view, 4> kMemTagNames = {"", "parameter", "optimizer_state",
                                                                 "data"};
constexpr std::string_view memTagName(MemTag t) {
  return detail::enumName(kMemTagNames, t);
}
constexpr std::optional<MemTag> parseMemTag(std::string_view s) {
  return detail::enumParse<MemTag>(kMemTagNames, s);
}

enum class LogLevel : uint8_t { Error = 0, Warn = 1, Info = 2, Debug = 3, Verbose = 4 };
inline constexpr std::array<std::string_view, 5> kLogLevelNames = {"error", "warn", "info", "debug",
                                                                   "verbose"};
constexpr std::string_view logLevelName(LogLevel l) {
  return detail::enumName(kLogLevelNames, l);
}
constexpr std::optional<LogLevel> parseLogLevel(std::string_view s) {
  return detail::enumParse<LogLevel>(kLogLevelNames, s);
}

enum class AllocatorKind : uint8_t { Host, Caching, Vmm };
inline constexpr std::array<std::string_view, 3> kAllocatorKindNames = {"host", "caching", "vmm"};
constexpr std::string_view allocatorKindName(AllocatorKind k) {
  return detail::enumName(kAllocatorKindNames, k);
}
constexpr std::optional<AllocatorKind> parseAllocatorKind(std::string_view s) {
  return detail::enumParse<AllocatorKind>(kAllocatorKindNames, s);
}

// Streams print an enum by its name (CSV exports, messages).
inline std::ostream& operator<<(std::ostream& os, Phase p) {
  return os << phaseName(p);
}
inline std::ostream& operator<<(std::ostream& os, MemEventKind k) {
  return os << memEventName(k);
}
inline std::ostream& operator<<(std::ostream& os, MemTag t) {
  return os << memTagName(t);
}

}  // namespace keel
