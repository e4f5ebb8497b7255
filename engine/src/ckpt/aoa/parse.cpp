// AOA, stage 1: the line-oriented lexer and the parser (keel/aoa.h: parse, parseFile). A line
// is one statement: sources '->' targets, then flags and options; '#' starts a comment. Errors
// name file:line:col and what was expected there.
#include <array>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "aoa_internal.h"
#include "keel/base/text.h"
#include "keel/base/vocabulary.h"
#include "keel/error.h"

namespace keel::aoa {

namespace detail {

// Every AOA error goes through here: at most 240 characters of the message (keel::clipText), so a
// rule with a 10 MB key name or 100,000 brackets gives a readable line (its start and end, and how
// much was left out), not a 10 MB one.
void fail(const std::string& src, Pos p, const std::string& msg) {
  throw Error(src + ":" + std::to_string(p.line) + ":" + std::to_string(p.col) + ": " +
              clipText(msg, 240));
}

}  // namespace detail

namespace {

using detail::fail;

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
  if (t.kind == Tok::Word) return "'" + t.text + "'";
  if (t.kind == Tok::String) return "string \"" + t.text + "\"";
  static constexpr std::array<std::string_view, 7> kPunctuation = {
      "", "", "'->'", "','", "'='", "'^T'", "end of line"};  // by Tok; words and strings above
  static_assert(kPunctuation.size() == size_t(Tok::End) + 1);
  return std::string(keel::detail::enumName(kPunctuation, t.kind));
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
  // readFile refuses a FIFO (it would block), a device (/dev/zero never ends) and a directory
  // (it used to read as an empty rule file); at most 16 MiB of rules.
  // A UTF-8 byte order mark (what some Windows editors write first) is not a rule: skipped, as
  // configs skip it.
  // A FIFO is what `--aoa <(printf ...)` gives: the refusal says what to do instead.
  if (nonRegularKind(path) == "a FIFO")
    throw Error(path +
                ": AOA rules file is a FIFO, not a regular file (write the rules to a file)");
  std::string text = readFile(path, "AOA rules file", uint64_t(16) << 20);
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
  return parse(text, path);
}

}  // namespace keel::aoa
