// NonFiniteBanner: see nonfinite_banner.h.
#include "keel/views/nonfinite_banner.h"

#include <QHBoxLayout>
#include <QLabel>
#include <QPushButton>
#include <QStringList>

namespace keel::views {

namespace {
// "1 NaN", "2 Inf", "1 NaN, 3 Inf".
QString counts(const storage::TensorStats& s) {
  QStringList parts;
  if (s.nanCount) parts << QString("%1 NaN").arg(s.nanCount);
  if (s.infCount) parts << QString("%1 Inf").arg(s.infCount);
  return parts.join(", ");
}
}  // namespace

QString nonFiniteBannerText(const storage::OpRecord& op) {
  QString text = QString("first NaN/Inf: step %1, #%2 %3")
                     .arg(op.step)
                     .arg(op.seq)
                     .arg(QString::fromStdString(op.name));
  if (!op.scope.empty()) text += ", " + QString::fromStdString(op.scope);
  // The outputs that hold non-finite values; the inputs only when no output does.
  QStringList where;
  for (storage::Role role : {storage::Role::Output, storage::Role::Input}) {
    for (const auto& t : op.tensors)
      if (t.role == role && t.hasStats && (t.stats.nanCount || t.stats.infCount))
        where << QString("%1 %2: %3")
                     .arg(role == storage::Role::Output ? "output" : "input")
                     .arg(t.index)
                     .arg(counts(t.stats));
    if (!where.isEmpty()) break;
  }
  if (!where.isEmpty()) text += QString::fromUtf8(" — ") + where.join("; ");
  return text;
}

NonFiniteBanner::NonFiniteBanner(QWidget* parent) : QFrame(parent) {
  setObjectName("nonFiniteBanner");
  setAutoFillBackground(true);
  QPalette p = palette();
  p.setColor(QPalette::Window, QColor(0xc6, 0x28, 0x28));
  p.setColor(QPalette::WindowText, Qt::white);
  setPalette(p);
  label_ = new QLabel(this);
  QFont f = label_->font();
  f.setBold(true);
  label_->setFont(f);
  label_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  button_ = new QPushButton(tr("Select"), this);
  button_->setToolTip(tr("Select the first op with a NaN or Inf, in its step"));
  auto* lay = new QHBoxLayout(this);
  lay->setContentsMargins(6, 2, 6, 2);
  lay->addWidget(label_, 1);
  lay->addWidget(button_);
  connect(button_, &QPushButton::clicked, this, [this] {
    if (seq_) emit selectRequested(seq_, step_);
  });
  hide();
}

void NonFiniteBanner::setSummary(const SummaryPtr& summary) {
  if (!summary || !summary->firstNonFinite) {
    seq_ = 0;
    label_->clear();
    hide();
    return;
  }
  const storage::OpRecord& op = *summary->firstNonFinite;
  seq_ = op.seq;
  step_ = op.step;
  label_->setText(nonFiniteBannerText(op));
  label_->setToolTip(label_->text());
  show();
}

QString NonFiniteBanner::text() const {
  return label_->text();
}

}  // namespace keel::views
