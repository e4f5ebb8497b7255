// Two run folders of one parallel layout compared rank by rank: each rank's recordings diffed op
// by op, the rank whose difference came first named (Note [The rank that diverged first]), and a
// verdict line per rank. Qt-free: `keel diff RUN_A/ RUN_B/` prints it and Keel Studio shows it
// when it compares two run folders (and opens the rank that diverged first).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "keel/storage/diff.h"
#include "keel/storage/reader.h"
#include "keel/storage/run_folder.h"

namespace keel::analysis {

// Whether two runs were laid out alike (dp, tp, ep, cp, --zero and the vocabulary split): such
// folders compare rank by rank; others by parameter (Note [Parameters across layouts]).
bool sameLayout(const storage::RunManifest& a, const storage::RunManifest& b);

// One rank's diff in a folder diff, with what the folder's verdict line says of it.
struct RankDiff {
  storage::Recording ra, rb;
  storage::DiffReport report;
  // Collectives on one side only (a rank that skipped or added one: its peers' waits and sums
  // are no longer the other run's), the first of them.
  int64_t collectivesOnlyInA = 0, collectivesOnlyInB = 0;
  std::optional<storage::OpPair> firstOneSided;
  int64_t opsOnlyInA = 0, opsOnlyInB = 0;  // other ops on one side only
  // Note [The rank that diverged first]: (step, collective, time into the step) of its first
  // divergence; none without one.
  std::optional<std::tuple<int64_t, int, int64_t>> firstKey;
  bool diverged() const;
};

struct FolderDiff {
  storage::RunManifest manifestA, manifestB;
  std::vector<RankDiff> ranks;     // by rank
  std::optional<size_t> earliest;  // the rank that diverged first; none when none did
  // The setup differences every rank has (seed, config, backend): said once.
  std::vector<std::string> commonSetup;
  std::string verdict;  // "diverged", "equal" or "values-not-compared"
  int exitCode = 0;     // 0 equal, 1 diverged (keel diff's exit status)
  // The verdict line of rank r: its verdict and first divergence, its collectives or ops on one
  // side only, where its difference came from, and the setup differences that are its own.
  std::string rankLine(size_t r) const;
};

// Diffs the run folders a and b (of one layout: sameLayout) rank by rank. Throws
// storage::StorageError for a folder, manifest or recording that cannot be read, a rank file of
// another run, and folders of different layouts.
FolderDiff diffRunFolders(const std::string& a, const std::string& b,
                          const storage::DiffOptions& options);

// --json: {"verdict", "exit_code", "first_rank", "setup", "ranks": [{"rank", "verdict", "line",
// "setup", "collectives_only_in_a", "collectives_only_in_b", "report"}]} (docs/diff.md).
std::string folderDiffJson(const FolderDiff& d);

}  // namespace keel::analysis
