// Two run folders of one layout compared rank by rank (keel/analysis/folder_diff.h).
#include "keel/analysis/folder_diff.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "keel/storage/errors.h"

namespace keel::analysis {

namespace {

// The step of a report's first divergence: its first diverged op's, else its first diverged
// loss's (recordings without tensor values), else none.
std::optional<int64_t> firstDivergentStep(const storage::DiffReport& r) {
  if (r.first) return r.first->pair.step;
  if (const storage::LossDiff* l = storage::firstLossDivergence(r)) return l->step;
  return std::nullopt;
}

// The ops that talk to other ranks.
bool isCollective(const std::string& name) {
  return name == "all_reduce" || name == "all_gather" || name == "reduce_scatter" ||
         name == "broadcast" || name == "all_to_all";
}

// "step 3, op #1253 all_reduce (dp_loss)", B's seq for an op only in B.
std::string pairText(const storage::OpPair& p) {
  return "step " + std::to_string(p.step) + ", op " +
         (p.inA ? "#" + std::to_string(p.seqA) : "B #" + std::to_string(p.seqB)) + " " + p.name +
         (p.scope.empty() ? "" : " (" + p.scope + ")");
}

// Note [The rank that diverged first]: in a folder diff the ranks' first divergences are ordered
// by step, then a rank whose first divergence is an op of its own before one whose first is a
// collective — a collective's output differs when any rank's input to it does, so a difference
// made on rank 1 (a matmul) shows on rank 0 first at the all_reduce that brought it over, with
// rank 0's own inputs all equal (its "root") — then by the time into the step the op began (the
// ranks run in lockstep between collectives), then by rank.
std::optional<std::tuple<int64_t, int, int64_t>> firstKey(const RankDiff& d) {
  const std::optional<int64_t> step = firstDivergentStep(d.report);
  if (!step) return std::nullopt;
  if (!d.report.first) return std::tuple{*step, 0, INT64_MAX};  // losses only: no op
  const storage::OpPair& p = d.report.first->pair;
  const storage::Recording& rec = p.inB ? d.rb : d.ra;
  int64_t offset = INT64_MAX;
  if (const std::optional<storage::OpRecord> op = rec.op(p.inB ? p.seqB : p.seqA))
    for (const storage::StepRecord& st : rec.steps())
      if (st.step == p.step && st.beginNs > 0 && op->beginNs >= st.beginNs)
        offset = op->beginNs - st.beginNs;
  return std::tuple{*step, isCollective(p.name) ? 1 : 0, offset};
}

// What differs in one rank's setup alone ("B's run did not finish (failed: hang: ...)"), clipped:
// the whole line is in the rank's own report (keel diff A/rank-R.db B/rank-R.db).
std::string setupPhrase(const std::string& s) {
  return s.size() > 110 ? s.substr(0, 107) + "..." : s;
}

}  // namespace

bool sameLayout(const storage::RunManifest& a, const storage::RunManifest& b) {
  return a.dp == b.dp && a.tp == b.tp && a.ep == b.ep && a.cp == b.cp && a.zero == b.zero &&
         a.vocab == b.vocab;
}

bool RankDiff::diverged() const {
  return storage::diffVerdict(report) == storage::DiffVerdict::Diverged ||
         collectivesOnlyInA + collectivesOnlyInB > 0;
}

std::string FolderDiff::rankLine(size_t r) const {
  const RankDiff& d = ranks[r];
  const storage::DiffReport& report = d.report;
  const storage::DiffVerdict v = storage::diffVerdict(report);
  const bool oneSidedOnly = v != storage::DiffVerdict::Diverged && d.diverged();
  std::string line = v == storage::DiffVerdict::Diverged            ? "diverged"
                     : oneSidedOnly                                 ? "collectives differ"
                     : v == storage::DiffVerdict::ValuesNotCompared ? "no values compared"
                                                                    : "equal within tolerance";
  if (report.first) {  // --strict: the first may be an op of B only
    line += ": first at " + pairText(report.first->pair);
    if (isCollective(report.first->pair.name) && earliest && *earliest != r &&
        ranks[*earliest].firstKey && d.firstKey &&
        std::get<0>(*ranks[*earliest].firstKey) <= std::get<0>(*d.firstKey))
      line += ", a collective: the difference came through it from another rank (rank " +
              std::to_string(*earliest) + " diverged first)";
  } else if (const storage::LossDiff* l = storage::firstLossDivergence(report)) {
    line += ": the losses first at step " + std::to_string(l->step) +
            " (no op can be named without tensor values)";
  }
  if (d.collectivesOnlyInA + d.collectivesOnlyInB > 0) {
    auto n = [](int64_t k, const char* side) {
      return k > 0 ? std::to_string(k) + (k == 1 ? " collective" : " collectives") + " only in " +
                         side
                   : std::string();
    };
    std::string which = n(d.collectivesOnlyInA, "A");
    if (d.collectivesOnlyInB > 0)
      which += (which.empty() ? "" : " and ") + n(d.collectivesOnlyInB, "B");
    line += (report.first ? "; " : ": ") + which + ", the first at " + pairText(*d.firstOneSided) +
            " (a rank skipped or added a collective)";
  }
  if (d.opsOnlyInA + d.opsOnlyInB > 0 && v != storage::DiffVerdict::Diverged &&
      !report.options.unmatchedIsDivergent)
    line += "; " + std::to_string(d.opsOnlyInA + d.opsOnlyInB) +
            (d.opsOnlyInA + d.opsOnlyInB == 1 ? " op" : " ops") +
            " on one side only (--strict counts them)";
  for (const std::string& s : report.setup)
    if (std::find(commonSetup.begin(), commonSetup.end(), s) == commonSetup.end())
      line += "; " + setupPhrase(s);
  return line;
}

FolderDiff diffRunFolders(const std::string& a, const std::string& b,
                          const storage::DiffOptions& opt) {
  FolderDiff out;
  out.manifestA = storage::readManifest(a);
  out.manifestB = storage::readManifest(b);
  const storage::RunManifest& ma = out.manifestA;
  const storage::RunManifest& mb = out.manifestB;
  if (!sameLayout(ma, mb))
    throw storage::StorageError("run folders " + a + " and " + b +
                                " have different layouts: they compare by parameter, not rank by "
                                "rank");
  int status = 0;
  for (int64_t r = 0; r < ma.worldSize; ++r) {
    storage::Recording ra = storage::Recording::open(storage::rankPath(a, ma, r));
    storage::Recording rb = storage::Recording::open(storage::rankPath(b, mb, r));
    storage::checkRankRun(a, ma, r, ra.run());
    storage::checkRankRun(b, mb, r, rb.run());
    storage::DiffReport report = storage::diffRecordings(ra, rb, opt);
    RankDiff d{std::move(ra), std::move(rb), std::move(report), 0, 0, std::nullopt, 0, 0,
               std::nullopt};
    // Steps one run lacks or did not end (it hung, stopped or was killed there) are a setup
    // difference ("A has 3 steps, B 2"), not ops on one side.
    std::set<int64_t> endedA, endedB;
    for (const storage::StepRecord& st : d.ra.steps())
      if (st.endNs > 0) endedA.insert(st.step);
    for (const storage::StepRecord& st : d.rb.steps())
      if (st.endNs > 0) endedB.insert(st.step);
    auto oneSidedStep = [&](int64_t step) {
      return step > 0 && (!endedA.count(step) || !endedB.count(step));  // 0: initialisation
    };
    for (const storage::OpPair& p : d.report.pairs) {
      if ((p.inA && p.inB) || oneSidedStep(p.step)) continue;
      if (isCollective(p.name)) {
        ++(p.inA ? d.collectivesOnlyInA : d.collectivesOnlyInB);
        if (!d.firstOneSided) d.firstOneSided = p;
      } else {
        ++(p.inA ? d.opsOnlyInA : d.opsOnlyInB);
      }
    }
    d.firstKey = firstKey(d);
    status = std::max(status, d.diverged() ? 1 : storage::diffExitCode(d.report));
    out.ranks.push_back(std::move(d));
  }
  std::vector<RankDiff>& diffs = out.ranks;
  for (size_t r = 0; r < diffs.size(); ++r)  // Note [The rank that diverged first]
    if (diffs[r].firstKey && (!out.earliest || *diffs[r].firstKey < *diffs[*out.earliest].firstKey))
      out.earliest = r;
  out.commonSetup = diffs.empty() ? std::vector<std::string>() : diffs[0].report.setup;
  std::erase_if(out.commonSetup, [&](const std::string& s) {
    return std::any_of(diffs.begin(), diffs.end(), [&](const RankDiff& d) {
      return std::find(d.report.setup.begin(), d.report.setup.end(), s) == d.report.setup.end();
    });
  });
  const bool anyDiverged =
      std::any_of(diffs.begin(), diffs.end(), [](const RankDiff& d) { return d.diverged(); });
  const bool noneCompared =
      !diffs.empty() && std::all_of(diffs.begin(), diffs.end(), [](const RankDiff& d) {
        return storage::diffVerdict(d.report) == storage::DiffVerdict::ValuesNotCompared;
      });
  out.verdict = anyDiverged ? "diverged" : noneCompared ? "values-not-compared" : "equal";
  out.exitCode = status;
  return out;
}

std::string folderDiffJson(const FolderDiff& fd) {
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < fd.ranks.size(); ++r) {
    const RankDiff& d = fd.ranks[r];
    const storage::DiffVerdict v = storage::diffVerdict(d.report);
    ranks.push_back(
        {{"rank", r},
         {"verdict", d.diverged()                                   ? "diverged"
                     : v == storage::DiffVerdict::ValuesNotCompared ? "values-not-compared"
                                                                    : "equal"},
         {"line", fd.rankLine(r)},
         {"setup", d.report.setup},
         {"collectives_only_in_a", d.collectivesOnlyInA},
         {"collectives_only_in_b", d.collectivesOnlyInB},
         {"report", nlohmann::json::parse(storage::toJson(d.report))}});
  }
  const nlohmann::json j = {
      {"verdict", fd.verdict},
      {"exit_code", fd.exitCode},
      {"first_rank", fd.earliest ? nlohmann::json(*fd.earliest) : nlohmann::json()},
      {"setup", fd.commonSetup},
      {"ranks", ranks}};
  return j.dump(2);
}

}  // namespace keel::analysis
