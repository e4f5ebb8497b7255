// Recording: validates a file (exists, SQLite, Keel application_id, schema version, quick_check)
// and answers the read API with prepared statements. Strings are resolved through an id-indexed
// cache that grows when a live writer adds new ones; nothing here writes except a migration.
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <system_error>
#include <tuple>
#include <unordered_map>
#include <variant>

#include "keel/base/dtype.h"
#include "keel/base/text.h"
#include "keel/base/values.h"
#include "keel/storage/reader.h"
#include "keel/storage/schema.h"
#include "packed.h"
#include "schema_impl.h"
#include "sqlite.h"

namespace keel::storage {

namespace {

constexpr const char* kOpColumns =
    "seq, step, phase_sid, name_sid, attrs_sid, scope_sid, thread, begin_ns, end_ns, forward_seq,"
    " stack_id, kernel_id";

// Binds collected while building a dynamic WHERE clause.
struct Binds {
  std::vector<std::variant<int64_t, std::string>> values;
  std::string where;
  void add(const std::string& cond, int64_t v) { addCond(cond, v); }
  void add(const std::string& cond, const std::string& v) { addCond(cond, v); }
  template <class T>
  void addCond(const std::string& cond, T v) {
    values.emplace_back(std::move(v));
    std::string c = cond;
    // "?" in cond stands for this value's parameter number.
    std::string num = "?" + std::to_string(values.size());
    for (size_t p = c.find('?'); p != std::string::npos; p = c.find('?', p + num.size()))
      c.replace(p, 1, num);
    where += where.empty() ? " WHERE " : " AND ";
    where += c;
  }
  void apply(sql::Stmt& s) const {
    for (size_t i = 0; i < values.size(); ++i) {
      int n = static_cast<int>(i + 1);
      if (auto* v = std::get_if<int64_t>(&values[i]))
        s.bind(n, *v);
      else
        s.bindText(n, std::get<std::string>(values[i]));
    }
  }
};

// Resets a cached statement however the scope is left, so a throw mid-iteration never leaves it
// running (holding a read transaction open).
struct ResetOnExit {
  sql::Stmt& stmt;
  ~ResetOnExit() { stmt.reset(); }
};

std::string limitClause(int64_t limit) {
  return limit >= 0 ? " LIMIT " + std::to_string(limit) : std::string();
}

// keel_scope_within(scope, prefix) in SQL is keel::scopeWithin itself, so the scope filter of
// Recording::ops is the one scope rule, not a second spelling of it in SQL.
void sqlScopeWithin(sqlite3_context* ctx, int, sqlite3_value** argv) {
  const auto text = [](sqlite3_value* v) {
    const auto* p = reinterpret_cast<const char*>(sqlite3_value_text(v));
    return p ? std::string_view(p, size_t(sqlite3_value_bytes(v))) : std::string_view();
  };
  const std::string_view scope = text(argv[0]);
  sqlite3_result_int(ctx, scopeWithin(scope, text(argv[1])) ? 1 : 0);
}

void registerScopeWithin(const sql::Db& db) {
  const int rc = sqlite3_create_function_v2(db.get(), "keel_scope_within", 2,
                                            SQLITE_UTF8 | SQLITE_DETERMINISTIC | SQLITE_INNOCUOUS,
                                            nullptr, sqlScopeWithin, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) db.fail("cannot register keel_scope_within", rc);
}

}  // namespace

struct Recording::Impl {
  sql::Db db;
  int version = 0;
  mutable std::vector<std::string> strings;  // index = strings.id
  mutable std::vector<bool> known;
  mutable sql::Stmt tensorsOfOp, tensorsInRange, opBySeq;
  mutable std::unordered_map<int64_t, KernelRecord> kernels;

  // A stored name as its vocabulary enum; a name this keel does not know is a damaged (or newer)
  // recording: a StorageError naming the file and the value.
  template <typename E>
  E enumOf(std::optional<E> (*parse)(std::string_view), const std::string& text,
           const char* what) const {
    if (auto e = parse(text)) return *e;
    throw StorageError("recording " + db.path() + " has an unknown " + what + " '" + text + "'");
  }
  const std::string& str(int64_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= strings.size() || !known[static_cast<size_t>(id)]) {
      loadStrings();
      if (id < 0 || static_cast<size_t>(id) >= strings.size() || !known[static_cast<size_t>(id)])
        throw StorageError("recording " + db.path() + " is corrupted (unknown string id " +
                           std::to_string(id) + ")");
    }
    return strings[static_cast<size_t>(id)];
  }

  void loadStrings() const {
    sql::Stmt s(db, "SELECT id, text FROM strings WHERE id >= ?1");
    s.bind(1, static_cast<int64_t>(strings.size()));
    while (s.step()) {
      auto id = static_cast<size_t>(s.i64(0));
      if (id >= strings.size()) {
        strings.resize(id + 1);
        known.resize(id + 1, false);
      }
      strings[id] = s.text(1);
      known[id] = true;
    }
  }

  OpRecord readOp(const sql::Stmt& s) const {
    OpRecord o;
    o.seq = s.u64(0);
    o.step = s.i64(1);
    o.phase = enumOf(parsePhase, str(s.i64(2)), "phase");
    o.name = str(s.i64(3));
    o.attrsJson = str(s.i64(4));
    o.scope = str(s.i64(5));
    o.thread = s.i64(6);
    o.beginNs = s.i64(7);
    o.endNs = s.i64(8);
    o.forwardSeq = s.u64(9);
    o.stackId = s.isNull(10) ? -1 : s.i64(10);
    if (!s.isNull(11)) o.kernel = kernel(s.i64(11));
    return o;
  }

  // Whether the op counts were summarised (the recording was closed by its writer or migrated).
  bool hasOpCounts() const {
    sql::Stmt s(db, "SELECT 1 FROM op_counts LIMIT 1");
    return s.step();
  }

  // The kernels table is small (a run repeats a handful); read once, again on an unknown id (a
  // recording still being written).
  const KernelRecord& kernel(int64_t id) const {
    auto it = kernels.find(id);
    if (it == kernels.end()) {
      sql::Stmt k(db, "SELECT id, backend_sid, variant_sid, params_sid FROM kernels");
      while (k.step())
        kernels[k.i64(0)] = KernelRecord{str(k.i64(1)), str(k.i64(2)), str(k.i64(3))};
      it = kernels.find(id);
      if (it == kernels.end())
        throw StorageError("damaged recording " + db.path() + ": an op names kernel " +
                           std::to_string(id) + ", which the kernels table lacks");
    }
    return it->second;
  }

  // Appends the op's packed tensors from a row (op_seq, count, data) of op_tensors.
  void readTensors(const sql::Stmt& s, OpRecord& o) const {
    const auto* p = static_cast<const uint8_t*>(s.blob(2));
    detail::unpackTensors(
        p, s.blobSize(2), s.i64(1), [&](int64_t id) { return str(id); }, o.tensors,
        "recording " + db.path() + ": op " + std::to_string(o.seq));
  }

  static void sortTensors(OpRecord& o) {
    std::stable_sort(o.tensors.begin(), o.tensors.end(), [](const auto& a, const auto& b) {
      return std::pair(a.role, a.index) < std::pair(b.role, b.index);
    });
  }

  // Fills tensors of `ops` (sorted by seq): one range scan when the ops are dense in seq, else one
  // lookup per op.
  void loadTensors(std::vector<OpRecord>& ops) const {
    if (ops.empty()) return;
    uint64_t lo = ops.front().seq, hi = ops.back().seq;
    if (hi - lo <= 4 * ops.size() + 64) {
      sql::Stmt& s = tensorsInRange;
      ResetOnExit guard{s};
      s.bind(1, lo);
      s.bind(2, hi);
      size_t i = 0;
      while (s.step()) {
        uint64_t seq = s.u64(0);
        while (i < ops.size() && ops[i].seq < seq) ++i;
        if (i == ops.size()) break;
        if (ops[i].seq == seq) readTensors(s, ops[i]);
      }
    } else {
      sql::Stmt& s = tensorsOfOp;
      for (OpRecord& o : ops) {
        ResetOnExit guard{s};
        s.bind(1, o.seq);
        if (s.step()) readTensors(s, o);
      }
    }
    for (OpRecord& o : ops) sortTensors(o);
  }

  std::vector<OpRecord> queryOps(const std::string& sqlText, const Binds& b, bool tensors) const {
    sql::Stmt s(db, sqlText);
    b.apply(s);
    std::vector<OpRecord> out;
    while (s.step()) out.push_back(readOp(s));
    if (tensors) loadTensors(out);
    return out;
  }
};

SqliteHeader sqliteHeader(const std::string& path) {
  char header[16] = {};
  std::ifstream f(path, std::ios::binary);
  if (!f) return SqliteHeader::Unreadable;
  f.read(header, sizeof header);
  if (f.gcount() == 0) return SqliteHeader::Empty;
  return f.gcount() == 16 && std::memcmp(header, "SQLite format 3", 16) == 0 ? SqliteHeader::Sqlite
                                                                             : SqliteHeader::Other;
}

Recording::Recording(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Recording::Recording(Recording&&) noexcept = default;
Recording& Recording::operator=(Recording&&) noexcept = default;
Recording::~Recording() = default;

Recording Recording::open(const std::string& path, bool verify) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto st = fs::status(path, ec);
  if (!fs::exists(st)) throw StorageError("recording " + path + ": no such file");
  if (fs::is_directory(st)) throw StorageError("recording " + path + " is a directory");
  // A FIFO would block the read below until a writer came; a device is no recording.
  if (const std::string kind = nonRegularKind(path); !kind.empty())
    throw StorageError("recording " + path + " is " + kind + ", not a regular file");
  switch (sqliteHeader(path)) {
    case SqliteHeader::Unreadable:
      throw StorageError("recording " + path + ": cannot read (permission denied?)");
    case SqliteHeader::Empty:
      throw StorageError("recording " + path + " is empty");
    case SqliteHeader::Other:
      throw StorageError("recording " + path + " is not an SQLite file");
    case SqliteHeader::Sqlite:
      break;
  }

  auto impl = std::make_unique<Impl>();
  auto openRo = [&] {
    impl->db = sql::Db(path, SQLITE_OPEN_READONLY);
    registerScopeWithin(impl->db);
  };
  openRo();
  if (impl->db.queryInt("PRAGMA application_id") != kApplicationId)
    throw StorageError("recording " + path + " is an SQLite database but not a Keel recording");
  int64_t version = impl->db.queryInt("PRAGMA user_version");
  if (version > kSchemaVersion) throw StorageError(detail::newerVersionMessage(path, version));
  if (version < kSchemaVersion) {
    impl->db.close();
    try {
      migrateRecording(path);
    } catch (const StorageError& e) {
      throw StorageError("recording " + path + " has schema version " + std::to_string(version) +
                         " and could not be upgraded to " + std::to_string(kSchemaVersion) + ": " +
                         e.what());
    }
    openRo();
    version = impl->db.queryInt("PRAGMA user_version");
  }
  impl->version = static_cast<int>(version);
  if (verify) {
    sql::Stmt qc(impl->db, "PRAGMA quick_check(1)");
    if (qc.step() && qc.textView(0) != "ok") {
      std::string msg(qc.textView(0));
      std::replace(msg.begin(), msg.end(), '\n', ' ');
      throw StorageError("recording " + path + " is corrupted or truncated (" + msg + ")");
    }
  }
  impl->db.exec("PRAGMA cache_size = -65536", "cannot configure reader");
  impl->tensorsOfOp =
      sql::Stmt(impl->db, "SELECT op_seq, count, data FROM op_tensors WHERE op_seq = ?1");
  impl->tensorsInRange = sql::Stmt(
      impl->db,
      "SELECT op_seq, count, data FROM op_tensors WHERE op_seq BETWEEN ?1 AND ?2 ORDER BY op_seq");
  impl->opBySeq =
      sql::Stmt(impl->db, std::string("SELECT ") + kOpColumns + " FROM ops WHERE seq = ?1");
  impl->loadStrings();
  return Recording(std::move(impl));
}

const std::string& Recording::path() const {
  return impl_->db.path();
}
int Recording::schemaVersion() const {
  return impl_->version;
}

RunInfo Recording::run() const {
  sql::Stmt s(impl_->db,
              "SELECT backend, device, host, config_json, seed, engine_version, "
              "start_time_unix_ns, capture_options_json, status, allocator, rank, world_size,"
              " layout FROM run WHERE id = 1");
  if (!s.step()) throw StorageError("recording " + path() + " has no run record");
  RunInfo r;
  r.backend = s.text(0);
  r.device = s.text(1);
  r.host = s.text(2);
  r.configJson = s.text(3);
  r.seed = s.u64(4);
  r.engineVersion = s.text(5);
  r.startTimeUnixNs = s.i64(6);
  r.captureOptionsJson = s.text(7);
  r.status = s.text(8);
  r.allocator = s.text(9);
  r.rank = s.i64(10);
  r.worldSize = s.i64(11);
  r.layout = s.text(12);
  return r;
}

std::vector<StepRecord> Recording::steps() const {
  sql::Stmt s(impl_->db,
              "SELECT step, begin_ns, end_ns, loss, lr, grad_norm, tokens_per_sec, aux_loss, "
              "val_loss FROM steps ORDER BY step");
  std::vector<StepRecord> out;
  while (s.step())
    out.push_back(
        {s.i64(0), s.i64(1), s.i64(2), s.f64(3), s.f64(4), s.f64(5), s.f64(6), s.f64(7), s.f64(8)});
  return out;
}

int64_t Recording::opCount() const {
  return impl_->db.queryInt("SELECT count(*) FROM ops");
}

std::vector<OpRecord> Recording::ops(const OpQuery& q) const {
  Binds b;
  if (q.step) b.add("step = ?", *q.step);
  if (q.phase)
    b.add("phase_sid = (SELECT id FROM strings WHERE text = ?)", std::string(phaseName(*q.phase)));
  if (q.name) b.add("name_sid = (SELECT id FROM strings WHERE text = ?)", *q.name);
  if (q.scopePrefix && !q.scopePrefix->empty())
    b.add("scope_sid IN (SELECT id FROM strings WHERE keel_scope_within(text, ?))", *q.scopePrefix);
  if (q.seqBegin) b.add("seq >= ?", static_cast<int64_t>(*q.seqBegin));
  if (q.seqEnd) b.add("seq < ?", static_cast<int64_t>(*q.seqEnd));
  return impl_->queryOps(std::string("SELECT ") + kOpColumns + " FROM ops" + b.where +
                             " ORDER BY seq" + limitClause(q.limit),
                         b, q.withTensors);
}

std::optional<OpRecord> Recording::op(uint64_t seq) const {
  std::vector<OpRecord> out;
  {
    sql::Stmt& s = impl_->opBySeq;
    ResetOnExit guard{s};
    s.bind(1, seq);
    if (s.step()) out.push_back(impl_->readOp(s));
  }
  if (out.empty()) return std::nullopt;
  impl_->loadTensors(out);
  return std::move(out.front());
}

std::vector<OpCount> Recording::opCountsByNameAndPhase(std::optional<int64_t> step) const {
  Binds b;
  if (step) b.add("step = ?", *step);
  // A closed recording has its op counts summarised (op_counts); a recording being written, or
  // one whose writer was killed, is counted from its ops.
  sql::Stmt s(impl_->db, impl_->hasOpCounts()
                             ? "SELECT name_sid, phase_sid, sum(count) FROM op_counts" + b.where +
                                   " GROUP BY name_sid, phase_sid"
                             : "SELECT name_sid, phase_sid, count(*) FROM ops" + b.where +
                                   " GROUP BY name_sid, phase_sid");
  b.apply(s);
  std::vector<OpCount> out;
  while (s.step())
    out.push_back(
        {impl_->str(s.i64(0)), impl_->enumOf(parsePhase, impl_->str(s.i64(1)), "phase"), s.i64(2)});
  std::sort(out.begin(), out.end(), [](const OpCount& a, const OpCount& b) {
    return std::tie(b.count, a.name, a.phase) < std::tie(a.count, b.name, b.phase);
  });
  return out;
}

std::optional<StackRecord> Recording::stack(int64_t id) const {
  sql::Stmt s(impl_->db, "SELECT id FROM stacks WHERE id = ?1");
  s.bind(1, id);
  if (!s.step()) return std::nullopt;
  StackRecord r;
  r.id = id;
  sql::Stmt f(impl_->db,
              "SELECT f.address, f.function_sid, f.file_sid, f.line FROM stack_frames sf "
              "JOIN frames f ON f.id = sf.frame_id WHERE sf.stack_id = ?1 ORDER BY sf.depth");
  f.bind(1, id);
  while (f.step())
    r.frames.push_back(
        {f.u64(0), impl_->str(f.i64(1)), impl_->str(f.i64(2)), static_cast<int32_t>(f.i64(3))});
  return r;
}

std::vector<LogRecord> Recording::logs(const LogQuery& q) const {
  Binds b;
  if (q.step) b.add("step = ?", *q.step);
  if (q.opSeqBegin) b.add("op_seq >= ?", static_cast<int64_t>(*q.opSeqBegin));
  if (q.opSeqEnd) b.add("op_seq < ?", static_cast<int64_t>(*q.opSeqEnd));
  if (q.maxLevel) b.add("level <= ?", static_cast<int64_t>(*q.maxLevel));
  sql::Stmt s(impl_->db, "SELECT op_seq, step, level, scope_sid, message, time_ns FROM logs" +
                             b.where + " ORDER BY id" + limitClause(q.limit));
  b.apply(s);
  std::vector<LogRecord> out;
  while (s.step())
    out.push_back({s.u64(0), s.i64(1), static_cast<LogLevel>(s.i64(2)), impl_->str(s.i64(3)),
                   s.text(4), s.i64(5)});
  return out;
}

std::vector<MemRecord> Recording::memEvents(const MemQuery& q) const {
  Binds b;
  if (q.timeBegin) b.add("time_ns >= ?", *q.timeBegin);
  if (q.timeEnd) b.add("time_ns < ?", *q.timeEnd);
  if (q.opSeqBegin) b.add("op_seq >= ?", static_cast<int64_t>(*q.opSeqBegin));
  if (q.opSeqEnd) b.add("op_seq < ?", static_cast<int64_t>(*q.opSeqEnd));
  sql::Stmt s(
      impl_->db,
      "SELECT kind_sid, device_sid, address, bytes, to_address, op_seq, step, stack_id,"
      " time_ns, allocated_after, reserved_after, buffer_id, tag_sid, label_sid FROM mem_events" +
          b.where + " ORDER BY id" + limitClause(q.limit));
  b.apply(s);
  std::vector<MemRecord> out;
  while (s.step()) {
    MemRecord m;
    m.kind = impl_->enumOf(parseMemEventKind, impl_->str(s.i64(0)), "memory event kind");
    m.device = impl_->str(s.i64(1));
    m.address = s.u64(2);
    m.bytes = s.u64(3);
    m.toAddress = s.u64(4);
    m.opSeq = s.u64(5);
    m.step = s.i64(6);
    m.stackId = s.isNull(7) ? -1 : s.i64(7);
    m.timeNs = s.i64(8);
    m.allocatedAfter = s.u64(9);
    m.reservedAfter = s.u64(10);
    m.bufferId = s.u64(11);
    if (!s.isNull(12)) m.tag = impl_->enumOf(parseMemTag, impl_->str(s.i64(12)), "memory tag");
    if (!s.isNull(13)) m.label = impl_->str(s.i64(13));
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<DumpRecord> Recording::dumps(uint64_t opSeq) const {
  sql::Stmt s(impl_->db,
              "SELECT op_seq, role, idx, dtype_sid, shape, codec_sid, raw_bytes, data FROM dumps "
              "WHERE op_seq = ?1 ORDER BY role, idx, id");
  s.bind(1, opSeq);
  std::vector<DumpRecord> out;
  while (s.step()) {
    DumpRecord d;
    d.opSeq = s.u64(0);
    d.role = static_cast<Role>(s.i64(1));
    d.index = static_cast<int32_t>(s.i64(2));
    d.dtype = impl_->str(s.i64(3));
    d.shape = detail::parseDims(s.textView(4));
    d.codec = impl_->str(s.i64(5));
    d.rawBytes = s.i64(6);
    const auto* p = static_cast<const uint8_t*>(s.blob(7));
    d.data.assign(p, p + s.blobSize(7));
    out.push_back(std::move(d));
  }
  return out;
}

std::optional<std::vector<double>> Recording::dumpValues(uint64_t opSeq, Role role,
                                                         int32_t index) const {
  for (DumpRecord& d : dumps(opSeq)) {
    if (d.role != role || d.index != index) continue;
    const std::string what = "recording " + impl_->db.path() + ": dump of op " +
                             std::to_string(opSeq) + " " +
                             (role == Role::Input ? "input " : "output ") + std::to_string(index);
    std::vector<uint8_t> raw;
    if (d.codec == "zstd") {
      raw.resize(size_t(std::max<int64_t>(d.rawBytes, 0)));
      size_t n = ZSTD_decompress(raw.data(), raw.size(), d.data.data(), d.data.size());
      if (ZSTD_isError(n) || int64_t(n) != d.rawBytes)
        throw StorageError(what + " is damaged (zstd: " +
                           (ZSTD_isError(n) ? ZSTD_getErrorName(n) : "wrong size") + ")");
    } else if (d.codec == "raw") {
      raw = std::move(d.data);
    } else {
      throw StorageError(what + " has unknown codec '" + d.codec + "'");
    }
    int64_t numel = 1;
    for (int64_t s : d.shape) numel *= s;
    const std::optional<DType> dtype = tryParseDType(d.dtype);
    if (!dtype || dtypeName(*dtype) != d.dtype)
      throw StorageError(what + " has unknown dtype '" + d.dtype + "'");
    const size_t es = dtypeSize(*dtype);
    if (int64_t(raw.size()) != numel * int64_t(es))
      throw StorageError(what + " holds " + std::to_string(raw.size()) + " bytes, expected " +
                         std::to_string(numel * int64_t(es)));
    std::vector<double> out;
    out.reserve(size_t(numel));
    forEachValue(*dtype, raw.data(), numel, [&](double v) { out.push_back(v); });
    return out;
  }
  return std::nullopt;
}

std::vector<DroppedCount> Recording::dropped() const {
  sql::Stmt s(impl_->db, "SELECT kind, count FROM dropped ORDER BY kind");
  std::vector<DroppedCount> out;
  while (s.step()) out.push_back({s.text(0), s.i64(1)});
  return out;
}

std::vector<KernelUse> Recording::kernelUses() const {
  sql::Stmt s(impl_->db, impl_->hasOpCounts()
                             ? "SELECT kernel_id, name_sid, sum(count) FROM op_counts WHERE"
                               " kernel_id IS NOT NULL GROUP BY kernel_id, name_sid"
                             : "SELECT kernel_id, name_sid, count(*) FROM ops WHERE kernel_id IS"
                               " NOT NULL GROUP BY kernel_id, name_sid");
  std::map<int64_t, KernelUse> byId;
  while (s.step()) {
    KernelUse& u = byId[s.i64(0)];
    if (u.kernel.empty()) u.kernel = impl_->kernel(s.i64(0));
    u.calls += s.i64(2);
    u.ops.emplace_back(impl_->str(s.i64(1)), s.i64(2));
  }
  std::vector<KernelUse> out;
  for (auto& [id, u] : byId) {
    std::stable_sort(u.ops.begin(), u.ops.end(),
                     [](const auto& x, const auto& y) { return x.second > y.second; });
    out.push_back(std::move(u));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const KernelUse& x, const KernelUse& y) { return x.calls > y.calls; });
  return out;
}

std::optional<OpRecord> Recording::firstNonFinite() const {
  sql::Stmt s(impl_->db, "SELECT min(op_seq) FROM nonfinite_ops");
  if (!s.step() || s.isNull(0)) return std::nullopt;
  return op(s.u64(0));
}

std::vector<OpRecord> Recording::allOps() const {
  std::vector<OpRecord> ops;
  std::vector<int64_t> steps = {0};  // step 0: initialisation (parameter creation)
  for (const auto& s : this->steps()) steps.push_back(s.step);
  for (int64_t s : steps) {
    auto part = stepOps(s);
    ops.insert(ops.end(), std::make_move_iterator(part.begin()),
               std::make_move_iterator(part.end()));
  }
  return ops;
}

std::vector<OpRecord> Recording::stepOps(int64_t step) const {
  sql::Stmt r(impl_->db, "SELECT min(seq), max(seq) FROM ops WHERE step = ?1");
  r.bind(1, step);
  if (!r.step() || r.isNull(0)) return {};
  Binds b;
  b.add("seq >= ?", r.i64(0));
  b.add("seq <= ?", r.i64(1));
  b.add("+step = ?", step);  // '+': scan the seq range, do not use ops_step_phase
  return impl_->queryOps(
      std::string("SELECT ") + kOpColumns + " FROM ops" + b.where + " ORDER BY seq", b, true);
}

}  // namespace keel::storage
