// The loss plot: loss per step of run A, and of run B when comparing, as a QCustomPlot (kept out
// of this header). Mouse drag pans, the wheel zooms, a double click fits the data again. Steps
// whose loss is unknown (NaN) or infinite are left out of the line.
#pragma once
#include <QWidget>
#include <memory>

#include "keel/views/run_data.h"

namespace keel::views {

class LossPlot : public QWidget {
  Q_OBJECT
 public:
  explicit LossPlot(QWidget* parent = nullptr);
  ~LossPlot() override;

  // Plots `a` (and `b` when given); either may be null. Call again after a live run's refresh.
  void setRuns(SummaryPtr a, SummaryPtr b = nullptr);
  void clear() { setRuns(nullptr, nullptr); }
  // Fits both axes to the data.
  void rescale();

  int graphCount() const;
  int pointCount(int graph) const;  // 0 for a graph that does not exist
  QString graphName(int graph) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel::views
