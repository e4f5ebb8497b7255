// The mask of a flashmask_attention op as a picture: MaskPicture paints the (query tile × key tile)
// grid that analysis/ parsed from the recorded attributes (keel/analysis/tile_map.h) with one
// colour per tile class. Pure data in, pixels out: the widget paints only what it is given.
#pragma once
#include <QColor>
#include <QString>
#include <QWidget>

#include "keel/analysis/tile_map.h"

namespace keel::views {

QColor tileClassColor(analysis::TileClass c);
QString tileClassName(analysis::TileClass c);  // "skipped", "partial", "full", translated

class MaskPicture : public QWidget {
  Q_OBJECT
 public:
  explicit MaskPicture(QWidget* parent = nullptr);
  void setGrid(analysis::TileGrid grid);
  const analysis::TileGrid& grid() const { return grid_; }
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
  analysis::TileGrid grid_;
};

}  // namespace keel::views
