// What the stages of the AOA implementation (keel/aoa.h) share: parse.cpp (lexer, parser),
// expand.cpp (macros), check.cpp (typed statements), keys.cpp (the key space, box arithmetic) and
// eval.cpp (one evaluator per statement kind). Like keel/aoa.h, no tensor code.
#pragma once
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "keel/aoa.h"

namespace keel::aoa::detail {

// Throws keel::Error "<src>:<line>:<col>: <msg>".
[[noreturn]] void fail(const std::string& src, Pos p, const std::string& msg);
std::string dimsStr(const Dims& d);

// ---- the key space and box arithmetic (keys.cpp) ---------------------------------------------

// A source key as a target key: one piece, the whole key, axes in order.
TargetKey identityKey(const SourceKey& k, uint32_t index);

// The key space of Note [AOA semantics] (eval.cpp).
class Space {
 public:
  explicit Space(const std::vector<SourceKey>& src);
  bool has(const std::string& n) const { return index_.count(n) != 0; }
  const TargetKey& get(const std::string& n) const { return slots_[index_.at(n)]; }
  // A key's place in the result (Note [Key order] in eval.cpp): its path, compared
  // lexicographically.
  using Place = std::vector<uint32_t>;
  const Place& placeOf(const std::string& n) const { return places_[index_.at(n)]; }
  // Adds k at `place`; an empty place puts it after every key so far (a declared key).
  void add(TargetKey k, Place place = {});
  // Removes key n, consumed by the rule on `line`.
  TargetKey take(const std::string& n, int line);
  // The optimizer state suffixes present for a base key ("exp_avg", "step", ...).
  std::set<std::string> statesOf(const std::string& base) const;
  int consumedAt(const std::string& n) const;  // 0: never consumed
  // Base keys (no "::") that start with `prefix`, in space order. An ordered index finds them,
  // so a wildcard in each of a macro's instances reads only its own keys, not all of them once
  // per instance (See Note [Linear headers] in ckpt/json_keys.h).
  std::vector<std::string> baseKeys(std::string_view prefix = {}) const;
  // " (keys look like '<first key>')", for "matches no key" messages.
  std::string nearKeyHint() const;
  Result result();

 private:
  std::vector<TargetKey> slots_;
  std::vector<Place> places_;
  uint32_t nextPlace_ = 0;  // the next top-level place
  std::vector<bool> alive_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, size_t, std::less<>> bases_;  // live base keys -> slot, for prefixes
  std::unordered_map<std::string, std::set<std::string>> states_;
  std::unordered_map<std::string, int> consumedAt_;
};

// Elements [start, start + len) of axis `axis` of k.
TargetKey sliceKey(const TargetKey& k, size_t axis, int64_t start, int64_t len);
// parts joined along axis (dtypes and other extents already checked equal).
TargetKey concatKeys(const std::vector<TargetKey>& parts, size_t axis);
// Target axis d is k's axis perm[d].
TargetKey permuteKey(const TargetKey& k, const std::vector<int8_t>& perm);
// Casts go between float types, or widen integers.
bool castable(st::DType from, st::DType to);

// ---- macro expansion (expand.cpp) ------------------------------------------------------------

// Expands one statement's macros in three stages, counting every name produced against one
// budget for the whole program (a hostile file cannot expand without bound): 100,000 names, or
// four per key of the checkpoint when that is more (a plain `layers.$LAYER_ID.* ->
// blocks.$LAYER_ID.*` over 200,000 keys names each key twice, and was refused).
class Expander {
 public:
  Expander(const std::string& src, size_t keys)
      : src_(src), limit_(std::max<size_t>(100'000, 4 * keys)) {}
  // 1. [a:b] ranges expand a name in place.
  Statement expandRanges(const Statement& s);
  // 2. $LAYER_ID / $EXPERT_ID / $LAYER_ID_OFFSET instantiate the statement per id found among
  // the keys present.
  std::vector<Statement> expandVariables(const Statement& s, const Space& space);
  // 3. * wildcards expand to matching keys (in numeric order).
  std::vector<Statement> expandWildcards(const Statement& s, const Space& space);

 private:
  void budget(size_t n, Pos pos);  // pos: the name that expands
  std::vector<Name> expandRanges(const std::vector<Name>& names);
  void expandRange(const Name& n, std::vector<Name>& out);

  const std::string& src_;
  size_t limit_;
  size_t expanded_ = 0;
};

// ---- typed statements (check.cpp) ------------------------------------------------------------

enum class Kind { Declare, Drop, Rename, Concat, Split, QkvFuse, QkvSplit, FfnFuse, FfnSplit };

// A statement's options, parsed.
struct Options {
  std::optional<int64_t> axis;
  std::optional<std::vector<int8_t>> permute;
  std::optional<st::DType> dtype;
  std::optional<int64_t> numHeads, numKvGroups, chunks;
  std::optional<Dims> shape;
  Pos axisPos, permutePos, dtypePos, headsPos, chunksPos, shapePos;
};

// A concrete statement (macros expanded) once checked on its own: its kind, its options parsed
// and allowed for that kind (num_key_value_groups defaulted), '_' and '^T' where they may be.
// What is left to check needs the key space (eval.cpp).
struct Typed {
  Kind kind = Kind::Rename;
  Options options;
  Pos flagPos;  // fused_qkv / fused_ffn, else the statement's
};

// At most one of fused_qkv, fused_ffn (checked before expansion).
void checkFlags(const std::string& src, const Statement& s);
Typed check(const std::string& src, const Statement& s);

}  // namespace keel::aoa::detail
