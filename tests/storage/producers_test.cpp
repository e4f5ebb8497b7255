// The one producer definition (Note [Producer]): an input is fed by the latest earlier op output of
// the same (tensor id, version) among the ops given, in any order; never by its own op, a later
// op, or an output of another version.
#include <gtest/gtest.h>

#include <vector>

#include "keel/storage/producers.h"
#include "storage_test_util.h"

namespace keel::storage {
namespace {

constexpr auto& tensor = testing::tensorRef;

OpRecord op(uint64_t seq, std::vector<TensorRecord> tensors) {
  OpRecord o;
  o.seq = seq;
  o.tensors = std::move(tensors);
  return o;
}

const Role I = Role::Input, O = Role::Output;

TEST(Producers, LatestEarlierOutputOfTheSameValue) {
  const std::vector<OpRecord> ops = {
      op(10, {tensor(O, 0, 1, 0)}),                      // writes t1 v0
      op(20, {tensor(I, 0, 1, 0), tensor(O, 0, 1, 0)}),  // returns its input: outputs t1 v0 too
      op(30, {tensor(I, 0, 1, 0), tensor(O, 0, 1, 1)}),  // writes t1 in place: v1
      op(40, {tensor(I, 0, 1, 1), tensor(I, 1, 1, 0)}),
  };
  const ProducerIndex index{std::span<const OpRecord>(ops)};
  EXPECT_EQ(index.find(ops[1].tensors[0], 20), 0u);  // not itself
  EXPECT_EQ(index.find(ops[2].tensors[0], 30), 1u);  // the latest earlier output of t1 v0
  EXPECT_EQ(index.find(ops[3].tensors[0], 40), 2u);  // v1: the in-place writer
  EXPECT_EQ(index.find(ops[3].tensors[1], 40), 1u);  // v0, read after v1 was written
  EXPECT_EQ(index.find(1, 0, 10), std::nullopt);     // nothing before the first writer
  EXPECT_EQ(index.find(1, 0, 15), 0u);
  EXPECT_EQ(index.find(1, 2, 99), std::nullopt);  // a version no op wrote (a host write): a leaf
  EXPECT_EQ(index.find(7, 0, 99), std::nullopt);  // an id no op wrote
}

TEST(Producers, AnyOrderAndPointersGiveTheSameAnswer) {
  const std::vector<OpRecord> ops = {
      op(30, {tensor(O, 0, 5, 0)}),
      op(10, {tensor(O, 0, 5, 0)}),
      op(20, {tensor(O, 0, 5, 0)}),
  };
  const ProducerIndex index{std::span<const OpRecord>(ops)};
  EXPECT_EQ(index.find(5, 0, 25), 2u);  // seq 20, at position 2
  EXPECT_EQ(index.find(5, 0, 99), 0u);  // seq 30
  EXPECT_EQ(index.find(5, 0, 11), 1u);  // seq 10
  const std::vector<const OpRecord*> pointers = {&ops[1], &ops[2], &ops[0]};
  const ProducerIndex byPointer{std::span<const OpRecord* const>(pointers)};
  EXPECT_EQ(byPointer.find(5, 0, 25), 1u);
  EXPECT_EQ(byPointer.find(5, 0, 99), 2u);
}

}  // namespace
}  // namespace keel::storage
