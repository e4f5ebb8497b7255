// The timeline: the shown step's ops as bars over time, one row per engine thread (Nsight Systems'
// CPU rows; GPU stream rows join it when the CUDA backend records them). TimelineModel is the pure
// part (rows, bars, level of detail); TimelineView paints it, zooms and pans, and shares the
// selection. See Note [Timeline level of detail].
#pragma once
#include <QRectF>
#include <QWidget>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "keel/views/run_data.h"

namespace keel::views {

class Selection;

// One op as a bar: [begin, end) in ns from the step's first op.
struct TimelineBar {
  int64_t begin = 0, end = 0;
  uint64_t seq = 0;
  Phase phase = Phase::Forward;
  int32_t op = 0;  // index into StepData::ops
};

struct TimelineRow {
  int64_t thread = 0;
  QString label;                  // "thread 0"
  std::vector<TimelineBar> bars;  // by begin
  std::vector<int64_t> maxEnd;    // maxEnd[i]: the latest end among bars[0..i] (hit testing)
};

// Note [Timeline level of detail]: a step can hold tens of thousands of ops, most of them far
// narrower than a pixel at the fitted zoom. Each row draws, left to right, bars at least a pixel
// wide as themselves and merges a run of narrower bars whose pixels touch (gap under a pixel) into
// one rect, so painting costs O(visible pixels), not O(ops), and a dense stretch reads as busy.
struct TimelineRect {
  double x0 = 0, x1 = 0;     // pixels from the view's left edge (t0)
  int first = 0, count = 1;  // bars[first, first + count) of the row
};

struct TimelineModel {
  std::vector<TimelineRow> rows;  // by thread id
  int64_t originNs = 0;           // the step's first op begin (recording clock)
  int64_t spanNs = 0;             // last end - origin

  static TimelineModel build(const StepData& step);
  // (row, bar index) of the op with `seq`.
  std::optional<std::pair<int, int>> find(uint64_t seq) const;
  // The rects `row` draws for the window starting at t0 (ns) at pxPerNs over widthPx pixels.
  static std::vector<TimelineRect> rects(const TimelineRow& row, double t0, double pxPerNs,
                                         double widthPx);
};

class TimelineView : public QWidget {
  Q_OBJECT
 public:
  TimelineView(Selection* selection, Side side, QWidget* parent = nullptr);
  ~TimelineView() override;

  void setStep(StepPtr step);  // nullptr empties it
  // Why a step of this recording may have no ops (GraphView::setEmptyStepNote); "" for none.
  void setEmptyStepNote(const QString& note) { emptyStepNote_ = note; }
  QString emptyText() const;  // what it says when the step shown has no ops
  void clear() { setStep(nullptr); }

  const TimelineModel& model() const { return model_; }
  int rowCount() const { return int(model_.rows.size()); }
  // The visible window, ns from the step's first op.
  std::pair<double, double> viewRange() const { return {t0_, t0_ + span_}; }
  void setViewRange(double t0, double t1);
  void fit();
  // Where the bar of `seq` is drawn (widget coordinates, at least a pixel wide); empty if none.
  QRectF barRect(uint64_t seq) const;
  QRectF rowRect(int row) const;
  std::optional<uint64_t> highlighted() const { return highlighted_; }
  // The op under a widget position (a bar, or the nearest bar within a few pixels), if any.
  std::optional<uint64_t> opAt(QPointF pos) const;
  // Rects drawn by the last paint, all rows together (level of detail at work).
  int paintedRects() const { return paintedRects_; }

  QSize sizeHint() const override { return {900, 160}; }

 protected:
  void paintEvent(QPaintEvent*) override;
  void mousePressEvent(QMouseEvent*) override;
  void mouseMoveEvent(QMouseEvent*) override;
  void mouseReleaseEvent(QMouseEvent*) override;
  void mouseDoubleClickEvent(QMouseEvent*) override;
  void wheelEvent(QWheelEvent*) override;
  void keyPressEvent(QKeyEvent*) override;
  bool event(QEvent*) override;

 private:
  void onSelected(Side side, quint64 seq);
  void scrollIntoView(const TimelineBar& bar);
  void zoomAt(double x, double factor);
  double plotLeft() const;
  double plotWidth() const;
  double xOf(double ns) const;
  double pxPerNs() const;

  Selection* selection_;
  Side side_;
  StepPtr step_;
  QString emptyStepNote_;
  TimelineModel model_;
  double t0_ = 0, span_ = 1;
  std::optional<uint64_t> highlighted_;
  int gutter_ = 80;
  QPointF pressPos_;
  double pressT0_ = 0;
  bool dragging_ = false;
  bool pressed_ = false;
  mutable int paintedRects_ = 0;
};

}  // namespace keel::views
