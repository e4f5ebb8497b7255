// The one look of the studio's record tables (op table, diff, logs): whole-row single selection,
// read-only, alternating rows, compact rows sized from the font, last column stretched.
#pragma once
#include <QTableView>

namespace keel::views {

// A QTableView over `model`, named `name` (tests find tables by object name).
QTableView* makeRecordTable(QWidget* parent, const char* name, QAbstractItemModel* model);

}  // namespace keel::views
