// Tests for the AOA rule language: parse errors carry file:line:col and say what was expected
// (random bytes included); every primitive (rename, drop, declare, concatenate, split, ^T,
// permute, cast, fused_qkv, fused_ffn) and macro ($LAYER_ID, $EXPERT_ID, $LAYER_ID_OFFSET,
// ranges, wildcards) agrees byte for byte with a plain-loop reference after a real conversion
// between shard layouts; round trips are byte-identical; optimizer state follows its key; and
// every rule error is raised before a byte is written.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "ckpt_test_util.h"
#include "keel/aoa.h"
#include "keel/error.h"

namespace keel::ckpt {
namespace {

using namespace test;  // the FlexCheckpoint tests' shared helpers (ckpt_test_util.h)

using Named = std::vector<std::pair<std::string, Arr>>;

// Saves `src` at tp=2 (split along axis 0), converts it through `rules` to tp=3 split along the
// last axis (a different layout), and reassembles every output key by hand.
std::map<std::string, Arr> runRules(Named src, const std::string& rules, int dstTp = 3) {
  const std::string dir = tempDir(std::to_string(std::hash<std::string>{}(rules) % 100000));
  test::saveArrs(dir + "/src", src, 2, 0);
  Checkpoint c = Checkpoint::open(dir + "/src");
  aoa::Program p = aoa::parse(rules, "rules.aoa");
  TargetSpec spec;
  spec.tp = dstTp;
  spec.axis = [](const std::string&, const Dims& s) { return int(s.size()) - 1; };
  ConvertOptions opt;
  opt.stagingBytes = 256;  // force slabs and packed reads on these small tensors
  convert(c, dir + "/dst", spec, &p, opt);
  std::map<std::string, Arr> out;
  const Checkpoint dst = Checkpoint::open(dir + "/dst");
  for (const auto& k : dst.metadata().keys) out[k.key] = test::assemble(dir + "/dst", k.key);
  return out;
}

std::vector<aoa::SourceKey> keysOf(const Named& n) {
  std::vector<aoa::SourceKey> k;
  for (const auto& [name, a] : n) k.push_back({name, a.dtype, a.shape});
  return k;
}

std::string applyError(const Named& src, const std::string& rules) {
  return errorOf([&] {
    aoa::Program p = aoa::parse(rules, "rules.aoa");
    aoa::apply(&p, keysOf(src));
  });
}

// ---- parsing ---------------------------------------------------------------------------------

TEST(AoaParseTest, Statements) {
  aoa::Program p = aoa::parse(
      "# comment\n"
      "a -> b\n"
      "\n"
      "  q, k, v -> qkv, fused_qkv, num_heads=8, num_key_value_groups=2  # trailing\n"
      "x^T -> y, permute=\"[1, 0]\", dtype='bfloat16'\n"
      "_ -> z, shape=\"[2,3]\"\n",
      "r.aoa");
  ASSERT_EQ(p.statements.size(), 4u);
  EXPECT_EQ(p.statements[0].pos.line, 2);
  const auto& s = p.statements[1];
  EXPECT_EQ(s.pos.line, 4);
  EXPECT_EQ(s.pos.col, 3);
  ASSERT_EQ(s.lhs.size(), 3u);
  EXPECT_EQ(s.lhs[2].text, "v");
  EXPECT_EQ(s.lhs[2].pos.col, 9);
  ASSERT_EQ(s.flags.size(), 1u);
  EXPECT_EQ(s.flags[0].text, "fused_qkv");
  ASSERT_EQ(s.options.size(), 2u);
  EXPECT_EQ(s.options[1].key, "num_key_value_groups");
  EXPECT_EQ(s.options[1].value, "2");
  EXPECT_TRUE(p.statements[2].lhs[0].transpose);
  EXPECT_EQ(p.statements[2].options[0].value, "[1, 0]");
  EXPECT_EQ(p.statements[2].options[1].value, "bfloat16");
  EXPECT_TRUE(p.statements[3].lhs[0].blank);
}

TEST(AoaParseTest, ErrorsCarryFileLineColumnAndWhatWasExpected) {
  auto err = [](const std::string& text) { return errorOf([&] { aoa::parse(text, "r.aoa"); }); };
  EXPECT_EQ(err("a b -> c"), "r.aoa:1:3: expected ',' or '->' after 'a', found 'b'");
  EXPECT_EQ(err("ok -> fine\na -> "),
            "r.aoa:2:6: expected a target key name, '_', found end of line");
  EXPECT_EQ(err("a -> b, axis="), "r.aoa:1:14: expected a value after 'axis=', found end of line");
  EXPECT_EQ(err("a^X -> b"), "r.aoa:1:2: expected 'T' after '^' (x^T transposes x)");
  EXPECT_EQ(err("a -> b, dtype=\"bf16"),
            "r.aoa:1:15: unterminated string (expected a closing '\"')");
  EXPECT_EQ(err("a -> b ; c"),
            "r.aoa:1:8: unexpected ';' (expected a key name, ',', '->', '=' or '^T')");
  EXPECT_EQ(err("-> b"), "r.aoa:1:1: expected a source key name or '_', found '->'");
  EXPECT_EQ(err("a -> b, axis=1, c"),
            "r.aoa:1:17: target key name 'c' after options (target names come first)");
  EXPECT_EQ(err("a -> b^T"), "r.aoa:1:7: '^T' belongs on the source side (write 'x^T -> y')");
  EXPECT_EQ(err("a\x01 -> b"),
            "r.aoa:1:2: unexpected byte 0x01 (expected a key name, ',', '->', '=' or '^T')");
}

// A 10 MB key name in an error is quoted as a bounded excerpt: its start, how much was left out
// and its end, in one short line.
TEST(AoaParseTest, HugeOffendingTextIsExcerpted) {
  const std::string name(10 << 20, 'k');
  const std::string e = errorOf([&] { aoa::parse(name + " " + name + " -> c", "r.aoa"); });
  EXPECT_LT(e.size(), 300u);
  EXPECT_EQ(e.rfind("r.aoa:1:10485762: expected ',' or '->' after 'kkk", 0), 0u) << e;
  EXPECT_NE(e.find(" bytes left out) … "), std::string::npos) << e;
  EXPECT_EQ(e.substr(e.size() - 3), "kk'");
}

TEST(AoaParseTest, RandomBytesGiveErrorsNotCrashes) {
  std::mt19937_64 rng(7);
  const Named src = {{"a", randomArr(st::DType::F32, {4, 4}, 1)}};
  int errors = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string text(size_t(rng() % 200), '\0');
    for (char& c : text) c = char(rng() % 256);
    try {
      aoa::Program p = aoa::parse(text, "random.aoa");
      aoa::apply(&p, keysOf(src));
    } catch (const Error& e) {
      ++errors;
      EXPECT_EQ(std::string(e.what()).rfind("random.aoa", 0), 0u) << e.what();
    }
  }
  EXPECT_GT(errors, 1900);
}

// ---- primitives against plain-loop references --------------------------------------------------

class AoaPrimitiveTest : public ::testing::Test {
 protected:
  Arr a = randomArr(st::DType::F32, {6, 4}, 1);
  Arr b = randomArr(st::DType::F32, {6, 4}, 2);
  Arr c = randomArr(st::DType::F32, {6, 8}, 3);
  Arr x3 = randomArr(st::DType::F32, {4, 3, 5}, 4);
  Named src() const { return {{"a", a}, {"b", b}, {"c", c}, {"x3", x3}}; }
};

TEST_F(AoaPrimitiveTest, RenameDropAndUntouchedKeys) {
  auto out = runRules(src(), "a -> renamed\nb -> _\n");
  EXPECT_EQ(out.count("a"), 0u);
  EXPECT_EQ(out.count("b"), 0u);
  EXPECT_TRUE(sameArr(out.at("renamed"), a));
  EXPECT_TRUE(sameArr(out.at("c"), c));  // no rule: copied from the same-named key
  EXPECT_TRUE(sameArr(out.at("x3"), x3));
}

TEST_F(AoaPrimitiveTest, DeclareWritesZeros) {
  auto out = runRules(src(), "_ -> z, shape=\"[2, 3]\"\n_ -> h, shape=\"[5]\", dtype=bfloat16\n");
  Arr z;
  z.dtype = st::DType::F32;
  z.shape = {2, 3};
  z.bytes.assign(24, 0);
  EXPECT_TRUE(sameArr(out.at("z"), z));
  EXPECT_EQ(out.at("h").dtype, st::DType::BF16);
  EXPECT_EQ(out.at("h").bytes, std::vector<uint8_t>(10, 0));
}

TEST_F(AoaPrimitiveTest, Concatenate) {
  auto out = runRules(src(), "a, b, c -> abc, axis=1\n");
  EXPECT_TRUE(sameArr(out.at("abc"), test::concatArr({a, b, c}, 1)));
  out = runRules(src(), "a, b -> ab, axis=0\n");
  EXPECT_TRUE(sameArr(out.at("ab"), test::concatArr({a, b}, 0)));
  out = runRules(src(), "a, b -> ab, axis=-1\n");
  EXPECT_TRUE(sameArr(out.at("ab"), test::concatArr({a, b}, 1)));
}

TEST_F(AoaPrimitiveTest, SplitEvenly) {
  auto out = runRules(src(), "c -> c0, c1, axis=1\na -> p, q, r, axis=0\n");
  EXPECT_TRUE(sameArr(out.at("c0"), test::sliceArr(c, 1, 0, 4)));
  EXPECT_TRUE(sameArr(out.at("c1"), test::sliceArr(c, 1, 4, 4)));
  EXPECT_TRUE(sameArr(out.at("p"), test::sliceArr(a, 0, 0, 2)));
  EXPECT_TRUE(sameArr(out.at("q"), test::sliceArr(a, 0, 2, 2)));
  EXPECT_TRUE(sameArr(out.at("r"), test::sliceArr(a, 0, 4, 2)));
}

TEST_F(AoaPrimitiveTest, TransposeAndPermute) {
  auto out = runRules(src(), "x3^T -> t\na^T -> at\n");
  EXPECT_TRUE(sameArr(out.at("t"), test::transposeArr(x3)));
  EXPECT_TRUE(sameArr(out.at("at"), test::transposeArr(a)));
  out = runRules(src(), "x3 -> p, permute=\"[1,0,2]\"\n");
  EXPECT_TRUE(sameArr(out.at("p"), test::permuteArr(x3, {1, 0, 2})));
  out = runRules(src(), "x3 -> p, permute=\"[2,0,1]\"\n");
  EXPECT_TRUE(sameArr(out.at("p"), test::permuteArr(x3, {2, 0, 1})));
}

TEST_F(AoaPrimitiveTest, Cast) {
  auto out = runRules(src(), "a -> a16, dtype=\"bfloat16\"\nb -> b16, dtype=float16\n");
  EXPECT_TRUE(sameArr(out.at("a16"), test::castArr(a, st::DType::BF16)));
  EXPECT_TRUE(sameArr(out.at("b16"), test::castArr(b, st::DType::F16)));
}

TEST_F(AoaPrimitiveTest, TransposeThenConcatThenCast) {
  // Statements compose: pieces of pieces.
  auto out = runRules(src(), "a^T, b^T -> abt, axis=0, dtype=bf16\nabt -> s0, s1, axis=1\n");
  Arr ref = test::castArr(test::concatArr({test::transposeArr(a), test::transposeArr(b)}, 0),
                          st::DType::BF16);
  EXPECT_TRUE(sameArr(out.at("s0"), test::sliceArr(ref, 1, 0, 3)));
  EXPECT_TRUE(sameArr(out.at("s1"), test::sliceArr(ref, 1, 3, 3)));
}

// Per kv group g: the group's q heads, then k head g, then v head g (rows of hd).
Arr fusedQkvRef(const Arr& q, const Arr& k, const Arr& v, int64_t h, int64_t g) {
  const int64_t hd = q.shape[0] / h, per = h / g;
  std::vector<Arr> parts;
  for (int64_t j = 0; j < g; ++j) {
    parts.push_back(test::sliceArr(q, 0, j * per * hd, per * hd));
    parts.push_back(test::sliceArr(k, 0, j * hd, hd));
    parts.push_back(test::sliceArr(v, 0, j * hd, hd));
  }
  return test::concatArr(parts, 0);
}

TEST(AoaFusedTest, FusedQkvGroupedQueryAttentionAndBack) {
  // 8 query heads, 2 kv groups, head_dim 3, model width 5.
  Arr q = randomArr(st::DType::F32, {24, 5}, 11), k = randomArr(st::DType::F32, {6, 5}, 12),
      v = randomArr(st::DType::F32, {6, 5}, 13);
  auto out = runRules({{"q", q}, {"k", k}, {"v", v}},
                      "q, k, v -> qkv, fused_qkv, num_heads=8, num_key_value_groups=2\n");
  Arr ref = fusedQkvRef(q, k, v, 8, 2);
  ASSERT_TRUE(sameArr(out.at("qkv"), ref));
  // Row 0..11 of group 0: q heads 0..3; then k head 0 (rows 12..14), v head 0 (15..17).
  EXPECT_EQ(0, std::memcmp(out.at("qkv").bytes.data() + 12 * 5 * 4, k.bytes.data(), 3 * 5 * 4));
  auto back = runRules({{"qkv", out.at("qkv")}},
                       "qkv -> q, k, v, fused_qkv, num_heads=8, num_key_value_groups=2\n");
  EXPECT_TRUE(sameArr(back.at("q"), q));
  EXPECT_TRUE(sameArr(back.at("k"), k));
  EXPECT_TRUE(sameArr(back.at("v"), v));
  // Multi-head attention (groups = heads) is the default; axis=1 fuses columns.
  Arr qt = test::transposeArr(q), kt = test::transposeArr(q), vt = test::transposeArr(q);
  auto cols = runRules({{"q", qt}, {"k", kt}, {"v", vt}},
                       "q, k, v -> qkv, fused_qkv, num_heads=4, axis=1\n");
  Arr refCols = test::transposeArr(fusedQkvRef(q, q, q, 4, 4));
  EXPECT_TRUE(sameArr(cols.at("qkv"), refCols));
}

TEST(AoaFusedTest, FusedFfnChunksStayCorrectAcrossTpDegrees) {
  Arr gate = randomArr(st::DType::F32, {8, 3}, 21), up = randomArr(st::DType::F32, {8, 3}, 22);
  auto out = runRules({{"gate", gate}, {"up", up}}, "gate, up -> gu, fused_ffn, chunks=4\n");
  std::vector<Arr> parts;
  for (int j = 0; j < 4; ++j) {
    parts.push_back(test::sliceArr(gate, 0, j * 2, 2));
    parts.push_back(test::sliceArr(up, 0, j * 2, 2));
  }
  Arr ref = test::concatArr(parts, 0);
  ASSERT_TRUE(sameArr(out.at("gu"), ref));
  // A tp=2 shard of the fused tensor holds matching gate and up rows: rank r's half is
  // [gate chunks 2r, 2r+1 interleaved with up chunks 2r, 2r+1].
  Arr half = test::sliceArr(ref, 0, 8, 8);
  EXPECT_EQ(0, std::memcmp(half.bytes.data(), gate.bytes.data() + 4 * 3 * 4, 2 * 3 * 4));
  auto back = runRules({{"gu", ref}}, "gu -> gate, up, fused_ffn, chunks=4\n");
  EXPECT_TRUE(sameArr(back.at("gate"), gate));
  EXPECT_TRUE(sameArr(back.at("up"), up));
}

TEST(AoaRoundTripTest, TransposeTwiceAndCastBackAreByteIdentical) {
  Arr w = randomArr(st::DType::F32, {7, 5, 3}, 31);
  auto t = runRules({{"w", w}}, "w^T -> w\n");
  EXPECT_TRUE(sameArr(t.at("w"), test::transposeArr(w)));
  auto back = runRules({{"w", t.at("w")}}, "w^T -> w\n");
  EXPECT_TRUE(sameArr(back.at("w"), w));
  // bfloat16 values survive float32 and back exactly.
  Arr h = randomArr(st::DType::BF16, {9, 4}, 32);
  auto up = runRules({{"h", h}}, "h -> h, dtype=float32\n");
  EXPECT_EQ(up.at("h").dtype, st::DType::F32);
  auto down = runRules({{"h", up.at("h")}}, "h -> h, dtype=bfloat16\n");
  EXPECT_TRUE(sameArr(down.at("h"), h));
  // Both casts in one file (a chain of casts on the same pieces).
  auto both = runRules({{"h", h}}, "h -> m, dtype=float32\nm -> h, dtype=bfloat16\n");
  EXPECT_TRUE(sameArr(both.at("h"), h));
}

// ---- macros --------------------------------------------------------------------------------

TEST(AoaMacroTest, LayerIdsExpertIdsAndOffsets) {
  Named src;
  for (int l : {1, 2, 10})
    for (int e = 0; e < 2; ++e)
      src.push_back({"layers." + std::to_string(l) + ".experts." + std::to_string(e) + ".w",
                     randomArr(st::DType::F32, {2, 2}, uint64_t(l * 10 + e))});
  src.push_back({"layers.1.norm", randomArr(st::DType::F32, {3}, 99)});
  auto out = runRules(src,
                      "layers.$LAYER_ID.experts.$EXPERT_ID.w -> "
                      "blocks.$LAYER_ID_OFFSET.moe.$EXPERT_ID.w\n"
                      "layers.$LAYER_ID.norm -> blocks.$LAYER_ID.norm\n");
  EXPECT_TRUE(sameArr(out.at("blocks.0.moe.1.w"), src[1].second));  // layer 1 -> 0
  EXPECT_TRUE(sameArr(out.at("blocks.9.moe.0.w"), src[4].second));  // layer 10 -> 9
  EXPECT_TRUE(sameArr(out.at("blocks.1.norm"), src[6].second));
  EXPECT_EQ(out.size(), 7u);
}

TEST(AoaMacroTest, RangesAndWildcardsInNumericOrder) {
  Named src;
  for (int e : {0, 1, 2, 10})
    src.push_back(
        {"e." + std::to_string(e) + ".w", randomArr(st::DType::F32, {1, 3}, uint64_t(e))});
  auto out = runRules(src, "e.*.w -> all, axis=0\n");
  EXPECT_TRUE(
      sameArr(out.at("all"),
              test::concatArr({src[0].second, src[1].second, src[2].second, src[3].second}, 0)))
      << "'*' expands in numeric order: 0, 1, 2, 10";
  out = runRules(src, "e.[0:3].w -> first3, axis=0\n");
  EXPECT_TRUE(
      sameArr(out.at("first3"), test::concatArr({src[0].second, src[1].second, src[2].second}, 0)));
  EXPECT_TRUE(sameArr(out.at("e.10.w"), src[3].second));
  out = runRules(src, "e.*.w -> f.*.w\n");
  EXPECT_TRUE(sameArr(out.at("f.10.w"), src[3].second));
  EXPECT_EQ(out.count("e.0.w"), 0u);
  out = runRules(src, "e.[0:2].w -> g.[5:7]\n");
  EXPECT_TRUE(sameArr(out.at("g.6"), src[1].second));
}

// A wildcard in each instance of a macro reads only the keys that start with its literal text (an
// ordered index, not a scan of every key per instance: Note [Linear headers]); matches keep
// numeric order, ties (the same number written two ways) the order of the key space, and keys an
// earlier statement produced are found like source keys.
TEST(AoaMacroTest, WildcardsInMacroInstancesSeeTheirOwnKeysInOrder) {
  Named src;
  for (int l : {10, 1, 2})
    for (const char* w : {"b", "a"})
      src.push_back({"layers." + std::to_string(l) + "." + w,
                     randomArr(st::DType::F32, {1, 2}, uint64_t(l * 2 + (*w == 'a')))});
  auto out = runRules(src,
                      "layers.$LAYER_ID.* -> blocks.$LAYER_ID.*\n"
                      "blocks.*.a -> all_a, axis=0\n");
  EXPECT_EQ(out.size(), 4u);  // blocks.{1,2,10}.b and all_a
  EXPECT_TRUE(sameArr(out.at("blocks.10.b"), src[0].second));
  EXPECT_TRUE(
      sameArr(out.at("all_a"), test::concatArr({src[3].second, src[5].second, src[1].second}, 0)))
      << "layers 1, 2, 10";
  Named ties = {{"x.1", randomArr(st::DType::F32, {1, 2}, 7)},
                {"x.01", randomArr(st::DType::F32, {1, 2}, 8)}};
  EXPECT_TRUE(sameArr(runRules(ties, "x.* -> all, axis=0\n").at("all"),
                      test::concatArr({ties[0].second, ties[1].second}, 0)));
  std::swap(ties[0], ties[1]);
  EXPECT_TRUE(sameArr(runRules(ties, "x.* -> all, axis=0\n").at("all"),
                      test::concatArr({ties[0].second, ties[1].second}, 0)));
}

// The budget of names grows with the checkpoint: 100,000, or four per key. A rename of every layer
// through $LAYER_ID and '*' over 120,000 keys counts each key once more (120,000 matches and 1,200
// layer ids): it was refused, though it can name no more keys than there are. Ranges, which name
// keys that need not exist, stay bounded by the budget.
TEST(AoaMacroTest, TheBudgetGrowsWithTheCheckpoint) {
  std::vector<aoa::SourceKey> many;
  for (int l = 0; l < 1200; ++l)
    for (int m = 0; m < 100; ++m)
      many.push_back(
          {"layers." + std::to_string(l) + ".w" + std::to_string(m), st::DType::F32, {1}});
  const aoa::Program p = aoa::parse("layers.$LAYER_ID.* -> blocks.$LAYER_ID.*", "rules.aoa");
  const aoa::Result r = aoa::apply(&p, many);
  ASSERT_EQ(r.keys.size(), many.size());
  EXPECT_EQ(r.keys.front().name, "blocks.0.w0");
  EXPECT_EQ(r.keys.back().name, "blocks.1199.w99");
  const aoa::Program ranges = aoa::parse("a.[0:1000].b.[0:1000] -> z", "rules.aoa");
  try {
    aoa::apply(&ranges, many);
    ADD_FAILURE() << "a million range names expanded";
  } catch (const keel::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "rules.aoa:1:1: rules expand to more than 480000 names (the limit of a rules file: "
              "100000, or four per key of the checkpoint; this name's expansion included)");
  }
}

TEST(AoaMacroTest, MacroErrors) {
  Named src = {{"layers.0.w", randomArr(st::DType::F32, {2}, 1)}};
  EXPECT_EQ(applyError(src, "layers.$LAYER_ID.w -> blocks.$LAYER_ID_OFFSET.w"),
            "rules.aoa:1:23: $LAYER_ID_OFFSET of layer 0 would be -1");
  EXPECT_EQ(applyError(src, "blocks.$LAYER_ID.w -> x.$LAYER_ID"),
            "rules.aoa:1:1: 'blocks.$LAYER_ID.w' matches no key (keys look like 'layers.0.w')");
  EXPECT_EQ(applyError(src, "a -> x.$LAYER_ID"),
            "rules.aoa:1:6: 'x.$LAYER_ID' uses $LAYER_ID/$EXPERT_ID but no source name does (the "
            "ids come from the source keys)");
  EXPECT_EQ(applyError(src, "q.* -> z"),
            "rules.aoa:1:1: 'q.*' matches no key (keys look like "
            "'layers.0.w')");
  EXPECT_EQ(applyError(src, "a.[3:1] -> z"),
            "rules.aoa:1:3: range [3:1] is empty (expected [begin:end] with begin < end)");
  EXPECT_EQ(applyError(src, "a.[2:2] -> z"),
            "rules.aoa:1:3: range [2:2] is empty (expected [begin:end] with begin < end)");
  // Ranges in one name multiply; the product is checked before anything is expanded (a fuzzer
  // found names whose nested ranges took minutes to expand).
  EXPECT_EQ(applyError(src, "a.[0:1000].b.[0:1000] -> z"),
            "rules.aoa:1:1: rules expand to more than 100000 names (the limit of a rules file: "
            "100000, or four per key of the checkpoint; this name's expansion included)");
  // A target that drops an id its source captures: every instance makes the same name.
  Named experts = {{"l.0.e.0.w", randomArr(st::DType::F32, {2}, 1)},
                   {"l.1.e.0.w", randomArr(st::DType::F32, {2}, 2)}};
  EXPECT_EQ(applyError(experts, "l.$LAYER_ID.e.$EXPERT_ID.w -> e.$EXPERT_ID.w"),
            "rules.aoa:1:31: rule produces 'e.0.w' again: another instance of its "
            "$LAYER_ID/$EXPERT_ID/'*' expansion made it (a target name must use every id its "
            "source captures)");
}

// ---- optimizer state follows its key ------------------------------------------------------------

TEST(AoaStateTest, StateFollowsEveryRule) {
  Arr w = randomArr(st::DType::F32, {4, 6}, 1), m = randomArr(st::DType::F32, {4, 6}, 2),
      v = randomArr(st::DType::F32, {4, 6}, 3), u = randomArr(st::DType::F32, {4, 6}, 4),
      um = randomArr(st::DType::F32, {4, 6}, 5), uv = randomArr(st::DType::F32, {4, 6}, 6);
  Arr step;
  step.dtype = st::DType::I64;
  int64_t seven = 7;
  step.bytes.assign(reinterpret_cast<uint8_t*>(&seven), reinterpret_cast<uint8_t*>(&seven) + 8);
  Named src = {{"w", w}, {"w::exp_avg", m},  {"w::exp_avg_sq", v},  {"w::step", step},
               {"u", u}, {"u::exp_avg", um}, {"u::exp_avg_sq", uv}, {"u::step", step}};
  auto out = runRules(src, "w^T -> wt, dtype=bfloat16\n");
  EXPECT_TRUE(sameArr(out.at("wt"), test::castArr(test::transposeArr(w), st::DType::BF16)));
  EXPECT_TRUE(
      sameArr(out.at("wt::exp_avg"), test::castArr(test::transposeArr(m), st::DType::BF16)));
  EXPECT_TRUE(
      sameArr(out.at("wt::exp_avg_sq"), test::castArr(test::transposeArr(v), st::DType::BF16)));
  EXPECT_TRUE(sameArr(out.at("wt::step"), step)) << "rank-0 state is copied, never cast";
  EXPECT_EQ(out.count("w::exp_avg"), 0u);
  out = runRules(src, "w, u -> wu, axis=1\nwu -> a, b, c, axis=1\n");
  EXPECT_TRUE(sameArr(out.at("b::exp_avg"), test::sliceArr(test::concatArr({m, um}, 1), 1, 4, 4)));
  EXPECT_TRUE(sameArr(out.at("c::step"), step));
  EXPECT_EQ(out.size(), 12u);
  EXPECT_EQ(applyError({{"w", w}, {"w::exp_avg", m}, {"u", u}}, "w, u -> x, axis=0"),
            "rules.aoa:1:4: 'u' and 'w' carry different optimizer state, so one rule cannot "
            "combine them");
}

// A pattern naming one optimizer state matches the parameters by the part before "::" (it
// matched no key: patterns see parameter keys, and the literal name and [a:b] ranges worked).
TEST(AoaStateTest, WildcardsAndMacrosNameOneStateOfEachParameter) {
  Arr w = randomArr(st::DType::F32, {2, 2}, 1);
  Named src;
  for (const std::string p : {"blocks.0.w", "blocks.1.w", "blocks.1.u"})
    for (const std::string st : {"", "::exp_avg", "::exp_avg_sq"}) src.push_back({p + st, w});
  for (const std::string rule : {"blocks.*.w::exp_avg -> _", "blocks.$LAYER_ID.w::exp_avg -> _",
                                 "blocks.[0:2].w::exp_avg -> _"}) {
    SCOPED_TRACE(rule);
    aoa::Program p = aoa::parse(rule + "\n", "rules.aoa");
    std::set<std::string> names;
    for (const auto& k : aoa::apply(&p, keysOf(src)).keys) names.insert(k.name);
    EXPECT_EQ(names.size(), src.size() - 2);
    EXPECT_EQ(names.count("blocks.0.w::exp_avg") + names.count("blocks.1.w::exp_avg"), 0u);
    EXPECT_EQ(names.count("blocks.1.w::exp_avg_sq") + names.count("blocks.1.u::exp_avg"), 2u);
  }
  // A '*' target takes its text from the base key; a state no parameter has matches nothing.
  aoa::Program r = aoa::parse("blocks.*.w::exp_avg -> m.*\n", "rules.aoa");
  std::set<std::string> names;
  for (const auto& k : aoa::apply(&r, keysOf(src)).keys) names.insert(k.name);
  EXPECT_EQ(names.count("m.0") + names.count("m.1"), 2u);
  EXPECT_EQ(applyError(src, "blocks.*.w::nope -> _"),
            "rules.aoa:1:1: 'blocks.*.w::nope' matches no key (keys look like 'blocks.0.w')");
}

// A rules file may begin with a UTF-8 byte order mark (configs could, rules could not).
TEST(AoaParseTest, AFileWithAByteOrderMarkParses) {
  const std::string dir = tempDir();
  test::writeFile(dir + "/bom.aoa",
                  "\xEF\xBB\xBF"
                  "a -> b\n");
  const aoa::Program p = aoa::parseFile(dir + "/bom.aoa");
  ASSERT_EQ(p.statements.size(), 1u);
  EXPECT_EQ(p.statements[0].lhs[0].text, "a");
}

// ---- validation before any byte is written ------------------------------------------------------

TEST_F(AoaPrimitiveTest, RuleErrorsAreReportedWithPositions) {
  Arr h = randomArr(st::DType::BF16, {6, 4}, 9);
  Named s = src();
  s.push_back({"h", h});
  EXPECT_EQ(applyError(s, "nope -> x"),
            "rules.aoa:1:1: no key 'nope' in the source (keys look like 'a')");
  EXPECT_EQ(applyError(s, "a -> x\na -> y"),
            "rules.aoa:2:1: no key 'a': it was consumed by the rule on line 1");
  EXPECT_EQ(applyError(s, "c -> p, q, r, axis=1"),
            "rules.aoa:1:20: cannot split axis 1 of 'c' [6, 8] evenly into 3 parts");
  EXPECT_EQ(applyError(s, "a, h -> x, axis=0"),
            "rules.aoa:1:4: concatenation mixes dtypes: 'a' is F32, 'h' is BF16");
  EXPECT_EQ(
      applyError(s, "a, c -> x, axis=0"),
      "rules.aoa:1:4: concatenation along axis 0 needs equal shapes elsewhere: 'a' is [6, 4], "
      "'c' is [6, 8]");
  EXPECT_EQ(applyError(s, "a -> b"),
            "rules.aoa:1:6: rule produces 'b', which already exists (drop or rename the existing "
            "key first)");
  EXPECT_EQ(applyError(s, "c -> p, p, axis=1"), "rules.aoa:1:9: rule produces 'p' twice");
  EXPECT_EQ(applyError(s, "a -> x\nb -> x"),
            "rules.aoa:2:6: rule produces 'x', which already exists (drop or rename the existing "
            "key first)");
  EXPECT_EQ(applyError(s, "a, b -> x"), "rules.aoa:1:9: concatenating 2 keys needs axis=N");
  EXPECT_EQ(applyError(s, "a -> x, fused_xyz"),
            "rules.aoa:1:9: 'fused_xyz' is not a flag (the flags are fused_qkv and fused_ffn); as "
            "a target name, splitting into 2 keys needs axis=N");
  EXPECT_EQ(applyError(s, "a -> x, axis=2, dtype=f32"),
            "rules.aoa:1:14: axis= concatenates several sources into one target or splits one "
            "source into several; one source and one target is a rename, which takes no axis=");
  // A range bound of ten digits was read as a literal name, and the rule then failed for
  // another reason.
  EXPECT_EQ(applyError(s, "_ -> big, shape=\"[1000000000,1000000000,1000000000]\""),
            "rules.aoa:1:17: shape= [1000000000,1000000000,1000000000] holds more than 2^64 "
            "bytes");
  EXPECT_EQ(applyError(s, "a[0:99999999999] -> x, axis=0"),
            "rules.aoa:1:2: range [0:99999999999] has a bound of more than 9 digits");
  EXPECT_EQ(applyError(s, "a, b -> x, axis=2"),
            "rules.aoa:1:17: axis 2 is out of range for 'a' [6, 4] (rank 2)");
  EXPECT_EQ(applyError(s, "a -> x, permute=\"[0,0]\""),
            "rules.aoa:1:17: permute=\"[0,0]\" is not a permutation of 0..1");
  EXPECT_EQ(applyError(s, "x3 -> x, permute=\"[1,0]\""),
            "rules.aoa:1:18: permute has 2 axes but 'x3' has rank 3");
  EXPECT_EQ(applyError(s, "a -> x, speed=3"),
            "rules.aoa:1:9: unknown option 'speed' (expected axis, permute, dtype, num_heads, "
            "num_key_value_groups, chunks or shape)");
  EXPECT_EQ(applyError(s, "a -> x, dtype=f8"),
            "rules.aoa:1:15: unknown dtype 'f8' (expected F64, F32, F16, BF16, I64, I32, I16, I8, "
            "U8, BOOL or float32, bfloat16, float16, float64, int64, int32, int16, int8, uint8, "
            "bool)");
  EXPECT_EQ(applyError(s, "a, b, c -> x, fused_qkv, num_heads=4"),
            "rules.aoa:1:7: fused_qkv along axis 0 needs equal shapes elsewhere: 'a' is [6, 4], "
            "'c' is [6, 8]");
  s.push_back({"k1", randomArr(st::DType::F32, {4, 4}, 10)});
  s.push_back({"k2", randomArr(st::DType::F32, {4, 4}, 11)});
  EXPECT_EQ(applyError(s, "a, k1, k2 -> x, fused_qkv, num_heads=3"),
            "rules.aoa:1:4: 'k1' has 4 rows on axis 0, expected num_key_value_groups x head_dim = "
            "6");
  EXPECT_EQ(applyError(s, "a, k1, k2 -> x, fused_qkv, num_heads=4, num_key_value_groups=3"),
            "rules.aoa:1:38: num_heads=4 is not a multiple of num_key_value_groups=3");
  EXPECT_EQ(applyError(s, "a, b -> x, fused_qkv, num_heads=2"),
            "rules.aoa:1:12: fused_qkv expects 'q, k, v -> qkv' or 'qkv -> q, k, v', got 2 -> 1 "
            "keys");
  EXPECT_EQ(applyError(s, "a -> x, y, fused_ffn"),
            "rules.aoa:1:12: fused_ffn needs chunks=N (see docs/checkpoint.md)");
  EXPECT_EQ(applyError(s, "a -> b, c, d"), "rules.aoa:1:6: splitting into 3 keys needs axis=N");
  EXPECT_EQ(applyError(s, "a, b -> c, d, e"),
            "rules.aoa:1:1: 2 sources and 3 targets: expected n -> n (rename), n -> 1 with axis= "
            "(concatenate) or 1 -> n with axis= (split)");
}

TEST_F(AoaPrimitiveTest, ABadRuleWritesNothing) {
  const std::string dir = tempDir();
  Named s = src();
  test::saveArrs(dir + "/src", s, 2, 0);
  Checkpoint c = Checkpoint::open(dir + "/src");
  // The error is in the last statement: nothing may have been written for the first ones.
  aoa::Program p = aoa::parse("a -> a2\nb -> b2\nc -> p, q, r, axis=1\n", "rules.aoa");
  TargetSpec spec;
  spec.tp = 2;
  EXPECT_THROW(convert(c, dir + "/dst", spec, &p), Error);
  EXPECT_FALSE(fs::exists(dir + "/dst"));
  // A declared key without a shape cannot be written either.
  aoa::Program d = aoa::parse("_ -> z\n", "rules.aoa");
  EXPECT_EQ(errorOf([&] { convert(c, dir + "/dst", spec, &d); }),
            "rules.aoa:1:6: key 'z' was declared ('_ -> z') without shape=, so it cannot be "
            "written");
  EXPECT_FALSE(fs::exists(dir + "/dst"));
}

}  // namespace
}  // namespace keel::ckpt
