// Multi-rank analyses over a run folder: the replica check (Note [Replica check]), collectives
// lined up across ranks and the hang diagnosis (Note [Collectives across ranks]).
#include "keel/analysis/ranks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "keel/base/output_path.h"
#include "keel/base/text.h"
#include "keel/storage/errors.h"
#include "keel/storage/reader.h"
#include "run_folder_util.h"

namespace keel::analysis {

namespace {

using nlohmann::json;
using storage::OpRecord;
using storage::Recording;
using storage::RunManifest;

// The ops that talk to other ranks (copy_to_group does not, forward).
bool isCollective(const std::string& name) {
  return name == "all_reduce" || name == "all_gather" || name == "reduce_scatter" ||
         name == "broadcast" || name == "all_to_all";
}

// A recorded collective's attributes (Note [Recorded collectives] in the engine).
struct CollectiveAttrs {
  std::string group;
  int64_t number = 0;
  int64_t bytes = 0;
};

std::optional<CollectiveAttrs> collectiveAttrs(const std::string& attrsJson) {
  if (jsonNestingDepth(attrsJson) > kMaxJsonDepth) return std::nullopt;  // Note [Bounded JSON]
  json j = json::parse(attrsJson, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("group") || !j["group"].is_string() ||
      !j.contains("collective") || !j["collective"].is_string())
    return std::nullopt;
  CollectiveAttrs a;
  a.group = j["group"].get<std::string>();
  const std::string c = j["collective"].get<std::string>();
  const size_t hash = c.rfind('#');
  if (hash == std::string::npos) return std::nullopt;
  a.number = std::atoll(c.c_str() + hash + 1);
  if (j.contains("bytes") && j["bytes"].is_number_integer()) a.bytes = j["bytes"].get<int64_t>();
  return a;
}

// Which instance of `group` world rank r is in: a dp group is named by its tp rank, a tp group by
// its dp rank; an ep or cp group (k consecutive dp ranks of one tp rank) by its block of dp ranks
// and its tp rank, an edp group by its place in the ep blocks and its tp rank; the world is one
// group (the engine's Note [Expert parallel groups]).
int64_t blockOf(const RunManifest& m, const std::string& group) {
  return group == "cp" ? m.cp : group == "ep" || group == "edp" ? m.ep : 1;
}

int64_t groupIndexOf(const RunManifest& m, const std::string& group, int64_t r) {
  const int64_t d = r / m.tp, t = r % m.tp, k = blockOf(m, group);
  if (group == "dp") return t;
  if (group == "tp") return d;
  if (group == "ep" || group == "cp") return (d / k) * m.tp + t;
  if (group == "edp") return (d % k) * m.tp + t;
  return 0;
}

// The world ranks of that instance, by group rank.
std::vector<int64_t> groupMembers(const RunManifest& m, const std::string& group, int64_t index) {
  std::vector<int64_t> out;
  const int64_t k = blockOf(m, group), t = index % m.tp;
  if (group == "dp")
    for (int64_t d = 0; d < m.dp; ++d) out.push_back(d * m.tp + index);
  else if (group == "tp")
    for (int64_t u = 0; u < m.tp; ++u) out.push_back(index * m.tp + u);
  else if (group == "ep" || group == "cp")
    for (int64_t d = (index / m.tp) * k; d < (index / m.tp + 1) * k; ++d)
      out.push_back(d * m.tp + t);
  else if (group == "edp")
    for (int64_t d = index / m.tp; d < m.dp; d += k) out.push_back(d * m.tp + t);
  else
    for (int64_t r = 0; r < m.worldSize; ++r) out.push_back(r);
  return out;
}

bool recordsMd5(const Recording& rec) {
  const std::string options = rec.run().captureOptionsJson;
  if (jsonNestingDepth(options) > kMaxJsonDepth) return false;  // Note [Bounded JSON]
  json j = json::parse(options, nullptr, false);
  return j.is_object() && j.value("md5", false);
}

std::string lossText(double loss) {
  if (std::isnan(loss)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.4f", loss);
  return b;
}

// One rank's collectives, keyed by (group, number).
struct RankCollective {
  std::string kind, scope;
  int64_t step = 0, bytes = 0, waitNs = 0;
  uint64_t seq = 0;
};
using RankCollectives = std::map<std::pair<std::string, int64_t>, RankCollective>;

RankCollectives collectivesOf(const Recording& rec) {
  RankCollectives out;
  storage::OpQuery q;
  q.withTensors = false;
  for (const char* name :
       {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"}) {
    q.name = name;
    for (const OpRecord& op : rec.ops(q)) {
      const std::optional<CollectiveAttrs> a = collectiveAttrs(op.attrsJson);
      if (!a) continue;
      out[{a->group, a->number}] = {
          op.name, op.scope, op.step, a->bytes, std::max<int64_t>(0, op.endNs - op.beginNs),
          op.seq};
    }
  }
  return out;
}

// Where the hang report of a failed run says it waited: "... in all_reduce #31 of group dp ...".
struct HangPoint {
  std::string kind, group;
  int64_t number = 0;
};
std::optional<HangPoint> hangPoint(const std::string& status) {
  if (status.rfind("failed: hang:", 0) != 0) return std::nullopt;
  // " in <kind> #<n> of group <group>" (the watchdog's words, Note [Collective timeouts]).
  auto word = [&](size_t& at, auto ok) {
    const size_t from = at;
    while (at < status.size() && ok(status[at])) ++at;
    return status.substr(from, at - from);
  };
  auto lowerOr_ = [](char c) { return (c >= 'a' && c <= 'z') || c == '_'; };
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  for (size_t at = status.find(" in "); at != std::string::npos; at = status.find(" in ", at + 1)) {
    size_t p = at + 4;
    HangPoint h;
    h.kind = word(p, lowerOr_);
    if (h.kind.empty() || status.compare(p, 2, " #") != 0) continue;
    p += 2;
    const std::string n = word(p, digit);
    if (n.empty() || status.compare(p, 10, " of group ") != 0) continue;
    p += 10;
    h.group = word(p, lowerOr_);
    if (h.group.empty()) continue;
    h.number = std::atoll(n.c_str());
    return h;
  }
  return std::nullopt;
}

// Ranks whose recordings ended without a status (RankSummary::ended): which, and which of them
// stopped first — the one that recorded the fewest collectives (a rank's recording keeps the
// steps it committed; mpirun ends the other ranks once one dies, so they stop a little later).
std::vector<std::string> diagnoseEnded(const std::vector<RankSummary>& ranks) {
  std::vector<const RankSummary*> ended;
  for (const RankSummary& r : ranks)
    if (r.ended) ended.push_back(&r);
  if (ended.empty()) return {};
  std::string names;
  for (const RankSummary* r : ended) names += (names.empty() ? "" : ", ") + std::to_string(r->rank);
  std::vector<std::string> out{std::string(ended.size() == 1 ? "rank " : "ranks ") + names +
                               ": the recording" + (ended.size() == 1 ? " ends" : "s end") +
                               " without a status, so no process closed " +
                               (ended.size() == 1 ? "it" : "them") +
                               " (killed, crashed, or ended by mpirun after another rank died)"};
  // A rank that failed with an error, or stopped (a --break-on condition it hit), closed its
  // recording and left: the ranks without a status were ended by mpirun after it, or died and
  // caused it; which recording is shortest says nothing then (a rank that skipped a collective
  // ran ahead), the error does. Not a hang report: a rank that waited for another is the
  // symptom, and the rank that never came (frozen, killed) the cause.
  for (const char* kind : {"failed", "stopped"})
    for (const RankSummary& r : ranks) {
      if (r.ended || r.status.rfind(kind, 0) != 0 || hangPoint(r.status)) continue;
      std::string why = r.status.substr(std::min<size_t>(r.status.find(':') + 1, r.status.size()));
      while (!why.empty() && why.front() == ' ') why.erase(0, 1);
      if (why.size() > 160) why = why.substr(0, 157) + "...";
      out.push_back("rank " + std::to_string(r.rank) +
                    (kind[0] == 'f' ? " failed with an error (" : " stopped (") + why +
                    "): the ranks without a status were ended after it by mpirun, or died and "
                    "caused it — read its " +
                    (kind[0] == 'f' ? "error" : "stop") + " first");
      return out;
    }
  const auto first = std::min_element(
      ended.begin(), ended.end(), [](auto* a, auto* b) { return a->collectives < b->collectives; });
  std::string others;
  for (const RankSummary* r : ended)
    if (r != *first)
      others += (others.empty() ? "" : ", ") + std::to_string(r->collectives) + " on rank " +
                std::to_string(r->rank);
  if (ended.size() > 1 && std::count_if(ended.begin(), ended.end(), [&](auto* r) {
                            return r->collectives == (*first)->collectives;
                          }) > 1)
    out.push_back("no rank stopped first by its recording: the fewest collectives (" +
                  std::to_string((*first)->collectives) + ") are on more than one rank");
  else
    out.push_back("rank " + std::to_string((*first)->rank) +
                  " stopped first: its recording holds " + std::to_string((*first)->collectives) +
                  " collectives and " + std::to_string((*first)->steps) + " steps" +
                  (others.empty() ? std::string() : ", against " + others) +
                  " — look there first (an OOM kill shows in the kernel log: dmesg)");
  return out;
}

// What became of a rank's run, for a hang line: "its run finished", "its recording ended
// without a status (killed, or frozen until the job was ended)", "its file cannot be read".
std::string runPhrase(const RankSummary& o) {
  if (!o.unreadable.empty()) return "its file cannot be read";
  if (o.ended)
    return "its recording ended without a status (killed, or frozen until the job ended)";
  return "its run " + o.status;
}

// Each hang report, the rank that never came first: "rank 1 never joined all_reduce #9 of group
// dp, where rank 0 waited (...)". The waiting rank's report is the symptom; the rank that stopped
// calling (frozen, killed, or gone ahead by another collective) is where to look.
std::vector<std::string> diagnoseHang(const RunManifest& m, const std::vector<RankSummary>& ranks,
                                      const std::vector<RankCollectives>& colls) {
  std::vector<std::string> out;
  for (const RankSummary& s : ranks) {
    const std::optional<HangPoint> h = hangPoint(s.status);
    if (!h) continue;
    const int64_t index = groupIndexOf(m, h->group, s.rank);
    const std::string where = h->kind + " #" + std::to_string(h->number) + " of group " + h->group;
    const std::string waited = "where rank " + std::to_string(s.rank) + " waited";
    std::vector<std::string> parts;
    for (int64_t r : groupMembers(m, h->group, index)) {
      if (r == s.rank) continue;
      const RankCollectives& c = colls[size_t(r)];
      // This rank's last recorded collective of the group.
      int64_t last = 0;
      const RankCollective* lastRec = nullptr;
      for (auto it = c.lower_bound({h->group, 0}); it != c.end() && it->first.first == h->group;
           ++it) {
        last = it->first.second;
        lastRec = &it->second;
      }
      const RankSummary& o = ranks[size_t(r)];
      if (const std::optional<HangPoint> oh = hangPoint(o.status);
          oh && oh->group == h->group && oh->number == h->number)
        continue;  // waiting in the same collective: it joined
      if (last < h->number) {
        parts.push_back("rank " + std::to_string(r) + " never joined " + where + ", " + waited +
                        " (its last " + h->group + " collective is " +
                        (lastRec ? lastRec->kind + " #" + std::to_string(last) + " in step " +
                                       std::to_string(lastRec->step) +
                                       (lastRec->scope.empty() ? "" : ", scope " + lastRec->scope)
                                 : std::string("none")) +
                        "; " + runPhrase(o) + ")");
      } else {
        const auto it = c.find({h->group, h->number});
        parts.push_back("rank " + std::to_string(r) + " passed #" + std::to_string(h->number) +
                        " (" + (it != c.end() ? it->second.kind : std::string("?")) +
                        ") of group " + h->group + " without joining it, " + waited +
                        ": the ranks called different collectives (--check-collectives names "
                        "where)");
      }
    }
    if (parts.empty())
      out.push_back("rank " + std::to_string(s.rank) + " waited in " + where +
                    ": every rank of the group waits there too");
    else
      out.push_back(joinText(parts, "; "));
  }
  return out;
}

}  // namespace

RunSummary summarizeRun(const std::string& dir) {
  RunSummary s;
  std::map<int64_t, int64_t> pendingBytes;  // world rank -> bytes of the collective it hung in
  s.manifest = storage::readManifest(dir);
  const RunManifest& m = s.manifest;
  std::vector<RankCollectives> colls;
  std::optional<std::string> firstError;
  int64_t readable = 0;
  for (int64_t r = 0; r < m.worldSize; ++r) {
    RankSummary rs;
    rs.rank = r;
    rs.dpRank = m.ranks[size_t(r)].dpRank;
    rs.tpRank = m.ranks[size_t(r)].tpRank;
    rs.file = m.ranks[size_t(r)].file;
    // A missing or damaged rank file (a node lost, a disk full) leaves the others to read; a
    // file of another run (checkRankRun) is the folder's error.
    auto unreadable = [&](const std::string& why) {
      RankSummary fresh;
      fresh.rank = rs.rank;
      fresh.dpRank = rs.dpRank;
      fresh.tpRank = rs.tpRank;
      fresh.file = rs.file;
      rs = std::move(fresh);
      rs.unreadable = why;
      if (!firstError) firstError = why;
      s.unreadable.push_back("rank " + std::to_string(r) + ": " + rs.file + " cannot be read (" +
                             why + "); the other ranks are summarised without it");
      s.ranks.push_back(rs);
      colls.emplace_back();
    };
    std::optional<Recording> opened;
    storage::RunInfo run;
    try {
      opened.emplace(Recording::open(storage::rankPath(dir, m, r)));
      run = opened->run();
    } catch (const std::exception& e) {
      unreadable(e.what());
      continue;
    }
    storage::checkRankRun(dir, m, r, run);
    const Recording& rec = *opened;
    RankCollectives rankColls;
    try {  // a file truncated past its first pages opens, and fails at the first query
      rs.status = run.status;
      rs.ended = run.status == "running" && !outputLockHeld(storage::rankPath(dir, m, r));
      rs.backend = run.backend;
      const std::vector<storage::StepRecord> steps = rec.steps();
      rs.steps = int64_t(steps.size());
      rs.lastLoss = storage::kNoValue;  // of the last step the rank finished
      for (auto it = steps.rbegin(); it != steps.rend(); ++it)
        if (it->endNs != 0 && !std::isnan(it->loss)) {
          rs.lastLoss = it->loss;
          break;
        }
      rs.ops = rec.opCount();
      rs.md5 = recordsMd5(rec);
      rankColls = collectivesOf(rec);
      // The collective a hang report names never ended, so it is no op: its bytes are in the
      // report's ring, logged into the recording ("  all_reduce #9 of dp, 4 bytes, by op ...,
      // still waiting").
      if (const std::optional<HangPoint> h = hangPoint(rs.status)) {
        storage::LogQuery q;
        q.maxLevel = LogLevel::Error;
        const std::string head =
            h->kind + " #" + std::to_string(h->number) + " of " + h->group + ", ";
        for (const storage::LogRecord& l : rec.logs(q))
          if (l.scope == "collectives" && l.message.find("still waiting") != std::string::npos)
            if (const size_t at = l.message.find(head); at != std::string::npos)
              pendingBytes[r] = std::atoll(l.message.c_str() + at + head.size());
      }
    } catch (const std::exception& e) {
      unreadable(e.what());
      continue;
    }
    ++readable;
    for (const auto& [key, c] : rankColls) {
      ++rs.collectives;
      rs.waitNs += c.waitNs;
      rs.bytesByGroup[key.first] += c.bytes;
    }
    colls.push_back(std::move(rankColls));
    s.ranks.push_back(rs);
  }
  if (readable == 0 && firstError) throw storage::StorageError(*firstError);
  // Line up: every (group, instance, number) any rank recorded.
  std::map<std::tuple<std::string, int64_t, int64_t>, AlignedCollective> aligned;
  // What each rank called under one number: "rank 0 all_reduce in dp_loss, 4 bytes".
  std::map<std::tuple<std::string, int64_t, int64_t>, std::vector<std::string>> calls;
  for (int64_t r = 0; r < m.worldSize; ++r)
    for (const auto& [key, c] : colls[size_t(r)]) {
      const int64_t index = groupIndexOf(m, key.first, r);
      AlignedCollective& a = aligned[{key.first, index, key.second}];
      const std::string call = c.kind + (c.scope.empty() ? "" : " in " + c.scope) + ", " +
                               std::to_string(c.bytes) + " bytes";
      std::vector<std::string>& seen = calls[{key.first, index, key.second}];
      if (!seen.empty() && seen.front().substr(seen.front().find(' ', 5) + 1) != call)
        a.mismatch = "x";  // spelled out below
      seen.push_back("rank " + std::to_string(r) + " " + call);
      if (a.ranks.empty()) {
        a.group = key.first;
        a.groupIndex = index;
        a.number = key.second;
        a.kind = c.kind;
        a.scope = c.scope;
        a.step = c.step;
        a.bytes = c.bytes;
        a.ranks = groupMembers(m, key.first, index);
        a.waitNs.assign(a.ranks.size(), std::nullopt);
        a.seqs.assign(a.ranks.size(), std::nullopt);
      }
      const auto at = std::find(a.ranks.begin(), a.ranks.end(), r);
      if (at != a.ranks.end()) {
        a.waitNs[size_t(at - a.ranks.begin())] = c.waitNs;
        a.seqs[size_t(at - a.ranks.begin())] = c.seq;
      }
    }
  // The collective a hung rank was still waiting in is in no recording as an op (it never ended):
  // it comes from the hang report, the waiting rank's wait being the timeout it reported (and
  // counted in the rank's time waited: it is most of it).
  for (RankSummary& r : s.ranks) {
    const std::optional<HangPoint> h = hangPoint(r.status);
    if (!h) continue;
    const int64_t index = groupIndexOf(m, h->group, r.rank);
    AlignedCollective& a = aligned[{h->group, index, h->number}];
    if (a.ranks.empty()) {
      a.group = h->group;
      a.groupIndex = index;
      a.number = h->number;
      a.kind = h->kind;
      a.step = r.steps;  // the step it hung in
      // "..., called by op all_reduce in dp_loss: ..." (Note [Collective timeouts])
      const std::string by = "called by op ";
      if (const size_t at = r.status.find(by); at != std::string::npos) {
        const size_t in = r.status.find(" in ", at + by.size());
        const size_t end = r.status.find(':', at + by.size());
        if (in != std::string::npos && end != std::string::npos && in < end)
          a.scope = r.status.substr(in + 4, end - in - 4);
      }
      a.ranks = groupMembers(m, h->group, index);
      a.waitNs.assign(a.ranks.size(), std::nullopt);
      a.seqs.assign(a.ranks.size(), std::nullopt);
    }
    a.pending = true;
    if (a.bytes == 0 && pendingBytes.count(r.rank)) a.bytes = pendingBytes[r.rank];
    const auto at = std::find(a.ranks.begin(), a.ranks.end(), r.rank);
    const size_t waited = r.status.find(" waited ");
    if (at != a.ranks.end() && waited != std::string::npos) {
      const int64_t ns = int64_t(std::atoll(r.status.c_str() + waited + 8)) * 1000000000;
      a.waitNs[size_t(at - a.ranks.begin())] = ns;
      r.waitNs += ns;
    }
  }
  s.lastArrivals.assign(size_t(m.worldSize), 0);
  for (auto& [key, a] : aligned) {
    if (!a.mismatch.empty()) a.mismatch = joinText(calls[key], "; ");
    const bool everyRank =
        std::all_of(a.waitNs.begin(), a.waitNs.end(), [](const auto& w) { return bool(w); });
    if (a.ranks.size() > 1 && !a.pending && everyRank && a.mismatch.empty()) {
      int64_t least = -1;
      for (size_t i = 0; i < a.ranks.size(); ++i)
        if (a.waitNs[i] && (least < 0 || *a.waitNs[i] < *a.waitNs[size_t(least)]))
          least = int64_t(i);
      if (least >= 0) {
        a.straggler = a.ranks[size_t(least)];
        ++s.lastArrivals[size_t(a.straggler)];
      }
    }
    s.collectives.push_back(std::move(a));
  }
  s.hang = diagnoseHang(m, s.ranks, colls);
  s.ended = diagnoseEnded(s.ranks);
  return s;
}

std::string groupName(const AlignedCollective& a, int64_t instances) {
  if (instances <= 1) return a.group;
  std::vector<std::string> ranks;
  for (int64_t r : a.ranks) ranks.push_back(std::to_string(r));
  return a.group + " (ranks " + joinText(ranks, ", ") + ")";
}

std::string waitText(int64_t ns) {
  char b[32];
  if (ns >= 1000000000)
    std::snprintf(b, sizeof b, "%.2f s", double(ns) / 1e9);
  else
    std::snprintf(b, sizeof b, "%.2f ms", double(ns) / 1e6);
  return b;
}

std::string runSummaryText(const RunSummary& s) {
  const RunManifest& m = s.manifest;
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "run        %lld ranks: dp %lld x tp %lld%s%s%s%s%s\n",
                static_cast<long long>(m.worldSize), static_cast<long long>(m.dp),
                static_cast<long long>(m.tp),
                m.ep > 1   ? (" (experts over ep " + std::to_string(m.ep) + ")").c_str()
                : m.cp > 1 ? (" (sequence over cp " + std::to_string(m.cp) + ")").c_str()
                           : "",
                m.vocab ? " (vocabulary split over tp)" : "",
                m.zero ? " (optimizer state sharded over dp)" : "",
                m.model.empty() ? "" : ", model ", m.model.c_str());
  out += line;
  out +=
      "\n  rank  dp  tp  file          steps  last loss  ops      collectives  waited     "
      "last to arrive  status\n";
  for (const RankSummary& r : s.ranks) {
    if (!r.unreadable.empty()) {
      std::snprintf(line, sizeof line, "  %-4lld  %-2lld  %-2lld  %-12s  cannot be read\n",
                    static_cast<long long>(r.rank), static_cast<long long>(r.dpRank),
                    static_cast<long long>(r.tpRank), r.file.c_str());
      out += line;
      continue;
    }
    std::snprintf(line, sizeof line,
                  "  %-4lld  %-2lld  %-2lld  %-12s  %-5lld  %-9s  %-7lld  %-11lld  %-9s  %-14lld  "
                  "%s\n",
                  static_cast<long long>(r.rank), static_cast<long long>(r.dpRank),
                  static_cast<long long>(r.tpRank), r.file.c_str(), static_cast<long long>(r.steps),
                  lossText(r.lastLoss).c_str(), static_cast<long long>(r.ops),
                  static_cast<long long>(r.collectives), waitText(r.waitNs).c_str(),
                  static_cast<long long>(s.lastArrivals[size_t(r.rank)]),
                  r.ended ? "ended without a status (killed or crashed)" : r.status.c_str());
    out += line;
  }
  // Per group: how many instances, collectives per instance, bytes each rank sent (one figure
  // when every rank sent the same), the longest waits.
  struct GroupTotals {
    std::map<int64_t, int64_t> perInstance;  // group index -> collectives
    int64_t incomplete = 0;
  };
  std::map<std::string, GroupTotals> byGroup;
  for (const AlignedCollective& a : s.collectives) {
    GroupTotals& g = byGroup[a.group];
    ++g.perInstance[a.groupIndex];
    if (std::any_of(a.waitNs.begin(), a.waitNs.end(), [](const auto& w) { return !w; }))
      ++g.incomplete;
  }
  auto bytesText = [&](const std::string& group) {
    std::map<int64_t, std::vector<int64_t>> ranksBySent;  // bytes -> ranks
    for (const RankSummary& r : s.ranks) {
      if (!r.unreadable.empty()) continue;
      const auto it = r.bytesByGroup.find(group);
      ranksBySent[it == r.bytesByGroup.end() ? 0 : it->second].push_back(r.rank);
    }
    if (ranksBySent.size() == 1)
      return std::to_string(ranksBySent.begin()->first) + " bytes sent per rank";
    std::string t = "bytes sent:";
    for (const RankSummary& r : s.ranks)
      if (r.unreadable.empty()) {
        const auto it = r.bytesByGroup.find(group);
        t += std::string(t.back() == ':' ? " " : ", ") + "rank " + std::to_string(r.rank) + " " +
             std::to_string(it == r.bytesByGroup.end() ? 0 : it->second);
      }
    return t;
  };
  if (!byGroup.empty()) {
    out +=
        "\ncollectives (lined up across ranks by group and number; the last to arrive waited "
        "least)\n";
    for (const auto& [name, g] : byGroup) {
      const int64_t groups = int64_t(g.perInstance.size());
      int64_t most = 0;
      for (const auto& [index, n] : g.perInstance) most = std::max(most, n);
      // "each" only when every rank recorded them all; else the most a group recorded.
      std::snprintf(line, sizeof line, "  %-6s %lld group%s of %lld ranks, %lld collectives %s, "
                    "%s%s\n",
                    name.c_str(), static_cast<long long>(groups), groups == 1 ? "" : "s",
                    static_cast<long long>(s.collectives.empty() ? 0 : [&] {
                      for (const AlignedCollective& a : s.collectives)
                        if (a.group == name) return int64_t(a.ranks.size());
                      return int64_t(0);
                    }()),
                    static_cast<long long>(most), g.incomplete ? "at most" : "each",
                    bytesText(name).c_str(),
                    g.incomplete ? (", " + std::to_string(g.incomplete) +
                                    " not recorded by every rank of their group")
                                       .c_str()
                                 : "");
      out += line;
    }
    // The longest single waits: where a rank stood still for another.
    std::vector<std::pair<int64_t, const AlignedCollective*>> waits;
    for (const AlignedCollective& a : s.collectives) {
      int64_t most = 0;
      for (const auto& w : a.waitNs)
        if (w) most = std::max(most, *w);
      waits.push_back({most, &a});
    }
    std::sort(waits.begin(), waits.end(),
              [](const auto& x, const auto& y) { return x.first > y.first; });
    out += "  longest waits:\n";
    for (size_t i = 0; i < waits.size() && i < 5; ++i) {
      const AlignedCollective& a = *waits[i].second;
      std::string per;
      for (size_t k = 0; k < a.ranks.size(); ++k)
        per += (k ? ", " : "") + std::string("rank ") + std::to_string(a.ranks[k]) + " " +
               (!a.waitNs[k] ? std::string("never")
                : a.pending  ? waitText(*a.waitNs[k]) + ", still waiting"
                             : waitText(*a.waitNs[k]));
      const std::string last =
          a.straggler < 0 ? std::string("-") : "rank " + std::to_string(a.straggler);
      std::snprintf(line, sizeof line, "    %s #%lld of %s (step %lld, %s): %s; last: %s\n",
                    a.kind.c_str(), static_cast<long long>(a.number),
                    groupName(a, int64_t(byGroup[a.group].perInstance.size())).c_str(),
                    static_cast<long long>(a.step), a.scope.empty() ? "-" : a.scope.c_str(),
                    per.c_str(), last.c_str());
      out += line;
    }
  }
  // Numbers the ranks recorded as different calls: a skipped or added collective, met by another.
  std::vector<const AlignedCollective*> mismatched;
  for (const AlignedCollective& a : s.collectives)
    if (!a.mismatch.empty()) mismatched.push_back(&a);
  if (!mismatched.empty()) {
    out +=
        "\ncollectives the ranks called differently (a rank skipped or added one; "
        "--check-collectives stops there)\n";
    for (size_t i = 0; i < mismatched.size() && i < 5; ++i) {
      const AlignedCollective& a = *mismatched[i];
      out += "  " + a.kind + " #" + std::to_string(a.number) + " of " +
             groupName(a, int64_t(byGroup[a.group].perInstance.size())) + " (step " +
             std::to_string(a.step) + "): " + a.mismatch + "\n";
    }
    if (mismatched.size() > 5) out += "  and " + std::to_string(mismatched.size() - 5) + " more\n";
  }
  if (!s.unreadable.empty()) {
    out += "\nunreadable rank files\n";
    for (const std::string& u : s.unreadable) out += "  " + u + "\n";
  }
  if (!s.hang.empty()) {
    out += "\nhang\n";
    for (const std::string& h : s.hang) out += "  " + h + "\n";
  }
  if (!s.ended.empty()) {
    out += "\nended without a status\n";
    for (const std::string& e : s.ended) out += "  " + e + "\n";
  }
  return out;
}

// ---- The replica check (Note [Replica check]) ----

namespace {

// Which replicas a comparison pairs: whether they hold the same experts (Note [Expert-parallel
// MoE] in the engine: dp ranks d and d' do when d % ep == d' % ep) and whether the optimizer state
// is sharded (--zero: each rank updates its own rows).
struct Pairing {
  bool sameExperts = true;
  bool zero = false;
};

// Which of an op's tensors the replicas must agree on.
bool mustAgree(const OpRecord& op, const storage::TensorRecord& t, const Pairing& p) {
  if (op.step == 0) return t.role == storage::Role::Output;  // initialisation
  if (op.phase == Phase::Optimizer && !isCollective(op.name)) return true;
  if (isCollective(op.name) && t.role == storage::Role::Output && op.name != "reduce_scatter" &&
      op.name != "all_to_all") {  // those two hand each rank its own block
    const std::optional<CollectiveAttrs> a = collectiveAttrs(op.attrsJson);
    return a && (a->group == "dp" || (a->group == "edp" && p.sameExperts));
  }
  return false;
}

// The ops of a replica's step the check pairs, in order: the collectives, initialisation, and the
// optimizer's own ops — the forward and backward ops work on each replica's own rows, and may
// differ (a MoE expert that no token of this rank reached runs nothing). Under --zero the
// optimizer's ops are each rank's rows; between replicas holding different experts, the experts'
// updates and the gradient clipping (which squares the experts' gradients) are theirs alone.
std::vector<OpRecord> pairedOps(std::vector<OpRecord> ops, const Pairing& p) {
  std::erase_if(ops, [&](const OpRecord& op) {
    if (isCollective(op.name)) {
      // An ep group's exchanges depend on its own tokens (a group where no token was kept skips
      // them), and an edp group's on which of its experts were reached: only replicas holding
      // the same experts (one edp group) pair those.
      const std::optional<CollectiveAttrs> a = collectiveAttrs(op.attrsJson);
      return a && (a->group == "ep" || (a->group == "edp" && !p.sameExperts));
    }
    if (op.step == 0) return false;
    if (op.phase != Phase::Optimizer || p.zero) return true;
    return !p.sameExperts && (detail::isExpertScope(op.scope) || op.scope == "clip_grad_norm");
  });
  return ops;
}

std::string tensorName(const storage::TensorRecord& t) {
  return std::string(t.role == storage::Role::Input ? "input " : "output ") +
         std::to_string(t.index);
}

// Compares replica b's ops of one step against replica a's; the first difference, if any.
std::optional<ReplicaDifference> compareStep(const std::vector<OpRecord>& a,
                                             const std::vector<OpRecord>& b, int64_t step,
                                             const Pairing& pairing, ReplicaReport& report) {
  auto diff = [&](size_t i, const std::string& what) {
    ReplicaDifference d;
    d.step = step;
    const OpRecord& op = i < a.size() ? a[i] : b[i];
    d.op = op.name;
    d.scope = op.scope;
    d.phase = op.phase;
    if (i < a.size()) d.seqA = a[i].seq;
    if (i < b.size()) d.seqB = b[i].seq;
    d.what = what;
    d.index = int64_t(i);
    return d;
  };
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const OpRecord& x = a[i];
    const OpRecord& y = b[i];
    if (x.name != y.name || x.phase != y.phase)
      return diff(i, "compared op " + std::to_string(i + 1) + " of the step is " + x.name + " (" +
                         std::string(phaseName(x.phase)) + ") on one replica and " + y.name + " (" +
                         std::string(phaseName(y.phase)) +
                         ") on the other: the replicas ran different programs");
    bool compared = false;
    for (const storage::TensorRecord& t : x.tensors) {
      if (!mustAgree(x, t, pairing) || t.md5.empty()) continue;
      const auto u = std::find_if(y.tensors.begin(), y.tensors.end(), [&](const auto& v) {
        return v.role == t.role && v.index == t.index;
      });
      if (u == y.tensors.end() || u->md5.empty()) continue;
      compared = true;
      ++report.tensorsCompared;
      if (u->md5 != t.md5) {
        ReplicaDifference d = diff(i, tensorName(t) + " differs");
        d.tensor = tensorName(t);
        d.md5A = t.md5;
        d.md5B = u->md5;
        return d;
      }
    }
    if (compared) ++report.opsCompared;
  }
  if (a.size() != b.size())
    return diff(n, "the step has " + std::to_string(a.size()) + " ops on one replica and " +
                       std::to_string(b.size()) + " on the other");
  return std::nullopt;
}

}  // namespace

ReplicaReport checkReplicas(const std::string& dir) {
  const RunManifest m = storage::readManifest(dir);
  ReplicaReport report;
  report.dp = m.dp;
  report.tp = m.tp;
  report.zero = m.zero;
  report.ep = m.ep;
  std::vector<Recording> recs = detail::openRanks(dir, m);
  for (int64_t r = 0; r < m.worldSize; ++r)
    if (!recordsMd5(recs[size_t(r)]))
      throw storage::StorageError("run folder " + dir + ": " + m.ranks[size_t(r)].file +
                                  " has no MD5s; record with --md5 or --all to check replicas");
  report.steps = detail::finishedSteps(recs);  // a rank stopped mid-step is not a desync
  if (m.dp < 2) return report;
  for (int64_t step = 0; step <= report.steps; ++step) {
    for (int64_t t = 0; t < m.tp; ++t) {
      const std::vector<OpRecord> all = recs[size_t(t)].stepOps(step);
      for (int64_t d = 1; d < m.dp; ++d) {
        const int64_t r = d * m.tp + t;
        const Pairing pairing{d % m.ep == 0, m.zero};
        std::optional<ReplicaDifference> diff =
            compareStep(pairedOps(all, pairing), pairedOps(recs[size_t(r)].stepOps(step), pairing),
                        step, pairing, report);
        if (!diff) continue;
        diff->tpRank = t;
        diff->rankA = t;
        diff->rankB = r;
        if (!report.first || diff->index < report.first->index) report.first = diff;
      }
    }
    if (report.first) break;  // the earliest step with a difference
  }
  return report;
}

std::string replicaText(const ReplicaReport& r) {
  char line[256];
  std::snprintf(line, sizeof line,
                "replica check: %s, %lld steps and initialisation, %lld ops and "
                "%lld tensors compared by MD5\n",
                storage::layoutText(r.dp, r.tp, r.ep, 1, r.zero, false).c_str(),
                static_cast<long long>(r.steps), static_cast<long long>(r.opsCompared),
                static_cast<long long>(r.tensorsCompared));
  std::string out = line;
  if (r.dp < 2) return out + "one replica per model shard (dp 1): nothing to compare\n";
  if (!r.first && r.zero)
    return out +
           "replicas identical: every averaged gradient and every all-gathered parameter the same "
           "on every dp rank (--zero: each rank's optimizer rows are its own)\n";
  if (!r.first && r.ep > 1)
    return out +
           "replicas identical: every parameter, averaged gradient and optimizer update the "
           "same on every dp rank holding it (--ep: each expert on the ranks holding it)\n";
  if (!r.first)
    return out +
           "replicas identical: every parameter, averaged gradient and optimizer update the "
           "same on every dp rank\n";
  const ReplicaDifference& d = *r.first;
  std::snprintf(line, sizeof line,
                "replicas differ: step %lld, op %s (%s%s%s), tp rank %lld: rank %lld op #%llu vs "
                "rank %lld op #%llu\n",
                static_cast<long long>(d.step), d.op.c_str(), phaseName(d.phase).data(),
                d.scope.empty() ? "" : ", scope ", d.scope.c_str(),
                static_cast<long long>(d.tpRank), static_cast<long long>(d.rankA),
                static_cast<unsigned long long>(d.seqA), static_cast<long long>(d.rankB),
                static_cast<unsigned long long>(d.seqB));
  out += line;
  out += "  " + d.what + "\n";
  if (!d.md5A.empty())
    out += "  md5 rank " + std::to_string(d.rankA) + " " + d.md5A + ", rank " +
           std::to_string(d.rankB) + " " + d.md5B + "\n";
  return out;
}

std::string replicaJson(const ReplicaReport& r) {
  json j = {{"dp", r.dp},
            {"tp", r.tp},
            {"zero", r.zero},
            {"ep", r.ep},
            {"steps", r.steps},
            {"ops_compared", r.opsCompared},
            {"tensors_compared", r.tensorsCompared},
            {"identical", !r.first.has_value()}};
  if (r.first) {
    const ReplicaDifference& d = *r.first;
    j["first_difference"] = {
        {"step", d.step},     {"tp_rank", d.tpRank}, {"rank_a", d.rankA},
        {"rank_b", d.rankB},  {"seq_a", d.seqA},     {"seq_b", d.seqB},
        {"op", d.op},         {"scope", d.scope},    {"phase", phaseName(d.phase)},
        {"tensor", d.tensor}, {"md5_a", d.md5A},     {"md5_b", d.md5B},
        {"what", d.what}};
  }
  return j.dump(2, ' ', false, json::error_handler_t::replace);
}

}  // namespace keel::analysis
