// The one look of the studio's record tables (op table, diff, logs): whole-row single selection,
// read-only, alternating rows, compact rows sized from the font, last column stretched.
#pragma once
#include <QTableView>
#include <vector>

namespace keel::views {

// A QTableView over `model`, named `name` (tests find tables by object name).
QTableView* makeRecordTable(QWidget* parent, const char* name, QAbstractItemModel* model);

// Sizes `t`'s columns to their contents, the `elastic` ones at most `capChars` characters wide;
// the width the table has beyond that goes first to the elastic columns cut short (up to their
// contents), then to the last column. Again whenever the table is resized. Call it after the
// model's rows change.
void fitColumns(QTableView* t, const std::vector<int>& elastic, int capChars);

}  // namespace keel::views
