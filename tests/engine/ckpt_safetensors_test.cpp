// Tests for the safetensors reader and writer: the byte layout other readers expect (8-byte
// little-endian length, JSON header padded to 8 bytes, tensors back to back), a round trip, and
// every hostile header Note [Hostile safetensors] lists giving a keel::Error that names the
// problem — never a crash or an out-of-bounds read (the asan build runs these too).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ckpt_test_util.h"
#include "keel/error.h"
#include "keel/safetensors.h"

namespace keel::st {
namespace {

using ckpt::test::readFileBytes;
using ckpt::test::tempDir;
using ckpt::test::writeFile;

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char(n >> (8 * i));
  return s;
}

// A file image with the given header text and `dataBytes` zero bytes of data.
std::string image(const std::string& header, size_t dataBytes) {
  return le64(header.size()) + header + std::string(dataBytes, '\0');
}

void expectError(const std::string& bytes, const std::string& fragment) {
  try {
    parseFile(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "x.safetensors");
    ADD_FAILURE() << "no error; expected one containing '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message: " << e.what() << "\nexpected fragment: " << fragment;
    EXPECT_NE(std::string(e.what()).find("x.safetensors"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsTest, WriterProducesTheStandardLayout) {
  const std::string dir = tempDir();
  const std::string path = dir + "/a.safetensors";
  {
    Writer w(path, {{"b", DType::F32, {2, 3}}, {"a", DType::BF16, {4}}, {"s", DType::I64, {}}},
             {{"format", "pt"}});
    float f[6] = {1, 2, 3, 4, 5, 6};
    w.write(0, 0, f, sizeof f);
    uint16_t h[4] = {0x3f80, 0x4000, 0x4040, 0x4080};
    w.write(1, 0, h, sizeof h);
    int64_t s = -7;
    w.write(2, 0, &s, 8);
    w.close();
  }
  std::string bytes = readFileBytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
  EXPECT_EQ(n % 8, 0u) << "header padded to 8 bytes";
  ASSERT_EQ(bytes.size(), 8 + n + 24 + 8 + 8);
  auto j = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(j["__metadata__"]["format"], "pt");
  EXPECT_EQ(j["b"]["dtype"], "F32");
  EXPECT_EQ(j["b"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(j["b"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(j["a"]["data_offsets"], nlohmann::json({24, 32}));
  EXPECT_EQ(j["s"]["shape"], nlohmann::json::array());
  EXPECT_EQ(j["s"]["data_offsets"], nlohmann::json({32, 40}));
  float f4;
  std::memcpy(&f4, bytes.data() + 8 + n + 12, 4);
  EXPECT_EQ(f4, 4.0f);

  Reader r(path);
  ASSERT_EQ(r.header().tensors.size(), 3u);
  EXPECT_EQ(r.header().metadata.at("format"), "pt");
  const TensorEntry* a = r.header().find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::BF16);
  auto data = r.readTensor(*a);
  ASSERT_EQ(data.size(), 8u);
  EXPECT_EQ(data[0], 0x80);
  EXPECT_EQ(data[1], 0x3f);
  EXPECT_EQ(r.header().find("s")->shape.size(), 0u);
}

TEST(SafetensorsTest, DTypeNames) {
  EXPECT_EQ(parseDTypeName("bfloat16"), DType::BF16);
  EXPECT_EQ(parseDTypeName("BF16"), DType::BF16);
  EXPECT_EQ(parseDTypeName("float32"), DType::F32);
  EXPECT_EQ(parseDTypeName("BOOL"), DType::Bool);
  EXPECT_EQ(dtypeSize(DType::I16), 2u);
  EXPECT_THROW(parseDTypeName("F8"), Error);
}

TEST(SafetensorsTest, HeaderLengthBeyondTheFile) {
  expectError(le64(1000) + "{}", "exceeds the file");
  expectError(le64(~uint64_t(0)) + "{}", "exceeds the file");
  expectError(std::string("\x02\0\0", 3), "shorter than the 8-byte header length");
}

TEST(SafetensorsTest, MalformedJson) {
  expectError(image("{\"a\": ", 0), "not valid JSON");
  expectError(image("[1, 2]", 0), "does not start with '{'");
  expectError(image("{\"a\": 1}", 0), "is not an object");
  expectError(image(std::string(100, '{'), 0), "nested too deeply");
  expectError(image("{\"__metadata__\": {\"k\": 1}}", 0), "not a string");
}

TEST(SafetensorsTest, OffsetsOutOfRangeOverlappingOrWithHoles) {
  expectError(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4),
              "outside the data buffer");
  expectError(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                    12),
              "overlap");
  expectError(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "hole");
  expectError(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8),
              "trailing bytes");
  expectError(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8),
              "end before they begin");
  expectError(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-1,4]}})", 8),
              "non-negative");
  expectError(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 8), "[begin, end]");
}

TEST(SafetensorsTest, UnknownDTypesAndBadShapes) {
  expectError(image(R"({"a":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", 1),
              "unknown dtype 'F8'");
  expectError(image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
              "needs 12 bytes but data_offsets give 8");
  expectError(image(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
              "non-negative integers");
  expectError(image(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}})", 8),
              "non-negative integers");
  expectError(image(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],)"
                    R"("data_offsets":[0,8]}})",
                    8),
              "overflows");
  expectError(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4),
              "unknown field 'x'");
  expectError(image(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4), "missing string 'dtype'");
}

TEST(SafetensorsTest, DuplicateNames) {
  expectError(image(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                    R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                    2),
              "names tensor 'a' twice");
}

// A name repeated far from its first use is found too (one pass over the header's names, not the
// parser callback that made headers quadratic: Note [Linear headers]).
TEST(SafetensorsTest, ADuplicateAmongManyNames) {
  std::string h = "{";
  for (int i = 0; i < 1000; ++i)
    h += "\"t" + std::to_string(i) + R"(":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)";
  h += R"("t7":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})";
  expectError(image(h, 0), "names tensor 't7' twice");
}

// Empty tensors all sit at one offset; they keep the order the header names them in (the data
// order of the others), as a reader listing the file would show them.
TEST(SafetensorsTest, EmptyTensorsKeepTheHeaderOrder) {
  const std::string h = R"({"z":{"dtype":"U8","shape":[2],"data_offsets":[1,3]},)"
                        R"("b":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                        R"("__metadata__":{"k":"v"},)"
                        R"("y":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                        R"("a":{"dtype":"F32","shape":[3,0],"data_offsets":[0,0]}})";
  const std::string bytes = image(h, 3);
  Header hd = parseFile(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "x");
  std::vector<std::string> names;
  for (const auto& t : hd.tensors) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"b", "a", "y", "z"}));
  EXPECT_EQ(hd.metadata, (std::map<std::string, std::string>{{"k", "v"}}));
}

TEST(SafetensorsTest, ReaderChecksFilesOnDisk) {
  const std::string dir = tempDir();
  writeFile(dir + "/short", le64(64) + "{}");
  EXPECT_THROW(Reader(dir + "/short"), Error);
  EXPECT_THROW(Reader(dir + "/missing"), Error);
  EXPECT_THROW(Reader{dir}, Error);  // a directory
  writeFile(dir + "/ok", image(R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})", 3));
  Reader r(dir + "/ok");
  uint8_t buf[8];
  EXPECT_THROW(r.readAt(r.fileSize() - 2, buf, 3), Error);
  EXPECT_THROW(r.readAt(~uint64_t(0), buf, 1), Error);
  EXPECT_NO_THROW(r.readAt(r.fileSize() - 3, buf, 3));
}

TEST(SafetensorsTest, WriterRejectsDuplicatesAndOutOfRangeWrites) {
  const std::string dir = tempDir();
  EXPECT_THROW(Writer(dir + "/d", {{"a", DType::F32, {1}}, {"a", DType::F32, {1}}}), Error);
  Writer w(dir + "/w", {{"a", DType::F32, {2}}});
  float f[3] = {};
  EXPECT_THROW(w.write(0, 4, f, 8), Error);
  EXPECT_THROW(w.write(1, 0, f, 4), Error);
}

}  // namespace
}  // namespace keel::st
