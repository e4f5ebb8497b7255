// The whole recording schema, every column commented, and its migration table. Version 1 is the
// base schema; kMigrations[i] takes version i+1 to i+2; a fresh file is base + every migration, so
// new and migrated files are identical. See docs/recording.md for the prose version.
#include <array>
#include <filesystem>
#include <system_error>

#include "keel/storage/schema.h"
#include "packed.h"
#include "schema_impl.h"

namespace keel::storage {
namespace {

// Conventions (Note [Recording encoding]):
//  - *_sid columns reference strings(id): every repeated string is stored once.
//  - times are integer nanoseconds; *_ns are from the engine's monotonic clock unless named unix.
//  - unsigned 64-bit engine values (seq, ids, addresses) are stored bit-for-bit as SQLite's signed
//    64-bit integers.
//  - shapes and strides are compact text: decimal integers joined by ',' ("" for rank 0).
//  - a REAL column holding NaN reads NULL (SQLite stores NaN as NULL); readers map NULL -> NaN.
constexpr const char* kBaseSchemaV1 = R"sql(
-- Every distinct string (op, scope, phase, dtype, device, file and function names, attrs) once.
CREATE TABLE strings (
  id   INTEGER PRIMARY KEY,        -- string id, referenced by every *_sid column
  text TEXT NOT NULL UNIQUE        -- the string itself (UTF-8)
);

-- The run: exactly one row.
CREATE TABLE run (
  id                   INTEGER PRIMARY KEY CHECK (id = 1),  -- always 1
  backend              TEXT NOT NULL,    -- engine backend: cpu | cpu-ref | cuda
  device               TEXT NOT NULL,    -- device the run used: cpu, cuda:0
  host                 TEXT NOT NULL,    -- host name
  config_json          TEXT NOT NULL,    -- the model/training config, verbatim JSON
  seed                 INTEGER NOT NULL, -- RNG seed (uint64 bits)
  engine_version       TEXT NOT NULL,    -- keel engine version, e.g. 0.1.0
  start_time_unix_ns   INTEGER NOT NULL, -- wall-clock start, ns since the Unix epoch
  capture_options_json TEXT NOT NULL,    -- what was recorded (capture options as JSON)
  status               TEXT NOT NULL     -- running | finished | failed: <reason>
);

-- Training steps.
CREATE TABLE steps (
  step     INTEGER PRIMARY KEY,  -- 1-based training step number
  begin_ns INTEGER NOT NULL,     -- step start, ns
  end_ns   INTEGER NOT NULL,     -- step end, ns (0 while the step runs)
  loss     REAL                  -- loss of the step; NULL when unknown
);

-- Every op call, in execution order.
CREATE TABLE ops (
  seq         INTEGER PRIMARY KEY, -- engine op sequence number: unique, increasing = execution order
  step        INTEGER NOT NULL,    -- step the op ran in; 0 before the first step
  phase_sid   INTEGER NOT NULL,    -- -> strings: forward | backward | optimizer
  name_sid    INTEGER NOT NULL,    -- -> strings: op name (matmul, add, ...)
  attrs_sid   INTEGER NOT NULL,    -- -> strings: op attributes as JSON ("" when none)
  scope_sid   INTEGER NOT NULL,    -- -> strings: module scope path, e.g. blocks.3.attn
  thread      INTEGER NOT NULL,    -- small integer id of the engine thread that ran it
  begin_ns    INTEGER NOT NULL,    -- op start, ns
  end_ns      INTEGER NOT NULL,    -- op end, ns
  forward_seq INTEGER NOT NULL,    -- backward ops: seq of the forward op differentiated; else 0
  stack_id    INTEGER              -- -> stacks(id): call stack at dispatch; NULL when not captured
);
CREATE INDEX ops_step_phase ON ops(step, phase_sid);
CREATE INDEX ops_name ON ops(name_sid);
CREATE INDEX ops_scope ON ops(scope_sid);

-- Tensors each op saw: one row per (op, role, index), clustered by op (WITHOUT ROWID), so the
-- primary key is also the tensors(op_seq) index and an op's tensors sit together on disk.
CREATE TABLE tensors (
  op_seq      INTEGER NOT NULL,  -- -> ops(seq)
  role        INTEGER NOT NULL,  -- 0 input, 1 output
  idx         INTEGER NOT NULL,  -- position among the op's inputs (or outputs)
  tensor_id   INTEGER NOT NULL,  -- engine tensor id, stable for the tensor's lifetime
  version     INTEGER NOT NULL,  -- buffer version when seen (in-place writes bump it)
  buffer_id   INTEGER NOT NULL,  -- identity of the underlying buffer (views share it)
  shape       TEXT NOT NULL,     -- sizes, e.g. "4,16,64" ("" for a scalar)
  strides     TEXT NOT NULL,     -- element strides, same encoding
  storage_offset INTEGER NOT NULL,  -- element offset into the buffer
  dtype_sid   INTEGER NOT NULL,  -- -> strings: float32, float16, ...
  device_sid  INTEGER NOT NULL,  -- -> strings: cpu, cuda:0
  bytes       INTEGER NOT NULL,  -- numel * element size
  md5         TEXT,              -- 32 hex chars of the exact MD5 (docs/capture.md); NULL if off
  md5_rounded TEXT,              -- MD5 of values rounded to N significant digits; NULL if off
  min         REAL,              -- statistics over finite elements; NULL when not captured
  max         REAL,              --   (or NaN)
  mean        REAL,              --
  std         REAL,              --
  abs_max     REAL,              --
  nan_count   INTEGER,           -- NaN elements; NULL exactly when statistics were not captured
  inf_count   INTEGER,           -- +-Inf elements; NULL when no statistics
  zero_count  INTEGER,           -- zero elements; NULL when no statistics
  PRIMARY KEY (op_seq, role, idx)
) WITHOUT ROWID;
CREATE INDEX tensors_id_version ON tensors(tensor_id, version);
-- Tiny partial index: finds the first NaN/Inf output without scanning.
CREATE INDEX tensors_nonfinite ON tensors(op_seq)
  WHERE role = 1 AND (nan_count > 0 OR inf_count > 0);

-- Call stacks, deduplicated: ops and allocator events reference stacks(id).
CREATE TABLE stacks (
  id    INTEGER PRIMARY KEY,  -- stack id assigned by capture, unique in the recording
  depth INTEGER NOT NULL      -- number of frames
);
-- Distinct symbolized frames, shared by every stack that contains them.
CREATE TABLE frames (
  id           INTEGER PRIMARY KEY,  -- frame id
  address      INTEGER NOT NULL,     -- return address (uint64 bits)
  function_sid INTEGER NOT NULL,     -- -> strings: demangled function ("" unknown)
  file_sid     INTEGER NOT NULL,     -- -> strings: source file ("" unknown)
  line         INTEGER NOT NULL,     -- source line (0 unknown)
  UNIQUE (address, function_sid, file_sid, line)
);
CREATE TABLE stack_frames (
  stack_id INTEGER NOT NULL,  -- -> stacks(id)
  depth    INTEGER NOT NULL,  -- 0 = innermost frame
  frame_id INTEGER NOT NULL,  -- -> frames(id)
  PRIMARY KEY (stack_id, depth)
) WITHOUT ROWID;

-- Log lines, each tied to the op being dispatched when it was logged.
CREATE TABLE logs (
  id        INTEGER PRIMARY KEY,  -- insertion order
  op_seq    INTEGER NOT NULL,     -- op being dispatched (or the last one) when logged
  step      INTEGER NOT NULL,     -- step
  level     INTEGER NOT NULL,     -- 0 error, 1 warn, 2 info, 3 debug, 4 verbose
  scope_sid INTEGER NOT NULL,     -- -> strings: module scope path or named log scope
  message   TEXT NOT NULL,        -- the line
  time_ns   INTEGER NOT NULL      -- when, ns
);
CREATE INDEX logs_op ON logs(op_seq);

-- Allocator events.
CREATE TABLE mem_events (
  id              INTEGER PRIMARY KEY,  -- insertion order
  time_ns         INTEGER NOT NULL,     -- when, ns
  kind_sid        INTEGER NOT NULL,     -- -> strings: alloc|free|reserve|release|map|unmap|move
  device_sid      INTEGER NOT NULL,     -- -> strings: device
  address         INTEGER NOT NULL,     -- address (uint64 bits)
  bytes           INTEGER NOT NULL,     -- size
  to_address      INTEGER NOT NULL,     -- move: destination address; else 0
  op_seq          INTEGER NOT NULL,     -- op that caused it; 0 outside ops
  step            INTEGER NOT NULL,     -- step
  stack_id        INTEGER,              -- -> stacks(id); NULL when not captured
  allocated_after INTEGER NOT NULL,     -- bytes allocated after the event
  reserved_after  INTEGER NOT NULL      -- bytes reserved after the event
);
CREATE INDEX mem_events_time ON mem_events(time_ns);

-- Full tensor dumps of selected ops.
CREATE TABLE dumps (
  id        INTEGER PRIMARY KEY,  -- insertion order
  op_seq    INTEGER NOT NULL,     -- -> ops(seq)
  role      INTEGER NOT NULL,     -- 0 input, 1 output
  idx       INTEGER NOT NULL,     -- position among inputs/outputs
  dtype_sid INTEGER NOT NULL,     -- -> strings: dtype of the elements
  shape     TEXT NOT NULL,        -- sizes, as in tensors.shape
  codec_sid INTEGER NOT NULL,     -- -> strings: compression of data (zstd)
  raw_bytes INTEGER NOT NULL,     -- uncompressed size: contiguous row-major elements
  data      BLOB NOT NULL         -- compressed elements
);
CREATE INDEX dumps_op ON dumps(op_seq);
)sql";

// Converts the v2 tensors table (one row per tensor) into op_tensors (one packed row per op) and
// nonfinite_ops. Runs between the v2->v3 migration's SQL parts, inside its transaction.
void packTensorsV2toV3(sql::Db& db) {
  sql::Stmt sel(db,
                "SELECT op_seq, role, idx, tensor_id, version, buffer_id, shape, strides,"
                " storage_offset, dtype_sid, device_sid, bytes, md5, md5_rounded, min, max, mean,"
                " std, abs_max, nan_count, inf_count, zero_count FROM tensors"
                " ORDER BY op_seq, role, idx");
  sql::Stmt ins(db, "INSERT INTO op_tensors(op_seq, count, data) VALUES (?1, ?2, ?3)");
  sql::Stmt nonfinite(db, "INSERT OR IGNORE INTO nonfinite_ops(op_seq) VALUES (?1)");
  detail::PackedWriter packed;
  int64_t count = 0, seq = 0;
  bool have = false, bad = false;
  auto flush = [&] {
    if (!have) return;
    ins.bind(1, seq);
    ins.bind(2, count);
    ins.bindBlob(3, packed.bytes().data(), packed.bytes().size());
    ins.run();
    if (bad) {
      nonfinite.bind(1, seq);
      nonfinite.run();
    }
    packed.clear();
    count = 0;
    bad = false;
  };
  while (sel.step()) {
    const int64_t s = sel.i64(0);
    if (have && s != seq) flush();
    seq = s;
    have = true;
    TensorRecord t;
    t.role = static_cast<Role>(sel.i64(1));
    t.index = static_cast<int32_t>(sel.i64(2));
    t.tensorId = sel.u64(3);
    t.version = sel.u64(4);
    t.bufferId = sel.u64(5);
    t.shape = detail::parseDims(sel.textView(6));
    t.strides = detail::parseDims(sel.textView(7));
    t.offset = sel.i64(8);
    const int64_t dtypeSid = sel.i64(9), deviceSid = sel.i64(10);
    t.bytes = sel.i64(11);
    t.md5 = sel.text(12);
    t.md5Rounded = sel.text(13);
    t.hasStats = !sel.isNull(19);
    if (t.hasStats) {
      t.stats = {sel.f64(14), sel.f64(15), sel.f64(16), sel.f64(17),
                 sel.f64(18), sel.i64(19), sel.i64(20), sel.i64(21)};
      if (t.role == Role::Output && (t.stats.nanCount > 0 || t.stats.infCount > 0)) bad = true;
    }
    packed.add(t, dtypeSid, deviceSid);
    ++count;
  }
  flush();
}

// A migration: SQL, then an optional data conversion, then more SQL, all in one transaction.
struct Migration {
  const char* before;
  void (*convert)(sql::Db&);
  const char* after;
};

// kMigrations[i] takes schema version i+1 to i+2. Append only; never edit a shipped entry.
const std::array<Migration, kSchemaVersion - 1> kMigrations = {{
    // 1 -> 2: records dropped by a capture policy; allocator events by op.
    {R"sql(
-- Records lost to a configured drop policy, by kind.
CREATE TABLE dropped (
  kind  TEXT PRIMARY KEY,   -- op | log | mem | ...
  count INTEGER NOT NULL    -- how many were dropped
);
CREATE INDEX mem_events_op ON mem_events(op_seq);
)sql",
     nullptr, ""},
    // 2 -> 3: tensors packed per op (writer throughput: one row per op, not one per tensor);
    // secondary indexes are built when a recording is closed (kDeferredIndexes), not per insert.
    {R"sql(
-- Tensors each op saw, packed: one row per op (layout: docs/recording.md, "Packed tensors").
CREATE TABLE op_tensors (
  op_seq INTEGER PRIMARY KEY,  -- -> ops(seq)
  count  INTEGER NOT NULL,     -- number of packed tensor entries
  data   BLOB NOT NULL         -- the entries, inputs then outputs, each in index order
);
-- Ops with an output holding NaN or Inf (from statistics): finds the first one without a scan.
CREATE TABLE nonfinite_ops (
  op_seq INTEGER PRIMARY KEY   -- -> ops(seq)
);
)sql",
     packTensorsV2toV3, R"sql(
DROP TABLE tensors;
DROP INDEX IF EXISTS ops_step_phase;
DROP INDEX IF EXISTS ops_name;
DROP INDEX IF EXISTS ops_scope;
DROP INDEX IF EXISTS logs_op;
DROP INDEX IF EXISTS mem_events_time;
DROP INDEX IF EXISTS mem_events_op;
DROP INDEX IF EXISTS dumps_op;
)sql"},
    // 3 -> 4: allocator events name the buffer they concern, the allocating code's tag and the
    // memory tracking section they open or close.
    {R"sql(
ALTER TABLE mem_events ADD COLUMN buffer_id INTEGER NOT NULL DEFAULT 0;  -- Buffer id; 0 if none
ALTER TABLE mem_events ADD COLUMN tag_sid INTEGER;    -- -> strings: parameter|optimizer_state|data
ALTER TABLE mem_events ADD COLUMN label_sid INTEGER;  -- -> strings: tracking section name
)sql",
     nullptr, ""},
}};

void runMigration(sql::Db& db, int from) {
  const Migration& m = kMigrations[size_t(from - 1)];
  db.exec(m.before, "migration failed");
  if (m.convert) m.convert(db);
  db.exec(m.after, "migration failed");
}

void stamp(sql::Db& db, int version) {
  std::string s = "PRAGMA application_id = " + std::to_string(kApplicationId) +
                  "; PRAGMA user_version = " + std::to_string(version) + ";";
  db.exec(s.c_str(), "cannot write schema version");
}

}  // namespace

namespace detail {

const char* const kDeferredIndexes = R"sql(
CREATE INDEX IF NOT EXISTS ops_step_phase ON ops(step, phase_sid);
CREATE INDEX IF NOT EXISTS ops_name ON ops(name_sid);
CREATE INDEX IF NOT EXISTS ops_scope ON ops(scope_sid);
CREATE INDEX IF NOT EXISTS logs_op ON logs(op_seq);
CREATE INDEX IF NOT EXISTS mem_events_time ON mem_events(time_ns);
CREATE INDEX IF NOT EXISTS mem_events_op ON mem_events(op_seq);
CREATE INDEX IF NOT EXISTS dumps_op ON dumps(op_seq);
)sql";

std::string newerVersionMessage(const std::string& file, int64_t version) {
  return "recording " + file + " has schema version " + std::to_string(version) +
         ", this keel reads up to " + std::to_string(kSchemaVersion);
}

void createSchema(sql::Db& db, int version) {
  if (version < 1 || version > kSchemaVersion)
    throw StorageError("recording " + db.path() + ": cannot create schema version " +
                       std::to_string(version));
  db.exec("BEGIN IMMEDIATE", "cannot begin transaction");
  try {
    db.exec(kBaseSchemaV1, "cannot create schema");
    for (int v = 1; v < version; ++v) runMigration(db, v);
    stamp(db, version);
    db.exec("COMMIT", "cannot commit schema");
  } catch (...) {
    sqlite3_exec(db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

void migrateSchema(sql::Db& db, int from) {
  if (from > kSchemaVersion) throw StorageError(newerVersionMessage(db.path(), from));
  if (from < 1)
    throw StorageError("recording " + db.path() + " has invalid schema version " +
                       std::to_string(from));
  db.exec("BEGIN IMMEDIATE", "cannot begin migration");
  try {
    for (int v = from; v < kSchemaVersion; ++v) runMigration(db, v);
    stamp(db, kSchemaVersion);
    db.exec(kDeferredIndexes, "cannot create indexes");
    db.exec("COMMIT", "cannot commit migration");
  } catch (...) {
    sqlite3_exec(db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

}  // namespace detail

void createEmptyRecording(const std::string& path, int version) {
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm", "-journal"})
    std::filesystem::remove(path + suffix, ec);
  sql::Db db(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  db.exec("PRAGMA journal_mode = WAL", "cannot set WAL mode");
  detail::createSchema(db, version);
}

int migrateRecording(const std::string& path) {
  sql::Db db(path, SQLITE_OPEN_READWRITE);
  if (db.queryInt("PRAGMA application_id") != kApplicationId)
    throw StorageError("recording " + path + " is an SQLite database but not a Keel recording");
  int from = static_cast<int>(db.queryInt("PRAGMA user_version"));
  if (from != kSchemaVersion) detail::migrateSchema(db, from);
  return from;
}

}  // namespace keel::storage
