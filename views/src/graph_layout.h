// Graph layout: DOT text in, plain positions out (Graphviz's `dot` engine). The ONLY file of Keel
// that calls Graphviz. Callable from any thread: Graphviz keeps global state, so every call runs
// under one process-wide mutex. Coordinates are scene pixels, y down, (0, 0) at the top-left.
#pragma once
#include <QPointF>
#include <QRectF>
#include <QSizeF>
#include <string>
#include <vector>

namespace keel::views {

struct LaidOutNode {
  std::string id;  // the DOT node id
  QPointF center;
  QSizeF size;
};

struct LaidOutEdge {
  std::string tail, head;  // DOT ids as written (a dir=back edge keeps its written direction)
  // Cubic Bezier: points[0], then (control, control, end) triples; from the tail to the head.
  std::vector<QPointF> points;
  bool arrowAtHead = false, arrowAtTail = false;
  QPointF headTip, tailTip;  // where the arrowheads point, when present
};

struct LaidOutCluster {
  std::string id;  // the DOT subgraph name ("cluster_...")
  QRectF box;
  QRectF labelBox;  // the space reserved for its label (empty when it has none)
};

struct GraphLayout {
  QRectF bounds;
  std::vector<LaidOutNode> nodes;
  std::vector<LaidOutEdge> edges;
  std::vector<LaidOutCluster> clusters;  // outer clusters before the ones they contain
  std::string error;                     // non-empty: the DOT could not be read or laid out
  double seconds = 0;                    // wall time of parse + layout
};

GraphLayout layoutGraph(const std::string& dot);

}  // namespace keel::views
