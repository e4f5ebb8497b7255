// FlexCheckpoint: sharded checkpoints as one safetensors file per rank plus one JSON metadata
// file, resharding between tensor-parallel layouts (with AOA rules) by an interval join over
// shard boxes, and bounded-memory byte-range reads. Invariants: every key is described from a
// single-device point of view (global shape, and per shard its global offset and local shape);
// a plan is complete and validated before any byte is written; peak memory of a conversion is
// (largest target shard + staging buffer) per thread. Format, rules and guarantees:
// docs/checkpoint.md.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "keel/aoa.h"
#include "keel/safetensors.h"

namespace keel {
class Trainer;
}

namespace keel::ckpt {

using Dims = std::vector<int64_t>;

inline constexpr const char* kMetadataFile = "keel-checkpoint.json";
inline constexpr const char* kFormatName = "keel-flexcheckpoint";
inline constexpr int kFormatVersion = 1;

// One saved shard of a key: the box [offset, offset + shape) of the global tensor, stored as the
// tensor named `tensor` (empty: like the key) in files[file], at absolute bytes [begin, end) of
// that file. A file holds several boxes of one key when a rank's part is not one box (a fused
// q/k/v weight's three blocks: Note [Multi-rank checkpoints]).
struct ShardInfo {
  Dims offset, shape;
  int64_t replica = 0;  // which replica was written (the rank whose copy it is)
  uint32_t file = 0;
  uint64_t begin = 0, end = 0;
  std::string tensor;
};

struct KeyInfo {
  std::string key;
  st::DType dtype = st::DType::F32;
  Dims shape;
  int splitAxis = -1;  // informational: the axis the shards split, -1 when whole/replicated
  std::vector<ShardInfo> shards;
};

struct Metadata {
  std::vector<std::string> files;  // file names relative to the checkpoint directory
  // Note [Checkpoint file digests]: the MD5 (32 hex digits) of each file's bytes, as `md5sum`
  // prints it, written with the metadata; empty in checkpoints saved before them.
  std::vector<std::string> fileMd5;
  std::vector<KeyInfo> keys;
  std::string trainState;  // JSON object text (training progress), or empty
  const KeyInfo* find(std::string_view key) const;
};

std::string metadataToJson(const Metadata& m);
// Parses and validates metadata on its own: types, ranks, file indices and names, shards inside
// the global shape that tile it exactly (no gap, no overlap). Throws keel::Error naming `source`.
Metadata metadataFromJson(std::string_view text, const std::string& source);
// The most bytes of metadata a checkpoint's keel-checkpoint.json may hold.
inline constexpr uint64_t kMaxMetadataBytes = uint64_t(256) << 20;
// The tiling check alone (shards inside the key's shape, no overlap, no gap).
void checkTiling(const KeyInfo& k, const std::string& source);

// An opened checkpoint: a directory with keel-checkpoint.json, or a single .safetensors file
// (every tensor one whole shard). Opening reads every file header and checks that the metadata
// agrees with the shards (dtype, shape, byte range).
class Checkpoint {
 public:
  static Checkpoint open(const std::string& path);
  const Metadata& metadata() const { return meta_; }
  const std::string& path() const { return path_; }
  const st::Reader& reader(uint32_t file) const { return *readers_.at(file); }
  uint64_t totalBytes() const;
  // Reads every file and checks it against its MD5 in the metadata (Note [Checkpoint file
  // digests]), `threads` files at a time; throws keel::Error naming the file that changed since
  // it was saved (the first in file order), or when `stop` returns true (polled between blocks).
  // Returns the number of files checked (0: the checkpoint has no digests, a lone .safetensors
  // file).
  size_t verifyFiles(int threads = 1, const std::function<bool()>& stop = {}) const;

 private:
  std::string path_;
  Metadata meta_;
  std::vector<std::shared_ptr<st::Reader>> readers_;
};

// ---- sharding ------------------------------------------------------------------------------

// The split axis of a key under tensor parallelism, or -1 for replicated. See Note [TP sharding].
using AxisRule = std::function<int(const std::string& key, const Dims& shape)>;
int tensorParallelAxis(const std::string& key, const Dims& shape);
// Part `part` of `parts` along one axis: sizes differ by at most one, larger parts first.
void splitRange(int64_t size, int parts, int part, int64_t& offset, int64_t& length);

struct TargetSpec {
  int tp = 1;
  AxisRule axis = tensorParallelAxis;
};

// ---- planning ------------------------------------------------------------------------------

// One target shard and the source pieces that feed it. The boxes are recomputed from the indices
// when executing or printing (Note [Compact plans]).
struct TargetShard {
  uint32_t key = 0;   // index into Plan::target.keys
  uint32_t file = 0;  // target file (rank)
  uint32_t part = 0;  // part index along the split axis (0 when whole)
  uint64_t firstItem = 0;
  uint32_t numItems = 0;
  uint64_t bytes = 0;  // size of the target shard
};

struct ReadItem {
  uint32_t piece = 0;  // index into the target key's pieces
  uint32_t shard = 0;  // index into the source key's shards
};

struct Plan {
  aoa::Result target;
  int tp = 1;
  std::vector<int> axis;            // per target key: split axis, -1 when whole
  std::vector<TargetShard> shards;  // grouped by file, keys in target order within a file
  std::vector<ReadItem> items;      // per shard, consecutive
  uint64_t bytesWritten = 0;        // sum of target shard sizes
  uint64_t bytesRead = 0;           // source bytes the items cover
  uint64_t maxShardBytes = 0;
  // Box of a target shard (global offset and shape).
  void shardBox(const TargetShard& s, Dims& offset, Dims& shape) const;
};

// Plans the conversion of `src` through the rules into the target layout. Validates everything
// (rules, declared shapes) and throws keel::Error before anything is written.
Plan makePlan(const Metadata& src, const aoa::Program* rules, const TargetSpec& spec);
// Human-readable plan: per target file and shard, the source file ranges that feed it.
std::string describePlan(const Plan& plan, const Metadata& src, size_t maxItemsPerShard = 8);

// ---- execution -----------------------------------------------------------------------------

struct ConvertOptions {
  int threads = 1;
  size_t stagingBytes = size_t(64) << 20;
  // Record each written file's MD5 in the metadata (Note [Checkpoint file digests]): one more
  // pass over the files at ~0.7 GB/s a file, so off for conversions unless asked for (keel ckpt
  // convert --md5) and on for training checkpoints.
  bool fileDigests = false;
  // convert() first checks the source's files against the MD5s its metadata records (Note
  // [Checkpoint file digests]) and refuses a changed one before anything is written: it reads
  // every byte anyway, and a converted copy of a damaged file would pass for a good one. A
  // source without digests (a lone .safetensors file, an older checkpoint) is converted as is.
  bool verifySource = true;
  // Polled between target shards and between MD5 blocks: true stops the work with keel::Error,
  // and convert() / saveTensors() leave the folder as they found it (Note [Outputs left as
  // found]). keel ckpt convert's Ctrl-C.
  std::function<bool()> stop;
  // Called after each target shard with (bytes done, total bytes); serialized.
  std::function<void(uint64_t, uint64_t)> progress;
};

struct ConvertStats {
  // bytesRead: read from the source files; bytesNeeded: the source bytes the targets cover (the
  // plan's "read"; less than bytesRead where nearby pieces were read in one go, gaps included).
  uint64_t bytesWritten = 0, bytesRead = 0, bytesNeeded = 0;
  size_t files = 0, shards = 0, items = 0;
  size_t verifiedFiles = 0;  // source files checked against their MD5s (verifySource)
  double seconds = 0;
};

// Converts a checkpoint into a new directory (which must not exist or be empty). The metadata
// file is written last, so a partial conversion is never mistaken for a checkpoint; a conversion
// that fails or is stopped leaves the directory as it found it (Note [Outputs left as found]).
ConvertStats convert(const Checkpoint& src, const std::string& dstDir, const TargetSpec& spec,
                     const aoa::Program* rules, const ConvertOptions& opt = {});

// A host tensor to save or to load into (contiguous, row-major).
struct HostTensor {
  std::string key;
  st::DType dtype = st::DType::F32;
  Dims shape;
  void* data = nullptr;
};

// Writes tensors as a sharded checkpoint with spec.tp files (ranks simulated in one process) into
// `dir`, which must not exist or be empty. The arguments are checked first (trainStateJson: empty
// or a JSON object; keys distinct, none '__metadata__'); keel::Error names the one at fault, and
// a failure leaves `dir` as it found it (Note [Outputs left as found]).
void saveTensors(const std::string& dir, const std::vector<HostTensor>& tensors,
                 const TargetSpec& spec, const std::string& trainStateJson = {},
                 const ConvertOptions& opt = {});

struct LoadOptions {
  bool allowMissing = false;  // target keys absent from the checkpoint keep their values
  bool allowUnused = false;   // checkpoint keys no target asks for are ignored
  ConvertOptions exec;
};
// Reads the checkpoint (through the rules) into the given buffers. Shapes must match; float
// dtypes are cast to the target's. Declared keys (`_ -> x`) are left untouched.
void loadTensors(const Checkpoint& src, const aoa::Program* rules, std::vector<HostTensor>& targets,
                 const LoadOptions& opt = {});
// One simulated rank of a tensor-parallel job: fills each target with that rank's part of the
// key under spec (split keys: part `rank`; replicated keys: the whole key), resharding from
// whatever layout the checkpoint has. Target shapes are the local shapes.
void loadRank(const Checkpoint& src, const aoa::Program* rules, const TargetSpec& spec, int rank,
              std::vector<HostTensor>& targets, const LoadOptions& opt = {});

// ---- training checkpoints ------------------------------------------------------------------

// Saves parameters, optimizer state and training progress (step, seed, generator positions) of
// a trainer as dir (written to dir.tmp, then renamed). See Note [Resume bit for bit]. A process
// alone writes `tp` files; in a multi-rank run every rank calls it and writes its own file (`tp`
// is not used: Note [Multi-rank checkpoints]; a rank with no part of its own writes none).
// Returns the number of files written (on every rank).
size_t saveTrainingCheckpoint(Trainer& trainer, const std::string& dir, int tp);
// Restores everything saveTrainingCheckpoint wrote (through optional rules). `dir` may also be a
// --ckpt-dir holding step-* checkpoints: the latest is used. Returns the checkpoint used. Refuses
// a checkpoint whose train_state step disagrees with its optimizer step counters. `warning`, when
// given, receives what differs between the checkpoint's config and the trainer's (name, and the
// settings that change training), empty when nothing does (Note [Resumed settings]).
std::string loadTrainingCheckpoint(Trainer& trainer, const std::string& dir,
                                   const aoa::Program* rules = nullptr,
                                   std::string* warning = nullptr);
// The checkpoint directory `dir` names: itself when it holds keel-checkpoint.json, else its
// latest step-* subdirectory. Throws keel::Error when there is none. `skipped`, when given,
// receives the newest step-* folder after the one chosen that lacks keel-checkpoint.json (an
// interrupted copy: the caller warns that an older step is used), "" when there is none.
std::string resolveCheckpoint(const std::string& dir, std::string* skipped = nullptr);
// "step-000042"
std::string stepDirName(int64_t step);
// The step a "step-<digits>" folder name names; -1 for any other name ("step-000006.tmp", a save
// cut short).
int64_t stepOfDirName(const std::string& name);
// The checkpoints directly in `dir`: its step-<digits> folders holding keel-checkpoint.json, as
// (step, folder name), in step order; empty where there are none or `dir` is no folder.
std::vector<std::pair<int64_t, std::string>> stepCheckpoints(const std::string& dir);
// What another framework needs to replay the run from here (Note [Training inputs]): dir/init,
// the training checkpoint of this position, and dir/batches.safetensors, int64 "idx" and
// "targets" [steps, batch_size, seq_len], the next `steps` steps' batches. dir must not exist or
// be empty; a process alone. Throws keel::Error, leaving nothing it wrote behind.
void saveTrainingInputs(Trainer& trainer, const std::string& dir, int64_t steps);

}  // namespace keel::ckpt
