// The capture observer and its writer thread. Engine-side callbacks read tensors (hash, stats,
// dump copies) while they are valid, build records and push them on the RecordQueue; the writer
// thread symbolizes stacks, compresses dumps and calls storage::Writer, committing in batches.
#include "keel/capture/recorder.h"

#include <pthread.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <thread>
#include <unordered_map>

#include "keel/allocator.h"
#include "keel/buffer.h"
#include "keel/capture/hash.h"
#include "keel/capture/hash_pool.h"
#include "keel/dispatch.h"
#include "keel/error.h"
#include "keel/observer.h"
#include "keel/registry.h"
#include "keel/runtime.h"
#include "queue.h"
#include "stacks.h"

namespace keel::capture {
namespace detail {

// Note [Hashing off the engine thread]: an op's callback does not read its tensors' bytes. For
// each tensor whose MD5 or statistics are wanted it looks the content up (ContentKey: buffer,
// version, offset, dtype, count, walk) and, the first time, queues a HashJob that holds the
// tensor — and so its buffer — on the HashPool; the op record goes to the writer's queue with a
// HashFill per tensor. The pool's thread hashes queued jobs in batches (multi-buffer MD5 with
// the statistics fused into the same pass, Note [Multi-buffer MD5]); the writer waits for (or
// itself hashes) an op's jobs before it writes the op, so records keep their order. The MD5 of
// a job is a midstate after the elements: the writer finishes it with each tensor's trailer, so
// a reshape and its input still share one pass over the bytes. What the bytes are when hashed
// must be what the op produced:
// - a buffer about to be written (a mutating op's inputs, a host copy into a tensor, a
//   checkpoint load) is settled first: Observer::onBufferWrite waits for its jobs, hashing them
//   on the engine thread if no thread has taken them yet;
// - an allocator that moves live buffers (VMM compaction) waits for the hashing in flight
//   (Note [Reading buffers off the engine thread]);
// - a held buffer is not freed: a tensor the engine dropped lives on until it is hashed, at
//   most hashBacklogBytes of them; while allocator events are recorded the jobs hold host
//   buffers weakly instead, and a buffer freed before it is hashed has its elements copied
//   (Note [Weakly held buffers], hash_pool.cpp), so the events show the program's frees.
// Past that backlog the engine hashes queued jobs itself (drop policy block) or records tensors
// without checksums and counts them in the recording's dropped table as "hash" (drop).
// hashThread = false keeps the older path: hashed in the callback, on the engine's thread.

namespace {

std::atomic<int64_t> g_nextThreadId{1};
int64_t smallThreadId() {
  thread_local int64_t id = g_nextThreadId.fetch_add(1);
  return id;
}

// What a tensor's checksums and statistics depend on: the buffer (at a version), where the
// elements start, their dtype and count, and for a non-contiguous view the walk (shape, strides).
// A reshape of a contiguous tensor has the same key as its input, so its elements are read once
// and only the MD5 trailer (shape) differs.
struct ContentKey {
  uint64_t bufferId = 0, version = 0;
  int64_t offset = 0, numel = 0;
  DType dtype = DType::Float32;
  Shape shape, strides;  // empty when contiguous
  bool operator==(const ContentKey&) const = default;
};
struct ContentKeyHash {
  size_t operator()(const ContentKey& k) const noexcept {
    uint64_t h = k.bufferId * 0x9e3779b97f4a7c15ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 0x100000001b3ull; };
    mix(k.version);
    mix(uint64_t(k.offset));
    mix(uint64_t(k.numel));
    mix(uint64_t(k.dtype));
    for (int64_t d : k.shape) mix(uint64_t(d));
    for (int64_t d : k.strides) mix(uint64_t(d));
    return size_t(h);
  }
};
// The engine-thread path (hashThread false).
struct HashEntry {
  Md5Stream md5, md5Rounded;
  bool hasStats = false;
  storage::TensorStats stats;
};
constexpr size_t kHashCacheMax = 8192;

// Frames above the code that called the op: captureStack's caller (CaptureObserver::onOpBegin or
// onMemory), notifyOpBegin/notifyMemory, ... The symbolizer drops the rest by name.
constexpr int kSkipFrames = 1;

}  // namespace

// The Observer itself; Recorder is its RAII handle (the observer list holds a shared_ptr).
class CaptureObserver : public Observer, public std::enable_shared_from_this<CaptureObserver> {
 public:
  CaptureObserver(std::unique_ptr<storage::Writer> writer, CaptureOptions opt)
      : opt_(std::move(opt)), writer_(std::move(writer)), queue_(size_t(opt_.queueCapacity)) {
    if (opt_.hashThread && (opt_.md5 || opt_.roundedMd5 > 0 || opt_.stats))
      pool_ = std::make_unique<HashPool>(opt_.hashBacklogBytes, int(opt_.hashLanes));
    thread_ = std::thread([this] { writerLoop(); });
  }
  ~CaptureObserver() override { stop(); }

  // ---- engine side ----
  // Outside the filter's step range the observer pauses (Note [Paused observers]): the engine then
  // pays for it what it pays for no observer. Checked at each step's start, and at the start.
  void followStepRange(int64_t step, int64_t timeNs = 0) {
    const bool pause = !opt_.filter.matchesStep(step);
    if (pause == paused_) return;
    // Nothing may still read a buffer once writes stop being announced: settle every hash first.
    if (pause && pool_) pool_->drain();
    // Before events flow again, so none is missed between the snapshot and them.
    if (!pause && opt_.allocator) recordLiveMemory(step, timeNs);
    paused_ = pause;
    setObserverPaused(shared_from_this(), pause);
  }

  // Note [A step range's first step]: a recording that starts at a step range's first step would
  // begin with frees of blocks it never saw allocated, chunks it never saw mapped, and no
  // parameters or optimizer state at all: reserved, free-block and fragmentation figures would
  // count only what came after. So at that step, before anything else, the state of each host
  // allocator is written as events, as if replayed from nothing: a caching allocator's segments
  // as reserve events, a VMM's chunks as map (and the holes below its highest mapped chunk as
  // unmap) events, then every live block as an alloc event with its buffer and tag, each labelled
  // kLiveBefore (no op: the ops that allocated them are not in the file). Replaying the file then
  // gives the allocator's true figures from the range's first step on. The plain host allocator
  // keeps no segments or block list, so it writes nothing.
  void recordLiveMemory(int64_t step, int64_t timeNs) {
    const std::string device = Device().name();
    for (const MemorySnapshot& snap : hostAllocatorSnapshots()) {
      uint64_t allocated = 0, reserved = 0;
      auto event = [&](MemEventKind kind, uint64_t address, uint64_t bytes) {
        storage::MemRecord m;
        m.kind = kind;
        m.device = device;
        m.address = address;
        m.bytes = bytes;
        m.step = step;
        m.timeNs = timeNs;
        m.allocatedAfter = allocated;
        m.reservedAfter = reserved;
        m.label = storage::kLiveBefore;
        return m;
      };
      for (const SegmentInfo& g : snap.segments) {
        if (snap.chunk == 0) {  // a caching allocator's segment
          reserved += g.size;
          push(event(MemEventKind::Reserve, g.address, g.size), false, nullptr);
          continue;
        }
        for (uint64_t a = g.address; a < g.address + g.size; a += snap.chunk) {  // vmm chunks
          if (g.mapped) reserved += snap.chunk;
          push(event(g.mapped ? MemEventKind::Map : MemEventKind::Unmap, a, snap.chunk), false,
               nullptr);
        }
      }
      for (const BlockInfo& b : snap.blocks) {
        if (b.state != BlockState::Allocated) continue;
        allocated += b.size;
        storage::MemRecord m = event(MemEventKind::Alloc, b.address, b.size);
        m.bufferId = b.bufferId;
        m.tag = b.tag;
        push(std::move(m), false, nullptr);
      }
    }
  }

  // Recorder::beforeStep.
  void beforeStep(int64_t step) {
    if (!active()) return;
    followStepRange(step, keel::detail::nowNs());
    std::lock_guard<std::mutex> lk(mu_);
    step_ = step;
  }

  void onStep(const StepEvent& e) override {
    if (!active()) return;
    if (e.begin) followStepRange(e.step, e.timeNs);
    storage::StepRecord r;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (e.begin) {
        step_ = e.step;
        stepBeginNs_ = e.timeNs;
      }
      r.step = e.step;
      r.beginNs = stepBeginNs_;
    }
    if (!e.begin) {
      r.endNs = e.timeNs;
      r.loss = e.loss;
      r.lr = e.lr;
      r.gradNorm = e.gradNorm;
      r.tokensPerSec = e.tokensPerSec;
      r.auxLoss = e.auxLoss;
      r.valLoss = e.valLoss;
      r.nanMetrics = e.nanMetrics;  // Note [Reported NaN]
    }
    const bool ended = !e.begin;
    push(std::move(r), false, nullptr, /*urgent=*/ended);  // a step end is committed at once
  }

  void onOpBegin(const OpEvent& e) override {
    if (throwPending_.exchange(false)) throw Error("capture: recording failed: " + error());
    if (!active() || !opt_.graph) return;
    const bool mutates = e.op->mutatesInputs;
    if (!opt_.stacks && !mutates) return;
    int64_t step;
    {
      std::lock_guard<std::mutex> lk(mu_);
      step = step_;
    }
    if (!opt_.filter.matches(e.op->name, e.scope, step)) return;
    Pending p;
    if (opt_.stacks) p.stackId = stackId(kSkipFrames + 1);
    // Mutating (optimizer-style) ops write their inputs: record them as read, before the write
    // (the dispatcher's onBufferWrite settles their hashing before the kernel runs).
    if (mutates)
      for (size_t i = 0; i < e.inputs.size(); ++i)
        addTensor(p.inputs, p.fills, e.inputs[i], storage::Role::Input, int32_t(i));
    std::lock_guard<std::mutex> lk(mu_);
    pending_[e.seq] = std::move(p);
  }

  void onOpEnd(const OpEvent& e) override {
    if (!active() || !opt_.graph) return;
    Pending p;
    const int64_t step = takePending(e.seq, p);
    if (!opt_.filter.matches(e.op->name, e.scope, step)) return;
    OpItem item{opRecord(e, step, p.stackId), {}};
    auto& tensors = item.rec.tensors;
    const bool mutates = e.op->mutatesInputs;
    tensors.reserve(e.inputs.size() + e.outputs.size());
    if (mutates) {
      tensors = std::move(p.inputs);
      item.fills = std::move(p.fills);
      // The written inputs, at their new version, are this op's outputs (see docs/capture.md).
      for (size_t i = 0; i < e.inputs.size(); ++i)
        addTensor(tensors, item.fills, e.inputs[i], storage::Role::Output, int32_t(i));
    } else {
      for (size_t i = 0; i < e.inputs.size(); ++i)
        addTensor(tensors, item.fills, e.inputs[i], storage::Role::Input, int32_t(i));
    }
    for (size_t i = 0; i < e.outputs.size(); ++i)
      addTensor(tensors, item.fills, e.outputs[i], storage::Role::Output, int32_t(i));
    if (opt_.dumps && opt_.dumpFilter.matches(e.op->name, e.scope, step)) {
      for (size_t i = 0; i < e.outputs.size(); ++i) {
        if (!e.outputs[i].defined()) continue;
        const Tensor t = hostCopy(e.outputs[i]);  // a device tensor's values, read back
        storage::DumpRecord d;
        d.opSeq = e.seq;
        d.role = storage::Role::Output;
        d.index = int32_t(i);
        d.dtype = std::string(dtypeName(t.dtype()));
        d.shape = t.shape();
        d.codec = "raw";  // compressed on the writer thread
        d.data = contiguousBytes(t);
        d.rawBytes = int64_t(d.data.size());
        push(std::move(d), opt_.dropPolicy == DropPolicy::Drop, &droppedDumps_);
      }
    }
    push(std::move(item), opt_.dropPolicy == DropPolicy::Drop, &droppedOps_);
  }

  // A failing op: recorded with its inputs (no outputs) and its stack, plus an Error log line
  // carrying the message, so the recording shows where the run failed.
  void onOpError(const OpEvent& e, std::string_view message) override {
    if (!active() || !opt_.graph) return;
    Pending p;
    const int64_t step = takePending(e.seq, p);
    OpItem item{
        opRecord(e, step, p.stackId >= 0 || !opt_.stacks ? p.stackId : stackId(kSkipFrames + 1)),
        {}};
    for (size_t i = 0; i < e.inputs.size(); ++i)
      addTensor(item.rec.tensors, item.fills, e.inputs[i], storage::Role::Input, int32_t(i));
    push(std::move(item), false, nullptr);
    storage::LogRecord l;
    l.step = step;
    l.opSeq = e.seq;
    l.level = storage::LogLevel::Error;
    l.scope = std::string(e.scope);
    l.message = "op " + e.op->name + " failed: " + std::string(message);
    l.timeNs = e.endNs;
    push(std::move(l), false, nullptr, /*urgent=*/true);
  }

  void onMemory(const MemEvent& e) override {
    if (!active() || !opt_.allocator) return;
    storage::MemRecord m;
    m.kind = e.kind;
    m.device = e.device.name();
    m.address = e.address;
    m.bytes = e.bytes;
    m.toAddress = e.toAddress;
    m.opSeq = e.opSeq;
    m.timeNs = e.timeNs;
    m.allocatedAfter = e.allocatedAfter;
    m.reservedAfter = e.reservedAfter;
    m.bufferId = e.bufferId;
    m.tag = e.tag;
    m.label = std::string(e.label);
    {
      std::lock_guard<std::mutex> lk(mu_);
      m.step = step_;
      if (opt_.stacks && e.opSeq) {
        auto it = pending_.find(e.opSeq);
        if (it != pending_.end()) m.stackId = it->second.stackId;
      }
    }
    if (!opt_.filter.matchesStep(m.step)) return;
    // A buffer the hashing thread let go of is freed there: its stack would show the capture,
    // not the program (the event's time says when the capture let go).
    if (opt_.stacks && m.stackId < 0 && !onCaptureThread()) m.stackId = stackId(kSkipFrames + 1);
    push(std::move(m), opt_.dropPolicy == DropPolicy::Drop, &droppedMems_);
  }

  void onLog(const LogEvent& e) override {
    if (!active() || !opt_.logs) return;
    storage::LogRecord l;
    {
      std::lock_guard<std::mutex> lk(mu_);
      l.step = step_;
    }
    if (!opt_.filter.matchesStep(l.step)) return;
    l.opSeq = e.opSeq;
    l.level = storage::LogLevel(uint8_t(e.level));
    l.scope = std::string(e.scope);
    l.message = std::string(e.message);
    l.timeNs = e.timeNs;
    push(std::move(l), opt_.dropPolicy == DropPolicy::Drop, &droppedLogs_);
  }

  void onBufferWrite(const Buffer& b) override {
    if (pool_) pool_->settle(b.id(), &b);  // See Note [Hashing off the engine thread]
  }

  // ---- control ----
  // Returns once every queued hash is done (Recorder::finish).
  void settleHashes() {
    if (pool_) pool_->drain();
  }

  void stop(const std::string& runStatus = "finished") noexcept {
    std::lock_guard<std::mutex> lk(stopMu_);
    if (stopped_) return;
    stopped_ = true;
    closed_.store(true);
    queue_.close();
    if (thread_.joinable()) thread_.join();
    flushCv_.notify_all();       // flush() waiters see closed_
    if (failed_.load()) return;  // the writer thread already marked the run failed
    try {
      flushDropped();
      writer_->setRunStatus(runStatus);
      writer_->close();
      status_.store(RecorderStatus::Finished);
    } catch (const std::exception& ex) {
      fail(exceptionText(ex));
    } catch (...) {
      fail("unknown error");
    }
  }

  void flush() {
    if (!active()) return;
    int64_t id;
    {
      std::lock_guard<std::mutex> lk(flushMu_);
      id = ++flushRequested_;
    }
    push(FlushMarker{id}, false, nullptr, /*urgent=*/true);
    std::unique_lock<std::mutex> lk(flushMu_);
    flushCv_.wait(lk, [&] { return flushDone_ >= id || failed_.load() || closed_.load(); });
  }

  RecorderStatus status() const { return status_.load(); }
  std::string error() const {
    std::lock_guard<std::mutex> lk(errMu_);
    return error_;
  }
  RecorderCounts counts() const {
    RecorderCounts c;
    c.ops = written_[0].load();
    c.steps = written_[1].load();
    c.stacks = written_[2].load();
    c.logs = written_[3].load();
    c.mems = written_[4].load();
    c.dumps = written_[5].load();
    c.droppedOps = droppedOps_.load();
    c.droppedLogs = droppedLogs_.load();
    c.droppedMems = droppedMems_.load();
    c.droppedDumps = droppedDumps_.load();
    c.droppedHashes = droppedHashes_.load();
    if (pool_) {
      const HashPoolCounts h = pool_->counts();
      c.hashedTensors = h.jobs;
      c.hashedBytes = h.bytes;
      c.hashedByEngine = h.helpedJobs;
      c.hashedByWriter = h.writerJobs;
      c.peakHashBacklogBytes = h.peakBacklogBytes;
      c.copiedBeforeWrite = h.snapshots;
    }
    return c;
  }
  const CaptureOptions& options() const { return opt_; }

 private:
  struct Pending {
    int64_t stackId = -1;
    std::vector<storage::TensorRecord> inputs;  // mutating ops: inputs as read at begin
    std::vector<HashFill> fills;                // ... and their checksums to come
  };

  // Moves op `seq`'s pending part into p (left empty when onOpBegin kept none) and returns the
  // current step, both under one lock.
  int64_t takePending(uint64_t seq, Pending& p) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = pending_.find(seq);
    if (it != pending_.end()) {
      p = std::move(it->second);
      pending_.erase(it);
    }
    return step_;
  }

  bool active() const { return !closed_.load(std::memory_order_relaxed); }

  // The op's own fields (tensors are added by the caller).
  static storage::OpRecord opRecord(const OpEvent& e, int64_t step, int64_t stackId) {
    storage::OpRecord r;
    r.seq = e.seq;
    r.step = step;
    r.phase = e.phase;
    r.name = e.op->name;
    if (e.attrs && !e.attrs->items().empty()) r.attrsJson = e.attrs->toString();
    r.scope = std::string(e.scope);
    r.thread = smallThreadId();
    r.beginNs = e.beginNs;
    r.endNs = e.endNs;
    r.forwardSeq = e.forwardSeq;
    r.stackId = stackId;
    if (e.kernel) {  // See Note [Kernel identity]
      r.kernel.backend = std::string(backendName(e.kernel->backend));
      r.kernel.variant = std::string(e.kernel->variant);
      r.kernel.params = std::string(e.kernel->params);
    }
    return r;
  }

  void push(Item&& item, bool dropIfFull, std::atomic<int64_t>* dropCounter, bool urgent = false) {
    if (!queue_.push(std::move(item), dropIfFull, urgent) && dropIfFull && dropCounter && active())
      dropCounter->fetch_add(1);
  }

  int64_t stackId(int skip) {
    thread_local RawStack raw;
    captureStack(raw, skip + 1);
    bool isNew = false;
    int64_t id;
    {
      std::lock_guard<std::mutex> lk(mu_);
      id = stacks_.intern(raw, isNew);
    }
    if (isNew) push(RawStackItem{id, raw}, false, nullptr);  // never dropped: ops refer to it
    return id;
  }

  // The Buffer's process-wide id: the same number allocator events carry (memory view joins).
  static uint64_t bufferId(const Tensor& t) { return t.buffer()->id(); }

  // Appends t's record to out; its checksums and statistics are computed now (hashThread off),
  // or come later through a HashFill appended to fills (Note [Hashing off the engine thread]).
  void addTensor(std::vector<storage::TensorRecord>& out, std::vector<HashFill>& fills,
                 const Tensor& t, storage::Role role, int32_t index) {
    storage::TensorRecord& r = out.emplace_back();
    r.role = role;
    r.index = index;
    if (!t.defined()) return;
    r.tensorId = t.id();
    r.version = t.version();
    r.bufferId = bufferId(t);
    r.shape = t.shape();
    r.strides = t.strides();
    r.offset = t.offset();
    r.dtype = std::string(dtypeName(t.dtype()));
    r.device = t.device().name();
    r.bytes = int64_t(t.nbytes());
    const bool wantStats = opt_.stats && isFloating(t.dtype());
    if (!(opt_.md5 || opt_.roundedMd5 > 0 || wantStats)) return;
    ContentKey key{r.bufferId, r.version, r.offset, t.numel(), t.dtype(), {}, {}};
    if (!t.isContiguous()) {
      key.shape = t.shape();
      key.strides = t.strides();
    }
    if (!pool_) {
      hashNow(r, t, key, wantStats);
      return;
    }
    HashJobPtr job;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = jobCache_.find(key);
      if (it != jobCache_.end()) job = it->second;
    }
    if (!job) {
      job = std::make_shared<HashJob>();
      // Note [Device tensors]: a device tensor is hashed from a host copy of its values, made
      // here on the engine thread (a wait for the device) once per content (the cache above):
      // its checksums and statistics are the same bytes' as on the host, so a cuda run's MD5s
      // compare with a cpu run's. The copy is a fresh buffer nothing writes, so the job needs
      // no settle.
      job->tensor = hostCopy(t);
      if (opt_.allocator && job->tensor.buffer() == t.buffer()) {  // Note [Weakly held buffers]
        job->weakBuffer = t.buffer();
        auto view = std::make_shared<TensorImpl>();
        view->shape = t.shape();
        view->strides = t.strides();
        view->offset = t.offset();
        view->dtype = t.dtype();
        job->tensor = Tensor(std::move(view));
      }
      job->bufferId = r.bufferId;
      job->md5 = opt_.md5;
      job->roundedDigits = opt_.roundedMd5;
      job->stats = wantStats;
      job->bytes = r.bytes;
      job->dtype = t.dtype();
      // Not under mu_: a full backlog makes this thread hash, and freeing what it hashed reaches
      // onMemory.
      if (!pool_->submit(job, opt_.dropPolicy == DropPolicy::Block)) {
        droppedHashes_.fetch_add(1);
        return;
      }
      std::lock_guard<std::mutex> lk(mu_);
      if (jobCache_.size() >= kHashCacheMax) jobCache_.clear();
      jobCache_[key] = job;
    }
    fills.push_back({uint32_t(out.size() - 1), t.dtype(), std::move(job)});
  }

  // The engine-thread path: hashes r's tensor now (through the content cache).
  void hashNow(storage::TensorRecord& r, const Tensor& t, const ContentKey& key, bool wantStats) {
    HashEntry entry;
    bool hit = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = hashCache_.find(key);
      if (it != hashCache_.end()) {
        entry = it->second;
        hit = true;
      }
    }
    if (!hit) {
      entry = HashEntry{};
      const Tensor h = hostCopy(t);  // a device tensor's values, read back (Note [Device tensors])
      if (opt_.md5) entry.md5 = md5Elements(h);
      if (opt_.roundedMd5 > 0) entry.md5Rounded = md5RoundedElements(h, opt_.roundedMd5);
      if (wantStats) {
        entry.hasStats = true;
        entry.stats = tensorStats(h);
      }
      std::lock_guard<std::mutex> lk(mu_);
      if (hashCache_.size() >= kHashCacheMax) hashCache_.clear();
      hashCache_[key] = entry;
    }
    if (entry.md5.valid() || entry.md5Rounded.valid()) {
      const std::string trailer = hashTrailer(t.dtype(), t.shape());
      if (entry.md5.valid()) r.md5 = entry.md5.finish(trailer);
      if (entry.md5Rounded.valid()) r.md5Rounded = entry.md5Rounded.finish(trailer);
    }
    r.hasStats = entry.hasStats;
    r.stats = entry.stats;
  }

  // Writer thread: waits for (or hashes) an op's jobs and fills their results in.
  void fillHashes(OpItem& item) {
    for (HashFill& f : item.fills) {
      pool_->wait(f.job);
      const HashJob& job = *f.job;
      if (!job.error.empty()) throw Error("capture: hashing a tensor failed: " + job.error);
      storage::TensorRecord& r = item.rec.tensors[f.tensor];
      if (job.md5 || job.roundedDigits > 0) {
        const std::string trailer = hashTrailer(f.dtype, r.shape);
        const std::span<const uint8_t> tb(reinterpret_cast<const uint8_t*>(trailer.data()),
                                          trailer.size());
        if (job.md5) {
          const Md5Digest d = job.md5State.finish(tb);
          r.md5 = toHex(d.data(), d.size());
        }
        if (job.roundedDigits > 0) r.md5Rounded = job.md5Rounded.finish(trailer);
      }
      if (job.stats) {
        r.hasStats = true;
        r.stats = job.statsResult;
      }
    }
    item.fills.clear();
  }

  void fail(const std::string& why) {
    {
      std::lock_guard<std::mutex> lk(errMu_);
      if (error_.empty()) error_ = why;
    }
    failed_.store(true);
    status_.store(RecorderStatus::Failed);
    closed_.store(true);  // stop recording
    { std::lock_guard<std::mutex> lk(flushMu_); }
    flushCv_.notify_all();
    if (opt_.onError == ErrorPolicy::Throw) throwPending_.store(true);
  }

  void flushDropped() {
    auto flush = [&](const char* kind, std::atomic<int64_t>& total, int64_t& reported) {
      int64_t now = total.load();
      if (now > reported) writer_->addDropped(kind, now - reported);
      reported = now;
    };
    flush("op", droppedOps_, reportedDropped_[0]);
    flush("log", droppedLogs_, reportedDropped_[1]);
    flush("mem", droppedMems_, reportedDropped_[2]);
    flush("dump", droppedDumps_, reportedDropped_[3]);
    flush("hash", droppedHashes_, reportedDropped_[4]);
  }

  // ---- writer thread ----
  void writerLoop() {
    markCaptureThread();  // it may hash, and free what it hashed (onMemory must not wait for it)
    pthread_setname_np(pthread_self(), "keel-writer");
    std::unique_ptr<Symbolizer> symbolizer;  // made on the first stack (reads /proc/self/maps)
    std::vector<Item> batch;
    int64_t sinceCommit = 0;
    auto lastCommit = std::chrono::steady_clock::now();
    const auto interval = std::chrono::milliseconds(opt_.commitIntervalMs);
    try {
      while (queue_.popAll(batch, interval)) {
        bool stepEnded = false;
        for (auto& item : batch) {
          write(item, symbolizer, stepEnded);
          ++sinceCommit;
        }
        batch.clear();
        auto now = std::chrono::steady_clock::now();
        if (sinceCommit > 0 &&
            (stepEnded || sinceCommit >= opt_.commitEvery || now - lastCommit >= interval)) {
          flushDropped();
          writer_->commit();
          sinceCommit = 0;
          lastCommit = now;
        }
      }
    } catch (const std::exception& ex) {
      writerFailed(exceptionText(ex));
    } catch (...) {
      writerFailed("unknown error");
    }
  }

  void writerFailed(const std::string& why) {
    fail(why);
    queue_.abort();
    // Best effort: mark the run failed in what is already committed, then close.
    writer_->closeWithStatus("failed: " + why);
  }

  void write(Item& item, std::unique_ptr<Symbolizer>& sym, bool& stepEnded) {
    if (auto* op = std::get_if<OpItem>(&item)) {
      if (!op->fills.empty()) fillHashes(*op);
      writer_->writeOp(op->rec);
      written_[0].fetch_add(1);
    } else if (auto* s = std::get_if<storage::StepRecord>(&item)) {
      writer_->writeStep(*s);
      if (s->endNs != 0) {
        stepEnded = true;
        written_[1].fetch_add(1);
      }
    } else if (auto* st = std::get_if<RawStackItem>(&item)) {
      if (!sym) sym = std::make_unique<Symbolizer>();
      writer_->writeStack(sym->symbolize(st->id, st->addrs));
      written_[2].fetch_add(1);
    } else if (auto* l = std::get_if<storage::LogRecord>(&item)) {
      writer_->writeLog(*l);
      written_[3].fetch_add(1);
    } else if (auto* m = std::get_if<storage::MemRecord>(&item)) {
      writer_->writeMem(*m);
      written_[4].fetch_add(1);
    } else if (auto* f = std::get_if<FlushMarker>(&item)) {
      flushDropped();
      writer_->commit();
      {
        std::lock_guard<std::mutex> lk(flushMu_);
        flushDone_ = std::max(flushDone_, f->id);
      }
      flushCv_.notify_all();
    } else if (auto* d = std::get_if<storage::DumpRecord>(&item)) {
      std::vector<uint8_t> out(ZSTD_compressBound(d->data.size()));
      size_t n = ZSTD_compress(out.data(), out.size(), d->data.data(), d->data.size(), 3);
      if (ZSTD_isError(n))
        throw Error(std::string("capture: zstd compression failed: ") + ZSTD_getErrorName(n));
      out.resize(n);
      d->data = std::move(out);
      d->codec = "zstd";
      writer_->writeDump(*d);
      written_[5].fetch_add(1);
    }
  }

  const CaptureOptions opt_;
  std::unique_ptr<storage::Writer> writer_;
  RecordQueue queue_;
  std::thread thread_;

  // Engine-side state (mu_).
  std::mutex mu_;
  int64_t step_ = 0;
  int64_t stepBeginNs_ = 0;
  std::unordered_map<uint64_t, Pending> pending_;  // by op seq, between begin and end
  StackTable stacks_;
  std::unordered_map<ContentKey, HashEntry, ContentKeyHash> hashCache_;  // hashThread off
  std::unordered_map<ContentKey, HashJobPtr, ContentKeyHash> jobCache_;  // hashThread on
  std::unique_ptr<HashPool> pool_;  // null: hashThread off, or nothing to hash
  bool paused_ = false;             // outside the step range (engine side; followStepRange)

  std::atomic<bool> closed_{false};
  std::atomic<bool> failed_{false};
  std::atomic<bool> throwPending_{false};
  std::atomic<RecorderStatus> status_{RecorderStatus::Recording};
  mutable std::mutex errMu_;
  std::string error_;
  std::mutex stopMu_;
  bool stopped_ = false;

  std::mutex flushMu_;
  std::condition_variable flushCv_;
  int64_t flushRequested_ = 0, flushDone_ = 0;

  std::atomic<int64_t> written_[6] = {};
  std::atomic<int64_t> droppedOps_{0}, droppedLogs_{0}, droppedMems_{0}, droppedDumps_{0};
  std::atomic<int64_t> droppedHashes_{0};
  int64_t reportedDropped_[5] = {0, 0, 0, 0, 0};  // writer side (or stop(), after the join)
};

}  // namespace detail

Recorder::Recorder(std::unique_ptr<storage::Writer> writer, CaptureOptions options) {
  KEEL_CHECK(writer != nullptr, "capture: Recorder needs a writer");
  KEEL_CHECK(options.queueCapacity >= 1, "capture: queue capacity must be >= 1");
  obs_ = std::make_shared<detail::CaptureObserver>(std::move(writer), std::move(options));
  addObserver(obs_);
  obs_->followStepRange(0);  // initialisation runs as step 0
}

Recorder::~Recorder() {
  finish();
}

// The hashing is settled while the observer is still installed: the buffers its jobs held are
// let go of, and their frees recorded, before the recording's events end.
void Recorder::finish() {
  if (!obs_) return;
  obs_->settleHashes();
  removeObserver(obs_);
  obs_->stop();
}

void Recorder::finishFailed(const std::string& reason) {
  if (!obs_) return;
  obs_->settleHashes();
  removeObserver(obs_);
  obs_->stop("failed: " + reason);
}

void Recorder::finishStopped(const std::string& reason) {
  if (!obs_) return;
  obs_->settleHashes();
  removeObserver(obs_);
  obs_->stop("stopped: " + reason);
}

void Recorder::flush() {
  if (obs_) obs_->flush();
}

void Recorder::beforeStep(int64_t step) {
  if (obs_) obs_->beforeStep(step);
}

RecorderStatus Recorder::status() const {
  return obs_->status();
}
std::string Recorder::error() const {
  return obs_->error();
}
RecorderCounts Recorder::counts() const {
  return obs_->counts();
}
const CaptureOptions& Recorder::options() const {
  return obs_->options();
}

}  // namespace keel::capture
