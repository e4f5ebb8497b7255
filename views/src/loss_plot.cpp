// LossPlot: see loss_plot.h. The only QCustomPlot user among the panels; qcustomplot.h stays in
// this file (Impl holds the plot).
#include "keel/views/loss_plot.h"

#include <qcustomplot.h>

#include <QFileInfo>
#include <QVBoxLayout>
#include <algorithm>
#include <cmath>

namespace keel::views {

struct LossPlot::Impl {
  QCustomPlot* plot = nullptr;
  QCPTextElement* title = nullptr;
};

namespace {

QString runLabel(const char* side, const RunSummary& s) {
  QString label = QStringLiteral("%1: %2").arg(QLatin1String(side), QFileInfo(s.path).fileName());
  if (!s.run.backend.empty())
    label += QStringLiteral("  (%1)").arg(QString::fromStdString(s.run.backend));
  return label;
}

void addRun(QCustomPlot* plot, const RunSummary& s, const QString& name, const QColor& color,
            QCPScatterStyle::ScatterShape shape) {
  QVector<double> x, y;
  for (const auto& st : s.steps) {
    if (!std::isfinite(st.loss)) continue;
    x << double(st.step);
    y << st.loss;
  }
  QCPGraph* g = plot->addGraph();
  g->setName(name);
  g->setPen(QPen(color, 2));
  g->setScatterStyle(QCPScatterStyle(shape, color, color, 7));
  g->setData(x, y, true);
}

}  // namespace

LossPlot::LossPlot(QWidget* parent) : QWidget(parent), impl_(std::make_unique<Impl>()) {
  auto* plot = new QCustomPlot(this);
  plot->setObjectName("lossPlot");
  impl_->plot = plot;
  plot->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
  plot->xAxis->setLabel(tr("step"));
  plot->yAxis->setLabel(tr("loss"));
  QSharedPointer<QCPAxisTickerFixed> steps(new QCPAxisTickerFixed);
  steps->setTickStep(1.0);
  steps->setScaleStrategy(QCPAxisTickerFixed::ssMultiples);
  plot->xAxis->setTicker(steps);
  plot->xAxis->setSubTicks(false);
  plot->legend->setVisible(true);
  plot->legend->setBrush(QColor(255, 255, 255, 220));
  // The legend sits in its own row under the plot: inside the axis rect it hid the curves of a
  // small (docked) plot.
  plot->axisRect()->insetLayout()->take(plot->legend);
  plot->plotLayout()->addElement(1, 0, plot->legend);
  plot->legend->setFillOrder(QCPLayoutGrid::foColumnsFirst);
  plot->legend->setBorderPen(Qt::NoPen);
  QFont legendFont = font();
  legendFont.setPointSizeF(legendFont.pointSizeF() * 0.85);
  plot->legend->setFont(legendFont);
  plot->plotLayout()->setRowStretchFactor(1, 0.001);
  plot->plotLayout()->insertRow(0);
  QFont titleFont = font();
  titleFont.setBold(true);
  impl_->title = new QCPTextElement(plot, tr("Loss per step"), titleFont);
  plot->plotLayout()->addElement(0, 0, impl_->title);
  plot->setToolTip(tr("drag to pan, wheel to zoom, double-click to fit"));
  connect(plot, &QCustomPlot::mouseDoubleClick, this, [this](QMouseEvent*) { rescale(); });

  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->addWidget(plot);
  setRuns(nullptr, nullptr);
}

LossPlot::~LossPlot() = default;

void LossPlot::setRuns(SummaryPtr a, SummaryPtr b) {
  QCustomPlot* plot = impl_->plot;
  plot->clearGraphs();
  if (a) addRun(plot, *a, runLabel("A", *a), QColor(0x1f, 0x77, 0xb4), QCPScatterStyle::ssCircle);
  if (b) addRun(plot, *b, runLabel("B", *b), QColor(0xe0, 0x6c, 0x00), QCPScatterStyle::ssSquare);
  plot->legend->setVisible(plot->graphCount() > 0);
  impl_->title->setText(plot->graphCount() > 0 ? tr("Loss per step")
                                               : tr("Loss per step — no recording open"));
  rescale();
}

void LossPlot::rescale() {
  QCustomPlot* plot = impl_->plot;
  bool any = false;
  for (int i = 0; i < plot->graphCount(); ++i) any = any || plot->graph(i)->dataCount() > 0;
  if (!any) {
    plot->xAxis->setRange(0, 10);
    plot->yAxis->setRange(0, 1);
  } else {
    plot->rescaleAxes();
    // Margins so the first and last points and the legend do not sit on the frame.
    QCPRange x = plot->xAxis->range(), y = plot->yAxis->range();
    const double padY = y.size() > 0 ? y.size() * 0.15 : std::max(std::abs(y.center()) * 0.05, 0.5);
    plot->xAxis->setRange(x.lower - 0.5, x.upper + 0.5);
    plot->yAxis->setRange(y.lower - padY, y.upper + padY * 2);
  }
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

}  // namespace keel::views
