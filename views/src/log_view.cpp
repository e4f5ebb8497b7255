// LogModel, LogFilterProxy and LogView: see log_view.h. Rows are the LogsPtr snapshot's lines in
// logging order; nothing is copied per row.
#include "keel/views/log_view.h"

#include <QComboBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QLabel>
#include <QLineEdit>
#include <QTableView>
#include <QVBoxLayout>

#include "keel/views/selection.h"
#include "table_util.h"
#include "text_util.h"

namespace keel::views {

QColor logLevelColor(storage::LogLevel level) {
  switch (level) {
    case storage::LogLevel::Error:
      return QColor(0xc0, 0x10, 0x10);
    case storage::LogLevel::Warn:
      return QColor(0xa0, 0x60, 0x00);
    case storage::LogLevel::Info:
      return {};
    case storage::LogLevel::Debug:
    case storage::LogLevel::Verbose:
      return QColor(0x60, 0x60, 0x60);
  }
  return {};
}

// ---- LogModel ----

LogModel::LogModel(QObject* parent)
    : RecordTableModel({tr("Step"), tr("Op #"), tr("Level"), tr("Scope"), tr("Message")}, parent) {}

void LogModel::setLogs(LogsPtr logs) {
  beginResetModel();
  logs_ = std::move(logs);
  endResetModel();
}

const storage::LogRecord* LogModel::lineAt(int row) const {
  if (!logs_ || row < 0 || size_t(row) >= logs_->size()) return nullptr;
  return &(*logs_)[size_t(row)];
}

int LogModel::recordCount() const {
  return logs_ ? int(logs_->size()) : 0;
}

QVariant LogModel::data(const QModelIndex& index, int role) const {
  const storage::LogRecord* l = index.isValid() ? lineAt(index.row()) : nullptr;
  if (!l) return {};
  const int col = index.column();
  switch (role) {
    case LevelRole:
      return int(l->level);
    case OpSeqRole:
      return QVariant::fromValue<quint64>(l->opSeq);
    case Qt::DisplayRole:
      switch (col) {
        case Step:
          return QVariant::fromValue<qint64>(l->step);
        case OpSeq:
          return l->opSeq ? QVariant::fromValue<quint64>(l->opSeq) : QVariant();
        case Level:
          return qs(logLevelName(l->level));
        case Scope:
          return QString::fromStdString(l->scope);
        case Message:
          return QString::fromStdString(l->message);
      }
      return {};
    case Qt::ToolTipRole:
      if (col == Message || col == Scope)
        return QString::fromStdString(col == Message ? l->message : l->scope);
      if (col == OpSeq)
        return l->opSeq ? tr("logged while op #%1 ran; click to select it").arg(l->opSeq)
                        : tr("logged outside any op");
      return {};
    case Qt::TextAlignmentRole:
      if (col == Step || col == OpSeq) return QVariant(Qt::AlignRight | Qt::AlignVCenter);
      return {};
    case Qt::ForegroundRole:
      if (col == Level || l->level <= storage::LogLevel::Warn) {
        QColor c = logLevelColor(l->level);
        if (c.isValid()) return c;
      }
      return {};
  }
  return {};
}

// ---- LogFilterProxy ----

LogFilterProxy::LogFilterProxy(QObject* parent) : QSortFilterProxyModel(parent) {}

void LogFilterProxy::setMaxLevel(storage::LogLevel level) {
  if (level == maxLevel_) return;
  maxLevel_ = level;
  invalidateFilter();
}

void LogFilterProxy::setScopePrefix(const QString& prefix) {
  if (prefix == scope_) return;
  scope_ = prefix;
  scopeUtf8_ = prefix.toStdString();
  invalidateFilter();
}

void LogFilterProxy::setText(const QString& text) {
  if (text == text_) return;
  text_ = text;
  invalidateFilter();
}

bool LogFilterProxy::filterAcceptsRow(int sourceRow, const QModelIndex& sourceParent) const {
  auto* model = qobject_cast<const LogModel*>(sourceModel());
  const storage::LogRecord* l =
      model && !sourceParent.isValid() ? model->lineAt(sourceRow) : nullptr;
  if (!l || l->level > maxLevel_) return false;
  if (!keel::scopeWithin(l->scope, scopeUtf8_)) return false;
  if (!text_.isEmpty() && !QString::fromStdString(l->message).contains(text_, Qt::CaseInsensitive))
    return false;
  return true;
}

// ---- LogView ----

LogView::LogView(Selection* selection, Side side, QWidget* parent)
    : QWidget(parent), selection_(selection), side_(side) {
  model_ = new LogModel(this);
  proxy_ = new LogFilterProxy(this);
  proxy_->setSourceModel(model_);

  level_ = new QComboBox(this);
  level_->setObjectName("logFilterLevel");
  level_->setToolTip(tr("show lines up to this level"));
  for (auto l : {storage::LogLevel::Error, storage::LogLevel::Warn, storage::LogLevel::Info,
                 storage::LogLevel::Debug, storage::LogLevel::Verbose})
    level_->addItem(tr("up to %1").arg(qs(logLevelName(l))), int(l));
  level_->setCurrentIndex(level_->count() - 1);
  scope_ = new QLineEdit(this);
  scope_->setObjectName("logFilterScope");
  scope_->setPlaceholderText(tr("Scope prefix, e.g. blocks.0"));
  scope_->setClearButtonEnabled(true);
  text_ = new QLineEdit(this);
  text_->setObjectName("logFilterText");
  text_->setPlaceholderText(tr("Search messages…"));
  text_->setClearButtonEnabled(true);
  count_ = new QLabel(this);
  count_->setObjectName("logCount");

  auto* bar = new QHBoxLayout;
  bar->addWidget(level_);
  bar->addWidget(scope_, 1);
  bar->addWidget(text_, 2);
  bar->addWidget(count_);

  table_ = makeRecordTable(this, "logTable", proxy_);

  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->addLayout(bar);
  layout->addWidget(table_);

  auto filtered = [this](auto&& apply) {
    syncing_ = true;
    apply();
    syncing_ = false;
    updateCount();
  };
  connect(level_, &QComboBox::currentIndexChanged, this, [this, filtered](int) {
    filtered([this] { proxy_->setMaxLevel(storage::LogLevel(level_->currentData().toInt())); });
  });
  connect(scope_, &QLineEdit::textChanged, this, [this, filtered](const QString& t) {
    filtered([this, t] { proxy_->setScopePrefix(t.trimmed()); });
  });
  connect(text_, &QLineEdit::textChanged, this,
          [this, filtered](const QString& t) { filtered([this, t] { proxy_->setText(t); }); });
  connect(table_->selectionModel(), &QItemSelectionModel::currentRowChanged, this,
          [this](const QModelIndex& current) {
            if (!syncing_) selectRow(current);
          });
  connect(table_, &QTableView::clicked, this, [this](const QModelIndex& i) { selectRow(i); });
  if (selection_) connect(selection_, &Selection::selected, this, &LogView::onSelected);
  updateCount();
}

// An op selected elsewhere: its first visible log line becomes the current row (no echo).
void LogView::onSelected(Side side, quint64 seq) {
  if (side != side_) return;
  for (int r = 0; r < proxy_->rowCount(); ++r) {
    const QModelIndex i = proxy_->index(r, 0);
    if (i.data(LogModel::OpSeqRole).value<quint64>() != seq) continue;
    syncing_ = true;
    table_->setCurrentIndex(i);
    table_->scrollTo(i);
    syncing_ = false;
    return;
  }
}

void LogView::setLogs(LogsPtr logs) {
  syncing_ = true;
  model_->setLogs(std::move(logs));
  fitColumns(table_, {int(LogModel::Scope)}, 32);  // the message column takes the rest
  syncing_ = false;
  updateCount();
}

void LogView::setMaxLevel(storage::LogLevel level) {
  const int i = level_->findData(int(level));
  if (i >= 0) level_->setCurrentIndex(i);
}

void LogView::setScopeFilter(const QString& prefix) {
  scope_->setText(prefix);
}
void LogView::setTextFilter(const QString& text) {
  text_->setText(text);
}

void LogView::selectRow(const QModelIndex& proxyIndex) {
  if (!selection_ || !proxyIndex.isValid()) return;
  const auto seq = proxyIndex.data(LogModel::OpSeqRole).value<quint64>();
  if (seq != 0) selection_->select(side_, seq);
}

void LogView::updateCount() {
  count_->setText(tr("%1 of %2 lines").arg(proxy_->rowCount()).arg(model_->rowCount()));
}

}  // namespace keel::views
