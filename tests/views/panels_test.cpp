// The studio's panels (op table, inspector, diff, log, loss plot) on recordings made by the real
// keel binary: counts and values are pinned against the storage read API, every model and proxy
// runs under QAbstractItemModelTester, and clicks reach the shared Selection.
#include <QAbstractItemModelTester>
#include <QCheckBox>
#include <QComboBox>
#include <QDir>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QPlainTextEdit>
#include <QScrollBar>
#include <QSignalSpy>
#include <QTabBar>
#include <QTabWidget>
#include <QTableView>
#include <QTableWidget>
#include <QTreeWidget>
#include <QtTest>
#include <algorithm>

#include "keel/base/text.h"
#include "keel/storage/export.h"
#include "keel/storage/reader.h"
#include "keel/views/diff_view.h"
#include "keel/views/inspector.h"
#include "keel/views/log_view.h"
#include "keel/views/loss_plot.h"
#include "keel/views/memory_view.h"
#include "keel/views/op_table.h"
#include "keel/views/run_source.h"
#include "keel/views/selection.h"
#include "text_util.h"
#include "view_test_util.h"

using namespace keel::views;
using keel::MemEventKind;
using keel::MemTag;
using keel::Phase;
using keel::storage::Recording;
using keel::views::test::loadOp;
using keel::views::test::stepOf;

namespace {

constexpr auto kFailHard = QAbstractItemModelTester::FailureReportingMode::QtTest;
const std::string kOptions =
    "--steps 2 --seed 5 --md5 --stats --stacks --allocator --dumps --dump-ops matmul "
    "--verbose blocks.0.attn";

// Every piece of text the widget's children show: labels, item widgets, text edits.
QStringList allText(QWidget* w) {
  QStringList out;
  for (auto* l : w->findChildren<QLabel*>()) out << l->text();
  for (auto* t : w->findChildren<QTableWidget*>())
    for (int r = 0; r < t->rowCount(); ++r)
      for (int c = 0; c < t->columnCount(); ++c)
        if (auto* it = t->item(r, c)) out << it->text();
  for (auto* t : w->findChildren<QTreeWidget*>())
    for (QTreeWidgetItemIterator it(t); *it; ++it)
      for (int c = 0; c < t->columnCount(); ++c) out << (*it)->text(c);
  for (auto* e : w->findChildren<QPlainTextEdit*>()) out << e->toPlainText();
  return out;
}

bool showsText(QWidget* w, const QString& needle) {
  const auto texts = allText(w);
  return std::any_of(texts.begin(), texts.end(),
                     [&](const QString& t) { return t.contains(needle); });
}

void clickRow(QTableView* table, int row) {
  const QModelIndex idx = table->model()->index(row, 1);
  table->scrollTo(idx);
  QTest::mouseClick(table->viewport(), Qt::LeftButton, {}, table->visualRect(idx).center());
}

}  // namespace

class PanelsTest : public QObject {
  Q_OBJECT
 private slots:
  // A rank of a run folder is named with its folder: two run folders compared both read
  // "rank-0.db" in the panes, the legend and the status bar.
  void aRankOfARunFolderIsNamedWithItsFolder() {
    const QString dir = test::tempDir() + "/runA";
    QVERIFY(QDir().mkpath(dir));
    QFile manifest(dir + "/manifest.json");
    QVERIFY(manifest.open(QIODevice::WriteOnly));
    manifest.write("{}");
    manifest.close();
    QCOMPARE(recordingName(dir + "/rank-0.db"), QString("runA/rank-0.db"));
    QCOMPARE(recordingName(test::tempDir() + "/rank-0.db"), QString("rank-0.db"));  // no folder
    QCOMPARE(recordingName(dir + "/other.db"), QString("other.db"));
  }

  // The inspector's tensor table writes a number too long for its column with fewer digits
  // (the text_util.h rule), never cut in the middle: "-0.…885" lost the exponent and the digits
  // that matter. Widths here are in characters.
  void numbersTooLongForTheirColumnKeepTheirMagnitude() {
    auto chars = [](const QString& t) { return int(t.size()); };
    QCOMPARE(fitNumber("-0.0036885", chars, 10), QString("-0.0036885"));  // fits: as it was
    QCOMPARE(fitNumber("-0.0036885", chars, 8), QString("-0.00369"));
    QCOMPARE(fitNumber("-0.0036885", chars, 7), QString("-0.0037"));
    QCOMPARE(fitNumber("2.9317e-11", chars, 8), QString("2.93e-11"));
    QCOMPARE(fitNumber("1.6e-09", chars, 6), QString("1.6e-9"));
    QCOMPARE(fitNumber("0.14538", chars, 5), QString("0.145"));
    QCOMPARE(fitNumber("123456789", chars, 6), QString("1.23e8"));
    QCOMPARE(fitNumber("-1.2345e-12", chars, 7), QString("-1e-12"));  // the magnitude, at least
    QCOMPARE(fitNumber("-0.0036885", chars, 2), QString("-4e-3"));    // nothing fits: 1 digit
    // Not numbers: as they were (the tree elides them).
    QCOMPARE(fitNumber("65,536", chars, 3), QString("65,536"));
    QCOMPARE(fitNumber("d43e7fa1b21", chars, 4), QString("d43e7fa1b21"));
    QCOMPARE(fitNumber("nan", chars, 1), QString("nan"));
  }

  void initTestCase() {
    registerViewTypes();
    pathA_ = test::tempDir() + "/a.db";
    pathB_ = test::tempDir() + "/b.db";
    QVERIFY(test::recordFixture(pathA_, kOptions));
    QVERIFY(test::recordFixture(pathB_, kOptions, "KEEL_TEST_PERTURB=matmul:5"));
  }

  void opTableHasEveryOpOfTheStepAndFiltersWithOneProxy() {
    Recording rec = Recording::open(pathA_.toStdString());
    const auto ops = rec.stepOps(1);
    Selection sel;
    OpTableView view(&sel, Side::A);
    QAbstractItemModelTester modelTester(view.model(), kFailHard);
    QAbstractItemModelTester proxyTester(view.proxy(), kFailHard);
    view.setStep(stepOf(rec, 1));
    QCOMPARE(size_t(view.model()->rowCount()), ops.size());
    QCOMPARE(size_t(view.proxy()->rowCount()), ops.size());
    QCOMPARE(view.model()->columnCount(), int(OpTableModel::ColumnCount));
    {  // a column the user widened keeps its width when the table is resized
      QVERIFY(test::showAt(view, {900, 400}));
      auto* table = view.findChild<QTableView*>("opTable");
      QVERIFY(table);
      table->horizontalHeader()->resizeSection(OpTableModel::Scope, 333);
      view.resize(700, 400);
      QTest::qWait(20);
      QApplication::processEvents();
      QCOMPARE(table->columnWidth(OpTableModel::Scope), 333);
    }

    const auto count = [&](auto pred) { return int(std::count_if(ops.begin(), ops.end(), pred)); };
    const int backward = count([](const auto& o) { return o.phase == Phase::Backward; });
    QVERIFY(backward > 0 && backward < int(ops.size()));
    view.findChild<QComboBox*>("opFilterPhase")->setCurrentIndex(2);  // Backward
    QCOMPARE(view.proxy()->phase(), QString("backward"));
    QCOMPARE(view.proxy()->rowCount(), backward);

    // Text filter over name or scope, together with the phase filter.
    view.findChild<QLineEdit*>("opFilterText")->setText("MLP");
    const int mlpBackward = count([](const auto& o) {
      return o.phase == Phase::Backward &&
             (o.scope.find("mlp") != std::string::npos || o.name.find("mlp") != std::string::npos);
    });
    QVERIFY(mlpBackward > 0);
    QCOMPARE(view.proxy()->rowCount(), mlpBackward);
    view.setPhaseFilter("");
    view.setTextFilter("matmul");
    QCOMPARE(view.proxy()->rowCount(),
             count([](const auto& o) { return o.name.find("matmul") != std::string::npos; }));
    view.setTextFilter("");
    QCOMPARE(size_t(view.proxy()->rowCount()), ops.size());

    // Row text: seq, time in µs, MD5 prefix with the full hash in the tooltip.
    const auto& op = ops[3];
    const auto* out = &*std::find_if(op.tensors.begin(), op.tensors.end(), [](const auto& t) {
      return t.role == keel::storage::Role::Output && t.index == 0;
    });
    auto* m = view.model();
    QCOMPARE(m->index(3, OpTableModel::Seq).data().toULongLong(), op.seq);
    QCOMPARE(m->index(3, OpTableModel::Name).data().toString(), QString::fromStdString(op.name));
    QCOMPARE(m->index(3, OpTableModel::Time).data().toString(),
             QString::number((op.endNs - op.beginNs) / 1000.0, 'f', 1));
    QCOMPARE(m->index(3, OpTableModel::Md5).data().toString(),
             QString::fromStdString(out->md5.substr(0, 8)) + "…");
    QVERIFY(m->index(3, OpTableModel::Md5)
                .data(Qt::ToolTipRole)
                .toString()
                .contains(QString::fromStdString(out->md5)));
  }

  // The record tables take their columns from one list each (RecordTableModel): every column of
  // each model's enum has its title, in order, and the tooltips sit on their columns.
  void everyRecordTableTitlesEachOfItsColumns() {
    const auto titles = [](const QAbstractItemModel& m) {
      QStringList t;
      for (int c = 0; c < m.columnCount(); ++c) t << m.headerData(c, Qt::Horizontal).toString();
      return t.join('|');
    };
    OpTableModel ops;
    DiffModel diff;
    LogModel logs;
    MemSectionModel sections;
    QCOMPARE(ops.columnCount(), int(OpTableModel::ColumnCount));
    QCOMPARE(diff.columnCount(), int(DiffModel::ColumnCount));
    QCOMPARE(logs.columnCount(), int(LogModel::ColumnCount));
    QCOMPARE(sections.columnCount(), int(MemSectionModel::ColumnCount));
    QCOMPARE(titles(ops), QString("Seq|Op|Phase|Scope|Time (µs)|Output shape|MD5|NaN/Inf"));
    QCOMPARE(titles(diff),
             QString("Status|Step|A #|B #|Op|Phase|Scope|Max abs|Max rel|Basis|Kernel|Detail"));
    QCOMPARE(titles(logs), QString("Step|Op #|Level|Scope|Message"));
    QCOMPARE(
        titles(sections),
        QString("Section|Alive at end|Allocated by|Peak inside|Allocated|Allocs|Frees|Events"));
    QVERIFY(ops.headerData(OpTableModel::NonFinite, Qt::Horizontal, Qt::ToolTipRole)
                .toString()
                .contains("--stats"));
    QVERIFY(diff.headerData(DiffModel::Kernel, Qt::Horizontal, Qt::ToolTipRole)
                .toString()
                .contains("kernel variant"));
    QVERIFY(!ops.headerData(OpTableModel::Name, Qt::Horizontal, Qt::ToolTipRole).isValid());
    QVERIFY(!logs.headerData(0, Qt::Vertical).isValid());
    QVERIFY(!logs.headerData(LogModel::ColumnCount, Qt::Horizontal).isValid());
    QCOMPARE(ops.rowCount(), 0);  // no step yet
    QCOMPARE(ops.rowCount(ops.index(0, 0)), 0);
  }

  void opTableSortsByTimeLongestFirst() {
    Recording rec = Recording::open(pathA_.toStdString());
    const auto ops = rec.stepOps(1);
    Selection sel;
    OpTableView view(&sel, Side::A);
    QAbstractItemModelTester proxyTester(view.proxy(), kFailHard);
    view.setStep(stepOf(rec, 1));
    // Clicking the header twice: ascending, then descending.
    QHeaderView* header = view.table()->horizontalHeader();
    const int x = header->sectionViewportPosition(OpTableModel::Time) + 5;
    QTest::mouseClick(header->viewport(), Qt::LeftButton, {}, QPoint(x, 5));
    if (header->sortIndicatorOrder() != Qt::DescendingOrder)
      QTest::mouseClick(header->viewport(), Qt::LeftButton, {}, QPoint(x, 5));
    QCOMPARE(header->sortIndicatorSection(), int(OpTableModel::Time));
    QCOMPARE(header->sortIndicatorOrder(), Qt::DescendingOrder);
    const auto longest = *std::max_element(
        ops.begin(), ops.end(),
        [](const auto& a, const auto& b) { return a.endNs - a.beginNs < b.endNs - b.beginNs; });
    QCOMPARE(view.proxy()->index(0, 0).data(OpTableModel::SeqRole).toULongLong(), longest.seq);
    // Numeric, not text order: "10.0" after "9.0" would break this.
    for (int r = 1; r < view.proxy()->rowCount(); ++r)
      QVERIFY(view.proxy()
                  ->index(r - 1, OpTableModel::Time)
                  .data(OpTableModel::SortRole)
                  .toLongLong() >=
              view.proxy()->index(r, OpTableModel::Time).data(OpTableModel::SortRole).toLongLong());
  }

  void opTableFlagsNonFiniteOutputsAndFiltersThem() {
    Recording rec = Recording::open(pathA_.toStdString());
    auto step = std::make_shared<StepData>(*stepOf(rec, 1));
    QVERIFY(step->ops.size() > 20);
    // Two ops with output statistics get NaN and Inf counts.
    std::vector<size_t> withStats;
    for (size_t i = 0; i < step->ops.size(); ++i)
      for (const auto& t : step->ops[i].tensors)
        if (t.role == keel::storage::Role::Output && t.index == 0 && t.hasStats)
          withStats.push_back(i);
    QVERIFY(withStats.size() > 10);
    const size_t nanOp = withStats[2], infOp = withStats[9], cleanOp = withStats[3];
    auto poison = [&](size_t i, int64_t nan, int64_t inf) {
      for (auto& t : step->ops[i].tensors)
        if (t.role == keel::storage::Role::Output && t.index == 0) {
          t.stats.nanCount = nan;
          t.stats.infCount = inf;
        }
    };
    poison(nanOp, 3, 0);
    poison(infOp, 0, 1);
    Selection sel;
    OpTableView view(&sel, Side::A);
    QAbstractItemModelTester proxyTester(view.proxy(), kFailHard);
    view.setStep(step);
    auto flag = [&](size_t row) {
      return view.model()->index(int(row), OpTableModel::NonFinite).data().toString();
    };
    QCOMPARE(flag(nanOp), QString("3 NaN"));
    QCOMPARE(flag(infOp), QString("1 Inf"));
    QCOMPARE(flag(cleanOp), QString());
    view.findChild<QCheckBox*>("opFilterNonFinite")->setChecked(true);
    QCOMPARE(view.proxy()->rowCount(), 2);
    QCOMPARE(view.proxy()->index(0, 0).data(OpTableModel::SeqRole).toULongLong(),
             step->ops[nanOp].seq);
    QCOMPARE(view.proxy()->index(1, 0).data(OpTableModel::SeqRole).toULongLong(),
             step->ops[infOp].seq);
  }

  void opTableRowClickSelectsAndSelectionScrollsToRow() {
    auto step = stepOf(pathA_, 1);
    Selection sel;
    OpTableView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {900, 500}));
    view.setStep(step);

    QSignalSpy selected(&sel, &Selection::selected);
    clickRow(view.table(), 4);
    QCOMPARE(sel.current(Side::A), std::optional<uint64_t>(step->ops[4].seq));
    QVERIFY(!sel.current(Side::B));
    QCOMPARE(selected.count(), 1);

    // Selecting elsewhere moves the table's current row there and scrolls it into view, without
    // selecting anything back.
    const size_t far = step->ops.size() - 3;
    sel.select(Side::A, step->ops[far].seq);
    QCOMPARE(selected.count(), 2);
    const QModelIndex cur = view.table()->currentIndex();
    QCOMPARE(cur.data(OpTableModel::SeqRole).toULongLong(), step->ops[far].seq);
    QVERIFY(view.table()->selectionModel()->isRowSelected(cur.row(), {}));
    QVERIFY(view.table()->viewport()->rect().intersects(view.table()->visualRect(cur)));
    // The other side's selection leaves this table alone.
    sel.select(Side::B, step->ops[2].seq);
    QCOMPARE(view.table()->currentIndex().data(OpTableModel::SeqRole).toULongLong(),
             step->ops[far].seq);
    // Filtering keeps the selection where it was (no op gets selected by a filter).
    view.setPhaseFilter("forward");
    QCOMPARE(sel.current(Side::A), std::optional<uint64_t>(step->ops[far].seq));
  }

  // Stack locations read as the source tree names them (an absolute build path cut the part
  // that matters in the middle), and the standard library's frames between the user's (a lambda
  // through std::function) are folded in place.
  void stackFramesShowTreePathsAndFoldTheLibrary() {
    auto d = std::make_shared<keel::views::OpDetails>();
    d->op.seq = 5;
    d->op.stackId = 1;
    keel::storage::StackRecord st;
    st.id = 1;
    auto frame = [](const char* fn, const char* file, int line) {
      keel::storage::StackFrame f;
      f.function = fn;
      f.file = file;
      f.line = line;
      return f;
    };
    st.frames = {
        frame("keel::ops::matmul(keel::Tensor const&, keel::Tensor const&)",
              "/work/main/engine/src/ops/linalg.cpp", 40),
        frame("keel::nn::Linear::forward(keel::Tensor const&)",
              "/work/main/engine/src/nn/layers.cpp", 74),
        frame("keel::Tensor std::__invoke_impl<keel::Tensor, main::{lambda()#1}&>(...)",
              "/usr/include/c++/12/bits/invoke.h", 61),
        frame("std::_Function_handler<keel::Tensor (), main::{lambda()#1}>::_M_invoke(std::_Any_"
              "data const&)",
              "/usr/include/c++/12/bits/std_function.h", 291),
        frame("std::function<keel::Tensor ()>::operator()() const",
              "/usr/include/c++/12/bits/std_function.h", 591),
        frame("main", "/home/me/proj/train.cpp", 12)};
    d->stack = st;
    Selection sel;
    InspectorView view(&sel, Side::A);
    view.setDetails(d);
    auto* stack = view.findChild<QTreeWidget*>("inspectorStack");
    QCOMPARE(stack->topLevelItemCount(), 4);  // Linear::forward, the library, main, Keel's
    QCOMPARE(stack->topLevelItem(0)->text(2), QString("engine/src/nn/layers.cpp:74"));
    QCOMPARE(stack->topLevelItem(0)->data(2, Qt::UserRole).toString(),
             QString("/work/main/engine/src/nn/layers.cpp:74"));
    QTreeWidgetItem* lib = stack->topLevelItem(1);
    QCOMPARE(lib->data(0, Qt::UserRole).toString(), QString("library-frames"));
    QCOMPARE(lib->text(1), QString("C++ library (3 frames)"));
    QCOMPARE(lib->childCount(), 3);
    QVERIFY(!lib->isExpanded());
    QCOMPARE(stack->topLevelItem(2)->text(1), QString("main"));
    QCOMPARE(stack->topLevelItem(2)->text(2), QString("/home/me/proj/train.cpp:12"));
    QCOMPARE(stack->topLevelItem(3)->data(0, Qt::UserRole).toString(), QString("keel-frames"));
  }

  void inspectorShowsStackMd5AttributesValuesAndLogs() {
    Recording rec = Recording::open(pathA_.toStdString());
    // The first matmul in the verbose-logged attention block: stack, dumps, logs, attributes.
    const auto ops = rec.stepOps(1);
    auto it = std::find_if(ops.begin(), ops.end(), [](const auto& o) {
      return o.name == "matmul" && o.scope.rfind("blocks.0.attn", 0) == 0;
    });
    QVERIFY(it != ops.end());
    OpDetailsPtr d = loadOp(pathA_, it->seq);
    QVERIFY(d);
    QVERIFY(d->error.empty());
    QVERIFY(d->stack && !d->stack->frames.empty());
    QVERIFY(!d->dumps.empty());
    QVERIFY(!d->logs.empty());

    Selection sel;
    InspectorView view(&sel, Side::A);
    auto* stack = view.findChild<QTreeWidget*>("inspectorStack");
    auto* tensors = view.findChild<QTreeWidget*>("inspectorTensors");
    view.setDetails(d);
    // Frame 0 is Keel's op wrapper; the first row is the model code that called the op, and the
    // leading Keel frames are folded into the last row.
    const auto& frames = d->stack->frames;
    const auto user = std::find_if(frames.begin(), frames.end(), [](const auto& f) {
      return f.function.rfind("keel::ops::", 0) != 0 && f.function.rfind("keel::dispatch", 0) != 0;
    });
    QVERIFY(user != frames.end() && user != frames.begin());
    QVERIFY2(QString::fromStdString(frames.front().function).startsWith("keel::ops::"),
             frames.front().function.c_str());
    const auto& f = *user;
    QVERIFY(!f.function.empty() && !f.file.empty());
    // Shown without its parameters (the whole signature on hover and in the item's data).
    QCOMPARE(stack->topLevelItem(0)->data(1, Qt::UserRole).toString(),
             QString::fromStdString(f.function));
    QVERIFY(QString::fromStdString(f.function).startsWith(stack->topLevelItem(0)->text(1) + "("));
    QVERIFY(stack->topLevelItem(0)->toolTip(1).contains(QString::fromStdString(f.function)));
    QVERIFY(!stack->topLevelItem(0)->text(1).startsWith("keel::ops::"));
    const QString loc = QString("%1:%2").arg(QString::fromStdString(f.file)).arg(f.line);
    QCOMPARE(stack->topLevelItem(0)->data(2, Qt::UserRole).toString(), loc);  // the whole path
    QVERIFY(stack->topLevelItem(0)->toolTip(2).contains(loc));
    QVERIFY2(!stack->topLevelItem(0)->text(2).startsWith("../"), "build-relative prefix shown");
    QVERIFY(loc.endsWith(stack->topLevelItem(0)->text(2)));
    QCOMPARE(stack->textElideMode(), Qt::ElideMiddle);
    QTreeWidgetItem* folded = stack->topLevelItem(stack->topLevelItemCount() - 1);
    QCOMPARE(folded->data(0, Qt::UserRole).toString(), QString("keel-frames"));
    QCOMPARE(folded->childCount(), int(user - frames.begin()));
    QVERIFY(!folded->isExpanded());
    QCOMPARE(folded->child(0)->data(1, Qt::UserRole).toString(),
             QString::fromStdString(frames.front().function));
    // Every frame shown once: at the top level, or in a folded group (Keel's leading frames; runs
    // of C++ library frames, which an unoptimised build keeps out of line).
    int shown = 0;
    for (int i = 0; i < stack->topLevelItemCount(); ++i) {
      QTreeWidgetItem* it = stack->topLevelItem(i);
      const QString group = it->data(0, Qt::UserRole).toString();
      shown += group.isEmpty() ? 1 : it->childCount();
      if (group == "library-frames") QVERIFY(it->childCount() >= 2);
    }
    QCOMPARE(shown, int(frames.size()));
    const auto& out = *std::find_if(d->op.tensors.begin(), d->op.tensors.end(), [](const auto& t) {
      return t.role == keel::storage::Role::Output;
    });
    QCOMPARE(int(out.md5.size()), 32);
    QVERIFY(showsText(&view, QString::fromStdString(out.md5)));
    QVERIFY(showsText(&view, QString::fromStdString(it->name)));
    QVERIFY(showsText(&view, QString::fromStdString(it->scope)));
    QVERIFY(showsText(&view, "trans_b"));  // attributes parsed from attrsJson
    QVERIFY(showsText(&view, QString::fromStdString(d->logs.front().message)));
    QVERIFY(
        showsText(&view, QString("output 0  shape %1")
                             .arg(QString::fromStdString(keel::storage::shapeText(out.shape)))));
    QCOMPARE(view.tabs()->tabText(InspectorView::Stack),
             QString("Stack (%1)").arg(d->stack->frames.size()));
    // The tensor table has a column per tensor, inputs first, and a row per field.
    QCOMPARE(tensors->columnCount(), int(d->op.tensors.size()) + 1);
    QCOMPARE(tensors->headerItem()->text(1), QString("input 0"));
    QCOMPARE(tensors->headerItem()->text(tensors->columnCount() - 1), QString("output 0"));
    QCOMPARE(tensors->topLevelItem(3)->text(0), QString("MD5"));
    QCOMPARE(tensors->topLevelItem(3)->text(tensors->columnCount() - 1),
             QString::fromStdString(out.md5));

    view.clear();
    QVERIFY(!showsText(&view, QString::fromStdString(out.md5)));
  }

  // At the inspector dock's width (540 px at 1366x768 and 1920x1080) every statistic of a matmul's
  // three tensors is in full view: no sideways scroll, no elided number.
  void inspectorStatisticsFitTheDockWidth() {
    Recording rec = Recording::open(pathA_.toStdString());
    const auto ops = rec.stepOps(1);
    auto it =
        std::find_if(ops.begin(), ops.end(), [](const auto& o) { return o.name == "matmul"; });
    QVERIFY(it != ops.end());
    OpDetailsPtr d = loadOp(pathA_, it->seq);
    QVERIFY(d && d->error.empty());
    Selection sel;
    InspectorView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {540, 500}));
    view.setDetails(d);
    QApplication::processEvents();
    auto* tensors = view.findChild<QTreeWidget*>("inspectorTensors");
    QCOMPARE(tensors->columnCount(), 4);
    QVERIFY(!tensors->horizontalScrollBar()->isVisible());
    int checked = 0;
    for (int r = 0; r < tensors->topLevelItemCount(); ++r) {
      QTreeWidgetItem* row = tensors->topLevelItem(r);
      if (!QStringList{"Min", "Max", "Mean", "Std", "|Max|", "NaN", "Zeros"}.contains(row->text(0)))
        continue;
      for (int c = 1; c < tensors->columnCount(); ++c) {
        const int need = QFontMetrics(row->font(c)).horizontalAdvance(row->text(c)) + 8;
        QVERIFY2(need <= tensors->columnWidth(c), qPrintable(QString("%1 %2: %3 px in %4")
                                                                 .arg(row->text(0), row->text(c))
                                                                 .arg(need)
                                                                 .arg(tensors->columnWidth(c))));
        ++checked;
      }
    }
    QCOMPARE(checked, 7 * 3);
    // Every tab in view at that width.
    for (int i = 0; i < view.tabs()->count(); ++i)
      if (view.tabs()->isTabVisible(i))
        QVERIFY(view.tabs()->tabBar()->tabRect(i).right() < view.tabs()->tabBar()->width());
  }

  void inspectorComparesThePairSideBySideEachLabelled() {
    DiffPtr report = DiffRunner::run(pathA_, pathB_);
    QVERIFY(report && report->first);
    const keel::storage::OpPair& p = report->first->pair;
    QCOMPARE(QString::fromStdString(p.name), QString("matmul"));
    OpDetailsPtr a = loadOp(pathA_, p.seqA), b = loadOp(pathB_, p.seqB);
    QVERIFY(a && b && a->error.empty() && b->error.empty());
    // The exact max |A - B| over the whole dumped output.
    Recording ra = Recording::open(pathA_.toStdString()),
              rb = Recording::open(pathB_.toStdString());
    const auto va = ra.dumpValues(p.seqA, keel::storage::Role::Output, 0);
    const auto vb = rb.dumpValues(p.seqB, keel::storage::Role::Output, 0);
    QVERIFY(va && vb && va->size() == vb->size() && !va->empty());
    double maxAbs = 0;
    for (size_t i = 0; i < va->size(); ++i)
      maxAbs = std::max(maxAbs, std::abs((*va)[i] - (*vb)[i]));
    QVERIFY(maxAbs > 0);

    Selection sel;
    InspectorView view(&sel, Side::A);
    auto* tensors = view.findChild<QTreeWidget*>("inspectorTensors");
    auto* stack = view.findChild<QTreeWidget*>("inspectorStack");
    view.setCompare("a.db · cpu", "b.db · cpu");
    QVERIFY(view.comparing());
    view.setDiff(report);
    view.setDetails(Side::B, b);  // either order: the last one to load does not win
    view.setDetails(Side::A, a);
    QCOMPARE(view.details(Side::A), a);
    QCOMPARE(view.details(Side::B), b);
    const QString header = view.findChild<QLabel*>("inspectorHeader")->text();
    QVERIFY2(header.contains("A: a.db · cpu") && header.contains("B: b.db · cpu"),
             qPrintable(header));
    QVERIFY(header.contains(QString("#%1").arg(p.seqA)) && header.contains("diverged"));
    QCOMPARE(tensors->headerItem()->text(1), QString("A: a.db · cpu"));
    QCOMPARE(tensors->headerItem()->text(2), QString("B: b.db · cpu"));

    // Output 0 first, its verdict on its row, MD5s side by side, then the difference.
    QTreeWidgetItem* out = tensors->topLevelItem(0);
    QVERIFY2(out->text(0).startsWith("output 0 — diverged"), qPrintable(out->text(0)));
    auto child = [](QTreeWidgetItem* top, const QString& field) -> QTreeWidgetItem* {
      for (int i = 0; i < top->childCount(); ++i)
        if (top->child(i)->text(0) == field) return top->child(i);
      return nullptr;
    };
    const auto tensorOf = [](const OpDetails& d) {
      return *std::find_if(d.op.tensors.begin(), d.op.tensors.end(), [](const auto& t) {
        return t.role == keel::storage::Role::Output && t.index == 0;
      });
    };
    const auto ta = tensorOf(*a), tb = tensorOf(*b);
    QVERIFY(ta.md5 != tb.md5);
    QTreeWidgetItem* md5 = child(out, "MD5");
    QVERIFY(md5);
    QCOMPARE(md5->text(1), QString::fromStdString(ta.md5));
    QCOMPARE(md5->text(2), QString::fromStdString(tb.md5));
    QVERIFY(child(out, "Shape") && child(out, "Max") && child(out, "Std"));
    QCOMPARE(child(out, "Shape")->text(1), child(out, "Shape")->text(2));
    QTreeWidgetItem* diff = child(out, "max |A − B|");
    QVERIFY(diff);
    QCOMPARE(diff->data(1, Qt::UserRole).toDouble(), maxAbs);
    QCOMPARE(diff->text(1), QString::number(maxAbs, 'g', 6));
    QVERIFY(child(out, "max rel") && child(out, "max ULPs") && child(out, "outside tol."));
    const auto td = view.tensorDiff(keel::storage::Role::Output, 0);
    QVERIFY(td && td->basis == keel::storage::DiffBasis::Values);
    QCOMPARE(td->maxAbs, maxAbs);
    QCOMPARE(child(out, "outside tol.")->text(1),
             QString("%L1 of %L2").arg(td->badElements).arg(qulonglong(va->size())));
    // Inputs follow, each with both sides.
    QCOMPARE(tensors->topLevelItemCount(), int(a->op.tensors.size()));
    QVERIFY(tensors->topLevelItem(1)->text(0).startsWith("input 0"));

    // Both stacks, each under its run's label; both begin with the calling model code.
    QCOMPARE(stack->topLevelItemCount(), 2);
    QCOMPARE(stack->topLevelItem(0)->text(0), QString("A: a.db · cpu — #%1").arg(p.seqA));
    QCOMPARE(stack->topLevelItem(1)->text(0), QString("B: b.db · cpu — #%1").arg(p.seqB));
    for (int s = 0; s < 2; ++s) {
      QTreeWidgetItem* first = stack->topLevelItem(s)->child(0);
      QVERIFY(first && !first->text(1).startsWith("keel::ops::"));
    }
    // Values: A, B and A − B in columns.
    const QString values = view.findChild<QPlainTextEdit*>("inspectorValues")->toPlainText();
    QVERIFY(values.startsWith("A: a.db · cpu\nB: b.db · cpu\n"));
    QVERIFY(values.contains("A − B") && values.contains("≠"));

    // Attributes side by side under both labels; allocator events of A's op, then B's, each
    // row headed by its side.
    auto* attrs = view.findChild<QTreeWidget*>("inspectorAttributes");
    QCOMPARE(attrs->columnCount(), 3);
    QCOMPARE(attrs->headerItem()->text(1), QString("A: a.db · cpu"));
    QCOMPARE(attrs->headerItem()->text(2), QString("B: b.db · cpu"));
    auto* mem = view.findChild<QTableWidget*>("inspectorMemory");
    QVERIFY(!a->mems.empty() && !b->mems.empty());
    QCOMPARE(mem->rowCount(), int(a->mems.size() + b->mems.size()));
    QVERIFY(!mem->verticalHeader()->isHidden());
    QCOMPARE(mem->verticalHeaderItem(0)->text(), QString("A"));
    QCOMPARE(mem->verticalHeaderItem(int(a->mems.size()))->text(), QString("B"));
    QCOMPARE(mem->verticalHeaderItem(int(a->mems.size()))->toolTip(), QString("B: b.db · cpu"));
    QCOMPARE(mem->item(int(a->mems.size()), 3)->text(),
             QStringLiteral("%L1").arg(b->mems[0].bytes));

    // An op chosen on A alone (B not yet loaded) says which side it shows.
    view.clear();
    QCOMPARE(attrs->columnCount(), 2);
    QVERIFY(mem->verticalHeader()->isHidden());
    view.setDetails(Side::A, a);
    QVERIFY(view.findChild<QLabel*>("inspectorHeader")->text().contains("A: a.db · cpu"));
  }

  void inspectorLinksABackwardOpToItsForwardOp() {
    Recording rec = Recording::open(pathA_.toStdString());
    const auto ops = rec.stepOps(1);
    auto it = std::find_if(ops.begin(), ops.end(), [](const auto& o) { return o.forwardSeq != 0; });
    QVERIFY(it != ops.end());
    OpDetailsPtr d = loadOp(pathA_, it->seq);
    QVERIFY(d && d->error.empty());
    Selection sel;
    InspectorView view(&sel, Side::B);
    view.setDetails(d);
    auto* header = view.findChild<QLabel*>("inspectorHeader");
    QVERIFY(header->text().contains(QString("op:%1").arg(it->forwardSeq)));
    emit header->linkActivated(QString("op:%1").arg(it->forwardSeq));
    QCOMPARE(sel.current(Side::B), std::optional<uint64_t>(it->forwardSeq));
  }

  void inspectorShowsAnErrorInsteadOfTabs() {
    auto d = std::make_shared<OpDetails>();
    d->op.seq = 99999;
    d->error = "recording /tmp/x.db has no op 99999";
    Selection sel;
    InspectorView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {600, 300}));
    view.setDetails(d);
    auto* err = view.findChild<QLabel*>("inspectorError");
    QVERIFY(err->isVisible());
    QCOMPARE(err->text(), QString::fromStdString(d->error));
    QVERIFY(!view.tabs()->isVisible());
    view.clear();
    QVERIFY(!err->isVisible());
    QVERIFY(view.tabs()->isVisible());
  }

  void diffFirstRowIsTheInjectedDivergenceAndSelectsThePair() {
    DiffPtr report = DiffRunner::run(pathA_, pathB_);
    QVERIFY(report);
    QVERIFY(report->first.has_value());
    QVERIFY(report->root.has_value());
    const auto& first = report->first->pair;
    QCOMPARE(QString::fromStdString(first.name), QString("matmul"));
    QCOMPARE(report->root->pair.seqA, first.seqA);  // the perturbed matmul's inputs all match

    Selection sel;
    DiffView view(&sel, Side::A);
    QAbstractItemModelTester modelTester(view.model(), kFailHard);
    QAbstractItemModelTester proxyTester(view.proxy(), kFailHard);
    QVERIFY(test::showAt(view, {900, 500}));
    view.setReport(report);
    QCOMPARE(size_t(view.model()->rowCount()), report->pairs.size());  // every pair once
    const auto* top = view.model()->pairAt(0);
    QCOMPARE(top->seqA, first.seqA);
    QCOMPARE(top->seqB, first.seqB);
    QCOMPARE(top->step, first.step);
    QCOMPARE(view.model()->markAt(0), DiffModel::FirstDivergence | DiffModel::RootDivergence);
    QCOMPARE(view.model()->markAt(1), int(DiffModel::NoMark));
    auto* m = view.model();
    QCOMPARE(m->index(0, DiffModel::Status).data().toString(), QString("diverged — first, root"));
    QCOMPARE(m->index(0, DiffModel::Name).data().toString(), QString("matmul"));
    QCOMPARE(m->index(0, DiffModel::SeqA).data().toULongLong(), first.seqA);
    QCOMPARE(m->index(0, DiffModel::Basis).data().toString(), QString("values"));
    QCOMPARE(DiffModel::maxAbs(*top), first.outputs.at(0).maxAbs);
    QVERIFY(DiffModel::maxAbs(*top) > 100);  // the perturbation adds 1000 to one element
    QCOMPARE(m->index(0, DiffModel::MaxAbs).data().toString(),
             QString::number(first.outputs.at(0).maxAbs, 'g', 5));
    // The rest stay in alignment order: row 1 is the report's first pair.
    QVERIFY(!(report->pairs[0].seqA == first.seqA));
    QCOMPARE(view.model()->pairAt(1)->seqA, report->pairs[0].seqA);
    // An equal pair compared by MD5 has no error columns.
    const int equalRow = view.model()->rowOf(Side::A, report->pairs[0].seqA);
    QCOMPARE(m->index(equalRow, DiffModel::Status).data().toString(), QString("equal"));
    QCOMPARE(m->index(equalRow, DiffModel::MaxAbs).data().toString(), QString());
    QVERIFY(view.summaryText().contains("DIVERGED"));
    // A comparison that failed says so, not "No comparison. Open a second recording"; the next
    // report replaces the message.
    view.showFailure("damaged recording b.db: op 50: packed tensor data is truncated");
    QVERIFY2(view.summaryText().contains("The comparison failed:") &&
                 view.summaryText().contains("damaged recording b.db: op 50"),
             qPrintable(view.summaryText()));
    QCOMPARE(view.model()->rowCount(), 0);
    view.setReport(report);
    QVERIFY(view.summaryText().contains("DIVERGED"));
    QVERIFY(view.summaryText().contains(QString("%1 diverged").arg(report->total.diverged)));

    clickRow(view.table(), 0);
    QCOMPARE(sel.current(Side::A), std::optional<uint64_t>(first.seqA));
    QCOMPARE(sel.current(Side::B), std::optional<uint64_t>(first.seqB));

    // Selecting an op of A elsewhere moves the diff's current row to its pair.
    sel.select(Side::A, report->pairs[5].seqA);
    QCOMPARE(
        view.model()->pairAt(view.proxy()->mapToSource(view.table()->currentIndex()).row())->seqA,
        report->pairs[5].seqA);
  }

  // Pairs with nothing to compare (recordings without MD5s or statistics) read "not compared",
  // not "equal", and the summary says that no values were compared.
  void diffWithoutValuesSaysNotCompared() {
    std::vector<keel::storage::OpRecord> ops(3);
    for (size_t i = 0; i < ops.size(); ++i) {
      ops[i].seq = i + 1;
      ops[i].step = 1;
      ops[i].name = "add";
      keel::storage::TensorRecord t;
      t.role = keel::storage::Role::Output;
      t.tensorId = 10 + i;
      t.shape = {2, 2};
      t.dtype = "float32";
      ops[i].tensors.push_back(t);
    }
    auto report = std::make_shared<keel::storage::DiffReport>(keel::storage::diffRuns(ops, ops));
    Selection sel;
    DiffView view(&sel, Side::A);
    view.setReport(report);
    QCOMPARE(view.model()->index(0, DiffModel::Status).data().toString(), QString("not compared"));
    QVERIFY2(view.summaryText().startsWith(
                 "<b style='color:#8a6d00'>NO VALUES COMPARED</b> &nbsp; 0 equal · 3 not compared"),
             qPrintable(view.summaryText()));
    QVERIFY2(view.summaryText().contains(
                 "The recordings hold no MD5s, statistics or dumps of their tensors: only the op "
                 "sequences were compared (record both with --all, or --md5 / --stats)."),
             qPrintable(view.summaryText()));
    QVERIFY(!view.summaryText().contains("IDENTICAL"));
    // Step losses that part name the step where no op can be named.
    auto parted = std::make_shared<keel::storage::DiffReport>(*report);
    parted->losses = keel::storage::compareLosses({{1, 0, 1, 2.5}}, {{1, 0, 1, 2.75}}, {});
    view.setReport(parted);
    QVERIFY2(view.summaryText().contains("DIVERGED"), qPrintable(view.summaryText()));
    QVERIFY2(view.summaryText().contains(
                 "First divergence: step 1 <b>loss</b> (A 2.5 vs B 2.75); no op can be named "
                 "without tensor values: record both with --all"),
             qPrintable(view.summaryText()));
  }

  void diffMismatchesOnlyKeepsDivergedAndUnmatched() {
    DiffPtr report = DiffRunner::run(pathA_, pathB_);
    QVERIFY(report && report->first);
    Selection sel;
    DiffView view(&sel, Side::A);
    QAbstractItemModelTester proxyTester(view.proxy(), kFailHard);
    view.setReport(report);
    const int mismatches =
        int(std::count_if(report->pairs.begin(), report->pairs.end(), [](const auto& p) {
          return p.status != keel::storage::DiffStatus::Equal &&
                 p.status != keel::storage::DiffStatus::WithinTolerance;
        }));
    QCOMPARE(int64_t(mismatches),
             report->total.diverged + report->total.onlyInA + report->total.onlyInB);
    QVERIFY(mismatches > 0 && mismatches < int(report->pairs.size()));
    view.findChild<QCheckBox*>("diffMismatchesOnly")->setChecked(true);
    QCOMPARE(view.proxy()->rowCount(), mismatches);
    QCOMPARE(view.model()->pairAt(view.proxy()->mapToSource(view.proxy()->index(0, 0)).row())->seqA,
             report->first->pair.seqA);
    view.setMismatchesOnly(false);
    QCOMPARE(size_t(view.proxy()->rowCount()), report->pairs.size());
    view.clear();
    QCOMPARE(view.proxy()->rowCount(), 0);
  }

  void logFiltersMatchTheRecording() {
    Recording rec = Recording::open(pathA_.toStdString());
    const auto lines = rec.logs({});
    QVERIFY(!lines.empty());
    const auto count = [&](auto pred) {
      return int(std::count_if(lines.begin(), lines.end(), pred));
    };
    const int verbose =
        count([](const auto& l) { return l.level == keel::storage::LogLevel::Verbose; });
    QVERIFY(verbose > 0);  // --verbose blocks.0.attn

    Selection sel;
    LogView view(&sel, Side::A);
    QAbstractItemModelTester modelTester(view.model(), kFailHard);
    QAbstractItemModelTester proxyTester(view.proxy(), kFailHard);
    view.setLogs(std::make_shared<const std::vector<keel::storage::LogRecord>>(lines));
    QCOMPARE(size_t(view.proxy()->rowCount()), lines.size());
    QCOMPARE(view.model()->index(0, LogModel::Message).data().toString(),
             QString::fromStdString(lines[0].message));
    QCOMPARE(view.model()->index(0, LogModel::Level).data().toString(),
             QString::fromUtf8(keel::logLevelName(lines[0].level).data()));

    // Level: the combo's "up to debug" keeps what Recording::logs(maxLevel = Debug) returns.
    keel::storage::LogQuery q;
    q.maxLevel = keel::storage::LogLevel::Debug;
    auto* level = view.findChild<QComboBox*>("logFilterLevel");
    level->setCurrentIndex(level->findData(int(keel::storage::LogLevel::Debug)));
    QCOMPARE(size_t(view.proxy()->rowCount()), rec.logs(q).size());
    view.setMaxLevel(keel::storage::LogLevel::Verbose);
    QCOMPARE(size_t(view.proxy()->rowCount()), lines.size());

    // Scope prefix and message text, alone and together.
    const std::string scope = "blocks.0.attn.proj";
    const int inScope = count([&](const auto& l) { return keel::scopeWithin(l.scope, scope); });
    QVERIFY(inScope > 0 && inScope < int(lines.size()));
    view.findChild<QLineEdit*>("logFilterScope")->setText(QString::fromStdString(scope));
    QCOMPARE(view.proxy()->rowCount(), inScope);
    view.setTextFilter("MATMUL");
    const int both = count([&](const auto& l) {
      return keel::scopeWithin(l.scope, scope) && l.message.find("matmul") != std::string::npos;
    });
    QVERIFY(both > 0 && both < inScope);
    QCOMPARE(view.proxy()->rowCount(), both);
    view.setScopeFilter("");
    QCOMPARE(view.proxy()->rowCount(),
             count([](const auto& l) { return l.message.find("matmul") != std::string::npos; }));
    view.setTextFilter("");
    QCOMPARE(size_t(view.proxy()->rowCount()), lines.size());
  }

  // The scope filter is keel::scopeWithin, whole dotted segments: "blocks.1" keeps blocks.1 and
  // what lies below it, never blocks.10 or blocks.1x (a plain prefix test kept them).
  void logScopeFilterKeepsWholeScopeSegments() {
    std::vector<keel::storage::LogRecord> lines;
    for (const char* s : {"blocks.1", "blocks.1.attn", "blocks.10.attn", "blocks.10", "blocks.1x",
                          "blocks", "", "Blocks.1.attn"}) {
      keel::storage::LogRecord l;
      l.scope = s;
      l.message = std::string("in ") + s;
      lines.push_back(l);
    }
    LogModel model;
    LogFilterProxy proxy;
    QAbstractItemModelTester proxyTester(&proxy, kFailHard);
    proxy.setSourceModel(&model);
    model.setLogs(std::make_shared<const std::vector<keel::storage::LogRecord>>(lines));
    const auto kept = [&] {
      QStringList out;
      for (int r = 0; r < proxy.rowCount(); ++r)
        out << proxy.index(r, LogModel::Scope).data().toString();
      return out;
    };
    proxy.setScopePrefix("blocks.1");
    QCOMPARE(kept(), QStringList({"blocks.1", "blocks.1.attn"}));
    proxy.setScopePrefix("blocks.10");
    QCOMPARE(kept(), QStringList({"blocks.10.attn", "blocks.10"}));
    proxy.setScopePrefix("blocks");  // everything under it, not "" or "Blocks.1.attn"
    QCOMPARE(kept(), QStringList({"blocks.1", "blocks.1.attn", "blocks.10.attn", "blocks.10",
                                  "blocks.1x", "blocks"}));
    proxy.setScopePrefix("");
    QCOMPARE(proxy.rowCount(), int(lines.size()));
  }

  void logClickSelectsItsOp() {
    Recording rec = Recording::open(pathA_.toStdString());
    const auto lines = rec.logs({});
    Selection sel;
    LogView view(&sel, Side::B);
    QVERIFY(test::showAt(view, {900, 500}));
    view.setLogs(std::make_shared<const std::vector<keel::storage::LogRecord>>(lines));
    QVERIFY(lines[3].opSeq != 0);
    clickRow(view.table(), 3);
    QCOMPARE(sel.current(Side::B), std::optional<uint64_t>(lines[3].opSeq));
    QVERIFY(!sel.current(Side::A));
    // An op selected elsewhere moves the current row to its first line, without echoing.
    const uint64_t other = lines[40].opSeq;
    int firstRow = -1;
    for (int r = 0; r < int(lines.size()); ++r)
      if (lines[size_t(r)].opSeq == other) {
        firstRow = r;
        break;
      }
    QVERIFY(other != lines[3].opSeq && firstRow >= 0);
    QSignalSpy echo(&sel, &Selection::selected);
    sel.select(Side::B, other);
    QCOMPARE(echo.count(), 1);  // only the select() above
    QCOMPARE(view.table()->currentIndex().row(), firstRow);
    sel.select(Side::A, lines[3].opSeq);  // the other side: the table stays
    QCOMPARE(view.table()->currentIndex().row(), firstRow);
  }

  void lossPlotHasOneGraphPerRun() {
    Recording a = Recording::open(pathA_.toStdString());
    Recording b = Recording::open(pathB_.toStdString());
    SummaryPtr sa = loadSummary(a, pathA_), sb = loadSummary(b, pathB_);
    QCOMPARE(int(sa->steps.size()), 2);
    LossPlot plot;
    QCOMPARE(plot.graphCount(), 0);
    plot.setRuns(sa);
    QCOMPARE(plot.graphCount(), 1);
    QCOMPARE(plot.pointCount(0), 2);
    QVERIFY(plot.graphName(0).contains("a.db"));
    plot.setRuns(sa, sb);
    QCOMPARE(plot.graphCount(), 2);
    QCOMPARE(plot.pointCount(0), 2);
    QCOMPARE(plot.pointCount(1), 2);
    QVERIFY(plot.graphName(1).contains("b.db"));
    QCOMPARE(plot.pointCount(2), 0);
    plot.clear();
    QCOMPARE(plot.graphCount(), 0);
  }

  // KEEL_PANEL_SHOTS=<dir>: saves a picture of each panel on the fixtures, to look at.
  void screenshots() {
    const QString dir = test::panelShotsDir();
    if (dir.isEmpty()) QSKIP("set KEEL_PANEL_SHOTS=<dir> to save screenshots");
    Recording rec = Recording::open(pathA_.toStdString());
    Selection sel;
    auto shoot = [&](QWidget* w, const QString& name) {
      QVERIFY(test::saveShot(w, {900, 500}, dir, "panel_" + name));
    };
    {
      OpTableView v(&sel, Side::A);
      v.setStep(stepOf(rec, 1));
      sel.select(Side::A, rec.stepOps(1)[6].seq);
      shoot(&v, "optable");
    }
    {
      InspectorView v(&sel, Side::A);
      const auto ops = rec.stepOps(1);
      auto it = std::find_if(ops.begin(), ops.end(), [](const auto& o) {
        return o.name == "matmul" && o.scope.rfind("blocks.0.attn", 0) == 0;
      });
      v.setDetails(loadOp(pathA_, it->seq));
      for (int t = 0; t < InspectorView::TabCount; ++t) {
        if (!v.tabs()->isTabVisible(t)) continue;  // the Mask tab of flashmask ops only
        v.tabs()->setCurrentIndex(t);
        shoot(&v, QString("inspector_%1").arg(t));
      }
      auto bw =
          std::find_if(ops.begin(), ops.end(), [](const auto& o) { return o.forwardSeq != 0; });
      v.setDetails(loadOp(pathA_, bw->seq));
      v.tabs()->setCurrentIndex(0);
      shoot(&v, "inspector_backward");
      auto bad = std::make_shared<OpDetails>();
      bad->op.seq = 123456;
      bad->error = "recording " + pathA_.toStdString() + " has no op 123456";
      v.setDetails(bad);
      shoot(&v, "inspector_error");
    }
    {
      // Comparing, at the inspector dock's width.
      InspectorView v(&sel, Side::A);
      DiffPtr report = DiffRunner::run(pathA_, pathB_);
      v.setCompare("a.db · cpu", "b.db · cpu");
      v.setDiff(report);
      v.setDetails(Side::A, loadOp(pathA_, report->first->pair.seqA));
      v.setDetails(Side::B, loadOp(pathB_, report->first->pair.seqB));
      for (int t = 0; t < InspectorView::TabCount; ++t) {
        if (!v.tabs()->isTabVisible(t)) continue;
        v.tabs()->setCurrentIndex(t);
        shoot(&v, QString("inspector_compare_%1").arg(t));
        v.resize(540, 700);
        QVERIFY(v.grab().save(dir + QString("/panel_inspector_compare_%1_540.png").arg(t)));
      }
    }
    {
      DiffView v(&sel, Side::A);
      v.setReport(DiffRunner::run(pathA_, pathB_));
      shoot(&v, "diff");
      v.setMismatchesOnly(true);
      shoot(&v, "diff_mismatches");
    }
    {
      LogView v(&sel, Side::A);
      v.setLogs(std::make_shared<const std::vector<keel::storage::LogRecord>>(rec.logs({})));
      shoot(&v, "log");
    }
    {
      Recording b = Recording::open(pathB_.toStdString());
      LossPlot v;
      v.setRuns(loadSummary(rec, pathA_), loadSummary(b, pathB_));
      shoot(&v, "loss");
    }
  }

 private:
  QString pathA_, pathB_;
};

QTEST_MAIN(PanelsTest)
#include "panels_test.moc"
