// The AOA rule language: a line-oriented lexer and parser, macro expansion ($LAYER_ID,
// $EXPERT_ID, $LAYER_ID_OFFSET, [a:b] ranges, * wildcards) and the statement semantics over
// "pieces" (boxes of source keys). See Note [AOA semantics].
#include "keel/aoa.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include "keel/error.h"

namespace keel::aoa {

// Note [AOA semantics]
// Statements run in order over a key space that starts as the source checkpoint's keys. A
// statement consumes its source keys and produces its targets; a target that already exists (an
// untouched source key or an earlier product) is an error, as is a source that is missing (never
// there, or consumed earlier). Whatever is left at the end is the target layout, so a key no rule
// mentions is copied from the same-named source key. No statement moves bytes: each key is a list
// of pieces (a box of one source key, an axis permutation and a chain of casts), and every
// primitive is arithmetic on those boxes — concatenation shifts pieces, a split intersects them,
// ^T and permute reorder their axes, a cast appends to their chain. fused_qkv and fused_ffn are
// concatenations of slices. A key's optimizer state ("<key>::exp_avg", "<key>::step", ...)
// follows every rule applied to the key: tensors shaped like the key get the same primitive;
// rank-0 state (AdamW's step counter) is copied from the first source to every target and is
// never cast. Macros expand before a statement runs, against the keys present at that point.

bool Piece::identityPerm() const {
  for (size_t d = 0; d < perm.size(); ++d)
    if (perm[d] != int8_t(d)) return false;
  return true;
}

namespace {

constexpr size_t kMaxExpandedNames = 100'000;

std::string posStr(const std::string& src, Pos p) {
  return src + ":" + std::to_string(p.line) + ":" + std::to_string(p.col);
}

[[noreturn]] void fail(const std::string& src, Pos p, const std::string& msg) {
  throw Error(posStr(src, p) + ": " + msg);
}

// ---- lexer -----------------------------------------------------------------------------------

enum class Tok { Word, String, Arrow, Comma, Equals, Caret, End };

struct Token {
  Tok kind = Tok::End;
  std::string text;
  Pos pos;
};

bool isWordChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '$' ||
         c == '*' || c == '[' || c == ']' || c == ':' || c == '/' || c == '+' || c == '@' ||
         c == '-';
}

std::string printable(char c) {
  auto u = static_cast<unsigned char>(c);
  if (u >= 0x21 && u < 0x7f) return std::string("'") + c + "'";
  char buf[16];
  std::snprintf(buf, sizeof buf, "byte 0x%02x", unsigned(u));
  return buf;
}

std::vector<Token> lexLine(std::string_view line, int lineNo, const std::string& src) {
  std::vector<Token> out;
  size_t i = 0;
  auto at = [&](size_t k) { return Pos{lineNo, int(k) + 1}; };
  while (i < line.size()) {
    char c = line[i];
    if (c == ' ' || c == '\t' || c == '\r') {
      ++i;
    } else if (c == '#') {
      break;
    } else if (c == '-' && i + 1 < line.size() && line[i + 1] == '>') {
      out.push_back({Tok::Arrow, "->", at(i)});
      i += 2;
    } else if (c == ',') {
      out.push_back({Tok::Comma, ",", at(i)});
      ++i;
    } else if (c == '=') {
      out.push_back({Tok::Equals, "=", at(i)});
      ++i;
    } else if (c == '^') {
      if (i + 1 >= line.size() || line[i + 1] != 'T')
        fail(src, at(i), "expected 'T' after '^' (x^T transposes x)");
      out.push_back({Tok::Caret, "^T", at(i)});
      i += 2;
    } else if (c == '"' || c == '\'') {
      size_t start = i++;
      std::string text;
      bool closed = false;
      while (i < line.size()) {
        if (line[i] == '\\' && i + 1 < line.size()) {
          text.push_back(line[i + 1]);
          i += 2;
        } else if (line[i] == c) {
          closed = true;
          ++i;
          break;
        } else {
          text.push_back(line[i++]);
        }
      }
      if (!closed)
        fail(src, at(start), "unterminated string (expected a closing " + printable(c) + ")");
      out.push_back({Tok::String, std::move(text), at(start)});
    } else if (isWordChar(c)) {
      size_t start = i;
      while (i < line.size() && isWordChar(line[i]) &&
             !(line[i] == '-' && i + 1 < line.size() && line[i + 1] == '>'))
        ++i;
      out.push_back({Tok::Word, std::string(line.substr(start, i - start)), at(start)});
    } else {
      fail(src, at(i),
           "unexpected " + printable(c) + " (expected a key name, ',', '->', '=' or '^T')");
    }
  }
  out.push_back({Tok::End, "", at(line.size())});
  return out;
}

std::string describe(const Token& t) {
  switch (t.kind) {
    case Tok::Word:
      return "'" + t.text + "'";
    case Tok::String:
      return "string \"" + t.text + "\"";
    case Tok::Arrow:
      return "'->'";
    case Tok::Comma:
      return "','";
    case Tok::Equals:
      return "'='";
    case Tok::Caret:
      return "'^T'";
    case Tok::End:
      return "end of line";
  }
  return "?";
}

bool isFlag(const std::string& w) {
  return w == "fused_qkv" || w == "fused_ffn";
}

std::optional<Statement> parseLine(const std::vector<Token>& toks, const std::string& src) {
  if (toks.front().kind == Tok::End) return std::nullopt;
  Statement s;
  s.pos = toks.front().pos;
  size_t i = 0;
  // Left side: operand {',' operand} '->'
  for (;;) {
    const Token& t = toks[i];
    if (t.kind != Tok::Word && t.kind != Tok::String)
      fail(src, t.pos,
           "expected a source key name or '_', found " + describe(t) +
               (s.lhs.empty() ? "" : " after ','"));
    Name n;
    n.text = t.text;
    n.pos = t.pos;
    n.blank = t.kind == Tok::Word && t.text == "_";
    ++i;
    if (toks[i].kind == Tok::Caret) {
      if (n.blank) fail(src, toks[i].pos, "'_' cannot be transposed");
      n.transpose = true;
      ++i;
    }
    s.lhs.push_back(std::move(n));
    if (toks[i].kind == Tok::Comma) {
      ++i;
      continue;
    }
    if (toks[i].kind == Tok::Arrow) {
      ++i;
      break;
    }
    fail(src, toks[i].pos,
         "expected ',' or '->' after '" + s.lhs.back().text + "', found " + describe(toks[i]));
  }
  // Right side: target {',' target} {',' (flag | option)}
  bool optionsStarted = false;
  for (;;) {
    const Token& t = toks[i];
    if (t.kind != Tok::Word && t.kind != Tok::String)
      fail(src, t.pos,
           std::string("expected a target key name, '_'") +
               (s.rhs.empty() ? "" : ", fused_qkv, fused_ffn or an option (name=value)") +
               ", found " + describe(t));
    if (t.kind == Tok::Word && toks[i + 1].kind == Tok::Equals) {
      Option o;
      o.key = t.text;
      o.pos = t.pos;
      const Token& v = toks[i + 2];
      if (v.kind != Tok::Word && v.kind != Tok::String)
        fail(src, v.pos, "expected a value after '" + t.text + "=', found " + describe(v));
      o.value = v.text;
      o.valuePos = v.pos;
      if (s.rhs.empty())
        fail(src, t.pos, "expected a target key name before option '" + o.key + "'");
      s.options.push_back(std::move(o));
      optionsStarted = true;
      i += 3;
    } else if (t.kind == Tok::Word && isFlag(t.text)) {
      if (s.rhs.empty()) fail(src, t.pos, "expected a target key name before " + t.text);
      s.flags.push_back(Name{t.text, t.pos, false, false});
      optionsStarted = true;
      ++i;
    } else {
      if (optionsStarted)
        fail(src, t.pos,
             "target key name " + describe(t) + " after options (target names come first)");
      Name n;
      n.text = t.text;
      n.pos = t.pos;
      n.blank = t.kind == Tok::Word && t.text == "_";
      s.rhs.push_back(std::move(n));
      ++i;
    }
    if (toks[i].kind == Tok::Comma) {
      ++i;
      continue;
    }
    if (toks[i].kind == Tok::End) break;
    if (toks[i].kind == Tok::Caret)
      fail(src, toks[i].pos, "'^T' belongs on the source side (write 'x^T -> y')");
    fail(src, toks[i].pos, "expected ',' or end of line, found " + describe(toks[i]));
  }
  return s;
}

}  // namespace

Program parse(std::string_view text, const std::string& source) {
  Program p;
  p.source = source;
  int lineNo = 0;
  size_t start = 0;
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    std::string_view line =
        text.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start);
    ++lineNo;
    auto toks = lexLine(line, lineNo, source);
    if (auto s = parseLine(toks, source)) p.statements.push_back(std::move(*s));
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  return p;
}

Program parseFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KEEL_CHECK(in.good(), path, ": cannot open AOA rules file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

// ---- semantics -------------------------------------------------------------------------------

namespace {

std::string dimsStr(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// The key space of Note [AOA semantics].
class Space {
 public:
  explicit Space(const std::vector<SourceKey>& src) {
    for (uint32_t i = 0; i < src.size(); ++i) {
      TargetKey k;
      k.name = src[i].name;
      k.dtype = src[i].dtype;
      k.shape = src[i].shape;
      Piece p;
      p.src = i;
      p.dstOff.assign(k.shape.size(), 0);
      p.srcOff.assign(k.shape.size(), 0);
      p.shape = k.shape;
      p.perm.resize(k.shape.size());
      std::iota(p.perm.begin(), p.perm.end(), int8_t(0));
      k.pieces.push_back(std::move(p));
      add(std::move(k));
    }
  }
  bool has(const std::string& n) const { return index_.count(n) != 0; }
  const TargetKey& get(const std::string& n) const { return slots_[index_.at(n)]; }
  void add(TargetKey k) {
    std::string n = k.name;
    index_[n] = slots_.size();
    slots_.push_back(std::move(k));
    alive_.push_back(true);
    auto sep = n.find(kStateSeparator);
    if (sep != std::string::npos) states_[n.substr(0, sep)].insert(n.substr(sep + 2));
  }
  TargetKey take(const std::string& n, int line) {
    size_t i = index_.at(n);
    index_.erase(n);
    alive_[i] = false;
    consumedAt_[n] = line;
    auto sep = n.find(kStateSeparator);
    if (sep != std::string::npos) {
      auto it = states_.find(n.substr(0, sep));
      if (it != states_.end()) it->second.erase(n.substr(sep + 2));
    }
    return std::move(slots_[i]);
  }
  std::set<std::string> statesOf(const std::string& base) const {
    auto it = states_.find(base);
    return it == states_.end() ? std::set<std::string>{} : it->second;
  }
  int consumedAt(const std::string& n) const {
    auto it = consumedAt_.find(n);
    return it == consumedAt_.end() ? 0 : it->second;
  }
  // Base keys (no "::"), in space order.
  std::vector<std::string> baseKeys() const {
    std::vector<std::string> out;
    for (size_t i = 0; i < slots_.size(); ++i)
      if (alive_[i] && slots_[i].name.find(kStateSeparator) == std::string::npos)
        out.push_back(slots_[i].name);
    return out;
  }
  Result result() {
    Result r;
    for (size_t i = 0; i < slots_.size(); ++i)
      if (alive_[i]) r.keys.push_back(std::move(slots_[i]));
    return r;
  }

 private:
  std::vector<TargetKey> slots_;
  std::vector<bool> alive_;
  std::unordered_map<std::string, size_t> index_;
  std::unordered_map<std::string, std::set<std::string>> states_;
  std::unordered_map<std::string, int> consumedAt_;
};

// ---- pattern matching for macros -------------------------------------------------------------

enum class Seg { Lit, Layer, LayerOffset, Expert, Star };
struct Segment {
  Seg kind;
  std::string lit;
};

std::vector<Segment> compile(const std::string& text) {
  std::vector<Segment> segs;
  size_t i = 0;
  std::string lit;
  auto flush = [&] {
    if (!lit.empty()) segs.push_back({Seg::Lit, lit});
    lit.clear();
  };
  while (i < text.size()) {
    if (text.compare(i, 16, "$LAYER_ID_OFFSET") == 0) {
      flush();
      segs.push_back({Seg::LayerOffset, ""});
      i += 16;
    } else if (text.compare(i, 9, "$LAYER_ID") == 0) {
      flush();
      segs.push_back({Seg::Layer, ""});
      i += 9;
    } else if (text.compare(i, 10, "$EXPERT_ID") == 0) {
      flush();
      segs.push_back({Seg::Expert, ""});
      i += 10;
    } else if (text[i] == '*') {
      flush();
      segs.push_back({Seg::Star, ""});
      ++i;
    } else {
      lit.push_back(text[i++]);
    }
  }
  flush();
  return segs;
}

bool hasMacro(const std::string& t) {
  return t.find("$LAYER_ID") != std::string::npos || t.find("$EXPERT_ID") != std::string::npos;
}

// Matches key against segments; captures are the texts matched by the non-literal segments.
bool match(const std::vector<Segment>& segs, size_t si, std::string_view key, size_t ki,
           std::vector<std::string>& caps) {
  if (si == segs.size()) return ki == key.size();
  const Segment& s = segs[si];
  if (s.kind == Seg::Lit) {
    if (key.compare(ki, s.lit.size(), s.lit) != 0) return false;
    return match(segs, si + 1, key, ki + s.lit.size(), caps);
  }
  const bool digits = s.kind != Seg::Star;
  size_t end = ki;
  while (end < key.size() &&
         (digits ? std::isdigit(static_cast<unsigned char>(key[end])) != 0 : key[end] != '.'))
    ++end;
  for (size_t e = end; e > ki; --e) {
    caps.push_back(std::string(key.substr(ki, e - ki)));
    if (match(segs, si + 1, key, e, caps)) return true;
    caps.pop_back();
  }
  return false;
}

// Numeric-aware ordering of capture tuples ("2" < "10").
bool naturalLess(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const std::string &x = a[i], &y = b[i];
    bool nx = !x.empty() && std::all_of(x.begin(), x.end(), ::isdigit);
    bool ny = !y.empty() && std::all_of(y.begin(), y.end(), ::isdigit);
    if (nx && ny) {
      std::string_view sx = x, sy = y;
      while (sx.size() > 1 && sx[0] == '0') sx.remove_prefix(1);
      while (sy.size() > 1 && sy[0] == '0') sy.remove_prefix(1);
      if (sx.size() != sy.size()) return sx.size() < sy.size();
      if (sx != sy) return sx < sy;
    } else if (x != y) {
      return x < y;
    }
  }
  return a.size() < b.size();
}

void replaceAll(std::string& s, std::string_view from, const std::string& to) {
  size_t p = 0;
  while ((p = s.find(from, p)) != std::string::npos) {
    s.replace(p, from.size(), to);
    p += to.size();
  }
}

// ---- piece arithmetic ------------------------------------------------------------------------

TargetKey sliceKey(const TargetKey& k, size_t axis, int64_t start, int64_t len) {
  TargetKey out;
  out.dtype = k.dtype;
  out.shape = k.shape;
  out.shape[axis] = len;
  for (const Piece& p : k.pieces) {
    int64_t lo = std::max(p.dstOff[axis], start);
    int64_t hi = std::min(p.dstOff[axis] + p.shape[axis], start + len);
    if (lo >= hi) continue;
    Piece q = p;
    q.srcOff[size_t(p.perm[axis])] += lo - p.dstOff[axis];
    q.dstOff[axis] = lo - start;
    q.shape[axis] = hi - lo;
    out.pieces.push_back(std::move(q));
  }
  return out;
}

TargetKey concatKeys(const std::vector<TargetKey>& parts, size_t axis) {
  TargetKey out;
  out.dtype = parts.front().dtype;
  out.shape = parts.front().shape;
  out.shape[axis] = 0;
  for (const auto& k : parts) {
    for (Piece p : k.pieces) {
      p.dstOff[axis] += out.shape[axis];
      out.pieces.push_back(std::move(p));
    }
    out.shape[axis] += k.shape[axis];
  }
  return out;
}

TargetKey permuteKey(const TargetKey& k, const std::vector<int8_t>& perm) {
  TargetKey out;
  out.dtype = k.dtype;
  out.declared = k.declared;
  out.hasShape = k.hasShape;
  for (size_t d = 0; d < perm.size(); ++d) out.shape.push_back(k.shape[size_t(perm[d])]);
  for (const Piece& p : k.pieces) {
    Piece q = p;
    for (size_t d = 0; d < perm.size(); ++d) {
      q.dstOff[d] = p.dstOff[size_t(perm[d])];
      q.shape[d] = p.shape[size_t(perm[d])];
      q.perm[d] = p.perm[size_t(perm[d])];
    }
    out.pieces.push_back(std::move(q));
  }
  return out;
}

int intRank(st::DType t) {
  switch (t) {
    case st::DType::I8:
      return 1;
    case st::DType::U8:
      return 1;
    case st::DType::I16:
      return 2;
    case st::DType::I32:
      return 3;
    case st::DType::I64:
      return 4;
    default:
      return 0;
  }
}

bool castable(st::DType from, st::DType to) {
  if (from == to) return true;
  if (st::isFloatDType(from) && st::isFloatDType(to)) return true;
  int a = intRank(from), b = intRank(to);
  return a > 0 && b > a;  // integer widening (U8 -> I16/I32/I64 included)
}

// ---- statements ------------------------------------------------------------------------------

struct Options {
  std::optional<int64_t> axis;
  std::optional<std::vector<int8_t>> permute;
  std::optional<st::DType> dtype;
  std::optional<int64_t> numHeads, numKvGroups, chunks;
  std::optional<Dims> shape;
  Pos axisPos, permutePos, dtypePos, headsPos, chunksPos, shapePos;
};

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
      for (int64_t x : v)
        if (x < 0) fail(src, opt.valuePos, "shape= entries must be non-negative");
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

class Evaluator {
 public:
  Evaluator(const Program* prog, const std::vector<SourceKey>& src)
      : src_(prog ? prog->source : std::string("<aoa>")), space_(src) {}

  void run(const Statement& s) {
    for (const Name& f : s.flags)
      if (s.flags.size() > 1)
        fail(src_, f.pos, "a statement takes at most one of fused_qkv, fused_ffn");
    // 1. [a:b] ranges expand a name in place.
    Statement r = s;
    r.lhs = expandRanges(s.lhs);
    r.rhs = expandRanges(s.rhs);
    // 2. $LAYER_ID / $EXPERT_ID / $LAYER_ID_OFFSET instantiate the statement per id found.
    for (Statement& inst : expandVariables(r))
      // 3. * wildcards expand to matching keys (in numeric order).
      for (Statement& c : expandWildcards(inst)) exec(c);
  }

  Result result() { return space_.result(); }

 private:
  void budget(size_t n) {
    expanded_ += n;
    if (expanded_ > kMaxExpandedNames)
      throw Error(src_ + ": rules expand to more than " + std::to_string(kMaxExpandedNames) +
                  " names");
  }

  std::vector<Name> expandRanges(const std::vector<Name>& names) {
    std::vector<Name> out;
    for (const Name& n : names) {
      budget(rangeProduct(n.text));  // all of a name's ranges at once: they multiply
      expandRange(n, out);
    }
    return out;
  }

  // How many names the [a:b] ranges of `t` expand to (saturating above the budget).
  static size_t rangeProduct(const std::string& t) {
    size_t product = 1;
    for (size_t open = t.find('['); open != std::string::npos; open = t.find('[', open + 1)) {
      size_t colon = t.find(':', open), close = t.find(']', open);
      if (colon == std::string::npos || close == std::string::npos || colon > close) continue;
      std::string a = t.substr(open + 1, colon - open - 1),
                  b = t.substr(colon + 1, close - colon - 1);
      if (a.empty() || b.empty() || a.size() > 9 || b.size() > 9 ||
          !std::all_of(a.begin(), a.end(), ::isdigit) ||
          !std::all_of(b.begin(), b.end(), ::isdigit))
        continue;
      int64_t lo = std::stoll(a), hi = std::stoll(b);
      if (hi > lo) product = std::min(product * size_t(hi - lo), kMaxExpandedNames + 1);
    }
    return product;
  }

  void expandRange(const Name& n, std::vector<Name>& out) {
    // First "[a:b]" with a, b decimal.
    const std::string& t = n.text;
    for (size_t open = t.find('['); open != std::string::npos; open = t.find('[', open + 1)) {
      size_t colon = t.find(':', open), close = t.find(']', open);
      if (colon == std::string::npos || close == std::string::npos || colon > close) continue;
      std::string a = t.substr(open + 1, colon - open - 1),
                  b = t.substr(colon + 1, close - colon - 1);
      auto num = [](const std::string& x) {
        return !x.empty() && x.size() <= 9 && std::all_of(x.begin(), x.end(), ::isdigit);
      };
      if (!num(a) || !num(b)) continue;
      int64_t lo = std::stoll(a), hi = std::stoll(b);
      if (lo >= hi)
        fail(src_, Pos{n.pos.line, n.pos.col + int(open)},
             "range [" + a + ":" + b + "] is empty (expected [begin:end] with begin < end)");
      for (int64_t i = lo; i < hi; ++i) {
        Name m = n;
        m.text = t.substr(0, open) + std::to_string(i) + t.substr(close + 1);
        expandRange(m, out);
      }
      return;
    }
    out.push_back(n);
  }

  std::vector<Statement> expandVariables(const Statement& s) {
    bool any = false;
    for (const auto& n : s.lhs) any = any || hasMacro(n.text);
    for (const auto& n : s.rhs) any = any || hasMacro(n.text);
    if (!any) return {s};
    const Name* pat = nullptr;
    for (const auto& n : s.lhs)
      if (hasMacro(n.text)) {
        pat = &n;
        break;
      }
    if (!pat) {
      for (const auto& n : s.rhs)
        if (hasMacro(n.text))
          fail(src_, n.pos,
               "'" + n.text +
                   "' uses $LAYER_ID/$EXPERT_ID but no source name does "
                   "(the ids come from the source keys)");
    }
    auto segs = compile(pat->text);
    bool hasLayer = false, hasExpert = false;
    for (const auto& g : segs) {
      hasLayer = hasLayer || g.kind == Seg::Layer || g.kind == Seg::LayerOffset;
      hasExpert = hasExpert || g.kind == Seg::Expert;
    }
    auto usesLayer = [](const std::string& t) { return t.find("$LAYER_ID") != std::string::npos; };
    auto usesExpert = [](const std::string& t) {
      return t.find("$EXPERT_ID") != std::string::npos;
    };
    for (const auto* side : {&s.lhs, &s.rhs})
      for (const auto& n : *side)
        if ((usesLayer(n.text) && !hasLayer) || (usesExpert(n.text) && !hasExpert))
          fail(src_, n.pos,
               "'" + n.text + "' uses an id that the first macro source name '" + pat->text +
                   "' does not capture");
    // Distinct (layer, expert) ids over the keys present.
    std::set<std::pair<int64_t, int64_t>> ids;
    for (const std::string& key : space_.baseKeys()) {
      std::vector<std::string> caps;
      if (!match(segs, 0, key, 0, caps)) continue;
      int64_t layer = -1, expert = -1;
      bool ok = true;
      size_t c = 0;
      for (const auto& g : segs) {
        if (g.kind == Seg::Lit) continue;
        const std::string& v = caps[c++];
        if (g.kind == Seg::Star) continue;
        if (v.size() > 9) {
          ok = false;
          break;
        }
        int64_t x = std::stoll(v);
        if (g.kind == Seg::LayerOffset) x += 1;
        int64_t& slot = g.kind == Seg::Expert ? expert : layer;
        if (slot >= 0 && slot != x) ok = false;
        slot = x;
      }
      if (ok) ids.insert({layer, expert});
    }
    if (ids.empty()) fail(src_, pat->pos, "'" + pat->text + "' matches no key" + nearKeyHint());
    std::vector<Statement> out;
    budget(ids.size());
    for (auto [layer, expert] : ids) {
      Statement c = s;
      for (auto* side : {&c.lhs, &c.rhs})
        for (auto& n : *side) {
          if (n.text.find("$LAYER_ID_OFFSET") != std::string::npos && layer == 0)
            fail(src_, n.pos, "$LAYER_ID_OFFSET of layer 0 would be -1");
          replaceAll(n.text, "$LAYER_ID_OFFSET", std::to_string(layer - 1));
          replaceAll(n.text, "$LAYER_ID", std::to_string(layer));
          replaceAll(n.text, "$EXPERT_ID", std::to_string(expert));
        }
      out.push_back(std::move(c));
    }
    return out;
  }

  std::string nearKeyHint() const {
    auto keys = space_.baseKeys();
    if (keys.empty()) return " (there are no keys)";
    return " (keys look like '" + keys.front() + "')";
  }

  std::vector<Statement> expandWildcards(const Statement& s) {
    int starLhs = -1;
    for (size_t i = 0; i < s.lhs.size(); ++i)
      if (s.lhs[i].text.find('*') != std::string::npos && !s.lhs[i].blank) {
        if (starLhs >= 0 && std::any_of(s.rhs.begin(), s.rhs.end(), [](const Name& n) {
              return n.text.find('*') != std::string::npos;
            }))
          fail(src_, s.lhs[i].pos, "only one source name may carry '*' when a target name does");
        if (starLhs < 0) starLhs = int(i);
      }
    int starRhs = -1;
    for (size_t i = 0; i < s.rhs.size(); ++i)
      if (s.rhs[i].text.find('*') != std::string::npos) {
        if (starRhs >= 0) fail(src_, s.rhs[i].pos, "only one target name may carry '*'");
        starRhs = int(i);
      }
    if (starRhs >= 0 && starLhs < 0)
      fail(src_, s.rhs[size_t(starRhs)].pos,
           "'*' in a target name needs a source name with '*' to take its text from");
    if (starLhs < 0) return {s};

    // Expand every source name with '*' (in place, natural order).
    auto matchesOf = [&](const Name& n) {
      auto segs = compile(n.text);
      std::vector<std::pair<std::vector<std::string>, std::string>> m;
      for (const std::string& key : space_.baseKeys()) {
        std::vector<std::string> caps;
        if (match(segs, 0, key, 0, caps)) m.push_back({caps, key});
      }
      if (m.empty()) fail(src_, n.pos, "'" + n.text + "' matches no key" + nearKeyHint());
      std::stable_sort(m.begin(), m.end(),
                       [](const auto& a, const auto& b) { return naturalLess(a.first, b.first); });
      budget(m.size());
      return m;
    };
    if (starRhs >= 0) {
      const Name& ln = s.lhs[size_t(starLhs)];
      const Name& rn = s.rhs[size_t(starRhs)];
      size_t starsL = size_t(std::count(ln.text.begin(), ln.text.end(), '*'));
      size_t starsR = size_t(std::count(rn.text.begin(), rn.text.end(), '*'));
      if (starsR > starsL)
        fail(src_, rn.pos, "'" + rn.text + "' has more '*' than the source name '" + ln.text + "'");
      std::vector<Statement> out;
      for (auto& [caps, key] : matchesOf(ln)) {
        Statement c = s;
        c.lhs[size_t(starLhs)].text = key;
        std::string t;
        size_t k = 0;
        for (char ch : rn.text) t += ch == '*' ? caps[k++] : std::string(1, ch);
        c.rhs[size_t(starRhs)].text = t;
        out.push_back(std::move(c));
      }
      return out;
    }
    Statement c = s;
    c.lhs.clear();
    for (const Name& n : s.lhs) {
      if (n.text.find('*') == std::string::npos || n.blank) {
        c.lhs.push_back(n);
        continue;
      }
      for (auto& m : matchesOf(n)) {
        Name x = n;
        x.text = m.second;
        c.lhs.push_back(std::move(x));
      }
    }
    return {c};
  }

  // ---- one concrete statement --------------------------------------------------------------

  enum class Kind { Declare, Drop, Rename, Concat, Split, QkvFuse, QkvSplit, FfnFuse, FfnSplit };

  void exec(const Statement& s) {
    if (s.lhs.empty() || s.rhs.empty()) fail(src_, s.pos, "statement expands to no names");
    Options o = parseOptions(src_, s);
    const size_t nl = s.lhs.size(), nr = s.rhs.size();
    const bool lhsBlank = nl == 1 && s.lhs[0].blank;
    const bool rhsBlank = nr == 1 && s.rhs[0].blank;
    for (const auto& n : s.lhs)
      if (n.blank && nl > 1) fail(src_, n.pos, "'_' must stand alone on the source side");
    for (const auto& n : s.rhs)
      if (n.blank && nr > 1) fail(src_, n.pos, "'_' must stand alone on the target side");
    std::string flag = s.flags.empty() ? "" : s.flags[0].text;
    Pos flagPos = s.flags.empty() ? s.pos : s.flags[0].pos;

    Kind kind;
    if (lhsBlank && rhsBlank) fail(src_, s.pos, "'_ -> _' does nothing");
    if (lhsBlank) {
      kind = Kind::Declare;
    } else if (rhsBlank) {
      kind = Kind::Drop;
    } else if (flag == "fused_qkv") {
      if (nl == 3 && nr == 1)
        kind = Kind::QkvFuse;
      else if (nl == 1 && nr == 3)
        kind = Kind::QkvSplit;
      else
        fail(src_, flagPos,
             "fused_qkv expects 'q, k, v -> qkv' or 'qkv -> q, k, v', got " + std::to_string(nl) +
                 " -> " + std::to_string(nr) + " keys");
    } else if (flag == "fused_ffn") {
      if (nl == 2 && nr == 1)
        kind = Kind::FfnFuse;
      else if (nl == 1 && nr == 2)
        kind = Kind::FfnSplit;
      else
        fail(src_, flagPos,
             "fused_ffn expects 'gate, up -> fused' or 'fused -> gate, up', got " +
                 std::to_string(nl) + " -> " + std::to_string(nr) + " keys");
    } else if (nl == nr && !o.axis) {
      kind = Kind::Rename;
    } else if (nl >= 2 && nr == 1) {
      if (!o.axis)
        fail(src_, s.rhs[0].pos, "concatenating " + std::to_string(nl) + " keys needs axis=N");
      kind = Kind::Concat;
    } else if (nl == 1 && nr >= 2) {
      if (!o.axis)
        fail(src_, s.rhs[0].pos, "splitting into " + std::to_string(nr) + " keys needs axis=N");
      kind = Kind::Split;
    } else if (nl == nr) {
      fail(src_, o.axisPos, "axis= needs one target (concatenate) or one source (split)");
    } else {
      fail(src_, s.pos,
           std::to_string(nl) + " sources and " + std::to_string(nr) +
               " targets: expected n -> n (rename), n -> 1 with axis= (concatenate) "
               "or 1 -> n with axis= (split)");
    }
    // Options each kind accepts.
    auto allow = [&](std::initializer_list<const char*> ok) {
      for (const Option& opt : s.options)
        if (std::none_of(ok.begin(), ok.end(), [&](const char* k) { return opt.key == k; }))
          fail(src_, opt.pos, "option '" + opt.key + "' does not apply to this statement");
    };
    switch (kind) {
      case Kind::Declare:
        allow({"shape", "dtype"});
        break;
      case Kind::Drop:
        allow({});
        for (const auto& n : s.lhs)
          if (n.transpose) fail(src_, n.pos, "a dropped key cannot be transposed");
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
        if (!o.numHeads) fail(src_, flagPos, "fused_qkv needs num_heads=N");
        if (!o.numKvGroups) o.numKvGroups = o.numHeads;
        if (*o.numHeads % *o.numKvGroups != 0)
          fail(src_, o.headsPos,
               "num_heads=" + std::to_string(*o.numHeads) +
                   " is not a multiple of num_key_value_groups=" + std::to_string(*o.numKvGroups));
        break;
      case Kind::FfnFuse:
      case Kind::FfnSplit:
        allow({"axis", "chunks", "dtype"});
        if (!o.chunks) fail(src_, flagPos, "fused_ffn needs chunks=N (see docs/checkpoint.md)");
        break;
    }
    for (const auto& n : s.rhs)
      if (n.transpose) fail(src_, n.pos, "'^T' belongs on the source side");

    if (kind == Kind::Declare) {
      for (const Name& n : s.rhs) {
        checkFree(n, s.rhs);
        TargetKey k;
        k.name = n.text;
        k.dtype = o.dtype.value_or(st::DType::F32);
        k.declared = true;
        k.hasShape = o.shape.has_value();
        if (o.shape) k.shape = *o.shape;
        space_.add(std::move(k));
      }
      return;
    }
    // Sources must exist; collect their state suffixes (identical across sources).
    for (const Name& n : s.lhs) need(n.text, n.pos);
    std::set<std::string> states = space_.statesOf(s.lhs[0].text);
    for (size_t i = 1; i < nl; ++i)
      if (space_.statesOf(s.lhs[i].text) != states)
        fail(src_, s.lhs[i].pos,
             "'" + s.lhs[i].text + "' and '" + s.lhs[0].text +
                 "' carry different optimizer state, so one rule cannot "
                 "combine them");
    for (size_t a = 0; a < nl; ++a)
      for (size_t b = a + 1; b < nl; ++b)
        if (s.lhs[a].text == s.lhs[b].text)
          fail(src_, s.lhs[b].pos, "source '" + s.lhs[b].text + "' named twice");
    if (kind == Kind::Drop) {
      for (const Name& n : s.lhs) {
        space_.take(n.text, s.pos.line);
        for (const auto& st : states)
          space_.take(n.text + std::string(kStateSeparator) + st, s.pos.line);
      }
      return;
    }
    // Targets must be free once the sources are consumed.
    for (const Name& n : s.rhs) {
      bool isSource =
          std::any_of(s.lhs.begin(), s.lhs.end(), [&](const Name& l) { return l.text == n.text; });
      if (!isSource)
        checkFree(n, s.rhs);
      else
        checkFreeWithin(n, s.rhs);
    }
    // The parameter, then each state with the same rule.
    std::vector<std::string> suffixes{""};
    for (const auto& st : states) suffixes.push_back(std::string(kStateSeparator) + st);
    std::vector<std::vector<TargetKey>> results;
    for (const std::string& suf : suffixes) {
      std::vector<TargetKey> in;
      for (const Name& n : s.lhs) in.push_back(space_.get(n.text + suf));
      results.push_back(compute(kind, s, o, in, !suf.empty()));
    }
    for (size_t si = 0; si < suffixes.size(); ++si)
      for (const Name& n : s.lhs) space_.take(n.text + suffixes[si], s.pos.line);
    for (size_t si = 0; si < suffixes.size(); ++si)
      for (size_t j = 0; j < nr; ++j) {
        TargetKey k = std::move(results[si][j]);
        k.name = s.rhs[j].text + suffixes[si];
        if (space_.has(k.name))
          fail(src_, s.rhs[j].pos, "rule produces '" + k.name + "', which already exists");
        space_.add(std::move(k));
      }
  }

  void need(const std::string& key, Pos pos) {
    if (space_.has(key)) return;
    int at = space_.consumedAt(key);
    if (at > 0)
      fail(src_, pos,
           "no key '" + key + "': it was consumed by the rule on line " + std::to_string(at));
    fail(src_, pos, "no key '" + key + "' in the source" + nearKeyHint());
  }

  void checkFreeWithin(const Name& n, const std::vector<Name>& rhs) {
    for (const Name& m : rhs)
      if (&m != &n && m.text == n.text) fail(src_, m.pos, "rule produces '" + n.text + "' twice");
  }

  void checkFree(const Name& n, const std::vector<Name>& rhs) {
    checkFreeWithin(n, rhs);
    if (space_.has(n.text))
      fail(src_, n.pos,
           "rule produces '" + n.text +
               "', which already exists (drop or rename the existing key first)");
  }

  size_t normAxis(int64_t axis, const TargetKey& k, Pos pos, const std::string& name) {
    int64_t r = int64_t(k.shape.size());
    if (axis < -r || axis >= r)
      fail(src_, pos,
           "axis " + std::to_string(axis) + " is out of range for '" + name + "' " +
               dimsStr(k.shape) + " (rank " + std::to_string(r) + ")");
    return size_t(axis < 0 ? axis + r : axis);
  }

  void checkSameExcept(const std::vector<TargetKey>& in, const Statement& s, size_t axis,
                       const char* what) {
    for (size_t i = 1; i < in.size(); ++i) {
      if (in[i].dtype != in[0].dtype)
        fail(src_, s.lhs[i].pos,
             std::string(what) + " mixes dtypes: '" + s.lhs[0].text + "' is " +
                 std::string(st::dtypeName(in[0].dtype)) + ", '" + s.lhs[i].text + "' is " +
                 std::string(st::dtypeName(in[i].dtype)));
      bool ok = in[i].shape.size() == in[0].shape.size();
      for (size_t d = 0; ok && d < in[0].shape.size(); ++d)
        ok = d == axis || in[i].shape[d] == in[0].shape[d];
      if (!ok)
        fail(src_, s.lhs[i].pos,
             std::string(what) + " along axis " + std::to_string(axis) +
                 " needs equal shapes elsewhere: '" + s.lhs[0].text + "' is " +
                 dimsStr(in[0].shape) + ", '" + s.lhs[i].text + "' is " + dimsStr(in[i].shape));
    }
  }

  std::vector<TargetKey> compute(Kind kind, const Statement& s, const Options& o,
                                 std::vector<TargetKey> in, bool state) {
    const size_t nr = s.rhs.size();
    // Rank-0 state (a step counter) is copied from the first source to every target.
    if (state && in[0].shape.empty()) {
      for (size_t i = 1; i < in.size(); ++i)
        if (!in[i].shape.empty())
          fail(src_, s.lhs[i].pos,
               "optimizer state of '" + s.lhs[i].text + "' has a different rank than that of '" +
                   s.lhs[0].text + "'");
      if (kind == Kind::Rename) return in;
      return std::vector<TargetKey>(nr, in[0]);
    }
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[i].declared && !in[i].hasShape && in[i].pieces.empty())
        fail(src_, s.lhs[i].pos,
             "'" + s.lhs[i].text +
                 "' was declared without shape=, so it "
                 "cannot feed another rule");
      if (s.lhs[i].transpose) {
        std::vector<int8_t> rev(in[i].shape.size());
        for (size_t d = 0; d < rev.size(); ++d) rev[d] = int8_t(rev.size() - 1 - d);
        in[i] = permuteKey(in[i], rev);
      }
    }
    std::vector<TargetKey> out;
    const std::string& n0 = s.lhs[0].text;
    switch (kind) {
      case Kind::Rename:
        out = in;
        break;
      case Kind::Concat: {
        size_t axis = normAxis(*o.axis, in[0], o.axisPos, n0);
        checkSameExcept(in, s, axis, "concatenation");
        out.push_back(concatKeys(in, axis));
        break;
      }
      case Kind::Split: {
        size_t axis = normAxis(*o.axis, in[0], o.axisPos, n0);
        int64_t n = int64_t(nr), size = in[0].shape[axis];
        if (size % n != 0)
          fail(src_, o.axisPos,
               "cannot split axis " + std::to_string(axis) + " of '" + n0 + "' " +
                   dimsStr(in[0].shape) + " evenly into " + std::to_string(n) + " parts");
        for (int64_t j = 0; j < n; ++j)
          out.push_back(sliceKey(in[0], axis, j * (size / n), size / n));
        break;
      }
      case Kind::QkvFuse:
      case Kind::QkvSplit: {
        const int64_t h = *o.numHeads, g = *o.numKvGroups, per = h / g;
        size_t axis = normAxis(o.axis.value_or(0), in[0], o.axis ? o.axisPos : s.pos, n0);
        if (kind == Kind::QkvFuse) {
          checkSameExcept(in, s, axis, "fused_qkv");
          if (in[0].shape[axis] % h != 0)
            fail(src_, s.lhs[0].pos,
                 "'" + n0 + "' axis " + std::to_string(axis) + " (" +
                     std::to_string(in[0].shape[axis]) +
                     ") is not a multiple of num_heads=" + std::to_string(h));
          const int64_t hd = in[0].shape[axis] / h;
          for (size_t i = 1; i < 3; ++i)
            if (in[i].shape[axis] != g * hd)
              fail(src_, s.lhs[i].pos,
                   "'" + s.lhs[i].text + "' has " + std::to_string(in[i].shape[axis]) +
                       " rows on axis " + std::to_string(axis) + ", expected num_key_value_groups" +
                       " x head_dim = " + std::to_string(g * hd));
          std::vector<TargetKey> parts;
          for (int64_t j = 0; j < g; ++j) {
            parts.push_back(sliceKey(in[0], axis, j * per * hd, per * hd));
            parts.push_back(sliceKey(in[1], axis, j * hd, hd));
            parts.push_back(sliceKey(in[2], axis, j * hd, hd));
          }
          out.push_back(concatKeys(parts, axis));
        } else {
          const int64_t rows = in[0].shape[axis];
          if (rows % (h + 2 * g) != 0)
            fail(src_, s.lhs[0].pos,
                 "'" + n0 + "' axis " + std::to_string(axis) + " (" + std::to_string(rows) +
                     ") is not a multiple of num_heads + 2 x "
                     "num_key_value_groups = " +
                     std::to_string(h + 2 * g));
          const int64_t hd = rows / (h + 2 * g), group = (per + 2) * hd;
          std::vector<TargetKey> q, k, v;
          for (int64_t j = 0; j < g; ++j) {
            q.push_back(sliceKey(in[0], axis, j * group, per * hd));
            k.push_back(sliceKey(in[0], axis, j * group + per * hd, hd));
            v.push_back(sliceKey(in[0], axis, j * group + (per + 1) * hd, hd));
          }
          out = {concatKeys(q, axis), concatKeys(k, axis), concatKeys(v, axis)};
        }
        break;
      }
      case Kind::FfnFuse:
      case Kind::FfnSplit: {
        const int64_t c = *o.chunks;
        size_t axis = normAxis(o.axis.value_or(0), in[0], o.axis ? o.axisPos : s.pos, n0);
        if (kind == Kind::FfnFuse) {
          checkSameExcept(in, s, axis, "fused_ffn");
          if (in[0].shape[axis] != in[1].shape[axis] || in[0].shape[axis] % c != 0)
            fail(src_, o.chunksPos,
                 "fused_ffn needs gate and up of equal size on axis " + std::to_string(axis) +
                     " divisible by chunks=" + std::to_string(c) + ", got " + dimsStr(in[0].shape) +
                     " and " + dimsStr(in[1].shape));
          const int64_t cs = in[0].shape[axis] / c;
          std::vector<TargetKey> parts;
          for (int64_t j = 0; j < c; ++j) {
            parts.push_back(sliceKey(in[0], axis, j * cs, cs));
            parts.push_back(sliceKey(in[1], axis, j * cs, cs));
          }
          out.push_back(concatKeys(parts, axis));
        } else {
          if (in[0].shape[axis] % (2 * c) != 0)
            fail(src_, o.chunksPos,
                 "fused_ffn: axis " + std::to_string(axis) + " of '" + n0 + "' (" +
                     std::to_string(in[0].shape[axis]) +
                     ") is not divisible by 2 x chunks=" + std::to_string(2 * c));
          const int64_t cs = in[0].shape[axis] / (2 * c);
          std::vector<TargetKey> gate, up;
          for (int64_t j = 0; j < c; ++j) {
            gate.push_back(sliceKey(in[0], axis, 2 * j * cs, cs));
            up.push_back(sliceKey(in[0], axis, (2 * j + 1) * cs, cs));
          }
          out = {concatKeys(gate, axis), concatKeys(up, axis)};
        }
        break;
      }
      default:
        break;
    }
    for (TargetKey& k : out) {
      if (o.permute) {
        if (o.permute->size() != k.shape.size())
          fail(src_, o.permutePos,
               "permute has " + std::to_string(o.permute->size()) + " axes but '" + n0 +
                   "' has rank " + std::to_string(k.shape.size()));
        k = permuteKey(k, *o.permute);
      }
      if (o.dtype && !(state && !st::isFloatDType(k.dtype))) {
        if (!castable(k.dtype, *o.dtype))
          fail(src_, o.dtypePos,
               "cannot cast '" + n0 + "' from " + std::string(st::dtypeName(k.dtype)) + " to " +
                   std::string(st::dtypeName(*o.dtype)) +
                   " (casts go between float types, or widen integers)");
        if (*o.dtype != k.dtype) {
          for (Piece& p : k.pieces) p.casts.push_back(*o.dtype);
          k.dtype = *o.dtype;
        }
      }
    }
    return out;
  }

  std::string src_;
  Space space_;
  size_t expanded_ = 0;
};

}  // namespace

Result apply(const Program* program, const std::vector<SourceKey>& sources) {
  if (!program || program->statements.empty()) {  // every key maps to itself
    Result r;
    r.keys.resize(sources.size());
    for (uint32_t i = 0; i < sources.size(); ++i) {
      TargetKey& k = r.keys[i];
      k.name = sources[i].name;
      k.dtype = sources[i].dtype;
      k.shape = sources[i].shape;
      Piece& p = k.pieces.emplace_back();
      p.src = i;
      p.dstOff.assign(k.shape.size(), 0);
      p.srcOff.assign(k.shape.size(), 0);
      p.shape = k.shape;
      p.perm.resize(k.shape.size());
      std::iota(p.perm.begin(), p.perm.end(), int8_t(0));
    }
    return r;
  }
  Evaluator ev(program, sources);
  if (program)
    for (const Statement& s : program->statements) ev.run(s);
  return ev.result();
}

}  // namespace keel::aoa
