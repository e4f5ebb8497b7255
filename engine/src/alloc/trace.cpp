// Allocation traces: recording from the engine, the MoE generator and replay (the text format is
// trace_text.cpp). Invariant: a parsed or generated trace is well formed (every free names a live
// block, no id is live twice), so replay never frees a pointer it did not allocate.
#include "keel/alloc_trace.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include "keel/base/text.h"
#include "keel/error.h"

namespace keel {

// ---- recording from the engine -----------------------------------------------------------------

struct AllocTraceRecorder::State : Observer {
  std::mutex mu;
  AllocTrace trace;
  std::unordered_set<uint64_t> live;
  std::shared_ptr<Observer> self;
  void onMemory(const MemEvent& e) override {
    if (!e.bufferId || (e.kind != MemEventKind::Alloc && e.kind != MemEventKind::Free)) return;
    std::lock_guard<std::mutex> lk(mu);
    if (e.kind == MemEventKind::Alloc) {
      live.insert(e.bufferId);
      trace.events.push_back({TraceEvent::Alloc, e.bufferId, e.bytes});
    } else if (live.erase(e.bufferId)) {  // frees of buffers made before recording are skipped
      trace.events.push_back({TraceEvent::Free, e.bufferId, 0});
    }
  }
};

AllocTraceRecorder::AllocTraceRecorder() : state_(std::make_shared<State>()) {
  state_->self = std::shared_ptr<Observer>(state_, state_.get());
  addObserver(state_->self);
}
AllocTraceRecorder::~AllocTraceRecorder() {
  finish();
}
void AllocTraceRecorder::markStep(int64_t step) {
  std::lock_guard<std::mutex> lk(state_->mu);
  state_->trace.events.push_back({TraceEvent::Step, uint64_t(step), 0});
}
AllocTrace AllocTraceRecorder::finish() {
  std::shared_ptr<Observer> self;
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    self = std::move(state_->self);
  }
  if (self) removeObserver(self);
  std::lock_guard<std::mutex> lk(state_->mu);
  return state_->trace;
}

// ---- the MoE generator ------------------------------------------------------------------------

namespace {
class TraceBuilder {
 public:
  explicit TraceBuilder(AllocTrace& t) : t_(t) {}
  uint64_t alloc(int64_t elems) {
    uint64_t id = next_++;
    const uint64_t bytes = uint64_t(std::max<int64_t>(elems, 1)) * 4;
    // A block the trace format cannot hold would be written and then refused by every reader.
    KEEL_CHECK(bytes <= kMaxTraceBlock, "MoE trace: these options make a block of ", bytes,
               " bytes, past a trace block's limit of 2^44 (16 TiB): choose fewer --tokens, a "
               "smaller --d-model or --d-ff");
    t_.events.push_back({TraceEvent::Alloc, id, bytes});
    return id;
  }
  void free(uint64_t id) { t_.events.push_back({TraceEvent::Free, id, 0}); }
  void freeAll(std::vector<uint64_t>& ids) {
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) free(*it);
    ids.clear();
  }
  void step(int s) { t_.events.push_back({TraceEvent::Step, uint64_t(s), 0}); }

 private:
  AllocTrace& t_;
  uint64_t next_ = 1;
};

// Tokens routed to each expert: topK draws per token from a Zipf law over a fresh permutation.
std::vector<int64_t> route(const MoeTraceOptions& o, std::mt19937_64& rng) {
  std::vector<double> w(size_t(o.experts));
  for (int e = 0; e < o.experts; ++e) w[size_t(e)] = 1.0 / std::pow(double(e + 1), o.skew);
  std::shuffle(w.begin(), w.end(), rng);
  std::discrete_distribution<int> pick(w.begin(), w.end());
  std::vector<int64_t> n(size_t(o.experts), 0);
  for (int64_t i = 0; i < o.tokens * o.topK; ++i) n[size_t(pick(rng))]++;
  return n;
}
}  // namespace

AllocTrace generateMoeTrace(const MoeTraceOptions& o) {
  KEEL_CHECK(o.layers > 0 && o.experts > 0 && o.topK > 0 && o.topK <= o.experts && o.tokens > 0 &&
                 o.dModel > 0 && o.dFf > 0 && o.steps > 0 && o.skew >= 0,
             "MoE trace: layers, experts, tokens, d_model, d_ff and steps must be positive and "
             "top_k in 1..experts");
  AllocTrace t;
  TraceBuilder b(t);
  std::mt19937_64 rng(o.seed);
  const int64_t T = o.tokens, D = o.dModel, F = o.dFf, E = o.experts;
  // Parameters: attention (4 D x D), router (D x E), per expert gate/up/down (D x F each).
  std::vector<int64_t> paramElems;
  for (int l = 0; l < o.layers; ++l) {
    for (int i = 0; i < 4; ++i) paramElems.push_back(D * D);
    paramElems.push_back(D * E);
    for (int64_t e = 0; e < E * 3; ++e) paramElems.push_back(D * F);
  }
  for (int64_t n : paramElems) b.alloc(n);  // live for the whole run
  std::vector<uint64_t> grads, optState;
  // A bound on what is held (24 bytes an event, twice that while the vector grows): --moe-steps
  // 100000 of the defaults would have taken about 36 GB before anything was written. Checked from
  // the first step's count, so a trace too large is refused at once.
  constexpr size_t kMaxGeneratedEvents = 20'000'000;
  const size_t before = t.events.size();
  for (int s = 1; s <= o.steps; ++s) {
    if (s == 2) {
      const size_t perStep = t.events.size() - before;
      const size_t projected = before + perStep * size_t(o.steps);
      KEEL_CHECK(projected <= kMaxGeneratedEvents, "MoE trace: ", o.steps, " steps of ", perStep,
                 " events each would hold about ", projected, " events, more than the ",
                 kMaxGeneratedEvents, " a generated trace may (about ",
                 formatBytes(kMaxGeneratedEvents * 2 * sizeof(TraceEvent)),
                 " of memory): fewer --moe-steps, --layers or --experts");
    }
    b.step(s);
    b.freeAll(grads);  // zero_grad(set_to_none)
    std::vector<std::vector<uint64_t>> saved(size_t(o.layers));
    std::vector<std::vector<int64_t>> routed(size_t(o.layers));
    for (int l = 0; l < o.layers; ++l) {  // forward
      auto& sv = saved[size_t(l)];
      sv.push_back(b.alloc(T * D));      // norm output
      sv.push_back(b.alloc(T * 3 * D));  // qkv
      sv.push_back(b.alloc(T * D));      // attention output
      sv.push_back(b.alloc(T * D));      // projection + residual
      sv.push_back(b.alloc(T * E));      // router probabilities
      routed[size_t(l)] = route(o, rng);
      std::vector<uint64_t> outs;
      for (int64_t e = 0; e < E; ++e) {
        int64_t n = routed[size_t(l)][size_t(e)];
        if (!n) continue;
        sv.push_back(b.alloc(n * D));  // gathered tokens
        sv.push_back(b.alloc(n * F));  // gate
        sv.push_back(b.alloc(n * F));  // up
        sv.push_back(b.alloc(n * F));  // activation
        outs.push_back(b.alloc(n * D));
      }
      sv.push_back(b.alloc(T * D));  // combined output
      b.freeAll(outs);               // scattered into the combined output
    }
    for (int l = o.layers - 1; l >= 0; --l) {  // backward
      std::vector<uint64_t> tmp;
      uint64_t gOut = b.alloc(T * D);
      for (int64_t e = 0; e < E; ++e) {
        int64_t n = routed[size_t(l)][size_t(e)];
        if (!n) continue;
        tmp.push_back(b.alloc(n * D));  // grad of the expert output
        tmp.push_back(b.alloc(n * F));  // grad of the activation
        tmp.push_back(b.alloc(n * F));  // grad of gate
        tmp.push_back(b.alloc(n * F));  // grad of up
        tmp.push_back(b.alloc(n * D));  // grad of the gathered tokens
        b.freeAll(tmp);
      }
      for (int i = 0; i < 3; ++i) tmp.push_back(b.alloc(T * D));  // attention grads
      tmp.push_back(b.alloc(T * 3 * D));
      b.freeAll(tmp);
      b.free(gOut);
      b.freeAll(saved[size_t(l)]);
    }
    for (int64_t n : paramElems) grads.push_back(b.alloc(n));  // .grad of every parameter
    if (optState.empty())
      for (int64_t n : paramElems)
        for (int m = 0; m < 2; ++m) optState.push_back(b.alloc(n));  // AdamW moments
  }
  return t;
}

// ---- replay -------------------------------------------------------------------------------------

namespace {
// CPU time of the calling thread (user + system): unlike wall time, it does not count the time
// the thread waited for a core on a shared machine.
double threadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e9 + double(ts.tv_nsec);
}
}  // namespace

ReplayResult replayAllocTrace(const AllocTrace& t, Allocator& a) {
  std::unordered_map<uint64_t, std::pair<void*, uint64_t>> live;
  live.reserve(t.events.size() / 2 + 1);
  ReplayResult r;
  r.allocator = a.name();
  a.resetPeaks();
  auto freeLive = [&] {
    for (auto& [id, pb] : live) a.deallocate(pb.first, pb.second);
    live.clear();
  };
  const double t0 = threadCpuNs();
  try {
    for (const auto& e : t.events) {
      if (e.kind == TraceEvent::Alloc) {
        live[e.id] = {a.allocate(e.bytes), e.bytes};
        r.calls++;
      } else if (e.kind == TraceEvent::Free) {
        auto it = live.find(e.id);
        KEEL_CHECK(it != live.end(), "allocation trace frees block ", e.id, ", which is not live");
        a.deallocate(it->second.first, it->second.second);
        live.erase(it);
        r.calls++;
      }
    }
  } catch (...) {
    freeLive();
    throw;
  }
  const double ns = threadCpuNs() - t0;
  r.nsPerCall = r.calls ? ns / double(r.calls) : 0;
  r.stats = a.stats();
  freeLive();
  return r;
}

}  // namespace keel
