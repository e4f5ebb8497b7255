// See table_util.h.
#include "table_util.h"

#include <QEvent>
#include <QHeaderView>
#include <QScrollBar>
#include <algorithm>

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

namespace {

// Re-fits the columns when the table's viewport is resized, from the content widths measured at
// the last fitColumns (measuring again on every resize would read every row).
class ColumnFitter : public QObject {
 public:
  explicit ColumnFitter(QTableView* t) : QObject(t), table_(t) {
    t->viewport()->installEventFilter(this);
    // A column the user sized by hand keeps its width: resizes stop re-fitting until the next
    // rows (measure).
    // (The stretched last column follows every resize by itself: not the user's doing.)
    connect(t->horizontalHeader(), &QHeaderView::sectionResized, this, [this](int logical) {
      const QHeaderView* h = table_->horizontalHeader();
      int last = h->count() - 1;
      while (last > 0 && h->isSectionHidden(h->logicalIndex(last))) --last;
      const bool stretched = h->stretchLastSection() && h->visualIndex(logical) == last;
      if (!applying_ && !stretched) userSized_ = true;
    });
  }

  void measure(const std::vector<int>& elastic, int capChars) {
    userSized_ = false;
    elastic_ = elastic;
    // Measured from the cells and the header (a stretched last column's width is not its need).
    const int cols = table_->model() ? table_->model()->columnCount() : 0;
    content_.assign(size_t(std::max(cols, 0)), 0);
    for (int c = 0; c < cols; ++c)
      content_[size_t(c)] = std::max(static_cast<QAbstractItemView*>(table_)->sizeHintForColumn(c),
                                     table_->horizontalHeader()->sectionSizeHint(c));
    cap_ = table_->fontMetrics().horizontalAdvance(QString(capChars, 'x'));
    apply();
  }

  void apply() {
    const int cols = int(content_.size());
    if (cols == 0 || applying_ || userSized_) return;
    applying_ = true;
    for (int c = 0; c < cols; ++c) {
      const bool elastic = std::find(elastic_.begin(), elastic_.end(), c) != elastic_.end();
      table_->setColumnWidth(c,
                             elastic ? std::min(content_[size_t(c)], cap_) : content_[size_t(c)]);
    }
    // The last column stretches over whatever is left: count it at its contents' width.
    int last = cols - 1;
    while (last > 0 && table_->isColumnHidden(last)) --last;
    int used = content_[size_t(last)];
    for (int c = 0; c < last; ++c)
      if (!table_->isColumnHidden(c)) used += table_->columnWidth(c);
    int spare = table_->viewport()->width() - used;
    for (int c : elastic_) {  // the cut ones first, in the order given
      if (spare <= 0 || c >= cols || table_->isColumnHidden(c)) continue;
      const int more = std::min(spare, content_[size_t(c)] - table_->columnWidth(c));
      if (more <= 0) continue;
      table_->setColumnWidth(c, table_->columnWidth(c) + more);
      spare -= more;
    }
    applying_ = false;
  }

 protected:
  bool eventFilter(QObject* watched, QEvent* e) override {
    if (e->type() == QEvent::Resize && watched == table_->viewport()) apply();
    return QObject::eventFilter(watched, e);
  }

 private:
  QTableView* table_;
  std::vector<int> elastic_;
  std::vector<int> content_;
  int cap_ = 0;
  bool applying_ = false;
  bool userSized_ = false;
};

}  // namespace

void fitColumns(QTableView* t, const std::vector<int>& elastic, int capChars) {
  // Found by name: a class without Q_OBJECT has no meta-object for findChild<ColumnFitter*>.
  auto* fitter = static_cast<ColumnFitter*>(
      t->findChild<QObject*>("keelColumnFitter", Qt::FindDirectChildrenOnly));
  if (!fitter) {
    fitter = new ColumnFitter(t);
    fitter->setObjectName("keelColumnFitter");
  }
  fitter->measure(elastic, capChars);
}

}  // namespace keel::views
