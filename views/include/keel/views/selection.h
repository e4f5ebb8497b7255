// The one shared selection: choosing an op anywhere (graph node, table row, diff row, log line)
// calls select(); every view listens to selected() and shows the same op. One op per side, so a
// comparison can select the paired ops of A and B together.
#pragma once
#include <QObject>
#include <cstdint>
#include <optional>

#include "keel/views/run_data.h"

namespace keel::views {

class Selection : public QObject {
  Q_OBJECT
 public:
  explicit Selection(QObject* parent = nullptr) : QObject(parent) {}

  // Selects `seq` on `side`; emits selected() when it changed (or always when force is set).
  void select(Side side, uint64_t seq, bool force = false);
  // Selects a pair of ops (a diff row): A then B; either may be absent.
  void selectPair(std::optional<uint64_t> seqA, std::optional<uint64_t> seqB);
  void clear();
  std::optional<uint64_t> current(Side side) const { return current_[int(side)]; }

 signals:
  void selected(keel::views::Side side, quint64 seq);
  void cleared();

 private:
  std::optional<uint64_t> current_[2];
};

}  // namespace keel::views
