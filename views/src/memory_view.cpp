// MemoryView and MemSectionModel: see memory_view.h. The timeline and the histogram are
// QCustomPlots held by Impl; the block map is a small painted widget (BlockMap) over a MemLayout.
// Every cursor move recomputes one MemState from the model's checkpoints (see Note [Memory
// replay]) and repaints; the timeline only replots its cursor layer.
#include "keel/views/memory_view.h"

#include <qcustomplot.h>

#include <QCheckBox>
#include <QComboBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QKeyEvent>
#include <QLabel>
#include <QMouseEvent>
#include <QPainter>
#include <QSlider>
#include <QSplitter>
#include <QStackedWidget>
#include <QTabWidget>
#include <QTableView>
#include <QToolTip>
#include <QVBoxLayout>
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <unordered_map>

#include "keel/views/selection.h"
#include "table_util.h"

namespace keel::views {

using analysis::formatBytes;
using analysis::layoutMemory;
using analysis::MemBlock;
using analysis::MemBucket;
using analysis::MemBuffer;
using analysis::MemLayout;
using analysis::MemOp;
using analysis::MemoryModel;
using analysis::MemPiece;
using analysis::MemScale;
using analysis::MemSection;
using analysis::MemSegment;
using analysis::MemState;
using analysis::MemTensor;

namespace {

QString qs(const std::string& s) {
  return QString::fromStdString(s);
}
QString bytesText(uint64_t b) {
  return qs(formatBytes(b));
}
QString hexAddr(uint64_t a) {
  return QStringLiteral("0x") + QString::number(a, 16);
}
// "512 B", "1 KiB", "64 MiB": the lower bound of a log2 size class.
QString pow2Text(int lg) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  const int u = std::clamp(lg / 10, 0, 4);
  return QStringLiteral("%1 %2").arg(1ULL << (lg - 10 * u)).arg(QLatin1String(units[u]));
}
bool isAllocatorFrame(const std::string& fn) {
  return fn.find("Allocator::") != std::string::npos || fn.rfind("keel::Buffer::", 0) == 0 ||
         fn.rfind("keel::alloc::", 0) == 0 || fn.rfind("keel::detail::", 0) == 0;
}
QString blocksText(uint64_t n) {
  return n == 1 ? QStringLiteral("1 block") : QStringLiteral("%1 blocks").arg(n);
}
QString shapeText(const std::vector<int64_t>& shape) {
  QStringList dims;
  for (int64_t s : shape) dims << QString::number(s);
  return "[" + dims.join(", ") + "]";
}

const QColor kAllocated(0x4c, 0x78, 0xa8);
const QColor kFree(0xe9, 0xec, 0xef);
const QColor kUnmapped(0xb0, 0xb0, 0xb0);
const QColor kParameter(0x1f, 0x5f, 0x3f);
const QColor kOptimizer(0x5b, 0x2c, 0x83);
const QColor kData(0xc4, 0x51, 0x00);
const QColor kOutsideOps(0x7f, 0x8c, 0x8d);
const QColor kHighlight(0xd6, 0x27, 0x28);
// Op colours (Tableau 20 without its greys), handed out to op names in order of first allocation.
const QRgb kOpPalette[] = {0x4e79a7, 0xf28e2b, 0x59a14f, 0xe15759, 0x76b7b2, 0xedc948,
                           0xb07aa1, 0xff9da7, 0x9c755f, 0xa0cbe8, 0xffbe7d, 0x8cd17d,
                           0xf1ce63, 0x86bcb6, 0xff9d9a, 0xfabfd2, 0xd4a6c8, 0xd7b5a6};

// Colour of a live block by owner: tagged blocks in fixed colours, others by their op's name.
QColor ownerColor(const MemoryModel& m, const MemBlock& b,
                  const std::unordered_map<std::string, QColor>& opColors) {
  const storage::MemRecord& a = m.allocOf(b);
  if (a.tag == "parameter") return kParameter;
  if (a.tag == "optimizer_state") return kOptimizer;
  if (a.tag == "data") return kData;
  const MemOp* o = a.opSeq ? m.op(a.opSeq) : nullptr;
  if (!o) return kOutsideOps;
  auto it = opColors.find(o->name);
  return it == opColors.end() ? kOutsideOps : it->second;
}

QString legendSwatch(const QColor& c, const QString& text, bool hatched = false) {
  return QStringLiteral("<span style='color:%1'>%2</span>&nbsp;%3")
      .arg(c.name(), hatched ? QStringLiteral("&#9636;") : QStringLiteral("&#9632;"), text);
}

// The painted block map: pieces laid end to end, wrapped into rows.
class BlockMap : public QWidget {
 public:
  explicit BlockMap(QWidget* parent) : QWidget(parent) {
    setObjectName("memoryBlockMap");
    setMouseTracking(true);
    setFocusPolicy(Qt::ClickFocus);
    setMinimumSize(160, 60);
    setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Expanding);
  }

  const MemLayout* layout = nullptr;
  std::function<QColor(const MemPiece&)> blockColor;
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
  Geo geo() const {
    Geo g;
    g.width = std::max(1, width() - 8);
    const double h = std::max(1, height() - 8);
    if (!layout || layout->total == 0) return g;
    const uint64_t maxRows = std::max<uint64_t>(1, uint64_t((h + g.gap) / (16 + g.gap)));
    g.perRow = std::max<uint64_t>(1, (layout->total + maxRows - 1) / maxRows);
    g.rows = (layout->total + g.perRow - 1) / g.perRow;
    g.rowH = std::min(44.0, (h - double(g.rows - 1) * g.gap) / double(g.rows));
    return g;
  }

  // The rectangles of a piece (one per row it spans).
  template <class F>
  void forEachRect(const Geo& g, const MemPiece& p, F&& f) const {
    const uint64_t s = p.offset, e = p.offset + p.length;
    for (uint64_t r = s / g.perRow; r <= (e - 1) / g.perRow && r < g.rows; ++r) {
      const uint64_t r0 = r * g.perRow;
      const uint64_t a = std::max(s, r0), b = std::min(e, r0 + g.perRow);
      const double x0 = g.left + double(a - r0) * g.width / double(g.perRow);
      const double x1 = g.left + double(b - r0) * g.width / double(g.perRow);
      f(QRectF(x0, g.top + double(r) * (g.rowH + g.gap), std::max(1.0, x1 - x0), g.rowH), a == s);
    }
  }

  int pieceAt(QPoint pos) const {
    if (!layout || layout->pieces.empty()) return -1;
    const Geo g = geo();
    const double y = pos.y() - g.top;
    if (y < 0) return -1;
    const uint64_t row = uint64_t(y / (g.rowH + g.gap));
    if (row >= g.rows || y - double(row) * (g.rowH + g.gap) > g.rowH) return -1;
    const double fx = (pos.x() - g.left) / g.width;
    if (fx < 0 || fx >= 1) return -1;
    const double unitsPerPx = double(g.perRow) / g.width;
    const uint64_t u = row * g.perRow + uint64_t(fx * double(g.perRow));
    const auto& ps = layout->pieces;
    auto it = std::upper_bound(ps.begin(), ps.end(), u,
                               [](uint64_t v, const MemPiece& p) { return v < p.offset; });
    if (it == ps.begin()) return -1;
    int exact = int(it - ps.begin()) - 1;
    if (u >= ps[size_t(exact)].offset + ps[size_t(exact)].length) exact = -1;
    if (exact >= 0 && ps[size_t(exact)].kind == MemPiece::Kind::Block) return exact;
    // Blocks narrower than a pixel: the nearest block within 3 px wins over free space.
    const double tol = 3 * unitsPerPx;
    int best = -1;
    double bestD = tol + 1;
    const uint64_t lo = u > uint64_t(tol) ? u - uint64_t(tol) : 0, hi = u + uint64_t(tol) + 1;
    auto first = std::upper_bound(ps.begin(), ps.end(), lo,
                                  [](uint64_t v, const MemPiece& p) { return v < p.offset; });
    if (first != ps.begin()) --first;
    for (auto p = first; p != ps.end() && p->offset <= hi; ++p) {
      if (p->kind != MemPiece::Kind::Block) continue;
      const double c = double(p->offset) + double(p->length) / 2;
      const double dist = std::abs(c - double(u));
      if (dist < bestD) bestD = dist, best = int(p - ps.begin());
    }
    return best >= 0 && bestD <= tol + double(ps[size_t(best)].length) / 2 ? best : exact;
  }

  int hover = -1;

 protected:
  void paintEvent(QPaintEvent*) override {
    QPainter p(this);
    p.fillRect(rect(), palette().base());
    if (!layout || layout->pieces.empty()) {
      p.setPen(palette().color(QPalette::PlaceholderText));
      p.drawText(rect(), Qt::AlignCenter | Qt::TextWordWrap, emptyText);
      return;
    }
    const Geo g = geo();
    const QBrush hatch(kUnmapped, Qt::BDiagPattern);
    std::vector<QRectF> marks;
    for (const MemPiece& piece : layout->pieces) {
      QColor fill;
      bool faded = false;
      switch (piece.kind) {
        case MemPiece::Kind::Block:
          fill = blockColor ? blockColor(piece) : kAllocated;
          faded = anyHighlight &&
                  !(size_t(piece.block) < highlighted.size() && highlighted[size_t(piece.block)]);
          if (faded)  // a paler shade, still darker than free space
            fill = QColor((fill.red() * 3 + 255 * 2) / 5, (fill.green() * 3 + 255 * 2) / 5,
                          (fill.blue() * 3 + 255 * 2) / 5);
          break;
        case MemPiece::Kind::Free:
          fill = kFree;
          break;
        case MemPiece::Kind::Unmapped:
          fill = Qt::white;
          break;
      }
      forEachRect(g, piece, [&](const QRectF& r, bool start) {
        p.fillRect(r, fill);
        if (piece.kind == MemPiece::Kind::Unmapped) p.fillRect(r, hatch);
        if (piece.kind == MemPiece::Kind::Block && r.width() >= 4) {
          p.setPen(QPen(fill.darker(140), 1));
          p.drawLine(r.topLeft(), r.bottomLeft());
        }
        if (start && piece.gapBefore) marks.push_back(r);
      });
    }
    // Elided address space / span boundaries: a dark bar at the start of the next span.
    p.setPen(Qt::NoPen);
    p.setBrush(QColor(0x33, 0x33, 0x33));
    for (const QRectF& r : marks)
      p.drawRect(QRectF(r.left() - 1, r.top() - 2, 2.5, r.height() + 4));
    // The highlighted op's blocks, then the hovered piece.
    p.setBrush(Qt::NoBrush);
    if (anyHighlight) {
      p.setPen(QPen(kHighlight, 2));
      for (const MemPiece& piece : layout->pieces)
        if (piece.kind == MemPiece::Kind::Block && size_t(piece.block) < highlighted.size() &&
            highlighted[size_t(piece.block)])
          forEachRect(g, piece, [&](const QRectF& r, bool) {
            const double w = std::max(3.0, r.width() + 2);
            p.drawRect(QRectF(r.center().x() - w / 2, r.top() - 1, w, r.height() + 2));
          });
    }
    if (hover >= 0 && size_t(hover) < layout->pieces.size()) {
      p.setPen(QPen(Qt::black, 1));
      forEachRect(g, layout->pieces[size_t(hover)],
                  [&](const QRectF& r, bool) { p.drawRect(r.adjusted(-0.5, -0.5, 0.5, 0.5)); });
    }
  }
  bool event(QEvent* e) override {
    if (e->type() == QEvent::ToolTip) {
      auto* he = static_cast<QHelpEvent*>(e);
      const int i = pieceAt(he->pos());
      const QString tip = i >= 0 && tipFor ? tipFor(i) : QString();
      if (tip.isEmpty())
        QToolTip::hideText();
      else
        QToolTip::showText(he->globalPos(), tip, this);
      return true;
    }
    return QWidget::event(e);
  }
  void mouseMoveEvent(QMouseEvent* e) override {
    const int i = pieceAt(e->position().toPoint());
    if (i != hover) {
      hover = i;
      update();
    }
  }
  void leaveEvent(QEvent*) override {
    hover = -1;
    update();
  }
  void mousePressEvent(QMouseEvent* e) override {
    if (e->button() != Qt::LeftButton) return QWidget::mousePressEvent(e);
    const int i = pieceAt(e->position().toPoint());
    if (i >= 0 && clicked) clicked(i);
  }
};

}  // namespace

// ---- MemSectionModel ----

MemSectionModel::MemSectionModel(QObject* parent) : QAbstractTableModel(parent) {}

void MemSectionModel::setMemory(MemoryPtr memory) {
  beginResetModel();
  memory_ = std::move(memory);
  endResetModel();
}

const MemSection* MemSectionModel::sectionAt(int row) const {
  if (!memory_ || row < 0 || size_t(row) >= memory_->sections().size()) return nullptr;
  return &memory_->sections()[size_t(row)];
}

int MemSectionModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() || !memory_ ? 0 : int(memory_->sections().size());
}

int MemSectionModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : ColumnCount;
}

QVariant MemSectionModel::data(const QModelIndex& index, int role) const {
  const MemSection* s = index.isValid() ? sectionAt(index.row()) : nullptr;
  if (!s) return {};
  const MemoryModel& m = *memory_;
  const int col = index.column();
  auto opName = [&](const MemBlock& b) -> QString {
    const storage::MemRecord& a = m.allocOf(b);
    if (const MemOp* o = a.opSeq ? m.op(a.opSeq) : nullptr) return qs(o->name);
    return a.opSeq ? QStringLiteral("op #%1").arg(a.opSeq) : QStringLiteral("outside ops");
  };
  switch (role) {
    case EndEventRole:
      return QVariant::fromValue<qint64>(s->endEvent ? qint64(*s->endEvent)
                                                     : qint64(m.eventCount()) - 1);
    case Qt::DisplayRole:
      switch (col) {
        case Name:
          return s->endEvent ? qs(s->name) : qs(s->name) + tr(" (not ended)");
        case Events:
          return s->endEvent ? QStringLiteral("%1–%2").arg(s->beginEvent).arg(*s->endEvent)
                             : QStringLiteral("%1–").arg(s->beginEvent);
        case Allocs:
          return QVariant::fromValue<quint64>(s->allocs);
        case Frees:
          return QVariant::fromValue<quint64>(s->frees);
        case Allocated:
          return bytesText(s->bytesAllocated);
        case Peak:
          return bytesText(s->peakBytes);
        case Alive:
          return blocksText(s->alive.size()) + ", " + bytesText(s->aliveBytes);
        case AliveOps: {
          std::map<QString, int> byOp;
          for (const MemBlock& b : s->alive) byOp[opName(b)]++;
          std::vector<std::pair<int, QString>> sorted;
          for (auto& [name, n] : byOp) sorted.emplace_back(-n, name);
          std::sort(sorted.begin(), sorted.end());
          QStringList parts;
          for (size_t i = 0; i < std::min<size_t>(sorted.size(), 4); ++i)
            parts << (sorted[i].first < -1
                          ? QStringLiteral("%1 ×%2").arg(sorted[i].second).arg(-sorted[i].first)
                          : sorted[i].second);
          if (sorted.size() > 4) parts << QStringLiteral("…");
          return parts.join(", ");
        }
      }
      return {};
    case Qt::ToolTipRole: {
      if (col != Alive && col != AliveOps && col != Name) return {};
      QString t = tr("<b>%1</b>: %2 allocations (%3), %4 frees (%5), peak %6; still alive at its "
                     "end: %7, %8")
                      .arg(qs(s->name).toHtmlEscaped())
                      .arg(s->allocs)
                      .arg(bytesText(s->bytesAllocated))
                      .arg(s->frees)
                      .arg(bytesText(s->bytesFreed))
                      .arg(bytesText(s->peakBytes))
                      .arg(blocksText(s->alive.size()))
                      .arg(bytesText(s->aliveBytes));
      const int64_t end = s->endEvent ? int64_t(*s->endEvent) : int64_t(m.eventCount()) - 1;
      for (size_t i = 0; i < std::min<size_t>(s->alive.size(), 12); ++i) {
        const MemBlock& b = s->alive[i];
        const storage::MemRecord& a = m.allocOf(b);
        t += QStringLiteral("<br>%1 at %2, %3%4 — %5")
                 .arg(bytesText(b.bytes), hexAddr(b.address),
                      a.opSeq ? QStringLiteral("op #%1 ").arg(a.opSeq) : QString(),
                      opName(b).toHtmlEscaped(), qs(m.whyAlive(b, end).text).toHtmlEscaped());
      }
      if (s->alive.size() > 12) t += tr("<br>… and %1 more").arg(s->alive.size() - 12);
      return t + tr("<br><i>Click to move the cursor to the section's end.</i>");
    }
    case Qt::TextAlignmentRole:
      if (col >= Allocs && col <= Peak) return QVariant(Qt::AlignRight | Qt::AlignVCenter);
      return {};
  }
  return {};
}

QVariant MemSectionModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
  switch (section) {
    case Name:
      return tr("Section");
    case Events:
      return tr("Events");
    case Allocs:
      return tr("Allocs");
    case Frees:
      return tr("Frees");
    case Allocated:
      return tr("Allocated");
    case Peak:
      return tr("Peak inside");
    case Alive:
      return tr("Alive at end");
    case AliveOps:
      return tr("Allocated by");
  }
  return {};
}

// ---- MemoryView ----

struct MemoryView::Impl {
  static QString tr(const char* s, const char* c = nullptr, int n = -1) {
    return MemoryView::tr(s, c, n);
  }
  MemoryView* q = nullptr;
  Selection* selection = nullptr;
  Side side = Side::A;
  MemoryPtr mem;
  int64_t cursor = -1;
  MemState state;
  MemLayout layout;
  std::vector<size_t> highlighted;
  uint64_t highlightOp = 0;    // op whose blocks are outlined (0: none)
  uint64_t ownSeq = 0;         // the op this view selected itself (no cursor jump on its echo)
  int64_t selectedAlloc = -1;  // alloc event of the block clicked last
  bool colorByOp = false;
  MemScale scale = MemScale::Linear;
  QString message;
  std::vector<MemBucket> buckets;
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
  BlockMap* map = nullptr;
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
};

MemoryView::MemoryView(Selection* selection, Side side, QWidget* parent)
    : QWidget(parent), d_(std::make_unique<Impl>()) {
  d_->q = this;
  d_->selection = selection;
  d_->side = side;
  setObjectName("memoryView");
  setFocusPolicy(Qt::StrongFocus);
  d_->build();
  if (selection) {
    connect(selection, &Selection::selected, this, [this](Side s, quint64 seq) {
      if (s != d_->side) return;
      const bool own = seq == d_->ownSeq;
      if (!own) d_->ownSeq = 0, d_->selectedAlloc = -1;
      d_->highlightOp = seq;
      if (!own && d_->mem && d_->mem->eventCount()) {
        if (auto r = d_->mem->opEvents(seq))
          d_->moveTo(int64_t(r->second));
        else if (int64_t k = d_->mem->lastEventBeforeOp(seq); k >= 0)
          d_->moveTo(k);
      }
      d_->refreshHighlight();
    });
    connect(selection, &Selection::cleared, this, [this] {
      d_->highlightOp = 0;
      d_->ownSeq = 0;
      d_->selectedAlloc = -1;
      d_->refreshHighlight();
    });
  }
  setMemory(nullptr);
}

MemoryView::~MemoryView() = default;

void MemoryView::Impl::build() {
  messageLabel = new QLabel(q);
  messageLabel->setObjectName("memoryMessage");
  messageLabel->setAlignment(Qt::AlignCenter);
  messageLabel->setWordWrap(true);
  messageLabel->setTextFormat(Qt::RichText);
  messageLabel->setMargin(24);

  auto* content = new QWidget(q);
  header = new QLabel(content);
  header->setObjectName("memoryHeader");
  header->setTextInteractionFlags(Qt::TextSelectableByMouse);
  colorBox = new QCheckBox(tr("Colour by op"), content);
  colorBox->setObjectName("memoryColorByOp");
  colorBox->setToolTip(
      tr("Colour live blocks by the op that allocated them (parameters, "
         "optimizer state and input batches in their own colours)"));
  colorBox->setFocusPolicy(Qt::NoFocus);
  scaleBox = new QComboBox(content);
  scaleBox->setObjectName("memoryScale");
  scaleBox->addItem(tr("Linear sizes"), int(MemScale::Linear));
  scaleBox->addItem(tr("Log sizes"), int(MemScale::Log));
  scaleBox->setToolTip(
      tr("Block map widths: proportional to bytes, or to log2(bytes) so small "
         "blocks stay visible"));
  scaleBox->setFocusPolicy(Qt::NoFocus);
  hostLabel = new QLabel(content);
  hostLabel->setObjectName("memoryHostNote");
  hostLabel->setWordWrap(true);
  hostLabel->setStyleSheet(
      "QLabel { background: #fff4d6; border: 1px solid #e0c070; padding: 3px 6px; }");
  hostLabel->hide();

  auto* top = new QHBoxLayout;
  top->setContentsMargins(4, 2, 4, 0);
  top->addWidget(header, 1);
  top->addWidget(colorBox);
  top->addWidget(scaleBox);

  // Timeline pane: plot, slider, cursor line.
  auto* timelinePane = new QWidget(content);
  buildTimeline();
  plot->setParent(timelinePane);
  slider = new QSlider(Qt::Horizontal, timelinePane);
  slider->setObjectName("memorySlider");
  slider->setFocusPolicy(Qt::NoFocus);
  slider->setToolTip(
      tr("Scrub through the allocator events (keys: ←/→ one event, PgUp/PgDn a "
         "twentieth, Home/End)"));
  cursorLabel = new QLabel(timelinePane);
  cursorLabel->setObjectName("memoryCursor");
  cursorLabel->setWordWrap(true);
  cursorLabel->setTextInteractionFlags(Qt::TextSelectableByMouse);
  // Fixed heights: a label that grows or shrinks with its text would resize the plots (a full
  // replot of every point) on each cursor move.
  cursorLabel->setFixedHeight(cursorLabel->fontMetrics().lineSpacing() * 2 + 4);
  cursorLabel->setAlignment(Qt::AlignLeft | Qt::AlignTop);
  auto* tl = new QVBoxLayout(timelinePane);
  tl->setContentsMargins(0, 0, 0, 0);
  tl->setSpacing(2);
  tl->addWidget(plot, 1);
  tl->addWidget(slider);
  tl->addWidget(cursorLabel);

  // Block map pane: caption, map, legend.
  auto* mapPane = new QWidget(content);
  caption = new QLabel(mapPane);
  caption->setObjectName("memoryMapCaption");
  caption->setWordWrap(true);
  caption->setFixedHeight(caption->fontMetrics().lineSpacing() * 2 + 4);
  caption->setAlignment(Qt::AlignLeft | Qt::AlignTop);
  map = new BlockMap(mapPane);
  map->emptyText = tr("No live blocks at this event");
  map->blockColor = [this](const MemPiece& p) {
    if (!colorByOp || !mem) return kAllocated;
    return ownerColor(*mem, state.blocks[size_t(p.block)], opColors);
  };
  map->tipFor = [this](int piece) { return pieceTip(piece); };
  map->clicked = [this](int piece) {
    const MemPiece& p = layout.pieces[size_t(piece)];
    if (p.kind != MemPiece::Kind::Block || !mem) return;
    const MemBlock& b = state.blocks[size_t(p.block)];
    const storage::MemRecord& a = mem->allocOf(b);
    selectedAlloc = b.allocEvent;
    highlightOp = a.opSeq;
    ownSeq = a.opSeq;
    if (a.opSeq && selection) selection->select(side, a.opSeq);
    refreshHighlight();
    const MemOp* o = a.opSeq ? mem->op(a.opSeq) : nullptr;
    emit q->blockClicked(quint64(a.opSeq), qint64(o ? o->step : a.step));
  };
  legend = new QLabel(mapPane);
  legend->setObjectName("memoryLegend");
  legend->setWordWrap(true);
  legend->setTextFormat(Qt::RichText);
  auto* ml = new QVBoxLayout(mapPane);
  ml->setContentsMargins(0, 0, 0, 0);
  ml->setSpacing(2);
  ml->addWidget(caption);
  ml->addWidget(map, 1);
  ml->addWidget(legend);

  // Histogram and sections.
  tabs = new QTabWidget(content);
  tabs->setObjectName("memoryTabs");
  buildHistogram();
  tabs->addTab(hist, tr("Sizes"));
  auto* secPane = new QWidget(tabs);
  sections = new MemSectionModel(secPane);
  sectionTable = makeRecordTable(secPane, "memorySections", sections);
  noSections = new QLabel(
      tr("No tracked sections. Wrap code in keel::MemoryTrackingScope, or turn on Run › Track "
         "memory per step in a live session."),
      secPane);
  noSections->setObjectName("memoryNoSections");
  noSections->setWordWrap(true);
  noSections->setAlignment(Qt::AlignCenter);
  auto* sl = new QVBoxLayout(secPane);
  sl->setContentsMargins(0, 0, 0, 0);
  sl->addWidget(noSections);
  sl->addWidget(sectionTable, 1);
  tabs->addTab(secPane, tr("Tracked sections"));
  QObject::connect(sectionTable, &QTableView::clicked, q, [this](const QModelIndex& i) {
    moveTo(sections->data(i, MemSectionModel::EndEventRole).toLongLong());
  });

  auto* lower = new QSplitter(Qt::Horizontal, content);
  lower->setObjectName("memoryLower");
  lower->addWidget(mapPane);
  lower->addWidget(tabs);
  lower->setStretchFactor(0, 3);
  lower->setStretchFactor(1, 2);
  lower->setChildrenCollapsible(false);
  main = new QSplitter(Qt::Vertical, content);
  main->setObjectName("memorySplitter");
  main->addWidget(timelinePane);
  main->addWidget(lower);
  main->setStretchFactor(0, 2);
  main->setStretchFactor(1, 3);
  main->setChildrenCollapsible(false);

  auto* cl = new QVBoxLayout(content);
  cl->setContentsMargins(0, 0, 0, 0);
  cl->setSpacing(3);
  cl->addLayout(top);
  cl->addWidget(hostLabel);
  cl->addWidget(main, 1);

  pages = new QStackedWidget(q);
  pages->addWidget(messageLabel);
  pages->addWidget(content);
  auto* outer = new QVBoxLayout(q);
  outer->setContentsMargins(0, 0, 0, 0);
  outer->addWidget(pages);

  QObject::connect(slider, &QSlider::valueChanged, q, [this](int v) { moveTo(v); });
  QObject::connect(colorBox, &QCheckBox::toggled, q, [this](bool on) { q->setColorByOp(on); });
  QObject::connect(scaleBox, &QComboBox::currentIndexChanged, q,
                   [this](int) { q->setScale(MemScale(scaleBox->currentData().toInt())); });
}

void MemoryView::Impl::buildTimeline() {
  plot = new QCustomPlot(q);
  plot->setObjectName("memoryTimeline");
  plot->setFocusPolicy(Qt::ClickFocus);
  plot->setMinimumHeight(110);
  plot->setInteractions(QCP::iRangeZoom);
  plot->axisRect()->setRangeZoom(Qt::Horizontal);
  plot->xAxis->setLabel(tr("allocator event #"));
  plot->yAxis->setLabel(tr("bytes"));
  plot->yAxis2->setVisible(true);
  plot->yAxis2->setLabel(tr("fragmentation %"));
  plot->yAxis2->setRange(0, 100);
  QFont small = q->font();
  small.setPointSizeF(small.pointSizeF() * 0.85);
  for (QCPAxis* ax : {plot->xAxis, plot->yAxis, plot->yAxis2}) {
    ax->setLabelFont(small);
    ax->setTickLabelFont(small);
  }
  plot->legend->setVisible(true);
  plot->legend->setFont(small);
  plot->legend->setBrush(QColor(255, 255, 255, 220));
  plot->axisRect()->insetLayout()->take(plot->legend);
  plot->plotLayout()->addElement(1, 0, plot->legend);
  plot->legend->setFillOrder(QCPLayoutGrid::foColumnsFirst);
  plot->legend->setBorderPen(Qt::NoPen);
  plot->legend->setMargins(QMargins(4, 0, 4, 0));
  plot->plotLayout()->setRowStretchFactor(1, 0.001);
  plot->addLayer("cursor", nullptr, QCustomPlot::limAbove);
  cursorLayer = plot->layer("cursor");
  cursorLayer->setMode(QCPLayer::lmBuffered);
  plot->setToolTip(QString());

  QObject::connect(plot, &QCustomPlot::mousePress, q, [this](QMouseEvent* e) {
    if (!mem || !mem->eventCount()) return;
    if (e->button() == Qt::LeftButton && plot->axisRect()->rect().contains(e->pos())) {
      dragging = true;
      moveTo(eventAtPixel(e->position().x()));
    } else if (e->button() == Qt::RightButton || e->button() == Qt::MiddleButton) {
      panning = true;
      panStartX = e->position().x();
      panRange = plot->xAxis->range();
    }
  });
  QObject::connect(plot, &QCustomPlot::mouseMove, q, [this](QMouseEvent* e) {
    if (!mem || !mem->eventCount()) return;
    if (dragging) {
      moveTo(eventAtPixel(e->position().x()));
    } else if (panning) {
      const double perPx = panRange.size() / std::max(1, plot->axisRect()->width());
      const double dx = (e->position().x() - panStartX) * perPx;
      plot->xAxis->setRange(panRange.lower - dx, panRange.upper - dx);
      clampRange();
      plot->replot(QCustomPlot::rpQueuedReplot);
    } else if (plot->axisRect()->rect().contains(e->pos())) {
      QToolTip::showText(e->globalPosition().toPoint(), eventText(eventAtPixel(e->position().x())),
                         plot);
    }
  });
  QObject::connect(plot, &QCustomPlot::mouseRelease, q, [this](QMouseEvent*) {
    dragging = false;
    panning = false;
  });
  QObject::connect(plot, &QCustomPlot::mouseDoubleClick, q, [this](QMouseEvent*) {
    if (!mem) return;
    plot->xAxis->setRange(-0.5, double(count()) - 0.5);
    plot->replot();
  });
  QObject::connect(plot, &QCustomPlot::mouseWheel, q, [this](QWheelEvent*) {
    QMetaObject::invokeMethod(
        q,
        [this] {
          clampRange();
          plot->replot(QCustomPlot::rpQueuedReplot);
        },
        Qt::QueuedConnection);
  });
}

void MemoryView::Impl::buildHistogram() {
  hist = new QCustomPlot(q);
  hist->setObjectName("memoryHistogram");
  hist->setMinimumSize(120, 90);
  QFont small = q->font();
  small.setPointSizeF(small.pointSizeF() * 0.85);
  hist->xAxis->setLabel(tr("live blocks by size (log2 classes)"));
  hist->yAxis->setLabel(tr("blocks"));
  for (QCPAxis* ax : {hist->xAxis, hist->yAxis}) {
    ax->setLabelFont(small);
    ax->setTickLabelFont(small);
  }
  hist->xAxis->setSubTicks(false);
  QSharedPointer<QCPAxisTickerFixed> counts(new QCPAxisTickerFixed);  // whole blocks
  counts->setTickStep(1.0);
  counts->setScaleStrategy(QCPAxisTickerFixed::ssMultiples);
  hist->yAxis->setTicker(counts);
  hist->yAxis->setSubTicks(false);
  hist->xAxis->grid()->setVisible(false);
  bars = new QCPBars(hist->xAxis, hist->yAxis);
  bars->setWidth(0.8);
  bars->setPen(QPen(kAllocated.darker(130)));
  bars->setBrush(kAllocated);
  QObject::connect(hist, &QCustomPlot::mouseMove, q, [this](QMouseEvent* e) {
    const int i = int(std::lround(hist->xAxis->pixelToCoord(e->position().x())));
    if (i < 0 || size_t(i) >= buckets.size() || !hist->axisRect()->rect().contains(e->pos())) {
      QToolTip::hideText();
      return;
    }
    const MemBucket& b = buckets[size_t(i)];
    QToolTip::showText(
        e->globalPosition().toPoint(),
        tr("[%1, %2): %3 live, %4")
            .arg(pow2Text(b.log2), pow2Text(b.log2 + 1), blocksText(b.count), bytesText(b.bytes)),
        hist);
  });
}

void MemoryView::Impl::showPages() {
  pages->setCurrentIndex(message.isEmpty() ? 1 : 0);
  messageLabel->setText(message);
}

void MemoryView::setMemory(MemoryPtr memory) {
  Impl& d = *d_;
  const MemoryPtr old = d.mem;
  const int64_t oldCount = d.count();
  const bool wasAtEnd = old && oldCount > 0 && d.cursor == oldCount - 1;
  d.mem = std::move(memory);
  d.sections->setMemory(d.mem);
  d.noSections->setVisible(!d.mem || d.mem->sections().empty());
  d.sectionTable->setVisible(d.mem && !d.mem->sections().empty());
  if (d.mem && !d.mem->sections().empty()) d.sectionTable->resizeColumnsToContents();
  d.tabs->setTabText(1, d.mem && !d.mem->sections().empty()
                            ? tr("Tracked sections (%1)").arg(d.mem->sections().size())
                            : tr("Tracked sections"));
  if (!d.mem) {
    d.message = tr("No recording open.");
  } else if (d.mem->eventCount() == 0) {
    d.message =
        tr("<p><b>This recording has no allocator events.</b></p><p>Record them with "
           "<tt>keel record --allocator</tt> (or tick <i>allocator events</i> in File › "
           "New session), and pick an allocator with segments, e.g. "
           "<tt>KEEL_ALLOCATOR=caching</tt> or <tt>KEEL_ALLOCATOR=vmm</tt>, to see "
           "segments, free space and fragmentation.</p>");
  } else {
    d.message.clear();
  }
  d.hostLabel->setVisible(d.mem && d.mem->eventCount() && !d.mem->hasSegments());
  d.hostLabel->setText(hostNote());
  d.rebuildTimeline();
  const int64_t oldCursor = d.cursor;
  int64_t k = -1;
  if (d.count() > 0) {
    if (old && oldCount > 0) {  // a refresh of the same run
      k = wasAtEnd ? d.count() - 1 : std::min(oldCursor, d.count() - 1);
    } else {  // a fresh recording opens at its peak of allocated memory
      k = 0;
      for (size_t i = 1; i < d.mem->eventCount(); ++i)
        if (d.mem->allocatedAfter(i) > d.mem->allocatedAfter(size_t(k))) k = int64_t(i);
    }
  }
  d.headerCache = d.computeHeader();
  d.opColors.clear();
  if (d.mem)
    for (const storage::MemRecord& e : d.mem->events()) {
      const MemOp* o = e.kind == "alloc" && e.opSeq ? d.mem->op(e.opSeq) : nullptr;
      if (o && !d.opColors.count(o->name))
        d.opColors.emplace(o->name, QColor(kOpPalette[d.opColors.size() % std::size(kOpPalette)]));
    }
  d.moveTo(k, true);
  d.updateLegend();
  d.showPages();
}

void MemoryView::showMessage(const QString& text) {
  d_->message = text;
  d_->showPages();
}

void MemoryView::Impl::rebuildTimeline() {
  plot->clearGraphs();
  plot->clearItems();
  cursorLine = nullptr;
  cursorTag = nullptr;
  const int64_t n = count();
  slider->blockSignals(true);
  slider->setRange(0, int(std::max<int64_t>(0, n - 1)));
  slider->setPageStep(int(page()));
  slider->setEnabled(n > 0);
  slider->blockSignals(false);
  if (n == 0) {
    plot->replot();
    return;
  }
  uint64_t maxBytes = std::max<uint64_t>({mem->peakReserved(), mem->peakAllocated(), 1});
  const char* unitName = "B";
  unit = 1;
  for (const char* u : {"KiB", "MiB", "GiB"}) {
    if (double(maxBytes) / unit < 4096) break;
    unit *= 1024;
    unitName = u;
  }
  plot->yAxis->setLabel(tr("bytes (%1)").arg(QLatin1String(unitName)));
  QVector<double> x(n), a(n), r(n), f(n);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = double(i);
    a[i] = double(mem->allocatedAfter(size_t(i))) / unit;
    r[i] = double(mem->reservedAfter(size_t(i))) / unit;
    f[i] = 100.0 * mem->fragmentationAfter(size_t(i));
  }
  QCPGraph* gr = plot->addGraph(plot->xAxis, plot->yAxis);
  gr->setName(tr("reserved"));
  gr->setPen(QPen(QColor(0xe0, 0x6c, 0x00), 1.5));
  gr->setLineStyle(QCPGraph::lsStepLeft);
  gr->setData(x, r, true);
  QCPGraph* ga = plot->addGraph(plot->xAxis, plot->yAxis);
  ga->setName(tr("allocated"));
  ga->setPen(QPen(kAllocated, 1.5));
  ga->setBrush(QColor(kAllocated.red(), kAllocated.green(), kAllocated.blue(), 50));
  ga->setLineStyle(QCPGraph::lsStepLeft);
  ga->setData(x, a, true);
  QCPGraph* gf = plot->addGraph(plot->xAxis, plot->yAxis2);
  gf->setName(tr("fragmentation %"));
  gf->setPen(QPen(QColor(0x70, 0x70, 0x70), 1, Qt::DotLine));
  gf->setLineStyle(QCPGraph::lsStepLeft);
  gf->setData(x, f, true);
  plot->xAxis->setRange(-0.5, double(n) - 0.5);
  plot->yAxis->setRange(0, double(maxBytes) / unit * 1.12);

  // Step boundaries: a dashed line before the first event of each step (labelled while few).
  const auto& starts = mem->stepStarts();
  const size_t stride = std::max<size_t>(1, starts.size() / 400);
  QFont small = q->font();
  small.setPointSizeF(small.pointSizeF() * 0.8);
  for (size_t s = 0; s < starts.size(); s += stride) {
    const double bx = double(starts[s].first) - 0.5;
    if (starts[s].first > 0) {
      auto* line = new QCPItemStraightLine(plot);
      line->setPen(QPen(QColor(0x90, 0x90, 0x90), 1, Qt::DashLine));
      line->point1->setCoords(bx, 0);
      line->point2->setCoords(bx, 1);
    }
    // Labels while few, and none crowding the next one (the later label wins).
    const bool crowded =
        s + stride < starts.size() && starts[s + stride].first - starts[s].first < size_t(n / 25);
    if (starts.size() <= 24 && !crowded) {
      auto* label = new QCPItemText(plot);
      label->setClipToAxisRect(true);
      label->position->setTypeX(QCPItemPosition::ptPlotCoords);
      label->position->setTypeY(QCPItemPosition::ptAxisRectRatio);
      label->position->setCoords(bx, 1.0);
      label->setPositionAlignment(Qt::AlignLeft | Qt::AlignBottom);
      label->setPadding(QMargins(3, 0, 3, 2));
      label->setFont(small);
      label->setColor(QColor(0x60, 0x60, 0x60));
      label->setText(starts[s].second == 0 ? tr("init") : tr("step %1").arg(starts[s].second));
    }
  }
  cursorLine = new QCPItemStraightLine(plot);
  cursorLine->setLayer(cursorLayer);
  cursorLine->setPen(QPen(kHighlight, 1.5));
  cursorLine->point1->setCoords(0, 0);
  cursorLine->point2->setCoords(0, 1);
  cursorTag = new QCPItemText(plot);
  cursorTag->setLayer(cursorLayer);
  cursorTag->setClipToAxisRect(true);
  cursorTag->position->setTypeX(QCPItemPosition::ptPlotCoords);
  cursorTag->position->setTypeY(QCPItemPosition::ptAxisRectRatio);
  cursorTag->setFont(small);
  cursorTag->setColor(kHighlight.darker(130));
  cursorTag->setBrush(QColor(255, 255, 255, 210));
  cursorTag->setPadding(QMargins(3, 1, 3, 1));
  plot->replot();
}

int64_t MemoryView::Impl::eventAtPixel(double px) const {
  const int64_t n = count();
  if (n == 0) return -1;
  return std::clamp<int64_t>(std::llround(plot->xAxis->pixelToCoord(px)), 0, n - 1);
}

void MemoryView::Impl::clampRange() {
  const double n = double(count());
  QCPRange r = plot->xAxis->range();
  const double lo = -0.5, hi = std::max(n - 0.5, 1.0);
  double size = std::clamp(r.size(), std::min(8.0, hi - lo), hi - lo);
  double lower = std::clamp(r.lower, lo, hi - size);
  if (lower != r.lower || size != r.size()) plot->xAxis->setRange(lower, lower + size);
}

void MemoryView::Impl::ensureVisible(int64_t k) {
  const QCPRange r = plot->xAxis->range();
  if (double(k) >= r.lower && double(k) <= r.upper) return;
  const double size = r.size();
  plot->xAxis->setRange(double(k) - size / 2, double(k) + size / 2);
  clampRange();
  plot->replot(QCustomPlot::rpQueuedReplot);
}

QString MemoryView::Impl::eventText(int64_t k) const {
  if (!mem || k < 0 || k >= count()) return {};
  const storage::MemRecord& e = mem->event(size_t(k));
  QString what = qs(e.kind);
  if (e.kind == "track_begin" || e.kind == "track_end")
    what += QStringLiteral(" '%1'").arg(qs(e.label));
  else if (e.kind == "move" || e.kind == "compact")
    what += QStringLiteral(" %1 %2 → %3")
                .arg(bytesText(e.bytes), hexAddr(e.address), hexAddr(e.toAddress));
  else
    what += QStringLiteral(" %1 at %2").arg(bytesText(e.bytes), hexAddr(e.address));
  QString op;
  if (const MemOp* o = e.opSeq ? mem->op(e.opSeq) : nullptr)
    op = tr("op #%1 %2 (%3%4)")
             .arg(o->seq)
             .arg(qs(o->name), qs(o->phase), o->scope.empty() ? QString() : ", " + qs(o->scope));
  else
    op = e.opSeq ? tr("op #%1").arg(e.opSeq) : tr("outside ops");
  return tr("Event %1 of %2: %3 · %4 · %5 · allocated %6, reserved %7, fragmentation %8%")
      .arg(k)
      .arg(count())
      .arg(what, op, e.step == 0 ? tr("initialisation") : tr("step %1").arg(e.step),
           bytesText(mem->allocatedAfter(size_t(k))), bytesText(mem->reservedAfter(size_t(k))))
      .arg(100.0 * mem->fragmentationAfter(size_t(k)), 0, 'f', 1);
}

void MemoryView::Impl::moveTo(int64_t k, bool force) {
  const int64_t n = count();
  k = n == 0 ? -1 : std::clamp<int64_t>(k, 0, n - 1);
  if (k == cursor && !force) return;
  cursor = k;
  state = mem ? mem->stateAt(k) : MemState{};
  layout = layoutMemory(state, scale);
  map->layout = &layout;
  map->hover = -1;
  slider->blockSignals(true);
  slider->setValue(int(std::max<int64_t>(0, k)));
  slider->blockSignals(false);
  if (cursorLine && k >= 0) {
    cursorLine->point1->setCoords(double(k), 0);
    cursorLine->point2->setCoords(double(k), 1);
    const storage::MemRecord& e = mem->event(size_t(k));
    QString tag = e.step == 0 ? tr("init") : tr("step %1").arg(e.step);
    if (const MemOp* o = e.opSeq ? mem->op(e.opSeq) : nullptr)
      tag += QStringLiteral(" · #%1 %2").arg(o->seq).arg(qs(o->name));
    cursorTag->setText(tag);
    const QCPRange r = plot->xAxis->range();
    const bool right = double(k) > r.lower + r.size() * 0.6;
    cursorTag->position->setCoords(double(k), 0.0);
    cursorTag->setPositionAlignment((right ? Qt::AlignRight : Qt::AlignLeft) | Qt::AlignTop);
    ensureVisible(k);
    cursorLayer->replot();
  }
  refreshHighlight();
  updateHistogram();
  updateTexts();
  emit q->cursorChanged(qint64(k));
}

void MemoryView::Impl::refreshHighlight() {
  highlighted.clear();
  if (mem && highlightOp) highlighted = mem->blocksOfOp(state, highlightOp);
  if (selectedAlloc >= 0)
    for (size_t i = 0; i < state.blocks.size(); ++i)
      if (int64_t(state.blocks[i].allocEvent) == selectedAlloc &&
          std::find(highlighted.begin(), highlighted.end(), i) == highlighted.end())
        highlighted.push_back(i);
  std::sort(highlighted.begin(), highlighted.end());
  map->highlighted.assign(state.blocks.size(), 0);
  for (size_t i : highlighted) map->highlighted[i] = 1;
  map->anyHighlight = !highlighted.empty();
  map->update();
}

void MemoryView::Impl::updateHistogram() {
  buckets = MemoryModel::histogram(state);
  QVector<double> keys, values;
  QVector<double> ticks;
  QVector<QString> labels;
  double maxCount = 1;
  for (size_t i = 0; i < buckets.size(); ++i) {
    keys << double(i);
    values << double(buckets[i].count);
    ticks << double(i);
    labels << pow2Text(buckets[i].log2);
    maxCount = std::max(maxCount, double(buckets[i].count));
  }
  bars->setData(keys, values, true);
  QSharedPointer<QCPAxisTickerText> ticker(new QCPAxisTickerText);
  // Label every bucket while they fit, else every other one.
  const int step = buckets.size() > 14 ? 2 : 1;
  QVector<double> shownTicks;
  QVector<QString> shownLabels;
  for (int i = 0; i < ticks.size(); i += step) {
    shownTicks << ticks[i];
    shownLabels << labels[i];
  }
  ticker->setTicks(shownTicks, shownLabels);
  hist->xAxis->setTicker(ticker);
  hist->xAxis->setTickLabelRotation(buckets.size() > 7 ? 45 : 0);
  hist->xAxis->setRange(-0.6, std::max<double>(double(buckets.size()) - 0.4, 0.6));
  hist->yAxis->setRange(0, maxCount * 1.15);
  hist->replot(QCustomPlot::rpQueuedReplot);
}

void MemoryView::Impl::updateTexts() {
  if (!mem || mem->eventCount() == 0) {
    header->clear();
    cursorLabel->clear();
    caption->clear();
    return;
  }
  header->setText(q->headerText());
  cursorLabel->setText(q->cursorText());
  caption->setText(q->mapCaption());
}

void MemoryView::Impl::updateLegend() {
  QStringList parts;
  if (colorByOp) {
    parts << legendSwatch(kParameter, tr("parameter"))
          << legendSwatch(kOptimizer, tr("optimizer state"))
          << legendSwatch(kData, tr("input batch")) << legendSwatch(kOutsideOps, tr("outside ops"))
          << tr("other blocks: one colour per op name");
  } else {
    parts << legendSwatch(kAllocated, tr("allocated"));
  }
  parts << legendSwatch(kFree.darker(115), tr("free"))
        << legendSwatch(kUnmapped, tr("unmapped"), true)
        << QStringLiteral("<span style='color:#333'>&#9613;</span>&nbsp;") +
               tr("gap elided / new segment run")
        << QStringLiteral("<span style='color:%1'>&#9633;</span>&nbsp;").arg(kHighlight.name()) +
               tr("selected op's blocks");
  // Items never break inside; the legend wraps between them.
  for (QString& p : parts) p = QStringLiteral("<span style='white-space:nowrap'>%1</span>").arg(p);
  legend->setText(parts.join(QStringLiteral(" &nbsp; ")));
}

QString MemoryView::Impl::pieceTip(int piece) const {
  if (!mem || piece < 0 || size_t(piece) >= layout.pieces.size()) return {};
  const MemPiece& p = layout.pieces[size_t(piece)];
  switch (p.kind) {
    case MemPiece::Kind::Free:
      return tr("<b>free</b> %1 at %2<br>inside a segment: reusable without asking the system")
          .arg(bytesText(p.bytes), hexAddr(p.address));
    case MemPiece::Kind::Unmapped:
      return tr("<b>unmapped</b> %1 at %2<br>address space the vmm allocator keeps; no physical "
                "memory behind it")
          .arg(bytesText(p.bytes), hexAddr(p.address));
    case MemPiece::Kind::Block:
      return q->blockToolTip(size_t(p.block));
  }
  return {};
}

void MemoryView::setColorByOp(bool on) {
  d_->colorByOp = on;
  if (d_->colorBox->isChecked() != on) d_->colorBox->setChecked(on);
  d_->updateLegend();
  d_->map->update();
}

bool MemoryView::colorByOp() const {
  return d_->colorByOp;
}

void MemoryView::setScale(MemScale scale) {
  d_->scale = scale;
  const int i = d_->scaleBox->findData(int(scale));
  if (i >= 0 && d_->scaleBox->currentIndex() != i) d_->scaleBox->setCurrentIndex(i);
  d_->layout = layoutMemory(d_->state, scale);
  d_->map->hover = -1;
  d_->map->update();
}

MemoryPtr MemoryView::memory() const {
  return d_->mem;
}
int64_t MemoryView::cursor() const {
  return d_->cursor;
}
void MemoryView::setCursor(int64_t event) {
  d_->moveTo(event);
}
int64_t MemoryView::eventCount() const {
  return d_->count();
}
const MemState& MemoryView::state() const {
  return d_->state;
}
const MemLayout& MemoryView::layout() const {
  return d_->layout;
}
const std::vector<size_t>& MemoryView::highlightedBlocks() const {
  return d_->highlighted;
}
QString MemoryView::message() const {
  return d_->message;
}
QWidget* MemoryView::blockMap() const {
  return d_->map;
}
QWidget* MemoryView::timeline() const {
  return d_->plot;
}
QPoint MemoryView::timelinePoint(int64_t k) const {
  const Impl& d = *d_;
  if (k < 0 || k >= d.count()) return {-1, -1};
  const QRect r = d.plot->axisRect()->rect();
  return {int(std::lround(d.plot->xAxis->coordToPixel(double(k)))), r.center().y()};
}

QPoint MemoryView::blockPoint(size_t index) const {
  const Impl& d = *d_;
  for (const MemPiece& p : d.layout.pieces) {
    if (p.kind != MemPiece::Kind::Block || p.block != int64_t(index)) continue;
    QPoint at(-1, -1);
    bool first = true;
    d.map->forEachRect(d.map->geo(), p, [&](const QRectF& r, bool) {
      if (first) at = r.center().toPoint();
      first = false;
    });
    return at;
  }
  return {-1, -1};
}

int MemoryView::histogramBuckets() const {
  return int(d_->buckets.size());
}
MemSectionModel* MemoryView::sectionModel() const {
  return d_->sections;
}

QString MemoryView::headerText() const {
  return d_->headerCache;
}

QString MemoryView::Impl::computeHeader() const {
  const MemoryModel* m = mem.get();
  if (!m || m->eventCount() == 0) return {};
  // Fragmentation at peak, as AllocatorStats::peakFragmentation defines it (docs/memory.md):
  // 1 - peak allocated / peak reserved, the figure `keel bench allocator` reports.
  const double frag = m->peakReserved() == 0
                          ? 0.0
                          : 100.0 * (1.0 - double(m->peakAllocated()) / double(m->peakReserved()));
  QString kind = qs(m->allocatorKind());
  return tr("<b>%1</b> allocator events · %2 allocator · peak allocated %3 · peak reserved %4 · "
            "fragmentation at peak %5%")
      .arg(m->eventCount())
      .arg(kind, bytesText(m->peakAllocated()), bytesText(m->peakReserved()))
      .arg(frag, 0, 'f', 1);
}

QString MemoryView::cursorText() const {
  return d_->eventText(d_->cursor);
}

QString MemoryView::mapCaption() const {
  const Impl& d = *d_;
  if (!d.mem || d.cursor < 0) return {};
  size_t mapped = 0, unmapped = 0;
  uint64_t mappedBytes = 0;
  for (const MemSegment& g : d.state.segments) {
    (g.mapped ? mapped : unmapped)++;
    if (g.mapped) mappedBytes += g.bytes;
  }
  QString s = tr("<b>Block map at event %1</b>: %2 live, %3")
                  .arg(d.cursor)
                  .arg(blocksText(d.state.blocks.size()), bytesText(d.state.liveBytes));
  const bool chunks = d.mem->allocatorKind() == "vmm";
  if (mapped || unmapped)
    s += chunks
             ? tr(" in %1 mapped chunks (%2), %3 unmapped")
                   .arg(mapped)
                   .arg(bytesText(mappedBytes))
                   .arg(unmapped)
             : (mapped == 1 ? tr(" in 1 segment (%1)").arg(bytesText(mappedBytes))
                            : tr(" in %1 segments (%2)").arg(mapped).arg(bytesText(mappedBytes)));
  if (d.layout.blocksOutside)
    s += tr("; %1 outside segments, laid out by address with gaps elided")
             .arg(blocksText(d.layout.blocksOutside));
  return s;
}

QString MemoryView::hostNote() const {
  const Impl& d = *d_;
  if (!d.mem || d.mem->eventCount() == 0 || d.mem->hasSegments()) return {};
  return tr(
      "Host allocator: it has no segments, so the block map lays live blocks out by "
      "address with the gaps between them elided, and reserved equals allocated. Record "
      "with KEEL_ALLOCATOR=caching or vmm to see segments, free space and fragmentation.");
}

QString MemoryView::blockToolTip(size_t index) const {
  const Impl& d = *d_;
  if (!d.mem || index >= d.state.blocks.size()) return {};
  const MemoryModel& m = *d.mem;
  const MemBlock& b = d.state.blocks[index];
  const storage::MemRecord& a = m.allocOf(b);
  QString t = tr("<b>%1</b> at %2").arg(bytesText(b.bytes), hexAddr(b.address));
  if (a.bufferId) t += tr(" · buffer %1").arg(a.bufferId);
  if (const MemBuffer* buf = m.buffer(a.bufferId); buf && buf->tensor) {
    const MemTensor& x = *buf->tensor;
    t += tr("<br><b>tensor</b>: %1 %2 — %3 %4 of op #%5")
             .arg(qs(x.dtype), shapeText(x.shape), x.output ? tr("output") : tr("input"))
             .arg(x.index)
             .arg(x.opSeq);
  }
  if (const MemOp* o = a.opSeq ? m.op(a.opSeq) : nullptr) {
    t += tr("<br><b>op</b>: %1 #%2 (%3)")
             .arg(qs(o->name).toHtmlEscaped())
             .arg(o->seq)
             .arg(qs(o->phase));
    if (!o->scope.empty()) t += tr(" · scope %1").arg(qs(o->scope).toHtmlEscaped());
    t += o->step == 0 ? tr(" · initialisation") : tr(" · step %1").arg(o->step);
  } else {
    t += a.opSeq ? tr("<br><b>op</b>: #%1 (not recorded)").arg(a.opSeq)
                 : tr("<br><b>op</b>: allocated outside ops (%1)")
                       .arg(a.step == 0 ? tr("initialisation") : tr("step %1").arg(a.step));
  }
  t += tr("<br><b>alive because</b>: %1").arg(qs(m.whyAlive(b, d.cursor).text).toHtmlEscaped());
  t += tr("<br>allocated at event %1").arg(b.allocEvent);
  if (const auto* frames = a.stackId >= 0 ? m.stack(a.stackId) : nullptr;
      frames && !frames->empty()) {
    t += tr("<br><b>stack</b>:");
    // The allocator's and Buffer's own frames say nothing about who asked: skip them.
    size_t first = 0;
    while (first + 1 < frames->size() && isAllocatorFrame((*frames)[first].function)) ++first;
    for (size_t i = first; i < std::min<size_t>(frames->size(), first + 6); ++i) {
      const storage::StackFrame& f = (*frames)[i];
      QString fn = f.function.empty() ? hexAddr(f.address) : qs(f.function);
      if (fn.size() > 90) fn = fn.left(87) + "…";
      t += "<br>&nbsp;&nbsp;" + fn.toHtmlEscaped();
      if (!f.file.empty())
        t += QStringLiteral(" <span style='color:#666'>(%1:%2)</span>")
                 .arg(qs(f.file).section('/', -2).toHtmlEscaped())
                 .arg(f.line);
    }
  }
  return t;
}

void MemoryView::keyPressEvent(QKeyEvent* e) {
  Impl& d = *d_;
  if (d.count() == 0) return QWidget::keyPressEvent(e);
  const int64_t c = std::max<int64_t>(d.cursor, 0);
  switch (e->key()) {
    case Qt::Key_Left:
      d.moveTo(c - 1);
      break;
    case Qt::Key_Right:
      d.moveTo(c + 1);
      break;
    case Qt::Key_PageUp:
      d.moveTo(c - d.page());
      break;
    case Qt::Key_PageDown:
      d.moveTo(c + d.page());
      break;
    case Qt::Key_Home:
      d.moveTo(0);
      break;
    case Qt::Key_End:
      d.moveTo(d.count() - 1);
      break;
    default:
      return QWidget::keyPressEvent(e);
  }
  e->accept();
}

void MemoryView::resizeEvent(QResizeEvent* e) {
  QWidget::resizeEvent(e);
  // Docked under the graph the view is wide and short: timeline beside the block map.
  const Qt::Orientation o = width() > 2 * height() ? Qt::Horizontal : Qt::Vertical;
  if (d_->main->orientation() != o) {
    d_->main->setOrientation(o);
    const int total = o == Qt::Horizontal ? width() : height();
    d_->main->setSizes({total * 2 / 5, total * 3 / 5});
  }
}

}  // namespace keel::views
