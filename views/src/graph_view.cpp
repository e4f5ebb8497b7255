// GraphView: see graph_view.h. DOT text and Graphviz layout (analysis/: graph_dot.h,
// graph_layout.h) run on the thread pool; this file builds the scene from their result and handles
// every interaction.
// Items are a few custom QGraphicsItems that skip text when zoomed far out, so 5,000 ops paint
// fast.
#include "keel/views/graph_view.h"

#include <QAbstractGraphicsShapeItem>
#include <QComboBox>
#include <QContextMenuEvent>
#include <QElapsedTimer>
#include <QFontMetricsF>
#include <QGraphicsPathItem>
#include <QGraphicsScene>
#include <QGraphicsView>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QMenu>
#include <QMouseEvent>
#include <QPainter>
#include <QPainterPath>
#include <QScrollBar>
#include <QShortcut>
#include <QStyleOptionGraphicsItem>
#include <QToolBar>
#include <QToolButton>
#include <QVBoxLayout>
#include <QtConcurrent/QtConcurrentRun>
#include <algorithm>
#include <chrono>
#include <cmath>

#include "keel/analysis/graph_layout.h"
#include "keel/storage/export.h"
#include "keel/views/run_source.h"
#include "keel/views/selection.h"

namespace keel::views {

using analysis::countGraphOps;
using analysis::GraphCluster;
using analysis::GraphDot;
using analysis::GraphDotOptions;
using analysis::GraphLayout;
using analysis::GraphNode;
using analysis::GraphNodeKind;
using analysis::GraphPhase;
using analysis::initialExpansion;
using analysis::LaidOutEdge;
using analysis::parseGraphPhase;
using analysis::scopePrefixes;
using analysis::TextMetrics;

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

QPointF qt(analysis::LayoutPoint p) {
  return {p.x, p.y};
}

QRectF qt(const analysis::LayoutRect& r) {
  return {r.x, r.y, r.width, r.height};
}
constexpr double kMinScale = 0.001, kMaxScale = 4.0;
const QColor kSelectedPen(0x1a, 0x56, 0xdb);
const QColor kMatchPen(0xe3, 0x74, 0x00);
const QColor kEdgeColor(0x7d, 0x86, 0x93);
const QColor kLinkColor(0x9b, 0x6b, 0xc9);

QColor mix(const QColor& a, const QColor& b, double t) {
  t = std::clamp(t, 0.0, 1.0);
  return QColor::fromRgbF(float(a.redF() + (b.redF() - a.redF()) * t),
                          float(a.greenF() + (b.greenF() - a.greenF()) * t),
                          float(a.blueF() + (b.blueF() - a.blueF()) * t));
}

QString qs(const std::string& s) {
  return QString::fromStdString(s);
}

// Case-insensitive (ASCII) substring test; `needle` is already lower case.
bool containsLower(const std::string& hay, const std::string& needle) {
  auto it = std::search(hay.begin(), hay.end(), needle.begin(), needle.end(),
                        [](char a, char b) { return std::tolower((unsigned char)a) == b; });
  return it != hay.end();
}

int statusRank(storage::DiffStatus s) {
  switch (s) {
    case storage::DiffStatus::Equal:
      return 0;
    case storage::DiffStatus::Unmatched:
      return 1;
    case storage::DiffStatus::WithinTolerance:
      return 2;
    case storage::DiffStatus::Diverged:
      return 3;
  }
  return 0;
}

QString durationText(int64_t ns) {
  if (ns < 10'000) return QString::number(ns) + " ns";
  if (ns < 10'000'000) return QString::number(double(ns) / 1e3, 'f', 1) + QString::fromUtf8(" µs");
  return QString::number(double(ns) / 1e6, 'f', 2) + " ms";
}

QString bytesText(int64_t b) {
  if (b < 10'000) return QString::number(b) + " B";
  if (b < 10'000'000) return QString::number(double(b) / 1024, 'f', 1) + " KiB";
  return QString::number(double(b) / (1024 * 1024), 'f', 1) + " MiB";
}

}  // namespace

struct GraphView::LayoutResult {
  uint64_t generation = 0;
  std::shared_ptr<const GraphDot> graph;
  GraphLayout layout;
  double dotSeconds = 0;
};

// One node: an op (name over output shape) or a collapsed module (scope over op count, drawn as
// a small stack of boxes). Text is skipped when zoomed far out.
class GraphView::NodeItem : public QAbstractGraphicsShapeItem {
 public:
  enum { Type = UserType + 1 };
  NodeItem(const GraphNode& node, int index, const GraphView* view)
      : index_(index),
        module_(node.kind == GraphNodeKind::Module),
        title_(qs(node.title)),
        subtitle_(qs(node.subtitle)),
        rect_(-node.width / 2, -node.height / 2, node.width, node.height),
        view_(view) {
    setZValue(1);
  }
  int type() const override { return Type; }
  int index() const { return index_; }
  bool isModule() const { return module_; }
  QRectF boundingRect() const override { return rect_.adjusted(-3, -3, 3, 3); }
  QRectF box() const { return module_ ? rect_.adjusted(0, 0, -5, -5) : rect_; }
  void setTextColor(const QColor& c) { text_ = c; }
  void setMarks(bool selected, bool matched) {
    if (selected == selected_ && matched == matched_) return;
    selected_ = selected;
    matched_ = matched;
    update();
  }

  void paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*) override {
    const double lod = option->levelOfDetailFromTransform(p->worldTransform());
    QPen border = pen();
    if (selected_)
      border = QPen(kSelectedPen, 3);
    else if (matched_)
      border = QPen(kMatchPen, 2.5);
    const QRectF r = box();
    if (lod < 0.25) {  // overview: flat boxes
      p->setPen(selected_ || matched_ ? border : Qt::NoPen);
      p->setBrush(brush());
      p->drawRect(module_ ? rect_ : r);
      return;
    }
    p->setBrush(brush());
    if (module_) {
      p->setPen(pen());
      p->drawRoundedRect(rect_.adjusted(5, 5, 0, 0), 4, 4);
    }
    p->setPen(border);
    p->drawRoundedRect(r, 4, 4);
    if (lod < 0.4) return;
    const TextMetrics& m = view_->metrics_;
    const double padY = (r.height() - 2 * m.lineHeight) / 2;
    QRectF line(r.left(), r.top() + padY, r.width(), m.lineHeight);
    p->setPen(text_);
    p->setFont(view_->boldFont_);
    p->drawText(line, Qt::AlignCenter | Qt::TextDontClip, title_);
    p->setFont(view_->font_);
    p->drawText(line.translated(0, m.lineHeight), Qt::AlignCenter | Qt::TextDontClip, subtitle_);
  }

 private:
  int index_;
  bool module_;
  QString title_, subtitle_;
  QRectF rect_;
  QColor text_ = Qt::black;
  bool selected_ = false, matched_ = false;
  const GraphView* view_;
};

// One data edge: Graphviz's Bezier and its arrowhead(s).
class GraphView::EdgeItem : public QGraphicsItem {
 public:
  EdgeItem(const LaidOutEdge& e, double width) : width_(width) {
    setZValue(0);
    if (!e.points.empty()) {
      path_.moveTo(qt(e.points[0]));
      for (size_t i = 1; i + 2 < e.points.size(); i += 3)
        path_.cubicTo(qt(e.points[i]), qt(e.points[i + 1]), qt(e.points[i + 2]));
    }
    if (e.arrowAtHead && !e.points.empty()) addArrow(qt(e.points.back()), qt(e.headTip));
    if (e.arrowAtTail && !e.points.empty()) addArrow(qt(e.points.front()), qt(e.tailTip));
    bounds_ = path_.controlPointRect().united(arrows_.boundingRect()).adjusted(-2, -2, 2, 2);
  }
  QRectF boundingRect() const override { return bounds_; }
  void setHighlighted(bool on) {
    if (on == highlighted_) return;
    highlighted_ = on;
    setZValue(on ? 0.5 : 0);
    update();
  }
  void paint(QPainter* p, const QStyleOptionGraphicsItem*, QWidget*) override {
    const QColor c = highlighted_ ? kSelectedPen : kEdgeColor;
    p->setPen(QPen(c, highlighted_ ? width_ + 1 : width_));
    p->setBrush(Qt::NoBrush);
    p->drawPath(path_);
    p->setPen(Qt::NoPen);
    p->setBrush(c);
    p->drawPath(arrows_);
  }

 private:
  // A filled triangle from the stroke's end (its base) to Graphviz's arrow tip.
  void addArrow(QPointF base, QPointF tip) {
    const QLineF l(base, tip);
    if (l.length() < 0.5) return;
    const QPointF n(-l.dy() / l.length(), l.dx() / l.length());
    const double half = std::max(2.5, l.length() * 0.4);
    arrows_.addPolygon(QPolygonF({tip, base + n * half, base - n * half, tip}));
  }
  QPainterPath path_, arrows_;
  QRectF bounds_;
  double width_;
  bool highlighted_ = false;
};

// An expanded module (or a phase): a rounded box with its label at the top left.
class GraphView::ClusterItem : public QGraphicsItem {
 public:
  enum { Type = UserType + 2 };
  ClusterItem(const GraphCluster& c, const QRectF& box, const GraphView* view)
      : cluster_(c), box_(box), label_(qs(c.label)), view_(view) {
    const size_t depth =
        std::count(c.scope.begin(), c.scope.end(), '.') + (c.scope.empty() ? 0 : 1);
    setZValue(-10 + double(depth) * 0.01);
    if (c.scope.empty()) {  // a phase
      fill_ = mix(phaseColor(c.phase), Qt::white, 0.78);
      border_ = phaseColor(c.phase).darker(135);
    } else {
      fill_ = mix(QColor(0xf7, 0xf8, 0xfa), QColor(0xc9, 0xd1, 0xdc), 0.14 * double(depth));
      border_ = QColor(0xb4, 0xbe, 0xcb);
    }
    setToolTip(c.scope.empty() ? label_ : "module " + label_);
  }
  int type() const override { return Type; }
  const GraphCluster& cluster() const { return cluster_; }
  QRectF boundingRect() const override { return box_.adjusted(-1, -1, 1, 1); }
  void paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*) override {
    const double lod = option->levelOfDetailFromTransform(p->worldTransform());
    p->setPen(QPen(border_, 1));
    p->setBrush(fill_);
    p->drawRoundedRect(box_, 6, 6);
    if (lod < 0.3) return;
    p->setPen(QColor(0x33, 0x3d, 0x4a));
    p->setFont(view_->boldFont_);
    QRectF line(box_.left() + 7, box_.top() + 3, box_.width() - 10, view_->metrics_.lineHeight);
    p->drawText(line, Qt::AlignLeft | Qt::AlignVCenter | Qt::TextDontClip, label_);
  }

 private:
  GraphCluster cluster_;
  QRectF box_;
  QString label_;
  QColor fill_, border_;
  const GraphView* view_;
};

// The graphics view: ctrl+wheel zooms, drag pans, a click that did not move selects.
class GraphView::Canvas : public QGraphicsView {
 public:
  Canvas(QGraphicsScene* scene, GraphView* owner) : QGraphicsView(scene, owner), owner_(owner) {
    setDragMode(QGraphicsView::ScrollHandDrag);
    setRenderHints(QPainter::Antialiasing | QPainter::TextAntialiasing);
    setTransformationAnchor(QGraphicsView::AnchorViewCenter);
    setViewportUpdateMode(QGraphicsView::SmartViewportUpdate);
    setBackgroundBrush(Qt::white);
    setFrameShape(QFrame::NoFrame);
  }

 protected:
  void wheelEvent(QWheelEvent* e) override {
    if (!(e->modifiers() & Qt::ControlModifier)) {
      QGraphicsView::wheelEvent(e);
      return;
    }
    setTransformationAnchor(QGraphicsView::AnchorUnderMouse);
    owner_->zoomBy(std::pow(1.0015, e->angleDelta().y()));
    setTransformationAnchor(QGraphicsView::AnchorViewCenter);
    e->accept();
  }
  void mousePressEvent(QMouseEvent* e) override {
    pressPos_ = e->pos();
    QGraphicsView::mousePressEvent(e);
  }
  void mouseReleaseEvent(QMouseEvent* e) override {
    QGraphicsView::mouseReleaseEvent(e);
    if (e->button() == Qt::LeftButton && (e->pos() - pressPos_).manhattanLength() < 5)
      owner_->clicked(e->pos());
  }
  void mouseDoubleClickEvent(QMouseEvent* e) override {
    if (e->button() == Qt::LeftButton) owner_->doubleClicked(e->pos());
  }
  void contextMenuEvent(QContextMenuEvent* e) override {
    owner_->contextMenu(e->pos(), e->globalPos());
  }
  void scrollContentsBy(int dx, int dy) override {
    QGraphicsView::scrollContentsBy(dx, dy);
    owner_->updateMinimap();
  }

 private:
  GraphView* owner_;
  QPoint pressPos_;
};

// The overview in the canvas's corner: the whole scene, rendered once per layout (or colour
// change), and the viewport's rectangle; a click or drag recentres the canvas there.
class GraphView::Minimap : public QWidget {
 public:
  explicit Minimap(GraphView* owner, QWidget* parent) : QWidget(parent), owner_(owner) {
    setCursor(Qt::PointingHandCursor);
    setToolTip(tr("Overview: click to move there"));
    hide();
  }
  void refresh() {
    QGraphicsScene* scene = owner_->scene_;
    sceneRect_ = scene->sceneRect();
    if (sceneRect_.isEmpty() || !owner_->graph_) {
      pixmap_ = QPixmap();
      hide();
      return;
    }
    const double maxSide = 170;
    const double s = std::min(maxSide / sceneRect_.width(), maxSide / sceneRect_.height());
    QSize size(std::max(24, int(sceneRect_.width() * s)),
               std::max(24, int(sceneRect_.height() * s)));
    const qreal dpr = devicePixelRatioF();
    pixmap_ = QPixmap(size * dpr);
    pixmap_.setDevicePixelRatio(dpr);
    pixmap_.fill(Qt::white);
    {
      QPainter p(&pixmap_);
      scene->render(&p, QRectF(QPointF(0, 0), QSizeF(size)), sceneRect_, Qt::KeepAspectRatio);
    }
    target_ = QRectF(QPointF(3, 3), QSizeF(size));
    scale_ = std::min(target_.width() / sceneRect_.width(), target_.height() / sceneRect_.height());
    resize(size + QSize(6, 6));
    place();
  }
  void place() {
    QWidget* canvas = parentWidget();
    move(canvas->width() - width() - 14 -
             (owner_->canvas_->verticalScrollBar()->isVisible()
                  ? owner_->canvas_->verticalScrollBar()->width()
                  : 0),
         canvas->height() - height() - 14 -
             (owner_->canvas_->horizontalScrollBar()->isVisible()
                  ? owner_->canvas_->horizontalScrollBar()->height()
                  : 0));
    // Shown only when the viewport does not hold the whole scene.
    const QRectF seen = viewRect();
    const bool needed = !pixmap_.isNull() && !seen.contains(sceneRect_.adjusted(20, 20, -20, -20));
    setVisible(needed);
    if (needed) raise();
    update();
  }

 protected:
  void paintEvent(QPaintEvent*) override {
    QPainter p(this);
    p.fillRect(rect(), QColor(255, 255, 255, 235));
    p.setPen(QColor(0x9a, 0xa4, 0xb1));
    p.drawRect(rect().adjusted(0, 0, -1, -1));
    p.drawPixmap(target_.topLeft(), pixmap_);
    QRectF v = viewRect();
    QRectF r(toMap(v.topLeft()), toMap(v.bottomRight()));
    r = r.intersected(target_.adjusted(-1, -1, 1, 1));
    p.setPen(QPen(kSelectedPen, 1.5));
    p.setBrush(QColor(26, 86, 219, 40));
    p.drawRect(r);
  }
  void mousePressEvent(QMouseEvent* e) override { recentre(e->position()); }
  void mouseMoveEvent(QMouseEvent* e) override {
    if (e->buttons() & Qt::LeftButton) recentre(e->position());
  }

 private:
  QRectF viewRect() const {
    QGraphicsView* c = owner_->canvas_;
    return c->mapToScene(c->viewport()->rect()).boundingRect();
  }
  QPointF toMap(QPointF s) const { return target_.topLeft() + (s - sceneRect_.topLeft()) * scale_; }
  void recentre(QPointF pos) {
    if (scale_ <= 0) return;
    owner_->canvas_->centerOn(sceneRect_.topLeft() + (pos - target_.topLeft()) / scale_);
  }
  GraphView* owner_;
  QPixmap pixmap_;
  QRectF sceneRect_, target_;
  double scale_ = 0;
};

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
  colorBox_->setToolTip(tr("What the node colours show"));
  legend_ = new QLabel(this);
  legend_->setTextFormat(Qt::RichText);
  search_ = new QLineEdit(this);
  search_->setPlaceholderText(tr("Find op or scope (Enter: next)"));
  search_->setClearButtonEnabled(true);
  search_->setMinimumWidth(120);
  search_->setMaximumWidth(240);
  matchLabel_ = new QLabel(this);
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
  bar->addWidget(legend_);
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
      if (a && p.inA) status_[p.seqA] = p.status;
      if (!a && p.inB) status_[p.seqB] = p.status;
    }
    if (diff_->first) {
      const auto& p = diff_->first->pair;
      if (a ? p.inA : p.inB) firstDivergence_ = a ? p.seqA : p.seqB;
    }
  }
  applyColors();
  minimap_->refresh();
}

void GraphView::setColorMode(ColorMode mode) {
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
    scene_->clear();
    nodeItems_.clear();
    edgeItems_.clear();
    clusterItems_.clear();
    opItems_.clear();
    linksItem_ = selectedLinksItem_ = nullptr;
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

void GraphView::applyLayout(std::shared_ptr<LayoutResult> result) {
  QElapsedTimer timer;
  timer.start();
  scene_->clear();
  nodeItems_.clear();
  edgeItems_.clear();
  clusterItems_.clear();
  opItems_.clear();
  linksItem_ = selectedLinksItem_ = nullptr;
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
        QString tip = QString("#%1 %2 (%3)").arg(op->seq).arg(qs(op->name), qs(op->phase));
        if (!op->scope.empty()) tip += "\n" + tr("scope: ") + qs(op->scope);
        tip += "\n" + tr("in: ") + qs(storage::tensorList(*op, storage::Role::Input));
        int64_t bytes = 0;
        for (const auto& t : op->tensors)
          if (t.role == storage::Role::Output) bytes += t.bytes;
        tip += "\n" + tr("out: ") + qs(storage::tensorList(*op, storage::Role::Output)) + " (" +
               bytesText(bytes) + ")";
        tip += "\n" + tr("time: ") + durationText(op->endNs - op->beginNs);
        item->setToolTip(tip);
      }
    } else {
      item->setToolTip(tr("module %1 (%2): %3 ops. Double-click to expand")
                           .arg(qs(n.scope), qs(n.phase))
                           .arg(n.seqs.size()));
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
    auto* item = new EdgeItem(le, g.edges[size_t(e->second)].tensors > 1 ? 1.8 : 1.1);
    scene_->addItem(item);
    edgeItems_[size_t(e->second)] = item;
  }

  // Forward <-> backward links: straight dashed lines between facing sides.
  if (!g.links.empty()) {
    QPainterPath path;
    for (const auto& link : g.links) {
      const NodeItem* f = nodeItems_[size_t(link.forward)];
      const NodeItem* b = nodeItems_[size_t(link.backward)];
      if (!f || !b) continue;
      QRectF fr = f->box().translated(f->pos()), br = b->box().translated(b->pos());
      const bool right = br.center().x() >= fr.center().x();
      path.moveTo(right ? fr.right() : fr.left(), fr.center().y());
      path.lineTo(right ? br.left() : br.right(), br.center().y());
    }
    QColor faint = kLinkColor;
    faint.setAlpha(100);
    linksItem_ = scene_->addPath(path, QPen(faint, 1, Qt::DashLine));
    linksItem_->setZValue(-0.5);
    linksItem_->setToolTip(tr("forward op \u2194 its backward op (J jumps between them)"));
    selectedLinksItem_ = scene_->addPath(QPainterPath(), QPen(kLinkColor, 2, Qt::DashLine));
    selectedLinksItem_->setZValue(0.7);
  }

  applyColors();
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
  minimap_->refresh();
  times_.scene = double(timer.nsecsElapsed()) / 1e9;
  updateStatus();
  emit layoutFinished();
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
    setPhaseFilter(op->phase == "optimizer" ? "optimizer" : "both");
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
      case ColorMode::Divergence: {
        std::optional<storage::DiffStatus> worst;
        bool first = false;
        for (uint64_t seq : n.seqs) {
          auto it = status_.find(seq);
          std::optional<storage::DiffStatus> s;
          if (it != status_.end())
            s = it->second;
          else if (diff_ && diff_->options.mismatchesOnly)
            s = storage::DiffStatus::Equal;  // the report kept only the others
          if (s && (!worst || statusRank(*s) > statusRank(*worst))) worst = s;
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
    item->setBrush(fill);
    item->setPen(strong ? QPen(QColor(0x4a, 0x07, 0x05), 3) : QPen(fill.darker(150), 1));
    item->setTextColor(fill.lightnessF() < 0.5 ? Qt::white : QColor(0x1b, 0x1f, 0x24));
    item->update();
  }
}

void GraphView::applyHighlights() {
  if (!graph_) {
    matchLabel_->setText(searchText_.isEmpty() ? QString()
                                               : tr("%n match(es)", "", int(matches_.size())));
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
  if (selectedLinksItem_) {
    QPainterPath path;
    for (const auto& link : g.links) {
      if (link.forward != selectedNode && link.backward != selectedNode) continue;
      const NodeItem* f = nodeItems_[size_t(link.forward)];
      const NodeItem* b = nodeItems_[size_t(link.backward)];
      if (!f || !b) continue;
      QRectF fr = f->box().translated(f->pos()), br = b->box().translated(b->pos());
      const bool right = br.center().x() >= fr.center().x();
      path.moveTo(right ? fr.right() : fr.left(), fr.center().y());
      path.lineTo(right ? br.left() : br.right(), br.center().y());
    }
    selectedLinksItem_->setPath(path);
  }
  if (searchText_.isEmpty())
    matchLabel_->clear();
  else if (matchIndex_ >= 0)
    matchLabel_->setText(QString("%1/%2").arg(matchIndex_ + 1).arg(matches_.size()));
  else
    matchLabel_->setText(tr("%n match(es)", "", int(matches_.size())));
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
  const std::string needle = text.trimmed().toLower().toStdString();
  if (step_ && !needle.empty())
    for (const auto& op : step_->ops)
      if (inGraphPhase(op, phase_) &&
          (containsLower(op.name, needle) || containsLower(op.scope, needle))) {
        matches_.push_back(op.seq);
        matchSet_.insert(op.seq);
      }
  applyHighlights();
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
  if (op->phase == "backward") {
    if (op->forwardSeq != 0 && opBySeq(op->forwardSeq)) return op->forwardSeq;
    return std::nullopt;
  }
  if (op->phase != "forward") return std::nullopt;
  std::optional<uint64_t> first;
  const std::string named = op->name + "_backward";
  for (const auto& o : step_->ops)
    if (o.forwardSeq == seq && o.phase == "backward") {
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

void GraphView::fitToView() {
  if (scene_->items().isEmpty()) return;
  canvas_->fitInView(scene_->sceneRect(), Qt::KeepAspectRatio);
  if (canvas_->transform().m11() > 1) {  // never magnify a small graph beyond 100%
    canvas_->resetTransform();
    canvas_->centerOn(scene_->sceneRect().center());
  }
  updateMinimap();
}

// Note [Initial graph view]: fitting a tall graph (a transformer step is far taller than wide)
// shrinks its labels below reading size. The first view of a step is the fit when that keeps
// labels readable (scale >= kMinReadableScale), else readable size at the top of the graph — where
// the forward pass starts — with the minimap showing where that is. Fit stays one click away.
void GraphView::initialView() {
  if (scene_->items().isEmpty()) return;
  fitToView();
  constexpr double kMinReadableScale = 0.6;
  if (canvas_->transform().m11() >= kMinReadableScale) return;
  canvas_->resetTransform();
  canvas_->scale(0.85, 0.85);
  const QRectF r = scene_->sceneRect();
  const QRectF visible = canvas_->mapToScene(canvas_->viewport()->rect()).boundingRect();
  canvas_->centerOn(QPointF(r.center().x(), r.top() + visible.height() / 2));
  updateMinimap();
}

void GraphView::updateMinimap() {
  if (minimap_) minimap_->place();
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

void GraphView::updateLegend() {
  auto swatch = [](const QColor& c, const QString& text) {
    return QString(
               "<span style='background-color:%1; "
               "color:%1'>&nbsp;&nbsp;&nbsp;</span>&nbsp;%2&nbsp;&nbsp;")
        .arg(c.name(), text);
  };
  QString html;
  switch (colorMode_) {
    case ColorMode::Phase:
      if (phase_ != GraphPhase::Backward && phase_ != GraphPhase::Optimizer)
        html += swatch(phaseColor("forward"), tr("forward"));
      if (phase_ != GraphPhase::Forward && phase_ != GraphPhase::Optimizer)
        html += swatch(phaseColor("backward"), tr("backward"));
      if (phase_ == GraphPhase::Optimizer) html += swatch(phaseColor("optimizer"), tr("optimizer"));
      html += swatch(phaseColor(phase_ == GraphPhase::Both ? "forward" : toString(phase_), true),
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
    case ColorMode::Divergence:
      html = swatch(statusColor(storage::DiffStatus::Equal), tr("equal")) +
             swatch(statusColor(storage::DiffStatus::WithinTolerance), tr("within tol.")) +
             swatch(statusColor(storage::DiffStatus::Diverged), tr("diverged")) +
             swatch(statusColor(storage::DiffStatus::Diverged, true), tr("first")) +
             swatch(statusColor(storage::DiffStatus::Unmatched), tr("unmatched"));
      if (!diff_) html += tr("<i>(no comparison)</i>");
      break;
  }
  legend_->setText(html);
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

QColor GraphView::phaseColor(const std::string& phase, bool module) {
  if (phase == "forward") return module ? QColor(0xb9, 0xd3, 0xf0) : QColor(0xd7, 0xe7, 0xf8);
  if (phase == "backward") return module ? QColor(0xf8, 0xcc, 0xa0) : QColor(0xfd, 0xe4, 0xcb);
  return module ? QColor(0xc3, 0xe2, 0xb4) : QColor(0xdd, 0xf0, 0xd4);
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
        if (n.phase == "forward")
          menu.addAction(tr("Go to backward op\tJ"), this, [this] { jumpToPartner(); })
              ->setEnabled(partner.has_value());
        else if (n.phase == "backward")
          menu.addAction(tr("Go to forward op\tJ"), this, [this] { jumpToPartner(); })
              ->setEnabled(partner.has_value());
        if (!n.scope.empty()) {
          const QString scope = qs(n.scope);
          menu.addAction(tr("Collapse %1").arg(scope), this, [this, scope] { collapse(scope); });
        }
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

QAbstractGraphicsShapeItem* GraphView::moduleItem(const QString& phase,
                                                  const QString& scope) const {
  if (!graph_) return nullptr;
  std::string id = "m:";
  id += phase == "forward" ? 'f' : phase == "backward" ? 'b' : 'o';
  id += ':' + scope.toStdString();
  auto it = graph_->nodeOfId.find(id);
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
