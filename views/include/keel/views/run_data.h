// What the views show, as immutable snapshots loaded off the GUI thread by RunSource and shared
// (std::shared_ptr<const ...>) between views. Plain storage records: views never see the engine.
#pragma once
#include <QDir>
#include <QFileInfo>
#include <QMetaType>
#include <QString>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "keel/storage/diff.h"
#include "keel/storage/reader.h"
#include "keel/storage/records.h"

namespace keel::analysis {
class MemoryModel;  // keel/analysis/memory_model.h
}

namespace keel::views {

// How a recording is named on screen: its file name, with its folder for a rank of a run folder
// ("runA/rank-0.db": two run folders compared both said "rank-0.db").
inline QString recordingName(const QString& path) {
  const QFileInfo f(path);
  const QString file = f.fileName();
  if (file.startsWith(QLatin1String("rank-")) && file.endsWith(QLatin1String(".db")) &&
      QFileInfo::exists(f.absolutePath() + QLatin1String("/manifest.json")))
    return f.absoluteDir().dirName() + QLatin1Char('/') + file;
  return file;
}

// Which recording an op belongs to: the main one (A) or the one it is compared with (B).
enum class Side { A = 0, B = 1 };

// A recording at a glance: run metadata, steps (with loss), op count.
struct RunSummary {
  QString path;
  storage::RunInfo run;
  std::vector<storage::StepRecord> steps;
  int64_t opCount = 0;
  std::vector<storage::OpCount> opCounts;  // per (name, phase), all steps
  // The step of the first op recorded (-1: none); a --step-range recording's steps start before
  // it (every step's loss is recorded, its ops only inside the range).
  int64_t firstOpStep = -1;
  // The last step when it has begun and not ended (its row has no end time): the run stopped,
  // failed or is paused (or still running) inside it; -1 when there is none.
  int64_t incompleteStep = -1;
  std::optional<uint64_t> firstNonFiniteSeq;
  std::optional<storage::OpRecord> firstNonFinite;  // that op, with its tensors
};

// Every op of one step (all phases), by seq, with tensors.
struct StepData {
  int64_t step = 0;
  std::vector<storage::OpRecord> ops;
  // Index of the op with `seq` in ops, or -1.
  int64_t indexOf(uint64_t seq) const;
};

// Everything the inspector shows for one op.
struct OpDetails {
  storage::OpRecord op;
  std::optional<storage::StackRecord> stack;
  std::vector<storage::LogRecord> logs;
  std::vector<storage::MemRecord> mems;
  // Dumped values by (role, index), decoded to doubles (first elements only; see kMaxDumpValues).
  struct Dump {
    storage::Role role = storage::Role::Output;
    int32_t index = 0;
    std::vector<int64_t> shape;
    std::vector<double> values;  // at most kMaxDumpValues
    int64_t numel = 0;
  };
  std::vector<Dump> dumps;
  std::string error;     // non-empty when the op could not be read (e.g. a damaged row)
  bool damaged = false;  // error is a storage::DamagedRecording (the studio shows it in a dialog)
};
inline constexpr size_t kMaxDumpValues = 4096;

using SummaryPtr = std::shared_ptr<const RunSummary>;
using StepPtr = std::shared_ptr<const StepData>;
using OpDetailsPtr = std::shared_ptr<const OpDetails>;
using LogsPtr = std::shared_ptr<const std::vector<storage::LogRecord>>;
using DiffPtr = std::shared_ptr<const storage::DiffReport>;
using MemoryPtr = std::shared_ptr<const analysis::MemoryModel>;  // every allocator event, replayed

// Note [Comparing whole runs]: a run folder compared in the studio is compared as `keel diff` does
// it, besides the op-by-op diff of the rank shown. Two folders of one layout are diffed rank by
// rank (keel/analysis/folder_diff.h): a line per rank, and the rank that diverged first, which the
// window then shows (rank 0's first divergence is often the all_reduce that brought another rank's
// difference over). Runs of different layouts — a run folder against one process, or folders of
// other dp x tp splits — compare by parameter (Note [Parameters across layouts]): their ops see
// other shares of the batch or of the weights, so an op-by-op diff of one rank against the other
// run would call every op diverged for that alone.
struct RunsComparison {
  enum class Kind { RankByRank, ByParameter };
  Kind kind = Kind::RankByRank;
  QString pathA, pathB;  // the run folders (or a folder and one process's recording) compared
  storage::DiffOptions options;
  bool diverged = false;
  // RankByRank
  QString layout;                  // "2 ranks, dp 2 x tp 1"
  std::vector<QString> setup;      // setup differences every rank shares
  std::vector<QString> rankLines;  // per rank, keel diff's verdict line
  std::vector<bool> rankDiverged;
  std::optional<int> firstRank;  // the rank that diverged first
  // ByParameter
  QString text;                      // keel diff's report (analysis::parameterText)
  std::optional<int64_t> firstStep;  // the first difference's step and parameter (the scope of
  QString firstParameter;            // its optimizer update)
};
using RunsPtr = std::shared_ptr<const RunsComparison>;

}  // namespace keel::views

Q_DECLARE_METATYPE(keel::views::Side)
Q_DECLARE_METATYPE(keel::views::SummaryPtr)
Q_DECLARE_METATYPE(keel::views::StepPtr)
Q_DECLARE_METATYPE(keel::views::OpDetailsPtr)
Q_DECLARE_METATYPE(keel::views::LogsPtr)
Q_DECLARE_METATYPE(keel::views::DiffPtr)
Q_DECLARE_METATYPE(keel::views::MemoryPtr)
Q_DECLARE_METATYPE(keel::views::RunsPtr)
