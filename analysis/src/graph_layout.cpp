// Graph layout with Graphviz (cgraph + gvc, `dot` engine): see graph_layout.h. One GVC context for
// the process, created on first use and used only under gMutex (Graphviz is not re-entrant:
// its parser, error state and layout scratch data are global).
#include "keel/analysis/graph_layout.h"

#include <graphviz/cgraph.h>
#include <graphviz/gvc.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <vector>

namespace keel::analysis {

bool LayoutRect::contains(LayoutPoint p) const {
  return p.x >= x && p.x <= x + width && p.y >= y && p.y <= y + height;
}

bool LayoutRect::contains(const LayoutRect& r) const {
  return r.x >= x && r.y >= y && r.x + r.width <= x + width && r.y + r.height <= y + height;
}

namespace {

std::mutex gMutex;
std::string gErrors;  // collected by onGraphvizError while gMutex is held

int onGraphvizError(char* message) {
  if (gErrors.size() < 4096) gErrors += message;
  return 0;
}

GVC_t* context() {
  static GVC_t* gvc = [] {
    agseterrf(onGraphvizError);
    agseterr(AGERR);  // warnings (e.g. "node too small for label") are not errors here
    return gvContext();
  }();
  return gvc;
}

struct Flip {
  double top;
  LayoutPoint operator()(pointf p) const { return {p.x, top - p.y}; }
  LayoutRect operator()(boxf b) const {
    return {b.LL.x, top - b.UR.y, b.UR.x - b.LL.x, b.UR.y - b.LL.y};
  }
};

void collectClusters(Agraph_t* g, const Flip& flip, std::vector<LaidOutCluster>& out) {
  for (int i = 1; i <= GD_n_cluster(g); ++i) {
    Agraph_t* c = GD_clust(g)[i];
    LaidOutCluster lc;
    lc.id = agnameof(c);
    lc.box = flip(GD_bb(c));
    if (textlabel_t* l = GD_label(c)) {
      LayoutPoint center = flip(l->pos);
      lc.labelBox = {center.x - l->dimen.x / 2, center.y - l->dimen.y / 2, l->dimen.x, l->dimen.y};
    }
    out.push_back(std::move(lc));
    collectClusters(c, flip, out);
  }
}

// Every node's label set to "": See Note [Labels in the DOT] (graph_dot.cpp).
void blankNodeLabels(Agraph_t* g) {
  Agsym_t* label = agattr(g, AGNODE, const_cast<char*>("label"), nullptr);
  if (!label) return;
  char empty[] = "";
  for (Agnode_t* n = agfstnode(g); n; n = agnxtnode(g, n)) agxset(n, label, empty);
}

// `dot` read and laid out by the dot engine (the caller holds gMutex, and frees the result with
// gvFreeLayout and agclose), `prepare` run on it first; nullptr after setting `error`.
Agraph_t* readAndLayOut(GVC_t* gvc, const std::string& dot, std::string& error,
                        void (*prepare)(Agraph_t*) = nullptr) {
  gErrors.clear();
  Agraph_t* g = agmemread(dot.c_str());
  if (!g) {
    error = "Graphviz could not read the graph: " + (gErrors.empty() ? "syntax error" : gErrors);
    return nullptr;
  }
  if (prepare) prepare(g);
  if (gvLayout(gvc, g, "dot") != 0) {
    error = "Graphviz layout failed: " + gErrors;
    agclose(g);
    return nullptr;
  }
  return g;
}

// dot laid out (the caller holds gMutex).
GraphLayout layoutGraphLocked(const std::string& dot) {
  GraphLayout r;
  const auto t0 = std::chrono::steady_clock::now();
  GVC_t* gvc = context();
  Agraph_t* g = readAndLayOut(gvc, dot, r.error, blankNodeLabels);
  if (!g) return r;
  const boxf bb = GD_bb(g);
  const Flip flip{bb.UR.y};
  r.bounds = flip(bb);
  r.nodes.reserve(size_t(agnnodes(g)));
  r.edges.reserve(size_t(agnedges(g)));
  for (Agnode_t* n = agfstnode(g); n; n = agnxtnode(g, n)) {
    r.nodes.push_back({agnameof(n), flip(ND_coord(n)), ND_width(n) * 72, ND_height(n) * 72});
    for (Agedge_t* e = agfstout(g, n); e; e = agnxtout(g, e)) {
      LaidOutEdge le;
      le.tail = agnameof(agtail(e));
      le.head = agnameof(aghead(e));
      // dot gives one Bezier per edge (several only for compound edges, which we never write).
      if (const splines* s = ED_spl(e); s && s->size > 0) {
        const bezier& b = s->list[0];
        le.points.reserve(size_t(b.size));
        for (int k = 0; k < b.size; ++k) le.points.push_back(flip(b.list[k]));
        le.arrowAtTail = b.sflag != 0;
        le.arrowAtHead = b.eflag != 0;
        if (b.sflag) le.tailTip = flip(b.sp);
        if (b.eflag) le.headTip = flip(b.ep);
      }
      r.edges.push_back(std::move(le));
    }
  }
  collectClusters(g, flip, r.clusters);
  gvFreeLayout(gvc, g);
  agclose(g);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace

// Note [One layout per graph]: Graphviz's dot lays the same graph out differently the second time
// in a process, and differently from run to run (measured: the first layout of a step's DOT was
// the same in every run; the second, of the same text, differed each time, with a fresh context
// or a layout in between alike), so two panes comparing the same step drew it two ways. The
// last few layouts are kept by their DOT text: the same graph is drawn the same way, in both
// panes and when a step is shown again.
GraphLayout layoutGraph(const std::string& dot) {
  constexpr size_t kKept = 8;
  static std::vector<std::pair<std::string, GraphLayout>> kept;  // most recent last; gMutex
  std::lock_guard lock(gMutex);
  for (size_t i = 0; i < kept.size(); ++i)
    if (kept[i].first == dot) {
      std::rotate(kept.begin() + std::ptrdiff_t(i), kept.begin() + std::ptrdiff_t(i) + 1,
                  kept.end());
      return kept.back().second;
    }
  GraphLayout r = layoutGraphLocked(dot);
  if (r.error.empty()) {
    if (kept.size() == kKept) kept.erase(kept.begin());
    kept.emplace_back(dot, r);
  }
  return r;
}

GraphSvg renderSvg(const std::string& dot) {
  GraphSvg r;
  std::lock_guard lock(gMutex);
  GVC_t* gvc = context();
  Agraph_t* g = readAndLayOut(gvc, dot, r.error);
  if (!g) return r;
  char* data = nullptr;
  unsigned int len = 0;
  if (gvRenderData(gvc, g, "svg", &data, &len) == 0 && data) r.svg.assign(data, len);
  gvFreeRenderData(data);
  gvFreeLayout(gvc, g);
  agclose(g);
  // An error Graphviz reported on the way (a label it could not parse, drawn as its raw text) is
  // the render's error: the picture is not what the DOT says. (Warnings are not reported at all:
  // context().)
  if (r.svg.empty() || !gErrors.empty()) {
    std::string why = gErrors.empty() ? std::string("no output") : gErrors;
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    r.error = "Graphviz could not render SVG: " + why;
    r.svg.clear();
  }
  return r;
}

}  // namespace keel::analysis
