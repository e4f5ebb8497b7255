// The op table: every op of one step as a sortable, filterable table (seq, name, phase, scope,
// time, output shape, MD5, NaN/Inf). One OpTableModel feeds one OpFilterProxy that applies every
// filter; rows follow the shared Selection both ways (click selects, selected() scrolls to it);
// a row's context menu offers "Break here" (breakHereRequested).
#pragma once
#include <QSortFilterProxyModel>
#include <QWidget>
#include <cstdint>

#include "keel/views/record_table_model.h"
#include "keel/views/run_data.h"

class QCheckBox;
class QComboBox;
class QLabel;
class QLineEdit;
class QTableView;

namespace keel::views {

class Selection;

class OpTableModel : public RecordTableModel {
  Q_OBJECT
 public:
  enum Column { Seq, Name, Phase, Scope, Time, OutputShape, Md5, NonFinite, ColumnCount };
  enum Role {
    SortRole = Qt::UserRole + 1,  // numbers for numeric columns, text otherwise
    SeqRole,                      // quint64: the op's seq (any column)
    NonFiniteRole,                // qint64: NaN + Inf count over the outputs (any column)
  };

  explicit OpTableModel(QObject* parent = nullptr);

  void setStep(StepPtr step);  // nullptr empties the table
  StepPtr step() const { return step_; }
  const storage::OpRecord* opAt(int row) const;
  int rowOf(uint64_t seq) const;  // -1 when the op is not in this step

  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;

 private:
  int recordCount() const override;

  StepPtr step_;
};

// Every filter of the op table in one proxy: text (substring of name or scope, any case), phase
// (exact; empty = all) and non-finite outputs only. Sorts on OpTableModel::SortRole.
class OpFilterProxy : public QSortFilterProxyModel {
  Q_OBJECT
 public:
  explicit OpFilterProxy(QObject* parent = nullptr);
  void setText(const QString& text);
  void setPhase(const QString& phase);
  void setNonFiniteOnly(bool on);
  QString text() const { return text_; }
  QString phase() const { return phase_; }
  bool nonFiniteOnly() const { return nonFiniteOnly_; }

 protected:
  bool filterAcceptsRow(int sourceRow, const QModelIndex& sourceParent) const override;

 private:
  QString text_, phase_;
  bool nonFiniteOnly_ = false;
};

class OpTableView : public QWidget {
  Q_OBJECT
 public:
  OpTableView(Selection* selection, Side side, QWidget* parent = nullptr);

  void setStep(StepPtr step);
  void clear() { setStep(nullptr); }

  // The filter bar's controls, set from code (the widgets follow).
  void setTextFilter(const QString& text);
  void setPhaseFilter(const QString& phase);  // "" (all) | forward | backward | optimizer
  void setNonFiniteOnly(bool on);

  OpTableModel* model() const { return model_; }
  OpFilterProxy* proxy() const { return proxy_; }
  QTableView* table() const { return table_; }

 signals:
  void breakHereRequested(quint64 seq);  // the context menu's "Break here" on op `seq`

 private:
  void onSelected(Side side, quint64 seq);
  void onCurrentChanged(const QModelIndex& current);
  void selectRow(const QModelIndex& proxyIndex);
  void updateCount();

  Selection* selection_;
  Side side_;
  OpTableModel* model_;
  OpFilterProxy* proxy_;
  QTableView* table_;
  QLineEdit* text_;
  QComboBox* phase_;
  QCheckBox* nonFinite_;
  QLabel* count_;
  bool syncing_ = false;  // true while the view itself moves the current row
};

}  // namespace keel::views
