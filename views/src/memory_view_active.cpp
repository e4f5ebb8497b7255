// The memory view's active-memory timeline (ActiveMemory): every live allocation a band stacked
// over the events of the timeline plot's x range (analysis::MemoryModel::bands, one column per
// pixel, sub-pixel blocks merged), coloured by op or tag; hover names the allocation, its op and
// stack; Shift+drag selects a range of events (only that range is replayed), a double click shows
// everything, a click moves the cursor.
#include <QFontMetrics>
#include <QHelpEvent>
#include <QLabel>
#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>
#include <cmath>

#include "memory_view_impl.h"

namespace keel::views {

using namespace memory_detail;
using analysis::kMergedBands;
using analysis::MemBandColumn;
using analysis::MemBandSlice;
using analysis::MemBlock;
using analysis::MemoryModel;

namespace memory_detail {

ActiveMemory::ActiveMemory(QWidget* parent) : QWidget(parent) {
  setObjectName("memoryActive");
  setMouseTracking(true);
  setMinimumHeight(50);
  setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Expanding);
}

QRect ActiveMemory::area() const {
  return QRect(axisLeft, 4, std::max(1, width() - axisLeft - axisRight), std::max(1, height() - 8));
}

double ActiveMemory::xOf(double event) const {
  const QRect a = area();
  return a.left() + (event - lower) / std::max(upper - lower, 1e-9) * a.width();
}

int64_t ActiveMemory::eventAt(double x) const {
  const QRect a = area();
  const double e = lower + (x - a.left()) / std::max(1, a.width()) * (upper - lower);
  const int64_t n = model ? int64_t(model->eventCount()) : 0;
  return n ? std::clamp<int64_t>(std::llround(e), 0, n - 1) : -1;
}

void ActiveMemory::invalidate() {
  dirty_ = true;
  update();
}

void ActiveMemory::resizeEvent(QResizeEvent*) {
  invalidate();
}

void ActiveMemory::rebuild() {
  dirty_ = false;
  const QRect a = area();
  image_ = QImage(a.size(), QImage::Format_RGB32);
  image_.fill(palette().base().color().rgb());
  bands = {};
  if (!model || model->eventCount() == 0) return;
  const int64_t n = int64_t(model->eventCount());
  const int64_t first = std::clamp<int64_t>(int64_t(std::ceil(lower)), 0, n - 1);
  const int64_t last = std::clamp<int64_t>(int64_t(std::floor(upper)), 0, n - 1);
  if (last < first) return;
  uint64_t top = 1;
  for (int64_t i = first; i <= last; ++i) top = std::max(top, model->allocatedAfter(size_t(i)));
  yMax = double(top) * 1.08;
  const uint64_t minBytes = uint64_t(yMax / double(a.height()));  // under a pixel: merged
  bands = model->bands(first, last, size_t(a.width()), minBytes);
  const int W = image_.width(), H = image_.height();
  const double perByte = double(H) / yMax;
  std::unordered_map<uint32_t, QRgb> cache;
  std::unordered_map<uint32_t, QRgb> pale;
  auto rgb = [&](const MemBandSlice& s) -> QRgb {
    const bool merged = s.allocEvent == kMergedBands;
    const uint32_t ev = merged ? s.largest : s.allocEvent;
    auto [it, fresh] = (merged ? pale : cache).try_emplace(ev, 0);
    if (fresh) {
      QColor c = color ? color(ev) : kAllocated;
      if (merged) {  // small blocks merged: their largest one's colour, paler
        c = QColor((c.red() + 2 * 255) / 3, (c.green() + 2 * 255) / 3, (c.blue() + 2 * 255) / 3);
      } else {  // neighbouring allocations of one op differ a little in lightness
        const uint32_t h = ev * 2654435761u;
        c = c.lighter(92 + int(h >> 28) * 2);
      }
      it->second = c.rgb();
    }
    return it->second;
  };
  for (const MemBandColumn& col : bands.columns) {
    const int x0 = std::clamp(int(std::floor(xOf(double(col.firstEvent) - 0.5))) - a.left(), 0, W);
    const int x1 =
        std::clamp(int(std::floor(xOf(double(col.lastEvent) + 0.5))) - a.left(), x0 + 1, W);
    if (x0 >= W) continue;
    for (const MemBandSlice& s : col.slices) {
      const int yb = H - int(std::lround(double(s.base) * perByte));
      const int yt = std::max(0, H - int(std::lround(double(s.base + s.bytes) * perByte)));
      if (yt >= yb) continue;
      const QRgb c = rgb(s);
      for (int y = yt; y < std::min(yb, H); ++y) {
        QRgb* line = reinterpret_cast<QRgb*>(image_.scanLine(y));
        std::fill(line + x0, line + x1, c);
      }
    }
  }
}

void ActiveMemory::paintEvent(QPaintEvent*) {
  if (dirty_) rebuild();
  QPainter p(this);
  p.fillRect(rect(), palette().base());
  const QRect a = area();
  p.drawImage(a.topLeft(), image_);
  p.setPen(QPen(QColor(0xa0, 0xa0, 0xa0), 1));
  p.drawRect(a.adjusted(0, 0, -1, -1));
  if (!model || model->eventCount() == 0) return;
  p.setClipRect(a);
  p.setPen(QPen(QColor(0x90, 0x90, 0x90), 1, Qt::DashLine));
  for (const auto& [ev, step] : steps) {
    if (ev == 0 || double(ev) < lower || double(ev) > upper) continue;
    const double x = xOf(double(ev) - 0.5);
    p.drawLine(QPointF(x, a.top()), QPointF(x, a.bottom()));
  }
  if (cursor >= 0) {
    p.setPen(QPen(kHighlight, 1.5));
    const double x = xOf(double(cursor));
    p.drawLine(QPointF(x, a.top()), QPointF(x, a.bottom()));
  }
  if (selecting >= 0 && selectX >= 0) {
    p.fillRect(QRect(QPoint(std::min(selecting, selectX), a.top()),
                     QPoint(std::max(selecting, selectX), a.bottom())),
               QColor(0x30, 0x70, 0xc0, 50));
  }
  p.setClipping(false);
  // The scale: the top of the band area in bytes.
  p.setPen(palette().color(QPalette::Text));
  QFont f = font();
  f.setPointSizeF(f.pointSizeF() * 0.8);
  p.setFont(f);
  // Left of the bands where it fits (the shared axis margin is sized for the timeline's ticks),
  // else inside their top-left corner on a light box: never cut off at the widget's edge.
  const QString topText = qs(keel::formatBytes(uint64_t(yMax)));
  const QFontMetrics fm(f);
  const int textWidth = fm.horizontalAdvance(topText);
  if (textWidth <= a.left() - 4) {
    p.drawText(QRect(0, a.top(), a.left() - 4, 16), Qt::AlignRight | Qt::AlignTop, topText);
  } else {
    const QRect box(a.left() + 2, a.top() + 1, textWidth + 6, fm.height());
    p.fillRect(box, QColor(255, 255, 255, 210));
    p.drawText(box, Qt::AlignCenter, topText);
  }
  p.drawText(QRect(0, a.bottom() - 16, std::max(0, a.left() - 4), 16),
             Qt::AlignRight | Qt::AlignBottom, QStringLiteral("0"));
}

std::pair<const MemBandSlice*, int64_t> ActiveMemory::bandAt(QPoint pos) const {
  const QRect a = area();
  if (!a.contains(pos) || bands.columns.empty()) return {nullptr, -1};
  const int64_t e = eventAt(pos.x());
  auto it = std::partition_point(bands.columns.begin(), bands.columns.end(),
                                 [&](const MemBandColumn& c) { return c.lastEvent < e; });
  if (it == bands.columns.end()) return {nullptr, -1};
  const double bytes = double(a.bottom() + 1 - pos.y()) / double(a.height()) * yMax;
  for (const MemBandSlice& s : it->slices)
    if (bytes >= double(s.base) && bytes < double(s.base + s.bytes)) return {&s, it->event};
  return {nullptr, it->event};
}

bool ActiveMemory::event(QEvent* e) {
  if (e->type() == QEvent::ToolTip) {
    auto* he = static_cast<QHelpEvent*>(e);
    const auto [slice, at] = bandAt(he->pos());
    showTip(he, slice && tipFor ? tipFor(*slice, at) : QString(), this);
    return true;
  }
  return QWidget::event(e);
}

void ActiveMemory::mousePressEvent(QMouseEvent* e) {
  if (e->button() != Qt::LeftButton || !model || !model->eventCount()) return;
  if (e->modifiers() & Qt::ShiftModifier) {
    selecting = selectX = e->pos().x();
    update();
  } else if (clicked) {
    clicked(eventAt(e->pos().x()));
  }
}

void ActiveMemory::mouseMoveEvent(QMouseEvent* e) {
  if (selecting >= 0) {
    selectX = e->pos().x();
    update();
  } else if ((e->buttons() & Qt::LeftButton) && clicked && model && model->eventCount()) {
    clicked(eventAt(e->pos().x()));
  }
}

void ActiveMemory::mouseReleaseEvent(QMouseEvent* e) {
  if (selecting < 0) return;
  const int a = std::min(selecting, e->pos().x()), b = std::max(selecting, e->pos().x());
  selecting = selectX = -1;
  update();
  if (b - a >= 3 && rangeSelected) rangeSelected(eventAt(a), eventAt(b));
}

void ActiveMemory::mouseDoubleClickEvent(QMouseEvent*) {
  if (resetRange) resetRange();
}

}  // namespace memory_detail

void MemoryView::Impl::buildActive() {
  active = new ActiveMemory(q);
  active->setToolTip(QString());
  active->color = [this](uint32_t ev) {
    if (!mem) return kAllocated;
    return ownerColor(*mem, MemBlock{mem->event(ev).address, mem->event(ev).bytes, ev}, opColors);
  };
  active->tipFor = [this](const MemBandSlice& s, int64_t at) { return activeTip(s, at); };
  active->clicked = [this](int64_t k) { moveTo(k); };
  active->rangeSelected = [this](int64_t first, int64_t last) { q->setRange(first, last); };
  active->resetRange = [this] { q->setRange(0, count() - 1); };
  activeCaption = new QLabel(q);
  activeCaption->setObjectName("memoryActiveCaption");
  activeCaption->setWordWrap(false);
  // One line, cut on the right when narrow: it must not widen the timeline pane.
  activeCaption->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  QFont f = smallFont(0.9);
  activeCaption->setFont(f);
}

void MemoryView::Impl::syncActive() {
  if (!active) return;
  const QCPRange r = plot->xAxis->range();
  const QRect ar = plot->axisRect()->rect();
  const int left = ar.left();  // the plot and the bands share their parent's x origin
  const int right = plot->width() - ar.right() - 1;
  const bool moved = active->lower != r.lower || active->upper != r.upper ||
                     active->axisLeft != left || active->axisRight != right ||
                     active->model != mem.get();
  active->model = mem.get();
  active->lower = r.lower;
  active->upper = r.upper;
  active->axisLeft = left;
  active->axisRight = right;
  active->steps = mem ? mem->stepStarts() : std::vector<std::pair<size_t, int64_t>>{};
  if (moved) active->invalidate();
  const int64_t n = count();
  const int64_t first =
      std::clamp<int64_t>(int64_t(std::ceil(r.lower)), 0, std::max<int64_t>(0, n - 1));
  const int64_t last =
      std::clamp<int64_t>(int64_t(std::floor(r.upper)), 0, std::max<int64_t>(0, n - 1));
  activeCaption->setText(
      n == 0 ? QString()
             : (first == 0 && last == n - 1
                    // Short enough for a 1366-px screen's pane (it was cut off there).
                    ? tr("<b>Active memory</b>: a band per live block, oldest lowest · "
                         "Shift+drag: a range · double click: all")
                    : tr("<b>Active memory</b>, events %1–%2 of %3 · Shift+drag: a range · "
                         "double click: all")
                          .arg(first)
                          .arg(last)
                          .arg(n)));
}

QString MemoryView::Impl::activeTip(const MemBandSlice& slice, int64_t at) const {
  if (!mem) return {};
  QString head;
  const uint32_t ev = slice.allocEvent == kMergedBands ? slice.largest : slice.allocEvent;
  if (slice.allocEvent == kMergedBands)
    head = tr("<b>%1 small allocations</b>, %2 in all, each under a pixel high at this zoom "
              "(Shift+drag a shorter range to see them one by one). The largest:<br>")
               .arg(slice.blocks)
               .arg(bytesText(slice.bytes));
  const storage::MemRecord& a = mem->event(ev);
  // Where the block is at `at` (compaction may have moved it) and when it goes.
  uint64_t address = a.address;
  int64_t freed = -1;
  for (size_t i = size_t(ev) + 1; i < mem->eventCount(); ++i) {
    const storage::MemRecord& e = mem->event(i);
    if (e.address != address) continue;
    if (e.kind == MemEventKind::Compact) {
      address = e.toAddress;
    } else if (e.kind == MemEventKind::Free || e.kind == MemEventKind::Alloc) {
      freed = int64_t(i);  // an alloc at its address: a free the recording missed
      break;
    }
  }
  QString t = head + allocationTip(*mem, MemBlock{a.address, a.bytes, ev}, at);
  if (freed >= 0) {
    const storage::MemRecord& f = mem->event(size_t(freed));
    const analysis::MemOp* o = f.opSeq ? mem->op(f.opSeq) : nullptr;
    t += tr("<br>freed at event %1").arg(freed);
    if (o) t += tr(" (op #%1 %2)").arg(o->seq).arg(qs(o->name).toHtmlEscaped());
  } else {
    t += tr("<br><b>never freed</b> in the recording");
  }
  return t;
}

}  // namespace keel::views
