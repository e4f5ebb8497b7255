// The dataflow of a hand-made step (every input's producer, Note [Producer]) and the graph's DOT
// text built from it, as text: labels and phase colours, collapsed modules, both phases mirrored,
// the forward <-> backward links, the opening expansion. What the studio lays out and `keel
// export graph` writes (tests/views/graph_test.cpp checks that the two agree on a recording).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "keel/analysis/dataflow.h"
#include "keel/analysis/graph_dot.h"
#include "small_step.h"

namespace keel::analysis {
namespace {

// The graph, node and edge attributes every step's DOT opens with.
const std::string kDotHead =
    "digraph step {\n"
    "  graph [rankdir=TB, nodesep=0.25, ranksep=0.3, fontsize=10];\n"
    "  node [shape=box, fixedsize=true, fontname=\"Helvetica\", fontsize=10];\n"
    "  edge [arrowsize=0.6];\n";

using storage::OpRecord;
using test::smallStep;

// A module's label: a fixed-size table (18 = 14 + 4 px high) holding the scope in bold.
std::string label(int width, const std::string& text) {
  return "label=<<TABLE BORDER=\"0\" CELLSPACING=\"0\" CELLPADDING=\"0\" FIXEDSIZE=\"TRUE\" "
         "WIDTH=\"" +
         std::to_string(width) + "\" HEIGHT=\"18\"><TR><TD><B>" + text +
         "</B></TD></TR></TABLE>>; labeljust=l;\n";
}

// --- Dataflow -----------------------------------------------------------------------------------

TEST(Dataflow, EachInputIsFedByTheLatestEarlierOutputOfItsValue) {
  const auto ops = smallStep();
  const Dataflow d = buildDataflow(ops);
  ASSERT_EQ(d.producers.size(), ops.size());
  using P = std::vector<uint32_t>;  // indices into ops (seq - 1)
  EXPECT_EQ(d.producers[0], P{});   // embedding reads nothing
  EXPECT_EQ(d.producers[1], P{0});
  EXPECT_EQ(d.producers[4], (P{0, 3}));  // the residual add reads the embedding and softmax
  EXPECT_EQ(d.producers[5], P{4});       // add_ reads tensor 14 v0 from add
  EXPECT_EQ(d.producers[6], P{5});       // sum reads v1, written in place by add_, not v0
  EXPECT_EQ(d.producers[7], P{});        // the seed gradient: a leaf
  // softmax_backward reads the saved softmax output: a forward producer across phases.
  EXPECT_EQ(d.producers[9], (P{8, 3}));
  EXPECT_EQ(d.producers[10], (P{8, 9}));
  EXPECT_EQ(d.producers[11], P{10});
}

TEST(Dataflow, OnlyTheOpsGivenAreSearched) {
  auto ops = smallStep();
  // Without the forward ops, the backward pass's read of the saved activation has no producer.
  const std::vector<OpRecord> backward(ops.begin() + 7, ops.begin() + 11);
  const Dataflow d = buildDataflow(backward);
  EXPECT_EQ(d.producers[2], std::vector<uint32_t>{1});  // softmax_backward: only add (#9)
}

// --- DOT text -----------------------------------------------------------------------------------

TEST(GraphDot, ForwardGraphAsText) {
  const auto ops = smallStep();
  GraphDotOptions o;
  o.phase = GraphPhase::Forward;
  o.metrics = TextMetrics::fixed(7, 14);
  const GraphDot g = buildGraphDot(ops, o);
  // Heights: 2 lines of 14 + 2 * 5 padding = 38 px = 0.5278 in; widths from 7 px characters.
  const std::string expected =
      kDotHead +
      "  \"o6\" [label=\"add_\\n[4,8] f32\", width=1.1528, height=0.5278];\n"
      "  \"o7\" [label=\"sum\\n[4,8] f32\", width=1.1528, height=0.5278];\n"
      "subgraph \"cluster_f:wte\" {\n"
      "  " +
      label(33, "wte") +
      "  \"o1\" [label=\"embedding\\n[4,8] f32\", width=1.1528, height=0.5278];\n"
      "}\n"
      "subgraph \"cluster_f:blocks\" {\n"
      "  " +
      label(54, "blocks") +
      "  subgraph \"cluster_f:blocks.0\" {\n"
      "    " +
      label(68, "blocks.0") +
      "    \"o5\" [label=\"add\\n[4,8] f32\", width=1.1528, height=0.5278];\n"
      "    subgraph \"cluster_f:blocks.0.norm1\" {\n"
      "      " +
      label(110, "blocks.0.norm1") +
      "      \"o2\" [label=\"layer_norm\\n[4,8] f32\", width=1.2500, height=0.5278];\n"
      "    }\n"
      "    subgraph \"cluster_f:blocks.0.attn\" {\n"
      "      " +
      label(103, "blocks.0.attn") +
      "      \"o3\" [label=\"matmul\\n[4,8] f32\", width=1.1528, height=0.5278];\n"
      "      \"o4\" [label=\"softmax\\n[4,8] f32\", width=1.1528, height=0.5278];\n"
      "    }\n"
      "  }\n"
      "}\n"
      "  \"o1\" -> \"o2\";\n"
      "  \"o2\" -> \"o3\";\n"
      "  \"o3\" -> \"o4\";\n"
      "  \"o1\" -> \"o5\";\n"
      "  \"o4\" -> \"o5\";\n"
      "  \"o5\" -> \"o6\";\n"
      "  \"o6\" -> \"o7\";\n"
      "}\n";
  EXPECT_EQ(g.dot, expected);
  EXPECT_EQ(g.opNodes, 7);
  EXPECT_EQ(g.moduleNodes, 0);
  EXPECT_EQ(g.clusters.size(), 5u);
  const GraphNode& norm = g.nodes[size_t(g.nodeOfOp.at(2))];
  EXPECT_EQ(norm.title, "layer_norm");
  EXPECT_EQ(norm.subtitle, "[4,8] f32");
  EXPECT_EQ(norm.width, 90.0);  // "layer_norm" 70 + 2 * 10
  EXPECT_EQ(norm.height, 38.0);
  EXPECT_TRUE(g.links.empty());
}

TEST(GraphDot, EdgesFollowTensorVersions) {
  const auto ops = smallStep();
  GraphDotOptions o;
  o.phase = GraphPhase::Forward;
  const GraphDot g = buildGraphDot(ops, o);
  // sum (#7) reads tensor 14 version 1, written in place by add_ (#6), not version 0 by add (#5).
  auto hasEdge = [&](uint64_t from, uint64_t to) {
    return std::any_of(g.edges.begin(), g.edges.end(), [&](const GraphEdge& e) {
      return e.from == g.nodeOfOp.at(from) && e.to == g.nodeOfOp.at(to);
    });
  };
  EXPECT_TRUE(hasEdge(6, 7));
  EXPECT_FALSE(hasEdge(5, 7));
  EXPECT_TRUE(hasEdge(5, 6));
  EXPECT_EQ(g.edges.size(), 7u);
}

TEST(GraphDot, CollapsedModulesMergeEdges) {
  const auto ops = smallStep();
  GraphDotOptions o;
  o.phase = GraphPhase::Forward;
  o.expandAll = false;  // nothing expanded: top-level modules only
  const GraphDot g = buildGraphDot(ops, o);
  const std::string expected =
      kDotHead +
      "  \"m:f:wte\" [label=\"wte\\n1 op, 500 ns, 128 B\", width=2.2083, height=0.6111, "
      "style=bold];\n"
      "  \"m:f:blocks\" [label=\"blocks\\n4 ops, 2.0 µs, 512 B\", width=2.3056, height=0.6111, "
      "style=bold];\n"
      "  \"o6\" [label=\"add_\\n[4,8] f32\", width=1.1528, height=0.5278];\n"
      "  \"o7\" [label=\"sum\\n[4,8] f32\", width=1.1528, height=0.5278];\n"
      "  \"m:f:wte\" -> \"m:f:blocks\" [penwidth=2];\n"
      "  \"m:f:blocks\" -> \"o6\";\n"
      "  \"o6\" -> \"o7\";\n"
      "}\n";
  EXPECT_EQ(g.dot, expected);
  EXPECT_EQ(g.opNodes, 2);
  EXPECT_EQ(g.moduleNodes, 2);
  // moduleNodeId is the id the view looks a module up by (GraphView::moduleItem).
  EXPECT_EQ(moduleNodeId(Phase::Forward, "blocks"), "m:f:blocks");
  EXPECT_EQ(moduleNodeId(Phase::Optimizer, "wte"), "m:o:wte");
  const GraphNode& blocks = g.nodes[size_t(g.nodeOfId.at(moduleNodeId(Phase::Forward, "blocks")))];
  EXPECT_EQ(blocks.id, "m:f:blocks");
  EXPECT_EQ(blocks.kind, GraphNodeKind::Module);
  EXPECT_EQ(blocks.subtitle, "4 ops, 2.0 µs, 512 B");  // Note [Module summary]
  EXPECT_EQ(blocks.seqs, (std::vector<uint64_t>{2, 3, 4, 5}));
  // Two tensors (into the norm and the residual add) flow from wte into blocks: one edge.
  ASSERT_EQ(g.edges.size(), 3u);
  EXPECT_EQ(g.edges[0].tensors, 2);

  // Expanding blocks shows blocks.0 as a module inside the blocks cluster.
  o.expanded = {"blocks"};
  const GraphDot g2 = buildGraphDot(ops, o);
  EXPECT_EQ(g2.moduleNodes, 2);  // wte, blocks.0
  EXPECT_TRUE(g2.nodeOfId.count("m:f:blocks.0"));
  ASSERT_EQ(g2.clusters.size(), 1u);
  EXPECT_EQ(g2.clusters[0].id, "cluster_f:blocks");
}

TEST(GraphDot, BothPhasesMirrorBackwardAndLinkPartners) {
  const auto ops = smallStep();
  GraphDotOptions o;  // Both: forward and backward, optimizer left out
  const GraphDot g = buildGraphDot(ops, o);
  EXPECT_EQ(g.opNodes, 11);
  EXPECT_FALSE(g.nodeOfOp.count(12));
  // Backward edges are written consumer -> producer, drawn with the arrow at the consumer.
  EXPECT_NE(g.dot.find("  \"o9\" -> \"o8\" [dir=back];\n"), std::string::npos) << g.dot;
  EXPECT_NE(g.dot.find("  \"o10\" -> \"o9\" [dir=back];\n"), std::string::npos);
  // Saved activations (forward #4's output read by #10) cross phases: not laid out.
  EXPECT_EQ(g.dot.find("\"o4\" -> \"o10\""), std::string::npos);
  EXPECT_EQ(g.dot.find("\"o10\" -> \"o4\""), std::string::npos);
  EXPECT_NE(g.dot.find("subgraph \"cluster_f\" {"), std::string::npos);
  EXPECT_NE(g.dot.find("subgraph \"cluster_b\" {"), std::string::npos);
  // Backward nodes are filled with the backward colour.
  EXPECT_NE(g.dot.find("\"o8\" [label=\"sum_backward\\n[4,8] f32\", width=1.4444, "
                       "height=0.5278, style=filled, fillcolor=\"#fde2c8\"];"),
            std::string::npos)
      << g.dot;
  // The accumulation (#11, scope "") is drawn in blocks.0, the module around its inputs.
  EXPECT_EQ(g.adoptedScope.at(11), "blocks.0");
  EXPECT_EQ(g.nodes[size_t(g.nodeOfOp.at(11))].scope, "blocks.0");
  EXPECT_EQ(std::string(drawnScope(g, ops[10])), "blocks.0");
  // Forward <-> backward links: sum/sum_backward, add/add, softmax/softmax_backward.
  std::vector<std::pair<uint64_t, uint64_t>> links;
  for (const auto& l : g.links)
    links.emplace_back(g.nodes[size_t(l.forward)].seq, g.nodes[size_t(l.backward)].seq);
  std::sort(links.begin(), links.end());
  EXPECT_EQ(links, (std::vector<std::pair<uint64_t, uint64_t>>{{4, 10}, {5, 9}, {7, 8}}));
  // The saved activation is listed as a cross-phase edge instead, forward -> backward
  // (Note [Cross-phase relations]); it is in no edge of the layout.
  ASSERT_EQ(g.crossEdges.size(), 1u);
  EXPECT_EQ(g.nodes[size_t(g.crossEdges[0].from)].seq, 4u);
  EXPECT_EQ(g.nodes[size_t(g.crossEdges[0].to)].seq, 10u);
  EXPECT_EQ(g.crossEdges[0].tensors, 1);
  for (const auto& e : g.edges)
    EXPECT_EQ(g.nodes[size_t(e.from)].phase, g.nodes[size_t(e.to)].phase);
  // One phase: the backward graph alone has no cross-phase edges, its saved input no node.
  o.phase = GraphPhase::Backward;
  EXPECT_TRUE(buildGraphDot(ops, o).crossEdges.empty());
}

TEST(GraphDot, OptimizerModulesAndLabelsAreEscaped) {
  auto ops = smallStep();
  ops[0].name = "say \"hi\"\\";  // DOT string escapes
  ops[0].scope = "a&b";          // HTML escapes in the cluster label
  GraphDotOptions o;
  o.phase = GraphPhase::Forward;
  const GraphDot g = buildGraphDot(ops, o);
  EXPECT_NE(g.dot.find("[label=\"say \\\"hi\\\"\\\\\\n[4,8] f32\""), std::string::npos) << g.dot;
  EXPECT_NE(g.dot.find("<TD><B>a&amp;b</B></TD>"), std::string::npos) << g.dot;
  EXPECT_NE(g.dot.find("subgraph \"cluster_f:a&b\" {"), std::string::npos) << g.dot;

  o.phase = GraphPhase::Optimizer;
  o.expandAll = false;
  const GraphDot opt = buildGraphDot(ops, o);
  EXPECT_NE(
      opt.dot.find("\"m:o:wte\" [label=\"wte\\n1 op, 500 ns, 128 B\", width=2.2083, height=0.6111, "
                   "style=\"filled,bold\", fillcolor=\"#dfe9d8\"];"),
      std::string::npos)
      << opt.dot;
}

TEST(GraphDot, InitialExpansionStaysWithinBudget) {
  const auto ops = smallStep();
  // Top level: add_, sum, wte, blocks = 4 nodes; one level down: 6.
  EXPECT_EQ(initialExpansion(ops, GraphPhase::Forward, 3), (std::unordered_set<std::string>{}));
  EXPECT_EQ(initialExpansion(ops, GraphPhase::Forward, 4),
            (std::unordered_set<std::string>{"wte", "blocks"}));
  EXPECT_EQ(initialExpansion(ops, GraphPhase::Forward, 100),
            (std::unordered_set<std::string>{"wte", "blocks", "blocks.0", "blocks.0.norm1",
                                             "blocks.0.attn"}));
  EXPECT_EQ(countGraphOps(ops, GraphPhase::Both), 11);
  EXPECT_EQ(scopePrefixes("blocks.1.attn"),
            (std::vector<std::string>{"blocks", "blocks.1", "blocks.1.attn"}));
  EXPECT_EQ(parseGraphPhase("backward"), GraphPhase::Backward);
  EXPECT_EQ(std::string(toString(parseGraphPhase("nonsense"))), "both");
}

}  // namespace
}  // namespace keel::analysis
