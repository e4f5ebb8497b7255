// The process group runtime (keel/dist.h): MPI communicators for the world, dp and tp groups,
// the collectives on host memory, the per-group numbering, the ring of recent collectives and
// the watchdog that reports a rank stuck in one. Alone (no launcher) every group has one rank and
// no MPI function is ever called.
#include "keel/dist.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "keel/base/dtype.h"
#include "keel/dispatch.h"
#include "kernel_util.h"

namespace keel::dist {
namespace {

constexpr size_t kRingSize = 64;
// How long a rank leaving with an error waits for its peers to leave too (Note [A failed rank
// ends the job]), at most the collective timeout.
constexpr double kExitGraceSeconds = 3;
// The process groups (keel/dist.h), in State::groups' order.
constexpr const char* kGroupNames[6] = {"world", "dp", "tp", "ep", "edp", "cp"};
constexpr const char* kGroupList = "world, dp, tp, ep, edp and cp";

struct Group {
  std::string name;
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  int64_t seq = 0;  // collectives called on it so far
};

// What the watchdog looks at: the collective the engine thread is waiting in (Note [Collective
// timeouts]). beginNs 0: none.
struct Waiting {
  int64_t beginNs = 0;
  const Group* group = nullptr;  // the collective is the ring's newest record
};

// Note [Collective ring] keeps kRingSize records in a circle whose strings are assigned in place,
// so that after warm-up a collective allocates nothing for it.
struct Ring {
  std::array<CollectiveRecord, kRingSize> slots;
  size_t next = 0, count = 0;
  CollectiveRecord& push() {
    CollectiveRecord& r = slots[next];
    next = (next + 1) % kRingSize;
    count = std::min(count + 1, kRingSize);
    return r;
  }
  CollectiveRecord& newest() { return slots[(next + kRingSize - 1) % kRingSize]; }
  // Oldest first.
  template <typename F>
  void forEach(F&& f) const {
    for (size_t i = 0; i < count; ++i) f(slots[(next + kRingSize - count + i) % kRingSize]);
  }
};

struct State {
  std::mutex mu;  // everything below (the engine thread and the watchdog)
  bool initialized = false;
  bool mpi = false;
  bool finalized = false;
  // A collective failed (an MPI error): a peer may be waiting in one for good, and MPI_Finalize
  // would wait for it too (Note [A failed collective ends the job]).
  bool collectiveFailed = false;
  int exitStatus = 0;                 // setExitStatus
  MPI_Comm exitComm = MPI_COMM_NULL;  // finalize's barrier (Note [A failed rank ends the job])
  Layout layout;
  int rank = 0, size = 1;
  Group groups[6];  // kGroupNames
  Options opt;
  Ring ring;
  Waiting waiting;
  std::vector<std::pair<int, HangHandler>> handlers;
  int nextHandler = 1;
  std::thread watchdog;
  std::condition_variable wake;
  bool stopWatchdog = false;
};

State& st() {
  static State s;
  return s;
}

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

Group& groupByName(State& s, std::string_view name) {
  for (Group& g : s.groups)
    if (g.name == name) return g;
  throw Error(std::string("no process group '") + std::string(name) + "' (the groups are " +
              kGroupList + ")");
}

std::string mpiError(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return std::string(text, size_t(std::max(0, len)));
}

MPI_Datatype mpiType(DType d) {
  switch (d) {
    case DType::Float32:
      return MPI_FLOAT;
    case DType::Float64:
      return MPI_DOUBLE;
    case DType::Int32:
      return MPI_INT32_T;
    case DType::Int64:
      return MPI_INT64_T;
    case DType::Bool:
      return MPI_C_BOOL;
    default:
      return MPI_DATATYPE_NULL;  // 16-bit floats: reduced through float32 (allReduce)
  }
}

MPI_Op mpiOp(ReduceOp op, DType d) {
  if (op == ReduceOp::Max) return d == DType::Bool ? MPI_LOR : MPI_MAX;
  return d == DType::Bool ? MPI_LOR : MPI_SUM;
}

// Sets every element of the float buffer to v / n (the mean after a sum).
void divideBy(void* data, int64_t count, DType d, int n) {
  if (n == 1) return;
  if (d == DType::Float32) {
    auto* p = static_cast<float*>(data);
    for (int64_t i = 0; i < count; ++i) p[i] = p[i] / float(n);
  } else if (d == DType::Float64) {
    auto* p = static_cast<double*>(data);
    for (int64_t i = 0; i < count; ++i) p[i] = p[i] / double(n);
  } else {
    throw Error("all_reduce mean needs a floating-point tensor, got " + std::string(dtypeName(d)));
  }
}

std::string describeCall(const Call& c, const Group& g, int64_t seq) {
  return std::string(c.kind) + " #" + std::to_string(seq) + " of group " + g.name + " (" +
         std::to_string(g.size) + " ranks)";
}

// Note [Collective ring]: each rank remembers its last kRingSize collectives — kind, group, its
// per-group number, bytes, when it entered and left, and the op (with module scope) that called
// it — so that a hang report says what every rank did last, as PyTorch's Flight Recorder does.
void ringPush(State& s, const Call& c, const Group& g, int64_t seq) {
  CollectiveRecord& r = s.ring.push();
  r.kind.assign(c.kind);
  r.group.assign(g.name);
  r.seq = seq;
  r.bytes = c.count * int64_t(dtypeSize(c.dtype));
  r.beginNs = nowNs();
  r.endNs = 0;
  const std::string& scope = currentScope();
  r.op.assign(currentOpName());
  if (!scope.empty()) r.op.append(" in ").append(scope);
}

// The descriptor check (Note [Collective timeouts]): every rank of the group learns what the
// others are about to call; a difference is an error on every rank, naming the first two ranks
// that disagree.
void checkDescriptors(const Group& g, const Call& c, int64_t seq) {
  auto kindCode = [](std::string_view k) {
    int64_t h = 0;
    for (char ch : k) h = h * 31 + ch;
    return h;
  };
  const int64_t mine[5] = {seq, kindCode(c.kind), int64_t(c.dtype), c.count, c.extra};
  std::vector<int64_t> all(size_t(5 * g.size));
  const int rc = MPI_Allgather(mine, 5, MPI_INT64_T, all.data(), 5, MPI_INT64_T, g.comm);
  if (rc != MPI_SUCCESS)
    throw CollectiveError("descriptor check of " + describeCall(c, g, seq) +
                          " failed: " + mpiError(rc));
  for (int r = 0; r < g.size; ++r) {
    const int64_t* d = all.data() + 5 * r;
    if (std::equal(d, d + 5, mine)) continue;
    auto text = [&](const int64_t* x) {
      std::string k = x[1] == mine[1] ? std::string(c.kind) : "another collective";
      return k + " #" + std::to_string(x[0]) + " (" +
             std::string(dtypeName(DType(std::clamp<int64_t>(x[2], 0, kNumDTypes - 1)))) + " x " +
             std::to_string(x[3]) + (x[4] ? ", " + std::to_string(x[4]) : "") + ")";
    };
    throw CollectiveError("collective mismatch in group " + g.name + ": rank " +
                          std::to_string(g.rank) + " calls " + text(mine) + " where rank " +
                          std::to_string(r) + " calls " + text(d) +
                          (d[0] != mine[0] ? " (a rank skipped or added a collective)" : ""));
  }
}

// Runs one collective: numbers it, checks descriptors if asked, keeps it in the ring, tells the
// watchdog while it waits, and turns an MPI error into a CollectiveError.
template <typename F>
void runCollective(const Call& c, F&& mpiCall) {
  State& s = st();
  Group* g;
  int64_t seq;
  bool check;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    KEEL_CHECK(s.initialized || !launchedByMpi(), c.kind,
               ": the process group is not started (dist::init) although an MPI launcher "
               "started this process");
    g = &groupByName(s, c.group);
    seq = ++g->seq;
    ringPush(s, c, *g, seq);
    check = s.opt.checkDescriptors && g->size > 1;
  }
  if (check) checkDescriptors(*g, c, seq);
  {
    std::lock_guard<std::mutex> lk(s.mu);
    s.waiting = {nowNs(), g};
  }
  // No wake-up for the watchdog: it looks every 200 ms (a futex wake per collective cost more
  // than a 4 KiB all_reduce).
  const int rc = g->size > 1 ? mpiCall(*g) : MPI_SUCCESS;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    s.waiting = {};
    s.ring.newest().endNs = nowNs();  // only this thread pushes: the newest is this collective
  }
  if (rc != MPI_SUCCESS) {
    {
      std::lock_guard<std::mutex> lk(s.mu);
      s.collectiveFailed = true;
    }
    throw CollectiveError(describeCall(c, *g, seq) + " failed: " + mpiError(rc));
  }
}

std::string ringText(const State& s) {
  std::string out;
  s.ring.forEach([&](const CollectiveRecord& r) {
    out += "  " + r.kind + " #" + std::to_string(r.seq) + " of " + r.group + ", " +
           std::to_string(r.bytes) + " bytes, by op " + r.op;
    out += r.endNs ? ", " + std::to_string((r.endNs - r.beginNs) / 1000) + " us\n"
                   : ", still waiting\n";
  });
  return out;
}

// The watchdog (Note [Collective timeouts]).
void watchdogLoop() {
  State& s = st();
  std::unique_lock<std::mutex> lk(s.mu);
  while (!s.stopWatchdog) {
    s.wake.wait_for(lk, std::chrono::milliseconds(200));
    if (s.stopWatchdog || s.waiting.beginNs == 0) continue;
    const double waited = double(nowNs() - s.waiting.beginNs) * 1e-9;
    if (waited < s.opt.timeoutSeconds) continue;
    const CollectiveRecord& r = s.ring.newest();
    const std::string what = r.kind + " #" + std::to_string(r.seq) + " of group " +
                             s.waiting.group->name + " (" + std::to_string(s.waiting.group->size) +
                             " ranks), called by op " + r.op;
    const std::string line = "rank " + std::to_string(s.rank) + " (dp rank " +
                             std::to_string(s.groups[1].rank) + ", tp rank " +
                             std::to_string(s.groups[2].rank) + ") waited " +
                             std::to_string(int64_t(waited)) + " s in " + what +
                             ": a rank of the group never joined it (it died, hangs, or called "
                             "another collective; --check-collectives names it)";
    const std::string report = line + "\nlast collectives of rank " + std::to_string(s.rank) +
                               ", oldest first:\n" + ringText(s);
    auto handlers = s.handlers;
    lk.unlock();
    for (auto& [id, h] : handlers) {
      try {
        h(report);
      } catch (...) {  // a report that cannot be written must not keep the process alive
      }
    }
    std::fprintf(stderr, "keel: error: %s\n", line.c_str());
    std::fflush(stderr);
    // The other ranks' watchdogs write their reports too before the launcher ends them.
    std::this_thread::sleep_for(std::chrono::seconds(2));
    std::_Exit(2);
  }
}

}  // namespace

bool launchedByMpi() {
  return env("OMPI_COMM_WORLD_SIZE") || env("PMIX_RANK") || env("PMI_SIZE") || env("PMI_RANK");
}

int launcherWorldSize() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* v = env(name)) return std::max(1, std::atoi(v));
  return 1;
}

Layout resolveLayout(int dp, int tp, int world) {
  KEEL_CHECK(tp >= 1 && dp >= 0, "parallel layout: --tp must be >= 1 and --dp >= 1, got tp ", tp,
             " and dp ", dp);
  KEEL_CHECK(world % tp == 0, "parallel layout: --tp ", tp, " does not divide the ", world,
             world == 1 ? " process (start " + std::to_string(tp) + " ranks: mpirun -np " +
                              std::to_string(tp) + ", or keel launch -n " + std::to_string(tp) + ")"
                        : " ranks the launcher started");
  Layout l{dp == 0 ? world / tp : dp, tp};
  KEEL_CHECK(l.world() == world, "parallel layout: dp ", l.dp, " x tp ", l.tp, " = ", l.world(),
             l.world() == 1 ? " rank, but " : " ranks, but ", world,
             world == 1 ? " process was started (start it under mpirun -np N, or keel launch -n N)"
                        : " were started (mpirun -np)");
  return l;
}

void init(const Layout& layout) {
  State& s = st();
  std::lock_guard<std::mutex> lk(s.mu);
  KEEL_CHECK(layout.dp >= 1 && layout.tp >= 1, "parallel layout: --dp and --tp must be >= 1, got ",
             layout.dp, " and ", layout.tp);
  if (s.initialized) {
    KEEL_CHECK(s.layout.dp == layout.dp && s.layout.tp == layout.tp && s.layout.ep == layout.ep &&
                   s.layout.cp == layout.cp,
               "parallel layout: already started as dp ", s.layout.dp, " x tp ", s.layout.tp,
               ", asked for dp ", layout.dp, " x tp ", layout.tp);
    s.layout.zero = layout.zero;
    s.layout.vocab = layout.vocab;
    return;
  }
  KEEL_CHECK(layout.ep >= 1 && layout.dp % layout.ep == 0, "parallel layout: --ep ", layout.ep,
             " does not divide dp ", layout.dp,
             " (experts are placed on the data-parallel ranks: ep must divide dp)");
  KEEL_CHECK(layout.cp >= 1 && layout.dp % layout.cp == 0, "parallel layout: --cp ", layout.cp,
             " does not divide dp ", layout.dp,
             " (a row's sequence is split across data-parallel ranks: cp must divide dp)");
  for (size_t i = 0; i < std::size(kGroupNames); ++i) s.groups[i].name = kGroupNames[i];
  if (launchedByMpi()) {
    int provided = 0;
    int flag = 0;
    MPI_Initialized(&flag);
    if (!flag && MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      throw Error("MPI_Init failed: cannot start the process group");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &s.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &s.size);
    s.mpi = true;
    std::atexit(finalize);
  }
  KEEL_CHECK(layout.world() == s.size, "parallel layout: dp ", layout.dp, " x tp ", layout.tp,
             " = ", layout.world(), layout.world() == 1 ? " rank, but " : " ranks, but ", s.size,
             s.size == 1 ? " process was started (start it under mpirun -np N, or keel launch -n N)"
                         : " processes were started (mpirun -np)");
  s.layout = layout;
  if (s.mpi) {
    MPI_Comm_dup(MPI_COMM_WORLD, &s.groups[0].comm);
    MPI_Comm_split(MPI_COMM_WORLD, s.rank % layout.tp, s.rank, &s.groups[1].comm);  // dp
    MPI_Comm_split(MPI_COMM_WORLD, s.rank / layout.tp, s.rank, &s.groups[2].comm);  // tp
    // Note [Expert parallel groups]: dp rank d holds experts of ep rank d % ep; an ep group is ep
    // consecutive dp ranks (they exchange tokens), an edp group the dp ranks holding the same
    // experts (they average those experts' gradients).
    const int d = s.rank / layout.tp, t = s.rank % layout.tp;
    MPI_Comm_split(MPI_COMM_WORLD, (d / layout.ep) * layout.tp + t, s.rank, &s.groups[3].comm);
    MPI_Comm_split(MPI_COMM_WORLD, (d % layout.ep) * layout.tp + t, s.rank, &s.groups[4].comm);
    // A cp group: cp consecutive dp ranks, one row's sequence between them.
    MPI_Comm_split(MPI_COMM_WORLD, (d / layout.cp) * layout.tp + t, s.rank, &s.groups[5].comm);
    MPI_Comm_dup(MPI_COMM_WORLD, &s.exitComm);
    MPI_Comm_set_errhandler(s.exitComm, MPI_ERRORS_RETURN);
    for (Group& g : s.groups) {
      MPI_Comm_set_errhandler(g.comm, MPI_ERRORS_RETURN);
      MPI_Comm_rank(g.comm, &g.rank);
      MPI_Comm_size(g.comm, &g.size);
    }
    s.watchdog = std::thread(watchdogLoop);
  }
  s.initialized = true;
}

bool initialized() {
  std::lock_guard<std::mutex> lk(st().mu);
  return st().initialized;
}
int worldRank() {
  std::lock_guard<std::mutex> lk(st().mu);
  return st().rank;
}
int worldSize() {
  std::lock_guard<std::mutex> lk(st().mu);
  return st().size;
}
Layout layout() {
  std::lock_guard<std::mutex> lk(st().mu);
  return st().layout;
}

GroupInfo group(std::string_view name) {
  State& s = st();
  std::lock_guard<std::mutex> lk(s.mu);
  if (!s.initialized) {  // alone: every group is this one rank
    for (const char* known : kGroupNames)
      if (name == known) return {};
    throw Error(std::string("no process group '") + std::string(name) + "' (the groups are " +
                kGroupList + ")");
  }
  const Group& g = groupByName(s, name);
  return {g.rank, g.size};
}

std::string_view reduceOpName(ReduceOp op) {
  return op == ReduceOp::Sum ? "sum" : op == ReduceOp::Mean ? "mean" : "max";
}
ReduceOp parseReduceOp(std::string_view name) {
  if (name == "sum") return ReduceOp::Sum;
  if (name == "mean") return ReduceOp::Mean;
  if (name == "max") return ReduceOp::Max;
  throw Error("unknown reduction '" + std::string(name) + "' (expected sum, mean or max)");
}

void setOptions(const Options& o) {
  KEEL_CHECK(o.timeoutSeconds > 0, "collective timeout must be positive, got ", o.timeoutSeconds);
  std::lock_guard<std::mutex> lk(st().mu);
  st().opt = o;
}
Options options() {
  std::lock_guard<std::mutex> lk(st().mu);
  return st().opt;
}

std::vector<CollectiveRecord> recentCollectives() {
  std::lock_guard<std::mutex> lk(st().mu);
  std::vector<CollectiveRecord> out;
  st().ring.forEach([&](const CollectiveRecord& r) { out.push_back(r); });
  return out;
}

int64_t groupSeq(std::string_view name) {
  State& s = st();
  std::lock_guard<std::mutex> lk(s.mu);
  if (!s.initialized) {
    for (const Group& g : s.groups)
      if (g.name == name) return g.seq;
    return 0;
  }
  return groupByName(s, name).seq;
}

namespace {
// Collectives alone (before init, or a process started alone) still number themselves in these.
void ensureGroupNames() {
  State& s = st();
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.groups[0].name.empty())
    for (size_t i = 0; i < std::size(kGroupNames); ++i) s.groups[i].name = kGroupNames[i];
}

void copyIfApart(const void* in, void* out, size_t bytes) {
  if (in != out && bytes) std::memmove(out, in, bytes);
}

// MPI counts are int: a collective is split into pieces of at most this many elements.
constexpr int64_t kMaxPiece = int64_t(1) << 28;

void checkCount(const Call& c, int64_t n) {
  KEEL_CHECK(n <= INT32_MAX, c.kind, " of group ", c.group, ": ", n,
             " elements per rank is more than MPI's counts reach (2^31 - 1)");
}
}  // namespace

void allReduce(const Call& c, const void* in, void* out, ReduceOp op) {
  ensureGroupNames();
  const size_t es = dtypeSize(c.dtype);
  const MPI_Datatype t = mpiType(c.dtype);
  // Half types are reduced from `out` (below); the rest from `in` straight into `out` (no copy,
  // MPI_IN_PLACE only when they are one buffer); a group of one rank calls no MPI: a copy.
  if (t == MPI_DATATYPE_NULL || group(c.group).size == 1)
    copyIfApart(in, out, size_t(c.count) * es);
  runCollective(c, [&](Group& g) {
    if (t == MPI_DATATYPE_NULL) {
      // float16 / bfloat16: reduced in float32, rounded once.
      std::vector<float> f(size_t(c.count));
      for (int64_t i = 0; i < c.count; ++i)
        f[size_t(i)] = c.dtype == DType::Float16 ? float(static_cast<const Half*>(out)[i])
                                                 : float(static_cast<const BFloat16*>(out)[i]);
      for (int64_t at = 0; at < c.count; at += kMaxPiece) {
        const int n = int(std::min(kMaxPiece, c.count - at));
        const int rc =
            MPI_Allreduce(MPI_IN_PLACE, f.data() + at, n, MPI_FLOAT, mpiOp(op, c.dtype), g.comm);
        if (rc != MPI_SUCCESS) return rc;
      }
      if (op == ReduceOp::Mean) divideBy(f.data(), c.count, DType::Float32, g.size);
      for (int64_t i = 0; i < c.count; ++i)
        static_cast<uint16_t*>(out)[i] = c.dtype == DType::Float16
                                             ? Half::fromFloat(f[size_t(i)])
                                             : BFloat16::fromFloat(f[size_t(i)]);
      return int(MPI_SUCCESS);
    }
    auto* o = static_cast<uint8_t*>(out);
    const auto* i = static_cast<const uint8_t*>(in);
    for (int64_t at = 0; at < c.count; at += kMaxPiece) {
      const int n = int(std::min(kMaxPiece, c.count - at));
      const size_t off = size_t(at) * es;
      const int rc = MPI_Allreduce(in == out ? MPI_IN_PLACE : i + off, o + off, n, t,
                                   mpiOp(op, c.dtype), g.comm);
      if (rc != MPI_SUCCESS) return rc;
    }
    if (op == ReduceOp::Mean) divideBy(out, c.count, c.dtype, g.size);
    return int(MPI_SUCCESS);
  });
}

void allReduceInRankOrder(const Call& c, const void* in, void* out, ReduceOp op) {
  ensureGroupNames();
  const size_t es = dtypeSize(c.dtype);
  const size_t bytes = size_t(c.count) * es;
  std::vector<uint8_t> all;
  int size = 1;
  runCollective(c, [&](Group& g) {
    checkCount(c, int64_t(bytes));
    size = g.size;
    all.resize(bytes * size_t(g.size));
    return MPI_Allgather(in, int(bytes), MPI_BYTE, all.data(), int(bytes), MPI_BYTE, g.comm);
  });
  if (size == 1) {
    copyIfApart(in, out, bytes);
    return;
  }
  // In float64, rank 0 first, rounded once: the same bits on every rank.
  visitDType(c.dtype, [&]<typename T>() {
    const T* parts = reinterpret_cast<const T*>(all.data());
    T* o = static_cast<T*>(out);
    for (int64_t i = 0; i < c.count; ++i) {
      double a = double(parts[i]);
      for (int r = 1; r < size; ++r) {
        const double v = double(parts[size_t(r) * size_t(c.count) + size_t(i)]);
        a = op == ReduceOp::Max ? (v > a || std::isnan(v) ? v : a) : a + v;
      }
      if (op == ReduceOp::Mean) a /= double(size);
      if constexpr (std::is_same_v<T, bool>)
        o[i] = a != 0;
      else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
        o[i] = T(float(a));  // float64, then float32, then the 16-bit type
      else
        o[i] = T(a);
    }
  });
}

void allGather(const Call& c, const void* in, void* out) {
  ensureGroupNames();
  const size_t bytes = size_t(c.count) * dtypeSize(c.dtype);
  int size = 1;
  runCollective(c, [&](Group& g) {
    checkCount(c, int64_t(bytes));
    size = g.size;
    return MPI_Allgather(in, int(bytes), MPI_BYTE, out, int(bytes), MPI_BYTE, g.comm);
  });
  if (size == 1) copyIfApart(in, out, bytes);
}

void reduceScatter(const Call& c, const void* in, void* out, ReduceOp op) {
  ensureGroupNames();
  const size_t es = dtypeSize(c.dtype);
  int size = 1;
  runCollective(c, [&](Group& g) {
    size = g.size;
    const int64_t block = c.count / g.size;
    checkCount(c, block);
    MPI_Datatype t = mpiType(c.dtype);
    KEEL_CHECK(t != MPI_DATATYPE_NULL, "reduce_scatter of ", dtypeName(c.dtype),
               " is not supported (float32, float64, int32, int64, bool)");
    const int rc = MPI_Reduce_scatter_block(in, out, int(block), t, mpiOp(op, c.dtype), g.comm);
    if (rc == MPI_SUCCESS && op == ReduceOp::Mean) divideBy(out, block, c.dtype, g.size);
    return rc;
  });
  if (size == 1) copyIfApart(in, out, size_t(c.count) * es);
}

void broadcast(const Call& c, void* data, int root) {
  ensureGroupNames();
  const size_t bytes = size_t(c.count) * dtypeSize(c.dtype);
  runCollective(c, [&](Group& g) {
    checkCount(c, int64_t(bytes));
    KEEL_CHECK(root >= 0 && root < g.size, "broadcast of group ", g.name, ": root ", root,
               " is not a rank of its ", g.size);
    return MPI_Bcast(data, int(bytes), MPI_BYTE, root, g.comm);
  });
}

void allToAll(const Call& c, const void* in, void* out) {
  ensureGroupNames();
  const size_t es = dtypeSize(c.dtype);
  int size = 1;
  runCollective(c, [&](Group& g) {
    size = g.size;
    const int64_t blockBytes = c.count / g.size * int64_t(es);
    checkCount(c, blockBytes);
    return MPI_Alltoall(in, int(blockBytes), MPI_BYTE, out, int(blockBytes), MPI_BYTE, g.comm);
  });
  if (size == 1) copyIfApart(in, out, size_t(c.count) * es);
}

int addHangHandler(HangHandler h) {
  std::lock_guard<std::mutex> lk(st().mu);
  const int id = st().nextHandler++;
  st().handlers.emplace_back(id, std::move(h));
  return id;
}

void removeHangHandler(int id) {
  std::lock_guard<std::mutex> lk(st().mu);
  auto& hs = st().handlers;
  hs.erase(std::remove_if(hs.begin(), hs.end(), [&](const auto& p) { return p.first == id; }),
           hs.end());
}

void setExitStatus(int status) {
  std::lock_guard<std::mutex> lk(st().mu);
  st().exitStatus = status;
}

// Note [A failed collective ends the job]: after an MPI error in a collective (a rank that
// skipped one sent a message of another size: MPI_ERR_TRUNCATE) the peers may wait in their
// collective until their timeout (600 s by default), and MPI_Finalize, which waits for every
// rank, would keep this process there with them: the job hung with one rank spinning. A process
// whose collective failed leaves without MPI_Finalize instead, its error printed and its
// recording closed, and the launcher ends the others at once, as after a hang report.
//
// Note [A failed rank ends the job]: the same holds for a rank that leaves for any other reason
// than a finished run — an op that failed, a --break-on stop, any error (setExitStatus, non-zero):
// its peers may be waiting for it in their next collective, and it waited for them in
// MPI_Finalize, the job ending only at the collective timeout. Such a rank's recording is closed
// by then (finalize runs at exit); it waits kExitGraceSeconds in a barrier every rank enters at
// exit — all the ranks leave together when each stops (a step break, an error of the setup,
// Ctrl-C), and then MPI_Finalize as usual — and past that leaves without MPI_Finalize: the
// launcher sees its status and ends the ranks still waiting (mpirun's exit status is the first
// failed rank's). A rank that finished waits in the barrier without a bound, as it would in
// MPI_Finalize.
void finalize() {
  State& s = st();
  bool failed = false;
  int status = 0;
  double grace = 0;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    if (!s.mpi || s.finalized) return;
    s.finalized = true;
    s.stopWatchdog = true;
    failed = s.collectiveFailed;
    status = s.exitStatus;
    grace = std::min(kExitGraceSeconds, s.opt.timeoutSeconds);
  }
  s.wake.notify_all();
  if (s.watchdog.joinable()) s.watchdog.join();
  if (failed) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (s.exitComm != MPI_COMM_NULL) {
    MPI_Request req = MPI_REQUEST_NULL;
    if (MPI_Ibarrier(s.exitComm, &req) != MPI_SUCCESS) return;
    if (status == 0) {
      MPI_Wait(&req, MPI_STATUS_IGNORE);
    } else {
      const int64_t until = nowNs() + int64_t(grace * 1e9);
      int done = 0;
      while (MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done && nowNs() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (!done) return;  // a peer is still in the run: the launcher ends it
    }
  }
  MPI_Finalize();
}

}  // namespace keel::dist
