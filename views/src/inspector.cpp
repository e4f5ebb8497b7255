// InspectorView: see inspector.h. Every section is a plain Qt item widget filled from the
// OpDetails snapshot(s); cells are selectable and Ctrl+C copies the selection as tab-separated
// text. Sized for a 540-px dock: tensors are columns (fields are rows), long text is elided in the
// middle with the whole of it on hover, and Keel's own frames of a stack are folded.
#include "keel/views/inspector.h"

#include <cxxabi.h>

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
#include <QStyledItemDelegate>
#include <QTabBar>
#include <QTabWidget>
#include <QTableWidget>
#include <QTreeWidget>
#include <QVBoxLayout>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>

#include "keel/analysis/module_summary.h"
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

}  // namespace

QString fitNumber(const QString& text, const std::function<int(const QString&)>& widthOf,
                  int width) {
  bool ok = false;
  const double v = text.toDouble(&ok);
  if (!ok || !std::isfinite(v) || widthOf(text) <= width) return text;
  // "3.69e-03" -> "3.69e-3": the exponent without its sign's '+' or leading zeros.
  auto shortE = [](double x, int digits) {
    QString t = QString::number(x, 'e', std::max(0, digits - 1));
    const qsizetype e = t.indexOf('e');
    QString mant = t.left(e), exp = t.mid(e + 1);
    const bool neg = exp.startsWith('-');
    exp.remove(0, 1);
    while (exp.size() > 1 && exp.startsWith('0')) exp.remove(0, 1);
    return mant + "e" + (neg ? "-" : "") + exp;
  };
  for (int digits = 5; digits >= 1; --digits)
    for (const QString& t : {QString::number(v, 'g', digits), shortE(v, digits)})
      if (widthOf(t) <= width) return t;
  return shortE(v, 1);
}

namespace {

// Rows of the tensor table (a column per tensor), in order.
enum TensorField {
  FieldShape,
  FieldDtype,
  FieldBytes,
  FieldMd5,
  FieldMd5Rounded,
  FieldNaN,
  FieldInf,
  FieldZeros,
  FieldMin,
  FieldMax,
  FieldMean,
  FieldStd,
  FieldAbsMax,
  FieldCount
};
const char* const kFieldNames[FieldCount] = {
    QT_TRANSLATE_NOOP("InspectorView", "Shape"),       QT_TRANSLATE_NOOP("InspectorView", "Dtype"),
    QT_TRANSLATE_NOOP("InspectorView", "Bytes"),       QT_TRANSLATE_NOOP("InspectorView", "MD5"),
    QT_TRANSLATE_NOOP("InspectorView", "Rounded MD5"), QT_TRANSLATE_NOOP("InspectorView", "NaN"),
    QT_TRANSLATE_NOOP("InspectorView", "Inf"),         QT_TRANSLATE_NOOP("InspectorView", "Zeros"),
    QT_TRANSLATE_NOOP("InspectorView", "Min"),         QT_TRANSLATE_NOOP("InspectorView", "Max"),
    QT_TRANSLATE_NOOP("InspectorView", "Mean"),        QT_TRANSLATE_NOOP("InspectorView", "Std"),
    QT_TRANSLATE_NOOP("InspectorView", "|Max|")};

bool isMonoField(int f) {
  return f == FieldMd5 || f == FieldMd5Rounded || f >= FieldMin;
}
bool isNumberField(int f) {
  return f == FieldBytes || f >= FieldNaN;
}

// The text of one field of a tensor ("" where it was not recorded) and its hover text.
QString fieldText(const storage::TensorRecord& t, int f) {
  const auto& s = t.stats;
  switch (f) {
    case FieldShape:
      return QString::fromStdString(storage::shapeText(t.shape));
    case FieldDtype:
      return QString::fromStdString(t.dtype);
    case FieldBytes:
      return QStringLiteral("%L1").arg(t.bytes);
    case FieldMd5:
      return QString::fromStdString(t.md5);
    case FieldMd5Rounded:
      return QString::fromStdString(t.md5Rounded);
    case FieldNaN:
    case FieldInf:
    case FieldZeros: {
      if (!t.hasStats) return {};
      const int64_t n = f == FieldNaN ? s.nanCount : f == FieldInf ? s.infCount : s.zeroCount;
      return QStringLiteral("%L1").arg(n);
    }
    default: {
      if (!t.hasStats) return {};
      const double v[] = {s.min, s.max, s.mean, s.std, s.absMax};
      return number(v[f - FieldMin]);
    }
  }
}
QString fieldTip(const storage::TensorRecord& t, int f) {
  const auto& s = t.stats;
  if (f >= FieldMin && t.hasStats) {
    const double v[] = {s.min, s.max, s.mean, s.std, s.absMax};
    return QString::number(v[f - FieldMin], 'g', 17);
  }
  QStringList tip;
  tip << QObject::tr("tensor id %1, version %2, buffer %3")
             .arg(t.tensorId)
             .arg(t.version)
             .arg(t.bufferId)
      << QObject::tr("strides %1, offset %2, device %3")
             .arg(QString::fromStdString(storage::shapeText(t.strides)))
             .arg(t.offset)
             .arg(QString::fromStdString(t.device));
  if (f == FieldMd5 || f == FieldMd5Rounded) tip.prepend(fieldText(t, f));
  return tip.join('\n');
}
bool isBadField(const storage::TensorRecord& t, int f) {
  return t.hasStats &&
         ((f == FieldNaN && t.stats.nanCount > 0) || (f == FieldInf && t.stats.infCount > 0));
}

// Elides the text of one column at the right (function names) in a view that elides in the
// middle (paths, MD5s).
class ElideRightDelegate : public QStyledItemDelegate {
 public:
  using QStyledItemDelegate::QStyledItemDelegate;

 protected:
  void initStyleOption(QStyleOptionViewItem* o, const QModelIndex& i) const override {
    QStyledItemDelegate::initStyleOption(o, i);
    o->textElideMode = Qt::ElideRight;
  }
};

// The tensor table's cells: a number too long for its column is written with fewer digits
// (fitNumber), not elided in the middle; other text (an MD5, a shape) is elided as the tree says.
class FitNumberDelegate : public QStyledItemDelegate {
 public:
  using QStyledItemDelegate::QStyledItemDelegate;

 protected:
  void initStyleOption(QStyleOptionViewItem* o, const QModelIndex& i) const override {
    QStyledItemDelegate::initStyleOption(o, i);
    const QWidget* w = o->widget;
    const QStyle* style = w ? w->style() : QApplication::style();
    const int margin = style->pixelMetric(QStyle::PM_FocusFrameHMargin, nullptr, w) + 1;
    const QFontMetrics fm = o->fontMetrics;
    o->text = fitNumber(
        o->text, [&fm](const QString& t) { return fm.horizontalAdvance(t); },
        o->rect.width() - 2 * margin);
  }
};

// A demangled function name (recorders may hand out mangled ones).
QString demangle(const std::string& name) {
  if (name.empty()) return QStringLiteral("??");
  if (name.rfind("_Z", 0) == 0) {
    int status = 0;
    char* out = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
    if (status == 0 && out) {
      QString s = QString::fromUtf8(out);
      std::free(out);
      return s;
    }
    std::free(out);
  }
  return QString::fromStdString(name);
}

// A function's name without its trailing parameter list (and cv-qualifiers), for a narrow
// column: "keel::nn::Block::forwardImpl(keel::Tensor const&)" -> "keel::nn::Block::forwardImpl".
QString withoutParameters(const QString& fn) {
  int end = int(fn.size()) - 1;
  while (end >= 0 && fn[end] != ')') {
    if (fn[end] == '>' || fn[end] == ']') return fn;  // not a parameter list at the end
    --end;
  }
  if (end <= 0) return fn;
  int depth = 0;
  for (int i = end; i >= 0; --i) {
    if (fn[i] == ')') ++depth;
    if (fn[i] == '(' && --depth == 0) return i > 0 ? fn.left(i) : fn;
  }
  return fn;
}

// Note [Keel frames]: the innermost frames of an op's stack are Keel's own — the op wrapper
// (keel::ops::...), the dispatcher, autograd's backward driver and the std::function thunks it
// calls — and tell the user nothing; the first frame outside them is the model code that called
// the op. Those leading frames are folded (shown after the others, collapsed).
bool isKeelFrame(const QString& fn, const std::string& file) {
  static const char* const kPrefixes[] = {"keel::ops::",       "keel::dispatch",   "keel::detail::",
                                          "keel::runBackward", "keel::autograd::", "keel::Buffer::",
                                          "keel::alloc::",     "keel::capture::",  "std::",
                                          "void std::"};
  for (const char* p : kPrefixes)
    if (fn.startsWith(QLatin1String(p))) return true;
  static const char* const kFiles[] = {"engine/src/core/", "engine/include/keel/dispatch.h",
                                       "engine/src/ops/",  "engine/src/alloc/",
                                       "engine/backends/", "capture/"};
  for (const char* f : kFiles)
    if (file.find(f) != std::string::npos) return true;
  return false;
}

// A source path as the source tree names it: without the build directory's leading "../", and
// without the folders above Keel's source tree ("/work/main/engine/src/nn/layers.cpp" was cut in
// the middle, the part that mattered elided). Keel's own files are found by the tree's top
// folders, so a recording made by another build reads the same; other files keep their whole
// path. The hover text keeps it all.
QString shortPath(const std::string& file) {
  QString p = QString::fromStdString(file);
  while (p.startsWith(QLatin1String("../"))) p = p.mid(3);
  if (p.startsWith(QLatin1String("./"))) p = p.mid(2);
  if (!p.startsWith('/')) return p;
  static const char* const kTreeFolders[] = {
      "/engine/src/",      "/engine/include/", "/engine/backends/", "/capture/src/",
      "/capture/include/", "/storage/src/",    "/base/src/",        "/base/include/keel/",
      "/app/keel/",        "/app/studio/",     "/examples/"};
  qsizetype at = -1;
  for (const char* f : kTreeFolders)
    if (const qsizetype i = p.lastIndexOf(QLatin1String(f)); i >= 0) at = std::max(at, i);
  return at >= 0 ? p.mid(at + 1) : p;
}

// A frame of the C++ standard library between two of the program's (std::function's call
// operator and handler, std::__invoke): what a lambda passed through, nothing the user wrote.
bool isLibraryFrame(const QString& fn, const std::string& file) {
  if (file.find("/include/c++/") != std::string::npos) return true;
  const QString name = fn.left(fn.indexOf('<'));  // "keel::Tensor std::__invoke_impl"
  return name.startsWith(QLatin1String("std::")) || name.contains(QLatin1String(" std::"));
}

QString tensorName(storage::Role role, int32_t index) {
  return QStringLiteral("%1 %2")
      .arg(role == storage::Role::Input ? QStringLiteral("input") : QStringLiteral("output"))
      .arg(index);
}

// One tree column per field, sized to the dock: the first column to its contents, the others
// share the rest (stretched), so nothing needs a horizontal scroll; long cells are elided in the
// middle and carry their text as a tooltip.
void fitTreeColumns(QTreeWidget* t) {
  QHeaderView* h = t->header();
  h->setMinimumSectionSize(24);
  h->setStretchLastSection(false);
  for (int c = 0; c < t->columnCount(); ++c)
    h->setSectionResizeMode(c, c == 0 ? QHeaderView::ResizeToContents : QHeaderView::Stretch);
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
  for (auto* it : t->selectedItems()) {
    QStringList cells;
    for (int c = 0; c < t->columnCount(); ++c) cells << it->text(c);
    lines << cells.join('\t');
  }
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
  // Every tab in view at a dock's width: no scroll buttons (which let the Mask tab push Tensors
  // off the left edge); titles are short, and elided only when the dock is narrower still.
  tabs_->tabBar()->setUsesScrollButtons(false);
  tabs_->tabBar()->setElideMode(Qt::ElideRight);
  tabs_->tabBar()->setExpanding(false);

  auto makeTree = [this](const char* name) {
    auto* t = new QTreeWidget(this);
    t->setObjectName(name);
    t->setAlternatingRowColors(true);
    t->setSelectionMode(QAbstractItemView::ExtendedSelection);
    t->setTextElideMode(Qt::ElideMiddle);
    t->setUniformRowHeights(true);
    t->setWordWrap(false);
    addCopyAction(t);
    return t;
  };
  tensors_ = makeTree("inspectorTensors");
  tensors_->setItemDelegate(new FitNumberDelegate(tensors_));
  stack_ = makeTree("inspectorStack");
  stack_->setItemDelegateForColumn(1, new ElideRightDelegate(stack_));
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
  pair_[0].reset();
  pair_[1].reset();
  resetTabs();
}

void InspectorView::resetTabs() {
  details_.reset();
  setHeader(
      tr("<i>No op selected.</i> Click an op in the graph, the op table, the diff "
         "or the log to inspect it."));
  error_->hide();
  tabs_->show();
  tensors_->clear();
  tensors_->setColumnCount(1);
  tensors_->setHeaderLabels({tr("Field")});  // not Qt's default "1" while nothing is selected
  pairDiffs_.clear();
  attributes_->clear();
  attributes_->setColumnCount(2);
  attributes_->setHeaderLabels({tr("Attribute"), tr("Value")});
  values_->clear();
  stack_->clear();
  logs_->setRowCount(0);
  memory_->setRowCount(0);
  for (QTableWidget* t : {logs_, memory_}) t->verticalHeader()->hide();  // shown when comparing
  maskSummary_->clear();
  maskPicture_->setGrid({});
  for (QLabel* l : maskLegend_) l->clear();
  tabs_->setTabVisible(Mask, false);
  setTabCount(Tensors, tr("Tensors"), 0);
  setTabCount(Attributes, tr("Attrs"), 0);
  setTabCount(Values, tr("Values"), 0);
  setTabCount(Stack, tr("Stack"), 0);
  setTabCount(Logs, tr("Logs"), 0);
  setTabCount(Memory, tr("Memory"), 0);
  tabs_->setTabToolTip(Attributes, tr("Attributes"));
}

namespace {
// "kernel cpu · VARIANT" with the run-time parameters on hover (Note [Kernel identity]); red
// when the compared runs' kernels differ.
QString kernelHtml(const storage::KernelRecord& k, bool differs = false) {
  QString variant = QString::fromStdString(k.variant).toHtmlEscaped();
  if (differs) variant = QStringLiteral("<span style='color:#b00020'>%1</span>").arg(variant);
  return QObject::tr("kernel <span title='%1'>%2 · <b>%3</b></span>")
      .arg(QString::fromStdString(k.params).toHtmlEscaped(),
           QString::fromStdString(k.backend).toHtmlEscaped(), variant);
}
}  // namespace

void InspectorView::setDetails(OpDetailsPtr details) {
  const int before = tabs_->currentIndex();
  resetTabs();
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
        << tr("time <b>%1</b>").arg(qs(analysis::durationText(op.endNs - op.beginNs)))
        << tr("thread %1").arg(op.thread);
  if (op.forwardSeq != 0)
    facts << tr("gradient of forward op <a href='op:%1'>#%1</a>").arg(op.forwardSeq);
  text += facts.join(QStringLiteral(" &nbsp;·&nbsp; "));
  if (!op.kernel.empty()) text += QStringLiteral("<br>") + kernelHtml(op.kernel);
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

namespace {
std::vector<const storage::TensorRecord*> sortedTensors(const OpDetails& d) {
  std::vector<const storage::TensorRecord*> ts;
  for (const auto& t : d.op.tensors) ts.push_back(&t);
  std::stable_sort(ts.begin(), ts.end(), [](auto* a, auto* b) {
    return std::pair(int(a->role), a->index) < std::pair(int(b->role), b->index);
  });
  return ts;
}

void styleBad(QTreeWidgetItem* it, int col) {
  it->setBackground(col, QColor(0xf8, 0xc9, 0xc9));
  it->setForeground(col, QColor(0x8b, 0x00, 0x00));
  QFont f = it->font(col);
  f.setBold(true);
  it->setFont(col, f);
}
}  // namespace

// One column per tensor (inputs first), one row per field: the statistics of every tensor are
// in view at once in a narrow dock.
void InspectorView::fillTensors(const OpDetails& d) {
  const auto ts = sortedTensors(d);
  QStringList headers{tr("Field")};
  for (auto* t : ts) headers << tensorName(t->role, t->index);
  tensors_->setColumnCount(int(headers.size()));
  tensors_->setHeaderLabels(headers);
  tensors_->setRootIsDecorated(false);
  const bool rounded =
      std::any_of(ts.begin(), ts.end(), [](auto* t) { return !t->md5Rounded.empty(); });
  for (int f = 0; f < FieldCount; ++f) {
    if (f == FieldMd5Rounded && !rounded) continue;
    auto* row = new QTreeWidgetItem(tensors_);
    row->setText(0, tr(kFieldNames[f]));
    for (int c = 0; c < int(ts.size()); ++c) {
      const storage::TensorRecord& t = *ts[size_t(c)];
      row->setText(c + 1, fieldText(t, f));
      row->setToolTip(c + 1, fieldTip(t, f));
      if (isMonoField(f)) row->setFont(c + 1, monoFont());
      if (isNumberField(f)) row->setTextAlignment(c + 1, Qt::AlignRight | Qt::AlignVCenter);
      if (isBadField(t, f)) styleBad(row, c + 1);
    }
  }
  fitTreeColumns(tensors_);
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
  setTabCount(Attributes, tr("Attrs"), count);
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

// Frames innermost first, except Keel's own leading frames: they are folded into one collapsed
// row after the rest (See Note [Keel frames]), so the first row is the code that called the op.
void InspectorView::addFrames(QTreeWidgetItem* parent, const OpDetails& d) {
  auto add = [this](QTreeWidgetItem* under, int depth, const storage::StackFrame& f) {
    auto* it = under ? new QTreeWidgetItem(under) : new QTreeWidgetItem(stack_);
    const QString fn = demangle(f.function);
    QString loc, fullLoc;
    if (!f.file.empty()) {
      loc = shortPath(f.file);
      fullLoc = QString::fromStdString(f.file);
      if (f.line > 0) {
        loc += QStringLiteral(":%1").arg(f.line);
        fullLoc += QStringLiteral(":%1").arg(f.line);
      }
    }
    const QString tip = QStringLiteral("%1\n%2\naddress %3").arg(fn, fullLoc, hex(f.address));
    it->setText(0, QString::number(depth));
    it->setTextAlignment(0, Qt::AlignRight | Qt::AlignVCenter);
    it->setText(1, withoutParameters(fn));
    it->setData(1, Qt::UserRole, fn);
    // No file: the return address is all there is to go on.
    it->setText(2, loc.isEmpty() ? hex(f.address) : loc);
    if (loc.isEmpty()) {
      it->setFont(2, monoFont());
      it->setForeground(2, palette().color(QPalette::Disabled, QPalette::Text));
    }
    it->setData(2, Qt::UserRole, fullLoc);
    for (int c = 0; c < 3; ++c) it->setToolTip(c, tip);
  };
  if (!d.stack || d.stack->frames.empty()) {
    auto* it = parent ? new QTreeWidgetItem(parent) : new QTreeWidgetItem(stack_);
    it->setText(1, d.op.stackId < 0 ? tr("no stack recorded (record with --stacks)")
                                    : tr("stack #%1 not found").arg(d.op.stackId));
    return;
  }
  const auto& frames = d.stack->frames;
  size_t lead = 0;
  while (lead < frames.size() && isKeelFrame(demangle(frames[lead].function), frames[lead].file))
    ++lead;
  if (lead == frames.size())
    lead = 0;  // all Keel's own (e.g. the optimizer): show them as they are
  // Runs of two or more standard-library frames among the rest are folded in place.
  for (size_t i = lead; i < frames.size();) {
    size_t end = i;
    while (end < frames.size() && isLibraryFrame(demangle(frames[end].function), frames[end].file))
      ++end;
    if (end - i < 2) {
      add(parent, int(i), frames[i]);
      ++i;
      continue;
    }
    auto* group = parent ? new QTreeWidgetItem(parent) : new QTreeWidgetItem(stack_);
    group->setText(1, tr("C++ library (%1 frames)").arg(end - i));
    group->setToolTip(1, tr("std::function, std::invoke and the like: what the call passed "
                            "through between the frames above and below"));
    group->setForeground(1, palette().color(QPalette::Disabled, QPalette::Text));
    group->setData(0, Qt::UserRole, QStringLiteral("library-frames"));
    for (; i < end; ++i) add(group, int(i), frames[i]);
    group->setExpanded(false);
  }
  if (lead > 0) {
    auto* group = parent ? new QTreeWidgetItem(parent) : new QTreeWidgetItem(stack_);
    group->setText(
        1, lead == 1 ? tr("Keel dispatch (1 frame)") : tr("Keel dispatch (%1 frames)").arg(lead));
    group->setToolTip(1, tr("The op wrapper, the dispatcher and autograd: Keel's own frames "
                            "between the calling code (above) and the kernel"));
    group->setForeground(1, palette().color(QPalette::Disabled, QPalette::Text));
    group->setFirstColumnSpanned(false);
    group->setData(0, Qt::UserRole, QStringLiteral("keel-frames"));
    for (size_t i = 0; i < lead; ++i) add(group, int(i), frames[i]);
    group->setExpanded(false);
  }
}

void InspectorView::fillStack(const OpDetails& d) {
  stack_->setColumnCount(3);
  stack_->setHeaderLabels({tr("#"), tr("Function"), tr("Location")});
  addFrames(nullptr, d);
  stack_->setRootIsDecorated(true);
  fitTreeColumns(stack_);
  setTabCount(Stack, tr("Stack"), d.stack ? qsizetype(d.stack->frames.size()) : 0);
}

void InspectorView::fillLogs(const OpDetails& d) {
  logs_->setRowCount(0);
  appendLogs(d, std::nullopt);
  fitColumns(logs_);
  setTabCount(Logs, tr("Logs"), qsizetype(d.logs.size()));
}

// In compare mode each row's side is its vertical header ("A" / "B", the run on hover).
void InspectorView::markRowSide(QTableWidget* t, int row, std::optional<Side> side) {
  if (!side) return;
  auto* h = new QTableWidgetItem(*side == Side::A ? QStringLiteral("A") : QStringLiteral("B"));
  h->setToolTip(sideLabel(*side));
  h->setForeground(*side == Side::A ? QColor(0x1f, 0x77, 0xb4) : QColor(0xe0, 0x6c, 0x00));
  t->setVerticalHeaderItem(row, h);
}

void InspectorView::appendLogs(const OpDetails& d, std::optional<Side> side) {
  const int first = logs_->rowCount();
  logs_->setRowCount(first + int(d.logs.size()));
  for (int i = 0; i < int(d.logs.size()); ++i) {
    const int row = first + i;
    markRowSide(logs_, row, side);
    const storage::LogRecord& l = d.logs[size_t(i)];
    auto* level = cell(qs(logLevelName(l.level)));
    if (auto c = logLevelColor(l.level); c.isValid()) level->setForeground(c);
    logs_->setItem(row, 0, level);
    logs_->setItem(row, 1, cell(QString::fromStdString(l.scope)));
    auto* msg = cell(QString::fromStdString(l.message));
    msg->setToolTip(msg->text());
    logs_->setItem(row, 2, msg);
  }
}

void InspectorView::fillMemory(const OpDetails& d) {
  memory_->setRowCount(0);
  appendMemory(d, std::nullopt);
  fitColumns(memory_);
  setTabCount(Memory, tr("Memory"), qsizetype(d.mems.size()));
}

void InspectorView::appendMemory(const OpDetails& d, std::optional<Side> side) {
  const int first = memory_->rowCount();
  memory_->setRowCount(first + int(d.mems.size()));
  for (int i = 0; i < int(d.mems.size()); ++i) {
    const int row = first + i;
    markRowSide(memory_, row, side);
    const storage::MemRecord& m = d.mems[size_t(i)];
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
}

// Compare mode: A's rows, then B's, each marked with its side.
void InspectorView::fillPairLogsAndMemory(const OpDetails& a, const OpDetails& b) {
  logs_->setRowCount(0);
  memory_->setRowCount(0);
  for (QTableWidget* t : {logs_, memory_}) t->verticalHeader()->show();
  appendLogs(a, Side::A);
  appendLogs(b, Side::B);
  appendMemory(a, Side::A);
  appendMemory(b, Side::B);
  fitColumns(logs_);
  fitColumns(memory_);
  setTabCount(Logs, tr("Logs"), qsizetype(a.logs.size() + b.logs.size()));
  setTabCount(Memory, tr("Memory"), qsizetype(a.mems.size() + b.mems.size()));
}

// Compare mode: each attribute of A and B side by side (compact JSON), a B value that differs
// from A's tinted, one missing on a side shown as "—".
void InspectorView::fillPairAttributes(const OpDetails& a, const OpDetails& b) {
  attributes_->setColumnCount(3);
  attributes_->setHeaderLabels({tr("Attribute"), sideLabel(Side::A), sideLabel(Side::B)});
  attributes_->setRootIsDecorated(false);
  auto objectOf = [](const std::string& json) {
    return QJsonDocument::fromJson(QByteArray::fromStdString(json)).object();
  };
  const QJsonObject oa = objectOf(a.op.attrsJson), ob = objectOf(b.op.attrsJson);
  QStringList keys = oa.keys();
  for (const QString& k : ob.keys())
    if (!oa.contains(k)) keys << k;
  auto text = [](const QJsonObject& o, const QString& k) -> QString {
    if (!o.contains(k)) return QStringLiteral("—");
    const QJsonValue v = o.value(k);
    if (v.isString()) return v.toString();
    if (v.isObject())
      return QString::fromUtf8(QJsonDocument(v.toObject()).toJson(QJsonDocument::Compact));
    if (v.isArray())
      return QString::fromUtf8(QJsonDocument(v.toArray()).toJson(QJsonDocument::Compact));
    return QString::fromUtf8(QJsonDocument(QJsonArray{v}).toJson(QJsonDocument::Compact))
        .mid(1)
        .chopped(1);
  };
  for (const QString& k : keys) {
    auto* it = new QTreeWidgetItem(attributes_);
    it->setText(0, k);
    it->setText(1, text(oa, k));
    it->setText(2, text(ob, k));
    for (int c : {1, 2}) {
      it->setFont(c, monoFont());
      it->setToolTip(c, it->text(c));
    }
    if (it->text(1) != it->text(2)) it->setBackground(2, QColor(0xff, 0xec, 0xb3));
  }
  if (keys.isEmpty()) {
    auto* it = new QTreeWidgetItem(attributes_);
    it->setText(0, tr("(no attributes)"));
    it->setForeground(0, palette().color(QPalette::Disabled, QPalette::Text));
  }
  attributes_->resizeColumnToContents(0);
  setTabCount(Attributes, tr("Attrs"), keys.size());
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

// ---- Comparing two runs -------------------------------------------------------------------

void InspectorView::setCompare(const QString& labelA, const QString& labelB) {
  comparing_ = true;
  labels_[0] = labelA;
  labels_[1] = labelB;
  if (details_ && !pair_[0]) pair_[0] = details_;
  showPair();
}

void InspectorView::setDetails(Side side, OpDetailsPtr details) {
  if (!comparing_) {
    if (side == side_) setDetails(std::move(details));
    return;
  }
  pair_[int(side)] = std::move(details);
  showPair();
}

void InspectorView::setDiff(DiffPtr report) {
  diff_ = std::move(report);
  if (comparing_ && (pair_[0] || pair_[1])) showPair();
}

QString InspectorView::sideLabel(Side side) const {
  const QString letter = side == Side::A ? QStringLiteral("A") : QStringLiteral("B");
  const QString& l = labels_[int(side)];
  return l.isEmpty() ? letter : QStringLiteral("%1: %2").arg(letter, l);
}

std::optional<storage::TensorDiff> InspectorView::tensorDiff(storage::Role role,
                                                             int32_t index) const {
  for (const auto& t : pairDiffs_)
    if (t.role == role && t.index == index) return t;
  return std::nullopt;
}

namespace {
// compared false: counted Equal only because there was nothing to compare (DiffBasis::None).
QColor statusColor(storage::DiffStatus s, bool compared) {
  if (!compared) return QColor(0x75, 0x75, 0x75);
  switch (s) {
    case storage::DiffStatus::Equal:
      return QColor(0x2e, 0x7d, 0x32);
    case storage::DiffStatus::WithinTolerance:
      return QColor(0xb2, 0x6a, 0x00);
    case storage::DiffStatus::Diverged:
      return QColor(0xb7, 0x1c, 0x1c);
    case storage::DiffStatus::Unmatched:
      break;
  }
  return QColor(0x75, 0x75, 0x75);
}

QString statusText(storage::DiffStatus s, bool compared) {
  if (!compared) return QObject::tr("not compared");
  switch (s) {
    case storage::DiffStatus::Equal:
      return QObject::tr("equal");
    case storage::DiffStatus::WithinTolerance:
      return QObject::tr("within tolerance");
    case storage::DiffStatus::Diverged:
      return QObject::tr("diverged");
    case storage::DiffStatus::Unmatched:
      break;
  }
  return QObject::tr("on one side only");
}

const storage::TensorRecord* findTensor(const OpDetails& d, storage::Role role, int32_t index) {
  for (const auto& t : d.op.tensors)
    if (t.role == role && t.index == index) return &t;
  return nullptr;
}

const storage::TensorDiff* findDiff(const std::vector<storage::TensorDiff>& ds, storage::Role role,
                                    int32_t index) {
  for (const auto& t : ds)
    if (t.role == role && t.index == index) return &t;
  return nullptr;
}
}  // namespace

void InspectorView::showPair() {
  const int before = tabs_->currentIndex();
  const OpDetailsPtr a = pair_[0], b = pair_[1];
  if (!a || !b || !a->error.empty() || !b->error.empty()) {
    // One side only (an op on one side of the alignment, or the other still loading), or an
    // error: that side alone, said which.
    const Side side = (a && (!b || !a->error.empty())) ? Side::A : Side::B;
    setDetails(side == Side::A ? a : b);
    if (details_)
      setHeader(QStringLiteral("<b>%1</b><br>").arg(sideLabel(side).toHtmlEscaped()) +
                header_->text());
    return;
  }
  resetTabs();
  details_ = a;
  const storage::OpRecord& opA = a->op;
  const storage::OpRecord& opB = b->op;

  const storage::OpPair* pair = nullptr;
  const storage::Divergence* divergence = nullptr;
  if (diff_) {
    for (const auto& p : diff_->pairs)
      if (p.inA && p.inB && p.seqA == opA.seq && p.seqB == opB.seq) {
        pair = &p;
        break;
      }
    for (const auto* dv : {&diff_->first, &diff_->root})
      if (*dv && (*dv)->pair.seqA == opA.seq && (*dv)->pair.seqB == opB.seq) divergence = &**dv;
  }

  // Header: the op, then one line per side with its run's label.
  const QString scope = opA.scope.empty() ? tr("<i>top level</i>")
                                          : QString::fromStdString(opA.scope).toHtmlEscaped();
  QString text = QStringLiteral("<span style='font-size:14pt'><b>%1</b></span>")
                     .arg(QString::fromStdString(opA.name).toHtmlEscaped());
  if (opB.name != opA.name)
    text += QStringLiteral(" / <b>%1</b>").arg(QString::fromStdString(opB.name).toHtmlEscaped());
  text += QStringLiteral(" &nbsp;·&nbsp; phase <b>%1</b> &nbsp;·&nbsp; scope <b>%2</b>")
              .arg(qs(phaseName(opA.phase)).toHtmlEscaped(), scope);
  if (pair)
    text += QStringLiteral(" &nbsp;·&nbsp; <b><span style='color:%1'>%2</span></b>")
                .arg(statusColor(pair->status, storage::valuesCompared(*pair)).name(),
                     statusText(pair->status, storage::valuesCompared(*pair)));
  else if (diff_)
    text += tr(" &nbsp;·&nbsp; <i>not an aligned pair of the diff</i>");
  // Which kernel each side ran, the differing one in red (Note [Kernel identity]).
  const bool kernelsDiffer =
      !opA.kernel.empty() && !opB.kernel.empty() && opA.kernel.variant != opB.kernel.variant;
  for (Side side : {Side::A, Side::B}) {
    const storage::OpRecord& o = side == Side::A ? opA : opB;
    text += QStringLiteral("<br><b>%1</b> &nbsp;#%2 &nbsp;·&nbsp; step %3 &nbsp;·&nbsp; %4")
                .arg(sideLabel(side).toHtmlEscaped())
                .arg(o.seq)
                .arg(o.step)
                .arg(qs(analysis::durationText(o.endNs - o.beginNs)));
    if (!o.kernel.empty())
      text += QStringLiteral(" &nbsp;·&nbsp; ") + kernelHtml(o.kernel, kernelsDiffer);
  }
  if (kernelsDiffer)
    text +=
        tr("<br><span style='color:#b00020'><b>different kernels</b></span>: the two runs "
           "computed this op differently");
  setHeader(text);

  // Differences: the diff's (whole dumped tensors) where it has them, else computed here from
  // the two snapshots (their dumps when complete, else MD5s and statistics).
  const storage::DiffOptions opts = diff_ ? diff_->options : storage::DiffOptions{};
  const storage::DumpValues values = [&](uint64_t, int role, int index,
                                         bool sideA) -> std::optional<std::vector<double>> {
    for (const auto& dump : (sideA ? a : b)->dumps)
      if (int(dump.role) == role && dump.index == index && dump.numel > 0 &&
          int64_t(dump.values.size()) == dump.numel)
        return dump.values;
    return std::nullopt;
  };
  std::set<std::pair<int, int32_t>> keys;  // outputs first
  for (const OpDetails* d : {a.get(), b.get()})
    for (const auto& t : d->op.tensors)
      keys.insert({t.role == storage::Role::Output ? 0 : 1, t.index});
  for (const auto& [r, index] : keys) {
    const storage::Role role = r == 0 ? storage::Role::Output : storage::Role::Input;
    const storage::TensorRecord* ta = findTensor(*a, role, index);
    const storage::TensorRecord* tb = findTensor(*b, role, index);
    storage::TensorDiff td;
    if (ta && tb) {
      const storage::TensorDiff* known = nullptr;
      if (pair && role == storage::Role::Output) known = findDiff(pair->outputs, role, index);
      if (divergence && role == storage::Role::Input)
        known = findDiff(divergence->inputs, role, index);
      td = known ? *known : storage::compareTensors(*ta, *tb, opA.seq, opB.seq, opts, values);
    } else {
      td.status = storage::DiffStatus::Diverged;
      td.basis = storage::DiffBasis::Missing;
      td.detail = ta ? "only in A" : "only in B";
    }
    td.role = role;
    td.index = index;
    pairDiffs_.push_back(td);
  }
  fillPairTensors(*a, *b);
  fillPairAttributes(*a, *b);
  fillPairValues(*a, *b);
  fillPairStack(*a, *b);
  fillPairLogsAndMemory(*a, *b);
  fillMask(*a);  // the same mask attributes on both sides unless Attrs shows otherwise
  tabs_->setTabToolTip(Attributes, tr("Attributes of A and B side by side"));
  tabs_->setTabToolTip(Logs, tr("Log lines of A's op, then B's (the row header says which)"));
  tabs_->setTabToolTip(Memory,
                       tr("Allocator events of A's op, then B's (the row header says which)"));
  tabs_->setTabToolTip(Mask, tr("%1 (run A)").arg(sideLabel(Side::A)));
  tabs_->setCurrentIndex(before >= 0 && tabs_->isTabVisible(before) ? before : int(Tensors));
}

// Per tensor (outputs first): its verdict, then each field of A and B side by side (a B cell that
// differs from A's is tinted), then the element-wise difference.
void InspectorView::fillPairTensors(const OpDetails& a, const OpDetails& b) {
  tensors_->setColumnCount(3);
  tensors_->setHeaderLabels({tr("Field"), sideLabel(Side::A), sideLabel(Side::B)});
  tensors_->headerItem()->setToolTip(1, sideLabel(Side::A));
  tensors_->headerItem()->setToolTip(2, sideLabel(Side::B));
  tensors_->setRootIsDecorated(true);
  const QColor differs(0xff, 0xec, 0xb3);
  for (const storage::TensorDiff& td : pairDiffs_) {
    const storage::TensorRecord* ta = findTensor(a, td.role, td.index);
    const storage::TensorRecord* tb = findTensor(b, td.role, td.index);
    auto* top = new QTreeWidgetItem(tensors_);
    const bool compared =
        td.basis != storage::DiffBasis::None || td.status != storage::DiffStatus::Equal;
    QString verdict = statusText(td.status, compared);
    if (td.basis != storage::DiffBasis::None)
      verdict += QStringLiteral(" (%1)").arg(QString::fromUtf8(storage::toString(td.basis)));
    // The diff's detail phrase on hover: the row stays short enough for a narrow dock.
    top->setText(0, tensorName(td.role, td.index) + QStringLiteral(" — ") + verdict);
    if (!td.detail.empty()) verdict += QStringLiteral(": ") + QString::fromStdString(td.detail);
    top->setForeground(0, statusColor(td.status, compared));
    QFont bold = top->font(0);
    bold.setBold(true);
    top->setFont(0, bold);
    top->setFirstColumnSpanned(true);
    top->setToolTip(0, tensorName(td.role, td.index) + QStringLiteral(" — ") + verdict);
    top->setData(0, Qt::UserRole, int(td.status));
    for (int f = 0; f < FieldCount; ++f) {
      if (f == FieldMd5Rounded &&
          !((ta && !ta->md5Rounded.empty()) || (tb && !tb->md5Rounded.empty())))
        continue;
      auto* row = new QTreeWidgetItem(top);
      row->setText(0, tr(kFieldNames[f]));
      for (int c = 1; c <= 2; ++c) {
        const storage::TensorRecord* t = c == 1 ? ta : tb;
        if (!t) continue;
        row->setText(c, fieldText(*t, f));
        row->setToolTip(c, fieldTip(*t, f));
        if (isMonoField(f)) row->setFont(c, monoFont());
        if (isNumberField(f)) row->setTextAlignment(c, Qt::AlignRight | Qt::AlignVCenter);
        if (isBadField(*t, f)) styleBad(row, c);
      }
      if (ta && tb && row->text(1) != row->text(2) && !isBadField(*tb, f))
        row->setBackground(2, differs);
    }
    // The element-wise difference, where values were compared.
    auto diffRow = [&](const QString& name, const QString& value, const QString& tip) {
      auto* row = new QTreeWidgetItem(top);
      row->setText(0, name);
      row->setText(1, value);
      row->setFont(1, monoFont());
      row->setTextAlignment(1, Qt::AlignRight | Qt::AlignVCenter);
      row->setToolTip(0, tip);
      row->setToolTip(1, tip);
      QFont f = row->font(0);
      f.setItalic(true);
      row->setFont(0, f);
      return row;
    };
    if (td.basis == storage::DiffBasis::Values) {
      auto* maxAbs = diffRow(tr("max |A − B|"), number(td.maxAbs, 6),
                             tr("largest absolute difference of an element: %1")
                                 .arg(QString::number(td.maxAbs, 'g', 17)));
      maxAbs->setData(1, Qt::UserRole, td.maxAbs);
      maxAbs->setData(0, Qt::UserRole, QStringLiteral("maxAbs"));
      diffRow(
          tr("max rel"), number(td.maxRel, 6),
          tr("largest |A − B| / |B| of an element: %1").arg(QString::number(td.maxRel, 'g', 17)));
      diffRow(
          tr("max ULPs"),
          td.maxUlps == UINT64_MAX ? tr("NaN vs number") : QStringLiteral("%L1").arg(td.maxUlps),
          tr("largest distance in units in the last place, in the tensor's dtype"));
      int64_t numel = 1;
      for (int64_t x : (ta ? ta : tb)->shape) numel *= x;
      diffRow(tr("outside tol."), tr("%L1 of %L2").arg(td.badElements).arg(numel),
              tr("elements with |A − B| > atol + rtol·|B| (atol %1, rtol %2)")
                  .arg(diff_ ? diff_->options.atol : storage::DiffOptions{}.atol)
                  .arg(diff_ ? diff_->options.rtol : storage::DiffOptions{}.rtol));
    }
    top->setExpanded(td.role == storage::Role::Output || td.status != storage::DiffStatus::Equal);
  }
  fitTreeColumns(tensors_);
  setTabCount(Tensors, tr("Tensors"), qsizetype(pairDiffs_.size()));
}

// Dumped values of A and B in columns, with A − B and a mark on each element that differs.
void InspectorView::fillPairValues(const OpDetails& a, const OpDetails& b) {
  std::set<std::pair<int, int32_t>> keys;
  for (const OpDetails* d : {&a, &b})
    for (const auto& dump : d->dumps) keys.insert({int(dump.role), dump.index});
  if (keys.empty()) {
    fillValues(a);
    return;
  }
  auto find = [](const OpDetails& d, int role, int32_t index) -> const OpDetails::Dump* {
    for (const auto& dump : d.dumps)
      if (int(dump.role) == role && dump.index == index) return &dump;
    return nullptr;
  };
  QString text = QStringLiteral("%1\n%2\n\n").arg(sideLabel(Side::A), sideLabel(Side::B));
  for (const auto& [role, index] : keys) {
    const OpDetails::Dump* da = find(a, role, index);
    const OpDetails::Dump* db = find(b, role, index);
    const OpDetails::Dump* any = da ? da : db;
    text += QStringLiteral("%1  shape %2  %L3 elements")
                .arg(tensorName(storage::Role(role), index))
                .arg(QString::fromStdString(storage::shapeText(any->shape)))
                .arg(any->numel);
    if (!da || !db) text += da ? tr("  (dumped in A only)") : tr("  (dumped in B only)");
    text += '\n';
    const size_t n = std::max(da ? da->values.size() : 0, db ? db->values.size() : 0);
    const int w = int(QString::number(qulonglong(n)).size());
    text += QStringLiteral("  %1  %2 %3 %4\n")
                .arg(QString(), w + 2)
                .arg(QStringLiteral("A"), 13)
                .arg(QStringLiteral("B"), 13)
                .arg(QStringLiteral("A − B"), 13);
    for (size_t i = 0; i < n; ++i) {
      const bool hasA = da && i < da->values.size(), hasB = db && i < db->values.size();
      const double va = hasA ? da->values[i] : 0, vb = hasB ? db->values[i] : 0;
      const bool same = hasA && hasB && (va == vb || (std::isnan(va) && std::isnan(vb)));
      text += QStringLiteral("  [%1] %2 %3 %4 %5\n")
                  .arg(qulonglong(i), w)
                  .arg(hasA ? number(va, 6) : QString(), 13)
                  .arg(hasB ? number(vb, 6) : QString(), 13)
                  .arg(hasA && hasB ? number(va - vb, 6) : QString(), 13)
                  .arg(same ? QString() : QStringLiteral("≠"));
    }
    if (int64_t(n) < any->numel) text += tr("  (first %L1 shown)\n").arg(qulonglong(n));
    text += '\n';
  }
  values_->setPlainText(text);
  setTabCount(Values, tr("Values"), qsizetype(keys.size()));
}

// Both call stacks, one under each run's label.
void InspectorView::fillPairStack(const OpDetails& a, const OpDetails& b) {
  stack_->setColumnCount(3);
  stack_->setHeaderLabels({tr("#"), tr("Function"), tr("Location")});
  stack_->setRootIsDecorated(true);
  for (Side side : {Side::A, Side::B}) {
    const OpDetails& d = side == Side::A ? a : b;
    auto* top = new QTreeWidgetItem(stack_);
    top->setText(0, QStringLiteral("%1 — #%2").arg(sideLabel(side)).arg(d.op.seq));
    top->setFirstColumnSpanned(true);
    QFont bold = top->font(0);
    bold.setBold(true);
    top->setFont(0, bold);
    addFrames(top, d);
    top->setExpanded(true);
  }
  fitTreeColumns(stack_);
  const auto count = [](const OpDetails& d) {
    return d.stack ? qsizetype(d.stack->frames.size()) : 0;
  };
  setTabCount(Stack, tr("Stack"), std::max(count(a), count(b)));
}

// A word-wrapped label does not grow by itself when its text or width changes: give it the
// height its text needs at its current width, so the header is never clipped.
void InspectorView::setHeader(const QString& text) {
  header_->setText(text);
  fitHeader();
}

void InspectorView::fitHeader() {
  // The header spans the inspector (no layout margins); its own width lags behind in a resize.
  const int w = width();
  const int h = std::max(header_->heightForWidth(w), header_->fontMetrics().height() + 8);
  if (h == header_->height() && h == header_->minimumHeight()) return;
  header_->setFixedHeight(h);
  // Lay the tabs out under the new height now, not at the next event loop pass: a picture taken
  // right after setDetails (the screenshot mode) must not show them over the header.
  if (layout() && !isHidden()) layout()->activate();
}

void InspectorView::resizeEvent(QResizeEvent* e) {
  QWidget::resizeEvent(e);
  fitHeader();
}

}  // namespace keel::views
