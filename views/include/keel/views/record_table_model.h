// The base of the studio's record tables (op table, diff, logs, memory sections): a flat, read-only
// table whose columns are fixed at construction (a title and an optional tooltip each), so row and
// column counts and the header are answered in one place; a model says how many records it holds
// and what each cell shows.
#pragma once
#include <QAbstractTableModel>
#include <QString>
#include <utility>
#include <vector>

namespace keel::views {

class RecordTableModel : public QAbstractTableModel {
 public:
  struct Column {
    // Implicit from a title alone: a column list reads {tr("Step"), tr("Op"), {tr("Max"), tip}}.
    Column(QString title, QString tip = {}) : title(std::move(title)), tip(std::move(tip)) {}
    QString title;
    QString tip;  // empty: no tooltip
  };

  int rowCount(const QModelIndex& parent = {}) const final;
  int columnCount(const QModelIndex& parent = {}) const final;
  QVariant headerData(int section, Qt::Orientation orientation,
                      int role = Qt::DisplayRole) const final;

 protected:
  // `columns` in the order of the model's Column enum.
  RecordTableModel(std::vector<Column> columns, QObject* parent);
  virtual int recordCount() const = 0;

 private:
  std::vector<Column> columns_;
};

}  // namespace keel::views
