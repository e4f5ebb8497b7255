// Run folders: the manifest of a multi-rank run (see keel/storage/run_folder.h).
#include "keel/storage/run_folder.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "keel/base/text.h"
#include "keel/storage/errors.h"
#include "keel/storage/records.h"

namespace keel::storage {

namespace fs = std::filesystem;
using nlohmann::json;

std::string rankFileName(int64_t rank) {
  return "rank-" + std::to_string(rank) + ".db";
}

RunManifest makeManifest(int64_t dp, int64_t tp) {
  RunManifest m;
  m.dp = dp;
  m.tp = tp;
  m.worldSize = dp * tp;
  for (int64_t r = 0; r < m.worldSize; ++r) m.ranks.push_back({r, r / tp, r % tp, rankFileName(r)});
  return m;
}

void writeManifest(const std::string& dir, const RunManifest& m) {
  json ranks = json::array();
  for (const RankEntry& e : m.ranks)
    ranks.push_back(
        {{"rank", e.rank}, {"dp_rank", e.dpRank}, {"tp_rank", e.tpRank}, {"file", e.file}});
  const json j = {{"keel_run", kRunFolderVersion},
                  {"world_size", m.worldSize},
                  {"dp", m.dp},
                  {"tp", m.tp},
                  {"model", m.model},
                  {"seed", m.seed},
                  {"steps", m.steps},
                  {"zero", m.zero},
                  {"ep", m.ep},
                  {"cp", m.cp},
                  {"vocab_parallel", m.vocab},
                  {"ranks", ranks}};
  const fs::path path = fs::path(dir) / kManifestFile;
  const fs::path tmp = fs::path(dir) / (std::string(".") + kManifestFile + ".tmp");
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    if (!out) throw StorageError("run folder " + dir + ": cannot write " + kManifestFile);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec)
    throw StorageError("run folder " + dir + ": cannot write " + kManifestFile + " (" +
                       ec.message() + ")");
}

bool isRunFolder(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / kManifestFile, ec);
}

std::string notARunFolder(const std::string& path) {
  return path + " is a folder but not a run folder (it has no " + kManifestFile +
         "; keel record writes one per multi-rank run)";
}

RunManifest readManifest(const std::string& dir) {
  const std::string where = "run folder " + dir;
  json j;
  try {
    const std::string text =
        readFile((fs::path(dir) / kManifestFile).string(), std::string(kManifestFile), 1 << 20);
    checkJsonDepth(text, where + ": " + kManifestFile);  // Note [Bounded JSON]
    j = json::parse(text);
  } catch (const json::exception& e) {  // the library's words, made a person's
    throw StorageError(where + ": damaged " + kManifestFile + ": not JSON (" +
                       jsonErrorText(e.what()) + ")");
  } catch (const std::exception& e) {
    throw StorageError(where + ": " + e.what());
  }
  auto bad = [&](const std::string& what) {
    return StorageError(where + ": damaged " + kManifestFile + ": " + what);
  };
  if (!j.is_object()) throw bad("not a JSON object");
  // The format's version: a newer keel's folder is said so, not misread.
  if (j.contains("keel_run")) {
    const json& v = j["keel_run"];
    if (!v.is_number_integer() || v.get<int64_t>() < 1)
      throw bad("keel_run " + v.dump() + " is not a format version");
    if (v.get<int64_t>() > kRunFolderVersion)
      throw StorageError(where + ": " + kManifestFile + " is run folder format " + v.dump() +
                         ", and this keel reads format " + std::to_string(kRunFolderVersion) +
                         " (a newer keel wrote it: update keel)");
  }
  // A count read as a whole number: "dp": 2.5 is damage, not dp 2.
  auto whole = [&](const json& o, const char* key) {
    const json& v = o.at(key);
    if (!v.is_number_integer())
      throw bad(std::string(key) + " " + v.dump() + " is not a whole number");
    return v.get<int64_t>();
  };
  RunManifest m;
  try {
    m.worldSize = whole(j, "world_size");
    m.dp = whole(j, "dp");
    m.tp = whole(j, "tp");
    m.model = j.value("model", std::string());
    m.seed = j.value("seed", uint64_t(0));
    m.steps = j.value("steps", int64_t(0));
    m.zero = j.value("zero", false);
    m.vocab = j.value("vocab_parallel", false);
    m.ep = j.contains("ep") ? whole(j, "ep") : 1;
    m.cp = j.contains("cp") ? whole(j, "cp") : 1;
    for (const json& r : j.at("ranks"))
      m.ranks.push_back({whole(r, "rank"), whole(r, "dp_rank"), whole(r, "tp_rank"),
                         r.at("file").get<std::string>()});
  } catch (const json::exception& e) {
    throw StorageError(where + ": damaged " + kManifestFile + " (" + jsonErrorText(e.what()) + ")");
  }
  // Each limit in its own words; dp and tp each at most the world size before they are
  // multiplied (2^62 + 1 times 4 wrapped round to 4, and a tool then sized tables by dp).
  constexpr int64_t kMaxRanks = int64_t(1) << 20;
  if (m.worldSize < 1)
    throw bad("world size " + std::to_string(m.worldSize) + " (a run has at least one rank)");
  if (m.worldSize > kMaxRanks)
    throw bad("world size " + std::to_string(m.worldSize) + " is more than the " +
              std::to_string(kMaxRanks) + " ranks a run folder holds");
  if (m.dp < 1 || m.tp < 1)
    throw bad("dp " + std::to_string(m.dp) + " x tp " + std::to_string(m.tp) +
              " (each is at least 1)");
  if (m.dp > m.worldSize || m.tp > m.worldSize || m.dp * m.tp != m.worldSize)
    throw bad("world size " + std::to_string(m.worldSize) + " is not dp " + std::to_string(m.dp) +
              " x tp " + std::to_string(m.tp));
  if (m.ep < 1 || m.dp % m.ep != 0 || m.cp < 1 || m.dp % m.cp != 0)
    throw bad("ep " + std::to_string(m.ep) + " or cp " + std::to_string(m.cp) +
              " does not divide dp " + std::to_string(m.dp));
  if (int64_t(m.ranks.size()) != m.worldSize)
    throw bad(std::to_string(m.ranks.size()) + " ranks listed for a world of " +
              std::to_string(m.worldSize));
  for (size_t i = 0; i < m.ranks.size(); ++i) {
    const RankEntry& e = m.ranks[i];
    if (e.rank != int64_t(i) || e.dpRank != e.rank / m.tp || e.tpRank != e.rank % m.tp)
      throw bad("rank entry " + std::to_string(i) + " does not follow the layout");
    if (e.file.empty() || e.file.find('/') != std::string::npos || e.file == "." || e.file == "..")
      throw bad("rank " + std::to_string(e.rank) + "'s file '" + e.file +
                "' is not a file name in the folder");
  }
  return m;
}

std::string layoutText(int64_t dp, int64_t tp, int64_t ep, int64_t cp, bool zero, bool vocab) {
  return "dp " + std::to_string(dp) + " x tp " + std::to_string(tp) +
         (ep > 1 ? ", ep " + std::to_string(ep) : std::string()) +
         (cp > 1 ? ", cp " + std::to_string(cp) : std::string()) + (zero ? ", zero" : "") +
         (vocab ? ", vocab-parallel" : "");
}

std::string layoutText(const RunManifest& m) {
  return layoutText(m.dp, m.tp, m.ep, m.cp, m.zero, m.vocab);
}

void checkRankRun(const std::string& dir, const RunManifest& m, int64_t rank, const RunInfo& run) {
  if (run.worldSize <= 1) return;  // an older single-file recording copied in: nothing to check
  const std::string file =
      rank >= 0 && rank < int64_t(m.ranks.size()) ? m.ranks[size_t(rank)].file : rankFileName(rank);
  if (run.rank != rank || run.worldSize != m.worldSize)
    throw StorageError("run folder " + dir + ": " + file + " was recorded by rank " +
                       std::to_string(run.rank) + " of " + std::to_string(run.worldSize) +
                       ", the manifest says rank " + std::to_string(rank) + " of " +
                       std::to_string(m.worldSize));
  if (!run.layout.empty() && run.layout != layoutText(m))
    throw StorageError("run folder " + dir + ": " + file + " was recorded as " + run.layout +
                       ", the manifest says " + layoutText(m) +
                       " (a later run into this folder that failed?); record the run again");
}

std::string rankPath(const std::string& dir, const RunManifest& m, int64_t rank) {
  if (rank < 0 || rank >= int64_t(m.ranks.size()))
    throw StorageError("run folder " + dir + " has ranks 0.." + std::to_string(m.ranks.size() - 1) +
                       ", not " + std::to_string(rank));
  return (fs::path(dir) / m.ranks[size_t(rank)].file).string();
}

}  // namespace keel::storage
