// GraphView: see graph_view.h. The controller: toolbar, shortcuts, phase filter, module
// expansion, search, partner jumps, zoom and clicks; it asks for layouts (DOT text and Graphviz,
// analysis/, on the thread pool: see Note [Graph view layout]) and hands each result to the scene
// builder (graph_view_scene.cpp). Items and minimap: graph_view_items.h.
#include "keel/views/graph_view.h"

#include <QComboBox>
#include <QEvent>
#include <QFontMetricsF>
#include <QGraphicsScene>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QMenu>
#include <QScrollBar>
#include <QShortcut>
#include <QToolBar>
#include <QToolButton>
#include <QVBoxLayout>
#include <QtConcurrent/QtConcurrentRun>
#include <algorithm>
#include <chrono>
#include <cmath>

#include "graph_view_items.h"
#include "keel/views/run_source.h"
#include "keel/views/selection.h"

namespace keel::views {

using namespace graph_detail;
using analysis::countGraphOps;
using analysis::GraphDot;
using analysis::GraphDotOptions;
using analysis::GraphNode;
using analysis::GraphNodeKind;
using analysis::GraphPhase;
using analysis::initialExpansion;
using analysis::parseGraphPhase;
using analysis::scopePrefixes;

// Note [Graph view layout]
// Every change to what is drawn (step, phase filter, expansion) bumps generation_ and asks for a
// layout. One layout runs at a time on the thread pool: buildGraphDot then layoutGraph, from value
// copies (the step is an immutable shared snapshot). Its result comes back through a
// QFutureWatcher (on the GUI thread); a result whose generation is stale is dropped and the next
// layout starts at once, so a burst of clicks wastes at most one layout and the GUI thread only
// ever builds the scene. A step with more than kLargeGraphOps ops in the filter opens with its
// modules collapsed (initialExpansion: level by level while at most kOpeningNodes nodes show).
// Revealing one of its ops (a selection made elsewhere, a search hit) lays out the opening state
// plus that op's modules, so the graph stays small; modules the user expands add up.

namespace {

constexpr int kOpeningNodes = 200;

constexpr double kMinScale = 0.001, kMaxScale = 4.0;

// Case-insensitive (ASCII) substring test; `needle` is already lower case.
bool containsLower(const std::string& hay, const std::string& needle) {
  auto it = std::search(hay.begin(), hay.end(), needle.begin(), needle.end(),
                        [](char a, char b) { return std::tolower((unsigned char)a) == b; });
  return it != hay.end();
}

}  // namespace

GraphView::GraphView(Selection* selection, Side side, QWidget* parent)
    : QWidget(parent), selection_(selection), side_(side) {
  registerViewTypes();
  scene_ = new QGraphicsScene(this);
  scene_->setItemIndexMethod(QGraphicsScene::BspTreeIndex);
  canvas_ = new Canvas(scene_, this);
  minimap_ = new Minimap(this, canvas_);
  watcher_ = new QFutureWatcher<std::shared_ptr<LayoutResult>>(this);

  phaseBox_ = new QComboBox(this);
  phaseBox_->addItem(tr("Forward + backward"), "both");
  phaseBox_->addItem(tr("Forward"), "forward");
  phaseBox_->addItem(tr("Backward"), "backward");
  phaseBox_->addItem(tr("Optimizer"), "optimizer");
  phaseBox_->setToolTip(tr("Which phases of the step to show"));
  colorBox_ = new QComboBox(this);
  colorBox_->addItem(tr("Colour: phase"));
  colorBox_->addItem(tr("Colour: op time"));
  colorBox_->addItem(tr("Colour: bytes"));
  colorBox_->addItem(tr("Colour: divergence"));
  colorBox_->addItem(tr("Colour: non-finite"));
  colorBox_->setToolTip(tr("What the node colours show"));
  // The legend is a row under the canvas, wrapped where the view is narrow: in the toolbar it
  // pushed Find and the zoom buttons into the overflow menu at 1366 pixels beside the inspector,
  // and over the canvas's corner it hid nodes and module labels.
  legend_ = new QLabel(this);
  legend_->setTextFormat(Qt::RichText);
  legend_->setWordWrap(true);
  legend_->setObjectName("graphLegend");
  legend_->setContentsMargins(6, 2, 6, 2);
  legend_->setStyleSheet("QLabel#graphLegend { border-top: 1px solid #d0d0d0; }");
  search_ = new QLineEdit(this);
  search_->setPlaceholderText(tr("Find op or scope (Enter: next)"));
  search_->setClearButtonEnabled(true);
  search_->setMinimumWidth(120);
  search_->setMaximumWidth(240);
  matchLabel_ = new QLabel(this);
  matchLabel_->setObjectName("graphMatches");
  statusLabel_ = new QLabel(this);
  statusLabel_->setForegroundRole(QPalette::PlaceholderText);
  statusLabel_->setMinimumWidth(
      statusLabel_->fontMetrics().horizontalAdvance(tr("00000 ops, 0000 modules")));

  // A QToolBar, not a box layout: when the view is narrow (two graphs side by side) the items
  // that do not fit move into its overflow menu instead of forcing the window wider.
  auto* bar = new QToolBar(this);
  bar->setIconSize(QSize(16, 16));
  bar->setToolButtonStyle(Qt::ToolButtonTextOnly);
  bar->setContentsMargins(2, 0, 2, 0);
  auto button = [this, bar](const QString& text, const QString& tip, auto slot) {
    QAction* a = bar->addAction(text);
    a->setToolTip(tip);
    connect(a, &QAction::triggered, this, slot);
    return a;
  };
  bar->addWidget(phaseBox_);
  bar->addWidget(colorBox_);
  auto* spacer = new QWidget(this);
  spacer->setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Preferred);
  bar->addWidget(spacer);
  bar->addWidget(statusLabel_);
  bar->addWidget(search_);
  bar->addWidget(matchLabel_);
  button(QString::fromUtf8("\u2212"), tr("Zoom out (Ctrl+wheel)"), [this] { zoomOut(); });
  button("+", tr("Zoom in (Ctrl+wheel)"), [this] { zoomIn(); });
  button(tr("Fit"), tr("Fit the graph in the view"), [this] { fitToView(); });
  button(tr("Expand all"), tr("Show every op"), [this] { expandAll(); });
  button(tr("Collapse all"), tr("Show top-level modules only"), [this] { collapseAll(); });
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->setSpacing(0);
  layout->addWidget(bar);
  layout->addWidget(canvas_, 1);
  layout->addWidget(legend_);

  connect(phaseBox_, &QComboBox::currentIndexChanged, this,
          [this](int i) { setPhaseFilter(phaseBox_->itemData(i).toString()); });
  connect(colorBox_, &QComboBox::currentIndexChanged, this,
          [this](int i) { setColorMode(ColorMode(i)); });
  connect(search_, &QLineEdit::textChanged, this, &GraphView::setSearchText);
  connect(search_, &QLineEdit::returnPressed, this, &GraphView::findNext);
  connect(watcher_, &QFutureWatcherBase::finished, this, [this] {
    running_ = false;
    std::shared_ptr<LayoutResult> r = watcher_->result();
    if (r->generation != generation_) {
      startLayout();
      return;
    }
    applyLayout(std::move(r));
  });
  connect(selection_, &Selection::selected, this, &GraphView::onSelected);
  connect(selection_, &Selection::cleared, this, [this] {
    selected_.reset();
    applyHighlights();
  });
  auto* jump = new QShortcut(QKeySequence(Qt::Key_J), this, [this] { jumpToPartner(); });
  jump->setContext(Qt::WidgetWithChildrenShortcut);
  auto* find = new QShortcut(QKeySequence::Find, this, [this] {
    search_->setFocus();
    search_->selectAll();
  });
  find->setContext(Qt::WidgetWithChildrenShortcut);
  for (auto key : {Qt::Key_Plus, Qt::Key_Equal})
    (new QShortcut(QKeySequence(key), this, [this] {
      zoomIn();
    }))->setContext(Qt::WidgetWithChildrenShortcut);
  (new QShortcut(QKeySequence(Qt::Key_Minus), this, [this] {
    zoomOut();
  }))->setContext(Qt::WidgetWithChildrenShortcut);

  measureFonts();
  updateLegend();
  updateStatus();
}

GraphView::~GraphView() {
  // A running layout holds only value copies; it finishes on the pool and is dropped.
  watcher_->disconnect(this);
  // The canvas goes first, while this object is whole: it calls back (scrolling) as it detaches.
  minimap_ = nullptr;
  delete canvas_;
  canvas_ = nullptr;
}

QGraphicsView* GraphView::graphicsView() const {
  return canvas_;
}

void GraphView::measureFonts() {
  font_ = font();
  boldFont_ = font_;
  boldFont_.setWeight(QFont::DemiBold);
  QFontMetricsF fm(font_), fb(boldFont_);
  for (int c = 32; c < 127; ++c) {
    metrics_.regular[size_t(c)] = fm.horizontalAdvance(QChar(c));
    metrics_.bold[size_t(c)] = fb.horizontalAdvance(QChar(c));
  }
  metrics_.lineHeight = std::ceil(std::max(fm.height(), fb.height()));
}

const storage::OpRecord* GraphView::opBySeq(uint64_t seq) const {
  if (!step_) return nullptr;
  int64_t i = step_->indexOf(seq);
  return i < 0 ? nullptr : &step_->ops[size_t(i)];
}

void GraphView::setStep(StepPtr step) {
  step_ = std::move(step);
  nonFinite_.clear();
  if (step_) {
    const auto marks = analysis::nonFiniteMarks(step_->ops);
    for (size_t i = 0; i < marks.size(); ++i)
      if (marks[i] != analysis::NonFiniteMark::None)
        nonFinite_.emplace(step_->ops[i].seq, marks[i]);
  }
  if (!colorChosen_ && (recordingNonFinite_ || !nonFinite_.empty()) &&
      colorMode_ != ColorMode::NonFinite) {  // a broken run looks broken at first sight
    colorMode_ = ColorMode::NonFinite;
    QSignalBlocker block(colorBox_);
    colorBox_->setCurrentIndex(int(colorMode_));
  }
  updateLegend();
  fitPending_ = true;
  focusScope_.clear();
  selected_ = selection_->current(side_);
  centerOnSelected_ = selected_ && opBySeq(*selected_);
  resetExpansion();
  setSearchText(searchText_);
  requestLayout();
}

void GraphView::setDiff(DiffPtr diff) {
  diff_ = std::move(diff);
  status_.clear();
  firstDivergence_.reset();
  if (diff_) {
    const bool a = side_ == Side::A;
    for (const auto& p : diff_->pairs) {
      if (!storage::valuesCompared(p)) continue;  // left white: nothing said it was equal
      if (a && p.inA) status_[p.seqA] = p.status;
      if (!a && p.inB) status_[p.seqB] = p.status;
    }
    if (diff_->first) {
      const auto& p = diff_->first->pair;
      if (a ? p.inA : p.inB) firstDivergence_ = a ? p.seqA : p.seqB;
    }
  }
  computeSummaries();  // the blocks' worst verdicts; colours too
  minimap_->refresh();
}

void GraphView::setRecordingNonFinite(bool nonFinite) {
  recordingNonFinite_ = nonFinite;
  if (colorChosen_) return;  // the user's choice stays
  // The automatic choice follows the recording: NaN colouring for one that has NaN/Inf, phases
  // again for the next that has none (it stayed grey, "(none in this step)").
  setAutomaticColorMode(nonFinite ? ColorMode::NonFinite : ColorMode::Phase);
}

void GraphView::setAutomaticColorMode(ColorMode mode) {
  if (colorChosen_ || colorMode_ == mode) return;
  setColorMode(mode);
  colorChosen_ = false;  // still the automatic choice
}

void GraphView::markFailed(uint64_t seq) {
  if (!failed_.insert(seq).second) return;
  applyColors();
  updateLegend();
  minimap_->refresh();
}

void GraphView::clearFailed() {
  if (failed_.empty()) return;
  failed_.clear();
  applyColors();
  updateLegend();
  minimap_->refresh();
}

void GraphView::setColorMode(ColorMode mode) {
  colorChosen_ = true;
  colorMode_ = mode;
  if (colorBox_->currentIndex() != int(mode)) {
    QSignalBlocker block(colorBox_);
    colorBox_->setCurrentIndex(int(mode));
  }
  applyColors();
  updateLegend();
  minimap_->refresh();
}

void GraphView::setPhaseFilter(const QString& phase) {
  const GraphPhase p = parseGraphPhase(phase.toStdString());
  const int index = phaseBox_->findData(QString(toString(p)));
  if (phaseBox_->currentIndex() != index) {
    QSignalBlocker block(phaseBox_);
    phaseBox_->setCurrentIndex(index);
  }
  if (p == phase_) return;
  phase_ = p;
  fitPending_ = true;
  updateLegend();
  resetExpansion();
  setSearchText(searchText_);
  requestLayout();
  emit phaseFilterChanged(QString(toString(p)));
}

QString GraphView::phaseFilter() const {
  return toString(phase_);
}

void GraphView::resetExpansion() {
  expanded_.clear();
  opening_.clear();
  expandAll_ = true;
  large_ = false;
  if (!step_) return;
  large_ = countGraphOps(step_->ops, phase_) > kLargeGraphOps;
  if (!large_) return;
  opening_ = initialExpansion(step_->ops, phase_, kOpeningNodes);
  expanded_ = opening_;
  expandAll_ = false;
  if (selected_)
    if (const auto* op = opBySeq(*selected_))
      for (auto& s : scopePrefixes(op->scope)) expanded_.insert(s);
}

void GraphView::expandAll() {
  if (expandAll_) return;
  expandAll_ = true;
  requestLayout();
}

void GraphView::collapseAll() {
  expandAll_ = false;
  expanded_.clear();
  fitPending_ = true;
  requestLayout();
}

void GraphView::expand(const QString& scope) {
  if (expandAll_ || scope.isEmpty()) return;
  for (auto& s : scopePrefixes(scope.toStdString())) expanded_.insert(s);
  focusScope_ = scope.toStdString();
  requestLayout();
}

void GraphView::collapse(const QString& scope) {
  if (scope.isEmpty() || !step_) return;
  const std::string s = scope.toStdString();
  if (expandAll_) {  // every module was open: list them (drawn scopes are prefixes of recorded
                     // ones)
    expanded_.clear();
    for (const auto& op : step_->ops)
      if (inGraphPhase(op, phase_))
        for (auto& p : scopePrefixes(op.scope)) expanded_.insert(std::move(p));
    expandAll_ = false;
  }
  if (!expanded_.erase(s)) return;
  focusScope_ = s;
  requestLayout();
}

void GraphView::requestLayout() {
  ++generation_;
  if (!step_) {
    clearScene();
    graph_.reset();
    minimap_->refresh();
    updateStatus();
    return;
  }
  if (!running_) startLayout();
}

GraphDotOptions GraphView::dotOptions() const {
  GraphDotOptions o;
  o.phase = phase_;
  o.expandAll = expandAll_;
  o.expanded = expanded_;
  o.metrics = metrics_;
  return o;
}

void GraphView::startLayout() {
  if (!step_) return;
  running_ = true;
  GraphDotOptions o = dotOptions();
  const uint64_t generation = generation_;
  StepPtr step = step_;
  watcher_->setFuture(QtConcurrent::run([step, o = std::move(o), generation] {
    auto r = std::make_shared<LayoutResult>();
    r->generation = generation;
    const auto t0 = std::chrono::steady_clock::now();
    auto graph = std::make_shared<GraphDot>(analysis::buildGraphDot(step->ops, o));
    r->dotSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r->layout = analysis::layoutGraph(graph->dot);
    r->graph = std::move(graph);
    return r;
  }));
  updateStatus();
}

bool GraphView::reveal(uint64_t seq) {
  if (!graph_ || expandAll_ || opItems_.count(seq)) return false;
  const storage::OpRecord* op = opBySeq(seq);
  if (!op || !graph_->nodeOfOp.count(seq)) return false;
  auto prefixes = scopePrefixes(drawnScope(*graph_, *op));
  if (large_) expanded_ = opening_;
  bool changed = large_;
  for (auto& s : prefixes) changed |= expanded_.insert(std::move(s)).second;
  if (changed) centerOnSelected_ = true;
  return changed;
}

void GraphView::onSelected(Side side, quint64 seq) {
  if (side != side_) return;
  selected_ = seq;
  const storage::OpRecord* op = opBySeq(seq);
  if (!op) {
    applyHighlights();
    return;
  }
  centerOnSelected_ = true;
  if (!inGraphPhase(*op, phase_)) {  // widen the filter so that the op shows
    setPhaseFilter(op->phase == Phase::Optimizer ? "optimizer" : "both");
    return;
  }
  if (running_) return;  // applied when the layout lands
  if (reveal(seq)) {
    requestLayout();
    return;
  }
  applyHighlights();
  if (auto it = opItems_.find(seq); it != opItems_.end()) {
    canvas_->centerOn(it->second);
    centerOnSelected_ = false;
  }
}

void GraphView::centerOnScope(const std::string& scope) {
  for (const ClusterItem* c : clusterItems_) {
    if (c->cluster().scope != scope) continue;
    const QRectF box = c->boundingRect();
    const QRectF seen = canvas_->mapToScene(canvas_->viewport()->rect()).boundingRect();
    if (box.height() <= seen.height())
      canvas_->centerOn(box.center());
    else
      canvas_->centerOn(box.center().x(), box.top() + seen.height() / 2 - 10);
    return;
  }
  for (const NodeItem* n : nodeItems_)
    if (n && n->isModule() && graph_->nodes[size_t(n->index())].scope == scope) {
      canvas_->centerOn(n);
      return;
    }
}

void GraphView::setSearchText(const QString& text) {
  searchText_ = text;
  if (search_->text() != text) {
    QSignalBlocker block(search_);
    search_->setText(text);
  }
  matches_.clear();
  matchSet_.clear();
  matchIndex_ = -1;
  hiddenMatches_ = 0;
  const std::string needle = text.trimmed().toLower().toStdString();
  if (step_ && !needle.empty())
    for (const auto& op : step_->ops)
      if (containsLower(op.name, needle) || containsLower(op.scope, needle)) {
        if (!inGraphPhase(op, phase_)) {
          ++hiddenMatches_;
          continue;
        }
        matches_.push_back(op.seq);
        matchSet_.insert(op.seq);
      }
  applyHighlights();
}

QString GraphView::matchText() const {
  // Ops found in a phase the selector hides are counted apart: "0 match(es)" for adamw read as
  // "no such op" while the optimizer phase held 40.
  const QString shown = tr("%n match(es)", "", int(matches_.size()));
  if (hiddenMatches_ == 0) return shown;
  return tr("%1, %2 in hidden phases").arg(shown).arg(hiddenMatches_);
}

void GraphView::findNext() {
  if (matches_.empty()) return;
  matchIndex_ = (matchIndex_ + 1) % int(matches_.size());
  selection_->select(side_, matches_[size_t(matchIndex_)], true);
  applyHighlights();
}

std::optional<uint64_t> GraphView::partnerOf(uint64_t seq) const {
  const storage::OpRecord* op = opBySeq(seq);
  if (!op) return std::nullopt;
  if (op->phase == Phase::Backward) {
    if (op->forwardSeq != 0 && opBySeq(op->forwardSeq)) return op->forwardSeq;
    return std::nullopt;
  }
  if (op->phase != Phase::Forward) return std::nullopt;
  std::optional<uint64_t> first;
  const std::string named = op->name + "_backward";
  for (const auto& o : step_->ops)
    if (o.forwardSeq == seq && o.phase == Phase::Backward) {
      if (o.name == named) return o.seq;
      if (!first) first = o.seq;
    }
  return first;
}

bool GraphView::jumpToPartner() {
  std::optional<uint64_t> seq = selection_->current(side_);
  if (!seq) seq = selected_;
  if (!seq) return false;
  auto partner = partnerOf(*seq);
  if (!partner) return false;
  selection_->select(side_, *partner);
  return true;
}

void GraphView::zoomBy(double factor) {
  const double s = canvas_->transform().m11();
  factor = std::clamp(s * factor, kMinScale, kMaxScale) / s;
  canvas_->scale(factor, factor);
  updateMinimap();
}

void GraphView::zoomIn() {
  zoomBy(1.25);
}
void GraphView::zoomOut() {
  zoomBy(0.8);
}

double GraphView::zoomScale() const {
  return canvas_->transform().m11();
}

void GraphView::setZoomScale(double scale) {
  const QPointF centre = canvas_->mapToScene(canvas_->viewport()->rect().center());
  canvas_->resetTransform();
  canvas_->scale(scale, scale);
  canvas_->centerOn(centre);
  updateMinimap();
}

bool GraphView::opLabelsShown() const {
  return zoomScale() >= kLabelScale;
}

bool GraphView::labelsReadable() const {
  return opLabelsShown() || blocksReadable_;
}

void GraphView::fitToView() {
  if (scene_->items().isEmpty()) return;
  const QRectF r = scene_->sceneRect();
  canvas_->fitInView(r, Qt::KeepAspectRatio);
  const double fit = zoomScale();
  if (fit > 1) {  // never magnify a small graph beyond 100%
    canvas_->resetTransform();
    canvas_->centerOn(r.center());
  } else if (fit < kLabelScale && !blockScales_.empty()) {
    // Note [Semantic zoom]: the first depth with several modules (per phase) should read.
    std::vector<int> count(blockScales_.size(), 0);
    for (const ClusterItem* c : clusterItems_)
      if (c->level() > 0 && size_t(c->level()) <= count.size()) ++count[size_t(c->level() - 1)];
    size_t d = 0;
    while (d + 1 < count.size() && count[d] < 4) ++d;
    const QRect vp = canvas_->viewport()->rect();
    const double width = (vp.width() - 4) / r.width();
    const double readable = *std::min_element(blockScales_.begin(), blockScales_.end());
    double want = std::min(blockScales_[d], kLabelScale);
    if (want > width && readable <= width) want = width;  // the whole width, still readable
    // A tall narrow graph: use the width, short of op labels (blocks open as they have room).
    want = std::max({want, readable, std::min(width, 0.95 * kLabelScale)});
    if (want > fit) {
      canvas_->resetTransform();
      canvas_->scale(want, want);
      showTopOf(r);
    }
  }
  updateMinimap();
}

// Note [Initial graph view]: fitting a tall graph (a transformer step is far taller than wide)
// shrinks its labels below reading size. The first view of a step is the fit when that keeps
// labels readable (scale >= kMinReadableScale), else readable size at the top of the graph — where
// the forward pass starts; at its left edge when the graph is wider than the view (forward is the
// left cluster: centring cut it in half) — with the minimap showing where that is. Fit stays one
// click away.
void GraphView::initialView() {
  if (scene_->items().isEmpty()) return;
  fitToView();
  constexpr double kMinReadableScale = 0.6;
  if (canvas_->transform().m11() >= kMinReadableScale) return;
  canvas_->resetTransform();
  canvas_->scale(0.85, 0.85);
  showTopOf(scene_->sceneRect());
  updateMinimap();
}

void GraphView::showTopOf(const QRectF& r) {
  const QRectF seen = canvas_->mapToScene(canvas_->viewport()->rect()).boundingRect();
  const bool wider = r.width() > seen.width();
  canvas_->centerOn(
      QPointF(wider ? r.left() + seen.width() / 2 : r.center().x(), r.top() + seen.height() / 2));
  // centerOn stops short of an edge by a margin; the scroll bars go all the way.
  canvas_->verticalScrollBar()->setValue(canvas_->verticalScrollBar()->minimum());
  if (wider) canvas_->horizontalScrollBar()->setValue(canvas_->horizontalScrollBar()->minimum());
}

void GraphView::updateMinimap() {
  if (!minimap_) return;  // being destroyed
  minimap_->place();
  placeLegend();
  updateSemanticLevel();
}

void GraphView::placeLegend() {
  if (legend_) legend_->setVisible(!legend_->text().isEmpty());
}

void GraphView::updateStatus() {
  if (running_) {
    statusLabel_->setText(tr("laying out\u2026"));
    return;
  }
  if (!graph_) {
    statusLabel_->setText(step_ ? QString() : tr("no step"));
    return;
  }
  QString s = graph_->opNodes == 1 ? tr("1 op") : tr("%1 ops").arg(graph_->opNodes);
  if (graph_->moduleNodes)
    s += graph_->moduleNodes == 1 ? tr(", 1 module") : tr(", %1 modules").arg(graph_->moduleNodes);
  statusLabel_->setText(s);
  statusLabel_->setToolTip(tr("DOT %1 s, Graphviz %2 s, scene %3 s")
                               .arg(times_.dot, 0, 'f', 3)
                               .arg(times_.graphviz, 0, 'f', 3)
                               .arg(times_.scene, 0, 'f', 3));
}

GraphView::NodeItem* GraphView::nodeAt(const QPoint& viewPos) const {
  for (QGraphicsItem* item : canvas_->items(viewPos))
    if (item->type() == NodeItem::Type) return static_cast<NodeItem*>(item);
  return nullptr;
}

GraphView::ClusterItem* GraphView::clusterAt(const QPoint& viewPos) const {
  for (QGraphicsItem* item : canvas_->items(viewPos))  // topmost (innermost) first
    if (item->type() == ClusterItem::Type) return static_cast<ClusterItem*>(item);
  return nullptr;
}

void GraphView::clicked(const QPoint& viewPos) {
  NodeItem* item = nodeAt(viewPos);
  if (!item || !graph_) return;
  const GraphNode& n = graph_->nodes[size_t(item->index())];
  if (n.kind == GraphNodeKind::Op) selection_->select(side_, n.seq);
}

void GraphView::hovered(const QPoint& viewPos) {
  if (!minimap_ || !hoverRelations_ || !graph_) return;  // no minimap: being destroyed
  int node = -1;
  if (canvas_->viewport()->rect().contains(viewPos))
    if (NodeItem* item = nodeAt(viewPos); item && !item->insideBlock()) node = item->index();
  if (selectedRelations_ && node == selectedRelations_->node()) node = -1;  // drawn, strong
  if (node != hoverRelations_->node()) hoverRelations_->show(*graph_, nodeItems_, node);
}

GraphView::CrossPhaseLines GraphView::crossPhaseLinesDrawn() const {
  CrossPhaseLines r;
  for (const RelationsItem* item : {selectedRelations_, hoverRelations_})
    if (item) {
      r.links += item->links();
      r.dataEdges += item->dataEdges();
    }
  return r;
}

void GraphView::doubleClicked(const QPoint& viewPos) {
  if (!graph_) return;
  if (NodeItem* item = nodeAt(viewPos)) {
    const GraphNode& n = graph_->nodes[size_t(item->index())];
    if (n.kind == GraphNodeKind::Module) expand(qs(n.scope));
    return;
  }
  if (ClusterItem* c = clusterAt(viewPos))
    if (!c->cluster().scope.empty()) collapse(qs(c->cluster().scope));
}

void GraphView::contextMenu(const QPoint& viewPos, const QPoint& globalPos) {
  QMenu menu(this);
  if (graph_) {
    if (NodeItem* item = nodeAt(viewPos)) {
      const GraphNode& n = graph_->nodes[size_t(item->index())];
      if (n.kind == GraphNodeKind::Op) {
        selection_->select(side_, n.seq);
        const auto partner = partnerOf(n.seq);
        if (n.phase == Phase::Forward)
          menu.addAction(tr("Go to backward op\tJ"), this, [this] { jumpToPartner(); })
              ->setEnabled(partner.has_value());
        else if (n.phase == Phase::Backward)
          menu.addAction(tr("Go to forward op\tJ"), this, [this] { jumpToPartner(); })
              ->setEnabled(partner.has_value());
        if (!n.scope.empty()) {
          const QString scope = qs(n.scope);
          menu.addAction(tr("Collapse %1").arg(scope), this, [this, scope] { collapse(scope); });
        }
        const quint64 seq = n.seq;
        menu.addAction(tr("Break here"), this, [this, seq] { emit breakHereRequested(seq); })
            ->setToolTip(
                tr("A breakpoint after this op (its name in its scope) in a live session"));
      } else {
        const QString scope = qs(n.scope);
        menu.addAction(tr("Expand %1").arg(scope), this, [this, scope] { expand(scope); });
      }
    } else if (ClusterItem* c = clusterAt(viewPos); c && !c->cluster().scope.empty()) {
      const QString scope = qs(c->cluster().scope);
      menu.addAction(tr("Collapse %1").arg(scope), this, [this, scope] { collapse(scope); });
    }
    if (!menu.isEmpty()) menu.addSeparator();
  }
  menu.addAction(tr("Expand all"), this, [this] { expandAll(); });
  menu.addAction(tr("Collapse all"), this, [this] { collapseAll(); });
  menu.addAction(tr("Fit"), this, [this] { fitToView(); });
  menu.exec(globalPos);
}

QAbstractGraphicsShapeItem* GraphView::opItem(uint64_t seq) const {
  auto it = opItems_.find(seq);
  return it == opItems_.end() ? nullptr : it->second;
}

QAbstractGraphicsShapeItem* GraphView::moduleItem(Phase phase, const QString& scope) const {
  if (!graph_) return nullptr;
  auto it = graph_->nodeOfId.find(analysis::moduleNodeId(phase, scope.toStdString()));
  return it == graph_->nodeOfId.end() ? nullptr : nodeItems_[size_t(it->second)];
}

void GraphView::showEvent(QShowEvent* event) {
  QWidget::showEvent(event);
  if (fitPending_ && graph_ && !running_) {
    fitToView();
    fitPending_ = false;
  }
}

void GraphView::changeEvent(QEvent* event) {
  QWidget::changeEvent(event);
  if (event->type() == QEvent::FontChange) {  // node sizes come from the font: lay out again
    measureFonts();
    if (step_) requestLayout();
  }
}

void GraphView::resizeEvent(QResizeEvent* event) {
  QWidget::resizeEvent(event);
  updateMinimap();
}

}  // namespace keel::views
