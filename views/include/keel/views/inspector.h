// The inspector: everything recorded about one op (OpDetails) — header, attributes, input and
// output tensors with MD5 and statistics, dumped values, call stack, log lines, allocations, and
// for flashmask_attention (forward and backward) the mask as a picture of its tile grid — in tabs
// of selectable, copyable tables. When comparing two runs it shows the selected pair: A and B side
// by side, each labelled with its run, and their difference. It only displays what it is given.
#pragma once
#include <QWidget>

#include "keel/views/run_data.h"

class QLabel;
class QPlainTextEdit;
class QTabWidget;
class QTableWidget;
class QTreeWidget;
class QTreeWidgetItem;

namespace keel::views {

class MaskPicture;
class Selection;

class InspectorView : public QWidget {
  Q_OBJECT
 public:
  // `selection` (may be null) is told when the user follows the forward-op link of a backward op.
  InspectorView(Selection* selection, Side side, QWidget* parent = nullptr);

  // Shows `details`; details->error, when set, replaces the tabs with the message.
  void setDetails(OpDetailsPtr details);
  void clear();
  OpDetailsPtr details() const { return details_; }

  // Comparing two runs: each side is labelled (e.g. "a.db · cpu"); from then on setDetails(side,
  // d) keeps one op per side and the inspector shows both, side by side. The element-wise
  // difference of outputs comes from `report` (the whole tensors' dumps) when it has the pair,
  // else from storage::compareTensors on what the two OpDetails hold.
  void setCompare(const QString& labelA, const QString& labelB);
  void setDetails(Side side, OpDetailsPtr details);
  void setDiff(DiffPtr report);
  bool comparing() const { return comparing_; }
  OpDetailsPtr details(Side side) const { return pair_[int(side)]; }
  // The difference shown for (role, index) of the pair on screen; nullopt when there is none.
  std::optional<storage::TensorDiff> tensorDiff(storage::Role role, int32_t index) const;

  // Tab order, for tests and for callers that want to open one tab. The Mask tab is shown only for
  // ops that recorded a tile map; such an op opens on it unless another tab than Tensors is open.
  enum Tab { Tensors, Attributes, Values, Stack, Logs, Memory, Mask, TabCount };
  QTabWidget* tabs() const { return tabs_; }

 protected:
  void resizeEvent(QResizeEvent* e) override;

 private:
  void resetTabs();
  void setHeader(const QString& text);
  void fitHeader();
  void fillTensors(const OpDetails& d);
  void fillAttributes(const OpDetails& d);
  void fillValues(const OpDetails& d);
  void fillStack(const OpDetails& d);
  void fillLogs(const OpDetails& d);
  void fillMemory(const OpDetails& d);
  void appendLogs(const OpDetails& d, std::optional<Side> side);
  void appendMemory(const OpDetails& d, std::optional<Side> side);
  void markRowSide(QTableWidget* t, int row, std::optional<Side> side);
  void fillPairAttributes(const OpDetails& a, const OpDetails& b);
  void fillPairLogsAndMemory(const OpDetails& a, const OpDetails& b);
  void fillMask(const OpDetails& d);
  void setTabCount(Tab tab, const QString& title, qsizetype count);
  void showPair();
  void fillPairTensors(const OpDetails& a, const OpDetails& b);
  void fillPairValues(const OpDetails& a, const OpDetails& b);
  void fillPairStack(const OpDetails& a, const OpDetails& b);
  void addFrames(QTreeWidgetItem* parent, const OpDetails& d);
  QString sideLabel(Side side) const;

  Selection* selection_;
  Side side_;
  OpDetailsPtr details_;
  QLabel* header_;
  QLabel* error_;
  QTabWidget* tabs_;
  QTreeWidget* tensors_;
  QTreeWidget* attributes_;
  QPlainTextEdit* values_;
  QTreeWidget* stack_;
  QTableWidget* logs_;
  QTableWidget* memory_;
  QWidget* maskPage_;
  QLabel* maskSummary_;
  MaskPicture* maskPicture_;
  QLabel* maskLegend_[3];
  bool comparing_ = false;
  QString labels_[2];
  OpDetailsPtr pair_[2];
  DiffPtr diff_;
  std::vector<storage::TensorDiff> pairDiffs_;  // of the pair on screen, by (role, index)
};

}  // namespace keel::views
