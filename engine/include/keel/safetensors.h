// safetensors files: a reader that trusts nothing in the file and a writer whose output any
// safetensors reader accepts. Invariant: every header is fully validated (length within the file,
// known dtypes, shapes matching byte counts, data offsets covering the buffer with no hole or
// overlap) before a byte of tensor data is read; violations throw keel::Error naming the file.
// This file depends on no tensor code, so the fuzz targets build it alone.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace keel::st {

// The safetensors element types (names as they appear in headers).
enum class DType : uint8_t { F64, F32, F16, BF16, I64, I32, I16, I8, U8, Bool };
inline constexpr int kNumDTypes = 10;

size_t dtypeSize(DType t);
std::string_view dtypeName(DType t);  // "F32", "BF16", "BOOL", ...
// A header name ("F32"), or nullopt.
std::optional<DType> dtypeFromHeaderName(std::string_view s);
// A header name or a friendly one ("float32", "f32", "bfloat16", "bf16", "half", "int64", ...).
// Throws keel::Error listing the accepted names.
DType parseDTypeName(std::string_view s);
bool isFloatDType(DType t);

// Largest header accepted (the reference implementation's limit).
inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
// Largest rank accepted.
inline constexpr size_t kMaxRank = 16;

struct TensorEntry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // data_offsets: relative to the start of the data buffer
  uint64_t nbytes() const { return end - begin; }
};

struct Header {
  std::vector<TensorEntry> tensors;  // sorted by begin offset
  std::map<std::string, std::string> metadata;
  uint64_t dataStart = 0;  // absolute file offset of the data buffer (8 + header length)
  uint64_t dataBytes = 0;  // size of the data buffer
  const TensorEntry* find(std::string_view name) const;
};

// Parses and validates a complete file image in memory (header and data). `source` names it in
// messages. Used by the reader and by the fuzz target.
Header parseFile(const uint8_t* data, size_t size, const std::string& source);
// Parses the JSON header text, given the size of the data buffer that follows it.
Header parseHeaderJson(std::string_view json, uint64_t dataBytes, const std::string& source);

// An open safetensors file. Reads use pread on one descriptor (thread-safe).
class Reader {
 public:
  explicit Reader(const std::string& path);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;
  Reader(Reader&& o) noexcept;
  Reader& operator=(Reader&&) = delete;

  const std::string& path() const { return path_; }
  const Header& header() const { return header_; }
  uint64_t fileSize() const { return fileSize_; }
  // Reads n bytes at absolute file offset `offset` into dst. Throws keel::Error when the range
  // leaves the file or the read comes up short (a file truncated under us).
  void readAt(uint64_t offset, void* dst, size_t n) const;
  // Reads the contiguous range starting at `offset` into several buffers in order (a scatter
  // read: preadv). Same checks as readAt.
  struct Span {
    void* dst;
    size_t n;
  };
  void readAtV(uint64_t offset, const Span* spans, size_t count) const;
  // All bytes of one tensor.
  std::vector<uint8_t> readTensor(const TensorEntry& e) const;
  int fd() const { return fd_; }  // for kernel-side copies (copy_file_range)

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t fileSize_ = 0;
  Header header_;
};

// Describes one tensor to write; the data comes later through Writer::write.
struct WriteEntry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
};

// Writes a safetensors file: the header (padded with spaces to 8 bytes) goes out at construction,
// tensor data at the offsets it announced. Tensors are laid out in the order given.
class Writer {
 public:
  Writer(const std::string& path, const std::vector<WriteEntry>& entries,
         const std::map<std::string, std::string>& metadata = {});
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Absolute file offset of tensor i's data, and its byte count.
  uint64_t offsetOf(size_t i) const { return dataStart_ + begins_.at(i); }
  uint64_t bytesOf(size_t i) const { return sizes_.at(i); }
  uint64_t dataStart() const { return dataStart_; }
  uint64_t fileSize() const { return dataStart_ + dataBytes_; }
  // Writes n bytes at byte `at` within tensor i (thread-safe: pwrite).
  void write(size_t i, uint64_t at, const void* src, size_t n);
  // Flushes and closes; throws on an I/O error. Called by the destructor if not called.
  void close();
  int fd() const { return fd_; }  // for kernel-side copies (copy_file_range)

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t dataStart_ = 0, dataBytes_ = 0;
  std::vector<uint64_t> begins_, sizes_;
};

// Builds the header JSON text for entries laid out in order (exposed for tests and fuzz seeds).
std::string headerJson(const std::vector<WriteEntry>& entries,
                       const std::map<std::string, std::string>& metadata,
                       std::vector<uint64_t>* begins = nullptr,
                       std::vector<uint64_t>* sizes = nullptr);

// Byte count of a shape of dtype t; throws keel::Error on a negative dimension or overflow.
uint64_t byteCount(const std::vector<int64_t>& shape, DType t, const std::string& what);

}  // namespace keel::st
