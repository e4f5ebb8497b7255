// Tests for GptConfig loading: the shipped configs parse, defaults are filled, and every bad input
// (missing file, bad JSON, unknown key, wrong type, out-of-range or inconsistent value) throws
// keel::Error with one line naming the source and the field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "keel/error.h"
#include "keel/gpt_config.h"

namespace keel {
namespace {

using Json = nlohmann::json;
const std::string kSrc = KEEL_SOURCE_DIR;

Json baseConfig() {
  return Json{{"vocab_size", 256}, {"seq_len", 16}, {"n_layer", 2},    {"n_head", 2},
              {"d_model", 32},     {"d_ff", 64},    {"batch_size", 4}, {"lr", 1e-3}};
}

// Expects parse failure whose message names the source and contains every fragment.
void expectError(const std::string& text, const std::vector<std::string>& fragments,
                 const std::string& source = "cfg.json") {
  try {
    parseGptConfig(text, source);
    ADD_FAILURE() << "no error for: " << text;
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
    EXPECT_EQ(msg.rfind(source + ":", 0), 0u) << "starts with the source: " << msg;
    for (auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << msg << " lacks " << f;
  }
}

void expectFieldError(const Json& j, const std::string& field) {
  SCOPED_TRACE(j.dump());
  expectError(j.dump(), {"field '" + field + "'"});
}

Json with(const std::string& key, const Json& value) {
  Json j = baseConfig();
  j[key] = value;
  return j;
}
Json without(const std::string& key) {
  Json j = baseConfig();
  j.erase(key);
  return j;
}
Json moe(const Json& extra = Json::object()) {
  Json j = baseConfig();
  j["n_expert"] = 4;
  j["top_k"] = 2;
  for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
  return j;
}

TEST(ConfigTest, ShippedConfigsParse) {
  GptConfig g = loadGptConfig(kSrc + "/configs/gpt-mini.json");
  EXPECT_EQ(g.n_layer, 4);
  EXPECT_EQ(g.d_model, 128);
  EXPECT_FALSE(g.isMoe());
  GptConfig m = loadGptConfig(kSrc + "/configs/moe-mini.json");
  EXPECT_TRUE(m.isMoe());
  EXPECT_LE(m.top_k, m.n_expert);
  EXPECT_NO_THROW(loadGptConfig(kSrc + "/tests/fixtures/gpt-tiny.json"));
  EXPECT_TRUE(loadGptConfig(kSrc + "/tests/fixtures/moe-tiny.json").isMoe());
}

// A training checkpoint records its config as gptConfigJson's text (Note [Resumed settings]):
// every field, read back to the same config.
TEST(ConfigTest, ItsJsonTextReadsBackToTheSameConfig) {
  GptConfig c = parseGptConfig(R"({"name": "x", "vocab_size": 300, "seq_len": 32, "n_layer": 3,
      "n_head": 4, "d_model": 64, "d_ff": 96, "norm": "rmsnorm", "position": "rope",
      "dropout": 0.125, "n_expert": 4, "top_k": 1, "capacity_factor": 2.0, "aux_loss_coef": 0.5,
      "pack_documents": true, "batch_size": 3, "lr": 0.002, "min_lr": 0.0001,
      "warmup_steps": 7, "weight_decay": 0.3, "grad_clip": 0.5, "optimizer": "sgd",
      "momentum": 0.8, "nesterov": true, "beta1": 0.7, "beta2": 0.6, "eps": 1e-6,
      "eval_every": 5, "eval_batches": 2, "allocator": "caching"})");
  EXPECT_EQ(parseGptConfig(gptConfigJson(c)), c);
  const GptConfig d;
  EXPECT_EQ(parseGptConfig(gptConfigJson(d)), d);
}

TEST(ConfigTest, DefaultsAreFilled) {
  Json j = baseConfig();
  j.erase("d_ff");
  GptConfig c = parseGptConfig(j.dump());
  EXPECT_EQ(c.d_ff, 4 * 32);
  EXPECT_DOUBLE_EQ(c.min_lr, 1e-4);  // lr / 10
  EXPECT_EQ(c.norm, "layernorm");
  EXPECT_EQ(c.optimizer, "adamw");
  EXPECT_EQ(c.n_expert, 0);
  EXPECT_EQ(c.dtype, "float32");
}

TEST(ConfigTest, FileProblems) {
  namespace fs = std::filesystem;
  fs::path dir =
      fs::path(::testing::TempDir()) / ("keel_config_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string missing = (dir / "nope.json").string();
  expectError("", {}, "unused");  // empty text is invalid JSON
  try {
    loadGptConfig(missing);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  EXPECT_THROW(loadGptConfig(dir.string()), Error);  // a directory
  std::string empty = (dir / "empty.json").string();
  std::ofstream(empty) << "  \n";
  EXPECT_THROW(loadGptConfig(empty), Error);
  std::string bad = (dir / "bad.json").string();
  std::ofstream(bad) << "{\"vocab_size\": 256,\n \"seq_len\": }";
  try {
    loadGptConfig(bad);
    ADD_FAILURE();
  } catch (const Error& e) {
    std::string msg = e.what();
    // Where, in words: not the library's "[json.exception.parse_error.101] parse error at".
    EXPECT_EQ(
        msg.rfind(bad + ": invalid JSON: line 2, column 13: syntax error while parsing value", 0),
        0u)
        << msg;
    EXPECT_EQ(msg.find("json.exception"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  expectError("[1, 2]", {"JSON object"});
  expectError("{\"vocab_size\": 256", {"invalid JSON"});
}

TEST(ConfigTest, MissingRequiredFields) {
  for (const char* f : {"vocab_size", "seq_len", "n_layer", "n_head", "d_model"}) {
    SCOPED_TRACE(f);
    expectError(without(f).dump(), {"field '" + std::string(f) + "'", "missing"});
  }
}

TEST(ConfigTest, UnknownKeys) {
  expectError(with("n_layers", 4).dump(), {"field 'n_layers'", "unknown"});
  expectError(with("learning_rate", 0.1).dump(), {"field 'learning_rate'", "unknown"});
}

TEST(ConfigTest, WrongTypes) {
  expectFieldError(with("n_layer", "4"), "n_layer");
  expectFieldError(with("d_model", 12.5), "d_model");
  expectFieldError(with("vocab_size", true), "vocab_size");
  expectFieldError(with("batch_size", Json::array({4})), "batch_size");
  expectFieldError(with("lr", "fast"), "lr");
  expectFieldError(with("dropout", nullptr), "dropout");
  try {  // null is named once ("got null null" before)
    parseGptConfig(with("dropout", nullptr).dump(), "cfg.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cfg.json: field 'dropout': expected a number, got null");
  }
  expectError(with("n_layer", "4").dump(),
              {"field 'n_layer': expected an integer, got string \"4\""});
  expectFieldError(with("norm", 3), "norm");
  expectFieldError(with("nesterov", 1), "nesterov");
  expectFieldError(with("name", 7), "name");
  expectFieldError(with("allocator", 1), "allocator");
  expectFieldError(with("allocator", "buddy"), "allocator");
  EXPECT_EQ(parseGptConfig(with("allocator", "caching").dump()).allocator, "caching");
  expectFieldError(with("vocab_size", Json(18446744073709551615ull)), "vocab_size");
}

TEST(ConfigTest, NonPositiveSizes) {
  for (const char* f :
       {"vocab_size", "seq_len", "n_layer", "n_head", "d_model", "d_ff", "batch_size"}) {
    expectFieldError(with(f, 0), f);
    expectFieldError(with(f, -3), f);
  }
}

TEST(ConfigTest, InconsistentOrOutOfRangeValues) {
  Json j = baseConfig();
  j["d_model"] = 30;
  j["n_head"] = 4;
  expectError(j.dump(), {"field 'n_head'", "divisible"});
  expectError(moe({{"top_k", 5}}).dump(), {"field 'top_k'", "exceeds n_expert"});
  expectFieldError(moe({{"top_k", 0}}), "top_k");
  expectFieldError(moe({{"capacity_factor", 0.0}}), "capacity_factor");
  expectFieldError(moe({{"aux_loss_coef", -0.1}}), "aux_loss_coef");
  expectFieldError(with("n_expert", -1), "n_expert");
  expectFieldError(with("norm", "batchnorm"), "norm");
  expectFieldError(with("optimizer", "adam"), "optimizer");
  expectFieldError(with("dtype", "float16"), "dtype");
  expectFieldError(with("dropout", 1.0), "dropout");
  expectFieldError(with("dropout", -0.1), "dropout");
  expectFieldError(with("lr", 0.0), "lr");
  expectFieldError(with("min_lr", 0.5), "min_lr");  // above lr
  expectFieldError(with("min_lr", -1e-5), "min_lr");
  expectFieldError(with("warmup_steps", -1), "warmup_steps");
  expectFieldError(with("weight_decay", -0.1), "weight_decay");
  expectFieldError(with("grad_clip", -1.0), "grad_clip");
  expectFieldError(with("momentum", 1.0), "momentum");
  expectFieldError(with("beta1", -0.1), "beta1");
  expectFieldError(with("beta2", 1.0), "beta2");
  expectFieldError(with("eps", 0.0), "eps");
  expectFieldError(with("eval_every", -1), "eval_every");
  expectFieldError(with("name", std::string("gpt\0tiny", 8)), "name");
  // A UTF-8 byte order mark before the object is accepted (editors write one).
  EXPECT_EQ(parseGptConfig("\xEF\xBB\xBF" + with("name", "bom").dump()).name, "bom");
  // Far beyond any machine: refused up front, naming the fields and the bytes (they used to
  // crash with SIGSEGV or train until killed; Note [A config that cannot fit]).
  for (const auto& [field, part] : {std::pair<const char*, const char*>{"d_model", "parameters"},
                                    {"n_layer", "parameters"},
                                    {"batch_size", "activations"}}) {
    Json j = with(field, int64_t(1) << 62);
    if (std::string(field) == "d_model") j["n_head"] = 1;
    try {
      parseGptConfig(j.dump(), "big.json");
      ADD_FAILURE() << field << ": expected keel::Error";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("big.json: the model needs about "), std::string::npos) << m;
      EXPECT_NE(m.find(std::string(part) + " "), std::string::npos) << m;
      EXPECT_NE(m.find(std::string(field) + " 4611686018427387904"), std::string::npos) << m;
    }
  }
  expectFieldError(with("eval_batches", 0), "eval_batches");
  EXPECT_EQ(parseGptConfig(with("eval_every", 5).dump()).eval_every, 5);
  // top_k is only checked against n_expert for an MoE model.
  EXPECT_NO_THROW(parseGptConfig(with("top_k", 8).dump()));
}

Json attention(const Json& extra) {
  Json j = baseConfig();
  for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
  return j;
}

TEST(ConfigTest, AttentionMaskKeys) {
  GptConfig c = parseGptConfig(baseConfig().dump());
  EXPECT_EQ(c.attention_mask, "causal");
  EXPECT_EQ(c.attention_window, 0);
  EXPECT_FALSE(c.pack_documents);
  c = parseGptConfig(
      attention({{"attention_mask", "sliding_window"}, {"attention_window", 8}}).dump());
  EXPECT_EQ(c.attention_mask, "sliding_window");
  EXPECT_EQ(c.attention_window, 8);
  c = parseGptConfig(attention({{"attention_mask", "global_sliding_window"},
                                {"attention_window", 4},
                                {"attention_global", 2}})
                         .dump());
  EXPECT_EQ(c.attention_global, 2);
  c = parseGptConfig(attention({{"attention_mask", "causal_document"}}).dump());
  EXPECT_EQ(c.attention_mask, "causal_document");
  EXPECT_FALSE(c.pack_documents);
  // pack_documents implies the causal-document mask, and accepts it spelled out.
  c = parseGptConfig(attention({{"pack_documents", true}}).dump());
  EXPECT_TRUE(c.pack_documents);
  EXPECT_EQ(c.attention_mask, "causal_document");
  EXPECT_NO_THROW(parseGptConfig(
      attention({{"pack_documents", true}, {"attention_mask", "causal_document"}}).dump()));
}

TEST(ConfigTest, BadAttentionMaskKeysNameTheField) {
  expectError(attention({{"attention_mask", "bidirectional"}}).dump(),
              {"field 'attention_mask'", "\"bidirectional\"", "causal_document"});
  expectFieldError(attention({{"attention_mask", 1}}), "attention_mask");
  expectError(attention({{"attention_mask", "sliding_window"}, {"attention_window", -1}}).dump(),
              {"field 'attention_window'", ">= 1"});
  expectFieldError(attention({{"attention_mask", "sliding_window"}, {"attention_window", 0}}),
                   "attention_window");
  expectFieldError(attention({{"attention_mask", "sliding_window"}, {"attention_window", 2.5}}),
                   "attention_window");
  expectError(attention({{"attention_window", 8}}).dump(),
              {"field 'attention_window'", "only used with"});
  expectError(attention({{"attention_mask", "global_sliding_window"},
                         {"attention_window", 4},
                         {"attention_global", 0}})
                  .dump(),
              {"field 'attention_global'", "[1, 16)"});
  expectFieldError(attention({{"attention_mask", "global_sliding_window"},
                              {"attention_window", 4},
                              {"attention_global", 16}}),
                   "attention_global");
  expectFieldError(
      attention(
          {{"attention_mask", "sliding_window"}, {"attention_window", 4}, {"attention_global", 2}}),
      "attention_global");
  expectError(attention({{"pack_documents", true}, {"attention_mask", "causal"}}).dump(),
              {"field 'pack_documents'", "causal_document"});
  expectFieldError(attention({{"pack_documents", "yes"}}), "pack_documents");
}

// A sliding mask without its window (or a global one without attention_global) is named missing:
// "must be >= 1 ..., got 0" named a value the file never held.
TEST(ConfigTest, AMissingWindowIsNamedMissingNotZero) {
  expectError(attention({{"attention_mask", "sliding_window"}}).dump(),
              {"field 'attention_window': missing (required with attention_mask "
               "\"sliding_window\")"});
  expectError(attention({{"attention_mask", "global_sliding_window"}}).dump(),
              {"field 'attention_window': missing (required with attention_mask "
               "\"global_sliding_window\")"});
  expectError(
      attention({{"attention_mask", "global_sliding_window"}, {"attention_window", 4}}).dump(),
      {"field 'attention_global': missing (required with attention_mask "
       "\"global_sliding_window\")"});
}

TEST(ConfigTest, PositionKey) {
  EXPECT_EQ(parseGptConfig(baseConfig().dump()).position, "learned");
  EXPECT_EQ(parseGptConfig(with("position", "rope").dump()).position, "rope");
  EXPECT_EQ(parseGptConfig(with("position", "learned").dump()).position, "learned");
  expectError(with("position", "alibi").dump(),
              {"field 'position'", "\"alibi\"", "\"learned\" or \"rope\""});
  expectFieldError(with("position", 1), "position");
  // rope turns pairs of a head's dims: d_model 30 / n_head 2 = 15 is odd.
  Json odd = with("position", "rope");
  odd["d_model"] = 30;
  expectError(odd.dump(), {"field 'position'", "even", "15"});
  odd["position"] = "learned";
  EXPECT_NO_THROW(parseGptConfig(odd.dump()));
  EXPECT_EQ(loadGptConfig(kSrc + "/tests/fixtures/gpt-tiny-rope.json").position, "rope");
}

TEST(ConfigTest, ValidateCatchesCodeBuiltConfigs) {
  GptConfig c;
  EXPECT_NO_THROW(validateGptConfig(c));
  c.n_head = 3;  // 64 % 3 != 0
  EXPECT_THROW(validateGptConfig(c), Error);
  GptConfig packed;
  packed.pack_documents = true;  // attention_mask left at "causal"
  EXPECT_THROW(validateGptConfig(packed), Error);
  packed.attention_mask = "causal_document";
  EXPECT_NO_THROW(validateGptConfig(packed));
}

}  // namespace
}  // namespace keel
