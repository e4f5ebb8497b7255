// MemSectionModel (see memory_view.h): the tracked sections of a MemoryModel (track_begin /
// track_end pairs), one row each, with what was still alive at each section's end and why.
#include <map>

#include "memory_view_impl.h"

namespace keel::views {

using namespace memory_detail;
using analysis::MemBlock;
using analysis::MemOp;
using analysis::MemoryModel;
using analysis::MemSection;

MemSectionModel::MemSectionModel(QObject* parent)
    : RecordTableModel({tr("Section"), tr("Alive at end"), tr("Allocated by"), tr("Peak inside"),
                        tr("Allocated"), tr("Allocs"), tr("Frees"), tr("Events")},
                       parent) {}

void MemSectionModel::setMemory(MemoryPtr memory) {
  beginResetModel();
  memory_ = std::move(memory);
  endResetModel();
}

const MemSection* MemSectionModel::sectionAt(int row) const {
  if (!memory_ || row < 0 || size_t(row) >= memory_->sections().size()) return nullptr;
  return &memory_->sections()[size_t(row)];
}

int MemSectionModel::recordCount() const {
  return memory_ ? int(memory_->sections().size()) : 0;
}

QVariant MemSectionModel::data(const QModelIndex& index, int role) const {
  const MemSection* s = index.isValid() ? sectionAt(index.row()) : nullptr;
  if (!s) return {};
  const MemoryModel& m = *memory_;
  const int col = index.column();
  auto opName = [&](const MemBlock& b) -> QString {
    const storage::MemRecord& a = m.allocOf(b);
    if (const MemOp* o = a.opSeq ? m.op(a.opSeq) : nullptr) return qs(o->name);
    if (a.label == storage::kLiveBefore) return QStringLiteral("before the recording");
    return a.opSeq ? QStringLiteral("op #%1").arg(a.opSeq) : QStringLiteral("outside ops");
  };
  switch (role) {
    case EndEventRole:
      return QVariant::fromValue<qint64>(s->endEvent ? qint64(*s->endEvent)
                                                     : qint64(m.eventCount()) - 1);
    case Qt::DisplayRole:
      switch (col) {
        case Name:
          return s->endEvent ? qs(s->name) : qs(s->name) + tr(" (not ended)");
        case Events:
          return s->endEvent ? QStringLiteral("%1–%2").arg(s->beginEvent).arg(*s->endEvent)
                             : QStringLiteral("%1–").arg(s->beginEvent);
        case Allocs:
          return QVariant::fromValue<quint64>(s->allocs);
        case Frees:
          return QVariant::fromValue<quint64>(s->frees);
        case Allocated:
          return bytesText(s->bytesAllocated);
        case Peak:
          return bytesText(s->peakBytes);
        case Alive:
          return blocksText(s->alive.size()) + ", " + bytesText(s->aliveBytes);
        case AliveOps: {
          std::map<QString, int> byOp;
          for (const MemBlock& b : s->alive) byOp[opName(b)]++;
          std::vector<std::pair<int, QString>> sorted;
          for (auto& [name, n] : byOp) sorted.emplace_back(-n, name);
          std::sort(sorted.begin(), sorted.end());
          QStringList parts;
          for (size_t i = 0; i < std::min<size_t>(sorted.size(), 4); ++i)
            parts << (sorted[i].first < -1
                          ? QStringLiteral("%1 ×%2").arg(sorted[i].second).arg(-sorted[i].first)
                          : sorted[i].second);
          if (sorted.size() > 4) parts << QStringLiteral("…");
          return parts.join(", ");
        }
      }
      return {};
    case Qt::ToolTipRole: {
      if (col != Alive && col != AliveOps && col != Name) return {};
      QString t = tr("<b>%1</b>: %2 allocations (%3), %4 frees (%5), peak %6; still alive at its "
                     "end: %7, %8")
                      .arg(qs(s->name).toHtmlEscaped())
                      .arg(s->allocs)
                      .arg(bytesText(s->bytesAllocated))
                      .arg(s->frees)
                      .arg(bytesText(s->bytesFreed))
                      .arg(bytesText(s->peakBytes))
                      .arg(blocksText(s->alive.size()))
                      .arg(bytesText(s->aliveBytes));
      const int64_t end = s->endEvent ? int64_t(*s->endEvent) : int64_t(m.eventCount()) - 1;
      for (size_t i = 0; i < std::min<size_t>(s->alive.size(), 12); ++i) {
        const MemBlock& b = s->alive[i];
        const storage::MemRecord& a = m.allocOf(b);
        t += QStringLiteral("<br>%1 at %2, %3%4 — %5")
                 .arg(bytesText(b.bytes), hexAddr(b.address),
                      a.opSeq ? QStringLiteral("op #%1 ").arg(a.opSeq) : QString(),
                      opName(b).toHtmlEscaped(), qs(m.whyAlive(b, end).text).toHtmlEscaped());
      }
      if (s->alive.size() > 12) t += tr("<br>… and %1 more").arg(s->alive.size() - 12);
      return t + tr("<br><i>Click to move the cursor to the section's end.</i>");
    }
    case Qt::TextAlignmentRole:
      if (col >= Allocs && col <= Peak) return QVariant(Qt::AlignRight | Qt::AlignVCenter);
      return {};
  }
  return {};
}

}  // namespace keel::views
