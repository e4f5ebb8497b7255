// The inspector: everything recorded about one op (OpDetails) — header, attributes, input and
// output tensors with MD5 and statistics, dumped values, call stack, log lines, allocations, and
// for flashmask_attention (forward and backward) the mask as a picture of its tile grid — in tabs
// of selectable, copyable tables. It only displays what it is given: setDetails().
#pragma once
#include <QWidget>

#include "keel/views/run_data.h"

class QLabel;
class QPlainTextEdit;
class QTabWidget;
class QTableWidget;
class QTreeWidget;

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

  // Tab order, for tests and for callers that want to open one tab. The Mask tab is shown only for
  // ops that recorded a tile map; such an op opens on it unless another tab than Tensors is open.
  enum Tab { Tensors, Attributes, Values, Stack, Logs, Memory, Mask, TabCount };
  QTabWidget* tabs() const { return tabs_; }

 protected:
  void resizeEvent(QResizeEvent* e) override;

 private:
  void setHeader(const QString& text);
  void fitHeader();
  void fillTensors(const OpDetails& d);
  void fillAttributes(const OpDetails& d);
  void fillValues(const OpDetails& d);
  void fillStack(const OpDetails& d);
  void fillLogs(const OpDetails& d);
  void fillMemory(const OpDetails& d);
  void fillMask(const OpDetails& d);
  void setTabCount(Tab tab, const QString& title, qsizetype count);

  Selection* selection_;
  Side side_;
  OpDetailsPtr details_;
  QLabel* header_;
  QLabel* error_;
  QTabWidget* tabs_;
  QTableWidget* tensors_;
  QTreeWidget* attributes_;
  QPlainTextEdit* values_;
  QTableWidget* stack_;
  QTableWidget* logs_;
  QTableWidget* memory_;
  QWidget* maskPage_;
  QLabel* maskSummary_;
  MaskPicture* maskPicture_;
  QLabel* maskLegend_[3];
};

}  // namespace keel::views
