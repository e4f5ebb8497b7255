// The one observer seam. The dispatcher calls every installed observer before and after each op
// with the op, attributes, inputs, outputs, phase, module scope path and (for backward ops) the
// forward op they differentiate; allocators report memory events the same way. With no observer
// installed the dispatcher's cost is one relaxed atomic load per op (Note [One load per op]), and
// an allocator's one more per allocation or free it reports.
#pragma once
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string_view>

#include "keel/attrs.h"
#include "keel/base/non_copyable.h"
#include "keel/base/vocabulary.h"
#include "keel/device.h"
#include "keel/tensor.h"

namespace keel {

struct OpDef;
class Buffer;

// Which kernel ran an op call (Note [Kernel identity] in keel/registry.h): the backend, the
// kernel's variant — what decides its numerics: algorithm, accumulation dtype, reduction order —
// and its run-time parameters (vector ISA, BLAS library and core type, threads, tile sizes).
struct KernelIdentity {
  Backend backend = Backend::Cpu;
  std::string_view variant;
  std::string_view params;
};

struct OpEvent {
  uint64_t seq = 0;         // process-wide op call counter, starts at 1
  uint64_t forwardSeq = 0;  // backward ops: seq of the forward op whose grad node ran; else 0
  const OpDef* op = nullptr;
  const Attrs* attrs = nullptr;
  std::span<const Tensor> inputs;
  std::span<const Tensor> outputs;  // empty in onOpBegin
  Phase phase = Phase::Forward;
  std::string_view scope;  // module scope path, e.g. "blocks.3.attn"
  int64_t beginNs = 0;
  int64_t endNs = 0;  // 0 in onOpBegin
  // onOpEnd and onOpError (once the kernel was chosen): the kernel that ran; null for views,
  // which run no kernel, and in onOpBegin.
  const KernelIdentity* kernel = nullptr;
};

// Sets the tag of allocations on this thread for its lifetime (nests; restores the previous tag).
class MemTagScope : NonCopyable {
 public:
  explicit MemTagScope(MemTag t);
  ~MemTagScope();

 private:
  MemTag prev_;
};

struct MemEvent {
  MemEventKind kind = MemEventKind::Alloc;
  Device device;
  uint64_t address = 0;
  uint64_t bytes = 0;
  uint64_t toAddress = 0;  // Move only
  uint64_t opSeq = 0;      // op being dispatched on this thread, 0 outside ops
  int64_t timeNs = 0;
  uint64_t allocatedAfter = 0;
  uint64_t reservedAfter = 0;
  uint64_t bufferId = 0;      // Alloc/Free/Compact of a Buffer: Buffer::id(); else 0
  MemTag tag = MemTag::None;  // Alloc: the allocating code's MemTagScope
  std::string_view label;     // TrackBegin/TrackEnd: the section's name
};

// Training-step boundaries, reported by whoever drives training (the Trainer).
struct StepEvent {
  int64_t step = 0;   // 1-based
  bool begin = true;  // false: the step ended (loss and the metrics below are set)
  double loss = 0;
  int64_t timeNs = 0;
  // Step end: what the trainer knows of the step (NaN where it does not).
  double lr = std::numeric_limits<double>::quiet_NaN();
  double gradNorm = std::numeric_limits<double>::quiet_NaN();  // before clipping
  double tokensPerSec = std::numeric_limits<double>::quiet_NaN();
  double auxLoss = std::numeric_limits<double>::quiet_NaN();  // MoE aux loss (a dense model: NaN)
  double valLoss = std::numeric_limits<double>::quiet_NaN();  // validation loss, if evaluated
  // The metrics above that are NaN because the trainer reported a NaN, not because it did not
  // report them: bit 1 << i for loss, lr, grad norm, tokens/s, aux loss, val loss in that order
  // (storage's StepMetric; detail::endStep sets them).
  uint8_t nanMetrics = 0;
};

// Log lines (keel::log in keel/log.h), delivered to observers as they are written.

struct LogEvent {
  LogLevel level = LogLevel::Info;
  std::string_view scope;  // module scope path or a named log scope
  std::string_view message;
  uint64_t opSeq = 0;  // op being dispatched on this thread, else the last op issued
  int64_t timeNs = 0;
};

// Note [Op descriptions]: some ops compute, for debuggers only, attributes that no kernel reads —
// flashmask_attention's mask kind, block sparsity and tile map (Note [FlashMask op attributes]).
// Computing them is work the engine should not do for nobody, so an op declares it as a describe
// rule (OpDef::describe) and the dispatcher runs it only while an installed observer wants
// descriptions: after shape inference accepted the inputs, on a copy of the attributes, which
// OpEvent::attrs then points to in onOpEnd and onOpError (onOpBegin sees the attributes as
// passed). Kernels, backward rules and autograd nodes keep the attributes as passed. An observer
// that only counts or times ops can decline with wantsOpDescriptions(), asked once in addObserver
// (while another installed observer wants them, every observer sees them); with no observer
// installed the dispatcher's only observer cost stays one relaxed atomic load.
class Observer {
 public:
  virtual ~Observer() = default;
  // Whether OpEvent::attrs should carry the ops' descriptions (Note [Op descriptions]).
  virtual bool wantsOpDescriptions() const { return true; }
  virtual void onOpBegin(const OpEvent&) {}
  virtual void onOpEnd(const OpEvent&) {}
  // The op's shape inference or kernel threw (after onOpBegin; onOpEnd will not come). `message`
  // is the exception's text; the exception propagates to the caller after the observers ran.
  virtual void onOpError(const OpEvent&, std::string_view /*message*/) {}
  virtual void onMemory(const MemEvent&) {}
  virtual void onStep(const StepEvent&) {}
  virtual void onLog(const LogEvent&) {}
  // Code is about to write into, or free, a live buffer that earlier ops may have read or
  // produced: a mutating op's inputs, a host copy, a checkpoint load, a Buffer's destructor. An
  // observer that reads buffers after the op that made them (the capture's hashing, Note
  // [Hashing off the engine thread]) finishes reading this one before returning.
  virtual void onBufferWrite(const Buffer&) {}
};

// Tells observers that t's buffer is about to be written outside an op's fresh outputs (see
// Observer::onBufferWrite). Code that writes through Tensor::data() into a tensor that ops have
// already seen calls it first; with no observer installed it is one relaxed atomic load.
void beforeBufferWrite(const Tensor& t);

void addObserver(std::shared_ptr<Observer> obs);
void removeObserver(const std::shared_ptr<Observer>& obs);
// Note [Paused observers]: a paused observer hears step events only (onStep) — ops, memory events,
// logs and buffer writes skip it — so an observer that records a range of steps (capture's
// --step-range) pauses itself at a step outside the range and resumes at the range's first step.
// While every installed observer is paused the dispatcher pays what it pays with none: the one
// load of Note [One load per op] (hasObservers() is false). No-op for an observer not installed.
void setObserverPaused(const std::shared_ptr<Observer>& obs, bool paused);

namespace detail {
// Note [One load per op]
// Everything that instruments ops lives in one atomic word: bit 0 is set while an observer is
// installed and not paused (Note [Paused observers]), and the bits above count verbose rules (each
// live VerboseGuard, plus one while global KEEL_VERBOSE rules are set; keel/log.h). The dispatcher
// loads the word once per op and asks observersIn / verboseIn of that value, so with neither active
// an op costs that one relaxed load.
inline constexpr uint32_t kObserversBit = 1;
inline constexpr uint32_t kVerboseUnit = 2;  // one verbose activation
extern std::atomic<uint32_t> g_instrumentation;
inline uint32_t instrumentation() {
  return g_instrumentation.load(std::memory_order_relaxed);
}
inline bool observersIn(uint32_t word) {
  return (word & kObserversBit) != 0;
}
inline bool verboseIn(uint32_t word) {
  return word >= kVerboseUnit;
}
inline bool hasObservers() {
  return observersIn(instrumentation());
}
// Some installed observer wants op descriptions; read only when hasObservers().
extern std::atomic<bool> g_wantOpDescriptions;
inline bool observersWantOpDescriptions() {
  return g_wantOpDescriptions.load(std::memory_order_relaxed);
}
void notifyMemory(MemEvent e);  // fills opSeq, timeNs, tag and bufferId; calls observers
MemTag currentMemTag();

// Set by Buffer around its allocator call so allocators and events know the owning Buffer.
struct AllocContext {
  uint64_t bufferId = 0;
  Buffer* buffer = nullptr;
  // Set by the dispatcher while it allocates a top-level op's outputs: no kernel holds a raw
  // address then, so an allocator may compact live buffers (see Note [Buffer move]).
  bool safePoint = false;
};
AllocContext& allocContext();
void notifyOpBegin(const OpEvent& e);
void notifyOpEnd(const OpEvent& e);
void notifyOpError(const OpEvent& e, std::string_view message);
void notifyBufferWrite(const Buffer& b);
void notifyStep(StepEvent e);  // fills timeNs
void notifyLog(const LogEvent& e);
int64_t nowNs();
}  // namespace detail

}  // namespace keel
