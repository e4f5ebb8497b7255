// TimelineView and TimelineModel: see timeline_view.h. Times are ns from the step's first op;
// x = plotLeft + (t - t0_) * pxPerNs. The selected op's bar is drawn last, outlined, at least a
// few pixels wide, so it shows at any zoom.
#include "keel/views/timeline_view.h"

#include <QHelpEvent>
#include <QKeyEvent>
#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>
#include <QWheelEvent>
#include <algorithm>
#include <cmath>
#include <map>

#include "keel/analysis/module_summary.h"
#include "keel/views/selection.h"
#include "text_util.h"

namespace keel::views {

namespace {

constexpr int kHeader = 24;       // time axis
constexpr int kRowH = 28;         // one thread
constexpr double kInset = 4;      // bar inset in its row
constexpr double kMinSpan = 200;  // ns: the deepest zoom

QColor phaseFill(Phase p) {
  if (p == Phase::Forward) return QColor(0x5b, 0x9b, 0xd5);
  if (p == Phase::Backward) return QColor(0xf0, 0x9a, 0x48);
  return QColor(0x6d, 0xb8, 0x5a);
}

// analysis::durationText ("850 ns", "12.5 µs", "3.20 ms"), as the graph's module summaries say it.
QString durationText(double ns) {
  return qs(analysis::durationText(std::llround(ns)));
}

// A tick step of 1, 2 or 5 × 10^k ns giving about `target` ticks over `span`.
double niceStep(double span, double target) {
  const double raw = span / std::max(target, 1.0);
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * p) return m * p;
  return 10 * p;
}

QString tickText(double t, double step) {
  double unit = 1;
  const char* name = "ns";
  if (step >= 1e9)
    unit = 1e9, name = "s";
  else if (step >= 1e6)
    unit = 1e6, name = "ms";
  else if (step >= 1e3)
    unit = 1e3, name = "\u00b5s";  // spelt as durationText spells it
  const double v = t / unit, s = step / unit;
  const int decimals = s >= 1 ? 0 : int(std::ceil(-std::log10(s) - 1e-9));
  return QStringLiteral("%1 %2").arg(v, 0, 'f', decimals).arg(QString::fromUtf8(name));
}

}  // namespace

TimelineModel TimelineModel::build(const StepData& step) {
  TimelineModel m;
  if (step.ops.empty()) return m;
  int64_t origin = step.ops.front().beginNs, last = step.ops.front().endNs;
  for (const auto& op : step.ops) {
    origin = std::min(origin, op.beginNs);
    last = std::max(last, std::max(op.endNs, op.beginNs));
  }
  m.originNs = origin;
  m.spanNs = last - origin;
  std::map<int64_t, std::vector<TimelineBar>> byThread;
  for (size_t i = 0; i < step.ops.size(); ++i) {
    const auto& op = step.ops[i];
    TimelineBar b;
    b.begin = op.beginNs - origin;
    b.end = std::max(op.endNs, op.beginNs) - origin;
    b.seq = op.seq;
    b.phase = op.phase;
    b.op = int32_t(i);
    byThread[op.thread].push_back(b);
  }
  for (auto& [thread, bars] : byThread) {
    std::stable_sort(bars.begin(), bars.end(),
                     [](const TimelineBar& x, const TimelineBar& y) { return x.begin < y.begin; });
    TimelineRow row;
    row.thread = thread;
    row.label = QStringLiteral("thread %1").arg(thread);
    row.maxEnd.reserve(bars.size());
    int64_t e = 0;
    for (const auto& b : bars) row.maxEnd.push_back(e = std::max(e, b.end));
    row.bars = std::move(bars);
    m.rows.push_back(std::move(row));
  }
  return m;
}

std::optional<std::pair<int, int>> TimelineModel::find(uint64_t seq) const {
  for (size_t r = 0; r < rows.size(); ++r)
    for (size_t i = 0; i < rows[r].bars.size(); ++i)
      if (rows[r].bars[i].seq == seq) return std::make_pair(int(r), int(i));
  return std::nullopt;
}

// See Note [Timeline level of detail].
std::vector<TimelineRect> TimelineModel::rects(const TimelineRow& row, double t0, double pxPerNs,
                                               double widthPx) {
  std::vector<TimelineRect> out;
  const double t1 = t0 + widthPx / pxPerNs;
  // The first bar that may reach into the window: maxEnd is non-decreasing.
  auto it = std::lower_bound(row.maxEnd.begin(), row.maxEnd.end(), int64_t(std::floor(t0)));
  for (size_t i = size_t(it - row.maxEnd.begin()); i < row.bars.size(); ++i) {
    const TimelineBar& b = row.bars[i];
    if (double(b.begin) > t1) break;
    const double x0 = (double(b.begin) - t0) * pxPerNs, x1 = (double(b.end) - t0) * pxPerNs;
    const bool narrow = x1 - x0 < 1.0;
    if (narrow && !out.empty()) {
      TimelineRect& last = out.back();
      const bool lastNarrow = last.count > 1 || last.x1 - last.x0 < 1.0;
      if (lastNarrow && x0 - last.x1 < 1.0) {
        last.x1 = std::max(last.x1, x1);
        last.count = int(i) - last.first + 1;
        continue;
      }
    }
    out.push_back({x0, x1, int(i), 1});
  }
  return out;
}

TimelineView::TimelineView(Selection* selection, Side side, QWidget* parent)
    : QWidget(parent), selection_(selection), side_(side) {
  setObjectName("timelineView");
  setMouseTracking(false);
  setFocusPolicy(Qt::ClickFocus);
  setMinimumHeight(kHeader + kRowH + 8);
  setAttribute(Qt::WA_OpaquePaintEvent);
  connect(selection_, &Selection::selected, this, &TimelineView::onSelected);
  connect(selection_, &Selection::cleared, this, [this] {
    highlighted_.reset();
    update();
  });
}

TimelineView::~TimelineView() = default;

void TimelineView::setStep(StepPtr step) {
  step_ = std::move(step);
  model_ = step_ ? TimelineModel::build(*step_) : TimelineModel{};
  QFontMetrics fm(font());
  gutter_ = 70;
  for (const auto& r : model_.rows) gutter_ = std::max(gutter_, fm.horizontalAdvance(r.label) + 16);
  highlighted_.reset();
  fit();
  if (auto cur = selection_->current(side_)) onSelected(side_, *cur);
}

double TimelineView::plotLeft() const {
  return gutter_;
}
double TimelineView::plotWidth() const {
  return std::max(10.0, double(width()) - gutter_ - 8);
}
double TimelineView::pxPerNs() const {
  return plotWidth() / span_;
}
double TimelineView::xOf(double ns) const {
  return plotLeft() + (ns - t0_) * pxPerNs();
}

void TimelineView::fit() {
  t0_ = 0;
  span_ = std::max(double(model_.spanNs), kMinSpan);
  update();
}

void TimelineView::setViewRange(double t0, double t1) {
  span_ = std::max(t1 - t0, kMinSpan);
  t0_ = t0;
  update();
}

QRectF TimelineView::rowRect(int row) const {
  return QRectF(0, kHeader + row * kRowH, width(), kRowH);
}

QRectF TimelineView::barRect(uint64_t seq) const {
  auto at = model_.find(seq);
  if (!at) return {};
  const TimelineBar& b = model_.rows[size_t(at->first)].bars[size_t(at->second)];
  const QRectF row = rowRect(at->first);
  const double x0 = xOf(double(b.begin)), x1 = std::max(xOf(double(b.end)), x0 + 1.0);
  return QRectF(QPointF(x0, row.top() + kInset), QPointF(x1, row.bottom() - kInset));
}

std::optional<uint64_t> TimelineView::opAt(QPointF pos) const {
  if (pos.x() < plotLeft() || pos.y() < kHeader) return std::nullopt;
  const int r = int((pos.y() - kHeader) / kRowH);
  if (r < 0 || r >= rowCount()) return std::nullopt;
  const TimelineRow& row = model_.rows[size_t(r)];
  const double t = t0_ + (pos.x() - plotLeft()) / pxPerNs();
  const double tol = 3.0 / pxPerNs();  // three pixels
  auto it = std::lower_bound(row.maxEnd.begin(), row.maxEnd.end(), int64_t(std::floor(t - tol)));
  std::optional<uint64_t> best;
  double bestDist = 0;
  int64_t bestLen = 0;
  for (size_t i = size_t(it - row.maxEnd.begin()); i < row.bars.size(); ++i) {
    const TimelineBar& b = row.bars[i];
    if (double(b.begin) > t + tol) break;
    const double d = t < double(b.begin) ? double(b.begin) - t
                     : t > double(b.end) ? t - double(b.end)
                                         : 0.0;
    // Inside a bar beats near one; among nested or touching bars the shortest wins.
    const int64_t len = b.end - b.begin;
    if (d <= tol && (!best || d < bestDist || (d == bestDist && len < bestLen))) {
      best = b.seq;
      bestDist = d;
      bestLen = len;
    }
  }
  return best;
}

void TimelineView::onSelected(Side side, quint64 seq) {
  if (side != side_) return;
  auto at = model_.find(seq);
  highlighted_ = at ? std::optional<uint64_t>(seq) : std::nullopt;
  if (at) scrollIntoView(model_.rows[size_t(at->first)].bars[size_t(at->second)]);
  update();
}

void TimelineView::scrollIntoView(const TimelineBar& bar) {
  const double b = double(bar.begin), e = double(bar.end);
  if (b >= t0_ && e <= t0_ + span_) return;  // already in view
  if (e - b > span_ * 0.8) {
    setViewRange(b - (e - b) * 0.1, e + (e - b) * 0.1);
    return;
  }
  t0_ = (b + e) / 2 - span_ / 2;  // same zoom, centred on the bar
  update();
}

void TimelineView::zoomAt(double x, double factor) {
  const double t = t0_ + (x - plotLeft()) / pxPerNs();
  const double full = std::max(double(model_.spanNs), kMinSpan);
  const double span = std::clamp(span_ * factor, kMinSpan, full * 1.05);
  t0_ = t - (x - plotLeft()) * span / plotWidth();
  span_ = span;
  update();
}

QString TimelineView::emptyText() const {
  // "has no ops" of a step the recording kept no ops of was wrong: it had them, unrecorded.
  if (!step_) return tr("No step shown");
  if (emptyStepNote_.isEmpty()) return tr("Step %1 has no ops").arg(step_->step);
  return tr("No ops recorded in step %1. %2").arg(step_->step).arg(emptyStepNote_);
}

void TimelineView::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.fillRect(rect(), palette().base());
  const QFontMetrics fm(font());
  paintedRects_ = 0;
  if (model_.rows.empty()) {
    p.setPen(palette().color(QPalette::PlaceholderText));
    p.drawText(rect(), Qt::AlignCenter | Qt::TextWordWrap, emptyText());
    return;
  }
  const double left = plotLeft(), w = plotWidth(), ppn = pxPerNs();

  // Time axis: ticks and labels, relative to the step's first op.
  const double step = niceStep(span_, w / 110.0);
  p.fillRect(QRectF(0, 0, width(), kHeader), palette().window());
  p.setPen(palette().color(QPalette::Mid));
  p.drawLine(QPointF(0, kHeader - 0.5), QPointF(width(), kHeader - 0.5));
  for (double t = std::ceil(t0_ / step) * step; t <= t0_ + span_; t += step) {
    const double x = xOf(t);
    p.setPen(QColor(0xe4, 0xe7, 0xeb));
    p.drawLine(QPointF(x, kHeader), QPointF(x, height()));
    p.setPen(palette().color(QPalette::WindowText));
    p.drawLine(QPointF(x, kHeader - 5), QPointF(x, kHeader - 1));
    const QString label = tickText(t, step);
    if (x + 3 + fm.horizontalAdvance(label) < width())
      p.drawText(QRectF(x + 3, 0, 200, kHeader - 4), Qt::AlignLeft | Qt::AlignVCenter, label);
  }

  // Rows.
  const TimelineBar* selected = nullptr;
  int selectedRow = -1;
  for (int r = 0; r < rowCount(); ++r) {
    const TimelineRow& row = model_.rows[size_t(r)];
    const QRectF rr = rowRect(r);
    if (r % 2) p.fillRect(QRectF(left, rr.top(), w + 8, rr.height()), QColor(0xf6, 0xf7, 0xf9));
    p.save();
    p.setClipRect(QRectF(left, rr.top(), w, rr.height()));
    const auto rects = TimelineModel::rects(row, t0_, ppn, w);
    paintedRects_ += int(rects.size());
    const double top = rr.top() + kInset, h = rr.height() - 2 * kInset;
    for (const TimelineRect& tr : rects) {
      const TimelineBar& b = row.bars[size_t(tr.first)];
      QRectF box(left + tr.x0, top, std::max(tr.x1 - tr.x0, 1.0), h);
      if (tr.count > 1) {
        // Merged sub-pixel bars: the phase colour of the first, darker, so density reads.
        p.fillRect(box, phaseFill(b.phase).darker(125));
        continue;
      }
      p.fillRect(box, phaseFill(b.phase));
      if (box.width() >= 4) {
        p.setPen(phaseFill(b.phase).darker(150));
        p.drawRect(box.adjusted(0.5, 0.5, -0.5, -0.5));
      }
      // The op's name where at least a few letters of it fit.
      const QRectF text = box.intersected(QRectF(left, top, w, h)).adjusted(3, 0, -2, 0);
      if (step_ && text.width() > fm.horizontalAdvance(QStringLiteral("mat…"))) {
        const QString name = QString::fromStdString(step_->ops[size_t(b.op)].name);
        p.setPen(QColor(0x10, 0x18, 0x20));
        p.drawText(text, Qt::AlignLeft | Qt::AlignVCenter,
                   fm.elidedText(name, Qt::ElideRight, int(text.width())));
      }
    }
    if (highlighted_)
      if (auto at = model_.find(*highlighted_); at && at->first == r) {
        selected = &row.bars[size_t(at->second)];
        selectedRow = r;
      }
    p.restore();
  }
  if (selected) {
    // Drawn last and at least 5 px wide, so a sub-pixel op is still found at the fitted zoom.
    QRectF box = barRect(selected->seq);
    if (box.width() < 5) box.adjust(-(5 - box.width()) / 2, 0, (5 - box.width()) / 2, 0);
    p.save();
    p.setClipRect(QRectF(left - 3, rowRect(selectedRow).top(), w + 6, kRowH));
    p.fillRect(box, phaseFill(selected->phase).lighter(110));
    p.setPen(QPen(QColor(0xd0, 0x10, 0x10), 2));
    p.drawRect(box.adjusted(-1, -2, 1, 2));
    p.restore();
  }

  // Gutter: row labels over everything that scrolled under it.
  p.fillRect(QRectF(0, kHeader, left - 2, height() - kHeader), palette().window());
  p.setPen(palette().color(QPalette::Mid));
  p.drawLine(QPointF(left - 2.5, kHeader), QPointF(left - 2.5, height()));
  p.setPen(palette().color(QPalette::WindowText));
  for (int r = 0; r < rowCount(); ++r)
    p.drawText(rowRect(r).adjusted(8, 0, 0, 0).intersected(QRectF(0, 0, left - 6, height())),
               Qt::AlignLeft | Qt::AlignVCenter, model_.rows[size_t(r)].label);
  p.fillRect(QRectF(0, 0, left - 2, kHeader), palette().window());
  p.setPen(palette().color(QPalette::PlaceholderText));
  p.drawText(QRectF(6, 0, left - 8, kHeader), Qt::AlignLeft | Qt::AlignVCenter,
             tr("step %1").arg(step_ ? step_->step : 0));
  // Legend and help, bottom right, when the rows leave room.
  const double legendY = kHeader + rowCount() * kRowH + 6;
  if (legendY + fm.height() + 4 < height()) {
    double x = left;
    for (Phase ph : {Phase::Forward, Phase::Backward, Phase::Optimizer}) {
      p.fillRect(QRectF(x, legendY + 3, 12, fm.height() - 6), phaseFill(ph));
      p.setPen(palette().color(QPalette::WindowText));
      const QString name = QString::fromUtf8(phaseName(ph).data(), int(phaseName(ph).size()));
      p.drawText(QPointF(x + 16, legendY + fm.ascent()), name);
      x += 16 + fm.horizontalAdvance(name) + 14;
    }
    p.setPen(palette().color(QPalette::PlaceholderText));
    p.drawText(QPointF(x + 10, legendY + fm.ascent()),
               tr("%1 ops in %2, showing %3 · wheel: zoom · drag: pan · double-click: fit · "
                  "click: select")
                   .arg(step_ ? step_->ops.size() : 0)
                   .arg(durationText(double(model_.spanNs)), durationText(span_)));
    // The selected op, in words, under the legend.
    const double selY = legendY + fm.height() + 4;
    if (selected && step_ && selY + fm.height() < height()) {
      const auto& op = step_->ops[size_t(selected->op)];
      p.setPen(palette().color(QPalette::WindowText));
      p.drawText(QPointF(left, selY + fm.ascent()),
                 tr("selected: %1 #%2 %3 · %4 at +%5 · thread %6")
                     .arg(QString::fromStdString(op.name))
                     .arg(op.seq)
                     .arg(QString::fromStdString(op.scope))
                     .arg(durationText(double(selected->end - selected->begin)))
                     .arg(durationText(double(selected->begin)))
                     .arg(op.thread));
    }
  }
}

void TimelineView::mousePressEvent(QMouseEvent* e) {
  if (e->button() != Qt::LeftButton) return QWidget::mousePressEvent(e);
  pressed_ = true;
  dragging_ = false;
  pressPos_ = e->position();
  pressT0_ = t0_;
}

void TimelineView::mouseMoveEvent(QMouseEvent* e) {
  if (!pressed_) return;
  const double dx = e->position().x() - pressPos_.x();
  if (!dragging_ && std::abs(dx) < 4) return;
  dragging_ = true;
  setCursor(Qt::ClosedHandCursor);
  t0_ = pressT0_ - dx / pxPerNs();
  update();
}

void TimelineView::mouseReleaseEvent(QMouseEvent* e) {
  if (e->button() != Qt::LeftButton || !pressed_) return QWidget::mouseReleaseEvent(e);
  pressed_ = false;
  unsetCursor();
  if (std::exchange(dragging_, false)) return;
  if (auto seq = opAt(e->position())) selection_->select(side_, *seq);
}

void TimelineView::mouseDoubleClickEvent(QMouseEvent* e) {
  if (e->button() == Qt::LeftButton && !opAt(e->position())) fit();
}

void TimelineView::wheelEvent(QWheelEvent* e) {
  const double steps = e->angleDelta().y() / 120.0;
  if (steps == 0) return;
  zoomAt(e->position().x(), std::pow(0.8, steps));
  e->accept();
}

void TimelineView::keyPressEvent(QKeyEvent* e) {
  // +/- zoom about the selected op while it is in view (zooming about the centre took it out of
  // view), else about the centre.
  double mid = plotLeft() + plotWidth() / 2;
  if (highlighted_)
    if (const auto at = model_.find(*highlighted_)) {
      const TimelineBar& bar = model_.rows[size_t(at->first)].bars[size_t(at->second)];
      const double centre = (double(bar.begin) + double(bar.end)) / 2;
      if (centre >= t0_ && centre <= t0_ + span_) mid = plotLeft() + (centre - t0_) * pxPerNs();
    }
  switch (e->key()) {
    case Qt::Key_Plus:
    case Qt::Key_Equal:
      zoomAt(mid, 0.5);
      break;
    case Qt::Key_Minus:
      zoomAt(mid, 2.0);
      break;
    case Qt::Key_Left:
      t0_ -= span_ / 8, update();
      break;
    case Qt::Key_Right:
      t0_ += span_ / 8, update();
      break;
    case Qt::Key_0:
    case Qt::Key_Home:
      fit();
      break;
    default:
      QWidget::keyPressEvent(e);
  }
}

bool TimelineView::event(QEvent* e) {
  if (e->type() == QEvent::ToolTip && step_) {
    auto* help = static_cast<QHelpEvent*>(e);
    if (auto seq = opAt(help->pos())) {
      const int64_t i = step_->indexOf(*seq);
      if (i >= 0) {
        const auto& op = step_->ops[size_t(i)];
        const QString phase =
            QString::fromUtf8(phaseName(op.phase).data(), int(phaseName(op.phase).size()));
        QToolTip::showText(help->globalPos(),
                           tr("<b>%1</b> #%2 (%3)<br>%4<br>%5, at +%6 on thread %7")
                               .arg(QString::fromStdString(op.name).toHtmlEscaped())
                               .arg(op.seq)
                               .arg(phase)
                               .arg(QString::fromStdString(op.scope).toHtmlEscaped())
                               .arg(durationText(double(op.endNs - op.beginNs)))
                               .arg(durationText(double(op.beginNs - model_.originNs)))
                               .arg(op.thread),
                           this);
        return true;
      }
    }
    QToolTip::hideText();
    e->ignore();
    return true;
  }
  return QWidget::event(e);
}

}  // namespace keel::views
