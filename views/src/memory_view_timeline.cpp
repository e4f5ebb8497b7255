// The memory view's timeline: allocated, reserved and cached free memory after each allocator
// event (QCustomPlot, step boundaries marked, step labels only where they fit), the cursor line on
// its own buffered layer so a cursor move replots only that, and the mouse: click or drag scrubs,
// right/middle drag pans, wheel zooms; the active-memory bands above follow its x range.
#include <QMouseEvent>
#include <QSlider>
#include <QToolTip>
#include <cmath>
#include <limits>

#include "memory_view_impl.h"
#include "plot_util.h"

namespace keel::views {

using namespace memory_detail;
using analysis::MemBlock;
using analysis::MemOp;
using analysis::MemoryModel;

void MemoryView::Impl::labelAxes() {
  // Before a recording: no unit yet.
  if (unitName.isEmpty())
    plot->yAxis->setLabel(tr("bytes"));
  else
    plot->yAxis->setLabel(roomy ? tr("bytes (%1)").arg(unitName) : unitName);
  plot->yAxis2->setLabel(roomy ? tr("cached free %") : tr("free %"));
  for (QCPAxis* ax : {plot->yAxis, plot->yAxis2}) ax->ticker()->setTickCount(roomy ? 5 : 2);
}

namespace {
// Events are whole numbers: no tick between two (a 3-event snapshot read 0, 0.5, 1, 1.5, 2).
class EventTicker : public QCPAxisTicker {
 protected:
  double getTickStep(const QCPRange& range) override {
    return std::max(1.0, QCPAxisTicker::getTickStep(range));
  }
};
}  // namespace

void MemoryView::Impl::buildTimeline() {
  plot = new QCustomPlot(q);
  plot->setObjectName("memoryTimeline");
  plot->setFocusPolicy(Qt::ClickFocus);
  plot->setMinimumHeight(70);
  plot->setInteractions(QCP::iRangeZoom);
  plot->setPlottingHint(QCP::phFastPolylines, true);
  plot->axisRect()->setRangeZoom(Qt::Horizontal);
  plot->xAxis->setLabel(tr("allocator event #"));
  plot->xAxis->setTicker(QSharedPointer<QCPAxisTicker>(new EventTicker));
  plot->yAxis2->setVisible(true);
  labelAxes();
  plot->yAxis2->setRange(0, 100);
  const QFont small = smallFont(0.85);
  for (QCPAxis* ax : {plot->xAxis, plot->yAxis, plot->yAxis2}) {
    ax->setLabelFont(small);
    ax->setTickLabelFont(small);
  }
  putLegendBelow(plot, small);
  plot->legend->setMargins(QMargins(4, 0, 4, 0));
  plot->addLayer("cursor", nullptr, QCustomPlot::limAbove);
  cursorLayer = plot->layer("cursor");
  cursorLayer->setMode(QCPLayer::lmBuffered);
  plot->setToolTip(QString());
  // The bands follow the x range; step labels are re-fitted to it.
  // Both before anything paints: a repaint of the plot flushes the window, bands included, and
  // bands laid out for a stale range would cost a replay of it.
  QObject::connect(plot, &QCustomPlot::afterLayout, q, [this] {
    placeStepLabels();
    syncActive();
    fitAllocatedFill();
  });
  QObject::connect(plot->xAxis, qOverload<const QCPRange&>(&QCPAxis::rangeChanged), q,
                   [this](const QCPRange&) {
                     syncActive();
                     fitAllocatedFill();
                   });

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

void MemoryView::Impl::rebuildTimeline() {
  plot->clearGraphs();
  plot->clearItems();
  stepLabels.clear();
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
  unitName = QStringLiteral("B");
  unit = 1;
  for (const char* u : {"KiB", "MiB", "GiB"}) {
    if (double(maxBytes) / unit < 4096) break;
    unit *= 1024;
    unitName = QLatin1String(u);
  }
  labelAxes();
  // The state after event i is drawn from i to i + 1; the last one too, to the plot's edge (it
  // had no width: a snapshot's last allocation never showed, the peak its header named unseen).
  QVector<double> x(n + 1), a(n + 1), r(n + 1), f(n + 1);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = double(i);
    a[i] = double(mem->allocatedAfter(size_t(i))) / unit;
    r[i] = double(mem->reservedAfter(size_t(i))) / unit;
    f[i] = 100.0 * mem->fragmentationAfter(size_t(i));  // (reserved - allocated) / reserved
  }
  x[n] = double(n);
  a[n] = a[n - 1];
  r[n] = r[n - 1];
  f[n] = f[n - 1];
  QCPGraph* gr = plot->addGraph(plot->xAxis, plot->yAxis);
  gr->setName(tr("reserved"));
  gr->setPen(QPen(kReserved, 1.5));
  gr->setLineStyle(QCPGraph::lsStepLeft);
  gr->setData(x, r, true);
  // The area under the allocated line is its own graph, below the lines and out of the legend:
  // see fitAllocatedFill.
  allocatedFill = plot->addGraph(plot->xAxis, plot->yAxis);
  allocatedFill->setPen(Qt::NoPen);
  allocatedFill->setBrush(QColor(kAllocated.red(), kAllocated.green(), kAllocated.blue(), 50));
  allocatedFill->setLineStyle(QCPGraph::lsStepLeft);
  allocatedFill->removeFromLegend();
  QCPGraph* ga = plot->addGraph(plot->xAxis, plot->yAxis);
  ga->setName(tr("allocated"));
  ga->setPen(QPen(kAllocated, 1.5));
  ga->setLineStyle(QCPGraph::lsStepLeft);
  ga->setData(x, a, true);
  QCPGraph* gf = plot->addGraph(plot->xAxis, plot->yAxis2);
  gf->setName(tr("cached free % (reserved − allocated)"));
  gf->setPen(QPen(QColor(0x70, 0x70, 0x70), 1, Qt::DotLine));
  gf->setLineStyle(QCPGraph::lsStepLeft);
  gf->setData(x, f, true);
  plot->xAxis->setRange(-0.5, double(n) - 0.5);
  plot->yAxis->setRange(0, double(maxBytes) / unit * 1.12);
  // Zoomed into a long run, thousands of points stay visible (no adaptive sampling below a few
  // per pixel): antialiased wide step lines would cost hundreds of ms per replot.
  const bool many = n > 50000;
  for (QCPGraph* g : {gr, allocatedFill, ga, gf}) {
    g->setAntialiased(!many);
    g->setAntialiasedFill(!many);
  }
  fitAllocatedFill();

  // Step boundaries: a dashed line before the first event of each step (labelled while few).
  const auto& starts = mem->stepStarts();
  const size_t stride = std::max<size_t>(1, starts.size() / 400);
  const QFont small = smallFont(0.8);
  // An imported snapshot has no steps: no "init" over its first event.
  for (size_t s = 0; s < starts.size() && mem->hasSteps(); s += stride) {
    const double bx = double(starts[s].first) - 0.5;
    if (starts[s].first > 0) {
      auto* line = new QCPItemStraightLine(plot);
      line->setPen(QPen(QColor(0x90, 0x90, 0x90), 1, Qt::DashLine));
      line->point1->setCoords(bx, 0);
      line->point2->setCoords(bx, 1);
    }
    // Labelled where they fit: placeStepLabels() hides those that would overlap.
    {
      auto* label = new QCPItemText(plot);
      stepLabels.push_back(label);
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
  // The first refused request, where the run failed: a line and its label, mid-height (the
  // cursor's tag is at the top, the steps' at the bottom).
  if (!mem->oomEvents().empty()) {
    const double ox = double(mem->oomEvents().front());
    auto* line = new QCPItemStraightLine(plot);
    line->setPen(QPen(kOom, 2));
    line->point1->setCoords(ox, 0);
    line->point2->setCoords(ox, 1);
    auto* label = new QCPItemText(plot);
    label->setClipToAxisRect(true);
    label->position->setTypeX(QCPItemPosition::ptPlotCoords);
    label->position->setTypeY(QCPItemPosition::ptAxisRectRatio);
    label->position->setCoords(ox, 0.5);
    label->setPositionAlignment(Qt::AlignRight | Qt::AlignVCenter);
    label->setPadding(QMargins(3, 1, 3, 1));
    QFont bold = small;
    bold.setBold(true);
    label->setFont(bold);
    label->setColor(kOom);
    label->setBrush(QColor(255, 255, 255, 200));
    label->setText(tr("out of memory"));
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
  placeStepLabels();
  plot->replot();
}

// Step labels: right to left (a later step wins over the one before it, so "step 1" beats
// "init"), a label shows only when it ends before the start of the last one shown (less a gap)
// and lies inside the plot; at 20+ steps every other one (or fewer) shows.
void MemoryView::Impl::placeStepLabels() {
  const QRect ar = plot->axisRect()->rect();
  const QFontMetrics fm(smallFont(0.8));
  int shownLeft = std::numeric_limits<int>::max();
  for (auto it = stepLabels.rbegin(); it != stepLabels.rend(); ++it) {
    QCPItemText* label = *it;
    const double px = plot->xAxis->coordToPixel(label->position->coords().x());
    const int w = fm.horizontalAdvance(label->text()) + 6;
    const int left = int(std::floor(px));
    const bool fits =
        left >= ar.left() - 1 && left + w <= ar.right() + 1 && left + w < shownLeft - 4;
    label->setVisible(fits);
    if (fits) shownLeft = left;
  }
}

QVector<QRect> MemoryView::stepLabelRects() const {
  QVector<QRect> out;
  const QFontMetrics fm(d_->smallFont(0.8));
  for (QCPItemText* label : d_->stepLabels) {
    if (!label->visible()) continue;
    const double px = d_->plot->xAxis->coordToPixel(label->position->coords().x());
    const int w = fm.horizontalAdvance(label->text()) + 6;
    const int h = fm.height() + 2;
    out.push_back(QRect(int(std::floor(px)), d_->plot->axisRect()->rect().bottom() - h, w, h));
  }
  return out;
}

QStringList MemoryView::stepLabelTexts() const {
  QStringList out;
  for (QCPItemText* label : d_->stepLabels)
    if (label->visible()) out << label->text();
  return out;
}

int64_t MemoryView::Impl::eventAtPixel(double px) const {
  const int64_t n = count();
  if (n == 0) return -1;
  return std::clamp<int64_t>(std::llround(plot->xAxis->pixelToCoord(px)), 0, n - 1);
}

// The allocated area. Filled under the allocated line's own polygon, whose thousands of
// near-vertical edges (adaptive sampling keeps each pixel column's lowest and highest value) the
// raster engine fills in time proportional to them — 0.75 s of a 1.4 s replot of 3.4 M events —
// it is drawn instead from one value per pixel column when the x range holds more than two
// events a column: the column's largest allocated, the height the line's polygon covers there.
// With fewer events, the events themselves. Refitted whenever the range or the width changes.
void MemoryView::Impl::fitAllocatedFill() {
  if (!allocatedFill || !mem || count() == 0) return;
  const int64_t n = count();
  const QCPRange r = plot->xAxis->range();
  const int cols = std::max(1, plot->axisRect()->width());
  const int64_t first = std::clamp<int64_t>(int64_t(std::floor(r.lower)), 0, n - 1);
  const int64_t last = std::clamp<int64_t>(int64_t(std::ceil(r.upper)), 0, n - 1);
  const int64_t len = last - first + 1;
  QVector<double> x, y;
  auto at = [&](int64_t i) { return double(mem->allocatedAfter(size_t(i))) / unit; };
  if (len <= 2 * int64_t(cols)) {
    for (int64_t i = first; i <= last; ++i) {
      x.push_back(double(i));
      y.push_back(at(i));
    }
  } else {
    x.reserve(cols + 1);
    y.reserve(cols + 1);
    for (int c = 0; c < cols; ++c) {
      const int64_t i0 = first + len * c / cols, i1 = first + len * (c + 1) / cols;
      uint64_t top = 0;
      for (int64_t i = i0; i < i1; ++i) top = std::max(top, mem->allocatedAfter(size_t(i)));
      x.push_back(double(i0));
      y.push_back(double(top) / unit);
    }
    x.push_back(double(last));
    y.push_back(at(last));
  }
  if (last == n - 1) {  // the last event's state to the edge, as the lines draw it
    x.push_back(double(n));
    y.push_back(at(last));
  }
  allocatedFill->setData(x, y, true);
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
  QString what = qs(memEventName(e.kind));
  if (e.kind == MemEventKind::TrackBegin || e.kind == MemEventKind::TrackEnd)
    what += QStringLiteral(" '%1'").arg(qs(e.label));
  else if (e.kind == MemEventKind::Oom)
    what = tr("out of memory: %1 requested and refused").arg(bytesText(e.bytes));
  else if (e.kind == MemEventKind::Move || e.kind == MemEventKind::Compact)
    what += QStringLiteral(" %1 %2 → %3")
                .arg(bytesText(e.bytes), hexAddr(e.address), hexAddr(e.toAddress));
  else
    what += QStringLiteral(" %1 at %2").arg(bytesText(e.bytes), hexAddr(e.address));
  QString op;
  if (const MemOp* o = e.opSeq ? mem->op(e.opSeq) : nullptr)
    op = tr("op #%1 %2 (%3%4)")
             .arg(o->seq)
             .arg(qs(o->name), qs(phaseName(o->phase)),
                  o->scope.empty() ? QString() : ", " + qs(o->scope));
  else if (e.label == storage::kLiveBefore)  // Note [A step range's first step]
    op = tr("live before the recording began");
  else
    op = e.opSeq ? tr("op #%1").arg(e.opSeq) : tr("outside ops");
  const uint64_t al = mem->allocatedAfter(size_t(k)), re = mem->reservedAfter(size_t(k));
  const QString step = !mem->hasSteps() ? QString()
                       : e.step == 0    ? tr(" · initialisation")
                                        : tr(" · step %1").arg(e.step);
  return tr("Event %1 of %2: %3 · %4%5 · allocated %6, reserved %7, cached free %8 (%9%)")
      .arg(k)
      .arg(count())
      .arg(what, op, step, bytesText(al), bytesText(re), bytesText(re - std::min(al, re)))
      .arg(100.0 * mem->fragmentationAfter(size_t(k)), 0, 'f', 1);
}

void MemoryView::Impl::placeCursorLine(int64_t k) {
  if (!cursorLine || k < 0) return;
  cursorLine->point1->setCoords(double(k), 0);
  cursorLine->point2->setCoords(double(k), 1);
  const storage::MemRecord& e = mem->event(size_t(k));
  QString tag = !mem->hasSteps() ? tr("event %1").arg(k)
                : e.step == 0    ? tr("init")
                                 : tr("step %1").arg(e.step);
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

QPoint MemoryView::timelinePoint(int64_t k) const {
  const Impl& d = *d_;
  if (k < 0 || k >= d.count()) return {-1, -1};
  const QRect r = d.plot->axisRect()->rect();
  return {int(std::lround(d.plot->xAxis->coordToPixel(double(k)))), r.center().y()};
}

}  // namespace keel::views
