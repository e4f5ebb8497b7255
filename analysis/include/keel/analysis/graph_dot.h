// The one DOT builder, behind the studio's graph and `keel export graph`: one step's op graph as
// Graphviz DOT text, a pure function of the ops, the phase filter and the expanded modules (tested
// as text), plus what the view needs to draw each node. See Note [Graph shape] in graph_dot.cpp.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "keel/storage/records.h"

namespace keel::analysis {

// Which ops a graph shows. Both = forward and backward (optimizer ops excluded, like the CLI).
enum class GraphPhase { Forward, Backward, Both, Optimizer };

// "forward" | "backward" | "both" | "optimizer" (anything else: Both), and back.
GraphPhase parseGraphPhase(std::string_view text);
const char* toString(GraphPhase phase);
bool inGraphPhase(const storage::OpRecord& op, GraphPhase phase);

// Advance widths (pixels) of the printable ASCII characters in the label fonts: the studio measures
// its fonts once on the GUI thread (QFontMetricsF) so that sizing thousands of labels on a worker
// is pure arithmetic; `keel export graph` uses the fixed default. Other characters count as the
// widest ASCII one, so labels are never narrower than their text.
struct TextMetrics {
  std::array<double, 128> regular{}, bold{};
  double lineHeight = 14;
  // Every character `charWidth` wide (regular and bold): deterministic sizes for tests.
  static TextMetrics fixed(double charWidth, double lineHeight);
  double width(std::string_view text, bool boldFont) const;
};

struct GraphDotOptions {
  GraphPhase phase = GraphPhase::Both;
  bool expandAll = true;                     // every module is a cluster
  std::unordered_set<std::string> expanded;  // else: scopes shown as clusters; others collapse
  TextMetrics metrics = TextMetrics::fixed(7, 14);  // what `keel export graph` uses
  double padX = 10, padY = 5;                       // label padding inside a node, pixels
  // At and above this many DOT nodes the layout trades some crossing reduction for speed.
  int fastLayoutNodes = 1500;
};

enum class GraphNodeKind { Op, Module };

// One DOT node: an op, or a collapsed module standing for every op under its scope.
struct GraphNode {
  std::string id;  // DOT id: "o<seq>" for an op, "m:<f|b|o>:<scope>" for a module
  GraphNodeKind kind = GraphNodeKind::Op;
  uint64_t seq = 0;  // Op: its seq; Module: the first op's
  Phase phase = Phase::Forward;
  std::string scope;             // Op: the scope it is drawn in; Module: the module's scope path
  std::string title;             // Op: name; Module: scope path (drawn bold)
  std::string subtitle;          // Op: first output shape and dtype; Module: "N ops"
  std::vector<uint64_t> seqs;    // the ops it stands for (one for an op node), by seq
  double width = 0, height = 0;  // pixels (= Graphviz points)
};

// A module drawn expanded: a Graphviz cluster around its ops and sub-modules.
struct GraphCluster {
  std::string id;  // DOT subgraph name: "cluster_<f|b|o>:<scope>", "cluster_<f|b>" per phase
  Phase phase = Phase::Forward;
  std::string scope;  // "" for the per-phase cluster of Both
  std::string label;  // drawn at its top-left, in the bold font
  int depth = 0;      // nesting: 0 for top level
};

// A data edge between two drawn nodes (after merging): `tensors` tensors flow along it.
struct GraphEdge {
  int from = 0, to = 0;  // indices into GraphDot::nodes, producer -> consumer
  int tensors = 1;
};

// A forward node and the backward node that differentiates (one of) its ops (Both only; drawn by
// the view, not laid out: see Note [Graph shape]).
struct GraphLink {
  int forward = 0, backward = 0;  // indices into GraphDot::nodes
};

struct GraphDot {
  std::string dot;
  std::vector<GraphNode> nodes;  // in DOT order
  std::vector<GraphEdge> edges;
  std::vector<GraphCluster> clusters;
  std::vector<GraphLink> links;
  // Data edges that cross phases (a backward node reading a forward node's output: a saved
  // activation), merged like `edges`, `from` the forward node (Both only). Not in the DOT: the
  // view draws a node's on demand (Note [Cross-phase relations]).
  std::vector<GraphEdge> crossEdges;
  std::unordered_map<uint64_t, int> nodeOfOp;  // every op shown -> its node (op or module)
  std::unordered_map<std::string, int> nodeOfId;
  // Ops drawn in another module than their recorded scope: see Note [Adopted scopes].
  std::unordered_map<uint64_t, std::string> adoptedScope;
  int opNodes = 0, moduleNodes = 0;
};

// The first line of every DOT text buildGraphDot writes (the graph is named "step"): how
// `keel export graph` tells an earlier export it may replace from the user's own files.
inline constexpr std::string_view kGraphDotStart = "digraph step {\n";

// Builds the graph of `ops` (one step, every phase, by seq: what Recording::stepOps returns). Edges
// join each op to the producers of its inputs (buildDataflow, Note [Producer]); a collapsed
// module's edges are merged, edges inside it dropped. Every node carries its label (drawn by
// Graphviz when the DOT is rendered as such, ignored by layoutGraph: Note [Labels in the DOT]).
GraphDot buildGraphDot(std::span<const storage::OpRecord> ops, const GraphDotOptions& options);

// The DOT id of the node a collapsed module is drawn as, "m:<f|b|o>:<scope>": GraphNode::id and
// the key of GraphDot::nodeOfId for a module node.
std::string moduleNodeId(Phase phase, std::string_view scope);

// The module an op is drawn in: its scope, or the one `graph` adopted it into.
std::string_view drawnScope(const GraphDot& graph, const storage::OpRecord& op);

// "blocks.1.attn" -> {"blocks", "blocks.1", "blocks.1.attn"}; "" -> {}.
std::vector<std::string> scopePrefixes(std::string_view scope);

// The scopes to expand when a graph opens: none at first (top-level modules collapsed), then
// level by level while the graph stays within `maxNodes` drawn nodes.
std::unordered_set<std::string> initialExpansion(std::span<const storage::OpRecord> ops,
                                                 GraphPhase phase, int maxNodes);

// Ops `ops` would draw with `phase` (the count a fully expanded graph shows).
int64_t countGraphOps(std::span<const storage::OpRecord> ops, GraphPhase phase);

}  // namespace keel::analysis
