// The recording schema's version and its migrations (the schema itself is storage/src/schema.cpp,
// documented in docs/recording.md). A recording carries PRAGMA application_id = kApplicationId and
// PRAGMA user_version = its schema version; this build reads versions 1..kSchemaVersion.
#pragma once
#include <cstdint>
#include <string>

namespace keel::storage {

inline constexpr int kSchemaVersion = 9;
inline constexpr int32_t kApplicationId = 0x4B45454C;  // "KEEL"

// Writes an empty recording (schema only, no run row) at schema `version` (1..kSchemaVersion),
// replacing any file at `path`. For migration tests and hand-made fixtures.
void createEmptyRecording(const std::string& path, int version);

// Upgrades the recording at `path` in place to kSchemaVersion, one migration per version step, in
// one transaction. Returns the version the file had. Throws StorageError when the file is not a
// Keel recording, is newer than this build, or cannot be written.
int migrateRecording(const std::string& path);

}  // namespace keel::storage
