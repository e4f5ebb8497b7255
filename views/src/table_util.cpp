// See table_util.h.
#include "table_util.h"

#include <QHeaderView>

namespace keel::views {

QTableView* makeRecordTable(QWidget* parent, const char* name, QAbstractItemModel* model) {
  auto* t = new QTableView(parent);
  t->setObjectName(name);
  t->setModel(model);
  t->setAlternatingRowColors(true);
  t->setSelectionBehavior(QAbstractItemView::SelectRows);
  t->setSelectionMode(QAbstractItemView::SingleSelection);
  t->setEditTriggers(QAbstractItemView::NoEditTriggers);
  t->setWordWrap(false);
  t->verticalHeader()->hide();
  t->verticalHeader()->setDefaultSectionSize(t->fontMetrics().height() + 6);
  t->horizontalHeader()->setStretchLastSection(true);
  t->horizontalHeader()->setHighlightSections(false);
  return t;
}

}  // namespace keel::views
