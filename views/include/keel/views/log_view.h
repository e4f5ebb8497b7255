// The log panel: every recorded log line (step, op, level, scope, message) in one LogModel, with
// level / scope-prefix / text filters in one LogFilterProxy. Clicking a line selects its op in the
// shared Selection (lines logged outside any op, opSeq 0, select nothing).
#pragma once
#include <QColor>
#include <QSortFilterProxyModel>
#include <QWidget>
#include <string>

#include "keel/views/record_table_model.h"
#include "keel/views/run_data.h"

class QComboBox;
class QLabel;
class QLineEdit;
class QTableView;

namespace keel::views {

class Selection;

// Text colour of a level (errors red, warnings amber, debug/verbose grey); invalid for info.
QColor logLevelColor(storage::LogLevel level);

class LogModel : public RecordTableModel {
  Q_OBJECT
 public:
  enum Column { Step, OpSeq, Level, Scope, Message, ColumnCount };
  enum Role {
    LevelRole = Qt::UserRole + 1,  // int: storage::LogLevel (any column)
    OpSeqRole,                     // quint64: the op's seq, 0 outside ops (any column)
  };

  explicit LogModel(QObject* parent = nullptr);
  void setLogs(LogsPtr logs);  // nullptr empties the table
  LogsPtr logs() const { return logs_; }
  const storage::LogRecord* lineAt(int row) const;

  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;

 private:
  int recordCount() const override;

  LogsPtr logs_;
};

// Keeps lines at or below a level (Error < Warn < Info < Debug < Verbose) whose scope lies within
// a scope (keel::scopeWithin: "blocks.1" keeps "blocks.1.attn", not "blocks.10") and whose
// message contains a text (any case); an empty scope or text keeps all.
class LogFilterProxy : public QSortFilterProxyModel {
  Q_OBJECT
 public:
  explicit LogFilterProxy(QObject* parent = nullptr);
  void setMaxLevel(storage::LogLevel level);
  void setScopePrefix(const QString& prefix);
  void setText(const QString& text);
  storage::LogLevel maxLevel() const { return maxLevel_; }

 protected:
  bool filterAcceptsRow(int sourceRow, const QModelIndex& sourceParent) const override;

 private:
  storage::LogLevel maxLevel_ = storage::LogLevel::Verbose;
  QString scope_, text_;
  std::string scopeUtf8_;  // scope_ as scopeWithin compares it
};

class LogView : public QWidget {
  Q_OBJECT
 public:
  LogView(Selection* selection, Side side, QWidget* parent = nullptr);

  void setLogs(LogsPtr logs);
  void clear() { setLogs(nullptr); }

  // The filter bar's controls, set from code (the widgets follow).
  void setMaxLevel(storage::LogLevel level);
  void setScopeFilter(const QString& prefix);
  void setTextFilter(const QString& text);

  LogModel* model() const { return model_; }
  LogFilterProxy* proxy() const { return proxy_; }
  QTableView* table() const { return table_; }

 private:
  void selectRow(const QModelIndex& proxyIndex);
  void onSelected(Side side, quint64 seq);
  void updateCount();

  Selection* selection_;
  Side side_;
  LogModel* model_;
  LogFilterProxy* proxy_;
  QTableView* table_;
  QComboBox* level_;
  QLineEdit* scope_;
  QLineEdit* text_;
  QLabel* count_;
  bool syncing_ = false;  // true while filters move the current row
};

}  // namespace keel::views
