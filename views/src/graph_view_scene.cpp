// The graph view's scene builder: turns a finished layout (analysis::GraphLayout over a GraphDot)
// into scene items, tooltips and forward/backward links, then colours the nodes and module blocks
// (phase, op time, bytes, divergence, non-finite; failed ops over any) and marks the selection and
// search hits. Runs on the GUI thread only.
#include <QElapsedTimer>
#include <QGraphicsScene>
#include <QLabel>
#include <cmath>
#include <unordered_map>

#include "graph_view_items.h"
#include "keel/analysis/module_summary.h"
#include "keel/base/text.h"
#include "keel/storage/export.h"

namespace keel::views {

using namespace graph_detail;
using analysis::GraphCluster;
using analysis::GraphDot;
using analysis::GraphLayout;
using analysis::GraphNode;
using analysis::GraphNodeKind;
using analysis::GraphPhase;

// Note [Cross-phase relations]
// With both phases shown, two relations join the forward graph to the backward one: each backward
// op's forward op (GraphDot::links, what J jumps along) and the saved activations (a forward
// output a backward op reads: GraphDot::crossEdges). There are about as many of each as backward
// ops, and dot does not lay them out (Note [Graph shape]). Drawn as straight lines for every node,
// they crossed the gap between the phases in a sheaf of diagonals over both graphs and their
// cluster borders, as the backward graph, taller, drifts below the forward one; and stroking them
// all took most of a 100 % frame of a 20,000-op step (60 ms with them, 5 ms without:
// BM_GraphRepaint20kExpanded). So they are drawn for one node at a time: the selected node's
// (strong) and the hovered node's (lighter), over the edges and under the nodes, as curves that
// leave each node's facing side level, links dashed, data edges solid with the arrow at the
// backward op. Every one stays discoverable: hovering any node draws its relations, an op's
// tooltip counts its saved activations, J follows a link.

// Empties the scene and forgets its items (the graph and its layout stay).
void GraphView::clearScene() {
  scene_->clear();
  nodeItems_.clear();
  edgeItems_.clear();
  clusterItems_.clear();
  opItems_.clear();
  selectedRelations_ = hoverRelations_ = nullptr;
}

void GraphView::applyLayout(std::shared_ptr<LayoutResult> result) {
  QElapsedTimer timer;
  timer.start();
  clearScene();
  graph_ = result->graph;
  const GraphDot& g = *graph_;
  const GraphLayout& l = result->layout;
  if (!l.error.empty()) {
    scene_->setSceneRect(QRectF(0, 0, 400, 100));
    scene_->addText(qs(l.error))->setDefaultTextColor(Qt::darkRed);
    graph_.reset();
    times_ = {result->dotSeconds, l.seconds, 0};
    minimap_->refresh();
    updateStatus();
    emit layoutFinished();
    return;
  }
  if (g.nodes.empty()) {  // say so, instead of an empty white pane
    const bool noOps = !step_ || step_->ops.empty();
    auto* text = scene_->addText(
        noOps ? tr("No ops recorded in step %1: nothing to draw.").arg(step_ ? step_->step : 0) +
                    "\n" +
                    (emptyStepNote_.isEmpty()
                         ? tr("A recording of allocator events only (an imported PyTorch memory "
                              "snapshot) is shown in the Memory view.")
                         : emptyStepNote_)
              : tr("No ops of the chosen phases in step %1: choose other phases above.")
                    .arg(step_->step));
    text->setDefaultTextColor(QColor(0x5f, 0x63, 0x68));
    text->setTextWidth(420);
    scene_->setSceneRect(text->boundingRect().adjusted(-24, -24, 24, 24));
    times_ = {result->dotSeconds, l.seconds, 0};
    minimap_->refresh();
    updateStatus();
    emit layoutFinished();
    return;
  }
  scene_->setSceneRect(qt(l.bounds).adjusted(-24, -24, 24, 24));

  std::unordered_map<std::string_view, const GraphCluster*> clusterOf;
  for (const auto& c : g.clusters) clusterOf.emplace(c.id, &c);
  for (const auto& lc : l.clusters) {
    auto it = clusterOf.find(lc.id);
    if (it == clusterOf.end()) continue;
    auto* item = new ClusterItem(*it->second, qt(lc.box), this);
    scene_->addItem(item);
    clusterItems_.push_back(item);
  }

  nodeItems_.assign(g.nodes.size(), nullptr);
  std::vector<int> savedFor(g.nodes.size(), 0);  // cross-phase data edges at each node
  for (const auto& e : g.crossEdges) {
    ++savedFor[size_t(e.from)];
    ++savedFor[size_t(e.to)];
  }
  std::vector<QPointF> centers(g.nodes.size());
  for (const auto& ln : l.nodes) {
    auto it = g.nodeOfId.find(ln.id);
    if (it == g.nodeOfId.end()) continue;
    const GraphNode& n = g.nodes[size_t(it->second)];
    auto* item = new NodeItem(n, it->second, this);
    item->setPos(qt(ln.center));
    centers[size_t(it->second)] = qt(ln.center);
    if (n.kind == GraphNodeKind::Op) {
      opItems_.emplace(n.seq, item);
      if (const auto* op = opBySeq(n.seq)) {
        QString tip =
            QString("#%1 %2 (%3)").arg(op->seq).arg(qs(op->name), qs(phaseName(op->phase)));
        if (!op->scope.empty()) tip += "\n" + tr("scope: ") + qs(op->scope);
        tip += "\n" + tr("in: ") + qs(storage::tensorList(*op, storage::Role::Input));
        int64_t bytes = 0;
        for (const auto& t : op->tensors)
          if (t.role == storage::Role::Output) bytes += t.bytes;
        tip += "\n" + tr("out: ") + qs(storage::tensorList(*op, storage::Role::Output)) + " (" +
               qs(keel::formatBytes(uint64_t(bytes))) + ")";
        tip += "\n" + tr("time: ") + qs(analysis::durationText(op->endNs - op->beginNs));
        if (const int saved = savedFor[size_t(it->second)]; saved > 0)
          tip += "\n" + (n.phase == Phase::Forward
                             ? tr("output saved for %n backward op(s)", "", saved)
                             : tr("reads %n saved forward output(s)", "", saved));
        item->setToolTip(tip);
      }
    }
    scene_->addItem(item);
    nodeItems_[size_t(it->second)] = item;
  }

  // Edges: match Graphviz's edges (written reversed for backward ops) to GraphDot's.
  std::unordered_map<uint64_t, int> edgeOf;
  for (size_t i = 0; i < g.edges.size(); ++i)
    edgeOf.emplace(uint64_t(uint32_t(g.edges[i].from)) << 32 | uint32_t(g.edges[i].to), int(i));
  edgeItems_.assign(g.edges.size(), nullptr);
  for (const auto& le : l.edges) {
    auto t = g.nodeOfId.find(le.tail), h = g.nodeOfId.find(le.head);
    if (t == g.nodeOfId.end() || h == g.nodeOfId.end()) continue;
    auto e = edgeOf.find(uint64_t(uint32_t(t->second)) << 32 | uint32_t(h->second));
    if (e == edgeOf.end())
      e = edgeOf.find(uint64_t(uint32_t(h->second)) << 32 | uint32_t(t->second));
    if (e == edgeOf.end()) continue;
    const GraphNode& from = g.nodes[size_t(t->second)];
    const GraphNode& to = g.nodes[size_t(h->second)];
    const int level = from.phase == to.phase ? commonLevel(from.scope, to.scope) : 0;
    auto* item = new EdgeItem(le, g.edges[size_t(e->second)].tensors > 1 ? 1.8 : 1.1, level, this);
    scene_->addItem(item);
    edgeItems_[size_t(e->second)] = item;
  }

  // Cross-phase relations: drawn for the selected and the hovered node only.
  if (!g.links.empty() || !g.crossEdges.empty()) {
    selectedRelations_ = new RelationsItem(true);
    hoverRelations_ = new RelationsItem(false);
    scene_->addItem(selectedRelations_);
    scene_->addItem(hoverRelations_);
  }

  computeBlockScales();
  computeSummaries();  // colours blocks and module nodes' tooltips too
  applyHighlights();
  times_ = {result->dotSeconds, l.seconds, 0};

  // Where to look: the whole graph on first show, then the op just selected (revealing it may
  // take one more layout), else the module just expanded or collapsed.
  if (centerOnSelected_ && selected_ && reveal(*selected_)) {
    updateStatus();
    requestLayout();
    emit layoutFinished();
    return;
  }
  if (fitPending_ && isVisible()) {
    initialView();
    fitPending_ = false;
  }
  if (centerOnSelected_ && selected_ && opItems_.count(*selected_)) {
    canvas_->centerOn(opItems_.at(*selected_));
    centerOnSelected_ = false;
  } else if (!focusScope_.empty()) {
    centerOnScope(focusScope_);
  }
  focusScope_.clear();
  updateSemanticLevel();
  minimap_->refresh();
  times_.scene = double(timer.nsecsElapsed()) / 1e9;
  updateStatus();
  emit layoutFinished();
}

// Note [Semantic zoom]
// Below kLabelScale op labels cannot be read, so the view draws modules instead: a module drawn
// as a block is a solid box filled by the colour mode, with its scope and summary (Note [Module
// summary]) at screen size, and what lies inside it (sub-modules, ops, the edges between them) is
// not drawn, nor are edges between two blocks (the selected op's edges and relations still are;
// a node inside a block is not hovered). Which modules are blocks is decided top down on every
// change of scale: a module opens into its sub-modules when at least half of them have room for
// their text (two lines, 70 px wide: a module's `need` scale, computed once per layout) and it
// holds few ops of its own (at most two per sub-module, so that opening it does not leave a swarm
// of unlabelled boxes), else it is the block. So far out the top-level modules are blocks, and
// zooming in splits blocks into sub-modules until op labels return at kLabelScale. Ops outside
// every block (a block's own residual add, ops outside any module) stay small boxes.
// semanticLevel() is the depth of the deepest block. blockScales_[d - 1] is the scale from which
// the bigger quarter of depth d's modules read; Fit fits the graph, or, when that leaves no op
// label readable, takes the scale where the first depth with several modules (four) reads, fitted
// to the width when that still reads; a tall narrow graph takes its width, up to just short of
// kLabelScale.
void GraphView::computeBlockScales() {
  blockScales_.clear();
  std::vector<std::vector<double>> need;  // by depth - 1
  const double lh = metrics_.lineHeight;
  // The module tree of the drawn clusters; what each node and edge is drawn inside.
  std::unordered_map<std::string, ClusterItem*> byKey;
  for (ClusterItem* c : clusterItems_)
    if (!c->cluster().scope.empty())
      byKey.emplace(analysis::moduleKey(c->cluster().phase, c->cluster().scope), c);
  auto find = [&](Phase phase, std::string_view scope) -> ClusterItem* {
    if (scope.empty()) return nullptr;
    auto it = byKey.find(analysis::moduleKey(phase, scope));
    return it == byKey.end() ? nullptr : it->second;
  };
  auto parentOf = [](std::string_view scope) {
    const size_t dot = scope.rfind('.');
    return dot == std::string_view::npos ? std::string_view() : scope.substr(0, dot);
  };
  for (ClusterItem* c : clusterItems_) {
    c->children.clear();
    c->direct = 0;
    c->setZoom(ClusterItem::Zoom::Open);
  }
  for (ClusterItem* c : clusterItems_) {
    if (c->level() <= 0) continue;
    c->parent = find(c->cluster().phase, parentOf(c->cluster().scope));
    if (c->parent) c->parent->children.push_back(c);
    const QRectF b = c->box();
    c->need =
        b.width() > 0 && b.height() > 0 ? std::max((2 * lh + 8) / b.height(), 70 / b.width()) : 1e9;
    if (need.size() < size_t(c->level())) need.resize(size_t(c->level()));
    need[size_t(c->level() - 1)].push_back(c->need);
  }
  const GraphDot& g = *graph_;
  for (NodeItem* n : nodeItems_) {
    if (!n) continue;
    const GraphNode& gn = g.nodes[size_t(n->index())];
    ClusterItem* c = find(gn.phase, n->isModule() ? parentOf(gn.scope) : gn.scope);
    n->setContainer(c);
    if (c) ++c->direct;
  }
  for (size_t i = 0; i < edgeItems_.size(); ++i) {
    if (!edgeItems_[i]) continue;
    const GraphNode& a = g.nodes[size_t(g.edges[i].from)];
    const GraphNode& b = g.nodes[size_t(g.edges[i].to)];
    const int level = a.phase == b.phase ? commonLevel(a.scope, b.scope) : 0;
    edgeItems_[i]->setContainer(
        level > 0 ? find(a.phase, analysis::scopePrefixes(a.scope)[size_t(level - 1)]) : nullptr,
        nodeItems_[size_t(g.edges[i].from)], nodeItems_[size_t(g.edges[i].to)]);
  }
  for (auto& v : need) {  // the bigger quarter of a depth's modules read from there
    if (v.empty()) break;
    std::nth_element(v.begin(), v.begin() + long(v.size() / 4), v.end());
    blockScales_.push_back(v[v.size() / 4]);
  }
}

void GraphView::updateSemanticLevel() {
  const double s = zoomScale();
  const bool overview = s < kLabelScale && !blockScales_.empty();
  bool changed = false;
  int level = 0;
  bool readable = false;
  // Top down: a module opens into its sub-modules when half of them read; else it is the block,
  // and everything inside it is hidden.
  auto assign = [&](auto&& self, ClusterItem* c, bool hidden) -> void {
    using Z = ClusterItem::Zoom;
    Z z = Z::Open;
    if (hidden) {
      z = Z::Hidden;
    } else if (overview) {
      size_t reads = 0;  // half of them (a one-op norm need not), and few ops of its own
      for (const ClusterItem* k : c->children) reads += s >= k->need ? 1 : 0;
      const size_t n = c->children.size();
      z = n > 0 && 2 * reads >= n && size_t(c->direct) <= 2 * n ? Z::Open : Z::Block;
    }
    changed |= c->setZoom(z);
    if (z == Z::Block) {
      level = std::max(level, c->level());
      readable |= s >= c->need;
    }
    for (ClusterItem* k : c->children) self(self, k, z != Z::Open);
  };
  for (ClusterItem* c : clusterItems_)
    if (c->level() > 0 && !c->parent) assign(assign, c, false);
  blocksReadable_ = readable;
  changed |= level != blockLevel_;
  blockLevel_ = level;
  if (changed && hoverRelations_ && hoverRelations_->node() >= 0)  // now inside a block?
    if (const NodeItem* n = nodeItems_[size_t(hoverRelations_->node())]; n && n->insideBlock())
      hoverRelations_->show(*graph_, nodeItems_, -1);
  if (changed) scene_->update();
}

bool GraphView::missingAreEqual() const {
  // A report that kept mismatches only left out the pairs equal or within tolerance (drawn as
  // equal), unless nothing was compared.
  return diff_ && diff_->options.mismatchesOnly &&
         storage::diffVerdict(*diff_) != storage::DiffVerdict::ValuesNotCompared;
}

void GraphView::computeSummaries() {
  summaries_.clear();
  if (graph_ && step_) {
    analysis::OpVerdicts v;
    v.status = status_;
    v.first = firstDivergence_;
    v.missingAreEqual = missingAreEqual();
    summaries_ = analysis::summarizeModules(step_->ops, *graph_, diff_ ? &v : nullptr);
    for (NodeItem* item : nodeItems_) {
      if (!item || !item->isModule()) continue;
      const GraphNode& n = graph_->nodes[size_t(item->index())];
      QStringList lines = moduleSummaryText(qs(phaseName(n.phase)), qs(n.scope));
      lines[0] = tr("module %1 (%2)").arg(qs(n.scope), qs(phaseName(n.phase)));
      lines << tr("Double-click to expand");
      item->setToolTip(lines.join('\n'));
    }
  }
  applyColors();
}

QStringList GraphView::moduleSummaryText(const QString& phase, const QString& scope) const {
  const auto p = parsePhase(phase.toStdString());
  if (!p) return {};
  auto it = summaries_.find(analysis::moduleKey(*p, scope.toStdString()));
  if (it == summaries_.end()) return {};
  QStringList lines{scope};
  for (const auto& l : analysis::summaryLines(it->second)) lines << qs(l);
  return lines;
}

void GraphView::applyColors() {
  if (!graph_) return;
  const GraphDot& g = *graph_;
  // Per-node value for the scales: summed op time or output bytes.
  std::vector<double> value(g.nodes.size(), 0);
  double lo = 0, hi = 0;
  if (colorMode_ == ColorMode::OpTime || colorMode_ == ColorMode::Bytes) {
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      double v = 0;
      for (uint64_t seq : g.nodes[i].seqs)
        if (const auto* op = opBySeq(seq)) {
          if (colorMode_ == ColorMode::OpTime) {
            v += double(std::max<int64_t>(0, op->endNs - op->beginNs));
          } else {
            for (const auto& t : op->tensors)
              if (t.role == storage::Role::Output) v += double(t.bytes);
          }
        }
      value[i] = v;
      if (v > 0) {
        lo = lo == 0 ? v : std::min(lo, v);
        hi = std::max(hi, v);
      }
    }
  }
  const QColor light =
      colorMode_ == ColorMode::Bytes ? QColor(0xf5, 0xf0, 0xfb) : QColor(0xee, 0xf4, 0xfb);
  const QColor dark =
      colorMode_ == ColorMode::Bytes ? QColor(0x4b, 0x25, 0x80) : QColor(0x17, 0x3f, 0x78);
  for (NodeItem* item : nodeItems_) {
    if (!item) continue;
    const GraphNode& n = g.nodes[size_t(item->index())];
    const bool module = n.kind == GraphNodeKind::Module;
    QColor fill;
    bool strong = false;  // the first divergence: a thick dark border
    switch (colorMode_) {
      case ColorMode::Phase:
        fill = phaseColor(n.phase, module);
        break;
      case ColorMode::OpTime:
      case ColorMode::Bytes: {
        double t = 0;
        if (value[size_t(item->index())] > 0 && hi > lo)
          t = std::log(value[size_t(item->index())] / lo) / std::log(hi / lo);
        fill = mix(light, dark, t);
        break;
      }
      case ColorMode::NonFinite: {
        auto mark = analysis::NonFiniteMark::None;
        for (uint64_t seq : n.seqs)
          if (auto it = nonFinite_.find(seq); it != nonFinite_.end())
            mark = std::max(mark, it->second);
        fill = nonFiniteColor(mark);
        strong = mark == analysis::NonFiniteMark::NonFinite;
        break;
      }
      case ColorMode::Divergence: {
        std::optional<storage::DiffStatus> worst;
        bool first = false;
        for (uint64_t seq : n.seqs) {
          auto it = status_.find(seq);
          std::optional<storage::DiffStatus> s;
          if (it != status_.end())
            s = it->second;
          else if (missingAreEqual())
            s = storage::DiffStatus::Equal;  // the report kept only the others
          if (s && (!worst || analysis::verdictRank(*s) > analysis::verdictRank(*worst))) worst = s;
          first |= firstDivergence_ && *firstDivergence_ == seq;
        }
        if (first) {
          fill = statusColor(storage::DiffStatus::Diverged, true);
          strong = true;
        } else {
          fill = worst ? statusColor(*worst) : QColor(Qt::white);
        }
        break;
      }
    }
    bool failed = false;
    for (uint64_t seq : n.seqs) failed |= failed_.count(seq) != 0;
    if (failed) fill = failedColor();
    item->setBrush(fill);
    item->setPen(failed   ? QPen(QColor(0xff, 0x3b, 0x30), 4)
                 : strong ? QPen(QColor(0x4a, 0x07, 0x05), 3)
                          : QPen(fill.darker(150), 1));
    item->setTextColor(fill.lightnessF() < 0.5 ? Qt::white : QColor(0x1b, 0x1f, 0x24));
    item->update();
  }
  // Module blocks of the semantic zoom: the same colouring over the module's summary.
  double blo = 0, bhi = 0;
  for (const auto& [key, s] : summaries_) {
    const double v = double(colorMode_ == ColorMode::Bytes ? s.bytes : s.timeNs);
    if (v > 0) blo = blo == 0 ? v : std::min(blo, v);
    bhi = std::max(bhi, v);
  }
  for (ClusterItem* c : clusterItems_) {
    if (c->cluster().scope.empty()) continue;
    auto it = summaries_.find(analysis::moduleKey(c->cluster().phase, c->cluster().scope));
    if (it == summaries_.end()) continue;
    const analysis::ModuleSummary& s = it->second;
    QColor fill = phaseColor(c->cluster().phase, true);
    switch (colorMode_) {
      case ColorMode::Phase:
        break;
      case ColorMode::OpTime:
      case ColorMode::Bytes: {
        const double v = double(colorMode_ == ColorMode::Bytes ? s.bytes : s.timeNs);
        fill = mix(light, dark, v > 0 && bhi > blo ? std::log(v / blo) / std::log(bhi / blo) : 0);
        break;
      }
      case ColorMode::Divergence:
        fill = s.firstDivergence ? statusColor(storage::DiffStatus::Diverged, true)
               : s.worst         ? statusColor(*s.worst)
                                 : QColor(Qt::white);
        break;
      case ColorMode::NonFinite:
        fill = nonFiniteColor(s.nonFiniteOps > 0 ? analysis::NonFiniteMark::NonFinite
                                                 : analysis::NonFiniteMark::None);
        break;
    }
    bool failed = false;
    for (uint64_t seq : failed_)
      if (const auto* op = opBySeq(seq);
          op && op->phase == c->cluster().phase && graph_->nodeOfOp.count(seq) &&
          keel::scopeWithin(analysis::drawnScope(*graph_, *op), c->cluster().scope))
        failed = true;
    if (failed) fill = failedColor();
    c->setBlock(fill, moduleSummaryText(qs(phaseName(c->cluster().phase)), qs(c->cluster().scope)));
  }
}

void GraphView::applyHighlights() {
  if (!graph_) {
    matchLabel_->setText(searchText_.isEmpty() ? QString() : matchText());
    return;
  }
  const GraphDot& g = *graph_;
  int selectedNode = -1;
  if (selected_)
    if (auto it = g.nodeOfOp.find(*selected_); it != g.nodeOfOp.end()) selectedNode = it->second;
  for (NodeItem* item : nodeItems_) {
    if (!item) continue;
    const GraphNode& n = g.nodes[size_t(item->index())];
    bool matched = false;
    if (!matchSet_.empty())
      for (uint64_t seq : n.seqs)
        if (matchSet_.count(seq)) {
          matched = true;
          break;
        }
    item->setMarks(item->index() == selectedNode, matched);
  }
  for (size_t i = 0; i < edgeItems_.size(); ++i)
    if (edgeItems_[i])
      edgeItems_[i]->setHighlighted(
          selectedNode >= 0 && (g.edges[i].from == selectedNode || g.edges[i].to == selectedNode));
  if (selectedRelations_ && selectedRelations_->node() != selectedNode)
    selectedRelations_->show(g, nodeItems_, selectedNode);
  if (searchText_.isEmpty())
    matchLabel_->clear();
  else if (matchIndex_ >= 0)
    matchLabel_->setText(QString("%1/%2").arg(matchIndex_ + 1).arg(matches_.size()));
  else
    matchLabel_->setText(matchText());
  matchLabel_->setToolTip(hiddenMatches_ > 0 ? tr("Choose their phase in the phase selector "
                                                  "(Optimizer, Forward, Backward) to see them")
                                             : QString());
}

void GraphView::updateLegend() {
  // A wrapped legend breaks between entries only (the space after each), never inside one.
  auto swatch = [](const QColor& c, QString text) {
    return QString(
               "<span style='background-color:%1; "
               "color:%1'>&nbsp;&nbsp;&nbsp;</span>&nbsp;%2&nbsp; ")
        .arg(c.name(), text.replace(' ', "&nbsp;"));
  };
  QString html;
  switch (colorMode_) {
    case ColorMode::Phase:
      if (phase_ != GraphPhase::Backward && phase_ != GraphPhase::Optimizer)
        html += swatch(phaseColor(Phase::Forward), tr("forward"));
      if (phase_ != GraphPhase::Forward && phase_ != GraphPhase::Optimizer)
        html += swatch(phaseColor(Phase::Backward), tr("backward"));
      if (phase_ == GraphPhase::Optimizer)
        html += swatch(phaseColor(Phase::Optimizer), tr("optimizer"));
      html += swatch(phaseColor(phase_ == GraphPhase::Backward    ? Phase::Backward
                                : phase_ == GraphPhase::Optimizer ? Phase::Optimizer
                                                                  : Phase::Forward,
                                true),
                     tr("module (collapsed)"));
      break;
    case ColorMode::OpTime:
      html = swatch(QColor(0xee, 0xf4, 0xfb), tr("fast")) +
             swatch(QColor(0x17, 0x3f, 0x78), tr("slow (log scale)"));
      break;
    case ColorMode::Bytes:
      html = swatch(QColor(0xf5, 0xf0, 0xfb), tr("few bytes")) +
             swatch(QColor(0x4b, 0x25, 0x80), tr("many (log scale)"));
      break;
    case ColorMode::NonFinite:
      html = swatch(nonFiniteColor(analysis::NonFiniteMark::NonFinite), tr("NaN/Inf output")) +
             swatch(nonFiniteColor(analysis::NonFiniteMark::Fed), tr("fed by one")) +
             swatch(nonFiniteColor(analysis::NonFiniteMark::None), tr("finite (or a mask's -inf)"));
      if (nonFinite_.empty()) html += tr("<i>(none in this step)</i>");
      break;
    case ColorMode::Divergence:
      html = swatch(statusColor(storage::DiffStatus::Equal), tr("equal")) +
             swatch(statusColor(storage::DiffStatus::WithinTolerance), tr("within tol.")) +
             swatch(statusColor(storage::DiffStatus::Diverged), tr("diverged")) +
             swatch(statusColor(storage::DiffStatus::Diverged, true), tr("first")) +
             swatch(statusColor(storage::DiffStatus::Unmatched), tr("unmatched"));
      if (!diff_)
        html += tr("<i>(no comparison)</i>");
      else if (storage::diffVerdict(*diff_) == storage::DiffVerdict::ValuesNotCompared)
        html += tr("<i>(no values recorded: not compared)</i>");
      break;
  }
  if (!failed_.empty()) html += swatch(failedColor(), tr("failed"));
  if (!runLabel_.isEmpty())
    html = QStringLiteral("<b>%1</b>&nbsp;&nbsp;&nbsp;").arg(runLabel_.toHtmlEscaped()) + html;
  legend_->setText(html);
  placeLegend();
}

QString GraphView::legendText() const {
  return legend_->text();
}

void GraphView::setRunLabel(const QString& label) {
  if (label == runLabel_) return;
  runLabel_ = label;
  updateLegend();
}

QColor GraphView::statusColor(storage::DiffStatus status, bool first) {
  if (first) return QColor(0xb3, 0x26, 0x1e);
  switch (status) {
    case storage::DiffStatus::Equal:
      return QColor(0xa8, 0xd8, 0xa2);
    case storage::DiffStatus::WithinTolerance:
      return QColor(0xf6, 0xd8, 0x6b);
    case storage::DiffStatus::Diverged:
      return QColor(0xec, 0x6b, 0x5f);
    case storage::DiffStatus::Unmatched:
      return QColor(0xcf, 0xd2, 0xd6);
  }
  return Qt::white;
}

QColor GraphView::failedColor() {
  return QColor(0x4a, 0x14, 0x5c);
}

QColor GraphView::nonFiniteColor(analysis::NonFiniteMark mark) {
  switch (mark) {
    case analysis::NonFiniteMark::NonFinite:
      return QColor(0xd6, 0x2a, 0x1e);
    case analysis::NonFiniteMark::Fed:
      return QColor(0xf7, 0xb9, 0xa8);
    case analysis::NonFiniteMark::None:
      break;
  }
  return QColor(0xee, 0xf0, 0xf3);
}

QColor GraphView::phaseColor(Phase phase, bool module) {
  if (phase == Phase::Forward) return module ? QColor(0xb9, 0xd3, 0xf0) : QColor(0xd7, 0xe7, 0xf8);
  if (phase == Phase::Backward) return module ? QColor(0xf8, 0xcc, 0xa0) : QColor(0xfd, 0xe4, 0xcb);
  return module ? QColor(0xc3, 0xe2, 0xb4) : QColor(0xdd, 0xf0, 0xd4);
}

}  // namespace keel::views
