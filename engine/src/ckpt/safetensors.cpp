// safetensors reader and writer. See Note [Hostile safetensors]: nothing in a header is trusted
// until it has been checked against the file's real size.
#include "keel/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "ckpt_internal.h"
#include "json_keys.h"
#include "keel/base/text.h"
#include "keel/error.h"

namespace keel::st {

// Note [Hostile safetensors]
// A checkpoint may come from anywhere, so the reader assumes the worst: the 8-byte length may
// exceed the file (or be absurd), the JSON may be malformed, nested without end, or repeat a key;
// dtypes may be unknown, shapes negative or overflowing, byte counts may disagree with shapes,
// offsets may point past the buffer, overlap or leave holes. Each case is a keel::Error naming
// the file and the tensor. Checks run in this order: length vs file size, JSON nesting depth
// (a pre-pass, so the parser never recurses deeply), JSON syntax, per-entry fields, then the
// offsets sorted by begin must tile [0, dataBytes) exactly (as the reference implementation
// requires). Reads after validation go through readAt, which re-checks the range against the
// file size and treats a short read (a file truncated under us) as an error.

namespace {

using nlohmann::json;

struct DTypeInfo {
  DType t;
  const char* header;
  size_t size;
};
constexpr DTypeInfo kDTypes[kNumDTypes] = {{DType::F64, "F64", 8}, {DType::F32, "F32", 4},
                                           {DType::F16, "F16", 2}, {DType::BF16, "BF16", 2},
                                           {DType::I64, "I64", 8}, {DType::I32, "I32", 4},
                                           {DType::I16, "I16", 2}, {DType::I8, "I8", 1},
                                           {DType::U8, "U8", 1},   {DType::Bool, "BOOL", 1}};

std::string errnoText() {
  return std::strerror(errno);
}

uint64_t readU64LE(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

size_t dtypeSize(DType t) {
  return kDTypes[size_t(t)].size;
}
std::string_view dtypeName(DType t) {
  return kDTypes[size_t(t)].header;
}
std::optional<DType> dtypeFromHeaderName(std::string_view s) {
  for (const auto& d : kDTypes)
    if (s == d.header) return d.t;
  return std::nullopt;
}
bool isFloatDType(DType t) {
  return t == DType::F64 || t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

DType parseDTypeName(std::string_view s) {
  if (auto t = dtypeFromHeaderName(s)) return *t;
  static const std::pair<const char*, DType> kAliases[] = {
      {"float64", DType::F64},   {"double", DType::F64}, {"f64", DType::F64},
      {"float32", DType::F32},   {"float", DType::F32},  {"f32", DType::F32},
      {"float16", DType::F16},   {"half", DType::F16},   {"f16", DType::F16},
      {"bfloat16", DType::BF16}, {"bf16", DType::BF16},  {"int64", DType::I64},
      {"i64", DType::I64},       {"int32", DType::I32},  {"i32", DType::I32},
      {"int16", DType::I16},     {"i16", DType::I16},    {"int8", DType::I8},
      {"i8", DType::I8},         {"uint8", DType::U8},   {"u8", DType::U8},
      {"bool", DType::Bool}};
  for (const auto& [name, t] : kAliases)
    if (s == name) return t;
  throw Error("unknown dtype '" + std::string(s) +
              "' (expected F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL or float32, bfloat16, "
              "float16, float64, int64, int32, int16, int8, uint8, bool)");
}

uint64_t byteCount(const std::vector<int64_t>& shape, DType t, const std::string& what) {
  uint64_t n = dtypeSize(t);
  for (int64_t d : shape) {
    KEEL_CHECK(d >= 0, what, ": negative dimension ", d);
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / uint64_t(d))
      throw Error(what + ": shape overflows 64 bits");
    n *= uint64_t(d);
  }
  return n;
}

const TensorEntry* Header::find(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

Header parseHeaderJson(std::string_view text, uint64_t dataBytes, const std::string& source) {
  KEEL_CHECK(!text.empty() && text.front() == '{', source,
             ": safetensors header does not start with '{'");
  KEEL_CHECK(jsonNestingDepth(text) <= 8, source, ": safetensors header is nested too deeply");
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    throw Error(source + ": safetensors header is not valid JSON (" + jsonErrorText(e.what()) +
                ")");
  }
  KEEL_CHECK(j.is_object(), source, ": safetensors header is not a JSON object");
  // The names in header order, and the first one named twice (the DOM keeps the last value of a
  // repeated name silently). See Note [Linear headers].
  const ckpt::detail::ObjectKeys names = ckpt::detail::objectKeys(text, {});
  KEEL_CHECK(!names.hasDuplicate, source, ": safetensors header names tensor '", names.duplicate,
             "' twice");
  KEEL_CHECK(names.keys.size() == j.size(), source, ": safetensors header names could not be read");

  Header h;
  h.dataBytes = dataBytes;
  h.tensors.reserve(names.keys.size());
  for (const std::string& name : names.keys) {
    const json& v = j.find(name).value();
    if (name == "__metadata__") {
      KEEL_CHECK(v.is_object(), source, ": __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        KEEL_CHECK(m.value().is_string(), source, ": __metadata__ value of '", m.key(),
                   "' is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string what = source + ": tensor '" + name + "'";
    KEEL_CHECK(v.is_object(), what, " is not an object");
    for (auto f = v.begin(); f != v.end(); ++f)
      KEEL_CHECK(f.key() == "dtype" || f.key() == "shape" || f.key() == "data_offsets", what,
                 ": unknown field '", f.key(), "'");
    KEEL_CHECK(v.contains("dtype") && v["dtype"].is_string(), what, ": missing string 'dtype'");
    KEEL_CHECK(v.contains("shape") && v["shape"].is_array(), what, ": missing array 'shape'");
    KEEL_CHECK(
        v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
        what, ": 'data_offsets' must be [begin, end]");
    TensorEntry e;
    e.name = name;
    const auto& dt = v["dtype"].get_ref<const std::string&>();
    auto t = dtypeFromHeaderName(dt);
    KEEL_CHECK(t.has_value(), what, ": unknown dtype '", dt,
               "' (expected F64, F32, F16, BF16, I64, I32, I16, I8, U8 or BOOL)");
    e.dtype = *t;
    const json& shape = v["shape"];
    KEEL_CHECK(shape.size() <= kMaxRank, what, ": rank ", shape.size(), " exceeds ", kMaxRank);
    for (const auto& d : shape) {
      KEEL_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0), what,
                 ": shape entries must be non-negative integers");
      KEEL_CHECK(d.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max()), what,
                 ": dimension too large");
      e.shape.push_back(int64_t(d.get<uint64_t>()));
    }
    const json& off = v["data_offsets"];
    for (const auto& o : off)
      KEEL_CHECK(o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0), what,
                 ": data_offsets must be non-negative integers");
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    KEEL_CHECK(e.begin <= e.end, what, ": data_offsets [", e.begin, ", ", e.end,
               "] end before they begin");
    if (e.end > dataBytes) {
      // Most often a copy cut short (an interrupted rsync): the header is whole, the data not.
      // Said as such, with what the header's tensors need (the largest end it names).
      uint64_t need = e.end;
      for (auto t = j.begin(); t != j.end(); ++t)
        if (t.key() != "__metadata__" && t.value().is_object() &&
            t.value().contains("data_offsets") && t.value()["data_offsets"].is_array() &&
            t.value()["data_offsets"].size() == 2 &&
            t.value()["data_offsets"][1].is_number_unsigned())
          need = std::max(need, t.value()["data_offsets"][1].get<uint64_t>());
      throw Error(::keel::detail::concat(
          what, ": data_offsets [", e.begin, ", ", e.end, "] lie outside the data buffer of ",
          dataBytes, " bytes: the file is truncated (its tensors need ", need,
          " bytes of data; an incomplete copy?) or its header damaged"));
    }
    uint64_t want = byteCount(e.shape, e.dtype, what);
    KEEL_CHECK(want == e.end - e.begin, what, ": shape ", v["shape"].dump(), " of ", dt, " needs ",
               want, " bytes but data_offsets give ", e.end - e.begin);
    h.tensors.push_back(std::move(e));
  }
  // Stable: empty tensors (all at one offset) keep their header order.
  std::stable_sort(h.tensors.begin(), h.tensors.end(),
                   [](const TensorEntry& a, const TensorEntry& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  uint64_t cursor = 0;
  for (const auto& e : h.tensors) {
    KEEL_CHECK(e.begin >= cursor, source, ": tensor '", e.name, "' data_offsets [", e.begin, ", ",
               e.end, "] overlap the previous tensor (which ends at ", cursor, ")");
    KEEL_CHECK(e.begin == cursor, source, ": hole in the data buffer: bytes [", cursor, ", ",
               e.begin, ") belong to no tensor");
    cursor = e.end;
  }
  KEEL_CHECK(cursor == dataBytes, source, ": the data buffer has ", dataBytes,
             " bytes but the tensors cover ", cursor, " (trailing bytes belong to no tensor)");
  return h;
}

namespace {

// Files a user may name by mistake, told by their first bytes, before their header length is
// read as a number (a recording's read as 7358993341780611411 bytes).
// Only where the length could not be one (a safetensors file may start with the byte '{').
void refuseOtherKinds(const uint8_t* head, uint64_t fileSize, const std::string& source) {
  if (fileSize >= 8 && readU64LE(head) <= fileSize - 8) return;
  KEEL_CHECK(std::memcmp(head, "SQLite f", 8) != 0, source,
             " is a Keel recording (SQLite), not a checkpoint file");
  KEEL_CHECK(head[0] != '{', source,
             " is JSON, not a safetensors file (a checkpoint is its step-* folder)");
}

uint64_t checkedHeaderLength(uint64_t n, uint64_t fileSize, const std::string& source) {
  KEEL_CHECK(fileSize >= 8, source, ": not a safetensors file (", fileSize,
             " bytes, shorter than the 8-byte header length)");
  KEEL_CHECK(n <= fileSize - 8, source, ": safetensors header length ", n, " exceeds the file (",
             fileSize, " bytes)");
  KEEL_CHECK(n <= kMaxHeaderBytes, source, ": safetensors header length ", n,
             " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  return n;
}

}  // namespace

Header parseFile(const uint8_t* data, size_t size, const std::string& source) {
  KEEL_CHECK(size >= 8, source, ": not a safetensors file (", size,
             " bytes, shorter than the 8-byte header length)");
  refuseOtherKinds(data, size, source);
  uint64_t n = checkedHeaderLength(readU64LE(data), size, source);
  Header h = parseHeaderJson(std::string_view(reinterpret_cast<const char*>(data) + 8, size_t(n)),
                             size - 8 - n, source);
  h.dataStart = 8 + n;
  return h;
}

// ---- Reader ------------------------------------------------------------------------------

Reader::Reader(const std::string& path) : path_(path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever; it is
  // refused below as not a regular file (the flag means nothing for a regular file's reads).
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  KEEL_CHECK(fd_ >= 0, path, ": cannot open (", errnoText(), ")");
  try {
    struct stat sb {};
    KEEL_CHECK(::fstat(fd_, &sb) == 0, path, ": cannot stat (", errnoText(), ")");
    if (!S_ISREG(sb.st_mode)) requireRegularFile(path, "the safetensors file");
    KEEL_CHECK(S_ISREG(sb.st_mode), path, ": not a regular file");
    fileSize_ = uint64_t(sb.st_size);
    uint8_t len[8] = {};
    KEEL_CHECK(fileSize_ >= 8, path, ": not a safetensors file (", fileSize_,
               " bytes, shorter than the 8-byte header length)");
    readAt(0, len, 8);
    refuseOtherKinds(len, fileSize_, path);
    // Any other file that cannot be one, by a name that does not say it is (notes.txt): named as
    // --resume names a plain file, not by a header length of 752779967576960878 bytes.
    const bool named = path.size() >= 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0;
    KEEL_CHECK(named || readU64LE(len) <= fileSize_ - 8,
               ckpt::detail::notACheckpointText(path, true));
    uint64_t n = checkedHeaderLength(readU64LE(len), fileSize_, path);
    std::string text(size_t(n), '\0');
    readAt(8, text.data(), size_t(n));
    header_ = parseHeaderJson(text, fileSize_ - 8 - n, path);
    header_.dataStart = 8 + n;
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

Reader::Reader(Reader&& o) noexcept
    : path_(std::move(o.path_)), fd_(o.fd_), fileSize_(o.fileSize_), header_(std::move(o.header_)) {
  o.fd_ = -1;
}

Reader::~Reader() {
  if (fd_ >= 0) ::close(fd_);
}

void Reader::readAt(uint64_t offset, void* dst, size_t n) const {
  KEEL_CHECK(offset <= fileSize_ && n <= fileSize_ - offset, path_, ": read of ", n,
             " bytes at offset ", offset, " leaves the file (", fileSize_, " bytes)");
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd_, p, std::min<size_t>(n, size_t(1) << 30), off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    KEEL_CHECK(r >= 0, path_, ": read failed at offset ", offset, " (", errnoText(), ")");
    KEEL_CHECK(r > 0, path_, ": file ended at offset ", offset, " (truncated while reading?)");
    p += r;
    offset += uint64_t(r);
    n -= size_t(r);
  }
}

void Reader::readAtV(uint64_t offset, const Span* spans, size_t count) const {
  uint64_t total = 0;
  for (size_t i = 0; i < count; ++i) total += spans[i].n;
  KEEL_CHECK(offset <= fileSize_ && total <= fileSize_ - offset, path_, ": read of ", total,
             " bytes at offset ", offset, " leaves the file (", fileSize_, " bytes)");
  constexpr size_t kMaxIov = 1024;
  struct iovec iov[kMaxIov];
  size_t i = 0, skip = 0;  // first span not fully read, and bytes of it already read
  while (i < count) {
    size_t n = 0;
    for (size_t j = i; j < count && n < kMaxIov; ++j, ++n) {
      const size_t off = j == i ? skip : 0;
      iov[n].iov_base = static_cast<uint8_t*>(spans[j].dst) + off;
      iov[n].iov_len = spans[j].n - off;
    }
    ssize_t r = ::preadv(fd_, iov, int(n), off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    KEEL_CHECK(r >= 0, path_, ": read failed at offset ", offset, " (", errnoText(), ")");
    KEEL_CHECK(r > 0, path_, ": file ended at offset ", offset, " (truncated while reading?)");
    offset += uint64_t(r);
    size_t left = size_t(r);
    while (i < count && left >= spans[i].n - skip) {
      left -= spans[i].n - skip;
      skip = 0;
      ++i;
    }
    skip += left;
  }
}

std::vector<uint8_t> Reader::readTensor(const TensorEntry& e) const {
  std::vector<uint8_t> out(size_t(e.nbytes()));
  readAt(header_.dataStart + e.begin, out.data(), out.size());
  return out;
}

// ---- Writer ------------------------------------------------------------------------------

std::string headerJson(const std::vector<WriteEntry>& entries,
                       const std::map<std::string, std::string>& metadata,
                       std::vector<uint64_t>* begins, std::vector<uint64_t>* sizes) {
  // Keys in file order (nlohmann's ordered_json keeps insertion order), so a reader that lists
  // the header sees tensors in the order of their bytes. Names are checked distinct, so they are
  // appended without ordered_json's search (Note [Linear headers]).
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    j["__metadata__"] = m;
  }
  uint64_t cursor = 0;
  std::set<std::string> names;
  for (const auto& e : entries) {
    KEEL_CHECK(e.name != "__metadata__", "safetensors: a tensor cannot be named __metadata__");
    KEEL_CHECK(names.insert(e.name).second, "safetensors: tensor '", e.name, "' written twice");
    uint64_t n = byteCount(e.shape, e.dtype, "safetensors: tensor '" + e.name + "'");
    ckpt::detail::appendDistinct(j, e.name,
                                 {{"dtype", std::string(dtypeName(e.dtype))},
                                  {"shape", e.shape},
                                  {"data_offsets", {cursor, cursor + n}}});
    if (begins) begins->push_back(cursor);
    if (sizes) sizes->push_back(n);
    cursor += n;
  }
  return j.dump();
}

Writer::Writer(const std::string& path, const std::vector<WriteEntry>& entries,
               const std::map<std::string, std::string>& metadata)
    : path_(path) {
  std::string text = headerJson(entries, metadata, &begins_, &sizes_);
  while (text.size() % 8 != 0) text.push_back(' ');  // data starts 8-byte aligned
  dataStart_ = 8 + text.size();
  for (uint64_t s : sizes_) dataBytes_ += s;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  KEEL_CHECK(fd_ >= 0, path, ": cannot create (", errnoText(), ")");
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  std::string head(reinterpret_cast<const char*>(len), 8);
  head += text;
  try {
    KEEL_CHECK(::ftruncate(fd_, off_t(dataStart_ + dataBytes_)) == 0, path, ": cannot size to ",
               dataStart_ + dataBytes_, " bytes (", errnoText(), ")");
    size_t done = 0;
    while (done < head.size()) {
      ssize_t w = ::pwrite(fd_, head.data() + done, head.size() - done, off_t(done));
      if (w < 0 && errno == EINTR) continue;
      KEEL_CHECK(w > 0, path, ": write failed (", errnoText(), ")");
      done += size_t(w);
    }
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

Writer::~Writer() {
  if (fd_ >= 0) ::close(fd_);
}

void Writer::write(size_t i, uint64_t at, const void* src, size_t n) {
  KEEL_CHECK(fd_ >= 0, path_, ": write after close");
  KEEL_CHECK(i < sizes_.size() && at <= sizes_[i] && n <= sizes_[i] - at, path_, ": write of ", n,
             " bytes at ", at, " leaves tensor ", i);
  const auto* p = static_cast<const uint8_t*>(src);
  uint64_t off = offsetOf(i) + at;
  while (n > 0) {
    ssize_t w = ::pwrite(fd_, p, std::min<size_t>(n, size_t(1) << 30), off_t(off));
    if (w < 0 && errno == EINTR) continue;
    KEEL_CHECK(w > 0, path_, ": write failed at offset ", off, " (", errnoText(), ")");
    p += w;
    off += uint64_t(w);
    n -= size_t(w);
  }
}

void Writer::close() {
  if (fd_ < 0) return;
  int r = ::close(fd_);
  fd_ = -1;
  KEEL_CHECK(r == 0, path_, ": close failed (", errnoText(), ")");
}

}  // namespace keel::st
