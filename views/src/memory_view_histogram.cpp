// The memory view's size histogram: the live blocks at the cursor in log2 size classes, a
// QCPBars plot with a tooltip per bucket (MemoryModel::histogram).
#include <QMouseEvent>
#include <QToolTip>
#include <cmath>

#include "memory_view_impl.h"

namespace keel::views {

using namespace memory_detail;
using analysis::MemBucket;
using analysis::MemoryModel;

void MemoryView::Impl::buildHistogram() {
  hist = new QCustomPlot(q);
  hist->setObjectName("memoryHistogram");
  hist->setMinimumSize(120, 90);
  const QFont small = smallFont(0.85);
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

int MemoryView::histogramBuckets() const {
  return int(d_->buckets.size());
}

}  // namespace keel::views
