// LossPlot (the metrics plot): see loss_plot.h. qcustomplot.h stays in this file (Impl holds the
// plot). Invariant: graph 0 is run A's curve and graph 1 run B's whenever both have values; the
// non-finite markers are items, not graphs, so graphCount() counts curves only.
#include "keel/views/loss_plot.h"

#include <qcustomplot.h>

#include <QComboBox>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QLabel>
#include <QStandardItemModel>
#include <QToolTip>
#include <QVBoxLayout>
#include <algorithm>
#include <cmath>
#include <limits>

#include "plot_util.h"

namespace keel::views {

struct LossPlot::Impl {
  QCustomPlot* plot = nullptr;
  QLabel* note = nullptr;  // beside the combo: what is missing or marked
  QLabel* key = nullptr;   // a short plot's two runs: which line is which, in the header row
  QVector<double> markedSteps;
  QStringList markerLabels;
  QCPRange dataX{0, 10}, dataY{0, 1};  // what rescale() fits to
  // The non-finite markers' labels, each with its row from the top: placed in pixels (placeLabels)
  // so that a short docked plot keeps them clear of the curves.
  QVector<std::pair<QCPItemText*, int>> labels;
  int markerRows = 0;
  QCPRange fittedY;  // the y range rescale() last set (a resize refits while it is unchanged)
  // One row of labels, in pixels (the text and its padding).
  static int rowHeight(const QFont& font) { return QFontMetrics(font).height() + 4; }
  // The legend: in its own row under the plot when the plot is tall enough to hold it and a
  // readable axis rect; shorter (a docked plot beside the memory view at 1366x768, where the row
  // was cut in half at the dock's edge), inside the axis rect's corner when two runs need telling
  // apart, and left out for one run (the status bar names it).
  // Shorter, two runs are told apart by a key in the header row: inside the axis rect the legend
  // lay over the curves and the NaN markers' labels (1366x768, comparing).
  void placeLegend(int runs) {
    constexpr int kBelowMinHeight = 170;
    const bool below = runs > 0 && plot->height() >= kBelowMinHeight;
    showLegendBelow(plot, below);
    if (!below) plot->legend->setVisible(false);
    const bool keyed = !below && runs > 1;
    if (keyed) {
      QStringList parts, names;
      for (int i = 0; i < plot->graphCount(); ++i) {
        QCPGraph* g = plot->graph(i);
        if (g->name().isEmpty() || !plot->legend->hasItemWithPlottable(g)) continue;
        parts << QStringLiteral("<span style='color:%1'><b>%2</b></span>&nbsp;%3")
                     .arg(g->pen().color().name(),
                          g->pen().style() == Qt::SolidLine ? QStringLiteral("━━")
                                                            : QStringLiteral("╍╍"),
                          g->name().section(':', 0, 0).toHtmlEscaped());
        names << g->name();
      }
      key->setText(parts.join(QStringLiteral("&nbsp;&nbsp;")));
      key->setToolTip(names.join('\n'));
    }
    key->setVisible(keyed);
  }
  int runs = 0;
  // The top edge's room for the labels' rows, in pixels, and half a point marker below them.
  int labelRoom(const QFont& font) const {
    return markerRows == 0 ? 0 : markerRows * rowHeight(font) + 8;
  }
  // Puts each label's top at its row's pixel offset below the axis rect's top.
  void placeLabels(const QFont& font) {
    const double h = std::max(1, plot->axisRect()->height());
    for (auto [text, row] : labels)
      text->position->setCoords(text->position->coords().x(), (2.0 + row * rowHeight(font)) / h);
  }
};

namespace {

const QColor kColorA(0x1f, 0x77, 0xb4);
const QColor kColorB(0xe0, 0x6c, 0x00);
const QColor kMarker(0xc6, 0x28, 0x28);

storage::StepMetric stepMetric(Metric m) {
  switch (m) {
    case Metric::Loss:
      return storage::StepMetric::Loss;
    case Metric::LearningRate:
      return storage::StepMetric::Lr;
    case Metric::GradNorm:
      return storage::StepMetric::GradNorm;
    case Metric::AuxLoss:
      return storage::StepMetric::AuxLoss;
    case Metric::TokensPerSec:
      return storage::StepMetric::TokensPerSec;
    case Metric::ValidationLoss:
      return storage::StepMetric::ValLoss;
  }
  return storage::StepMetric::Loss;
}

// A run "recorded" a metric when some step reported it: a value or a NaN (Note [Reported NaN];
// a NaN loss is what a user comes to find), not a step that ended without one.
bool recorded(const RunSummary* s, Metric m) {
  if (!s) return false;
  return std::any_of(s->steps.begin(), s->steps.end(),
                     [m](const auto& st) { return st.reported(stepMetric(m)); });
}

QString runLabel(const char* side, const RunSummary& s) {
  QString label = QStringLiteral("%1: %2").arg(QLatin1String(side), recordingName(s.path));
  if (!s.run.backend.empty())
    label += QStringLiteral("  (%1)").arg(QString::fromStdString(s.run.backend));
  return label;
}

QString nonFiniteText(double v) {
  return std::isnan(v) ? QStringLiteral("NaN")
         : v > 0       ? QStringLiteral("+Inf")
                       : QStringLiteral("-Inf");
}

}  // namespace

double metricValue(const storage::StepRecord& s, Metric m) {
  return s.value(stepMetric(m));
}

QString LossPlot::metricName(Metric m) {
  switch (m) {
    case Metric::Loss:
      return tr("loss");
    case Metric::LearningRate:
      return tr("learning rate");
    case Metric::GradNorm:
      return tr("gradient norm");
    case Metric::AuxLoss:
      return tr("MoE aux loss");
    case Metric::TokensPerSec:
      return tr("tokens/s");
    case Metric::ValidationLoss:
      return tr("validation loss");
  }
  return {};
}

LossPlot::LossPlot(QWidget* parent) : QWidget(parent), impl_(std::make_unique<Impl>()) {
  combo_ = new QComboBox;
  combo_->setObjectName("metricCombo");
  combo_->setToolTip(tr("Which per-step metric to plot (as `keel train` prints it)"));
  combo_->setSizeAdjustPolicy(QComboBox::AdjustToContents);  // "loss — not recorded" in full
  for (int i = 0; i < kMetricCount; ++i) combo_->addItem(metricName(Metric(i)), i);
  connect(combo_, &QComboBox::currentIndexChanged, this, [this](int i) {
    if (i >= 0 && Metric(i) != metric_) {
      metric_ = Metric(i);
      rebuild();
    }
  });

  auto* plot = new QCustomPlot(this);
  plot->setObjectName("lossPlot");
  impl_->plot = plot;
  plot->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
  plot->xAxis->setLabel(tr("step"));
  QSharedPointer<QCPAxisTickerFixed> steps(new QCPAxisTickerFixed);
  steps->setTickStep(1.0);
  steps->setScaleStrategy(QCPAxisTickerFixed::ssMultiples);
  plot->xAxis->setTicker(steps);
  plot->xAxis->setSubTicks(false);
  QFont legendFont = font();
  legendFont.setPointSizeF(legendFont.pointSizeF() * 0.9);
  putLegendBelow(plot, legendFont);
  plot->setToolTip(tr("drag to pan, wheel to zoom, double-click to fit"));
  connect(plot, &QCustomPlot::mouseDoubleClick, this, [this](QMouseEvent*) { rescale(); });
  // Hovering a step shows every run's value there, exactly as recorded.
  plot->setMouseTracking(true);
  connect(plot, &QCustomPlot::mouseMove, this, [this, plot](QMouseEvent* e) {
    if (e->buttons() != Qt::NoButton) return;
    const double x = plot->xAxis->pixelToCoord(e->position().x());
    const QString text = valuesAtStep(int64_t(std::llround(x)));
    if (text.isEmpty() || !plot->axisRect()->rect().contains(e->position().toPoint()))
      QToolTip::hideText();
    else
      QToolTip::showText(e->globalPosition().toPoint(), text, plot);
  });

  auto* bar = new QHBoxLayout;
  bar->setContentsMargins(4, 2, 4, 0);
  bar->addWidget(new QLabel(tr("Metric")));
  bar->addWidget(combo_);
  impl_->note = new QLabel;
  impl_->note->setObjectName("metricNote");
  bar->addWidget(impl_->note, 1);
  impl_->key = new QLabel;
  impl_->key->setObjectName("metricKey");
  impl_->key->setTextFormat(Qt::RichText);
  impl_->key->hide();
  bar->addWidget(impl_->key);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->setSpacing(0);
  layout->addLayout(bar);
  layout->addWidget(plot, 1);
  setRuns(nullptr, nullptr);
}

LossPlot::~LossPlot() = default;

QString LossPlot::valuesAtStep(int64_t step) const {
  QStringList parts;
  for (const auto& [run, side] : {std::pair{a_.get(), "A"}, std::pair{b_.get(), "B"}}) {
    if (!run) continue;
    auto it = std::find_if(run->steps.begin(), run->steps.end(),
                           [step](const auto& s) { return s.step == step; });
    if (it == run->steps.end()) continue;
    const double v = metricValue(*it, metric_);
    const QString value = std::isfinite(v) ? QString::number(v, 'g', 8) : nonFiniteText(v);
    parts << (a_ && b_ ? QStringLiteral("%1: %2").arg(QLatin1String(side), value) : value);
  }
  if (parts.isEmpty()) return {};
  return tr("step %1, %2: %3")
      .arg(step)
      .arg(metricName(metric_), parts.join(QStringLiteral(" · ")));
}

bool LossPlot::isAvailable(Metric m) const {
  return recorded(a_.get(), m) || recorded(b_.get(), m);
}

void LossPlot::setRuns(SummaryPtr a, SummaryPtr b) {
  a_ = std::move(a);
  b_ = std::move(b);
  // Offer only what was recorded; say why the rest is not there.
  auto* model = qobject_cast<QStandardItemModel*>(combo_->model());
  for (int i = 0; i < kMetricCount; ++i) {
    const Metric m = Metric(i);
    const bool ok = isAvailable(m);
    QStandardItem* item = model ? model->item(i) : nullptr;
    if (!item) continue;
    item->setEnabled(ok || (!a_ && !b_ && m == Metric::Loss));
    QString text = metricName(m);
    if (!ok && (a_ || b_)) text += tr(" — not recorded");
    item->setText(text);
    item->setToolTip(m == Metric::ValidationLoss && !ok
                         ? tr("Set the config's eval_every to evaluate a validation loss every "
                              "that many steps")
                         : QString());
  }
  if (!isAvailable(metric_) && metric_ != Metric::Loss) metric_ = Metric::Loss;
  combo_->setCurrentIndex(int(metric_));
  rebuild();
}

void LossPlot::setMetric(Metric m) {
  if (!isAvailable(m)) return;
  metric_ = m;
  combo_->setCurrentIndex(int(m));
  rebuild();
}

void LossPlot::rebuild() {
  QCustomPlot* plot = impl_->plot;
  plot->clearGraphs();
  plot->clearItems();
  impl_->markedSteps.clear();
  impl_->markerLabels.clear();
  impl_->labels.clear();
  const bool compare = a_ && b_;
  double xLo = std::numeric_limits<double>::infinity(), xHi = -xLo;
  double yLo = xLo, yHi = -xLo;
  int markerRow = 0;
  auto addRun = [&](const RunSummary& s, const char* side, const QColor& color, bool dashed) {
    QVector<double> x, y;
    QVector<std::pair<int64_t, double>> bad;
    for (const auto& st : s.steps) {
      const double v = metricValue(st, metric_);
      xLo = std::min(xLo, double(st.step));
      xHi = std::max(xHi, double(st.step));
      if (std::isfinite(v)) {
        x << double(st.step);
        y << v;
        yLo = std::min(yLo, v);
        yHi = std::max(yHi, v);
      } else if (st.endNs != 0 && st.reported(stepMetric(metric_))) {  // a NaN or Inf given
        bad.push_back({st.step, v});
      }
    }
    // A run without values has no legend entry for a curve it lacks, unless it is one of two
    // compared and every step it has is non-finite: then its entry says so (B, all NaN, was
    // missing from the comparison's key).
    if (!x.isEmpty() || (compare && !bad.isEmpty())) {
      QCPGraph* g = plot->addGraph();
      g->setName(x.isEmpty() ? tr("%1 — no finite value").arg(runLabel(side, s))
                             : runLabel(side, s));
      QPen pen(color, dashed ? 2.0 : 3.0);
      if (dashed) pen.setStyle(Qt::DashLine);
      g->setPen(pen);
      // A: filled circles under; B: hollow squares on top, so equal values show both.
      g->setScatterStyle(dashed ? QCPScatterStyle(QCPScatterStyle::ssSquare, color, Qt::white, 7)
                                : QCPScatterStyle(QCPScatterStyle::ssDisc, color, color, 8));
      g->setData(x, y, true);
    }
    // Non-finite steps: a dashed line over the plot and, once per run of equal values, a label at
    // the top edge (row by run, so A's and B's labels do not overlap).
    for (int i = 0; i < bad.size(); ++i) {
      const auto [step, v] = bad[i];
      const QString what = nonFiniteText(v);
      const QString label =
          compare ? QStringLiteral("%1: %2").arg(QLatin1String(side), what) : what;
      impl_->markedSteps << double(step);
      impl_->markerLabels << label;
      auto* line = new QCPItemLine(plot);
      line->setPen(QPen(kMarker, 1.5, dashed ? Qt::DotLine : Qt::DashLine));
      for (QCPItemPosition* p : {line->start, line->end}) {
        p->setTypeX(QCPItemPosition::ptPlotCoords);
        p->setTypeY(QCPItemPosition::ptAxisRectRatio);
      }
      line->start->setCoords(double(step), 0);
      line->end->setCoords(double(step), 1);
      const bool startsRun =
          i == 0 || bad[i - 1].first != step - 1 || nonFiniteText(bad[i - 1].second) != what;
      if (!startsRun) continue;
      int runLength = 1;
      while (i + runLength < bad.size() && bad[i + runLength].first == step + runLength &&
             nonFiniteText(bad[i + runLength].second) == what)
        ++runLength;
      auto* text = new QCPItemText(plot);
      text->position->setTypeX(QCPItemPosition::ptPlotCoords);
      text->position->setTypeY(QCPItemPosition::ptAxisRectRatio);
      text->position->setCoords(double(step), 0);
      // Beside its line, towards the middle: centred, the first step's label ran over the axis.
      const double mid = (xLo + xHi) / 2;
      text->setPositionAlignment(Qt::AlignTop |
                                 (double(step) <= mid ? Qt::AlignLeft : Qt::AlignRight));
      impl_->labels.push_back({text, markerRow});
      text->setText(runLength > 1
                        ? tr("%1 at steps %2–%3").arg(label).arg(step).arg(step + runLength - 1)
                        : tr("%1 at step %2").arg(label).arg(step));
      text->setColor(Qt::white);
      text->setBrush(kMarker);
      text->setPadding(QMargins(4, 1, 4, 1));
      text->setClipToAxisRect(false);
    }
    if (!bad.isEmpty()) ++markerRow;
  };
  // The x range first, so that each label knows which side of the middle its step is on.
  for (const RunSummary* s : {a_.get(), b_.get()})
    if (s)
      for (const auto& st : s->steps)
        xLo = std::min(xLo, double(st.step)), xHi = std::max(xHi, double(st.step));
  if (a_) addRun(*a_, "A", kColorA, false);
  if (b_) addRun(*b_, "B", kColorB, true);
  impl_->runs = (a_ ? 1 : 0) + (b_ ? 1 : 0);
  impl_->placeLegend(plot->graphCount() > 0 ? impl_->runs : 0);

  impl_->markerRows = markerRow;
  const QString name = metricName(metric_);
  plot->yAxis->setLabel(name);
  plot->yAxis->setTickLabels(std::isfinite(yLo));  // no scale to read without a finite value
  QString note;
  if (!a_ && !b_)
    note = tr("no recording open");
  else if ((!a_ || a_->steps.empty()) && (!b_ || b_->steps.empty()))
    note = tr("no training steps recorded");
  else if (!recorded(a_.get(), metric_) && !recorded(b_.get(), metric_))
    note = tr("no %1 reported").arg(name);  // a step running, or a run that does not report it
  else if (!std::isfinite(yLo))
    note = tr("no finite value recorded");
  if (!impl_->markedSteps.isEmpty())
    note += (note.isEmpty() ? QString() : QStringLiteral("; ")) +
            QStringLiteral("<span style='color:#c62828'>%1</span>")
                .arg(impl_->markedSteps.size() == 1
                         ? tr("1 step not finite (dashed red)")
                         : tr("%1 steps not finite (dashed red)").arg(impl_->markedSteps.size()));
  impl_->note->setText(note);

  // Tick labels: plain numbers for big ones (tokens/s), powers of ten for tiny ones (learning
  // rates), four significant digits otherwise.
  const double mag = std::isfinite(yLo) ? std::max(std::abs(yLo), std::abs(yHi)) : 1.0;
  if (mag >= 1e4) {
    plot->yAxis->setNumberFormat("f");
    plot->yAxis->setNumberPrecision(0);
  } else if (mag > 0 && mag < 1e-2) {
    plot->yAxis->setNumberFormat("gb");
    plot->yAxis->setNumberPrecision(3);
  } else {
    plot->yAxis->setNumberFormat("g");
    plot->yAxis->setNumberPrecision(4);
  }

  // Never a degenerate range: one step gets ±0.5 around it, one value ±10% (or ±1 around 0).
  if (!std::isfinite(xLo))
    xLo = 0, xHi = 10;
  else
    xLo -= 0.5, xHi += 0.5;
  if (!std::isfinite(yLo)) {
    yLo = 0, yHi = 1;
  } else {
    double pad = (yHi - yLo) * 0.12;
    if (!(pad > 0)) pad = yLo != 0 ? std::abs(yLo) * 0.1 : 1.0;
    yHi += pad;  // rescale() adds the markers' labels' room, in pixels
    yLo -= pad;
  }
  impl_->dataX = QCPRange(xLo, xHi);
  impl_->dataY = QCPRange(yLo, yHi);
  rescale();
}

void LossPlot::resizeEvent(QResizeEvent* e) {
  QWidget::resizeEvent(e);
  impl_->placeLegend(impl_->plot->graphCount() > 0 ? impl_->runs : 0);
  // About one value tick per 30 px of the axis rect (not the widget: the legend and the x axis
  // take most of a docked plot's height), met exactly, so a short plot's labels do not crowd.
  QCPAxisTicker& ticker = *impl_->plot->yAxis->ticker();
  ticker.setTickStepStrategy(QCPAxisTicker::tssMeetTickCount);
  impl_->plot->replot();  // lays the axis rect out at the new size
  ticker.setTickCount(std::clamp(impl_->plot->axisRect()->height() / 30, 2, 6));
  // Still as fitted (not panned or zoomed): fit again, the labels' room depends on the height.
  if (impl_->plot->xAxis->range() == impl_->dataX &&
      impl_->plot->yAxis->range() == impl_->fittedY) {
    rescale();  // replots
    return;
  }
  impl_->placeLabels(font());
  impl_->plot->replot();
}

void LossPlot::rescale() {
  QCustomPlot* plot = impl_->plot;
  plot->xAxis->setRange(impl_->dataX);
  QCPRange y = impl_->dataY;
  // The labels' rows take the top `room` pixels of the axis rect: the curves go below them.
  plot->replot();  // the axis rect at its current size
  const int h = plot->axisRect()->height(), room = impl_->labelRoom(font());
  if (room > 0 && h > room + 8) y.upper += y.size() * room / double(h - room);
  plot->yAxis->setRange(y);
  impl_->fittedY = y;
  impl_->placeLabels(font());
  plot->replot();
}

int LossPlot::graphCount() const {
  return impl_->plot->graphCount();
}

int LossPlot::pointCount(int graph) const {
  if (graph < 0 || graph >= impl_->plot->graphCount()) return 0;
  return impl_->plot->graph(graph)->dataCount();
}

QString LossPlot::graphName(int graph) const {
  if (graph < 0 || graph >= impl_->plot->graphCount()) return {};
  return impl_->plot->graph(graph)->name();
}

QVector<QPointF> LossPlot::points(int graph) const {
  QVector<QPointF> out;
  if (graph < 0 || graph >= impl_->plot->graphCount()) return out;
  for (const auto& d : *impl_->plot->graph(graph)->data()) out << QPointF(d.key, d.value);
  return out;
}

QPen LossPlot::graphPen(int graph) const {
  if (graph < 0 || graph >= impl_->plot->graphCount()) return {};
  return impl_->plot->graph(graph)->pen();
}

QVector<double> LossPlot::markedSteps() const {
  return impl_->markedSteps;
}

QStringList LossPlot::markerLabels() const {
  return impl_->markerLabels;
}

std::pair<double, double> LossPlot::xRange() const {
  const QCPRange r = impl_->plot->xAxis->range();
  return {r.lower, r.upper};
}

QRect LossPlot::axisRectGeometry() const {
  return impl_->plot->axisRect()->rect();
}

QRect LossPlot::legendGeometry() const {
  return impl_->plot->legend->visible() ? impl_->plot->legend->outerRect() : QRect();
}

QVector<QRectF> LossPlot::markerLabelRects() const {
  QVector<QRectF> out;
  for (const auto& [text, row] : impl_->labels) {
    const QPointF topLeft = text->topLeft->pixelPosition();
    const QPointF bottomRight = text->bottomRight->pixelPosition();
    out << QRectF(topLeft, bottomRight).normalized();
  }
  return out;
}

QVector<QPointF> LossPlot::pointPixels(int graph) const {
  QVector<QPointF> out;
  if (graph < 0 || graph >= impl_->plot->graphCount()) return out;
  QCPGraph* g = impl_->plot->graph(graph);
  for (const auto& d : *g->data()) out << g->coordsToPixels(d.key, d.value);
  return out;
}

std::pair<double, double> LossPlot::yRange() const {
  const QCPRange r = impl_->plot->yAxis->range();
  return {r.lower, r.upper};
}

}  // namespace keel::views
