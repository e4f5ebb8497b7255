// MaskPicture: see mask_picture.h. Cells are square, at most kMaxCell pixels, separated by a
// one-pixel line when they are large enough to show it; keys run left to right, queries top to
// bottom (the layout of the mask pictures in docs/flashmask.md).
#include "keel/views/mask_picture.h"

#include <QPaintEvent>
#include <QPainter>
#include <algorithm>

namespace keel::views {

using analysis::TileClass;
using analysis::TileGrid;

namespace {
constexpr int kMaxCell = 96;  // a 1 × 1 grid stays a square, not the whole panel
constexpr int kMargin = 4;
constexpr int kMinLinedCell = 5;  // smaller cells are painted edge to edge
}  // namespace

QColor tileClassColor(TileClass c) {
  switch (c) {
    case TileClass::Skipped:
      return QColor(0xcf, 0xd3, 0xd9);  // grey: nothing computed
    case TileClass::Partial:
      return QColor(0xf2, 0xa6, 0x3b);  // amber: element mask applied
    case TileClass::Full:
      return QColor(0x2f, 0x6d, 0xb5);  // blue: computed without mask work
  }
  return {};
}

QString tileClassName(TileClass c) {
  switch (c) {
    case TileClass::Skipped:
      return QObject::tr("skipped");
    case TileClass::Partial:
      return QObject::tr("partial");
    case TileClass::Full:
      return QObject::tr("full");
  }
  return {};
}

MaskPicture::MaskPicture(QWidget* parent) : QWidget(parent) {
  setObjectName("maskPicture");
  setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Expanding);
}

void MaskPicture::setGrid(TileGrid grid) {
  grid_ = std::move(grid);
  updateGeometry();
  update();
}

MaskPicture::Layout MaskPicture::layout() const {
  Layout l;
  if (grid_.rows <= 0 || grid_.cols <= 0) return l;
  const int label = fontMetrics().height() + kMargin;  // axis labels: above and to the left
  const int w = width() - label - 2 * kMargin, h = height() - label - 2 * kMargin;
  l.cell = std::clamp(std::min(w / grid_.cols, h / grid_.rows), 1, kMaxCell);
  l.origin = QPoint(kMargin + label, kMargin + label);
  l.axisTop = kMargin;
  return l;
}

QRect MaskPicture::cellRect(int r, int c) const {
  const Layout l = layout();
  if (l.cell == 0) return {};
  return QRect(l.origin.x() + c * l.cell, l.origin.y() + r * l.cell, l.cell, l.cell);
}

QSize MaskPicture::sizeHint() const {
  return QSize(360, 360);
}

QSize MaskPicture::minimumSizeHint() const {
  const int label = fontMetrics().height() + kMargin;
  return QSize(label + 2 * kMargin + 64, label + 2 * kMargin + 64);
}

void MaskPicture::paintEvent(QPaintEvent*) {
  QPainter p(this);
  const Layout l = layout();
  if (l.cell == 0) return;
  const int gw = l.cell * grid_.cols, gh = l.cell * grid_.rows;
  const QRect gridRect(l.origin, QSize(gw, gh));
  const bool lined = l.cell >= kMinLinedCell;
  p.fillRect(gridRect, lined ? QColor(0xff, 0xff, 0xff) : tileClassColor(TileClass::Skipped));
  for (int r = 0; r < grid_.rows; ++r)
    for (int c = 0; c < grid_.cols; ++c) {
      QRect cell = cellRect(r, c);
      if (lined) cell.adjust(0, 0, -1, -1);
      p.fillRect(cell, tileClassColor(grid_.at(r, c)));
    }
  p.setPen(palette().color(QPalette::Mid));
  p.drawRect(gridRect.adjusted(-1, -1, 0, 0));

  // Axis labels: keys along the top, queries down the left side.
  p.setPen(palette().color(QPalette::WindowText));
  const QFontMetrics fm = fontMetrics();
  p.drawText(
      QRect(l.origin.x(), l.axisTop, std::max(gw, fm.horizontalAdvance(tr("keys →"))), fm.height()),
      Qt::AlignLeft | Qt::AlignVCenter, tr("keys →"));
  p.save();
  p.translate(l.axisTop, l.origin.y());
  p.rotate(90);
  p.drawText(
      QRect(0, -fm.height(), std::max(gh, fm.horizontalAdvance(tr("queries →"))), fm.height()),
      Qt::AlignLeft | Qt::AlignVCenter, tr("queries →"));
  p.restore();
}

}  // namespace keel::views
