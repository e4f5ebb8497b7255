// OpTableModel, OpFilterProxy and OpTableView: see op_table.h. Display text is built on demand
// from the StepData snapshot; nothing is copied per row.
#include "keel/views/op_table.h"

#include <QCheckBox>
#include <QColor>
#include <QComboBox>
#include <QFontDatabase>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QLabel>
#include <QLineEdit>
#include <QMenu>
#include <QTableView>
#include <QVBoxLayout>

#include "keel/storage/export.h"
#include "keel/views/selection.h"
#include "table_util.h"
#include "text_util.h"

namespace keel::views {
namespace {

int64_t durationNs(const storage::OpRecord& op) {
  return op.endNs - op.beginNs;
}

// "[4,16,32]", or "3 × [4,16,32]" for a run of equal shapes (split, chunk).
QString outputShapes(const storage::OpRecord& op) {
  QStringList parts;
  QString last;
  int repeat = 0;
  auto flush = [&] {
    if (repeat > 0) parts << (repeat > 1 ? QStringLiteral("%1 × %2").arg(repeat).arg(last) : last);
  };
  for (const auto& t : op.tensors) {
    if (t.role != storage::Role::Output) continue;
    const QString s = QString::fromStdString(storage::shapeText(t.shape));
    if (s == last) {
      ++repeat;
      continue;
    }
    flush();
    last = s;
    repeat = 1;
  }
  flush();
  return parts.join(", ");
}

const storage::TensorRecord* firstOutput(const storage::OpRecord& op) {
  const storage::TensorRecord* best = nullptr;
  for (const auto& t : op.tensors)
    if (t.role == storage::Role::Output && (!best || t.index < best->index)) best = &t;
  return best;
}

struct NonFiniteCount {
  int64_t nan = 0, inf = 0;
  bool hasStats = false;
};

NonFiniteCount nonFinite(const storage::OpRecord& op) {
  NonFiniteCount r;
  for (const auto& t : op.tensors) {
    if (t.role != storage::Role::Output || !t.hasStats) continue;
    r.hasStats = true;
    r.nan += t.stats.nanCount;
    r.inf += t.stats.infCount;
  }
  return r;
}

// How many, not only which ("3 NaN, 1 Inf"): one NaN and a whole tensor of them read apart.
QString nonFiniteText(const NonFiniteCount& n) {
  QStringList parts;
  if (n.nan) parts << QStringLiteral("%L1 NaN").arg(n.nan);
  if (n.inf) parts << QStringLiteral("%L1 Inf").arg(n.inf);
  return parts.join(QStringLiteral(", "));
}

QString nonFiniteTooltip(const storage::OpRecord& op) {
  QStringList lines;
  for (const auto& t : op.tensors) {
    if (t.role != storage::Role::Output || !t.hasStats) continue;
    lines << QStringLiteral("output %1: %2 NaN, %3 Inf")
                 .arg(t.index)
                 .arg(t.stats.nanCount)
                 .arg(t.stats.infCount);
  }
  return lines.isEmpty() ? QStringLiteral("statistics not recorded") : lines.join('\n');
}

}  // namespace

// ---- OpTableModel ----

OpTableModel::OpTableModel(QObject* parent)
    : RecordTableModel(
          {{QStringLiteral("Seq"), QStringLiteral("engine op sequence number (execution order)")},
           QStringLiteral("Op"),
           QStringLiteral("Phase"),
           QStringLiteral("Scope"),
           {QStringLiteral("Time (µs)"), QStringLiteral("wall time of the op, end - begin")},
           QStringLiteral("Output shape"),
           {QStringLiteral("MD5"),
            QStringLiteral("first 8 hex digits of output 0's MD5 (full in the tooltip)")},
           {QStringLiteral("NaN/Inf"),
            QStringLiteral("outputs holding NaN or Inf values (needs --stats)")}},
          parent) {}

void OpTableModel::setStep(StepPtr step) {
  beginResetModel();
  step_ = std::move(step);
  endResetModel();
}

const storage::OpRecord* OpTableModel::opAt(int row) const {
  if (!step_ || row < 0 || size_t(row) >= step_->ops.size()) return nullptr;
  return &step_->ops[size_t(row)];
}

int OpTableModel::rowOf(uint64_t seq) const {
  return step_ ? int(step_->indexOf(seq)) : -1;
}

int OpTableModel::recordCount() const {
  return step_ ? int(step_->ops.size()) : 0;
}

QVariant OpTableModel::data(const QModelIndex& index, int role) const {
  const storage::OpRecord* op = index.isValid() ? opAt(index.row()) : nullptr;
  if (!op) return {};
  const int col = index.column();
  switch (role) {
    case SeqRole:
      return QVariant::fromValue<quint64>(op->seq);
    case NonFiniteRole: {
      auto n = nonFinite(*op);
      return QVariant::fromValue<qint64>(n.nan + n.inf);
    }
    case Qt::DisplayRole:
      switch (col) {
        case Seq:
          return QVariant::fromValue<quint64>(op->seq);
        case Name:
          return QString::fromStdString(op->name);
        case Phase:
          return qs(phaseName(op->phase));
        case Scope:
          return QString::fromStdString(op->scope);
        case Time:
          return QString::number(double(durationNs(*op)) / 1000.0, 'f', 1);
        case OutputShape:
          return outputShapes(*op);
        case Md5: {
          auto* t = firstOutput(*op);
          // The first 8 hex digits, marked as cut (the tooltip has all 32).
          return t && !t->md5.empty() ? QString::fromStdString(t->md5.substr(0, 8)) + "…"
                                      : QString();
        }
        case NonFinite:
          return nonFiniteText(nonFinite(*op));
      }
      return {};
    case SortRole:
      switch (col) {
        case Seq:
          return QVariant::fromValue<quint64>(op->seq);
        case Time:
          return QVariant::fromValue<qint64>(durationNs(*op));
        case NonFinite: {
          auto n = nonFinite(*op);
          return QVariant::fromValue<qint64>(n.nan + n.inf);
        }
        case Md5: {
          auto* t = firstOutput(*op);
          return t ? QString::fromStdString(t->md5) : QString();
        }
        default:
          return data(index, Qt::DisplayRole);
      }
    case Qt::ToolTipRole:
      switch (col) {
        case Name:
          return op->attrsJson.empty() ? QString::fromStdString(op->name)
                                       : QString::fromStdString(op->name + " " + op->attrsJson);
        case Scope:
          return QString::fromStdString(op->scope);
        case Time:
          return QStringLiteral("%L1 ns").arg(durationNs(*op));
        case OutputShape:
          return QStringLiteral("inputs: %1\noutputs: %2")
              .arg(QString::fromStdString(storage::tensorList(*op, storage::Role::Input)),
                   QString::fromStdString(storage::tensorList(*op, storage::Role::Output)));
        case Md5: {
          auto* t = firstOutput(*op);
          if (!t) return QStringLiteral("no output");
          return t->md5.empty()
                     ? QStringLiteral("MD5 not recorded")
                     : QStringLiteral("output 0 MD5: %1").arg(QString::fromStdString(t->md5));
        }
        case NonFinite:
          return nonFiniteTooltip(*op);
      }
      return {};
    case Qt::TextAlignmentRole:
      if (col == Seq || col == Time) return QVariant(Qt::AlignRight | Qt::AlignVCenter);
      if (col == NonFinite) return QVariant(Qt::AlignCenter);
      return {};
    case Qt::FontRole:
      if (col == Md5) return QFontDatabase::systemFont(QFontDatabase::FixedFont);
      return {};
    case Qt::BackgroundRole:
      if (col == NonFinite && nonFinite(*op).nan + nonFinite(*op).inf > 0)
        return QColor(0xf8, 0xc9, 0xc9);
      return {};
    case Qt::ForegroundRole:
      if (col == NonFinite && nonFinite(*op).nan + nonFinite(*op).inf > 0)
        return QColor(0x8b, 0x00, 0x00);
      return {};
  }
  return {};
}

// ---- OpFilterProxy ----

OpFilterProxy::OpFilterProxy(QObject* parent) : QSortFilterProxyModel(parent) {
  setSortRole(OpTableModel::SortRole);
}

void OpFilterProxy::setText(const QString& text) {
  if (text == text_) return;
  text_ = text;
  invalidateFilter();
}

void OpFilterProxy::setPhase(const QString& phase) {
  if (phase == phase_) return;
  phase_ = phase;
  invalidateFilter();
}

void OpFilterProxy::setNonFiniteOnly(bool on) {
  if (on == nonFiniteOnly_) return;
  nonFiniteOnly_ = on;
  invalidateFilter();
}

bool OpFilterProxy::filterAcceptsRow(int sourceRow, const QModelIndex& sourceParent) const {
  auto* model = qobject_cast<const OpTableModel*>(sourceModel());
  const storage::OpRecord* op = model && !sourceParent.isValid() ? model->opAt(sourceRow) : nullptr;
  if (!op) return false;
  if (!phase_.isEmpty() && qs(phaseName(op->phase)) != phase_) return false;
  if (nonFiniteOnly_) {
    auto n = nonFinite(*op);
    if (n.nan + n.inf == 0) return false;
  }
  if (!text_.isEmpty() && !QString::fromStdString(op->name).contains(text_, Qt::CaseInsensitive) &&
      !QString::fromStdString(op->scope).contains(text_, Qt::CaseInsensitive))
    return false;
  return true;
}

// ---- OpTableView ----

OpTableView::OpTableView(Selection* selection, Side side, QWidget* parent)
    : QWidget(parent), selection_(selection), side_(side) {
  model_ = new OpTableModel(this);
  proxy_ = new OpFilterProxy(this);
  proxy_->setSourceModel(model_);

  text_ = new QLineEdit(this);
  text_->setObjectName("opFilterText");
  text_->setPlaceholderText(tr("Filter by op name or scope…"));
  text_->setClearButtonEnabled(true);
  phase_ = new QComboBox(this);
  phase_->setObjectName("opFilterPhase");
  phase_->addItem(tr("All phases"), QString());
  phase_->addItem(tr("Forward"), QStringLiteral("forward"));
  phase_->addItem(tr("Backward"), QStringLiteral("backward"));
  phase_->addItem(tr("Optimizer"), QStringLiteral("optimizer"));
  nonFinite_ = new QCheckBox(tr("Non-finite only"), this);
  nonFinite_->setObjectName("opFilterNonFinite");
  nonFinite_->setToolTip(tr("only ops with NaN or Inf in an output"));
  count_ = new QLabel(this);
  count_->setObjectName("opCount");

  auto* bar = new QHBoxLayout;
  bar->addWidget(text_, 1);
  bar->addWidget(phase_);
  bar->addWidget(nonFinite_);
  bar->addWidget(count_);

  table_ = makeRecordTable(this, "opTable", proxy_);
  table_->setSortingEnabled(true);
  table_->sortByColumn(OpTableModel::Seq, Qt::AscendingOrder);

  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->addLayout(bar);
  layout->addWidget(table_);

  table_->setContextMenuPolicy(Qt::CustomContextMenu);
  connect(table_, &QWidget::customContextMenuRequested, this, [this](const QPoint& pos) {
    const QModelIndex i = table_->indexAt(pos);
    if (!i.isValid()) return;
    const quint64 seq = i.data(OpTableModel::SeqRole).value<quint64>();
    QMenu menu(this);
    menu.setObjectName("opTableMenu");
    menu.addAction(tr("Break here"), this, [this, seq] { emit breakHereRequested(seq); });
    menu.exec(table_->viewport()->mapToGlobal(pos));
  });

  connect(text_, &QLineEdit::textChanged, this, [this](const QString& t) {
    syncing_ = true;
    proxy_->setText(t.trimmed());
    syncing_ = false;
    updateCount();
  });
  connect(phase_, &QComboBox::currentIndexChanged, this, [this](int) {
    syncing_ = true;
    proxy_->setPhase(phase_->currentData().toString());
    syncing_ = false;
    updateCount();
  });
  connect(nonFinite_, &QCheckBox::toggled, this, [this](bool on) {
    syncing_ = true;
    proxy_->setNonFiniteOnly(on);
    syncing_ = false;
    updateCount();
  });
  connect(table_->selectionModel(), &QItemSelectionModel::currentRowChanged, this,
          [this](const QModelIndex& current) { onCurrentChanged(current); });
  connect(table_, &QTableView::clicked, this, [this](const QModelIndex& i) { selectRow(i); });
  if (selection_) {
    connect(selection_, &Selection::selected, this,
            [this](Side side, quint64 seq) { onSelected(side, seq); });
    connect(selection_, &Selection::cleared, this, [this] {
      syncing_ = true;
      table_->clearSelection();
      syncing_ = false;
    });
  }
  updateCount();
}

void OpTableView::setStep(StepPtr step) {
  syncing_ = true;
  model_->setStep(std::move(step));
  // Long names and scopes would push the other columns off screen (their tooltips have the full
  // text); room the table has to spare goes to them first.
  fitColumns(table_,
             {int(OpTableModel::Name), int(OpTableModel::Scope), int(OpTableModel::OutputShape)},
             24);
  syncing_ = false;
  if (selection_)
    if (auto seq = selection_->current(side_)) onSelected(side_, *seq);
  updateCount();
}

void OpTableView::setTextFilter(const QString& text) {
  text_->setText(text);
}

void OpTableView::setPhaseFilter(const QString& phase) {
  const int i = phase_->findData(phase);
  phase_->setCurrentIndex(i < 0 ? 0 : i);
}

void OpTableView::setNonFiniteOnly(bool on) {
  nonFinite_->setChecked(on);
}

void OpTableView::onSelected(Side side, quint64 seq) {
  if (side != side_) return;
  const int row = model_->rowOf(seq);
  const QModelIndex idx = row < 0 ? QModelIndex() : proxy_->mapFromSource(model_->index(row, 0));
  syncing_ = true;
  if (idx.isValid()) {
    table_->selectionModel()->setCurrentIndex(
        idx, QItemSelectionModel::ClearAndSelect | QItemSelectionModel::Rows);
    // Centre a row that is off screen; leave the view alone when it is already visible.
    if (!table_->viewport()->rect().contains(table_->visualRect(idx)))
      table_->scrollTo(idx, QAbstractItemView::PositionAtCenter);
  } else {
    table_->clearSelection();
  }
  syncing_ = false;
}

void OpTableView::onCurrentChanged(const QModelIndex& current) {
  if (syncing_ || !current.isValid()) return;
  selectRow(current);
}

void OpTableView::selectRow(const QModelIndex& proxyIndex) {
  if (!selection_ || !proxyIndex.isValid()) return;
  selection_->select(side_, proxyIndex.data(OpTableModel::SeqRole).value<quint64>());
}

void OpTableView::updateCount() {
  count_->setText(tr("%1 of %2 ops").arg(proxy_->rowCount()).arg(model_->rowCount()));
}

}  // namespace keel::views
