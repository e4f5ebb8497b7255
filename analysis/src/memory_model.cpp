// MemoryModel: see memory_model.h. Replays mem_events rows; no Qt.
#include "keel/analysis/memory_model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <unordered_set>

#include "keel/storage/reader.h"

namespace keel::analysis {

// Note [Memory replay]: the state at event k is what events 0..k did, in order:
//   alloc: a live block [address, address+bytes) appears (remembering its alloc event);
//   free: the live block at address goes; compact: the live block at address moves to toAddress
//   (vmm compaction; it keeps its alloc event); reserve / map: a segment (caching) or a 2 MiB
//   chunk (vmm) at [address, address+bytes) becomes mapped; unmap: that chunk stays in the map as
//   unmapped (a hole the vmm allocator may fill by remapping); release: caching segments in the
//   range go away (a vmm release follows its chunk's unmap, and leaves the hole); move (a vmm
//   remap) changes nothing by itself: the unmap of the source and the map of the target are
//   their own events; track_begin / track_end mark tracking sections only.
// A free of an unknown address (allocated before the recording began) is ignored. Checkpoints
// every `every_` events hold the whole state, so stateAt(k) replays at most `every_` events.

namespace {

using Kind = MemEventKind;  // the shared vocabulary's (keel/base/vocabulary.h)

}  // namespace

struct MemoryModel::Work {
  std::map<uint64_t, MemBlock> blocks;
  std::map<uint64_t, MemSegment> segs;
  uint64_t liveBytes = 0;

  void load(const MemState& s) {
    blocks.clear();
    segs.clear();
    for (const MemBlock& b : s.blocks) blocks.emplace_hint(blocks.end(), b.address, b);
    for (const MemSegment& g : s.segments) segs.emplace_hint(segs.end(), g.address, g);
    liveBytes = s.liveBytes;
  }
  MemState save(int64_t cursor) const {
    MemState s;
    s.cursor = cursor;
    s.blocks.reserve(blocks.size());
    for (const auto& [a, b] : blocks) s.blocks.push_back(b);
    s.segments.reserve(segs.size());
    for (const auto& [a, g] : segs) s.segments.push_back(g);
    s.liveBytes = liveBytes;
    return s;
  }
};

MemoryModel::MemoryModel(size_t checkpointEvery) : every_(checkpointEvery) {}

void MemoryModel::addOps(const std::vector<storage::OpRecord>& ops) {
  for (const storage::OpRecord& o : ops) {
    MemOp m;
    m.seq = o.seq;
    m.step = o.step;
    m.name = o.name;
    m.phase = o.phase;
    m.scope = o.scope;
    m.beginNs = o.beginNs;
    m.endNs = o.endNs;
    m.forwardSeq = o.forwardSeq;
    m.stackId = o.stackId;
    for (const storage::TensorRecord& t : o.tensors) {
      if (t.bufferId == 0) continue;
      const bool out = t.role == storage::Role::Output;
      if (out) m.outputBuffers.push_back(t.bufferId);
      MemBuffer& b = buffers_[t.bufferId];
      auto record = [&] {
        b.tensor = MemTensor{o.seq, out, t.index, t.tensorId, t.shape, t.dtype};
      };
      if (!b.tensor || (out && !b.tensor->output)) {
        record();
      } else if (out && b.tensor->output && t.tensorId != b.tensor->tensorId &&
                 o.seq > b.tensor->opSeq && b.viewOpSeq == 0) {
        b.viewOpSeq = o.seq;
      }
    }
    ops_.push_back(std::move(m));
  }
}

void MemoryModel::addStack(const storage::StackRecord& stack, size_t maxFrames) {
  std::vector<storage::StackFrame> frames(
      stack.frames.begin(), stack.frames.begin() + std::min(maxFrames, stack.frames.size()));
  stacks_[stack.id] = std::move(frames);
}

void MemoryModel::setEvents(std::vector<storage::MemRecord> events) {
  events_ = std::move(events);
  // Ops by seq, and each forward op's last backward op.
  std::stable_sort(ops_.begin(), ops_.end(),
                   [](const MemOp& a, const MemOp& b) { return a.seq < b.seq; });
  ops_.erase(std::unique(ops_.begin(), ops_.end(),
                         [](const MemOp& a, const MemOp& b) { return a.seq == b.seq; }),
             ops_.end());
  for (const MemOp& o : ops_) {
    if (o.forwardSeq == 0 || o.phase != Phase::Backward) continue;
    auto it = std::lower_bound(ops_.begin(), ops_.end(), o.forwardSeq,
                               [](const MemOp& a, uint64_t s) { return a.seq < s; });
    if (it == ops_.end() || it->seq != o.forwardSeq) continue;
    if (it->backwardSeq == 0 || o.endNs >= it->backwardEndNs) {
      it->backwardSeq = o.seq;
      it->backwardEndNs = o.endNs;
    }
  }

  const size_t n = events_.size();
  if (every_ == 0) every_ = std::max<size_t>(256, (n + 255) / 256);
  kinds_.resize(n);
  for (size_t i = 0; i < n; ++i) kinds_[i] = uint8_t(events_[i].kind);
  auto kinds = [this](size_t i) { return Kind(kinds_[i]); };
  allocated_.assign(n, 0);
  reserved_.assign(n, 0);

  // One pass: checkpoints, op event ranges, step starts, peaks, tracking sections.
  checkpoints_.clear();
  opEvents_.clear();
  stepStarts_.clear();
  sections_.clear();
  hasSegments_ = hasChunks_ = false;
  peakAllocated_ = peakReserved_ = 0;
  peakEvent_ = -1;
  ooms_.clear();
  Work w;
  struct Open {
    size_t section;
    std::unordered_set<uint32_t> mine;  // alloc events of blocks allocated inside, still live
    uint64_t cur = 0;
  };
  std::vector<Open> open;
  std::unordered_map<uint64_t, uint32_t> liveAt;  // address -> alloc event
  std::unordered_map<uint32_t, uint64_t> addrOf;  // alloc event -> address, live blocks
  auto finishSection = [&](Open& o, std::optional<size_t> end) {
    MemSection& s = sections_[o.section];
    s.endEvent = end;
    s.aliveBytes = o.cur;
    s.alive.clear();
    for (uint32_t ev : o.mine) s.alive.push_back(MemBlock{addrOf[ev], events_[ev].bytes, ev});
    std::sort(s.alive.begin(), s.alive.end(), [](const MemBlock& x, const MemBlock& y) {
      return x.bytes != y.bytes ? x.bytes > y.bytes : x.address < y.address;
    });
  };
  for (size_t i = 0; i < n; ++i) {
    if (i % every_ == 0) checkpoints_.push_back(w.save(int64_t(i) - 1));
    const storage::MemRecord& e = events_[i];
    if (e.opSeq) {
      auto [it, fresh] = opEvents_.try_emplace(e.opSeq, i, i);
      if (!fresh) it->second.second = i;
    }
    if (i == 0 || e.step != events_[i - 1].step) stepStarts_.emplace_back(i, e.step);
    const bool mark = kinds(i) == Kind::TrackBegin || kinds(i) == Kind::TrackEnd;
    allocated_[i] = mark ? (i ? allocated_[i - 1] : 0) : e.allocatedAfter;
    reserved_[i] = mark ? (i ? reserved_[i - 1] : 0) : e.reservedAfter;
    if (allocated_[i] > peakAllocated_ || peakEvent_ < 0) peakEvent_ = int64_t(i);
    peakAllocated_ = std::max(peakAllocated_, allocated_[i]);
    peakReserved_ = std::max(peakReserved_, reserved_[i]);
    switch (kinds(i)) {
      case Kind::Reserve:
      case Kind::Release:
        hasSegments_ = true;
        break;
      case Kind::Map:
      case Kind::Unmap:
      case Kind::Move:
      case Kind::Compact:
        hasSegments_ = hasChunks_ = true;
        break;
      case Kind::Alloc:
        if (auto old = liveAt.find(e.address); old != liveAt.end()) {  // a free we never saw
          for (Open& o : open)
            if (o.mine.erase(old->second)) o.cur -= events_[old->second].bytes;
          addrOf.erase(old->second);
        }
        liveAt[e.address] = uint32_t(i);
        addrOf[uint32_t(i)] = e.address;
        for (Open& o : open) {
          MemSection& s = sections_[o.section];
          s.allocs++;
          s.bytesAllocated += e.bytes;
          o.mine.insert(uint32_t(i));
          o.cur += e.bytes;
          s.peakBytes = std::max(s.peakBytes, o.cur);
        }
        break;
      case Kind::Free: {
        auto it = liveAt.find(e.address);
        for (Open& o : open) {
          MemSection& s = sections_[o.section];
          s.frees++;
          s.bytesFreed += e.bytes;
          if (it != liveAt.end() && o.mine.erase(it->second)) o.cur -= events_[it->second].bytes;
        }
        if (it != liveAt.end()) {
          addrOf.erase(it->second);
          liveAt.erase(it);
        }
        break;
      }
      case Kind::TrackBegin:
        sections_.push_back(MemSection{e.label, i, std::nullopt, 0, 0, 0, 0, 0, 0, {}});
        open.push_back(Open{sections_.size() - 1, {}, 0});
        break;
      case Kind::Oom:
        ooms_.push_back(i);
        break;
      default:
        break;
    }
    if (kinds(i) == Kind::Compact) {
      if (auto it = liveAt.find(e.address); it != liveAt.end()) {
        uint32_t ev = it->second;
        liveAt.erase(it);
        liveAt[e.toAddress] = ev;
        addrOf[ev] = e.toAddress;
      }
    }
    apply(w, i);
    if (kinds(i) == Kind::TrackEnd) {
      for (size_t j = open.size(); j-- > 0;) {
        if (sections_[open[j].section].name != e.label) continue;
        finishSection(open[j], i);
        open.erase(open.begin() + std::ptrdiff_t(j));
        break;
      }
    }
  }
  for (Open& o : open) finishSection(o, std::nullopt);
}

void MemoryModel::apply(Work& w, size_t i) const {
  const storage::MemRecord& e = events_[i];
  switch (Kind(kinds_[i])) {
    case Kind::Alloc: {
      auto [it, fresh] = w.blocks.try_emplace(e.address, MemBlock{e.address, e.bytes, uint32_t(i)});
      if (!fresh) {  // a free we never saw: the new block replaces it
        w.liveBytes -= it->second.bytes;
        it->second = MemBlock{e.address, e.bytes, uint32_t(i)};
      }
      w.liveBytes += e.bytes;
      break;
    }
    case Kind::Free:
      if (auto it = w.blocks.find(e.address); it != w.blocks.end()) {
        w.liveBytes -= it->second.bytes;
        w.blocks.erase(it);
      }
      break;
    case Kind::Compact:
      if (auto it = w.blocks.find(e.address); it != w.blocks.end()) {
        MemBlock b = it->second;
        w.blocks.erase(it);
        b.address = e.toAddress;
        if (auto old = w.blocks.find(b.address); old != w.blocks.end()) {
          w.liveBytes -= old->second.bytes;
          w.blocks.erase(old);
        }
        w.blocks.emplace(b.address, b);
      }
      break;
    case Kind::Reserve:
    case Kind::Map:
      w.segs[e.address] = MemSegment{e.address, e.bytes, true};
      break;
    case Kind::Unmap:
      w.segs[e.address] = MemSegment{e.address, e.bytes, false};
      break;
    case Kind::Release:
      for (auto it = w.segs.lower_bound(e.address);
           it != w.segs.end() && it->first < e.address + std::max<uint64_t>(e.bytes, 1);) {
        if (it->second.mapped)
          it = w.segs.erase(it);
        else
          ++it;
      }
      break;
    default:
      break;
  }
}

MemState MemoryModel::stateAt(int64_t k) const {
  if (k < 0 || events_.empty()) return MemState{};
  k = std::min<int64_t>(k, int64_t(events_.size()) - 1);
  size_t c = std::min(size_t(k + 1) / every_, checkpoints_.size() - 1);
  Work w;
  w.load(checkpoints_[c]);
  for (size_t i = c * every_; i <= size_t(k); ++i) apply(w, i);
  return w.save(k);
}

double MemoryModel::fragmentationAfter(size_t i) const {
  const uint64_t r = reserved_[i], a = std::min(allocated_[i], r);
  return r ? double(r - a) / double(r) : 0.0;
}

// Note [Memory figures]: what the memory view and `keel memory stats` call each figure, so both
// print the same numbers for the same recording. allocated and reserved are the allocator's
// statistics as the event carries them. reserved - allocated is *cached free* memory: held by
// the allocator for reuse, used by no block; AllocatorStats::fragmentation() names that ratio,
// but a backward pass that frees its activations leaves most of reserved memory cached and
// perfectly reusable, so it is not fragmentation. *Fragmentation* is AllocatorStats::scatter():
// 1 - largest free block / free memory, how much of the free memory a request for all of it
// could not get in one piece. Free blocks are the gaps between live blocks inside mapped memory:
// per segment for the caching allocator (its blocks never span two segments), across touching
// mapped chunks for vmm (a free block may cover several chunks); the host allocator reserves
// nothing beyond its live blocks, so it has neither. The replayed blocks carry the allocator's
// rounded sizes, so with the whole run recorded the gaps add up to reserved - allocated.
MemFigures MemoryModel::figuresAt(int64_t k) const {
  if (events_.empty() || k < 0) return MemFigures{};
  return figures(stateAt(k));
}

MemFigures MemoryModel::figures(const MemState& st) const {
  MemFigures f;
  const int64_t k = st.cursor;
  if (k < 0 || size_t(k) >= events_.size()) return f;
  f.event = k;
  f.allocated = allocated_[size_t(k)];
  f.reserved = reserved_[size_t(k)];
  f.cachedFree = f.reserved - std::min(f.allocated, f.reserved);
  size_t bi = 0;
  auto gaps = [&](uint64_t a0, uint64_t a1) {
    while (bi < st.blocks.size() && st.blocks[bi].address < a0) ++bi;
    uint64_t at = a0;
    auto gap = [&](uint64_t bytes) {
      if (bytes == 0) return;
      f.freeBlocks++;
      f.largestFree = std::max(f.largestFree, bytes);
    };
    for (; bi < st.blocks.size() && st.blocks[bi].address < a1; ++bi) {
      if (st.blocks[bi].address > at) gap(st.blocks[bi].address - at);
      at = std::max(at, st.blocks[bi].address + st.blocks[bi].bytes);
    }
    if (at < a1) gap(a1 - at);
  };
  for (size_t i = 0; i < st.segments.size();) {
    const MemSegment& g = st.segments[i];
    uint64_t a1 = g.address + g.bytes;
    size_t j = i + 1;
    if (hasChunks_)  // vmm: touching mapped chunks hold one free block
      for (; j < st.segments.size() && st.segments[j].address == a1 &&
             st.segments[j].mapped == g.mapped;
           ++j)
        a1 = st.segments[j].address + st.segments[j].bytes;
    if (g.mapped) gaps(g.address, a1);
    i = j;
  }
  return f;
}

MemFigures MemoryModel::figuresAtPeak() const {
  return figuresAt(peakEvent_);
}

// Note [Active memory bands]: the active-memory timeline (PyTorch's memory_viz draws the same):
// at each moment the live blocks are stacked in allocation order, the oldest at the bottom, so
// the stack's top is the live bytes, a block freed under others lets them sink, a leak is a band
// that grows from step to step, and at the peak every contributor is a band of its size. Level
// of detail keeps it cheap on a million events: a range of events is cut into at most `columns`
// columns (one per pixel), each drawn from the state at its event of most bytes allocated (a
// peak never falls between columns); consecutive blocks under `minBytes` (less than a pixel
// high) become one merged slice. One stateAt(first - 1) gives the blocks live when the range
// starts; then one pass over the range's events keeps the live set in allocation order.
namespace {

// Sums over slots 0..i-1 (Fenwick tree).
struct Prefix {
  std::vector<int64_t> t;
  explicit Prefix(size_t n) : t(n + 1, 0) {}
  void add(size_t i, int64_t v) {
    for (++i; i < t.size(); i += i & (~i + 1)) t[i] += v;
  }
  int64_t before(size_t i) const {
    int64_t s = 0;
    for (; i > 0; i -= i & (~i + 1)) s += t[i];
    return s;
  }
};

// The largest value over a range of slots, and its slot (segment tree).
struct Largest {
  size_t n = 1;
  std::vector<std::pair<uint64_t, uint32_t>> t;  // (bytes, slot)
  explicit Largest(size_t size) {
    while (n < size) n *= 2;
    t.assign(2 * n, {0, 0});
  }
  void set(size_t i, uint64_t v) {
    i += n;
    t[i] = {v, uint32_t(i - n)};
    for (i /= 2; i > 0; i /= 2) t[i] = std::max(t[2 * i], t[2 * i + 1]);
  }
  std::pair<uint64_t, uint32_t> over(size_t lo, size_t hi) const {  // [lo, hi)
    std::pair<uint64_t, uint32_t> best{0, uint32_t(lo)};
    for (lo += n, hi += n; lo < hi; lo /= 2, hi /= 2) {
      if (lo & 1) best = std::max(best, t[lo++]);
      if (hi & 1) best = std::max(best, t[--hi]);
    }
    return best;
  }
};

}  // namespace

MemBands MemoryModel::bands(int64_t first, int64_t last, size_t columns, uint64_t minBytes) const {
  MemBands out;
  const int64_t n = int64_t(events_.size());
  first = std::max<int64_t>(first, 0);
  last = std::min<int64_t>(last, n - 1);
  if (n == 0 || last < first || columns == 0) return out;
  out.first = first;
  out.last = last;
  // Slots in allocation order: the blocks live when the range starts (by alloc event), then one
  // per alloc of the range. Blocks of at least minBytes are drawn one by one (`big`, in order);
  // the runs of smaller ones between them are sums (prefix trees) with their largest member.
  const MemState s0 = stateAt(first - 1);
  std::vector<MemBlock> initial = s0.blocks;
  std::sort(initial.begin(), initial.end(),
            [](const MemBlock& x, const MemBlock& y) { return x.allocEvent < y.allocEvent; });
  size_t slots = initial.size();
  for (int64_t i = first; i <= last; ++i) slots += Kind(kinds_[size_t(i)]) == Kind::Alloc;
  std::vector<uint32_t> evOf(slots);
  std::vector<uint64_t> bytesOf(slots, 0);
  Prefix bytes(slots), count(slots);
  Largest largest(slots);
  std::set<uint32_t> big;
  std::unordered_map<uint64_t, uint32_t> at;  // address -> slot of the live block there
  at.reserve(initial.size() * 2);
  uint32_t next = 0;
  auto place = [&](uint64_t address, uint64_t b, uint32_t ev) {
    const uint32_t k = next++;
    evOf[k] = ev;
    bytesOf[k] = b;
    bytes.add(k, int64_t(b));
    count.add(k, 1);
    if (b >= minBytes)
      big.insert(k);
    else
      largest.set(k, b);
    at[address] = k;
  };
  auto kill = [&](uint64_t address) {
    auto it = at.find(address);
    if (it == at.end()) return;
    const uint32_t k = it->second;
    bytes.add(k, -int64_t(bytesOf[k]));
    count.add(k, -1);
    if (bytesOf[k] >= minBytes)
      big.erase(k);
    else
      largest.set(k, 0);
    at.erase(it);
  };
  for (const MemBlock& b : initial) place(b.address, b.bytes, b.allocEvent);

  const uint64_t span = uint64_t(last - first + 1);
  const size_t cols = size_t(std::min<uint64_t>(columns, span));
  out.columns.reserve(cols);
  int64_t i = first;
  for (size_t c = 0; c < cols; ++c) {
    MemBandColumn col;
    col.firstEvent = first + int64_t(c * span / cols);
    col.lastEvent = first + int64_t((c + 1) * span / cols) - 1;
    col.event = col.firstEvent;
    for (int64_t j = col.firstEvent + 1; j <= col.lastEvent; ++j)
      if (allocated_[size_t(j)] > allocated_[size_t(col.event)]) col.event = j;
    for (; i <= col.event; ++i) {
      const storage::MemRecord& e = events_[size_t(i)];
      switch (Kind(kinds_[size_t(i)])) {
        case Kind::Alloc:
          kill(e.address);  // a free we never saw
          place(e.address, e.bytes, uint32_t(i));
          break;
        case Kind::Free:
          kill(e.address);
          break;
        case Kind::Compact:
          if (auto it = at.find(e.address); it != at.end()) {
            const uint32_t k = it->second;
            at.erase(it);
            kill(e.toAddress);
            at[e.toAddress] = k;
          }
          break;
        default:
          break;
      }
    }
    // Small blocks in slots [lo, hi): one merged slice, if any is live.
    auto merged = [&](size_t lo, size_t hi, uint64_t base, uint64_t top) {
      if (top <= base) return;
      const auto [b, k] = largest.over(lo, hi);
      const int64_t blocks = count.before(hi) - count.before(lo);
      col.slices.push_back(
          MemBandSlice{kMergedBands, base, top - base, uint32_t(blocks), b ? evOf[k] : 0});
    };
    size_t prev = 0;  // the slot after the last big block
    uint64_t end = 0;
    for (uint32_t k : big) {
      const uint64_t base = uint64_t(bytes.before(k));
      merged(prev, k, end, base);
      col.slices.push_back(MemBandSlice{evOf[k], base, bytesOf[k], 1, 0});
      end = base + bytesOf[k];
      prev = k + 1;
    }
    col.total = uint64_t(bytes.before(next));
    merged(prev, next, end, col.total);
    out.maxTotal = std::max(out.maxTotal, col.total);
    out.columns.push_back(std::move(col));
  }
  return out;
}

std::optional<AllocatorKind> MemoryModel::allocatorKind() const {
  if (hasChunks_) return AllocatorKind::Vmm;
  if (hasSegments_) return AllocatorKind::Caching;
  if (events_.empty()) return std::nullopt;
  return AllocatorKind::Host;
}

const MemOp* MemoryModel::op(uint64_t seq) const {
  auto it = std::lower_bound(ops_.begin(), ops_.end(), seq,
                             [](const MemOp& a, uint64_t s) { return a.seq < s; });
  return it != ops_.end() && it->seq == seq ? &*it : nullptr;
}

const MemBuffer* MemoryModel::buffer(uint64_t bufferId) const {
  if (bufferId == 0) return nullptr;
  auto it = buffers_.find(bufferId);
  return it == buffers_.end() ? nullptr : &it->second;
}

const std::vector<storage::StackFrame>* MemoryModel::stack(int64_t id) const {
  auto it = stacks_.find(id);
  return it == stacks_.end() ? nullptr : &it->second;
}

// Note [Why alive]: the first rule that holds names why a live block at the cursor still exists.
//   1. its alloc event is tagged parameter -> "parameter"; optimizer_state -> "optimizer state";
//      data -> "input batch" (the engine tags these allocations with MemTagScope);
//   2. a forward op allocated it, that op has a recorded backward op, and the cursor is before
//      the last such backward op ended -> "saved for backward (op #S name)";
//   3. a later op's output views its buffer (same bufferId, another tensor id) and that op began
//      by the cursor -> "base of a view (op #S name)";
//   4. otherwise -> "held by a user reference" (a tensor the program still holds: an activation
//      kept by the caller, a gradient, a cached value).
// Times compare the cursor event's timeNs with the ops' begin/end times (one engine clock).
WhyAlive MemoryModel::whyAlive(const MemBlock& b, int64_t cursor) const {
  const storage::MemRecord& a = events_[b.allocEvent];
  if (a.tag == MemTag::Parameter) return {AliveReason::Parameter, 0, "parameter"};
  if (a.tag == MemTag::OptimizerState) return {AliveReason::OptimizerState, 0, "optimizer state"};
  if (a.tag == MemTag::Data) return {AliveReason::InputBatch, 0, "input batch"};
  const int64_t t =
      cursor >= 0 && size_t(cursor) < events_.size() ? events_[size_t(cursor)].timeNs : a.timeNs;
  auto opText = [](const MemOp& o) { return "op #" + std::to_string(o.seq) + " " + o.name; };
  if (const MemOp* o = a.opSeq ? op(a.opSeq) : nullptr;
      o && o->phase == Phase::Forward && o->backwardSeq && t < o->backwardEndNs)
    return {AliveReason::SavedForBackward, o->seq, "saved for backward (" + opText(*o) + ")"};
  if (const MemBuffer* buf = buffer(a.bufferId); buf && buf->viewOpSeq) {
    if (const MemOp* v = op(buf->viewOpSeq); v && v->beginNs <= t)
      return {AliveReason::ViewBase, v->seq, "base of a view (" + opText(*v) + ")"};
  }
  return {AliveReason::UserReference, 0, "held by a user reference"};
}

std::vector<MemAliveShare> MemoryModel::aliveByReason(int64_t k) const {
  static constexpr const char* kWhat[] = {"parameters",     "optimizer state",
                                          "input batch",    "saved for backward",
                                          "bases of views", "held by a user reference"};
  const MemState s = stateAt(k);
  std::map<AliveReason, MemAliveShare> by;
  for (const MemBlock& b : s.blocks) {
    const AliveReason r = whyAlive(b, k).reason;
    MemAliveShare& a = by[r];
    a.reason = r;
    a.what = kWhat[size_t(r)];
    a.bytes += b.bytes;
    a.blocks++;
  }
  std::vector<MemAliveShare> out;
  for (auto& [r, a] : by) out.push_back(std::move(a));
  std::stable_sort(out.begin(), out.end(), [](const MemAliveShare& x, const MemAliveShare& y) {
    return x.bytes > y.bytes;
  });
  return out;
}

std::vector<MemSiteShare> MemoryModel::aliveBySite(const MemState& s) const {
  std::unordered_map<std::string, std::pair<MemSiteShare, uint64_t>> by;  // and its largest block
  for (const MemBlock& b : s.blocks) {
    const storage::MemRecord& a = events_[b.allocEvent];
    std::string site;
    if (const MemOp* o = a.opSeq ? op(a.opSeq) : nullptr) {
      site = o->name + (o->scope.empty() ? "" : " (" + o->scope + ")");
    } else if (const auto* frames = a.stackId >= 0 ? stack(a.stackId) : nullptr;
               frames && !frames->empty()) {
      const storage::StackFrame& f = frames->front();
      site = (f.function.empty() ? std::string("??") : f.function);
      if (!f.file.empty()) {
        const size_t slash = f.file.find_last_of('/');
        site += " (" + (slash == std::string::npos ? f.file : f.file.substr(slash + 1)) + ":" +
                std::to_string(f.line) + ")";
      }
    } else if (a.label == storage::kLiveBefore) {
      site = "before the recording";
    } else {
      site = a.opSeq ? "op #" + std::to_string(a.opSeq) : "outside ops";
    }
    auto& [share, largest] = by[site];
    if (share.blocks == 0) share.site = site;
    share.bytes += b.bytes;
    if (share.blocks++ == 0 || b.bytes > largest) {
      share.largestAlloc = b.allocEvent;
      largest = b.bytes;
    }
  }
  std::vector<MemSiteShare> out;
  out.reserve(by.size());
  for (auto& [site, entry] : by) out.push_back(std::move(entry.first));
  std::sort(out.begin(), out.end(), [](const MemSiteShare& x, const MemSiteShare& y) {
    return x.bytes != y.bytes ? x.bytes > y.bytes : x.site < y.site;
  });
  return out;
}

std::vector<size_t> MemoryModel::blocksOfOp(const MemState& state, uint64_t seq) const {
  std::vector<size_t> out;
  const MemOp* o = op(seq);
  for (size_t i = 0; i < state.blocks.size(); ++i) {
    const storage::MemRecord& a = events_[state.blocks[i].allocEvent];
    bool mine = a.opSeq == seq;
    if (!mine && o && a.bufferId)
      mine = std::find(o->outputBuffers.begin(), o->outputBuffers.end(), a.bufferId) !=
             o->outputBuffers.end();
    if (mine) out.push_back(i);
  }
  return out;
}

std::optional<std::pair<size_t, size_t>> MemoryModel::opEvents(uint64_t seq) const {
  auto it = opEvents_.find(seq);
  if (it == opEvents_.end()) return std::nullopt;
  return it->second;
}

int64_t MemoryModel::lastEventBeforeOp(uint64_t seq) const {
  const MemOp* o = op(seq);
  if (!o) return -1;
  auto it = std::partition_point(events_.begin(), events_.end(), [&](const storage::MemRecord& e) {
    return e.timeNs <= o->beginNs;
  });
  return int64_t(it - events_.begin()) - 1;
}

std::vector<MemBucket> MemoryModel::histogram(const MemState& state) {
  std::map<int, MemBucket> byClass;
  for (const MemBlock& b : state.blocks) {
    const int lg = b.bytes ? int(std::bit_width(b.bytes)) - 1 : 0;
    MemBucket& k = byClass[lg];
    k.log2 = lg;
    k.count++;
    k.bytes += b.bytes;
  }
  std::vector<MemBucket> out;
  if (byClass.empty()) return out;
  for (int lg = byClass.begin()->first; lg <= byClass.rbegin()->first; ++lg) {
    auto it = byClass.find(lg);
    out.push_back(it == byClass.end() ? MemBucket{lg, 0, 0} : it->second);
  }
  return out;
}

// ---- layout ----

MemLayout layoutMemory(const MemState& state, MemScale scale) {
  MemLayout L;
  auto length = [scale](uint64_t bytes) -> uint64_t {
    if (scale == MemScale::Linear) return std::max<uint64_t>(bytes, 1);
    return 16 * uint64_t(std::bit_width(std::max<uint64_t>(bytes, 256) >> 8));
  };
  bool newSpan = true;
  auto add = [&](MemPiece::Kind kind, uint64_t address, uint64_t bytes, int64_t block,
                 bool inSegment) {
    if (bytes == 0) return;
    MemPiece p;
    p.kind = kind;
    p.address = address;
    p.bytes = bytes;
    p.block = block;
    p.offset = L.total;
    p.length = length(bytes);
    p.gapBefore = newSpan && !L.pieces.empty();
    p.inSegment = inSegment;
    if (newSpan) L.spans++;
    newSpan = false;
    L.total += p.length;
    L.pieces.push_back(p);
  };

  // Runs of touching segments with the same mapping state.
  struct Run {
    uint64_t a0, a1;
    bool mapped;
    bool touchesPrev;
  };
  std::vector<Run> runs;
  for (const MemSegment& g : state.segments) {
    if (!runs.empty() && runs.back().a1 == g.address && runs.back().mapped == g.mapped) {
      runs.back().a1 = g.address + g.bytes;
      continue;
    }
    const bool touches = !runs.empty() && runs.back().a1 == g.address;
    runs.push_back(Run{g.address, g.address + g.bytes, g.mapped, touches});
  }
  // Which blocks lie in a mapped run.
  std::vector<bool> inside(state.blocks.size(), false);
  size_t bi = 0;
  for (const Run& r : runs) {
    if (!r.touchesPrev) newSpan = true;
    while (bi < state.blocks.size() && state.blocks[bi].address < r.a0) ++bi;
    if (!r.mapped) {
      add(MemPiece::Kind::Unmapped, r.a0, r.a1 - r.a0, -1, true);
      continue;
    }
    uint64_t at = r.a0;
    while (bi < state.blocks.size() && state.blocks[bi].address < r.a1) {
      const MemBlock& b = state.blocks[bi];
      if (b.address > at) add(MemPiece::Kind::Free, at, b.address - at, -1, true);
      add(MemPiece::Kind::Block, b.address, b.bytes, int64_t(bi), true);
      inside[bi] = true;
      at = std::max(at, b.address + b.bytes);
      ++bi;
    }
    if (at < r.a1) add(MemPiece::Kind::Free, at, r.a1 - at, -1, true);
  }
  // Blocks outside every segment: compactly by address, each gap elided.
  uint64_t prevEnd = 0;
  bool first = true;
  for (size_t i = 0; i < state.blocks.size(); ++i) {
    if (inside[i]) continue;
    const MemBlock& b = state.blocks[i];
    if (first || b.address != prevEnd) newSpan = true;
    first = false;
    add(MemPiece::Kind::Block, b.address, b.bytes, int64_t(i), false);
    prevEnd = b.address + b.bytes;
    L.blocksOutside++;
  }
  return L;
}

// ---- loading ----

MemoryModel loadMemoryModel(const storage::Recording& rec) {
  MemoryModel m;
  std::vector<storage::MemRecord> events = rec.memEvents({});
  if (events.empty()) return m;  // nothing to explain: skip reading the ops
  std::vector<int64_t> steps{0};
  for (const storage::StepRecord& s : rec.steps())
    if (s.step != 0) steps.push_back(s.step);
  for (int64_t s : steps) m.addOps(rec.stepOps(s));
  std::set<int64_t> stackIds;
  for (const storage::MemRecord& e : events)
    if (e.stackId >= 0) stackIds.insert(e.stackId);
  for (int64_t id : stackIds)
    if (auto s = rec.stack(id)) m.addStack(*s);
  m.setEvents(std::move(events));
  return m;
}

}  // namespace keel::analysis
