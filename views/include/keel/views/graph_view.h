// The graph view: one step's forward and backward op graphs, laid out by Graphviz dot on the thread
// pool and drawn in a QGraphicsView (zoom, pan, fit, minimap, search, module clusters that collapse
// and expand, colouring by phase, op time, bytes, divergence or non-finite outputs, semantic zoom:
// module blocks with their summaries when op labels are too small to read). Follows the shared
// Selection for its side both ways. The GUI never waits for a layout; see Note [Graph view layout].
#pragma once
#include <QColor>
#include <QFont>
#include <QFutureWatcher>
#include <QString>
#include <QStringList>
#include <QWidget>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "keel/analysis/graph_dot.h"
#include "keel/analysis/module_summary.h"
#include "keel/views/run_data.h"

class QAbstractGraphicsShapeItem;
class QComboBox;
class QGraphicsItem;
class QGraphicsScene;
class QGraphicsView;
class QLabel;
class QLineEdit;

namespace keel::views {

class Selection;

class GraphView : public QWidget {
  Q_OBJECT
 public:
  // In the colour box's order. NonFinite: See Note [Non-finite colouring] (analysis).
  enum class ColorMode { Phase, OpTime, Bytes, Divergence, NonFinite };

  // Semantic zoom (Note [Semantic zoom]): at and above this scale op labels are drawn; below it
  // the modules of one depth are drawn as solid blocks with their summary.
  static constexpr double kLabelScale = 0.5;

  // Steps with more ops than this (in the phase filter) open with their modules collapsed.
  static constexpr int kLargeGraphOps = 300;

  GraphView(Selection* selection, Side side, QWidget* parent = nullptr);
  ~GraphView() override;

  void setStep(StepPtr step);  // nullptr empties the view
  StepPtr step() const { return step_; }
  void setDiff(DiffPtr diff);         // the comparison whose verdicts ColorMode::Divergence shows
  void setColorMode(ColorMode mode);  // the user's choice: kept for the recordings that follow
  // A mode the studio picks (divergence once a diff is shown): replaced by the next automatic
  // choice (setRecordingNonFinite), unlike the user's.
  void setAutomaticColorMode(ColorMode mode);
  ColorMode colorMode() const { return colorMode_; }
  // Whether the recording holds a NaN or Inf anywhere (RunSummary::firstNonFiniteSeq): then, and
  // when a step shown has one, the view opens coloured by ColorMode::NonFinite unless a colour
  // mode was chosen (setColorMode).
  void setRecordingNonFinite(bool nonFinite);
  // What a step without ops says beside "No ops recorded in step N" (why the recording has none
  // there: its --step-range, or it holds allocator events only); "" for the generic line.
  void setEmptyStepNote(const QString& note) { emptyStepNote_ = note; }
  // Which run this pane shows ("A: a.db · cpu"), first in the legend row under the canvas: two
  // panes side by side said nothing of which was which. "" shows none.
  void setRunLabel(const QString& label);
  QString legendText() const;  // the legend row's rich text
  // Paints op `seq` as failed (a session that stopped on it), over any colour mode; clearFailed()
  // forgets every failed op.
  void markFailed(uint64_t seq);
  void clearFailed();
  bool isFailed(uint64_t seq) const { return failed_.count(seq) != 0; }
  static QColor failedColor();
  // ColorMode::NonFinite fills: an op with a NaN/Inf output, an op fed by one, the others.
  static QColor nonFiniteColor(analysis::NonFiniteMark mark);
  // "forward" | "backward" | "both" (forward and backward) | "optimizer".
  void setPhaseFilter(const QString& phase);
  QString phaseFilter() const;

  void expandAll();
  void collapseAll();  // every module collapsed: the top-level modules only
  void expand(const QString& scope);
  void collapse(const QString& scope);

  // Search: ops whose name or scope contains `text` (any case) are highlighted; findNext() selects
  // the next one (Enter in the search box).
  void setSearchText(const QString& text);
  void findNext();
  int searchMatchCount() const { return int(matches_.size()); }
  // Selects the selected op's partner: a forward op's backward op (the one named <op>_backward
  // when there is one, else the first: a gradient's zero fill does not count), a backward op's
  // forward op (key J, context menu). Returns false when there is none.
  bool jumpToPartner();

  // Semantic zoom: 0 while op labels are drawn (scale >= kLabelScale), else the depth (1 = top
  // level) of the deepest module drawn as a solid summary block. labelsReadable(): op labels or
  // block texts are readable at the current scale.
  int semanticLevel() const { return blockLevel_; }
  bool opLabelsShown() const;
  bool labelsReadable() const;
  double zoomScale() const;
  void setZoomScale(double scale);
  // The text a module's block (or collapsed node) shows: scope, then the summary's lines
  // (analysis::summaryLines). Empty for a module not in the graph.
  QStringList moduleSummaryText(const QString& phase, const QString& scope) const;

  void zoomIn();
  void zoomOut();
  // Fits the graph; when that would leave no text readable (a tall step), the scale where the
  // top-level module blocks read, at the graph's top — its top left when it is wider than the view
  // (Note [Semantic zoom]).
  void fitToView();
  // The first view of a step: see Note [Initial graph view].
  void initialView();

  // What the view's state lays out: phase filter, expansion and its fonts' metrics.
  // analysis::buildGraphDot(step()->ops, dotOptions()) is the DOT it lays out; `keel export graph`
  // builds the same with the default (fixed) metrics.
  analysis::GraphDotOptions dotOptions() const;
  // The graph of the last layout (its DOT text, nodes, edges), or nullptr.
  std::shared_ptr<const analysis::GraphDot> graph() const { return graph_; }

  int visibleOpNodeCount() const { return graph_ ? graph_->opNodes : 0; }
  int moduleNodeCount() const { return graph_ ? graph_->moduleNodes : 0; }
  bool isLayingOut() const { return running_; }
  QGraphicsScene* scene() const { return scene_; }
  QGraphicsView* graphicsView() const;
  // The item drawing op `seq` as its own node, or nullptr (filtered out, collapsed, no layout).
  QAbstractGraphicsShapeItem* opItem(uint64_t seq) const;
  // The node of a collapsed module of `phase` and `scope`, or nullptr.
  QAbstractGraphicsShapeItem* moduleItem(Phase phase, const QString& scope) const;

  // The cross-phase relations drawn now, of the selected and the hovered node: forward <->
  // backward links and saved-activation data edges (Note [Cross-phase relations]).
  struct CrossPhaseLines {
    int links = 0, dataEdges = 0;
  };
  CrossPhaseLines crossPhaseLinesDrawn() const;
  // Timings of the last layout, seconds: DOT text, Graphviz, scene (items and minimap).
  struct LayoutTimes {
    double dot = 0, graphviz = 0, scene = 0;
  };
  LayoutTimes lastLayoutTimes() const { return times_; }

  // Fill of a node in ColorMode::Divergence (`first`: the run's first divergence).
  static QColor statusColor(storage::DiffStatus status, bool first = false);
  static QColor phaseColor(Phase phase, bool module = false);

 signals:
  void layoutFinished();
  void phaseFilterChanged(QString phase);  // setPhaseFilter or the view's own phase selector
  void breakHereRequested(quint64 seq);    // the context menu's "Break here" on op `seq`

 protected:
  void showEvent(QShowEvent* event) override;
  void changeEvent(QEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;

 private:
  class Canvas;
  class Minimap;
  class NodeItem;
  class EdgeItem;
  class ClusterItem;
  class RelationsItem;
  struct LayoutResult;

  void requestLayout();
  void startLayout();
  void applyLayout(std::shared_ptr<LayoutResult> result);
  void clearScene();
  void resetExpansion();
  void applyColors();
  void applyHighlights();
  void updateStatus();
  void updateLegend();
  void updateMinimap();
  // Shows the colour legend's row under the canvas when it has something to say.
  void placeLegend();
  // Scrolls to the top of the scene rect `r` at the current scale: centred when the view is as
  // wide as it, else at its left edge, where the forward pass starts.
  void showTopOf(const QRectF& r);
  void updateSemanticLevel();
  void computeBlockScales();
  // Whether an op the diff report does not list counts as equal (see the definition).
  bool missingAreEqual() const;
  void computeSummaries();
  void onSelected(Side side, quint64 seq);
  // Expands what hides `seq`; true when that needs a new layout.
  bool reveal(uint64_t seq);
  void centerOnScope(const std::string& scope);
  void zoomBy(double factor);
  NodeItem* nodeAt(const QPoint& viewPos) const;
  ClusterItem* clusterAt(const QPoint& viewPos) const;
  void clicked(const QPoint& viewPos);
  void doubleClicked(const QPoint& viewPos);
  void hovered(const QPoint& viewPos);  // outside the viewport: no node hovered
  void contextMenu(const QPoint& viewPos, const QPoint& globalPos);
  std::optional<uint64_t> partnerOf(uint64_t seq) const;
  const storage::OpRecord* opBySeq(uint64_t seq) const;
  void measureFonts();

  Selection* selection_;
  Side side_;
  StepPtr step_;
  QString emptyStepNote_;
  QString runLabel_;
  DiffPtr diff_;
  ColorMode colorMode_ = ColorMode::Phase;
  bool colorChosen_ = false;  // setColorMode was called: no automatic non-finite default
  bool recordingNonFinite_ = false;
  std::unordered_map<uint64_t, analysis::NonFiniteMark> nonFinite_;  // marked ops of the step
  std::unordered_set<uint64_t> failed_;
  // Semantic zoom: the scale from which module blocks of depth d (index d - 1) read, the depth
  // drawn as blocks now, and the summaries by analysis::moduleKey.
  std::vector<double> blockScales_;
  int blockLevel_ = 0;           // the deepest block drawn (0: none)
  bool blocksReadable_ = false;  // a block drawn has room for its text
  std::unordered_map<std::string, analysis::ModuleSummary> summaries_;
  analysis::GraphPhase phase_ = analysis::GraphPhase::Both;
  bool expandAll_ = true;
  std::unordered_set<std::string> expanded_;  // when !expandAll_
  std::unordered_set<std::string> opening_;   // the expansion a large step opens with
  bool large_ = false;

  // Layout state (see Note [Graph view layout]).
  uint64_t generation_ = 0;  // bumped by every change that needs a new layout
  bool running_ = false;
  bool fitPending_ = false;        // fit once the widget is shown and laid out
  bool centerOnSelected_ = false;  // centre on the selected op after the next layout
  std::string focusScope_;         // centre on this module after the next layout
  std::shared_ptr<const analysis::GraphDot> graph_;
  LayoutTimes times_;

  // Drawn items of the current layout.
  std::vector<NodeItem*> nodeItems_;  // by GraphDot node index
  std::vector<EdgeItem*> edgeItems_;  // by GraphDot edge index
  std::vector<ClusterItem*> clusterItems_;
  std::unordered_map<uint64_t, NodeItem*> opItems_;
  // The selected and the hovered node's cross-phase relations (Note [Cross-phase relations]).
  RelationsItem* selectedRelations_ = nullptr;
  RelationsItem* hoverRelations_ = nullptr;

  // Divergence verdicts of this side's ops.
  std::unordered_map<uint64_t, storage::DiffStatus> status_;
  std::optional<uint64_t> firstDivergence_;

  std::optional<uint64_t> selected_;
  std::vector<uint64_t> matches_;  // search hits, by seq
  std::unordered_set<uint64_t> matchSet_;
  int matchIndex_ = -1;
  int hiddenMatches_ = 0;     // ops the search finds in phases the graph hides
  QString matchText() const;  // "3 match(es)", "0 match(es), 40 in hidden phases"
  QString searchText_;

  QFont font_, boldFont_;
  analysis::TextMetrics metrics_;

  QGraphicsScene* scene_ = nullptr;
  Canvas* canvas_ = nullptr;
  Minimap* minimap_ = nullptr;
  QComboBox* phaseBox_ = nullptr;
  QComboBox* colorBox_ = nullptr;
  QLineEdit* search_ = nullptr;
  QLabel* matchLabel_ = nullptr;
  QLabel* legend_ = nullptr;
  QLabel* statusLabel_ = nullptr;
  QFutureWatcher<std::shared_ptr<LayoutResult>>* watcher_ = nullptr;
};

}  // namespace keel::views
