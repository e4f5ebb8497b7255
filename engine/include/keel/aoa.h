// AOA ("all in one arrow"): the rule language that states how checkpoint keys map from a source
// layout to a target layout, and its semantics as pure box arithmetic. Invariants: parsing and
// evaluation never touch tensor bytes; every error is a keel::Error of the form
// "<file>:<line>:<col>: <what was expected>"; the result is complete (shapes, dtypes, the source
// region of every target element) before any byte is written. Grammar and semantics:
// docs/checkpoint.md. This file depends on no tensor code, so the fuzz targets build it alone.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "keel/safetensors.h"

namespace keel::aoa {

using Dims = std::vector<int64_t>;

struct Pos {
  int line = 0, col = 0;
};

// One operand or target: a key name (possibly with macros), `_`, and on the left `^T`.
struct Name {
  std::string text;
  Pos pos;
  bool blank = false;      // `_`
  bool transpose = false;  // `x^T` (left side only)
};

struct Option {
  std::string key, value;
  Pos pos, valuePos;
};

struct Statement {
  std::vector<Name> lhs, rhs;
  std::vector<Option> options;
  std::vector<Name> flags;  // fused_qkv, fused_ffn
  Pos pos;
};

struct Program {
  std::string source;  // file name used in messages
  std::vector<Statement> statements;
};

// Parses AOA text. Throws keel::Error "<source>:<line>:<col>: ...".
Program parse(std::string_view text, const std::string& source = "<aoa>");
// Reads and parses a file.
Program parseFile(const std::string& path);

// ---- semantics -------------------------------------------------------------------------------

// A key of the source checkpoint as the rules see it.
struct SourceKey {
  std::string name;
  st::DType dtype = st::DType::F32;
  Dims shape;
};

// A box of a target key that comes from one source key: target elements
// [dstOff, dstOff + shape) (target axes) are source elements at srcOff (source axes) laid out so
// that target axis d walks source axis perm[d]. Values pass through the dtype casts in order.
struct Piece {
  uint32_t src = 0;  // index into the source key list
  Dims dstOff, shape, srcOff;
  std::vector<int8_t> perm;
  std::vector<st::DType> casts;
  bool identityPerm() const;
};

// A key of the target layout: its dtype, global shape and the pieces that tile it.
struct TargetKey {
  std::string name;
  st::DType dtype = st::DType::F32;
  Dims shape;
  std::vector<Piece> pieces;  // empty for a declared key (`_ -> name`); uncovered elements are 0
  bool declared = false;      // `_ -> name`: not read from the checkpoint
  bool hasShape = true;       // false for a declared key without shape=
  std::string declaredAt;     // a declared key's rule: "rules.aoa:3:6"
};

struct Result {
  // In source order, a produced key in the place of its sources (Note [Key order], eval.cpp);
  // declared keys last.
  std::vector<TargetKey> keys;
};

// Applies the statements in order to the source keys. Without a program every key maps to
// itself. Throws keel::Error with the statement's file:line:col on any rule error (missing key,
// uneven split, mismatched dtypes or shapes, a key produced twice, bad options).
Result apply(const Program* program, const std::vector<SourceKey>& sources);

// Optimizer state keys are "<parameter key>::<state>" (e.g. "blocks.0.attn.qkv.weight::exp_avg");
// rules written for the parameter apply to them too (see docs/checkpoint.md).
inline constexpr std::string_view kStateSeparator = "::";

}  // namespace keel::aoa
