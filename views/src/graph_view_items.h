// The graph view's private pieces, shared by graph_view*.cpp: the scene items (op and module
// nodes, edges, clusters), the canvas, the minimap, the layout result and a few colours. They are
// GraphView's nested classes so that they read its fonts, metrics and canvas.
#pragma once
#include <QAbstractGraphicsShapeItem>
#include <QColor>
#include <QGraphicsItem>
#include <QGraphicsView>
#include <QPainterPath>
#include <QPixmap>
#include <QPoint>
#include <QRectF>
#include <QString>
#include <QStringList>
#include <QWidget>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "keel/analysis/graph_dot.h"
#include "keel/analysis/graph_layout.h"
#include "keel/views/graph_view.h"
#include "text_util.h"

namespace keel::views {

namespace graph_detail {

inline QPointF qt(analysis::LayoutPoint p) {
  return {p.x, p.y};
}

inline QRectF qt(const analysis::LayoutRect& r) {
  return {r.x, r.y, r.width, r.height};
}

using views::qs;

inline QColor mix(const QColor& a, const QColor& b, double t) {
  t = std::clamp(t, 0.0, 1.0);
  return QColor::fromRgbF(float(a.redF() + (b.redF() - a.redF()) * t),
                          float(a.greenF() + (b.greenF() - a.greenF()) * t),
                          float(a.blueF() + (b.blueF() - a.blueF()) * t));
}

inline const QColor kSelectedPen(0x1a, 0x56, 0xdb);
inline const QColor kMatchPen(0xe3, 0x74, 0x00);
inline const QColor kEdgeColor(0x7d, 0x86, 0x93);
inline const QColor kLinkColor(0x9b, 0x6b, 0xc9);

// Module depth of a scope ("" 0, "blocks" 1, "blocks.1.attn" 3), and the depth two scopes share.
int scopeLevel(std::string_view scope);
int commonLevel(std::string_view a, std::string_view b);

}  // namespace graph_detail

struct GraphView::LayoutResult {
  uint64_t generation = 0;
  std::shared_ptr<const analysis::GraphDot> graph;
  analysis::GraphLayout layout;
  double dotSeconds = 0;
};

// One node: an op (name over output shape) or a collapsed module (scope over op count, drawn as
// a small stack of boxes). Below kLabelScale op text is skipped, a module's text is drawn at screen
// size, and nodes inside a module block are not drawn (Note [Semantic zoom]).
class GraphView::NodeItem : public QAbstractGraphicsShapeItem {
 public:
  enum { Type = UserType + 1 };
  NodeItem(const analysis::GraphNode& node, int index, const GraphView* view);
  int type() const override { return Type; }
  int index() const { return index_; }
  bool isModule() const { return module_; }
  QRectF boundingRect() const override { return rect_.adjusted(-3, -3, 3, 3); }
  QRectF box() const { return module_ ? rect_.adjusted(0, 0, -5, -5) : rect_; }
  int level() const { return level_; }
  // The expanded module it is drawn in (nullptr: none): not drawn while that is a block or hidden.
  void setContainer(const ClusterItem* c) { container_ = c; }
  bool insideBlock() const;
  void setTextColor(const QColor& c) { text_ = c; }
  void setMarks(bool selected, bool matched);
  void paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*) override;

 private:
  int index_;
  bool module_;
  int level_;  // scopeLevel of its scope (an op's module, a module node's own)
  const ClusterItem* container_ = nullptr;
  QString title_, subtitle_;
  QRectF rect_;
  QColor text_ = Qt::black;
  bool selected_ = false, matched_ = false;
  const GraphView* view_;
};

// One data edge: Graphviz's Bezier and its arrowhead(s).
class GraphView::EdgeItem : public QGraphicsItem {
 public:
  // `level`: the module depth its two ends share (hidden inside a block of that depth or above).
  EdgeItem(const analysis::LaidOutEdge& e, double width, int level, const GraphView* view);
  QRectF boundingRect() const override { return bounds_; }
  void setHighlighted(bool on);
  // The deepest expanded module holding both ends (nullptr: none), and the ends: hidden inside
  // a block, and between two blocks (both ends hidden).
  void setContainer(const ClusterItem* c, const NodeItem* from, const NodeItem* to) {
    container_ = c;
    from_ = from;
    to_ = to;
  }
  void paint(QPainter* p, const QStyleOptionGraphicsItem*, QWidget*) override;

 private:
  // A filled triangle from the stroke's end (its base) to Graphviz's arrow tip.
  void addArrow(QPointF base, QPointF tip);
  QPainterPath path_, arrows_;
  QRectF bounds_;
  double width_;
  int level_;
  const ClusterItem* container_ = nullptr;
  const NodeItem *from_ = nullptr, *to_ = nullptr;
  bool highlighted_ = false;
  const GraphView* view_;
};

// The cross-phase relations of one node (Note [Cross-phase relations]): its forward <-> backward
// links (dashed) and the saved activations it writes or reads (solid, arrow at the backward op),
// as curves that leave each node's facing side level.
class GraphView::RelationsItem : public QGraphicsItem {
 public:
  // `strong`: the selected node's (drawn over everything); else the hovered node's, lighter.
  explicit RelationsItem(bool strong);
  QRectF boundingRect() const override { return bounds_; }
  // The relations of node `node` (-1: none) in `g`, between the items in `nodes`.
  void show(const analysis::GraphDot& g, const std::vector<NodeItem*>& nodes, int node);
  int node() const { return node_; }
  int links() const { return links_; }
  int dataEdges() const { return dataEdges_; }
  void paint(QPainter* p, const QStyleOptionGraphicsItem*, QWidget*) override;

 private:
  QPainterPath linkPath_, dataPath_, arrows_;
  QRectF bounds_;
  bool strong_;
  int node_ = -1, links_ = 0, dataEdges_ = 0;
};

// An expanded module (or a phase): a rounded box with its label at the top left; at the semantic
// zoom's block depth a solid block with its summary, deeper ones not drawn (Note [Semantic zoom]).
class GraphView::ClusterItem : public QGraphicsItem {
 public:
  enum { Type = UserType + 2 };
  ClusterItem(const analysis::GraphCluster& c, const QRectF& box, const GraphView* view);
  int type() const override { return Type; }
  const analysis::GraphCluster& cluster() const { return cluster_; }
  QRectF boundingRect() const override { return box_.adjusted(-1, -1, 1, 1); }
  int level() const { return level_; }
  QRectF box() const { return box_; }
  void setBlock(const QColor& fill, const QStringList& lines);
  // Semantic zoom state (Note [Semantic zoom]): drawn open, as a block, or not (inside a block).
  enum class Zoom { Open, Block, Hidden };
  Zoom zoom() const { return zoom_; }
  bool setZoom(Zoom z) {
    if (z == zoom_) return false;
    zoom_ = z;
    return true;
  }
  double need = 1;  // the scale from which its block's text reads
  int direct = 0;   // nodes drawn in it, outside its sub-modules
  ClusterItem* parent = nullptr;
  std::vector<ClusterItem*> children;
  void paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*) override;

 private:
  analysis::GraphCluster cluster_;
  QRectF box_;
  QString label_;
  QColor fill_, border_;
  int level_;
  QColor blockFill_ = QColor(0xb9, 0xd3, 0xf0), blockText_ = Qt::black;
  QStringList lines_;  // the block's text: scope, summary lines
  Zoom zoom_ = Zoom::Open;
  const GraphView* view_;
};

// The graphics view: ctrl+wheel zooms, drag pans, a click that did not move selects, the pointer
// over a node draws its cross-phase relations.
class GraphView::Canvas : public QGraphicsView {
 public:
  Canvas(QGraphicsScene* scene, GraphView* owner);
  // The blank strip beside the viewport that holds a thin minimap (see Minimap::place); the
  // scene point at the viewport's top left stays there. False when it was already so.
  bool setStrip(const QMargins& m);
  QMargins strip() const { return viewportMargins(); }

 protected:
  void wheelEvent(QWheelEvent* e) override;
  void mousePressEvent(QMouseEvent* e) override;
  void mouseReleaseEvent(QMouseEvent* e) override;
  void mouseMoveEvent(QMouseEvent* e) override;  // no button held: hovers the node there
  void mouseDoubleClickEvent(QMouseEvent* e) override;
  void contextMenuEvent(QContextMenuEvent* e) override;
  bool viewportEvent(QEvent* e) override;  // leaving the viewport: no node hovered
  void scrollContentsBy(int dx, int dy) override;

 private:
  GraphView* owner_;
  QPoint pressPos_;
};

// The overview in the canvas's corner: the whole scene, rendered once per layout (or colour
// change), and the viewport's rectangle; a click or drag recentres the canvas there.
class GraphView::Minimap : public QWidget {
 public:
  explicit Minimap(GraphView* owner, QWidget* parent);
  void refresh();
  void place();

 protected:
  void paintEvent(QPaintEvent*) override;
  void mousePressEvent(QMouseEvent* e) override;
  void mouseMoveEvent(QMouseEvent* e) override;

 private:
  QRectF viewRect() const;
  QPointF toMap(QPointF s) const;
  void recentre(QPointF pos);
  GraphView* owner_;
  QPixmap pixmap_;
  QRectF sceneRect_, target_;
  double scale_ = 0;
  // place() changes the canvas's margins, which moves its scroll bars, which call place():
  // the inner call returns (a hidden canvas shown again made the two alternate until the stack
  // overflowed).
  bool placing_ = false;
  // Its longest side: a fifth of the canvas's shorter one, 60 to 170 pixels (a fixed 170 covered
  // much of a narrow pane: two ranks or two runs side by side at 1366 pixels).
  double maxSide() const;
  double side_ = 0;  // the side the pixmap was drawn at
};

}  // namespace keel::views
