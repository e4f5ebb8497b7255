// Tile-map parsing and mask summaries: see tile_map.h. The attributes are the JSON object the
// engine recorded for the op (docs/flashmask.md, "What a recording shows").
#include "keel/analysis/tile_map.h"

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "keel/base/text.h"

namespace keel::analysis {

int TileGrid::count(TileClass c) const {
  return int(std::count(cells.begin(), cells.end(), c));
}

std::optional<TileGrid> parseTileMap(std::string_view text) {
  if (text.empty()) return std::nullopt;
  TileGrid g;
  g.cols = int(std::min(text.find('/'), text.size()));
  if (g.cols == 0) return std::nullopt;
  for (size_t begin = 0;;) {
    const size_t end = std::min(text.find('/', begin), text.size());
    if (int(end - begin) != g.cols) return std::nullopt;
    for (char ch : text.substr(begin, end - begin)) {
      switch (ch) {
        case 's':
          g.cells.push_back(TileClass::Skipped);
          break;
        case 'p':
          g.cells.push_back(TileClass::Partial);
          break;
        case 'f':
          g.cells.push_back(TileClass::Full);
          break;
        default:
          return std::nullopt;
      }
    }
    ++g.rows;
    if (end == text.size()) break;
    begin = end + 1;
  }
  return g;
}

std::string tileMapText(const TileGrid& grid) {
  std::string r;
  r.reserve(size_t(grid.rows) * size_t(grid.cols + 1));
  for (int row = 0; row < grid.rows; ++row) {
    if (row) r += '/';
    for (int c = 0; c < grid.cols; ++c) r += "spf"[int(grid.at(row, c))];
  }
  return r;
}

std::optional<MaskSummary> maskSummaryFromAttrs(const std::string& attrsJson) {
  // Recorded text, possibly damaged: depth-checked first (Note [Bounded JSON]).
  if (attrsJson.empty() || jsonNestingDepth(attrsJson) > kMaxJsonDepth) return std::nullopt;
  const auto o = nlohmann::json::parse(attrsJson, nullptr, false);
  if (!o.is_object()) return std::nullopt;
  const auto map = o.find("tile_map");
  if (map == o.end() || !map->is_string()) return std::nullopt;
  auto grid = parseTileMap(map->get_ref<const std::string&>());
  if (!grid) return std::nullopt;
  MaskSummary s;
  s.grid = std::move(*grid);
  const auto kind = o.find("mask");
  s.kind = kind != o.end() && kind->is_string() ? kind->get<std::string>() : "custom";
  const auto sparsity = o.find("block_sparsity");
  if (sparsity != o.end() && sparsity->is_number()) s.blockSparsity = sparsity->get<double>();
  const auto shape = o.find("tile_shape");
  // Whole numbers in int's range only: get<int>() of 1e300 is a cast C++ leaves undefined.
  const auto tileSide = [](const nlohmann::json& v) {
    return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX;
  };
  if (shape != o.end() && shape->is_array() && shape->size() == 2 && tileSide((*shape)[0]) &&
      tileSide((*shape)[1])) {
    s.tileRows = (*shape)[0].get<int>();
    s.tileCols = (*shape)[1].get<int>();
  }
  return s;
}

const char* toString(TileClass c) {
  switch (c) {
    case TileClass::Skipped:
      return "skipped";
    case TileClass::Partial:
      return "partial";
    case TileClass::Full:
      return "full";
  }
  return "";
}

}  // namespace keel::analysis
