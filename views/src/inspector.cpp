// InspectorView: see inspector.h. Every section is a plain Qt item widget filled from the
// OpDetails snapshot; cells are selectable and Ctrl+C copies the selection as tab-separated text.
#include "keel/views/inspector.h"

#include <QAction>
#include <QApplication>
#include <QClipboard>
#include <QFontDatabase>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QPlainTextEdit>
#include <QTabWidget>
#include <QTableWidget>
#include <QTreeWidget>
#include <QVBoxLayout>
#include <algorithm>
#include <cmath>
#include <map>

#include "keel/storage/export.h"
#include "keel/views/log_view.h"
#include "keel/views/mask_picture.h"
#include "keel/views/selection.h"
#include "text_util.h"

namespace keel::views {
namespace {

QFont monoFont() {
  return QFontDatabase::systemFont(QFontDatabase::FixedFont);
}

QString hex(uint64_t v) {
  return QStringLiteral("0x%1").arg(v, 0, 16);
}

QString number(double v, int digits = 5) {
  if (std::isnan(v)) return QStringLiteral("nan");
  if (std::isinf(v)) return v > 0 ? QStringLiteral("inf") : QStringLiteral("-inf");
  return QString::number(v, 'g', digits);
}

// Columns of the tensor table.
enum TensorColumn { TensorNaN = 5, TensorInf = 6 };

QString bytesText(uint64_t b) {
  if (b < 1024) return QStringLiteral("%L1 B").arg(b);
  if (b < 1024 * 1024) return QStringLiteral("%L1 KiB").arg(double(b) / 1024.0, 0, 'f', 1);
  return QStringLiteral("%L1 MiB").arg(double(b) / (1024.0 * 1024.0), 0, 'f', 2);
}

QString roleName(storage::Role r) {
  return r == storage::Role::Input ? QStringLiteral("input") : QStringLiteral("output");
}

QTableWidgetItem* cell(const QString& text, bool mono = false, bool right = false) {
  auto* it = new QTableWidgetItem(text);
  it->setFlags(Qt::ItemIsSelectable | Qt::ItemIsEnabled);
  if (mono) it->setFont(monoFont());
  if (right) it->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
  return it;
}

void copySelection(QTableWidget* t) {
  const auto ranges = t->selectedRanges();
  if (ranges.isEmpty()) return;
  QStringList lines;
  for (const auto& r : ranges)
    for (int row = r.topRow(); row <= r.bottomRow(); ++row) {
      QStringList cells;
      for (int col = r.leftColumn(); col <= r.rightColumn(); ++col) {
        auto* it = t->item(row, col);
        cells << (it ? it->text() : QString());
      }
      lines << cells.join('\t');
    }
  QApplication::clipboard()->setText(lines.join('\n'));
}

void copySelection(QTreeWidget* t) {
  QStringList lines;
  for (auto* it : t->selectedItems()) lines << it->text(0) + '\t' + it->text(1);
  QApplication::clipboard()->setText(lines.join('\n'));
}

// A copy action on Ctrl+C and in the context menu.
template <class W>
void addCopyAction(W* w) {
  auto* copy = new QAction(QObject::tr("Copy"), w);
  copy->setShortcut(QKeySequence::Copy);
  copy->setShortcutContext(Qt::WidgetWithChildrenShortcut);
  QObject::connect(copy, &QAction::triggered, w, [w] { copySelection(w); });
  w->addAction(copy);
  w->setContextMenuPolicy(Qt::ActionsContextMenu);
}

QTableWidget* makeTable(QWidget* parent, const QStringList& headers, const char* name) {
  auto* t = new QTableWidget(0, int(headers.size()), parent);
  t->setObjectName(name);
  t->setHorizontalHeaderLabels(headers);
  t->setAlternatingRowColors(true);
  t->setEditTriggers(QAbstractItemView::NoEditTriggers);
  t->setSelectionMode(QAbstractItemView::ExtendedSelection);
  t->setWordWrap(false);
  t->verticalHeader()->hide();
  t->verticalHeader()->setDefaultSectionSize(t->fontMetrics().height() + 6);
  t->horizontalHeader()->setStretchLastSection(true);
  t->horizontalHeader()->setHighlightSections(false);
  addCopyAction(t);
  return t;
}

// Sizes columns to their contents, no column wider than `maxChars` characters (tooltips carry the
// full text of a clipped cell).
void fitColumns(QTableWidget* t, int maxChars = 60) {
  t->resizeColumnsToContents();
  const int cap = t->fontMetrics().horizontalAdvance(QString(maxChars, 'x'));
  for (int c = 0; c < t->columnCount() - 1; ++c)
    if (t->columnWidth(c) > cap) t->setColumnWidth(c, cap);
}

QString jsonScalar(const QJsonValue& v) {
  switch (v.type()) {
    case QJsonValue::Bool:
      return v.toBool() ? QStringLiteral("true") : QStringLiteral("false");
    case QJsonValue::Double: {
      const QVariant var = v.toVariant();
      if (var.typeId() == QMetaType::LongLong || var.typeId() == QMetaType::Int)
        return var.toString();
      return QString::number(v.toDouble(), 'g', 12);
    }
    case QJsonValue::String:
      return v.toString();
    case QJsonValue::Null:
      return QStringLiteral("null");
    default:
      return QString::fromUtf8(QJsonDocument(QJsonArray{v}).toJson(QJsonDocument::Compact));
  }
}

bool isScalarArray(const QJsonArray& a) {
  return std::all_of(a.begin(), a.end(),
                     [](const QJsonValue& v) { return !v.isArray() && !v.isObject(); });
}

void addJson(QTreeWidget* tree, QTreeWidgetItem* parent, const QString& key, const QJsonValue& v) {
  auto* it = parent ? new QTreeWidgetItem(parent) : new QTreeWidgetItem(tree);
  it->setText(0, key);
  it->setFont(1, monoFont());
  if (v.isObject()) {
    const QJsonObject o = v.toObject();
    for (auto k = o.begin(); k != o.end(); ++k) addJson(tree, it, k.key(), k.value());
  } else if (v.isArray() && isScalarArray(v.toArray())) {
    QStringList parts;
    for (const auto& e : v.toArray()) parts << jsonScalar(e);
    it->setText(1, '[' + parts.join(", ") + ']');
  } else if (v.isArray()) {
    const QJsonArray a = v.toArray();
    for (qsizetype i = 0; i < a.size(); ++i) addJson(tree, it, QStringLiteral("[%1]").arg(i), a[i]);
  } else {
    it->setText(1, jsonScalar(v));
  }
  it->setToolTip(1, it->text(1));
}

}  // namespace

InspectorView::InspectorView(Selection* selection, Side side, QWidget* parent)
    : QWidget(parent), selection_(selection), side_(side) {
  header_ = new QLabel(this);
  header_->setSizePolicy(QSizePolicy::Preferred, QSizePolicy::Fixed);
  header_->setObjectName("inspectorHeader");
  header_->setTextFormat(Qt::RichText);
  header_->setTextInteractionFlags(Qt::TextSelectableByMouse | Qt::LinksAccessibleByMouse);
  header_->setWordWrap(true);
  header_->setMargin(4);
  connect(header_, &QLabel::linkActivated, this, [this](const QString& link) {
    // "op:<seq>": the forward op of a backward op.
    if (selection_ && link.startsWith("op:")) selection_->select(side_, link.mid(3).toULongLong());
  });

  error_ = new QLabel(this);
  error_->setObjectName("inspectorError");
  error_->setWordWrap(true);
  error_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  error_->setStyleSheet(
      "QLabel { background: #fdecea; color: #8b0000; border: 1px solid #e0a0a0; padding: 8px; }");
  error_->hide();

  tabs_ = new QTabWidget(this);
  tabs_->setObjectName("inspectorTabs");
  tabs_->setDocumentMode(true);

  tensors_ =
      makeTable(this,
                {tr("Tensor"), tr("Shape"), tr("Dtype"), tr("Bytes"), tr("MD5"), tr("NaN"),
                 tr("Inf"), tr("Zeros"), tr("Min"), tr("Max"), tr("Mean"), tr("Std"), tr("|Max|")},
                "inspectorTensors");
  tensors_->horizontalHeader()->setStretchLastSection(false);
  attributes_ = new QTreeWidget(this);
  attributes_->setObjectName("inspectorAttributes");
  attributes_->setHeaderLabels({tr("Attribute"), tr("Value")});
  attributes_->setAlternatingRowColors(true);
  attributes_->setSelectionMode(QAbstractItemView::ExtendedSelection);
  addCopyAction(attributes_);
  values_ = new QPlainTextEdit(this);
  values_->setObjectName("inspectorValues");
  values_->setReadOnly(true);
  values_->setLineWrapMode(QPlainTextEdit::NoWrap);
  values_->setFont(monoFont());
  stack_ = makeTable(this, {tr("#"), tr("Function"), tr("Location")}, "inspectorStack");
  logs_ = makeTable(this, {tr("Level"), tr("Scope"), tr("Message")}, "inspectorLogs");
  memory_ = makeTable(this,
                      {tr("Kind"), tr("Device"), tr("Address"), tr("Bytes"), tr("Moved to"),
                       tr("Allocated after"), tr("Reserved after")},
                      "inspectorMemory");
  memory_->horizontalHeader()->setStretchLastSection(false);

  maskPage_ = new QWidget(this);
  maskPage_->setObjectName("inspectorMask");
  maskSummary_ = new QLabel(maskPage_);
  maskSummary_->setObjectName("inspectorMaskSummary");
  maskSummary_->setTextFormat(Qt::RichText);
  maskSummary_->setWordWrap(true);
  maskSummary_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  maskPicture_ = new MaskPicture(maskPage_);
  auto* legend = new QVBoxLayout;
  legend->setSpacing(2);
  static const char* const kLegendNames[] = {
      "inspectorMaskLegendSkipped", "inspectorMaskLegendPartial", "inspectorMaskLegendFull"};
  for (int i = 0; i < analysis::kTileClassCount; ++i) {
    maskLegend_[i] = new QLabel(maskPage_);
    maskLegend_[i]->setObjectName(kLegendNames[i]);
    maskLegend_[i]->setTextFormat(Qt::RichText);
    legend->addWidget(maskLegend_[i]);
  }
  legend->addStretch(1);
  // The picture beside the legend, so that it gets the page's height (the inspector shares its
  // dock column with the loss plot).
  auto* body = new QHBoxLayout;
  body->addWidget(maskPicture_, 1);
  body->addLayout(legend);
  auto* maskLayout = new QVBoxLayout(maskPage_);
  maskLayout->setContentsMargins(6, 6, 6, 6);
  maskLayout->addWidget(maskSummary_);
  maskLayout->addLayout(body, 1);

  tabs_->addTab(tensors_, tr("Tensors"));
  tabs_->addTab(attributes_, tr("Attributes"));
  tabs_->addTab(values_, tr("Values"));
  tabs_->addTab(stack_, tr("Stack"));
  tabs_->addTab(logs_, tr("Logs"));
  tabs_->addTab(memory_, tr("Memory"));
  tabs_->addTab(maskPage_, tr("Mask"));

  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->addWidget(header_);
  layout->addWidget(error_);
  layout->addWidget(tabs_, 1);
  layout->addStretch(0);  // takes the space when an error hides the tabs
  clear();
}

void InspectorView::clear() {
  details_.reset();
  setHeader(
      tr("<i>No op selected.</i> Click an op in the graph, the op table, the diff "
         "or the log to inspect it."));
  error_->hide();
  tabs_->show();
  tensors_->setRowCount(0);
  attributes_->clear();
  values_->clear();
  stack_->setRowCount(0);
  logs_->setRowCount(0);
  memory_->setRowCount(0);
  maskSummary_->clear();
  maskPicture_->setGrid({});
  for (QLabel* l : maskLegend_) l->clear();
  tabs_->setTabVisible(Mask, false);
  setTabCount(Tensors, tr("Tensors"), 0);
  setTabCount(Attributes, tr("Attributes"), 0);
  setTabCount(Values, tr("Values"), 0);
  setTabCount(Stack, tr("Stack"), 0);
  setTabCount(Logs, tr("Logs"), 0);
  setTabCount(Memory, tr("Memory"), 0);
}

void InspectorView::setDetails(OpDetailsPtr details) {
  const int before = tabs_->currentIndex();
  clear();
  if (!details) return;
  details_ = details;
  const OpDetails& d = *details;
  const storage::OpRecord& op = d.op;

  if (!d.error.empty()) {
    setHeader(tr("<b>Op #%1</b> could not be read").arg(op.seq));
    error_->setText(QString::fromStdString(d.error));
    error_->show();
    tabs_->hide();
    return;
  }

  const QString scope =
      op.scope.empty() ? tr("<i>top level</i>") : QString::fromStdString(op.scope).toHtmlEscaped();
  QString text = QStringLiteral("<span style='font-size:14pt'><b>%1</b></span>&nbsp;&nbsp;#%2<br>")
                     .arg(QString::fromStdString(op.name).toHtmlEscaped())
                     .arg(op.seq);
  QStringList facts;
  facts << tr("phase <b>%1</b>").arg(qs(phaseName(op.phase)).toHtmlEscaped())
        << tr("scope <b>%1</b>").arg(scope) << tr("step <b>%1</b>").arg(op.step)
        << tr("time <b>%1 µs</b>").arg(double(op.endNs - op.beginNs) / 1000.0, 0, 'f', 1)
        << tr("thread %1").arg(op.thread);
  if (op.forwardSeq != 0)
    facts << tr("gradient of forward op <a href='op:%1'>#%1</a>").arg(op.forwardSeq);
  text += facts.join(QStringLiteral(" &nbsp;·&nbsp; "));
  setHeader(text);

  fillTensors(d);
  fillAttributes(d);
  fillValues(d);
  fillStack(d);
  fillLogs(d);
  fillMemory(d);
  fillMask(d);
  // A flashmask op opens on its mask unless the user had picked another tab than Tensors.
  const bool mask = tabs_->isTabVisible(Mask);
  if (mask && (before == Tensors || before == Mask))
    tabs_->setCurrentIndex(Mask);
  else if (before == Mask || before < 0)
    tabs_->setCurrentIndex(Tensors);
  else
    tabs_->setCurrentIndex(before);
}

void InspectorView::setTabCount(Tab tab, const QString& title, qsizetype count) {
  tabs_->setTabText(tab, count > 0 ? QStringLiteral("%1 (%2)").arg(title).arg(count) : title);
}

void InspectorView::fillTensors(const OpDetails& d) {
  std::vector<const storage::TensorRecord*> ts;
  for (const auto& t : d.op.tensors) ts.push_back(&t);
  std::stable_sort(ts.begin(), ts.end(), [](auto* a, auto* b) {
    return std::pair(int(a->role), a->index) < std::pair(int(b->role), b->index);
  });
  tensors_->setRowCount(int(ts.size()));
  const QColor bad(0xf8, 0xc9, 0xc9), badText(0x8b, 0x00, 0x00);
  for (int row = 0; row < int(ts.size()); ++row) {
    const storage::TensorRecord& t = *ts[size_t(row)];
    const auto& s = t.stats;
    QStringList tip;
    tip << tr("tensor id %1, version %2, buffer %3").arg(t.tensorId).arg(t.version).arg(t.bufferId)
        << tr("strides %1, offset %2, device %3")
               .arg(QString::fromStdString(storage::shapeText(t.strides)))
               .arg(t.offset)
               .arg(QString::fromStdString(t.device));
    if (!t.md5Rounded.empty())
      tip << tr("rounded MD5 %1").arg(QString::fromStdString(t.md5Rounded));
    QList<QTableWidgetItem*> cells{
        cell(QStringLiteral("%1 %2").arg(roleName(t.role)).arg(t.index)),
        cell(QString::fromStdString(storage::shapeText(t.shape))),
        cell(QString::fromStdString(t.dtype)),
        cell(QStringLiteral("%L1").arg(t.bytes), false, true),
        cell(t.md5.empty() ? QString() : QString::fromStdString(t.md5), true)};
    for (int c = 0; c < int(cells.size()); ++c) cells[c]->setToolTip(tip.join('\n'));
    for (int64_t n : {s.nanCount, s.infCount, s.zeroCount})
      cells << cell(t.hasStats ? QStringLiteral("%L1").arg(n) : QString(), false, true);
    for (double v : {s.min, s.max, s.mean, s.std, s.absMax}) {
      cells << cell(t.hasStats ? number(v) : QString(), true, true);
      if (t.hasStats) cells.back()->setToolTip(QString::number(v, 'g', 17));
    }
    for (int c = 0; c < int(cells.size()); ++c) tensors_->setItem(row, c, cells[c]);
    for (int c : {int(TensorNaN), int(TensorInf)}) {
      if (t.hasStats && (c == TensorNaN ? s.nanCount : s.infCount) > 0) {
        cells[c]->setBackground(bad);
        cells[c]->setForeground(badText);
        QFont f = cells[c]->font();
        f.setBold(true);
        cells[c]->setFont(f);
      }
    }
  }
  fitColumns(tensors_);
  setTabCount(Tensors, tr("Tensors"), qsizetype(ts.size()));
}

void InspectorView::fillAttributes(const OpDetails& d) {
  int count = 0;
  if (!d.op.attrsJson.empty()) {
    QJsonParseError err;
    const QJsonDocument doc =
        QJsonDocument::fromJson(QByteArray::fromStdString(d.op.attrsJson), &err);
    if (doc.isObject()) {
      const QJsonObject o = doc.object();
      for (auto k = o.begin(); k != o.end(); ++k) addJson(attributes_, nullptr, k.key(), k.value());
      count = int(o.size());
    } else {
      // Not an object: show the text as recorded.
      auto* it = new QTreeWidgetItem(attributes_);
      it->setText(0, tr("(raw)"));
      it->setText(1, QString::fromStdString(d.op.attrsJson));
      it->setFont(1, monoFont());
      count = 1;
    }
  }
  if (count == 0) {
    auto* it = new QTreeWidgetItem(attributes_);
    it->setText(0, tr("(no attributes)"));
    it->setForeground(0, palette().color(QPalette::Disabled, QPalette::Text));
  }
  bool nested = false;
  for (int i = 0; i < attributes_->topLevelItemCount(); ++i)
    nested = nested || attributes_->topLevelItem(i)->childCount() > 0;
  attributes_->setRootIsDecorated(nested);
  attributes_->expandAll();
  attributes_->resizeColumnToContents(0);
  setTabCount(Attributes, tr("Attributes"), count);
}

void InspectorView::fillValues(const OpDetails& d) {
  if (d.dumps.empty()) {
    values_->setPlainText(
        tr("No values were dumped for this op.\n\nRecord with --dumps (optionally --dump-ops NAME "
           "or --dump-scope SCOPE) to keep output values."));
    setTabCount(Values, tr("Values"), 0);
    return;
  }
  QString text;
  for (const auto& dump : d.dumps) {
    text += QStringLiteral("%1 %2  shape %3  %L4 elements")
                .arg(roleName(dump.role))
                .arg(dump.index)
                .arg(QString::fromStdString(storage::shapeText(dump.shape)))
                .arg(dump.numel);
    if (int64_t(dump.values.size()) < dump.numel)
      text += tr("  (first %L1 shown)").arg(qulonglong(dump.values.size()));
    text += '\n';
    // One line per row of the last dimension when it is short, else 8 values a line.
    const int64_t last = dump.shape.empty() ? 1 : dump.shape.back();
    const size_t perLine = last >= 1 && last <= 12 ? size_t(last) : 8;
    const int indexWidth = int(QString::number(qulonglong(dump.values.size())).size());
    for (size_t i = 0; i < dump.values.size(); i += perLine) {
      text += QStringLiteral("  [%1] ").arg(qulonglong(i), indexWidth);
      for (size_t j = i; j < std::min(dump.values.size(), i + perLine); ++j)
        text += QStringLiteral(" %1").arg(number(dump.values[j], 6), 13);
      text += '\n';
    }
    text += '\n';
  }
  values_->setPlainText(text);
  setTabCount(Values, tr("Values"), qsizetype(d.dumps.size()));
}

void InspectorView::fillStack(const OpDetails& d) {
  if (!d.stack || d.stack->frames.empty()) {
    stack_->setRowCount(1);
    stack_->setItem(0, 0, cell(QString()));
    stack_->setItem(0, 1,
                    cell(d.op.stackId < 0 ? tr("no stack recorded (record with --stacks)")
                                          : tr("stack #%1 not found").arg(d.op.stackId)));
    fitColumns(stack_);
    setTabCount(Stack, tr("Stack"), 0);
    return;
  }
  const auto& frames = d.stack->frames;
  stack_->setRowCount(int(frames.size()));
  for (int row = 0; row < int(frames.size()); ++row) {
    const storage::StackFrame& f = frames[size_t(row)];
    const QString fn =
        f.function.empty() ? QStringLiteral("??") : QString::fromStdString(f.function);
    QString loc;
    if (!f.file.empty())
      loc = f.line > 0 ? QStringLiteral("%1:%2").arg(QString::fromStdString(f.file)).arg(f.line)
                       : QString::fromStdString(f.file);
    const QString tip = QStringLiteral("%1\n%2\naddress %3").arg(fn, loc, hex(f.address));
    auto* fnCell = cell(fn);
    // No file: the return address is all there is to go on.
    auto* locCell = loc.isEmpty() ? cell(hex(f.address), true) : cell(loc);
    if (loc.isEmpty()) locCell->setForeground(palette().color(QPalette::Disabled, QPalette::Text));
    for (auto* c : {fnCell, locCell}) c->setToolTip(tip);
    stack_->setItem(row, 0, cell(QString::number(row), false, true));
    stack_->setItem(row, 1, fnCell);
    stack_->setItem(row, 2, locCell);
  }
  fitColumns(stack_, 64);
  setTabCount(Stack, tr("Stack"), qsizetype(frames.size()));
}

void InspectorView::fillLogs(const OpDetails& d) {
  logs_->setRowCount(int(d.logs.size()));
  for (int row = 0; row < int(d.logs.size()); ++row) {
    const storage::LogRecord& l = d.logs[size_t(row)];
    auto* level = cell(qs(logLevelName(l.level)));
    if (auto c = logLevelColor(l.level); c.isValid()) level->setForeground(c);
    logs_->setItem(row, 0, level);
    logs_->setItem(row, 1, cell(QString::fromStdString(l.scope)));
    auto* msg = cell(QString::fromStdString(l.message));
    msg->setToolTip(msg->text());
    logs_->setItem(row, 2, msg);
  }
  fitColumns(logs_);
  setTabCount(Logs, tr("Logs"), qsizetype(d.logs.size()));
}

void InspectorView::fillMemory(const OpDetails& d) {
  memory_->setRowCount(int(d.mems.size()));
  for (int row = 0; row < int(d.mems.size()); ++row) {
    const storage::MemRecord& m = d.mems[size_t(row)];
    memory_->setItem(row, 0, cell(qs(memEventName(m.kind))));
    memory_->setItem(row, 1, cell(QString::fromStdString(m.device)));
    memory_->setItem(row, 2, cell(hex(m.address), true));
    auto* bytes = cell(QStringLiteral("%L1").arg(m.bytes), false, true);
    bytes->setToolTip(bytesText(m.bytes));
    memory_->setItem(row, 3, bytes);
    memory_->setItem(row, 4, cell(m.toAddress ? hex(m.toAddress) : QString(), true));
    memory_->setItem(row, 5, cell(bytesText(m.allocatedAfter), false, true));
    memory_->setItem(row, 6, cell(bytesText(m.reservedAfter), false, true));
    memory_->item(row, 5)->setToolTip(QStringLiteral("%L1 bytes").arg(m.allocatedAfter));
    memory_->item(row, 6)->setToolTip(QStringLiteral("%L1 bytes").arg(m.reservedAfter));
  }
  fitColumns(memory_);
  setTabCount(Memory, tr("Memory"), qsizetype(d.mems.size()));
}

void InspectorView::fillMask(const OpDetails& d) {
  const std::optional<analysis::MaskSummary> m = analysis::maskSummaryFromAttrs(d.op.attrsJson);
  if (!m) return;
  // Sq and Sk from q and k: inputs 0 and 1 of the forward op, 1 and 2 of the backward op.
  const bool backward = d.op.name.size() > 9 && d.op.name.ends_with("_backward");
  int64_t sq = 0, sk = 0;
  for (const auto& t : d.op.tensors)
    if (t.role == storage::Role::Input && t.shape.size() == 4) {
      if (t.index == (backward ? 1 : 0)) sq = t.shape[1];
      if (t.index == (backward ? 2 : 1)) sk = t.shape[1];
    }
  const analysis::TileGrid& g = m->grid;
  QString text = tr("<b>%1</b> mask").arg(QString::fromStdString(m->kind).toHtmlEscaped());
  if (m->blockSparsity >= 0)
    text += tr(" &nbsp;·&nbsp; block sparsity <b>%1%</b> (share of skipped tiles, whole batch)")
                .arg(m->blockSparsity * 100.0, 0, 'f', 1);
  text += "<br>";
  const bool tiled = m->tileRows > 0 && m->tileCols > 0;
  const int64_t nq = tiled && sq > 0 ? (sq + m->tileRows - 1) / m->tileRows : g.rows;
  const int64_t nk = tiled && sk > 0 ? (sk + m->tileCols - 1) / m->tileCols : g.cols;
  QStringList facts;
  facts << tr("batch 0, mask head 0");
  if (sq > 0 && sk > 0) facts << tr("%1 queries × %2 keys").arg(sq).arg(sk);
  if (tiled)
    facts << tr("%1 × %2 tiles of %3 × %4").arg(nq).arg(nk).arg(m->tileRows).arg(m->tileCols);
  const bool coarse = nq > g.rows || nk > g.cols;
  if (coarse)
    facts << tr("shown as %1 × %2 cells, each a block of tiles (partial where its tiles differ)")
                 .arg(g.rows)
                 .arg(g.cols);
  text += facts.join(QStringLiteral(" &nbsp;·&nbsp; "));
  maskSummary_->setText(text);
  maskPicture_->setGrid(g);
  static const char* const kMeaning[] = {QT_TR_NOOP("not computed"), QT_TR_NOOP("element mask"),
                                         QT_TR_NOOP("no mask work")};
  for (int i = 0; i < analysis::kTileClassCount; ++i) {
    const auto c = analysis::TileClass(i);
    maskLegend_[i]->setText(
        QStringLiteral("<span style='background-color:%1'>&nbsp;&nbsp;&nbsp;&nbsp;</span> "
                       "<b>%2</b> %3 <span style='color:gray'>(%4)</span>")
            .arg(tileClassColor(c).name(), tileClassName(c))
            .arg(g.count(c))
            .arg(tr(kMeaning[i])));
    maskLegend_[i]->setToolTip(coarse ? tr("cells of the picture") : tr("tiles"));
  }
  tabs_->setTabVisible(Mask, true);
}

// A word-wrapped label does not grow by itself when its text or width changes: give it the
// height its text needs at its current width, so the header is never clipped.
void InspectorView::setHeader(const QString& text) {
  header_->setText(text);
  fitHeader();
}

void InspectorView::fitHeader() {
  const int w = header_->width() > 0 ? header_->width() : width();
  header_->setFixedHeight(
      std::max(header_->heightForWidth(w), header_->fontMetrics().height() + 8));
}

void InspectorView::resizeEvent(QResizeEvent* e) {
  QWidget::resizeEvent(e);
  fitHeader();
}

}  // namespace keel::views
