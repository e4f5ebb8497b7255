// Memory tracking scopes: an observer that sums the allocations and frees of a code section and
// lists what the section allocated and left alive. Invariant: the State outlives the observer's
// registration (the observer holds it by shared_ptr), so end() may run on any thread.
#include <algorithm>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "keel/allocator.h"
#include "keel/registry.h"

namespace keel {

struct MemoryTrackingScope::State : Observer {
  mutable std::mutex mu;
  MemoryTrackSummary sum;
  uint64_t liveBytes = 0;
  std::unordered_map<uint64_t, TrackedBlock> live;    // by address
  std::unordered_map<uint64_t, std::string> opNames;  // op seq -> name, ops begun in the section
  std::shared_ptr<Observer> self;                     // registered while tracking
  bool ended = false;

  void onOpBegin(const OpEvent& e) override {
    std::lock_guard<std::mutex> lk(mu);
    opNames.emplace(e.seq, e.op->name);
  }

  void onMemory(const MemEvent& e) override {
    std::lock_guard<std::mutex> lk(mu);
    switch (e.kind) {
      case MemEventKind::Alloc: {
        TrackedBlock b{e.address, e.bytes, e.opSeq, e.bufferId, {}, e.tag};
        if (auto it = opNames.find(e.opSeq); it != opNames.end()) b.op = it->second;
        live[e.address] = std::move(b);
        sum.allocs++;
        sum.bytesAllocated += e.bytes;
        liveBytes += e.bytes;
        sum.peakBytes = std::max(sum.peakBytes, liveBytes);
        break;
      }
      case MemEventKind::Free: {
        sum.frees++;
        sum.bytesFreed += e.bytes;
        if (auto it = live.find(e.address); it != live.end()) {
          liveBytes -= it->second.bytes;
          live.erase(it);
        }
        break;
      }
      case MemEventKind::Compact: {  // a block allocated in the section moved
        if (auto it = live.find(e.address); it != live.end()) {
          TrackedBlock b = std::move(it->second);
          live.erase(it);
          b.address = e.toAddress;
          live[e.toAddress] = std::move(b);
        }
        break;
      }
      default:
        break;
    }
  }

  MemoryTrackSummary summaryLocked() const {
    MemoryTrackSummary s = sum;
    s.aliveBytes = liveBytes;
    for (auto& [a, b] : live) s.alive.push_back(b);
    std::sort(s.alive.begin(), s.alive.end(), [](const TrackedBlock& x, const TrackedBlock& y) {
      return x.bytes != y.bytes ? x.bytes > y.bytes : x.address < y.address;
    });
    return s;
  }
};

namespace {
void mark(MemEventKind kind, const std::string& name) {
  if (!detail::hasObservers()) return;
  MemEvent e;
  e.kind = kind;
  e.label = name;
  detail::notifyMemory(e);
}
}  // namespace

MemoryTrackingScope::MemoryTrackingScope(std::string name) : state_(std::make_shared<State>()) {
  state_->sum.name = std::move(name);
  // The observer is registered first so the section's own begin mark reaches recorders after it.
  state_->self = std::shared_ptr<Observer>(state_, state_.get());
  addObserver(state_->self);
  mark(MemEventKind::TrackBegin, state_->sum.name);
}

MemoryTrackingScope::~MemoryTrackingScope() {
  end();
}

MemoryTrackSummary MemoryTrackingScope::summary() const {
  std::lock_guard<std::mutex> lk(state_->mu);
  return state_->summaryLocked();
}

MemoryTrackSummary MemoryTrackingScope::end() {
  std::shared_ptr<Observer> self;
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    if (!state_->ended) {
      state_->ended = true;
      self = std::move(state_->self);
    }
  }
  if (self) {
    mark(MemEventKind::TrackEnd, state_->sum.name);
    removeObserver(self);
  }
  return summary();
}

std::string formatTrackSummary(const MemoryTrackSummary& s, size_t maxBlocks) {
  std::ostringstream os;
  os << "memory section '" << s.name << "': " << s.allocs << " allocations (" << s.bytesAllocated
     << " bytes), " << s.frees << " frees (" << s.bytesFreed << " bytes), peak " << s.peakBytes
     << " bytes, " << s.alive.size() << " blocks still alive (" << s.aliveBytes << " bytes)";
  for (size_t i = 0; i < std::min(maxBlocks, s.alive.size()); ++i) {
    const TrackedBlock& b = s.alive[i];
    os << "\n  " << b.bytes << " bytes at 0x" << std::hex << b.address << std::dec;
    if (!b.op.empty())
      os << " from op #" << b.opSeq << " " << b.op;
    else if (b.opSeq)
      os << " from op #" << b.opSeq;
    else
      os << " outside ops";
    if (b.tag != MemTag::None) os << " (" << memTagName(b.tag) << ")";
  }
  if (s.alive.size() > maxBlocks) os << "\n  ... " << s.alive.size() - maxBlocks << " more";
  return os.str();
}

}  // namespace keel
