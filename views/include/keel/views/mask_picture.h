// The mask of a flashmask_attention op as a picture: its recorded attributes ("mask",
// "block_sparsity", "tile_shape", "tile_map"; see docs/flashmask.md) parsed into a MaskSummary, and
// MaskPicture, which paints the (query tile × key tile) grid with one colour per tile class.
// Pure data in, pixels out: parsing is a plain function, the widget paints only what it is given.
#pragma once
#include <QColor>
#include <QString>
#include <QWidget>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace keel::views {

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
std::optional<TileGrid> parseTileMap(const QString& text);

// What the inspector shows for a flashmask op; read from its attributes JSON.
struct MaskSummary {
  QString kind;               // "causal_document", ...
  double blockSparsity = -1;  // fraction of skipped tiles over every batch and mask head; -1: none
  int tileRows = 0, tileCols = 0;  // elements per tile (0: not recorded)
  TileGrid grid;                   // batch 0, mask head 0 (coarsened to at most 64 × 64 cells)
};
// nullopt when the attributes carry no (valid) tile map: not a flashmask op.
std::optional<MaskSummary> maskSummaryFromAttrs(const std::string& attrsJson);

QColor tileClassColor(TileClass c);
QString tileClassName(TileClass c);  // "skipped", "partial", "full"

class MaskPicture : public QWidget {
  Q_OBJECT
 public:
  explicit MaskPicture(QWidget* parent = nullptr);
  void setGrid(TileGrid grid);
  const TileGrid& grid() const { return grid_; }
  // Where cell (r, c) is painted at the current size (empty when there is no grid).
  QRect cellRect(int r, int c) const;
  QSize sizeHint() const override;
  QSize minimumSizeHint() const override;

 protected:
  void paintEvent(QPaintEvent* e) override;

 private:
  struct Layout {
    int cell = 0;     // cell side in pixels
    QPoint origin;    // top-left of cell (0, 0)
    int axisTop = 0;  // baseline area of the key axis label
  };
  Layout layout() const;
  TileGrid grid_;
};

}  // namespace keel::views
