// Multi-rank runs: the process group runtime under the collective ops (all_reduce, all_gather,
// reduce_scatter, broadcast, all_to_all, copy_to_group). Under an MPI launcher (mpirun, srun)
// ranks find their place from MPI; a process started alone is world size 1 and never touches MPI.
// Invariant: every collective runs on the calling thread, one at a time, in the same order on
// every rank of its group (MPI's rule); Keel numbers them per group to check and report that.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "keel/dtype.h"
#include "keel/error.h"

namespace keel::dist {

// The parallel layout: world = dp × tp ranks. World rank r has tensor-parallel rank r % tp and
// data-parallel rank r / tp, so a tensor-parallel group is tp consecutive ranks (the GPUs of one
// machine, in a cluster), and a data-parallel group holds one rank of each tp group.
struct Layout {
  int dp = 1;
  int tp = 1;
  // Note [Sharded optimizer state]: AdamW's moments split across the dp group (ZeRO stage 2:
  // gradients reduce-scattered, updated parameters all-gathered); keel train --zero.
  bool zero = false;
  // Expert parallelism (keel train --ep): a MoE layer's experts split across ep data-parallel
  // ranks (ep divides dp), tokens exchanged with all_to_all (Note [Expert-parallel MoE]).
  int ep = 1;
  // Context parallelism (keel train --cp): each row's sequence split across cp data-parallel
  // ranks (cp divides dp; the batch is split over dp / cp), attention by a ring of keys and values
  // (Note [Context-parallel attention] in keel/context_parallel.h).
  int cp = 1;
  // The vocabulary split across the tp ranks too (keel train --vocab-parallel; Note
  // [Vocabulary-parallel embedding and loss] in keel/nn.h).
  bool vocab = false;
  int world() const { return dp * tp; }
  bool operator==(const Layout&) const = default;
};

// Whether this process was started by an MPI launcher (its environment says so: OMPI_COMM_WORLD_*,
// PMIX_RANK, PMI_SIZE).
bool launchedByMpi();
// The world size the launcher gave (1 when not launched by one), without initialising MPI.
int launcherWorldSize();

// The layout for a world of `world` ranks: dp 0 means "what tp leaves" (world / tp). keel::Error,
// naming the numbers, when tp does not divide the world or dp × tp is not the world.
Layout resolveLayout(int dp, int tp, int world);

// Starts the process group once for `layout` (MPI_Init under a launcher; nothing alone). Throws
// keel::Error when dp × tp is not the world size, naming both. Calling it again with the same
// layout is a no-op; with another, an error.
void init(const Layout& layout);
bool initialized();
int worldRank();  // 0 alone
int worldSize();  // 1 alone
Layout layout();  // {1, 1} before init

// A group of ranks by name: "world", "dp" (the ranks holding the same model shard), "tp" (the
// ranks holding one replica's shards), "ep" (ep consecutive dp ranks whose experts together make
// one MoE layer: they exchange tokens), "edp" (the dp ranks holding the same experts) or "cp"
// (cp consecutive dp ranks holding one row's sequence between them).
// keel::Error for another name.
struct GroupInfo {
  int rank = 0;
  int size = 1;
};
GroupInfo group(std::string_view name);

enum class ReduceOp : uint8_t { Sum, Mean, Max };
std::string_view reduceOpName(ReduceOp op);
ReduceOp parseReduceOp(std::string_view name);  // keel::Error naming the op otherwise

// Note [Collective timeouts]: a rank waiting in a collective longer than `timeoutSeconds` is
// reported — which collective of which group, how long, what this rank ran last (the ring) — by a
// watchdog thread, which calls the hang handlers (capture writes the report into the recording),
// prints one line and ends the process with status 2 (the other ranks' launcher then ends them).
// `checkDescriptors`: before each collective every rank of the group exchanges what it is about
// to call (per-group number, kind, dtype, count); a mismatch is a CollectiveError on every rank
// naming the two ranks — the cheap way to find a rank that skipped a collective or called it with
// another shape, at the cost of one small extra collective each time.
struct Options {
  double timeoutSeconds = 600;
  bool checkDescriptors = false;
};
void setOptions(const Options& o);
Options options();

// A collective failed: a descriptor mismatch, an MPI error. The message names group and ranks.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

// One collective as the ring keeps it (Note [Collective ring]).
struct CollectiveRecord {
  std::string kind;  // all_reduce, all_gather, ...
  std::string group;
  int64_t seq = 0;                 // 1-based, per group
  int64_t bytes = 0;               // this rank's input bytes
  int64_t beginNs = 0, endNs = 0;  // endNs 0: still waiting
  std::string op;                  // the engine op that called it, with its module scope
};
// The last collectives this rank called, oldest first (at most 64).
std::vector<CollectiveRecord> recentCollectives();
// How many collectives this rank has called on the group so far.
int64_t groupSeq(std::string_view group);

// What a collective is about to do: kind, dtype and element count, for the descriptor check,
// the ring and the recorded attributes.
struct Call {
  std::string_view kind;
  std::string_view group;
  DType dtype = DType::Float32;
  int64_t count = 0;  // elements of this rank's input
  int64_t extra = 0;  // kind-specific: the root of a broadcast, the dim of a gather
};

// The collectives themselves, on host memory, blocking. Buffers are contiguous; `in` and `out`
// may be the same for allReduce and broadcast. Sizes are checked by the ops before they get here.
void allReduce(const Call& c, const void* in, void* out, ReduceOp op);
// out = the groups' inputs (count elements each) one after another, in group rank order.
void allGather(const Call& c, const void* in, void* out);
// in = size blocks of count / size elements; out = the reduction of every rank's block `rank`.
void reduceScatter(const Call& c, const void* in, void* out, ReduceOp op);
void broadcast(const Call& c, void* data, int root);
// in = size blocks of count / size elements; block j goes to rank j; out = the blocks received,
// in sender order.
void allToAll(const Call& c, const void* in, void* out);

// A reference all-reduce for the cpu-ref backend: every rank's input gathered, then reduced in
// rank order in float64 and rounded once (the same bits on every rank, whatever MPI does).
void allReduceInRankOrder(const Call& c, const void* in, void* out, ReduceOp op);

// Called by the watchdog when a collective times out, before the process ends (capture writes the
// report and flushes its recording). Returns an id for removeHangHandler.
using HangHandler = std::function<void(const std::string& report)>;
int addHangHandler(HangHandler h);
void removeHangHandler(int id);

// The status this process is about to exit with (the command's; 0 until told). A rank leaving
// with a non-zero status (an error, a --break-on stop) may leave peers waiting for it in a
// collective: finalize() then does not wait for them in MPI_Finalize beyond a short grace (Note
// [A failed rank ends the job]).
void setExitStatus(int status);

// Ends the process group (MPI_Finalize). Registered with atexit by init; safe to call twice.
void finalize();

}  // namespace keel::dist
