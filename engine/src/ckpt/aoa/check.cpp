// AOA, stage 3: the checker. A concrete statement (macros expanded) becomes a typed one: its
// kind (declare, drop, rename, concatenate, split, fused q/k/v or gate/up either way) from its
// shape and flags, its options parsed and allowed for that kind. Needs no key space.
#include <algorithm>
#include <cctype>
#include <limits>

#include "aoa_internal.h"
#include "keel/error.h"

namespace keel::aoa::detail {

namespace {

int64_t parseInt(const std::string& src, const Option& o) {
  const std::string& v = o.value;
  size_t i = (!v.empty() && (v[0] == '-' || v[0] == '+')) ? 1 : 0;
  if (i >= v.size() || v.size() > 18 || !std::all_of(v.begin() + long(i), v.end(), ::isdigit))
    fail(src, o.valuePos, "option " + o.key + "= expects an integer, found '" + v + "'");
  return std::stoll(v);
}

// "[1, 0, 2]" -> {1, 0, 2}
std::vector<int64_t> parseIntList(const std::string& src, const Option& o) {
  std::string v = o.value;
  std::vector<int64_t> out;
  size_t i = 0;
  auto ws = [&] {
    while (i < v.size() && std::isspace(static_cast<unsigned char>(v[i]))) ++i;
  };
  auto bad = [&] {
    fail(src, o.valuePos,
         "option " + o.key + "= expects a list of integers like \"[1, 0]\", found \"" + v + "\"");
  };
  ws();
  if (i >= v.size() || v[i] != '[') bad();
  ++i;
  ws();
  if (i < v.size() && v[i] == ']') {
    ++i;
  } else {
    for (;;) {
      ws();
      size_t s = i;
      if (i < v.size() && v[i] == '-') ++i;
      while (i < v.size() && std::isdigit(static_cast<unsigned char>(v[i]))) ++i;
      if (i == s || (i == s + 1 && v[s] == '-') || i - s > 18) bad();
      out.push_back(std::stoll(v.substr(s, i - s)));
      if (out.size() > st::kMaxRank) bad();
      ws();
      if (i < v.size() && v[i] == ',') {
        ++i;
        continue;
      }
      if (i < v.size() && v[i] == ']') {
        ++i;
        break;
      }
      bad();
    }
  }
  ws();
  if (i != v.size()) bad();
  return out;
}

Options parseOptions(const std::string& src, const Statement& s) {
  Options o;
  std::set<std::string> seen;
  for (const Option& opt : s.options) {
    if (!seen.insert(opt.key).second) fail(src, opt.pos, "option '" + opt.key + "' given twice");
    if (opt.key == "axis") {
      o.axis = parseInt(src, opt);
      o.axisPos = opt.valuePos;
    } else if (opt.key == "permute") {
      auto v = parseIntList(src, opt);
      std::vector<bool> used(v.size(), false);
      std::vector<int8_t> p;
      for (int64_t x : v) {
        if (x < 0 || x >= int64_t(v.size()) || used[size_t(x)])
          fail(src, opt.valuePos,
               "permute=\"" + opt.value + "\" is not a permutation of 0.." +
                   std::to_string(int64_t(v.size()) - 1));
        used[size_t(x)] = true;
        p.push_back(int8_t(x));
      }
      o.permute = p;
      o.permutePos = opt.valuePos;
    } else if (opt.key == "dtype") {
      try {
        o.dtype = st::parseDTypeName(opt.value);
      } catch (const Error& e) {
        fail(src, opt.valuePos, e.what());
      }
      o.dtypePos = opt.valuePos;
    } else if (opt.key == "num_heads" || opt.key == "num_key_value_groups" || opt.key == "chunks") {
      int64_t v = parseInt(src, opt);
      if (v <= 0) fail(src, opt.valuePos, "option " + opt.key + "= must be positive");
      if (opt.key == "num_heads") {
        o.numHeads = v;
        o.headsPos = opt.valuePos;
      } else if (opt.key == "chunks") {
        o.chunks = v;
        o.chunksPos = opt.valuePos;
      } else {
        o.numKvGroups = v;
      }
    } else if (opt.key == "shape") {
      auto v = parseIntList(src, opt);
      // Its element count must fit 64 bits (with 8-byte elements): a declared key that no tensor
      // could hold (said later without the rule's place).
      uint64_t elements = 8;
      for (int64_t x : v) {
        if (x < 0) fail(src, opt.valuePos, "shape= entries must be non-negative");
        if (x != 0 && elements > std::numeric_limits<uint64_t>::max() / uint64_t(x))
          fail(src, opt.valuePos, "shape= " + opt.value + " holds more than 2^64 bytes");
        elements *= uint64_t(std::max<int64_t>(x, 1));
      }
      o.shape = v;
      o.shapePos = opt.valuePos;
    } else {
      fail(src, opt.pos,
           "unknown option '" + opt.key +
               "' (expected axis, permute, dtype, num_heads, num_key_value_groups, chunks or "
               "shape)");
    }
  }
  return o;
}

// A fused flag's two directions: `parts` keys fused into one, or one split back into them.
struct FusedForm {
  const char* flag;
  size_t parts;
  Kind fuse, split;
  const char* usage;
};
constexpr FusedForm kFusedForms[] = {
    {"fused_qkv", 3, Kind::QkvFuse, Kind::QkvSplit, "'q, k, v -> qkv' or 'qkv -> q, k, v'"},
    {"fused_ffn", 2, Kind::FfnFuse, Kind::FfnSplit, "'gate, up -> fused' or 'fused -> gate, up'"},
};
const FusedForm* fusedForm(const std::string& flag) {
  for (const FusedForm& f : kFusedForms)
    if (flag == f.flag) return &f;
  return nullptr;
}

}  // namespace

void checkFlags(const std::string& src, const Statement& s) {
  for (const Name& f : s.flags)
    if (s.flags.size() > 1)
      fail(src, f.pos, "a statement takes at most one of fused_qkv, fused_ffn");
}

Typed check(const std::string& src, const Statement& s) {
  if (s.lhs.empty() || s.rhs.empty()) fail(src, s.pos, "statement expands to no names");
  Typed t;
  Options& o = t.options;
  o = parseOptions(src, s);
  const size_t nl = s.lhs.size(), nr = s.rhs.size();
  const bool lhsBlank = nl == 1 && s.lhs[0].blank;
  const bool rhsBlank = nr == 1 && s.rhs[0].blank;
  for (const auto& n : s.lhs)
    if (n.blank && nl > 1) fail(src, n.pos, "'_' must stand alone on the source side");
  for (const auto& n : s.rhs)
    if (n.blank && nr > 1) fail(src, n.pos, "'_' must stand alone on the target side");
  std::string flag = s.flags.empty() ? "" : s.flags[0].text;
  t.flagPos = s.flags.empty() ? s.pos : s.flags[0].pos;
  const Pos flagPos = t.flagPos;

  Kind& kind = t.kind;
  if (lhsBlank && rhsBlank) fail(src, s.pos, "'_ -> _' does nothing");
  if (lhsBlank) {
    kind = Kind::Declare;
  } else if (rhsBlank) {
    kind = Kind::Drop;
  } else if (const FusedForm* f = fusedForm(flag)) {
    if (nl == f->parts && nr == 1)
      kind = f->fuse;
    else if (nl == 1 && nr == f->parts)
      kind = f->split;
    else
      fail(src, flagPos,
           std::string(f->flag) + " expects " + f->usage + ", got " + std::to_string(nl) + " -> " +
               std::to_string(nr) + " keys");
  } else if (nl == nr && !o.axis) {
    kind = Kind::Rename;
  } else if (nl >= 2 && nr == 1) {
    if (!o.axis)
      fail(src, s.rhs[0].pos, "concatenating " + std::to_string(nl) + " keys needs axis=N");
    kind = Kind::Concat;
  } else if (nl == 1 && nr >= 2) {
    // A mistyped flag reads as a second target ("a -> b, fused_qvk"): name it as such.
    for (const Name& n : s.rhs)
      if (!o.axis && n.text.rfind("fused_", 0) == 0)
        fail(src, n.pos,
             "'" + n.text + "' is not a flag (the flags are fused_qkv and fused_ffn); as a " +
                 "target name, splitting into " + std::to_string(nr) + " keys needs axis=N");
    if (!o.axis)
      fail(src, s.rhs[0].pos, "splitting into " + std::to_string(nr) + " keys needs axis=N");
    kind = Kind::Split;
  } else if (nl == nr) {
    fail(src, o.axisPos,
         "axis= concatenates several sources into one target or splits one source into several; " +
             std::string(nl == 1 ? "one source and one target is a rename, which takes no axis="
                                 : "with as many targets as sources (a rename) it has no use"));
  } else {
    fail(src, s.pos,
         std::to_string(nl) + " sources and " + std::to_string(nr) +
             " targets: expected n -> n (rename), n -> 1 with axis= (concatenate) "
             "or 1 -> n with axis= (split)");
  }
  // Options each kind accepts.
  auto allow = [&](std::initializer_list<const char*> ok) {
    for (const Option& opt : s.options)
      if (std::none_of(ok.begin(), ok.end(), [&](const char* k) { return opt.key == k; }))
        fail(src, opt.pos, "option '" + opt.key + "' does not apply to this statement");
  };
  switch (kind) {
    case Kind::Declare:
      allow({"shape", "dtype"});
      break;
    case Kind::Drop:
      allow({});
      for (const auto& n : s.lhs)
        if (n.transpose) fail(src, n.pos, "a dropped key cannot be transposed");
      break;
    case Kind::Rename:
      allow({"permute", "dtype"});
      break;
    case Kind::Concat:
    case Kind::Split:
      allow({"axis", "permute", "dtype"});
      break;
    case Kind::QkvFuse:
    case Kind::QkvSplit:
      allow({"axis", "num_heads", "num_key_value_groups", "dtype"});
      if (!o.numHeads) fail(src, flagPos, "fused_qkv needs num_heads=N");
      if (!o.numKvGroups) o.numKvGroups = o.numHeads;
      if (*o.numHeads % *o.numKvGroups != 0)
        fail(src, o.headsPos,
             "num_heads=" + std::to_string(*o.numHeads) +
                 " is not a multiple of num_key_value_groups=" + std::to_string(*o.numKvGroups));
      break;
    case Kind::FfnFuse:
    case Kind::FfnSplit:
      allow({"axis", "chunks", "dtype"});
      if (!o.chunks) fail(src, flagPos, "fused_ffn needs chunks=N (see docs/checkpoint.md)");
      break;
  }
  for (const auto& n : s.rhs)
    if (n.transpose) fail(src, n.pos, "'^T' belongs on the source side");
  return t;
}

}  // namespace keel::aoa::detail
