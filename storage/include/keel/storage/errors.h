// StorageError: every storage failure (missing file, not a recording, corrupted, newer schema,
// I/O error) with a one-line message that names the file.
#pragma once
#include <stdexcept>
#include <string>

namespace keel::storage {

class StorageError : public std::runtime_error {
 public:
  explicit StorageError(const std::string& msg) : std::runtime_error(msg) {}
};

}  // namespace keel::storage
