// The recording schema, declared once: kSchema is every table of the current version
// (kSchemaVersion), every column commented, and kDeferredIndexes its secondary indexes. A new file
// is made from these alone. kMigrations are the deltas that bring older files (v1..) up to it.
#include <algorithm>
#include <array>
#include <filesystem>
#include <system_error>

#include <nlohmann/json.hpp>

#include "keel/storage/schema.h"
#include "packed.h"
#include "schema_impl.h"

namespace keel::storage {
namespace {

// Note [Recording encoding]
//  - *_sid columns reference strings(id): every repeated string is stored once.
//  - times are integer nanoseconds; *_ns are from the engine's monotonic clock unless named unix.
//  - unsigned 64-bit engine values (seq, ids, addresses) are stored bit-for-bit as SQLite's signed
//    64-bit integers.
//  - shapes and strides are compact text: decimal integers joined by ',' ("" for rank 0); inside
//    op_tensors they are varints instead (Note [Packed tensors]).
//  - a REAL column holding NaN reads NULL (SQLite stores NaN as NULL); readers map NULL -> NaN.
//
// Note [One schema declaration]
// kSchema + kDeferredIndexes are the schema of version kSchemaVersion; nothing else declares a
// current table. Changing the schema means three edits together: kSchema (and kDeferredIndexes),
// a new delta appended to kMigrations, and kSchemaVersion in schema.h (the array's size makes a
// forgotten delta a build error). SchemaDeclaration.FreshFileEqualsEveryMigratedVersion
// (tests/storage/schema_test.cpp) compares a new file's sqlite_master with v1 (kSchemaV1, the
// frozen history in schema_history.cpp) migrated forward, so declaration and deltas cannot drift.
// Column order matters: a column a migration adds with ALTER TABLE goes last in kSchema too.
constexpr const char* kSchema =
    R"sql(
-- Every distinct string (op, scope, phase, dtype, device, file and function names, attrs, log
-- scopes, allocator event kinds and tags, dump codecs) once.
CREATE TABLE strings (
  id   INTEGER PRIMARY KEY,        -- string id, referenced by every *_sid column
  text TEXT NOT NULL UNIQUE        -- the string itself (UTF-8)
);

-- The run: exactly one row, written when the recording is created.
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
  status               TEXT NOT NULL,    -- running | finished | stopped: <why> | failed: <why>
  allocator            TEXT NOT NULL DEFAULT '', -- host allocator: host | caching | vmm ('' before v5)
  rank                 INTEGER NOT NULL DEFAULT 0, -- this process's rank in a multi-rank run (v8)
  world_size           INTEGER NOT NULL DEFAULT 1, -- ranks of the run (1 before v8)
  layout               TEXT NOT NULL DEFAULT ''  -- parallel layout, "dp 2 x tp 2" ('' alone)
);

-- Training steps.
CREATE TABLE steps (
  step     INTEGER PRIMARY KEY,  -- 1-based training step number
  begin_ns INTEGER NOT NULL,     -- step start, ns
  end_ns   INTEGER NOT NULL,     -- step end, ns (0 while the step runs)
  loss     REAL,                 -- loss of the step; NULL when unknown
  lr             REAL,           -- learning rate of the step; NULL when unknown (and before v5)
  grad_norm      REAL,           -- gradient norm before clipping; NULL when unknown
  tokens_per_sec REAL,           -- training throughput of the step; NULL when unknown
  aux_loss       REAL,           -- MoE auxiliary loss; NULL when unknown (or a dense model)
  val_loss       REAL,           -- validation loss; NULL on steps without one (and before v6)
  nan_metrics    INTEGER NOT NULL DEFAULT 0  -- metrics that are reported NaNs, not unknown
                                 -- (bits: 1 loss, 2 lr, 4 grad_norm, 8 tokens_per_sec,
                                 -- 16 aux_loss, 32 val_loss; Note [Reported NaN], v9)
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
  stack_id    INTEGER,             -- -> stacks(id): call stack at dispatch; NULL when not captured
  kernel_id   INTEGER              -- -> kernels(id): the kernel that ran it; NULL for views (no
                                   --   kernel) and before v7
);
-- The kernels that ran ops, interned (Note [Kernel identity] in the engine's keel/registry.h):
-- most ops of a run repeat a handful of kernels.
CREATE TABLE kernels (
  id          INTEGER PRIMARY KEY,  -- kernel id, referenced by ops.kernel_id
  backend_sid INTEGER NOT NULL,  -- -> strings: cpu | cpu-ref | cuda
  variant_sid INTEGER NOT NULL,  -- -> strings: algorithm, accumulation dtype, reduction order
  params_sid  INTEGER NOT NULL,  -- -> strings: run-time parameters (ISA, BLAS core, threads, tiles)
  UNIQUE (backend_sid, variant_sid, params_sid)
);
-- Op calls counted per step, op, phase and kernel, written when a recording is closed (and by
-- the v6 -> v7 migration): `keel inspect` and the studio summarise a long run from it instead of
-- scanning every op. Empty while a run is recorded (readers then count the ops themselves).
CREATE TABLE op_counts (
  step      INTEGER NOT NULL,  -- as ops.step
  name_sid  INTEGER NOT NULL,  -- -> strings: op name
  phase_sid INTEGER NOT NULL,  -- -> strings: phase
  kernel_id INTEGER,           -- -> kernels(id); NULL for views
  count     INTEGER NOT NULL   -- op calls
);
)sql"
    // Note [Packed tensors]
    // An op's tensors are one BLOB, not one SQL row each: SQLite spends most of an insert on
    // per-row work (3 tensor rows cost 4x the op row) and the views always want all of an op's
    // tensors at once. storage/src/packed.h writes and reads it; docs/recording.md "Packed tensors"
    // is the prose. An op without tensors has no op_tensors row. `data` is `count` entries back to
    // back, in the order of the OpRecord's tensors (capture: the inputs, then the outputs; the
    // v2->v3 migration: by role, then idx); nothing follows the last entry. Encodings:
    // u8 one byte; uvar an unsigned LEB128 varint (7 bits a byte, low group first, high bit set =
    // more follow; at most 10 bytes); svar a zigzag-encoded signed varint ((v << 1) ^ (v >> 63),
    // then uvar); f64 the 8 little-endian bytes of an IEEE-754 double (NaN stays NaN, unlike a REAL
    // column). One entry:
    //   role            u8       0 input, 1 output
    //   flags           u8       1 md5 as text, 8 md5 as 16 raw bytes, 2 md5_rounded as text,
    //                            16 md5_rounded as 16 raw bytes, 4 statistics follow; no md5 flag =
    //                            no checksum captured
    //   idx             uvar     position among the op's inputs (or outputs), >= 0
    //   dtype, device   uvar x2  -> strings(id): float32, ...; cpu, cuda:0
    //   rank, nstrides  uvar x2  number of sizes, number of strides
    //   tensor_id       uvar     engine tensor id, stable for the tensor's lifetime
    //   version         uvar     buffer version when seen (in-place writes bump it)
    //   buffer_id       uvar     identity of the underlying buffer (views share it; the number
    //                            mem_events.buffer_id names)
    //   storage_offset  svar     element offset into the buffer
    //   bytes           svar     numel * element size
    //   shape           svar x rank      sizes
    //   strides         svar x nstrides  element strides
    //   md5             flag 8: 16 bytes, the digest of a 32-lowercase-hex MD5 (docs/capture.md);
    //                   flag 1: u8 length (<= 255) + that many bytes of text; neither: absent
    //   md5_rounded     the same with flags 16 / 2: MD5 of values rounded to N significant digits
    //   statistics      flag 4 only: f64 x5 min, max, mean, std, abs_max (over finite elements),
    //                   then svar x3 nan_count, inf_count, zero_count
    // A reader checks every length against the BLOB: a short, malformed or overlong one is a
    // StorageError naming the file and the op.
    R"sql(
-- Tensors each op saw, packed: one row per op with tensors. See Note [Packed tensors].
CREATE TABLE op_tensors (
  op_seq INTEGER PRIMARY KEY,  -- -> ops(seq)
  count  INTEGER NOT NULL,     -- number of packed tensor entries
  data   BLOB NOT NULL         -- the entries (Note [Packed tensors])
);
-- Ops with an output holding NaN or Inf (from statistics): finds the first one without a scan.
CREATE TABLE nonfinite_ops (
  op_seq INTEGER PRIMARY KEY   -- -> ops(seq)
);

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
-- The frames of each stack, innermost first.
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

-- Allocator events.
CREATE TABLE mem_events (
  id              INTEGER PRIMARY KEY,  -- insertion order
  time_ns         INTEGER NOT NULL,     -- when, ns
  kind_sid        INTEGER NOT NULL,     -- -> strings: alloc|free|reserve|release|map|unmap|move|
                                        --   compact|track_begin|track_end|oom
  device_sid      INTEGER NOT NULL,     -- -> strings: device
  address         INTEGER NOT NULL,     -- address (uint64 bits)
  bytes           INTEGER NOT NULL,     -- size
  to_address      INTEGER NOT NULL,     -- move/compact: destination address; else 0
  op_seq          INTEGER NOT NULL,     -- op that caused it; 0 outside ops
  step            INTEGER NOT NULL,     -- step
  stack_id        INTEGER,              -- -> stacks(id); NULL when not captured
  allocated_after INTEGER NOT NULL,     -- bytes allocated after the event
  reserved_after  INTEGER NOT NULL,     -- bytes reserved after the event
  buffer_id       INTEGER NOT NULL DEFAULT 0,  -- engine Buffer of an alloc/free/compact (the
                                               --   tensors' buffer_id); 0 if none or before v4
  tag_sid         INTEGER,              -- -> strings: alloc: parameter|optimizer_state|data;
                                        --   NULL for op outputs and other kinds
  label_sid       INTEGER               -- -> strings: track_begin/track_end: the section name
);

-- Full tensor dumps of selected ops.
CREATE TABLE dumps (
  id        INTEGER PRIMARY KEY,  -- insertion order
  op_seq    INTEGER NOT NULL,     -- -> ops(seq)
  role      INTEGER NOT NULL,     -- 0 input, 1 output
  idx       INTEGER NOT NULL,     -- position among inputs/outputs
  dtype_sid INTEGER NOT NULL,     -- -> strings: dtype of the elements
  shape     TEXT NOT NULL,        -- sizes, compact text (Note [Recording encoding])
  codec_sid INTEGER NOT NULL,     -- -> strings: compression of data (zstd)
  raw_bytes INTEGER NOT NULL,     -- uncompressed size: contiguous row-major elements
  data      BLOB NOT NULL         -- compressed elements
);

-- Records lost to a configured drop policy, by kind.
CREATE TABLE dropped (
  kind  TEXT PRIMARY KEY,   -- op | log | mem | ...
  count INTEGER NOT NULL    -- how many were dropped
);
)sql";

}  // namespace

namespace detail {

// The secondary indexes of the current schema: what the read API and the views filter on. Built
// when a writer closes a recording (and at the end of a migration), once, by sorting, instead of
// being updated on every insert; CREATE INDEX IF NOT EXISTS, so building them twice is harmless.
const char* const kDeferredIndexes = R"sql(
-- ops(OpQuery) by step and phase, stepOps, opCountsByNameAndPhase(step): one step's ops.
CREATE INDEX IF NOT EXISTS ops_step_phase ON ops(step, phase_sid);
-- ops(OpQuery) by op name and by scope (prefix matches resolve to scope ids first).
CREATE INDEX IF NOT EXISTS ops_name ON ops(name_sid);
CREATE INDEX IF NOT EXISTS ops_scope ON ops(scope_sid);
-- logs(LogQuery) by op range: the op details view's log lines of one op.
CREATE INDEX IF NOT EXISTS logs_op ON logs(op_seq);
-- memEvents(MemQuery) by time range, and by op range (the op details view: one op's events).
CREATE INDEX IF NOT EXISTS mem_events_time ON mem_events(time_ns);
CREATE INDEX IF NOT EXISTS mem_events_op ON mem_events(op_seq);
-- dumps(opSeq): an op's dumped tensors.
CREATE INDEX IF NOT EXISTS dumps_op ON dumps(op_seq);
)sql";

// The summary tables, made from the ops when a recording is closed or migrated (op_counts).
const char* const kSummaries = R"sql(
DELETE FROM op_counts;
INSERT INTO op_counts(step, name_sid, phase_sid, kernel_id, count)
  SELECT step, name_sid, phase_sid, kernel_id, count(*) FROM ops
  GROUP BY step, name_sid, phase_sid, kernel_id;
)sql";

}  // namespace detail

namespace {

// ---- Migrations: deltas from older versions (history; Note [One schema declaration]) ----------

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

// Note [Reported NaN], for files before v9: Keel's trainers report every ended step's loss, so
// readers took its NULL loss (and NULL gradient norm, in a run that records them) for a NaN; a
// PyTorch recording's NULL loss was "not reported". The bits keep those readings.
void markReportedNaNsV8toV9(sql::Db& db) {
  std::string framework = "keel";
  int64_t evalEvery = 0;  // the config's: its steps evaluated a validation loss
  {
    sql::Stmt run(db, "SELECT capture_options_json, config_json FROM run WHERE id = 1");
    if (run.step()) {
      try {
        const nlohmann::json j = nlohmann::json::parse(run.textView(0));
        if (j.is_object() && j.contains("framework") && j["framework"].is_string())
          framework = j["framework"].get<std::string>();
      } catch (const nlohmann::json::exception&) {  // unreadable options: a Keel run's
      }
      try {
        const nlohmann::json c = nlohmann::json::parse(run.textView(1));
        if (c.is_object() && c.contains("eval_every") && c["eval_every"].is_number_integer())
          evalEvery = std::max<int64_t>(0, c["eval_every"].get<int64_t>());
      } catch (const nlohmann::json::exception&) {
      }
    }
  }
  if (framework != "keel") return;
  db.exec(
      "UPDATE steps SET nan_metrics = (loss IS NULL) | ((grad_norm IS NULL AND EXISTS (SELECT 1 "
      "FROM steps WHERE grad_norm IS NOT NULL)) << 2) WHERE end_ns != 0",
      "migration failed");
  if (evalEvery > 0)  // a NaN validation loss of an evaluated step (the plot read them so)
    db.exec(("UPDATE steps SET nan_metrics = nan_metrics | 32 WHERE end_ns != 0 AND val_loss IS "
             "NULL AND step % " +
             std::to_string(evalEvery) + " = 0")
                .c_str(),
            "migration failed");
}

// A migration: SQL, then an optional data conversion, then more SQL, all in one transaction.
struct Migration {
  const char* before;
  void (*convert)(sql::Db&);
  const char* after;
};

// kMigrations[i] takes schema version i+1 to i+2. Append only; never edit a shipped entry (its
// text is what older files were made from, by createEmptyRecording too).
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
    // 4 -> 5: the run names the host allocator it used (the same config must run on the same
    // allocator in `keel record` and the studio; a comparison shows it); steps carry the
    // trainer's metrics (the studio's metrics plot).
    {R"sql(
ALTER TABLE run ADD COLUMN allocator TEXT NOT NULL DEFAULT '';  -- host | caching | vmm
ALTER TABLE steps ADD COLUMN lr REAL;
ALTER TABLE steps ADD COLUMN grad_norm REAL;
ALTER TABLE steps ADD COLUMN tokens_per_sec REAL;
ALTER TABLE steps ADD COLUMN aux_loss REAL;
)sql",
     nullptr, ""},
    // 5 -> 6: steps carry the validation loss of the steps that evaluated one (eval_every).
    {R"sql(
ALTER TABLE steps ADD COLUMN val_loss REAL;
)sql",
     nullptr, ""},
    // 6 -> 7: each op names the kernel that ran it (a diff says "same inputs, different kernel");
    // op calls counted per step, op, phase and kernel (filled after the migration, kSummaries).
    {R"sql(
ALTER TABLE ops ADD COLUMN kernel_id INTEGER;  -- -> kernels(id); NULL for views
CREATE TABLE kernels (
  id          INTEGER PRIMARY KEY,  -- kernel id, referenced by ops.kernel_id
  backend_sid INTEGER NOT NULL,  -- -> strings: cpu | cpu-ref | cuda
  variant_sid INTEGER NOT NULL,  -- -> strings: algorithm, accumulation dtype, reduction order
  params_sid  INTEGER NOT NULL,  -- -> strings: run-time parameters (ISA, BLAS core, threads, tiles)
  UNIQUE (backend_sid, variant_sid, params_sid)
);
CREATE TABLE op_counts (
  step      INTEGER NOT NULL,  -- as ops.step
  name_sid  INTEGER NOT NULL,  -- -> strings: op name
  phase_sid INTEGER NOT NULL,  -- -> strings: phase
  kernel_id INTEGER,           -- -> kernels(id); NULL for views
  count     INTEGER NOT NULL   -- op calls
);
)sql",
     nullptr, ""},
    // 7 -> 8: the run names its place in a multi-rank run (Note [Run folders]).
    {R"sql(
ALTER TABLE run ADD COLUMN rank INTEGER NOT NULL DEFAULT 0;        -- rank in a multi-rank run
ALTER TABLE run ADD COLUMN world_size INTEGER NOT NULL DEFAULT 1;  -- ranks of the run
ALTER TABLE run ADD COLUMN layout TEXT NOT NULL DEFAULT '';        -- "dp 2 x tp 2"
)sql",
     nullptr, ""},
    // 8 -> 9: steps say which metrics are reported NaNs (Note [Reported NaN]); old Keel runs'
    // ended steps had their NULL loss and gradient norm read as NaN, and keep that reading.
    {R"sql(
ALTER TABLE steps ADD COLUMN nan_metrics INTEGER NOT NULL DEFAULT 0;  -- reported NaNs (bits)
)sql",
     markReportedNaNsV8toV9, ""},
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
    if (version == kSchemaVersion) {
      db.exec(kSchema, "cannot create schema");  // the declaration; indexes come at close
    } else {
      db.exec(kSchemaV1, "cannot create schema");  // an older version: history + deltas
      for (int v = 1; v < version; ++v) runMigration(db, v);
    }
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
    db.exec(kSummaries, "cannot count ops");
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
