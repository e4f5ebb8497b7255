// Graph layout: DOT text in, plain positions (or an SVG picture) out, by Graphviz's `dot` engine.
// The ONLY file of Keel that calls Graphviz, for the studio's graph and `keel export graph
// --format svg` alike. Callable from any thread: Graphviz keeps global state, so every call runs
// under one process-wide mutex. Coordinates are pixels (= points), y down, (0, 0) at the top-left.
#pragma once
#include <string>
#include <vector>

namespace keel::analysis {

struct LayoutPoint {
  double x = 0, y = 0;
};

struct LayoutRect {
  double x = 0, y = 0, width = 0, height = 0;
  bool contains(LayoutPoint p) const;
  bool contains(const LayoutRect& r) const;
};

struct LaidOutNode {
  std::string id;  // the DOT node id
  LayoutPoint center;
  double width = 0, height = 0;
};

struct LaidOutEdge {
  std::string tail, head;  // DOT ids as written (a dir=back edge keeps its written direction)
  // Cubic Bezier: points[0], then (control, control, end) triples; from the tail to the head.
  std::vector<LayoutPoint> points;
  bool arrowAtHead = false, arrowAtTail = false;
  LayoutPoint headTip, tailTip;  // where the arrowheads point, when present
};

struct LaidOutCluster {
  std::string id;  // the DOT subgraph name ("cluster_...")
  LayoutRect box;
  LayoutRect labelBox;  // the space reserved for its label (empty when it has none)
};

struct GraphLayout {
  LayoutRect bounds;
  std::vector<LaidOutNode> nodes;
  std::vector<LaidOutEdge> edges;
  std::vector<LaidOutCluster> clusters;  // outer clusters before the ones they contain
  std::string error;                     // non-empty: the DOT could not be read or laid out
  double seconds = 0;                    // wall time of parse + layout
};

// Lays out `dot` for a program that draws the labels itself: node labels are ignored (Note
// [Labels in the DOT] in graph_dot.cpp), positions are those of the DOT as written.
GraphLayout layoutGraph(const std::string& dot);

struct GraphSvg {
  std::string svg;
  std::string error;  // non-empty: the DOT could not be read, laid out or rendered
};

// Lays out `dot` and renders it, labels and colours included, as an SVG document.
GraphSvg renderSvg(const std::string& dot);

}  // namespace keel::analysis
