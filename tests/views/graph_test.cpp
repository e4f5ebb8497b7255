// The graph view: DOT text of a hand-made step (as text), Graphviz layout, and GraphView on real
// recordings made by the keel binary (every op drawn, click selects, J jumps forward <-> backward,
// large steps open collapsed and lay out off the GUI thread, divergence colours).
#include <QAbstractGraphicsShapeItem>
#include <QFile>
#include <QGraphicsScene>
#include <QGraphicsView>
#include <QSignalSpy>
#include <QThreadPool>
#include <QWheelEvent>
#include <QtTest>
#include <algorithm>

#include "graph_layout.h"
#include "keel/storage/reader.h"
#include "keel/views/graph_dot.h"
#include "keel/views/graph_view.h"
#include "keel/views/run_source.h"
#include "keel/views/selection.h"
#include "view_test_util.h"

using namespace keel::views;
using keel::storage::OpRecord;
using keel::storage::Role;
using keel::storage::TensorRecord;

namespace {

TensorRecord tensor(Role role, int index, uint64_t id, uint64_t version = 0) {
  TensorRecord t;
  t.role = role;
  t.index = index;
  t.tensorId = id;
  t.version = version;
  t.shape = {4, 8};
  t.dtype = "float32";
  t.bytes = 128;
  return t;
}

OpRecord op(uint64_t seq, const char* phase, const char* name, const char* scope,
            std::vector<TensorRecord> tensors, uint64_t forwardSeq = 0) {
  OpRecord o;
  o.seq = seq;
  o.step = 1;
  o.phase = phase;
  o.name = name;
  o.scope = scope;
  o.forwardSeq = forwardSeq;
  o.beginNs = int64_t(seq) * 1000;
  o.endNs = o.beginNs + 500;
  o.tensors = std::move(tensors);
  return o;
}

// A tiny step: embedding -> block (norm, attention, residual add) -> in-place add -> sum, its
// backward (with an autograd accumulation outside any module), and one optimizer op.
std::vector<OpRecord> smallStep() {
  const Role I = Role::Input, O = Role::Output;
  return {
      op(1, "forward", "embedding", "wte", {tensor(O, 0, 10)}),
      op(2, "forward", "layer_norm", "blocks.0.norm1", {tensor(I, 0, 10), tensor(O, 0, 11)}),
      op(3, "forward", "matmul", "blocks.0.attn", {tensor(I, 0, 11), tensor(O, 0, 12)}),
      op(4, "forward", "softmax", "blocks.0.attn", {tensor(I, 0, 12), tensor(O, 0, 13)}),
      op(5, "forward", "add", "blocks.0", {tensor(I, 0, 10), tensor(I, 1, 13), tensor(O, 0, 14)}),
      op(6, "forward", "add_", "", {tensor(I, 0, 14), tensor(O, 0, 14, 1)}),  // in place: v1
      op(7, "forward", "sum", "", {tensor(I, 0, 14, 1), tensor(O, 0, 15)}),
      op(8, "backward", "sum_backward", "", {tensor(I, 0, 16), tensor(O, 0, 17)}, 7),
      op(9, "backward", "add", "blocks.0", {tensor(I, 0, 17), tensor(O, 0, 18)}, 5),
      op(10, "backward", "softmax_backward", "blocks.0.attn",
         {tensor(I, 0, 18), tensor(I, 1, 13), tensor(O, 0, 19)}, 4),
      op(11, "backward", "add", "", {tensor(I, 0, 18), tensor(I, 1, 19), tensor(O, 0, 20)}),
      op(12, "optimizer", "adamw_step", "wte", {tensor(I, 0, 20), tensor(O, 0, 21)}),
  };
}

const char* kLabel18 =
    "label=<<TABLE BORDER=\"0\" CELLSPACING=\"0\" CELLPADDING=\"0\" FIXEDSIZE=\"TRUE\" "
    "WIDTH=\"";

std::string label(int width) {
  return std::string(kLabel18) + std::to_string(width) +
         "\" HEIGHT=\"18\"><TR><TD></TD></TR></TABLE>>; labeljust=l;\n";
}

StepPtr loadStep(const QString& path, int64_t step) {
  auto rec = keel::storage::Recording::open(path.toStdString());
  auto d = std::make_shared<StepData>();
  d->step = step;
  d->ops = rec.stepOps(step);
  return d;
}

int countPhase(const StepData& s, const char* phase) {
  return int(std::count_if(s.ops.begin(), s.ops.end(),
                           [&](const OpRecord& o) { return o.phase == phase; }));
}

bool waitLaidOut(GraphView& view, int timeoutMs = 60000) {
  QElapsedTimer t;
  t.start();
  while (view.isLayingOut() && t.elapsed() < timeoutMs) QTest::qWait(20);
  return !view.isLayingOut();
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

  // --- DOT text (pure) -------------------------------------------------------------------------

  void dotTextOfForwardGraph() {
    const auto ops = smallStep();
    GraphDotOptions o;
    o.phase = GraphPhase::Forward;
    o.metrics = TextMetrics::fixed(7, 14);
    const GraphDot g = buildGraphDot(ops, o);
    // Heights: 2 lines of 14 + 2 * 5 padding = 38 px = 0.5278 in; widths from 7 px characters.
    const std::string expected =
        "digraph step {\n"
        "  graph [rankdir=TB, nodesep=0.25, ranksep=0.3, fontsize=10];\n"
        "  node [shape=box, fixedsize=true, label=\"\"];\n"
        "  edge [arrowsize=0.6];\n"
        "  \"o6\" [width=1.1528, height=0.5278];\n"
        "  \"o7\" [width=1.1528, height=0.5278];\n"
        "subgraph \"cluster_f:wte\" {\n"
        "  " +
        label(33) +
        "  \"o1\" [width=1.1528, height=0.5278];\n"
        "}\n"
        "subgraph \"cluster_f:blocks\" {\n"
        "  " +
        label(54) +
        "  subgraph \"cluster_f:blocks.0\" {\n"
        "    " +
        label(68) +
        "    \"o5\" [width=1.1528, height=0.5278];\n"
        "    subgraph \"cluster_f:blocks.0.norm1\" {\n"
        "      " +
        label(110) +
        "      \"o2\" [width=1.2500, height=0.5278];\n"
        "    }\n"
        "    subgraph \"cluster_f:blocks.0.attn\" {\n"
        "      " +
        label(103) +
        "      \"o3\" [width=1.1528, height=0.5278];\n"
        "      \"o4\" [width=1.1528, height=0.5278];\n"
        "    }\n"
        "  }\n"
        "}\n"
        "  \"o1\" -> \"o2\";\n"
        "  \"o2\" -> \"o3\";\n"
        "  \"o3\" -> \"o4\";\n"
        "  \"o1\" -> \"o5\";\n"
        "  \"o4\" -> \"o5\";\n"
        "  \"o5\" -> \"o6\";\n"
        "  \"o6\" -> \"o7\";\n"
        "}\n";
    QCOMPARE(QString::fromStdString(g.dot), QString::fromStdString(expected));
    QCOMPARE(g.opNodes, 7);
    QCOMPARE(g.moduleNodes, 0);
    QCOMPARE(int(g.clusters.size()), 5);
    QCOMPARE(g.nodes[size_t(g.nodeOfOp.at(2))].title, std::string("layer_norm"));
    QCOMPARE(g.nodes[size_t(g.nodeOfOp.at(2))].subtitle, std::string("[4,8] f32"));
    QCOMPARE(g.nodes[size_t(g.nodeOfOp.at(2))].width, 90.0);  // "layer_norm" 70 + 2 * 10
    QCOMPARE(g.nodes[size_t(g.nodeOfOp.at(2))].height, 38.0);
    QVERIFY(g.links.empty());
  }

  void dotEdgesFollowTensorVersions() {
    const auto ops = smallStep();
    GraphDotOptions o;
    o.phase = GraphPhase::Forward;
    const GraphDot g = buildGraphDot(ops, o);
    // sum (#7) reads tensor 14 version 1, written in place by add_ (#6), not version 0 by add (#5).
    auto hasEdge = [&](uint64_t from, uint64_t to) {
      return std::any_of(g.edges.begin(), g.edges.end(), [&](const GraphEdge& e) {
        return e.from == g.nodeOfOp.at(from) && e.to == g.nodeOfOp.at(to);
      });
    };
    QVERIFY(hasEdge(6, 7));
    QVERIFY(!hasEdge(5, 7));
    QVERIFY(hasEdge(5, 6));
    QCOMPARE(int(g.edges.size()), 7);
  }

  void collapsedModuleMergesEdges() {
    const auto ops = smallStep();
    GraphDotOptions o;
    o.phase = GraphPhase::Forward;
    o.expandAll = false;  // nothing expanded: top-level modules only
    const GraphDot g = buildGraphDot(ops, o);
    const std::string expected =
        "digraph step {\n"
        "  graph [rankdir=TB, nodesep=0.25, ranksep=0.3, fontsize=10];\n"
        "  node [shape=box, fixedsize=true, label=\"\"];\n"
        "  edge [arrowsize=0.6];\n"
        "  \"m:f:wte\" [width=0.7500, height=0.6111];\n"
        "  \"m:f:blocks\" [width=0.9444, height=0.6111];\n"
        "  \"o6\" [width=1.1528, height=0.5278];\n"
        "  \"o7\" [width=1.1528, height=0.5278];\n"
        "  \"m:f:wte\" -> \"m:f:blocks\" [penwidth=2];\n"
        "  \"m:f:blocks\" -> \"o6\";\n"
        "  \"o6\" -> \"o7\";\n"
        "}\n";
    QCOMPARE(QString::fromStdString(g.dot), QString::fromStdString(expected));
    QCOMPARE(g.opNodes, 2);
    QCOMPARE(g.moduleNodes, 2);
    const GraphNode& blocks = g.nodes[size_t(g.nodeOfId.at("m:f:blocks"))];
    QCOMPARE(blocks.kind, GraphNodeKind::Module);
    QCOMPARE(blocks.subtitle, std::string("4 ops"));
    QCOMPARE(blocks.seqs, (std::vector<uint64_t>{2, 3, 4, 5}));
    // Two tensors (into the norm and the residual add) flow from wte into blocks: one edge.
    QCOMPARE(int(g.edges.size()), 3);
    QCOMPARE(g.edges[0].tensors, 2);

    // Expanding blocks shows blocks.0 as a module inside the blocks cluster.
    o.expanded = {"blocks"};
    const GraphDot g2 = buildGraphDot(ops, o);
    QCOMPARE(g2.moduleNodes, 2);  // wte, blocks.0
    QVERIFY(g2.nodeOfId.count("m:f:blocks.0"));
    QCOMPARE(int(g2.clusters.size()), 1);
    QCOMPARE(g2.clusters[0].id, std::string("cluster_f:blocks"));
  }

  void bothPhasesMirrorBackwardAndLinkPartners() {
    const auto ops = smallStep();
    GraphDotOptions o;  // Both: forward and backward, optimizer left out
    const GraphDot g = buildGraphDot(ops, o);
    QCOMPARE(g.opNodes, 11);
    QVERIFY(!g.nodeOfOp.count(12));
    // Backward edges are written consumer -> producer, drawn with the arrow at the consumer.
    QVERIFY(g.dot.find("  \"o9\" -> \"o8\" [dir=back];\n") != std::string::npos);
    QVERIFY(g.dot.find("  \"o10\" -> \"o9\" [dir=back];\n") != std::string::npos);
    // Saved activations (forward #4's output read by #10) cross phases: not laid out.
    QVERIFY(g.dot.find("\"o4\" -> \"o10\"") == std::string::npos);
    QVERIFY(g.dot.find("\"o10\" -> \"o4\"") == std::string::npos);
    QVERIFY(g.dot.find("subgraph \"cluster_f\" {") != std::string::npos);
    QVERIFY(g.dot.find("subgraph \"cluster_b\" {") != std::string::npos);
    // The accumulation (#11, scope "") is drawn in blocks.0, the module around its inputs.
    QCOMPARE(g.adoptedScope.at(11), std::string("blocks.0"));
    QCOMPARE(g.nodes[size_t(g.nodeOfOp.at(11))].scope, std::string("blocks.0"));
    QCOMPARE(std::string(drawnScope(g, ops[10])), std::string("blocks.0"));
    // Forward <-> backward links: sum/sum_backward, add/add, softmax/softmax_backward.
    QCOMPARE(int(g.links.size()), 3);
    std::vector<std::pair<uint64_t, uint64_t>> links;
    for (const auto& l : g.links)
      links.emplace_back(g.nodes[size_t(l.forward)].seq, g.nodes[size_t(l.backward)].seq);
    std::sort(links.begin(), links.end());
    QCOMPARE(links, (std::vector<std::pair<uint64_t, uint64_t>>{{4, 10}, {5, 9}, {7, 8}}));
  }

  void initialExpansionStaysWithinBudget() {
    const auto ops = smallStep();
    // Top level: add_, sum, wte, blocks = 4 nodes; one level down: 6.
    QCOMPARE(initialExpansion(ops, GraphPhase::Forward, 3), (std::unordered_set<std::string>{}));
    QCOMPARE(initialExpansion(ops, GraphPhase::Forward, 4),
             (std::unordered_set<std::string>{"wte", "blocks"}));
    QCOMPARE(initialExpansion(ops, GraphPhase::Forward, 100),
             (std::unordered_set<std::string>{"wte", "blocks", "blocks.0", "blocks.0.norm1",
                                              "blocks.0.attn"}));
    QCOMPARE(countGraphOps(ops, GraphPhase::Both), int64_t(11));
    QCOMPARE(scopePrefixes("blocks.1.attn"),
             (std::vector<std::string>{"blocks", "blocks.1", "blocks.1.attn"}));
    QCOMPARE(parseGraphPhase("backward"), GraphPhase::Backward);
    QCOMPARE(std::string(toString(parseGraphPhase("nonsense"))), std::string("both"));
  }

  // --- Layout (Graphviz) -----------------------------------------------------------------------

  void layoutPlacesEveryNode() {
    const auto ops = smallStep();
    const GraphDot g = buildGraphDot(ops, {});
    const GraphLayout l = layoutGraph(g.dot);
    QVERIFY2(l.error.empty(), l.error.c_str());
    QCOMPARE(int(l.nodes.size()), 11);
    QCOMPARE(l.edges.size(), g.edges.size());
    QCOMPARE(l.clusters.size(), g.clusters.size());
    for (const auto& n : l.nodes) {
      const GraphNode& gn = g.nodes[size_t(g.nodeOfId.at(n.id))];
      QVERIFY2(l.bounds.contains(n.center), n.id.c_str());
      QVERIFY(std::abs(n.size.width() - gn.width) < 1.0);
      QVERIFY(std::abs(n.size.height() - gn.height) < 1.0);
    }
    for (const auto& e : l.edges) {
      QVERIFY(e.points.size() >= 4);
      QCOMPARE((e.points.size() - 1) % 3, size_t(0));
      QVERIFY(e.arrowAtHead != e.arrowAtTail);  // dir=back puts the arrow at the tail
    }
    // Forward data flows down; the mirrored backward flows up (#8 feeds #9: #9 above #8).
    auto center = [&](const char* id) {
      return std::find_if(l.nodes.begin(), l.nodes.end(), [&](auto& n) { return n.id == id; })
          ->center;
    };
    QVERIFY(center("o2").y() < center("o3").y());
    QVERIFY(center("o9").y() < center("o8").y());
    // Every node sits inside its clusters.
    for (const auto& c : l.clusters) QVERIFY(l.bounds.contains(c.box));

    const GraphLayout bad = layoutGraph("digraph { a -> ");
    QVERIFY(!bad.error.empty());
  }

  // --- GraphView on real recordings ------------------------------------------------------------

  void fullyExpandedShowsEveryForwardAndBackwardOp() {
    Selection sel;
    GraphView view(&sel, Side::A);
    view.resize(1200, 800);
    view.show();
    QVERIFY(QTest::qWaitForWindowExposed(&view));
    StepPtr step = loadStep(path_, 1);
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
      const bool shown = o.phase == "forward" || o.phase == "backward";
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

  void clickOnNodeSelectsItsOp() {
    Selection sel;
    GraphView view(&sel, Side::A);
    view.resize(1000, 700);
    view.show();
    QVERIFY(QTest::qWaitForWindowExposed(&view));
    StepPtr step = loadStep(path_, 1);
    QSignalSpy done(&view, &GraphView::layoutFinished);
    view.setStep(step);
    QVERIFY(done.wait(60000));
    QVERIFY(waitLaidOut(view));
    auto it = std::find_if(step->ops.begin(), step->ops.end(), [](const OpRecord& o) {
      return o.phase == "forward" && o.name == "matmul";
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
    view.resize(1000, 700);
    view.show();
    QVERIFY(QTest::qWaitForWindowExposed(&view));
    StepPtr step = loadStep(path_, 1);
    QSignalSpy done(&view, &GraphView::layoutFinished);
    view.setStep(step);
    QVERIFY(done.wait(60000));
    auto fwd = std::find_if(step->ops.begin(), step->ops.end(), [](const OpRecord& o) {
      return o.phase == "forward" && o.name == "flashmask_attention";
    });
    QVERIFY(fwd != step->ops.end());
    sel.select(Side::A, fwd->seq);
    QVERIFY(view.jumpToPartner());
    const auto b = sel.current(Side::A);
    QVERIFY(b.has_value());
    const auto& bop = step->ops[size_t(step->indexOf(*b))];
    QCOMPARE(bop.phase, std::string("backward"));
    QCOMPARE(bop.forwardSeq, fwd->seq);
    QCOMPARE(bop.name, std::string("flashmask_attention_backward"));
    // And back, with the key.
    view.graphicsView()->setFocus();
    view.activateWindow();
    QTest::keyClick(view.graphicsView(), Qt::Key_J);
    QCOMPARE(sel.current(Side::A), std::optional<uint64_t>(fwd->seq));
    // An op with no partner: the gradient accumulation has no forward op.
    auto acc = std::find_if(step->ops.begin(), step->ops.end(), [](const OpRecord& o) {
      return o.phase == "backward" && o.forwardSeq == 0;
    });
    if (acc != step->ops.end()) {
      sel.select(Side::A, acc->seq);
      QVERIFY(!view.jumpToPartner());
      QCOMPARE(sel.current(Side::A), std::optional<uint64_t>(acc->seq));
    }
  }

  void searchHighlightsAndEnterCyclesThroughMatches() {
    Selection sel;
    GraphView view(&sel, Side::A);
    view.resize(1000, 700);
    view.show();
    StepPtr step = loadStep(path_, 1);
    QSignalSpy done(&view, &GraphView::layoutFinished);
    view.setStep(step);
    QVERIFY(done.wait(60000));
    std::vector<uint64_t> expected;
    for (const auto& o : step->ops)
      if ((o.phase == "forward" || o.phase == "backward") &&
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
  }

  void zoomFitAndCtrlWheel() {
    Selection sel;
    GraphView view(&sel, Side::A);
    view.resize(1000, 700);
    view.show();
    QVERIFY(QTest::qWaitForWindowExposed(&view));
    QSignalSpy done(&view, &GraphView::layoutFinished);
    view.setStep(loadStep(path_, 1));
    QVERIFY(done.wait(60000));
    QGraphicsView* gv = view.graphicsView();
    // First show keeps labels readable (Note [Initial graph view]): the fit if that is at least
    // 60%, else 85% at the top of the graph.
    const double first = gv->transform().m11();
    QVERIFY(first >= 0.6 - 1e-9);
    if (first < 0.85 + 1e-9 && first > 0.85 - 1e-9) {
      const QRectF top = gv->mapToScene(gv->viewport()->rect()).boundingRect();
      QVERIFY(top.top() <= view.scene()->sceneRect().top() + 1);
    }
    // Fit: the whole graph is in the viewport.
    view.fitToView();
    const QRectF seen = gv->mapToScene(gv->viewport()->rect()).boundingRect();
    QVERIFY(seen.adjusted(-1, -1, 1, 1).contains(view.scene()->sceneRect()));
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
    view.resize(1200, 800);
    view.show();
    QVERIFY(QTest::qWaitForWindowExposed(&view));
    StepPtr step = loadStep(big, 1);
    const int count = countPhase(*step, "forward") + countPhase(*step, "backward");
    QVERIFY(count > GraphView::kLargeGraphOps);
    QSignalSpy done(&view, &GraphView::layoutFinished);
    view.setStep(step);
    QVERIFY(view.isLayingOut());  // returned at once: the layout runs on the pool
    QVERIFY(done.wait(60000));
    QVERIFY(view.moduleNodeCount() > 0);
    QVERIFY(view.visibleOpNodeCount() < count);
    saveScreenshot(view, "graph_collapsed");

    QVERIFY(view.moduleItem("forward", "blocks.1.attn"));
    const int before = view.visibleOpNodeCount();
    done.clear();
    view.expand("blocks.1.attn");
    QVERIFY(done.wait(60000));
    QVERIFY(view.visibleOpNodeCount() > before);
    QVERIFY(!view.moduleItem("forward", "blocks.1.attn"));
    QVERIFY(view.moduleItem("forward", "blocks.2.attn"));  // the rest stays collapsed
    const auto attn = std::find_if(step->ops.begin(), step->ops.end(), [](const OpRecord& o) {
      return o.phase == "forward" && o.scope == "blocks.1.attn" && o.name == "flashmask_attention";
    });
    saveScreenshot(view, "graph_expanded_module", attn->seq);

    // Double-clicking a module's node expands it.
    {
      QAbstractGraphicsShapeItem* module = view.moduleItem("backward", "blocks.2.mlp");
      QVERIFY(module);
      QGraphicsView* gv = view.graphicsView();
      gv->resetTransform();
      gv->centerOn(module);
      done.clear();
      QTest::mouseDClick(gv->viewport(), Qt::LeftButton, {}, gv->mapFromScene(module->scenePos()));
      QVERIFY(done.wait(60000));
      QVERIFY(!view.moduleItem("backward", "blocks.2.mlp"));
      QVERIFY(view.moduleItem("forward", "blocks.2.attn"));
    }

    // Selecting an op hidden in a collapsed module expands it and draws the op.
    auto hidden = std::find_if(step->ops.begin(), step->ops.end(), [](const OpRecord& o) {
      return o.phase == "forward" && o.scope == "blocks.3.mlp.w1" && o.name == "matmul";
    });
    QVERIFY(hidden != step->ops.end());
    QVERIFY(!view.opItem(hidden->seq));
    sel.select(Side::A, hidden->seq);
    QVERIFY(waitLaidOut(view));
    QVERIFY(view.opItem(hidden->seq));

    // Collapsing a module gives back its node.
    view.collapse("blocks.3");
    QVERIFY(waitLaidOut(view));
    QVERIFY(view.moduleItem("backward", "blocks.3"));

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
    StepPtr step = loadStep(path_, 1);
    QSignalSpy done(&view, &GraphView::layoutFinished);
    view.setStep(step);
    view.setDiff(diff);
    view.setColorMode(GraphView::ColorMode::Divergence);
    QVERIFY(done.wait(60000));
    view.expandAll();
    QVERIFY(waitLaidOut(view));
    int diverged = 0, equal = 0;
    for (const auto& p : diff->pairs) {
      if (!p.inA || p.step != 1 || p.phase == "optimizer") continue;
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
             GraphView::phaseColor("forward"));
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
