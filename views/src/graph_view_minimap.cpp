// The graph view's minimap (see graph_view_items.h): the whole scene rendered into a pixmap once
// per layout or colour change, placed in the canvas's bottom-right corner and shown only while the
// viewport does not hold the whole scene; a click or drag there recentres the canvas.
#include <QGraphicsScene>
#include <QMouseEvent>
#include <QPainter>
#include <QScrollBar>

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
  const double maxSide = 170;
  const double s = std::min(maxSide / sceneRect_.width(), maxSide / sceneRect_.height());
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

void GraphView::Minimap::place() {
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
