// The memory view's block map: the BlockMap widget (pieces of a MemLayout wrapped into rows,
// hit-testing that favours blocks narrower than a pixel), its colours, legend, caption and
// highlight, and the block tooltips that say what a block holds and why it is still alive.
#include <QHelpEvent>
#include <QMouseEvent>
#include <QPainter>
#include <QResizeEvent>
#include <QTextDocument>
#include <QToolTip>
#include <algorithm>
#include <cmath>

#include "memory_view_impl.h"

namespace keel::views {

using namespace memory_detail;
using analysis::layoutMemory;
using analysis::MemBlock;
using analysis::MemBuffer;
using analysis::MemOp;
using analysis::MemoryModel;
using analysis::MemPiece;
using analysis::MemScale;
using analysis::MemSegment;
using analysis::MemTensor;

namespace {

bool isAllocatorFrame(const std::string& fn) {
  return fn.find("Allocator::") != std::string::npos || fn.rfind("keel::Buffer::", 0) == 0 ||
         fn.rfind("keel::alloc::", 0) == 0 || fn.rfind("keel::detail::", 0) == 0;
}
QString shapeText(const std::vector<int64_t>& shape) {
  QStringList dims;
  for (int64_t s : shape) dims << QString::number(s);
  return "[" + dims.join(", ") + "]";
}

QString legendSwatch(const QColor& c, const QString& text, bool hatched = false) {
  return QStringLiteral("<span style='color:%1'>%2</span>&nbsp;%3")
      .arg(c.name(), hatched ? QStringLiteral("&#9636;") : QStringLiteral("&#9632;"), text);
}

}  // namespace

namespace memory_detail {

WrappedLabel::WrappedLabel(int minLines, QWidget* parent) : QLabel(parent), minLines_(minLines) {
  setWordWrap(true);
  setAlignment(Qt::AlignLeft | Qt::AlignTop);
  fit(true);
}

void WrappedLabel::setWrappedText(const QString& text) {
  if (text == this->text()) return;
  setText(text);
  fit(false);
}

void WrappedLabel::resizeEvent(QResizeEvent* e) {
  QLabel::resizeEvent(e);
  if (e->size().width() != e->oldSize().width()) fit(true);
}

void WrappedLabel::fit(bool mayShrink) {
  const int least = fontMetrics().lineSpacing() * minLines_ + 4;
  // The text's height at this width, laid out as QLabel lays it (QLabel::heightForWidth answers
  // for the label's last layout, not for the width asked).
  QTextDocument doc;
  doc.setDocumentMargin(0);
  doc.setDefaultFont(font());
  if (Qt::mightBeRichText(text()))
    doc.setHtml(text());
  else
    doc.setPlainText(text());
  doc.setTextWidth(contentsRect().width());
  const QMargins m = contentsMargins();
  const int need = std::max(
      least, text().isEmpty() ? 0 : int(std::ceil(doc.size().height())) + m.top() + m.bottom() + 2);
  // The height set last is maximumHeight() (the constructor sets the first).
  const int h = mayShrink ? need : std::max(need, maximumHeight());
  if (h != maximumHeight()) setFixedHeight(h);
}

// Colour of a live block by owner: tagged blocks in fixed colours, others by their op's name.
QColor ownerColor(const MemoryModel& m, const MemBlock& b,
                  const std::unordered_map<std::string, QColor>& opColors) {
  const storage::MemRecord& a = m.allocOf(b);
  if (a.tag == MemTag::Parameter) return kParameter;
  if (a.tag == MemTag::OptimizerState) return kOptimizer;
  if (a.tag == MemTag::Data) return kData;
  const MemOp* o = a.opSeq ? m.op(a.opSeq) : nullptr;
  // Outside ops but with the stack that allocated it (every block of an imported PyTorch
  // snapshot: its Python frames): a colour per stack, so two call sites' blocks differ (they
  // were all one grey).
  if (!o && a.stackId >= 0) return QColor(kOpPalette[size_t(a.stackId) % std::size(kOpPalette)]);
  if (!o) return kOutsideOps;
  auto it = opColors.find(o->name);
  return it == opColors.end() ? kOutsideOps : it->second;
}

BlockMap::BlockMap(QWidget* parent) : QWidget(parent) {
  setObjectName("memoryBlockMap");
  setMouseTracking(true);
  setFocusPolicy(Qt::ClickFocus);
  setMinimumSize(160, 60);
  setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Expanding);
}

BlockMap::Geo BlockMap::geo() const {
  Geo g;
  g.width = std::max(1, width() - 8);
  const double h = std::max(1, height() - 8);
  if (!layout || layout->total == 0) return g;
  const uint64_t maxRows = std::max<uint64_t>(1, uint64_t((h + g.gap) / (16 + g.gap)));
  g.perRow = std::max<uint64_t>(1, (layout->total + maxRows - 1) / maxRows);
  g.rows = (layout->total + g.perRow - 1) / g.perRow;
  g.rowH = std::min(44.0, (h - double(g.rows - 1) * g.gap) / double(g.rows));
  return g;
}

int BlockMap::pieceAt(QPoint pos) const {
  if (!layout || layout->pieces.empty()) return -1;
  const Geo g = geo();
  const double y = pos.y() - g.top;
  if (y < 0) return -1;
  const uint64_t row = uint64_t(y / (g.rowH + g.gap));
  if (row >= g.rows || y - double(row) * (g.rowH + g.gap) > g.rowH) return -1;
  const double fx = (pos.x() - g.left) / g.width;
  if (fx < 0 || fx >= 1) return -1;
  const double unitsPerPx = double(g.perRow) / g.width;
  const uint64_t u = row * g.perRow + uint64_t(fx * double(g.perRow));
  const auto& ps = layout->pieces;
  auto it = std::upper_bound(ps.begin(), ps.end(), u,
                             [](uint64_t v, const MemPiece& p) { return v < p.offset; });
  if (it == ps.begin()) return -1;
  int exact = int(it - ps.begin()) - 1;
  if (u >= ps[size_t(exact)].offset + ps[size_t(exact)].length) exact = -1;
  if (exact >= 0 && ps[size_t(exact)].kind == MemPiece::Kind::Block) return exact;
  // Blocks narrower than a pixel: the nearest block within 3 px wins over free space.
  const double tol = 3 * unitsPerPx;
  int best = -1;
  double bestD = tol + 1;
  const uint64_t lo = u > uint64_t(tol) ? u - uint64_t(tol) : 0, hi = u + uint64_t(tol) + 1;
  auto first = std::upper_bound(ps.begin(), ps.end(), lo,
                                [](uint64_t v, const MemPiece& p) { return v < p.offset; });
  if (first != ps.begin()) --first;
  for (auto p = first; p != ps.end() && p->offset <= hi; ++p) {
    if (p->kind != MemPiece::Kind::Block) continue;
    const double c = double(p->offset) + double(p->length) / 2;
    const double dist = std::abs(c - double(u));
    if (dist < bestD) bestD = dist, best = int(p - ps.begin());
  }
  return best >= 0 && bestD <= tol + double(ps[size_t(best)].length) / 2 ? best : exact;
}

void BlockMap::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.fillRect(rect(), palette().base());
  if (!layout || layout->pieces.empty()) {
    p.setPen(palette().color(QPalette::PlaceholderText));
    p.drawText(rect(), Qt::AlignCenter | Qt::TextWordWrap, emptyText);
    return;
  }
  const Geo g = geo();
  const QBrush hatch(QColor(255, 255, 255, 110), Qt::BDiagPattern);
  std::vector<QRectF> marks;
  for (const MemPiece& piece : layout->pieces) {
    QColor fill;
    bool faded = false;
    switch (piece.kind) {
      case MemPiece::Kind::Block:
        fill = blockColor ? blockColor(piece) : kAllocated;
        faded = anyHighlight &&
                !(size_t(piece.block) < highlighted.size() && highlighted[size_t(piece.block)]);
        if (faded)  // a paler shade, still darker than free space
          fill = QColor((fill.red() * 3 + 255 * 2) / 5, (fill.green() * 3 + 255 * 2) / 5,
                        (fill.blue() * 3 + 255 * 2) / 5);
        break;
      case MemPiece::Kind::Free:
        fill = kFree;
        break;
      case MemPiece::Kind::Unmapped:
        fill = kUnmapped;
        break;
    }
    forEachRect(g, piece, [&](const QRectF& r, bool start) {
      p.fillRect(r, fill);
      if (piece.kind == MemPiece::Kind::Unmapped) p.fillRect(r, hatch);
      if (piece.kind == MemPiece::Kind::Block && r.width() >= 4) {
        p.setPen(QPen(fill.darker(140), 1));
        p.drawLine(r.topLeft(), r.bottomLeft());
      }
      if (start && piece.gapBefore) marks.push_back(r);
    });
  }
  // Elided address space / span boundaries: a dark bar at the start of the next span.
  p.setPen(Qt::NoPen);
  p.setBrush(QColor(0x33, 0x33, 0x33));
  for (const QRectF& r : marks) p.drawRect(QRectF(r.left() - 1, r.top() - 2, 2.5, r.height() + 4));
  // The highlighted op's blocks, then the hovered piece.
  p.setBrush(Qt::NoBrush);
  if (anyHighlight) {
    p.setPen(QPen(kHighlight, 2));
    for (const MemPiece& piece : layout->pieces)
      if (piece.kind == MemPiece::Kind::Block && size_t(piece.block) < highlighted.size() &&
          highlighted[size_t(piece.block)])
        forEachRect(g, piece, [&](const QRectF& r, bool) {
          const double w = std::max(3.0, r.width() + 2);
          p.drawRect(QRectF(r.center().x() - w / 2, r.top() - 1, w, r.height() + 2));
        });
  }
  if (hover >= 0 && size_t(hover) < layout->pieces.size()) {
    p.setPen(QPen(Qt::black, 1));
    forEachRect(g, layout->pieces[size_t(hover)],
                [&](const QRectF& r, bool) { p.drawRect(r.adjusted(-0.5, -0.5, 0.5, 0.5)); });
  }
}

bool BlockMap::event(QEvent* e) {
  if (e->type() == QEvent::ToolTip) {
    auto* he = static_cast<QHelpEvent*>(e);
    const int i = pieceAt(he->pos());
    showTip(he, i >= 0 && tipFor ? tipFor(i) : QString(), this);
    return true;
  }
  return QWidget::event(e);
}

void BlockMap::mouseMoveEvent(QMouseEvent* e) {
  const int i = pieceAt(e->position().toPoint());
  if (i != hover) {
    hover = i;
    update();
  }
}

void BlockMap::leaveEvent(QEvent*) {
  hover = -1;
  update();
}

void BlockMap::mousePressEvent(QMouseEvent* e) {
  if (e->button() != Qt::LeftButton) return QWidget::mousePressEvent(e);
  const int i = pieceAt(e->position().toPoint());
  if (i >= 0 && clicked) clicked(i);
}

}  // namespace memory_detail

void MemoryView::Impl::refreshHighlight() {
  highlighted.clear();
  if (mem && highlightOp) highlighted = mem->blocksOfOp(state, highlightOp);
  if (selectedAlloc >= 0)
    for (size_t i = 0; i < state.blocks.size(); ++i)
      if (int64_t(state.blocks[i].allocEvent) == selectedAlloc &&
          std::find(highlighted.begin(), highlighted.end(), i) == highlighted.end())
        highlighted.push_back(i);
  std::sort(highlighted.begin(), highlighted.end());
  map->highlighted.assign(state.blocks.size(), 0);
  for (size_t i : highlighted) map->highlighted[i] = 1;
  map->anyHighlight = !highlighted.empty();
  map->update();
}

void MemoryView::Impl::updateLegend() {
  QStringList parts;
  if (colorByOp) {
    parts << legendSwatch(kParameter, tr("parameter"))
          << legendSwatch(kOptimizer, tr("optimizer state"))
          << legendSwatch(kData, tr("input batch")) << legendSwatch(kOutsideOps, tr("outside ops"))
          << tr("other blocks: one colour per op name");
  } else {
    parts << legendSwatch(kAllocated, tr("allocated"));
  }
  parts << legendSwatch(kFree.darker(112), tr("free (reusable)"))
        << legendSwatch(kUnmapped, tr("unmapped (no memory behind it)"), true)
        << QStringLiteral("<span style='color:#333'>&#9613;</span>&nbsp;") +
               tr("gap elided / new segment run")
        << QStringLiteral("<span style='color:%1'>&#9633;</span>&nbsp;").arg(kHighlight.name()) +
               tr("selected op's blocks");
  // Items never break inside; the legend wraps between them.
  for (QString& p : parts) p = QStringLiteral("<span style='white-space:nowrap'>%1</span>").arg(p);
  legend->setText(parts.join(QStringLiteral(" &nbsp; ")));
}

QString MemoryView::Impl::pieceTip(int piece) const {
  if (!mem || piece < 0 || size_t(piece) >= layout.pieces.size()) return {};
  const MemPiece& p = layout.pieces[size_t(piece)];
  switch (p.kind) {
    case MemPiece::Kind::Free:
      return tr("<b>free</b> %1 at %2<br>inside a segment: reusable without asking the system")
          .arg(bytesText(p.bytes), hexAddr(p.address));
    case MemPiece::Kind::Unmapped:
      return tr("<b>unmapped</b> %1 at %2<br>address space the vmm allocator keeps; no physical "
                "memory behind it")
          .arg(bytesText(p.bytes), hexAddr(p.address));
    case MemPiece::Kind::Block:
      return q->blockToolTip(size_t(p.block));
  }
  return {};
}

void MemoryView::setColorByOp(bool on) {
  d_->colorByOp = on;
  if (d_->colorBox->isChecked() != on) d_->colorBox->setChecked(on);
  d_->updateLegend();
  d_->map->update();
}

bool MemoryView::colorByOp() const {
  return d_->colorByOp;
}

void MemoryView::setScale(MemScale scale) {
  d_->scale = scale;
  const int i = d_->scaleBox->findData(int(scale));
  if (i >= 0 && d_->scaleBox->currentIndex() != i) d_->scaleBox->setCurrentIndex(i);
  d_->layout = layoutMemory(d_->state, scale);
  d_->map->hover = -1;
  d_->map->update();
}

QPoint MemoryView::blockPoint(size_t index) const {
  const Impl& d = *d_;
  for (const MemPiece& p : d.layout.pieces) {
    if (p.kind != MemPiece::Kind::Block || p.block != int64_t(index)) continue;
    QPoint at(-1, -1);
    bool first = true;
    d.map->forEachRect(d.map->geo(), p, [&](const QRectF& r, bool) {
      if (first) at = r.center().toPoint();
      first = false;
    });
    return at;
  }
  return {-1, -1};
}

QString MemoryView::mapCaption() const {
  const Impl& d = *d_;
  if (!d.mem || d.cursor < 0) return {};
  size_t mapped = 0, unmapped = 0;
  uint64_t mappedBytes = 0;
  for (const MemSegment& g : d.state.segments) {
    (g.mapped ? mapped : unmapped)++;
    if (g.mapped) mappedBytes += g.bytes;
  }
  QString s = tr("<b>Block map at event %1</b>: %2 live, %3")
                  .arg(d.cursor)
                  .arg(blocksText(d.state.blocks.size()), bytesText(d.state.liveBytes));
  const bool chunks = d.mem->allocatorKind() == AllocatorKind::Vmm;
  if (mapped || unmapped)
    s += chunks
             ? tr(" in %1 mapped chunks (%2), %3 unmapped")
                   .arg(mapped)
                   .arg(bytesText(mappedBytes))
                   .arg(unmapped)
             : (mapped == 1 ? tr(" in 1 segment (%1)").arg(bytesText(mappedBytes))
                            : tr(" in %1 segments (%2)").arg(mapped).arg(bytesText(mappedBytes)));
  if (d.mem->hasSegments()) {  // Note [Memory figures], as `keel memory stats` prints them
    const analysis::MemFigures& f = d.figures;
    s += tr("<br>cached free %1 (%2% of reserved) in %3 · largest free block %4 · "
            "fragmentation %5%")
             .arg(bytesText(f.cachedFree))
             .arg(100.0 * f.cachedShare(), 0, 'f', 1)
             .arg(f.freeBlocks == 1 ? tr("1 free block") : tr("%1 free blocks").arg(f.freeBlocks))
             .arg(bytesText(f.largestFree))
             .arg(100.0 * f.fragmentation(), 0, 'f', 1);
  }
  if (d.layout.blocksOutside)
    s += tr("; %1 outside segments, laid out by address with gaps elided")
             .arg(blocksText(d.layout.blocksOutside));
  // The largest live block and why it is alive: the one to look at first when memory runs out
  // (in a uniformly blue map nothing said which it was).
  const auto largest =
      std::max_element(d.state.blocks.begin(), d.state.blocks.end(),
                       [](const MemBlock& x, const MemBlock& y) { return x.bytes < y.bytes; });
  if (largest != d.state.blocks.end()) {
    const storage::MemRecord& a = d.mem->allocOf(*largest);
    QString who;
    if (const MemOp* o = a.opSeq ? d.mem->op(a.opSeq) : nullptr)
      who = QStringLiteral("%1 #%2").arg(qs(o->name)).arg(o->seq) +
            (o->scope.empty() ? QString() : QStringLiteral(", ") + qs(o->scope));
    else if (a.label == storage::kLiveBefore)
      who = tr("live before the recording");
    else
      who = a.opSeq ? tr("op #%1").arg(a.opSeq) : tr("outside ops");
    s += tr("<br>largest live block %1 (%2; %3)")
             .arg(bytesText(largest->bytes), who.toHtmlEscaped(),
                  qs(d.mem->whyAlive(*largest, d.cursor).text).toHtmlEscaped());
  }
  return s;
}

QString MemoryView::blockToolTip(size_t index) const {
  const Impl& d = *d_;
  if (!d.mem || index >= d.state.blocks.size()) return {};
  return allocationTip(*d.mem, d.state.blocks[index], d.cursor);
}

QString memory_detail::allocationTip(const MemoryModel& m, const MemBlock& b, int64_t cursor) {
  auto tr = [](const char* s) { return MemoryView::tr(s); };
  const storage::MemRecord& a = m.allocOf(b);
  QString t = tr("<b>%1</b> at %2").arg(bytesText(b.bytes), hexAddr(b.address));
  if (a.bufferId) t += tr(" · buffer %1").arg(a.bufferId);
  if (const MemBuffer* buf = m.buffer(a.bufferId); buf && buf->tensor) {
    const MemTensor& x = *buf->tensor;
    t += tr("<br><b>tensor</b>: %1 %2 — %3 %4 of op #%5")
             .arg(qs(x.dtype), shapeText(x.shape), x.output ? tr("output") : tr("input"))
             .arg(x.index)
             .arg(x.opSeq);
  }
  if (const MemOp* o = a.opSeq ? m.op(a.opSeq) : nullptr) {
    t += tr("<br><b>op</b>: %1 #%2 (%3)")
             .arg(qs(o->name).toHtmlEscaped())
             .arg(o->seq)
             .arg(qs(phaseName(o->phase)));
    if (!o->scope.empty()) t += tr(" · scope %1").arg(qs(o->scope).toHtmlEscaped());
    t += o->step == 0 ? tr(" · initialisation") : tr(" · step %1").arg(o->step);
  } else if (a.opSeq) {
    t += tr("<br><b>op</b>: #%1 (not recorded)").arg(a.opSeq);
  } else if (a.label == storage::kLiveBefore) {  // Note [A step range's first step]
    t += tr("<br><b>op</b>: allocated before the recording began (live at step %1, its first)")
             .arg(a.step);
  } else if (!m.hasSteps()) {  // an imported snapshot: no ops, no steps
    t += tr("<br><b>op</b>: allocated outside ops");
  } else {
    t += tr("<br><b>op</b>: allocated outside ops (%1)")
             .arg(a.step == 0 ? tr("initialisation") : tr("step %1").arg(a.step));
  }
  t += tr("<br><b>alive because</b>: %1").arg(qs(m.whyAlive(b, cursor).text).toHtmlEscaped());
  t += tr("<br>allocated at event %1").arg(b.allocEvent);
  if (const auto* frames = a.stackId >= 0 ? m.stack(a.stackId) : nullptr;
      frames && !frames->empty()) {
    t += tr("<br><b>stack</b>:");
    // The allocator's and Buffer's own frames say nothing about who asked: skip them.
    size_t first = 0;
    while (first + 1 < frames->size() && isAllocatorFrame((*frames)[first].function)) ++first;
    for (size_t i = first; i < std::min<size_t>(frames->size(), first + 6); ++i) {
      const storage::StackFrame& f = (*frames)[i];
      QString fn = f.function.empty() ? hexAddr(f.address) : qs(f.function);
      if (fn.size() > 90) fn = fn.left(87) + "…";
      t += "<br>&nbsp;&nbsp;" + fn.toHtmlEscaped();
      if (!f.file.empty())
        t += QStringLiteral(" <span style='color:#666'>(%1:%2)</span>")
                 .arg(qs(f.file).section('/', -2).toHtmlEscaped())
                 .arg(f.line);
    }
  }
  return t;
}

}  // namespace keel::views
