// FlashMask tile maps as recorded (docs/flashmask.md): the map text to a grid and back, malformed
// maps rejected, and the mask summary read from an op's attributes, with its defaults. The studio's
// mask picture and `keel inspect` both read them through these functions.
#include <gtest/gtest.h>

#include <string>

#include "keel/analysis/tile_map.h"

namespace keel::analysis {
namespace {

TEST(TileMap, ParsesRowsOfTileClasses) {
  auto g = parseTileMap("psf/ssf");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->rows, 2);
  EXPECT_EQ(g->cols, 3);
  EXPECT_EQ(g->at(0, 0), TileClass::Partial);
  EXPECT_EQ(g->at(0, 2), TileClass::Full);
  EXPECT_EQ(g->at(1, 0), TileClass::Skipped);
  EXPECT_EQ(g->count(TileClass::Skipped), 3);
  EXPECT_EQ(g->count(TileClass::Partial), 1);
  EXPECT_EQ(g->count(TileClass::Full), 2);
  EXPECT_EQ(tileMapText(*g), "psf/ssf");
  auto one = parseTileMap("p");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->rows, 1);
  EXPECT_EQ(tileMapText(*one), "p");
  EXPECT_STREQ(toString(TileClass::Skipped), "skipped");
}

TEST(TileMap, RejectsMalformedMaps) {
  EXPECT_FALSE(parseTileMap(""));
  EXPECT_FALSE(parseTileMap("ps/s"));    // ragged
  EXPECT_FALSE(parseTileMap("ps/sss"));  // ragged the other way
  EXPECT_FALSE(parseTileMap("px/ss"));   // unknown class
  EXPECT_FALSE(parseTileMap("/"));
  EXPECT_FALSE(parseTileMap("ps/"));  // an empty last row
  EXPECT_FALSE(parseTileMap("/ps"));
}

TEST(TileMap, SummaryFromTheRecordedAttributes) {
  EXPECT_FALSE(maskSummaryFromAttrs(""));
  EXPECT_FALSE(maskSummaryFromAttrs("{\"dim\":-1}"));  // not a flashmask op
  EXPECT_FALSE(maskSummaryFromAttrs("not json"));
  EXPECT_FALSE(maskSummaryFromAttrs("{\"tile_map\":\"pq\"}"));  // invalid map
  EXPECT_FALSE(maskSummaryFromAttrs("{\"tile_map\":7}"));
  auto m = maskSummaryFromAttrs(
      "{\"causal\":true,\"mask\":\"causal\",\"block_sparsity\":0.375,\"tile_shape\":[64,32],"
      "\"tile_map\":\"ps/fp\"}");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->kind, "causal");
  EXPECT_EQ(m->blockSparsity, 0.375);
  EXPECT_EQ(m->tileRows, 64);
  EXPECT_EQ(m->tileCols, 32);
  EXPECT_EQ(tileMapText(m->grid), "ps/fp");
  // Only the map is required.
  auto bare = maskSummaryFromAttrs("{\"tile_map\":\"f\"}");
  ASSERT_TRUE(bare);
  EXPECT_EQ(bare->kind, "custom");
  EXPECT_EQ(bare->blockSparsity, -1);
  EXPECT_EQ(bare->tileRows, 0);
  EXPECT_EQ(bare->grid.count(TileClass::Full), 1);
  // Damaged attributes (a recording's text): nested past Note [Bounded JSON]'s 64 levels, no
  // summary; a tile side that is no int, no tile shape (1e300 was cast to int, undefined in C++).
  EXPECT_FALSE(maskSummaryFromAttrs("{\"tile_map\":\"f\",\"x\":" + std::string(65, '[') +
                                    std::string(65, ']') + "}"));
  auto huge = maskSummaryFromAttrs("{\"tile_map\":\"f\",\"tile_shape\":[1e300,-1]}");
  ASSERT_TRUE(huge);
  EXPECT_EQ(huge->tileRows, 0);
  EXPECT_EQ(huge->tileCols, 0);
}

}  // namespace
}  // namespace keel::analysis
