// MaskPicture and the tile-map parsing behind it: see mask_picture.h. Cells are square, at most
// kMaxCell pixels, separated by a one-pixel line when they are large enough to show it; keys run
// left to right, queries top to bottom (the layout of the mask pictures in docs/flashmask.md).
#include "keel/views/mask_picture.h"

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QPaintEvent>
#include <QPainter>
#include <algorithm>

namespace keel::views {
namespace {
constexpr int kMaxCell = 96;  // a 1 × 1 grid stays a square, not the whole panel
constexpr int kMargin = 4;
constexpr int kMinLinedCell = 5;  // smaller cells are painted edge to edge
}  // namespace

int TileGrid::count(TileClass c) const {
  return int(std::count(cells.begin(), cells.end(), c));
}

std::optional<TileGrid> parseTileMap(const QString& text) {
  if (text.isEmpty()) return std::nullopt;
  const QStringList rows = text.split('/');
  TileGrid g;
  g.rows = int(rows.size());
  g.cols = int(rows.front().size());
  if (g.cols == 0) return std::nullopt;
  g.cells.reserve(size_t(g.rows) * size_t(g.cols));
  for (const QString& row : rows) {
    if (row.size() != g.cols) return std::nullopt;
    for (QChar ch : row) {
      switch (ch.unicode()) {
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
  }
  return g;
}

std::optional<MaskSummary> maskSummaryFromAttrs(const std::string& attrsJson) {
  if (attrsJson.empty()) return std::nullopt;
  const QJsonDocument doc = QJsonDocument::fromJson(QByteArray::fromStdString(attrsJson));
  if (!doc.isObject()) return std::nullopt;
  const QJsonObject o = doc.object();
  auto grid = parseTileMap(o.value("tile_map").toString());
  if (!grid) return std::nullopt;
  MaskSummary s;
  s.grid = std::move(*grid);
  s.kind = o.value("mask").toString(QStringLiteral("custom"));
  s.blockSparsity = o.value("block_sparsity").toDouble(-1.0);
  const QJsonArray shape = o.value("tile_shape").toArray();
  if (shape.size() == 2) {
    s.tileRows = shape[0].toInt();
    s.tileCols = shape[1].toInt();
  }
  return s;
}

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
