// Internals shared by the FlexCheckpoint sources: read-item geometry (recomputed from a compact
// plan, see Note [Compact plans]), the source/sink seams of the executor, and path helpers.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "keel/base/output_path.h"
#include "keel/checkpoint.h"

namespace keel::ckpt::detail {

using Arr = std::array<int64_t, st::kMaxRank>;

// Where one read item's elements come from and go to.
struct ItemGeom {
  size_t rank = 0;
  Arr srcLocal{};  // offset in the source shard (source axes)
  Arr len{};       // extent (source axes)
  Arr dstLocal{};  // offset in the target shard (target axes)
  uint64_t volume() const {
    uint64_t v = 1;
    for (size_t a = 0; a < rank; ++a) v *= uint64_t(len[a]);
    return v;
  }
};

// A key stored as one whole shard at bytes [begin, end) of file 0.
inline KeyInfo wholeKey(std::string key, st::DType dtype, const Dims& shape, uint64_t begin,
                        uint64_t end) {
  KeyInfo k;
  k.key = std::move(key);
  k.dtype = dtype;
  k.shape = shape;
  ShardInfo s;
  s.offset.assign(shape.size(), 0);
  s.shape = shape;
  s.begin = begin;
  s.end = end;
  k.shards.push_back(std::move(s));
  return k;
}

// Computes the geometry of item `it` of a target shard with box (tOff, tShape). Returns false
// when the boxes do not intersect (never for items the planner emitted).
bool itemGeometry(const aoa::Piece& piece, const ShardInfo& shard, const Dims& tOff,
                  const Dims& tShape, ItemGeom& g);

// Byte source of the executor: a checkpoint's files, or tensors in memory.
class Source {
 public:
  virtual ~Source() = default;
  // Reads n bytes at byte `at` of shard `shard` of source key `key`.
  virtual void read(uint32_t key, uint32_t shard, uint64_t at, void* dst, size_t n) const = 0;
  // Reads the contiguous bytes from `at` into the spans in order.
  virtual void readv(uint32_t key, uint32_t shard, uint64_t at, const st::Reader::Span* spans,
                     size_t count) const = 0;
  // The file descriptor and absolute offset of a shard's bytes, when they are in a file.
  virtual bool fileRange(uint32_t key, uint32_t shard, int& fd, uint64_t& base) const {
    return false;
  }
};

// Byte sink: where a target shard's bytes go.
class Sink {
 public:
  virtual ~Sink() = default;
  // A destination for shard i of the plan, or null to have the executor provide a buffer and
  // call commit with it.
  virtual void* direct(size_t shard) = 0;
  virtual void commit(size_t shard, const void* data, size_t n) = 0;
  // The file descriptor and absolute offset of shard i's bytes, when they go to a file.
  virtual bool fileRange(size_t shard, int& fd, uint64_t& base) { return false; }
};

// Runs the plan: fills every target shard from the source through the sink. Returns the bytes
// read from the source.
uint64_t execute(const Plan& plan, const Metadata& src, const Source& source, Sink& sink,
                 const ConvertOptions& opt);

// Builds the plan for an already-evaluated target key list.
Plan planFor(const Metadata& src, aoa::Result target, const TargetSpec& spec, bool needShapes);

// Source keys as the AOA evaluator sees them.
std::vector<aoa::SourceKey> sourceKeys(const Metadata& m);

// "<path> is a file, not a checkpoint (a step-* folder, or a --ckpt-dir holding them)": what
// --resume says of a plain file, and (safetensorsToo: ", or a .safetensors file") keel ckpt.
std::string notACheckpointText(const std::string& path, bool safetensorsToo);
// "<path> is a FIFO, not a regular file (a checkpoint is ...)": a FIFO, a device or a socket
// given as a checkpoint (`kind` from keel::nonRegularKind); it said "no such checkpoint".
std::string nonRegularText(const std::string& path, const std::string& kind);
// Throws keel::Error naming the folder when `path` is a checkpoint's keel-checkpoint.json (the
// folder is what to give); returns otherwise.
void checkNotMetadataFile(const std::string& path);

std::string fileName(int rank, int ranks);  // "model-00000-of-00004.safetensors"

using StopFn = std::function<bool()>;
// Throws keel::Error when `stop` is set and returns true (ConvertOptions::stop).
void throwIfStopped(const StopFn& stop);

// Writes dir/keel-checkpoint.json (beside, then renamed into place), with each of m's files' MD5
// when `digests` (Note [Checkpoint file digests]); `stop` is polled between MD5 blocks.
void writeMetadata(const std::string& dir, Metadata m, bool digests, const StopFn& stop = {});
// The MD5 (hex) of a whole file; `stop` is polled between blocks.
std::string fileMd5(const std::string& path, const StopFn& stop = {});

// A new checkpoint folder being written (Note [Outputs left as found]): locks it, makes the
// folders above it, and checks it is absent or empty; unless keep() is called, destruction
// removes what was made (the folder, or what it holds when it was there empty, and the folders
// above it that were made).
class NewDir {
 public:
  explicit NewDir(const std::string& dir);
  ~NewDir();
  NewDir(const NewDir&) = delete;
  NewDir& operator=(const NewDir&) = delete;
  void keep() { kept_ = true; }

 private:
  void removeMadeParents();
  std::string dir_;
  std::vector<std::string> madeParents_;  // deepest first
  std::unique_ptr<OutputLock> lock_;
  bool existed_ = false, kept_ = false;
};

}  // namespace keel::ckpt::detail
