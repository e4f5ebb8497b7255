// The metrics plot (the "Metrics" dock): one per-step metric of run A, and of run B when
// comparing — loss, learning rate, gradient norm, MoE aux loss or tokens/s, picked in a combo box
// — as a QCustomPlot (kept out of this header). A is solid, B dashed on top, so both show where
// they coincide. Steps whose value is NaN or infinite are marked at the plot's top edge, not
// dropped.
#pragma once
#include <QPen>
#include <QPointF>
#include <QVector>
#include <QWidget>
#include <cstdint>
#include <memory>
#include <utility>

#include "keel/views/run_data.h"

class QComboBox;

namespace keel::views {

// What the plot can show, in the combo box's order. A metric a recording lacks (a validation loss
// without the config's eval_every, aux loss of a dense model) is listed disabled, saying so.
enum class Metric { Loss, LearningRate, GradNorm, AuxLoss, TokensPerSec, ValidationLoss };
inline constexpr int kMetricCount = 6;

// The step record's value of metric `m` (NaN where the run did not report it).
double metricValue(const storage::StepRecord& s, Metric m);

class LossPlot : public QWidget {
  Q_OBJECT
 public:
  explicit LossPlot(QWidget* parent = nullptr);
  ~LossPlot() override;

  // Plots `a` (and `b` when given); either may be null. Call again after a live run's refresh.
  void setRuns(SummaryPtr a, SummaryPtr b = nullptr);
  void clear() { setRuns(nullptr, nullptr); }
  // Shows `m` (if some run recorded it; else the plot stays on the current metric).
  void setMetric(Metric m);
  Metric metric() const { return metric_; }
  // Whether run A or B has at least one recorded (non-NaN) value of `m`.
  bool isAvailable(Metric m) const;
  // Fits both axes to the data.
  void rescale();

  int graphCount() const;
  int pointCount(int graph) const;  // 0 for a graph that does not exist
  QString graphName(int graph) const;
  QVector<QPointF> points(int graph) const;  // (step, value) of the finite values
  QPen graphPen(int graph) const;
  // The steps marked non-finite, and each marker's label ("NaN", "B: +Inf", ...), in order.
  QVector<double> markedSteps() const;
  QStringList markerLabels() const;
  std::pair<double, double> xRange() const;
  std::pair<double, double> yRange() const;
  // Pixel geometry, in the plot widget: the axis rect, the markers' labels (one per run of equal
  // values), and where each curve point is drawn.
  QRect axisRectGeometry() const;
  QRect legendGeometry() const;  // empty when the legend is not shown
  QVector<QRectF> markerLabelRects() const;
  QVector<QPointF> pointPixels(int graph) const;
  QComboBox* metricCombo() const { return combo_; }
  // The hover text at `step`: "step 2, loss: A: 5.5500001 · B: NaN"; empty past the runs.
  QString valuesAtStep(int64_t step) const;

  static QString metricName(Metric m);

 protected:
  void resizeEvent(QResizeEvent* e) override;

 private:
  void rebuild();

  struct Impl;
  std::unique_ptr<Impl> impl_;
  QComboBox* combo_ = nullptr;
  Metric metric_ = Metric::Loss;
  SummaryPtr a_, b_;
};

}  // namespace keel::views
