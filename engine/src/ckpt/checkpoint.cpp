// FlexCheckpoint metadata (JSON), opening and validating a checkpoint against its shards, the
// tensor-parallel sharding rule and the read planner (an interval join over shard boxes).
#include <sys/stat.h>

#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "ckpt_internal.h"
#include "json_keys.h"
#include "keel/base/text.h"
#include "keel/checkpoint.h"
#include "keel/error.h"

namespace keel::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

// Note [TP sharding]
// Tensor parallelism in the Megatron style, by parameter name: column-parallel layers split
// their output features (axis 0 of a [out, in] weight) — attn.qkv, attn.q/k/v, mlp.w1, mlp.w3
// (gate, up), experts' w1/w3 and lm_head; row-parallel layers split their input features (axis 1)
// — attn.proj and mlp.w2; everything else (embeddings, norms, the MoE router, biases of
// row-parallel layers) is replicated. Optimizer state "<key>::<state>" follows its key; rank-0
// state (step counters) is replicated. A key whose split axis is shorter than the number of
// ranks is replicated rather than given empty shards. Parts differ in size by at most one row
// (larger first), so any degree works for any size. Of a replicated key only one replica is
// written, in the file that holds the fewest bytes so far (ties: the lowest rank), which spreads
// replicated bytes evenly over the files; its replica id is that rank.
int tensorParallelAxis(const std::string& key, const Dims& shape) {
  std::string base = key.substr(0, key.find(aoa::kStateSeparator));
  if (shape.size() < 2) return -1;
  auto ends = [&](std::string_view suffix) {
    return base.size() >= suffix.size() &&
           base.compare(base.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (std::string_view s : {"attn.qkv.weight", "attn.q.weight", "attn.k.weight", "attn.v.weight",
                             "w1.weight", "w3.weight", "gate_up.weight", "lm_head.weight"})
    if (ends(s)) return 0;
  for (std::string_view s : {"attn.proj.weight", "w2.weight"})
    if (ends(s)) return 1;
  return -1;
}

void splitRange(int64_t size, int parts, int part, int64_t& offset, int64_t& length) {
  const int64_t base = size / parts, extra = size % parts;
  length = base + (part < extra ? 1 : 0);
  offset = int64_t(part) * base + std::min<int64_t>(part, extra);
}

const KeyInfo* Metadata::find(std::string_view key) const {
  for (const auto& k : keys)
    if (k.key == key) return &k;
  return nullptr;
}

// ---- metadata JSON -----------------------------------------------------------------------

std::string metadataToJson(const Metadata& m) {
  ordered_json j;
  j["format"] = kFormatName;
  j["version"] = kFormatVersion;
  j["files"] = m.files;
  if (!m.fileMd5.empty()) j["file_md5"] = m.fileMd5;
  ordered_json keys = ordered_json::object();
  keys.get_ref<ordered_json::object_t&>().reserve(m.keys.size());
  std::unordered_set<std::string_view> names;
  for (const auto& k : m.keys) {
    KEEL_CHECK(names.insert(k.key).second, "checkpoint metadata: key '", k.key, "' named twice");
    ordered_json e;
    e["dtype"] = std::string(st::dtypeName(k.dtype));
    e["shape"] = k.shape;
    e["split_axis"] = k.splitAxis;
    ordered_json shards = ordered_json::array();
    for (const auto& s : k.shards) {
      shards.push_back({{"file", s.file},
                        {"offset", s.offset},
                        {"shape", s.shape},
                        {"replica_id", s.replica},
                        {"byte_range", {s.begin, s.end}}});
      if (!s.tensor.empty() && s.tensor != k.key) shards.back()["tensor"] = s.tensor;
    }
    e["shards"] = std::move(shards);
    detail::appendDistinct(keys, k.key, std::move(e));  // Note [Linear headers]
  }
  j["keys"] = std::move(keys);
  if (!m.trainState.empty()) {
    checkJsonDepth(m.trainState, "train_state");  // Note [Bounded JSON]
    j["train_state"] = ordered_json::parse(m.trainState);
  }
  return j.dump(1);
}

namespace {

Dims dimsFrom(const json& v, const std::string& what, bool allowNegative = false) {
  KEEL_CHECK(v.is_array(), what, " must be an array of integers");
  KEEL_CHECK(v.size() <= st::kMaxRank, what, " has rank ", v.size(), " (limit ", st::kMaxRank, ")");
  Dims d;
  for (const auto& x : v) {
    KEEL_CHECK(x.is_number_integer(), what, " must be an array of integers");
    int64_t n =
        x.is_number_unsigned() && x.get<uint64_t>() > uint64_t(INT64_MAX) ? -1 : x.get<int64_t>();
    KEEL_CHECK(allowNegative || n >= 0, what, " must be non-negative");
    d.push_back(n);
  }
  return d;
}

uint64_t u64From(const json& v, const std::string& what) {
  KEEL_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0), what,
             " must be a non-negative integer");
  return v.get<uint64_t>();
}

std::string dimsStr(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace

__extension__ typedef unsigned __int128 U128;  // sums of element counts (each < 2^64)

void checkTiling(const KeyInfo& k, const std::string& source) {
  const std::string what = source + ": key '" + k.key + "'";
  const size_t r = k.shape.size();
  U128 total = 1, sum = 0;
  for (int64_t d : k.shape) total *= uint64_t(d);
  KEEL_CHECK(!k.shards.empty(), what, " has no shards");
  for (const auto& s : k.shards) {
    KEEL_CHECK(s.offset.size() == r && s.shape.size() == r, what, ": shard at ", dimsStr(s.offset),
               " has rank ", s.shape.size(), ", the key has rank ", r);
    U128 v = 1;
    for (size_t a = 0; a < r; ++a) {
      KEEL_CHECK(s.offset[a] >= 0 && s.shape[a] >= 0 && s.offset[a] <= k.shape[a] &&
                     s.shape[a] <= k.shape[a] - s.offset[a],
                 what, ": shard at ", dimsStr(s.offset), " of shape ", dimsStr(s.shape),
                 " leaves the global shape ", dimsStr(k.shape));
      v *= uint64_t(s.shape[a]);
    }
    sum += v;
    KEEL_CHECK(sum <= total, what, ": shards hold more elements than the global shape ",
               dimsStr(k.shape), " (overlapping shards)");
  }
  KEEL_CHECK(sum == total, what, ": shards do not cover the global shape ", dimsStr(k.shape),
             " (missing shards)");
  if (k.shards.size() < 2 || r == 0) {
    KEEL_CHECK(k.shards.size() < 2 || total == 0, what, ": overlapping shards");
    return;
  }
  // No two shards overlap: sweep along the axis with the most distinct offsets.
  size_t axis = 0, best = 0;
  for (size_t a = 0; a < r; ++a) {
    std::set<int64_t> offs;
    for (const auto& s : k.shards) offs.insert(s.offset[a]);
    if (offs.size() > best) best = offs.size(), axis = a;
  }
  std::vector<const ShardInfo*> v;
  for (const auto& s : k.shards)
    if (std::all_of(s.shape.begin(), s.shape.end(), [](int64_t x) { return x > 0; }))
      v.push_back(&s);
  std::sort(v.begin(), v.end(), [&](const ShardInfo* a, const ShardInfo* b) {
    return a->offset[axis] < b->offset[axis];
  });
  for (size_t i = 0; i < v.size(); ++i)
    for (size_t j = i + 1;
         j < v.size() && v[j]->offset[axis] < v[i]->offset[axis] + v[i]->shape[axis]; ++j) {
      bool overlap = true;
      for (size_t a = 0; a < r && overlap; ++a)
        overlap = v[i]->offset[a] < v[j]->offset[a] + v[j]->shape[a] &&
                  v[j]->offset[a] < v[i]->offset[a] + v[i]->shape[a];
      KEEL_CHECK(!overlap, what, ": shards at ", dimsStr(v[i]->offset), " and ",
                 dimsStr(v[j]->offset), " overlap");
    }
}

Metadata metadataFromJson(std::string_view text, const std::string& source) {
  json j;
  try {
    checkJsonDepth(text, source);  // Note [Bounded JSON]
    j = json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    throw Error(source + ": not valid JSON (" + jsonErrorText(e.what()) + ")");
  }
  KEEL_CHECK(j.is_object(), source, ": checkpoint metadata is not a JSON object");
  KEEL_CHECK(j.contains("format") && j["format"] == kFormatName, source,
             ": not a Keel checkpoint (field 'format' is not \"", kFormatName, "\")");
  KEEL_CHECK(j.contains("version") && j["version"].is_number_integer(), source,
             ": missing integer 'version'");
  KEEL_CHECK(j["version"].get<int64_t>() == kFormatVersion, source, ": format version ",
             j["version"].dump(), " is not supported (this build reads version ", kFormatVersion,
             ")");
  Metadata m;
  KEEL_CHECK(j.contains("files") && j["files"].is_array(), source, ": missing array 'files'");
  for (const auto& f : j["files"]) {
    KEEL_CHECK(f.is_string(), source, ": 'files' must hold strings");
    std::string name = f.get<std::string>();
    KEEL_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "." &&
                   name != ".." && name.find('\0') == std::string::npos,
               source, ": file name '", name, "' must be a plain name inside the checkpoint");
    m.files.push_back(name);
  }
  if (j.contains("file_md5")) {  // Note [Checkpoint file digests]
    const json& d = j["file_md5"];
    KEEL_CHECK(d.is_array() && d.size() == m.files.size(), source,
               ": 'file_md5' must list one MD5 per file");
    for (const auto& x : d) {
      const bool hex = x.is_string() && x.get_ref<const std::string&>().size() == 32 &&
                       x.get_ref<const std::string&>().find_first_not_of("0123456789abcdef") ==
                           std::string::npos;
      KEEL_CHECK(hex, source, ": 'file_md5' must hold 32 lowercase hex digits per file");
      m.fileMd5.push_back(x.get<std::string>());
    }
  }
  KEEL_CHECK(j.contains("keys") && j["keys"].is_object(), source, ": missing object 'keys'");
  // The keys in file order (the DOM's map sorts them) and none named twice: Note [Linear headers].
  const detail::ObjectKeys order = detail::objectKeys(text, {"keys"});
  KEEL_CHECK(!order.hasDuplicate, source, ": key '", order.duplicate, "' is named twice");
  const json& keys = j["keys"];
  KEEL_CHECK(order.keys.size() == keys.size(), source, ": the names in 'keys' could not be read");
  m.keys.reserve(order.keys.size());
  for (const std::string& name : order.keys) {
    const std::string what = source + ": key '" + name + "'";
    const json& e = keys.find(name).value();
    KEEL_CHECK(e.is_object(), what, " is not an object");
    KeyInfo k;
    k.key = name;
    KEEL_CHECK(e.contains("dtype") && e["dtype"].is_string(), what, ": missing string 'dtype'");
    auto dt = st::dtypeFromHeaderName(e["dtype"].get<std::string>());
    KEEL_CHECK(dt.has_value(), what, ": unknown dtype ", e["dtype"].dump());
    k.dtype = *dt;
    KEEL_CHECK(e.contains("shape"), what, ": missing 'shape'");
    k.shape = dimsFrom(e["shape"], what + " shape");
    st::byteCount(k.shape, k.dtype, what);  // overflow check
    if (e.contains("split_axis")) {
      KEEL_CHECK(e["split_axis"].is_number_integer(), what, ": 'split_axis' must be an integer");
      int64_t a = e["split_axis"].get<int64_t>();
      KEEL_CHECK(a >= -1 && a < int64_t(k.shape.size()), what, ": split_axis ", a, " out of range");
      k.splitAxis = int(a);
    }
    KEEL_CHECK(e.contains("shards") && e["shards"].is_array(), what, ": missing array 'shards'");
    for (const auto& s : e["shards"]) {
      KEEL_CHECK(s.is_object(), what, ": shards must be objects");
      ShardInfo si;
      KEEL_CHECK(s.contains("file") && s.contains("offset") && s.contains("shape") &&
                     s.contains("byte_range"),
                 what, ": a shard needs file, offset, shape and byte_range");
      uint64_t f = u64From(s["file"], what + " shard file");
      KEEL_CHECK(f < m.files.size(), what, ": shard file index ", f, " but there are ",
                 m.files.size(), " files");
      si.file = uint32_t(f);
      si.offset = dimsFrom(s["offset"], what + " shard offset", true);
      si.shape = dimsFrom(s["shape"], what + " shard shape");
      if (s.contains("replica_id"))
        si.replica = int64_t(u64From(s["replica_id"], what + " replica_id"));
      if (s.contains("tensor")) {
        KEEL_CHECK(s["tensor"].is_string() && !s["tensor"].get_ref<const std::string&>().empty(),
                   what, ": a shard's 'tensor' must be a non-empty name");
        si.tensor = s["tensor"].get<std::string>();
      }
      const auto& br = s["byte_range"];
      KEEL_CHECK(br.is_array() && br.size() == 2, what, ": byte_range must be [begin, end]");
      si.begin = u64From(br[0], what + " byte_range");
      si.end = u64From(br[1], what + " byte_range");
      KEEL_CHECK(si.begin <= si.end, what, ": byte_range ends before it begins");
      const uint64_t want = st::byteCount(si.shape, k.dtype, what);
      KEEL_CHECK(si.end - si.begin == want, what, ": shard at ", dimsStr(si.offset), " has shape ",
                 dimsStr(si.shape), " of ", st::dtypeName(k.dtype), " (", want,
                 " bytes) but byte_range holds ", si.end - si.begin, " bytes");
      k.shards.push_back(std::move(si));
    }
    checkTiling(k, source);
    m.keys.push_back(std::move(k));
  }
  if (j.contains("train_state")) {
    KEEL_CHECK(j["train_state"].is_object(), source, ": 'train_state' must be an object");
    m.trainState = j["train_state"].dump();
  }
  return m;
}

// ---- opening -----------------------------------------------------------------------------

std::string detail::notACheckpointText(const std::string& path, bool safetensorsToo) {
  return path + " is a file, not a checkpoint (a step-* folder, " +
         (safetensorsToo ? "a --ckpt-dir holding them, or a .safetensors file)"
                         : "or a --ckpt-dir holding them)");
}

std::string detail::nonRegularText(const std::string& path, const std::string& kind) {
  return path + " is " + kind +
         ", not a regular file (a checkpoint is a step-* folder, a --ckpt-dir holding them, or a "
         ".safetensors file)";
}

void detail::checkNotMetadataFile(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  if (p.filename() != kMetadataFile || !fs::is_regular_file(p, ec)) return;
  const std::string dir = p.parent_path().empty() ? "." : p.parent_path().string();
  throw Error(path + " is the metadata of the checkpoint " + dir + ": give the folder (" + dir +
              ")");
}

Checkpoint Checkpoint::open(const std::string& path) {
  Checkpoint c;
  c.path_ = path;
  std::error_code ec;
  detail::checkNotMetadataFile(path);
  if (const std::string kind = nonRegularKind(path); !kind.empty() && kind != "a directory")
    throw Error(detail::nonRegularText(path, kind));
  if (fs::is_regular_file(path, ec)) {
    // A single safetensors file: every tensor one whole shard.
    auto r = std::make_shared<st::Reader>(path);
    c.meta_.files.push_back(fs::path(path).filename().string());
    for (const auto& t : r->header().tensors)
      c.meta_.keys.push_back(detail::wholeKey(t.name, t.dtype, t.shape,
                                              r->header().dataStart + t.begin,
                                              r->header().dataStart + t.end));
    // Keep the header's names in data order, as a reader listing the file would.
    c.readers_.push_back(std::move(r));
    return c;
  }
  KEEL_CHECK(fs::is_directory(path, ec), path, ": no such checkpoint (neither a directory with ",
             kMetadataFile, " nor a .safetensors file)");
  const std::string metaPath = (fs::path(path) / kMetadataFile).string();
  KEEL_CHECK(fs::exists(metaPath, ec), path, ": not a checkpoint directory (no ", kMetadataFile,
             ")");
  c.meta_ =
      metadataFromJson(readFile(metaPath, "checkpoint metadata", kMaxMetadataBytes), metaPath);
  std::vector<std::unordered_map<std::string, const st::TensorEntry*>> byName;
  for (const auto& f : c.meta_.files) {
    c.readers_.push_back(std::make_shared<st::Reader>((fs::path(path) / f).string()));
    auto& map = byName.emplace_back();
    for (const auto& t : c.readers_.back()->header().tensors) map[t.name] = &t;
  }
  // The metadata must agree with the shards.
  std::vector<std::set<std::string>> used(c.meta_.files.size());
  for (const auto& k : c.meta_.keys)
    for (const auto& s : k.shards) {
      const std::string& file = c.meta_.files[s.file];
      const std::string what = metaPath + ": key '" + k.key + "' shard at " + dimsStr(s.offset);
      const std::string& name = s.tensor.empty() ? k.key : s.tensor;
      auto it = byName[s.file].find(name);
      KEEL_CHECK(it != byName[s.file].end(), what, ": ", file, " holds no tensor '", name, "'");
      KEEL_CHECK(used[s.file].insert(name).second, what, ": ", file, " tensor '", name,
                 "' is named by two shards");
      const st::TensorEntry& t = *it->second;
      const uint64_t ds = c.readers_[s.file]->header().dataStart;
      KEEL_CHECK(t.dtype == k.dtype, what, ": metadata says ", st::dtypeName(k.dtype), ", ", file,
                 " says ", st::dtypeName(t.dtype));
      KEEL_CHECK(t.shape == s.shape, what, ": metadata says shape ", dimsStr(s.shape), ", ", file,
                 " says ", dimsStr(t.shape));
      KEEL_CHECK(ds + t.begin == s.begin && ds + t.end == s.end, what, ": metadata byte_range [",
                 s.begin, ", ", s.end, ") but ", file, " stores it at [", ds + t.begin, ", ",
                 ds + t.end, ")");
    }
  return c;
}

// Note [Checkpoint file digests]
// The safetensors format has no checksum, and a flipped byte in a tensor's data reads as a valid
// number: a damaged checkpoint resumed silently and trained into NaN. The metadata therefore
// lists each file's MD5 (`file_md5`, the digest `md5sum` prints for the file, header included),
// computed from the files once they are written (detail::writeMetadata): always for training
// checkpoints (keel train --ckpt-dir, every rank's file of a multi-rank run), for conversions
// when asked (ConvertOptions::fileDigests, keel ckpt convert --md5: one more pass over the output
// at ~0.7 GB/s a file, which a resharding tool for large checkpoints should not pay unasked).
// Resuming reads every file once more and refuses one whose digest differs, naming it, as does
// `keel ckpt inspect --verify`; a conversion checks its source first whenever the source records
// digests (ConvertOptions::verifySource: it reads every byte anyway, and a converted copy of a
// damaged file, given new digests by --md5, resumed as a good one), before it writes anything,
// one file per thread. A checkpoint without digests (saved before them, or converted without
// --md5) is read as before. MD5 through OpenSSL, as the tensor digests of recordings are.
std::string detail::fileMd5(const std::string& path, const StopFn& stop) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  KEEL_CHECK(f, path, ": cannot open (", std::strerror(errno), ")");
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  KEEL_CHECK(ctx && EVP_DigestInit_ex(ctx.get(), EVP_md5(), nullptr) == 1, path,
             ": cannot start an MD5");
  std::vector<unsigned char> buf(size_t(1) << 20);
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0;) {
    throwIfStopped(stop);
    EVP_DigestUpdate(ctx.get(), buf.data(), n);
  }
  KEEL_CHECK(!std::ferror(f.get()), path, ": read error");
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &len);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 15];
  }
  return hex;
}

size_t Checkpoint::verifyFiles(int threads, const std::function<bool()>& stop) const {
  if (meta_.fileMd5.empty()) return 0;
  const size_t n = meta_.files.size();
  std::vector<std::string> errors(n);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto work = [&] {
    for (size_t i; !failed.load() && (i = next.fetch_add(1)) < n;) {
      const std::string file = (fs::path(path_) / meta_.files[i]).string();
      try {
        const std::string got = detail::fileMd5(file, stop);
        if (got != meta_.fileMd5[i])
          errors[i] = file + ": its MD5 is " + got + " but " + kMetadataFile + " says " +
                      meta_.fileMd5[i] +
                      ": the file changed after the checkpoint was saved (damaged or edited); "
                      "refusing to read it";
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
      if (!errors[i].empty()) failed = true;
    }
  };
  const size_t pool = std::clamp<size_t>(size_t(std::max(threads, 1)), 1, n);
  if (pool <= 1) {
    work();
  } else {
    std::vector<std::thread> ts;
    for (size_t t = 0; t < pool; ++t) ts.emplace_back(work);
    for (auto& t : ts) t.join();
  }
  for (const std::string& e : errors)
    if (!e.empty()) throw Error(e);
  return n;
}

uint64_t Checkpoint::totalBytes() const {
  uint64_t n = 0;
  for (const auto& k : meta_.keys)
    for (const auto& s : k.shards) n += s.end - s.begin;
  return n;
}

// ---- planning ----------------------------------------------------------------------------

// Note [Compact plans]
// A plan stores, per target shard, only (piece index, source shard index) pairs: 8 bytes per
// read. The boxes are cheap to recompute (detail::itemGeometry) when the shard is executed or
// printed, which keeps a plan of 50,000 keys x 64 x 64 shards small (tens of MB) and fast to
// build. Finding the source shards that overlap a box is an interval join: each source key's
// shards are sorted by their offset along the axis with the most distinct offsets; a query
// [lo, hi) binary-searches the first shard that can reach lo (start > lo - longest extent) and
// walks forward while start < hi, testing the other axes. With the usual one-axis splits this is
// O(log S + overlaps) per target shard instead of O(S).

namespace {

// Index of every source key, flat: key i's shards, sorted by offset along axis[i], are
// order[begin[i] .. begin[i] + count), with their offsets along that axis in starts[].
struct SourceIndex {
  std::vector<uint8_t> axis;
  std::vector<int64_t> maxLen;
  std::vector<uint64_t> begin;
  std::vector<uint32_t> order;
  std::vector<int64_t> starts;

  explicit SourceIndex(const Metadata& m) {
    size_t total = 0;
    for (const auto& k : m.keys) total += k.shards.size();
    axis.resize(m.keys.size());
    maxLen.resize(m.keys.size());
    begin.resize(m.keys.size() + 1);
    order.resize(total);
    starts.resize(total);
    uint64_t at = 0;
    for (size_t ki = 0; ki < m.keys.size(); ++ki) {
      const KeyInfo& k = m.keys[ki];
      const size_t r = k.shape.size(), n = k.shards.size();
      begin[ki] = at;
      uint32_t* o = order.data() + at;
      for (uint32_t i = 0; i < n; ++i) o[i] = i;
      size_t ax = 0;
      if (r > 0 && n > 1) {
        if (k.splitAxis >= 0 && size_t(k.splitAxis) < r) {
          ax = size_t(k.splitAxis);
        } else {
          size_t best = 0;
          for (size_t a = 0; a < r; ++a) {
            std::vector<int64_t> offs;
            for (const auto& s : k.shards) offs.push_back(s.offset[a]);
            std::sort(offs.begin(), offs.end());
            size_t distinct = size_t(std::unique(offs.begin(), offs.end()) - offs.begin());
            if (distinct > best) best = distinct, ax = a;
          }
        }
        auto less = [&](uint32_t x, uint32_t y) {
          return k.shards[x].offset[ax] < k.shards[y].offset[ax];
        };
        if (!std::is_sorted(o, o + n, less)) std::sort(o, o + n, less);
      }
      axis[ki] = uint8_t(ax);
      int64_t ml = (r == 0 || n == 1) ? INT64_MAX / 4 : 0;
      for (size_t i = 0; i < n; ++i) {
        starts[at + i] = r == 0 ? 0 : k.shards[o[i]].offset[ax];
        if (r > 0 && n > 1) ml = std::max(ml, k.shards[o[i]].shape[ax]);
      }
      maxLen[ki] = ml;
      at += n;
    }
    begin[m.keys.size()] = at;
  }
};

}  // namespace

void Plan::shardBox(const TargetShard& s, Dims& offset, Dims& shape) const {
  const aoa::TargetKey& k = target.keys[s.key];
  shape = k.shape;
  offset.assign(shape.size(), 0);
  int a = axis[s.key];
  if (a >= 0) splitRange(k.shape[size_t(a)], tp, int(s.part), offset[size_t(a)], shape[size_t(a)]);
}

namespace detail {

// Here, not in exec.cpp: the parsers' fuzz targets link this file without the executor.
void throwIfStopped(const StopFn& stop) {
  if (stop && stop()) throw Error("stopped before it finished (ConvertOptions::stop)");
}

std::vector<aoa::SourceKey> sourceKeys(const Metadata& m) {
  std::vector<aoa::SourceKey> out;
  out.reserve(m.keys.size());
  for (const auto& k : m.keys) out.push_back({k.key, k.dtype, k.shape});
  return out;
}

bool itemGeometry(const aoa::Piece& p, const ShardInfo& s, const Dims& tOff, const Dims& tShape,
                  ItemGeom& g) {
  const size_t r = tShape.size();
  g.rank = r;
  // Target-axis intersection of the shard box and the piece, mapped to source axes, then
  // intersected with the source shard.
  Arr lo{}, hi{};  // source axes
  for (size_t d = 0; d < r; ++d) {
    int64_t a = std::max(tOff[d], p.dstOff[d]);
    int64_t b = std::min(tOff[d] + tShape[d], p.dstOff[d] + p.shape[d]);
    if (a >= b) return false;
    size_t sa = size_t(p.perm[d]);
    lo[sa] = p.srcOff[sa] + (a - p.dstOff[d]);
    hi[sa] = p.srcOff[sa] + (b - p.dstOff[d]);
  }
  for (size_t a = 0; a < r; ++a) {
    int64_t l = std::max(lo[a], s.offset[a]), h = std::min(hi[a], s.offset[a] + s.shape[a]);
    if (l >= h) return false;
    lo[a] = l;
    hi[a] = h;
    g.srcLocal[a] = l - s.offset[a];
    g.len[a] = h - l;
  }
  for (size_t d = 0; d < r; ++d) {
    size_t sa = size_t(p.perm[d]);
    g.dstLocal[d] = p.dstOff[d] + (lo[sa] - p.srcOff[sa]) - tOff[d];
  }
  return true;
}

Plan planFor(const Metadata& src, aoa::Result target, const TargetSpec& spec, bool needShapes) {
  KEEL_CHECK(spec.tp >= 1, "target tensor-parallel degree must be >= 1, got ", spec.tp);
  Plan plan;
  plan.tp = spec.tp;
  plan.target = std::move(target);
  const auto& keys = plan.target.keys;
  const SourceIndex index(src);
  // Pass 1: each key's split axis (or its replica's file), and the shard count of every file.
  std::vector<uint64_t> fileBytes(size_t(spec.tp), 0);
  std::vector<uint32_t> replicaFile(keys.size(), 0);
  std::vector<size_t> start(size_t(spec.tp) + 1, 0);
  plan.axis.resize(keys.size(), -1);
  for (uint32_t ki = 0; ki < keys.size(); ++ki) {
    const aoa::TargetKey& k = keys[ki];
    if (needShapes)
      KEEL_CHECK(k.hasShape, k.declaredAt.empty() ? std::string() : k.declaredAt + ": ", "key '",
                 k.name, "' was declared ('_ -> ", k.name,
                 "') without shape=, so it cannot be written");
    KEEL_CHECK(k.shape.size() <= st::kMaxRank, "key '", k.name, "' has rank ", k.shape.size(),
               " (limit ", st::kMaxRank, ")");
    const uint64_t keyBytes = st::byteCount(k.shape, k.dtype, "key '" + k.name + "'");
    int a = spec.tp > 1 && spec.axis ? spec.axis(k.name, k.shape) : -1;
    if (a >= int(k.shape.size()) || (a >= 0 && k.shape[size_t(a)] < spec.tp)) a = -1;
    plan.axis[ki] = a;
    if (a < 0) {
      replicaFile[ki] =
          uint32_t(std::min_element(fileBytes.begin(), fileBytes.end()) - fileBytes.begin());
      fileBytes[replicaFile[ki]] += keyBytes;
      ++start[replicaFile[ki] + 1];
    } else {
      for (int f = 0; f < spec.tp; ++f) {
        int64_t o, len;
        splitRange(k.shape[size_t(a)], spec.tp, f, o, len);
        fileBytes[size_t(f)] += keyBytes / uint64_t(k.shape[size_t(a)]) * uint64_t(len);
        ++start[size_t(f) + 1];
      }
    }
  }
  for (size_t f = 1; f < start.size(); ++f) start[f] += start[f - 1];
  plan.shards.resize(start.back());
  plan.items.reserve(plan.shards.size());
  // Pass 2: the read items of every target shard, placed grouped by file (key order within).
  Dims off, shape;
  Arr lo{}, hi{};
  for (uint32_t ki = 0; ki < keys.size(); ++ki) {
    const aoa::TargetKey& k = keys[ki];
    const int a = plan.axis[ki];
    const int parts = a >= 0 ? spec.tp : 1;
    const uint64_t es = st::dtypeSize(k.dtype);
    const size_t r = k.shape.size();
    for (int part = 0; part < parts; ++part) {
      TargetShard ts;
      ts.key = ki;
      ts.part = uint32_t(part);
      ts.file = a >= 0 ? uint32_t(part) : replicaFile[ki];
      ts.firstItem = plan.items.size();
      plan.shardBox(ts, off, shape);
      ts.bytes = es;
      for (int64_t d : shape) ts.bytes *= uint64_t(d);  // <= the key's bytes: no overflow
      for (uint32_t pi = 0; pi < k.pieces.size(); ++pi) {
        const aoa::Piece& p = k.pieces[pi];
        // The piece's part of the target box, in source coordinates.
        bool empty = false;
        for (size_t d = 0; d < r && !empty; ++d) {
          int64_t x = std::max(off[d], p.dstOff[d]);
          int64_t y = std::min(off[d] + shape[d], p.dstOff[d] + p.shape[d]);
          empty = x >= y;
          size_t sa = size_t(p.perm[d]);
          lo[sa] = p.srcOff[sa] + (x - p.dstOff[d]);
          hi[sa] = p.srcOff[sa] + (y - p.dstOff[d]);
        }
        if (empty) continue;
        const KeyInfo& sk = src.keys[p.src];
        const size_t ax = index.axis[p.src];
        const int64_t* st0 = index.starts.data() + index.begin[p.src];
        const uint32_t* ord = index.order.data() + index.begin[p.src];
        const size_t n = sk.shards.size();
        size_t i = 0;
        if (r > 0)
          i = size_t(std::lower_bound(st0, st0 + n, lo[ax] - index.maxLen[p.src] + 1) - st0);
        const uint64_t ses = st::dtypeSize(sk.dtype);
        for (; i < n && (r == 0 || st0[i] < hi[ax]); ++i) {
          const ShardInfo& s = sk.shards[ord[i]];
          uint64_t vol = ses;
          bool hit = true;
          for (size_t sa = 0; sa < r && hit; ++sa) {
            int64_t x = std::max(lo[sa], s.offset[sa]),
                    y = std::min(hi[sa], s.offset[sa] + s.shape[sa]);
            hit = x < y;
            vol *= uint64_t(y - x);
          }
          if (!hit) continue;
          plan.items.push_back({pi, ord[i]});
          plan.bytesRead += vol;
        }
      }
      ts.numItems = uint32_t(plan.items.size() - ts.firstItem);
      plan.bytesWritten += ts.bytes;
      plan.maxShardBytes = std::max(plan.maxShardBytes, ts.bytes);
      plan.shards[start[ts.file]++] = ts;
    }
  }
  return plan;
}

std::string fileName(int rank, int ranks) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", rank, ranks);
  return buf;
}

}  // namespace detail

Plan makePlan(const Metadata& src, const aoa::Program* rules, const TargetSpec& spec) {
  return detail::planFor(src, aoa::apply(rules, detail::sourceKeys(src)), spec, true);
}

std::string describePlan(const Plan& plan, const Metadata& src, size_t maxItems) {
  std::ostringstream os;
  const auto count = [](size_t n, const char* noun) {
    return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
  };
  os << "plan: " << count(src.keys.size(), "source key") << " in "
     << count(src.files.size(), "file") << " -> " << count(plan.target.keys.size(), "target key")
     << " in " << count(size_t(plan.tp), "file") << " (tp=" << plan.tp << "), "
     << count(plan.shards.size(), "target shard") << ", " << count(plan.items.size(), "read")
     << "\n";
  os << "bytes moved: " << plan.bytesRead << " read (" << formatBytes(plan.bytesRead) << "), "
     << plan.bytesWritten << " written (" << formatBytes(plan.bytesWritten)
     << "); largest target shard " << formatBytes(plan.maxShardBytes) << "\n";
  Dims off, shape;
  uint32_t file = UINT32_MAX;
  for (const auto& ts : plan.shards) {
    if (ts.file != file) {
      file = ts.file;
      os << "file " << detail::fileName(int(file), plan.tp) << "\n";
    }
    const aoa::TargetKey& k = plan.target.keys[ts.key];
    plan.shardBox(ts, off, shape);
    os << "  " << k.name << " " << st::dtypeName(k.dtype) << " ";
    for (size_t d = 0; d < shape.size(); ++d)
      os << (d ? "," : "[") << off[d] << ":" << off[d] + shape[d];
    os << (shape.empty() ? "[]" : "]") << " of " << dimsStr(k.shape) << ", " << ts.bytes
       << " bytes";
    if (k.declared) os << " (declared: zeros)";
    os << "\n";
    for (uint32_t i = 0; i < ts.numItems; ++i) {
      if (i == maxItems) {
        os << "    ... " << ts.numItems - maxItems
           << (ts.numItems - maxItems == 1 ? " more read\n" : " more reads\n");
        break;
      }
      const ReadItem& it = plan.items[ts.firstItem + i];
      const aoa::Piece& p = k.pieces[it.piece];
      const KeyInfo& sk = src.keys[p.src];
      const ShardInfo& s = sk.shards[it.shard];
      detail::ItemGeom g;
      if (!detail::itemGeometry(p, s, off, shape, g)) continue;
      // Source byte span and contiguous runs.
      const uint64_t es = st::dtypeSize(sk.dtype);
      Dims stride(g.rank, 1);
      for (size_t a = g.rank; a-- > 1;) stride[a - 1] = stride[a] * s.shape[a];
      uint64_t first = 0, last = 0;
      for (size_t a = 0; a < g.rank; ++a) {
        first += uint64_t(g.srcLocal[a]) * uint64_t(stride[a]);
        last += uint64_t(g.srcLocal[a] + g.len[a] - 1) * uint64_t(stride[a]);
      }
      uint64_t run = 1;
      size_t a = g.rank;
      while (a > 0) {
        --a;
        run *= uint64_t(g.len[a]);
        if (g.len[a] != s.shape[a]) break;
      }
      const uint64_t runs = g.volume() / std::max<uint64_t>(run, 1);
      os << "    <- " << src.files[s.file] << " bytes [" << s.begin + first * es << ", "
         << s.begin + (last + 1) * es << ") " << sk.key;
      if (runs > 1) os << " (" << runs << " runs of " << run * es << " bytes)";
      if (!p.identityPerm()) {
        os << " permute [";
        for (size_t d = 0; d < p.perm.size(); ++d) os << (d ? "," : "") << int(p.perm[d]);
        os << "]";
      }
      for (auto c : p.casts) os << " -> " << st::dtypeName(c);
      os << " to [";
      for (size_t d = 0; d < g.rank; ++d) os << (d ? "," : "") << g.dstLocal[d];
      os << "]\n";
    }
  }
  return os.str();
}

}  // namespace keel::ckpt
