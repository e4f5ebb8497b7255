// The graph view's scene items and canvas (see graph_view_items.h): how an op or module node, an
// edge and a cluster paint, and how the canvas turns wheel and mouse events into zoom and clicks.
// Items skip text when zoomed far out and what lies inside a module block, so 20,000 ops paint
// fast.
#include "graph_view_items.h"

#include <QContextMenuEvent>
#include <QFontMetricsF>
#include <QMouseEvent>
#include <QPainter>
#include <QStyleOptionGraphicsItem>
#include <cmath>

namespace keel::views {

using namespace graph_detail;
using analysis::GraphNodeKind;
using analysis::TextMetrics;

int graph_detail::scopeLevel(std::string_view scope) {
  return scope.empty() ? 0 : int(std::count(scope.begin(), scope.end(), '.')) + 1;
}

int graph_detail::commonLevel(std::string_view a, std::string_view b) {
  int level = 0;
  size_t i = 0;
  for (; i < a.size() && i < b.size() && a[i] == b[i]; ++i)
    if (a[i] == '.') ++level;
  const bool whole = (i == a.size() || a[i] == '.') && (i == b.size() || b[i] == '.');
  if (i > 0 && whole) ++level;  // the last shared component ends at a boundary in both
  return level;
}

namespace {

// Draws `lines` (the first bold) at screen size inside `sceneRect` as the painter maps it: at the
// top left of its part in sight, or centred; lines that do not fit its height are dropped, the
// others elided. A scope
// too wide for the box loses its leading components first ("blocks.0.attn" -> "attn").
void drawScreenText(QPainter* p, const QRectF& sceneRect, const QStringList& lines,
                    const QFont& bold, const QFont& regular, double lineHeight, bool centred) {
  QRectF r = p->worldTransform().mapRect(sceneRect).adjusted(4, 3, -4, -3);
  if (const QPaintDevice* d = p->device(); d && !centred)  // a block's text stays in sight
    r = r.intersected(QRectF(0, 0, d->width(), d->height()).adjusted(4, 3, -4, -3));
  if (r.width() < 12 || r.height() < lineHeight || lines.isEmpty()) return;
  QStringList all;  // a summary too wide breaks at its commas
  for (int i = 0; i < lines.size(); ++i)
    if (i > 0 && QFontMetricsF(regular).horizontalAdvance(lines[i]) > r.width())
      all << lines[i].split(", ");
    else
      all << lines[i];
  const int n = std::min(int(all.size()), int(r.height() / lineHeight));
  p->save();
  p->resetTransform();
  double y = centred ? r.center().y() - n * lineHeight / 2 : r.top();
  for (int i = 0; i < n; ++i, y += lineHeight) {
    const QFont& f = i == 0 ? bold : regular;
    const QFontMetricsF fm(f);
    QString text = all[i];
    if (i == 0)
      while (fm.horizontalAdvance(text) > r.width() && text.indexOf('.') > 0)
        text = text.mid(text.indexOf('.') + 1);
    p->setFont(f);
    p->drawText(QRectF(r.left(), y, r.width(), lineHeight),
                (centred ? Qt::AlignHCenter : Qt::AlignLeft) | Qt::AlignVCenter,
                fm.elidedText(text, Qt::ElideRight, r.width()));
  }
  p->restore();
}

}  // namespace

GraphView::NodeItem::NodeItem(const analysis::GraphNode& node, int index, const GraphView* view)
    : index_(index),
      module_(node.kind == GraphNodeKind::Module),
      level_(scopeLevel(node.scope)),
      title_(qs(node.title)),
      subtitle_(qs(node.subtitle)),
      rect_(-node.width / 2, -node.height / 2, node.width, node.height),
      view_(view) {
  setZValue(1);
}

bool GraphView::NodeItem::insideBlock() const {
  return view_->blockLevel_ > 0 && container_ && container_->zoom() != ClusterItem::Zoom::Open;
}

void GraphView::NodeItem::setMarks(bool selected, bool matched) {
  if (selected == selected_ && matched == matched_) return;
  selected_ = selected;
  matched_ = matched;
  update();
}

void GraphView::NodeItem::paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*) {
  const double lod = option->levelOfDetailFromTransform(p->worldTransform());
  const int block = view_->blockLevel_;
  if (insideBlock()) return;
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
    if (module_ && block > 0) {
      p->setPen(text_);
      drawScreenText(p, r, {title_, subtitle_}, view_->boldFont_, view_->font_,
                     view_->metrics_.lineHeight, true);
    }
    return;
  }
  p->setBrush(brush());
  if (module_) {
    p->setPen(pen());
    p->drawRoundedRect(rect_.adjusted(5, 5, 0, 0), 4, 4);
  }
  p->setPen(border);
  p->drawRoundedRect(r, 4, 4);
  if (lod < kLabelScale) {
    if (module_) {  // a module's name and summary stay readable (Note [Semantic zoom])
      p->setPen(text_);
      drawScreenText(p, r, {title_, subtitle_}, view_->boldFont_, view_->font_,
                     view_->metrics_.lineHeight, true);
    }
    return;
  }
  const TextMetrics& m = view_->metrics_;
  const double padY = (r.height() - 2 * m.lineHeight) / 2;
  QRectF line(r.left(), r.top() + padY, r.width(), m.lineHeight);
  p->setPen(text_);
  p->setFont(view_->boldFont_);
  p->drawText(line, Qt::AlignCenter | Qt::TextDontClip, title_);
  p->setFont(view_->font_);
  p->drawText(line.translated(0, m.lineHeight), Qt::AlignCenter | Qt::TextDontClip, subtitle_);
}

GraphView::EdgeItem::EdgeItem(const analysis::LaidOutEdge& e, double width, int level,
                              const GraphView* view)
    : width_(width), level_(level), view_(view) {
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

void GraphView::EdgeItem::setHighlighted(bool on) {
  if (on == highlighted_) return;
  highlighted_ = on;
  setZValue(on ? 0.5 : 0);
  update();
}

void GraphView::EdgeItem::paint(QPainter* p, const QStyleOptionGraphicsItem*, QWidget*) {
  if (view_->blockLevel_ > 0 && !highlighted_ &&
      ((container_ && container_->zoom() != ClusterItem::Zoom::Open) ||
       (from_ && to_ && from_->insideBlock() && to_->insideBlock())))
    return;  // inside one block, or between two
  const QColor c = highlighted_ ? kSelectedPen : kEdgeColor;
  p->setPen(QPen(c, highlighted_ ? width_ + 1 : width_));
  p->setBrush(Qt::NoBrush);
  p->drawPath(path_);
  p->setPen(Qt::NoPen);
  p->setBrush(c);
  p->drawPath(arrows_);
}

void GraphView::EdgeItem::addArrow(QPointF base, QPointF tip) {
  const QLineF l(base, tip);
  if (l.length() < 0.5) return;
  const QPointF n(-l.dy() / l.length(), l.dx() / l.length());
  const double half = std::max(2.5, l.length() * 0.4);
  arrows_.addPolygon(QPolygonF({tip, base + n * half, base - n * half, tip}));
}

GraphView::RelationsItem::RelationsItem(bool strong) : strong_(strong) {
  setZValue(strong ? 0.7 : 0.6);
  setAcceptedMouseButtons(Qt::NoButton);
}

void GraphView::RelationsItem::show(const analysis::GraphDot& g,
                                    const std::vector<NodeItem*>& nodes, int node) {
  prepareGeometryChange();
  node_ = node;
  linkPath_ = dataPath_ = arrows_ = QPainterPath();
  links_ = dataEdges_ = 0;
  // A curve from the side of `a` facing `b` to the side of `b` facing `a`, level at both ends,
  // with an arrow at `b` when asked.
  auto curve = [&](QPainterPath& path, const NodeItem* a, const NodeItem* b, bool arrowAtB) {
    const QRectF ar = a->box().translated(a->pos()), br = b->box().translated(b->pos());
    const bool right = br.center().x() >= ar.center().x();
    const QPointF from(right ? ar.right() : ar.left(), ar.center().y());
    const QPointF to(right ? br.left() : br.right(), br.center().y());
    const double bend = std::max(40.0, std::abs(to.x() - from.x()) * 0.45) * (right ? 1 : -1);
    path.moveTo(from);
    path.cubicTo(from + QPointF(bend, 0), to - QPointF(bend, 0), to);
    if (arrowAtB) {
      const double dir = right ? 1 : -1, len = 7, half = 3.5;
      arrows_.addPolygon(
          QPolygonF({to, to + QPointF(-dir * len, -half), to + QPointF(-dir * len, half), to}));
    }
  };
  auto item = [&](int i) {
    return i >= 0 && size_t(i) < nodes.size() ? nodes[size_t(i)] : nullptr;
  };
  if (item(node)) {
    for (const auto& l : g.links) {
      const NodeItem *f = item(l.forward), *b = item(l.backward);
      if ((l.forward != node && l.backward != node) || !f || !b) continue;
      curve(linkPath_, f, b, false);
      ++links_;
    }
    for (const auto& e : g.crossEdges) {
      const NodeItem *f = item(e.from), *b = item(e.to);
      if ((e.from != node && e.to != node) || !f || !b) continue;
      curve(dataPath_, f, b, true);
      ++dataEdges_;
    }
  }
  bounds_ = linkPath_.controlPointRect()
                .united(dataPath_.controlPointRect())
                .united(arrows_.boundingRect())
                .adjusted(-3, -3, 3, 3);
  update();
}

void GraphView::RelationsItem::paint(QPainter* p, const QStyleOptionGraphicsItem*, QWidget*) {
  if (node_ < 0) return;
  QColor data = strong_ ? kSelectedPen : kEdgeColor, link = kLinkColor;
  if (!strong_) link.setAlpha(200);
  p->setBrush(Qt::NoBrush);
  p->setPen(QPen(data, strong_ ? 1.8 : 1.3));
  p->drawPath(dataPath_);
  p->setPen(QPen(link, strong_ ? 2 : 1.5, Qt::DashLine));
  p->drawPath(linkPath_);
  p->setPen(Qt::NoPen);
  p->setBrush(data);
  p->drawPath(arrows_);
}

GraphView::ClusterItem::ClusterItem(const analysis::GraphCluster& c, const QRectF& box,
                                    const GraphView* view)
    : cluster_(c), box_(box), label_(qs(c.label)), level_(scopeLevel(c.scope)), view_(view) {
  const size_t depth = std::count(c.scope.begin(), c.scope.end(), '.') + (c.scope.empty() ? 0 : 1);
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

void GraphView::ClusterItem::setBlock(const QColor& fill, const QStringList& lines) {
  blockFill_ = fill;
  blockText_ = fill.lightnessF() < 0.5 ? Qt::white : QColor(0x1b, 0x1f, 0x24);
  lines_ = lines;
  update();
}

void GraphView::ClusterItem::paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*) {
  const double lod = option->levelOfDetailFromTransform(p->worldTransform());
  if (view_->blockLevel_ > 0 && zoom_ != Zoom::Open) {
    if (zoom_ == Zoom::Hidden) return;  // inside a block
    p->setPen(QPen(blockFill_.darker(140), 0));
    p->setBrush(blockFill_);
    p->drawRoundedRect(box_, 6, 6);
    p->setPen(blockText_);
    drawScreenText(p, box_, lines_, view_->boldFont_, view_->font_, view_->metrics_.lineHeight,
                   false);
    return;
  }
  p->setPen(QPen(border_, 1));
  p->setBrush(fill_);
  p->drawRoundedRect(box_, 6, 6);
  if (lod < 0.3) return;
  p->setPen(QColor(0x33, 0x3d, 0x4a));
  p->setFont(view_->boldFont_);
  QRectF line(box_.left() + 7, box_.top() + 3, box_.width() - 10, view_->metrics_.lineHeight);
  p->drawText(line, Qt::AlignLeft | Qt::AlignVCenter | Qt::TextDontClip, label_);
}

GraphView::Canvas::Canvas(QGraphicsScene* scene, GraphView* owner)
    : QGraphicsView(scene, owner), owner_(owner) {
  setDragMode(QGraphicsView::ScrollHandDrag);
  setRenderHints(QPainter::Antialiasing | QPainter::TextAntialiasing);
  setTransformationAnchor(QGraphicsView::AnchorViewCenter);
  setViewportUpdateMode(QGraphicsView::SmartViewportUpdate);
  setBackgroundBrush(Qt::white);
  setFrameShape(QFrame::NoFrame);
  viewport()->setMouseTracking(true);  // hover without a button held
}

void GraphView::Canvas::wheelEvent(QWheelEvent* e) {
  if (!(e->modifiers() & Qt::ControlModifier)) {
    QGraphicsView::wheelEvent(e);
    return;
  }
  setTransformationAnchor(QGraphicsView::AnchorUnderMouse);
  owner_->zoomBy(std::pow(1.0015, e->angleDelta().y()));
  setTransformationAnchor(QGraphicsView::AnchorViewCenter);
  e->accept();
}

void GraphView::Canvas::mousePressEvent(QMouseEvent* e) {
  pressPos_ = e->pos();
  QGraphicsView::mousePressEvent(e);
}

void GraphView::Canvas::mouseReleaseEvent(QMouseEvent* e) {
  QGraphicsView::mouseReleaseEvent(e);
  if (e->button() == Qt::LeftButton && (e->pos() - pressPos_).manhattanLength() < 5)
    owner_->clicked(e->pos());
}

void GraphView::Canvas::mouseMoveEvent(QMouseEvent* e) {
  QGraphicsView::mouseMoveEvent(e);
  if (e->buttons() == Qt::NoButton) owner_->hovered(e->pos());
}

bool GraphView::Canvas::viewportEvent(QEvent* e) {
  if (e->type() == QEvent::Leave) owner_->hovered(QPoint(-1, -1));
  return QGraphicsView::viewportEvent(e);
}

void GraphView::Canvas::mouseDoubleClickEvent(QMouseEvent* e) {
  if (e->button() == Qt::LeftButton) owner_->doubleClicked(e->pos());
}

void GraphView::Canvas::contextMenuEvent(QContextMenuEvent* e) {
  owner_->contextMenu(e->pos(), e->globalPos());
}

void GraphView::Canvas::scrollContentsBy(int dx, int dy) {
  QGraphicsView::scrollContentsBy(dx, dy);
  // Block texts follow the viewport (drawScreenText): a scrolled copy of them would be stale.
  if (owner_->blockLevel_ > 0) viewport()->update();
  owner_->updateMinimap();
}

}  // namespace keel::views
