// A flashmask_attention op's mask as data: its recorded attributes (docs/flashmask.md) parsed into
// a MaskSummary with the (query tile × key tile) grid of tile classes. Plain functions, no Qt: the
// studio's mask picture paints the grid, `keel inspect` prints it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace keel::analysis {

// How the cpu kernel treats a (query tile, key tile) pair: skipped (fully masked, no work),
// partial (element mask applied) or full (unmasked, no mask work).
enum class TileClass : uint8_t { Skipped, Partial, Full };
inline constexpr int kTileClassCount = 3;

struct TileGrid {
  int rows = 0, cols = 0;
  std::vector<TileClass> cells;  // row-major: row = query tile, column = key tile
  TileClass at(int r, int c) const { return cells[size_t(r) * size_t(cols) + size_t(c)]; }
  int count(TileClass c) const;
};

// "psss/fpss/..." (rows joined by '/', 's' skipped, 'p' partial, 'f' full) to a grid; nullopt when
// empty, ragged or holding another character.
std::optional<TileGrid> parseTileMap(std::string_view text);
// The grid back as text: parseTileMap(tileMapText(g)) == g.
std::string tileMapText(const TileGrid& grid);

// What the recording says about a flashmask op's mask; read from its attributes JSON.
struct MaskSummary {
  std::string kind;           // "causal_document", ... ("custom" when not recorded)
  double blockSparsity = -1;  // fraction of skipped tiles over every batch and mask head; -1: none
  int tileRows = 0, tileCols = 0;  // elements per tile (0: not recorded)
  TileGrid grid;  // batch 0, mask head 0, as recorded (coarsened to at most 64 × 64 cells)
};
// nullopt when the attributes carry no (valid) tile map: not a flashmask op.
std::optional<MaskSummary> maskSummaryFromAttrs(const std::string& attrsJson);

const char* toString(TileClass c);  // "skipped", "partial", "full"

}  // namespace keel::analysis
