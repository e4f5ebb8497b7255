// Writer::create: appends records to a recording through prepared statements inside one open
// transaction (WAL, synchronous=NORMAL); commit() ends it durably and opens the next. A failed
// write rolls back the uncommitted batch, so the file only ever holds whole batches.
#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string_view>
#include <system_error>
#include <tuple>
#include <unordered_map>

#include "keel/base/output_path.h"
#include "keel/storage/schema.h"
#include "keel/storage/writer.h"
#include "packed.h"
#include "schema_impl.h"
#include "sqlite.h"

namespace keel::storage {

static_assert(std::endian::native == std::endian::little, "packed tensor data is little-endian");

namespace {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

// Note [A recording appears whole]
// Readers open recordings while they are written (keel inspect of a live run, the studio's views,
// another rank's tools). Between SQLite creating a file and the schema being in it there is an
// empty database a reader would call "not a Keel recording", so a new recording is built under a
// hidden name beside it (`.NAME.creating-PID`): page size, WAL mode (persistent in the header),
// schema and the run row; closed, which checkpoints and removes its WAL; then renamed into place,
// atomically replacing any old file, whose permission bits it keeps. A reader sees no file or a
// whole recording, never less.
void createWhole(const std::string& path, const RunInfo& run) {
  const std::string building = replacementPath(path, "creating");
  std::error_code ec;
  auto removeWithSidecars = [&ec](const std::string& p) {
    for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
      std::filesystem::remove(p + suffix, ec);
      if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory)
        return false;
    }
    return true;
  };
  removeWithSidecars(building);
  try {
    sql::Db db(building, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    // Page size must be set before the first table exists; WAL before the schema is written.
    db.exec("PRAGMA page_size = 8192; PRAGMA journal_mode = WAL;", "cannot configure database");
    detail::createSchema(db, kSchemaVersion);
    sql::Stmt insRun(db,
                     "INSERT INTO run(id, backend, device, host, config_json, seed, engine_version,"
                     " start_time_unix_ns, capture_options_json, status, allocator, rank,"
                     " world_size, layout) VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11,"
                     " ?12, ?13)");
    insRun
        .bindFrom(1, run.backend, run.device, run.host, run.configJson, run.seed, run.engineVersion,
                  run.startTimeUnixNs, run.captureOptionsJson, run.status, run.allocator, run.rank,
                  run.worldSize, run.layout)
        .run();
    insRun = sql::Stmt();
    db.close();
  } catch (const StorageError& e) {
    removeWithSidecars(building);
    // Name the file the user asked for, not the hidden one it is built under.
    std::string message = e.what();
    for (size_t at = message.find(building); at != std::string::npos;
         at = message.find(building, at + path.size()))
      message.replace(at, building.size(), path);
    throw StorageError(message);
  }
  // A stale -wal beside an old file would be replayed into the new one: remove the sidecars
  // first (the old file itself is replaced by the rename, atomically).
  for (const char* suffix : {"-wal", "-shm", "-journal"}) {
    std::filesystem::remove(path + suffix, ec);
    if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory) {
      const std::string reason = ec.message();
      removeWithSidecars(building);
      throw StorageError("recording " + path + ": cannot replace existing file (" + reason + ")");
    }
  }
  // The file replaced passes its permission bits (and, where this process may, its owner) to the
  // new one: a private 0600 recording stays private (renameOver, Note [Outputs never destroy
  // inputs]).
  try {
    renameOver(building, path);
  } catch (const keel::Error& e) {
    removeWithSidecars(building);
    throw StorageError("recording " + path + ": cannot create (" + e.what() + ")");
  }
}

class SqliteWriter final : public Writer {
 public:
  SqliteWriter(const std::string& path, const RunInfo& run, const WriterOptions& options);
  ~SqliteWriter() override {
    try {
      if (db_.get()) close();
    } catch (...) {  // destructors never throw; an explicit close() reports errors
    }
  }

  void writeStep(const StepRecord& s) override;
  void writeOp(const OpRecord& op) override;
  void writeStack(const StackRecord& s) override;
  void writeLog(const LogRecord& l) override;
  void writeMem(const MemRecord& m) override;
  void writeDump(const DumpRecord& d) override;
  void setRunStatus(const std::string& status) override;
  void closeWithStatus(const std::string& status) noexcept override;
  void addDropped(const std::string& kind, int64_t count) override;
  void commit() override;
  void close() override;

 private:
  // Runs `f` inside the open batch; on failure rolls the batch back and rethrows.
  template <class F>
  void guarded(F&& f);
  void beginIfNeeded();
  void rollbackBatch() noexcept;
  void reloadCaches();
  int64_t intern(std::string_view s);
  int64_t internFrame(const StackFrame& f);
  int64_t internKernel(const KernelRecord& k);

  sql::Db db_;
  sql::Stmt begin_, commit_, insString_, insStep_, insOp_, insTensors_, insNonfinite_, insStack_,
      insFrame_, insStackFrame_, insLog_, insMem_, insDump_, setStatus_, addDropped_, insKernel_;
  std::unordered_map<std::string, int64_t, StringHash, std::equal_to<>> strings_;
  std::map<std::tuple<uint64_t, int64_t, int64_t, int32_t>, int64_t> frames_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> kernels_;  // (string ids) -> id
  std::string shapeBuf_;
  detail::PackedWriter packed_;
};

SqliteWriter::SqliteWriter(const std::string& path, const RunInfo& run,
                           const WriterOptions& options) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw StorageError("recording " + path + " is a directory");
  createWhole(path, run);
  db_ = sql::Db(path, SQLITE_OPEN_READWRITE);
  db_.exec("PRAGMA synchronous = NORMAL; PRAGMA cache_size = -32768; PRAGMA temp_store = MEMORY;",
           "cannot configure database");
  {
    sql::Stmt jm(db_, "PRAGMA journal_mode");
    if (!jm.step() || jm.textView(0) != "wal")
      throw StorageError("recording " + path + ": cannot switch to WAL mode");
  }
  if (options.maxBytes > 0) {
    std::string p = "PRAGMA max_page_count = " + std::to_string(options.maxBytes / 8192 + 1);
    db_.exec(p.c_str(), "cannot set size limit");
  }

  begin_ = sql::Stmt(db_, "BEGIN");
  commit_ = sql::Stmt(db_, "COMMIT");
  insString_ = sql::Stmt(db_, "INSERT INTO strings(text) VALUES (?1)");
  insStep_ = sql::Stmt(db_,
                       "INSERT INTO steps(step, begin_ns, end_ns, loss, lr, grad_norm,"
                       " tokens_per_sec, aux_loss, val_loss, nan_metrics) "
                       "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) "
                       "ON CONFLICT(step) DO UPDATE SET begin_ns = excluded.begin_ns, "
                       "end_ns = excluded.end_ns, loss = excluded.loss, lr = excluded.lr, "
                       "grad_norm = excluded.grad_norm, tokens_per_sec = excluded.tokens_per_sec, "
                       "aux_loss = excluded.aux_loss, val_loss = excluded.val_loss, "
                       "nan_metrics = excluded.nan_metrics");
  insOp_ = sql::Stmt(db_,
                     "INSERT INTO ops(seq, step, phase_sid, name_sid, attrs_sid, scope_sid, thread,"
                     " begin_ns, end_ns, forward_seq, stack_id, kernel_id) "
                     "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)");
  insKernel_ = sql::Stmt(
      db_, "INSERT INTO kernels(backend_sid, variant_sid, params_sid) VALUES (?1, ?2, ?3)");
  insTensors_ = sql::Stmt(db_, "INSERT INTO op_tensors(op_seq, count, data) VALUES (?1, ?2, ?3)");
  insNonfinite_ = sql::Stmt(db_, "INSERT OR IGNORE INTO nonfinite_ops(op_seq) VALUES (?1)");
  insStack_ = sql::Stmt(db_, "INSERT OR IGNORE INTO stacks(id, depth) VALUES (?1, ?2)");
  insFrame_ = sql::Stmt(
      db_, "INSERT INTO frames(address, function_sid, file_sid, line) VALUES (?1, ?2, ?3, ?4)");
  insStackFrame_ =
      sql::Stmt(db_, "INSERT INTO stack_frames(stack_id, depth, frame_id) VALUES (?1, ?2, ?3)");
  insLog_ = sql::Stmt(db_,
                      "INSERT INTO logs(op_seq, step, level, scope_sid, message, time_ns) "
                      "VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
  insMem_ = sql::Stmt(db_,
                      "INSERT INTO mem_events(time_ns, kind_sid, device_sid, address, bytes,"
                      " to_address, op_seq, step, stack_id, allocated_after, reserved_after,"
                      " buffer_id, tag_sid, label_sid) "
                      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)");
  insDump_ = sql::Stmt(db_,
                       "INSERT INTO dumps(op_seq, role, idx, dtype_sid, shape, codec_sid,"
                       " raw_bytes, data) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)");
  setStatus_ = sql::Stmt(db_, "UPDATE run SET status = ?1 WHERE id = 1");
  addDropped_ = sql::Stmt(db_,
                          "INSERT INTO dropped(kind, count) VALUES (?1, ?2) "
                          "ON CONFLICT(kind) DO UPDATE SET count = count + excluded.count");

  begin_.run();
}

template <class F>
void SqliteWriter::guarded(F&& f) {
  if (!db_.get()) throw StorageError("recording " + db_.path() + ": writer is closed");
  try {
    beginIfNeeded();
    f();
  } catch (...) {
    rollbackBatch();
    throw;
  }
}

void SqliteWriter::beginIfNeeded() {
  if (sqlite3_get_autocommit(db_.get())) begin_.run();
}

void SqliteWriter::rollbackBatch() noexcept {
  if (!db_.get()) return;
  if (!sqlite3_get_autocommit(db_.get()))
    sqlite3_exec(db_.get(), "ROLLBACK", nullptr, nullptr, nullptr);
  try {
    reloadCaches();  // ids interned in the lost batch are gone with it
  } catch (...) {
    strings_.clear();
    frames_.clear();
    kernels_.clear();
  }
}

void SqliteWriter::reloadCaches() {
  strings_.clear();
  frames_.clear();
  kernels_.clear();
  sql::Stmt s(db_, "SELECT id, text FROM strings");
  while (s.step()) strings_.emplace(s.text(1), s.i64(0));
  sql::Stmt f(db_, "SELECT id, address, function_sid, file_sid, line FROM frames");
  while (f.step())
    frames_.emplace(std::tuple(f.u64(1), f.i64(2), f.i64(3), static_cast<int32_t>(f.i64(4))),
                    f.i64(0));
  sql::Stmt k(db_, "SELECT id, backend_sid, variant_sid, params_sid FROM kernels");
  while (k.step()) kernels_.emplace(std::tuple(k.i64(1), k.i64(2), k.i64(3)), k.i64(0));
}

int64_t SqliteWriter::intern(std::string_view s) {
  // A string past the readers' bound (a frame of an imported snapshot: anything) is stored cut,
  // so the recording reads back instead of being called damaged.
  std::string cut;
  if (s.size() > detail::kMaxStringBytes) {
    cut = detail::cutText(s, detail::kMaxStringBytes - 48);  // room for the note
    s = cut;
  }
  if (auto it = strings_.find(s); it != strings_.end()) return it->second;
  insString_.bindText(1, s);
  insString_.run();
  int64_t id = sqlite3_last_insert_rowid(db_.get());
  strings_.emplace(std::string(s), id);
  return id;
}

int64_t SqliteWriter::internFrame(const StackFrame& f) {
  auto key = std::tuple(f.address, intern(f.function), intern(f.file), f.line);
  if (auto it = frames_.find(key); it != frames_.end()) return it->second;
  insFrame_.bindFrom(1, f.address, std::get<1>(key), std::get<2>(key), f.line).run();
  int64_t id = sqlite3_last_insert_rowid(db_.get());
  frames_.emplace(key, id);
  return id;
}

int64_t SqliteWriter::internKernel(const KernelRecord& k) {
  auto key = std::tuple(intern(k.backend), intern(k.variant), intern(k.params));
  if (auto it = kernels_.find(key); it != kernels_.end()) return it->second;
  insKernel_.bindFrom(1, std::get<0>(key), std::get<1>(key), std::get<2>(key)).run();
  int64_t id = sqlite3_last_insert_rowid(db_.get());
  kernels_.emplace(key, id);
  return id;
}

void SqliteWriter::writeStep(const StepRecord& s) {
  guarded([&] {
    insStep_
        .bindFrom(1, s.step, s.beginNs, s.endNs, s.loss, s.lr, s.gradNorm, s.tokensPerSec,
                  s.auxLoss, s.valLoss, int64_t(s.nanMetrics))
        .run();
  });
}

void SqliteWriter::writeOp(const OpRecord& op) {
  guarded([&] {
    // Interned in this order (one declaration: its initializers run in sequence).
    const int64_t phase = intern(std::string(phaseName(op.phase))), name = intern(op.name),
                  attrs = intern(op.attrsJson), scope = intern(op.scope);
    sql::Stmt& o = insOp_;
    o.bindFrom(1, op.seq, op.step, phase, name, attrs, scope, op.thread, op.beginNs, op.endNs,
               op.forwardSeq);
    if (op.stackId >= 0) o.bind(11, op.stackId);
    if (!op.kernel.empty()) o.bind(12, internKernel(op.kernel));
    o.run();
    if (op.tensors.empty()) return;
    // One packed row for all of the op's tensors (storage/src/packed.h).
    packed_.clear();
    for (const TensorRecord& r : op.tensors) packed_.add(r, intern(r.dtype), intern(r.device));
    insTensors_.bindFrom(1, op.seq, static_cast<int64_t>(op.tensors.size()));
    insTensors_.bindBlob(3, packed_.bytes().data(), packed_.bytes().size());
    insTensors_.run();
    if (nonFiniteAppearsAt(op)) {  // Note [Where non-finite values appear]
      insNonfinite_.bind(1, op.seq);
      insNonfinite_.run();
    }
  });
}

void SqliteWriter::writeStack(const StackRecord& s) {
  guarded([&] {
    insStack_.bindFrom(1, s.id, static_cast<int64_t>(s.frames.size())).run();
    if (sqlite3_changes(db_.get()) == 0) return;  // this id was written before
    for (size_t d = 0; d < s.frames.size(); ++d) {
      int64_t frame = internFrame(s.frames[d]);
      insStackFrame_.bindFrom(1, s.id, static_cast<int64_t>(d), frame).run();
    }
  });
}

void SqliteWriter::writeLog(const LogRecord& l) {
  guarded([&] {
    const int64_t scope = intern(l.scope);
    insLog_.bindFrom(1, l.opSeq, l.step, static_cast<int>(l.level), scope, l.message, l.timeNs)
        .run();
  });
}

void SqliteWriter::writeMem(const MemRecord& m) {
  guarded([&] {
    const int64_t kind = intern(std::string(memEventName(m.kind))), device = intern(m.device);
    insMem_.bindFrom(1, m.timeNs, kind, device, m.address, m.bytes, m.toAddress, m.opSeq, m.step);
    if (m.stackId >= 0) insMem_.bind(9, m.stackId);
    insMem_.bindFrom(10, m.allocatedAfter, m.reservedAfter, m.bufferId);
    if (m.tag != MemTag::None) insMem_.bind(13, intern(std::string(memTagName(m.tag))));
    if (!m.label.empty()) insMem_.bind(14, intern(m.label));
    insMem_.run();
  });
}

void SqliteWriter::writeDump(const DumpRecord& d) {
  guarded([&] {
    detail::appendDims(shapeBuf_, d.shape);
    const int64_t dtype = intern(d.dtype), codec = intern(d.codec);
    insDump_.bindFrom(1, d.opSeq, static_cast<int>(d.role), d.index, dtype, shapeBuf_, codec,
                      d.rawBytes);
    insDump_.bindBlob(8, d.data.data(), d.data.size());
    insDump_.run();
  });
}

void SqliteWriter::setRunStatus(const std::string& status) {
  guarded([&] {
    setStatus_.bindText(1, status);
    setStatus_.run();
  });
}

void SqliteWriter::closeWithStatus(const std::string& status) noexcept {
  const std::string path = db_.path();
  bool written = false;
  try {
    setRunStatus(status);
    commit();
    written = true;
  } catch (...) {
  }
  try {
    if (db_.get()) close();
  } catch (...) {
  }
  if (written) return;
  // The connection whose write failed can stay unable to write (SQLite keeps an I/O error until
  // every statement is reset); the status goes in through a fresh connection, in autocommit: a
  // few pages where the lost batch's were.
  for (sql::Stmt* st : {&begin_, &commit_, &insString_, &insStep_, &insOp_, &insTensors_,
                        &insNonfinite_, &insStack_, &insFrame_, &insStackFrame_, &insLog_, &insMem_,
                        &insDump_, &setStatus_, &addDropped_, &insKernel_})
    *st = sql::Stmt();
  db_.close();
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) == SQLITE_OK) {
    sqlite3_busy_timeout(db, 2000);
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, "UPDATE run SET status = ?1 WHERE id = 1", -1, &st, nullptr) ==
        SQLITE_OK) {
      sqlite3_bind_text(st, 1, status.c_str(), -1, SQLITE_TRANSIENT);
      sqlite3_step(st);
    }
    sqlite3_finalize(st);
  }
  sqlite3_close_v2(db);
}

void SqliteWriter::addDropped(const std::string& kind, int64_t count) {
  guarded([&] { addDropped_.bindFrom(1, kind, count).run(); });
}

void SqliteWriter::commit() {
  guarded([&] {
    commit_.run();
    begin_.run();
  });
}

void SqliteWriter::close() {
  if (!db_.get()) throw StorageError("recording " + db_.path() + ": writer is closed");
  try {
    if (!sqlite3_get_autocommit(db_.get())) commit_.run();
  } catch (...) {
    rollbackBatch();
    db_.close();
    throw;
  }
  // Secondary indexes and the op counts are built once here, by sorting, instead of on every
  // insert. Best effort: the data is committed, and a recording without them reads the same, by
  // scans (a full disk must not turn a recorded run into a failed close).
  try {
    db_.exec(detail::kDeferredIndexes, "cannot create indexes");
    db_.exec("BEGIN", "cannot count ops");
    db_.exec(detail::kSummaries, "cannot count ops");
    db_.exec("COMMIT", "cannot count ops");
  } catch (const StorageError&) {
    sqlite3_exec(db_.get(), "ROLLBACK", nullptr, nullptr, nullptr);
  }
  // A finished recording leaves WAL mode (checkpointing everything into the main file), so
  // read-only viewers later open one self-contained file and leave no -wal/-shm files beside it.
  // Best effort: a viewer still attached (a live session's views) keeps it in WAL, which reads
  // the same.
  sqlite3_exec(db_.get(), "PRAGMA journal_mode = DELETE", nullptr, nullptr, nullptr);
  // Statements must be finalized before the connection closes (the last close checkpoints the
  // WAL into the main file and removes it).
  for (sql::Stmt* s : {&begin_, &commit_, &insString_, &insStep_, &insOp_, &insTensors_,
                       &insKernel_, &insNonfinite_, &insStack_, &insFrame_, &insStackFrame_,
                       &insLog_, &insMem_, &insDump_, &setStatus_, &addDropped_})
    *s = sql::Stmt();
  db_.close();
}

}  // namespace

void settleRecording(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) == SQLITE_OK) {
    sqlite3_busy_timeout(db, 2000);
    sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", nullptr, nullptr, nullptr);
    sqlite3_exec(db, "PRAGMA journal_mode = DELETE", nullptr, nullptr, nullptr);
  }
  sqlite3_close_v2(db);
}

std::unique_ptr<Writer> Writer::create(const std::string& path, const RunInfo& run) {
  return create(path, run, WriterOptions{});
}

std::unique_ptr<Writer> Writer::create(const std::string& path, const RunInfo& run,
                                       const WriterOptions& options) {
  return std::make_unique<SqliteWriter>(path, run, options);
}

}  // namespace keel::storage
