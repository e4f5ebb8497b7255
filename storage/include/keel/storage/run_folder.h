// Note [Run folders]: a multi-rank run (keel/dist.h) is a folder: manifest.json (world size,
// layout, each rank's place and file) and one recording per rank, rank-R.db, each written by its
// own rank. Rank 0 writes the manifest once its run has set up (written beside and renamed, so a
// reader sees a whole one or none; a run whose setup fails leaves the old one); every tool that
// takes a recording takes a run folder too, and checks each rank file against the manifest.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace keel::storage {

struct RunInfo;

struct RankEntry {
  int64_t rank = 0;
  int64_t dpRank = 0, tpRank = 0;
  std::string file;  // relative to the folder: rank-R.db
};

struct RunManifest {
  int64_t worldSize = 1;
  int64_t dp = 1, tp = 1;
  bool zero = false;   // optimizer state sharded across dp (Note [Sharded optimizer state])
  bool vocab = false;  // vocabulary split across tp (Note [Vocabulary-parallel embedding and loss])
  int64_t ep = 1;      // experts split across ep dp ranks (Note [Expert-parallel MoE])
  int64_t cp = 1;      // each row's sequence split across cp dp ranks
  std::string model;   // the config's name
  uint64_t seed = 0;
  int64_t steps = 0;
  std::vector<RankEntry> ranks;  // by rank
};

inline constexpr const char* kManifestFile = "manifest.json";
// The manifest's format ("keel_run"): a folder of a later format is refused in words.
inline constexpr int64_t kRunFolderVersion = 1;

// The file rank r writes in a run folder ("rank-3.db").
std::string rankFileName(int64_t rank);
// The manifest of world size n in layout dp × tp (rank r: tp rank r % tp, dp rank r / tp).
RunManifest makeManifest(int64_t dp, int64_t tp);
// Writes dir/manifest.json beside and renames it into place. Throws StorageError.
void writeManifest(const std::string& dir, const RunManifest& m);
// Whether path is a directory holding a manifest.json.
bool isRunFolder(const std::string& path);
// What to say of a folder given where a recording or run folder is expected, but that holds no
// manifest.json: "X is a folder but not a run folder (...)".
std::string notARunFolder(const std::string& path);
// Reads and checks dir/manifest.json: world size, layout and ranks consistent, files that name
// no other folder. Throws StorageError ("run folder X: ...") naming what is wrong.
RunManifest readManifest(const std::string& dir);
// dir/<file> of rank r.
std::string rankPath(const std::string& dir, const RunManifest& m, int64_t rank);
// "dp 2 x tp 2", then ", ep E", ", cp C", ", zero", ", vocab-parallel" where they apply: a
// layout as each rank's run row records it (RunInfo::layout) and the tools print it.
std::string layoutText(int64_t dp, int64_t tp, int64_t ep, int64_t cp, bool zero, bool vocab);
std::string layoutText(const RunManifest& m);
// Throws StorageError ("run folder X: rank-1.db was recorded as ..., the manifest says ...")
// unless rank r's recording (its run row) was recorded by rank r of the manifest's world in the
// manifest's layout: a manifest rewritten by a later run into the folder that failed must not
// make the old recordings read as another layout.
void checkRankRun(const std::string& dir, const RunManifest& m, int64_t rank, const RunInfo& run);

}  // namespace keel::storage
