// AOA, stage 4: the evaluator (keel/aoa.h: apply). Each program statement is expanded
// (expand.cpp) and checked (check.cpp); each concrete statement then runs over the key space
// (keys.cpp) through the evaluator of its kind. See Note [AOA semantics].
#include <algorithm>
#include <unordered_map>

#include "aoa_internal.h"

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
//
// Note [Key order]
// The result keeps the source's key order (a checkpoint's: parameters in model order, then each
// parameter's optimizer state), and a produced key takes the place of what it was made from: a
// renamed key its source's place, the targets of any other rule the place of its earliest
// source, in the rule's order; their optimizer state likewise the place of the earliest source
// state, target by target (q's states, then k's, then v's). So rules never move the keys they do
// not touch, and a round trip (separate q/k/v, fuse them per head, and back) writes the keys in
// the plain conversion's order: the same bytes. A place is a path (the source index, then the
// target's index within each rule that made it), compared lexicographically; a declared key
// (`_ -> x`) goes after every key so far.

namespace detail {
namespace {

class Evaluator {
 public:
  Evaluator(const Program* prog, const std::vector<SourceKey>& src)
      : src_(prog ? prog->source : std::string("<aoa>")),
        space_(src),
        expander_(src_, src.size()) {}

  // Expands one statement of the program and runs each concrete statement it becomes; variables
  // expand against the keys before the statement, wildcards against the keys before each instance.
  void run(const Statement& s) {
    checkFlags(src_, s);
    for (Statement& inst : expander_.expandVariables(expander_.expandRanges(s), space_))
      for (Statement& c : expander_.expandWildcards(inst, space_)) exec(c, check(src_, c));
  }

  Result result() { return space_.result(); }

 private:
  // One concrete, checked statement over the key space.
  void exec(const Statement& s, const Typed& t) {
    indexTargets(s.rhs);
    if (t.kind == Kind::Declare) return evalDeclare(s, t.options);
    // Sources must exist; collect their state suffixes (identical across sources).
    const size_t nl = s.lhs.size(), nr = s.rhs.size();
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
    if (t.kind == Kind::Drop) return evalDrop(s, states);
    // Targets must be free once the sources are consumed.
    for (const Name& n : s.rhs) {
      bool isSource =
          std::any_of(s.lhs.begin(), s.lhs.end(), [&](const Name& l) { return l.text == n.text; });
      if (!isSource)
        checkFree(n);
      else
        checkFreeWithin(n);
    }
    // The parameter, then each state with the same rule (in the first source's state order).
    std::vector<std::string> suffixes;
    for (const auto& st : states) suffixes.push_back(std::string(kStateSeparator) + st);
    std::sort(suffixes.begin(), suffixes.end(), [&](const std::string& a, const std::string& b) {
      return space_.placeOf(s.lhs[0].text + a) < space_.placeOf(s.lhs[0].text + b);
    });
    suffixes.insert(suffixes.begin(), "");
    // Note [Key order]: where the targets go, found before the sources are taken.
    const bool rename = t.kind == Kind::Rename;
    const size_t nstates = suffixes.size() - 1;
    Space::Place firstParam, firstState;  // the earliest place of a source, of a source state
    for (size_t si = 0; si < suffixes.size(); ++si)
      for (const Name& n : s.lhs) {
        Space::Place& first = si == 0 ? firstParam : firstState;
        if (const Space::Place& p = space_.placeOf(n.text + suffixes[si]);
            first.empty() || p < first)
          first = p;
      }
    std::vector<std::vector<Space::Place>> places(suffixes.size(), std::vector<Space::Place>(nr));
    for (size_t si = 0; si < suffixes.size(); ++si)
      for (size_t j = 0; j < nr; ++j) {
        if (rename) {  // pairwise: each target in its own source's place
          places[si][j] = space_.placeOf(s.lhs[j].text + suffixes[si]);
          continue;
        }
        places[si][j] = si == 0 ? firstParam : firstState;
        places[si][j].push_back(uint32_t(si == 0 ? j : j * nstates + si - 1));  // target-major
      }
    std::vector<std::vector<TargetKey>> results;
    for (const std::string& suf : suffixes) {
      std::vector<TargetKey> in;
      for (const Name& n : s.lhs) in.push_back(space_.get(n.text + suf));
      results.push_back(compute(t, s, std::move(in), !suf.empty()));
    }
    for (size_t si = 0; si < suffixes.size(); ++si)
      for (const Name& n : s.lhs) space_.take(n.text + suffixes[si], s.pos.line);
    for (size_t si = 0; si < suffixes.size(); ++si)
      for (size_t j = 0; j < nr; ++j) {
        TargetKey k = std::move(results[si][j]);
        k.name = s.rhs[j].text + suffixes[si];
        if (space_.has(k.name))
          fail(src_, s.rhs[j].pos, "rule produces '" + k.name + "', which already exists");
        producedAt_[k.name] = s.pos.line;
        space_.add(std::move(k), std::move(places[si][j]));
      }
  }

  void need(const std::string& key, Pos pos) {
    if (space_.has(key)) return;
    int at = space_.consumedAt(key);
    if (at > 0)
      fail(src_, pos,
           "no key '" + key + "': it was consumed by the rule on line " + std::to_string(at));
    fail(src_, pos, "no key '" + key + "' in the source" + space_.nearKeyHint());
  }

  // Targets of the statement being run, by name (built once per statement: comparing each
  // target with every other was quadratic, 52,000 declared names took minutes in the fuzzer).
  void indexTargets(const std::vector<Name>& rhs) {
    targets_.clear();
    for (const Name& m : rhs) targets_[m.text].push_back(&m);
  }

  void checkFreeWithin(const Name& n) {
    const auto it = targets_.find(n.text);
    if (it == targets_.end()) return;
    for (const Name* m : it->second)
      if (m != &n) fail(src_, m->pos, "rule produces '" + n.text + "' twice");
  }

  void checkFree(const Name& n) {
    checkFreeWithin(n);
    // Made by another instance of this very statement ($LAYER_ID, $EXPERT_ID, '*'): a target that
    // drops an id its source captures gives every instance the same name.
    if (auto it = producedAt_.find(n.text);
        it != producedAt_.end() && it->second == n.pos.line && space_.has(n.text))
      fail(src_, n.pos,
           "rule produces '" + n.text +
               "' again: another instance of its $LAYER_ID/$EXPERT_ID/'*' expansion made it "
               "(a target name must use every id its source captures)");
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

  // ---- one evaluator per statement kind ------------------------------------------------------

  // `_ -> a, b`: new keys, zero unless a later rule fills them.
  void evalDeclare(const Statement& s, const Options& o) {
    for (const Name& n : s.rhs) {
      checkFree(n);
      TargetKey k;
      k.name = n.text;
      k.dtype = o.dtype.value_or(st::DType::F32);
      k.declared = true;
      k.hasShape = o.shape.has_value();
      if (o.shape) k.shape = *o.shape;
      k.declaredAt = src_ + ":" + std::to_string(n.pos.line) + ":" + std::to_string(n.pos.col);
      producedAt_[k.name] = n.pos.line;
      space_.add(std::move(k));
    }
  }

  // `a, b -> _`: the keys and their optimizer state leave the space.
  void evalDrop(const Statement& s, const std::set<std::string>& states) {
    for (const Name& n : s.lhs) {
      space_.take(n.text, s.pos.line);
      for (const auto& st : states)
        space_.take(n.text + std::string(kStateSeparator) + st, s.pos.line);
    }
  }

  // The target keys of one statement from its source keys (the parameter's, or one state's).
  std::vector<TargetKey> compute(const Typed& t, const Statement& s, std::vector<TargetKey> in,
                                 bool state) {
    const size_t nr = s.rhs.size();
    // Rank-0 state (a step counter) is copied from the first source to every target.
    if (state && in[0].shape.empty()) {
      for (size_t i = 1; i < in.size(); ++i)
        if (!in[i].shape.empty())
          fail(src_, s.lhs[i].pos,
               "optimizer state of '" + s.lhs[i].text + "' has a different rank than that of '" +
                   s.lhs[0].text + "'");
      if (t.kind == Kind::Rename) return in;
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
    const Options& o = t.options;
    std::vector<TargetKey> out;
    switch (t.kind) {
      case Kind::Rename:
        out = std::move(in);
        break;
      case Kind::Concat:
        out = evalConcat(s, o, in);
        break;
      case Kind::Split:
        out = evalSplit(s, o, in);
        break;
      case Kind::QkvFuse:
        out = evalQkvFuse(s, o, in);
        break;
      case Kind::QkvSplit:
        out = evalQkvSplit(s, o, in);
        break;
      case Kind::FfnFuse:
        out = evalFfnFuse(s, o, in);
        break;
      case Kind::FfnSplit:
        out = evalFfnSplit(s, o, in);
        break;
      case Kind::Declare:
      case Kind::Drop:
        break;  // exec's
    }
    permuteAndCast(s, o, out, state);
    return out;
  }

  // `a, b -> c, axis=N`
  std::vector<TargetKey> evalConcat(const Statement& s, const Options& o,
                                    const std::vector<TargetKey>& in) {
    size_t axis = normAxis(*o.axis, in[0], o.axisPos, s.lhs[0].text);
    checkSameExcept(in, s, axis, "concatenation");
    return {concatKeys(in, axis)};
  }

  // `a -> b, c, axis=N`: equal parts.
  std::vector<TargetKey> evalSplit(const Statement& s, const Options& o,
                                   const std::vector<TargetKey>& in) {
    const std::string& n0 = s.lhs[0].text;
    size_t axis = normAxis(*o.axis, in[0], o.axisPos, n0);
    int64_t n = int64_t(s.rhs.size()), size = in[0].shape[axis];
    if (size % n != 0)
      fail(src_, o.axisPos,
           "cannot split axis " + std::to_string(axis) + " of '" + n0 + "' " +
               dimsStr(in[0].shape) + " evenly into " + std::to_string(n) + " parts");
    std::vector<TargetKey> out;
    for (int64_t j = 0; j < n; ++j) out.push_back(sliceKey(in[0], axis, j * (size / n), size / n));
    return out;
  }

  // `q, k, v -> qkv, fused_qkv, num_heads=H[, num_key_value_groups=G]`: per kv group, its
  // H/G query heads, then its k head, then its v head.
  std::vector<TargetKey> evalQkvFuse(const Statement& s, const Options& o,
                                     const std::vector<TargetKey>& in) {
    const std::string& n0 = s.lhs[0].text;
    const int64_t h = *o.numHeads, g = *o.numKvGroups, per = h / g;
    size_t axis = normAxis(o.axis.value_or(0), in[0], o.axis ? o.axisPos : s.pos, n0);
    checkSameExcept(in, s, axis, "fused_qkv");
    if (in[0].shape[axis] % h != 0)
      fail(src_, s.lhs[0].pos,
           "'" + n0 + "' axis " + std::to_string(axis) + " (" + std::to_string(in[0].shape[axis]) +
               ") is not a multiple of num_heads=" + std::to_string(h));
    const int64_t hd = in[0].shape[axis] / h;
    for (size_t i = 1; i < 3; ++i)
      if (in[i].shape[axis] != g * hd)
        fail(src_, s.lhs[i].pos,
             "'" + s.lhs[i].text + "' has " + std::to_string(in[i].shape[axis]) + " rows on axis " +
                 std::to_string(axis) + ", expected num_key_value_groups" +
                 " x head_dim = " + std::to_string(g * hd));
    std::vector<TargetKey> parts;
    for (int64_t j = 0; j < g; ++j) {
      parts.push_back(sliceKey(in[0], axis, j * per * hd, per * hd));
      parts.push_back(sliceKey(in[1], axis, j * hd, hd));
      parts.push_back(sliceKey(in[2], axis, j * hd, hd));
    }
    return {concatKeys(parts, axis)};
  }

  // `qkv -> q, k, v, fused_qkv, ...`: the inverse of evalQkvFuse.
  std::vector<TargetKey> evalQkvSplit(const Statement& s, const Options& o,
                                      const std::vector<TargetKey>& in) {
    const std::string& n0 = s.lhs[0].text;
    const int64_t h = *o.numHeads, g = *o.numKvGroups, per = h / g;
    size_t axis = normAxis(o.axis.value_or(0), in[0], o.axis ? o.axisPos : s.pos, n0);
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
    return {concatKeys(q, axis), concatKeys(k, axis), concatKeys(v, axis)};
  }

  // `gate, up -> fused, fused_ffn, chunks=C`: C chunks of gate and up, interleaved.
  std::vector<TargetKey> evalFfnFuse(const Statement& s, const Options& o,
                                     const std::vector<TargetKey>& in) {
    const int64_t c = *o.chunks;
    size_t axis = normAxis(o.axis.value_or(0), in[0], o.axis ? o.axisPos : s.pos, s.lhs[0].text);
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
    return {concatKeys(parts, axis)};
  }

  // `fused -> gate, up, fused_ffn, chunks=C`: the inverse of evalFfnFuse.
  std::vector<TargetKey> evalFfnSplit(const Statement& s, const Options& o,
                                      const std::vector<TargetKey>& in) {
    const std::string& n0 = s.lhs[0].text;
    const int64_t c = *o.chunks;
    size_t axis = normAxis(o.axis.value_or(0), in[0], o.axis ? o.axisPos : s.pos, n0);
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
    return {concatKeys(gate, axis), concatKeys(up, axis)};
  }

  // permute= and dtype=, on every target of any kind (integer state is never cast).
  void permuteAndCast(const Statement& s, const Options& o, std::vector<TargetKey>& out,
                      bool state) {
    const std::string& n0 = s.lhs[0].text;
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
  }

  std::string src_;
  Space space_;
  Expander expander_;
  std::unordered_map<std::string, std::vector<const Name*>> targets_;  // indexTargets
  std::unordered_map<std::string, int> producedAt_;  // key -> line of the rule that made it
};

}  // namespace
}  // namespace detail

Result apply(const Program* program, const std::vector<SourceKey>& sources) {
  if (!program || program->statements.empty()) {  // every key maps to itself
    Result r;
    for (uint32_t i = 0; i < sources.size(); ++i)
      r.keys.push_back(detail::identityKey(sources[i], i));
    return r;
  }
  detail::Evaluator ev(program, sources);
  for (const Statement& s : program->statements) ev.run(s);
  return ev.result();
}

}  // namespace keel::aoa
