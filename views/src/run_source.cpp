// RunSource, DiffRunner and RunsDiffRunner: see run_source.h. The Worker owns the
// storage::Recording and is only ever touched on its thread; every request is a queued call to it.
#include "keel/views/run_source.h"

#include <QCoreApplication>
#include <QMetaObject>
#include <QPointer>
#include <QThread>
#include <QThreadPool>
#include <exception>

#include "keel/analysis/folder_diff.h"
#include "keel/analysis/memory_model.h"
#include "keel/analysis/ranks.h"
#include "keel/storage/reader.h"

namespace keel::views {

void registerViewTypes() {
  static bool done = [] {
    qRegisterMetaType<Side>("keel::views::Side");
    qRegisterMetaType<SummaryPtr>("keel::views::SummaryPtr");
    qRegisterMetaType<StepPtr>("keel::views::StepPtr");
    qRegisterMetaType<OpDetailsPtr>("keel::views::OpDetailsPtr");
    qRegisterMetaType<LogsPtr>("keel::views::LogsPtr");
    qRegisterMetaType<DiffPtr>("keel::views::DiffPtr");
    qRegisterMetaType<MemoryPtr>("keel::views::MemoryPtr");
    qRegisterMetaType<RunsPtr>("keel::views::RunsPtr");
    return true;
  }();
  (void)done;
}

SummaryPtr loadSummary(const storage::Recording& rec, const QString& path) {
  auto s = std::make_shared<RunSummary>();
  s->path = path;
  s->run = rec.run();
  s->steps = rec.steps();
  s->opCount = rec.opCount();
  s->opCounts = rec.opCountsByNameAndPhase();
  storage::OpQuery first;
  first.limit = 1;
  first.withTensors = false;
  if (const auto ops = rec.ops(first); !ops.empty()) s->firstOpStep = ops.front().step;
  // A step's row is written when it begins, its end time when it ends.
  if (!s->steps.empty() && s->steps.back().endNs == 0) s->incompleteStep = s->steps.back().step;
  if (auto bad = rec.firstNonFinite()) {
    s->firstNonFiniteSeq = bad->seq;
    s->firstNonFinite = std::move(bad);
  }
  return s;
}

class RunSource::Worker : public QObject {
 public:
  explicit Worker(RunSource* owner) : owner_(owner) {}

  // A file that cannot be opened leaves the open recording as it was (the views still show it);
  // its failure names the open it ends (`generation`), not any request's.
  void open(const QString& path, bool verify, quint64 generation) {
    try {
      storage::Recording next = storage::Recording::open(path.toStdString(), verify);
      SummaryPtr summary = loadSummary(next, path);
      rec_.reset();
      rec_.emplace(std::move(next));
      path_ = path;
      emit owner_->opened(std::move(summary));
    } catch (const std::exception& e) {
      emit owner_->openAttemptFailed(generation, QString::fromStdString(e.what()));
    }
  }
  void refresh() {
    if (!rec_) return;
    guarded([&] { emit owner_->summaryUpdated(loadSummary(*rec_, path_)); });
  }
  void step(int64_t step) {
    if (!rec_) return;
    guarded([&] {
      auto d = std::make_shared<StepData>();
      d->step = step;
      d->ops = rec_->stepOps(step);
      emit owner_->stepLoaded(d);
    });
  }
  void op(uint64_t seq) {
    if (!rec_) return;
    auto d = std::make_shared<OpDetails>();
    try {
      auto op = rec_->op(seq);
      if (!op)
        throw storage::StorageError("recording " + path_.toStdString() + " has no op " +
                                    std::to_string(seq));
      d->op = std::move(*op);
      if (d->op.stackId >= 0) d->stack = rec_->stack(d->op.stackId);
      storage::LogQuery lq;
      lq.opSeqBegin = seq;
      lq.opSeqEnd = seq + 1;
      d->logs = rec_->logs(lq);
      storage::MemQuery mq;
      mq.opSeqBegin = seq;
      mq.opSeqEnd = seq + 1;
      d->mems = rec_->memEvents(mq);
      for (const auto& dump : rec_->dumps(seq)) {
        OpDetails::Dump v;
        v.role = dump.role;
        v.index = dump.index;
        v.shape = dump.shape;
        if (auto vals = rec_->dumpValues(seq, dump.role, dump.index)) {
          v.numel = int64_t(vals->size());
          if (vals->size() > kMaxDumpValues) vals->resize(kMaxDumpValues);
          v.values = std::move(*vals);
        }
        d->dumps.push_back(std::move(v));
      }
    } catch (const std::exception& e) {
      d->op.seq = seq;
      d->error = e.what();
      d->damaged = dynamic_cast<const storage::DamagedRecording*>(&e) != nullptr;
    }
    emit owner_->opLoaded(d);
  }
  void logs() {
    if (!rec_) return;
    guarded([&] {
      emit owner_->logsLoaded(
          std::make_shared<const std::vector<storage::LogRecord>>(rec_->logs({})));
    });
  }
  void memory() {
    if (!rec_) return;
    try {
      emit owner_->memoryLoaded(
          std::make_shared<const analysis::MemoryModel>(analysis::loadMemoryModel(*rec_)));
    } catch (const std::exception& e) {
      emit owner_->memoryFailed(QString::fromStdString(e.what()));
    }
  }

 private:
  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      emit owner_->failed(QString::fromStdString(e.what()));
    }
  }
  RunSource* owner_;
  std::optional<storage::Recording> rec_;
  QString path_;
};

RunSource::RunSource(QObject* parent) : QObject(parent) {
  registerViewTypes();
  thread_ = new QThread(this);
  thread_->setObjectName("keel-run-source");
  worker_ = new Worker(this);
  worker_->moveToThread(thread_);
  connect(thread_, &QThread::finished, worker_, &QObject::deleteLater);
  thread_->start();
  // Connected first, so the views' handlers see the state an open() ended in: the recording the
  // worker holds (committed_), or the one the latest open() asked for while it is on its way.
  connect(this, &RunSource::opened, this, [this](const SummaryPtr& s) { committed_ = s->path; });
  connect(this, &RunSource::openAttemptFailed, this, [this](quint64 generation, const QString& m) {
    if (generation == generation_) {  // the latest open failed: back to what the worker holds
      path_ = committed_.value_or(QString());
      open_ = committed_.has_value();
    }
    emit failed(m);
    emit openFailed(m);
  });
}

RunSource::~RunSource() {
  thread_->quit();
  thread_->wait();
}

void RunSource::open(const QString& path, bool verify) {
  path_ = path;  // restored to the worker's recording if this open fails
  open_ = true;
  const quint64 generation = ++generation_;
  QMetaObject::invokeMethod(
      worker_, [w = worker_, path, verify, generation] { w->open(path, verify, generation); });
}
void RunSource::refresh() {
  QMetaObject::invokeMethod(worker_, [w = worker_] { w->refresh(); });
}
void RunSource::requestStep(int64_t step) {
  QMetaObject::invokeMethod(worker_, [w = worker_, step] { w->step(step); });
}
void RunSource::requestOp(uint64_t seq) {
  QMetaObject::invokeMethod(worker_, [w = worker_, seq] { w->op(seq); });
}
void RunSource::requestLogs() {
  QMetaObject::invokeMethod(worker_, [w = worker_] { w->logs(); });
}
void RunSource::requestMemory() {
  QMetaObject::invokeMethod(worker_, [w = worker_] { w->memory(); });
}

DiffPtr DiffRunner::run(const QString& pathA, const QString& pathB,
                        const storage::DiffOptions& options) {
  storage::Recording a = storage::Recording::open(pathA.toStdString(), false);
  storage::Recording b = storage::Recording::open(pathB.toStdString(), false);
  return std::make_shared<const storage::DiffReport>(storage::diffRecordings(a, b, options));
}

namespace {

// Runs `work` on the thread pool and delivers its result through the runner's finished(result),
// or failed(what it threw), on the GUI thread; dropped if the runner is gone by then.
template <class Runner, class Work>
void runOnPool(Runner* runner, Work work) {
  registerViewTypes();
  QPointer<Runner> self(runner);
  QThreadPool::globalInstance()->start([self, work = std::move(work)] {
    decltype(work()) result;
    QString error;
    try {
      result = work();
    } catch (const std::exception& e) {
      error = QString::fromStdString(e.what());
    }
    QMetaObject::invokeMethod(QCoreApplication::instance(), [self, result, error] {
      if (!self) return;
      if (result)
        emit self->finished(result);
      else
        emit self->failed(error);
    });
  });
}

}  // namespace

void DiffRunner::start(const QString& pathA, const QString& pathB,
                       const storage::DiffOptions& options) {
  runOnPool(this, [pathA, pathB, options] { return run(pathA, pathB, options); });
}

RunsPtr RunsDiffRunner::run(RunsComparison::Kind kind, const QString& pathA, const QString& pathB,
                            const storage::DiffOptions& options) {
  auto out = std::make_shared<RunsComparison>();
  out->kind = kind;
  out->pathA = pathA;
  out->pathB = pathB;
  out->options = options;
  const std::string a = pathA.toStdString(), b = pathB.toStdString();
  if (kind == RunsComparison::Kind::ByParameter) {
    const analysis::ParameterReport r =
        analysis::compareParameters(a, b, options.atol, options.rtol);
    out->text = QString::fromStdString(analysis::parameterText(r, options.atol, options.rtol));
    out->diverged = r.first.has_value();
    if (r.first) {
      out->firstStep = r.first->step;
      out->firstParameter = QString::fromStdString(r.first->parameter);
    }
    return out;
  }
  const analysis::FolderDiff fd = analysis::diffRunFolders(a, b, options);
  out->layout = QString("%1 ranks, dp %2 x tp %3")
                    .arg(fd.manifestA.worldSize)
                    .arg(fd.manifestA.dp)
                    .arg(fd.manifestA.tp);
  for (const std::string& s : fd.commonSetup) out->setup.push_back(QString::fromStdString(s));
  for (size_t r = 0; r < fd.ranks.size(); ++r) {
    out->rankLines.push_back(QString::fromStdString(fd.rankLine(r)));
    out->rankDiverged.push_back(fd.ranks[r].diverged());
  }
  if (fd.earliest) out->firstRank = int(*fd.earliest);
  out->diverged = fd.verdict == "diverged";
  return out;
}

void RunsDiffRunner::start(RunsComparison::Kind kind, const QString& pathA, const QString& pathB,
                           const storage::DiffOptions& options) {
  runOnPool(this, [kind, pathA, pathB, options] { return run(kind, pathA, pathB, options); });
}

}  // namespace keel::views
