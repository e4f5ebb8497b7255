// PyTorch memory snapshots as recordings (keel/storage/torch_memory.h).
#include "keel/storage/torch_memory.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "keel/base/text.h"
#include "keel/storage/errors.h"
#include "keel/storage/writer.h"
#include "pickle.h"

namespace keel::storage {

// Note [Torch memory snapshots]
// What torch.cuda.memory._snapshot() returns in PyTorch 2.x, and _dump_snapshot() pickles, is a
// dict:
//   segments:      [{device, address, total_size, blocks: [{address?, size, state, frames}], ...}]
//   device_traces: [[{action, addr, size, frames, time_us?, ...}, ...] per device]
// (frames: [{filename, line, name}], innermost first; PyTorch shares one dict per distinct frame
// between all the stacks that contain it, so a pickle fetches it from its memo.) PyTorch 1.13
// has no _dump_snapshot and no trace: its _snapshot() returns the segments list alone (as 2.x's
// torch.cuda.memory_snapshot() does), which users pickle themselves. Its blocks have no address
// (a block starts where the one before it in its segment ends) and no frames but a "history"
// (2.0's blocks have it too): [{addr, real_size, frames?}], the allocations made in the block
// still recorded, in address order — a live block's own first, at its address, then older ones
// freed in the rest of it. Such a list reads as a snapshot with an empty trace. A snapshot's
// segments are the allocator's state when it was taken, its trace the events that led there;
// a Keel recording is a sequence of events from nothing. So:
// - the state the trace starts from is the snapshot's state with the trace undone, newest first
//   (an alloc's block removed, a completed free's block put back, the same for segments); it
//   becomes `reserve` events for its segments and `alloc` events for its live blocks (active
//   allocated or pending free), in address order;
// - then each trace entry in order: segment_alloc and segment_map -> reserve, segment_free and
//   segment_unmap -> release, alloc -> alloc, free_completed -> free. free_requested (the block
//   is not yet free: a stream still uses it), snapshot and oom change nothing and are skipped;
// - an event's stack is its entry's frames; its time is time_us where the entry has it (kept
//   increasing: an event without one, or out of order, is 1 ns after the one before).
// A snapshot has no training steps: its events are step 0, and it has no loss to show.
// The trace is streamed: the reader's append hook turns each batch of entries into compact events
// as it arrives (the entries themselves are freed), so what is held is the segments, the shared
// frames and 40 bytes per event — a 2 GB, 5,000,000-event snapshot is not 2 GB of objects.

namespace {

using pickle::Kind;
using pickle::Value;

[[noreturn]] void damaged(const std::string& name, const std::string& what) {
  throw StorageError(name + ": not a PyTorch memory snapshot: " + what);
}

// Interns frames and stacks: a frame dict the pickle shares (held by its memo for the whole
// read) is converted once.
class StackTable {
 public:
  explicit StackTable(std::string name) : name_(std::move(name)) {}

  int64_t intern(const Value* frames) {
    if (!frames || !frames->isList()) return -1;
    // PyTorch gives one list per distinct traceback, shared by every entry (and block) with it:
    // converted once, then its items dropped and its stack id kept in the node.
    pickle::Node* shared = frames->node && frames->node->memo >= 0 ? frames->node.get() : nullptr;
    if (shared && shared->tag >= 0) return shared->tag;
    const int64_t id = internFrames(frames);
    if (shared) {
      shared->tag = id;
      shared->dropItems();
    }
    return id;
  }

  std::vector<StackRecord> take() { return std::move(records_); }

 private:
  int64_t internFrames(const Value* frames) {
    if (frames->items().empty()) return -1;
    std::string key;
    key.reserve(frames->items().size() * 4);
    for (const Value& f : frames->items()) {
      const uint32_t id = frame(f);
      key.append(reinterpret_cast<const char*>(&id), sizeof id);
    }
    auto [it, added] = stacks_.try_emplace(std::move(key), int64_t(records_.size()) + 1);
    if (added) {
      StackRecord s;
      s.id = it->second;
      const std::string& k = it->first;
      for (size_t p = 0; p < k.size(); p += sizeof(uint32_t)) {
        uint32_t id;
        std::memcpy(&id, k.data() + p, sizeof id);
        s.frames.push_back(frames_[id]);
      }
      records_.push_back(std::move(s));
    }
    return it->second;
  }

  uint32_t frame(const Value& f) {
    // A frame the pickle shares is held by its memo for the whole read: converted once, its
    // frame id kept in the node (only dicts are tagged with frame ids; lists with stack ids).
    if (!f.isDict()) damaged(name_, "a stack frame that is not a dict");
    pickle::Node* shared = f.node->memo >= 0 ? f.node.get() : nullptr;
    if (shared && shared->tag >= 0) return uint32_t(shared->tag);
    StackFrame sf;
    if (const Value* v = f.get("name")) sf.function = std::string(v->str());
    if (const Value* v = f.get("filename")) sf.file = std::string(v->str());
    if (const Value* v = f.get("line"); v && v->isInt())
      sf.line = int32_t(std::clamp<int64_t>(v->i, 0, INT32_MAX));
    std::string key = sf.function + '\0' + sf.file + '\0' + std::to_string(sf.line);
    auto [it, added] = byText_.try_emplace(std::move(key), uint32_t(frames_.size()));
    if (added) frames_.push_back(std::move(sf));
    if (shared) shared->tag = it->second;
    return it->second;
  }

  std::string name_;
  std::vector<StackFrame> frames_;
  std::unordered_map<std::string, uint32_t> byText_;
  std::unordered_map<std::string, int64_t> stacks_;
  std::vector<StackRecord> records_;
};

// Which trace list the list at stack[q] is, from what lies below it (Note [Torch memory
// snapshots]): the value of the top-level key "device_traces" is an outer list whose items are
// on the stack above it — after a MARK when it has more than one, directly otherwise.
//   [... "device_traces", outer, MARK, trace0, ..., traceK]   -> device K
//   [... "device_traces", outer, trace0]                        -> device 0
bool deviceOfTraceList(const std::vector<Value>& st, size_t q, size_t& device) {
  auto isKey = [&](size_t k) { return st[k].isStr() && st[k].str() == "device_traces"; };
  if (q >= 2 && st[q - 1].kind == Kind::List && isKey(q - 2)) {
    device = 0;
    return true;
  }
  size_t m = q;
  while (m > 0 && st[m - 1].kind == Kind::List) --m;
  if (m == 0 || st[m - 1].kind != Kind::Mark) return false;
  const size_t mark = m - 1;
  if (mark < 2 || st[mark - 1].kind != Kind::List || !isKey(mark - 2)) return false;
  device = q - mark - 1;
  return true;
}

int64_t intOf(const Value* v) {
  return v && v->isInt() ? v->i : -1;
}

// The frames of a live block's own allocation in a PyTorch 1.13 or 2.0 block "history" (Note
// [Torch memory snapshots]): the entry at the block's address, which PyTorch puts first; the
// entries after it are older allocations in the rest of the block, freed since.
const Value* allocationFrames(const Value* history, uint64_t address) {
  if (!history || !history->isList() || history->items().empty()) return nullptr;
  for (const Value& h : history->items())
    if (h.isDict() && intOf(h.get("addr")) == int64_t(address)) return h.get("frames");
  return history->items().front().get("frames");
}

struct Reading {
  std::string name;
  int device = 0;
  StackTable stacks;
  std::vector<TorchMemorySnapshot::Event> trace;
  uint64_t entries = 0;
  std::vector<bool> devicesWithTrace;

  void take(size_t dev, std::vector<Value>& items) {
    if (devicesWithTrace.size() <= dev) devicesWithTrace.resize(dev + 1);
    if (!items.empty()) devicesWithTrace[dev] = true;
    if (dev != size_t(device)) return;
    for (const Value& e : items) {
      const uint64_t n = entries++;
      if (!e.isDict())
        damaged(name, "trace entry " + std::to_string(n) + " of device " + std::to_string(dev) +
                          " is not a dict");
      const Value* action = e.get("action");
      if (!action || !action->isStr())
        damaged(name, "trace entry " + std::to_string(n) + " has no action");
      const std::string_view a = action->str();
      MemEventKind kind;
      if (a == "alloc")
        kind = MemEventKind::Alloc;
      else if (a == "free_completed")
        kind = MemEventKind::Free;
      else if (a == "segment_alloc" || a == "segment_map")
        kind = MemEventKind::Reserve;
      else if (a == "segment_free" || a == "segment_unmap")
        kind = MemEventKind::Release;
      else if (a == "oom")  // its addr is the device's free memory, its size the request
        kind = MemEventKind::Oom;
      else
        continue;  // free_requested, snapshot, and kinds newer than this reader
      // What is wrong with which field: missing, not an integer, or negative.
      auto field = [&](const char* key) {
        const std::string entry = "trace entry " + std::to_string(n) + " (" + std::string(a) + ")";
        const Value* v = e.get(key);
        if (!v) damaged(name, entry + " has no " + key);
        if (!v->isInt()) damaged(name, entry + ": its " + key + " is not an integer");
        if (v->i < 0)
          damaged(name, entry + ": its " + key + " is negative (" + std::to_string(v->i) + ")");
        return v->i;
      };
      const int64_t addr = field("addr"), size = field("size");
      if (uint64_t(size) > kMaxMemEventBytes)
        damaged(name, "trace entry " + std::to_string(n) + " (" + std::string(a) + ") claims " +
                          std::to_string(size) + " bytes, more than 16 TiB");
      TorchMemorySnapshot::Event ev;
      ev.kind = kind;
      if (kind == MemEventKind::Oom)
        ev.deviceFree = uint64_t(addr);
      else
        ev.address = uint64_t(addr);
      ev.bytes = uint64_t(size);
      ev.stackId = stacks.intern(e.get("frames"));
      ev.timeUs = std::max<int64_t>(0, intOf(e.get("time_us")));
      trace.push_back(ev);
    }
  }
};

// An imported oom event's label: the device's free memory when PyTorch refused the request.
std::string deviceFreeLabel(uint64_t bytes) {
  return "device free " + std::to_string(bytes) + " bytes";
}

struct Block {
  uint64_t bytes;
  int64_t stackId;
};

// The live allocated and reserved bytes stay within ±1 PiB through the events (each at most
// 16 TiB, so neither these sums nor the writer's can wrap): a snapshot claiming more is damaged,
// not a peak of "4194304 TiB" in a recording the reader then refuses.
void checkLiveTotals(const TorchMemorySnapshot& s, const std::string& name) {
  constexpr int64_t kMaxLive = int64_t(1) << 50;
  int64_t allocated = 0, reserved = 0;
  auto step = [&](const TorchMemorySnapshot::Event& e) {
    const int64_t b = int64_t(e.bytes);
    if (e.kind == MemEventKind::Alloc) allocated += b;
    if (e.kind == MemEventKind::Free) allocated -= b;
    if (e.kind == MemEventKind::Reserve) reserved += b;
    if (e.kind == MemEventKind::Release) reserved -= b;
    if (allocated > kMaxLive || reserved > kMaxLive)
      damaged(name, "its live blocks or segments add up to more than 1 PiB");
    if (allocated < -kMaxLive || reserved < -kMaxLive)
      damaged(name, "it frees over 1 PiB more than it allocates");
  };
  for (const auto& e : s.initial) step(e);
  for (const auto& e : s.trace) step(e);
}

}  // namespace

TorchMemorySnapshot readTorchMemorySnapshot(std::FILE* file, uint64_t size, const std::string& name,
                                            const TorchMemoryReadOptions& options) {
  if (options.device < 0)
    throw StorageError("device " + std::to_string(options.device) + ": must be ≥ 0");
  Reading r{name, options.device, StackTable(name), {}, 0, {}};
  pickle::Limits limits;
  limits.maxBytes = options.maxBytes;
  pickle::Reader reader(file, size, name, limits);
  Value top;
  try {
    top = reader.load([&](const std::vector<Value>& st, size_t q, std::vector<Value>& items) {
      size_t dev = 0;
      if (!deviceOfTraceList(st, q, dev)) return false;
      r.take(dev, items);
      return true;
    });
  } catch (const pickle::PickleError& e) {
    throw StorageError(e.what());
  }
  // PyTorch 2.x: {"segments": [...], "device_traces": [...]}; 1.13: the segments list alone.
  const Value* segmentsList = &top;
  if (top.isDict()) {
    segmentsList = top.get("segments");
    if (!segmentsList) damaged(name, "it has no 'segments'");
    if (!segmentsList->isList()) damaged(name, "'segments' is not a list");
    if (const Value* traces = top.get("device_traces"); traces && !traces->isList())
      damaged(name, "'device_traces' is not a list");
  } else if (!top.isList()) {
    damaged(name, "the pickle holds neither a dict nor a list of segments");
  } else if (!top.items().empty() && !top.items().front().isDict()) {
    damaged(name, "the pickle holds a list, but not of segments (dicts)");
  }
  const Value& segments = *segmentsList;

  TorchMemorySnapshot out;
  out.device = options.device;
  std::map<uint64_t, uint64_t> segs;  // address -> bytes
  std::map<uint64_t, Block> blocks;   // address -> live block
  std::vector<bool> devices = r.devicesWithTrace;
  for (const Value& seg : segments.items()) {
    if (!seg.isDict()) damaged(name, "a segment that is not a dict");
    const int64_t dev = seg.get("device") ? intOf(seg.get("device")) : 0;
    const int64_t base = intOf(seg.get("address")), total = intOf(seg.get("total_size"));
    if (dev < 0 || dev > 65535 || base < 0 || total < 0)
      damaged(name, "a segment without a device, an address or a total_size");
    if (uint64_t(total) > kMaxMemEventBytes)
      damaged(name, "a segment of " + std::to_string(total) + " bytes, more than 16 TiB");
    if (devices.size() <= size_t(dev)) devices.resize(size_t(dev) + 1);
    devices[size_t(dev)] = true;
    if (dev != options.device) continue;
    ++out.segments;
    segs[uint64_t(base)] = uint64_t(total);
    uint64_t addr = uint64_t(base);
    const Value* bl = seg.get("blocks");
    for (const Value& b : bl ? bl->items() : std::vector<Value>{}) {
      if (!b.isDict()) damaged(name, "a block that is not a dict");
      const int64_t bytes = intOf(b.get("size"));
      if (bytes < 0) damaged(name, "a block without a size");
      if (uint64_t(bytes) > kMaxMemEventBytes)
        damaged(name, "a block of " + std::to_string(bytes) + " bytes, more than 16 TiB");
      if (const int64_t a = intOf(b.get("address")); a >= 0) addr = uint64_t(a);
      const Value* state = b.get("state");
      const std::string_view s = state ? state->str() : std::string_view();
      if (s == "active_allocated" || s == "active_pending_free") {
        const Value* frames = b.get("frames");
        if (!frames) frames = allocationFrames(b.get("history"), addr);
        blocks[addr] = {uint64_t(bytes), r.stacks.intern(frames)};
      }
      addr += uint64_t(bytes);
    }
  }
  for (size_t d = 0; d < devices.size(); ++d)
    if (devices[d]) out.devices.push_back(int(d));
  if (out.segments == 0 && r.trace.empty() && r.entries == 0) {
    std::string present;
    for (int d : out.devices) present += (present.empty() ? "" : ", ") + std::to_string(d);
    throw StorageError(
        name + ": the snapshot has no memory of device " + std::to_string(options.device) +
        (present.empty() ? std::string(" (it is empty)") : " (devices in it: " + present + ")"));
  }

  // The state before the trace: the snapshot's, with the trace undone newest first.
  for (auto it = r.trace.rbegin(); it != r.trace.rend(); ++it) {
    switch (it->kind) {
      case MemEventKind::Alloc:
        blocks.erase(it->address);
        break;
      case MemEventKind::Free:
        blocks[it->address] = {it->bytes, it->stackId};
        break;
      case MemEventKind::Reserve:
        if (segs.erase(it->address) == 0) {
          // segment_map into an expandable segment: the segment was that much smaller
          auto s = segs.upper_bound(it->address);
          if (s != segs.begin() && (--s, it->address < s->first + s->second))
            s->second -= std::min(s->second, it->bytes);
        }
        break;
      case MemEventKind::Release:
        segs[it->address] = it->bytes;
        break;
      default:
        break;
    }
  }
  for (const auto& [addr, bytes] : segs)
    out.initial.push_back({MemEventKind::Reserve, addr, bytes, -1, 0});
  for (const auto& [addr, b] : blocks)
    out.initial.push_back({MemEventKind::Alloc, addr, b.bytes, b.stackId, 0});
  out.trace = std::move(r.trace);
  out.traceEntries = r.entries;
  out.stacks = r.stacks.take();
  checkLiveTotals(out, name);
  return out;
}

namespace {
TorchMemorySnapshot readSnapshotFile(const std::string& path, const std::string& name,
                                     const TorchMemoryReadOptions& options) {
  requireRegularFile(path, "the memory snapshot");  // a FIFO would block, /dev/zero never end
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw StorageError(name + ": cannot open: " + std::strerror(errno));
  if (std::fseek(f.get(), 0, SEEK_END) != 0)
    throw StorageError(name + ": not a regular file (cannot seek)");
  const long size = std::ftell(f.get());
  if (size < 0 || std::fseek(f.get(), 0, SEEK_SET) != 0)
    throw StorageError(name + ": not a regular file (cannot seek)");
  return readTorchMemorySnapshot(f.get(), uint64_t(size), name, options);
}
}  // namespace

TorchMemorySnapshot readTorchMemorySnapshot(const std::string& path,
                                            const TorchMemoryReadOptions& options) {
  return readSnapshotFile(path, path, options);
}

TorchMemoryWritten writeTorchMemoryRecording(const TorchMemorySnapshot& snapshot,
                                             const std::string& path,
                                             const std::string& engineVersion,
                                             const std::string& source) {
  RunInfo run;
  run.backend = "torch";
  run.device = "cuda:" + std::to_string(snapshot.device);
  // Whose events these are (keel inspect said "unknown", keel memory stats guessed "caching", or
  // "host" for a snapshot without segments).
  run.allocator = std::string(kTorchAllocatorName);
  run.host = "(imported)";
  run.configJson = "{}";
  run.engineVersion = engineVersion;
  run.startTimeUnixNs = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  run.captureOptionsJson = nlohmann::json{
      {"framework", "torch"},
      {"imported", "memory snapshot"},
      {"source", source}}.dump();
  std::unique_ptr<Writer> w = Writer::create(path, run);
  for (const StackRecord& s : snapshot.stacks) w->writeStack(s);

  TorchMemoryWritten out;
  int64_t allocated = 0, reserved = 0, clock = 0;
  MemRecord m;
  m.device = run.device;
  auto emit = [&](const TorchMemorySnapshot::Event& e) {
    const int64_t b = int64_t(std::min<uint64_t>(e.bytes, uint64_t(INT64_MAX) / 4));
    switch (e.kind) {
      case MemEventKind::Alloc:
        allocated += b;
        break;
      case MemEventKind::Free:
        allocated -= b;
        break;
      case MemEventKind::Reserve:
        reserved += b;
        break;
      case MemEventKind::Release:
        reserved -= b;
        break;
      default:
        break;
    }
    const int64_t t = e.timeUs > 0 && e.timeUs < INT64_MAX / 1000 ? e.timeUs * 1000 : 0;
    clock = std::max(clock + 1, t);
    m.kind = e.kind;
    m.address = e.address;
    m.bytes = e.bytes;
    m.stackId = e.stackId;
    m.label = e.kind == MemEventKind::Oom ? deviceFreeLabel(e.deviceFree) : std::string();
    m.timeNs = clock;
    m.allocatedAfter = uint64_t(std::max<int64_t>(allocated, 0));
    m.reservedAfter = uint64_t(std::max<int64_t>(reserved, 0));
    out.peakAllocated = std::max(out.peakAllocated, m.allocatedAfter);
    out.peakReserved = std::max(out.peakReserved, m.reservedAfter);
    w->writeMem(m);
    if (++out.events % 250000 == 0) w->commit();
  };
  for (const auto& e : snapshot.initial) emit(e);
  for (const auto& e : snapshot.trace) emit(e);
  out.endAllocated = uint64_t(std::max<int64_t>(allocated, 0));
  out.endReserved = uint64_t(std::max<int64_t>(reserved, 0));
  w->setRunStatus("finished");
  w->close();
  return out;
}

TorchMemoryImported importTorchMemorySnapshot(const std::string& snapshot,
                                              const std::string& output,
                                              const TorchMemoryImportOptions& options) {
  std::vector<NamedInput> inputs = options.otherInputs;
  inputs.push_back({"the snapshot", snapshot});
  checkOutputPath(options.outputOption, output, inputs);
  checkReplacesOnlyARecording(options.outputOption, output);
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  const auto t0 = Clock::now();
  const std::string name = options.sourceName.empty() ? snapshot : options.sourceName;
  const TorchMemorySnapshot snap = readSnapshotFile(snapshot, name, options.read);
  const auto t1 = Clock::now();
  TorchMemoryImported out;
  out.device = snap.device;
  for (const auto& e : snap.initial)
    ++(e.kind == MemEventKind::Reserve ? out.segmentsAtStart : out.blocksAtStart);
  out.traceEntries = snap.traceEntries;
  out.traceEvents = snap.trace.size();
  for (const auto& e : snap.trace) out.ooms += e.kind == MemEventKind::Oom;
  out.stacks = snap.stacks.size();
  OutputLock lock(output);
  ReplaceOnCommit file(output);
  out.written = writeTorchMemoryRecording(snap, file.path(), options.engineVersion, name);
  file.commit();
  out.readSeconds = seconds(t1 - t0);
  out.writeSeconds = seconds(Clock::now() - t1);
  return out;
}

}  // namespace keel::storage
