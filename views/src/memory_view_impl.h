// The memory view's private pieces, shared by memory_view*.cpp: text and colour helpers, the
// painted block map (BlockMap) and active-memory timeline (ActiveMemory) widgets and
// MemoryView::Impl, which holds the widgets, the cursor's MemState and MemLayout, and the
// highlight. Nothing outside views/src includes this.
#pragma once
#include <qcustomplot.h>

#include <QColor>
#include <QHelpEvent>
#include <QImage>
#include <QLabel>
#include <QString>
#include <QStringList>
#include <QTableWidget>
#include <QToolTip>
#include <QWidget>
#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "keel/views/memory_view.h"
#include "text_util.h"

class QCheckBox;
class QComboBox;
class QSlider;
class QSplitter;
class QStackedWidget;
class QTableView;
class QTabWidget;

namespace keel::views {

namespace memory_detail {

using views::bytesText;
using views::qs;
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
// A painted widget's tooltip: `tip` where the help event `he` asks over `w`, or none when empty.
inline void showTip(const QHelpEvent* he, const QString& tip, QWidget* w) {
  if (tip.isEmpty())
    QToolTip::hideText();
  else
    QToolTip::showText(he->globalPos(), tip, w);
}

inline const QColor kAllocated(0x4c, 0x78, 0xa8);
inline const QColor kReserved(0xe0, 0x6c, 0x00);  // the timeline's reserved line
// Free space (reusable, pale green) and unmapped chunks (no memory behind them, dark grey,
// hatched) must never be confused: they mean opposite things.
inline const QColor kFree(0xcd, 0xe8, 0xc6);
inline const QColor kUnmapped(0x6e, 0x6e, 0x6e);
inline const QColor kParameter(0x1f, 0x5f, 0x3f);
inline const QColor kOptimizer(0x5b, 0x2c, 0x83);
inline const QColor kData(0xc4, 0x51, 0x00);
inline const QColor kOutsideOps(0x7f, 0x8c, 0x8d);
// Op colours (Tableau 20 without its greys), handed out to op names in order of first allocation
// (and to the stacks of blocks outside ops: ownerColor).
inline constexpr QRgb kOpPalette[] = {0x4e79a7, 0xf28e2b, 0x59a14f, 0xe15759, 0x76b7b2, 0xedc948,
                                      0xb07aa1, 0xff9da7, 0x9c755f, 0xa0cbe8, 0xffbe7d, 0x8cd17d,
                                      0xf1ce63, 0x86bcb6, 0xff9d9a, 0xfabfd2, 0xd4a6c8, 0xd7b5a6};
inline const QColor kHighlight(0xd6, 0x27, 0x28);
inline const QColor kOom(0x8b, 0x00, 0x00);  // a request the allocator refused: the run failed

// Colour of a live block by owner: tagged blocks in fixed colours, others by their op's name.
QColor ownerColor(const analysis::MemoryModel& m, const analysis::MemBlock& b,
                  const std::unordered_map<std::string, QColor>& opColors);

// The rich-text tooltip of a live block (or of an allocation's band, with its alloc address):
// size, tensor, op, why it is alive at `cursor`, the first frames of its allocation's stack.
QString allocationTip(const analysis::MemoryModel& m, const analysis::MemBlock& b, int64_t cursor);

// The active-memory timeline (Note [Active memory bands] in analysis/src/memory_model.cpp): every
// live allocation a band, stacked in allocation order over the events of the range shown (the
// timeline plot's x range, so both share one x axis), drawn one pixel column at a time into an
// image that is rebuilt only when the range or size changes; cursor moves repaint only the line.
class ActiveMemory : public QWidget {
 public:
  explicit ActiveMemory(QWidget* parent);

  const analysis::MemoryModel* model = nullptr;
  double lower = -0.5, upper = 0.5;  // the x range in event coordinates (as the plot's)
  int axisLeft = 0, axisRight = 0;   // pixels left and right of the band area (the plot's margins)
  int64_t cursor = -1;
  std::vector<std::pair<size_t, int64_t>> steps;  // first event of each step
  std::function<QColor(uint32_t allocEvent)> color;
  std::function<QString(const analysis::MemBandSlice&, int64_t event)> tipFor;
  std::function<void(int64_t event)> clicked;
  std::function<void(int64_t first, int64_t last)> rangeSelected;  // Shift+drag
  std::function<void()> resetRange;                                // double click

  analysis::MemBands bands;  // what is drawn
  double yMax = 1;           // bytes at the top of the band area
  QRect area() const;        // the band area in widget coordinates
  double xOf(double event) const;
  int64_t eventAt(double x) const;
  // The band under `pos` and the column's event; nullptr over nothing.
  std::pair<const analysis::MemBandSlice*, int64_t> bandAt(QPoint pos) const;
  void invalidate();   // the range, size or colours changed: rebuild the image at the next paint
  void rebuild();      // rebuild now (the benchmark and tests call it)
  int selecting = -1;  // Shift+drag start (pixels), -1 when not selecting
  int selectX = -1;

 protected:
  void paintEvent(QPaintEvent*) override;
  bool event(QEvent* e) override;
  void resizeEvent(QResizeEvent*) override;
  void mousePressEvent(QMouseEvent* e) override;
  void mouseMoveEvent(QMouseEvent* e) override;
  void mouseReleaseEvent(QMouseEvent* e) override;
  void mouseDoubleClickEvent(QMouseEvent* e) override;

 private:
  QImage image_;
  bool dirty_ = true;
};

// A word-wrapped caption as tall as its text needs at its width, at least `minLines` lines: a
// longer text grows it, a narrower width refits it to the text shown; a shorter text leaves it as
// it is (a label that followed every text would resize the plots beside it on each cursor move).
class WrappedLabel : public QLabel {
 public:
  WrappedLabel(int minLines, QWidget* parent);
  void setWrappedText(const QString& text);

 protected:
  void resizeEvent(QResizeEvent* e) override;

 private:
  void fit(bool mayShrink);
  int minLines_;
};

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
  double unit = 1;    // bytes per timeline y unit
  QString unitName;   // its name; empty before a recording
  bool roomy = true;  // tall enough for the legend, the bands' caption and full axis labels
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
  QCPGraph* allocatedFill = nullptr;     // the allocated area (fitAllocatedFill)
  std::vector<QCPItemText*> stepLabels;  // one per step start; shown where they do not overlap
  memory_detail::ActiveMemory* active = nullptr;
  QLabel* activeCaption = nullptr;
  analysis::MemFigures figures, peakFigures;  // at the cursor, at the peak of allocated
  std::optional<int64_t> pendingStep;         // showStep() before the model came
  int64_t stepEcho = -2;  // the step of the block this view clicked (its showStep echo is ignored)
  QSlider* slider = nullptr;
  memory_detail::WrappedLabel* cursorLabel = nullptr;
  memory_detail::BlockMap* map = nullptr;
  memory_detail::WrappedLabel* caption = nullptr;
  QLabel* legend = nullptr;
  QTabWidget* tabs = nullptr;
  QCustomPlot* hist = nullptr;
  QCPBars* bars = nullptr;
  QTableWidget* sites = nullptr;  // "Live by site": the blocks at the cursor by allocation site
  int64_t sitesAt = -2;           // the cursor the table was filled at
  void updateSites();             // fills it for the cursor, when its tab is the one shown
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
  // Axis labels and tick counts for the height: short ones ("MiB", "free %", 2 ticks) in a short
  // dock, where the full ones ran past the plot's ends and the ticks overlapped.
  void labelAxes();
  void buildHistogram();
  void rebuildTimeline();
  void moveTo(int64_t k, bool force = false);
  void placeCursorLine(int64_t k);  // the timeline's cursor line and tag at event k
  void placeStepLabels();           // shows the step labels that fit, hides the rest
  void buildActive();
  void syncActive();  // the active-memory timeline follows the plot's x range
  QString activeTip(const analysis::MemBandSlice& slice, int64_t event) const;
  int64_t peakOfStep(int64_t step) const;  // the event of most allocated in step (-1: none)
  void refreshHighlight();
  void updateHistogram();
  void updateTexts();
  void updateLegend();
  int64_t eventAtPixel(double x) const;
  QString eventText(int64_t k) const;
  QString pieceTip(int piece) const;
  void clampRange();
  void fitAllocatedFill();  // the allocated area's data for the x range and the plot's width
  void ensureVisible(int64_t k);
  void showPages();
  QString computeHeader() const;
  QFont smallFont(double factor) const;  // the view's font scaled, for plot labels
};

}  // namespace keel::views
