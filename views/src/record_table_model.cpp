// See record_table_model.h.
#include "keel/views/record_table_model.h"

#include <utility>

namespace keel::views {

RecordTableModel::RecordTableModel(std::vector<Column> columns, QObject* parent)
    : QAbstractTableModel(parent), columns_(std::move(columns)) {}

int RecordTableModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : recordCount();
}

int RecordTableModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : int(columns_.size());
}

QVariant RecordTableModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || section < 0 || section >= int(columns_.size())) return {};
  const Column& c = columns_[size_t(section)];
  if (role == Qt::DisplayRole) return c.title;
  if (role == Qt::ToolTipRole && !c.tip.isEmpty()) return c.tip;
  return {};
}

}  // namespace keel::views
