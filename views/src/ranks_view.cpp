// The Ranks panel (see keel/views/ranks_view.h).
#include "keel/views/ranks_view.h"

#include <QHeaderView>
#include <QLabel>
#include <QScrollBar>
#include <QSplitter>
#include <QTableWidget>
#include <QVBoxLayout>
#include <QtConcurrent/QtConcurrent>
#include <algorithm>
#include <cmath>

#include "keel/storage/errors.h"
#include "text_util.h"

namespace keel::views {

namespace {

QString ms(int64_t ns) {
  return QString::fromStdString(analysis::waitText(ns));
}

QTableWidget* makeTable(const QStringList& headers, const QString& name) {
  auto* t = new QTableWidget(0, int(headers.size()));
  t->setObjectName(name);
  t->setHorizontalHeaderLabels(headers);
  t->setEditTriggers(QAbstractItemView::NoEditTriggers);
  t->setSelectionBehavior(QAbstractItemView::SelectRows);
  t->setSelectionMode(QAbstractItemView::SingleSelection);
  t->verticalHeader()->setVisible(false);
  t->verticalHeader()->setDefaultSectionSize(t->fontMetrics().height() + 6);
  t->horizontalHeader()->setStretchLastSection(true);
  t->setAlternatingRowColors(true);
  return t;
}

QTableWidgetItem* item(const QString& text, Qt::Alignment align = Qt::AlignLeft) {
  auto* i = new QTableWidgetItem(text);
  i->setTextAlignment(align | Qt::AlignVCenter);
  return i;
}

QTableWidgetItem* number(double v, int decimals = 0) {
  return item(std::isnan(v) ? "-" : QString::number(v, 'f', decimals), Qt::AlignRight);
}

std::shared_ptr<RanksData> loadFolder(const QString& folder) {
  auto d = std::make_shared<RanksData>();
  d->folder = folder;
  const std::string dir = folder.toStdString();
  try {
    d->summary = analysis::summarizeRun(dir);
  } catch (const std::exception& e) {
    d->error = QString::fromStdString(e.what());
    return d;
  }
  const bool md5 = std::all_of(d->summary.ranks.begin(), d->summary.ranks.end(),
                               [](const analysis::RankSummary& r) { return r.md5; });
  if (!d->summary.unreadable.empty())
    d->replicaNote = "not checked: a rank file cannot be read";
  else if (d->summary.manifest.dp < 2)
    d->replicaNote = "one replica per model shard (dp 1): nothing to compare";
  else if (!md5)
    d->replicaNote = "not checked: recorded without MD5s (keel record --md5 or --all)";
  else
    try {
      d->replicas = analysis::checkReplicas(dir);
    } catch (const std::exception& e) {
      d->replicaNote = "not checked: " + QString::fromStdString(e.what());
    }
  return d;
}

}  // namespace

RanksView::RanksView(QWidget* parent) : QWidget(parent) {
  setObjectName("ranksView");
  verdict_ = new QLabel;
  verdict_->setObjectName("ranksVerdict");
  verdict_->setWordWrap(true);
  verdict_->setTextFormat(Qt::RichText);
  verdict_->setTextInteractionFlags(Qt::TextBrowserInteraction);
  verdict_->setContentsMargins(6, 4, 6, 4);
  // "Times last": how often the rank arrived last at a collective (the collectives table's "Last
  // to arrive" names a rank; one name for a count and a rank read as the same thing).
  ranks_ = makeTable({"Rank", "dp", "tp", "Steps", "Last loss", "Ops", "Collectives", "Waited",
                      "Times last", "Status"},
                     "ranksTable");
  collectives_ = makeTable(
      {"Collective", "Group", "Step", "Scope", "Bytes", "Waits (per rank)", "Last to arrive"},
      "collectivesTable");
  auto* split = split_ = new QSplitter(Qt::Horizontal);
  split->addWidget(ranks_);
  split->addWidget(collectives_);
  split->setStretchFactor(0, 5);
  split->setStretchFactor(1, 4);
  connect(split, &QSplitter::splitterMoved, this, [this] { userSplit_ = true; });
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->setSpacing(0);
  layout->addWidget(verdict_);
  layout->addWidget(split, 1);
  watcher_ = new QFutureWatcher<std::shared_ptr<RanksData>>(this);
  connect(watcher_, &QFutureWatcher<std::shared_ptr<RanksData>>::finished, this,
          [this] { show(watcher_->result()); });
  // "op:RANK:STEP:SEQ" links of the verdicts.
  connect(verdict_, &QLabel::linkActivated, this, [this](const QString& href) {
    const QStringList f = href.split(':');
    if (f.size() == 4 && f[0] == "op")
      emit opActivated(f[1].toInt(), f[2].toLongLong(), f[3].toULongLong());
  });
  connect(ranks_, &QTableWidget::cellDoubleClicked, this,
          [this](int row, int) { emit rankActivated(row); });
  // A collective double-clicked: its op, on the rank shown when it took part, else on the
  // group's first rank that recorded it.
  collectives_->setToolTip(tr("Double-click a collective to select its op on the rank shown"));
  connect(collectives_, &QTableWidget::cellDoubleClicked, this, [this](int row, int) {
    const QTableWidgetItem* it = collectives_->item(row, 0);
    if (!data_ || !it) return;
    const size_t index = it->data(Qt::UserRole).toULongLong();
    if (index >= data_->summary.collectives.size()) return;
    const analysis::AlignedCollective& a = data_->summary.collectives[index];
    std::optional<size_t> pick;
    for (size_t k = 0; k < a.ranks.size(); ++k)
      if (k < a.seqs.size() && a.seqs[k] && (!pick || a.ranks[k] == shownRank_)) pick = k;
    if (pick) emit opActivated(int(a.ranks[*pick]), a.step, *a.seqs[*pick]);
  });
  clear();
}

RanksView::~RanksView() {
  watcher_->waitForFinished();
}

void RanksView::clear() {
  data_.reset();
  folder_.clear();  // a load still running is ignored when it lands
  verdict_->setText("Open a run folder (a multi-rank recording) to see its ranks.");
  ranks_->setRowCount(0);
  collectives_->setRowCount(0);
}

void RanksView::setShownRank(int rank) {
  shownRank_ = rank;
  markShownRank();
}

void RanksView::markShownRank() {
  for (int row = 0; row < ranks_->rowCount(); ++row)
    for (int c = 0; c < ranks_->columnCount(); ++c)
      if (QTableWidgetItem* it = ranks_->item(row, c)) {
        QFont f = it->font();
        f.setBold(row == shownRank_);
        it->setFont(f);
        if (c == 0) {
          it->setText(row == shownRank_ ? QString("▶ %1").arg(row) : QString::number(row));
          it->setToolTip(row == shownRank_ ? tr("the rank every view shows")
                                           : tr("double-click to show this rank"));
        }
      }
}

void RanksView::load(const QString& folder) {
  clear();
  folder_ = folder;
  verdict_->setText("Reading the ranks of " + folder.toHtmlEscaped() + "…");
  watcher_->setFuture(QtConcurrent::run([folder] { return loadFolder(folder); }));
}

void RanksView::show(std::shared_ptr<RanksData> d) {
  if (d->folder != folder_) {  // the folder was left (or another opened) while it loaded
    emit loaded();
    return;
  }
  if (!d->error.isEmpty()) {
    verdict_->setText("<span style='color:#b00020'>" + d->error.toHtmlEscaped() + "</span>");
    emit failed(d->error);
    return;
  }
  data_ = d;
  const analysis::RunSummary& s = d->summary;
  // Verdicts, the important thing first: a hang, then the replicas.
  QStringList lines;
  const QString red = "<b style='color:#b00020'>", green = "<b style='color:#1b7f3b'>";
  for (const std::string& h : s.hang)
    lines << red + "Hang:</b> " + QString::fromStdString(h).toHtmlEscaped();
  for (const std::string& e : s.ended)
    lines << red + "Ended without a status:</b> " + QString::fromStdString(e).toHtmlEscaped();
  for (const std::string& u : s.unreadable)
    lines << red + "Unreadable:</b> " + QString::fromStdString(u).toHtmlEscaped();
  if (d->replicas) {
    const analysis::ReplicaReport& r = *d->replicas;
    if (r.first) {
      const analysis::ReplicaDifference& x = *r.first;
      const QString link = QString(" <a href='op:%1:%2:%3'>show rank %1's op</a>")
                               .arg(x.rankB)
                               .arg(x.step)
                               .arg(x.seqB);
      lines << red + "Replicas differ:</b> " +
                   QString("step %1, op %2 (%3%4), %5 — rank %6 op #%7 vs rank %8 op #%9")
                       .arg(x.step)
                       .arg(QString::fromStdString(x.op),
                            QString::fromStdString(std::string(phaseName(x.phase))),
                            x.scope.empty() ? QString() : ", " + QString::fromStdString(x.scope),
                            QString::fromStdString(x.what))
                       .arg(x.rankA)
                       .arg(x.seqA)
                       .arg(x.rankB)
                       .arg(x.seqB)
                       .toHtmlEscaped() +
                   link;
    } else {
      lines << green + "Replicas identical:</b> " +
                   QString("%1 step%2 and initialisation, %3 tensor%4 compared by MD5")
                       .arg(r.steps)
                       .arg(r.steps == 1 ? "" : "s")
                       .arg(r.tensorsCompared)
                       .arg(r.tensorsCompared == 1 ? "" : "s");
    }
  } else {
    lines << "Replicas: " + d->replicaNote.toHtmlEscaped();
  }
  lines << QString("%1 ranks: dp %2 × tp %3%4%5%6%7")
               .arg(s.manifest.worldSize)
               .arg(s.manifest.dp)
               .arg(s.manifest.tp)
               .arg(s.manifest.ep > 1   ? QString(", experts over ep %1").arg(s.manifest.ep)
                    : s.manifest.cp > 1 ? QString(", sequence over cp %1").arg(s.manifest.cp)
                                        : QString())
               .arg(s.manifest.vocab ? QString(", vocabulary split over tp") : QString())
               .arg(s.manifest.zero ? QString(", optimizer state sharded over dp") : QString())
               .arg(s.manifest.model.empty()
                        ? QString()
                        : ", model " + QString::fromStdString(s.manifest.model).toHtmlEscaped());
  verdict_->setText(lines.join("<br>"));

  ranks_->setRowCount(int(s.ranks.size()));
  for (int row = 0; row < int(s.ranks.size()); ++row) {
    const analysis::RankSummary& r = s.ranks[size_t(row)];
    ranks_->setItem(row, 0, number(double(r.rank)));
    ranks_->setItem(row, 1, number(double(r.dpRank)));
    ranks_->setItem(row, 2, number(double(r.tpRank)));
    if (!r.unreadable.empty()) {  // its file is missing or damaged: the row says so, the others
      for (int c = 3; c < 9; ++c) ranks_->setItem(row, c, item("-", Qt::AlignRight));
      auto* status = item("cannot be read: " + QString::fromStdString(r.unreadable));
      status->setToolTip(status->text());
      status->setForeground(QColor("#b00020"));
      ranks_->setItem(row, 9, status);
      continue;
    }
    ranks_->setItem(row, 3, number(double(r.steps)));
    ranks_->setItem(row, 4, number(r.lastLoss, 4));
    ranks_->setItem(row, 5, number(double(r.ops)));
    ranks_->setItem(row, 6, number(double(r.collectives)));
    ranks_->setItem(row, 7, item(ms(r.waitNs), Qt::AlignRight));
    ranks_->setItem(row, 8, number(double(s.lastArrivals[size_t(row)])));
    const QString text = r.ended ? QStringLiteral("ended without a status (killed or crashed)")
                                 : QString::fromStdString(r.status);
    auto* status = item(text);
    status->setToolTip(text);
    if (r.ended || r.status.rfind("failed", 0) == 0) status->setForeground(QColor("#b00020"));
    ranks_->setItem(row, 9, status);
  }
  markShownRank();
  ranks_->resizeColumnsToContents();

  // Collectives, the longest wait first: where some rank stood still for another.
  std::vector<const analysis::AlignedCollective*> order;
  for (const auto& a : s.collectives) order.push_back(&a);
  auto longest = [](const analysis::AlignedCollective* a) {
    int64_t m = 0;
    for (const auto& w : a->waitNs) m = std::max(m, w ? *w : INT64_MAX);
    return m;
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](auto* x, auto* y) { return longest(x) > longest(y); });
  collectives_->setRowCount(int(order.size()));
  for (int row = 0; row < int(order.size()); ++row) {
    const analysis::AlignedCollective& a = *order[size_t(row)];
    QStringList waits;
    bool missing = false;
    for (size_t k = 0; k < a.ranks.size(); ++k) {
      waits << QString("rank %1 %2")
                   .arg(a.ranks[k])
                   .arg(!a.waitNs[k] ? QString("never")
                        : a.pending  ? ms(*a.waitNs[k]) + ", still waiting"
                                     : ms(*a.waitNs[k]));
      missing = missing || !a.waitNs[k];
    }
    auto* name = item(QString::fromStdString(a.kind) + " #" + QString::number(a.number));
    name->setData(Qt::UserRole, qulonglong(order[size_t(row)] - s.collectives.data()));
    collectives_->setItem(row, 0, name);
    collectives_->setItem(
        row, 1, item(QString("%1 %2").arg(QString::fromStdString(a.group)).arg(a.groupIndex)));
    if (!a.mismatch.empty()) {  // the ranks called different collectives under this number
      waits << "called differently: " + QString::fromStdString(a.mismatch);
      missing = true;
    }
    collectives_->setItem(row, 2, number(double(a.step)));
    collectives_->setItem(row, 3, item(QString::fromStdString(a.scope)));
    auto* bytes = item(bytesText(uint64_t(std::max<int64_t>(0, a.bytes))), Qt::AlignRight);
    bytes->setData(Qt::ToolTipRole, QString("%L1 bytes").arg(a.bytes));
    collectives_->setItem(row, 4, bytes);
    auto* w = item(waits.join(", "));
    if (missing) w->setForeground(QColor("#b00020"));
    collectives_->setItem(row, 5, w);
    collectives_->setItem(row, 6,
                          item(a.straggler < 0 ? "-" : QString("rank %1").arg(a.straggler)));
  }
  collectives_->resizeColumnsToContents();
  // The two tables share the width as their columns need it (fixed 5:4 halves left the rank
  // table half empty and cut the collectives' waits and last-to-arrive at 1366 pixels). A hang's
  // status is a long line the verdict above already says (and its tooltip holds): the rank
  // table counts at most 48 characters of it, and the collectives' waits and last to arrive
  // come first, up to 60% of the width.
  const int statusCap = ranks_->fontMetrics().horizontalAdvance(QString(48, 'x'));
  ranks_->horizontalHeader()->setSectionResizeMode(9, QHeaderView::Stretch);  // elided, no scroll
  const auto wanted = [](const QTableWidget* t, int capColumn, int cap) {
    int w = 2 * t->frameWidth() + t->verticalScrollBar()->sizeHint().width();
    const QFontMetrics fm = t->fontMetrics();
    for (int c = 0; c < t->columnCount(); ++c) {
      int col = t->horizontalHeader()->sectionSizeHint(c);
      for (int r = 0; r < t->rowCount(); ++r)
        if (const QTableWidgetItem* i = t->item(r, c))
          col = std::max(col, fm.horizontalAdvance(i->text()) + 12);
      w += c == capColumn ? std::min(col, cap) : col;
    }
    return w;
  };
  splitWanted_ = {wanted(ranks_, 9, statusCap), wanted(collectives_, -1, 0)};
  userSplit_ = false;
  applySplit();
  emit loaded();
}

void RanksView::applySplit() {
  const auto [forRanks, forCollectives] = splitWanted_;
  if (forRanks == 0 || userSplit_) return;
  const int total = split_->width() - split_->handleWidth();
  if (total > 0 && forRanks + forCollectives > total) {
    const int c = std::min(forCollectives, total * 3 / 5);
    split_->setSizes({total - c, c});
  } else {
    split_->setSizes({forRanks, forCollectives});
  }
}

void RanksView::resizeEvent(QResizeEvent* event) {
  QWidget::resizeEvent(event);
  applySplit();  // the width it was loaded at may have been a hidden dock's
}

}  // namespace keel::views
