// DiffModel, DiffFilterProxy and DiffView: see diff_view.h. Rows point into the immutable report
// snapshot; the first (and root) divergence are moved to the top, every pair appears once.
#include "keel/views/diff_view.h"

#include <QCheckBox>
#include <QColor>
#include <QFont>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QLabel>
#include <QLineEdit>
#include <QTableView>
#include <QVBoxLayout>
#include <cmath>
#include <optional>

#include "keel/views/selection.h"
#include "table_util.h"
#include "text_util.h"

namespace keel::views {
namespace {

using storage::DiffStatus;

bool samePair(const storage::OpPair& a, const storage::OpPair& b) {
  return a.step == b.step && a.inA == b.inA && a.inB == b.inB && a.seqA == b.seqA &&
         a.seqB == b.seqB;
}

QString statusText(const storage::OpPair& p) {
  switch (p.status) {
    case DiffStatus::Equal:
      return storage::valuesCompared(p) ? QStringLiteral("equal") : QStringLiteral("not compared");
    case DiffStatus::WithinTolerance:
      return QStringLiteral("within tolerance");
    case DiffStatus::Diverged:
      return QStringLiteral("diverged");
    case DiffStatus::Unmatched:
      return p.inA ? QStringLiteral("only in A") : QStringLiteral("only in B");
  }
  return {};
}

QColor statusBackground(DiffStatus s, bool marked) {
  switch (s) {
    case DiffStatus::Equal:
      return QColor(0xd4, 0xed, 0xda);
    case DiffStatus::WithinTolerance:
      return QColor(0xff, 0xf0, 0xb3);
    case DiffStatus::Diverged:
      return marked ? QColor(0xf1, 0xa7, 0xae) : QColor(0xf8, 0xd7, 0xda);
    case DiffStatus::Unmatched:
      return QColor(0xe2, 0xe3, 0xe5);
  }
  return {};
}

// The output that settled the pair's verdict: the worst one (first of equals).
const storage::TensorDiff* worstOutput(const storage::OpPair& p) {
  const storage::TensorDiff* worst = nullptr;
  for (const auto& t : p.outputs)
    if (!worst || int(t.status) > int(worst->status)) worst = &t;
  return worst;
}

QString numberOrBlank(double v) {
  return std::isnan(v) ? QString() : QString::number(v, 'g', 5);
}

}  // namespace

// ---- DiffModel ----

DiffModel::DiffModel(QObject* parent)
    : RecordTableModel(
          {tr("Status"),
           tr("Step"),
           tr("A #"),
           tr("B #"),
           tr("Op"),
           tr("Phase"),
           tr("Scope"),
           {tr("Max abs"), tr("largest |a - b| over the outputs (dumped values only)")},
           {tr("Max rel"), tr("largest |a - b| / |b| over the outputs (dumped values only)")},
           {tr("Basis"), tr("what settled the verdict of the worst output")},
           {tr("Kernel"),
            tr("whether the two runs ran the same kernel variant for this op (algorithm, "
               "accumulation dtype, reduction order); the variants on hover")},
           tr("Detail")},
          parent) {}

double DiffModel::maxAbs(const storage::OpPair& p) {
  double m = storage::kNoValue;
  for (const auto& t : p.outputs)
    if (!std::isnan(t.maxAbs) && (std::isnan(m) || t.maxAbs > m)) m = t.maxAbs;
  return m;
}

double DiffModel::maxRel(const storage::OpPair& p) {
  double m = storage::kNoValue;
  for (const auto& t : p.outputs)
    if (!std::isnan(t.maxRel) && (std::isnan(m) || t.maxRel > m)) m = t.maxRel;
  return m;
}

void DiffModel::setReport(DiffPtr report) {
  beginResetModel();
  report_ = std::move(report);
  rows_.clear();
  marks_.clear();
  rowOfA_.clear();
  rowOfB_.clear();
  if (report_) {
    const auto& pairs = report_->pairs;
    // The marked pairs, found in pairs (their own copy when pairs left them out).
    std::vector<std::pair<const storage::OpPair*, int>> top;
    auto addMarked = [&](const std::optional<storage::Divergence>& d, int mark) {
      if (!d) return;
      for (auto& [p, m] : top)
        if (samePair(*p, d->pair)) {
          m |= mark;
          return;
        }
      const storage::OpPair* found = &d->pair;
      for (const auto& p : pairs)
        if (samePair(p, d->pair)) {
          found = &p;
          break;
        }
      top.emplace_back(found, mark);
    };
    addMarked(report_->first, FirstDivergence);
    addMarked(report_->root, RootDivergence);
    rows_.reserve(pairs.size() + top.size());
    for (auto& [p, m] : top) {
      rows_.push_back(p);
      marks_.push_back(m);
    }
    for (const auto& p : pairs) {
      bool isTop = false;
      for (auto& t : top) isTop = isTop || t.first == &p;
      if (isTop) continue;
      rows_.push_back(&p);
      marks_.push_back(NoMark);
    }
    for (int row = int(rows_.size()) - 1; row >= 0; --row) {
      const auto* p = rows_[size_t(row)];
      if (p->inA) rowOfA_.insert(p->seqA, row);
      if (p->inB) rowOfB_.insert(p->seqB, row);
    }
  }
  endResetModel();
}

const storage::OpPair* DiffModel::pairAt(int row) const {
  return row >= 0 && size_t(row) < rows_.size() ? rows_[size_t(row)] : nullptr;
}

int DiffModel::markAt(int row) const {
  return row >= 0 && size_t(row) < marks_.size() ? marks_[size_t(row)] : NoMark;
}

int DiffModel::rowOf(Side side, uint64_t seq) const {
  return (side == Side::A ? rowOfA_ : rowOfB_).value(seq, -1);
}

int DiffModel::recordCount() const {
  return int(rows_.size());
}

QVariant DiffModel::data(const QModelIndex& index, int role) const {
  const storage::OpPair* p = index.isValid() ? pairAt(index.row()) : nullptr;
  if (!p) return {};
  const int col = index.column();
  const int mark = markAt(index.row());
  switch (role) {
    case StatusRole:
      return int(p->status);
    case MarkRole:
      return mark;
    case Qt::DisplayRole:
      switch (col) {
        case Status: {
          QString s = statusText(*p);
          if (mark == (FirstDivergence | RootDivergence))
            s += QStringLiteral(" — first, root");
          else if (mark & FirstDivergence)
            s += QStringLiteral(" — first");
          else if (mark & RootDivergence)
            s += QStringLiteral(" — root");
          return s;
        }
        case Step:
          return QVariant::fromValue<qint64>(p->step);
        case SeqA:
          return p->inA ? QVariant::fromValue<quint64>(p->seqA) : QVariant();
        case SeqB:
          return p->inB ? QVariant::fromValue<quint64>(p->seqB) : QVariant();
        case Name:
          return p->nameB.empty() ? QString::fromStdString(p->name)
                                  : QString::fromStdString(p->name + " / " + p->nameB);
        case Phase:
          return qs(phaseName(p->phase));
        case Scope:
          return QString::fromStdString(p->scope);
        case MaxAbs:
          return numberOrBlank(maxAbs(*p));
        case MaxRel:
          return numberOrBlank(maxRel(*p));
        case Basis: {
          auto* w = worstOutput(*p);
          return w ? QString::fromUtf8(storage::toString(w->basis)) : QString();
        }
        case Kernel:
          switch (storage::kernelMatch(*p)) {
            case storage::KernelMatch::Same:
              return tr("same");
            case storage::KernelMatch::Different:
              return tr("different");
            case storage::KernelMatch::Unknown:
              return QString();
          }
          return QString();
        case Detail: {
          QStringList parts;
          if (!p->exactSignature && p->inA && p->inB)
            parts << QStringLiteral("paired on name/phase/scope only");
          if (auto* w = worstOutput(*p); w && !w->detail.empty() && w->status != DiffStatus::Equal)
            parts << QStringLiteral("output %1: %2")
                         .arg(w->index)
                         .arg(QString::fromStdString(w->detail));
          return parts.join(QStringLiteral("; "));
        }
      }
      return {};
    case SortRole:
      switch (col) {
        case Status:
          return int(p->status);
        case Step:
          return QVariant::fromValue<qint64>(p->step);
        case SeqA:
          return QVariant::fromValue<quint64>(p->inA ? p->seqA : 0);
        case SeqB:
          return QVariant::fromValue<quint64>(p->inB ? p->seqB : 0);
        case MaxAbs:
          return maxAbs(*p);
        case MaxRel:
          return maxRel(*p);
        default:
          return data(index, Qt::DisplayRole);
      }
    case Qt::ToolTipRole: {
      if (col == Status) {
        QString tip;
        if (mark & FirstDivergence) tip += tr("First divergence: the earliest diverged op of A.\n");
        if (mark & RootDivergence)
          tip += tr("Root divergence: the earliest diverged op whose inputs all match.\n");
        for (const auto& t : p->outputs)
          tip += tr("output %1: %2 (%3)%4\n")
                     .arg(t.index)
                     .arg(QString::fromUtf8(storage::toString(t.status)),
                          QString::fromUtf8(storage::toString(t.basis)),
                          t.detail.empty() ? QString() : ", " + QString::fromStdString(t.detail));
        return tip.trimmed();
      }
      if (col == Scope || col == Detail || col == Name) return data(index, Qt::DisplayRole);
      if (col == Kernel) return QString::fromStdString(storage::kernelPhrase(*p, false, true));
      if (col == MaxAbs || col == MaxRel) {
        const double v = col == MaxAbs ? maxAbs(*p) : maxRel(*p);
        return std::isnan(v) ? tr("not compared by values") : QString::number(v, 'g', 17);
      }
      return {};
    }
    case Qt::TextAlignmentRole:
      if (col == Step || col == SeqA || col == SeqB || col == MaxAbs || col == MaxRel)
        return QVariant(Qt::AlignRight | Qt::AlignVCenter);
      return {};
    case Qt::BackgroundRole:
      if (col == Status)
        return storage::valuesCompared(*p) ? statusBackground(p->status, mark != NoMark)
                                           : QColor(0xf1, 0xf3, 0xf4);
      // A diverged pair whose two runs ran different kernels: the likely reason, marked.
      if (col == Kernel && p->status != DiffStatus::Equal &&
          storage::kernelMatch(*p) == storage::KernelMatch::Different)
        return QColor(0xff, 0xf0, 0xb3);
      return {};
    case Qt::ForegroundRole:
      if (col == Status) return QColor(0x1a, 0x1a, 0x1a);  // readable on the light status colours
      return {};
    case Qt::FontRole:
      if (mark != NoMark) {
        QFont f;
        f.setBold(true);
        return f;
      }
      return {};
  }
  return {};
}

// ---- DiffFilterProxy ----

DiffFilterProxy::DiffFilterProxy(QObject* parent) : QSortFilterProxyModel(parent) {
  setSortRole(DiffModel::SortRole);
}

void DiffFilterProxy::setMismatchesOnly(bool on) {
  if (on == mismatchesOnly_) return;
  mismatchesOnly_ = on;
  invalidateFilter();
}

bool DiffFilterProxy::filterAcceptsRow(int sourceRow, const QModelIndex& sourceParent) const {
  auto* model = qobject_cast<const DiffModel*>(sourceModel());
  const storage::OpPair* p = model && !sourceParent.isValid() ? model->pairAt(sourceRow) : nullptr;
  if (!p) return false;
  return !mismatchesOnly_ || storage::isMismatch(p->status);
}

// ---- DiffView ----

DiffView::DiffView(Selection* selection, Side, QWidget* parent)
    : QWidget(parent), selection_(selection) {
  model_ = new DiffModel(this);
  proxy_ = new DiffFilterProxy(this);
  proxy_->setSourceModel(model_);

  summary_ = new QLabel(this);
  summary_->setObjectName("diffSummary");
  summary_->setTextFormat(Qt::RichText);
  summary_->setWordWrap(true);
  summary_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  mismatches_ = new QCheckBox(tr("Mismatches only"), this);
  mismatches_->setObjectName("diffMismatchesOnly");
  mismatches_->setToolTip(tr("hide pairs that are equal or within tolerance"));

  // The tolerances of the comparison (keel diff's --atol, --rtol and --ulps): a pair is within
  // tolerance where every element has |a - b| <= atol + rtol * |b|, or is within ULPs units in
  // the last place; changed here, the runs are compared again.
  auto field = [this](const char* name, const QString& tip) {
    auto* e = new QLineEdit(this);
    e->setObjectName(name);
    e->setToolTip(tip);
    e->setProperty("tip", tip);
    e->setMaximumWidth(fontMetrics().horizontalAdvance(QStringLiteral("0.000001e-00")));
    connect(e, &QLineEdit::editingFinished, this, [this] { applyTolerance(); });
    return e;
  };
  atol_ = field("diffAtol", tr("absolute tolerance (keel diff --atol)"));
  rtol_ = field("diffRtol", tr("relative tolerance, against B (keel diff --rtol)"));
  ulps_ = field("diffUlps", tr("also accept elements within this many units in the last place "
                               "(0: off; keel diff --ulps)"));
  setTolerance(storage::DiffOptions{}.atol, storage::DiffOptions{}.rtol, 0);
  ulps_->setMaximumWidth(fontMetrics().horizontalAdvance(QStringLiteral("0000000")));
  auto* tolerances = new QHBoxLayout;
  for (auto [label, edit] :
       {std::pair{tr("atol"), atol_}, std::pair{tr("rtol"), rtol_}, std::pair{tr("ULPs"), ulps_}}) {
    tolerances->addWidget(new QLabel(label, this));
    tolerances->addWidget(edit);
  }
  auto* controls = new QVBoxLayout;
  controls->addWidget(mismatches_);
  controls->addLayout(tolerances);
  controls->addStretch(1);
  auto* bar = new QHBoxLayout;
  bar->addWidget(summary_, 1);
  bar->addLayout(controls);
  bar->setAlignment(controls, Qt::AlignTop);

  table_ = makeRecordTable(this, "diffTable", proxy_);
  byParameter_ = new QLabel(this);
  byParameter_->setObjectName("diffByParameter");
  byParameter_->setWordWrap(true);
  byParameter_->setAlignment(Qt::AlignLeft | Qt::AlignTop);
  byParameter_->hide();

  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->addLayout(bar);
  layout->addWidget(table_);
  layout->addWidget(byParameter_, 1);

  connect(mismatches_, &QCheckBox::toggled, this, [this](bool on) {
    syncing_ = true;
    proxy_->setMismatchesOnly(on);
    syncing_ = false;
  });
  connect(table_->selectionModel(), &QItemSelectionModel::currentRowChanged, this,
          [this](const QModelIndex& current) {
            if (!syncing_) selectRow(current);
          });
  connect(table_, &QTableView::clicked, this, [this](const QModelIndex& i) { selectRow(i); });
  if (selection_)
    connect(selection_, &Selection::selected, this,
            [this](Side side, quint64 seq) { onSelected(side, seq); });
  updateSummary();
}

void DiffView::showFailure(const QString& message) {
  setReport(nullptr);
  failure_ = message;
  updateSummary();
}

void DiffView::setReport(DiffPtr report) {
  failure_.clear();
  syncing_ = true;
  model_->setReport(std::move(report));
  // Long names and scopes cut to 20 characters where the table is narrow; room it has to spare
  // goes to them before the detail column.
  fitColumns(table_, {int(DiffModel::Scope), int(DiffModel::Name)}, 20);
  syncing_ = false;
  // A report made again (a live run compared anew) keeps the selected pair's row current.
  if (selection_)
    if (const auto seq = selection_->current(Side::A)) onSelected(Side::A, *seq);
  updateSummary();
}

void DiffView::setOutOfDate(const QString& note) {
  if (note == outOfDate_) return;
  outOfDate_ = note;
  updateSummary();
}

void DiffView::setRuns(RunsPtr runs, int shownRank) {
  runs_ = std::move(runs);
  runsRank_ = shownRank;
  const bool byParameter = runs_ && runs_->kind == RunsComparison::Kind::ByParameter;
  table_->setVisible(!byParameter);
  byParameter_->setVisible(byParameter);
  byParameter_->setText(
      byParameter
          ? tr("Op by op needs one layout on both sides: a rank of a run folder sees its own "
               "share of the batch or of the weights, so its ops differ from the other run's for "
               "that alone. The runs are compared by what both update, each parameter's value "
               "and gradient whole; the graphs show the two runs side by side (a run folder's "
               "rank 0, or the rank chosen), with the update of the first parameter to differ "
               "selected.")
          : QString());
  updateSummary();
}

void DiffView::setTolerance(double atol, double rtol, uint64_t ulps) {
  atol_->setText(QString::number(atol, 'g', 6));
  rtol_->setText(QString::number(rtol, 'g', 6));
  ulps_->setText(QString::number(ulps));
  for (QLineEdit* e : {atol_, rtol_, ulps_}) {
    e->setStyleSheet({});
    e->setToolTip(e->property("tip").toString());
  }
}

QString DiffView::toleranceError() const {
  for (auto [name, edit] : {std::pair{"atol", atol_}, std::pair{"rtol", rtol_}}) {
    bool ok = false;
    const double v = edit->text().trimmed().toDouble(&ok);
    if (!ok || !std::isfinite(v) || v < 0)
      return tr("%1: expected a number >= 0, got '%2'").arg(name, edit->text());
  }
  bool ok = false;
  ulps_->text().trimmed().toULongLong(&ok);
  if (!ok) return tr("ULPs: expected a whole number >= 0, got '%1'").arg(ulps_->text());
  return {};
}

void DiffView::applyTolerance() {
  const QString error = toleranceError();
  for (QLineEdit* e : {atol_, rtol_, ulps_}) {
    // The field at fault is marked and says why; the comparison shown stays.
    const bool bad = !error.isEmpty() && error.startsWith(e == atol_   ? QStringLiteral("atol")
                                                          : e == rtol_ ? QStringLiteral("rtol")
                                                                       : QStringLiteral("ULPs"));
    e->setStyleSheet(bad ? QStringLiteral("QLineEdit { background: #ffd7d7; }") : QString());
    e->setToolTip(bad ? error : e->property("tip").toString());
  }
  if (!error.isEmpty()) return;
  const double atol = atol_->text().trimmed().toDouble();
  const double rtol = rtol_->text().trimmed().toDouble();
  const quint64 ulps = ulps_->text().trimmed().toULongLong();
  const DiffPtr r = model_->report();
  const storage::DiffOptions& shown = r       ? r->options
                                      : runs_ ? runs_->options
                                              : storage::DiffOptions{};
  if (shown.atol == atol && shown.rtol == rtol && shown.maxUlps == ulps && (r || runs_)) return;
  emit toleranceChanged(atol, rtol, ulps);
}

void DiffView::setMismatchesOnly(bool on) {
  mismatches_->setChecked(on);
}

QString DiffView::summaryText() const {
  return summary_->text();
}

void DiffView::onSelected(Side side, quint64 seq) {
  const int row = model_->rowOf(side, seq);
  if (row < 0) return;
  const QModelIndex idx = proxy_->mapFromSource(model_->index(row, 0));
  if (!idx.isValid()) return;
  syncing_ = true;
  table_->selectionModel()->setCurrentIndex(
      idx, QItemSelectionModel::ClearAndSelect | QItemSelectionModel::Rows);
  table_->scrollTo(idx);
  syncing_ = false;
}

void DiffView::selectRow(const QModelIndex& proxyIndex) {
  if (!selection_ || !proxyIndex.isValid()) return;
  const storage::OpPair* p = model_->pairAt(proxy_->mapToSource(proxyIndex).row());
  if (!p) return;
  syncing_ = true;  // the pair's own selected() signals must not move the row
  selection_->selectPair(p->inA ? std::optional<uint64_t>(p->seqA) : std::nullopt,
                         p->inB ? std::optional<uint64_t>(p->seqB) : std::nullopt);
  syncing_ = false;
}

QString DiffView::runsText() const {
  if (!runs_) return {};
  const RunsComparison& c = *runs_;
  const QString red = QStringLiteral("<b style='color:#b00020'>%1</b>");
  const QString green = QStringLiteral("<b style='color:#1e7b34'>%1</b>");
  if (c.kind == RunsComparison::Kind::ByParameter) {
    // keel diff's two lines: what was compared, then the verdict or the first difference.
    const QStringList lines = c.text.trimmed().split('\n');
    QString text =
        (c.diverged ? red.arg(tr("DIVERGED")) : green.arg(tr("EQUAL WITHIN TOLERANCE"))) +
        tr(" &nbsp; by parameter");
    for (QString l : lines) {
      if (l.startsWith(QLatin1String("keel diff by parameter: "))) l = l.mid(24);
      if (!l.isEmpty()) l[0] = l[0].toUpper();
      text += "<br>" + l.toHtmlEscaped();
    }
    return text;
  }
  QString head;
  if (c.firstRank)
    head = red.arg(tr("rank %1 diverged first").arg(*c.firstRank));
  else
    head = c.diverged ? red.arg(tr("DIVERGED")) : green.arg(tr("every rank equal"));
  QString text =
      tr("<b>Run folders, rank by rank</b> (%1): %2").arg(c.layout.toHtmlEscaped(), head);
  if (runsRank_ >= 0)
    text += tr(" &nbsp; <span style='color:gray'>the table: rank %1 of A against rank %1 of "
               "B</span>")
                .arg(runsRank_);
  for (const QString& s : c.setup)
    text += QStringLiteral("<br><span style='color:#8a5a00'>%1</span>")
                .arg(tr("Setup differs on every rank: %1").arg(s).toHtmlEscaped());
  // A line per rank, the rank shown in bold; past 8 ranks the ones that diverged, and a count.
  const size_t n = c.rankLines.size();
  size_t left = 0;
  for (size_t r = 0; r < n; ++r) {
    if (n > 8 && !c.rankDiverged[r] && int(r) != runsRank_) {
      ++left;
      continue;
    }
    const QString line = tr("rank %1: %2").arg(r).arg(c.rankLines[r]).toHtmlEscaped();
    text += "<br>" + (c.rankDiverged[r] ? QStringLiteral("<span style='color:#b00020'>%1</span>")
                                        : QStringLiteral("%1"))
                         .arg(int(r) == runsRank_ ? "<b>" + line + "</b>" : line);
  }
  if (left > 0)
    text +=
        tr("<br><span style='color:gray'>%L1 other ranks equal within tolerance</span>").arg(left);
  return text;
}

void DiffView::updateSummary() {
  const DiffPtr r = model_->report();
  if (runs_ && runs_->kind == RunsComparison::Kind::ByParameter) {
    summary_->setText((outOfDate_.isEmpty()
                           ? QString()
                           : QStringLiteral("<b style='color:#c62828'>%1</b> %2<br>")
                                 .arg(tr("OUT OF DATE:"), outOfDate_.toHtmlEscaped())) +
                      runsText());
    summary_->setToolTip({});
    return;
  }
  QString runs = runsText();
  if (!runs.isEmpty()) runs += "<br>";
  if (!r) {
    summary_->setText(
        !failure_.isEmpty() ? QStringLiteral("<span style='color:#c62828'><b>%1</b></span> %2")
                                  .arg(tr("The comparison failed:"), failure_.toHtmlEscaped())
        : !runs.isEmpty() ? runs + tr("<i>Comparing the rank shown…</i>")
                          : tr("<i>No comparison.</i> Open a second recording to compare it op "
                               "by op."));
    return;
  }
  const auto& t = r->total;
  const storage::DiffVerdict v = storage::diffVerdict(*r);
  const int64_t unmatched = t.onlyInA + t.onlyInB;
  // First, before the verdict: a verdict about a state run A has left must say so.
  const QString outOfDate = outOfDate_.isEmpty()
                                ? QString()
                                : QStringLiteral("<b style='color:#c62828'>%1</b> %2<br>")
                                      .arg(tr("OUT OF DATE:"), outOfDate_.toHtmlEscaped());
  QString verdict;
  if (v == storage::DiffVerdict::Diverged)
    verdict = QStringLiteral("<b style='color:#b00020'>%1</b>").arg(tr("DIVERGED"));
  else if (v == storage::DiffVerdict::ValuesNotCompared)
    verdict = QStringLiteral("<b style='color:#8a6d00'>%1</b>").arg(tr("NO VALUES COMPARED"));
  else if (t.withinTolerance > 0 || unmatched > 0 || t.notCompared > 0)  // not all identical
    verdict = QStringLiteral("<b style='color:#8a6d00'>%1</b>").arg(tr("EQUAL WITHIN TOLERANCE"));
  else
    verdict = QStringLiteral("<b style='color:#1e7b34'>%1</b>").arg(tr("IDENTICAL"));
  QString text = outOfDate + runs + tr("%1 &nbsp; %L2 equal · ").arg(verdict).arg(t.equal);
  if (t.notCompared > 0) text += tr("%L1 not compared · ").arg(t.notCompared);
  text += tr("%L1 within tolerance · %L2 diverged · %L3 unmatched")
              .arg(t.withinTolerance)
              .arg(t.diverged)
              .arg(unmatched);
  if (unmatched > 0) text += tr(" (%L1 only in A, %L2 only in B)").arg(t.onlyInA).arg(t.onlyInB);
  if (r->options.align == storage::DiffAlign::Module) {  // Note [Diff across frameworks]
    text += tr(" &nbsp; <span style='color:gray'>%1 vs %2, paired by module</span>")
                .arg(QString::fromStdString(r->frameworkA), QString::fromStdString(r->frameworkB));
    summary_->setToolTip(tr("Two frameworks: ops paired by module scope, op kind and position; "
                            "first outputs compared; %L1 + %L2 views and copies left out "
                            "(docs/diff.md, \"Across frameworks\")")
                             .arg(r->total.viewsA)
                             .arg(r->total.viewsB));
  } else {
    summary_->setToolTip({});
  }
  if (v == storage::DiffVerdict::ValuesNotCompared) {
    QString why = qs(storage::valuesNotComparedText(*r));
    if (!why.isEmpty()) why[0] = why[0].toUpper();
    text += "<br><span style='color:#8a6d00'>" + why.toHtmlEscaped() + ".</span>";
  } else if (r->uncomparedTensors > 0)
    text += tr("<br><span style='color:gray'>%L1 tensors had nothing to compare (record with "
               "--md5 or --stats)</span>")
                .arg(r->uncomparedTensors);
  if (const storage::LossDiff* l = storage::firstLossDivergence(*r); l && !r->first) {
    // At the digits that tell the two apart (a NaN on either side prints as NaN).
    const QString losses =
        std::isnan(l->a) || std::isnan(l->b)
            ? tr("A %1 vs B %2")
                  .arg(std::isnan(l->a) ? tr("NaN") : QString::number(l->a, 'g', 6),
                       std::isnan(l->b) ? tr("NaN") : QString::number(l->b, 'g', 6))
            : qs("A " + storage::numberPair(l->a, l->b, " vs B "));
    text += tr("<br>First divergence: step %1 <b>loss</b> (%2); %3")
                .arg(l->step)
                .arg(losses,
                     r->comparedTensors == 0
                         ? tr("no op can be named without tensor values: record both with --all")
                         : tr("no recorded op output diverged"));
  }
  for (const std::string& s : r->setup)  // seed, config, step counts, an unfinished run
    text += QStringLiteral("<br><span style='color:#8a5a00'>%1</span>")
                .arg(tr("Setup differs: %1").arg(QString::fromStdString(s)).toHtmlEscaped());
  if (r->first) {
    const auto& p = r->first->pair;
    // --strict: an op on one side only can be the first divergence.
    const QString at = p.inA && p.inB ? tr("A #%1 / B #%2").arg(p.seqA).arg(p.seqB)
                       : p.inA        ? tr("only in A #%1").arg(p.seqA)
                                      : tr("only in B #%1").arg(p.seqB);
    text += tr("<br>First divergence: step %1, %2 <b>%3</b> [%4] %5")
                .arg(p.step)
                .arg(at)
                .arg(QString::fromStdString(p.name).toHtmlEscaped(),
                     qs(phaseName(p.phase)).toHtmlEscaped(),
                     QString::fromStdString(p.scope).toHtmlEscaped());
    if (r->root && !samePair(r->root->pair, p)) {
      const auto& q = r->root->pair;
      // A root on one side only (across frameworks: an op the other run has no counterpart
      // of, such as a forward hook's add) is named by its side.
      const QString where = q.inA && q.inB ? tr("A #%1 / B #%2").arg(q.seqA).arg(q.seqB)
                            : q.inA        ? tr("only in A #%1").arg(q.seqA)
                                           : tr("only in B #%1").arg(q.seqB);
      text += tr(" &nbsp; root: %1 <b>%2</b> %3")
                  .arg(where, QString::fromStdString(q.name).toHtmlEscaped(),
                       QString::fromStdString(q.scope).toHtmlEscaped());
    } else if (r->root) {
      text += tr(" (also the root: its inputs all match)");
    } else if (!r->noRoot.empty()) {
      text += QStringLiteral("<br><span style='color:gray'>%1</span>")
                  .arg(tr("No root divergence: %1")
                           .arg(QString::fromStdString(r->noRoot))
                           .toHtmlEscaped());
    }
    if (auto* w = worstOutput(p); w && !w->detail.empty())
      text += QStringLiteral("<br><span style='color:gray'>output %1: %2</span>")
                  .arg(w->index)
                  .arg(QString::fromStdString(w->detail).toHtmlEscaped());
  }
  summary_->setText(text);
}

}  // namespace keel::views
