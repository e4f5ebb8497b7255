// RunSource: one recording, read on its own worker thread. Requests return at once; results
// arrive as signals on the GUI thread (hotspot/heaptrack style), so the GUI never waits on SQLite.
// A live session's file is opened the same way and refresh()ed after each step: every view works
// the same on a live run and on a replay. DiffRunner diffs two recordings on the thread pool.
#pragma once
#include <QObject>
#include <QString>
#include <memory>
#include <optional>
#include <utility>

#include "keel/storage/diff.h"
#include "keel/views/run_data.h"

namespace keel::views {

class RunSource : public QObject {
  Q_OBJECT
 public:
  explicit RunSource(QObject* parent = nullptr);
  ~RunSource() override;

  // Opens `path` (verify: run SQLite's quick_check; off for a file a live writer appends to).
  // Emits opened(summary) or failed(message); on failure the recording open before stays open
  // (path() and isOpen() return to it). A second open() replaces the first.
  void open(const QString& path, bool verify = true);
  // Reloads the summary (new steps of a live run): emits summaryUpdated.
  void refresh();
  void requestStep(int64_t step);  // -> stepLoaded
  void requestOp(uint64_t seq);    // -> opLoaded
  void requestLogs();              // -> logsLoaded (every log line, in order)
  // Every allocator event, replayed into a MemoryModel -> memoryLoaded, or memoryFailed.
  void requestMemory();
  QString path() const { return path_; }
  bool isOpen() const { return open_; }

 signals:
  void opened(keel::views::SummaryPtr summary);
  void summaryUpdated(keel::views::SummaryPtr summary);
  void failed(QString message);      // any request (an open's too)
  void openFailed(QString message);  // an open() (after its failed): nothing else changed
  // Internal: the worker's report of open number `generation` failing (openFailed follows).
  void openAttemptFailed(quint64 generation, QString message);
  void stepLoaded(keel::views::StepPtr step);
  void opLoaded(keel::views::OpDetailsPtr details);
  void logsLoaded(keel::views::LogsPtr logs);
  void memoryLoaded(keel::views::MemoryPtr memory);
  void memoryFailed(QString message);

 private:
  class Worker;
  Worker* worker_;  // lives on thread_
  class QThread* thread_;
  QString path_;
  bool open_ = false;
  std::optional<QString> committed_;  // the recording the worker holds (opened last)
  quint64 generation_ = 0;            // open() calls made
};

// Diffs two recordings (all steps, like `keel diff`) on the thread pool.
class DiffRunner : public QObject {
  Q_OBJECT
 public:
  explicit DiffRunner(QObject* parent = nullptr) : QObject(parent) {}
  void start(const QString& pathA, const QString& pathB, const storage::DiffOptions& options = {});
  // The same, synchronously (tests, the screenshot mode).
  static DiffPtr run(const QString& pathA, const QString& pathB,
                     const storage::DiffOptions& options = {});

 signals:
  void finished(keel::views::DiffPtr report);
  void failed(QString message);
};

// Compares whole runs (Note [Comparing whole runs]) on the thread pool: two run folders of one
// layout rank by rank, or runs of different layouts by parameter.
class RunsDiffRunner : public QObject {
  Q_OBJECT
 public:
  explicit RunsDiffRunner(QObject* parent = nullptr) : QObject(parent) {}
  void start(RunsComparison::Kind kind, const QString& pathA, const QString& pathB,
             const storage::DiffOptions& options);
  static RunsPtr run(RunsComparison::Kind kind, const QString& pathA, const QString& pathB,
                     const storage::DiffOptions& options);

 signals:
  void finished(keel::views::RunsPtr runs);
  void failed(QString message);
};

// Loads a summary synchronously (used by the worker and by tests).
SummaryPtr loadSummary(const storage::Recording& rec, const QString& path);

// Registers the metatypes above for queued connections; idempotent.
void registerViewTypes();

}  // namespace keel::views
