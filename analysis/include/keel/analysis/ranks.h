// Multi-rank analyses over a run folder (keel/storage/run_folder.h): the replica check of data
// parallelism (replicas must hold the same parameters and gradients after every all_reduce) and
// each rank's collectives lined up by group and number (who waited, who never arrived). Qt-free:
// `keel diff --replicas`, `keel inspect RUN/` and the studio show the same results.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "keel/storage/records.h"
#include "keel/storage/run_folder.h"

namespace keel::analysis {

// Note [Replica check]: the ranks of a dp group (one per replica, same tp rank) run the same
// program on different rows of the batch, so their activations differ, but everything the
// optimizer sees must be bit for bit the same on every replica: initialisation (step 0), the
// outputs of every all_reduce of group dp (the averaged gradients) and every op of the optimizer
// phase (gradient clipping and the updates, inputs and outputs). The check pairs those ops and
// the collectives of the replicas step by step in order (a different count or op there is itself
// a desync; the forward and backward ops of each replica's own rows may differ, as a MoE expert
// no token reached runs nothing) and compares the MD5s of those tensors; the first difference is
// where the replicas drifted apart — what nothing else catches until the loss goes wrong. (A
// reduce_scatter or an all_to_all hands each rank its own block, so their outputs differ by design
// and are not compared.) Under --zero (Note [Sharded optimizer state] in the engine) each replica
// updates its own rows: the optimizer phase's own ops are left out of the pairing, and what must
// agree is the all_gather of the updated parameters, besides initialisation and the all_reduces.
// Under --ep replicas holding different experts compare everything but the experts' updates and the
// gradient clipping; those holding the same experts also compare their edp all_reduces.
struct ReplicaDifference {
  int64_t tpRank = 0;
  int64_t rankA = 0, rankB = 0;  // world ranks: the group's first replica and the one that differs
  int64_t step = 0;
  int64_t index = 0;  // the op's position in the step (0-based): the same on every replica
  uint64_t seqA = 0, seqB = 0;
  std::string op, scope;
  storage::Phase phase = storage::Phase::Forward;
  std::string tensor;  // "output 0", "input 2"
  std::string md5A, md5B;
  std::string what;  // one line: where and how they differ
};

struct ReplicaReport {
  int64_t dp = 1, tp = 1;
  bool zero = false;                       // optimizer state sharded across dp
  int64_t ep = 1;                          // experts split across ep dp ranks
  int64_t steps = 0;                       // steps compared (those every replica finished)
  int64_t opsCompared = 0;                 // op pairs whose tensors were compared
  int64_t tensorsCompared = 0;             // tensors compared by MD5
  std::optional<ReplicaDifference> first;  // the earliest difference, by step then op
};

// Note [Collectives across ranks]: every rank records its collectives as ops whose attributes
// name the group, the rank's place in it and the collective's per-group number ("all_reduce #12").
// The same number in the same group instance (the dp group of one tp rank, the tp group of one dp
// rank) is one collective seen from each of its ranks: lined up, a rank's op time is how long it
// waited there, and the rank that waited least arrived last — the straggler. (Wait times, not
// clocks: ranks on other machines have other clocks.) A rank that recorded fewer collectives of a
// group than another never arrived at the rest.
struct AlignedCollective {
  std::string group;       // "dp", "tp", "world"
  int64_t groupIndex = 0;  // which instance: a dp group's tp rank, a tp group's dp rank, 0
  int64_t number = 0;      // per-group number, 1-based
  std::string kind;        // all_reduce, ...
  std::string scope;       // the module scope of the first rank's op
  int64_t step = 0;
  int64_t bytes = 0;
  std::vector<int64_t> ranks;                  // the group's world ranks, by group rank
  std::vector<std::optional<int64_t>> waitNs;  // per rank; nullopt: that rank never recorded it
  std::vector<std::optional<uint64_t>> seqs;   // per rank: its op's seq; nullopt: none recorded
  int64_t straggler = -1;  // world rank that waited least; -1 if one rank or pending
  bool pending = false;    // a rank was still waiting in it when the run ended (a hang report)
  // The ranks recorded this number as different calls (kind, scope or bytes: a rank skipped or
  // added a collective, and the calls met where they should not): "rank 0 all_reduce in
  // dp_grad_sync, 3712000 bytes; rank 1 all_reduce in dp_loss, 4 bytes". "" when they agree.
  std::string mismatch;
};

// "dp" alone where the layout has one group of that name, else "dp (ranks 1, 3)".
std::string groupName(const AlignedCollective& a, int64_t instances);

struct RankSummary {
  int64_t rank = 0, dpRank = 0, tpRank = 0;
  std::string file;
  // The rank's file could not be read (missing, truncated, corrupted): why, in one line; the
  // other fields are empty. The other ranks are summarised still (a node lost with its disk).
  std::string unreadable;
  std::string status;  // the recording's run status
  // "running" with no process writing it (base/output_path.h outputLockHeld): the rank's process
  // was killed or crashed before it could write a status.
  bool ended = false;
  std::string backend;
  int64_t steps = 0;  // recorded steps
  double lastLoss = 0;
  int64_t ops = 0;
  int64_t collectives = 0;  // recorded collective calls
  int64_t waitNs = 0;       // time spent in them, a collective it hung in included
  // Bytes of its collectives' inputs, per group name (a rank that skipped one sent less).
  std::map<std::string, int64_t> bytesByGroup;
  bool md5 = false;  // whether MD5s were recorded
};

struct RunSummary {
  storage::RunManifest manifest;
  std::vector<RankSummary> ranks;
  std::vector<AlignedCollective> collectives;  // by group, group index, number
  // Stragglers: per world rank, how often it arrived last at a collective of a group of 2+ that
  // every rank of the group reached (a rank that never came is no straggler's yardstick).
  std::vector<int64_t> lastArrivals;
  // What the recordings say about a hang (Note [Collective timeouts] in keel/dist.h): for a rank
  // whose run failed in a collective, which ranks of the group never joined it and what each of
  // them did last. Empty when no rank hung.
  std::vector<std::string> hang;
  // Ranks whose recordings ended without a status (RankSummary::ended), and the first collective
  // a rank of its group never joined: what a rank killed mid-run (an OOM kill, kill -9; mpirun
  // then ends the others before any timeout) leaves to explain. Empty when none ended so.
  std::vector<std::string> ended;
  // Ranks whose files could not be read (RankSummary::unreadable), one line each.
  std::vector<std::string> unreadable;
};

// A time waited in a collective: "0.82 ms" under a second, "5.00 s" from one on.
std::string waitText(int64_t ns);

// Reads the run folder `dir`: each rank's recording summarised, collectives lined up, a hang
// explained. A rank file that cannot be read is named (RunSummary::unreadable) and the others
// summarised; throws storage::StorageError for a folder or manifest that cannot be read, a rank
// file of another run, and when no rank file can be read.
RunSummary summarizeRun(const std::string& dir);
// What `keel inspect RUN/` prints: layout, a line per rank, collectives per group with the
// stragglers and the longest waits, and the hang diagnosis.
std::string runSummaryText(const RunSummary& s);

// Compares the replicas of every dp group of the run folder `dir`. Throws storage::StorageError
// for a folder, manifest or recording that cannot be read, and for recordings without MD5s
// (record with --md5 or --all).
ReplicaReport checkReplicas(const std::string& dir);
// Human report: the verdict, what was compared, and the first difference with both MD5s.
std::string replicaText(const ReplicaReport& r);
std::string replicaJson(const ReplicaReport& r);

// Note [Parameters across layouts]: a run at one parallel layout against a run at another (a
// tp 2 run folder against a single-process recording; dp x tp against --zero or --ep) cannot be
// compared op by op — the ops differ in shape and in count — but both update the same named
// parameters. Each optimizer update (adamw_step, sgd_step: phase optimizer, scope the parameter's
// name) records the parameter before its update (input 0) and its gradient (input 1); with
// statistics recorded (--stats or --all), the pieces a run's ranks hold of one parameter — its
// tensor-parallel shards, its --zero rows, an expert on the rank holding it; one replica of each
// — combine exactly into the whole tensor's element count, mean, std (population), min, max and
// abs-max. The comparison walks the steps both runs finished and the parameters in the second
// run's order and reports the first (step, parameter, value or gradient, statistic) outside
// |a - b| <= atol + rtol · |b|.
struct ParameterDifference {
  int64_t step = 0;
  std::string parameter;
  std::string what;       // "value before the update" or "gradient"
  std::string statistic;  // "mean", "std", "min", "max", "abs-max", "elements", "missing"
  double a = 0, b = 0;
};
struct ParameterReport {
  std::string layoutA, layoutB;  // "dp 1 x tp 2 (2 ranks)", "one process"
  int64_t steps = 0;             // steps compared
  int64_t parameters = 0;        // parameters per step
  int64_t compared = 0;          // (step, parameter, tensor) statistics compared
  std::optional<ParameterDifference> first;
};
// a and b: a run folder or a single recording each. Throws storage::StorageError for unreadable
// inputs and for recordings without statistics (record with --stats or --all).
ParameterReport compareParameters(const std::string& a, const std::string& b, double atol,
                                  double rtol);
std::string parameterText(const ParameterReport& r, double atol, double rtol);
std::string parameterJson(const ParameterReport& r);

}  // namespace keel::analysis
