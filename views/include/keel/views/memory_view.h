// The memory view: a recording's allocator events (analysis::MemoryModel) as an active-memory
// timeline (every live allocation a band) over a plot of allocated, reserved and cached free
// memory, with a cursor that scrubs through the events and follows the step shown; the block map
// at the cursor (segments and blocks by state or by owning op; tooltips say what a block holds and
// why it is still alive) with cached free memory, the largest free block and fragmentation named
// as `keel memory stats` names them; a size histogram and the tracked-section summaries.
// Clicking a block selects its op in the shared Selection; selecting an op elsewhere highlights
// its blocks and moves the cursor to the op's last event. QCustomPlot stays out of this header.
#pragma once
#include <QRect>
#include <QStringList>
#include <QVector>
#include <QWidget>
#include <memory>
#include <vector>

#include "keel/analysis/memory_model.h"
#include "keel/views/record_table_model.h"
#include "keel/views/run_data.h"

namespace keel::views {

class Selection;

// The tracked sections (track_begin/track_end pairs) of a MemoryModel, one row each.
class MemSectionModel : public RecordTableModel {
  Q_OBJECT
 public:
  // What shows a leak first (it sat behind a horizontal scroll bar at 1366 and at 1920 pixels).
  enum Column { Name, Alive, AliveOps, Peak, Allocated, Allocs, Frees, Events, ColumnCount };
  enum Role { EndEventRole = Qt::UserRole + 1 };  // qint64: the section's end event, or last event

  explicit MemSectionModel(QObject* parent = nullptr);
  void setMemory(MemoryPtr memory);
  const analysis::MemSection* sectionAt(int row) const;

  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;

 private:
  int recordCount() const override;

  MemoryPtr memory_;
};

class MemoryView : public QWidget {
  Q_OBJECT
 public:
  MemoryView(Selection* selection, Side side, QWidget* parent = nullptr);
  ~MemoryView() override;

  // Shows `memory` (nullptr: "no recording open"). A new model of the same run (a live refresh)
  // keeps the cursor, or keeps it on the last event when it was there.
  void setMemory(MemoryPtr memory);
  void clear() { setMemory(nullptr); }
  // Replaces the view by a message (loading, an error).
  void showMessage(const QString& text);
  MemoryPtr memory() const;

  // The cursor: the block map shows memory right after this event (-1: no events).
  int64_t cursor() const;
  void setCursor(int64_t event);
  int64_t eventCount() const;
  const analysis::MemState& state() const;    // at the cursor
  const analysis::MemLayout& layout() const;  // the block map's pieces
  // Blocks (indexes into state().blocks) of the highlighted op.
  const std::vector<size_t>& highlightedBlocks() const;

  // The step the studio shows: the cursor moves to that step's peak of allocated memory, unless
  // it is in that step already (a step asked for before the model came applies when it comes).
  void showStep(int64_t step);
  // The figures (Note [Memory figures]) at the cursor and at the peak of allocated memory.
  analysis::MemFigures figures() const;
  analysis::MemFigures peakFigures() const;
  // The range of events the timelines show (the active-memory bands replay only it).
  void setRange(int64_t first, int64_t last);
  std::pair<int64_t, int64_t> range() const;
  // The active-memory timeline: the widget, the bands it draws (laid out at the next paint, or now
  // with layoutActive()), and its tooltip at `pos` (the widget's coordinates).
  QWidget* activeMemory() const;
  const analysis::MemBands& activeBands() const;
  void layoutActive();
  QString activeToolTip(QPoint pos) const;
  QPoint activePoint(int64_t event, uint64_t bytes) const;  // where (event, bytes high) is drawn
  // The step labels shown on the timeline plot, in its coordinates (they never overlap).
  QVector<QRect> stepLabelRects() const;
  QStringList stepLabelTexts() const;

  void setColorByOp(bool on);
  bool colorByOp() const;
  void setScale(analysis::MemScale scale);

  // What the view says: the message instead of the view ("" when the view shows), the header
  // (event count, allocator, peaks), the cursor line, the block map caption, the note shown
  // for host-allocator recordings ("" when hidden).
  QString message() const;
  QString headerText() const;
  QString cursorText() const;
  QString mapCaption() const;
  QString hostNote() const;
  // The tooltip of block `index` of state() (rich text), and of the block map at `pos` (in the
  // map widget's coordinates); empty over nothing.
  QString blockToolTip(size_t index) const;
  // The block map widget, the timeline plot, the histogram bucket count shown, the sections model.
  QWidget* blockMap() const;
  QWidget* timeline() const;
  // Where event `k` is on the timeline, and where live block `index` of state() is drawn on the
  // block map (widget coordinates; (-1, -1) when not shown): what a click there picks.
  QPoint timelinePoint(int64_t k) const;
  QPoint blockPoint(size_t index) const;
  int histogramBuckets() const;
  MemSectionModel* sectionModel() const;

 signals:
  void cursorChanged(qint64 event);
  // The user clicked a live block; its op (0: allocated outside ops) was selected.
  void blockClicked(quint64 opSeq, qint64 step);

 protected:
  void keyPressEvent(QKeyEvent* e) override;
  void resizeEvent(QResizeEvent* e) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> d_;
};

}  // namespace keel::views
