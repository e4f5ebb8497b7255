// History, frozen: the full DDL of schema version 1 exactly as it shipped. It is not the schema
// (that is kSchema in schema.cpp, declared once); only older-version files are built from it:
// createEmptyRecording(path, v < kSchemaVersion) runs this, then kMigrations up to v. Never edit.
#include "schema_impl.h"

namespace keel::storage::detail {

// The v1 `tensors` table (one row per tensor) was replaced by op_tensors in v3; the v1 secondary
// indexes were dropped in v3 and are rebuilt at close from kDeferredIndexes. Comments are as
// shipped; they are copied into v1 files' sqlite_master and so are part of the history too.
const char* const kSchemaV1 = R"sql(
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

}  // namespace keel::storage::detail
