// AOA, stage 2: macro expansion. [a:b] ranges expand a name in place; $LAYER_ID, $EXPERT_ID and
// $LAYER_ID_OFFSET instantiate a statement once per id the keys present carry; * wildcards
// expand to the matching keys in numeric order. Every produced name counts against one budget.
#include <algorithm>
#include <cctype>

#include "aoa_internal.h"
#include "keel/error.h"

namespace keel::aoa::detail {

namespace {

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

// The text every key a pattern matches starts with.
std::string_view literalPrefix(const std::vector<Segment>& segs) {
  return !segs.empty() && segs.front().kind == Seg::Lit ? std::string_view(segs.front().lit)
                                                        : std::string_view();
}

// A pattern naming an optimizer state ("blocks.*.w::exp_avg") matches the parameter keys by the
// part before "::" (patterns match base keys) and names that state of each: (base pattern, state
// suffix with its "::", "" for a parameter).
std::pair<std::string, std::string> splitState(const std::string& pattern) {
  const size_t sep = pattern.find(kStateSeparator);
  if (sep == std::string::npos) return {pattern, ""};
  return {pattern.substr(0, sep), pattern.substr(sep)};
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

// How many names the [a:b] ranges of `t` expand to, saturating at `cap` (above the budget; each
// factor is below 10^9, so the product of one step cannot overflow before it is capped).
size_t rangeProduct(const std::string& t, size_t cap) {
  size_t product = 1;
  for (size_t open = t.find('['); open != std::string::npos; open = t.find('[', open + 1)) {
    size_t colon = t.find(':', open), close = t.find(']', open);
    if (colon == std::string::npos || close == std::string::npos || colon > close) continue;
    std::string a = t.substr(open + 1, colon - open - 1),
                b = t.substr(colon + 1, close - colon - 1);
    if (a.empty() || b.empty() || a.size() > 9 || b.size() > 9 ||
        !std::all_of(a.begin(), a.end(), ::isdigit) || !std::all_of(b.begin(), b.end(), ::isdigit))
      continue;
    int64_t lo = std::stoll(a), hi = std::stoll(b);
    if (hi > lo) product = std::min(product * size_t(hi - lo), cap);
  }
  return product;
}

}  // namespace

Statement Expander::expandRanges(const Statement& s) {
  Statement r = s;
  r.lhs = expandRanges(s.lhs);
  r.rhs = expandRanges(s.rhs);
  return r;
}

void Expander::budget(size_t n, Pos pos) {
  expanded_ += n;
  if (expanded_ > limit_)
    fail(src_, pos,
         "rules expand to more than " + std::to_string(limit_) +
             " names (the limit of a rules file: 100000, or four per key of the checkpoint; this "
             "name's expansion included)");
}

std::vector<Name> Expander::expandRanges(const std::vector<Name>& names) {
  std::vector<Name> out;
  for (const Name& n : names) {
    budget(rangeProduct(n.text, limit_ + 1), n.pos);  // a name's ranges at once: they multiply
    expandRange(n, out);
  }
  return out;
}

void Expander::expandRange(const Name& n, std::vector<Name>& out) {
  // First "[a:b]" with a, b decimal.
  const std::string& t = n.text;
  for (size_t open = t.find('['); open != std::string::npos; open = t.find('[', open + 1)) {
    size_t colon = t.find(':', open), close = t.find(']', open);
    if (colon == std::string::npos || close == std::string::npos || colon > close) continue;
    std::string a = t.substr(open + 1, colon - open - 1),
                b = t.substr(colon + 1, close - colon - 1);
    auto digits = [](const std::string& x) {
      return !x.empty() && std::all_of(x.begin(), x.end(), ::isdigit);
    };
    if (!digits(a) || !digits(b)) continue;
    // A bound of ten digits or more is a range no checkpoint holds (it was read as a literal
    // name, and the statement then failed for another reason).
    if (a.size() > 9 || b.size() > 9)
      fail(src_, Pos{n.pos.line, n.pos.col + int(open)},
           "range [" + a + ":" + b + "] has a bound of more than 9 digits");
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

std::vector<Statement> Expander::expandVariables(const Statement& s, const Space& space) {
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
  const auto [basePattern, state] = splitState(pat->text);
  auto segs = compile(basePattern);
  bool hasLayer = false, hasExpert = false;
  for (const auto& g : segs) {
    hasLayer = hasLayer || g.kind == Seg::Layer || g.kind == Seg::LayerOffset;
    hasExpert = hasExpert || g.kind == Seg::Expert;
  }
  auto usesLayer = [](const std::string& t) { return t.find("$LAYER_ID") != std::string::npos; };
  auto usesExpert = [](const std::string& t) { return t.find("$EXPERT_ID") != std::string::npos; };
  for (const auto* side : {&s.lhs, &s.rhs})
    for (const auto& n : *side)
      if ((usesLayer(n.text) && !hasLayer) || (usesExpert(n.text) && !hasExpert))
        fail(src_, n.pos,
             "'" + n.text + "' uses an id that the first macro source name '" + pat->text +
                 "' does not capture");
  // Distinct (layer, expert) ids over the keys present.
  std::set<std::pair<int64_t, int64_t>> ids;
  for (const std::string& key : space.baseKeys(literalPrefix(segs))) {
    std::vector<std::string> caps;
    if (!match(segs, 0, key, 0, caps) || (!state.empty() && !space.has(key + state))) continue;
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
  if (ids.empty()) fail(src_, pat->pos, "'" + pat->text + "' matches no key" + space.nearKeyHint());
  std::vector<Statement> out;
  budget(ids.size(), pat->pos);
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

std::vector<Statement> Expander::expandWildcards(const Statement& s, const Space& space) {
  // Whether a target carries '*', once (asked per starred source it made range-expanded
  // statements quadratic: a 195-byte rule took 37 s in the fuzzer).
  const bool rhsStar = std::any_of(s.rhs.begin(), s.rhs.end(), [](const Name& n) {
    return n.text.find('*') != std::string::npos;
  });
  int starLhs = -1;
  for (size_t i = 0; i < s.lhs.size(); ++i)
    if (s.lhs[i].text.find('*') != std::string::npos && !s.lhs[i].blank) {
      if (starLhs >= 0 && rhsStar)
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
    const auto [basePattern, state] = splitState(n.text);
    auto segs = compile(basePattern);
    std::vector<std::pair<std::vector<std::string>, std::string>> m;
    for (const std::string& key : space.baseKeys(literalPrefix(segs))) {
      std::vector<std::string> caps;
      if (match(segs, 0, key, 0, caps) && (state.empty() || space.has(key + state)))
        m.push_back({caps, key + state});
    }
    if (m.empty()) fail(src_, n.pos, "'" + n.text + "' matches no key" + space.nearKeyHint());
    std::stable_sort(m.begin(), m.end(),
                     [](const auto& a, const auto& b) { return naturalLess(a.first, b.first); });
    budget(m.size(), n.pos);
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

}  // namespace keel::aoa::detail
