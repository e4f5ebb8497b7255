// The memory view's private pieces, shared by memory_view*.cpp: text and colour helpers, the
// painted block map widget (BlockMap) and MemoryView::Impl, which holds the widgets, the cursor's
// MemState and MemLayout, and the highlight. Nothing outside views/src includes this.
#pragma once
#include <qcustomplot.h>

#include <QColor>
#include <QString>
#include <QStringList>
#include <QWidget>
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "keel/views/memory_view.h"
#include "text_util.h"

class QCheckBox;
class QComboBox;
class QLabel;
class QSlider;
class QSplitter;
class QStackedWidget;
class QTableView;
class QTabWidget;

namespace keel::views {

namespace memory_detail {

using views::qs;
inline QString bytesText(uint64_t b) {
  return qs(keel::formatBytes(b));
}
inline QString hexAddr(uint64_t a) {
  return QStringLiteral("0x") + QString::number(a, 16);
}
// "512 B", "1 KiB", "64 MiB": the lower bound of a log2 size class.
inline QString pow2Text(int lg) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  const int u = std::clamp(lg / 10, 0, 4);
  return QStringLiteral("%1 %2").arg(1ULL << (lg - 10 * u)).arg(QLatin1String(units[u]));
}
inline QString blocksText(uint64_t n) {
  return n == 1 ? QStringLiteral("1 block") : QStringLiteral("%1 blocks").arg(n);
}

inline const QColor kAllocated(0x4c, 0x78, 0xa8);
inline const QColor kFree(0xe9, 0xec, 0xef);
inline const QColor kUnmapped(0xb0, 0xb0, 0xb0);
inline const QColor kParameter(0x1f, 0x5f, 0x3f);
inline const QColor kOptimizer(0x5b, 0x2c, 0x83);
inline const QColor kData(0xc4, 0x51, 0x00);
inline const QColor kOutsideOps(0x7f, 0x8c, 0x8d);
inline const QColor kHighlight(0xd6, 0x27, 0x28);

// Colour of a live block by owner: tagged blocks in fixed colours, others by their op's name.
QColor ownerColor(const analysis::MemoryModel& m, const analysis::MemBlock& b,
                  const std::unordered_map<std::string, QColor>& opColors);

// The painted block map: pieces laid end to end, wrapped into rows.
class BlockMap : public QWidget {
 public:
  explicit BlockMap(QWidget* parent);

  const analysis::MemLayout* layout = nullptr;
  std::function<QColor(const analysis::MemPiece&)> blockColor;
  std::function<QString(int piece)> tipFor;
  std::function<void(int piece)> clicked;
  std::vector<char> highlighted;  // by block index
  bool anyHighlight = false;
  QString emptyText;

  // Row geometry for the current size and layout.
  struct Geo {
    double left = 4, top = 4, width = 0, rowH = 0, gap = 3;
    uint64_t perRow = 1;
    uint64_t rows = 0;
  };
  Geo geo() const;

  // The rectangles of a piece (one per row it spans).
  template <class F>
  void forEachRect(const Geo& g, const analysis::MemPiece& p, F&& f) const {
    const uint64_t s = p.offset, e = p.offset + p.length;
    for (uint64_t r = s / g.perRow; r <= (e - 1) / g.perRow && r < g.rows; ++r) {
      const uint64_t r0 = r * g.perRow;
      const uint64_t a = std::max(s, r0), b = std::min(e, r0 + g.perRow);
      const double x0 = g.left + double(a - r0) * g.width / double(g.perRow);
      const double x1 = g.left + double(b - r0) * g.width / double(g.perRow);
      f(QRectF(x0, g.top + double(r) * (g.rowH + g.gap), std::max(1.0, x1 - x0), g.rowH), a == s);
    }
  }

  int pieceAt(QPoint pos) const;

  int hover = -1;

 protected:
  void paintEvent(QPaintEvent*) override;
  bool event(QEvent* e) override;
  void mouseMoveEvent(QMouseEvent* e) override;
  void leaveEvent(QEvent*) override;
  void mousePressEvent(QMouseEvent* e) override;
};

}  // namespace memory_detail

struct MemoryView::Impl {
  static QString tr(const char* s, const char* c = nullptr, int n = -1) {
    return MemoryView::tr(s, c, n);
  }
  MemoryView* q = nullptr;
  Selection* selection = nullptr;
  Side side = Side::A;
  MemoryPtr mem;
  int64_t cursor = -1;
  analysis::MemState state;
  analysis::MemLayout layout;
  std::vector<size_t> highlighted;
  uint64_t highlightOp = 0;    // op whose blocks are outlined (0: none)
  uint64_t ownSeq = 0;         // the op this view selected itself (no cursor jump on its echo)
  int64_t selectedAlloc = -1;  // alloc event of the block clicked last
  bool colorByOp = false;
  analysis::MemScale scale = analysis::MemScale::Linear;
  QString message;
  std::vector<analysis::MemBucket> buckets;
  double unit = 1;  // bytes per timeline y unit
  QString headerCache;
  std::unordered_map<std::string, QColor> opColors;  // op name -> colour (Colour by op)

  QStackedWidget* pages = nullptr;
  QLabel* messageLabel = nullptr;
  QLabel* header = nullptr;
  QLabel* hostLabel = nullptr;
  QCheckBox* colorBox = nullptr;
  QComboBox* scaleBox = nullptr;
  QSplitter* main = nullptr;
  QCustomPlot* plot = nullptr;
  QCPLayer* cursorLayer = nullptr;
  QCPItemStraightLine* cursorLine = nullptr;
  QCPItemText* cursorTag = nullptr;
  QSlider* slider = nullptr;
  QLabel* cursorLabel = nullptr;
  memory_detail::BlockMap* map = nullptr;
  QLabel* caption = nullptr;
  QLabel* legend = nullptr;
  QTabWidget* tabs = nullptr;
  QCustomPlot* hist = nullptr;
  QCPBars* bars = nullptr;
  MemSectionModel* sections = nullptr;
  QTableView* sectionTable = nullptr;
  QLabel* noSections = nullptr;
  bool dragging = false, panning = false;
  double panStartX = 0;
  QCPRange panRange;

  int64_t count() const { return mem ? int64_t(mem->eventCount()) : 0; }
  int64_t page() const { return std::max<int64_t>(1, count() / 20); }

  void build();
  void buildTimeline();
  void buildHistogram();
  void rebuildTimeline();
  void moveTo(int64_t k, bool force = false);
  void placeCursorLine(int64_t k);  // the timeline's cursor line and tag at event k
  void refreshHighlight();
  void updateHistogram();
  void updateTexts();
  void updateLegend();
  int64_t eventAtPixel(double x) const;
  QString eventText(int64_t k) const;
  QString pieceTip(int piece) const;
  void clampRange();
  void ensureVisible(int64_t k);
  void showPages();
  QString computeHeader() const;
  QFont smallFont(double factor) const;  // the view's font scaled, for plot labels
};

}  // namespace keel::views
