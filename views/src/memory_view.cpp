// MemoryView: see memory_view.h. Builds the widgets, follows the shared Selection and the step
// shown, and moves the cursor (each move recomputes one MemState from checkpoints: see Note
// [Memory replay]). Its parts: memory_view_{timeline,active,block_map,histogram,sections}.cpp,
// over the private memory_view_impl.h.
#include <QCheckBox>
#include <QComboBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QKeyEvent>
#include <QLabel>
#include <QSlider>
#include <QSplitter>
#include <QStackedWidget>
#include <QTabWidget>
#include <QTableView>
#include <QVBoxLayout>
#include <cmath>
#include <utility>

#include "keel/views/selection.h"
#include "memory_view_impl.h"
#include "table_util.h"

namespace keel::views {

using namespace memory_detail;
using analysis::layoutMemory;
using analysis::MemBlock;
using analysis::MemLayout;
using analysis::MemOp;
using analysis::MemoryModel;
using analysis::MemPiece;
using analysis::MemScale;
using analysis::MemState;

MemoryView::MemoryView(Selection* selection, Side side, QWidget* parent)
    : QWidget(parent), d_(std::make_unique<Impl>()) {
  d_->q = this;
  d_->selection = selection;
  d_->side = side;
  setObjectName("memoryView");
  setFocusPolicy(Qt::StrongFocus);
  d_->build();
  if (selection) {
    connect(selection, &Selection::selected, this, [this](Side s, quint64 seq) {
      if (s != d_->side) return;
      const bool own = seq == d_->ownSeq;
      if (!own) d_->ownSeq = 0, d_->selectedAlloc = -1;
      d_->highlightOp = seq;
      if (!own && d_->mem && d_->mem->eventCount()) {
        if (auto r = d_->mem->opEvents(seq))
          d_->moveTo(int64_t(r->second));
        else if (int64_t k = d_->mem->lastEventBeforeOp(seq); k >= 0)
          d_->moveTo(k);
      }
      d_->refreshHighlight();
    });
    connect(selection, &Selection::cleared, this, [this] {
      d_->highlightOp = 0;
      d_->ownSeq = 0;
      d_->selectedAlloc = -1;
      d_->refreshHighlight();
    });
  }
  setMemory(nullptr);
}

MemoryView::~MemoryView() = default;

void MemoryView::Impl::build() {
  messageLabel = new QLabel(q);
  messageLabel->setObjectName("memoryMessage");
  messageLabel->setAlignment(Qt::AlignCenter);
  messageLabel->setWordWrap(true);
  messageLabel->setTextFormat(Qt::RichText);
  messageLabel->setMargin(24);

  auto* content = new QWidget(q);
  header = new QLabel(content);
  header->setObjectName("memoryHeader");
  // Selectable, and its "peak" a link to the peak's event (P does the same).
  header->setTextInteractionFlags(Qt::TextBrowserInteraction);
  header->setOpenExternalLinks(false);
  QObject::connect(header, &QLabel::linkActivated, q, [this](const QString& href) {
    if (href == QLatin1String("peak") && mem) moveTo(mem->peakEvent());
  });
  header->setWordWrap(true);  // narrow windows: wrap rather than push the controls off
  header->setMinimumWidth(200);
  colorBox = new QCheckBox(tr("Colour by op"), content);
  colorBox->setObjectName("memoryColorByOp");
  colorBox->setToolTip(
      tr("Colour live blocks by the op that allocated them (parameters, "
         "optimizer state and input batches in their own colours)"));
  colorBox->setFocusPolicy(Qt::NoFocus);
  scaleBox = new QComboBox(content);
  scaleBox->setObjectName("memoryScale");
  scaleBox->addItem(tr("Linear sizes"), int(MemScale::Linear));
  scaleBox->addItem(tr("Log sizes"), int(MemScale::Log));
  scaleBox->setToolTip(
      tr("Block map widths: proportional to bytes, or to log2(bytes) so small "
         "blocks stay visible"));
  scaleBox->setFocusPolicy(Qt::NoFocus);
  hostLabel = new QLabel(content);
  hostLabel->setObjectName("memoryHostNote");
  hostLabel->setWordWrap(true);
  hostLabel->setStyleSheet(
      "QLabel { background: #fff4d6; border: 1px solid #e0c070; padding: 3px 6px; }");
  hostLabel->hide();

  auto* top = new QHBoxLayout;
  top->setContentsMargins(4, 2, 4, 0);
  top->addWidget(header, 1);
  top->addWidget(colorBox);
  top->addWidget(scaleBox);

  // Timeline pane: plot, slider, cursor line.
  auto* timelinePane = new QWidget(content);
  buildTimeline();
  plot->setParent(timelinePane);
  buildActive();
  active->setParent(timelinePane);
  activeCaption->setParent(timelinePane);
  slider = new QSlider(Qt::Horizontal, timelinePane);
  slider->setObjectName("memorySlider");
  slider->setFocusPolicy(Qt::NoFocus);
  slider->setToolTip(
      tr("Scrub through the allocator events (keys: ←/→ one event, PgUp/PgDn a "
         "twentieth, Home/End)"));
  cursorLabel = new WrappedLabel(2, timelinePane);
  cursorLabel->setObjectName("memoryCursor");
  cursorLabel->setTextInteractionFlags(Qt::TextSelectableByMouse);
  auto* tl = new QVBoxLayout(timelinePane);
  tl->setContentsMargins(0, 0, 0, 0);
  tl->setSpacing(2);
  tl->addWidget(activeCaption);
  tl->addWidget(active, 1);
  tl->addWidget(plot, 1);
  tl->addWidget(slider);
  tl->addWidget(cursorLabel);

  // Block map pane: caption, map, legend.
  auto* mapPane = new QWidget(content);
  caption = new WrappedLabel(2, mapPane);
  caption->setObjectName("memoryMapCaption");
  map = new BlockMap(mapPane);
  map->emptyText = tr("No live blocks at this event");
  map->blockColor = [this](const MemPiece& p) {
    if (!colorByOp || !mem) return kAllocated;
    return ownerColor(*mem, state.blocks[size_t(p.block)], opColors);
  };
  map->tipFor = [this](int piece) { return pieceTip(piece); };
  map->clicked = [this](int piece) {
    const MemPiece& p = layout.pieces[size_t(piece)];
    if (p.kind != MemPiece::Kind::Block || !mem) return;
    const MemBlock& b = state.blocks[size_t(p.block)];
    const storage::MemRecord& a = mem->allocOf(b);
    selectedAlloc = b.allocEvent;
    highlightOp = a.opSeq;
    ownSeq = a.opSeq;
    if (a.opSeq && selection) selection->select(side, a.opSeq);
    refreshHighlight();
    const MemOp* o = a.opSeq ? mem->op(a.opSeq) : nullptr;
    stepEcho = o ? o->step : a.step;  // the studio shows that step: keep the cursor here
    emit q->blockClicked(quint64(a.opSeq), qint64(o ? o->step : a.step));
  };
  legend = new QLabel(mapPane);
  legend->setObjectName("memoryLegend");
  legend->setWordWrap(true);
  legend->setTextFormat(Qt::RichText);
  auto* ml = new QVBoxLayout(mapPane);
  ml->setContentsMargins(0, 0, 0, 0);
  ml->setSpacing(2);
  ml->addWidget(caption);
  ml->addWidget(map, 1);
  ml->addWidget(legend);

  // Histogram and sections.
  tabs = new QTabWidget(content);
  tabs->setObjectName("memoryTabs");
  buildHistogram();
  // Live by site: who holds the memory at the cursor (Note [Live by site]).
  sites = new QTableWidget(0, 4, tabs);
  sites->setObjectName("memorySites");
  sites->setHorizontalHeaderLabels({tr("Allocated by"), tr("Live"), tr("Blocks"), tr("Share")});
  sites->setEditTriggers(QAbstractItemView::NoEditTriggers);
  sites->setSelectionBehavior(QAbstractItemView::SelectRows);
  sites->setTextElideMode(Qt::ElideMiddle);  // the function and the line both show
  sites->verticalHeader()->setVisible(false);
  sites->verticalHeader()->setDefaultSectionSize(sites->fontMetrics().height() + 6);
  sites->horizontalHeader()->setSectionResizeMode(0, QHeaderView::Stretch);
  for (int c = 1; c < 4; ++c)
    sites->horizontalHeader()->setSectionResizeMode(c, QHeaderView::ResizeToContents);
  tabs->addTab(sites, tr("Live by site"));  // first: who holds the memory
  tabs->addTab(hist, tr("Sizes"));
  QObject::connect(tabs, &QTabWidget::currentChanged, q, [this] { updateSites(); });
  auto* secPane = new QWidget(tabs);
  sections = new MemSectionModel(secPane);
  sectionTable = makeRecordTable(secPane, "memorySections", sections);
  noSections = new QLabel(
      tr("No tracked sections. Wrap code in keel::MemoryTrackingScope, or turn on Run › Track "
         "memory per step in a live session."),
      secPane);
  noSections->setObjectName("memoryNoSections");
  noSections->setWordWrap(true);
  noSections->setAlignment(Qt::AlignCenter);
  auto* sl = new QVBoxLayout(secPane);
  sl->setContentsMargins(0, 0, 0, 0);
  sl->addWidget(noSections);
  sl->addWidget(sectionTable, 1);
  tabs->addTab(secPane, tr("Tracked sections"));
  QObject::connect(sectionTable, &QTableView::clicked, q, [this](const QModelIndex& i) {
    moveTo(sections->data(i, MemSectionModel::EndEventRole).toLongLong());
  });

  auto* lower = new QSplitter(Qt::Horizontal, content);
  lower->setObjectName("memoryLower");
  lower->addWidget(mapPane);
  lower->addWidget(tabs);
  // Even halves: the "Live by site" names (an op and its scope) were cut at 3:2 on a 1366-pixel
  // screen, and the block map reads as well at half the width.
  lower->setStretchFactor(0, 1);
  lower->setStretchFactor(1, 1);
  lower->setChildrenCollapsible(false);
  main = new QSplitter(Qt::Vertical, content);
  main->setObjectName("memorySplitter");
  main->addWidget(timelinePane);
  main->addWidget(lower);
  main->setStretchFactor(0, 1);
  main->setStretchFactor(1, 1);
  main->setChildrenCollapsible(false);

  auto* cl = new QVBoxLayout(content);
  cl->setContentsMargins(0, 0, 0, 0);
  cl->setSpacing(3);
  cl->addLayout(top);
  cl->addWidget(hostLabel);
  cl->addWidget(main, 1);

  pages = new QStackedWidget(q);
  pages->addWidget(messageLabel);
  pages->addWidget(content);
  auto* outer = new QVBoxLayout(q);
  outer->setContentsMargins(0, 0, 0, 0);
  outer->addWidget(pages);

  QObject::connect(slider, &QSlider::valueChanged, q, [this](int v) { moveTo(v); });
  QObject::connect(colorBox, &QCheckBox::toggled, q, [this](bool on) { q->setColorByOp(on); });
  QObject::connect(scaleBox, &QComboBox::currentIndexChanged, q,
                   [this](int) { q->setScale(MemScale(scaleBox->currentData().toInt())); });
}

void MemoryView::Impl::showPages() {
  pages->setCurrentIndex(message.isEmpty() ? 1 : 0);
  messageLabel->setText(message);
}

void MemoryView::setMemory(MemoryPtr memory) {
  Impl& d = *d_;
  const MemoryPtr old = d.mem;
  const int64_t oldCount = d.count();
  const bool wasAtEnd = old && oldCount > 0 && d.cursor == oldCount - 1;
  d.mem = std::move(memory);
  d.sitesAt = -2;  // the sites table is of the new events
  d.sections->setMemory(d.mem);
  d.noSections->setVisible(!d.mem || d.mem->sections().empty());
  d.sectionTable->setVisible(d.mem && !d.mem->sections().empty());
  if (d.mem && !d.mem->sections().empty()) d.sectionTable->resizeColumnsToContents();
  d.tabs->setTabText(d.tabs->indexOf(d.sectionTable->parentWidget()),
                     d.mem && !d.mem->sections().empty()
                         ? tr("Tracked sections (%1)").arg(d.mem->sections().size())
                         : tr("Tracked sections"));
  if (!d.mem) {
    d.message = tr("No recording open.");
  } else if (d.mem->eventCount() == 0) {
    d.message =
        tr("<p><b>This recording has no allocator events.</b></p><p>Record them with "
           "<tt>keel record --allocator</tt> (or tick <i>allocator events</i> in File › "
           "New session), and pick an allocator with segments, e.g. "
           "<tt>KEEL_ALLOCATOR=caching</tt> or <tt>KEEL_ALLOCATOR=vmm</tt>, to see "
           "segments, free space and fragmentation.</p>");
  } else {
    d.message.clear();
  }
  d.hostLabel->setVisible(d.mem && d.mem->eventCount() && !d.mem->hasSegments());
  d.hostLabel->setText(hostNote());
  d.rebuildTimeline();
  const int64_t oldCursor = d.cursor;
  int64_t k = -1;
  if (d.count() > 0) {
    if (old && oldCount > 0) {  // a refresh of the same run
      k = wasAtEnd ? d.count() - 1 : std::min(oldCursor, d.count() - 1);
    } else {  // a fresh recording opens where the allocator refused a request, else at the
              // peak of the step shown, or of the run
      k = d.mem->peakEvent();
      const auto& ooms = d.mem->oomEvents();
      if (!ooms.empty() && (!d.pendingStep || d.mem->event(ooms.front()).step == *d.pendingStep))
        k = int64_t(ooms.front());
      else if (d.pendingStep)
        if (int64_t p = d.peakOfStep(*d.pendingStep); p >= 0) k = p;
    }
  }
  d.peakFigures = d.mem ? d.mem->figuresAtPeak() : analysis::MemFigures{};
  d.headerCache = d.computeHeader();
  d.opColors.clear();
  if (d.mem)
    for (const storage::MemRecord& e : d.mem->events()) {
      const MemOp* o = e.kind == MemEventKind::Alloc && e.opSeq ? d.mem->op(e.opSeq) : nullptr;
      if (o && !d.opColors.count(o->name))
        d.opColors.emplace(o->name, QColor(kOpPalette[d.opColors.size() % std::size(kOpPalette)]));
    }
  d.moveTo(k, true);
  d.updateLegend();
  d.showPages();
}

void MemoryView::showMessage(const QString& text) {
  d_->message = text;
  d_->showPages();
}

void MemoryView::Impl::moveTo(int64_t k, bool force) {
  const int64_t n = count();
  k = n == 0 ? -1 : std::clamp<int64_t>(k, 0, n - 1);
  if (k == cursor && !force) return;
  cursor = k;
  state = mem ? mem->stateAt(k) : MemState{};
  figures = mem ? mem->figures(state) : analysis::MemFigures{};
  if (active) {
    active->cursor = k;
    active->update();
  }
  layout = layoutMemory(state, scale);
  map->layout = &layout;
  map->hover = -1;
  slider->blockSignals(true);
  slider->setValue(int(std::max<int64_t>(0, k)));
  slider->blockSignals(false);
  placeCursorLine(k);
  refreshHighlight();
  updateHistogram();
  updateSites();
  updateTexts();
  emit q->cursorChanged(qint64(k));
}

// Note [Live by site]: the blocks live at the cursor summed by where they were allocated
// (analysis::MemoryModel::aliveBySite), the most bytes first: a leak reads as one site whose
// share grows as the cursor moves on, where the block map alone made the user hover block after
// block (an imported snapshot's blocks all drawn in the one "outside ops" colour). Filled only
// while its tab is shown: a cursor scrubbed with the keys does not pay for it.
void MemoryView::Impl::updateSites() {
  if (!sites || tabs->currentWidget() != sites || sitesAt == cursor) return;
  sitesAt = cursor;
  const std::vector<analysis::MemSiteShare> by =
      mem && cursor >= 0 ? mem->aliveBySite(state) : std::vector<analysis::MemSiteShare>{};
  const size_t rows = std::min<size_t>(by.size(), 200);
  sites->setRowCount(int(rows));
  for (size_t i = 0; i < rows; ++i) {
    const analysis::MemSiteShare& site = by[i];
    auto cell = [&](int col, const QString& text, bool right) {
      auto* it = new QTableWidgetItem(text);
      it->setTextAlignment((right ? Qt::AlignRight : Qt::AlignLeft) | Qt::AlignVCenter);
      it->setToolTip(tr("%1: %2 in %3, the largest allocated at event %4")
                         .arg(qs(site.site), bytesText(site.bytes), blocksText(site.blocks))
                         .arg(site.largestAlloc));
      sites->setItem(int(i), col, it);
    };
    cell(0, qs(site.site), false);
    cell(1, bytesText(site.bytes), true);
    cell(2, QString::number(site.blocks), true);
    cell(3,
         state.liveBytes
             ? QString::number(100.0 * double(site.bytes) / double(state.liveBytes), 'f', 1) + "%"
             : QStringLiteral("-"),
         true);
  }
}

void MemoryView::Impl::updateTexts() {
  if (!mem || mem->eventCount() == 0) {
    header->clear();
    cursorLabel->clear();
    caption->clear();
    return;
  }
  header->setText(q->headerText());
  cursorLabel->setWrappedText(q->cursorText());
  caption->setWrappedText(q->mapCaption());
}

MemoryPtr MemoryView::memory() const {
  return d_->mem;
}
int64_t MemoryView::cursor() const {
  return d_->cursor;
}
void MemoryView::setCursor(int64_t event) {
  d_->moveTo(event);
}
int64_t MemoryView::eventCount() const {
  return d_->count();
}
const MemState& MemoryView::state() const {
  return d_->state;
}
const MemLayout& MemoryView::layout() const {
  return d_->layout;
}
const std::vector<size_t>& MemoryView::highlightedBlocks() const {
  return d_->highlighted;
}
QString MemoryView::message() const {
  return d_->message;
}
QWidget* MemoryView::blockMap() const {
  return d_->map;
}
QWidget* MemoryView::timeline() const {
  return d_->plot;
}
MemSectionModel* MemoryView::sectionModel() const {
  return d_->sections;
}

QString MemoryView::headerText() const {
  return d_->headerCache;
}

QString MemoryView::Impl::computeHeader() const {
  const MemoryModel* m = mem.get();
  if (!m || m->eventCount() == 0) return {};
  // The figures of Note [Memory figures], as `keel memory stats` prints them: at the peak of
  // allocated memory, cached free (reserved - allocated) and fragmentation (largest free block
  // against free memory) are two different things, and both are named.
  const analysis::MemFigures& f = peakFigures;
  const QString kind = qs(allocatorKindName(*m->allocatorKind()));  // events: a kind
  // "allocated" and "reserved" in their lines' colours: the key of the timeline, whose legend
  // row gives way to the plot in a short dock (1366x768).
  auto coloured = [](const QColor& c, const QString& text) {
    return QStringLiteral("<span style='color:%1'><b>%2</b></span>").arg(c.name(), text);
  };
  QString s;
  if (!m->oomEvents().empty()) {  // where the run failed, before anything else
    const storage::MemRecord& e = m->event(m->oomEvents().front());
    QString where;
    if (const MemOp* o = e.opSeq ? m->op(e.opSeq) : nullptr)
      where = tr(" by op #%1 %2").arg(o->seq).arg(qs(o->name));
    if (m->hasSteps()) where += tr(" in step %1").arg(e.step);
    s = QStringLiteral("<span style='color:%1'><b>%2</b></span><br>")
            .arg(kOom.name(), tr("Out of memory at event %1: %2 requested%3 and refused")
                                  .arg(m->oomEvents().front())
                                  .arg(bytesText(e.bytes), where)
                                  .toHtmlEscaped());
  }
  // The first "peak" is a link to the peak's event (MemoryView::keyPressEvent: P).
  s += tr("<b>%1</b> allocator events · %2 allocator · <a href='peak'>peak</a> %3 %4 · peak %5 "
          "%6")
           .arg(m->eventCount())
           .arg(kind, coloured(kAllocated, tr("allocated")), bytesText(m->peakAllocated()),
                coloured(kReserved, tr("reserved")), bytesText(m->peakReserved()));
  if (m->hasSegments())
    s += tr(" · at the peak (event %1): cached free %2 (%3% of reserved), largest free block %4, "
            "fragmentation %5%")
             .arg(f.event)
             .arg(bytesText(f.cachedFree))
             .arg(100.0 * f.cachedShare(), 0, 'f', 1)
             .arg(bytesText(f.largestFree))
             .arg(100.0 * f.fragmentation(), 0, 'f', 1);
  return s;
}

analysis::MemFigures MemoryView::figures() const {
  return d_->figures;
}
analysis::MemFigures MemoryView::peakFigures() const {
  return d_->peakFigures;
}

int64_t MemoryView::Impl::peakOfStep(int64_t step) const {
  if (!mem) return -1;
  const auto& starts = mem->stepStarts();
  int64_t best = -1;
  for (size_t s = 0; s < starts.size(); ++s) {
    if (starts[s].second != step) continue;
    const size_t end = s + 1 < starts.size() ? starts[s + 1].first : mem->eventCount();
    for (size_t i = starts[s].first; i < end; ++i)
      if (best < 0 || mem->allocatedAfter(i) > mem->allocatedAfter(size_t(best))) best = int64_t(i);
  }
  return best;
}

void MemoryView::showStep(int64_t step) {
  Impl& d = *d_;
  d.pendingStep = step;
  if (std::exchange(d.stepEcho, -2) == step) return;  // the step of a block clicked here
  if (!d.mem || d.count() == 0) return;
  if (d.cursor >= 0 && d.mem->event(size_t(d.cursor)).step == step) return;
  if (int64_t k = d.peakOfStep(step); k >= 0) d.moveTo(k);
}

void MemoryView::setRange(int64_t first, int64_t last) {
  Impl& d = *d_;
  if (d.count() == 0) return;
  first = std::clamp<int64_t>(first, 0, d.count() - 1);
  last = std::clamp<int64_t>(last, first, d.count() - 1);
  d.plot->xAxis->setRange(double(first) - 0.5, double(last) + 0.5);
  d.clampRange();
  d.placeStepLabels();
  d.plot->replot();
  d.syncActive();
}

std::pair<int64_t, int64_t> MemoryView::range() const {
  const QCPRange r = d_->plot->xAxis->range();
  const int64_t n = std::max<int64_t>(d_->count(), 1);
  return {std::clamp<int64_t>(int64_t(std::ceil(r.lower)), 0, n - 1),
          std::clamp<int64_t>(int64_t(std::floor(r.upper)), 0, n - 1)};
}

QWidget* MemoryView::activeMemory() const {
  return d_->active;
}
const analysis::MemBands& MemoryView::activeBands() const {
  return d_->active->bands;
}
void MemoryView::layoutActive() {
  d_->syncActive();
  d_->active->rebuild();
}
QString MemoryView::activeToolTip(QPoint pos) const {
  const auto [slice, at] = d_->active->bandAt(pos);
  return slice ? d_->activeTip(*slice, at) : QString();
}
QPoint MemoryView::activePoint(int64_t event, uint64_t bytes) const {
  const ActiveMemory& a = *d_->active;
  const QRect r = a.area();
  return {int(std::lround(a.xOf(double(event)))),
          int(std::lround(double(r.bottom() + 1) - double(bytes) / a.yMax * double(r.height())))};
}

QString MemoryView::cursorText() const {
  return d_->eventText(d_->cursor);
}

QString MemoryView::hostNote() const {
  const Impl& d = *d_;
  if (!d.mem || d.mem->eventCount() == 0 || d.mem->hasSegments()) return {};
  return tr(
      "Host allocator: it has no segments, so the block map lays live blocks out by "
      "address with the gaps between them elided, and reserved equals allocated. Record "
      "with KEEL_ALLOCATOR=caching or vmm to see segments, free space and fragmentation.");
}

void MemoryView::keyPressEvent(QKeyEvent* e) {
  Impl& d = *d_;
  if (d.count() == 0) return QWidget::keyPressEvent(e);
  const int64_t c = std::max<int64_t>(d.cursor, 0);
  switch (e->key()) {
    case Qt::Key_Left:
      d.moveTo(c - 1);
      break;
    case Qt::Key_Right:
      d.moveTo(c + 1);
      break;
    case Qt::Key_PageUp:
      d.moveTo(c - d.page());
      break;
    case Qt::Key_PageDown:
      d.moveTo(c + d.page());
      break;
    case Qt::Key_Home:
      d.moveTo(0);
      break;
    case Qt::Key_End:
      d.moveTo(d.count() - 1);
      break;
    case Qt::Key_P:  // the peak of allocated memory (the header's link)
      if (d.mem) d.moveTo(d.mem->peakEvent());
      break;
    default:
      return QWidget::keyPressEvent(e);
  }
  e->accept();
}

void MemoryView::resizeEvent(QResizeEvent* e) {
  QWidget::resizeEvent(e);
  // Short (a 768-pixel screen's bottom dock): the plot's legend and the bands' caption give their
  // rows to the two timelines.
  const bool roomy = height() >= 400;
  if (d_->roomy != roomy) {
    d_->roomy = roomy;
    d_->labelAxes();
  }
  if (d_->activeCaption->isVisibleTo(this) != roomy || d_->plot->legend->visible() != roomy) {
    d_->activeCaption->setVisible(roomy);
    d_->plot->legend->setVisible(roomy);
    QCPLayoutGrid* layout = d_->plot->plotLayout();
    if (!roomy) {
      layout->take(d_->plot->legend);
      layout->simplify();  // the legend's row goes (a stretch factor set on it would warn)
    } else {
      if (!layout->hasElement(1, 0)) layout->addElement(1, 0, d_->plot->legend);
      layout->setRowStretchFactor(1, 0.001);
    }
    d_->plot->replot(QCustomPlot::rpQueuedReplot);
  }
  // Docked under the graph the view is wide and short: timeline beside the block map.
  const Qt::Orientation o = width() > 2 * height() ? Qt::Horizontal : Qt::Vertical;
  if (d_->main->orientation() != o) {
    d_->main->setOrientation(o);
    const int total = o == Qt::Horizontal ? width() : height();
    d_->main->setSizes({total * 2 / 5, total * 3 / 5});
  }
}

QFont MemoryView::Impl::smallFont(double factor) const {
  QFont small = q->font();
  small.setPointSizeF(small.pointSizeF() * factor);
  return small;
}

}  // namespace keel::views
