// The first-NaN/Inf banner: one line naming the run's first op with a non-finite tensor (its step,
// seq, name, scope and which output holds how many NaN/Inf) and a button that selects that op.
// Hidden when the run has none. The status bar and the inspector each show one.
#pragma once
#include <QFrame>
#include <QString>

#include "keel/views/run_data.h"

class QLabel;
class QPushButton;

namespace keel::views {

// "first NaN/Inf: step 1, #70 matmul, blocks.0.mlp.w2 — output 0: 1 NaN". Pure; tested as text.
QString nonFiniteBannerText(const storage::OpRecord& op);

class NonFiniteBanner : public QFrame {
  Q_OBJECT
 public:
  explicit NonFiniteBanner(QWidget* parent = nullptr);
  // Shows the summary's first non-finite op (hides itself when it has none, or for nullptr).
  void setSummary(const SummaryPtr& summary);
  QString text() const;
  QPushButton* selectButton() const { return button_; }

 signals:
  void selectRequested(quint64 seq, qint64 step);  // the button: select this op of this step

 private:
  QLabel* label_;
  QPushButton* button_;
  uint64_t seq_ = 0;
  int64_t step_ = 0;
};

}  // namespace keel::views
