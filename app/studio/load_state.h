// LoadState: what the main window is waiting for, owned by one object instead of flags kept by
// hand — the count of outstanding loads (the progress bar, whenIdle), the Ranks panel's load of a
// run folder and the memory view's one-at-a-time load (in flight, stale, of a recording since
// replaced). Pure state, no Qt: tested alone. Invariant: at most one memory load is in flight; a
// load that lands after its recording was replaced is discarded; a request while one is in flight
// is remembered and made when it lands.
#pragma once
#include <algorithm>

namespace keel::studio {

class LoadState {
 public:
  // ---- outstanding loads (summary, step, op, logs, diff, memory) ----
  void add(int delta) { pending_ = std::max(0, pending_ + delta); }  // +1 begun, -1 landed
  int pending() const { return pending_; }
  bool idle() const { return pending_ == 0; }

  // ---- the Ranks panel's load of a run folder ----
  // Counted once in pending() however often folders are opened before it lands; its landing or
  // failure uncounts it once.
  void ranksBegun() {
    if (!ranksLoading_) add(1);
    ranksLoading_ = true;
  }
  void ranksEnded() {
    if (ranksLoading_) add(-1);
    ranksLoading_ = false;
  }
  bool ranksLoading() const { return ranksLoading_; }

  // ---- the memory view's load ----
  // Asks for a load: true when it should start now (none in flight); else it is remembered.
  bool requestMemory() {
    if (memoryInFlight_) {
      memoryStale_ = true;
      return false;
    }
    memoryStale_ = false;
    memoryInFlight_ = true;
    return true;
  }
  // A live run moved on while the view was hidden: load when it is next looked at.
  void memoryOutdated() { memoryStale_ = true; }
  bool memoryStale() const { return memoryStale_; }
  bool memoryInFlight() const { return memoryInFlight_; }
  // The in-flight load landed (or failed). False: it belongs to a replaced recording, drop it.
  bool memoryLanded() {
    memoryInFlight_ = false;
    const bool keep = !memoryDiscard_;
    memoryDiscard_ = false;
    return keep;
  }
  // A new recording replaces the old: a load in flight is of the old one; nothing is stale.
  void recordingReplaced() {
    memoryStale_ = false;
    memoryDiscard_ = memoryInFlight_;
  }

 private:
  int pending_ = 0;
  bool ranksLoading_ = false;
  bool memoryInFlight_ = false;
  bool memoryStale_ = false;
  bool memoryDiscard_ = false;
};

}  // namespace keel::studio
