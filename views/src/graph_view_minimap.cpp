// The graph view's minimap (see graph_view_items.h): the whole scene rendered into a pixmap once
// per layout or colour change, placed in the canvas's bottom-right corner (a thin one in a strip
// of its own beside the viewport) and shown only while the viewport does not hold the whole
// scene; a click or drag there recentres the canvas.
#include <QGraphicsScene>
#include <QMouseEvent>
#include <QPainter>
#include <QScopedValueRollback>
#include <QScrollBar>

#include <algorithm>
#include <cmath>

#include "graph_view_items.h"

namespace keel::views {

using graph_detail::kSelectedPen;

GraphView::Minimap::Minimap(GraphView* owner, QWidget* parent) : QWidget(parent), owner_(owner) {
  setCursor(Qt::PointingHandCursor);
  setToolTip(tr("Overview: click to move there"));
  hide();
}

void GraphView::Minimap::refresh() {
  QGraphicsScene* scene = owner_->scene_;
  sceneRect_ = scene->sceneRect();
  if (sceneRect_.isEmpty() || !owner_->graph_) {
    pixmap_ = QPixmap();
    hide();
    return;
  }
  side_ = maxSide();
  const double s = std::min(side_ / sceneRect_.width(), side_ / sceneRect_.height());
  QSize size(std::max(24, int(sceneRect_.width() * s)), std::max(24, int(sceneRect_.height() * s)));
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

bool GraphView::Canvas::setStrip(const QMargins& m) {
  if (viewportMargins() == m) return false;
  // Resizing the viewport would move what it shows (a view just put at the graph's top left lost
  // its top): keep the scene point at its top left where it was.
  QScrollBar *h = horizontalScrollBar(), *v = verticalScrollBar();
  const bool left = h->value() == h->minimum(), top = v->value() == v->minimum();
  const QPointF topLeft = mapToScene(QPoint(0, 0));
  setViewportMargins(m);
  const QPoint now = mapFromScene(topLeft);
  h->setValue(left ? h->minimum() : h->value() + now.x());  // an edge stays an edge
  v->setValue(top ? v->minimum() : v->value() + now.y());
  return true;
}

double GraphView::Minimap::maxSide() const {
  const Canvas* canvas = owner_->canvas_;
  return std::clamp(0.2 * std::min(canvas->width(), canvas->height()), 60.0, 170.0);
}

void GraphView::Minimap::place() {
  if (placing_) return;
  const QScopedValueRollback<bool> guard(placing_, true);
  Canvas* canvas = owner_->canvas_;
  // The canvas resized: the overview drawn again at its size (refresh's own place() returns).
  if (!pixmap_.isNull() && std::abs(maxSide() - side_) >= 8) refresh();
  // Shown only when the viewport, as wide as it is without a strip, does not hold the whole
  // scene (measured with the strip, a graph that fits the whole viewport kept its strip).
  const auto needed = [&] {
    if (pixmap_.isNull()) return false;
    QRectF seen = viewRect();
    const QMargins strip = canvas->strip();
    const double scale = canvas->transform().m11();
    if (scale > 0) seen.adjust(0, 0, strip.right() / scale, strip.bottom() / scale);
    return !seen.contains(sceneRect_.adjusted(20, 20, -20, -20));
  };
  // A thin minimap (a tall graph's, or a wide one's) gets a strip of its own beside the viewport
  // instead of covering the nodes at the canvas's edge: a narrow graph put its right-hand nodes
  // under it. A squarer one stays over the corner: a strip that wide would cost the canvas more
  // than the corner hides.
  const int kThin = 60, kGap = 6;
  QMargins strip;
  if (needed()) {
    if (width() <= kThin)
      strip.setRight(width() + 2 * kGap);
    else if (height() <= kThin)
      strip.setBottom(height() + 2 * kGap);
  }
  canvas->setStrip(strip);
  const int vbar =
      canvas->verticalScrollBar()->isVisible() ? canvas->verticalScrollBar()->width() : 0;
  const int hbar =
      canvas->horizontalScrollBar()->isVisible() ? canvas->horizontalScrollBar()->height() : 0;
  const int right = strip.right() > 0 ? kGap : 14, bottom = strip.bottom() > 0 ? kGap : 14;
  move(canvas->width() - width() - right - vbar, canvas->height() - height() - bottom - hbar);
  const bool show = needed();
  setVisible(show);
  if (show) raise();
  update();
}

void GraphView::Minimap::paintEvent(QPaintEvent*) {
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

void GraphView::Minimap::mousePressEvent(QMouseEvent* e) {
  recentre(e->position());
}

void GraphView::Minimap::mouseMoveEvent(QMouseEvent* e) {
  if (e->buttons() & Qt::LeftButton) recentre(e->position());
}

QRectF GraphView::Minimap::viewRect() const {
  QGraphicsView* c = owner_->canvas_;
  return c->mapToScene(c->viewport()->rect()).boundingRect();
}

QPointF GraphView::Minimap::toMap(QPointF s) const {
  return target_.topLeft() + (s - sceneRect_.topLeft()) * scale_;
}

void GraphView::Minimap::recentre(QPointF pos) {
  if (scale_ <= 0) return;
  owner_->canvas_->centerOn(sceneRect_.topLeft() + (pos - target_.topLeft()) / scale_);
}

}  // namespace keel::views
