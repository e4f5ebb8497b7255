// The Ranks panel of a multi-rank run folder (Note [Run folders]): the verdicts first — a hang
// (which rank never joined which collective), the replica check (the first op where dp replicas
// differ) — then one row per rank (steps, last loss, collectives, time waited, how often it was
// the last to arrive, status) and the collectives lined up across ranks, longest wait first, each
// rank's wait in its own column ("never" where it did not arrive). Loaded off the GUI thread from
// keel/analysis/ranks.h, the same analysis `keel inspect RUN/` and `keel diff RUN/ --replicas`
// print. Double-clicking a rank asks to show it (rankActivated).
#pragma once
#include <QFutureWatcher>
#include <QString>
#include <QWidget>
#include <memory>
#include <optional>

#include "keel/analysis/ranks.h"

class QLabel;
class QSplitter;
class QTableWidget;

namespace keel::views {

struct RanksData {
  QString folder;
  analysis::RunSummary summary;
  std::optional<analysis::ReplicaReport> replicas;
  QString replicaNote;  // why the replica check did not run ("recorded without MD5s")
  QString error;        // the folder could not be read: the rest is empty
};

class RanksView : public QWidget {
  Q_OBJECT
 public:
  explicit RanksView(QWidget* parent = nullptr);
  ~RanksView() override;
  // Loads `folder` in the background; loaded() or failed() follows.
  void load(const QString& folder);
  void clear();
  const RanksData* data() const { return data_.get(); }
  QLabel* verdictLabel() const { return verdict_; }
  QTableWidget* rankTable() const { return ranks_; }
  QTableWidget* collectiveTable() const { return collectives_; }
  // The rank the window shows: its row is marked, and a collective double-clicked is selected on
  // it (on the group's first rank that recorded it, when the shown rank is not in its group).
  void setShownRank(int rank);

 signals:
  void loaded();  // also when a load for a folder no longer shown lands (nothing shown)
  void failed(QString message);
  void rankActivated(int rank);
  // The verdict's link to the op where the replicas differ, or a collective double-clicked: show
  // it on that rank.
  void opActivated(int rank, qint64 step, quint64 seq);

 protected:
  void resizeEvent(QResizeEvent* event) override;

 private:
  void show(std::shared_ptr<RanksData> d);
  // Shares the width between the two tables from what they want (splitWanted_), once the view
  // has its width; until the user drags the splitter (loaded hidden, the dock had none yet).
  void applySplit();
  void markShownRank();
  int shownRank_ = -1;
  QLabel* verdict_;
  QTableWidget* ranks_;
  QTableWidget* collectives_;
  QSplitter* split_;
  std::shared_ptr<RanksData> data_;
  QFutureWatcher<std::shared_ptr<RanksData>>* watcher_;
  QString folder_;                         // the folder loading or shown; "" after clear()
  std::pair<int, int> splitWanted_{0, 0};  // ranks, collectives; 0: nothing loaded
  bool userSplit_ = false;
};

}  // namespace keel::views
