// DOT text for one step's op graph: see graph_dot.h. Pure string building over the records, linear
// in ops and tensors (hash maps, no sorting of the ops), so it runs on 20,000-op steps in
// milliseconds on the layout worker.
#include "keel/analysis/graph_dot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <utility>

#include "keel/analysis/dataflow.h"
#include "keel/analysis/module_summary.h"
#include "keel/base/dtype.h"

namespace keel::analysis {

// Note [Graph shape]
// Modules are clusters keyed by (phase, scope): with both phases shown, the forward ops of
// blocks.1 and its backward ops are two clusters, inside a "forward" and a "backward" cluster. One
// cluster holding both would span the whole height of the graph (its forward ops run early, its
// backward ops late) and dot would tangle every module around it.
// With both phases the backward data edges are written reversed (consumer -> producer with
// dir=back): the drawing keeps its arrows, but the gradient flows bottom-up, so the backward graph
// mirrors the forward one beside it and an op's gradient sits at about its height. Data edges that
// cross phases (a backward op reading a saved activation) are left out of that layout: there are
// about as many of them as backward ops, each would span the graph, and they would pin the
// backward graph below the forward one; routing them through dot (even with constraint=false)
// adds a chain of virtual nodes per rank crossed, each kept out of the clusters between its ends.
// They are listed instead (GraphDot::crossEdges), with the forward <->
// backward links (GraphDot::links), and the view draws a node's after layout, when it is selected
// or hovered (Note [Cross-phase relations], graph_view_scene.cpp).
// Node sizes come from the view's font metrics and are fixed (fixedsize=true), so Graphviz never
// sizes a node by its text (its estimate differs from Qt's); cluster labels reserve their space
// with a fixed-size HTML table. The view draws every label itself.

// Note [Labels in the DOT]
// The DOT is also what `keel export graph` writes, for people and for `dot -Tsvg`, so it carries
// what a reader needs: each node's label (name over output shape, or module over op count), the
// phase as a fill colour, each cluster's scope path inside its fixed-size label table. None of it
// moves anything: node and cluster-label sizes are fixed. For the studio, layoutGraph blanks the
// node labels after parsing: Graphviz would otherwise lay out every label's text with pango, which
// changes no position and costs a quarter more layout time (1.42 s instead of 1.15 s for 5,042
// ops, BM_GraphExpanded5k); cluster labels are few and stay.
// The cross-phase edges and the forward <-> backward links are not in the text (Note [Graph
// shape]): the studio draws them.

// Note [Adopted scopes]
// Autograd's gradient accumulation (an `add` summing two gradients of one tensor) runs outside any
// module: its scope is "" and it differentiates no forward op. Left at the top level it would sit
// outside the module clusters, between them (the residual stream's gradient passes through one in
// every block), and dot, which cannot put a node inside a cluster it does not belong to, would lay
// the blocks side by side around it. So such an op is drawn in a module: the innermost one holding
// every op that fed it, or, when deeper, the module around the last of them (the residual gradient
// of blocks.1's input sums the gradient from above with blocks.1.norm1's: it goes in blocks.1).
// The op keeps its recorded scope; GraphDot::adoptedScope lists the ones drawn elsewhere.

GraphPhase parseGraphPhase(std::string_view text) {
  if (text == "forward") return GraphPhase::Forward;
  if (text == "backward") return GraphPhase::Backward;
  if (text == "optimizer") return GraphPhase::Optimizer;
  return GraphPhase::Both;
}

const char* toString(GraphPhase phase) {
  switch (phase) {
    case GraphPhase::Forward:
      return "forward";
    case GraphPhase::Backward:
      return "backward";
    case GraphPhase::Optimizer:
      return "optimizer";
    case GraphPhase::Both:
      break;
  }
  return "both";
}

bool inGraphPhase(const storage::OpRecord& op, GraphPhase phase) {
  switch (phase) {
    case GraphPhase::Forward:
      return op.phase == Phase::Forward;
    case GraphPhase::Backward:
      return op.phase == Phase::Backward;
    case GraphPhase::Optimizer:
      return op.phase == Phase::Optimizer;
    case GraphPhase::Both:
      break;
  }
  return op.phase == Phase::Forward || op.phase == Phase::Backward;
}

TextMetrics TextMetrics::fixed(double charWidth, double lineHeight) {
  TextMetrics m;
  for (size_t c = 32; c < 127; ++c) m.regular[c] = m.bold[c] = charWidth;
  m.lineHeight = lineHeight;
  return m;
}

double TextMetrics::width(std::string_view text, bool boldFont) const {
  const auto& table = boldFont ? bold : regular;
  double w = 0, widest = -1;
  for (char ch : text) {
    auto c = static_cast<unsigned char>(ch);
    if (c < 128) {
      w += table[c];
    } else if ((c & 0xC0) != 0x80) {  // the lead byte of a UTF-8 sequence: one character
      if (widest < 0) widest = *std::max_element(table.begin(), table.end());
      w += widest;
    }
  }
  return w;
}

std::vector<std::string> scopePrefixes(std::string_view scope) {
  std::vector<std::string> r;
  if (scope.empty()) return r;
  for (size_t i = 0; i < scope.size(); ++i)
    if (scope[i] == '.') r.emplace_back(scope.substr(0, i));
  r.emplace_back(scope);
  return r;
}

int64_t countGraphOps(std::span<const storage::OpRecord> ops, GraphPhase phase) {
  int64_t n = 0;
  for (const auto& op : ops) n += inGraphPhase(op, phase) ? 1 : 0;
  return n;
}

namespace {

char phaseLetter(Phase phase) {
  return phase == Phase::Forward ? 'f' : phase == Phase::Backward ? 'b' : 'o';
}

size_t scopeDepth(std::string_view scope) {
  return scope.empty() ? 0 : size_t(std::count(scope.begin(), scope.end(), '.')) + 1;
}

std::string_view parentScope(std::string_view scope) {
  size_t dot = scope.rfind('.');
  return dot == std::string_view::npos ? std::string_view() : scope.substr(0, dot);
}

// DOT quoted-string body (also safe inside our HTML-less labels): escapes quotes and backslashes.
void appendEscaped(std::string& out, std::string_view s) {
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
}

void appendQuoted(std::string& out, std::string_view s) {
  out += '"';
  appendEscaped(out, s);
  out += '"';
}

// Text inside an HTML-like label: escapes the markup characters.
void appendHtmlEscaped(std::string& out, std::string_view s) {
  for (char c : s) {
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
}

void appendNumber(std::string& out, double v, int decimals) {
  char buf[32];
  int n = std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  out.append(buf, size_t(n));
}

// The vocabulary's short name ("f32"); a dtype the engine has none for as recorded (records.h).
std::string dtypeShort(const std::string& dtype) {
  if (const std::optional<DType> t = tryParseDType(dtype)) return std::string(dtypeShortName(*t));
  return dtype;
}

std::string outputText(const storage::OpRecord& op) {
  for (const auto& t : op.tensors) {
    if (t.role != storage::Role::Output) continue;
    std::string r = "[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) r += ',';
      r += std::to_string(t.shape[i]);
    }
    r += "] ";
    r += dtypeShort(t.dtype);
    return r;
  }
  return "";
}

// One cluster being built: a module drawn expanded (or the root of a phase).
struct ClusterTree {
  std::string scope;
  std::vector<int> children;  // indices into the phase's trees, in first-seen order
  std::vector<int> nodes;     // indices into GraphDot::nodes, in first-seen order
};

struct PhaseTrees {
  char letter = 'f';
  Phase phase = Phase::Forward;
  std::vector<ClusterTree> trees;  // [0] is the phase root (scope "")
  std::unordered_map<std::string, int> byScope;

  int cluster(std::string_view scope) {
    if (scope.empty()) return 0;
    auto it = byScope.find(std::string(scope));
    if (it != byScope.end()) return it->second;
    int parent = cluster(parentScope(scope));
    int idx = int(trees.size());
    trees.push_back({std::string(scope), {}, {}});
    trees[size_t(parent)].children.push_back(idx);
    byScope.emplace(std::string(scope), idx);
    return idx;
  }
};

void appendClusterLabel(std::string& out, const std::string& label, const GraphDotOptions& o) {
  int w = int(std::ceil(o.metrics.width(label, true) + 12));
  int h = int(std::ceil(o.metrics.lineHeight + 4));
  out +=
      "label=<<TABLE BORDER=\"0\" CELLSPACING=\"0\" CELLPADDING=\"0\" FIXEDSIZE=\"TRUE\" WIDTH=\"";
  out += std::to_string(w);
  out += "\" HEIGHT=\"";
  out += std::to_string(h);
  out += "\"><TR><TD><B>";
  appendHtmlEscaped(out, label);
  out += "</B></TD></TR></TABLE>>; labeljust=l;\n";
}

void emitTree(std::string& out, GraphDot& g, PhaseTrees& pt, int treeIdx, int depth,
              bool phaseCluster, const GraphDotOptions& o) {
  const ClusterTree& t = pt.trees[size_t(treeIdx)];
  std::string indent(size_t(depth) * 2 + 2, ' ');
  const bool isCluster = treeIdx != 0 || phaseCluster;
  if (isCluster) {
    GraphCluster c;
    c.id = "cluster_";
    c.id += pt.letter;
    if (treeIdx != 0) c.id += ":" + t.scope;
    c.phase = pt.phase;
    c.scope = t.scope;
    c.label = treeIdx != 0 ? t.scope : std::string(phaseName(pt.phase));
    c.depth = depth;
    out.append(indent.size() - 2, ' ');
    out += "subgraph ";
    appendQuoted(out, c.id);
    out += " {\n";
    out += indent;
    appendClusterLabel(out, c.label, o);
    g.clusters.push_back(std::move(c));
  }
  for (int n : t.nodes) {
    const GraphNode& node = g.nodes[size_t(n)];
    out += indent;
    appendQuoted(out, node.id);
    out += " [label=\"";
    appendEscaped(out, node.title);
    out += "\\n";
    appendEscaped(out, node.subtitle);
    out += "\", width=";
    appendNumber(out, node.width / 72.0, 4);
    out += ", height=";
    appendNumber(out, node.height / 72.0, 4);
    const bool module = node.kind == GraphNodeKind::Module;
    const char* fill = node.phase == Phase::Backward    ? "#fde2c8"
                       : node.phase == Phase::Optimizer ? "#dfe9d8"
                                                        : nullptr;
    if (fill) {
      out += module ? ", style=\"filled,bold\", fillcolor=\"" : ", style=filled, fillcolor=\"";
      out += fill;
      out += '"';
    } else if (module) {
      out += ", style=bold";
    }
    out += "];\n";
  }
  for (int child : t.children) emitTree(out, g, pt, child, depth + (isCluster ? 1 : 0), false, o);
  if (isCluster) {
    out.append(indent.size() - 2, ' ');
    out += "}\n";
  }
}

// Per op (by index): whether the filter shows it, the ops that wrote its inputs (buildDataflow),
// and the scope it is drawn in. See Note [Adopted scopes].
struct OpScopes {
  std::vector<bool> shown;
  std::vector<std::vector<uint32_t>> producers;  // indices into ops, one per input read
  std::vector<std::string_view> scope;
};

// The longest common module path of two scopes ("blocks.1.attn", "blocks.1" -> "blocks.1").
std::string_view commonScope(std::string_view a, std::string_view b) {
  size_t n = std::min(a.size(), b.size()), end = 0;
  for (size_t i = 0; i <= n; ++i) {
    const bool aEnd = i == a.size() || a[i] == '.', bEnd = i == b.size() || b[i] == '.';
    if (aEnd && bEnd) end = i;
    if (i == n || a[i] != b[i]) break;
  }
  return a.substr(0, end);
}

OpScopes opScopes(std::span<const storage::OpRecord> ops, GraphPhase phase) {
  OpScopes r;
  r.shown.resize(ops.size());
  r.producers = buildDataflow(ops).producers;
  r.scope.resize(ops.size());
  // By seq, so an accumulation's producers have their drawn scopes before it is placed.
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& op = ops[i];
    r.shown[i] = inGraphPhase(op, phase);
    r.scope[i] = op.scope;
    if (op.scope.empty() && op.phase == Phase::Backward && op.forwardSeq == 0) {
      bool first = true;
      std::string_view common;
      uint32_t latest = 0;
      for (uint32_t p : r.producers[i]) {
        if (ops[p].phase != op.phase) continue;
        common = first ? r.scope[p] : commonScope(common, r.scope[p]);
        latest = first ? p : std::max(latest, p);
        first = false;
      }
      if (!first) {
        std::string_view parent = parentScope(r.scope[latest]);
        r.scope[i] = parent.size() > common.size() ? parent : common;
      }
    }
  }
  return r;
}

}  // namespace

std::string moduleNodeId(Phase phase, std::string_view scope) {
  std::string id = "m:";
  id += phaseLetter(phase);
  id += ':';
  id += scope;
  return id;
}

GraphDot buildGraphDot(std::span<const storage::OpRecord> ops, const GraphDotOptions& options) {
  GraphDot g;
  const bool both = options.phase == GraphPhase::Both;
  const OpScopes sc = opScopes(ops, options.phase);
  PhaseTrees phases[3];
  for (int i = 0; i < 3; ++i) {
    phases[i].letter = "fbo"[i];
    phases[i].phase = Phase(i);
    phases[i].trees.push_back({});
  }
  auto phaseIndex = [](char letter) { return letter == 'f' ? 0 : letter == 'b' ? 1 : 2; };

  // Each shown op goes to its own node, or to the module node of its outermost collapsed scope.
  std::unordered_map<std::string, int> moduleOf;  // "m:<letter>:<scope>" -> node
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& op = ops[i];
    if (!sc.shown[i]) continue;
    const std::string_view scope = sc.scope[i];
    if (scope != op.scope) g.adoptedScope.emplace(op.seq, std::string(scope));
    const char letter = phaseLetter(op.phase);
    PhaseTrees& pt = phases[phaseIndex(letter)];
    std::string_view collapsed;
    bool hidden = false;
    if (!options.expandAll) {
      for (size_t k = 1; k <= scope.size() && !hidden; ++k) {
        if (k < scope.size() && scope[k] != '.') continue;
        std::string_view prefix = scope.substr(0, k);
        if (!options.expanded.count(std::string(prefix))) {
          collapsed = prefix;
          hidden = true;
        }
      }
    }
    if (hidden) {
      std::string id = moduleNodeId(op.phase, collapsed);
      auto [it, fresh] = moduleOf.emplace(id, int(g.nodes.size()));
      if (fresh) {
        GraphNode m;
        m.id = std::move(id);
        m.kind = GraphNodeKind::Module;
        m.seq = op.seq;
        m.phase = op.phase;
        m.scope = std::string(collapsed);
        m.title = m.scope;
        g.nodes.push_back(std::move(m));
        pt.trees[size_t(pt.cluster(parentScope(collapsed)))].nodes.push_back(it->second);
        ++g.moduleNodes;
      }
      g.nodes[size_t(it->second)].seqs.push_back(op.seq);
      g.nodeOfOp.emplace(op.seq, it->second);
    } else {
      GraphNode n;
      n.id = "o" + std::to_string(op.seq);
      n.seq = op.seq;
      n.phase = op.phase;
      n.scope = std::string(scope);
      n.title = op.name;
      n.subtitle = outputText(op);
      n.seqs.push_back(op.seq);
      int idx = int(g.nodes.size());
      g.nodes.push_back(std::move(n));
      pt.trees[size_t(pt.cluster(scope))].nodes.push_back(idx);
      g.nodeOfOp.emplace(op.seq, idx);
      ++g.opNodes;
    }
  }

  const auto& m = options.metrics;
  const std::vector<NonFiniteMark> marks = nonFiniteMarks(ops);
  for (auto& n : g.nodes) {
    if (n.kind == GraphNodeKind::Module)
      n.subtitle =
          summaryLines(summarizeOps(ops, n.seqs, nullptr, &marks))[0];  // Note [Module summary]
    double w = std::max(m.width(n.title, true), m.width(n.subtitle, false));
    n.width = std::ceil(w + 2 * options.padX) + (n.kind == GraphNodeKind::Module ? 6 : 0);
    n.height =
        std::ceil(2 * m.lineHeight + 2 * options.padY) + (n.kind == GraphNodeKind::Module ? 6 : 0);
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) g.nodeOfId.emplace(g.nodes[i].id, int(i));

  // Data edges between drawn nodes (merged), and the forward <-> backward links.
  std::unordered_map<uint64_t, int> edgeOf;  // (from << 32 | to) -> edge
  std::unordered_map<uint64_t, int> crossOf;
  std::unordered_map<uint64_t, int> linkOf;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!sc.shown[i]) continue;
    const auto& op = ops[i];
    const int to = g.nodeOfOp.at(op.seq);
    for (uint32_t p : sc.producers[i]) {
      const auto& src = ops[p];
      if (!sc.shown[p]) continue;
      const int from = g.nodeOfOp.at(src.seq);
      if (from == to) continue;
      const bool cross = both && src.phase != op.phase;
      auto& edges = cross ? g.crossEdges : g.edges;
      uint64_t key = uint64_t(uint32_t(from)) << 32 | uint32_t(to);
      auto [e, fresh] = (cross ? crossOf : edgeOf).emplace(key, int(edges.size()));
      if (fresh)
        edges.push_back({from, to, 1});
      else
        ++edges[size_t(e->second)].tensors;
    }
    if (both && op.phase == Phase::Backward && op.forwardSeq != 0) {
      auto f = g.nodeOfOp.find(op.forwardSeq);
      if (f != g.nodeOfOp.end()) {
        uint64_t key = uint64_t(uint32_t(f->second)) << 32 | uint32_t(to);
        if (linkOf.emplace(key, int(g.links.size())).second) g.links.push_back({f->second, to});
      }
    }
  }

  // The text.
  std::string& out = g.dot;
  out.reserve(g.nodes.size() * 64 + g.edges.size() * 32 + 512);
  out += kGraphDotStart;
  out += "  graph [rankdir=TB, nodesep=0.25, ranksep=0.3, fontsize=10";
  const bool fast = int(g.nodes.size()) >= options.fastLayoutNodes;
  if (fast) out += ", nslimit=0.2";  // caps x-placement iterations: -30% time at 5,000 ops
  out += "];\n  node [shape=box, fixedsize=true, fontname=\"Helvetica\", fontsize=10];\n";
  out += "  edge [arrowsize=0.6];\n";
  for (auto& pt : phases) {
    const ClusterTree& root = pt.trees[0];
    if (root.nodes.empty() && root.children.empty()) continue;
    emitTree(out, g, pt, 0, 0, both, options);
  }
  for (const auto& e : g.edges) {
    const GraphNode& from = g.nodes[size_t(e.from)];
    const GraphNode& to = g.nodes[size_t(e.to)];
    const bool reversed = both && from.phase == Phase::Backward;
    out += "  ";
    appendQuoted(out, reversed ? to.id : from.id);
    out += " -> ";
    appendQuoted(out, reversed ? from.id : to.id);
    if (reversed && e.tensors > 1)
      out += " [dir=back, penwidth=2]";
    else if (reversed)
      out += " [dir=back]";
    else if (e.tensors > 1)
      out += " [penwidth=2]";
    out += ";\n";
  }
  out += "}\n";
  return g;
}

std::unordered_set<std::string> initialExpansion(std::span<const storage::OpRecord> ops,
                                                 GraphPhase phase, int maxNodes) {
  const OpScopes sc = opScopes(ops, phase);
  size_t maxDepth = 0;
  for (size_t i = 0; i < ops.size(); ++i)
    if (sc.shown[i]) maxDepth = std::max(maxDepth, scopeDepth(sc.scope[i]));
  // Nodes drawn when every scope of depth <= level is expanded.
  auto nodesAt = [&](size_t level) {
    int64_t n = 0;
    std::unordered_set<std::string> modules;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (!sc.shown[i]) continue;
      std::string_view s = sc.scope[i];
      if (scopeDepth(s) <= level) {
        ++n;
        continue;
      }
      size_t end = 0;
      for (size_t d = 0; d <= level; ++d) end = s.find('.', d ? end + 1 : 0);
      std::string key(1, phaseLetter(ops[i].phase));
      key += s.substr(0, end);
      modules.insert(std::move(key));
    }
    return n + int64_t(modules.size());
  };
  size_t level = 0;
  while (level < maxDepth && nodesAt(level + 1) <= maxNodes) ++level;
  std::unordered_set<std::string> expanded;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!sc.shown[i]) continue;
    auto prefixes = scopePrefixes(sc.scope[i]);
    for (size_t d = 0; d < prefixes.size() && d < level; ++d) expanded.insert(prefixes[d]);
  }
  return expanded;
}

std::string_view drawnScope(const GraphDot& graph, const storage::OpRecord& op) {
  auto it = graph.adoptedScope.find(op.seq);
  return it != graph.adoptedScope.end() ? std::string_view(it->second) : std::string_view(op.scope);
}

}  // namespace keel::analysis
