// StorageError: every storage failure (missing file, not a recording, corrupted, newer schema,
// I/O error) with a one-line message that names the file. DamagedRecording, one kind of it: a file
// that opens but is wrong inside (Note [Damaged recordings] in storage/src/reader.cpp).
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

namespace keel::storage {

class StorageError : public std::runtime_error {
 public:
  explicit StorageError(const std::string& msg) : std::runtime_error(msg) {}
};

// "damaged recording <file>: <what>, in <table> row <id>".
class DamagedRecording : public StorageError {
 public:
  DamagedRecording(const std::string& file, const std::string& what, const std::string& table,
                   int64_t row)
      : StorageError("damaged recording " + file + ": " + what + ", in " + table + " row " +
                     std::to_string(row)) {}
};

}  // namespace keel::storage
