// GraphView on real recordings made by the keel binary: every op drawn, click selects, J jumps
// forward <-> backward, large steps open collapsed and lay out off the GUI thread, divergence
// colours, semantic zoom, non-finite colouring and failed ops; and `keel export graph` prints the
// DOT the view lays out. (The DOT text and the
// Graphviz layout on their own: tests/analysis/.)
#include <QAbstractGraphicsShapeItem>
#include <QFile>
#include <QGraphicsScene>
#include <QGraphicsTextItem>
#include <QGraphicsView>
#include <QLabel>
#include <QLineEdit>
#include <QScrollBar>
#include <QSignalSpy>
#include <QThreadPool>
#include <QWheelEvent>
#include <QtTest>
#include <algorithm>
#include <memory>
#include <set>

#include "keel/analysis/graph_dot.h"
#include "keel/analysis/module_summary.h"
#include "keel/base/text.h"
#include "keel/storage/reader.h"
#include "keel/views/graph_view.h"
#include "keel/views/run_source.h"
#include "keel/views/selection.h"
#include "view_test_util.h"

using namespace keel::views;
using keel::Phase;
using keel::storage::OpRecord;
using keel::views::test::stepOf;

namespace {

// The step as the studio loads it: through RunSource's worker.
StepPtr loadStepLikeTheStudio(const QString& path, int64_t step) {
  return test::loadThroughRunSource(path, &RunSource::stepLoaded,
                                    [step](RunSource& src) { src.requestStep(step); });
}

int countPhase(const StepData& s, const char* phase) {
  return int(std::count_if(s.ops.begin(), s.ops.end(),
                           [&](const OpRecord& o) { return o.phase == *keel::parsePhase(phase); }));
}

bool waitLaidOut(GraphView& view, int timeoutMs = 60000) {
  QElapsedTimer t;
  t.start();
  while (view.isLayingOut() && t.elapsed() < timeoutMs) QTest::qWait(20);
  return !view.isLayingOut();
}

// Shows `step` in `view` and waits for its layout, and with `expand` for the layout of every
// module expanded; false when one never came.
bool setStepAndWait(GraphView& view, StepPtr step, bool expand) {
  QSignalSpy done(&view, &GraphView::layoutFinished);
  view.setStep(std::move(step));
  if (!done.wait(60000)) return false;
  if (!expand) return true;
  view.expandAll();
  return waitLaidOut(view);
}

// The graph view's overview (its minimap), a child of its canvas; nullptr when it has none.
QWidget* minimapOf(QGraphicsView* canvas) {
  for (QWidget* w : canvas->findChildren<QWidget*>(Qt::FindDirectChildrenOnly))
    if (w->toolTip().startsWith("Overview")) return w;
  return nullptr;
}

}  // namespace

class GraphTest : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    registerViewTypes();
    path_ = test::tempDir() + "/graph.db";
    QVERIFY(test::recordFixture(path_, "--steps 1 --seed 1 --md5 --stats --stacks"));
  }

  // --- GraphView on real recordings ------------------------------------------------------------

  void fullyExpandedShowsEveryForwardAndBackwardOp() {
    Selection sel;
    GraphView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {1200, 800}));
    StepPtr step = stepOf(path_, 1);
    const int count = countPhase(*step, "forward") + countPhase(*step, "backward");
    QVERIFY(count > 100);
    QSignalSpy done(&view, &GraphView::layoutFinished);
    view.setStep(step);
    QVERIFY(done.wait(60000));
    view.expandAll();
    QVERIFY(waitLaidOut(view));
    QCOMPARE(view.visibleOpNodeCount(), count);
    QCOMPARE(view.moduleNodeCount(), 0);
    int drawn = 0;
    for (const auto& o : step->ops) {
      const bool shown = o.phase == Phase::Forward || o.phase == Phase::Backward;
      QCOMPARE(view.opItem(o.seq) != nullptr, shown);
      drawn += shown ? 1 : 0;
    }
    QCOMPARE(drawn, count);
    // Optimizer only.
    done.clear();
    view.setPhaseFilter("optimizer");
    QVERIFY(done.wait(60000));
    view.expandAll();
    QVERIFY(waitLaidOut(view));
    QCOMPARE(view.visibleOpNodeCount(), countPhase(*step, "optimizer"));
    saveScreenshot(view, "graph_full");
  }

  // A step without ops (a recording of allocator events only, such as an imported PyTorch memory
  // snapshot) says so in the pane instead of leaving it blank.
  void aStepWithoutOpsSaysSo() {
    Selection sel;
    GraphView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {800, 500}));
    auto empty = std::make_shared<keel::views::StepData>();
    QVERIFY(setStepAndWait(view, empty, false));
    QString shown;
    for (QGraphicsItem* item : view.scene()->items())
      if (auto* t = dynamic_cast<QGraphicsTextItem*>(item)) shown += t->toPlainText();
    QVERIFY2(shown.startsWith("No ops recorded in step 0: nothing to draw."), qPrintable(shown));
    QVERIFY(shown.contains("Memory view"));
    QCOMPARE(view.visibleOpNodeCount(), 0);
    // A step outside a --step-range says that instead (the studio sets the note per recording).
    view.setEmptyStepNote("This recording holds the ops of steps 2 to 3 only (--step-range).");
    QVERIFY(setStepAndWait(view, std::make_shared<keel::views::StepData>(), false));
    shown.clear();
    for (QGraphicsItem* item : view.scene()->items())
      if (auto* t = dynamic_cast<QGraphicsTextItem*>(item)) shown += t->toPlainText();
    QVERIFY2(shown ==
                 "No ops recorded in step 0: nothing to draw.\nThis recording holds the ops "
                 "of steps 2 to 3 only (--step-range).",
             qPrintable(shown));
  }

  // Side by side, each pane says which run it shows, first in its legend row.
  void aPaneNamesItsRun() {
    Selection sel;
    GraphView view(&sel, Side::B);
    QVERIFY(test::showAt(view, {800, 500}));
    QVERIFY(setStepAndWait(view, stepOf(path_, 1), false));
    view.setRunLabel("B: b.db · cpu-ref");
    QVERIFY2(view.legendText().startsWith("<b>B: b.db · cpu-ref</b>"),
             qPrintable(view.legendText()));
    view.setRunLabel("");
    QVERIFY(!view.legendText().contains("b.db"));
  }

  // Two panes showing the same step (a comparison of one model on two backends) draw it the same
  // way: Graphviz laid the second copy out differently (Note [One layout per graph]).
  void twoPanesOfTheSameStepAgree() {
    StepPtr step = stepOf(path_, 1);
    for (int round = 0; round < 3; ++round) {
      Selection sel;
      GraphView a(&sel, Side::A), b(&sel, Side::B);
      QVERIFY(test::showAt(a, {800, 600}));
      QVERIFY(test::showAt(b, {800, 600}));
      QSignalSpy doneA(&a, &GraphView::layoutFinished), doneB(&b, &GraphView::layoutFinished);
      a.setStep(step);  // both laid out at once, as the studio does
      b.setStep(step);
      QVERIFY(doneA.count() > 0 || doneA.wait(60000));
      QVERIFY(doneB.count() > 0 || doneB.wait(60000));
      int compared = 0;
      for (const auto& o : step->ops) {
        auto* x = a.opItem(o.seq);
        auto* y = b.opItem(o.seq);
        QCOMPARE(x != nullptr, y != nullptr);
        if (!x) continue;
        QCOMPARE(x->sceneBoundingRect(), y->sceneBoundingRect());
        ++compared;
      }
      QVERIFY(compared > 50);
    }
  }

  void clickOnNodeSelectsItsOp() {
    Selection sel;
    GraphView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {1000, 700}));
    StepPtr step = stepOf(path_, 1);
    QVERIFY(setStepAndWait(view, step, false));
    QVERIFY(waitLaidOut(view));
    auto it = std::find_if(step->ops.begin(), step->ops.end(), [](const OpRecord& o) {
      return o.phase == Phase::Forward && o.name == "matmul";
    });
    QVERIFY(it != step->ops.end());
    QAbstractGraphicsShapeItem* item = view.opItem(it->seq);
    QVERIFY(item);
    QGraphicsView* gv = view.graphicsView();
    gv->resetTransform();
    gv->centerOn(item);
    const QPoint p = gv->mapFromScene(item->scenePos());
    QSignalSpy selected(&sel, &Selection::selected);
    QTest::mouseClick(gv->viewport(), Qt::LeftButton, {}, p);
    QCOMPARE(selected.count(), 1);
    QCOMPARE(selected.at(0).at(0).value<Side>(), Side::A);
    QCOMPARE(selected.at(0).at(1).toULongLong(), quint64(it->seq));
    QCOMPARE(sel.current(Side::A), std::optional<uint64_t>(it->seq));
    // A click on empty canvas selects nothing.
    QTest::mouseClick(gv->viewport(), Qt::LeftButton, {}, QPoint(2, 2));
    QCOMPARE(selected.count(), 1);
    saveScreenshot(view, "graph_selected", it->seq);
  }

  void jumpGoesForwardToBackwardAndBack() {
    Selection sel;
    GraphView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {1000, 700}));
    StepPtr step = stepOf(path_, 1);
    QVERIFY(setStepAndWait(view, step, false));
    auto fwd = std::find_if(step->ops.begin(), step->ops.end(), [](const OpRecord& o) {
      return o.phase == Phase::Forward && o.name == "flashmask_attention";
    });
    QVERIFY(fwd != step->ops.end());
    sel.select(Side::A, fwd->seq);
    QVERIFY(view.jumpToPartner());
    const auto b = sel.current(Side::A);
    QVERIFY(b.has_value());
    const auto& bop = step->ops[size_t(step->indexOf(*b))];
    QVERIFY(bop.phase == Phase::Backward);
    QCOMPARE(bop.forwardSeq, fwd->seq);
    QCOMPARE(bop.name, std::string("flashmask_attention_backward"));
    // And back, with the key.
    view.graphicsView()->setFocus();
    view.activateWindow();
    QTest::keyClick(view.graphicsView(), Qt::Key_J);
    QCOMPARE(sel.current(Side::A), std::optional<uint64_t>(fwd->seq));
    // An op with no partner: the gradient accumulation has no forward op.
    auto acc = std::find_if(step->ops.begin(), step->ops.end(), [](const OpRecord& o) {
      return o.phase == Phase::Backward && o.forwardSeq == 0;
    });
    if (acc != step->ops.end()) {
      sel.select(Side::A, acc->seq);
      QVERIFY(!view.jumpToPartner());
      QCOMPARE(sel.current(Side::A), std::optional<uint64_t>(acc->seq));
    }
  }

  // Note [Cross-phase relations]: the forward <-> backward links and the saved activations are
  // drawn for the selected and the hovered node only, never for the whole graph.
  void crossPhaseRelationsAreDrawnForTheSelectedAndHoveredNodeOnly() {
    Selection sel;
    GraphView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {1000, 700}));
    StepPtr step = stepOf(path_, 1);
    QVERIFY(setStepAndWait(view, step, true));
    const auto g = view.graph();
    QVERIFY(g && !g->links.empty() && !g->crossEdges.empty());
    QCOMPARE(view.crossPhaseLinesDrawn().links, 0);
    QCOMPARE(view.crossPhaseLinesDrawn().dataEdges, 0);
    // Counted from the records, not from the graph: the backward ops differentiating `fwd`, and
    // those reading one of its outputs (each tensor version is written once).
    auto relationsOf = [&](const OpRecord& op) {
      std::set<std::pair<uint64_t, uint64_t>> outputs, inputs;
      for (const auto& t : op.tensors)
        (t.role == keel::storage::Role::Output ? outputs : inputs).emplace(t.tensorId, t.version);
      GraphView::CrossPhaseLines r;
      for (const auto& o : step->ops) {
        if (o.phase != (op.phase == Phase::Forward ? Phase::Backward : Phase::Forward)) continue;
        const OpRecord& f = op.phase == Phase::Forward ? op : o;
        const OpRecord& b = op.phase == Phase::Forward ? o : op;
        r.links += b.forwardSeq == f.seq ? 1 : 0;
        bool reads = false;
        for (const auto& t : o.tensors) {
          const bool out = t.role == keel::storage::Role::Output;
          reads |= (op.phase == Phase::Forward ? !out && outputs.count({t.tensorId, t.version})
                                               : out && inputs.count({t.tensorId, t.version}));
        }
        r.dataEdges += reads ? 1 : 0;
      }
      return r;
    };
    // The first flashmask_attention: differentiated by its backward op and a zero fill (of the
    // gradient of its mask bounds), and its output is saved for the backward.
    auto fwd = std::find_if(step->ops.begin(), step->ops.end(), [](const OpRecord& o) {
      return o.phase == Phase::Forward && o.name == "flashmask_attention";
    });
    QVERIFY(fwd != step->ops.end());
    const auto want = relationsOf(*fwd);
    QCOMPARE(want.links, 2);
    QVERIFY2(want.dataEdges >= 1, std::to_string(want.dataEdges).c_str());
    sel.select(Side::A, fwd->seq);
    QCOMPARE(view.crossPhaseLinesDrawn().links, want.links);
    QCOMPARE(view.crossPhaseLinesDrawn().dataEdges, want.dataEdges);
    // Hovering its backward op adds that op's relations; leaving the node takes them away.
    auto bwd = std::find_if(step->ops.begin(), step->ops.end(), [&](const OpRecord& o) {
      return o.phase == Phase::Backward && o.forwardSeq == fwd->seq;
    });
    QVERIFY(bwd != step->ops.end());
    const auto hover = relationsOf(*bwd);
    QGraphicsView* gv = view.graphicsView();
    gv->resetTransform();
    QAbstractGraphicsShapeItem* item = view.opItem(bwd->seq);
    QVERIFY(item);
    gv->centerOn(item);
    QTest::mouseMove(gv->viewport(), gv->mapFromScene(item->scenePos()));
    QCOMPARE(view.crossPhaseLinesDrawn().links, want.links + hover.links);
    QCOMPARE(view.crossPhaseLinesDrawn().dataEdges, want.dataEdges + hover.dataEdges);
    saveScreenshot(view, "graph_relations", fwd->seq);
    QTest::mouseMove(gv->viewport(), QPoint(2, 2));
    QCOMPARE(view.crossPhaseLinesDrawn().links, want.links);
    QCOMPARE(view.crossPhaseLinesDrawn().dataEdges, want.dataEdges);
    sel.clear();
    QCOMPARE(view.crossPhaseLinesDrawn().links, 0);
    QCOMPARE(view.crossPhaseLinesDrawn().dataEdges, 0);
  }

  void searchHighlightsAndEnterCyclesThroughMatches() {
    Selection sel;
    GraphView view(&sel, Side::A);
    view.resize(1000, 700);
    view.show();
    StepPtr step = stepOf(path_, 1);
    QVERIFY(setStepAndWait(view, step, false));
    std::vector<uint64_t> expected;
    for (const auto& o : step->ops)
      if ((o.phase == Phase::Forward || o.phase == Phase::Backward) &&
          (o.name.find("flashmask") != std::string::npos ||
           o.scope.find("flashmask") != std::string::npos))
        expected.push_back(o.seq);
    QVERIFY(expected.size() >= 4);  // 2 layers, forward + backward
    view.setSearchText("FlashMask");
    QCOMPARE(view.searchMatchCount(), int(expected.size()));
    view.findNext();
    QCOMPARE(sel.current(Side::A), std::optional<uint64_t>(expected[0]));
    view.findNext();
    QCOMPARE(sel.current(Side::A), std::optional<uint64_t>(expected[1]));
    // Ops of a phase the graph hides are counted apart ("0 match(es)" for the optimizer's read as
    // "there is no such op").
    int optimizer = 0;
    for (const auto& o : step->ops)
      if (o.phase == Phase::Optimizer && o.name.find("adamw") != std::string::npos) ++optimizer;
    QVERIFY(optimizer > 0);
    view.setSearchText("adamw");
    QCOMPARE(view.searchMatchCount(), 0);
    auto* label = view.findChild<QLabel*>("graphMatches");
    QVERIFY(label);
    QCOMPARE(label->text(), QString("0 match(es), %1 in hidden phases").arg(optimizer));
    QVERIFY(label->toolTip().contains("phase selector"));
  }

  // A view narrower than the graph (a docked or compared graph on a small screen) opens at
  // readable size at the graph's top left, where the forward pass starts: centred, it cut the
  // forward cluster in half. Fit, where it cannot show the whole graph readably, does the same.
  void aNarrowViewOpensAtTheTopLeftWhereTheForwardPassStarts() {
    Selection sel;
    GraphView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {300, 400}));
    QVERIFY(setStepAndWait(view, stepOf(path_, 1), false));
    QGraphicsView* gv = view.graphicsView();
    const QRectF scene = view.scene()->sceneRect();
    QCOMPARE(gv->transform().m11(), 0.85);
    QRectF seen = gv->mapToScene(gv->viewport()->rect()).boundingRect();
    QVERIFY2(seen.width() < scene.width(), "the graph must be wider than the view");
    QVERIFY2(seen.left() <= scene.left() + 1 && seen.top() <= scene.top() + 1,
             qPrintable(QString("seen %1,%2 of %3,%4")
                            .arg(seen.left())
                            .arg(seen.top())
                            .arg(scene.left())
                            .arg(scene.top())));
    view.fitToView();  // the graph's width (a tall narrow graph) or wider: from the top left
    seen = gv->mapToScene(gv->viewport()->rect()).boundingRect();
    const double pixel = 1 / gv->transform().m11();  // a whole width is centred: within a pixel
    QVERIFY2(seen.top() <= scene.top() + pixel && seen.left() <= scene.left() + pixel,
             qPrintable(QString("fit: seen %1,%2 %3x%4 of %5,%6 %7x%8 at %9")
                            .arg(seen.left())
                            .arg(seen.top())
                            .arg(seen.width())
                            .arg(seen.height())
                            .arg(scene.left())
                            .arg(scene.top())
                            .arg(scene.width())
                            .arg(scene.height())
                            .arg(gv->transform().m11())));
  }

  // The overview is a fifth of the canvas's shorter side (60 to 170 pixels): a fixed 170 covered
  // much of a narrow pane, two ranks or two runs side by side on a 1366-pixel screen.
  void theMinimapScalesWithThePane() {
    Selection sel;
    GraphView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {1000, 700}));
    QVERIFY(setStepAndWait(view, stepOf(path_, 1), false));
    QGraphicsView* gv = view.graphicsView();
    QWidget* minimap = minimapOf(gv);
    QVERIFY(minimap && minimap->isVisible());
    const int big = std::max(minimap->width(), minimap->height());
    QVERIFY2(big > 120 && big <= 176, qPrintable(QString::number(big)));
    view.resize(420, 360);
    QVERIFY(
        QTest::qWaitFor([&] { return std::max(minimap->width(), minimap->height()) < big; }, 5000));
    const int side = std::max(minimap->width(), minimap->height());
    const int shorter = std::min(gv->width(), gv->height());
    QVERIFY2(side <= std::max(60, shorter / 5) + 6,
             qPrintable(QString("minimap %1 in a canvas of %2").arg(side).arg(shorter)));
  }

  // A thin minimap (a tall graph's) sits in a strip of its own beside the viewport: over the
  // canvas's corner it hid the right-hand nodes of a narrow compared graph. Once the whole graph
  // is in view, the minimap and its strip are gone.
  void aThinMinimapHasAStripOfItsOwnBesideTheViewport() {
    Selection sel;
    GraphView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {500, 500}));
    QVERIFY(setStepAndWait(view, stepOf(path_, 1), true));
    QGraphicsView* gv = view.graphicsView();
    QWidget* minimap = minimapOf(gv);
    QVERIFY(minimap);
    QVERIFY(minimap->isVisible());
    QVERIFY2(minimap->width() <= 60 && minimap->height() > 2 * minimap->width(),
             qPrintable(QString("minimap %1x%2").arg(minimap->width()).arg(minimap->height())));
    const QRect port = gv->viewport()->geometry();
    QVERIFY2(!minimap->geometry().intersects(port),
             qPrintable(QString("minimap at x %1, viewport to x %2")
                            .arg(minimap->geometry().left())
                            .arg(port.right())));
    QVERIFY(minimap->geometry().right() < gv->width());
    for (int i = 0; i < 40 && minimap->isVisible(); ++i) view.zoomOut();
    QVERIFY(!minimap->isVisible());
    QVERIFY(!gv->verticalScrollBar()->isVisible() && !gv->horizontalScrollBar()->isVisible());
    QCOMPARE(gv->viewport()->geometry(), gv->contentsRect());  // no strip left
  }

  // The colour legend is a row under the canvas, wrapped where the view is narrow: in the toolbar
  // it pushed Find and the zoom buttons into the overflow menu at 1366x768, and over the canvas's
  // corner it hid nodes and module labels.
  void theLegendLiesUnderTheCanvasAndLeavesTheToolbarItsFind() {
    Selection sel;
    GraphView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {810, 480}));  // the graph's width beside the inspector at 1366
    QVERIFY(setStepAndWait(view, stepOf(path_, 1), false));
    QGraphicsView* gv = view.graphicsView();
    auto* legend = view.findChild<QLabel*>("graphLegend");
    QVERIFY(legend);
    QCOMPARE(legend->parentWidget(), &view);  // not a child of the canvas: it covers nothing
    auto* find = view.findChild<QLineEdit*>();
    QVERIFY(find);
    for (const int width : {810, 300}) {
      view.resize(width, 480);
      QTest::qWait(50);
      QApplication::processEvents();
      QVERIFY(legend->isVisible());
      QVERIFY(legend->text().contains("backward"));
      const QRect canvas = gv->geometry(), at = legend->geometry();
      QVERIFY2(
          at.top() >= canvas.bottom() && at.right() <= view.width() && at.bottom() <= view.height(),
          qPrintable(QString("width %1: legend %2,%3 %4x%5, canvas %6,%7 %8x%9")
                         .arg(width)
                         .arg(at.x())
                         .arg(at.y())
                         .arg(at.width())
                         .arg(at.height())
                         .arg(canvas.x())
                         .arg(canvas.y())
                         .arg(canvas.width())
                         .arg(canvas.height())));
      const int line = legend->fontMetrics().height();
      if (width == 810) {
        QVERIFY(find->isVisible());  // not in the toolbar's overflow menu
        QVERIFY2(at.height() < 2 * line + 8, "one line where it fits");
      } else {
        QVERIFY2(at.height() >= 2 * line, "wrapped where narrow");
      }
    }
  }

  void zoomFitAndCtrlWheel() {
    Selection sel;
    GraphView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {1000, 700}));
    QVERIFY(setStepAndWait(view, stepOf(path_, 1), false));
    QGraphicsView* gv = view.graphicsView();
    // First show keeps labels readable (Note [Initial graph view]): the fit if that is at least
    // 60%, else 85% at the top of the graph.
    const double first = gv->transform().m11();
    QVERIFY(first >= 0.6 - 1e-9);
    if (first < 0.85 + 1e-9 && first > 0.85 - 1e-9) {
      const QRectF top = gv->mapToScene(gv->viewport()->rect()).boundingRect();
      QVERIFY(top.top() <= view.scene()->sceneRect().top() + 1);
    }
    // Fit (Note [Semantic zoom]): the whole graph when its text reads so, else the scale where
    // module blocks read, from the top of the graph.
    view.fitToView();
    QVERIFY(view.labelsReadable());
    const QRectF seen = gv->mapToScene(gv->viewport()->rect()).boundingRect();
    QVERIFY(seen.top() <= view.scene()->sceneRect().top() + 1);
    const double fit = gv->transform().m11();
    QVERIFY(fit < 1.0);
    view.zoomIn();
    QVERIFY(std::abs(gv->transform().m11() - fit * 1.25) < 1e-9);
    view.zoomOut();
    QVERIFY(std::abs(gv->transform().m11() - fit) < 1e-9);
    auto wheel = [&](Qt::KeyboardModifiers mods) {
      const QPoint at = gv->viewport()->rect().center();
      QWheelEvent e(at, gv->viewport()->mapToGlobal(at), QPoint(), QPoint(0, 120), Qt::NoButton,
                    mods, Qt::NoScrollPhase, false);
      QApplication::sendEvent(gv->viewport(), &e);
    };
    wheel(Qt::ControlModifier);
    QVERIFY(gv->transform().m11() > fit * 1.1);
    const double zoomed = gv->transform().m11();
    wheel(Qt::NoModifier);  // scrolls, does not zoom
    QCOMPARE(gv->transform().m11(), zoomed);
    view.fitToView();
    QCOMPARE(gv->transform().m11(), fit);
  }

  void largeStepOpensCollapsedOffTheGuiThread() {
    // gpt-tiny with 6 layers: more than kLargeGraphOps forward + backward ops (about 55 a layer
    // since the attention is one flashmask_attention op).
    QFile in(QString(KEEL_SOURCE_DIR) + "/tests/fixtures/gpt-tiny.json");
    QVERIFY(in.open(QIODevice::ReadOnly));
    QByteArray cfg = in.readAll();
    QVERIFY(cfg.contains("\"n_layer\": 2"));
    cfg.replace("\"n_layer\": 2", "\"n_layer\": 6");
    const QString cfgPath = test::tempDir() + "/gpt-tiny-6.json";
    QFile out(cfgPath);
    QVERIFY(out.open(QIODevice::WriteOnly));
    out.write(cfg);
    out.close();
    const QString big = test::tempDir() + "/graph4.db";
    std::string log;
    QCOMPARE(test::runKeel("record --config '" + cfgPath.toStdString() + "' -o '" +
                               big.toStdString() + "' --steps 1 --seed 1",
                           &log),
             0);

    Selection sel;
    GraphView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {1200, 800}));
    StepPtr step = stepOf(big, 1);
    const int count = countPhase(*step, "forward") + countPhase(*step, "backward");
    QVERIFY(count > GraphView::kLargeGraphOps);
    QSignalSpy done(&view, &GraphView::layoutFinished);
    view.setStep(step);
    QVERIFY(view.isLayingOut());  // returned at once: the layout runs on the pool
    QVERIFY(done.wait(60000));
    QVERIFY(view.moduleNodeCount() > 0);
    QVERIFY(view.visibleOpNodeCount() < count);
    saveScreenshot(view, "graph_collapsed");

    QVERIFY(view.moduleItem(Phase::Forward, "blocks.1.attn"));
    const int before = view.visibleOpNodeCount();
    done.clear();
    view.expand("blocks.1.attn");
    QVERIFY(done.wait(60000));
    QVERIFY(view.visibleOpNodeCount() > before);
    QVERIFY(!view.moduleItem(Phase::Forward, "blocks.1.attn"));
    QVERIFY(view.moduleItem(Phase::Forward, "blocks.2.attn"));  // the rest stays collapsed
    const auto attn = std::find_if(step->ops.begin(), step->ops.end(), [](const OpRecord& o) {
      return o.phase == Phase::Forward && o.scope == "blocks.1.attn" &&
             o.name == "flashmask_attention";
    });
    saveScreenshot(view, "graph_expanded_module", attn->seq);

    // Double-clicking a module's node expands it.
    {
      QAbstractGraphicsShapeItem* module = view.moduleItem(Phase::Backward, "blocks.2.mlp");
      QVERIFY(module);
      QGraphicsView* gv = view.graphicsView();
      gv->resetTransform();
      gv->centerOn(module);
      done.clear();
      QTest::mouseDClick(gv->viewport(), Qt::LeftButton, {}, gv->mapFromScene(module->scenePos()));
      QVERIFY(done.wait(60000));
      QVERIFY(!view.moduleItem(Phase::Backward, "blocks.2.mlp"));
      QVERIFY(view.moduleItem(Phase::Forward, "blocks.2.attn"));
    }

    // Selecting an op hidden in a collapsed module expands it and draws the op.
    auto hidden = std::find_if(step->ops.begin(), step->ops.end(), [](const OpRecord& o) {
      return o.phase == Phase::Forward && o.scope == "blocks.3.mlp.w1" && o.name == "matmul";
    });
    QVERIFY(hidden != step->ops.end());
    QVERIFY(!view.opItem(hidden->seq));
    sel.select(Side::A, hidden->seq);
    QVERIFY(waitLaidOut(view));
    QVERIFY(view.opItem(hidden->seq));

    // Collapsing a module gives back its node.
    view.collapse("blocks.3");
    QVERIFY(waitLaidOut(view));
    QVERIFY(view.moduleItem(Phase::Backward, "blocks.3"));

    view.expandAll();
    QVERIFY(waitLaidOut(view));
    QCOMPARE(view.visibleOpNodeCount(), count);
    QCOMPARE(view.moduleNodeCount(), 0);

    // A view destroyed while its layout runs leaves the layout to finish harmlessly.
    auto* doomed = new GraphView(&sel, Side::A);
    doomed->setStep(step);
    doomed->expandAll();
    QVERIFY(doomed->isLayingOut());
    delete doomed;
    QThreadPool::globalInstance()->waitForDone();
    QCoreApplication::processEvents();
  }

  // `keel export graph` writes the studio's graph: for the same step, phase filter and expansion,
  // the real keel binary prints the DOT the view lays out, but for the sizes of nodes and cluster
  // labels, which the view takes from its fonts and the CLI from the fixed default metrics: the
  // view's options with those give the CLI's text byte for byte.
  void cliExportIsTheStudiosGraph() {
    const StepPtr step = loadStepLikeTheStudio(path_, 1);
    QVERIFY(step && !step->ops.empty());
    Selection sel;
    GraphView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {1200, 800}));
    QVERIFY(setStepAndWait(view, step, false));
    struct Case {
      const char* phase;
      const char* expand;  // "*": every module, "": none, else one scope
      std::string args;    // the same, as `keel export graph` options
    };
    const Case cases[] = {{"both", "*", ""},
                          {"forward", "", " --collapse"},
                          {"backward", "blocks.1.attn", " --expand blocks.1.attn"},
                          {"optimizer", "*", ""}};
    for (const Case& c : cases) {
      view.setPhaseFilter(c.phase);
      if (std::string(c.expand) == "*") {
        view.expandAll();
      } else {
        view.collapseAll();
        if (*c.expand) view.expand(c.expand);
      }
      QVERIFY(waitLaidOut(view));
      const auto graph = view.graph();
      QVERIFY2(graph, c.phase);
      keel::analysis::GraphDotOptions o = view.dotOptions();
      QCOMPARE(graph->dot, keel::analysis::buildGraphDot(step->ops, o).dot);
      o.metrics = keel::analysis::GraphDotOptions().metrics;  // the CLI's
      const std::string expected = keel::analysis::buildGraphDot(step->ops, o).dot;
      std::string out;
      QCOMPARE(test::runKeel("export graph '" + path_.toStdString() + "' --step 1 --phase " +
                                 c.phase + " --format dot" + c.args,
                             &out),
               0);
      size_t at = 0;  // the first difference, for the message
      while (at < out.size() && at < expected.size() && out[at] == expected[at]) ++at;
      at = at > 200 ? at - 200 : 0;
      QVERIFY2(out == expected,
               (std::string(c.phase) + c.args + ": keel export graph prints\n" +
                out.substr(at, 400) + "\nwhere the studio's graph has\n" + expected.substr(at, 400))
                   .c_str());
      QVERIFY(out.rfind("digraph step {\n", 0) == 0);
    }
  }

  // Note [Semantic zoom]: op labels at and above kLabelScale; below, the modules of one depth as
  // blocks with their summary, deeper blocks as zoom grows, top-level blocks when far out.
  void semanticZoomSwitchesAtTheLabelScale() {
    Selection sel;
    GraphView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {1200, 800}));
    StepPtr step = stepOf(path_, 1);
    QVERIFY(setStepAndWait(view, step, true));
    view.setZoomScale(1.0);
    QCOMPARE(view.semanticLevel(), 0);
    QVERIFY(view.opLabelsShown());
    view.setZoomScale(GraphView::kLabelScale);
    QCOMPARE(view.semanticLevel(), 0);
    view.setZoomScale(GraphView::kLabelScale * 0.98);
    QVERIFY(!view.opLabelsShown());
    const int near = view.semanticLevel();
    QVERIFY(near >= 1);
    view.setZoomScale(0.002);  // far out: top-level blocks
    QCOMPARE(view.semanticLevel(), 1);
    QVERIFY(!view.labelsReadable());
    int last = 1;  // zooming in never merges blocks back
    for (double s = 0.004; s < GraphView::kLabelScale; s *= 1.5) {
      view.setZoomScale(s);
      QVERIFY(view.semanticLevel() >= last);
      last = view.semanticLevel();
    }
    view.setZoomScale(GraphView::kLabelScale * 0.98);
    QCOMPARE(view.semanticLevel(), near);
    QVERIFY(near >= last);
    // A block's text: its scope, then the summary (ops, time, bytes) of every op under it.
    const OpRecord* scoped = nullptr;
    for (const auto& o : step->ops)
      if (o.phase == Phase::Forward && !o.scope.empty()) {
        scoped = &o;
        break;
      }
    QVERIFY(scoped);
    const QString top = QString::fromStdString(keel::analysis::scopePrefixes(scoped->scope)[0]);
    const QStringList text = view.moduleSummaryText("forward", top);
    QVERIFY(text.size() >= 2);
    QCOMPARE(text[0], top);
    int64_t under = 0;
    for (const auto& o : step->ops)
      if (o.phase == Phase::Forward && keel::scopeWithin(o.scope, top.toStdString())) ++under;
    QVERIFY2(text[1].startsWith(QString::fromStdString(keel::analysis::opCountText(under)) + ", "),
             qPrintable(text[1]));
    QVERIFY(view.moduleSummaryText("forward", "no.such.module").isEmpty());
    view.setZoomScale(0.1);
    saveScreenshot(view, "graph_semantic");
  }

  // A step too tall to fit readably (a small window): Fit picks a scale where text reads.
  void fitOnALargeExpandedStepKeepsTextReadable() {
    Selection sel;
    GraphView view(&sel, Side::A);
    QVERIFY(test::showAt(view, {500, 350}));
    QVERIFY(setStepAndWait(view, stepOf(path_, 1), true));
    QGraphicsView* gv = view.graphicsView();
    gv->fitInView(view.scene()->sceneRect(), Qt::KeepAspectRatio);  // the plain fit
    const double plain = view.zoomScale();
    QVERIFY(plain < GraphView::kLabelScale);
    view.fitToView();
    QVERIFY(view.labelsReadable());
    QVERIFY(view.zoomScale() >= plain);
    QVERIFY(view.semanticLevel() >= 1 || view.opLabelsShown());  // never tiny op labels
  }

  // Note [Non-finite colouring]: a run with a NaN opens coloured by it; exactly the ops with a
  // NaN/Inf output are red, the ops reading them marked; a failed op paints over any mode.
  void nonFiniteModeIsTheDefaultForARunWithNans() {
    const QString nan = test::tempDir() + "/graph-nan.db";
    QVERIFY(
        test::recordFixture(nan, "--steps 1 --seed 1 --stats", "KEEL_TEST_PERTURB=matmul:20:nan"));
    Selection sel;
    GraphView view(&sel, Side::A);
    view.resize(1200, 800);
    view.show();
    StepPtr step = stepOf(nan, 1);
    QSignalSpy done(&view, &GraphView::layoutFinished);
    view.setStep(step);
    QCOMPARE(view.colorMode(), GraphView::ColorMode::NonFinite);
    QVERIFY(done.wait(60000));
    view.expandAll();
    QVERIFY(waitLaidOut(view));
    const auto marks = keel::analysis::nonFiniteMarks(step->ops);
    int red = 0, fed = 0;
    for (size_t i = 0; i < step->ops.size(); ++i) {
      const OpRecord& o = step->ops[i];
      if (o.phase == Phase::Optimizer) continue;
      QAbstractGraphicsShapeItem* item = view.opItem(o.seq);
      QVERIFY(item);
      const bool bad = keel::storage::holdsNonFinite(o);  // no masks in this run: all faults
      QCOMPARE(marks[i] == keel::analysis::NonFiniteMark::NonFinite, bad);
      QCOMPARE(item->brush().color(), GraphView::nonFiniteColor(marks[i]));
      red += bad ? 1 : 0;
      fed += marks[i] == keel::analysis::NonFiniteMark::Fed ? 1 : 0;
    }
    QVERIFY(red >= 1);
    QVERIFY(red < int(step->ops.size()));
    QVERIFY(fed + red < int(step->ops.size()));
    saveScreenshot(view, "graph_nonfinite");

    // A failed op: distinct over any colour mode, until cleared.
    const uint64_t failed = step->ops[step->ops.size() / 3].seq;
    view.markFailed(failed);
    QVERIFY(view.isFailed(failed));
    QCOMPARE(view.opItem(failed)->brush().color(), GraphView::failedColor());
    view.setColorMode(GraphView::ColorMode::Phase);
    QCOMPARE(view.opItem(failed)->brush().color(), GraphView::failedColor());
    view.clearFailed();
    QVERIFY(view.opItem(failed)->brush().color() != GraphView::failedColor());

    // A clean run opens coloured by phase; told the recording has a NaN elsewhere, by NaNs.
    GraphView clean(&sel, Side::B);
    clean.setStep(stepOf(path_, 1));
    QCOMPARE(clean.colorMode(), GraphView::ColorMode::Phase);
    clean.setRecordingNonFinite(true);
    QCOMPARE(clean.colorMode(), GraphView::ColorMode::NonFinite);
    // The next recording has none: phases again (the NaN colouring stayed, all grey).
    clean.setRecordingNonFinite(false);
    QCOMPARE(clean.colorMode(), GraphView::ColorMode::Phase);
    clean.setAutomaticColorMode(GraphView::ColorMode::Divergence);  // a diff shown
    QCOMPARE(clean.colorMode(), GraphView::ColorMode::Divergence);
    clean.setRecordingNonFinite(false);  // then a single recording opened
    QCOMPARE(clean.colorMode(), GraphView::ColorMode::Phase);
    GraphView chosen(&sel, Side::B);  // a mode the user chose stays
    chosen.setColorMode(GraphView::ColorMode::OpTime);
    chosen.setStep(step);
    QCOMPARE(chosen.colorMode(), GraphView::ColorMode::OpTime);
    chosen.setRecordingNonFinite(true);
    chosen.setAutomaticColorMode(GraphView::ColorMode::Divergence);
    QCOMPARE(chosen.colorMode(), GraphView::ColorMode::OpTime);
  }

  void divergenceModePaintsDivergedOpsRed() {
    const QString bad = test::tempDir() + "/graph-perturbed.db";
    QVERIFY(test::recordFixture(bad, "--steps 1 --seed 1 --md5 --stats --stacks",
                                "KEEL_TEST_PERTURB=matmul:5"));
    DiffPtr diff = DiffRunner::run(path_, bad);
    QVERIFY(diff && diff->first);
    Selection sel;
    GraphView view(&sel, Side::A);
    view.resize(1200, 800);
    view.show();
    StepPtr step = stepOf(path_, 1);
    QSignalSpy done(&view, &GraphView::layoutFinished);
    view.setStep(step);
    view.setDiff(diff);
    view.setColorMode(GraphView::ColorMode::Divergence);
    QVERIFY(done.wait(60000));
    view.expandAll();
    QVERIFY(waitLaidOut(view));
    int diverged = 0, equal = 0;
    for (const auto& p : diff->pairs) {
      if (!p.inA || p.step != 1 || p.phase == Phase::Optimizer) continue;
      QAbstractGraphicsShapeItem* item = view.opItem(p.seqA);
      QVERIFY(item);
      const bool first = p.seqA == diff->first->pair.seqA;
      if (p.status == keel::storage::DiffStatus::Diverged) {
        ++diverged;
        QCOMPARE(item->brush().color(), first ? QColor("#b3261e") : QColor("#ec6b5f"));
        if (first) QCOMPARE(item->pen().widthF(), 3.0);
      } else if (p.status == keel::storage::DiffStatus::Equal) {
        ++equal;
        QCOMPARE(item->brush().color(), QColor("#a8d8a2"));
      }
    }
    QVERIFY(diverged >= 2);
    QVERIFY(equal > 0);
    QCOMPARE(GraphView::statusColor(keel::storage::DiffStatus::Diverged), QColor("#ec6b5f"));
    saveScreenshot(view, "graph_divergence", diff->first->pair.seqA);

    // Other modes recolour the same items.
    view.setColorMode(GraphView::ColorMode::Phase);
    QCOMPARE(view.opItem(diff->first->pair.seqA)->brush().color(),
             GraphView::phaseColor(keel::Phase::Forward));
    view.setColorMode(GraphView::ColorMode::OpTime);
    saveScreenshot(view, "graph_optime", diff->first->pair.seqA);
  }

 private:
  // With KEEL_GRAPH_SCREENSHOTS=<dir>, saves the view as it is and at 100% around op `seq` (or
  // the top of the graph).
  static void saveScreenshot(GraphView& view, const char* name, uint64_t seq = 0) {
    const QByteArray dir = qgetenv("KEEL_GRAPH_SCREENSHOTS");
    if (dir.isEmpty()) return;
    view.grab().save(QString("%1/%2_fit.png").arg(QString(dir), name));
    QGraphicsView* gv = view.graphicsView();
    const QTransform saved = gv->transform();
    gv->resetTransform();
    if (auto* item = view.opItem(seq))
      gv->centerOn(item);
    else
      gv->centerOn(view.scene()->sceneRect().center().x(), view.scene()->sceneRect().top() + 300);
    view.grab().save(QString("%1/%2_100.png").arg(QString(dir), name));
    gv->setTransform(saved);
  }

  QString path_;
};

QTEST_MAIN(GraphTest)
#include "graph_test.moc"
